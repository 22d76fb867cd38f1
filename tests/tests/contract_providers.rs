//! The maps adapter (Google Cloud API Keys API) and the ticketing adapter (Jira Cloud) against
//! the contract servers of `capstan_e2e::contract`, written from the public API references
//! because neither service has an emulator. Every call goes over HTTP to the server; what the
//! server holds is read from the server, never through the adapter.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_core::Capability;
use capstan_e2e::adapter;
use capstan_e2e::contract::{GoogleApiKeys, Jira};
use serde_json::{Value, json};
use std::path::Path;

const PROJECT: &str = "capstan-test";

fn apikeys_settings(google: &GoogleApiKeys, dir: &Path, extra: Value) -> Value {
    let key = dir.join("service-account.json");
    std::fs::write(&key, google.service_account_json()).unwrap();
    with(
        json!({
            "kind": "apikeys", "project": PROJECT, "endpoint_url": google.endpoint(),
            "service_account_key_file": key,
        }),
        extra,
    )
}

/// `settings` with the keys of `extra` set.
fn with(mut settings: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        settings[k] = v.clone();
    }
    settings
}

#[tokio::test]
async fn the_apikeys_adapter_changes_browser_keys_once_per_token() {
    let google = GoogleApiKeys::start(PROJECT);
    google.set_page_size(1);
    google.add_key("web", "Web", &["*.a.example/*"]);
    google.add_key("mobile-web", "Mobile web", &[]);
    google.add_server_key("backend", "Backend");
    let dir = tempfile::tempdir().unwrap();
    let maps = adapter(
        Capability::Maps,
        apikeys_settings(&google, dir.path(), json!({"referrer_capacity": 2})),
        dir.path(),
    )
    .await;
    maps.reachable().await.expect("the API answers");

    // The browser keys, over every page; the server key is not one of them.
    let keys = maps.call("maps.list-keys", &json!({}), "").await.unwrap();
    assert_eq!(
        keys,
        json!([
            {"id": "web", "display_name": "Web", "referrers": ["*.a.example/*"], "capacity": 2},
            {"id": "mobile-web", "display_name": "Mobile web", "referrers": [], "capacity": 2},
        ])
    );

    // A change waits for its operation; a repeat under its token sends nothing more.
    google.set_polls_until_done(2);
    let add = json!({"key_id": "web", "referrer": "*.b.example/*"});
    let added = maps.call("maps.add-referrer", &add, "t1").await.unwrap();
    assert_eq!(added["changed"], true);
    assert_eq!(
        added["key"]["referrers"],
        json!(["*.a.example/*", "*.b.example/*"])
    );
    assert_eq!(google.referrers("web"), ["*.a.example/*", "*.b.example/*"]);
    let patches = google.patches();
    assert_eq!(patches.len(), 1);
    assert_eq!(
        patches[0]["precondition"], true,
        "every change carries the etag read: {:#}",
        patches[0]
    );
    assert_eq!(
        maps.call("maps.add-referrer", &add, "t1").await.unwrap(),
        added
    );
    assert_eq!(google.patches().len(), 1);
    let reused = maps
        .call(
            "maps.add-referrer",
            &json!({"key_id": "web", "referrer": "*.other.example/*"}),
            "t1",
        )
        .await
        .unwrap_err();
    assert_eq!(reused.code, "idempotency-token-reused");

    // Present already: nothing changes, and a rollback would remove nothing.
    let again = maps.call("maps.add-referrer", &add, "t2").await.unwrap();
    assert_eq!(again["changed"], false);
    assert_eq!(google.patches().len(), 1);

    // A full key is refused before anything is sent.
    let full = maps
        .call(
            "maps.add-referrer",
            &json!({"key_id": "web", "referrer": "*.c.example/*"}),
            "t3",
        )
        .await
        .unwrap_err();
    assert_eq!(
        (full.code.as_str(), full.is_transient()),
        ("capacity-exhausted", false)
    );
    assert_eq!(google.patches().len(), 1);

    // Removing gives the key back as it was.
    let removed = maps.call("maps.remove-referrer", &add, "t4").await.unwrap();
    assert_eq!(removed["changed"], true);
    assert_eq!(google.referrers("web"), ["*.a.example/*"]);

    // A key without website restrictions is never given a first referrer.
    let server_key = maps
        .call(
            "maps.add-referrer",
            &json!({"key_id": "backend", "referrer": "*.a.example/*"}),
            "t5",
        )
        .await
        .unwrap_err();
    assert_eq!(server_key.code, "not-a-browser-key");
    let missing = maps
        .call(
            "maps.add-referrer",
            &json!({"key_id": "nope", "referrer": "*.a.example/*"}),
            "t6",
        )
        .await
        .unwrap_err();
    assert_eq!(
        (missing.code.as_str(), missing.is_transient()),
        ("not-found", false)
    );
    let path = maps
        .call(
            "maps.add-referrer",
            &json!({"key_id": "../../other", "referrer": "*.a.example/*"}),
            "t7",
        )
        .await
        .unwrap_err();
    assert_eq!(path.code, "invalid-request");

    // Rate limits and outages are transient; the wait Google asks for travels with the error.
    google.fail_next(1, 429, Some(3));
    let limited = maps
        .call("maps.list-keys", &json!({}), "")
        .await
        .unwrap_err();
    assert_eq!(
        (
            limited.code.as_str(),
            limited.is_transient(),
            limited.retry_after_ms
        ),
        ("rate-limited", true, Some(3_000))
    );
    google.fail_next(1, 503, None);
    let down = maps
        .call("maps.list-keys", &json!({}), "")
        .await
        .unwrap_err();
    assert_eq!(
        (down.code.as_str(), down.is_transient()),
        ("unavailable", true)
    );
    // One access token served every call.
    assert_eq!(google.tokens_issued(), 1);
}

/// A change whose operation outlasts the call: the transient `operation-pending`, then the
/// repeat under the same token polls that operation instead of patching again.
#[tokio::test]
async fn an_apikeys_change_still_running_is_finished_by_its_repeat_not_sent_twice() {
    let google = GoogleApiKeys::start(PROJECT);
    google.add_key("web", "Web", &[]);
    let dir = tempfile::tempdir().unwrap();
    let maps = adapter(
        Capability::Maps,
        apikeys_settings(&google, dir.path(), json!({"operation_timeout_ms": 300})),
        dir.path(),
    )
    .await;
    google.set_polls_until_done(1000);
    let add = json!({"key_id": "web", "referrer": "*.slow.example/*"});
    let pending = maps
        .call("maps.add-referrer", &add, "t1")
        .await
        .unwrap_err();
    assert_eq!(
        (pending.code.as_str(), pending.is_transient()),
        ("operation-pending", true)
    );
    assert!(google.referrers("web").is_empty(), "not visible until done");
    google.set_polls_until_done(1);
    let done = maps.call("maps.add-referrer", &add, "t1").await.unwrap();
    assert_eq!(
        done["changed"], true,
        "the first attempt's change is this call's"
    );
    assert_eq!(google.referrers("web"), ["*.slow.example/*"]);
    assert_eq!(google.patches().len(), 1);
}

/// Another writer changes the key between the adapter's read and its PATCH: Google refuses the
/// stale etag, the adapter says so as a transient error, and the retry keeps the other
/// writer's referrer beside its own.
#[tokio::test]
async fn a_key_changed_meanwhile_is_read_again_and_nothing_is_overwritten() {
    let google = GoogleApiKeys::start(PROJECT);
    google.add_key("web", "Web", &["*.a.example/*"]);
    let dir = tempfile::tempdir().unwrap();
    let maps = adapter(
        Capability::Maps,
        apikeys_settings(&google, dir.path(), json!({})),
        dir.path(),
    )
    .await;
    google.change_before_next_patch("web", &["*.a.example/*", "*.someone-else.example/*"]);
    let add = json!({"key_id": "web", "referrer": "*.mine.example/*"});
    let stale = maps
        .call("maps.add-referrer", &add, "t1")
        .await
        .unwrap_err();
    assert_eq!(
        (stale.code.as_str(), stale.is_transient()),
        ("precondition-failed", true)
    );
    let added = maps.call("maps.add-referrer", &add, "t1").await.unwrap();
    assert_eq!(added["changed"], true);
    assert_eq!(
        google.referrers("web"),
        [
            "*.a.example/*",
            "*.someone-else.example/*",
            "*.mine.example/*"
        ]
    );
}

/// A change left running (its caller gave up, as a killed node does) and another execution's
/// change of the same key: the pending change lands first, so the second one's etag is stale and
/// it reads again; the first one's repeat then finds its referrer. Neither replaces the other.
#[tokio::test]
async fn a_change_left_running_lands_before_a_later_one_and_neither_is_lost() {
    let google = GoogleApiKeys::start(PROJECT);
    google.add_key("web", "Web", &[]);
    let dir = tempfile::tempdir().unwrap();
    let maps = adapter(
        Capability::Maps,
        apikeys_settings(&google, dir.path(), json!({"operation_timeout_ms": 300})),
        dir.path(),
    )
    .await;
    google.set_polls_until_done(1000);
    let first = json!({"key_id": "web", "referrer": "*.first.example/*"});
    let pending = maps
        .call("maps.add-referrer", &first, "t1")
        .await
        .unwrap_err();
    assert_eq!(pending.code, "operation-pending");
    google.set_polls_until_done(1);
    let second = json!({"key_id": "web", "referrer": "*.second.example/*"});
    let stale = maps
        .call("maps.add-referrer", &second, "t2")
        .await
        .unwrap_err();
    assert_eq!(
        (stale.code.as_str(), stale.is_transient()),
        ("precondition-failed", true),
        "the key changed under the second change's etag"
    );
    assert_eq!(google.referrers("web"), ["*.first.example/*"]);
    let added = maps.call("maps.add-referrer", &second, "t2").await.unwrap();
    assert_eq!(added["changed"], true);
    let repeated = maps.call("maps.add-referrer", &first, "t1").await.unwrap();
    assert_eq!(repeated["changed"], true, "the first attempt's change");
    assert_eq!(
        google.referrers("web"),
        ["*.first.example/*", "*.second.example/*"]
    );
    assert_eq!(google.patches().len(), 3, "{:#?}", google.patches());
}

#[tokio::test]
async fn a_bad_service_account_key_stops_the_adapter_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key.json");
    std::fs::write(&key, "{\"type\": \"authorized_user\"}").unwrap();
    let settings: capstan_adapters::ProviderSettings = serde_json::from_value(json!({
        "kind": "apikeys", "project": PROJECT, "service_account_key_file": key,
    }))
    .unwrap();
    let store = capstan_store::Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
        .await
        .unwrap();
    let node = capstan_adapters::Node {
        store,
        clock: std::sync::Arc::new(capstan_core::SystemClock),
        keyring: capstan_core::secrets::Keyring::development(),
    };
    let refused = |capability| {
        let (settings, node) = (&settings, &node);
        async move {
            match capstan_adapters::build(capability, settings, node).await {
                Ok(_) => panic!("{capability:?} started on a bad key"),
                Err(e) => e,
            }
        }
    };
    let e = refused(Capability::Maps).await;
    assert_eq!(e.key, "service_account_key", "{e}");
    let e = refused(Capability::Dns).await;
    assert_eq!(e.key, "kind", "{e}");
}

fn jira_settings(jira: &Jira, dir: &Path, token: &str, extra: Value) -> Value {
    let file = dir.join(format!("jira-token-{token}"));
    std::fs::write(&file, format!("{token}\n")).unwrap();
    with(
        json!({
            "kind": "jira", "base_url": jira.base_url(), "email": "ops@example.com",
            "api_token_file": file,
        }),
        extra,
    )
}

#[tokio::test]
async fn the_jira_adapter_comments_and_transitions_once_per_token() {
    let jira = Jira::start("ops@example.com", "s3cret");
    jira.set_comment_page(2);
    jira.add_issue("OPS-1", "Onboard a.example", "To Do");
    let dir = tempfile::tempdir().unwrap();
    let tickets = adapter(
        Capability::Ticketing,
        jira_settings(&jira, dir.path(), "s3cret", json!({})),
        dir.path(),
    )
    .await;
    tickets.reachable().await.expect("Jira answers");

    let get = json!({"id": "OPS-1"});
    assert_eq!(
        tickets
            .call("ticketing.get-ticket", &get, "")
            .await
            .unwrap(),
        json!({"id": "OPS-1", "title": "Onboard a.example", "status": "to-do", "comments": []})
    );
    assert_eq!(
        tickets
            .call("ticketing.get-ticket", &json!({"id": "NOPE-1"}), "")
            .await
            .unwrap(),
        Value::Null
    );

    // A comment is posted once per token, in ADF, carrying its token.
    let comment = json!({"id": "OPS-1", "body": "Onboarding of a.example: done.\n- nothing left"});
    let posted = tickets
        .call("ticketing.add-comment", &comment, "c1")
        .await
        .unwrap();
    assert_eq!(posted["ticket_id"], "OPS-1");
    assert_eq!(
        tickets
            .call("ticketing.add-comment", &comment, "c1")
            .await
            .unwrap(),
        posted
    );
    let comments = jira.comments("OPS-1");
    assert_eq!(comments.len(), 1);
    assert_eq!(comments[0]["id"], posted["comment_id"]);
    assert_eq!(comments[0]["body"]["type"], "doc");
    assert_eq!(
        comments[0]["properties"],
        json!([{"key": "capstan", "value": {"token": "c1"}}])
    );

    // A post that failed is tried again under its token: the repeat first looks for it.
    jira.fail_next(1, 503, None);
    let second = json!({"id": "OPS-1", "body": "second"});
    let e = tickets
        .call("ticketing.add-comment", &second, "c2")
        .await
        .unwrap_err();
    assert!(e.is_transient(), "{e}");
    tickets
        .call("ticketing.add-comment", &second, "c2")
        .await
        .unwrap();
    assert!(
        jira.requests()
            .iter()
            .any(|r| r.contains("/comment") && r.contains("expand=properties")),
        "{:#?}",
        jira.requests()
    );
    tickets
        .call(
            "ticketing.add-comment",
            &json!({"id": "OPS-1", "body": "third"}),
            "c3",
        )
        .await
        .unwrap();
    // Comments come back in order over every page, as text.
    let ticket = tickets
        .call("ticketing.get-ticket", &get, "")
        .await
        .unwrap();
    assert_eq!(
        ticket["comments"],
        json!([
            "Onboarding of a.example: done.\n- nothing left",
            "second",
            "third"
        ])
    );

    // A transition through the issue's workflow, once per token, its receipt in our words.
    let wait = json!({"id": "OPS-1", "status": "pending-assistance"});
    let moved = tickets
        .call("ticketing.transition-ticket", &wait, "x1")
        .await
        .unwrap();
    assert_eq!(
        moved,
        json!({"ticket_id": "OPS-1", "from": "to-do", "to": "pending-assistance"})
    );
    assert_eq!(jira.status("OPS-1"), "Pending Assistance");
    assert_eq!(
        tickets
            .call("ticketing.transition-ticket", &wait, "x1")
            .await
            .unwrap(),
        moved
    );
    let transitions = |jira: &Jira| {
        jira.requests()
            .iter()
            .filter(|r| r.starts_with("POST") && r.contains("/transitions"))
            .count()
    };
    assert_eq!(transitions(&jira), 1);
    // A status the workflow cannot reach from here is refused, naming where it can go.
    let closed = tickets
        .call(
            "ticketing.transition-ticket",
            &json!({"id": "OPS-1", "status": "closed"}),
            "x2",
        )
        .await
        .unwrap_err();
    assert_eq!(
        (closed.code.as_str(), closed.is_transient()),
        ("invalid-transition", false)
    );
    assert!(closed.message.contains("resolved"), "{}", closed.message);
    assert_eq!(jira.status("OPS-1"), "Pending Assistance");

    // Rate limits carry Jira's wait; a 404 while commenting is `not-found`.
    jira.fail_next(1, 429, Some(2));
    let limited = tickets
        .call("ticketing.get-ticket", &get, "")
        .await
        .unwrap_err();
    assert_eq!(
        (
            limited.code.as_str(),
            limited.is_transient(),
            limited.retry_after_ms
        ),
        ("rate-limited", true, Some(2_000))
    );
    let gone = tickets
        .call(
            "ticketing.add-comment",
            &json!({"id": "NOPE-1", "body": "hello"}),
            "c4",
        )
        .await
        .unwrap_err();
    assert_eq!(
        (gone.code.as_str(), gone.is_transient()),
        ("not-found", false)
    );
}

#[tokio::test]
async fn jira_statuses_map_to_the_workflows_words_and_refusals_are_permanent() {
    let jira = Jira::start("ops@example.com", "s3cret");
    jira.add_issue("OPS-2", "Onboard b.example", "In Progress");
    jira.add_issue("SEC-1", "Restricted", "To Do");
    jira.forbid("SEC-1");
    let dir = tempfile::tempdir().unwrap();
    let tickets = adapter(
        Capability::Ticketing,
        jira_settings(
            &jira,
            dir.path(),
            "s3cret",
            json!({"statuses": {"done": "Resolved"}}),
        ),
        dir.path(),
    )
    .await;
    let moved = tickets
        .call(
            "ticketing.transition-ticket",
            &json!({"id": "OPS-2", "status": "done"}),
            "x1",
        )
        .await
        .unwrap();
    assert_eq!(moved["from"], "in-progress");
    assert_eq!(jira.status("OPS-2"), "Resolved");
    let ticket = tickets
        .call("ticketing.get-ticket", &json!({"id": "OPS-2"}), "")
        .await
        .unwrap();
    assert_eq!(ticket["status"], "done");

    let forbidden = tickets
        .call("ticketing.get-ticket", &json!({"id": "SEC-1"}), "")
        .await
        .unwrap_err();
    assert_eq!(
        (forbidden.code.as_str(), forbidden.is_transient()),
        ("forbidden", false)
    );

    // A wrong API token: refused, permanently, without the token in the message.
    let wrong = adapter(
        Capability::Ticketing,
        jira_settings(&jira, dir.path(), "not-the-token", json!({})),
        &dir.path().join("wrong"),
    )
    .await;
    let e = wrong
        .call("ticketing.get-ticket", &json!({"id": "OPS-2"}), "")
        .await
        .unwrap_err();
    assert_eq!((e.code.as_str(), e.is_transient()), ("unauthorized", false));
    assert!(!e.message.contains("not-the-token"), "{}", e.message);
    assert!(wrong.reachable().await.is_err());
}
