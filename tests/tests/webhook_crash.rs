//! Webhooks survive SIGKILL: the host is killed while executions commit events and deliveries are
//! in flight, then restarted on the same database; every event reaches the receiver at least once
//! (verified by `standardwebhooks`), and each execution's events arrive in order.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{OLD_SECRET, Server, WebhookReceiver, home_with, key_for};
use reqwest::Client;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Duration;

const TYPES: [&str; 3] = ["ExecutionQueued", "StageSucceeded", "ExecutionSucceeded"];

#[tokio::test]
async fn every_event_is_delivered_at_least_once_in_order_across_sigkills() {
    let dir = tempfile::tempdir().unwrap();
    // Slow-ish receiver answers keep deliveries in flight when the kill lands.
    let receiver = WebhookReceiver::start(dir.path(), "500,500,503");
    let home = home_with(
        &["guest-fixtures/fixture-steps.wasm"],
        "lease_ms = 2000\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[simulator]\ndns_propagation_ms = 0\n[webhooks]\nallow_loopback = true\nallow_http = true\nretry_schedule_ms = [50, 50, 50, 50]\ntimeout_ms = 2000\n",
    );
    let key = key_for(
        home.path(),
        "ops",
        &["workflows:fixture-steps", "subscriptions:manage"],
    );
    let mut server = Server::start(home.path());
    let c = Client::new();
    let created = c
        .post(format!("{}/v1/subscriptions", server.base))
        .bearer_auth(&key)
        .json(&json!({"events": TYPES.map(|t| format!("{t}.v1")), "secret": OLD_SECRET, "url": format!("http://127.0.0.1:{}/hook", receiver.port)}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let mut ids = Vec::new();
    for round in 0..3 {
        for n in 0..4 {
            let r: Value = c
                .post(format!("{}/v1/workflows/fixture-steps", server.base))
                .bearer_auth(&key)
                .header("Idempotency-Key", format!("crash-{round}-{n}"))
                .json(&json!({"zone": "ZEXAMPLE-COM", "stages": 3}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            ids.push(r["executionId"].as_str().unwrap().to_owned());
        }
        tokio::time::sleep(Duration::from_millis(60 + 40 * round)).await;
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        server = Server::start(home.path());
    }
    // Every execution finishes; collect the events the subscription names, in outbox order.
    let mut expected: HashMap<String, Vec<String>> = HashMap::new();
    for id in &ids {
        let mut done = false;
        for _ in 0..800 {
            let e: Value = c
                .get(format!("{}/v1/executions/{id}", server.base))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if e["status"] == "succeeded" {
                done = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(done, "{id} did not finish");
        let events: Value = c
            .get(format!("{}/v1/executions/{id}/events", server.base))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        expected.insert(
            id.clone(),
            events["events"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| TYPES.contains(&e["eventType"].as_str().unwrap()))
                .map(|e| e["eventId"].as_str().unwrap().to_owned())
                .collect(),
        );
    }
    let total: usize = expected.values().map(Vec::len).sum();
    let got = receiver
        .until("every event", |r| capstan_e2e::all_accepted(r, &expected))
        .await;
    // Per execution, the first accepted delivery of each event comes in outbox order.
    capstan_e2e::assert_verified_in_order(&got, &expected);
    assert!(total >= 12 * 5, "{total}");
}
