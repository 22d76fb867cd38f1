//! # capstan-engine
//!
//! Durable executions. An execution is the API resource; a run is one engine instance of a
//! workflow component pinned to its digest. Every host call of a run is journaled; a run that
//! waits (timer, approval, convergence) is suspended and its instance dropped, and it resumes by
//! replaying the journal. Side effects reach a provider under an idempotency token derived from
//! the run and the call, and leave a receipt, so a crash repeats them safely and rollback undoes
//! them exactly.
//!
//! The engine reaches storage only through [`capstan_core::store::EngineStore`] and the outside
//! world only through [`Providers`]; it never sees HTTP.
//!
//! # Layout
//! - `lib.rs` — [`Engine`], its configuration, errors and the requests and answers of its API.
//! - `trigger` — an execution and its run created in one commit; the eager start.
//! - `workers` — claims, leases, the scheduler's slots and the worker loops.
//! - `schedule` — when runs fall due: the claimer's wake-ups, read off every commit.
//! - `activation` — one activation of a run and what its outcome means for the execution.
//! - `control` — the control commands (cancel, resume and recoveries, rollback, approve), one
//!   file each, applying the rows `capstan_core::transitions::decide` picks.
//! - `host` — the journal: replay, live calls, waits, effect tokens and receipts.
//! - `effects` — which calls are side effects and how each is compensated.
//! - `events` — outbox events.
//! - `catalog` — the public event catalog: every published event version and its schema.
//! - `replay_check` — `capstan workflows check`: whether a candidate build replays the runs in flight.

mod activation;
pub mod catalog;
mod control;
pub mod effects;
pub mod events;
mod host;
pub mod replay_check;
mod schedule;
mod trigger;
mod workers;

use capstan_core::execution::{ExecutionStatus, StageStatus};
use capstan_core::store::*;
use capstan_core::transitions::{self, Facts, On};
use capstan_core::{CancelMode, CapabilityError, Clock, ErrorKind};
use capstan_runtime::{Interrupt, LoadedWorkflow, Outcome, Runtime};
use effects::Compensation;
use events::event;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tracing::Instrument;

/// The outside world, declared once in `capstan-core` and re-exported for the engine's users.
pub use capstan_core::Providers;

/// Describes the engine's metrics to the process's recorder (a no-op without one): stage
/// durations, provider calls by capability, operation and outcome, and their retries.
pub fn describe_metrics() {
    metrics::describe_histogram!(
        "capstan_provider_call_duration_seconds",
        metrics::Unit::Seconds,
        "One provider call (one attempt), by capability, operation and outcome (ok, transient, permanent)."
    );
    metrics::describe_histogram!(
        "capstan_stage_duration_seconds",
        metrics::Unit::Seconds,
        "A stage from its begin to its end by the engine's clock (waits included), by workflow, stage and outcome."
    );
    metrics::describe_counter!(
        "capstan_provider_retries_total",
        "Provider calls retried after a transient error, by capability and operation."
    );
}

/// Exponential backoff with jitter.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    pub initial_ms: i64,
    pub max_ms: i64,
    /// Attempts in all (for provider retries).
    pub max_attempts: u32,
}

impl Backoff {
    /// The delay before attempt `n + 1` (n from 0), with up to 20 % jitter.
    pub fn delay_ms(&self, n: u32) -> i64 {
        let base = self
            .initial_ms
            .saturating_mul(1_i64 << n.min(30))
            .min(self.max_ms);
        let jitter = if base > 4 {
            (uuid::Uuid::now_v7().as_u128() % (base as u128 / 5)) as i64
        } else {
            0
        };
        base + jitter
    }

    /// The delay before attempt `n + 1` when the provider asked for `retry_after_ms`: the
    /// backoff's, or longer to honour the provider, but never beyond `max_ms` (a provider must
    /// not hold an activation longer than the operator allows).
    pub fn delay_after(&self, n: u32, retry_after_ms: Option<u64>) -> i64 {
        let asked = retry_after_ms
            .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX).min(self.max_ms))
            .unwrap_or(0);
        self.delay_ms(n).max(asked)
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// This node's name in leases.
    pub node_id: String,
    pub lease_ms: i64,
    pub workers: usize,
    /// The shortest interval between claims that other nodes' commits prompt, and between
    /// retries of a claim that failed.
    pub poll: Duration,
    /// The longest an idle claimer sleeps: due runs that no commit of this node and no
    /// announcement of another node's told it of (a writer outside the engine, a notification
    /// lost) wait at most this long.
    pub idle_poll: Duration,
    /// Retries of transient provider errors within one call.
    pub provider_retry: Backoff,
    /// Per-capability policies that replace `provider_retry` for that capability's calls.
    pub provider_retry_by_capability: std::collections::BTreeMap<capstan_core::Capability, Backoff>,
    /// Polling of `await-converged` conditions.
    pub convergence: Backoff,
    /// How long an idempotency reservation that never completed (a key recorded without its
    /// execution) blocks its key. A trigger records its key with its execution, in one batch.
    pub reservation_timeout_ms: i64,
    /// How long a trigger's idempotency key replays its execution (then the key is free again).
    pub idempotency_retention_ms: i64,
}

impl EngineConfig {
    /// The retry policy of an operation's capability.
    pub fn retry_policy(&self, op: &str) -> Backoff {
        capstan_core::Capability::of_op(op)
            .and_then(|c| self.provider_retry_by_capability.get(&c))
            .copied()
            .unwrap_or(self.provider_retry)
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            node_id: format!("node-{}", &capstan_core::ids::new_id()[24..]),
            lease_ms: 30_000,
            workers: 4,
            poll: Duration::from_millis(25),
            idle_poll: Duration::from_secs(1),
            provider_retry: Backoff {
                initial_ms: 200,
                max_ms: 5_000,
                max_attempts: 4,
            },
            provider_retry_by_capability: std::collections::BTreeMap::new(),
            convergence: Backoff {
                initial_ms: 1_000,
                max_ms: 30_000,
                max_attempts: u32::MAX,
            },
            reservation_timeout_ms: 60_000,
            idempotency_retention_ms: 24 * 3_600_000,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("execution {0} not found")]
    NotFound(String),
    #[error("no workflow named `{0}` is loaded")]
    UnknownWorkflow(String),
    /// The control operation does not apply in the execution's state.
    #[error("{message}")]
    StateInvalid {
        reason: &'static str,
        message: String,
    },
    #[error("this Idempotency-Key was used with a different request body")]
    IdempotencyConflict,
    #[error("a request with this Idempotency-Key is still being processed")]
    ReservationPending,
    #[error("the plan changed: approve the current hash {current}")]
    StaleApproval { current: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where a resumed run stops replaying and runs live again: the earliest of
/// - the last call that failed (it is attempted again);
/// - the first `cancellation-requested` that answered true (a resumed run is not asked to stop);
/// - the first capability read after the last effect of the failed stage (a verification that
///   answered "unhealthy" is asked again; effects before it replay, never repeat);
///
/// and, when none of these exists, the failure of the last failed stage.
fn resume_point(journal: &[JournalEntry]) -> Option<i64> {
    let failed_call = journal
        .iter()
        .rev()
        .find(|e| {
            e.response
                .as_ref()
                .is_some_and(|r| r.value().get("Err").is_some())
        })
        .map(|e| e.seq);
    let cancel_seen = journal
        .iter()
        .find(|e| {
            e.op == "context.cancellation-requested"
                && e.response
                    .as_ref()
                    .map(JsonText::value)
                    .is_some_and(|r| r == json!(true) || r.get("Ok") == Some(&json!(true)))
        })
        .map(|e| e.seq);
    let stage_failed = journal
        .iter()
        .rev()
        .find(|e| e.op == "context.stage-failed")
        .map(|e| e.seq);
    let reread = stage_failed.and_then(|failed| {
        let begin = journal
            .iter()
            .rev()
            .find(|e| e.seq < failed && e.op == "context.stage-begin")
            .map_or(0, |e| e.seq);
        let in_stage = || journal.iter().filter(|e| e.seq > begin && e.seq < failed);
        let last_effect = in_stage()
            .filter(|e| effects::is_effect(&e.op))
            .map(|e| e.seq)
            .max()
            .unwrap_or(begin);
        in_stage()
            .find(|e| {
                e.seq > last_effect
                    && capstan_core::Capability::of_op(&e.op).is_some()
                    && !effects::is_effect(&e.op)
            })
            .map(|e| e.seq)
    });
    [failed_call, cancel_seen, reread]
        .into_iter()
        .flatten()
        .min()
        .or(stage_failed)
}

/// Moves the execution's resume and recovery commands from `from` to `to`.
fn settle(
    execution_id: &str,
    from: CommandStatus,
    to: CommandStatus,
    at_ms: Millis,
    error: Option<String>,
) -> Write {
    Write::SettleCommands {
        execution_id: execution_id.to_owned(),
        from,
        to,
        at_ms,
        error,
    }
}

fn invalid(reason: &'static str, message: impl Into<String>) -> EngineError {
    EngineError::StateInvalid {
        reason,
        message: message.into(),
    }
}

/// Where a suspended run waits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Suspension {
    pub wake_ms: Option<Millis>,
    pub kind: WaitKind,
}

/// A trigger: which workflow, for whom, with what input.
#[derive(Debug, Clone)]
pub struct TriggerRequest {
    pub workflow: String,
    pub principal_id: String,
    pub input: Value,
    /// `Idempotency-Key` and the sha256 of the request body.
    pub idempotency: Option<(String, String)>,
    pub traceparent: Option<String>,
}

/// A trigger's result: the execution and whether it was an idempotent replay.
#[derive(Debug, Clone)]
pub struct Triggered {
    pub execution: ExecutionRecord,
    pub replayed: bool,
    /// The response stored with the reservation on replay.
    pub replay_response: Option<Value>,
}

/// What a cancel did.
#[derive(Debug, Clone)]
pub struct Canceled {
    pub execution: ExecutionRecord,
    /// Cooperative mode: recorded, the workflow decides.
    pub cancellation_requested: bool,
}

/// A command's state, as the control routes report it.
#[derive(Debug, Clone)]
pub struct CommandOutcome {
    pub command: Option<CommandRecord>,
    pub execution: ExecutionRecord,
    /// A pending duplicate was returned instead of a new command.
    pub reused: bool,
    /// Completed synchronously (rollback of an execution without receipts).
    pub immediate: bool,
}

pub(crate) struct EngineState {
    pub store: Arc<dyn EngineStore>,
    pub runtime: Arc<Runtime>,
    pub providers: Arc<dyn Providers>,
    pub clock: Arc<dyn Clock>,
    pub config: EngineConfig,
    /// Current build per workflow name.
    current: RwLock<HashMap<String, Arc<LoadedWorkflow>>>,
    /// Every build by digest (runs are pinned to one).
    builds: RwLock<HashMap<String, Arc<LoadedWorkflow>>>,
    local_cancels: Mutex<HashSet<String>>,
    schedule: schedule::Schedule,
    /// While the node's scheduler runs ([`Engine::spawn_workers`]): how a trigger hands its run
    /// straight to a free worker slot.
    eager: Mutex<Option<EagerStart>>,
    /// Idempotency keys (principal, workflow, key) of triggers starting their runs ahead of
    /// their commits, with what wakes the same request's other triggers ([`trigger::KeyHold`]).
    ahead_keys: Mutex<HashMap<(String, String, String), Arc<tokio::sync::Notify>>>,
}

/// A free worker slot, taken by a trigger, and the scheduler's inbox for runs started that way.
///
/// A trigger that finds a slot free inserts its run already leased to this node and hands it
/// over with the execution it writes (once committed, or once queued on SQLite, where the run's
/// commits queue behind the trigger's: [`RunStore::queue_ahead`]): the run skips the claim (a
/// write), reading back what was claimed, reading the execution and reading an empty journal. A
/// trigger that finds every slot taken inserts its run unleased and wakes the claimer, which
/// claims it like any due run.
#[derive(Clone)]
struct EagerStart {
    slots: Arc<tokio::sync::Semaphore>,
    runs: tokio::sync::mpsc::UnboundedSender<Started>,
}

/// A run a trigger inserted already leased to this node, with its execution and its slot.
struct Started {
    run: RunRecord,
    execution: ExecutionRecord,
    permit: tokio::sync::OwnedSemaphorePermit,
    /// Started before its trigger committed: the activation's scope, begun before the trigger's
    /// batch was queued ([`RunStore::queue_ahead`]).
    ahead: Option<activation::ActivationScope>,
}

impl EngineState {
    pub fn now(&self) -> Millis {
        self.clock.now_millis() as Millis
    }

    /// The fence of a run's commit: this node's lease, extended.
    pub fn fence(&self, run_id: &str) -> Fence {
        Fence {
            run_id: run_id.to_owned(),
            owner: self.config.node_id.clone(),
            lease_until_ms: self.now() + self.config.lease_ms,
        }
    }

    pub fn is_cancel_requested_locally(&self, run_id: &str) -> bool {
        self.local_cancels
            .lock()
            .map(|s| s.contains(run_id))
            .unwrap_or(false)
    }

    /// A provider's answer given behind its writes ([`Providers::call_behind`]), if it can give
    /// one, traced and timed as [`EngineState::provide`]'s calls are. Its span is made once the
    /// answer has come (from memory, within microseconds): a call the provider declines is made
    /// again through [`EngineState::provide`], and must not leave a span without an outcome.
    pub async fn provide_behind(
        &self,
        op: &str,
        request: &Value,
        token: &str,
        first: bool,
        epoch: u64,
    ) -> Option<Result<Value, CapabilityError>> {
        let started = std::time::Instant::now();
        let answer = self
            .providers
            .call_behind(op, request, token, first, epoch)
            .await?;
        ProviderCall {
            started,
            ..ProviderCall::begin(op, 0)
        }
        .end(&answer);
        Some(answer)
    }

    /// A provider call with retries of transient errors under the backoff policy.
    /// `first`: no earlier attempt can have used `token` ([`Providers::call_first`]); only the
    /// first attempt here is asked so.
    pub async fn provide(
        &self,
        op: &str,
        request: &Value,
        token: &str,
        first: bool,
    ) -> Result<Value, CapabilityError> {
        let policy = self.config.retry_policy(op);
        let (capability, operation) = op.split_once('.').unwrap_or(("", op));
        let mut attempt = 0;
        loop {
            let call = ProviderCall::begin(op, attempt);
            let answer = if first && attempt == 0 {
                self.providers
                    .call_first(op, request, token)
                    .instrument(call.span.clone())
                    .await
            } else {
                self.providers
                    .call(op, request, token)
                    .instrument(call.span.clone())
                    .await
            };
            call.end(&answer);
            match answer {
                Err(e) if e.is_transient() && attempt + 1 < policy.max_attempts => {
                    metrics::counter!(
                        "capstan_provider_retries_total",
                        "capability" => capability.to_owned(),
                        "operation" => operation.to_owned(),
                    )
                    .increment(1);
                    let delay = policy.delay_after(attempt, e.retry_after_ms);
                    tracing::debug!(op, attempt, delay, error = %e, "retrying a transient provider error");
                    if delay > 0 {
                        tokio::time::sleep(Duration::from_millis(delay as u64)).await;
                    }
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// Whether an `await-converged` condition holds now: the providers say which read decides
    /// it, and the read is retried like any other.
    pub async fn converged(&self, condition: &Value) -> Result<bool, CapabilityError> {
        let probe = self.providers.probe(condition)?;
        self.provide(probe.op, &probe.request, "", false)
            .await
            .map(|v| (probe.holds)(&v))
    }
}

/// The durable engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineState>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("node", &self.inner.config.node_id)
            .finish_non_exhaustive()
    }
}

pub(crate) fn seed_of(run_id: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(run_id.as_bytes());
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

impl Engine {
    pub fn new(
        store: Arc<dyn EngineStore>,
        runtime: Arc<Runtime>,
        providers: Arc<dyn Providers>,
        clock: Arc<dyn Clock>,
        config: EngineConfig,
    ) -> Self {
        Self {
            inner: Arc::new(EngineState {
                store,
                runtime,
                providers,
                clock,
                config,
                current: RwLock::new(HashMap::new()),
                builds: RwLock::new(HashMap::new()),
                local_cancels: Mutex::new(HashSet::new()),
                schedule: schedule::Schedule::default(),
                eager: Mutex::new(None),
                ahead_keys: Mutex::default(),
            }),
        }
    }

    pub fn store(&self) -> &Arc<dyn EngineStore> {
        &self.inner.store
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Makes `workflow` the current build of its name. Earlier builds stay loaded for the runs
    /// pinned to them.
    pub fn register(&self, workflow: Arc<LoadedWorkflow>) {
        if let Ok(mut builds) = self.inner.builds.write() {
            builds.insert(workflow.digest.clone(), workflow.clone());
        }
        if let Ok(mut current) = self.inner.current.write() {
            current.insert(workflow.descriptor.name.clone(), workflow);
        }
    }

    /// The current build of `name`.
    pub fn workflow(&self, name: &str) -> Option<Arc<LoadedWorkflow>> {
        self.inner.current.read().ok()?.get(name).cloned()
    }

    /// Every current build, by name.
    pub fn workflows(&self) -> Vec<Arc<LoadedWorkflow>> {
        let mut all: Vec<_> = self
            .inner
            .current
            .read()
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default();
        all.sort_by(|a, b| a.descriptor.name.cmp(&b.descriptor.name));
        all
    }

    fn build(&self, digest: &str) -> Option<Arc<LoadedWorkflow>> {
        self.inner.builds.read().ok()?.get(digest).cloned()
    }

    fn now(&self) -> Millis {
        self.inner.now()
    }

    async fn get(&self, id: &str) -> Result<ExecutionRecord, EngineError> {
        self.inner
            .store
            .execution(id)
            .await?
            .ok_or_else(|| EngineError::NotFound(id.to_owned()))
    }

    /// An execution and its stages.
    pub async fn execution(
        &self,
        id: &str,
    ) -> Result<Option<(ExecutionRecord, Vec<StageRecord>)>, EngineError> {
        let Some(execution) = self.inner.store.execution(id).await? else {
            return Ok(None);
        };
        let stages = self.inner.store.stages(id).await?;
        Ok(Some((execution, stages)))
    }
}

/// One attempt of a provider call as traces and metrics see it: its span (a child of the
/// stage's), and its duration by outcome (`capstan_provider_call_duration_seconds`).
struct ProviderCall<'a> {
    span: tracing::Span,
    capability: &'a str,
    operation: &'a str,
    started: std::time::Instant,
}

impl<'a> ProviderCall<'a> {
    fn begin(op: &'a str, attempt: u32) -> Self {
        let (capability, operation) = op.split_once('.').unwrap_or(("", op));
        let span = tracing::debug_span!(
            "provider call",
            otel.name = op,
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            capability,
            operation,
            attempt,
            outcome = tracing::field::Empty,
            error = tracing::field::Empty,
        );
        Self {
            span,
            capability,
            operation,
            started: std::time::Instant::now(),
        }
    }

    fn end(self, answer: &Result<Value, CapabilityError>) {
        let outcome = match answer {
            Ok(_) => "ok",
            Err(e) if e.is_transient() => "transient",
            Err(_) => "permanent",
        };
        self.span.record("outcome", outcome);
        if let Err(e) = answer {
            self.span.record("error", e.code.as_str());
            self.span.record("otel.status_code", "ERROR");
        }
        drop(self.span);
        metrics::histogram!(
            "capstan_provider_call_duration_seconds",
            "capability" => self.capability.to_owned(),
            "operation" => self.operation.to_owned(),
            "outcome" => outcome,
        )
        .record(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;

    #[test]
    fn a_provider_s_retry_after_lengthens_the_wait_up_to_the_policy_s_maximum() {
        let policy = Backoff {
            initial_ms: 100,
            max_ms: 5_000,
            max_attempts: 5,
        };
        // The backoff's own delay with its jitter: 100..=120 ms before the second attempt.
        let plain = policy.delay_after(0, None);
        assert!((100..=120).contains(&plain), "{plain}");
        assert_eq!(policy.delay_after(0, Some(2_000)), 2_000);
        // A provider asking for less than the backoff does not shorten it.
        assert!(policy.delay_after(3, Some(10)) >= 800);
        // Nor may it hold the activation beyond the operator's maximum.
        assert_eq!(policy.delay_after(0, Some(3_600_000)), 5_000);
    }
}
