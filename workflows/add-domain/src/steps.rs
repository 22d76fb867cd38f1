//! The stages of `add-domain`.

use crate::{AttachState, CertificateState, Input};
use capstan_sdk::cdn::Distribution;
use capstan_sdk::certificates::{Certificate, CertificateStatus};
use capstan_sdk::convergence::Condition;
use capstan_sdk::dns::{AliasTarget, Change, RecordSet, RecordType, Zone};
use capstan_sdk::{Ctx, Error};
use serde::Serialize;

const ISSUE_TIMEOUT_MS: u64 = 30 * 60 * 1000;
const DNS_TIMEOUT_MS: u64 = 10 * 60 * 1000;
const DEPLOY_TIMEOUT_MS: u64 = 30 * 60 * 1000;

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

#[derive(Debug, Clone)]
pub enum Target {
    Id(String),
    Alias(String),
}

#[derive(Debug, Clone)]
pub struct Request {
    pub domain: String,
    pub target: Target,
}

impl Request {
    pub fn new(input: Input) -> Result<Self, Error> {
        let domain = domain_name("domain", &input.domain)?;
        let target = match (input.distribution_id, input.existing_alias) {
            (Some(id), None) if !id.trim().is_empty() => Target::Id(id.trim().to_owned()),
            (None, Some(alias)) => Target::Alias(domain_name("existingAlias", &alias)?),
            _ => {
                return Err(invalid(
                    "name the distribution by exactly one of distributionId and existingAlias"
                        .into(),
                ));
            }
        };
        Ok(Self { domain, target })
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Located {
    pub distribution: Distribution,
    pub zone: Zone,
}

impl Located {
    fn target(&self) -> AliasTarget {
        AliasTarget {
            dns_name: self.distribution.domain_name.clone(),
            hosted_zone_id: self.distribution.hosted_zone_id.clone(),
            evaluate_target_health: false,
        }
    }
}

pub fn locate(ctx: &mut Ctx, req: &Request) -> Result<Located, Error> {
    let distribution = match &req.target {
        Target::Id(id) => ctx.cdn().get_distribution(id)?,
        Target::Alias(alias) => ctx
            .cdn()
            .find_distribution_by_alias(alias)?
            .ok_or_else(|| {
                Error::permanent(
                    "distribution-not-found",
                    format!("no distribution serves {alias}"),
                )
            })?,
    };
    if let Some(holder) = ctx.cdn().find_distribution_by_alias(&req.domain)?
        && holder.id != distribution.id
    {
        return Err(Error::permanent(
            "alias-in-use",
            format!("{} is served by distribution {}", req.domain, holder.id),
        ));
    }
    let zone = ctx.dns().find_zone(&req.domain)?.ok_or_else(|| {
        Error::permanent(
            "zone-not-found",
            format!("no hosted zone serves {}", req.domain),
        )
    })?;
    Ok(Located { distribution, zone })
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

fn serves_all(cert: &Certificate, names: &[String]) -> bool {
    cert.status == CertificateStatus::Issued && names.iter().all(|n| covers(cert, n))
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateStep {
    pub arn: String,
    pub state: CertificateState,
}

pub fn certificate(
    ctx: &mut Ctx,
    req: &Request,
    found: &Located,
) -> Result<CertificateStep, Error> {
    let mut names = found.distribution.spec.aliases.clone();
    if !names.contains(&req.domain) {
        names.push(req.domain.clone());
    }
    if let Some(current) = &found.distribution.spec.certificate_arn {
        let cert = ctx.certificates().describe_certificate(current)?;
        if serves_all(&cert, &names) {
            return Ok(CertificateStep {
                arn: cert.arn,
                state: CertificateState::Kept,
            });
        }
    }
    let existing = ctx.certificates().find_certificates(&req.domain)?;
    if let Some(cert) = existing
        .iter()
        .filter(|c| serves_all(c, &names))
        .max_by_key(|c| c.issued_at.unwrap_or(0))
    {
        return Ok(CertificateStep {
            arn: cert.arn.clone(),
            state: CertificateState::Adopted,
        });
    }
    let cert = ctx
        .certificates()
        .request_certificate(&names[0], &names[1..])?;
    let mut by_zone: Vec<(String, Vec<Change>)> = Vec::new();
    for record in &cert.validation_records {
        let zone = ctx.dns().find_zone(&record.name)?.ok_or_else(|| {
            Error::permanent(
                "zone-not-found",
                format!("no hosted zone serves {}", record.name),
            )
        })?;
        let change = Change::Upsert(record.clone());
        match by_zone.iter_mut().find(|(id, _)| *id == zone.id) {
            Some((_, changes)) => changes.push(change),
            None => by_zone.push((zone.id, vec![change])),
        }
    }
    for (zone_id, changes) in by_zone {
        ctx.dns().change_records(&zone_id, &changes)?;
    }
    ctx.convergence().await_converged(
        &Condition::CertificateIssued(cert.arn.clone()),
        ISSUE_TIMEOUT_MS,
    )?;
    Ok(CertificateStep {
        arn: cert.arn,
        state: CertificateState::Created,
    })
}

pub fn attach(
    ctx: &mut Ctx,
    req: &Request,
    found: &Located,
    cert: &CertificateStep,
) -> Result<AttachState, Error> {
    let d = &found.distribution;
    let mut spec = d.spec.clone();
    if spec.aliases.contains(&req.domain) && spec.certificate_arn.as_ref() == Some(&cert.arn) {
        return Ok(AttachState::Unchanged);
    }
    if !spec.aliases.contains(&req.domain) {
        spec.aliases.push(req.domain.clone());
    }
    spec.certificate_arn = Some(cert.arn.clone());
    ctx.cdn().update_distribution(&d.id, &spec)?;
    Ok(AttachState::Updated)
}

/// The alias record of the domain; `None` when it already points at the distribution.
pub fn routing(ctx: &mut Ctx, req: &Request, found: &Located) -> Result<Option<String>, Error> {
    let target = found.target();
    let current = ctx.dns().list_records(&found.zone.id, &req.domain)?;
    let routed = current.iter().any(|r| {
        r.type_ == RecordType::A
            && r.alias_target.as_ref().is_some_and(|t| {
                t.dns_name.eq_ignore_ascii_case(&target.dns_name)
                    && t.hosted_zone_id == target.hosted_zone_id
            })
    });
    if routed {
        return Ok(None);
    }
    let mut changes: Vec<Change> = current
        .into_iter()
        .filter(|r| r.type_ == RecordType::Cname)
        .map(Change::Delete)
        .collect();
    changes.push(Change::Upsert(RecordSet {
        name: req.domain.clone(),
        type_: RecordType::A,
        ttl: None,
        values: Vec::new(),
        alias_target: Some(target),
    }));
    let receipt = ctx.dns().change_records(&found.zone.id, &changes)?;
    ctx.convergence().await_converged(
        &Condition::DnsChangeInsync(receipt.change_id.clone()),
        DNS_TIMEOUT_MS,
    )?;
    Ok(Some(receipt.change_id))
}

/// Waits for the distribution to deploy and checks it serves the domain with the certificate.
pub fn verify(
    ctx: &mut Ctx,
    req: &Request,
    found: &Located,
    cert: &CertificateStep,
) -> Result<Distribution, Error> {
    let id = &found.distribution.id;
    ctx.convergence().await_converged(
        &Condition::DistributionDeployed(id.clone()),
        DEPLOY_TIMEOUT_MS,
    )?;
    let live = ctx.cdn().get_distribution(id)?;
    if !live.spec.aliases.contains(&req.domain)
        || live.spec.certificate_arn.as_ref() != Some(&cert.arn)
    {
        return Err(Error::permanent(
            "verification-failed",
            format!(
                "distribution {id} does not serve {} with {}",
                req.domain, cert.arn
            ),
        ));
    }
    Ok(live)
}
