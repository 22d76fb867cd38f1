//! The AWS adapters against moto's server, started by the tests on 127.0.0.1 (`just setup`
//! installs it in `target/venv-moto`). What moto holds is read with boto3, the AWS SDK for
//! Python (`tests/clients/aws_state.py`), never through Capstan's own view.
//!
//! Route 53: a workflow's record changes through `capstan serve` reach the hosted zone and its
//! rollback leaves the zone as it was; the adapter itself answers every `dns` operation with
//! alias records, a replayed token and a zone created twice under one token.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_core::Capability;
use capstan_e2e::realservers::Moto;
use capstan_e2e::{Server, home_with, key_for, until_status};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use std::sync::Arc;

const ZONE: &str = "capstan-aws.test";

/// `[providers.dns]` on `moto`, with its test key (the secret in a file under `dir`).
fn route53_table(moto: &Moto, dir: &std::path::Path) -> String {
    let secret = dir.join("aws-secret");
    std::fs::write(&secret, "testing\n").unwrap();
    format!(
        "[providers.dns]\nkind = \"route53\"\nendpoint_url = \"{}\"\nzones = [\"{ZONE}\"]\naccess_key_id = \"testing\"\nsecret_access_key_file = \"{}\"\n",
        moto.endpoint(),
        secret.display()
    )
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
    let home = home_with(
        &["guest-fixtures/fixture-steps.wasm"],
        &format!(
            "workers = 2\nlease_ms = 3000\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[provider_retry.dns]\ninitial_ms = 50\nmax_ms = 100\nmax_attempts = 3\n{}",
            route53_table(&moto, dir.path())
        ),
    );
    let key = key_for(
        home.path(),
        "ops",
        &["workflows:fixture-steps", "admin:read"],
    );
    let server = Server::start(home.path());
    let c = Client::new();

    // The node reports the adapter and whether Route 53 (moto) answers.
    let ready: Value = c
        .get(format!("{}/readyz", server.base))
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

    let r = c
        .post(format!("{}/v1/workflows/fixture-steps", server.base))
        .bearer_auth(&key)
        .header("Idempotency-Key", "r53-1")
        .json(&json!({"zone": zone, "domain": ZONE, "stages": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = r.json::<Value>().await.unwrap()["executionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let done = until_status(
        &c,
        &server.base,
        &key,
        &id,
        &["succeeded", "failed", "paused"],
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
    let r = c
        .post(format!("{}/v1/executions/{id}/rollback", server.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let rolled = until_status(&c, &server.base, &key, &id, &["rolled_back", "failed"]).await;
    assert_eq!(rolled["status"], "rolled_back", "{rolled:#}");
    assert_eq!(moto.boto(&["records", &zone]), before);
}

/// The adapter directly, every `dns` operation against moto.
#[tokio::test]
async fn the_route53_adapter_answers_every_dns_operation() {
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("aws-secret");
    std::fs::write(&secret, "testing\n").unwrap();
    let settings: capstan_adapters::ProviderSettings = serde_json::from_value(json!({
        "kind": "route53", "endpoint_url": moto.endpoint(), "zones": [ZONE],
        "access_key_id": "testing", "secret_access_key_file": secret,
    }))
    .unwrap();
    let store = capstan_store::Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
        .await
        .unwrap();
    let node = capstan_adapters::Node {
        store,
        clock: Arc::new(capstan_core::SystemClock),
        keyring: capstan_core::secrets::Keyring::development(),
    };
    let dns = capstan_adapters::build(Capability::Dns, &settings, &node)
        .await
        .unwrap()
        .expect("a real provider");
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
