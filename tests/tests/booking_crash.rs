//! Bookings survive SIGKILL: the host is killed while captured bookings are being fulfilled by
//! the step components and their booking webhooks are being delivered, then restarted on the
//! same database. Every booking completes with exactly its tickets (none issued twice), and every
//! status change reaches the partner's receiver (verified by `standardwebhooks`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, WebhookReceiver, cli, home_with, repo, step_effects, step_in_flight};
use reqwest::{Client, Method};
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

async fn call(c: &Client, method: Method, url: &str, key: &str, body: Option<Value>) -> Value {
    let mut req = c.request(method, url).header("Partner-Auth", key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{url}: {status} {body}");
    body
}

#[tokio::test]
async fn fulfilment_and_booking_webhooks_lose_and_duplicate_nothing_across_sigkills() {
    let dir = tempfile::tempdir().unwrap();
    // Failed answers first keep deliveries pending (and retried) when the kills land. An attempt
    // or a step in flight when its node dies is taken over once its lease passes (fulfilment:
    // `fulfilment_lease_ms`, short here; webhook attempts: 10 s, renewed while one is out).
    let receiver = WebhookReceiver::start(dir.path(), "500,500,503,500");
    let home = home_with(
        &[],
        &format!(
            "[booking]\ncatalog_file = \"{}\"\nsteps = \"{}\"\nwebhook_retry_waits_ms = [50, 50, 50, 50, 50, 50]\nfulfilment_lease_ms = 1000\nsimulated_answer_ms = 400\n[webhooks]\nallow_loopback = true\nallow_http = true\n",
            repo().join("tests/catalogs/small.json").display(),
            repo().join("target/steps").display(),
        ),
    );
    let key = cli(
        home.path(),
        &[
            "partners",
            "create",
            "--name",
            "crash",
            "--type",
            "booking",
            "--environment",
            "production",
        ],
    )
    .trim()
    .to_owned();
    let mut server = Server::start(home.path());
    let c = Client::new();
    let api = |server: &Server| format!("{}/api/public/v2", server.base);
    let hook = call(
        &c,
        Method::POST,
        &format!("{}/webhooks/", api(&server)),
        &key,
        Some(json!({"url": format!("http://127.0.0.1:{}/hook", receiver.port)})),
    )
    .await;
    std::fs::write(
        dir.path().join("secrets.txt"),
        hook["data"]["secret"].as_str().unwrap(),
    )
    .unwrap();
    let slots = call(
        &c,
        Method::GET,
        &format!(
            "{}/inventory/list-by/tour?tourId=5001&limit=9",
            api(&server)
        ),
        &key,
        None,
    )
    .await;
    let slots: Vec<String> = slots["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    let mut ids = Vec::new();
    for round in 0..3usize {
        for n in 0..3 {
            let customers = json!([{"personType": "ADULT", "isPrimary": true, "inputFields": [{"id": "fullName", "value": "Ada Lovelace"}, {"id": "email", "value": "ada@example.com"}]}, {"personType": "ADULT", "isPrimary": false, "inputFields": []}]);
            let b = call(
                &c,
                Method::POST,
                &format!("{}/bookings/", api(&server)),
                &key,
                Some(json!({
                    "productId": "1001", "variantId": "5001", "inventoryId": slots[(round * 3 + n) % slots.len()],
                    "customersDetails": {"count": 2, "customers": customers},
                    "price": {"amount": 80.0, "currencyCode": "EUR"},
                })),
            )
            .await;
            let id = b["bookingId"].as_str().unwrap().to_owned();
            call(
                &c,
                Method::PUT,
                &format!("{}/bookings/{id}/", api(&server)),
                &key,
                Some(json!({"status": "PENDING", "partnerReferenceId": format!("crash-{id}")})),
            )
            .await;
            ids.push(id);
        }
        // Kill while a step of this round is in flight: its effect is made (the supplier
        // answers 400 ms later), its answer not yet committed; the first deliveries are
        // being refused meanwhile. An effect alone is not enough: on a loaded machine the
        // step's answer may have committed by the time it is seen.
        let round_ids = &ids[ids.len() - 3..];
        let mut in_flight = false;
        for _ in 0..400 {
            for id in round_ids {
                in_flight |= step_in_flight(home.path(), id).await;
            }
            if in_flight {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(in_flight, "no step of round {round} began");
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        server = Server::start(home.path());
    }
    // Every booking completes with its two tickets, each issued once.
    let mut asked_again = 0;
    for id in &ids {
        let mut booking = Value::Null;
        for _ in 0..800 {
            booking = call(
                &c,
                Method::GET,
                &format!("{}/bookings/{id}/", api(&server)),
                &key,
                None,
            )
            .await;
            if booking["status"] == "COMPLETED" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert_eq!(booking["status"], "COMPLETED", "{booking}");
        let tickets: Vec<&str> = booking["tickets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["publicId"].as_str().unwrap())
            .collect();
        let unique: BTreeSet<&str> = tickets.iter().copied().collect();
        assert_eq!(
            (tickets.len(), unique.len()),
            (2, 2),
            "two tickets, none twice: {booking}"
        );
        // The supplier and the admission service made each effect once for the booking (a
        // step re-run after a kill asked again under the same key and got the first answer),
        // and the booking shows the tickets that were issued, not others.
        let effects = step_effects(home.path(), id).await;
        for op in [
            "supplier.confirm",
            "admission.issue-tickets",
            "vouchers.deliver-voucher",
        ] {
            assert_eq!(
                effects.iter().filter(|(o, _, _)| o == op).count(),
                1,
                "{op} once for booking {id}: {effects:?}"
            );
        }
        let issued: BTreeSet<&str> = effects
            .iter()
            .filter(|(o, _, _)| o == "admission.issue-tickets")
            .flat_map(|(_, a, _)| a["Ok"].as_array().unwrap().iter())
            .map(|t| t["public_id"].as_str().unwrap())
            .collect();
        assert_eq!(issued, unique, "the booking shows the tickets issued");
        asked_again += effects.iter().map(|(_, _, calls)| calls - 1).sum::<i64>();
    }
    // Each kill cut a step off between its effect and its answer: a restarted node asked
    // again under the same key, and got the first answer.
    assert!(
        asked_again >= 3,
        "every kill landed mid-step: {asked_again} repeated asks"
    );
    // Every status change (PENDING, COMPLETED) of every booking is accepted by the receiver,
    // signed with the registration's secret; a retried delivery keeps its webhook-id.
    let accepted = |got: &[Value]| -> HashMap<(String, String), String> {
        got.iter()
            .filter(|e| e["answered"] == 200 && e["verifiedWith"] != json!([]))
            .map(|e| {
                (
                    (
                        e["body"]["bookingId"]
                            .to_string()
                            .trim_matches('"')
                            .to_owned(),
                        e["body"]["status"].as_str().unwrap().to_owned(),
                    ),
                    e["webhookId"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let missing = |got: &[Value]| -> Vec<(String, &str)> {
        let accepted = accepted(got);
        ids.iter()
            .flat_map(|id| ["PENDING", "COMPLETED"].map(|s| (id.clone(), s)))
            .filter(|(id, s)| !accepted.contains_key(&(id.clone(), (*s).to_owned())))
            .collect()
    };
    let mut got = receiver.received();
    for _ in 0..1200 {
        if missing(&got).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
        got = receiver.received();
    }
    if !missing(&got).is_empty() {
        let deliveries = call(
            &c,
            Method::GET,
            &format!(
                "{}/webhooks/{}/deliveries/",
                api(&server),
                hook["data"]["id"].as_str().unwrap()
            ),
            &key,
            None,
        )
        .await;
        panic!(
            "never accepted: {:?}\ndeliveries: {deliveries:#}",
            missing(&got)
        );
    }
    let mut ids_by_change: HashMap<(String, String), BTreeSet<String>> = HashMap::new();
    for e in &got {
        let change = (
            e["body"]["bookingId"]
                .to_string()
                .trim_matches('"')
                .to_owned(),
            e["body"]["status"].as_str().unwrap_or_default().to_owned(),
        );
        ids_by_change
            .entry(change)
            .or_default()
            .insert(e["webhookId"].as_str().unwrap_or_default().to_owned());
    }
    assert!(
        ids_by_change.values().all(|ids| ids.len() == 1),
        "one webhook-id per status change, across retries and restarts: {ids_by_change:?}"
    );
}
