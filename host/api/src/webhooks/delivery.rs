//! The webhook relay and dispatcher of a node.
//!
//! Relay: reads the outbox after its cursor and, in one transaction, creates a pending delivery
//! for each (event, active subscription whose filter names the event's version and whose owner
//! may currently see its workflow), marks the events `routedAt` and advances the cursor. While no
//! subscription is active it reads only the subscriptions and leaves the cursor.
//!
//! Dispatch: per subscription only the oldest pending event is attempted (so a subscriber gets
//! each execution's events in order); each attempt is a SubscriptionDelivery row. An attempt that
//! delivers hands on to its subscription's next due delivery in the transaction that records it,
//! so a backlog drains at the receiver's pace rather than one delivery per dispatcher pass. Standard
//! Webhooks headers: `webhook-id` (the event id, stable across retries), `webhook-timestamp`
//! (per attempt), `webhook-signature` (`v1,<base64 HMAC-SHA256 of id.timestamp.body>`, and a
//! second signature with the previous secret during a rotation). Only 2xx succeeds; redirects
//! are not followed; 410 disables the subscription; others retry on the schedule (or later when
//! the receiver sends `Retry-After`) until it is exhausted. Every address is vetted again at each
//! attempt and the connection is pinned to it.

use super::{WebhookConfig, safety};
use crate::ApiState;
use crate::auth::permissions_of;
use base64::Engine as _;
use capstan_store::subscriptions::{DeliveryRecord, Route, SubscriptionRecord};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use tracing::Instrument;

/// The shortest time from one pass to the next when events wake the relay: under load, one pass
/// routes what many commits wrote (one read of the outbox and one write for all of it) instead
/// of one pass per commit, each a group commit of its own and six reads (BENCHMARKS.md).
/// Routing waits at most this long; SSE streams read the outbox themselves, without it.
const RELAY_LINGER: Duration = Duration::from_millis(10);

/// Outbox events one relay transaction routes at most.
const RELAY_BATCH: i64 = 200;

/// Runs relay and dispatch until `stop` turns true.
pub async fn run(state: ApiState, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut wake = state.store.subscribe_events();
    let mut in_flight = tokio::task::JoinSet::new();
    loop {
        if *stop.borrow() {
            // Attempts under way finish (each within its time limit) before the node stops.
            while in_flight.join_next().await.is_some() {}
            return;
        }
        let pass = tokio::time::Instant::now();
        if let Err(error) = relay(&state).await {
            tracing::warn!(%error, "webhook relay failed; retrying");
        }
        while in_flight.try_join_next().is_some() {}
        let sent = match dispatch(&state, &mut in_flight, &stop).await {
            Ok(n) => n,
            Err(error) => {
                tracing::warn!(%error, "webhook dispatch failed; retrying");
                0
            }
        };
        if sent == 0 {
            let woken = tokio::select! {
                // A closed channel disables its branch instead of returning at once, forever.
                Ok(()) = wake.changed() => true,
                // An attempt ended: its subscription's next delivery may be due.
                Some(_) = in_flight.join_next(), if !in_flight.is_empty() => true,
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(Duration::from_millis(250)) => false,
            };
            if woken {
                tokio::select! {
                    () = tokio::time::sleep_until(pass + RELAY_LINGER) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        }
    }
}

async fn relay(state: &ApiState) -> anyhow::Result<()> {
    loop {
        // With no active subscription the pass ends here, the cursor where it is: a subscription
        // created or made active later starts after the events committed by then (`after_seq`),
        // so none of these is owed to it, and the next pass starts at the lowest `after_seq`.
        // A node that no one subscribes to thus writes nothing per commit.
        let Some(floor) = state
            .store
            .active_subscriptions()
            .await?
            .iter()
            .map(|s| s.after_seq)
            .min()
        else {
            return Ok(());
        };
        let (cursor, window) = state.store.relay_window(RELAY_BATCH, floor).await?;
        let Some((last, count)) = window else {
            return Ok(());
        };
        // A short window was everything there was; what commits meanwhile wakes the next pass.
        let more = count == RELAY_BATCH as usize;
        // Read after the window: a subscription created since starts after its last event
        // (`after_seq`), so none that this read misses is owed an event in it.
        let subscriptions = state.store.active_subscriptions().await?;
        // With nobody to route to, the pass only moves the cursor: the events are not read.
        let events = if subscriptions.is_empty() {
            Vec::new()
        } else {
            state.store.outbox_between(cursor, last).await?
        };
        // Each owner's permissions once per batch, not once per (event, subscription).
        let mut permissions: HashMap<&str, BTreeSet<String>> = HashMap::new();
        for s in &subscriptions {
            if !permissions.contains_key(s.owner_principal_id.as_str()) {
                let granted = permissions_of(state, &s.owner_principal_id)
                    .await
                    .map_err(|e| anyhow::anyhow!("{}", e.message))?;
                permissions.insert(&s.owner_principal_id, granted);
            }
        }
        let mut routes = Vec::new();
        let mut routed = Vec::new();
        for event in &events {
            let needed = format!("workflows:{}", event.workflow);
            let mut any = false;
            for s in subscriptions.iter().filter(|s| s.wants(event)) {
                if permissions
                    .get(s.owner_principal_id.as_str())
                    .is_some_and(|p| p.contains(&needed))
                {
                    routes.push(Route {
                        subscription_id: s.id.clone(),
                        event: event.clone(),
                    });
                    any = true;
                }
            }
            if any {
                routed.push(event.seq);
            }
        }
        if !state
            .store
            .record_routes(cursor, last, &routed, &routes, state.now())
            .await?
        {
            // Another relay advanced the cursor first: read again from where it is.
            continue;
        }
        if !more {
            return Ok(());
        }
    }
}

/// Delivery attempts one node has in flight at most. Attempts run on their own: a pass claims
/// only what frees up and never waits for a slow receiver, so one subscription's slow receiver
/// holds one slot (a subscription has one attempt at a time, its oldest pending delivery) for
/// its time limit.
const MAX_IN_FLIGHT: usize = 128;

/// How long one task hands a subscription's deliveries on from one to the next before it leaves
/// the next to the dispatcher's pass: while the node's slots are all taken, a subscription whose
/// deliveries wait gets one within about this long plus an attempt, as passes claim oldest due
/// first; a backlog pays one pass (≥ [`RELAY_LINGER`]) per this much delivering.
const HAND_ON_FOR: Duration = Duration::from_millis(250);

/// Attempts one owner's subscriptions have in flight at most, over all nodes: an owner whose
/// receivers all hang holds this many slots and everyone else's deliveries go on in the rest.
const MAX_IN_FLIGHT_PER_OWNER: i64 = 16;

async fn dispatch(
    state: &ApiState,
    in_flight: &mut tokio::task::JoinSet<()>,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<usize> {
    let free = MAX_IN_FLIGHT.saturating_sub(in_flight.len());
    if free == 0 {
        return Ok(0);
    }
    let now = state.now();
    let due = state
        .store
        .claim_deliveries(
            now,
            lease_until(state, now),
            i64::try_from(free).unwrap_or(1),
            MAX_IN_FLIGHT_PER_OWNER,
        )
        .await?;
    let n = due.len();
    for delivery in due {
        let (state, stop) = (state.clone(), stop.clone());
        in_flight.spawn(async move {
            // An attempt that ends its delivery hands its slot to the subscription's next
            // delivery when that is due ([`Store::finish_attempt`]'s `chain`): a subscription's
            // deliveries follow each other at the receiver's pace, one at a time and in order,
            // not one per dispatcher pass. A stopping node starts no new one, and after
            // `HAND_ON_FOR` the slot goes back to the dispatcher.
            let until = tokio::time::Instant::now() + HAND_ON_FOR;
            let hand_on = || !*stop.borrow() && tokio::time::Instant::now() < until;
            let mut next = Some(delivery);
            while let Some(delivery) = next.take() {
                match attempt(&state, &delivery, &hand_on).await {
                    Ok(chained) => next = chained,
                    Err(error) => {
                        tracing::warn!(%error, delivery = %delivery.id, "webhook attempt could not be recorded");
                    }
                }
            }
        });
    }
    Ok(n)
}

/// This node's lease on an attempt claimed at `now`: its time limit plus 2 s, so no other node
/// sends it meanwhile, and if this node dies another sends it once the lease has passed.
fn lease_until(state: &ApiState, now: i64) -> i64 {
    now + i64::try_from(state.webhooks.timeout_ms).unwrap_or(i64::MAX / 4) + 2_000
}

/// `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`; a `whsec_` secret's key is its
/// base64 payload (as the Standard Webhooks libraries read it), any other secret its bytes.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &str) -> String {
    let key = secret
        .strip_prefix("whsec_")
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .unwrap_or_else(|| secret.as_bytes().to_vec());
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&key) else {
        return String::new();
    };
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

fn secrets(config: &WebhookConfig, s: &SubscriptionRecord, now: i64) -> Vec<String> {
    let mut out = Vec::new();
    let open = |kms: &str, sealed: &str| {
        config
            .keyring
            .decrypt(kms, sealed, s.id.as_bytes())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
    };
    if let Some(secret) = open(&s.kms_key_id, &s.secret_sealed) {
        out.push(secret);
    }
    if let (Some(kms), Some(sealed), Some(until)) = (
        &s.previous_kms_key_id,
        &s.previous_secret_sealed,
        s.previous_until_ms,
    ) && until > now
        && let Some(secret) = open(kms, sealed)
    {
        out.push(secret);
    }
    out
}

/// Seconds of a `Retry-After` header (delta-seconds form).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<i64> {
    headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|s| *s >= 0)
}

/// Attempts `delivery` and records the result; when `hand_on()` allows it as the result is
/// recorded, returns the subscription's next delivery if the store leased it to this node in the
/// same transaction.
async fn attempt(
    state: &ApiState,
    delivery: &DeliveryRecord,
    hand_on: &(dyn Fn() -> bool + Send + Sync),
) -> anyhow::Result<Option<DeliveryRecord>> {
    let config = &state.webhooks;
    let now = state.now();
    let Some(sub) = state.store.subscription(&delivery.subscription_id).await? else {
        return Ok(None);
    };
    if !sub.active || sub.deleted_ms.is_some() {
        state
            .store
            .finish_attempt(
                delivery,
                "failed",
                None,
                Some("subscription inactive"),
                now,
                None,
                None,
            )
            .await?;
        return Ok(None);
    }
    let Some(event) = state.store.outbox_event(delivery.event_seq).await? else {
        return Ok(None);
    };
    let body = serde_json::to_string(&crate::views::event(&event))?;
    let timestamp = now / 1000;
    let signatures: Vec<String> = secrets(config, &sub, now)
        .iter()
        .map(|secret| sign(secret, &event.event_id, timestamp, &body))
        .collect();
    // In the trace of the execution the event belongs to.
    let span = attempt_span("v1", &delivery.id, &event.event_type, delivery.attempt);
    capstan_core::trace::set_parent(&span, event.traceparent.as_deref());
    let result = send(
        config,
        &sub.url,
        &event.event_id,
        timestamp,
        &signatures,
        body,
    )
    .instrument(span.clone())
    .await;
    let (status, code, error, wait) = match result {
        Ok((code, _)) if (200..300).contains(&code) => ("succeeded", Some(code), None, None),
        Ok((410, _)) => {
            state
                .store
                .update_subscription(&sub.id, Some(false), None, Some("disabled"))
                .await?;
            (
                "failed",
                Some(410),
                Some("410 Gone: subscription disabled".to_owned()),
                None,
            )
        }
        Ok((code, retry)) => (
            "failed",
            Some(code),
            Some(format!("the receiver answered {code}")),
            retry.map(|s| s * 1000),
        ),
        Err(e) => ("failed", None, Some(e), None),
    };
    let index = usize::try_from(delivery.attempt - 1).unwrap_or(usize::MAX);
    let (status, next_at) = if status == "failed" && code != Some(410) {
        match config.schedule_ms.get(index) {
            Some(delay) => {
                let jitter = (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 1000.0 * 0.1;
                let delay = (*delay as f64 * (1.0 + jitter)) as i64;
                ("failed", Some(now + delay.max(wait.unwrap_or(0))))
            }
            None => ("exhausted", None),
        }
    } else {
        (status, None)
    };
    observe_attempt(
        &span,
        "v1",
        status,
        code,
        (status == "succeeded").then(|| now - event.occurred_ms),
    );
    // Only a delivery that ended (delivered, or out of attempts) hands on: after a failure
    // that is retried later the subscription's next event waits behind it, and after a 410
    // the subscription is disabled.
    let chain = (status == "succeeded" || status == "exhausted") && hand_on();
    let after = state.now();
    let chained = state
        .store
        .finish_attempt(
            delivery,
            status,
            code.map(i64::from),
            error.as_deref(),
            now,
            next_at,
            chain.then(|| (after, lease_until(state, after))),
        )
        .await?;
    // The result is recorded and the next delivery (if any) leased to this node: a health
    // that cannot be updated now is updated by the next attempt, and must not strand that one.
    if let Err(error) = update_health(state, &sub.id).await {
        tracing::warn!(%error, subscription = %sub.id, "webhook subscription health could not be updated");
    }
    Ok(chained)
}

async fn update_health(state: &ApiState, id: &str) -> anyhow::Result<()> {
    let recent = state.store.recent_results(id, 10).await?;
    let failed = |s: &String| s != "succeeded";
    let health = if recent.iter().take(3).filter(|s| failed(s)).count() >= 3 {
        "failing"
    } else if recent.iter().any(failed) {
        "degraded"
    } else {
        "healthy"
    };
    if let Some(s) = state.store.subscription(id).await?
        && s.active
        && s.health != health
    {
        state
            .store
            .update_subscription(id, None, None, Some(health))
            .await?;
    }
    Ok(())
}

/// The span of one delivery attempt (`api`: `v1` or `partner`); [`send`] puts its
/// `traceparent` on the request, so a receiver that traces continues it.
pub(crate) fn attempt_span(
    api: &'static str,
    delivery: &dyn std::fmt::Display,
    event_type: &str,
    attempt: i64,
) -> tracing::Span {
    tracing::debug_span!(
        "webhook delivery",
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        api,
        delivery = %delivery,
        event_type,
        attempt,
        http.response.status_code = tracing::field::Empty,
        outcome = tracing::field::Empty,
    )
}

/// An attempt's outcome on its span and in the metrics: `outcome` is `succeeded`, `failed`
/// (retried later), `exhausted` (no retry left) or `failed` for good; `lag_ms`, on success, the
/// time from the event to its delivery.
pub(crate) fn observe_attempt(
    span: &tracing::Span,
    api: &'static str,
    outcome: &'static str,
    code: Option<u16>,
    lag_ms: Option<i64>,
) {
    span.record("outcome", outcome);
    if let Some(code) = code {
        span.record("http.response.status_code", code);
    }
    if outcome != "succeeded" {
        span.record("otel.status_code", "ERROR");
    }
    metrics::counter!("capstan_webhook_deliveries_total", "api" => api, "outcome" => outcome)
        .increment(1);
    if let Some(lag) = lag_ms {
        metrics::histogram!("capstan_webhook_delivery_lag_seconds", "api" => api)
            .record(lag.max(0) as f64 / 1e3);
    }
}

/// Describes the webhook metrics to the process's recorder.
pub fn describe_metrics() {
    metrics::describe_counter!(
        "capstan_webhook_deliveries_total",
        "Webhook delivery attempts, by API (v1, partner) and outcome (succeeded, failed, exhausted)."
    );
    metrics::describe_histogram!(
        "capstan_webhook_delivery_lag_seconds",
        metrics::Unit::Seconds,
        "From an event to its successful delivery (retries included), by API."
    );
}

/// One POST to the vetted, pinned address; `(status, Retry-After seconds)` or why it failed.
pub(crate) async fn send(
    config: &WebhookConfig,
    url: &str,
    id: &str,
    timestamp: i64,
    signatures: &[String],
    body: String,
) -> Result<(u16, Option<i64>), String> {
    let url = safety::parse_callback(url, config.policy).map_err(|e| e.to_string())?;
    let addrs = safety::resolve_vetted(&url, config.policy)
        .await
        .map_err(|e| e.to_string())?;
    let addr = *addrs
        .first()
        .ok_or("the callback host resolves to nothing")?;
    let client = safety::pinned_client(
        &url,
        addr,
        Duration::from_millis(config.timeout_ms),
        config.extra_root_pem.as_deref(),
    )
    .map_err(|e| e.to_string())?;
    let mut request = client.post(url);
    if let Some(traceparent) = capstan_core::trace::traceparent(&tracing::Span::current()) {
        request = request.header("traceparent", traceparent);
    }
    let response = request
        .header("content-type", "application/json")
        .header("user-agent", "Capstan-Webhooks/0.1")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signatures.join(" "))
        .body(body)
        .send()
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    Ok((response.status().as_u16(), retry_after(response.headers())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_follow_standard_webhooks() {
        // The Standard Webhooks specification's example.
        let sig = sign(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            r#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }
}
