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
/// beside each (one row with no event when none passes), and `through`, when given, bounds the
/// events the read looks at (`seq <= through`) whether or not they pass.
///
/// One execution's page is read from `outbox_by_execution` alone, in its order: joined to the
/// newest `seq`, SQLite could not tell the join yields one row and sorted the page in a
/// temporary B-tree, and read the outbox's right edge besides.
fn page(after: i64, through: Option<i64>, filter: &StreamFilter, limit: i64) -> Sql {
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
    q.push_bind(after).push(bound);
    if let Some(through) = through {
        q.push(" AND o.seq <= ").push_bind(through);
    }
    q.push(" AND o.workflow IN (")
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

/// What one read of the outbox found ([`Store::events_after`]).
#[derive(Debug, Default)]
pub struct EventPage {
    /// The events that passed the filter, in order.
    pub events: Vec<OutboxRecord>,
    /// Where the next read starts (`seq > cursor`).
    pub cursor: i64,
    /// The read saw every event committed before it: the next one can wait for a commit. When
    /// not, more are there to read now.
    pub caught_up: bool,
}

/// The most events a read of every execution's events looks at on SQLite, passing the filter or
/// not. It runs on the calling thread (a tokio worker), so its time is bounded: a stream that
/// is behind (resumed from an old cursor, a filter that little passes) reads on in steps of this
/// many, yielding between them, instead of blocking a worker for a scan of the whole outbox.
const SCAN_AT_MOST: i64 = 1_000;

impl Store {
    /// Up to `limit` events with `seq > after` that pass `filter`, in order, and the cursor to
    /// ask from next: past the last of them, or, when fewer than `limit` passed, past every
    /// event the read looked at — so a stream waiting for rare events does not read again, at
    /// each wake, every event that did not pass since the last one that did. (Sequence order is
    /// commit order, `engine::outbox_lock`: nothing will commit below the newest event seen.)
    /// One statement, so the newest event and the page are read from one snapshot. One
    /// execution's page is a seek on its own index, which skips the events of others whatever
    /// the cursor: its cursor is past its own last event.
    ///
    /// One execution's page is bounded by its key and the page: it goes to the point readers
    /// ([`Store::decode`]) and is decoded as it is read. On SQLite every execution's page is
    /// read on the calling thread too (`reader.rs`), bounded by [`SCAN_AT_MOST`] events looked
    /// at (`caught_up` is false when that cut the read short).
    pub async fn events_after(
        &self,
        after: i64,
        filter: &StreamFilter,
        limit: i64,
    ) -> Result<EventPage, StoreError> {
        if filter.workflows.is_empty() {
            return Ok(EventPage {
                events: Vec::new(),
                cursor: after,
                caught_up: true,
            });
        }
        if filter.execution_id.is_some() {
            let q = page(after, None, filter, limit);
            let events = self
                .decode(&q, |row| crate::rows::outbox_at(row, 0))
                .await?;
            let cursor = events.last().map_or(after, |last| last.seq);
            let caught_up = (events.len() as i64) < limit;
            return Ok(EventPage {
                events,
                cursor,
                caught_up,
            });
        }
        if let Some(readers) = self.point_readers() {
            let through = after.saturating_add(SCAN_AT_MOST);
            let q = page(after, Some(through), filter, limit);
            let at = crate::rows::OUTBOX_COLUMNS.len();
            let mut top = after;
            let rows = readers.decode(&q, |row| {
                top = top.max(crate::rows::Columns::int(row, at)?.unwrap_or(after));
                // The one row of an empty page has no event.
                match crate::rows::Columns::int(row, 0)? {
                    Some(_) => crate::rows::outbox_at(row, 0).map(Some),
                    None => Ok(None),
                }
            })?;
            let events: Vec<OutboxRecord> = rows.into_iter().flatten().collect();
            let full = events.len() as i64 >= limit;
            return Ok(match events.last() {
                Some(last) if full => EventPage {
                    cursor: last.seq,
                    caught_up: false,
                    events,
                },
                _ => EventPage {
                    events,
                    cursor: top.min(through),
                    caught_up: top <= through,
                },
            });
        }
        let q = page(after, None, filter, limit);
        let rows = q
            .build()
            .fetch_all(&mut *self.read().await.map_err(unavailable)?)
            .await
            .map_err(unavailable)?;
        let mut top = after;
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            top = top.max(
                row.try_get::<Option<i64>, _>("top")
                    .map_err(unavailable)?
                    .unwrap_or(after),
            );
            // The one row of an empty page has no event.
            if row
                .try_get::<Option<i64>, _>("seq")
                .map_err(unavailable)?
                .is_some()
            {
                events.push(outbox_row(row)?);
            }
        }
        let caught_up = (events.len() as i64) < limit;
        let cursor = match events.last() {
            Some(last) if !caught_up => last.seq,
            _ => top,
        };
        Ok(EventPage {
            events,
            cursor,
            caught_up,
        })
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

    /// A fresh store of the backend under test. Its point readers are `None` on PostgreSQL,
    /// where a page is a network read that blocks no thread while it waits.
    async fn fresh_store(dir: &std::path::Path) -> Store {
        Store::open(&capstan_testdb::fresh_database_url(dir).await)
            .await
            .unwrap()
    }

    /// What SQLite's planner says it will do with `sql`, one line per step.
    fn plan(readers: &crate::reader::Readers, sql: Sql) -> Vec<String> {
        let mut statement = sql.into_statements().remove(0);
        statement.text = format!("EXPLAIN QUERY PLAN {}", statement.text).into();
        let rows = readers.fetch(&[statement]).unwrap();
        rows.iter().map(|r| r.get("detail")).collect()
    }

    /// A feed's page runs on the calling thread (SQLite's point readers), which is right only
    /// while SQLite reads it through `outbox_by_execution`: the execution's own events from the
    /// cursor on, not every event after the cursor. Whatever the filter adds, the plan must
    /// search that index and scan nothing.
    #[tokio::test]
    async fn a_feed_page_is_read_through_the_executions_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = fresh_store(dir.path()).await;
        let Some(readers) = store.point_readers() else {
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
            let plan = plan(readers, page(0, None, &filter, 200));
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

    /// Every execution's page runs on the calling thread too, which is right only while SQLite
    /// reads it as a range of the outbox's key, from the cursor to the scan's bound: a search,
    /// never a scan of the table. (Joined to the newest `seq`, the page's rows are sorted again:
    /// at most the page's, of the range's.)
    #[tokio::test]
    async fn a_stream_page_is_a_range_of_the_outbox_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = fresh_store(dir.path()).await;
        let Some(readers) = store.point_readers() else {
            return;
        };
        let filter = StreamFilter {
            workflows: vec!["w".into(), "v".into()],
            events: vec![("ExecutionSucceeded".into(), "1".into())],
            execution_id: None,
            principal_id: Some("p".into()),
        };
        let plan = plan(readers, page(7, Some(7 + SCAN_AT_MOST), &filter, 200));
        assert!(
            plan.iter()
                .any(|d| d.starts_with("SEARCH o USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)")),
            "{plan:?}"
        );
        assert!(!plan.iter().any(|d| d.starts_with("SCAN o")), "{plan:?}");
    }

    /// A read of every execution's events looks at [`SCAN_AT_MOST`] events at most: a stream
    /// far behind, whose filter passes none of them, moves its cursor by that many a read, is
    /// told it is not caught up, and gets to the newest event in steps without missing the
    /// one event that passes.
    #[tokio::test]
    async fn a_stream_far_behind_reads_on_in_bounded_steps() {
        use capstan_core::store::{OutboxRecord, RunStore, Write};
        let dir = tempfile::tempdir().unwrap();
        let store = fresh_store(dir.path()).await;
        let event = |n: i64, event_type: &str| {
            Write::Event(OutboxRecord {
                seq: 0,
                event_id: format!("ev{n}"),
                execution_id: format!("e{n}"),
                event_type: event_type.to_owned(),
                event_version: "1".into(),
                principal_id: "p".into(),
                workflow: "w".into(),
                payload_json: capstan_core::store::JsonText::new(&serde_json::json!({})),
                occurred_ms: n,
                traceparent: None,
                routed_ms: None,
                stream_published_ms: None,
                dispatched_ms: None,
            })
        };
        let total = 2 * SCAN_AT_MOST + 300;
        let wanted = SCAN_AT_MOST + 150;
        let writes: Vec<Write> = (1..=total)
            .map(|n| {
                event(
                    n,
                    if n == wanted {
                        "ExecutionSucceeded"
                    } else {
                        "StageStarted"
                    },
                )
            })
            .collect();
        for chunk in writes.chunks(500) {
            store.apply(None, chunk.to_vec()).await.unwrap();
        }
        let newest = store.last_event_seq().await.unwrap();
        let filter = StreamFilter {
            workflows: vec!["w".into()],
            events: vec![("ExecutionSucceeded".into(), "1".into())],
            ..StreamFilter::default()
        };
        let (mut cursor, mut reads, mut seen) = (0, 0, Vec::new());
        loop {
            let page = store.events_after(cursor, &filter, 200).await.unwrap();
            reads += 1;
            assert!(
                page.cursor > cursor || page.caught_up,
                "the cursor moves on"
            );
            if store.point_readers().is_some() {
                assert!(
                    page.cursor - cursor <= SCAN_AT_MOST,
                    "bounded: {cursor} → {}",
                    page.cursor
                );
            }
            seen.extend(page.events.iter().map(|e| e.event_id.clone()));
            cursor = page.cursor;
            if page.caught_up {
                break;
            }
        }
        assert_eq!(seen, [format!("ev{wanted}")]);
        assert_eq!(cursor, newest, "caught up at the newest event");
        if store.point_readers().is_some() {
            assert_eq!(reads, 3, "two bounded steps, then the rest");
        }
    }
}
