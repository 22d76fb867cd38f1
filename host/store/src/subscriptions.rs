//! Webhook subscriptions, delivery attempts and the relay's cursor over the outbox.

use crate::Store;
use crate::engine::{outbox_row, unavailable};
use capstan_core::store::{Millis, OutboxRecord, StoreError};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionRecord {
    pub id: String,
    pub owner_principal_id: String,
    pub url: String,
    pub events: Vec<String>,
    pub active: bool,
    pub health: String,
    pub kms_key_id: String,
    pub secret_sealed: String,
    pub previous_kms_key_id: Option<String>,
    pub previous_secret_sealed: Option<String>,
    pub previous_until_ms: Option<Millis>,
    pub created_ms: Millis,
    pub deleted_ms: Option<Millis>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    pub id: String,
    pub subscription_id: String,
    pub event_id: String,
    pub event_seq: i64,
    pub attempt: i64,
    pub status: String,
    pub created_ms: Millis,
    pub next_attempt_ms: Option<Millis>,
    pub dispatched_ms: Option<Millis>,
    pub response_code: Option<i64>,
    pub last_error: Option<String>,
}

fn subscription_row(r: &SqliteRow) -> SubscriptionRecord {
    SubscriptionRecord {
        id: r.get("id"),
        owner_principal_id: r.get("owner_principal_id"),
        url: r.get("url"),
        events: serde_json::from_str(&r.get::<String, _>("events")).unwrap_or_default(),
        active: r.get("active"),
        health: r.get("health"),
        kms_key_id: r.get("kms_key_id"),
        secret_sealed: r.get("secret_sealed"),
        previous_kms_key_id: r.get("previous_kms_key_id"),
        previous_secret_sealed: r.get("previous_secret_sealed"),
        previous_until_ms: r.get("previous_until_ms"),
        created_ms: r.get("created_ms"),
        deleted_ms: r.get("deleted_ms"),
    }
}

fn delivery_row(r: &SqliteRow) -> DeliveryRecord {
    DeliveryRecord {
        id: r.get("id"),
        subscription_id: r.get("subscription_id"),
        event_id: r.get("event_id"),
        event_seq: r.get("event_seq"),
        attempt: r.get("attempt"),
        status: r.get("status"),
        created_ms: r.get("created_ms"),
        next_attempt_ms: r.get("next_attempt_ms"),
        dispatched_ms: r.get("dispatched_ms"),
        response_code: r.get("response_code"),
        last_error: r.get("last_error"),
    }
}

/// One delivery to create: event × subscription.
#[derive(Debug, Clone)]
pub struct Route {
    pub subscription_id: String,
    pub event: OutboxRecord,
}

impl Store {
    pub async fn insert_subscription(&self, s: &SubscriptionRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO subscriptions (id, owner_principal_id, url, events, active, health, kms_key_id,
             secret_sealed, created_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&s.id)
        .bind(&s.owner_principal_id)
        .bind(&s.url)
        .bind(serde_json::to_string(&s.events).unwrap_or_default())
        .bind(s.active)
        .bind(&s.health)
        .bind(&s.kms_key_id)
        .bind(&s.secret_sealed)
        .bind(s.created_ms)
        .execute(&self.writer)
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    pub async fn subscription(&self, id: &str) -> Result<Option<SubscriptionRecord>, StoreError> {
        let row = sqlx::query("SELECT * FROM subscriptions WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(row.as_ref().map(subscription_row))
    }

    /// The owner's subscriptions (deleted ones excluded), newest first.
    pub async fn subscriptions_of(
        &self,
        owner: &str,
        limit: i64,
    ) -> Result<Vec<SubscriptionRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM subscriptions WHERE owner_principal_id = ? AND deleted_ms IS NULL
             ORDER BY created_ms DESC, id DESC LIMIT ?",
        )
        .bind(owner)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(rows.iter().map(subscription_row).collect())
    }

    /// Active subscriptions (the relay routes events to them).
    pub async fn active_subscriptions(&self) -> Result<Vec<SubscriptionRecord>, StoreError> {
        let rows =
            sqlx::query("SELECT * FROM subscriptions WHERE active = 1 AND deleted_ms IS NULL")
                .fetch_all(&self.pool)
                .await
                .map_err(unavailable)?;
        Ok(rows.iter().map(subscription_row).collect())
    }

    pub async fn update_subscription(
        &self,
        id: &str,
        active: Option<bool>,
        events: Option<&[String]>,
        health: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE subscriptions SET active = COALESCE(?, active), events = COALESCE(?, events),
             health = COALESCE(?, health) WHERE id = ?",
        )
        .bind(active)
        .bind(events.map(|e| serde_json::to_string(e).unwrap_or_default()))
        .bind(health)
        .bind(id)
        .execute(&self.writer)
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    /// Replaces the secret; the old one keeps signing until `previous_until_ms`.
    pub async fn rotate_subscription_secret(
        &self,
        id: &str,
        kms_key_id: &str,
        sealed: &str,
        previous_until_ms: Millis,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE subscriptions SET previous_kms_key_id = kms_key_id, previous_secret_sealed = secret_sealed,
             previous_until_ms = ?, kms_key_id = ?, secret_sealed = ? WHERE id = ?",
        )
        .bind(previous_until_ms)
        .bind(kms_key_id)
        .bind(sealed)
        .bind(id)
        .execute(&self.writer)
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    /// Disables a subscription for good (its history is kept) and fails its pending attempts, in
    /// one transaction.
    pub async fn delete_subscription(
        &self,
        id: &str,
        now: Millis,
        reason: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(unavailable)?;
        sqlx::query(
            "UPDATE subscriptions SET active = 0, health = 'disabled', deleted_ms = COALESCE(deleted_ms, ?),
             disabled_reason = ? WHERE id = ?",
        )
        .bind(now)
        .bind(reason)
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?;
        sqlx::query(
            "UPDATE deliveries SET status = 'failed', next_attempt_ms = NULL, last_error = ?
             WHERE subscription_id = ? AND status = 'pending'",
        )
        .bind(format!("subscription disabled: {reason}"))
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        Ok(())
    }

    pub async fn deliveries_of(
        &self,
        subscription_id: &str,
        limit: i64,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM deliveries WHERE subscription_id = ? ORDER BY created_ms DESC, attempt DESC LIMIT ?",
        )
        .bind(subscription_id)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(rows.iter().map(delivery_row).collect())
    }

    /// The outbox events after the relay's cursor.
    pub async fn unrouted_events(
        &self,
        limit: i64,
    ) -> Result<(i64, Vec<OutboxRecord>), StoreError> {
        let cursor: Option<i64> =
            sqlx::query_scalar("SELECT seq FROM relay_cursor WHERE name = 'webhooks'")
                .fetch_optional(&self.pool)
                .await
                .map_err(unavailable)?;
        let cursor = cursor.unwrap_or(0);
        let rows = sqlx::query("SELECT * FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?")
            .bind(cursor)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok((
            cursor,
            rows.iter().map(outbox_row).collect::<Result<_, _>>()?,
        ))
    }

    /// In one transaction: the deliveries for `routes`, `routedAt` on the events, the cursor.
    /// `expected` guards against two relays advancing the same cursor.
    pub async fn record_routes(
        &self,
        expected: i64,
        to: i64,
        routed: &[i64],
        routes: &[Route],
        now: Millis,
    ) -> Result<bool, StoreError> {
        let mut tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(unavailable)?;
        let current: Option<i64> =
            sqlx::query_scalar("SELECT seq FROM relay_cursor WHERE name = 'webhooks'")
                .fetch_optional(&mut *tx)
                .await
                .map_err(unavailable)?;
        if current.unwrap_or(0) != expected {
            return Ok(false);
        }
        for r in routes {
            sqlx::query(
                "INSERT INTO deliveries (id, subscription_id, event_id, event_seq, attempt, status, created_ms, next_attempt_ms)
                 VALUES (?, ?, ?, ?, 1, 'pending', ?, ?)",
            )
            .bind(capstan_core::ids::new_id())
            .bind(&r.subscription_id)
            .bind(&r.event.event_id)
            .bind(r.event.seq)
            .bind(now)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
        }
        for seq in routed {
            sqlx::query("UPDATE outbox SET routed_ms = COALESCE(routed_ms, ?) WHERE seq = ?")
                .bind(now)
                .bind(seq)
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?;
        }
        // Every event the relay passed is published to this node's streams (they read the outbox).
        sqlx::query(
            "UPDATE outbox SET stream_published_ms = COALESCE(stream_published_ms, ?) WHERE seq > ? AND seq <= ?",
        )
        .bind(now)
        .bind(expected)
        .bind(to)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?;
        sqlx::query(
            "INSERT INTO relay_cursor (name, seq) VALUES ('webhooks', ?) ON CONFLICT (name) DO UPDATE SET seq = excluded.seq",
        )
        .bind(to)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        Ok(true)
    }

    /// Due attempts, at most one per subscription: the oldest pending event of each subscription
    /// (so a subscriber gets an execution's events in order), if its time has come.
    pub async fn due_deliveries(
        &self,
        now: Millis,
        limit: i64,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT d.* FROM deliveries d
             WHERE d.status = 'pending' AND d.next_attempt_ms <= ?
               AND d.event_seq = (SELECT MIN(p.event_seq) FROM deliveries p
                                  WHERE p.subscription_id = d.subscription_id AND p.status = 'pending')
             ORDER BY d.next_attempt_ms LIMIT ?",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(rows.iter().map(delivery_row).collect())
    }

    /// Records an attempt's result; `next` (attempt, at) queues the next attempt as a new row.
    #[allow(clippy::too_many_arguments)]
    pub async fn finish_attempt(
        &self,
        delivery: &DeliveryRecord,
        status: &str,
        response_code: Option<i64>,
        last_error: Option<&str>,
        dispatched_ms: Millis,
        next_at: Option<Millis>,
    ) -> Result<(), StoreError> {
        let mut tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(unavailable)?;
        sqlx::query(
            "UPDATE deliveries SET status = ?, response_code = ?, last_error = ?, dispatched_ms = ?, next_attempt_ms = NULL
             WHERE id = ? AND status = 'pending'",
        )
        .bind(status)
        .bind(response_code)
        .bind(last_error)
        .bind(dispatched_ms)
        .bind(&delivery.id)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?;
        if let Some(at) = next_at {
            sqlx::query(
                "INSERT INTO deliveries (id, subscription_id, event_id, event_seq, attempt, status, created_ms, next_attempt_ms)
                 VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)",
            )
            .bind(capstan_core::ids::new_id())
            .bind(&delivery.subscription_id)
            .bind(&delivery.event_id)
            .bind(delivery.event_seq)
            .bind(delivery.attempt + 1)
            .bind(dispatched_ms)
            .bind(at)
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
        }
        if status == "succeeded" {
            sqlx::query(
                "UPDATE outbox SET dispatched_ms = COALESCE(dispatched_ms, ?) WHERE event_id = ?",
            )
            .bind(dispatched_ms)
            .bind(&delivery.event_id)
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
        }
        tx.commit().await.map_err(unavailable)?;
        Ok(())
    }

    /// A manual redelivery: a new pending attempt now (or the pending one if there is one).
    pub async fn redeliver(
        &self,
        subscription_id: &str,
        event_id: &str,
        now: Millis,
    ) -> Result<Option<DeliveryRecord>, StoreError> {
        let mut tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(unavailable)?;
        let last = sqlx::query(
            "SELECT * FROM deliveries WHERE subscription_id = ? AND event_id = ? ORDER BY attempt DESC LIMIT 1",
        )
        .bind(subscription_id)
        .bind(event_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(unavailable)?;
        let Some(last) = last.as_ref().map(delivery_row) else {
            return Ok(None);
        };
        if last.status == "pending" {
            return Ok(Some(last));
        }
        let id = capstan_core::ids::new_id();
        sqlx::query(
            "INSERT INTO deliveries (id, subscription_id, event_id, event_seq, attempt, status, created_ms, next_attempt_ms)
             VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)",
        )
        .bind(&id)
        .bind(subscription_id)
        .bind(event_id)
        .bind(last.event_seq)
        .bind(last.attempt + 1)
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?;
        let row = sqlx::query("SELECT * FROM deliveries WHERE id = ?")
            .bind(&id)
            .fetch_one(&mut *tx)
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        Ok(Some(delivery_row(&row)))
    }

    /// Recent attempt results of a subscription, newest first (for its health).
    pub async fn recent_results(
        &self,
        subscription_id: &str,
        n: i64,
    ) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar(
            "SELECT status FROM deliveries WHERE subscription_id = ? AND status != 'pending'
             ORDER BY dispatched_ms DESC LIMIT ?",
        )
        .bind(subscription_id)
        .bind(n)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)
    }

    pub async fn outbox_event(&self, event_id: &str) -> Result<Option<OutboxRecord>, StoreError> {
        let row = sqlx::query("SELECT * FROM outbox WHERE event_id = ?")
            .bind(event_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)?;
        row.as_ref().map(outbox_row).transpose()
    }
}
