//! SQLite's group writer: one thread with its own connection that commits group commits
//! (`engine.rs`, [`crate::Store::commit_guarded`]) from statements it keeps prepared.
//!
//! A group is many callers' statements in one transaction. Sent through sqlx as one text, SQLite
//! parsed it anew every time (a group's text never repeats, so sqlx cannot cache it): a third of
//! the writer's time in the profile (BENCHMARKS.md). Here every statement keeps its own text
//! (`Sql` keeps statements apart), so the few dozen distinct texts stay prepared in the
//! connection's cache and a group costs binding and stepping only, with one hand-off to this
//! thread and one answer back for the whole group instead of sqlx's per-statement channel.
//!
//! When one caller's guard fails (a lost lease, a cancel, a value that moved) or one of its
//! statements is refused (a unique key), the transaction rolls back, that caller alone gets the
//! error, and the group runs again without it; the others commit.
//!
//! SQLite allows one writer: the process's other writes go through sqlx's single-connection
//! writer pool, and a group holds that pool's connection while this thread commits, so the two
//! never race for the file's write lock (other processes, like the CLI, wait in the busy timeout
//! as before).

use crate::engine::Returned;
use crate::sql::Statement;
use capstan_core::store::StoreError;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OpenFlags};
use sqlx_core::any::AnyValueKind;
use std::sync::mpsc;

/// Prepared statements kept per connection: every distinct text the engine, the simulator and
/// the relay write (partial updates have a text per combination of columns) fits many times.
const PREPARED: usize = 512;

/// One caller's part of a group: its statements, guards marked ([`Statement::check`]).
pub(crate) type Part = Vec<Statement>;

/// A part's answer: the first column of every row its statements returned, guards aside.
pub(crate) type Answer = Result<Vec<Returned>, StoreError>;

/// A group to commit; `answer` gets one answer per part, in order.
pub(crate) struct Request {
    pub(crate) parts: Vec<Part>,
    pub(crate) answer: tokio::sync::oneshot::Sender<Vec<Answer>>,
}

/// How often the checkpointer copies the WAL's committed pages into the database file.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// WAL pages after which the group writer checkpoints in its own commit, as SQLite does by
/// default at 1,000: only when the checkpointer thread has not kept up (or could not start), so
/// the WAL stays bounded (~40 MiB) whatever happens to that thread.
const BACKSTOP_PAGES: u32 = 10_000;

/// The handle to the writer thread (and its checkpointer); both end when it is dropped.
pub(crate) struct GroupWriter {
    requests: mpsc::Sender<Request>,
    _checkpoints: mpsc::Sender<()>,
}

impl std::fmt::Debug for GroupWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupWriter")
    }
}

impl GroupWriter {
    /// Starts the thread; it opens its connection to the database file at `path` itself (an
    /// open that fails is answered to every request).
    pub(crate) fn start(path: String) -> std::io::Result<Self> {
        let (checkpoints, stop) = mpsc::channel::<()>();
        let checkpointer_path = path.clone();
        std::thread::Builder::new()
            .name("capstan-sqlite-checkpoint".to_owned())
            .spawn(move || checkpoint_until_stopped(&checkpointer_path, &stop))?;
        let (requests, receive) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("capstan-sqlite-writer".to_owned())
            .spawn(move || {
                let connection = open(&path);
                while let Ok(request) = receive.recv() {
                    let answers = match &connection {
                        Ok(conn) => commit(conn, &request.parts),
                        Err(e) => request
                            .parts
                            .iter()
                            .map(|_| Err(StoreError::Unavailable(e.clone())))
                            .collect(),
                    };
                    let _ = request.answer.send(answers);
                }
            })?;
        Ok(Self {
            requests,
            _checkpoints: checkpoints,
        })
    }

    /// Hands a group to the thread; gives it back if the thread is gone.
    pub(crate) fn send(&self, request: Request) -> Result<(), Request> {
        self.requests.send(request).map_err(|e| e.0)
    }
}

/// Checkpoints the WAL every [`CHECKPOINT_EVERY`] on a connection of its own until `stop`'s
/// sender is dropped.
///
/// SQLite checkpoints automatically in the commit that grows the WAL past 1,000 pages, so the
/// group writer used to copy pages and `fsync` the database file in the middle of its commits
/// (~12 % of its time in the profile, BENCHMARKS.md session 10) while every caller waited. Its
/// connection moves that threshold out of the way ([`BACKSTOP_PAGES`]) and this thread
/// checkpoints instead, `PASSIVE`ly: it copies what no reader still needs and never blocks the
/// writer or a reader.
fn checkpoint_until_stopped(path: &str, stop: &mpsc::Receiver<()>) {
    let conn = match open(path) {
        Ok(conn) => conn,
        Err(error) => {
            tracing::warn!(%error, "no WAL checkpointer: SQLite's automatic checkpoints remain");
            return;
        }
    };
    while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(CHECKPOINT_EVERY) {
        if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::debug!(%error, "WAL checkpoint failed; retrying");
        }
    }
}

fn open(path: &str) -> Result<Connection, String> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| format!("the SQLite group writer cannot open {path}: {e}"))?;
    // As sqlx's connections (`Store::connect_sqlite`); WAL is the file's own, set by them.
    conn.execute_batch(
        "PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000; PRAGMA foreign_keys = ON",
    )
    .map_err(|e| format!("the SQLite group writer cannot configure {path}: {e}"))?;
    crate::reader::plan_once(&conn)
        .map_err(|e| format!("the SQLite group writer cannot configure {path}: {e}"))?;
    // Checkpoints are the checkpointer thread's (`checkpoint_until_stopped`).
    conn.execute_batch(&format!("PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}"))
        .map_err(|e| format!("the SQLite group writer cannot configure {path}: {e}"))?;
    conn.set_prepared_statement_cache_capacity(PREPARED);
    Ok(conn)
}

fn failed(e: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// Runs a prepared, cached statement without arguments (transaction control).
fn control(conn: &Connection, text: &str) -> Result<(), StoreError> {
    conn.prepare_cached(text)
        .and_then(|mut s| s.raw_execute())
        .map(|_| ())
        .map_err(failed)
}

/// Commits the group in one transaction and answers each part. A part that fails (a guard that
/// does not hold, a refused statement) rolls the transaction back; it gets its error, and the
/// group runs again without it, so the others commit as if it had not been there. (Failures are
/// rare, so this costs less than a savepoint per part, whose sub-journal copies every page a
/// part first touches.) When the transaction itself fails, every part still waiting fails.
fn commit(conn: &Connection, parts: &[Part]) -> Vec<Answer> {
    let mut answers: Vec<Option<Answer>> = parts.iter().map(|_| None).collect();
    'group: loop {
        let waiting: Vec<usize> = (0..parts.len()).filter(|&i| answers[i].is_none()).collect();
        if waiting.is_empty() {
            break;
        }
        if let Err(e) = control(conn, "BEGIN IMMEDIATE") {
            return fail_waiting(answers, &e);
        }
        let mut returned = Vec::with_capacity(waiting.len());
        for &i in &waiting {
            match run_part(conn, &parts[i]) {
                Ok(rows) => returned.push(rows),
                Err(e) => {
                    if !conn.is_autocommit() && control(conn, "ROLLBACK").is_err() {
                        return fail_waiting(answers, &e);
                    }
                    answers[i] = Some(Err(e));
                    continue 'group;
                }
            }
        }
        if let Err(e) = control(conn, "COMMIT") {
            if !conn.is_autocommit() {
                let _ = control(conn, "ROLLBACK");
            }
            return fail_waiting(answers, &e);
        }
        for (i, rows) in waiting.into_iter().zip(returned) {
            answers[i] = Some(Ok(rows));
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Ok(Vec::new())))
        .collect()
}

/// Every part not answered yet fails with `e`.
fn fail_waiting(answers: Vec<Option<Answer>>, e: &StoreError) -> Vec<Answer> {
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(e.clone())))
        .collect()
}

/// One caller's statements; the first error (or failed guard) ends it.
fn run_part(conn: &Connection, part: &Part) -> Answer {
    let mut returned = Vec::new();
    for statement in part {
        let rows = run(conn, statement).map_err(failed)?;
        match statement.check {
            Some(check) => check.verdict(rows.first().map(|v| match v {
                Returned::Integer(i) => *i,
                _ => 0,
            }))?,
            None => returned.extend(rows),
        }
    }
    Ok(returned)
}

/// Binds and runs one statement (prepared once per connection); the first column of each row
/// it returns.
fn run(conn: &Connection, statement: &Statement) -> rusqlite::Result<Vec<Returned>> {
    let mut prepared = conn.prepare_cached(&statement.text)?;
    bind(&mut prepared, statement)?;
    let mut rows = prepared.raw_query();
    let mut returned = Vec::new();
    while let Some(row) = rows.next()? {
        returned.push(row.get::<_, Returned>(0)?);
    }
    Ok(returned)
}

/// Binds the statement's values to its prepared form (also used by `reader.rs`).
pub(crate) fn bind(
    prepared: &mut rusqlite::Statement<'_>,
    statement: &Statement,
) -> rusqlite::Result<()> {
    let values = statement.values();
    for index in 1..=prepared.parameter_count() {
        // `$N` takes the statement's N-th value (as sqlx binds them); `?` the next one.
        let at = prepared
            .parameter_name(index)
            .and_then(|name| name.strip_prefix('$'))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(index);
        let value = values
            .get(at - 1)
            .ok_or(rusqlite::Error::InvalidParameterCount(at, values.len()))?;
        prepared.raw_bind_parameter(index, value_of(value)?)?;
    }
    Ok(())
}

/// An sqlx argument as SQLite's value (the types sqlx's SQLite driver binds them as).
fn value_of(value: &AnyValueKind) -> rusqlite::Result<ToSqlOutput<'_>> {
    Ok(ToSqlOutput::Borrowed(match value {
        AnyValueKind::Null(_) => ValueRef::Null,
        AnyValueKind::Bool(b) => ValueRef::Integer(i64::from(*b)),
        AnyValueKind::SmallInt(i) => ValueRef::Integer(i64::from(*i)),
        AnyValueKind::Integer(i) => ValueRef::Integer(i64::from(*i)),
        AnyValueKind::BigInt(i) => ValueRef::Integer(*i),
        AnyValueKind::Real(f) => ValueRef::Real(f64::from(*f)),
        AnyValueKind::Double(f) => ValueRef::Real(*f),
        AnyValueKind::Text(s) => ValueRef::Text(s.as_bytes()),
        AnyValueKind::TextSlice(s) => ValueRef::Text(s.as_bytes()),
        AnyValueKind::Blob(b) => ValueRef::Blob(b.as_slice()),
        other => {
            return Err(rusqlite::Error::ToSqlConversionFailure(
                format!("cannot bind {other:?} on SQLite").into(),
            ));
        }
    }))
}
