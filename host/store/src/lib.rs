//! # capstan-store
//!
//! Storage on sqlx. SQLite (WAL) is the embedded default: one file under the data directory,
//! migrations embedded in the binary and run at start-up (and by `capstan migrate`).
//!
//! This crate owns the schema and the SQL; it must not know about HTTP or wasmtime.

use sqlx::SqlitePool;
pub mod auth;
mod engine;
pub mod event_versions;
pub mod streams;
pub mod subscriptions;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use std::str::FromStr;
use std::time::Duration;

/// Why the store could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "unsupported database URL `{0}` (expected sqlite://PATH; postgres:// arrives with the PostgreSQL store)"
    )]
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
}

/// The database behind Capstan.
///
/// SQLite allows one writer at a time; several connections racing for the write lock spin in
/// SQLite's busy handler (sleeps of 1–100 ms) and, under load, time out. So writes go through a
/// pool of exactly one connection, whose queue is fair and never sleeps, while reads use their
/// own pool and run concurrently (WAL).
#[derive(Debug, Clone)]
pub struct Store {
    pool: SqlitePool,
    writer: SqlitePool,
    /// Bumped after every commit that wrote outbox events (wakes SSE streams on this node).
    events: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
}

static MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

impl Store {
    /// Opens (creating if needed) the database at `url` and runs pending migrations.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let store = Self::connect(url).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Opens without migrating.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let Some(path) = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
        else {
            return Err(StoreError::UnsupportedUrl(url.to_owned()));
        };
        let path = path.split('?').next().unwrap_or(path);
        if path != ":memory:"
            && let Some(parent) = std::path::Path::new(path).parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent).map_err(|source| StoreError::CreateDir {
                path: parent.display().to_string(),
                source,
            })?;
        }
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options.clone())
            .await?;
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await?;
        Ok(Self {
            pool,
            writer,
            events: std::sync::Arc::new(tokio::sync::watch::Sender::new(0)),
        })
    }

    /// Wakes whoever waits for new outbox events on this node.
    pub fn events_committed(&self) {
        self.events.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes after every commit that wrote outbox events on this node.
    pub fn subscribe_events(&self) -> tokio::sync::watch::Receiver<u64> {
        self.events.subscribe()
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATIONS.run(&self.writer).await?;
        Ok(())
    }

    /// The versions of the migrations applied so far.
    pub async fn applied_migrations(&self) -> Result<Vec<i64>, StoreError> {
        let rows: Vec<(i64,)> =
            sqlx::query_as("SELECT version FROM _sqlx_migrations ORDER BY version")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(|(v,)| v).collect())
    }

    /// A round trip to the database (readiness).
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// The read pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The single-connection write pool: every transaction that writes goes through it.
    pub fn writer(&self) -> &SqlitePool {
        &self.writer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[tokio::test]
    async fn refuses_an_unknown_url_scheme() {
        let err = Store::open("mysql://localhost/x").await.unwrap_err();
        assert!(err.to_string().contains("mysql://localhost/x"), "{err}");
    }
}
