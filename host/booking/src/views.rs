//! The documented JSON shapes of the catalog (Product v2 and v1, Variant, cities, categories,
//! subcategories, collections, inventory slots), in a requested language and currency.

use crate::catalog::{
    Catalog, Content, Currency, GroupPrice, Location, PersonPrice, Product, Slot, Variant,
    strictest_cancellation, strictest_reschedule,
};
use serde_json::{Value, json};

/// Who is looking: pricing fields differ by partner type (net prices are for booking partners).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    Affiliate,
    Booking,
}

/// Language and currency of a response.
#[derive(Debug, Clone, Copy)]
pub struct Locale<'a> {
    pub language: &'a str,
    pub currency: &'a Currency,
    pub audience: Audience,
}

fn content_json(c: &Content) -> Value {
    json!({
        "highlights": c.highlights, "highlightsHtml": c.highlights_html,
        "shortSummary": c.short_summary, "summaryHtml": c.summary_html,
        "inclusions": c.inclusions, "inclusionsHtml": c.inclusions_html,
        "exclusions": c.exclusions, "exclusionsHtml": c.exclusions_html,
        "faqHtml": c.faq_html, "ticketDeliveryInfoHtml": c.ticket_delivery_info_html,
    })
}

pub fn currency_json(c: &Currency) -> Value {
    json!({"code": c.code, "currencyName": c.currency_name, "symbol": c.symbol, "localSymbol": c.local_symbol, "precision": c.precision})
}

fn translated<'a>(
    name: &'a str,
    translations: &'a std::collections::BTreeMap<String, crate::catalog::NameTranslation>,
    language: &str,
) -> &'a str {
    translations
        .get(language)
        .and_then(|t| t.name.as_deref())
        .unwrap_or(name)
}

pub fn city_json(catalog: &Catalog, code: &str, language: &str) -> Value {
    match catalog.city(code) {
        Some(c) => json!({
            "code": c.code,
            "name": translated(&c.name, &c.translations, language),
            "image": {"url": c.image_url},
        }),
        None => json!({"code": code, "name": code, "image": {"url": null}}),
    }
}

pub fn category_json(catalog: &Catalog, id: &str, language: &str) -> Value {
    match catalog.category(id) {
        Some(c) => {
            json!({"id": c.id, "name": translated(&c.name, &c.translations, language), "cityCode": c.city_code})
        }
        None => Value::Null,
    }
}

pub fn subcategory_json(catalog: &Catalog, id: &str, language: &str) -> Value {
    match catalog.subcategory(id) {
        Some(c) => {
            json!({"id": c.id, "name": translated(&c.name, &c.translations, language), "categoryId": c.category_id})
        }
        None => Value::Null,
    }
}

pub fn collection_json(catalog: &Catalog, id: &str, language: &str) -> Value {
    match catalog.collection(id) {
        Some(c) => {
            json!({"id": c.id, "name": translated(&c.name, &c.translations, language), "cityCode": c.city_code})
        }
        None => Value::Null,
    }
}

/// Lowest selling price, lowest net price and best discount (%) of a variant, in the base currency.
fn variant_minimums(v: &Variant) -> (f64, f64, f64, f64) {
    let entries: Vec<(f64, f64, f64)> = if v.profile_type == "PER_GROUP" {
        v.groups
            .iter()
            .map(|g| (g.price, g.original_price, g.net_price))
            .collect()
    } else {
        v.persons
            .iter()
            .map(|p| (p.price, p.original_price, p.net_price))
            .collect()
    };
    let min = |f: fn(&(f64, f64, f64)) -> f64| entries.iter().map(f).fold(f64::INFINITY, f64::min);
    let price = min(|e| e.0);
    let original = entries
        .iter()
        .filter(|e| e.0 == price)
        .map(|e| e.1)
        .fold(f64::INFINITY, f64::min);
    let net = min(|e| e.2);
    let discount = entries
        .iter()
        .filter(|e| e.1 > 0.0)
        .map(|e| ((e.1 - e.0) / e.1 * 100.0).max(0.0))
        .fold(0.0, f64::max);
    (price, original, net, discount.round())
}

fn pricing_json(catalog: &Catalog, locale: &Locale, profile: &str, price: f64, net: f64) -> Value {
    json!({
        "currency": locale.currency.code,
        "profileType": profile,
        "platformSellingPrice": catalog.convert(price, locale.currency),
        "netPrice": match locale.audience {
            Audience::Booking => json!(catalog.convert(net, locale.currency)),
            Audience::Affiliate => Value::Null,
        },
    })
}

fn person_json(catalog: &Catalog, locale: &Locale, p: &PersonPrice) -> Value {
    json!({
        "type": p.kind, "name": p.name,
        "price": catalog.convert(p.price, locale.currency),
        "originalPrice": catalog.convert(p.original_price, locale.currency),
        "netPrice": match locale.audience { Audience::Booking => json!(catalog.convert(p.net_price, locale.currency)), Audience::Affiliate => Value::Null },
    })
}

fn group_json(catalog: &Catalog, locale: &Locale, g: &GroupPrice) -> Value {
    json!({
        "size": g.size, "name": g.name,
        "price": catalog.convert(g.price, locale.currency),
        "originalPrice": catalog.convert(g.original_price, locale.currency),
        "netPrice": match locale.audience { Audience::Booking => json!(catalog.convert(g.net_price, locale.currency)), Audience::Affiliate => Value::Null },
    })
}

/// The price table of a variant: `{persons: [...], groups: [...]}`.
pub fn price_table(catalog: &Catalog, locale: &Locale, v: &Variant) -> Value {
    json!({
        "persons": v.persons.iter().map(|p| person_json(catalog, locale, p)).collect::<Vec<_>>(),
        "groups": v.groups.iter().map(|g| group_json(catalog, locale, g)).collect::<Vec<_>>(),
    })
}

pub fn variant_json(catalog: &Catalog, locale: &Locale, v: &Variant, with_pricing: bool) -> Value {
    let mut out = json!({
        "id": v.id,
        "name": v.name,
        "description": v.description,
        "duration": v.duration,
        "inventoryType": v.inventory_type,
        "pax": {"min": v.pax.min, "max": v.pax.max},
        "cashback": v.cashback.as_ref().map(|c| json!({"value": c.value, "type": c.kind})),
        "ticketDeliveryInfoHtml": v.ticket_delivery_info_html,
        "inputFields": v.input_fields.iter().map(|f| json!({
            "oldId": f.old_id, "id": f.id, "name": f.name, "dataType": f.data_type, "level": f.level,
            "validation": {
                "regex": f.validation.regex, "minLength": f.validation.min_length, "maxLength": f.validation.max_length,
                "minValue": f.validation.min_value, "maxValue": f.validation.max_value,
                "required": f.validation.required, "values": f.validation.values,
            },
        })).collect::<Vec<_>>(),
        "tags": v.tags,
        "cancellationPolicy": v.cancellation_policy,
        "reschedulePolicy": v.reschedule_policy,
    });
    if with_pricing {
        let (price, _, net, _) = variant_minimums(v);
        out["pricing"] = pricing_json(catalog, locale, &v.profile_type, price, net);
        out["pricing"]["persons"] = price_table(catalog, locale, v)["persons"].clone();
        out["pricing"]["groups"] = price_table(catalog, locale, v)["groups"].clone();
    }
    out
}

/// The cheapest variant's figures: (variant, price, original, net, best discount across variants).
fn product_minimums(p: &Product) -> (Option<&Variant>, f64, f64, f64, f64) {
    let mut best: Option<(&Variant, f64, f64, f64)> = None;
    let mut net_min = f64::INFINITY;
    let mut discount: f64 = 0.0;
    for v in &p.variants {
        let (price, original, net, d) = variant_minimums(v);
        net_min = net_min.min(net);
        discount = discount.max(d);
        if best.is_none_or(|b| price < b.1) {
            best = Some((v, price, original, net));
        }
    }
    match best {
        Some((v, price, original, _)) => (Some(v), price, original, net_min, discount),
        None => (None, 0.0, 0.0, 0.0, 0.0),
    }
}

fn flat_location(l: &Option<Location>) -> Value {
    match l {
        Some(l) => {
            json!({"latitude": l.latitude, "longitude": l.longitude, "address": l.address, "city": l.city, "postalCode": l.postal_code, "country": l.country})
        }
        None => Value::Null,
    }
}

/// Product (v2). `single`: the single-product route (variants carry their pricing).
pub fn product_v2(catalog: &Catalog, locale: &Locale, p: &Product, single: bool) -> Value {
    let (name, content) = catalog.content(p, locale.language);
    let (cheapest, price, original, net, discount) = product_minimums(p);
    let profile = cheapest.map_or("PER_PERSON", |v| v.profile_type.as_str());
    json!({
        "id": p.id,
        "name": name,
        "canonicalUrl": p.canonical_url,
        "content": content_json(&content),
        "city": city_json(catalog, &p.city_code, locale.language),
        "media": p.media.iter().map(|m| json!({"url": m.url, "type": m.kind})).collect::<Vec<_>>(),
        "startLocation": flat_location(&p.start_location),
        "endLocation": flat_location(&p.end_location),
        "productType": p.product_type,
        "reviewsSummary": {"ratingsCount": p.reviews_summary.ratings_count, "averageRating": p.reviews_summary.average_rating},
        "pricing": pricing_json(catalog, locale, profile, price, net),
        "listingPrice": {
            "type": profile,
            "currencyCode": locale.currency.code,
            "minimumPrice": {"originalPrice": catalog.convert(original, locale.currency), "finalPrice": catalog.convert(price, locale.currency)},
            "bestDiscount": discount,
        },
        "currency": currency_json(locale.currency),
        "localeSpecificUrls": p.locale_specific_urls,
        "hasInstantConfirmation": p.has_instant_confirmation,
        "hasMobileTicket": p.has_mobile_ticket,
        "primaryCategory": catalog.category(&p.primary_category_id).map(|c| json!({"id": c.id, "name": translated(&c.name, &c.translations, locale.language)})),
        "secondaryCategories": p.secondary_category_ids.iter().filter_map(|id| catalog.category(id)).map(|c| json!({"id": c.id, "name": translated(&c.name, &c.translations, locale.language)})).collect::<Vec<_>>(),
        "primarySubCategory": p.primary_sub_category_id.as_deref().map(|id| subcategory_json(catalog, id, locale.language)),
        "primaryCollection": p.primary_collection_id.as_deref().map(|id| collection_json(catalog, id, locale.language)),
        "variants": p.variants.iter().map(|v| variant_json(catalog, locale, v, single)).collect::<Vec<_>>(),
        "inventorySelectionType": p.inventory_selection_type,
        "cancellationPolicy": strictest_cancellation(p.variants.iter().map(|v| v.cancellation_policy)),
        "reschedulePolicy": strictest_reschedule(p.variants.iter().map(|v| v.reschedule_policy)),
    })
}

fn nested_location(l: &Option<Location>) -> Value {
    match l {
        Some(l) => json!({
            "geolocation": {"latitude": l.latitude, "longitude": l.longitude},
            "address": {"addressLine1": l.address, "addressLine2": null, "cityName": l.city, "postalCode": l.postal_code, "state": null, "countryName": l.country},
        }),
        None => Value::Null,
    }
}

/// Product (v1): integer id, `images`, `ratingCumulative`, nested locations, cheapest-variant
/// `pricing`. `with_variants`: `fetch-variants`.
pub fn product_v1(catalog: &Catalog, locale: &Locale, p: &Product, with_variants: bool) -> Value {
    let (name, content) = catalog.content(p, locale.language);
    let (cheapest, price, original, _, discount) = product_minimums(p);
    let id: i64 = p.id.parse().unwrap_or_default();
    json!({
        "id": id,
        "name": name,
        "url": p.url.clone().unwrap_or_else(|| format!("/product/{}", p.id)),
        "canonicalUrl": p.canonical_url,
        "neighbourhood": p.neighbourhood,
        "content": content_json(&content),
        "city": city_json(catalog, &p.city_code, locale.language),
        "displayTags": p.display_tags,
        "images": p.media.iter().map(|m| json!({"url": m.url, "type": m.kind})).collect::<Vec<_>>(),
        "startLocation": nested_location(&p.start_location),
        "endLocation": nested_location(&p.end_location),
        "productType": p.product_type,
        "ratingCumulative": {"avg": p.reviews_summary.average_rating, "count": p.reviews_summary.ratings_count},
        "pricing": {
            "type": cheapest.map_or("PER_PERSON", |v| v.profile_type.as_str()),
            "currencyCode": locale.currency.code,
            "minimumPrice": {"originalPrice": catalog.convert(original, locale.currency), "finalPrice": catalog.convert(price, locale.currency)},
            "bestDiscount": discount,
        },
        "currency": currency_json(locale.currency),
        "hasInstantConfirmation": p.has_instant_confirmation,
        "hasMobileTicket": p.has_mobile_ticket,
        "primaryCategory": catalog.category(&p.primary_category_id).map(|c| json!({
            "id": c.id, "name": translated(&c.name, &c.translations, locale.language), "cityCode": c.city_code,
            "canonicalUrl": null, "localeSpecificUrls": {},
        })),
        "inventorySelectionType": p.inventory_selection_type,
        "variants": if with_variants {
            json!(p.variants.iter().map(|v| variant_json(catalog, locale, v, true)).collect::<Vec<_>>())
        } else {
            json!([])
        },
    })
}

/// An inventory slot with its live remaining seats.
pub fn slot_json(
    catalog: &Catalog,
    locale: &Locale,
    v: &Variant,
    zone: chrono_tz::Tz,
    slot: &Slot,
    remaining: u32,
    closed: bool,
) -> Value {
    use crate::catalog::{LOCAL_FORMAT, LOCALIZED_FORMAT, iso_in};
    let availability = if closed || remaining == 0 {
        "CLOSED"
    } else {
        "LIMITED"
    };
    json!({
        "id": slot.id,
        "startDateTime": slot.start.format(LOCAL_FORMAT).to_string(),
        "endDateTime": slot.end.format(LOCAL_FORMAT).to_string(),
        "startTime": iso_in(zone, slot.start),
        "endTime": iso_in(zone, slot.end),
        "startTimeLocal": slot.start.format(LOCALIZED_FORMAT).to_string(),
        "timeZone": zone.name(),
        "availability": availability,
        "remaining": if closed { 0 } else { remaining },
        "pricing": price_table(catalog, locale, v),
    })
}
