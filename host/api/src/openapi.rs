//! The OpenAPI 3.1 document of the orchestration API, served at `GET /v1/openapi.json` (public).
//!
//! It is generated from the code that serves the API: every `/v1` route is registered through
//! [`crate::v1::routes`], an [`OpenApiRouter`] whose `routes!` take each handler together with
//! its `#[utoipa::path]` (method, path, parameters, bodies, responses), and the bodies are the
//! types of [`crate::views`]. Two schemas whose JSON Schema is kept as data (the onboarding
//! outcome and the add-subdomain plan, which the e2e tests validate against too) are read from
//! `tests/schemas/`.
//!
//! # Routes served by other routers
//! A router merged beside [`crate::v1::router`] (in `host/server/src/serve.rs`) documents its
//! routes by contributing an [`OpenApi`] to [`other_routers`]. The event catalog
//! (`events_catalog.rs`), the admin proxy (`admin.rs`), the event streams (`streams.rs`) and the
//! webhook subscriptions (`webhooks/mod.rs`) build plain axum `Router`s, so their routes are
//! described here by doc-only `#[utoipa::path]` handlers ([`catalog`], [`admin`], [`streams`],
//! [`subscriptions`]) with the paths, parameters and shapes their handlers serve. OpenAPI has no
//! catch-all parameter, so `/v1/admin/proxy/{*path}` is documented as `/v1/admin/proxy/{path}`.
//! A router built with an [`OpenApiRouter`] and `routes!` would add the `OpenApi` half of
//! `split_for_parts()` to [`other_routers`] instead. `tests/tests/openapi.rs` fails when a served
//! route is missing from the document.

use crate::views::{self, Error};
use axum::Json;
use serde_json::{Value, json};
use std::sync::OnceLock;
use utoipa::OpenApi;
use utoipa::openapi::OpenApi as Document;
use utoipa_axum::router::OpenApiRouter;

/// The document's `info.version`.
pub const VERSION: &str = "0.1.0";

/// Where the document is served.
pub const PATH: &str = "/v1/openapi.json";

/// `POST /v1/workflows/onboard-domain`: the same handler as `POST /v1/workflows/{name}`
/// (`v1::trigger`), documented with the onboard-domain body of the contract.
#[utoipa::path(
    post,
    path = "/v1/workflows/onboard-domain",
    tag = "workflows",
    operation_id = "triggerOnboardDomain",
    description = "Registers a primary domain, sets up certificate and routing, whitelists referrers with the maps provider (permission `workflows:onboard-domain`). Served by `POST /v1/workflows/{name}`; track the run with `GET /v1/executions/{id}`.",
    params(
        ("Idempotency-Key" = String, Header, min_length = 1, max_length = 255, pattern = "\\S", description = "Makes the trigger safe to retry (1 to 255 characters, not only spaces)."),
        ("traceparent" = Option<String>, Header, description = "W3C trace context carried into the execution's events."),
    ),
    request_body(content = views::OnboardDomainRequest),
    responses(
        (status = 202, description = "A new execution.", body = views::WorkflowTriggerResponse),
        (status = 200, description = "Idempotent replay of the existing execution.", body = views::WorkflowTriggerResponse),
        (status = 400, description = "`missing_idempotency_key`, `invalid_json` or `validation_error` (with `issues`).", body = Error),
        (status = 403, description = "`forbidden`: `workflows:onboard-domain` is missing.", body = Error),
        (status = 404, description = "`not_found`: the onboard-domain workflow is not loaded on this node.", body = Error),
        (status = 409, description = "`idempotency_conflict` or `reservation_replay_pending` (retry after `Retry-After`).", body = Error, headers(("Retry-After" = Option<u64>, description = "Seconds to wait (reservation_replay_pending)."))),
    ),
    security(("bearer" = [])),
)]
#[allow(dead_code)]
async fn trigger_onboard_domain() {}

#[derive(OpenApi)]
#[openapi(
    paths(trigger_onboard_domain),
    info(
        title = "Capstan orchestration API",
        version = "0.1.0",
        description = "Workflow triggers, executions and their control, execution events, API keys, the audit log and the public event catalog. Every route except the event catalog and this document requires `Authorization: Bearer <API_KEY>`; errors have the Error shape.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "workflows", description = "Workflow triggers (idempotent with `Idempotency-Key`)."),
        (name = "executions", description = "Executions: read, list, control, events, add-subdomain plans."),
        (name = "api-keys", description = "Bearer API keys."),
        (name = "audit", description = "Authorization decisions."),
        (name = "events", description = "The public event catalog and event-version administration."),
        (name = "admin", description = "Operator routes."),
        (name = "meta", description = "This document."),
    ),
    components(schemas(
        Error,
        views::OnboardDomainRequest,
        views::OnboardDomainOptions,
        views::Execution,
        views::ExecutionSummary,
        views::ExecutionStage,
        views::OutboxEvent,
        views::DomainOnboardingOutcome,
        views::AddSubdomainPlan,
        views::PlanApproval,
        views::ApiKeyMetadata,
        views::MintedApiKey,
        views::AuditLog,
    )),
)]
struct Base;

/// `GET /v1/openapi.json`: this document (public, no token).
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "meta",
    operation_id = "getOpenApiDocument",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API.", body = Object, content_type = "application/json")),
)]
pub async fn serve() -> Json<&'static Value> {
    Json(document())
}

/// The served document (built once).
pub fn document() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(|| document_with(other_routers()))
}

/// The `OpenApi` of routers merged beside `v1::router` (see the module docs).
pub fn other_routers() -> Vec<Document> {
    vec![
        catalog::openapi(),
        admin::openapi(),
        streams::openapi(),
        subscriptions::openapi(),
    ]
}

/// The document of the `/v1` router plus `extra` (the `OpenApi` of other routers), as JSON.
pub fn document_with(extra: Vec<Document>) -> Value {
    let (_, mut api) = OpenApiRouter::with_openapi(Base::openapi())
        .merge(crate::v1::routes())
        .split_for_parts();
    for other in extra {
        api.merge(other);
    }
    finish(serde_json::to_value(&api).unwrap_or_else(|_| json!({})))
}

/// Adds what the macros do not: the bearer scheme, the responses every authenticated operation
/// may give (401, 429) and every operation may give (500, 503), the external schemas, and
/// `security: []` on public operations.
fn finish(mut doc: Value) -> Value {
    doc["openapi"] = json!("3.1.0");
    doc["info"]["version"] = json!(VERSION);
    let error = json!({"$ref": "#/components/schemas/Error"});
    let components = &mut doc["components"];
    components["securitySchemes"] = json!({
        "bearer": {"type": "http", "scheme": "bearer", "description": "An API key: `Authorization: Bearer cap_...`."},
        "streamToken": {"type": "apiKey", "in": "query", "name": "token", "description": "A single-use stream token (`POST /v1/streams/token`); only for `GET /v1/streams/events`."},
    });
    let retry_after = json!({"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer", "minimum": 0}}});
    components["responses"] = json!({
        "Unauthorized": {"description": "`unauthorized`: the bearer token is missing or invalid.", "content": {"application/json": {"schema": error}}},
        "RateLimited": {"description": "`rate_limited`: this API key exceeded its request rate.", "headers": retry_after, "content": {"application/json": {"schema": error}}},
        "Internal": {"description": "`internal`: an unexpected error.", "content": {"application/json": {"schema": error}}},
        "Unavailable": {"description": "`unavailable`: storage is unavailable; retry later.", "content": {"application/json": {"schema": error}}},
    });
    for (name, text) in [
        (
            "DomainOnboardingOutcome",
            include_str!("../../../tests/schemas/domain-onboarding-outcome.schema.json"),
        ),
        (
            "AddSubdomainPlan",
            include_str!("../../../tests/schemas/add-subdomain-plan.schema.json"),
        ),
    ] {
        let schema: Value = serde_json::from_str(text).unwrap_or_else(|_| json!({}));
        embed(&mut doc["components"]["schemas"], name, schema);
    }
    common_responses(&mut doc);
    doc
}

/// Every operation of `doc` states its security (`[]` when public) and refers to the shared
/// responses it can get without saying so itself: `401` `Unauthorized` and `429` `RateLimited`
/// when authenticated, `500` `Internal` and `503` `Unavailable` always. Both APIs' documents
/// define those four under `components.responses`, each in its own error shape.
pub(crate) fn common_responses(doc: &mut Value) {
    if let Some(paths) = doc["paths"].as_object_mut() {
        for item in paths.values_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for (method, op) in item.iter_mut() {
                if !["get", "put", "post", "delete", "patch", "head", "options"]
                    .contains(&method.as_str())
                {
                    continue;
                }
                let authenticated = op
                    .get("security")
                    .and_then(Value::as_array)
                    .is_some_and(|s| !s.is_empty());
                if !authenticated {
                    op["security"] = json!([]);
                }
                let responses = &mut op["responses"];
                let mut add = |status: &str, name: &str| {
                    if responses.get(status).is_none() {
                        responses[status] =
                            json!({"$ref": format!("#/components/responses/{name}")});
                    }
                };
                if authenticated {
                    add("401", "Unauthorized");
                    add("429", "RateLimited");
                }
                add("500", "Internal");
                add("503", "Unavailable");
            }
        }
    }
}

/// Puts a standalone JSON Schema in `components.schemas[name]`: its `$defs` become components
/// `<name>_<def>` and its `#/$defs/` references point there.
fn embed(schemas: &mut Value, name: &str, mut schema: Value) {
    if let Some(map) = schema.as_object_mut() {
        map.remove("$schema");
        map.remove("$id");
    }
    let defs = schema
        .as_object_mut()
        .and_then(|m| m.remove("$defs"))
        .unwrap_or_else(|| json!({}));
    fn rewrite(v: &mut Value, name: &str) {
        match v {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get_mut("$ref")
                    && let Some(def) = r.strip_prefix("#/$defs/")
                {
                    *r = format!("#/components/schemas/{name}_{def}");
                }
                map.values_mut().for_each(|v| rewrite(v, name));
            }
            Value::Array(items) => items.iter_mut().for_each(|v| rewrite(v, name)),
            _ => {}
        }
    }
    rewrite(&mut schema, name);
    if let Value::Object(defs) = defs {
        for (def, mut s) in defs {
            rewrite(&mut s, name);
            schemas[format!("{name}_{def}")] = s;
        }
    }
    schemas[name] = schema;
}

/// The event catalog's routes (`events_catalog.rs`, a plain `Router`), documented here by hand:
/// the paths, parameters and shapes are the ones its handlers serve.
pub mod catalog {
    use crate::views::Error;
    use serde::Serialize;
    use serde_json::Value;
    use utoipa::{OpenApi, ToSchema};

    /// An event version's lifecycle.
    #[derive(Debug, Serialize, ToSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct EventLifecycle {
        pub state: LifecycleState,
        #[schema(format = DateTime)]
        pub introduced_at: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        #[schema(format = DateTime, nullable = false)]
        pub deprecated_at: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        #[schema(format = DateTime, nullable = false)]
        pub archived_at: Option<String>,
        /// The `<EventType>.v<N>` replacing a deprecated version.
        #[serde(skip_serializing_if = "Option::is_none")]
        #[schema(nullable = false)]
        pub replacement: Option<String>,
    }

    #[derive(Debug, Serialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum LifecycleState {
        Active,
        Deprecated,
        Archived,
    }

    /// One versioned domain event of the catalog.
    #[derive(Debug, Serialize, ToSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct EventCatalogItem {
        pub event_type: String,
        pub event_version: String,
        /// `<EventType>.v<N>`, as subscription filters name it.
        pub name: String,
        pub description: String,
        pub lifecycle: EventLifecycle,
        /// JSON Schema (draft 2020-12) of the event's `payloadJson`.
        pub schema: Value,
    }

    /// EventCatalog.
    #[derive(Debug, Serialize, ToSchema)]
    pub struct EventCatalog {
        pub events: Vec<EventCatalogItem>,
    }

    #[derive(Debug, Serialize, ToSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct EventSubscriber {
        pub active: bool,
        pub health: String,
        pub owner_principal_id: String,
        pub subscription_id: String,
    }

    /// EventVersionUsage.
    #[derive(Debug, Serialize, ToSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct EventVersionUsage {
        pub event_type: String,
        pub event_version: String,
        pub lifecycle: EventLifecycle,
        #[schema(minimum = 0)]
        pub subscriber_count: u64,
        pub subscribers: Vec<EventSubscriber>,
    }

    /// Body of the archive route: `{confirm: true}` (extra properties allowed).
    #[derive(Debug, Serialize, ToSchema)]
    pub struct ArchiveEventVersion {
        /// Must be `true`.
        #[schema(value_type = bool)]
        pub confirm: bool,
    }

    /// `GET /v1/events/catalog`.
    #[utoipa::path(
        get,
        path = "/v1/events/catalog",
        tag = "events",
        operation_id = "getEventCatalog",
        responses(
            (status = 200, description = "Every catalogued event version with its effective lifecycle and payload schema.", body = EventCatalog),
        ),
    )]
    #[allow(dead_code)]
    async fn list() {}

    /// `GET /v1/admin/event-versions/{eventType}/{eventVersion}/usage` (admin:read).
    #[utoipa::path(
        get,
        path = "/v1/admin/event-versions/{eventType}/{eventVersion}/usage",
        tag = "events",
        operation_id = "getEventVersionUsage",
        params(
            ("eventType" = String, Path, description = "e.g. `StageFailed`"),
            ("eventVersion" = String, Path, description = "e.g. `1`"),
        ),
        responses(
            (status = 200, description = "Who subscribes to this event version.", body = EventVersionUsage),
            (status = 403, description = "`forbidden`: admin:read is missing.", body = Error),
            (status = 404, description = "`not_found`: no such event version in the catalog.", body = Error),
        ),
        security(("bearer" = [])),
    )]
    #[allow(dead_code)]
    async fn usage() {}

    /// `POST /v1/admin/event-versions/{eventType}/{eventVersion}/archive` (admin:write).
    #[utoipa::path(
        post,
        path = "/v1/admin/event-versions/{eventType}/{eventVersion}/archive",
        tag = "events",
        operation_id = "archiveEventVersion",
        params(
            ("eventType" = String, Path, description = "e.g. `StageFailed`"),
            ("eventVersion" = String, Path, description = "e.g. `1`"),
        ),
        request_body(content = ArchiveEventVersion, description = "Confirmation; extra properties are allowed."),
        responses(
            (status = 200, description = "Archived: the catalog item with its updated lifecycle.", body = EventCatalogItem),
            (status = 400, description = "`validation_error`: the body does not confirm.", body = Error),
            (status = 403, description = "`forbidden`: admin:write is missing.", body = Error),
            (status = 404, description = "`not_found`: no such event version in the catalog.", body = Error),
            (status = 409, description = "`state_invalid`: only a deprecated version can be archived (reason `not_deprecated` or `already_archived`).", body = Error),
        ),
        security(("bearer" = [])),
    )]
    #[allow(dead_code)]
    async fn archive() {}

    #[derive(OpenApi)]
    #[openapi(paths(list, usage, archive))]
    struct Catalog;

    pub fn openapi() -> utoipa::openapi::OpenApi {
        Catalog::openapi()
    }
}

/// The admin proxy's routes (`admin.rs`, a plain `Router` merged in serve.rs), documented here by
/// hand: the paths, parameters and answers are the ones its handlers serve.
pub mod admin {
    use crate::views::Error;
    use serde::Serialize;
    use utoipa::{OpenApi, ToSchema};

    /// `GET /v1/admin/proxy`: the configured upstream.
    #[derive(Debug, Serialize, ToSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct AdminProxyDescription {
        /// The upstream base URL.
        pub upstream: String,
        /// The forwarded methods (`GET`).
        pub methods: Vec<String>,
        /// The header carrying the caller's principal to the upstream.
        pub principal_header: String,
    }

    #[utoipa::path(
        get,
        path = "/v1/admin/proxy",
        tag = "admin",
        operation_id = "describeAdminProxy",
        responses(
            (status = 200, description = "The configured upstream.", body = AdminProxyDescription),
            (status = 403, description = "`forbidden`: admin:read is missing.", body = Error),
            (status = 501, description = "`not_configured`: no admin proxy upstream is configured.", body = Error),
        ),
        security(("bearer" = [])),
    )]
    #[allow(dead_code)]
    async fn describe() {}

    #[utoipa::path(
        get,
        path = "/v1/admin/proxy/{path}",
        tag = "admin",
        operation_id = "forwardAdminProxy",
        description = "Forwards a GET (with its query) to the upstream with the caller's principal in `X-Capstan-Principal`; the upstream's status, content type and body are passed through. Redirects are not followed.",
        params(("path" = String, Path, description = "The rest of the path below the upstream (may contain `/`; not `..`).")),
        responses(
            (status = 400, description = "`invalid_path`.", body = Error),
            (status = 403, description = "`forbidden`: admin:read is missing.", body = Error),
            (status = 501, description = "`not_configured`: no admin proxy upstream is configured.", body = Error),
            (status = 502, description = "`upstream_unavailable`: the upstream did not answer.", body = Error),
            (status = "default", description = "The upstream's response, passed through.", content_type = "*/*"),
        ),
        security(("bearer" = [])),
    )]
    #[allow(dead_code)]
    async fn forward() {}

    #[derive(OpenApi)]
    #[openapi(paths(describe, forward))]
    struct Admin;

    pub fn openapi() -> utoipa::openapi::OpenApi {
        Admin::openapi()
    }
}

/// The event streams (`streams.rs`, a plain `Router` merged in serve.rs), documented here by
/// hand from the contract (docs/events.md).
pub mod streams {
    use crate::views::Error;
    use serde::Serialize;
    use utoipa::{OpenApi, ToSchema};

    /// A single-use stream token.
    #[derive(Debug, Serialize, ToSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct StreamToken {
        /// Seconds until the token expires (300).
        #[schema(minimum = 0)]
        pub expires_in: u64,
        /// Pass as `token` to `GET /v1/streams/events`; valid once.
        pub token: String,
    }

    #[utoipa::path(
        get,
        path = "/v1/streams/events",
        tag = "events",
        operation_id = "streamEvents",
        description = "Server-sent events of the executions the caller may use (workflow filters never widen access). Authenticates with the bearer key or a single-use stream token in `token`. Any other query parameter → 400.",
        params(
            ("event" = Option<String>, Query, description = "Event filter `<EventType>.v<N>`; repeated or comma-separated."),
            ("workflow" = Option<String>, Query, description = "Workflow filter; repeated or comma-separated."),
            ("executionId" = Option<String>, Query),
            ("principalId" = Option<String>, Query),
            ("lastEventId" = Option<String>, Query, description = "Resume after this event."),
            ("token" = Option<String>, Query, description = "A stream token from `POST /v1/streams/token` instead of the bearer key."),
        ),
        responses(
            (status = 200, description = "The SSE feed; each event's data is an OutboxEvent.", body = String, content_type = "text/event-stream"),
            (status = 400, description = "`invalid_filter`: an unsupported parameter or an unknown event version.", body = Error),
            (status = 403, description = "`forbidden`: the caller has no workflow permission.", body = Error),
            (status = 503, description = "`stream_capacity_exhausted`: every stream connection is in use.", body = Error),
        ),
        security(("bearer" = []), ("streamToken" = [])),
    )]
    #[allow(dead_code)]
    async fn events() {}

    #[utoipa::path(
        post,
        path = "/v1/streams/token",
        tag = "events",
        operation_id = "mintStreamToken",
        description = "Mints a single-use stream token (300 s) for the caller; needs at least one workflow permission, resolved again at connect time.",
        responses(
            (status = 200, description = "The token.", body = StreamToken),
            (status = 403, description = "`forbidden`: the caller has no workflow permission.", body = Error),
        ),
        security(("bearer" = [])),
    )]
    #[allow(dead_code)]
    async fn token() {}

    #[derive(OpenApi)]
    #[openapi(paths(events, token))]
    struct Streams;

    pub fn openapi() -> utoipa::openapi::OpenApi {
        Streams::openapi()
    }
}

/// Webhook subscriptions (`webhooks/mod.rs`, merged in serve.rs). Their handlers build JSON with
/// `subscription_view` / `delivery_view`; these types document exactly those shapes.
pub mod subscriptions {
    use crate::views::Error;
    use serde::Serialize;
    use utoipa::{OpenApi, ToSchema};

    /// A webhook subscription. Secret material is never returned.
    #[derive(Debug, Serialize, ToSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct Subscription {
        pub id: String,
        pub owner_principal_id: String,
        pub url: String,
        /// The keyring version that seals the secret (`local:<N>`).
        pub kms_key_id: String,
        pub created_at: String,
        /// `healthy`, `degraded`, `failing` or `disabled`.
        pub health: String,
        pub active: bool,
        pub events: Vec<String>,
    }

    /// One delivery attempt.
    #[derive(Debug, Serialize, ToSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct SubscriptionDelivery {
        pub id: String,
        pub subscription_id: String,
        pub event_id: String,
        pub attempt: i64,
        /// `pending`, `succeeded`, `failed` or `exhausted`.
        pub status: String,
        pub dispatched_at: Option<String>,
        pub last_error: Option<String>,
        pub next_attempt_at: Option<String>,
        pub response_code: Option<i64>,
    }

    #[derive(Debug, Serialize, ToSchema)]
    pub struct SubscriptionEnvelope {
        pub subscription: Subscription,
    }
    #[derive(Debug, Serialize, ToSchema)]
    pub struct SubscriptionList {
        pub subscriptions: Vec<Subscription>,
    }
    #[derive(Debug, Serialize, ToSchema)]
    pub struct DeliveryEnvelope {
        pub delivery: SubscriptionDelivery,
    }
    #[derive(Debug, Serialize, ToSchema)]
    pub struct DeliveryList {
        pub deliveries: Vec<SubscriptionDelivery>,
    }

    /// CreateSubscription.
    #[derive(Debug, Serialize, ToSchema)]
    pub struct CreateSubscription {
        /// `<EventType>.v<N>` names of catalogued, non-archived versions.
        #[schema(min_items = 1)]
        pub events: Vec<String>,
        /// `whsec_<base64>` for the Standard Webhooks libraries.
        #[schema(min_length = 1)]
        pub secret: String,
        /// A public HTTPS callback.
        #[schema(format = "uri")]
        pub url: String,
        #[schema(default = true)]
        pub active: Option<bool>,
    }

    /// UpdateSubscription: at least one of the two.
    #[derive(Debug, Serialize, ToSchema)]
    pub struct UpdateSubscription {
        pub active: Option<bool>,
        #[schema(min_items = 1)]
        pub events: Option<Vec<String>>,
    }

    #[derive(Debug, Serialize, ToSchema)]
    pub struct RotateSecret {
        #[schema(min_length = 1)]
        pub secret: String,
    }

    #[utoipa::path(get, path = "/v1/subscriptions", tag = "subscriptions", operation_id = "listSubscriptions",
        params(("limit" = Option<i64>, Query, description = "1 to 100, default 50.")),
        responses((status = 200, body = SubscriptionList), (status = 400, body = Error), (status = 403, body = Error)),
        security(("bearer" = [])))]
    #[allow(dead_code)]
    async fn list() {}

    #[utoipa::path(post, path = "/v1/subscriptions", tag = "subscriptions", operation_id = "createSubscription",
        request_body = CreateSubscription,
        responses((status = 201, body = SubscriptionEnvelope), (status = 400, body = Error), (status = 403, body = Error)),
        security(("bearer" = [])))]
    #[allow(dead_code)]
    async fn create() {}

    #[utoipa::path(get, path = "/v1/subscriptions/{id}", tag = "subscriptions", operation_id = "getSubscription",
        params(("id" = String, Path)),
        responses((status = 200, body = SubscriptionEnvelope), (status = 403, body = Error), (status = 404, body = Error)),
        security(("bearer" = [])))]
    #[allow(dead_code)]
    async fn read() {}

    #[utoipa::path(patch, path = "/v1/subscriptions/{id}", tag = "subscriptions", operation_id = "updateSubscription",
        params(("id" = String, Path)), request_body = UpdateSubscription,
        responses((status = 200, body = SubscriptionEnvelope), (status = 400, body = Error), (status = 403, body = Error), (status = 404, body = Error), (status = 409, description = "`state_invalid`, reason `subscription_deleted`: a deleted subscription takes no more changes.", body = Error)),
        security(("bearer" = [])))]
    #[allow(dead_code)]
    async fn update() {}

    #[utoipa::path(delete, path = "/v1/subscriptions/{id}", tag = "subscriptions", operation_id = "deleteSubscription",
        params(("id" = String, Path)),
        responses((status = 204, description = "Disabled; its history is kept and stays readable (GET answers it with `active: false`). Deleting again changes nothing."), (status = 403, body = Error), (status = 404, body = Error)),
        security(("bearer" = [])))]
    #[allow(dead_code)]
    async fn remove() {}

    #[utoipa::path(get, path = "/v1/subscriptions/{id}/deliveries", tag = "subscriptions", operation_id = "listDeliveries",
        params(("id" = String, Path), ("limit" = Option<i64>, Query, description = "1 to 100, default 50.")),
        responses((status = 200, body = DeliveryList), (status = 400, body = Error), (status = 403, body = Error), (status = 404, body = Error)),
        security(("bearer" = [])))]
    #[allow(dead_code)]
    async fn deliveries() {}

    #[utoipa::path(post, path = "/v1/subscriptions/{id}/redeliver/{eventId}", tag = "subscriptions", operation_id = "redeliver",
        params(("id" = String, Path), ("eventId" = String, Path)),
        responses((status = 202, body = DeliveryEnvelope), (status = 403, body = Error), (status = 404, body = Error), (status = 409, description = "`state_invalid`, reason `subscription_deleted`: a deleted subscription takes no more changes.", body = Error)),
        security(("bearer" = [])))]
    #[allow(dead_code)]
    async fn redeliver() {}

    #[utoipa::path(post, path = "/v1/subscriptions/{id}/secret", tag = "subscriptions", operation_id = "rotateSubscriptionSecret",
        params(("id" = String, Path)), request_body = RotateSecret,
        responses((status = 200, body = SubscriptionEnvelope), (status = 400, body = Error), (status = 403, body = Error), (status = 404, body = Error), (status = 409, description = "`state_invalid`, reason `subscription_deleted`: a deleted subscription takes no more changes.", body = Error)),
        security(("bearer" = [])))]
    #[allow(dead_code)]
    async fn secret() {}

    #[derive(OpenApi)]
    #[openapi(paths(list, create, read, update, remove, deliveries, redeliver, secret))]
    struct Subscriptions;

    pub fn openapi() -> utoipa::openapi::OpenApi {
        Subscriptions::openapi()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_document_is_openapi_3_1_with_every_route() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(doc["info"]["version"], VERSION);
        assert_eq!(doc["info"]["title"], "Capstan orchestration API");
        let paths = doc["paths"].as_object().unwrap();
        for (path, method) in [
            ("/v1/openapi.json", "get"),
            ("/v1/workflows/{name}", "post"),
            ("/v1/executions", "get"),
            ("/v1/executions/{id}/plan/approve", "post"),
            ("/v1/principals/{principalId}/api-keys", "get"),
            ("/v1/principals/{principalId}/api-keys", "post"),
            ("/v1/events/catalog", "get"),
        ] {
            assert!(paths[path].get(method).is_some(), "{method} {path}");
        }
        assert_eq!(
            doc["paths"]["/v1/openapi.json"]["get"]["security"],
            json!([])
        );
        assert_eq!(
            doc["paths"]["/v1/executions"]["get"]["responses"]["401"]["$ref"],
            "#/components/responses/Unauthorized"
        );
        // The embedded schemas resolve inside the document.
        let text = doc.to_string();
        assert!(!text.contains("#/$defs/"));
        for name in [
            "DomainOnboardingOutcome",
            "AddSubdomainPlan",
            "Execution",
            "Error",
        ] {
            assert!(doc["components"]["schemas"].get(name).is_some(), "{name}");
        }
    }

    #[test]
    fn the_document_describes_what_the_views_serialize() {
        let doc = document();
        let summary = &doc["components"]["schemas"]["ExecutionSummary"];
        assert_eq!(summary["additionalProperties"], false);
        let mut required: Vec<&str> = summary["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        required.sort_unstable();
        assert_eq!(
            required,
            [
                "createdAt",
                "currentStage",
                "executionId",
                "finishedAt",
                "principalId",
                "status",
                "workflow"
            ]
        );
    }
}
