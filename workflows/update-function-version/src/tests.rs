//! Harness tests against a fake functions service: versions `"1"`, `"2"`, ... per function, an
//! alias map, and a probe whose answer each test picks.

use super::*;
use capstan_sdk::harness::{Harness, Report, StageStatus};
use capstan_sdk::{Value, json};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

const OLD: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const NEW: &str = "2222222222222222222222222222222222222222222222222222222222222222";

thread_local! {
    static CANCEL_BEFORE: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// Whether the test lets a cancel land at the safe point before `stage`.
pub(super) fn cancel_lands_before(stage: &str) -> bool {
    CANCEL_BEFORE.with(|c| c.get() == Some(stage))
}

/// `edge-router` with version 1 (code `OLD`) behind alias `live`.
struct Service {
    versions: Rc<RefCell<Vec<String>>>,
    alias: Rc<RefCell<String>>,
}

impl Service {
    fn new() -> Self {
        Self {
            versions: Rc::new(RefCell::new(vec![OLD.to_owned()])),
            alias: Rc::new(RefCell::new("1".to_owned())),
        }
    }

    fn harness(&self, probe: Result<bool, Error>) -> Harness {
        let (versions, alias, alias2) = (
            self.versions.clone(),
            self.alias.clone(),
            self.alias.clone(),
        );
        Harness::new()
            .fake("functions.get-alias", move |req| {
                if req["alias"] != "live" {
                    return Err(Error::permanent("not-found", "no such alias"));
                }
                Ok(json!({"function_name": req["function_name"], "name": "live", "version": *alias.borrow(), "routing": []}))
            })
            .fake("functions.publish-version", move |req| {
                let sha = req["code_sha256"].as_str().unwrap().to_owned();
                let mut versions = versions.borrow_mut();
                if versions.last() != Some(&sha) {
                    versions.push(sha.clone());
                }
                Ok(json!({"function_name": req["function_name"], "version": versions.len().to_string(), "code_sha256": sha}))
            })
            .fake("functions.update-alias", move |req| {
                let before = alias2.replace(req["version"].as_str().unwrap().to_owned());
                Ok(json!({
                    "before": {"function_name": req["function_name"], "name": req["alias"], "version": before, "routing": []},
                    "after": {"function_name": req["function_name"], "name": req["alias"], "version": req["version"], "routing": []},
                }))
            })
            .fake("functions.probe", move |_| probe.clone().map(Value::Bool))
    }
}

fn input(sha: &str) -> Value {
    json!({"functionName": "edge-router", "codeSha256": sha})
}

fn run_with_cancel_before(stage: Option<&'static str>, harness: Harness) -> Report {
    CANCEL_BEFORE.with(|c| c.set(stage));
    let report = harness.run::<UpdateFunctionVersion>(input(NEW));
    CANCEL_BEFORE.with(|c| c.set(None));
    report
}

fn effects(report: &Report) -> Vec<&str> {
    report
        .journal
        .iter()
        .map(|e| e.op.as_str())
        .filter(|op| op.starts_with("functions."))
        .collect()
}

#[test]
fn publishes_shifts_and_verifies() {
    let service = Service::new();
    let report = service
        .harness(Ok(true))
        .run::<UpdateFunctionVersion>(input(NEW));
    let output: Output = serde_json::from_value(report.output.clone().unwrap()).unwrap();
    assert_eq!(
        output,
        Output {
            function_name: "edge-router".to_owned(),
            alias: "live".to_owned(),
            code_sha256: NEW.to_owned(),
            version: "2".to_owned(),
            previous_version: "1".to_owned(),
            alias_changed: true,
            healthy: true,
        }
    );
    assert_eq!(report.stage_names(), ["publish", "shift-alias", "verify"]);
    assert!(
        report
            .stages
            .iter()
            .all(|s| s.status == StageStatus::Succeeded)
    );
    assert_eq!(
        effects(&report),
        [
            "functions.get-alias",
            "functions.publish-version",
            "functions.update-alias",
            "functions.probe"
        ]
    );
    assert_eq!(
        report.calls("functions.update-alias")[0].request,
        json!({"function_name": "edge-router", "alias": "live", "version": "2"})
    );
    assert_eq!(
        report.calls("functions.probe")[0].request,
        json!({"function_name": "edge-router", "alias": "live"})
    );
    assert_eq!(*service.alias.borrow(), "2");
}

#[test]
fn the_same_code_again_leaves_the_alias_alone() {
    let service = Service::new();
    let report = service
        .harness(Ok(true))
        .run::<UpdateFunctionVersion>(input(OLD));
    let output: Output = serde_json::from_value(report.output.clone().unwrap()).unwrap();
    assert_eq!(output.version, "1");
    assert_eq!(output.previous_version, "1");
    assert!(!output.alias_changed);
    assert!(report.calls("functions.update-alias").is_empty());
    assert_eq!(report.stage_names(), ["publish", "shift-alias", "verify"]);
}

#[test]
fn checks_for_a_cancel_at_each_safe_point() {
    let report = Service::new()
        .harness(Ok(true))
        .run::<UpdateFunctionVersion>(input(NEW));
    let ops: Vec<&str> = report
        .journal
        .iter()
        .map(|e| e.op.as_str())
        .filter(|op| *op == "context.cancellation-requested" || *op == "context.stage-begin")
        .collect();
    assert_eq!(
        ops,
        [
            "context.cancellation-requested",
            "context.stage-begin",
            "context.cancellation-requested",
            "context.stage-begin",
            "context.cancellation-requested",
            "context.stage-begin",
        ]
    );
}

#[test]
fn a_cancel_before_publish_changes_nothing() {
    let service = Service::new();
    // The harness's own flag: every check answers true, so the first safe point stops the run.
    let report = service
        .harness(Ok(true))
        .cancellation_requested(true)
        .run::<UpdateFunctionVersion>(input(NEW));
    let error = report.output.clone().unwrap_err();
    assert_eq!(error.code, "canceled");
    assert!(!error.is_transient());
    assert!(
        error.message.contains("before `publish`"),
        "{}",
        error.message
    );
    assert!(report.stages.is_empty());
    assert!(effects(&report).is_empty());
    assert_eq!(report.calls("context.cancellation-requested").len(), 1);
}

#[test]
fn a_cancel_before_shift_keeps_the_alias_on_the_old_version() {
    let service = Service::new();
    let report = run_with_cancel_before(Some("shift-alias"), service.harness(Ok(true)));
    let error = report.output.clone().unwrap_err();
    assert_eq!(error.code, "canceled");
    assert!(
        error.message.contains("before `shift-alias`")
            && error.message.contains("version 2")
            && error.message.contains("still points at version 1"),
        "{}",
        error.message
    );
    assert_eq!(report.stage_names(), ["publish"]);
    assert_eq!(
        effects(&report),
        ["functions.get-alias", "functions.publish-version"]
    );
    assert_eq!(*service.alias.borrow(), "1");
}

#[test]
fn a_cancel_before_verify_stops_after_the_shift() {
    let service = Service::new();
    let report = run_with_cancel_before(Some("verify"), service.harness(Ok(true)));
    let error = report.output.clone().unwrap_err();
    assert_eq!(error.code, "canceled");
    assert!(
        error.message.contains("before `verify`") && error.message.contains("from version 1 to 2"),
        "{}",
        error.message
    );
    assert_eq!(report.stage_names(), ["publish", "shift-alias"]);
    assert!(report.calls("functions.probe").is_empty());
    assert_eq!(*service.alias.borrow(), "2");
}

#[test]
fn an_unhealthy_probe_fails_and_leaves_the_undo_to_rollback() {
    for probe in [
        Ok(false),
        Err(Error::permanent("injected-fault", "5xx from the function")),
    ] {
        let service = Service::new();
        let report = service
            .harness(probe.clone())
            .run::<UpdateFunctionVersion>(input(NEW));
        let error = report.output.clone().unwrap_err();
        assert_eq!(error.code, "unhealthy-version", "{probe:?}");
        assert!(!error.is_transient());
        assert!(
            error.message.contains("left on version 2 (was 1)"),
            "{}",
            error.message
        );
        let verify = report.stage("verify").unwrap();
        assert_eq!(verify.status, StageStatus::Failed);
        assert_eq!(verify.error.as_ref().unwrap().code, "unhealthy-version");
        // One shift only: the receipt of it is what rollback undoes.
        assert_eq!(report.calls("functions.update-alias").len(), 1);
        assert_eq!(*service.alias.borrow(), "2");
    }
}

#[test]
fn a_transient_probe_error_pauses() {
    let report = Service::new()
        .harness(Err(Error::transient("throttled", "slow down")))
        .run::<UpdateFunctionVersion>(input(NEW));
    let error = report.output.clone().unwrap_err();
    assert!(error.is_transient());
    assert_eq!(error.code, "throttled");
}

#[test]
fn a_missing_alias_fails_before_publishing() {
    let report = Service::new()
        .harness(Ok(true))
        .run::<UpdateFunctionVersion>(
            json!({"functionName": "edge-router", "codeSha256": NEW, "alias": "canary"}),
        );
    let error = report.output.clone().unwrap_err();
    assert_eq!(error.code, "alias-not-found");
    assert!(report.calls("functions.publish-version").is_empty());
}

#[test]
fn input_is_validated_before_any_call() {
    for bad in [
        json!({"functionName": "edge-router", "codeSha256": "abc"}),
        json!({"functionName": "edge-router", "codeSha256": "g".repeat(64)}),
        json!({"functionName": "edge router", "codeSha256": NEW}),
        json!({"functionName": "", "codeSha256": NEW}),
        json!({"functionName": "edge-router", "codeSha256": NEW, "alias": "123"}),
        json!({"functionName": "edge-router", "codeSha256": NEW, "extra": true}),
        json!({"codeSha256": NEW}),
    ] {
        let report = Harness::new().run::<UpdateFunctionVersion>(bad.clone());
        assert_eq!(
            report.output.clone().unwrap_err().code,
            "invalid-input",
            "{bad}"
        );
        assert!(report.journal.is_empty(), "{bad}");
    }
    // Upper-case hex is accepted and normalized.
    let report = Service::new()
        .harness(Ok(true))
        .run::<UpdateFunctionVersion>(input(&"AB".repeat(32)));
    assert_eq!(
        report.calls("functions.publish-version")[0].request["code_sha256"],
        "ab".repeat(32)
    );
}

#[test]
fn descriptor_is_cooperative_and_resumable() {
    let d = capstan_sdk::__private::describe::<UpdateFunctionVersion>();
    assert_eq!(d.name, "update-function-version");
    assert_eq!(d.stages, ["publish", "shift-alias", "verify"]);
    assert!(d.resumable_when_failed);
    assert!(d.point_of_no_return.is_none());
    assert_eq!(
        format!("{:?}", d.cancel_mode),
        format!(
            "{:?}",
            capstan_sdk::bindings::workflow::capstan::platform::descriptor::CancelMode::Cooperative
        )
    );
    let schema: Value = serde_json::from_str(&d.input_schema).unwrap();
    assert_eq!(schema["properties"]["alias"]["default"], "live");
    assert_eq!(
        schema["properties"]["codeSha256"]["pattern"],
        "^[A-Fa-f0-9]{64}$"
    );
    assert_eq!(schema["required"], json!(["functionName", "codeSha256"]));
}
