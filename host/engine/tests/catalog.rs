//! Every payload the engine publishes matches its schema in the public event catalog: real
//! components on a real SQLite file drive success, failure, pause, wait, cancel, commands and
//! rollback, and each outbox row is validated against `catalog::schema_for(type, version)`.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use async_trait::async_trait;
use capstan_core::execution::ExecutionStatus;
use capstan_core::store::EngineStore;
use capstan_core::{Capability, CapabilityError, CapabilityGrants, ManualClock};
use capstan_engine::catalog;
use capstan_engine::events::ENGINE_EVENTS;
use capstan_engine::{Backoff, Engine, EngineConfig, Providers, TriggerRequest};
use capstan_runtime::{LoadedWorkflow, Runtime, RuntimeConfig};
use capstan_store::Store;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

const T0: u64 = 1_767_225_600_000;

fn component(relative: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target")
        .join(relative);
    assert!(
        path.is_file(),
        "{} is missing: run `just build-guests` first",
        path.display()
    );
    path
}

fn runtime() -> Arc<Runtime> {
    static RUNTIME: OnceLock<Arc<Runtime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let cache =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/component-cache-tests");
            Arc::new(
                Runtime::new(RuntimeConfig {
                    fuel_per_activation: 200_000_000,
                    cache_dir: Some(cache),
                    ..RuntimeConfig::default()
                })
                .unwrap(),
            )
        })
        .clone()
}

async fn load(relative: &str) -> Arc<LoadedWorkflow> {
    let all = [Capability::Dns, Capability::Convergence];
    let grants: CapabilityGrants = ["fixture-steps", "point-record", "fixture-misbehave"]
        .iter()
        .map(|n| ((*n).to_owned(), all.iter().copied().collect()))
        .collect();
    Arc::new(
        runtime()
            .load_file(&component(relative), &grants)
            .await
            .unwrap(),
    )
}

/// An in-memory cloud: DNS records per name, changes that go in sync after `insync_after` polls,
/// effects deduplicated by token, scripted failures.
#[derive(Default)]
struct Cloud {
    records: BTreeMap<String, Value>,
    changes: HashMap<String, u32>,
    by_token: HashMap<String, Value>,
    effects: Vec<(String, String)>,
    fail: HashMap<String, (u32, CapabilityError)>,
    insync_after: u32,
}

#[derive(Clone, Default)]
struct FakeCloud(Arc<Mutex<Cloud>>);

impl FakeCloud {
    fn fail(&self, op: &str, times: u32, error: CapabilityError) {
        self.0
            .lock()
            .unwrap()
            .fail
            .insert(op.to_owned(), (times, error));
    }
    fn effects(&self) -> Vec<(String, String)> {
        self.0.lock().unwrap().effects.clone()
    }
    fn records(&self) -> BTreeMap<String, Value> {
        self.0.lock().unwrap().records.clone()
    }
}

#[async_trait]
impl Providers for FakeCloud {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Result<Value, CapabilityError> {
        let mut cloud = self.0.lock().unwrap();
        if let Some((left, error)) = cloud.fail.get_mut(op)
            && *left > 0
        {
            *left -= 1;
            return Err(error.clone());
        }
        if !token.is_empty()
            && let Some(done) = cloud.by_token.get(token)
        {
            return Ok(done.clone());
        }
        let answer = match op {
            "dns.find-zone" => {
                if request["domain"].as_str().unwrap().ends_with("example.com") {
                    json!({"id": "Z1", "name": "example.com"})
                } else {
                    Value::Null
                }
            }
            "dns.change-records" => {
                let mut prior = Vec::new();
                for change in request["changes"].as_array().unwrap() {
                    let (set, upsert) = match change.get("Upsert") {
                        Some(set) => (set, true),
                        None => (&change["Delete"], false),
                    };
                    let name = set["name"].as_str().unwrap().to_owned();
                    if let Some(old) = cloud.records.get(&name) {
                        prior.push(old.clone());
                    }
                    if upsert {
                        cloud.records.insert(name, set.clone());
                    } else {
                        cloud.records.remove(&name);
                    }
                }
                let id = format!("C{}", cloud.changes.len() + 1);
                let polls = cloud.insync_after;
                cloud.changes.insert(id.clone(), polls);
                json!({"change_id": id, "zone_id": request["zone_id"], "status": "Pending", "prior": prior})
            }
            "dns.get-change" => {
                let id = request["change_id"].as_str().unwrap().to_owned();
                match cloud.changes.get_mut(&id) {
                    Some(0) => json!("Insync"),
                    Some(n) => {
                        *n -= 1;
                        json!("Pending")
                    }
                    None => {
                        return Err(CapabilityError::permanent(
                            "not-found",
                            format!("no change {id}"),
                        ));
                    }
                }
            }
            other => {
                return Err(CapabilityError::permanent(
                    "unsupported",
                    format!("the fake cloud has no {other}"),
                ));
            }
        };
        if !token.is_empty() {
            cloud.by_token.insert(token.to_owned(), answer.clone());
            cloud.effects.push((op.to_owned(), token.to_owned()));
        }
        Ok(answer)
    }
}

struct World {
    engine: Engine,
    store: Store,
    clock: ManualClock,
    cloud: FakeCloud,
    _dir: tempfile::TempDir,
}

fn config(node: &str) -> EngineConfig {
    EngineConfig {
        node_id: node.to_owned(),
        provider_retry: Backoff {
            initial_ms: 0,
            max_ms: 0,
            max_attempts: 3,
        },
        convergence: Backoff {
            initial_ms: 1_000,
            max_ms: 4_000,
            max_attempts: u32::MAX,
        },
        ..EngineConfig::default()
    }
}

async fn world() -> World {
    world_with(config("node-a")).await
}

async fn world_with(config: EngineConfig) -> World {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("sqlite://{}/capstan.db", dir.path().display()))
        .await
        .unwrap();
    let clock = ManualClock::new(T0);
    let cloud = FakeCloud::default();
    let engine = Engine::new(
        Arc::new(store.clone()),
        runtime(),
        Arc::new(cloud.clone()),
        Arc::new(clock.clone()),
        config,
    );
    for w in [
        "guest-fixtures/fixture-steps.wasm",
        "workflows/hello.wasm",
        "examples/point-record.wasm",
        "guest-fixtures/fixture-misbehave.wasm",
    ] {
        engine.register(load(w).await);
    }
    World {
        engine,
        store,
        clock,
        cloud,
        _dir: dir,
    }
}

impl World {
    async fn trigger(&self, workflow: &str, input: Value) -> String {
        let req = TriggerRequest {
            workflow: workflow.into(),
            principal_id: "ops".into(),
            input,
            idempotency: None,
            traceparent: None,
        };
        self.engine.trigger(req).await.unwrap().execution.id
    }
    async fn status(&self, id: &str) -> ExecutionStatus {
        self.store.execution(id).await.unwrap().unwrap().status
    }
    async fn settle(&self) {
        self.engine.run_until_idle().await.unwrap();
    }
    async fn event_types(&self, id: &str) -> Vec<String> {
        self.store
            .events(id)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.event_type)
            .collect()
    }
}

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
            .iter_errors(&e.payload_json)
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
        .recover(&failing, "retry-finalization", &[ExecutionStatus::Failed])
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
    let run_id = w.store.execution(&replay).await.unwrap().unwrap().run_id;
    sqlx::query(
        "UPDATE journal SET request = '{\"name\":\"renamed\"}' WHERE run_id = ? AND seq = 0",
    )
    .bind(&run_id)
    .execute(w.store.pool())
    .await
    .unwrap();
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
