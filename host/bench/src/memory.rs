//! `capstan bench --only memory`: start-up time and resident memory of a spawned `capstan serve`
//! (SQLite, `fixture-steps`): a cold start (components compiled), a warm start on the same home
//! (components loaded from the artifact cache), RSS idle, then RSS with `waiting` executions
//! parked on an approval (each has run to its `await_approval`, released its instance and left
//! only rows behind).

use crate::fanout::{Server, http_client};
use serde::Serialize;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Serialize)]
pub struct MemoryResults {
    /// Spawn → listening with an empty artifact cache (every component compiled).
    pub cold_start_ms: f64,
    /// Spawn → listening again on the same home (components from the cache).
    pub warm_start_ms: f64,
    pub rss_idle_mib: f64,
    pub waiting_executions: usize,
    pub rss_waiting_mib: f64,
    /// Triggered and parked per second (trigger over HTTP, run to the approval, release).
    pub parked_per_second: f64,
}

const CONFIG: &str = "workers = 32\n[rate_limit]\nrequests_per_second = 0.0\nburst = 1\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[simulator]\ndns_propagation_ms = 0\n";

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

pub async fn run(fixture: &Path, quick: bool) -> anyhow::Result<MemoryResults> {
    anyhow::ensure!(
        fixture.is_file(),
        "{} is missing: run `just build-guests`",
        fixture.display()
    );
    let waiting = if quick { 500 } else { 10_000 };
    let home = Arc::new(Server::home(&[fixture], CONFIG)?);
    let database = format!("sqlite://{}/capstan.db", home.path().display());
    let store = capstan_store::Store::open(&database).await?;

    let t = Instant::now();
    let cold = Server::start_node(home.clone(), database.clone()).await?;
    let cold_start_ms = t.elapsed().as_secs_f64() * 1e3;
    cold.kill().await?;
    let t = Instant::now();
    let server = Server::start_node(home.clone(), database.clone()).await?;
    let warm_start_ms = t.elapsed().as_secs_f64() * 1e3;

    let key = server
        .key_for("bench", &["workflows:fixture-steps"])
        .await?;
    let client = http_client()?;
    // Settle, then idle RSS.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_idle = server.rss_bytes()?;

    let progress = crate::progress(waiting as u64, "memory: parking executions");
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let (client, base, key, next, progress) = (
            client.clone(),
            server.base.clone(),
            key.clone(),
            next.clone(),
            progress.clone(),
        );
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= waiting {
                    return Ok::<_, anyhow::Error>(());
                }
                let r = client
                    .post(format!("{base}/v1/workflows/fixture-steps"))
                    .bearer_auth(&key)
                    .header("Idempotency-Key", format!("memory-{i}"))
                    .json(&json!({"zone": "ZEXAMPLE-COM", "stages": 10, "approval": true}))
                    .send()
                    .await?;
                let status = r.status();
                anyhow::ensure!(
                    status == reqwest::StatusCode::ACCEPTED,
                    "trigger answered {status}: {}",
                    r.json::<Value>().await.unwrap_or(Value::Null)
                );
                progress.inc(1);
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined??;
    }
    progress.finish_and_clear();
    crate::cluster::until_executions(
        &store,
        "status = 'waiting'",
        waiting,
        Duration::from_secs(900),
    )
    .await?;
    let parked_per_second = waiting as f64 / started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_waiting = server.rss_bytes()?;
    let results = MemoryResults {
        cold_start_ms,
        warm_start_ms,
        rss_idle_mib: mib(rss_idle),
        waiting_executions: waiting,
        rss_waiting_mib: mib(rss_waiting),
        parked_per_second,
    };
    println!(
        "memory    start: cold {:.0} ms, warm (cached components) {:.0} ms; RSS idle {:.1} MiB, with {} executions waiting on approval {:.1} MiB ({:.0} parked/s)",
        results.cold_start_ms,
        results.warm_start_ms,
        results.rss_idle_mib,
        results.waiting_executions,
        results.rss_waiting_mib,
        results.parked_per_second
    );
    Ok(results)
}
