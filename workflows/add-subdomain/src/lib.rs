//! `add-subdomain`: points up to ten subdomains of a root domain at the apex's alias target (its
//! CDN distribution) with `A` alias records, after a human approves the exact plan.
//!
//! # Stages
//! 1. `plan` — finds the hosted zone of `rootDomain`, takes the apex alias from the input or from
//!    the apex's live `A` alias record, lists each hostname's record sets and decides its
//!    disposition (`already-correct`, `create`, `replace`; see [`plan::assess`]). Output: the
//!    `AddSubdomainPlan`.
//! 2. `approval` — emits `SubdomainPlanReady` (payload: the plan), waits for approval of the plan
//!    (`approvals.await-approval("plan", planHash, plan)`), emits `SubdomainPlanApproved`, then
//!    lists the records again and fails `plan-stale` if they no longer match the approved plan.
//! 3. `apply` — one `dns.change-records` for every item that is not `already-correct` (a `CNAME`
//!    is deleted and the `A` alias upserted in the same atomic change), then waits until the
//!    change is in sync. This stage is the **point of no return**: once it has begun the host
//!    refuses cancel (409), because the DNS service has (or is about to have) accepted the change.
//! 4. `verify` — lists each hostname again and checks it is an `A` alias to the target.
//!
//! When every item is already correct the plan is still computed and returned, but nothing
//! needs approving: `approval` and `apply` are skipped and the run goes straight to `verify`.
//!
//! # `planHash`
//! The lowercase hex SHA-256 of the plan's canonical form: the `AddSubdomainPlan` object without
//! its `planHash` property, serialized as JSON with object keys sorted (byte order) at every level,
//! arrays in order, no insignificant whitespace, optional properties (`current`, `ttl`,
//! `aliasTarget`) absent rather than `null` (see [`plan::canonical_json`]). An approver echoes
//! it: `POST /v1/executions/{id}/plan/approve {"planHash": ...}`.

pub mod plan;

use capstan_sdk::convergence::Condition;
use capstan_sdk::dns::{Change, RecordSet, RecordType};
use capstan_sdk::{Ctx, Descriptor, Error, Workflow};
use plan::{AddSubdomainPlan, ApexAlias, Assessment, Disposition};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The plan's item limit (the API document's 1 to 10).
pub const MAX_SUBDOMAINS: usize = 10;
/// How long `apply` waits for the DNS change to be in sync before pausing (transient `timeout`).
pub const INSYNC_TIMEOUT_MS: u64 = 15 * 60 * 1000;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Input {
    /// The domain whose subdomains to add, e.g. `example.com`; a hosted zone must serve it.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+\.?$")
    )]
    pub root_domain: String,
    /// 1 to 10 host labels (`www`, `api.eu`) or full hostnames under `rootDomain`
    /// (`shop.example.com`), no duplicates.
    #[schemars(
        length(min = 1, max = 10),
        inner(
            length(min = 1, max = 253),
            regex(pattern = r"^[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.?$")
        )
    )]
    pub subdomains: Vec<String>,
    /// The alias target every subdomain points at. Default: the target of the apex's own `A`
    /// alias record (`rootDomain` → its CDN distribution).
    #[serde(default)]
    pub apex_alias: Option<ApexAlias>,
}

/// The execution's output.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    pub plan: AddSubdomainPlan,
    /// False when every item was already correct, so nothing was asked of an approver.
    pub approval_required: bool,
    /// The DNS change (none when nothing changed).
    pub change_id: Option<String>,
    /// Hostnames created or replaced.
    pub changed: Vec<String>,
}

/// What `approval` hands to `apply`: the approved hash (its stage output) and the records as
/// they were re-read after approval (they match the plan; `apply` deletes their `CNAME`s).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Approved {
    plan_hash: String,
    #[serde(skip)]
    live: Vec<Assessment>,
}

/// What `apply` did.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Applied {
    change_id: String,
    changed: Vec<String>,
}

pub struct AddSubdomain;

impl Workflow for AddSubdomain {
    type Input = Input;
    type Output = Output;

    fn descriptor() -> Descriptor {
        Descriptor::new("add-subdomain", env!("CARGO_PKG_VERSION"))
            .description(
                "Points up to ten subdomains at the apex's alias target, after approval of the plan.",
            )
            .stages(&["plan", "approval", "apply", "verify"])
            .estimated_duration_seconds(120)
            .point_of_no_return("apply")
    }

    fn run(ctx: &mut Ctx, input: Input) -> Result<Output, Error> {
        let (root, hostnames) = validate(&input)?;

        let plan = ctx.stage("plan", |ctx| {
            let zone = ctx.dns().find_zone(&root)?.ok_or_else(|| {
                Error::permanent("zone-not-found", format!("no hosted zone serves `{root}`"))
            })?;
            let apex = match &input.apex_alias {
                Some(alias) => alias.normalized(),
                None => apex_alias_of(ctx, &zone.id, &root)?,
            };
            let items = survey(ctx, &zone.id, &hostnames, &apex)?
                .into_iter()
                .map(|a| a.item)
                .collect();
            let plan = AddSubdomainPlan::new(
                ctx.info().execution_id,
                root.clone(),
                zone.id.clone(),
                apex,
                items,
            );
            Ok(plan)
        })?;
        let zone_id = plan.hosted_zone_id.clone();

        if plan.is_noop() {
            ctx.stage("verify", |ctx| verify(ctx, &zone_id, &plan))?;
            return Ok(Output {
                plan,
                approval_required: false,
                change_id: None,
                changed: Vec::new(),
            });
        }

        let approved = ctx.stage("approval", |ctx| {
            ctx.emit("SubdomainPlanReady", &plan)?;
            let body = ctx.await_approval("plan", &plan.plan_hash, &plan)?;
            if let Some(echoed) = body.get("planHash").and_then(|h| h.as_str())
                && echoed != plan.plan_hash
            {
                return Err(Error::permanent(
                    "plan-hash-mismatch",
                    format!(
                        "the approval names plan {echoed}, not this plan ({})",
                        plan.plan_hash
                    ),
                ));
            }
            ctx.emit(
                "SubdomainPlanApproved",
                &serde_json::json!({"executionId": plan.execution_id, "planHash": plan.plan_hash}),
            )?;
            // The approval may come hours later: apply only what was approved.
            let hostnames: Vec<String> = plan.items.iter().map(|i| i.hostname.clone()).collect();
            let live = survey(ctx, &zone_id, &hostnames, &plan.apex_alias)?;
            let drifted: Vec<&str> = live
                .iter()
                .zip(&plan.items)
                .filter(|(now, approved)| now.item != **approved)
                .map(|(now, _)| now.item.hostname.as_str())
                .collect();
            if !drifted.is_empty() {
                return Err(Error::permanent(
                    "plan-stale",
                    format!(
                        "the records of {} changed after the plan was made; nothing was applied, start a new execution",
                        drifted.join(", ")
                    ),
                ));
            }
            Ok(Approved {
                plan_hash: plan.plan_hash.clone(),
                live,
            })
        })?;

        let applied = ctx.stage("apply", |ctx| {
            let mut changes = Vec::new();
            let mut changed = Vec::new();
            for assessment in approved
                .live
                .iter()
                .filter(|a| a.item.disposition != Disposition::AlreadyCorrect)
            {
                if let Some(cname) = &assessment.cname {
                    changes.push(Change::Delete(cname.clone()));
                }
                let hostname = &assessment.item.hostname;
                changes.push(Change::Upsert(plan::desired_record(
                    hostname,
                    &plan.apex_alias,
                )));
                changed.push(hostname.clone());
            }
            let receipt = ctx.dns().change_records(&zone_id, &changes)?;
            ctx.convergence().await_converged(
                &Condition::DnsChangeInsync(receipt.change_id.clone()),
                INSYNC_TIMEOUT_MS,
            )?;
            Ok(Applied {
                change_id: receipt.change_id,
                changed,
            })
        })?;

        ctx.stage("verify", |ctx| verify(ctx, &zone_id, &plan))?;
        Ok(Output {
            plan,
            approval_required: true,
            change_id: Some(applied.change_id),
            changed: applied.changed,
        })
    }
}

capstan_sdk::export_workflow!(AddSubdomain);

/// The normalized root domain and the full hostnames, or `invalid-input`.
fn validate(input: &Input) -> Result<(String, Vec<String>), Error> {
    let invalid = |m: String| Error::permanent("invalid-input", m);
    let root = plan::parse_domain(&input.root_domain, 2).ok_or_else(|| {
        invalid(format!(
            "rootDomain `{}` is not a domain name (two or more labels of a-z, 0-9 and -)",
            input.root_domain
        ))
    })?;
    if input.subdomains.is_empty() || input.subdomains.len() > MAX_SUBDOMAINS {
        return Err(invalid(format!(
            "subdomains must list 1 to {MAX_SUBDOMAINS} names, not {}",
            input.subdomains.len()
        )));
    }
    let mut hostnames: Vec<String> = Vec::new();
    for sub in &input.subdomains {
        let hostname = plan::hostname_under(sub, &root).map_err(invalid)?;
        if hostnames.contains(&hostname) {
            return Err(invalid(format!("`{hostname}` is listed twice")));
        }
        hostnames.push(hostname);
    }
    if let Some(alias) = &input.apex_alias {
        let alias = alias.normalized();
        if alias.dns_name.is_empty() || alias.hosted_zone_id.is_empty() {
            return Err(invalid(
                "apexAlias needs a dnsName and a hostedZoneId".to_owned(),
            ));
        }
    }
    Ok((root, hostnames))
}

/// The alias target of the apex's own `A` alias record.
fn apex_alias_of(ctx: &Ctx, zone_id: &str, root: &str) -> Result<ApexAlias, Error> {
    ctx.dns()
        .list_records(zone_id, root)?
        .iter()
        .filter(|r| r.type_ == RecordType::A)
        .find_map(|r| r.alias_target.as_ref())
        .map(ApexAlias::from_wit)
        .ok_or_else(|| {
            Error::permanent(
                "apex-alias-not-found",
                format!(
                    "`{root}` has no A alias record to copy; give apexAlias {{dnsName, hostedZoneId}} in the input"
                ),
            )
        })
}

/// Each hostname's disposition from its live record sets, in order.
fn survey(
    ctx: &Ctx,
    zone_id: &str,
    hostnames: &[String],
    target: &ApexAlias,
) -> Result<Vec<Assessment>, Error> {
    hostnames
        .iter()
        .map(|hostname| {
            let records: Vec<RecordSet> = ctx.dns().list_records(zone_id, hostname)?;
            Ok(plan::assess(hostname, &records, target))
        })
        .collect()
}

/// Every hostname is now an `A` alias to the target, with no `CNAME` beside it.
fn verify(ctx: &Ctx, zone_id: &str, plan: &AddSubdomainPlan) -> Result<Vec<String>, Error> {
    let hostnames: Vec<String> = plan.items.iter().map(|i| i.hostname.clone()).collect();
    let wrong: Vec<String> = survey(ctx, zone_id, &hostnames, &plan.apex_alias)?
        .into_iter()
        .filter(|a| a.item.disposition != Disposition::AlreadyCorrect)
        .map(|a| a.item.hostname)
        .collect();
    if wrong.is_empty() {
        Ok(hostnames)
    } else {
        Err(Error::permanent(
            "verification-failed",
            format!(
                "{} do not alias {} after the change",
                wrong.join(", "),
                plan.apex_alias.dns_name
            ),
        ))
    }
}

#[cfg(test)]
mod tests;
