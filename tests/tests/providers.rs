//! Real providers against real servers the tests start themselves on 127.0.0.1: Knot DNS as the
//! authoritative primary of `capstan.test` (RFC 2136 updates signed with TSIG) and Pebble, Let's
//! Encrypt's ACME test server, validating DNS-01 challenges against that Knot. What the DNS holds
//! is checked with `kdig`, never through Capstan's own view.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::realservers::{Knot, Pebble, pem_certs, verify_chain};
use capstan_e2e::{Server, home_with, key_for};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const ZONE: &str = "capstan.test";

/// `[providers.dns]` for `knot`, with the TSIG secret in `secret_file`.
fn dns_table(knot: &Knot, secret_file: &Path) -> String {
    format!(
        "[providers.dns]\nkind = \"rfc2136\"\nserver = \"{}\"\ntsig_key_name = \"{}\"\ntsig_secret_file = {:?}\nzones = [\"{ZONE}\"]\n",
        knot.addr(),
        knot.key_name(),
        secret_file.display().to_string()
    )
}

fn acme_table(pebble: &Pebble, knot: &Knot, account: &Path) -> String {
    format!(
        "[providers.certificates]\nkind = \"acme\"\ndirectory_url = \"{}\"\ncontact = \"mailto:ops@{ZONE}\"\naccount_key_file = {:?}\ndirectory_ca_file = {:?}\ncheck_dns_server = \"{}\"\n",
        pebble.directory_url(),
        account.display().to_string(),
        pebble.listener_ca_pem_path().display().to_string(),
        knot.addr()
    )
}

/// Fast polling so a test does not wait on the engine's production backoff.
const BASE: &str = "workers = 4\nlease_ms = 3000\n[simulator]\ncertificate_issue_ms = 0\ndns_propagation_ms = 0\n[provider_retry.dns]\ninitial_ms = 50\nmax_ms = 100\nmax_attempts = 3\n";

struct World {
    server: Server,
    key: String,
    c: Client,
    home: tempfile::TempDir,
}

impl World {
    fn start(tables: &str) -> Self {
        let home = home_with(
            &["workflows/add-certificate.wasm"],
            &format!("{BASE}{tables}"),
        );
        let key = key_for(
            home.path(),
            "ops",
            &["workflows:add-certificate", "admin:read"],
        );
        let server = Server::start(home.path());
        Self {
            server,
            key,
            c: Client::new(),
            home,
        }
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let r = self
            .c
            .post(format!("{}{path}", self.server.base))
            .bearer_auth(&self.key)
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    async fn trigger(&self, body: Value) -> String {
        let r = self
            .c
            .post(format!("{}/v1/workflows/add-certificate", self.server.base))
            .bearer_auth(&self.key)
            .header("Idempotency-Key", uuid_like())
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        body["executionId"].as_str().unwrap().to_owned()
    }

    async fn execution(&self, id: &str) -> Value {
        capstan_e2e::get_json(
            &self.c,
            &format!("{}/v1/executions/{id}", self.server.base),
            &self.key,
        )
        .await
    }

    /// Polls until the execution is in one of `statuses` (two minutes at most: issuance waits
    /// on the engine's convergence backoff).
    async fn until(&self, id: &str, statuses: &[&str]) -> Value {
        let mut last = Value::Null;
        for _ in 0..1200 {
            last = self.execution(id).await;
            if statuses.iter().any(|s| last["status"] == *s) {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("execution {id} never reached {statuses:?}; last: {last:#}");
    }

    async fn settle(&self, id: &str) -> Value {
        self.until(
            id,
            &["succeeded", "failed", "canceled", "rolled_back", "paused"],
        )
        .await
    }
}

fn uuid_like() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

fn stage<'a>(execution: &'a Value, name: &str) -> &'a Value {
    execution["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stageName"] == name)
        .unwrap_or_else(|| panic!("no stage {name} in {execution:#}"))
}

#[tokio::test]
async fn add_certificate_on_knot_and_pebble_issues_a_chain_that_verifies_and_rollback_restores_the_zone()
 {
    let knot = Knot::start(ZONE);
    let pebble = Pebble::start(knot.addr()).await;
    let secrets = tempfile::tempdir().unwrap();
    let secret = knot.write_secret_file(secrets.path());
    let account = secrets.path().join("acme-account.json");
    // A challenge record left by someone else: the validation replaces it, rollback restores it.
    knot.update_add(
        &knot.name("_acme-challenge.api"),
        120,
        "TXT",
        "\"left-by-an-operator\"",
    );
    let w = World::start(&format!(
        "{}{}",
        dns_table(&knot, &secret),
        acme_table(&pebble, &knot, &account)
    ));

    let ready = capstan_e2e::get_json(&w.c, &format!("{}/readyz", w.server.base), "").await;
    let kinds: Vec<(&str, &str)> = ready["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["kind"].as_str().unwrap(), p["status"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds, [("rfc2136", "ok"), ("acme", "ok")], "{ready:#}");

    let id = w
        .trigger(json!({"domain": format!("api.{ZONE}"), "subjectAlternativeNames": [format!("www.{ZONE}")]}))
        .await;
    let e = w.settle(&id).await;
    assert_eq!(
        e["status"],
        "succeeded",
        "{e:#}\nknot: {}\npebble: {}",
        knot.log(),
        pebble.log()
    );
    let arn = stage(&e, "request")["outputJson"]["arn"]
        .as_str()
        .expect("arn")
        .to_owned();
    assert!(
        arn.starts_with("https://127.0.0.1"),
        "the arn is the order URL: {arn}"
    );

    // The published challenge records are in the zone as Knot serves them.
    assert_eq!(
        knot.query(&knot.name("_acme-challenge.www"), "TXT").len(),
        1
    );
    assert_ne!(
        knot.query(&knot.name("_acme-challenge.api"), "TXT"),
        vec!["\"left-by-an-operator\"".to_owned()]
    );

    // The chain verifies against the root Pebble made at this start; the key is exportable by
    // an operator only.
    let out = w.home.path().join("export");
    capstan_e2e::cli(
        w.home.path(),
        &[
            "certificates",
            "export",
            &arn,
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let chain = std::fs::read_to_string(out.join("fullchain.pem")).unwrap();
    assert!(
        pem_certs(&chain).len() >= 2,
        "leaf and intermediate: {chain}"
    );
    verify_chain(&chain, &pebble.issuing_root_pem().await).expect("the chain verifies");
    let key = std::fs::read_to_string(out.join("privkey.pem")).unwrap();
    assert!(key.contains("PRIVATE KEY"));
    let api = serde_json::to_string(&w.execution(&id).await).unwrap();
    assert!(
        !api.contains(key.lines().nth(1).unwrap()),
        "the key never leaves through the API"
    );
    assert_eq!(
        pebble.orders_of_credentials(&account).await.len(),
        1,
        "one order for the token"
    );

    // Rollback: the certificate is revoked, the replaced record is back, the new one is gone.
    let (status, body) = w
        .post(&format!("/v1/executions/{id}/rollback"), json!({}))
        .await;
    assert!(status.is_success(), "{status} {body}");
    let rolled = w.until(&id, &["rolled_back", "failed"]).await;
    assert_eq!(rolled["status"], "rolled_back", "{rolled:#}");
    assert_eq!(
        knot.query(&knot.name("_acme-challenge.api"), "TXT"),
        vec!["\"left-by-an-operator\"".to_owned()]
    );
    assert!(
        knot.query(&knot.name("_acme-challenge.www"), "TXT")
            .is_empty()
    );
}

#[tokio::test]
async fn a_wrong_tsig_key_fails_the_stage_with_a_permanent_error_that_names_the_key() {
    let knot = Knot::start(ZONE);
    let secrets = tempfile::tempdir().unwrap();
    let wrong = secrets.path().join("wrong.tsig");
    std::fs::write(&wrong, "d3JvbmctdHNpZy1zZWNyZXQtMDEyMzQ1Njc4OWFiY2Q=").unwrap();
    let serial = knot.soa_serial();
    let w = World::start(&dns_table(&knot, &wrong));
    let id = w.trigger(json!({"domain": format!("api.{ZONE}")})).await;
    let e = w.settle(&id).await;
    assert_eq!(e["status"], "failed", "permanent, not paused: {e:#}");
    let error = &stage(&e, "validation")["errorJson"];
    assert_eq!(error["error"], "tsig-rejected", "{error:#}");
    assert!(
        error["message"].as_str().unwrap().contains("`capstan`"),
        "names the key: {error:#}"
    );
    let text = serde_json::to_string(&e).unwrap();
    assert!(
        !text.contains("d3JvbmctdHNpZy1zZWNyZXQ"),
        "the secret never shows"
    );
    assert_eq!(knot.soa_serial(), serial, "nothing changed in the zone");
}

#[tokio::test]
async fn a_stopped_dns_server_pauses_the_execution_and_resume_carries_on_once_it_is_back() {
    let mut knot = Knot::start(ZONE);
    let secrets = tempfile::tempdir().unwrap();
    let secret = knot.write_secret_file(secrets.path());
    let w = World::start(&dns_table(&knot, &secret));
    knot.stop();
    let id = w.trigger(json!({"domain": format!("api.{ZONE}")})).await;
    let e = w.settle(&id).await;
    assert_eq!(
        e["status"], "paused",
        "transient errors retried, then paused: {e:#}"
    );
    assert_eq!(stage(&e, "validation")["errorJson"]["error"], "unavailable");

    knot.restart();
    let (status, body) = w
        .post(&format!("/v1/executions/{id}/resume"), json!({}))
        .await;
    assert!(status.is_success(), "{status} {body}");
    // The validation stage finishes; the simulated certificate then waits for its record in the
    // simulated DNS, which a real zone never feeds (certificates need the acme provider here).
    let e = w.until(&id, &["waiting", "failed"]).await;
    assert_eq!(stage(&e, "validation")["status"], "succeeded", "{e:#}");
    // The simulated certificate's validation record is in the real zone.
    assert_eq!(
        knot.query(&knot.name("_capstan-validation.api"), "CNAME")
            .len(),
        1,
        "{:?}",
        knot.records()
    );
}
