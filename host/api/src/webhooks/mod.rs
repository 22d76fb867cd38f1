//! Webhook subscriptions (`/v1/subscriptions`, permission `subscriptions:manage`, owner only) and
//! their delivery (docs/events.md). Errors use the subscription error shape
//! `{error, message, issues?}`.

pub mod delivery;
pub mod safety;
pub use capstan_core::secrets;

use crate::ApiState;
use crate::auth::Caller;
use crate::error::ApiError;
use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use capstan_store::subscriptions::{DeliveryRecord, SubscriptionRecord};
use serde_json::{Value, json};
use std::collections::HashMap;

/// How webhooks behave on this node.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub keyring: secrets::Keyring,
    pub policy: safety::UrlPolicy,
    /// A CA certificate (PEM) trusted for callbacks besides the web PKI — tests only.
    pub extra_root_pem: Option<Vec<u8>>,
    /// Delay before attempt n+1 after attempt n failed (milliseconds); its length bounds the
    /// attempts.
    pub schedule_ms: Vec<i64>,
    pub timeout_ms: u64,
    /// Subscriptions one principal may hold.
    pub max_subscriptions_per_owner: usize,
}

/// The default retry schedule: 8 attempts over about 27 hours.
pub const DEFAULT_SCHEDULE_MS: [i64; 7] = [
    5_000,
    5 * 60_000,
    30 * 60_000,
    2 * 3_600_000,
    5 * 3_600_000,
    10 * 3_600_000,
    10 * 3_600_000,
];

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/subscriptions", get(list).post(create))
        .route(
            "/v1/subscriptions/{id}",
            get(read).patch(update).delete(remove),
        )
        .route("/v1/subscriptions/{id}/deliveries", get(deliveries))
        .route(
            "/v1/subscriptions/{id}/redeliver/{event_id}",
            post(redeliver),
        )
        .route("/v1/subscriptions/{id}/secret", post(rotate_secret))
        .with_state(state)
}

fn rfc3339(ms: i64) -> String {
    crate::views::rfc3339(ms)
}

pub fn subscription_view(s: &SubscriptionRecord) -> Value {
    json!({
        "id": s.id, "ownerPrincipalId": s.owner_principal_id, "url": s.url, "kmsKeyId": s.kms_key_id,
        "createdAt": rfc3339(s.created_ms), "health": if s.active { s.health.as_str() } else { "disabled" },
        "active": s.active, "events": s.events,
    })
}

pub fn delivery_view(d: &DeliveryRecord) -> Value {
    json!({
        "id": d.id, "subscriptionId": d.subscription_id, "eventId": d.event_id, "attempt": d.attempt,
        "status": d.status, "dispatchedAt": d.dispatched_ms.map(rfc3339), "lastError": d.last_error,
        "nextAttemptAt": d.next_attempt_ms.map(rfc3339), "responseCode": d.response_code,
    })
}

fn bad(message: impl Into<String>, issues: Vec<Value>) -> ApiError {
    let mut e = ApiError::bad_request("validation_error", message);
    if !issues.is_empty() {
        e.issues = Some(issues);
    }
    e
}

fn issue(path: &str, message: impl Into<String>) -> Value {
    json!({"path": path, "message": message.into()})
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "subscriptions_unavailable",
        format!("webhook subscription storage is unavailable: {e}"),
    )
}

fn limit(query: &HashMap<String, String>) -> Result<i64, ApiError> {
    for key in query.keys() {
        if key != "limit" {
            return Err(bad(format!("unknown query parameter `{key}`"), vec![]));
        }
    }
    match query.get("limit") {
        None => Ok(50),
        Some(text) => match text.parse::<i64>() {
            Ok(n) if (1..=100).contains(&n) => Ok(n),
            _ => Err(bad(
                "limit must be an integer from 1 to 100",
                vec![issue("/limit", "must be an integer from 1 to 100")],
            )),
        },
    }
}

fn parse_body(body: &Bytes) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(bad("the body must be a JSON object", vec![])),
        Err(e) => Err(ApiError::bad_request(
            "invalid_json",
            format!("the body is not valid JSON: {e}"),
        )),
    }
}

/// Validates an `events` filter: 1+ names of catalogued, non-archived versions.
async fn check_events(
    state: &ApiState,
    value: Option<&Value>,
    issues: &mut Vec<Value>,
) -> Vec<String> {
    let Some(Value::Array(items)) = value else {
        issues.push(issue(
            "/events",
            "must be an array of \"<EventType>.v<N>\" strings",
        ));
        return Vec::new();
    };
    if items.is_empty() {
        issues.push(issue("/events", "must name at least one event version"));
    }
    let mut events = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let pointer = format!("/events/{i}");
        let Some(name) = item.as_str().filter(|s| !s.is_empty()) else {
            issues.push(issue(&pointer, "must be a non-empty string"));
            continue;
        };
        let Some((ty, version)) = capstan_engine::catalog::parse_name(name) else {
            issues.push(issue(
                &pointer,
                format!("`{name}` is not of the form <EventType>.v<N>"),
            ));
            continue;
        };
        if capstan_engine::catalog::find(ty, version).is_none() {
            issues.push(issue(
                &pointer,
                format!("`{name}` is not in the event catalog"),
            ));
            continue;
        }
        let archived = state
            .store
            .event_version_override(ty, version)
            .await
            .ok()
            .flatten()
            .is_some_and(|o| o.state == "archived");
        if archived {
            issues.push(issue(
                &pointer,
                format!("`{name}` is archived and cannot be subscribed to"),
            ));
            continue;
        }
        if !events.contains(&name.to_owned()) {
            events.push(name.to_owned());
        }
    }
    events
}

/// The caller's subscription, or 404 (also for another owner's: existence is not disclosed).
async fn owned(
    state: &ApiState,
    caller: &Caller,
    id: &str,
) -> Result<SubscriptionRecord, ApiError> {
    caller
        .require(
            state,
            "subscriptions:manage",
            &format!("/v1/subscriptions/{id}"),
            None,
        )
        .await?;
    match state.store.subscription(id).await.map_err(unavailable)? {
        Some(s) if s.owner_principal_id == caller.principal_id => Ok(s),
        _ => Err(ApiError::not_found(format!("subscription {id} not found"))),
    }
}

/// The caller's subscription, still live: a deleted one stays readable (disabled, its history
/// kept) but takes no more changes.
async fn owned_live(
    state: &ApiState,
    caller: &Caller,
    id: &str,
) -> Result<SubscriptionRecord, ApiError> {
    let s = owned(state, caller, id).await?;
    if s.deleted_ms.is_some() {
        return Err(capstan_engine::EngineError::StateInvalid {
            reason: "subscription_deleted",
            message: format!("subscription {id} was deleted; its history stays readable"),
        }
        .into());
    }
    Ok(s)
}

async fn list(
    State(state): State<ApiState>,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    caller
        .require(&state, "subscriptions:manage", "/v1/subscriptions", None)
        .await?;
    let limit = limit(&query)?;
    let subs = state
        .store
        .subscriptions_of(&caller.principal_id, limit, true)
        .await
        .map_err(unavailable)?;
    Ok(Json(
        json!({"subscriptions": subs.iter().map(subscription_view).collect::<Vec<_>>()}),
    ))
}

async fn create(
    State(state): State<ApiState>,
    caller: Caller,
    body: Bytes,
) -> Result<Response, ApiError> {
    caller
        .require(&state, "subscriptions:manage", "/v1/subscriptions", None)
        .await?;
    let body = parse_body(&body)?;
    let mut issues = Vec::new();
    for key in body.keys() {
        if !["events", "secret", "url", "active"].contains(&key.as_str()) {
            issues.push(issue(
                &format!("/{key}"),
                "is not a property of CreateSubscription",
            ));
        }
    }
    let events = check_events(&state, body.get("events"), &mut issues).await;
    let secret = body
        .get("secret")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if secret.is_empty() {
        issues.push(issue(
            "/secret",
            "is required: a non-empty string (`whsec_<base64>` for Standard Webhooks libraries)",
        ));
    }
    let active = match body.get("active") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            issues.push(issue("/active", "must be a boolean"));
            true
        }
    };
    let url = body
        .get("url")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let config = &state.webhooks;
    match safety::parse_callback(&url, config.policy) {
        Err(e) => issues.push(issue("/url", e.to_string())),
        Ok(parsed) => {
            if let Err(e) = safety::resolve_vetted(&parsed, config.policy).await {
                issues.push(issue("/url", e.to_string()));
            }
        }
    }
    if !issues.is_empty() {
        return Err(bad("the subscription is invalid", issues));
    }
    // A share per principal: one tenant's subscriptions (and so its attempts in flight, one per
    // subscription) cannot crowd out the others'.
    let cap = config.max_subscriptions_per_owner;
    let held = state
        .store
        .subscriptions_of(
            &caller.principal_id,
            i64::try_from(cap).unwrap_or(i64::MAX),
            false,
        )
        .await
        .map_err(unavailable)?;
    if held.len() >= cap {
        return Err(ApiError::bad_request(
            "subscription_limit_reached",
            format!(
                "this principal already holds {cap} subscriptions (`webhooks.max_subscriptions_per_owner`); delete one first"
            ),
        ));
    }
    let id = capstan_core::ids::new_id();
    let (kms_key_id, sealed) = config.keyring.encrypt(secret.as_bytes(), id.as_bytes());
    let record = SubscriptionRecord {
        id: id.clone(),
        owner_principal_id: caller.principal_id.clone(),
        url,
        events,
        active,
        health: "healthy".to_owned(),
        kms_key_id,
        secret_sealed: sealed,
        previous_kms_key_id: None,
        previous_secret_sealed: None,
        previous_until_ms: None,
        created_ms: state.now(),
        deleted_ms: None,
        after_seq: 0,
    };
    state
        .store
        .insert_subscription(&record)
        .await
        .map_err(unavailable)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"subscription": subscription_view(&record)})),
    )
        .into_response())
}

async fn read(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let s = owned(&state, &caller, &id).await?;
    Ok(Json(json!({"subscription": subscription_view(&s)})))
}

async fn update(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    owned_live(&state, &caller, &id).await?;
    let body = parse_body(&body)?;
    let mut issues = Vec::new();
    for key in body.keys() {
        match key.as_str() {
            "active" | "events" => {}
            "url" | "secret" => issues.push(issue(
                &format!("/{key}"),
                if key == "url" {
                    "the callback URL cannot be changed: create a new subscription"
                } else {
                    "the secret is rotated with POST /v1/subscriptions/{id}/secret"
                },
            )),
            other => issues.push(issue(
                &format!("/{other}"),
                "is not a property of UpdateSubscription",
            )),
        }
    }
    if !body.contains_key("active") && !body.contains_key("events") {
        issues.push(issue("", "give `active`, `events` or both"));
    }
    let active = match body.get("active") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            issues.push(issue("/active", "must be a boolean"));
            None
        }
    };
    let events = if body.contains_key("events") {
        Some(check_events(&state, body.get("events"), &mut issues).await)
    } else {
        None
    };
    if !issues.is_empty() {
        return Err(bad("the update is invalid", issues));
    }
    let health = active.map(|a| if a { "healthy" } else { "disabled" });
    state
        .store
        .update_subscription(&id, active, events.as_deref(), health)
        .await
        .map_err(unavailable)?;
    let s = owned(&state, &caller, &id).await?;
    Ok(Json(json!({"subscription": subscription_view(&s)})))
}

async fn remove(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    // Deleting again changes nothing (the first deletion's time and history stay).
    if owned(&state, &caller, &id).await?.deleted_ms.is_some() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    state
        .store
        .delete_subscription(&id, state.now(), "deleted by its owner")
        .await
        .map_err(unavailable)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn deliveries(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    owned(&state, &caller, &id).await?;
    let limit = limit(&query)?;
    let items = state
        .store
        .deliveries_of(&id, limit)
        .await
        .map_err(unavailable)?;
    Ok(Json(
        json!({"deliveries": items.iter().map(delivery_view).collect::<Vec<_>>()}),
    ))
}

async fn redeliver(
    State(state): State<ApiState>,
    caller: Caller,
    Path((id, event_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    owned_live(&state, &caller, &id).await?;
    let delivery = state
        .store
        .redeliver(&id, &event_id, state.now())
        .await
        .map_err(unavailable)?
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "event {event_id} was never routed to subscription {id}"
            ))
        })?;
    state.store.events_committed();
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"delivery": delivery_view(&delivery)})),
    )
        .into_response())
}

/// How long the previous secret keeps signing after a rotation.
pub const ROTATION_OVERLAP_MS: i64 = 24 * 3_600_000;

async fn rotate_secret(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    owned_live(&state, &caller, &id).await?;
    let body = parse_body(&body)?;
    let secret = body
        .get("secret")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if secret.is_empty() || body.len() != 1 {
        return Err(bad(
            "the body must be {\"secret\": \"<non-empty string>\"}",
            vec![issue("/secret", "is required: a non-empty string")],
        ));
    }
    let (kms_key_id, sealed) = state
        .webhooks
        .keyring
        .encrypt(secret.as_bytes(), id.as_bytes());
    state
        .store
        .rotate_subscription_secret(&id, &kms_key_id, &sealed, state.now() + ROTATION_OVERLAP_MS)
        .await
        .map_err(unavailable)?;
    caller
        .audit(
            &state,
            "subscriptions:rotate-secret",
            &format!("/v1/subscriptions/{id}/secret"),
            None,
            true,
        )
        .await?;
    let s = owned(&state, &caller, &id).await?;
    Ok(Json(json!({"subscription": subscription_view(&s)})))
}
