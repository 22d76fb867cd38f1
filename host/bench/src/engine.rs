//! `capstan bench --only engine`: ten-stage executions driven over HTTP against a spawned
//! `capstan serve`, on SQLite and on PostgreSQL, with `concurrency` executions in flight.
//!
//! Closed loop: each of `concurrency` clients triggers an execution of `fixture-steps` (ten
//! stages, one simulated DNS change each, then a finalize stage; simulated cloud at zero latency),
//! waits until the server reports it terminal, and triggers the next, until `executions` have run.
//! Three ways of waiting, as users wait: terminal events from one SSE stream the bench opens
//! before the first trigger (`stream`: the server pushes, nothing polls), each client awaiting its
//! execution in one request, `GET /v1/executions/{id}?wait=25s` (`long-poll`, asked again if
//! the wait elapses), or each client reading its execution's own SSE feed,
//! `GET /v1/executions/{id}/events` (`feed`, read to its end, after the terminal event, so that
//! its connection is reused). Latency is trigger sent → terminal event or answer read (client clock);
//! throughput is executions / wall time. Database writes per execution come from the server's
//! `/metrics` (`capstan_store_write_transactions_total`, read before and after).

use crate::fanout::{Server, http_client};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a client learns that its execution ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Waiter {
    /// The terminal event, from one shared SSE stream.
    Stream,
    /// `GET /v1/executions/{id}?wait=25s`, per execution.
    LongPoll,
    /// The execution's own SSE feed, `GET /v1/executions/{id}/events`, per execution.
    Feed,
}

impl Waiter {
    pub fn as_str(self) -> &'static str {
        match self {
            Waiter::Stream => "stream",
            Waiter::LongPoll => "long-poll",
            Waiter::Feed => "feed",
        }
    }
}

#[derive(Debug, Serialize)]
pub struct EngineHttpRun {
    pub backend: &'static str,
    pub waiter: Waiter,
    pub concurrency: usize,
    pub executions: usize,
    pub elapsed_ms: f64,
    pub executions_per_second: f64,
    /// Trigger sent → terminal event read by the client.
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    /// The slowest execution: one execution held up for a second shows here, not in the p99, and
    /// ends the row late (its client waits, so the row's rate falls).
    pub latency_max_ms: f64,
    /// Trigger sent → its `202` read. On SQLite the run starts ahead of its trigger's commit,
    /// so at 1 in flight the `202` comes while the run's stages go on; under load the trigger's
    /// commit shares a group with other executions' commits. On PostgreSQL the trigger commits
    /// before its run starts.
    pub accepted_p50_ms: f64,
    /// Write transactions the server began per execution (every kind: trigger, claims, journal,
    /// receipts, the simulated cloud's own records, outbox, relay); `None` when the server has no
    /// `/metrics` (an older build under `CAPSTAN_BENCH_SERVER`).
    pub write_transactions_per_execution: Option<f64>,
    pub server_cpu_s: f64,
    /// CPU the bench process itself spent meanwhile (the HTTP clients and the event stream's
    /// reader), which shares the machine's cores with the server.
    pub client_cpu_s: f64,
}

impl EngineHttpRun {
    /// Server CPU per execution, milliseconds.
    pub fn server_cpu_ms_per_execution(&self) -> f64 {
        1e3 * self.server_cpu_s / self.executions.max(1) as f64
    }

    /// Client CPU per execution, milliseconds.
    pub fn client_cpu_ms_per_execution(&self) -> f64 {
        1e3 * self.client_cpu_s / self.executions.max(1) as f64
    }
}

const STAGES: usize = 10;

fn config(workers: usize) -> String {
    format!(
        "workers = {workers}\n[rate_limit]\nrequests_per_second = 0.0\nburst = 1\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[simulator]\ndns_propagation_ms = 0\n"
    )
}

/// How the terminal event of each execution reaches the client waiting for it.
enum Slot {
    Waiting(tokio::sync::oneshot::Sender<(String, Instant)>),
    Arrived(String, Instant),
}

type Slots = Arc<Mutex<HashMap<String, Slot>>>;

/// One SSE message: its `event:` name and its `data:` text.
struct Message {
    name: String,
    data: String,
}

/// Every complete SSE message at the front of `buffer`, taken out of it.
fn complete_messages(buffer: &mut Vec<u8>) -> Vec<Message> {
    let mut messages = Vec::new();
    let mut start = 0;
    while let Some(end) = buffer[start..].windows(2).position(|w| w == b"\n\n") {
        let text = String::from_utf8_lossy(&buffer[start..start + end]);
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim_start().to_owned())
                .unwrap_or_default()
        };
        messages.push(Message {
            name: field("event:"),
            data: field("data:"),
        });
        start += end + 2;
    }
    buffer.drain(..start);
    messages
}

/// Reads the stream, handing each terminal event to its waiter (or parking it for one that has
/// not registered yet).
async fn terminal_events(mut response: reqwest::Response, slots: Slots) -> anyhow::Result<()> {
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let at = Instant::now();
        buffer.extend_from_slice(&chunk);
        for message in complete_messages(&mut buffer) {
            let event: Value = serde_json::from_str(&message.data)?;
            let (Some(id), Some(kind)) =
                (event["executionId"].as_str(), event["eventType"].as_str())
            else {
                continue;
            };
            let mut slots = slots.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            match slots.remove(id) {
                Some(Slot::Waiting(tx)) => {
                    let _ = tx.send((kind.to_owned(), at));
                }
                _ => {
                    slots.insert(id.to_owned(), Slot::Arrived(kind.to_owned(), at));
                }
            }
        }
    }
    Ok(())
}

/// The server's write-transaction counter, from `/metrics`.
pub(crate) async fn write_transactions(
    client: &reqwest::Client,
    base: &str,
) -> anyhow::Result<u64> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    text.lines()
        .find_map(|l| l.strip_prefix("capstan_store_write_transactions_total "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no write-transaction counter in /metrics: {text}"))
}

/// Awaits execution `id` with long polls: its terminal status and when the answer was read.
pub(crate) async fn long_poll(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    id: &str,
) -> anyhow::Result<(String, Instant)> {
    loop {
        let r = client
            .get(format!("{base}/v1/executions/{id}?wait=25s"))
            .bearer_auth(key)
            .send()
            .await?;
        let status = r.status();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        let at = Instant::now();
        anyhow::ensure!(
            status == reqwest::StatusCode::OK,
            "await answered {status}: {body}"
        );
        match body["status"].as_str() {
            Some("queued" | "running") => continue,
            Some("succeeded") => return Ok(("ExecutionSucceeded".to_owned(), at)),
            other => return Ok((format!("status {other:?}"), at)),
        }
    }
}

/// How long a feed may stay open after its terminal event before its connection is dropped
/// (`CAPSTAN_BENCH_SERVER` may be a build whose feeds do not end). Short: until then the feed
/// holds one of the principal's stream slots (`stream_connections_per_principal`, 100), and at
/// 32 in flight feeds end by the thousand per second.
const FEED_END: Duration = Duration::from_millis(20);

/// Awaits execution `id` on its own event feed: its terminal event and when it was read.
async fn feed(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    id: &str,
) -> anyhow::Result<(String, Instant)> {
    let mut response = client
        .get(format!("{base}/v1/executions/{id}/events"))
        .bearer_auth(key)
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .send()
        .await?;
    anyhow::ensure!(
        response.status() == reqwest::StatusCode::OK,
        "the feed answered {}",
        response.status()
    );
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let at = Instant::now();
        buffer.extend_from_slice(&chunk);
        // Dispatched on the SSE event name (`<EventType>.v<N>`), as an `EventSource` client
        // listening for the terminal types does: the stage events' JSON is never parsed.
        for message in complete_messages(&mut buffer) {
            if let Some(
                kind @ ("ExecutionSucceeded" | "ExecutionFailed" | "ExecutionCanceled"
                | "ExecutionPaused"),
            ) = message.name.split_once(".v").map(|(ty, _)| ty)
            {
                // The server ends the feed after the terminal event; read to that end off the
                // clock, so that the connection goes back to the pool for a later trigger, as
                // it does for a client that iterates the feed to its end.
                tokio::spawn(async move {
                    let end = async { while let Ok(Some(_)) = response.chunk().await {} };
                    let _ = tokio::time::timeout(FEED_END, end).await;
                });
                return Ok((kind.to_owned(), at));
            }
        }
    }
    anyhow::bail!("the feed of {id} ended before a terminal event")
}

async fn one(
    fixture: &Path,
    backend: &'static str,
    concurrency: usize,
    executions: usize,
    waiter: Waiter,
) -> anyhow::Result<EngineHttpRun> {
    let home = Arc::new(Server::home(&[fixture], &config(concurrency.max(4)))?);
    use crate::cluster::{BenchSchema, postgres_server, with_tls};
    let schema = match backend {
        "sqlite" | "sqlite-normal" => None,
        "postgres-tls" => Some(BenchSchema::create(with_tls(&postgres_server())).await?),
        _ => Some(BenchSchema::create(postgres_server()).await?),
    };
    let database = match (&schema, backend) {
        (Some(schema), _) => schema.url.clone(),
        // The weaker durability mode (docs/operating.md), to price the default's fsyncs.
        (None, "sqlite-normal") => format!(
            "sqlite://{}/capstan.db?synchronous=normal",
            home.path().display()
        ),
        (None, _) => format!("sqlite://{}/capstan.db", home.path().display()),
    };
    capstan_store::Store::open(&database).await?;
    let server = Server::start_node(home, database).await?;
    let key = server
        .key_for("bench", &["workflows:fixture-steps"])
        .await?;
    let client = http_client()?;
    let base = server.base.clone();
    let slots: Slots = Arc::default();
    // Long polls need no stream: its reader would only add client CPU to theirs.
    let reader = if waiter == Waiter::Stream {
        let stream = client
            .get(format!(
                "{base}/v1/streams/events?event=ExecutionSucceeded.v1,ExecutionFailed.v1,ExecutionPaused.v1,ExecutionCanceled.v1"
            ))
            .bearer_auth(&key)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await?;
        anyhow::ensure!(
            stream.status() == reqwest::StatusCode::OK,
            "stream answered {}",
            stream.status()
        );
        Some(tokio::spawn(terminal_events(stream, slots.clone())))
    } else {
        None
    };
    let progress = crate::progress(
        executions as u64,
        &format!("engine {backend} ×{concurrency}"),
    );
    let writes_before = write_transactions(&client, &base).await.ok();
    let cpu_before = server.cpu_seconds();
    let client_cpu_before = crate::fanout::cpu_seconds(None);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, base, key, next, slots, progress) = (
            client.clone(),
            base.clone(),
            key.clone(),
            next.clone(),
            slots.clone(),
            progress.clone(),
        );
        tasks.spawn(async move {
            let (mut latencies, mut accepted) = (Vec::new(), Vec::new());
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= executions {
                    return Ok::<_, anyhow::Error>((latencies, accepted));
                }
                let sent = Instant::now();
                let r = client
                    .post(format!("{base}/v1/workflows/fixture-steps"))
                    .bearer_auth(&key)
                    .header("Idempotency-Key", format!("engine-{i}"))
                    // Each execution its own record sets, as executions for different domains have:
                    // one record set's changes wait for each other (on PostgreSQL, for its lock).
                    .json(&json!({"zone": "ZEXAMPLE-COM", "domain": format!("e{i}.example.com"), "stages": STAGES}))
                    .send()
                    .await?;
                let status = r.status();
                let body: Value = r.json().await.unwrap_or(Value::Null);
                accepted.push(sent.elapsed());
                anyhow::ensure!(
                    status == reqwest::StatusCode::ACCEPTED,
                    "trigger answered {status}: {body}"
                );
                let id = body["executionId"]
                    .as_str()
                    .ok_or_else(|| anyhow::anyhow!("no executionId in {body}"))?
                    .to_owned();
                if waiter != Waiter::Stream {
                    let (kind, at) = if waiter == Waiter::LongPoll {
                        long_poll(&client, &base, &key, &id).await?
                    } else {
                        feed(&client, &base, &key, &id).await?
                    };
                    anyhow::ensure!(kind == "ExecutionSucceeded", "execution {id}: {kind}");
                    latencies.push(at.saturating_duration_since(sent));
                    progress.inc(1);
                    continue;
                }
                let arrived = {
                    let mut slots = slots.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                    match slots.remove(&id) {
                        Some(Slot::Arrived(kind, at)) => Ok((kind, at)),
                        _ => {
                            let (tx, rx) = tokio::sync::oneshot::channel();
                            slots.insert(id.clone(), Slot::Waiting(tx));
                            Err(rx)
                        }
                    }
                };
                let (kind, at) = match arrived {
                    Ok(done) => done,
                    Err(rx) => tokio::time::timeout(Duration::from_secs(300), rx)
                        .await
                        .map_err(|_| anyhow::anyhow!("execution {id} not terminal after 300 s"))?
                        .map_err(|_| anyhow::anyhow!("the event stream ended"))?,
                };
                anyhow::ensure!(kind == "ExecutionSucceeded", "execution {id}: {kind}");
                latencies.push(at.saturating_duration_since(sent));
                progress.inc(1);
            }
        });
    }
    let mut latencies = Vec::with_capacity(executions);
    let mut accepted = Vec::with_capacity(executions);
    while let Some(joined) = tasks.join_next().await {
        let (done, answered) = joined??;
        latencies.extend(done);
        accepted.extend(answered);
    }
    let elapsed = started.elapsed();
    progress.finish_and_clear();
    let writes = match (writes_before, write_transactions(&client, &base).await.ok()) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    let server_cpu_s = server.cpu_seconds() - cpu_before;
    let client_cpu_s = crate::fanout::cpu_seconds(None) - client_cpu_before;
    if let Some(reader) = reader {
        reader.abort();
    }
    server.kill().await?;
    if let Some(schema) = schema {
        schema.remove().await?;
    }
    latencies.sort_unstable();
    accepted.sort_unstable();
    let pct = |p: f64| crate::percentile_ms(&latencies, p);
    Ok(EngineHttpRun {
        backend,
        waiter,
        concurrency,
        executions,
        elapsed_ms: elapsed.as_secs_f64() * 1e3,
        executions_per_second: executions as f64 / elapsed.as_secs_f64(),
        latency_p50_ms: pct(0.50),
        latency_p99_ms: pct(0.99),
        latency_max_ms: latencies.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        accepted_p50_ms: crate::percentile_ms(&accepted, 0.50),
        write_transactions_per_execution: writes.map(|w| w as f64 / executions as f64),
        server_cpu_s,
        client_cpu_s,
    })
}

/// SQLite (`synchronous=full`, the default), SQLite with `synchronous=normal`, then PostgreSQL
/// (skipped with a note when it cannot be reached) without TLS and with it (`postgres-tls`, every
/// connection encrypted), each awaited the three ways but for the weaker SQLite mode and TLS,
/// which price one cost each on the shared stream; 32 in flight, then 1.
pub async fn run(
    fixture: &Path,
    quick: bool,
    only: &[String],
    executions: Option<usize>,
) -> anyhow::Result<Vec<EngineHttpRun>> {
    anyhow::ensure!(
        fixture.is_file(),
        "{} is missing: run `just build-guests`",
        fixture.display()
    );
    let executions = executions.unwrap_or(if quick { 100 } else { 2_000 });
    let wanted = |backend: &str| only.is_empty() || only.iter().any(|o| o == backend);
    for o in only {
        anyhow::ensure!(
            ["sqlite", "sqlite-normal", "postgres", "postgres-tls"].contains(&o.as_str()),
            "--backend {o}: the engine section's stores are sqlite, sqlite-normal, postgres and postgres-tls"
        );
    }
    let mut backends: Vec<&'static str> = ["sqlite", "sqlite-normal"]
        .into_iter()
        .filter(|b| wanted(b))
        .collect();
    if wanted("postgres") || wanted("postgres-tls") {
        let server = crate::cluster::postgres_server();
        match <sqlx::PgConnection as sqlx::Connection>::connect(&server).await {
            // TLS is priced in full runs only (or when asked for).
            Ok(_) => backends.extend(
                ["postgres", "postgres-tls"]
                    .into_iter()
                    .filter(|b| wanted(b) && (!quick || !only.is_empty() || *b == "postgres")),
            ),
            Err(e) => println!("(skipping the PostgreSQL engine runs: {server}: {e})"),
        }
    }
    // Each store with the three ways users wait; the weaker SQLite durability mode and TLS with
    // the shared stream only, to price the default's fsyncs and the encryption.
    let mut plan: Vec<(&'static str, Waiter)> = Vec::new();
    for backend in &backends {
        plan.push((backend, Waiter::Stream));
        if !matches!(*backend, "sqlite-normal" | "postgres-tls") {
            plan.push((backend, Waiter::LongPoll));
            plan.push((backend, Waiter::Feed));
        }
    }
    let mut runs = Vec::new();
    for (backend, waiter) in plan {
        for concurrency in [32, 1] {
            let run = one(fixture, backend, concurrency, executions, waiter).await?;
            println!(
                "engine    {:<13} {:<9} {:>2} in flight: {} ten-stage executions over HTTP, {:.0}/s, trigger→terminal p50 {:.2} ms (trigger→202 p50 {:.2} ms), p99 {:.1} ms, max {:.1} ms, {} write transactions each, CPU {:.2} ms server + {:.2} ms client each",
                run.backend,
                run.waiter.as_str(),
                run.concurrency,
                run.executions,
                run.executions_per_second,
                run.latency_p50_ms,
                run.accepted_p50_ms,
                run.latency_p99_ms,
                run.latency_max_ms,
                run.write_transactions_per_execution
                    .map_or("?".to_owned(), |w| format!("{w:.1}")),
                run.server_cpu_ms_per_execution(),
                run.client_cpu_ms_per_execution()
            );
            runs.push(run);
        }
    }
    Ok(runs)
}
