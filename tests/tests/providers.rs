//! Real providers against real servers the tests start themselves on 127.0.0.1: Knot DNS as the
//! authoritative primary of `capstan.test` (RFC 2136 updates signed with TSIG) and Pebble, Let's
//! Encrypt's ACME test server, validating DNS-01 challenges against that Knot. What the DNS holds
//! is checked with `kdig`, never through Capstan's own view.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::realservers::{Knot, Pebble, pem_certs, san_names, verify_chain};
use capstan_e2e::{Server, assert_valid, home_with, key_for, schema};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

const ZONE: &str = "capstan.test";

/// Fast polling so a test does not wait on the engine's production backoff; `simulator` goes
/// into the `[simulator]` table.
fn base(simulator: &str) -> String {
    format!(
        "workers = 4\nlease_ms = 3000\n[simulator]\ncertificate_issue_ms = 0\ndns_propagation_ms = 0\ncdn_deploy_ms = 0\n{simulator}[provider_retry.dns]\ninitial_ms = 50\nmax_ms = 100\nmax_attempts = 3\n"
    )
}

struct World {
    server: Server,
    key: String,
    c: Client,
    home: tempfile::TempDir,
}

impl World {
    /// A server running add-certificate with `tables` added to the configuration.
    fn start(tables: &str) -> Self {
        Self::start_with(
            &["workflows/add-certificate.wasm"],
            &["workflows:add-certificate", "admin:read"],
            "",
            tables,
        )
    }

    fn start_with(
        components: &[&str],
        permissions: &[&str],
        simulator: &str,
        tables: &str,
    ) -> Self {
        let home = home_with(components, &format!("{}{tables}", base(simulator)));
        let key = key_for(home.path(), "ops", permissions);
        let server = Server::start(home.path());
        Self {
            server,
            key,
            c: Client::new(),
            home,
        }
    }

    /// Exports the certificate `arn` with the operator CLI and checks that its chain verifies
    /// against the root Pebble made at this start; returns the chain.
    async fn export_verified(&self, arn: &str, pebble: &Pebble) -> String {
        let out = self.home.path().join("export");
        capstan_e2e::cli(
            self.home.path(),
            &[
                "certificates",
                "export",
                arn,
                "--out",
                out.to_str().unwrap(),
            ],
        );
        let chain = std::fs::read_to_string(out.join("fullchain.pem")).unwrap();
        verify_chain(&chain, &pebble.issuing_root_pem().await).expect("the chain verifies");
        chain
    }

    /// SIGKILLs the server and starts another on the same home.
    fn kill_and_restart(&mut self) {
        self.server.child.kill().unwrap();
        self.server.child.wait().unwrap();
        self.server = Server::start(self.home.path());
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
        self.trigger_workflow("add-certificate", body).await
    }

    async fn trigger_workflow(&self, workflow: &str, body: Value) -> String {
        let r = self
            .c
            .post(format!("{}/v1/workflows/{workflow}", self.server.base))
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
        knot.provider_table(&secret),
        pebble.provider_table(&knot, &account)
    ));

    let ready = capstan_e2e::get_json(&w.c, &format!("{}/readyz", w.server.base), "").await;
    let kinds: Vec<(&str, &str)> = ready["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["kind"].as_str().unwrap(), p["status"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds, [("rfc2136", "ok"), ("acme", "ok")], "{ready:#}");
    // Each grant names what serves it, in /readyz and in `capstan workflows list`.
    let listed: Value = serde_json::from_str(&capstan_e2e::cli(
        w.home.path(),
        &["workflows", "list", "--json"],
    ))
    .unwrap();
    for grants in [
        &ready["workflows"][0]["capabilities"],
        &listed["workflows"][0]["capabilities"],
    ] {
        let grants = grants.as_array().unwrap();
        for expected in [
            json!({"name": "dns", "implementation": "rfc2136"}),
            json!({"name": "certificates", "implementation": "acme"}),
            json!({"name": "convergence", "implementation": "host"}),
        ] {
            assert!(grants.contains(&expected), "{expected} in {grants:?}");
        }
    }
    let table = capstan_e2e::cli(w.home.path(), &["workflows", "list"]);
    assert!(
        table.contains("dns=rfc2136") && table.contains("certificates=acme"),
        "{table}"
    );

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
    // No secret in the server's log: not the TSIG secret, not the ACME account key, not the
    // certificate's key.
    let mut log = w.server.startup_log.clone();
    log.extend(w.server.logs.try_iter());
    let log = log.join("\n");
    let credentials: Value =
        serde_json::from_str(&std::fs::read_to_string(&account).unwrap()).unwrap();
    for secret in [
        knot.secret_b64(),
        credentials["key_pkcs8"].as_str().unwrap(),
        key.lines().nth(1).unwrap(),
    ] {
        assert!(!log.contains(secret), "a secret in the log");
    }
    assert!(
        log.contains("provider configured"),
        "the log was read: {log}"
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
    let w = World::start(&knot.provider_table(&wrong));
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
    let w = World::start(&knot.provider_table(&secret));
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

#[tokio::test]
async fn onboard_domain_on_knot_and_pebble_routes_below_the_apex_and_rollback_restores_the_zone() {
    let knot = Knot::start(ZONE);
    let pebble = Pebble::start(knot.addr()).await;
    let secrets = tempfile::tempdir().unwrap();
    let secret = knot.write_secret_file(secrets.path());
    let account = secrets.path().join("acme-account.json");
    // An address record the routing replaces with a CNAME; rollback brings it back.
    knot.update_add(&knot.name("www"), 300, "A", "192.0.2.10");
    let seed = secrets.path().join("seed.json");
    std::fs::write(
        &seed,
        json!({
            "tickets": [{"id": "OPS-7", "title": format!("Onboard {ZONE}")}],
            "mapsKeys": [{"id": "web", "displayName": "Web key", "capacity": 50}]
        })
        .to_string(),
    )
    .unwrap();
    let w = World::start_with(
        &["workflows/onboard-domain.wasm"],
        &["workflows:onboard-domain", "admin:read"],
        &format!("seed_file = {:?}\n", seed.display().to_string()),
        &format!(
            "{}{}",
            knot.provider_table(&secret),
            pebble.provider_table(&knot, &account)
        ),
    );

    let id = w
        .trigger_workflow(
            "onboard-domain",
            json!({"domain": ZONE, "ticketId": "OPS-7"}),
        )
        .await;
    let e = w.settle(&id).await;
    assert_eq!(
        e["status"],
        "succeeded",
        "{e:#}\nknot: {}\npebble: {}",
        knot.log(),
        pebble.log()
    );
    let o = &e["outcome"];
    assert_valid(&schema("domain-onboarding-outcome.schema.json"), o);
    assert_eq!(o["certificate"]["state"], "created", "{o:#}");
    let arn = o["certificate"]["arn"].as_str().unwrap().to_owned();
    assert!(arn.starts_with("https://127.0.0.1"), "an ACME order: {arn}");
    assert_eq!(o["distributions"]["proxy"]["state"], "created");
    assert_eq!(o["distributions"]["cms"]["state"], "created");
    assert_eq!(o["ticketing"]["state"], "updated");
    // RFC 2136 has no alias records: the apex is the platform team's to route, so the
    // onboarding asks for assistance naming it and the distribution to point at.
    assert_eq!(o["status"], "assistance-required", "{o:#}");
    let reasons = o["assistance"]["reasons"].as_array().unwrap();
    assert_eq!(reasons.len(), 1, "{reasons:#?}");
    assert_eq!(reasons[0]["code"], "route-manually");
    assert_eq!(reasons[0]["audience"], "platform");
    assert_eq!(reasons[0]["resources"], json!([ZONE]));

    // Below the apex the names are CNAMEs to their distributions, as Knot answers them.
    let www = knot.query(&knot.name("www"), "CNAME");
    assert_eq!(www.len(), 1, "{:?}", knot.records());
    assert!(www[0].ends_with(".cdn.sim.capstan.dev."), "{www:?}");
    assert!(
        reasons[0]["action"]
            .as_str()
            .unwrap()
            .contains(www[0].trim_end_matches('.'))
    );
    assert!(
        knot.query(&knot.name("www"), "A")
            .iter()
            .all(|a| !a.contains("192.0.2.10"))
    );
    let cms = knot.query(&knot.name("cms"), "CNAME");
    assert_eq!(cms.len(), 1);
    assert_ne!(cms, www, "each distribution has its own name");

    // The certificate covers the three names and chains to Pebble's root of this start.
    let chain = w.export_verified(&arn, &pebble).await;
    let mut names = san_names(&pem_certs(&chain)[0]);
    names.sort();
    assert_eq!(
        names,
        [
            ZONE.to_owned(),
            format!("cms.{ZONE}"),
            format!("www.{ZONE}")
        ],
        "{chain}"
    );

    // Rollback: the records the onboarding added are gone, the one it replaced is back.
    let (status, body) = w
        .post(&format!("/v1/executions/{id}/rollback"), json!({}))
        .await;
    assert!(status.is_success(), "{status} {body}");
    let rolled = w.until(&id, &["rolled_back", "failed"]).await;
    assert_eq!(rolled["status"], "rolled_back", "{rolled:#}");
    assert!(knot.query(&knot.name("www"), "CNAME").is_empty());
    assert!(knot.query(&knot.name("cms"), "CNAME").is_empty());
    assert_eq!(knot.query(&knot.name("www"), "A"), ["192.0.2.10"]);
    for name in [ZONE.to_owned(), knot.name("www"), knot.name("cms")] {
        assert!(
            knot.query(&format!("_acme-challenge.{name}"), "TXT")
                .is_empty(),
            "{name}: {:?}",
            knot.records()
        );
    }
}

#[tokio::test]
async fn sigkill_of_the_server_in_the_middle_of_an_acme_order_still_ends_with_one_order() {
    let knot = Knot::start(ZONE);
    let pebble = Pebble::start(knot.addr()).await;
    let secrets = tempfile::tempdir().unwrap();
    let secret = knot.write_secret_file(secrets.path());
    let account = secrets.path().join("acme-account.json");
    let mut w = World::start(&format!(
        "{}{}",
        knot.provider_table(&secret),
        pebble.provider_table(&knot, &account)
    ));
    let id = w
        .trigger(json!({"domain": format!("api.{ZONE}"), "subjectAlternativeNames": [format!("www.{ZONE}")]}))
        .await;

    // First kill: the CA holds the order, the execution is still on its way.
    for _ in 0..3000 {
        if pebble.orders_created() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(pebble.orders_created(), 1, "{}", pebble.log());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = w.execution(&id).await;
    assert!(
        ["queued", "running", "waiting"].contains(&before["status"].as_str().unwrap()),
        "killed mid-order: {before:#}"
    );
    w.kill_and_restart();

    // Second kill, if the execution gets that far first: while it waits on issuance.
    let mut killed_in_issuance = false;
    for _ in 0..600 {
        let e = w.execution(&id).await;
        if e["status"] == "succeeded" {
            break;
        }
        let issuing = e["stages"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["stageName"] == "issuance"));
        if issuing {
            w.kill_and_restart();
            killed_in_issuance = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let e = w.settle(&id).await;
    assert_eq!(e["status"], "succeeded", "{e:#}\npebble: {}", pebble.log());
    assert_eq!(
        pebble.orders_of_credentials(&account).await.len(),
        1,
        "one order for the token (killed in issuance too: {killed_in_issuance})"
    );
    assert_eq!(pebble.orders_created(), 1, "no order on any account either");
    assert_eq!(pebble.issued_serials().len(), 1, "one certificate issued");
    let arn = stage(&e, "request")["outputJson"]["arn"]
        .as_str()
        .unwrap()
        .to_owned();
    w.export_verified(&arn, &pebble).await;
}
