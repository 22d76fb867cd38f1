//! Records decoded by column position, from any kind of row: sqlx's `AnyRow`, SQLite's own
//! `rusqlite::Row` on its point readers (`reader.rs`), or a PostgreSQL row as its point readers
//! read it off the wire (`pg_reader.rs`).
//!
//! One decoder per record serves them all, so a hot read can decode straight from the
//! statement's answer — no `AnyRow` built, no text copied that the record does not keep —
//! while every other path keeps sqlx's rows. A decoder reads the columns of its `*_COLUMNS`
//! list from a given position, so a join can carry two records side by side.

use capstan_core::store::{ExecutionRecord, JsonText, OutboxRecord, StageRecord, StoreError};
use serde_json::Value;
use sqlx::Row as _;
use sqlx::any::AnyRow;

/// A row's values by position.
pub(crate) trait Columns {
    fn text(&self, at: usize) -> Result<Option<&str>, StoreError>;
    fn int(&self, at: usize) -> Result<Option<i64>, StoreError>;
}

pub(crate) fn corrupt(at: usize, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("column {at}: {e}"))
}

impl Columns for AnyRow {
    fn text(&self, at: usize) -> Result<Option<&str>, StoreError> {
        self.try_get(at).map_err(|e| corrupt(at, e))
    }

    fn int(&self, at: usize) -> Result<Option<i64>, StoreError> {
        self.try_get(at).map_err(|e| corrupt(at, e))
    }
}

impl Columns for rusqlite::Row<'_> {
    fn text(&self, at: usize) -> Result<Option<&str>, StoreError> {
        let value = self.get_ref(at).map_err(|e| corrupt(at, e))?;
        value.as_str_or_null().map_err(|e| corrupt(at, e))
    }

    fn int(&self, at: usize) -> Result<Option<i64>, StoreError> {
        let value = self.get_ref(at).map_err(|e| corrupt(at, e))?;
        value.as_i64_or_null().map_err(|e| corrupt(at, e))
    }
}

fn text(row: &(impl Columns + ?Sized), at: usize) -> Result<String, StoreError> {
    row.text(at)?
        .map(str::to_owned)
        .ok_or_else(|| corrupt(at, "unexpected NULL"))
}

fn opt_text(row: &(impl Columns + ?Sized), at: usize) -> Result<Option<String>, StoreError> {
    Ok(row.text(at)?.map(str::to_owned))
}

fn int(row: &(impl Columns + ?Sized), at: usize) -> Result<i64, StoreError> {
    row.int(at)?.ok_or_else(|| corrupt(at, "unexpected NULL"))
}

/// JSON text as stored.
pub(crate) fn parse_json(text: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("bad JSON in store: {e}")))
}

/// A stored enum value (`queued`, `runnable`, …) as its Rust enum.
pub(crate) fn parse_enum<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    T::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(text))
        .map_err(|_| StoreError::Corrupt(format!("unknown value `{text}`")))
}

/// JSON text as stored, checked and kept as text.
fn json(row: &(impl Columns + ?Sized), at: usize) -> Result<Option<JsonText>, StoreError> {
    row.text(at)?
        .map(|text| JsonText::from_text(text.to_owned()).map_err(|e| corrupt(at, e)))
        .transpose()
}

fn status<T: serde::de::DeserializeOwned>(
    row: &(impl Columns + ?Sized),
    at: usize,
) -> Result<T, StoreError> {
    parse_enum(row.text(at)?.unwrap_or_default())
}

/// The columns [`execution_at`] reads, in its order.
pub(crate) const EXECUTION_COLUMNS: [&str; 14] = [
    "id",
    "workflow",
    "principal_id",
    "status",
    "status_reason",
    "current_stage",
    "created_ms",
    "finished_ms",
    "cancellation_requested_ms",
    "input_json",
    "output_json",
    "outcome_json",
    "run_id",
    "traceparent",
];

/// An execution from [`EXECUTION_COLUMNS`] at `at`, `at + 1`, ….
pub(crate) fn execution_at(
    row: &(impl Columns + ?Sized),
    at: usize,
) -> Result<ExecutionRecord, StoreError> {
    Ok(ExecutionRecord {
        id: text(row, at)?,
        workflow: text(row, at + 1)?,
        principal_id: text(row, at + 2)?,
        status: status(row, at + 3)?,
        status_reason: opt_text(row, at + 4)?,
        current_stage: opt_text(row, at + 5)?,
        created_ms: int(row, at + 6)?,
        finished_ms: row.int(at + 7)?,
        cancellation_requested_ms: row.int(at + 8)?,
        input_json: json(row, at + 9)?.unwrap_or_else(|| JsonText::new(&Value::Null)),
        output_json: json(row, at + 10)?,
        outcome_json: json(row, at + 11)?,
        run_id: text(row, at + 12)?,
        traceparent: opt_text(row, at + 13)?,
    })
}

/// The columns [`stage_at`] reads, in its order.
pub(crate) const STAGE_COLUMNS: [&str; 9] = [
    "id",
    "execution_id",
    "position",
    "stage_name",
    "status",
    "started_ms",
    "finished_ms",
    "output_json",
    "error_json",
];

/// A stage from [`STAGE_COLUMNS`] at `at`, `at + 1`, ….
pub(crate) fn stage_at(
    row: &(impl Columns + ?Sized),
    at: usize,
) -> Result<StageRecord, StoreError> {
    Ok(StageRecord {
        id: text(row, at)?,
        execution_id: text(row, at + 1)?,
        position: int(row, at + 2)?,
        stage_name: text(row, at + 3)?,
        status: status(row, at + 4)?,
        started_ms: int(row, at + 5)?,
        finished_ms: row.int(at + 6)?,
        output_json: json(row, at + 7)?,
        error_json: json(row, at + 8)?,
    })
}

/// The columns [`outbox_at`] reads, in its order.
pub(crate) const OUTBOX_COLUMNS: [&str; 13] = [
    "seq",
    "event_id",
    "execution_id",
    "event_type",
    "event_version",
    "principal_id",
    "workflow",
    "payload_json",
    "occurred_ms",
    "traceparent",
    "routed_ms",
    "stream_published_ms",
    "dispatched_ms",
];

/// An outbox event from [`OUTBOX_COLUMNS`] at `at`, `at + 1`, …. Its payload is checked as JSON
/// and kept as text: streams and webhooks send it on as it is.
pub(crate) fn outbox_at(
    row: &(impl Columns + ?Sized),
    at: usize,
) -> Result<OutboxRecord, StoreError> {
    Ok(OutboxRecord {
        seq: int(row, at)?,
        event_id: text(row, at + 1)?,
        execution_id: text(row, at + 2)?,
        event_type: text(row, at + 3)?,
        event_version: text(row, at + 4)?,
        principal_id: text(row, at + 5)?,
        workflow: text(row, at + 6)?,
        payload_json: JsonText::from_text(text(row, at + 7)?).map_err(|e| corrupt(at + 7, e))?,
        occurred_ms: int(row, at + 8)?,
        traceparent: opt_text(row, at + 9)?,
        routed_ms: row.int(at + 10)?,
        stream_published_ms: row.int(at + 11)?,
        dispatched_ms: row.int(at + 12)?,
    })
}

/// `alias.column, …` for a column list.
pub(crate) fn select_list(alias: &str, columns: &[&str]) -> String {
    columns
        .iter()
        .map(|c| format!("{alias}.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}
