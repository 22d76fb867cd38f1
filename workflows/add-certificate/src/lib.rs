//! `add-certificate`: a DNS-validated certificate for a domain and its alternative names.
//!
//! 1. `prepare` — normalizes the names and finds the hosted zone of each (a name no zone serves
//!    fails with `zone-not-found`); with `reuseExisting` (default) an issued certificate that already
//!    covers every name is adopted and the next three stages are skipped.
//! 2. `request` — requests the certificate (rollback deletes it).
//! 3. `validation` — upserts its validation records, one change per zone (rollback removes them).
//! 4. `issuance` — waits, without holding the instance, until the provider has issued it.
//! 5. `finalize` — reads the certificate back and checks it is issued and covers every name.
//!
//! `retry-finalization` re-runs a run that failed in `finalize` from that stage, with the earlier
//! stages replayed from the journal.

mod steps;

use capstan_sdk::{Ctx, Descriptor, Error, Recovery, Workflow};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const STAGES: [&str; 5] = ["prepare", "request", "validation", "issuance", "finalize"];

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Input {
    /// The certificate's primary name (trimmed and lowercased).
    #[schemars(length(min = 1))]
    pub domain: String,
    /// Further names it covers (`www.example.com`, `*.example.com`).
    #[serde(default)]
    #[schemars(inner(length(min = 1)), length(max = 100))]
    pub subject_alternative_names: Vec<String>,
    /// Adopt an issued certificate that already covers every name instead of requesting one.
    #[serde(default = "yes")]
    pub reuse_existing: bool,
}

fn yes() -> bool {
    true
}

/// Whether the certificate was requested by this run or already existed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CertificateState {
    Created,
    Adopted,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    pub arn: String,
    pub domain: String,
    pub subject_alternative_names: Vec<String>,
    pub state: CertificateState,
    pub issued_at: Option<u64>,
    /// The validation records written, by name.
    pub validation_records: Vec<String>,
    pub dns_change_ids: Vec<String>,
}

pub struct AddCertificate;

impl Workflow for AddCertificate {
    type Input = Input;
    type Output = Output;

    fn descriptor() -> Descriptor {
        Descriptor::new("add-certificate", env!("CARGO_PKG_VERSION"))
            .description("Requests a DNS-validated certificate and waits until it is issued.")
            .stages(&STAGES)
            .estimated_duration_seconds(300)
            .recovery(Recovery::new("retry-finalization", "finalize", &["failed"]))
    }

    fn run(ctx: &mut Ctx, input: Input) -> Result<Output, Error> {
        let names = steps::names(&input)?;
        let prepared = ctx.stage("prepare", |ctx| {
            steps::prepare(ctx, &names, input.reuse_existing)
        })?;
        let (arn, state, written) = match prepared.existing {
            Some(arn) => (arn, CertificateState::Adopted, steps::Written::default()),
            None => {
                let cert = ctx.stage("request", |ctx| {
                    ctx.certificates()
                        .request_certificate(&names[0], &names[1..])
                })?;
                let written = ctx.stage("validation", |ctx| {
                    steps::write_validation(ctx, &cert.validation_records)
                })?;
                ctx.stage("issuance", |ctx| steps::await_issued(ctx, &cert.arn))?;
                (cert.arn, CertificateState::Created, written)
            }
        };
        let cert = ctx.stage("finalize", |ctx| steps::verify(ctx, &arn, &names))?;
        Ok(Output {
            arn: cert.arn,
            domain: cert.domain,
            subject_alternative_names: cert.subject_alternative_names,
            state,
            issued_at: cert.issued_at,
            validation_records: written.names,
            dns_change_ids: written.change_ids,
        })
    }
}

capstan_sdk::export_workflow!(AddCertificate);

#[cfg(test)]
mod tests;
