//! The admin proxy: `GET /v1/admin/proxy` (admin:read) describes the configured upstream (an
//! internal dashboard, say) and `GET /v1/admin/proxy/{*path}` forwards a GET to it with the
//! caller's principal in `X-Capstan-Principal`. Only GET is forwarded, redirects are not
//! followed, and the caller's credentials never reach the upstream. 501 `not_configured` when
//! no upstream is configured.
//!
//! The proxied path only ever lands under the upstream's base path: it is appended segment by
//! segment (never resolved as a URL reference), and a path that could mean anything else is
//! refused with 400 `invalid_path` — an absolute or scheme-relative URL, a backslash, an empty
//! segment, a dot segment, or one still percent-encoded after decoding (`%2e`, `%2f`, `%5c`).
//! Answers larger than [`MAX_ANSWER_BYTES`] become 502 `upstream_too_large`.

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

/// The largest upstream answer passed on (dashboards and reports, not downloads).
pub const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;

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
            // The environment's HTTP(S)_PROXY must not carry (or see) internal traffic.
            .no_proxy()
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
    let mut url = proxied_url(&proxy.upstream, &path)
        .map_err(|why| ApiError::bad_request("invalid_path", why))?;
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
    let broke_off = |e: reqwest::Error| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "upstream_unavailable",
            format!("the admin proxy upstream broke off: {e}"),
        )
    };
    let too_large = || {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "upstream_too_large",
            format!("the admin proxy upstream answered more than {MAX_ANSWER_BYTES} bytes"),
        )
    };
    if upstream
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
    {
        return Err(too_large());
    }
    let mut upstream = upstream;
    let mut bytes = Vec::new();
    while let Some(chunk) = upstream.chunk().await.map_err(broke_off)? {
        if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    let mut response = Response::builder().status(status.as_u16());
    if let Some(ct) = content_type {
        response = response.header(header::CONTENT_TYPE, ct);
    }
    response.body(Body::from(bytes)).map_err(ApiError::internal)
}

/// `path` (as the router decoded it) under `upstream`'s base path, or why it may not be.
fn proxied_url(upstream: &reqwest::Url, path: &str) -> Result<reqwest::Url, String> {
    if path.contains('\\') {
        return Err("the proxied path may not contain a backslash".into());
    }
    if path.chars().any(char::is_control) {
        return Err("the proxied path may not contain control characters".into());
    }
    let segments: Vec<&str> = path.split('/').collect();
    if segments.first().is_some_and(|s| s.contains(':')) {
        return Err("the proxied path must be a path, not a URL".into());
    }
    for segment in &segments {
        let lower = segment.to_ascii_lowercase();
        if segment.is_empty() && segments.len() > 1 {
            return Err("the proxied path may not contain empty segments (`//`)".into());
        }
        if matches!(*segment, "." | "..") {
            return Err("the proxied path may not contain `.` or `..` segments".into());
        }
        if ["%2e", "%2f", "%5c"].iter().any(|e| lower.contains(e)) {
            return Err("the proxied path may not carry an encoded dot, slash or backslash".into());
        }
    }
    let mut url = upstream.clone();
    url.path_segments_mut()
        .map_err(|()| "the upstream URL cannot have a path".to_owned())?
        .pop_if_empty()
        .extend(segments);
    // The backstop: whatever the path was, the URL is the upstream's, under its base path.
    if url.origin() != upstream.origin() || !url.path().starts_with(upstream.path()) {
        return Err("the proxied path leaves the upstream".into());
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream() -> reqwest::Url {
        reqwest::Url::parse("http://10.0.0.5:8000/dash/").unwrap()
    }

    #[test]
    fn a_path_lands_under_the_upstream_s_base_path() {
        for (path, expected) in [
            ("reports/daily", "http://10.0.0.5:8000/dash/reports/daily"),
            ("", "http://10.0.0.5:8000/dash/"),
            ("a b/c", "http://10.0.0.5:8000/dash/a%20b/c"),
            ("x?y#z", "http://10.0.0.5:8000/dash/x%3Fy%23z"),
        ] {
            assert_eq!(proxied_url(&upstream(), path).unwrap().as_str(), expected);
        }
    }

    #[test]
    fn every_way_out_of_the_upstream_is_refused() {
        for path in [
            "http://169.254.169.254/latest/meta-data",
            "//169.254.169.254/latest",
            "/etc/passwd",
            "\\\\evil\\x",
            "a\\..\\..\\x",
            "..",
            "a/../../x",
            "a/./b",
            "%2e%2e/x",
            "%2E%2E/%2e%2e/x",
            "a%2fb",
            "a%5c..",
            "a//b",
            "javascript:alert(1)",
            "a\nb",
        ] {
            assert!(
                proxied_url(&upstream(), path).is_err(),
                "{path:?} was let through"
            );
        }
    }
}
