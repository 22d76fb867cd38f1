//! Triggers: an execution and its run created in one commit (or the original returned for a
//! repeated idempotency key), and the eager start that hands a fresh run to a free worker slot
//! of this node without a round trip through the claim query.

use super::*;
use crate::activation::ActivationScope;

impl Engine {
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
        let id = capstan_core::ids::new_id();
        // The execution's span, under the caller's (the HTTP request's, which continued the
        // client's `traceparent`); stored as the execution's `traceparent`, so its activations,
        // wherever they run, and its events belong to this trace. A caller with no span of its
        // own (a background trigger) passes the `traceparent` it has.
        let span = tracing::debug_span!("execution", execution = %id, workflow = %request.workflow);
        if capstan_core::trace::traceparent(&tracing::Span::current()).is_none() {
            capstan_core::trace::set_parent(&span, request.traceparent.as_deref());
        }
        let traceparent = capstan_core::trace::traceparent(&span).or(request.traceparent.clone());
        let execution = ExecutionRecord {
            id,
            workflow: request.workflow.clone(),
            principal_id: request.principal_id.clone(),
            status: ExecutionStatus::Queued,
            status_reason: None,
            current_stage: None,
            created_ms: now,
            finished_ms: None,
            cancellation_requested_ms: None,
            input_json: JsonText::new(&request.input),
            output_json: None,
            outcome_json: None,
            run_id: capstan_core::ids::new_id(),
            traceparent,
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
        let facts = Facts {
            slot_free: slot.is_some(),
            ..Facts::default()
        };
        if let Some(row) = transitions::decide(On::Trigger, ExecutionStatus::Queued, &facts)
            && let Some(to) = row.to
            && to != execution.status
        {
            // Started at once: what the activation's claim would commit (`activate_inner`),
            // committed now, after the `ExecutionQueued` every trigger writes.
            execution.status = to;
            for ty in row.events.iter().filter(|ty| **ty != "ExecutionQueued") {
                writes.push(Write::Event(event(
                    &execution,
                    ty,
                    to.as_str(),
                    json!({"workflowRunId": run.id}),
                    now,
                )));
            }
        }
        writes.splice(
            0..0,
            [
                Write::InsertExecution(execution.clone()),
                Write::InsertRun(run.clone()),
            ],
        );
        let (ahead, _held) = match slot {
            Some(_) => self.may_start_ahead(&request).await,
            None => (false, None),
        };
        let Some((key, body)) = &request.idempotency else {
            self.commit_and_start(slot, &run, &execution, writes, ahead)
                .await
                .map_err(|(e, _)| e)?;
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
        let (mut slot, mut ahead) = (slot, ahead);
        loop {
            let committed = self
                .commit_and_start(slot.take(), &run, &execution, writes.clone(), ahead)
                .await;
            let Err((error, unused)) = committed else {
                return Ok(Triggered {
                    execution,
                    replayed: false,
                    replay_response: None,
                });
            };
            // Again (after dropping a stale key), the run starts only in the slot its records
            // were written for, after its commit: a run written for no slot is claimed, and
            // one whose slot a run started ahead spent waits for its lease to lapse.
            slot = unused;
            ahead = false;
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

    /// Commits a trigger's `writes` and hands its run to the scheduler when it has a `slot`.
    /// `ahead`: the run starts before the commit, which the store queues for the next group
    /// ([`RunStore::queue_ahead`]), and the trigger answers once it is durable, while the run's
    /// first steps go on. The activation is held to the epoch of writes behind answers from
    /// before the batch was queued, so if the batch fails, none of its commits and none of its
    /// provider's writes behind answers commit; and it makes no call that acts outside the
    /// store until the batch's commit (which the trigger passes on) or one of its own has
    /// proved the run durable ([`crate::host`]).
    ///
    /// A failed commit gives the slot back, unless the run started ahead: then the run holds
    /// it until its refused commits end it.
    async fn commit_and_start(
        &self,
        slot: Option<Slot>,
        run: &RunRecord,
        execution: &ExecutionRecord,
        writes: Vec<Write>,
        ahead: bool,
    ) -> Result<(), (StoreError, Option<Slot>)> {
        let (slot, writes) = match slot {
            Some(slot) if ahead => {
                let (scope, tell) = ActivationScope::ahead(&self.inner.store, &run.id);
                match self.inner.store.queue_ahead(writes).await {
                    Ok(committed) => {
                        self.start(Some(slot), run.clone(), execution, Some(scope));
                        let committed = committed.await;
                        // The run waits for this before its first effect it cannot have
                        // answered behind a provider's writes ([`crate::host`]).
                        let _ = tell.send(Some(committed.is_ok()));
                        return committed.map_err(|e| (e, None));
                    }
                    Err(Unqueued::Failed(e)) => return Err((e, Some(slot))),
                    Err(Unqueued::Unsupported(writes)) => (Some(slot), writes),
                }
            }
            slot => (slot, writes),
        };
        if let Err(e) = self.inner.apply(None, writes).await {
            return Err((e, slot));
        }
        self.start(slot, run.clone(), execution, None);
        Ok(())
    }

    /// Whether a trigger that has a slot may start its run ahead of its commit, with the hold
    /// on its idempotency key that keeps this node's other triggers of the same key from doing
    /// so meanwhile. Only where the store queues batches ahead, and never when the batch's
    /// failure is foreseeable: its key already recorded (a repeat of the request), or another
    /// trigger of the same key under way here (two identical requests racing). A failed batch
    /// moves the epoch of writes behind answers ([`RunStore::queue_ahead`]), which makes every
    /// activation under way replay.
    async fn may_start_ahead(&self, request: &TriggerRequest) -> (bool, Option<KeyHold>) {
        if !self.inner.store.queues_ahead() {
            return (false, None);
        }
        let Some((key, _)) = &request.idempotency else {
            return (true, None);
        };
        let held = match KeyHold::take(
            &self.inner,
            (
                request.principal_id.clone(),
                request.workflow.clone(),
                key.clone(),
            ),
        ) {
            Ok(held) => held,
            // The same request under way here: this one commits after it, and so finds its key.
            Err(released) => {
                released.await;
                return (false, None);
            }
        };
        let recorded = self
            .inner
            .store
            .idempotency(&request.principal_id, &request.workflow, key)
            .await;
        match recorded {
            Ok(None) => (true, Some(held)),
            _ => (false, None),
        }
    }

    /// A free worker slot for a trigger to start its run in, when the scheduler runs.
    pub(crate) fn free_slot(&self) -> Option<Slot> {
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

    /// Hands a trigger's run to the scheduler when the trigger took a slot: once its commit is
    /// durable, or once it is queued when the run starts ahead (a run committed without a slot
    /// woke the claimer as it committed: [`EngineState::apply`]). (A run the scheduler can no
    /// longer take — it is shutting down — keeps its lease until it expires, and is claimed
    /// then, as after a crash.)
    pub(crate) fn start(
        &self,
        slot: Option<Slot>,
        run: RunRecord,
        execution: &ExecutionRecord,
        ahead: Option<ActivationScope>,
    ) {
        if let Some((eager, permit)) = slot {
            let _ = eager.runs.send(Started {
                run,
                execution: execution.clone(),
                permit,
                ahead,
            });
        }
    }
}

/// A worker slot a trigger took, and the scheduler it belongs to.
pub(crate) type Slot = (EagerStart, tokio::sync::OwnedSemaphorePermit);

/// An idempotency key a trigger of this node is starting its run ahead under
/// ([`Engine::may_start_ahead`]); let go, and its waiters woken, when dropped.
pub(crate) struct KeyHold {
    state: Arc<EngineState>,
    key: (String, String, String),
}

impl KeyHold {
    /// The hold on `key` (principal, workflow, key); if another trigger has it, what resolves
    /// once that one lets it go (its commit answered). A second identical request must not
    /// commit first: the first's batch, queued ahead of its run, would then fail on the key.
    fn take(
        state: &Arc<EngineState>,
        key: (String, String, String),
    ) -> Result<Self, impl std::future::Future<Output = ()> + use<>> {
        let mut held = state
            .ahead_keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(released) = held.get(&key) {
            let released = released.clone();
            // Registered under the lock, so a release after it is not missed.
            let mut notified = Box::pin(released.notified_owned());
            notified.as_mut().enable();
            return Err(notified);
        }
        held.insert(key.clone(), Arc::new(tokio::sync::Notify::new()));
        Ok(Self {
            state: state.clone(),
            key,
        })
    }
}

impl Drop for KeyHold {
    fn drop(&mut self) {
        let released = self
            .state
            .ahead_keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.key);
        if let Some(released) = released {
            released.notify_waiters();
        }
    }
}
