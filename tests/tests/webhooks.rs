//! Webhook subscriptions end to end: a Python receiver verifies every delivery with PyPI
//! `standardwebhooks`; it answers 500, then 429 with Retry-After, then 200, and the attempts are
//! recorded; a secret rotation signs with both secrets; a redelivery repeats the webhook id; 410
//! disables; bad input is refused with the subscription error shape and changes nothing.
//! The receiver speaks HTTPS with a throwaway test CA; the test config trusts that CA and allows a
//! loopback address — two settings that are off by default.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, WebhookReceiver as Receiver, home_with, key_for, until_status};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

use capstan_e2e::{NEW_SECRET as NEW, OLD_SECRET as OLD};

/// A home with the steps fixture on the simulated cloud (no propagation wait) and webhooks
/// allowed to the test's loopback receiver, plus each test's own `[webhooks]` settings.
fn webhook_home(webhooks: &str) -> tempfile::TempDir {
    home_with(
        &["guest-fixtures/fixture-steps.wasm"],
        &format!(
            "[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[simulator]\ndns_propagation_ms = 0\n[webhooks]\nallow_loopback = true\n{webhooks}"
        ),
    )
}

#[tokio::test]
async fn deliveries_are_signed_retried_in_order_rotated_redelivered_and_410_disables() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start_tls(dir.path(), "500,429:1");
    let home = webhook_home(&format!(
        "extra_root_ca = {:?}\nretry_schedule_ms = [100, 100, 100]\ntimeout_ms = 2000\n",
        receiver.ca().display().to_string()
    ));
    let key = key_for(
        home.path(),
        "ops",
        &["workflows:fixture-steps", "subscriptions:manage"],
    );
    let other = key_for(home.path(), "other", &["subscriptions:manage"]);
    let server = Server::start(home.path());
    let base = server.base.clone();
    let c = Client::new();
    let hook = format!("https://localhost:{}/hook", receiver.port);

    // Bad input: the subscription error shape, nothing created.
    for (body, field) in [
        (
            json!({"events": ["ExecutionSucceeded.v1"], "secret": OLD, "url": "ftp://example.com/x"}),
            "/url",
        ),
        (
            json!({"events": ["ExecutionSucceeded.v1"], "secret": OLD, "url": "https://10.1.2.3/x"}),
            "/url",
        ),
        (
            json!({"events": ["ExecutionSucceeded.v1"], "secret": OLD, "url": "https://169.254.169.254/latest"}),
            "/url",
        ),
        (
            json!({"events": ["NoSuchEvent.v1"], "secret": OLD, "url": hook}),
            "/events/0",
        ),
        (json!({"events": [], "secret": OLD, "url": hook}), "/events"),
        (
            json!({"events": ["ExecutionSucceeded.v1"], "secret": "", "url": hook}),
            "/secret",
        ),
    ] {
        let r = c
            .post(format!("{base}/v1/subscriptions"))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{body}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"], "validation_error");
        assert!(
            e["issues"]
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i["path"] == field),
            "{body}: {e}"
        );
    }
    let none: Value = c
        .get(format!("{base}/v1/subscriptions"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(none["subscriptions"], json!([]));

    let created = c
        .post(format!("{base}/v1/subscriptions"))
        .bearer_auth(&key)
        .json(&json!({"events": ["ExecutionQueued.v1", "ExecutionSucceeded.v1"], "secret": OLD, "url": hook}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let sub = created.json::<Value>().await.unwrap()["subscription"].clone();
    let mut fields: Vec<&String> = sub.as_object().unwrap().keys().collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "active",
            "createdAt",
            "events",
            "health",
            "id",
            "kmsKeyId",
            "ownerPrincipalId",
            "url"
        ],
        "no secret material is ever returned"
    );
    assert_eq!(sub["kmsKeyId"], "local:1");
    let id = sub["id"].as_str().unwrap().to_owned();
    // Owner only.
    assert_eq!(
        c.get(format!("{base}/v1/subscriptions/{id}"))
            .bearer_auth(&other)
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::NOT_FOUND
    );
    let r = c
        .patch(format!("{base}/v1/subscriptions/{id}"))
        .bearer_auth(&key)
        .json(&json!({"url": "http://x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::BAD_REQUEST,
        "neither active nor events, and url cannot change"
    );

    // One execution: ExecutionQueued is answered 500, 429 (Retry-After 1 s), 200; then
    // ExecutionSucceeded — never before its predecessor.
    let trigger = |n: u32| {
        c.post(format!("{base}/v1/workflows/fixture-steps"))
            .bearer_auth(&key)
            .header("Idempotency-Key", format!("wh-{n}"))
            .json(&json!({"zone": "ZEXAMPLE-COM", "stages": 1}))
            .send()
    };
    let exec: Value = trigger(1).await.unwrap().json().await.unwrap();
    let exec = exec["executionId"].as_str().unwrap().to_owned();
    let got = receiver
        .until("two accepted events", |r| {
            r.iter().filter(|e| e["answered"] == 200).count() >= 2
        })
        .await;
    let types: Vec<(&str, i64)> = got
        .iter()
        .map(|e| {
            (
                e["eventType"].as_str().unwrap(),
                e["answered"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        types[..4],
        [
            ("ExecutionQueued", 500),
            ("ExecutionQueued", 429),
            ("ExecutionQueued", 200),
            ("ExecutionSucceeded", 200)
        ]
    );
    for e in &got {
        assert_eq!(
            e["verifiedWith"],
            json!([0]),
            "standardwebhooks verifies with the secret: {e}"
        );
        assert_eq!(
            e["webhookId"], e["eventId"],
            "webhook-id is the event id, stable across retries"
        );
        assert_eq!(e["executionId"], exec.as_str());
    }
    let deliveries: Value = c
        .get(format!("{base}/v1/subscriptions/{id}/deliveries?limit=10"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let queued_event = got[0]["eventId"].clone();
    // The relay marked the outbox: routed to a subscriber, published to streams, dispatched.
    let listed: Value = c
        .get(format!("{base}/v1/executions/{exec}/events"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let queued = listed["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["eventId"] == queued_event)
        .unwrap();
    for field in ["routedAt", "streamPublishedAt", "dispatchedAt"] {
        assert!(queued[field].is_string(), "{field}: {queued}");
    }
    let mut attempts: Vec<(i64, String, Value)> = deliveries["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["eventId"] == queued_event)
        .map(|d| {
            (
                d["attempt"].as_i64().unwrap(),
                d["status"].as_str().unwrap().to_owned(),
                d["responseCode"].clone(),
            )
        })
        .collect();
    attempts.sort_by_key(|a| a.0);
    assert_eq!(
        attempts,
        [
            (1, "failed".into(), json!(500)),
            (2, "failed".into(), json!(429)),
            (3, "succeeded".into(), json!(200))
        ]
    );
    let bad_limit = c
        .get(format!("{base}/v1/subscriptions/{id}/deliveries?limit=0"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(bad_limit.status(), StatusCode::BAD_REQUEST);

    // Rotation: the next deliveries carry both signatures; each verifies.
    let rotated = c
        .post(format!("{base}/v1/subscriptions/{id}/secret"))
        .bearer_auth(&key)
        .json(&json!({"secret": NEW}))
        .send()
        .await
        .unwrap();
    assert_eq!(rotated.status(), StatusCode::OK);
    assert!(
        rotated.json::<Value>().await.unwrap()["subscription"]
            .get("secret")
            .is_none()
    );
    trigger(2).await.unwrap();
    let got = receiver
        .until("events after the rotation", |r| {
            r.iter().filter(|e| e["answered"] == 200).count() >= 4
        })
        .await;
    let after: Vec<&Value> = got
        .iter()
        .filter(|e| e["answered"] == 200)
        .skip(2)
        .collect();
    for e in after {
        assert_eq!(e["signatures"], 2, "{e}");
        assert_eq!(
            e["verifiedWith"],
            json!([0, 1]),
            "old and new secret both verify: {e}"
        );
    }

    // Redelivery: a new attempt with the same webhook id.
    let r = c
        .post(format!(
            "{base}/v1/subscriptions/{id}/redeliver/{}",
            queued_event.as_str().unwrap()
        ))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let d = r.json::<Value>().await.unwrap()["delivery"].clone();
    assert_eq!(d["status"], "pending");
    assert_eq!(d["attempt"], 4);
    receiver
        .until("the redelivery", |r| {
            r.iter()
                .filter(|e| e["eventId"] == queued_event && e["answered"] == 200)
                .count()
                == 2
        })
        .await;
    assert_eq!(
        c.post(format!("{base}/v1/subscriptions/{id}/redeliver/nope"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::NOT_FOUND
    );

    // 410 Gone disables the subscription; its history is kept.
    let gone: Value = c
        .post(format!("{base}/v1/subscriptions"))
        .bearer_auth(&key)
        .json(&json!({"events": ["ExecutionQueued.v1"], "secret": OLD, "url": format!("https://localhost:{}/gone", receiver.port)}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let gone_id = gone["subscription"]["id"].as_str().unwrap().to_owned();
    trigger(3).await.unwrap();
    receiver
        .until("the 410", |r| r.iter().any(|e| e["answered"] == 410))
        .await;
    let mut state = Value::Null;
    for _ in 0..100 {
        state = c
            .get(format!("{base}/v1/subscriptions/{gone_id}"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or(Value::Null);
        if state.is_null() || state["subscription"]["active"] == false {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(state["subscription"]["active"], false, "{state}");
    assert_eq!(state["subscription"]["health"], "disabled");

    // Delete: 204; the subscription is disabled with its history kept: still readable, listed
    // inactive, its deliveries still there; it takes no more changes; deleting again is 204.
    let delete = || {
        c.delete(format!("{base}/v1/subscriptions/{id}"))
            .bearer_auth(&key)
            .send()
    };
    let deliveries = || async {
        c.get(format!("{base}/v1/subscriptions/{id}/deliveries"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    // Attempts already under way finish first, so the history compared below is settled.
    for _ in 0..200 {
        if !deliveries().await.to_string().contains("\"pending\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(delete().await.unwrap().status(), StatusCode::NO_CONTENT);
    let deliveries_before = deliveries().await;
    assert!(
        !deliveries_before["deliveries"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(delete().await.unwrap().status(), StatusCode::NO_CONTENT);
    let r = c
        .get(format!("{base}/v1/subscriptions/{id}"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let deleted: Value = r.json().await.unwrap();
    assert_eq!(deleted["subscription"]["active"], false, "{deleted}");
    assert_eq!(deleted["subscription"]["health"], "disabled", "{deleted}");
    assert_eq!(
        deliveries().await,
        deliveries_before,
        "the history is kept, and deleting again changed nothing"
    );
    let listed: Value = c
        .get(format!("{base}/v1/subscriptions"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        listed.to_string().contains(&id),
        "a deleted subscription is listed: {listed}"
    );
    let r = c
        .patch(format!("{base}/v1/subscriptions/{id}"))
        .bearer_auth(&key)
        .json(&json!({"active": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let refused: Value = r.json().await.unwrap();
    assert_eq!(refused["reason"], "subscription_deleted", "{refused}");
}

#[tokio::test]
async fn slow_receivers_hold_only_their_owners_share_and_subscriptions_are_capped_per_owner() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path(), "");
    let home =
        webhook_home("allow_http = true\ntimeout_ms = 30000\nmax_subscriptions_per_owner = 20\n");
    let perms = ["workflows:fixture-steps", "subscriptions:manage"];
    let slowpoke = key_for(home.path(), "slowpoke", &perms);
    let ops = key_for(home.path(), "ops", &perms);
    let server = Server::start(home.path());
    let base = server.base.clone();
    let c = Client::new();
    let events = json!([
        "ExecutionStarted.v1",
        "StageStarted.v1",
        "StageSucceeded.v1",
        "ExecutionSucceeded.v1"
    ]);
    let subscribe = async |key: &str, path: &str| {
        c.post(format!("{base}/v1/subscriptions"))
            .bearer_auth(key)
            .json(&json!({"events": events, "secret": OLD, "url": format!("http://127.0.0.1:{}{path}", receiver.port)}))
            .send()
            .await
            .unwrap()
    };
    for n in 0..20 {
        let path = format!("/slow?n={n}");
        assert_eq!(
            subscribe(&slowpoke, &path).await.status(),
            StatusCode::CREATED
        );
    }
    assert_eq!(subscribe(&ops, "/fast").await.status(), StatusCode::CREATED);
    // Twenty each: the twenty-first is refused, naming the setting.
    let refused = subscribe(&slowpoke, "/slow?n=20").await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "subscription_limit_reached", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("max_subscriptions_per_owner")
    );

    let r: Value = c
        .post(format!("{base}/v1/workflows/fixture-steps"))
        .bearer_auth(&ops)
        .header("Idempotency-Key", "fair")
        .json(&json!({"zone": "ZEXAMPLE-COM", "stages": 3}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = r["executionId"].as_str().unwrap().to_owned();
    // Every event reaches the fast receiver while the slow ones still hold their first attempts
    // (30 s): dispatch never waits for a slow receiver before sending others' deliveries.
    let got = receiver
        .until("every event at /fast", |got| {
            got.iter()
                .any(|e| e["path"] == "/fast" && e["eventType"] == "ExecutionSucceeded")
        })
        .await;
    let fast: Vec<_> = got
        .iter()
        .filter(|e| e["path"] == "/fast" && e["executionId"] == id.as_str())
        .collect();
    assert!(fast.len() >= 8, "start, 4 stages × 2, success: {fast:#?}");
    // The slow owner's twenty subscriptions hold its sixteen attempts in flight
    // (`MAX_IN_FLIGHT_PER_OWNER`); the other four wait for one of them to end.
    let is_slow = |e: &&Value| e["path"].as_str().is_some_and(|p| p.starts_with("/slow"));
    receiver
        .until("sixteen slow attempts", |got| {
            got.iter().filter(is_slow).count() >= 16
        })
        .await;
    // Several dispatch passes (one at least every 250 ms) find the four still due.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let slow: Vec<_> = receiver
        .received()
        .into_iter()
        .filter(|e| is_slow(&e))
        .collect();
    assert_eq!(slow.len(), 16, "one owner's share of attempts: {slow:#?}");
}

/// A subscription is owed only what commits while it is active: nothing from before it was
/// created, nothing from while it was inactive (however far the relay had got; it leaves its
/// cursor behind while no subscription is active), and everything after it is made active again.
#[tokio::test]
async fn a_subscription_is_owed_only_what_commits_while_it_is_active() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path(), "");
    let home = webhook_home("allow_http = true\n");
    let key = key_for(
        home.path(),
        "ops",
        &["workflows:fixture-steps", "subscriptions:manage"],
    );
    let server = Server::start(home.path());
    let base = server.base.clone();
    let c = Client::new();
    let run = |n: u32| {
        let body = json!({"zone": "ZEXAMPLE-COM", "stages": 1});
        run_to_success(
            c.clone(),
            base.clone(),
            key.clone(),
            format!("owed-{n}"),
            body,
        )
    };
    let before = run(1).await;
    let created: Value = c
        .post(format!("{base}/v1/subscriptions"))
        .bearer_auth(&key)
        .json(&json!({"events": ["ExecutionSucceeded.v1"], "secret": OLD,
            "url": format!("http://127.0.0.1:{}/hook", receiver.port)}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["subscription"]["id"].as_str().unwrap().to_owned();
    let active = |on: bool| {
        c.patch(format!("{base}/v1/subscriptions/{id}"))
            .bearer_auth(&key)
            .json(&json!({ "active": on }))
            .send()
    };
    let first = run(2).await;
    receiver
        .until("the first execution's event", |r| {
            r.iter().any(|e| e["executionId"] == first.as_str())
        })
        .await;
    assert_eq!(active(false).await.unwrap().status(), StatusCode::OK);
    let while_inactive = run(3).await;
    assert_eq!(active(true).await.unwrap().status(), StatusCode::OK);
    let after = run(4).await;
    let got = receiver
        .until("the last execution's event", |r| {
            r.iter().any(|e| e["executionId"] == after.as_str())
        })
        .await;
    let delivered: Vec<&str> = got
        .iter()
        .map(|e| e["executionId"].as_str().unwrap())
        .collect();
    assert_eq!(
        delivered,
        [first.as_str(), after.as_str()],
        "not {before} (before the subscription) nor {while_inactive} (while it was inactive)"
    );
}

/// A subscription's backlog (executions committing events faster than its receiver takes them)
/// is delivered one attempt at a time in commit order: every event accepted once, each failed
/// attempt's retry next, before any later event. Each attempt that delivers hands its place to
/// the subscription's next delivery, so this is the order of a chain of attempts, not only of
/// the dispatcher's passes.
#[tokio::test]
async fn a_backlog_is_delivered_in_commit_order_with_each_retry_before_anything_later() {
    let dir = tempfile::tempdir().unwrap();
    // Every seventh of the first 28 answers a 500; the rest, and everything after, 200.
    let script: Vec<&str> = (0..28)
        .map(|i| if i % 7 == 3 { "500" } else { "200" })
        .collect();
    let receiver = Receiver::start(dir.path(), &script.join(","));
    let home = webhook_home("allow_http = true\nretry_schedule_ms = [50, 50, 50]\n");
    let key = key_for(
        home.path(),
        "ops",
        &["workflows:fixture-steps", "subscriptions:manage"],
    );
    let server = Server::start(home.path());
    let base = server.base.clone();
    let c = Client::new();
    let created = c
        .post(format!("{base}/v1/subscriptions"))
        .bearer_auth(&key)
        .json(
            &json!({"events": ["ExecutionQueued.v1", "ExecutionStarted.v1", "StageStarted.v1",
            "StageSucceeded.v1", "ExecutionSucceeded.v1"], "secret": OLD,
            "url": format!("http://127.0.0.1:{}/hook", receiver.port)}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    // Eight executions at once: their events commit within milliseconds, the backlog.
    let mut runs = tokio::task::JoinSet::new();
    for n in 0..8 {
        let body =
            json!({"zone": "ZEXAMPLE-COM", "domain": format!("b{n}.example.com"), "stages": 3});
        runs.spawn(run_to_success(
            c.clone(),
            base.clone(),
            key.clone(),
            format!("backlog-{n}"),
            body,
        ));
    }
    while let Some(run) = runs.join_next().await {
        run.unwrap();
    }

    let db = capstan_e2e::database(home.path()).await;
    let owed: Vec<String> = sqlx::query_scalar(
        "SELECT event_id FROM outbox WHERE event_type IN
           ('ExecutionQueued', 'ExecutionStarted', 'StageStarted', 'StageSucceeded', 'ExecutionSucceeded')
         ORDER BY seq",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(
        owed.len(),
        8 * (3 + 2 * 4),
        "queued, started, (3 stages and the finalize stage) × 2, succeeded"
    );
    let got = receiver
        .until("every owed event accepted", |r| {
            r.iter().filter(|e| e["answered"] == 200).count() >= owed.len()
        })
        .await;
    // The requests in the order the receiver took them: a 500 is followed by the same event.
    let mut accepted = Vec::new();
    for (i, e) in got.iter().enumerate() {
        let id = e["eventId"].as_str().unwrap();
        if e["answered"] == 500 {
            assert_eq!(
                got.get(i + 1).map(|n| n["eventId"].as_str().unwrap()),
                Some(id),
                "the retry of a failed attempt comes before anything later: {got:#?}"
            );
        } else {
            accepted.push(id.to_owned());
        }
    }
    assert_eq!(
        got.iter().filter(|e| e["answered"] == 500).count(),
        4,
        "the script's failures were all met"
    );
    assert_eq!(
        accepted, owed,
        "each owed event accepted once, in commit order"
    );
}

/// Triggers `fixture-steps` with `body` and waits until the execution succeeded; its id.
async fn run_to_success(
    c: Client,
    base: String,
    key: String,
    idempotency_key: String,
    body: Value,
) -> String {
    let e: Value = c
        .post(format!("{base}/v1/workflows/fixture-steps"))
        .bearer_auth(&key)
        .header("Idempotency-Key", idempotency_key)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = e["executionId"].as_str().unwrap().to_owned();
    let done = until_status(&c, &base, &key, &id, &["succeeded", "failed"]).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    id
}
