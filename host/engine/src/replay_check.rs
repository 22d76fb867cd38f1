//! `capstan workflows check`: would a candidate build of a workflow replay the journals of the
//! runs in flight? Each non-terminal run's journal is replayed against the candidate with a host
//! that answers only from the journal: a call that differs from the recorded one (operation or
//! request) is a divergence; reaching the end of the journal means the candidate could adopt the
//! run from where it stands.

use crate::{Engine, EngineError, seed_of};
use async_trait::async_trait;
use capstan_core::execution::ExecutionStatus;
use capstan_core::store::{EntryStatus, ExecutionFilter, JournalEntry};
use capstan_runtime::{Answer, HostCalls, Interrupt, LoadedWorkflow, Outcome, Request};
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;

/// The verdict for one run.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunCheck {
    pub execution_id: String,
    pub workflow_run_id: String,
    pub status: ExecutionStatus,
    /// Recorded host calls the candidate replayed identically.
    pub replayed: usize,
    pub journal_length: usize,
    /// `compatible` or `diverges`.
    pub verdict: &'static str,
    /// The run is pinned to this very build already.
    pub same_build: bool,
    /// What differed, for a divergence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Answers from a recorded journal only.
struct ReplayOnly {
    journal: Vec<JournalEntry>,
    cursor: usize,
}

#[async_trait]
impl HostCalls for ReplayOnly {
    async fn call(&mut self, op: &'static str, request: Request) -> Result<Answer, Interrupt> {
        let Some(entry) = self.journal.get(self.cursor) else {
            return Err(Interrupt::Suspend("end of the journal".to_owned()));
        };
        if entry.op != op || entry.request != request.text {
            return Err(Interrupt::Nondeterminism(format!(
                "call {}: recorded `{}` {} but the candidate calls `{op}` {request}",
                entry.seq, entry.op, entry.request
            )));
        }
        if entry.status != EntryStatus::Done {
            // An effect in flight or a wait: the recorded history ends here.
            return Err(Interrupt::Suspend("end of the recorded history".to_owned()));
        }
        self.cursor += 1;
        Ok(entry
            .response
            .clone()
            .map_or(Answer::Value(Value::Null), Answer::Text))
    }
}

impl Engine {
    /// Replays every non-terminal run of `candidate`'s workflow against it.
    pub async fn check_candidate(
        &self,
        candidate: Arc<LoadedWorkflow>,
    ) -> Result<Vec<RunCheck>, EngineError> {
        let name = candidate.descriptor.name.clone();
        let mut checks = Vec::new();
        for status in [
            ExecutionStatus::Queued,
            ExecutionStatus::Running,
            ExecutionStatus::Waiting,
            ExecutionStatus::Paused,
        ] {
            let executions = self
                .inner
                .store
                .list_executions(&ExecutionFilter {
                    workflows: Some(vec![name.clone()]),
                    status: Some(status),
                    principal_id: None,
                    limit: 10_000,
                })
                .await?;
            for execution in executions {
                if let Some(check) = self.check_execution(&candidate, &execution).await? {
                    checks.push(check);
                }
            }
        }
        Ok(checks)
    }

    /// Replays one execution's journal against `candidate` (any status; the bench uses it to
    /// measure replay cost on finished runs).
    pub async fn check_execution(
        &self,
        candidate: &LoadedWorkflow,
        execution: &capstan_core::store::ExecutionRecord,
    ) -> Result<Option<RunCheck>, EngineError> {
        let Some(run) = self.inner.store.run(&execution.run_id).await? else {
            return Ok(None);
        };
        let journal = self.inner.store.journal(&run.id).await?;
        let journal_length = journal.len();
        let mut check = RunCheck {
            execution_id: execution.id.clone(),
            workflow_run_id: run.id.clone(),
            status: execution.status,
            replayed: 0,
            journal_length,
            verdict: "compatible",
            same_build: false,
            detail: None,
        };
        let same_build = run.digest == candidate.digest;
        let replayed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let host = Counting {
            inner: ReplayOnly { journal, cursor: 0 },
            replayed: replayed.clone(),
        };
        let input = execution.input_json.as_str();
        let activation = candidate
            .activate(&self.inner.runtime, Box::new(host), seed_of(&run.id), input)
            .await;
        check.replayed = replayed.load(std::sync::atomic::Ordering::Relaxed);
        check.same_build = same_build;
        match activation {
            Outcome::Interrupted(Interrupt::Suspend(_)) => {}
            Outcome::Completed(_) if check.replayed == journal_length => {}
            Outcome::Completed(_) => {
                check.verdict = "diverges";
                check.detail = Some(format!(
                    "the candidate finishes after {} of {journal_length} recorded calls",
                    check.replayed
                ));
            }
            Outcome::Interrupted(Interrupt::Nondeterminism(detail)) => {
                check.verdict = "diverges";
                check.detail = Some(detail);
            }
            Outcome::Interrupted(other) => {
                check.verdict = "diverges";
                check.detail = Some(other.to_string());
            }
            Outcome::Limit(limit) => {
                check.verdict = "diverges";
                check.detail = Some(format!("sandbox limit: {limit}"));
            }
            Outcome::Trapped(trap) => {
                check.verdict = "diverges";
                check.detail = Some(format!("trap: {trap}"));
            }
        }
        Ok(Some(check))
    }
}

/// Counts the calls the candidate replayed identically.
struct Counting {
    inner: ReplayOnly,
    replayed: Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait]
impl HostCalls for Counting {
    async fn call(&mut self, op: &'static str, request: Request) -> Result<Answer, Interrupt> {
        let answer = self.inner.call(op, request).await;
        self.replayed
            .store(self.inner.cursor, std::sync::atomic::Ordering::Relaxed);
        answer
    }
}
