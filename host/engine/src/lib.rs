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
//! - `lib.rs` — [`Engine`]: triggers, workers and leases, activation outcomes.
//! - `control` — the control commands (cancel, resume and recoveries, rollback, approve), one
//!   file each, applying the rows `capstan_core::transitions::decide` picks.
//! - `host` — the journal: replay, live calls, waits, effect tokens and receipts.
//! - `effects` — which calls are side effects and how each is compensated.
//! - `events` — outbox events.
//! - `catalog` — the public event catalog: every published event version and its schema.
//! - `replay_check` — `capstan workflows check`: whether a candidate build replays the runs in flight.

pub mod catalog;
mod control;
pub mod effects;
pub mod events;
mod host;
pub mod replay_check;

use capstan_core::execution::{ExecutionStatus, StageStatus};
use capstan_core::store::*;
use capstan_core::{CancelMode, CapabilityError, Clock, ErrorKind};
use capstan_runtime::{Interrupt, LoadedWorkflow, Outcome, Runtime};
use effects::Compensation;
use events::event;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// The outside world, declared once in `capstan-core` and re-exported for the engine's users.
pub use capstan_core::Providers;

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
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// This node's name in leases.
    pub node_id: String,
    pub lease_ms: i64,
    pub workers: usize,
    /// How often idle workers look for due runs.
    pub poll: Duration,
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
        .find(|e| e.response.as_ref().is_some_and(|r| r.get("Err").is_some()))
        .map(|e| e.seq);
    let cancel_seen = journal
        .iter()
        .find(|e| {
            e.op == "context.cancellation-requested"
                && e.response
                    .as_ref()
                    .is_some_and(|r| r == &json!(true) || r.get("Ok") == Some(&json!(true)))
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
    wake: tokio::sync::Notify,
    /// While the node's scheduler runs ([`Engine::spawn_workers`]): how a trigger hands its run
    /// straight to a free worker slot.
    eager: Mutex<Option<EagerStart>>,
}

/// A free worker slot, taken by a trigger, and the scheduler's inbox for runs started that way.
///
/// A trigger that finds a slot free inserts its run already leased to this node and hands it
/// over with the execution it just wrote: the run skips the claim (a write), reading back what
/// was claimed, reading the execution and reading an empty journal. A trigger that finds every
/// slot taken inserts its run unleased and wakes the claimer, which claims it like any due run.
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
}

impl EngineState {
    pub fn now(&self) -> Millis {
        self.clock.now_millis() as Millis
    }

    /// The fence of a run's commit; `behind`: the store's epoch of writes behind answers when
    /// the activation (or rollback) that commits began ([`Fence::behind`]).
    pub fn fence(&self, run_id: &str, behind: Option<u64>) -> Fence {
        Fence {
            run_id: run_id.to_owned(),
            owner: self.config.node_id.clone(),
            lease_until_ms: self.now() + self.config.lease_ms,
            behind,
        }
    }

    pub fn is_cancel_requested_locally(&self, run_id: &str) -> bool {
        self.local_cancels
            .lock()
            .map(|s| s.contains(run_id))
            .unwrap_or(false)
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
        let mut attempt = 0;
        loop {
            let answer = if first && attempt == 0 {
                self.providers.call_first(op, request, token).await
            } else {
                self.providers.call(op, request, token).await
            };
            match answer {
                Err(e) if e.is_transient() && attempt + 1 < policy.max_attempts => {
                    let delay = policy.delay_ms(attempt);
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
                wake: tokio::sync::Notify::new(),
                eager: Mutex::new(None),
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

    /// Creates an execution (status `queued`) and its run, pinned to the current build; with an
    /// idempotency key, a repeat of the same request returns the original execution. When the
    /// node's scheduler has a slot free, the run starts here at once ([`EagerStart`]): the
    /// execution is written already `running`, with its `ExecutionStarted` after its
    /// `ExecutionQueued`, in the same commit.
    pub async fn trigger(&self, request: TriggerRequest) -> Result<Triggered, EngineError> {
        let workflow = self
            .workflow(&request.workflow)
            .ok_or_else(|| EngineError::UnknownWorkflow(request.workflow.clone()))?;
        let now = self.now();
        let execution = ExecutionRecord {
            id: capstan_core::ids::new_id(),
            workflow: request.workflow.clone(),
            principal_id: request.principal_id.clone(),
            status: ExecutionStatus::Queued,
            status_reason: None,
            current_stage: None,
            created_ms: now,
            finished_ms: None,
            cancellation_requested_ms: None,
            input_json: request.input.clone(),
            output_json: None,
            outcome_json: None,
            run_id: capstan_core::ids::new_id(),
            traceparent: request.traceparent.clone(),
        };
        // A free local slot: the run is inserted leased to this node (as a claim would leave
        // it) and started here once committed.
        let slot = self.free_slot();
        let run = RunRecord {
            id: execution.run_id.clone(),
            execution_id: execution.id.clone(),
            workflow: request.workflow.clone(),
            digest: workflow.digest.clone(),
            kind: RunKind::Workflow,
            state: RunState::Runnable,
            wake_ms: now,
            lease_owner: slot.as_ref().map(|_| self.inner.config.node_id.clone()),
            lease_expires_ms: slot.as_ref().map(|_| now + self.inner.config.lease_ms),
            activations: i64::from(slot.is_some()),
            cancel_requested: false,
            created_ms: now,
            epoch: 0,
        };
        let queued = event(
            &execution,
            "ExecutionQueued",
            "queued",
            json!({"workflowRunId": run.id}),
            now,
        );
        let mut writes = vec![Write::Event(queued)];
        let mut execution = execution;
        if slot.is_some() {
            // What the activation's start would commit (`activate_inner`), committed now.
            execution.status = ExecutionStatus::Running;
            writes.push(Write::Event(event(
                &execution,
                "ExecutionStarted",
                "running",
                json!({"workflowRunId": run.id}),
                now,
            )));
        }
        writes.splice(
            0..0,
            [
                Write::InsertExecution(execution.clone()),
                Write::InsertRun(run.clone()),
            ],
        );
        let Some((key, body)) = &request.idempotency else {
            self.inner.store.apply(None, writes).await?;
            self.start(slot, run, &execution);
            return Ok(Triggered {
                execution,
                replayed: false,
                replay_response: None,
            });
        };
        // The key is recorded in the execution's own batch: a repeat of the request fails that
        // batch on the key's uniqueness and finds what the first one recorded.
        writes.push(Write::InsertIdempotency(IdempotencyRecord {
            principal_id: request.principal_id.clone(),
            workflow: request.workflow.clone(),
            key: key.clone(),
            body_sha256: body.clone(),
            execution_id: Some(execution.id.clone()),
            response_json: Some(json!({"executionId": execution.id})),
            created_ms: now,
        }));
        let mut dropped = false;
        loop {
            let Err(error) = self.inner.store.apply(None, writes.clone()).await else {
                self.start(slot, run, &execution);
                return Ok(Triggered {
                    execution,
                    replayed: false,
                    replay_response: None,
                });
            };
            let found = self
                .inner
                .store
                .idempotency(&request.principal_id, &request.workflow, key)
                .await?;
            // No key: the batch failed for another reason.
            let Some(found) = found else {
                return Err(error.into());
            };
            let config = &self.inner.config;
            let stale = match &found.execution_id {
                Some(_) => found.created_ms < now - config.idempotency_retention_ms,
                None => found.created_ms < now - config.reservation_timeout_ms,
            };
            match (&found.execution_id, &found.response_json) {
                _ if stale && !dropped => {
                    // Past its retention (or an abandoned reservation): the key is free again.
                    dropped = true;
                    writes.insert(
                        0,
                        Write::DropIdempotency {
                            principal_id: found.principal_id,
                            workflow: found.workflow,
                            key: found.key,
                            created_ms: found.created_ms,
                        },
                    );
                }
                // Still the stale key after dropping it: the batch failed for another reason.
                _ if stale => return Err(error.into()),
                _ if found.body_sha256 != *body => return Err(EngineError::IdempotencyConflict),
                (Some(execution_id), Some(response)) => {
                    let execution = self.get(execution_id).await?;
                    return Ok(Triggered {
                        execution,
                        replayed: true,
                        replay_response: Some(response.clone()),
                    });
                }
                _ => return Err(EngineError::ReservationPending),
            }
        }
    }

    /// A free worker slot for a trigger to start its run in, when the scheduler runs.
    fn free_slot(&self) -> Option<(EagerStart, tokio::sync::OwnedSemaphorePermit)> {
        let eager = self
            .inner
            .eager
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()?;
        if eager.runs.is_closed() {
            return None;
        }
        let permit = eager.slots.clone().try_acquire_owned().ok()?;
        Some((eager, permit))
    }

    /// After a trigger committed its run: hands it to the scheduler when it took a slot, else
    /// wakes the claimer. (A run the scheduler can no longer take — it is shutting down — keeps
    /// its lease until it expires, and is claimed then, as after a crash.)
    fn start(
        &self,
        slot: Option<(EagerStart, tokio::sync::OwnedSemaphorePermit)>,
        run: RunRecord,
        execution: &ExecutionRecord,
    ) {
        match slot {
            Some((eager, permit)) => {
                let _ = eager.runs.send(Started {
                    run,
                    execution: execution.clone(),
                    permit,
                });
            }
            None => self.inner.wake.notify_waiters(),
        }
    }

    /// Claims due runs and activates them, one after the other; returns how many ran.
    pub async fn run_once(&self) -> Result<usize, EngineError> {
        let now = self.now();
        let runs = self
            .inner
            .store
            .claim_runs(
                &self.inner.config.node_id,
                now,
                self.inner.config.lease_ms,
                8,
            )
            .await?;
        let n = runs.len();
        for run in runs {
            self.activate(run, None).await;
        }
        Ok(n)
    }

    /// Runs due work until none is left (tests and tools; servers use [`Engine::spawn_workers`]).
    pub async fn run_until_idle(&self) -> Result<usize, EngineError> {
        let mut total = 0;
        loop {
            let n = self.run_once().await?;
            if n == 0 {
                return Ok(total);
            }
            total += n;
        }
    }

    /// Starts the node's scheduler: one claimer that takes due runs in batches (as many as there
    /// are free worker slots) and activates each on its own task, at most `config.workers` at
    /// once, until `shutdown` flips. One claimer per node keeps idle polling off SQLite's single
    /// writer; a trigger or command wakes it at once. A trigger that finds a slot free starts its
    /// run itself ([`EagerStart`]) and the claimer only takes the task over.
    pub fn spawn_workers(
        &self,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let engine = self.clone();
        let workers = self.inner.config.workers.max(1);
        let slots = Arc::new(tokio::sync::Semaphore::new(workers));
        let (runs, mut started) = tokio::sync::mpsc::unbounded_channel::<Started>();
        *self
            .inner
            .eager
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(EagerStart {
            slots: slots.clone(),
            runs,
        });
        let handle = tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            // Whether runs may be due that no claim has taken yet: set by a wake-up or a poll,
            // cleared by a claim that found fewer than it could take. A slot that frees up
            // claims only then (with triggers starting their own runs, most finished tasks
            // leave nothing behind to claim).
            let mut backlog = true;
            'claims: loop {
                if *shutdown.borrow() {
                    break;
                }
                // Listen for wake-ups before claiming, so a trigger that lands while the claim
                // runs is not missed (it would otherwise wait for the next poll).
                let woken = engine.inner.wake.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                // The slots are taken before the claim, so a trigger cannot take one between
                // the claim and its run's start (the claimer must never wait for a slot: the
                // runs that would free one may be waiting in its own inbox).
                let permits: Vec<_> = if backlog {
                    std::iter::from_fn(|| slots.clone().try_acquire_owned().ok()).collect()
                } else {
                    Vec::new()
                };
                let free = permits.len();
                if free > 0 {
                    let now = engine.now();
                    match engine
                        .inner
                        .store
                        .claim_runs(
                            &engine.inner.config.node_id,
                            now,
                            engine.inner.config.lease_ms,
                            free as i64,
                        )
                        .await
                    {
                        Ok(runs) => {
                            // Fewer than asked for: nothing else is due now, so wait for a
                            // wake-up instead of claiming again at once (an empty claim is
                            // still a write statement on SQLite's single writer).
                            backlog = runs.len() >= free;
                            for (run, permit) in runs.into_iter().zip(permits) {
                                let engine = engine.clone();
                                tasks.spawn(async move {
                                    engine.activate(run, None).await;
                                    drop(permit);
                                });
                            }
                            if backlog {
                                continue;
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "claiming runs failed; retrying"),
                    }
                }
                let poll = tokio::time::sleep(engine.inner.config.poll);
                tokio::pin!(poll);
                loop {
                    tokio::select! {
                        () = &mut poll => backlog = true,
                        () = &mut woken => backlog = true,
                        // Also when the sender is gone (a panicking owner): that means stop
                        // too, and waiting on a closed channel would return at once, forever.
                        _ = shutdown.wait_for(|s| *s) => break 'claims,
                        Some(_) = tasks.join_next() => {}
                        Some(Started { run, execution, permit }) = started.recv() => {
                            let engine = engine.clone();
                            tasks.spawn(async move {
                                engine.activate(run, Some(execution)).await;
                                drop(permit);
                            });
                            continue;
                        }
                    }
                    continue 'claims;
                }
            }
            // Triggers stop handing runs over; those already handed over run like claimed ones.
            started.close();
            while let Ok(Started {
                run,
                execution,
                permit,
            }) = started.try_recv()
            {
                let engine = engine.clone();
                tasks.spawn(async move {
                    engine.activate(run, Some(execution)).await;
                    drop(permit);
                });
            }
            while tasks.join_next().await.is_some() {}
        });
        vec![handle]
    }

    /// One activation of a claimed run, and what its outcome means for the execution.
    /// `fresh`: the execution a trigger of this node has just written with the run (nothing to
    /// read back, no journal yet).
    async fn activate(&self, run: RunRecord, fresh: Option<ExecutionRecord>) {
        let run_id = run.id.clone();
        if let Err(e) = self.activate_inner(run, fresh).await {
            match e {
                EngineError::Store(StoreError::LeaseLost) => {
                    tracing::info!(run = %run_id, "lease lost; another node has the run")
                }
                e => {
                    tracing::warn!(run = %run_id, error = %e, "activation failed; the run will be retried");
                    let _ = self
                        .inner
                        .store
                        .apply(
                            None,
                            vec![Write::UpdateRun(RunPatch {
                                id: run_id,
                                wake_ms: Some(self.now() + 1_000),
                                release_lease: true,
                                ..RunPatch::default()
                            })],
                        )
                        .await;
                }
            }
        }
    }

    async fn activate_inner(
        &self,
        run: RunRecord,
        fresh: Option<ExecutionRecord>,
    ) -> Result<(), EngineError> {
        let store = &self.inner.store;
        let is_fresh = fresh.is_some();
        let execution = match fresh {
            Some(execution) => execution,
            None => match store.execution(&run.execution_id).await? {
                Some(execution) => execution,
                None => return self.finish_run(&run, vec![]).await,
            },
        };
        if run.kind == RunKind::Rollback {
            return self.roll_back(run, execution).await;
        }
        if run.cancel_requested {
            return self.finish_cancel(&execution, &run).await;
        }
        if execution.status.is_terminal() || execution.status == ExecutionStatus::Paused {
            return self.finish_run(&run, vec![]).await;
        }
        let Some(workflow) = self.build(&run.digest) else {
            let now = self.now();
            let reason = format!(
                "component {} is not loaded",
                &run.digest[..12.min(run.digest.len())]
            );
            let writes = vec![
                Write::UpdateExecution(ExecutionPatch {
                    id: execution.id.clone(),
                    status: Some(ExecutionStatus::Paused),
                    status_reason: Some(Some("component_missing".to_owned())),
                    ..ExecutionPatch::default()
                }),
                Write::Event(event(
                    &execution,
                    "ExecutionPaused",
                    "paused",
                    json!({"reason": "component_missing", "message": reason}),
                    now,
                )),
            ];
            return self.finish_run(&run, writes).await;
        };

        // queued/waiting → running (a fresh run's trigger committed that itself)
        if !is_fresh {
            let mut start = vec![
                Write::UpdateExecution(ExecutionPatch {
                    id: execution.id.clone(),
                    expect: Some(vec![
                        ExecutionStatus::Queued,
                        ExecutionStatus::Waiting,
                        ExecutionStatus::Running,
                    ]),
                    status: Some(ExecutionStatus::Running),
                    ..ExecutionPatch::default()
                }),
                Write::RestageAll {
                    execution_id: execution.id.clone(),
                    from: StageStatus::Waiting,
                    to: StageStatus::Running,
                },
                settle(
                    &execution.id,
                    CommandStatus::Queued,
                    CommandStatus::Active,
                    self.now(),
                    None,
                ),
            ];
            if execution.status != ExecutionStatus::Running {
                start.push(Write::Event(event(
                    &execution,
                    "ExecutionStarted",
                    "running",
                    json!({"workflowRunId": run.id}),
                    self.now(),
                )));
            }
            match store
                .apply(Some(&self.inner.fence(&run.id, None)), start)
                .await
            {
                Ok(()) => {}
                Err(StoreError::Canceled) => return self.finish_cancel(&execution, &run).await,
                Err(StoreError::Conflict(_)) => return self.finish_run(&run, vec![]).await,
                Err(e) => return Err(e.into()),
            }
        }
        let mut execution = execution;
        execution.status = ExecutionStatus::Running;

        let replay = if is_fresh {
            ReplayState::default()
        } else {
            store.replay_state(&run.id, &execution.id).await?
        };
        // Before the first provider call: every answer of this activation is given under this
        // epoch or a later one, so its commits are refused if a write behind one failed.
        let behind = store.behind_epoch();
        let state = Arc::new(tokio::sync::Mutex::new(host::Activation {
            behind,
            journal: replay.journal,
            waits: replay.waits,
            stages: replay.stages,
            run: run.clone(),
            execution: execution.clone(),
            cursor: 0,
            pending: Vec::new(),
            suspension: None,
            fenced_out: None,
            point_of_no_return: workflow.descriptor.point_of_no_return.clone(),
        }));
        let journal_host = host::JournalHost {
            inner: self.inner.clone(),
            state: state.clone(),
        };
        let input = execution.input_json.to_string();
        let span = tracing::info_span!("run", run = %run.id, execution = %execution.id, workflow = %execution.workflow);
        let outcome = {
            let _entered = span.enter();
            workflow.activate(
                &self.inner.runtime,
                Box::new(journal_host),
                seed_of(&run.id),
                &input,
            )
        }
        .await;
        let mut st = state.lock().await;
        let execution = st.execution.clone();
        let now = self.now();
        let mut writes = std::mem::take(&mut st.pending);
        let running_stage = st
            .stages
            .iter()
            .rev()
            .find(|s| s.status == StageStatus::Running)
            .cloned();
        match outcome {
            Outcome::Completed(Ok(output)) => {
                let output: Value = serde_json::from_str(&output).unwrap_or(Value::Null);
                let outcome = output.get("outcome").cloned();
                writes.push(Write::UpdateExecution(ExecutionPatch {
                    id: execution.id.clone(),
                    status: Some(ExecutionStatus::Succeeded),
                    status_reason: Some(None),
                    current_stage: Some(None),
                    finished_ms: Some(Some(now)),
                    output_json: Some(output),
                    outcome_json: outcome,
                    ..ExecutionPatch::default()
                }));
                writes.push(Write::Event(event(
                    &execution,
                    "ExecutionSucceeded",
                    "succeeded",
                    json!({}),
                    now,
                )));
                self.end_run(&run, writes, behind).await
            }
            Outcome::Completed(Err(error)) => {
                // A cooperative workflow that stops because it was asked to ends `canceled`.
                let stopped_on_request = error.kind == ErrorKind::Permanent
                    && error.code == "canceled"
                    && self.cancel_mode(Some(&run), &execution.workflow) == CancelMode::Cooperative;
                let (status, ty) = match error.kind {
                    _ if stopped_on_request => (ExecutionStatus::Canceled, "ExecutionCanceled"),
                    ErrorKind::Transient => (ExecutionStatus::Paused, "ExecutionPaused"),
                    ErrorKind::Permanent => (ExecutionStatus::Failed, "ExecutionFailed"),
                };
                let error_json = json!({"error": error.code, "message": error.message, "kind": if error.is_transient() { "transient" } else { "permanent" }});
                if let Some(mut stage) = running_stage {
                    stage.status = StageStatus::Failed;
                    stage.finished_ms = Some(now);
                    stage.error_json = Some(error_json.clone());
                    writes.push(Write::PutStage(stage));
                }
                writes.push(Write::UpdateExecution(ExecutionPatch {
                    id: execution.id.clone(),
                    status: Some(status),
                    status_reason: Some(Some(error.code.clone())),
                    finished_ms: Some((status != ExecutionStatus::Paused).then_some(now)),
                    ..ExecutionPatch::default()
                }));
                writes.push(Write::Event(event(
                    &execution,
                    ty,
                    status.as_str(),
                    json!({"reason": error.code, "error": error_json}),
                    now,
                )));
                self.end_run(&run, writes, behind).await
            }
            Outcome::Interrupted(Interrupt::Suspend(_)) => {
                let suspension = st.suspension.unwrap_or(Suspension {
                    wake_ms: Some(now),
                    kind: WaitKind::Timer,
                });
                if let Some(mut stage) = running_stage {
                    stage.status = StageStatus::Waiting;
                    writes.push(Write::PutStage(stage));
                }
                writes.push(Write::UpdateExecution(ExecutionPatch {
                    id: execution.id.clone(),
                    status: Some(ExecutionStatus::Waiting),
                    ..ExecutionPatch::default()
                }));
                let waiting_for = match suspension.kind {
                    WaitKind::Timer => "timer",
                    WaitKind::Approval => "approval",
                    WaitKind::Convergence => "convergence",
                };
                writes.push(Write::Event(event(
                    &execution,
                    "ExecutionWaiting",
                    "waiting",
                    json!({"waitingFor": waiting_for}),
                    now,
                )));
                let (state, wake) = match suspension.wake_ms {
                    Some(wake) => (RunState::Runnable, wake),
                    None => (RunState::Waiting, now),
                };
                writes.push(Write::UpdateRun(RunPatch {
                    id: run.id.clone(),
                    state: Some(state),
                    wake_ms: Some(wake),
                    release_lease: true,
                    ..RunPatch::default()
                }));
                self.commit_end(&run, writes, behind).await
            }
            Outcome::Interrupted(Interrupt::Cancel) => {
                drop(st);
                // What the activation did before it stopped is kept: its receipts.
                writes.retain(|w| matches!(w, Write::InsertReceipt(_)));
                self.finish_cancel_keeping(&execution, &run, writes).await
            }
            Outcome::Interrupted(Interrupt::Nondeterminism(message)) => {
                tracing::warn!(run = %run.id, %message, "nondeterministic replay: execution paused");
                let writes = vec![
                    Write::UpdateExecution(ExecutionPatch {
                        id: execution.id.clone(),
                        status: Some(ExecutionStatus::Paused),
                        status_reason: Some(Some("nondeterministic_replay".to_owned())),
                        ..ExecutionPatch::default()
                    }),
                    Write::Event(event(
                        &execution,
                        "ExecutionPaused",
                        "paused",
                        json!({"reason": "nondeterministic_replay", "message": message}),
                        now,
                    )),
                ];
                self.end_run(&run, writes, behind).await
            }
            Outcome::Interrupted(Interrupt::Host(message)) => {
                if matches!(st.fenced_out, Some(StoreError::LeaseLost)) {
                    return Ok(());
                }
                Err(EngineError::Store(StoreError::Unavailable(message)))
            }
            Outcome::Limit(limit) => {
                self.fail_guest(
                    &run,
                    &execution,
                    running_stage,
                    writes,
                    "limit_exceeded",
                    limit.to_string(),
                    now,
                    behind,
                )
                .await
            }
            Outcome::Trapped(message) => {
                self.fail_guest(
                    &run,
                    &execution,
                    running_stage,
                    writes,
                    "guest_trap",
                    message,
                    now,
                    behind,
                )
                .await
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn fail_guest(
        &self,
        run: &RunRecord,
        execution: &ExecutionRecord,
        running_stage: Option<StageRecord>,
        mut writes: Vec<Write>,
        code: &str,
        message: String,
        now: Millis,
        behind: Option<u64>,
    ) -> Result<(), EngineError> {
        let error_json = json!({"error": code, "message": message, "kind": "permanent"});
        if let Some(mut stage) = running_stage {
            stage.status = StageStatus::Failed;
            stage.finished_ms = Some(now);
            stage.error_json = Some(error_json.clone());
            writes.push(Write::PutStage(stage.clone()));
            writes.push(Write::Event(event(
                execution,
                "StageFailed",
                "failed",
                json!({"stage": stage.stage_name, "error": error_json}),
                now,
            )));
        }
        writes.push(Write::UpdateExecution(ExecutionPatch {
            id: execution.id.clone(),
            status: Some(ExecutionStatus::Failed),
            status_reason: Some(Some(code.to_owned())),
            finished_ms: Some(Some(now)),
            ..ExecutionPatch::default()
        }));
        writes.push(Write::Event(event(
            execution,
            "ExecutionFailed",
            "failed",
            json!({"reason": code, "error": error_json}),
            now,
        )));
        self.end_run(run, writes, behind).await
    }

    /// Commits the activation's last writes and marks the run done.
    async fn end_run(
        &self,
        run: &RunRecord,
        mut writes: Vec<Write>,
        behind: Option<u64>,
    ) -> Result<(), EngineError> {
        writes.push(Write::UpdateRun(RunPatch {
            id: run.id.clone(),
            state: Some(RunState::Done),
            release_lease: true,
            ..RunPatch::default()
        }));
        self.commit_end(run, writes, behind).await
    }

    async fn commit_end(
        &self,
        run: &RunRecord,
        mut writes: Vec<Write>,
        behind: Option<u64>,
    ) -> Result<(), EngineError> {
        writes.push(settle(
            &run.execution_id,
            CommandStatus::Active,
            CommandStatus::Completed,
            self.now(),
            None,
        ));
        events::stamp_published(&mut writes, self.now());
        let receipts: Vec<Write> = writes
            .iter()
            .filter(|w| matches!(w, Write::InsertReceipt(_)))
            .cloned()
            .collect();
        match self
            .inner
            .store
            .apply(Some(&self.inner.fence(&run.id, behind)), writes)
            .await
        {
            Ok(()) => Ok(()),
            Err(StoreError::Canceled) => {
                let execution = self.get(&run.execution_id).await?;
                self.finish_cancel_keeping(&execution, run, receipts).await
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Ends a run that did not execute (its execution was no longer runnable, or its component
    /// is missing): a command that re-queued it failed.
    async fn finish_run(&self, run: &RunRecord, mut writes: Vec<Write>) -> Result<(), EngineError> {
        writes.push(settle(
            &run.execution_id,
            CommandStatus::Queued,
            CommandStatus::Failed,
            self.now(),
            Some("the re-queued run stopped before it ran".to_owned()),
        ));
        writes.push(Write::UpdateRun(RunPatch {
            id: run.id.clone(),
            state: Some(RunState::Done),
            release_lease: true,
            ..RunPatch::default()
        }));
        self.inner
            .store
            .apply(None, writes)
            .await
            .map_err(Into::into)
    }
}
