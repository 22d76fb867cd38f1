//! [`EngineStore`] on both backends: the statements each [`Write`] becomes, gathered per
//! transaction in a [`Batch`], and the engine's reads.
//!
//! A batch joins the node's next group commit (SQLite: `writer.rs`; PostgreSQL: `pg_writer.rs`)
//! rather than committing alone, so under load one transaction carries many activations'
//! writes, and a provider may queue writes behind an answer it already gave
//! ([`Store::write_behind`]). On SQLite a caller that decided outside a transaction commits
//! guarded statements ([`Store::commit_guarded`]). On PostgreSQL run claims skip rows other
//! nodes hold (`FOR UPDATE SKIP LOCKED`), and outbox events are inserted under a lock so that
//! their sequence follows commit order. `journal` stores a run's journal one row per
//! commit.

use crate::rows::parse_enum;
use crate::sql::Check;
use crate::wakes::{Announcement, Touched};
use crate::{Backend, Sql, Store, rows};
use async_trait::async_trait;
use capstan_core::store::*;
use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::{Any, Column as _, Row, Transaction};
use std::sync::LazyLock;

mod journal;

pub(crate) fn unavailable(e: sqlx::Error) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn json_text(v: &Value) -> String {
    v.to_string()
}

/// A column of JSON kept as text (checked as JSON, no tree built): a receipt's request or
/// answer, an event's payload.
fn text_json(row: &AnyRow, column: &str) -> Result<JsonText, StoreError> {
    JsonText::from_text(row.get(column))
        .map_err(|e| StoreError::Corrupt(format!("bad JSON in {column}: {e}")))
}

fn parse_json(text: Option<String>) -> Result<Option<Value>, StoreError> {
    text.as_deref().map(rows::parse_json).transpose()
}

fn enum_text<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

fn execution_row(row: &AnyRow) -> Result<ExecutionRecord, StoreError> {
    rows::execution_at(row, 0)
}

fn stage_row(row: &AnyRow) -> Result<StageRecord, StoreError> {
    rows::stage_at(row, 0)
}

/// `SELECT <execution columns> FROM executions`.
static SELECT_EXECUTIONS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {} FROM executions",
        rows::EXECUTION_COLUMNS.join(", ")
    )
});

/// One execution by id.
static SELECT_EXECUTION: LazyLock<String> =
    LazyLock::new(|| format!("{} WHERE id = $1", *SELECT_EXECUTIONS));

/// `SELECT <stage columns> FROM stages WHERE execution_id = $1 ORDER BY position`.
static SELECT_STAGES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {} FROM stages WHERE execution_id = $1 ORDER BY position",
        rows::STAGE_COLUMNS.join(", ")
    )
});

/// An execution and its stages as one statement on SQLite: the execution's columns, then a
/// stage's (all NULL when it has none), one row per stage in order. The point reader decodes the
/// execution's columns of the first row only.
static EXECUTION_JOINED_WITH_STAGES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {}, {} FROM executions e LEFT JOIN stages s ON s.execution_id = e.id
         WHERE e.id = $1 ORDER BY s.position",
        rows::select_list("e", &rows::EXECUTION_COLUMNS),
        rows::select_list("s", &rows::STAGE_COLUMNS),
    )
});

/// An execution and its stages as one statement on PostgreSQL: the execution's row first, its
/// stage columns NULL, then a row per stage in order, its execution columns NULL. The join
/// would repeat the execution's columns (its input and output among them) on every stage's row,
/// which PostgreSQL encodes and sends once per stage: 18 % more server CPU per read of a
/// ten-stage execution when it was measured, with each row then copied into sqlx's `AnyRow`
/// (docs/decisions.md, "An execution and its stages are one statement, decoded where they are
/// read").
static EXECUTION_WITH_STAGES: LazyLock<String> = LazyLock::new(|| {
    let nulls = |n: usize| vec!["NULL"; n].join(", ");
    format!(
        "SELECT {}, {} FROM executions e WHERE e.id = $1
         UNION ALL
         SELECT {}, {} FROM stages s WHERE s.execution_id = $1
         ORDER BY {} NULLS FIRST",
        rows::select_list("e", &rows::EXECUTION_COLUMNS),
        nulls(rows::STAGE_COLUMNS.len()),
        nulls(rows::EXECUTION_COLUMNS.len()),
        rows::select_list("s", &rows::STAGE_COLUMNS),
        // The stage's position, by its place in the result (NULL on the execution's row).
        rows::EXECUTION_COLUMNS.len()
            + 1
            + rows::STAGE_COLUMNS
                .iter()
                .position(|c| *c == "position")
                .unwrap_or_default(),
    )
});

/// One execution's outbox events, in order.
static OUTBOX_OF_EXECUTION: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{} WHERE o.execution_id = $1 ORDER BY o.seq",
        SELECT_OUTBOX.as_str()
    )
});

/// Decodes the rows of [`EXECUTION_JOINED_WITH_STAGES`] or [`EXECUTION_WITH_STAGES`].
#[derive(Default)]
struct ExecutionWithStages {
    execution: Option<ExecutionRecord>,
    stages: Vec<StageRecord>,
}

impl ExecutionWithStages {
    fn push(&mut self, row: &(impl rows::Columns + ?Sized)) -> Result<(), StoreError> {
        if self.execution.is_none() && row.text(0)?.is_some() {
            self.execution = Some(rows::execution_at(row, 0)?);
        }
        let at = rows::EXECUTION_COLUMNS.len();
        // NULL stage columns: the execution's own row, or the join's row for no stage.
        if row.text(at)?.is_some() {
            self.stages.push(rows::stage_at(row, at)?);
        }
        Ok(())
    }

    fn done(self) -> Option<(ExecutionRecord, Vec<StageRecord>)> {
        self.execution.map(|e| (e, self.stages))
    }
}

fn run_row(row: &AnyRow) -> Result<RunRecord, StoreError> {
    Ok(RunRecord {
        id: row.get("id"),
        execution_id: row.get("execution_id"),
        workflow: row.get("workflow"),
        digest: row.get("digest"),
        kind: parse_enum(row.get::<&str, _>("kind"))?,
        state: parse_enum(row.get::<&str, _>("state"))?,
        wake_ms: row.get("wake_ms"),
        lease_owner: row.get("lease_owner"),
        lease_expires_ms: row.get("lease_expires_ms"),
        activations: row.get("activations"),
        cancel_requested: row.get::<i64, _>("cancel_requested") != 0,
        created_ms: row.get("created_ms"),
        epoch: row.get("epoch"),
    })
}

/// A row of [`journal::SELECT_CHUNKS`].
fn chunk_row(row: &AnyRow) -> (Option<i64>, String) {
    (row.get("truncate_from"), row.get("entries"))
}

fn wait_row(row: &AnyRow) -> Result<WaitRecord, StoreError> {
    Ok(WaitRecord {
        run_id: row.get("run_id"),
        seq: row.get("seq"),
        kind: parse_enum(row.get::<&str, _>("kind"))?,
        name: row.get("name"),
        digest: row.get("digest"),
        payload_json: parse_json(row.get("payload_json"))?,
        wake_ms: row.get("wake_ms"),
        deadline_ms: row.get("deadline_ms"),
        attempts: row.get("attempts"),
        resolved_json: parse_json(row.get("resolved_json"))?,
    })
}

/// `SELECT` of every outbox column [`outbox_row`] reads, from `outbox AS o`; a statement goes on
/// with its `WHERE`.
pub(crate) static SELECT_OUTBOX: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {} FROM outbox AS o",
        rows::select_list("o", &rows::OUTBOX_COLUMNS)
    )
});

/// A row of [`SELECT_OUTBOX`].
pub(crate) fn outbox_row(row: &AnyRow) -> Result<OutboxRecord, StoreError> {
    rows::outbox_at(row, 0)
}

/// The statements of one write transaction, sent in as few round trips as the backend allows.
///
/// sqlx runs each SQLite statement by handing it to the connection's own thread and waiting for
/// the answer; that hand-off (two thread wake-ups, ~0.1 ms on a small VM) cost more than the
/// statements themselves, and a write transaction has about ten. So on SQLite the statements of
/// a transaction are joined into one `;`-separated text with one argument list (`$N` numbered
/// across them, [`Sql::build`]) and run in one call; a batch that joins a group commit is handed
/// to the group writer as its statements instead (`writer.rs`). PostgreSQL's extended protocol
/// prepares one statement at a time, so there each statement is kept apart and sent at
/// [`Batch::done`]. A guard (a run's fence, a compare-and-set, a status precondition: see
/// [`Check`]) is sent on its own after what came before it, and its verdict decides whether the
/// transaction goes on; in a group commit the writer checks it in place.
pub(crate) struct Batch {
    backend: Backend,
    /// Statements not sent yet, in segments sent one call each: on SQLite the statements
    /// between guards are joined into one text, on PostgreSQL every statement is its own. A
    /// guard is always a segment of its own, so what it returns can be checked.
    pending: Vec<Sql>,
}

/// SQLite allows 32,766 host parameters per statement text; flush well before.
const BATCH_BINDS: usize = 16_000;

impl Batch {
    pub(crate) fn new(backend: Backend) -> Self {
        Self {
            backend,
            pending: Vec::new(),
        }
    }

    /// Renews the run's lease, or fails the batch with `LeaseLost` (another owner) or
    /// `Canceled` (an immediate cancel was requested). When the batch gives the lease up
    /// ([`Fenced::release`]), the same statement does that instead of renewing it.
    fn fence(&mut self, fenced: &Fenced<'_>) {
        let fence = fenced.fence;
        let Some(release) = &fenced.release else {
            self.guard(
                "UPDATE runs SET lease_expires_ms = $1 WHERE id = $2 AND lease_owner = $3 RETURNING cancel_requested",
                Check::Fence,
            )
            .bind(fence.lease_until_ms)
            .bind(fence.run_id.clone())
            .bind(fence.owner.clone());
            return;
        };
        // Every field named, so a field added to `RunPatch` is a decision here, not dropped.
        let RunPatch {
            id: _,
            state,
            wake_ms,
            release_lease: _,
            cancel_requested: _,
        } = release;
        // SQLite: `OR FAIL`. As `ABORT` (the default), an `UPDATE … RETURNING` that moves its
        // row in an index (`runs_runnable`) opens a statement journal, which copies every page
        // the statement changes that its transaction had changed before, and frees the copies
        // when it ends. `FAIL` keeps what a failing statement changed before it failed; the group
        // writer rolls the whole transaction back on any failure anyway (`writer::commit`).
        let update = match self.backend {
            Backend::Sqlite => "UPDATE OR FAIL runs SET ",
            Backend::Postgres => "UPDATE runs SET ",
        };
        let sql = self.guard(update, Check::Fence);
        if let Some(state) = state {
            sql.push("state = ").push_bind(enum_text(state)).push(", ");
        }
        if let Some(wake) = wake_ms {
            sql.push("wake_ms = ").push_bind(*wake).push(", ");
        }
        sql.push("lease_owner = NULL, lease_expires_ms = NULL WHERE id = ")
            .push_bind(fence.run_id.clone())
            .push(" AND lease_owner = ")
            .push_bind(fence.owner.clone())
            .push(" RETURNING cancel_requested");
    }

    /// The segment the next ordinary statement joins (SQLite: the last one unless it ends in a
    /// guard; PostgreSQL: a new one each, as its extended protocol takes one statement at a time).
    fn open_segment(&mut self) -> &mut Sql {
        let joins = self.backend == Backend::Sqlite
            && self
                .pending
                .last()
                .is_some_and(|s| s.last_check().is_none());
        if !joins {
            self.pending.push(Sql::default());
        }
        let last = self.pending.len() - 1;
        &mut self.pending[last]
    }

    /// Starts the next statement (with its own `$1…$k`); bind its values on the result.
    pub(crate) fn statement(
        &mut self,
        text: impl Into<std::borrow::Cow<'static, str>>,
    ) -> &mut Sql {
        self.open_segment().push_statement(text)
    }

    /// Appends a statement built apart (with its own `$1…$k`).
    fn push_sql(&mut self, sql: Sql) {
        self.open_segment().extend(sql);
    }

    /// Starts a guard: a statement that returns one row when the batch may go on (see
    /// [`Check`]); the statements before it take effect first.
    pub(crate) fn guard(
        &mut self,
        text: impl Into<std::borrow::Cow<'static, str>>,
        check: Check,
    ) -> &mut Sql {
        self.pending.push(Sql::default());
        let last = self.pending.len() - 1;
        self.pending[last].push_statement(text).check(check)
    }

    fn binds(&self) -> usize {
        self.pending.iter().map(Sql::binds).sum()
    }

    /// Everything pending, for a group commit (the guards stay marked).
    fn into_sql(mut self) -> Sql {
        let mut text = Sql::default();
        for sql in std::mem::take(&mut self.pending) {
            text.extend(sql);
        }
        text
    }

    /// Starts a compare-and-set statement that returns one row when it applied. The batch
    /// fails with [`StoreError::Conflict`] when it returns none.
    pub(crate) fn cas(&mut self, text: impl Into<std::borrow::Cow<'static, str>>) -> &mut Sql {
        self.guard(text, Check::Holds("the value moved"))
    }

    /// Ends a write: PostgreSQL (or a full batch) sends what is pending now. (What follows a
    /// guard is only ever sent after the guard's verdict: segments are sent in order.)
    pub(crate) async fn done(&mut self, tx: &mut Transaction<'_, Any>) -> Result<(), StoreError> {
        if self.backend == Backend::Postgres || self.binds() >= BATCH_BINDS {
            self.flush(tx).await?;
        }
        Ok(())
    }

    /// Sends every statement not sent yet, checking each guard.
    pub(crate) async fn flush(&mut self, tx: &mut Transaction<'_, Any>) -> Result<(), StoreError> {
        for sql in std::mem::take(&mut self.pending) {
            match sql.first_check() {
                // A guard is a segment of its own, and only guards return rows.
                Some(check) => {
                    let rows = sql
                        .build()
                        .fetch_all(&mut **tx)
                        .await
                        .map_err(unavailable)?;
                    let first = rows.first().map(|r| r.try_get::<i64, _>(0).unwrap_or(0));
                    check.verdict(first)?;
                }
                None => {
                    sql.build().execute(&mut **tx).await.map_err(unavailable)?;
                }
            }
        }
        Ok(())
    }
}

/// `UPDATE <table> SET` with only the columns a patch changes. Never `SET id = id` as a
/// placeholder: SQLite takes that for a change of the primary key and checks every foreign key
/// that references it, which for `executions` meant a scan of `runs` per update (BENCHMARKS.md).
struct SetList {
    sql: Sql,
    columns: usize,
}

impl SetList {
    fn new(update: &'static str) -> Self {
        Self {
            sql: Sql::new(update),
            columns: 0,
        }
    }

    /// Starts the next `column = …` (its text and binds follow on the returned statement).
    fn column(&mut self, text: &str) -> &mut Sql {
        if self.columns > 0 {
            self.sql.push(", ");
        }
        self.columns += 1;
        self.sql.push(text)
    }

    /// `WHERE id = <id>`, appended to the batch; a patch that changes nothing writes nothing.
    fn finish(mut self, batch: &mut Batch, id: String) {
        if self.columns > 0 {
            self.sql.push(" WHERE id = ").push_bind(id);
            batch.push_sql(self.sql);
        }
    }
}

/// Appends one write (a status precondition of [`Write::UpdateExecution`] becomes a guard
/// statement before its update).
fn push_write(batch: &mut Batch, write: Write) {
    match write {
        Write::InsertExecution(e) => {
            batch
                .statement(
                    "INSERT INTO executions (id, workflow, principal_id, status, status_reason, current_stage, created_ms,
                     finished_ms, cancellation_requested_ms, input_json, output_json, outcome_json, run_id, traceparent)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
                )
                .bind(e.id)
                .bind(e.workflow)
                .bind(e.principal_id)
                .bind(e.status.as_str())
                .bind(e.status_reason)
                .bind(e.current_stage)
                .bind(e.created_ms)
                .bind(e.finished_ms)
                .bind(e.cancellation_requested_ms)
                .bind(e.input_json.into_string())
                .bind(e.output_json.map(JsonText::into_string))
                .bind(e.outcome_json.map(JsonText::into_string))
                .bind(e.run_id)
                .bind(e.traceparent);
        }
        Write::UpdateExecution(p) => {
            if let Some(expect) = &p.expect {
                // PostgreSQL: the row stays locked from the check to the commit.
                let lock = if batch.backend == Backend::Postgres {
                    " FOR UPDATE"
                } else {
                    ""
                };
                let statuses: Vec<&'static str> = expect.iter().map(|s| s.as_str()).collect();
                batch
                    .guard(
                        "SELECT 1 FROM executions WHERE id = $1 AND status IN (",
                        Check::Holds("the execution's status changed meanwhile"),
                    )
                    .bind(p.id.clone())
                    .push_binds(statuses)
                    .push(")")
                    .push(lock);
            }
            if let Some(stage) = &p.expect_stage_not_begun {
                batch
                    .guard(
                        "SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM stages WHERE execution_id = $1 AND stage_name = $2)",
                        Check::Holds("the stage began meanwhile"),
                    )
                    .bind(p.id.clone())
                    .bind(stage.clone());
            }
            let mut set = SetList::new("UPDATE executions SET ");
            if let Some(s) = p.status {
                set.column("status = ").push_bind(s.as_str());
            }
            if let Some(r) = p.status_reason {
                set.column("status_reason = ").push_bind(r);
            }
            if let Some(c) = p.current_stage {
                set.column("current_stage = ").push_bind(c);
            }
            if let Some(f) = p.finished_ms {
                set.column("finished_ms = ").push_bind(f);
            }
            match p.cancellation_requested_ms {
                Some(Some(c)) => {
                    set.column("cancellation_requested_ms = COALESCE(cancellation_requested_ms, ")
                        .push_bind(c)
                        .push(")");
                }
                Some(None) => {
                    set.column("cancellation_requested_ms = NULL");
                }
                None => {}
            }
            if let Some(o) = p.output_json {
                set.column("output_json = ").push_bind(o.into_string());
            }
            if let Some(o) = p.outcome_json {
                set.column("outcome_json = ").push_bind(o.into_string());
            }
            if let Some(r) = p.run_id {
                set.column("run_id = ").push_bind(r);
            }
            set.finish(batch, p.id);
        }
        Write::PutStage(s) => {
            batch
                .statement(
                    "INSERT INTO stages (id, execution_id, position, stage_name, status, started_ms, finished_ms, output_json, error_json)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                     ON CONFLICT (execution_id, position) DO UPDATE SET status = excluded.status, finished_ms = excluded.finished_ms,
                       output_json = excluded.output_json, error_json = excluded.error_json",
                )
                .bind(s.id)
                .bind(s.execution_id)
                .bind(s.position)
                .bind(s.stage_name)
                .bind(s.status.as_str())
                .bind(s.started_ms)
                .bind(s.finished_ms)
                .bind(s.output_json.map(JsonText::into_string))
                .bind(s.error_json.map(JsonText::into_string));
        }
        Write::RestageAll {
            execution_id,
            from,
            to,
        } => {
            batch
                .statement("UPDATE stages SET status = $1 WHERE execution_id = $2 AND status = $3")
                .bind(to.as_str())
                .bind(execution_id)
                .bind(from.as_str());
        }
        Write::InsertRun(r) => {
            batch
                .statement(
                    "INSERT INTO runs (id, execution_id, workflow, digest, kind, state, wake_ms, lease_owner, lease_expires_ms,
                     activations, cancel_requested, created_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                )
                .bind(r.id)
                .bind(r.execution_id)
                .bind(r.workflow)
                .bind(r.digest)
                .bind(enum_text(&r.kind))
                .bind(enum_text(&r.state))
                .bind(r.wake_ms)
                .bind(r.lease_owner)
                .bind(r.lease_expires_ms)
                .bind(r.activations)
                .bind(i64::from(r.cancel_requested))
                .bind(r.created_ms);
        }
        Write::UpdateRun(p) => {
            let mut set = SetList::new("UPDATE runs SET ");
            if let Some(s) = p.state {
                set.column("state = ").push_bind(enum_text(&s));
            }
            if let Some(w) = p.wake_ms {
                set.column("wake_ms = ").push_bind(w);
            }
            if p.release_lease {
                set.column("lease_owner = NULL, lease_expires_ms = NULL");
            }
            if let Some(c) = p.cancel_requested {
                set.column("cancel_requested = ").push_bind(i64::from(c));
            }
            set.finish(batch, p.id);
        }
        // A batch's entries are gathered per run first ([`journal::stage`]); one alone is a chunk
        // of one.
        Write::PutJournal(j) => journal::push_chunk(batch, &[j]),
        Write::TruncateJournal { run_id, from_seq } => {
            // The calls from `from_seq` on run again as new requests (new effect tokens).
            batch
                .statement("UPDATE runs SET epoch = epoch + 1 WHERE id = $1")
                .bind(run_id.clone());
            journal::push_truncate(batch, run_id.clone(), from_seq);
            batch
                .statement("DELETE FROM waits WHERE run_id = $1 AND seq >= $2")
                .bind(run_id)
                .bind(from_seq);
        }
        Write::InsertReceipt(r) => {
            batch
                .statement(
                    "INSERT INTO receipts (id, execution_id, run_id, seq, op, request, response, created_ms, compensated_ms)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (id) DO NOTHING",
                )
                .bind(r.id.clone())
                .bind(r.execution_id.clone())
                .bind(r.run_id.clone())
                .bind(r.seq)
                .bind(r.op.clone())
                .bind(r.request.as_str().to_owned())
                .bind(r.response.as_str().to_owned())
                .bind(r.created_ms)
                .bind(r.compensated_ms);
        }
        Write::MarkCompensated { receipt_id, at_ms } => {
            batch
                .statement(
                    "UPDATE receipts SET compensated_ms = $1 WHERE id = $2 AND compensated_ms IS NULL",
                )
                .bind(at_ms)
                .bind(receipt_id);
        }
        Write::PutWait(w) => {
            batch
                .statement(
                    "INSERT INTO waits (run_id, seq, kind, name, digest, payload_json, wake_ms, deadline_ms, attempts, resolved_json)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                     ON CONFLICT (run_id, seq) DO UPDATE SET wake_ms = excluded.wake_ms, attempts = excluded.attempts,
                       resolved_json = excluded.resolved_json, digest = excluded.digest, payload_json = excluded.payload_json",
                )
                .bind(w.run_id)
                .bind(w.seq)
                .bind(enum_text(&w.kind))
                .bind(w.name)
                .bind(w.digest)
                .bind(w.payload_json.as_ref().map(json_text))
                .bind(w.wake_ms)
                .bind(w.deadline_ms)
                .bind(w.attempts)
                .bind(w.resolved_json.as_ref().map(json_text));
        }
        Write::PutCommand(c) => {
            batch
                .statement(
                    "INSERT INTO commands (id, execution_id, operation, status, created_ms, finished_ms, error) VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (id) DO UPDATE SET status = excluded.status, finished_ms = excluded.finished_ms, error = excluded.error",
                )
                .bind(c.id)
                .bind(c.execution_id)
                .bind(c.operation)
                .bind(enum_text(&c.status))
                .bind(c.created_ms)
                .bind(c.finished_ms)
                .bind(c.error);
        }
        Write::SettleCommands {
            execution_id,
            from,
            to,
            at_ms,
            error,
        } => {
            batch
                .statement(
                    "UPDATE commands SET status = $1, finished_ms = $2, error = COALESCE($3, error)
                     WHERE execution_id = $4 AND status = $5 AND operation <> 'rollback'",
                )
                .bind(enum_text(&to))
                .bind((!to.is_pending()).then_some(at_ms))
                .bind(error)
                .bind(execution_id)
                .bind(enum_text(&from));
        }
        Write::Event(e) => bind_event(
            batch.statement(
                "INSERT INTO outbox (event_id, execution_id, event_type, event_version, principal_id, workflow, payload_json,
                 occurred_ms, traceparent, stream_published_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            ),
            e,
        ),
        Write::InsertIdempotency(k) => {
            batch
                .statement(
                    "INSERT INTO idempotency (principal_id, workflow, key, body_sha256, execution_id, response_json, created_ms)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(k.principal_id)
                .bind(k.workflow)
                .bind(k.key)
                .bind(k.body_sha256)
                .bind(k.execution_id)
                .bind(k.response_json.as_ref().map(json_text))
                .bind(k.created_ms);
        }
        Write::DropIdempotency {
            principal_id,
            workflow,
            key,
            created_ms,
        } => {
            batch
                .statement(
                    "DELETE FROM idempotency WHERE principal_id = $1 AND workflow = $2 AND key = $3 AND created_ms = $4",
                )
                .bind(principal_id)
                .bind(workflow)
                .bind(key)
                .bind(created_ms);
        }
    }
}

/// PostgreSQL: serialises the transactions that insert outbox events, from their first event to
/// their commit, and announces the events to the other nodes at that commit.
///
/// Readers page through the outbox by `seq` (SSE cursors, the webhook relay). A sequence number
/// is taken at insert but becomes visible at commit, so two concurrent writers could commit
/// `seq` 11 before 10, and a reader that saw 11 would never see 10 (the "BIGSERIAL gap"). Under
/// this lock sequence order is commit order, on any number of nodes, and `seq` stays a plain
/// gap-free cursor. The lock is transaction-scoped (released by COMMIT or ROLLBACK, also when a
/// node dies) and taken once per transaction. SQLite needs neither: one writer.
async fn outbox_lock(tx: &mut Transaction<'_, Any>, payload: String) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock(7310112206040913001)")
        .execute(&mut **tx)
        .await
        .map_err(unavailable)?;
    // Signed with the node's id: its own listener skips it (the commit woke this node's
    // readers already, its executions' waiters among them). Other nodes wake the waiters of
    // the executions it names ([`Announcement`]).
    sqlx::query("SELECT pg_notify('capstan_events', $1)")
        .bind(payload)
        .execute(&mut **tx)
        .await
        .map_err(unavailable)?;
    Ok(())
}

/// A batch joins a group unless it is very large: the group writer runs any number of
/// statements from its prepared cache, so even an activation's last commit (every stage's rows,
/// journal entries, receipts and events since its last commit) rides the group; only bulk batches
/// beyond this take a transaction of their own.
fn groupable(writes: &[Write]) -> bool {
    writes.len() <= 4096
}

/// A batch's fence, and the patch of the fenced run that gives its lease up, when the batch has
/// one: the fence then writes it ([`Batch::fence`]), one statement and one row version instead
/// of a renewal of the lease followed by its release (an activation's last commit).
pub(crate) struct Fenced<'a> {
    fence: &'a Fence,
    release: Option<RunPatch>,
}

impl<'a> Fenced<'a> {
    /// Takes the release out of `writes` when it is the batch's only write of the fenced run
    /// and leaves `cancel_requested` alone (the fence returns that column, and the verdict must
    /// read it as the batch found it). Nothing else a batch writes reads the run's row, so the
    /// patch written at the fence's place, first, leaves the batch's outcome as it was.
    fn take(fence: &'a Fence, writes: &mut Vec<Write>) -> Self {
        let of_run = |write: &Write| match write {
            Write::UpdateRun(p) => p.id == fence.run_id,
            Write::TruncateJournal { run_id, .. } => *run_id == fence.run_id,
            _ => false,
        };
        let mut of_it = writes.iter().enumerate().filter(|(_, w)| of_run(w));
        let only = match (of_it.next(), of_it.next()) {
            (Some((i, Write::UpdateRun(p))), None)
                if p.release_lease && p.cancel_requested.is_none() =>
            {
                Some(i)
            }
            _ => None,
        };
        let release = only.and_then(|i| match writes.remove(i) {
            Write::UpdateRun(p) => Some(p),
            _ => None,
        });
        Self { fence, release }
    }
}

/// Drops the writes of a batch that a later write of the same batch overwrites: a stage put
/// twice (an activation's last commit carries each stage's start and its end) keeps its last
/// record, and unconditional patches of one execution (the current stage, stage after stage)
/// merge into the last of them. Nothing is merged across a write that reads what it changes: a
/// guarded patch (`expect`), a `RestageAll`, or a patch that records a cancel request (whose first
/// value wins).
pub(crate) fn coalesce(writes: Vec<Write>) -> Vec<Write> {
    use std::collections::{HashMap, HashSet};
    if writes.len() < 2 {
        return writes;
    }
    let mut kept: Vec<Option<Write>> = Vec::with_capacity(writes.len());
    let mut later_stages: HashSet<String> = HashSet::new();
    // Execution id → where its latest unconditional patch sits in `kept`.
    let mut later_patches: HashMap<String, usize> = HashMap::new();
    for write in writes.into_iter().rev() {
        match write {
            Write::PutStage(stage) => {
                if later_stages.insert(stage.id.clone()) {
                    kept.push(Some(Write::PutStage(stage)));
                }
            }
            Write::UpdateExecution(patch)
                if patch.expect.is_none()
                    && patch.expect_stage_not_begun.is_none()
                    && patch.cancellation_requested_ms.is_none() =>
            {
                match later_patches.get(&patch.id) {
                    Some(&at) => {
                        if let Some(Write::UpdateExecution(later)) = &mut kept[at] {
                            later.absorb(patch);
                        }
                    }
                    None => {
                        later_patches.insert(patch.id.clone(), kept.len());
                        kept.push(Some(Write::UpdateExecution(patch)));
                    }
                }
            }
            Write::UpdateExecution(patch) => {
                later_patches.remove(&patch.id);
                kept.push(Some(Write::UpdateExecution(patch)));
            }
            write @ Write::RestageAll { .. } => {
                later_stages.clear();
                kept.push(Some(write));
            }
            write => kept.push(Some(write)),
        }
    }
    kept.into_iter().rev().flatten().collect()
}

/// Appends a batch's writes, each run's journal entries as one chunk, and on SQLite its events
/// as multi-row inserts ([`journal::stage`]).
fn push_writes(batch: &mut Batch, writes: Vec<Write>) {
    let rows = batch.backend == Backend::Sqlite;
    for staged in journal::stage(writes, rows) {
        push_staged(batch, staged);
    }
}

fn push_staged(batch: &mut Batch, staged: journal::Staged) {
    match staged {
        journal::Staged::One(write) => push_write(batch, write),
        journal::Staged::Chunk(entries) => journal::push_chunk(batch, &entries),
        journal::Staged::Events(events) => push_rows(batch, &EVENT_ROWS, events, bind_event),
    }
}

/// Binds an outbox event's ten columns, in the order of its insert's column list.
fn bind_event(sql: &mut Sql, e: OutboxRecord) {
    sql.bind(e.event_id)
        .bind(e.execution_id)
        .bind(e.event_type)
        .bind(e.event_version)
        .bind(e.principal_id)
        .bind(e.workflow)
        .bind(e.payload_json.as_str().to_owned())
        .bind(e.occurred_ms)
        .bind(e.traceparent)
        // Streams read the outbox: an event is published to them when it commits.
        .bind(e.stream_published_ms.unwrap_or(e.occurred_ms));
}

/// The row counts of the multi-row inserts [`push_rows`] writes: any number of rows is a sum
/// of them, so an insert has six statement texts, each prepared once by the group writer.
const ROWS_PER_INSERT: [usize; 6] = [32, 16, 8, 4, 2, 1];

/// An insert's texts for each of [`ROWS_PER_INSERT`]'s row counts: `head`, then `columns`
/// placeholders per row, then `tail`.
fn multi_row_texts(head: &str, columns: usize, tail: &str) -> [String; 6] {
    ROWS_PER_INSERT.map(|rows| {
        let mut text = String::from(head);
        for row in 0..rows {
            text.push_str(if row == 0 { "(" } else { ", (" });
            for column in 0..columns {
                if column > 0 {
                    text.push_str(", ");
                }
                let _ = std::fmt::Write::write_fmt(
                    &mut text,
                    format_args!("${}", row * columns + column + 1),
                );
            }
            text.push(')');
        }
        text.push_str(tail);
        text
    })
}

/// The columns of an outbox event as [`bind_event`] binds them. `OR
/// FAIL`: SQLite opens a statement journal for a statement that writes several rows and may
/// abort (`host/bench/stmt_journals.sh`), and `FAIL` does not abort; the group writer rolls the
/// whole transaction back on any failure anyway. (The receipts' multi-row insert would need one
/// whatever it said: its conflict clause, and its foreign key, may abort it.)
static EVENT_ROWS: LazyLock<[String; 6]> = LazyLock::new(|| {
    multi_row_texts(
        "INSERT OR FAIL INTO outbox (event_id, execution_id, event_type, event_version, principal_id, workflow, payload_json, occurred_ms, traceparent, stream_published_ms) VALUES ",
        10,
        "",
    )
});

/// Appends `rows` as inserts of [`ROWS_PER_INSERT`] rows each, largest first, in their order
/// (SQLite inserts a statement's rows in the order its `VALUES` lists them, so the outbox's
/// sequence numbers follow it). One statement per row cost the group writer a statement's
/// start, its cursors on the table and each index, and its end, per row.
fn push_rows<T>(
    batch: &mut Batch,
    texts: &'static [String; 6],
    rows: Vec<T>,
    mut bind: impl FnMut(&mut Sql, T),
) {
    let mut rows = rows.into_iter();
    let mut left = rows.len();
    while left > 0 {
        // The last count is 1, so one always fits.
        let at = ROWS_PER_INSERT
            .iter()
            .position(|&n| n <= left)
            .unwrap_or(ROWS_PER_INSERT.len() - 1);
        let n = ROWS_PER_INSERT[at];
        let sql = batch.statement(texts[at].as_str());
        for row in rows.by_ref().take(n) {
            bind(sql, row);
        }
        left -= n;
    }
}

/// Outbox events last (see [`Store::apply_alone`]).
fn events_last(writes: Vec<Write>) -> (Vec<Write>, bool) {
    let (events, mut writes): (Vec<Write>, Vec<Write>) = writes
        .into_iter()
        .partition(|w| matches!(w, Write::Event(_)));
    let has_events = !events.is_empty();
    writes.extend(events);
    (writes, has_events)
}

impl Store {
    /// One batch in one transaction of its own.
    async fn apply_alone(
        &self,
        fence: Option<&Fenced<'_>>,
        writes: Vec<Write>,
        touched: &Touched,
    ) -> Result<(), StoreError> {
        // Outbox events go last: on PostgreSQL they are inserted under the outbox lock, held
        // from there to the commit (see below), so the lock is held as briefly as possible.
        let (writes, has_events) = events_last(writes);
        let started = std::time::Instant::now();
        let mut tx = self.begin_write().await.map_err(unavailable)?;
        let mut batch = Batch::new(self.backend());
        if let Some(fence) = fence {
            // Checked when the batch is sent (SQLite: together with the writes, which the
            // transaction then rolls back if the fence fails).
            batch.fence(fence);
            batch.done(&mut tx).await?;
        }
        let mut locked = false;
        for staged in journal::stage(writes, self.backend() == Backend::Sqlite) {
            if !locked
                && matches!(staged, journal::Staged::One(Write::Event(_)))
                && self.backend() == Backend::Postgres
            {
                batch.flush(&mut tx).await?;
                let mut announcement = Announcement::default();
                announcement.add(touched);
                outbox_lock(&mut tx, announcement.payload(self.node_id())).await?;
                locked = true;
            }
            push_staged(&mut batch, staged);
            batch.done(&mut tx).await?;
        }
        batch.flush(&mut tx).await?;
        tx.commit().await.map_err(unavailable)?;
        crate::observe_commit(self.backend().label(), 1, started);
        if has_events {
            // The executions' waiters are woken by `apply`, which knows them.
            self.events.send_modify(|n| *n = n.wrapping_add(1));
        }
        Ok(())
    }

    /// Commits `batch` in the next group commit (SQLite) or in a transaction of its own.
    pub(crate) async fn commit_batch(&self, mut batch: Batch) -> Result<(), StoreError> {
        if self.backend() == Backend::Sqlite {
            return self.grouped(batch.into_sql(), false).await.map(drop);
        }
        let mut tx = self.begin_write().await.map_err(unavailable)?;
        batch.flush(&mut tx).await?;
        tx.commit().await.map_err(unavailable)
    }

    /// Group commit (SQLite). The caller queues its statements for the group writer
    /// (`crate::writer`), which commits whatever is queued each time it is free, in one
    /// transaction from prepared statements, and answers every caller (with the first column of
    /// the rows its statements returned, guards aside). While one group commits, the next one
    /// gathers, so under load one transaction carries many callers' statements, and with one
    /// caller nothing waits for anyone. The caller that finds no session open opens one: a task
    /// that holds sqlx's writer connection (the process's SQLite write lock) while the thread
    /// commits.
    pub(crate) async fn grouped(
        &self,
        sql: Sql,
        events: bool,
    ) -> Result<Vec<Returned>, StoreError> {
        self.grouped_part(
            crate::writer::Part::Statements(sql.into_statements()),
            events,
        )
        .await
    }

    /// [`Store::grouped`] for any kind of part.
    async fn grouped_part(
        &self,
        part: crate::writer::Part,
        events: bool,
    ) -> Result<Vec<Returned>, StoreError> {
        self.grouped_requiring(part, events, None).await
    }

    /// [`Store::grouped_part`], refused unrun unless the epoch of writes behind answers is still
    /// `requires` ([`Store::write_behind`]).
    pub(crate) async fn grouped_requiring(
        &self,
        part: crate::writer::Part,
        events: bool,
        requires: Option<u64>,
    ) -> Result<Vec<Returned>, StoreError> {
        let answer = self
            .queue_part(part, events, requires, crate::writer::Waits::Hurried)
            .await?;
        answer
            .await
            .map_or_else(|_| Err(interrupted()), crate::writer::Answered::into_answer)
    }

    /// [`Store::grouped`] for statements nobody hurries: a patient part
    /// ([`crate::writer::Job::patient`]), which rides the next group someone waits for.
    pub(crate) async fn grouped_patiently(&self, sql: Sql) -> Result<Vec<Returned>, StoreError> {
        let part = crate::writer::Part::Statements(sql.into_statements());
        let answer = self
            .queue_part(part, false, None, crate::writer::Waits::Patient)
            .await?;
        answer
            .await
            .map_or_else(|_| Err(interrupted()), crate::writer::Answered::into_answer)
    }

    /// Queues `part`, which someone waits for, for the group writer; where its answer comes.
    pub(crate) async fn queue_part(
        &self,
        part: crate::writer::Part,
        events: bool,
        requires: Option<u64>,
        waits: crate::writer::Waits,
    ) -> Result<tokio::sync::oneshot::Receiver<crate::writer::Answered>, StoreError> {
        use crate::writer::Waits;
        let (done, answer) = tokio::sync::oneshot::channel();
        // Waits while the queue is full: back-pressure on a writer that cannot keep up.
        let room = self.group_writer()?.room(&part).await?;
        self.enqueue(crate::writer::Job {
            part,
            events,
            requires,
            ahead: waits == Waits::Ahead,
            done: Some(done),
            patient: waits == Waits::Patient,
            queued_at: std::time::Instant::now(),
            room,
        })?;
        Ok(answer)
    }

    /// Queues a job for the group writer, opening a session when none is open.
    fn enqueue(&self, job: crate::writer::Job) -> Result<(), StoreError> {
        let writer = self.group_writer()?;
        if writer.enqueue(job) {
            // In a task of its own, so a caller that goes away cannot end the session for the
            // others.
            let store = self.clone();
            tokio::spawn(async move { store.group_session().await });
        }
        Ok(())
    }

    /// Queues `sql` for the next group commit and returns at once: a write made behind an
    /// answer the caller gives before it is durable (SQLite, and PostgreSQL with its group
    /// writer; [`Store::behind_epoch`] is `None` where there is none). The caller decided it in memory
    /// under the epoch `epoch` ([`Store::behind_epoch`]); it is refused unrun if the epoch
    /// has moved by the time it runs, and if it fails, the epoch moves. Whoever records the
    /// answer commits after it (the group writer's queue is first in, first out) under its run's
    /// [`Fence`], checked against the epoch its activation began under
    /// ([`RunStore::activation_began`]), so that commit is durable only if this write is, and is
    /// refused if this write failed. Answers the write's number in the queue
    /// ([`Store::behind_answered`] says when it has been answered).
    ///
    /// On PostgreSQL other nodes write too, so what the caller decided from may have changed
    /// meanwhile: its guards (`Sql::guard`) say what must still hold, under the locks it takes
    /// first, and a guard that fails fails the write like any other error.
    pub fn write_behind(&self, sql: Sql, epoch: u64) -> Result<u64, StoreError> {
        if self.backend() == Backend::Postgres {
            let Some(group) = self.pg_writer() else {
                return Err(StoreError::Unavailable(
                    "writes behind answers need the PostgreSQL group writer".to_owned(),
                ));
            };
            let number = self.inner.behind.queue();
            if let Err(e) = group.behind(sql.into_statements(), epoch) {
                self.inner.behind.give_up();
                return Err(e);
            }
            return Ok(number);
        }
        let part = crate::writer::Part::Statements(sql.into_statements());
        // The caller answers before the write is durable, so it cannot wait for room: with the
        // queue full it takes its ordinary path, which does.
        let Some(room) = self.group_writer()?.try_room(&part) else {
            return Err(StoreError::Unavailable(
                "the SQLite writer's queue is full".to_owned(),
            ));
        };
        let number = self.inner.behind.queue();
        let job = crate::writer::Job {
            part,
            events: false,
            requires: Some(epoch),
            ahead: false,
            done: None,
            patient: true,
            queued_at: std::time::Instant::now(),
            room,
        };
        if let Err(e) = self.enqueue(job) {
            // Never queued: counted as answered (and failed) so that nothing waits for it.
            self.inner.behind.give_up();
            return Err(e);
        }
        Ok(number)
    }

    /// The epoch of writes made behind their answers: it moves when one of them fails. `None`
    /// where nothing is written behind answers (PostgreSQL without its group writer, over TLS).
    pub fn behind_epoch(&self) -> Option<u64> {
        (self.backend() == Backend::Sqlite || self.pg_writer().is_some())
            .then(|| self.inner.behind.epoch())
    }

    /// How many writes behind answers the group writer has answered (committed or refused), in
    /// queue order: the write numbered `n` by [`Store::write_behind`] is answered once this is
    /// at least `n`.
    pub fn behind_answered(&self) -> u64 {
        self.inner.behind.answered()
    }

    /// Returns once every write behind its answer queued before the call has been answered
    /// (at once when none is waiting): what a read through another way than the writer's own
    /// memory waits for to see them.
    pub async fn settle_behind(&self) {
        let nudge = || match self.backend() {
            Backend::Sqlite => {
                if let Ok(writer) = self.group_writer() {
                    writer.nudge();
                }
            }
            Backend::Postgres => {
                if let Some(writer) = self.pg_writer() {
                    writer.nudge();
                }
            }
        };
        self.inner.behind.settled(nudge).await;
    }

    /// Holds sqlx's writer connection while the group writer commits, session after session,
    /// until the queue is drained.
    async fn group_session(&self) {
        let Ok(writer) = self.group_writer() else {
            return;
        };
        loop {
            let ended = match self.writer.acquire().await {
                Ok(lock) => {
                    let ended = writer.session().await;
                    drop(lock);
                    ended
                }
                Err(e) => writer.fail_all(&unavailable(e)),
            };
            if ended == crate::writer::Ended::Drained {
                return;
            }
        }
    }

    /// Commits `sql` (statements joined by [`Sql::push_statement`]) atomically with the next
    /// group commit, SQLite only. The first statements are `guards`: each must return exactly
    /// one row when its condition holds (`SELECT 1 FROM … WHERE …`) and the statements after
    /// them none. When a guard returns no row the statements change nothing and the answer is
    /// [`StoreError::Conflict`]; a failing statement (a unique key) answers its error. This is
    /// how a caller that read outside a transaction writes what it decided, if what it read
    /// still holds, without holding the single writer while it decided.
    pub async fn commit_guarded(&self, sql: Sql, guards: usize) -> Result<(), StoreError> {
        if self.backend() != Backend::Sqlite {
            return Err(StoreError::Unavailable(
                "guarded group commits are SQLite's; PostgreSQL callers use a transaction"
                    .to_owned(),
            ));
        }
        let sql = sql.checked(guards, Check::Holds("a guard did not hold"));
        self.grouped(sql, false).await.map(drop)
    }
}

impl Store {
    /// An execution and its stages (by position) in one statement, decoded straight from its
    /// rows on the point readers (the execution's columns are read from the first row only).
    pub async fn execution_with_stages(
        &self,
        id: &str,
    ) -> Result<Option<(ExecutionRecord, Vec<StageRecord>)>, StoreError> {
        let text = match self.backend() {
            Backend::Sqlite => EXECUTION_JOINED_WITH_STAGES.as_str(),
            Backend::Postgres => EXECUTION_WITH_STAGES.as_str(),
        };
        let read = Sql::new(text).arg(id.to_owned());
        let mut found = ExecutionWithStages::default();
        self.decode(&read, |row| found.push(row)).await?;
        Ok(found.done())
    }
}

impl Store {
    /// [`RunStore::apply`] after coalescing: a group commit (SQLite's or PostgreSQL's), or a
    /// transaction alone.
    async fn apply_coalesced(
        &self,
        fence: Option<&Fenced<'_>>,
        writes: Vec<Write>,
        touched: &Touched,
    ) -> Result<(), StoreError> {
        let requires = fence.and_then(|f| self.inner.behind.required_by(&f.fence.run_id));
        if groupable(&writes)
            && let Some(group) = self.pg_writer()
        {
            // Events apart: the group inserts every caller's events after everyone's other
            // writes, behind one outbox lock.
            let (events, body): (Vec<Write>, Vec<Write>) = writes
                .into_iter()
                .partition(|w| matches!(w, Write::Event(_)));
            let mut batch = Batch::new(Backend::Postgres);
            if let Some(fence) = fence {
                batch.fence(fence);
            }
            push_writes(&mut batch, body);
            let touched = if events.is_empty() {
                Touched::default()
            } else {
                touched.clone()
            };
            let mut inserts = Batch::new(Backend::Postgres);
            push_writes(&mut inserts, events);
            return group
                .commit(
                    batch.into_sql().into_statements(),
                    inserts.into_sql().into_statements(),
                    requires,
                    touched,
                )
                .await;
        }
        if self.backend() == Backend::Sqlite && groupable(&writes) {
            // Built once here: the group appends it, and runs it alone if the group fails.
            let (part, events) = sqlite_part(fence, writes);
            self.grouped_requiring(part, events, requires)
                .await
                .map(drop)
        } else {
            if self.backend() == Backend::Sqlite {
                // A transaction of its own does not queue behind the group writer's jobs, and
                // may take the write lock before a session that was about to commit them: it
                // first waits for everything queued so far (a batch queued ahead of its run's
                // first commit, [`RunStore::queue_ahead`], and the writes behind answers), so it
                // commits after them, as a group part would.
                self.grouped(Sql::default(), false).await?;
            }
            if let Some(epoch) = requires {
                // On PostgreSQL it waits for the writes behind answers queued so far; on both,
                // it then checks they held.
                self.settle_behind().await;
                if self.behind_epoch() != Some(epoch) {
                    return Err(StoreError::Unavailable(
                        crate::writer::REFUSED_BEHIND.to_owned(),
                    ));
                }
            }
            self.apply_alone(fence, writes, touched).await
        }
    }
}

/// A batch as SQLite's group writer runs it (its fence first), and whether it inserts outbox
/// events (the writer wakes the streams after the commit).
fn sqlite_part(fence: Option<&Fenced<'_>>, writes: Vec<Write>) -> (crate::writer::Part, bool) {
    let events = writes.iter().any(|w| matches!(w, Write::Event(_)));
    let mut batch = Batch::new(Backend::Sqlite);
    if let Some(fence) = fence {
        batch.fence(fence);
    }
    push_writes(&mut batch, writes);
    let part = crate::writer::Part::Statements(batch.into_sql().into_statements());
    (part, events)
}

/// The executions whose waiters a batch's commit wakes. Taken whether or not anyone waits now:
/// a waiter may come while the commit is under way (read the execution before it lands, then
/// wait), and must be woken when it does. On PostgreSQL the other nodes learn them from the
/// commit's `NOTIFY`.
fn touched_by(writes: &[Write]) -> Touched {
    let mut moved: Vec<String> = writes
        .iter()
        .filter_map(|w| match w {
            Write::Event(e) => Some(e.execution_id.clone()),
            _ => None,
        })
        .collect();
    moved.dedup();
    // And those it takes out of `queued`/`running`, whose long polls answer.
    let stopped: Vec<String> = writes
        .iter()
        .filter_map(|w| match w {
            Write::UpdateExecution(p) if p.status.is_some_and(|s| !s.is_moving()) => {
                Some(p.id.clone())
            }
            Write::InsertExecution(e) if !e.status.is_moving() => Some(e.id.clone()),
            _ => None,
        })
        .collect();
    Touched { moved, stopped }
}

impl Store {
    /// After a batch committed: its executions counted, their waiters woken.
    fn committed(&self, counted: ExecutionCounts, touched: &Touched) {
        counted.record();
        self.wakes.wake(
            touched.moved.iter().map(String::as_str),
            touched.stopped.iter().map(String::as_str),
        );
    }
}

/// Executions created and finished by a batch of writes, counted once it commits.
#[derive(Default)]
struct ExecutionCounts {
    started: Vec<String>,
    finished: Vec<(String, &'static str)>,
}

impl ExecutionCounts {
    fn of(writes: &[Write]) -> Self {
        let mut counts = Self::default();
        for write in writes {
            match write {
                Write::InsertExecution(e) => counts.started.push(e.workflow.clone()),
                Write::Event(e) => {
                    let status = match e.event_type.as_str() {
                        "ExecutionSucceeded" => "succeeded",
                        "ExecutionFailed" => "failed",
                        "ExecutionCanceled" => "canceled",
                        "ExecutionRolledBack" => "rolled_back",
                        _ => continue,
                    };
                    counts.finished.push((e.workflow.clone(), status));
                }
                _ => {}
            }
        }
        counts
    }

    fn record(self) {
        for workflow in self.started {
            metrics::counter!("capstan_executions_started_total", "workflow" => workflow)
                .increment(1);
        }
        for (workflow, status) in self.finished {
            metrics::counter!("capstan_executions_finished_total", "workflow" => workflow, "status" => status)
                .increment(1);
        }
    }
}

/// The first column of a row a group's statement returned.
pub(crate) type Returned = rusqlite::types::Value;

pub(crate) fn interrupted() -> StoreError {
    StoreError::Unavailable("the group commit carrying this batch was interrupted".to_owned())
}

#[async_trait]
impl RunStore for Store {
    async fn apply(&self, fence: Option<&Fence>, writes: Vec<Write>) -> Result<(), StoreError> {
        let mut writes = coalesce(writes);
        let fenced = fence.map(|fence| Fenced::take(fence, &mut writes));
        let counted = ExecutionCounts::of(&writes);
        let touched = touched_by(&writes);
        let applied = self
            .apply_coalesced(fenced.as_ref(), writes, &touched)
            .await;
        if applied.is_ok() {
            self.committed(counted, &touched);
        }
        applied
    }

    fn activation_began(&self, run_id: &str) {
        self.inner.behind.activation_began(run_id);
    }

    fn activation_ended(&self, run_id: &str) {
        self.inner.behind.activation_ended(run_id);
    }

    fn activation_epoch(&self, run_id: &str) -> Option<u64> {
        self.behind_epoch()?;
        self.inner.behind.required_by(run_id)
    }

    /// SQLite's group writer only: on PostgreSQL other nodes write the same keys, and a batch
    /// that fails there (a unique key another node took meanwhile) would move every
    /// activation's epoch more often than a start ahead of its commit is worth.
    fn queues_ahead(&self) -> bool {
        self.backend() == Backend::Sqlite
    }

    async fn queue_ahead(&self, writes: Vec<Write>) -> Result<Queued, Unqueued> {
        if !self.queues_ahead() || !groupable(&writes) {
            return Err(Unqueued::Unsupported(writes));
        }
        let writes = coalesce(writes);
        let counted = ExecutionCounts::of(&writes);
        let touched = touched_by(&writes);
        let (part, events) = sqlite_part(None, writes);
        let answer = match self
            .queue_part(part, events, None, crate::writer::Waits::Ahead)
            .await
        {
            Ok(answer) => answer,
            Err(e) => return Err(Unqueued::Failed(e)),
        };
        let store = self.clone();
        Ok(Box::pin(async move {
            answer
                .await
                .map_or_else(|_| Err(interrupted()), crate::writer::Answered::into_answer)?;
            store.committed(counted, &touched);
            Ok(())
        }))
    }

    async fn run(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        let row = self
            .fetch_optional(Sql::new("SELECT * FROM runs WHERE id = $1").arg(id.to_owned()))
            .await
            .map_err(unavailable)?;
        row.as_ref().map(run_row).transpose()
    }

    async fn claim_runs(
        &self,
        owner: &str,
        now_ms: Millis,
        lease_ms: Millis,
        limit: i64,
    ) -> Result<Vec<RunRecord>, StoreError> {
        if self.backend() == Backend::Postgres {
            // Rows another node is claiming right now are skipped, not waited for; the outer
            // UPDATE re-checks nothing, so the inner SELECT's row locks are what make a claim
            // exclusive. A function, so its plan is fixed (PostgreSQL migration 0013 says why).
            crate::count_write();
            let rows = sqlx::query("SELECT * FROM capstan_claim_runs($1, $2, $3, $4)")
                .bind(owner)
                .bind(now_ms + lease_ms)
                .bind(now_ms)
                .bind(limit)
                .fetch_all(&self.writer)
                .await
                .map_err(unavailable)?;
            return rows.iter().map(run_row).collect();
        }
        // SQLite: one writer, the statement is atomic as it is. A claim joins the next group
        // commit, whose answer is a first column, so it returns the ids; the claimed runs are
        // then read on a read connection (they are committed by the time the group answers).
        // `OR FAIL`: no statement journal ([`Batch::fence`] says why).
        let mut claim = Sql::default();
        claim
            .push_statement(
                "UPDATE OR FAIL runs SET lease_owner = $1, lease_expires_ms = $2, activations = activations + 1
                 WHERE id IN (
                    SELECT id FROM runs WHERE state = 'runnable' AND wake_ms <= $3
                      AND (lease_owner IS NULL OR lease_expires_ms < $4)
                    ORDER BY wake_ms LIMIT $5)
                 RETURNING id",
            )
            .bind(owner.to_owned())
            .bind(now_ms + lease_ms)
            .bind(now_ms)
            .bind(now_ms)
            .bind(limit);
        let ids: Vec<String> = self
            .grouped(claim, false)
            .await?
            .into_iter()
            .filter_map(|v| match v {
                Returned::Text(id) => Some(id),
                _ => None,
            })
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut read = Sql::new("SELECT * FROM runs WHERE id IN (");
        read.push_binds(ids).push(") ORDER BY wake_ms");
        let rows = self.fetch_all(read).await.map_err(unavailable)?;
        rows.iter().map(run_row).collect()
    }

    async fn next_wake(&self) -> Result<Option<Millis>, StoreError> {
        sqlx::query_scalar("SELECT MIN(CASE WHEN lease_expires_ms > wake_ms THEN lease_expires_ms ELSE wake_ms END)
             FROM runs WHERE state = 'runnable'")
            .fetch_one(&mut *self.read().await.map_err(unavailable)?)
            .await
            .map_err(unavailable)
    }

    async fn journal(&self, run_id: &str) -> Result<Vec<JournalEntry>, StoreError> {
        let rows = self
            .fetch_all(Sql::new(journal::SELECT_CHUNKS).arg(run_id.to_owned()))
            .await
            .map_err(unavailable)?;
        journal::fold(run_id, rows.iter().map(chunk_row))
    }

    async fn waits(&self, run_id: &str) -> Result<Vec<WaitRecord>, StoreError> {
        let rows = self
            .fetch_all(
                Sql::new("SELECT * FROM waits WHERE run_id = $1 ORDER BY seq")
                    .arg(run_id.to_owned()),
            )
            .await
            .map_err(unavailable)?;
        rows.iter().map(wait_row).collect()
    }

    async fn replay_state(
        &self,
        run_id: &str,
        execution_id: &str,
    ) -> Result<ReplayState, StoreError> {
        let mut read = Sql::default();
        read.push_statement(journal::SELECT_CHUNKS)
            .bind(run_id.to_owned());
        read.push_statement("SELECT * FROM waits WHERE run_id = $1 ORDER BY seq")
            .bind(run_id.to_owned());
        read.push_statement(SELECT_STAGES.as_str())
            .bind(execution_id.to_owned());
        let mut state = ReplayState::default();
        let mut chunks = Vec::new();
        // One read; a row is told by a column only its table has.
        for row in &self.fetch_all(read).await.map_err(unavailable)? {
            let has = |name: &str| row.columns().iter().any(|c| c.name() == name);
            if has("stage_name") {
                state.stages.push(stage_row(row)?);
            } else if has("attempts") {
                state.waits.push(wait_row(row)?);
            } else {
                chunks.push(chunk_row(row));
            }
        }
        state.journal = journal::fold(run_id, chunks)?;
        Ok(state)
    }
}

#[async_trait]
impl ExecutionReads for Store {
    async fn execution(&self, id: &str) -> Result<Option<ExecutionRecord>, StoreError> {
        let row = self
            .fetch_optional(Sql::new(SELECT_EXECUTION.as_str()).arg(id.to_owned()))
            .await
            .map_err(unavailable)?;
        row.as_ref().map(execution_row).transpose()
    }

    async fn execution_workflow(&self, id: &str) -> Result<Option<String>, StoreError> {
        let row = self
            .fetch_optional(
                Sql::new("SELECT workflow FROM executions WHERE id = $1").arg(id.to_owned()),
            )
            .await
            .map_err(unavailable)?;
        row.map(|row| row.try_get(0).map_err(unavailable))
            .transpose()
    }

    async fn list_executions(
        &self,
        filter: &ExecutionFilter,
    ) -> Result<Vec<ExecutionRecord>, StoreError> {
        let mut q = Sql::new(format!("{} WHERE 1 = 1", *SELECT_EXECUTIONS));
        if let Some(workflows) = &filter.workflows {
            if workflows.is_empty() {
                return Ok(Vec::new());
            }
            q.push(" AND workflow IN (")
                .push_binds(workflows.iter().cloned())
                .push(")");
        }
        if let Some(status) = filter.status {
            q.push(" AND status = ").push_bind(status.as_str());
        }
        if let Some(principal) = &filter.principal_id {
            q.push(" AND principal_id = ").push_bind(principal.clone());
        }
        q.push(" ORDER BY id DESC").push_limit(filter.limit);
        let rows = q
            .build()
            .fetch_all(&mut *self.read().await.map_err(unavailable)?)
            .await
            .map_err(unavailable)?;
        rows.iter().map(execution_row).collect()
    }

    async fn stages(&self, execution_id: &str) -> Result<Vec<StageRecord>, StoreError> {
        let rows = self
            .fetch_all(Sql::new(SELECT_STAGES.as_str()).arg(execution_id.to_owned()))
            .await
            .map_err(unavailable)?;
        rows.iter().map(stage_row).collect()
    }

    async fn receipts(&self, execution_id: &str) -> Result<Vec<Receipt>, StoreError> {
        let read = Sql::new(
            "SELECT * FROM receipts WHERE execution_id = $1 ORDER BY created_ms, run_id, seq",
        )
        .arg(execution_id.to_owned());
        let rows = self.fetch_all(read).await.map_err(unavailable)?;
        rows.iter()
            .map(|row| {
                Ok(Receipt {
                    id: row.get("id"),
                    execution_id: row.get("execution_id"),
                    run_id: row.get("run_id"),
                    seq: row.get("seq"),
                    op: row.get("op"),
                    request: text_json(row, "request")?,
                    response: text_json(row, "response")?,
                    created_ms: row.get("created_ms"),
                    compensated_ms: row.get("compensated_ms"),
                })
            })
            .collect()
    }

    async fn commands(&self, execution_id: &str) -> Result<Vec<CommandRecord>, StoreError> {
        let rows = self
            .fetch_all(
                Sql::new("SELECT * FROM commands WHERE execution_id = $1 ORDER BY created_ms, id")
                    .arg(execution_id.to_owned()),
            )
            .await
            .map_err(unavailable)?;
        rows.iter()
            .map(|row| {
                Ok(CommandRecord {
                    id: row.get("id"),
                    execution_id: row.get("execution_id"),
                    operation: row.get("operation"),
                    status: parse_enum(row.get::<&str, _>("status"))?,
                    created_ms: row.get("created_ms"),
                    finished_ms: row.get("finished_ms"),
                    error: row.get("error"),
                })
            })
            .collect()
    }

    async fn events(&self, execution_id: &str) -> Result<Vec<OutboxRecord>, StoreError> {
        let rows = self
            .fetch_all(Sql::new(OUTBOX_OF_EXECUTION.as_str()).arg(execution_id.to_owned()))
            .await
            .map_err(unavailable)?;
        rows.iter().map(outbox_row).collect()
    }

    async fn idempotency(
        &self,
        principal_id: &str,
        workflow: &str,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let read = Sql::new(
            "SELECT body_sha256, execution_id, response_json, created_ms FROM idempotency
             WHERE principal_id = $1 AND workflow = $2 AND key = $3",
        )
        .arg(principal_id.to_owned())
        .arg(workflow.to_owned())
        .arg(key.to_owned());
        let row = self.fetch_optional(read).await.map_err(unavailable)?;
        row.map(|row| {
            Ok(IdempotencyRecord {
                principal_id: principal_id.to_owned(),
                workflow: workflow.to_owned(),
                key: key.to_owned(),
                body_sha256: row.get("body_sha256"),
                execution_id: row.get("execution_id"),
                response_json: parse_json(row.get("response_json"))?,
                created_ms: row.get("created_ms"),
            })
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_core::execution::{ExecutionStatus, StageStatus};

    fn texts(write: Write) -> Vec<String> {
        let mut batch = Batch::new(Backend::Sqlite);
        push_write(&mut batch, write);
        batch
            .into_sql()
            .into_statements()
            .into_iter()
            .map(|s| s.text.into_owned())
            .collect()
    }

    /// A partial update names only what it changes: `SET id = id` made SQLite check the foreign
    /// keys that reference the row (a scan of `runs` per execution update).
    #[test]
    fn partial_updates_set_only_their_columns() {
        let stage = texts(Write::UpdateExecution(ExecutionPatch {
            id: "e1".into(),
            current_stage: Some(Some("plan".into())),
            ..ExecutionPatch::default()
        }));
        assert_eq!(
            stage,
            ["UPDATE executions SET current_stage = $1 WHERE id = $2"]
        );
        let run = texts(Write::UpdateRun(RunPatch {
            id: "r1".into(),
            state: Some(RunState::Done),
            release_lease: true,
            ..RunPatch::default()
        }));
        assert_eq!(
            run,
            [
                "UPDATE runs SET state = $1, lease_owner = NULL, lease_expires_ms = NULL WHERE id = $2"
            ]
        );
        let nothing = texts(Write::UpdateRun(RunPatch {
            id: "r1".into(),
            ..RunPatch::default()
        }));
        assert!(nothing.is_empty(), "{nothing:?}");
    }

    /// A batch that gives up the fenced run's lease writes that in the fence itself, unless
    /// the batch writes the run otherwise too, or records a cancel request the fence would read.
    #[test]
    fn the_fence_gives_the_lease_up_when_its_batch_does() {
        let fence = Fence {
            run_id: "r1".into(),
            owner: "node-a".into(),
            lease_until_ms: 5,
        };
        let release = |id: &str| {
            Write::UpdateRun(RunPatch {
                id: id.into(),
                state: Some(RunState::Done),
                release_lease: true,
                ..RunPatch::default()
            })
        };
        let fenced_texts = |mut writes: Vec<Write>| {
            let fenced = Fenced::take(&fence, &mut writes);
            let mut batch = Batch::new(Backend::Sqlite);
            batch.fence(&fenced);
            for write in writes {
                push_write(&mut batch, write);
            }
            let statements = batch.into_sql().into_statements();
            assert_eq!(statements[0].check, Some(Check::Fence));
            statements
                .into_iter()
                .map(|s| s.text.into_owned())
                .collect::<Vec<_>>()
        };
        let renew = "UPDATE runs SET lease_expires_ms = $1 WHERE id = $2 AND lease_owner = $3 RETURNING cancel_requested";

        let texts = fenced_texts(vec![stage("s1", StageStatus::Succeeded), release("r1")]);
        assert_eq!(
            texts[0],
            "UPDATE OR FAIL runs SET state = $1, lease_owner = NULL, lease_expires_ms = NULL WHERE id = $2 AND lease_owner = $3 RETURNING cancel_requested"
        );
        assert_eq!(texts.len(), 2, "the run's own update is gone: {texts:?}");
        assert!(texts[1].starts_with("INSERT INTO stages"), "{texts:?}");
        // Another run's release, a patch that keeps the lease: the fence renews it.
        for writes in [
            vec![release("r2")],
            vec![Write::UpdateRun(RunPatch {
                id: "r1".into(),
                wake_ms: Some(9),
                ..RunPatch::default()
            })],
        ] {
            assert_eq!(fenced_texts(writes)[0], renew);
        }
        // The run written twice, its journal truncated, a cancel request recorded: apart.
        for writes in [
            vec![release("r1"), release("r1")],
            vec![
                Write::TruncateJournal {
                    run_id: "r1".into(),
                    from_seq: 3,
                },
                release("r1"),
            ],
            vec![Write::UpdateRun(RunPatch {
                id: "r1".into(),
                release_lease: true,
                cancel_requested: Some(true),
                ..RunPatch::default()
            })],
        ] {
            let texts = fenced_texts(writes);
            assert_eq!(texts[0], renew);
            assert!(
                texts[1..]
                    .iter()
                    .any(|t| t.starts_with("UPDATE runs SET") && t.contains("lease_owner = NULL")),
                "{texts:?}"
            );
        }
    }

    fn stage(id: &str, status: StageStatus) -> Write {
        Write::PutStage(StageRecord {
            id: id.into(),
            execution_id: "e1".into(),
            position: 0,
            stage_name: id.into(),
            status,
            started_ms: 1,
            finished_ms: None,
            output_json: None,
            error_json: None,
        })
    }

    fn patch(current: &str) -> ExecutionPatch {
        ExecutionPatch {
            id: "e1".into(),
            current_stage: Some(Some(current.into())),
            ..ExecutionPatch::default()
        }
    }

    #[test]
    fn a_batch_keeps_the_last_write_of_a_stage_and_one_merged_patch_per_execution() {
        let event = Write::TruncateJournal {
            run_id: "r1".into(),
            from_seq: 9,
        };
        let done = ExecutionPatch {
            status: Some(ExecutionStatus::Succeeded),
            current_stage: Some(None),
            ..patch("x")
        };
        let writes = vec![
            stage("a", StageStatus::Running),
            Write::UpdateExecution(patch("a")),
            event.clone(),
            stage("a", StageStatus::Succeeded),
            stage("b", StageStatus::Running),
            Write::UpdateExecution(ExecutionPatch {
                output_json: Some(JsonText::new(&serde_json::json!({"n": 1}))),
                ..patch("b")
            }),
            stage("b", StageStatus::Succeeded),
            Write::UpdateExecution(done.clone()),
        ];
        let merged = ExecutionPatch {
            output_json: Some(JsonText::new(&serde_json::json!({"n": 1}))),
            ..done
        };
        assert_eq!(
            coalesce(writes),
            vec![
                event,
                stage("a", StageStatus::Succeeded),
                stage("b", StageStatus::Succeeded),
                Write::UpdateExecution(merged),
            ]
        );
    }

    /// Rows go as inserts of the largest counts that fit, in order, each text with a row's
    /// placeholders per row and its values in the same order.
    #[test]
    fn rows_go_as_the_largest_inserts_that_fit_in_their_order() {
        let mut batch = Batch::new(Backend::Sqlite);
        push_rows(&mut batch, &EVENT_ROWS, (0..27_i64).collect(), |sql, n| {
            for column in 0..10 {
                sql.bind(n * 10 + column);
            }
        });
        let statements = batch.into_sql().into_statements();
        let rows: Vec<usize> = statements.iter().map(|s| s.values().len() / 10).collect();
        assert_eq!(rows, [16, 8, 2, 1]);
        let mut next = 0;
        for statement in &statements {
            let n = statement.values().len();
            assert!(statement.text.ends_with(&format!("${n})")));
            assert!(!statement.text.contains(&format!("${}", n + 1)));
            for value in statement.values() {
                assert!(matches!(value, sqlx_core::any::AnyValueKind::BigInt(v) if *v == next));
                next += 1;
            }
        }
        assert_eq!(next, 27 * 10);
    }

    #[test]
    fn nothing_merges_across_a_guard_a_restage_or_a_cancel_request() {
        let guarded = ExecutionPatch {
            expect: Some(vec![ExecutionStatus::Running]),
            status: Some(ExecutionStatus::Waiting),
            ..ExecutionPatch::default()
        };
        let guarded = ExecutionPatch {
            id: "e1".into(),
            ..guarded
        };
        let restage = Write::RestageAll {
            execution_id: "e1".into(),
            from: StageStatus::Running,
            to: StageStatus::Failed,
        };
        let cancel = ExecutionPatch {
            cancellation_requested_ms: Some(Some(5)),
            ..patch("c")
        };
        let writes = vec![
            Write::UpdateExecution(patch("a")),
            Write::UpdateExecution(guarded),
            Write::UpdateExecution(patch("b")),
            stage("s", StageStatus::Running),
            restage,
            stage("s", StageStatus::Failed),
            Write::UpdateExecution(cancel),
            Write::UpdateExecution(patch("d")),
        ];
        assert_eq!(coalesce(writes.clone()), writes);
    }
}
