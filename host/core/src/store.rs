//! The storage contract of the durable engine and its records, by role: [`RunStore`] is what a
//! run's workers need (the fenced write, claims, the journal they replay), [`ExecutionReads`]
//! what the API and the control commands read; [`EngineStore`] is both, as the engine holds it.
//! The engine talks only to these, so it never sees SQL; `capstan-store` implements them once
//! for SQLite and PostgreSQL, and the same tests hold both backends to them.
//!
//! Writes are data ([`Write`]) applied atomically by [`RunStore::apply`]: stage transitions,
//! journal entries, receipts and outbox events that belong together commit in one transaction, and
//! a [`Fence`] makes the transaction fail if the writer no longer holds the run's lease, the run
//! was canceled meanwhile, or a write made behind a provider's answer failed since the activation
//! began.

use crate::execution::{ExecutionStatus, StageStatus};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionRecord {
    pub id: String,
    pub workflow: String,
    pub principal_id: String,
    pub status: ExecutionStatus,
    /// Why it is paused or failed, e.g. `nondeterministic_replay`.
    pub status_reason: Option<String>,
    pub current_stage: Option<String>,
    pub created_ms: Millis,
    pub finished_ms: Option<Millis>,
    pub cancellation_requested_ms: Option<Millis>,
    /// The trigger's input, its output and outcome, kept as their text ([`JsonText`]): a read
    /// sends them on as stored and an activation hands the input to the guest as it is.
    pub input_json: JsonText,
    pub output_json: Option<JsonText>,
    pub outcome_json: Option<JsonText>,
    /// The run serving the execution now.
    pub run_id: String,
    /// W3C trace context of the triggering request; carried on every event of the execution.
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageRecord {
    pub id: String,
    pub execution_id: String,
    pub position: i64,
    pub stage_name: String,
    pub status: StageStatus,
    pub started_ms: Millis,
    pub finished_ms: Option<Millis>,
    pub output_json: Option<JsonText>,
    pub error_json: Option<JsonText>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    Workflow,
    Rollback,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Claimable once `wake_ms` has passed.
    Runnable,
    /// Waiting for something only a command or approval can give (not claimable).
    Waiting,
    Done,
}

/// One engine instance of a workflow component, pinned to the component's digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: String,
    pub execution_id: String,
    pub workflow: String,
    pub digest: String,
    pub kind: RunKind,
    pub state: RunState,
    pub wake_ms: Millis,
    pub lease_owner: Option<String>,
    pub lease_expires_ms: Option<Millis>,
    pub activations: i64,
    pub cancel_requested: bool,
    pub created_ms: Millis,
    /// How many times the run's journal was truncated: part of every effect's idempotency token
    /// (`{run id}:{epoch}:{seq}`), so a call re-run after a truncation is a new request.
    pub epoch: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryStatus {
    /// Answered; replay returns `response`.
    Done,
    /// A side effect about to be attempted: replay repeats it with the same idempotency token.
    Intent,
    /// The run is waiting on this call (timer, approval, convergence).
    Waiting,
}

/// One host call of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub run_id: String,
    pub seq: i64,
    /// `<interface>.<function>`
    pub op: String,
    pub request: JsonText,
    pub response: Option<JsonText>,
    pub status: EntryStatus,
    pub at_ms: Millis,
}

/// `value`'s compact text, byte for byte what its `Display` (`value.to_string()`) writes, about
/// three times faster: serialised straight into a buffer rather than through `fmt`'s writer, one
/// call per token (a DNS change's request and answer: 0.31 against 1.0 µs; BENCHMARKS.md,
/// "Appendix: changes measured"). For texts bound to statements and hashed on the hot paths;
/// stored hashes of such texts keep matching, as the bytes are the same.
pub fn json_string(value: &Value) -> String {
    // Serialising a `Value` cannot fail: its object keys are strings.
    serde_json::to_string(value).unwrap_or_default()
}

/// A JSON value kept as its text, as a journal entry holds its request and answer.
///
/// A replay compares a call's request with the recorded one and hands the recorded answer back;
/// neither is looked into on the way. Kept as text, reading a journal checks its JSON but builds
/// no trees (a fifth of a replay's CPU otherwise), and a chunk is written by copying the text.
/// Equality is the values': the same text, or else texts that parse to equal values.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JsonText(Box<serde_json::value::RawValue>);

impl JsonText {
    /// `value`'s text, compact, object keys in order (as `serde_json` writes a [`Value`]).
    pub fn new(value: &Value) -> Self {
        // Serialising a `Value` cannot fail: its object keys are strings.
        Self(
            serde_json::value::to_raw_value(value)
                .unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned()),
        )
    }

    /// `text` if it is JSON (kept as it is, not copied).
    pub fn from_text(text: String) -> Result<Self, serde_json::Error> {
        serde_json::value::RawValue::from_string(text).map(Self)
    }

    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The text, given up without a copy (to bind it to a statement).
    pub fn into_string(self) -> String {
        Box::<str>::from(self.0).into_string()
    }

    /// `text` if it is JSON, else `None`.
    pub fn parse(text: &str) -> Option<Self> {
        Self::from_text(text.to_owned()).ok()
    }

    /// The value the text stands for.
    pub fn value(&self) -> Value {
        // The text was checked as JSON when it was made or read.
        serde_json::from_str(self.0.get()).unwrap_or(Value::Null)
    }
}

impl PartialEq for JsonText {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str() || self.value() == other.value()
    }
}

impl std::fmt::Debug for JsonText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for JsonText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a side effect did, kept to undo it exactly. Its request and answer are text, as the
/// journal's: the request's is the one its call was journaled with, and a receipt is read only to
/// undo or to show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub id: String,
    pub execution_id: String,
    pub run_id: String,
    pub seq: i64,
    pub op: String,
    pub request: JsonText,
    pub response: JsonText,
    pub created_ms: Millis,
    pub compensated_ms: Option<Millis>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    Timer,
    Approval,
    Convergence,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitRecord {
    pub run_id: String,
    pub seq: i64,
    pub kind: WaitKind,
    pub name: Option<String>,
    pub digest: Option<String>,
    pub payload_json: Option<Value>,
    pub wake_ms: Option<Millis>,
    pub deadline_ms: Option<Millis>,
    pub attempts: i64,
    /// The approval body once approved.
    pub resolved_json: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandStatus {
    Queued,
    Active,
    Completed,
    Failed,
}

impl CommandStatus {
    pub fn is_pending(self) -> bool {
        matches!(self, Self::Queued | Self::Active)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandRecord {
    pub id: String,
    pub execution_id: String,
    /// `rollback`, `resume`, `retry-finalization`, `retry-maps-whitelist`, `cancel`
    pub operation: String,
    pub status: CommandStatus,
    pub created_ms: Millis,
    pub finished_ms: Option<Millis>,
    pub error: Option<String>,
}

/// An outbox row. `seq` is assigned by the store (0 before insertion).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxRecord {
    pub seq: i64,
    pub event_id: String,
    pub execution_id: String,
    pub event_type: String,
    pub event_version: String,
    pub principal_id: String,
    pub workflow: String,
    /// Kept as its text: a stream or a webhook sends it on as read, so reading an event builds
    /// no tree only to write it out again.
    pub payload_json: JsonText,
    pub occurred_ms: Millis,
    pub traceparent: Option<String>,
    pub routed_ms: Option<Millis>,
    pub stream_published_ms: Option<Millis>,
    pub dispatched_ms: Option<Millis>,
}

/// A partial update of an execution; `expect` makes it conditional on the current status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecutionPatch {
    pub id: String,
    /// Apply only if the execution is in one of these statuses (else the transaction fails
    /// with [`StoreError::Conflict`]).
    pub expect: Option<Vec<ExecutionStatus>>,
    /// Apply only if no stage of this name has begun (else [`StoreError::Conflict`]): a cancel
    /// and the commit of the workflow's point of no return exclude each other.
    pub expect_stage_not_begun: Option<String>,
    pub status: Option<ExecutionStatus>,
    pub status_reason: Option<Option<String>>,
    pub current_stage: Option<Option<String>>,
    pub finished_ms: Option<Option<Millis>>,
    /// `Some(Some(t))` records a request (the first one wins); `Some(None)` clears it.
    pub cancellation_requested_ms: Option<Option<Millis>>,
    pub output_json: Option<JsonText>,
    pub outcome_json: Option<JsonText>,
    pub run_id: Option<String>,
}

impl ExecutionPatch {
    /// Takes in an earlier patch of the same execution: the fields this one leaves alone take
    /// the earlier patch's values, so applying the result equals applying both in order. (For
    /// unconditional patches without a cancel request; see the store's `coalesce`.)
    pub fn absorb(&mut self, earlier: ExecutionPatch) {
        fn keep<T>(later: &mut Option<T>, earlier: Option<T>) {
            if later.is_none() {
                *later = earlier;
            }
        }
        keep(&mut self.status, earlier.status);
        keep(&mut self.status_reason, earlier.status_reason);
        keep(&mut self.current_stage, earlier.current_stage);
        keep(&mut self.finished_ms, earlier.finished_ms);
        keep(
            &mut self.cancellation_requested_ms,
            earlier.cancellation_requested_ms,
        );
        keep(&mut self.output_json, earlier.output_json);
        keep(&mut self.outcome_json, earlier.outcome_json);
        keep(&mut self.run_id, earlier.run_id);
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunPatch {
    pub id: String,
    pub state: Option<RunState>,
    pub wake_ms: Option<Millis>,
    pub release_lease: bool,
    pub cancel_requested: Option<bool>,
}

/// One write of an atomic batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    InsertExecution(ExecutionRecord),
    UpdateExecution(ExecutionPatch),
    PutStage(StageRecord),
    /// Stages of the execution in `status` become `to` (e.g. waiting → running on resume).
    RestageAll {
        execution_id: String,
        from: StageStatus,
        to: StageStatus,
    },
    InsertRun(RunRecord),
    UpdateRun(RunPatch),
    PutJournal(JournalEntry),
    /// Removes the run's journal entries (and waits) from `from_seq` on.
    TruncateJournal {
        run_id: String,
        from_seq: i64,
    },
    /// Shared: a commit that may be refused for a cancel keeps its receipts for the cancel's own
    /// commit ([`Write`]s are moved into the batch), and a copy of the handle costs nothing.
    InsertReceipt(std::sync::Arc<Receipt>),
    MarkCompensated {
        receipt_id: String,
        at_ms: Millis,
    },
    PutWait(WaitRecord),
    PutCommand(CommandRecord),
    /// The execution's resume and recovery commands in `from` become `to` (with `error`, and
    /// `at_ms` as their finish when `to` is final): the lane moves with the run it re-queued.
    /// A rollback's command is its own run's and is left alone.
    SettleCommands {
        execution_id: String,
        from: CommandStatus,
        to: CommandStatus,
        at_ms: Millis,
        error: Option<String>,
    },
    Event(OutboxRecord),
    /// Records an idempotency key with the execution it created, in the trigger's own batch:
    /// a second request with the key fails the batch on the key's uniqueness and replays this.
    InsertIdempotency(IdempotencyRecord),
    /// Removes a key record that no longer counts (kept past its retention, or a reservation
    /// that never completed), if it is still the one created at `created_ms`.
    DropIdempotency {
        principal_id: String,
        workflow: String,
        key: String,
        created_ms: Millis,
    },
}

/// Holds a batch to the writer's lease on a run: the batch fails if the lease was lost (another
/// node took the run over) or an immediate cancel was requested. Applying it extends the lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Fence {
    pub run_id: String,
    pub owner: String,
    pub lease_until_ms: Millis,
}

/// Filters of the executions list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecutionFilter {
    /// Only these workflows (the caller's entitlements); `None` = all.
    pub workflows: Option<Vec<String>>,
    pub status: Option<ExecutionStatus>,
    pub principal_id: Option<String>,
    pub limit: i64,
}

/// A run's journal and waits and its execution's stages, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplayState {
    pub journal: Vec<JournalEntry>,
    pub waits: Vec<WaitRecord>,
    pub stages: Vec<StageRecord>,
}

/// An idempotency key (scoped to principal and workflow) and what it answered.
#[derive(Debug, Clone, PartialEq)]
pub struct IdempotencyRecord {
    pub principal_id: String,
    pub workflow: String,
    pub key: String,
    pub body_sha256: String,
    /// `None` only for a reservation: a key recorded without the execution it creates.
    pub execution_id: Option<String>,
    pub response_json: Option<Value>,
    pub created_ms: Millis,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("the run's lease is no longer held by this node")]
    LeaseLost,
    #[error("the run was canceled")]
    Canceled,
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

/// A batch queued by [`RunStore::queue_ahead`]: resolves once it is committed (or refused).
pub type Queued =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), StoreError>> + Send>>;

/// Why [`RunStore::queue_ahead`] queued nothing.
#[derive(Debug)]
pub enum Unqueued {
    /// The store cannot queue this batch ahead: here it is back.
    Unsupported(Vec<Write>),
    /// Queuing failed (the writer is gone).
    Failed(StoreError),
}

/// What the engine's storage does for a run's workers: the atomic write under the run's
/// fence, claims, and the journal and waits a run replays.
#[async_trait]
pub trait RunStore: Send + Sync + std::fmt::Debug {
    /// Applies `writes` atomically, under `fence` if given.
    async fn apply(&self, fence: Option<&Fence>, writes: Vec<Write>) -> Result<(), StoreError>;

    /// An activation (or rollback run) of `run_id` begins on this node: the provider answers it
    /// gets from now on may be recorded by its commits under the run's [`Fence`]. A store whose
    /// providers may answer before their own writes are durable (SQLite's simulated cloud queues
    /// them ahead of the caller's next commit) refuses such a commit if one of those writes
    /// failed since, and the run replays the call; other stores have nothing to remember.
    fn activation_began(&self, _run_id: &str) {}

    /// The activation of `run_id` that [`RunStore::activation_began`] announced has ended.
    fn activation_ended(&self, _run_id: &str) {}

    /// The epoch of writes behind answers that the activation of `run_id` under way here began
    /// under ([`RunStore::activation_began`]): a provider that answers it behind its own writes
    /// ([`crate::Providers::call_behind`]) decides only while the epoch is still this one, so
    /// nothing it writes outlives a failure that refuses the activation's commits. `None` where
    /// the store writes nothing behind answers, or no activation of the run is under way.
    fn activation_epoch(&self, _run_id: &str) -> Option<u64> {
        None
    }

    /// Whether [`RunStore::queue_ahead`] can queue a batch (one small enough to group).
    fn queues_ahead(&self) -> bool {
        false
    }

    /// Queues `writes` (a trigger's: its execution, its run leased to this node) for the next
    /// group commit and returns once they are queued, with the commit's answer to await;
    /// [`Unqueued::Unsupported`] with the writes where the store cannot (no group writer, or a
    /// batch too large to group): then [`RunStore::apply`].
    ///
    /// Meant for a run that starts before its trigger is durable. The batch commits with the
    /// next group, without waiting for company: its sync overlaps the run's first steps, and the
    /// trigger answers without waiting for them. Everything the run queues commits after the
    /// batch (the group writer's queue is first in, first out), and if the batch fails, the
    /// epoch of writes behind answers moves, refusing every commit of activations begun before
    /// (the run's among them) and every write behind an answer decided under the old epoch.
    /// The run may make no effect outside the store before the batch's answer, or one of its
    /// own commits under its fence, has proved the batch durable.
    async fn queue_ahead(&self, writes: Vec<Write>) -> Result<Queued, Unqueued> {
        Err(Unqueued::Unsupported(writes))
    }

    async fn run(&self, id: &str) -> Result<Option<RunRecord>, StoreError>;
    /// Claims up to `limit` runnable runs due at `now_ms` (or whose lease expired) for `owner`.
    async fn claim_runs(
        &self,
        owner: &str,
        now_ms: Millis,
        lease_ms: Millis,
        limit: i64,
    ) -> Result<Vec<RunRecord>, StoreError>;
    /// The earliest `wake_ms` of a runnable run, if any (for the scheduler's sleep).
    async fn next_wake(&self) -> Result<Option<Millis>, StoreError>;
    async fn journal(&self, run_id: &str) -> Result<Vec<JournalEntry>, StoreError>;
    async fn waits(&self, run_id: &str) -> Result<Vec<WaitRecord>, StoreError>;
    /// What replaying a run needs: its journal and waits, and its execution's stages (one
    /// read where the backend allows).
    async fn replay_state(
        &self,
        run_id: &str,
        execution_id: &str,
    ) -> Result<ReplayState, StoreError>;
}

/// What is read of executions: the API's reads, and what a control command reads before it
/// decides. Nothing here writes.
#[async_trait]
pub trait ExecutionReads: Send + Sync + std::fmt::Debug {
    async fn execution(&self, id: &str) -> Result<Option<ExecutionRecord>, StoreError>;
    /// The workflow of execution `id`, if there is one: all that authorizing a call on it
    /// needs, read without the record's JSON.
    async fn execution_workflow(&self, id: &str) -> Result<Option<String>, StoreError>;
    /// Newest first.
    async fn list_executions(
        &self,
        filter: &ExecutionFilter,
    ) -> Result<Vec<ExecutionRecord>, StoreError>;
    async fn stages(&self, execution_id: &str) -> Result<Vec<StageRecord>, StoreError>;
    async fn receipts(&self, execution_id: &str) -> Result<Vec<Receipt>, StoreError>;
    async fn commands(&self, execution_id: &str) -> Result<Vec<CommandRecord>, StoreError>;
    /// The execution's events in order.
    async fn events(&self, execution_id: &str) -> Result<Vec<OutboxRecord>, StoreError>;
    /// The idempotency key's record, if any.
    async fn idempotency(
        &self,
        principal_id: &str,
        workflow: &str,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;
}

/// Both roles, as the engine holds its store: workers and control commands share it.
pub trait EngineStore: RunStore + ExecutionReads {}

impl<T: RunStore + ExecutionReads + ?Sized> EngineStore for T {}
