use super::*;
use capstan_sdk::harness::{Harness, Report, StageStatus};
use capstan_sdk::{Value, json};
use std::cell::Cell;
use std::rc::Rc;

const ARN: &str = "arn:sim:acm:cert/new1";

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
        "issued_at": if status == "Issued" { json!(5) } else { Value::Null },
        "in_use_by": [],
    })
}

/// A cloud with zones example.com and example.org and the given existing certificates.
fn harness(existing: Vec<Value>) -> Harness {
    let issued = Rc::new(Cell::new(false));
    let (set, get) = (issued.clone(), issued);
    Harness::new()
        .fake("dns.find-zone", |r| {
            let d = r["domain"].as_str().unwrap();
            let zone = ["example.com", "example.org"]
                .into_iter()
                .find(|z| d == *z || d.ends_with(&format!(".{z}")));
            Ok(json!(zone.map(|z| json!({"id": format!("Z-{z}"), "name": z}))))
        })
        .fake("certificates.find-certificates", move |_| {
            Ok(json!({"Ok": existing.clone()})["Ok"].clone())
        })
        .fake("certificates.request-certificate", |r| {
            let sans: Vec<&str> = r["subject_alternative_names"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            Ok(cert(ARN, r["domain"].as_str().unwrap(), &sans, "PendingValidation"))
        })
        .fake("dns.change-records", |r| {
            Ok(json!({"change_id": format!("C-{}", r["zone_id"].as_str().unwrap()), "zone_id": r["zone_id"], "status": "Pending", "prior": []}))
        })
        .fake("convergence.await-converged", move |_| {
            set.set(true);
            Ok(Value::Null)
        })
        .fake("certificates.describe-certificate", move |r| {
            let arn = r["arn"].as_str().unwrap();
            let status = if get.get() || arn != ARN { "Issued" } else { "PendingValidation" };
            Ok(cert(arn, "example.com", &["www.example.com", "example.org"], status))
        })
}

fn output(report: &Report) -> Output {
    serde_json::from_value(report.output.clone().expect("the run succeeds")).unwrap()
}

#[test]
fn requests_validates_awaits_and_verifies() {
    let report = harness(vec![]).run::<AddCertificate>(json!({
        "domain": " Example.COM ",
        "subjectAlternativeNames": ["www.example.com", "example.org", "EXAMPLE.com"]
    }));
    assert_eq!(report.stage_names(), STAGES);
    assert!(
        report
            .stages
            .iter()
            .all(|s| s.status == StageStatus::Succeeded)
    );
    let out = output(&report);
    assert_eq!(out.state, CertificateState::Created);
    assert_eq!(out.arn, ARN);
    assert_eq!(
        report.calls("certificates.request-certificate")[0].request,
        json!({"domain": "example.com", "subject_alternative_names": ["www.example.com", "example.org"]})
    );
    let changes = report.calls("dns.change-records");
    assert_eq!(changes.len(), 2, "one change per zone");
    assert_eq!(changes[0].request["zone_id"], "Z-example.com");
    assert_eq!(changes[0].request["changes"].as_array().unwrap().len(), 2);
    assert_eq!(changes[1].request["zone_id"], "Z-example.org");
    assert_eq!(out.dns_change_ids, ["C-Z-example.com", "C-Z-example.org"]);
    assert_eq!(
        report.calls("convergence.await-converged")[0].request["condition"],
        json!({"CertificateIssued": ARN})
    );
}

#[test]
fn adopts_an_issued_certificate_that_covers_every_name() {
    let existing = cert(
        "arn:old",
        "example.com",
        &["*.example.com", "example.org"],
        "Issued",
    );
    let report = harness(vec![existing]).run::<AddCertificate>(json!({
        "domain": "example.com",
        "subjectAlternativeNames": ["www.example.com", "example.org"]
    }));
    let out = output(&report);
    assert_eq!(out.state, CertificateState::Adopted);
    assert_eq!(out.arn, "arn:old");
    assert_eq!(report.stage_names(), ["prepare", "finalize"]);
    assert!(report.calls("certificates.request-certificate").is_empty());
    assert!(report.calls("dns.change-records").is_empty());
}

#[test]
fn reuse_can_be_turned_off() {
    let existing = cert("arn:old", "example.com", &["*.example.com"], "Issued");
    let report = harness(vec![existing])
        .run::<AddCertificate>(json!({"domain": "example.com", "reuseExisting": false}));
    assert_eq!(output(&report).state, CertificateState::Created);
    assert!(report.calls("certificates.find-certificates").is_empty());
}

#[test]
fn a_name_without_a_zone_fails_before_anything_changes() {
    let report = harness(vec![]).run::<AddCertificate>(
        json!({"domain": "example.com", "subjectAlternativeNames": ["elsewhere.net"]}),
    );
    assert_eq!(report.output.as_ref().unwrap_err().code, "zone-not-found");
    assert_eq!(report.stage_names(), ["prepare"]);
    assert!(report.calls("certificates.request-certificate").is_empty());
}

#[test]
fn a_certificate_that_is_not_issued_fails_finalize() {
    let report = harness(vec![])
        .fake("convergence.await-converged", |_| Ok(Value::Null))
        .run::<AddCertificate>(json!({"domain": "example.com"}));
    assert_eq!(
        report.output.as_ref().unwrap_err().code,
        "certificate-not-issued"
    );
    assert_eq!(
        report.stage("finalize").unwrap().status,
        StageStatus::Failed
    );
}

#[test]
fn an_issuance_timeout_pauses() {
    let report = harness(vec![])
        .fail(
            "convergence.await-converged",
            Error::transient("timeout", "not yet"),
        )
        .run::<AddCertificate>(json!({"domain": "example.com"}));
    assert!(report.output.as_ref().unwrap_err().is_transient());
    assert_eq!(
        report.stage("issuance").unwrap().status,
        StageStatus::Failed
    );
}

#[test]
fn input_is_checked() {
    for bad in [
        json!({"domain": "example.com", "extra": true}),
        json!({"domain": "nope"}),
        json!({"domain": "example.com", "subjectAlternativeNames": [" "]}),
    ] {
        let report = harness(vec![]).run::<AddCertificate>(bad.clone());
        assert_eq!(
            report.output.as_ref().unwrap_err().code,
            "invalid-input",
            "{bad}"
        );
    }
    let d = capstan_sdk::__private::describe::<AddCertificate>();
    let schema: Value = serde_json::from_str(&d.input_schema).unwrap();
    assert_eq!(schema["properties"]["domain"]["minLength"], 1);
    assert_eq!(
        schema["properties"]["subjectAlternativeNames"]["items"]["minLength"],
        1
    );
    assert_eq!(d.recovery_operations[0].from_stage, "finalize");
}
