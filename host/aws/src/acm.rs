//! AWS Certificate Manager as the certificates adapter needs it: DNS-validated requests (with
//! ACM's idempotency token and a tag naming the engine's token), descriptions, deletion and the
//! account's certificates. Names come back bare (lower case, no trailing dot).

use crate::{Aws, classify};
use aws_sdk_acm::types::{CertificateStatus, KeyAlgorithm, Tag, ValidationMethod};
use capstan_core::CapabilityError;

/// The tag a certificate requested under an engine token carries: the token, derived as the
/// idempotency token is, so a repeat long after ACM's one-hour idempotency window still finds
/// the certificate the first request made.
pub const TOKEN_TAG: &str = "capstan:token";

/// What ACM says of a certificate, as the adapter speaks of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cert {
    pub arn: String,
    pub domain: String,
    pub sans: Vec<String>,
    /// ACM's status (`PENDING_VALIDATION`, `ISSUED`, `FAILED`, `VALIDATION_TIMED_OUT`,
    /// `REVOKED`, `INACTIVE`, `EXPIRED`).
    pub status: String,
    /// The CNAME record of each name's DNS validation (name, value), as far as ACM has made
    /// them: ACM fills them in a few seconds after the request.
    pub validation: Vec<(String, String)>,
    /// Names whose validation record ACM has not made yet.
    pub validation_missing: Vec<String>,
    /// Seconds since the epoch.
    pub issued_at: Option<u64>,
    /// The ARNs of what uses it (CloudFront distributions, load balancers).
    pub in_use_by: Vec<String>,
}

/// An ACM client.
#[derive(Debug, Clone)]
pub struct Acm {
    client: aws_sdk_acm::Client,
}

fn build_error(e: impl std::fmt::Display) -> CapabilityError {
    CapabilityError::permanent("invalid-request", e.to_string())
}

/// ACM's own codes read as the engine's.
fn known(code: &str, message: &str) -> Option<CapabilityError> {
    match code {
        "ResourceNotFoundException" => Some(CapabilityError::permanent("not-found", message)),
        "ResourceInUseException" => Some(CapabilityError::permanent("certificate-in-use", message)),
        "InvalidDomainValidationOptionsException" | "InvalidParameterException" => {
            Some(CapabilityError::permanent("invalid-request", message))
        }
        "LimitExceededException" => Some(CapabilityError::permanent("limit-exceeded", message)),
        _ => None,
    }
}

fn bare(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

impl Acm {
    pub fn new(aws: &Aws) -> Self {
        Self {
            client: aws_sdk_acm::Client::new(&aws.config),
        }
    }

    /// Requests a DNS-validated certificate for `domain` and `sans`. `idempotency_token` (at
    /// most 32 word characters) makes a repeat within the hour the same request; the tag makes
    /// it findable after that ([`Acm::tagged`]).
    pub async fn request(
        &self,
        domain: &str,
        sans: &[String],
        idempotency_token: &str,
    ) -> Result<String, CapabilityError> {
        let mut request = self
            .client
            .request_certificate()
            .domain_name(domain)
            .validation_method(ValidationMethod::Dns)
            .key_algorithm(KeyAlgorithm::Rsa2048)
            .idempotency_token(idempotency_token)
            .tags(
                Tag::builder()
                    .key(TOKEN_TAG)
                    .value(idempotency_token)
                    .build()
                    .map_err(build_error)?,
            );
        // ACM lists the domain among the alternative names too; sending it once keeps the
        // request as a repeat would send it.
        for san in sans.iter().filter(|s| s.as_str() != domain) {
            request = request.subject_alternative_names(san);
        }
        let out = request.send().await.map_err(|e| classify(&e, known))?;
        out.certificate_arn()
            .map(str::to_owned)
            .ok_or_else(|| CapabilityError::transient("unavailable", "ACM answered no ARN"))
    }

    /// The certificate at `arn`.
    pub async fn describe(&self, arn: &str) -> Result<Cert, CapabilityError> {
        let out = self
            .client
            .describe_certificate()
            .certificate_arn(arn)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        let c = out.certificate().ok_or_else(|| {
            CapabilityError::transient("unavailable", "ACM answered no certificate")
        })?;
        let mut validation = Vec::new();
        let mut validation_missing = Vec::new();
        for option in c.domain_validation_options() {
            match option.resource_record() {
                Some(r) => {
                    let record = (bare(r.name()), bare(r.value()));
                    // A name and its wildcard share one record.
                    if !validation.contains(&record) {
                        validation.push(record);
                    }
                }
                None => validation_missing.push(option.domain_name().to_owned()),
            }
        }
        Ok(Cert {
            arn: c.certificate_arn().unwrap_or(arn).to_owned(),
            domain: c.domain_name().map(bare).unwrap_or_default(),
            sans: c
                .subject_alternative_names()
                .iter()
                .map(|s| bare(s))
                .collect(),
            status: c
                .status()
                .map_or("PENDING_VALIDATION", CertificateStatus::as_str)
                .to_owned(),
            validation,
            validation_missing,
            issued_at: c.issued_at().and_then(|t| u64::try_from(t.secs()).ok()),
            in_use_by: c.in_use_by().to_vec(),
        })
    }

    /// Deletes the certificate (ACM refuses one in use: `certificate-in-use`).
    pub async fn delete(&self, arn: &str) -> Result<(), CapabilityError> {
        self.client
            .delete_certificate()
            .certificate_arn(arn)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        Ok(())
    }

    /// One cheap call that needs the credentials (for `/readyz`).
    pub async fn ping(&self) -> Result<(), CapabilityError> {
        self.client
            .list_certificates()
            .max_items(1)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        Ok(())
    }

    /// The ARNs of every certificate of the account in this region, whatever its status (ACM's
    /// default lists fewer), with the names each covers.
    pub async fn list(&self) -> Result<Vec<(String, Vec<String>)>, CapabilityError> {
        let mut all = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let page = self
                .client
                .list_certificates()
                .set_certificate_statuses(Some(vec![
                    CertificateStatus::PendingValidation,
                    CertificateStatus::Issued,
                    CertificateStatus::Failed,
                    CertificateStatus::ValidationTimedOut,
                    CertificateStatus::Revoked,
                    CertificateStatus::Inactive,
                    CertificateStatus::Expired,
                ]))
                .set_next_token(next.clone())
                .send()
                .await
                .map_err(|e| classify(&e, known))?;
            for summary in page.certificate_summary_list() {
                let Some(arn) = summary.certificate_arn() else {
                    continue;
                };
                let mut names: Vec<String> = summary.domain_name().map(bare).into_iter().collect();
                for san in summary.subject_alternative_name_summaries() {
                    let san = bare(san);
                    if !names.contains(&san) {
                        names.push(san);
                    }
                }
                all.push((arn.to_owned(), names));
            }
            match page.next_token() {
                Some(token) if !token.is_empty() => next = Some(token.to_owned()),
                _ => return Ok(all),
            }
        }
    }

    /// The certificate among `arns` tagged with `token` ([`TOKEN_TAG`]), if any.
    pub async fn tagged(
        &self,
        arns: &[String],
        token: &str,
    ) -> Result<Option<String>, CapabilityError> {
        for arn in arns {
            let tags = self
                .client
                .list_tags_for_certificate()
                .certificate_arn(arn)
                .send()
                .await;
            let tags = match tags {
                Ok(tags) => tags,
                // Deleted between the listing and now.
                Err(e) if classify(&e, known).code == "not-found" => continue,
                Err(e) => return Err(classify(&e, known)),
            };
            if tags
                .tags()
                .iter()
                .any(|t| t.key() == TOKEN_TAG && t.value() == Some(token))
            {
                return Ok(Some(arn.clone()));
            }
        }
        Ok(None)
    }
}
