//! `GET /metrics`, the audit log's group commit and `lastUsedAt` kept to the minute, against a
//! real `capstan serve` and its database (SQLite, or PostgreSQL in the second pass).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, database, get_json, home, key_for, until_status};
use serde_json::Value;

async fn write_transactions(client: &reqwest::Client, base: &str) -> u64 {
    let r = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200, "no key needed");
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4"),
        "Prometheus text format"
    );
    let text = r.text().await.unwrap();
    assert!(text.contains("# TYPE capstan_store_write_transactions_total counter"));
    text.lines()
        .find_map(|l| l.strip_prefix("capstan_store_write_transactions_total "))
        .unwrap()
        .parse()
        .unwrap()
}

/// Triggers `hello` and waits until it succeeded; its id.
async fn hello_done(client: &reqwest::Client, base: &str, key: &str) -> String {
    let r: Value = client
        .post(format!("{base}/v1/workflows/hello"))
        .bearer_auth(key)
        .header("Idempotency-Key", "hello-once")
        .json(&serde_json::json!({"name": "metrics"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = r["executionId"]
        .as_str()
        .unwrap_or_else(|| panic!("trigger answered {r}"))
        .to_owned();
    until_status(client, base, key, &id, &["succeeded"]).await;
    id
}

#[tokio::test]
async fn metrics_count_the_write_transactions_of_an_execution() {
    let home = home(&["workflows/hello.wasm"]);
    let key = key_for(home.path(), "ops", &["workflows:hello"]);
    let server = Server::start(home.path());
    let client = reqwest::Client::new();
    let before = write_transactions(&client, &server.base).await;
    hello_done(&client, &server.base, &key).await;
    let after = write_transactions(&client, &server.base).await;
    // At least the trigger's commit (with its idempotency key; a free worker slot starts the
    // run, whose final batch, on SQLite, rides the same commit when it comes within 2 ms, and
    // commits next otherwise). Audit records share those commits or, for the polls (reads), are
    // written behind their answers several to a commit, so how many more there are depends on
    // timing.
    assert!(after > before, "{before} → {after}");
}

#[tokio::test]
async fn concurrent_reads_are_each_audited_once_and_last_use_is_kept_to_the_minute() {
    let home = home(&["workflows/hello.wasm"]);
    let key = key_for(home.path(), "ops", &["workflows:hello"]);
    let auditor = key_for(home.path(), "auditor", &["audit:read"]);
    let server = Server::start(home.path());
    let client = reqwest::Client::new();
    let id = hello_done(&client, &server.base, &key).await;

    let db = database(home.path()).await;
    // Through the audit query, as an operator reads the log.
    let log = format!(
        "{}/v1/audit-logs?principalId=ops&result=allowed&limit=100",
        server.base
    );
    let audited = async |id: &str| {
        get_json(&client, &log, &auditor).await["auditLogs"]
            .as_array()
            .expect("an audit page")
            .iter()
            .filter(|r| r["executionId"] == id)
            .count()
    };
    let last_used = || {
        let db = db.clone();
        async move {
            let (at,): (Option<i64>,) =
                sqlx::query_as("SELECT last_used_ms FROM api_keys WHERE principal_id = 'ops'")
                    .fetch_one(&db)
                    .await
                    .unwrap();
            at
        }
    };
    let first_use = last_used().await.expect("lastUsedAt written on first use");

    // 40 reads at once: their records are written behind the answers, a few milliseconds' worth
    // per commit, and the audit log's next reader (the query waits for what was queued before
    // it) finds all 40 as soon as the last answers.
    let before = audited(&id).await;
    let mut reads = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let (client, url, key) = (
            client.clone(),
            format!("{}/v1/executions/{id}", server.base),
            key.clone(),
        );
        reads.spawn(async move { client.get(url).bearer_auth(key).send().await.unwrap() });
    }
    while let Some(r) = reads.join_next().await {
        assert_eq!(r.unwrap().status(), 200);
    }
    assert_eq!(audited(&id).await - before, 40);

    // Used again within the minute: not rewritten.
    assert_eq!(last_used().await, Some(first_use));
}

#[tokio::test]
async fn failures_nobody_vouches_for_are_audited_bounded_and_gathered_per_source() {
    let home = capstan_e2e::home_with(
        &["workflows/hello.wasm"],
        "[rate_limit]\nrequests_per_second = 0.01\nburst = 2\n",
    );
    let key = key_for(home.path(), "ops", &["workflows:hello"]);
    let auditor = key_for(home.path(), "auditor", &["audit:read"]);
    let server = Server::start(home.path());
    let client = reqwest::Client::new();
    let long_agent = "a".repeat(5_000);
    for n in 0..30 {
        let r = client
            .get(format!("{}/v1/executions?attempt={n}", server.base))
            .bearer_auth(format!("cap_live_{}", "x".repeat(40)))
            .header("User-Agent", &long_agent)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
    }
    // The rate limit: the burst, then 429 with Retry-After, audited as the key's principal.
    let mut limited = 0;
    for _ in 0..6 {
        let r = client
            .get(format!("{}/v1/executions", server.base))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        if r.status() == 429 {
            assert!(r.headers().contains_key("retry-after"));
            limited += 1;
        }
    }
    assert!(limited >= 3, "{limited} refused");

    let db = database(home.path()).await;
    let until_written = async |action: &str| {
        for _ in 0..100 {
            let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
                "SELECT principal_id, resource, user_agent FROM audit_logs WHERE action = $1",
            )
            .bind(action.to_owned())
            .fetch_all(&db)
            .await
            .unwrap();
            if !rows.is_empty() {
                return rows;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("no `{action}` record");
    };
    let failed = until_written("authenticate").await;
    assert_eq!(
        failed.len(),
        1,
        "thirty failures from one source are one record (the rest are counted): {failed:?}"
    );
    let agent = failed[0].2.as_deref().unwrap();
    assert!(agent.chars().count() <= 257, "stored fields are bounded");
    assert_eq!(failed[0].0, "anonymous");
    let refused = until_written("rate-limit").await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, "ops");
    // An auditor reads them through the API like any record.
    let page = get_json(
        &client,
        &format!(
            "{}/v1/audit-logs?result=denied&principalId=anonymous",
            server.base
        ),
        &auditor,
    )
    .await;
    assert_eq!(page["auditLogs"].as_array().unwrap().len(), 1, "{page}");
}

#[tokio::test]
async fn a_denial_that_cannot_be_audited_is_refused_with_503_and_changes_nothing() {
    let home = home(&["workflows/hello.wasm"]);
    let viewer = key_for(home.path(), "viewer", &["audit:read"]);
    let server = Server::start(home.path());
    let client = reqwest::Client::new();
    let trigger = async || {
        client
            .post(format!("{}/v1/workflows/hello", server.base))
            .bearer_auth(&viewer)
            .json(&serde_json::json!({"name": "x"}))
            .send()
            .await
            .unwrap()
    };
    assert_eq!(trigger().await.status(), 403);

    let db = database(home.path()).await;
    sqlx::query("ALTER TABLE audit_logs RENAME TO audit_logs_away")
        .execute(&db)
        .await
        .unwrap();
    let refused = trigger().await;
    assert_eq!(
        refused.status(),
        503,
        "refused rather than denied unaudited"
    );
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "unavailable");
    sqlx::query("ALTER TABLE audit_logs_away RENAME TO audit_logs")
        .execute(&db)
        .await
        .unwrap();
    assert_eq!(trigger().await.status(), 403);
    let (executions,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM executions")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(executions, 0);
}

/// After a workload, `/metrics` passes Prometheus's own linter (`promtool check metrics`, Debian's
/// `prometheus` package) and holds the HTTP and provider-call series with their labels.
#[tokio::test]
async fn metrics_pass_promtool_after_a_workload() {
    let home = home(&["guest-fixtures/fixture-steps.wasm"]);
    let key = key_for(home.path(), "ops", &["workflows:fixture-steps"]);
    let server = Server::start(home.path());
    let client = reqwest::Client::new();
    let r: Value = client
        .post(format!("{}/v1/workflows/fixture-steps", server.base))
        .bearer_auth(&key)
        .header("Idempotency-Key", "metrics-1")
        .json(&serde_json::json!({"zone": "ZEXAMPLE-COM", "stages": 2}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = r["executionId"].as_str().unwrap();
    until_status(&client, &server.base, &key, id, &["succeeded"]).await;
    let text = client
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();

    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (just setup installs Debian's prometheus)");
    {
        use std::io::Write;
        promtool
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let series = |name: &str, labels: &[&str]| {
        text.lines().any(|l| {
            l.starts_with(&format!("{name}{{")) && labels.iter().all(|label| l.contains(label))
        })
    };
    assert!(
        series(
            "capstan_http_requests_total",
            &[
                r#"route="/v1/workflows/{name}""#,
                r#"status="202""#,
                r#"method="POST""#
            ]
        ),
        "{text}"
    );
    assert!(
        series(
            "capstan_http_request_duration_seconds_bucket",
            &[r#"route="/v1/executions/{id}""#]
        ),
        "{text}"
    );
    assert!(
        series(
            "capstan_provider_call_duration_seconds_bucket",
            &[
                r#"capability="dns""#,
                r#"operation="change-records""#,
                r#"outcome="ok""#
            ]
        ),
        "{text}"
    );
    assert!(text.contains("\ncapstan_store_write_transactions_total "));
    // The engine's own series after one execution of two stages.
    let count = |line_start: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {line_start}: {text}"))
    };
    assert_eq!(
        count(r#"capstan_executions_started_total{workflow="fixture-steps"}"#),
        1.0
    );
    assert_eq!(
        count(r#"capstan_executions_finished_total{workflow="fixture-steps",status="succeeded"}"#),
        1.0
    );
    assert!(series(
        "capstan_stage_duration_seconds_bucket",
        &[r#"workflow="fixture-steps""#, r#"outcome="succeeded""#]
    ));
    for state in ["queued", "leased", "scheduled", "waiting"] {
        assert_eq!(
            count(&format!("capstan_runs{{state=\"{state}\"}}")),
            0.0,
            "{state}"
        );
    }
    // At least one group commit carried the workload's durable points; how many depends on how
    // the group writer batched them (it may carry the trigger and both stages in one), so the
    // count is not pinned.
    let commits = count("capstan_store_commit_batch_size_count");
    assert!(commits >= 1.0, "{text}");
    assert!(series(
        "capstan_store_commit_duration_seconds_bucket",
        &[r#"le="0.001""#]
    ));
    assert_eq!(count("capstan_sse_connections "), 0.0);
    // The process's own, under their standard names.
    assert!(count("process_resident_memory_bytes ") > 1e6);
    assert!(count("process_open_fds ") > 0.0);
}
