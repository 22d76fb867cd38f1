//! # capstan (server)
//!
//! The `capstan` binary's library half: typed configuration, telemetry, the workflow registry
//! loaded at start-up, the fulfilment steps, and `serve` (listeners, router, graceful shutdown).
//! `main.rs` is only the command line.
//!
//! # Layout
//! - `config` — [`config::Settings`]: defaults → file → `CAPSTAN_*` env → flags.
//! - `telemetry` — tracing subscriber (text or JSON).
//! - `registry` — the loaded workflows and the files that failed.
//! - `steps` — the fulfilment step components and the simulated booking services behind them.
//! - `serve` — [`serve::App`], the router, health and readiness, `run` with a shutdown future.
//! - `listen` — how every listener takes connections: caps, deadlines, a bounded drain.
//! - `tls` — HTTPS for the listeners and the plain-HTTP redirect port.
//! - `bench` — `capstan bench`, the measurements behind BENCHMARKS.md (`bench_engine`,
//!   `bench_api`, `bench_memory`, `bench_cluster`, `booking_bench`; `bench_fanout`: SSE fan-out
//!   and webhook deliveries against a spawned `capstan serve`; `bench_timing`: the store's and
//!   the providers' shares of an execution's time).

pub mod bench;
pub mod bench_api;
pub mod bench_cluster;
pub mod bench_engine;
pub mod bench_fanout;
pub mod bench_memory;
mod bench_timing;
pub mod booking_bench;
pub mod config;
pub mod listen;
pub mod registry;
pub mod serve;
pub mod steps;
pub mod telemetry;
pub mod tls;
