//! `resume` and the recovery operations (`retry-finalization`, ...): commands of the run's lane
//! that re-queue it, replaying what it did before the point they resume from.

use crate::events::event;
use crate::*;
use capstan_core::transitions::{Answer, Facts, On, Row};

impl Engine {
    /// A pending command of the execution, if any.
    pub(crate) async fn pending_command(
        &self,
        id: &str,
    ) -> Result<Option<CommandRecord>, EngineError> {
        Ok(self
            .inner
            .store
            .commands(id)
            .await?
            .into_iter()
            .rev()
            .find(|c| c.status.is_pending()))
    }

    pub(crate) fn new_command(
        &self,
        execution_id: &str,
        operation: &str,
        status: CommandStatus,
    ) -> CommandRecord {
        CommandRecord {
            id: capstan_core::ids::new_id(),
            execution_id: execution_id.to_owned(),
            operation: operation.to_owned(),
            status,
            created_ms: self.now(),
            finished_ms: None,
            error: None,
        }
    }

    /// Re-queues a run from `from_seq` of its journal (entries before it replay, the rest runs
    /// live), moving the execution to the status `row` names, with the row's events.
    async fn requeue(
        &self,
        execution: &ExecutionRecord,
        row: &Row,
        operation: &str,
        from_seq: Option<i64>,
        expect: Vec<ExecutionStatus>,
        mut extra: Vec<Write>,
    ) -> Result<CommandOutcome, EngineError> {
        let now = self.now();
        // Queued until a worker claims the run, active while it runs, completed when it stops:
        // a repeat of the command finds it pending instead of guessing.
        let command = self.new_command(&execution.id, operation, CommandStatus::Queued);
        let mut writes = Vec::new();
        if let Some(seq) = from_seq {
            writes.push(Write::TruncateJournal {
                run_id: execution.run_id.clone(),
                from_seq: seq,
            });
        }
        writes.append(&mut extra);
        let to = row.to.unwrap_or(execution.status);
        writes.extend([
            Write::UpdateExecution(ExecutionPatch {
                id: execution.id.clone(),
                expect: Some(expect),
                status: Some(to),
                status_reason: Some(None),
                finished_ms: Some(None),
                ..ExecutionPatch::default()
            }),
            Write::UpdateRun(RunPatch {
                id: execution.run_id.clone(),
                state: Some(RunState::Runnable),
                wake_ms: Some(now),
                cancel_requested: Some(false),
                release_lease: true,
            }),
            Write::PutCommand(command.clone()),
        ]);
        for name in row.events {
            let data = match *name {
                "CommandQueued" => json!({"commandId": command.id, "operation": operation}),
                _ => json!({"workflowRunId": execution.run_id}),
            };
            writes.push(Write::Event(event(execution, name, to.as_str(), data, now)));
        }
        match self.inner.apply(None, writes).await {
            Ok(()) => {}
            Err(StoreError::Conflict(m)) => return Err(invalid("state_changed", m)),
            Err(e) => return Err(e.into()),
        }
        Ok(CommandOutcome {
            command: Some(command),
            execution: self.get(&execution.id).await?,
            reused: false,
            immediate: false,
        })
    }

    /// The pending command as the answer to a repeat of it.
    fn pending_answer(
        &self,
        execution: ExecutionRecord,
        pending: Option<CommandRecord>,
    ) -> CommandOutcome {
        CommandOutcome {
            command: pending,
            execution,
            reused: true,
            immediate: false,
        }
    }

    /// Resumes a paused execution (or a failed/canceled one whose workflow declares it resumable):
    /// the failed call is attempted again; everything before it replays.
    pub async fn resume(&self, id: &str) -> Result<CommandOutcome, EngineError> {
        let execution = self.get(id).await?;
        let pending = self.pending_command(id).await?;
        let run = self.inner.store.run(&execution.run_id).await?;
        let facts = Facts {
            pending: pending.as_ref().map(|c| c.operation.clone()),
            resumable_when_failed: run
                .as_ref()
                .and_then(|r| self.build(&r.digest))
                .is_some_and(|w| w.descriptor.resumable_when_failed),
            ..Facts::default()
        };
        let status = execution.status;
        let row = super::decide(On::Resume, status, &facts, |reason| match reason {
            "command_pending" => format!(
                "a {} command is pending",
                facts.pending.as_deref().unwrap_or_default()
            ),
            _ => format!("execution is {status}; only paused executions can be resumed"),
        })?;
        if row.answer == Answer::Pending {
            return Ok(self.pending_answer(execution, pending));
        }
        let journal = self.inner.store.journal(&execution.run_id).await?;
        let from = resume_point(&journal);
        let stages = self.inner.store.stages(id).await?;
        let mut extra = Vec::new();
        if let Some(mut stage) = stages
            .into_iter()
            .rev()
            .find(|s| s.status == StageStatus::Failed)
        {
            stage.status = StageStatus::Running;
            stage.finished_ms = None;
            stage.error_json = None;
            extra.push(Write::PutStage(stage));
        }
        if execution.cancellation_requested_ms.is_some() {
            // A resumed run is no longer asked to stop (its answer is re-read, not replayed).
            extra.push(Write::UpdateExecution(ExecutionPatch {
                id: execution.id.clone(),
                cancellation_requested_ms: Some(None),
                ..ExecutionPatch::default()
            }));
        }
        self.requeue(&execution, row, "resume", from, vec![status], extra)
            .await
    }

    /// A recovery operation declared by the workflow (`retry-finalization`, ...): re-runs the run
    /// from the declared stage with every earlier output replayed, not repeated. Where it applies
    /// (statuses, outcome) is the workflow's declaration.
    pub async fn recover(&self, id: &str, operation: &str) -> Result<CommandOutcome, EngineError> {
        let execution = self.get(id).await?;
        let pending = self.pending_command(id).await?;
        let run = self.inner.store.run(&execution.run_id).await?;
        let workflow = run.as_ref().and_then(|r| self.build(&r.digest));
        let recovery = workflow.as_ref().and_then(|w| {
            w.descriptor
                .recovery_operations
                .iter()
                .find(|r| r.name == operation)
                .cloned()
        });
        let from = match (&run, &recovery) {
            (Some(run), Some(recovery)) => self
                .inner
                .store
                .journal(&run.id)
                .await?
                .iter()
                .rev()
                .find(|e| {
                    e.op == "context.stage-begin"
                        && e.request.value().get("name").and_then(Value::as_str)
                            == Some(recovery.from_stage.as_str())
                })
                .map(|e| e.seq),
            _ => None,
        };
        let status = execution.status;
        let facts = Facts {
            pending: pending.as_ref().map(|c| c.operation.clone()),
            operation: Some(operation.to_owned()),
            no_source_run: run.is_none(),
            component_missing: workflow.is_none(),
            not_declared: recovery.is_none(),
            not_eligible: recovery.as_ref().is_some_and(|r| {
                let outcome = execution.outcome_json.as_ref().map(JsonText::value);
                !r.applies(status, outcome.as_ref())
            }),
            stage_not_reached: from.is_none(),
            ..Facts::default()
        };
        let row = super::decide(On::Recover, status, &facts, |reason| match reason {
            "command_pending" => format!(
                "a {} command is pending",
                facts.pending.as_deref().unwrap_or_default()
            ),
            "no_source_run" => "the execution has no source run".to_owned(),
            "component_missing" => "the run's component is not loaded".to_owned(),
            "not_supported" => format!(
                "workflow {} does not declare {operation}",
                execution.workflow
            ),
            _ if facts.not_eligible => format!(
                "execution is {status}; {operation} does not apply to it{}",
                recovery
                    .as_ref()
                    .and_then(|r| r.when_outcome.as_ref())
                    .map(|c| format!(" (it needs {} = {} in the outcome)", c.pointer, c.equals))
                    .unwrap_or_default()
            ),
            _ => format!(
                "the run never reached stage {}",
                recovery
                    .as_ref()
                    .map(|r| r.from_stage.as_str())
                    .unwrap_or_default()
            ),
        })?;
        if row.answer == Answer::Pending {
            return Ok(self.pending_answer(execution, pending));
        }
        self.requeue(&execution, row, operation, from, vec![status], Vec::new())
            .await
    }
}
