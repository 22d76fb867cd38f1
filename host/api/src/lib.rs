//! # capstan-api
//!
//! The HTTP surface of a node. The orchestration API (`/v1`): workflow triggers, executions and
//! their control, execution events, API keys and the audit log, event streams, webhook
//! subscriptions, the event catalog and the admin proxy. Every `/v1` route authenticates a bearer
//! key, checks its permission from the document's table, and records the decision. Errors have
//! one shape (`error.rs`); responses have exactly the documented fields (`views.rs`). Beside it,
//! the partner booking API (`/api/public/...`) with its own keys and error shape.
//!
//! # Layout
//! - `keys` — key format, peppers, HMAC hashing.
//! - `auth` — the [`auth::Caller`] extractor, permissions, the audit record of each decision.
//! - `audit` — failed authentications and rate refusals, gathered per source and window; the
//!   node's upkeep task (those windows, the retention sweep).
//! - `ratelimit` — the per-key token bucket (429 `rate_limited`).
//! - `error` — the one `/v1` error type and its response.
//! - `input` — trigger bodies normalized as the workflow's input schema declares (defaults, trim, case).
//! - `v1` — the `/v1` routes, and `v1::openapi`, the document built from them.
//! - `views` — the documented JSON shapes.
//! - `streams` — server-sent event streams and single-use stream tokens.
//! - `webhooks` — subscriptions, the relay and dispatcher, and the vetting of callback addresses.
//! - `events_catalog` — the public event catalog and the admin event-version routes.
//! - `admin` — the admin proxy to an operator's upstream.
//! - `console` — the operator console at `/console/`, built into the binary.
//! - `partner` — the partner catalog and booking API, its OpenAPI document and its webhooks.

pub mod admin;
pub mod audit;
pub mod auth;
pub mod console;
pub mod error;
pub mod events_catalog;
pub mod input;
pub mod keys;
pub mod partner;
pub mod ratelimit;
pub mod streams;
pub mod v1;
pub mod views;
pub mod webhooks;

use capstan_core::Clock;
use capstan_engine::Engine;
use capstan_store::Store;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What the API is configured with.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    pub peppers: keys::Peppers,
    /// Permissions per principal from the operator config.
    pub principals: BTreeMap<String, BTreeSet<String>>,
    pub key_lifetime_days: i64,
    /// Per-key request rate.
    pub rate_limit: ratelimit::RateLimit,
}

/// Everything a handler may reach, behind one `Arc`: axum clones the state for every request
/// (each handler and extractor takes its own), and a clone should be one reference count, not
/// one per service inside.
#[derive(Debug, Clone)]
pub struct ApiState(Arc<ApiServices>);

impl ApiState {
    pub fn new(services: ApiServices) -> Self {
        Self(Arc::new(services))
    }
}

impl std::ops::Deref for ApiState {
    type Target = ApiServices;

    fn deref(&self) -> &ApiServices {
        &self.0
    }
}

/// The services of [`ApiState`].
#[derive(Debug)]
pub struct ApiServices {
    pub engine: Engine,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub config: Arc<ApiConfig>,
    /// The embedded simulated cloud's state, when it serves (for `GET /v1/admin/simulator`).
    pub simulator: Option<Arc<dyn capstan_core::Inspect>>,
    /// Token buckets per API key.
    pub limiter: Arc<ratelimit::RateLimiter>,
    /// Failed authentications and rate refusals, gathered per source ([`audit`]).
    pub failures: Arc<audit::Failures>,
    /// The admin proxy's upstream, when configured.
    pub admin_proxy: Option<admin::AdminProxy>,
    /// Bounded SSE connections.
    pub streams: Arc<streams::StreamCapacity>,
    /// Webhook keyring, URL policy and retry schedule.
    pub webhooks: Arc<webhooks::WebhookConfig>,
}

impl ApiServices {
    pub fn now(&self) -> i64 {
        self.clock.now_millis() as i64
    }
}

/// A newly minted key: its metadata and the plaintext, shown once.
#[derive(Debug, Clone)]
pub struct Minted {
    pub record: capstan_store::auth::ApiKeyRecord,
    pub plaintext: String,
}

/// Mints a key for `principal_id` valid for `days` (default lifetime when `None`), expiring no
/// later than `not_after_ms` when given (the default lifetime is cut to it).
pub async fn mint_key(
    store: &Store,
    config: &ApiConfig,
    now_ms: i64,
    principal_id: &str,
    days: Option<i64>,
    not_after_ms: Option<i64>,
) -> anyhow::Result<Minted> {
    anyhow::ensure!(
        auth::valid_principal(principal_id),
        "`{principal_id}` is not a valid principal id"
    );
    let days = days.unwrap_or(config.key_lifetime_days);
    anyhow::ensure!(
        (1..=3650).contains(&days),
        "expiresInDays must be between 1 and 3650"
    );
    let version = config
        .peppers
        .current()
        .ok_or_else(|| anyhow::anyhow!("no pepper configured"))?;
    let plaintext = keys::generate();
    let hash = config
        .peppers
        .hash(version, &plaintext)
        .ok_or_else(|| anyhow::anyhow!("no pepper for version {version}"))?;
    let record = capstan_store::auth::ApiKeyRecord {
        id: capstan_core::ids::new_id(),
        principal_id: principal_id.to_owned(),
        prefix: keys::prefix(&plaintext).to_owned(),
        hash,
        pepper_version: version,
        created_ms: now_ms,
        expires_ms: not_after_ms.map_or(now_ms + days * 86_400_000, |cap| {
            cap.min(now_ms + days * 86_400_000)
        }),
        last_used_ms: None,
        revoked_ms: None,
    };
    store.insert_api_key(&record).await?;
    Ok(Minted { record, plaintext })
}
