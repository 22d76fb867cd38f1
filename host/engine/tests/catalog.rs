//! Every payload the engine publishes matches its schema in the public event catalog: real
//! components on a real SQLite file drive success, failure, pause, wait, cancel, commands and
//! rollback, and each outbox row is validated against `catalog::schema_for(type, version)`.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use capstan_core::CapabilityError;
use capstan_core::execution::ExecutionStatus;
use capstan_core::store::ExecutionReads;
use capstan_engine::catalog;
use capstan_engine::events::ENGINE_EVENTS;
use serde_json::{Value, json};
use std::collections::BTreeSet;

mod common;
use common::*;

/// Validates every outbox row of `id` against its catalogued schema; returns the types seen.
async fn validate_outbox(w: &World, id: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for e in w.store.events(id).await.unwrap() {
        let schema = catalog::schema_for(&e.event_type, &e.event_version).unwrap_or_else(|| {
            panic!(
                "{}.v{} is not in the catalog",
                e.event_type, e.event_version
            )
        });
        let validator = jsonschema::validator_for(&schema)
            .unwrap_or_else(|err| panic!("schema of {} does not compile: {err}", e.event_type));
        let errors: Vec<String> = validator
            .iter_errors(&e.payload_json.value())
            .map(|err| format!("{} at {}", err, err.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{}.v{} payload {} does not match its schema: {errors:?}",
            e.event_type,
            e.event_version,
            e.payload_json
        );
        seen.insert(e.event_type);
    }
    seen
}

#[test]
fn every_engine_event_type_has_a_catalog_entry_with_a_valid_schema() {
    for ty in ENGINE_EVENTS.iter().chain(catalog::WORKFLOW_EVENTS.iter()) {
        let entry = catalog::find(ty, "1").unwrap_or_else(|| panic!("{ty}.v1 is not catalogued"));
        assert_eq!(entry.name(), format!("{ty}.v1"));
        assert!(!entry.description.is_empty());
    }
    for entry in catalog::catalog() {
        assert!(
            jsonschema::meta::is_valid(&entry.schema),
            "{} is not a valid JSON Schema",
            entry.name()
        );
        jsonschema::validator_for(&entry.schema)
            .unwrap_or_else(|e| panic!("{} does not compile: {e}", entry.name()));
    }
}

#[test]
fn workflow_event_schemas_accept_the_shipped_payloads_and_reject_strays() {
    let check = |ty: &str, payload: Value| {
        let schema = catalog::schema_for(ty, "1").unwrap();
        jsonschema::validator_for(&schema)
            .unwrap()
            .is_valid(&payload)
    };
    let base = |data: Value| json!({"executionId": "e1", "workflow": "add-subdomain", "status": "running", "data": data});
    let alias =
        json!({"dnsName": "d.cdn.example", "evaluateTargetHealth": false, "hostedZoneId": "ZCDN"});
    let plan = json!({
        "apexAlias": alias, "executionId": "e1", "hostedZoneId": "Z1",
        "items": [{"hostname": "www.example.com", "disposition": "create"},
                  {"hostname": "api.example.com", "disposition": "replace",
                   "current": {"name": "api.example.com", "type": "CNAME", "values": ["old.example"], "ttl": 300}}],
        "planHash": "a".repeat(64), "replacementRequired": true, "rootDomain": "example.com",
    });
    assert!(check("SubdomainPlanReady", base(plan.clone())));
    let mut bad = plan.clone();
    bad["planHash"] = json!("nope");
    assert!(!check("SubdomainPlanReady", base(bad)));
    assert!(check(
        "SubdomainPlanApproved",
        base(json!({"executionId": "e1", "planHash": "b".repeat(64)}))
    ));
    assert!(!check(
        "SubdomainPlanApproved",
        base(json!({"executionId": "e1"}))
    ));
    let outcome = json!({
        "executionId": "e1", "status": "succeeded",
        "assistance": {"required": false, "reasons": []},
        "certificate": {"primaryDomain": "x.test", "state": "created"},
        "cleanup": {"state": "not-required"},
        "distributions": {"cms": {"state": "created"}, "proxy": {"state": "created"}},
        "domain": {"name": "x.test", "state": "registered"},
        "mapsProvider": {"keys": [], "outcome": "updated"},
        "ticketing": {"state": "not-requested"},
    });
    let onboarded = |o: Value| json!({"executionId": "e1", "workflow": "onboard-domain", "status": "running", "data": o});
    assert!(check("DomainOnboarded", onboarded(outcome.clone())));
    let mut extra = outcome;
    extra["surprise"] = json!(1);
    assert!(!check("DomainOnboarded", onboarded(extra)));
    // A guest's uncatalogued event is published as WorkflowEventEmitted.
    let (ty, fields) = catalog::normalize_custom("SomethingElse", json!({"any": ["thing"]}));
    let mut payload = json!({"executionId": "e1", "workflow": "w", "status": "running"});
    payload
        .as_object_mut()
        .unwrap()
        .extend(fields.as_object().unwrap().clone());
    assert!(check(&ty, payload));
    // Engine payloads are closed: an unexpected field is rejected.
    assert!(!check(
        "ExecutionSucceeded",
        json!({"executionId": "e", "workflow": "w", "status": "succeeded", "x": 1})
    ));
    assert!(!check(
        "ExecutionSucceeded",
        json!({"executionId": "e", "workflow": "w", "status": "failed"})
    ));
}

#[tokio::test]
async fn every_payload_the_engine_publishes_matches_its_catalog_schema() {
    let w = world().await;
    let mut seen = BTreeSet::new();

    // Success: queued, started, stages, succeeded. Then a rollback command with compensation
    // stages: CommandQueued, RollbackStarted, ExecutionRolledBack {commandId}.
    let ok = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 3}))
        .await;
    w.settle().await;
    assert_eq!(w.status(&ok).await, ExecutionStatus::Succeeded);
    w.engine.rollback(&ok).await.unwrap();
    w.settle().await;
    assert_eq!(w.status(&ok).await, ExecutionStatus::RolledBack);
    seen.extend(validate_outbox(&w, &ok).await);

    // A rollback whose compensation is refused for good: StageFailed, then RollbackFailed
    // {commandId, stage, error}; the execution stays succeeded.
    let refused = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 2}))
        .await;
    w.settle().await;
    assert_eq!(w.status(&refused).await, ExecutionStatus::Succeeded);
    w.cloud.fail(
        "dns.change-records",
        1,
        CapabilityError::permanent("refused", "no"),
    );
    w.engine.rollback(&refused).await.unwrap();
    w.settle().await;
    assert_eq!(w.status(&refused).await, ExecutionStatus::Succeeded);
    seen.extend(validate_outbox(&w, &refused).await);

    // A timer wait, then cancel: ExecutionWaiting {timer}, ExecutionCanceled.
    let sleeping = w
        .trigger("hello", json!({"name": "x", "pauseSeconds": 600}))
        .await;
    w.settle().await;
    assert_eq!(w.status(&sleeping).await, ExecutionStatus::Waiting);
    w.engine.cancel(&sleeping).await.unwrap();
    seen.extend(validate_outbox(&w, &sleeping).await);

    // Nothing to compensate: an immediate rollback, ExecutionRolledBack {compensated: 0}.
    let quick = w.trigger("hello", json!({"name": "y"})).await;
    w.settle().await;
    assert_eq!(w.status(&quick).await, ExecutionStatus::Succeeded);
    assert!(w.engine.rollback(&quick).await.unwrap().immediate);
    seen.extend(validate_outbox(&w, &quick).await);

    // An approval wait, approved.
    let approval = w
        .trigger(
            "fixture-steps",
            json!({"zone": "Z1", "approval": true, "stages": 1}),
        )
        .await;
    w.settle().await;
    assert_eq!(w.status(&approval).await, ExecutionStatus::Waiting);
    w.engine
        .approve(&approval, &"0".repeat(64), json!({"approvedBy": "ops"}))
        .await
        .unwrap();
    w.settle().await;
    seen.extend(validate_outbox(&w, &approval).await);

    // A convergence wait.
    w.cloud.0.lock().unwrap().insync_after = 1;
    let converging = w
        .trigger(
            "point-record",
            json!({"host": "docs.example.com", "target": "d1.cdn.example"}),
        )
        .await;
    w.settle().await;
    for _ in 0..5 {
        w.clock.advance(5_000);
        w.settle().await;
    }
    assert_eq!(w.status(&converging).await, ExecutionStatus::Succeeded);
    seen.extend(validate_outbox(&w, &converging).await);
    w.cloud.0.lock().unwrap().insync_after = 0;

    // A transient failure pauses (ExecutionPaused {reason, error}, StageFailed); resume queues a
    // command (CommandQueued {operation: resume}, ExecutionQueued).
    let flaky = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 2}))
        .await;
    w.cloud.fail(
        "dns.change-records",
        5,
        CapabilityError::transient("throttled", "slow down"),
    );
    w.settle().await;
    assert_eq!(w.status(&flaky).await, ExecutionStatus::Paused);
    w.engine.resume(&flaky).await.unwrap();
    w.settle().await;
    assert_eq!(w.status(&flaky).await, ExecutionStatus::Succeeded);
    seen.extend(validate_outbox(&w, &flaky).await);

    // A permanent failure (ExecutionFailed), then a declared recovery.
    w.cloud.fail(
        "dns.get-change",
        1,
        CapabilityError::permanent("not-found", "gone"),
    );
    let failing = w
        .trigger("fixture-steps", json!({"zone": "Z1", "stages": 1}))
        .await;
    w.settle().await;
    assert_eq!(w.status(&failing).await, ExecutionStatus::Failed);
    w.engine
        .recover(&failing, "retry-finalization")
        .await
        .unwrap();
    w.settle().await;
    seen.extend(validate_outbox(&w, &failing).await);

    // Sandbox limit: ExecutionFailed {reason: limit_exceeded}; a guest's transient error pauses.
    let looping = w
        .trigger("fixture-misbehave", json!({"action": "loop"}))
        .await;
    let guest_fail = w
        .trigger("fixture-misbehave", json!({"action": "fail"}))
        .await;
    w.settle().await;
    assert_eq!(w.status(&looping).await, ExecutionStatus::Failed);
    assert_eq!(w.status(&guest_fail).await, ExecutionStatus::Paused);
    seen.extend(validate_outbox(&w, &looping).await);
    seen.extend(validate_outbox(&w, &guest_fail).await);

    // A nondeterministic replay pauses with a message.
    let replay = w
        .trigger(
            "fixture-steps",
            json!({"zone": "Z1", "stages": 2, "sleepSeconds": 5}),
        )
        .await;
    w.settle().await;
    w.rename_first_recorded_stage(&replay).await;
    w.clock.advance(5_000);
    w.settle().await;
    assert_eq!(w.status(&replay).await, ExecutionStatus::Paused);
    seen.extend(validate_outbox(&w, &replay).await);

    // ExecutionCancellationRequested needs a cooperative workflow (update-function-version) and
    // the workflow events need the shipped workflows: both are covered end to end
    // (tests/tests/catalog.rs).
    let expected: BTreeSet<String> = ENGINE_EVENTS
        .iter()
        .filter(|t| **t != "ExecutionCancellationRequested")
        .map(|t| (*t).to_owned())
        .collect();
    let missing: Vec<_> = expected.difference(&seen).collect();
    assert!(
        missing.is_empty(),
        "not exercised: {missing:?} (seen {seen:?})"
    );
}
