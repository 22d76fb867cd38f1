//! The stages of `onboard-domain`, one function each, and the small rules they share.

use crate::Input;
use crate::outcome::*;
use capstan_sdk::cdn::{Distribution, DistributionSpec};
use capstan_sdk::certificates::{Certificate, CertificateStatus};
use capstan_sdk::convergence::Condition;
use capstan_sdk::dns::{AliasTarget, Change, RecordSet, RecordType, Zone};
use capstan_sdk::{Ctx, Error};
use serde::Serialize;

const CERTIFICATE_TIMEOUT_MS: u64 = 30 * 60 * 1000;
const DNS_TIMEOUT_MS: u64 = 10 * 60 * 1000;
const DEPLOY_TIMEOUT_MS: u64 = 30 * 60 * 1000;
/// Where the proxy and CMS distributions send traffic.
pub const PROXY_ORIGIN: &str = "proxy.origin.capstan.dev";
pub const CMS_ORIGIN: &str = "cms.origin.capstan.dev";
/// Ticket statuses the workflow moves a ticket to.
pub const TICKET_DONE: &str = "resolved";
pub const TICKET_WAITING: &str = "pending-assistance";

/// The normalized request.
#[derive(Debug, Clone)]
pub struct Request {
    pub domain: String,
    pub www: String,
    /// `cms.<domain>` when the domain gets a CMS distribution.
    pub cms: Option<String>,
    pub ticket_id: Option<String>,
    pub override_domain: Option<String>,
    pub skip_readiness: bool,
    pub dry_run: bool,
}

fn invalid(message: String) -> Error {
    Error::permanent("invalid-input", message)
}

/// Trimmed, lowercased, without a trailing dot, and made of DNS labels.
fn domain_name(field: &str, raw: &str) -> Result<String, Error> {
    let name = raw.trim().trim_end_matches('.').to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if name.len() > 253 || !name.contains('.') || !name.split('.').all(label_ok) {
        return Err(invalid(format!("{field} `{raw}` is not a domain name")));
    }
    Ok(name)
}

impl Request {
    pub fn new(input: Input) -> Result<Self, Error> {
        let domain = domain_name("domain", &input.domain)?;
        let ticket_id = match input.ticket_id.as_deref().map(str::trim) {
            Some("") => return Err(invalid("ticketId must not be empty".into())),
            other => other.map(str::to_ascii_uppercase),
        };
        let override_domain = match input.recent_cert_override_domain {
            Some(other) => Some(domain_name("recentCertOverrideDomain", &other)?),
            None => None,
        };
        Ok(Self {
            www: format!("www.{domain}"),
            cms: input.is_cms.then(|| format!("cms.{domain}")),
            domain,
            ticket_id,
            override_domain,
            skip_readiness: input.options.skip_readiness_check,
            dry_run: input.options.dry_run,
        })
    }

    /// Every name the certificate must cover: the domain first.
    pub fn certificate_names(&self) -> Vec<String> {
        let mut names = vec![self.domain.clone(), self.www.clone()];
        names.extend(self.cms.clone());
        names
    }

    pub fn proxy_aliases(&self) -> Vec<String> {
        vec![self.domain.clone(), self.www.clone()]
    }

    /// The maps referrer that whitelists the root domain and its subdomains.
    pub fn referrer(&self) -> String {
        format!("*.{}/*", self.domain)
    }
}

/// A permanent read failure in a dry run is reported, not raised.
fn tolerated(req: &Request, e: &Error) -> bool {
    req.dry_run && !e.is_transient()
}

fn would(code: &str, action: String, message: String) -> Reason {
    Reason::new(Audience::Requester, code, action, message)
}

// ---------------------------------------------------------------------------------------------
// 1. readiness

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Readiness {
    pub zone: Option<Zone>,
    pub checked: bool,
}

pub fn readiness(ctx: &mut Ctx, req: &Request) -> Result<Readiness, Error> {
    let zone = ctx.dns().find_zone(&req.domain)?;
    if req.skip_readiness {
        return Ok(Readiness {
            zone,
            checked: false,
        });
    }
    if zone.is_none() {
        return Err(Error::permanent(
            "zone-not-found",
            format!(
                "no hosted zone serves {}; create it, or set options.skipReadinessCheck",
                req.domain
            ),
        ));
    }
    let status = ctx.registrar().check_domain(&req.domain)?;
    if status.registered && !status.owned {
        return Err(unavailable(&req.domain));
    }
    Ok(Readiness {
        zone,
        checked: true,
    })
}

fn unavailable(domain: &str) -> Error {
    Error::permanent(
        "domain-unavailable",
        format!("{domain} is registered to someone else"),
    )
}

// ---------------------------------------------------------------------------------------------
// 2. registration

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Registration {
    pub state: DomainState,
    pub zone: Option<Zone>,
    pub reasons: Vec<Reason>,
}

pub fn registration(ctx: &mut Ctx, req: &Request, ready: Readiness) -> Result<Registration, Error> {
    let mut reasons = Vec::new();
    let state = match ctx.registrar().check_domain(&req.domain) {
        Ok(status) if status.owned => DomainState::AlreadyRegistered,
        Ok(status) if status.registered => return Err(unavailable(&req.domain)),
        Ok(_) if req.dry_run => {
            reasons.push(would(
                "would-register-domain",
                format!("register {} for one year", req.domain),
                format!("{} is available and would be registered", req.domain),
            ));
            DomainState::NotRegistered
        }
        Ok(_) => {
            ctx.registrar().register_domain(&req.domain, 1)?;
            DomainState::Registered
        }
        Err(e) if tolerated(req, &e) => {
            reasons.push(Reason::new(
                Audience::Platform,
                "domain-status-unknown",
                "check the registrar",
                format!(
                    "the registrar could not tell the status of {}: {}",
                    req.domain, e.message
                ),
            ));
            DomainState::Unknown
        }
        Err(e) => return Err(e),
    };
    let zone = match ready.zone {
        Some(zone) => Some(zone),
        None if req.dry_run => {
            reasons.push(would(
                "would-create-zone",
                format!("create a hosted zone for {}", req.domain),
                format!("no hosted zone serves {}", req.domain),
            ));
            None
        }
        None => Some(ctx.dns().create_zone(&req.domain)?),
    };
    Ok(Registration {
        state,
        zone,
        reasons,
    })
}

// ---------------------------------------------------------------------------------------------
// 3. certificate

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateStep {
    pub state: CertificateState,
    pub arn: Option<String>,
    pub reasons: Vec<Reason>,
}

/// Whether `cert` names `name`: exactly, or by a wildcard one label up.
pub fn covers(cert: &Certificate, name: &str) -> bool {
    std::iter::once(&cert.domain)
        .chain(&cert.subject_alternative_names)
        .any(|n| {
            n.eq_ignore_ascii_case(name)
                || n.strip_prefix("*.").is_some_and(|parent| {
                    name.split_once('.')
                        .is_some_and(|(_, rest)| rest.eq_ignore_ascii_case(parent))
                })
        })
}

/// The most recently issued certificate covering every name.
fn newest_covering<'a>(certs: &'a [Certificate], names: &[String]) -> Option<&'a Certificate> {
    certs
        .iter()
        .filter(|c| c.status == CertificateStatus::Issued && names.iter().all(|n| covers(c, n)))
        .max_by_key(|c| c.issued_at.unwrap_or(0))
}

pub fn certificate(
    ctx: &mut Ctx,
    req: &Request,
    zone: Option<&Zone>,
) -> Result<CertificateStep, Error> {
    let names = req.certificate_names();
    let adopted = |c: &Certificate| CertificateStep {
        state: CertificateState::Adopted,
        arn: Some(c.arn.clone()),
        reasons: Vec::new(),
    };
    let unknown = |e: Error| CertificateStep {
        state: CertificateState::Unknown,
        arn: None,
        reasons: vec![Reason::new(
            Audience::Platform,
            "certificate-status-unknown",
            "check the certificate provider",
            format!("certificates could not be listed: {}", e.message),
        )],
    };
    let source = req.override_domain.as_deref().unwrap_or(&req.domain);
    let found = match ctx.certificates().find_certificates(source) {
        Ok(found) => found,
        Err(e) if tolerated(req, &e) => return Ok(unknown(e)),
        Err(e) => return Err(e),
    };
    if let Some(cert) = newest_covering(&found, &names) {
        return Ok(adopted(cert));
    }
    if let Some(other) = &req.override_domain {
        return Err(Error::permanent(
            "override-certificate-not-found",
            format!(
                "{other} has no issued certificate covering {}",
                names.join(", ")
            ),
        ));
    }
    if req.dry_run {
        return Ok(CertificateStep {
            state: CertificateState::NotCreated,
            arn: None,
            reasons: vec![
                would(
                    "would-request-certificate",
                    format!("request a certificate for {}", names.join(", ")),
                    format!("no issued certificate covers {}", names.join(", ")),
                )
                .on(names.clone()),
            ],
        });
    }
    let zone = zone.ok_or_else(|| Error::permanent("zone-not-found", "no zone to validate in"))?;
    let cert = ctx
        .certificates()
        .request_certificate(&req.domain, &names[1..])?;
    let validation: Vec<Change> = cert
        .validation_records
        .iter()
        .cloned()
        .map(Change::Upsert)
        .collect();
    if !validation.is_empty() {
        ctx.dns().change_records(&zone.id, &validation)?;
    }
    ctx.convergence().await_converged(
        &Condition::CertificateIssued(cert.arn.clone()),
        CERTIFICATE_TIMEOUT_MS,
    )?;
    Ok(CertificateStep {
        state: CertificateState::Created,
        arn: Some(cert.arn),
        reasons: Vec::new(),
    })
}

// ---------------------------------------------------------------------------------------------
// 4. distributions

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DistributionStep {
    pub state: DistributionState,
    pub id: Option<String>,
    pub aliases: Vec<String>,
    /// The alias target (`d123.cdn...`, zone) once the distribution exists.
    pub target: Option<AliasTarget>,
    /// The certificate an update replaced.
    pub superseded_certificate: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DistributionsStep {
    pub proxy: DistributionStep,
    pub cms: DistributionStep,
    pub reasons: Vec<Reason>,
}

impl DistributionsStep {
    fn both(&self) -> [&DistributionStep; 2] {
        [&self.proxy, &self.cms]
    }
}

fn target_of(d: &Distribution) -> AliasTarget {
    AliasTarget {
        dns_name: d.domain_name.clone(),
        hosted_zone_id: d.hosted_zone_id.clone(),
        evaluate_target_health: false,
    }
}

pub fn distributions(
    ctx: &mut Ctx,
    req: &Request,
    cert: &CertificateStep,
) -> Result<DistributionsStep, Error> {
    let mut reasons = Vec::new();
    let proxy = distribution(
        ctx,
        req,
        "proxy",
        PROXY_ORIGIN,
        req.proxy_aliases(),
        cert,
        &mut reasons,
    )?;
    let cms = match &req.cms {
        Some(cms) => distribution(
            ctx,
            req,
            "cms",
            CMS_ORIGIN,
            vec![cms.clone()],
            cert,
            &mut reasons,
        )?,
        None => DistributionStep {
            state: DistributionState::NotCreated,
            id: None,
            aliases: Vec::new(),
            target: None,
            superseded_certificate: None,
        },
    };
    Ok(DistributionsStep {
        proxy,
        cms,
        reasons,
    })
}

/// Creates, updates or adopts the distribution that holds `aliases[0]`.
fn distribution(
    ctx: &mut Ctx,
    req: &Request,
    role: &str,
    origin: &str,
    aliases: Vec<String>,
    cert: &CertificateStep,
    reasons: &mut Vec<Reason>,
) -> Result<DistributionStep, Error> {
    let mut step = DistributionStep {
        state: DistributionState::NotCreated,
        id: None,
        aliases: aliases.clone(),
        target: None,
        superseded_certificate: None,
    };
    let existing = match ctx.cdn().find_distribution_by_alias(&aliases[0]) {
        Ok(existing) => existing,
        Err(e) if tolerated(req, &e) => {
            reasons.push(Reason::new(
                Audience::Platform,
                "distribution-status-unknown",
                "check the CDN",
                format!(
                    "the {role} distribution could not be looked up: {}",
                    e.message
                ),
            ));
            step.state = DistributionState::Unknown;
            return Ok(step);
        }
        Err(e) => return Err(e),
    };
    let arn = cert.arn.clone();
    if let Some(d) = &existing {
        step.id = Some(d.id.clone());
        step.target = Some(target_of(d));
        let has_aliases = aliases.iter().all(|a| d.spec.aliases.contains(a));
        if has_aliases && arn.is_some() && d.spec.certificate_arn == arn {
            step.state = DistributionState::Adopted;
            return Ok(step);
        }
    }
    if req.dry_run {
        let (code, action) = match &existing {
            Some(d) => (
                "would-update-distribution",
                format!("update {role} distribution {} (aliases, certificate)", d.id),
            ),
            None => (
                "would-create-distribution",
                format!("create the {role} distribution for {}", aliases.join(", ")),
            ),
        };
        let message = format!(
            "the {role} distribution does not serve {} yet",
            aliases.join(", ")
        );
        reasons.push(would(code, action, message).on(step.id.clone().into_iter().chain(aliases)));
        return Ok(step);
    }
    let arn = arn.ok_or_else(|| Error::permanent("no-certificate", "no certificate to attach"))?;
    let after = match existing {
        None => {
            let spec = DistributionSpec {
                origin: origin.to_owned(),
                aliases,
                certificate_arn: Some(arn),
                comment: format!("onboard-domain: {role} for {}", req.domain),
            };
            step.state = DistributionState::Created;
            ctx.cdn().create_distribution(&spec)?
        }
        Some(d) => {
            let mut spec = d.spec.clone();
            for alias in aliases {
                if !spec.aliases.contains(&alias) {
                    spec.aliases.push(alias);
                }
            }
            step.superseded_certificate = spec
                .certificate_arn
                .replace(arn.clone())
                .filter(|old| *old != arn);
            step.state = DistributionState::Updated;
            ctx.cdn().update_distribution(&d.id, &spec)?.after
        }
    };
    step.id = Some(after.id.clone());
    step.target = Some(target_of(&after));
    Ok(step)
}

// ---------------------------------------------------------------------------------------------
// 5. routing

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Routing {
    pub change_id: Option<String>,
    pub records: Vec<String>,
    pub reasons: Vec<Reason>,
}

/// A DNS name without its trailing dot, for comparison.
fn bare(name: &str) -> &str {
    name.strip_suffix('.').unwrap_or(name)
}

/// Whether `record` routes its name to `target`: an alias A record, or (where the DNS provider
/// has no aliases) a CNAME to the distribution's domain name.
fn points_to(record: &RecordSet, target: &AliasTarget) -> bool {
    match record.type_ {
        RecordType::A => record.alias_target.as_ref().is_some_and(|t| {
            bare(&t.dns_name).eq_ignore_ascii_case(bare(&target.dns_name))
                && t.hosted_zone_id == target.hosted_zone_id
        }),
        RecordType::Cname => {
            record.values.len() == 1
                && bare(&record.values[0]).eq_ignore_ascii_case(bare(&target.dns_name))
        }
        _ => false,
    }
}

/// One name to point at a distribution, with what the zone holds there now.
struct Route<'a> {
    name: &'a str,
    target: &'a AliasTarget,
    current: Vec<RecordSet>,
}

impl Route<'_> {
    /// An alias A record; a CNAME cannot live beside it, so one goes in the same atomic change.
    fn alias(&self, changes: &mut Vec<Change>) {
        changes.extend(
            self.current
                .iter()
                .filter(|r| r.type_ == RecordType::Cname)
                .cloned()
                .map(Change::Delete),
        );
        changes.push(Change::Upsert(RecordSet {
            name: self.name.to_owned(),
            type_: RecordType::A,
            ttl: None,
            values: Vec::new(),
            alias_target: Some(self.target.clone()),
        }));
    }

    /// A CNAME to the distribution's domain name, replacing the address records and CNAME the
    /// name holds; `None` where a CNAME cannot stand: the zone apex (SOA and NS live there) or a
    /// name holding other data (RFC 1034 §3.6.2).
    fn cname(&self, zone: &Zone, changes: &mut Vec<Change>) -> Option<()> {
        let routable = |r: &RecordSet| {
            matches!(
                r.type_,
                RecordType::A | RecordType::Aaaa | RecordType::Cname
            )
        };
        if bare(self.name).eq_ignore_ascii_case(bare(&zone.name))
            || !self.current.iter().all(routable)
        {
            return None;
        }
        changes.extend(self.current.iter().cloned().map(Change::Delete));
        changes.push(Change::Upsert(RecordSet {
            name: self.name.to_owned(),
            type_: RecordType::Cname,
            ttl: Some(CNAME_TTL),
            values: vec![bare(&self.target.dns_name).to_owned()],
            alias_target: None,
        }));
        Some(())
    }
}

/// TTL of a CNAME that stands in for an alias record (an alias has none of its own).
const CNAME_TTL: u32 = 300;

pub fn routing(
    ctx: &mut Ctx,
    req: &Request,
    zone: Option<&Zone>,
    dists: &DistributionsStep,
) -> Result<Routing, Error> {
    let mut routing = Routing {
        change_id: None,
        records: Vec::new(),
        reasons: Vec::new(),
    };
    let mut routes = Vec::new();
    let mut unrouted = Vec::new();
    for dist in dists.both() {
        for name in &dist.aliases {
            let (Some(zone), Some(target)) = (zone, &dist.target) else {
                unrouted.push(name.clone());
                continue;
            };
            let current = ctx.dns().list_records(&zone.id, name)?;
            if !current.iter().any(|r| points_to(r, target)) {
                routes.push(Route {
                    name,
                    target,
                    current,
                });
            }
        }
    }
    if req.dry_run {
        let names: Vec<String> = routes
            .iter()
            .map(|r| r.name.to_owned())
            .chain(unrouted)
            .collect();
        if !names.is_empty() {
            routing.reasons.push(
                would(
                    "would-route-dns",
                    format!("point {} at the distributions", names.join(", ")),
                    "alias records are missing or point elsewhere".to_owned(),
                )
                .on(names),
            );
        }
        return Ok(routing);
    }
    let Some(zone) = zone.filter(|_| !routes.is_empty()) else {
        return Ok(routing);
    };
    let mut changes = Vec::new();
    for route in &routes {
        route.alias(&mut changes);
    }
    let receipt = match ctx.dns().change_records(&zone.id, &changes) {
        Ok(receipt) => {
            routing.records = routes.iter().map(|r| r.name.to_owned()).collect();
            Some(receipt)
        }
        // The DNS provider has no alias records (RFC 2136): CNAMEs where a CNAME can stand,
        // and the rest is for the platform team to route.
        Err(e) if e.code == "alias-unsupported" => {
            changes.clear();
            for route in &routes {
                if route.cname(zone, &mut changes).is_some() {
                    routing.records.push(route.name.to_owned());
                } else {
                    routing.reasons.push(
                        Reason::new(
                            Audience::Platform,
                            "route-manually",
                            format!(
                                "point {} at {} (an ALIAS/ANAME record, or route dns to a provider with alias records)",
                                route.name, route.target.dns_name
                            ),
                            format!(
                                "{} cannot be a CNAME (zone apex or other records there) and the DNS provider has no alias records: {}",
                                route.name, e.message
                            ),
                        )
                        .on([route.name.to_owned()]),
                    );
                }
            }
            if changes.is_empty() {
                None
            } else {
                Some(ctx.dns().change_records(&zone.id, &changes)?)
            }
        }
        Err(e) => return Err(e),
    };
    if let Some(receipt) = receipt {
        ctx.convergence().await_converged(
            &Condition::DnsChangeInsync(receipt.change_id.clone()),
            DNS_TIMEOUT_MS,
        )?;
        routing.change_id = Some(receipt.change_id);
    }
    Ok(routing)
}

// ---------------------------------------------------------------------------------------------
// 6. cleanup

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cleanup {
    pub outcome: CleanupOutcome,
    pub reasons: Vec<Reason>,
}

pub fn cleanup(
    ctx: &mut Ctx,
    req: &Request,
    cert: &CertificateStep,
    dists: &DistributionsStep,
) -> Result<Cleanup, Error> {
    if req.dry_run {
        return Ok(Cleanup {
            outcome: CleanupOutcome::just(CleanupState::NotReached),
            reasons: Vec::new(),
        });
    }
    let unknown = |arn: Option<String>, e: &Error| Cleanup {
        outcome: CleanupOutcome {
            certificate_arn: arn.clone(),
            ..CleanupOutcome::just(CleanupState::Unknown)
        },
        reasons: vec![
            Reason::new(
                Audience::Platform,
                "cleanup-status-unknown",
                format!(
                    "check the certificates of {} and delete unused ones",
                    req.domain
                ),
                format!("cleanup could not finish: {} ({})", e.message, e.code),
            )
            .on(arn),
        ],
    };
    let found = match ctx.certificates().find_certificates(&req.domain) {
        Ok(found) => found,
        Err(e) if e.is_transient() => return Err(e),
        Err(e) => return Ok(unknown(None, &e)),
    };
    let superseded: Vec<&String> = dists
        .both()
        .into_iter()
        .filter_map(|d| d.superseded_certificate.as_ref())
        .collect();
    let candidates = found
        .iter()
        .filter(|c| c.domain == req.domain && Some(&c.arn) != cert.arn.as_ref());
    let (mut deleted, mut gone, mut kept, mut attachments) = (vec![], vec![], vec![], vec![]);
    for c in candidates {
        if !c.in_use_by.is_empty() {
            kept.push(c.arn.clone());
            attachments.extend(c.in_use_by.iter().cloned());
        } else if superseded.contains(&&c.arn) {
            kept.push(c.arn.clone());
        } else {
            match ctx.certificates().delete_certificate(&c.arn) {
                Ok(_) => deleted.push(c.arn.clone()),
                Err(e) if e.code == "not-found" => gone.push(c.arn.clone()),
                Err(e) if e.code == "resource-in-use" => kept.push(c.arn.clone()),
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => return Ok(unknown(Some(c.arn.clone()), &e)),
            }
        }
    }
    if let Some(first) = kept.first() {
        let action = format!(
            "detach and delete the superseded certificate(s) {} once a rollback is no longer wanted",
            kept.join(", ")
        );
        let reason = Reason::new(
            Audience::Platform,
            "superseded-certificate",
            action.clone(),
            format!(
                "certificates of {} that the onboarding no longer uses were kept",
                req.domain
            ),
        )
        .on(kept.iter().chain(&attachments).cloned());
        return Ok(Cleanup {
            outcome: CleanupOutcome {
                state: CleanupState::ManualRequired,
                action: Some(action),
                certificate_arn: Some(first.clone()),
                remaining_attachments: Some(attachments),
            },
            reasons: vec![reason],
        });
    }
    let (state, arns, action) = match (deleted.first(), gone.first()) {
        (Some(_), _) => (
            CleanupState::Completed,
            &deleted,
            "deleted-unused-certificates",
        ),
        (None, Some(_)) => (CleanupState::AlreadyClean, &gone, "none: already deleted"),
        (None, None) => (CleanupState::NotRequired, &deleted, ""),
    };
    Ok(Cleanup {
        outcome: CleanupOutcome {
            state,
            action: (!action.is_empty()).then(|| action.to_owned()),
            certificate_arn: arns.first().cloned(),
            remaining_attachments: None,
        },
        reasons: Vec::new(),
    })
}

// ---------------------------------------------------------------------------------------------
// 7. maps-whitelist

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Maps {
    pub outcome: MapsOutcome,
    pub reasons: Vec<Reason>,
}

pub fn maps_whitelist(ctx: &mut Ctx, req: &Request) -> Result<Maps, Error> {
    let referrer = req.referrer();
    let retry =
        "raise the key's referrer capacity (or free a slot), then POST retry-maps-whitelist";
    let keys = match ctx.maps().list_keys() {
        Ok(keys) => keys,
        Err(e) if e.is_transient() => return Err(e),
        Err(e) => {
            let state = if req.dry_run {
                MapsState::NotReached
            } else {
                MapsState::ManualRequired
            };
            return Ok(Maps {
                outcome: MapsOutcome {
                    keys: Vec::new(),
                    outcome: state,
                    remaining_root_domains: None,
                },
                reasons: vec![Reason::new(
                    Audience::Platform,
                    "maps-unavailable",
                    format!(
                        "whitelist {referrer} on every maps key, then POST retry-maps-whitelist"
                    ),
                    format!("the maps keys could not be listed: {}", e.message),
                )],
            });
        }
    };
    let mut maps = Maps {
        outcome: MapsOutcome {
            keys: Vec::new(),
            outcome: MapsState::NotReached,
            remaining_root_domains: None,
        },
        reasons: Vec::new(),
    };
    if req.dry_run {
        let missing: Vec<String> = keys
            .iter()
            .filter(|k| !k.referrers.contains(&referrer))
            .map(|k| k.id.clone())
            .collect();
        if !missing.is_empty() {
            maps.reasons.push(
                would(
                    "would-whitelist-referrer",
                    format!("add referrer {referrer} to {} maps key(s)", missing.len()),
                    format!("{referrer} is not whitelisted on every key"),
                )
                .on(missing),
            );
        }
        return Ok(maps);
    }
    let mut free = Vec::new();
    for key in &keys {
        let display_name = if key.display_name.is_empty() {
            key.id.clone()
        } else {
            key.display_name.clone()
        };
        let slots =
            |k: &capstan_sdk::maps::ApiKey| k.capacity.saturating_sub(k.referrers.len() as u32);
        let state = if key.referrers.contains(&referrer) {
            free.push(slots(key));
            KeyState::AlreadyPresent
        } else {
            match ctx.maps().add_referrer(&key.id, &referrer) {
                Ok(change) => {
                    free.push(slots(&change.key));
                    if change.changed {
                        KeyState::Updated
                    } else {
                        KeyState::AlreadyPresent
                    }
                }
                Err(e) if e.code == "capacity-exhausted" => {
                    free.push(0);
                    maps.reasons.push(
                        Reason::new(
                            Audience::Platform,
                            "maps-capacity-exhausted",
                            retry,
                            format!("maps key {display_name} has no room for {referrer}"),
                        )
                        .on([key.id.clone()]),
                    );
                    KeyState::CapacityExhausted
                }
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => {
                    free.push(slots(key));
                    maps.reasons.push(
                        Reason::new(
                            Audience::Platform,
                            "maps-referrer-failed",
                            format!("add {referrer} to maps key {display_name}, then POST retry-maps-whitelist"),
                            format!("adding the referrer failed: {} ({})", e.message, e.code),
                        )
                        .on([key.id.clone()]),
                    );
                    KeyState::Failed
                }
            }
        };
        maps.outcome.keys.push(KeyOutcome {
            display_name,
            state,
        });
    }
    let states: Vec<KeyState> = maps.outcome.keys.iter().map(|k| k.state).collect();
    maps.outcome.outcome = if states
        .iter()
        .any(|s| matches!(s, KeyState::CapacityExhausted | KeyState::Failed))
    {
        MapsState::ManualRequired
    } else if states.contains(&KeyState::Updated) {
        MapsState::Updated
    } else {
        MapsState::AlreadyPresent
    };
    maps.outcome.remaining_root_domains = free.into_iter().min();
    Ok(maps)
}

// ---------------------------------------------------------------------------------------------
// 8. ticketing

/// What the stages before ticketing produced.
pub struct Parts<'a> {
    pub domain: &'a Registration,
    pub certificate: &'a CertificateStep,
    pub distributions: &'a DistributionsStep,
    pub routing: &'a Routing,
    pub cleanup: &'a Cleanup,
    pub maps: &'a Maps,
}

impl Parts<'_> {
    fn reasons(&self) -> impl Iterator<Item = &Reason> {
        self.domain
            .reasons
            .iter()
            .chain(&self.certificate.reasons)
            .chain(&self.distributions.reasons)
            .chain(&self.routing.reasons)
            .chain(&self.cleanup.reasons)
            .chain(&self.maps.reasons)
    }

    fn summary(&self, req: &Request, execution_id: &str) -> String {
        let mut text = format!(
            "Onboarding of {} (execution {execution_id}): domain {}, certificate {}",
            req.domain,
            label(&self.domain.state),
            label(&self.certificate.state),
        );
        if let Some(arn) = &self.certificate.arn {
            text.push_str(&format!(" ({arn})"));
        }
        for (role, d) in [
            ("proxy", &self.distributions.proxy),
            ("cms", &self.distributions.cms),
        ] {
            text.push_str(&format!(", {role} distribution {}", label(&d.state)));
            if let Some(id) = &d.id {
                text.push_str(&format!(" ({id})"));
            }
        }
        text.push_str(&format!(
            ", maps whitelist {}, cleanup {}.",
            label(&self.maps.outcome.outcome),
            label(&self.cleanup.outcome.state)
        ));
        for reason in self.reasons() {
            text.push_str(&format!("\n- {}: {}", reason.code, reason.action));
        }
        text
    }
}

/// The kebab-case name of a state enum, for messages.
fn label<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Ticketing {
    pub outcome: TicketingOutcome,
    pub reasons: Vec<Reason>,
}

pub fn ticketing(ctx: &mut Ctx, req: &Request, parts: &Parts<'_>) -> Result<Ticketing, Error> {
    let Some(id) = req.ticket_id.clone() else {
        return Ok(Ticketing {
            outcome: TicketingOutcome {
                state: TicketState::NotRequested,
                intended_action: None,
                ticket_id: None,
            },
            reasons: Vec::new(),
        });
    };
    let target = if parts.reasons().next().is_some() && !req.dry_run {
        TICKET_WAITING
    } else {
        TICKET_DONE
    };
    let intended = format!("comment the onboarding summary on {id} and move it to {target}");
    let outcome = |state, intended: Option<&String>| TicketingOutcome {
        state,
        intended_action: intended.cloned(),
        ticket_id: Some(id.clone()),
    };
    if req.dry_run {
        return Ok(Ticketing {
            outcome: outcome(TicketState::NotReached, Some(&intended)),
            reasons: Vec::new(),
        });
    }
    let manual = |audience, code: &str, message: String| Ticketing {
        outcome: outcome(TicketState::ManualRequired, Some(&intended)),
        reasons: vec![Reason::new(audience, code, intended.clone(), message).on([id.clone()])],
    };
    let ticket = match ctx.ticketing().get_ticket(&id) {
        Ok(Some(ticket)) => ticket,
        Ok(None) => {
            return Ok(manual(
                Audience::Requester,
                "ticket-not-found",
                format!("ticket {id} does not exist; check the ticket id"),
            ));
        }
        Err(e) if e.is_transient() => return Err(e),
        Err(e) => {
            return Ok(manual(
                Audience::Platform,
                "ticketing-failed",
                format!("ticket {id} could not be read: {}", e.message),
            ));
        }
    };
    let execution_id = ctx.info().execution_id;
    let comment = ctx
        .ticketing()
        .add_comment(&id, &parts.summary(req, &execution_id));
    let transition = comment.and_then(|_| {
        if ticket.status == target {
            Ok(())
        } else {
            ctx.ticketing().transition_ticket(&id, target).map(|_| ())
        }
    });
    match transition {
        Ok(()) => Ok(Ticketing {
            outcome: outcome(TicketState::Updated, None),
            reasons: Vec::new(),
        }),
        Err(e) if e.is_transient() => Err(e),
        Err(e) if e.code == "not-found" => Ok(manual(
            Audience::Requester,
            "ticket-not-found",
            format!("ticket {id} disappeared: {}", e.message),
        )),
        Err(e) => Ok(manual(
            Audience::Platform,
            "ticketing-failed",
            format!(
                "ticket {id} could not be updated: {} ({})",
                e.message, e.code
            ),
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// 9. finalize

pub fn finalize(
    ctx: &mut Ctx,
    req: &Request,
    parts: &Parts<'_>,
    ticket: &Ticketing,
) -> Result<DomainOnboardingOutcome, Error> {
    if !req.dry_run {
        for dist in parts.distributions.both() {
            let Some(id) = &dist.id else { continue };
            ctx.convergence().await_converged(
                &Condition::DistributionDeployed(id.clone()),
                DEPLOY_TIMEOUT_MS,
            )?;
            let live = ctx.cdn().get_distribution(id)?;
            let aliases_ok = dist.aliases.iter().all(|a| live.spec.aliases.contains(a));
            if !aliases_ok || live.spec.certificate_arn != parts.certificate.arn {
                return Err(Error::permanent(
                    "verification-failed",
                    format!(
                        "distribution {id} does not serve {} with certificate {}",
                        dist.aliases.join(", "),
                        parts.certificate.arn.as_deref().unwrap_or("(none)")
                    ),
                ));
            }
        }
    }
    let info = ctx.info();
    let reasons: Vec<Reason> = parts.reasons().chain(&ticket.reasons).cloned().collect();
    let status = match (req.dry_run, reasons.is_empty()) {
        (true, _) => STATUS_DRY_RUN,
        (false, true) => STATUS_ONBOARDED,
        (false, false) => STATUS_ASSISTANCE_REQUIRED,
    };
    let dist = |d: &DistributionStep| DistributionOutcome {
        state: d.state,
        id: d.id.clone(),
    };
    let arn = parts.certificate.arn.clone();
    let outcome = DomainOnboardingOutcome {
        execution_id: info.execution_id,
        status: status.to_owned(),
        workflow_run_id: Some(info.workflow_run_id).filter(|id| !id.is_empty()),
        assistance: Assistance {
            required: !req.dry_run && !reasons.is_empty(),
            reasons,
        },
        certificate: CertificateOutcome {
            primary_domain: req.domain.clone(),
            state: parts.certificate.state,
            id: arn
                .as_deref()
                .and_then(|a| a.rsplit(['/', ':']).next())
                .filter(|id| !id.is_empty())
                .map(str::to_owned),
            arn,
        },
        cleanup: parts.cleanup.outcome.clone(),
        distributions: Distributions {
            cms: dist(&parts.distributions.cms),
            proxy: dist(&parts.distributions.proxy),
        },
        domain: DomainOutcome {
            name: req.domain.clone(),
            state: parts.domain.state,
        },
        maps_provider: parts.maps.outcome.clone(),
        ticketing: ticket.outcome.clone(),
    };
    if !req.dry_run {
        ctx.emit("DomainOnboarded", &outcome)?;
    }
    Ok(outcome)
}
