//! Retention: what is deleted once it is older than its configured period (`[retention]`,
//! docs/operating.md). Deletes go a batch at a time, so a sweep never holds the writer long.

use crate::Store;
use capstan_core::store::{Millis, StoreError};
use serde::{Deserialize, Serialize};

/// Rows deleted per statement.
const BATCH: i64 = 1_000;

const DAY_MS: Millis = 86_400_000;

/// How long each kind of record is kept, in days; 0 keeps it forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Retention {
    /// Audit records (`GET /v1/audit-logs`).
    pub audit_logs_days: u32,
    /// Outbox events already routed to subscriptions (`GET /v1/executions/{id}/events`, stream
    /// resumption, webhook deliveries of them).
    pub outbox_days: u32,
    /// The journals of executions that ended for good (succeeded, canceled, rolled back), counted
    /// from when they ended. Failed and paused executions keep theirs: a recovery replays it.
    pub journals_days: u32,
    /// The simulated cloud's record of answered tokens.
    pub simulator_effects_days: u32,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            audit_logs_days: 365,
            outbox_days: 30,
            journals_days: 30,
            simulator_effects_days: 30,
        }
    }
}

/// Rows one sweep deleted, per kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub audit_logs: u64,
    pub outbox: u64,
    pub journal_chunks: u64,
    pub simulator_effects: u64,
}

impl Store {
    /// Deletes everything older than its retention at `now_ms`.
    pub async fn sweep(&self, retention: &Retention, now_ms: Millis) -> Result<Swept, StoreError> {
        let cutoff = |days: u32| (days > 0).then(|| now_ms - i64::from(days) * DAY_MS);
        let mut swept = Swept::default();
        if let Some(before) = cutoff(retention.audit_logs_days) {
            swept.audit_logs = self
                .delete_batches(
                    // Keyed by (at_ms, id): the pair finds each row; an id alone has no index.
                    "DELETE FROM audit_logs WHERE (at_ms, id) IN (SELECT at_ms, id FROM audit_logs WHERE at_ms < $1 LIMIT $2)",
                    before,
                )
                .await?;
        }
        if let Some(before) = cutoff(retention.outbox_days) {
            swept.outbox = self
                .delete_batches(
                    "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE occurred_ms < $1 AND routed_ms IS NOT NULL LIMIT $2)",
                    before,
                )
                .await?;
        }
        if let Some(before) = cutoff(retention.journals_days) {
            swept.journal_chunks = self
                .delete_batches(
                    "DELETE FROM journal_chunks WHERE id IN (
                        SELECT c.id FROM journal_chunks c
                        JOIN runs r ON r.id = c.run_id
                        JOIN executions e ON e.id = r.execution_id
                        WHERE r.state = 'done' AND e.status IN ('succeeded', 'canceled', 'rolled_back')
                          AND e.finished_ms < $1
                        LIMIT $2)",
                    before,
                )
                .await?;
        }
        if let Some(before) = cutoff(retention.simulator_effects_days) {
            swept.simulator_effects = self
                .delete_batches(
                    "DELETE FROM sim_effects WHERE token IN (SELECT token FROM sim_effects WHERE at_ms < $1 LIMIT $2)",
                    before,
                )
                .await?
                + self
                    .delete_batches(
                        "DELETE FROM sim_step_effects WHERE idempotency_key IN (SELECT idempotency_key FROM sim_step_effects WHERE created_ms < $1 LIMIT $2)",
                        before,
                    )
                    .await?;
        }
        Ok(swept)
    }

    async fn delete_batches(
        &self,
        statement: &'static str,
        before: Millis,
    ) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let deleted = sqlx::query(statement)
                .bind(before)
                .bind(BATCH)
                .execute(&self.writer)
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))?
                .rows_affected();
            total += deleted;
            if deleted < u64::try_from(BATCH).unwrap_or(u64::MAX) {
                return Ok(total);
            }
            // Let the writer serve others between batches.
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::auth::AuditRecord;

    /// The ids of the audit records kept, newest first.
    async fn audit_ids(store: &Store) -> Vec<String> {
        store
            .audit(&crate::auth::AuditFilter {
                limit: 100,
                ..crate::auth::AuditFilter::default()
            })
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.id)
            .collect()
    }

    #[tokio::test]
    async fn a_sweep_deletes_what_is_older_than_its_period_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        let now = 400 * DAY_MS;
        let audit = |id: &str, at_ms| AuditRecord {
            id: id.to_owned(),
            at_ms,
            principal_id: "p".to_owned(),
            action: "a".to_owned(),
            method: "GET".to_owned(),
            route: "/".to_owned(),
            resource: "/".to_owned(),
            result: "denied".to_owned(),
            execution_id: None,
            ip: None,
            user_agent: None,
        };
        store
            .insert_audit(&audit("old", now - 366 * DAY_MS))
            .await
            .unwrap();
        store
            .insert_audit(&audit("new", now - 364 * DAY_MS))
            .await
            .unwrap();
        for (token, at) in [("old", now - 31 * DAY_MS), ("new", now - DAY_MS)] {
            sqlx::query("INSERT INTO sim_effects (token, op, request, response, at_ms) VALUES ($1, 'dns.change-records', '{}', '{}', $2)")
                .bind(token)
                .bind(at)
                .execute(&store.writer)
                .await
                .unwrap();
        }
        let swept = store.sweep(&Retention::default(), now).await.unwrap();
        assert_eq!(swept.audit_logs, 1);
        assert_eq!(swept.simulator_effects, 1);
        let kept = audit_ids(&store).await;
        assert_eq!(kept, ["new"]);
        let forever = Retention {
            audit_logs_days: 0,
            outbox_days: 0,
            journals_days: 0,
            simulator_effects_days: 0,
        };
        assert_eq!(
            store.sweep(&forever, now * 10).await.unwrap(),
            Swept::default(),
            "0 keeps everything"
        );
    }

    /// More old records than one statement deletes, many to a millisecond (as under load):
    /// the batches go on until none is left, and a record of the cut-off's millisecond stays.
    #[tokio::test]
    async fn the_audit_logs_old_records_go_in_batches_and_the_rest_stays() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        let now = 400 * DAY_MS;
        let cutoff = now - 365 * DAY_MS;
        let old = 2 * BATCH + 7;
        // Five records per millisecond, ending a millisecond before the cut-off.
        sqlx::query(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1)
             INSERT INTO audit_logs (id, at_ms, principal_id, action, method, route, resource, result)
             SELECT 'old-' || i, $2 - 1 - i / 5, 'p', 'a', 'GET', '/', '/', 'allowed' FROM n",
        )
        .bind(old)
        .bind(cutoff)
        .execute(&store.writer)
        .await
        .unwrap();
        for (id, at_ms) in [
            ("at-cutoff-a", cutoff),
            ("at-cutoff-b", cutoff),
            ("later", now),
        ] {
            sqlx::query(
                "INSERT INTO audit_logs (id, at_ms, principal_id, action, method, route, resource, result)
                 VALUES ($1, $2, 'p', 'a', 'GET', '/', '/', 'allowed')",
            )
            .bind(id)
            .bind(at_ms)
            .execute(&store.writer)
            .await
            .unwrap();
        }
        let swept = store.sweep(&Retention::default(), now).await.unwrap();
        assert_eq!(swept.audit_logs, u64::try_from(old).unwrap());
        let kept = audit_ids(&store).await;
        assert_eq!(
            kept,
            ["later", "at-cutoff-b", "at-cutoff-a"],
            "newest first"
        );
    }
}
