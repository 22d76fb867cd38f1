//! The `/v1` routes.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::{ApiState, views};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use capstan_core::execution::ExecutionStatus;
use capstan_core::store::{ExecutionFilter, ExecutionRecord};
use capstan_engine::{CommandOutcome, TriggerRequest};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::HashMap;

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/workflows/{name}", post(trigger))
        .route("/v1/executions", get(list))
        .route("/v1/executions/{id}", get(get_execution))
        .route("/v1/executions/{id}/cancel", post(cancel))
        .route("/v1/executions/{id}/resume", post(resume))
        .route("/v1/executions/{id}/rollback", post(rollback))
        .route(
            "/v1/executions/{id}/retry-finalization",
            post(retry_finalization),
        )
        .route(
            "/v1/executions/{id}/retry-maps-whitelist",
            post(retry_maps_whitelist),
        )
        .route("/v1/executions/{id}/events", get(events))
        .route("/v1/executions/{id}/plan", get(plan))
        .route("/v1/executions/{id}/plan/approve", post(approve_plan))
        .route("/v1/admin/simulator", get(simulator))
        .route(
            "/v1/principals/{principal_id}/api-keys",
            post(mint).get(list_keys),
        )
        .route("/v1/api-keys/{id}", delete(revoke))
        .route("/v1/audit-logs", get(audit_logs))
        .with_state(state)
}

/// The execution, after checking the caller may use its workflow (404 before 403 would leak
/// existence, so the lookup comes first and a forbidden caller learns only that it is forbidden).
async fn authorized(
    state: &ApiState,
    caller: &Caller,
    id: &str,
    permission: Option<&str>,
) -> Result<ExecutionRecord, ApiError> {
    let Some(execution) = state.store_execution(id).await? else {
        caller
            .audit(
                state,
                "executions:lookup",
                &format!("/v1/executions/{id}"),
                None,
                true,
            )
            .await;
        return Err(ApiError::not_found(format!("execution {id} not found")));
    };
    let permission = permission.map_or_else(
        || format!("workflows:{}", execution.workflow),
        str::to_owned,
    );
    caller
        .require(
            state,
            &permission,
            &format!("/v1/executions/{id}"),
            Some(id),
        )
        .await?;
    Ok(execution)
}

impl ApiState {
    async fn store_execution(&self, id: &str) -> Result<Option<ExecutionRecord>, ApiError> {
        use capstan_core::store::EngineStore;
        self.store
            .execution(id)
            .await
            .map_err(|e| ApiError::from(capstan_engine::EngineError::Store(e)))
    }
}

fn links(id: &str) -> Value {
    json!({"self": format!("/v1/executions/{id}"), "cancel": format!("/v1/executions/{id}/cancel"), "events": format!("/v1/executions/{id}/events")})
}

/// `POST /v1/workflows/{name}`: validates the body against the workflow's input schema and
/// creates an execution; the `Idempotency-Key` makes it safe to retry.
async fn trigger(
    State(state): State<ApiState>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Some(workflow) = state.engine.workflow(&name) else {
        return Err(ApiError::not_found(format!(
            "no workflow named `{name}` is loaded"
        )));
    };
    caller
        .require(
            &state,
            &format!("workflows:{name}"),
            &format!("/v1/workflows/{name}"),
            None,
        )
        .await?;
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .ok_or_else(|| {
            ApiError::bad_request(
                "missing_idempotency_key",
                "The Idempotency-Key header is required (1 to 255 characters).",
            )
        })?
        .to_owned();
    let input: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "invalid_json",
            format!("The request body is not valid JSON: {e}"),
        )
    })?;
    validate(&workflow.descriptor.input_schema, &input)?;
    let body_sha = hex::encode(Sha256::digest(input.to_string().as_bytes()));
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let triggered = state
        .engine
        .trigger(TriggerRequest {
            workflow: name.clone(),
            principal_id: caller.principal_id.clone(),
            input,
            idempotency: Some((key, body_sha)),
            traceparent,
        })
        .await?;
    let e = &triggered.execution;
    let body = json!({
        "estimatedDurationSeconds": workflow.descriptor.estimated_duration_seconds,
        "executionId": e.id,
        "links": links(&e.id),
        "stages": workflow.descriptor.stages,
        "status": if triggered.replayed { e.status.as_str() } else { "queued" },
        "workflow": e.workflow,
        "workflowRunId": e.run_id,
    });
    let status = if triggered.replayed {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(body)).into_response())
}

/// Validates `input` against `schema`, with one issue per problem and its JSON pointer.
fn validate(schema: &Value, input: &Value) -> Result<(), ApiError> {
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| ApiError::internal(format!("the workflow's input schema is invalid: {e}")))?;
    let issues: Vec<Value> = validator
        .iter_errors(input)
        .map(|e| json!({"path": e.instance_path().to_string(), "message": e.to_string()}))
        .collect();
    if issues.is_empty() {
        return Ok(());
    }
    let mut err = ApiError::bad_request(
        "validation_error",
        "The request body does not match the workflow's input schema.",
    );
    err.issues = Some(issues);
    Err(err)
}

/// `GET /v1/executions`: newest first, only workflows the caller may use.
async fn list(
    State(state): State<ApiState>,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    for key in query.keys() {
        if !["limit", "workflow", "status", "principalId"].contains(&key.as_str()) {
            return Err(ApiError::bad_request(
                "invalid_filter",
                format!("unknown filter `{key}` (use limit, workflow, status, principalId)"),
            ));
        }
    }
    let limit = match query.get("limit") {
        None => 50,
        Some(l) => l
            .parse::<i64>()
            .ok()
            .filter(|l| (1..=100).contains(l))
            .ok_or_else(|| {
                ApiError::bad_request("invalid_filter", "limit must be an integer from 1 to 100")
            })?,
    };
    let status = query
        .get("status")
        .map(|s| s.parse::<ExecutionStatus>())
        .transpose()
        .map_err(|e| ApiError::bad_request("invalid_filter", e.to_string()))?;
    let mut workflows = caller.workflows();
    if let Some(w) = query.get("workflow") {
        workflows.retain(|x| x == w);
    }
    caller
        .audit(&state, "workflows:list", "/v1/executions", None, true)
        .await;
    let filter = ExecutionFilter {
        workflows: Some(workflows),
        status,
        principal_id: query.get("principalId").cloned(),
        limit,
    };
    use capstan_core::store::EngineStore;
    let executions = state
        .store
        .list_executions(&filter)
        .await
        .map_err(capstan_engine::EngineError::from)?;
    Ok(Json(
        json!({"executions": executions.iter().map(views::summary).collect::<Vec<_>>()}),
    ))
}

async fn get_execution(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    authorized(&state, &caller, &id, None).await?;
    let (execution, stages) = state
        .engine
        .execution(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("execution {id} not found")))?;
    Ok(Json(views::execution(&execution, &stages)))
}

async fn cancel(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    authorized(&state, &caller, &id, None).await?;
    let canceled = state.engine.cancel(&id).await?;
    let mut body = json!({"execution": views::summary(&canceled.execution)});
    if canceled.cancellation_requested {
        body["status"] = json!("cancellation_requested");
    }
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

async fn resume(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    authorized(&state, &caller, &id, None).await?;
    let outcome = state.engine.resume(&id).await?;
    let status = if outcome.reused {
        "retry_already_queued"
    } else {
        "retry_queued"
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"execution": views::summary(&outcome.execution), "status": status})),
    )
        .into_response())
}

/// `GET /v1/executions/{id}/plan`: the AddSubdomainPlan the execution published for approval
/// (still readable after it was approved).
async fn plan(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    authorized(&state, &caller, &id, None).await?;
    let wait = state.engine.pending_approval(&id).await?;
    match wait.and_then(|w| w.payload_json) {
        Some(plan) => Ok(Json(plan)),
        None => Err(ApiError::not_found(format!(
            "execution {id} has not published a plan (yet)"
        ))),
    }
}

/// `POST /v1/executions/{id}/plan/approve` with `{planHash}`: approves exactly the plan the caller
/// read; a hash that is not the current plan's → 409.
async fn approve_plan(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    authorized(&state, &caller, &id, None).await?;
    let body: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
    })?;
    let schema = json!({
        "type": "object",
        "required": ["planHash"],
        "properties": {"planHash": {"type": "string", "pattern": "^[a-f0-9]{64}$"}},
    });
    validate(&schema, &body)?;
    let hash = body["planHash"].as_str().unwrap_or_default();
    let execution = state.engine.approve(&id, hash, body.clone()).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"execution": views::summary(&execution), "planHash": hash})),
    )
        .into_response())
}

/// `GET /v1/admin/simulator` (admin:read): the simulated cloud's whole state.
async fn simulator(State(state): State<ApiState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    caller
        .require(&state, "admin:read", "/v1/admin/simulator", None)
        .await?;
    let Some(cloud) = &state.simulator else {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_configured",
            "this node does not run the simulated cloud",
        ));
    };
    cloud.snapshot().await.map(Json).map_err(ApiError::internal)
}

fn command_body(outcome: &CommandOutcome, operation: &str) -> Value {
    let status = match outcome.command.as_ref().map(|c| c.status) {
        Some(capstan_core::store::CommandStatus::Active) => "active",
        _ => "queued",
    };
    json!({
        "command": {"commandId": outcome.command.as_ref().map(|c| c.id.clone()), "operation": operation, "status": status},
        "execution": views::summary(&outcome.execution),
        "workflowRunId": outcome.execution.run_id,
    })
}

async fn rollback(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    authorized(&state, &caller, &id, None).await?;
    let outcome = state.engine.rollback(&id).await?;
    if outcome.immediate {
        return Ok((
            StatusCode::OK,
            Json(json!({"execution": views::summary(&outcome.execution)})),
        )
            .into_response());
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(command_body(&outcome, "rollback")),
    )
        .into_response())
}

async fn retry_finalization(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let execution = state
        .store_execution(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("execution {id} not found")))?;
    if !["add-certificate", "onboard-domain"].contains(&execution.workflow.as_str()) {
        authorized(&state, &caller, &id, None).await?;
        return Err(capstan_engine::EngineError::StateInvalid {
            reason: "not_supported",
            message: format!("{} has no finalization to retry", execution.workflow),
        }
        .into());
    }
    authorized(&state, &caller, &id, None).await?;
    let outcome = state
        .engine
        .recover(&id, "retry-finalization", &[ExecutionStatus::Failed])
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(command_body(&outcome, "retry-finalization")),
    )
        .into_response())
}

async fn retry_maps_whitelist(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let execution = authorized(&state, &caller, &id, Some("workflows:onboard-domain")).await?;
    let manual = execution
        .outcome_json
        .as_ref()
        .and_then(|o| o.pointer("/mapsProvider/outcome"))
        .and_then(Value::as_str)
        == Some("manual-required");
    if execution.workflow != "onboard-domain" || (!manual && !execution.status.is_active()) {
        return Err(capstan_engine::EngineError::StateInvalid {
            reason: "not_eligible",
            message: "only a succeeded onboard-domain execution whose maps outcome is manual-required can retry the maps whitelist".to_owned(),
        }
        .into());
    }
    let outcome = state
        .engine
        .recover(&id, "retry-maps-whitelist", &[ExecutionStatus::Succeeded])
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(command_body(&outcome, "retry-maps-whitelist")),
    )
        .into_response())
}

async fn events(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    authorized(&state, &caller, &id, None).await?;
    use capstan_core::store::EngineStore;
    let events = state
        .store
        .events(&id)
        .await
        .map_err(capstan_engine::EngineError::from)?;
    Ok(Json(
        json!({"events": events.iter().map(views::event).collect::<Vec<_>>()}),
    ))
}

fn key_metadata(k: &capstan_store::auth::ApiKeyRecord) -> Value {
    json!({
        "apiKeyId": k.id,
        "createdAt": views::rfc3339(k.created_ms),
        "expiresAt": views::rfc3339(k.expires_ms),
        "prefix": k.prefix,
        "principalId": k.principal_id,
        "pepperVersion": k.pepper_version,
        "lastUsedAt": k.last_used_ms.map(views::rfc3339),
        "revokedAt": k.revoked_ms.map(views::rfc3339),
    })
}

async fn own_or_manage(
    state: &ApiState,
    caller: &Caller,
    principal_id: &str,
) -> Result<(), ApiError> {
    let resource = format!("/v1/principals/{principal_id}/api-keys");
    if caller.principal_id == principal_id {
        caller
            .audit(state, "api-keys:own", &resource, None, true)
            .await;
        return Ok(());
    }
    caller
        .require(state, "principals:manage", &resource, None)
        .await
}

async fn mint(
    State(state): State<ApiState>,
    caller: Caller,
    Path(principal_id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    own_or_manage(&state, &caller, &principal_id).await?;
    let body: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::bad_request(
                "invalid_json",
                format!("The request body is not valid JSON: {e}"),
            )
        })?
    };
    let days = match body.get("expiresInDays") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_i64().filter(|d| (1..=3650).contains(d)).ok_or_else(|| {
            let mut e = ApiError::bad_request("validation_error", "The request body is invalid.");
            e.issues = Some(vec![json!({"path": "/expiresInDays", "message": "must be an integer from 1 to 3650"})]);
            e
        })?),
    };
    if let Some(extra) = body
        .as_object()
        .and_then(|o| o.keys().find(|k| *k != "expiresInDays"))
    {
        let mut e = ApiError::bad_request("validation_error", "The request body is invalid.");
        e.issues = Some(vec![
            json!({"path": format!("/{extra}"), "message": "unknown property"}),
        ]);
        return Err(e);
    }
    let minted = crate::mint_key(
        &state.store,
        &state.config,
        state.now(),
        &principal_id,
        days,
    )
    .await
    .map_err(|e| ApiError::bad_request("validation_error", e.to_string()))?;
    let k = &minted.record;
    let body = json!({"apiKey": {
        "apiKeyId": k.id,
        "expiresAt": views::rfc3339(k.expires_ms),
        "plaintextToken": minted.plaintext,
        "prefix": k.prefix,
        "principalId": k.principal_id,
        "pepperVersion": k.pepper_version,
    }});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn list_keys(
    State(state): State<ApiState>,
    caller: Caller,
    Path(principal_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    own_or_manage(&state, &caller, &principal_id).await?;
    let keys = state
        .store
        .api_keys_of(&principal_id)
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(
        json!({"apiKeys": keys.iter().map(key_metadata).collect::<Vec<_>>()}),
    ))
}

async fn revoke(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    caller
        .require(
            &state,
            "principals:manage",
            &format!("/v1/api-keys/{id}"),
            None,
        )
        .await?;
    if !state
        .store
        .revoke_api_key(&id, state.now())
        .await
        .map_err(ApiError::internal)?
    {
        return Err(ApiError::not_found(format!("API key {id} not found")));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn audit_logs(
    State(state): State<ApiState>,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    caller
        .require(&state, "audit:read", "/v1/audit-logs", None)
        .await?;
    let bad = |m: &str| ApiError::bad_request("invalid_filter", m.to_owned());
    for key in query.keys() {
        if !["principalId", "result", "route", "since", "until", "limit"].contains(&key.as_str()) {
            return Err(bad(&format!("unknown filter `{key}`")));
        }
    }
    let limit = match query.get("limit") {
        None => 50,
        Some(l) => l
            .parse::<i64>()
            .ok()
            .filter(|l| (1..=100).contains(l))
            .ok_or_else(|| bad("limit must be an integer from 1 to 100"))?,
    };
    if let Some(r) = query.get("result")
        && r != "allowed"
        && r != "denied"
    {
        return Err(bad("result must be allowed or denied"));
    }
    let millis = |k: &str| -> Result<Option<i64>, ApiError> {
        query
            .get(k)
            .map(|v| {
                v.parse::<i64>()
                    .map_err(|_| bad(&format!("{k} must be milliseconds since the Unix epoch")))
            })
            .transpose()
    };
    let filter = capstan_store::auth::AuditFilter {
        principal_id: query.get("principalId").cloned(),
        result: query.get("result").cloned(),
        route: query.get("route").cloned(),
        since_ms: millis("since")?,
        until_ms: millis("until")?,
        limit,
    };
    let rows = state
        .store
        .audit(&filter)
        .await
        .map_err(ApiError::internal)?;
    let logs: Vec<Value> = rows
        .iter()
        .map(|a| json!({
            "id": a.id, "action": a.action, "at": views::rfc3339(a.at_ms), "method": a.method, "principalId": a.principal_id,
            "resource": a.resource, "route": a.route, "result": a.result, "executionId": a.execution_id, "ip": a.ip, "userAgent": a.user_agent,
        }))
        .collect();
    Ok(Json(json!({"auditLogs": logs})))
}
