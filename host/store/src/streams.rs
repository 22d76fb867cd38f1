//! What SSE streams read: outbox events after a cursor (the outbox `seq`, in commit order: one
//! writer on SQLite, the outbox lock on PostgreSQL — see `engine::outbox_lock`), filtered; and
//! single-use stream tokens.

use crate::engine::{SELECT_OUTBOX, outbox_row, unavailable};
use crate::{Sql, Store};
use capstan_core::store::{Millis, OutboxRecord, StoreError};
use sqlx::Row;
use std::sync::LazyLock;

/// Which events a stream carries. `workflows` is already narrowed to the caller's entitlements.
#[derive(Debug, Clone, Default)]
pub struct StreamFilter {
    pub workflows: Vec<String>,
    /// `(eventType, eventVersion)` pairs; empty = every type.
    pub events: Vec<(String, String)>,
    pub execution_id: Option<String>,
    pub principal_id: Option<String>,
}

/// The page [`Store::events_after`] reads: each event after `after` that passes `filter`, at
/// most `limit`. Unless the filter names an execution, the newest event's `seq` (`top`) comes
/// beside each (one row with no event when none passes).
///
/// One execution's page is read from `outbox_by_execution` alone, in its order: joined to the
/// newest `seq`, SQLite could not tell the join yields one row and sorted the page in a
/// temporary B-tree, and read the outbox's right edge besides.
fn page(after: i64, filter: &StreamFilter, limit: i64) -> Sql {
    static ONE_EXECUTION: LazyLock<String> =
        LazyLock::new(|| format!("{} WHERE o.seq > ", SELECT_OUTBOX.as_str()));
    static EVERY_EXECUTION: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {}, t.top FROM (SELECT MAX(seq) AS top FROM outbox) AS t LEFT JOIN outbox AS o ON o.seq > ",
            crate::rows::select_list("o", &crate::rows::OUTBOX_COLUMNS)
        )
    });
    let (head, bound) = if filter.execution_id.is_some() {
        (ONE_EXECUTION.as_str(), "")
    } else {
        (EVERY_EXECUTION.as_str(), " AND o.seq <= t.top")
    };
    let mut q = Sql::new(head);
    q.push_bind(after)
        .push(bound)
        .push(" AND o.workflow IN (")
        .push_binds(filter.workflows.iter().cloned())
        .push(")");
    if !filter.events.is_empty() {
        q.push(" AND (");
        for (i, (ty, version)) in filter.events.iter().enumerate() {
            if i > 0 {
                q.push(" OR ");
            }
            q.push("(o.event_type = ")
                .push_bind(ty.clone())
                .push(" AND o.event_version = ")
                .push_bind(version.clone())
                .push(")");
        }
        q.push(")");
    }
    if let Some(id) = &filter.execution_id {
        q.push(" AND o.execution_id = ").push_bind(id.clone());
    }
    if let Some(p) = &filter.principal_id {
        q.push(" AND o.principal_id = ").push_bind(p.clone());
    }
    q.push(" ORDER BY o.seq").push_limit(limit);
    q
}

impl Store {
    /// Up to `limit` events with `seq > after` that pass `filter`, in order, and the cursor to
    /// ask from next: past the last of them, or, when fewer than `limit` passed, past every
    /// event there was — so a stream waiting for rare events does not read again, at each wake,
    /// every event that did not pass since the last one that did. (Sequence order is commit
    /// order, `engine::outbox_lock`: nothing will commit below the newest event seen.) One
    /// statement, so the newest event and the page are read from one snapshot. One execution's
    /// page is a seek on its own index, which skips the events of others whatever the cursor:
    /// its cursor is past its own last event.
    pub async fn events_after(
        &self,
        after: i64,
        filter: &StreamFilter,
        limit: i64,
    ) -> Result<(Vec<OutboxRecord>, i64), StoreError> {
        if filter.workflows.is_empty() {
            return Ok((Vec::new(), after));
        }
        let q = page(after, filter, limit);
        let one_execution = filter.execution_id.is_some();
        if one_execution && let Some(readers) = self.point_readers() {
            // One execution's events (its feed): a read bounded by its key (`outbox_by_execution`)
            // and the page, so on SQLite it runs on the calling thread (`reader.rs`) like the
            // execution reads, not as a hand-off to one of sqlx's threads per wake of every feed,
            // and its rows are decoded as they are stepped.
            let events = readers.decode(&q, |row| crate::rows::outbox_at(row, 0))?;
            let cursor = events.last().map_or(after, |last| last.seq);
            return Ok((events, cursor));
        }
        let rows = if one_execution {
            self.fetch_all(q).await
        } else {
            q.build()
                .fetch_all(&mut *self.read().await.map_err(unavailable)?)
                .await
        }
        .map_err(unavailable)?;
        let mut top = after;
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            if !one_execution {
                top = top.max(
                    row.try_get::<Option<i64>, _>("top")
                        .map_err(unavailable)?
                        .unwrap_or(after),
                );
            }
            // The one row of an empty page has no event.
            if row
                .try_get::<Option<i64>, _>("seq")
                .map_err(unavailable)?
                .is_some()
            {
                events.push(outbox_row(row)?);
            }
        }
        let cursor = match events.last() {
            Some(last) if one_execution || events.len() as i64 >= limit => last.seq,
            _ => top,
        };
        Ok((events, cursor))
    }

    /// The newest event's cursor (0 when there is none).
    pub async fn last_event_seq(&self) -> Result<i64, StoreError> {
        let seq: Option<i64> = sqlx::query_scalar("SELECT MAX(seq) FROM outbox")
            .fetch_one(&mut *self.read().await.map_err(unavailable)?)
            .await
            .map_err(unavailable)?;
        Ok(seq.unwrap_or(0))
    }

    pub async fn insert_stream_token(
        &self,
        hash: &str,
        principal_id: &str,
        key_id: Option<&str>,
        now_ms: Millis,
        expires_ms: Millis,
    ) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM stream_tokens WHERE expires_ms < $1")
            .bind(now_ms - 86_400_000)
            .execute(&self.writer)
            .await
            .map_err(unavailable)?;
        sqlx::query(
            "INSERT INTO stream_tokens (hash, principal_id, key_id, created_ms, expires_ms) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(hash)
        .bind(principal_id)
        .bind(key_id)
        .bind(now_ms)
        .bind(expires_ms)
        .execute(&self.writer)
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    /// What [`Self::consume_stream_token`] would answer, without using the token: a caller that
    /// is refused for another reason (no capacity) keeps its token for the retry.
    pub async fn peek_stream_token(
        &self,
        hash: &str,
        now_ms: Millis,
    ) -> Result<Option<(String, Option<String>)>, StoreError> {
        let row = sqlx::query(
            "SELECT principal_id, key_id FROM stream_tokens WHERE hash = $1 AND used_ms IS NULL AND expires_ms > $2
               AND (key_id IS NULL OR EXISTS (SELECT 1 FROM api_keys
                    WHERE api_keys.id = stream_tokens.key_id AND api_keys.revoked_ms IS NULL AND api_keys.expires_ms > $3))",
        )
        .bind(hash)
        .bind(now_ms)
        .bind(now_ms)
        .fetch_optional(&mut *self.read().await.map_err(unavailable)?)
        .await
        .map_err(unavailable)?;
        let Some(row) = row else { return Ok(None) };
        let principal: String = row.try_get(0).map_err(unavailable)?;
        let key_id: Option<String> = row.try_get(1).map_err(unavailable)?;
        Ok(Some((principal, key_id)))
    }

    /// Uses a token once: its principal and minting key if it exists, is unused, has not
    /// expired, and the key that minted it is still valid (revoking a key voids its tokens).
    pub async fn consume_stream_token(
        &self,
        hash: &str,
        now_ms: Millis,
    ) -> Result<Option<(String, Option<String>)>, StoreError> {
        let row = sqlx::query(
            "UPDATE stream_tokens SET used_ms = $1 WHERE hash = $2 AND used_ms IS NULL AND expires_ms > $3
               AND (key_id IS NULL OR EXISTS (SELECT 1 FROM api_keys
                    WHERE api_keys.id = stream_tokens.key_id AND api_keys.revoked_ms IS NULL AND api_keys.expires_ms > $4))
             RETURNING principal_id, key_id",
        )
        .bind(now_ms)
        .bind(hash)
        .bind(now_ms)
        .bind(now_ms)
        .fetch_optional(&self.writer)
        .await
        .map_err(unavailable)?;
        let Some(row) = row else { return Ok(None) };
        let principal: String = row.try_get(0).map_err(unavailable)?;
        let key_id: Option<String> = row.try_get(1).map_err(unavailable)?;
        Ok(Some((principal, key_id)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A feed's page runs on the calling thread (SQLite's point readers), which is right only
    /// while SQLite reads it through `outbox_by_execution`: the execution's own events from the
    /// cursor on, not every event after the cursor. Whatever the filter adds, the plan must
    /// search that index and scan nothing.
    #[tokio::test]
    async fn a_feed_page_is_read_through_the_executions_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        let Some(readers) = store.point_readers() else {
            // On PostgreSQL a page is a network read that blocks no thread while it waits.
            return;
        };
        let filters = [
            StreamFilter {
                workflows: vec!["w".into()],
                execution_id: Some("e1".into()),
                ..StreamFilter::default()
            },
            StreamFilter {
                workflows: vec!["w".into(), "v".into()],
                events: vec![("StageStarted".into(), "1".into())],
                execution_id: Some("e1".into()),
                principal_id: Some("p".into()),
            },
        ];
        for filter in filters {
            let mut statement = page(0, &filter, 200).into_statements().remove(0);
            statement.text = format!("EXPLAIN QUERY PLAN {}", statement.text).into();
            let rows = readers.fetch(&[statement]).unwrap();
            let plan: Vec<String> = rows.iter().map(|r| r.get("detail")).collect();
            assert!(
                plan.iter()
                    .any(|d| d.contains("o USING INDEX outbox_by_execution (execution_id=?")),
                "{plan:?}"
            );
            assert!(!plan.iter().any(|d| d.starts_with("SCAN o")), "{plan:?}");
            // In the index's order: no sort of the page's rows.
            assert!(!plan.iter().any(|d| d.contains("TEMP B-TREE")), "{plan:?}");
        }
    }
}
