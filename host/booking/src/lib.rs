//! # capstan-booking
//!
//! The partner booking domain behind `/api/public/...` (docs/partner-api.md):
//! - `catalog` — the catalog file (docs/catalog-format.md), its validation and in-memory index;
//! - `views` — the documented JSON shapes of the catalog (products, variants, slots, …);
//! - `request` — booking requests parsed with the documented errors;
//! - `partners` — partners and their keys;
//! - `status` — a booking's statuses and the one table of moves between them;
//! - `fulfilment` — the fulfilment jobs that run a product type's step components, and undo them;
//! - `webhooks` — partner webhook registrations and their delivery queue;
//! - `migrations/` — its tables, applied by [`migrate`] with a history of their own;
//! - this module — the catalog's import, inventory, bookings (holds, capture window, cancel,
//!   reschedule), the capture-timeout sweeper and each status change's history and deliveries,
//!   on the SQL store.
//!
//! Selling is one guarded statement, `UPDATE slot_usage SET taken = taken + pax WHERE taken + pax
//! <= capacity`, in the same transaction as the booking row: concurrent creates never oversell, on
//! SQLite (one writer) as on PostgreSQL (row lock). Every other path that changes a booking
//! (capture, cancel, reschedule, the capture-window timeout, fulfilment) reads it locked in its
//! own transaction and moves it with [`transition`] (the table of `status`), which moves exactly
//! the seats it held. Every status change writes a `booking_events` row and, in the same
//! transaction, one pending delivery per enabled partner webhook.

pub mod catalog;
pub mod fulfilment;
pub mod partners;
pub mod request;
pub mod status;
pub mod views;
pub mod webhooks;

pub use status::BookingStatus;

use crate::catalog::{
    Catalog, CatalogError, LOCAL_FORMAT, LOCALIZED_FORMAT, instant, iso_at, iso_in, local_in,
};
use crate::request::{CreateBooking, UpdateBooking};
use capstan_core::Clock;
use capstan_store::{Sql, Store};
use chrono_tz::Tz;
use serde_json::{Value, json};
use sqlx::Row;
use std::sync::{Arc, RwLock};

/// An error of the partner API: HTTP status, `E_...` code, message, and extra fields.
#[derive(Debug, Clone, PartialEq)]
pub struct BookingError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// Extra members of `error` (e.g. `currentPrice` of `E_PRICE_MISMATCH`).
    pub details: Option<Value>,
}

impl BookingError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: None,
        }
    }
    pub fn missing(message: impl Into<String>) -> Self {
        Self::new(400, "E_MISSING_PARAMETER", message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(400, "E_INVALID_ARGUMENT", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "E_NOT_FOUND", message)
    }
    pub fn state(message: impl Into<String>) -> Self {
        Self::new(409, "E_INVALID_STATE", message)
    }
    pub fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "booking store error");
        Self::new(500, "E_INTERNAL", "An internal error occurred.")
    }
    pub fn unavailable(e: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %e, "booking storage unavailable");
        Self::new(
            503,
            "E_SERVICE_UNAVAILABLE",
            "Booking storage is unavailable; retry later.",
        )
    }
}

impl std::fmt::Display for BookingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.message)
    }
}

impl From<sqlx::Error> for BookingError {
    fn from(e: sqlx::Error) -> Self {
        // Busy (SQLite's write lock held past the busy timeout) or unreachable (PostgreSQL
        // connection lost, serialization failure): 503, retry.
        if capstan_store::is_unavailable(&e) {
            Self::unavailable(e)
        } else {
            Self::internal(e)
        }
    }
}

/// Production and sandbox: each has its own partners, inventory, bookings and webhooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Environment {
    Production,
    Sandbox,
}

impl Environment {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Production => "production",
            Self::Sandbox => "sandbox",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "production" => Some(Self::Production),
            "sandbox" => Some(Self::Sandbox),
            _ => None,
        }
    }
    /// `pk_` for production, `tk_` for the sandbox.
    pub fn key_prefix(self) -> &'static str {
        match self {
            Self::Production => "pk_",
            Self::Sandbox => "tk_",
        }
    }
}

/// Settings of the booking engine.
#[derive(Debug, Clone)]
pub struct BookingConfig {
    /// How long a new booking holds its seats waiting for capture (default one hour).
    pub capture_window_ms: i64,
    /// Base of voucher URLs (`<base>/<bookingId>`), until fulfilment delivers the voucher.
    pub voucher_base_url: String,
}

impl Default for BookingConfig {
    fn default() -> Self {
        Self {
            capture_window_ms: 3_600_000,
            voucher_base_url: "https://vouchers.capstan.example/bookings".to_owned(),
        }
    }
}

/// The booking engine: catalog in memory, everything else in the store.
#[derive(Debug, Clone)]
pub struct Bookings {
    store: Store,
    clock: Arc<dyn Clock>,
    config: Arc<BookingConfig>,
    catalog: Arc<RwLock<Option<Arc<Catalog>>>>,
}

/// Ids of what an import changed.
#[derive(Debug, Clone)]
pub struct Imported {
    pub digest: String,
    pub products: usize,
    pub variants: usize,
    pub unchanged: bool,
}

/// The history table of booking's migrations, apart from the store's `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "_booking_migrations";

/// Creates or brings up to date the booking domain's tables (`host/booking/migrations`) in
/// `store`. [`Bookings::open`] does it; `capstan migrate` calls it to prepare a database before
/// several nodes start.
pub async fn migrate(store: &Store) -> Result<(), capstan_store::OpenError> {
    let mut migrator = match store.backend() {
        capstan_store::Backend::Sqlite => sqlx::migrate!("./migrations/sqlite"),
        capstan_store::Backend::Postgres => sqlx::migrate!("./migrations/postgres"),
    };
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    store.migrate_domain(&migrator).await
}

/// The versions of booking's migrations applied so far.
pub async fn applied_migrations(store: &Store) -> Result<Vec<i64>, capstan_store::OpenError> {
    let rows: Vec<(i64,)> =
        sqlx::query_as("SELECT version FROM _booking_migrations ORDER BY version")
            .fetch_all(store.pool())
            .await?;
    Ok(rows.into_iter().map(|(v,)| v).collect())
}

impl Bookings {
    /// The booking engine on `store`, its tables migrated first: there is no `Bookings` without
    /// its schema.
    pub async fn open(
        store: Store,
        clock: Arc<dyn Clock>,
        config: BookingConfig,
    ) -> Result<Self, capstan_store::OpenError> {
        migrate(&store).await?;
        Ok(Self {
            store,
            clock,
            config: Arc::new(config),
            catalog: Arc::new(RwLock::new(None)),
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }
    pub fn config(&self) -> &BookingConfig {
        &self.config
    }
    pub fn now_ms(&self) -> i64 {
        self.clock.now_millis() as i64
    }

    /// The catalog in memory (an empty one before any import).
    pub fn catalog(&self) -> Arc<Catalog> {
        if let Ok(guard) = self.catalog.read()
            && let Some(c) = guard.as_ref()
        {
            return c.clone();
        }
        Arc::new(empty_catalog())
    }

    /// Reads the stored catalog into memory; `false` when none was imported yet.
    pub async fn load_catalog(&self) -> anyhow::Result<bool> {
        let row: Option<(String,)> = sqlx::query_as("SELECT body FROM catalog WHERE id = 1")
            .fetch_optional(self.store.pool())
            .await?;
        let Some((body,)) = row else {
            return Ok(false);
        };
        let catalog = Catalog::parse(&body)?;
        if let Ok(mut guard) = self.catalog.write() {
            *guard = Some(Arc::new(catalog));
        }
        Ok(true)
    }

    /// Reloads the catalog when another process (`capstan catalog import`, another node) replaced
    /// the stored one; `true` if it changed.
    pub async fn reload_if_changed(&self) -> anyhow::Result<bool> {
        let stored: Option<(String,)> = sqlx::query_as("SELECT digest FROM catalog WHERE id = 1")
            .fetch_optional(self.store.pool())
            .await?;
        match stored {
            Some((digest,)) if digest != self.catalog().digest => self.load_catalog().await,
            _ => Ok(false),
        }
    }

    /// Validates `text` and replaces the catalog with it (stored, then served).
    pub async fn import_catalog(&self, text: &str) -> Result<Imported, CatalogError> {
        let catalog = Catalog::parse(text)?;
        let body =
            serde_json::to_string(&catalog.file).map_err(|e| CatalogError::Parse(e.to_string()))?;
        let previous: Option<(String,)> = sqlx::query_as("SELECT digest FROM catalog WHERE id = 1")
            .fetch_optional(self.store.pool())
            .await
            .map_err(|e| CatalogError::Parse(format!("cannot read the stored catalog: {e}")))?;
        let unchanged = previous.is_some_and(|(d,)| d == catalog.digest);
        sqlx::query(
            "INSERT INTO catalog (id, body, digest, imported_ms) VALUES (1, $1, $2, $3)
             ON CONFLICT (id) DO UPDATE SET body = excluded.body, digest = excluded.digest, imported_ms = excluded.imported_ms",
        )
        .bind(&body)
        .bind(&catalog.digest)
        .bind(self.now_ms())
        .execute(self.store.writer())
        .await
        .map_err(|e| CatalogError::Parse(format!("cannot store the catalog: {e}")))?;
        let imported = Imported {
            digest: catalog.digest.clone(),
            products: catalog.file.products.len(),
            variants: catalog.file.products.iter().map(|p| p.variants.len()).sum(),
            unchanged,
        };
        if let Ok(mut guard) = self.catalog.write() {
            *guard = Some(Arc::new(catalog));
        }
        Ok(imported)
    }

    /// Seats remaining per slot id (slots without a usage row have their full capacity).
    pub async fn taken(
        &self,
        env: Environment,
        slot_ids: &[String],
    ) -> Result<std::collections::HashMap<String, u32>, BookingError> {
        let mut out = std::collections::HashMap::new();
        if slot_ids.is_empty() {
            return Ok(out);
        }
        let marks = (2..slot_ids.len() + 2)
            .map(|n| format!("${n}"))
            .collect::<Vec<_>>()
            .join(",");
        let sql = format!(
            "SELECT slot_id, taken FROM slot_usage WHERE environment = $1 AND slot_id IN ({marks})"
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(env.as_str());
        for id in slot_ids {
            q = q.bind(id);
        }
        for row in q.fetch_all(self.store.pool()).await? {
            out.insert(row.get::<String, _>(0), row.get::<i64, _>(1) as u32);
        }
        Ok(out)
    }

    /// Validates a create request against the catalog and prices it: (slot, pax, price in the
    /// requested currency, customers JSON, seat info).
    fn check_create(
        &self,
        catalog: &Catalog,
        req: &CreateBooking,
        now_ms: i64,
    ) -> Result<Checked, BookingError> {
        let product = catalog.product(&req.product_id).ok_or_else(|| {
            BookingError::not_found(format!("product `{}` does not exist", req.product_id))
        })?;
        // The slot's times are the supplier's wall clock: what is past is decided there.
        let zone = catalog.zone(product);
        let now = local_in(zone, now_ms);
        let (owner, variant) = catalog
            .variant(&req.variant_id)
            .filter(|(p, _)| p.id == product.id)
            .ok_or_else(|| {
                BookingError::not_found(format!(
                    "variant `{}` is not a variant of product `{}`",
                    req.variant_id, product.id
                ))
            })?;
        let slot = catalog.find_slot(variant, &req.inventory_id, now).ok_or_else(|| {
            BookingError::not_found(format!(
                "inventory `{}` is not an open slot of variant `{}` (see GET /api/public/v2/inventory/list-by/tour?tourId={})",
                req.inventory_id, variant.id, variant.id
            ))
        })?;
        let pax = req.customers.len() as u32;
        if req.count != pax {
            return Err(BookingError::invalid(format!(
                "customersDetails.count ({}) must equal the number of customers ({pax})",
                req.count
            )));
        }
        if pax < variant.pax.min || pax > variant.pax.max {
            return Err(BookingError::invalid(format!(
                "variant `{}` takes {}–{} people per booking, not {pax}",
                variant.id, variant.pax.min, variant.pax.max
            )));
        }
        let primaries = req.customers.iter().filter(|c| c.is_primary).count();
        if primaries != 1 {
            return Err(BookingError::invalid(format!(
                "exactly one customer must have isPrimary = true ({primaries} have)"
            )));
        }
        // Input fields per customer: PRIMARY_CUSTOMER fields on the primary customer, fields of any
        // other level on every customer.
        let mut customers_json = Vec::new();
        for (i, c) in req.customers.iter().enumerate() {
            let at = format!("customersDetails.customers[{i}]");
            if variant.profile_type == "PER_PERSON"
                && !variant.persons.iter().any(|p| p.kind == c.person_type)
            {
                return Err(BookingError::invalid(format!(
                    "{at}.personType `{}` is not sold for variant `{}` (one of {})",
                    c.person_type,
                    variant.id,
                    variant
                        .persons
                        .iter()
                        .map(|p| p.kind.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            let applicable: Vec<&catalog::InputField> = variant
                .input_fields
                .iter()
                .filter(|f| {
                    if f.level == "PRIMARY_CUSTOMER" {
                        c.is_primary
                    } else {
                        true
                    }
                })
                .collect();
            let mut out_fields = Vec::new();
            for (k, given) in c.input_fields.iter().enumerate() {
                let Some(field) = applicable.iter().find(|f| f.id == given.id) else {
                    return Err(BookingError::invalid(format!(
                        "{at}.inputFields[{k}].id `{}` is not an input field of variant `{}` for this customer",
                        given.id, variant.id
                    )));
                };
                check_field(
                    catalog,
                    &variant.id,
                    field,
                    &given.value,
                    &format!("{at}.inputFields[{k}]"),
                )?;
                out_fields.push(json!({"id": field.id, "name": field.name, "value": given.value}));
            }
            for field in &applicable {
                let present = c
                    .input_fields
                    .iter()
                    .any(|g| g.id == field.id && !g.value.is_empty());
                if field.validation.required && !present {
                    return Err(BookingError::missing(format!(
                        "{at}.inputFields: `{}` ({}) is required",
                        field.id, field.name
                    )));
                }
            }
            customers_json.push(json!({"personType": c.person_type, "isPrimary": c.is_primary, "inputFields": out_fields}));
        }
        let currency = catalog.currency(&req.price_currency).ok_or_else(|| {
            BookingError::invalid(format!(
                "price.currencyCode `{}` is not a supported currency ({})",
                req.price_currency,
                catalog
                    .file
                    .currencies
                    .iter()
                    .map(|c| c.code.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let amount = price_of(catalog, variant, &req.customers, currency);
        let half_unit = 0.5 / 10f64.powi(currency.precision as i32);
        if (amount - req.price_amount).abs() >= half_unit {
            let mut err = BookingError::new(
                409,
                "E_PRICE_MISMATCH",
                format!(
                    "the expected price {} {} differs from the current price {} {}",
                    req.price_amount, currency.code, amount, currency.code
                ),
            );
            err.details =
                Some(json!({"currentPrice": {"amount": amount, "currencyCode": currency.code}}));
            return Err(err);
        }
        let seat_info = match (&variant.seatmap, &req.inventory_seat_ids) {
            (Some(map), Some(seats)) => {
                if seats.len() as u32 != pax {
                    return Err(BookingError::invalid(format!(
                        "inventorySeatIds has {} seats for {pax} customers",
                        seats.len()
                    )));
                }
                let mut info = Vec::new();
                for s in seats {
                    info.push(map.seat(s).ok_or_else(|| {
                        BookingError::invalid(format!("seat `{s}` does not exist in this seatmap"))
                    })?);
                }
                let unique: std::collections::HashSet<_> = seats.iter().collect();
                if unique.len() != seats.len() {
                    return Err(BookingError::invalid("inventorySeatIds names a seat twice"));
                }
                Some(info)
            }
            (Some(_), None) => {
                return Err(BookingError::missing(
                    "`inventorySeatIds` is required for a seatmap product",
                ));
            }
            (None, Some(seats)) if !seats.is_empty() => {
                return Err(BookingError::invalid(
                    "inventorySeatIds is only for seatmap products",
                ));
            }
            (None, _) => None,
        };
        let variant_fields = req.variant_input_fields.as_ref().map(|fields| {
            fields
                .iter()
                .map(|f| json!({"id": f.id, "value": f.value}))
                .collect::<Vec<_>>()
        });
        Ok(Checked {
            zone,
            product_name: owner.name.clone(),
            product_type: owner.product_type.clone(),
            variant_name: variant.name.clone(),
            slot,
            pax,
            amount,
            currency: currency.code.clone(),
            customers: json!({"count": pax, "customers": customers_json}),
            seat_info: seat_info.map(Value::from),
            variant_input_fields: variant_fields.map(Value::from),
            policy: json!({"cancellation": variant.cancellation_policy, "reschedule": variant.reschedule_policy}),
        })
    }

    /// Describes the booking metrics to the process's recorder.
    pub fn describe_metrics() {
        metrics::describe_counter!(
            "capstan_bookings_created_total",
            "Bookings created (UNCAPTURED, holding their seats), by environment."
        );
        metrics::describe_counter!(
            "capstan_booking_captures_total",
            "Bookings captured (PENDING, fulfilment queued), by environment."
        );
        metrics::describe_counter!(
            "capstan_booking_refusals_total",
            "Bookings refused, by reason (`seats`: fewer left in the slot than asked; `seat_taken`: a named seat is held)."
        );
        metrics::describe_counter!(
            "capstan_booking_steps_total",
            "Fulfilment step attempts, by step and outcome."
        );
    }

    /// Creates a booking in UNCAPTURED holding its seats for the capture window.
    pub async fn create(
        &self,
        env: Environment,
        partner_id: &str,
        api_version: u8,
        body: &Value,
        idempotency_key: Option<&str>,
    ) -> Result<BookingRow, BookingError> {
        let req = CreateBooking::parse(body)?;
        let request_hash = {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(
                capstan_core::store::json_string(body).as_bytes(),
            ))
        };
        if let Some(key) = idempotency_key {
            if key.is_empty() || key.len() > 255 {
                return Err(BookingError::invalid(
                    "Idempotency-Key must be 1–255 characters",
                ));
            }
            if let Some(existing) = self.by_idempotency_key(env, partner_id, key).await? {
                return if existing.request_hash.as_deref() == Some(request_hash.as_str()) {
                    Ok(existing)
                } else {
                    Err(BookingError::new(
                        409,
                        "E_IDEMPOTENCY_CONFLICT",
                        "this Idempotency-Key was used with a different request",
                    ))
                };
            }
        }
        let now_ms = self.now_ms();
        let catalog = self.catalog();
        let checked = self.check_create(&catalog, &req, now_ms)?;
        // A slot that is already full is refused from a read connection, without queueing on
        // the single writer: the read is a committed state during this request, so the answer
        // is the one a transaction would have given at that moment.
        let read = Sql::new("SELECT taken FROM slot_usage WHERE environment = $1 AND slot_id = $2")
            .arg(env.as_str())
            .arg(checked.slot.id.clone());
        if let Some(row) = self.store.fetch_optional(read).await? {
            let taken: i64 = row.try_get(0)?;
            // Capacity as `take_seats` would set it: the catalog's, never below what is taken.
            let remaining = i64::from(checked.slot.capacity).max(taken) - taken;
            if i64::from(checked.pax) > remaining {
                return Err(seats_unavailable(&checked.slot.id, remaining, checked.pax));
            }
        }
        if self.store.backend() == capstan_store::Backend::Sqlite {
            let created = CreateParts {
                env,
                partner_id,
                api_version,
                req: &req,
                checked: &checked,
                idempotency_key,
                request_hash: &request_hash,
                now_ms,
            };
            return match self.create_grouped(&created).await? {
                Inserted::Existing(row) => Ok(*row),
                Inserted::New(id) => self.created(env, id).await,
            };
        }
        let mut tx = self.store.begin_write().await?;
        take_seats(
            &mut tx,
            env,
            &checked.slot.id,
            checked.slot.capacity,
            checked.pax,
        )
        .await?;
        let start_local = checked.slot.start.format(LOCAL_FORMAT).to_string();
        // A random id, not a counter: ids reveal nothing about how many bookings others make.
        // Drawn again on the (rare) collision with an existing id.
        let mut inserted = Err(sqlx::Error::RowNotFound);
        for _ in 0..8 {
            let attempt = sqlx::query(
            "INSERT INTO bookings (id, environment, partner_id, api_version, status, product_id, product_name, product_type,
                variant_id, variant_name, slot_id, start_local, pax, customers, variant_input_fields, seat_info,
                price_amount, price_currency, voucher_url, policy, idempotency_key, request_hash,
                created_ms, capture_deadline_ms, updated_ms, time_zone)
             VALUES ($25, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, '', $18, $19, $20, $21, $22, $23, $24)
             ON CONFLICT (id) DO NOTHING
             RETURNING id",
        )
        .bind(env.as_str())
        .bind(partner_id)
        .bind(i64::from(api_version))
        .bind(BookingStatus::Uncaptured.as_str())
        .bind(&req.product_id)
        .bind(&checked.product_name)
        .bind(&checked.product_type)
        .bind(&req.variant_id)
        .bind(&checked.variant_name)
        .bind(&checked.slot.id)
        .bind(&start_local)
        .bind(i64::from(checked.pax))
        .bind(checked.customers.to_string())
        .bind(checked.variant_input_fields.as_ref().map(Value::to_string))
        .bind(checked.seat_info.as_ref().map(Value::to_string))
        .bind(checked.amount)
        .bind(&checked.currency)
        .bind(checked.policy.to_string())
        .bind(idempotency_key)
        .bind(idempotency_key.map(|_| request_hash.as_str()))
        .bind(now_ms)
        .bind(now_ms + self.config.capture_window_ms)
        .bind(now_ms)
        .bind(checked.zone.name())
        .bind(booking_id())
        .fetch_optional(&mut *tx)
        .await;
            match attempt {
                Ok(None) => continue,
                Ok(Some(row)) => {
                    inserted = Ok(row);
                    break;
                }
                Err(e) => {
                    inserted = Err(e);
                    break;
                }
            }
        }
        let id: i64 = match inserted {
            Ok(row) => row.get(0),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                // A concurrent create with the same Idempotency-Key won: answer with its booking.
                drop(tx);
                let key = idempotency_key.unwrap_or_default();
                return match self.by_idempotency_key(env, partner_id, key).await? {
                    Some(b) if b.request_hash.as_deref() == Some(request_hash.as_str()) => Ok(b),
                    _ => Err(BookingError::new(
                        409,
                        "E_IDEMPOTENCY_CONFLICT",
                        "this Idempotency-Key was used with a different request",
                    )),
                };
            }
            Err(e) => return Err(e.into()),
        };
        sqlx::query("UPDATE bookings SET voucher_url = $1 WHERE id = $2")
            .bind(format!("{}/{id}", self.config.voucher_base_url))
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if let Some(seats) = &req.inventory_seat_ids {
            for seat in seats {
                let taken = sqlx::query(
                    "INSERT INTO slot_seats (environment, slot_id, seat_code, booking_id) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                )
                .bind(env.as_str())
                .bind(&checked.slot.id)
                .bind(seat)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                if taken.rows_affected() == 0 {
                    return Err(seat_taken(seat));
                }
            }
        }
        record_status(
            &mut tx,
            env,
            partner_id,
            id,
            BookingStatus::Uncaptured,
            checked.zone,
            now_ms,
        )
        .await?;
        tx.commit().await?;
        self.created(env, id).await
    }

    /// A booking just committed, as read back.
    async fn created(&self, env: Environment, id: i64) -> Result<BookingRow, BookingError> {
        metrics::counter!("capstan_bookings_created_total", "environment" => env.as_str())
            .increment(1);
        self.get_row(id)
            .await?
            .ok_or_else(|| BookingError::internal("the new booking vanished"))
    }

    /// SQLite: the create as one part of the store's next group commit, so that concurrent
    /// creates share a commit and its sync instead of taking the single writer one transaction
    /// (and a round trip per statement) at a time. What a transaction would have checked under
    /// its lock is checked by guards at the head of the part, in the writer's transaction: the
    /// Idempotency-Key unused, room in the slot (capacity as [`take_seats`] sets it), each
    /// named seat free, the drawn id unused. A guard that fails changes nothing; reads then
    /// tell which, and the answer is the transaction's. When they find none (the drawn id was
    /// taken, or seats came back in between), a new id is drawn and the part queued again.
    async fn create_grouped(&self, c: &CreateParts<'_>) -> Result<Inserted, BookingError> {
        // `check_create` refused a seat named twice, which the guards below would not catch.
        let (env, slot) = (c.env.as_str(), &c.checked.slot);
        let start_local = slot.start.format(LOCAL_FORMAT).to_string();
        let event_local = local_in(c.checked.zone, c.now_ms)
            .format("%Y-%m-%dT%H:%M:%S%.3f")
            .to_string();
        let pax = i64::from(c.checked.pax);
        for _ in 0..8 {
            let id = booking_id();
            let mut sql = Sql::default();
            let mut guards = 0;
            if let Some(key) = c.idempotency_key {
                sql.push_statement(
                    "SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM bookings WHERE environment = $1 AND partner_id = $2 AND idempotency_key = $3)",
                )
                .bind(env.to_owned())
                .bind(c.partner_id.to_owned())
                .bind(key.to_owned());
                guards += 1;
            }
            sql.push_statement(
                "SELECT 1 FROM (SELECT COALESCE((SELECT taken FROM slot_usage WHERE environment = $1 AND slot_id = $2), 0) AS taken) WHERE taken + $3 <= MAX($4, taken)",
            )
            .bind(env.to_owned())
            .bind(slot.id.clone())
            .bind(pax)
            .bind(i64::from(slot.capacity));
            guards += 1;
            for seat in c.req.inventory_seat_ids.iter().flatten() {
                sql.push_statement(
                    "SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM slot_seats WHERE environment = $1 AND slot_id = $2 AND seat_code = $3)",
                )
                .bind(env.to_owned())
                .bind(slot.id.clone())
                .bind(seat.clone());
                guards += 1;
            }
            sql.push_statement("SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM bookings WHERE id = $1)")
                .bind(id);
            guards += 1;
            sql.push_statement(SLOT_USAGE)
                .bind(env.to_owned())
                .bind(slot.id.clone())
                .bind(i64::from(slot.capacity));
            sql.push_statement(
                "UPDATE slot_usage SET taken = taken + $1 WHERE environment = $2 AND slot_id = $3",
            )
            .bind(pax)
            .bind(env.to_owned())
            .bind(slot.id.clone());
            sql.push_statement(
                "INSERT INTO bookings (id, environment, partner_id, api_version, status, product_id, product_name, product_type,
                    variant_id, variant_name, slot_id, start_local, pax, customers, variant_input_fields, seat_info,
                    price_amount, price_currency, voucher_url, policy, idempotency_key, request_hash,
                    created_ms, capture_deadline_ms, updated_ms, time_zone)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26)",
            )
            .bind(id)
            .bind(env.to_owned())
            .bind(c.partner_id.to_owned())
            .bind(i64::from(c.api_version))
            .bind(BookingStatus::Uncaptured.as_str().to_owned())
            .bind(c.req.product_id.clone())
            .bind(c.checked.product_name.clone())
            .bind(c.checked.product_type.clone())
            .bind(c.req.variant_id.clone())
            .bind(c.checked.variant_name.clone())
            .bind(slot.id.clone())
            .bind(start_local.clone())
            .bind(pax)
            .bind(c.checked.customers.to_string())
            .bind(c.checked.variant_input_fields.as_ref().map(Value::to_string))
            .bind(c.checked.seat_info.as_ref().map(Value::to_string))
            .bind(c.checked.amount)
            .bind(c.checked.currency.clone())
            .bind(format!("{}/{id}", self.config.voucher_base_url))
            .bind(c.checked.policy.to_string())
            .bind(c.idempotency_key.map(str::to_owned))
            .bind(c.idempotency_key.map(|_| c.request_hash.to_owned()))
            .bind(c.now_ms)
            .bind(c.now_ms + self.config.capture_window_ms)
            .bind(c.now_ms)
            .bind(c.checked.zone.name().to_owned());
            for seat in c.req.inventory_seat_ids.iter().flatten() {
                sql.push_statement(
                    "INSERT INTO slot_seats (environment, slot_id, seat_code, booking_id) VALUES ($1, $2, $3, $4)",
                )
                .bind(env.to_owned())
                .bind(slot.id.clone())
                .bind(seat.clone())
                .bind(id);
            }
            // `record_status` for a new booking: its first event, and no webhook (an
            // uncaptured booking is not announced).
            sql.push_statement(
                "INSERT INTO booking_events (booking_id, status, at_ms, event_local) VALUES ($1, $2, $3, $4)",
            )
            .bind(id)
            .bind(BookingStatus::Uncaptured.as_str().to_owned())
            .bind(c.now_ms)
            .bind(event_local.clone());
            match self.store.commit_guarded(sql, guards).await {
                Ok(()) => return Ok(Inserted::New(id)),
                Err(capstan_core::store::StoreError::Conflict(_)) => {}
                Err(capstan_core::store::StoreError::Unavailable(e)) => {
                    return Err(BookingError::unavailable(e));
                }
                Err(e) => return Err(BookingError::internal(e)),
            }
            if let Some(key) = c.idempotency_key
                && let Some(existing) = self.by_idempotency_key(c.env, c.partner_id, key).await?
            {
                // A concurrent create with the same Idempotency-Key won.
                return if existing.request_hash.as_deref() == Some(c.request_hash) {
                    Ok(Inserted::Existing(Box::new(existing)))
                } else {
                    Err(BookingError::new(
                        409,
                        "E_IDEMPOTENCY_CONFLICT",
                        "this Idempotency-Key was used with a different request",
                    ))
                };
            }
            let read =
                Sql::new("SELECT taken FROM slot_usage WHERE environment = $1 AND slot_id = $2")
                    .arg(env.to_owned())
                    .arg(slot.id.clone());
            // A slot nobody has booked yet has nothing taken: a create larger than its capacity
            // is refused here, as `take_seats` refuses it after creating the slot's row.
            let taken: i64 = match self.store.fetch_optional(read).await? {
                Some(row) => row.try_get(0)?,
                None => 0,
            };
            let remaining = i64::from(slot.capacity).max(taken) - taken;
            if pax > remaining {
                return Err(seats_unavailable(&slot.id, remaining, c.checked.pax));
            }
            for seat in c.req.inventory_seat_ids.iter().flatten() {
                let read = Sql::new(
                    "SELECT 1 FROM slot_seats WHERE environment = $1 AND slot_id = $2 AND seat_code = $3",
                )
                .arg(env.to_owned())
                .arg(slot.id.clone())
                .arg(seat.clone());
                if self.store.fetch_optional(read).await?.is_some() {
                    return Err(seat_taken(seat));
                }
            }
        }
        Err(BookingError::internal(
            "a create was refused by its guards eight times with nothing found to refuse it for",
        ))
    }

    async fn by_idempotency_key(
        &self,
        env: Environment,
        partner_id: &str,
        key: &str,
    ) -> Result<Option<BookingRow>, BookingError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{SELECT_BOOKING} WHERE environment = $1 AND partner_id = $2 AND idempotency_key = $3"
        )))
        .bind(env.as_str())
        .bind(partner_id)
        .bind(key)
        .fetch_optional(self.store.pool())
        .await?;
        row.map(|r| BookingRow::from_row(&r)).transpose()
    }

    async fn get_row(&self, id: i64) -> Result<Option<BookingRow>, BookingError> {
        // A read sees every commit before it (callers read after their commit).
        let read = Sql::new(format!("{SELECT_BOOKING} WHERE id = $1")).arg(id);
        let row = self.store.fetch_optional(read).await?;
        row.map(|r| BookingRow::from_row(&r)).transpose()
    }

    /// A booking of `partner_id`: 400 for a non-numeric id, 404 unknown, 403 another partner's.
    pub async fn get(
        &self,
        env: Environment,
        partner_id: &str,
        id: &str,
    ) -> Result<BookingRow, BookingError> {
        let id = parse_id(id)?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{SELECT_BOOKING} WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(self.store.pool())
        .await?
        .map(|r| BookingRow::from_row(&r))
        .transpose()?
        .filter(|b| b.environment == env.as_str())
        .ok_or_else(|| BookingError::not_found(format!("booking {id} does not exist")))?;
        if row.partner_id != partner_id {
            return Err(BookingError::new(
                403,
                "E_FORBIDDEN",
                format!("booking {id} belongs to another partner"),
            ));
        }
        Ok(row)
    }

    /// A page of the partner's bookings, newest first, and the total.
    pub async fn list(
        &self,
        env: Environment,
        partner_id: &str,
        offset: i64,
        limit: i64,
    ) -> Result<(Vec<BookingRow>, i64), BookingError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{SELECT_BOOKING} WHERE environment = $1 AND partner_id = $2 ORDER BY created_ms DESC, id DESC LIMIT $3 OFFSET $4"
        )))
        .bind(env.as_str())
        .bind(partner_id)
        .bind(limit)
        .bind(offset)
        .fetch_all(self.store.pool())
        .await?;
        let (total,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM bookings WHERE environment = $1 AND partner_id = $2",
        )
        .bind(env.as_str())
        .bind(partner_id)
        .fetch_one(self.store.pool())
        .await?;
        let rows = rows
            .iter()
            .map(BookingRow::from_row)
            .collect::<Result<_, _>>()?;
        Ok((rows, total))
    }

    /// `PUT` booking: capture (status PENDING) within the window; v1 also accepts CANCELLED (a
    /// cancellation under the product's policy).
    pub async fn update(
        &self,
        env: Environment,
        partner_id: &str,
        id: &str,
        body: &Value,
        v2: bool,
    ) -> Result<BookingRow, BookingError> {
        let booking_id = parse_id(id)?;
        let update = UpdateBooking::parse(body, v2)?;
        match update.status {
            BookingStatus::Pending => {}
            BookingStatus::Cancelled => {
                self.cancel(
                    env,
                    partner_id,
                    id,
                    Some("cancelled through PUT /api/public/v1/booking".into()),
                )
                .await?;
                return self.get(env, partner_id, id).await;
            }
            other => {
                return Err(BookingError::invalid(format!(
                    "a partner sets status PENDING (capture) or CANCELLED, not {other}"
                )));
            }
        }
        // Another partner's booking is refused before anything is locked.
        self.get(env, partner_id, id).await?;
        let now_ms = self.now_ms();
        let mut tx = self.store.begin_write().await?;
        let booking = self.locked(&mut tx, booking_id).await?;
        let captured = |b: &BookingRow| {
            matches!(b.status, BookingStatus::Pending | BookingStatus::Completed)
                && update.partner_reference_id.is_some()
                && b.partner_reference_id == update.partner_reference_id
        };
        match booking.status {
            // A capture retried after a lost answer: the booking as it is, no second fulfilment.
            _ if captured(&booking) => {
                drop(tx);
                return Ok(booking);
            }
            BookingStatus::Uncaptured if now_ms >= booking.capture_deadline_ms => {
                // The window closed before the sweeper came by: time the booking out now.
                transition(
                    &mut tx,
                    &booking,
                    BookingStatus::CaptureTimeout,
                    None,
                    now_ms,
                )
                .await?;
                tx.commit().await?;
                return Err(BookingError::state(format!(
                    "booking {booking_id} cannot be captured: its capture window closed at {} (status is now CAPTURE_TIMEOUT)",
                    local_in(booking.time_zone, booking.capture_deadline_ms)
                        .format(LOCALIZED_FORMAT)
                )));
            }
            BookingStatus::Uncaptured => {}
            other => {
                return Err(BookingError::state(format!(
                    "booking {booking_id} is {other}; only an UNCAPTURED booking can be captured"
                )));
            }
        }
        transition(&mut tx, &booking, BookingStatus::Pending, None, now_ms).await?;
        sqlx::query("UPDATE bookings SET partner_reference_id = $1 WHERE id = $2")
            .bind(&update.partner_reference_id)
            .bind(booking_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO fulfilment_jobs (booking_id, step_index, next_attempt_ms, state) VALUES ($1, 0, $2, $3)")
            .bind(booking_id)
            .bind(now_ms)
            .bind(fulfilment::JobState::Running.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        metrics::counter!("capstan_booking_captures_total", "environment" => env.as_str())
            .increment(1);
        self.get(env, partner_id, id).await
    }

    /// The booking `id` read in `tx` for a change: locked on PostgreSQL (`FOR UPDATE`) until
    /// the transaction ends, so a concurrent change waits and then reads what this one wrote;
    /// SQLite's write transaction holds the one write lock already.
    async fn locked(&self, tx: &mut Tx<'_>, id: i64) -> Result<BookingRow, BookingError> {
        let lock = match self.store.backend() {
            capstan_store::Backend::Postgres => " FOR UPDATE",
            capstan_store::Backend::Sqlite => "",
        };
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{SELECT_BOOKING} WHERE id = $1{lock}"
        )))
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?
        .ok_or_else(|| BookingError::not_found(format!("booking {id} does not exist")))?;
        BookingRow::from_row(&row)
    }

    /// Cancels a booking under its policy: UNCAPTURED always; PENDING or COMPLETED while the
    /// product is cancellable and the cut-off before the start has not passed. Seats return.
    pub async fn cancel(
        &self,
        env: Environment,
        partner_id: &str,
        id: &str,
        reason: Option<String>,
    ) -> Result<BookingRow, BookingError> {
        let booking_id = self.get(env, partner_id, id).await?.id;
        let now_ms = self.now_ms();
        let mut tx = self.store.begin_write().await?;
        let booking = self.locked(&mut tx, booking_id).await?;
        match booking.status {
            BookingStatus::Uncaptured => {}
            BookingStatus::Pending | BookingStatus::Completed => {
                let policy: catalog::CancellationPolicy =
                    serde_json::from_value(booking.policy["cancellation"].clone())
                        .map_err(BookingError::internal)?;
                if !policy.cancellable {
                    return Err(BookingError::state(format!(
                        "booking {} is not cancellable under the product's policy",
                        booking.id
                    )));
                }
                let minutes = policy.cancellable_up_to_in_minutes.unwrap_or(0);
                let cutoff = booking.cutoff_ms(minutes)?;
                if now_ms > cutoff {
                    return Err(BookingError::state(format!(
                        "booking {} could be cancelled until {} ({minutes} minutes before the start)",
                        booking.id,
                        local_in(booking.time_zone, cutoff).format(LOCALIZED_FORMAT),
                    )));
                }
            }
            other => {
                return Err(BookingError::state(format!(
                    "booking {} is {other} and cannot be cancelled",
                    booking.id
                )));
            }
        }
        transition(&mut tx, &booking, BookingStatus::Cancelled, None, now_ms).await?;
        sqlx::query("UPDATE bookings SET cancel_reason = $1 WHERE id = $2")
            .bind(reason)
            .bind(booking.id)
            .execute(&mut *tx)
            .await?;
        // What fulfilment did (or may be doing) is undone, backward: from the step after the
        // last that finished when the pipeline ran through, else from the step in progress
        // (its effects may have happened). The lease of a step still running elsewhere is
        // kept, so the undo starts only once that step has stopped.
        sqlx::query(
            "UPDATE fulfilment_jobs SET state = $1, attempts = 0, next_attempt_ms = $2, last_error = NULL,
                step_index = CASE WHEN state = $3 THEN step_index - 1 ELSE step_index END
             WHERE booking_id = $4 AND state IN ($5, $3)",
        )
        .bind(fulfilment::JobState::Compensating.as_str())
        .bind(now_ms)
        .bind(fulfilment::JobState::Done.as_str())
        .bind(booking.id)
        .bind(fulfilment::JobState::Running.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.get(env, partner_id, id).await
    }

    /// Moves a booking to another slot of the same variant under the reschedule policy: the new
    /// slot's seats are taken and the old ones returned in one transaction.
    pub async fn reschedule(
        &self,
        env: Environment,
        partner_id: &str,
        id: &str,
        inventory_id: &str,
    ) -> Result<BookingRow, BookingError> {
        let booking_id = self.get(env, partner_id, id).await?.id;
        let now_ms = self.now_ms();
        let catalog = self.catalog();
        let mut tx = self.store.begin_write().await?;
        let booking = self.locked(&mut tx, booking_id).await?;
        let now = local_in(booking.time_zone, now_ms);
        if !booking.status.may_reschedule() {
            return Err(BookingError::state(format!(
                "booking {} is {} and cannot be rescheduled",
                booking.id, booking.status
            )));
        }
        if booking.seat_info.is_some() {
            return Err(BookingError::state(
                "seatmap bookings are rescheduled by cancelling and booking new seats",
            ));
        }
        let policy: catalog::ReschedulePolicy =
            serde_json::from_value(booking.policy["reschedule"].clone())
                .map_err(BookingError::internal)?;
        if !policy.reschedulable {
            return Err(BookingError::state(format!(
                "booking {} is not reschedulable under the product's policy",
                booking.id
            )));
        }
        let cutoff = booking.cutoff_ms(policy.reschedulable_up_to_in_minutes.unwrap_or(0))?;
        if now_ms > cutoff {
            return Err(BookingError::state(format!(
                "booking {} could be rescheduled until {}",
                booking.id,
                local_in(booking.time_zone, cutoff).format(LOCALIZED_FORMAT)
            )));
        }
        let (_, variant) = catalog.variant(&booking.variant_id).ok_or_else(|| {
            BookingError::state("the booking's variant is no longer in the catalog")
        })?;
        let slot = catalog
            .find_slot(variant, inventory_id, now)
            .ok_or_else(|| {
                BookingError::not_found(format!(
                    "inventory `{inventory_id}` is not an open slot of variant `{}`",
                    variant.id
                ))
            })?;
        if slot.id == booking.slot_id {
            return Err(BookingError::invalid("the booking is already in that slot"));
        }
        transition(&mut tx, &booking, booking.status, Some(&slot), now_ms).await?;
        tx.commit().await?;
        self.get(env, partner_id, id).await
    }

    /// The sweeper: every UNCAPTURED booking whose window closed becomes CAPTURE_TIMEOUT and gives
    /// its seats back. Returns how many were timed out.
    pub async fn expire_due(&self, limit: i64) -> Result<usize, BookingError> {
        let now_ms = self.now_ms();
        let due: Vec<(i64,)> = sqlx::query_as(
            "SELECT id FROM bookings WHERE status = $1 AND capture_deadline_ms <= $2 ORDER BY capture_deadline_ms LIMIT $3",
        )
        .bind(BookingStatus::Uncaptured.as_str())
        .bind(now_ms)
        .bind(limit)
        .fetch_all(self.store.pool())
        .await?;
        let mut count = 0;
        for (id,) in due {
            let mut tx = self.store.begin_write().await?;
            let booking = self.locked(&mut tx, id).await?;
            // Captured or cancelled since the read: no longer the sweeper's.
            if booking.status != BookingStatus::Uncaptured || booking.capture_deadline_ms > now_ms {
                continue;
            }
            transition(
                &mut tx,
                &booking,
                BookingStatus::CaptureTimeout,
                None,
                now_ms,
            )
            .await?;
            tx.commit().await?;
            count += 1;
        }
        Ok(count)
    }

    /// The next time the sweeper has work, if any.
    pub async fn next_deadline(&self) -> Result<Option<i64>, BookingError> {
        let (next,): (Option<i64>,) =
            sqlx::query_as("SELECT MIN(capture_deadline_ms) FROM bookings WHERE status = $1")
                .bind(BookingStatus::Uncaptured.as_str())
                .fetch_one(self.store.pool())
                .await?;
        Ok(next)
    }

    /// The open slot `inventory_id` of the seatmap variant `variant_id` and its map.
    fn seatmap_slot<'c>(
        &self,
        catalog: &'c Catalog,
        variant_id: &str,
        inventory_id: &str,
    ) -> Result<(catalog::Slot, &'c catalog::Seatmap), BookingError> {
        let (product, variant) = catalog.variant(variant_id).ok_or_else(|| {
            BookingError::not_found(format!("variant `{variant_id}` does not exist"))
        })?;
        let map = variant.seatmap.as_ref().ok_or_else(|| {
            BookingError::invalid(format!(
                "variant `{variant_id}` is not sold by seat (it has no seatmap)"
            ))
        })?;
        let now = local_in(catalog.zone(product), self.now_ms());
        let slot = catalog
            .find_slot(variant, inventory_id, now)
            .ok_or_else(|| {
                BookingError::not_found(format!(
                    "inventory `{inventory_id}` is not an open slot of variant `{variant_id}`"
                ))
            })?;
        Ok((slot, map))
    }

    /// Seat codes held or sold in a slot.
    async fn seats_held(
        &self,
        env: Environment,
        slot_id: &str,
    ) -> Result<std::collections::HashSet<String>, BookingError> {
        let read =
            Sql::new("SELECT seat_code FROM slot_seats WHERE environment = $1 AND slot_id = $2")
                .arg(env.as_str())
                .arg(slot_id.to_owned());
        Ok(self
            .store
            .fetch_all(read)
            .await?
            .iter()
            .map(|r| r.get::<String, _>(0))
            .collect())
    }

    /// Every seat of a seatmap slot with whether it is free:
    /// `{variantId, inventoryId, total, available, seats: [{section, row, seatNumber, seatCode,
    /// available}]}`.
    pub async fn seatmap(
        &self,
        env: Environment,
        variant_id: &str,
        inventory_id: &str,
    ) -> Result<Value, BookingError> {
        let catalog = self.catalog();
        let (slot, map) = self.seatmap_slot(&catalog, variant_id, inventory_id)?;
        let held = self.seats_held(env, &slot.id).await?;
        let seats: Vec<Value> = map
            .seats()
            .into_iter()
            .map(|mut seat| {
                let free = seat["seatCode"].as_str().is_some_and(|c| !held.contains(c));
                seat["available"] = Value::Bool(free);
                seat
            })
            .collect();
        let available = seats.iter().filter(|s| s["available"] == true).count();
        Ok(json!({
            "variantId": variant_id,
            "inventoryId": slot.id,
            "total": seats.len(),
            "available": available,
            "seats": seats,
        }))
    }

    /// Whether `seat_ids` can be booked together in a seatmap slot now:
    /// `{valid, seats (the known ones, with `available`), unknownSeatIds, takenSeatIds,
    /// duplicateSeatIds}`. Nothing is held: a booking made after may still find one taken.
    pub async fn validate_seats(
        &self,
        env: Environment,
        variant_id: &str,
        inventory_id: &str,
        seat_ids: &[String],
    ) -> Result<Value, BookingError> {
        let catalog = self.catalog();
        let (slot, map) = self.seatmap_slot(&catalog, variant_id, inventory_id)?;
        let held = self.seats_held(env, &slot.id).await?;
        let mut seen = std::collections::HashSet::new();
        let (mut seats, mut unknown, mut taken, mut twice) = (vec![], vec![], vec![], vec![]);
        for id in seat_ids {
            if !seen.insert(id.as_str()) {
                twice.push(id.clone());
                continue;
            }
            match map.seat(id) {
                None => unknown.push(id.clone()),
                Some(mut seat) => {
                    let free = !held.contains(id);
                    if !free {
                        taken.push(id.clone());
                    }
                    seat["available"] = Value::Bool(free);
                    seats.push(seat);
                }
            }
        }
        Ok(json!({
            "valid": !seat_ids.is_empty() && unknown.is_empty() && taken.is_empty() && twice.is_empty(),
            "inventoryId": slot.id,
            "seats": seats,
            "unknownSeatIds": unknown,
            "takenSeatIds": taken,
            "duplicateSeatIds": twice,
        }))
    }

    /// Seats taken (held or sold) in a slot — for tests, benchmarks and the admin.
    pub async fn seats_taken(&self, env: Environment, slot_id: &str) -> Result<u32, BookingError> {
        Ok(self
            .taken(env, &[slot_id.to_owned()])
            .await?
            .get(slot_id)
            .copied()
            .unwrap_or(0))
    }
}

pub(crate) const SELECT_BOOKING: &str = "SELECT id, environment, partner_id, api_version, status, product_id, product_name, product_type,
    variant_id, variant_name, slot_id, start_local, pax, customers, variant_input_fields, seat_info, price_amount,
    price_currency, partner_reference_id, tickets, voucher_url, policy, request_hash, created_ms, capture_deadline_ms,
    updated_ms, time_zone FROM bookings";

/// A booking as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct BookingRow {
    pub id: i64,
    pub environment: String,
    pub partner_id: String,
    pub api_version: i64,
    pub status: BookingStatus,
    pub product_id: String,
    pub product_name: String,
    pub product_type: String,
    pub variant_id: String,
    pub variant_name: String,
    pub slot_id: String,
    pub start_local: String,
    pub pax: u32,
    pub customers: Value,
    pub variant_input_fields: Option<Value>,
    pub seat_info: Option<Value>,
    pub price_amount: f64,
    pub price_currency: String,
    pub partner_reference_id: Option<String>,
    pub tickets: Value,
    pub voucher_url: String,
    pub policy: Value,
    pub request_hash: Option<String>,
    pub created_ms: i64,
    pub capture_deadline_ms: i64,
    pub updated_ms: i64,
    /// The supplier's time zone at sale (its local times are read in it).
    pub time_zone: Tz,
}

fn json_col(s: Option<String>) -> Option<Value> {
    s.and_then(|s| serde_json::from_str(&s).ok())
}

impl BookingRow {
    pub(crate) fn from_row(r: &sqlx::any::AnyRow) -> Result<Self, BookingError> {
        let status: String = r.get("status");
        let status = BookingStatus::parse(&status).ok_or_else(|| {
            BookingError::internal(format!("a booking has the unknown status `{status}`"))
        })?;
        Ok(Self {
            id: r.get("id"),
            environment: r.get("environment"),
            partner_id: r.get("partner_id"),
            api_version: r.get("api_version"),
            status,
            product_id: r.get("product_id"),
            product_name: r.get("product_name"),
            product_type: r.get("product_type"),
            variant_id: r.get("variant_id"),
            variant_name: r.get("variant_name"),
            slot_id: r.get("slot_id"),
            start_local: r.get("start_local"),
            pax: r.get::<i64, _>("pax") as u32,
            customers: json_col(r.get("customers")).unwrap_or(Value::Null),
            variant_input_fields: json_col(r.get("variant_input_fields")),
            seat_info: json_col(r.get("seat_info")),
            price_amount: r.get("price_amount"),
            price_currency: r.get("price_currency"),
            partner_reference_id: r.get("partner_reference_id"),
            tickets: json_col(r.get("tickets")).unwrap_or_else(|| json!([])),
            voucher_url: r.get("voucher_url"),
            policy: json_col(r.get("policy")).unwrap_or(Value::Null),
            request_hash: r.get("request_hash"),
            created_ms: r.get("created_ms"),
            capture_deadline_ms: r.get("capture_deadline_ms"),
            updated_ms: r.get("updated_ms"),
            time_zone: r
                .get::<String, _>("time_zone")
                .parse()
                .map_err(|e| BookingError::internal(format!("a booking's time zone: {e}")))?,
        })
    }

    /// The start as the supplier's wall-clock time.
    pub fn start(&self) -> Result<chrono::NaiveDateTime, BookingError> {
        chrono::NaiveDateTime::parse_from_str(&self.start_local, LOCAL_FORMAT)
            .map_err(BookingError::internal)
    }

    /// The instant (epoch ms) `minutes` before the start: a policy's cut-off, counted in real
    /// time (across a change of the clocks, 24 hours before is 24 hours before).
    pub fn cutoff_ms(&self, minutes: i64) -> Result<i64, BookingError> {
        Ok(instant(self.time_zone, self.start()?).timestamp_millis() - minutes * 60_000)
    }

    /// The environment the booking lives in.
    pub fn env(&self) -> Environment {
        Environment::parse(&self.environment).unwrap_or(Environment::Production)
    }

    /// The documented Booking shape (`v2` adds `variantInputFields`).
    pub fn to_json(&self, v2: bool) -> Value {
        let mut out = json!({
            "bookingId": self.id.to_string(),
            "partnerReferenceId": self.partner_reference_id,
            "variantId": self.variant_id,
            "startDateTime": self.start_local,
            "startTime": self.start().map(|t| iso_in(self.time_zone, t)).unwrap_or_default(),
            "startTimeLocal": self.start().map(|t| t.format(LOCALIZED_FORMAT).to_string()).unwrap_or_default(),
            "dateCreated": iso_at(self.time_zone, self.created_ms),
            "dateUpdated": iso_at(self.time_zone, self.updated_ms),
            "product": {"id": self.product_id, "name": self.product_name, "variant": {"id": self.variant_id, "name": self.variant_name}},
            "customersDetails": self.customers,
            "seatInfo": self.seat_info,
            "price": {"amount": self.price_amount, "currencyCode": self.price_currency},
            "status": self.status.as_str(),
            "voucherUrl": self.voucher_url,
            "tickets": self.tickets,
            "creationTimestamp": self.created_ms,
        });
        if v2 {
            out["variantInputFields"] = self.variant_input_fields.clone().unwrap_or(Value::Null);
        }
        out
    }
}

struct Checked {
    zone: Tz,
    product_name: String,
    product_type: String,
    variant_name: String,
    slot: catalog::Slot,
    pax: u32,
    amount: f64,
    currency: String,
    customers: Value,
    seat_info: Option<Value>,
    variant_input_fields: Option<Value>,
    policy: Value,
}

/// What a create inserts, checked.
struct CreateParts<'a> {
    env: Environment,
    partner_id: &'a str,
    api_version: u8,
    req: &'a CreateBooking,
    checked: &'a Checked,
    idempotency_key: Option<&'a str>,
    request_hash: &'a str,
    now_ms: i64,
}

/// What a create's commit came to.
enum Inserted {
    /// This booking id.
    New(i64),
    /// A concurrent create with the same Idempotency-Key and request committed first.
    Existing(Box<BookingRow>),
}

/// A new booking id: twelve random digits (the first not 0) from the OS generator.
fn booking_id() -> i64 {
    const FIRST: u64 = 100_000_000_000;
    let draw = u64::from_le_bytes(capstan_core::secrets::random_bytes::<8>());
    i64::try_from(FIRST + draw % (9 * FIRST)).unwrap_or(i64::MAX)
}

fn parse_id(id: &str) -> Result<i64, BookingError> {
    id.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
        BookingError::invalid(format!(
            "`{id}` is not a valid booking id (a positive integer)"
        ))
    })
}

fn check_field(
    catalog: &Catalog,
    variant_id: &str,
    field: &catalog::InputField,
    value: &str,
    at: &str,
) -> Result<(), BookingError> {
    let v = &field.validation;
    if value.is_empty() {
        return Ok(()); // `required` is checked by the caller.
    }
    let chars = value.chars().count() as u32;
    if let Some(min) = v.min_length
        && chars < min
    {
        return Err(BookingError::invalid(format!(
            "{at} `{}`: at least {min} characters",
            field.id
        )));
    }
    if let Some(max) = v.max_length
        && chars > max
    {
        return Err(BookingError::invalid(format!(
            "{at} `{}`: at most {max} characters",
            field.id
        )));
    }
    if let Some(re) = catalog.field_regex(variant_id, &field.id)
        && !re.is_match(value)
    {
        return Err(BookingError::invalid(format!(
            "{at} `{}`: `{value}` does not match {}",
            field.id,
            re.as_str()
        )));
    }
    if v.min_value.is_some() || v.max_value.is_some() {
        let n: f64 = value.trim().parse().map_err(|_| {
            BookingError::invalid(format!("{at} `{}`: `{value}` is not a number", field.id))
        })?;
        if v.min_value.is_some_and(|m| n < m) || v.max_value.is_some_and(|m| n > m) {
            return Err(BookingError::invalid(format!(
                "{at} `{}`: {n} is outside {}–{}",
                field.id,
                v.min_value.map_or("-∞".into(), |m| m.to_string()),
                v.max_value.map_or("∞".into(), |m| m.to_string())
            )));
        }
    }
    if let Some(values) = &v.values
        && !values.is_empty()
        && !values.iter().any(|x| x == value)
    {
        return Err(BookingError::invalid(format!(
            "{at} `{}`: `{value}` is not one of {}",
            field.id,
            values.join(", ")
        )));
    }
    Ok(())
}

/// The price of a booking in `currency`: per person, the sum of each customer's converted price;
/// per group, the smallest group that fits (or enough of the largest).
pub fn price_of(
    catalog: &Catalog,
    variant: &catalog::Variant,
    customers: &[request::Customer],
    currency: &catalog::Currency,
) -> f64 {
    let total = if variant.profile_type == "PER_GROUP" {
        let pax = customers.len() as u32;
        let fitting = variant
            .groups
            .iter()
            .filter(|g| g.size >= pax)
            .min_by(|a, b| a.price.total_cmp(&b.price));
        match fitting {
            Some(g) => catalog.convert(g.price, currency),
            None => match variant.groups.iter().max_by_key(|g| g.size) {
                Some(g) => {
                    catalog.convert(g.price, currency) * f64::from(pax.div_ceil(g.size.max(1)))
                }
                None => 0.0,
            },
        }
    } else {
        customers
            .iter()
            .filter_map(|c| variant.persons.iter().find(|p| p.kind == c.person_type))
            .map(|p| catalog.convert(p.price, currency))
            .sum()
    };
    catalog::round_to(total, currency.precision)
}

type Tx<'a> = sqlx::Transaction<'a, sqlx::Any>;

/// Takes `pax` seats of a slot or answers 409 `E_INVENTORY_UNAVAILABLE` with what remains.
/// A slot's usage row, made on its first booking; its capacity the catalog's, never below what
/// is taken. Both ways of creating a booking (`take_seats`, `Bookings::create_grouped`) check
/// room against the capacity it sets.
const SLOT_USAGE: &str = "INSERT INTO slot_usage (environment, slot_id, capacity, taken) VALUES ($1, $2, $3, 0)
     ON CONFLICT (environment, slot_id) DO UPDATE SET capacity = CASE WHEN excluded.capacity > slot_usage.taken THEN excluded.capacity ELSE slot_usage.taken END";

async fn take_seats(
    tx: &mut Tx<'_>,
    env: Environment,
    slot_id: &str,
    capacity: u32,
    pax: u32,
) -> Result<(), BookingError> {
    sqlx::query(SLOT_USAGE)
        .bind(env.as_str())
        .bind(slot_id)
        .bind(i64::from(capacity))
        .execute(&mut **tx)
        .await?;
    let sold = sqlx::query("UPDATE slot_usage SET taken = taken + $1 WHERE environment = $2 AND slot_id = $3 AND taken + $4 <= capacity")
        .bind(i64::from(pax))
        .bind(env.as_str())
        .bind(slot_id)
        .bind(i64::from(pax))
        .execute(&mut **tx)
        .await?;
    if sold.rows_affected() == 0 {
        let (capacity, taken): (i64, i64) = sqlx::query_as(
            "SELECT capacity, taken FROM slot_usage WHERE environment = $1 AND slot_id = $2",
        )
        .bind(env.as_str())
        .bind(slot_id)
        .fetch_one(&mut **tx)
        .await?;
        return Err(seats_unavailable(slot_id, capacity - taken, pax));
    }
    Ok(())
}

/// 409 `E_INVENTORY_UNAVAILABLE` for a named seat another booking holds.
fn seat_taken(seat: &str) -> BookingError {
    metrics::counter!("capstan_booking_refusals_total", "reason" => "seat_taken").increment(1);
    BookingError::new(
        409,
        "E_INVENTORY_UNAVAILABLE",
        format!("seat `{seat}` is already taken"),
    )
}

/// 409 `E_INVENTORY_UNAVAILABLE` with what remains.
fn seats_unavailable(slot_id: &str, remaining: i64, pax: u32) -> BookingError {
    metrics::counter!("capstan_booking_refusals_total", "reason" => "seats").increment(1);
    let mut err = BookingError::new(
        409,
        "E_INVENTORY_UNAVAILABLE",
        format!("slot `{slot_id}` has {remaining} seat(s) left; {pax} requested"),
    );
    err.details = Some(json!({"remaining": remaining}));
    err
}

/// Returns the seats `booking` holds in `slot_id` (and its named seats there).
async fn release_seats(
    tx: &mut Tx<'_>,
    booking: &BookingRow,
    slot_id: &str,
) -> Result<(), BookingError> {
    let env = booking.env();
    let released = sqlx::query("UPDATE slot_usage SET taken = taken - $1 WHERE environment = $2 AND slot_id = $3 AND taken >= $4")
        .bind(i64::from(booking.pax))
        .bind(env.as_str())
        .bind(slot_id)
        .bind(i64::from(booking.pax))
        .execute(&mut **tx)
        .await?;
    if released.rows_affected() != 1 {
        // The ledger and the bookings disagree: refuse rather than make it worse.
        return Err(BookingError::internal(format!(
            "slot `{slot_id}` holds fewer seats than booking {} had",
            booking.id
        )));
    }
    sqlx::query("DELETE FROM slot_seats WHERE environment = $1 AND booking_id = $2")
        .bind(env.as_str())
        .bind(booking.id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Moves `booking`, as read locked in `tx` ([`Bookings::locked`]), to status `to` and, for a
/// reschedule, to `slot`, and moves exactly the seats it held: returned when `to` holds none,
/// taken in the new slot and returned in the old one when it moves. The update is guarded by
/// the status and slot read (compare-and-set), so a move decided on a stale read changes
/// nothing and answers 409. A status change is recorded (history and webhooks).
pub(crate) async fn transition(
    tx: &mut Tx<'_>,
    booking: &BookingRow,
    to: BookingStatus,
    slot: Option<&catalog::Slot>,
    now_ms: i64,
) -> Result<(), BookingError> {
    let from = booking.status;
    let legal = if to == from {
        slot.is_some() && from.may_reschedule()
    } else {
        from.may_become(to)
    };
    if !legal {
        return Err(BookingError::state(format!(
            "booking {} is {from} and cannot become {to}",
            booking.id
        )));
    }
    let (slot_id, start_local) = match slot {
        Some(s) => (s.id.clone(), s.start.format(LOCAL_FORMAT).to_string()),
        None => (booking.slot_id.clone(), booking.start_local.clone()),
    };
    let moved = sqlx::query(
        "UPDATE bookings SET status = $1, slot_id = $2, start_local = $3, updated_ms = $4
         WHERE id = $5 AND status = $6 AND slot_id = $7",
    )
    .bind(to.as_str())
    .bind(&slot_id)
    .bind(&start_local)
    .bind(now_ms)
    .bind(booking.id)
    .bind(from.as_str())
    .bind(&booking.slot_id)
    .execute(&mut **tx)
    .await?;
    if moved.rows_affected() != 1 {
        return Err(BookingError::state(format!(
            "booking {} changed meanwhile; read it again",
            booking.id
        )));
    }
    if let Some(new) = slot {
        // Slot rows in one order (by id) in every transaction, so two reschedules crossing
        // between the same slots never wait on each other on PostgreSQL (a deadlock). Giving
        // back first is safe: a take that fails rolls the whole transaction back.
        if new.id < booking.slot_id {
            take_seats(tx, booking.env(), &new.id, new.capacity, booking.pax).await?;
            release_seats(tx, booking, &booking.slot_id).await?;
        } else {
            release_seats(tx, booking, &booking.slot_id).await?;
            take_seats(tx, booking.env(), &new.id, new.capacity, booking.pax).await?;
        }
    } else if from.holds_seats() && !to.holds_seats() {
        release_seats(tx, booking, &booking.slot_id).await?;
    }
    if to != from {
        record_status(
            tx,
            booking.env(),
            &booking.partner_id,
            booking.id,
            to,
            booking.time_zone,
            now_ms,
        )
        .await?;
    }
    Ok(())
}

/// Appends the status change to the booking's history and, except for UNCAPTURED, queues one
/// webhook delivery per enabled webhook of the partner — in the caller's transaction.
pub(crate) async fn record_status(
    tx: &mut Tx<'_>,
    env: Environment,
    partner_id: &str,
    booking_id: i64,
    status: BookingStatus,
    zone: Tz,
    now_ms: i64,
) -> Result<(), BookingError> {
    // The document's eventTimestamp: the supplier's local time, ISO 8601 without a zone.
    let event_local = local_in(zone, now_ms)
        .format("%Y-%m-%dT%H:%M:%S%.3f")
        .to_string();
    let seq: i64 = sqlx::query("INSERT INTO booking_events (booking_id, status, at_ms, event_local) VALUES ($1, $2, $3, $4) RETURNING seq")
        .bind(booking_id)
        .bind(status.as_str())
        .bind(now_ms)
        .bind(&event_local)
        .fetch_one(&mut **tx)
        .await?
        .get(0);
    if status == BookingStatus::Uncaptured {
        return Ok(());
    }
    let payload =
        json!({"bookingId": booking_id, "status": status.as_str(), "eventTimestamp": event_local})
            .to_string();
    sqlx::query(
        "INSERT INTO booking_webhook_deliveries (webhook_id, booking_id, event_seq, payload, message_id, status, next_attempt_ms, created_ms)
         SELECT id, $1, $2, $3, 'msg_bk_' || $4 || '_' || id, 'pending', $5, $6 FROM booking_webhooks
         WHERE environment = $7 AND partner_id = $8 AND enabled = 1 AND deleted_ms IS NULL",
    )
    .bind(booking_id)
    .bind(seq)
    .bind(&payload)
    .bind(seq)
    .bind(now_ms)
    .bind(now_ms)
    .bind(env.as_str())
    .bind(partner_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn empty_catalog() -> Catalog {
    let file = catalog::CatalogFile {
        base_currency: "EUR".into(),
        currencies: vec![catalog::Currency {
            code: "EUR".into(),
            currency_name: "Euro".into(),
            symbol: "€".into(),
            local_symbol: "€".into(),
            precision: 2,
            rate: 1.0,
        }],
        cities: vec![],
        categories: vec![],
        subcategories: vec![],
        collections: vec![],
        products: vec![],
    };
    match Catalog::new(file) {
        Ok(c) => c,
        Err(e) => unreachable!("the empty catalog is valid: {e}"),
    }
}
