//! Operator overrides of event-version lifecycles (`event_versions`), and the subscribers of a
//! version (for `GET /v1/admin/event-versions/{type}/{version}/usage`).
//!
//! The catalog in code (capstan-engine `catalog`) gives each version its lifecycle; a row here
//! overrides it: `deprecate` marks a version deprecated (with an optional replacement), and
//! `archive` moves a deprecated version to archived. Archival is one-way.

use crate::Store;
use sqlx::Row;

/// A version's lifecycle as stored (times in Unix milliseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventVersionRecord {
    pub event_type: String,
    pub event_version: String,
    /// `active`, `deprecated` or `archived`.
    pub state: String,
    pub deprecated_ms: Option<i64>,
    pub archived_ms: Option<i64>,
    pub replacement: Option<String>,
}

/// What `archive_event_version` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveOutcome {
    /// The version is now archived (this is its stored lifecycle).
    Archived(EventVersionRecord),
    /// Only a deprecated version can be archived; this is its current state.
    NotDeprecated { state: String },
}

/// One subscription that names a version (EventVersionUsage.subscribers[]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventVersionSubscriber {
    pub subscription_id: String,
    pub owner_principal_id: String,
    pub active: bool,
    pub health: String,
}

fn row(r: &sqlx::any::AnyRow) -> EventVersionRecord {
    EventVersionRecord {
        event_type: r.get("event_type"),
        event_version: r.get("event_version"),
        state: r.get("state"),
        deprecated_ms: r.get("deprecated_ms"),
        archived_ms: r.get("archived_ms"),
        replacement: r.get("replacement"),
    }
}

impl Store {
    /// Every override, by type then version.
    pub async fn event_version_overrides(&self) -> Result<Vec<EventVersionRecord>, sqlx::Error> {
        let rows = sqlx::query("SELECT * FROM event_versions ORDER BY event_type, event_version")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(row).collect())
    }

    /// The override of one version, if any.
    pub async fn event_version_override(
        &self,
        event_type: &str,
        event_version: &str,
    ) -> Result<Option<EventVersionRecord>, sqlx::Error> {
        let r = sqlx::query(
            "SELECT * FROM event_versions WHERE event_type = $1 AND event_version = $2",
        )
        .bind(event_type)
        .bind(event_version)
        .fetch_optional(&self.pool)
        .await?;
        Ok(r.as_ref().map(row))
    }

    /// Marks a version deprecated at `now_ms` (the first deprecation time is kept), with the
    /// `<EventType>.v<N>` subscribers should move to. An archived version stays archived.
    /// Returns the stored lifecycle.
    pub async fn deprecate_event_version(
        &self,
        event_type: &str,
        event_version: &str,
        replacement: Option<&str>,
        now_ms: i64,
    ) -> Result<EventVersionRecord, sqlx::Error> {
        let r = sqlx::query(
            "INSERT INTO event_versions (event_type, event_version, state, deprecated_ms, archived_ms, replacement, updated_ms)
             VALUES ($1, $2, 'deprecated', $3, NULL, $4, $5)
             ON CONFLICT (event_type, event_version) DO UPDATE SET
                 state = CASE WHEN event_versions.state = 'archived' THEN event_versions.state ELSE 'deprecated' END,
                 deprecated_ms = COALESCE(event_versions.deprecated_ms, excluded.deprecated_ms),
                 replacement = CASE WHEN event_versions.state = 'archived' THEN event_versions.replacement
                                    ELSE COALESCE(excluded.replacement, event_versions.replacement) END,
                 updated_ms = excluded.updated_ms
             RETURNING *",
        )
        .bind(event_type)
        .bind(event_version)
        .bind(now_ms)
        .bind(replacement)
        .bind(now_ms)
        .fetch_one(&self.writer)
        .await?;
        Ok(row(&r))
    }

    /// Archives a deprecated version at `now_ms`. `code` is the version's lifecycle in the
    /// catalog, used when no override exists (a version may be deprecated in code). Atomic: the
    /// check and the write happen in one transaction on the single writer.
    pub async fn archive_event_version(
        &self,
        code: &EventVersionRecord,
        now_ms: i64,
    ) -> Result<ArchiveOutcome, sqlx::Error> {
        let mut tx = self.writer.begin().await?;
        let stored = sqlx::query(
            "SELECT * FROM event_versions WHERE event_type = $1 AND event_version = $2",
        )
        .bind(&code.event_type)
        .bind(&code.event_version)
        .fetch_optional(&mut *tx)
        .await?;
        let current = stored.as_ref().map(row).unwrap_or_else(|| code.clone());
        if current.state != "deprecated" {
            tx.rollback().await?;
            return Ok(ArchiveOutcome::NotDeprecated {
                state: current.state,
            });
        }
        let r = sqlx::query(
            "INSERT INTO event_versions (event_type, event_version, state, deprecated_ms, archived_ms, replacement, updated_ms)
             VALUES ($1, $2, 'archived', $3, $4, $5, $6)
             ON CONFLICT (event_type, event_version) DO UPDATE SET
                 state = 'archived', deprecated_ms = excluded.deprecated_ms,
                 archived_ms = excluded.archived_ms, replacement = excluded.replacement,
                 updated_ms = excluded.updated_ms
             RETURNING *",
        )
        .bind(&current.event_type)
        .bind(&current.event_version)
        .bind(current.deprecated_ms.or(Some(now_ms)))
        .bind(now_ms)
        .bind(&current.replacement)
        .bind(now_ms)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(ArchiveOutcome::Archived(row(&r)))
    }

    /// Removes the override of a version (it returns to its lifecycle in code). For operators
    /// and tests; not exposed by the API.
    pub async fn reset_event_version(
        &self,
        event_type: &str,
        event_version: &str,
    ) -> Result<bool, sqlx::Error> {
        let done =
            sqlx::query("DELETE FROM event_versions WHERE event_type = $1 AND event_version = $2")
                .bind(event_type)
                .bind(event_version)
                .execute(&self.writer)
                .await?;
        Ok(done.rows_affected() > 0)
    }

    /// The webhook subscriptions whose `events` filter names `<event_type>.v<event_version>`.
    pub async fn event_version_subscribers(
        &self,
        event_type: &str,
        event_version: &str,
    ) -> Result<Vec<EventVersionSubscriber>, sqlx::Error> {
        let name = format!("{event_type}.v{event_version}");
        // The filter is a JSON array; matched here rather than with a backend's JSON functions.
        let rows = sqlx::query(
            "SELECT s.id, s.owner_principal_id, s.active, s.health, s.events FROM subscriptions s ORDER BY s.id",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .filter(|r| {
                serde_json::from_str::<Vec<String>>(&r.get::<String, _>("events"))
                    .is_ok_and(|events| events.contains(&name))
            })
            .map(|r| EventVersionSubscriber {
                subscription_id: r.get("id"),
                owner_principal_id: r.get("owner_principal_id"),
                active: crate::flag(r, "active"),
                health: r.get("health"),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn code(ty: &str, state: &str) -> EventVersionRecord {
        EventVersionRecord {
            event_type: ty.into(),
            event_version: "1".into(),
            state: state.into(),
            deprecated_ms: None,
            archived_ms: None,
            replacement: None,
        }
    }

    #[tokio::test]
    async fn deprecate_then_archive_is_one_way() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        let active = code("StageFailed", "active");
        assert_eq!(
            store.archive_event_version(&active, 5).await.unwrap(),
            ArchiveOutcome::NotDeprecated {
                state: "active".into()
            }
        );
        assert!(store.event_version_overrides().await.unwrap().is_empty());

        let d = store
            .deprecate_event_version("StageFailed", "1", Some("StageFailed.v2"), 10)
            .await
            .unwrap();
        assert_eq!(d.state, "deprecated");
        assert_eq!(d.deprecated_ms, Some(10));
        let again = store
            .deprecate_event_version("StageFailed", "1", None, 20)
            .await
            .unwrap();
        assert_eq!(
            again.deprecated_ms,
            Some(10),
            "the first deprecation time is kept"
        );
        assert_eq!(again.replacement.as_deref(), Some("StageFailed.v2"));

        let ArchiveOutcome::Archived(a) = store.archive_event_version(&active, 30).await.unwrap()
        else {
            panic!("not archived")
        };
        assert_eq!(a.state, "archived");
        assert_eq!((a.deprecated_ms, a.archived_ms), (Some(10), Some(30)));
        assert_eq!(
            store.archive_event_version(&active, 40).await.unwrap(),
            ArchiveOutcome::NotDeprecated {
                state: "archived".into()
            }
        );
        let still = store
            .deprecate_event_version("StageFailed", "1", Some("X.v9"), 50)
            .await
            .unwrap();
        assert_eq!(still.state, "archived", "archival is one-way");
        assert_eq!(still.replacement.as_deref(), Some("StageFailed.v2"));

        // Deprecated in code, no override: archivable.
        let mut in_code = code("ExecutionQueued", "deprecated");
        in_code.deprecated_ms = Some(7);
        let ArchiveOutcome::Archived(b) = store.archive_event_version(&in_code, 60).await.unwrap()
        else {
            panic!("not archived")
        };
        assert_eq!((b.deprecated_ms, b.archived_ms), (Some(7), Some(60)));
        assert!(
            store
                .reset_event_version("ExecutionQueued", "1")
                .await
                .unwrap()
        );
        assert!(
            store
                .event_version_override("ExecutionQueued", "1")
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            store
                .event_version_subscribers("StageFailed", "1")
                .await
                .unwrap()
                .is_empty()
        );
    }
}
