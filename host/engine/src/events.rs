//! Outbox events the engine emits, each committed in the transaction of the change that causes it.

use capstan_core::store::{ExecutionRecord, Millis, OutboxRecord};
use serde_json::{Value, json};

/// Every event type the engine emits, with its version (`<EventType>.v1`).
pub const ENGINE_EVENTS: [&str; 14] = [
    "ExecutionQueued",
    "ExecutionStarted",
    "StageStarted",
    "StageSucceeded",
    "StageFailed",
    "ExecutionWaiting",
    "ExecutionPaused",
    "ExecutionCancellationRequested",
    "ExecutionCanceled",
    "ExecutionSucceeded",
    "ExecutionFailed",
    "RollbackStarted",
    "ExecutionRolledBack",
    "CommandQueued",
];

/// An outbox row for `execution`: the payload always carries the execution id, workflow and
/// status after the change, plus `extra`'s fields.
pub fn event(
    execution: &ExecutionRecord,
    event_type: &str,
    status: &str,
    extra: Value,
    now: Millis,
) -> OutboxRecord {
    let mut payload = json!({
        "executionId": execution.id,
        "workflow": execution.workflow,
        "status": status,
    });
    if let (Some(map), Value::Object(more)) = (payload.as_object_mut(), extra) {
        map.extend(more);
    }
    OutboxRecord {
        seq: 0,
        event_id: capstan_core::ids::new_id(),
        execution_id: execution.id.clone(),
        event_type: event_type.to_owned(),
        event_version: "1".to_owned(),
        principal_id: execution.principal_id.clone(),
        workflow: execution.workflow.clone(),
        payload_json: payload,
        occurred_ms: now,
        traceparent: execution.traceparent.clone(),
        routed_ms: None,
        stream_published_ms: None,
        dispatched_ms: None,
    }
}
