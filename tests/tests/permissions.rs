//! Every authenticated `/v1` route checks its permission from the document's table: a caller
//! without it gets 403 `forbidden` with `Missing required permission: <permission>`, a caller with
//! it gets past authorization. And a key that goes over its rate gets 429 `rate_limited`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, home_with, key_for};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};

const CONFIG: &str = "workers = 2\n[simulator]\ndns_propagation_ms = 0\n[rate_limit]\nrequests_per_second = 1000\nburst = 1000\n";

#[tokio::test]
async fn every_route_requires_its_permission() {
    let home = home_with(&["workflows/hello.wasm"], CONFIG);
    let all = key_for(
        home.path(),
        "all",
        &[
            "workflows:hello",
            "principals:manage",
            "audit:read",
            "admin:read",
            "admin:write",
        ],
    );
    let none = key_for(home.path(), "nobody", &[]);
    let victim = key_for(home.path(), "victim", &[]);
    let server = Server::start(home.path());
    let base = &server.base;
    let c = Client::new();

    // An execution to address.
    let r = c
        .post(format!("{base}/v1/workflows/hello"))
        .bearer_auth(&all)
        .header("Idempotency-Key", "perm-1")
        .json(&json!({"name": "perm"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = r.json::<Value>().await.unwrap()["executionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let keys: Value = c
        .get(format!("{base}/v1/principals/victim/api-keys"))
        .bearer_auth(&victim)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let victim_key = keys["apiKeys"][0]["apiKeyId"].as_str().unwrap().to_owned();

    let routes: Vec<(Method, String, &str, Option<Value>)> = vec![
        (
            Method::POST,
            "/v1/workflows/hello".into(),
            "workflows:hello",
            Some(json!({"name": "x"})),
        ),
        (
            Method::GET,
            format!("/v1/executions/{id}"),
            "workflows:hello",
            None,
        ),
        (
            Method::POST,
            format!("/v1/executions/{id}/cancel"),
            "workflows:hello",
            None,
        ),
        (
            Method::POST,
            format!("/v1/executions/{id}/resume"),
            "workflows:hello",
            None,
        ),
        (
            Method::POST,
            format!("/v1/executions/{id}/rollback"),
            "workflows:hello",
            None,
        ),
        (
            Method::GET,
            format!("/v1/executions/{id}/events"),
            "workflows:hello",
            None,
        ),
        (
            Method::GET,
            format!("/v1/executions/{id}/plan"),
            "workflows:hello",
            None,
        ),
        (
            Method::POST,
            format!("/v1/executions/{id}/plan/approve"),
            "workflows:hello",
            Some(json!({"planHash": "0".repeat(64)})),
        ),
        (
            Method::POST,
            "/v1/principals/victim/api-keys".into(),
            "principals:manage",
            Some(json!({})),
        ),
        (
            Method::GET,
            "/v1/principals/victim/api-keys".into(),
            "principals:manage",
            None,
        ),
        (
            Method::DELETE,
            format!("/v1/api-keys/{victim_key}"),
            "principals:manage",
            None,
        ),
        (Method::GET, "/v1/audit-logs".into(), "audit:read", None),
        (
            Method::GET,
            "/v1/admin/simulator".into(),
            "admin:read",
            None,
        ),
        (Method::GET, "/v1/admin/proxy".into(), "admin:read", None),
        (
            Method::GET,
            "/v1/admin/proxy/some/page".into(),
            "admin:read",
            None,
        ),
        (
            Method::GET,
            "/v1/admin/event-versions/ExecutionQueued/1/usage".into(),
            "admin:read",
            None,
        ),
        (
            Method::POST,
            "/v1/admin/event-versions/ExecutionQueued/1/archive".into(),
            "admin:write",
            Some(json!({"confirm": true})),
        ),
    ];
    for (method, path, permission, body) in routes {
        let send = |key: &str| {
            let mut r = c
                .request(method.clone(), format!("{base}{path}"))
                .bearer_auth(key)
                .header("Idempotency-Key", format!("perm-{path}"));
            if let Some(b) = &body {
                r = r.json(b);
            }
            r.send()
        };
        let denied = send(&none).await.unwrap();
        assert_eq!(
            denied.status(),
            StatusCode::FORBIDDEN,
            "{method} {path} without {permission}"
        );
        let body_denied: Value = denied.json().await.unwrap();
        assert_eq!(body_denied["error"], "forbidden");
        assert_eq!(
            body_denied["message"],
            format!("Missing required permission: {permission}"),
            "{method} {path}"
        );
        let allowed = send(&all).await.unwrap();
        assert!(
            !matches!(
                allowed.status(),
                StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED
            ),
            "{method} {path} with {permission}: {}",
            allowed.status()
        );
    }
    // The list is narrowed rather than refused: without workflow permissions it is empty.
    let list: Value = c
        .get(format!("{base}/v1/executions"))
        .bearer_auth(&none)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["executions"], json!([]));
}

#[tokio::test]
async fn a_key_over_its_rate_gets_429_with_retry_after() {
    let home = home_with(
        &["workflows/hello.wasm"],
        "[rate_limit]\nrequests_per_second = 0.5\nburst = 3\n",
    );
    let key = key_for(home.path(), "ops", &["workflows:hello"]);
    let other = key_for(home.path(), "other", &["workflows:hello"]);
    let server = Server::start(home.path());
    let c = Client::new();
    let get = |k: &str| {
        c.get(format!("{}/v1/executions", server.base))
            .bearer_auth(k.to_owned())
            .send()
    };
    for _ in 0..3 {
        assert_eq!(get(&key).await.unwrap().status(), StatusCode::OK);
    }
    let limited = get(&key).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    let body: Value = limited.json().await.unwrap();
    assert_eq!(body["error"], "rate_limited");
    assert_eq!(
        get(&other).await.unwrap().status(),
        StatusCode::OK,
        "another key has its own bucket"
    );
}

/// A one-thread HTTP upstream that answers every GET with what it received.
fn upstream() -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let text = String::from_utf8_lossy(&buf).to_string();
            let line = text.lines().next().unwrap_or_default().to_owned();
            let principal = text
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("x-capstan-principal: ")
                        .map(str::to_owned)
                })
                .unwrap_or_default();
            let auth = text.to_ascii_lowercase().contains("authorization:");
            if line.contains("/big") {
                // More than the proxy passes on (8 MiB), announced honestly.
                let size = 9 * 1024 * 1024;
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-length: {size}\r\nconnection: close\r\n\r\n"
                );
                let _ = stream.write_all(&vec![b'x'; size]);
                continue;
            }
            let body =
                json!({"requestLine": line, "principal": principal, "sawAuthorization": auth})
                    .to_string();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{addr}/dash")
}

#[tokio::test]
async fn the_admin_proxy_forwards_gets_with_the_principal_or_answers_501() {
    let up = upstream();
    let home = home_with(&[], &format!("admin_proxy_upstream = {up:?}\n"));
    let admin = key_for(home.path(), "admin", &["admin:read"]);
    let server = Server::start(home.path());
    let c = Client::new();
    let described: Value = c
        .get(format!("{}/v1/admin/proxy", server.base))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(described["upstream"], format!("{up}/"));
    let r = c
        .get(format!(
            "{}/v1/admin/proxy/reports/daily?day=2026-11-22",
            server.base
        ))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let echoed: Value = r.json().await.unwrap();
    assert_eq!(
        echoed["requestLine"],
        "GET /dash/reports/daily?day=2026-11-22 HTTP/1.1"
    );
    assert_eq!(echoed["principal"], "admin");
    assert_eq!(
        echoed["sawAuthorization"], false,
        "the caller's key stays with Capstan"
    );

    // Every way to make the proxy fetch another host, or leave the base path, is refused
    // before anything is sent; another local server stands in for the metadata service.
    let other = upstream();
    let host = other
        .trim_start_matches("http://")
        .trim_end_matches("/dash");
    for crafted in [
        format!("http:%2F%2F{host}%2Fdash"),
        format!("%2F%2F{host}%2Fdash"),
        format!("/{host}/dash"),
        format!("%5C%5C{host}%5Cdash"),
        "..%2F..%2Fx".to_owned(),
        "%252e%252e/x".to_owned(),
        "a%5C..%5C..%5Cx".to_owned(),
    ] {
        let r = c
            .get(format!("{}/v1/admin/proxy/{crafted}", server.base))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{crafted}: {body}");
        assert_eq!(body["error"], "invalid_path", "{crafted}");
    }
    // An answer larger than the proxy passes on is a 502, not memory.
    let r = c
        .get(format!("{}/v1/admin/proxy/big", server.base))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"],
        "upstream_too_large"
    );
    drop(server);

    let home = home_with(&[], "");
    let admin = key_for(home.path(), "admin", &["admin:read"]);
    let server = Server::start(home.path());
    let r = c
        .get(format!("{}/v1/admin/proxy/x", server.base))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "not_configured");
}
