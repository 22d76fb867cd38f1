//! Several `capstan serve` nodes on one PostgreSQL database. These tests always run on the test
//! PostgreSQL (`CAPSTAN_TEST_POSTGRES_URL`), whichever backend the rest of the run uses: SQLite
//! serves one node, so there is nothing to test there.
//!
//! - Three nodes under a steady trigger load, one SIGKILLed mid-run and restarted later: every
//!   execution reaches a terminal state, no receipt or simulated side effect is duplicated, an SSE
//!   client on one node sees every event of every node once, in commit order, and every webhook
//!   event is delivered (verified with `standardwebhooks`) in order per execution.
//! - The database goes away for a few seconds (a TCP proxy between node and PostgreSQL drops
//!   every connection and refuses new ones): the node reports not-ready, answers 503, and
//!   recovers by itself; work in flight finishes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{
    OLD_SECRET, Server, WebhookReceiver, database, database_url, home_on_postgres, key_for,
};
use reqwest::Client;
use serde_json::{Value, json};
use sqlx::Row;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TYPES: [&str; 3] = ["ExecutionQueued", "StageSucceeded", "ExecutionSucceeded"];
const STAGES: usize = 4;

/// Reads `GET /v1/streams/events` and records `(id, eventId)` of every event, in arrival order.
fn follow_stream(base: String, key: String) -> Arc<Mutex<Vec<(i64, String)>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    tokio::spawn(async move {
        let mut r = Client::new()
            .get(format!("{base}/v1/streams/events"))
            .bearer_auth(&key)
            .header("Accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let mut buffer = String::new();
        let (mut id, mut data) = (None::<i64>, None::<Value>);
        while let Ok(Some(chunk)) = r.chunk().await {
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find('\n') {
                let line = buffer[..end].trim_end_matches('\r').to_owned();
                buffer.drain(..=end);
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data = serde_json::from_str(v.trim()).ok();
                } else if line.is_empty()
                    && let (Some(i), Some(d)) = (id.take(), data.take())
                {
                    out.lock()
                        .unwrap()
                        .push((i, d["eventId"].as_str().unwrap_or_default().to_owned()));
                }
            }
        }
    });
    seen
}

async fn trigger(c: &Client, base: &str, key: &str, idem: &str) -> String {
    let r = c
        .post(format!("{base}/v1/workflows/fixture-steps"))
        .bearer_auth(key)
        .header("Idempotency-Key", idem)
        .json(&json!({"zone": "ZEXAMPLE-COM", "stages": STAGES}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "trigger: {}", r.status());
    let body: Value = r.json().await.unwrap();
    body["executionId"].as_str().unwrap().to_owned()
}

async fn status(c: &Client, base: &str, key: &str, id: &str) -> String {
    let e: Value = c
        .get(format!("{base}/v1/executions/{id}"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap_or(Value::Null);
    e["status"].as_str().unwrap_or("").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_share_the_work_and_survive_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = WebhookReceiver::start(dir.path(), "500,503");
    let home = home_on_postgres(
        &["guest-fixtures/fixture-steps.wasm"],
        "workers = 4\nlease_ms = 2000\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[simulator]\ndns_propagation_ms = 0\n[webhooks]\nallow_loopback = true\nallow_http = true\nretry_schedule_ms = [50, 50, 50, 50]\ntimeout_ms = 2000\n",
    );
    let key = key_for(
        home.path(),
        "ops",
        &["workflows:fixture-steps", "subscriptions:manage"],
    );
    let mut nodes: Vec<Option<Server>> = (0..3).map(|_| Some(Server::start(home.path()))).collect();
    let base = |nodes: &[Option<Server>], i: usize| nodes[i].as_ref().unwrap().base.clone();
    let c = Client::new();
    let created = c
        .post(format!("{}/v1/subscriptions", base(&nodes, 0)))
        .bearer_auth(&key)
        .json(&json!({"events": TYPES.map(|t| format!("{t}.v1")), "secret": OLD_SECRET, "url": format!("http://127.0.0.1:{}/hook", receiver.port)}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    // The stream client stays on node 0; triggers go to nodes 1 and 2.
    let stream = follow_stream(base(&nodes, 0), key.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut ids = Vec::new();
    for round in 0..5 {
        for n in 0..6 {
            let target = if nodes[2].is_some() { 1 + n % 2 } else { 1 };
            ids.push(
                trigger(
                    &c,
                    &base(&nodes, target),
                    &key,
                    &format!("cluster-{round}-{n}"),
                )
                .await,
            );
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        if round == 1 {
            // Mid-run: node 2 holds leases on runs and deliveries; its runs are taken over.
            let mut dead = nodes[2].take().unwrap();
            dead.child.kill().unwrap();
            dead.child.wait().unwrap();
        }
        if round == 3 {
            nodes[2] = Some(Server::start(home.path()));
        }
    }

    // Every execution finishes, whichever node ran it.
    for id in &ids {
        let mut last = String::new();
        for _ in 0..1200 {
            last = status(&c, &base(&nodes, 0), &key, id).await;
            if ["succeeded", "failed", "canceled", "paused"].contains(&last.as_str()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(last, "succeeded", "{id}");
    }

    // No side effect twice: one receipt per stage change, each an effect the simulator made once.
    let db = database(home.path()).await;
    let count = |sql: &'static str| {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&db)
                .await
                .unwrap()
        }
    };
    let receipts = count("SELECT COUNT(*) FROM receipts").await;
    assert_eq!(
        receipts,
        (ids.len() * STAGES) as i64,
        "one receipt per change"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM sim_effects").await,
        receipts,
        "every effect happened exactly once"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM receipts r LEFT JOIN sim_effects e ON e.token = r.id WHERE e.token IS NULL").await,
        0
    );

    // The stream on node 0 saw every event of every node, once, in commit (= cursor) order.
    let outbox: Vec<(i64, String)> = sqlx::query("SELECT seq, event_id FROM outbox ORDER BY seq")
        .fetch_all(&db)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<i64, _>(0), r.get::<String, _>(1)))
        .collect();
    let mut streamed = Vec::new();
    for _ in 0..400 {
        streamed = stream.lock().unwrap().clone();
        if streamed.len() >= outbox.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        streamed, outbox,
        "the stream is the outbox: no gap, no duplicate, same order"
    );

    // Every subscribed event reached the receiver, verified, in order per execution.
    let mut expected: HashMap<String, Vec<String>> = HashMap::new();
    for row in sqlx::query("SELECT execution_id, event_id, event_type FROM outbox ORDER BY seq")
        .fetch_all(&db)
        .await
        .unwrap()
    {
        if TYPES.contains(&row.get::<String, _>(2).as_str()) {
            expected.entry(row.get(0)).or_default().push(row.get(1));
        }
    }
    let got = receiver
        .until("every event", |r| capstan_e2e::all_accepted(r, &expected))
        .await;
    capstan_e2e::assert_verified_in_order(&got, &expected);
}

/// A TCP proxy in front of PostgreSQL that the test can cut: while cut, open connections are
/// dropped and new ones are closed at once.
struct CuttableProxy {
    port: u16,
    cut: tokio::sync::watch::Sender<bool>,
}

impl CuttableProxy {
    async fn start(upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if *watch.borrow() {
                    drop(inbound);
                    continue;
                }
                let upstream = upstream.clone();
                let mut watch = watch.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = watch.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Self { port, cut }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_rides_out_a_database_outage() {
    let home = home_on_postgres(
        &["guest-fixtures/fixture-steps.wasm"],
        "workers = 2\nlease_ms = 2000\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[simulator]\ndns_propagation_ms = 0\n",
    );
    let key = key_for(home.path(), "ops", &["workflows:fixture-steps"]);
    // Point the node at the proxy instead of PostgreSQL itself.
    let direct = database_url(home.path());
    let url = url::Url::parse(&direct).unwrap();
    let upstream = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432));
    let proxy = CuttableProxy::start(upstream.clone()).await;
    let proxied = direct.replacen(&upstream, &format!("127.0.0.1:{}", proxy.port), 1);
    std::fs::write(home.path().join("database-url"), &proxied).unwrap();
    let server = Server::start(home.path());
    let c = Client::new();
    let ready = |c: Client, base: String| async move {
        c.get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(ready(c.clone(), server.base.clone()).await, 200);
    let before = trigger(&c, &server.base, &key, "before-outage").await;

    proxy.cut.send(true).unwrap();
    let mut saw_not_ready = false;
    for _ in 0..100 {
        if ready(c.clone(), server.base.clone()).await == 503 {
            saw_not_ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(saw_not_ready, "readiness reports the lost database");
    let during = c
        .post(format!("{}/v1/workflows/fixture-steps", server.base))
        .bearer_auth(&key)
        .header("Idempotency-Key", "during-outage")
        .json(&json!({"zone": "ZEXAMPLE-COM", "stages": STAGES}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        during.status(),
        503,
        "writes answer 503 while the database is away"
    );
    let body: Value = during.json().await.unwrap();
    assert_eq!(body["error"], "unavailable", "{body}");
    tokio::time::sleep(Duration::from_secs(3)).await;

    proxy.cut.send(false).unwrap();
    let mut recovered = false;
    for _ in 0..300 {
        if ready(c.clone(), server.base.clone()).await == 200 {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "ready again without operator action");
    let after = trigger(&c, &server.base, &key, "after-outage").await;
    for id in [&before, &after] {
        let mut last = String::new();
        for _ in 0..600 {
            last = status(&c, &server.base, &key, id).await;
            if last == "succeeded" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(last, "succeeded", "{id} finished after the outage");
    }
}
