//! A query assembled at run time (optional filters, partial updates) with `$N` placeholders,
//! the one placeholder form both SQLite and PostgreSQL accept. (sqlx's `QueryBuilder` over the
//! `Any` driver writes `?`, which PostgreSQL refuses.)
//!
//! An [`Sql`] may hold several statements ([`Sql::push_statement`]). Each keeps its own text and
//! `$1…$k` (so the same statement always has the same text, which SQLite's group writer keeps
//! prepared, `crate::writer`); [`Sql::build`] joins them into one text with the placeholders
//! renumbered across it, which sqlx's SQLite driver runs in one call.

use capstan_core::store::StoreError;
use sqlx::any::AnyArguments;
use sqlx::{Any, Arguments, Encode, Type};
use sqlx_core::any::AnyValueKind;
use std::borrow::Cow;
use std::fmt::Write as _;

/// SQL text plus its arguments; every [`Sql::push_bind`] appends the next `$N`.
#[derive(Default)]
pub struct Sql {
    statements: Vec<Statement>,
}

/// One statement: its text with `$1…$k` and its `k` values. A text written in the source is
/// borrowed, not copied: a ten-stage execution queues over a hundred statements, each of whose
/// copies would be allocated on a worker and freed on the writer's thread.
#[derive(Default)]
pub(crate) struct Statement {
    pub(crate) text: Cow<'static, str>,
    args: AnyArguments,
    /// A guard: what the statement returns decides whether its transaction goes on.
    pub(crate) check: Option<Check>,
    /// Once run, holds to the end of its transaction (a lock, a guard under a lock it takes):
    /// the same text with the same values later in the same transaction may be skipped
    /// ([`Sql::once`]).
    pub(crate) once: bool,
}

/// What a guard statement must return for its transaction to go on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Check {
    /// A run's fence: one row (the run's `cancel_requested`), or none when the lease was lost
    /// ([`StoreError::LeaseLost`]); a value of 1 asks for an immediate cancel
    /// ([`StoreError::Canceled`]).
    Fence,
    /// A condition: one row while it holds, else [`StoreError::Conflict`] with this reason.
    Holds(&'static str),
}

impl Check {
    /// The verdict on a guard's first row (its first column as an integer, 0 when it is not
    /// one), or `None` when it returned no row.
    pub(crate) fn verdict(self, first: Option<i64>) -> Result<(), StoreError> {
        match (self, first) {
            (Check::Fence, None) => Err(StoreError::LeaseLost),
            (Check::Fence, Some(1)) => Err(StoreError::Canceled),
            (Check::Holds(reason), None) => Err(StoreError::Conflict(reason.to_owned())),
            (_, Some(_)) => Ok(()),
        }
    }
}

/// The bytes a text or blob value holds beyond its `AnyValueKind` (none for the rest).
pub(crate) fn value_bytes(value: &AnyValueKind) -> usize {
    match value {
        AnyValueKind::Text(text) => text.len(),
        AnyValueKind::TextSlice(text) => text.len(),
        AnyValueKind::Blob(bytes) => bytes.len(),
        _ => 0,
    }
}

impl Statement {
    /// A statement of `text`, its values' buffer sized for the placeholders written in it: one
    /// allocation, where growing it value by value took up to four.
    fn new(text: Cow<'static, str>) -> Self {
        let mut args = AnyArguments::default();
        args.values
            .0
            .reserve(text.bytes().filter(|&b| b == b'$').count());
        Self {
            text,
            args,
            check: None,
            once: false,
        }
    }

    pub(crate) fn values(&self) -> &[AnyValueKind] {
        &self.args.values.0
    }

    /// About the bytes the statement holds while it waits for the writer: its text and its
    /// values (what the writer's queue is bounded by, `crate::writer::QUEUE_BYTES`).
    pub(crate) fn weight(&self) -> usize {
        let values: usize = self
            .values()
            .iter()
            .map(|value| value_bytes(value) + std::mem::size_of::<AnyValueKind>())
            .sum();
        self.text.len() + values
    }
}

impl Clone for Statement {
    fn clone(&self) -> Self {
        let mut args = AnyArguments::default();
        // `AnyArguments` keeps its values in a public (if undocumented) buffer of clonable
        // values; copying them is what lets a batch be appended to a group and kept.
        args.values.0.extend(self.args.values.0.iter().cloned());
        Self {
            text: self.text.clone(),
            args,
            check: self.check,
            once: self.once,
        }
    }
}

impl std::fmt::Debug for Sql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.statements.iter().map(|s| &s.text))
            .finish()
    }
}

impl Clone for Sql {
    fn clone(&self) -> Self {
        Self {
            statements: self.statements.clone(),
        }
    }
}

impl Sql {
    pub fn new(text: impl Into<Cow<'static, str>>) -> Self {
        Self {
            statements: vec![Statement::new(text.into())],
        }
    }

    fn last(&mut self) -> &mut Statement {
        if self.statements.is_empty() {
            self.statements.push(Statement::default());
        }
        let at = self.statements.len() - 1;
        &mut self.statements[at]
    }

    /// Appends SQL text to the current statement.
    pub fn push(&mut self, text: &str) -> &mut Self {
        self.last().text.to_mut().push_str(text);
        self
    }

    /// Appends a placeholder bound to `value`.
    pub fn push_bind<T>(&mut self, value: T) -> &mut Self
    where
        T: Encode<'static, Any> + Type<Any> + Send + 'static,
    {
        let last = self.last();
        let n = last.args.values.0.len() + 1;
        let _ = write!(last.text.to_mut(), "${n}");
        // Encoding into `AnyArguments` only copies the value into a buffer; it cannot fail for
        // the plain types (integers, strings, floats) bound here.
        self.bind(value)
    }

    /// Starts the next statement, written with its own `$1…$k` placeholders; bind its `k`
    /// values, in order, with [`Sql::bind`]. (Joined into one text by [`Sql::build`], the
    /// placeholders are renumbered to follow the earlier statements'.)
    pub fn push_statement(&mut self, text: impl Into<Cow<'static, str>>) -> &mut Self {
        self.statements.push(Statement::new(text.into()));
        self
    }

    /// Makes the current statement a guard.
    pub(crate) fn check(&mut self, check: Check) -> &mut Self {
        self.last().check = Some(check);
        self
    }

    /// Makes the current statement a guard of a write behind its answer
    /// ([`crate::Store::write_behind`]): it returns a row while what the caller decided from
    /// still holds, and the write fails when it returns none.
    pub fn guard(&mut self) -> &mut Self {
        self.check(Check::Holds(
            "what a write behind its answer was decided from has changed",
        ))
    }

    /// Marks the current statement as one whose repeat later in the same transaction (same text,
    /// same values) changes nothing: a lock, or a guard under a lock it takes itself (`FOR
    /// SHARE`). PostgreSQL's group writer then runs it once per group.
    pub fn once(&mut self) -> &mut Self {
        self.last().once = true;
        self
    }

    /// Makes the first `n` statements guards.
    pub(crate) fn checked(mut self, n: usize, check: Check) -> Self {
        for statement in self.statements.iter_mut().take(n) {
            statement.check = Some(check);
        }
        self
    }

    /// The guard the first statement is, if it is one.
    pub(crate) fn first_check(&self) -> Option<Check> {
        self.statements.first().and_then(|s| s.check)
    }

    /// The guard the last statement is, if it is one.
    pub(crate) fn last_check(&self) -> Option<Check> {
        self.statements.last().and_then(|s| s.check)
    }

    /// Binds the next value of the current statement.
    pub fn bind<T>(&mut self, value: T) -> &mut Self
    where
        T: Encode<'static, Any> + Type<Any> + Send + 'static,
    {
        if let Err(e) = self.last().args.add(value) {
            tracing::error!(error = %e, "cannot bind a query argument");
        }
        self
    }

    /// Appends all of `other`'s statements (with their values) after the statements so far.
    pub fn append(&mut self, other: &Sql) -> &mut Self {
        self.statements.extend(other.statements.iter().cloned());
        self
    }

    /// Appends `other`'s statements, taking them.
    pub fn extend(&mut self, other: Sql) -> &mut Self {
        self.statements.extend(other.statements);
        self
    }

    /// How many values are bound so far.
    pub fn binds(&self) -> usize {
        self.statements.iter().map(|s| s.args.values.0.len()).sum()
    }

    /// True when no text was pushed.
    pub fn is_empty(&self) -> bool {
        self.statements.iter().all(|s| s.text.is_empty())
    }

    /// Binds the next value of the current statement, by value (`Sql::new(…).arg(id)`).
    pub fn arg<T>(mut self, value: T) -> Self
    where
        T: Encode<'static, Any> + Type<Any> + Send + 'static,
    {
        self.bind(value);
        self
    }

    /// The statements, each with its own placeholders and values.
    pub(crate) fn statements(&self) -> &[Statement] {
        &self.statements
    }

    /// The statements, taken.
    pub(crate) fn into_statements(self) -> Vec<Statement> {
        self.statements
    }

    /// Appends ` LIMIT n` with `n` written into the text, not bound.
    ///
    /// SQLite re-prepares a statement whose `LIMIT` is a bound value every time it is bound (the
    /// planner may use the value), which sqlx's connections cannot turn off (our own can:
    /// `reader::plan_once`). Limits are integers the server chose, so the text is safe, and the
    /// few distinct limits each stay prepared.
    pub fn push_limit(&mut self, n: i64) -> &mut Self {
        let _ = write!(self.last().text.to_mut(), " LIMIT {n}");
        self
    }

    /// Appends `$N, $N+1, …` bound to `values` (for `IN (…)`).
    pub fn push_binds<T>(&mut self, values: impl IntoIterator<Item = T>) -> &mut Self
    where
        T: Encode<'static, Any> + Type<Any> + Send + 'static,
    {
        for (i, v) in values.into_iter().enumerate() {
            if i > 0 {
                self.push(", ");
            }
            self.push_bind(v);
        }
        self
    }

    /// The statements as one text (`;`-separated, placeholders numbered across it) and one
    /// argument list.
    fn joined(self) -> (String, AnyArguments) {
        let mut statements = self.statements.into_iter();
        let Some(first) = statements.next() else {
            return (String::new(), AnyArguments::default());
        };
        let (mut text, mut args) = (first.text.into_owned(), first.args);
        for statement in statements {
            let offset = args.values.0.len();
            text.push_str(";\n");
            let mut rest = &*statement.text;
            while let Some(at) = rest.find('$') {
                text.push_str(&rest[..at]);
                let after = &rest[at + 1..];
                let digits = after.bytes().take_while(u8::is_ascii_digit).count();
                match after[..digits].parse::<usize>() {
                    Ok(n) => {
                        let _ = write!(text, "${}", n + offset);
                    }
                    Err(_) => text.push('$'),
                }
                rest = &after[digits..];
            }
            text.push_str(rest);
            args.values.0.extend(statement.args.values.0);
        }
        (text, args)
    }

    pub fn build(self) -> sqlx::query::Query<'static, Any, AnyArguments> {
        let (text, args) = self.joined();
        sqlx::query_with(sqlx::AssertSqlSafe(text), args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_constant_text_is_borrowed_until_something_is_appended_to_it() {
        static TEXT: &str = "UPDATE t SET a = $1 WHERE id = $2";
        let mut sql = Sql::default();
        sql.push_statement(TEXT).bind(1i64).bind("x");
        sql.push_statement(TEXT).bind(2i64).bind("y");
        sql.push(" AND b = ").push_bind(3i64);
        let [first, second] = sql.statements() else {
            panic!("two statements");
        };
        // The first still points at the constant; the second was copied before it grew.
        assert!(matches!(&first.text, Cow::Borrowed(t) if std::ptr::eq(*t, TEXT)));
        assert!(matches!(second.text, Cow::Owned(_)));
        assert_eq!(second.text, "UPDATE t SET a = $1 WHERE id = $2 AND b = $3");
        assert_eq!(TEXT, "UPDATE t SET a = $1 WHERE id = $2");
        let (text, args) = sql.joined();
        assert_eq!(
            text,
            "UPDATE t SET a = $1 WHERE id = $2;\nUPDATE t SET a = $3 WHERE id = $4 AND b = $5"
        );
        assert_eq!(args.values.0.len(), 5);
    }

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
            sql.statements()[1].text,
            "UPDATE u SET x = $2 WHERE id = $1 AND price > 0 AND y = $3"
        );
        assert_eq!(sql.binds(), 5);
        let (text, args) = sql.joined();
        assert_eq!(
            text,
            "INSERT INTO t (a, b) VALUES ($1, $2);\nUPDATE u SET x = $4 WHERE id = $3 AND price > 0 AND y = $5"
        );
        assert_eq!(args.values.0.len(), 5);
    }

    #[test]
    fn appending_keeps_each_statement_and_its_values() {
        let mut a = Sql::default();
        a.push_statement("SELECT $1").bind(1i64);
        let mut b = Sql::default();
        b.push_statement("SELECT $1, $2").bind(2i64).bind("x");
        b.push_statement("SELECT $1").bind(3i64);
        a.append(&b);
        let texts: Vec<&str> = a.statements().iter().map(|s| &*s.text).collect();
        assert_eq!(texts, ["SELECT $1", "SELECT $1, $2", "SELECT $1"]);
        assert_eq!(a.binds(), 4);
        assert_eq!(a.statements()[1].values().len(), 2);
        let (text, args) = a.joined();
        assert_eq!(text, "SELECT $1;\nSELECT $2, $3;\nSELECT $4");
        assert_eq!(args.values.0.len(), 4);
    }
}
