//! The AWS adapters against moto's server, started by the tests on 127.0.0.1 (`just setup`
//! installs it in `target/venv-moto`). What moto holds is read with boto3, the AWS SDK for
//! Python (`tests/clients/aws_state.py`), never through Capstan's own view.
//!
//! Route 53: a workflow's record changes through `capstan serve` reach the hosted zone and its
//! rollback leaves the zone as it was; add-subdomain plans alias records from the apex's own
//! (a CloudFront target), waits for approval, applies them and rolls them back; the adapter itself answers every `dns` operation with
//! alias records, a replayed token and a zone created twice under one token.
//!
//! ACM: add-certificate through `capstan serve` with its validation records on Route 53, issued
//! and rolled back, and again with the node SIGKILLed under it (one certificate per domain); the adapter itself answers every `certificates` operation, replays a token
//! from its ledger or from ACM's idempotency token, and refuses to delete a certificate in use.
//!
//! Route 53 Domains: the adapter checks and registers, once per token (from its ledger, or from
//! the domain the account holds), answers a domain registered by hand as held, and passes the
//! registry's refusals on as permanent.
//!
//! CloudFront: the adapter answers every `cdn` operation, repeats a creation under its
//! CallerReference on another node, keeps what an update does not change, and deletes by
//! disabling first. Lambda: the adapter answers every `functions` operation; update-function-version
//! through `capstan serve` fails on an unhealthy probe and its rollback restores the function.
//!
//! onboard-domain with every capability real: these four services in moto, the maps keys and
//! the ticket on the contract servers of `capstan_e2e::contract`; its rollback restores them all,
//! and SIGKILLs under three onboardings (and under three Lambda updates) duplicate nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_core::Capability;
use capstan_e2e::contract::{GoogleApiKeys, Jira};
use capstan_e2e::realservers::Moto;
use capstan_e2e::{Server, adapter, assert_valid, home_with, key_for, schema, until_status};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const ZONE: &str = "capstan-aws.test";

/// moto's test key: its secret in a file under `dir` (as an operator's would be).
fn secret_file(dir: &Path) -> PathBuf {
    let secret = dir.join("aws-secret");
    std::fs::write(&secret, "testing\n").unwrap();
    secret
}

/// A `[providers.<capability>]` table of `kind` on `moto`, with its test key and `extra` lines.
fn aws_table(moto: &Moto, dir: &Path, capability: &str, kind: &str, extra: &str) -> String {
    format!(
        "[providers.{capability}]\nkind = \"{kind}\"\nendpoint_url = \"{}\"\naccess_key_id = \"testing\"\nsecret_access_key_file = \"{}\"\n{extra}",
        moto.endpoint(),
        secret_file(dir).display()
    )
}

/// `[providers.dns]` on Route 53 in `moto`, limited to [`ZONE`].
fn route53_table(moto: &Moto, dir: &Path) -> String {
    aws_table(
        moto,
        dir,
        "dns",
        "route53",
        &format!("zones = [\"{ZONE}\"]\n"),
    )
}

/// `capstan serve` with `components` and `config`, and an `ops` key with `permissions`.
struct Node {
    server: Server,
    key: String,
    c: Client,
    _home: tempfile::TempDir,
}

impl Node {
    fn start(components: &[&str], permissions: &[&str], config: &str) -> Self {
        let home = home_with(components, config);
        let key = key_for(home.path(), "ops", permissions);
        Self {
            server: Server::start(home.path()),
            key,
            c: Client::new(),
            _home: home,
        }
    }

    /// Triggers `workflow` with `body` and waits until the execution stops moving.
    async fn run(&self, workflow: &str, idempotency_key: &str, body: Value) -> Value {
        let r = self
            .c
            .post(format!("{}/v1/workflows/{workflow}", self.server.base))
            .bearer_auth(&self.key)
            .header("Idempotency-Key", idempotency_key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        let id = r.json::<Value>().await.unwrap()["executionId"]
            .as_str()
            .unwrap()
            .to_owned();
        self.until(&id, &["succeeded", "failed", "paused"]).await
    }

    /// Rolls the execution back and waits until it is rolled back (or, for one that had not
    /// failed, until the rollback failed).
    async fn roll_back(&self, done: &Value) -> Value {
        let id = done["executionId"].as_str().unwrap();
        let r = self
            .c
            .post(format!("{}/v1/executions/{id}/rollback", self.server.base))
            .bearer_auth(&self.key)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
        if done["status"] == "failed" {
            self.until(id, &["rolled_back"]).await
        } else {
            self.until(id, &["rolled_back", "failed"]).await
        }
    }

    async fn until(&self, id: &str, statuses: &[&str]) -> Value {
        until_status(&self.c, &self.server.base, &self.key, id, statuses).await
    }
}

#[tokio::test]
async fn a_workflow_changes_route53_records_and_its_rollback_restores_them() {
    let moto = Moto::start();
    let zone = moto.boto(&["create-zone", ZONE])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let step1 = format!("step-1.{ZONE}");
    moto.boto(&["upsert", &zone, &step1, "TXT", "\"before\""]);
    let before = moto.boto(&["records", &zone]);

    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        &["guest-fixtures/fixture-steps.wasm"],
        &["workflows:fixture-steps", "admin:read"],
        &format!(
            "workers = 2\nlease_ms = 3000\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[provider_retry.dns]\ninitial_ms = 50\nmax_ms = 100\nmax_attempts = 3\n{}",
            route53_table(&moto, dir.path())
        ),
    );

    // The node reports the adapter and whether Route 53 (moto) answers.
    let ready: Value = node
        .c
        .get(format!("{}/readyz", node.server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let dns = ready["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p.to_string().contains("route53"))
        .cloned();
    assert!(dns.is_some(), "{ready:#}");

    let done = node
        .run(
            "fixture-steps",
            "r53-1",
            json!({"zone": zone, "domain": ZONE, "stages": 2}),
        )
        .await;
    assert_eq!(
        done["status"],
        "succeeded",
        "{done:#}\nmoto log:\n{}",
        moto.log()
    );

    // Both records are in the hosted zone as the workflow wrote them.
    let after = moto.boto(&["records", &zone]);
    let txt = |records: &Value, name: &str| -> Vec<Value> {
        records
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["name"] == name && r["type"] == "TXT")
            .map(|r| r["values"].clone())
            .collect()
    };
    assert_eq!(
        txt(&after, &step1),
        [json!(["\"\\\"step-1\\\"\""])],
        "{after}"
    );
    assert_eq!(txt(&after, &format!("step-2.{ZONE}")).len(), 1, "{after}");

    // Rollback: step-1 holds what it held before, step-2 is gone — the zone as it was.
    let rolled = node.roll_back(&done).await;
    assert_eq!(rolled["status"], "rolled_back", "{rolled:#}");
    assert_eq!(moto.boto(&["records", &zone]), before);
}

/// The adapter directly, every `dns` operation against moto.
#[tokio::test]
async fn the_route53_adapter_answers_every_dns_operation() {
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let dns = adapter(
        Capability::Dns,
        json!({
            "kind": "route53", "endpoint_url": moto.endpoint(), "zones": [ZONE],
            "access_key_id": "testing", "secret_access_key_file": secret_file(dir.path()),
        }),
        dir.path(),
    )
    .await;
    assert_eq!(dns.kind(), "route53");

    // A zone created twice under one token is one zone.
    let created = dns
        .call("dns.create-zone", &json!({"domain": ZONE}), "create-1")
        .await
        .unwrap();
    let again = dns
        .call("dns.create-zone", &json!({"domain": ZONE}), "create-1")
        .await
        .unwrap();
    assert_eq!(created, again);
    let zones = moto.boto(&["zones"]);
    assert_eq!(zones.as_array().unwrap().len(), 1, "{zones}");
    let zone = created["id"].as_str().unwrap().to_owned();
    assert_eq!(
        dns.call(
            "dns.find-zone",
            &json!({"domain": format!("www.{ZONE}")}),
            ""
        )
        .await
        .unwrap(),
        json!({"id": zone, "name": ZONE})
    );
    assert_eq!(
        dns.call("dns.find-zone", &json!({"domain": "elsewhere.test"}), "")
            .await
            .unwrap(),
        Value::Null
    );
    dns.call(
        "dns.create-zone",
        &json!({"domain": "other.test"}),
        "create-2",
    )
    .await
    .expect_err("a zone outside `zones` is refused");

    // An alias to a CloudFront distribution and a plain record in one batch.
    let alias = json!({"name": format!("www.{ZONE}"), "type_": "A", "ttl": null, "values": [],
        "alias_target": {"dns_name": "d111111abcdef8.cloudfront.net", "hosted_zone_id": "Z2FDTNDATAQYW2", "evaluate_target_health": false}});
    let plain = json!({"name": format!("api.{ZONE}"), "type_": "Cname", "ttl": 120,
        "values": ["origin.example.net"], "alias_target": null});
    let request = json!({"zone_id": zone, "changes": [{"Upsert": alias}, {"Upsert": plain}]});
    let receipt = dns
        .call("dns.change-records", &request, "change-1")
        .await
        .unwrap();
    assert_eq!(receipt["prior"], json!([]), "{receipt}");
    // The same token again: the same receipt, no second change.
    assert_eq!(
        dns.call("dns.change-records", &request, "change-1")
            .await
            .unwrap(),
        receipt
    );
    let token_reused = dns
        .call(
            "dns.change-records",
            &json!({"zone_id": zone, "changes": [{"Upsert": plain}]}),
            "change-1",
        )
        .await
        .unwrap_err();
    assert_eq!(token_reused.code, "idempotency-token-reused");
    let status = dns
        .call(
            "dns.get-change",
            &json!({"change_id": receipt["change_id"]}),
            "",
        )
        .await
        .unwrap();
    assert!(status == "Insync" || status == "Pending", "{status}");
    let listed = dns
        .call(
            "dns.list-records",
            &json!({"zone_id": zone, "name": format!("WWW.{ZONE}.")}),
            "",
        )
        .await
        .unwrap();
    assert_eq!(listed, json!([alias]), "read back as written");

    // Changing the plain record records what it replaced; deleting it takes the set as it
    // stands.
    let changed = json!({"name": format!("api.{ZONE}"), "type_": "Cname", "ttl": 60,
        "values": ["other.example.net"], "alias_target": null});
    let receipt = dns
        .call(
            "dns.change-records",
            &json!({"zone_id": zone, "changes": [{"Upsert": changed}]}),
            "change-2",
        )
        .await
        .unwrap();
    assert_eq!(receipt["prior"], json!([plain]), "{receipt}");
    dns.call(
        "dns.change-records",
        &json!({"zone_id": zone, "changes": [{"Delete": plain}, {"Delete": alias}]}),
        "change-3",
    )
    .await
    .unwrap();
    let records = moto.boto(&["records", &zone]);
    assert_eq!(records, json!([]), "{records}");

    // Bad batches are refused before Route 53 hears of them; unknown ids are `not-found`.
    let refused = dns
        .call(
            "dns.change-records",
            &json!({"zone_id": zone, "changes": [{"Delete": plain}]}),
            "change-4",
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code, "invalid-change-batch", "{refused:?}");
    let missing = dns
        .call(
            "dns.list-records",
            &json!({"zone_id": "ZNOPE", "name": ZONE}),
            "",
        )
        .await
        .unwrap_err();
    assert_eq!(missing.code, "not-found");

    assert_eq!(
        dns.call("dns.delete-zone", &json!({"zone_id": zone}), "delete-1")
            .await
            .unwrap(),
        json!({"id": zone, "name": ZONE})
    );
    assert_eq!(moto.boto(&["zones"]), json!([]));
    dns.reachable()
        .await
        .expect_err("the configured zone is gone");
}

/// add-certificate on ACM with its validation records on Route 53, both in moto: requested,
/// validated through DNS, issued; its rollback deletes the certificate and the records.
#[tokio::test]
async fn add_certificate_on_acm_with_route53_validation_and_its_rollback() {
    let moto = Moto::start();
    let zone = moto.boto(&["create-zone", ZONE])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let records_before = moto.boto(&["records", &zone]);
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        &["workflows/add-certificate.wasm"],
        &["workflows:add-certificate", "admin:read"],
        &format!(
            "workers = 2\nlease_ms = 3000\n[provider_retry.certificates]\ninitial_ms = 100\nmax_ms = 500\nmax_attempts = 10\n{}{}",
            route53_table(&moto, dir.path()),
            aws_table(&moto, dir.path(), "certificates", "acm", "")
        ),
    );
    let done = node
        .run(
            "add-certificate",
            "acm-1",
            json!({"domain": ZONE, "subjectAlternativeNames": [format!("www.{ZONE}")]}),
        )
        .await;
    assert_eq!(
        done["status"],
        "succeeded",
        "{done:#}\nmoto log:\n{}",
        moto.log()
    );
    // The certificate the `request` stage got (no issued one was there to adopt).
    let stage = |name: &str| {
        done["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stageName"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no stage {name}: {done:#}"))
    };
    assert_eq!(stage("prepare")["outputJson"]["existing"], Value::Null);
    let arn = stage("request")["outputJson"]["arn"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(arn.starts_with("arn:aws:acm:us-east-1:"), "{arn}");
    assert_eq!(
        stage("finalize")["outputJson"]["status"],
        "Issued",
        "{done:#}"
    );

    // ACM holds one certificate, issued, for both names, carrying the engine's token.
    let certs = moto.boto(&["certificates"]);
    let certs = certs.as_array().unwrap();
    assert_eq!(certs.len(), 1, "{certs:?}");
    assert_eq!(certs[0]["arn"], arn.as_str());
    assert_eq!(certs[0]["status"], "ISSUED");
    assert_eq!(
        certs[0]["names"],
        json!([ZONE, format!("www.{ZONE}")]),
        "{certs:?}"
    );
    assert!(certs[0]["tags"]["capstan:token"].is_string(), "{certs:?}");
    // Its validation records are CNAMEs in the hosted zone.
    let records = moto.boto(&["records", &zone]);
    let cnames: Vec<&Value> = records
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["type"] == "CNAME")
        .collect();
    assert!(!cnames.is_empty(), "{records}");
    assert!(
        cnames.iter().all(|r| r["values"][0]
            .as_str()
            .unwrap()
            .contains("acm-validations.aws")),
        "{records}"
    );

    // Rollback: the records and the certificate are gone.
    let rolled = node.roll_back(&done).await;
    assert_eq!(rolled["status"], "rolled_back", "{rolled:#}");
    assert_eq!(moto.boto(&["records", &zone]), records_before);
    assert_eq!(moto.boto(&["certificates"]), json!([]));
}

/// The ACM adapter directly, every `certificates` operation against moto.
#[tokio::test]
async fn the_acm_adapter_answers_every_certificates_operation() {
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let settings = json!({
        "kind": "acm", "endpoint_url": moto.endpoint(),
        "access_key_id": "testing", "secret_access_key_file": secret_file(dir.path()),
    });
    let certs = adapter(
        Capability::Certificates,
        settings.clone(),
        &dir.path().join("a"),
    )
    .await;
    assert_eq!(certs.kind(), "acm");
    certs.reachable().await.expect("moto answers");

    // A request: pending validation, with one CNAME per name.
    let request = json!({"domain": "Shop.Example.ORG", "subject_alternative_names": ["www.shop.example.org"]});
    let first = certs
        .call("certificates.request-certificate", &request, "run-1:0:4")
        .await
        .unwrap();
    let arn = first["arn"].as_str().unwrap().to_owned();
    assert_eq!(first["domain"], "shop.example.org");
    assert_eq!(first["status"], "PendingValidation", "{first}");
    let validation = first["validation_records"].as_array().unwrap();
    assert_eq!(validation.len(), 2, "{first}");
    assert!(validation.iter().all(|r| r["type_"] == "Cname"), "{first}");

    // The same token again is the same certificate, from the ledger or from ACM: a node whose
    // ledger lost the answer (another database) sends ACM the same idempotency token.
    let again = certs
        .call("certificates.request-certificate", &request, "run-1:0:4")
        .await
        .unwrap();
    assert_eq!(again, first);
    let elsewhere = adapter(Capability::Certificates, settings, &dir.path().join("b")).await;
    let replayed = elsewhere
        .call("certificates.request-certificate", &request, "run-1:0:4")
        .await
        .unwrap();
    assert_eq!(replayed["arn"], arn.as_str());
    assert_eq!(moto.boto(&["certificates"]).as_array().unwrap().len(), 1);
    // ... and the token bound to that request refuses another.
    let reused = certs
        .call(
            "certificates.request-certificate",
            &json!({"domain": "other.example.org", "subject_alternative_names": []}),
            "run-1:0:4",
        )
        .await
        .unwrap_err();
    assert!(reused.is_token_reused(), "{reused:?}");

    // moto issues a second after the request.
    let mut described = Value::Null;
    for _ in 0..100 {
        described = certs
            .call(
                "certificates.describe-certificate",
                &json!({"arn": arn}),
                "",
            )
            .await
            .unwrap();
        if described["status"] == "Issued" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(described["status"], "Issued", "{described}");
    assert!(described["issued_at"].is_u64(), "{described}");

    // Found by either of its names, and by a name its wildcard-free names do not cover: none.
    for (domain, count) in [
        ("shop.example.org", 1),
        ("www.shop.example.org", 1),
        ("api.shop.example.org", 0),
    ] {
        let found = certs
            .call(
                "certificates.find-certificates",
                &json!({"domain": domain}),
                "",
            )
            .await
            .unwrap();
        assert_eq!(found.as_array().unwrap().len(), count, "{domain}: {found}");
    }

    // In use by a load balancer: not deleted.
    moto.boto(&["load-balancer", "shop", &arn]);
    let refused = certs
        .call(
            "certificates.delete-certificate",
            &json!({"arn": arn}),
            "run-1:1:1",
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code, "certificate-in-use", "{refused:?}");
    assert!(!refused.is_transient());
    assert_eq!(moto.boto(&["certificates"]).as_array().unwrap().len(), 1);

    // Another, not in use: deleted, and the repeat answers what was deleted.
    let spare = certs
        .call(
            "certificates.request-certificate",
            &json!({"domain": "spare.example.org", "subject_alternative_names": []}),
            "run-2:0:1",
        )
        .await
        .unwrap();
    let spare_arn = spare["arn"].as_str().unwrap();
    let deleted = certs
        .call(
            "certificates.delete-certificate",
            &json!({"arn": spare_arn}),
            "run-2:1:1",
        )
        .await
        .unwrap();
    assert_eq!(deleted["arn"], spare_arn);
    let repeat = certs
        .call(
            "certificates.delete-certificate",
            &json!({"arn": spare_arn}),
            "run-2:1:1",
        )
        .await
        .unwrap();
    assert_eq!(repeat, deleted);
    let left = moto.boto(&["certificates"]);
    assert_eq!(left.as_array().unwrap().len(), 1, "{left}");
    assert_eq!(left[0]["arn"], arn.as_str());
    let missing = certs
        .call(
            "certificates.describe-certificate",
            &json!({"arn": spare_arn}),
            "",
        )
        .await
        .unwrap_err();
    assert_eq!(missing.code, "not-found", "{missing:?}");
}

/// `[providers.registrar]` on Route 53 Domains in `moto`, with a contact.
fn route53domains_settings(moto: &Moto, dir: &Path) -> Value {
    json!({
        "kind": "route53domains", "endpoint_url": moto.endpoint(),
        "access_key_id": "testing", "secret_access_key_file": secret_file(dir),
        "contact": {
            "first_name": "Ada", "last_name": "Lovelace", "contact_type": "COMPANY",
            "organization_name": "Capstan Test Ltd", "address_line_1": "1 Analytical Way",
            "city": "London", "country_code": "GB", "zip_code": "N1 1AA",
            "phone_number": "+44.2071234567", "email": "hostmaster@example.org"
        }
    })
}

/// Delegation through the Route 53 Domains adapter: the domain read, its name servers changed
/// once per token, the receipt keeping those replaced. moto registers without name servers
/// (AWS delegates to the new hosted zone) and refuses a second name server change of a domain
/// for good (AWS only while one is under way), so delegating back — a rollback — is tested on
/// the simulated cloud and by the compensation rule's own test.
#[tokio::test]
async fn the_route53domains_adapter_delegates_a_domain_once_per_token() {
    const DOMAIN: &str = "capstan-delegated.com";
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let registrar = adapter(
        Capability::Registrar,
        route53domains_settings(&moto, dir.path()),
        dir.path(),
    )
    .await;
    moto.boto(&["register-domain", DOMAIN, "2"]);
    let held = registrar
        .call("registrar.get-domain", &json!({"name": DOMAIN}), "")
        .await
        .unwrap();
    assert_eq!(held["name"], DOMAIN);
    assert!(held["expires_at"].as_u64().unwrap() > 0, "{held}");
    assert_eq!(held["name_servers"], moto.boto(&["name-servers", DOMAIN]));
    assert_eq!(
        registrar
            .call("registrar.get-domain", &json!({"name": "not-ours.com"}), "")
            .await
            .unwrap(),
        Value::Null
    );

    let delegate =
        json!({"name": DOMAIN, "name_servers": ["NS1.Example-DNS.net.", "ns2.example-dns.net"]});
    let changed = registrar
        .call("registrar.set-name-servers", &delegate, "run-1:0:1")
        .await
        .unwrap();
    assert_eq!(
        changed,
        json!({"name": DOMAIN, "before": held["name_servers"], "after": ["ns1.example-dns.net", "ns2.example-dns.net"]})
    );
    assert_eq!(
        moto.boto(&["name-servers", DOMAIN]),
        json!(["ns1.example-dns.net", "ns2.example-dns.net"])
    );
    let operations = |moto: &Moto| {
        moto.boto(&["operations"])
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["type"] == "UPDATE_NAMESERVER")
            .count()
    };
    assert_eq!(operations(&moto), 1);
    // A repeat answers the same receipt and sends nothing.
    assert_eq!(
        registrar
            .call("registrar.set-name-servers", &delegate, "run-1:0:1")
            .await
            .unwrap(),
        changed
    );
    assert_eq!(operations(&moto), 1);
    // Delegated so already: nothing is sent, the receipt says nothing changed.
    let same = registrar
        .call("registrar.set-name-servers", &delegate, "run-2:0:1")
        .await
        .unwrap();
    assert_eq!(same["before"], same["after"]);
    assert_eq!(operations(&moto), 1);
    // Refusals before anything is sent: a domain of another account, a single server.
    let foreign = registrar
        .call(
            "registrar.set-name-servers",
            &json!({"name": "not-ours.com", "name_servers": ["ns1.a.net", "ns2.a.net"]}),
            "run-1:0:2",
        )
        .await
        .unwrap_err();
    assert_eq!(
        (foreign.code.as_str(), foreign.is_transient()),
        ("not-found", false)
    );
    let single = registrar
        .call(
            "registrar.set-name-servers",
            &json!({"name": DOMAIN, "name_servers": ["ns1.a.net"]}),
            "run-1:0:3",
        )
        .await
        .unwrap_err();
    assert_eq!(single.code, "invalid-request");
}

#[tokio::test]
async fn the_route53domains_adapter_checks_and_registers_once_per_token() {
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let settings = route53domains_settings(&moto, dir.path());
    let registrar = adapter(
        Capability::Registrar,
        settings.clone(),
        &dir.path().join("a"),
    )
    .await;
    assert_eq!(registrar.kind(), "route53domains");
    registrar.reachable().await.expect("moto answers");

    // Registered by hand (boto3, outside the adapter's ledger) in the account: the adapter sees
    // it held and answers that registration instead of registering again.
    let other = moto.boto(&["register-domain", "held-already.com", "3"]);
    let held = registrar
        .call(
            "registrar.check-domain",
            &json!({"name": "Held-Already.COM."}),
            "",
        )
        .await
        .unwrap();
    assert_eq!(
        held,
        json!({"name": "held-already.com", "registered": true, "owned": true, "available": false})
    );
    let adopted = registrar
        .call(
            "registrar.register-domain",
            &json!({"name": "held-already.com", "years": 2}),
            "run-0:0:1",
        )
        .await
        .unwrap();
    assert_eq!(
        adopted["registration_id"], other["operationId"],
        "{adopted}"
    );
    let year_ms = 365 * 86_400_000;
    let now_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let expires = adopted["expires_at"].as_u64().unwrap();
    assert!(
        expires.abs_diff(now_ms + 3 * year_ms) < 86_400_000,
        "{adopted}"
    );

    // A new registration: one operation at the registry, its expiry two years out.
    let request = json!({"name": "Capstan-New.com", "years": 2});
    let registered = registrar
        .call("registrar.register-domain", &request, "run-1:0:2")
        .await
        .unwrap();
    assert_eq!(registered["name"], "capstan-new.com");
    let expires = registered["expires_at"].as_u64().unwrap();
    assert!(
        expires.abs_diff(now_ms + 2 * year_ms) < 86_400_000,
        "{registered}"
    );
    let operations = |moto: &Moto| {
        moto.boto(&["operations"])
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["domain"] == "capstan-new.com" && o["type"] == "REGISTER_DOMAIN")
            .count()
    };
    assert_eq!(operations(&moto), 1);

    // The same token again: the same answer, from the ledger; on a node whose ledger lost it
    // (another database), from the domain the account holds — no second registration.
    let again = registrar
        .call("registrar.register-domain", &request, "run-1:0:2")
        .await
        .unwrap();
    assert_eq!(again, registered);
    let elsewhere = adapter(
        Capability::Registrar,
        settings.clone(),
        &dir.path().join("b"),
    )
    .await;
    let replayed = elsewhere
        .call("registrar.register-domain", &request, "run-1:0:2")
        .await
        .unwrap();
    assert_eq!(replayed["registration_id"], registered["registration_id"]);
    assert_eq!(operations(&moto), 1);
    let domains = moto.boto(&["domains"]);
    assert_eq!(
        domains
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["name"] == "capstan-new.com")
            .count(),
        1,
        "{domains}"
    );
    // ... and the token bound to that registration refuses another.
    let reused = registrar
        .call(
            "registrar.register-domain",
            &json!({"name": "another.com", "years": 2}),
            "run-1:0:2",
        )
        .await
        .unwrap_err();
    assert!(reused.is_token_reused(), "{reused:?}");

    // What the registry refuses is permanent, with its reason, and leaves nothing behind:
    // moto counts one year from now as less than a year out.
    let refused = registrar
        .call(
            "registrar.register-domain",
            &json!({"name": "one-year.com", "years": 1}),
            "run-2:0:1",
        )
        .await
        .unwrap_err();
    assert!(!refused.is_transient(), "{refused:?}");
    assert_eq!(refused.code, "invalid-request", "{refused:?}");
    assert!(refused.message.contains("ExpirationDate"), "{refused:?}");
    assert!(!moto.boto(&["domains"]).to_string().contains("one-year.com"));
    // Malformed names and terms never reach it.
    for (request, code) in [
        (
            json!({"name": "not a domain", "years": 2}),
            "invalid-domain",
        ),
        (json!({"name": "fine.com", "years": 11}), "invalid-request"),
    ] {
        let e = registrar
            .call("registrar.register-domain", &request, "run-3:0:1")
            .await
            .unwrap_err();
        assert_eq!(e.code, code, "{request}: {e:?}");
    }

    // moto does not implement CheckDomainAvailability (it answers 500): for a name the
    // account does not hold the check is transient, asked again by the engine's retry.
    let unknown = registrar
        .call(
            "registrar.check-domain",
            &json!({"name": "nobody-has-this.com"}),
            "",
        )
        .await
        .unwrap_err();
    assert!(unknown.is_transient(), "{unknown:?}");
}

#[tokio::test]
async fn the_cloudfront_adapter_answers_every_cdn_operation() {
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let settings = json!({
        "kind": "cloudfront", "endpoint_url": moto.endpoint(),
        "access_key_id": "testing", "secret_access_key_file": secret_file(dir.path()),
    });
    let cdn = adapter(Capability::Cdn, settings.clone(), &dir.path().join("a")).await;
    assert_eq!(cdn.kind(), "cloudfront");
    cdn.reachable().await.expect("moto answers");
    let cert =
        "arn:aws:acm:us-east-1:123456789012:certificate/11111111-2222-3333-4444-555555555555";

    // Created under the token's CallerReference, with the settings' defaults.
    let request = json!({"spec": {"origin": "Origin.Example.ORG", "aliases": ["Shop.Example.org"],
        "certificate_arn": cert, "comment": "shop"}});
    let created = cdn
        .call("cdn.create-distribution", &request, "run-1:0:3")
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["hosted_zone_id"], "Z2FDTNDATAQYW2");
    assert!(
        created["domain_name"]
            .as_str()
            .unwrap()
            .ends_with(".cloudfront.net"),
        "{created}"
    );
    assert_eq!(
        created["spec"],
        json!({"origin": "origin.example.org", "aliases": ["shop.example.org"],
            "certificate_arn": cert, "comment": "shop"})
    );
    let held = moto.boto(&["distributions"]);
    assert_eq!(held.as_array().unwrap().len(), 1, "{held}");
    assert_eq!(held[0]["callerReference"], "run-1:0:3");
    assert_eq!(held[0]["priceClass"], "PriceClass_100");
    assert_eq!(
        held[0]["cachePolicyId"],
        "658327ea-f89d-4fab-a63d-7e88639e58f6"
    );
    assert_eq!(held[0]["certificate"], cert);

    // The same token: the same distribution, from the ledger, or on a node whose ledger lost
    // it, from the distribution CloudFront holds under that CallerReference.
    let again = cdn
        .call("cdn.create-distribution", &request, "run-1:0:3")
        .await
        .unwrap();
    assert_eq!(again, created);
    let elsewhere = adapter(Capability::Cdn, settings, &dir.path().join("b")).await;
    let replayed = elsewhere
        .call("cdn.create-distribution", &request, "run-1:0:3")
        .await
        .unwrap();
    assert_eq!(replayed["id"], id.as_str());
    assert_eq!(moto.boto(&["distributions"]).as_array().unwrap().len(), 1);

    // Without aliases, the other node meets CloudFront's refusal of a second CallerReference
    // and answers the distribution made under it.
    let bare = json!({"spec": {"origin": "static.example.org", "aliases": [],
        "certificate_arn": null, "comment": "no aliases"}});
    let plain = cdn
        .call("cdn.create-distribution", &bare, "run-9:0:1")
        .await
        .unwrap();
    let plain_again = elsewhere
        .call("cdn.create-distribution", &bare, "run-9:0:1")
        .await
        .unwrap();
    assert_eq!(plain_again["id"], plain["id"]);
    assert_eq!(moto.boto(&["distributions"]).as_array().unwrap().len(), 2);
    let plain_id = plain["id"].as_str().unwrap();
    for _ in 0..20 {
        if cdn
            .call(
                "cdn.delete-distribution",
                &json!({"id": plain_id}),
                "run-9:1:1",
            )
            .await
            .is_ok()
        {
            break;
        }
    }
    assert_eq!(moto.boto(&["distributions"]).as_array().unwrap().len(), 1);

    // Its alias is its own: another distribution cannot take it.
    let taken = cdn
        .call("cdn.create-distribution", &request, "run-2:0:1")
        .await
        .unwrap_err();
    assert_eq!(taken.code, "alias-in-use", "{taken:?}");
    assert!(!taken.is_transient());
    assert_eq!(moto.boto(&["distributions"]).as_array().unwrap().len(), 1);

    // Deployed as CloudFront reports it; found by its alias.
    let mut status = Value::Null;
    for _ in 0..20 {
        let got = cdn
            .call("cdn.get-distribution", &json!({"id": id}), "")
            .await
            .unwrap();
        status = got["status"].clone();
        if status == "Deployed" {
            break;
        }
    }
    assert_eq!(status, "Deployed");
    let found = cdn
        .call(
            "cdn.find-distribution-by-alias",
            &json!({"alias": "SHOP.example.org."}),
            "",
        )
        .await
        .unwrap();
    assert_eq!(found["id"], id.as_str());
    let none = cdn
        .call(
            "cdn.find-distribution-by-alias",
            &json!({"alias": "other.example.org"}),
            "",
        )
        .await
        .unwrap();
    assert_eq!(none, Value::Null);

    // An update changes the spec and keeps what else the configuration holds; its answer says
    // what was before, again on a repeat.
    let update = json!({"id": id, "spec": {"origin": "origin-v2.example.org",
        "aliases": ["shop.example.org", "www.shop.example.org"], "certificate_arn": cert,
        "comment": "shop v2"}});
    let changed = cdn
        .call("cdn.update-distribution", &update, "run-1:1:1")
        .await
        .unwrap();
    assert_eq!(changed["before"]["spec"]["origin"], "origin.example.org");
    assert_eq!(changed["after"]["spec"]["origin"], "origin-v2.example.org");
    let held = moto.boto(&["distributions"]);
    assert_eq!(held[0]["origin"], "origin-v2.example.org");
    assert_eq!(
        held[0]["aliases"],
        json!(["shop.example.org", "www.shop.example.org"])
    );
    assert_eq!(held[0]["comment"], "shop v2");
    assert_eq!(held[0]["priceClass"], "PriceClass_100", "kept");
    assert_eq!(
        held[0]["cachePolicyId"], "658327ea-f89d-4fab-a63d-7e88639e58f6",
        "kept"
    );
    assert_eq!(held[0]["callerReference"], "run-1:0:3", "kept");
    let repeated = cdn
        .call("cdn.update-distribution", &update, "run-1:1:1")
        .await
        .unwrap();
    assert_eq!(repeated, changed);

    // Deleting: disabled first, deleted once that is deployed; the answer is the distribution
    // as it was, again on a repeat.
    let first = cdn
        .call("cdn.delete-distribution", &json!({"id": id}), "run-1:2:1")
        .await
        .unwrap_err();
    assert_eq!(first.code, "distribution-disabling", "{first:?}");
    assert!(first.is_transient());
    assert_eq!(moto.boto(&["distributions"])[0]["enabled"], false);
    let mut deleted = Err(first);
    for _ in 0..20 {
        deleted = cdn
            .call("cdn.delete-distribution", &json!({"id": id}), "run-1:2:1")
            .await;
        if deleted.is_ok() {
            break;
        }
    }
    let deleted = deleted.unwrap();
    assert_eq!(deleted["spec"]["comment"], "shop v2");
    assert_eq!(moto.boto(&["distributions"]), json!([]));
    let repeat = cdn
        .call("cdn.delete-distribution", &json!({"id": id}), "run-1:2:1")
        .await
        .unwrap();
    assert_eq!(repeat, deleted);
    let gone = cdn
        .call("cdn.get-distribution", &json!({"id": id}), "")
        .await
        .unwrap_err();
    assert_eq!(gone.code, "not-found", "{gone:?}");
}

#[tokio::test]
async fn the_lambda_adapter_answers_every_functions_operation() {
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let settings = json!({
        "kind": "lambda", "endpoint_url": moto.endpoint(),
        "access_key_id": "testing", "secret_access_key_file": secret_file(dir.path()),
    });
    let functions = adapter(
        Capability::Functions,
        settings.clone(),
        &dir.path().join("a"),
    )
    .await;
    assert_eq!(functions.kind(), "lambda");
    functions.reachable().await.expect("moto answers");
    let state = |moto: &Moto| moto.boto(&["lambda", "checkout"]);

    // Version 1 live behind `live`, with a canary share for nothing yet; new code on $LATEST.
    moto.boto(&["function", "checkout", "def main(e, c): return {'v': 1}"]);
    assert_eq!(moto.boto(&["publish", "checkout"])["version"], "1");
    moto.boto(&["alias", "checkout", "live", "1"]);
    let sha = moto.boto(&["function", "checkout", "def main(e, c): return {'v': 2}"])["hex"]
        .as_str()
        .unwrap()
        .to_owned();

    // Published once: a repeat (a crash before the engine's commit) answers the same version.
    let publish = json!({"function_name": "checkout", "code_sha256": sha});
    let published = functions
        .call("functions.publish-version", &publish, "run-1:0:2")
        .await
        .unwrap();
    assert_eq!(
        published,
        json!({"function_name": "checkout", "version": "2", "code_sha256": sha})
    );
    let again = functions
        .call("functions.publish-version", &publish, "run-1:0:2")
        .await
        .unwrap();
    assert_eq!(again, published);
    assert_eq!(state(&moto)["versions"].as_array().unwrap().len(), 2);

    // The alias moves to version 2 with its canary share ended; the answer says what was before,
    // the canary's weight included, again on a repeat and on a node whose ledger lost it.
    moto.boto(&["alias", "checkout", "live", "1", "2", "0.1"]);
    let shift = json!({"function_name": "checkout", "alias": "live", "version": "2"});
    let shifted = functions
        .call("functions.update-alias", &shift, "run-1:1:1")
        .await
        .unwrap();
    assert_eq!(
        shifted,
        json!({"before": {"function_name": "checkout", "name": "live", "version": "1",
                "routing": [{"version": "2", "weight": 0.1}]},
            "after": {"function_name": "checkout", "name": "live", "version": "2", "routing": []}})
    );
    assert_eq!(
        state(&moto)["aliases"]["live"],
        json!({"version": "2", "weights": {}})
    );
    let repeated = functions
        .call("functions.update-alias", &shift, "run-1:1:1")
        .await
        .unwrap();
    assert_eq!(repeated, shifted);
    let got = functions
        .call(
            "functions.get-alias",
            &json!({"function_name": "checkout", "alias": "live"}),
            "",
        )
        .await
        .unwrap();
    assert_eq!(got["version"], "2");
    // route-alias: the canary back exactly as it was (what a rollback of the shift sends), then
    // refusals of what Lambda cannot route.
    let back = json!({"function_name": "checkout", "alias": "live", "version": "1",
        "routing": [{"version": "2", "weight": 0.1}]});
    let routed = functions
        .call("functions.route-alias", &back, "run-1:9:1")
        .await
        .unwrap();
    assert_eq!(routed["after"], shifted["before"]);
    assert_eq!(
        state(&moto)["aliases"]["live"],
        json!({"version": "1", "weights": {"2": 0.1}})
    );
    for (routing, why) in [
        (json!([{"version": "2", "weight": 1.5}]), "a weight above 1"),
        (
            json!([{"version": "1", "weight": 0.1}]),
            "the alias's own version",
        ),
        (
            json!([{"version": "2", "weight": 0.1}, {"version": "3", "weight": 0.1}]),
            "two other versions",
        ),
    ] {
        let e = functions
            .call(
                "functions.route-alias",
                &json!({"function_name": "checkout", "alias": "live", "version": "1", "routing": routing}),
                "run-1:9:2",
            )
            .await
            .unwrap_err();
        assert_eq!(e.code, "invalid-request", "{why}: {e:?}");
    }
    functions
        .call("functions.update-alias", &shift, "run-1:9:3")
        .await
        .unwrap();
    let missing = functions
        .call(
            "functions.update-alias",
            &json!({"function_name": "checkout", "alias": "live", "version": "9"}),
            "run-1:1:2",
        )
        .await
        .unwrap_err();
    assert_eq!(missing.code, "not-found", "{missing:?}");

    // The probe: healthy unless the function says otherwise.
    let probe = json!({"function_name": "checkout", "alias": "live"});
    moto.boto(&[
        "invoke-answers",
        r#"{"healthy": true}"#,
        r#"{"healthy": false}"#,
    ]);
    let first = functions.call("functions.probe", &probe, "").await.unwrap();
    let second = functions.call("functions.probe", &probe, "").await.unwrap();
    assert_eq!((first, second), (json!(true), json!(false)));

    // A version an alias routes to is not deleted; one that nothing routes to is, and the
    // repeat answers it as it was.
    let in_use = functions
        .call(
            "functions.delete-version",
            &json!({"function_name": "checkout", "version": "2"}),
            "run-2:0:1",
        )
        .await
        .unwrap_err();
    assert_eq!(in_use.code, "resource-in-use", "{in_use:?}");
    assert!(!in_use.is_transient());
    let delete = json!({"function_name": "checkout", "version": "1"});
    let deleted = functions
        .call("functions.delete-version", &delete, "run-2:0:2")
        .await
        .unwrap();
    assert_eq!(deleted["version"], "1");
    let repeat = functions
        .call("functions.delete-version", &delete, "run-2:0:2")
        .await
        .unwrap();
    assert_eq!(repeat, deleted);
    let versions: Vec<Value> = state(&moto)["versions"].as_array().unwrap().clone();
    assert_eq!(versions.len(), 1, "{versions:?}");
    assert_eq!(versions[0]["version"], "2");
}

/// update-function-version through `capstan serve` on Lambda (moto): an unhealthy probe fails
/// the execution, whose rollback points the alias back and deletes the version it published —
/// the function as it was; then a healthy one moves the alias for good.
#[tokio::test]
async fn update_function_version_on_lambda_rolls_back_after_a_failing_probe() {
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    // Version 1 live, version 2 a canary taking a tenth of the traffic.
    moto.boto(&["function", "checkout", "def main(e, c): return {'v': 1}"]);
    moto.boto(&["publish", "checkout"]);
    moto.boto(&["function", "checkout", "def main(e, c): return {'v': 2}"]);
    moto.boto(&["publish", "checkout"]);
    moto.boto(&["alias", "checkout", "live", "1", "2", "0.1"]);
    let sha = moto.boto(&["function", "checkout", "def main(e, c): return {'v': 3}"])["hex"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = moto.boto(&["lambda", "checkout"]);
    assert_eq!(
        before["aliases"]["live"],
        json!({"version": "1", "weights": {"2": 0.1}})
    );

    let node = Node::start(
        &["workflows/update-function-version.wasm"],
        &["workflows:update-function-version", "admin:read"],
        &format!(
            "workers = 2\n[grants]\nupdate-function-version = [\"functions\"]\n{}",
            aws_table(&moto, dir.path(), "functions", "lambda", "")
        ),
    );
    let input = json!({"functionName": "checkout", "codeSha256": sha, "alias": "live"});

    moto.boto(&["invoke-answers", r#"{"healthy": false}"#]);
    let failed = node
        .run("update-function-version", "ufv-1", input.clone())
        .await;
    assert_eq!(failed["status"], "failed", "{failed:#}");
    let during = moto.boto(&["lambda", "checkout"]);
    assert_eq!(
        during["aliases"]["live"],
        json!({"version": "3", "weights": {}}),
        "{during}"
    );
    // The rollback deletes version 3 and routes the alias back exactly: the canary's weight too.
    let rolled = node.roll_back(&failed).await;
    assert_eq!(rolled["status"], "rolled_back", "{rolled:#}");
    assert_eq!(moto.boto(&["lambda", "checkout"]), before);

    // The rolled-back code again: moto answers the version whose code it is not (its
    // publish compares with the deleted version); the adapter refuses rather than shift the
    // alias to the wrong code.
    let again = node
        .run("update-function-version", "ufv-2", input.clone())
        .await;
    assert_eq!(again["status"], "failed", "{again:#}");
    assert!(again.to_string().contains("code-mismatch"), "{again:#}");
    assert_eq!(moto.boto(&["lambda", "checkout"]), before);

    // A fixed build, healthy: the alias moves to it for good.
    let fixed = moto.boto(&["function", "checkout", "def main(e, c): return {'v': 4}"])["hex"]
        .as_str()
        .unwrap()
        .to_owned();
    moto.boto(&["invoke-answers", r#"{"healthy": true}"#]);
    let done = node
        .run(
            "update-function-version",
            "ufv-3",
            json!({"functionName": "checkout", "codeSha256": fixed, "alias": "live"}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done:#}");
    let shifted = done["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stageName"] == "shift-alias")
        .unwrap()["outputJson"]["after"]
        .clone();
    let after = moto.boto(&["lambda", "checkout"]);
    assert_eq!(
        after["aliases"]["live"]["version"], shifted,
        "{after} {done:#}"
    );
    assert_eq!(after["aliases"]["live"]["weights"], json!({}), "{after}");
    assert_eq!(after["versions"].as_array().unwrap().len(), 3, "{after}");
}

/// add-subdomain through `capstan serve` on Route 53 (moto): the plan derives the alias target
/// from the apex's own alias record (a CloudFront distribution), waits for approval, writes one
/// alias record per subdomain, and its rollback leaves the zone as it was.
#[tokio::test]
async fn add_subdomain_plans_approves_and_applies_alias_records_on_route53() {
    let moto = Moto::start();
    let zone = moto.boto(&["create-zone", ZONE])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let cdn = "d111111abcdef8.cloudfront.net";
    moto.boto(&["upsert-alias", &zone, ZONE, cdn, "Z2FDTNDATAQYW2"]);
    let before = moto.boto(&["records", &zone]);

    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        &["workflows/add-subdomain.wasm"],
        &["workflows:add-subdomain", "admin:read"],
        &format!(
            "workers = 2\n[grants]\nadd-subdomain = [\"dns\", \"convergence\"]\n{}",
            route53_table(&moto, dir.path())
        ),
    );
    let r = node
        .c
        .post(format!("{}/v1/workflows/add-subdomain", node.server.base))
        .bearer_auth(&node.key)
        .header("Idempotency-Key", "sub-1")
        .json(&json!({"rootDomain": ZONE, "subdomains": ["www", "api"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = r.json::<Value>().await.unwrap()["executionId"]
        .as_str()
        .unwrap()
        .to_owned();
    node.until(&id, &["waiting"]).await;
    let mut plan = Value::Null;
    for _ in 0..200 {
        let r = node
            .c
            .get(format!("{}/v1/executions/{id}/plan", node.server.base))
            .bearer_auth(&node.key)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            plan = r.json().await.unwrap();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(
        plan.to_string().contains(cdn),
        "the plan aims at the apex's target: {plan:#}"
    );
    assert_eq!(
        moto.boto(&["records", &zone]),
        before,
        "nothing written before approval"
    );

    let r = node
        .c
        .post(format!(
            "{}/v1/executions/{id}/plan/approve",
            node.server.base
        ))
        .bearer_auth(&node.key)
        .json(&json!({"planHash": plan["planHash"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let done = node.until(&id, &["succeeded", "failed", "paused"]).await;
    assert_eq!(
        done["status"],
        "succeeded",
        "{done:#}\nmoto log:\n{}",
        moto.log()
    );

    let after = moto.boto(&["records", &zone]);
    for host in ["www", "api"] {
        let name = format!("{host}.{ZONE}");
        let record = after
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name.as_str() && r["type"] == "A")
            .unwrap_or_else(|| panic!("no A record for {name}: {after}"));
        assert_eq!(record["alias"], cdn, "{record}");
    }

    let rolled = node.roll_back(&done).await;
    assert_eq!(rolled["status"], "rolled_back", "{rolled:#}");
    assert_eq!(moto.boto(&["records", &zone]), before);
}

/// `capstan serve` SIGKILLed again and again while add-certificate runs on ACM with its
/// validation on Route 53 (moto): every execution succeeds after replay, with exactly one
/// certificate per domain in ACM and never two validation records for a name.
/// Triggers `workflow` with each of `bodies` (idempotency keys `kill-0`, `kill-1`, ...): the
/// execution ids, in order.
async fn trigger_each(
    c: &Client,
    server: &Server,
    key: &str,
    workflow: &str,
    bodies: impl Iterator<Item = Value>,
) -> Vec<String> {
    let mut ids = Vec::new();
    for (i, body) in bodies.enumerate() {
        let r = c
            .post(format!("{}/v1/workflows/{workflow}", server.base))
            .bearer_auth(key)
            .header("Idempotency-Key", format!("kill-{i}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        ids.push(
            r.json::<Value>().await.unwrap()["executionId"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    ids
}

/// SIGKILLs `server` `times` times, each `pause.0` ms plus up to `pause.1` ms after the last
/// (a reproducible sequence from `seed`), starting it again on `home` each time: the last one.
async fn kill_repeatedly(
    mut server: Server,
    home: &Path,
    times: usize,
    mut seed: u64,
    pause: (u64, u64),
) -> Server {
    for _ in 0..times {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(std::time::Duration::from_millis(pause.0 + seed % pause.1)).await;
        let pid = server.child.id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status();
        let _ = server.child.wait();
        drop(server);
        server = Server::start(home);
    }
    server
}

#[tokio::test]
async fn sigkill_during_add_certificate_leaves_one_certificate_per_domain_in_acm() {
    const EXECUTIONS: usize = 6;
    let moto = Moto::start();
    let zone = moto.boto(&["create-zone", ZONE])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let dir = tempfile::tempdir().unwrap();
    let home = home_with(
        &["workflows/add-certificate.wasm"],
        &format!(
            "workers = 4\nlease_ms = 1500\n[provider_retry.certificates]\ninitial_ms = 100\nmax_ms = 500\nmax_attempts = 20\n{}{}",
            route53_table(&moto, dir.path()),
            aws_table(&moto, dir.path(), "certificates", "acm", "")
        ),
    );
    let key = key_for(home.path(), "ops", &["workflows:add-certificate"]);
    let c = Client::new();
    let server = Server::start(home.path());
    let bodies = (0..EXECUTIONS).map(|i| json!({"domain": format!("cert-{i}.{ZONE}")}));
    let ids = trigger_each(&c, &server, &key, "add-certificate", bodies).await;
    // Kills 150–600 ms apart (reproducible), while requests, validations and issuance are in
    // flight (moto issues a second after the request).
    let server = kill_repeatedly(server, home.path(), 4, 0x2545_f491_4f6c_dd1d, (150, 450)).await;
    // An execution whose `prepare` answer was lost with a kill reads again and may find the
    // certificate its own earlier request made, already issued (moto issues on a timer, not on
    // DNS): it adopts it and writes no validation record. Either way, one certificate.
    let mut adopted = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let e = until_status(
            &c,
            &server.base,
            &key,
            id,
            &["succeeded", "failed", "paused", "canceled"],
        )
        .await;
        assert_eq!(e["status"], "succeeded", "{e:#}\nmoto log:\n{}", moto.log());
        let prepare = e["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stageName"] == "prepare")
            .unwrap()
            .clone();
        if !prepare["outputJson"]["existing"].is_null() {
            adopted.push(i);
        }
    }
    eprintln!("executions that adopted their own earlier certificate: {adopted:?}");
    let certificates = moto.boto(&["certificates"]);
    assert_eq!(
        certificates.as_array().unwrap().len(),
        EXECUTIONS,
        "{certificates:#}"
    );
    let records = moto.boto(&["records", &zone]);
    for i in 0..EXECUTIONS {
        let domain = format!("cert-{i}.{ZONE}");
        let count = certificates
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["domain"] == domain.as_str())
            .count();
        assert_eq!(count, 1, "{domain}: {certificates:#}");
        let cnames = records
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["type"] == "CNAME" && r["name"].as_str().unwrap().ends_with(&domain))
            .count();
        // Created: its record, once. Adopted: at most the record an earlier incarnation wrote.
        if adopted.contains(&i) {
            assert!(cnames <= 1, "{domain}: {records:#}");
        } else {
            assert_eq!(cnames, 1, "{domain}: {records:#}");
        }
    }
}

/// `[providers.*]` for all seven capabilities but `functions`: Route 53 (limited to `zones`),
/// ACM, CloudFront and Route 53 Domains on `moto`, maps keys on `google`, tickets on `jira`,
/// their secrets in files under `dir`.
fn every_capability_real(
    moto: &Moto,
    google: &GoogleApiKeys,
    jira: &Jira,
    dir: &Path,
    zones: &[&str],
) -> String {
    let sa = dir.join("maps-sa.json");
    std::fs::write(&sa, google.service_account_json()).unwrap();
    let jira_token = dir.join("jira-token");
    std::fs::write(&jira_token, "jira-token\n").unwrap();
    format!(
        "{}{}{}{}{}\n[providers.maps]\nkind = \"apikeys\"\nproject = \"capstan-test\"\nendpoint_url = \"{}\"\nservice_account_key_file = \"{}\"\n\n[providers.ticketing]\nkind = \"jira\"\nbase_url = \"{}\"\nemail = \"ops@example.com\"\napi_token_file = \"{}\"\n",
        aws_table(moto, dir, "dns", "route53", &format!("zones = {zones:?}\n")),
        aws_table(moto, dir, "certificates", "acm", ""),
        aws_table(moto, dir, "cdn", "cloudfront", ""),
        aws_table(
            moto,
            dir,
            "registrar",
            "route53domains",
            "[providers.registrar.contact]\nfirst_name = \"Ada\"\nlast_name = \"Lovelace\"\ncontact_type = \"COMPANY\"\norganization_name = \"Capstan Test Ltd\"\naddress_line_1 = \"1 Analytical Way\"\ncity = \"London\"\ncountry_code = \"GB\"\nzip_code = \"N1 1AA\"\nphone_number = \"+44.2071234567\"\nemail = \"hostmaster@example.org\"\n"
        ),
        "[provider_retry.certificates]\ninitial_ms = 200\nmax_ms = 1000\nmax_attempts = 30\n",
        google.endpoint(),
        sa.display(),
        jira.base_url(),
        jira_token.display(),
    )
}

/// onboard-domain with every capability on a real adapter: the hosted zone, the registrar, the
/// certificate and the distributions in moto (Route 53, Route 53 Domains, ACM, CloudFront), the
/// maps keys and the ticket on the contract servers of Google's API Keys API and Jira. The
/// outcome validates against the document's schema; the rollback leaves every service as it
/// was, compared listing by listing (the ticket's comment stays: comments are not undone).
#[tokio::test]
async fn onboard_domain_on_real_adapters_and_its_rollback_restores_every_service() {
    // Route 53 Domains registers only real top-level domains (moto too): not `.test`.
    const DOMAIN: &str = "capstan-onboard.com";
    let moto = Moto::start();
    // The account holds the domain already (moto has no availability check to register from),
    // and, as with AWS, the registration made its hosted zone.
    moto.boto(&["register-domain", DOMAIN, "2"]);
    let zones = moto.boto(&["zones"]);
    assert_eq!(zones.as_array().unwrap().len(), 1, "{zones:#}");
    let zone = zones[0]["id"].as_str().unwrap().to_owned();
    let google = GoogleApiKeys::start("capstan-test");
    google.add_key("web", "Web", &["*.existing.example/*"]);
    google.add_server_key("backend", "Backend");
    let jira = Jira::start("ops@example.com", "jira-token");
    jira.add_issue("OPS-7", &format!("Onboard {DOMAIN}"), "To Do");
    let listings = |moto: &Moto| {
        json!({
            "records": moto.boto(&["records", &zone]),
            "certificates": moto.boto(&["certificates"]),
            "distributions": moto.boto(&["distributions"]),
            "domains": moto.boto(&["domains"]),
        })
    };
    let before = listings(&moto);
    let keys_before = google.referrers("web");

    let dir = tempfile::tempdir().unwrap();
    let config = every_capability_real(&moto, &google, &jira, dir.path(), &[DOMAIN]);
    let node = Node::start(
        &["workflows/onboard-domain.wasm"],
        &["workflows:onboard-domain"],
        &config,
    );
    let done = node
        .run(
            "onboard-domain",
            "onboard-real",
            json!({"domain": DOMAIN, "ticketId": "OPS-7"}),
        )
        .await;
    assert_eq!(
        done["status"],
        "succeeded",
        "{done:#}\nmoto log:\n{}",
        moto.log()
    );
    let o = &done["outcome"];
    assert_valid(&schema("domain-onboarding-outcome.schema.json"), o);
    assert_eq!(o["status"], "onboarded", "{o:#}");
    assert_eq!(o["domain"]["state"], "already-registered", "{o:#}");
    assert_eq!(o["certificate"]["state"], "created", "{o:#}");
    assert_eq!(o["distributions"]["proxy"]["state"], "created", "{o:#}");
    assert_eq!(o["ticketing"]["state"], "updated", "{o:#}");

    // What each service holds now, read from the service.
    let certificates = moto.boto(&["certificates"]);
    let arn = o["certificate"]["arn"].as_str().unwrap();
    assert!(
        certificates
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["arn"] == arn && c["status"] == "ISSUED"),
        "{certificates:#}"
    );
    let distributions = moto.boto(&["distributions"]);
    let proxy = distributions
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"] == o["distributions"]["proxy"]["id"])
        .unwrap_or_else(|| panic!("{distributions:#}"));
    assert_eq!(proxy["certificate"], arn);
    let records = moto.boto(&["records", &zone]);
    for name in [DOMAIN.to_owned(), format!("www.{DOMAIN}")] {
        assert!(
            records.as_array().unwrap().iter().any(|r| {
                r["type"] == "A"
                    && r["name"].as_str().unwrap().trim_end_matches('.') == name
                    && !r["alias"].is_null()
            }),
            "an alias record for {name}: {records:#}"
        );
    }
    let referrer = format!("*.{DOMAIN}/*");
    assert!(
        google.referrers("web").contains(&referrer),
        "{:?}",
        google.referrers("web")
    );
    assert_eq!(jira.status("OPS-7"), "Resolved");
    let comments = jira.comments("OPS-7");
    assert_eq!(comments.len(), 1);
    assert!(
        comments[0]["body"].to_string().contains("Onboarding of"),
        "{:#}",
        comments[0]
    );

    // The rollback leaves moto, the key and the ticket's status as they were.
    let rolled = node.roll_back(&done).await;
    assert_eq!(rolled["status"], "rolled_back", "{rolled:#}");
    assert_eq!(listings(&moto), before);
    assert_eq!(google.referrers("web"), keys_before);
    assert_eq!(jira.status("OPS-7"), "To Do");
    assert_eq!(jira.comments("OPS-7").len(), 1, "a comment is not undone");
}

/// SIGKILL of `capstan serve` while onboardings on real adapters are in flight: every one
/// succeeds after replay, and no service holds anything twice — one certificate per domain, one
/// distribution per alias, each referrer once on the key, one comment per ticket (found by its
/// token's property when the kill lost the answer).
#[tokio::test]
async fn sigkill_during_onboard_domain_on_real_adapters_duplicates_nothing() {
    const DOMAINS: [&str; 3] = [
        "capstan-kill-0.com",
        "capstan-kill-1.com",
        "capstan-kill-2.com",
    ];
    let moto = Moto::start();
    let google = GoogleApiKeys::start("capstan-test");
    google.add_key("web", "Web", &[]);
    let jira = Jira::start("ops@example.com", "jira-token");
    for (i, domain) in DOMAINS.iter().enumerate() {
        moto.boto(&["register-domain", domain, "2"]);
        jira.add_issue(&format!("OPS-{i}"), &format!("Onboard {domain}"), "To Do");
    }
    let dir = tempfile::tempdir().unwrap();
    let home = home_with(
        &["workflows/onboard-domain.wasm"],
        &format!(
            "workers = 4\nlease_ms = 1500\n{}",
            every_capability_real(&moto, &google, &jira, dir.path(), &DOMAINS)
        ),
    );
    let key = key_for(home.path(), "ops", &["workflows:onboard-domain"]);
    let c = Client::new();
    let server = Server::start(home.path());
    let bodies = DOMAINS
        .iter()
        .enumerate()
        .map(|(i, domain)| json!({"domain": domain, "ticketId": format!("OPS-{i}")}));
    let ids = trigger_each(&c, &server, &key, "onboard-domain", bodies).await;
    // Kills 200–900 ms apart (reproducible): requests, issuance, distributions, referrers and
    // tickets are in flight.
    let server = kill_repeatedly(server, home.path(), 5, 0x9e37_79b9_7f4a_7c15, (200, 700)).await;
    for id in &ids {
        let e = until_status(
            &c,
            &server.base,
            &key,
            id,
            &["succeeded", "failed", "paused", "canceled"],
        )
        .await;
        assert_eq!(e["status"], "succeeded", "{e:#}\nmoto log:\n{}", moto.log());
        assert_eq!(e["outcome"]["status"], "onboarded", "{e:#}");
    }
    let certificates = moto.boto(&["certificates"]);
    let distributions = moto.boto(&["distributions"]);
    for (i, domain) in DOMAINS.iter().enumerate() {
        let certs = certificates
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["domain"] == *domain)
            .count();
        assert_eq!(certs, 1, "{domain}: {certificates:#}");
        for alias in [domain.to_string(), format!("www.{domain}")] {
            let holders = distributions
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| {
                    d["aliases"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|a| *a == alias.as_str())
                })
                .count();
            assert_eq!(holders, 1, "{alias}: {distributions:#}");
        }
        let ticket = format!("OPS-{i}");
        assert_eq!(jira.comments(&ticket).len(), 1, "{ticket}");
        assert_eq!(jira.status(&ticket), "Resolved");
    }
    let lookups = jira
        .requests()
        .iter()
        .filter(|r| r.contains("expand=properties"))
        .count();
    eprintln!("comment posts repeated after a kill, looked up by their token: {lookups}");
    let mut referrers = google.referrers("web");
    referrers.sort();
    let mut wanted: Vec<String> = DOMAINS.iter().map(|d| format!("*.{d}/*")).collect();
    wanted.sort();
    assert_eq!(referrers, wanted);
}

/// SIGKILL of `capstan serve` while update-function-version runs on three Lambda functions:
/// every execution succeeds after replay and each function has exactly one new version, its
/// alias on it.
#[tokio::test]
async fn sigkill_during_update_function_version_publishes_each_version_once() {
    const FUNCTIONS: [&str; 3] = ["kill-a", "kill-b", "kill-c"];
    let moto = Moto::start();
    let mut shas = Vec::new();
    for f in FUNCTIONS {
        moto.boto(&["function", f, "def main(e, c): return {'v': 1}"]);
        moto.boto(&["publish", f]);
        moto.boto(&["alias", f, "live", "1"]);
        shas.push(
            moto.boto(&["function", f, "def main(e, c): return {'v': 2}"])["hex"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let home = home_with(
        &["workflows/update-function-version.wasm"],
        &format!(
            "workers = 4\nlease_ms = 1500\n[grants]\nupdate-function-version = [\"functions\"]\n{}",
            aws_table(&moto, dir.path(), "functions", "lambda", "")
        ),
    );
    let key = key_for(home.path(), "ops", &["workflows:update-function-version"]);
    let c = Client::new();
    let server = Server::start(home.path());
    let bodies = FUNCTIONS
        .iter()
        .zip(&shas)
        .map(|(f, sha)| json!({"functionName": f, "codeSha256": sha, "alias": "live"}));
    let ids = trigger_each(&c, &server, &key, "update-function-version", bodies).await;
    // Kills 100–400 ms apart (reproducible), while versions are published, aliases moved and
    // probes invoked.
    let server = kill_repeatedly(server, home.path(), 4, 0x5851_f42d_4c95_7f2d, (100, 300)).await;
    for id in &ids {
        let e = until_status(
            &c,
            &server.base,
            &key,
            id,
            &["succeeded", "failed", "paused", "canceled"],
        )
        .await;
        assert_eq!(e["status"], "succeeded", "{e:#}\nmoto log:\n{}", moto.log());
    }
    for f in FUNCTIONS {
        let state = moto.boto(&["lambda", f]);
        assert_eq!(
            state["versions"].as_array().unwrap().len(),
            2,
            "{f}: one version published, once: {state:#}"
        );
        assert_eq!(
            state["aliases"]["live"],
            json!({"version": "2", "weights": {}}),
            "{f}"
        );
    }
}
