//! The `/v1` routes. Each handler carries its `#[utoipa::path]` and is registered with `routes!`,
//! so the route and its entry in the OpenAPI document (`openapi.rs`, served at
//! `GET /v1/openapi.json`) come from the same place.

use crate::ApiState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::views::{
    self, AddSubdomainPlan, ApiKeyList, AuditLogList, CancelResponse, CancelStatus,
    CommandOperation, CommandResponse, Error, EventList, Execution, ExecutionEnvelope,
    ExecutionList, MintApiKeyRequest, MintedApiKeyEnvelope, PlanApproval, PlanApproved,
    ReceiptList, ResumeResponse, ResumeStatus, WorkflowTriggerResponse,
};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use capstan_core::execution::ExecutionStatus;
use capstan_core::store::ExecutionFilter;
use capstan_engine::TriggerRequest;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::time::Duration;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

#[path = "openapi.rs"]
pub mod openapi;

/// Every `/v1` route of this router with its OpenAPI operation. Register new routes here with
/// `routes!` (never with a plain `.route`): `tests/tests/openapi.rs` fails on an undocumented one.
pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(trigger))
        .routes(routes!(list))
        .routes(routes!(get_execution))
        .routes(routes!(cancel))
        .routes(routes!(resume))
        .routes(routes!(rollback))
        .routes(routes!(retry_finalization))
        .routes(routes!(retry_maps_whitelist))
        .routes(routes!(events))
        .routes(routes!(receipts))
        .routes(routes!(plan))
        .routes(routes!(approve_plan))
        .routes(routes!(simulator))
        .routes(routes!(mint, list_keys))
        .routes(routes!(revoke))
        .routes(routes!(audit_logs))
        .routes(routes!(openapi::serve))
}

pub fn router(state: ApiState) -> Router {
    let (router, _) = routes().split_for_parts();
    router.with_state(state)
}

/// Path parameter `id` of the execution routes.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct ExecutionId {
    /// The execution id.
    id: String,
}

/// Query of `GET /v1/executions` (any other parameter → 400).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct ExecutionQuery {
    /// Page size.
    #[param(minimum = 1, maximum = 100, default = 50)]
    limit: Option<i64>,
    /// Only this workflow (narrowed to the caller's workflows).
    workflow: Option<String>,
    /// Only this status.
    #[param(inline)]
    status: Option<views::ExecutionStatusView>,
    /// Only executions requested by this principal.
    principal_id: Option<String>,
}

/// Query of `GET /v1/executions/{id}` (any other parameter → 400).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
struct AwaitQuery {
    /// Wait up to this long for the execution to stop being `queued` or `running` (to end, to
    /// wait, or to pause): `30s`, `500ms`, `1m`, or seconds (`30`). At most 25 s, so the answer
    /// comes before the node's request deadline (`connections.request_ms`, 30 s). Without it,
    /// the answer is immediate.
    #[param(example = "25s")]
    wait: Option<String>,
}

/// The longest `?wait=` of `GET /v1/executions/{id}`: below the default request deadline
/// (`connections.request_ms`, 30 s), which would answer 408 instead.
const MAX_WAIT_MS: u64 = 25_000;

/// How often an awaiting request reads the execution again even without a wake-up (on
/// PostgreSQL a missed notification from another node costs at most this).
const AWAIT_POLL: Duration = Duration::from_secs(1);

/// `?wait=` as a duration: `500ms`, `30s`, `1m`, or bare seconds.
fn parse_wait(text: &str) -> Result<Duration, ApiError> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let scale = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        _ => 0,
    };
    let millis = number.parse::<u64>().ok().filter(|_| scale > 0);
    match millis {
        Some(n) if n.saturating_mul(scale) <= MAX_WAIT_MS => Ok(Duration::from_millis(n * scale)),
        _ => Err(ApiError::bad_request(
            "invalid_filter",
            format!(
                "wait must be a duration of at most {} s (`500ms`, `25s`, `25`), not `{text}`",
                MAX_WAIT_MS / 1_000
            ),
        )),
    }
}

/// Query of `GET /v1/audit-logs` (any other parameter → 400).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct AuditQuery {
    principal_id: Option<String>,
    #[param(inline)]
    result: Option<views::AuditResult>,
    /// The matched route template, e.g. `/v1/executions/{id}`.
    route: Option<String>,
    /// From this time, in milliseconds since the Unix epoch.
    since: Option<i64>,
    /// Until this time, in milliseconds since the Unix epoch.
    until: Option<i64>,
    #[param(minimum = 1, maximum = 100, default = 50)]
    limit: Option<i64>,
}

/// The execution's workflow, after checking the caller may use it (404 before 403 would leak
/// existence, so the lookup comes first and a forbidden caller learns only that it is forbidden).
/// Only the workflow is read: what a call on the execution does next reads what it needs.
async fn authorized(
    state: &ApiState,
    caller: &Caller,
    id: &str,
    permission: Option<&str>,
) -> Result<String, ApiError> {
    use capstan_core::store::ExecutionReads;
    let workflow = state
        .store
        .execution_workflow(id)
        .await
        .map_err(|e| ApiError::from(capstan_engine::EngineError::Store(e)))?;
    let Some(workflow) = workflow else {
        return Err(unknown(state, caller, id).await);
    };
    permit(state, caller, id, &workflow, permission).await?;
    Ok(workflow)
}

/// The 404 for execution `id`, which does not exist; the lookup is audited first.
async fn unknown(state: &ApiState, caller: &Caller, id: &str) -> ApiError {
    let path = format!("/v1/executions/{id}");
    match caller
        .audit(state, "executions:lookup", &path, None, true)
        .await
    {
        Ok(()) => ApiError::not_found(format!("execution {id} not found")),
        Err(error) => error,
    }
}

/// Checks (and audits) the caller's access to execution `id` of `workflow`: 403 without
/// `permission` (default: the execution's workflow).
async fn permit(
    state: &ApiState,
    caller: &Caller,
    id: &str,
    workflow: &str,
    permission: Option<&str>,
) -> Result<(), ApiError> {
    let permission = permission.map_or_else(|| format!("workflows:{workflow}"), str::to_owned);
    caller
        .require(
            state,
            &permission,
            &format!("/v1/executions/{id}"),
            Some(id),
        )
        .await
}

/// `POST /v1/workflows/{name}`: validates the body against the workflow's input schema and
/// creates an execution; the `Idempotency-Key` makes it safe to retry.
#[utoipa::path(
    post,
    path = "/v1/workflows/{name}",
    tag = "workflows",
    operation_id = "triggerWorkflow",
    description = "Starts an execution of the workflow `name` (permission `workflows:<name>`). The body is validated against the workflow's own input schema; for `onboard-domain` it is an OnboardDomainRequest. The same `Idempotency-Key` with the same body replays the existing execution (200).",
    params(
        ("name" = String, Path, description = "The workflow, e.g. `onboard-domain`."),
        ("Idempotency-Key" = String, Header, min_length = 1, max_length = 255, pattern = "\\S", description = "Makes the trigger safe to retry (1 to 255 characters, not only spaces)."),
        ("traceparent" = Option<String>, Header, description = "W3C trace context carried into the execution's events."),
    ),
    request_body(content = Object, description = "The workflow's input (any JSON object its input schema accepts); see OnboardDomainRequest for onboard-domain.", content_type = "application/json"),
    responses(
        (status = 202, description = "A new execution.", body = WorkflowTriggerResponse),
        (status = 200, description = "Idempotent replay of the existing execution.", body = WorkflowTriggerResponse),
        (status = 400, description = "`missing_idempotency_key`, `invalid_json` or `validation_error` (with `issues`).", body = Error),
        (status = 403, description = "`forbidden`: `workflows:<name>` is missing.", body = Error),
        (status = 404, description = "`not_found`: no workflow of that name is loaded.", body = Error),
        (status = 409, description = "`idempotency_conflict` (same key, other body) or `reservation_replay_pending` (retry after `Retry-After`).", body = Error, headers(("Retry-After" = Option<u64>, description = "Seconds to wait (reservation_replay_pending)."))),
    ),
    security(("bearer" = [])),
)]
async fn trigger(
    State(state): State<ApiState>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<WorkflowTriggerResponse>), ApiError> {
    let Some(workflow) = state.engine.workflow(&name) else {
        return Err(ApiError::not_found(format!(
            "no workflow named `{name}` is loaded"
        )));
    };
    // The authorisation's audit record commits alongside the trigger's own commit.
    let work = async {
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
        // Stored, hashed and validated as the workflow declares it (defaults, trimming, case).
        let input = crate::input::normalize(&workflow.descriptor.input_schema, input);
        validate(&workflow.input_validator, &input)?;
        let body_sha = hex::encode(Sha256::digest(input.to_string().as_bytes()));
        let traceparent = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        state
            .engine
            .trigger(TriggerRequest {
                workflow: name.clone(),
                principal_id: caller.principal_id.clone(),
                input,
                idempotency: Some((key, body_sha)),
                traceparent,
            })
            .await
            .map_err(ApiError::from)
    };
    let triggered = caller
        .require_during(
            &state,
            &format!("workflows:{name}"),
            &format!("/v1/workflows/{name}"),
            work,
        )
        .await?;
    let e = &triggered.execution;
    let body = WorkflowTriggerResponse {
        estimated_duration_seconds: workflow.descriptor.estimated_duration_seconds,
        execution_id: e.id.clone(),
        links: views::ExecutionLinks::of(&e.id),
        stages: workflow.descriptor.stages.clone(),
        // What was committed: `running` when a worker slot was free and the run started at once.
        status: e.status.into(),
        workflow: e.workflow.clone(),
        workflow_run_id: e.run_id.clone(),
    };
    let status = if triggered.replayed {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(body)))
}

/// Validates `input` with a compiled schema, with one issue per problem and its JSON pointer.
fn validate(validator: &jsonschema::Validator, input: &Value) -> Result<(), ApiError> {
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
#[utoipa::path(
    get,
    path = "/v1/executions",
    tag = "executions",
    operation_id = "listExecutions",
    description = "Newest first; only executions of workflows the caller may use (`workflows:<name>`).",
    params(ExecutionQuery),
    responses(
        (status = 200, description = "The page.", body = ExecutionList),
        (status = 400, description = "`invalid_filter`: an unknown parameter, a limit outside 1-100 or an unknown status.", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn list(
    State(state): State<ApiState>,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<ExecutionList>, ApiError> {
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
        .await?;
    let filter = ExecutionFilter {
        workflows: Some(workflows),
        status,
        principal_id: query.get("principalId").cloned(),
        limit,
    };
    use capstan_core::store::ExecutionReads;
    let executions = state
        .store
        .list_executions(&filter)
        .await
        .map_err(capstan_engine::EngineError::from)?;
    Ok(Json(ExecutionList {
        executions: executions.iter().map(views::summary).collect(),
    }))
}

/// `GET /v1/executions/{id}`, and with `?wait=` the await of its result in one request.
#[utoipa::path(
    get,
    path = "/v1/executions/{id}",
    tag = "executions",
    operation_id = "getExecution",
    description = "With `wait`, a bounded long poll: the answer comes as soon as the execution is neither `queued` nor `running` (it ended, waits or paused), or when the wait elapses with the execution as it then stands.",
    params(ExecutionId, AwaitQuery),
    responses(
        (status = 200, description = "The execution with its stages in order and its outcome, if any.", body = Execution),
        (status = 400, description = "`invalid_filter`: an unknown parameter, or a `wait` that is not a duration of at most 25 s.", body = Error),
        (status = 403, description = "`forbidden`: the caller may not use the execution's workflow.", body = Error),
        (status = 404, description = "`not_found`: no such execution.", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn get_execution(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Execution>, ApiError> {
    if let Some(key) = query.keys().find(|k| k.as_str() != "wait") {
        return Err(ApiError::bad_request(
            "invalid_filter",
            format!("unknown parameter `{key}` (use wait)"),
        ));
    }
    let wait = query.get("wait").map(|w| parse_wait(w)).transpose()?;
    let deadline = tokio::time::Instant::now() + wait.unwrap_or_default();
    // The commit that takes the execution out of `queued`/`running` wakes this execution's
    // waiters for that (not every waiter, nor at each stage); subscribed before the read, so a
    // move between the read and the wait wakes it. A plain read waits for nothing.
    let mut moved = wait.map(|_| state.store.wake_when_stopped(&id));
    let mut allowed = false;
    loop {
        if let Some(moved) = &mut moved {
            moved.mark_seen();
        }
        // The execution and its stages in one read; the stages are dropped unless it is
        // allowed. Authorized (and audited) once: a later read is of the same execution.
        let (execution, stages) = match state
            .store
            .execution_with_stages(&id)
            .await
            .map_err(|e| ApiError::from(capstan_engine::EngineError::Store(e)))?
        {
            Some((execution, stages)) => (Some(execution), stages),
            None => (None, Vec::new()),
        };
        let Some(execution) = execution else {
            return Err(unknown(&state, &caller, &id).await);
        };
        if !allowed {
            permit(&state, &caller, &id, &execution.workflow, None).await?;
            allowed = true;
        }
        let now = tokio::time::Instant::now();
        let Some(moved) = moved
            .as_mut()
            .filter(|_| execution.status.is_moving() && now < deadline)
        else {
            return Ok(Json(views::execution(&execution, &stages)));
        };
        tokio::select! {
            () = moved.changed() => {}
            () = tokio::time::sleep_until(deadline.min(now + AWAIT_POLL)) => {}
        }
    }
}

/// `POST /v1/executions/{id}/cancel`.
#[utoipa::path(
    post,
    path = "/v1/executions/{id}/cancel",
    tag = "executions",
    operation_id = "cancelExecution",
    params(ExecutionId),
    responses(
        (status = 202, description = "Canceled, or (cooperative workflows) the request recorded: `status: cancellation_requested`.", body = CancelResponse),
        (status = 403, description = "`forbidden`: the caller may not use the execution's workflow.", body = Error),
        (status = 404, description = "`not_found`: no such execution.", body = Error),        (status = 409, description = "`state_invalid` (with `reason`): not valid in the execution's state.", body = Error),
        (status = 501, description = "The operation is not configured on this node.", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn cancel(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<CancelResponse>), ApiError> {
    authorized(&state, &caller, &id, None).await?;
    let canceled = state.engine.cancel(&id).await?;
    let body = CancelResponse {
        execution: views::summary(&canceled.execution),
        status: canceled
            .cancellation_requested
            .then_some(CancelStatus::CancellationRequested),
    };
    Ok((StatusCode::ACCEPTED, Json(body)))
}

/// `POST /v1/executions/{id}/resume`.
#[utoipa::path(
    post,
    path = "/v1/executions/{id}/resume",
    tag = "executions",
    operation_id = "resumeExecution",
    params(ExecutionId),
    responses(
        (status = 202, description = "A retry was queued (or one already was).", body = ResumeResponse),
        (status = 403, description = "`forbidden`: the caller may not use the execution's workflow.", body = Error),
        (status = 404, description = "`not_found`: no such execution.", body = Error),        (status = 409, description = "`state_invalid` (with `reason`): not valid in the execution's state.", body = Error),
        (status = 501, description = "The operation is not configured on this node.", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn resume(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<ResumeResponse>), ApiError> {
    authorized(&state, &caller, &id, None).await?;
    let outcome = state.engine.resume(&id).await?;
    let status = if outcome.reused {
        ResumeStatus::RetryAlreadyQueued
    } else {
        ResumeStatus::RetryQueued
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(ResumeResponse {
            execution: views::summary(&outcome.execution),
            status,
        }),
    ))
}

/// `GET /v1/executions/{id}/plan`: the AddSubdomainPlan the execution published for approval
/// (still readable after it was approved).
#[utoipa::path(
    get,
    path = "/v1/executions/{id}/plan",
    tag = "executions",
    operation_id = "getSubdomainPlan",
    params(ExecutionId),
    responses(
        (status = 200, description = "The plan awaiting (or given) approval.", body = AddSubdomainPlan),
        (status = 403, description = "`forbidden`: the caller may not use the execution's workflow.", body = Error),
        (status = 404, description = "`not_found`: no such execution, or it has not published a plan (yet).", body = Error),
    ),
    security(("bearer" = [])),
)]
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
#[utoipa::path(
    post,
    path = "/v1/executions/{id}/plan/approve",
    tag = "executions",
    operation_id = "approveSubdomainPlan",
    params(ExecutionId),
    request_body(content = PlanApproval, description = "The hash of the plan the caller read."),
    responses(
        (status = 202, description = "Approved; the execution goes on.", body = PlanApproved),
        (status = 400, description = "`invalid_json` or `validation_error` (with `issues`).", body = Error),
        (status = 403, description = "`forbidden`: the caller may not use the execution's workflow.", body = Error),
        (status = 404, description = "`not_found`: no such execution.", body = Error),
        (status = 409, description = "`state_invalid`: not waiting for approval, or `reason: stale_plan_hash`.", body = Error),
        (status = 501, description = "Workflow orchestration is not configured.", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn approve_plan(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<(StatusCode, Json<PlanApproved>), ApiError> {
    authorized(&state, &caller, &id, None).await?;
    let body: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
    })?;
    static PLAN_APPROVAL: std::sync::LazyLock<Result<jsonschema::Validator, String>> =
        std::sync::LazyLock::new(|| {
            jsonschema::validator_for(&json!({
                "type": "object",
                "required": ["planHash"],
                "properties": {"planHash": {"type": "string", "pattern": "^[a-f0-9]{64}$"}},
            }))
            .map_err(|e| e.to_string())
        });
    let validator = PLAN_APPROVAL
        .as_ref()
        .map_err(|e| ApiError::internal(format!("the plan approval schema is invalid: {e}")))?;
    validate(validator, &body)?;
    let hash = body["planHash"].as_str().unwrap_or_default();
    let execution = state.engine.approve(&id, hash, body.clone()).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(PlanApproved {
            execution: views::summary(&execution),
            plan_hash: hash.to_owned(),
        }),
    ))
}

/// `GET /v1/admin/simulator` (admin:read): the simulated cloud's whole state.
#[utoipa::path(
    get,
    path = "/v1/admin/simulator",
    tag = "admin",
    operation_id = "getSimulatorState",
    responses(
        (status = 200, description = "The simulated cloud's state (see docs/simulator.md).", body = Object),
        (status = 403, description = "`forbidden`: admin:read is missing.", body = Error),
        (status = 501, description = "`not_configured`: this node does not run the simulated cloud.", body = Error),
    ),
    security(("bearer" = [])),
)]
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

/// 200 `{execution}` or 202 `{command, execution, workflowRunId}`.
#[derive(Debug)]
enum RollbackResponse {
    Immediate(ExecutionEnvelope),
    Queued(CommandResponse),
}

impl axum::response::IntoResponse for RollbackResponse {
    fn into_response(self) -> axum::response::Response {
        match self {
            Self::Immediate(b) => (StatusCode::OK, Json(b)).into_response(),
            Self::Queued(b) => (StatusCode::ACCEPTED, Json(b)).into_response(),
        }
    }
}

/// `POST /v1/executions/{id}/rollback`.
#[utoipa::path(
    post,
    path = "/v1/executions/{id}/rollback",
    tag = "executions",
    operation_id = "rollbackExecution",
    params(ExecutionId),
    responses(
        (status = 200, description = "Rolled back at once (nothing to undo).", body = ExecutionEnvelope),
        (status = 202, description = "A rollback command was queued.", body = CommandResponse),
        (status = 403, description = "`forbidden`: the caller may not use the execution's workflow.", body = Error),
        (status = 404, description = "`not_found`: no such execution.", body = Error),        (status = 409, description = "`state_invalid` (with `reason`): not valid in the execution's state.", body = Error),
        (status = 501, description = "The operation is not configured on this node.", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn rollback(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<RollbackResponse, ApiError> {
    authorized(&state, &caller, &id, None).await?;
    let outcome = state.engine.rollback(&id).await?;
    if outcome.immediate {
        return Ok(RollbackResponse::Immediate(ExecutionEnvelope {
            execution: views::summary(&outcome.execution),
        }));
    }
    Ok(RollbackResponse::Queued(views::command(
        &outcome,
        CommandOperation::Rollback,
    )))
}

/// `POST /v1/executions/{id}/retry-finalization` (add-certificate and onboard-domain).
#[utoipa::path(
    post,
    path = "/v1/executions/{id}/retry-finalization",
    tag = "executions",
    operation_id = "retryFinalization",
    params(ExecutionId),
    responses(
        (status = 202, description = "A retry-finalization command was queued (or a pending one returned).", body = CommandResponse),
        (status = 403, description = "`forbidden`: the caller may not use the execution's workflow.", body = Error),
        (status = 404, description = "`not_found`: no such execution.", body = Error),        (status = 409, description = "`state_invalid` (with `reason`): not valid in the execution's state.", body = Error),
        (status = 501, description = "The operation is not configured on this node.", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn retry_finalization(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<CommandResponse>), ApiError> {
    // Whether the workflow has a finalization to retry, and from which statuses, is its own
    // declaration (`Recovery::new("retry-finalization", ..)`): the engine answers 409 otherwise.
    authorized(&state, &caller, &id, None).await?;
    let outcome = state.engine.recover(&id, "retry-finalization").await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(views::command(
            &outcome,
            CommandOperation::RetryFinalization,
        )),
    ))
}

/// `POST /v1/executions/{id}/retry-maps-whitelist` (onboard-domain).
#[utoipa::path(
    post,
    path = "/v1/executions/{id}/retry-maps-whitelist",
    tag = "executions",
    operation_id = "retryMapsWhitelist",
    params(ExecutionId),
    responses(
        (status = 202, description = "A retry-maps-whitelist command was queued (or a pending one returned).", body = CommandResponse),
        (status = 403, description = "`forbidden`: `workflows:onboard-domain` is missing.", body = Error),
        (status = 404, description = "`not_found`: no such execution.", body = Error),
        (status = 409, description = "`state_invalid` (with `reason`): not valid in the execution's state.", body = Error),
        (status = 501, description = "The operation is not configured on this node.", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn retry_maps_whitelist(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<CommandResponse>), ApiError> {
    // Where it applies (a succeeded onboard-domain whose maps outcome is manual-required) is the
    // workflow's declaration; the engine answers 409 otherwise.
    authorized(&state, &caller, &id, Some("workflows:onboard-domain")).await?;
    let outcome = state.engine.recover(&id, "retry-maps-whitelist").await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(views::command(
            &outcome,
            CommandOperation::RetryMapsWhitelist,
        )),
    ))
}

/// `GET /v1/executions/{id}/events`: the execution's persisted events, in order.
#[utoipa::path(
    get,
    path = "/v1/executions/{id}/events",
    tag = "executions",
    operation_id = "listExecutionEvents",
    params(ExecutionId),
    responses(
        (status = 200, description = "The execution's events in order (JSON); with `Accept: text/event-stream`, a server-sent event feed of them, which ends once it has sent the event that brought the execution to a terminal status.", content(
            (EventList = "application/json"),
            (String = "text/event-stream"),
        )),
        (status = 204, description = "A feed (`text/event-stream`) resumed with `Last-Event-ID` at the event that brought the execution to a terminal status, with nothing after it: there is nothing more to stream (an `EventSource` stops reconnecting)."),
        (status = 403, description = "`forbidden`: the caller may not use the execution's workflow.", body = Error),
        (status = 404, description = "`not_found`: no such execution.", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn events(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let workflow = authorized(&state, &caller, &id, None).await?;
    let wants_stream = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"));
    if wants_stream {
        let last = headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        return crate::streams::execution_stream(state, &caller, workflow, id, last).await;
    }
    use capstan_core::store::ExecutionReads;
    let events = state
        .store
        .events(&id)
        .await
        .map_err(capstan_engine::EngineError::from)?;
    Ok(Json(EventList {
        events: events.into_iter().map(views::OutboxEvent::from).collect(),
    })
    .into_response())
}

/// `GET /v1/executions/{id}/receipts`: what each side effect did and how a rollback undoes it.
#[utoipa::path(
    get,
    path = "/v1/executions/{id}/receipts",
    tag = "executions",
    operation_id = "listExecutionReceipts",
    description = "Not in the contract: Capstan's own. The durable receipts a rollback walks, newest last, each with what the provider was asked and answered and what the rollback does about it.",
    params(ExecutionId),
    responses(
        (status = 200, description = "The execution's receipts in the order the changes were made.", body = ReceiptList),
        (status = 403, description = "`forbidden`: the caller may not use the execution's workflow.", body = Error),
        (status = 404, description = "`not_found`: no such execution.", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn receipts(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ReceiptList>, ApiError> {
    authorized(&state, &caller, &id, None).await?;
    use capstan_core::store::ExecutionReads;
    let receipts = state
        .store
        .receipts(&id)
        .await
        .map_err(capstan_engine::EngineError::from)?;
    Ok(Json(ReceiptList {
        receipts: receipts.iter().map(views::receipt).collect(),
    }))
}

/// How `caller` may act on a principal's keys.
enum KeyAuthority {
    /// As that principal, with the key that authenticated it expiring then (a key it mints may
    /// not outlive it, so a stolen key cannot outlast its own revocation). Not yet audited.
    Own { key_expires_ms: Option<i64> },
    /// With principals:manage (audited).
    Manage,
}

fn own_keys_resource(principal_id: &str) -> String {
    format!("/v1/principals/{principal_id}/api-keys")
}

async fn own_or_manage(
    state: &ApiState,
    caller: &Caller,
    principal_id: &str,
) -> Result<KeyAuthority, ApiError> {
    if caller.principal_id == principal_id && !caller.has("principals:manage") {
        return Ok(KeyAuthority::Own {
            key_expires_ms: caller.key_expires_ms,
        });
    }
    caller
        .require(
            state,
            "principals:manage",
            &own_keys_resource(principal_id),
            None,
        )
        .await
        .map(|()| KeyAuthority::Manage)
}

async fn audit_own(
    state: &ApiState,
    caller: &Caller,
    principal_id: &str,
    allowed: bool,
) -> Result<(), ApiError> {
    caller
        .audit(
            state,
            "api-keys:own",
            &own_keys_resource(principal_id),
            None,
            allowed,
        )
        .await
}

/// `POST /v1/principals/{principalId}/api-keys`: mints a key; the plaintext is returned once.
#[utoipa::path(
    post,
    path = "/v1/principals/{principalId}/api-keys",
    tag = "api-keys",
    operation_id = "mintApiKey",
    params(("principalId" = String, Path, description = "The key's principal (own, or any with principals:manage).")),
    request_body(content = Option<MintApiKeyRequest>, description = "Optional; an empty body takes the default lifetime."),
    responses(
        (status = 201, description = "The new key; `plaintextToken` is shown only here.", body = MintedApiKeyEnvelope),
        (status = 400, description = "`invalid_json` or `validation_error` (invalid principal id or body).", body = Error),
        (status = 403, description = "`forbidden`: another principal's keys need principals:manage; without it, a key may not mint one that expires after itself (an omitted `expiresInDays` is cut to the minting key's expiry).", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn mint(
    State(state): State<ApiState>,
    caller: Caller,
    Path(principal_id): Path<String>,
    body: Bytes,
) -> Result<(StatusCode, Json<MintedApiKeyEnvelope>), ApiError> {
    let authority = own_or_manage(&state, &caller, &principal_id).await?;
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
    if !body.is_object() {
        let mut e = ApiError::bad_request("validation_error", "The request body is invalid.");
        e.issues = Some(vec![
            json!({"path": "", "message": "the body must be a JSON object"}),
        ]);
        return Err(e);
    }
    // An integer in JSON Schema's sense: `30` or `30.0`.
    let integer = |v: &Value| {
        v.as_i64().or_else(|| {
            v.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
                .map(|f| f as i64)
        })
    };
    let days = match body.get("expiresInDays") {
        None | Some(Value::Null) => None,
        Some(v) => Some(integer(v).filter(|d| (1..=3650).contains(d)).ok_or_else(|| {
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
    let now = state.now();
    let not_after = match authority {
        KeyAuthority::Manage => None,
        KeyAuthority::Own { key_expires_ms } => {
            let outlives = days
                .zip(key_expires_ms)
                .is_some_and(|(days, expires)| now + days * 86_400_000 > expires);
            audit_own(&state, &caller, &principal_id, !outlives).await?;
            if let (true, Some(expires)) = (outlives, key_expires_ms) {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    format!(
                        "A key may not mint a key that outlives it: this key expires in {} day(s); ask for at most that, or mint with principals:manage.",
                        (expires - now) / 86_400_000
                    ),
                ));
            }
            key_expires_ms
        }
    };
    let minted = crate::mint_key(
        &state.store,
        &state.config,
        now,
        &principal_id,
        days,
        not_after,
    )
    .await
    .map_err(|e| ApiError::bad_request("validation_error", e.to_string()))?;
    Ok((
        StatusCode::CREATED,
        Json(MintedApiKeyEnvelope {
            api_key: views::minted(&minted),
        }),
    ))
}

/// `GET /v1/principals/{principalId}/api-keys`: metadata only, never secrets.
#[utoipa::path(
    get,
    path = "/v1/principals/{principalId}/api-keys",
    tag = "api-keys",
    operation_id = "listApiKeys",
    params(("principalId" = String, Path, description = "The keys' principal (own, or any with principals:manage).")),
    responses(
        (status = 200, description = "The principal's keys.", body = ApiKeyList),
        (status = 403, description = "`forbidden`: another principal's keys need principals:manage.", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn list_keys(
    State(state): State<ApiState>,
    caller: Caller,
    Path(principal_id): Path<String>,
) -> Result<Json<ApiKeyList>, ApiError> {
    if let KeyAuthority::Own { .. } = own_or_manage(&state, &caller, &principal_id).await? {
        audit_own(&state, &caller, &principal_id, true).await?;
    }
    let keys = state
        .store
        .api_keys_of(&principal_id)
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(ApiKeyList {
        api_keys: keys.iter().map(views::key_metadata).collect(),
    }))
}

/// `DELETE /v1/api-keys/{apiKeyId}` (principals:manage): effective for the next authentication.
#[utoipa::path(
    delete,
    path = "/v1/api-keys/{apiKeyId}",
    tag = "api-keys",
    operation_id = "revokeApiKey",
    params(("apiKeyId" = String, Path, description = "The key's id.")),
    responses(
        (status = 204, description = "Revoked."),
        (status = 403, description = "`forbidden`: principals:manage is missing.", body = Error),
        (status = 404, description = "`not_found`: no such key.", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn revoke(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
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
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/audit-logs` (audit:read): authorization decisions, newest first.
#[utoipa::path(
    get,
    path = "/v1/audit-logs",
    tag = "audit",
    operation_id = "listAuditLogs",
    params(AuditQuery),
    responses(
        (status = 200, description = "The decisions, newest first.", body = AuditLogList),
        (status = 400, description = "`invalid_filter`: an unknown parameter or an invalid value.", body = Error),
        (status = 403, description = "`forbidden`: audit:read is missing.", body = Error),
    ),
    security(("bearer" = [])),
)]
async fn audit_logs(
    State(state): State<ApiState>,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<AuditLogList>, ApiError> {
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
    Ok(Json(AuditLogList {
        audit_logs: rows.iter().map(views::audit_log).collect(),
    }))
}
