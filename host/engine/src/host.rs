//! The journal: the engine's answer to every host call of a guest.
//!
//! A call at sequence number `n` that the journal already holds is answered from it (replay); a
//! call that differs from the recorded one (another operation or request) is nondeterminism and
//! stops the run. New calls are answered live and journaled. Writes are buffered and committed
//! when the activation ends or waits, while a provider is slow to answer (after
//! [`PROGRESS_AFTER`], so progress stays visible), and when [`MAX_BUFFERED`] have gathered.
//!
//! A side effect reaches its provider under a token derived from the run, the journal's epoch and
//! the call's sequence number ([`effect_token`]): a crash before its answer is committed replays
//! the call under the same token, which the provider answers as the same request; its answer and
//! receipt ride the activation's next commit. Providers bind a token to the operation and
//! request it first came with: a replay that reaches the token with another call (the guest
//! branched on a read the crash lost) is refused, and the execution pauses as nondeterministic.
//! (An `intent` entry carries a drawn token instead; a replay uses that token.)

use crate::effects::is_effect;
use crate::events::event;
use crate::{EngineState, Suspension};
use async_trait::async_trait;
use capstan_core::CapabilityError;
use capstan_core::execution::StageStatus;
use capstan_core::store::*;
use capstan_runtime::{Answer, HostCalls, Interrupt, Request};
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::Mutex;
use tracing::Instrument;

/// The state of one activation, shared between the guest's host calls and the engine.
#[derive(Debug)]
pub(crate) struct Activation {
    pub run: RunRecord,
    pub execution: ExecutionRecord,
    /// The journal as recorded when the activation began, indexed by sequence number (replay);
    /// live calls go to `pending` only.
    pub journal: Vec<JournalEntry>,
    pub waits: Vec<WaitRecord>,
    pub stages: Vec<StageRecord>,
    pub cursor: usize,
    pub pending: Vec<Write>,
    pub suspension: Option<Suspension>,
    /// Set when a commit failed because the lease was lost or the run was canceled.
    pub fenced_out: Option<StoreError>,
    /// The workflow's point of no return: its stage-begin commits before the guest goes on, so
    /// a cancel either lands first (and this commit is refused) or sees the stage (and is).
    pub point_of_no_return: Option<String>,
    /// The run is known stored: it was when the activation began, or its trigger's commit or a
    /// commit of the activation under its fence has succeeded since. A run started ahead of its
    /// trigger's commit ([`RunStore::queue_ahead`]) is not until then: it asks its providers to
    /// answer behind their writes, and before a call they cannot answer so waits for that
    /// commit, or commits ([`JournalHost::provide`]).
    pub durable: bool,
    /// Started ahead of its trigger's commit: that commit's outcome, which proves the run
    /// durable without a commit of the activation's own ([`JournalHost::provide`]).
    pub trigger_committed: Option<crate::activation::TriggerCommitted>,
    /// The activation's span, and the span of the stage it is in (provider calls are its
    /// children; at `debug`, so built only when traces are exported).
    pub span: tracing::Span,
    pub stage_span: Option<tracing::Span>,
}

impl Activation {
    /// The span provider calls go under: the stage's, else the activation's.
    pub fn current_span(&self) -> tracing::Span {
        self.stage_span.clone().unwrap_or_else(|| self.span.clone())
    }

    /// Opens the span of stage `name`; `resumed` when the stage began in an earlier activation.
    pub fn open_stage_span(&mut self, name: &str, resumed: bool) {
        self.stage_span = Some(tracing::debug_span!(
            parent: &self.span,
            "stage",
            stage = name,
            resumed,
            outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        ));
    }
}

pub(crate) struct JournalHost {
    pub inner: Arc<EngineState>,
    pub state: Arc<Mutex<Activation>>,
}

fn ok(v: Value) -> Value {
    json!({"Ok": v})
}

fn err(e: &CapabilityError) -> Value {
    json!({"Err": e})
}

fn field<'a>(request: &'a Value, key: &str) -> &'a str {
    request.get(key).and_then(Value::as_str).unwrap_or_default()
}

impl JournalHost {
    async fn answer(
        &self,
        st: &mut Activation,
        op: &'static str,
        request: Request,
    ) -> Result<Answer, Interrupt> {
        let now = self.inner.now();
        let seq = st.cursor as i64;
        st.cursor += 1;
        if let Some(entry) = st.journal.get(seq as usize) {
            if entry.op != op || entry.request != request.text {
                return Err(Interrupt::Nondeterminism(format!(
                    "call {seq}: the journal recorded `{}` {} but the component called `{op}` {request}",
                    entry.op, entry.request
                )));
            }
            return match entry.status {
                // The recorded text goes back as it is: the guest's side decodes it.
                EntryStatus::Done => Ok(entry
                    .response
                    .clone()
                    .map_or(Answer::Value(Value::Null), Answer::Text)),
                EntryStatus::Intent => {
                    let token = entry
                        .response
                        .as_ref()
                        .map(|r| field(&r.value(), "token").to_owned())
                        .unwrap_or_default();
                    self.effect(st, seq, op, request, token, false, now)
                        .await
                        .map(Answer::Value)
                }
                EntryStatus::Waiting => self
                    .resume_wait(st, seq, op, request, now)
                    .await
                    .map(Answer::Value),
            };
        }
        self.live(st, seq, op, request, now)
            .await
            .map(Answer::Value)
    }

    fn record(
        &self,
        st: &mut Activation,
        seq: i64,
        op: &str,
        request: Request,
        response: &Value,
        now: Millis,
    ) {
        let entry = JournalEntry {
            run_id: st.run.id.clone(),
            seq,
            op: op.to_owned(),
            request: request.text,
            response: Some(JsonText::new(response)),
            status: EntryStatus::Done,
            at_ms: now,
        };
        // A replayed entry that was not done (an intent, a wait) is replaced in place; a live
        // call's entry is not kept in memory: the cursor only moves forward, and calls past the
        // recorded journal are answered live, so nothing in this activation reads it again.
        if let Some(slot) = st.journal.get_mut(seq as usize) {
            *slot = entry.clone();
        }
        st.pending.push(Write::PutJournal(entry));
    }

    async fn live(
        &self,
        st: &mut Activation,
        seq: i64,
        op: &'static str,
        request: Request,
        now: Millis,
    ) -> Result<Value, Interrupt> {
        if st.pending.len() >= MAX_BUFFERED {
            // A long activation of fast calls commits as it goes, not all at its end.
            self.flush(st).await?;
        }
        let response = match op {
            "context.info" => json!({
                "execution_id": st.execution.id,
                "workflow_run_id": st.run.id,
                "workflow": st.execution.workflow,
                "principal_id": st.execution.principal_id,
            }),
            "context.stage-begin" => {
                let name = field(&request, "name").to_owned();
                let stage = StageRecord {
                    id: capstan_core::ids::new_id(),
                    execution_id: st.execution.id.clone(),
                    position: st.stages.len() as i64,
                    stage_name: name.clone(),
                    status: StageStatus::Running,
                    started_ms: now,
                    finished_ms: None,
                    output_json: None,
                    error_json: None,
                };
                st.stages.push(stage.clone());
                st.open_stage_span(&name, false);
                st.execution.current_stage = Some(name.clone());
                st.pending.push(Write::PutStage(stage));
                st.pending.push(Write::UpdateExecution(ExecutionPatch {
                    id: st.execution.id.clone(),
                    current_stage: Some(Some(name.clone())),
                    ..ExecutionPatch::default()
                }));
                st.pending.push(Write::Event(event(
                    &st.execution,
                    "StageStarted",
                    "running",
                    json!({"stage": name}),
                    now,
                )));
                Value::Null
            }
            "context.stage-succeeded" | "context.stage-failed" => {
                let name = field(&request, "name").to_owned();
                let succeeded = op == "context.stage-succeeded";
                let outcome = if succeeded { "succeeded" } else { "failed" };
                if let Some(span) = st.stage_span.take() {
                    span.record("outcome", outcome);
                    if !succeeded {
                        span.record("otel.status_code", "ERROR");
                    }
                }
                let workflow = st.execution.workflow.clone();
                if let Some(stage) = st.stages.iter_mut().rev().find(|s| s.stage_name == name) {
                    metrics::histogram!(
                        "capstan_stage_duration_seconds",
                        "workflow" => workflow,
                        "stage" => name.clone(),
                        "outcome" => outcome,
                    )
                    .record((now - stage.started_ms).max(0) as f64 / 1e3);
                    stage.finished_ms = Some(now);
                    if succeeded {
                        stage.status = StageStatus::Succeeded;
                        // Kept as the guest wrote it (checked as JSON).
                        stage.output_json = request
                            .get("output")
                            .and_then(Value::as_str)
                            .and_then(JsonText::parse);
                    } else {
                        stage.status = StageStatus::Failed;
                        stage.error_json = request
                            .get("error")
                            .map(|e| JsonText::new(&guest_error_json(e)));
                    }
                    let stage = stage.clone();
                    st.pending.push(Write::PutStage(stage));
                }
                let (ty, extra) = if succeeded {
                    ("StageSucceeded", json!({"stage": name}))
                } else {
                    (
                        "StageFailed",
                        json!({"stage": name, "error": request.get("error").map(guest_error_json)}),
                    )
                };
                st.pending.push(Write::Event(event(
                    &st.execution,
                    ty,
                    "running",
                    extra,
                    now,
                )));
                Value::Null
            }
            "context.log" => {
                tracing::info!(run = %st.run.id, execution = %st.execution.id, level = ?request.get("level"), "guest: {}", field(&request, "message"));
                Value::Null
            }
            "context.emit" => {
                let payload: Value =
                    serde_json::from_str(field(&request, "payload")).unwrap_or(Value::Null);
                // Only catalogued types reach subscribers (docs/events.md).
                let (ty, extra) =
                    crate::catalog::normalize_custom(field(&request, "event_type"), payload);
                st.pending.push(Write::Event(event(
                    &st.execution,
                    &ty,
                    "running",
                    extra,
                    now,
                )));
                Value::Null
            }
            "context.cancellation-requested" => {
                let requested = match self.inner.store.execution(&st.execution.id).await {
                    Ok(Some(e)) => e.cancellation_requested_ms.is_some(),
                    Ok(None) => false,
                    Err(e) => return Err(Interrupt::Host(e.to_string())),
                };
                json!(requested)
            }
            "time.now" => json!(now),
            "time.sleep" => {
                let millis = request.get("millis").and_then(Value::as_i64).unwrap_or(0);
                if millis > 0 {
                    return self.wait(
                        st,
                        seq,
                        op,
                        request,
                        WaitKind::Timer,
                        Some(now.saturating_add(millis)),
                        None,
                        now,
                    );
                }
                Value::Null
            }
            "approvals.await-approval" => {
                return self.wait(st, seq, op, request, WaitKind::Approval, None, None, now);
            }
            "convergence.await-converged" => {
                let condition = request.get("condition").cloned().unwrap_or(Value::Null);
                match self
                    .inner
                    .converged(&condition)
                    .instrument(st.current_span())
                    .await
                {
                    Ok(true) => ok(Value::Null),
                    Ok(false) => {
                        let timeout = request
                            .get("timeout_ms")
                            .and_then(Value::as_i64)
                            .unwrap_or(0);
                        let wake = now.saturating_add(self.inner.config.convergence.delay_ms(0));
                        return self.wait(
                            st,
                            seq,
                            op,
                            request,
                            WaitKind::Convergence,
                            Some(wake),
                            Some(now.saturating_add(timeout)),
                            now,
                        );
                    }
                    Err(e) => err(&e),
                }
            }
            op if is_effect(op) => {
                let token = effect_token(&st.run, seq);
                // Past the journal in the run's first activation: no attempt has asked it yet.
                let first = st.run.activations == 1;
                return self.effect(st, seq, op, request, token, first, now).await;
            }
            op if op.contains('.') => {
                let (answer, stopped) = self.provide(st, op, &request, "", false).await;
                let response = match answer {
                    Ok(v) => ok(v),
                    Err(e) => err(&e),
                };
                self.record(st, seq, op, request, &response, now);
                return match stopped {
                    Some(interrupt) => Err(interrupt),
                    None => Ok(response),
                };
            }
            other => return Err(Interrupt::Host(format!("unknown host call `{other}`"))),
        };
        let commit_now = op == "context.stage-begin"
            && st.point_of_no_return.is_some()
            && request.get("name").and_then(Value::as_str) == st.point_of_no_return.as_deref();
        self.record(st, seq, op, request, &response, now);
        if commit_now {
            self.flush(st).await?;
        }
        Ok(response)
    }

    /// Performs a side effect under its idempotency token, records its answer and receipt.
    /// `first`: no earlier attempt can have used the token ([`crate::Providers::call_first`]).
    #[allow(clippy::too_many_arguments)]
    async fn effect(
        &self,
        st: &mut Activation,
        seq: i64,
        op: &'static str,
        request: Request,
        token: String,
        first: bool,
        now: Millis,
    ) -> Result<Value, Interrupt> {
        let (answer, stopped) = self.provide(st, op, &request, &token, first).await;
        let response = match answer {
            // An earlier attempt used this token for another call: the guest did something else
            // at this point before (it branched on a read the crash did not keep). Its answer is
            // not this call's, and the effect it stands for has no receipt: stop for a human.
            Err(e) if e.is_token_reused() => {
                return Err(Interrupt::Nondeterminism(format!(
                    "call {seq}: `{op}` {request} came under the token of an earlier attempt's different call ({})",
                    e.message
                )));
            }
            Ok(v) => {
                st.pending.push(Write::InsertReceipt(Arc::new(Receipt {
                    id: token.clone(),
                    execution_id: st.execution.id.clone(),
                    run_id: st.run.id.clone(),
                    seq,
                    op: op.to_owned(),
                    request: request.text.clone(),
                    response: JsonText::new(&v),
                    created_ms: now,
                    compensated_ms: None,
                })));
                ok(v)
            }
            Err(e) => err(&e),
        };
        self.record(st, seq, op, request, &response, now);
        match stopped {
            Some(interrupt) => Err(interrupt),
            None => Ok(response),
        }
    }

    /// Asks the provider. When it has not answered within [`PROGRESS_AFTER`], the writes buffered
    /// so far are committed while it works, so a slow call does not hide what came before it
    /// (a stage that started, its events). A commit that fails for a cancel or a lost lease does
    /// not cut the call short (the provider may already act on it): its answer is recorded and
    /// the interruption comes second.
    async fn provide(
        &self,
        st: &mut Activation,
        op: &str,
        request: &Value,
        token: &str,
        first: bool,
    ) -> (Result<Value, CapabilityError>, Option<Interrupt>) {
        if !st.durable && is_effect(op) {
            // Not durable yet: an answer given behind writes that commit after the trigger's
            // batch, or none at all until a commit proves the run durable (an effect outside
            // the store may not precede the execution that asks for it; a read acts on
            // nothing, and goes ahead).
            if let Some(epoch) = self.inner.store.activation_epoch(&st.run.id)
                && let Some(answer) = self
                    .inner
                    .provide_behind(op, request, token, first, epoch)
                    .instrument(st.current_span())
                    .await
            {
                return (answer, None);
            }
            // The trigger's commit, under way since the run started, proves the run stored once
            // it succeeds: waiting for it costs no commit of the activation's own (a second sync
            // behind the trigger's). Otherwise (it failed, or the trigger stopped waiting for
            // it) a commit under the run's fence decides.
            let committed = match st.trigger_committed.take() {
                Some(mut told) => matches!(
                    told.wait_for(Option::is_some).await.map(|outcome| *outcome),
                    Ok(Some(true))
                ),
                None => false,
            };
            if committed {
                st.durable = true;
            } else if let Err(interrupt) = self.flush(st).await {
                return (
                    Err(CapabilityError::transient(
                        "interrupted",
                        "the run stopped before the call was made",
                    )),
                    Some(interrupt),
                );
            }
        }
        // The provider-call spans are children of the stage's span.
        let call = self
            .inner
            .provide(op, request, token, first)
            .instrument(st.current_span());
        if st.pending.is_empty() {
            return (call.await, None);
        }
        tokio::pin!(call);
        tokio::select! {
            biased;
            answer = &mut call => return (answer, None),
            () = tokio::time::sleep(PROGRESS_AFTER) => {}
        }
        let (answer, flushed) = tokio::join!(call, self.flush(st));
        (answer, flushed.err())
    }

    /// Persists a wait at `seq` and suspends the run.
    #[allow(clippy::too_many_arguments)]
    fn wait(
        &self,
        st: &mut Activation,
        seq: i64,
        op: &str,
        request: Request,
        kind: WaitKind,
        wake_ms: Option<Millis>,
        deadline_ms: Option<Millis>,
        now: Millis,
    ) -> Result<Value, Interrupt> {
        let entry = JournalEntry {
            run_id: st.run.id.clone(),
            seq,
            op: op.to_owned(),
            request: request.text.clone(),
            response: None,
            status: EntryStatus::Waiting,
            at_ms: now,
        };
        // Not kept in memory (see `record`): the activation suspends at this call.
        st.pending.push(Write::PutJournal(entry));
        let wait = WaitRecord {
            run_id: st.run.id.clone(),
            seq,
            kind,
            name: request
                .get("name")
                .and_then(Value::as_str)
                .map(str::to_owned),
            digest: request
                .get("digest")
                .and_then(Value::as_str)
                .map(str::to_owned),
            payload_json: request
                .get("payload")
                .and_then(Value::as_str)
                .and_then(|p| serde_json::from_str(p).ok()),
            wake_ms,
            deadline_ms,
            attempts: 1,
            resolved_json: None,
        };
        st.waits.push(wait.clone());
        st.pending.push(Write::PutWait(wait));
        st.suspension = Some(Suspension { wake_ms, kind });
        Err(Interrupt::Suspend(format!("{kind:?} at call {seq}")))
    }

    /// A replayed call that was waiting: satisfied now, or still waiting.
    async fn resume_wait(
        &self,
        st: &mut Activation,
        seq: i64,
        op: &'static str,
        request: Request,
        now: Millis,
    ) -> Result<Value, Interrupt> {
        let Some(wait) = st.waits.iter().find(|w| w.seq == seq).cloned() else {
            return Err(Interrupt::Host(format!(
                "call {seq} is waiting but its wait is missing"
            )));
        };
        let response = match wait.kind {
            WaitKind::Timer => {
                if now < wait.wake_ms.unwrap_or(0) {
                    st.suspension = Some(Suspension {
                        wake_ms: wait.wake_ms,
                        kind: wait.kind,
                    });
                    return Err(Interrupt::Suspend("timer not due".to_owned()));
                }
                Value::Null
            }
            WaitKind::Approval => match wait.resolved_json {
                Some(body) => ok(Value::String(body.to_string())),
                None => {
                    st.suspension = Some(Suspension {
                        wake_ms: None,
                        kind: wait.kind,
                    });
                    return Err(Interrupt::Suspend("awaiting approval".to_owned()));
                }
            },
            WaitKind::Convergence => {
                let condition = request.get("condition").cloned().unwrap_or(Value::Null);
                match self
                    .inner
                    .converged(&condition)
                    .instrument(st.current_span())
                    .await
                {
                    Ok(true) => ok(Value::Null),
                    Err(e) => err(&e),
                    Ok(false) if now >= wait.deadline_ms.unwrap_or(0) => {
                        err(&CapabilityError::transient(
                            "timeout",
                            format!("{condition} did not hold within the timeout"),
                        ))
                    }
                    Ok(false) => {
                        let wake = now.saturating_add(
                            self.inner.config.convergence.delay_ms(wait.attempts as u32),
                        );
                        let next = WaitRecord {
                            wake_ms: Some(wake),
                            attempts: wait.attempts + 1,
                            ..wait
                        };
                        if let Some(w) = st.waits.iter_mut().find(|w| w.seq == seq) {
                            *w = next.clone();
                        }
                        st.pending.push(Write::PutWait(next));
                        st.suspension = Some(Suspension {
                            wake_ms: Some(wake),
                            kind: WaitKind::Convergence,
                        });
                        return Err(Interrupt::Suspend("not converged yet".to_owned()));
                    }
                }
            }
        };
        self.record(st, seq, op, request, &response, now);
        Ok(response)
    }

    /// Commits the buffered writes under the run's lease.
    async fn flush(&self, st: &mut Activation) -> Result<(), Interrupt> {
        let mut writes = std::mem::take(&mut st.pending);
        crate::events::stamp_published(&mut writes, self.inner.now());
        // A cancel keeps the activation's receipts (`Engine::finish_cancel_keeping`): a copy of
        // them goes back to the buffer if the commit is refused for one.
        let receipts: Vec<Write> = writes
            .iter()
            .filter(|w| matches!(w, Write::InsertReceipt(_)))
            .cloned()
            .collect();
        match self
            .inner
            .apply(Some(&self.inner.fence(&st.run.id)), writes)
            .await
        {
            Ok(()) => {
                st.durable = true;
                Ok(())
            }
            Err(StoreError::Canceled) => {
                st.pending.splice(0..0, receipts);
                st.fenced_out = Some(StoreError::Canceled);
                Err(Interrupt::Cancel)
            }
            Err(StoreError::LeaseLost) => {
                st.fenced_out = Some(StoreError::LeaseLost);
                Err(Interrupt::Host("the run's lease was lost".to_owned()))
            }
            Err(e) => Err(Interrupt::Host(e.to_string())),
        }
    }
}

/// How long a provider may take before the writes buffered ahead of its call are committed
/// without waiting for it ([`JournalHost::provide`]).
const PROGRESS_AFTER: std::time::Duration = std::time::Duration::from_millis(20);

/// Buffered writes after which an activation commits before its next live call.
const MAX_BUFFERED: usize = 512;

/// An effect's idempotency token: the run, its journal epoch and the call's sequence number.
///
/// Derived, not drawn: a crash before the answer is committed replays the call under the same
/// token, which the provider answers as the same request, so the call needs no intent committed
/// ahead of it. A call re-run after the journal was truncated (resume, retry-finalization) is a
/// new request: the truncation bumps the epoch.
pub(crate) fn effect_token(run: &RunRecord, seq: i64) -> String {
    format!("{}:{}:{seq}", run.id, run.epoch)
}

/// A guest error as `errorJson`: `{error, message, kind}`.
pub(crate) fn guest_error_json(error: &Value) -> Value {
    json!({
        "error": error.get("code").cloned().unwrap_or(Value::Null),
        "message": error.get("message").cloned().unwrap_or(Value::Null),
        "kind": error.get("kind").and_then(Value::as_str).map(str::to_lowercase),
    })
}

#[async_trait]
impl HostCalls for JournalHost {
    async fn call(&mut self, op: &'static str, request: Request) -> Result<Answer, Interrupt> {
        let mut st = self.state.lock().await;
        if self.inner.is_cancel_requested_locally(&st.run.id) {
            return Err(Interrupt::Cancel);
        }
        self.answer(&mut st, op, request).await
    }
}
