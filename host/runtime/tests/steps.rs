//! Fulfilment steps against real components built by `just build-guests`: the three shipped steps
//! (`target/steps/`) chained as the host chains them, with the documented op names and JSON, and a
//! fixture step that runs into every sandbox wall on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_trait::async_trait;
use capstan_core::{CapabilityError, CapabilityGrants, ErrorKind};
use capstan_runtime::{
    HostCalls, Interrupt, LimitExceeded, LoadError, LoadedStep, Request, Runtime, RuntimeConfig,
    StepFailure,
};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

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

/// The limits of `tests/sandbox.rs` (so the on-disk artifact cache is shared).
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        Runtime::new(RuntimeConfig {
            memory_limit_bytes: 32 << 20,
            fuel_per_activation: 200_000_000,
            max_wasm_stack_bytes: 256 << 10,
            cache_dir: Some(repo().join("target/component-cache-tests")),
            instance_pool: 16,
            limits: capstan_runtime::GuestLimits::default(),
        })
        .unwrap()
    })
}

async fn step(relative: &str) -> LoadedStep {
    runtime()
        .load_step_file(&component(relative))
        .await
        .unwrap()
}

fn booking_view() -> Value {
    json!({
        "booking_id": "42",
        "partner_id": "partner-1",
        "product_id": "1001",
        "product_name": "Colosseum",
        "product_type": "ATTRACTION",
        "variant_id": "2001",
        "variant_name": "Skip-the-line",
        "start_date_time": "2026-12-31T09:00:00",
        "customers": [
            {"person_type": "ADULT", "is_primary": true, "input_fields": [["fullName", "Ada"]]},
            {"person_type": "ADULT", "is_primary": false, "input_fields": []},
            {"person_type": "CHILD", "is_primary": false, "input_fields": []}
        ],
        "seat_codes": [],
        "amount_minor": 12000,
        "currency_code": "EUR",
        "tickets": []
    })
}

type Answer = Box<dyn FnMut(&Value) -> Result<Value, Interrupt> + Send>;

/// A booking host as a server would write it from the runtime's documentation: it records every
/// call and answers the booking and the three services; answers can be overridden per op.
#[derive(Clone, Default)]
struct BookingHost {
    calls: Arc<Mutex<Vec<(String, Value)>>>,
    overrides: Arc<Mutex<Vec<(&'static str, Answer)>>>,
    /// Answers as JSON text, as a journal replaying its calls gives them.
    text: bool,
}

impl BookingHost {
    fn answering_as_text(mut self) -> Self {
        self.text = true;
        self
    }
    fn answer(
        self,
        op: &'static str,
        f: impl FnMut(&Value) -> Result<Value, Interrupt> + Send + 'static,
    ) -> Self {
        self.overrides.lock().unwrap().push((op, Box::new(f)));
        self
    }
    fn calls(&self) -> Vec<(String, Value)> {
        self.calls.lock().unwrap().clone()
    }
    fn ops(&self) -> Vec<String> {
        self.calls().into_iter().map(|(op, _)| op).collect()
    }
    fn take(&self) -> Vec<(String, Value)> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

impl BookingHost {
    async fn respond(&mut self, op: &'static str, request: Request) -> Result<Value, Interrupt> {
        let request = request.value;
        self.calls
            .lock()
            .unwrap()
            .push((op.to_owned(), request.clone()));
        if let Some((_, f)) = self
            .overrides
            .lock()
            .unwrap()
            .iter_mut()
            .find(|(o, _)| *o == op)
        {
            return f(&request);
        }
        let id = request["booking_id"].as_str().unwrap_or("?").to_owned();
        Ok(match op {
            "booking.current" => booking_view(),
            "supplier.confirm" => json!({"Ok": {"supplier_reference": format!("SUP-{id}")}}),
            "admission.issue-tickets" => {
                let tickets: Vec<Value> = (1..=request["count"].as_u64().unwrap())
                    .map(|n| {
                        json!({"public_id": format!("TKT-{id}-{n}"), "url": null, "type_": "QRCODE"})
                    })
                    .collect();
                json!({"Ok": tickets})
            }
            "vouchers.deliver-voucher" => {
                json!({"Ok": {"url": format!("https://vouchers.example/{id}.pdf")}})
            }
            "context.log" => Value::Null,
            "time.now" => json!(1_767_225_600_000_u64),
            other => return Err(Interrupt::Host(format!("no answer for {other}"))),
        })
    }
}

#[async_trait]
impl HostCalls for BookingHost {
    async fn call(
        &mut self,
        op: &'static str,
        request: Request,
    ) -> Result<capstan_runtime::Answer, Interrupt> {
        let answer = self.respond(op, request).await?;
        Ok(if self.text {
            capstan_runtime::Answer::Text(capstan_core::store::JsonText::new(&answer))
        } else {
            answer.into()
        })
    }
}

#[tokio::test]
async fn the_shipped_steps_load_from_their_directory_and_describe_themselves() {
    let report = runtime().load_step_dir(&repo().join("target/steps")).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let names: Vec<_> = report.steps.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["confirm-supplier", "deliver-voucher", "issue-tickets"]
    );
    let confirm = &report.steps["confirm-supplier"];
    assert_eq!(confirm.name, "confirm-supplier");
    assert_eq!(confirm.version, "0.1.0");
    assert!(
        confirm.description.contains("supplier"),
        "{}",
        confirm.description
    );
    assert_eq!(confirm.digest.len(), 64);
    assert!(
        confirm
            .imports
            .iter()
            .any(|i| i == "capstan:booking/supplier@0.1.0"),
        "{:?}",
        confirm.imports
    );
}

#[tokio::test]
async fn a_pipeline_chains_outputs_and_each_host_call_has_its_documented_op_and_json() {
    let host = BookingHost::default();

    let confirm = step("steps/confirm-supplier.wasm").await;
    let output = confirm
        .run(host.clone(), Value::Null)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(output, json!({"supplierReference": "SUP-42"}));
    let calls = host.take();
    assert_eq!(
        calls.iter().map(|(op, _)| op.as_str()).collect::<Vec<_>>(),
        ["booking.current", "supplier.confirm", "context.log"]
    );
    assert_eq!(calls[0].1, json!({}));
    assert_eq!(
        calls[1].1,
        json!({"booking_id": "42", "product_id": "1001", "variant_id": "2001",
               "start_date_time": "2026-12-31T09:00:00", "pax": 3})
    );
    assert_eq!(calls[2].1["level"], "Info");

    let issue = step("steps/issue-tickets.wasm").await;
    let output = issue.run(host.clone(), output).await.unwrap().unwrap();
    let tickets = json!([
        {"publicId": "TKT-42-1", "url": null, "type": "QRCODE"},
        {"publicId": "TKT-42-2", "url": null, "type": "QRCODE"},
        {"publicId": "TKT-42-3", "url": null, "type": "QRCODE"}
    ]);
    assert_eq!(
        output,
        json!({"supplierReference": "SUP-42", "tickets": tickets})
    );
    let calls = host.take();
    assert_eq!(
        calls[1],
        (
            "admission.issue-tickets".to_owned(),
            json!({"booking_id": "42", "count": 3})
        )
    );

    // A boxed host works too (what a server holding `Box<dyn HostCalls>` passes).
    let deliver = step("steps/deliver-voucher.wasm").await;
    let boxed: Box<dyn HostCalls> = Box::new(host.clone());
    let output = deliver.run(boxed, output).await.unwrap().unwrap();
    assert_eq!(
        output,
        json!({"supplierReference": "SUP-42", "tickets": tickets,
               "voucherUrl": "https://vouchers.example/42.pdf"})
    );
    let calls = host.take();
    assert_eq!(calls[1].0, "vouchers.deliver-voucher");
    assert_eq!(
        calls[1].1,
        json!({"booking_id": "42", "tickets": [
            {"public_id": "TKT-42-1", "url": null, "type_": "QRCODE"},
            {"public_id": "TKT-42-2", "url": null, "type_": "QRCODE"},
            {"public_id": "TKT-42-3", "url": null, "type_": "QRCODE"}
        ]})
    );
}

#[tokio::test]
async fn a_capability_error_comes_back_unchanged_as_the_steps_own_error() {
    let confirm = step("steps/confirm-supplier.wasm").await;
    let host = BookingHost::default().answer("supplier.confirm", |_| {
        Ok(json!({"Err": {"kind": "Permanent", "code": "supplier-rejected", "message": "sold out"}}))
    });
    let result = confirm.run(host.clone(), Value::Null).await.unwrap();
    assert_eq!(
        result,
        Err(CapabilityError::permanent("supplier-rejected", "sold out"))
    );
    assert_eq!(host.ops(), ["booking.current", "supplier.confirm"]);

    let host = BookingHost::default().answer("supplier.confirm", |_| {
        Ok(json!({"Err": {"kind": "Transient", "code": "timeout", "message": "no answer"}}))
    });
    let error = confirm.run(host, Value::Null).await.unwrap().unwrap_err();
    assert_eq!(
        (error.kind, error.code.as_str()),
        (ErrorKind::Transient, "timeout")
    );
}

#[tokio::test]
async fn answers_given_as_text_reach_the_guest_as_values_do() {
    let confirm = step("steps/confirm-supplier.wasm").await;
    let host = BookingHost::default().answering_as_text();
    let output = confirm.run(host.clone(), Value::Null).await.unwrap();
    assert_eq!(output, Ok(json!({"supplierReference": "SUP-42"})));
    assert_eq!(
        host.ops(),
        ["booking.current", "supplier.confirm", "context.log"]
    );

    let host = BookingHost::default().answering_as_text().answer("supplier.confirm", |_| {
        Ok(json!({"Err": {"kind": "Permanent", "code": "supplier-rejected", "message": "sold out"}}))
    });
    let result = confirm.run(host, Value::Null).await.unwrap();
    assert_eq!(
        result,
        Err(CapabilityError::permanent("supplier-rejected", "sold out"))
    );
}

#[tokio::test]
async fn an_answer_that_does_not_fit_the_wit_type_traps_naming_the_op() {
    let confirm = step("steps/confirm-supplier.wasm").await;
    // `kind` must be the Rust case name ("Permanent"), not lower case; as a value or as text.
    for text in [false, true] {
        let host = BookingHost {
            text,
            ..BookingHost::default()
        }
        .answer("supplier.confirm", |_| {
            Ok(json!({"Err": {"kind": "permanent", "code": "x", "message": "y"}}))
        });
        let failure = confirm.run(host, Value::Null).await.unwrap_err();
        let StepFailure::Trapped(message) = &failure else {
            panic!("expected a trap, got {failure:?}")
        };
        assert!(
            message.contains("supplier.confirm")
                && message.contains("does not fit")
                && message.contains(r#""kind":"permanent""#),
            "{message}"
        );
        assert!(failure.is_guest_fault());
    }

    let host = BookingHost::default().answer("booking.current", |_| {
        Err(Interrupt::Host("database down".into()))
    });
    let failure = confirm.run(host, Value::Null).await.unwrap_err();
    assert!(
        matches!(failure, StepFailure::Interrupted(Interrupt::Host(ref why)) if why == "database down"),
        "{failure:?}"
    );
    assert!(!failure.is_guest_fault());
}

async fn misbehave(action: &str) -> Result<Result<Value, CapabilityError>, StepFailure> {
    let fixture = step("guest-fixtures/fixture-step-misbehave.wasm").await;
    fixture
        .run(BookingHost::default(), json!({"action": action}))
        .await
}

#[tokio::test]
async fn a_step_runs_into_the_same_sandbox_walls_as_a_workflow() {
    let looped = misbehave("loop").await;
    assert!(
        matches!(
            looped,
            Err(StepFailure::Limit(LimitExceeded::Cpu { fuel: 200_000_000 }))
        ),
        "{looped:?}"
    );
    let allocated = misbehave("allocate").await;
    assert!(
        matches!(
            allocated,
            Err(StepFailure::Limit(LimitExceeded::Memory { limit_bytes, .. })) if limit_bytes == 32 << 20
        ),
        "{allocated:?}"
    );
    let recursed = misbehave("recurse").await;
    assert!(
        matches!(
            recursed,
            Err(StepFailure::Limit(LimitExceeded::Stack {
                limit_bytes: 262_144
            }))
        ),
        "{recursed:?}"
    );
    let panicked = misbehave("panic").await;
    assert!(
        matches!(&panicked, Err(StepFailure::Trapped(m)) if m.contains("unreachable") || m.contains("panic")),
        "{panicked:?}"
    );
    let failed = misbehave("fail").await.unwrap();
    assert_eq!(
        failed,
        Err(CapabilityError::transient(
            "throttled",
            "the step fixture fails on request"
        ))
    );
    // The host keeps serving after every wall.
    let echoed = misbehave("echo").await.unwrap().unwrap();
    assert_eq!(
        echoed,
        json!({"bookingId": "42", "customers": 3, "now": 1_767_225_600_000_u64})
    );
    let bad_input = misbehave("fly").await.unwrap().unwrap_err();
    assert_eq!(
        (bad_input.kind, bad_input.code.as_str()),
        (ErrorKind::Permanent, "invalid-input")
    );
}

#[tokio::test]
async fn a_component_of_the_other_world_is_refused_naming_the_file() {
    let hello = component("workflows/hello.wasm");
    let err = runtime().load_step_file(&hello).await.unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::NotAStep {
                is_workflow: true,
                ..
            }
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&hello.display().to_string())
            && message.contains("not a fulfilment step")
            && message.contains("workflow component"),
        "{message}"
    );

    let other = component("guest-fixtures/fixture-wrong-world.wasm");
    let err = runtime().load_step_file(&other).await.unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::NotAStep {
                is_workflow: false,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("wrong world?"), "{err}");

    // And a step is not a workflow.
    let confirm = component("steps/confirm-supplier.wasm");
    let err = runtime()
        .load_file(&confirm, &CapabilityGrants::new())
        .await
        .unwrap_err();
    assert!(matches!(err, LoadError::StepNotWorkflow { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with("not a workflow component")
            && message.contains(&confirm.display().to_string())
            && message.contains("fulfilment step"),
        "{message}"
    );

    let err = runtime()
        .load_step_bytes(Path::new("corrupt.wasm"), b"\0asm\x0d\0\x01\0garbage")
        .await
        .unwrap_err();
    assert!(matches!(err, LoadError::Invalid(_)), "{err:?}");
}

#[tokio::test]
async fn a_newer_component_with_the_same_name_replaces_a_step_and_bad_files_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let set_age = |file: &Path, seconds_ago: u64| {
        let at = SystemTime::now() - Duration::from_secs(seconds_ago);
        std::fs::File::options()
            .write(true)
            .open(file)
            .unwrap()
            .set_modified(at)
            .unwrap();
    };
    // `z-...` sorts last by name but is older: the newer `a-...` wins.
    let older = dir.path().join("z-confirm-supplier-old.wasm");
    let newer = dir.path().join("a-confirm-supplier-new.wasm");
    std::fs::copy(component("steps/confirm-supplier.wasm"), &older).unwrap();
    std::fs::copy(component("steps/confirm-supplier.wasm"), &newer).unwrap();
    set_age(&older, 3_600);
    set_age(&newer, 60);
    std::fs::copy(
        component("workflows/hello.wasm"),
        dir.path().join("hello.wasm"),
    )
    .unwrap();
    std::fs::write(dir.path().join("corrupt.wasm"), b"not wasm").unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"ignored").unwrap();

    let report = runtime().load_step_dir(dir.path()).await;
    assert_eq!(
        report.steps.keys().collect::<Vec<_>>(),
        ["confirm-supplier"]
    );
    assert_eq!(report.steps["confirm-supplier"].file, newer);
    let mut failures: Vec<_> = report
        .failures
        .iter()
        .map(|f| {
            (
                f.file.file_name().unwrap().to_string_lossy().into_owned(),
                f.error.to_string(),
            )
        })
        .collect();
    failures.sort();
    assert_eq!(failures.len(), 3, "{failures:?}");
    assert!(
        failures[0].0 == "corrupt.wasm" && failures[0].1.contains("not a valid component"),
        "{failures:?}"
    );
    assert!(
        failures[1].0 == "hello.wasm" && failures[1].1.contains("not a fulfilment step"),
        "{failures:?}"
    );
    assert!(
        failures[2].0 == "z-confirm-supplier-old.wasm"
            && failures[2]
                .1
                .contains("step `confirm-supplier` is replaced by")
            && failures[2].1.contains("a-confirm-supplier-new.wasm"),
        "{failures:?}"
    );

    let missing = runtime()
        .load_step_dir(&dir.path().join("does-not-exist"))
        .await;
    assert!(missing.steps.is_empty());
    assert!(
        matches!(missing.failures[..], [ref f] if matches!(f.error, LoadError::Read { .. })),
        "{:?}",
        missing.failures
    );
}
