//! Activations: one claimed run instantiated, replayed to where it stopped and run live until it
//! returns, waits or fails; what that outcome means for the execution (the engine-followed rows
//! of `capstan_core::transitions`), committed with the run's end.

use super::*;

impl Engine {
    /// One activation of a claimed run, and what its outcome means for the execution.
    /// `fresh`: the execution a trigger of this node has just written with the run (nothing to
    /// read back, no journal yet). `ahead`: the trigger's commit was still queued when the run
    /// started ([`Started::ahead`]).
    pub(crate) async fn activate(
        &self,
        run: RunRecord,
        fresh: Option<ExecutionRecord>,
        ahead: Option<ActivationScope>,
    ) {
        let run_id = run.id.clone();
        let started_ahead = ahead.is_some();
        if let Err(e) = self.activate_inner(run, fresh, ahead).await {
            match e {
                EngineError::Store(StoreError::LeaseLost) => {
                    tracing::info!(run = %run_id, "lease lost; another node has the run")
                }
                // Its trigger's commit failed (its caller was told so): the run was never
                // stored, and nothing is left to retry.
                _ if started_ahead && matches!(self.inner.store.run(&run_id).await, Ok(None)) => {
                    tracing::debug!(run = %run_id, error = %e, "a run started ahead of its trigger's commit stopped: the commit failed");
                }
                e => {
                    tracing::warn!(run = %run_id, error = %e, "activation failed; the run will be retried");
                    let _ = self
                        .inner
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

    pub(crate) async fn activate_inner(
        &self,
        run: RunRecord,
        fresh: Option<ExecutionRecord>,
        ahead: Option<ActivationScope>,
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
        let workflow = self.build(&run.digest);
        let claim = Facts {
            component_missing: workflow.is_none(),
            ..Facts::default()
        };
        let Some(row) = transitions::decide(On::Claim, execution.status, &claim) else {
            return self.finish_run(&run, vec![]).await;
        };
        // No status to move to: the run has nothing to do.
        let Some(to) = row.to else {
            return self.finish_run(&run, vec![]).await;
        };
        let Some(workflow) = workflow.filter(|_| to == ExecutionStatus::Running) else {
            let now = self.now();
            let reason = format!(
                "component {} is not loaded",
                &run.digest[..12.min(run.digest.len())]
            );
            let mut writes = vec![Write::UpdateExecution(ExecutionPatch {
                id: execution.id.clone(),
                status: Some(to),
                status_reason: Some(Some("component_missing".to_owned())),
                ..ExecutionPatch::default()
            })];
            writes.extend(events::moved(
                &execution,
                row,
                json!({"reason": "component_missing", "message": reason}),
                now,
            ));
            return self.finish_run(&run, writes).await;
        };

        // queued/waiting → running (a fresh run's trigger committed that itself; a running
        // execution's run was fresh or its lease lapsed)
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
            start.extend(events::moved(
                &execution,
                row,
                json!({"workflowRunId": run.id}),
                self.now(),
            ));
            match self
                .inner
                .apply(Some(&self.inner.fence(&run.id)), start)
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
        // Before the first provider call, until the last commit (the guard's drop). A run
        // started ahead of its trigger's commit was announced before that commit was queued.
        let durable = ahead.is_none();
        let mut scope = ahead.unwrap_or_else(|| ActivationScope::begin(store, &run.id));
        let trigger_committed = scope.trigger_committed.take();
        let span = tracing::info_span!(
            "activation",
            run = %run.id,
            execution = %execution.id,
            workflow = %execution.workflow,
            activation = run.activations,
        );
        // One tree per execution: every activation hangs under the execution's span, however
        // much later and on whichever node it runs. A run claimed from the queue (not started by
        // its trigger's node) also links to it, marking where the trace crossed the queue.
        capstan_core::trace::set_parent(&span, execution.traceparent.as_deref());
        if !is_fresh {
            capstan_core::trace::add_link(&span, execution.traceparent.as_deref());
        }
        let resumed_stage = replay
            .stages
            .iter()
            .rev()
            .find(|s| s.status == StageStatus::Running)
            .map(|s| s.stage_name.clone());
        let mut activation = host::Activation {
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
            durable,
            trigger_committed,
            span: span.clone(),
            stage_span: None,
        };
        if let Some(stage) = resumed_stage {
            activation.open_stage_span(&stage, true);
        }
        let state = Arc::new(tokio::sync::Mutex::new(activation));
        let journal_host = host::JournalHost {
            inner: self.inner.clone(),
            state: state.clone(),
        };
        let input = execution.input_json.as_str();
        let outcome = workflow
            .activate(
                &self.inner.runtime,
                Box::new(journal_host),
                seed_of(&run.id),
                input,
            )
            .instrument(span)
            .await;
        let mut st = state.lock().await;
        // A stage still open when the activation ends: it waits (and resumes in a later
        // activation, under a span of its own) or ends with the guest.
        if let Some(span) = st.stage_span.take() {
            span.record(
                "outcome",
                match &outcome {
                    Outcome::Interrupted(Interrupt::Suspend(_)) => "waiting",
                    Outcome::Completed(Ok(_)) => "succeeded",
                    _ => "failed",
                },
            );
        }
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
                let row = transitions::on_guest_outcome(On::GuestReturns, &Facts::default());
                // Kept as the guest wrote it; only its `outcome` member is looked into.
                let outcome = outcome_of(&output);
                let output =
                    JsonText::from_text(output).unwrap_or_else(|_| JsonText::new(&Value::Null));
                writes.push(Write::UpdateExecution(ExecutionPatch {
                    id: execution.id.clone(),
                    status: row.to,
                    status_reason: Some(None),
                    current_stage: Some(None),
                    finished_ms: Some(Some(now)),
                    output_json: Some(output),
                    outcome_json: outcome,
                    ..ExecutionPatch::default()
                }));
                writes.extend(events::moved(&execution, row, json!({}), now));
                self.end_run(&run, writes).await
            }
            Outcome::Completed(Err(error)) => {
                // A cooperative workflow that stops because it was asked to ends `canceled`.
                let stopped_on_request = error.kind == ErrorKind::Permanent
                    && error.code == "canceled"
                    && self.cancel_mode(Some(&run), &execution.workflow) == CancelMode::Cooperative;
                let row = transitions::on_guest_outcome(
                    On::GuestFails,
                    &Facts {
                        stopped_on_request,
                        transient: error.kind == ErrorKind::Transient,
                        ..Facts::default()
                    },
                );
                let status = row.to.unwrap_or(execution.status);
                let error_json = json!({"error": error.code, "message": error.message, "kind": if error.is_transient() { "transient" } else { "permanent" }});
                if let Some(mut stage) = running_stage {
                    stage.status = StageStatus::Failed;
                    stage.finished_ms = Some(now);
                    stage.error_json = Some(JsonText::new(&error_json));
                    writes.push(Write::PutStage(stage));
                }
                writes.push(Write::UpdateExecution(ExecutionPatch {
                    id: execution.id.clone(),
                    status: Some(status),
                    status_reason: Some(Some(error.code.clone())),
                    finished_ms: Some((status != ExecutionStatus::Paused).then_some(now)),
                    ..ExecutionPatch::default()
                }));
                writes.extend(events::moved(
                    &execution,
                    row,
                    json!({"reason": error.code, "error": error_json}),
                    now,
                ));
                self.end_run(&run, writes).await
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
                let row = transitions::on_guest_outcome(On::GuestWaits, &Facts::default());
                writes.push(Write::UpdateExecution(ExecutionPatch {
                    id: execution.id.clone(),
                    status: row.to,
                    ..ExecutionPatch::default()
                }));
                let waiting_for = match suspension.kind {
                    WaitKind::Timer => "timer",
                    WaitKind::Approval => "approval",
                    WaitKind::Convergence => "convergence",
                };
                writes.extend(events::moved(
                    &execution,
                    row,
                    json!({"waitingFor": waiting_for}),
                    now,
                ));
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
                self.commit_end(&run, writes).await
            }
            Outcome::Interrupted(Interrupt::Cancel) => {
                drop(st);
                // What the activation did before it stopped is kept: its receipts.
                writes.retain(|w| matches!(w, Write::InsertReceipt(_)));
                self.finish_cancel_keeping(&execution, &run, writes).await
            }
            Outcome::Interrupted(Interrupt::Nondeterminism(message)) => {
                tracing::warn!(run = %run.id, %message, "nondeterministic replay: execution paused");
                let row = transitions::on_guest_outcome(
                    On::GuestFails,
                    &Facts {
                        diverged: true,
                        ..Facts::default()
                    },
                );
                let mut writes = vec![Write::UpdateExecution(ExecutionPatch {
                    id: execution.id.clone(),
                    status: row.to,
                    status_reason: Some(Some("nondeterministic_replay".to_owned())),
                    ..ExecutionPatch::default()
                })];
                writes.extend(events::moved(
                    &execution,
                    row,
                    json!({"reason": "nondeterministic_replay", "message": message}),
                    now,
                ));
                self.end_run(&run, writes).await
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
                )
                .await
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn fail_guest(
        &self,
        run: &RunRecord,
        execution: &ExecutionRecord,
        running_stage: Option<StageRecord>,
        mut writes: Vec<Write>,
        code: &str,
        message: String,
        now: Millis,
    ) -> Result<(), EngineError> {
        let error_json = json!({"error": code, "message": message, "kind": "permanent"});
        if let Some(mut stage) = running_stage {
            stage.status = StageStatus::Failed;
            stage.finished_ms = Some(now);
            stage.error_json = Some(JsonText::new(&error_json));
            writes.push(Write::PutStage(stage.clone()));
            writes.push(Write::Event(event(
                execution,
                "StageFailed",
                "failed",
                json!({"stage": stage.stage_name, "error": error_json}),
                now,
            )));
        }
        // A trap or a limit is permanent: the guest-fails row that holds always.
        let row = transitions::on_guest_outcome(On::GuestFails, &Facts::default());
        writes.push(Write::UpdateExecution(ExecutionPatch {
            id: execution.id.clone(),
            status: row.to,
            status_reason: Some(Some(code.to_owned())),
            finished_ms: Some(Some(now)),
            ..ExecutionPatch::default()
        }));
        writes.extend(events::moved(
            execution,
            row,
            json!({"reason": code, "error": error_json}),
            now,
        ));
        self.end_run(run, writes).await
    }

    /// Commits the activation's last writes and marks the run done.
    pub(crate) async fn end_run(
        &self,
        run: &RunRecord,
        mut writes: Vec<Write>,
    ) -> Result<(), EngineError> {
        writes.push(Write::UpdateRun(RunPatch {
            id: run.id.clone(),
            state: Some(RunState::Done),
            release_lease: true,
            ..RunPatch::default()
        }));
        self.commit_end(run, writes).await
    }

    pub(crate) async fn commit_end(
        &self,
        run: &RunRecord,
        mut writes: Vec<Write>,
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
            .apply(Some(&self.inner.fence(&run.id)), writes)
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
    pub(crate) async fn finish_run(
        &self,
        run: &RunRecord,
        mut writes: Vec<Write>,
    ) -> Result<(), EngineError> {
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
        self.inner.apply(None, writes).await.map_err(Into::into)
    }
}

/// An activation (or rollback run) announced to the store for as long as it lives
/// ([`capstan_core::store::RunStore::activation_began`]), its end included when the activation's
/// future is dropped half-way.
pub(crate) struct ActivationScope {
    store: Arc<dyn EngineStore>,
    run_id: String,
    /// A run started ahead of its trigger's commit: that commit's outcome once it is known
    /// (`Some(true)`: committed, which proves the run durable). Closed unset if the trigger
    /// stopped waiting for it.
    trigger_committed: Option<TriggerCommitted>,
}

/// The outcome of the trigger's commit a run started ahead of ([`ActivationScope::ahead`]).
pub(crate) type TriggerCommitted = tokio::sync::watch::Receiver<Option<bool>>;

impl ActivationScope {
    pub(crate) fn begin(store: &Arc<dyn EngineStore>, run_id: &str) -> Self {
        store.activation_began(run_id);
        Self {
            store: store.clone(),
            run_id: run_id.to_owned(),
            trigger_committed: None,
        }
    }

    /// The scope of a run that starts before its trigger's commit, and where the trigger tells
    /// it how that commit went.
    pub(crate) fn ahead(
        store: &Arc<dyn EngineStore>,
        run_id: &str,
    ) -> (Self, tokio::sync::watch::Sender<Option<bool>>) {
        let (tell, told) = tokio::sync::watch::channel(None);
        let mut scope = Self::begin(store, run_id);
        scope.trigger_committed = Some(told);
        (scope, tell)
    }
}

impl Drop for ActivationScope {
    fn drop(&mut self) {
        self.store.activation_ended(&self.run_id);
    }
}

/// The `outcome` member of a workflow's output (its text, as the guest wrote it), when the output
/// is an object that has one; an explicit `null` is kept as one.
fn outcome_of(output: &str) -> Option<JsonText> {
    let members: HashMap<std::borrow::Cow<'_, str>, &serde_json::value::RawValue> =
        serde_json::from_str(output).ok()?;
    members
        .get("outcome")
        .and_then(|raw| JsonText::parse(raw.get()))
}

#[cfg(test)]
mod tests {
    use super::outcome_of;

    /// The outcome is the output's `outcome` member as written, `null` included; an output
    /// without one, or that is not an object, has none.
    #[test]
    fn an_outcome_is_read_from_the_output_text() {
        let outcome = |output: &str| outcome_of(output).map(|o| o.as_str().to_owned());
        assert_eq!(
            outcome(r#"{"changes": 2, "outcome": {"status": "active", "ns": ["a", "b"]}}"#),
            Some(r#"{"status": "active", "ns": ["a", "b"]}"#.to_owned())
        );
        assert_eq!(outcome(r#"{"outcome": null}"#), Some("null".to_owned()));
        assert_eq!(
            outcome(r#"{"esc\u0061pe": 1, "outcome": 3}"#),
            Some("3".to_owned())
        );
        assert_eq!(outcome(r#"{"changes": 2}"#), None);
        assert_eq!(outcome(r#"["outcome"]"#), None);
        assert_eq!(outcome("not json"), None);
    }
}
