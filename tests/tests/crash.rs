//! Crash safety: `capstan serve` is SIGKILLed at random moments while executions run, and
//! restarted each time. At the end every execution is terminal, no side effect of the simulated
//! cloud happened twice, every receipt matches exactly one effect, and no journal entry is lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_core::store::{EntryStatus, RunStore};
use capstan_e2e::{Server, home_with, key_for};
use reqwest::Client;
use serde_json::{Value, json};
use std::time::Duration;

const EXECUTIONS: usize = 24;
const KILLS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_nothing_and_duplicates_nothing() {
    // Every run spends 150 ms in its finalize stage (a latency-only fault on `dns.get-change`), so
    // with four workers the 24 runs take over a second and every kill below lands on runs in
    // flight, however fast the host is. The DNS changes of stages 1–10 keep the fast path.
    let home = home_with(
        &["guest-fixtures/fixture-steps.wasm"],
        "workers = 4\nlease_ms = 3000\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[simulator]\ndns_propagation_ms = 0\n[[simulator.faults]]\nop = \"dns.get-change\"\nlatency_ms = 150\n",
    );
    let key = key_for(home.path(), "ops", &["workflows:fixture-steps"]);
    let client = Client::new();
    let mut server = Server::start(home.path());
    let mut ids = Vec::new();
    for i in 0..EXECUTIONS {
        let r = client
            .post(format!("{}/v1/workflows/fixture-steps", server.base))
            .bearer_auth(&key)
            .header("Idempotency-Key", format!("crash-{i}"))
            .json(&json!({"zone": "ZEXAMPLE-COM", "stages": 10}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        ids.push(
            r.json::<Value>().await.unwrap()["executionId"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    // Pseudo-random but reproducible kill moments (5–120 ms after each start).
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..KILLS {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(5 + seed % 115)).await;
        let pid = server.child.id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status();
        let _ = server.child.wait();
        drop(server);
        server = Server::start(home.path());
    }
    // Let the last incarnation finish everything (expired leases are taken over after 3 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let mut done = 0;
        for id in &ids {
            let e: Value = client
                .get(format!("{}/v1/executions/{id}", server.base))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if ["succeeded", "failed", "canceled", "paused", "rolled_back"]
                .contains(&e["status"].as_str().unwrap_or(""))
            {
                assert_eq!(e["status"], "succeeded", "{e}");
                done += 1;
            }
        }
        if done == ids.len() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{done}/{} executions finished in time",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    drop(server);

    let db = capstan_e2e::database(home.path()).await;
    let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sim_effects")
        .fetch_one(&db)
        .await
        .unwrap();
    let receipts: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM receipts")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(receipts, (EXECUTIONS * 10) as i64, "one receipt per change");
    assert_eq!(
        effects, receipts,
        "every effect happened exactly once (tokens deduplicate replays)"
    );
    let orphans: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM receipts r LEFT JOIN sim_effects e ON e.token = r.id WHERE e.token IS NULL")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(orphans, 0, "every receipt names an effect that happened");
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sim_records")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(records, 10, "the ten record names were upserted");
    let replayed: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM runs WHERE activations > 1")
        .fetch_one(&db)
        .await
        .unwrap();
    eprintln!("runs finished by replay: {replayed}");
    assert!(
        replayed > 0,
        "some runs were interrupted by a kill and finished by replay on a later incarnation"
    );
    // The journal as the engine reads it (one row per commit, folded by the store).
    let store = capstan_store::Store::connect(&capstan_e2e::database_url(home.path()))
        .await
        .unwrap();
    let runs: Vec<String> = sqlx::query_scalar("SELECT id FROM runs")
        .fetch_all(&db)
        .await
        .unwrap();
    assert!(runs.len() >= EXECUTIONS);
    for run in runs {
        let journal = store.journal(&run).await.unwrap();
        assert!(!journal.is_empty(), "run {run} journaled its calls");
        for (i, entry) in journal.iter().enumerate() {
            assert_eq!(entry.seq, i as i64, "the journal of run {run} has no gap");
            assert_eq!(
                entry.status,
                EntryStatus::Done,
                "no intent was left unanswered (run {run}, call {i})"
            );
        }
    }
}
