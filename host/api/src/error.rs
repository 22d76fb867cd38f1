//! One error type for the `/v1` API and its one mapping to a response:
//! `{"error": code, "message": text, "issues"?: [...], "reason"?: text}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use capstan_engine::EngineError;
use serde_json::{Value, json};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub issues: Option<Vec<Value>>,
    pub reason: Option<String>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            issues: None,
            reason: None,
            retry_after: None,
        }
    }
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "The bearer token is missing or invalid.",
        )
    }
    pub fn forbidden(permission: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("Missing required permission: {permission}"),
        )
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
    /// Storage could not answer (a lock held past the busy timeout, a lost connection): 503 with
    /// `Retry-After`, never a 500 — the request may be retried as is.
    pub fn unavailable(e: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %e, "storage unavailable");
        let mut err = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Storage is unavailable; retry later.",
        );
        err.retry_after = Some(1);
        err
    }
    pub fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "An internal error occurred.",
        )
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::NotFound(_) => ApiError::not_found(e.to_string()),
            EngineError::UnknownWorkflow(_) => ApiError::not_found(e.to_string()),
            EngineError::StateInvalid { reason, message } => {
                let mut err = ApiError::new(StatusCode::CONFLICT, "state_invalid", message);
                err.reason = Some(reason.to_owned());
                err
            }
            EngineError::IdempotencyConflict => {
                ApiError::new(StatusCode::CONFLICT, "idempotency_conflict", e.to_string())
            }
            EngineError::ReservationPending => {
                let mut err = ApiError::new(
                    StatusCode::CONFLICT,
                    "reservation_replay_pending",
                    e.to_string(),
                );
                err.retry_after = Some(1);
                err
            }
            EngineError::StaleApproval { .. } => {
                let mut err = ApiError::new(StatusCode::CONFLICT, "state_invalid", e.to_string());
                err.reason = Some("stale_plan_hash".to_owned());
                err
            }
            EngineError::Store(s) => {
                tracing::error!(error = %s, "storage error");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "Storage is unavailable; retry later.",
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": self.code, "message": self.message});
        if let Some(issues) = self.issues {
            body["issues"] = Value::Array(issues);
        }
        if let Some(reason) = self.reason {
            body["reason"] = Value::String(reason);
        }
        let mut response = (self.status, Json(body)).into_response();
        if let Some(seconds) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, v);
        }
        response
    }
}
