//! The documented JSON shapes, built from engine records. No extra properties.

use capstan_core::store::{ExecutionRecord, OutboxRecord, StageRecord};
use serde_json::{Map, Value, json};

/// RFC 3339 in UTC with milliseconds: `2026-01-01T00:00:00.000Z`.
pub fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn opt_time(ms: Option<i64>) -> Value {
    ms.map_or(Value::Null, |m| Value::String(rfc3339(m)))
}

/// ExecutionSummary.
pub fn summary(e: &ExecutionRecord) -> Value {
    json!({
        "executionId": e.id,
        "workflow": e.workflow,
        "principalId": e.principal_id,
        "status": e.status.as_str(),
        "currentStage": e.current_stage,
        "createdAt": rfc3339(e.created_ms),
        "finishedAt": opt_time(e.finished_ms),
        "cancellationRequestedAt": opt_time(e.cancellation_requested_ms),
    })
}

pub fn stage(s: &StageRecord) -> Value {
    let mut v = Map::new();
    v.insert("id".into(), json!(s.id));
    v.insert("executionId".into(), json!(s.execution_id));
    v.insert("stageName".into(), json!(s.stage_name));
    v.insert("startedAt".into(), json!(rfc3339(s.started_ms)));
    v.insert("status".into(), json!(s.status.as_str()));
    v.insert("finishedAt".into(), opt_time(s.finished_ms));
    if let Some(o) = &s.output_json {
        v.insert("outputJson".into(), o.clone());
    }
    if let Some(e) = &s.error_json {
        v.insert("errorJson".into(), e.clone());
    }
    Value::Object(v)
}

/// Execution, with stages in order and the outcome when there is one.
pub fn execution(e: &ExecutionRecord, stages: &[StageRecord]) -> Value {
    let mut v = summary(e);
    if let Some(map) = v.as_object_mut() {
        map.insert("inputJson".into(), e.input_json.clone());
        map.insert(
            "stages".into(),
            Value::Array(stages.iter().map(stage).collect()),
        );
        if let Some(outcome) = &e.outcome_json {
            map.insert("outcome".into(), outcome.clone());
        }
    }
    v
}

/// OutboxEvent.
pub fn event(e: &OutboxRecord) -> Value {
    json!({
        "eventId": e.event_id,
        "eventType": e.event_type,
        "eventVersion": e.event_version,
        "executionId": e.execution_id,
        "occurredAt": rfc3339(e.occurred_ms),
        "principalId": e.principal_id,
        "payloadJson": e.payload_json,
        "dispatchedAt": opt_time(e.dispatched_ms),
        "routedAt": opt_time(e.routed_ms),
        "streamPublishedAt": opt_time(e.stream_published_ms),
        "traceparent": e.traceparent,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_rfc3339_with_milliseconds() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            super::rfc3339(1_767_225_600_123),
            "2026-01-01T00:00:00.123Z"
        );
        assert_eq!(super::rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
