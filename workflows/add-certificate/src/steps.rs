//! The stages of `add-certificate`.

use crate::Input;
use capstan_sdk::certificates::{Certificate, CertificateStatus};
use capstan_sdk::convergence::Condition;
use capstan_sdk::dns::{Change, RecordSet};
use capstan_sdk::{Ctx, Error};
use serde::{Deserialize, Serialize};

const ISSUE_TIMEOUT_MS: u64 = 30 * 60 * 1000;

/// Trimmed, lowercased, without a trailing dot; a leading `*.` is allowed.
fn name(raw: &str) -> Result<String, Error> {
    let name = raw.trim().trim_end_matches('.').to_ascii_lowercase();
    let bare = name.strip_prefix("*.").unwrap_or(&name);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if name.len() > 253 || !bare.contains('.') || !bare.split('.').all(label_ok) {
        return Err(Error::permanent(
            "invalid-input",
            format!("`{raw}` is not a domain name"),
        ));
    }
    Ok(name)
}

/// The primary name first, then the alternative names without duplicates.
pub fn names(input: &Input) -> Result<Vec<String>, Error> {
    let mut names = vec![name(&input.domain)?];
    for raw in &input.subject_alternative_names {
        let n = name(raw)?;
        if !names.contains(&n) {
            names.push(n);
        }
    }
    Ok(names)
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

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Prepared {
    /// Zone id per name, in the order of the names.
    pub zones: Vec<String>,
    /// The issued certificate adopted instead of a new one.
    pub existing: Option<String>,
}

pub fn prepare(ctx: &mut Ctx, names: &[String], reuse: bool) -> Result<Prepared, Error> {
    let mut zones = Vec::new();
    for name in names {
        let bare = name.strip_prefix("*.").unwrap_or(name);
        let zone = ctx.dns().find_zone(bare)?.ok_or_else(|| {
            Error::permanent("zone-not-found", format!("no hosted zone serves {bare}"))
        })?;
        zones.push(zone.id);
    }
    let existing = if reuse {
        ctx.certificates()
            .find_certificates(&names[0])?
            .into_iter()
            .filter(|c| c.status == CertificateStatus::Issued && names.iter().all(|n| covers(c, n)))
            .max_by_key(|c| c.issued_at.unwrap_or(0))
            .map(|c| c.arn)
    } else {
        None
    };
    Ok(Prepared { zones, existing })
}

/// What the validation stage wrote.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Written {
    pub names: Vec<String>,
    pub change_ids: Vec<String>,
}

/// Upserts the validation records, one atomic change per zone.
pub fn write_validation(ctx: &mut Ctx, records: &[RecordSet]) -> Result<Written, Error> {
    let mut by_zone: Vec<(String, Vec<Change>)> = Vec::new();
    let mut written = Written::default();
    for record in records {
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
        written.names.push(record.name.clone());
    }
    for (zone_id, changes) in by_zone {
        let receipt = ctx.dns().change_records(&zone_id, &changes)?;
        written.change_ids.push(receipt.change_id);
    }
    Ok(written)
}

pub fn await_issued(ctx: &mut Ctx, arn: &str) -> Result<(), Error> {
    ctx.convergence().await_converged(
        &Condition::CertificateIssued(arn.to_owned()),
        ISSUE_TIMEOUT_MS,
    )
}

/// Reads the certificate back: issued, and covering every name.
pub fn verify(ctx: &mut Ctx, arn: &str, names: &[String]) -> Result<Certificate, Error> {
    let cert = ctx.certificates().describe_certificate(arn)?;
    if cert.status != CertificateStatus::Issued {
        return Err(Error::permanent(
            "certificate-not-issued",
            format!("certificate {arn} is {:?}", cert.status),
        ));
    }
    if let Some(missing) = names.iter().find(|n| !covers(&cert, n)) {
        return Err(Error::permanent(
            "certificate-incomplete",
            format!("certificate {arn} does not cover {missing}"),
        ));
    }
    Ok(cert)
}
