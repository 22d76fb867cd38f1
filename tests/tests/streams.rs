//! SSE streams through a real client: PyPI `httpx-sse` reads `GET /v1/streams/events` while
//! executions run, disconnects, resumes with a single-use stream token and `lastEventId`, and the
//! union of what it saw is every event, in order, with no gap and no duplicate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, cli, home, key_for, repo};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

async fn finish(c: &Client, base: &str, key: &str, id: &str) -> Vec<Value> {
    let e = capstan_e2e::until_status(c, base, key, id, &["succeeded", "failed", "paused"]).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    let events = capstan_e2e::get_json(c, &format!("{base}/v1/executions/{id}/events"), key).await;
    events["events"].as_array().unwrap().clone()
}

async fn trigger(c: &Client, base: &str, key: &str, n: u32) -> String {
    trigger_with(
        c,
        base,
        key,
        n,
        json!({"zone": "ZEXAMPLE-COM", "stages": 2}),
    )
    .await
}

async fn trigger_with(c: &Client, base: &str, key: &str, n: u32, input: Value) -> String {
    let r: Value = c
        .post(format!("{base}/v1/workflows/fixture-steps"))
        .bearer_auth(key)
        .header("Idempotency-Key", format!("sse-{n}"))
        .header("traceparent", TRACEPARENT)
        .json(&input)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    r["executionId"].as_str().unwrap().to_owned()
}

/// Execution `id`'s SSE feed, resumed after `last` when given.
async fn feed(c: &Client, base: &str, key: &str, id: &str, last: Option<i64>) -> reqwest::Response {
    let mut request = c
        .get(format!("{base}/v1/executions/{id}/events"))
        .bearer_auth(key)
        .header("Accept", "text/event-stream");
    if let Some(last) = last {
        request = request.header("Last-Event-ID", last.to_string());
    }
    request.send().await.unwrap()
}

/// The `id:` of each SSE message in `text`, in order.
fn ids(text: &str) -> Vec<i64> {
    text.lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(|id| id.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn httpx_sse_reads_resumes_with_a_token_and_misses_nothing() {
    let home = home(&["guest-fixtures/fixture-steps.wasm", "workflows/hello.wasm"]);
    let key = key_for(home.path(), "ops", &["workflows:fixture-steps"]);
    let hello_only = key_for(home.path(), "greeter", &["workflows:hello"]);
    let nobody = key_for(home.path(), "nobody", &[]);
    let server = Server::start(home.path());
    let base = server.base.clone();
    let c = Client::new();

    // Filters are validated; no workflow entitlement is a 403; a token works once, only here.
    let status = |r: reqwest::Response| r.status();
    let get = |url: String, k: String| c.get(url).bearer_auth(k).send();
    assert_eq!(
        status(
            get(format!("{base}/v1/streams/events?colour=blue"), key.clone())
                .await
                .unwrap()
        ),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        status(
            get(
                format!("{base}/v1/streams/events?event=NoSuchThing.v1"),
                key.clone()
            )
            .await
            .unwrap()
        ),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        status(
            get(format!("{base}/v1/streams/events"), nobody.clone())
                .await
                .unwrap()
        ),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        c.post(format!("{base}/v1/streams/token"))
            .bearer_auth(&nobody)
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    let minted: Value = c
        .post(format!("{base}/v1/streams/token"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(minted["expiresIn"], 300);
    let token = minted["token"].as_str().unwrap();
    assert_eq!(
        c.get(format!("{base}/v1/executions"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::UNAUTHORIZED,
        "a stream token authenticates nothing but the stream"
    );
    assert_eq!(
        c.get(format!("{base}/v1/streams/events?token=cst_forged"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::UNAUTHORIZED
    );

    // One execution done before the client connects, one while it reads.
    let a = trigger(&c, &base, &key, 1).await;
    let events_a = finish(&c, &base, &key, &a).await;
    let n = events_a.len();
    // hello events are never shown to a fixture-steps stream.
    let h: Value = c
        .post(format!("{base}/v1/workflows/hello"))
        .bearer_auth(&hello_only)
        .header("Idempotency-Key", "sse-hello")
        .json(&json!({"name": "x"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(h["executionId"].is_string());
    let client = std::process::Command::new("python3")
        .arg(repo().join("tests/clients/sse_resume.py"))
        .args([&base, &key, &(n + 3).to_string(), &(2 * n).to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with httpx-sse (just setup installs it)");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b = trigger(&c, &base, &key, 2).await;
    let events_b = finish(&c, &base, &key, &b).await;
    let out = tokio::task::spawn_blocking(move || client.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let seen = client_report(&out);
    assert_eq!(seen["reuseStatus"], 401, "a stream token is single use");
    let received: Vec<&Value> = seen["first"]
        .as_array()
        .unwrap()
        .iter()
        .chain(seen["second"].as_array().unwrap())
        .collect();
    let expected: Vec<&Value> = events_a.iter().chain(events_b.iter()).collect();
    assert_eq!(
        received
            .iter()
            .map(|e| e["eventId"].clone())
            .collect::<Vec<_>>(),
        expected
            .iter()
            .map(|e| e["eventId"].clone())
            .collect::<Vec<_>>(),
        "the union of both connections is every event, in order, once"
    );
    let ids: Vec<i64> = received
        .iter()
        .map(|e| e["id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "cursors increase: {ids:?}"
    );
    for (r, e) in received.iter().zip(&expected) {
        assert_eq!(
            r["event"],
            format!(
                "{}.v{}",
                e["eventType"].as_str().unwrap(),
                e["eventVersion"].as_str().unwrap()
            )
        );
    }
}

#[tokio::test]
async fn an_unknown_cursor_gets_a_resync_event_and_capacity_is_bounded() {
    let home = capstan_e2e::home_with(
        &["guest-fixtures/fixture-steps.wasm"],
        "stream_connections = 1\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[simulator]\ndns_propagation_ms = 0\n",
    );
    let key = key_for(home.path(), "ops", &["workflows:fixture-steps"]);
    let server = Server::start(home.path());
    let c = Client::new();
    let mut first = c
        .get(format!("{}/v1/streams/events", server.base))
        .bearer_auth(&key)
        .header("Last-Event-ID", "999999")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = first.chunk().await.unwrap().unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.contains("event: resync"), "{text}");
    assert!(text.contains("\"reason\":\"unknown_cursor\""), "{text}");
    assert!(text.contains("retry: 3000"), "{text}");
    let second = c
        .get(format!("{}/v1/streams/events", server.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    // A single-use token refused for capacity is not spent: it opens the stream later.
    let minted: Value = c
        .post(format!("{}/v1/streams/token", server.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = minted["token"].as_str().unwrap().to_owned();
    // A bare event type means every version of it.
    let with_token = format!(
        "{}/v1/streams/events?event=ExecutionSucceeded&token={token}",
        server.base
    );
    let refused = c.get(&with_token).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut third = c.get(&with_token).send().await.unwrap();
    assert_eq!(
        third.status(),
        StatusCode::OK,
        "a closed stream frees its slot, and the token was kept"
    );
    let base = server.base.clone();
    trigger(&c, &base, &key, 1).await;
    let mut text = String::new();
    while !text.contains("event: ExecutionSucceeded.v1") {
        let chunk = third.chunk().await.unwrap().unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        !text.contains("event: ExecutionStarted") && !text.contains("event: StageSucceeded"),
        "only the filtered type: {text}"
    );
}

#[tokio::test]
async fn an_execution_streams_its_events_from_the_first_when_asked_for_event_stream() {
    let home = home(&["guest-fixtures/fixture-steps.wasm"]);
    let key = key_for(home.path(), "ops", &["workflows:fixture-steps"]);
    let server = Server::start(home.path());
    let base = server.base.clone();
    let c = Client::new();
    let id = trigger(&c, &base, &key, 7).await;
    let events = finish(&c, &base, &key, &id).await;
    for e in &events {
        assert_eq!(
            e["traceparent"], TRACEPARENT,
            "every event carries the trigger's trace context"
        );
    }
    let mut r = feed(&c, &base, &key, &id, None).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    // The execution is at rest (succeeded): the feed sends every event, then ends.
    let text = ends_within(&mut r, Duration::from_secs(10)).await;
    assert_eq!(
        text.matches("\nevent: ").count() + usize::from(text.starts_with("event: ")),
        events.len(),
        "{text}"
    );
    for e in &events {
        assert!(text.contains(e["eventId"].as_str().unwrap()), "{text}");
    }
    assert_eq!(
        text.lines()
            .filter_map(|l| l.strip_prefix("event: "))
            .next_back(),
        Some("ExecutionSucceeded.v1"),
        "the terminal event is the last: {text}"
    );
    // Resuming after the third event gives the rest only.
    let mut r = feed(&c, &base, &key, &id, Some(ids(&text)[2])).await;
    assert_eq!(r.status(), StatusCode::OK);
    let rest = ends_within(&mut r, Duration::from_secs(10)).await;
    for e in &events[..3] {
        assert!(
            !rest.contains(e["eventId"].as_str().unwrap()),
            "no duplicate after resume"
        );
    }
    for e in &events[3..] {
        assert!(rest.contains(e["eventId"].as_str().unwrap()), "{rest}");
    }
    // Resumed at the terminal event, nothing is left: 204, which stops an `EventSource`.
    let r = feed(&c, &base, &key, &id, ids(&rest).last().copied()).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(r.text().await.unwrap(), "");

    // PyPI's httpx-sse: its loop over the feed finishes by itself, and the resume is the 204.
    let out = tokio::task::spawn_blocking({
        let (base, key, id) = (base.clone(), key.clone(), id.clone());
        move || {
            std::process::Command::new("python3")
                .arg(repo().join("tests/clients/sse_feed.py"))
                .args([&base, &key, &id])
                .output()
                .expect("python3 with httpx-sse (just setup installs it)")
        }
    })
    .await
    .unwrap();
    let seen = client_report(&out);
    let names: Vec<String> = events
        .iter()
        .map(|e| {
            format!(
                "{}.v{}",
                e["eventType"].as_str().unwrap(),
                e["eventVersion"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(seen["names"], json!(names), "{seen}");
    assert_eq!(seen["resumeStatus"], 204, "{seen}");
    assert_eq!(seen["resumedEvents"], 0, "{seen}");
}

/// A waiting execution is not at rest: its feed stays open through `ExecutionWaiting` and ends
/// after the cancel's `ExecutionCanceled`.
#[tokio::test]
async fn an_execution_feed_stays_open_while_it_waits_and_ends_when_it_is_canceled() {
    let home = home(&["guest-fixtures/fixture-steps.wasm"]);
    let key = key_for(home.path(), "ops", &["workflows:fixture-steps"]);
    let server = Server::start(home.path());
    let base = server.base.clone();
    let c = Client::new();
    let input = json!({"zone": "ZEXAMPLE-COM", "stages": 1, "sleepSeconds": 600});
    let id = trigger_with(&c, &base, &key, 1, input).await;
    let mut stream = feed(&c, &base, &key, &id, None).await;
    assert_eq!(stream.status(), StatusCode::OK);
    receives(&mut stream, "event: ExecutionWaiting.v1").await;
    // Nothing more comes while it waits, and the feed is not ended either.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), stream.chunk())
            .await
            .is_err(),
        "the feed of a waiting execution neither ends nor sends"
    );
    let r = c
        .post(format!("{base}/v1/executions/{id}/cancel"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let rest = ends_within(&mut stream, Duration::from_secs(10)).await;
    assert!(rest.contains("event: ExecutionCanceled.v1"), "{rest}");
}

/// A rollback whose compensation is refused for good ends in `RollbackFailed`: the execution
/// keeps its terminal status, so a feed that followed the rollback ends with that event, and a
/// resume at it is 204.
#[tokio::test]
async fn a_feed_that_follows_a_failed_rollback_ends_at_rollback_failed() {
    let home = home(&["guest-fixtures/fixture-steps.wasm"]);
    let key = key_for(home.path(), "ops", &["workflows:fixture-steps"]);
    let server = Server::start(home.path());
    let c = Client::new();
    let id = trigger(&c, &server.base, &key, 1).await;
    finish(&c, &server.base, &key, &id).await;
    let mut r = feed(&c, &server.base, &key, &id, None).await;
    let before = ends_within(&mut r, Duration::from_secs(10)).await;
    let succeeded = *ids(&before).last().unwrap();
    server.terminate();

    // The same database, now with every DNS change refused: the compensations fail.
    let config = home.path().join("capstan.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(
        "[[simulator.faults]]\nop = \"dns.change-records\"\nerror = \"permanent\"\ncode = \"refused\"\n",
    );
    std::fs::write(&config, text).unwrap();
    let server = Server::start(home.path());
    let base = server.base.clone();
    let r = c
        .post(format!("{base}/v1/executions/{id}/rollback"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let command: Value = r.json().await.unwrap();
    let command_id = command["command"]["commandId"].as_str().unwrap().to_owned();

    let mut r = feed(&c, &base, &key, &id, Some(succeeded)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let rollback = ends_within(&mut r, Duration::from_secs(10)).await;
    let names: Vec<&str> = rollback
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        names,
        [
            "CommandQueued.v1",
            "RollbackStarted.v1",
            "StageStarted.v1",
            "StageFailed.v1",
            "RollbackFailed.v1"
        ],
        "{rollback}"
    );
    let last = rollback
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .next_back()
        .unwrap();
    let payload: Value = serde_json::from_str(last).unwrap();
    let payload = &payload["payloadJson"];
    assert_eq!(payload["status"], "succeeded", "{payload}");
    assert_eq!(payload["commandId"], command_id.as_str(), "{payload}");
    assert!(
        payload["stage"].as_str().unwrap().starts_with("rollback:"),
        "{payload}"
    );
    assert_eq!(payload["error"]["error"], "refused", "{payload}");
    assert_eq!(payload["error"]["kind"], "permanent", "{payload}");

    // Nothing follows it: a resume there is 204; the execution kept its status, its failed
    // compensation stage says why.
    let r = feed(&c, &base, &key, &id, ids(&rollback).last().copied()).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let execution = capstan_e2e::get_json(&c, &format!("{base}/v1/executions/{id}"), &key).await;
    assert_eq!(execution["status"], "succeeded", "{execution:#}");
    let stage = execution["stages"].as_array().unwrap().last().unwrap();
    assert_eq!(stage["stageName"], payload["stage"], "{execution:#}");
    assert_eq!(stage["status"], "failed", "{execution:#}");
}

/// Reads `r` until the server ends it; panics when it is still open after `within`.
async fn ends_within(r: &mut reqwest::Response, within: Duration) -> String {
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, r.chunk()).await {
            Ok(Ok(Some(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(Ok(None) | Err(_)) => return text,
            Err(_) => panic!("the stream was still open after {within:?}: {text}"),
        }
    }
}

/// Reads `r` until `needle` arrives; panics when the stream ends or goes quiet first.
async fn receives(r: &mut reqwest::Response, needle: &str) {
    let mut text = String::new();
    while !text.contains(needle) {
        let chunk = tokio::time::timeout(Duration::from_secs(15), r.chunk())
            .await
            .expect("the stream went quiet")
            .unwrap()
            .unwrap_or_else(|| panic!("the stream ended before {needle}: {text}"));
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
}

#[tokio::test]
async fn revoking_a_grant_or_a_key_ends_its_streams_and_voids_its_stream_tokens() {
    let home = capstan_e2e::home_with(
        &["guest-fixtures/fixture-steps.wasm", "workflows/hello.wasm"],
        "stream_connections_per_principal = 2\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n",
    );
    let key = key_for(
        home.path(),
        "ops",
        &["workflows:fixture-steps", "workflows:hello"],
    );
    let other = key_for(home.path(), "other", &["workflows:hello"]);
    let server = Server::start(home.path());
    let base = server.base.clone();
    let c = Client::new();
    let open = |k: &str, query: &str| {
        c.get(format!("{base}/v1/streams/events{query}"))
            .bearer_auth(k)
            .send()
    };
    let mut steps_only = open(&key, "?workflow=fixture-steps").await.unwrap();
    let mut everything = open(&key, "").await.unwrap();
    assert_eq!(steps_only.status(), StatusCode::OK);
    assert_eq!(everything.status(), StatusCode::OK);

    // One principal holds at most its share; another principal still gets a stream.
    let third = open(&key, "").await.unwrap();
    assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = third.json().await.unwrap();
    assert_eq!(body["error"], "stream_capacity_exhausted");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("stream_connections_per_principal"),
        "{body}"
    );
    let mut others = open(&other, "").await.unwrap();
    assert_eq!(others.status(), StatusCode::OK);

    let token: Value = c
        .post(format!("{base}/v1/streams/token"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = token["token"].as_str().unwrap().to_owned();

    // A revoked grant ends the stream that asked for that workflow only; the other narrows.
    cli(
        home.path(),
        &["principals", "revoke", "ops", "workflows:fixture-steps"],
    );
    ends_within(&mut steps_only, Duration::from_secs(10)).await;
    let hello: Value = c
        .post(format!("{base}/v1/workflows/hello"))
        .bearer_auth(&key)
        .header("Idempotency-Key", "still-here")
        .json(&json!({"name": "still-here"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    receives(
        &mut everything,
        hello["executionId"]
            .as_str()
            .unwrap_or_else(|| panic!("{hello}")),
    )
    .await;

    // A revoked key ends every stream it opened and voids the stream tokens it minted.
    let db = capstan_e2e::database(home.path()).await;
    let (key_id,): (String,) = sqlx::query_as("SELECT id FROM api_keys WHERE principal_id = 'ops'")
        .fetch_one(&db)
        .await
        .unwrap();
    cli(home.path(), &["api-keys", "revoke", &key_id]);
    ends_within(&mut everything, Duration::from_secs(10)).await;
    let with_token = c
        .get(format!("{base}/v1/streams/events?token={token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(with_token.status(), StatusCode::UNAUTHORIZED);

    // Another principal's stream flows on.
    let hello: Value = c
        .post(format!("{base}/v1/workflows/hello"))
        .bearer_auth(&other)
        .header("Idempotency-Key", "other")
        .json(&json!({"name": "other"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    receives(&mut others, hello["executionId"].as_str().unwrap()).await;
}

/// What a Python SSE client printed: one JSON object on stdout, once it exited successfully.
fn client_report(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "sse client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the client prints one JSON object")
}
