//! Where an execution's time goes: wrappers that add up the time spent in the store and in the
//! providers, so the bench can report storage vs wasmtime-and-engine shares. With one worker the
//! split is close but not exact: the node's claimer calls the store concurrently with the worker,
//! so on a busy machine the store share can read above its true value.

use async_trait::async_trait;
use capstan_core::CapabilityError;
use capstan_core::store::*;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Nanoseconds spent in each layer.
#[derive(Debug, Default)]
pub struct Spent {
    pub store_ns: AtomicU64,
    pub store_writes: AtomicU64,
    pub providers_ns: AtomicU64,
}

impl Spent {
    fn add(counter: &AtomicU64, since: Instant) {
        counter.fetch_add(
            u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

#[derive(Debug)]
pub struct TimedStore<S> {
    pub inner: S,
    pub spent: Arc<Spent>,
}

macro_rules! timed {
    ($self:ident, $call:expr) => {{
        let t = Instant::now();
        let r = $call.await;
        Spent::add(&$self.spent.store_ns, t);
        r
    }};
}

#[async_trait]
impl<S: EngineStore> RunStore for TimedStore<S> {
    async fn apply(&self, fence: Option<&Fence>, writes: Vec<Write>) -> Result<(), StoreError> {
        self.spent.store_writes.fetch_add(1, Ordering::Relaxed);
        timed!(self, self.inner.apply(fence, writes))
    }
    fn activation_began(&self, run_id: &str) {
        self.inner.activation_began(run_id)
    }
    fn activation_ended(&self, run_id: &str) {
        self.inner.activation_ended(run_id)
    }
    async fn run(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        timed!(self, self.inner.run(id))
    }
    async fn claim_runs(
        &self,
        owner: &str,
        now_ms: Millis,
        lease_ms: Millis,
        limit: i64,
    ) -> Result<Vec<RunRecord>, StoreError> {
        timed!(self, self.inner.claim_runs(owner, now_ms, lease_ms, limit))
    }
    async fn next_wake(&self) -> Result<Option<Millis>, StoreError> {
        timed!(self, self.inner.next_wake())
    }
    async fn journal(&self, run_id: &str) -> Result<Vec<JournalEntry>, StoreError> {
        timed!(self, self.inner.journal(run_id))
    }
    async fn waits(&self, run_id: &str) -> Result<Vec<WaitRecord>, StoreError> {
        timed!(self, self.inner.waits(run_id))
    }
    async fn replay_state(
        &self,
        run_id: &str,
        execution_id: &str,
    ) -> Result<ReplayState, StoreError> {
        timed!(self, self.inner.replay_state(run_id, execution_id))
    }
}

#[async_trait]
impl<S: EngineStore> ExecutionReads for TimedStore<S> {
    async fn execution(&self, id: &str) -> Result<Option<ExecutionRecord>, StoreError> {
        timed!(self, self.inner.execution(id))
    }
    async fn execution_workflow(&self, id: &str) -> Result<Option<String>, StoreError> {
        timed!(self, self.inner.execution_workflow(id))
    }
    async fn list_executions(
        &self,
        filter: &ExecutionFilter,
    ) -> Result<Vec<ExecutionRecord>, StoreError> {
        timed!(self, self.inner.list_executions(filter))
    }
    async fn stages(&self, execution_id: &str) -> Result<Vec<StageRecord>, StoreError> {
        timed!(self, self.inner.stages(execution_id))
    }
    async fn receipts(&self, execution_id: &str) -> Result<Vec<Receipt>, StoreError> {
        timed!(self, self.inner.receipts(execution_id))
    }
    async fn commands(&self, execution_id: &str) -> Result<Vec<CommandRecord>, StoreError> {
        timed!(self, self.inner.commands(execution_id))
    }
    async fn events(&self, execution_id: &str) -> Result<Vec<OutboxRecord>, StoreError> {
        timed!(self, self.inner.events(execution_id))
    }
    async fn idempotency(
        &self,
        principal_id: &str,
        workflow: &str,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        timed!(self, self.inner.idempotency(principal_id, workflow, key))
    }
}

#[derive(Debug)]
pub struct TimedProviders<P> {
    pub inner: P,
    pub spent: Arc<Spent>,
}

#[async_trait]
impl<P: capstan_engine::Providers> capstan_engine::Providers for TimedProviders<P> {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Result<Value, CapabilityError> {
        let t = Instant::now();
        let r = self.inner.call(op, request, token).await;
        Spent::add(&self.spent.providers_ns, t);
        r
    }
}
