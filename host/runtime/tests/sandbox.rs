//! The runtime against real components built by `just build-guests`: the hello workflow, the
//! example authored as a user would, and fixtures that run into every sandbox wall on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_trait::async_trait;
use capstan_core::{Capability, CapabilityGrants, ErrorKind};
use capstan_runtime::{
    GuestLimits, HostCalls, Interrupt, Limit, LimitExceeded, LoadError, Outcome, Request, Runtime,
    RuntimeConfig,
};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn component(relative: &str) -> PathBuf {
    let path = repo().join("target").join(relative);
    assert!(
        path.is_file(),
        "{} is missing: run `just build-guests` first",
        path.display()
    );
    path
}

/// One runtime per test binary (compiling in a debug host is slow), with tight limits so the
/// limit tests finish quickly, and an on-disk cache shared across test runs.
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        Runtime::new(RuntimeConfig {
            memory_limit_bytes: 32 << 20,
            fuel_per_activation: 200_000_000,
            max_wasm_stack_bytes: 256 << 10,
            cache_dir: Some(repo().join("target/component-cache-tests")),
            instance_pool: 16,
            limits: GuestLimits {
                deadline_ms: 2_000,
                ..GuestLimits::default()
            },
        })
        .unwrap()
    })
}

fn grants(entries: &[(&str, &[Capability])]) -> CapabilityGrants {
    entries
        .iter()
        .map(|(n, c)| ((*n).to_owned(), c.iter().copied().collect::<BTreeSet<_>>()))
        .collect()
}

type Answer = Box<dyn FnMut(&Value) -> Result<Value, Interrupt> + Send>;

/// A host that records every call and answers from a table; platform calls get sensible defaults.
#[derive(Clone, Default)]
struct FakeHost {
    calls: Arc<Mutex<Vec<(String, Value)>>>,
    answers: Arc<Mutex<Vec<(&'static str, Answer)>>>,
    clock: Arc<Mutex<u64>>,
}

impl FakeHost {
    fn answer(
        self,
        op: &'static str,
        f: impl FnMut(&Value) -> Result<Value, Interrupt> + Send + 'static,
    ) -> Self {
        self.answers.lock().unwrap().push((op, Box::new(f)));
        self
    }
    fn calls(&self) -> Vec<(String, Value)> {
        self.calls.lock().unwrap().clone()
    }
    fn ops(&self) -> Vec<String> {
        self.calls().into_iter().map(|(op, _)| op).collect()
    }
}

impl FakeHost {
    async fn respond(&mut self, op: &'static str, request: Request) -> Result<Value, Interrupt> {
        let request = request.value;
        self.calls
            .lock()
            .unwrap()
            .push((op.to_owned(), request.clone()));
        if let Some((_, f)) = self
            .answers
            .lock()
            .unwrap()
            .iter_mut()
            .find(|(o, _)| *o == op)
        {
            return f(&request);
        }
        let mut clock = self.clock.lock().unwrap();
        Ok(match op {
            "time.now" => json!(*clock),
            "time.sleep" => {
                *clock += request["millis"].as_u64().unwrap_or(0);
                Value::Null
            }
            "context.cancellation-requested" => json!(false),
            op if op.starts_with("context.") => Value::Null,
            other => panic!("the fake host has no answer for {other}"),
        })
    }
}

#[async_trait]
impl HostCalls for FakeHost {
    async fn call(
        &mut self,
        op: &'static str,
        request: Request,
    ) -> Result<capstan_runtime::Answer, Interrupt> {
        self.respond(op, request).await.map(Into::into)
    }
}

async fn load(relative: &str, grants: &CapabilityGrants) -> capstan_runtime::LoadedWorkflow {
    runtime()
        .load_file(&component(relative), grants)
        .await
        .unwrap()
}

async fn misbehave(action: &str) -> (Outcome, FakeHost) {
    let workflow = load(
        "guest-fixtures/fixture-misbehave.wasm",
        &grants(&[("fixture-misbehave", &[Capability::Dns])]),
    )
    .await;
    let host = FakeHost::default().answer("dns.find-zone", |_| {
        Ok(json!({"Ok": {"id": "Z9", "name": "example.com"}}))
    });
    let activation = workflow
        .activate(
            runtime(),
            Box::new(host.clone()),
            7,
            &json!({"action": action}).to_string(),
        )
        .await;
    (activation, host)
}

#[tokio::test]
async fn hello_runs_end_to_end_through_the_runtime() {
    let workflow = load("workflows/hello.wasm", &CapabilityGrants::new()).await;
    assert_eq!(workflow.descriptor.name, "hello");
    assert_eq!(workflow.descriptor.stages, ["greet", "farewell"]);
    assert_eq!(
        workflow.descriptor.input_schema["properties"]["name"]["type"],
        "string"
    );
    assert!(workflow.capabilities.is_empty());
    assert_eq!(workflow.digest.len(), 64);

    let host = FakeHost::default();
    *host.clock.lock().unwrap() = 1_000;
    let activation = workflow
        .activate(
            runtime(),
            Box::new(host.clone()),
            1,
            r#"{"name":"Ada","pauseSeconds":5}"#,
        )
        .await;
    let Outcome::Completed(Ok(output)) = activation else {
        panic!("unexpected {activation:?}")
    };
    let output: Value = serde_json::from_str(&output).unwrap();
    assert_eq!(
        output,
        json!({"greeting": "hello, Ada", "greetedAt": 1_000, "farewellAt": 6_000})
    );
    assert_eq!(
        host.ops(),
        [
            "context.stage-begin",
            "time.now",
            "context.stage-succeeded",
            "time.sleep",
            "context.stage-begin",
            "time.now",
            "context.stage-succeeded"
        ]
    );
    assert_eq!(
        host.calls()[2].1,
        json!({"name": "greet", "output": "1000"})
    );
}

#[tokio::test]
async fn a_workflow_authored_as_a_user_would_runs_with_typed_records_across_the_boundary() {
    let grants = grants(&[("point-record", &[Capability::Dns, Capability::Convergence])]);
    let workflow = load("examples/point-record.wasm", &grants).await;
    assert_eq!(
        workflow.capabilities,
        BTreeSet::from([Capability::Dns, Capability::Convergence])
    );
    let host = FakeHost::default()
        .answer("dns.find-zone", |_| Ok(json!({"Ok": {"id": "Z1", "name": "example.com"}})))
        .answer("dns.change-records", |_| {
            Ok(json!({"Ok": {"change_id": "C1", "zone_id": "Z1", "status": "Pending", "prior": []}}))
        })
        .answer("convergence.await-converged", |_| Ok(json!({"Ok": null})));
    let activation = workflow
        .activate(
            runtime(),
            Box::new(host.clone()),
            2,
            r#"{"host":"Docs.Example.com","target":"d1.cdn.example"}"#,
        )
        .await;
    let Outcome::Completed(Ok(output)) = activation else {
        panic!("unexpected {activation:?}")
    };
    assert_eq!(
        serde_json::from_str::<Value>(&output).unwrap(),
        json!({"zoneId": "Z1", "changeId": "C1", "previous": []})
    );
    let calls = host.calls();
    let change = &calls
        .iter()
        .find(|(op, _)| op == "dns.change-records")
        .unwrap()
        .1;
    assert_eq!(
        change,
        &json!({"zone_id": "Z1", "changes": [{"Upsert": {
            "name": "docs.example.com", "type_": "Cname", "ttl": 300, "values": ["d1.cdn.example"], "alias_target": null
        }}]})
    );
    let wait = &calls
        .iter()
        .find(|(op, _)| op == "convergence.await-converged")
        .unwrap()
        .1;
    assert_eq!(
        wait,
        &json!({"condition": {"DnsChangeInsync": "C1"}, "timeout_ms": 120_000})
    );
}

#[tokio::test]
async fn an_endless_loop_exhausts_the_cpu_budget_and_the_host_keeps_serving() {
    let (activation, _) = misbehave("loop").await;
    assert!(
        matches!(
            activation,
            Outcome::Limit(LimitExceeded::Cpu { fuel: 200_000_000 })
        ),
        "{activation:?}"
    );
    let (after, _) = misbehave("ok").await;
    assert!(
        matches!(after, Outcome::Completed(Ok(ref o)) if o == "\"fine\""),
        "{after:?}"
    );
}

#[tokio::test]
async fn a_guest_sleeping_on_the_wasi_clock_is_stopped_at_the_deadline_and_the_host_keeps_serving()
{
    let (activation, _) = misbehave("sleep-forever").await;
    assert!(
        matches!(
            activation,
            Outcome::Limit(LimitExceeded::Deadline { limit_ms: 2_000 })
        ),
        "{activation:?}"
    );
    assert!(
        activation_message(&activation).contains("runtime.limits.deadline_ms"),
        "{activation:?}"
    );
    let (after, _) = misbehave("ok").await;
    assert!(
        matches!(after, Outcome::Completed(Ok(ref o)) if o == "\"fine\""),
        "{after:?}"
    );
}

fn activation_message(activation: &Outcome) -> String {
    match activation {
        Outcome::Limit(limit) => limit.to_string(),
        other => format!("{other:?}"),
    }
}

#[tokio::test]
async fn a_busy_loop_with_fuel_to_spare_is_stopped_by_the_epoch_deadline() {
    // Fuel enough for minutes of looping: only the wall-clock deadline can stop it.
    let runtime = Runtime::new(RuntimeConfig {
        fuel_per_activation: u64::MAX / 2,
        cache_dir: Some(repo().join("target/component-cache-tests")),
        instance_pool: 2,
        limits: GuestLimits {
            deadline_ms: 300,
            ..GuestLimits::default()
        },
        ..RuntimeConfig::default()
    })
    .unwrap();
    let workflow = runtime
        .load_file(
            &component("guest-fixtures/fixture-misbehave.wasm"),
            &grants(&[("fixture-misbehave", &[Capability::Dns])]),
        )
        .await
        .unwrap();
    let activation = workflow
        .activate(
            &runtime,
            Box::new(FakeHost::default()),
            1,
            r#"{"action":"loop"}"#,
        )
        .await;
    assert!(
        matches!(
            activation,
            Outcome::Limit(LimitExceeded::Deadline { limit_ms: 300 })
        ),
        "{activation:?}"
    );
}

#[tokio::test]
async fn time_the_host_spends_answering_does_not_count_against_the_deadline() {
    let runtime = Runtime::new(RuntimeConfig {
        cache_dir: Some(repo().join("target/component-cache-tests")),
        instance_pool: 2,
        limits: GuestLimits {
            deadline_ms: 200,
            ..GuestLimits::default()
        },
        ..RuntimeConfig::default()
    })
    .unwrap();
    let workflow = runtime
        .load_file(
            &component("guest-fixtures/fixture-misbehave.wasm"),
            &grants(&[("fixture-misbehave", &[Capability::Dns])]),
        )
        .await
        .unwrap();
    // A provider that takes longer than the whole deadline to answer.
    let host = FakeHost::default().answer("dns.find-zone", |_| {
        std::thread::sleep(std::time::Duration::from_millis(400));
        Ok(json!({"Ok": {"id": "Z9", "name": "example.com"}}))
    });
    let activation = workflow
        .activate(&runtime, Box::new(host), 1, r#"{"action":"dns"}"#)
        .await;
    assert!(
        matches!(activation, Outcome::Completed(Ok(ref o)) if o == "\"Z9\""),
        "{activation:?}"
    );
}

/// Each action hands the host something over one limit: the call traps before the host sees it,
/// and the error names the setting.
#[tokio::test]
async fn what_a_guest_hands_the_host_is_bounded_and_the_error_names_the_limit() {
    let cases = [
        ("log-flood", Limit::LogBytes, "context.log"),
        ("log-many", Limit::LogsPerActivation, ""),
        ("emit-huge", Limit::EventBytes, "context.emit"),
        (
            "huge-output",
            Limit::StageOutputBytes,
            "context.stage-succeeded",
        ),
        (
            "huge-approval",
            Limit::ApprovalPayloadBytes,
            "approvals.await-approval",
        ),
        ("huge-call", Limit::CallBytes, "dns.find-zone"),
        ("endless-calls", Limit::JournalEntries, ""),
    ];
    let defaults = GuestLimits::default();
    for (action, expected, refused_op) in cases {
        let (activation, host) = misbehave(action).await;
        let Outcome::Limit(LimitExceeded::Exceeded {
            limit,
            allowed,
            actual,
        }) = activation
        else {
            panic!("{action}: {activation:?}")
        };
        assert_eq!(limit, expected, "{action}");
        assert!(actual > allowed, "{action}: {actual} > {allowed}");
        let message = activation_message(&activation);
        assert!(message.contains(expected.key()), "{action}: {message}");
        if !refused_op.is_empty() {
            assert!(
                !host.ops().iter().any(|op| op == refused_op),
                "{action}: the host never saw the refused `{refused_op}`"
            );
        }
        match expected {
            Limit::LogsPerActivation => assert_eq!(
                host.ops().iter().filter(|op| *op == "context.log").count(),
                defaults.logs_per_activation as usize
            ),
            Limit::JournalEntries => assert_eq!(
                host.ops().len(),
                defaults.journal_entries as usize,
                "every call up to the limit was answered"
            ),
            _ => {}
        }
    }
    let (after, _) = misbehave("ok").await;
    assert!(
        matches!(after, Outcome::Completed(Ok(ref o)) if o == "\"fine\""),
        "{after:?}"
    );
}

#[tokio::test]
async fn unbounded_allocation_hits_the_memory_cap() {
    let (activation, _) = misbehave("allocate").await;
    match activation {
        Outcome::Limit(LimitExceeded::Memory {
            limit_bytes,
            requested_bytes,
        }) => {
            assert_eq!(limit_bytes, 32 << 20);
            assert!(requested_bytes > limit_bytes);
        }
        other => panic!("expected the memory limit, got {other:?}"),
    }
    let message = LimitExceeded::Memory {
        limit_bytes: 1,
        requested_bytes: 2,
    }
    .to_string();
    assert!(message.contains("memory limit"), "{message}");
}

#[tokio::test]
async fn endless_recursion_hits_the_stack_limit() {
    let (activation, _) = misbehave("recurse").await;
    assert!(
        matches!(
            activation,
            Outcome::Limit(LimitExceeded::Stack {
                limit_bytes: 262_144
            })
        ),
        "{activation:?}"
    );
}

#[tokio::test]
async fn a_guest_panic_is_a_trap_with_its_message_and_a_guest_error_is_returned_typed() {
    let (activation, _) = misbehave("panic").await;
    let Outcome::Trapped(message) = activation else {
        panic!("expected a trap, got {activation:?}")
    };
    assert!(
        message.contains("unreachable") || message.contains("panic"),
        "{message}"
    );

    let (activation, _) = misbehave("fail").await;
    let Outcome::Completed(Err(error)) = activation else {
        panic!("expected a guest error, got {activation:?}")
    };
    assert_eq!(
        (error.kind, error.code.as_str()),
        (ErrorKind::Transient, "throttled")
    );
}

#[tokio::test]
async fn a_host_interrupt_unwinds_the_guest_and_is_reported() {
    let workflow = load("workflows/hello.wasm", &CapabilityGrants::new()).await;
    let host = FakeHost::default().answer("time.sleep", |_| {
        Err(Interrupt::Suspend("timer until 6000".into()))
    });
    let activation = workflow
        .activate(
            runtime(),
            Box::new(host.clone()),
            3,
            r#"{"name":"Ada","pauseSeconds":5}"#,
        )
        .await;
    assert!(
        matches!(activation, Outcome::Interrupted(Interrupt::Suspend(ref why)) if why == "timer until 6000"),
        "{activation:?}"
    );
    assert_eq!(
        host.ops().last().map(String::as_str),
        Some("time.sleep"),
        "nothing ran after the interrupt"
    );
}

#[tokio::test]
async fn an_import_that_was_not_granted_is_refused_at_load_naming_workflow_and_import() {
    let path = component("guest-fixtures/fixture-misbehave.wasm");
    let err = runtime()
        .load_file(&path, &CapabilityGrants::new())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::NotGranted {
                capability: Capability::Dns,
                ..
            }
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("fixture-misbehave") && message.contains("capstan:infra/dns@0.1.0"),
        "{message}"
    );

    let (activation, host) = misbehave("dns").await;
    assert!(
        matches!(activation, Outcome::Completed(Ok(ref o)) if o == "\"Z9\""),
        "{activation:?}"
    );
    assert!(host.ops().contains(&"dns.find-zone".to_owned()));
}

#[tokio::test]
async fn a_component_of_another_world_and_a_corrupt_file_are_refused() {
    let err = runtime()
        .load_file(
            &component("guest-fixtures/fixture-wrong-world.wasm"),
            &CapabilityGrants::new(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LoadError::WrongWorld), "{err:?}");
    let err = runtime()
        .load_bytes(
            Path::new("corrupt.wasm"),
            b"\0asm\x0d\0\x01\0garbage",
            &CapabilityGrants::new(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LoadError::Invalid(_)), "{err:?}");
}

#[tokio::test]
async fn a_directory_loads_the_good_components_and_reports_each_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        component("workflows/hello.wasm"),
        dir.path().join("a-hello.wasm"),
    )
    .unwrap();
    std::fs::copy(
        component("workflows/hello.wasm"),
        dir.path().join("b-hello-again.wasm"),
    )
    .unwrap();
    std::fs::copy(
        component("guest-fixtures/fixture-wrong-world.wasm"),
        dir.path().join("c-other.wasm"),
    )
    .unwrap();
    std::fs::write(dir.path().join("d-corrupt.wasm"), b"not wasm at all").unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"ignored").unwrap();
    let report = runtime()
        .load_dir(dir.path(), &CapabilityGrants::new())
        .await;
    let names: Vec<_> = report
        .workflows
        .iter()
        .map(|w| w.descriptor.name.as_str())
        .collect();
    assert_eq!(names, ["hello"]);
    let failures: Vec<_> = report
        .failures
        .iter()
        .map(|f| {
            (
                f.file.file_name().unwrap().to_string_lossy().into_owned(),
                f.error.to_string(),
            )
        })
        .collect();
    assert_eq!(failures.len(), 3, "{failures:?}");
    assert!(
        failures[0].0 == "b-hello-again.wasm"
            && failures[0].1.contains("duplicate workflow name `hello`"),
        "{failures:?}"
    );
    assert!(
        failures[1].0 == "c-other.wasm" && failures[1].1.contains("not a workflow component"),
        "{failures:?}"
    );
    assert!(
        failures[2].0 == "d-corrupt.wasm" && failures[2].1.contains("not a valid component"),
        "{failures:?}"
    );
}

#[tokio::test]
async fn compiled_artifacts_are_cached_on_disk_so_a_restart_does_not_recompile() {
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        cache_dir: Some(cache.path().to_owned()),
        ..RuntimeConfig::default()
    };
    let first = Runtime::new(config.clone()).unwrap();
    let loaded = first
        .load_file(&component("workflows/hello.wasm"), &CapabilityGrants::new())
        .await
        .unwrap();
    assert!(loaded.stats.compiled);
    let artifacts: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(artifacts.len(), 1);
    assert!(artifacts[0].to_string_lossy().starts_with(&loaded.digest));

    let restarted = Runtime::new(config).unwrap();
    let again = restarted
        .load_file(&component("workflows/hello.wasm"), &CapabilityGrants::new())
        .await
        .unwrap();
    assert!(
        !again.stats.compiled,
        "the restart loaded the cached artifact"
    );
    assert_eq!(again.digest, loaded.digest);
    let activation = again
        .activate(
            &restarted,
            Box::new(FakeHost::default()),
            1,
            r#"{"name":"x"}"#,
        )
        .await;
    assert!(
        matches!(activation, Outcome::Completed(Ok(_))),
        "{activation:?}"
    );
}

/// Counts the host calls under way at once; each waits a little, so activations overlap.
#[derive(Clone, Default)]
struct OverlapHost {
    now: Arc<Mutex<(usize, usize)>>,
}

#[async_trait]
impl HostCalls for OverlapHost {
    async fn call(
        &mut self,
        op: &'static str,
        _request: Request,
    ) -> Result<capstan_runtime::Answer, Interrupt> {
        {
            let mut now = self.now.lock().unwrap();
            now.0 += 1;
            now.1 = now.1.max(now.0);
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        self.now.lock().unwrap().0 -= 1;
        Ok(match op {
            "time.now" => json!(1_000),
            _ => Value::Null,
        }
        .into())
    }
}

#[tokio::test]
async fn an_activation_in_a_reused_slot_starts_from_a_fresh_memory() {
    // One slot: every activation reuses it, reset by whatever the host offers (only the written
    // pages zeroed where the kernel can tell which they are, `madvise` elsewhere).
    let pooled = Runtime::new(RuntimeConfig {
        memory_limit_bytes: 32 << 20,
        fuel_per_activation: 200_000_000,
        max_wasm_stack_bytes: 256 << 10,
        cache_dir: Some(repo().join("target/component-cache-tests")),
        instance_pool: 1,
        limits: GuestLimits::default(),
    })
    .unwrap();
    let workflow = pooled
        .load_file(
            &component("guest-fixtures/fixture-misbehave.wasm"),
            &grants(&[("fixture-misbehave", &[Capability::Dns])]),
        )
        .await
        .unwrap();
    for seed in 0..3 {
        let activation = workflow
            .activate(
                &pooled,
                Box::new(FakeHost::default()),
                seed,
                r#"{"action":"remember"}"#,
            )
            .await;
        let Outcome::Completed(Ok(output)) = activation else {
            panic!("activation {seed} completes: {activation:?}");
        };
        assert_eq!(
            output, "\"0 0\"",
            "activation {seed}: nothing the one before it wrote is seen"
        );
    }
}

#[tokio::test]
async fn activations_beyond_the_instance_pool_wait_for_a_slot_instead_of_failing() {
    let pooled = Runtime::new(RuntimeConfig {
        memory_limit_bytes: 32 << 20,
        fuel_per_activation: 200_000_000,
        max_wasm_stack_bytes: 256 << 10,
        cache_dir: Some(repo().join("target/component-cache-tests")),
        instance_pool: 2,
        limits: GuestLimits::default(),
    })
    .unwrap();
    let workflow = pooled
        .load_file(&component("workflows/hello.wasm"), &CapabilityGrants::new())
        .await
        .unwrap();
    let host = OverlapHost::default();
    let activations = (0..6).map(|i| {
        workflow.activate(
            &pooled,
            Box::new(host.clone()),
            i,
            r#"{"name":"Ada","pauseSeconds":0}"#,
        )
    });
    for activation in futures_util::future::join_all(activations).await {
        assert!(
            matches!(activation, Outcome::Completed(Ok(_))),
            "every activation completes: {activation:?}"
        );
    }
    let (under_way, most) = *host.now.lock().unwrap();
    assert_eq!(under_way, 0);
    assert_eq!(most, 2, "two slots: two activations at a time, never more");
}
