//! The public event catalog, as data: every event type the host publishes, its version, what it
//! means, the JSON Schema (draft 2020-12) of its `payloadJson`, and its lifecycle in code.
//!
//! The catalog is the contract with subscribers (`GET /v1/events/catalog`, webhooks, SSE): an
//! event is published only under a catalogued `<EventType>.v<N>`. Engine events are built by
//! [`crate::events::event`]; a guest's `context.emit` goes through [`normalize_custom`] so that an
//! uncatalogued type is published as `WorkflowEventEmitted.v1` rather than as an unknown type.
//!
//! Lifecycle overrides made by operators (deprecation, archival) live in the store
//! (`event_versions`); the API overlays them on [`CatalogEntry::lifecycle`].

use crate::events::ENGINE_EVENTS;
use serde::Serialize;
use serde_json::{Map, Value, json};

/// `2026-01-01T00:00:00Z`: when the first v1s of this catalog were introduced.
pub const V1_INTRODUCED_MS: i64 = 1_767_225_600_000;

/// `2026-12-06T00:00:00Z`: `RollbackFailed.v1`'s `introducedAt`, the day it was first published
/// (a subscriber's lifecycle view tells a type it could not have seen earlier from one it missed).
pub const ROLLBACK_FAILED_INTRODUCED_MS: i64 = 1_796_515_200_000;

/// The workflow (guest-emitted) event types with a catalogued payload.
pub const WORKFLOW_EVENTS: [&str; 3] = [
    "SubdomainPlanReady",
    "SubdomainPlanApproved",
    "DomainOnboarded",
];

/// The type under which an uncatalogued guest event is published.
pub const GENERIC_WORKFLOW_EVENT: &str = "WorkflowEventEmitted";

/// Where a version is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LifecycleState {
    Active,
    Deprecated,
    Archived,
}

impl LifecycleState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Deprecated => "deprecated",
            Self::Archived => "archived",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "active" => Some(Self::Active),
            "deprecated" => Some(Self::Deprecated),
            "archived" => Some(Self::Archived),
            _ => None,
        }
    }
}

/// A version's lifecycle. Times are Unix milliseconds; the API renders them as RFC 3339
/// (`introducedAt`, `deprecatedAt`, `archivedAt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifecycle {
    pub state: LifecycleState,
    pub introduced_ms: i64,
    pub deprecated_ms: Option<i64>,
    pub archived_ms: Option<i64>,
    /// The `<EventType>.v<N>` subscribers should move to.
    pub replacement: Option<String>,
}

impl Lifecycle {
    fn active_since(ms: i64) -> Self {
        Self {
            state: LifecycleState::Active,
            introduced_ms: ms,
            deprecated_ms: None,
            archived_ms: None,
            replacement: None,
        }
    }

    /// `{state, introducedAt, deprecatedAt?, archivedAt?, replacement?}` with `time` formatting
    /// milliseconds (absent fields are omitted, not null).
    pub fn to_json(&self, time: impl Fn(i64) -> String) -> Value {
        let mut map = Map::new();
        map.insert("state".into(), json!(self.state.as_str()));
        map.insert("introducedAt".into(), json!(time(self.introduced_ms)));
        if let Some(ms) = self.deprecated_ms {
            map.insert("deprecatedAt".into(), json!(time(ms)));
        }
        if let Some(ms) = self.archived_ms {
            map.insert("archivedAt".into(), json!(time(ms)));
        }
        if let Some(r) = &self.replacement {
            map.insert("replacement".into(), json!(r));
        }
        Value::Object(map)
    }
}

/// One `<EventType>.v<N>` of the catalog.
#[derive(Debug, Clone)]
pub struct CatalogEntry {
    pub event_type: &'static str,
    pub version: &'static str,
    pub description: &'static str,
    /// JSON Schema (draft 2020-12) of the event's `payloadJson`.
    pub schema: Value,
    /// The lifecycle in code (before operator overrides).
    pub lifecycle: Lifecycle,
}

impl CatalogEntry {
    /// `<EventType>.v<N>`, the name subscription filters and SSE `event:` lines use.
    pub fn name(&self) -> String {
        format!("{}.v{}", self.event_type, self.version)
    }

    /// The public catalog item: `{eventType, eventVersion, name, description, lifecycle, schema}`.
    pub fn to_json(&self, lifecycle: &Lifecycle, time: impl Fn(i64) -> String) -> Value {
        json!({
            "eventType": self.event_type,
            "eventVersion": self.version,
            "name": self.name(),
            "description": self.description,
            "lifecycle": lifecycle.to_json(time),
            "schema": self.schema,
        })
    }
}

const ALL_STATUSES: [&str; 8] = [
    "canceled",
    "failed",
    "paused",
    "queued",
    "rolled_back",
    "running",
    "succeeded",
    "waiting",
];

fn id_string() -> Value {
    json!({"type": "string", "minLength": 1})
}

/// `{error, message, kind}`: the error of a stage or an execution.
fn error_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["error", "message", "kind"],
        "properties": {
            "error": {"type": "string", "description": "machine-readable code"},
            "message": {"type": "string"},
            "kind": {"enum": ["transient", "permanent"]},
        },
    })
}

/// The schema of a payload `{executionId, workflow, status, ...extra}`: `status` is one of
/// `statuses`, `extra` lists the other properties, `required` those of `extra` always present.
/// `rest` is merged into the schema (for `oneOf`, `dependentRequired`, ...).
fn payload(
    event_type: &str,
    statuses: &[&str],
    extra: Value,
    required: &[&str],
    closed: bool,
    rest: Value,
) -> Value {
    let status = if let [only] = statuses {
        json!({"const": only})
    } else {
        json!({"enum": statuses})
    };
    let mut properties = json!({
        "executionId": id_string(),
        "workflow": id_string(),
        "status": status,
    });
    if let (Some(p), Value::Object(more)) = (properties.as_object_mut(), extra) {
        p.extend(more);
    }
    let mut all_required = vec!["executionId", "workflow", "status"];
    all_required.extend_from_slice(required);
    let mut schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": format!("https://capstan.dev/schemas/events/{event_type}.v1.json"),
        "title": format!("{event_type}.v1 payload"),
        "type": "object",
        "required": all_required,
        "properties": properties,
    });
    if closed {
        schema["additionalProperties"] = json!(false);
    }
    if let (Some(s), Value::Object(more)) = (schema.as_object_mut(), rest) {
        s.extend(more);
    }
    schema
}

/// An embedded schema document (its own `$id` keeps its `$ref`s resolvable); its `$schema` is
/// dropped since the outer document declares the dialect.
fn embedded(text: &str) -> Value {
    let mut schema: Value = serde_json::from_str(text).unwrap_or(Value::Bool(true));
    if let Some(map) = schema.as_object_mut() {
        map.remove("$schema");
    }
    schema
}

fn add_subdomain_plan_schema() -> Value {
    embedded(include_str!(
        "../../../tests/schemas/add-subdomain-plan.schema.json"
    ))
}

fn domain_onboarding_outcome_schema() -> Value {
    embedded(include_str!(
        "../../../tests/schemas/domain-onboarding-outcome.schema.json"
    ))
}

fn entry(event_type: &'static str, description: &'static str, schema: Value) -> CatalogEntry {
    CatalogEntry {
        event_type,
        version: "1",
        description,
        schema,
        lifecycle: Lifecycle::active_since(V1_INTRODUCED_MS),
    }
}

/// An entry introduced after the first v1s, at `introduced_ms`.
fn entry_since(
    event_type: &'static str,
    description: &'static str,
    schema: Value,
    introduced_ms: i64,
) -> CatalogEntry {
    CatalogEntry {
        lifecycle: Lifecycle::active_since(introduced_ms),
        ..entry(event_type, description, schema)
    }
}

/// The whole catalog, in a stable order: engine events, workflow events, the generic one.
pub fn catalog() -> Vec<CatalogEntry> {
    let run_id = || json!({"workflowRunId": id_string()});
    let stage = || json!({"stage": {"type": "string", "minLength": 1}});
    let stage_failed =
        || json!({"stage": {"type": "string", "minLength": 1}, "error": error_schema()});
    let command_id = || json!({"commandId": id_string()});
    let reason = || json!({"type": "string", "minLength": 1});
    vec![
        entry(
            "ExecutionQueued",
            "An execution was created by a trigger, or re-queued by a command (resume, retry-finalization, retry-maps-whitelist, ...).",
            payload(
                "ExecutionQueued",
                &["queued"],
                run_id(),
                &["workflowRunId"],
                true,
                json!({}),
            ),
        ),
        entry(
            "ExecutionStarted",
            "A worker started (or, after a wait, restarted) running the execution.",
            payload(
                "ExecutionStarted",
                &["running"],
                run_id(),
                &["workflowRunId"],
                true,
                json!({}),
            ),
        ),
        entry(
            "StageStarted",
            "A stage began: a workflow stage (status running) or a rollback compensation stage `rollback:<op>` (status is the execution's).",
            payload(
                "StageStarted",
                &ALL_STATUSES,
                stage(),
                &["stage"],
                true,
                json!({}),
            ),
        ),
        entry(
            "StageSucceeded",
            "A stage finished successfully.",
            payload(
                "StageSucceeded",
                &ALL_STATUSES,
                stage(),
                &["stage"],
                true,
                json!({}),
            ),
        ),
        entry(
            "StageFailed",
            "A stage failed, with its error.",
            payload(
                "StageFailed",
                &ALL_STATUSES,
                stage_failed(),
                &["stage", "error"],
                true,
                json!({}),
            ),
        ),
        entry(
            "ExecutionWaiting",
            "The execution waits durably: for a timer, a human approval, or convergence of an external change.",
            payload(
                "ExecutionWaiting",
                &["waiting"],
                json!({"waitingFor": {"enum": ["timer", "approval", "convergence"]}}),
                &["waitingFor"],
                true,
                json!({}),
            ),
        ),
        entry(
            "ExecutionPaused",
            "The execution paused and needs an operator (resume): a transient failure (with `error`), a missing component or a nondeterministic replay (with `message`).",
            payload(
                "ExecutionPaused",
                &["paused"],
                json!({"reason": reason(), "message": {"type": "string"}, "error": error_schema()}),
                &["reason"],
                true,
                json!({"oneOf": [{"required": ["message"]}, {"required": ["error"]}]}),
            ),
        ),
        entry(
            "ExecutionCancellationRequested",
            "A cooperative cancel was requested; the workflow stops at its next safe point. `status` is the execution's status at the request.",
            payload(
                "ExecutionCancellationRequested",
                &["paused", "queued", "running", "waiting"],
                json!({}),
                &[],
                true,
                json!({}),
            ),
        ),
        entry(
            "ExecutionCanceled",
            "The execution was canceled. A cooperative workflow that stopped on request also carries its `reason` and `error`.",
            payload(
                "ExecutionCanceled",
                &["canceled"],
                json!({"reason": reason(), "error": error_schema()}),
                &[],
                true,
                json!({"dependentRequired": {"reason": ["error"], "error": ["reason"]}}),
            ),
        ),
        entry(
            "ExecutionSucceeded",
            "The execution completed successfully.",
            payload(
                "ExecutionSucceeded",
                &["succeeded"],
                json!({}),
                &[],
                true,
                json!({}),
            ),
        ),
        entry(
            "ExecutionFailed",
            "The execution failed permanently (a permanent error, a sandbox limit or a guest trap).",
            payload(
                "ExecutionFailed",
                &["failed"],
                json!({"reason": reason(), "error": error_schema()}),
                &["reason", "error"],
                true,
                json!({}),
            ),
        ),
        entry(
            "RollbackStarted",
            "A rollback command was queued: the execution's receipts will be compensated in reverse order. `status` is the execution's status when rollback began.",
            payload(
                "RollbackStarted",
                &["canceled", "failed", "paused", "succeeded"],
                command_id(),
                &["commandId"],
                true,
                json!({}),
            ),
        ),
        entry(
            "ExecutionRolledBack",
            "The execution was rolled back: immediately when it had nothing to compensate (`compensated: 0`), or by the rollback command `commandId`.",
            payload(
                "ExecutionRolledBack",
                &["rolled_back"],
                json!({"compensated": {"type": "integer", "minimum": 0}, "commandId": id_string()}),
                &[],
                true,
                json!({"oneOf": [{"required": ["compensated"]}, {"required": ["commandId"]}]}),
            ),
        ),
        entry_since(
            "RollbackFailed",
            "A rollback command ended without rolling the execution back: the compensation `stage` failed permanently with `error`. The execution keeps the status it had (`status`); the receipts compensated before stay compensated, and a later rollback compensates the rest.",
            payload(
                "RollbackFailed",
                &["canceled", "failed", "paused", "succeeded"],
                json!({"commandId": id_string(), "stage": {"type": "string", "minLength": 1}, "error": error_schema()}),
                &["commandId", "stage", "error"],
                true,
                json!({}),
            ),
            ROLLBACK_FAILED_INTRODUCED_MS,
        ),
        entry(
            "CommandQueued",
            "A control command was accepted for the execution (`operation`: resume, rollback, or a recovery the workflow declares such as retry-finalization).",
            payload(
                "CommandQueued",
                &ALL_STATUSES,
                json!({"commandId": id_string(), "operation": {"type": "string", "pattern": "^[a-z][a-z0-9-]*$"}}),
                &["commandId", "operation"],
                true,
                json!({}),
            ),
        ),
        entry(
            "SubdomainPlanReady",
            "add-subdomain computed its DNS plan and waits for approval; `data` is the AddSubdomainPlan.",
            payload(
                "SubdomainPlanReady",
                &["running"],
                json!({"data": add_subdomain_plan_schema()}),
                &["data"],
                true,
                json!({}),
            ),
        ),
        entry(
            "SubdomainPlanApproved",
            "The add-subdomain plan was approved with its current hash; the changes are applied next.",
            payload(
                "SubdomainPlanApproved",
                &["running"],
                json!({"data": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["executionId", "planHash"],
                    "properties": {
                        "executionId": id_string(),
                        "planHash": {"type": "string", "pattern": "^[a-f0-9]{64}$"},
                    },
                }}),
                &["data"],
                true,
                json!({}),
            ),
        ),
        entry(
            "DomainOnboarded",
            "onboard-domain reached its outcome; `data` is the DomainOnboardingOutcome (also at Execution.outcome).",
            payload(
                "DomainOnboarded",
                &["running"],
                json!({"data": domain_onboarding_outcome_schema()}),
                &["data"],
                true,
                json!({}),
            ),
        ),
        entry(
            GENERIC_WORKFLOW_EVENT,
            "A workflow emitted a custom event whose type is not in this catalog: `name` is the type it used, `data` its payload (any JSON).",
            payload(
                GENERIC_WORKFLOW_EVENT,
                &["running"],
                json!({"name": {"type": "string"}, "data": true}),
                &["name", "data"],
                true,
                json!({}),
            ),
        ),
    ]
}

/// The entry of `<event_type>.v<version>`, if catalogued.
pub fn find(event_type: &str, version: &str) -> Option<CatalogEntry> {
    catalog()
        .into_iter()
        .find(|e| e.event_type == event_type && e.version == version)
}

/// The payload schema of `<event_type>.v<version>`, if catalogued.
pub fn schema_for(event_type: &str, version: &str) -> Option<Value> {
    find(event_type, version).map(|e| e.schema)
}

/// Parses `<EventType>.v<N>` into `(EventType, N)`.
pub fn parse_name(name: &str) -> Option<(&str, &str)> {
    let (ty, version) = name.rsplit_once(".v")?;
    (!ty.is_empty() && !version.is_empty() && version.bytes().all(|b| b.is_ascii_digit()))
        .then_some((ty, version))
}

/// What a guest's `context.emit(event_type, data)` publishes: `(type, extra payload fields)` to
/// pass to [`crate::events::event`] (which adds executionId, workflow and status).
///
/// A catalogued workflow event keeps its type with `{data}`. Anything else — an unknown type, or
/// an engine event type a guest must not forge — becomes `WorkflowEventEmitted` with
/// `{name, data}`, so subscribers only ever see catalogued types.
pub fn normalize_custom(event_type: &str, data: Value) -> (String, Value) {
    if WORKFLOW_EVENTS.contains(&event_type) {
        (event_type.to_owned(), json!({"data": data}))
    } else {
        (
            GENERIC_WORKFLOW_EVENT.to_owned(),
            json!({"name": event_type, "data": data}),
        )
    }
}

/// Every event type the host can publish (engine, workflow, generic).
pub fn published_types() -> Vec<&'static str> {
    ENGINE_EVENTS
        .iter()
        .chain(WORKFLOW_EVENTS.iter())
        .copied()
        .chain([GENERIC_WORKFLOW_EVENT])
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_published_type_has_exactly_one_v1_entry() {
        let all = catalog();
        for ty in published_types() {
            let n = all.iter().filter(|e| e.event_type == ty).count();
            assert_eq!(n, 1, "{ty} has {n} entries");
            assert!(find(ty, "1").is_some(), "{ty}.v1 is not catalogued");
        }
        assert_eq!(
            all.len(),
            published_types().len(),
            "no entry for an unpublished type"
        );
        for ty in ENGINE_EVENTS {
            let schema = schema_for(ty, "1").unwrap();
            assert_eq!(schema["additionalProperties"], json!(false), "{ty}");
            for f in ["executionId", "workflow", "status"] {
                assert!(
                    schema["required"].as_array().unwrap().contains(&json!(f)),
                    "{ty} requires {f}"
                );
            }
        }
        assert!(find("ExecutionQueued", "2").is_none());
        assert!(find("Nope", "1").is_none());
    }

    #[test]
    fn names_and_lifecycles() {
        let e = find("StageFailed", "1").unwrap();
        assert_eq!(e.name(), "StageFailed.v1");
        assert_eq!(parse_name("StageFailed.v1"), Some(("StageFailed", "1")));
        assert_eq!(parse_name("StageFailed"), None);
        assert_eq!(parse_name("StageFailed.vx"), None);
        let lc = e.lifecycle.to_json(|ms| ms.to_string());
        assert_eq!(
            lc,
            json!({"state": "active", "introducedAt": V1_INTRODUCED_MS.to_string()})
        );
        let item = e.to_json(&e.lifecycle, |ms| ms.to_string());
        assert_eq!(item["eventVersion"], "1");
        assert_eq!(item["name"], "StageFailed.v1");
    }

    #[test]
    fn uncatalogued_or_forged_guest_events_become_workflow_event_emitted() {
        let (ty, extra) = normalize_custom("SubdomainPlanApproved", json!({"planHash": "x"}));
        assert_eq!(ty, "SubdomainPlanApproved");
        assert_eq!(extra, json!({"data": {"planHash": "x"}}));
        let (ty, extra) = normalize_custom("Whatever", json!([1]));
        assert_eq!(ty, GENERIC_WORKFLOW_EVENT);
        assert_eq!(extra, json!({"name": "Whatever", "data": [1]}));
        let (ty, _) = normalize_custom("ExecutionSucceeded", Value::Null);
        assert_eq!(
            ty, GENERIC_WORKFLOW_EVENT,
            "a guest cannot forge an engine event"
        );
    }
}
