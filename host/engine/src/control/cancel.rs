//! `cancel`: immediate, requested of a worker that holds the run, or left to a cooperative
//! workflow; refused past the workflow's point of no return.

use crate::events::event;
use crate::*;
use capstan_core::transitions::{Answer, Facts, On, Row};

impl Engine {
    /// The writes of `row` (a cancel decided, or a cancel reaching the run): the execution
    /// moves from one of the row's statuses to its status, its stages and commands end with it.
    pub(crate) fn cancel_writes(
        &self,
        execution: &ExecutionRecord,
        run_id: &str,
        row: &Row,
        now: Millis,
    ) -> Vec<Write> {
        let mut writes = vec![
            Write::UpdateExecution(ExecutionPatch {
                id: execution.id.clone(),
                expect: Some(row.from.to_vec()),
                status: row.to,
                status_reason: Some(Some("canceled".to_owned())),
                finished_ms: Some(Some(now)),
                ..ExecutionPatch::default()
            }),
            Write::RestageAll {
                execution_id: execution.id.clone(),
                from: StageStatus::Running,
                to: StageStatus::Failed,
            },
            Write::RestageAll {
                execution_id: execution.id.clone(),
                from: StageStatus::Waiting,
                to: StageStatus::Failed,
            },
            Write::UpdateRun(RunPatch {
                id: run_id.to_owned(),
                state: Some(RunState::Done),
                release_lease: true,
                cancel_requested: Some(true),
                ..RunPatch::default()
            }),
            settle(
                &execution.id,
                CommandStatus::Queued,
                CommandStatus::Failed,
                now,
                Some("canceled".to_owned()),
            ),
            settle(
                &execution.id,
                CommandStatus::Active,
                CommandStatus::Failed,
                now,
                Some("canceled".to_owned()),
            ),
        ];
        writes.extend(events::moved(execution, row, json!({}), now));
        writes
    }

    pub(crate) async fn finish_cancel(
        &self,
        execution: &ExecutionRecord,
        run: &RunRecord,
    ) -> Result<(), EngineError> {
        self.finish_cancel_keeping(execution, run, Vec::new()).await
    }

    /// Cancels the execution, first committing `receipts`: the effects its last activation
    /// performed before the cancel stopped it (not committed yet, since an effect's answer rides
    /// the activation's next commit), so a rollback after the cancel undoes them too.
    pub(crate) async fn finish_cancel_keeping(
        &self,
        execution: &ExecutionRecord,
        run: &RunRecord,
        receipts: Vec<Write>,
    ) -> Result<(), EngineError> {
        if !receipts.is_empty() {
            self.inner.apply(None, receipts).await?;
        }
        if let Ok(mut local) = self.inner.local_cancels.lock() {
            local.remove(&run.id);
        }
        let Some(row) = transitions::decide(On::RunStopped, execution.status, &Facts::default())
        else {
            return self.finish_run(run, vec![]).await;
        };
        match self
            .inner
            .apply(
                None,
                self.cancel_writes(execution, &run.id, row, self.now()),
            )
            .await
        {
            Ok(()) | Err(StoreError::Conflict(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Why a cancel's commit was refused, read after the fact: the point of no return began,
    /// or the execution is no longer cancelable.
    async fn refused_now(&self, id: &str) -> Result<EngineError, EngineError> {
        let execution = self.get(id).await?;
        let run = self.inner.store.run(&execution.run_id).await?;
        let stage = run
            .as_ref()
            .and_then(|r| self.build(&r.digest))
            .or_else(|| self.workflow(&execution.workflow))
            .and_then(|w| w.descriptor.point_of_no_return.clone());
        if let Some(stage) = stage
            && self
                .inner
                .store
                .stages(id)
                .await?
                .iter()
                .any(|s| s.stage_name == stage)
        {
            return Ok(invalid(
                "past_point_of_no_return",
                format!(
                    "stage `{stage}` has begun: the provider accepted the change, so this execution can no longer be canceled"
                ),
            ));
        }
        Ok(invalid(
            "not_cancelable",
            format!("execution is {}", execution.status),
        ))
    }

    pub(crate) fn cancel_mode(&self, run: Option<&RunRecord>, workflow: &str) -> CancelMode {
        run.and_then(|r| self.build(&r.digest))
            .or_else(|| self.workflow(workflow))
            .map_or(CancelMode::Immediate, |w| w.descriptor.cancel_mode)
    }

    /// Cancels an execution: at once, or — when a worker holds the run or the workflow cancels
    /// cooperatively — by recording the request, which the worker (at its next host call) or
    /// the workflow (at its safe points) acts on. The rows of `On::Cancel` decide which.
    pub async fn cancel(&self, id: &str) -> Result<Canceled, EngineError> {
        let execution = self.get(id).await?;
        let run = self.inner.store.run(&execution.run_id).await?;
        let now = self.now();
        let workflow = run
            .as_ref()
            .and_then(|r| self.build(&r.digest))
            .or_else(|| self.workflow(&execution.workflow));
        let descriptor = workflow.as_ref().map(|w| &w.descriptor);
        let point_of_no_return = descriptor.and_then(|d| d.point_of_no_return.clone());
        let past_point_of_no_return = match &point_of_no_return {
            Some(stage) => self
                .inner
                .store
                .stages(id)
                .await?
                .iter()
                .any(|s| &s.stage_name == stage),
            None => false,
        };
        let facts = Facts {
            // A paused run is not running to see a request: even a cooperative one is canceled
            // at once (the table's cooperative row does not hold `paused`).
            cooperative: descriptor.is_some_and(|d| d.cancel_mode == CancelMode::Cooperative),
            past_point_of_no_return,
            leased: run
                .as_ref()
                .is_some_and(|r| r.lease_owner.is_some() && r.lease_expires_ms.unwrap_or(0) >= now),
            ..Facts::default()
        };
        let status = execution.status;
        let row = super::decide(On::Cancel, status, &facts, |reason| match reason {
            "past_point_of_no_return" => format!(
                "stage `{}` has begun: the provider accepted the change, so this execution can no longer be canceled",
                point_of_no_return.as_deref().unwrap_or_default()
            ),
            _ => format!(
                "execution is {status}; only queued, running, waiting or paused executions can be canceled"
            ),
        })?;
        match row.answer {
            Answer::CancellationRequested => {
                let mut writes = Vec::new();
                let stop_worker = facts.leased && !facts.cooperative;
                if stop_worker {
                    writes.push(Write::UpdateRun(RunPatch {
                        id: execution.run_id.clone(),
                        cancel_requested: Some(true),
                        ..RunPatch::default()
                    }));
                }
                if execution.cancellation_requested_ms.is_none() {
                    writes.push(Write::UpdateExecution(ExecutionPatch {
                        id: id.to_owned(),
                        cancellation_requested_ms: Some(Some(now)),
                        ..ExecutionPatch::default()
                    }));
                    for name in row.events {
                        writes.push(Write::Event(event(
                            &execution,
                            name,
                            status.as_str(),
                            json!({}),
                            now,
                        )));
                    }
                }
                // Not past the point of no return when this commits (the worker commits that
                // stage's beginning before its first effect, so one of the two is refused).
                if let Some(stage) = &point_of_no_return {
                    writes.push(Write::UpdateExecution(ExecutionPatch {
                        id: id.to_owned(),
                        expect_stage_not_begun: Some(stage.clone()),
                        ..ExecutionPatch::default()
                    }));
                }
                if !writes.is_empty() {
                    match self.inner.apply(None, writes).await {
                        Ok(()) => {}
                        Err(StoreError::Conflict(_)) => return Err(self.refused_now(id).await?),
                        Err(e) => return Err(e.into()),
                    }
                }
                if stop_worker {
                    // Once committed: a worker of this node stops at its next host call without
                    // reading the store (others see `cancel_requested` at their next commit).
                    if let Ok(mut local) = self.inner.local_cancels.lock() {
                        local.insert(execution.run_id.clone());
                    }
                }
                let execution = self.get(id).await?;
                // The worker may have stopped the run already.
                let requested = execution.status != ExecutionStatus::Canceled;
                Ok(Canceled {
                    execution,
                    cancellation_requested: requested,
                })
            }
            _ => {
                let mut writes = self.cancel_writes(&execution, &execution.run_id, row, now);
                if let Some(stage) = &point_of_no_return {
                    writes.push(Write::UpdateExecution(ExecutionPatch {
                        id: id.to_owned(),
                        expect_stage_not_begun: Some(stage.clone()),
                        ..ExecutionPatch::default()
                    }));
                }
                match self.inner.apply(None, writes).await {
                    Ok(()) => {}
                    Err(StoreError::Conflict(_)) => {
                        let now_state = self.get(id).await?;
                        if now_state.status != ExecutionStatus::Canceled {
                            return Err(self.refused_now(id).await?);
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
                Ok(Canceled {
                    execution: self.get(id).await?,
                    cancellation_requested: false,
                })
            }
        }
    }
}
