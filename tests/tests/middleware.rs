//! What every request passes through: a request id taken from the client or made by the node
//! and returned on the answer, a body limit answered in each API's own error shape, and gzip
//! for large answers to clients that accept it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, home_with, key_for, partner_config, partner_key};
use reqwest::StatusCode;
use serde_json::Value;

#[tokio::test]
async fn request_ids_body_limits_and_compression() {
    let home = home_with(&["workflows/hello.wasm"], &partner_config(""));
    let key = key_for(home.path(), "ops", &["workflows:hello"]);
    let partner = partner_key(home.path(), "booking", "production");
    let server = Server::start(home.path());
    let c = reqwest::Client::new();

    // The client's request id comes back; without one, the node makes one.
    let r = c
        .get(format!("{}/healthz", server.base))
        .header("x-request-id", "req-7f3a")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "req-7f3a");
    let r = c
        .get(format!("{}/healthz", server.base))
        .send()
        .await
        .unwrap();
    let made = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(made.len(), 36, "a UUID: {made}");

    // A body over the limit: 413 in the /v1 shape, and in the partner API's.
    let big = vec![b'x'; 2 * 1024 * 1024];
    let r = c
        .post(format!("{}/v1/workflows/hello", server.base))
        .bearer_auth(&key)
        .header("Idempotency-Key", "too-big")
        .header("Content-Type", "application/json")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "payload_too_large", "{body}");
    assert!(body["message"].as_str().unwrap().contains("bytes"));
    // A fresh connection: the node closes one whose body it did not read to the end.
    let r = reqwest::Client::new()
        .post(format!("{}/api/public/v2/bookings/", server.base))
        .header("Partner-Auth", &partner)
        .header("Content-Type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], 413, "{body}");
    assert_eq!(body["error"]["code"], "E_PAYLOAD_TOO_LARGE", "{body}");

    // The sandbox listener does the same.
    let r = reqwest::Client::new()
        .get(format!("{}/healthz", server.sandbox))
        .header("x-request-id", "sandbox-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "sandbox-1");

    // A large answer, gzip'd for a client that accepts it, as it is for one that does not.
    let c = reqwest::Client::new();
    let r = c
        .get(format!("{}/v1/openapi.json", server.base))
        .header("Accept-Encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-encoding"], "gzip");
    let zipped = r.bytes().await.unwrap();
    assert_eq!(&zipped[..2], &[0x1f, 0x8b]);
    let plain = c
        .get(format!("{}/v1/openapi.json", server.base))
        .send()
        .await
        .unwrap();
    assert!(plain.headers().get("content-encoding").is_none());
    let plain = plain.bytes().await.unwrap();
    assert!(
        zipped.len() * 3 < plain.len(),
        "{} vs {}",
        zipped.len(),
        plain.len()
    );
}
