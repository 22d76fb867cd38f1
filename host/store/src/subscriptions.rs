//! Webhook subscriptions, delivery attempts and the relay's cursor over the outbox.

use crate::engine::{Batch, SELECT_OUTBOX, outbox_row, unavailable};
use crate::{Sql, Store};
use capstan_core::store::{Millis, OutboxRecord, StoreError};
use sqlx::Row;
use sqlx::any::AnyRow;
use std::sync::LazyLock;

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
    /// The relay routes it the outbox events after this `seq`: [`Store::insert_subscription`]
    /// sets it to the outbox's last `seq` at creation (the value given is not used), so a new
    /// subscription receives the events committed after it, never earlier ones the relay had not
    /// passed yet.
    pub after_seq: i64,
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

impl SubscriptionRecord {
    /// Whether the relay routes `event` here: one of the event versions it names
    /// (`<type>.v<version>`), committed after it was created.
    pub fn wants(&self, event: &OutboxRecord) -> bool {
        event.seq > self.after_seq
            && self.events.iter().any(|name| {
                name.strip_prefix(event.event_type.as_str())
                    .and_then(|rest| rest.strip_prefix(".v"))
                    == Some(event.event_version.as_str())
            })
    }
}

fn subscription_row(r: &AnyRow) -> SubscriptionRecord {
    SubscriptionRecord {
        id: r.get("id"),
        owner_principal_id: r.get("owner_principal_id"),
        url: r.get("url"),
        events: serde_json::from_str(&r.get::<String, _>("events")).unwrap_or_default(),
        active: crate::flag(r, "active"),
        health: r.get("health"),
        kms_key_id: r.get("kms_key_id"),
        secret_sealed: r.get("secret_sealed"),
        previous_kms_key_id: r.get("previous_kms_key_id"),
        previous_secret_sealed: r.get("previous_secret_sealed"),
        previous_until_ms: r.get("previous_until_ms"),
        created_ms: r.get("created_ms"),
        deleted_ms: r.get("deleted_ms"),
        after_seq: r.get("after_seq"),
    }
}

fn delivery_row(r: &AnyRow) -> DeliveryRecord {
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
             secret_sealed, created_ms, after_seq)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, (SELECT COALESCE(MAX(seq), 0) FROM outbox))",
        )
        .bind(&s.id)
        .bind(&s.owner_principal_id)
        .bind(&s.url)
        .bind(serde_json::to_string(&s.events).unwrap_or_default())
        .bind(i64::from(s.active))
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
        let read = Sql::new("SELECT * FROM subscriptions WHERE id = $1").arg(id.to_owned());
        let row = self.fetch_optional(read).await.map_err(unavailable)?;
        Ok(row.as_ref().map(subscription_row))
    }

    /// The owner's subscriptions, newest first; deleted ones (disabled, history kept) only with
    /// `with_deleted`.
    pub async fn subscriptions_of(
        &self,
        owner: &str,
        limit: i64,
        with_deleted: bool,
    ) -> Result<Vec<SubscriptionRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM subscriptions WHERE owner_principal_id = $1 AND ($3 OR deleted_ms IS NULL)
             ORDER BY created_ms DESC, id DESC LIMIT $2",
        )
        .bind(owner)
        .bind(limit)
        .bind(with_deleted)
        .fetch_all(&mut *self.read().await.map_err(unavailable)?)
        .await
        .map_err(unavailable)?;
        Ok(rows.iter().map(subscription_row).collect())
    }

    /// Active subscriptions (the relay routes events to them).
    pub async fn active_subscriptions(&self) -> Result<Vec<SubscriptionRecord>, StoreError> {
        let read = Sql::new("SELECT * FROM subscriptions WHERE active = 1 AND deleted_ms IS NULL");
        let rows = self.fetch_all(read).await.map_err(unavailable)?;
        Ok(rows.iter().map(subscription_row).collect())
    }

    pub async fn update_subscription(
        &self,
        id: &str,
        active: Option<bool>,
        events: Option<&[String]>,
        health: Option<&str>,
    ) -> Result<(), StoreError> {
        // Made active again, a subscription starts after the events committed by then, as a new
        // one does: what committed while it was inactive is not owed to it, however far the
        // relay had got (it leaves its cursor behind while no subscription is active).
        sqlx::query(
            "UPDATE subscriptions SET active = COALESCE($1, active), events = COALESCE($2, events),
             health = COALESCE($3, health),
             after_seq = CASE WHEN active = 0 AND $1 = 1 THEN (SELECT COALESCE(MAX(seq), 0) FROM outbox) ELSE after_seq END
             WHERE id = $4",
        )
        .bind(active.map(i64::from))
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
             previous_until_ms = $1, kms_key_id = $2, secret_sealed = $3 WHERE id = $4",
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
        let mut tx = self.begin_write().await.map_err(unavailable)?;
        sqlx::query(
            "UPDATE subscriptions SET active = 0, health = 'disabled', deleted_ms = COALESCE(deleted_ms, $1),
             disabled_reason = $2 WHERE id = $3",
        )
        .bind(now)
        .bind(reason)
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?;
        sqlx::query(
            "UPDATE deliveries SET status = 'failed', next_attempt_ms = NULL, last_error = $1
             WHERE subscription_id = $2 AND status = 'pending'",
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
            "SELECT * FROM deliveries WHERE subscription_id = $1 ORDER BY created_ms DESC, attempt DESC LIMIT $2",
        )
        .bind(subscription_id)
        .bind(limit)
        .fetch_all(&mut *self.read().await.map_err(unavailable)?)
        .await
        .map_err(unavailable)?;
        Ok(rows.iter().map(delivery_row).collect())
    }

    /// The relay's next pass: its cursor, and the `seq` of the last of the (at most `limit`)
    /// events after both the cursor and `floor` with how many they are (`None` when there are
    /// none). `floor` is the lowest `after_seq` of the active subscriptions: no subscription is
    /// owed an event at or below it, so a cursor left behind while nobody subscribed does not
    /// make the next pass walk that history. Only the numbers: a pass with no subscription to
    /// route to reads no event ([`Store::outbox_between`]).
    pub async fn relay_window(
        &self,
        limit: i64,
        floor: i64,
    ) -> Result<(i64, Option<(i64, usize)>), StoreError> {
        let read = Sql::new("SELECT seq FROM relay_cursor WHERE name = 'webhooks'");
        let cursor = match self.fetch_optional(read).await.map_err(unavailable)? {
            Some(row) => row.try_get::<i64, _>(0).map_err(unavailable)?,
            None => 0,
        };
        let read = Sql::new(
            "SELECT MAX(seq), COUNT(*) FROM (SELECT seq FROM outbox WHERE seq > $1 ORDER BY seq LIMIT $2) AS w",
        )
        .arg(cursor.max(floor))
        .arg(limit);
        let row = self.fetch_optional(read).await.map_err(unavailable)?;
        let window = match row {
            Some(row) => {
                let last: Option<i64> = row.try_get(0).map_err(unavailable)?;
                let count: i64 = row.try_get(1).map_err(unavailable)?;
                last.map(|last| (last, usize::try_from(count).unwrap_or(0)))
            }
            None => None,
        };
        Ok((cursor, window))
    }

    /// The outbox events with `after < seq <= to`, in order.
    pub async fn outbox_between(
        &self,
        after: i64,
        to: i64,
    ) -> Result<Vec<OutboxRecord>, StoreError> {
        static BETWEEN: LazyLock<String> = LazyLock::new(|| {
            format!(
                "{} WHERE o.seq > $1 AND o.seq <= $2 ORDER BY o.seq",
                SELECT_OUTBOX.as_str()
            )
        });
        let read = Sql::new(BETWEEN.as_str()).arg(after).arg(to);
        let rows = self.fetch_all(read).await.map_err(unavailable)?;
        rows.iter().map(outbox_row).collect()
    }

    /// In one transaction: the deliveries for `routes`, `routedAt` on the events, the cursor.
    /// (`streamPublishedAt` is written with each event: streams read the outbox at its commit.)
    /// `expected` guards against two relays advancing the same cursor.
    pub async fn record_routes(
        &self,
        expected: i64,
        to: i64,
        routed: &[i64],
        routes: &[Route],
        now: Millis,
    ) -> Result<bool, StoreError> {
        // SQLite: in the next group commit; PostgreSQL: a transaction of its own.
        let mut batch = Batch::new(self.backend());
        batch
            .statement("INSERT INTO relay_cursor (name, seq) VALUES ('webhooks', 0) ON CONFLICT (name) DO NOTHING");
        // Compare-and-set the cursor first: of several relays (nodes) that routed the same
        // events, exactly one moves it; the others roll back (on PostgreSQL the row lock makes
        // them wait for the winner's commit and then find the cursor moved).
        batch
            .cas("UPDATE relay_cursor SET seq = $1 WHERE name = 'webhooks' AND seq = $2 RETURNING seq")
            .bind(to)
            .bind(expected);
        for r in routes {
            batch
                .statement(
                    "INSERT INTO deliveries (id, subscription_id, event_id, event_seq, attempt, status, created_ms, next_attempt_ms)
                     VALUES ($1, $2, $3, $4, 1, 'pending', $5, $6)",
                )
                .bind(capstan_core::ids::new_id())
                .bind(r.subscription_id.clone())
                .bind(r.event.event_id.clone())
                .bind(r.event.seq)
                .bind(now)
                .bind(now);
        }
        for seq in routed {
            batch
                .statement("UPDATE outbox SET routed_ms = COALESCE(routed_ms, $1) WHERE seq = $2")
                .bind(now)
                .bind(*seq);
        }
        match self.commit_batch(batch).await {
            Err(StoreError::Conflict(_)) => Ok(false),
            other => other.map(|()| true),
        }
    }

    /// Claims due attempts for this node until `lease_until`, at most one per subscription: the
    /// oldest pending event of each subscription (so a subscriber gets an execution's events in
    /// order), if its time has come and no other node holds it. An attempt is sent by the node
    /// that claimed it; if that node dies, another claims it once the lease has run out.
    pub async fn claim_deliveries(
        &self,
        now: Millis,
        lease_until: Millis,
        limit: i64,
        per_owner: i64,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        // Most wake-ups find nothing due: ask a reader first and keep the writer free.
        let read = Sql::new(
            "SELECT 1 FROM deliveries WHERE status = 'pending' AND next_attempt_ms <= $1
               AND (lease_expires_ms IS NULL OR lease_expires_ms < $1) LIMIT 1",
        )
        .arg(now);
        let any_due = self.fetch_optional(read).await.map_err(unavailable)?;
        if any_due.is_none() {
            return Ok(Vec::new());
        }
        // An owner's due deliveries are numbered oldest first and taken while that number plus
        // the attempts it has in flight (leased, on any node) stays within `per_owner`, so slow
        // receivers of one owner hold at most that many attempts and the rest go to others.
        // (No `FOR UPDATE SKIP LOCKED` on PostgreSQL, which refuses it beside a window
        // function: the outer lease condition is checked again on a row another node leased
        // meanwhile, so that node keeps it.)
        let sql = format!(
            "UPDATE deliveries SET lease_owner = $1, lease_expires_ms = $2
             WHERE (lease_expires_ms IS NULL OR lease_expires_ms < $3) AND status = 'pending' AND id IN (
               WITH busy AS (
                 SELECT g.owner_principal_id AS owner, COUNT(*) AS n
                 FROM deliveries f JOIN subscriptions g ON g.id = f.subscription_id
                 WHERE f.status = 'pending' AND f.lease_expires_ms >= $3
                 GROUP BY g.owner_principal_id),
               due AS (
                 SELECT d.id, d.next_attempt_ms, COALESCE(b.n, 0) AS busy,
                        ROW_NUMBER() OVER (PARTITION BY s.owner_principal_id ORDER BY d.next_attempt_ms, d.id) AS nth
                 FROM deliveries d
                 JOIN subscriptions s ON s.id = d.subscription_id
                 LEFT JOIN busy b ON b.owner = s.owner_principal_id
                 WHERE d.status = 'pending' AND d.next_attempt_ms <= $3
                   AND (d.lease_expires_ms IS NULL OR d.lease_expires_ms < $3)
                   AND d.event_seq = (SELECT MIN(p.event_seq) FROM deliveries p
                                      WHERE p.subscription_id = d.subscription_id AND p.status = 'pending'))
               SELECT id FROM due WHERE busy + nth <= {per_owner}
               ORDER BY next_attempt_ms LIMIT {limit})
             RETURNING *"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(self.node_id())
            .bind(lease_until)
            .bind(now)
            .fetch_all(&self.writer)
            .await
            .map_err(unavailable)?;
        let mut due: Vec<DeliveryRecord> = rows.iter().map(delivery_row).collect();
        due.sort_by_key(|d| d.next_attempt_ms);
        Ok(due)
    }

    /// Records an attempt's result; `next_at` queues the delivery's next attempt as a new row.
    ///
    /// With `chain` (`now`, `lease_until`) and no next attempt queued, the same transaction
    /// leases the subscription's next delivery to this node when it is due: the delivery that
    /// just ended was the subscription's oldest pending one, so the next is the one a pass would
    /// claim for it, and the attempt that ended hands its place to it at once instead of leaving
    /// it for the dispatcher's next pass. A delivery leased so is returned, to be attempted.
    #[allow(clippy::too_many_arguments)]
    pub async fn finish_attempt(
        &self,
        delivery: &DeliveryRecord,
        status: &str,
        response_code: Option<i64>,
        last_error: Option<&str>,
        dispatched_ms: Millis,
        next_at: Option<Millis>,
        chain: Option<(Millis, Millis)>,
    ) -> Result<Option<DeliveryRecord>, StoreError> {
        let mut tx = self.begin_write().await.map_err(unavailable)?;
        let finished = sqlx::query(
            "UPDATE deliveries SET status = $1, response_code = $2, last_error = $3, dispatched_ms = $4, next_attempt_ms = NULL
             WHERE id = $5 AND status = 'pending'",
        )
        .bind(status)
        .bind(response_code)
        .bind(last_error)
        .bind(dispatched_ms)
        .bind(&delivery.id)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?
        .rows_affected();
        if finished != 1 {
            // Already recorded (a node whose lease ran out raced the one that took over, or the
            // subscription was deleted meanwhile): the attempt's successor exists or is moot.
            return Ok(None);
        }
        if let Some(at) = next_at {
            sqlx::query(
                "INSERT INTO deliveries (id, subscription_id, event_id, event_seq, attempt, status, created_ms, next_attempt_ms)
                 VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7)",
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
                "UPDATE outbox SET dispatched_ms = COALESCE(dispatched_ms, $1) WHERE seq = $2",
            )
            .bind(dispatched_ms)
            .bind(delivery.event_seq)
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
        }
        let chained = match chain {
            Some((now, lease_until)) if next_at.is_none() => sqlx::query(
                "UPDATE deliveries SET lease_owner = $1, lease_expires_ms = $2
                 WHERE id = (SELECT p.id FROM deliveries p
                             WHERE p.status = 'pending' AND p.subscription_id = $3
                             ORDER BY p.event_seq, p.attempt LIMIT 1)
                   AND next_attempt_ms <= $4
                   AND (lease_expires_ms IS NULL OR lease_expires_ms < $4)
                 RETURNING *",
            )
            .bind(self.node_id())
            .bind(lease_until)
            .bind(&delivery.subscription_id)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(unavailable)?
            .map(|row| delivery_row(&row)),
            _ => None,
        };
        tx.commit().await.map_err(unavailable)?;
        Ok(chained)
    }

    /// A manual redelivery: a new pending attempt now (or the pending one if there is one).
    pub async fn redeliver(
        &self,
        subscription_id: &str,
        event_id: &str,
        now: Millis,
    ) -> Result<Option<DeliveryRecord>, StoreError> {
        let mut tx = self.begin_write().await.map_err(unavailable)?;
        let last = sqlx::query(
            "SELECT * FROM deliveries WHERE subscription_id = $1 AND event_id = $2 ORDER BY attempt DESC LIMIT 1",
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
             VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7)",
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
        let row = sqlx::query("SELECT * FROM deliveries WHERE id = $1")
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
            "SELECT status FROM deliveries WHERE subscription_id = $1 AND status != 'pending'
             ORDER BY dispatched_ms DESC LIMIT $2",
        )
        .bind(subscription_id)
        .bind(n)
        .fetch_all(&mut *self.read().await.map_err(unavailable)?)
        .await
        .map_err(unavailable)
    }

    /// The event at `seq` (events are found by their seq, which a delivery records: the outbox
    /// keeps no index of event ids).
    pub async fn outbox_event(&self, seq: i64) -> Result<Option<OutboxRecord>, StoreError> {
        static BY_SEQ: LazyLock<String> =
            LazyLock::new(|| format!("{} WHERE o.seq = $1", SELECT_OUTBOX.as_str()));
        let read = Sql::new(BY_SEQ.as_str()).arg(seq);
        let row = self.fetch_optional(read).await.map_err(unavailable)?;
        row.as_ref().map(outbox_row).transpose()
    }
}
