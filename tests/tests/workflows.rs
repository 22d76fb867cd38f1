//! The five workflows end to end: a real `capstan serve` with the shipped components on a seeded
//! simulated cloud with injected faults, driven through `/v1`. Every onboard-domain outcome is
//! validated against the document's DomainOnboardingOutcome schema, every plan against
//! AddSubdomainPlan, and rollback is checked by comparing simulator snapshots.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, assert_valid, home_with, key_for, schema};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

const COMPONENTS: [&str; 5] = [
    "workflows/onboard-domain.wasm",
    "workflows/add-certificate.wasm",
    "workflows/add-domain.wasm",
    "workflows/add-subdomain.wasm",
    "workflows/update-function-version.wasm",
];

const PERMISSIONS: [&str; 6] = [
    "workflows:onboard-domain",
    "workflows:add-certificate",
    "workflows:add-domain",
    "workflows:add-subdomain",
    "workflows:update-function-version",
    "admin:read",
];

struct World {
    server: Server,
    key: String,
    c: Client,
    _home: tempfile::TempDir,
}

impl World {
    fn start(seed: Value, simulator: &str) -> Self {
        let home = home_with(&COMPONENTS, "");
        let seed_path = home.path().join("seed.json");
        std::fs::write(&seed_path, seed.to_string()).unwrap();
        std::fs::write(
            home.path().join("capstan.toml"),
            format!(
                "workers = 4\nlease_ms = 5000\n[simulator]\ncertificate_issue_ms = 0\ncdn_deploy_ms = 0\nseed_file = {:?}\n{simulator}",
                seed_path.display().to_string()
            ),
        )
        .unwrap();
        let key = key_for(home.path(), "ops", &PERMISSIONS);
        let server = Server::start(home.path());
        Self {
            server,
            key,
            c: Client::new(),
            _home: home,
        }
    }

    async fn trigger(&self, workflow: &str, body: Value) -> String {
        let r = self
            .c
            .post(format!("{}/v1/workflows/{workflow}", self.server.base))
            .bearer_auth(&self.key)
            .header("Idempotency-Key", capstan_core_like_id())
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        body["executionId"].as_str().unwrap().to_owned()
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let r = self
            .c
            .get(format!("{}{path}", self.server.base))
            .bearer_auth(&self.key)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut r = self
            .c
            .post(format!("{}{path}", self.server.base))
            .bearer_auth(&self.key);
        if let Some(body) = body {
            r = r.json(&body);
        }
        let r = r.send().await.unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    async fn execution(&self, id: &str) -> Value {
        self.get(&format!("/v1/executions/{id}")).await.1
    }

    /// Polls until the execution is in one of `statuses`.
    async fn until(&self, id: &str, statuses: &[&str]) -> Value {
        let mut last = Value::Null;
        for _ in 0..1200 {
            last = self.execution(id).await;
            if statuses.iter().any(|s| last["status"] == *s) {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
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

    async fn simulator(&self) -> Value {
        let (status, body) = self.get("/v1/admin/simulator").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    /// Rolls back and waits for `rolled_back`.
    async fn rollback(&self, id: &str) -> Value {
        let (status, body) = self
            .post(&format!("/v1/executions/{id}/rollback"), None)
            .await;
        assert!(
            status == StatusCode::ACCEPTED || status == StatusCode::OK,
            "{status} {body}"
        );
        self.until(id, &["rolled_back"]).await
    }
}

fn capstan_core_like_id() -> String {
    format!(
        "k-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// The parts of the simulated world a rollback restores (registrations and ticket comments are
/// irreversible by nature; effect counts only grow).
fn reversible(snapshot: &Value) -> Value {
    let tickets: Vec<Value> = snapshot["tickets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| json!({"id": t["id"], "status": t["status"]}))
        .collect();
    json!({
        "records": snapshot["dns"]["records"],
        "certificates": snapshot["certificates"],
        "distributions": snapshot["distributions"],
        "maps": snapshot["maps"],
        "functions": snapshot["functions"],
        "tickets": tickets,
    })
}

fn stage<'a>(execution: &'a Value, name: &str) -> &'a Value {
    execution["stages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|s| s["stageName"] == name)
        .unwrap_or_else(|| panic!("no stage {name} in {execution:#}"))
}

fn seed_main() -> Value {
    json!({
        "zones": ["example.com", "fresh.test", "owned.test", "dry.test", "cms.test", "mapsretry.test", "noticket.test"],
        "records": [{"zone": "example.com", "name": "www.example.com", "type": "CNAME", "ttl": 300, "values": ["legacy.example.net"]}],
        "domains": [{"name": "owned.test", "owned": true}, {"name": "example.com", "owned": true}, {"name": "taken.test", "owned": false}],
        "certificates": [{"domain": "owned.test", "subjectAlternativeNames": ["*.owned.test"]}],
        "mapsKeys": [{"id": "web", "displayName": "Web key", "capacity": 50}],
        "tickets": [{"id": "OPS-1", "title": "Onboard fresh.test"}, {"id": "OPS-2", "title": "Onboard owned.test"}],
        "functions": [
            {"name": "edge-router", "versions": ["1".repeat(64)], "aliases": {"live": "1"}},
            {"name": "fragile", "versions": ["2".repeat(64)], "aliases": {"live": "1"}},
            {"name": "slow", "versions": ["3".repeat(64)], "aliases": {"live": "1"}},
            {"name": "flaky", "versions": ["4".repeat(64)], "aliases": {"live": "1"}}
        ]
    })
}

const MAIN_FAULTS: &str = r#"
[[simulator.faults]]
op = "maps.add-referrer"
match = "*.mapsretry.test/*"
error = "permanent"
code = "capacity-exhausted"
times = 1

[[simulator.faults]]
op = "functions.probe"
match = "fragile"
error = "permanent"
code = "unhealthy"

[[simulator.faults]]
op = "functions.publish-version"
match = "slow"
latency_ms = 1500

[[simulator.faults]]
op = "functions.probe"
match = "flaky"
error = "transient"
code = "probe-timeout"

[[simulator.faults]]
op = "certificates.request-certificate"
match = "slowcert.example.com"
latency_ms = 2000

[provider_retry.functions]
initial_ms = 0
max_ms = 0
max_attempts = 2
"#;

#[tokio::test]
async fn onboard_domain_outcomes_recovery_and_exact_rollback() {
    let w = World::start(seed_main(), MAIN_FAULTS);
    let outcome_schema = schema("domain-onboarding-outcome.schema.json");
    let before = w.simulator().await;

    // A fresh domain: everything created, the ticket updated; then rolled back exactly.
    let id = w
        .trigger(
            "onboard-domain",
            json!({"domain": "  Fresh.TEST ", "ticketId": " ops-1 "}),
        )
        .await;
    let e = w.settle(&id).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    let o = &e["outcome"];
    assert_valid(&outcome_schema, o);
    assert_eq!(o["executionId"], id.as_str());
    assert_eq!(
        o["domain"],
        json!({"name": "fresh.test", "state": "registered"})
    );
    assert_eq!(o["certificate"]["state"], "created");
    assert_eq!(o["distributions"]["cms"]["state"], "created");
    assert_eq!(o["distributions"]["proxy"]["state"], "created");
    assert_eq!(o["mapsProvider"]["outcome"], "updated");
    assert_eq!(o["ticketing"]["state"], "updated");
    assert_eq!(o["ticketing"]["ticketId"], "OPS-1");
    assert_eq!(o["cleanup"]["state"], "not-required");
    assert_eq!(o["assistance"]["required"], false);
    let after = w.simulator().await;
    let proxy = after["distributions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"] == o["distributions"]["proxy"]["id"])
        .unwrap();
    assert!(
        proxy["spec"]["aliases"]
            .as_array()
            .unwrap()
            .contains(&json!("fresh.test"))
    );
    let rolled = w.rollback(&id).await;
    assert_eq!(rolled["status"], "rolled_back", "{rolled:#}");
    assert_eq!(
        reversible(&w.simulator().await),
        reversible(&before),
        "rollback leaves the simulated cloud as it was"
    );

    // Our domain with a covering certificate: already registered, certificate adopted; a second
    // run adopts the distributions the first one made.
    let first = w
        .trigger(
            "onboard-domain",
            json!({"domain": "owned.test", "ticketId": "OPS-2"}),
        )
        .await;
    let e = w.settle(&first).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    assert_valid(&outcome_schema, &e["outcome"]);
    assert_eq!(e["outcome"]["domain"]["state"], "already-registered");
    assert_eq!(e["outcome"]["certificate"]["state"], "adopted");
    let second = w
        .trigger("onboard-domain", json!({"domain": "owned.test"}))
        .await;
    let e = w.settle(&second).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    let o = &e["outcome"];
    assert_valid(&outcome_schema, o);
    assert_eq!(o["distributions"]["cms"]["state"], "adopted");
    assert_eq!(o["distributions"]["proxy"]["state"], "adopted");
    assert_eq!(o["mapsProvider"]["outcome"], "already-present");
    assert_eq!(o["ticketing"]["state"], "not-requested");

    // add-domain attaches another name to the distribution owned.test uses, through the API.
    let before_attach = w.simulator().await;
    let attach = w
        .trigger(
            "add-domain",
            json!({"domain": "shop.owned.test", "existingAlias": "owned.test"}),
        )
        .await;
    let e = w.settle(&attach).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    let sim = w.simulator().await;
    assert!(
        sim["distributions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["spec"]["aliases"]
                .as_array()
                .unwrap()
                .contains(&json!("shop.owned.test"))),
        "the alias is attached"
    );
    let rolled = w.rollback(&attach).await;
    assert_eq!(rolled["status"], "rolled_back", "{rolled:#}");
    assert_eq!(
        reversible(&w.simulator().await),
        reversible(&before_attach),
        "add-domain's rollback detaches the alias and removes its record"
    );

    // Dry run: reports, changes nothing.
    let effects = w.simulator().await["effects"].clone();
    let dry = w
        .trigger(
            "onboard-domain",
            json!({"domain": "dry.test", "ticketId": "OPS-1", "options": {"dryRun": true}}),
        )
        .await;
    let e = w.settle(&dry).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    let o = &e["outcome"];
    assert_valid(&outcome_schema, o);
    assert_eq!(o["status"], "dry-run");
    assert_eq!(o["domain"]["state"], "not-registered");
    assert_eq!(o["certificate"]["state"], "not-created");
    assert_eq!(o["mapsProvider"]["outcome"], "not-reached");
    assert_eq!(o["ticketing"]["state"], "not-reached");
    assert_eq!(o["cleanup"]["state"], "not-reached");
    assert_eq!(
        w.simulator().await["effects"],
        effects,
        "a dry run changes nothing"
    );

    // No CMS, an unknown ticket; then CMS: the proxy is updated and the CMS created.
    let no_cms = w
        .trigger(
            "onboard-domain",
            json!({"domain": "cms.test", "isCms": false, "ticketId": "NOPE-9"}),
        )
        .await;
    let e = w.settle(&no_cms).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    let o = &e["outcome"];
    assert_valid(&outcome_schema, o);
    assert_eq!(o["distributions"]["cms"]["state"], "not-created");
    assert_eq!(o["ticketing"]["state"], "manual-required");
    assert_eq!(o["assistance"]["required"], true);
    assert!(
        o["assistance"]["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["audience"] == "requester"),
        "a missing ticket is the requester's to fix: {o:#}"
    );
    let with_cms = w
        .trigger("onboard-domain", json!({"domain": "cms.test"}))
        .await;
    let e = w.settle(&with_cms).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    let o = &e["outcome"];
    assert_valid(&outcome_schema, o);
    assert_eq!(o["distributions"]["cms"]["state"], "created");
    assert_eq!(o["distributions"]["proxy"]["state"], "updated");

    // Maps refuses once (capacity): the run succeeds with manual-required for the platform;
    // retry-maps-whitelist re-runs the whitelist (a second request returns the pending one or
    // finds none pending) and updates it.
    let maps = w
        .trigger("onboard-domain", json!({"domain": "mapsretry.test"}))
        .await;
    let e = w.settle(&maps).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    let o = &e["outcome"];
    assert_valid(&outcome_schema, o);
    assert_eq!(o["mapsProvider"]["outcome"], "manual-required");
    assert_eq!(o["mapsProvider"]["keys"][0]["state"], "capacity-exhausted");
    assert!(
        o["assistance"]["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["audience"] == "platform")
    );
    let (status, body) = w
        .post(
            &format!("/v1/executions/{first}/retry-maps-whitelist"),
            None,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "maps outcome was updated: {body}"
    );
    let (status, body) = w
        .post(&format!("/v1/executions/{maps}/retry-maps-whitelist"), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["command"]["operation"], "retry-maps-whitelist");
    let e = w.settle(&maps).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    assert_valid(&outcome_schema, &e["outcome"]);
    assert_eq!(e["outcome"]["mapsProvider"]["outcome"], "updated");

    // A domain registered to someone else fails with the reason on the stage.
    let taken = w
        .trigger(
            "onboard-domain",
            json!({"domain": "taken.test", "options": {"skipReadinessCheck": true}}),
        )
        .await;
    let e = w.settle(&taken).await;
    assert_eq!(e["status"], "failed", "{e:#}");
    assert!(e.get("outcome").is_none());
    let failed: Vec<&Value> = e["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["status"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1, "{e:#}");
    assert!(failed[0]["errorJson"]["error"].as_str().is_some());

    // Invalid bodies: 400 with one issue per problem, nothing created.
    let r =
        w.c.post(format!("{}/v1/workflows/onboard-domain", w.server.base))
            .bearer_auth(&w.key)
            .header("Idempotency-Key", "bad-1")
            .json(&json!({"domain": "", "isCms": "yes", "extra": 1}))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "validation_error");
    assert!(body["issues"].as_array().unwrap().len() >= 3, "{body}");
}

#[tokio::test]
async fn onboard_domain_retry_finalization_on_a_full_maps_key() {
    let seed = json!({
        "zones": ["full.test"],
        "mapsKeys": [{"id": "tiny", "displayName": "Tiny key", "capacity": 1, "referrers": ["*.other.test/*"]}],
    });
    let w = World::start(
        seed,
        "[[simulator.faults]]\nop = \"cdn.get-distribution\"\nerror = \"permanent\"\ncode = \"cdn-api-down\"\ntimes = 1\n",
    );
    let outcome_schema = schema("domain-onboarding-outcome.schema.json");
    let id = w
        .trigger("onboard-domain", json!({"domain": "full.test"}))
        .await;
    let e = w.settle(&id).await;
    assert_eq!(e["status"], "failed", "{e:#}");
    assert_eq!(stage(&e, "finalize")["status"], "failed");
    let effects = w.simulator().await["effects"].clone();
    let (status, body) = w
        .post(&format!("/v1/executions/{id}/retry-finalization"), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["command"]["operation"], "retry-finalization");
    let e = w.until(&id, &["succeeded", "failed", "paused"]).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    assert_eq!(
        w.simulator().await["effects"],
        effects,
        "prerequisites are replayed, not repeated"
    );
    let o = &e["outcome"];
    assert_valid(&outcome_schema, o);
    assert_eq!(o["mapsProvider"]["outcome"], "manual-required");
    assert_eq!(o["mapsProvider"]["keys"][0]["state"], "capacity-exhausted");
    assert_eq!(o["mapsProvider"]["remainingRootDomains"], 0);
    assert_eq!(o["ticketing"]["state"], "not-requested");
    // Finalization is not eligible any more.
    let (status, body) = w
        .post(&format!("/v1/executions/{id}/retry-finalization"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"], "state_invalid");
}

#[tokio::test]
async fn add_subdomain_plan_approval_apply_and_rollback() {
    let w = World::start(seed_main(), "");
    let plan_schema = schema("add-subdomain-plan.schema.json");
    let before = w.simulator().await;
    let apex = json!({"dnsName": "dapex.cdn.sim.capstan.dev", "hostedZoneId": "ZCDNSIMULATED", "evaluateTargetHealth": false});
    let id = w
        .trigger(
            "add-subdomain",
            json!({"rootDomain": "example.com", "subdomains": ["www", "api"], "apexAlias": apex}),
        )
        .await;
    w.until(&id, &["waiting"]).await;
    let mut plan = Value::Null;
    for _ in 0..200 {
        let (status, body) = w.get(&format!("/v1/executions/{id}/plan")).await;
        if status == StatusCode::OK {
            plan = body;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_valid(&plan_schema, &plan);
    assert_eq!(plan["executionId"], id.as_str());
    assert_eq!(plan["replacementRequired"], true, "{plan:#}");
    let disposition = |host: &str| {
        plan["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["hostname"] == host)
            .unwrap()["disposition"]
            .clone()
    };
    assert_eq!(disposition("www.example.com"), "replace");
    assert_eq!(disposition("api.example.com"), "create");
    let events = w.get(&format!("/v1/executions/{id}/events")).await.1;
    assert!(
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["eventType"] == "SubdomainPlanReady")
    );

    // A stale or malformed hash is refused and changes nothing.
    let (status, body) = w
        .post(
            &format!("/v1/executions/{id}/plan/approve"),
            Some(json!({"planHash": "0".repeat(64)})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = w
        .post(
            &format!("/v1/executions/{id}/plan/approve"),
            Some(json!({"planHash": "XYZ"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"], "validation_error");
    assert_eq!(w.execution(&id).await["status"], "waiting");

    let (status, body) = w
        .post(
            &format!("/v1/executions/{id}/plan/approve"),
            Some(json!({"planHash": plan["planHash"]})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let e = w.settle(&id).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    let (status, body) = w.post(&format!("/v1/executions/{id}/cancel"), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let records = w.simulator().await["dns"]["records"].clone();
    let api = records
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["recordSet"]["name"] == "api.example.com")
        .unwrap();
    assert_eq!(
        api["recordSet"]["alias_target"]["dns_name"],
        "dapex.cdn.sim.capstan.dev"
    );

    let rolled = w.rollback(&id).await;
    assert_eq!(rolled["status"], "rolled_back", "{rolled:#}");
    assert_eq!(
        reversible(&w.simulator().await),
        reversible(&before),
        "the CNAME is back and the new record gone"
    );
}

#[tokio::test]
async fn add_subdomain_cannot_be_canceled_once_dns_accepted_the_change() {
    // DNS takes a minute to converge, so the run sits in `apply` after approval.
    let w = World::start(
        json!({"zones": ["example.com"]}),
        "dns_propagation_ms = 60000\n",
    );
    let apex = json!({"dnsName": "dapex.cdn.sim.capstan.dev", "hostedZoneId": "ZCDNSIMULATED", "evaluateTargetHealth": false});
    let body = json!({"rootDomain": "example.com", "subdomains": ["www"], "apexAlias": apex});

    // Canceled while waiting for approval: fine.
    let early = w.trigger("add-subdomain", body.clone()).await;
    w.until(&early, &["waiting"]).await;
    let (status, _) = w
        .post(&format!("/v1/executions/{early}/cancel"), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(w.until(&early, &["canceled"]).await["status"], "canceled");

    let id = w.trigger("add-subdomain", body).await;
    w.until(&id, &["waiting"]).await;
    let plan = loop {
        let (status, plan) = w.get(&format!("/v1/executions/{id}/plan")).await;
        if status == StatusCode::OK {
            break plan;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    w.post(
        &format!("/v1/executions/{id}/plan/approve"),
        Some(json!({"planHash": plan["planHash"]})),
    )
    .await;
    for _ in 0..400 {
        let e = w.execution(&id).await;
        if e["currentStage"] == "apply" && e["status"] == "waiting" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (status, body) = w.post(&format!("/v1/executions/{id}/cancel"), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"], "state_invalid");
    assert_eq!(body["reason"], "past_point_of_no_return");
    assert_eq!(
        w.execution(&id).await["status"],
        "waiting",
        "nothing changed"
    );
}

#[tokio::test]
async fn certificates_and_function_versions_roll_back_and_cancel_cooperatively() {
    let w = World::start(seed_main(), MAIN_FAULTS);
    let before = w.simulator().await;

    // add-certificate: requested, validated through DNS, issued; rollback deletes it and its
    // validation record.
    let cert = w
        .trigger(
            "add-certificate",
            json!({"domain": "api.example.com", "subjectAlternativeNames": ["*.api.example.com"]}),
        )
        .await;
    let e = w.settle(&cert).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    let sim = w.simulator().await;
    let issued: Vec<&Value> = sim["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["domain"] == "api.example.com")
        .collect();
    assert_eq!(issued.len(), 1);
    assert_eq!(issued[0]["status"], "Issued");
    assert_eq!(w.rollback(&cert).await["status"], "rolled_back");
    assert_eq!(reversible(&w.simulator().await), reversible(&before));

    // update-function-version: published, shifted, verified; rollback restores the alias and
    // deletes the version.
    let up = w
        .trigger(
            "update-function-version",
            json!({"functionName": "edge-router", "codeSha256": "a".repeat(64)}),
        )
        .await;
    let e = w.settle(&up).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    let router = |sim: &Value| {
        sim["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "edge-router")
            .unwrap()
            .clone()
    };
    assert_eq!(router(&w.simulator().await)["aliases"]["live"], "2");
    // The receipts say what each change did and how a rollback undoes it.
    let (status, receipts) = w.get(&format!("/v1/executions/{up}/receipts")).await;
    assert_eq!(status, StatusCode::OK, "{receipts}");
    let undo: Vec<(&str, &str, &str)> = receipts["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["op"].as_str().unwrap(),
                r["undo"].as_str().unwrap(),
                r["undoOp"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        undo,
        [
            (
                "functions.publish-version",
                "call",
                "functions.delete-version"
            ),
            ("functions.update-alias", "call", "functions.route-alias"),
        ]
    );
    assert!(receipts["receipts"][1]["compensatedAt"].is_null());
    assert_eq!(
        receipts["receipts"][1]["response"]["before"]["version"],
        "1"
    );
    assert_eq!(w.rollback(&up).await["status"], "rolled_back");
    assert_eq!(router(&w.simulator().await), router(&before));
    let (_, receipts) = w.get(&format!("/v1/executions/{up}/receipts")).await;
    assert!(
        receipts["receipts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["compensatedAt"].is_string()),
        "{receipts:#}"
    );

    // An unhealthy version fails verification; rollback puts the alias back.
    let fragile = w
        .trigger(
            "update-function-version",
            json!({"functionName": "fragile", "codeSha256": "b".repeat(64)}),
        )
        .await;
    let e = w.settle(&fragile).await;
    assert_eq!(e["status"], "failed", "{e:#}");
    assert_eq!(stage(&e, "verify")["status"], "failed");
    let rolled = w.rollback(&fragile).await;
    assert_eq!(rolled["status"], "rolled_back", "{rolled:#}");
    assert_eq!(reversible(&w.simulator().await), reversible(&before));

    // A probe that keeps timing out pauses the run (the host retried it first); a paused run is
    // not running to see a cooperative request, so cancel ends it at once.
    let flaky = w
        .trigger(
            "update-function-version",
            json!({"functionName": "flaky", "codeSha256": "d".repeat(64)}),
        )
        .await;
    let e = w.settle(&flaky).await;
    assert_eq!(e["status"], "paused", "{e:#}");
    assert_eq!(stage(&e, "verify")["errorJson"]["error"], "probe-timeout");
    // update-function-version rolls back only finished executions: a paused one may still be
    // resumed and publish more.
    let (status, body) = w
        .post(&format!("/v1/executions/{flaky}/rollback"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["reason"], "not_rollbackable", "{body}");
    assert_eq!(w.execution(&flaky).await["status"], "paused");
    let (status, body) = w
        .post(&format!("/v1/executions/{flaky}/cancel"), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(w.until(&flaky, &["canceled"]).await["status"], "canceled");

    // Cooperative cancel: recorded, the workflow stops at its next safe point → canceled;
    // resume (the workflow declares it) finishes the job.
    let slow = w
        .trigger(
            "update-function-version",
            json!({"functionName": "slow", "codeSha256": "c".repeat(64)}),
        )
        .await;
    w.until(&slow, &["running"]).await;
    let (status, body) = w.post(&format!("/v1/executions/{slow}/cancel"), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "cancellation_requested");
    assert!(
        body["execution"]["cancellationRequestedAt"].is_string(),
        "{body}"
    );
    let e = w.settle(&slow).await;
    assert_eq!(e["status"], "canceled", "{e:#}");
    let (status, body) = w.post(&format!("/v1/executions/{slow}/resume"), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let e = w.until(&slow, &["succeeded", "failed", "canceled"]).await;
    assert_eq!(e["status"], "succeeded", "{e:#}");
    let slow_fn = w.simulator().await["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "slow")
        .unwrap()
        .clone();
    assert_eq!(slow_fn["aliases"]["live"], "2");
    assert_eq!(
        slow_fn["versions"].as_array().unwrap().len(),
        2,
        "the version published before the cancel was replayed, not published again"
    );
}

/// The remaining outcome variants, each driven by a seeded state or a fault scoped to its domain.
#[tokio::test]
async fn onboard_domain_unknown_cleanup_and_failed_key_variants() {
    let seed = json!({
        "zones": ["unk1.test", "unk2.test", "unk3.test", "clean1.test", "clean2.test", "clean3.test", "mapsfail.test"],
        "certificates": [
            {"domain": "clean1.test", "status": "pending-validation", "arn": "arn:sim:acm::certificate/clean1"},
            {"domain": "clean2.test", "status": "pending-validation", "arn": "arn:sim:acm::certificate/clean2"},
            {"domain": "clean3.test", "status": "pending-validation", "arn": "arn:sim:acm::certificate/clean3"}
        ],
        "mapsKeys": [{"id": "web", "displayName": "Web key", "capacity": 50}],
    });
    let faults = r#"
[[simulator.faults]]
op = "registrar.check-domain"
match = "unk1.test"
error = "permanent"
[[simulator.faults]]
op = "certificates.find-certificates"
match = "unk2.test"
error = "permanent"
[[simulator.faults]]
op = "cdn.find-distribution-by-alias"
match = "*unk3.test"
error = "permanent"
[[simulator.faults]]
op = "certificates.delete-certificate"
match = "*clean2"
error = "permanent"
code = "not-found"
[[simulator.faults]]
op = "certificates.delete-certificate"
match = "*clean3"
error = "permanent"
code = "resource-in-use"
[[simulator.faults]]
op = "maps.add-referrer"
match = "*.mapsfail.test/*"
error = "permanent"
code = "key-suspended"
"#;
    let w = World::start(seed, faults);
    let outcome_schema = schema("domain-onboarding-outcome.schema.json");
    let cases: [(Value, &str, &str); 7] = [
        (
            json!({"domain": "unk1.test", "options": {"dryRun": true, "skipReadinessCheck": true}}),
            "/domain/state",
            "unknown",
        ),
        (
            json!({"domain": "unk2.test", "options": {"dryRun": true}}),
            "/certificate/state",
            "unknown",
        ),
        (
            json!({"domain": "unk3.test", "options": {"dryRun": true}}),
            "/distributions/proxy/state",
            "unknown",
        ),
        (
            json!({"domain": "clean1.test"}),
            "/cleanup/state",
            "completed",
        ),
        (
            json!({"domain": "clean2.test"}),
            "/cleanup/state",
            "already-clean",
        ),
        (
            json!({"domain": "clean3.test"}),
            "/cleanup/state",
            "manual-required",
        ),
        (
            json!({"domain": "mapsfail.test"}),
            "/mapsProvider/keys/0/state",
            "failed",
        ),
    ];
    for (input, pointer, want) in cases {
        let id = w.trigger("onboard-domain", input.clone()).await;
        let e = w.settle(&id).await;
        assert_eq!(e["status"], "succeeded", "{input}: {e:#}");
        let o = &e["outcome"];
        assert_valid(&outcome_schema, o);
        assert_eq!(
            o.pointer(pointer).unwrap(),
            want,
            "{input} {pointer}: {o:#}"
        );
    }
}

/// The control answers the transition table gives, over HTTP: a cancel of a run a worker holds
/// is requested (and recorded) until the worker stops it; resume applies only to a paused run
/// or a pending resume; a pending rollback refuses other commands and answers a repeat with
/// itself.
#[tokio::test]
async fn control_answers_follow_the_transition_table() {
    // Every certificate deletion takes 2 s here: a rollback stays pending long enough to ask.
    // `resume.example.com`'s request fails transiently four times (the provider retry's
    // attempts: the run pauses), then takes 2 s: a resumed run stays in flight long enough
    // to ask again.
    let w = World::start(
        seed_main(),
        &format!(
            "{MAIN_FAULTS}\n[[simulator.faults]]\nop = \"certificates.delete-certificate\"\nlatency_ms = 2000\n\
             [[simulator.faults]]\nop = \"certificates.request-certificate\"\nmatch = \"resume.example.com\"\nerror = \"transient\"\ntimes = 4\n\
             [[simulator.faults]]\nop = \"certificates.request-certificate\"\nmatch = \"resume.example.com\"\nlatency_ms = 2000\n"
        ),
    );

    // A paused run's resume is queued; asked again while that resume is pending (queued, or
    // its run in flight), the answer is the same resume, not a second one.
    let paused = w
        .trigger("add-certificate", json!({"domain": "resume.example.com"}))
        .await;
    assert_eq!(w.until(&paused, &["paused"]).await["status"], "paused");
    let (status, first) = w
        .post(&format!("/v1/executions/{paused}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    assert_eq!(first["status"], "retry_queued", "{first}");
    let (status, again) = w
        .post(&format!("/v1/executions/{paused}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{again}");
    assert_eq!(again["status"], "retry_already_queued", "{again}");
    assert_eq!(w.settle(&paused).await["status"], "succeeded");
    let (status, body) = w
        .post(&format!("/v1/executions/{paused}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["reason"], "not_resumable", "{body}");

    // A fresh execution is not paused: resume is refused, not "already queued".
    let quick = w
        .trigger("add-certificate", json!({"domain": "quick.example.com"}))
        .await;
    let (status, body) = w
        .post(&format!("/v1/executions/{quick}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["reason"], "not_resumable", "{body}");
    assert_eq!(w.settle(&quick).await["status"], "succeeded");
    let (status, body) = w
        .post(&format!("/v1/executions/{quick}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["reason"], "not_resumable", "{body}");

    // Canceled while a worker waits on the certificate request (2 s): requested, recorded,
    // then canceled when the run reaches its next host call.
    let slow = w
        .trigger("add-certificate", json!({"domain": "slowcert.example.com"}))
        .await;
    let mut requesting = false;
    for _ in 0..400 {
        let e = w.execution(&slow).await;
        let stages = e["stages"].as_array().cloned().unwrap_or_default();
        if stages
            .iter()
            .any(|s| s["stageName"] == "request" && s["status"] == "running")
        {
            requesting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(requesting, "{:#}", w.execution(&slow).await);
    let (status, body) = w.post(&format!("/v1/executions/{slow}/cancel"), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "cancellation_requested", "{body}");
    assert_eq!(body["execution"]["status"], "running", "{body}");
    assert!(
        body["execution"]["cancellationRequestedAt"].is_string(),
        "{body}"
    );
    let e = w.until(&slow, &["canceled"]).await;
    assert!(e["cancellationRequestedAt"].is_string(), "{e:#}");

    // Its rollback deletes the certificate requested before the cancel (2 s): while it is
    // pending, a repeat answers the same command and a resume is refused.
    let (status, first) = w
        .post(&format!("/v1/executions/{slow}/rollback"), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    let (status, again) = w
        .post(&format!("/v1/executions/{slow}/rollback"), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{again}");
    assert_eq!(again["command"]["commandId"], first["command"]["commandId"]);
    let (status, body) = w.post(&format!("/v1/executions/{slow}/resume"), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["reason"], "command_pending", "{body}");
    assert_eq!(
        w.until(&slow, &["rolled_back"]).await["status"],
        "rolled_back"
    );
}

/// The onboard-domain body is normalized and defaulted as the workflow declares before anything
/// is stored: `inputJson` holds what runs, a blank domain is a 400, and a body that normalizes to
/// the same input replays the execution its key created.
#[tokio::test]
async fn the_onboard_domain_body_is_normalized_before_it_is_stored() {
    let w = World::start(seed_main(), MAIN_FAULTS);
    let post = |key: &'static str, body: Value| {
        w.c.post(format!("{}/v1/workflows/onboard-domain", w.server.base))
            .bearer_auth(&w.key)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
    };
    let r = post(
        "normalized",
        json!({"domain": "  Fresh.TEST ", "ticketId": " ops-1 ", "options": {"dryRun": true}}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let created: Value = r.json().await.unwrap();
    let id = created["executionId"].as_str().unwrap().to_owned();
    let e = w.execution(&id).await;
    assert_eq!(
        e["inputJson"],
        json!({"domain": "fresh.test", "ticketId": "OPS-1", "isCms": true,
               "recentCertOverrideDomain": null,
               "options": {"dryRun": true, "skipReadinessCheck": false}}),
        "{e:#}"
    );
    let r = post(
        "normalized",
        json!({"domain": "fresh.test", "ticketId": "OPS-1", "isCms": true, "options": {"dryRun": true}}),
    )
    .await
    .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "the same input after normalization replays"
    );
    assert_eq!(r.json::<Value>().await.unwrap()["executionId"], id.as_str());
    for blank in [
        json!({"domain": "   "}),
        json!({"domain": "ok.test", "ticketId": "  "}),
        json!({"domain": "exa mple.test"}),
        json!({"domain": "-bad.test"}),
        json!({"domain": "example..test"}),
        json!({"domain": "https://example.test"}),
        json!({"domain": "localhost"}),
        json!({"domain": "ok.test", "recentCertOverrideDomain": "not a domain"}),
    ] {
        let r = post("blank", blank.clone()).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{blank}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "validation_error", "{body}");
        assert!(!body["issues"].as_array().unwrap().is_empty(), "{body}");
    }
}
