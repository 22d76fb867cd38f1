use super::*;
use capstan_sdk::harness::{Harness, Report, StageStatus};
use capstan_sdk::{Value, json};
use std::cell::RefCell;
use std::rc::Rc;

fn cert(arn: &str, domain: &str, sans: &[&str], status: &str) -> Value {
    json!({
        "arn": arn,
        "domain": domain,
        "subject_alternative_names": sans,
        "status": status,
        "validation_records": std::iter::once(&domain).chain(sans).map(|n| json!({
            "name": format!("_capstan-validation.{n}"),
            "type_": "Cname",
            "ttl": 300,
            "values": ["tok.validations.sim.capstan.dev"],
            "alias_target": null,
        })).collect::<Vec<_>>(),
        "issued_at": 5,
        "in_use_by": [],
    })
}

fn distribution(spec: &Value) -> Value {
    json!({
        "id": "E1",
        "domain_name": "dE1.cdn.sim.capstan.dev",
        "hosted_zone_id": "ZCDNSIMULATED",
        "spec": spec,
        "status": "Deployed",
    })
}

/// Distribution E1 serving example.com with `current` attached; zones example.com, example.org.
fn harness(current: Value, existing: Vec<Value>, records: Vec<Value>) -> Harness {
    let spec = Rc::new(RefCell::new(json!({
        "origin": "origin.example.net",
        "aliases": ["example.com"],
        "certificate_arn": current["arn"],
        "comment": "main",
    })));
    let (find, get, update) = (spec.clone(), spec.clone(), spec);
    Harness::new()
        .fake("cdn.get-distribution", move |_| {
            Ok(distribution(&get.borrow()))
        })
        .fake("cdn.find-distribution-by-alias", move |r| {
            let spec = find.borrow();
            let held = spec["aliases"]
                .as_array()
                .unwrap()
                .contains(&r["alias"]);
            Ok(if held { distribution(&spec) } else { Value::Null })
        })
        .fake("cdn.update-distribution", move |r| {
            let before = distribution(&update.borrow());
            *update.borrow_mut() = r["spec"].clone();
            Ok(json!({"before": before, "after": distribution(&r["spec"])}))
        })
        .fake("dns.find-zone", |r| {
            let d = r["domain"].as_str().unwrap();
            let zone = ["example.com", "example.org"]
                .into_iter()
                .find(|z| d == *z || d.ends_with(&format!(".{z}")));
            Ok(json!(zone.map(|z| json!({"id": format!("Z-{z}"), "name": z}))))
        })
        .fake("dns.list-records", move |_| Ok(json!(records)))
        .fake("dns.change-records", |r| {
            Ok(json!({"change_id": format!("C-{}", r["zone_id"].as_str().unwrap()), "zone_id": r["zone_id"], "status": "Pending", "prior": []}))
        })
        .fake("certificates.describe-certificate", move |_| Ok(current.clone()))
        .fake("certificates.find-certificates", move |_| Ok(json!(existing)))
        .fake("certificates.request-certificate", |r| {
            let sans: Vec<&str> = r["subject_alternative_names"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            Ok(cert("arn:new", r["domain"].as_str().unwrap(), &sans, "PendingValidation"))
        })
        .reply("convergence.await-converged", Value::Null)
}

fn output(report: &Report) -> Output {
    serde_json::from_value(report.output.clone().expect("the run succeeds")).unwrap()
}

#[test]
fn requests_a_certificate_for_all_aliases_and_attaches_the_domain() {
    let current = cert("arn:old", "example.com", &[], "Issued");
    let report = harness(current, vec![], vec![])
        .run::<AddDomain>(json!({"domain": "Shop.Example.ORG", "existingAlias": "example.com"}));
    assert_eq!(report.stage_names(), STAGES);
    assert!(
        report
            .stages
            .iter()
            .all(|s| s.status == StageStatus::Succeeded)
    );
    let out = output(&report);
    assert_eq!(out.domain, "shop.example.org");
    assert_eq!(out.certificate, CertificateState::Created);
    assert_eq!(out.certificate_arn, "arn:new");
    assert_eq!(out.attachment, AttachState::Updated);
    assert_eq!(out.aliases, ["example.com", "shop.example.org"]);
    assert_eq!(
        report.calls("certificates.request-certificate")[0].request,
        json!({"domain": "example.com", "subject_alternative_names": ["shop.example.org"]})
    );
    let changes = report.calls("dns.change-records");
    assert_eq!(
        changes.len(),
        3,
        "validation in two zones, then the alias record"
    );
    assert_eq!(changes[2].request["zone_id"], "Z-example.org");
    assert_eq!(
        changes[2].request["changes"][0]["Upsert"]["alias_target"]["dns_name"],
        "dE1.cdn.sim.capstan.dev"
    );
    assert_eq!(out.dns_change_id.as_deref(), Some("C-Z-example.org"));
}

#[test]
fn keeps_a_certificate_that_already_covers_the_domain() {
    let current = cert("arn:wild", "example.com", &["*.example.com"], "Issued");
    let report = harness(current, vec![], vec![])
        .run::<AddDomain>(json!({"domain": "www.example.com", "distributionId": "E1"}));
    let out = output(&report);
    assert_eq!(out.certificate, CertificateState::Kept);
    assert_eq!(out.certificate_arn, "arn:wild");
    assert!(report.calls("certificates.find-certificates").is_empty());
    assert_eq!(
        report.calls("cdn.update-distribution")[0].request["spec"]["certificate_arn"],
        "arn:wild"
    );
}

#[test]
fn adopts_an_issued_certificate_covering_every_alias() {
    let current = cert("arn:old", "example.com", &[], "Issued");
    let other = cert("arn:multi", "example.com", &["shop.example.org"], "Issued");
    let report = harness(current, vec![other], vec![])
        .run::<AddDomain>(json!({"domain": "shop.example.org", "distributionId": "E1"}));
    let out = output(&report);
    assert_eq!(out.certificate, CertificateState::Adopted);
    assert_eq!(out.certificate_arn, "arn:multi");
    assert!(report.calls("certificates.request-certificate").is_empty());
}

#[test]
fn an_attached_and_routed_domain_changes_nothing() {
    let current = cert("arn:wild", "example.com", &["*.example.com"], "Issued");
    let routed = json!({"name": "example.com", "type_": "A", "ttl": null, "values": [],
        "alias_target": {"dns_name": "dE1.cdn.sim.capstan.dev", "hosted_zone_id": "ZCDNSIMULATED", "evaluate_target_health": false}});
    let report = harness(current, vec![], vec![routed])
        .run::<AddDomain>(json!({"domain": "example.com", "distributionId": "E1"}));
    let out = output(&report);
    assert_eq!(out.attachment, AttachState::Unchanged);
    assert_eq!(out.dns_change_id, None);
    assert!(report.calls("cdn.update-distribution").is_empty());
    assert!(report.calls("dns.change-records").is_empty());
}

#[test]
fn a_cname_in_the_way_is_replaced() {
    let current = cert("arn:wild", "example.com", &["*.example.com"], "Issued");
    let cname = json!({"name": "www.example.com", "type_": "Cname", "ttl": 300, "values": ["origin.example.net"], "alias_target": null});
    let report = harness(current, vec![], vec![cname])
        .run::<AddDomain>(json!({"domain": "www.example.com", "distributionId": "E1"}));
    output(&report);
    let changes = &report.calls("dns.change-records")[0].request["changes"];
    assert_eq!(changes[0]["Delete"]["type_"], "Cname");
    assert_eq!(changes[1]["Upsert"]["type_"], "A");
}

#[test]
fn a_domain_served_elsewhere_fails_in_locate() {
    let current = cert("arn:old", "example.com", &[], "Issued");
    let report = harness(current, vec![], vec![])
        .fake("cdn.find-distribution-by-alias", |r| {
            Ok(distribution(&json!({"origin": "o", "aliases": [r["alias"]], "certificate_arn": null, "comment": ""}))
                .as_object()
                .map(|d| {
                    let mut d = d.clone();
                    if r["alias"] == "taken.example.com" {
                        d.insert("id".into(), json!("E9"));
                    }
                    Value::Object(d)
                })
                .unwrap())
        })
        .run::<AddDomain>(json!({"domain": "taken.example.com", "distributionId": "E1"}));
    assert_eq!(report.output.as_ref().unwrap_err().code, "alias-in-use");
    assert_eq!(report.stage_names(), ["locate"]);
}

#[test]
fn input_names_exactly_one_distribution() {
    let current = cert("arn:old", "example.com", &[], "Issued");
    for bad in [
        json!({"domain": "a.example.com"}),
        json!({"domain": "a.example.com", "distributionId": "E1", "existingAlias": "example.com"}),
        json!({"domain": "a.example.com", "distributionId": "E1", "other": 1}),
    ] {
        let report = harness(current.clone(), vec![], vec![]).run::<AddDomain>(bad.clone());
        assert_eq!(
            report.output.as_ref().unwrap_err().code,
            "invalid-input",
            "{bad}"
        );
    }
    let d = capstan_sdk::__private::describe::<AddDomain>();
    let schema: Value = serde_json::from_str(&d.input_schema).unwrap();
    assert_eq!(schema["properties"]["distributionId"]["type"], "string");
    assert_eq!(schema["required"], json!(["domain"]));
}
