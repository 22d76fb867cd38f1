//! The catalog: the file format of `capstan catalog import` (docs/catalog-format.md), its
//! validation (every problem with its JSON path, at once), and the in-memory index the partner API
//! reads from.

use chrono::{
    DateTime, Datelike, Duration, NaiveDate, NaiveDateTime, NaiveTime, Offset, TimeZone, Utc,
};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};

pub const PRODUCT_TYPES: [&str; 7] = [
    "TOUR",
    "ACTIVITY",
    "EVENT",
    "ATTRACTION",
    "TRANSFER",
    "AIRPORT_TRANSFER",
    "ADD_ON",
];
/// Languages of the single-product routes.
pub const PRODUCT_LANGUAGES: [&str; 8] = ["EN", "ES", "FR", "IT", "DE", "PT", "NL", "PL"];
/// Languages the product list accepts on top of [`PRODUCT_LANGUAGES`].
pub const EXTRA_LIST_LANGUAGES: [&str; 10] = [
    "KO", "JA", "ZH_HANS", "ZH_HANT", "AR", "DA", "RO", "RU", "SV", "TR",
];
pub const LOCAL_FORMAT: &str = "%Y-%m-%dT%H:%M:%S";

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CatalogFile {
    pub base_currency: String,
    pub currencies: Vec<Currency>,
    #[serde(default)]
    pub cities: Vec<City>,
    #[serde(default)]
    pub categories: Vec<Category>,
    #[serde(default)]
    pub subcategories: Vec<Subcategory>,
    #[serde(default)]
    pub collections: Vec<Collection>,
    #[serde(default)]
    pub products: Vec<Product>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Currency {
    pub code: String,
    pub currency_name: String,
    pub symbol: String,
    pub local_symbol: String,
    pub precision: u32,
    pub rate: f64,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NameTranslation {
    pub name: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct City {
    pub code: String,
    pub name: String,
    /// The IANA time zone of the city's suppliers (`Europe/Rome`): the catalog's local times
    /// (slots, schedules) are wall-clock times there.
    pub time_zone: String,
    #[serde(default)]
    pub image_url: Option<String>,
    #[serde(default)]
    pub translations: BTreeMap<String, NameTranslation>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Category {
    pub id: String,
    pub name: String,
    pub city_code: String,
    #[serde(default)]
    pub translations: BTreeMap<String, NameTranslation>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Subcategory {
    pub id: String,
    pub name: String,
    pub category_id: String,
    #[serde(default)]
    pub translations: BTreeMap<String, NameTranslation>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Collection {
    pub id: String,
    pub name: String,
    pub city_code: String,
    #[serde(default)]
    pub translations: BTreeMap<String, NameTranslation>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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

impl Content {
    /// `self` with every missing field taken from `fallback` (English).
    fn or(&self, fallback: &Content) -> Content {
        fn pick(a: &Option<String>, b: &Option<String>) -> Option<String> {
            a.clone().or_else(|| b.clone())
        }
        Content {
            highlights: pick(&self.highlights, &fallback.highlights),
            highlights_html: pick(&self.highlights_html, &fallback.highlights_html),
            short_summary: pick(&self.short_summary, &fallback.short_summary),
            summary_html: pick(&self.summary_html, &fallback.summary_html),
            inclusions: pick(&self.inclusions, &fallback.inclusions),
            inclusions_html: pick(&self.inclusions_html, &fallback.inclusions_html),
            exclusions: pick(&self.exclusions, &fallback.exclusions),
            exclusions_html: pick(&self.exclusions_html, &fallback.exclusions_html),
            faq_html: pick(&self.faq_html, &fallback.faq_html),
            ticket_delivery_info_html: pick(
                &self.ticket_delivery_info_html,
                &fallback.ticket_delivery_info_html,
            ),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProductTranslation {
    pub name: Option<String>,
    #[serde(default)]
    pub content: Content,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Location {
    pub latitude: f64,
    pub longitude: f64,
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub city: Option<String>,
    #[serde(default)]
    pub postal_code: Option<String>,
    #[serde(default)]
    pub country: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Media {
    pub url: String,
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReviewsSummary {
    pub ratings_count: u64,
    pub average_rating: f64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Product {
    pub id: String,
    pub name: String,
    pub product_type: String,
    pub city_code: String,
    #[serde(default)]
    pub canonical_url: String,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub neighbourhood: Option<String>,
    #[serde(default)]
    pub display_tags: Vec<String>,
    #[serde(default)]
    pub content: Content,
    #[serde(default)]
    pub translations: BTreeMap<String, ProductTranslation>,
    #[serde(default)]
    pub media: Vec<Media>,
    pub start_location: Option<Location>,
    #[serde(default)]
    pub end_location: Option<Location>,
    #[serde(default)]
    pub reviews_summary: ReviewsSummary,
    #[serde(default)]
    pub has_instant_confirmation: bool,
    #[serde(default)]
    pub has_mobile_ticket: bool,
    pub primary_category_id: String,
    #[serde(default)]
    pub secondary_category_ids: Vec<String>,
    #[serde(default)]
    pub primary_sub_category_id: Option<String>,
    #[serde(default)]
    pub sub_category_ids: Vec<String>,
    #[serde(default)]
    pub primary_collection_id: Option<String>,
    #[serde(default)]
    pub collection_ids: Vec<String>,
    #[serde(default)]
    pub locale_specific_urls: BTreeMap<String, String>,
    #[serde(default = "normal")]
    pub inventory_selection_type: String,
    pub variants: Vec<Variant>,
}

fn normal() -> String {
    "NORMAL".to_owned()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pax {
    pub min: u32,
    pub max: u32,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cashback {
    pub value: f64,
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FieldValidation {
    #[serde(default)]
    pub regex: Option<String>,
    #[serde(default)]
    pub min_length: Option<u32>,
    #[serde(default)]
    pub max_length: Option<u32>,
    #[serde(default)]
    pub min_value: Option<f64>,
    #[serde(default)]
    pub max_value: Option<f64>,
    #[serde(default)]
    pub required: bool,
    #[serde(default)]
    pub values: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InputField {
    pub old_id: i64,
    pub id: String,
    pub name: String,
    #[serde(default = "string_type")]
    pub data_type: String,
    #[serde(default)]
    pub validation: FieldValidation,
    #[serde(default = "primary_customer")]
    pub level: String,
}

fn string_type() -> String {
    "STRING".to_owned()
}
fn primary_customer() -> String {
    "PRIMARY_CUSTOMER".to_owned()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PersonPrice {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    pub price: f64,
    pub original_price: f64,
    pub net_price: f64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupPrice {
    pub size: u32,
    pub name: String,
    pub price: f64,
    pub original_price: f64,
    pub net_price: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CancellationPolicy {
    pub cancellable: bool,
    pub cancellable_up_to_in_minutes: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReschedulePolicy {
    pub reschedulable: bool,
    pub reschedulable_up_to_in_minutes: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Schedule {
    pub start_times: Vec<String>,
    pub days_ahead: u32,
    pub capacity: u32,
    #[serde(default)]
    pub weekdays: Option<Vec<u32>>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExplicitSlot {
    pub start_date_time: String,
    pub capacity: u32,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Seatmap {
    pub sections: Vec<SeatSection>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SeatSection {
    pub name: String,
    pub rows: Vec<String>,
    pub seats_per_row: u32,
}

impl Seatmap {
    pub fn seat_count(&self) -> u32 {
        self.sections
            .iter()
            .map(|s| s.rows.len() as u32 * s.seats_per_row)
            .sum()
    }
    /// Every seat in map order as `{section, row, seatNumber, seatCode}`.
    pub fn seats(&self) -> Vec<Value> {
        self.sections
            .iter()
            .flat_map(|s| {
                s.rows.iter().flat_map(move |row| {
                    (1..=s.seats_per_row).map(move |n| {
                        serde_json::json!({"section": s.name, "row": row, "seatNumber": n.to_string(), "seatCode": format!("{}-{row}-{n}", s.name)})
                    })
                })
            })
            .collect()
    }

    /// `{section, row, seatNumber, seatCode}` of a seat code `<section>-<row>-<n>`.
    pub fn seat(&self, code: &str) -> Option<Value> {
        self.sections.iter().find_map(|s| {
            s.rows.iter().find_map(|row| {
                (1..=s.seats_per_row).find_map(|n| {
                    (format!("{}-{row}-{n}", s.name) == code).then(|| {
                        serde_json::json!({"section": s.name, "row": row, "seatNumber": n.to_string(), "seatCode": code})
                    })
                })
            })
        })
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Variant {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub duration: u32,
    #[serde(default = "fixed_fixed")]
    pub inventory_type: String,
    pub pax: Pax,
    #[serde(default)]
    pub cashback: Option<Cashback>,
    #[serde(default)]
    pub ticket_delivery_info_html: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub input_fields: Vec<InputField>,
    #[serde(default = "per_person")]
    pub profile_type: String,
    #[serde(default)]
    pub persons: Vec<PersonPrice>,
    #[serde(default)]
    pub groups: Vec<GroupPrice>,
    pub cancellation_policy: CancellationPolicy,
    pub reschedule_policy: ReschedulePolicy,
    #[serde(default)]
    pub schedule: Option<Schedule>,
    #[serde(default)]
    pub slots: Vec<ExplicitSlot>,
    #[serde(default)]
    pub seatmap: Option<Seatmap>,
}

fn fixed_fixed() -> String {
    "FIXED_START_FIXED_DURATION".to_owned()
}
fn per_person() -> String {
    "PER_PERSON".to_owned()
}

/// One problem found in a catalog file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Why a catalog could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("the catalog is not valid JSON of the documented shape: {0}")]
    Parse(String),
    #[error("the catalog has {} problem(s):\n{}", .0.len(), .0.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
}

/// A slot of a variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub id: String,
    pub start: NaiveDateTime,
    pub end: NaiveDateTime,
    pub capacity: u32,
}

pub fn slot_id(variant_id: &str, start: NaiveDateTime) -> String {
    format!("{variant_id}-{}", start.format("%Y%m%d%H%M"))
}

/// A validated catalog with its indices.
#[derive(Debug, Clone)]
pub struct Catalog {
    pub file: CatalogFile,
    pub digest: String,
    products: HashMap<String, usize>,
    variants: HashMap<String, (usize, usize)>,
    currencies: HashMap<String, usize>,
    cities: HashMap<String, usize>,
    categories: HashMap<String, usize>,
    subcategories: HashMap<String, usize>,
    collections: HashMap<String, usize>,
    /// Compiled input-field regexes by (variant id, field id).
    regexes: HashMap<(String, String), regex::Regex>,
}

impl Catalog {
    /// Parses and validates a catalog document.
    pub fn parse(text: &str) -> Result<Self, CatalogError> {
        let file: CatalogFile =
            serde_json::from_str(text).map_err(|e| CatalogError::Parse(e.to_string()))?;
        Self::new(file)
    }

    pub fn new(file: CatalogFile) -> Result<Self, CatalogError> {
        let mut problems = Vec::new();
        let mut p = |path: String, message: String| problems.push(Problem { path, message });
        fn index<T>(
            items: &[T],
            id: impl Fn(&T) -> &str,
            kind: &str,
            p: &mut impl FnMut(String, String),
        ) -> HashMap<String, usize> {
            let mut map = HashMap::new();
            for (i, item) in items.iter().enumerate() {
                if map.insert(id(item).to_owned(), i).is_some() {
                    p(
                        format!("{kind}[{i}].id"),
                        format!("duplicate id `{}`", id(item)),
                    );
                }
            }
            map
        }
        let currencies = index(&file.currencies, |c| c.code.as_str(), "currencies", &mut p);
        let cities = index(&file.cities, |c| c.code.as_str(), "cities", &mut p);
        let categories = index(&file.categories, |c| c.id.as_str(), "categories", &mut p);
        let subcategories = index(
            &file.subcategories,
            |c| c.id.as_str(),
            "subcategories",
            &mut p,
        );
        let collections = index(&file.collections, |c| c.id.as_str(), "collections", &mut p);
        let products = index(&file.products, |c| c.id.as_str(), "products", &mut p);
        match currencies.get(&file.base_currency) {
            None => p(
                "baseCurrency".into(),
                format!("`{}` is not in currencies", file.base_currency),
            ),
            Some(&i) if (file.currencies[i].rate - 1.0).abs() > f64::EPSILON => p(
                format!("currencies[{i}].rate"),
                "the base currency's rate must be 1".into(),
            ),
            Some(_) => {}
        }
        for (i, c) in file.currencies.iter().enumerate() {
            if !(c.rate.is_finite() && c.rate > 0.0) {
                p(
                    format!("currencies[{i}].rate"),
                    "must be a positive number".into(),
                );
            }
            if c.precision > 4 {
                p(format!("currencies[{i}].precision"), "must be 0–4".into());
            }
        }
        let languages: HashSet<&str> = PRODUCT_LANGUAGES
            .iter()
            .chain(EXTRA_LIST_LANGUAGES.iter())
            .copied()
            .collect();
        let check_langs = |path: String,
                           keys: &mut dyn Iterator<Item = &String>,
                           p: &mut dyn FnMut(String, String)| {
            for k in keys {
                if !languages.contains(k.as_str()) {
                    p(
                        format!("{path}.translations.{k}"),
                        format!("unknown language code `{k}`"),
                    );
                }
            }
        };
        for (i, c) in file.cities.iter().enumerate() {
            if c.code.is_empty() || !c.code.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
                p(
                    format!("cities[{i}].code"),
                    format!("`{}` must be uppercase [A-Z_]+", c.code),
                );
            }
            if c.time_zone.parse::<Tz>().is_err() {
                p(
                    format!("cities[{i}].timeZone"),
                    format!(
                        "`{}` is not an IANA time zone (like Europe/Rome or America/New_York)",
                        c.time_zone
                    ),
                );
            }
            check_langs(format!("cities[{i}]"), &mut c.translations.keys(), &mut p);
        }
        for (i, c) in file.categories.iter().enumerate() {
            if !cities.contains_key(&c.city_code) {
                p(
                    format!("categories[{i}].cityCode"),
                    format!("unknown city `{}`", c.city_code),
                );
            }
            check_langs(
                format!("categories[{i}]"),
                &mut c.translations.keys(),
                &mut p,
            );
        }
        for (i, c) in file.subcategories.iter().enumerate() {
            if !categories.contains_key(&c.category_id) {
                p(
                    format!("subcategories[{i}].categoryId"),
                    format!("unknown category `{}`", c.category_id),
                );
            }
            check_langs(
                format!("subcategories[{i}]"),
                &mut c.translations.keys(),
                &mut p,
            );
        }
        for (i, c) in file.collections.iter().enumerate() {
            if !cities.contains_key(&c.city_code) {
                p(
                    format!("collections[{i}].cityCode"),
                    format!("unknown city `{}`", c.city_code),
                );
            }
            check_langs(
                format!("collections[{i}]"),
                &mut c.translations.keys(),
                &mut p,
            );
        }
        let mut variants = HashMap::new();
        let mut regexes = HashMap::new();
        for (pi, product) in file.products.iter().enumerate() {
            let at = format!("products[{pi}]");
            if product.id.is_empty()
                || !product.id.bytes().all(|b| b.is_ascii_digit())
                || product.id.len() > 18
            {
                p(
                    format!("{at}.id"),
                    format!(
                        "`{}` must be digits (v1 serves it as an integer)",
                        product.id
                    ),
                );
            }
            if !PRODUCT_TYPES.contains(&product.product_type.as_str()) {
                p(
                    format!("{at}.productType"),
                    format!(
                        "`{}` is not one of {}",
                        product.product_type,
                        PRODUCT_TYPES.join(", ")
                    ),
                );
            }
            if !cities.contains_key(&product.city_code) {
                p(
                    format!("{at}.cityCode"),
                    format!("unknown city `{}`", product.city_code),
                );
            }
            check_langs(at.clone(), &mut product.translations.keys(), &mut p);
            for (k, id) in std::iter::once(&product.primary_category_id)
                .chain(&product.secondary_category_ids)
                .enumerate()
            {
                if !categories.contains_key(id) {
                    let path = if k == 0 {
                        format!("{at}.primaryCategoryId")
                    } else {
                        format!("{at}.secondaryCategoryIds[{}]", k - 1)
                    };
                    p(path, format!("unknown category `{id}`"));
                }
            }
            for (k, id) in product.sub_category_ids.iter().enumerate() {
                if !subcategories.contains_key(id) {
                    p(
                        format!("{at}.subCategoryIds[{k}]"),
                        format!("unknown subcategory `{id}`"),
                    );
                }
            }
            if let Some(id) = &product.primary_sub_category_id {
                if !product.sub_category_ids.contains(id) {
                    p(
                        format!("{at}.primarySubCategoryId"),
                        format!("`{id}` is not in subCategoryIds"),
                    );
                } else if subcategories
                    .get(id)
                    .map(|&i| &file.subcategories[i].category_id)
                    != Some(&product.primary_category_id)
                {
                    p(
                        format!("{at}.primarySubCategoryId"),
                        format!("`{id}` does not belong to the primary category"),
                    );
                }
            }
            for (k, id) in product.collection_ids.iter().enumerate() {
                if !collections.contains_key(id) {
                    p(
                        format!("{at}.collectionIds[{k}]"),
                        format!("unknown collection `{id}`"),
                    );
                }
            }
            if let Some(id) = &product.primary_collection_id
                && !product.collection_ids.contains(id)
            {
                p(
                    format!("{at}.primaryCollectionId"),
                    format!("`{id}` is not in collectionIds"),
                );
            }
            let seatmap = match product.inventory_selection_type.as_str() {
                "NORMAL" => false,
                "SEATMAP" => true,
                other => {
                    p(
                        format!("{at}.inventorySelectionType"),
                        format!("`{other}` is not NORMAL or SEATMAP"),
                    );
                    false
                }
            };
            if product.variants.is_empty() {
                p(
                    format!("{at}.variants"),
                    "a product needs at least one variant".into(),
                );
            }
            for (vi, v) in product.variants.iter().enumerate() {
                let at = format!("{at}.variants[{vi}]");
                if variants.insert(v.id.clone(), (pi, vi)).is_some() {
                    p(
                        format!("{at}.id"),
                        format!("duplicate variant id `{}`", v.id),
                    );
                }
                if v.pax.min < 1 || v.pax.min > v.pax.max {
                    p(
                        format!("{at}.pax"),
                        format!("min ({}) must be ≥ 1 and ≤ max ({})", v.pax.min, v.pax.max),
                    );
                }
                match v.profile_type.as_str() {
                    "PER_PERSON" => {
                        if !v.persons.iter().any(|x| x.kind == "ADULT") {
                            p(
                                format!("{at}.persons"),
                                "a PER_PERSON variant needs an ADULT price".into(),
                            );
                        }
                    }
                    "PER_GROUP" => {
                        if v.groups.is_empty() {
                            p(
                                format!("{at}.groups"),
                                "a PER_GROUP variant needs at least one group price".into(),
                            );
                        }
                    }
                    other => p(
                        format!("{at}.profileType"),
                        format!("`{other}` is not PER_PERSON or PER_GROUP"),
                    ),
                }
                let prices = v
                    .persons
                    .iter()
                    .map(|x| (x.price, x.original_price, x.net_price))
                    .chain(
                        v.groups
                            .iter()
                            .map(|g| (g.price, g.original_price, g.net_price)),
                    );
                for (price, original, net) in prices {
                    if !(price >= 0.0 && original >= 0.0 && net >= 0.0 && net <= price) {
                        p(
                            at.clone(),
                            format!(
                                "prices must be ≥ 0 with netPrice ≤ price (price {price}, netPrice {net})"
                            ),
                        );
                    }
                }
                for (gi, g) in v.groups.iter().enumerate() {
                    if g.size == 0 {
                        p(format!("{at}.groups[{gi}].size"), "must be ≥ 1".into());
                    }
                }
                if v.schedule.is_none() && v.slots.is_empty() {
                    p(at.clone(), "a variant needs a schedule or slots".into());
                }
                if let Some(s) = &v.schedule {
                    if s.capacity < 1 {
                        p(format!("{at}.schedule.capacity"), "must be ≥ 1".into());
                    }
                    if !(1..=366).contains(&s.days_ahead) {
                        p(format!("{at}.schedule.daysAhead"), "must be 1–366".into());
                    }
                    for (k, t) in s.start_times.iter().enumerate() {
                        if NaiveTime::parse_from_str(t, "%H:%M").is_err() {
                            p(
                                format!("{at}.schedule.startTimes[{k}]"),
                                format!("`{t}` is not HH:MM"),
                            );
                        }
                    }
                    for (k, d) in s.weekdays.iter().flatten().enumerate() {
                        if !(1..=7).contains(d) {
                            p(
                                format!("{at}.schedule.weekdays[{k}]"),
                                "ISO weekdays are 1–7".into(),
                            );
                        }
                    }
                }
                for (k, s) in v.slots.iter().enumerate() {
                    if NaiveDateTime::parse_from_str(&s.start_date_time, LOCAL_FORMAT).is_err() {
                        p(
                            format!("{at}.slots[{k}].startDateTime"),
                            format!("`{}` is not YYYY-MM-DDTHH:MM:SS", s.start_date_time),
                        );
                    }
                    if s.capacity < 1 {
                        p(format!("{at}.slots[{k}].capacity"), "must be ≥ 1".into());
                    }
                }
                if seatmap && v.seatmap.is_none() {
                    p(
                        format!("{at}.seatmap"),
                        "variants of a SEATMAP product need a seatmap".into(),
                    );
                }
                if !seatmap && v.seatmap.is_some() {
                    p(
                        format!("{at}.seatmap"),
                        "only SEATMAP products have a seatmap".into(),
                    );
                }
                for (k, f) in v.input_fields.iter().enumerate() {
                    let fat = format!("{at}.inputFields[{k}]");
                    if let Some(r) = &f.validation.regex {
                        match regex::Regex::new(r) {
                            Ok(re) => {
                                regexes.insert((v.id.clone(), f.id.clone()), re);
                            }
                            Err(e) => p(
                                format!("{fat}.validation.regex"),
                                format!("does not compile: {e}"),
                            ),
                        }
                    }
                    if let (Some(a), Some(b)) = (f.validation.min_length, f.validation.max_length)
                        && a > b
                    {
                        p(
                            format!("{fat}.validation"),
                            "minLength is greater than maxLength".into(),
                        );
                    }
                    if let (Some(a), Some(b)) = (f.validation.min_value, f.validation.max_value)
                        && a > b
                    {
                        p(
                            format!("{fat}.validation"),
                            "minValue is greater than maxValue".into(),
                        );
                    }
                }
            }
        }
        if !problems.is_empty() {
            return Err(CatalogError::Invalid(problems));
        }
        let digest = {
            use sha2::Digest;
            let bytes = serde_json::to_vec(&file).unwrap_or_default();
            hex::encode(sha2::Sha256::digest(&bytes))
        };
        Ok(Self {
            file,
            digest,
            products,
            variants,
            currencies,
            cities,
            categories,
            subcategories,
            collections,
            regexes,
        })
    }

    pub fn product(&self, id: &str) -> Option<&Product> {
        self.products.get(id).map(|&i| &self.file.products[i])
    }
    pub fn variant(&self, id: &str) -> Option<(&Product, &Variant)> {
        self.variants.get(id).map(|&(p, v)| {
            let product = &self.file.products[p];
            (product, &product.variants[v])
        })
    }
    pub fn currency(&self, code: &str) -> Option<&Currency> {
        self.currencies.get(code).map(|&i| &self.file.currencies[i])
    }
    pub fn base_currency(&self) -> &Currency {
        // Validated at construction.
        &self.file.currencies[self.currencies[&self.file.base_currency]]
    }
    pub fn city(&self, code: &str) -> Option<&City> {
        self.cities.get(code).map(|&i| &self.file.cities[i])
    }

    /// The time zone a product's local times are in: its city's.
    pub fn zone(&self, product: &Product) -> Tz {
        // Validated at construction: the city exists and names a zone.
        self.city(&product.city_code)
            .and_then(|c| c.time_zone.parse().ok())
            .unwrap_or(Tz::UTC)
    }
    pub fn category(&self, id: &str) -> Option<&Category> {
        self.categories.get(id).map(|&i| &self.file.categories[i])
    }
    pub fn subcategory(&self, id: &str) -> Option<&Subcategory> {
        self.subcategories
            .get(id)
            .map(|&i| &self.file.subcategories[i])
    }
    pub fn collection(&self, id: &str) -> Option<&Collection> {
        self.collections.get(id).map(|&i| &self.file.collections[i])
    }
    pub fn field_regex(&self, variant_id: &str, field_id: &str) -> Option<&regex::Regex> {
        self.regexes
            .get(&(variant_id.to_owned(), field_id.to_owned()))
    }

    /// A product's content in `language`, English where the translation lacks a field.
    pub fn content(&self, product: &Product, language: &str) -> (String, Content) {
        match product.translations.get(language) {
            Some(t) if language != "EN" => (
                t.name.clone().unwrap_or_else(|| product.name.clone()),
                t.content.or(&product.content),
            ),
            _ => (product.name.clone(), product.content.clone()),
        }
    }

    /// Every slot of `variant` starting within `[from, to)`, in start order.
    pub fn slots(&self, variant: &Variant, from: NaiveDateTime, to: NaiveDateTime) -> Vec<Slot> {
        let duration = Duration::minutes(i64::from(variant.duration.max(1)));
        let capacity_of = |default: u32| {
            variant
                .seatmap
                .as_ref()
                .map_or(default, Seatmap::seat_count)
        };
        let mut slots: BTreeMap<NaiveDateTime, u32> = BTreeMap::new();
        if let Some(s) = &variant.schedule {
            let first = from.date();
            let last = to.date();
            let mut day = first;
            while day <= last {
                let weekday = day.weekday().number_from_monday();
                if s.weekdays.as_ref().is_none_or(|w| w.contains(&weekday)) {
                    for t in &s.start_times {
                        if let Ok(t) = NaiveTime::parse_from_str(t, "%H:%M") {
                            slots.insert(day.and_time(t), capacity_of(s.capacity));
                        }
                    }
                }
                let Some(next) = day.succ_opt() else { break };
                day = next;
            }
        }
        for s in &variant.slots {
            if let Ok(start) = NaiveDateTime::parse_from_str(&s.start_date_time, LOCAL_FORMAT) {
                slots.insert(start, capacity_of(s.capacity));
            }
        }
        slots
            .into_iter()
            .filter(|(start, _)| *start >= from && *start < to)
            .map(|(start, capacity)| Slot {
                id: slot_id(&variant.id, start),
                start,
                end: start + duration,
                capacity,
            })
            .collect()
    }

    /// The bookable window of a variant's schedule as seen at `now`: today to today + daysAhead.
    pub fn horizon(&self, variant: &Variant, now: NaiveDateTime) -> NaiveDateTime {
        let days = variant.schedule.as_ref().map_or(0, |s| s.days_ahead);
        let explicit_last = variant
            .slots
            .iter()
            .filter_map(|s| NaiveDateTime::parse_from_str(&s.start_date_time, LOCAL_FORMAT).ok())
            .max();
        let scheduled =
            now.date().and_hms_opt(0, 0, 0).unwrap_or(now) + Duration::days(i64::from(days) + 1);
        explicit_last.map_or(scheduled, |e| scheduled.max(e + Duration::seconds(1)))
    }

    /// The slot `slot_id` of `variant` if it exists and starts after `now`.
    pub fn find_slot(&self, variant: &Variant, slot_id: &str, now: NaiveDateTime) -> Option<Slot> {
        let stamp = slot_id.strip_prefix(&variant.id)?.strip_prefix('-')?;
        let start = NaiveDateTime::parse_from_str(stamp, "%Y%m%d%H%M").ok()?;
        if start <= now || start >= self.horizon(variant, now) {
            return None;
        }
        self.slots(variant, start, start + Duration::minutes(1))
            .into_iter()
            .next()
    }

    /// `amount` (in the base currency) in `currency`, rounded to its precision.
    pub fn convert(&self, amount: f64, currency: &Currency) -> f64 {
        round_to(amount * currency.rate, currency.precision)
    }
}

pub fn round_to(amount: f64, precision: u32) -> f64 {
    let scale = 10f64.powi(precision as i32);
    (amount * scale).round() / scale
}

/// `at_ms` (epoch ms) as the wall-clock time in `zone`.
pub fn local_in(zone: Tz, at_ms: i64) -> NaiveDateTime {
    DateTime::<Utc>::from_timestamp_millis(at_ms)
        .map(|d| d.with_timezone(&zone).naive_local())
        .unwrap_or_default()
}

/// The instant a wall-clock time of `zone` names: in a fold (the hour repeated when clocks go
/// back) the first of the two, in a gap (the hour skipped when they go forward) the time as if
/// the clocks had not moved yet (what a person reading the schedule experiences).
pub fn instant(zone: Tz, local: NaiveDateTime) -> DateTime<Utc> {
    match zone.from_local_datetime(&local) {
        chrono::LocalResult::Single(t) | chrono::LocalResult::Ambiguous(t, _) => {
            t.with_timezone(&Utc)
        }
        chrono::LocalResult::None => {
            // The offset just before the gap applies.
            let before = zone
                .from_local_datetime(&(local - Duration::hours(3)))
                .earliest()
                .map(|t| t.offset().fix());
            match before {
                Some(offset) => (local - offset).and_utc(),
                None => local.and_utc(),
            }
        }
    }
}

/// ISO 8601 with the zone's offset at that time (`2026-10-25T09:00:00+01:00`).
pub fn iso_in(zone: Tz, local: NaiveDateTime) -> String {
    instant(zone, local)
        .with_timezone(&zone)
        .format("%Y-%m-%dT%H:%M:%S%:z")
        .to_string()
}

/// The instant `at_ms` (epoch ms) in ISO 8601 with `zone`'s offset then.
pub fn iso_at(zone: Tz, at_ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(at_ms)
        .unwrap_or_default()
        .with_timezone(&zone)
        .format("%Y-%m-%dT%H:%M:%S%.3f%:z")
        .to_string()
}

/// The documented localized form of a local time (`yyyy-MM-dd HH:mm:ss`).
pub const LOCALIZED_FORMAT: &str = "%Y-%m-%d %H:%M:%S";

/// `now` (epoch ms) as a naive UTC date-time.
pub fn local(now_ms: i64) -> NaiveDateTime {
    chrono::DateTime::from_timestamp_millis(now_ms)
        .map(|d| d.naive_utc())
        .unwrap_or_else(|| {
            NaiveDate::default()
                .and_hms_opt(0, 0, 0)
                .unwrap_or_default()
        })
}

/// The policy that applies when a product's variants differ: the strictest of them.
pub fn strictest_cancellation(
    policies: impl Iterator<Item = CancellationPolicy>,
) -> CancellationPolicy {
    policies
        .reduce(|a, b| match (a.cancellable, b.cancellable) {
            (false, _) => a,
            (_, false) => b,
            _ => CancellationPolicy {
                cancellable: true,
                cancellable_up_to_in_minutes: max_opt(
                    a.cancellable_up_to_in_minutes,
                    b.cancellable_up_to_in_minutes,
                ),
            },
        })
        .unwrap_or(CancellationPolicy {
            cancellable: false,
            cancellable_up_to_in_minutes: None,
        })
}

pub fn strictest_reschedule(policies: impl Iterator<Item = ReschedulePolicy>) -> ReschedulePolicy {
    policies
        .reduce(|a, b| match (a.reschedulable, b.reschedulable) {
            (false, _) => a,
            (_, false) => b,
            _ => ReschedulePolicy {
                reschedulable: true,
                reschedulable_up_to_in_minutes: max_opt(
                    a.reschedulable_up_to_in_minutes,
                    b.reschedulable_up_to_in_minutes,
                ),
            },
        })
        .unwrap_or(ReschedulePolicy {
            reschedulable: false,
            reschedulable_up_to_in_minutes: None,
        })
}

/// A larger cut-off (more minutes before the start) is stricter.
fn max_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}
