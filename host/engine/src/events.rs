//! Outbox events the engine emits, each committed in the transaction of the change that causes it.

use capstan_core::store::{ExecutionRecord, Millis, OutboxRecord, Write};
use serde_json::{Value, json};

/// Every event type the engine emits, with its version (`<EventType>.v1`).
pub const ENGINE_EVENTS: [&str; 15] = [
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
    "RollbackFailed",
    "CommandQueued",
];

/// Marks the events among `writes` as published to streams at `now`, the time of the commit
/// that writes them: SSE streams read the outbox, so an event reaches them when it commits. An
/// activation buffers its events and commits them later (`host.rs`), so they are stamped then;
/// an event without a stamp is written with its `occurredAt` (it commits in the same step).
pub fn stamp_published(writes: &mut [Write], now: Millis) {
    for write in writes {
        if let Write::Event(e) = write {
            e.stream_published_ms.get_or_insert(now);
        }
    }
}

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
        payload_json: capstan_core::store::JsonText::new(&payload),
        occurred_ms: now,
        traceparent: execution.traceparent.clone(),
        routed_ms: None,
        stream_published_ms: None,
        dispatched_ms: None,
    }
}

/// The event of a row the engine follows by itself ([`capstan_core::transitions`]): its one
/// event type, stamped with the status the row moves `execution` to.
pub fn moved(
    execution: &ExecutionRecord,
    row: &capstan_core::transitions::Row,
    extra: Value,
    now: Millis,
) -> Option<Write> {
    let ty = row.events.first()?;
    let status = row.to.unwrap_or(execution.status);
    Some(Write::Event(event(
        execution,
        ty,
        status.as_str(),
        extra,
        now,
    )))
}
