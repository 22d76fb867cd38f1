//! SQLite point reads on the calling thread ([`crate::Store::fetch_all`]).
//!
//! sqlx runs every SQLite connection on a thread of its own: a query is a hand-off to that
//! thread, and every row comes back as a message of its own, each a futex wake on both sides.
//! For the small reads on the hot paths (an execution and its stages, a run's journal, a key
//! and its grants, the simulator's record sets) the hand-offs cost more than the query: the
//! profile in BENCHMARKS.md had sqlx's read threads spending more time waking and
//! waiting than in `sqlite3_step`. Here the caller runs the query itself on a connection it
//! takes from an idle list, as a function call: a read bounded by a key takes microseconds
//! (WAL readers never wait for the writer), which is less than a thread hop costs.
//!
//! Only reads bounded by a key belong here (they block the calling task's thread while they
//! run); scans and filtered lists stay on sqlx's read connections ([`crate::Store::read`]).
//!
//! Rows come back as sqlx's `AnyRow`, with the same value kinds sqlx's SQLite driver gives
//! (integers as `BigInt`, reals as `Double`, text, blobs, nulls), so the row decoders are the
//! same on both paths and on both backends. The hottest read (an execution with its stages) takes
//! a connection with [`Readers::with`] instead and decodes SQLite's rows itself (`rows.rs`).

use crate::Sql;
use crate::sql::Statement;
use capstan_core::store::StoreError;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use sqlx::any::AnyRow;
use sqlx_core::any::{AnyColumn, AnyTypeInfo, AnyTypeInfoKind, AnyValue, AnyValueKind};
use sqlx_core::ext::ustr::UStr;
use std::sync::{Arc, Mutex, PoisonError};

/// Idle connections kept at most; more are opened when more threads read at once, and closed
/// when they come back to a full list.
const IDLE: usize = 16;

/// Prepared statements kept per connection (the hot reads are a few dozen texts).
const PREPARED: usize = 128;

/// Read connections to one SQLite file.
pub(crate) struct Readers {
    path: String,
    idle: Mutex<Vec<Connection>>,
}

impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readers").field("path", &self.path).finish()
    }
}

/// A failed read, as sqlx reports a lost connection (the callers answer 503 for it).
pub(crate) fn failed(e: impl std::fmt::Display) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::other(format!("SQLite read: {e}")))
}

impl Readers {
    pub(crate) fn new(path: String) -> Self {
        Self {
            path,
            idle: Mutex::new(Vec::new()),
        }
    }

    fn open(&self) -> Result<Connection, sqlx::Error> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI;
        let conn = Connection::open_with_flags(&self.path, flags).map_err(failed)?;
        // Read only by promise: `query_only` refuses any write through this connection.
        conn.execute_batch("PRAGMA busy_timeout = 5000; PRAGMA query_only = 1")
            .map_err(failed)?;
        plan_once(&conn).map_err(failed)?;
        conn.set_prepared_statement_cache_capacity(PREPARED);
        Ok(conn)
    }

    /// Runs `read` on an idle connection (opened if none is idle) and puts the connection back.
    ///
    /// `read` sees one snapshot if it runs one statement, or several inside a transaction it
    /// ends itself; a connection left inside a transaction is closed instead of kept.
    pub(crate) fn with<T, E>(&self, read: impl FnOnce(&Connection) -> Result<T, E>) -> Result<T, E>
    where
        E: From<sqlx::Error>,
    {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.open()?,
        };
        let result = read(&conn);
        if conn.is_autocommit() {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.len() < IDLE {
                idle.push(conn);
            }
        }
        result
    }

    /// Runs the statements in order (several in one read transaction, so they see one
    /// snapshot) and returns all their rows.
    pub(crate) fn fetch(&self, statements: &[Statement]) -> Result<Vec<AnyRow>, sqlx::Error> {
        self.with(|conn| {
            if statements.len() <= 1 {
                return fetch_each(conn, statements);
            }
            control(conn, "BEGIN").map_err(failed)?;
            let rows = fetch_each(conn, statements);
            // A read transaction has nothing to lose; ending it is what matters (an open one
            // would pin the WAL and hide later commits from this connection; `with` closes a
            // connection left in one).
            let ended = control(conn, "COMMIT");
            if ended.is_err() && !conn.is_autocommit() {
                return rows.and(Err(failed("cannot end a read transaction")));
            }
            rows
        })
    }

    /// Runs a read of one statement and decodes its rows as they are stepped (`rows.rs`): no
    /// `AnyRow` is built and no text copied that the records do not keep. The first row that
    /// does not decode ends the read with its error.
    pub(crate) fn decode<T>(
        &self,
        read: &Sql,
        mut decode: impl FnMut(&rusqlite::Row<'_>) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let [statement] = read.statements() else {
            unreachable!("a decoded read is one statement")
        };
        self.with(|conn| {
            let mut prepared = conn.prepare_cached(&statement.text).map_err(failed)?;
            crate::writer::bind(&mut prepared, statement.values()).map_err(failed)?;
            let mut out = Vec::new();
            // Dropping `rows` resets the statement, which ends its implicit read transaction.
            let mut rows = prepared.raw_query();
            while let Some(row) = rows.next().map_err(failed)? {
                match decode(row) {
                    Ok(record) => out.push(record),
                    Err(e) => return Ok(Err(e)),
                }
            }
            Ok::<_, sqlx::Error>(Ok(out))
        })
        .map_err(|e| StoreError::Unavailable(e.to_string()))?
    }
}

/// Plans each prepared statement once, whatever its values (SQLite's "query planner stability
/// guarantee").
///
/// Without it, a statement whose plan read a bound value — `LIMIT $5`, or, with the bundled
/// library's STAT4 and statistics present, a constraint on an indexed column — is marked expired
/// by every bind and parsed and planned again on its next step: the run claim would be
/// re-prepared on every call (~100 µs of the group writer's time each in a profile,
/// BENCHMARKS.md). Our statements are written for one plan, so nothing is lost.
pub(crate) fn plan_once(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .map(drop)
}

/// Runs a transaction-control statement, prepared once per connection.
fn control(conn: &Connection, text: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(text)?.raw_execute().map(drop)
}

fn fetch_each(conn: &Connection, statements: &[Statement]) -> Result<Vec<AnyRow>, sqlx::Error> {
    let mut rows = Vec::new();
    for statement in statements {
        fetch_one_statement(conn, statement, &mut rows).map_err(failed)?;
    }
    Ok(rows)
}

fn fetch_one_statement(
    conn: &Connection,
    statement: &Statement,
    out: &mut Vec<AnyRow>,
) -> rusqlite::Result<()> {
    let mut prepared = conn.prepare_cached(&statement.text)?;
    crate::writer::bind(&mut prepared, statement.values())?;
    let count = prepared.column_count();
    let mut names = sqlx_core::HashMap::with_capacity(count);
    let mut columns = Vec::with_capacity(count);
    for ordinal in 0..count {
        let name = UStr::new(prepared.column_name(ordinal)?);
        names.insert(name.clone(), ordinal);
        columns.push(AnyColumn {
            ordinal,
            name,
            type_info: AnyTypeInfo {
                kind: AnyTypeInfoKind::Null,
            },
        });
    }
    let names = Arc::new(names);
    // Dropping `rows` resets the statement, which ends its implicit read transaction.
    let mut rows = prepared.raw_query();
    while let Some(row) = rows.next()? {
        let mut values = Vec::with_capacity(count);
        for ordinal in 0..count {
            values.push(AnyValue {
                kind: value_kind(row.get_ref(ordinal)?),
            });
        }
        let mut columns = columns.clone();
        for (column, value) in columns.iter_mut().zip(&values) {
            column.type_info = AnyTypeInfo {
                kind: type_of(&value.kind),
            };
        }
        out.push(AnyRow {
            column_names: names.clone(),
            columns,
            values,
        });
    }
    Ok(())
}

/// The value kind sqlx's SQLite driver gives a value of this storage class.
fn value_kind(value: ValueRef<'_>) -> AnyValueKind {
    match value {
        ValueRef::Null => AnyValueKind::Null(AnyTypeInfoKind::Null),
        ValueRef::Integer(i) => AnyValueKind::BigInt(i),
        ValueRef::Real(f) => AnyValueKind::Double(f),
        // `str::from_utf8` checks ASCII a word at a time; `from_utf8_lossy` walks byte by byte
        // even when, as always here, the text is valid.
        ValueRef::Text(t) => AnyValueKind::Text(Arc::new(match std::str::from_utf8(t) {
            Ok(text) => text.to_owned(),
            Err(_) => String::from_utf8_lossy(t).into_owned(),
        })),
        ValueRef::Blob(b) => AnyValueKind::Blob(Arc::new(b.to_vec())),
    }
}

fn type_of(kind: &AnyValueKind) -> AnyTypeInfoKind {
    match kind {
        AnyValueKind::BigInt(_) => AnyTypeInfoKind::BigInt,
        AnyValueKind::Double(_) => AnyTypeInfoKind::Double,
        AnyValueKind::Text(_) => AnyTypeInfoKind::Text,
        AnyValueKind::Blob(_) => AnyTypeInfoKind::Blob,
        _ => AnyTypeInfoKind::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::StatementStatus;

    /// Times a statement with a bound `LIMIT` was prepared again over `runs` binds and steps.
    fn reprepares(conn: &Connection, runs: i64) -> i32 {
        let mut statement = conn
            .prepare("SELECT x FROM t WHERE x > ?1 ORDER BY x LIMIT ?2")
            .unwrap();
        for n in 1..=runs {
            statement.raw_bind_parameter(1, 0).unwrap();
            statement.raw_bind_parameter(2, n).unwrap();
            let mut rows = statement.raw_query();
            while rows.next().unwrap().is_some() {}
        }
        statement.get_status(StatementStatus::RePrepare)
    }

    #[test]
    fn a_statement_planned_once_is_not_prepared_again_for_new_values() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE t (x INTEGER PRIMARY KEY); INSERT INTO t VALUES (1), (2), (3);",
        )
        .unwrap();
        assert!(
            reprepares(&conn, 5) >= 4,
            "the bundled SQLite re-prepares on every bind without the guarantee"
        );
        plan_once(&conn).unwrap();
        assert_eq!(reprepares(&conn, 5), 0);
    }
}
