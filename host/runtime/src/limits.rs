//! The walls of one activation besides memory, fuel and stack: a wall-clock deadline on the
//! guest's own time, and bounds on what it may hand the host (call arguments, log lines, events,
//! stage outputs, approval payloads, calls per run).
//!
//! Everything a guest hands the host is journaled, and a journal is replayed on every activation:
//! an unbounded argument becomes an unbounded row read back forever (a crash loop on replay), so
//! each is refused before the host acts on it. A refused call fails the stage with
//! `limit_exceeded` and a message naming the setting (`runtime.limits.<name>`).

use crate::sandbox::{LimitExceeded, Request};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Per-activation bounds, under `[runtime.limits]` in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuestLimits {
    /// The guest's own wall-clock time per activation, in milliseconds: time spent running wasm
    /// or blocked in WASI (a `poll` on a monotonic-clock pollable sleeps for real). Time the host
    /// spends answering its calls (a provider, a commit) does not count.
    pub deadline_ms: u64,
    /// The JSON of any one host call's arguments.
    pub call_bytes: usize,
    /// One log message.
    pub log_bytes: usize,
    /// Log messages per activation.
    pub logs_per_activation: u32,
    /// One emitted event's payload.
    pub event_bytes: usize,
    /// One stage's output.
    pub stage_output_bytes: usize,
    /// One approval request's payload.
    pub approval_payload_bytes: usize,
    /// Host calls per run. Every activation replays its run's journal from the first call, so
    /// the calls of one activation are the length of the journal.
    pub journal_entries: u32,
}

impl Default for GuestLimits {
    fn default() -> Self {
        Self {
            deadline_ms: 60_000,
            call_bytes: 1 << 20,
            log_bytes: 16 << 10,
            logs_per_activation: 1_000,
            event_bytes: 64 << 10,
            stage_output_bytes: 256 << 10,
            approval_payload_bytes: 64 << 10,
            journal_entries: 10_000,
        }
    }
}

/// One of [`GuestLimits`], named as in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    CallBytes,
    LogBytes,
    LogsPerActivation,
    EventBytes,
    StageOutputBytes,
    ApprovalPayloadBytes,
    JournalEntries,
}

impl Limit {
    /// The setting's key.
    pub fn key(self) -> &'static str {
        match self {
            Limit::CallBytes => "runtime.limits.call_bytes",
            Limit::LogBytes => "runtime.limits.log_bytes",
            Limit::LogsPerActivation => "runtime.limits.logs_per_activation",
            Limit::EventBytes => "runtime.limits.event_bytes",
            Limit::StageOutputBytes => "runtime.limits.stage_output_bytes",
            Limit::ApprovalPayloadBytes => "runtime.limits.approval_payload_bytes",
            Limit::JournalEntries => "runtime.limits.journal_entries",
        }
    }

    /// What was measured against it, for the message.
    pub fn measures(self) -> &'static str {
        match self {
            Limit::CallBytes => "bytes of host-call arguments",
            Limit::LogBytes => "bytes in one log message",
            Limit::LogsPerActivation => "log messages in one activation",
            Limit::EventBytes => "bytes of event payload",
            Limit::StageOutputBytes => "bytes of stage output",
            Limit::ApprovalPayloadBytes => "bytes of approval payload",
            Limit::JournalEntries => "host calls in one run",
        }
    }
}

/// What one activation has handed the host so far, checked against [`GuestLimits`].
#[derive(Debug)]
pub(crate) struct Usage {
    limits: GuestLimits,
    calls: u32,
    logs: u32,
}

impl Usage {
    pub(crate) fn new(limits: GuestLimits) -> Self {
        Self {
            limits,
            calls: 0,
            logs: 0,
        }
    }

    /// Counts the call `op` and checks its arguments; the most specific limit is named first.
    pub(crate) fn admit(&mut self, op: &str, request: &Request) -> Result<(), LimitExceeded> {
        let limits = &self.limits;
        self.calls = self.calls.saturating_add(1);
        exceeds(Limit::JournalEntries, limits.journal_entries, self.calls)?;
        let text = |key: &str| request.get(key).and_then(Value::as_str).map_or(0, str::len);
        match op {
            "context.log" => {
                self.logs = self.logs.saturating_add(1);
                exceeds(
                    Limit::LogsPerActivation,
                    limits.logs_per_activation,
                    self.logs,
                )?;
                exceeds(Limit::LogBytes, limits.log_bytes, text("message"))?;
            }
            "context.emit" => exceeds(Limit::EventBytes, limits.event_bytes, text("payload"))?,
            "context.stage-succeeded" => exceeds(
                Limit::StageOutputBytes,
                limits.stage_output_bytes,
                text("output"),
            )?,
            "approvals.await-approval" => exceeds(
                Limit::ApprovalPayloadBytes,
                limits.approval_payload_bytes,
                text("payload"),
            )?,
            _ => {}
        }
        exceeds(
            Limit::CallBytes,
            limits.call_bytes,
            request.text.as_str().len(),
        )
    }
}

fn exceeds(limit: Limit, allowed: impl Count, actual: impl Count) -> Result<(), LimitExceeded> {
    let (allowed, actual) = (allowed.count(), actual.count());
    if actual > allowed {
        return Err(LimitExceeded::Exceeded {
            limit,
            allowed,
            actual,
        });
    }
    Ok(())
}

/// A count as `u64`, whatever integer it was kept in.
trait Count {
    fn count(self) -> u64;
}

impl Count for u32 {
    fn count(self) -> u64 {
        u64::from(self)
    }
}

impl Count for usize {
    fn count(self) -> u64 {
        u64::try_from(self).unwrap_or(u64::MAX)
    }
}

/// The guest's own time in one activation: wall-clock time since it began, less the time the
/// host spent answering its calls. Shared between the store (which enters and leaves host calls,
/// and checks it at each epoch tick) and the watchdog that covers time blocked in WASI.
///
/// Read on a coarse clock ([`coarse_now`]), twice per host call: each call's time is off by up
/// to one tick (1–4 ms), as often one way as the other, which a deadline of seconds does not
/// notice. Atomics rather than a lock: only the store writes them; the watchdog reads.
#[derive(Debug, Clone)]
pub(crate) struct GuestClock(Arc<ClockState>);

#[derive(Debug)]
struct ClockState {
    started: Duration,
    /// Nanoseconds spent in host calls that have returned.
    in_host: AtomicU64,
    /// When the host call under way began, in nanoseconds on [`coarse_now`] plus one; 0 when
    /// the guest is running.
    host_since: AtomicU64,
}

impl GuestClock {
    pub(crate) fn start() -> Self {
        Self(Arc::new(ClockState {
            started: coarse_now(),
            in_host: AtomicU64::new(0),
            host_since: AtomicU64::new(0),
        }))
    }

    pub(crate) fn enter_host(&self) {
        self.0
            .host_since
            .store(nanos(coarse_now()).saturating_add(1), Ordering::Relaxed);
    }

    pub(crate) fn leave_host(&self) {
        let since = self.0.host_since.swap(0, Ordering::Relaxed);
        if since > 0 {
            let spent = nanos(coarse_now()).saturating_sub(since - 1);
            self.0.in_host.fetch_add(spent, Ordering::Relaxed);
        }
    }

    pub(crate) fn guest_elapsed(&self) -> Duration {
        let now = coarse_now();
        let since = self.0.host_since.load(Ordering::Relaxed);
        let current = if since > 0 {
            nanos(now).saturating_sub(since - 1)
        } else {
            0
        };
        let in_host = self
            .0
            .in_host
            .load(Ordering::Relaxed)
            .saturating_add(current);
        now.saturating_sub(self.0.started)
            .saturating_sub(Duration::from_nanos(in_host))
    }

    /// Resolves once the guest's own time passes `deadline`; never while the host is answering.
    pub(crate) async fn expired(&self, deadline: Duration) {
        loop {
            let left = deadline.saturating_sub(self.guest_elapsed());
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left.max(Duration::from_millis(10))).await;
        }
    }
}

fn nanos(at: Duration) -> u64 {
    u64::try_from(at.as_nanos()).unwrap_or(u64::MAX)
}

/// Monotonic time for [`GuestClock`]: on Linux the coarse clock, which reads the time of the
/// kernel's last tick from the vDSO (~8 ns against ~23 ns for `Instant::now` on a VM whose
/// clock source is the TSC), at the tick's resolution; elsewhere `Instant`.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn coarse_now() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn coarse_now() -> Duration {
    static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(std::time::Instant::now).elapsed()
}
