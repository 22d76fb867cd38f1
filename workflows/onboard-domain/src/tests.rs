//! Harness tests against a small in-memory cloud that behaves like the simulator where the
//! workflow cares (see docs/simulator.md).

use super::*;
use capstan_sdk::cdn::{Distribution, DistributionSpec, DistributionStatus};
use capstan_sdk::certificates::{Certificate, CertificateStatus};
use capstan_sdk::dns::{Change, ChangeReceipt, ChangeStatus, RecordSet, RecordType, Zone};
use capstan_sdk::harness::{Harness, Report, StageStatus};
use capstan_sdk::maps::{ApiKey, ReferrerChange};
use capstan_sdk::registrar::{DomainStatus, Registration};
use capstan_sdk::ticketing::{CommentReceipt, Ticket, TransitionReceipt};
use capstan_sdk::{Value, json};
use std::cell::RefCell;
use std::rc::Rc;

const SCHEMA: &str = include_str!("../../../tests/schemas/domain-onboarding-outcome.schema.json");

const OPS: [&str; 20] = [
    "dns.find-zone",
    "dns.create-zone",
    "dns.list-records",
    "dns.change-records",
    "registrar.check-domain",
    "registrar.register-domain",
    "certificates.find-certificates",
    "certificates.request-certificate",
    "certificates.describe-certificate",
    "certificates.delete-certificate",
    "cdn.find-distribution-by-alias",
    "cdn.get-distribution",
    "cdn.create-distribution",
    "cdn.update-distribution",
    "maps.list-keys",
    "maps.add-referrer",
    "ticketing.get-ticket",
    "ticketing.add-comment",
    "ticketing.transition-ticket",
    "convergence.await-converged",
];

const EFFECTS: [&str; 10] = [
    "dns.create-zone",
    "dns.change-records",
    "registrar.register-domain",
    "certificates.request-certificate",
    "certificates.delete-certificate",
    "cdn.create-distribution",
    "cdn.update-distribution",
    "maps.add-referrer",
    "ticketing.add-comment",
    "ticketing.transition-ticket",
];

#[derive(Default)]
struct World {
    zones: Vec<Zone>,
    records: Vec<(String, RecordSet)>,
    owned: Vec<String>,
    taken: Vec<String>,
    certs: Vec<Certificate>,
    dists: Vec<Distribution>,
    keys: Vec<ApiKey>,
    tickets: Vec<Ticket>,
    faults: Vec<(String, Error)>,
    /// A DNS provider without alias records (RFC 2136).
    no_alias: bool,
    next: u32,
}

fn s(v: &Value, k: &str) -> String {
    v.get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn to<T: serde::Serialize>(v: T) -> Result<Value, Error> {
    Ok(serde_json::to_value(v).unwrap())
}

fn not_found(what: &str) -> Error {
    Error::permanent("not-found", format!("{what} not found"))
}

impl World {
    fn example() -> Self {
        World {
            zones: vec![Zone {
                id: "ZEXAMPLE".into(),
                name: "example.com".into(),
            }],
            keys: vec![
                key("web", "Web key", 10, &["*.other.com/*"]),
                key("app", "App key", 5, &[]),
            ],
            tickets: vec![Ticket {
                id: "OPS-1".into(),
                title: "Onboard example.com".into(),
                status: "open".into(),
                comments: vec![],
            }],
            ..World::default()
        }
    }

    fn id(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }

    fn cert(&mut self, domain: &str, sans: &[&str], status: CertificateStatus) -> String {
        let arn = format!("arn:sim:acm:cert/{}", self.id("c"));
        self.certs.push(Certificate {
            arn: arn.clone(),
            domain: domain.into(),
            subject_alternative_names: sans.iter().map(|s| s.to_string()).collect(),
            status,
            validation_records: vec![],
            issued_at: Some(u64::from(self.next)),
            in_use_by: vec![],
        });
        arn
    }

    fn dist(&mut self, aliases: &[&str], arn: &str) -> String {
        let id = self.id("E");
        self.dists.push(Distribution {
            id: id.clone(),
            domain_name: format!("d{id}.cdn.sim.capstan.dev"),
            hosted_zone_id: "ZCDNSIMULATED".into(),
            spec: DistributionSpec {
                origin: "old.origin".into(),
                aliases: aliases.iter().map(|s| s.to_string()).collect(),
                certificate_arn: Some(arn.into()),
                comment: "pre-existing".into(),
            },
            status: DistributionStatus::Deployed,
        });
        self.attach();
        id
    }

    fn attach(&mut self) {
        for c in &mut self.certs {
            c.in_use_by = self
                .dists
                .iter()
                .filter(|d| d.spec.certificate_arn.as_ref() == Some(&c.arn))
                .map(|d| d.id.clone())
                .collect();
        }
    }

    fn fault(mut self, op: &str, e: Error) -> Self {
        self.faults.push((op.into(), e));
        self
    }

    fn handle(&mut self, op: &str, r: &Value) -> Result<Value, Error> {
        if let Some((_, e)) = self.faults.iter().find(|(o, _)| o == op) {
            return Err(e.clone());
        }
        match op {
            "dns.find-zone" => {
                let d = s(r, "domain");
                to(self
                    .zones
                    .iter()
                    .filter(|z| d == z.name || d.ends_with(&format!(".{}", z.name)))
                    .max_by_key(|z| z.name.len())
                    .cloned())
            }
            "dns.create-zone" => {
                let z = Zone {
                    id: self.id("Z"),
                    name: s(r, "domain"),
                };
                self.zones.push(z.clone());
                to(z)
            }
            "dns.list-records" => {
                let (zone, name) = (s(r, "zone_id"), s(r, "name"));
                to(self
                    .records
                    .iter()
                    .filter(|(z, rs)| *z == zone && rs.name == name)
                    .map(|(_, rs)| rs.clone())
                    .collect::<Vec<_>>())
            }
            "dns.change-records" => {
                let zone = s(r, "zone_id");
                let changes: Vec<Change> = serde_json::from_value(r["changes"].clone()).unwrap();
                let alias = |c: &Change| match c {
                    Change::Upsert(set) | Change::Delete(set) => set.alias_target.is_some(),
                };
                if self.no_alias && changes.iter().any(alias) {
                    return Err(Error::permanent("alias-unsupported", "no alias records"));
                }
                let mut prior = vec![];
                for change in changes {
                    let (set, upsert) = match change {
                        Change::Upsert(set) => (set, true),
                        Change::Delete(set) => (set, false),
                    };
                    let at = self.records.iter().position(|(z, rs)| {
                        *z == zone && rs.name == set.name && rs.type_ == set.type_
                    });
                    if let Some(at) = at {
                        prior.push(self.records.remove(at).1);
                    } else if !upsert {
                        return Err(Error::permanent("invalid-change-batch", "missing set"));
                    }
                    if upsert {
                        self.records.push((zone.clone(), set));
                    }
                }
                let change_id = self.id("C");
                to(ChangeReceipt {
                    change_id,
                    zone_id: zone,
                    status: ChangeStatus::Pending,
                    prior,
                })
            }
            "registrar.check-domain" => {
                let name = s(r, "name");
                let owned = self.owned.contains(&name);
                let registered = owned || self.taken.contains(&name);
                to(DomainStatus {
                    name,
                    registered,
                    owned,
                    available: !registered,
                })
            }
            "registrar.register-domain" => {
                let name = s(r, "name");
                if self.taken.contains(&name) {
                    return Err(Error::permanent("domain-unavailable", "taken"));
                }
                self.owned.push(name.clone());
                to(Registration {
                    name,
                    registration_id: "R1".into(),
                    expires_at: 1,
                })
            }
            "certificates.find-certificates" => {
                let d = s(r, "domain");
                to(self
                    .certs
                    .iter()
                    .filter(|c| steps::covers(c, &d))
                    .cloned()
                    .collect::<Vec<_>>())
            }
            "certificates.request-certificate" => {
                let domain = s(r, "domain");
                let sans: Vec<String> =
                    serde_json::from_value(r["subject_alternative_names"].clone()).unwrap();
                let arn = format!("arn:sim:acm:cert/{}", self.id("new"));
                let validation_records = std::iter::once(&domain)
                    .chain(&sans)
                    .map(|n| RecordSet {
                        name: format!("_capstan-validation.{n}"),
                        type_: RecordType::Cname,
                        ttl: Some(300),
                        values: vec![format!("tok.validations.sim.capstan.dev")],
                        alias_target: None,
                    })
                    .collect();
                let c = Certificate {
                    arn,
                    domain,
                    subject_alternative_names: sans,
                    status: CertificateStatus::PendingValidation,
                    validation_records,
                    issued_at: None,
                    in_use_by: vec![],
                };
                self.certs.push(c.clone());
                to(c)
            }
            "certificates.delete-certificate" => {
                let arn = s(r, "arn");
                let at = self
                    .certs
                    .iter()
                    .position(|c| c.arn == arn)
                    .ok_or_else(|| not_found(&arn))?;
                to(self.certs.remove(at))
            }
            "cdn.find-distribution-by-alias" => {
                let a = s(r, "alias");
                to(self
                    .dists
                    .iter()
                    .find(|d| d.spec.aliases.contains(&a))
                    .cloned())
            }
            "cdn.get-distribution" => {
                let id = s(r, "id");
                to(self
                    .dists
                    .iter()
                    .find(|d| d.id == id)
                    .cloned()
                    .ok_or_else(|| not_found(&id))?)
            }
            "cdn.create-distribution" => {
                let spec: DistributionSpec = serde_json::from_value(r["spec"].clone()).unwrap();
                if self
                    .dists
                    .iter()
                    .any(|d| d.spec.aliases.iter().any(|a| spec.aliases.contains(a)))
                {
                    return Err(Error::permanent("alias-in-use", "alias in use"));
                }
                let id = self.id("E");
                let d = Distribution {
                    domain_name: format!("d{id}.cdn.sim.capstan.dev"),
                    id,
                    hosted_zone_id: "ZCDNSIMULATED".into(),
                    spec,
                    status: DistributionStatus::InProgress,
                };
                self.dists.push(d.clone());
                self.attach();
                to(d)
            }
            "cdn.update-distribution" => {
                let id = s(r, "id");
                let spec: DistributionSpec = serde_json::from_value(r["spec"].clone()).unwrap();
                let d = self
                    .dists
                    .iter_mut()
                    .find(|d| d.id == id)
                    .ok_or_else(|| not_found(&id))?;
                let before = d.clone();
                d.spec = spec;
                let after = d.clone();
                self.attach();
                to(capstan_sdk::cdn::DistributionUpdate { before, after })
            }
            "maps.list-keys" => to(self.keys.clone()),
            "maps.add-referrer" => {
                let (id, referrer) = (s(r, "key_id"), s(r, "referrer"));
                let k = self
                    .keys
                    .iter_mut()
                    .find(|k| k.id == id)
                    .ok_or_else(|| not_found(&id))?;
                if k.referrers.contains(&referrer) {
                    return to(ReferrerChange {
                        key: k.clone(),
                        changed: false,
                    });
                }
                if k.referrers.len() as u32 >= k.capacity {
                    return Err(Error::permanent("capacity-exhausted", "key full"));
                }
                k.referrers.push(referrer);
                to(ReferrerChange {
                    key: k.clone(),
                    changed: true,
                })
            }
            "ticketing.get-ticket" => {
                let id = s(r, "id");
                to(self.tickets.iter().find(|t| t.id == id).cloned())
            }
            "ticketing.add-comment" => {
                let id = s(r, "id");
                let t = self
                    .tickets
                    .iter_mut()
                    .find(|t| t.id == id)
                    .ok_or_else(|| not_found(&id))?;
                t.comments.push(s(r, "body"));
                to(CommentReceipt {
                    ticket_id: id,
                    comment_id: format!("cm{}", t.comments.len()),
                })
            }
            "ticketing.transition-ticket" => {
                let id = s(r, "id");
                let t = self
                    .tickets
                    .iter_mut()
                    .find(|t| t.id == id)
                    .ok_or_else(|| not_found(&id))?;
                let from = std::mem::replace(&mut t.status, s(r, "status"));
                to(TransitionReceipt {
                    ticket_id: id,
                    from,
                    to: t.status.clone(),
                })
            }
            "convergence.await-converged" => {
                if let Some(arn) = r["condition"]
                    .get("CertificateIssued")
                    .and_then(Value::as_str)
                {
                    let c = self.certs.iter_mut().find(|c| c.arn == arn).unwrap();
                    c.status = CertificateStatus::Issued;
                    c.issued_at = Some(99);
                }
                if let Some(id) = r["condition"]
                    .get("DistributionDeployed")
                    .and_then(Value::as_str)
                {
                    let d = self.dists.iter_mut().find(|d| d.id == id).unwrap();
                    d.status = DistributionStatus::Deployed;
                }
                Ok(Value::Null)
            }
            other => panic!("unexpected op {other}"),
        }
    }
}

fn key(id: &str, name: &str, capacity: u32, referrers: &[&str]) -> ApiKey {
    ApiKey {
        id: id.into(),
        display_name: name.into(),
        referrers: referrers.iter().map(|s| s.to_string()).collect(),
        capacity,
    }
}

fn run(world: World, input: Value) -> (Report, Rc<RefCell<World>>) {
    let world = Rc::new(RefCell::new(world));
    let mut harness = Harness::new();
    for op in OPS {
        let w = world.clone();
        harness = harness.fake(op, move |r| w.borrow_mut().handle(op, r));
    }
    (harness.run::<OnboardDomain>(input), world)
}

fn outcome(report: &Report) -> DomainOnboardingOutcome {
    let output = report.output.as_ref().expect("the run succeeds");
    validate(
        &serde_json::from_str(SCHEMA).unwrap(),
        &output["outcome"],
        "outcome",
    );
    serde_json::from_value(output["outcome"].clone()).unwrap()
}

fn effects(report: &Report) -> Vec<&str> {
    report
        .journal
        .iter()
        .map(|e| e.op.as_str())
        .filter(|op| EFFECTS.contains(op))
        .collect()
}

/// A small JSON Schema checker for the keywords the outcome schema uses.
fn validate(schema: &Value, v: &Value, at: &str) {
    let root: Value = serde_json::from_str(SCHEMA).unwrap();
    let schema = match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => &root["$defs"][r.trim_start_matches("#/$defs/")],
        None => schema,
    };
    let kind = schema["type"].as_str().unwrap_or("any");
    let ok = match kind {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_u64() || v.is_i64(),
        _ => true,
    };
    assert!(ok, "{at}: expected {kind}, got {v}");
    if let Some(values) = schema["enum"].as_array() {
        assert!(values.contains(v), "{at}: {v} not in {values:?}");
    }
    if let Some(min) = schema["minLength"].as_u64() {
        assert!(v.as_str().unwrap().len() as u64 >= min, "{at}: too short");
    }
    if let Some(min) = schema["minimum"].as_i64() {
        assert!(v.as_i64().unwrap() >= min, "{at}: below minimum");
    }
    if let Some(items) = schema.get("items") {
        for (i, item) in v.as_array().unwrap().iter().enumerate() {
            validate(items, item, &format!("{at}[{i}]"));
        }
    }
    if kind == "object" {
        let props = schema["properties"].as_object().unwrap();
        for required in schema["required"].as_array().into_iter().flatten() {
            let name = required.as_str().unwrap();
            assert!(v.get(name).is_some(), "{at}: missing {name}");
        }
        for (name, value) in v.as_object().unwrap() {
            let Some(sub) = props.get(name) else {
                panic!("{at}: extra property {name}")
            };
            validate(sub, value, &format!("{at}.{name}"));
        }
    }
}

#[test]
fn onboards_a_new_domain_end_to_end() {
    let (report, world) = run(
        World::example(),
        json!({"domain": "  Example.COM ", "ticketId": " ops-1 "}),
    );
    assert_eq!(report.stage_names(), STAGES);
    assert!(
        report
            .stages
            .iter()
            .all(|s| s.status == StageStatus::Succeeded)
    );
    let o = outcome(&report);
    assert_eq!(o.status, STATUS_ONBOARDED);
    assert_eq!(o.execution_id, "exec-test");
    assert_eq!(o.workflow_run_id.as_deref(), Some("run-test"));
    assert_eq!(o.domain.name, "example.com");
    assert_eq!(o.domain.state, DomainState::Registered);
    assert_eq!(o.certificate.state, CertificateState::Created);
    assert_eq!(o.distributions.proxy.state, DistributionState::Created);
    assert_eq!(o.distributions.cms.state, DistributionState::Created);
    assert_eq!(o.cleanup.state, CleanupState::NotRequired);
    assert_eq!(o.maps_provider.outcome, MapsState::Updated);
    assert_eq!(o.maps_provider.remaining_root_domains, Some(4));
    assert_eq!(o.ticketing.state, TicketState::Updated);
    assert_eq!(o.ticketing.ticket_id.as_deref(), Some("OPS-1"));
    assert!(!o.assistance.required);

    // The certificate covers every alias and was validated through the zone.
    let request = &report.calls("certificates.request-certificate")[0].request;
    assert_eq!(
        request,
        &json!({"domain": "example.com", "subject_alternative_names": ["www.example.com", "cms.example.com"]})
    );
    let changes = report.calls("dns.change-records");
    assert_eq!(changes.len(), 2, "validation records, then routing");
    assert_eq!(changes[0].request["changes"].as_array().unwrap().len(), 3);
    let routed: Vec<&str> = changes[1].request["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["Upsert"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        routed,
        ["example.com", "www.example.com", "cms.example.com"]
    );

    let w = world.borrow();
    assert_eq!(w.tickets[0].status, steps::TICKET_DONE);
    assert!(w.tickets[0].comments[0].contains("example.com"));
    assert!(
        w.keys
            .iter()
            .all(|k| k.referrers.contains(&"*.example.com/*".to_owned()))
    );
    assert_eq!(report.events.len(), 1);
    assert_eq!(report.events[0].0, "DomainOnboarded");
    assert_eq!(
        report.events[0].1,
        report.output.as_ref().unwrap()["outcome"]
    );
}

#[test]
fn adopts_what_exists_and_skips_cms_and_ticket() {
    let mut world = World::example();
    world.owned.push("example.com".into());
    let arn = world.cert("example.com", &["*.example.com"], CertificateStatus::Issued);
    world.keys = vec![key("web", "Web key", 3, &["*.example.com/*"])];
    let (report, _) = run(world, json!({"domain": "example.com", "isCms": false}));
    let o = outcome(&report);
    assert_eq!(o.status, STATUS_ONBOARDED);
    assert_eq!(o.domain.state, DomainState::AlreadyRegistered);
    assert_eq!(o.certificate.state, CertificateState::Adopted);
    assert_eq!(o.certificate.arn.as_deref(), Some(arn.as_str()));
    assert_eq!(o.certificate.id.as_deref(), Some("c1"));
    assert_eq!(o.distributions.cms.state, DistributionState::NotCreated);
    assert_eq!(o.distributions.cms.id, None);
    assert_eq!(o.maps_provider.outcome, MapsState::AlreadyPresent);
    assert_eq!(o.maps_provider.keys[0].state, KeyState::AlreadyPresent);
    assert_eq!(o.ticketing.state, TicketState::NotRequested);
    assert!(report.calls("registrar.register-domain").is_empty());
    assert!(report.calls("certificates.request-certificate").is_empty());
    assert!(report.calls("maps.add-referrer").is_empty());
    assert!(report.calls("ticketing.get-ticket").is_empty());
}

#[test]
fn a_second_run_adopts_everything_and_changes_nothing() {
    let (first, world) = run(World::example(), json!({"domain": "example.com"}));
    outcome(&first);
    let world = Rc::try_unwrap(world).ok().unwrap().into_inner();
    let (report, _) = run(world, json!({"domain": "example.com"}));
    let o = outcome(&report);
    assert_eq!(o.domain.state, DomainState::AlreadyRegistered);
    assert_eq!(o.certificate.state, CertificateState::Adopted);
    assert_eq!(o.distributions.proxy.state, DistributionState::Adopted);
    assert_eq!(o.distributions.cms.state, DistributionState::Adopted);
    assert_eq!(o.maps_provider.outcome, MapsState::AlreadyPresent);
    assert_eq!(effects(&report), Vec::<&str>::new());
}

#[test]
fn a_full_maps_key_asks_the_platform_for_help_without_failing() {
    let mut world = World::example();
    world
        .keys
        .push(key("full", "Full key", 1, &["*.taken.com/*"]));
    let (report, world) = run(world, json!({"domain": "example.com", "ticketId": "OPS-1"}));
    let o = outcome(&report);
    assert_eq!(o.status, STATUS_ASSISTANCE_REQUIRED);
    assert_eq!(o.maps_provider.outcome, MapsState::ManualRequired);
    assert_eq!(o.maps_provider.remaining_root_domains, Some(0));
    let states: Vec<KeyState> = o.maps_provider.keys.iter().map(|k| k.state).collect();
    assert_eq!(
        states,
        [
            KeyState::Updated,
            KeyState::Updated,
            KeyState::CapacityExhausted
        ]
    );
    assert!(o.assistance.required);
    let reason = &o.assistance.reasons[0];
    assert_eq!(reason.audience, Audience::Platform);
    assert_eq!(reason.code, "maps-capacity-exhausted");
    assert_eq!(reason.resources.as_deref(), Some(&["full".to_owned()][..]));
    assert_eq!(o.ticketing.state, TicketState::Updated);
    assert_eq!(world.borrow().tickets[0].status, steps::TICKET_WAITING);
}

#[test]
fn another_maps_error_marks_the_key_failed() {
    let world = World::example().fault(
        "maps.add-referrer",
        Error::permanent("injected-fault", "boom"),
    );
    let (report, _) = run(world, json!({"domain": "example.com"}));
    let o = outcome(&report);
    assert_eq!(o.maps_provider.outcome, MapsState::ManualRequired);
    assert!(
        o.maps_provider
            .keys
            .iter()
            .all(|k| k.state == KeyState::Failed)
    );
    assert_eq!(o.assistance.reasons[0].code, "maps-referrer-failed");
}

#[test]
fn a_missing_ticket_is_left_to_the_requester() {
    let (report, _) = run(
        World::example(),
        json!({"domain": "example.com", "ticketId": "OPS-404"}),
    );
    let o = outcome(&report);
    assert_eq!(o.status, STATUS_ASSISTANCE_REQUIRED);
    assert_eq!(o.ticketing.state, TicketState::ManualRequired);
    assert_eq!(o.ticketing.ticket_id.as_deref(), Some("OPS-404"));
    assert!(o.ticketing.intended_action.is_some());
    let reason = o.assistance.reasons.last().unwrap();
    assert_eq!(
        (reason.audience, reason.code.as_str()),
        (Audience::Requester, "ticket-not-found")
    );
    assert!(report.calls("ticketing.add-comment").is_empty());
}

#[test]
fn a_dry_run_only_reads_and_says_what_it_would_do() {
    let (report, world) = run(
        World::example(),
        json!({"domain": "example.com", "ticketId": "OPS-1", "options": {"dryRun": true}}),
    );
    assert_eq!(effects(&report), Vec::<&str>::new());
    assert!(report.events.is_empty(), "no DomainOnboarded for a dry run");
    let o = outcome(&report);
    assert_eq!(o.status, STATUS_DRY_RUN);
    assert!(!o.assistance.required);
    assert_eq!(o.domain.state, DomainState::NotRegistered);
    assert_eq!(o.certificate.state, CertificateState::NotCreated);
    assert_eq!(o.distributions.proxy.state, DistributionState::NotCreated);
    assert_eq!(o.distributions.cms.state, DistributionState::NotCreated);
    assert_eq!(o.cleanup.state, CleanupState::NotReached);
    assert_eq!(o.maps_provider.outcome, MapsState::NotReached);
    assert_eq!(o.ticketing.state, TicketState::NotReached);
    let codes: Vec<&str> = o
        .assistance
        .reasons
        .iter()
        .map(|r| r.code.as_str())
        .collect();
    assert_eq!(
        codes,
        [
            "would-register-domain",
            "would-request-certificate",
            "would-create-distribution",
            "would-create-distribution",
            "would-route-dns",
            "would-whitelist-referrer"
        ]
    );
    assert!(world.borrow().tickets[0].comments.is_empty());
}

#[test]
fn a_dry_run_reports_unknown_where_a_read_fails() {
    let fault = || Error::permanent("injected-fault", "no answer");
    let world = World::example()
        .fault("registrar.check-domain", fault())
        .fault("certificates.find-certificates", fault())
        .fault("cdn.find-distribution-by-alias", fault())
        .fault("maps.list-keys", fault());
    let (report, _) = run(
        world,
        json!({"domain": "example.com", "options": {"dryRun": true, "skipReadinessCheck": true}}),
    );
    let o = outcome(&report);
    assert_eq!(o.domain.state, DomainState::Unknown);
    assert_eq!(o.certificate.state, CertificateState::Unknown);
    assert_eq!(o.distributions.proxy.state, DistributionState::Unknown);
    assert_eq!(o.distributions.cms.state, DistributionState::Unknown);
    assert_eq!(o.maps_provider.outcome, MapsState::NotReached);
    assert_eq!(effects(&report), Vec::<&str>::new());
}

#[test]
fn updates_an_existing_distribution_and_keeps_the_certificate_it_replaced() {
    let mut world = World::example();
    world.owned.push("example.com".into());
    let old = world.cert("example.com", &[], CertificateStatus::Issued);
    let id = world.dist(&["example.com"], &old);
    let (report, world) = run(world, json!({"domain": "example.com", "isCms": false}));
    let o = outcome(&report);
    assert_eq!(o.distributions.proxy.state, DistributionState::Updated);
    assert_eq!(o.distributions.proxy.id.as_deref(), Some(id.as_str()));
    assert_eq!(o.certificate.state, CertificateState::Created);
    assert_eq!(o.cleanup.state, CleanupState::ManualRequired);
    assert_eq!(o.cleanup.certificate_arn.as_deref(), Some(old.as_str()));
    assert_eq!(o.cleanup.remaining_attachments, Some(vec![]));
    assert_eq!(o.status, STATUS_ASSISTANCE_REQUIRED);
    assert!(report.calls("certificates.delete-certificate").is_empty());
    let w = world.borrow();
    assert_eq!(w.dists[0].spec.origin, "old.origin", "the origin is kept");
    assert_eq!(w.dists[0].spec.aliases, ["example.com", "www.example.com"]);
}

#[test]
fn a_certificate_still_attached_elsewhere_is_reported_with_its_attachments() {
    let mut world = World::example();
    let old = world.cert("example.com", &[], CertificateStatus::Issued);
    let other = world.dist(&["legacy.example.com"], &old);
    let (report, _) = run(world, json!({"domain": "example.com"}));
    let o = outcome(&report);
    assert_eq!(o.cleanup.state, CleanupState::ManualRequired);
    assert_eq!(o.cleanup.remaining_attachments, Some(vec![other]));
}

#[test]
fn unused_leftover_certificates_are_deleted() {
    let mut world = World::example();
    let stale = world.cert("example.com", &[], CertificateStatus::PendingValidation);
    let (report, world) = run(world, json!({"domain": "example.com"}));
    let o = outcome(&report);
    assert_eq!(o.cleanup.state, CleanupState::Completed);
    assert_eq!(o.cleanup.certificate_arn.as_deref(), Some(stale.as_str()));
    assert!(!world.borrow().certs.iter().any(|c| c.arn == stale));
}

#[test]
fn cleanup_reports_already_clean_and_unknown() {
    let mut world = World::example();
    world.cert("example.com", &[], CertificateStatus::Failed);
    let world = world.fault(
        "certificates.delete-certificate",
        Error::permanent("not-found", "gone"),
    );
    let (report, _) = run(world, json!({"domain": "example.com"}));
    assert_eq!(outcome(&report).cleanup.state, CleanupState::AlreadyClean);

    let mut world = World::example();
    world.cert("example.com", &[], CertificateStatus::Failed);
    let world = world.fault(
        "certificates.delete-certificate",
        Error::permanent("injected-fault", "no"),
    );
    let (report, _) = run(world, json!({"domain": "example.com"}));
    let o = outcome(&report);
    assert_eq!(o.cleanup.state, CleanupState::Unknown);
    assert_eq!(o.assistance.reasons[0].code, "cleanup-status-unknown");
}

#[test]
fn the_override_domain_lends_its_newest_certificate() {
    let mut world = World::example();
    world.cert(
        "brand.net",
        &["example.com", "*.example.com"],
        CertificateStatus::Issued,
    );
    let newest = world.cert(
        "brand.net",
        &["example.com", "*.example.com"],
        CertificateStatus::Issued,
    );
    let (report, _) = run(
        world,
        json!({"domain": "example.com", "recentCertOverrideDomain": " Brand.NET "}),
    );
    let o = outcome(&report);
    assert_eq!(o.certificate.state, CertificateState::Adopted);
    assert_eq!(o.certificate.arn.as_deref(), Some(newest.as_str()));
    assert_eq!(
        report.calls("certificates.find-certificates")[0].request,
        json!({"domain": "brand.net"})
    );

    let (report, _) = run(
        World::example(),
        json!({"domain": "example.com", "recentCertOverrideDomain": "brand.net"}),
    );
    let error = report.output.as_ref().unwrap_err();
    assert_eq!(error.code, "override-certificate-not-found");
    assert_eq!(
        report.stage("certificate").unwrap().status,
        StageStatus::Failed
    );
}

#[test]
fn readiness_needs_a_zone_unless_skipped() {
    let mut world = World::example();
    world.zones.clear();
    let (report, _) = run(world, json!({"domain": "example.com"}));
    assert_eq!(report.output.as_ref().unwrap_err().code, "zone-not-found");
    assert_eq!(report.stage_names(), ["readiness"]);

    let mut world = World::example();
    world.zones.clear();
    let (report, _) = run(
        world,
        json!({"domain": "example.com", "options": {"skipReadinessCheck": true}}),
    );
    outcome(&report);
    assert_eq!(report.calls("dns.create-zone").len(), 1);
    assert!(report.calls("registrar.check-domain").len() == 1);
}

#[test]
fn a_domain_registered_by_someone_else_fails_early() {
    let mut world = World::example();
    world.taken.push("example.com".into());
    let (report, _) = run(world, json!({"domain": "example.com"}));
    assert_eq!(
        report.output.as_ref().unwrap_err().code,
        "domain-unavailable"
    );
    assert_eq!(
        report.stage("readiness").unwrap().status,
        StageStatus::Failed
    );
}

#[test]
fn a_cname_in_the_way_is_replaced_in_the_same_change() {
    let mut world = World::example();
    world.records.push((
        "ZEXAMPLE".into(),
        RecordSet {
            name: "www.example.com".into(),
            type_: RecordType::Cname,
            ttl: Some(300),
            values: vec!["origin.example.net".into()],
            alias_target: None,
        },
    ));
    let (report, _) = run(world, json!({"domain": "example.com", "isCms": false}));
    outcome(&report);
    let routing = &report.calls("dns.change-records")[1].request["changes"];
    assert_eq!(routing[1]["Delete"]["name"], "www.example.com");
    assert_eq!(routing[2]["Upsert"]["name"], "www.example.com");
}

#[test]
fn without_alias_records_names_below_the_apex_get_cnames_and_the_apex_is_for_the_platform() {
    let mut world = World {
        no_alias: true,
        ..World::example()
    };
    let set = |name: &str, type_, value: &str| {
        (
            "ZEXAMPLE".to_owned(),
            RecordSet {
                name: name.into(),
                type_,
                ttl: Some(60),
                values: vec![value.into()],
                alias_target: None,
            },
        )
    };
    world
        .records
        .push(set("www.example.com", RecordType::A, "192.0.2.1"));
    world
        .records
        .push(set("cms.example.com", RecordType::Txt, "keep me"));
    let (report, world) = run(world, json!({"domain": "example.com", "ticketId": "OPS-1"}));
    let o = outcome(&report);
    assert_eq!(o.status, STATUS_ASSISTANCE_REQUIRED);
    let manual: Vec<_> = o
        .assistance
        .reasons
        .iter()
        .filter(|r| r.code == "route-manually")
        .collect();
    assert_eq!(manual.len(), 2, "{:?}", o.assistance.reasons);
    assert!(manual.iter().all(|r| r.audience == Audience::Platform));
    let named: Vec<_> = manual
        .iter()
        .flat_map(|r| r.resources.clone().unwrap())
        .collect();
    assert_eq!(named, ["example.com", "cms.example.com"]);
    assert!(
        manual[0].action.contains(".cdn.sim.capstan.dev"),
        "{:?}",
        manual[1]
    );

    // www's address record gave way to a CNAME at the proxy distribution, in one change.
    let w = world.borrow();
    let www: Vec<_> = w
        .records
        .iter()
        .filter(|(_, r)| r.name == "www.example.com")
        .map(|(_, r)| r)
        .collect();
    assert_eq!(www.len(), 1, "{www:?}");
    assert_eq!(www[0].type_, RecordType::Cname);
    let proxy = w
        .dists
        .iter()
        .find(|d| d.spec.aliases.contains(&"www.example.com".to_owned()))
        .unwrap();
    assert_eq!(www[0].values, std::slice::from_ref(&proxy.domain_name));
    assert!(
        w.records
            .iter()
            .any(|(_, r)| r.name == "cms.example.com" && r.type_ == RecordType::Txt),
        "other data stays"
    );
    let routing = report.stage("routing").unwrap();
    assert_eq!(routing.status, StageStatus::Succeeded);
    drop(w);

    // A second run finds www routed and asks for the rest again without changing anything.
    let world = Rc::try_unwrap(world).ok().unwrap().into_inner();
    let before: Vec<RecordSet> = world.records.iter().map(|(_, r)| r.clone()).collect();
    let (again, world) = run(world, json!({"domain": "example.com"}));
    assert_eq!(outcome(&again).status, STATUS_ASSISTANCE_REQUIRED);
    assert_eq!(
        again.calls("dns.change-records").len(),
        1,
        "only the refused alias attempt"
    );
    let after: Vec<RecordSet> = world
        .borrow()
        .records
        .iter()
        .map(|(_, r)| r.clone())
        .collect();
    assert_eq!(after, before);
}

#[test]
fn a_failed_verification_fails_the_finalize_stage() {
    let world = World::example().fault(
        "cdn.get-distribution",
        Error::permanent("injected-fault", "no"),
    );
    let (report, _) = run(world, json!({"domain": "example.com"}));
    assert!(report.output.is_err());
    assert_eq!(
        report.stage("finalize").unwrap().status,
        StageStatus::Failed
    );
    assert!(report.events.is_empty());
}

#[test]
fn a_transient_error_is_returned_for_a_pause() {
    let world =
        World::example().fault("maps.list-keys", Error::transient("throttled", "slow down"));
    let (report, _) = run(world, json!({"domain": "example.com"}));
    assert!(report.output.as_ref().unwrap_err().is_transient());
}

#[test]
fn input_is_checked_and_normalized() {
    for bad in [
        json!({"domain": "example.com", "extra": 1}),
        json!({"domain": "example.com", "options": {"fast": true}}),
        json!({"domain": "   "}),
        json!({"domain": "not a domain"}),
        json!({"domain": "example.com", "ticketId": "  "}),
        json!({}),
    ] {
        let (report, _) = run(World::example(), bad.clone());
        assert_eq!(
            report.output.as_ref().unwrap_err().code,
            "invalid-input",
            "{bad}"
        );
        assert!(report.stages.is_empty());
    }
}

#[test]
fn the_published_input_schema_matches_the_contract() {
    let d = capstan_sdk::__private::describe::<OnboardDomain>();
    let schema: Value = serde_json::from_str(&d.input_schema).unwrap();
    let p = &schema["properties"];
    assert_eq!(schema["additionalProperties"], json!(false));
    assert_eq!(schema["required"], json!(["domain"]));
    assert_eq!(p["domain"]["minLength"], 1);
    assert_eq!(p["ticketId"]["type"], "string");
    assert_eq!(p["ticketId"]["minLength"], 1);
    assert_eq!(p["recentCertOverrideDomain"]["minLength"], 1);
    assert_eq!(p["isCms"]["default"], true);
    let recovery: Vec<(String, String)> = d
        .recovery_operations
        .iter()
        .map(|r| (r.name.clone(), r.from_stage.clone()))
        .collect();
    assert_eq!(
        recovery,
        [
            ("retry-finalization".into(), "finalize".into()),
            ("retry-maps-whitelist".into(), "maps-whitelist".into())
        ]
    );
    println!("{}", serde_json::to_string_pretty(&schema).unwrap());
}
