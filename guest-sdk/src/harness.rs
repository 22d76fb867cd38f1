//! A native test harness: runs a [`Workflow`] without the host, against fakes and a simulated
//! clock, and reports its stages, journal, events and output.
//!
//! ```ignore
//! let report = Harness::new()
//!     .fake("dns.find-zone", |_| Ok(json!({"id": "Z1", "name": "example.com"})))
//!     .run::<OnboardDomain>(json!({"domain": "example.com"}));
//! assert_eq!(report.stage_names(), ["readiness", "registration"]);
//! assert_eq!(report.calls("dns.change-records").len(), 1);
//! ```
//!
//! Platform calls (`context.*`, `time.*`, `approvals.*`) are answered by the harness itself:
//! `time.now` reads the simulated clock and `time.sleep` advances it, so a workflow that sleeps
//! for a day runs instantly. Capability calls are answered by the fakes; a call without a fake
//! panics with the operation's name, so a test says exactly what it forgot.

use crate::workflow::{self, Workflow};
use crate::{Error, LogLevel};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::cell::RefCell;
use std::collections::HashMap;

type Fake = Box<dyn FnMut(&Value) -> Result<Value, Error>>;

/// 2026-01-01T00:00:00Z, the harness clock's default start.
pub const DEFAULT_START_MILLIS: u64 = 1_767_225_600_000;

/// One host call as the host would journal it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub op: String,
    pub request: Value,
    pub response: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageStatus {
    Running,
    Succeeded,
    Failed,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    pub name: String,
    pub status: StageStatus,
    pub output: Option<Value>,
    pub error: Option<Error>,
}

/// What a run did.
#[derive(Debug)]
pub struct Report {
    /// The workflow's output JSON, or its error.
    pub output: Result<Value, Error>,
    pub stages: Vec<Stage>,
    pub journal: Vec<Entry>,
    pub events: Vec<(String, Value)>,
    pub logs: Vec<(LogLevel, String)>,
    /// The simulated clock when the run ended.
    pub clock_millis: u64,
}

impl Report {
    pub fn stage_names(&self) -> Vec<&str> {
        self.stages.iter().map(|s| s.name.as_str()).collect()
    }

    /// The journal entries of one operation (`"dns.change-records"`), in order.
    pub fn calls(&self, op: &str) -> Vec<&Entry> {
        self.journal.iter().filter(|e| e.op == op).collect()
    }

    pub fn stage(&self, name: &str) -> Option<&Stage> {
        self.stages.iter().find(|s| s.name == name)
    }
}

/// Builds a run: fakes, approvals, clock and cancellation, then [`Harness::run`].
pub struct Harness {
    fakes: HashMap<String, Fake>,
    approvals: HashMap<String, Value>,
    clock_millis: u64,
    cancellation_requested: bool,
    info: Value,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut fakes: Vec<_> = self.fakes.keys().collect();
        fakes.sort();
        f.debug_struct("Harness")
            .field("fakes", &fakes)
            .field("clock_millis", &self.clock_millis)
            .finish()
    }
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Self {
        Self {
            fakes: HashMap::new(),
            approvals: HashMap::new(),
            clock_millis: DEFAULT_START_MILLIS,
            cancellation_requested: false,
            info: json!({
                "execution_id": "exec-test",
                "workflow_run_id": "run-test",
                "workflow": "test",
                "principal_id": "principal-test",
            }),
        }
    }

    /// Answers `op` (`"<interface>.<function>"`) with `f(request)`; the request is a JSON object
    /// keyed by parameter name.
    pub fn fake(
        mut self,
        op: &str,
        f: impl FnMut(&Value) -> Result<Value, Error> + 'static,
    ) -> Self {
        self.fakes.insert(op.to_owned(), Box::new(f));
        self
    }

    /// Answers `op` with `value` every time.
    pub fn reply(self, op: &str, value: Value) -> Self {
        self.fake(op, move |_| Ok(value.clone()))
    }

    /// Fails `op` with `error` every time.
    pub fn fail(self, op: &str, error: Error) -> Self {
        self.fake(op, move |_| Err(error.clone()))
    }

    /// Approves the approval named `name` with `body`.
    pub fn approve(mut self, name: &str, body: Value) -> Self {
        self.approvals.insert(name.to_owned(), body);
        self
    }

    pub fn clock_millis(mut self, millis: u64) -> Self {
        self.clock_millis = millis;
        self
    }

    /// Makes `ctx.cancellation_requested()` answer true.
    pub fn cancellation_requested(mut self, yes: bool) -> Self {
        self.cancellation_requested = yes;
        self
    }

    /// Runs `W` on `input` (serialized as the host would) and reports what happened.
    pub fn run<W: Workflow>(self, input: Value) -> Report {
        let state = State {
            harness: self,
            stages: Vec::new(),
            journal: Vec::new(),
            events: Vec::new(),
            logs: Vec::new(),
        };
        ACTIVE.with(|a| *a.borrow_mut() = Some(state));
        let output = workflow::run::<W>(&input.to_string())
            .map(|text| serde_json::from_str(&text).unwrap_or(Value::Null));
        let state = ACTIVE.with(|a| a.borrow_mut().take());
        let Some(state) = state else {
            panic!("capstan-sdk harness: run state vanished (nested Harness::run?)");
        };
        Report {
            output,
            stages: state.stages,
            journal: state.journal,
            events: state.events,
            logs: state.logs,
            clock_millis: state.harness.clock_millis,
        }
    }
}

struct State {
    harness: Harness,
    stages: Vec<Stage>,
    journal: Vec<Entry>,
    events: Vec<(String, Value)>,
    logs: Vec<(LogLevel, String)>,
}

thread_local! {
    static ACTIVE: RefCell<Option<State>> = const { RefCell::new(None) };
}

fn str_field(request: &Value, key: &str) -> String {
    request
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

impl State {
    fn answer(&mut self, op: &str, request: &Value) -> Value {
        match op {
            "context.info" => self.harness.info.clone(),
            "context.stage-begin" => {
                self.stages.push(Stage {
                    name: str_field(request, "name"),
                    status: StageStatus::Running,
                    output: None,
                    error: None,
                });
                Value::Null
            }
            "context.stage-succeeded" | "context.stage-failed" => {
                let name = str_field(request, "name");
                if let Some(stage) = self.stages.iter_mut().rev().find(|s| s.name == name) {
                    if op == "context.stage-succeeded" {
                        stage.status = StageStatus::Succeeded;
                        stage.output = request
                            .get("output")
                            .and_then(Value::as_str)
                            .and_then(|t| serde_json::from_str(t).ok());
                    } else {
                        stage.status = StageStatus::Failed;
                        stage.error = request
                            .get("error")
                            .and_then(|e| serde_json::from_value(e.clone()).ok());
                    }
                }
                Value::Null
            }
            "context.log" => {
                let level = request
                    .get("level")
                    .and_then(|l| serde_json::from_value(l.clone()).ok())
                    .unwrap_or(LogLevel::Info);
                self.logs.push((level, str_field(request, "message")));
                Value::Null
            }
            "context.emit" => {
                let payload =
                    serde_json::from_str(&str_field(request, "payload")).unwrap_or(Value::Null);
                self.events
                    .push((str_field(request, "event_type"), payload));
                Value::Null
            }
            "context.cancellation-requested" => json!(self.harness.cancellation_requested),
            "time.now" => json!(self.harness.clock_millis),
            "time.sleep" => {
                self.harness.clock_millis +=
                    request.get("millis").and_then(Value::as_u64).unwrap_or(0);
                Value::Null
            }
            "approvals.await-approval" => {
                let name = str_field(request, "name");
                let result: Result<String, Error> = match self.harness.approvals.get(&name) {
                    Some(body) => Ok(body.to_string()),
                    None => Err(Error::permanent(
                        "not-approved",
                        format!("the harness has no approval for `{name}`"),
                    )),
                };
                serde_json::to_value(result).unwrap_or(Value::Null)
            }
            _ => {
                let Some(fake) = self.harness.fakes.get_mut(op) else {
                    panic!(
                        "capstan-sdk harness: no fake for `{op}` (request {request}); add `.fake(\"{op}\", ...)`"
                    );
                };
                serde_json::to_value(fake(request)).unwrap_or(Value::Null)
            }
        }
    }
}

/// Answers one host call made by the SDK natively.
pub(crate) fn call<T: DeserializeOwned>(op: &str, request: Value) -> T {
    let response = ACTIVE.with(|a| {
        let mut active = a.borrow_mut();
        let Some(state) = active.as_mut() else {
            panic!("capstan-sdk: `{op}` called outside Harness::run (natively, workflows run only in the harness)");
        };
        let response = state.answer(op, &request);
        state.journal.push(Entry { op: op.to_owned(), request, response: response.clone() });
        response
    });
    match serde_json::from_value(response.clone()) {
        Ok(value) => value,
        Err(e) => panic!(
            "capstan-sdk harness: the answer to `{op}` does not fit its WIT type: {e}; answer was {response}"
        ),
    }
}
