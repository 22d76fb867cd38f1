//! The partner catalog and booking API end to end, on a real `capstan serve` (production on the
//! main listener, the sandbox on the sandbox listener), a real SQLite file, the test catalog
//! `tests/catalogs/small.json`, real fulfilment step components, and a Python receiver that
//! verifies booking webhooks with PyPI `standardwebhooks`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{
    Server, WebhookReceiver, cli, home_with, partner_config, partner_key, repo, step_effects,
};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

async fn call(
    client: &Client,
    method: Method,
    url: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = client.request(method, url);
    if let Some(k) = key {
        req = req.header("Partner-Auth", k);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

fn assert_error(got: &(StatusCode, Value), status: u16, code: &str) {
    assert_eq!(got.0.as_u16(), status, "{}", got.1);
    assert_eq!(got.1["status"], status, "{}", got.1);
    assert_eq!(got.1["error"]["code"], code, "{}", got.1);
    assert!(
        got.1["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{}",
        got.1
    );
}

/// The first open slot of a variant, from the inventory route.
async fn first_slot(client: &Client, base: &str, key: &str, variant: &str) -> Value {
    let (status, body) = call(
        client,
        Method::GET,
        &format!("{base}/api/public/v2/inventory/list-by/tour?tourId={variant}&limit=5"),
        Some(key),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["items"][0].clone()
}

fn booking_body(slot: &str, adults: usize, amount: f64) -> Value {
    let customers: Vec<Value> = (0..adults)
        .map(|i| {
            if i == 0 {
                json!({"personType": "ADULT", "isPrimary": true, "inputFields": [{"id": "fullName", "value": "Grace Hopper"}, {"id": "email", "value": "grace@example.com"}]})
            } else {
                json!({"personType": "ADULT", "isPrimary": false, "inputFields": []})
            }
        })
        .collect();
    json!({
        "productId": "1001", "variantId": "5001", "inventoryId": slot, "inventorySeatIds": null,
        "customersDetails": {"count": adults, "customers": customers}, "variantInputFields": null,
        "price": {"amount": amount, "currencyCode": "EUR"},
    })
}

#[tokio::test]
async fn keys_environments_partner_types_and_cors() {
    let home = home_with(&[], &partner_config(""));
    let prod = partner_key(home.path(), "booking", "production");
    let sandbox = partner_key(home.path(), "booking", "sandbox");
    let affiliate = partner_key(home.path(), "affiliate", "production");
    assert!(prod.starts_with("pk_") && sandbox.starts_with("tk_") && affiliate.starts_with("pk_"));
    let server = Server::start(home.path());
    let c = Client::new();
    let product = |base: &str| format!("{base}/api/public/v2/products/1001");

    assert_error(
        &call(&c, Method::GET, &product(&server.base), None, None).await,
        401,
        "E_UNAUTHORIZED",
    );
    assert_error(
        &call(
            &c,
            Method::GET,
            &product(&server.base),
            Some("pk_unknownunknownunknown"),
            None,
        )
        .await,
        401,
        "E_UNAUTHORIZED",
    );
    assert_error(
        &call(
            &c,
            Method::GET,
            &product(&server.base),
            Some(&sandbox),
            None,
        )
        .await,
        401,
        "E_UNAUTHORIZED",
    );
    assert_error(
        &call(
            &c,
            Method::GET,
            &product(&server.sandbox),
            Some(&prod),
            None,
        )
        .await,
        401,
        "E_UNAUTHORIZED",
    );
    assert_eq!(
        call(&c, Method::GET, &product(&server.base), Some(&prod), None)
            .await
            .0,
        200
    );
    assert_eq!(
        call(
            &c,
            Method::GET,
            &product(&server.sandbox),
            Some(&sandbox),
            None
        )
        .await
        .0,
        200
    );

    // Affiliates: catalog yes, inventory and bookings no.
    assert_eq!(
        call(
            &c,
            Method::GET,
            &product(&server.base),
            Some(&affiliate),
            None
        )
        .await
        .0,
        200
    );
    let inv = format!(
        "{}/api/public/v2/inventory/list-by/tour?tourId=5001",
        server.base
    );
    assert_error(
        &call(&c, Method::GET, &inv, Some(&affiliate), None).await,
        403,
        "E_FORBIDDEN",
    );
    let bookings = format!("{}/api/public/v2/bookings/", server.base);
    assert_error(
        &call(&c, Method::GET, &bookings, Some(&affiliate), None).await,
        403,
        "E_FORBIDDEN",
    );
    // Affiliates do not see net prices.
    let (_, as_affiliate) = call(
        &c,
        Method::GET,
        &product(&server.base),
        Some(&affiliate),
        None,
    )
    .await;
    assert_eq!(as_affiliate["pricing"]["netPrice"], Value::Null);

    // No CORS: a preflight is refused and no Access-Control-* header is ever sent.
    let pre = c
        .request(Method::OPTIONS, product(&server.base))
        .header("Origin", "https://evil.example")
        .header("Access-Control-Request-Method", "GET")
        .send()
        .await
        .unwrap();
    assert_eq!(pre.status(), 403);
    assert!(
        pre.headers()
            .keys()
            .all(|h| !h.as_str().starts_with("access-control-"))
    );
    let get = c
        .get(product(&server.base))
        .header("Origin", "https://evil.example")
        .header("Partner-Auth", &prod)
        .send()
        .await
        .unwrap();
    assert!(
        get.headers()
            .keys()
            .all(|h| !h.as_str().starts_with("access-control-"))
    );

    // Production and sandbox have their own inventory and bookings.
    let slot = first_slot(&c, &server.base, &prod, "5001").await;
    let (s, created) = call(
        &c,
        Method::POST,
        &bookings,
        Some(&prod),
        Some(booking_body(slot["id"].as_str().unwrap(), 2, 80.0)),
    )
    .await;
    assert_eq!(s, 200, "{created}");
    let prod_slot = first_slot(&c, &server.base, &prod, "5001").await;
    let sandbox_slot = first_slot(&c, &server.sandbox, &sandbox, "5001").await;
    assert_eq!(
        (
            prod_slot["remaining"].as_u64(),
            sandbox_slot["remaining"].as_u64()
        ),
        (Some(3), Some(5))
    );
    let in_sandbox = format!(
        "{}/api/public/v2/bookings/{}/",
        server.sandbox,
        created["bookingId"].as_str().unwrap()
    );
    assert_error(
        &call(&c, Method::GET, &in_sandbox, Some(&sandbox), None).await,
        404,
        "E_NOT_FOUND",
    );

    // A revoked partner is refused at the next request.
    let list = cli(home.path(), &["partners", "list"]);
    let id = list
        .lines()
        .find(|l| l.contains("affiliate"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    cli(home.path(), &["partners", "revoke", &id]);
    assert_error(
        &call(
            &c,
            Method::GET,
            &product(&server.base),
            Some(&affiliate),
            None,
        )
        .await,
        401,
        "E_UNAUTHORIZED",
    );

    // A method a route does not serve, and a path no route serves: the partner error shape on
    // both listeners.
    for (base, key) in [(&server.base, &prod), (&server.sandbox, &sandbox)] {
        assert_error(
            &call(&c, Method::DELETE, &product(base), Some(key), None).await,
            405,
            "E_METHOD_NOT_ALLOWED",
        );
        assert_error(
            &call(
                &c,
                Method::GET,
                &format!("{base}/api/public/v2/nothing-here"),
                Some(key),
                None,
            )
            .await,
            404,
            "E_NOT_FOUND",
        );
    }
}

#[tokio::test]
async fn catalog_routes_v2_and_v1() {
    let home = home_with(&[], &partner_config(""));
    let key = partner_key(home.path(), "booking", "production");
    let server = Server::start(home.path());
    let c = Client::new();
    let get = |path: &str| {
        let url = format!("{}{path}", server.base);
        let (c, key) = (c.clone(), key.clone());
        async move { call(&c, Method::GET, &url, Some(&key), None).await }
    };

    let (s, p) = get("/api/public/v2/products/1001?currencyCode=USD").await;
    assert_eq!(s, 200, "{p}");
    for field in [
        "id",
        "name",
        "canonicalUrl",
        "content",
        "city",
        "media",
        "startLocation",
        "endLocation",
        "productType",
        "reviewsSummary",
        "pricing",
        "listingPrice",
        "currency",
        "localeSpecificUrls",
        "hasInstantConfirmation",
        "hasMobileTicket",
        "primaryCategory",
        "secondaryCategories",
        "primarySubCategory",
        "primaryCollection",
        "variants",
        "inventorySelectionType",
        "cancellationPolicy",
        "reschedulePolicy",
    ] {
        assert!(p.get(field).is_some(), "Product v2 lacks {field}: {p}");
    }
    assert_eq!(p["id"], "1001");
    // Product-level price: the minimum across variants (child 20 EUR → 22 USD); strictest policies.
    assert_eq!(
        p["pricing"],
        json!({"currency": "USD", "profileType": "PER_PERSON", "platformSellingPrice": 22.0, "netPrice": 16.5})
    );
    assert_eq!(p["currency"]["precision"], 2);
    assert_eq!(
        p["cancellationPolicy"],
        json!({"cancellable": false, "cancellableUpToInMinutes": null})
    );
    assert_eq!(
        p["reschedulePolicy"],
        json!({"reschedulable": false, "reschedulableUpToInMinutes": null})
    );
    assert_eq!(p["variants"][0]["pricing"]["platformSellingPrice"], 22.0);
    assert_eq!(p["variants"][1]["pricing"]["platformSellingPrice"], 220.0);
    assert_eq!(
        p["variants"][0]["inputFields"][1]["validation"]["required"],
        true
    );
    assert_eq!(p["startLocation"]["latitude"], 41.8902);
    // JPY has no minor unit.
    let (_, jpy) = get("/api/public/v2/products/1001?currencyCode=JPY").await;
    assert_eq!(jpy["pricing"]["platformSellingPrice"], 3206.0);
    // Translations with English fallback per field.
    let (_, it) = get("/api/public/v2/products/1001?languageCode=IT").await;
    assert_eq!(it["name"], "Tour guidato del Colosseo");
    assert_eq!(it["content"]["shortSummary"], "Visita l'arena.");
    assert_eq!(
        it["content"]["highlights"], "Arena floor",
        "missing translation falls back to English"
    );
    assert_eq!(it["city"]["name"], "Roma");
    let (_, de) = get("/api/public/v2/products/1001?languageCode=DE").await;
    assert_eq!(de["name"], "Colosseum guided tour");
    assert_error(
        &get("/api/public/v2/products/1001?languageCode=KO").await,
        400,
        "E_INVALID_ARGUMENT",
    );
    assert_error(
        &get("/api/public/v2/products/1001?currencyCode=XYZ").await,
        400,
        "E_INVALID_ARGUMENT",
    );
    assert_error(
        &get("/api/public/v2/products/1001?color=red").await,
        400,
        "E_INVALID_ARGUMENT",
    );
    assert_error(
        &get("/api/public/v2/products/424242").await,
        404,
        "E_NOT_FOUND",
    );

    // The list: filters, primaryCategoryOnly, pagination, extra list languages.
    let ids = |v: &Value| {
        v["products"]
            .as_array()
            .unwrap_or_else(|| panic!("not a product list: {v}"))
            .iter()
            .map(|p| p["id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let (_, rome) = get("/api/public/v2/products/?cityCode=ROME").await;
    assert_eq!(ids(&rome), ["1001", "1002"]);
    assert_eq!(
        (
            rome["total"].as_i64(),
            rome["nextOffset"].clone(),
            rome["nextUrl"].clone()
        ),
        (Some(2), Value::Null, Value::Null)
    );
    let (_, tours) = get("/api/public/v2/products/?categoryId=1").await;
    assert_eq!(
        ids(&tours),
        ["1001", "1002"],
        "1002 is linked to category 1 through subcategory 11"
    );
    let (_, primary) = get("/api/public/v2/products/?categoryId=1&primaryCategoryOnly=true").await;
    assert_eq!(ids(&primary), ["1001"]);
    let (_, no_cat) = get("/api/public/v2/products/?primaryCategoryOnly=true").await;
    assert_eq!(
        no_cat["total"], 3,
        "without categoryId primaryCategoryOnly has no effect"
    );
    let (_, sub) = get("/api/public/v2/products/?subCategoryId=21").await;
    assert_eq!(ids(&sub), ["1002"]);
    let (_, coll) = get("/api/public/v2/products/?collectionId=100").await;
    assert_eq!(ids(&coll), ["1001"]);
    let (_, page1) = get("/api/public/v2/products/?limit=2&languageCode=KO").await;
    assert_eq!(
        (
            page1["total"].as_i64(),
            page1["nextOffset"].as_i64(),
            page1["prevUrl"].clone()
        ),
        (Some(3), Some(2), Value::Null)
    );
    // Links are absolute, on the host the request named.
    let next = page1["nextUrl"].as_str().unwrap().to_owned();
    assert!(
        next.starts_with(&format!("{}/api/public/v2/products/?", server.base))
            && next.contains("offset=2")
            && next.contains("languageCode=KO"),
        "{next}"
    );
    let (_, page2) = get(next.strip_prefix(&server.base).unwrap()).await;
    assert_eq!(
        (ids(&page2), page2["nextOffset"].clone()),
        (vec!["1003".to_owned()], Value::Null)
    );
    assert!(page2["prevUrl"].as_str().unwrap().contains("offset=0"));
    assert_error(
        &get("/api/public/v2/products/?offset=-1").await,
        400,
        "E_INVALID_ARGUMENT",
    );
    assert_error(
        &get("/api/public/v2/products/?languageCode=XX").await,
        400,
        "E_INVALID_ARGUMENT",
    );

    // v1 shapes, on the preferred and the legacy path.
    for path in [
        "/api/public/v1/product/get/1001?fetch-variants=true",
        "/api/v1/product/get/1001?fetch-variants=true",
    ] {
        let (s, v1) = get(path).await;
        assert_eq!(s, 200, "{path}: {v1}");
        assert_eq!(v1["id"], 1001, "v1 ids are integers");
        assert_eq!(v1["images"][0]["type"], "IMAGE");
        assert_eq!(v1["ratingCumulative"], json!({"avg": 4.6, "count": 1200}));
        assert_eq!(
            v1["startLocation"]["geolocation"],
            json!({"latitude": 41.8902, "longitude": 12.4922})
        );
        assert_eq!(v1["startLocation"]["address"]["cityName"], "Rome");
        assert_eq!(v1["endLocation"], Value::Null);
        assert_eq!(
            v1["pricing"]["minimumPrice"],
            json!({"originalPrice": 20.0, "finalPrice": 20.0})
        );
        assert_eq!(v1["variants"].as_array().unwrap().len(), 2);
        assert!(v1.get("media").is_none() && v1.get("reviewsSummary").is_none());
    }

    // Cities, categories, subcategories, collections (v2) and the legacy listings.
    let (_, cities) = get("/api/public/v2/cities/").await;
    assert_eq!(cities["items"].as_array().unwrap().len(), 2);
    let (_, cats) = get("/api/public/v2/categories?cityCode=ROME").await;
    assert_eq!(cats["total"], 2);
    let (_, subs) = get("/api/public/v2/subcategories?cityCode=ROME").await;
    assert_eq!(subs["total"], 2);
    let (_, colls) = get("/api/public/v2/collections?cityCode=PARIS").await;
    assert_eq!(colls["total"], 0);
    assert_error(
        &get("/api/public/v2/categories?cityCode=BERLIN").await,
        404,
        "E_NOT_FOUND",
    );
    let (_, by_city) = get("/api/public/v1/product/listing/list-by/city?cityCode=PARIS").await;
    assert_eq!(by_city["items"][0]["id"], 1003);
    let (_, by_cat) = get("/api/public/v1/product/listing/list-by/category?categoryId=2").await;
    assert_eq!(by_cat["total"], 1);
    assert_error(
        &get("/api/public/v1/category/list-by/city").await,
        400,
        "E_MISSING_PARAMETER",
    );

    // `capstan catalog import` on the same database: a bad file changes nothing and lists its
    // problems; a good one is served by the running server within a second.
    let mut doc: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("tests/catalogs/small.json")).unwrap(),
    )
    .unwrap();
    doc["products"][0]["variants"][0]["pax"] = json!({"min": 3, "max": 1});
    let bad = home.path().join("bad.json");
    std::fs::write(&bad, doc.to_string()).unwrap();
    let out = capstan_e2e::capstan(home.path())
        .args(["catalog", "import", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("products[0].variants[0].pax"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    doc["products"][0]["variants"][0]["pax"] = json!({"min": 1, "max": 4});
    doc["products"][0]["name"] = json!("Colosseum at night");
    let good = home.path().join("good.json");
    std::fs::write(&good, doc.to_string()).unwrap();
    let printed = cli(home.path(), &["catalog", "import", good.to_str().unwrap()]);
    assert!(printed.contains("3 products"), "{printed}");
    let mut name = Value::Null;
    for _ in 0..200 {
        name = get("/api/public/v2/products/1001").await.1["name"].clone();
        if name == "Colosseum at night" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(name, "Colosseum at night");
}

#[tokio::test]
async fn booking_lifecycle_errors_fulfilment_and_webhooks() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = WebhookReceiver::start(dir.path(), "500,429,200");
    let home = home_with(&[], &partner_config(""));
    let key = partner_key(home.path(), "booking", "production");
    let other = partner_key(home.path(), "booking", "production");
    let server = Server::start(home.path());
    let c = Client::new();
    let base = format!("{}/api/public/v2", server.base);

    // Register a webhook; its secret is returned once.
    let (s, hook) = call(
        &c,
        Method::POST,
        &format!("{base}/webhooks/"),
        Some(&key),
        Some(json!({"url": format!("http://127.0.0.1:{}/hook", receiver.port)})),
    )
    .await;
    assert_eq!(s, 200, "{hook}");
    assert!(
        hook["timestamp"].is_i64() && hook["error"] == json!({}) && hook["data"]["enabled"] == true,
        "{hook}"
    );
    let secret = hook["data"]["secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"));
    std::fs::write(dir.path().join("secrets.txt"), secret).unwrap();
    let (_, listed) = call(
        &c,
        Method::GET,
        &format!("{base}/webhooks/"),
        Some(&key),
        None,
    )
    .await;
    assert_eq!(listed["data"]["items"].as_array().unwrap().len(), 1);
    assert!(
        listed["data"]["items"][0].get("secret").is_none(),
        "the secret is never shown again"
    );
    assert_error(
        &call(
            &c,
            Method::POST,
            &format!("{base}/webhooks/"),
            Some(&key),
            Some(json!({"url": "ftp://x"})),
        )
        .await,
        400,
        "E_INVALID_ARGUMENT",
    );
    assert_error(
        &call(
            &c,
            Method::POST,
            &format!("{base}/webhooks/"),
            Some(&key),
            Some(json!({"enabled": true})),
        )
        .await,
        400,
        "E_MISSING_PARAMETER",
    );
    let long = format!("https://example.com/{}", "a".repeat(2040));
    assert_error(
        &call(
            &c,
            Method::POST,
            &format!("{base}/webhooks/"),
            Some(&key),
            Some(json!({"url": long})),
        )
        .await,
        400,
        "E_INVALID_ARGUMENT",
    );

    // Inventory and create.
    let slot = first_slot(&c, &server.base, &key, "5001").await;
    assert_eq!(
        (slot["availability"].as_str(), slot["remaining"].as_u64()),
        (Some("LIMITED"), Some(5))
    );
    assert_eq!(slot["pricing"]["persons"][0]["price"], 40.0);
    let slot_id = slot["id"].as_str().unwrap();
    let (s, b) = call(
        &c,
        Method::POST,
        &format!("{base}/bookings/"),
        Some(&key),
        Some(booking_body(slot_id, 2, 80.0)),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    for field in [
        "bookingId",
        "partnerReferenceId",
        "variantId",
        "startDateTime",
        "product",
        "customersDetails",
        "seatInfo",
        "variantInputFields",
        "price",
        "status",
        "voucherUrl",
        "tickets",
        "creationTimestamp",
    ] {
        assert!(b.get(field).is_some(), "Booking lacks {field}: {b}");
    }
    assert_eq!(
        (
            b["status"].as_str(),
            b["tickets"].clone(),
            b["price"].clone()
        ),
        (
            Some("UNCAPTURED"),
            json!([]),
            json!({"amount": 80.0, "currencyCode": "EUR"})
        )
    );
    assert_eq!(
        b["customersDetails"]["customers"][0]["inputFields"][0],
        json!({"id": "fullName", "name": "Full name", "value": "Grace Hopper"})
    );
    let id = b["bookingId"].as_str().unwrap().to_owned();
    assert!(id.parse::<i64>().is_ok());
    let url = format!("{base}/bookings/{id}/");

    // Price mismatch carries the current price; nothing is held.
    let mismatch = call(
        &c,
        Method::POST,
        &format!("{base}/bookings/"),
        Some(&key),
        Some(booking_body(slot_id, 1, 35.0)),
    )
    .await;
    assert_error(&mismatch, 409, "E_PRICE_MISMATCH");
    assert_eq!(
        mismatch.1["error"]["currentPrice"],
        json!({"amount": 40.0, "currencyCode": "EUR"})
    );
    assert_eq!(
        first_slot(&c, &server.base, &key, "5001").await["remaining"],
        3
    );

    // The documented errors of get / capture / list.
    assert_error(
        &call(
            &c,
            Method::GET,
            &format!("{base}/bookings/abc/"),
            Some(&key),
            None,
        )
        .await,
        400,
        "E_INVALID_ARGUMENT",
    );
    assert_error(
        &call(&c, Method::GET, &url, Some(&other), None).await,
        403,
        "E_FORBIDDEN",
    );
    assert_error(
        &call(
            &c,
            Method::PUT,
            &url,
            Some(&other),
            Some(json!({"status": "PENDING", "partnerReferenceId": "x"})),
        )
        .await,
        403,
        "E_FORBIDDEN",
    );
    assert_error(
        &call(
            &c,
            Method::PUT,
            &url,
            Some(&key),
            Some(json!({"status": "CANCELLED", "partnerReferenceId": "x"})),
        )
        .await,
        400,
        "E_INVALID_ARGUMENT",
    );
    assert_error(
        &call(
            &c,
            Method::PUT,
            &url,
            Some(&key),
            Some(json!({"status": "PENDING"})),
        )
        .await,
        400,
        "E_MISSING_PARAMETER",
    );
    assert_error(
        &call(
            &c,
            Method::PUT,
            &format!("{base}/bookings/x1/"),
            Some(&key),
            Some(json!({"status": "PENDING", "partnerReferenceId": "x"})),
        )
        .await,
        400,
        "E_INVALID_ARGUMENT",
    );
    assert_error(
        &call(
            &c,
            Method::GET,
            &format!("{base}/bookings/?offset=-1"),
            Some(&key),
            None,
        )
        .await,
        400,
        "E_INVALID_ARGUMENT",
    );
    assert_error(
        &call(
            &c,
            Method::GET,
            &format!("{base}/bookings/?limit=0"),
            Some(&key),
            None,
        )
        .await,
        400,
        "E_INVALID_ARGUMENT",
    );
    assert_error(
        &call(
            &c,
            Method::GET,
            &format!("{base}/bookings/?limit=-3"),
            Some(&key),
            None,
        )
        .await,
        400,
        "E_INVALID_ARGUMENT",
    );
    let (_, capped) = call(
        &c,
        Method::GET,
        &format!("{base}/bookings/?limit=50"),
        Some(&key),
        None,
    )
    .await;
    assert_eq!(
        (
            capped["total"].as_i64(),
            capped["items"].as_array().map(Vec::len)
        ),
        (Some(1), Some(1))
    );
    assert!(capped["nextUrl"].is_null());
    let (_, others) = call(
        &c,
        Method::GET,
        &format!("{base}/bookings/"),
        Some(&other),
        None,
    )
    .await;
    assert_eq!(others["total"], 0, "lists are partner-scoped");
    assert_eq!(
        call(&c, Method::GET, &url, Some(&key), None).await.1["status"],
        "UNCAPTURED",
        "refused captures changed nothing"
    );

    // Capture → PENDING → fulfilment by the step components → COMPLETED with tickets.
    let (s, captured) = call(
        &c,
        Method::PUT,
        &url,
        Some(&key),
        Some(json!({"status": "PENDING", "partnerReferenceId": "my-ref-1"})),
    )
    .await;
    assert_eq!(s, 200, "{captured}");
    assert_eq!(
        (
            captured["status"].as_str(),
            captured["partnerReferenceId"].as_str()
        ),
        (Some("PENDING"), Some("my-ref-1"))
    );
    // A capture retried after a lost answer (same reference) answers the booking as it is;
    // another reference is refused.
    let (s, again) = call(
        &c,
        Method::PUT,
        &url,
        Some(&key),
        Some(json!({"status": "PENDING", "partnerReferenceId": "my-ref-1"})),
    )
    .await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(again["bookingId"], captured["bookingId"]);
    assert!(
        matches!(again["status"].as_str(), Some("PENDING" | "COMPLETED")),
        "{again}"
    );
    assert_error(
        &call(
            &c,
            Method::PUT,
            &url,
            Some(&key),
            Some(json!({"status": "PENDING", "partnerReferenceId": "again"})),
        )
        .await,
        409,
        "E_INVALID_STATE",
    );
    let completed = until_booking(&c, &url, &key, "COMPLETED").await;
    // Captured again once completed: still the same booking, no second fulfilment.
    let (s, late) = call(
        &c,
        Method::PUT,
        &url,
        Some(&key),
        Some(json!({"status": "PENDING", "partnerReferenceId": "my-ref-1"})),
    )
    .await;
    assert_eq!(s, 200, "{late}");
    assert_eq!(late["status"], "COMPLETED");
    assert_eq!(late["tickets"], completed["tickets"]);
    assert_eq!(
        completed["tickets"].as_array().unwrap().len(),
        2,
        "{completed}"
    );
    assert_eq!(completed["tickets"][0]["type"], "QRCODE");
    assert!(
        completed["voucherUrl"]
            .as_str()
            .unwrap()
            .ends_with(&format!("{id}.pdf")),
        "{completed}"
    );

    // Webhooks: PENDING then COMPLETED, each verified with standardwebhooks; PENDING needed three
    // attempts (500, 429, 200) with a stable webhook-id.
    let got = receiver
        .until("PENDING and COMPLETED", |r| {
            r.iter().filter(|e| e["answered"] == 200).count() >= 2
        })
        .await;
    let statuses: Vec<(&str, u64)> = got
        .iter()
        .map(|e| {
            (
                e["body"]["status"].as_str().unwrap(),
                e["answered"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        statuses,
        [
            ("PENDING", 500),
            ("PENDING", 429),
            ("PENDING", 200),
            ("COMPLETED", 200)
        ]
    );
    assert!(
        got.iter().all(|e| e["verifiedWith"] == json!([2])),
        "{got:#?}"
    );
    assert!(
        got[..3]
            .iter()
            .all(|e| e["webhookId"] == got[0]["webhookId"])
    );
    assert_ne!(got[3]["webhookId"], got[0]["webhookId"]);
    assert_eq!(
        got[0]["body"]["bookingId"],
        id.parse::<i64>().unwrap(),
        "bookingId is a number"
    );
    let stamp = got[0]["body"]["eventTimestamp"].as_str().unwrap();
    assert!(chrono_like(stamp), "local ISO 8601 without zone: {stamp}");
    assert_eq!(
        got[0]["body"].as_object().unwrap().len(),
        3,
        "exactly {{bookingId, status, eventTimestamp}}"
    );

    // A supplier that rejects (variant 5002 in this config): FAILED, seats returned.
    let private = first_slot(&c, &server.base, &key, "5002").await;
    let body = json!({
        "productId": "1001", "variantId": "5002", "inventoryId": private["id"],
        "customersDetails": {"count": 3, "customers": [
            {"personType": "ADULT", "isPrimary": true, "inputFields": [{"id": "fullName", "value": "Ann"}]},
            {"personType": "ADULT", "isPrimary": false, "inputFields": []},
            {"personType": "CHILD", "isPrimary": false, "inputFields": []}]},
        "price": {"amount": 200.0, "currencyCode": "EUR"},
    });
    let (s, p) = call(
        &c,
        Method::POST,
        &format!("{base}/bookings/"),
        Some(&key),
        Some(body),
    )
    .await;
    assert_eq!(s, 200, "{p}");
    let purl = format!("{base}/bookings/{}/", p["bookingId"].as_str().unwrap());
    assert_eq!(
        first_slot(&c, &server.base, &key, "5002").await["remaining"],
        5
    );
    call(
        &c,
        Method::PUT,
        &purl,
        Some(&key),
        Some(json!({"status": "PENDING", "partnerReferenceId": "r"})),
    )
    .await;
    until_booking(&c, &purl, &key, "FAILED").await;
    assert_eq!(
        first_slot(&c, &server.base, &key, "5002").await["remaining"],
        8
    );

    // Cancel: an UNCAPTURED booking is released at once ({success, message}).
    let (_, c2) = call(
        &c,
        Method::POST,
        &format!("{base}/bookings/"),
        Some(&key),
        Some(booking_body(slot_id, 1, 40.0)),
    )
    .await;
    let (s, ack) = call(
        &c,
        Method::POST,
        &format!(
            "{base}/bookings/{}/cancel/",
            c2["bookingId"].as_str().unwrap()
        ),
        Some(&key),
        Some(json!({"reason": "CUSTOMER_REQUEST", "comment": "sick"})),
    )
    .await;
    assert_eq!(
        (s.as_u16(), ack["success"].clone()),
        (200, json!(true)),
        "{ack}"
    );
    assert_eq!(
        first_slot(&c, &server.base, &key, "5001").await["remaining"],
        3
    );

    // v1 create/get/list on the same store.
    let v1 = format!("{}/api/public/v1/booking", server.base);
    let (s, b1) = call(
        &c,
        Method::POST,
        &v1,
        Some(&key),
        Some(booking_body(slot_id, 1, 40.0)),
    )
    .await;
    assert_eq!(s, 200, "{b1}");
    assert!(
        b1.get("variantInputFields").is_none(),
        "v1 has no variantInputFields"
    );
    let (_, list1) = call(&c, Method::GET, &v1, Some(&key), None).await;
    assert_eq!(list1["total"], 4);
    let (s, _) = call(
        &c,
        Method::GET,
        &format!(
            "{}/api/v1/booking/{}",
            server.base,
            b1["bookingId"].as_str().unwrap()
        ),
        Some(&key),
        None,
    )
    .await;
    assert_eq!(s, 200);
}

fn chrono_like(s: &str) -> bool {
    s.len() >= 19 && s.as_bytes()[10] == b'T' && !s.ends_with('Z') && !s.contains('+')
}

async fn until_booking(c: &Client, url: &str, key: &str, status: &str) -> Value {
    let mut last = Value::Null;
    for _ in 0..400 {
        last = call(c, Method::GET, url, Some(key), None).await.1;
        if last["status"] == status {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("booking never reached {status}: {last}");
}

#[tokio::test]
async fn hundreds_of_concurrent_creates_never_oversell_over_http() {
    // The partner rate limit off: this is about seats, not request rates.
    let home = home_with(
        &[],
        &partner_config("rate_limit = { requests_per_second = 0.0, burst = 1 }"),
    );
    let key = partner_key(home.path(), "booking", "production");
    let server = Server::start(home.path());
    let c = Client::new();
    let slot = first_slot(&c, &server.base, &key, "5001").await;
    let slot_id = slot["id"].as_str().unwrap().to_owned();
    let url = format!("{}/api/public/v2/bookings/", server.base);
    let mut tasks = Vec::new();
    for i in 0..240usize {
        let (c, url, key, slot_id) = (c.clone(), url.clone(), key.clone(), slot_id.clone());
        let pax = 1 + i % 3;
        tasks.push(tokio::spawn(async move {
            let got = call(
                &c,
                Method::POST,
                &url,
                Some(&key),
                Some(booking_body(&slot_id, pax, 40.0 * pax as f64)),
            )
            .await;
            (pax, got)
        }));
    }
    let mut sold = 0;
    let mut ids = Vec::new();
    for t in tasks {
        let (pax, (status, body)) = t.await.unwrap();
        match status.as_u16() {
            200 => {
                sold += pax;
                ids.push(body["bookingId"].as_str().unwrap().to_owned());
            }
            409 => assert_eq!(body["error"]["code"], "E_INVENTORY_UNAVAILABLE", "{body}"),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!((3..=5).contains(&sold), "sold {sold} of 5 seats");
    // Booking ids are numeric strings that tell nothing of how many were sold before or
    // beside them: twelve random digits, not a counter.
    let numbers: Vec<u64> = ids.iter().map(|id| id.parse().unwrap()).collect();
    assert!(ids.iter().all(|id| id.len() == 12), "{ids:?}");
    assert!(
        numbers.windows(2).all(|w| w[0].abs_diff(w[1]) > 1),
        "ids look sequential: {ids:?}"
    );
    let after = first_slot(&c, &server.base, &key, "5001").await;
    assert_eq!(
        after["remaining"].as_u64().unwrap() as usize,
        5 - sold,
        "remaining is exact"
    );
}

#[tokio::test]
async fn tls_listeners_and_the_plain_http_redirect() {
    let home = home_with(&[], &partner_config(""));
    let dir = home.path();
    let (cert, pkey) = capstan_e2e::self_signed_localhost(dir);
    let key = partner_key(dir, "booking", "sandbox");
    let server = Server::start_with(
        dir,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            pkey.to_str().unwrap(),
            "--http-redirect-listen",
            "127.0.0.1:0",
        ],
    );
    assert!(
        server.base.starts_with("https://") && server.sandbox.starts_with("https://"),
        "{}",
        server.base
    );
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&cert).unwrap()).unwrap();
    let c = Client::builder()
        .add_root_certificate(ca)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let (s, p) = call(
        &c,
        Method::GET,
        &format!("{}/api/public/v2/products/1001", server.sandbox),
        Some(&key),
        None,
    )
    .await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(
        c.get(format!("{}/healthz", server.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // Plain HTTP on either TLS port answers 301 to that same port over HTTPS (the sandbox's
    // to the sandbox, not to production); the redirect port answers 301 to the main one.
    for base in [&server.base, &server.sandbox] {
        let plain = base.replacen("https://", "http://", 1);
        let r = c
            .get(format!(
                "{plain}/api/public/v2/products/1001?languageCode=IT"
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 301, "{plain}");
        assert_eq!(
            r.headers()["location"].to_str().unwrap(),
            format!("{base}/api/public/v2/products/1001?languageCode=IT")
        );
    }
    let redirect = server.redirect.clone().expect("redirect listener reported");
    let r = c
        .get(format!(
            "{redirect}/api/public/v2/products/1001?languageCode=IT"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 301);
    let port = server.base.rsplit(':').next().unwrap();
    assert_eq!(
        r.headers()["location"].to_str().unwrap(),
        format!("https://127.0.0.1:{port}/api/public/v2/products/1001?languageCode=IT")
    );
}

#[tokio::test]
async fn booking_webhooks_4xx_is_final_and_registrations_can_be_disabled_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = WebhookReceiver::start(dir.path(), "400");
    let home = home_with(&[], &partner_config(""));
    let key = partner_key(home.path(), "booking", "production");
    let other = partner_key(home.path(), "booking", "production");
    let server = Server::start(home.path());
    let c = Client::new();
    let base = format!("{}/api/public/v2", server.base);
    let hook_url = format!("http://127.0.0.1:{}/hook", receiver.port);
    let (_, hook) = call(
        &c,
        Method::POST,
        &format!("{base}/webhooks/"),
        Some(&key),
        Some(json!({"url": hook_url})),
    )
    .await;
    let id = hook["data"]["id"].as_str().unwrap().to_owned();
    let hook_path = format!("{base}/webhooks/{id}/");
    assert_error(
        &call(&c, Method::GET, &hook_path, Some(&other), None).await,
        403,
        "E_FORBIDDEN",
    );
    assert_error(
        &call(&c, Method::PUT, &hook_path, Some(&key), Some(json!({}))).await,
        400,
        "E_MISSING_PARAMETER",
    );

    // A 400 answer is final: one attempt, status failed.
    let slot = first_slot(&c, &server.base, &key, "5001").await;
    let (_, b) = call(
        &c,
        Method::POST,
        &format!("{base}/bookings/"),
        Some(&key),
        Some(booking_body(slot["id"].as_str().unwrap(), 1, 40.0)),
    )
    .await;
    let burl = format!(
        "{base}/bookings/{}/cancel/",
        b["bookingId"].as_str().unwrap()
    );
    let (s, _) = call(
        &c,
        Method::POST,
        &burl,
        Some(&key),
        Some(json!({"reason": "test"})),
    )
    .await;
    assert_eq!(s, 200);
    receiver
        .until("the CANCELLED notification", |r| !r.is_empty())
        .await;
    let mut deliveries = Value::Null;
    for _ in 0..200 {
        deliveries = call(
            &c,
            Method::GET,
            &format!("{hook_path}deliveries/"),
            Some(&key),
            None,
        )
        .await
        .1;
        if deliveries["data"]["items"][0]["status"] == "failed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let d = &deliveries["data"]["items"][0];
    assert_eq!(
        (
            d["status"].as_str(),
            d["attempts"].as_i64(),
            d["responseCode"].as_i64()
        ),
        (Some("failed"), Some(1), Some(400)),
        "{deliveries}"
    );
    assert_eq!(d["payload"]["status"], "CANCELLED");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        receiver.received().len(),
        1,
        "a 4xx other than 408/429 is not retried"
    );

    // Disabled: no delivery is queued; deleted: gone.
    let (s, upd) = call(
        &c,
        Method::PATCH,
        &hook_path,
        Some(&key),
        Some(json!({"enabled": false})),
    )
    .await;
    assert_eq!(
        (s.as_u16(), upd["data"]["enabled"].clone()),
        (200, json!(false)),
        "{upd}"
    );
    let (_, b2) = call(
        &c,
        Method::POST,
        &format!("{base}/bookings/"),
        Some(&key),
        Some(booking_body(slot["id"].as_str().unwrap(), 1, 40.0)),
    )
    .await;
    call(
        &c,
        Method::POST,
        &format!(
            "{base}/bookings/{}/cancel/",
            b2["bookingId"].as_str().unwrap()
        ),
        Some(&key),
        None,
    )
    .await;
    let (_, after) = call(
        &c,
        Method::GET,
        &format!("{hook_path}deliveries/"),
        Some(&key),
        None,
    )
    .await;
    assert_eq!(after["data"]["items"].as_array().unwrap().len(), 1);
    let (s, _) = call(&c, Method::DELETE, &hook_path, Some(&key), None).await;
    assert_eq!(s, 200);
    assert_error(
        &call(&c, Method::GET, &hook_path, Some(&key), None).await,
        404,
        "E_NOT_FOUND",
    );
    let (_, list) = call(
        &c,
        Method::GET,
        &format!("{base}/webhooks/"),
        Some(&key),
        None,
    )
    .await;
    assert_eq!(list["data"]["items"], json!([]));
}

#[tokio::test]
async fn the_demo_catalog_that_just_run_loads_has_open_inventory_for_every_product_type() {
    let home = home_with(
        &[],
        &format!(
            "[booking]\ncatalog_file = \"{}\"\nsteps = \"{}\"\n",
            repo().join("examples/catalog/demo.json").display(),
            repo().join("target/steps").display()
        ),
    );
    let key = partner_key(home.path(), "booking", "production");
    let server = Server::start(home.path());
    let c = Client::new();
    let mut types = std::collections::BTreeMap::<String, usize>::new();
    let mut of_type = std::collections::BTreeMap::<String, Vec<Value>>::new();
    let mut url = format!("{}/api/public/v2/products/?limit=100", server.base);
    loop {
        let (s, page) = call(&c, Method::GET, &url, Some(&key), None).await;
        assert_eq!(s, 200, "{page}");
        for p in page["products"].as_array().unwrap() {
            let t = p["productType"].as_str().unwrap().to_owned();
            *types.entry(t.clone()).or_default() += 1;
            of_type.entry(t).or_default().push(p.clone());
        }
        match page["nextUrl"].as_str() {
            Some(next) => url = next.to_owned(),
            None => break,
        }
    }
    assert_eq!(types.len(), 7, "{types:?}");
    assert!(types.values().all(|n| *n >= 20), "{types:?}");
    // Every type has products with open, priced inventory (explicitly dated event slots may have
    // passed, so look for one that is still on sale).
    for (t, products) in &of_type {
        let mut open = None;
        for p in products {
            let slot = first_slot(
                &c,
                &server.base,
                &key,
                p["variants"][0]["id"].as_str().unwrap(),
            )
            .await;
            if slot["remaining"].as_u64().is_some_and(|r| r > 0) {
                open = Some(slot);
                break;
            }
        }
        let slot = open.unwrap_or_else(|| panic!("no {t} product has open inventory"));
        assert!(
            slot["pricing"]["persons"].is_array() && slot["pricing"]["groups"].is_array(),
            "{t}: {slot}"
        );
    }
}

#[tokio::test]
async fn a_partner_key_is_rate_limited_in_the_partner_shape_and_failed_keys_are_audited() {
    let home = home_with(
        &[],
        &partner_config("rate_limit = { requests_per_second = 0.01, burst = 3 }"),
    );
    let key = partner_key(home.path(), "booking", "production");
    let other = partner_key(home.path(), "affiliate", "production");
    let server = Server::start(home.path());
    let c = Client::new();
    let cities = format!("{}/api/public/v2/cities/", server.base);
    for _ in 0..3 {
        let got = call(&c, Method::GET, &cities, Some(&key), None).await;
        assert_eq!(got.0, StatusCode::OK, "{}", got.1);
    }
    let r = c
        .get(&cities)
        .header("Partner-Auth", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(wait >= 1);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], 429, "{body}");
    assert_eq!(body["error"]["code"], "E_RATE_LIMITED", "{body}");
    assert_eq!(body["error"]["retryAfter"], wait, "{body}");
    // Buckets are per key: another partner is served.
    let got = call(&c, Method::GET, &cities, Some(&other), None).await;
    assert_eq!(got.0, StatusCode::OK, "{}", got.1);

    for _ in 0..5 {
        let got = call(
            &c,
            Method::GET,
            &cities,
            Some(&format!("pk_{}", "z".repeat(40))),
            None,
        )
        .await;
        assert_error(&got, 401, "E_UNAUTHORIZED");
    }
    let db = capstan_e2e::database(home.path()).await;
    let mut rows = Vec::new();
    for _ in 0..100 {
        rows = sqlx::query_as::<_, (String, String)>(
            "SELECT principal_id, action FROM audit_logs WHERE action IN ('partner-authenticate', 'rate-limit') ORDER BY action",
        )
        .fetch_all(&db)
        .await
        .unwrap();
        if rows.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rows.len(), 2, "one record per source and action: {rows:?}");
    assert_eq!(
        rows[0],
        (
            "partner:unknown".to_owned(),
            "partner-authenticate".to_owned()
        )
    );
    assert!(
        rows[1].0.starts_with("partner:") && rows[1].1 == "rate-limit",
        "{rows:?}"
    );
}

/// A node whose step components are missing says so in `/readyz` (503, `missingSteps`) and
/// keeps captured bookings PENDING, with their seats, instead of failing them.
#[tokio::test]
async fn missing_step_components_make_the_node_not_ready_and_fail_no_booking() {
    let empty = tempfile::tempdir().unwrap();
    let text = partner_config("").replace(
        &repo().join("target/steps").display().to_string(),
        &empty.path().display().to_string(),
    );
    let home = home_with(&[], &text);
    let key = partner_key(home.path(), "booking", "production");
    let server = Server::start(home.path());
    let c = Client::new();
    let ready = c
        .get(format!("{}/readyz", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(ready["status"], "not_ready", "{ready}");
    assert_eq!(ready["database"], "ok", "{ready}");
    assert_eq!(
        ready["missingSteps"],
        json!(["confirm-supplier", "deliver-voucher", "issue-tickets"])
    );

    let slot = first_slot(&c, &server.base, &key, "5001").await;
    let slot_id = slot["id"].as_str().unwrap();
    let base = format!("{}/api/public/v2", server.base);
    let (s, b) = call(
        &c,
        Method::POST,
        &format!("{base}/bookings/"),
        Some(&key),
        Some(booking_body(slot_id, 2, 80.0)),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let url = format!("{base}/bookings/{}/", b["bookingId"].as_str().unwrap());
    let (s, captured) = call(
        &c,
        Method::PUT,
        &url,
        Some(&key),
        Some(json!({"status": "PENDING", "partnerReferenceId": "wait"})),
    )
    .await;
    assert_eq!(s, 200, "{captured}");
    // The fulfilment worker passes every 100 ms, and leaves the job alone: it is never
    // claimed, so it spends none of its retries.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, now) = call(&c, Method::GET, &url, Some(&key), None).await;
    assert_eq!(now["status"], "PENDING", "{now}");
    let slot = first_slot(&c, &server.base, &key, "5001").await;
    assert_eq!(slot["remaining"], 3, "the seats stay held: {slot}");
    let id = b["bookingId"].as_str().unwrap();
    let db = capstan_e2e::database(home.path()).await;
    let (attempts, leased): (i64, Option<i64>) = sqlx::query_as(
        "SELECT attempts, lease_until_ms FROM fulfilment_jobs WHERE booking_id = $1",
    )
    .bind(id.parse::<i64>().unwrap())
    .fetch_one(&db)
    .await
    .unwrap();
    db.close().await;
    assert_eq!((attempts, leased), (0, None), "the job was never claimed");
    // The operator puts the components in place and restarts: the booking completes.
    server.terminate();
    for step in std::fs::read_dir(repo().join("target/steps")).unwrap() {
        let step = step.unwrap().path();
        std::fs::copy(&step, empty.path().join(step.file_name().unwrap())).unwrap();
    }
    let server = Server::start(home.path());
    let url = url.replace(&base, &format!("{}/api/public/v2", server.base));
    let done = until_booking(&c, &url, &key, "COMPLETED").await;
    assert_eq!(done["tickets"].as_array().unwrap().len(), 2, "{done}");
}

/// Inventory speaks the supplier's time: each slot carries its start as an instant with the
/// city's offset (`startTime`), as the localized wall time (`startTimeLocal`) and its zone; a
/// bound sent both ways is read from `startTime`.
#[tokio::test]
async fn inventory_speaks_the_suppliers_time_and_start_time_wins() {
    let home = home_with(
        &[],
        &partner_config("public_base_url = \"https://partners.example.com/\""),
    );
    let key = partner_key(home.path(), "booking", "production");
    let server = Server::start(home.path());
    let c = Client::new();
    let list = format!(
        "{}/api/public/v2/inventory/list-by/tour?tourId=5001&limit=3",
        server.base
    );
    let (s, page) = call(&c, Method::GET, &list, Some(&key), None).await;
    assert_eq!(s, 200, "{page}");
    // Links start at the configured public URL, whatever host the request named.
    assert!(
        page["nextUrl"]
            .as_str()
            .unwrap()
            .starts_with("https://partners.example.com/api/public/v2/inventory/list-by/tour?"),
        "{page}"
    );
    let items = page["items"].as_array().unwrap();
    for slot in items {
        assert_eq!(slot["timeZone"], "Europe/Rome", "{slot}");
        let local = slot["startDateTime"].as_str().unwrap();
        assert_eq!(slot["startTimeLocal"], local.replace('T', " "), "{slot}");
        let start =
            chrono::DateTime::parse_from_rfc3339(slot["startTime"].as_str().unwrap()).unwrap();
        assert_eq!(
            start.naive_local().format("%Y-%m-%dT%H:%M:%S").to_string(),
            local
        );
        let offset = start.offset().local_minus_utc();
        assert!(
            offset == 3600 || offset == 7200,
            "Rome is UTC+1 or +2: {slot}"
        );
    }
    let second = &items[1];
    let encode = |v: &str| v.replace('+', "%2B").replace(' ', "%20");
    let from = |query: &str| {
        let url = format!("{list}&{query}");
        let (c, key) = (c.clone(), key.clone());
        async move { call(&c, Method::GET, &url, Some(&key), None).await }
    };
    let start_time = second["startTime"].as_str().unwrap();
    let (s, both) = from(&format!(
        "startTime={}&startTimeLocal={}",
        encode(start_time),
        encode("2099-01-01 00:00:00")
    ))
    .await;
    assert_eq!(s, 200, "{both}");
    assert_eq!(both["items"][0]["id"], second["id"], "startTime wins");
    let (_, localized) = from(&format!(
        "startTimeLocal={}",
        encode(second["startTimeLocal"].as_str().unwrap())
    ))
    .await;
    assert_eq!(localized["items"][0]["id"], second["id"]);
    assert_error(&from("startTime=tomorrow").await, 400, "E_INVALID_ARGUMENT");
}

/// A partner discovers the free seats of a seatmap slot, checks a choice, books it, and then
/// sees those seats taken.
#[tokio::test]
async fn seatmap_seats_are_discovered_validated_and_booked() {
    let mut doc: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("tests/catalogs/small.json")).unwrap(),
    )
    .unwrap();
    doc["products"].as_array_mut().unwrap().push(json!({
        "id": "1004", "name": "Concert", "productType": "EVENT", "cityCode": "PARIS", "primaryCategoryId": "3",
        "startLocation": {"latitude": 48.85, "longitude": 2.35}, "inventorySelectionType": "SEATMAP",
        "variants": [{
            "id": "5005", "name": "Stalls", "duration": 120, "pax": {"min": 1, "max": 4},
            "persons": [{"type": "ADULT", "name": "Adult", "price": 50.0, "originalPrice": 50.0, "netPrice": 40.0}],
            "cancellationPolicy": {"cancellable": true, "cancellableUpToInMinutes": null},
            "reschedulePolicy": {"reschedulable": false, "reschedulableUpToInMinutes": null},
            "slots": [{"startDateTime": "2030-03-01T20:00:00", "capacity": 999}],
            "seatmap": {"sections": [{"name": "STALLS", "rows": ["A", "B"], "seatsPerRow": 3}]}
        }]
    }));
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.json");
    std::fs::write(&catalog, doc.to_string()).unwrap();
    let text = partner_config("").replace(
        &repo()
            .join("tests/catalogs/small.json")
            .display()
            .to_string(),
        &catalog.display().to_string(),
    );
    let home = home_with(&[], &text);
    let key = partner_key(home.path(), "booking", "production");
    let server = Server::start(home.path());
    let c = Client::new();
    let base = format!("{}/api/public/v2", server.base);
    let slot = "5005-203003012000";
    let seats_url = format!("{base}/seatmap/inventory/?tourId=5005&inventoryId={slot}");
    let (s, map) = call(&c, Method::GET, &seats_url, Some(&key), None).await;
    assert_eq!(s, 200, "{map}");
    assert_eq!(
        (map["total"].as_u64(), map["available"].as_u64()),
        (Some(6), Some(6))
    );
    assert_eq!(
        map["seats"][0],
        json!({"section": "STALLS", "row": "A", "seatNumber": "1", "seatCode": "STALLS-A-1", "available": true})
    );
    let validate = |seats: Value| {
        let (c, key, url) = (c.clone(), key.clone(), format!("{base}/seatmap/validate/"));
        async move {
            call(
                &c,
                Method::POST,
                &url,
                Some(&key),
                Some(json!({"tourId": "5005", "inventoryId": slot, "seatIds": seats})),
            )
            .await
        }
    };
    let (s, ok) = validate(json!(["STALLS-A-1", "STALLS-A-2"])).await;
    assert_eq!(
        (s.as_u16(), ok["valid"].clone()),
        (200, json!(true)),
        "{ok}"
    );

    let customers: Vec<Value> = (0..2)
        .map(|i| json!({"personType": "ADULT", "isPrimary": i == 0, "inputFields": []}))
        .collect();
    let (s, booked) = call(
        &c,
        Method::POST,
        &format!("{base}/bookings/"),
        Some(&key),
        Some(
            json!({"productId": "1004", "variantId": "5005", "inventoryId": slot,
                    "inventorySeatIds": ["STALLS-A-1", "STALLS-A-2"],
                    "customersDetails": {"count": 2, "customers": customers},
                    "price": {"amount": 100.0, "currencyCode": "EUR"}}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{booked}");
    let (_, map) = call(&c, Method::GET, &seats_url, Some(&key), None).await;
    assert_eq!(map["available"], 4, "{map}");
    assert_eq!(map["seats"][0]["available"], false);
    assert_eq!(map["seats"][2]["available"], true);
    let (s, bad) = validate(json!([
        "STALLS-A-1",
        "STALLS-B-3",
        "STALLS-Z-9",
        "STALLS-B-3"
    ]))
    .await;
    assert_eq!(s, 200, "{bad}");
    assert_eq!(
        (
            bad["valid"].clone(),
            bad["takenSeatIds"].clone(),
            bad["unknownSeatIds"].clone(),
            bad["duplicateSeatIds"].clone()
        ),
        (
            json!(false),
            json!(["STALLS-A-1"]),
            json!(["STALLS-Z-9"]),
            json!(["STALLS-B-3"])
        )
    );
    // A variant sold by headcount has no seats; a missing parameter is named.
    assert_error(
        &call(
            &c,
            Method::GET,
            &format!("{base}/seatmap/inventory/?tourId=5001&inventoryId={slot}"),
            Some(&key),
            None,
        )
        .await,
        400,
        "E_INVALID_ARGUMENT",
    );
    assert_error(
        &call(
            &c,
            Method::GET,
            &format!("{base}/seatmap/inventory/?tourId=5005"),
            Some(&key),
            None,
        )
        .await,
        400,
        "E_MISSING_PARAMETER",
    );
}

/// Cancelling a COMPLETED booking runs the step components' compensations backward: the
/// supplier's confirmation is cancelled and the tickets voided (each logged by its step), and
/// the booking stops showing the tickets.
#[tokio::test]
async fn cancelling_a_completed_booking_voids_its_tickets_and_the_suppliers_confirmation() {
    let home = home_with(&[], &partner_config(""));
    let key = partner_key(home.path(), "booking", "production");
    let server = Server::start(home.path());
    let c = Client::new();
    let base = format!("{}/api/public/v2", server.base);
    // A slot days ahead: the policy's cut-off (24 hours before the start) is still ahead.
    let (_, slots) = call(
        &c,
        Method::GET,
        &format!("{base}/inventory/list-by/tour?tourId=5001&limit=6"),
        Some(&key),
        None,
    )
    .await;
    let slot = slots["items"][5]["id"].as_str().unwrap().to_owned();
    let (s, b) = call(
        &c,
        Method::POST,
        &format!("{base}/bookings/"),
        Some(&key),
        Some(booking_body(&slot, 2, 80.0)),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let id = b["bookingId"].as_str().unwrap().to_owned();
    let url = format!("{base}/bookings/{id}/");
    call(
        &c,
        Method::PUT,
        &url,
        Some(&key),
        Some(json!({"status": "PENDING", "partnerReferenceId": "undo"})),
    )
    .await;
    let completed = until_booking(&c, &url, &key, "COMPLETED").await;
    assert_eq!(completed["tickets"].as_array().unwrap().len(), 2);
    let (s, ack) = call(
        &c,
        Method::POST,
        &format!("{url}cancel/"),
        Some(&key),
        Some(json!({"reason": "CUSTOMER_REQUEST"})),
    )
    .await;
    assert_eq!(s, 200, "{ack}");
    let mut cancelled = Value::Null;
    for _ in 0..400 {
        cancelled = call(&c, Method::GET, &url, Some(&key), None).await.1;
        if cancelled["tickets"] == json!([]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        (cancelled["status"].clone(), cancelled["tickets"].clone()),
        (json!("CANCELLED"), json!([])),
        "{cancelled}"
    );
    // The supplier saw one confirmation and one cancellation of that very reference; the
    // admission service issued two tickets once and voided those same tickets once.
    let effects = step_effects(home.path(), &id).await;
    let ops: Vec<&str> = effects.iter().map(|(op, _, _)| op.as_str()).collect();
    let answer = |op: &str| {
        effects
            .iter()
            .find(|(o, _, _)| o == op)
            .map(|(_, a, _)| a["Ok"].clone())
            .unwrap_or_else(|| panic!("no {op} in {effects:?}"))
    };
    for op in [
        "supplier.confirm",
        "admission.issue-tickets",
        "vouchers.deliver-voucher",
        "admission.void-tickets",
        "supplier.cancel-confirmation",
    ] {
        assert_eq!(
            ops.iter().filter(|o| **o == op).count(),
            1,
            "{op} once: {effects:?}"
        );
    }
    assert_eq!(
        answer("supplier.cancel-confirmation")["supplier_reference"],
        answer("supplier.confirm")["supplier_reference"]
    );
    let issued: Vec<Value> = answer("admission.issue-tickets")
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["public_id"].clone())
        .collect();
    let voided: Vec<Value> = answer("admission.void-tickets")
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["public_id"].clone())
        .collect();
    assert_eq!((issued.len(), &issued), (2, &voided));
    let log: Vec<String> = server.logs.try_iter().collect();
    assert!(
        log.iter()
            .any(|l| l.contains(&format!("voided 2 ticket(s) of booking {id}"))),
        "{log:#?}"
    );
}

/// A storm of every seat-changing request through the HTTP API — creates, captures, cancels,
/// reschedules — with holds timing out under it (a capture window of 800 ms) and fulfilment
/// running: every answer is a success or a documented refusal, and once it settles every slot's
/// `remaining` is its capacity less the seats of the bookings that hold it (UNCAPTURED, PENDING,
/// COMPLETED). `just test` runs it on SQLite and on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_every_change_over_http_keeps_the_seat_ledger_exact() {
    let home = home_with(
        &[],
        &partner_config(
            "capture_window_ms = 800\nrate_limit = { requests_per_second = 0.0, burst = 0 }",
        ),
    );
    let key = partner_key(home.path(), "booking", "production");
    let server = Server::start(home.path());
    let c = Client::new();
    let base = format!("{}/api/public/v2", server.base);
    let inventory = format!("{base}/inventory/list-by/tour?tourId=5001&limit=4");
    let (_, page) = call(&c, Method::GET, &inventory, Some(&key), None).await;
    let slots: Vec<String> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(slots.len(), 4, "{page}");
    let known = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut tasks = Vec::new();
    for task in 0..6u64 {
        let (c, base, key, slots, known) = (
            c.clone(),
            base.clone(),
            key.clone(),
            slots.clone(),
            known.clone(),
        );
        tasks.push(tokio::spawn(async move {
            // xorshift: the same storm on every run of a task.
            let mut state = 0x9E37_79B9_7F4A_7C15 ^ (task + 1);
            let mut roll = |n: usize| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                usize::try_from(state % n as u64).unwrap()
            };
            let mut answers = Vec::new();
            for _ in 0..40 {
                let pick = {
                    let known = known.lock().unwrap();
                    (!known.is_empty()).then(|| known[roll(known.len())].clone())
                };
                let slot = slots[roll(slots.len())].clone();
                let (what, (status, body)) = match (roll(6), pick) {
                    (0 | 1, _) | (_, None) => {
                        let pax = 1 + roll(2);
                        let got = call(
                            &c,
                            Method::POST,
                            &format!("{base}/bookings/"),
                            Some(&key),
                            Some(booking_body(&slot, pax, 40.0 * pax as f64)),
                        )
                        .await;
                        if got.0 == 200 {
                            known
                                .lock()
                                .unwrap()
                                .push(got.1["bookingId"].as_str().unwrap().to_owned());
                        }
                        ("create", got)
                    }
                    (2, Some(id)) => (
                        "capture",
                        call(
                            &c,
                            Method::PUT,
                            &format!("{base}/bookings/{id}/"),
                            Some(&key),
                            Some(json!({"status": "PENDING", "partnerReferenceId": format!("r{id}")})),
                        )
                        .await,
                    ),
                    (3, Some(id)) => (
                        "cancel",
                        call(
                            &c,
                            Method::POST,
                            &format!("{base}/bookings/{id}/cancel/"),
                            Some(&key),
                            Some(json!({"reason": "storm"})),
                        )
                        .await,
                    ),
                    (_, Some(id)) => (
                        "reschedule",
                        call(
                            &c,
                            Method::POST,
                            &format!("{base}/bookings/{id}/reschedule/"),
                            Some(&key),
                            Some(json!({"inventoryId": slot})),
                        )
                        .await,
                    ),
                };
                let documented = status == 200
                    || (status == 409
                        && ["E_INVENTORY_UNAVAILABLE", "E_INVALID_STATE"]
                            .contains(&body["error"]["code"].as_str().unwrap_or_default()))
                    || (status == 400
                        && body["error"]["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("already in that slot")));
                assert!(documented, "{what}: {status} {body}");
                answers.push(status.as_u16());
            }
            answers
        }));
    }
    let mut answered = Vec::new();
    for t in tasks {
        answered.extend(t.await.unwrap());
    }
    assert!(
        answered.iter().filter(|s| **s == 200).count() > 40,
        "the storm changed things: {answered:?}"
    );
    // Settled: the capture window has passed for every hold and fulfilment has finished; two
    // reads in a row agree.
    let ledger = async || {
        let mut bookings = Vec::new();
        let mut offset = 0;
        loop {
            let (_, page) = call(
                &c,
                Method::GET,
                &format!("{base}/bookings/?offset={offset}&limit=20"),
                Some(&key),
                None,
            )
            .await;
            let items = page["items"].as_array().unwrap().clone();
            offset += items.len();
            let done = items.is_empty() || offset as u64 >= page["total"].as_u64().unwrap();
            bookings.extend(items);
            if done {
                break;
            }
        }
        let (_, page) = call(&c, Method::GET, &inventory, Some(&key), None).await;
        (bookings, page["items"].clone())
    };
    let mut last = (Vec::new(), Value::Null);
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = ledger().await;
        let settled = now == last
            && !now
                .0
                .iter()
                .any(|b| b["status"] == "UNCAPTURED" || b["status"] == "PENDING");
        last = now;
        if settled {
            break;
        }
    }
    let (bookings, items) = last;
    assert!(bookings.len() > 10, "{}", bookings.len());
    for slot in items.as_array().unwrap() {
        let id = slot["id"].as_str().unwrap();
        // A booking names its slot by the start (the variant is the storm's one).
        assert!(slot["startDateTime"].is_string(), "{slot}");
        let held: u64 = bookings
            .iter()
            .filter(|b| {
                b["startDateTime"] == slot["startDateTime"]
                    && ["UNCAPTURED", "PENDING", "COMPLETED"]
                        .contains(&b["status"].as_str().unwrap())
            })
            .map(|b| b["customersDetails"]["count"].as_u64().unwrap())
            .sum();
        assert_eq!(
            slot["remaining"].as_u64().unwrap(),
            5 - held,
            "slot {id}: remaining is capacity less what its bookings hold"
        );
    }
}

/// Fulfilment hands the supplier the booking's amount in its currency's minor units, by the
/// catalog's precision: cents for EUR, yen for JPY (no decimals), as the supplier records it.
#[tokio::test]
async fn amounts_reach_the_supplier_in_the_currencys_minor_units() {
    let home = home_with(&[], &partner_config(""));
    let key = partner_key(home.path(), "booking", "production");
    let server = Server::start(home.path());
    let c = Client::new();
    let base = format!("{}/api/public/v2", server.base);
    let slot = first_slot(&c, &server.base, &key, "5001").await;
    let slot = slot["id"].as_str().unwrap();
    // 80 EUR, and the same in yen at the catalog's rate (160.3): 12,824 yen.
    for (amount, currency, minor) in [(80.0, "EUR", 8000), (12824.0, "JPY", 12824)] {
        let mut body = booking_body(slot, 2, amount);
        body["price"]["currencyCode"] = json!(currency);
        let (s, b) = call(
            &c,
            Method::POST,
            &format!("{base}/bookings/"),
            Some(&key),
            Some(body),
        )
        .await;
        assert_eq!(s, 200, "{b}");
        let id = b["bookingId"].as_str().unwrap().to_owned();
        let url = format!("{base}/bookings/{id}/");
        let (s, b) = call(
            &c,
            Method::PUT,
            &url,
            Some(&key),
            Some(json!({"status": "PENDING", "partnerReferenceId": format!("minor-{currency}")})),
        )
        .await;
        assert_eq!(s, 200, "{b}");
        until_booking(&c, &url, &key, "COMPLETED").await;
        assert_eq!(
            capstan_e2e::supplier_charge(home.path(), &id).await,
            Some((minor, currency.to_owned())),
            "{currency}"
        );
    }
}
