//! The public event catalog and the admin event-version routes through a real `capstan serve`,
//! and every event the shipped workflows publish checked against the served catalog's schemas.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, home, home_with, key_for};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

const TYPES: [&str; 19] = [
    "ExecutionQueued",
    "ExecutionStarted",
    "StageStarted",
    "StageSucceeded",
    "StageFailed",
    "ExecutionWaiting",
    "ExecutionPaused",
    "ExecutionCancellationRequested",
    "ExecutionCanceled",
    "ExecutionSucceeded",
    "ExecutionFailed",
    "RollbackStarted",
    "ExecutionRolledBack",
    "RollbackFailed",
    "CommandQueued",
    "SubdomainPlanReady",
    "SubdomainPlanApproved",
    "DomainOnboarded",
    "WorkflowEventEmitted",
];

/// `GET /v1/events/catalog` without a token, as validators by `<EventType>.v<N>`.
async fn catalog(c: &Client, base: &str) -> (Value, BTreeMap<String, jsonschema::Validator>) {
    let r = c
        .get(format!("{base}/v1/events/catalog"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    let validators = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let v = jsonschema::validator_for(&e["schema"])
                .unwrap_or_else(|err| panic!("{} schema does not compile: {err}", e["name"]));
            (e["name"].as_str().unwrap().to_owned(), v)
        })
        .collect();
    (body, validators)
}

/// Checks every event of the execution against its catalogued schema; returns the types.
async fn check_events(
    c: &Client,
    base: &str,
    key: &str,
    id: &str,
    validators: &BTreeMap<String, jsonschema::Validator>,
) -> BTreeSet<String> {
    let body: Value = c
        .get(format!("{base}/v1/executions/{id}/events"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut seen = BTreeSet::new();
    for e in body["events"].as_array().unwrap() {
        let name = format!(
            "{}.v{}",
            e["eventType"].as_str().unwrap(),
            e["eventVersion"].as_str().unwrap()
        );
        let validator = validators
            .get(&name)
            .unwrap_or_else(|| panic!("{name} is not in the catalog"));
        let errors: Vec<String> = validator
            .iter_errors(&e["payloadJson"])
            .map(|err| format!("{} at {}", err, err.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{name}: {errors:?}\nin {:#}",
            e["payloadJson"]
        );
        seen.insert(e["eventType"].as_str().unwrap().to_owned());
    }
    seen
}

async fn until(c: &Client, base: &str, key: &str, id: &str, statuses: &[&str]) -> Value {
    capstan_e2e::until_status(c, base, key, id, statuses).await
}

async fn trigger(c: &Client, base: &str, key: &str, workflow: &str, body: Value) -> String {
    let r = c
        .post(format!("{base}/v1/workflows/{workflow}"))
        .bearer_auth(key)
        .header("Idempotency-Key", format!("k-{workflow}-{}", body))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    body["executionId"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn the_event_catalog_and_the_admin_event_version_routes() {
    let home = home(&["workflows/hello.wasm"]);
    let reader = key_for(home.path(), "reader", &["admin:read", "workflows:hello"]);
    let writer = key_for(home.path(), "writer", &["admin:write"]);
    let nobody = key_for(home.path(), "nobody", &["workflows:hello"]);
    let server = Server::start(home.path());
    let base = server.base.clone();
    let c = Client::new();

    // The catalog: public, every published type as v1, exact item shape, compilable schemas.
    let (body, validators) = catalog(&c, &base).await;
    assert_eq!(keys(&body), set(&["events"]));
    let events = body["events"].as_array().unwrap();
    let types: BTreeSet<String> = events
        .iter()
        .map(|e| e["eventType"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(types, set(&TYPES));
    for e in events {
        assert_eq!(
            keys(e),
            set(&[
                "eventType",
                "eventVersion",
                "name",
                "description",
                "lifecycle",
                "schema"
            ])
        );
        assert_eq!(e["eventVersion"], "1");
        assert_eq!(
            e["name"],
            format!("{}.v1", e["eventType"].as_str().unwrap())
        );
        assert_eq!(e["lifecycle"]["state"], "active");
        assert!(e["lifecycle"]["introducedAt"].is_string());
        assert_eq!(
            e["schema"]["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
    }

    // Events of a real run match their schemas.
    let id = trigger(&c, &base, &reader, "hello", json!({"name": "Ada"})).await;
    until(&c, &base, &reader, &id, &["succeeded"]).await;
    let seen = check_events(&c, &base, &reader, &id, &validators).await;
    assert!(seen.contains("ExecutionSucceeded"), "{seen:?}");

    // Usage: admin:read, 404 for an unknown version, the EventVersionUsage shape.
    let usage = |key: Option<&str>, path: &str| {
        let mut r = c.get(format!("{base}/v1/admin/event-versions/{path}/usage"));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    let r = usage(None, "ExecutionQueued/1").await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = usage(Some(&nobody), "ExecutionQueued/1").await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["error"], "forbidden");
    assert_eq!(b["message"], "Missing required permission: admin:read");
    for unknown in ["Nope/1", "ExecutionQueued/2"] {
        let r = usage(Some(&reader), unknown).await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{unknown}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "not_found");
    }
    let r = usage(Some(&reader), "ExecutionQueued/1").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let u: Value = r.json().await.unwrap();
    assert_eq!(
        keys(&u),
        set(&[
            "eventType",
            "eventVersion",
            "lifecycle",
            "subscriberCount",
            "subscribers"
        ])
    );
    assert_eq!(u["eventType"], "ExecutionQueued");
    assert_eq!(u["eventVersion"], "1");
    assert_eq!(u["lifecycle"]["state"], "active");
    assert_eq!(u["subscriberCount"], 0);
    assert_eq!(u["subscribers"], json!([]));

    // Archive: admin:write, confirmation, only a deprecated version.
    let archive = |key: &str, path: &str, body: Option<&str>| {
        let mut r = c
            .post(format!("{base}/v1/admin/event-versions/{path}/archive"))
            .bearer_auth(key.to_owned());
        if let Some(b) = body {
            r = r
                .header("content-type", "application/json")
                .body(b.to_owned());
        }
        r.send()
    };
    let r = archive(&reader, "StageFailed/1", Some(r#"{"confirm":true}"#))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        r.json::<Value>().await.unwrap()["message"],
        "Missing required permission: admin:write"
    );
    let r = archive(&writer, "Nope/1", Some(r#"{"confirm":true}"#))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    for bad in [
        None,
        Some("{}"),
        Some(r#"{"confirm":false}"#),
        Some("not json"),
    ] {
        let r = archive(&writer, "StageFailed/1", bad).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad:?}");
        let b: Value = r.json().await.unwrap();
        assert_eq!(b["error"], "validation_error", "{bad:?}");
        assert!(!b["issues"].as_array().unwrap().is_empty(), "{b}");
    }
    let r = archive(
        &writer,
        "StageFailed/1",
        Some(r#"{"confirm":true,"note":"x"}"#),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["error"], "state_invalid");
    assert_eq!(b["reason"], "not_deprecated");

    // An operator deprecates a version (store row, as the CLI will); then it can be archived, once.
    let pool = capstan_e2e::database(home.path()).await;
    sqlx::query(
        "INSERT INTO event_versions (event_type, event_version, state, deprecated_ms, replacement, updated_ms) VALUES ('StageFailed', '1', 'deprecated', 1767225600000, 'StageFailed.v2', 1767225600000)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let r = usage(Some(&reader), "StageFailed/1").await.unwrap();
    let u: Value = r.json().await.unwrap();
    assert_eq!(u["lifecycle"]["state"], "deprecated");
    assert_eq!(u["lifecycle"]["deprecatedAt"], "2026-01-01T00:00:00.000Z");
    assert_eq!(u["lifecycle"]["replacement"], "StageFailed.v2");
    let r = archive(&writer, "StageFailed/1", Some(r#"{"confirm":true}"#))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["name"], "StageFailed.v1");
    assert_eq!(b["lifecycle"]["state"], "archived");
    assert!(b["lifecycle"]["archivedAt"].is_string());
    assert_eq!(b["lifecycle"]["deprecatedAt"], "2026-01-01T00:00:00.000Z");
    let r = archive(&writer, "StageFailed/1", Some(r#"{"confirm":true}"#))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(
        r.json::<Value>().await.unwrap()["reason"],
        "already_archived"
    );
    let (body, _) = catalog(&c, &base).await;
    let stage_failed = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "StageFailed.v1")
        .unwrap()
        .clone();
    assert_eq!(stage_failed["lifecycle"]["state"], "archived");
}

#[tokio::test]
async fn the_shipped_workflows_publish_catalogued_payloads() {
    let home = home_with(
        &[
            "workflows/add-subdomain.wasm",
            "workflows/onboard-domain.wasm",
        ],
        "workers = 4\nlease_ms = 5000\n[simulator]\ndns_propagation_ms = 0\ncertificate_issue_ms = 0\ncdn_deploy_ms = 0\n",
    );
    let key = key_for(
        home.path(),
        "ops",
        &["workflows:add-subdomain", "workflows:onboard-domain"],
    );
    let server = Server::start(home.path());
    let base = server.base.clone();
    let c = Client::new();
    let (_, validators) = catalog(&c, &base).await;
    let mut seen = BTreeSet::new();

    // add-subdomain: plan ready, approved, applied.
    let apex = json!({"dnsName": "dapex.cdn.sim.capstan.dev", "hostedZoneId": "ZCDNSIMULATED", "evaluateTargetHealth": false});
    let id = trigger(
        &c,
        &base,
        &key,
        "add-subdomain",
        json!({"rootDomain": "example.com", "subdomains": ["www", "api"], "apexAlias": apex}),
    )
    .await;
    until(&c, &base, &key, &id, &["waiting"]).await;
    let mut plan = Value::Null;
    for _ in 0..200 {
        let r = c
            .get(format!("{base}/v1/executions/{id}/plan"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            plan = r.json().await.unwrap();
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let r = c
        .post(format!("{base}/v1/executions/{id}/plan/approve"))
        .bearer_auth(&key)
        .json(&json!({"planHash": plan["planHash"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let e = until(&c, &base, &key, &id, &["succeeded", "failed", "paused"]).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    seen.extend(check_events(&c, &base, &key, &id, &validators).await);

    // onboard-domain: DomainOnboarded with the outcome.
    let id = trigger(
        &c,
        &base,
        &key,
        "onboard-domain",
        json!({"domain": "example.org", "ticketId": "OPS-1"}),
    )
    .await;
    let e = until(&c, &base, &key, &id, &["succeeded", "failed", "paused"]).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    seen.extend(check_events(&c, &base, &key, &id, &validators).await);

    for ty in [
        "SubdomainPlanReady",
        "SubdomainPlanApproved",
        "DomainOnboarded",
        "ExecutionWaiting",
    ] {
        assert!(seen.contains(ty), "{ty} not published: {seen:?}");
    }
}
