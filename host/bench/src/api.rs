//! `capstan bench --only api`: `GET /v1/executions/{id}` next to `GET /healthz` on the same
//! spawned `capstan serve` (SQLite), 64 connections each, so the ratio says how much of the HTTP
//! stack's own ceiling an authenticated, audited execution read keeps.
//!
//! 64 client tasks in the bench process, each with its own keep-alive HTTP/1.1 connection, send
//! requests back to back for a fixed time after a warm-up; every answer must be 200. The clients
//! share the machine's cores with the server, as in every section.

use crate::fanout::{Server, events_when_done, http_client, trigger};
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Debug, Serialize)]
pub struct ApiRun {
    pub route: &'static str,
    pub connections: usize,
    pub requests: u64,
    pub seconds: f64,
    pub requests_per_second: f64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub server_cpu_s: f64,
}

#[derive(Debug, Serialize)]
pub struct ApiResults {
    pub healthz: ApiRun,
    pub execution: ApiRun,
    /// Execution reads per second as a share of `/healthz`'s.
    pub ratio: f64,
}

const CONNECTIONS: usize = 64;

async fn load(
    server: &Server,
    route: &'static str,
    url: String,
    key: Option<String>,
    seconds: f64,
) -> anyhow::Result<ApiRun> {
    // One client per task: its own connection, reused for every request.
    let clients: Vec<reqwest::Client> = (0..CONNECTIONS)
        .map(|_| http_client())
        .collect::<anyhow::Result<_>>()?;
    let warm_up = Duration::from_millis(500);
    let measure = Duration::from_secs_f64(seconds);
    let start = Instant::now() + warm_up;
    let end = start + measure;
    let progress = crate::progress((warm_up + measure).as_millis() as u64, route);
    let ticker = {
        let progress = progress.clone();
        tokio::spawn(async move {
            let began = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                progress.set_position(began.elapsed().as_millis() as u64);
            }
        })
    };
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        let (url, key) = (url.clone(), key.clone());
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let sent = Instant::now();
                if sent >= end {
                    return Ok::<_, anyhow::Error>(latencies);
                }
                let mut request = client.get(&url);
                if let Some(key) = &key {
                    request = request.bearer_auth(key);
                }
                let response = request.send().await?;
                let status = response.status();
                let _ = response.bytes().await?;
                anyhow::ensure!(status == reqwest::StatusCode::OK, "{url} answered {status}");
                if sent >= start {
                    latencies.push(sent.elapsed());
                }
            }
        });
    }
    tokio::time::sleep_until(tokio::time::Instant::from_std(start)).await;
    let cpu_start = server.cpu_seconds();
    tokio::time::sleep_until(tokio::time::Instant::from_std(end)).await;
    let server_cpu_s = server.cpu_seconds() - cpu_start;
    let mut latencies = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        latencies.extend(joined??);
    }
    ticker.abort();
    progress.finish_and_clear();
    latencies.sort_unstable();
    let pct = |p: f64| crate::percentile_ms(&latencies, p);
    Ok(ApiRun {
        route,
        connections: CONNECTIONS,
        requests: latencies.len() as u64,
        seconds,
        requests_per_second: latencies.len() as f64 / seconds,
        latency_p50_ms: pct(0.50),
        latency_p99_ms: pct(0.99),
        server_cpu_s,
    })
}

pub async fn run(workflows: &Path, quick: bool) -> anyhow::Result<ApiResults> {
    let hello = workflows.join("hello.wasm");
    anyhow::ensure!(
        hello.is_file(),
        "{} is missing: run `just build-guests`",
        hello.display()
    );
    let server = Server::start(
        &hello,
        "workers = 4\n[rate_limit]\nrequests_per_second = 0.0\nburst = 1\n",
    )
    .await?;
    let key = server.key_for("bench", &["workflows:hello"]).await?;
    let client = http_client()?;
    let base = server.base.clone();
    let id = trigger(&client, &base, &key, "api-read").await?;
    events_when_done(
        &client,
        &base,
        &key,
        &id,
        Instant::now() + Duration::from_secs(60),
    )
    .await?;
    let seconds = if quick { 2.0 } else { 10.0 };
    let healthz = load(
        &server,
        "GET /healthz",
        format!("{base}/healthz"),
        None,
        seconds,
    )
    .await?;
    let execution = load(
        &server,
        "GET /v1/executions/{id}",
        format!("{base}/v1/executions/{id}"),
        Some(key),
        seconds,
    )
    .await?;
    let ratio = execution.requests_per_second / healthz.requests_per_second.max(1.0);
    for r in [&healthz, &execution] {
        println!(
            "api       {:<24} {} connections: {:.0} requests/s, p50 {:.2} ms, p99 {:.2} ms (server CPU {:.1} s)",
            r.route,
            r.connections,
            r.requests_per_second,
            r.latency_p50_ms,
            r.latency_p99_ms,
            r.server_cpu_s
        );
    }
    println!(
        "api       execution reads are {:.0}% of the /healthz ceiling",
        ratio * 100.0
    );
    Ok(ApiResults {
        healthz,
        execution,
        ratio,
    })
}
