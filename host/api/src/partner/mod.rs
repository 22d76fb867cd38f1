//! The partner catalog and booking API (`/api/public/v1|v2/...`, legacy `/api/v1/...`):
//! docs/partner-api.md. One router per environment: production on the main listener (`pk_` keys),
//! the sandbox on the sandbox listener (`tk_` keys), each with its own partners, inventory,
//! bookings and webhooks over the shared catalog.
//!
//! Header `Partner-Auth`; errors `{"status", "error": {"code", "message"}}`; affiliates reach the
//! catalog only; no CORS (a preflight is refused, no `Access-Control-*` header is ever sent).

pub mod delivery;

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
    Catalog, EXTRA_LIST_LANGUAGES, LOCAL_FORMAT, PRODUCT_LANGUAGES, local,
};
use capstan_booking::partners::{PartnerRecord, PartnerType};
use capstan_booking::views::{self, Audience, Locale};
use capstan_booking::{BookingError, Bookings, Environment};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the partner routes of one environment reach.
#[derive(Debug, Clone)]
pub struct PartnerState {
    pub bookings: Bookings,
    pub environment: Environment,
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

impl FromRequestParts<PartnerState> for Partner {
    type Rejection = PartnerError;

    async fn from_request_parts(parts: &mut Parts, state: &PartnerState) -> Result<Self> {
        let partner = authenticate(parts, state).await;
        let now = state.bookings.now_ms();
        let refusal = match &partner {
            Ok(found) => match state.limiter.check(&found.0.id, now) {
                Ok(()) => return partner,
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

/// The partner router of one environment.
pub fn router(state: PartnerState) -> Router {
    let v1 = Router::new()
        .route("/product/get/{id}", get(product_v1))
        .route("/city", get(cities_v1))
        .route("/category/list-by/city", get(categories_v1))
        .route("/product/listing/list-by/city", get(listing_by_city_v1))
        .route(
            "/product/listing/list-by/category",
            get(listing_by_category_v1),
        )
        .route("/inventory/list-by/variant", get(inventory_v1))
        .route("/booking", post(create::<1>).get(list::<1>))
        .route("/booking/{id}", get(get_booking::<1>).put(update::<1>));
    let v2 = Router::new()
        .route("/products/{id}", get(product_v2))
        .route("/products/", get(products_v2))
        .route("/products", get(products_v2))
        .route("/cities/", get(cities_v2))
        .route("/cities", get(cities_v2))
        .route("/categories", get(categories_v2))
        .route("/categories/", get(categories_v2))
        .route("/subcategories", get(subcategories_v2))
        .route("/subcategories/", get(subcategories_v2))
        .route("/collections", get(collections_v2))
        .route("/collections/", get(collections_v2))
        .route("/inventory/list-by/tour", get(inventory_v2))
        .route("/bookings/", post(create::<2>).get(list::<2>))
        .route("/bookings", post(create::<2>).get(list::<2>))
        .route("/bookings/{id}/", get(get_booking::<2>).put(update::<2>))
        .route("/bookings/{id}", get(get_booking::<2>).put(update::<2>))
        .route("/bookings/{id}/cancel/", post(cancel_v2))
        .route("/bookings/{id}/reschedule/", post(reschedule_v2))
        .route("/webhooks/", post(create_webhook).get(list_webhooks))
        .route("/webhooks", post(create_webhook).get(list_webhooks))
        .route(
            "/webhooks/{id}/",
            get(get_webhook)
                .put(update_webhook)
                .patch(update_webhook)
                .delete(delete_webhook),
        )
        .route("/webhooks/{id}/deliveries/", get(webhook_deliveries));
    Router::new()
        .nest("/api/public/v1", v1.clone())
        .nest("/api/v1", v1)
        .nest("/api/public/v2", v2)
        .with_state(state)
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
fn paged(uri: &Uri, key: &str, items: Vec<Value>, total: i64, offset: i64, limit: i64) -> Value {
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
        format!("{}?{query}", uri.path())
    };
    let next = (offset + limit < total).then(|| offset + limit);
    let prev = (offset > 0).then(|| (offset - limit).max(0));
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

async fn products_v2(
    State(s): State<PartnerState>,
    partner: Partner,
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
    Ok(axum::Json(paged(&uri, "products", items, total, offset, limit)).into_response())
}

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

fn list_of(uri: &Uri, q: &Query, items: Vec<Value>) -> Result<Response> {
    let (offset, limit) = page(q, 100, 500)?;
    let total = items.len() as i64;
    let page_items = items
        .into_iter()
        .skip(offset as usize)
        .take(limit as usize)
        .collect();
    Ok(axum::Json(paged(uri, "items", page_items, total, offset, limit)).into_response())
}

async fn cities_v2(
    State(s): State<PartnerState>,
    _p: Partner,
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
    list_of(&uri, &q, items)
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

async fn categories_v2(
    State(s): State<PartnerState>,
    _p: Partner,
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
    list_of(&uri, &q, items)
}

async fn subcategories_v2(
    State(s): State<PartnerState>,
    _p: Partner,
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
    list_of(&uri, &q, items)
}

async fn collections_v2(
    State(s): State<PartnerState>,
    _p: Partner,
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
    list_of(&uri, &q, items)
}

async fn cities_v1(
    state: State<PartnerState>,
    p: Partner,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    cities_v2(state, p, OriginalUri(uri), RawQuery(raw)).await
}

async fn categories_v1(
    State(s): State<PartnerState>,
    _p: Partner,
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
    list_of(&uri, &q, items)
}

async fn listing_v1(
    s: &PartnerState,
    partner: &Partner,
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
    Ok(axum::Json(paged(uri, "items", items, total, offset, limit)).into_response())
}

async fn listing_by_city_v1(
    State(s): State<PartnerState>,
    partner: Partner,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(
        raw,
        &["cityCode", "language", "currencyCode", "offset", "limit"],
    )?;
    let city = city_filter(&q, &s.bookings.catalog(), true)?.unwrap_or_default();
    listing_v1(&s, &partner, &uri, &q, |p| p.city_code == city).await
}

async fn listing_by_category_v1(
    State(s): State<PartnerState>,
    partner: Partner,
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
    listing_v1(&s, &partner, &uri, &q, |p| {
        p.primary_category_id == category || p.secondary_category_ids.contains(&category)
    })
    .await
}

// ---- inventory -----------------------------------------------------------------------------

async fn inventory(
    s: &PartnerState,
    partner: &Partner,
    uri: &Uri,
    q: &Query,
    variant_key: &str,
) -> Result<Response> {
    partner.must_book()?;
    let variant_id = q.required(variant_key)?;
    let catalog = s.bookings.catalog();
    let (_, variant) = catalog.variant(variant_id).ok_or_else(|| {
        PartnerError(BookingError::not_found(format!(
            "variant `{variant_id}` does not exist"
        )))
    })?;
    let currency = currency(&catalog, q)?;
    let now = local(s.bookings.now_ms());
    let parse_bound = |key: &str| -> Result<Option<chrono::NaiveDateTime>> {
        q.get(key)
            .map(|v| {
                chrono::NaiveDateTime::parse_from_str(v, LOCAL_FORMAT)
                    .or_else(|_| {
                        chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d")
                            .map(|d| d.and_hms_opt(0, 0, 0).unwrap_or_default())
                    })
                    .map_err(|_| {
                        PartnerError(BookingError::invalid(format!(
                            "`{key}` must be YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS, not `{v}`"
                        )))
                    })
            })
            .transpose()
    };
    let from = parse_bound("startDateTime")?.unwrap_or(now).max(now);
    let horizon = catalog.horizon(variant, now);
    let to = parse_bound("endDateTime")?.unwrap_or(horizon).min(horizon);
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
                slot,
                slot.capacity.saturating_sub(used),
                false,
            )
        })
        .collect();
    Ok(axum::Json(paged(uri, "items", items, total, offset, limit)).into_response())
}

async fn inventory_v2(
    State(s): State<PartnerState>,
    partner: Partner,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(
        raw,
        &[
            "tourId",
            "startDateTime",
            "endDateTime",
            "currencyCode",
            "offset",
            "limit",
        ],
    )?;
    inventory(&s, &partner, &uri, &q, "tourId").await
}

async fn inventory_v1(
    State(s): State<PartnerState>,
    partner: Partner,
    OriginalUri(uri): OriginalUri,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let q = Query::parse(
        raw,
        &[
            "variantId",
            "startDateTime",
            "endDateTime",
            "currencyCode",
            "offset",
            "limit",
        ],
    )?;
    inventory(&s, &partner, &uri, &q, "variantId").await
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
    Ok(axum::Json(paged(&uri, "items", items, total, offset, limit)).into_response())
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

// ---- webhooks ------------------------------------------------------------------------------

fn envelope(s: &PartnerState, message: Option<&str>, data: Value) -> Response {
    axum::Json(
        json!({"timestamp": s.bookings.now_ms(), "message": message, "error": null, "data": data}),
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

async fn list_webhooks(State(s): State<PartnerState>, partner: Partner) -> Result<Response> {
    partner.must_book()?;
    let rows = s.bookings.webhooks(s.environment, &partner.0.id).await?;
    Ok(envelope(
        &s,
        None,
        json!({"items": rows.iter().map(|w| w.to_json()).collect::<Vec<_>>()}),
    ))
}

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
