//! Harness tests: a small fake DNS (one zone, `example.com`) whose record sets change when the
//! workflow changes them, so `verify` sees what `apply` did.

use super::*;
use capstan_sdk::harness::{Harness, Report, StageStatus};
use capstan_sdk::{Value, json};
use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::rc::Rc;

const CDN: &str = "d1.cdn.sim.capstan.dev";

fn target(dns_name: &str) -> Value {
    json!({"dns_name": dns_name, "hosted_zone_id": "ZCDNSIMULATED", "evaluate_target_health": false})
}

fn a_alias(name: &str, dns_name: &str) -> Value {
    json!({"name": name, "type_": "A", "ttl": null, "values": [], "alias_target": target(dns_name)})
}

fn a_values(name: &str, ip: &str) -> Value {
    json!({"name": name, "type_": "A", "ttl": 60, "values": [ip], "alias_target": null})
}

fn cname(name: &str, value: &str) -> Value {
    json!({"name": name, "type_": "Cname", "ttl": 300, "values": [value], "alias_target": null})
}

/// A fake DNS world: `records` of zone `Z1` (`example.com`); `change-records` applies changes.
struct World {
    records: Rc<RefCell<Vec<Value>>>,
    apply_changes: bool,
}

impl World {
    fn new(records: Vec<Value>) -> Self {
        let mut all = vec![a_alias("example.com", CDN)];
        all.extend(records);
        Self {
            records: Rc::new(RefCell::new(all)),
            apply_changes: true,
        }
    }

    fn harness(&self) -> Harness {
        let list = self.records.clone();
        let change = self.records.clone();
        let apply = self.apply_changes;
        Harness::new()
            .fake("dns.find-zone", |req| {
                let domain = req["domain"].as_str().unwrap_or_default();
                Ok(
                    if domain == "example.com" || domain.ends_with(".example.com") {
                        json!({"id": "Z1", "name": "example.com"})
                    } else {
                        Value::Null
                    },
                )
            })
            .fake("dns.list-records", move |req| {
                assert_eq!(req["zone_id"], "Z1");
                let name = req["name"].as_str().unwrap_or_default();
                Ok(Value::Array(
                    list.borrow()
                        .iter()
                        .filter(|r| r["name"] == name)
                        .cloned()
                        .collect(),
                ))
            })
            .fake("dns.change-records", move |req| {
                let mut records = change.borrow_mut();
                let mut prior = Vec::new();
                for c in req["changes"].as_array().unwrap() {
                    let (set, upsert) = match c.get("Upsert") {
                        Some(set) => (set, true),
                        None => (&c["Delete"], false),
                    };
                    let same = |r: &Value| r["name"] == set["name"] && r["type_"] == set["type_"];
                    if let Some(old) = records.iter().find(|r| same(r)) {
                        prior.push(old.clone());
                    }
                    if apply {
                        records.retain(|r| !same(r));
                        if upsert {
                            records.push(set.clone());
                        }
                    }
                }
                Ok(json!({"change_id": "C1", "zone_id": "Z1", "status": "Pending", "prior": prior}))
            })
            .reply("convergence.await-converged", Value::Null)
    }
}

/// The world's harness with the plan approved (a body without `planHash`: not cross-checked).
fn approved(world: &World) -> Harness {
    world.harness().approve("plan", json!({}))
}

fn input(subdomains: &[&str]) -> Value {
    json!({"rootDomain": "example.com", "subdomains": subdomains})
}

fn plan_of(report: &Report) -> Value {
    report.stage("plan").unwrap().output.clone().unwrap()
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

#[test]
fn plan_gives_each_hostname_its_disposition_and_current_record() {
    let world = World::new(vec![
        cname("shop.example.com", "shops.example.net"),
        a_alias("api.example.com", "D1.CDN.SIM.CAPSTAN.DEV."),
        a_values("old.example.com", "192.0.2.1"),
        json!({"name": "www.example.com", "type_": "Txt", "ttl": 300, "values": ["\"v=1\""], "alias_target": null}),
    ]);
    let report = approved(&world).run::<AddSubdomain>(input(&[
        "www",
        "shop.example.com",
        "API",
        "old.example.com.",
    ]));
    report.output.as_ref().unwrap();
    let plan = plan_of(&report);
    let hash = plan["planHash"].as_str().unwrap().to_owned();
    assert_eq!(
        plan,
        json!({
            "apexAlias": {"dnsName": CDN, "evaluateTargetHealth": false, "hostedZoneId": "ZCDNSIMULATED"},
            "executionId": "exec-test",
            "hostedZoneId": "Z1",
            "items": [
                {"hostname": "www.example.com", "disposition": "create"},
                {"hostname": "shop.example.com", "disposition": "replace",
                 "current": {"name": "shop.example.com", "type": "CNAME", "values": ["shops.example.net"], "ttl": 300}},
                {"hostname": "api.example.com", "disposition": "already-correct",
                 "current": {"name": "api.example.com", "type": "A", "values": [],
                             "aliasTarget": {"dnsName": CDN, "evaluateTargetHealth": false, "hostedZoneId": "ZCDNSIMULATED"}}},
                {"hostname": "old.example.com", "disposition": "replace",
                 "current": {"name": "old.example.com", "type": "A", "values": ["192.0.2.1"], "ttl": 60}},
            ],
            "planHash": hash,
            "replacementRequired": true,
            "rootDomain": "example.com",
        })
    );
}

#[test]
fn replacement_is_required_only_when_an_item_is_replaced() {
    let world = World::new(vec![a_alias("api.example.com", CDN)]);
    let report = approved(&world).run::<AddSubdomain>(input(&["www", "api"]));
    let plan = plan_of(&report);
    assert_eq!(plan["replacementRequired"], false);
    assert_eq!(plan["items"][0]["disposition"], "create");
    assert_eq!(plan["items"][1]["disposition"], "already-correct");

    let world = World::new(vec![a_alias("api.example.com", "d2.cdn.sim.capstan.dev")]);
    let report = approved(&world).run::<AddSubdomain>(input(&["api"]));
    let plan = plan_of(&report);
    assert_eq!(plan["replacementRequired"], true);
    assert_eq!(plan["items"][0]["disposition"], "replace");
    assert_eq!(
        plan["items"][0]["current"]["aliasTarget"]["dnsName"],
        "d2.cdn.sim.capstan.dev"
    );
}

#[test]
fn plan_hash_is_the_sha256_of_the_canonical_plan() {
    let plan = plan::AddSubdomainPlan::new(
        "exec-1".to_owned(),
        "example.com".to_owned(),
        "Z1".to_owned(),
        ApexAlias {
            dns_name: CDN.to_owned(),
            evaluate_target_health: false,
            hosted_zone_id: "ZCDNSIMULATED".to_owned(),
        },
        vec![
            plan::PlanItem {
                hostname: "www.example.com".to_owned(),
                disposition: Disposition::Create,
                current: None,
            },
            plan::PlanItem {
                hostname: "shop.example.com".to_owned(),
                disposition: Disposition::Replace,
                current: Some(plan::CurrentRecord {
                    name: "shop.example.com".to_owned(),
                    type_: plan::CurrentType::Cname,
                    values: vec!["shops.example.net".to_owned()],
                    ttl: Some(300),
                    alias_target: None,
                }),
            },
        ],
    );
    let canonical = concat!(
        r#"{"apexAlias":{"dnsName":"d1.cdn.sim.capstan.dev","evaluateTargetHealth":false,"hostedZoneId":"ZCDNSIMULATED"},"#,
        r#""executionId":"exec-1","hostedZoneId":"Z1","#,
        r#""items":[{"disposition":"create","hostname":"www.example.com"},"#,
        r#"{"current":{"name":"shop.example.com","ttl":300,"type":"CNAME","values":["shops.example.net"]},"disposition":"replace","hostname":"shop.example.com"}],"#,
        r#""replacementRequired":true,"rootDomain":"example.com"}"#,
    );
    assert_eq!(plan.canonical(), canonical);
    assert_eq!(plan.plan_hash, sha256_hex(canonical));
    assert_eq!(plan.plan_hash.len(), 64);
    assert!(
        plan.plan_hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    );
    // The hash covers the content: a different disposition is a different plan.
    let mut items = plan.items.clone();
    items[0].disposition = Disposition::AlreadyCorrect;
    let other = plan::AddSubdomainPlan::new(
        plan.execution_id.clone(),
        plan.root_domain.clone(),
        plan.hosted_zone_id.clone(),
        plan.apex_alias.clone(),
        items,
    );
    assert_ne!(other.plan_hash, plan.plan_hash);
}

#[test]
fn canonical_json_sorts_keys_at_every_level_without_whitespace() {
    let value = json!({"b": [ {"z": 1, "a": "x\"y"} ], "a": {"d": true, "c": null}});
    assert_eq!(
        plan::canonical_json(&value),
        r#"{"a":{"c":null,"d":true},"b":[{"a":"x\"y","z":1}]}"#
    );
}

#[test]
fn plan_hash_is_stable_across_runs_and_replays() {
    let run = || {
        let world = World::new(vec![cname("shop.example.com", "shops.example.net")]);
        plan_of(&approved(&world).run::<AddSubdomain>(input(&["www", "shop"])))
    };
    let (first, second) = (run(), run());
    assert_eq!(first, second);
    let without_hash = {
        let mut p = first.clone();
        p.as_object_mut().unwrap().remove("planHash");
        p
    };
    assert_eq!(
        first["planHash"],
        sha256_hex(&plan::canonical_json(&without_hash))
    );
}

#[test]
fn approval_publishes_the_plan_under_its_hash_then_applies_one_change() {
    let world = World::new(vec![
        cname("shop.example.com", "shops.example.net"),
        a_alias("api.example.com", CDN),
    ]);
    let report = approved(&world).run::<AddSubdomain>(input(&["www", "shop", "api"]));
    let output: Output = serde_json::from_value(report.output.clone().unwrap()).unwrap();
    let plan = plan_of(&report);

    assert_eq!(
        report.stage_names(),
        ["plan", "approval", "apply", "verify"]
    );
    assert!(
        report
            .stages
            .iter()
            .all(|s| s.status == StageStatus::Succeeded)
    );

    let approvals = report.calls("approvals.await-approval");
    assert_eq!(approvals.len(), 1);
    assert_eq!(approvals[0].request["name"], "plan");
    assert_eq!(approvals[0].request["digest"], plan["planHash"]);
    let payload: Value =
        serde_json::from_str(approvals[0].request["payload"].as_str().unwrap()).unwrap();
    assert_eq!(
        payload, plan,
        "the pending approval is the AddSubdomainPlan"
    );

    let events: Vec<&str> = report.events.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(events, ["SubdomainPlanReady", "SubdomainPlanApproved"]);
    assert_eq!(report.events[0].1, plan);
    assert_eq!(
        report.events[1].1,
        json!({"executionId": "exec-test", "planHash": plan["planHash"]})
    );

    let changes = report.calls("dns.change-records");
    assert_eq!(changes.len(), 1, "one atomic change for every item");
    assert_eq!(
        changes[0].request,
        json!({"zone_id": "Z1", "changes": [
            {"Upsert": a_alias("www.example.com", CDN)},
            {"Delete": cname("shop.example.com", "shops.example.net")},
            {"Upsert": a_alias("shop.example.com", CDN)},
        ]})
    );
    assert_eq!(
        report.calls("convergence.await-converged")[0].request,
        json!({"condition": {"DnsChangeInsync": "C1"}, "timeout_ms": INSYNC_TIMEOUT_MS})
    );
    assert!(output.approval_required);
    assert_eq!(output.change_id.as_deref(), Some("C1"));
    assert_eq!(output.changed, ["www.example.com", "shop.example.com"]);
    assert_eq!(serde_json::to_value(&output.plan).unwrap(), plan);
}

#[test]
fn nothing_changes_before_the_plan_is_approved() {
    let world = World::new(vec![]);
    // No `.approve(...)`: the harness answers the wait with `not-approved` (the host would suspend).
    let report = Harness::new()
        .reply("dns.find-zone", json!({"id": "Z1", "name": "example.com"}))
        .fake("dns.list-records", {
            let records = world.records.clone();
            move |req| {
                Ok(Value::Array(
                    records
                        .borrow()
                        .iter()
                        .filter(|r| r["name"] == req["name"])
                        .cloned()
                        .collect(),
                ))
            }
        })
        .run::<AddSubdomain>(input(&["www"]));
    assert_eq!(report.output.clone().unwrap_err().code, "not-approved");
    assert_eq!(report.stage_names(), ["plan", "approval"]);
    assert!(report.calls("dns.change-records").is_empty());
    let events: Vec<&str> = report.events.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(events, ["SubdomainPlanReady"]);
}

#[test]
fn an_approval_naming_another_plan_changes_nothing() {
    let world = World::new(vec![]);
    let report = world
        .harness()
        .approve("plan", json!({"planHash": "0".repeat(64)}))
        .run::<AddSubdomain>(input(&["www"]));
    let error = report.output.clone().unwrap_err();
    assert_eq!(error.code, "plan-hash-mismatch");
    assert_eq!(
        report.stage("approval").unwrap().status,
        StageStatus::Failed
    );
    assert!(report.calls("dns.change-records").is_empty());
}

#[test]
fn an_approval_echoing_the_hash_is_accepted() {
    let world = World::new(vec![]);
    let expected =
        plan_of(&approved(&world).run::<AddSubdomain>(input(&["www"])))["planHash"].clone();
    let world = World::new(vec![]);
    let report = world
        .harness()
        .approve("plan", json!({"planHash": expected}))
        .run::<AddSubdomain>(input(&["www"]));
    report.output.unwrap();
}

#[test]
fn a_plan_with_nothing_to_change_skips_approval_and_apply() {
    let world = World::new(vec![
        a_alias("www.example.com", CDN),
        a_alias("api.example.com", CDN),
    ]);
    let report = world.harness().run::<AddSubdomain>(input(&["www", "api"]));
    let output: Output = serde_json::from_value(report.output.clone().unwrap()).unwrap();
    assert_eq!(report.stage_names(), ["plan", "verify"]);
    assert!(report.calls("approvals.await-approval").is_empty());
    assert!(report.calls("dns.change-records").is_empty());
    assert!(report.events.is_empty());
    assert!(!output.approval_required);
    assert_eq!(output.change_id, None);
    assert!(output.changed.is_empty());
    assert!(!output.plan.replacement_required);
}

#[test]
fn records_that_changed_after_planning_stop_the_apply() {
    let world = World::new(vec![]);
    let records = world.records.clone();
    let mut listed = 0;
    let report = approved(&world)
        .fake("dns.list-records", move |req| {
            listed += 1;
            // Someone adds a CNAME for www between the plan and the approval.
            if listed == 3 {
                records
                    .borrow_mut()
                    .push(cname("www.example.com", "elsewhere.example.net"));
            }
            Ok(Value::Array(
                records
                    .borrow()
                    .iter()
                    .filter(|r| r["name"] == req["name"])
                    .cloned()
                    .collect(),
            ))
        })
        .run::<AddSubdomain>(input(&["www"]));
    let error = report.output.clone().unwrap_err();
    assert_eq!(error.code, "plan-stale");
    assert!(error.message.contains("www.example.com"));
    assert!(report.calls("dns.change-records").is_empty());
    assert!(report.stage("apply").is_none());
}

#[test]
fn a_change_that_did_not_take_fails_verification() {
    let mut world = World::new(vec![]);
    world.apply_changes = false;
    let report = approved(&world).run::<AddSubdomain>(input(&["www"]));
    let error = report.output.clone().unwrap_err();
    assert_eq!(error.code, "verification-failed");
    assert_eq!(report.stage("verify").unwrap().status, StageStatus::Failed);
}

#[test]
fn one_to_ten_distinct_subdomains_under_the_root() {
    let world = World::new(vec![]);
    let ten: Vec<String> = (1..=10).map(|i| format!("h{i}")).collect();
    let ten: Vec<&str> = ten.iter().map(String::as_str).collect();
    let report = approved(&world).run::<AddSubdomain>(input(&ten));
    assert_eq!(plan_of(&report)["items"].as_array().unwrap().len(), 10);

    let eleven: Vec<String> = (1..=11).map(|i| format!("h{i}")).collect();
    let eleven: Vec<&str> = eleven.iter().map(String::as_str).collect();
    for (bad, why) in [
        (input(&[]), "none"),
        (input(&eleven), "eleven"),
        (input(&["www", "WWW.example.com"]), "duplicate"),
        (input(&["example.com"]), "the apex"),
        (input(&["bad_label"]), "underscore"),
        (input(&["-www"]), "leading hyphen"),
        (input(&[&"a".repeat(64)]), "label too long"),
        (
            json!({"rootDomain": "com", "subdomains": ["www"]}),
            "single-label root",
        ),
        (
            json!({"rootDomain": "example.com", "subdomains": ["www"], "extra": 1}),
            "unknown field",
        ),
        (
            json!({"rootDomain": "example.com", "subdomains": ["www"], "apexAlias": {"dnsName": " ", "hostedZoneId": "Z"}}),
            "empty alias",
        ),
    ] {
        let report = Harness::new().run::<AddSubdomain>(bad);
        assert_eq!(
            report.output.clone().unwrap_err().code,
            "invalid-input",
            "{why}"
        );
        assert!(
            report.journal.is_empty(),
            "{why}: no call before validation"
        );
    }
}

#[test]
fn a_full_hostname_outside_the_root_is_prefixed_not_accepted_as_is() {
    assert_eq!(
        plan::hostname_under("www.example.org", "example.com").unwrap(),
        "www.example.org.example.com"
    );
    assert_eq!(
        plan::hostname_under("Shop.Example.COM.", "example.com").unwrap(),
        "shop.example.com"
    );
}

#[test]
fn the_apex_alias_can_be_given_instead_of_derived() {
    let world = World::new(vec![]);
    let report = approved(&world).run::<AddSubdomain>(json!({
        "rootDomain": "example.com",
        "subdomains": ["www"],
        "apexAlias": {"dnsName": "D9.cdn.sim.capstan.dev.", "hostedZoneId": "ZCDNSIMULATED", "evaluateTargetHealth": true},
    }));
    let plan = plan_of(&report);
    assert_eq!(
        plan["apexAlias"],
        json!({"dnsName": "d9.cdn.sim.capstan.dev", "evaluateTargetHealth": true, "hostedZoneId": "ZCDNSIMULATED"})
    );
    // Given, the apex is not looked up: the only listing is www's (plan, revalidation, verify).
    let listed: Vec<&Value> = report
        .calls("dns.list-records")
        .iter()
        .map(|e| &e.request["name"])
        .collect();
    assert_eq!(
        listed,
        ["www.example.com", "www.example.com", "www.example.com"]
    );
}

#[test]
fn without_an_apex_alias_record_the_target_must_be_given() {
    let world = World::new(vec![]);
    world.records.borrow_mut().clear();
    let report = approved(&world).run::<AddSubdomain>(input(&["www"]));
    assert_eq!(
        report.output.clone().unwrap_err().code,
        "apex-alias-not-found"
    );
    assert_eq!(report.stage("plan").unwrap().status, StageStatus::Failed);
}

#[test]
fn a_root_without_a_zone_fails_permanently() {
    let world = World::new(vec![]);
    let report = approved(&world)
        .run::<AddSubdomain>(json!({"rootDomain": "example.org", "subdomains": ["www"]}));
    let error = report.output.clone().unwrap_err();
    assert_eq!(error.code, "zone-not-found");
    assert!(!error.is_transient());
}

#[test]
fn transient_errors_pause_rather_than_fail() {
    let world = World::new(vec![]);
    let report = approved(&world)
        .fail(
            "convergence.await-converged",
            Error::transient("timeout", "not in sync yet"),
        )
        .run::<AddSubdomain>(input(&["www"]));
    let error = report.output.clone().unwrap_err();
    assert!(error.is_transient());
    assert_eq!(report.stage("apply").unwrap().status, StageStatus::Failed);

    let report = approved(&world)
        .fail("dns.find-zone", Error::transient("throttled", "slow down"))
        .run::<AddSubdomain>(input(&["www"]));
    assert!(report.output.clone().unwrap_err().is_transient());
}

#[test]
fn descriptor_declares_the_stages_and_the_point_of_no_return() {
    let d = capstan_sdk::__private::describe::<AddSubdomain>();
    assert_eq!(d.name, "add-subdomain");
    assert_eq!(d.stages, ["plan", "approval", "apply", "verify"]);
    assert_eq!(d.point_of_no_return.as_deref(), Some("apply"));
    let schema: Value = serde_json::from_str(&d.input_schema).unwrap();
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(schema["properties"]["subdomains"]["minItems"], 1);
    assert_eq!(schema["properties"]["subdomains"]["maxItems"], 10);
    assert_eq!(
        schema["properties"]["subdomains"]["items"]["pattern"],
        r"^[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.?$"
    );
    assert!(schema["properties"]["rootDomain"]["pattern"].is_string());
    assert_eq!(
        schema["required"],
        json!(["rootDomain", "subdomains"]),
        "{schema}"
    );
}
