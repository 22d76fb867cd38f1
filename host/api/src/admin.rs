//! The admin proxy: `GET /v1/admin/proxy` (admin:read) describes the configured upstream (an
//! internal dashboard, say) and `GET /v1/admin/proxy/{*path}` forwards a GET to it with the
//! caller's principal in `X-Capstan-Principal`. Only GET is forwarded, redirects are not
//! followed, and the caller's credentials never reach the upstream. 501 `not_configured` when
//! no upstream is configured.

use crate::ApiState;
use crate::auth::Caller;
use crate::error::ApiError;
use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use axum::routing::get;
use serde_json::{Value, json};
use std::time::Duration;

/// The configured upstream.
#[derive(Debug, Clone)]
pub struct AdminProxy {
    pub upstream: reqwest::Url,
    client: reqwest::Client,
}

impl AdminProxy {
    pub fn new(upstream: &str) -> anyhow::Result<Self> {
        let mut upstream = reqwest::Url::parse(upstream)?;
        anyhow::ensure!(
            matches!(upstream.scheme(), "http" | "https"),
            "the admin proxy upstream must be an http(s) URL, not {upstream}"
        );
        if !upstream.path().ends_with('/') {
            upstream.set_path(&format!("{}/", upstream.path()));
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(30))
            .build()?;
        Ok(Self { upstream, client })
    }
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/admin/proxy", get(describe))
        .route("/v1/admin/proxy/{*path}", get(forward))
        .with_state(state)
}

fn configured(state: &ApiState) -> Result<&AdminProxy, ApiError> {
    state.admin_proxy.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_configured",
            "no admin proxy upstream is configured (admin_proxy_upstream)",
        )
    })
}

async fn describe(State(state): State<ApiState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    caller
        .require(&state, "admin:read", "/v1/admin/proxy", None)
        .await?;
    let proxy = configured(&state)?;
    Ok(Json(json!({
        "upstream": proxy.upstream.as_str(),
        "methods": ["GET"],
        "principalHeader": "X-Capstan-Principal",
    })))
}

async fn forward(
    State(state): State<ApiState>,
    caller: Caller,
    Path(path): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    caller
        .require(
            &state,
            "admin:read",
            &format!("/v1/admin/proxy/{path}"),
            None,
        )
        .await?;
    let proxy = configured(&state)?;
    if path.split('/').any(|segment| segment == "..") {
        return Err(ApiError::bad_request(
            "invalid_path",
            "the proxied path may not contain `..`",
        ));
    }
    let mut url = proxy
        .upstream
        .join(&path)
        .map_err(|e| ApiError::bad_request("invalid_path", e.to_string()))?;
    url.set_query(query.as_deref());
    let upstream = proxy
        .client
        .get(url)
        .header("X-Capstan-Principal", &caller.principal_id)
        .send()
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "upstream_unavailable",
                format!("the admin proxy upstream did not answer: {e}"),
            )
        })?;
    let status = upstream.status();
    let content_type = upstream.headers().get(header::CONTENT_TYPE).cloned();
    let bytes = upstream.bytes().await.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "upstream_unavailable",
            format!("the admin proxy upstream broke off: {e}"),
        )
    })?;
    let mut response = Response::builder().status(status.as_u16());
    if let Some(ct) = content_type {
        response = response.header(header::CONTENT_TYPE, ct);
    }
    response.body(Body::from(bytes)).map_err(ApiError::internal)
}
