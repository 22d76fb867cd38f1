//! Partner booking webhooks: registrations (each with its signing secret sealed) and the
//! delivery queue. Deliveries are queued in the transaction of the status change
//! (`record_status`), so a committed change is never lost. The dispatcher (host/api
//! `partner::delivery`) sends them with the documented retry rules: it takes only the oldest
//! pending delivery of each (webhook, booking), so a receiver sees a booking's changes in order,
//! and claims each with a lease on its due time, so no other pass or node sends it meanwhile and
//! a crash leaves it due again.

use crate::{BookingError, Bookings, Environment};
use serde_json::{Value, json};
use sqlx::Row;

#[derive(Debug, Clone, PartialEq)]
pub struct WebhookRow {
    pub id: i64,
    pub partner_id: String,
    pub url: String,
    pub enabled: bool,
    pub kms_key_id: String,
    pub secret_sealed: String,
    pub created_ms: i64,
    pub updated_ms: i64,
}

impl WebhookRow {
    pub fn to_json(&self) -> Value {
        json!({"id": self.id.to_string(), "url": self.url, "enabled": self.enabled, "createdAt": self.created_ms, "updatedAt": self.updated_ms})
    }
}

fn from_row(r: &sqlx::any::AnyRow) -> WebhookRow {
    WebhookRow {
        id: r.get("id"),
        partner_id: r.get("partner_id"),
        url: r.get("url"),
        enabled: r.get::<i64, _>("enabled") == 1,
        kms_key_id: r.get("kms_key_id"),
        secret_sealed: r.get("secret_sealed"),
        created_ms: r.get("created_ms"),
        updated_ms: r.get("updated_ms"),
    }
}

const SELECT: &str = "SELECT id, partner_id, url, enabled, kms_key_id, secret_sealed, created_ms, updated_ms FROM booking_webhooks";

/// A delivery due now, with what the dispatcher needs to send it.
#[derive(Debug, Clone)]
pub struct DueDelivery {
    pub id: i64,
    pub webhook_id: i64,
    pub url: String,
    pub kms_key_id: String,
    pub secret_sealed: String,
    pub payload: String,
    pub message_id: String,
    pub attempts: i64,
    /// When it was due (the claim compares it, so two dispatchers never send it both).
    pub next_attempt_ms: i64,
}

/// What an attempt came to.
#[derive(Debug, Clone)]
pub enum AttemptOutcome {
    Delivered {
        code: u16,
    },
    Retry {
        code: Option<u16>,
        error: String,
        next_attempt_ms: i64,
    },
    /// A final failure: `exhausted` after the last retry, `failed` for a permanent answer.
    Final {
        code: Option<u16>,
        error: String,
        exhausted: bool,
    },
}

impl Bookings {
    pub async fn create_webhook(
        &self,
        env: Environment,
        partner_id: &str,
        url: &str,
        enabled: bool,
        kms_key_id: &str,
        secret_sealed: &str,
    ) -> Result<WebhookRow, BookingError> {
        let now = self.now_ms();
        let id: i64 = sqlx::query(
            "INSERT INTO booking_webhooks (environment, partner_id, url, enabled, kms_key_id, secret_sealed, created_ms, updated_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
        )
        .bind(env.as_str())
        .bind(partner_id)
        .bind(url)
        .bind(i64::from(enabled))
        .bind(kms_key_id)
        .bind(secret_sealed)
        .bind(now)
        .bind(now)
        .fetch_one(self.store().writer())
        .await?
        .get(0);
        self.webhook(env, partner_id, &id.to_string()).await
    }

    pub async fn webhooks(
        &self,
        env: Environment,
        partner_id: &str,
    ) -> Result<Vec<WebhookRow>, BookingError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{SELECT} WHERE environment = $1 AND partner_id = $2 AND deleted_ms IS NULL ORDER BY id"
        )))
        .bind(env.as_str())
        .bind(partner_id)
        .fetch_all(self.store().pool())
        .await?;
        Ok(rows.iter().map(from_row).collect())
    }

    /// 400 non-numeric id, 404 unknown or deleted, 403 another partner's.
    pub async fn webhook(
        &self,
        env: Environment,
        partner_id: &str,
        id: &str,
    ) -> Result<WebhookRow, BookingError> {
        let id: i64 = id
            .parse()
            .map_err(|_| BookingError::invalid(format!("`{id}` is not a valid webhook id")))?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{SELECT} WHERE id = $1 AND environment = $2 AND deleted_ms IS NULL"
        )))
        .bind(id)
        .bind(env.as_str())
        .fetch_optional(self.store().writer())
        .await?
        .map(|r| from_row(&r))
        .ok_or_else(|| BookingError::not_found(format!("webhook {id} does not exist")))?;
        if row.partner_id != partner_id {
            return Err(BookingError::new(
                403,
                "E_FORBIDDEN",
                format!("webhook {id} belongs to another partner"),
            ));
        }
        Ok(row)
    }

    pub async fn update_webhook(
        &self,
        env: Environment,
        partner_id: &str,
        id: &str,
        url: Option<&str>,
        enabled: Option<bool>,
    ) -> Result<WebhookRow, BookingError> {
        let row = self.webhook(env, partner_id, id).await?;
        sqlx::query(
            "UPDATE booking_webhooks SET url = $1, enabled = $2, updated_ms = $3 WHERE id = $4",
        )
        .bind(url.unwrap_or(&row.url))
        .bind(i64::from(enabled.unwrap_or(row.enabled)))
        .bind(self.now_ms())
        .bind(row.id)
        .execute(self.store().writer())
        .await?;
        self.webhook(env, partner_id, id).await
    }

    /// Deletes a registration; its pending deliveries fail with "webhook deleted".
    pub async fn delete_webhook(
        &self,
        env: Environment,
        partner_id: &str,
        id: &str,
    ) -> Result<(), BookingError> {
        let row = self.webhook(env, partner_id, id).await?;
        let mut tx = self.store().begin_write().await?;
        sqlx::query("UPDATE booking_webhooks SET deleted_ms = $1, enabled = 0 WHERE id = $2")
            .bind(self.now_ms())
            .bind(row.id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE booking_webhook_deliveries SET status = 'failed', last_error = 'webhook deleted', next_attempt_ms = NULL WHERE webhook_id = $1 AND status = 'pending'")
            .bind(row.id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Pending deliveries due at `now`, at most one per (webhook, booking) — the oldest — so a
    /// receiver sees each booking's changes in order.
    pub async fn due_webhook_deliveries(
        &self,
        limit: i64,
    ) -> Result<Vec<DueDelivery>, BookingError> {
        let rows = sqlx::query(
            "SELECT d.id, d.webhook_id, w.url, w.kms_key_id, w.secret_sealed, d.payload, d.message_id, d.attempts, d.next_attempt_ms
             FROM booking_webhook_deliveries d JOIN booking_webhooks w ON w.id = d.webhook_id
             WHERE d.status = 'pending' AND d.next_attempt_ms <= $1
               AND NOT EXISTS (SELECT 1 FROM booking_webhook_deliveries e
                               WHERE e.webhook_id = d.webhook_id AND e.booking_id = d.booking_id
                                 AND e.status = 'pending' AND e.event_seq < d.event_seq)
             ORDER BY d.next_attempt_ms, d.id LIMIT $2",
        )
        .bind(self.now_ms())
        .bind(limit)
        .fetch_all(self.store().pool())
        .await?;
        Ok(rows
            .iter()
            .map(|r| DueDelivery {
                id: r.get(0),
                webhook_id: r.get(1),
                url: r.get(2),
                kms_key_id: r.get(3),
                secret_sealed: r.get(4),
                payload: r.get(5),
                message_id: r.get(6),
                attempts: r.get(7),
                next_attempt_ms: r.get(8),
            })
            .collect())
    }

    /// Claims a due delivery for one attempt: pushes its due time to `lease_until_ms` (the
    /// attempt's time limit and a margin) so no other pass or node sends it meanwhile; after a
    /// crash it is due again when the lease passes. `false` when someone else claimed it first.
    pub async fn claim_webhook_delivery(
        &self,
        d: &DueDelivery,
        lease_until_ms: i64,
    ) -> Result<bool, BookingError> {
        let done = sqlx::query(
            "UPDATE booking_webhook_deliveries SET next_attempt_ms = $1 WHERE id = $2 AND status = 'pending' AND next_attempt_ms = $3",
        )
        .bind(lease_until_ms)
        .bind(d.id)
        .bind(d.next_attempt_ms)
        .execute(self.store().writer())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Moves a claimed delivery's lease from `held_until_ms` to `until_ms`; `false` when the
    /// lease is no longer this claim's (it lapsed and another pass took it, or it finished).
    pub async fn renew_webhook_lease(
        &self,
        id: i64,
        held_until_ms: i64,
        until_ms: i64,
    ) -> Result<bool, BookingError> {
        let done = sqlx::query(
            "UPDATE booking_webhook_deliveries SET next_attempt_ms = $1 WHERE id = $2 AND status = 'pending' AND next_attempt_ms = $3",
        )
        .bind(until_ms)
        .bind(id)
        .bind(held_until_ms)
        .execute(self.store().writer())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    pub async fn finish_webhook_attempt(
        &self,
        id: i64,
        outcome: &AttemptOutcome,
    ) -> Result<(), BookingError> {
        let (status, code, error, next) = match outcome {
            AttemptOutcome::Delivered { code } => ("succeeded", Some(*code), None, None),
            AttemptOutcome::Retry {
                code,
                error,
                next_attempt_ms,
            } => (
                "pending",
                *code,
                Some(error.as_str()),
                Some(*next_attempt_ms),
            ),
            AttemptOutcome::Final {
                code,
                error,
                exhausted,
            } => (
                if *exhausted { "exhausted" } else { "failed" },
                *code,
                Some(error.as_str()),
                None,
            ),
        };
        sqlx::query(
            "UPDATE booking_webhook_deliveries SET attempts = attempts + 1, status = $1, response_code = $2, last_error = $3, next_attempt_ms = $4
             WHERE id = $5 AND status = 'pending'",
        )
        .bind(status)
        .bind(code.map(i64::from))
        .bind(error)
        .bind(next)
        .bind(id)
        .execute(self.store().writer())
        .await?;
        Ok(())
    }

    /// The delivery history of a webhook, newest first (`GET .../webhooks/{id}/deliveries/`).
    pub async fn webhook_deliveries(
        &self,
        webhook_id: i64,
        limit: i64,
    ) -> Result<Vec<Value>, BookingError> {
        let rows = sqlx::query(
            "SELECT id, booking_id, payload, message_id, attempts, status, next_attempt_ms, response_code, last_error, created_ms
             FROM booking_webhook_deliveries WHERE webhook_id = $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(webhook_id)
        .bind(limit)
        .fetch_all(self.store().pool())
        .await?;
        Ok(rows
            .iter()
            .map(|r| {
                json!({
                    "id": r.get::<i64, _>(0).to_string(),
                    "bookingId": r.get::<i64, _>(1),
                    "payload": serde_json::from_str::<Value>(r.get::<&str, _>(2)).unwrap_or(Value::Null),
                    "webhookId": r.get::<&str, _>(3),
                    "attempts": r.get::<i64, _>(4),
                    "status": r.get::<&str, _>(5),
                    "nextAttemptAt": r.get::<Option<i64>, _>(6),
                    "responseCode": r.get::<Option<i64>, _>(7),
                    "lastError": r.get::<Option<String>, _>(8),
                    "createdAt": r.get::<i64, _>(9),
                })
            })
            .collect())
    }
}
