//! PostgreSQL connections for point reads ([`crate::Store::fetch_all`]), kept outside sqlx's pool.
//!
//! sqlx's pool pings every connection it takes back, from a task it spawns for that: one more
//! round trip per read, which the server (on the same cores as the node, in a small deployment)
//! answers too. A point read is one or two statements on one connection, so it borrows one
//! from here instead. The connection comes back only when its statements ran to completion:
//! nothing else checks it, its read has just been answered. A read cancelled midway (its
//! request dropped) drops its connection with it, since the session may be halfway through an
//! exchange; so does a read that failed, whatever the error (a server shutting down answers
//! with an error before it closes the connection), and the next read opens another. A
//! connection left idle for [`IDLE_BEFORE_PING`] or longer is pinged before it is lent again
//! (the server may have closed it meanwhile), as the pool's are ([`crate::Store`]'s options).

use crate::sql::Sql;
use crate::{IDLE_BEFORE_PING, PG_SESSION};
use sqlx::any::{AnyConnectOptions, AnyRow};
use sqlx::{AnyConnection, ConnectOptions as _, Connection as _, Executor as _};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// Point-read connections open at once at most; a read beyond them waits for one.
pub(crate) const PG_READERS: usize = 8;

/// How long a read waits for a connection (a free one, or a new one to open) before it fails
/// as the pool's do after their acquire timeout: a transient error, answered 503.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct PgReaders {
    url: String,
    /// Connections not lent, each with when it came back.
    idle: Mutex<Vec<(AnyConnection, Instant)>>,
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
    pub(crate) fn new(url: String) -> Self {
        Self {
            url,
            idle: Mutex::default(),
            permits: Semaphore::new(PG_READERS),
        }
    }

    /// Runs `sql`'s statements in turn on one connection and returns all their rows.
    pub(crate) async fn fetch(&self, sql: Sql) -> Result<Vec<AnyRow>, sqlx::Error> {
        // Owned by this future: dropped with it if the read is cancelled.
        let (_permit, mut conn) = tokio::time::timeout(ACQUIRE_TIMEOUT, async {
            let permit = self
                .permits
                .acquire()
                .await
                .map_err(|_| sqlx::Error::PoolClosed)?;
            Ok::<_, sqlx::Error>((permit, self.take().await?))
        })
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)??;
        let mut rows = Vec::new();
        for statement in sql.into_statements() {
            rows.extend(statement.into_query().fetch_all(&mut conn).await?);
        }
        self.give_back(conn);
        Ok(rows)
    }

    /// An idle connection that answers (the most recently used first), or a new one.
    async fn take(&self) -> Result<AnyConnection, sqlx::Error> {
        loop {
            let popped = self
                .idle
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .pop();
            let Some((mut conn, since)) = popped else {
                break;
            };
            if since.elapsed() < IDLE_BEFORE_PING || conn.ping().await.is_ok() {
                return Ok(conn);
            }
            // Gone stale: dropped; try the next one.
        }
        let options: AnyConnectOptions = self.url.parse()?;
        let mut conn = options.connect().await?;
        conn.execute(PG_SESSION).await?;
        Ok(conn)
    }

    fn give_back(&self, conn: AnyConnection) {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((conn, Instant::now()));
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
        (PgReaders::new(url.clone()), url)
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

    /// Ends a server process from a session of its own, as an operator or a restart would.
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
    }

    #[tokio::test]
    async fn a_read_gives_its_connection_back_and_the_next_read_uses_it() {
        let (readers, _) = readers().await;
        let first = backend(&readers).await.unwrap();
        assert_eq!(idle(&readers), 1);
        assert_eq!(backend(&readers).await.unwrap(), first);
        let statements = {
            let mut sql = Sql::new("SELECT 1 AS n");
            sql.push_statement("SELECT 2 AS n");
            sql
        };
        let rows = readers.fetch(statements).await.unwrap();
        let numbers: Vec<i32> = rows.iter().map(|r| r.get::<i32, _>("n")).collect();
        assert_eq!(numbers, [1, 2], "every statement's rows, in order");
        assert_eq!(backend(&readers).await.unwrap(), first);
        assert_eq!(idle(&readers), 1);
    }

    #[tokio::test]
    async fn a_failed_or_cancelled_read_drops_its_connection_and_the_next_read_opens_another() {
        let (readers, _) = readers().await;
        let first = backend(&readers).await.unwrap();
        let Err(error) = readers.fetch(Sql::new("SELECT 1 / 0")).await else {
            panic!("1 / 0 answered");
        };
        assert!(matches!(error, sqlx::Error::Database(_)), "{error}");
        assert_eq!(
            idle(&readers),
            0,
            "the failed read's connection was dropped"
        );
        let second = backend(&readers).await.unwrap();
        assert_ne!(second, first);
        // Cancelled while the server is still working on it: the session is mid-exchange.
        let cancelled = tokio::time::timeout(
            std::time::Duration::from_millis(100),
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

    #[tokio::test]
    async fn a_connection_the_server_closed_fails_one_read_when_just_used_and_none_once_idle() {
        let (readers, url) = readers().await;
        let first = backend(&readers).await.unwrap();
        terminate(&url, first).await;
        // Used a moment ago, so lent without a ping: this read finds it closed and drops it.
        assert!(backend(&readers).await.is_err());
        let second = backend(&readers).await.unwrap();
        assert_ne!(second, first);
        terminate(&url, second).await;
        // Idle long enough to be pinged first: the ping finds it closed, the read opens another.
        tokio::time::sleep(IDLE_BEFORE_PING + std::time::Duration::from_millis(100)).await;
        let third = backend(&readers).await.unwrap();
        assert_ne!(third, second);
    }
}
