//! `onboard-domain`: brings a primary domain into service.
//!
//! The process, one stage each:
//! 1. `readiness` — the domain has a hosted zone and is ours or available (`options.skipReadinessCheck`
//!    skips the gate: a missing zone is then created in the next stage, a taken domain still fails there).
//! 2. `registration` — registers the domain (`registered`) unless it is ours already (`already-registered`).
//! 3. `certificate` — adopts an issued certificate covering `domain`, `www.domain` (and `cms.domain`):
//!    the newest one of `recentCertOverrideDomain` when given, else one of the domain's own; otherwise
//!    requests one, writes its validation records into the zone and waits until it is issued.
//! 4. `distributions` — the proxy distribution (aliases `domain`, `www.domain`) and, when `isCms`, the
//!    CMS distribution (`cms.domain`): created, updated (aliases and certificate), or adopted as they are.
//! 5. `routing` — alias records for every alias to its distribution (a conflicting CNAME is removed);
//!    where the DNS provider has no alias records (`alias-unsupported`, RFC 2136), a CNAME to the
//!    distribution's domain name instead, replacing the name's A/AAAA/CNAME; a name that cannot hold
//!    a CNAME (the zone apex, or one with other data) becomes a `route-manually` reason for the
//!    platform. Waits until the change is in sync.
//! 6. `cleanup` — certificates issued for exactly this domain that the onboarding no longer uses:
//!    deleted when nothing uses them (`completed`; `already-clean` when they vanished meanwhile);
//!    `manual-required` when one is still attached somewhere (`remainingAttachments`) or is the
//!    certificate a distribution update replaced (kept, so a rollback can attach it again) or the
//!    provider refused to delete it (`resource-in-use`);
//!    `not-required` when there is none; `unknown` when the provider could not tell.
//! 7. `maps-whitelist` — adds referrer `*.<domain>/*` to every maps key. A full key is
//!    `capacity-exhausted` and makes the outcome `manual-required` (with a reason for the platform), not
//!    a failure.
//! 8. `ticketing` — with a `ticketId`: comments the summary and moves the ticket to `resolved` (or
//!    `pending-assistance` while something is left to a person); a missing ticket is `manual-required`.
//! 9. `finalize` — waits for the distributions to deploy, verifies them, emits `DomainOnboarded`
//!    (payload: the outcome) and returns the outcome.
//!
//! Recovery: `retry-finalization` re-runs a run that failed in `finalize` from that stage.
//! `retry-maps-whitelist` re-runs a succeeded run from `maps-whitelist`: the stages after it run again
//! on purpose — the ticket gets a new comment with the new result (its transition is skipped when the
//! ticket already has the target status) and `finalize` re-verifies and emits `DomainOnboarded` with
//! the updated outcome. Stages before it (every create/update) are replayed, never repeated.
//!
//! `options.dryRun` makes only reads: the outcome says what exists (`adopted`, `already-registered`,
//! ...), parts a real run would change report `not-created`/`not-registered`/`not-reached`, and every
//! intended change is an `assistance.reasons` entry (code `would-...`, `required: false`). A read that
//! fails permanently in a dry run reports that part `unknown` instead of failing the run.

mod outcome;
mod steps;

pub use outcome::*;

use capstan_sdk::{Ctx, Descriptor, Error, Recovery, Workflow};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use steps::Request;

pub const STAGES: [&str; 9] = [
    "readiness",
    "registration",
    "certificate",
    "distributions",
    "routing",
    "cleanup",
    "maps-whitelist",
    "ticketing",
    "finalize",
];

/// The trigger body of `POST /v1/workflows/onboard-domain`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Input {
    /// The primary domain (trimmed and lowercased): a DNS name of two labels or more.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"),
        extend("x-normalize" = "lowercase")
    )]
    pub domain: String,
    /// Whether the domain also gets a CMS distribution (`cms.<domain>`).
    #[serde(default = "yes")]
    pub is_cms: bool,
    /// The change ticket to update (trimmed and uppercased).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String", length(min = 1), extend("x-normalize" = "uppercase"))]
    pub ticket_id: Option<String>,
    /// Use the most recently issued certificate of this domain instead of the domain's own.
    #[serde(default)]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"),
        extend("x-normalize" = "lowercase")
    )]
    pub recent_cert_override_domain: Option<String>,
    #[serde(default)]
    pub options: Options,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Options {
    /// Skip the readiness gate (zone exists, domain ours or available).
    #[serde(default)]
    pub skip_readiness_check: bool,
    /// Only read: report what a real run would do and change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

fn yes() -> bool {
    true
}

/// The execution's output; the host copies `outcome` into the execution's `outcome`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    pub outcome: DomainOnboardingOutcome,
    pub dry_run: bool,
    pub zone_id: Option<String>,
    pub dns_change_id: Option<String>,
}

pub struct OnboardDomain;

impl Workflow for OnboardDomain {
    type Input = Input;
    type Output = Output;

    fn descriptor() -> Descriptor {
        Descriptor::new("onboard-domain", env!("CARGO_PKG_VERSION"))
            .description(
                "Registers a primary domain, sets up its certificate, distributions and routing, \
                 whitelists it with the maps provider and updates its ticket.",
            )
            .stages(&STAGES)
            .estimated_duration_seconds(600)
            .recovery(Recovery::new("retry-finalization", "finalize", &["failed"]))
            .recovery(
                Recovery::new("retry-maps-whitelist", "maps-whitelist", &["succeeded"])
                    .when_outcome("/mapsProvider/outcome", "manual-required"),
            )
    }

    fn run(ctx: &mut Ctx, input: Input) -> Result<Output, Error> {
        let req = Request::new(input)?;
        let ready = ctx.stage("readiness", |ctx| steps::readiness(ctx, &req))?;
        let domain = ctx.stage("registration", |ctx| steps::registration(ctx, &req, ready))?;
        let zone = domain.zone.as_ref();
        let cert = ctx.stage("certificate", |ctx| steps::certificate(ctx, &req, zone))?;
        let dists = ctx.stage("distributions", |ctx| {
            steps::distributions(ctx, &req, &cert)
        })?;
        let routing = ctx.stage("routing", |ctx| steps::routing(ctx, &req, zone, &dists))?;
        let cleanup = ctx.stage("cleanup", |ctx| steps::cleanup(ctx, &req, &cert, &dists))?;
        let maps = ctx.stage("maps-whitelist", |ctx| steps::maps_whitelist(ctx, &req))?;
        let so_far = steps::Parts {
            domain: &domain,
            certificate: &cert,
            distributions: &dists,
            routing: &routing,
            cleanup: &cleanup,
            maps: &maps,
        };
        let ticket = ctx.stage("ticketing", |ctx| steps::ticketing(ctx, &req, &so_far))?;
        let outcome = ctx.stage("finalize", |ctx| {
            steps::finalize(ctx, &req, &so_far, &ticket)
        })?;
        Ok(Output {
            outcome,
            dry_run: req.dry_run,
            zone_id: zone.map(|z| z.id.clone()),
            dns_change_id: routing.change_id,
        })
    }
}

capstan_sdk::export_workflow!(OnboardDomain);

#[cfg(test)]
mod tests;
