//! `capstan bench` — fan-out: SSE clients and webhook deliveries against a real
//! `capstan serve`.
//!
//! Each part spawns this executable as `capstan serve` on 127.0.0.1 (ports chosen by the OS) with
//! a fresh home (SQLite file, component cache, a copy of `hello.wasm`), grants a principal and
//! mints its key with the same executable's CLI, and drives it over HTTP like any client:
//!
//! - **SSE fan-out**: `clients` connections to `GET /v1/streams/events` (bearer key), then
//!   `executions` runs of `hello` triggered as fast as the API accepts them (4 at a time). Every
//!   client must receive every event of those executions exactly once, in cursor order. Latency
//!   is each event's `occurredAt` (the time the engine stamped on the change it commits with; the
//!   OutboxEvent has no separate commit time, and `occurredAt` has millisecond precision) to the
//!   moment the client read it, on the same machine clock.
//! - **Webhooks**: an HTTPS receiver inside this process (rustls, a throwaway CA and certificate
//!   made with the `openssl` CLI, trusted by the server through `[webhooks] extra_root_ca`, with
//!   `allow_loopback`) answers 204 and checks every signature; `subscriptions` subscriptions name
//!   every event type `hello` publishes; `executions` runs are triggered and the rate is the
//!   distinct deliveries received per second from the first trigger to the last delivery.
//!
//! Both also report the CPU time the server process and this process used in the measured
//! window (from `/proc`), which says whether the two cores or something else was the limit.

use serde::Serialize;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::AsyncBufReadExt;

/// How big each part is.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    sse_clients: &'static [usize],
    sse_executions: usize,
    webhook_executions: usize,
    webhook_subscriptions: &'static [usize],
    /// Every wait of a part ends by this long after its start.
    deadline: Duration,
}

impl Sizes {
    fn of(quick: bool) -> Self {
        if quick {
            Self {
                sse_clients: &[50],
                sse_executions: 5,
                webhook_executions: 5,
                webhook_subscriptions: &[1, 4],
                deadline: Duration::from_secs(60),
            }
        } else {
            Self {
                sse_clients: &[100, 1_000],
                sse_executions: 100,
                webhook_executions: 100,
                webhook_subscriptions: &[1, 8],
                deadline: Duration::from_secs(600),
            }
        }
    }
}

/// Figures of the SSE part.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SseFanout {
    pub clients: usize,
    pub executions: usize,
    /// Events one execution of `hello` publishes.
    pub events_per_execution: usize,
    /// Events received, summed over every client (= clients × executions × events per execution).
    pub events_delivered: u64,
    /// From the first trigger to the last event read by the last client.
    pub elapsed_ms: f64,
    pub events_delivered_per_second: f64,
    /// Events committed per second by the engine over the same window (first trigger to last
    /// `occurredAt`): what every client would receive per second if fan-out kept up.
    pub events_committed_per_second: f64,
    /// `occurredAt` → read by the client, over every (client, event).
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub latency_max_ms: f64,
    /// Time to open every connection (all at once) before the first trigger.
    pub connect_all_ms: f64,
    pub server_cpu_s: f64,
    pub bench_process_cpu_s: f64,
}

/// Figures of one webhook run.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookRun {
    pub subscriptions: usize,
    pub executions: usize,
    pub events_per_execution: usize,
    /// Distinct (subscription, webhook-id) deliveries received (= subscriptions × executions ×
    /// events per execution; the bench fails otherwise).
    pub deliveries: u64,
    /// Requests beyond the distinct deliveries (retries after a timeout, say).
    pub duplicate_requests: u64,
    pub bad_signatures: u64,
    /// From the first trigger to the last delivery.
    pub elapsed_ms: f64,
    pub deliveries_per_second: f64,
    /// From the first trigger to the last event's `occurredAt`: how long the engine took to
    /// commit what was delivered.
    pub engine_done_ms: f64,
    /// `occurredAt` → received, p50 and p99 over deliveries.
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub server_cpu_s: f64,
    pub bench_process_cpu_s: f64,
    /// One POST the way the dispatcher sends it, timed in this process against the same
    /// receiver, p50 over serial sends: building the pinned client (it is built per delivery)...
    pub probe_client_build_p50_ms: f64,
    /// ...and the request itself on a new connection (TCP + TLS handshake + POST + 204).
    pub probe_request_p50_ms: f64,
    /// The first subscription's deliveries, from the server's own records (`dispatchedAt`, ms
    /// precision) and the receiver's clock: p50 of attempt start → received...
    pub dispatch_to_received_p50_ms: f64,
    /// ...and p50 of the time between one attempt's start and the next one's.
    pub dispatch_interval_p50_ms: f64,
}

/// Both parts.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FanoutResults {
    pub sse: Vec<SseFanout>,
    pub webhooks: Vec<WebhookRun>,
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// `occurredAt` (RFC 3339, milliseconds) as Unix microseconds.
fn occurred_us(text: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis() * 1000)
}

/// Percentile of sorted microsecond samples, in milliseconds.
fn pct_ms(sorted: &[i64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1e3
}

/// CPU time (user + system) of a process so far, in seconds, from `/proc/<pid>/stat`.
pub(crate) fn cpu_seconds(pid: Option<u32>) -> f64 {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let Ok(text) = std::fs::read_to_string(path) else {
        return 0.0;
    };
    // Fields after the command name (which is in parentheses and may hold spaces): state is the
    // first, utime the 12th, stime the 13th.
    let Some((_, rest)) = text.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / rustix::param::clock_ticks_per_second() as f64
}

/// Raises the soft open-files limit towards the hard one when `needed` descriptors are more
/// than it allows (the server, spawned after this, inherits the limit).
pub(crate) fn ensure_open_files(needed: u64) -> anyhow::Result<()> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let soft = limit.current.unwrap_or(u64::MAX);
    if soft >= needed {
        return Ok(());
    }
    let hard = limit.maximum.unwrap_or(u64::MAX);
    anyhow::ensure!(
        hard >= needed,
        "{needed} open files are needed but the hard limit is {hard}: raise it (ulimit -Hn) or run with --quick"
    );
    setrlimit(
        Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(hard),
            maximum: limit.maximum,
        },
    )?;
    println!("(raised the open-files limit from {soft} to {hard})");
    Ok(())
}

/// A `capstan serve` child on 127.0.0.1; killed when dropped. Several may share one home and
/// database (the cluster bench).
pub(crate) struct Server {
    child: tokio::process::Child,
    pub(crate) base: String,
    home: Arc<tempfile::TempDir>,
    database: String,
    /// The server's last log lines, for errors.
    log: Arc<Mutex<VecDeque<String>>>,
}

impl Server {
    /// A command of the `capstan` binary beside this one with the home's config, database,
    /// workflows and data dir, none of the caller's `CAPSTAN_*` settings, and bench-only secrets.
    fn command(home: &Path, database: &str) -> anyhow::Result<tokio::process::Command> {
        // `CAPSTAN_BENCH_SERVER` names another build to measure with this harness (an earlier
        // commit's binary, for before/after figures on one machine).
        let exe = match std::env::var_os("CAPSTAN_BENCH_SERVER") {
            Some(other) => std::path::PathBuf::from(other),
            None => std::env::current_exe()?.with_file_name("capstan"),
        };
        let mut cmd = tokio::process::Command::new(exe);
        cmd.arg("--config")
            .arg(home.join("capstan.toml"))
            .arg("--database")
            .arg(database)
            .arg("--workflows")
            .arg(home.join("workflows"))
            .arg("--data-dir")
            .arg(home.join("data"))
            .arg("--log-format")
            .arg("json");
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CAPSTAN_") {
                cmd.env_remove(key);
            }
        }
        cmd.env_remove("RUST_LOG")
            .env("CAPSTAN_PEPPERS", "1:bench-only-pepper-0123456789abcdef")
            .env(
                "CAPSTAN_SECRET_KEYS",
                "1:YmVuY2gtb25seS1rZXktMDEyMzQ1Njc4OWFiY2RlZmc=",
            )
            .kill_on_drop(true)
            .stdin(std::process::Stdio::null());
        Ok(cmd)
    }

    /// Starts `capstan serve` with `config` (TOML) and `hello.wasm` on a fresh SQLite file, and
    /// waits until it listens.
    pub(crate) async fn start(hello: &Path, config: &str) -> anyhow::Result<Self> {
        let home = Arc::new(Self::home(&[hello], config)?);
        let database = format!("sqlite://{}/capstan.db", home.path().display());
        Self::start_node(home, database).await
    }

    /// A home with these components in `workflows/` and this config.
    pub(crate) fn home(components: &[&Path], config: &str) -> anyhow::Result<tempfile::TempDir> {
        let home = tempfile::tempdir()?;
        std::fs::create_dir_all(home.path().join("workflows"))?;
        std::fs::create_dir_all(home.path().join("data"))?;
        for c in components {
            let name = c
                .file_name()
                .ok_or_else(|| anyhow::anyhow!("{} has no file name", c.display()))?;
            std::fs::copy(c, home.path().join("workflows").join(name))?;
        }
        // A fresh database would otherwise get the demo partner catalog: a missing file is skipped.
        let config = format!(
            "{config}\n[booking]\ncatalog_file = {:?}\n",
            home.path().join("no-catalog.json").display().to_string()
        );
        std::fs::write(home.path().join("capstan.toml"), config)?;
        Ok(home)
    }

    /// Starts one `capstan serve` on `home` and `database` and waits until it listens.
    pub(crate) async fn start_node(
        home: Arc<tempfile::TempDir>,
        database: String,
    ) -> anyhow::Result<Self> {
        let mut child = Self::command(home.path(), &database)?
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--sandbox-listen",
                "127.0.0.1:0",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stderr"))?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let kept = log.clone();
        // Reads the log to its end (so the server never blocks on a full pipe), keeping the last
        // lines and handing over the address once it listens.
        tokio::spawn(async move {
            let mut tx = Some(tx);
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(sender) = tx.take() {
                    match serde_json::from_str::<Value>(&line) {
                        Ok(event) if event["message"] == "listening" => {
                            let _ = sender.send(event["addr"].as_str().map(str::to_owned));
                        }
                        _ => tx = Some(sender),
                    }
                }
                if let Ok(mut kept) = kept.lock() {
                    if kept.len() == 40 {
                        kept.pop_front();
                    }
                    kept.push_back(line);
                }
            }
        });
        let addr = tokio::time::timeout(Duration::from_secs(120), rx).await;
        let server = Self {
            child,
            base: String::new(),
            home,
            database,
            log,
        };
        match addr {
            Ok(Ok(Some(addr))) => {
                let mut server = server;
                server.base = format!("http://{addr}");
                Ok(server)
            }
            _ => anyhow::bail!(
                "capstan serve did not report listening; its log:\n{}",
                server.log_tail()
            ),
        }
    }

    fn log_tail(&self) -> String {
        self.log
            .lock()
            .map(|l| l.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    }

    /// Runs a CLI command against the server's database; its stdout.
    async fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Self::command(self.home.path(), &self.database)?
            .args(args)
            .output()
            .await?;
        anyhow::ensure!(
            out.status.success(),
            "capstan {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    }

    /// Grants `permissions` to `principal` and mints its key.
    pub(crate) async fn key_for(
        &self,
        principal: &str,
        permissions: &[&str],
    ) -> anyhow::Result<String> {
        for p in permissions {
            self.cli(&["principals", "grant", principal, p]).await?;
        }
        Ok(self
            .cli(&["api-keys", "mint", "--principal", principal])
            .await?
            .trim()
            .to_owned())
    }

    pub(crate) fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.child.id())
    }

    /// Resident memory of the server process (`VmRSS` of `/proc/<pid>/status`), bytes.
    pub(crate) fn rss_bytes(&self) -> anyhow::Result<u64> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| anyhow::anyhow!("the server has exited"))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .ok_or_else(|| anyhow::anyhow!("no VmRSS in /proc/{pid}/status"))
    }

    /// Kills the server (SIGKILL) and waits until it is gone.
    pub(crate) async fn kill(mut self) -> anyhow::Result<()> {
        self.kill_descendants();
        self.child.kill().await?;
        Ok(())
    }

    /// Kills the processes the child started. A `CAPSTAN_BENCH_SERVER` wrapper that runs the
    /// server under a tool (`strace`, `perf record`) instead of `exec`ing it is the child, and
    /// killing only the wrapper leaves the server running: idle, it still takes CPU from every
    /// row measured after it.
    fn kill_descendants(&self) {
        if let Some(pid) = self.child.id() {
            kill_descendants(pid);
        }
    }
}

impl Drop for Server {
    /// `kill_on_drop` kills the child; this, what it started (a row that fails half-way drops
    /// its servers without [`Server::kill`]).
    fn drop(&mut self) {
        self.kill_descendants();
    }
}

/// Sends `SIGKILL` to every process descended from `pid`.
fn kill_descendants(pid: u32) {
    for pid in descendants(pid) {
        if let Some(pid) = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// The processes descended from `pid`, from each task's `children` in `/proc` (Linux): every
/// generation, parents before their children.
fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut parents = vec![pid];
    while let Some(parent) = parents.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
                continue;
            };
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                found.push(child);
                parents.push(child);
            }
        }
    }
    found
}

pub(crate) fn http_client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder().no_proxy().build()?)
}

/// Triggers `hello` with this idempotency key; the execution id.
pub(crate) async fn trigger(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    idempotency: &str,
) -> anyhow::Result<String> {
    let response = client
        .post(format!("{base}/v1/workflows/hello"))
        .bearer_auth(key)
        .header("Idempotency-Key", idempotency)
        .json(&json!({"name": "bench"}))
        .send()
        .await?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    anyhow::ensure!(
        status == reqwest::StatusCode::ACCEPTED,
        "trigger answered {status}: {body}"
    );
    body["executionId"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("no executionId in {body}"))
}

/// Triggers `n` executions, `concurrency` at a time; their ids.
async fn trigger_many(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    prefix: &str,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<Vec<String>> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, base, key, prefix, next) = (
            client.clone(),
            base.to_owned(),
            key.to_owned(),
            prefix.to_owned(),
            next.clone(),
        );
        tasks.spawn(async move {
            let mut ids = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= n {
                    return Ok::<_, anyhow::Error>(ids);
                }
                ids.push(trigger(&client, &base, &key, &format!("{prefix}-{i}")).await?);
            }
        });
    }
    let mut ids = Vec::with_capacity(n);
    while let Some(joined) = tasks.join_next().await {
        ids.extend(joined??);
    }
    Ok(ids)
}

/// Waits until the execution succeeded (bounded by `deadline`); its events.
pub(crate) async fn events_when_done(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    id: &str,
    deadline: Instant,
) -> anyhow::Result<Vec<Value>> {
    loop {
        let e: Value = client
            .get(format!("{base}/v1/executions/{id}"))
            .bearer_auth(key)
            .send()
            .await?
            .json()
            .await?;
        match e["status"].as_str() {
            Some("succeeded") => break,
            Some("failed" | "paused" | "canceled") => {
                anyhow::bail!("execution {id} ended {}", e["status"])
            }
            _ if Instant::now() > deadline => anyhow::bail!("execution {id} never finished: {e}"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let events: Value = client
        .get(format!("{base}/v1/executions/{id}/events"))
        .bearer_auth(key)
        .send()
        .await?
        .json()
        .await?;
    events["events"]
        .as_array()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no events of {id}: {events}"))
}

/// The latest `occurredAt` of these executions' events, Unix µs, and how many events they have.
async fn last_commit(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    ids: &[String],
    deadline: Instant,
) -> anyhow::Result<(i64, usize)> {
    let (mut last, mut count) = (0i64, 0usize);
    for id in ids {
        let events = events_when_done(client, base, key, id, deadline).await?;
        count += events.len();
        for e in &events {
            last = last.max(e["occurredAt"].as_str().and_then(occurred_us).unwrap_or(0));
        }
    }
    Ok((last, count))
}

/// What one SSE client saw.
struct ClientSeen {
    events: u64,
    /// occurredAt → read, µs.
    latencies: Vec<i64>,
    last_read_us: i64,
}

/// One SSE client: reads until it has `expected` events (or the deadline), checking cursors
/// increase.
async fn sse_client(
    mut response: reqwest::Response,
    expected: u64,
    deadline: tokio::time::Instant,
) -> anyhow::Result<ClientSeen> {
    #[derive(serde::Deserialize)]
    struct Data {
        #[serde(rename = "occurredAt")]
        occurred_at: String,
    }
    let mut seen = ClientSeen {
        events: 0,
        latencies: Vec::with_capacity(expected as usize),
        last_read_us: 0,
    };
    let mut buffer: Vec<u8> = Vec::new();
    let mut last_id = -1i64;
    while seen.events < expected {
        let chunk = tokio::select! {
            chunk = response.chunk() => chunk?,
            () = tokio::time::sleep_until(deadline) => break,
        };
        let Some(chunk) = chunk else {
            anyhow::bail!("the stream ended after {} events", seen.events);
        };
        let read = now_us();
        buffer.extend_from_slice(&chunk);
        // Complete messages end with a blank line.
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let message: Vec<u8> = buffer.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&message);
            let (mut id, mut data) = (None, None);
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse::<i64>().ok();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data = Some(v.trim_start().to_owned());
                } else if line.starts_with("event: resync") {
                    anyhow::bail!("unexpected resync: {text}");
                }
            }
            if let (Some(id), Some(data)) = (id, data) {
                anyhow::ensure!(id > last_id, "cursor {id} after {last_id}");
                last_id = id;
                let parsed: Data = serde_json::from_str(&data)?;
                let at = occurred_us(&parsed.occurred_at)
                    .ok_or_else(|| anyhow::anyhow!("bad occurredAt {}", parsed.occurred_at))?;
                seen.events += 1;
                seen.latencies.push(read - at);
                seen.last_read_us = read;
            }
        }
    }
    Ok(seen)
}

async fn sse_fanout(hello: &Path, sizes: Sizes, clients: usize) -> anyhow::Result<SseFanout> {
    // This process holds one socket per client, and so does the server (which inherits the limit).
    ensure_open_files(clients as u64 + 256)?;
    let server = Server::start(
        hello,
        &format!(
            // Every client is one principal's (the bench's key): its share is the node's.
            "workers = 4\nstream_connections = {0}\nstream_connections_per_principal = {0}\n[rate_limit]\nrequests_per_second = 0.0\nburst = 1\n",
            clients + 8
        ),
    )
    .await?;
    let key = server.key_for("bench", &["workflows:hello"]).await?;
    let http = http_client()?;
    let base = server.base.clone();
    let started = Instant::now();
    let deadline = started + sizes.deadline;

    // One execution first: how many events each publishes (and a warm server).
    let warm = trigger(&http, &base, &key, "warm-up").await?;
    let per_execution = events_when_done(&http, &base, &key, &warm, deadline)
        .await?
        .len();
    let expected = (per_execution * sizes.sse_executions) as u64;

    // Every client connected (its cursor fixed at "now") before the first trigger.
    let connecting = Instant::now();
    let mut connects = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (http, url, key) = (
            http.clone(),
            format!("{base}/v1/streams/events"),
            key.clone(),
        );
        connects.spawn(async move {
            let response = http
                .get(url)
                .bearer_auth(key)
                .header(reqwest::header::ACCEPT, "text/event-stream")
                .send()
                .await?;
            anyhow::ensure!(
                response.status() == reqwest::StatusCode::OK,
                "stream answered {}",
                response.status()
            );
            Ok(response)
        });
    }
    let mut responses = Vec::with_capacity(clients);
    while let Some(joined) = connects.join_next().await {
        responses.push(joined??);
    }
    let connect_all = connecting.elapsed();
    let read_deadline = tokio::time::Instant::from_std(deadline);
    let mut readers = tokio::task::JoinSet::new();
    for response in responses {
        readers.spawn(sse_client(response, expected, read_deadline));
    }

    let (server_cpu, own_cpu) = (server.cpu_seconds(), cpu_seconds(None));
    let first_trigger = now_us();
    let ids = trigger_many(&http, &base, &key, "sse", sizes.sse_executions, 4).await?;
    let mut seen = Vec::with_capacity(clients);
    while let Some(joined) = readers.join_next().await {
        seen.push(joined??);
    }
    let last_read = seen.iter().map(|s| s.last_read_us).max().unwrap_or(0);
    let elapsed_us = (last_read - first_trigger).max(1);
    let (server_cpu, own_cpu) = (
        server.cpu_seconds() - server_cpu,
        cpu_seconds(None) - own_cpu,
    );
    let (last_commit, committed) = last_commit(&http, &base, &key, &ids, deadline).await?;
    anyhow::ensure!(
        committed as u64 == expected,
        "the executions published {committed} events, not {expected}"
    );
    let short: Vec<u64> = seen
        .iter()
        .filter(|s| s.events != expected)
        .map(|s| s.events)
        .collect();
    anyhow::ensure!(
        short.is_empty(),
        "{} of {clients} clients did not get all {expected} events (got e.g. {:?}); server log:\n{}",
        short.len(),
        &short[..short.len().min(5)],
        server.log_tail()
    );
    let delivered: u64 = seen.iter().map(|s| s.events).sum();
    let mut latencies: Vec<i64> = seen.into_iter().flat_map(|s| s.latencies).collect();
    latencies.sort_unstable();
    Ok(SseFanout {
        clients,
        executions: sizes.sse_executions,
        events_per_execution: per_execution,
        events_delivered: delivered,
        elapsed_ms: elapsed_us as f64 / 1e3,
        events_delivered_per_second: delivered as f64 / (elapsed_us as f64 / 1e6),
        events_committed_per_second: expected as f64
            / ((last_commit - first_trigger).max(1) as f64 / 1e6),
        latency_p50_ms: pct_ms(&latencies, 0.50),
        latency_p99_ms: pct_ms(&latencies, 0.99),
        latency_max_ms: pct_ms(&latencies, 1.0),
        connect_all_ms: connect_all.as_secs_f64() * 1e3,
        server_cpu_s: server_cpu,
        bench_process_cpu_s: own_cpu,
    })
}

/// The webhook secret of the bench's subscriptions.
const SECRET: &str = "whsec_YmVuY2gtd2ViaG9vay1zZWNyZXQtMDEyMzQ1Njc4OQ==";

/// What the receiver has seen.
#[derive(Default)]
struct Received {
    /// When each distinct (subscription, webhook-id) arrived, Unix µs.
    distinct: HashMap<(String, String), i64>,
    requests: u64,
    bad_signatures: u64,
    /// occurredAt → received, µs, of each distinct delivery.
    latencies: Vec<i64>,
    last_us: i64,
}

type Shared = Arc<(Mutex<Received>, tokio::sync::Notify)>;

async fn receive(
    axum::extract::State(shared): axum::extract::State<Shared>,
    axum::extract::Path(subscription): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
    body: String,
) -> axum::http::StatusCode {
    let at = now_us();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (id, timestamp, signatures) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    );
    let expected = capstan_api::webhooks::delivery::sign(
        SECRET,
        &id,
        timestamp.parse().unwrap_or_default(),
        &body,
    );
    let signed = signatures.split(' ').any(|s| s == expected);
    let occurred = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["occurredAt"].as_str().and_then(occurred_us));
    let (lock, notify) = &*shared;
    if let Ok(mut r) = lock.lock() {
        r.requests += 1;
        if !signed {
            r.bad_signatures += 1;
        } else if r.distinct.insert((subscription, id), at).is_none() {
            if let Some(occurred) = occurred {
                r.latencies.push(at - occurred);
            }
            r.last_us = at;
        }
    }
    notify.notify_waiters();
    axum::http::StatusCode::NO_CONTENT
}

/// A throwaway CA and a certificate for 127.0.0.1 and localhost signed by it (EC P-256), made
/// with the `openssl` CLI as the e2e tests do: `(ca.pem, server.pem, server.key)`.
async fn test_certificates(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf, PathBuf)> {
    let run = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new("openssl");
        cmd.args(args).current_dir(dir);
        async move {
            let out = cmd.output().await.map_err(|e| {
                anyhow::anyhow!("the webhook bench needs the openssl CLI for its test CA: {e}")
            })?;
            anyhow::ensure!(
                out.status.success(),
                "openssl failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(())
        }
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &[
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=Capstan bench CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    ]
    .concat())
    .await?;
    run(&[
        &["req"][..],
        &ec,
        &[
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    ]
    .concat())
    .await?;
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
    )?;
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        "server.pem",
        "-extfile",
        "server.ext",
    ])
    .await?;
    Ok((
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    ))
}

/// Times `n` serial POSTs to `url` the way the dispatcher sends a delivery (a pinned client built
/// for each, trusting `ca`, no connection reuse): p50 of (client build, request), ms.
async fn probe_sends(url: &str, ca: &Path, n: usize) -> anyhow::Result<(f64, f64)> {
    use capstan_api::webhooks::safety;
    let policy = safety::UrlPolicy {
        allow_loopback: true,
        allow_http: false,
    };
    let pem = std::fs::read(ca)?;
    let url = safety::parse_callback(url, policy)?;
    let body = json!({"eventId": "probe", "payloadJson": {"status": "running", "stage": "greet"}})
        .to_string();
    let (mut builds, mut requests) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t = Instant::now();
        let addr = *safety::resolve_vetted(&url, policy)
            .await?
            .first()
            .ok_or_else(|| anyhow::anyhow!("no address"))?;
        let client = safety::pinned_client(&url, addr, Duration::from_secs(10), Some(&pem))?;
        let built = t.elapsed();
        let response = client
            .post(url.clone())
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await?;
        anyhow::ensure!(
            response.status().is_success(),
            "probe got {}",
            response.status()
        );
        requests.push((t.elapsed() - built).as_micros() as i64);
        builds.push(built.as_micros() as i64);
    }
    builds.sort_unstable();
    requests.sort_unstable();
    Ok((pct_ms(&builds, 0.5), pct_ms(&requests, 0.5)))
}

async fn webhooks(hello: &Path, sizes: Sizes, subscriptions: usize) -> anyhow::Result<WebhookRun> {
    let tls_dir = tempfile::tempdir()?;
    let (ca, cert, cert_key) = test_certificates(tls_dir.path()).await?;
    let shared: Shared = Arc::new((Mutex::new(Received::default()), tokio::sync::Notify::new()));
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = tcp.local_addr()?.port();
    let tls = capstan_server::tls::server_config(&cert, &cert_key)?;
    let router = axum::Router::new()
        .route("/hook/{subscription}", axum::routing::post(receive))
        .route(
            "/probe",
            axum::routing::post(|| async { axum::http::StatusCode::NO_CONTENT }),
        )
        .with_state(shared.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // The receiver sets TCP_NODELAY (as `listen::serve` does, and as receivers usually do: Go,
    // nginx, Node): without it the 204 waits behind the unacknowledged TLS session tickets for
    // the peer's delayed ACK (~40 ms), and the bench would measure that instead of Capstan.
    let receiver = tokio::spawn(capstan_server::listen::serve(
        tcp,
        Some(tls),
        router,
        capstan_server::listen::ConnectionLimits::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    let (probe_build, probe_request) =
        probe_sends(&format!("https://127.0.0.1:{port}/probe"), &ca, 50).await?;

    let server = Server::start(
        hello,
        &format!(
            "workers = 4\n[rate_limit]\nrequests_per_second = 0.0\nburst = 1\n[webhooks]\nallow_loopback = true\nextra_root_ca = {:?}\nretry_schedule_ms = [1000, 1000, 1000]\ntimeout_ms = 10000\n",
            ca.display().to_string()
        ),
    )
    .await?;
    let key = server
        .key_for("bench", &["workflows:hello", "subscriptions:manage"])
        .await?;
    let http = http_client()?;
    let base = server.base.clone();
    let deadline = Instant::now() + sizes.deadline;

    // One execution first: the event types hello publishes, each subscribed to.
    let warm = trigger(&http, &base, &key, "warm-up").await?;
    let warm_events = events_when_done(&http, &base, &key, &warm, deadline).await?;
    let per_execution = warm_events.len();
    let mut names: Vec<String> = warm_events
        .iter()
        .filter_map(|e| {
            Some(format!(
                "{}.v{}",
                e["eventType"].as_str()?,
                e["eventVersion"].as_str()?
            ))
        })
        .collect();
    names.sort();
    names.dedup();
    let mut subscription_ids = Vec::with_capacity(subscriptions);
    for i in 0..subscriptions {
        let response = http
            .post(format!("{base}/v1/subscriptions"))
            .bearer_auth(&key)
            .json(&json!({"events": names, "secret": SECRET, "url": format!("https://127.0.0.1:{port}/hook/{i}")}))
            .send()
            .await?;
        anyhow::ensure!(
            response.status() == reqwest::StatusCode::CREATED,
            "subscription answered {}: {}",
            response.status(),
            response.text().await.unwrap_or_default()
        );
        let created: Value = response.json().await?;
        subscription_ids.push(
            created["subscription"]["id"]
                .as_str()
                .ok_or_else(|| anyhow::anyhow!("no subscription id in {created}"))?
                .to_owned(),
        );
    }

    let expected = (subscriptions * sizes.webhook_executions * per_execution) as u64;
    let (server_cpu, own_cpu) = (server.cpu_seconds(), cpu_seconds(None));
    let first_trigger = now_us();
    let ids = trigger_many(&http, &base, &key, "webhook", sizes.webhook_executions, 4).await?;
    let (lock, notify) = &*shared;
    loop {
        let waiting = notify.notified();
        let done = lock.lock().map(|r| r.distinct.len() as u64 >= expected);
        if done.unwrap_or(true) || Instant::now() > deadline {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), waiting).await;
    }
    let (server_cpu, own_cpu) = (
        server.cpu_seconds() - server_cpu,
        cpu_seconds(None) - own_cpu,
    );
    let (last_commit, committed) = last_commit(&http, &base, &key, &ids, deadline).await?;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), receiver).await;
    let mut r = std::mem::take(
        &mut *lock
            .lock()
            .map_err(|_| anyhow::anyhow!("receiver state poisoned"))?,
    );
    anyhow::ensure!(
        (committed * subscriptions) as u64 == expected,
        "the executions published {committed} events, not {}",
        expected / subscriptions as u64
    );
    anyhow::ensure!(
        r.distinct.len() as u64 == expected && r.bad_signatures == 0,
        "received {} of {expected} deliveries ({} with a bad signature); server log:\n{}",
        r.distinct.len(),
        r.bad_signatures,
        server.log_tail()
    );
    let elapsed_us = (r.last_us - first_trigger).max(1);
    r.latencies.sort_unstable();
    // The first subscription's attempts as the server recorded them, against their arrivals.
    let first = subscription_ids.first().cloned().unwrap_or_default();
    let listed: Value = http
        .get(format!(
            "{base}/v1/subscriptions/{first}/deliveries?limit=100"
        ))
        .bearer_auth(&key)
        .send()
        .await?
        .json()
        .await?;
    let mut attempts: Vec<(i64, i64)> = listed["deliveries"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|d| {
            let dispatched = d["dispatchedAt"].as_str().and_then(occurred_us)?;
            let arrived = r
                .distinct
                .get(&("0".to_owned(), d["eventId"].as_str()?.to_owned()))?;
            Some((dispatched, *arrived))
        })
        .collect();
    attempts.sort_unstable();
    let mut in_attempt: Vec<i64> = attempts.iter().map(|(d, a)| a - d).collect();
    let mut intervals: Vec<i64> = attempts.windows(2).map(|w| w[1].0 - w[0].0).collect();
    in_attempt.sort_unstable();
    intervals.sort_unstable();
    Ok(WebhookRun {
        subscriptions,
        executions: sizes.webhook_executions,
        events_per_execution: per_execution,
        deliveries: expected,
        duplicate_requests: r.requests.saturating_sub(expected),
        bad_signatures: r.bad_signatures,
        elapsed_ms: elapsed_us as f64 / 1e3,
        deliveries_per_second: expected as f64 / (elapsed_us as f64 / 1e6),
        engine_done_ms: (last_commit - first_trigger) as f64 / 1e3,
        latency_p50_ms: pct_ms(&r.latencies, 0.50),
        latency_p99_ms: pct_ms(&r.latencies, 0.99),
        server_cpu_s: server_cpu,
        bench_process_cpu_s: own_cpu,
        probe_client_build_p50_ms: probe_build,
        probe_request_p50_ms: probe_request,
        dispatch_to_received_p50_ms: pct_ms(&in_attempt, 0.5),
        dispatch_interval_p50_ms: pct_ms(&intervals, 0.5),
    })
}

/// Runs both parts with the `hello` component of `workflows`, prints their lines and returns
/// the figures.
pub async fn run(workflows: &Path, quick: bool) -> anyhow::Result<FanoutResults> {
    let hello = workflows.join("hello.wasm");
    anyhow::ensure!(
        hello.is_file(),
        "{} is missing: run `just build-guests`",
        hello.display()
    );
    let sizes = Sizes::of(quick);
    let mut hooks = Vec::new();
    for &subscriptions in sizes.webhook_subscriptions {
        let w = webhooks(&hello, sizes, subscriptions).await?;
        println!(
            "webhooks  {} subscription(s) × {} executions × {} events: {} deliveries in {:.2} s = {:.0} deliveries/s (engine done at {:.2} s), occurredAt→received p50 {:.1} ms, p99 {:.1} ms, {} duplicate requests; CPU: server {:.1} s, bench {:.1} s; one send as the dispatcher does it: client build p50 {:.2} ms + request p50 {:.2} ms; server's attempts (first subscription): start→received p50 {:.1} ms, start→next start p50 {:.1} ms",
            w.subscriptions,
            w.executions,
            w.events_per_execution,
            w.deliveries,
            w.elapsed_ms / 1e3,
            w.deliveries_per_second,
            w.engine_done_ms / 1e3,
            w.latency_p50_ms,
            w.latency_p99_ms,
            w.duplicate_requests,
            w.server_cpu_s,
            w.bench_process_cpu_s,
            w.probe_client_build_p50_ms,
            w.probe_request_p50_ms,
            w.dispatch_to_received_p50_ms,
            w.dispatch_interval_p50_ms
        );
        hooks.push(w);
    }
    let mut streams = Vec::new();
    for &clients in sizes.sse_clients {
        let sse = sse_fanout(&hello, sizes, clients).await?;
        println!(
            "sse       {} clients × {} executions × {} events: {} events delivered in {:.2} s = {:.0} events/s (engine committed {:.0} events/s), occurredAt→client p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; connect all {:.0} ms; CPU: server {:.1} s, bench {:.1} s",
            sse.clients,
            sse.executions,
            sse.events_per_execution,
            sse.events_delivered,
            sse.elapsed_ms / 1e3,
            sse.events_delivered_per_second,
            sse.events_committed_per_second,
            sse.latency_p50_ms,
            sse.latency_p99_ms,
            sse.latency_max_ms,
            sse.connect_all_ms,
            sse.server_cpu_s,
            sse.bench_process_cpu_s
        );
        streams.push(sse);
    }
    Ok(FanoutResults {
        sse: streams,
        webhooks: hooks,
    })
}

#[cfg(test)]
mod tests {
    use super::{descendants, kill_descendants};
    use tokio::io::AsyncBufReadExt;

    /// A wrapper that starts its program without `exec`ing it: what the wrapper started is
    /// found among its descendants and killed with them, while the wrapper itself is left to
    /// `kill_on_drop`.
    #[tokio::test]
    async fn what_a_wrapper_started_is_killed_with_its_descendants() {
        let mut wrapper = tokio::process::Command::new("sh")
            .args(["-c", "sleep 600 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut line = String::new();
        tokio::io::BufReader::new(wrapper.stdout.take().unwrap())
            .read_line(&mut line)
            .await
            .unwrap();
        let started: u32 = line.trim().parse().unwrap();
        let wrapper_pid = wrapper.id().unwrap();
        assert_eq!(descendants(wrapper_pid), vec![started]);

        kill_descendants(wrapper_pid);
        // The wrapper's `wait` returns once its program is killed, and the wrapper exits.
        let status = tokio::time::timeout(std::time::Duration::from_secs(10), wrapper.wait())
            .await
            .expect("the wrapper should end once its program is killed")
            .unwrap();
        assert!(status.success(), "{status}");
        assert!(!std::path::Path::new(&format!("/proc/{started}")).exists());
    }
}
