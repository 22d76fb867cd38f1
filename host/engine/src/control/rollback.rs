//! `rollback`: at once when nothing needs compensating, else a rollback command and its run,
//! which compensates the receipts newest first.

use crate::events::event;
use crate::*;
use capstan_core::transitions::{Answer, Facts, On};

impl Engine {
    /// Rolls back an execution by compensating its receipts in reverse order, as visible stages.
    /// With nothing to compensate it is `rolled_back` at once.
    pub async fn rollback(&self, id: &str) -> Result<CommandOutcome, EngineError> {
        let execution = self.get(id).await?;
        let pending = self.pending_command(id).await?;
        let receipts = self.inner.store.receipts(id).await?;
        let run = self.inner.store.run(&execution.run_id).await?;
        let facts = Facts {
            pending: pending.as_ref().map(|c| c.operation.clone()),
            rollback_requires_terminal: run
                .as_ref()
                .and_then(|r| self.build(&r.digest))
                .or_else(|| self.workflow(&execution.workflow))
                .is_some_and(|w| w.descriptor.rollback_requires_terminal),
            nothing_to_compensate: receipts.iter().all(|r| r.compensated_ms.is_some()),
            ..Facts::default()
        };
        let status = execution.status;
        let row = super::decide(On::Rollback, status, &facts, |reason| match reason {
            "command_pending" => format!(
                "a {} command is pending",
                facts.pending.as_deref().unwrap_or_default()
            ),
            _ if status.is_active() => format!("execution is {status}; cancel it first"),
            _ if facts.rollback_requires_terminal && status == ExecutionStatus::Paused => format!(
                "execution is {status}; workflow {} rolls back only finished executions (cancel it first)",
                execution.workflow
            ),
            _ => format!("execution is {status}"),
        })?;
        let now = self.now();
        match row.answer {
            Answer::Pending => {
                return Ok(CommandOutcome {
                    command: pending,
                    execution,
                    reused: true,
                    immediate: false,
                });
            }
            Answer::RolledBack => {
                let to = row.to.unwrap_or(status);
                let mut writes = vec![Write::UpdateExecution(ExecutionPatch {
                    id: id.to_owned(),
                    expect: Some(vec![status]),
                    status: Some(to),
                    finished_ms: Some(Some(now)),
                    ..ExecutionPatch::default()
                })];
                for name in row.events {
                    writes.push(Write::Event(event(
                        &execution,
                        name,
                        to.as_str(),
                        json!({"compensated": 0}),
                        now,
                    )));
                }
                match self.inner.apply(None, writes).await {
                    Ok(()) => {}
                    Err(StoreError::Conflict(m)) => return Err(invalid("state_changed", m)),
                    Err(e) => return Err(e.into()),
                }
                return Ok(CommandOutcome {
                    command: None,
                    execution: self.get(id).await?,
                    reused: false,
                    immediate: true,
                });
            }
            _ => {}
        }
        let command = self.new_command(id, "rollback", CommandStatus::Queued);
        let rollback_run = RunRecord {
            id: command.id.clone(),
            execution_id: id.to_owned(),
            workflow: execution.workflow.clone(),
            digest: String::new(),
            kind: RunKind::Rollback,
            state: RunState::Runnable,
            wake_ms: now,
            lease_owner: None,
            lease_expires_ms: None,
            activations: 0,
            cancel_requested: false,
            created_ms: now,
            epoch: 0,
        };
        let mut writes = vec![
            Write::InsertRun(rollback_run),
            Write::PutCommand(command.clone()),
        ];
        for name in row.events {
            let data = match *name {
                "CommandQueued" => json!({"commandId": command.id, "operation": "rollback"}),
                _ => json!({"commandId": command.id}),
            };
            writes.push(Write::Event(event(
                &execution,
                name,
                execution.status.as_str(),
                data,
                now,
            )));
        }
        self.inner.apply(None, writes).await?;
        Ok(CommandOutcome {
            command: Some(command),
            execution,
            reused: false,
            immediate: false,
        })
    }

    /// The rollback run: one stage per receipt, newest first; each compensation is journaled under
    /// the rollback run and idempotent (token = the receipt's id).
    pub(crate) async fn roll_back(
        &self,
        run: RunRecord,
        execution: ExecutionRecord,
    ) -> Result<(), EngineError> {
        let store = &self.inner.store;
        // Compensations are provider calls: the store hears of them as of an activation's.
        let _scope = crate::activation::ActivationScope::begin(store, &run.id);
        let mut command = store
            .commands(&execution.id)
            .await?
            .into_iter()
            .find(|c| c.id == run.id);
        if let Some(c) = command.as_mut()
            && c.status == CommandStatus::Queued
        {
            c.status = CommandStatus::Active;
            self.inner
                .apply(
                    Some(&self.inner.fence(&run.id)),
                    vec![Write::PutCommand(c.clone())],
                )
                .await?;
        }
        let mut stages = store.stages(&execution.id).await?;
        let receipts = store.receipts(&execution.id).await?;
        for receipt in receipts.iter().rev().filter(|r| r.compensated_ms.is_none()) {
            let now = self.now();
            let name = format!("rollback:{}", receipt.op);
            let stage = match stages.iter().find(|s| {
                s.stage_name == name
                    && s.status == StageStatus::Running
                    && s.started_ms >= run.created_ms
            }) {
                Some(stage) => stage.clone(),
                None => {
                    let stage = StageRecord {
                        id: capstan_core::ids::new_id(),
                        execution_id: execution.id.clone(),
                        position: stages.len() as i64,
                        stage_name: name.clone(),
                        status: StageStatus::Running,
                        started_ms: now,
                        finished_ms: None,
                        output_json: None,
                        error_json: None,
                    };
                    stages.push(stage.clone());
                    self.inner
                        .apply(
                            Some(&self.inner.fence(&run.id)),
                            vec![
                                Write::PutStage(stage.clone()),
                                Write::Event(event(
                                    &execution,
                                    "StageStarted",
                                    execution.status.as_str(),
                                    json!({"stage": name}),
                                    now,
                                )),
                            ],
                        )
                        .await?;
                    stage
                }
            };
            let ok = receipt.response.value();
            let result = match effects::compensation(&receipt.op, &receipt.request.value(), &ok) {
                Compensation::Call { op, request } => self
                    .inner
                    .provide(op, &request, &format!("rollback:{}", receipt.id), false)
                    .await
                    .map(|answer| json!({"compensation": op, "request": request, "response": answer})),
                Compensation::Nothing => Ok(json!({"compensation": null, "note": "the effect changed nothing"})),
                Compensation::Irreversible(why) => Ok(json!({"compensation": null, "irreversible": why})),
            };
            let now = self.now();
            match result {
                Ok(output) => {
                    let done = StageRecord {
                        status: StageStatus::Succeeded,
                        finished_ms: Some(now),
                        output_json: Some(JsonText::new(&output)),
                        ..stage
                    };
                    if let Some(s) = stages.iter_mut().find(|s| s.id == done.id) {
                        *s = done.clone();
                    }
                    self.inner
                        .apply(
                            Some(&self.inner.fence(&run.id)),
                            vec![
                                Write::PutStage(done),
                                Write::MarkCompensated {
                                    receipt_id: receipt.id.clone(),
                                    at_ms: now,
                                },
                                Write::Event(event(
                                    &execution,
                                    "StageSucceeded",
                                    execution.status.as_str(),
                                    json!({"stage": name}),
                                    now,
                                )),
                            ],
                        )
                        .await?;
                }
                Err(error) if error.is_transient() => {
                    // Try again later; the stage stays running.
                    let wake = now
                        + self
                            .inner
                            .config
                            .convergence
                            .delay_ms(run.activations.clamp(0, 20) as u32);
                    self.inner
                        .apply(
                            None,
                            vec![Write::UpdateRun(RunPatch {
                                id: run.id.clone(),
                                wake_ms: Some(wake),
                                release_lease: true,
                                ..RunPatch::default()
                            })],
                        )
                        .await?;
                    return Ok(());
                }
                Err(error) => {
                    let error_json =
                        json!({"error": error.code, "message": error.message, "kind": "permanent"});
                    let failed = StageRecord {
                        status: StageStatus::Failed,
                        finished_ms: Some(now),
                        error_json: Some(JsonText::new(&error_json)),
                        ..stage
                    };
                    let mut writes = vec![
                        Write::PutStage(failed),
                        Write::Event(event(
                            &execution,
                            "StageFailed",
                            execution.status.as_str(),
                            json!({"stage": name, "error": error_json}),
                            now,
                        )),
                    ];
                    // The execution stays where it was, saying why (the row's `to` is none), and
                    // the rollback's end is an event: a feed that followed it ends there.
                    let failed = Facts {
                        compensation_failed: true,
                        ..Facts::default()
                    };
                    if let Some(row) =
                        transitions::decide(On::RollbackRunEnds, execution.status, &failed)
                    {
                        writes.push(Write::UpdateExecution(ExecutionPatch {
                            id: execution.id.clone(),
                            status: row.to,
                            status_reason: Some(Some("rollback_failed".to_owned())),
                            ..ExecutionPatch::default()
                        }));
                        writes.extend(events::moved(
                            &execution,
                            row,
                            json!({"commandId": run.id, "stage": name, "error": error_json}),
                            now,
                        ));
                    }
                    if let Some(mut c) = command.clone() {
                        c.status = CommandStatus::Failed;
                        c.finished_ms = Some(now);
                        c.error = Some(format!("{}: {}", error.code, error.message));
                        writes.push(Write::PutCommand(c));
                    }
                    return self.end_run(&run, writes).await;
                }
            }
        }
        let now = self.now();
        let mut writes = Vec::new();
        if let Some(row) =
            transitions::decide(On::RollbackRunEnds, execution.status, &Facts::default())
        {
            writes.push(Write::UpdateExecution(ExecutionPatch {
                id: execution.id.clone(),
                status: row.to,
                status_reason: Some(None),
                current_stage: Some(None),
                finished_ms: Some(Some(now)),
                ..ExecutionPatch::default()
            }));
            writes.extend(events::moved(
                &execution,
                row,
                json!({"commandId": run.id}),
                now,
            ));
        }
        if let Some(mut c) = command {
            c.status = CommandStatus::Completed;
            c.finished_ms = Some(now);
            writes.push(Write::PutCommand(c));
        }
        self.end_run(&run, writes).await
    }
}
