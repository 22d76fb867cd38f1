//! The simulated cloud's write transaction, shaped for SQLite's connection thread.
//!
//! sqlx runs every SQLite call on the connection's own thread and waits for the answer; on a
//! small VM that hand-off costs more than the statements. A simulated call is a handful of reads
//! and a few writes, so on SQLite this transaction buffers writes and sends them with the next
//! read, or with `COMMIT`; `BEGIN IMMEDIATE` rides with the first text sent. A DNS change is then
//! four hand-offs (begin + token check, zone, prior record, writes + commit) instead of nine.
//! On PostgreSQL each statement is sent as it is complete (its extended protocol takes one
//! statement per message), inside an ordinary `BEGIN … COMMIT`.
//!
//! The transaction is begun with raw SQL on a pooled connection, so dropping it unfinished (an
//! early `return Err`, a cancelled future) rolls back on a task of its own before the connection
//! goes back to the pool.

use capstan_store::{Backend, Sql};
use sqlx::any::AnyRow;
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, AnyPool, Executor as _};

pub(crate) struct SimTx {
    conn: Option<PoolConnection<Any>>,
    backend: Backend,
    /// Statements not sent yet (SQLite), in order.
    pending: Sql,
    /// A text that begins the transaction was sent: it must end in COMMIT or ROLLBACK.
    open: bool,
    finished: bool,
}

impl SimTx {
    /// Takes the writer; nothing is sent yet on SQLite.
    pub(crate) async fn begin(pool: &AnyPool) -> Result<Self, sqlx::Error> {
        capstan_store::count_write();
        let backend = Backend::of_pool(pool);
        let mut conn = pool.acquire().await?;
        let mut pending = Sql::default();
        let open = match backend {
            Backend::Sqlite => {
                pending.push_statement("BEGIN IMMEDIATE");
                false
            }
            Backend::Postgres => {
                conn.execute("BEGIN").await?;
                true
            }
        };
        Ok(Self {
            conn: Some(conn),
            backend,
            pending,
            open,
            finished: false,
        })
    }

    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    /// Starts the next statement (with its own `$1…$k`); bind its values on the result, then
    /// call [`SimTx::done`] (a write) or [`SimTx::fetch`] (it returns rows).
    pub(crate) fn statement(
        &mut self,
        text: impl Into<std::borrow::Cow<'static, str>>,
    ) -> &mut Sql {
        self.pending.push_statement(text)
    }

    /// Appends a statement built elsewhere; end it with [`SimTx::done`] (one statement per
    /// call: PostgreSQL cannot take several as one text).
    pub(crate) fn append(&mut self, sql: &Sql) {
        self.pending.append(sql);
    }

    /// Ends a write: PostgreSQL sends it now, SQLite with the next text.
    pub(crate) async fn done(&mut self) -> Result<(), sqlx::Error> {
        if self.backend == Backend::Postgres {
            self.send().await?;
        }
        Ok(())
    }

    /// Sends what is pending, ending with the statement just pushed, and returns its rows
    /// (buffered writes return none).
    pub(crate) async fn fetch(&mut self) -> Result<Vec<AnyRow>, sqlx::Error> {
        self.send().await
    }

    /// The connection for reads written against it directly, with everything before sent.
    pub(crate) async fn conn(&mut self) -> Result<&mut AnyConnection, sqlx::Error> {
        self.send().await?;
        Ok(self.connection())
    }

    pub(crate) async fn commit(mut self) -> Result<(), sqlx::Error> {
        self.statement("COMMIT");
        self.send().await?;
        self.finished = true;
        Ok(())
    }

    fn connection(&mut self) -> &mut AnyConnection {
        match self.conn.as_mut() {
            Some(conn) => conn,
            None => unreachable!("the connection is only taken on drop"),
        }
    }

    async fn send(&mut self) -> Result<Vec<AnyRow>, sqlx::Error> {
        if self.pending.is_empty() {
            return Ok(Vec::new());
        }
        let query = std::mem::take(&mut self.pending).build();
        // From here the transaction may be open, even if the text fails half-way.
        self.open = true;
        query.fetch_all(self.connection()).await
    }
}

impl Drop for SimTx {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take()
            && self.open
            && !self.finished
        {
            // Without a runtime (a test tearing down) the pool closes the connection anyway.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    // "no transaction is active" when the text that began it failed first.
                    let _ = conn.execute("ROLLBACK").await;
                });
            } else {
                conn.close_on_drop();
            }
        }
    }
}
