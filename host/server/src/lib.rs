//! # capstan (server)
//!
//! The `capstan` binary's library half: typed configuration, telemetry, the workflow registry
//! loaded at start-up, the fulfilment steps, and `serve` (listeners, router, graceful shutdown).
//! `main.rs` is only the command line.
//!
//! # Layout
//! - `config` — [`config::Settings`]: defaults → file → `CAPSTAN_*` env → flags.
//! - `client` — `capstan executions …` and `capstan trigger`: the CLI as a client of `/v1`.
//! - `telemetry` — logs (text or JSON) and OpenTelemetry trace export (OTLP), with the W3C
//!   trace-context propagation the engine stores with executions.
//! - `registry` — the loaded workflows and the files that failed.
//! - `steps` — the fulfilment step components and the simulated booking services behind them.
//! - `serve` — [`serve::App`], the router, health and readiness, `run` with a shutdown future.
//! - `listen` — how every listener takes connections: caps, deadlines, a bounded drain.
//! - `tls` — HTTPS for the listeners and the plain-HTTP redirect port.
//!
//! The benchmarks live in `host/bench` (`capstan-bench`), outside the server binary.

pub mod client;
pub mod config;
pub mod listen;
pub mod registry;
pub mod serve;
pub mod steps;
pub mod telemetry;
pub mod tls;
