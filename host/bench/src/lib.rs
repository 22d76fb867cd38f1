//! `capstan-bench`: the measurements behind BENCHMARKS.md, a binary of its own so the `capstan`
//! server carries no benchmark code. Run on a release build (`just bench`).
//!
//! Sections ([`Section`]; `--only SECTION` runs one): the runtime (compile vs cached load of each
//! component in the workflows directory, instantiate + call of the hello workflow), the engine
//! (10-stage executions over HTTP on SQLite and PostgreSQL, `engine`, plus one in-process
//! run that splits the time between store, providers and wasmtime and measures replay), the API
//! (execution reads next to `/healthz`, `api`), booking creates (`booking`), fan-out
//! (SSE clients and webhook deliveries, `fanout`), memory and start-up (`memory`), and
//! the cluster (1, 2, 3 nodes on PostgreSQL next to 1 on SQLite, `cluster`). Every section
//! but the runtime, booking (the booking engine on its own SQLite file) and the in-process engine
//! run drives a spawned `capstan serve`. Results are
//! printed as a table, with the targets of BENCHMARKS.md checked against them ([`targets`]), and
//! written to `target/bench/results.json` (only the sections that ran; `--runs N` repeats them).
//!
//! A spawned server is the `capstan` binary next to this one (`target/release/capstan`), or the
//! build `CAPSTAN_BENCH_SERVER` names. `timing` splits an execution's time between the store and
//! the providers.

pub mod api;
pub mod booking;
pub mod cluster;
pub mod engine;
pub mod fanout;
pub mod memory;
pub mod targets;
mod timing;

use async_trait::async_trait;
use capstan_core::CapabilityGrants;
use capstan_runtime::{Answer, HostCalls, Interrupt, Outcome, Request, Runtime, RuntimeConfig};
use serde::Serialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Answers platform calls at once; the guest sees a fixed clock and no capabilities.
struct PlatformOnly;

#[async_trait]
impl HostCalls for PlatformOnly {
    async fn call(&mut self, op: &'static str, _request: Request) -> Result<Answer, Interrupt> {
        Ok(match op {
            "time.now" => json!(1_767_225_600_000u64),
            "context.cancellation-requested" => json!(false),
            _ => Value::Null,
        }
        .into())
    }
}

#[derive(Debug, Serialize)]
struct ComponentLoad {
    component: String,
    bytes: u64,
    compile_ms: f64,
    cached_load_ms: f64,
}

#[derive(Debug, Serialize)]
struct Latency {
    iterations: usize,
    median_us: f64,
    p99_us: f64,
    mean_us: f64,
}

#[derive(Debug, Serialize)]
struct EngineRun {
    concurrency: usize,
    executions: usize,
    elapsed_ms: f64,
    /// Time inside store calls (summed over workers) and how many write transactions.
    store_ms: f64,
    store_transactions: u64,
    /// Time inside provider calls (the simulated cloud: SQLite too).
    providers_ms: f64,
    /// With one worker: the rest of the elapsed time — wasmtime (instantiate + guest code) and
    /// the engine's own logic. Not meaningful with several workers (they overlap and idle).
    wasmtime_and_engine_ms: Option<f64>,
    /// With one worker: replaying one execution's whole 10-stage journal (reading its run and
    /// journal, instantiate + guest code + answering every call from the journal).
    replay_ten_stage_journal: Option<Latency>,
    /// The same replays without their store reads (the run record and the journal, which a live
    /// activation does not read): instantiate, guest code, the runtime's marshalling of each
    /// call and the replay host's answers from memory — wasmtime's part with the host glue
    /// counted in, so an upper bound on wasmtime alone.
    replay_activation: Option<Latency>,
    executions_per_second: f64,
    trigger_to_terminal: Latency,
}

/// The profile of the build being measured: `just bench --quick` runs the debug test build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Build {
    Debug,
    Release,
}

impl Build {
    const CURRENT: Self = if cfg!(debug_assertions) {
        Self::Debug
    } else {
        Self::Release
    };
}

#[derive(Debug, Serialize)]
struct Results {
    /// Whether this was a `--quick` smoke run (figures not comparable with full runs).
    quick: bool,
    /// The profile this harness was built with; the servers are the `capstan` beside it unless
    /// `CAPSTAN_BENCH_SERVER` says otherwise.
    build: Build,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    components: Vec<ComponentLoad>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hello_instantiate_and_call: Option<Latency>,
    /// Ten-stage executions over HTTP (`engine`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    engine: Vec<crate::engine::EngineHttpRun>,
    /// `GET /v1/executions/{id}` next to `GET /healthz` (`api`).
    #[serde(skip_serializing_if = "Option::is_none")]
    api: Option<crate::api::ApiResults>,
    /// Start-up and resident memory (`memory`).
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<crate::memory::MemoryResults>,
    /// Booking creates on contended slots (`booking`).
    #[serde(skip_serializing_if = "Option::is_none")]
    booking: Option<serde_json::Value>,
    /// One worker driven in-process: where an execution's time goes, and replay.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    engine_in_process: Vec<EngineRun>,
    /// SSE fan-out and webhook deliveries (`fanout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    fanout: Option<crate::fanout::FanoutResults>,
    /// 1, 2, 3 nodes on PostgreSQL next to 1 on SQLite (`cluster`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    cluster: Vec<crate::cluster::ClusterRun>,
}

/// A part of the bench, for `capstan bench --only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Section {
    /// Compile vs cached load of each component; instantiate + call of hello.
    Runtime,
    /// 10-stage executions over HTTP (SQLite and PostgreSQL, 32 in flight and 1), and one
    /// in-process run that splits the time and measures replay.
    Engine,
    /// `GET /v1/executions/{id}` next to `GET /healthz` at 64 connections.
    Api,
    /// Booking creates on contended slots.
    Booking,
    /// SSE fan-out and webhook deliveries against a spawned `capstan serve`.
    Fanout,
    /// Start-up (cold, warm) and resident memory idle and with executions waiting on approval.
    Memory,
    /// Ten-stage executions over HTTP: 1 node on SQLite; 1, 2 and 3 nodes on PostgreSQL.
    Cluster,
}

/// The `p` quantile (0–1, nearest rank) of sorted durations, in ms; 0 when there are none.
pub(crate) fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted
        .get(i.min(sorted.len().saturating_sub(1)))
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// A progress bar on stderr for a long run (drawn only when stderr is a terminal).
pub(crate) fn progress(len: u64, label: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{prefix:>32} [{bar:30}] {pos}/{len} {per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(label.to_owned());
    bar
}

/// Ten-stage executions on a fresh SQLite file with the simulated cloud at zero latency: the
/// engine is driven in-process (`concurrency` worker tasks), triggers go straight to the engine.
async fn engine_run(
    fixture: &Path,
    executions: usize,
    concurrency: usize,
) -> anyhow::Result<EngineRun> {
    use capstan_core::store::ExecutionReads;
    use capstan_core::{Clock, SystemClock};
    use capstan_engine::{Engine, EngineConfig, TriggerRequest};
    use std::sync::Arc;
    let dir = tempfile::tempdir()?;
    let store =
        capstan_store::Store::open(&format!("sqlite://{}/bench.db", dir.path().display())).await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let cloud = capstan_providers::SimulatedCloud::new(
        &store,
        clock.clone(),
        capstan_providers::SimulationSettings {
            dns_propagation_ms: 0,
            seed_zones: vec!["example.com".into()],
            ..capstan_providers::SimulationSettings::default()
        },
    )
    .await?;
    let runtime = Arc::new(Runtime::new(RuntimeConfig::default())?);
    let mut grants = CapabilityGrants::new();
    grants.insert(
        "fixture-steps".into(),
        [
            capstan_core::Capability::Dns,
            capstan_core::Capability::Convergence,
        ]
        .into_iter()
        .collect(),
    );
    let workflow = Arc::new(runtime.load_file(fixture, &grants).await?);
    let spent = Arc::new(crate::timing::Spent::default());
    let engine = Engine::new(
        Arc::new(crate::timing::TimedStore {
            inner: store.clone(),
            spent: spent.clone(),
        }),
        runtime,
        Arc::new(crate::timing::TimedProviders {
            inner: capstan_providers::ProviderSet::all(Arc::new(cloud)),
            spent: spent.clone(),
        }),
        clock,
        EngineConfig {
            workers: concurrency,
            ..EngineConfig::default()
        },
    );
    let workflow_for_replay = workflow.clone();
    engine.register(workflow);
    let mut ids = Vec::with_capacity(executions);
    let started = Instant::now();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let workers = engine.spawn_workers(stop_rx, None);
    let mut triggered_at = std::collections::HashMap::new();
    for _ in 0..executions {
        let t = engine
            .trigger(TriggerRequest {
                workflow: "fixture-steps".into(),
                principal_id: "bench".into(),
                input: json!({"zone": "ZEXAMPLE-COM", "stages": 10}),
                idempotency: None,
                traceparent: None,
            })
            .await?;
        triggered_at.insert(t.execution.id.clone(), t.execution.created_ms);
        ids.push(t.execution.id);
    }
    let mut latencies = Vec::with_capacity(executions);
    let mut pending: Vec<String> = ids.clone();
    while !pending.is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut still = Vec::new();
        for id in pending {
            let e = store
                .execution(&id)
                .await?
                .ok_or_else(|| anyhow::anyhow!("lost {id}"))?;
            match (
                e.status.is_terminal() || e.status == capstan_core::ExecutionStatus::Paused,
                e.finished_ms.or(Some(0)),
            ) {
                (true, Some(f)) => {
                    anyhow::ensure!(
                        e.status == capstan_core::ExecutionStatus::Succeeded,
                        "execution {id} ended {} ({:?})",
                        e.status,
                        e.status_reason
                    );
                    latencies.push(Duration::from_millis((f - triggered_at[&id]).max(0) as u64));
                }
                _ => still.push(id),
            }
        }
        pending = still;
    }
    let elapsed = started.elapsed();
    let _ = stop_tx.send(true);
    for w in workers {
        let _ = w.await;
    }
    // Replay cost: one finished execution's whole journal (10 stages) replayed against its
    // component by a replay-only host, as `capstan workflows check` does.
    let (mut replay, mut replay_activation) = (None, None);
    if concurrency == 1
        && let Some(id) = ids.first()
        && let Some(execution) = store.execution(id).await?
    {
        let (mut samples, mut activations) = (Vec::new(), Vec::new());
        for _ in 0..200 {
            // The workers have stopped, so every store call in the window is the replay's.
            let store_before = spent.store_ns.load(std::sync::atomic::Ordering::Relaxed);
            let t = Instant::now();
            let check = engine
                .check_execution(&workflow_for_replay, &execution)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no run for {id}"))?;
            let elapsed = t.elapsed();
            let in_store = Duration::from_nanos(
                spent.store_ns.load(std::sync::atomic::Ordering::Relaxed) - store_before,
            );
            samples.push(elapsed);
            activations.push(elapsed.saturating_sub(in_store));
            anyhow::ensure!(
                check.verdict == "compatible" && check.replayed == check.journal_length,
                "replay diverged: {check:?}"
            );
        }
        replay = Some(latency(samples));
        replay_activation = Some(latency(activations));
    }
    let ms = |ns: &std::sync::atomic::AtomicU64| {
        ns.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6
    };
    let elapsed_ms = elapsed.as_secs_f64() * 1e3;
    let (store_ms, providers_ms) = (ms(&spent.store_ns), ms(&spent.providers_ns));
    Ok(EngineRun {
        concurrency,
        executions,
        elapsed_ms,
        store_ms,
        store_transactions: spent
            .store_writes
            .load(std::sync::atomic::Ordering::Relaxed),
        providers_ms,
        // With one worker the three add up to the elapsed time: what is neither a store call nor
        // a provider call is wasmtime (instantiate + guest code) and the engine's own logic.
        replay_ten_stage_journal: replay,
        replay_activation,
        wasmtime_and_engine_ms: (concurrency == 1)
            .then(|| (elapsed_ms - store_ms - providers_ms).max(0.0)),
        executions_per_second: executions as f64 / elapsed.as_secs_f64(),
        trigger_to_terminal: latency(latencies),
    })
}

fn latency(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let n = samples.len().max(1);
    let total: Duration = samples.iter().sum();
    Latency {
        iterations: samples.len(),
        median_us: samples.get(n / 2).map_or(0.0, |d| us(*d)),
        p99_us: samples
            .get((n * 99 / 100).min(n - 1))
            .map_or(0.0, |d| us(*d)),
        mean_us: us(total) / n as f64,
    }
}

/// Runs the benchmarks on the components of `workflows`: every section, or only `only`, `runs`
/// times over. `backends` narrows the engine section's stores (all of them when empty). Each
/// run prints its table and its targets; several runs end with every target's figures side by
/// side. `target/bench/results.json` holds every run's results so far and the targets over them,
/// rewritten after each run, so a run that fails leaves the ones before it.
pub async fn run(
    workflows: &Path,
    quick: bool,
    only: Option<Section>,
    backends: &[String],
    executions: Option<usize>,
    runs: usize,
) -> anyhow::Result<()> {
    let runs = runs.max(1);
    let out = Path::new("target/bench");
    std::fs::create_dir_all(out)?;
    let mut all = Vec::with_capacity(runs);
    let mut checks = Vec::with_capacity(runs);
    for i in 1..=runs {
        if runs > 1 {
            println!("run {i} of {runs}");
        }
        let results = measure(workflows, quick, only, backends, executions).await?;
        print_table(&results);
        let checked = crate::targets::check(&results);
        if results.quick || results.build == Build::Debug {
            println!(
                "(a smoke run or a debug build: these figures do not tell whether the targets hold)"
            );
        }
        crate::targets::print(&crate::targets::summarise(std::slice::from_ref(&checked)));
        checks.push(checked);
        all.push(results);
        let targets = crate::targets::summarise(&checks);
        std::fs::write(
            out.join("results.json"),
            serde_json::to_string_pretty(&json!({"runs": all, "targets": targets}))?,
        )?;
        if i == runs && runs > 1 {
            println!("targets over {runs} runs");
            crate::targets::print(&targets);
        }
    }
    println!("wrote target/bench/results.json");
    Ok(())
}

/// One run of the sections asked for.
async fn measure(
    workflows: &Path,
    quick: bool,
    only: Option<Section>,
    backends: &[String],
    executions: Option<usize>,
) -> anyhow::Result<Results> {
    let runs = |section: Section| only.is_none_or(|o| o == section);
    let (components, hello) = if runs(Section::Runtime) {
        let (components, samples) = runtime(workflows, quick).await?;
        (components, Some(latency(samples)))
    } else {
        (Vec::new(), None)
    };
    let fixture = Path::new("target/guest-fixtures/fixture-steps.wasm");
    let (mut engine, mut engine_runs) = (Vec::new(), Vec::new());
    if runs(Section::Engine) {
        engine = crate::engine::run(fixture, quick, backends, executions).await?;
        engine_runs.push(engine_run(fixture, if quick { 25 } else { 300 }, 1).await?);
    }
    let api = if runs(Section::Api) {
        Some(crate::api::run(workflows, quick).await?)
    } else {
        None
    };
    let booking = if runs(Section::Booking) {
        Some(crate::booking::run(quick).await?)
    } else {
        None
    };
    let fanout = if runs(Section::Fanout) {
        Some(crate::fanout::run(workflows, quick).await?)
    } else {
        None
    };
    let memory = if runs(Section::Memory) {
        Some(crate::memory::run(fixture, quick).await?)
    } else {
        None
    };
    let cluster = if runs(Section::Cluster) {
        crate::cluster::run(fixture, quick, executions).await?
    } else {
        Vec::new()
    };
    Ok(Results {
        quick,
        build: Build::CURRENT,
        components,
        hello_instantiate_and_call: hello,
        engine,
        api,
        memory,
        engine_in_process: engine_runs,
        booking,
        fanout,
        cluster,
    })
}

/// Compile vs cached load of each component, and `iterations` instantiate + call of hello.
async fn runtime(
    workflows: &Path,
    quick: bool,
) -> anyhow::Result<(Vec<ComponentLoad>, Vec<Duration>)> {
    let iterations = if quick { 1_000 } else { 10_000 };
    let cache = tempfile::tempdir()?;
    let grants: CapabilityGrants = capstan_server::config::default_grants();
    let mut files: Vec<PathBuf> = std::fs::read_dir(workflows)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "wasm"))
        .collect();
    files.sort();
    anyhow::ensure!(
        !files.is_empty(),
        "no components in {}: run `just build-guests`",
        workflows.display()
    );

    let config = RuntimeConfig {
        cache_dir: Some(cache.path().to_owned()),
        ..RuntimeConfig::default()
    };
    let mut components = Vec::new();
    for file in &files {
        // A fresh runtime each time: nothing in memory, so "compile" compiles and "cached" reads disk.
        let cold = Runtime::new(config.clone())?;
        let compiled = cold.load_file(file, &grants).await?;
        let warm = Runtime::new(config.clone())?;
        let cached = warm.load_file(file, &grants).await?;
        anyhow::ensure!(
            compiled.stats.compiled && !cached.stats.compiled,
            "cache did not behave"
        );
        components.push(ComponentLoad {
            component: compiled.descriptor.name.clone(),
            bytes: std::fs::metadata(file)?.len(),
            compile_ms: compiled.stats.elapsed.as_secs_f64() * 1e3,
            cached_load_ms: cached.stats.elapsed.as_secs_f64() * 1e3,
        });
    }

    let runtime = Runtime::new(config)?;
    let hello = runtime
        .load_file(&workflows.join("hello.wasm"), &grants)
        .await?;
    let input = r#"{"name":"bench"}"#;
    for _ in 0..100 {
        let _ = hello
            .activate(&runtime, Box::new(PlatformOnly), 1, input)
            .await;
    }
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let started = Instant::now();
        let activation = hello
            .activate(&runtime, Box::new(PlatformOnly), i as u64, input)
            .await;
        samples.push(started.elapsed());
        anyhow::ensure!(
            matches!(activation, Outcome::Completed(Ok(_))),
            "hello failed: {activation:?}"
        );
    }
    Ok((components, samples))
}

fn print_table(results: &Results) {
    if results.quick || results.build == Build::Debug {
        println!(
            "{} run of the {} build: the figures below are not comparable with a full release run",
            if results.quick {
                "smoke (--quick)"
            } else {
                "full"
            },
            format!("{:?}", results.build).to_lowercase()
        );
    }
    if !results.components.is_empty() {
        println!(
            "{:<26} {:>9} {:>12} {:>15}",
            "component", "KiB", "compile ms", "cached load ms"
        );
    }
    for c in &results.components {
        println!(
            "{:<26} {:>9.0} {:>12.1} {:>15.2}",
            c.component,
            c.bytes as f64 / 1024.0,
            c.compile_ms,
            c.cached_load_ms
        );
    }
    if let Some(l) = &results.hello_instantiate_and_call {
        println!(
            "hello instantiate + call: median {:.1} µs, p99 {:.1} µs, mean {:.1} µs over {} iterations",
            l.median_us, l.p99_us, l.mean_us, l.iterations
        );
    }
    if !results.engine.is_empty() {
        println!(
            "{:<26} {:<10} {:>9} {:>11} {:>14} {:>10} {:>10} {:>10} {:>14} {:>16}",
            "engine (HTTP, 10 stages)",
            "waiting",
            "in flight",
            "executions",
            "executions/s",
            "p50 ms",
            "202 p50",
            "p99 ms",
            "writes/exec",
            "CPU ms/exec"
        );
    }
    for r in &results.engine {
        println!(
            "{:<26} {:<10} {:>9} {:>11} {:>14.0} {:>10.2} {:>10.2} {:>10.1} {:>14} {:>16}",
            r.backend,
            r.waiter.as_str(),
            r.concurrency,
            r.executions,
            r.executions_per_second,
            r.latency_p50_ms,
            r.accepted_p50_ms,
            r.latency_p99_ms,
            r.write_transactions_per_execution
                .map_or("?".to_owned(), |w| format!("{w:.1}")),
            format!(
                "{:.2} + {:.2}",
                r.server_cpu_ms_per_execution(),
                r.client_cpu_ms_per_execution()
            )
        );
    }
    if let Some(a) = &results.api {
        println!(
            "{:<26} {:>11} {:>14} {:>10} {:>10}",
            "api (64 connections)", "requests", "requests/s", "p50 ms", "p99 ms"
        );
        for r in [&a.healthz, &a.execution] {
            println!(
                "{:<26} {:>11} {:>14.0} {:>10.2} {:>10.2}",
                r.route, r.requests, r.requests_per_second, r.latency_p50_ms, r.latency_p99_ms
            );
        }
        println!("execution reads / healthz: {:.0}%", a.ratio * 100.0);
    }
    if let Some(m) = &results.memory {
        println!(
            "start: cold {:.0} ms, warm {:.0} ms; RSS idle {:.1} MiB, {} waiting {:.1} MiB",
            m.cold_start_ms,
            m.warm_start_ms,
            m.rss_idle_mib,
            m.waiting_executions,
            m.rss_waiting_mib
        );
    }
    for r in &results.engine_in_process {
        println!(
            "engine in-process, 10-stage on SQLite, {} workers: {} executions, {:.0} executions/s, trigger→terminal p50 {:.1} ms, p99 {:.1} ms",
            r.concurrency,
            r.executions,
            r.executions_per_second,
            r.trigger_to_terminal.median_us / 1e3,
            r.trigger_to_terminal.p99_us / 1e3
        );
        if let Some(l) = &r.replay_ten_stage_journal {
            println!(
                "  replay of a 10-stage journal: median {:.0} µs, p99 {:.0} µs over {} replays",
                l.median_us, l.p99_us, l.iterations
            );
        }
        if let Some(l) = &r.replay_activation {
            println!(
                "  of which the activation (without the run's and journal's reads): median {:.0} µs, p99 {:.0} µs",
                l.median_us, l.p99_us
            );
        }
        if let Some(rest) = r.wasmtime_and_engine_ms {
            println!(
                "  where the time goes (1 worker): store {:.0}% ({} write transactions, {:.2} ms each), simulated cloud {:.0}%, wasmtime + engine logic {:.0}%",
                100.0 * r.store_ms / r.elapsed_ms,
                r.store_transactions,
                r.store_ms / r.store_transactions.max(1) as f64,
                100.0 * r.providers_ms / r.elapsed_ms,
                100.0 * rest / r.elapsed_ms
            );
        }
    }
    if let Some(f) = &results.fanout {
        println!(
            "{:<32} {:>8} {:>12} {:>12} {:>10} {:>10}",
            "fan-out", "clients", "events", "events/s", "p50 ms", "p99 ms"
        );
        for s in &f.sse {
            println!(
                "{:<32} {:>8} {:>12} {:>12.0} {:>10.1} {:>10.1}",
                "SSE, occurredAt→client",
                s.clients,
                s.events_delivered,
                s.events_delivered_per_second,
                s.latency_p50_ms,
                s.latency_p99_ms
            );
        }
        println!(
            "{:<32} {:>8} {:>12} {:>12} {:>10} {:>10}",
            "webhooks (loopback HTTPS)", "subs", "deliveries", "per second", "p50 ms", "p99 ms"
        );
        for w in &f.webhooks {
            println!(
                "{:<32} {:>8} {:>12} {:>12.0} {:>10.1} {:>10.1}",
                "",
                w.subscriptions,
                w.deliveries,
                w.deliveries_per_second,
                w.latency_p50_ms,
                w.latency_p99_ms
            );
        }
    }
}
