//! PostgreSQL connections for point reads ([`crate::Store::fetch_all`], [`crate::Store::decode`]),
//! speaking the wire protocol as the group writer does (`pg_wire.rs`), outside sqlx.
//!
//! A point read is one or two small statements: sqlx's driver spent more on it than the server
//! did (its statement cache look-up, its message decoding, its `PgRow` built and then converted
//! to an `AnyRow`: ~0.1 ms of the node's CPU per awaited execution in the engine bench's
//! profile, BENCHMARKS.md). Here the statements go as one pipeline with one `Sync` (each
//! prepared once per connection), the answers come back in binary and are decoded where they
//! are read: straight into records ([`PgReaders::decode`], the hot reads, no row built), or
//! into sqlx's `AnyRow`s with the value kinds sqlx's own PostgreSQL driver gives, so that every
//! other reader decodes them as it did ([`PgReaders::fetch`]).
//!
//! sqlx's pool would also ping every connection it takes back (one more round trip per read,
//! which the server, on the same cores as the node in a small deployment, answers too). A
//! connection comes back here only when its statements ran to completion: its read has just
//! been answered. A read cancelled midway (its request dropped) drops its connection with it,
//! since the session may be halfway through an exchange; so does a read that failed, whatever
//! the error (a server shutting down answers with an error before it closes the connection),
//! and the next read opens another. Before a connection is lent again, what the server sent
//! meanwhile is looked at without waiting (a connection it closed, or ended with an error, is
//! dropped); one left idle for [`IDLE_BEFORE_PING`] or longer is pinged first (a server gone
//! without closing anything says nothing), as the pool's are ([`crate::Store`]'s options).

use crate::IDLE_BEFORE_PING;
use crate::pg_wire::{Request, Wire, WireError};
use crate::pg_writer::{Param, Target, pg_type};
use crate::rows::{Columns, corrupt};
use crate::sql::{Sql, Statement, value_bytes};
use capstan_core::store::StoreError;
use fallible_iterator::FallibleIterator;
use postgres_protocol::message::backend::{DataRowBody, Message, RowDescriptionBody};
use postgres_protocol::types as wire_types;
use sqlx::any::AnyRow;
use sqlx_core::any::{AnyColumn, AnyTypeInfo, AnyTypeInfoKind, AnyValue, AnyValueKind};
use sqlx_core::ext::ustr::UStr;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_postgres::types::{ToSql, Type};

/// Point-read connections open at once at most; a read beyond them waits for one.
pub(crate) const PG_READERS: usize = 8;

/// How long a read waits for a connection (a free one, or a new one to open) before it fails
/// as the pool's do after their acquire timeout: a transient error, answered 503.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct PgReaders {
    /// Where to connect, or why the URL cannot say (every read fails with it, as sqlx's
    /// connections would).
    target: Result<Target, String>,
    /// Connections not lent, each with when it came back.
    idle: Mutex<Vec<(Wire, Instant)>>,
    permits: Semaphore,
}

impl std::fmt::Debug for PgReaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idle = self.idle.lock().map_or(0, |idle| idle.len());
        f.debug_struct("PgReaders")
            .field("idle", &idle)
            .field("available", &self.permits.available_permits())
            .finish_non_exhaustive()
    }
}

impl PgReaders {
    pub(crate) fn new(url: &str) -> Self {
        Self {
            target: crate::pg_writer::config(url, "point reader"),
            idle: Mutex::default(),
            permits: Semaphore::new(PG_READERS),
        }
    }

    /// Runs `sql`'s statements as one pipeline on one connection and returns all their rows, in
    /// order, as sqlx's PostgreSQL driver would give them through `Any`.
    pub(crate) async fn fetch(&self, sql: Sql) -> Result<Vec<AnyRow>, sqlx::Error> {
        let mut rows = Vec::new();
        let mut columns = RowShape::default();
        let mut ranges = Vec::new();
        self.run(sql.statements(), |message| {
            match message {
                Message::RowDescription(body) => columns = RowShape::of(&body)?,
                Message::DataRow(body) => rows.push(columns.row(&body, &mut ranges)?),
                _ => {}
            }
            Ok::<_, sqlx::Error>(())
        })
        .await?;
        Ok(rows)
    }

    /// Runs `read` and decodes each row as it is read (`rows.rs`): no `AnyRow` is built and no
    /// text copied that the records do not keep. The first row that does not decode fails the
    /// read with its error.
    pub(crate) async fn decode<T: Send>(
        &self,
        read: &Sql,
        mut decode: impl FnMut(&dyn Columns) -> Result<T, StoreError> + Send,
    ) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::new();
        let mut kinds = Vec::new();
        let mut ranges = Vec::new();
        self.run(read.statements(), |message| {
            match message {
                Message::RowDescription(body) => kinds = described(&body)?,
                Message::DataRow(body) => {
                    split(&body, &mut ranges)?;
                    out.push(decode(&Values {
                        kinds: &kinds,
                        buffer: body.buffer(),
                        ranges: &ranges,
                    })?);
                }
                _ => {}
            }
            Ok::<_, StoreError>(())
        })
        .await?;
        Ok(out)
    }

    /// Runs `statements` as one pipeline on a connection of the pool, handing `answer` each
    /// statement's `RowDescription` and `DataRow`s, and keeps the connection when all went well.
    async fn run<E: From<WireError>>(
        &self,
        statements: &[Statement],
        mut answer: impl FnMut(Message) -> Result<(), E> + Send,
    ) -> Result<(), E> {
        // Owned by this future: dropped with it if the read is cancelled.
        let (_permit, mut wire) = tokio::time::timeout(ACQUIRE_TIMEOUT, async {
            let permit = self
                .permits
                .acquire()
                .await
                .map_err(|_| WireError::Io("the point readers are closed".to_owned()))?;
            Ok::<_, WireError>((permit, self.take().await?))
        })
        .await
        .map_err(|_| WireError::Io("timed out waiting for a connection to read on".to_owned()))??;
        let types: Vec<Vec<Type>> = statements
            .iter()
            .map(|s| s.values().iter().map(pg_type).collect())
            .collect();
        let params: Vec<Vec<Param<'_>>> = statements
            .iter()
            .map(|s| s.values().iter().map(Param).collect())
            .collect();
        let values: Vec<Vec<&(dyn ToSql + Sync)>> = params
            .iter()
            .map(|p| p.iter().map(|v| v as &(dyn ToSql + Sync)).collect())
            .collect();
        let requests: Vec<Request<'_>> = statements
            .iter()
            .zip(types.iter().zip(&values))
            .map(|(statement, (types, values))| Request {
                text: &statement.text,
                types,
                values,
                bytes: statement.values().iter().map(|v| 8 + value_bytes(v)).sum(),
            })
            .collect();
        wire.query(&requests, |_, message| answer(message)).await?;
        self.give_back(wire);
        Ok(())
    }

    /// An idle connection that answers (the most recently used first), or a new one.
    async fn take(&self) -> Result<Wire, WireError> {
        loop {
            let popped = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            let Some((mut wire, since)) = popped else {
                break;
            };
            if !wire.is_open() {
                continue;
            }
            if since.elapsed() < IDLE_BEFORE_PING
                || wire.query::<WireError>(&[], |_, _| Ok(())).await.is_ok()
            {
                return Ok(wire);
            }
            // Gone stale: dropped; try the next one.
        }
        let target = self.target.as_ref().map_err(|e| WireError::Io(e.clone()))?;
        Wire::connect(target).await
    }

    fn give_back(&self, wire: Wire) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((wire, Instant::now()));
    }
}

/// The kind sqlx's `Any` driver gives a PostgreSQL type (by its OID, which PostgreSQL fixes for
/// its built-in types), or the error it gives for one it does not support.
fn any_kind(oid: u32) -> Result<AnyTypeInfoKind, String> {
    Ok(match oid {
        16 => AnyTypeInfoKind::Bool,
        17 => AnyTypeInfoKind::Blob,
        20 => AnyTypeInfoKind::BigInt,
        21 => AnyTypeInfoKind::SmallInt,
        23 => AnyTypeInfoKind::Integer,
        25 | 1043 => AnyTypeInfoKind::Text,
        700 => AnyTypeInfoKind::Real,
        701 => AnyTypeInfoKind::Double,
        2278 => AnyTypeInfoKind::Null,
        other => {
            let name = Type::from_oid(other).map_or_else(|| other.to_string(), |t| t.to_string());
            return Err(format!(
                "the Any driver does not support the PostgreSQL type {name}"
            ));
        }
    })
}

/// A statement's result columns: each one's kind, or why it has none.
fn described(body: &RowDescriptionBody) -> Result<Vec<Result<AnyTypeInfoKind, String>>, WireError> {
    body.fields()
        .map(|field| Ok(any_kind(field.type_oid())))
        .collect()
        .map_err(malformed)
}

/// A row's values as ranges of its buffer (`None`: NULL), into `ranges`.
fn split(body: &DataRowBody, ranges: &mut Vec<Option<Range<usize>>>) -> Result<(), WireError> {
    ranges.clear();
    let mut values = body.ranges();
    while let Some(range) = values.next().map_err(malformed)? {
        ranges.push(range);
    }
    Ok(())
}

fn malformed(e: std::io::Error) -> WireError {
    WireError::Io(format!("a malformed answer: {e}"))
}

/// One row's values in PostgreSQL's binary format, read by position (`rows.rs`).
struct Values<'a> {
    kinds: &'a [Result<AnyTypeInfoKind, String>],
    buffer: &'a [u8],
    ranges: &'a [Option<Range<usize>>],
}

impl Values<'_> {
    /// The value's kind and bytes; `None` for NULL.
    fn value(&self, at: usize) -> Result<Option<(AnyTypeInfoKind, &[u8])>, StoreError> {
        let kind = match self.kinds.get(at) {
            Some(Ok(kind)) => *kind,
            Some(Err(e)) => return Err(corrupt(at, e)),
            None => return Err(corrupt(at, "no such column")),
        };
        let range = self
            .ranges
            .get(at)
            .ok_or_else(|| corrupt(at, "no such value"))?;
        Ok(range.clone().map(|range| (kind, &self.buffer[range])))
    }
}

impl Columns for Values<'_> {
    fn text(&self, at: usize) -> Result<Option<&str>, StoreError> {
        match self.value(at)? {
            None => Ok(None),
            Some((AnyTypeInfoKind::Text, bytes)) => wire_types::text_from_sql(bytes)
                .map(Some)
                .map_err(|e| corrupt(at, e)),
            Some((kind, _)) => Err(corrupt(at, format!("{kind:?} where text was expected"))),
        }
    }

    fn int(&self, at: usize) -> Result<Option<i64>, StoreError> {
        let Some((kind, bytes)) = self.value(at)? else {
            return Ok(None);
        };
        match kind {
            AnyTypeInfoKind::SmallInt => wire_types::int2_from_sql(bytes).map(i64::from),
            AnyTypeInfoKind::Integer => wire_types::int4_from_sql(bytes).map(i64::from),
            AnyTypeInfoKind::BigInt => wire_types::int8_from_sql(bytes),
            kind => {
                return Err(corrupt(
                    at,
                    format!("{kind:?} where an integer was expected"),
                ));
            }
        }
        .map(Some)
        .map_err(|e| corrupt(at, e))
    }
}

/// A statement's result columns as `AnyRow`s carry them.
#[derive(Default)]
struct RowShape {
    names: Arc<sqlx_core::HashMap<UStr, usize>>,
    columns: Vec<AnyColumn>,
    /// A column of a type sqlx's `Any` does not support, and why: the error for the first row.
    unsupported: Option<(String, String)>,
}

impl RowShape {
    fn of(body: &RowDescriptionBody) -> Result<Self, WireError> {
        let mut names = sqlx_core::HashMap::default();
        let mut columns = Vec::new();
        let mut unsupported = None;
        let mut fields = body.fields();
        while let Some(field) = fields.next().map_err(malformed)? {
            let ordinal = columns.len();
            let name = UStr::new(field.name());
            names.insert(name.clone(), ordinal);
            let kind = any_kind(field.type_oid()).unwrap_or_else(|e| {
                unsupported.get_or_insert((field.name().to_owned(), e));
                AnyTypeInfoKind::Null
            });
            columns.push(AnyColumn {
                ordinal,
                name,
                type_info: AnyTypeInfo { kind },
            });
        }
        Ok(Self {
            names: Arc::new(names),
            columns,
            unsupported,
        })
    }

    /// One row, its values of the kinds sqlx's driver decodes them as.
    fn row(
        &self,
        body: &DataRowBody,
        ranges: &mut Vec<Option<Range<usize>>>,
    ) -> Result<AnyRow, sqlx::Error> {
        if let Some((column, e)) = &self.unsupported {
            // As sqlx's driver says it.
            return Err(sqlx::Error::ColumnDecode {
                index: column.clone(),
                source: Box::new(sqlx::Error::AnyDriverError(e.clone().into())),
            });
        }
        split(body, ranges)?;
        let buffer = body.buffer();
        let mut values = Vec::with_capacity(self.columns.len());
        for (column, range) in self.columns.iter().zip(ranges.iter()) {
            let kind = column.type_info.kind;
            let value = match range {
                None => AnyValueKind::Null(kind),
                Some(range) => value_of(kind, &buffer[range.clone()]).map_err(|source| {
                    sqlx::Error::ColumnDecode {
                        index: column.ordinal.to_string(),
                        source,
                    }
                })?,
            };
            values.push(AnyValue { kind: value });
        }
        if values.len() != self.columns.len() {
            return Err(WireError::Io("a row of fewer values than columns".to_owned()).into());
        }
        Ok(AnyRow {
            column_names: self.names.clone(),
            columns: self.columns.clone(),
            values,
        })
    }
}

type DecodeError = Box<dyn std::error::Error + Sync + Send>;

/// A value in PostgreSQL's binary format as the kind sqlx's driver gives its column.
fn value_of(kind: AnyTypeInfoKind, bytes: &[u8]) -> Result<AnyValueKind, DecodeError> {
    Ok(match kind {
        AnyTypeInfoKind::Null => AnyValueKind::Null(AnyTypeInfoKind::Null),
        AnyTypeInfoKind::Bool => AnyValueKind::Bool(wire_types::bool_from_sql(bytes)?),
        AnyTypeInfoKind::SmallInt => AnyValueKind::SmallInt(wire_types::int2_from_sql(bytes)?),
        AnyTypeInfoKind::Integer => AnyValueKind::Integer(wire_types::int4_from_sql(bytes)?),
        AnyTypeInfoKind::BigInt => AnyValueKind::BigInt(wire_types::int8_from_sql(bytes)?),
        AnyTypeInfoKind::Real => AnyValueKind::Real(wire_types::float4_from_sql(bytes)?),
        AnyTypeInfoKind::Double => AnyValueKind::Double(wire_types::float8_from_sql(bytes)?),
        AnyTypeInfoKind::Blob => {
            AnyValueKind::Blob(Arc::new(wire_types::bytea_from_sql(bytes).to_vec()))
        }
        AnyTypeInfoKind::Text => {
            AnyValueKind::Text(Arc::new(wire_types::text_from_sql(bytes)?.to_owned()))
        }
    })
}

/// A database error, as sqlx's callers look at one (its SQLSTATE, its message).
#[derive(Debug)]
struct DbError {
    code: String,
    message: String,
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for DbError {}

impl sqlx::error::DatabaseError for DbError {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(self.code.as_str().into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        use sqlx::error::ErrorKind;
        // SQLSTATE class 23, as sqlx's PostgreSQL driver tells them.
        match self.code.as_str() {
            "23505" => ErrorKind::UniqueViolation,
            "23503" => ErrorKind::ForeignKeyViolation,
            "23502" => ErrorKind::NotNullViolation,
            "23514" => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

impl From<WireError> for sqlx::Error {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Db { code, message } => {
                sqlx::Error::Database(Box::new(DbError { code, message }))
            }
            WireError::Encode(e) => sqlx::Error::Encode(e.into()),
            WireError::Io(e) => sqlx::Error::Io(std::io::Error::other(e)),
        }
    }
}

impl From<WireError> for StoreError {
    fn from(e: WireError) -> Self {
        StoreError::Unavailable(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Row as _;

    async fn readers() -> (PgReaders, String) {
        let url = capstan_testdb::fresh_postgres_url().await;
        // What `Store::open` does before it connects anything.
        sqlx::any::install_default_drivers();
        (PgReaders::new(&url), url)
    }

    /// The server process behind the connection a read was lent.
    async fn backend(readers: &PgReaders) -> Result<i32, sqlx::Error> {
        let rows = readers
            .fetch(Sql::new("SELECT pg_backend_pid() AS pid"))
            .await?;
        Ok(rows[0].get::<i32, _>("pid"))
    }

    fn idle(readers: &PgReaders) -> usize {
        readers.idle.lock().unwrap().len()
    }

    /// Ends a server process from a session of its own, as an operator or a restart would, and
    /// waits until it is gone (it sends its connection a last error before it exits).
    async fn terminate(url: &str, pid: i32) {
        let mut other = <sqlx::PgConnection as sqlx::Connection>::connect(url)
            .await
            .unwrap();
        let ended: (bool,) = sqlx::query_as("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&mut other)
            .await
            .unwrap();
        assert!(ended.0, "backend {pid} ended");
        for _ in 0..500 {
            let alive: (i64,) =
                sqlx::query_as("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
                    .bind(pid)
                    .fetch_one(&mut other)
                    .await
                    .unwrap();
            if alive.0 == 0 {
                // Its last words are on the loopback by now; let them land.
                tokio::time::sleep(Duration::from_millis(50)).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("backend {pid} still runs");
    }

    #[tokio::test]
    async fn a_read_gives_its_connection_back_and_the_next_read_uses_it() {
        let (readers, _) = readers().await;
        let first = backend(&readers).await.unwrap();
        assert_eq!(idle(&readers), 1);
        assert_eq!(backend(&readers).await.unwrap(), first);
        let statements = {
            let mut sql = Sql::new("SELECT 1 AS n");
            sql.push_statement("SELECT $1::int4 AS n WHERE $2::text = 'yes'")
                .bind(2_i32)
                .bind("yes".to_owned());
            sql.push_statement("SELECT 3 AS n WHERE false");
            sql.push_statement("SELECT 4 AS n");
            sql
        };
        let rows = readers.fetch(statements).await.unwrap();
        let numbers: Vec<i32> = rows.iter().map(|r| r.get::<i32, _>("n")).collect();
        assert_eq!(numbers, [1, 2, 4], "every statement's rows, in order");
        assert_eq!(backend(&readers).await.unwrap(), first);
        assert_eq!(idle(&readers), 1);
    }

    /// The rows come back as sqlx's own PostgreSQL driver gives them through `Any`: the same
    /// columns, names and kinds, the same values, NULL kept with its column's kind, and the
    /// same refusal of a type `Any` does not support.
    #[tokio::test]
    async fn rows_are_what_sqlx_gives_through_any() {
        use sqlx::{Column as _, TypeInfo as _};
        let (readers, url) = readers().await;
        let select = "SELECT true AS b, CAST(-2 AS SMALLINT) AS s, CAST($1 AS INTEGER) AS i,
                CAST(9007199254740993 AS BIGINT) AS l, CAST(1.5 AS REAL) AS f,
                CAST(-2.25 AS DOUBLE PRECISION) AS d, CAST('\\x00ff10' AS BYTEA) AS y,
                CAST($2 AS TEXT) AS t, CAST('vé' AS VARCHAR) AS v, CAST(NULL AS BIGINT) AS n,
                CAST(NULL AS TEXT) AS nt";
        let read = || Sql::new(select).arg(7_i32).arg("tèxt ✓".to_owned());
        let ours = readers.fetch(read()).await.unwrap();
        let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&url)
            .await
            .unwrap();
        let theirs = read().build().fetch_all(&mut conn).await.unwrap();
        assert_eq!((ours.len(), theirs.len()), (1, 1));
        let (ours, theirs) = (&ours[0], &theirs[0]);
        let columns = |row: &AnyRow| -> Vec<(String, String)> {
            row.columns()
                .iter()
                .map(|c| (c.name().to_owned(), c.type_info().name().to_owned()))
                .collect()
        };
        assert_eq!(columns(ours), columns(theirs));
        for row in [ours, theirs] {
            assert!(row.get::<bool, _>("b"));
            assert_eq!(row.get::<i16, _>("s"), -2);
            assert_eq!(row.get::<i32, _>("i"), 7);
            assert_eq!(row.get::<i64, _>("l"), 9_007_199_254_740_993);
            assert_eq!(row.get::<f32, _>("f"), 1.5);
            assert_eq!(row.get::<f64, _>("d"), -2.25);
            assert_eq!(row.get::<Vec<u8>, _>("y"), [0x00, 0xff, 0x10]);
            assert_eq!(row.get::<String, _>("t"), "tèxt ✓");
            assert_eq!(row.get::<&str, _>("v"), "vé");
            assert_eq!(row.get::<Option<i64>, _>("n"), None);
            assert_eq!(row.get::<Option<String>, _>(10), None);
            assert!(row.try_get::<String, _>("l").is_err(), "no integer as text");
        }
        let numeric = || Sql::new("SELECT CAST(1 AS NUMERIC) AS x");
        let Err(ours) = readers.fetch(numeric()).await else {
            panic!("a NUMERIC read through Any");
        };
        let Err(theirs) = numeric().build().fetch_all(&mut conn).await else {
            panic!("a NUMERIC read through sqlx's Any");
        };
        for error in [ours, theirs] {
            assert!(
                matches!(&error, sqlx::Error::ColumnDecode { index, .. } if index == "x"),
                "{error}"
            );
        }
        // No row, no value to refuse: an empty result of that type reads as no rows.
        let none = Sql::new("SELECT CAST(1 AS NUMERIC) AS x WHERE false");
        assert!(readers.fetch(none).await.unwrap().is_empty());
    }

    /// Decoded reads hand each row's values to the record decoder by position: text and
    /// integers of every width, NULLs, and an error naming the column for a value of another
    /// kind, which fails the read and drops its connection.
    #[tokio::test]
    async fn decoded_reads_give_records_and_refuse_values_of_another_kind() {
        let (readers, _) = readers().await;
        let read = Sql::new(
            "SELECT CAST(n AS TEXT), CAST(n AS SMALLINT), CAST(n AS INTEGER), CAST(n AS BIGINT),
                    CAST(NULL AS TEXT)
             FROM generate_series(1, $1) AS n",
        )
        .arg(3_i64);
        let rows = readers
            .decode(&read, |row| {
                Ok((
                    row.text(0)?.unwrap().to_owned(),
                    row.int(1)?,
                    row.int(2)?,
                    row.int(3)?,
                    row.text(4)?.map(str::to_owned),
                ))
            })
            .await
            .unwrap();
        let expected: Vec<_> = (1..=3_i64)
            .map(|n| (n.to_string(), Some(n), Some(n), Some(n), None))
            .collect();
        assert_eq!(rows, expected);
        assert_eq!(idle(&readers), 1);
        let error = readers.decode(&read, |row| row.int(0)).await.unwrap_err();
        assert!(
            matches!(&error, StoreError::Corrupt(m) if m.starts_with("column 0")),
            "{error:?}"
        );
        let error = readers
            .decode(&read, |row| row.text(1).map(|t| t.map(str::to_owned)))
            .await
            .unwrap_err();
        assert!(matches!(error, StoreError::Corrupt(_)), "{error:?}");
        assert_eq!(idle(&readers), 0, "a failed read's connection was dropped");
        let gone = readers
            .decode(&read, |row| row.text(9).map(|t| t.map(str::to_owned)))
            .await
            .unwrap_err();
        assert!(matches!(gone, StoreError::Corrupt(_)), "{gone:?}");
    }

    #[tokio::test]
    async fn a_failed_or_cancelled_read_drops_its_connection_and_the_next_read_opens_another() {
        let (readers, _) = readers().await;
        let first = backend(&readers).await.unwrap();
        let Err(error) = readers.fetch(Sql::new("SELECT 1 / 0")).await else {
            panic!("1 / 0 answered");
        };
        let sqlx::Error::Database(error) = error else {
            panic!("{error}");
        };
        assert_eq!(error.code().as_deref(), Some("22012"), "division by zero");
        assert_eq!(
            idle(&readers),
            0,
            "the failed read's connection was dropped"
        );
        let second = backend(&readers).await.unwrap();
        assert_ne!(second, first);
        // Cancelled while the server is still working on it: the session is mid-exchange.
        let cancelled = tokio::time::timeout(
            Duration::from_millis(100),
            readers.fetch(Sql::new("SELECT pg_sleep(2)")),
        )
        .await;
        assert!(cancelled.is_err(), "the read was cancelled");
        assert_eq!(
            idle(&readers),
            0,
            "the cancelled read's connection was dropped"
        );
        let third = backend(&readers).await.unwrap();
        assert_ne!(third, second);
        assert_eq!(
            readers.permits.available_permits(),
            PG_READERS,
            "no permit kept by a read that ended"
        );
    }

    /// A connection the server closed (its process ended, as on a restart) is not lent again,
    /// whether it was used a moment ago or has been idle long enough to be pinged first: no
    /// read fails for it.
    #[tokio::test]
    async fn a_connection_the_server_closed_is_not_lent_again() {
        let (readers, url) = readers().await;
        let first = backend(&readers).await.unwrap();
        terminate(&url, first).await;
        let second = backend(&readers).await.unwrap();
        assert_ne!(second, first);
        terminate(&url, second).await;
        tokio::time::sleep(IDLE_BEFORE_PING + Duration::from_millis(100)).await;
        let third = backend(&readers).await.unwrap();
        assert_ne!(third, second);
        // Idle long enough to be pinged, and still served by the same process.
        tokio::time::sleep(IDLE_BEFORE_PING + Duration::from_millis(100)).await;
        assert_eq!(backend(&readers).await.unwrap(), third);
    }
}
