//! The OpenAPI 3.1 document of the partner API, served at `GET /api/public/openapi.json` on each
//! partner listener (production and sandbox).
//!
//! Paths, parameters and responses come from the `#[utoipa::path]` of the handlers in
//! [`super`], registered with `routes!`. The bodies are built by `capstan_booking::views` and
//! `BookingRow::to_json` as JSON values, so their shapes are described here by types that only
//! document; every object schema is closed (`additionalProperties: false`, see [`close`]), so
//! `tests/tests/partner_openapi.rs` (schemathesis against a live server) fails when a body gains,
//! loses or retypes a field the document does not say.
#![allow(dead_code, non_camel_case_types, clippy::upper_case_acronyms)]

use serde_json::{Value, json};
use std::collections::BTreeMap;
use utoipa::{IntoParams, OpenApi, ToSchema};

/// Where the document is served (on both partner listeners).
pub const PATH: &str = "/api/public/openapi.json";

// ---- errors --------------------------------------------------------------------------------

/// Every error: `{"status": <HTTP status>, "error": {"code", "message", ...}}`.
#[derive(ToSchema)]
pub struct PartnerError {
    /// The HTTP status, repeated.
    #[schema(minimum = 300, maximum = 599)]
    pub status: u16,
    pub error: PartnerErrorBody,
}

/// The error itself. Some codes add members: `currentPrice` (`E_PRICE_MISMATCH`), `remaining`
/// (`E_INVENTORY_UNAVAILABLE`), `retryAfter` (`E_RATE_LIMITED`).
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct PartnerErrorBody {
    pub code: ErrorCode,
    /// What went wrong, for a person.
    pub message: String,
    pub current_price: Option<Price>,
    #[schema(minimum = 0)]
    pub remaining: Option<u32>,
    /// Seconds to wait (also in `Retry-After`).
    #[schema(minimum = 0)]
    pub retry_after: Option<u64>,
}

#[derive(ToSchema)]
pub enum ErrorCode {
    #[schema(rename = "E_MISSING_PARAMETER")]
    MissingParameter,
    #[schema(rename = "E_INVALID_ARGUMENT")]
    InvalidArgument,
    #[schema(rename = "E_UNAUTHORIZED")]
    Unauthorized,
    #[schema(rename = "E_FORBIDDEN")]
    Forbidden,
    #[schema(rename = "E_CORS_NOT_SUPPORTED")]
    CorsNotSupported,
    #[schema(rename = "E_NOT_FOUND")]
    NotFound,
    #[schema(rename = "E_METHOD_NOT_ALLOWED")]
    MethodNotAllowed,
    #[schema(rename = "E_PRICE_MISMATCH")]
    PriceMismatch,
    #[schema(rename = "E_INVENTORY_UNAVAILABLE")]
    InventoryUnavailable,
    #[schema(rename = "E_INVALID_STATE")]
    InvalidState,
    #[schema(rename = "E_IDEMPOTENCY_CONFLICT")]
    IdempotencyConflict,
    #[schema(rename = "E_RATE_LIMITED")]
    RateLimited,
    #[schema(rename = "E_HTTPS_REQUIRED")]
    HttpsRequired,
    #[schema(rename = "E_INTERNAL")]
    Internal,
    #[schema(rename = "E_SERVICE_UNAVAILABLE")]
    ServiceUnavailable,
}

// ---- pagination ----------------------------------------------------------------------------

/// `nextUrl`/`prevUrl` are absolute and keep the request's other query parameters.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct ProductPage {
    pub products: Vec<ProductV2>,
    pub next_url: Option<String>,
    pub prev_url: Option<String>,
    #[schema(minimum = 0)]
    pub total: i64,
    /// `null` on the last page.
    #[schema(minimum = 0)]
    pub next_offset: Option<i64>,
}

macro_rules! page {
    ($name:ident, $item:ty, $doc:literal) => {
        #[doc = $doc]
        #[derive(ToSchema)]
        #[schema(rename_all = "camelCase")]
        pub struct $name {
            pub items: Vec<$item>,
            pub next_url: Option<String>,
            pub prev_url: Option<String>,
            #[schema(minimum = 0)]
            pub total: i64,
            #[schema(minimum = 0)]
            pub next_offset: Option<i64>,
        }
    };
}

page!(CityPage, City, "A page of cities.");
page!(CategoryPage, Category, "A page of categories.");
page!(SubcategoryPage, Subcategory, "A page of subcategories.");
page!(CollectionPage, Collection, "A page of collections.");
page!(ProductV1Page, ProductV1, "A page of v1 products.");
page!(SlotPage, Slot, "A page of inventory slots, earliest first.");
page!(BookingPage, Booking, "A page of bookings, newest first.");
page!(
    BookingV1Page,
    BookingV1,
    "A page of v1 bookings, newest first."
);

// ---- catalog -------------------------------------------------------------------------------

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct City {
    /// Uppercase, e.g. `PARIS`.
    pub code: String,
    pub name: String,
    pub image: Image,
}

#[derive(ToSchema)]
pub struct Image {
    pub url: Option<String>,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Category {
    pub id: String,
    pub name: String,
    pub city_code: String,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Subcategory {
    pub id: String,
    pub name: String,
    pub category_id: String,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Collection {
    pub id: String,
    pub name: String,
    pub city_code: String,
}

#[derive(ToSchema)]
pub struct NamedRef {
    pub id: String,
    pub name: String,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Content {
    pub highlights: Option<String>,
    pub highlights_html: Option<String>,
    pub short_summary: Option<String>,
    pub summary_html: Option<String>,
    pub inclusions: Option<String>,
    pub inclusions_html: Option<String>,
    pub exclusions: Option<String>,
    pub exclusions_html: Option<String>,
    pub faq_html: Option<String>,
    pub ticket_delivery_info_html: Option<String>,
}

#[derive(ToSchema)]
pub struct Media {
    pub url: String,
    /// e.g. `IMAGE`.
    #[schema(rename = "type")]
    pub kind: String,
}

/// A flat location (v2).
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Location {
    pub latitude: f64,
    pub longitude: f64,
    pub address: Option<String>,
    pub city: Option<String>,
    pub postal_code: Option<String>,
    pub country: Option<String>,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct ReviewsSummary {
    #[schema(minimum = 0)]
    pub ratings_count: u64,
    pub average_rating: f64,
}

#[derive(ToSchema)]
pub enum ProfileType {
    #[schema(rename = "PER_PERSON")]
    PerPerson,
    #[schema(rename = "PER_GROUP")]
    PerGroup,
}

/// Prices in the requested currency. `netPrice` is `null` for affiliate partners.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Pricing {
    /// ISO 4217.
    pub currency: String,
    pub profile_type: ProfileType,
    pub platform_selling_price: f64,
    pub net_price: Option<f64>,
}

/// A variant's pricing: the minimums and its price table.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct VariantPricing {
    pub currency: String,
    pub profile_type: ProfileType,
    pub platform_selling_price: f64,
    pub net_price: Option<f64>,
    pub persons: Vec<PersonPrice>,
    pub groups: Vec<GroupPrice>,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct PersonPrice {
    /// e.g. `ADULT`, `CHILD`.
    #[schema(rename = "type")]
    pub kind: String,
    pub name: String,
    pub price: f64,
    pub original_price: f64,
    pub net_price: Option<f64>,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct GroupPrice {
    #[schema(minimum = 1)]
    pub size: u32,
    pub name: String,
    pub price: f64,
    pub original_price: f64,
    pub net_price: Option<f64>,
}

#[derive(ToSchema)]
pub struct PriceTable {
    pub persons: Vec<PersonPrice>,
    pub groups: Vec<GroupPrice>,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct MinimumPrice {
    pub original_price: f64,
    pub final_price: f64,
}

/// Deprecated in v2 (use `pricing`); the v1 `pricing`.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct ListingPrice {
    #[schema(rename = "type")]
    pub kind: ProfileType,
    pub currency_code: String,
    pub minimum_price: MinimumPrice,
    /// Best discount across variants, in percent.
    pub best_discount: f64,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Currency {
    pub code: String,
    pub currency_name: String,
    pub symbol: String,
    pub local_symbol: String,
    /// Digits after the decimal point.
    #[schema(minimum = 0)]
    pub precision: u32,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct CancellationPolicy {
    pub cancellable: bool,
    pub cancellable_up_to_in_minutes: Option<i64>,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct ReschedulePolicy {
    pub reschedulable: bool,
    pub reschedulable_up_to_in_minutes: Option<i64>,
}

#[derive(ToSchema)]
pub struct Pax {
    #[schema(minimum = 1)]
    pub min: u32,
    #[schema(minimum = 1)]
    pub max: u32,
}

#[derive(ToSchema)]
pub struct Cashback {
    pub value: f64,
    /// `ABSOLUTE` or `PERCENTAGE`.
    #[schema(rename = "type")]
    pub kind: String,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct FieldValidation {
    pub regex: Option<String>,
    pub min_length: Option<u32>,
    pub max_length: Option<u32>,
    pub min_value: Option<f64>,
    pub max_value: Option<f64>,
    pub required: bool,
    pub values: Option<Vec<String>>,
}

/// A field the booking must fill, per customer (`level` `PRIMARY_CUSTOMER`, `ALL_CUSTOMERS`)
/// or per booking (`VARIANT`, sent in `variantInputFields`).
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct InputField {
    pub old_id: i64,
    pub id: String,
    pub name: String,
    /// e.g. `STRING`.
    pub data_type: String,
    pub level: String,
    pub validation: FieldValidation,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Variant {
    pub id: String,
    pub name: String,
    pub description: String,
    /// Minutes.
    #[schema(minimum = 0)]
    pub duration: u32,
    /// e.g. `FIXED_START_FIXED_DURATION`.
    pub inventory_type: String,
    pub pax: Pax,
    pub cashback: Option<Cashback>,
    pub ticket_delivery_info_html: Option<String>,
    pub input_fields: Vec<InputField>,
    pub tags: Vec<String>,
    pub cancellation_policy: CancellationPolicy,
    pub reschedule_policy: ReschedulePolicy,
    /// Present in the single-product v2 response and with v1 `fetch-variants`.
    pub pricing: Option<VariantPricing>,
}

/// Product (v2).
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct ProductV2 {
    pub id: String,
    pub name: String,
    pub canonical_url: String,
    pub content: Content,
    pub city: City,
    pub media: Vec<Media>,
    pub start_location: Option<Location>,
    /// `null` when the experience ends where it starts.
    pub end_location: Option<Location>,
    pub product_type: String,
    pub reviews_summary: ReviewsSummary,
    pub pricing: Pricing,
    pub listing_price: ListingPrice,
    pub currency: Currency,
    /// Language code → URL.
    pub locale_specific_urls: BTreeMap<String, String>,
    pub has_instant_confirmation: bool,
    pub has_mobile_ticket: bool,
    pub primary_category: Option<NamedRef>,
    pub secondary_categories: Vec<NamedRef>,
    pub primary_sub_category: Option<Subcategory>,
    pub primary_collection: Option<Collection>,
    pub variants: Vec<Variant>,
    /// e.g. `NORMAL`, `SEATMAP`.
    pub inventory_selection_type: String,
    /// The strictest across variants.
    pub cancellation_policy: CancellationPolicy,
    pub reschedule_policy: ReschedulePolicy,
}

#[derive(ToSchema)]
pub struct Geolocation {
    pub latitude: f64,
    pub longitude: f64,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Address {
    pub address_line1: Option<String>,
    pub address_line2: Option<String>,
    pub city_name: Option<String>,
    pub postal_code: Option<String>,
    pub state: Option<String>,
    pub country_name: Option<String>,
}

/// A nested location (v1).
#[derive(ToSchema)]
pub struct LocationV1 {
    pub geolocation: Geolocation,
    pub address: Address,
}

#[derive(ToSchema)]
pub struct Rating {
    pub avg: f64,
    #[schema(minimum = 0)]
    pub count: u64,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct CategoryV1 {
    pub id: String,
    pub name: String,
    pub city_code: String,
    pub canonical_url: Option<String>,
    pub locale_specific_urls: BTreeMap<String, String>,
}

/// Product (v1): integer id, `images`, `ratingCumulative`, nested locations.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct ProductV1 {
    pub id: i64,
    pub name: String,
    /// A relative path.
    pub url: String,
    pub canonical_url: String,
    pub neighbourhood: Option<String>,
    pub content: Content,
    pub city: City,
    pub display_tags: Vec<String>,
    pub images: Vec<Media>,
    pub start_location: Option<LocationV1>,
    pub end_location: Option<LocationV1>,
    pub product_type: String,
    pub rating_cumulative: Rating,
    /// The cheapest variant's.
    pub pricing: ListingPrice,
    pub currency: Currency,
    pub has_instant_confirmation: bool,
    pub has_mobile_ticket: bool,
    pub primary_category: Option<CategoryV1>,
    pub inventory_selection_type: String,
    /// Empty unless `fetch-variants=true`.
    pub variants: Vec<Variant>,
}

// ---- inventory -----------------------------------------------------------------------------

#[derive(ToSchema)]
pub enum Availability {
    #[schema(rename = "LIMITED")]
    Limited,
    #[schema(rename = "CLOSED")]
    Closed,
}

/// A slot with its live remaining seats. Times are the supplier's city's wall clock
/// (`startDateTime`, `startTimeLocal`) and instants with that city's offset (`startTime`).
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Slot {
    /// The `inventoryId` of a booking.
    pub id: String,
    /// `yyyy-MM-ddTHH:mm:ss`, local, without a zone.
    pub start_date_time: String,
    pub end_date_time: String,
    /// ISO 8601 with the offset in force then.
    #[schema(format = DateTime)]
    pub start_time: String,
    #[schema(format = DateTime)]
    pub end_time: String,
    /// `yyyy-MM-dd HH:mm:ss`, local.
    pub start_time_local: String,
    /// IANA zone, e.g. `Europe/Paris`.
    pub time_zone: String,
    pub availability: Availability,
    #[schema(minimum = 0)]
    pub remaining: u32,
    pub pricing: PriceTable,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Seat {
    pub section: String,
    pub row: String,
    pub seat_number: String,
    /// `<section>-<row>-<seatNumber>`.
    pub seat_code: String,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct SeatWithAvailability {
    pub section: String,
    pub row: String,
    pub seat_number: String,
    pub seat_code: String,
    pub available: bool,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Seatmap {
    pub variant_id: String,
    pub inventory_id: String,
    #[schema(minimum = 0)]
    pub total: u32,
    #[schema(minimum = 0)]
    pub available: u32,
    pub seats: Vec<SeatWithAvailability>,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct ValidateSeatsRequest {
    pub tour_id: String,
    pub inventory_id: String,
    #[schema(max_items = 100)]
    pub seat_ids: Vec<String>,
}

/// Nothing is held: a booking made after may still find a seat taken.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct SeatValidation {
    pub valid: bool,
    pub inventory_id: String,
    pub seats: Vec<SeatWithAvailability>,
    pub unknown_seat_ids: Vec<String>,
    pub taken_seat_ids: Vec<String>,
    pub duplicate_seat_ids: Vec<String>,
}

// ---- bookings ------------------------------------------------------------------------------

#[derive(ToSchema)]
pub enum BookingStatus {
    #[schema(rename = "UNCAPTURED")]
    Uncaptured,
    #[schema(rename = "PENDING")]
    Pending,
    #[schema(rename = "COMPLETED")]
    Completed,
    #[schema(rename = "FAILED")]
    Failed,
    #[schema(rename = "CANCELLED")]
    Cancelled,
    #[schema(rename = "CAPTURE_TIMEOUT")]
    CaptureTimeout,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Price {
    pub amount: f64,
    pub currency_code: String,
}

#[derive(ToSchema)]
pub struct FieldValue {
    pub id: String,
    pub value: String,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Customer {
    /// e.g. `ADULT`.
    pub person_type: String,
    pub is_primary: bool,
    pub input_fields: Vec<FieldValue>,
}

#[derive(ToSchema)]
pub struct CustomersDetails {
    #[schema(minimum = 1)]
    pub count: u32,
    pub customers: Vec<Customer>,
}

/// `POST /api/public/v2/bookings/` (v1: the same without `variantInputFields`).
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct CreateBookingRequest {
    pub product_id: String,
    pub variant_id: String,
    /// A slot `id` from the inventory route.
    pub inventory_id: String,
    /// Seat codes, for a variant sold by seat.
    pub inventory_seat_ids: Option<Vec<String>>,
    pub customers_details: CustomersDetails,
    pub variant_input_fields: Option<Vec<FieldValue>>,
    /// The price the partner expects; a different current price answers 409 `E_PRICE_MISMATCH`.
    pub price: Price,
}

/// `PUT /api/public/v2/bookings/{bookingId}/`: the capture.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct CaptureRequest {
    /// Must be `PENDING`.
    pub status: BookingStatus,
    #[schema(min_length = 1, max_length = 255)]
    pub partner_reference_id: String,
}

/// `PUT /api/public/v1/booking/{id}`: `PENDING` captures, `CANCELLED` cancels.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct UpdateBookingV1Request {
    pub status: BookingStatus,
    #[schema(max_length = 255)]
    pub partner_reference_id: Option<String>,
}

#[derive(ToSchema)]
pub struct CancelRequest {
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
    #[schema(max_length = 1000)]
    pub comment: Option<String>,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct RescheduleRequest {
    /// The new slot, of the same variant.
    pub inventory_id: String,
}

#[derive(ToSchema)]
pub struct Done {
    pub success: bool,
    pub message: String,
}

#[derive(ToSchema)]
pub struct VariantRef {
    pub id: String,
    pub name: String,
}

#[derive(ToSchema)]
pub struct BookedProduct {
    pub id: String,
    pub name: String,
    pub variant: VariantRef,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Ticket {
    pub public_id: String,
    pub url: Option<String>,
    /// e.g. `QRCODE`.
    #[schema(rename = "type")]
    pub kind: String,
}

/// Booking (v2): v1 with `variantInputFields`.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Booking {
    /// Numeric, as a string.
    pub booking_id: String,
    pub partner_reference_id: Option<String>,
    pub variant_id: String,
    /// Local wall clock, `yyyy-MM-ddTHH:mm:ss`.
    pub start_date_time: String,
    /// ISO 8601 with the supplier city's offset.
    pub start_time: String,
    /// `yyyy-MM-dd HH:mm:ss`, local.
    pub start_time_local: String,
    #[schema(format = DateTime)]
    pub date_created: String,
    #[schema(format = DateTime)]
    pub date_updated: String,
    pub product: BookedProduct,
    #[schema(value_type = Object)]
    pub customers_details: Value,
    pub seat_info: Option<Vec<Seat>>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub variant_input_fields: Option<Value>,
    pub price: Price,
    pub status: BookingStatus,
    pub voucher_url: Option<String>,
    pub tickets: Vec<Ticket>,
    /// Epoch milliseconds.
    pub creation_timestamp: i64,
}

/// Booking (v1).
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct BookingV1 {
    pub booking_id: String,
    pub partner_reference_id: Option<String>,
    pub variant_id: String,
    pub start_date_time: String,
    pub start_time: String,
    pub start_time_local: String,
    #[schema(format = DateTime)]
    pub date_created: String,
    #[schema(format = DateTime)]
    pub date_updated: String,
    pub product: BookedProduct,
    #[schema(value_type = Object)]
    pub customers_details: Value,
    pub seat_info: Option<Vec<Seat>>,
    pub price: Price,
    pub status: BookingStatus,
    pub voucher_url: Option<String>,
    pub tickets: Vec<Ticket>,
    pub creation_timestamp: i64,
}

// ---- webhooks ------------------------------------------------------------------------------

#[derive(ToSchema)]
pub struct WebhookRequest {
    /// HTTPS; 1 to 2048 characters.
    #[schema(min_length = 1, max_length = 2048, pattern = "^https://.*")]
    pub url: String,
    /// Default `true`.
    pub enabled: Option<bool>,
}

#[derive(ToSchema)]
pub struct WebhookUpdate {
    #[schema(min_length = 1, max_length = 2048, pattern = "^https://.*")]
    pub url: Option<String>,
    pub enabled: Option<bool>,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Webhook {
    pub id: String,
    pub url: String,
    pub enabled: bool,
    /// Epoch milliseconds.
    pub created_at: i64,
    pub updated_at: i64,
}

/// A new registration: its signing secret (Standard Webhooks, `whsec_…`) is shown only here.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct RegisteredWebhook {
    pub id: String,
    pub url: String,
    pub enabled: bool,
    pub created_at: i64,
    pub updated_at: i64,
    pub secret: String,
}

#[derive(ToSchema)]
pub struct Deleted {
    pub id: String,
}

#[derive(ToSchema)]
pub struct WebhookList {
    pub items: Vec<Webhook>,
}

#[derive(ToSchema)]
pub enum DeliveryStatus {
    #[schema(rename = "pending")]
    Pending,
    #[schema(rename = "delivered")]
    Delivered,
    #[schema(rename = "failed")]
    Failed,
    #[schema(rename = "exhausted")]
    Exhausted,
}

#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct Delivery {
    pub id: String,
    pub booking_id: i64,
    /// The event as sent.
    #[schema(value_type = Object)]
    pub payload: Value,
    /// The `webhook-id` header (the same on every attempt).
    pub webhook_id: String,
    #[schema(minimum = 0)]
    pub attempts: i64,
    pub status: DeliveryStatus,
    pub next_attempt_at: Option<i64>,
    pub response_code: Option<i64>,
    pub last_error: Option<String>,
    pub created_at: i64,
}

#[derive(ToSchema)]
pub struct DeliveryList {
    /// The latest 100, newest first.
    pub items: Vec<Delivery>,
}

/// An empty object: the registration routes' `error` when there is none.
#[derive(ToSchema)]
pub struct NoError {}

macro_rules! envelope {
    ($name:ident, $data:ty, $doc:literal) => {
        #[doc = $doc]
        #[derive(ToSchema)]
        pub struct $name {
            /// Epoch milliseconds.
            pub timestamp: i64,
            pub message: Option<String>,
            pub error: NoError,
            pub data: $data,
        }
    };
}

envelope!(
    RegisteredWebhookEnvelope,
    RegisteredWebhook,
    "The webhook routes' envelope, around a new registration."
);
envelope!(
    WebhookEnvelope,
    Webhook,
    "The webhook routes' envelope, around a registration."
);
envelope!(
    WebhookListEnvelope,
    WebhookList,
    "The webhook routes' envelope, around the partner's registrations."
);
envelope!(
    DeletedEnvelope,
    Deleted,
    "The webhook routes' envelope, around the deleted id."
);
envelope!(
    DeliveryListEnvelope,
    DeliveryList,
    "The webhook routes' envelope, around the latest deliveries."
);

// ---- query parameters ----------------------------------------------------------------------
// Unknown or repeated query parameters answer 400 `E_INVALID_ARGUMENT`.

/// Languages of a single product (`languageCode`, v1 `language`; case-insensitive).
#[derive(ToSchema)]
pub enum Language {
    EN,
    ES,
    FR,
    IT,
    DE,
    PT,
    NL,
    PL,
}

/// Languages of lists: the product languages and ten more (case-insensitive).
#[derive(ToSchema)]
pub enum ListLanguage {
    EN,
    ES,
    FR,
    IT,
    DE,
    PT,
    NL,
    PL,
    KO,
    JA,
    ZH_HANS,
    ZH_HANT,
    AR,
    DA,
    RO,
    RU,
    SV,
    TR,
}

#[derive(IntoParams)]
#[into_params(rename_all = "camelCase", parameter_in = Query)]
pub struct ProductQuery {
    /// Default `EN`.
    pub language_code: Option<Language>,
    /// ISO 4217; default the catalog's base currency.
    pub currency_code: Option<String>,
    pub campaign_name: Option<String>,
}

#[derive(IntoParams)]
#[into_params(rename_all = "camelCase", parameter_in = Query)]
pub struct ProductListQuery {
    /// Uppercase city code.
    pub city_code: Option<String>,
    pub collection_id: Option<String>,
    pub category_id: Option<String>,
    pub sub_category_id: Option<String>,
    pub language_code: Option<ListLanguage>,
    pub currency_code: Option<String>,
    pub campaign_name: Option<String>,
    #[param(minimum = 0)]
    pub offset: Option<i64>,
    /// Default 20; above 100 is capped to 100.
    #[param(minimum = 1)]
    pub limit: Option<i64>,
    /// With `categoryId`: only products whose primary category it is.
    pub primary_category_only: Option<bool>,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProductV1Query {
    #[param(rename = "currencyCode")]
    pub currency_code: Option<String>,
    /// Include the variants with their pricing.
    #[param(rename = "fetch-variants")]
    pub fetch_variants: Option<bool>,
    /// Default `EN`.
    pub language: Option<Language>,
}

#[derive(IntoParams)]
#[into_params(rename_all = "camelCase", parameter_in = Query)]
pub struct CitiesQuery {
    pub language_code: Option<ListLanguage>,
    #[param(minimum = 0)]
    pub offset: Option<i64>,
    /// Default 100; above 500 is capped to 500.
    #[param(minimum = 1)]
    pub limit: Option<i64>,
}

#[derive(IntoParams)]
#[into_params(rename_all = "camelCase", parameter_in = Query)]
pub struct ByCityQuery {
    /// Only this city's (404 for an unknown city).
    pub city_code: Option<String>,
    pub language_code: Option<ListLanguage>,
    #[param(minimum = 0)]
    pub offset: Option<i64>,
    /// Default 100; above 500 is capped to 500.
    #[param(minimum = 1)]
    pub limit: Option<i64>,
}

#[derive(IntoParams)]
#[into_params(rename_all = "camelCase", parameter_in = Query)]
pub struct SubcategoriesQuery {
    pub city_code: Option<String>,
    pub category_id: Option<String>,
    pub language_code: Option<ListLanguage>,
    #[param(minimum = 0)]
    pub offset: Option<i64>,
    /// Default 100; above 500 is capped to 500.
    #[param(minimum = 1)]
    pub limit: Option<i64>,
}

#[derive(IntoParams)]
#[into_params(rename_all = "camelCase", parameter_in = Query)]
pub struct CategoriesV1Query {
    pub city_code: String,
    pub language: Option<ListLanguage>,
    #[param(minimum = 0)]
    pub offset: Option<i64>,
    /// Default 100; above 500 is capped to 500.
    #[param(minimum = 1)]
    pub limit: Option<i64>,
}

#[derive(IntoParams)]
#[into_params(rename_all = "camelCase", parameter_in = Query)]
pub struct ListingByCityQuery {
    pub city_code: String,
    pub language: Option<Language>,
    pub currency_code: Option<String>,
    #[param(minimum = 0)]
    pub offset: Option<i64>,
    /// Default 20; above 100 is capped to 100.
    #[param(minimum = 1)]
    pub limit: Option<i64>,
}

#[derive(IntoParams)]
#[into_params(rename_all = "camelCase", parameter_in = Query)]
pub struct ListingByCategoryQuery {
    pub category_id: String,
    pub language: Option<Language>,
    pub currency_code: Option<String>,
    #[param(minimum = 0)]
    pub offset: Option<i64>,
    /// Default 20; above 100 is capped to 100.
    #[param(minimum = 1)]
    pub limit: Option<i64>,
}

/// Bounds of the window, each as an instant (`startTime`, ISO 8601 with an offset), as the
/// supplier's local time (`startTimeLocal`, `yyyy-MM-dd HH:mm:ss`) or as a local date or
/// date-time (`startDateTime`); the instant wins over the local time, which wins over the date.
#[derive(IntoParams)]
#[into_params(rename_all = "camelCase", parameter_in = Query)]
pub struct WindowQuery {
    pub start_time: Option<String>,
    pub end_time: Option<String>,
    pub start_time_local: Option<String>,
    pub end_time_local: Option<String>,
    /// `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM:SS`, local.
    pub start_date_time: Option<String>,
    pub end_date_time: Option<String>,
    pub currency_code: Option<String>,
    #[param(minimum = 0)]
    pub offset: Option<i64>,
    /// Default 100; above 500 is capped to 500.
    #[param(minimum = 1)]
    pub limit: Option<i64>,
}

#[derive(IntoParams)]
#[into_params(rename_all = "camelCase", parameter_in = Query)]
pub struct TourQuery {
    /// The variant.
    pub tour_id: String,
}

#[derive(IntoParams)]
#[into_params(rename_all = "camelCase", parameter_in = Query)]
pub struct VariantQuery {
    pub variant_id: String,
}

#[derive(IntoParams)]
#[into_params(rename_all = "camelCase", parameter_in = Query)]
pub struct SeatmapQuery {
    /// The variant (sold by seat).
    pub tour_id: String,
    /// The slot.
    pub inventory_id: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BookingListQuery {
    #[param(minimum = 0)]
    pub offset: Option<i64>,
    /// Default 20; above 20 is capped to 20.
    #[param(minimum = 1)]
    pub limit: Option<i64>,
}

// ---- the document --------------------------------------------------------------------------

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Capstan partner catalog and booking API",
        version = "0.1.0",
        description = "The catalog (products, cities, categories, subcategories, collections), inventory, bookings with their two-step capture, seatmaps and booking webhooks. Every route except this document requires `Partner-Auth: <key>` (`pk_` keys in production, `tk_` on the sandbox listener); affiliate partners reach the catalog routes only. Errors have the PartnerError shape. Each path also answers with the other trailing-slash form, and the `/api/public/v1` paths under the legacy prefix `/api/v1`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "catalog", description = "Products, cities, categories, subcategories and collections."),
        (name = "inventory", description = "Slots with live availability, and seatmaps."),
        (name = "bookings", description = "Create (UNCAPTURED), capture (PENDING), read, cancel, reschedule."),
        (name = "webhooks", description = "Booking status webhooks (Standard Webhooks signatures)."),
        (name = "meta", description = "This document."),
    ),
    components(schemas(PartnerError, ErrorCode, Language, ListLanguage)),
)]
pub struct Base;

#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "meta",
    operation_id = "getPartnerOpenApiDocument",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API.", body = Object, content_type = "application/json")),
)]
pub async fn serve() -> axum::Json<&'static Value> {
    axum::Json(document())
}

/// The document, built once from [`super::routes`].
pub fn document() -> &'static Value {
    static DOCUMENT: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let (_, api) = super::routes().split_for_parts();
        finish(serde_json::to_value(&api).unwrap_or_else(|_| json!({})))
    })
}

fn finish(mut doc: Value) -> Value {
    doc["openapi"] = json!("3.1.0");
    let error = json!({"$ref": "#/components/schemas/PartnerError"});
    doc["components"]["securitySchemes"] = json!({
        "partnerAuth": {"type": "apiKey", "in": "header", "name": "Partner-Auth", "description": "A partner key: `pk_…` in production, `tk_…` on the sandbox."},
    });
    let retry_after = json!({"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer", "minimum": 0}}});
    doc["components"]["responses"] = json!({
        "Unauthorized": {"description": "`E_UNAUTHORIZED`: the Partner-Auth key is missing, unknown, revoked or of the other environment.", "content": {"application/json": {"schema": error}}},
        "RateLimited": {"description": "`E_RATE_LIMITED`: this key made too many requests.", "headers": retry_after, "content": {"application/json": {"schema": error}}},
        "Internal": {"description": "`E_INTERNAL`: an unexpected error.", "content": {"application/json": {"schema": error}}},
        "Unavailable": {"description": "`E_SERVICE_UNAVAILABLE`: storage did not answer in time; retry.", "content": {"application/json": {"schema": error}}},
    });
    if let Some(schemas) = doc["components"]["schemas"].as_object_mut() {
        schemas.values_mut().for_each(close);
    }
    crate::v1::openapi::common_responses(&mut doc);
    doc
}

/// `additionalProperties: false` on every object schema that lists its properties and says
/// nothing of others, inline ones included: a body with an undocumented member fails the check.
fn close(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            map.values_mut().for_each(close);
        }
        Value::Array(items) => items.iter_mut().for_each(close),
        _ => {}
    }
}
