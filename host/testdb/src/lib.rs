//! Databases for tests, on the backend the run asks for: `CAPSTAN_TEST_DATABASE=postgres` runs a
//! suite on PostgreSQL (`CAPSTAN_TEST_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`), each test in a schema of its own; anything else
//! (the default) on a fresh SQLite file. `just test` runs the store, engine, booking, provider
//! and end-to-end suites once per backend.

use std::path::Path;

/// The default PostgreSQL of the test machines (trust auth, database `test`).
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Whether this test run targets PostgreSQL.
pub fn postgres() -> bool {
    std::env::var("CAPSTAN_TEST_DATABASE").is_ok_and(|v| v.eq_ignore_ascii_case("postgres"))
}

/// The PostgreSQL server tests use.
pub fn postgres_url() -> String {
    std::env::var("CAPSTAN_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_POSTGRES_URL.to_owned())
}

/// A fresh, empty database for one test: `sqlite://DIR/capstan.db`, or a new schema on the test
/// PostgreSQL (named `capstan_t_…`; `just test` drops old ones before a run).
pub async fn fresh_database_url(dir: &Path) -> String {
    if postgres() {
        fresh_postgres_url().await
    } else {
        format!("sqlite://{}/capstan.db", dir.display())
    }
}

/// A new, empty schema on the test PostgreSQL, as a database URL (panics, naming the server, if
/// it cannot be reached: the tests that call this need it).
pub async fn fresh_postgres_url() -> String {
    let base = postgres_url();
    let schema = format!("capstan_t_{}", capstan_core::ids::new_id().replace('-', ""));
    let mut conn = match <sqlx::PgConnection as sqlx::Connection>::connect(&base).await {
        Ok(conn) => conn,
        Err(e) => panic!(
            "CAPSTAN_TEST_DATABASE=postgres but {base} cannot be reached ({e}); start PostgreSQL \
             (`.ci/run` does) or set CAPSTAN_TEST_POSTGRES_URL"
        ),
    };
    if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut conn)
        .await
    {
        panic!("cannot create test schema {schema} on {base}: {e}");
    }
    let _ = sqlx::Connection::close(conn).await;
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}options[search_path]={schema}")
}
