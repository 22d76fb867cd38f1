//! Bearer authentication, permissions and the audit of every decision.
//!
//! A principal's permissions are the union of the operator config (`[principals.<id>]
//! permissions = [...]`) and the grants made with `capstan principals grant`. Chat principals
//! (`chat:<workspace>:<user>`) are recognised; operator-group permissions never apply to bearer
//! requests, so a bearer request gets only what is granted to the principal itself.

use crate::ApiState;
use crate::error::ApiError;
use crate::keys;
use axum::extract::{ConnectInfo, FromRequestParts, MatchedPath};
use axum::http::request::Parts;
use axum::http::{Method, header};
use capstan_store::auth::AuditRecord;
use std::collections::BTreeSet;
use std::net::SocketAddr;

/// The authenticated caller of a request, with what the audit log needs to know of it.
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal_id: String,
    pub permissions: BTreeSet<String>,
    /// When the API key that authenticated the request expires (none for other credentials).
    pub key_expires_ms: Option<i64>,
    /// The API key that authenticated the request, or minted the stream token that did.
    pub key_id: Option<String>,
    method: Method,
    route: String,
    ip: Option<String>,
    user_agent: Option<String>,
}

/// Whether `id` is a principal id Capstan accepts: a plain id, or `chat:<workspace>:<user>`.
pub fn valid_principal(id: &str) -> bool {
    let plain = |s: &str| {
        !s.is_empty()
            && s.len() <= 128
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
    };
    match id.strip_prefix("chat:") {
        Some(rest) => rest
            .split_once(':')
            .is_some_and(|(w, u)| plain(w) && plain(u)),
        None => plain(id),
    }
}

impl Caller {
    /// A caller authenticated by other means (a stream token) on this request.
    pub fn for_principal(
        parts: &Parts,
        principal_id: String,
        permissions: BTreeSet<String>,
    ) -> Self {
        let route = parts
            .extensions
            .get::<MatchedPath>()
            .map_or_else(|| parts.uri.path().to_owned(), |m| m.as_str().to_owned());
        let ip = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip().to_string());
        let user_agent = parts
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Self {
            principal_id,
            permissions,
            key_expires_ms: None,
            key_id: None,
            method: parts.method.clone(),
            route,
            ip,
            user_agent,
        }
    }

    pub fn has(&self, permission: &str) -> bool {
        self.permissions.contains(permission)
    }

    /// Workflows the caller may use (`workflows:<name>` permissions).
    pub fn workflows(&self) -> Vec<String> {
        self.permissions
            .iter()
            .filter_map(|p| p.strip_prefix("workflows:"))
            .map(str::to_owned)
            .collect()
    }

    /// Checks `permission` and records the decision (503 when it cannot be recorded).
    pub async fn require(
        &self,
        state: &ApiState,
        permission: &str,
        resource: &str,
        execution_id: Option<&str>,
    ) -> Result<(), ApiError> {
        let allowed = self.has(permission);
        self.audit(state, permission, resource, execution_id, allowed)
            .await?;
        if allowed {
            Ok(())
        } else {
            Err(ApiError::forbidden(permission))
        }
    }

    /// [`Caller::require`], with the decision's audit record committed while `work` runs
    /// instead of before it starts: the answer still waits for the record (as every audited
    /// request does), but a request whose work is a commit of its own (a trigger) waits for one
    /// group commit, which carries both, instead of two in a row
    /// ([`capstan_store::Store::insert_audit_during`]). `work` runs only when the permission is
    /// held; a record that cannot be written makes the answer 503 even when `work` succeeded (a
    /// trigger repeated with its `Idempotency-Key` then finds what it did).
    pub async fn require_during<T>(
        &self,
        state: &ApiState,
        permission: &str,
        resource: &str,
        work: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        if !self.has(permission) {
            self.audit(state, permission, resource, None, false).await?;
            return Err(ApiError::forbidden(permission));
        }
        let record = self.record(state.now(), permission, resource, None, true);
        let (audited, done) = state.store.insert_audit_during(&record, work).await;
        audited.map_err(|e| {
            tracing::error!(error = %e, "could not write an audit record; refusing the request");
            ApiError::unavailable(e)
        })?;
        done
    }

    /// The audit record of a decision on this request, its fields bounded.
    pub fn record(
        &self,
        now_ms: i64,
        action: &str,
        resource: &str,
        execution_id: Option<&str>,
        allowed: bool,
    ) -> AuditRecord {
        crate::audit::bound_record(AuditRecord {
            id: capstan_core::ids::new_id(),
            at_ms: now_ms,
            principal_id: self.principal_id.clone(),
            action: action.to_owned(),
            method: self.method.as_str().to_owned(),
            route: self.route.clone(),
            resource: resource.to_owned(),
            result: if allowed { "allowed" } else { "denied" }.to_owned(),
            execution_id: execution_id.map(str::to_owned),
            ip: self.ip.clone(),
            user_agent: self.user_agent.clone(),
        })
    }

    /// Records a decision. A denial, and any decision that changes something, is committed
    /// before the answer; when it cannot be, the request is refused with 503 rather than
    /// answered unaudited.
    pub async fn audit(
        &self,
        state: &ApiState,
        action: &str,
        resource: &str,
        execution_id: Option<&str>,
        allowed: bool,
    ) -> Result<(), ApiError> {
        let record = self.record(state.now(), action, resource, execution_id, allowed);
        // An allowed read changes nothing: its record is written behind the answer (a crash can
        // lose the last few milliseconds' read records; everything else is committed first).
        if allowed && matches!(self.method, Method::GET | Method::HEAD) {
            state.store.insert_audit_behind(record);
            return Ok(());
        }
        state.store.insert_audit(&record).await.map_err(|e| {
            tracing::error!(error = %e, "could not write an audit record; refusing the request");
            ApiError::unavailable(e)
        })
    }

    /// Records a failure nobody vouches for (authentication, a stream token, the rate limit)
    /// in bounded form: see [`crate::audit`].
    pub fn audit_failure(&self, state: &ApiState, action: &str, resource: &str) {
        let record = self.record(state.now(), action, resource, None, false);
        state.failures.record(&state.store, record);
    }
}

/// Permissions of a principal now: config plus grants.
pub async fn permissions_of(
    state: &ApiState,
    principal_id: &str,
) -> Result<BTreeSet<String>, ApiError> {
    let grants = state
        .store
        .grants_of(principal_id)
        .await
        .map_err(ApiError::unavailable)?;
    Ok(with_config(state, principal_id, grants))
}

/// A principal's permissions from the config file plus `grants` from the database.
fn with_config(state: &ApiState, principal_id: &str, grants: Vec<String>) -> BTreeSet<String> {
    let mut permissions = state
        .config
        .principals
        .get(principal_id)
        .cloned()
        .unwrap_or_default();
    permissions.extend(grants);
    permissions
}

impl FromRequestParts<ApiState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &ApiState,
    ) -> Result<Self, Self::Rejection> {
        let mut caller = Caller::for_principal(parts, "anonymous".to_owned(), BTreeSet::new());
        let resource = parts.uri.path().to_owned();
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| keys::well_formed(t));
        let Some(token) = token else {
            caller.audit_failure(state, "authenticate", &resource);
            return Err(ApiError::unauthorized());
        };
        let now = state.now();
        // The key and its principal's grants in one read.
        let candidates = state
            .store
            .api_keys_with_grants(keys::prefix(token), now)
            .await
            .map_err(ApiError::unavailable)?;
        let (key, grants) = match candidates.into_iter().find(|(k, _)| {
            state
                .config
                .peppers
                .verify(k.pepper_version, token, &k.hash)
        }) {
            Some((key, grants)) => (Some(key), grants),
            None => (None, Vec::new()),
        };
        let Some(key) = key.filter(|k| k.revoked_ms.is_none() && k.expires_ms > now) else {
            caller.audit_failure(state, "authenticate", &resource);
            return Err(ApiError::unauthorized());
        };
        if let Err(seconds) = state.limiter.check(&key.id, now) {
            caller.principal_id = key.principal_id;
            caller.audit_failure(state, "rate-limit", &resource);
            let mut e = ApiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!(
                    "this API key exceeded {} requests per second; retry in {seconds} s",
                    state.config.rate_limit.requests_per_second
                ),
            );
            e.retry_after = Some(seconds);
            return Err(e);
        }
        state
            .store
            .touch_api_key(&key.id, now)
            .await
            .map_err(ApiError::unavailable)?;
        caller.permissions = with_config(state, &key.principal_id, grants);
        // The request's span (host/server) declares the field.
        tracing::Span::current().record("principal", key.principal_id.as_str());
        caller.principal_id = key.principal_id;
        caller.key_expires_ms = Some(key.expires_ms);
        caller.key_id = Some(key.id);
        Ok(caller)
    }
}
