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

impl Clone for Sql {
    fn clone(&self) -> Self {
        let mut copy = Sql::default();
        copy.append(self);
        copy
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
        let _ = write!(self.text, "${}", self.count + 1);
        // Encoding into `AnyArguments` only copies the value into a buffer; it cannot fail for
        // the plain types (integers, strings, floats) bound here.
        self.bind(value)
    }

    /// Appends a whole statement written with its own `$1…$k` placeholders, after a `;` when
    /// text came before: its placeholders are renumbered to follow the ones bound so far, so
    /// several statements share one text and one argument list (SQLite runs them in one call).
    /// Bind its `k` values, in order, with [`Sql::bind`].
    pub fn push_statement(&mut self, text: &str) -> &mut Self {
        if !self.text.is_empty() {
            self.text.push_str(";\n");
        }
        let offset = self.count;
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            self.text.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            match after[..digits].parse::<usize>() {
                Ok(n) => {
                    let _ = write!(self.text, "${}", n + offset);
                }
                Err(_) => self.text.push('$'),
            }
            rest = &after[digits..];
        }
        self.text.push_str(rest);
        self
    }

    /// Binds the next value of a statement appended with [`Sql::push_statement`].
    pub fn bind<T>(&mut self, value: T) -> &mut Self
    where
        T: Encode<'static, Any> + Type<Any> + Send + 'static,
    {
        self.count += 1;
        if let Err(e) = self.args.add(value) {
            tracing::error!(error = %e, "cannot bind a query argument");
        }
        self
    }

    /// Appends all of `other` (its statements and values) after the statements so far, its
    /// placeholders renumbered as by [`Sql::push_statement`].
    pub fn append(&mut self, other: &Sql) -> &mut Self {
        self.push_statement(&other.text);
        // `AnyArguments` keeps its values in a public (if undocumented) buffer of clonable
        // values; copying them is what lets a group commit retry a batch on its own.
        self.args
            .values
            .0
            .extend(other.args.values.0.iter().cloned());
        self.count += other.count;
        self
    }

    /// How many values are bound so far.
    pub fn binds(&self) -> usize {
        self.count
    }

    /// True when no text was pushed.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_renumbered_to_follow_earlier_binds() {
        let mut sql = Sql::default();
        sql.push_statement("INSERT INTO t (a, b) VALUES ($1, $2)")
            .bind(1i64)
            .bind(2i64);
        sql.push_statement("UPDATE u SET x = $2 WHERE id = $1 AND price > 0")
            .bind("id")
            .bind(3i64);
        sql.push(" AND y = ").push_bind(4i64);
        assert_eq!(
            sql.text,
            "INSERT INTO t (a, b) VALUES ($1, $2);\nUPDATE u SET x = $4 WHERE id = $3 AND price > 0 AND y = $5"
        );
        assert_eq!(sql.binds(), 5);
    }

    #[test]
    fn appending_renumbers_and_keeps_the_values() {
        let mut a = Sql::default();
        a.push_statement("SELECT $1").bind(1i64);
        let mut b = Sql::default();
        b.push_statement("SELECT $1, $2").bind(2i64).bind("x");
        b.push_statement("SELECT $1").bind(3i64);
        a.append(&b);
        assert_eq!(a.text, "SELECT $1;\nSELECT $2, $3;\nSELECT $4");
        assert_eq!(a.binds(), 4);
        assert_eq!(a.args.values.0.len(), 4);
    }
}
