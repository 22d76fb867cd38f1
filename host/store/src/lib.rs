//! # capstan-store
//!
//! Storage on sqlx, on either backend:
//! - **SQLite** (WAL), the embedded default: one file under the data directory;
//! - **PostgreSQL**, when several `capstan serve` nodes share the work (`--database postgres://…`).
//!
//! One SQL dialect serves both — the common subset of SQLite ≥ 3.35 and PostgreSQL (`$N`
//! placeholders, `ON CONFLICT`, `RETURNING`, integers as 64-bit, JSON as text) — executed through
//! sqlx's `Any` driver, so every query exists once and one conformance suite holds both backends to
//! it. What differs lives here, behind [`Backend`]: migrations (one directory per backend), how a
//! write transaction begins, run claiming (`FOR UPDATE SKIP LOCKED` on PostgreSQL), outbox
//! ordering across nodes and cross-node wake-ups (`LISTEN/NOTIFY`).
//!
//! This crate owns the schema and the SQL; it must not know about HTTP or wasmtime.

pub mod auth;
mod engine;
pub mod event_versions;
mod gather;
mod pg_reader;
mod pg_tls;
mod pg_wire;
mod pg_writer;
mod reader;
pub mod retention;
mod rows;
pub mod sql;
pub mod streams;
pub mod subscriptions;
mod wakes;
mod writer;

pub use wakes::{Wake, WakeOn};

pub use sql::Sql;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{Any, AnyPool, Transaction};
use std::time::Duration;

/// Why the store could not be opened, migrated or reached (the engine's calls answer
/// [`capstan_core::store::StoreError`]).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("unsupported database URL `{0}` (expected sqlite://PATH or postgres://USER@HOST/DB)")]
    UnsupportedUrl(String),
    #[error("cannot create the database directory {path}: {source}")]
    CreateDir {
        path: String,
        source: std::io::Error,
    },
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database URL: `synchronous={0}` is not a mode (full or normal)")]
    Synchronous(String),
}

/// How SQLite commits reach the disk: the database URL's `synchronous` parameter
/// (`sqlite://data/capstan.db?synchronous=normal`); PostgreSQL has its own
/// (`synchronous_commit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Every commit is on disk before it is answered (the group writer shares one fsync among
    /// the commits of a group): an acknowledged change survives power loss and OS crashes.
    #[default]
    Full,
    /// WAL without a sync per commit: an acknowledged change survives the process being killed,
    /// but power loss or an OS crash may undo the last commits before a checkpoint.
    Normal,
}

impl Synchronous {
    /// What every connection that writes runs first (WAL is the file's, set by the first).
    fn pragmas(self) -> &'static str {
        match self {
            Self::Full => {
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 5000; PRAGMA foreign_keys = ON"
            }
            Self::Normal => {
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000; PRAGMA foreign_keys = ON"
            }
        }
    }

    /// `url` without its `synchronous` parameter, and the mode it names (full when absent).
    fn split(url: &str) -> Result<(String, Self), OpenError> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), Self::default()));
        };
        let mut mode = Self::default();
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("synchronous", value)) => {
                    mode = match value.to_ascii_lowercase().as_str() {
                        "full" => Self::Full,
                        "normal" => Self::Normal,
                        _ => return Err(OpenError::Synchronous(value.to_owned())),
                    }
                }
                _ => kept.push(pair),
            }
        }
        Ok(if kept.is_empty() {
            (base.to_owned(), mode)
        } else {
            (format!("{base}?{}", kept.join("&")), mode)
        })
    }
}

/// Which database serves the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// The backend's name in metrics' labels.
    pub fn label(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }

    /// The backend a database URL names.
    pub fn of(url: &str) -> Option<Self> {
        if url.starts_with("sqlite:") {
            Some(Self::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Self::Postgres)
        } else {
            None
        }
    }

    /// The statement that opens a write transaction. SQLite: take the write lock up front
    /// (`BEGIN IMMEDIATE`) instead of failing half-way on a busy upgrade. PostgreSQL: row locks
    /// taken by each statement, READ COMMITTED.
    pub fn begin_write(self) -> &'static str {
        match self {
            Self::Sqlite => "BEGIN IMMEDIATE",
            Self::Postgres => "BEGIN",
        }
    }

    /// The backend of a pool opened by [`Store`].
    pub fn of_pool(pool: &AnyPool) -> Self {
        if pool.connect_options().database_url.scheme() == "sqlite" {
            Self::Sqlite
        } else {
            Self::Postgres
        }
    }
}

/// Begins a write transaction on `pool` (see [`Backend::begin_write`]).
pub async fn begin_write(pool: &AnyPool) -> Result<Transaction<'static, Any>, sqlx::Error> {
    count_write();
    pool.begin_with(Backend::of_pool(pool).begin_write()).await
}

static WRITE_TRANSACTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts one write transaction (an explicit one, or a single writing statement on its own).
pub fn count_write() {
    WRITE_TRANSACTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Write transactions this process has begun on any store so far (`/metrics`,
/// `capstan_store_write_transactions_total`; the bench divides it by executions).
pub fn write_transactions() -> u64 {
    WRITE_TRANSACTIONS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Runs not done, by state ([`Store::run_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunCounts {
    pub queued: i64,
    pub leased: i64,
    pub scheduled: i64,
    pub waiting: i64,
}

/// Describes the store's metrics to the process's recorder (a no-op without one).
pub fn describe_metrics() {
    metrics::describe_histogram!(
        COMMIT_BATCH_SIZE,
        "Batches of writes (one per caller: a trigger, a stage's durable point) carried by one database transaction."
    );
    metrics::describe_histogram!(
        COMMIT_DURATION,
        metrics::Unit::Seconds,
        "One write transaction, from its first statement to its commit, by backend."
    );
    metrics::describe_counter!(
        UNMERGED_RERUNS,
        "PostgreSQL group commits run again with their inserts unmerged because a merged insert failed."
    );
    metrics::describe_counter!(
        "capstan_executions_started_total",
        "Executions created, by workflow."
    );
    metrics::describe_counter!(
        "capstan_executions_finished_total",
        "Executions that reached a final status (succeeded, failed, canceled, rolled_back), by workflow and status."
    );
}

/// The name of the batch-size histogram, whose buckets the recorder sets apart (counts, not
/// seconds).
pub const COMMIT_BATCH_SIZE: &str = "capstan_store_commit_batch_size";
const COMMIT_DURATION: &str = "capstan_store_commit_duration_seconds";
/// PostgreSQL's group writer: groups run again unmerged (`pg_writer::merge_inserts`).
const UNMERGED_RERUNS: &str = "capstan_store_unmerged_reruns_total";

/// Records one committed transaction carrying `batches` callers' writes.
pub(crate) fn observe_commit(backend: &'static str, batches: usize, started: std::time::Instant) {
    metrics::histogram!(COMMIT_BATCH_SIZE, "backend" => backend).record(batches as f64);
    metrics::histogram!(COMMIT_DURATION, "backend" => backend)
        .record(started.elapsed().as_secs_f64());
}

/// The channel on which PostgreSQL nodes announce committed outbox events to each other.
pub const EVENTS_CHANNEL: &str = "capstan_events";

/// The database behind Capstan.
///
/// On SQLite, which allows one writer at a time, several connections racing for the write lock
/// spin in SQLite's busy handler (sleeps of 1–100 ms) and, under load, time out. So writes go
/// through a pool of exactly one connection, whose queue is fair and never sleeps, while reads use
/// their own pool and run concurrently (WAL). On PostgreSQL both are one pool.
#[derive(Debug, Clone)]
pub struct Store {
    backend: Backend,
    url: String,
    pool: AnyPool,
    writer: AnyPool,
    /// Bumped after every commit that wrote outbox events (wakes SSE streams and the webhook
    /// relay on this node; on PostgreSQL also when another node announces its events).
    events: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
    /// Bumped for events this node cannot attribute to an execution (a redelivery, another
    /// node's `NOTIFY` that names no executions): they wake the waiters of every execution too.
    foreign_events: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
    /// Bumped for every commit another node announces, and when the listener (re)connects
    /// (what was committed while it was not listening): wakes the engine's claimer.
    other_nodes: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
    /// The waiters of single executions ([`Store::wake_for`]).
    wakes: std::sync::Arc<wakes::ExecutionWakes>,
    /// This process's name in leases it takes through the store (webhook attempts).
    node_id: String,
    /// SQLite's commit durability (unused on PostgreSQL).
    synchronous: Synchronous,
    inner: std::sync::Arc<StoreState>,
}

/// In-memory state shared by the clones of a [`Store`].
#[derive(Debug)]
struct StoreState {
    /// Audit records waiting for the next group commit.
    audit: std::sync::Mutex<auth::AuditQueue>,
    /// Audit records written behind their answers ([`Store::insert_audit_behind`]).
    audit_behind: std::sync::Mutex<auth::BehindQueue>,
    /// How many of those are written (or given up on), for [`Store::audit_settled`].
    audit_written: tokio::sync::watch::Sender<u64>,
    /// When this node last wrote each API key's `lastUsedAt`.
    touched: std::sync::Mutex<std::collections::HashMap<String, i64>>,
    /// Recently read keys with their principals' grants ([`Store::api_keys_with_grants`]).
    keys: std::sync::Mutex<auth::KeyCache>,
    /// Transactions waiting for the writer pool's connection ([`Store::begin_write`]): the group
    /// writer's session gives it back at its next group when there are any.
    writer_wanted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Bytes the group writer's queue holds at most ([`writer::QUEUE_BYTES`]; smaller in tests).
    writer_queue_bytes: std::sync::atomic::AtomicUsize,
    /// The thread that commits groups (SQLite), started with the first group.
    group_writer: std::sync::OnceLock<Result<writer::GroupWriter, String>>,
    /// PostgreSQL's group writer, started with the first write that uses it (again if its
    /// runtime went away); `Some(None)` when it cannot be configured from the URL (a root
    /// certificate it names cannot be read).
    pg_writer: std::sync::Mutex<Option<Option<pg_writer::PgGroupWriter>>>,
    /// Writes made behind their answers and their epoch ([`Store::write_behind`]).
    behind: std::sync::Arc<writer::Behind>,
    /// SQLite read connections kept outside sqlx's pool ([`Store::read`]).
    readers: std::sync::Mutex<Vec<sqlx::AnyConnection>>,
    /// Bounds the SQLite read connections open at once (0 on PostgreSQL).
    reader_permits: std::sync::Arc<tokio::sync::Semaphore>,
    /// SQLite connections for point reads on the calling thread ([`Store::fetch_all`]).
    local_readers: std::sync::OnceLock<reader::Readers>,
    /// PostgreSQL connections for point reads, outside sqlx ([`Store::fetch_all`],
    /// [`Store::decode`]).
    pg_readers: std::sync::OnceLock<pg_reader::PgReaders>,
}

impl Default for StoreState {
    fn default() -> Self {
        Self {
            audit: Default::default(),
            audit_behind: Default::default(),
            audit_written: tokio::sync::watch::Sender::new(0),
            touched: Default::default(),
            keys: Default::default(),
            writer_wanted: Default::default(),
            writer_queue_bytes: std::sync::atomic::AtomicUsize::new(writer::QUEUE_BYTES),
            group_writer: Default::default(),
            pg_writer: Default::default(),
            behind: Default::default(),
            readers: Default::default(),
            reader_permits: std::sync::Arc::new(tokio::sync::Semaphore::new(0)),
            local_readers: Default::default(),
            pg_readers: Default::default(),
        }
    }
}

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

impl Store {
    /// Opens (creating if needed) the database at `url` and runs pending migrations.
    pub async fn open(url: &str) -> Result<Self, OpenError> {
        let store = Self::connect(url).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Opens without migrating.
    pub async fn connect(url: &str) -> Result<Self, OpenError> {
        sqlx::any::install_default_drivers();
        match Backend::of(url) {
            Some(Backend::Sqlite) => Self::connect_sqlite(url).await,
            Some(Backend::Postgres) => Self::connect_postgres(url).await,
            None => Err(OpenError::UnsupportedUrl(url.to_owned())),
        }
    }

    async fn connect_sqlite(url: &str) -> Result<Self, OpenError> {
        let (url, synchronous) = Synchronous::split(url)?;
        let url = url.as_str();
        let rest = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .unwrap_or(url);
        let path = rest.split('?').next().unwrap_or(rest);
        if path != ":memory:"
            && let Some(parent) = std::path::Path::new(path).parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent).map_err(|source| OpenError::CreateDir {
                path: parent.display().to_string(),
                source,
            })?;
        }
        // Create the file if missing; sqlx's SQLite driver keeps foreign keys on and a 5 s busy
        // timeout; WAL and the synchronous mode are set per connection.
        let url = if rest.contains("mode=") {
            format!("sqlite://{rest}")
        } else if rest.contains('?') {
            format!("sqlite://{rest}&mode=rwc")
        } else {
            format!("sqlite://{rest}?mode=rwc")
        };
        // No ping before each checkout: a SQLite connection is a file handle that does not go
        // stale, and the ping is one more round trip to the connection's thread per transaction.
        let options = || {
            AnyPoolOptions::new()
                .test_before_acquire(false)
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        use sqlx::Executor as _;
                        conn.execute(synchronous.pragmas()).await?;
                        Ok(())
                    })
                })
        };
        let pool = options().max_connections(8).connect(&url).await?;
        let writer = options()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&url)
            .await?;
        let mut store = Self::with_pools(Backend::Sqlite, url, pool, writer);
        store.synchronous = synchronous;
        Ok(store)
    }

    async fn connect_postgres(url: &str) -> Result<Self, OpenError> {
        // Each session starts with `PG_SESSION`. sqlx pings a connection when it goes back to
        // the pool, which drops one the server closed. Pinging again at each checkout doubles
        // that round trip for every read (5 % of the server's CPU in the engine bench, `perf
        // record`), so only a connection idle long enough for the server to have gone away
        // meanwhile is pinged (as HikariCP does). Point reads skip the pool (`pg_reader.rs`).
        let pool = AnyPoolOptions::new()
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= IDLE_BEFORE_PING {
                        use sqlx::Connection as _;
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .after_connect(|conn, _| {
                Box::pin(async move {
                    use sqlx::Executor as _;
                    conn.execute(PG_SESSION).await?;
                    Ok(())
                })
            })
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await?;
        Ok(Self::with_pools(
            Backend::Postgres,
            url.to_owned(),
            pool.clone(),
            pool,
        ))
    }

    fn with_pools(backend: Backend, url: String, pool: AnyPool, writer: AnyPool) -> Self {
        Self {
            backend,
            url,
            pool,
            writer,
            events: std::sync::Arc::new(tokio::sync::watch::Sender::new(0)),
            foreign_events: std::sync::Arc::new(tokio::sync::watch::Sender::new(0)),
            other_nodes: std::sync::Arc::new(tokio::sync::watch::Sender::new(0)),
            wakes: std::sync::Arc::default(),
            node_id: capstan_core::ids::new_id(),
            synchronous: Synchronous::default(),
            inner: std::sync::Arc::new(StoreState {
                reader_permits: std::sync::Arc::new(tokio::sync::Semaphore::new(
                    if backend == Backend::Sqlite {
                        READERS
                    } else {
                        0
                    },
                )),
                ..StoreState::default()
            }),
        }
    }

    /// This process's name in the leases it takes through the store.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL the store was opened with (PostgreSQL: for the `LISTEN` connection).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Begins a write transaction on the writer (see [`Backend::begin_write`]).
    pub async fn begin_write(&self) -> Result<Transaction<'static, Any>, sqlx::Error> {
        count_write();
        // Counted while it waits, so a group writer session hands the connection over soon.
        let _waiting = Waiting::new(&self.inner.writer_wanted);
        // A group writer waiting for company for writes behind answers commits them now.
        if let Some(Ok(writer)) = self.inner.group_writer.get() {
            writer.nudge();
        }
        self.writer.begin_with(self.backend.begin_write()).await
    }

    /// Wakes whoever waits for new outbox events on this node, the waiters of single
    /// executions included (the events' executions are not known here).
    pub fn events_committed(&self) {
        self.events.send_modify(|n| *n = n.wrapping_add(1));
        self.foreign_events.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// What a reader of events waits on: every commit that wrote events (`None`), or only
    /// those that wrote events of one execution (and events this node cannot attribute); see
    /// [`Store::wake_when_stopped`] for a waiter of its outcome.
    pub fn wake_for(&self, execution_id: Option<&str>) -> Wake {
        match execution_id {
            None => Wake::All(self.events.subscribe()),
            Some(id) => Wake::execution(
                &self.wakes,
                id,
                WakeOn::Events,
                self.foreign_events.subscribe(),
            ),
        }
    }

    /// What a waiter for one execution to stop moving waits on (out of `queued`/`running`:
    /// ended, waiting, paused): the commit that moved it so, and events this node cannot
    /// attribute.
    pub fn wake_when_stopped(&self, execution_id: &str) -> Wake {
        Wake::execution(
            &self.wakes,
            execution_id,
            WakeOn::Stopped,
            self.foreign_events.subscribe(),
        )
    }

    /// Changes after every commit that wrote outbox events on this node (and, on PostgreSQL,
    /// once [`Store::listen_for_events`] runs, on every other node).
    pub fn subscribe_events(&self) -> tokio::sync::watch::Receiver<u64> {
        self.events.subscribe()
    }

    /// Changes after every commit another node announces (PostgreSQL, once
    /// [`Store::listen_for_events`] runs; whether or not it wrote events of an execution this
    /// node waits on) and when the listener (re)connects. Never changes on SQLite.
    pub fn subscribe_other_nodes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.other_nodes.subscribe()
    }

    /// Another node committed, or may have while this node was not listening.
    fn other_nodes_committed(&self) {
        self.other_nodes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// PostgreSQL: relays other nodes' `NOTIFY capstan_events` (each signed with its node's id;
    /// this node's own are skipped) to [`Store::subscribe_events`], to the waiters of the
    /// executions each names and to [`Store::subscribe_other_nodes`], until `stop` turns true. Reconnects after a lost connection;
    /// readers poll as well, so a missed notification delays an event by at most their polling
    /// interval. SQLite: returns at once (one node, and its commits wake readers directly).
    pub async fn listen_for_events(&self, mut stop: tokio::sync::watch::Receiver<bool>) {
        if self.backend != Backend::Postgres {
            return;
        }
        loop {
            if *stop.borrow() {
                return;
            }
            match sqlx::postgres::PgListener::connect(&self.url).await {
                Ok(mut listener) => {
                    if let Err(error) = listener.listen(EVENTS_CHANNEL).await {
                        tracing::warn!(%error, "cannot LISTEN for events; retrying");
                    } else {
                        // Anything committed while we were not listening.
                        self.events_committed();
                        self.other_nodes_committed();
                        loop {
                            tokio::select! {
                                n = listener.try_recv() => match n {
                                    Ok(Some(n)) => self.announced(n.payload()),
                                    Ok(None) => {
                                        tracing::warn!("event listener lost its connection; reconnecting");
                                        self.events_committed();
                                        self.other_nodes_committed();
                                    }
                                    Err(error) => {
                                        tracing::warn!(%error, "event listener failed; reconnecting");
                                        break;
                                    }
                                },
                                // Also when the sender is gone: that means stop too.
                                _ = stop.wait_for(|s| *s) => return,
                            }
                        }
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot connect the event listener; retrying"),
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Wakes the readers another node's commit concerns (its `NOTIFY` payload, a
    /// [`wakes::Announcement`]): every reader of all events, and the waiters of the executions
    /// it names, or of every execution when it names none. This node's own commits woke its
    /// readers when they committed.
    fn announced(&self, payload: &str) {
        let announced = wakes::Announced::parse(payload);
        if announced.node_id == self.node_id {
            return;
        }
        self.other_nodes_committed();
        match announced.executions {
            Some((moved, stopped)) => {
                self.events.send_modify(|n| *n = n.wrapping_add(1));
                self.wakes.wake(moved, stopped);
            }
            None => self.events_committed(),
        }
    }

    /// Applies the store's own pending migrations (`host/store/migrations`).
    pub async fn migrate(&self) -> Result<(), OpenError> {
        match self.backend {
            Backend::Sqlite => SQLITE_MIGRATIONS.run(&self.writer).await?,
            Backend::Postgres => POSTGRES_MIGRATIONS.run(&self.writer).await?,
        }
        Ok(())
    }

    /// Applies a domain's pending migrations: a domain that keeps its tables beside its queries
    /// (booking's `host/booking/migrations`) hands its migrator for this store's backend here.
    /// The migrator must record its history in a table of its own
    /// (`Migrator::dangerous_set_table_name`), so that each history still refuses a changed or
    /// missing migration of its own instead of ignoring the other's.
    pub async fn migrate_domain(
        &self,
        migrator: &sqlx::migrate::Migrator,
    ) -> Result<(), OpenError> {
        debug_assert_ne!(migrator.table_name, SQLITE_MIGRATIONS.table_name);
        migrator.run(&self.writer).await?;
        Ok(())
    }

    /// The versions of the migrations applied so far.
    pub async fn applied_migrations(&self) -> Result<Vec<i64>, OpenError> {
        let rows: Vec<(i64,)> =
            sqlx::query_as("SELECT version FROM _sqlx_migrations ORDER BY version")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(|(v,)| v).collect())
    }

    /// Runs not done, by what they wait for (`/metrics`): `queued` (runnable, due, no live
    /// lease), `leased` (a node is running it), `scheduled` (runnable later: a timer, a retry)
    /// and `waiting` (for an approval, a signal or a command).
    pub async fn run_counts(&self, now_ms: i64) -> Result<RunCounts, sqlx::Error> {
        let (queued, leased, scheduled, waiting): (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT
                COALESCE(SUM(CASE WHEN state = 'runnable' AND COALESCE(lease_expires_ms, 0) > $1 THEN 1 ELSE 0 END), 0),
                COALESCE(SUM(CASE WHEN state = 'runnable' AND COALESCE(lease_expires_ms, 0) <= $1 AND wake_ms <= $1 THEN 1 ELSE 0 END), 0),
                COALESCE(SUM(CASE WHEN state = 'runnable' AND COALESCE(lease_expires_ms, 0) <= $1 AND wake_ms > $1 THEN 1 ELSE 0 END), 0),
                COALESCE(SUM(CASE WHEN state = 'waiting' THEN 1 ELSE 0 END), 0)
             FROM runs WHERE state IN ('runnable', 'waiting')",
        )
        .bind(now_ms)
        .fetch_one(&self.pool)
        .await
        .map(|(leased, queued, scheduled, waiting)| (queued, leased, scheduled, waiting))?;
        Ok(RunCounts {
            queued,
            leased,
            scheduled,
            waiting,
        })
    }

    /// A round trip to the database (readiness).
    pub async fn ping(&self) -> Result<(), OpenError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// A read connection for the hot read paths.
    ///
    /// SQLite: one of up to [`READERS`] connections kept outside sqlx's pool, because that pool
    /// pings every connection it takes back, and on SQLite a ping is one more round trip to the
    /// connection's thread (as costly as the query; measured in BENCHMARKS.md). A SQLite
    /// connection does not go stale, and a read-only one holds no transaction to flush.
    /// PostgreSQL: a connection of the pool, which can go stale and is checked as usual.
    pub async fn read(&self) -> Result<ReadConnection, sqlx::Error> {
        if self.backend == Backend::Postgres {
            return Ok(ReadConnection {
                conn: Some(Reader::Pooled(self.pool.acquire().await?)),
                store: self.inner.clone(),
                _permit: None,
            });
        }
        let permit = self
            .inner
            .reader_permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let idle = self
            .inner
            .readers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        let conn = match idle {
            Some(conn) => conn,
            None => {
                use sqlx::{ConnectOptions as _, Executor as _};
                let options: sqlx::any::AnyConnectOptions = self.url.parse()?;
                let mut conn = options.connect().await?;
                conn.execute(self.synchronous.pragmas()).await?;
                conn
            }
        };
        Ok(ReadConnection {
            conn: Some(Reader::Own(conn)),
            store: self.inner.clone(),
            _permit: Some(permit),
        })
    }

    /// Runs a read bounded by a key (an execution and its stages, a run's journal, a key and
    /// its grants) and returns its rows; a [`Sql`] of several statements returns all their
    /// rows, in order, read from one snapshot on SQLite.
    ///
    /// SQLite: on the calling thread, on a connection of its own (`reader.rs`): no hand-off to
    /// a connection thread, the rows come back together. The read blocks the thread while it
    /// runs, so scans and filtered lists use [`Store::read`] instead. PostgreSQL: the
    /// statements as one pipeline on a connection of the point readers (`pg_reader.rs`), which
    /// speak the wire protocol themselves.
    pub async fn fetch_all(&self, sql: Sql) -> Result<Vec<AnyRow>, sqlx::Error> {
        if let Some(readers) = self.point_readers() {
            return readers.fetch(sql.statements());
        }
        self.pg_readers().fetch(sql).await
    }

    /// A read of one statement bounded by a key, as [`Store::fetch_all`] runs it, each row
    /// decoded as it is read (`rows.rs`) instead of built as an `AnyRow` first: for the reads
    /// every awaited execution makes. The first row that does not decode fails the read.
    pub(crate) async fn decode<T: Send>(
        &self,
        read: &Sql,
        mut decode: impl FnMut(&dyn rows::Columns) -> Result<T, capstan_core::store::StoreError> + Send,
    ) -> Result<Vec<T>, capstan_core::store::StoreError> {
        if let Some(readers) = self.point_readers() {
            return readers.decode(read, |row| decode(row));
        }
        self.pg_readers().decode(read, decode).await
    }

    fn pg_readers(&self) -> &pg_reader::PgReaders {
        self.inner
            .pg_readers
            .get_or_init(|| pg_reader::PgReaders::new(&self.url))
    }

    /// SQLite's point readers (`reader.rs`); `None` on PostgreSQL.
    pub(crate) fn point_readers(&self) -> Option<&reader::Readers> {
        (self.backend == Backend::Sqlite).then(|| {
            self.inner
                .local_readers
                .get_or_init(|| reader::Readers::new(self.sqlite_path()))
        })
    }

    /// [`Store::fetch_all`] for a read of one row at most: its first row.
    pub async fn fetch_optional(&self, sql: Sql) -> Result<Option<AnyRow>, sqlx::Error> {
        Ok(self.fetch_all(sql).await?.into_iter().next())
    }

    /// The SQLite database file's path (or `:memory:`), from the URL.
    fn sqlite_path(&self) -> String {
        let rest = self
            .url
            .strip_prefix("sqlite://")
            .or_else(|| self.url.strip_prefix("sqlite:"))
            .unwrap_or(&self.url);
        rest.split('?').next().unwrap_or(rest).to_owned()
    }

    /// The read pool.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Transactions this store's SQLite group writer has committed so far (a group that runs
    /// again without a failed part counts twice); `None` on PostgreSQL, and before the writer's
    /// first use. The process-wide count of write transactions is [`write_transactions`].
    pub fn group_commits(&self) -> Option<u64> {
        match self.inner.group_writer.get() {
            Some(Ok(writer)) => Some(writer.committed()),
            _ => None,
        }
    }

    /// SQLite's group writer (`writer.rs`), started on first use.
    pub(crate) fn group_writer(
        &self,
    ) -> Result<&writer::GroupWriter, capstan_core::store::StoreError> {
        self.inner
            .group_writer
            .get_or_init(|| {
                writer::GroupWriter::start(
                    self.sqlite_path(),
                    self.synchronous,
                    self.events.clone(),
                    self.inner.writer_wanted.clone(),
                    self.inner.behind.clone(),
                    self.inner
                        .writer_queue_bytes
                        .load(std::sync::atomic::Ordering::Relaxed),
                )
                .map_err(|e| format!("cannot start the SQLite group writer: {e}"))
            })
            .as_ref()
            .map_err(|e| capstan_core::store::StoreError::Unavailable(e.clone()))
    }

    /// PostgreSQL's group writer ([`pg_writer`]), or `None` when this store cannot use one
    /// (SQLite, or a URL it cannot be configured from: its writes take a transaction each).
    pub(crate) fn pg_writer(&self) -> Option<pg_writer::PgGroupWriter> {
        if self.backend != Backend::Postgres {
            return None;
        }
        let mut slot = self
            .inner
            .pg_writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot
            .as_ref()
            .is_some_and(|w| w.as_ref().is_some_and(|w| w.is_closed()))
        {
            *slot = None;
        }
        slot.get_or_insert_with(|| match pg_writer::config(&self.url, "group writer") {
            Ok(target) => Some(pg_writer::PgGroupWriter::start(
                target,
                self.node_id.clone(),
                self.events.clone(),
                self.inner.behind.clone(),
            )),
            Err(error) => {
                tracing::warn!(%error, "cannot configure the PostgreSQL group writer: each durable point commits in a transaction of its own");
                None
            }
        })
        .clone()
    }

    /// The write pool: every transaction that writes goes through it (SQLite: one connection).
    pub fn writer(&self) -> &AnyPool {
        &self.writer
    }
}

/// Counts a caller waiting for the writer pool while it lives (also when the future holding
/// it is dropped while it waits).
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// True when `e` says the database was busy or unreachable (answer 503 and retry), not that the
/// request or the data was wrong: SQLite's BUSY/LOCKED past the busy timeout, PostgreSQL's
/// serialization/deadlock/connection classes, a pool timeout or an I/O error.
pub fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            let code = code.as_ref();
            // SQLite primary codes 5 (BUSY) and 6 (LOCKED) with their extended forms.
            code.parse::<i64>().is_ok_and(|n| matches!(n & 0xff, 5 | 6))
                // PostgreSQL SQLSTATE classes 08 (connection), 40 (rollback: serialization,
                // deadlock), 53 (insufficient resources), 57P (operator intervention).
                || code.starts_with("08")
                || code.starts_with("40")
                || code.starts_with("53")
                || code.starts_with("57P")
                // 55P03: a lock not granted within `lock_timeout`.
                || code == "55P03"
        }),
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}

/// SQLite read connections [`Store::read`] keeps open at most.
pub const READERS: usize = 8;

/// A PostgreSQL connection idle at least this long is pinged before it is lent out; one used
/// more recently was answered by the server moments ago (and, in sqlx's pool, pinged when it
/// came back).
const IDLE_BEFORE_PING: Duration = Duration::from_secs(1);

/// What every PostgreSQL session of a node sets first: a statement waits at most 5 s for a lock
/// (as SQLite's busy timeout), then fails with 55P03 and the request answers 503 instead of
/// hanging.
const PG_SESSION: &str = "SET lock_timeout = '5s'";

enum Reader {
    Own(sqlx::AnyConnection),
    Pooled(sqlx::pool::PoolConnection<Any>),
}

/// A read connection from [`Store::read`]; use `&mut *conn` as the executor.
pub struct ReadConnection {
    conn: Option<Reader>,
    store: std::sync::Arc<StoreState>,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl std::ops::Deref for ReadConnection {
    type Target = sqlx::AnyConnection;
    fn deref(&self) -> &Self::Target {
        match &self.conn {
            Some(Reader::Own(c)) => c,
            Some(Reader::Pooled(c)) => c,
            None => unreachable!("taken only on drop"),
        }
    }
}

impl std::ops::DerefMut for ReadConnection {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match &mut self.conn {
            Some(Reader::Own(c)) => c,
            Some(Reader::Pooled(c)) => c,
            None => unreachable!("taken only on drop"),
        }
    }
}

impl Drop for ReadConnection {
    fn drop(&mut self) {
        // Back to the idle list before the permit is released (field order), so the next
        // reader finds it.
        if let Some(Reader::Own(conn)) = self.conn.take() {
            self.store
                .readers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(conn);
        }
    }
}

/// Reads a 0/1 integer column as a bool (both backends store flags as integers).
pub fn flag(row: &AnyRow, column: &str) -> bool {
    use sqlx::Row as _;
    row.try_get::<i64, _>(column).unwrap_or(0) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_database_url_chooses_normal_durability_explicitly_and_refuses_a_typo() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!(
            "sqlite://{}/capstan.db?synchronous=normal",
            dir.path().display()
        );
        let store = Store::open(&url).await.unwrap();
        for pool in [store.pool(), store.writer()] {
            let (sync,): (i64,) = sqlx::query_as("PRAGMA synchronous")
                .fetch_one(pool)
                .await
                .unwrap();
            assert_eq!(sync, 1, "synchronous = NORMAL as asked");
        }
        let bad = format!(
            "sqlite://{}/other.db?synchronous=fast",
            dir.path().display()
        );
        let e = Store::open(&bad).await.unwrap_err();
        assert!(e.to_string().contains("synchronous=fast"), "{e}");
        assert!(!dir.path().join("other.db").exists(), "nothing created");
        assert_eq!(
            Synchronous::split("sqlite://a.db?mode=rwc&synchronous=FULL").unwrap(),
            ("sqlite://a.db?mode=rwc".to_owned(), Synchronous::Full)
        );
    }

    #[tokio::test]
    async fn opens_a_file_database_in_wal_mode_and_migrates_once() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/nested/capstan.db", dir.path().display());
        let store = Store::open(&url).await.unwrap();
        store.ping().await.unwrap();
        let (mode,): (String,) = sqlx::query_as("PRAGMA journal_mode")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(mode, "wal");
        for pool in [store.pool(), store.writer()] {
            let (sync,): (i64,) = sqlx::query_as("PRAGMA synchronous")
                .fetch_one(pool)
                .await
                .unwrap();
            assert_eq!(sync, 2, "synchronous = FULL on every connection");
            let (fk,): (i64,) = sqlx::query_as("PRAGMA foreign_keys")
                .fetch_one(pool)
                .await
                .unwrap();
            assert_eq!(fk, 1);
        }
        let first = store.applied_migrations().await.unwrap();
        assert!(!first.is_empty());
        drop(store);
        let again = Store::open(&url).await.unwrap();
        assert_eq!(
            again.applied_migrations().await.unwrap(),
            first,
            "re-opening applies nothing new"
        );
    }

    /// A fresh database of the test's store, its migrations applied up to `sqlite` or `postgres`
    /// (whichever it is), to write rows as an older build did before [`Store::migrate`].
    async fn migrated_up_to(sqlite: i64, postgres: i64) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = capstan_testdb::fresh_database_url(dir.path()).await;
        let store = Store::connect(&url).await.unwrap();
        let (migrator, before) = match store.backend() {
            Backend::Sqlite => (&SQLITE_MIGRATIONS, sqlite),
            Backend::Postgres => (&POSTGRES_MIGRATIONS, postgres),
        };
        migrator.run_to(before, store.writer()).await.unwrap();
        (dir, store)
    }

    /// Journals written one row per call (before migration sqlite 0014 / postgres 0006) read
    /// back the same after it, answers, unanswered calls and all.
    #[tokio::test]
    async fn a_journal_written_row_per_call_reads_the_same_after_the_migration() {
        use capstan_core::store::{EntryStatus, JsonText, RunStore};
        let (_dir, store) = migrated_up_to(13, 5).await;
        for statement in [
            "INSERT INTO executions (id, workflow, principal_id, status, created_ms, input_json, run_id)
             VALUES ('e1', 'w', 'p', 'running', 1, '{}', 'r1')",
            "INSERT INTO runs (id, execution_id, workflow, digest, kind, state, wake_ms, created_ms)
             VALUES ('r1', 'e1', 'w', 'd', 'workflow', 'waiting', 1, 1)",
            r#"INSERT INTO journal (run_id, seq, op, request, response, status, at_ms) VALUES
             ('r1', 0, 'context.stage-begin', '{"name":"a"}', 'null', 'done', 10),
             ('r1', 1, 'dns.change-records', '{"zone_id":"Z","changes":[{"name":"x"}]}', '{"Ok":{"id":"C1"}}', 'done', 11),
             ('r1', 2, 'approvals.await-approval', '{"name":"go"}', NULL, 'waiting', 12)"#,
        ] {
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .execute(store.writer())
                .await
                .unwrap();
        }
        store.migrate().await.unwrap();
        let journal = store.journal("r1").await.unwrap();
        let read: Vec<_> = journal
            .iter()
            .map(|e| {
                (
                    e.seq,
                    e.op.as_str(),
                    e.request.value(),
                    e.response.as_ref().map(JsonText::value),
                    e.status,
                    e.at_ms,
                )
            })
            .collect();
        assert_eq!(
            read,
            vec![
                (
                    0,
                    "context.stage-begin",
                    serde_json::json!({"name": "a"}),
                    Some(serde_json::Value::Null),
                    EntryStatus::Done,
                    10
                ),
                (
                    1,
                    "dns.change-records",
                    serde_json::json!({"zone_id": "Z", "changes": [{"name": "x"}]}),
                    Some(serde_json::json!({"Ok": {"id": "C1"}})),
                    EntryStatus::Done,
                    11
                ),
                (
                    2,
                    "approvals.await-approval",
                    serde_json::json!({"name": "go"}),
                    None,
                    EntryStatus::Waiting,
                    12
                ),
            ]
        );
        assert!(journal.iter().all(|e| e.run_id == "r1"));
    }

    /// Audit records written before the table was keyed by time (sqlite 0023 / postgres 0018)
    /// read back the same after it, newest first, and new ones join them.
    #[tokio::test]
    async fn audit_records_read_the_same_after_the_table_is_keyed_by_time() {
        let (_dir, store) = migrated_up_to(22, 17).await;
        sqlx::query(
            "INSERT INTO audit_logs (id, at_ms, principal_id, action, method, route, resource, result, execution_id, ip, user_agent) VALUES
             ('a1', 10, 'alice', 'workflows:hello', 'GET', '/v1/executions/{id}', '/v1/executions/e1', 'allowed', 'e1', '127.0.0.1', 'curl/8'),
             ('a2', 10, 'bob', 'audit:read', 'GET', '/v1/audit-logs', '/v1/audit-logs', 'denied', NULL, NULL, NULL)",
        )
        .execute(store.writer())
        .await
        .unwrap();
        store.migrate().await.unwrap();
        let record = |id: &str, at_ms, principal: &str| crate::auth::AuditRecord {
            id: id.to_owned(),
            at_ms,
            principal_id: principal.to_owned(),
            action: "workflows:hello".to_owned(),
            method: "POST".to_owned(),
            route: "/v1/workflows/{name}".to_owned(),
            resource: "/v1/workflows/hello".to_owned(),
            result: "allowed".to_owned(),
            execution_id: None,
            ip: None,
            user_agent: None,
        };
        store
            .insert_audit(&record("a3", 11, "alice"))
            .await
            .unwrap();
        let read = store
            .audit(&crate::auth::AuditFilter {
                limit: 10,
                ..crate::auth::AuditFilter::default()
            })
            .await
            .unwrap();
        let rows: Vec<_> = read
            .iter()
            .map(|a| {
                (
                    a.id.as_str(),
                    a.at_ms,
                    a.principal_id.as_str(),
                    a.result.as_str(),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("a3", 11, "alice", "allowed"),
                ("a2", 10, "bob", "denied"),
                ("a1", 10, "alice", "allowed"),
            ]
        );
        let old = &read[2];
        assert_eq!(
            (
                old.execution_id.as_deref(),
                old.ip.as_deref(),
                old.user_agent.as_deref(),
                old.resource.as_str()
            ),
            (
                Some("e1"),
                Some("127.0.0.1"),
                Some("curl/8"),
                "/v1/executions/e1"
            )
        );
        let alices = store
            .audit(&crate::auth::AuditFilter {
                principal_id: Some("alice".to_owned()),
                since_ms: Some(10),
                until_ms: Some(11),
                limit: 10,
                ..crate::auth::AuditFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(
            alices.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
            ["a1"]
        );
    }

    fn insert_zone(id: &str) -> Sql {
        let mut sql = Sql::default();
        sql.push_statement("INSERT INTO sim_zones (id, name) VALUES ($1, $2)")
            .bind(id.to_owned())
            .bind(format!("{id}.example"));
        sql
    }

    async fn zones(store: &Store) -> Vec<String> {
        sqlx::query_scalar("SELECT id FROM sim_zones WHERE id LIKE 'g%' ORDER BY id")
            .fetch_all(&mut *store.read().await.unwrap())
            .await
            .unwrap()
    }

    /// A running execution of workflow `w`, whose run is `run_id`.
    fn execution_record(id: &str, run_id: &str) -> capstan_core::store::ExecutionRecord {
        capstan_core::store::ExecutionRecord {
            id: id.into(),
            workflow: "w".into(),
            principal_id: "p".into(),
            status: capstan_core::execution::ExecutionStatus::Running,
            status_reason: None,
            current_stage: None,
            created_ms: 1,
            finished_ms: None,
            cancellation_requested_ms: None,
            input_json: capstan_core::store::JsonText::new(&serde_json::json!({})),
            output_json: None,
            outcome_json: None,
            run_id: run_id.into(),
            traceparent: None,
        }
    }

    /// A runnable workflow run of `execution_id`, due at 1, with no lease.
    fn run_record(id: &str, execution_id: &str) -> capstan_core::store::RunRecord {
        use capstan_core::store::{RunKind, RunRecord, RunState};
        RunRecord {
            id: id.into(),
            execution_id: execution_id.into(),
            workflow: "w".into(),
            digest: "d".into(),
            kind: RunKind::Workflow,
            state: RunState::Runnable,
            wake_ms: 1,
            lease_owner: None,
            lease_expires_ms: None,
            activations: 0,
            cancel_requested: false,
            created_ms: 1,
            epoch: 0,
        }
    }

    /// Concurrent callers share group commits; a batch whose guard fails or whose fence is
    /// lost changes nothing and gets its own answer, and the others in its group still commit.
    #[tokio::test]
    async fn group_commits_answer_each_caller_and_isolate_failed_guards() {
        use capstan_core::store::{Fence, RunStore, StoreError};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}/g.db", dir.path().display()))
            .await
            .unwrap();
        let good = (0..40).map(|i| {
            let store = store.clone();
            async move {
                store
                    .commit_guarded(insert_zone(&format!("g{i:02}")), 0)
                    .await
            }
        });
        // A guard that does not hold (no zone `nope`): one row expected, none returned.
        let mut stale = Sql::default();
        stale
            .push_statement("SELECT 1 FROM sim_zones WHERE id = $1")
            .bind("nope".to_owned());
        stale.append(&insert_zone("gstale"));
        // A fence on a run nobody leased.
        let fence = Fence {
            run_id: "no-such-run".to_owned(),
            owner: "me".to_owned(),
            lease_until_ms: 1,
        };
        let (results, stale, fenced) = tokio::join!(
            futures_util::future::join_all(good),
            store.commit_guarded(stale, 1),
            store.apply(Some(&fence), Vec::new()),
        );
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert!(matches!(stale, Err(StoreError::Conflict(_))), "{stale:?}");
        assert!(matches!(fenced, Err(StoreError::LeaseLost)), "{fenced:?}");
        let ids = zones(&store).await;
        assert_eq!(
            ids.len(),
            40,
            "every good batch committed, the stale one did not: {ids:?}"
        );
        assert!(!ids.contains(&"gstale".to_owned()));

        // A guard that holds lets its statements commit; a failing statement (a duplicate key)
        // answers its error and changes nothing.
        let mut holds = Sql::default();
        holds
            .push_statement("SELECT 1 FROM sim_zones WHERE id = $1")
            .bind("g00".to_owned());
        holds.append(&insert_zone("gnew"));
        store.commit_guarded(holds, 1).await.unwrap();
        let mut duplicate = insert_zone("gdup");
        duplicate.append(&insert_zone("g01"));
        assert!(store.commit_guarded(duplicate, 0).await.is_err());
        let ids = zones(&store).await;
        assert!(ids.contains(&"gnew".to_owned()));
        assert!(!ids.contains(&"gdup".to_owned()), "{ids:?}");
    }

    /// A write behind its answer that no other part comes to keep company still commits on its
    /// own (nobody settles it, nothing else is queued), and one queued just before a part someone
    /// waits for is committed by the time that part is answered.
    #[tokio::test]
    async fn a_write_behind_its_answer_commits_with_company_or_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}/c.db", dir.path().display()))
            .await
            .unwrap();
        let epoch = store.behind_epoch().unwrap();
        let first = store.write_behind(insert_zone("galone"), epoch).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while store.behind_answered() < first {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("a write behind its answer alone is committed");
        store.write_behind(insert_zone("gbefore"), epoch).unwrap();
        store
            .commit_guarded(insert_zone("gwaited"), 0)
            .await
            .unwrap();
        assert_eq!(store.behind_answered(), first + 1);
        assert_eq!(zones(&store).await, ["galone", "gbefore", "gwaited"]);
    }

    /// A batch queued ahead of the work built on it (a trigger whose run started at once) commits
    /// before everything queued after it: with the writer busy, one transaction carries the
    /// batch, the writes behind answers queued after it and the commit someone waits for. One
    /// that fails moves the epoch, so the writes behind answers decided under the old one,
    /// queued after it, are refused.
    #[tokio::test]
    async fn a_batch_queued_ahead_commits_before_what_follows_or_moves_the_epoch_when_it_fails() {
        use capstan_core::store::{RunStore as _, Write};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}/a.db", dir.path().display()))
            .await
            .unwrap();
        let execution = |id: &str| Write::InsertExecution(execution_record(id, &format!("r-{id}")));
        assert!(store.queues_ahead());
        let epoch = store.behind_epoch().unwrap();
        let writer = store.group_writer().unwrap();
        // The writer cannot begin a session while its connection is held: everything below is
        // queued before the next group is taken.
        let held = store.writer().acquire().await.unwrap();
        let before = writer.committed();
        let queued = store.queue_ahead(vec![execution("e1")]).await.unwrap();
        store.write_behind(insert_zone("gahead"), epoch).unwrap();
        let part = crate::writer::Part::Statements(insert_zone("gwaited").into_statements());
        let waited = store
            .queue_part(part, false, None, crate::writer::Waits::Hurried)
            .await
            .unwrap();
        drop(held);
        queued.await.unwrap();
        waited.await.unwrap().answer.unwrap();
        assert_eq!(
            writer.committed() - before,
            1,
            "one transaction carried all three"
        );
        assert!(
            capstan_core::store::ExecutionReads::execution(&store, "e1")
                .await
                .unwrap()
                .is_some()
        );
        assert_eq!(zones(&store).await, ["gahead", "gwaited"]);
        assert_eq!(store.behind_epoch(), Some(epoch));

        // Its execution exists: the batch fails.
        let held = store.writer().acquire().await.unwrap();
        let queued = store.queue_ahead(vec![execution("e1")]).await.unwrap();
        store.write_behind(insert_zone("grefused"), epoch).unwrap();
        drop(held);
        assert!(queued.await.is_err());
        store.settle_behind().await;
        assert_eq!(
            store.behind_epoch(),
            Some(epoch + 1),
            "the failed batch moved the epoch"
        );
        assert_eq!(
            zones(&store).await,
            ["gahead", "gwaited"],
            "the write behind it was refused"
        );
    }

    /// A batch too large for a group commits in a transaction of its own, which takes the write
    /// lock directly: it still commits after everything queued for the group writer before it,
    /// so a run's first commit never overtakes the trigger's batch queued ahead of it (the run's
    /// row, which its fence checks, is in that batch).
    #[tokio::test]
    async fn a_batch_too_large_for_a_group_commits_after_the_batch_queued_ahead_of_it() {
        use capstan_core::store::*;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}/big.db", dir.path().display()))
            .await
            .unwrap();
        for round in 0..20 {
            let (execution_id, run_id) = (format!("e{round}"), format!("r{round}"));
            let trigger = vec![
                Write::InsertExecution(execution_record(&execution_id, &run_id)),
                // Leased by this node, as a run its trigger starts is.
                Write::InsertRun(RunRecord {
                    lease_owner: Some("me".into()),
                    lease_expires_ms: Some(60_000),
                    activations: 1,
                    ..run_record(&run_id, &execution_id)
                }),
            ];
            let queued = store.queue_ahead(trigger).await.unwrap();
            let first_commit: Vec<Write> = (0..4_100)
                .map(|seq| {
                    Write::PutJournal(JournalEntry {
                        run_id: run_id.clone(),
                        seq,
                        op: "dns.get".into(),
                        request: JsonText::new(&serde_json::json!({"seq": seq})),
                        response: Some(JsonText::new(&serde_json::json!({}))),
                        status: EntryStatus::Done,
                        at_ms: 1,
                    })
                })
                .collect();
            let fence = Fence {
                run_id: run_id.clone(),
                owner: "me".into(),
                lease_until_ms: 60_000,
            };
            store.apply(Some(&fence), first_commit).await.unwrap();
            queued.await.unwrap();
            let replay = store.replay_state(&run_id, &execution_id).await.unwrap();
            assert_eq!(replay.journal.len(), 4_100, "round {round}");
        }
    }

    /// The writer's queue is bounded: while the writer cannot commit (its connection is held
    /// elsewhere), a full queue makes a caller that can wait wait for room, and refuses a write
    /// behind its answer (which cannot wait); both commit nothing twice and lose nothing once
    /// the writer goes on.
    #[tokio::test]
    async fn a_full_writer_queue_pushes_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}/q.db", dir.path().display()))
            .await
            .unwrap();
        // Room for one part at a time.
        store
            .inner
            .writer_queue_bytes
            .store(1, std::sync::atomic::Ordering::Relaxed);
        let epoch = store.behind_epoch().unwrap();
        let held = store.writer().acquire().await.unwrap();
        let first = store.write_behind(insert_zone("gq0"), epoch).unwrap();
        let full = store.write_behind(insert_zone("gq1"), epoch).unwrap_err();
        assert!(
            matches!(&full, capstan_core::store::StoreError::Unavailable(m) if m.contains("queue is full")),
            "{full:?}"
        );
        let waiting = tokio::spawn({
            let store = store.clone();
            async move { store.commit_guarded(insert_zone("gq2"), 0).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "a caller waits for room");
        assert_eq!(store.behind_answered(), first - 1, "nothing committed yet");
        drop(held);
        waiting.await.unwrap().unwrap();
        assert_eq!(store.behind_answered(), first);
        assert_eq!(zones(&store).await, ["gq0", "gq2"]);
    }

    /// Writes behind their answers commit in the order queued and before whatever is queued
    /// after them; `settle_behind` waits for them. One that fails moves the epoch: from then on
    /// what named the old epoch is refused unrun (writes behind answers decided on it, commits
    /// that recorded such answers, a transaction of its own too), and what names the new one
    /// commits.
    #[tokio::test]
    async fn a_failed_write_behind_its_answer_refuses_what_named_its_epoch() {
        use capstan_core::store::{Fence, RunStore as _, StoreError, Write};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}/b.db", dir.path().display()))
            .await
            .unwrap();
        let epoch = store.behind_epoch().unwrap();
        // An activation under way while the epoch moves: its commits may record an answer
        // whose write failed.
        store.activation_began("old-activation");
        store.commit_guarded(insert_zone("gname"), 0).await.unwrap();
        let rename = |name: String| {
            let mut sql = Sql::default();
            sql.push_statement("UPDATE sim_zones SET name = $1 WHERE id = 'gname'")
                .bind(name);
            sql
        };
        let name = |store: Store| async move {
            sqlx::query_scalar::<_, String>("SELECT name FROM sim_zones WHERE id = 'gname'")
                .fetch_one(&mut *store.read().await.unwrap())
                .await
                .unwrap()
        };
        let numbers: Vec<u64> = (0..100)
            .map(|n| store.write_behind(rename(format!("n{n}")), epoch).unwrap())
            .collect();
        assert_eq!(numbers, (1..=100).collect::<Vec<u64>>());
        // Queued after them: once it is answered, they are all committed, last one last.
        store
            .commit_guarded(insert_zone("gafter"), 0)
            .await
            .unwrap();
        assert_eq!(name(store.clone()).await, "n99");
        assert_eq!(store.behind_answered(), 100);

        store
            .write_behind(rename("failed-before".to_owned()), epoch)
            .unwrap();
        store.write_behind(insert_zone("gafter"), epoch).unwrap(); // a duplicate key
        store
            .write_behind(rename("failed-after".to_owned()), epoch)
            .unwrap();
        store.settle_behind().await;
        assert_eq!(store.behind_answered(), 103);
        let moved = store.behind_epoch().unwrap();
        assert_eq!(moved, epoch + 1, "the failed write moved the epoch");
        // The write queued after the failed one was refused; the one before it may have
        // committed in an earlier group or been refused with the failed one's group.
        assert_ne!(name(store.clone()).await, "failed-after");

        let part = |sql: Sql| crate::writer::Part::Statements(sql.into_statements());
        let refused = |e: StoreError| matches!(e, StoreError::Unavailable(m) if m == crate::writer::REFUSED_BEHIND);
        let old = store
            .grouped_requiring(part(insert_zone("gold")), false, Some(epoch))
            .await
            .unwrap_err();
        assert!(refused(old));
        store
            .grouped_requiring(part(insert_zone("gnew")), false, Some(moved))
            .await
            .unwrap();
        store.write_behind(rename("new".to_owned()), moved).unwrap();
        store
            .write_behind(rename("stale".to_owned()), epoch)
            .unwrap();
        store.settle_behind().await;
        assert_eq!(name(store.clone()).await, "new");
        assert_eq!(
            store.behind_epoch(),
            Some(moved),
            "a refused write moves nothing"
        );
        // A batch too large for a group, under the fence of the run whose activation began
        // under the old epoch: refused before its transaction begins (its run was never
        // leased, which the fence would say next).
        let fence = |run_id: &str| Fence {
            run_id: run_id.to_owned(),
            owner: "me".to_owned(),
            lease_until_ms: 1,
        };
        let many = || -> Vec<Write> {
            (0..5_000)
                .map(|n| Write::DropIdempotency {
                    principal_id: "p".to_owned(),
                    workflow: "w".to_owned(),
                    key: format!("k{n}"),
                    created_ms: 0,
                })
                .collect()
        };
        assert!(refused(
            store
                .apply(Some(&fence("old-activation")), many())
                .await
                .unwrap_err()
        ));
        // An activation that began after the move, and the old one once it has ended, pass the
        // epoch's check and meet the lease's.
        store.activation_began("new-activation");
        let lease = |e: StoreError| matches!(e, StoreError::LeaseLost);
        assert!(lease(
            store
                .apply(Some(&fence("new-activation")), many())
                .await
                .unwrap_err()
        ));
        store.activation_ended("old-activation");
        assert!(lease(
            store
                .apply(Some(&fence("old-activation")), many())
                .await
                .unwrap_err()
        ));
        let zones = zones(&store).await;
        assert!(zones.contains(&"gnew".to_owned()) && !zones.contains(&"gold".to_owned()));
    }

    /// The group writer keeps sqlx's writer connection while callers keep coming, and gives it
    /// up to a transaction that waits for it: the transaction commits while grouped writes go
    /// on, and both kinds of write land. (How soon is not asserted: here the hand-over at the
    /// next group took the three transactions ~20 ms in all, against ~0.5 s when only the end of
    /// a session's slice or a drained queue let them in.)
    #[tokio::test]
    async fn a_transaction_gets_the_writer_while_group_commits_keep_coming() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}/h.db", dir.path().display()))
            .await
            .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let (store, stop) = (store.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        store
                            .commit_guarded(insert_zone(&format!("g{w}-{n}")), 0)
                            .await
                            .unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        // Grouped writes are flowing before the transaction asks for the writer.
        while zones(&store).await.len() < 20 {
            tokio::task::yield_now().await;
        }
        for i in 0..3 {
            let mut tx =
                tokio::time::timeout(std::time::Duration::from_secs(30), store.begin_write())
                    .await
                    .expect("a waiting transaction gets the writer")
                    .unwrap();
            sqlx::query("INSERT INTO sim_zones (id, name) VALUES ($1, $1 || '.example')")
                .bind(format!("tx-{i}"))
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut grouped = 0;
        for writer in writers {
            grouped += writer.await.unwrap();
        }
        let in_tx: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sim_zones WHERE id LIKE 'tx-%'")
            .fetch_one(&mut *store.read().await.unwrap())
            .await
            .unwrap();
        assert_eq!(in_tx, 3);
        assert_eq!(zones(&store).await.len(), grouped);
    }

    /// A status precondition is checked where it stands in its batch, in a group commit and in
    /// a transaction of its own (a batch too large to join a group), on either backend; a
    /// claim returns the runs it leased.
    #[tokio::test]
    async fn status_preconditions_hold_in_groups_and_alone_and_claims_return_their_runs() {
        use capstan_core::execution::{ExecutionStatus, StageStatus};
        use capstan_core::store::*;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        let execution = ExecutionRecord {
            status: ExecutionStatus::Queued,
            ..execution_record("e1", "r1")
        };
        let run = run_record("r1", "e1");
        store
            .apply(
                None,
                vec![Write::InsertExecution(execution), Write::InsertRun(run)],
            )
            .await
            .unwrap();
        let to = |expect: ExecutionStatus, status: ExecutionStatus| {
            Write::UpdateExecution(ExecutionPatch {
                id: "e1".into(),
                expect: Some(vec![expect]),
                status: Some(status),
                ..ExecutionPatch::default()
            })
        };
        let stage = |id: &str, position: i64| {
            Write::PutStage(StageRecord {
                id: id.into(),
                execution_id: "e1".into(),
                position,
                stage_name: id.into(),
                status: StageStatus::Running,
                started_ms: 1,
                finished_ms: None,
                output_json: None,
                error_json: None,
            })
        };
        // Together: the one whose precondition holds commits, the other changes nothing.
        let (wrong, right) = tokio::join!(
            store.apply(
                None,
                vec![
                    stage("s-wrong", 0),
                    to(ExecutionStatus::Running, ExecutionStatus::Succeeded)
                ]
            ),
            store.apply(
                None,
                vec![
                    to(ExecutionStatus::Queued, ExecutionStatus::Running),
                    stage("s-right", 0)
                ]
            ),
        );
        assert!(matches!(wrong, Err(StoreError::Conflict(_))), "{wrong:?}");
        right.unwrap();
        // The precondition sees the writes before it in its own batch.
        store
            .apply(
                None,
                vec![
                    to(ExecutionStatus::Running, ExecutionStatus::Waiting),
                    to(ExecutionStatus::Waiting, ExecutionStatus::Running),
                ],
            )
            .await
            .unwrap();
        // Too large for a group (over 4,096 writes): a transaction of its own, same verdict.
        let mut large: Vec<Write> = (1..4100)
            .map(|i| stage(&format!("s-large-{i}"), i))
            .collect();
        large.push(to(ExecutionStatus::Queued, ExecutionStatus::Failed));
        let refused = store.apply(None, large).await;
        assert!(
            matches!(refused, Err(StoreError::Conflict(_))),
            "{refused:?}"
        );
        let stages: Vec<String> = store
            .stages("e1")
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(stages, ["s-right"]);
        assert_eq!(
            store.execution("e1").await.unwrap().unwrap().status,
            ExecutionStatus::Running
        );
        // A patch that only states a precondition is a guard alone, and a patch that changes
        // nothing writes nothing (no `SET id = id`, see `SetList`).
        let only_checks = |expect: ExecutionStatus| {
            Write::UpdateExecution(ExecutionPatch {
                id: "e1".into(),
                expect: Some(vec![expect]),
                ..ExecutionPatch::default()
            })
        };
        let refused = store
            .apply(None, vec![only_checks(ExecutionStatus::Queued)])
            .await;
        assert!(
            matches!(refused, Err(StoreError::Conflict(_))),
            "{refused:?}"
        );
        store
            .apply(
                None,
                vec![
                    only_checks(ExecutionStatus::Running),
                    Write::UpdateRun(RunPatch {
                        id: "r1".into(),
                        ..RunPatch::default()
                    }),
                ],
            )
            .await
            .unwrap();
        // A patch that expects a stage not to have begun: refused once it has (a cancel and the
        // commit of a point of no return exclude each other), committed while it has not.
        let before_stage = |stage: &str| {
            Write::UpdateExecution(ExecutionPatch {
                id: "e1".into(),
                expect_stage_not_begun: Some(stage.into()),
                cancellation_requested_ms: Some(Some(5)),
                ..ExecutionPatch::default()
            })
        };
        let refused = store.apply(None, vec![before_stage("s-right")]).await;
        assert!(
            matches!(refused, Err(StoreError::Conflict(_))),
            "{refused:?}"
        );
        assert_eq!(
            store
                .execution("e1")
                .await
                .unwrap()
                .unwrap()
                .cancellation_requested_ms,
            None
        );
        store
            .apply(None, vec![before_stage("apply")])
            .await
            .unwrap();
        assert_eq!(
            store
                .execution("e1")
                .await
                .unwrap()
                .unwrap()
                .cancellation_requested_ms,
            Some(5)
        );

        let claimed = store.claim_runs("node-a", 10, 1_000, 8).await.unwrap();
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].id, "r1");
        assert_eq!(claimed[0].lease_owner.as_deref(), Some("node-a"));
        assert_eq!(claimed[0].lease_expires_ms, Some(1_010));
        assert_eq!(claimed[0].activations, 1);
        assert!(
            store
                .claim_runs("node-b", 20, 1_000, 8)
                .await
                .unwrap()
                .is_empty(),
            "leased"
        );
    }

    /// A waited-for part comes back from SQLite's group writer with its answer, so its
    /// statements are freed on the caller's thread (`writer::Answered`), not on the writer's.
    #[tokio::test]
    async fn a_waited_for_part_comes_back_with_its_answer() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}/capstan.db", dir.path().display()))
            .await
            .unwrap();
        let text = "INSERT INTO sim_zones (id, name) VALUES ($1, $2)";
        let mut sql = Sql::default();
        sql.push_statement(text)
            .bind("zback".to_owned())
            .bind("back.example".to_owned());
        let part = crate::writer::Part::Statements(sql.into_statements());
        let answered = store
            .queue_part(part, false, None, crate::writer::Waits::Hurried)
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(answered.answer.is_ok(), "{:?}", answered.answer.err());
        let crate::writer::Part::Statements(statements) = answered.part;
        let texts: Vec<&str> = statements.iter().map(|s| s.text.as_ref()).collect();
        assert_eq!(texts, [text]);
        let name: String = sqlx::query_scalar("SELECT name FROM sim_zones WHERE id = 'zback'")
            .fetch_one(&mut *store.read().await.unwrap())
            .await
            .unwrap();
        assert_eq!(name, "back.example");
    }

    /// A node's runs commit at the same moment, as they do under load: each commit lands or
    /// fails alone, whichever group carries it. A fence whose lease is gone answers `LeaseLost`,
    /// one whose run was asked to cancel answers `Canceled`, a write the database refuses (a
    /// duplicate key) answers its error; none of those lands any of its writes, its events
    /// and its run's release (which its fence writes) included, and none keeps the others'
    /// writes from landing.
    #[tokio::test]
    async fn each_commit_of_a_group_lands_or_fails_alone() {
        use capstan_core::execution::ExecutionStatus;
        use capstan_core::store::*;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        let execution = |i: usize| execution_record(&format!("e{i:02}"), &format!("r{i:02}"));
        let mut setup = Vec::new();
        for i in 0..24 {
            setup.push(Write::InsertExecution(execution(i)));
            setup.push(Write::InsertRun(RunRecord {
                cancel_requested: i == 21,
                ..run_record(&format!("r{i:02}"), &format!("e{i:02}"))
            }));
        }
        store.apply(None, setup).await.unwrap();
        assert_eq!(
            store.claim_runs("me", 10, 60_000, 100).await.unwrap().len(),
            24
        );

        let fence = |i: usize, owner: &str| Fence {
            run_id: format!("r{i:02}"),
            owner: owner.into(),
            lease_until_ms: 120_000,
        };
        let finish = |i: usize| {
            vec![
                Write::UpdateExecution(ExecutionPatch {
                    id: format!("e{i:02}"),
                    status: Some(ExecutionStatus::Succeeded),
                    ..ExecutionPatch::default()
                }),
                Write::UpdateRun(RunPatch {
                    id: format!("r{i:02}"),
                    state: Some(RunState::Done),
                    release_lease: true,
                    ..RunPatch::default()
                }),
                succeeded(&format!("ev{i:02}"), &format!("e{i:02}")),
            ]
        };
        let (fences, writes): (Vec<Fence>, Vec<Vec<Write>>) = (0..24)
            .map(|i| match i {
                20 => (fence(i, "another-node"), finish(i)),
                22 => {
                    // e00 exists: the insert fails after the status update ran.
                    let mut writes = finish(i);
                    writes.push(Write::InsertExecution(execution(0)));
                    (fence(i, "me"), writes)
                }
                // e01 exists too. On PostgreSQL the single-row inserts of a group's callers go
                // in as one multi-row insert (3's, 5's and 22's executions), whose failure cannot
                // name the caller until the group runs again unmerged; 5's new execution rode the
                // failed insert and still lands.
                3 => {
                    let mut writes = finish(i);
                    writes.push(Write::InsertExecution(execution(1)));
                    (fence(i, "me"), writes)
                }
                5 => {
                    let mut writes = finish(i);
                    writes.push(Write::InsertExecution(execution(99)));
                    (fence(i, "me"), writes)
                }
                _ => (fence(i, "me"), finish(i)),
            })
            .unzip();
        let answers = futures_util::future::join_all(
            fences
                .iter()
                .zip(writes)
                .map(|(fence, writes)| store.apply(Some(fence), writes)),
        )
        .await;
        for (i, answer) in answers.iter().enumerate() {
            match i {
                20 => assert!(matches!(answer, Err(StoreError::LeaseLost)), "{answer:?}"),
                21 => assert!(matches!(answer, Err(StoreError::Canceled)), "{answer:?}"),
                3 | 22 => assert!(
                    matches!(answer, Err(StoreError::Unavailable(_))),
                    "{answer:?}"
                ),
                _ => assert!(answer.is_ok(), "{i}: {answer:?}"),
            }
        }
        let events: Vec<String> =
            sqlx::query_scalar("SELECT event_id FROM outbox ORDER BY event_id")
                .fetch_all(&mut *store.read().await.unwrap())
                .await
                .unwrap();
        let landed: Vec<String> = (0..24)
            .filter(|i| ![3, 20, 21, 22].contains(i))
            .map(|i| format!("ev{i:02}"))
            .collect();
        assert_eq!(events, landed);
        assert!(
            store.execution_with_stages("e99").await.unwrap().is_some(),
            "5's new execution landed"
        );
        for i in 0..24 {
            let (record, _) = store
                .execution_with_stages(&format!("e{i:02}"))
                .await
                .unwrap()
                .unwrap();
            let expected = if [3, 20, 21, 22].contains(&i) {
                ExecutionStatus::Running
            } else {
                ExecutionStatus::Succeeded
            };
            assert_eq!(record.status, expected, "e{i:02}");
            let run = store.run(&format!("r{i:02}")).await.unwrap().unwrap();
            if [3, 20, 21, 22].contains(&i) {
                assert_eq!(run.state, RunState::Runnable, "r{i:02}");
                assert_eq!(run.lease_owner.as_deref(), Some("me"), "r{i:02}");
            } else {
                assert_eq!(run.state, RunState::Done, "r{i:02}");
                assert_eq!(run.lease_owner, None, "r{i:02}");
                assert_eq!(run.lease_expires_ms, None, "r{i:02}");
            }
        }
    }

    /// A store on a fresh PostgreSQL schema and its group writer.
    async fn postgres_group_writer() -> (Store, pg_writer::PgGroupWriter) {
        let store = Store::open(&capstan_testdb::fresh_postgres_url().await)
            .await
            .unwrap();
        let writer = store.pg_writer().expect("the group writer runs");
        (store, writer)
    }

    /// `sql` committed through `writer` on a task of its own.
    fn spawn_commit(
        writer: &pg_writer::PgGroupWriter,
        sql: Sql,
        requires: Option<u64>,
    ) -> tokio::task::JoinHandle<Result<(), capstan_core::store::StoreError>> {
        let writer = writer.clone();
        let statements = sql.into_statements();
        tokio::spawn(async move {
            writer
                .commit(statements, Vec::new(), requires, Default::default())
                .await
        })
    }

    /// A claim on PostgreSQL reads a few pages however many runs are queued, on a table never
    /// analyzed (a burst of triggers before autovacuum's first ANALYZE). On this table the
    /// planner, left to itself, read every runnable run through a bitmap scan and sorted them:
    /// 65 pages for two runs, against 26 for the claim's function (migration 0013). It still
    /// takes the earliest due runs first.
    #[tokio::test]
    async fn a_postgres_claim_reads_only_what_it_takes_from_a_long_queue() {
        use capstan_core::store::RunStore;
        let store = Store::open(&capstan_testdb::fresh_postgres_url().await)
            .await
            .unwrap();
        // 3,000 finished runs, then 3,000 queued.
        sqlx::query(
            "INSERT INTO runs (id, execution_id, workflow, digest, kind, state, wake_ms, created_ms)
             SELECT 'r' || lpad(g::text, 5, '0'), 'e', 'w', 'd', 'workflow',
                    CASE WHEN g <= 3000 THEN 'done' ELSE 'runnable' END, g, 0
             FROM generate_series(1, 6000) g",
        )
        .execute(store.pool())
        .await
        .unwrap();
        // The ids a claim took, sorted: `RETURNING` promises no order.
        let claimed = |runs: Vec<capstan_core::store::RunRecord>| -> Vec<String> {
            let mut ids: Vec<String> = runs.into_iter().map(|r| r.id).collect();
            ids.sort();
            ids
        };
        let first = store.claim_runs("a", 30_000, 1_000, 2).await.unwrap();
        assert_eq!(claimed(first), ["r03001", "r03002"]);
        // On one connection, the second claim: the first loads the session's catalog caches
        // and makes the plan, whose reads are not the statement's own.
        let mut conn = store.pool().acquire().await.unwrap();
        sqlx::query("SELECT id FROM capstan_claim_runs('b', 31000, 30000, 2)")
            .execute(&mut *conn)
            .await
            .unwrap();
        let plan: Vec<(String,)> = sqlx::query_as(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF)
             SELECT id FROM capstan_claim_runs('b', 31000, 30000, 2)",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        drop(conn);
        let buffers = plan
            .iter()
            .find_map(|(line,)| line.trim().strip_prefix("Buffers: shared "))
            .expect("the plan reports buffers");
        let pages: u64 = buffers
            .split_whitespace()
            .filter_map(|part| part.split_once('='))
            .filter(|(kind, _)| matches!(*kind, "hit" | "read"))
            .map(|(_, n)| n.parse::<u64>().unwrap())
            .sum();
        assert!(pages < 45, "the claim read {pages} pages: {plan:?}");
        let next = store.claim_runs("c", 30_000, 1_000, 2).await.unwrap();
        assert_eq!(claimed(next), ["r03007", "r03008"]);
    }

    /// On PostgreSQL a patient job (an audit record) commits in the transaction of the job a
    /// caller queued after it, as a trigger's record does with the trigger's commit; alone, a
    /// nudge sends it (or its wait for company ends) and its caller is answered. That it waits
    /// rather than starting a group is a matter of timing, which the engine bench's write
    /// transactions per execution show (BENCHMARKS.md).
    #[tokio::test]
    async fn a_patient_job_rides_the_transaction_of_the_next_callers_job() {
        let (store, writer) = postgres_group_writer().await;
        // Both are queued before the writer task runs (the test's runtime has one thread and
        // neither send waits), so the order is the one a trigger's record and its commit have.
        let patient = writer
            .queue_patiently(insert_zone("pride").into_statements())
            .await
            .unwrap();
        writer
            .commit(
                insert_zone("pcaller").into_statements(),
                Vec::new(),
                None,
                Default::default(),
            )
            .await
            .unwrap();
        patient.await.unwrap().unwrap();
        let transactions: i64 = sqlx::query_scalar(
            "SELECT COUNT(DISTINCT xmin::text) FROM sim_zones WHERE id IN ('pride', 'pcaller')",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(transactions, 1, "one transaction wrote both rows");
        let alone = writer
            .queue_patiently(insert_zone("palone").into_statements())
            .await
            .unwrap();
        writer.nudge();
        alone.await.unwrap().unwrap();
        let written: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sim_zones WHERE id = 'palone'")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(written, 1);
    }

    /// PostgreSQL's group writer sends the rows of a group's callers as one `unnest` insert per
    /// table, past their updates of other tables: every value lands as bound (typed `NULL`s,
    /// bytes, booleans, an `ON CONFLICT` clause), each table's rows in their order, without the
    /// group running again unmerged. A duplicate row fails only its caller, through one rerun.
    #[tokio::test]
    async fn merged_inserts_land_every_value_and_pin_a_failure_on_its_caller() {
        let (store, writer) = postgres_group_writer().await;
        for ddl in [
            "CREATE TABLE m_rows (id TEXT PRIMARY KEY, n BIGINT, note TEXT, body BYTEA, flag BOOLEAN)",
            "CREATE TABLE m_keys (seq BIGSERIAL PRIMARY KEY, k TEXT NOT NULL UNIQUE)",
            "CREATE TABLE m_other (id TEXT PRIMARY KEY, n BIGINT NOT NULL)",
            "INSERT INTO m_other (id, n) VALUES ('o', 0)",
        ] {
            sqlx::query(ddl).execute(store.pool()).await.unwrap();
        }
        let job = |i: i64, id: &str| {
            let mut sql = Sql::default();
            sql.push_statement(
                "INSERT INTO m_rows (id, n, note, body, flag) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(id.to_owned())
            .bind(i)
            .bind((i % 2 == 0).then(|| format!("note {i}")))
            .bind(vec![i as u8, 0, 255])
            .bind(i % 3 == 0);
            sql.push_statement("UPDATE m_other SET n = n + $1 WHERE id = 'o'")
                .bind(i);
            sql.push_statement("INSERT INTO m_keys (k) VALUES ($1) ON CONFLICT (k) DO NOTHING")
                .bind(format!("k{}", i % 3));
            sql.into_statements()
        };
        // Queued before the writer task runs (one-thread runtime): one group.
        let answers = futures_util::future::join_all((0..5).map(|i| {
            writer.commit(
                job(i, &format!("r{i}")),
                Vec::new(),
                None,
                Default::default(),
            )
        }))
        .await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(writer.unmerged_runs(), 0, "the merged inserts ran as sent");
        let transactions: i64 = sqlx::query_scalar("SELECT COUNT(DISTINCT xmin::text) FROM m_rows")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(transactions, 1, "one group");
        type Row = (String, i64, Option<String>, Vec<u8>, bool);
        let rows: Vec<Row> =
            sqlx::query_as("SELECT id, n, note, body, flag FROM m_rows ORDER BY id")
                .fetch_all(store.pool())
                .await
                .unwrap();
        let expected: Vec<_> = (0..5i64)
            .map(|i| {
                (
                    format!("r{i}"),
                    i,
                    (i % 2 == 0).then(|| format!("note {i}")),
                    vec![i as u8, 0, 255],
                    i % 3 == 0,
                )
            })
            .collect();
        assert_eq!(rows, expected);
        let keys: Vec<String> = sqlx::query_scalar("SELECT k FROM m_keys ORDER BY seq")
            .fetch_all(store.pool())
            .await
            .unwrap();
        assert_eq!(
            keys,
            ["k0", "k1", "k2"],
            "in the callers' order, duplicates skipped"
        );
        let total: i64 = sqlx::query_scalar("SELECT n FROM m_other WHERE id = 'o'")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(total, 10);

        // r1 exists: that caller's merged row fails the group, which runs again unmerged.
        let answers = futures_util::future::join_all(
            [(5, "r5"), (6, "r1"), (7, "r7")]
                .map(|(i, id)| writer.commit(job(i, id), Vec::new(), None, Default::default())),
        )
        .await;
        assert!(answers[0].is_ok() && answers[2].is_ok(), "{answers:?}");
        assert!(
            matches!(
                answers[1],
                Err(capstan_core::store::StoreError::Unavailable(_))
            ),
            "{answers:?}"
        );
        assert_eq!(writer.unmerged_runs(), 1);
        let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM m_rows ORDER BY id")
            .fetch_all(store.pool())
            .await
            .unwrap();
        assert_eq!(ids, ["r0", "r1", "r2", "r3", "r4", "r5", "r7"]);
        let total: i64 = sqlx::query_scalar("SELECT n FROM m_other WHERE id = 'o'")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(
            total, 22,
            "the failed caller's update rolled back with its row"
        );
    }

    /// PostgreSQL's group writer sends a group while the one before it still runs, and the
    /// later one commits only if the earlier one did. A write behind its answer that fails
    /// refuses the commit that named its epoch though that commit was sent before the failure
    /// was known, and a job sent with it that named no epoch runs again and lands.
    #[tokio::test]
    async fn a_group_sent_behind_one_that_fails_waits_for_its_verdict() {
        use capstan_core::store::StoreError;
        let (store, writer) = postgres_group_writer().await;
        let epoch = store.behind_epoch().unwrap();
        writer
            .commit(
                insert_zone("gtaken").into_statements(),
                Vec::new(),
                None,
                Default::default(),
            )
            .await
            .unwrap();
        // Holds the server a while, then fails: a duplicate key.
        let mut slow = Sql::default();
        slow.push_statement("SELECT pg_sleep(0.3)");
        slow.append(&insert_zone("gtaken"));
        store.write_behind(slow, epoch).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let dependent = spawn_commit(&writer, insert_zone("gdependent"), Some(epoch));
        let independent = spawn_commit(&writer, insert_zone("gindependent"), None);
        let refused = dependent.await.unwrap().unwrap_err();
        assert!(
            matches!(&refused, StoreError::Unavailable(m) if m == crate::writer::REFUSED_BEHIND),
            "{refused:?}"
        );
        independent.await.unwrap().unwrap();
        assert_eq!(store.behind_epoch(), Some(epoch + 1));
        assert_eq!(zones(&store).await, ["gindependent", "gtaken"]);
    }

    /// A job whose statement cannot be encoded (a text with a NUL byte) fails alone and sends
    /// nothing: its statements encoded before the bad one do not run with the next group, and
    /// the others commit.
    #[tokio::test]
    async fn a_job_that_cannot_be_encoded_fails_alone_and_sends_nothing() {
        let (store, writer) = postgres_group_writer().await;
        let mut bad = insert_zone("gpartial");
        bad.push_statement("SELECT 1 -- \0");
        let failed = spawn_commit(&writer, bad, None);
        let good = spawn_commit(&writer, insert_zone("gfirst"), None);
        assert!(failed.await.unwrap().is_err());
        good.await.unwrap().unwrap();
        writer
            .commit(
                insert_zone("gnext").into_statements(),
                Vec::new(),
                None,
                Default::default(),
            )
            .await
            .unwrap();
        assert_eq!(zones(&store).await, ["gfirst", "gnext"]);
    }

    /// The group writer and the point readers speak TLS when the URL asks for it
    /// (`sslmode=require`): their connections, named apart from the pool's, show as encrypted
    /// in `pg_stat_ssl`, the commit the writer carried landed and a point read sees it. Always
    /// on PostgreSQL; the test server serves TLS (Debian's PostgreSQL does by default, with its
    /// snakeoil certificate).
    #[tokio::test]
    async fn the_group_writer_and_point_readers_connect_over_tls_when_the_url_asks() {
        use capstan_core::store::RunStore as _;
        let url = capstan_testdb::fresh_postgres_url().await;
        let name = format!("capstan-tls-{}", &capstan_core::ids::new_id()[..8]);
        let separator = if url.contains('?') { '&' } else { '?' };
        let store = Store::open(&format!(
            "{url}{separator}sslmode=require&application_name={name}"
        ))
        .await
        .unwrap();
        assert!(store.behind_epoch().is_some(), "the group writer runs");
        store
            .apply(None, vec![succeeded("ev-tls", "e-tls")])
            .await
            .unwrap();
        let page = store
            .events_after(
                0,
                &crate::streams::StreamFilter {
                    workflows: vec!["w".into()],
                    execution_id: Some("e-tls".into()),
                    ..Default::default()
                },
                10,
            )
            .await
            .unwrap();
        let ids: Vec<&str> = page.events.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["ev-tls"], "read back through a point reader");
        for role in ["group writer", "point reader"] {
            let (connections, encrypted): (i64, i64) = sqlx::query_as(
                "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = $1",
            )
            .bind(format!("{name} ({role})"))
            .fetch_one(&mut *store.read().await.unwrap())
            .await
            .unwrap();
            assert_eq!((connections, encrypted), (1, 1), "{role}");
        }
    }

    /// An `ExecutionSucceeded` outbox event `event_id` of `execution_id`.
    fn succeeded(event_id: &str, execution_id: &str) -> capstan_core::store::Write {
        capstan_core::store::Write::Event(capstan_core::store::OutboxRecord {
            seq: 0,
            event_id: event_id.into(),
            execution_id: execution_id.into(),
            event_type: "ExecutionSucceeded".into(),
            event_version: "1".into(),
            principal_id: "p".into(),
            workflow: "w".into(),
            payload_json: capstan_core::store::JsonText::new(&serde_json::json!({})),
            occurred_ms: 1,
            traceparent: None,
            routed_ms: None,
            stream_published_ms: None,
            dispatched_ms: None,
        })
    }

    /// A batch's events, written as multi-row inserts on SQLite, get sequence numbers in the
    /// batch's order whatever their number (37: inserts of 32, 4 and 1 rows), between its other
    /// writes (receipts, a repeated one kept once, across the compensation between them).
    #[tokio::test]
    async fn a_batchs_events_keep_its_order_and_its_receipts_are_all_kept() {
        use capstan_core::store::{Receipt, RunStore as _, Write};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        let receipt = |id: &str, seq: i64| {
            Write::InsertReceipt(std::sync::Arc::new(Receipt {
                id: id.into(),
                execution_id: "e1".into(),
                run_id: "r1".into(),
                seq,
                op: "dns.change-records".into(),
                request: capstan_core::store::JsonText::new(&serde_json::json!({"n": seq})),
                response: capstan_core::store::JsonText::new(&serde_json::json!({"ok": true})),
                created_ms: 1,
                compensated_ms: None,
            }))
        };
        let ids: Vec<String> = (0..37).map(|i| format!("ev{:02}", 36 - i)).collect();
        let mut writes = vec![Write::InsertExecution(execution_record("e1", "r1"))];
        for (i, id) in ids.iter().enumerate() {
            writes.push(succeeded(id, "e1"));
            if i % 9 == 0 {
                writes.push(receipt(&format!("rc{i}"), i as i64));
            }
        }
        writes.push(Write::MarkCompensated {
            receipt_id: "rc9".into(),
            at_ms: 7,
        });
        writes.push(receipt("rc9", 9));
        writes.push(receipt("rc99", 99));
        store.apply(None, writes).await.unwrap();
        let mut db = store.read().await.unwrap();
        let stored: Vec<String> = sqlx::query_scalar("SELECT event_id FROM outbox ORDER BY seq")
            .fetch_all(&mut *db)
            .await
            .unwrap();
        assert_eq!(stored, ids, "the batch's order, not the ids'");
        let receipts: Vec<(String, Option<i64>)> =
            sqlx::query_as("SELECT id, compensated_ms FROM receipts ORDER BY seq")
                .fetch_all(&mut *db)
                .await
                .unwrap();
        let expected: Vec<(String, Option<i64>)> = [
            ("rc0", None),
            ("rc9", Some(7)),
            ("rc18", None),
            ("rc27", None),
            ("rc36", None),
            ("rc99", None),
        ]
        .into_iter()
        .map(|(id, at)| (id.to_owned(), at))
        .collect();
        assert_eq!(receipts, expected);
    }

    /// A stream's page ends past every event there was when fewer than its limit passed the
    /// filter, so the next read starts after the events that did not pass; a full page ends at
    /// its last event, and an empty outbox leaves the cursor where it was.
    #[tokio::test]
    async fn a_stream_page_moves_the_cursor_past_the_events_it_filtered_out() {
        use crate::streams::StreamFilter;
        use capstan_core::store::*;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        let filter = StreamFilter {
            workflows: vec!["w".into()],
            events: vec![("ExecutionSucceeded".into(), "1".into())],
            execution_id: None,
            principal_id: None,
        };
        assert_eq!(store.events_after(0, &filter, 10).await.unwrap().cursor, 0);
        let other = |id: &str| match succeeded(id, "e1") {
            capstan_core::store::Write::Event(mut e) => {
                e.event_type = "ExecutionQueued".into();
                capstan_core::store::Write::Event(e)
            }
            _ => unreachable!(),
        };
        store
            .apply(None, vec![succeeded("s1", "e1"), other("q1"), other("q2")])
            .await
            .unwrap();
        let page = store.events_after(0, &filter, 10).await.unwrap();
        let ids: Vec<&str> = page.events.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["s1"]);
        assert!(page.caught_up);
        let newest = store.last_event_seq().await.unwrap();
        assert_eq!(page.cursor, newest, "past the two queued events");
        assert!(
            store
                .events_after(page.cursor, &filter, 10)
                .await
                .unwrap()
                .events
                .is_empty()
        );

        store
            .apply(None, vec![succeeded("s2", "e2"), succeeded("s3", "e3")])
            .await
            .unwrap();
        let page = store.events_after(newest, &filter, 1).await.unwrap();
        assert_eq!(page.events.len(), 1);
        assert_eq!(
            page.cursor, page.events[0].seq,
            "a full page ends at its last event"
        );
        assert!(!page.caught_up, "a full page may have more after it");
        let page = store.events_after(page.cursor, &filter, 10).await.unwrap();
        assert_eq!(page.events[0].event_id, "s3");
    }

    /// A subscription starts after the outbox's last event at its creation: of the events the
    /// relay has not passed yet, it is routed only those committed after it.
    #[tokio::test]
    async fn a_subscription_receives_only_events_committed_after_it() {
        use crate::subscriptions::SubscriptionRecord;
        use capstan_core::store::*;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        let event = |id: &str| succeeded(id, "e1");
        store
            .apply(None, vec![event("before-1"), event("before-2")])
            .await
            .unwrap();
        store
            .insert_subscription(&SubscriptionRecord {
                id: "s1".into(),
                owner_principal_id: "p".into(),
                url: "https://hooks.example.com/".into(),
                events: vec!["ExecutionSucceeded.v1".into()],
                active: true,
                health: "healthy".into(),
                kms_key_id: "k".into(),
                secret_sealed: "x".into(),
                previous_kms_key_id: None,
                previous_secret_sealed: None,
                previous_until_ms: None,
                created_ms: 2,
                deleted_ms: None,
                after_seq: -1,
            })
            .await
            .unwrap();
        store.apply(None, vec![event("after")]).await.unwrap();
        let subscription = store.active_subscriptions().await.unwrap().remove(0);
        // From the subscription's start, the window holds only what it is owed.
        let (_, from_start) = store
            .relay_window(10, subscription.after_seq)
            .await
            .unwrap();
        assert_eq!(from_start.map(|(_, count)| count), Some(1));
        let (cursor, window) = store.relay_window(10, 0).await.unwrap();
        assert_eq!(cursor, 0, "the relay has passed nothing yet");
        let (last, count) = window.unwrap();
        assert_eq!(count, 3);
        let events = store.outbox_between(cursor, last).await.unwrap();
        assert_eq!(events.len(), 3);
        // Published to streams when committed: the stamp is written with the event.
        assert!(events.iter().all(|e| e.stream_published_ms == Some(1)));
        let routed: Vec<&str> = events
            .iter()
            .filter(|e| subscription.wants(e))
            .map(|e| e.event_id.as_str())
            .collect();
        assert_eq!(routed, ["after"]);
        // Its event versions only.
        let mut other = events[2].clone();
        other.event_version = "2".into();
        assert!(!subscription.wants(&other));
        other.event_version = "1".into();
        other.event_type = "ExecutionSucceededX".into();
        assert!(!subscription.wants(&other));
    }

    /// A commit through `apply` wakes the waiters of the executions whose events it wrote, and
    /// no others; [`Store::events_committed`] (events of no known execution) wakes them all.
    #[tokio::test]
    async fn a_commit_wakes_the_waiters_of_its_executions() {
        use capstan_core::store::*;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        let event = |execution: &str| succeeded(&capstan_core::ids::new_id(), execution);
        let mut mine = store.wake_for(Some("e1"));
        let mut other = store.wake_for(Some("e2"));
        let mut all = store.wake_for(None);
        let mut outcome = store.wake_when_stopped("e1");
        mine.mark_seen();
        other.mark_seen();
        all.mark_seen();
        outcome.mark_seen();
        let woken = |w: &mut Wake| futures_util::FutureExt::now_or_never(w.changed()).is_some();
        store.apply(None, vec![event("e1")]).await.unwrap();
        assert!(woken(&mut mine), "its execution's commit wakes it");
        assert!(!woken(&mut other), "another execution's commit does not");
        assert!(
            !woken(&mut outcome),
            "an event that leaves the status alone does not wake a waiter for the outcome"
        );
        let stop = |status| {
            Write::UpdateExecution(ExecutionPatch {
                id: "e1".to_owned(),
                status: Some(status),
                ..ExecutionPatch::default()
            })
        };
        store
            .apply(None, vec![stop(capstan_core::ExecutionStatus::Running)])
            .await
            .unwrap();
        assert!(!woken(&mut outcome), "still moving");
        store
            .apply(
                None,
                vec![stop(capstan_core::ExecutionStatus::Waiting), event("e1")],
            )
            .await
            .unwrap();
        assert!(woken(&mut outcome), "it stopped moving");
        assert!(
            woken(&mut all),
            "a reader of every event is woken by every commit"
        );
        store.events_committed();
        assert!(
            woken(&mut other),
            "events of no known execution wake every waiter"
        );
    }

    /// PostgreSQL: another node's commit wakes the waiters on this node of the executions it
    /// names in its `NOTIFY`, and no others; one that names too many to fit wakes them all.
    /// Every one of them reaches the node's claimer.
    #[tokio::test]
    async fn another_nodes_commit_wakes_the_waiters_of_its_executions() {
        use capstan_core::store::*;
        use std::time::Duration;
        let url = capstan_testdb::fresh_postgres_url().await;
        let (a, b) = (
            Store::open(&url).await.unwrap(),
            Store::open(&url).await.unwrap(),
        );
        let event = |execution: &str| succeeded(&capstan_core::ids::new_id(), execution);
        let mut mine = b.wake_for(Some("e1"));
        let mut other = b.wake_for(Some("e2"));
        let mut all = b.wake_for(None);
        let mut outcome = b.wake_when_stopped("e1");
        let mut other_nodes = b.subscribe_other_nodes();
        all.mark_seen();
        other_nodes.mark_unchanged();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let listener = tokio::spawn({
            let b = b.clone();
            async move { b.listen_for_events(stopped).await }
        });
        // Listening: it wakes everyone once, for what was committed before it listened.
        async fn soon(w: &mut Wake) -> Result<(), tokio::time::error::Elapsed> {
            tokio::time::timeout(Duration::from_secs(10), w.changed()).await
        }
        soon(&mut all).await.expect("the listener listens");
        assert!(
            other_nodes.has_changed().unwrap(),
            "the claimer too, for what other nodes committed before it listened"
        );
        other_nodes.mark_unchanged();
        let woken = |w: &mut Wake| futures_util::FutureExt::now_or_never(w.changed()).is_some();
        for w in [&mut mine, &mut other, &mut all, &mut outcome] {
            w.mark_seen();
        }
        a.apply(None, vec![event("e1")]).await.unwrap();
        soon(&mut mine)
            .await
            .expect("its execution's commit wakes it");
        // One notification carries both: when `mine` woke, `other` would have too.
        assert!(!woken(&mut other), "another execution's commit does not");
        assert!(
            !woken(&mut outcome),
            "an event that leaves the status alone does not wake a waiter for the outcome"
        );
        assert!(woken(&mut all), "a reader of every event is woken");
        assert!(
            other_nodes.has_changed().unwrap(),
            "and the claimer: any commit of another node may have made a run due"
        );
        mine.mark_seen();
        let waiting = Write::UpdateExecution(ExecutionPatch {
            id: "e1".to_owned(),
            status: Some(capstan_core::ExecutionStatus::Waiting),
            ..ExecutionPatch::default()
        });
        a.apply(None, vec![waiting, event("e1")]).await.unwrap();
        soon(&mut outcome).await.expect("it stopped moving");
        assert!(woken(&mut mine));
        assert!(!woken(&mut other));
        // Events of more executions than a notification can name wake every waiter.
        let many: Vec<Write> = (0..300)
            .map(|_| event(&capstan_core::ids::new_id()))
            .collect();
        a.apply(None, many).await.unwrap();
        soon(&mut other)
            .await
            .expect("a commit that names no executions wakes every waiter");
        stop.send(true).unwrap();
        listener.await.unwrap();
    }

    #[tokio::test]
    async fn key_lookups_see_this_process_changes_at_once_and_others_within_the_cache_time() {
        use crate::auth::{ApiKeyRecord, KEY_CACHE_MS};
        let dir = tempfile::tempdir().unwrap();
        let url = capstan_testdb::fresh_database_url(dir.path()).await;
        let store = Store::open(&url).await.unwrap();
        // Another process on the same database: the CLI, or another node.
        let other = Store::open(&url).await.unwrap();
        let key = ApiKeyRecord {
            id: "key-1".to_owned(),
            principal_id: "ops".to_owned(),
            prefix: "cap_cache001".to_owned(),
            hash: "h".to_owned(),
            pepper_version: 1,
            created_ms: 0,
            expires_ms: i64::MAX,
            last_used_ms: None,
            revoked_ms: None,
        };
        let lookup = |store: &Store, now: i64| {
            let store = store.clone();
            async move {
                let keys = store
                    .api_keys_with_grants("cap_cache001", now)
                    .await
                    .unwrap();
                keys.into_iter()
                    .map(|(k, grants)| (k.revoked_ms, grants))
                    .collect::<Vec<_>>()
            }
        };
        let t = 1_000_000;
        assert!(lookup(&store, t).await.is_empty());
        // Minted and granted here: seen at once, though "nothing" was read a moment ago.
        store.insert_api_key(&key).await.unwrap();
        store.grant("ops", "workflows:a").await.unwrap();
        assert_eq!(
            lookup(&store, t).await,
            vec![(None, vec!["workflows:a".to_owned()])]
        );
        // Changed by the other process: this one answers from memory until the cache time is up…
        other.grant("ops", "workflows:b").await.unwrap();
        other.revoke_api_key("key-1", t).await.unwrap();
        assert_eq!(
            lookup(&store, t + KEY_CACHE_MS - 1).await,
            vec![(None, vec!["workflows:a".to_owned()])]
        );
        // …and reads the database again after it, or when its clock went backwards.
        let fresh = vec![(
            Some(t),
            vec!["workflows:a".to_owned(), "workflows:b".to_owned()],
        )];
        assert_eq!(lookup(&store, t - 1).await, fresh);
        assert_eq!(lookup(&store, t + KEY_CACHE_MS).await, fresh);
        // Changes through this process are seen at once, whatever the clock says.
        let now = t + KEY_CACHE_MS;
        store.revoke_grant("ops", "workflows:a").await.unwrap();
        assert_eq!(
            lookup(&store, now).await,
            vec![(Some(t), vec!["workflows:b".to_owned()])]
        );
        store.revoke_api_key("key-1", now + 5).await.unwrap();
        store.grant("ops", "workflows:c").await.unwrap();
        assert_eq!(
            lookup(&store, now).await,
            vec![(
                Some(t),
                vec!["workflows:b".to_owned(), "workflows:c".to_owned()]
            )]
        );
    }

    /// `fetch_all` (SQLite: on the calling thread, `reader.rs`) gives the rows sqlx's read path
    /// gives, value kinds included; sees every commit before it; runs several statements as one
    /// read; and cannot write.
    #[tokio::test]
    async fn point_reads_match_sqlx_rows_see_every_commit_and_write_nothing() {
        use sqlx::{Column as _, Row as _};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        let select = "SELECT id, name, CAST(7 AS BIGINT) AS n, CAST(2.5 AS DOUBLE PRECISION) AS r,
                CAST(NULL AS TEXT) AS absent FROM sim_zones WHERE id = $1";
        let read = |id: &str| Sql::new(select).arg(id.to_owned());
        assert!(store.fetch_optional(read("z1")).await.unwrap().is_none());
        // Read, commit through the group writer, read again: the same connection, reused, must
        // not keep the earlier snapshot.
        for i in 0..3 {
            let zone = insert_zone(&format!("z{i}"));
            if store.backend() == Backend::Sqlite {
                store.commit_guarded(zone, 0).await.unwrap();
            } else {
                zone.build().execute(store.writer()).await.unwrap();
            }
            let row = store
                .fetch_optional(read(&format!("z{i}")))
                .await
                .unwrap()
                .expect("committed before the read");
            let id: String = row.try_get("id").unwrap();
            assert_eq!(id, format!("z{i}"));
        }
        let ours = store.fetch_optional(read("z1")).await.unwrap().unwrap();
        let sqlx_row = read("z1")
            .build()
            .fetch_one(&mut *store.read().await.unwrap())
            .await
            .unwrap();
        let names = |row: &AnyRow| -> Vec<String> {
            row.columns().iter().map(|c| c.name().to_owned()).collect()
        };
        assert_eq!(names(&ours), names(&sqlx_row));
        for row in [&ours, &sqlx_row] {
            assert_eq!(row.try_get::<String, _>("name").unwrap(), "z1.example");
            assert_eq!(row.try_get::<i64, _>("n").unwrap(), 7);
            assert_eq!(row.try_get::<f64, _>("r").unwrap(), 2.5);
            assert_eq!(row.try_get::<Option<String>, _>("absent").unwrap(), None);
            assert_eq!(row.try_get::<Option<i64>, _>(2).unwrap(), Some(7));
            assert!(row.try_get::<String, _>("missing").is_err());
        }
        // Several statements: all their rows, in order.
        let mut both = Sql::default();
        both.push_statement("SELECT id FROM sim_zones WHERE id = $1")
            .bind("z2".to_owned());
        both.push_statement("SELECT name AS zone FROM sim_zones WHERE id IN ($1, $2) ORDER BY id")
            .bind("z0".to_owned())
            .bind("z1".to_owned());
        let rows = store.fetch_all(both).await.unwrap();
        let firsts: Vec<String> = rows.iter().map(|r| r.try_get(0).unwrap()).collect();
        assert_eq!(firsts, ["z2", "z0.example", "z1.example"]);
        assert_eq!(rows[1].columns()[0].name(), "zone");
        // A bad statement is an error, and the connection still serves the next read.
        assert!(
            store
                .fetch_all(Sql::new("SELECT * FROM nowhere"))
                .await
                .is_err()
        );
        if store.backend() == Backend::Sqlite {
            let write = Sql::new("DELETE FROM sim_zones");
            assert!(store.fetch_all(write).await.is_err(), "a read cannot write");
        }
        assert_eq!(zones(&store).await.len(), 0, "no g* zones");
        let all = store
            .fetch_all(Sql::new("SELECT id FROM sim_zones ORDER BY id"))
            .await
            .unwrap();
        assert_eq!(all.len(), 3, "nothing deleted");
    }

    /// An execution with its stages is one statement (a join) decoded straight from SQLite's
    /// rows on the point readers and through sqlx on PostgreSQL: the same records the
    /// separate reads give, stages by position, every column's value and NULL kept.
    #[tokio::test]
    async fn an_execution_reads_with_its_stages_in_one_statement() {
        use capstan_core::execution::{ExecutionStatus, StageStatus};
        use capstan_core::store::*;
        use serde_json::json;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        let execution = |id: &str, status: ExecutionStatus| ExecutionRecord {
            id: id.into(),
            workflow: "w".into(),
            principal_id: "p".into(),
            status,
            status_reason: (status == ExecutionStatus::Failed).then(|| "provider_failed".into()),
            current_stage: Some("b".into()),
            created_ms: 10,
            finished_ms: (status == ExecutionStatus::Failed).then_some(20),
            cancellation_requested_ms: None,
            input_json: JsonText::new(&json!({"zone": "Z", "list": [1, "two", null]})),
            output_json: None,
            outcome_json: (status == ExecutionStatus::Failed)
                .then(|| JsonText::new(&json!({"error": "x"}))),
            run_id: format!("r-{id}"),
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
        };
        let stage = |id: &str, position: i64, status: StageStatus| StageRecord {
            id: id.into(),
            execution_id: "e1".into(),
            position,
            stage_name: format!("stage-{position}"),
            status,
            started_ms: 11 + position,
            finished_ms: (status != StageStatus::Running).then_some(12 + position),
            output_json: (status == StageStatus::Succeeded)
                .then(|| JsonText::new(&json!({"n": position}))),
            error_json: (status == StageStatus::Failed)
                .then(|| JsonText::new(&json!({"error": "e"}))),
        };
        // Stages written out of their order.
        let stages = [
            stage("s2", 2, StageStatus::Failed),
            stage("s0", 0, StageStatus::Succeeded),
            stage("s1", 1, StageStatus::Running),
        ];
        let mut writes = vec![
            Write::InsertExecution(execution("e1", ExecutionStatus::Failed)),
            Write::InsertExecution(execution("e2", ExecutionStatus::Queued)),
        ];
        writes.extend(stages.iter().cloned().map(Write::PutStage));
        store.apply(None, writes).await.unwrap();

        assert!(store.execution_with_stages("nope").await.unwrap().is_none());
        let (e1, e1_stages) = store.execution_with_stages("e1").await.unwrap().unwrap();
        assert_eq!(e1, execution("e1", ExecutionStatus::Failed));
        let positions: Vec<i64> = e1_stages.iter().map(|s| s.position).collect();
        assert_eq!(positions, [0, 1, 2]);
        let separately = store.stages("e1").await.unwrap();
        assert_eq!(e1_stages, separately);
        assert_eq!(e1_stages[2], stages[0]);
        // No stages: the execution alone (its row's NULL stage columns are not a stage).
        let (e2, e2_stages) = store.execution_with_stages("e2").await.unwrap().unwrap();
        assert_eq!(e2.status, ExecutionStatus::Queued);
        assert_eq!(e2.outcome_json, None);
        assert!(e2_stages.is_empty());
        assert_eq!(store.execution("e2").await.unwrap(), Some(e2));
    }

    /// The group writer checkpoints only past a high backstop (10,000 pages); its checkpointer
    /// thread copies the WAL into the database file in the background.
    #[tokio::test]
    async fn the_checkpointer_copies_the_group_writers_wal_into_the_database_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let store = Store::open(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        for i in 0..300 {
            let mut zone = Sql::default();
            zone.push_statement("INSERT INTO sim_zones (id, name) VALUES ($1, $2)")
                .bind(format!("c{i:03}"))
                .bind(format!("{i}{}.example", "x".repeat(400)));
            store.commit_guarded(zone, 0).await.unwrap();
        }
        let size_now = || async {
            let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
                .fetch_one(store.pool())
                .await
                .unwrap();
            (pages * 4096, std::fs::metadata(&path).unwrap().len() as i64)
        };
        let (database, _) = size_now().await;
        assert!(database > 30 * 4096, "{database} bytes written");
        // Only a checkpoint brings the file up to the database's size; wait for the thread.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (database, file) = size_now().await;
            if file == database {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no checkpoint: the file has {file} of {database} bytes"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(zones(&store).await.len(), 0);
    }

    /// With nothing written since a checkpoint copied the whole WAL, the checkpointer rests
    /// instead of taking SQLite's locks ten times a second; the next commit wakes it.
    #[tokio::test]
    async fn the_checkpointer_rests_while_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}", dir.path().join("r.db").display()))
            .await
            .unwrap();
        let commit = |i: usize| {
            let mut zone = Sql::default();
            zone.push_statement("INSERT INTO sim_zones (id, name) VALUES ($1, $2)")
                .bind(format!("g{i}"))
                .bind(format!("{i}.example"));
            store.commit_guarded(zone, 0)
        };
        commit(0).await.unwrap();
        let checkpoints = || store.group_writer().unwrap().checkpoints();
        let after = |n: u64| async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while checkpoints() <= n {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no checkpoint after {n}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        after(0).await;
        // Room for the checkpoint that copies the commit to finish, then ten of its intervals.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let resting = checkpoints();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(checkpoints(), resting, "checkpoints of an unchanged WAL");
        commit(1).await.unwrap();
        after(resting).await;
        assert_eq!(zones(&store).await.len(), 2);
    }

    #[tokio::test]
    async fn refuses_an_unknown_url_scheme() {
        let err = Store::open("mysql://localhost/x").await.unwrap_err();
        assert!(err.to_string().contains("mysql://localhost/x"), "{err}");
    }
}
