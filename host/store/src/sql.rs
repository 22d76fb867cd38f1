//! A query assembled at run time (optional filters, partial updates) with `$N` placeholders,
//! the one placeholder form both SQLite and PostgreSQL accept. (sqlx's `QueryBuilder` over the
//! `Any` driver writes `?`, which PostgreSQL refuses.)

use sqlx::any::AnyArguments;
use sqlx::{Any, Arguments, Encode, Type};
use std::fmt::Write as _;

/// SQL text plus its arguments; every [`Sql::push_bind`] appends the next `$N`.
#[derive(Default)]
pub struct Sql {
    text: String,
    args: AnyArguments,
    count: usize,
}

impl std::fmt::Debug for Sql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sql")
            .field("text", &self.text)
            .field("count", &self.count)
            .finish()
    }
}

impl Sql {
    pub fn new(text: &str) -> Self {
        Self {
            text: text.to_owned(),
            ..Self::default()
        }
    }

    /// Appends SQL text.
    pub fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// Appends a placeholder bound to `value`.
    pub fn push_bind<T>(&mut self, value: T) -> &mut Self
    where
        T: Encode<'static, Any> + Type<Any> + Send + 'static,
    {
        self.count += 1;
        let _ = write!(self.text, "${}", self.count);
        // Encoding into `AnyArguments` only copies the value into a buffer; it cannot fail for
        // the plain types (integers, strings, floats) bound here.
        if let Err(e) = self.args.add(value) {
            tracing::error!(error = %e, "cannot bind a query argument");
        }
        self
    }

    /// Appends `$N, $N+1, …` bound to `values` (for `IN (…)`).
    pub fn push_binds<T>(&mut self, values: impl IntoIterator<Item = T>) -> &mut Self
    where
        T: Encode<'static, Any> + Type<Any> + Send + 'static,
    {
        for (i, v) in values.into_iter().enumerate() {
            if i > 0 {
                self.text.push_str(", ");
            }
            self.push_bind(v);
        }
        self
    }

    pub fn build(self) -> sqlx::query::Query<'static, Any, AnyArguments> {
        sqlx::query_with(sqlx::AssertSqlSafe(self.text), self.args)
    }
}
