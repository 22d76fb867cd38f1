//! The public event catalog and the admin event-version routes:
//!
//! - `GET /v1/events/catalog` (no auth): `{events: [{eventType, eventVersion, name, description,
//!   lifecycle, schema}]}`, every catalogued version with its effective lifecycle.
//! - `GET /v1/admin/event-versions/{eventType}/{eventVersion}/usage` (admin:read):
//!   EventVersionUsage.
//! - `POST /v1/admin/event-versions/{eventType}/{eventVersion}/archive` (admin:write), body
//!   `{confirm: true}`: archives a deprecated version.
//!
//! The catalog itself is data in `capstan_engine::catalog`; operator overrides of a version's
//! lifecycle (deprecation, archival) are in the store (`event_versions`).

use crate::auth::Caller;
use crate::error::ApiError;
use crate::{ApiState, views};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use capstan_engine::catalog::{self, CatalogEntry, Lifecycle, LifecycleState};
use capstan_store::event_versions::{ArchiveOutcome, EventVersionRecord};
use serde_json::{Value, json};

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/events/catalog", get(list))
        .route(
            "/v1/admin/event-versions/{event_type}/{event_version}/usage",
            get(usage),
        )
        .route(
            "/v1/admin/event-versions/{event_type}/{event_version}/archive",
            post(archive),
        )
        .with_state(state)
}

fn storage(e: sqlx::Error) -> ApiError {
    tracing::error!(error = %e, "event-version storage error");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "Storage is unavailable; retry later.",
    )
}

/// The code lifecycle with the stored override (if any) applied.
pub fn effective(code: &Lifecycle, stored: Option<&EventVersionRecord>) -> Lifecycle {
    let Some(r) = stored else {
        return code.clone();
    };
    Lifecycle {
        state: LifecycleState::parse(&r.state).unwrap_or(code.state),
        introduced_ms: code.introduced_ms,
        deprecated_ms: r.deprecated_ms.or(code.deprecated_ms),
        archived_ms: r.archived_ms.or(code.archived_ms),
        replacement: r.replacement.clone().or_else(|| code.replacement.clone()),
    }
}

fn as_record(entry: &CatalogEntry) -> EventVersionRecord {
    EventVersionRecord {
        event_type: entry.event_type.to_owned(),
        event_version: entry.version.to_owned(),
        state: entry.lifecycle.state.as_str().to_owned(),
        deprecated_ms: entry.lifecycle.deprecated_ms,
        archived_ms: entry.lifecycle.archived_ms,
        replacement: entry.lifecycle.replacement.clone(),
    }
}

fn item(entry: &CatalogEntry, lifecycle: &Lifecycle) -> Value {
    entry.to_json(lifecycle, views::rfc3339)
}

/// `GET /v1/events/catalog`: public, no token.
async fn list(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let overrides = state
        .store
        .event_version_overrides()
        .await
        .map_err(storage)?;
    let events: Vec<Value> = catalog::catalog()
        .iter()
        .map(|entry| {
            let stored = overrides
                .iter()
                .find(|r| r.event_type == entry.event_type && r.event_version == entry.version);
            item(entry, &effective(&entry.lifecycle, stored))
        })
        .collect();
    Ok(Json(json!({"events": events})))
}

/// The catalogued version with its effective lifecycle, or 404.
async fn version(
    state: &ApiState,
    event_type: &str,
    event_version: &str,
) -> Result<(CatalogEntry, Lifecycle), ApiError> {
    let Some(entry) = catalog::find(event_type, event_version) else {
        return Err(ApiError::not_found(format!(
            "no event version {event_type}.v{event_version} in the catalog"
        )));
    };
    let stored = state
        .store
        .event_version_override(event_type, event_version)
        .await
        .map_err(storage)?;
    let lifecycle = effective(&entry.lifecycle, stored.as_ref());
    Ok((entry, lifecycle))
}

/// `GET /v1/admin/event-versions/{eventType}/{eventVersion}/usage` (admin:read).
async fn usage(
    State(state): State<ApiState>,
    caller: Caller,
    Path((event_type, event_version)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    caller
        .require(
            &state,
            "admin:read",
            &format!("/v1/admin/event-versions/{event_type}/{event_version}"),
            None,
        )
        .await?;
    let (entry, lifecycle) = version(&state, &event_type, &event_version).await?;
    let subscribers = state
        .store
        .event_version_subscribers(entry.event_type, entry.version)
        .await
        .map_err(storage)?;
    let subscribers: Vec<Value> = subscribers
        .iter()
        .map(|s| {
            json!({
                "active": s.active,
                "health": s.health,
                "ownerPrincipalId": s.owner_principal_id,
                "subscriptionId": s.subscription_id,
            })
        })
        .collect();
    Ok(Json(json!({
        "eventType": entry.event_type,
        "eventVersion": entry.version,
        "lifecycle": lifecycle.to_json(views::rfc3339),
        "subscriberCount": subscribers.len(),
        "subscribers": subscribers,
    })))
}

/// The archive body: a JSON object with `confirm: true` (extra properties allowed).
fn confirmed(body: &[u8]) -> Result<(), ApiError> {
    let issue = |path: &str, message: &str| json!({"path": path, "message": message});
    let issues = match serde_json::from_slice::<Value>(body) {
        Err(e) => vec![issue("", &format!("the body is not valid JSON: {e}"))],
        Ok(Value::Object(map)) => match map.get("confirm") {
            Some(Value::Bool(true)) => Vec::new(),
            Some(_) => vec![issue("/confirm", "must be true")],
            None => vec![issue("", "\"confirm\" is a required property")],
        },
        Ok(_) => vec![issue("", "the body must be a JSON object")],
    };
    if issues.is_empty() {
        return Ok(());
    }
    let mut err = ApiError::bad_request(
        "validation_error",
        "Archiving an event version must be confirmed with {\"confirm\": true}.",
    );
    err.issues = Some(issues);
    Err(err)
}

/// `POST /v1/admin/event-versions/{eventType}/{eventVersion}/archive` (admin:write): archives a
/// deprecated version; 200 with its catalog item (lifecycle updated).
async fn archive(
    State(state): State<ApiState>,
    caller: Caller,
    Path((event_type, event_version)): Path<(String, String)>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    caller
        .require(
            &state,
            "admin:write",
            &format!("/v1/admin/event-versions/{event_type}/{event_version}"),
            None,
        )
        .await?;
    let (entry, _) = version(&state, &event_type, &event_version).await?;
    confirmed(&body)?;
    match state
        .store
        .archive_event_version(&as_record(&entry), state.now())
        .await
        .map_err(storage)?
    {
        ArchiveOutcome::Archived(record) => {
            tracing::info!(principal = %caller.principal_id, event = %entry.name(), "event version archived");
            let lifecycle = effective(&entry.lifecycle, Some(&record));
            Ok(Json(item(&entry, &lifecycle)))
        }
        ArchiveOutcome::NotDeprecated { state: current } => {
            let mut err = ApiError::new(
                StatusCode::CONFLICT,
                "state_invalid",
                format!(
                    "{} is {current}; only a deprecated version can be archived",
                    entry.name()
                ),
            );
            err.reason = Some(if current == "archived" {
                "already_archived".to_owned()
            } else {
                "not_deprecated".to_owned()
            });
            Err(err)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_archive_body_must_confirm() {
        assert!(confirmed(br#"{"confirm": true, "note": "ok"}"#).is_ok());
        for bad in [
            &b""[..],
            b"nope",
            b"[]",
            b"{}",
            br#"{"confirm": false}"#,
            br#"{"confirm": "true"}"#,
        ] {
            let err = confirmed(bad).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST);
            assert_eq!(err.code, "validation_error");
            assert!(!err.issues.unwrap().is_empty());
        }
    }

    #[test]
    fn overrides_apply_over_the_code_lifecycle() {
        let entry = catalog::find("StageFailed", "1").unwrap();
        assert_eq!(effective(&entry.lifecycle, None), entry.lifecycle);
        let stored = EventVersionRecord {
            state: "deprecated".into(),
            deprecated_ms: Some(1_767_225_600_000),
            replacement: Some("StageFailed.v2".into()),
            ..as_record(&entry)
        };
        let lc = effective(&entry.lifecycle, Some(&stored));
        assert_eq!(
            lc.to_json(views::rfc3339),
            json!({"state": "deprecated", "introducedAt": "2026-01-01T00:00:00.000Z", "deprecatedAt": "2026-01-01T00:00:00.000Z", "replacement": "StageFailed.v2"})
        );
    }
}
