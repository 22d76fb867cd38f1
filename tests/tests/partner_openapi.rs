//! `GET /api/public/openapi.json` through a real `capstan serve`: public, OpenAPI 3.1, on both
//! partner listeners, covering every partner route the server answers and nothing it does not.
//! Then schemathesis (`st`, installed by `just setup`) fuzzes the live production listener from
//! the document and checks every response against it (the document closes every object schema,
//! so a body with a member the document does not list fails too).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, fill_path_params, home_with, partner_config, partner_key};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::process::Command;

/// Every partner route (method, path as documented). A route added to the partner router
/// belongs here and in the document.
const SERVED: [(&str, &str); 34] = [
    ("GET", "/api/public/openapi.json"),
    ("GET", "/api/public/v1/product/get/{productId}"),
    ("GET", "/api/public/v1/city"),
    ("GET", "/api/public/v1/category/list-by/city"),
    ("GET", "/api/public/v1/product/listing/list-by/city"),
    ("GET", "/api/public/v1/product/listing/list-by/category"),
    ("GET", "/api/public/v1/inventory/list-by/variant"),
    ("POST", "/api/public/v1/booking"),
    ("GET", "/api/public/v1/booking"),
    ("GET", "/api/public/v1/booking/{id}"),
    ("PUT", "/api/public/v1/booking/{id}"),
    ("GET", "/api/public/v2/products/{productId}"),
    ("GET", "/api/public/v2/products/"),
    ("GET", "/api/public/v2/cities/"),
    ("GET", "/api/public/v2/categories"),
    ("GET", "/api/public/v2/subcategories"),
    ("GET", "/api/public/v2/collections"),
    ("GET", "/api/public/v2/inventory/list-by/tour"),
    ("GET", "/api/public/v2/seatmap/inventory/"),
    ("POST", "/api/public/v2/seatmap/validate/"),
    ("POST", "/api/public/v2/bookings/"),
    ("GET", "/api/public/v2/bookings/"),
    ("GET", "/api/public/v2/bookings/{bookingId}/"),
    ("PUT", "/api/public/v2/bookings/{bookingId}/"),
    ("POST", "/api/public/v2/bookings/{bookingId}/cancel/"),
    ("POST", "/api/public/v2/bookings/{bookingId}/reschedule/"),
    ("POST", "/api/public/v2/webhooks/"),
    ("GET", "/api/public/v2/webhooks/"),
    ("GET", "/api/public/v2/webhooks/{webhookId}/"),
    ("PUT", "/api/public/v2/webhooks/{webhookId}/"),
    ("PATCH", "/api/public/v2/webhooks/{webhookId}/"),
    ("DELETE", "/api/public/v2/webhooks/{webhookId}/"),
    ("GET", "/api/public/v2/webhooks/{webhookId}/deliveries/"),
    // The legacy prefix serves the v1 routes too (documented once, under /api/public/v1).
    ("GET", "/api/v1/product/get/{productId}"),
];

/// Whether the listener routes `method path`: anything but the fallback's `no such route` and
/// a 405.
async fn served(client: &Client, base: &str, method: &str, template: &str) -> bool {
    let r = client
        .request(
            Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{base}{}", fill_path_params(template, "probe")),
        )
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    !(status == StatusCode::METHOD_NOT_ALLOWED
        || (status == StatusCode::NOT_FOUND && body["error"]["message"] == "no such route"))
}

async fn fetch_document(client: &Client, base: &str) -> Value {
    let r = client
        .get(format!("{base}/api/public/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "served without a key");
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    r.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_partner_document_is_public_and_covers_every_partner_route() {
    let home = home_with(&[], &partner_config(""));
    let server = Server::start(home.path());
    let client = Client::new();
    let doc = fetch_document(&client, &server.base).await;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    assert_eq!(
        doc["info"]["title"],
        "Capstan partner catalog and booking API"
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["partnerAuth"],
        json!({"type": "apiKey", "in": "header", "name": "Partner-Auth", "description": "A partner key: `pk_…` in production, `tk_…` on the sandbox."})
    );
    // The sandbox listener serves the same document.
    assert_eq!(fetch_document(&client, &server.sandbox).await, doc);

    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.insert((method.to_uppercase(), path.clone()));
        }
    }
    let expected: BTreeSet<(String, String)> = SERVED
        .iter()
        .filter(|(_, p)| !p.starts_with("/api/v1/"))
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(
        documented, expected,
        "the document and the partner routes differ"
    );
    for (method, path) in SERVED {
        assert!(
            served(&client, &server.base, method, path).await,
            "{method} {path} is not served"
        );
    }

    // Only the document is public; every other operation needs the key and says 401.
    assert_eq!(
        doc["paths"]["/api/public/openapi.json"]["get"]["security"],
        json!([])
    );
    let list = &doc["paths"]["/api/public/v2/bookings/"]["get"];
    assert_eq!(list["security"], json!([{"partnerAuth": []}]));
    assert_eq!(
        list["responses"]["401"]["$ref"],
        "#/components/responses/Unauthorized"
    );
    // Bodies are closed: a member the document does not list is a violation.
    assert_eq!(
        doc["components"]["schemas"]["Booking"]["additionalProperties"],
        false
    );
}

/// schemathesis against the live production listener: no 5xx, every status code documented,
/// every body and content type as documented.
#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_the_partner_api_conforming_to_its_document() {
    let st = Command::new("st").arg("--version").output();
    assert!(
        st.as_ref().is_ok_and(|o| o.status.success()),
        "the schemathesis CLI `st` is not on PATH: run `just setup` (it pip-installs schemathesis)"
    );
    // Without the rate limit: schemathesis sends far more than 50 requests a second.
    let home = home_with(
        &[],
        &partner_config("[booking.rate_limit]\nrequests_per_second = 0\n"),
    );
    let key = partner_key(home.path(), "booking", "production");
    let server = Server::start(home.path());
    let base = server.base.clone();
    let client = Client::new();

    // A booking and a webhook registration, so the routes that name one reach past their 404.
    let slots: Value = client
        .get(format!(
            "{base}/api/public/v2/inventory/list-by/tour?tourId=5001&limit=1"
        ))
        .header("Partner-Auth", &key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let slot = slots["items"][0]["id"].as_str().expect("an open slot");
    let booking: Value = client
        .post(format!("{base}/api/public/v2/bookings/"))
        .header("Partner-Auth", &key)
        .json(&json!({
            "productId": "1001", "variantId": "5001", "inventoryId": slot,
            "customersDetails": {"count": 1, "customers": [{"personType": "ADULT", "isPrimary": true, "inputFields": [{"id": "fullName", "value": "Grace Hopper"}, {"id": "email", "value": "grace@example.com"}]}]},
            "price": {"amount": slots["items"][0]["pricing"]["persons"][0]["price"], "currencyCode": "EUR"},
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let booking_id = booking["bookingId"].as_str().expect("a booking");
    let webhook: Value = client
        .post(format!("{base}/api/public/v2/webhooks/"))
        .header("Partner-Auth", &key)
        .json(&json!({"url": "http://127.0.0.1:9/hook"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let webhook_id = webhook["data"]["id"].as_str().expect("a webhook");

    let config = home.path().join("schemathesis.toml");
    std::fs::write(
        &config,
        format!(
            "[parameters]\n\"path.productId\" = \"1001\"\n\"path.id\" = \"{booking_id}\"\n\"path.bookingId\" = \"{booking_id}\"\n\"path.webhookId\" = \"{webhook_id}\"\n\"query.tourId\" = \"5001\"\n\"query.variantId\" = \"5001\"\n"
        ),
    )
    .unwrap();
    let out = Command::new("st")
        .arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("{base}/api/public/openapi.json"))
        .args(["--header", &format!("Partner-Auth: {key}")])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,response_schema_conformance,content_type_conformance",
        ])
        // One worker: hypothesis caches lambda sources in a dict that is not safe across threads.
        .args(["--max-examples", "20", "--seed", "1", "--workers", "1"])
        .args(["--request-timeout", "10", "--no-color"])
        .current_dir(home.path())
        .output()
        .expect("run st");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "schemathesis found problems (exit {:?}):\n{stdout}\n{stderr}",
        out.status.code()
    );
}
