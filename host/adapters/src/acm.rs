//! Certificates on AWS Certificate Manager (`[providers.certificates] kind = "acm"`), through
//! the AWS SDK for Rust (`capstan-aws`).
//!
//! - **Validation.** Certificates are DNS-validated: `request-certificate` answers one CNAME
//!   record set per name (a name and its wildcard share one), which the workflow publishes
//!   through `dns`; ACM issues once it sees them, and `describe-certificate` (which the
//!   engine's convergence polls) says `Issued`. ACM makes the validation records a few seconds
//!   after the request: until it has, the request answers the transient `validation-pending`,
//!   and the engine's retry asks again under the same token.
//! - **Idempotency.** The engine's token becomes ACM's `IdempotencyToken` (at most 32 word
//!   characters, derived deterministically, [`TokenFormat`]) and a `capstan:token` tag on the
//!   certificate. The ledger records the intent before the request and the ARN as soon as ACM
//!   answers; a repeat after a crash answers that ARN, or finds the certificate by its tag (ACM
//!   keeps an idempotency token for one hour only), or requests again with the same token.
//! - **Deletion.** `delete-certificate` refuses a certificate that something uses
//!   (`certificate-in-use`, whether the adapter sees `InUseBy` or ACM refuses), so a rollback
//!   never deletes a certificate a distribution serves. A repeat of a deletion that was done
//!   answers the certificate as it was.
//! - **Region.** CloudFront takes certificates from `us-east-1` only: the default.

use crate::ledger::{Entry, Ledger, storage};
use crate::model::{self, Certificate, CertificateStatus, RecordSet, RecordType, arg};
use crate::{Node, SettingsError};
use async_trait::async_trait;
use capstan_aws::acm::{self, Cert};
use capstan_core::providers::TokenFormat;
use capstan_core::{Capability, CapabilityError, Clock, Providers};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

type Answer = Result<Value, CapabilityError>;

/// ACM's `IdempotencyToken`: at most 32 characters of `\w`.
const IDEMPOTENCY_TOKEN: TokenFormat = TokenFormat {
    max_len: 32,
    word_only: true,
};

/// TTL of the validation records the adapter answers.
const VALIDATION_TTL: u32 = 300;

/// `[providers.certificates] kind = "acm"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmSettings {
    /// The region certificates are requested in (default: the AWS chain's region, else
    /// `us-east-1`, the one CloudFront reads certificates from).
    #[serde(default)]
    pub region: Option<String>,
    /// Another endpoint than AWS's (a VPC endpoint; moto in the tests).
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// Deadline of one call to ACM.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// An access key of this adapter's own, instead of the standard AWS credential chain; its
    /// secret comes from `secret_access_key_file` or `secret_access_key_env`.
    #[serde(default)]
    pub access_key_id: Option<String>,
    #[serde(default)]
    pub secret_access_key_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub secret_access_key_env: Option<String>,
}

fn default_timeout_ms() -> u64 {
    10_000
}

/// What the ledger holds of a request before its answer: the ARN once ACM gave one.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Requested {
    arn: Option<String>,
}

pub struct Acm {
    client: acm::Acm,
    ledger: Ledger,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Acm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acm").finish_non_exhaustive()
    }
}

/// ACM's description in the WIT's shape.
fn view(cert: Cert) -> Certificate {
    let status = match cert.status.as_str() {
        "ISSUED" => CertificateStatus::Issued,
        "PENDING_VALIDATION" => CertificateStatus::PendingValidation,
        "REVOKED" => CertificateStatus::Revoked,
        // FAILED, VALIDATION_TIMED_OUT, INACTIVE, EXPIRED: not usable, and not becoming so.
        _ => CertificateStatus::Failed,
    };
    Certificate {
        arn: cert.arn,
        domain: cert.domain,
        subject_alternative_names: cert.sans,
        status,
        validation_records: cert
            .validation
            .into_iter()
            .map(|(name, value)| RecordSet {
                name,
                type_: RecordType::Cname,
                ttl: Some(VALIDATION_TTL),
                values: vec![value],
                alias_target: None,
            })
            .collect(),
        // Only an issued certificate was issued at some time (some endpoints date a request).
        issued_at: cert
            .issued_at
            .filter(|_| status == CertificateStatus::Issued),
        in_use_by: cert.in_use_by,
    }
}

fn answer(certificate: Certificate) -> Answer {
    serde_json::to_value(certificate).map_err(storage)
}

impl Acm {
    pub async fn new(s: &AcmSettings, node: &Node) -> Result<Self, SettingsError> {
        let aws = crate::aws::Access {
            capability: Capability::Certificates,
            region: s.region.as_ref(),
            default_region: "us-east-1",
            endpoint_url: s.endpoint_url.as_ref(),
            timeout_ms: s.timeout_ms,
            access_key_id: s.access_key_id.as_ref(),
            secret_access_key_file: s.secret_access_key_file.as_ref(),
            secret_access_key_env: s.secret_access_key_env.as_deref(),
        }
        .connect()
        .await?;
        Ok(Self {
            client: acm::Acm::new(&aws),
            ledger: Ledger::new(node.store.writer().clone(), "acm"),
            clock: node.clock.clone(),
        })
    }

    fn now(&self) -> i64 {
        i64::try_from(self.clock.now_millis()).unwrap_or(i64::MAX)
    }

    async fn request(&self, request: &Value, token: &str) -> Answer {
        const OP: &str = "certificates.request-certificate";
        let domain = model::bare(&arg::<String>(request, "domain")?);
        let sans: Vec<String> = arg::<Vec<String>>(request, "subject_alternative_names")?
            .iter()
            .map(|s| model::bare(s))
            .collect();
        if domain.is_empty() {
            return Err(CapabilityError::permanent(
                "invalid-request",
                "a certificate needs a domain",
            ));
        }
        // A read-only caller (no token) still gets one request per call.
        let token = if token.is_empty() {
            capstan_core::ids::new_id()
        } else {
            token.to_owned()
        };
        let idempotency = IDEMPOTENCY_TOKEN.derive(&token);
        let arn = match self.ledger.get(&token, OP, request).await? {
            Some(Entry::Done(answer)) => return Ok(answer),
            Some(Entry::Intent(body)) => {
                let requested: Requested = serde_json::from_value(body).map_err(storage)?;
                match requested.arn {
                    Some(arn) => Some(arn),
                    // Asked before a crash, perhaps: the certificate carries the token.
                    None => {
                        let candidates: Vec<String> = self
                            .client
                            .list()
                            .await?
                            .into_iter()
                            .filter(|(_, names)| names.contains(&domain))
                            .map(|(arn, _)| arn)
                            .collect();
                        self.client.tagged(&candidates, &idempotency).await?
                    }
                }
            }
            None => {
                self.ledger
                    .intend(
                        &token,
                        OP,
                        request,
                        &json!(Requested::default()),
                        self.now(),
                    )
                    .await?;
                None
            }
        };
        let arn = match arn {
            Some(arn) => arn,
            None => {
                let arn = self.client.request(&domain, &sans, &idempotency).await?;
                let requested = Requested {
                    arn: Some(arn.clone()),
                };
                self.ledger
                    .intend(&token, OP, request, &json!(requested), self.now())
                    .await?;
                arn
            }
        };
        let cert = self.client.describe(&arn).await?;
        if !cert.validation_missing.is_empty() {
            return Err(CapabilityError::transient(
                "validation-pending",
                format!(
                    "ACM has not made the validation record of {} yet",
                    cert.validation_missing.join(", ")
                ),
            ));
        }
        let answer = answer(view(cert))?;
        self.ledger.done(&token, OP, &answer, self.now()).await?;
        Ok(answer)
    }

    async fn delete(&self, request: &Value, token: &str) -> Answer {
        const OP: &str = "certificates.delete-certificate";
        let arn: String = arg(request, "arn")?;
        let earlier = if token.is_empty() {
            None
        } else {
            self.ledger.get(token, OP, request).await?
        };
        match earlier {
            Some(Entry::Done(answer)) => Ok(answer),
            // Deleted before a crash, perhaps: what it was is what the intent recorded.
            Some(Entry::Intent(body)) => {
                match self.client.delete(&arn).await {
                    Ok(()) => {}
                    Err(e) if e.code == "not-found" => {}
                    Err(e) => return Err(e),
                }
                self.ledger.done(token, OP, &body, self.now()).await?;
                Ok(body)
            }
            None => {
                let cert = view(self.client.describe(&arn).await?);
                if !cert.in_use_by.is_empty() {
                    return Err(CapabilityError::permanent(
                        "certificate-in-use",
                        format!(
                            "certificate {arn} is used by {}; it is not deleted",
                            cert.in_use_by.join(", ")
                        ),
                    ));
                }
                let body = answer(cert)?;
                if !token.is_empty() {
                    self.ledger
                        .intend(token, OP, request, &body, self.now())
                        .await?;
                }
                self.client.delete(&arn).await?;
                if !token.is_empty() {
                    self.ledger.done(token, OP, &body, self.now()).await?;
                }
                Ok(body)
            }
        }
    }

    async fn find(&self, request: &Value) -> Answer {
        let domain = model::bare(&arg::<String>(request, "domain")?);
        let mut found = Vec::new();
        for (arn, names) in self.client.list().await? {
            // A listing that shows the alternative names rules a certificate out at once; one
            // that shows only the primary name (some endpoints leave the summaries out) is
            // read whole.
            if names.len() > 1 && !names.iter().any(|n| model::covers(n, &domain)) {
                continue;
            }
            let cert = match self.client.describe(&arn).await {
                Ok(cert) => cert,
                // Deleted between the listing and now.
                Err(e) if e.code == "not-found" => continue,
                Err(e) => return Err(e),
            };
            if std::iter::once(&cert.domain)
                .chain(&cert.sans)
                .any(|n| model::covers(n, &domain))
            {
                found.push(view(cert));
            }
        }
        serde_json::to_value(found).map_err(storage)
    }
}

#[async_trait]
impl Providers for Acm {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Answer {
        match op {
            "certificates.request-certificate" => self.request(request, token).await,
            "certificates.describe-certificate" => answer(view(
                self.client
                    .describe(&arg::<String>(request, "arn")?)
                    .await?,
            )),
            "certificates.delete-certificate" => self.delete(request, token).await,
            "certificates.find-certificates" => self.find(request).await,
            other => Err(CapabilityError::permanent(
                "unsupported",
                format!("the acm provider has no operation {other}"),
            )),
        }
    }

    fn kind(&self) -> &'static str {
        "acm"
    }

    async fn reachable(&self) -> Result<(), String> {
        self.client.ping().await.map_err(|e| e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acm_statuses_read_as_the_wit_s() {
        let cert = |status: &str| Cert {
            arn: "arn:aws:acm:us-east-1:1:certificate/x".into(),
            domain: "example.org".into(),
            sans: vec!["example.org".into(), "*.example.org".into()],
            status: status.into(),
            validation: vec![("_x.example.org".into(), "_y.acm-validations.aws".into())],
            validation_missing: vec![],
            issued_at: None,
            in_use_by: vec![],
        };
        for (acm, wit) in [
            ("ISSUED", CertificateStatus::Issued),
            ("PENDING_VALIDATION", CertificateStatus::PendingValidation),
            ("REVOKED", CertificateStatus::Revoked),
            ("FAILED", CertificateStatus::Failed),
            ("VALIDATION_TIMED_OUT", CertificateStatus::Failed),
            ("EXPIRED", CertificateStatus::Failed),
        ] {
            assert_eq!(view(cert(acm)).status, wit, "{acm}");
        }
        let v = view(cert("ISSUED"));
        assert_eq!(v.validation_records.len(), 1);
        assert_eq!(v.validation_records[0].type_, RecordType::Cname);
    }
}
