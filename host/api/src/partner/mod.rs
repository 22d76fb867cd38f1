//! The partner catalog and booking API (`/api/public/v1|v2/...`, legacy `/api/v1/...`):
//! docs/partner-api.md. One router per environment: production on the main listener (`pk_` keys),
//! the sandbox on the sandbox listener (`tk_` keys), each with its own partners, inventory,
//! bookings and webhooks over the shared catalog.
//!
//! Header `Partner-Auth`; errors `{"status", "error": {"code", "message"}}`; affiliates reach the
//! catalog only; no CORS (a preflight is refused, no `Access-Control-*` header is ever sent).

pub mod delivery;
pub mod schema;

use crate::keys::Peppers;
use crate::webhooks::{WebhookConfig, safety};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, OriginalUri, Path, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use capstan_booking::catalog::{
    Catalog, EXTRA_LIST_LANGUAGES, LOCAL_FORMAT, LOCALIZED_FORMAT, PRODUCT_LANGUAGES, local_in,
};
use capstan_booking::partners::{PartnerRecord, PartnerType};
use capstan_booking::views::{self, Audience, Locale};
use capstan_booking::{BookingError, Bookings, Environment};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// What the partner routes of one environment reach.
#[derive(Debug, Clone)]
pub struct PartnerState {
    pub bookings: Bookings,
    pub environment: Environment,
    /// Where partners reach this listener (`[booking] public_base_url`); unset, the request's
    /// `Host` with [`PartnerState::scheme`].
    pub public_base_url: Option<Arc<str>>,
    /// `https` with TLS, else `http`.
    pub scheme: &'static str,
    pub peppers: Peppers,
    pub webhooks: Arc<WebhookConfig>,
    /// Token buckets per partner key (both environments share them: a key lives in one).
    pub limiter: Arc<crate::ratelimit::RateLimiter>,
    /// Failed partner authentications and rate refusals, gathered per source.
    pub failures: Arc<crate::audit::Failures>,
}

/// An error of the partner API, rendered `{"status", "error": {"code", "message", ...}}`.
#[derive(Debug)]
pub struct PartnerError(pub BookingError);

impl From<BookingError> for PartnerError {
    fn from(e: BookingError) -> Self {
        Self(e)
    }
}

impl IntoResponse for PartnerError {
    fn into_response(self) -> Response {
        let e = self.0;
        let mut error = json!({"code": e.code, "message": e.message});
        if let Some(Value::Object(extra)) = e.details {
            for (k, v) in extra {
                error[k] = v;
            }
        }
        let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (
            status,
            axum::Json(json!({"status": e.status, "error": error})),
        )
            .into_response();
        // A refusal that says when to come back says it in the header too (429).
        if let Some(seconds) = error.get("retryAfter").and_then(Value::as_u64) {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

type Result<T> = std::result::Result<T, PartnerError>;

fn unauthorized(message: &str) -> PartnerError {
    PartnerError(BookingError::new(401, "E_UNAUTHORIZED", message))
}

/// A new partner key for `env`: `pk_`/`tk_` and 40 base62 characters.
pub fn generate_key(env: Environment) -> String {
    format!(
        "{}{}",
        env.key_prefix(),
        capstan_core::secrets::random_base62(40)
    )
}

const PREFIX_LEN: usize = 12;

/// Creates a partner and returns it with its key (shown once).
pub async fn create_partner(
    bookings: &Bookings,
    peppers: &Peppers,
    name: &str,
    partner_type: PartnerType,
    env: Environment,
) -> anyhow::Result<(PartnerRecord, String)> {
    anyhow::ensure!(
        !name.trim().is_empty() && name.len() <= 200,
        "the partner name must be 1–200 characters"
    );
    let version = peppers
        .current()
        .ok_or_else(|| anyhow::anyhow!("no pepper configured"))?;
    let key = generate_key(env);
    let hash = peppers
        .hash(version, &key)
        .ok_or_else(|| anyhow::anyhow!("no pepper for version {version}"))?;
    let record = PartnerRecord {
        id: capstan_core::ids::new_id(),
        name: name.to_owned(),
        partner_type,
        environment: env,
        key_prefix: key[..PREFIX_LEN].to_owned(),
        key_hash: hash,
        pepper_version: version,
        created_ms: bookings.now_ms(),
        revoked_ms: None,
    };
    bookings
        .insert_partner(&record)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((record, key))
}

/// The authenticated partner of a request.
#[derive(Debug, Clone)]
pub struct Partner(pub PartnerRecord);

/// The scheme and authority partners reach this listener at: the base of absolute links
/// (`nextUrl`, `prevUrl`).
#[derive(Debug, Clone)]
pub struct Origin(pub String);

impl FromRequestParts<PartnerState> for Origin {
    type Rejection = PartnerError;

    async fn from_request_parts(parts: &mut Parts, state: &PartnerState) -> Result<Self> {
        if let Some(base) = &state.public_base_url {
            return Ok(Self(base.to_string()));
        }
        // Only a plain authority (host and port): a `Host` carrying anything else would make
        // the links point wherever the sender wanted.
        let authority = parts
            .headers
            .get(axum::http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.parse::<axum::http::uri::Authority>().ok())
            .or_else(|| parts.uri.authority().cloned())
            .filter(|a| !a.as_str().contains('@'))
            .ok_or_else(|| {
                PartnerError(BookingError::invalid(
                    "the request has no valid Host header",
                ))
            })?;
        Ok(Self(format!("{}://{authority}", state.scheme)))
    }
}

impl FromRequestParts<PartnerState> for Partner {
    type Rejection = PartnerError;

    async fn from_request_parts(parts: &mut Parts, state: &PartnerState) -> Result<Self> {
        let partner = authenticate(parts, state).await;
        let now = state.bookings.now_ms();
        let refusal = match &partner {
            Ok(found) => match state.limiter.check(&found.0.id, now) {
                Ok(()) => {
                    tracing::Span::current()
                        .record("principal", format!("partner:{}", found.0.id).as_str());
                    return partner;
                }
                Err(seconds) => {
                    let mut e = BookingError::new(
                        429,
                        "E_RATE_LIMITED",
                        format!("This partner key made too many requests; retry in {seconds} s."),
                    );
                    e.details = Some(json!({"retryAfter": seconds}));
                    (
                        format!("partner:{}", found.0.id),
                        "rate-limit",
                        PartnerError(e),
                    )
                }
            },
            Err(e) => (
                "partner:unknown".to_owned(),
                "partner-authenticate",
                PartnerError(e.0.clone()),
            ),
        };
        let (principal, action, error) = refusal;
        let caller = crate::auth::Caller::for_principal(parts, principal, Default::default());
        let resource = parts.uri.path().to_owned();
        state.failures.record(
            state.bookings.store(),
            caller.record(now, action, &resource, None, false),
        );
        Err(error)
    }
}

/// The partner a request's `Partner-Auth` key names, or why none.
async fn authenticate(parts: &Parts, state: &PartnerState) -> Result<Partner> {
    let key = parts
        .headers
        .get("partner-auth")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| unauthorized("The Partner-Auth header is missing."))?;
    let expected = state.environment.key_prefix();
    if !key.starts_with(expected) || key.len() < PREFIX_LEN {
        let other = match state.environment {
            Environment::Production => "a testing key (tk_) works only on the sandbox",
            Environment::Sandbox => "a production key (pk_) works only in production",
        };
        return Err(unauthorized(&format!(
            "The Partner-Auth key is not valid for this environment ({} keys start with {expected}; {other}).",
            state.environment.as_str()
        )));
    }
    let candidates = state
        .bookings
        .partners_by_prefix(&key[..PREFIX_LEN])
        .await?;
    let partner = candidates
        .into_iter()
        .find(|p| {
            p.environment == state.environment
                && state.peppers.verify(p.pepper_version, key, &p.key_hash)
        })
        .ok_or_else(|| unauthorized("The Partner-Auth key is unknown or revoked."))?;
    Ok(Partner(partner))
}

impl Partner {
    /// Booking and inventory routes are for booking partners.
    fn must_book(&self) -> Result<()> {
        match self.0.partner_type {
            PartnerType::Booking => Ok(()),
            PartnerType::Affiliate => Err(PartnerError(BookingError::new(
                403,
                "E_FORBIDDEN",
                "Affiliate partners may use the catalog APIs only (product, category, subcategory, collection, city).",
            ))),
        }
    }
    fn audience(&self) -> Audience {
        match self.0.partner_type {
            PartnerType::Booking => Audience::Booking,
            PartnerType::Affiliate => Audience::Affiliate,
        }
    }
}

/// The documented routes (paths as in the contract), without state: the router and the OpenAPI
/// document ([`schema::document`]) are both made from it.
pub fn routes() -> OpenApiRouter<PartnerState> {
    let v1 = OpenApiRouter::new()
        .routes(routes!(product_v1))
        .routes(routes!(cities_v1))
        .routes(routes!(categories_v1))
        .routes(routes!(listing_by_city_v1))
        .routes(routes!(listing_by_category_v1))
        .routes(routes!(inventory_v1))
        .routes(routes!(create_v1, list_v1))
        .routes(routes!(get_booking_v1, update_v1));
    let v2 = OpenApiRouter::new()
        .routes(routes!(product_v2))
        .routes(routes!(products_v2))
        .routes(routes!(cities_v2))
        .routes(routes!(categories_v2))
        .routes(routes!(subcategories_v2))
        .routes(routes!(collections_v2))
        .routes(routes!(inventory_v2))
        .routes(routes!(seatmap_v2))
        .routes(routes!(validate_seats_v2))
        .routes(routes!(create_v2, list_v2))
        .routes(routes!(get_booking_v2, update_v2))
        .routes(routes!(cancel_v2))
        .routes(routes!(reschedule_v2))
        .routes(routes!(create_webhook, list_webhooks))
        .routes(routes!(get_webhook, update_webhook, delete_webhook))
        .routes(routes!(webhook_deliveries));
    // Partners' clients differ on trailing slashes: each v2 path also answers in the other form
    // (undocumented aliases of the same handlers).
    let v2_aliases = Router::new()
        .route("/products", get(products_v2))
        .route("/cities", get(cities_v2))
        .route("/categories/", get(categories_v2))
        .route("/subcategories/", get(subcategories_v2))
        .route("/collections/", get(collections_v2))
        .route("/seatmap/inventory", get(seatmap_v2))
        .route("/seatmap/validate", post(validate_seats_v2))
        .route("/bookings", post(create_v2).get(list_v2))
        .route("/bookings/{id}", get(get_booking_v2).put(update_v2))
        .route("/webhooks", post(create_webhook).get(list_webhooks));
    let legacy: Router<PartnerState> = v1.clone().split_for_parts().0;
    OpenApiRouter::with_openapi(schema::Base::openapi())
        .nest("/api/public/v1", v1)
        .nest("/api/public/v2", v2.merge(OpenApiRouter::from(v2_aliases)))
        .nest(
            "/api/public",
            OpenApiRouter::new().routes(routes!(schema::serve)),
        )
        .merge(OpenApiRouter::from(Router::new().nest("/api/v1", legacy)))
}

/// The partner router of one environment.
pub fn router(state: PartnerState) -> Router {
    let (router, _) = routes().split_for_parts();
    router
        .with_state(state)
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked))
}

/// A handler that panicked answers 500 `E_INTERNAL` (the connection stays usable) and is logged.
fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message");
    PartnerError(BookingError::internal(format_args!(
        "a partner API handler panicked: {what}"
    )))
    .into_response()
}

/// Server-to-server only: a CORS preflight (any OPTIONS under `/api/`) is refused and no CORS
/// header is sent. A layer of the whole listener (so it also sees methods no route accepts).
pub async fn refuse_preflight(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if req.method() == Method::OPTIONS && req.uri().path().starts_with("/api/") {
        return PartnerError(BookingError::new(
            403,
            "E_CORS_NOT_SUPPORTED",
            "Cross-origin requests are not supported; call the API server to server.",
        ))
        .into_response();
    }
    next.run(req).await
}

// ---- query parameters ----------------------------------------------------------------------

/// Query parameters, refusing any name not in `allowed` and any repeated one.
struct Query(BTreeMap<String, String>);

impl Query {
    fn parse(raw: Option<String>, allowed: &[&str]) -> Result<Self> {
        let mut out = BTreeMap::new();
        for (k, v) in url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
            if !allowed.contains(&k.as_ref()) {
                return Err(PartnerError(BookingError::invalid(format!(
                    "unknown query parameter `{k}` (accepted: {})",
                    allowed.join(", ")
                ))));
            }
            if out.insert(k.to_string(), v.to_string()).is_some() {
                return Err(PartnerError(BookingError::invalid(format!(
                    "query parameter `{k}` is repeated"
                ))));
            }
        }
        Ok(Self(out))
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str).filter(|v| !v.is_empty())
    }
    fn int(&self, k: &str) -> Result<Option<i64>> {
        self.get(k)
            .map(|v| {
                v.parse::<i64>().map_err(|_| {
                    PartnerError(BookingError::invalid(format!(
                        "`{k}` must be an integer, not `{v}`"
                    )))
                })
            })
            .transpose()
    }
    fn bool(&self, k: &str) -> Result<bool> {
        match self.get(k) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(v) => Err(PartnerError(BookingError::invalid(format!(
                "`{k}` must be true or false, not `{v}`"
            )))),
        }
    }
    fn required(&self, k: &str) -> Result<&str> {
        self.get(k).ok_or_else(|| {
            PartnerError(BookingError::missing(format!(
                "query parameter `{k}` is required"
            )))
        })
    }
}

fn language(q: &Query, key: &str, list: bool) -> Result<String> {
    let lang = q.get(key).unwrap_or("EN").to_ascii_uppercase();
    let ok = PRODUCT_LANGUAGES.contains(&lang.as_str())
        || (list && EXTRA_LIST_LANGUAGES.contains(&lang.as_str()));
    if !ok {
        let mut all: Vec<&str> = PRODUCT_LANGUAGES.to_vec();
        if list {
            all.extend(EXTRA_LIST_LANGUAGES);
        }
        return Err(PartnerError(BookingError::invalid(format!(
            "`{key}` `{lang}` is not supported (one of {})",
            all.join(", ")
        ))));
    }
    Ok(lang)
}

fn currency<'a>(catalog: &'a Catalog, q: &Query) -> Result<&'a capstan_booking::catalog::Currency> {
    match q.get("currencyCode") {
        None => Ok(catalog.base_currency()),
        Some(code) => catalog.currency(&code.to_ascii_uppercase()).ok_or_else(|| {
            PartnerError(BookingError::invalid(format!(
                "`currencyCode` `{code}` is not supported (one of {})",
                catalog
                    .file
                    .currencies
                    .iter()
                    .map(|c| c.code.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }),
    }
}

/// `offset` ≥ 0 and `limit` in 1..=max (above max capped when `cap`, else refused).
fn page(q: &Query, default_limit: i64, max: i64) -> Result<(i64, i64)> {
    let offset = q.int("offset")?.unwrap_or(0);
    if offset < 0 {
        return Err(PartnerError(BookingError::invalid(
            "`offset` must be 0 or more",
        )));
    }
    let limit = q.int("limit")?.unwrap_or(default_limit);
    if limit <= 0 {
        return Err(PartnerError(BookingError::invalid(
            "`limit` must be 1 or more",
        )));
    }
    Ok((offset, limit.min(max)))
}

/// The pagination wrapper, with next/prev URLs that keep the other query parameters.
fn paged(
    origin: &Origin,
    uri: &Uri,
    key: &str,
    items: Vec<Value>,
    total: i64,
    offset: i64,
    limit: i64,
) -> Value {
    let url_at = |off: i64| {
        let mut pairs: Vec<(String, String)> =
            url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
                .filter(|(k, _)| k != "offset" && k != "limit")
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
        pairs.push(("offset".into(), off.to_string()));
        pairs.push(("limit".into(), limit.to_string()));
        let query: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish();
        format!("{}{}?{query}", origin.0, uri.path())
    };
    // Saturating: `offset` is the caller's and may be as large as an i64 goes.
    let next = (offset.saturating_add(limit) < total).then(|| offset + limit);
    let prev = (offset > 0).then(|| offset.saturating_sub(limit).max(0));
    json!({
        key: items,
        "nextUrl": next.map(url_at),
        "prevUrl": prev.map(url_at),
        "total": total,
        "nextOffset": next,
    })
}

fn json_body(body: &Bytes) -> Result<Value> {
    if body.is_empty() {
        return Err(PartnerError(BookingError::missing(
            "a JSON body is required",
        )));
    }
    serde_json::from_slice(body).map_err(|e| {
        PartnerError(BookingError::invalid(format!(
            "the body is not valid JSON: {e}"
        )))
    })
}

// ---- catalog -------------------------------------------------------------------------------

#[utoipa::path(
    get, path = "/products/{productId}", tag = "catalog", operation_id = "getProductV2",
    description = "One product with its variants and their pricing.",
    params(("productId" = String, Path), schema::ProductQuery),
    responses((status = 200, description = "Product (v2).", body = schema::ProductV2), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such product.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn product_v2(
    State(s): State<PartnerState>,
    partner: Partner,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(raw, &["languageCode", "currencyCode", "campaignName"])?;
    let catalog = s.bookings.catalog();
    let lang = language(&q, "languageCode", false)?;
    let currency = currency(&catalog, &q)?;
    let product = catalog.product(&id).ok_or_else(|| {
        PartnerError(BookingError::not_found(format!(
            "product `{id}` does not exist"
        )))
    })?;
    let locale = Locale {
        language: &lang,
        currency,
        audience: partner.audience(),
    };
    Ok(axum::Json(views::product_v2(&catalog, &locale, product, true)).into_response())
}

/// Whether `product` matches the list filters.
fn matches(catalog: &Catalog, p: &capstan_booking::catalog::Product, q: &Query) -> Result<bool> {
    if let Some(city) = q.get("cityCode")
        && p.city_code != city.to_ascii_uppercase()
    {
        return Ok(false);
    }
    if let Some(c) = q.get("collectionId")
        && !p.collection_ids.iter().any(|x| x == c)
    {
        return Ok(false);
    }
    if let Some(sub) = q.get("subCategoryId")
        && !p.sub_category_ids.iter().any(|x| x == sub)
    {
        return Ok(false);
    }
    if let Some(cat) = q.get("categoryId") {
        let primary_only = q.bool("primaryCategoryOnly")?;
        let linked = p.primary_category_id == cat
            || (!primary_only
                && (p.secondary_category_ids.iter().any(|x| x == cat)
                    || p.sub_category_ids
                        .iter()
                        .any(|s| catalog.subcategory(s).is_some_and(|s| s.category_id == cat))));
        if !linked {
            return Ok(false);
        }
    }
    Ok(true)
}

#[utoipa::path(
    get, path = "/products/", tag = "catalog", operation_id = "listProductsV2",
    description = "Products matching every filter given, in catalog order.",
    params(schema::ProductListQuery),
    responses((status = 200, description = "A page of products (v2, without variant pricing).", body = schema::ProductPage), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn products_v2(
    State(s): State<PartnerState>,
    partner: Partner,
    origin: Origin,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(
        raw,
        &[
            "cityCode",
            "collectionId",
            "categoryId",
            "subCategoryId",
            "languageCode",
            "currencyCode",
            "campaignName",
            "offset",
            "limit",
            "primaryCategoryOnly",
        ],
    )?;
    q.bool("primaryCategoryOnly")?;
    let catalog = s.bookings.catalog();
    let lang = language(&q, "languageCode", true)?;
    let currency = currency(&catalog, &q)?;
    let (offset, limit) = page(&q, 20, 100)?;
    let locale = Locale {
        language: &lang,
        currency,
        audience: partner.audience(),
    };
    let mut matching = Vec::new();
    for p in &catalog.file.products {
        if matches(&catalog, p, &q)? {
            matching.push(p);
        }
    }
    let total = matching.len() as i64;
    let items = matching
        .into_iter()
        .skip(offset as usize)
        .take(limit as usize)
        .map(|p| views::product_v2(&catalog, &locale, p, false))
        .collect();
    Ok(axum::Json(paged(
        &origin, &uri, "products", items, total, offset, limit,
    ))
    .into_response())
}

#[utoipa::path(
    get, path = "/product/get/{productId}", tag = "catalog", operation_id = "getProductV1",
    params(("productId" = String, Path), schema::ProductV1Query),
    responses((status = 200, description = "Product (v1).", body = schema::ProductV1), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such product.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn product_v1(
    State(s): State<PartnerState>,
    partner: Partner,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(raw, &["currencyCode", "fetch-variants", "language"])?;
    let catalog = s.bookings.catalog();
    let lang = language(&q, "language", false)?;
    let currency = currency(&catalog, &q)?;
    let with_variants = q.bool("fetch-variants")?;
    let product = catalog.product(&id).ok_or_else(|| {
        PartnerError(BookingError::not_found(format!(
            "product `{id}` does not exist"
        )))
    })?;
    let locale = Locale {
        language: &lang,
        currency,
        audience: partner.audience(),
    };
    Ok(axum::Json(views::product_v1(&catalog, &locale, product, with_variants)).into_response())
}

fn list_of(origin: &Origin, uri: &Uri, q: &Query, items: Vec<Value>) -> Result<Response> {
    let (offset, limit) = page(q, 100, 500)?;
    let total = items.len() as i64;
    let page_items = items
        .into_iter()
        .skip(offset as usize)
        .take(limit as usize)
        .collect();
    Ok(axum::Json(paged(
        origin, uri, "items", page_items, total, offset, limit,
    ))
    .into_response())
}

#[utoipa::path(
    get, path = "/cities/", tag = "catalog", operation_id = "listCitiesV2",
    params(schema::CitiesQuery),
    responses((status = 200, description = "A page of cities.", body = schema::CityPage), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn cities_v2(
    State(s): State<PartnerState>,
    _p: Partner,
    origin: Origin,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(raw, &["languageCode", "offset", "limit"])?;
    let lang = language(&q, "languageCode", true)?;
    let catalog = s.bookings.catalog();
    let items = catalog
        .file
        .cities
        .iter()
        .map(|c| views::city_json(&catalog, &c.code, &lang))
        .collect();
    list_of(&origin, &uri, &q, items)
}

fn city_filter(q: &Query, catalog: &Catalog, required: bool) -> Result<Option<String>> {
    let city = if required {
        Some(q.required("cityCode")?)
    } else {
        q.get("cityCode")
    };
    match city {
        Some(c) => {
            let c = c.to_ascii_uppercase();
            if catalog.city(&c).is_none() {
                return Err(PartnerError(BookingError::not_found(format!(
                    "city `{c}` does not exist"
                ))));
            }
            Ok(Some(c))
        }
        None => Ok(None),
    }
}

#[utoipa::path(
    get, path = "/categories", tag = "catalog", operation_id = "listCategoriesV2",
    params(schema::ByCityQuery),
    responses((status = 200, description = "A page of categories.", body = schema::CategoryPage), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such city.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn categories_v2(
    State(s): State<PartnerState>,
    _p: Partner,
    origin: Origin,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(raw, &["cityCode", "languageCode", "offset", "limit"])?;
    let lang = language(&q, "languageCode", true)?;
    let catalog = s.bookings.catalog();
    let city = city_filter(&q, &catalog, false)?;
    let items = catalog
        .file
        .categories
        .iter()
        .filter(|c| city.as_ref().is_none_or(|x| &c.city_code == x))
        .map(|c| views::category_json(&catalog, &c.id, &lang))
        .collect();
    list_of(&origin, &uri, &q, items)
}

#[utoipa::path(
    get, path = "/subcategories", tag = "catalog", operation_id = "listSubcategoriesV2",
    params(schema::SubcategoriesQuery),
    responses((status = 200, description = "A page of subcategories.", body = schema::SubcategoryPage), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such city.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn subcategories_v2(
    State(s): State<PartnerState>,
    _p: Partner,
    origin: Origin,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(
        raw,
        &["cityCode", "categoryId", "languageCode", "offset", "limit"],
    )?;
    let lang = language(&q, "languageCode", true)?;
    let catalog = s.bookings.catalog();
    let city = city_filter(&q, &catalog, false)?;
    let category = q.get("categoryId");
    let items = catalog
        .file
        .subcategories
        .iter()
        .filter(|sc| category.is_none_or(|c| sc.category_id == c))
        .filter(|sc| {
            city.as_ref().is_none_or(|x| {
                catalog
                    .category(&sc.category_id)
                    .is_some_and(|c| &c.city_code == x)
            })
        })
        .map(|sc| views::subcategory_json(&catalog, &sc.id, &lang))
        .collect();
    list_of(&origin, &uri, &q, items)
}

#[utoipa::path(
    get, path = "/collections", tag = "catalog", operation_id = "listCollectionsV2",
    params(schema::ByCityQuery),
    responses((status = 200, description = "A page of collections.", body = schema::CollectionPage), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such city.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn collections_v2(
    State(s): State<PartnerState>,
    _p: Partner,
    origin: Origin,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(raw, &["cityCode", "languageCode", "offset", "limit"])?;
    let lang = language(&q, "languageCode", true)?;
    let catalog = s.bookings.catalog();
    let city = city_filter(&q, &catalog, false)?;
    let items = catalog
        .file
        .collections
        .iter()
        .filter(|c| city.as_ref().is_none_or(|x| &c.city_code == x))
        .map(|c| views::collection_json(&catalog, &c.id, &lang))
        .collect();
    list_of(&origin, &uri, &q, items)
}

#[utoipa::path(
    get, path = "/city", tag = "catalog", operation_id = "listCitiesV1",
    params(schema::CitiesQuery),
    responses((status = 200, description = "A page of cities.", body = schema::CityPage), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn cities_v1(
    state: State<PartnerState>,
    p: Partner,
    origin: Origin,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    cities_v2(state, p, origin, OriginalUri(uri), RawQuery(raw)).await
}

#[utoipa::path(
    get, path = "/category/list-by/city", tag = "catalog", operation_id = "listCategoriesByCityV1",
    params(schema::CategoriesV1Query),
    responses((status = 200, description = "A page of the city's categories.", body = schema::CategoryPage), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such city.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn categories_v1(
    State(s): State<PartnerState>,
    _p: Partner,
    origin: Origin,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(raw, &["cityCode", "language", "offset", "limit"])?;
    let lang = language(&q, "language", true)?;
    let catalog = s.bookings.catalog();
    let city = city_filter(&q, &catalog, true)?;
    let items = catalog
        .file
        .categories
        .iter()
        .filter(|c| city.as_ref().is_none_or(|x| &c.city_code == x))
        .map(|c| views::category_json(&catalog, &c.id, &lang))
        .collect();
    list_of(&origin, &uri, &q, items)
}

async fn listing_v1(
    s: &PartnerState,
    partner: &Partner,
    origin: &Origin,
    uri: &Uri,
    q: &Query,
    filter: impl Fn(&capstan_booking::catalog::Product) -> bool,
) -> Result<Response> {
    let catalog = s.bookings.catalog();
    let lang = language(q, "language", false)?;
    let currency = currency(&catalog, q)?;
    let (offset, limit) = page(q, 20, 100)?;
    let locale = Locale {
        language: &lang,
        currency,
        audience: partner.audience(),
    };
    let matching: Vec<_> = catalog.file.products.iter().filter(|p| filter(p)).collect();
    let total = matching.len() as i64;
    let items = matching
        .into_iter()
        .skip(offset as usize)
        .take(limit as usize)
        .map(|p| views::product_v1(&catalog, &locale, p, false))
        .collect();
    Ok(axum::Json(paged(origin, uri, "items", items, total, offset, limit)).into_response())
}

#[utoipa::path(
    get, path = "/product/listing/list-by/city", tag = "catalog", operation_id = "listProductsByCityV1",
    params(schema::ListingByCityQuery),
    responses((status = 200, description = "A page of the city's products (v1).", body = schema::ProductV1Page), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such city.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn listing_by_city_v1(
    State(s): State<PartnerState>,
    partner: Partner,
    origin: Origin,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(
        raw,
        &["cityCode", "language", "currencyCode", "offset", "limit"],
    )?;
    let city = city_filter(&q, &s.bookings.catalog(), true)?.unwrap_or_default();
    listing_v1(&s, &partner, &origin, &uri, &q, |p| p.city_code == city).await
}

#[utoipa::path(
    get, path = "/product/listing/list-by/category", tag = "catalog", operation_id = "listProductsByCategoryV1",
    params(schema::ListingByCategoryQuery),
    responses((status = 200, description = "A page of the category's products (v1), primary or secondary.", body = schema::ProductV1Page), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such category.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn listing_by_category_v1(
    State(s): State<PartnerState>,
    partner: Partner,
    origin: Origin,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(
        raw,
        &["categoryId", "language", "currencyCode", "offset", "limit"],
    )?;
    let category = q.required("categoryId")?.to_owned();
    let catalog = s.bookings.catalog();
    if catalog.category(&category).is_none() {
        return Err(PartnerError(BookingError::not_found(format!(
            "category `{category}` does not exist"
        ))));
    }
    listing_v1(&s, &partner, &origin, &uri, &q, |p| {
        p.primary_category_id == category || p.secondary_category_ids.contains(&category)
    })
    .await
}

// ---- inventory -----------------------------------------------------------------------------

async fn inventory(
    s: &PartnerState,
    partner: &Partner,
    origin: &Origin,
    uri: &Uri,
    q: &Query,
    variant_key: &str,
) -> Result<Response> {
    partner.must_book()?;
    let variant_id = q.required(variant_key)?;
    let catalog = s.bookings.catalog();
    let (product, variant) = catalog.variant(variant_id).ok_or_else(|| {
        PartnerError(BookingError::not_found(format!(
            "variant `{variant_id}` does not exist"
        )))
    })?;
    let currency = currency(&catalog, q)?;
    // Slots are wall-clock times of the supplier's city: "now" is read there too.
    let zone = catalog.zone(product);
    let now = local_in(zone, s.bookings.now_ms());
    let invalid = |key: &str, form: &str, v: &str| {
        PartnerError(BookingError::invalid(format!(
            "`{key}` must be {form}, not `{v}`"
        )))
    };
    // A bound as an instant (`startTime`, ISO 8601 with an offset), as the supplier's local
    // time (`startTimeLocal`, `yyyy-MM-dd HH:mm:ss`) or as a local date or date-time
    // (`startDateTime`); when several are sent, the instant wins, then the localized form.
    let bound =
        |instant: &str, localized: &str, legacy: &str| -> Result<Option<chrono::NaiveDateTime>> {
            if let Some(v) = q.get(instant) {
                return chrono::DateTime::parse_from_rfc3339(v)
                    .map(|t| Some(t.with_timezone(&zone).naive_local()))
                    .map_err(|_| {
                        invalid(
                            instant,
                            "ISO 8601 with an offset (2026-06-01T09:00:00+02:00)",
                            v,
                        )
                    });
            }
            if let Some(v) = q.get(localized) {
                return chrono::NaiveDateTime::parse_from_str(v, LOCALIZED_FORMAT)
                    .map(Some)
                    .map_err(|_| invalid(localized, "yyyy-MM-dd HH:mm:ss", v));
            }
            q.get(legacy)
                .map(|v| {
                    chrono::NaiveDateTime::parse_from_str(v, LOCAL_FORMAT)
                        .or_else(|_| {
                            chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d")
                                .map(|d| d.and_hms_opt(0, 0, 0).unwrap_or_default())
                        })
                        .map_err(|_| invalid(legacy, "YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS", v))
                })
                .transpose()
        };
    let from = bound("startTime", "startTimeLocal", "startDateTime")?
        .unwrap_or(now)
        .max(now);
    let horizon = catalog.horizon(variant, now);
    let to = bound("endTime", "endTimeLocal", "endDateTime")?
        .unwrap_or(horizon)
        .min(horizon);
    let (offset, limit) = page(q, 100, 500)?;
    let slots = if from < to {
        catalog.slots(variant, from, to)
    } else {
        Vec::new()
    };
    // Slots that already started are not for sale.
    let slots: Vec<_> = slots.into_iter().filter(|slot| slot.start > now).collect();
    let total = slots.len() as i64;
    let page_slots: Vec<_> = slots
        .into_iter()
        .skip(offset as usize)
        .take(limit as usize)
        .collect();
    let ids: Vec<String> = page_slots.iter().map(|s| s.id.clone()).collect();
    let taken = s.bookings.taken(s.environment, &ids).await?;
    let locale = Locale {
        language: "EN",
        currency,
        audience: partner.audience(),
    };
    let items = page_slots
        .iter()
        .map(|slot| {
            let used = taken.get(&slot.id).copied().unwrap_or(0);
            views::slot_json(
                &catalog,
                &locale,
                variant,
                zone,
                slot,
                slot.capacity.saturating_sub(used),
                false,
            )
        })
        .collect();
    Ok(axum::Json(paged(origin, uri, "items", items, total, offset, limit)).into_response())
}

#[utoipa::path(
    get, path = "/inventory/list-by/tour", tag = "inventory", operation_id = "listInventoryV2",
    description = "Open slots of a variant from now to its booking horizon (or the window asked), with live remaining seats.",
    params(schema::TourQuery, schema::WindowQuery),
    responses((status = 200, description = "A page of slots.", body = schema::SlotPage), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: affiliate partners reach the catalog only.", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such variant.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn inventory_v2(
    State(s): State<PartnerState>,
    partner: Partner,
    origin: Origin,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(
        raw,
        &[
            "tourId",
            "startDateTime",
            "endDateTime",
            "startTime",
            "endTime",
            "startTimeLocal",
            "endTimeLocal",
            "currencyCode",
            "offset",
            "limit",
        ],
    )?;
    inventory(&s, &partner, &origin, &uri, &q, "tourId").await
}

#[utoipa::path(
    get, path = "/inventory/list-by/variant", tag = "inventory", operation_id = "listInventoryV1",
    params(schema::VariantQuery, schema::WindowQuery),
    responses((status = 200, description = "A page of slots.", body = schema::SlotPage), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: affiliate partners reach the catalog only.", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such variant.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn inventory_v1(
    State(s): State<PartnerState>,
    partner: Partner,
    origin: Origin,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(
        raw,
        &[
            "variantId",
            "startDateTime",
            "endDateTime",
            "startTime",
            "endTime",
            "startTimeLocal",
            "endTimeLocal",
            "currencyCode",
            "offset",
            "limit",
        ],
    )?;
    inventory(&s, &partner, &origin, &uri, &q, "variantId").await
}

// ---- bookings ------------------------------------------------------------------------------
// One handler per operation, generic over the API version `V` (1 or 2): the shapes differ only in
// `variantInputFields` (v2) and in what a v1 `PUT` accepts.

async fn create<const V: u8>(
    State(s): State<PartnerState>,
    partner: Partner,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    partner.must_book()?;
    let body = json_body(&body)?;
    let key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| {
                    PartnerError(BookingError::invalid(
                        "Idempotency-Key must be visible ASCII",
                    ))
                })?
                .to_owned(),
        ),
    };
    let booking = s
        .bookings
        .create(s.environment, &partner.0.id, V, &body, key.as_deref())
        .await?;
    Ok(axum::Json(booking.to_json(V == 2)).into_response())
}

async fn list<const V: u8>(
    State(s): State<PartnerState>,
    partner: Partner,
    origin: Origin,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    partner.must_book()?;
    let q = Query::parse(raw, &["offset", "limit"])?;
    let (offset, limit) = page(&q, 20, 20)?;
    let (rows, total) = s
        .bookings
        .list(s.environment, &partner.0.id, offset, limit)
        .await?;
    let items = rows.iter().map(|b| b.to_json(V == 2)).collect();
    Ok(axum::Json(paged(&origin, &uri, "items", items, total, offset, limit)).into_response())
}

async fn get_booking<const V: u8>(
    State(s): State<PartnerState>,
    partner: Partner,
    Path(id): Path<String>,
) -> Result<Response> {
    partner.must_book()?;
    let booking = s.bookings.get(s.environment, &partner.0.id, &id).await?;
    Ok(axum::Json(booking.to_json(V == 2)).into_response())
}

async fn update<const V: u8>(
    State(s): State<PartnerState>,
    partner: Partner,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    partner.must_book()?;
    let body = json_body(&body)?;
    let booking = s
        .bookings
        .update(s.environment, &partner.0.id, &id, &body, V == 2)
        .await?;
    Ok(axum::Json(booking.to_json(V == 2)).into_response())
}

#[utoipa::path(
    post, path = "/booking", tag = "bookings", operation_id = "createBookingV1",
    description = "Creates an UNCAPTURED booking holding its seats for the capture window (1 hour by default). The same `Idempotency-Key` with the same body answers the same booking.",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes the creation safe to retry (visible ASCII).")),
    request_body(content = schema::CreateBookingRequest),
    responses(
        (status = 200, description = "The new booking, UNCAPTURED.", body = schema::BookingV1),
        (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (named in the message).", body = schema::PartnerError),
        (status = 403, description = "`E_FORBIDDEN`: affiliate partners reach the catalog only.", body = schema::PartnerError),
        (status = 404, description = "`E_NOT_FOUND`: no such product, variant or open slot.", body = schema::PartnerError),
        (status = 409, description = "`E_PRICE_MISMATCH` (with `currentPrice`), `E_INVENTORY_UNAVAILABLE` (with `remaining`) or `E_IDEMPOTENCY_CONFLICT`.", body = schema::PartnerError),
    ),
    security(("partnerAuth" = [])),
)]
async fn create_v1(s: State<PartnerState>, p: Partner, h: HeaderMap, b: Bytes) -> Result<Response> {
    create::<1>(s, p, h, b).await
}

#[utoipa::path(
    get, path = "/booking", tag = "bookings", operation_id = "listBookingsV1",
    params(schema::BookingListQuery),
    responses((status = 200, description = "A page of this partner's bookings, newest first.", body = schema::BookingV1Page), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (named in the message).", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: affiliate partners reach the catalog only.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn list_v1(
    s: State<PartnerState>,
    p: Partner,
    o: Origin,
    u: OriginalUri,
    q: RawQuery,
) -> Result<Response> {
    list::<1>(s, p, o, u, q).await
}

#[utoipa::path(
    get, path = "/booking/{id}", tag = "bookings", operation_id = "getBookingV1",
    params(("id" = String, Path, description = "Numeric.")),
    responses((status = 200, description = "The booking.", body = schema::BookingV1), (status = 400, description = "`E_INVALID_ARGUMENT`: not a numeric id.", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: another partner's booking, or an affiliate partner.", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such booking.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn get_booking_v1(s: State<PartnerState>, p: Partner, id: Path<String>) -> Result<Response> {
    get_booking::<1>(s, p, id).await
}

#[utoipa::path(
    put, path = "/booking/{id}", tag = "bookings", operation_id = "updateBookingV1",
    description = "`PENDING` captures (idempotent with the same `partnerReferenceId`); `CANCELLED` cancels; another status answers 400.",
    params(("id" = String, Path, description = "Numeric.")),
    request_body(content = schema::UpdateBookingV1Request),
    responses(
        (status = 200, description = "The booking.", body = schema::BookingV1),
        (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (named in the message).", body = schema::PartnerError),
        (status = 403, description = "`E_FORBIDDEN`: another partner's booking, or an affiliate partner.", body = schema::PartnerError),
        (status = 404, description = "`E_NOT_FOUND`: no such booking.", body = schema::PartnerError),
        (status = 409, description = "`E_INVALID_STATE`: not UNCAPTURED (cancelled, window closed, captured with another `partnerReferenceId`).", body = schema::PartnerError),
    ),
    security(("partnerAuth" = [])),
)]
async fn update_v1(
    s: State<PartnerState>,
    p: Partner,
    id: Path<String>,
    b: Bytes,
) -> Result<Response> {
    update::<1>(s, p, id, b).await
}

#[utoipa::path(
    post, path = "/bookings/", tag = "bookings", operation_id = "createBookingV2",
    description = "Creates an UNCAPTURED booking holding its seats for the capture window (1 hour by default). The same `Idempotency-Key` with the same body answers the same booking.",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes the creation safe to retry (visible ASCII).")),
    request_body(content = schema::CreateBookingRequest),
    responses(
        (status = 200, description = "The new booking, UNCAPTURED.", body = schema::Booking),
        (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (named in the message).", body = schema::PartnerError),
        (status = 403, description = "`E_FORBIDDEN`: affiliate partners reach the catalog only.", body = schema::PartnerError),
        (status = 404, description = "`E_NOT_FOUND`: no such product, variant or open slot.", body = schema::PartnerError),
        (status = 409, description = "`E_PRICE_MISMATCH` (with `currentPrice`), `E_INVENTORY_UNAVAILABLE` (with `remaining`) or `E_IDEMPOTENCY_CONFLICT`.", body = schema::PartnerError),
    ),
    security(("partnerAuth" = [])),
)]
async fn create_v2(s: State<PartnerState>, p: Partner, h: HeaderMap, b: Bytes) -> Result<Response> {
    create::<2>(s, p, h, b).await
}

#[utoipa::path(
    get, path = "/bookings/", tag = "bookings", operation_id = "listBookingsV2",
    params(schema::BookingListQuery),
    responses((status = 200, description = "A page of this partner's bookings, newest first.", body = schema::BookingPage), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (named in the message).", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: affiliate partners reach the catalog only.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn list_v2(
    s: State<PartnerState>,
    p: Partner,
    o: Origin,
    u: OriginalUri,
    q: RawQuery,
) -> Result<Response> {
    list::<2>(s, p, o, u, q).await
}

#[utoipa::path(
    get, path = "/bookings/{bookingId}/", tag = "bookings", operation_id = "getBookingV2",
    params(("bookingId" = String, Path, description = "Numeric.")),
    responses((status = 200, description = "The booking.", body = schema::Booking), (status = 400, description = "`E_INVALID_ARGUMENT`: not a numeric id.", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: another partner's booking, or an affiliate partner.", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such booking.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn get_booking_v2(s: State<PartnerState>, p: Partner, id: Path<String>) -> Result<Response> {
    get_booking::<2>(s, p, id).await
}

#[utoipa::path(
    put, path = "/bookings/{bookingId}/", tag = "bookings", operation_id = "updateBookingV2",
    description = "Captures the booking: it becomes PENDING and fulfilment starts. Capturing again with the same `partnerReferenceId` answers the booking unchanged.",
    params(("bookingId" = String, Path, description = "Numeric.")),
    request_body(content = schema::CaptureRequest),
    responses(
        (status = 200, description = "The booking.", body = schema::Booking),
        (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (named in the message).", body = schema::PartnerError),
        (status = 403, description = "`E_FORBIDDEN`: another partner's booking, or an affiliate partner.", body = schema::PartnerError),
        (status = 404, description = "`E_NOT_FOUND`: no such booking.", body = schema::PartnerError),
        (status = 409, description = "`E_INVALID_STATE`: not UNCAPTURED (cancelled, window closed, captured with another `partnerReferenceId`).", body = schema::PartnerError),
    ),
    security(("partnerAuth" = [])),
)]
async fn update_v2(
    s: State<PartnerState>,
    p: Partner,
    id: Path<String>,
    b: Bytes,
) -> Result<Response> {
    update::<2>(s, p, id, b).await
}

#[utoipa::path(
    post, path = "/bookings/{bookingId}/cancel/", tag = "bookings", operation_id = "cancelBooking",
    description = "Cancels a booking its variant's cancellation policy still allows; the seats are returned and a captured booking's fulfilment is undone.",
    params(("bookingId" = String, Path, description = "Numeric.")),
    request_body(content = Option<schema::CancelRequest>),
    responses((status = 200, description = "Cancelled.", body = schema::Done), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: another partner's booking, or an affiliate partner.", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such booking.", body = schema::PartnerError), (status = 409, description = "`E_INVALID_STATE`: the state or the policy refuses it.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn cancel_v2(
    State(s): State<PartnerState>,
    partner: Partner,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    partner.must_book()?;
    let body = if body.is_empty() {
        json!({})
    } else {
        json_body(&body)?
    };
    let text = |k: &str| -> Result<Option<String>> {
        match body.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.len() <= 1000 => Ok(Some(s.clone())),
            Some(_) => Err(PartnerError(BookingError::invalid(format!(
                "`{k}` must be a string of at most 1000 characters"
            )))),
        }
    };
    let reason = match (text("reason")?, text("comment")?) {
        (Some(r), Some(c)) => Some(format!("{r}: {c}")),
        (r, c) => r.or(c),
    };
    let booking = s
        .bookings
        .cancel(s.environment, &partner.0.id, &id, reason)
        .await?;
    Ok(axum::Json(
        json!({"success": true, "message": format!("booking {} is CANCELLED", booking.id)}),
    )
    .into_response())
}

#[utoipa::path(
    post, path = "/bookings/{bookingId}/reschedule/", tag = "bookings", operation_id = "rescheduleBooking",
    description = "Moves a booking to another open slot of its variant, if its reschedule policy allows.",
    params(("bookingId" = String, Path, description = "Numeric.")),
    request_body(content = schema::RescheduleRequest),
    responses((status = 200, description = "Moved.", body = schema::Done), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: another partner's booking, or an affiliate partner.", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such booking or slot.", body = schema::PartnerError), (status = 409, description = "`E_INVALID_STATE` (state or policy) or `E_INVENTORY_UNAVAILABLE` (with `remaining`).", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn reschedule_v2(
    State(s): State<PartnerState>,
    partner: Partner,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    partner.must_book()?;
    let body = json_body(&body)?;
    let inventory_id = match body.get("inventoryId") {
        Some(Value::String(v)) if !v.is_empty() => v.clone(),
        None | Some(Value::Null) => {
            return Err(PartnerError(BookingError::missing(
                "`inventoryId` is required",
            )));
        }
        Some(_) => {
            return Err(PartnerError(BookingError::invalid(
                "`inventoryId` must be a string",
            )));
        }
    };
    let booking = s
        .bookings
        .reschedule(s.environment, &partner.0.id, &id, &inventory_id)
        .await?;
    Ok(axum::Json(json!({"success": true, "message": format!("booking {} moved to {}", booking.id, booking.start_local)})).into_response())
}

/// The seats of a seatmap slot with whether each is free.
#[utoipa::path(
    get, path = "/seatmap/inventory/", tag = "inventory", operation_id = "getSeatmap",
    description = "Every seat of a seatmap slot with whether it is free.",
    params(schema::SeatmapQuery),
    responses((status = 200, description = "The seatmap.", body = schema::Seatmap), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (among others: the variant is not sold by seat).", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: affiliate partners reach the catalog only.", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such variant, or the slot is not open.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn seatmap_v2(
    State(s): State<PartnerState>,
    partner: Partner,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    partner.must_book()?;
    let q = Query::parse(raw, &["tourId", "inventoryId"])?;
    let map = s
        .bookings
        .seatmap(
            s.environment,
            q.required("tourId")?,
            q.required("inventoryId")?,
        )
        .await?;
    Ok(axum::Json(map).into_response())
}

/// Whether the seats `{tourId, inventoryId, seatIds}` can be booked together now.
#[utoipa::path(
    post, path = "/seatmap/validate/", tag = "inventory", operation_id = "validateSeats",
    description = "Whether the seats can be booked together now. Nothing is held.",
    request_body(content = schema::ValidateSeatsRequest),
    responses((status = 200, description = "The verdict, seat by seat.", body = schema::SeatValidation), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (among others: more than 100 seats, a variant not sold by seat).", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: affiliate partners reach the catalog only.", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such variant, or the slot is not open.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn validate_seats_v2(
    State(s): State<PartnerState>,
    partner: Partner,
    body: Bytes,
) -> Result<Response> {
    partner.must_book()?;
    let body = json_body(&body)?;
    let text = |key: &str| match body.get(key) {
        Some(Value::String(v)) if !v.is_empty() => Ok(v.clone()),
        None | Some(Value::Null) => Err(PartnerError(BookingError::missing(format!(
            "`{key}` is required"
        )))),
        Some(_) => Err(PartnerError(BookingError::invalid(format!(
            "`{key}` must be a string"
        )))),
    };
    let (variant, inventory) = (text("tourId")?, text("inventoryId")?);
    let seat_ids: Vec<String> = match body.get("seatIds") {
        Some(Value::Array(ids)) if ids.len() <= 100 => ids
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| PartnerError(BookingError::invalid("`seatIds` must be strings")))?,
        Some(Value::Array(_)) => {
            return Err(PartnerError(BookingError::invalid(
                "`seatIds` names at most 100 seats",
            )));
        }
        None | Some(Value::Null) => {
            return Err(PartnerError(BookingError::missing("`seatIds` is required")));
        }
        Some(_) => {
            return Err(PartnerError(BookingError::invalid(
                "`seatIds` must be an array of seat codes",
            )));
        }
    };
    let report = s
        .bookings
        .validate_seats(s.environment, &variant, &inventory, &seat_ids)
        .await?;
    Ok(axum::Json(report).into_response())
}

// ---- webhooks ------------------------------------------------------------------------------

fn envelope(s: &PartnerState, message: Option<&str>, data: Value) -> Response {
    axum::Json(
        json!({"timestamp": s.bookings.now_ms(), "message": message, "error": {}, "data": data}),
    )
    .into_response()
}

async fn vet_url(s: &PartnerState, url: &str) -> Result<()> {
    if url.is_empty() || url.chars().count() > 2048 {
        return Err(PartnerError(BookingError::invalid(
            "`url` must be 1–2048 characters",
        )));
    }
    let https = url.starts_with("https://");
    let allowed_http = s.webhooks.policy.allow_http && url.starts_with("http://");
    if !(https || allowed_http) {
        return Err(PartnerError(BookingError::invalid(
            "`url` must be an HTTPS URL (^https://.*)",
        )));
    }
    let parsed = safety::parse_callback(url, s.webhooks.policy)
        .map_err(|e| PartnerError(BookingError::invalid(format!("`url`: {e}"))))?;
    safety::resolve_vetted(&parsed, s.webhooks.policy)
        .await
        .map_err(|e| PartnerError(BookingError::invalid(format!("`url`: {e}"))))?;
    Ok(())
}

/// Webhook registrations one partner may hold in one environment.
pub const MAX_WEBHOOKS_PER_PARTNER: usize = 20;

#[utoipa::path(
    post, path = "/webhooks/", tag = "webhooks", operation_id = "registerWebhook",
    description = "Registers a receiver of booking status events (at most 20 per partner and environment).",
    request_body(content = schema::WebhookRequest),
    responses((status = 200, description = "Registered; `data.secret` is shown only now.", body = schema::RegisteredWebhookEnvelope), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (not HTTPS, too long, an address that is not public, the 21st registration).", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: affiliate partners reach the catalog only.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn create_webhook(
    State(s): State<PartnerState>,
    partner: Partner,
    body: Bytes,
) -> Result<Response> {
    partner.must_book()?;
    let body = json_body(&body)?;
    let url = match body.get("url") {
        None | Some(Value::Null) => {
            return Err(PartnerError(BookingError::missing("`url` is required")));
        }
        Some(Value::String(u)) => u.clone(),
        Some(_) => {
            return Err(PartnerError(BookingError::invalid(
                "`url` must be a string",
            )));
        }
    };
    let enabled = match body.get("enabled") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(PartnerError(BookingError::invalid(
                "`enabled` must be a boolean",
            )));
        }
    };
    vet_url(&s, &url).await?;
    // A share per partner: its registrations (each a receiver the dispatcher calls) are bounded.
    if s.bookings
        .webhooks(s.environment, &partner.0.id)
        .await?
        .len()
        >= MAX_WEBHOOKS_PER_PARTNER
    {
        return Err(PartnerError(BookingError::invalid(format!(
            "A partner may register at most {MAX_WEBHOOKS_PER_PARTNER} webhooks per environment; delete one first."
        ))));
    }
    let secret = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD
            .encode(capstan_core::secrets::random_bytes::<24>())
    );
    let aad = format!("booking-webhook:{}", partner.0.id);
    let (kms, sealed) = s
        .webhooks
        .keyring
        .encrypt(secret.as_bytes(), aad.as_bytes());
    let row = s
        .bookings
        .create_webhook(s.environment, &partner.0.id, &url, enabled, &kms, &sealed)
        .await?;
    let mut data = row.to_json();
    data["secret"] = json!(secret);
    Ok(envelope(
        &s,
        Some("webhook registered; the secret is shown only now"),
        data,
    ))
}

#[utoipa::path(
    get, path = "/webhooks/", tag = "webhooks", operation_id = "listWebhooks",
    responses((status = 200, description = "This partner's registrations.", body = schema::WebhookListEnvelope), (status = 403, description = "`E_FORBIDDEN`: affiliate partners reach the catalog only.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn list_webhooks(State(s): State<PartnerState>, partner: Partner) -> Result<Response> {
    partner.must_book()?;
    let rows = s.bookings.webhooks(s.environment, &partner.0.id).await?;
    Ok(envelope(
        &s,
        None,
        json!({"items": rows.iter().map(|w| w.to_json()).collect::<Vec<_>>()}),
    ))
}

#[utoipa::path(
    get, path = "/webhooks/{webhookId}/", tag = "webhooks", operation_id = "getWebhook",
    params(("webhookId" = String, Path)),
    responses((status = 200, description = "The registration.", body = schema::WebhookEnvelope), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: another partner's webhook, or an affiliate partner.", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such webhook.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn get_webhook(
    State(s): State<PartnerState>,
    partner: Partner,
    Path(id): Path<String>,
) -> Result<Response> {
    partner.must_book()?;
    let row = s
        .bookings
        .webhook(s.environment, &partner.0.id, &id)
        .await?;
    Ok(envelope(&s, None, row.to_json()))
}

#[utoipa::path(
    method(put, patch), path = "/webhooks/{webhookId}/", tag = "webhooks", operation_id = "updateWebhook",
    params(("webhookId" = String, Path)),
    request_body(content = schema::WebhookUpdate),
    responses((status = 200, description = "Updated.", body = schema::WebhookEnvelope), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: another partner's webhook, or an affiliate partner.", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such webhook.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn update_webhook(
    State(s): State<PartnerState>,
    partner: Partner,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    partner.must_book()?;
    let body = json_body(&body)?;
    let url = match body.get("url") {
        None | Some(Value::Null) => None,
        Some(Value::String(u)) => Some(u.clone()),
        Some(_) => {
            return Err(PartnerError(BookingError::invalid(
                "`url` must be a string",
            )));
        }
    };
    let enabled = match body.get("enabled") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(PartnerError(BookingError::invalid(
                "`enabled` must be a boolean",
            )));
        }
    };
    if url.is_none() && enabled.is_none() {
        return Err(PartnerError(BookingError::missing(
            "send `url` and/or `enabled`",
        )));
    }
    if let Some(u) = &url {
        vet_url(&s, u).await?;
    }
    let row = s
        .bookings
        .update_webhook(s.environment, &partner.0.id, &id, url.as_deref(), enabled)
        .await?;
    Ok(envelope(&s, Some("webhook updated"), row.to_json()))
}

#[utoipa::path(
    delete, path = "/webhooks/{webhookId}/", tag = "webhooks", operation_id = "deleteWebhook",
    description = "Deletes a registration; its pending deliveries are given up.",
    params(("webhookId" = String, Path)),
    responses((status = 200, description = "Deleted.", body = schema::DeletedEnvelope), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: another partner's webhook, or an affiliate partner.", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such webhook.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn delete_webhook(
    State(s): State<PartnerState>,
    partner: Partner,
    Path(id): Path<String>,
) -> Result<Response> {
    partner.must_book()?;
    s.bookings
        .delete_webhook(s.environment, &partner.0.id, &id)
        .await?;
    Ok(envelope(&s, Some("webhook deleted"), json!({"id": id})))
}

#[utoipa::path(
    get, path = "/webhooks/{webhookId}/deliveries/", tag = "webhooks", operation_id = "listWebhookDeliveries",
    params(("webhookId" = String, Path)),
    responses((status = 200, description = "The latest 100 deliveries, newest first.", body = schema::DeliveryListEnvelope), (status = 400, description = "`E_MISSING_PARAMETER` or `E_INVALID_ARGUMENT` (an unknown, repeated or malformed parameter).", body = schema::PartnerError), (status = 403, description = "`E_FORBIDDEN`: another partner's webhook, or an affiliate partner.", body = schema::PartnerError), (status = 404, description = "`E_NOT_FOUND`: no such webhook.", body = schema::PartnerError)),
    security(("partnerAuth" = [])),
)]
async fn webhook_deliveries(
    State(s): State<PartnerState>,
    partner: Partner,
    Path(id): Path<String>,
) -> Result<Response> {
    partner.must_book()?;
    let row = s
        .bookings
        .webhook(s.environment, &partner.0.id, &id)
        .await?;
    let items = s.bookings.webhook_deliveries(row.id, 100).await?;
    Ok(envelope(&s, None, json!({"items": items})))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt as _;

    /// A panicking handler behind the partner's panic layer: 500 in the partner error shape.
    #[tokio::test]
    async fn a_panicking_handler_answers_500_e_internal() {
        async fn boom() -> Response {
            panic!("boom")
        }
        let app = Router::new()
            .route("/boom", get(boom))
            .layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked));
        let res = app
            .oneshot(
                axum::http::Request::get("/boom")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            json!({"status": 500, "error": {"code": "E_INTERNAL", "message": "An internal error occurred."}})
        );
    }
}
