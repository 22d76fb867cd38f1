//! The `/v1` API through a real `capstan serve`: authentication, permissions, triggers with
//! idempotency, execution reads and control, keys and the audit log.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, home, key_for};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use std::collections::BTreeSet;

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

async fn wait_for(client: &Client, base: &str, key: &str, id: &str, status: &str) -> Value {
    capstan_e2e::until_status(client, base, key, id, &[status]).await
}

#[tokio::test]
async fn the_v1_api_end_to_end() {
    let home = home(&["guest-fixtures/fixture-steps.wasm", "workflows/hello.wasm"]);
    let ops = key_for(
        home.path(),
        "ops",
        &["workflows:fixture-steps", "workflows:hello"],
    );
    let viewer = key_for(home.path(), "viewer", &["workflows:hello"]);
    let admin = key_for(home.path(), "admin", &["principals:manage", "audit:read"]);
    let server = Server::start(home.path());
    let base = server.base.clone();
    let c = Client::new();
    let trigger = |key: &str, idem: Option<&str>, body: &str| {
        let mut r = c
            .post(format!("{base}/v1/workflows/fixture-steps"))
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(i) = idem {
            r = r.header("Idempotency-Key", i);
        }
        r.send()
    };

    // Authentication.
    let r = c
        .post(format!("{base}/v1/workflows/fixture-steps"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "unauthorized");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("bearer token is missing or invalid")
    );
    // A different last character (a fixed one would equal the real key one time in 62).
    let last = if ops.ends_with('x') { 'y' } else { 'x' };
    let forged = format!("{}{last}", &ops[..ops.len() - 1]);
    assert_eq!(
        trigger(&forged, Some("k"), "{}").await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );

    // Trigger errors, each in the documented shape.
    let r = trigger(&ops, None, r#"{"zone":"ZEXAMPLE-COM"}"#)
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"],
        "missing_idempotency_key"
    );
    let r = trigger(&ops, Some("k0"), "{not json").await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "invalid_json");
    let r = trigger(&ops, Some("k0"), r#"{"zone": 5, "extra": true}"#)
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "validation_error");
    let issues = body["issues"].as_array().unwrap();
    assert!(issues.len() >= 2, "one issue per problem: {issues:?}");
    assert!(issues.iter().any(|i| i["path"] == "/zone"), "{issues:?}");
    let r = c
        .post(format!("{base}/v1/workflows/nope"))
        .bearer_auth(&ops)
        .header("Idempotency-Key", "x")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = trigger(&viewer, Some("k0"), r#"{"zone":"ZEXAMPLE-COM"}"#)
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        r.json::<Value>().await.unwrap()["message"],
        "Missing required permission: workflows:fixture-steps"
    );

    // A trigger, its idempotent replay and a conflicting reuse of the key.
    let body = r#"{"zone":"ZEXAMPLE-COM","stages":3}"#;
    let r = trigger(&ops, Some("order-1"), body).await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let created: Value = r.json().await.unwrap();
    assert_eq!(
        keys(&created),
        set(&[
            "estimatedDurationSeconds",
            "executionId",
            "links",
            "stages",
            "status",
            "workflow",
            "workflowRunId"
        ])
    );
    // The status the trigger committed: `running` when a worker slot was free at once.
    let committed = created["status"].as_str().unwrap().to_owned();
    assert!(committed == "queued" || committed == "running", "{created}");
    assert_eq!(created["stages"].as_array().unwrap().len(), 11);
    let id = created["executionId"].as_str().unwrap().to_owned();
    assert_eq!(
        created["links"],
        json!({"self": format!("/v1/executions/{id}"), "cancel": format!("/v1/executions/{id}/cancel"), "events": format!("/v1/executions/{id}/events")})
    );
    let r = trigger(&ops, Some("order-1"), body).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["executionId"], id.as_str());
    let r = trigger(
        &ops,
        Some("order-1"),
        r#"{"zone":"ZEXAMPLE-COM","stages":4}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"],
        "idempotency_conflict"
    );

    // The execution runs to success; its shape is exactly the document's.
    let e = wait_for(&c, &base, &ops, &id, "succeeded").await;
    assert_eq!(
        keys(&e),
        set(&[
            "executionId",
            "workflow",
            "principalId",
            "status",
            "currentStage",
            "createdAt",
            "finishedAt",
            "cancellationRequestedAt",
            "inputJson",
            "stages"
        ])
    );
    assert_eq!(e["principalId"], "ops");
    let stages = e["stages"].as_array().unwrap();
    let names: Vec<&str> = stages
        .iter()
        .map(|s| s["stageName"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["step-1", "step-2", "step-3", "finalize"]);
    for s in stages {
        assert_eq!(
            keys(s),
            set(&[
                "id",
                "executionId",
                "stageName",
                "startedAt",
                "status",
                "finishedAt",
                "outputJson"
            ])
        );
    }
    assert!(e["createdAt"].as_str().unwrap().ends_with('Z'));

    // Reads are per workflow permission.
    let r = c
        .get(format!("{base}/v1/executions/{id}"))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = c
        .get(format!(
            "{base}/v1/executions/00000000-0000-0000-0000-000000000000"
        ))
        .bearer_auth(&ops)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // Every call on an execution looks it up before it checks the caller's permission: an
    // unknown one is 404 `not_found` on each route (its feed too).
    let unknown = "00000000-0000-0000-0000-000000000000";
    for (method, path, stream) in [
        (reqwest::Method::GET, "events", false),
        (reqwest::Method::GET, "events", true),
        (reqwest::Method::GET, "receipts", false),
        (reqwest::Method::GET, "plan", false),
        (reqwest::Method::POST, "cancel", false),
        (reqwest::Method::POST, "resume", false),
        (reqwest::Method::POST, "rollback", false),
    ] {
        let mut request = c
            .request(
                method.clone(),
                format!("{base}/v1/executions/{unknown}/{path}"),
            )
            .bearer_auth(&ops);
        if stream {
            request = request.header(reqwest::header::ACCEPT, "text/event-stream");
        }
        let r = request.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{method} {path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "not_found", "{method} {path}: {body}");
        assert_eq!(
            body["message"],
            format!("execution {unknown} not found"),
            "{method} {path}"
        );
    }
    let list: Value = c
        .get(format!("{base}/v1/executions?limit=10"))
        .bearer_auth(&ops)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["executions"][0]["executionId"], id.as_str());
    assert_eq!(keys(&list["executions"][0]).len(), 8);
    let list: Value = c
        .get(format!("{base}/v1/executions"))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        list["executions"],
        json!([]),
        "the viewer's list holds only workflows it may use"
    );
    for bad in ["status=done", "limit=0", "limit=101", "color=red"] {
        let r = c
            .get(format!("{base}/v1/executions?{bad}"))
            .bearer_auth(&ops)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "invalid_filter");
    }

    // Events, in order.
    let events: Value = c
        .get(format!("{base}/v1/executions/{id}/events"))
        .bearer_auth(&ops)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let events = events["events"].as_array().unwrap();
    assert_eq!(events[0]["eventType"], "ExecutionQueued");
    assert_eq!(events.last().unwrap()["eventType"], "ExecutionSucceeded");
    assert_eq!(
        keys(&events[0]),
        set(&[
            "eventId",
            "eventType",
            "eventVersion",
            "executionId",
            "occurredAt",
            "principalId",
            "payloadJson",
            "dispatchedAt",
            "routedAt",
            "streamPublishedAt",
            "traceparent"
        ])
    );
    // Published to streams when committed (no subscription needed), never before it occurred
    // (the timestamps have one format, so they compare as text).
    for e in events {
        let (occurred, published) = (
            e["occurredAt"].as_str().unwrap(),
            e["streamPublishedAt"].as_str().unwrap(),
        );
        assert!(published >= occurred, "{e}");
    }

    // Control: cancel of a finished execution is a 409 with a reason; rollback is receipt-backed.
    let r = c
        .post(format!("{base}/v1/executions/{id}/cancel"))
        .bearer_auth(&ops)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (body["error"].as_str(), body["reason"].as_str()),
        (Some("state_invalid"), Some("not_cancelable"))
    );
    let r = c
        .post(format!("{base}/v1/executions/{id}/rollback"))
        .bearer_auth(&ops)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["command"]["operation"], "rollback");
    assert_eq!(body["workflowRunId"], created["workflowRunId"]);
    let rolled = wait_for(&c, &base, &ops, &id, "rolled_back").await;
    assert_eq!(
        rolled["stages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["stageName"].as_str().unwrap().starts_with("rollback:"))
            .count(),
        3
    );

    // A waiting hello can be canceled.
    let r = c
        .post(format!("{base}/v1/workflows/hello"))
        .bearer_auth(&viewer)
        .header("Idempotency-Key", "h1")
        .json(&json!({"name": "x", "pauseSeconds": 3600}))
        .send()
        .await
        .unwrap();
    let hello = r.json::<Value>().await.unwrap()["executionId"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_for(&c, &base, &viewer, &hello, "waiting").await;
    let r = c
        .post(format!("{base}/v1/executions/{hello}/cancel"))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    assert_eq!(
        r.json::<Value>().await.unwrap()["execution"]["status"],
        "canceled"
    );

    // Keys: own mint and list; revocation needs principals:manage and takes effect at once.
    let r = c
        .post(format!("{base}/v1/principals/viewer/api-keys"))
        .bearer_auth(&viewer)
        .json(&json!({"expiresInDays": 7}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let minted: Value = r.json().await.unwrap();
    assert_eq!(
        keys(&minted["apiKey"]),
        set(&[
            "apiKeyId",
            "expiresAt",
            "plaintextToken",
            "prefix",
            "principalId",
            "pepperVersion"
        ])
    );
    let second = minted["apiKey"]["plaintextToken"]
        .as_str()
        .unwrap()
        .to_owned();
    // A key may not mint one that outlives it: asked for longer, refused; by default, cut.
    let r = c
        .post(format!("{base}/v1/principals/viewer/api-keys"))
        .bearer_auth(&second)
        .json(&json!({"expiresInDays": 30}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "forbidden");
    assert!(
        body["message"].as_str().unwrap().contains("outlives"),
        "{body}"
    );
    let r = c
        .post(format!("{base}/v1/principals/viewer/api-keys"))
        .bearer_auth(&second)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let third: Value = r.json().await.unwrap();
    assert_eq!(
        third["apiKey"]["expiresAt"], minted["apiKey"]["expiresAt"],
        "the default lifetime (90 days) is cut to the minting key's 7"
    );
    let listed: Value = c
        .get(format!("{base}/v1/principals/viewer/api-keys"))
        .bearer_auth(&second)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let listed = listed["apiKeys"].as_array().unwrap();
    assert_eq!(listed.len(), 3);
    assert!(listed.iter().all(|k| k.get("plaintextToken").is_none()));
    assert_eq!(
        keys(&listed[0]),
        set(&[
            "apiKeyId",
            "createdAt",
            "expiresAt",
            "prefix",
            "principalId",
            "pepperVersion",
            "lastUsedAt",
            "revokedAt"
        ])
    );
    let r = c
        .get(format!("{base}/v1/principals/ops/api-keys"))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let key_id = minted["apiKey"]["apiKeyId"].as_str().unwrap();
    let r = c
        .delete(format!("{base}/v1/api-keys/{key_id}"))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = c
        .delete(format!("{base}/v1/api-keys/{key_id}"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = c
        .get(format!("{base}/v1/principals/viewer/api-keys"))
        .bearer_auth(&second)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "a revoked key fails the next request"
    );

    // Audit: denied decisions are recorded with the route template.
    let audit: Value = c
        .get(format!(
            "{base}/v1/audit-logs?result=denied&principalId=viewer"
        ))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let logs = audit["auditLogs"].as_array().unwrap();
    assert!(
        logs.iter().any(|l| l["route"] == "/v1/executions/{id}"
            && l["action"] == "workflows:fixture-steps"
            && l["executionId"] == id.as_str()),
        "{logs:?}"
    );
    assert!(logs.iter().all(|l| keys(l)
        == set(&[
            "id",
            "action",
            "at",
            "method",
            "principalId",
            "resource",
            "route",
            "result",
            "executionId",
            "ip",
            "userAgent"
        ])));
    let r = c
        .get(format!("{base}/v1/audit-logs"))
        .bearer_auth(&ops)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        r.json::<Value>().await.unwrap()["message"],
        "Missing required permission: audit:read"
    );
}

#[tokio::test]
async fn serve_refuses_to_start_without_a_pepper() {
    let home = home(&["workflows/hello.wasm"]);
    let out = capstan_e2e::capstan(home.path())
        .env_remove("CAPSTAN_PEPPERS")
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--sandbox-listen",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CAPSTAN_PEPPERS"));
}

/// `GET /v1/executions/{id}?wait=` awaits the result in one request: it answers once the
/// execution is neither queued nor running (here: succeeded, or waiting on its timer), and a
/// wait that is not a bounded duration is refused before anything is read.
#[tokio::test]
async fn an_execution_is_awaited_in_one_request() {
    // Every DNS change answers after 700 ms: a two-stage run is running for over a second.
    let home = capstan_e2e::home_with(
        &["guest-fixtures/fixture-steps.wasm"],
        "workers = 4\nlease_ms = 3000\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[simulator]\ndns_propagation_ms = 0\n[[simulator.faults]]\nop = \"dns.change-records\"\nlatency_ms = 700\n",
    );
    let key = key_for(home.path(), "ops", &["workflows:fixture-steps"]);
    let server = Server::start(home.path());
    let c = Client::new();
    let trigger = async |idem: &str, input: Value| -> String {
        let r = c
            .post(format!("{}/v1/workflows/fixture-steps", server.base))
            .bearer_auth(&key)
            .header("Idempotency-Key", idem)
            .json(&input)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        r.json::<Value>().await.unwrap()["executionId"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let get = async |id: &str, query: &str| -> (StatusCode, Value) {
        let r = c
            .get(format!("{}/v1/executions/{id}{query}", server.base))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap())
    };

    let id = trigger("await-1", json!({"zone": "ZEXAMPLE-COM", "stages": 2})).await;
    let (status, now) = get(&id, "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        ["queued", "running"].contains(&now["status"].as_str().unwrap()),
        "a plain read answers at once: {now}"
    );
    let (status, done) = get(&id, "?wait=20s").await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["status"], "succeeded", "{done}");
    assert!(
        done["stages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["status"] == "succeeded"),
        "{done}"
    );

    // A run that waits on a timer is answered waiting: there is nothing left to await.
    let sleeping = trigger(
        "await-2",
        json!({"zone": "ZEXAMPLE-COM", "stages": 1, "sleepSeconds": 600}),
    )
    .await;
    let (status, waiting) = get(&sleeping, "?wait=20").await;
    assert_eq!(status, StatusCode::OK, "{waiting}");
    assert_eq!(waiting["status"], "waiting", "{waiting}");

    for bad in [
        "?wait=soon",
        "?wait=26s",
        "?wait=-1",
        "?wait=1h",
        "?until=5",
    ] {
        let (status, body) = get(&id, bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(body["error"], "invalid_filter", "{bad}: {body}");
    }
}
