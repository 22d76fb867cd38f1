//! `capstan serve`: open the store, load the workflows, bind the listeners, answer until told to
//! stop, then drain in-flight requests. The router is built apart from serving (`router`) so
//! tests can drive it on a listener of their own (port 0).

use crate::config::{HOST_SERVED, Settings};
use crate::registry::{FailedFile, Registry, WorkflowSummary};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use capstan_api::keys::Peppers;
use capstan_api::partner::PartnerState;
use capstan_api::{ApiConfig, ApiServices, ApiState};
use capstan_booking::fulfilment::StepRunner;
use capstan_booking::{BookingConfig, Bookings, Environment};
use capstan_core::{Clock, SystemClock};
use capstan_engine::{Engine, EngineConfig};
use capstan_providers::{ProviderSet, SimulatedCloud};
use capstan_store::Store;
use serde::Serialize;
use serde_json::json;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Everything a request handler may reach.
#[derive(Debug, Clone)]
pub struct App {
    pub store: Store,
    pub registry: Arc<Registry>,
    /// The provider serving each capability (for `/readyz`).
    pub providers: Arc<ProviderSet>,
    pub api: ApiState,
    /// The partner API of the main listener (production) and of the sandbox listener.
    pub production: PartnerState,
    pub sandbox: PartnerState,
    /// Fulfilment step components and the pipelines that use them.
    pub steps: Arc<dyn StepRunner>,
    pub booking: crate::config::BookingSettings,
    /// HTTPS for both listeners (`--tls-cert`/`--tls-key`), or plain HTTP for development.
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    /// Every listener's connection cap and deadlines.
    pub connections: crate::listen::ConnectionLimits,
    /// What the upkeep task deletes, and when.
    pub retention: capstan_store::retention::Retention,
}

/// The at-rest keyring for webhook secrets: `CAPSTAN_SECRET_KEYS` (`1:<base64 of 32 bytes>,...`)
/// or the file `CAPSTAN_SECRET_KEYS_FILE` names. Required.
pub fn secret_keys() -> anyhow::Result<capstan_api::webhooks::secrets::Keyring> {
    let text = crate::config::secret_var("CAPSTAN_SECRET_KEYS").map_err(anyhow::Error::msg)?.ok_or_else(|| {
        anyhow::anyhow!("CAPSTAN_SECRET_KEYS is not set (nor CAPSTAN_SECRET_KEYS_FILE): webhook secrets cannot be encrypted at rest without a key (e.g. CAPSTAN_SECRET_KEYS=\"1:$(head -c32 /dev/urandom | base64)\")")
    })?;
    Ok(capstan_api::webhooks::secrets::Keyring::parse(&text)?)
}

/// The peppers for API keys: `CAPSTAN_PEPPERS` (`1:<secret>,2:<secret>`) or the file
/// `CAPSTAN_PEPPERS_FILE` names. Required.
pub fn peppers() -> anyhow::Result<Peppers> {
    let text = crate::config::secret_var("CAPSTAN_PEPPERS").map_err(anyhow::Error::msg)?.ok_or_else(|| {
        anyhow::anyhow!("CAPSTAN_PEPPERS is not set (nor CAPSTAN_PEPPERS_FILE): API keys cannot be verified without a pepper (e.g. CAPSTAN_PEPPERS=\"1:<at least 16 random characters>\")")
    })?;
    Ok(Peppers::parse(&text)?)
}

impl App {
    /// Opens the store (migrating it), loads the workflows directory, and builds the engine on the
    /// simulated cloud.
    pub async fn start(settings: &Settings, peppers: Peppers) -> anyhow::Result<Self> {
        let keyring = secret_keys()?;
        let store = Store::open(&settings.database).await?;
        let registry = Arc::new(Registry::load(settings).await?);
        let pool = settings.runtime.instance_pool as usize;
        if pool > 0 && pool < settings.workers {
            tracing::warn!(
                instance_pool = pool,
                workers = settings.workers,
                "runtime.instance_pool is smaller than workers: activations beyond the pool wait for a slot"
            );
        }
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let cloud = SimulatedCloud::new(&store, clock.clone(), settings.simulator.clone()).await?;
        let providers = Arc::new(
            providers(
                settings,
                cloud.clone(),
                &capstan_adapters::Node {
                    store: store.clone(),
                    clock: clock.clone(),
                    keyring: keyring.clone(),
                },
            )
            .await?,
        );
        let engine = Engine::new(
            Arc::new(store.clone()),
            registry.runtime.clone(),
            providers.clone(),
            clock.clone(),
            EngineConfig {
                workers: settings.workers,
                lease_ms: settings.lease_ms,
                provider_retry_by_capability: settings.provider_retry.clone(),
                ..EngineConfig::default()
            },
        );
        for workflow in registry.workflows.values() {
            engine.register(workflow.clone());
        }
        let bookings = Bookings::open(
            store.clone(),
            clock.clone(),
            BookingConfig {
                capture_window_ms: settings.booking.capture_window_ms,
                voucher_base_url: settings.booking.voucher_base_url.clone(),
            },
        )
        .await?;
        load_catalog(&bookings, settings).await?;
        let steps: Arc<dyn StepRunner> = Arc::new(
            crate::steps::WasmSteps::load(&registry.runtime, settings, store.clone()).await,
        );
        let partner_peppers = peppers.clone();
        let config = ApiConfig {
            peppers,
            principals: settings
                .principals
                .iter()
                .map(|(id, p)| (id.clone(), p.permissions.iter().cloned().collect()))
                .collect(),
            key_lifetime_days: settings.api_key_lifetime_days,
            rate_limit: settings.rate_limit,
        };
        let api = ApiState::new(ApiServices {
            engine,
            store: store.clone(),
            clock,
            config: Arc::new(config),
            simulator: Some(Arc::new(cloud)),
            failures: Arc::default(),
            limiter: Arc::new(capstan_api::ratelimit::RateLimiter::new(
                settings.rate_limit,
            )),
            admin_proxy: settings
                .admin_proxy_upstream
                .as_deref()
                .map(capstan_api::admin::AdminProxy::new)
                .transpose()?,
            streams: Arc::new(capstan_api::streams::StreamCapacity::new(
                settings.stream_connections,
                settings.stream_connections_per_principal,
            )),
            webhooks: Arc::new(capstan_api::webhooks::WebhookConfig {
                keyring,
                policy: capstan_api::webhooks::safety::UrlPolicy {
                    allow_loopback: settings.webhooks.allow_loopback,
                    allow_http: settings.webhooks.allow_http,
                },
                extra_root_pem: settings
                    .webhooks
                    .extra_root_ca
                    .as_ref()
                    .map(std::fs::read)
                    .transpose()?,
                schedule_ms: settings.webhooks.retry_schedule_ms.clone(),
                max_subscriptions_per_owner: settings.webhooks.max_subscriptions_per_owner,
                timeout_ms: settings.webhooks.timeout_ms,
            }),
        });
        let partner_limiter = Arc::new(capstan_api::ratelimit::RateLimiter::new(
            settings.booking.rate_limit,
        ));
        let scheme = if settings.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        let partner = |environment| PartnerState {
            bookings: bookings.clone(),
            public_base_url: match environment {
                Environment::Production => settings.booking.public_base_url.clone(),
                Environment::Sandbox => settings.booking.sandbox_public_base_url.clone(),
            }
            .map(|url| Arc::from(url.trim_end_matches('/'))),
            scheme,
            environment,
            peppers: partner_peppers.clone(),
            webhooks: api.webhooks.clone(),
            limiter: partner_limiter.clone(),
            failures: api.failures.clone(),
        };
        Ok(Self {
            store,
            registry,
            providers,
            production: partner(Environment::Production),
            sandbox: partner(Environment::Sandbox),
            api,
            steps,
            booking: settings.booking.clone(),
            tls: match (&settings.tls_cert, &settings.tls_key) {
                (Some(cert), Some(key)) => Some(crate::tls::server_config(cert, key)?),
                (None, None) => None,
                _ => anyhow::bail!("--tls-cert and --tls-key go together"),
            },
            connections: settings.connections,
            retention: settings.retention,
        })
    }
}

/// The node's providers: the simulated cloud for every capability, replaced by the real adapter
/// of each `[providers.<capability>]` table. A table that cannot serve stops start-up with the key
/// at fault.
pub async fn providers(
    settings: &Settings,
    cloud: SimulatedCloud,
    node: &capstan_adapters::Node,
) -> anyhow::Result<ProviderSet> {
    let mut set = ProviderSet::all(Arc::new(cloud));
    for (capability, table) in &settings.providers {
        if !capstan_providers::INFRASTRUCTURE.contains(capability) {
            anyhow::bail!(
                "providers.{}: only dns, registrar, certificates, cdn, maps, functions and ticketing have providers",
                capability.as_str()
            );
        }
        if let Some(provider) = capstan_adapters::build(*capability, table, node).await? {
            tracing::info!(
                capability = capability.as_str(),
                kind = provider.kind(),
                "provider configured"
            );
            set = set.with(*capability, provider);
        }
    }
    Ok(set)
}

/// The documented error body: `{"error": code, "message": text}`.
pub fn error_response(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"error": code, "message": message.into()})),
    )
        .into_response()
}

/// Loads the stored catalog, or imports `booking.catalog_file` into an empty database.
async fn load_catalog(bookings: &Bookings, settings: &Settings) -> anyhow::Result<()> {
    if bookings.load_catalog().await? {
        return Ok(());
    }
    match &settings.booking.catalog_file {
        Some(path) if path.exists() => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read the catalog {}: {e}", path.display()))?;
            let imported = bookings
                .import_catalog(&text)
                .await
                .map_err(|e| anyhow::anyhow!("catalog {}: {e}", path.display()))?;
            tracing::info!(file = %path.display(), products = imported.products, variants = imported.variants, "catalog imported into an empty database");
        }
        Some(path) => {
            tracing::warn!(file = %path.display(), "no catalog yet and the catalog file does not exist: the partner catalog is empty until `capstan catalog import`")
        }
        None => tracing::warn!(
            "no catalog yet: the partner catalog is empty until `capstan catalog import`"
        ),
    }
    Ok(())
}

/// The sandbox listener: health and the partner API's sandbox environment.
pub fn sandbox_router(app: App) -> Router {
    let router = Router::new()
        .route("/healthz", get(healthz))
        .merge(
            Router::new()
                .route("/readyz", get(readyz))
                .with_state(app.clone()),
        )
        .merge(capstan_api::partner::router(app.sandbox))
        .fallback(partner_not_found)
        .method_not_allowed_fallback(partner_method_not_allowed)
        .layer(axum::middleware::from_fn(
            capstan_api::partner::refuse_preflight,
        ));
    every_request(router)
}

/// What every listener's requests pass through: the body limit answered in each API's shape,
/// gzip for large answers (event streams and small answers are left as they are, tower-http's
/// default predicate), the access log, and a request id (the client's, or one made here)
/// returned on the answer.
fn every_request(router: Router) -> Router {
    router
        .layer(axum::middleware::from_fn(layer_refusals_in_each_apis_shape))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            REQUEST_TIMEOUT,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(tower_http::compression::CompressionLayer::new())
        .layer(axum::middleware::from_fn(access_log))
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(request_span)
                // The access log (inside the span) writes the line; the span only learns the
                // status, for traces (a log line has it from the access log).
                .on_request(())
                .on_response(|response: &Response, _: Duration, span: &tracing::Span| {
                    if !capstan_core::trace::is_exporting() {
                        return;
                    }
                    let status = response.status();
                    span.record("http.response.status_code", status.as_u16());
                    if status.is_server_error() {
                        span.record("otel.status_code", "ERROR");
                    }
                })
                .on_body_chunk(())
                .on_eos(())
                .on_failure(()),
        )
        .layer(tower_http::request_id::PropagateRequestIdLayer::x_request_id())
        .layer(tower_http::request_id::SetRequestIdLayer::x_request_id(
            tower_http::request_id::MakeRequestUuid,
        ))
}

/// 405 in the partner API's error shape.
async fn partner_method_not_allowed() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        Json(json!({"status": 405, "error": {"code": "E_METHOD_NOT_ALLOWED", "message": "this route does not accept that method"}})),
    )
        .into_response()
}

async fn partner_not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"status": 404, "error": {"code": "E_NOT_FOUND", "message": "no such route"}})),
    )
        .into_response()
}

pub fn router(app: App) -> Router {
    recorder();
    let partner = capstan_api::partner::router(app.production.clone());
    let api = capstan_api::v1::router(app.api.clone());
    let catalog = capstan_api::events_catalog::router(app.api.clone());
    let admin = capstan_api::admin::router(app.api.clone());
    let streams = capstan_api::streams::router(app.api.clone());
    let subscriptions = capstan_api::webhooks::router(app.api.clone());
    // Stateless routes stay out of `with_state`: axum clones a router's state for every
    // request to it, and `/healthz` is the HTTP stack's own ceiling (`capstan-bench`).
    let router = Router::new()
        .route("/healthz", get(healthz))
        .merge(
            Router::new()
                .route("/readyz", get(readyz))
                .route("/metrics", get(metrics))
                .with_state(app),
        )
        .merge(api)
        .merge(catalog)
        .merge(admin)
        .merge(streams)
        .merge(subscriptions)
        .merge(capstan_api::console::router())
        .merge(partner)
        .fallback(|uri: axum::http::Uri| async move {
            if uri.path().starts_with("/api/") {
                partner_not_found().await
            } else {
                error_response(StatusCode::NOT_FOUND, "not_found", "no such route")
            }
        })
        .method_not_allowed_fallback(|uri: axum::http::Uri| async move {
            // Each API answers in its own error shape.
            if uri.path().starts_with("/api/") {
                partner_method_not_allowed().await
            } else {
                error_response(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method_not_allowed",
                    "this route does not accept that method",
                )
            }
        })
        .layer(axum::middleware::from_fn(
            capstan_api::partner::refuse_preflight,
        ))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked));
    every_request(router)
}

/// How long a request may take to produce its answer's head: above the longest wait a client
/// may ask for (`GET /v1/executions/{id}?wait=25s`), below the usual 60 s of load balancers.
/// Streams (SSE) answer their head at once and are not cut.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The request's span: route template, method, request id, status, and the principal once
/// authenticated (the extractors record it). It continues the caller's `traceparent`.
fn request_span(request: &axum::http::Request<axum::body::Body>) -> tracing::Span {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", |p| p.as_str());
    let method = request.method().as_str();
    let span = tracing::info_span!(
        "request",
        // For the OpenTelemetry layer alone: recorded below only when spans are exported, so
        // a process that exports none neither builds the name nor prints these in its logs
        // (the log layer formats every field a span is given, once per request).
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        http.request.method = method,
        http.route = route,
        http.response.status_code = tracing::field::Empty,
        request_id = request
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default(),
        principal = tracing::field::Empty,
    );
    if !capstan_core::trace::is_exporting() {
        return span;
    }
    span.record("otel.name", format!("{method} {route}"));
    span.record("otel.kind", "server");
    capstan_core::trace::set_parent(
        &span,
        request
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok()),
    );
    span
}

/// The largest request body any route reads: a trigger's input, a catalog import, a webhook
/// subscription. Above it, 413 in the API's own error shape.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// One line per request under the target `capstan::access`: method, route template, status,
/// latency and the request id (`X-Request-Id`, taken from the client or made here, and returned
/// on the answer). Answers of 5xx at `warn`, so they show under the default filter; every
/// request at `info` with `RUST_LOG=info` (or `capstan::access=info`).
async fn access_log(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let started = std::time::Instant::now();
    let method = static_method(request.method());
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let request_id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let elapsed = started.elapsed().as_secs_f64();
    let latency_ms = elapsed * 1e3;
    metrics::counter!("capstan_http_requests_total", "method" => method, "route" => route.clone(), "status" => status.to_string()).increment(1);
    metrics::histogram!("capstan_http_request_duration_seconds", "method" => method, "route" => route.clone()).record(elapsed);
    if status >= 500 {
        tracing::warn!(target: "capstan::access", %method, %route, status, latency_ms, %request_id, "request");
    } else {
        tracing::info!(target: "capstan::access", %method, %route, status, latency_ms, %request_id, "request");
    }
    response
}

/// The method as a label without an allocation; a method no route has is `other`.
fn static_method(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The layers' own refusals come without a body in the API's shape: a body over
/// [`MAX_BODY_BYTES`] (axum's plain-text 413) and a request over [`REQUEST_TIMEOUT`] (an empty
/// 503). Each API answers them in its own error shape instead.
async fn layer_refusals_in_each_apis_shape(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let partner = request.uri().path().starts_with("/api/");
    let response = next.run(request).await;
    let status = response.status();
    if !matches!(
        status,
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::SERVICE_UNAVAILABLE
    ) || response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"application/json"))
    {
        return response;
    }
    let (code, partner_code, message) = if status == StatusCode::PAYLOAD_TOO_LARGE {
        (
            "payload_too_large",
            "E_PAYLOAD_TOO_LARGE",
            format!("the request body is larger than {MAX_BODY_BYTES} bytes"),
        )
    } else {
        (
            "unavailable",
            "E_SERVICE_UNAVAILABLE",
            format!(
                "the request took longer than {} s; retry",
                REQUEST_TIMEOUT.as_secs()
            ),
        )
    };
    if partner {
        (
            status,
            Json(json!({"status": status.as_u16(), "error": {"code": partner_code, "message": message}})),
        )
            .into_response()
    } else {
        error_response(status, code, &message)
    }
}

/// A handler that panicked answers 500 `internal` (the connection stays usable) and is logged.
/// The partner router answers its own panics in its own error shape.
fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message");
    capstan_api::error::ApiError::internal(format_args!("a handler panicked: {what}"))
        .into_response()
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// Counters in the Prometheus text format (no authentication, like `/healthz`: they name no
/// tenant data). Kept small on purpose; tracing carries the rest.
/// The process's Prometheus recorder, installed by the first router built (one per process: a
/// node serves one set of metrics); `None` where another recorder was installed first.
static RECORDER: std::sync::OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
    std::sync::OnceLock::new();

fn recorder() -> Option<&'static metrics_exporter_prometheus::PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
                .set_buckets(&[
                    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                    5.0, 10.0, 30.0,
                ])
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        metrics_exporter_prometheus::Matcher::Full(
                            capstan_store::COMMIT_BATCH_SIZE.to_owned(),
                        ),
                        &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
                    )
                })
                .and_then(|b| b.install_recorder())
                .map_err(|e| tracing::warn!(error = %e, "no Prometheus recorder"))
                .ok()?;
            metrics::describe_counter!(
                "capstan_http_requests_total",
                "HTTP requests answered, by method, route template and status."
            );
            metrics::describe_histogram!(
                "capstan_http_request_duration_seconds",
                metrics::Unit::Seconds,
                "Time from a request's arrival to its answer's head, by method and route template."
            );
            metrics::describe_gauge!(
                "capstan_runs",
                "Runs not done, by state: queued (due, not leased), leased (a node runs it), scheduled (due later: a timer, a retry), waiting (for an approval, a signal, a command)."
            );
            metrics::describe_gauge!(
                capstan_api::streams::SSE_CONNECTIONS,
                "Open server-sent event streams on this node."
            );
            capstan_engine::describe_metrics();
            capstan_store::describe_metrics();
            capstan_api::webhooks::delivery::describe_metrics();
            capstan_booking::Bookings::describe_metrics();
            PROCESS.describe();
            // Shown from the start, not from the first stream.
            metrics::gauge!(capstan_api::streams::SSE_CONNECTIONS).set(0.0);
            Some(handle)
        })
        .as_ref()
}

/// The standard `process_*` series, read from `/proc` at each scrape.
static PROCESS: std::sync::LazyLock<metrics_process::Collector> =
    std::sync::LazyLock::new(metrics_process::Collector::default);

async fn metrics(State(app): State<App>) -> Response {
    PROCESS.collect();
    // Read at each scrape: a count of the runs not done (bounded by the work in flight, on an
    // index), not a gauge every commit would have to keep.
    match app.store.run_counts(app.api.now()).await {
        Ok(counts) => {
            for (state, n) in [
                ("queued", counts.queued),
                ("leased", counts.leased),
                ("scheduled", counts.scheduled),
                ("waiting", counts.waiting),
            ] {
                metrics::gauge!("capstan_runs", "state" => state).set(n as f64);
            }
        }
        Err(error) => tracing::warn!(%error, "/metrics: runs could not be counted"),
    }
    let mut body = recorder().map(|h| h.render()).unwrap_or_default();
    body.push_str(&format!(
        "# HELP capstan_store_write_transactions_total Write transactions this process began on the database.\n\
         # TYPE capstan_store_write_transactions_total counter\n\
         capstan_store_write_transactions_total {}\n",
        capstan_store::write_transactions()
    ));
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Readiness {
    status: &'static str,
    database: String,
    workflows: Vec<WorkflowSummary>,
    failed_workflows: Vec<FailedFile>,
    /// Each configured real provider and whether its service answers.
    providers: Vec<capstan_providers::ProviderReadiness>,
    /// Fulfilment steps the catalog's products need that no loaded component provides.
    missing_steps: Vec<String>,
}

/// Ready when the database answers and every fulfilment step the catalog's products need is
/// loaded; the body lists the loaded workflows, the files that failed, whether each configured
/// real provider answers and the missing steps.
async fn readyz(State(app): State<App>) -> Response {
    let database = match tokio::time::timeout(Duration::from_secs(2), app.store.ping()).await {
        Ok(Ok(())) => "ok".to_owned(),
        Ok(Err(e)) => format!("unreachable: {e}"),
        Err(_) => "unreachable: no answer within 2 s".to_owned(),
    };
    let providers = app.providers.readiness(Duration::from_secs(2)).await;
    // Reported, not required: a provider that is down fails (and pauses) the executions that
    // need it, while the node keeps serving everything else.
    // Required: a booking captured on a node without its steps could never complete here (it
    // waits PENDING, retried, until one is loaded).
    let catalog = app.production.bookings.catalog();
    let missing_steps: Vec<String> = catalog
        .file
        .products
        .iter()
        .flat_map(|p| app.booking.fulfilment.steps(&p.product_type))
        .filter(|step| !app.steps.has(step))
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let ready = database == "ok" && missing_steps.is_empty();
    let body = Readiness {
        status: if ready { "ready" } else { "not_ready" },
        database,
        providers,
        missing_steps,
        workflows: app
            .registry
            .summaries(|c| app.providers.kind_of(c).unwrap_or(HOST_SERVED)),
        failed_workflows: app.registry.failures.clone(),
    };
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// Serves `app` on both listeners until `shutdown` resolves, then drains in-flight requests.
/// With TLS configured both listeners speak HTTPS and `redirect` (if given) answers 301 to the
/// main listener's HTTPS URL.
pub async fn serve(
    app: App,
    listener: TcpListener,
    sandbox: TcpListener,
    redirect: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let main_addr = listener.local_addr()?;
    let sandbox_addr = sandbox.local_addr()?;
    let redirect_addr = redirect.as_ref().map(TcpListener::local_addr).transpose()?;
    let scheme = if app.tls.is_some() { "https" } else { "http" };
    tracing::info!(addr = %main_addr, sandbox = %sandbox_addr, scheme, redirect = ?redirect_addr.map(|a| a.to_string()), "listening");
    if app.tls.is_none() {
        tracing::warn!(
            "serving PLAIN HTTP on {main_addr} and {sandbox_addr}: for local development only; production needs --tls-cert and --tls-key"
        );
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let workers = app
        .api
        .engine
        .spawn_workers(stop_rx.clone(), Some(app.store.subscribe_other_nodes()));
    let webhooks = tokio::spawn(capstan_api::webhooks::delivery::run(
        app.api.clone(),
        stop_rx.clone(),
    ));
    let booking_tasks = spawn_booking_tasks(&app, stop_rx.clone());
    let upkeep = tokio::spawn(capstan_api::audit::maintain(
        app.api.clone(),
        app.retention,
        stop_rx.clone(),
    ));
    // PostgreSQL: other nodes' committed events wake this node's streams and relay at once.
    let event_listener = {
        let store = app.store.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move { store.listen_for_events(stop).await })
    };
    let streams = app.api.streams.clone();
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let limits = app.connections;
    let one = |listener: TcpListener, router: Router, tls: Option<_>| {
        crate::listen::serve(listener, tls, router, limits, stopped(stop_rx.clone()))
    };
    let main = one(listener, router(app.clone()), app.tls.clone());
    let sandbox = one(sandbox, sandbox_router(app.clone()), app.tls.clone());
    let redirect = async {
        match redirect {
            Some(l) => one(l, crate::tls::redirect_router(main_addr.port()), None).await,
            None => Ok(()),
        }
    };
    tokio::spawn(async move {
        shutdown.await;
        // Stop first, log after: nothing a log line does can keep the node from stopping.
        let _ = stop_tx.send(true);
        // Open event streams end so the listeners can drain.
        streams.close();
        tracing::info!("shutting down: draining in-flight requests");
    });
    let (a, b, c) = tokio::join!(main, sandbox, redirect);
    for worker in workers {
        let _ = worker.await;
    }
    let _ = webhooks.await;
    let _ = upkeep.await;
    let _ = event_listener.await;
    for task in booking_tasks {
        let _ = task.await;
    }
    // Audit records of the last reads, written behind their answers (a few milliseconds' worth;
    // bounded, so a store that cannot write does not keep the node from stopping).
    if tokio::time::timeout(std::time::Duration::from_secs(5), app.store.audit_settled())
        .await
        .is_err()
    {
        tracing::warn!(
            "stopping without the last reads' audit records: the store did not write them"
        );
    }
    a?;
    b?;
    c?;
    tracing::info!("stopped");
    Ok(())
}

/// The booking engine's background work on this node: the capture-timeout sweeper, the
/// fulfilment workers and the booking-webhook dispatcher.
fn spawn_booking_tasks(
    app: &App,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let bookings = app.production.bookings.clone();
    let sweeper = {
        let bookings = bookings.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            loop {
                match bookings.reload_if_changed().await {
                    Ok(true) => tracing::info!("catalog changed in the database: reloaded"),
                    Ok(false) => {}
                    Err(error) => {
                        tracing::warn!(%error, "catalog reload failed; serving the previous one")
                    }
                }
                match bookings.expire_due(500).await {
                    Ok(n) if n > 0 => {
                        tracing::info!(count = n, "bookings timed out (capture window closed)")
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "capture-timeout sweep failed; retrying"),
                }
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        })
    };
    let fulfilment = {
        let bookings = bookings.clone();
        let steps = app.steps.clone();
        let pipelines = app.booking.fulfilment.clone();
        let lease_ms = app.booking.fulfilment_lease_ms.max(1);
        let mut stop = stop.clone();
        tokio::spawn(async move {
            loop {
                let ran = match bookings
                    .run_fulfilment(steps.as_ref(), &pipelines, lease_ms, 32)
                    .await
                {
                    Ok(n) => n,
                    Err(error) => {
                        tracing::warn!(%error, "fulfilment pass failed; retrying");
                        0
                    }
                };
                if ran == 0 {
                    tokio::select! {
                        _ = stop.wait_for(|s| *s) => return,
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
            }
        })
    };
    let policy = capstan_api::partner::delivery::BookingWebhookPolicy {
        retry_waits_ms: app.booking.webhook_retry_waits_ms.clone(),
        timeout_ms: app.booking.webhook_timeout_ms,
    };
    let webhooks = tokio::spawn(capstan_api::partner::delivery::run(
        vec![app.production.clone()],
        policy,
        stop,
    ));
    vec![sweeper, fulfilment, webhooks]
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, not when the
/// future is first polled, so a signal that arrives as soon as the node reports `listening` is
/// already a graceful stop rather than the default action (the process killed mid-write).
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let interrupt = signal(SignalKind::interrupt());
        let terminate = signal(SignalKind::terminate());
        async move {
            match (interrupt, terminate) {
                (Ok(mut interrupt), Ok(mut terminate)) => {
                    tokio::select! {
                        _ = interrupt.recv() => {}
                        _ = terminate.recv() => {}
                    }
                }
                // No handlers (cannot happen on a normal Unix): Ctrl-C alone.
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
