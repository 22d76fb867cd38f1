//! The engine tests' shared harness: real components, a real SQLite file, a manual clock, and an
//! in-memory cloud that records every call and deduplicates effects by idempotency token.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

use async_trait::async_trait;
use capstan_core::execution::ExecutionStatus;
use capstan_core::store::{ExecutionReads, RunStore};
use capstan_core::{Capability, CapabilityError, CapabilityGrants, ManualClock};
use capstan_engine::{Backoff, Engine, EngineConfig, Providers, TriggerRequest};
use capstan_runtime::{LoadedWorkflow, Runtime, RuntimeConfig};
use capstan_store::Store;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

pub const T0: u64 = 1_767_225_600_000;

pub fn component(relative: &str) -> PathBuf {
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

pub fn runtime() -> Arc<Runtime> {
    static RUNTIME: OnceLock<Arc<Runtime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let cache =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/component-cache-tests");
            Arc::new(
                Runtime::new(RuntimeConfig {
                    fuel_per_activation: 200_000_000,
                    cache_dir: Some(cache),
                    limits: capstan_runtime::GuestLimits {
                        deadline_ms: 2_000,
                        ..capstan_runtime::GuestLimits::default()
                    },
                    ..RuntimeConfig::default()
                })
                .unwrap(),
            )
        })
        .clone()
}

pub async fn load(relative: &str) -> Arc<LoadedWorkflow> {
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
pub struct Cloud {
    pub records: BTreeMap<String, Value>,
    pub changes: HashMap<String, u32>,
    /// Token → (operation, request, answer): a token is bound to the call it first came with.
    pub by_token: HashMap<String, (String, Value, Value)>,
    pub effects: Vec<(String, String)>,
    pub fail: HashMap<String, (u32, CapabilityError)>,
    pub insync_after: u32,
    /// Set: each DNS change is also written behind its answer to this store (as the simulated
    /// cloud does on SQLite), under the epoch it was answered in; `.1` of them fail first. An
    /// answer given in an epoch that has moved since is decided again.
    pub behind: Option<(Store, u32)>,
    /// Writes made behind answers so far, failed ones included.
    pub written_behind: u32,
    /// The epoch each token's answer was given in (with `behind`).
    pub answered_in: HashMap<String, u64>,
    /// Tokens asked through `call_first` (the engine says no attempt used them before).
    pub asked_first: Vec<String>,
    /// Set: each side effect first looks its run up in this store, and `durable_when_asked`
    /// says whether it was there (an effect outside the store may not precede its run).
    pub check_durable: Option<Store>,
    pub durable_when_asked: Vec<bool>,
    /// With `check_durable`: each side effect's run, how many journal entries of that run were
    /// stored when it was asked (what the activation had committed of its own by then), and how
    /// long after the call began that read answered.
    pub journal_when_asked: Vec<(String, usize, std::time::Duration)>,
}

#[derive(Clone, Default)]
pub struct FakeCloud(pub Arc<Mutex<Cloud>>);

impl FakeCloud {
    pub fn fail(&self, op: &str, times: u32, error: CapabilityError) {
        self.0
            .lock()
            .unwrap()
            .fail
            .insert(op.to_owned(), (times, error));
    }
    pub fn effects(&self) -> Vec<(String, String)> {
        self.0.lock().unwrap().effects.clone()
    }
    pub fn records(&self) -> BTreeMap<String, Value> {
        self.0.lock().unwrap().records.clone()
    }
    /// Writes each DNS change behind its answer to `store`; the first `failing` such writes fail.
    pub fn write_behind(&self, store: &Store, failing: u32) {
        self.0.lock().unwrap().behind = Some((store.clone(), failing));
    }
}

#[async_trait]
impl Providers for FakeCloud {
    async fn call_first(
        &self,
        op: &str,
        request: &Value,
        token: &str,
    ) -> Result<Value, CapabilityError> {
        self.0.lock().unwrap().asked_first.push(token.to_owned());
        self.call(op, request, token).await
    }

    async fn call(&self, op: &str, request: &Value, token: &str) -> Result<Value, CapabilityError> {
        let check = self.0.lock().unwrap().check_durable.clone();
        if let Some(store) = check
            && !token.is_empty()
        {
            use capstan_core::store::RunStore as _;
            let run_id = token.split(':').next().unwrap_or_default();
            // The journal first: a call that has not answered within the engine's
            // `PROGRESS_AFTER` has the activation's writes committed while it works, so only a
            // read that answered sooner shows what was committed before the call.
            let began = std::time::Instant::now();
            let journal = store.journal(run_id).await.unwrap().len();
            let read_within = began.elapsed();
            let durable = store.run(run_id).await.unwrap().is_some();
            let mut cloud = self.0.lock().unwrap();
            cloud.durable_when_asked.push(durable);
            cloud
                .journal_when_asked
                .push((run_id.to_owned(), journal, read_within));
        }
        let mut cloud = self.0.lock().unwrap();
        if let Some((left, error)) = cloud.fail.get_mut(op)
            && *left > 0
        {
            *left -= 1;
            return Err(error.clone());
        }
        let epoch = cloud
            .behind
            .as_ref()
            .and_then(|(store, _)| store.behind_epoch());
        if !token.is_empty()
            && let Some((first_op, first_request, done)) = cloud.by_token.get(token)
            && cloud.answered_in.get(token).copied() == epoch
        {
            if first_op != op || first_request != request {
                return Err(CapabilityError::token_reused(op, first_op));
            }
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
            cloud.by_token.insert(
                token.to_owned(),
                (op.to_owned(), request.clone(), answer.clone()),
            );
            cloud.effects.push((op.to_owned(), token.to_owned()));
        }
        if op == "dns.change-records"
            && let (Some((store, failing)), Some(epoch)) = (cloud.behind.as_mut(), epoch)
        {
            let mut write = capstan_store::Sql::default();
            if *failing > 0 {
                *failing -= 1;
                write.push_statement("INSERT INTO no_such_table (token) VALUES ($1)");
            } else {
                write.push_statement("INSERT INTO sim_effects (token, op, request, response, at_ms) VALUES ($1, 'dns.change-records', '{}', '{}', 0)");
            }
            write.bind(token.to_owned());
            store.write_behind(write, epoch).unwrap();
            cloud.written_behind += 1;
            cloud.answered_in.insert(token.to_owned(), epoch);
        }
        Ok(answer)
    }
}

pub struct World {
    pub engine: Engine,
    pub store: Store,
    pub clock: ManualClock,
    pub cloud: FakeCloud,
    pub _dir: tempfile::TempDir,
}

pub fn config(node: &str) -> EngineConfig {
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

pub async fn world() -> World {
    world_with(config("node-a")).await
}

pub async fn world_with(config: EngineConfig) -> World {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
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
    pub async fn trigger(&self, workflow: &str, input: Value) -> String {
        let req = TriggerRequest {
            workflow: workflow.into(),
            principal_id: "ops".into(),
            input,
            idempotency: None,
            traceparent: None,
        };
        self.engine.trigger(req).await.unwrap().execution.id
    }
    pub async fn status(&self, id: &str) -> ExecutionStatus {
        self.store.execution(id).await.unwrap().unwrap().status
    }
    pub async fn settle(&self) {
        self.engine.run_until_idle().await.unwrap();
    }
    /// Rewrites the first recorded call of the execution's run, as if the workflow's code had
    /// changed under it: a journal entry written later replaces the earlier one of its `seq`.
    pub async fn rename_first_recorded_stage(&self, execution_id: &str) -> String {
        let run_id = self
            .store
            .execution(execution_id)
            .await
            .unwrap()
            .unwrap()
            .run_id;
        let mut first = self.store.journal(&run_id).await.unwrap().remove(0);
        assert_eq!(first.op, "context.stage-begin");
        first.request = capstan_core::store::JsonText::new(&json!({"name": "renamed"}));
        self.store
            .apply(None, vec![capstan_core::store::Write::PutJournal(first)])
            .await
            .unwrap();
        run_id
    }
    pub async fn event_types(&self, id: &str) -> Vec<String> {
        self.store
            .events(id)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.event_type)
            .collect()
    }
}
