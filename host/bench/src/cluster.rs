//! `capstan bench --only cluster`: throughput of 1, 2 and 3 `capstan serve` nodes sharing one
//! PostgreSQL database, next to one node on SQLite.
//!
//! Each configuration gets a fresh database (SQLite file, or a new schema on
//! `CAPSTAN_BENCH_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/test?sslmode=disable`), the
//! ten-stage `fixture-steps` component on the simulated cloud at zero latency, and `N` executions
//! triggered over HTTP by 32 clients, spread round-robin over the nodes. Two ways of waiting:
//! `none`, each client triggers the next as soon as the last is accepted (a backlog the nodes
//! work through, competing for claims), and `long-poll`, each client awaits its execution at the
//! node it triggered it on (`GET /v1/executions/{id}?wait=25s`) before the next, as users wait;
//! the execution runs on whichever node claims it, so most of a waiter's wake-ups come from
//! another node's `NOTIFY`. An untimed warm-up round of 32 executions per node comes first; the
//! figure is completed executions per second from the first timed trigger until the last execution
//! is terminal (read from the database), and the server CPU is the nodes' over that span.
//! PostgreSQL rows are skipped, with a note, when it cannot be reached.

use crate::fanout::{Server, http_client};
use serde::Serialize;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Serialize)]
pub struct ClusterRun {
    pub backend: &'static str,
    pub nodes: usize,
    /// `none` or `long-poll` (the module's documentation).
    pub waiting: &'static str,
    pub executions: usize,
    pub concurrency: usize,
    pub elapsed_ms: f64,
    pub executions_per_second: f64,
    /// Server CPU seconds over the timed round, summed over the nodes.
    pub server_cpu_s: f64,
}

const CONFIG: &str = "workers = 8\n[rate_limit]\nrequests_per_second = 0.0\nburst = 1\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[simulator]\ndns_propagation_ms = 0\n";
const CONCURRENCY: usize = 32;
const STAGES: usize = 10;

/// The PostgreSQL server the bench uses: `CAPSTAN_BENCH_POSTGRES_URL`, or the local test server
/// without TLS, as docs/operating.md advises for a server on the same machine (the engine
/// section's `postgres-tls` row prices TLS on this link: [`with_tls`]).
pub(crate) fn postgres_server() -> String {
    std::env::var("CAPSTAN_BENCH_POSTGRES_URL")
        .unwrap_or_else(|_| format!("{}?sslmode=disable", capstan_testdb::DEFAULT_POSTGRES_URL))
}

/// `url` with `sslmode=require` in place of any `sslmode` it has.
pub(crate) fn with_tls(url: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut pairs: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("sslmode="))
        .collect();
    pairs.push("sslmode=require");
    format!("{base}?{}", pairs.join("&"))
}

/// A fresh schema on the bench's PostgreSQL server for one row, dropped once the row is
/// measured ([`BenchSchema::remove`]): rows left behind would grow the database by gigabytes
/// per run, and autovacuum working through an earlier row's tables takes CPU from the next row.
/// A row that fails keeps its schema to look at; `just test-postgres` drops those.
pub(crate) struct BenchSchema {
    /// The URL that selects the schema.
    pub(crate) url: String,
    base: String,
    name: String,
}

impl BenchSchema {
    /// A new schema on `base` (a URL of [`postgres_server`]).
    pub(crate) async fn create(base: String) -> anyhow::Result<Self> {
        let name = format!(
            "capstan_bench_{}",
            capstan_core::ids::new_id().replace('-', "")
        );
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&base).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}")))
            .execute(&mut conn)
            .await?;
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options[search_path]={name}");
        Ok(Self { url, base, name })
    }

    /// Drops the schema and everything in it; call once the servers using it have stopped.
    pub(crate) async fn remove(self) -> anyhow::Result<()> {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&self.base).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA {} CASCADE",
            self.name
        )))
        .execute(&mut conn)
        .await?;
        Ok(())
    }
}

/// Waits until `n` executions match `condition` (SQL over `executions`), polling the database.
pub(crate) async fn until_executions(
    store: &capstan_store::Store,
    condition: &str,
    n: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let sql = format!("SELECT COUNT(*) FROM executions WHERE {condition}");
    loop {
        let (count,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .fetch_one(store.pool())
            .await?;
        if usize::try_from(count).unwrap_or(0) >= n {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {count}/{n} executions with {condition} after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn one(
    fixture: &Path,
    backend: &'static str,
    nodes: usize,
    await_each: bool,
    executions: usize,
) -> anyhow::Result<ClusterRun> {
    let home = Arc::new(Server::home(&[fixture], CONFIG)?);
    let schema = match backend {
        "sqlite" => None,
        _ => Some(BenchSchema::create(postgres_server()).await?),
    };
    let database = match &schema {
        None => format!("sqlite://{}/capstan.db", home.path().display()),
        Some(schema) => schema.url.clone(),
    };
    // `capstan migrate` first, so the nodes do not race to create the schema.
    let store = capstan_store::Store::open(&database).await?;
    capstan_booking::migrate(&store).await?;
    let mut servers = Vec::new();
    for _ in 0..nodes {
        servers.push(Server::start_node(home.clone(), database.clone()).await?);
    }
    let key = servers[0]
        .key_for("bench", &["workflows:fixture-steps"])
        .await?;
    let bases: Arc<Vec<String>> = Arc::new(servers.iter().map(|s| s.base.clone()).collect());
    let client = http_client()?;
    let terminal = "status IN ('succeeded', 'failed', 'canceled', 'paused')";
    // A warm-up round first, untimed: every node opens its database connections and fills its
    // instance pool before the clock starts, so a row measures a running cluster, not how fast
    // each node warms up (which a short row would charge twice to two nodes).
    let warm_up = CONCURRENCY * nodes;
    drive(&client, &bases, &key, 0..warm_up, false).await?;
    until_executions(&store, terminal, warm_up, Duration::from_secs(600)).await?;
    let cpu_before: f64 = servers.iter().map(Server::cpu_seconds).sum();
    let started = Instant::now();
    drive(
        &client,
        &bases,
        &key,
        warm_up..warm_up + executions,
        await_each,
    )
    .await?;
    until_executions(
        &store,
        terminal,
        warm_up + executions,
        Duration::from_secs(600),
    )
    .await?;
    let elapsed = started.elapsed();
    let (succeeded,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM executions WHERE status = 'succeeded'")
            .fetch_one(store.pool())
            .await?;
    anyhow::ensure!(
        usize::try_from(succeeded).unwrap_or(0) == warm_up + executions,
        "only {succeeded}/{} succeeded",
        warm_up + executions
    );
    let server_cpu_s = servers.iter().map(Server::cpu_seconds).sum::<f64>() - cpu_before;
    for server in servers {
        server.kill().await?;
    }
    store.pool().close().await;
    if let Some(schema) = schema {
        schema.remove().await?;
    }
    Ok(ClusterRun {
        backend,
        nodes,
        waiting: if await_each { "long-poll" } else { "none" },
        executions,
        concurrency: CONCURRENCY,
        elapsed_ms: elapsed.as_secs_f64() * 1e3,
        executions_per_second: executions as f64 / elapsed.as_secs_f64(),
        server_cpu_s,
    })
}

/// Triggers the executions numbered `range` from [`CONCURRENCY`] clients, spread round-robin over
/// `bases`; with `await_each`, each client awaits its execution at the node it triggered it on
/// before the next.
async fn drive(
    client: &reqwest::Client,
    bases: &Arc<Vec<String>>,
    key: &str,
    range: std::ops::Range<usize>,
    await_each: bool,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(range.start));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (client, bases, key, next) =
            (client.clone(), bases.clone(), key.to_owned(), next.clone());
        let end = range.end;
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return Ok::<_, anyhow::Error>(());
                }
                let base = &bases[i % bases.len()];
                let r = client
                    .post(format!("{base}/v1/workflows/fixture-steps"))
                    .bearer_auth(&key)
                    .header("Idempotency-Key", format!("cluster-{i}"))
                    // Each execution its own record sets, as executions for different domains have:
                    // one record set's changes wait for each other (on PostgreSQL, for its lock).
                    .json(&json!({"zone": "ZEXAMPLE-COM", "domain": format!("e{i}.example.com"), "stages": STAGES}))
                    .send()
                    .await?;
                let status = r.status();
                let body = r.json::<Value>().await.unwrap_or(Value::Null);
                anyhow::ensure!(
                    status == reqwest::StatusCode::ACCEPTED,
                    "trigger answered {status}: {body}"
                );
                if await_each {
                    let id = body["executionId"]
                        .as_str()
                        .ok_or_else(|| anyhow::anyhow!("no executionId in {body}"))?;
                    let (kind, _) = crate::engine::long_poll(&client, base, &key, id).await?;
                    anyhow::ensure!(kind == "ExecutionSucceeded", "execution {id}: {kind}");
                }
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined??;
    }
    Ok(())
}

/// SQLite with one node, then PostgreSQL with 1, 2 and 3 nodes; each without waiting, then
/// awaiting each execution.
pub async fn run(
    fixture: &Path,
    quick: bool,
    executions: Option<usize>,
) -> anyhow::Result<Vec<ClusterRun>> {
    anyhow::ensure!(
        fixture.is_file(),
        "{} is missing: run `just build-guests`",
        fixture.display()
    );
    let executions = executions.unwrap_or(if quick { 60 } else { 1_000 });
    let mut runs = vec![one(fixture, "sqlite", 1, false, executions).await?];
    let server = postgres_server();
    if let Err(e) = <sqlx::PgConnection as sqlx::Connection>::connect(&server).await {
        println!("(skipping PostgreSQL cluster runs: {server}: {e})");
        return Ok(runs);
    }
    for await_each in [false, true] {
        for nodes in 1..=3 {
            runs.push(one(fixture, "postgres", nodes, await_each, executions).await?);
        }
    }
    for r in &runs {
        println!(
            "cluster   {:<8} {} node(s), waiting {:<9}: {} ten-stage executions over HTTP at concurrency {} in {:.2} s = {:.0} executions/s (server CPU {:.1} s)",
            r.backend,
            r.nodes,
            r.waiting,
            r.executions,
            r.concurrency,
            r.elapsed_ms / 1e3,
            r.executions_per_second,
            r.server_cpu_s
        );
    }
    Ok(runs)
}
