//! The booking-webhook dispatcher: sends queued `{bookingId, status, eventTimestamp}` POSTs with
//! the documented rules — 45 s to answer; 2xx delivered; 5xx, 408 and 429 (and network errors)
//! retried up to 4 times after 5, 10, 20 and 20 s; any other 4xx final. Each request also carries
//! Standard Webhooks headers (`webhook-id` stable across retries, signed with the registration's
//! `whsec_` secret) and goes to a vetted address with the connection pinned (as [5/8]'s webhooks).

use super::PartnerState;
use capstan_booking::webhooks::{AttemptOutcome, DueDelivery};
use std::time::Duration;
use tracing::Instrument;

/// How booking webhooks are sent.
#[derive(Debug, Clone)]
pub struct BookingWebhookPolicy {
    /// Waits before retry 1, 2, ... (the documented 5, 10, 20, 20 s).
    pub retry_waits_ms: Vec<i64>,
    pub timeout_ms: u64,
}

impl Default for BookingWebhookPolicy {
    fn default() -> Self {
        Self {
            retry_waits_ms: vec![5_000, 10_000, 20_000, 20_000],
            timeout_ms: 45_000,
        }
    }
}

/// What an answer means: delivered, retryable, or final.
pub fn classify(code: Option<u16>) -> (bool, bool) {
    match code {
        Some(c) if (200..300).contains(&c) => (true, false),
        Some(408) | Some(429) => (false, true),
        Some(c) if (500..600).contains(&c) => (false, true),
        Some(_) => (false, false),
        None => (false, true),
    }
}

/// Sends due deliveries until `stop`; returns when it turns true. Attempts run concurrently (at
/// most 64 in flight), so a slow receiver holds up only its own deliveries.
pub async fn run(
    states: Vec<PartnerState>,
    policy: BookingWebhookPolicy,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let Some(first) = states.first().cloned() else {
        return;
    };
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    loop {
        if *stop.borrow() {
            return;
        }
        let sent = match dispatch(&first, &policy, &slots).await {
            Ok(n) => n,
            Err(error) => {
                tracing::warn!(%error, "booking webhook dispatch failed; retrying");
                0
            }
        };
        if sent == 0 {
            tokio::select! {
                // Also when the sender is gone: that means stop too.
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }
}

/// How long a claimed attempt is held without renewal: renewed every third of it while the
/// request is out, so a node killed mid-attempt leaves a delivery that is due again within
/// this, whatever the receiver's time limit (45 s documented).
const LEASE_MS: i64 = 10_000;

/// One pass: claims every due delivery there is room for and starts its attempt. Returns how
/// many were started.
pub async fn dispatch(
    state: &PartnerState,
    policy: &BookingWebhookPolicy,
    slots: &std::sync::Arc<tokio::sync::Semaphore>,
) -> anyhow::Result<usize> {
    let room = slots.available_permits() as i64;
    if room == 0 {
        return Ok(0);
    }
    let due = state
        .bookings
        .due_webhook_deliveries(room)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut started = 0;
    for mut d in due {
        let lease_until = state.bookings.now_ms() + LEASE_MS;
        if !state
            .bookings
            .claim_webhook_delivery(&d, lease_until)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?
        {
            continue;
        }
        // The claim moved the due time to the lease's end; renewals move it on from there.
        d.next_attempt_ms = lease_until;
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break;
        };
        let (state, policy) = (state.clone(), policy.clone());
        tokio::spawn(async move {
            if let Err(error) = attempt(&state, &policy, d).await {
                tracing::warn!(%error, "booking webhook attempt could not be recorded; it is retried after its lease");
            }
            drop(permit);
        });
        started += 1;
    }
    Ok(started)
}

async fn attempt(
    state: &PartnerState,
    policy: &BookingWebhookPolicy,
    d: DueDelivery,
) -> anyhow::Result<()> {
    let config = &state.webhooks;
    let partner_aad = partner_of(state, d.webhook_id).await?;
    let secret = config
        .keyring
        .decrypt(&d.kms_key_id, &d.secret_sealed, partner_aad.as_bytes())
        .ok()
        .and_then(|b| String::from_utf8(b).ok());
    let now = state.bookings.now_ms();
    let timestamp = now / 1000;
    let signatures: Vec<String> = secret
        .iter()
        .map(|s| crate::webhooks::delivery::sign(s, &d.message_id, timestamp, &d.payload))
        .collect();
    let send_config = crate::webhooks::WebhookConfig {
        timeout_ms: policy.timeout_ms,
        ..(**config).clone()
    };
    let span = crate::webhooks::delivery::attempt_span("partner", &d.id, "booking", d.attempts + 1);
    let send = crate::webhooks::delivery::send(
        &send_config,
        &d.url,
        &d.message_id,
        timestamp,
        &signatures,
        d.payload.clone(),
    )
    .instrument(span.clone());
    let result = tokio::select! {
        result = send => result,
        () = keep_leased(state, &d) => {
            // Another node took the delivery over after a lapse: its attempt is the one.
            return Ok(());
        }
    };
    let (code, error) = match result {
        Ok((code, _)) => (Some(code), format!("the receiver answered {code}")),
        Err(e) => (None, e),
    };
    let (delivered, retryable) = classify(code);
    let retries_done = usize::try_from(d.attempts).unwrap_or(usize::MAX);
    let outcome = if let (true, Some(code)) = (delivered, code) {
        AttemptOutcome::Delivered { code }
    } else if retryable {
        match policy.retry_waits_ms.get(retries_done) {
            Some(wait) => AttemptOutcome::Retry {
                code,
                error,
                next_attempt_ms: now + wait,
            },
            None => AttemptOutcome::Final {
                code,
                error,
                exhausted: true,
            },
        }
    } else {
        AttemptOutcome::Final {
            code,
            error,
            exhausted: false,
        }
    };
    let label = match &outcome {
        AttemptOutcome::Delivered { .. } => "succeeded",
        AttemptOutcome::Retry { .. }
        | AttemptOutcome::Final {
            exhausted: false, ..
        } => "failed",
        AttemptOutcome::Final {
            exhausted: true, ..
        } => "exhausted",
    };
    crate::webhooks::delivery::observe_attempt(&span, "partner", label, code, None);
    state
        .bookings
        .finish_webhook_attempt(d.id, &outcome)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// Renews the attempt's lease every third of [`LEASE_MS`]; returns once a renewal finds the
/// delivery no longer held by this attempt.
async fn keep_leased(state: &PartnerState, d: &DueDelivery) {
    let mut held_until = d.next_attempt_ms;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis((LEASE_MS / 3) as u64)).await;
        let until = state.bookings.now_ms() + LEASE_MS;
        match state
            .bookings
            .renew_webhook_lease(d.id, held_until, until)
            .await
        {
            Ok(true) => held_until = until,
            Ok(false) => return,
            // The database is away: the request goes on; its outcome is written if it can be.
            Err(error) => tracing::warn!(%error, "booking webhook lease renewal failed; retrying"),
        }
    }
}

/// The AAD the secret was sealed with (`booking-webhook:<partner id>`).
async fn partner_of(state: &PartnerState, webhook_id: i64) -> anyhow::Result<String> {
    let (partner,): (String,) =
        sqlx::query_as("SELECT partner_id FROM booking_webhooks WHERE id = $1")
            .bind(webhook_id)
            .fetch_one(state.bookings.store().pool())
            .await?;
    Ok(format!("booking-webhook:{partner}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified_as_documented() {
        assert_eq!(classify(Some(200)), (true, false));
        assert_eq!(classify(Some(204)), (true, false));
        assert_eq!(classify(Some(500)), (false, true));
        assert_eq!(classify(Some(503)), (false, true));
        assert_eq!(classify(Some(408)), (false, true));
        assert_eq!(classify(Some(429)), (false, true));
        assert_eq!(classify(Some(400)), (false, false));
        assert_eq!(classify(Some(404)), (false, false));
        assert_eq!(classify(Some(301)), (false, false));
        assert_eq!(classify(None), (false, true));
    }
}
