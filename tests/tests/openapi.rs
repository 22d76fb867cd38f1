//! `GET /v1/openapi.json` through a real `capstan serve`: public, OpenAPI 3.1, version 0.1.0, and
//! no route the server answers is missing from it. Then schemathesis (`st`, installed by
//! `just setup`) fuzzes the live server from the document and checks every response against it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, fill_path_params, home, key_for};
use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use std::collections::BTreeSet;
use std::process::Command;

/// Every route `host/api/src/v1.rs` serves (method, path template). A route added to the router
/// belongs here and in the document; the document may not lose one of these.
const SERVED: [(&str, &str); 18] = [
    ("POST", "/v1/workflows/{name}"),
    // The same route, documented with the contract's onboard-domain body.
    ("POST", "/v1/workflows/onboard-domain"),
    ("GET", "/v1/executions"),
    ("GET", "/v1/executions/{id}"),
    ("POST", "/v1/executions/{id}/cancel"),
    ("POST", "/v1/executions/{id}/resume"),
    ("POST", "/v1/executions/{id}/rollback"),
    ("POST", "/v1/executions/{id}/retry-finalization"),
    ("POST", "/v1/executions/{id}/retry-maps-whitelist"),
    ("GET", "/v1/executions/{id}/events"),
    ("GET", "/v1/executions/{id}/plan"),
    ("POST", "/v1/executions/{id}/plan/approve"),
    ("GET", "/v1/admin/simulator"),
    ("POST", "/v1/principals/{principalId}/api-keys"),
    ("GET", "/v1/principals/{principalId}/api-keys"),
    ("DELETE", "/v1/api-keys/{apiKeyId}"),
    ("GET", "/v1/audit-logs"),
    ("GET", "/v1/openapi.json"),
];

/// The event catalog's routes (`events_catalog.rs`, documented by hand in openapi.rs): always in
/// the document, served once its router is merged.
const CATALOG: [(&str, &str); 3] = [
    ("GET", "/v1/events/catalog"),
    (
        "GET",
        "/v1/admin/event-versions/{eventType}/{eventVersion}/usage",
    ),
    (
        "POST",
        "/v1/admin/event-versions/{eventType}/{eventVersion}/archive",
    ),
];

/// Routes of the contract that other routers serve or will serve. Each one the server answers
/// (anything but the fallback's 404 `no such route` or 405) must be in the document.
const CONTRACT: [(&str, &str); 16] = [
    (
        "POST",
        "/v1/admin/event-versions/{eventType}/{eventVersion}/archive",
    ),
    ("GET", "/v1/events/catalog"),
    (
        "GET",
        "/v1/admin/event-versions/{eventType}/{eventVersion}/usage",
    ),
    ("GET", "/v1/admin/proxy"),
    ("GET", "/v1/admin/proxy/{path}"),
    ("GET", "/v1/streams/events"),
    ("POST", "/v1/streams/token"),
    ("GET", "/v1/subscriptions"),
    ("POST", "/v1/subscriptions"),
    ("GET", "/v1/subscriptions/{id}"),
    ("PATCH", "/v1/subscriptions/{id}"),
    ("DELETE", "/v1/subscriptions/{id}"),
    ("GET", "/v1/subscriptions/{id}/deliveries"),
    ("POST", "/v1/subscriptions/{id}/redeliver/{eventId}"),
    ("POST", "/v1/subscriptions/{id}/secret"),
    ("GET", "/v1/api-keys"),
];

/// `/v1/executions/{id}` → `/v1/executions/{}` (parameter names do not matter for matching).
fn shape(template: &str) -> String {
    fill_path_params(template, "{}")
}

/// (METHOD, shape) of every operation in the document.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            if ["get", "put", "post", "delete", "patch", "head", "options"]
                .contains(&method.as_str())
            {
                ops.insert((method.to_uppercase(), shape(path)));
            }
        }
    }
    ops
}

/// Whether the server routes `method template` (parameters filled with a placeholder): anything
/// but the fallback's 404 `no such route` and the 405 of a path served for other methods.
async fn served(client: &Client, base: &str, method: &str, template: &str) -> bool {
    let path = fill_path_params(template, "probe");
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    let r = client
        .request(method, format!("{base}{path}"))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    !(status == StatusCode::METHOD_NOT_ALLOWED
        || (status == StatusCode::NOT_FOUND && body["message"] == "no such route"))
}

async fn fetch_document(client: &Client, base: &str) -> Value {
    let r = client
        .get(format!("{base}/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "served without a token");
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    r.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_document_is_public_openapi_3_1_and_covers_every_served_route() {
    let home = home(&["guest-fixtures/fixture-steps.wasm"]);
    let server = Server::start(home.path());
    let base = server.base.clone();
    let client = Client::new();
    let doc = fetch_document(&client, &base).await;

    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    assert_eq!(doc["info"]["version"], "0.1.0");
    assert_eq!(doc["info"]["title"], "Capstan orchestration API");
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    for name in [
        "Execution",
        "ExecutionSummary",
        "ExecutionStage",
        "WorkflowTriggerResponse",
        "OutboxEvent",
        "ApiKeyMetadata",
        "MintedApiKey",
        "AuditLog",
        "Error",
        "AddSubdomainPlan",
        "DomainOnboardingOutcome",
        "OnboardDomainRequest",
        "EventVersionUsage",
    ] {
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "schema {name} is missing"
        );
    }

    let ops = documented(&doc);
    let mut missing = Vec::new();
    for (method, path) in SERVED.iter().chain(&CATALOG) {
        if !ops.contains(&((*method).to_owned(), shape(path))) {
            missing.push(format!(
                "{method} {path} (served by v1.rs or events_catalog.rs)"
            ));
        }
    }
    for (method, path) in CONTRACT {
        if served(&client, &base, method, path).await
            && !ops.contains(&(method.to_owned(), shape(path)))
        {
            missing.push(format!("{method} {path} (the server answers it)"));
        }
    }
    assert!(
        missing.is_empty(),
        "routes missing from /v1/openapi.json:\n{}",
        missing.join("\n")
    );

    // The v1 router's own routes are all served (the document does not invent any of them).
    for (method, path) in SERVED {
        assert!(
            served(&client, &base, method, path).await,
            "{method} {path} is documented but not served"
        );
    }

    // Public operations say so; the others require the bearer key.
    assert_eq!(
        doc["paths"]["/v1/openapi.json"]["get"]["security"],
        serde_json::json!([])
    );
    assert_eq!(
        doc["paths"]["/v1/executions"]["get"]["security"][0]["bearer"],
        serde_json::json!([])
    );
}

/// schemathesis against the live server: no 5xx, every status code documented, every body and
/// content type as documented. Needs `st` (`just setup` installs schemathesis; CI runs it).
#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_the_server_conforming_to_its_document() {
    let st = Command::new("st").arg("--version").output();
    assert!(
        st.as_ref().is_ok_and(|o| o.status.success()),
        "the schemathesis CLI `st` is not on PATH: run `just setup` (it pip-installs schemathesis)"
    );
    let home = home(&["guest-fixtures/fixture-steps.wasm"]);
    let key = key_for(
        home.path(),
        "st",
        &[
            "workflows:fixture-steps",
            "workflows:onboard-domain",
            "principals:manage",
            "audit:read",
            "admin:read",
            "admin:write",
        ],
    );
    let server = Server::start(home.path());
    let base = server.base.clone();
    let client = Client::new();

    // One real execution, so the execution routes reach past their 404. Keys are minted (and may
    // be revoked) for another principal, so the run never revokes its own key.
    let created: Value = client
        .post(format!("{base}/v1/workflows/fixture-steps"))
        .bearer_auth(&key)
        .header("Idempotency-Key", "schemathesis-seed")
        .json(&serde_json::json!({"zone": "ZEXAMPLE-COM"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["executionId"].as_str().expect("executionId");
    let config = home.path().join("schemathesis.toml");
    std::fs::write(
        &config,
        format!(
            "[parameters]\n\"path.id\" = \"{id}\"\n\"path.name\" = \"fixture-steps\"\n\"path.principalId\" = \"st-minted\"\n\"path.eventType\" = \"StageFailed\"\n\"path.eventVersion\" = \"1\"\n\n# 501 is the documented answer of a feature this node does not configure (the admin proxy);\n# status_code_conformance still requires it to be documented.\n[checks.not_a_server_error]\nexpected-statuses = [\"2XX\", \"3XX\", \"4XX\", 501]\n"
        ),
    )
    .unwrap();

    // Documented operations another router will serve but this build does not yet are skipped
    // (the coverage test above checks the other direction).
    let doc = fetch_document(&client, &base).await;
    let mut excluded = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if !served(&client, &base, &method.to_uppercase(), path).await {
                excluded.push(path.clone());
            }
        }
    }
    if !excluded.is_empty() {
        eprintln!("documented but not served by this build (skipped): {excluded:?}");
    }
    // An SSE feed never ends: schemathesis cannot check it.
    excluded.push("/v1/streams/events".to_owned());

    let mut cmd = Command::new("st");
    cmd.arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("{base}/v1/openapi.json"))
        .args(["--header", &format!("Authorization: Bearer {key}")])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,response_schema_conformance,content_type_conformance",
        ])
        // One worker: hypothesis caches lambda sources in a dict that is not safe across threads
        // ("AST constructor recursion depth mismatch" under --workers 2).
        .args(["--max-examples", "20", "--seed", "1", "--workers", "1"])
        .args(["--request-timeout", "10"])
        .args(["--no-color"]);
    for path in &excluded {
        cmd.args(["--exclude-path", path]);
    }
    let out = cmd.current_dir(home.path()).output().expect("run st");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "schemathesis found problems (exit {:?}):\n{stdout}\n{stderr}",
        out.status.code()
    );
}
