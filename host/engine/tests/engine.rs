//! The durable engine through real parts: real components, a real SQLite file, a manual clock,
//! and an in-memory cloud that records every call and deduplicates effects by idempotency token.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_trait::async_trait;
use capstan_core::CapabilityError;
use capstan_core::execution::{ExecutionStatus, StageStatus};
use capstan_core::store::{
    ExecutionFilter, ExecutionReads, IdempotencyRecord, JsonText, RunKind, RunStore, Write,
};
use capstan_core::transitions::{self, Answer, Facts, On};
use capstan_engine::{Backoff, Engine, EngineError, Providers, TriggerRequest};
use serde_json::{Value, json};
use std::sync::Arc;

mod common;
use common::*;

#[tokio::test]
async fn a_ten_stage_workflow_runs_to_success_with_one_receipt_per_effect() {
    let w = world().await;
    let id = w.trigger("fixture-steps", json!({"zone": "Z1"})).await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Queued);
    w.settle().await;
    let (execution, stages) = w.engine.execution(&id).await.unwrap().unwrap();
    assert_eq!(
        execution.status,
        ExecutionStatus::Succeeded,
        "{execution:?}"
    );
    assert!(execution.finished_ms.is_some() && execution.current_stage.is_none());
    let names: Vec<_> = stages.iter().map(|s| s.stage_name.as_str()).collect();
    assert_eq!(names.len(), 11);
    assert_eq!(names[0], "step-1");
    assert!(stages.iter().all(|s| s.status == StageStatus::Succeeded));
    assert_eq!(
        stages[0].output_json.as_ref().map(JsonText::value),
        Some(json!("C1"))
    );
    assert_eq!(
        execution.output_json.unwrap().value()["changes"]
            .as_array()
            .unwrap()
            .len(),
        10
    );
    assert_eq!(w.store.receipts(&id).await.unwrap().len(), 10);
    let effects = w.cloud.effects();
    assert_eq!(effects.len(), 10);
    let tokens: std::collections::HashSet<_> = effects.iter().map(|(_, t)| t.clone()).collect();
    assert_eq!(
        tokens.len(),
        10,
        "every effect has its own idempotency token"
    );
    let events = w.event_types(&id).await;
    assert_eq!(events.first().map(String::as_str), Some("ExecutionQueued"));
    assert_eq!(events[1], "ExecutionStarted");
    assert_eq!(
        events.last().map(String::as_str),
        Some("ExecutionSucceeded")
    );
    assert_eq!(events.iter().filter(|e| *e == "StageSucceeded").count(), 11);
}

#[tokio::test]
async fn a_durable_sleep_releases_the_instance_and_resumes_by_replay() {
    let w = world().await;
    let id = w
        .trigger("hello", json!({"name": "Ada", "pauseSeconds": 60}))
        .await;
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Waiting);
    w.clock.advance(30_000);
    w.settle().await;
    assert_eq!(
        w.status(&id).await,
        ExecutionStatus::Waiting,
        "the timer is not due yet"
    );
    w.clock.advance(30_000);
    w.settle().await;
    let (execution, stages) = w.engine.execution(&id).await.unwrap().unwrap();
    assert_eq!(execution.status, ExecutionStatus::Succeeded);
    let output = execution.output_json.unwrap().value();
    assert_eq!(
        output["greetedAt"],
        json!(T0),
        "time.now was replayed, not read again"
    );
    assert_eq!(output["farewellAt"], json!(T0 + 60_000));
    assert_eq!(stages.len(), 2);
    let events = w.event_types(&id).await;
    assert!(events.contains(&"ExecutionWaiting".to_owned()));
    assert_eq!(
        events.iter().filter(|e| *e == "ExecutionStarted").count(),
        2,
        "started, waited, started again"
    );
}

#[tokio::test]
async fn an_approval_wait_holds_until_approved_with_the_current_digest() {
    let w = world().await;
    let id = w
        .trigger(
            "fixture-steps",
            json!({"zone": "Z1", "approval": true, "stages": 2}),
        )
        .await;
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Waiting);
    w.clock.advance(86_400_000);
    w.settle().await;
    assert_eq!(
        w.status(&id).await,
        ExecutionStatus::Waiting,
        "time alone does not approve"
    );
    let pending = w.engine.pending_approval(&id).await.unwrap().unwrap();
    assert_eq!(pending.name.as_deref(), Some("plan"));
    assert_eq!(pending.payload_json, Some(json!(2)));
    let stale = w
        .engine
        .approve(&id, &"f".repeat(64), json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(stale, EngineError::StaleApproval { ref current } if current == &"0".repeat(64)),
        "{stale:?}"
    );
    assert!(
        w.cloud.effects().is_empty(),
        "nothing happened before approval"
    );
    w.engine
        .approve(&id, &"0".repeat(64), json!({"approvedBy": "ops"}))
        .await
        .unwrap();
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Succeeded);
    assert_eq!(w.cloud.effects().len(), 2);
}

#[tokio::test]
async fn waiting_for_convergence_polls_with_backoff_without_holding_an_instance() {
    let w = world().await;
    w.cloud.0.lock().unwrap().insync_after = 3;
    let id = w
        .trigger(
            "point-record",
            json!({"host": "docs.example.com", "target": "d1.cdn.example"}),
        )
        .await;
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Waiting);
    let (_, stages) = w.engine.execution(&id).await.unwrap().unwrap();
    assert_eq!(stages.last().unwrap().status, StageStatus::Waiting);
    for _ in 0..10 {
        w.clock.advance(5_000);
        w.settle().await;
    }
    assert_eq!(w.status(&id).await, ExecutionStatus::Succeeded);
    assert_eq!(
        w.cloud.effects().len(),
        1,
        "the change was made once across all replays"
    );
}

#[tokio::test]
async fn convergence_that_never_comes_times_out_and_pauses_the_execution() {
    let w = world().await;
    w.cloud.0.lock().unwrap().insync_after = u32::MAX;
    let id = w
        .trigger(
            "point-record",
            json!({"host": "docs.example.com", "target": "d1.cdn.example"}),
        )
        .await;
    for _ in 0..40 {
        w.settle().await;
        w.clock.advance(5_000);
    }
    let (execution, stages) = w.engine.execution(&id).await.unwrap().unwrap();
    assert_eq!(execution.status, ExecutionStatus::Paused);
    assert_eq!(execution.status_reason.as_deref(), Some("timeout"));
    assert_eq!(
        stages.last().unwrap().error_json.as_ref().unwrap().value()["error"],
        "timeout"
    );
}

#[tokio::test]
async fn a_transient_failure_pauses_and_resume_retries_the_failed_call_without_repeating_earlier_effects()
 {
    let w = world().await;
    let id = w
        .trigger(
            "fixture-steps",
            json!({"zone": "Z1", "stages": 4, "sleepSeconds": 1}),
        )
        .await;
    w.settle().await;
    assert_eq!(w.cloud.effects().len(), 1, "step-1 is done; the run sleeps");
    w.cloud.fail(
        "dns.change-records",
        5,
        CapabilityError::transient("throttled", "slow down"),
    );
    w.clock.advance(1_000);
    w.settle().await;
    let (execution, stages) = w.engine.execution(&id).await.unwrap().unwrap();
    assert_eq!(execution.status, ExecutionStatus::Paused);
    assert_eq!(execution.status_reason.as_deref(), Some("throttled"));
    assert_eq!(stages.last().unwrap().status, StageStatus::Failed);
    assert_eq!(
        stages.last().unwrap().error_json.as_ref().unwrap().value()["kind"],
        "transient"
    );

    assert_eq!(stages.len(), 2);
    let resumed = w.engine.resume(&id).await.unwrap();
    assert_eq!(resumed.execution.status, ExecutionStatus::Queued);
    let again = w.engine.resume(&id).await.unwrap();
    assert!(
        again.reused,
        "a second resume while the first is pending reports retry_already_queued"
    );
    for _ in 0..5 {
        w.settle().await;
        w.clock.advance(1_000);
    }
    let (execution, stages) = w.engine.execution(&id).await.unwrap().unwrap();
    assert_eq!(
        execution.status,
        ExecutionStatus::Succeeded,
        "{execution:?}"
    );
    assert!(
        stages.iter().all(|s| s.status == StageStatus::Succeeded),
        "{stages:?}"
    );
    assert_eq!(stages.len(), 5, "the failed stage was retried in place");
    assert_eq!(
        w.cloud.effects().len(),
        4,
        "each of the four changes happened once"
    );
    let receipts = w.store.receipts(&id).await.unwrap();
    assert_eq!(receipts.len(), 4);
    // The resume truncated the journal at the failed call: the calls from there on run under
    // the run's next epoch, so their tokens are new requests; step-1's kept its token.
    let run = w.store.run(&execution.run_id).await.unwrap().unwrap();
    assert_eq!(run.epoch, 1);
    let epochs: Vec<&str> = receipts
        .iter()
        .map(|r| {
            assert!(r.id.starts_with(&format!("{}:", run.id)), "{}", r.id);
            r.id.split(':').nth(1).unwrap()
        })
        .collect();
    assert_eq!(epochs, ["0", "1", "1", "1"]);
}

#[tokio::test]
async fn rollback_compensates_receipts_in_reverse_as_visible_stages_and_restores_the_cloud() {
    let w = world().await;
    let before = w.cloud.records();
    let id = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 3}))
        .await;
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Succeeded);
    assert_eq!(w.cloud.records().len(), 3);

    let outcome = w.engine.rollback(&id).await.unwrap();
    assert!(!outcome.immediate);
    let command = outcome.command.unwrap();
    let dup = w.engine.rollback(&id).await.unwrap();
    assert!(
        dup.reused && dup.command.unwrap().id == command.id,
        "a pending duplicate is returned"
    );
    w.settle().await;
    let (execution, stages) = w.engine.execution(&id).await.unwrap().unwrap();
    assert_eq!(execution.status, ExecutionStatus::RolledBack);
    let rollback: Vec<_> = stages
        .iter()
        .filter(|s| s.stage_name.starts_with("rollback:"))
        .collect();
    assert_eq!(rollback.len(), 3);
    assert!(rollback.iter().all(|s| s.status == StageStatus::Succeeded));
    assert_eq!(w.cloud.records(), before, "the cloud is as it was");
    assert!(
        w.store
            .receipts(&id)
            .await
            .unwrap()
            .iter()
            .all(|r| r.compensated_ms.is_some())
    );
    let commands = w.store.commands(&id).await.unwrap();
    assert_eq!(
        commands.last().unwrap().status,
        capstan_core::store::CommandStatus::Completed
    );
    let again = w.engine.rollback(&id).await.unwrap_err();
    assert!(matches!(
        again,
        EngineError::StateInvalid {
            reason: "not_rollbackable",
            ..
        }
    ));
}

#[tokio::test]
async fn rollback_refuses_active_executions_and_is_immediate_without_receipts() {
    let w = world().await;
    let id = w
        .trigger("hello", json!({"name": "x", "pauseSeconds": 10}))
        .await;
    let queued = w.engine.rollback(&id).await.unwrap_err();
    assert!(
        matches!(queued, EngineError::StateInvalid { reason: "not_rollbackable", ref message } if message.contains("cancel it first"))
    );
    w.settle().await;
    w.clock.advance(10_000);
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Succeeded);
    let outcome = w.engine.rollback(&id).await.unwrap();
    assert!(outcome.immediate && outcome.command.is_none());
    assert_eq!(outcome.execution.status, ExecutionStatus::RolledBack);
}

#[tokio::test]
async fn cancel_stops_a_waiting_execution_and_refuses_a_finished_one() {
    let w = world().await;
    let id = w
        .trigger("hello", json!({"name": "x", "pauseSeconds": 600}))
        .await;
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Waiting);
    let canceled = w.engine.cancel(&id).await.unwrap();
    assert_eq!(canceled.execution.status, ExecutionStatus::Canceled);
    assert!(!canceled.cancellation_requested);
    w.clock.advance(600_000);
    w.settle().await;
    assert_eq!(
        w.status(&id).await,
        ExecutionStatus::Canceled,
        "the timer does not revive it"
    );
    assert!(
        w.event_types(&id)
            .await
            .contains(&"ExecutionCanceled".to_owned())
    );
    let again = w.engine.cancel(&id).await.unwrap_err();
    assert!(matches!(
        again,
        EngineError::StateInvalid {
            reason: "not_cancelable",
            ..
        }
    ));
}

#[tokio::test]
async fn a_journal_that_does_not_match_the_component_pauses_with_nondeterministic_replay() {
    let w = world().await;
    let id = w
        .trigger(
            "fixture-steps",
            json!({"zone": "Z1", "stages": 2, "sleepSeconds": 5}),
        )
        .await;
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Waiting);
    // The journal says the first stage had another name: as if the code changed under the run.
    w.rename_first_recorded_stage(&id).await;
    w.clock.advance(5_000);
    w.settle().await;
    let execution = w.store.execution(&id).await.unwrap().unwrap();
    assert_eq!(execution.status, ExecutionStatus::Paused);
    assert_eq!(
        execution.status_reason.as_deref(),
        Some("nondeterministic_replay")
    );
    let paused = w
        .store
        .events(&id)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.event_type == "ExecutionPaused")
        .unwrap();
    assert!(
        paused.payload_json.value()["message"]
            .as_str()
            .unwrap()
            .contains("journal recorded"),
        "{paused:?}"
    );
}

#[tokio::test]
async fn sandbox_limits_fail_the_stage_with_a_clear_error_and_other_executions_continue() {
    let w = world().await;
    let looping = w
        .trigger("fixture-misbehave", json!({"action": "loop"}))
        .await;
    let fine = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 1}))
        .await;
    w.settle().await;
    let (execution, stages) = w.engine.execution(&looping).await.unwrap().unwrap();
    assert_eq!(execution.status, ExecutionStatus::Failed);
    let error = stages[0].error_json.clone().unwrap().value();
    assert_eq!(error["error"], "limit_exceeded");
    assert!(
        error["message"].as_str().unwrap().contains("CPU budget"),
        "{error}"
    );
    assert_eq!(w.status(&fine).await, ExecutionStatus::Succeeded);

    // Over a bound on what a guest hands the host: the stage fails naming the setting, and the
    // journal holds nothing of the refused call (a replay has nothing huge to read back).
    for (action, setting) in [
        ("log-flood", "runtime.limits.log_bytes"),
        ("sleep-forever", "runtime.limits.deadline_ms"),
    ] {
        let id = w
            .trigger("fixture-misbehave", json!({"action": action}))
            .await;
        w.settle().await;
        let (execution, stages) = w.engine.execution(&id).await.unwrap().unwrap();
        assert_eq!(execution.status, ExecutionStatus::Failed, "{action}");
        assert_eq!(
            execution.status_reason.as_deref(),
            Some("limit_exceeded"),
            "{action}"
        );
        let error = stages[0].error_json.clone().unwrap().value();
        assert_eq!(error["error"], "limit_exceeded", "{action}");
        assert!(
            error["message"].as_str().unwrap().contains(setting),
            "{action}: {error}"
        );
    }

    let failing = w
        .trigger("fixture-misbehave", json!({"action": "fail"}))
        .await;
    w.settle().await;
    assert_eq!(
        w.status(&failing).await,
        ExecutionStatus::Paused,
        "a guest's transient error pauses"
    );
}

#[tokio::test]
async fn a_replayed_call_that_reaches_a_token_used_for_another_call_pauses_instead_of_taking_its_answer()
 {
    let w = world().await;
    let id = w
        .trigger(
            "fixture-steps",
            json!({"zone": "Z1", "stages": 2, "sleepSeconds": 5}),
        )
        .await;
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Waiting);
    // An earlier attempt, whose journal a crash lost, used the token of the next effect for
    // another change (the guest had branched on a read that was not kept).
    let run_id = w.store.execution(&id).await.unwrap().unwrap().run_id;
    let run = w.store.run(&run_id).await.unwrap().unwrap();
    let journal = w.store.journal(&run_id).await.unwrap();
    let next_effect = journal.len() + 1; // after the sleep: stage-begin, then the change
    let token = format!("{}:{}:{next_effect}", run.id, run.epoch);
    let elsewhere =
        json!({"change_id": "C-other", "zone_id": "Z1", "status": "Pending", "prior": []});
    w.cloud.0.lock().unwrap().by_token.insert(
        token.clone(),
        (
            "dns.change-records".to_owned(),
            json!({"zone_id": "Z1", "changes": []}),
            elsewhere,
        ),
    );
    let effects_before = w.cloud.effects().len();

    w.clock.advance(5_000);
    w.settle().await;
    let (execution, _) = w.engine.execution(&id).await.unwrap().unwrap();
    assert_eq!(execution.status, ExecutionStatus::Paused);
    assert_eq!(
        execution.status_reason.as_deref(),
        Some("nondeterministic_replay")
    );
    let paused = w
        .store
        .events(&id)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.event_type == "ExecutionPaused")
        .unwrap();
    assert!(
        paused.payload_json.value()["message"]
            .as_str()
            .unwrap()
            .contains("earlier attempt's different call"),
        "{paused:?}"
    );
    assert_eq!(
        w.cloud.effects().len(),
        effects_before,
        "nothing changed at the provider"
    );
    let receipts = w.store.receipts(&id).await.unwrap();
    assert!(
        receipts.iter().all(|r| r.id != token),
        "the other call's answer was not taken as this call's receipt: {receipts:?}"
    );
    let journal = w.store.journal(&run_id).await.unwrap();
    assert!(
        journal.iter().all(|e| e.seq != next_effect as i64),
        "nothing journaled at the diverging call"
    );
}

/// Performs the effect, then never answers: the node "dies" between effect and commit.
struct Hang {
    cloud: FakeCloud,
    after_effects: usize,
}

#[async_trait]
impl Providers for Hang {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Result<Value, CapabilityError> {
        let answer = self.cloud.call(op, request, token).await;
        if self.cloud.effects().len() >= self.after_effects {
            std::future::pending::<()>().await;
        }
        answer
    }
}

#[tokio::test]
async fn a_node_dying_between_effect_and_commit_is_taken_over_and_the_effect_is_not_repeated() {
    let w = world().await;
    let id = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 3}))
        .await;
    let dying = Engine::new(
        Arc::new(w.store.clone()),
        runtime(),
        Arc::new(Hang {
            cloud: w.cloud.clone(),
            after_effects: 2,
        }),
        Arc::new(w.clock.clone()),
        config("node-dying"),
    );
    dying.register(w.engine.workflow("fixture-steps").unwrap());
    let task = tokio::spawn(async move { dying.run_once().await });
    for _ in 0..200 {
        if w.cloud.effects().len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    task.abort();
    assert_eq!(w.cloud.effects().len(), 2);
    w.settle().await;
    assert_eq!(
        w.status(&id).await,
        ExecutionStatus::Running,
        "the lease still belongs to the dead node"
    );
    w.clock.advance(31_000);
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Succeeded);
    assert_eq!(
        w.cloud.effects().len(),
        3,
        "the interrupted effect was answered from its token, not repeated"
    );
    assert_eq!(w.store.receipts(&id).await.unwrap().len(), 3);
    let run = w
        .store
        .run(&w.store.execution(&id).await.unwrap().unwrap().run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run.kind, RunKind::Workflow);
    assert!(run.activations >= 2);
}

#[tokio::test]
async fn retry_finalization_replays_earlier_stages_and_reruns_only_finalize() {
    let w = world().await;
    w.cloud.fail(
        "dns.get-change",
        1,
        CapabilityError::permanent("not-found", "gone"),
    );
    let id = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 2}))
        .await;
    w.settle().await;
    let (execution, stages) = w.engine.execution(&id).await.unwrap().unwrap();
    assert_eq!(execution.status, ExecutionStatus::Failed);
    assert_eq!(stages.last().unwrap().stage_name, "finalize");
    let effects = w.cloud.effects().len();
    let outcome = w.engine.recover(&id, "retry-finalization").await.unwrap();
    assert_eq!(outcome.execution.status, ExecutionStatus::Queued);
    // While it is pending: the same recovery again is that command; any other is refused.
    let again = w.engine.recover(&id, "retry-finalization").await.unwrap();
    assert!(again.reused);
    assert_eq!(again.command.map(|c| c.id), outcome.command.map(|c| c.id));
    for refused in [
        w.engine
            .recover(&id, "retry-maps-whitelist")
            .await
            .unwrap_err(),
        w.engine.rollback(&id).await.unwrap_err(),
    ] {
        assert!(
            matches!(
                refused,
                EngineError::StateInvalid {
                    reason: "command_pending",
                    ..
                }
            ),
            "{refused:?}"
        );
    }
    w.settle().await;
    let (execution, stages) = w.engine.execution(&id).await.unwrap().unwrap();
    assert_eq!(
        execution.status,
        ExecutionStatus::Succeeded,
        "{execution:?}"
    );
    assert_eq!(
        w.cloud.effects().len(),
        effects,
        "no stage before finalize ran again"
    );
    let finalize: Vec<_> = stages
        .iter()
        .filter(|s| s.stage_name == "finalize")
        .map(|s| s.status)
        .collect();
    assert_eq!(
        finalize,
        [StageStatus::Failed, StageStatus::Succeeded],
        "the failed attempt stays visible"
    );
    let unknown = w
        .engine
        .recover(&id, "retry-maps-whitelist")
        .await
        .unwrap_err();
    assert!(
        matches!(
            unknown,
            EngineError::StateInvalid {
                reason: "not_supported",
                ..
            }
        ),
        "{unknown:?}"
    );
}

#[tokio::test]
async fn idempotent_triggers_create_one_execution() {
    let w = world().await;
    let req = |body: &str| TriggerRequest {
        workflow: "hello".into(),
        principal_id: "ops".into(),
        input: json!({"name": "x"}),
        idempotency: Some(("key-1".into(), body.into())),
        traceparent: None,
    };
    let first = w.engine.trigger(req("sha-a")).await.unwrap();
    assert!(!first.replayed);
    let again = w.engine.trigger(req("sha-a")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.execution.id, first.execution.id);
    let conflict = w.engine.trigger(req("sha-b")).await.unwrap_err();
    assert!(matches!(conflict, EngineError::IdempotencyConflict));

    // Concurrent repeats of one new key: one execution, every other request replays it.
    let key = |k: &str| TriggerRequest {
        idempotency: Some((k.into(), "sha-a".into())),
        ..req("sha-a")
    };
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (engine, request) = (w.engine.clone(), key("key-2"));
        tasks.spawn(async move { engine.trigger(request).await.unwrap() });
    }
    let racing = tasks.join_all().await;
    assert_eq!(
        racing.iter().filter(|t| !t.replayed).count(),
        1,
        "one creates"
    );
    assert!(
        racing
            .iter()
            .all(|t| t.execution.id == racing[0].execution.id)
    );
    let executions = w
        .store
        .list_executions(&ExecutionFilter {
            limit: 100,
            ..ExecutionFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        executions.len(),
        2,
        "key-1 and key-2 made one execution each"
    );

    // A key is kept 24 hours; then the same key (with any body) makes a new execution.
    w.clock.advance(24 * 3_600_000 + 1_000);
    let later = w.engine.trigger(req("sha-b")).await.unwrap();
    assert!(!later.replayed);
    assert_ne!(later.execution.id, first.execution.id);
    assert!(w.engine.trigger(req("sha-b")).await.unwrap().replayed);

    // A reservation left without its execution (a crash between the two writes) blocks its
    // key for a minute (409 reservation_replay_pending), then the key is taken over.
    let now = capstan_core::Clock::now_millis(&w.clock) as i64;
    w.store
        .apply(
            None,
            vec![Write::InsertIdempotency(IdempotencyRecord {
                principal_id: "ops".into(),
                workflow: "hello".into(),
                key: "legacy".into(),
                body_sha256: "sha-a".into(),
                execution_id: None,
                response_json: None,
                created_ms: now,
            })],
        )
        .await
        .unwrap();
    let pending = w.engine.trigger(key("legacy")).await.unwrap_err();
    assert!(
        matches!(pending, EngineError::ReservationPending),
        "{pending:?}"
    );
    w.clock.advance(61_000);
    let taken = w.engine.trigger(key("legacy")).await.unwrap();
    assert!(!taken.replayed);
    let record = w
        .store
        .idempotency("ops", "hello", "legacy")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.execution_id.as_deref(),
        Some(taken.execution.id.as_str())
    );

    let unknown = w
        .engine
        .trigger(TriggerRequest {
            workflow: "nope".into(),
            principal_id: "ops".into(),
            input: json!({}),
            idempotency: None,
            traceparent: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(unknown, EngineError::UnknownWorkflow(_)));
}

#[tokio::test]
async fn a_capability_retry_policy_replaces_the_default_for_its_calls() {
    let transient = CapabilityError::transient("throttled", "slow down");
    // The default (3 attempts) absorbs two transient failures.
    let w = world().await;
    w.cloud.fail("dns.change-records", 2, transient.clone());
    let id = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 1}))
        .await;
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Succeeded);

    // A DNS policy of one attempt hands the first one to the guest, which pauses.
    let mut strict = config("node-a");
    strict.provider_retry_by_capability.insert(
        capstan_core::Capability::Dns,
        Backoff {
            initial_ms: 0,
            max_ms: 0,
            max_attempts: 1,
        },
    );
    assert_eq!(strict.retry_policy("dns.change-records").max_attempts, 1);
    assert_eq!(strict.retry_policy("maps.add-referrer").max_attempts, 3);
    let w = world_with(strict).await;
    w.cloud.fail("dns.change-records", 1, transient);
    let id = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 1}))
        .await;
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Paused);
}

#[tokio::test]
async fn workflows_check_replays_the_journals_in_flight_against_a_candidate() {
    let w = world().await;
    let input = json!({"zone": "Z1", "stages": 2, "sleepSeconds": 5});
    let a = w.trigger("fixture-steps", input.clone()).await;
    let b = w.trigger("fixture-steps", input).await;
    w.settle().await;
    assert_eq!(w.status(&a).await, ExecutionStatus::Waiting);
    let candidate = load("guest-fixtures/fixture-steps.wasm").await;
    let checks = w.engine.check_candidate(candidate.clone()).await.unwrap();
    assert_eq!(checks.len(), 2);
    for c in &checks {
        assert_eq!(c.verdict, "compatible", "{c:?}");
        assert!(c.same_build);
        assert!(c.replayed > 0 && c.replayed <= c.journal_length, "{c:?}");
    }
    // As if the code changed under run b: its first recorded call differs from the candidate's.
    let run_b = w.rename_first_recorded_stage(&b).await;
    let journal_before = w.store.journal(&run_b).await.unwrap().len();
    let checks = w.engine.check_candidate(candidate).await.unwrap();
    let of = |id: &str| checks.iter().find(|c| c.execution_id == id).unwrap();
    assert_eq!(of(&a).verdict, "compatible");
    assert_eq!(of(&b).verdict, "diverges");
    assert_eq!(of(&b).replayed, 0);
    assert!(of(&b).detail.as_deref().unwrap().contains("renamed"));
    // Checking changes nothing.
    assert_eq!(w.status(&b).await, ExecutionStatus::Waiting);
    assert_eq!(w.store.journal(&run_b).await.unwrap().len(), journal_before);
}

/// Every control command from every status: the DESIGN.md status machine and the seed's
/// transition table as one matrix. `Some(s)` = accepted, and the execution ends in `s` once the
/// workers are idle; `None` = refused with `state_invalid`, changing nothing. `running` is held
/// by a provider call a second engine makes; "approval" is `waiting` for a plan approval.
#[tokio::test]
async fn every_command_from_every_status_follows_the_status_machine() {
    use ExecutionStatus::*;
    let w = world().await;
    let transient = CapabilityError::transient("throttled", "slow down");
    let permanent = CapabilityError::permanent("refused", "no");
    let input = json!({"zone": "Z1", "stages": 1});
    let states = [
        "queued",
        "running",
        "waiting",
        "approval",
        "paused",
        "failed",
        "succeeded",
        "canceled",
        "rolled_back",
    ];
    let commands = [
        "cancel",
        "rollback",
        "resume",
        "retry-finalization",
        "retry-maps-whitelist",
        "approve",
    ];
    // Rows: state; columns: commands. None = refused.
    #[rustfmt::skip]
    let expected: [[Option<ExecutionStatus>; 6]; 9] = [
        /* queued      */ [Some(Canceled), None, None, None, None, None],
        /* running     */ [Some(Canceled), None, None, None, None, None],
        /* waiting     */ [Some(Canceled), None, None, None, None, None],
        /* approval    */ [Some(Canceled), None, None, None, None, Some(Succeeded)],
        /* paused      */ [Some(Canceled), Some(RolledBack), Some(Succeeded), None, None, None],
        /* failed      */ [None, Some(RolledBack), None, None, None, None],
        /* succeeded   */ [None, Some(RolledBack), None, None, None, None],
        /* canceled    */ [None, Some(RolledBack), None, None, None, None],
        /* rolled_back */ [None, None, None, None, None, None],
    ];
    let mut exercised = std::collections::BTreeSet::new();
    for (row_of_state, state) in states.iter().enumerate() {
        for (col, command) in commands.iter().enumerate() {
            // Nothing else runnable: a held run is this cell's.
            if *state == "running" {
                w.settle().await;
            }
            // An execution in `state`.
            let id = match *state {
                "waiting" => {
                    w.trigger(
                        "fixture-steps",
                        json!({"zone": "Z1", "stages": 1, "sleepSeconds": 60}),
                    )
                    .await
                }
                "approval" => {
                    w.trigger(
                        "fixture-steps",
                        json!({"zone": "Z1", "stages": 1, "approval": true}),
                    )
                    .await
                }
                _ => w.trigger("fixture-steps", input.clone()).await,
            };
            let mut held = None;
            match *state {
                "queued" => {}
                "running" => held = Some(Gate::hold(&w, w.cloud.effects().len() + 1).await),
                "paused" => {
                    w.cloud.fail("dns.change-records", 100, transient.clone());
                    w.settle().await;
                    w.cloud.fail("dns.change-records", 0, transient.clone());
                }
                "failed" => {
                    w.cloud.fail("dns.change-records", 1, permanent.clone());
                    w.settle().await;
                }
                "canceled" => {
                    w.engine.cancel(&id).await.unwrap();
                    w.settle().await;
                }
                "rolled_back" => {
                    w.settle().await;
                    w.engine.rollback(&id).await.unwrap();
                    w.settle().await;
                }
                _ => w.settle().await,
            }
            let status = w.status(&id).await;
            assert_eq!(
                status.as_str(),
                if *state == "approval" {
                    "waiting"
                } else {
                    state
                },
                "setting up {state}"
            );
            // The table's row for this command, from the facts as they stand.
            let on = match *command {
                "cancel" => On::Cancel,
                "rollback" => On::Rollback,
                "resume" => On::Resume,
                "approve" => On::Approve,
                _ => On::Recover,
            };
            let facts = table_facts(&w, &id, command, held.is_some()).await;
            let row = transitions::decide(on, status, &facts).expect("a command row");
            exercised.insert(row_index(row));
            let events_before = w.event_types(&id).await.len();
            let result = match *command {
                "cancel" => w.engine.cancel(&id).await.map(|_| ()),
                "rollback" => w.engine.rollback(&id).await.map(|_| ()),
                "resume" => w.engine.resume(&id).await.map(|_| ()),
                "approve" => w
                    .engine
                    .approve(&id, &"0".repeat(64), json!({"approvedBy": "ops"}))
                    .await
                    .map(|_| ()),
                _ => w.engine.recover(&id, command).await.map(|_| ()),
            };
            // Right after the command, the status is the row's (a queued rollback moves it
            // later, through its run).
            let refused = matches!(row.answer, Answer::Refused(_));
            assert_eq!(
                result.is_err(),
                refused,
                "{command} from {state}: row {row:?}"
            );
            if !refused {
                assert_eq!(
                    w.status(&id).await,
                    row.to.unwrap_or(status),
                    "{command} from {state}: row {row:?}"
                );
            }
            if let Some((gate, _engine, task)) = held {
                gate.release.notify_one();
                task.await.unwrap().unwrap();
            }
            match (expected[row_of_state][col], result) {
                (Some(end), Ok(())) => {
                    w.settle().await;
                    assert_eq!(w.status(&id).await, end, "{command} from {state}");
                }
                (None, Err(EngineError::StateInvalid { .. })) => {
                    if *state != "running" {
                        assert_eq!(
                            w.status(&id).await,
                            status,
                            "{command} from {state} changed the status"
                        );
                        assert_eq!(
                            w.event_types(&id).await.len(),
                            events_before,
                            "{command} from {state} emitted events"
                        );
                    }
                }
                (want, got) => panic!("{command} from {state}: expected {want:?}, got {got:?}"),
            }
        }
    }
    // What this matrix leaves to other tests: pending commands, cooperative cancel, the point
    // of no return, declared recoveries that apply, stale and repeated approvals. `just test`
    // reports the rows no test of the suite decided (`capstan_core::transitions::witness`).
    let unexercised: Vec<String> = transitions::TABLE
        .iter()
        .enumerate()
        .filter(|(i, r)| r.on.is_command() && !exercised.contains(i))
        .map(|(i, r)| format!("row {i}: {:?} {:?} from {:?}", r.on, r.when, r.from))
        .collect();
    eprintln!(
        "command rows this matrix did not exercise ({}):\n{}",
        unexercised.len(),
        unexercised.join("\n")
    );
}

/// The position of `row` in the table.
fn row_index(row: &transitions::Row) -> usize {
    transitions::TABLE
        .iter()
        .position(|r| std::ptr::eq(r, row))
        .expect("a row of TABLE")
}

/// The facts the table's command rows read, as the store has them (fixture-steps declares
/// no cooperative cancel, no point of no return and no terminal-only rollback; of the
/// recoveries only `retry-finalization`, for failed executions).
async fn table_facts(w: &World, id: &str, command: &str, leased: bool) -> Facts {
    let execution = w.store.execution(id).await.unwrap().unwrap();
    let pending = w
        .store
        .commands(id)
        .await
        .unwrap()
        .into_iter()
        .rev()
        .find(|c| c.status.is_pending())
        .map(|c| c.operation);
    let receipts = w.store.receipts(id).await.unwrap();
    let journal = w.store.journal(&execution.run_id).await.unwrap();
    let reached_finalize = journal.iter().any(|e| {
        e.op == "context.stage-begin"
            && e.request.value().get("name").and_then(Value::as_str) == Some("finalize")
    });
    let approval = w.engine.pending_approval(id).await.unwrap();
    Facts {
        pending,
        operation: Some(command.to_owned()),
        leased,
        not_declared: command != "retry-finalization",
        not_eligible: execution.status != ExecutionStatus::Failed,
        stage_not_reached: !reached_finalize,
        nothing_to_compensate: receipts.iter().all(|r| r.compensated_ms.is_some()),
        no_approval_wait: approval.is_none(),
        ..Facts::default()
    }
}

/// Holds the `at`-th effect (counted from 1) until it is released, then answers it.
struct Gate {
    cloud: FakeCloud,
    at: usize,
    reached: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
}

impl Gate {
    fn new(cloud: &FakeCloud, at: usize) -> Self {
        Self {
            cloud: cloud.clone(),
            at,
            reached: Arc::default(),
            release: Arc::default(),
        }
    }

    /// Runs the due work on an engine of its own that calls through a gate at the `at`-th
    /// effect, and returns once that effect is held: the gate, that engine, and its run.
    async fn hold(
        w: &World,
        at: usize,
    ) -> (
        Arc<Self>,
        Engine,
        tokio::task::JoinHandle<Result<usize, EngineError>>,
    ) {
        let gate = Arc::new(Self::new(&w.cloud, at));
        let engine = Engine::new(
            Arc::new(w.store.clone()),
            runtime(),
            gate.clone(),
            Arc::new(w.clock.clone()),
            config("node-a"),
        );
        engine.register(w.engine.workflow("fixture-steps").unwrap());
        let reached = gate.reached.notified();
        let running = engine.clone();
        let task = tokio::spawn(async move { running.run_once().await });
        reached.await;
        (gate, engine, task)
    }
}

#[async_trait]
impl Providers for Gate {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Result<Value, CapabilityError> {
        if !token.is_empty() && self.cloud.effects().len() + 1 == self.at {
            let released = self.release.notified();
            self.reached.notify_one();
            released.await;
        }
        self.cloud.call(op, request, token).await
    }
}

#[tokio::test]
async fn a_slow_provider_does_not_hide_the_progress_before_its_call() {
    let w = world().await;
    let id = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 3}))
        .await;
    let (gate, _engine, task) = Gate::hold(&w, 3).await;
    // The third stage's effect is held: what came before it is committed while it waits
    // (effects answered fast ride the activation's next commit; this one is slow).
    let mut committed = Vec::new();
    for _ in 0..500 {
        committed = w.engine.execution(&id).await.unwrap().unwrap().1;
        if committed.len() == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let stages: Vec<_> = committed
        .iter()
        .map(|s| (s.stage_name.as_str(), s.status))
        .collect();
    assert_eq!(
        stages,
        [
            ("step-1", StageStatus::Succeeded),
            ("step-2", StageStatus::Succeeded),
            ("step-3", StageStatus::Running)
        ]
    );
    assert_eq!(w.store.receipts(&id).await.unwrap().len(), 2);
    assert_eq!(
        w.event_types(&id)
            .await
            .iter()
            .filter(|e| *e == "StageStarted")
            .count(),
        3
    );
    gate.release.notify_one();
    task.await.unwrap().unwrap();
    assert_eq!(w.status(&id).await, ExecutionStatus::Succeeded);
    assert_eq!(w.store.receipts(&id).await.unwrap().len(), 3);
}

#[tokio::test]
async fn an_immediate_cancel_keeps_the_receipts_of_the_effects_before_it_and_rollback_undoes_them()
{
    let w = world().await;
    let id = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 5}))
        .await;
    let (gate, engine, task) = Gate::hold(&w, 3).await;
    // Canceled while the third effect is under way: it completes, and the run stops at its next
    // call with three effects done.
    let canceled = engine.cancel(&id).await.unwrap();
    assert!(
        canceled.cancellation_requested,
        "a worker holds the run: the cancel is requested until it stops the run"
    );
    assert_eq!(canceled.execution.status, ExecutionStatus::Running);
    assert!(canceled.execution.cancellation_requested_ms.is_some());
    gate.release.notify_one();
    task.await.unwrap().unwrap();
    assert_eq!(w.status(&id).await, ExecutionStatus::Canceled);
    assert_eq!(w.cloud.effects().len(), 3);
    let receipts = w.store.receipts(&id).await.unwrap();
    assert_eq!(receipts.len(), 3, "{receipts:?}");
    let before = w.cloud.records();
    assert_eq!(before.len(), 3);
    w.engine.rollback(&id).await.unwrap();
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::RolledBack);
    assert!(
        w.cloud.records().is_empty(),
        "every change was undone: {:?}",
        w.cloud.records()
    );
}

/// With the node's scheduler running, a trigger that finds a worker slot free inserts its run
/// already leased to this node and starts it there (no claim); one that finds every slot taken
/// inserts its run unleased, and the claimer takes it when the slot frees. Every run is
/// activated once and both executions end as the claimed path would end them.
#[tokio::test]
async fn a_trigger_starts_its_run_in_a_free_slot_and_the_claimer_takes_the_rest() {
    let w = world().await;
    let gate = Arc::new(Gate::new(&w.cloud, 2));
    let mut one_slot = config("node-a");
    one_slot.workers = 1;
    // Only wake-ups and freed slots claim here, never the alarm.
    one_slot.poll = std::time::Duration::from_secs(3_600);
    one_slot.idle_poll = std::time::Duration::from_secs(3_600);
    let engine = Engine::new(
        Arc::new(w.store.clone()),
        runtime(),
        gate.clone(),
        Arc::new(w.clock.clone()),
        one_slot,
    );
    engine.register(w.engine.workflow("fixture-steps").unwrap());
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let workers = engine.spawn_workers(stop_rx, None);
    let trigger = |stages: u32| {
        let engine = engine.clone();
        async move {
            engine
                .trigger(TriggerRequest {
                    workflow: "fixture-steps".into(),
                    principal_id: "ops".into(),
                    input: json!({"zone": "Z1", "stages": stages}),
                    idempotency: None,
                    traceparent: None,
                })
                .await
                .unwrap()
                .execution
        }
    };
    let reached = gate.reached.notified();
    let first = trigger(3).await;
    let first_run = w.store.run(&first.run_id).await.unwrap().unwrap();
    assert_eq!(first_run.lease_owner.as_deref(), Some("node-a"));
    assert_eq!(first_run.activations, 1);
    // The first run holds the only slot (its second effect is held at the gate).
    reached.await;
    let second = trigger(2).await;
    let second_run = w.store.run(&second.run_id).await.unwrap().unwrap();
    assert_eq!(second_run.lease_owner, None, "{second_run:?}");
    assert_eq!(second_run.activations, 0);
    gate.release.notify_one();
    for execution in [&first, &second] {
        assert_eq!(
            ended(&w.store, &execution.id).await,
            ExecutionStatus::Succeeded
        );
        let run = w.store.run(&execution.run_id).await.unwrap().unwrap();
        assert_eq!(run.activations, 1, "{run:?}");
    }
    assert_eq!(w.store.receipts(&first.id).await.unwrap().len(), 3);
    assert_eq!(w.store.receipts(&second.id).await.unwrap().len(), 2);
    let events = w.event_types(&first.id).await;
    assert_eq!(events[..2], ["ExecutionQueued", "ExecutionStarted"]);
    stop.send(true).unwrap();
    for worker in workers {
        worker.await.unwrap();
    }
}

/// Clients triggering faster than two slots run them, each awaiting its execution before the
/// next: most triggers find every slot taken and leave their runs for the claimer, whose
/// wake-ups keep coming while finished runs free slots and its claims often come up short. With
/// the alarm an hour away, a wake-up the claimer lost would leave a run unclaimed and its
/// execution unfinished; every one ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_run_left_for_the_claimer_waits_for_its_alarm() {
    let w = world().await;
    let mut config = config("node-a");
    config.workers = 2;
    config.poll = std::time::Duration::from_secs(3_600);
    config.idle_poll = std::time::Duration::from_secs(3_600);
    let engine = node_on_the_real_clock(&w, config);
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let workers = engine.spawn_workers(stop_rx, None);
    let clients: Vec<_> = (0..8)
        .map(|client| {
            let engine = engine.clone();
            let store = w.store.clone();
            tokio::spawn(async move {
                for i in 0..40 {
                    let execution = trigger_on(&engine, 1 + (client + i) % 3).await;
                    assert_eq!(
                        ended(&store, &execution.id).await,
                        ExecutionStatus::Succeeded,
                        "{execution:?}"
                    );
                }
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }
    stop.send(true).unwrap();
    for worker in workers {
        worker.await.unwrap();
    }
}

/// A node's scheduler on the real clock, whose claimer never polls: only commits of this node,
/// the store's earliest wake time and `others` (another node's announcements) wake it.
fn unpolled_scheduler(
    w: &World,
    node: &str,
    others: Option<tokio::sync::watch::Receiver<u64>>,
) -> (
    Engine,
    tokio::sync::watch::Sender<bool>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let mut config = config(node);
    config.poll = std::time::Duration::from_millis(20);
    config.idle_poll = std::time::Duration::from_secs(3_600);
    let engine = node_on_the_real_clock(w, config);
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let workers = engine.spawn_workers(stop_rx, others);
    (engine, stop, workers)
}

/// A node of `w`'s store and cloud on the real clock, with `fixture-steps` loaded and no
/// scheduler running (its triggers leave their runs for a claim).
fn node_on_the_real_clock(w: &World, config: capstan_engine::EngineConfig) -> Engine {
    let engine = Engine::new(
        Arc::new(w.store.clone()),
        runtime(),
        Arc::new(w.cloud.clone()),
        Arc::new(capstan_core::SystemClock),
        config,
    );
    engine.register(w.engine.workflow("fixture-steps").unwrap());
    engine
}

async fn trigger_on(engine: &Engine, stages: u32) -> capstan_core::store::ExecutionRecord {
    engine
        .trigger(TriggerRequest {
            workflow: "fixture-steps".into(),
            principal_id: "ops".into(),
            input: json!({"zone": "Z1", "stages": stages}),
            idempotency: None,
            traceparent: None,
        })
        .await
        .unwrap()
        .execution
}

/// The execution's status once it ends, or after ten seconds.
async fn ended(store: &capstan_store::Store, id: &str) -> ExecutionStatus {
    let mut status = ExecutionStatus::Queued;
    for _ in 0..1_000 {
        status = store.execution(id).await.unwrap().unwrap().status;
        if status.is_terminal() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    status
}

/// A run left leased by a node that died is found by the claimer's read of when runs fall due,
/// after a claim that found nothing: it is taken over when the lease expires, with no poll.
#[tokio::test]
async fn an_idle_claimer_wakes_when_a_dead_nodes_lease_expires() {
    let w = world().await;
    // Triggered where no scheduler runs: the run waits for a claim.
    let origin = node_on_the_real_clock(&w, config("node-gone"));
    let execution = trigger_on(&origin, 2).await;
    // The node claims it and dies: its lease runs for another 300 ms.
    let now = capstan_core::Clock::now_millis(&capstan_core::SystemClock) as i64;
    let claimed = w.store.claim_runs("node-gone", now, 300, 8).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let (_engine, stop, workers) = unpolled_scheduler(&w, "node-a", None);
    assert_eq!(
        ended(&w.store, &execution.id).await,
        ExecutionStatus::Succeeded
    );
    let run = w.store.run(&execution.run_id).await.unwrap().unwrap();
    assert_eq!(
        run.activations, 2,
        "claimed by the dead node, then by node-a: {run:?}"
    );
    stop.send(true).unwrap();
    for worker in workers {
        worker.await.unwrap();
    }
}

/// A run this node's own commit schedules for later (a refused commit retried a second later)
/// sets the idle claimer's alarm: the retry runs on time, with no poll.
#[tokio::test]
async fn a_run_this_node_schedules_for_later_wakes_the_idle_claimer_then() {
    let w = world().await;
    w.cloud.write_behind(&w.store, 1);
    let (engine, stop, workers) = unpolled_scheduler(&w, "node-a", None);
    let execution = trigger_on(&engine, 2).await;
    assert_eq!(
        ended(&w.store, &execution.id).await,
        ExecutionStatus::Succeeded
    );
    let run = w.store.run(&execution.run_id).await.unwrap().unwrap();
    assert_eq!(run.activations, 2, "refused once, retried: {run:?}");
    stop.send(true).unwrap();
    for worker in workers {
        worker.await.unwrap();
    }
}

/// A trigger with a free slot starts its run before its commit is durable (SQLite queues the
/// commit ahead of the run's own). The run's provider here cannot answer behind its writes, so
/// before its first effect the run waits for the trigger's commit: every effect finds the run
/// already stored, and the first finds nothing of the activation's own committed (the trigger's
/// commit was the proof, not a commit of the run's); on PostgreSQL the trigger commits first,
/// with the same outcome.
#[tokio::test]
async fn a_run_started_ahead_of_its_trigger_makes_no_effect_before_it_is_durable() {
    let w = world().await;
    w.cloud.0.lock().unwrap().check_durable = Some(w.store.clone());
    // The fake's reads below on connections already open (a first read opens one).
    use capstan_core::store::RunStore as _;
    let (a, b, c, d) = tokio::join!(
        w.store.journal("none"),
        w.store.journal("none"),
        w.store.journal("none"),
        w.store.journal("none")
    );
    for read in [a, b, c, d] {
        read.unwrap();
    }
    let (engine, stop, workers) = unpolled_scheduler(&w, "node-a", None);
    let mut executions = Vec::new();
    for _ in 0..4 {
        executions.push(trigger_on(&engine, 3).await);
    }
    for execution in &executions {
        assert_eq!(
            ended(&w.store, &execution.id).await,
            ExecutionStatus::Succeeded
        );
        let run = w.store.run(&execution.run_id).await.unwrap().unwrap();
        assert_eq!(run.activations, 1, "started by its trigger: {run:?}");
    }
    let asked = w.cloud.0.lock().unwrap().durable_when_asked.clone();
    assert_eq!(asked.len(), 12, "three changes each: {asked:?}");
    assert!(asked.iter().all(|durable| *durable), "{asked:?}");
    // Each run's first effect: what proved the run durable was the trigger's commit, not one
    // of the activation's own. A provider call not answered within the engine's
    // `PROGRESS_AFTER` (20 ms) has the activation's writes committed while it works, and this
    // fake's own store reads can take that long on a loaded machine: a reading is judged only
    // when its read answered sooner (later effects may find the run's writes committed).
    let journals = w.cloud.0.lock().unwrap().journal_when_asked.clone();
    let mut first = std::collections::BTreeMap::new();
    for (run, journal, read_within) in &journals {
        first.entry(run.clone()).or_insert((*journal, *read_within));
    }
    assert_eq!(first.len(), 4, "{journals:?}");
    let judged: Vec<usize> = first
        .values()
        .filter(|(_, read_within)| *read_within < std::time::Duration::from_millis(20))
        .map(|(journal, _)| *journal)
        .collect();
    assert!(
        !judged.is_empty(),
        "every reading slower than 20 ms: {journals:?}"
    );
    assert!(
        judged.iter().all(|journal| *journal == 0),
        "no commit of the run's own before its first effect: {journals:?}"
    );
    stop.send(true).unwrap();
    for worker in workers {
        worker.await.unwrap();
    }
}

/// Two identical keyed triggers racing on a node with free slots: one execution, and the epoch
/// of writes behind answers never moves (the second trigger waits for the first's commit, so
/// neither a batch queued ahead nor a run started ahead fails on the key, and no activation
/// under way replays).
#[tokio::test]
async fn identical_keyed_triggers_racing_start_one_run_and_move_no_epoch() {
    let w = world().await;
    let epoch = w.store.behind_epoch();
    let (engine, stop, workers) = unpolled_scheduler(&w, "node-a", None);
    let request = || TriggerRequest {
        workflow: "fixture-steps".into(),
        principal_id: "ops".into(),
        input: json!({"zone": "Z1", "stages": 2}),
        idempotency: Some(("same-key".into(), "same-body".into())),
        traceparent: None,
    };
    let (a, b) = tokio::join!(engine.trigger(request()), engine.trigger(request()));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.execution.id, b.execution.id);
    assert!(a.replayed != b.replayed, "one original, one replay");
    assert_eq!(
        ended(&w.store, &a.execution.id).await,
        ExecutionStatus::Succeeded
    );
    assert_eq!(w.store.behind_epoch(), epoch);
    stop.send(true).unwrap();
    for worker in workers {
        worker.await.unwrap();
    }
}

/// A run another node made due, which this node's commits never told its claimer of, is claimed
/// when the other node's commit is announced (PostgreSQL's `NOTIFY`, relayed by
/// `Store::subscribe_other_nodes`).
#[tokio::test]
async fn another_nodes_announced_commit_wakes_the_idle_claimer() {
    let w = world().await;
    let (announce, announced) = tokio::sync::watch::channel(0_u64);
    let (_engine, stop, workers) = unpolled_scheduler(&w, "node-a", Some(announced));
    // The other node has no scheduler: its trigger leaves the run for a claim.
    let other = node_on_the_real_clock(&w, config("node-b"));
    let execution = trigger_on(&other, 2).await;
    announce.send_modify(|n| *n += 1);
    assert_eq!(
        ended(&w.store, &execution.id).await,
        ExecutionStatus::Succeeded
    );
    let run = w.store.run(&execution.run_id).await.unwrap().unwrap();
    assert_eq!(run.lease_owner, None, "{run:?}");
    assert_eq!(run.activations, 1, "{run:?}");
    stop.send(true).unwrap();
    for worker in workers {
        worker.await.unwrap();
    }
}

/// A provider's write made behind its answer that fails refuses the commits that recorded the
/// answer: nothing of the activation commits, the run is retried a second later,
/// replays the call under the same token, and succeeds once the provider's write commits.
#[tokio::test]
async fn a_commit_recording_an_answer_whose_write_behind_failed_is_refused_and_replayed() {
    let w = world().await;
    assert!(
        w.store.behind_epoch().is_some(),
        "both backends write behind answers"
    );
    w.cloud.write_behind(&w.store, 1);
    let id = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 2}))
        .await;
    w.settle().await;
    let run_id = w.store.execution(&id).await.unwrap().unwrap().run_id;
    assert_eq!(w.status(&id).await, ExecutionStatus::Running);
    assert!(
        w.store.journal(&run_id).await.unwrap().is_empty(),
        "the refused commit recorded nothing"
    );
    assert!(w.store.receipts(&id).await.unwrap().is_empty());
    assert_eq!(w.store.behind_epoch(), Some(1));

    w.clock.advance(1_000);
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Succeeded);
    let receipts = w.store.receipts(&id).await.unwrap();
    assert_eq!(receipts.len(), 2);
    let tokens: Vec<String> = w.cloud.effects().into_iter().map(|(_, t)| t).collect();
    assert_eq!(
        tokens.iter().filter(|t| **t == receipts[0].id).count(),
        2,
        "the first change was asked twice under one token: {tokens:?}"
    );
    // The first activation wrote two (the failed one, then the second change's: refused if it
    // was decided before the failure moved the epoch, committed if after, in which case the
    // replay is answered that change from the cloud's memory); the replay wrote the rest.
    let written = w.cloud.0.lock().unwrap().written_behind;
    assert!((3..=4).contains(&written), "{written}");
    // The first activation asked each change as new; the replay did not.
    let asked_first = w.cloud.0.lock().unwrap().asked_first.clone();
    let mut ids: Vec<String> = receipts.iter().map(|r| r.id.clone()).collect();
    ids.sort();
    let mut firsts = asked_first.clone();
    firsts.sort();
    assert_eq!(firsts, ids, "{asked_first:?}");
    let committed: Vec<String> = sqlx::query_scalar("SELECT token FROM sim_effects ORDER BY token")
        .fetch_all(&mut *w.store.read().await.unwrap())
        .await
        .unwrap();
    let mut expected: Vec<String> = receipts.iter().map(|r| r.id.clone()).collect();
    expected.sort();
    assert_eq!(committed, expected, "each change's write committed once");
}

/// The rows the every-command matrix cannot set up with one engine: a component that is not
/// loaded, a run claimed with nothing left to do, a compensation that fails, a run that is gone,
/// an approval given twice.
#[tokio::test]
async fn the_rows_of_missing_components_spent_runs_failed_compensations_and_repeated_approvals() {
    use capstan_core::store::{RunPatch, RunState};
    let w = world().await;
    // A node that has not loaded the component: its claim pauses the execution, and it
    // refuses a recovery it cannot run.
    let bare = Engine::new(
        Arc::new(w.store.clone()),
        runtime(),
        Arc::new(w.cloud.clone()),
        Arc::new(w.clock.clone()),
        config("node-b"),
    );
    let id = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 1}))
        .await;
    bare.run_until_idle().await.unwrap();
    let execution = w.store.execution(&id).await.unwrap().unwrap();
    assert_eq!(execution.status, ExecutionStatus::Paused);
    assert_eq!(
        execution.status_reason.as_deref(),
        Some("component_missing")
    );
    let refused = bare.recover(&id, "retry-finalization").await.unwrap_err();
    assert!(
        matches!(
            refused,
            EngineError::StateInvalid {
                reason: "component_missing",
                ..
            }
        ),
        "{refused:?}"
    );
    // Resumed where the component is loaded, it finishes.
    w.engine.resume(&id).await.unwrap();
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Succeeded);

    // A run made runnable again under a finished execution: claimed, it ends, and nothing moves.
    let run_id = w.store.execution(&id).await.unwrap().unwrap().run_id;
    let events = w.event_types(&id).await.len();
    w.store
        .apply(
            None,
            vec![Write::UpdateRun(RunPatch {
                id: run_id.clone(),
                state: Some(RunState::Runnable),
                wake_ms: Some(0),
                release_lease: true,
                cancel_requested: None,
            })],
        )
        .await
        .unwrap();
    w.settle().await;
    assert_eq!(w.status(&id).await, ExecutionStatus::Succeeded);
    assert_eq!(w.event_types(&id).await.len(), events);
    assert_eq!(
        w.store.run(&run_id).await.unwrap().unwrap().state,
        RunState::Done
    );

    // A compensation refused for good: the execution stays as it was, saying why, and the
    // rollback's end is its last event.
    w.cloud.fail(
        "dns.change-records",
        1,
        CapabilityError::permanent("refused", "no"),
    );
    w.engine.rollback(&id).await.unwrap();
    w.settle().await;
    let execution = w.store.execution(&id).await.unwrap().unwrap();
    assert_eq!(execution.status, ExecutionStatus::Succeeded);
    assert_eq!(execution.status_reason.as_deref(), Some("rollback_failed"));
    let last = w.store.events(&id).await.unwrap().pop().unwrap();
    assert_eq!(last.event_type, "RollbackFailed");
    let payload = last.payload_json.value();
    assert_eq!(payload["status"], "succeeded", "{payload}");
    assert_eq!(payload["error"]["error"], "refused", "{payload}");
    assert!(
        payload["stage"]
            .as_str()
            .is_some_and(|s| s.starts_with("rollback:")),
        "{payload}"
    );

    // A run that is gone (retention took it): nothing to recover from.
    let gone = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 1}))
        .await;
    w.settle().await;
    let gone_run = w.store.execution(&gone).await.unwrap().unwrap().run_id;
    for sql in [
        "DELETE FROM journal_chunks WHERE run_id = $1",
        "DELETE FROM waits WHERE run_id = $1",
        "DELETE FROM runs WHERE id = $1",
    ] {
        sqlx::query(sql)
            .bind(&gone_run)
            .execute(w.store.writer())
            .await
            .unwrap();
    }
    let refused = w
        .engine
        .recover(&gone, "retry-finalization")
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            EngineError::StateInvalid {
                reason: "no_source_run",
                ..
            }
        ),
        "{refused:?}"
    );

    // An approval given twice: the second is refused until the run has woken.
    let waiting = w
        .trigger(
            "fixture-steps",
            json!({"zone": "Z1", "stages": 1, "approval": true}),
        )
        .await;
    w.settle().await;
    w.engine
        .approve(&waiting, &"0".repeat(64), json!({"approvedBy": "ops"}))
        .await
        .unwrap();
    let twice = w
        .engine
        .approve(&waiting, &"0".repeat(64), json!({"approvedBy": "ops"}))
        .await
        .unwrap_err();
    assert!(
        matches!(
            twice,
            EngineError::StateInvalid {
                reason: "already_approved",
                ..
            }
        ),
        "{twice:?}"
    );
    w.settle().await;
    assert_eq!(w.status(&waiting).await, ExecutionStatus::Succeeded);
}
