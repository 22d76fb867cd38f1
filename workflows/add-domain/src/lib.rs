//! `add-domain`: serves an additional domain from an existing CDN distribution.
//!
//! 1. `locate` — finds the distribution (by `distributionId`, or by one of its aliases with
//!    `existingAlias`) and the hosted zone of the new domain; a domain another distribution already
//!    serves fails with `alias-in-use`.
//! 2. `certificate` — a distribution has one certificate, so it must cover the new domain and every
//!    alias the distribution already has: the attached one when it does (`kept`), else an issued
//!    one that does (`adopted`), else a new one, validated through DNS and awaited (`created`).
//! 3. `attach` — adds the alias and the certificate to the distribution (`updated`; `unchanged` when
//!    both are there already). Rollback restores the previous spec.
//! 4. `routing` — an alias record for the domain to the distribution (a CNAME in the way is removed in
//!    the same change); waits until it is in sync.
//! 5. `finalize` — waits for the distribution to deploy and checks it serves the domain.

mod steps;

use capstan_sdk::{Ctx, Descriptor, Error, Workflow};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const STAGES: [&str; 5] = ["locate", "certificate", "attach", "routing", "finalize"];

/// Name the distribution by exactly one of `distributionId` and `existingAlias`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Input {
    /// The domain to add (trimmed and lowercased).
    #[schemars(length(min = 1))]
    pub domain: String,
    /// The distribution to attach it to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String", length(min = 1))]
    pub distribution_id: Option<String>,
    /// A domain the distribution already serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String", length(min = 1))]
    pub existing_alias: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CertificateState {
    /// The attached certificate already covers the domain.
    Kept,
    Adopted,
    Created,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttachState {
    Updated,
    Unchanged,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    pub domain: String,
    pub distribution_id: String,
    pub aliases: Vec<String>,
    pub certificate_arn: String,
    pub certificate: CertificateState,
    pub attachment: AttachState,
    pub dns_change_id: Option<String>,
}

pub struct AddDomain;

impl Workflow for AddDomain {
    type Input = Input;
    type Output = Output;

    fn descriptor() -> Descriptor {
        Descriptor::new("add-domain", env!("CARGO_PKG_VERSION"))
            .description("Serves an additional domain from an existing CDN distribution.")
            .stages(&STAGES)
            .estimated_duration_seconds(300)
    }

    fn run(ctx: &mut Ctx, input: Input) -> Result<Output, Error> {
        let req = steps::Request::new(input)?;
        let found = ctx.stage("locate", |ctx| steps::locate(ctx, &req))?;
        let cert = ctx.stage("certificate", |ctx| steps::certificate(ctx, &req, &found))?;
        let attached = ctx.stage("attach", |ctx| steps::attach(ctx, &req, &found, &cert))?;
        let change = ctx.stage("routing", |ctx| steps::routing(ctx, &req, &found))?;
        let live = ctx.stage("finalize", |ctx| steps::verify(ctx, &req, &found, &cert))?;
        Ok(Output {
            domain: req.domain,
            distribution_id: live.id,
            aliases: live.spec.aliases,
            certificate_arn: cert.arn,
            certificate: cert.state,
            attachment: attached,
            dns_change_id: change,
        })
    }
}

capstan_sdk::export_workflow!(AddDomain);

#[cfg(test)]
mod tests;
