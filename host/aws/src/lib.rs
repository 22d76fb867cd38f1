//! # capstan-aws
//!
//! The AWS SDK for Rust, kept in a crate of its own: its crates are large, and only this crate
//! and the adapters that call it rebuild with them. It builds one SDK configuration per
//! capability ([`Aws::connect`]: the standard credential chain and region, an optional
//! `endpoint_url`, TLS by rustls on ring) and turns the SDK's errors into the engine's
//! [`CapabilityError`]s. The SDK's own retries are off: the engine's `provider_retry` is the one
//! retry policy, so a throttled call is retried by the same rules as every other provider's.
//!
//! # Layout
//! - `lib.rs` — [`Aws`]: the shared configuration; [`classify`]: an SDK error as transient or
//!   permanent.
//! - `route53.rs` — [`route53::Route53`]: hosted zones, record sets and changes.
//! - `acm.rs` — [`acm::Acm`]: DNS-validated certificates.
//! - `route53domains.rs` — [`route53domains::Route53Domains`]: domains held, availability,
//!   registrations and their operations, name servers.
//! - `cloudfront.rs` — [`cloudfront::CloudFront`]: distributions under `CallerReference` and
//!   `If-Match`.
//! - `lambda.rs` — [`lambda::Lambda`]: versions, aliases under their revision id, invocation.

pub mod acm;
pub mod cloudfront;
pub mod lambda;
pub mod route53;
pub mod route53domains;

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use capstan_core::CapabilityError;
use std::time::Duration;

/// An access key given in the settings (its secret from a file or a variable), instead of the
/// standard chain.
#[derive(Clone)]
pub struct StaticCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// One service's SDK configuration.
#[derive(Debug, Clone)]
pub struct Aws {
    pub config: aws_config::SdkConfig,
}

impl Aws {
    /// The standard credential chain (environment, profile, web identity, container and
    /// instance credentials) unless `credentials` are given; the region of the settings,
    /// `AWS_REGION` or `AWS_DEFAULT_REGION`, else `default_region`; an endpoint of
    /// the operator's choice (a VPC endpoint, or moto in the tests), no SDK retries, and a
    /// deadline on each call.
    pub async fn connect(
        region: Option<String>,
        default_region: &'static str,
        endpoint_url: Option<String>,
        credentials: Option<StaticCredentials>,
        timeout: Duration,
    ) -> Self {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        // The region from the settings, the environment, or the service's default: the SDK's
        // own region chain would also ask the instance metadata service, with an HTTP client
        // of its own (the SDK's default, which is not built here).
        let region = region
            .or_else(|| std::env::var("AWS_REGION").ok())
            .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| default_region.to_owned());
        let region = aws_config::Region::new(region);
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .region(region)
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_attempt_timeout(timeout)
                    .operation_timeout(timeout)
                    .build(),
            );
        if let Some(url) = endpoint_url {
            loader = loader.endpoint_url(url);
        }
        if let Some(keys) = credentials {
            loader = loader.credentials_provider(aws_sdk_route53::config::Credentials::new(
                keys.access_key_id,
                keys.secret_access_key,
                None,
                None,
                "capstan-settings",
            ));
        }
        Self {
            config: loader.load().await,
        }
    }
}

/// What an AWS error means for a retry: throttling, a request still in progress, a 5xx or a
/// call that never got an answer are transient; the rest permanent, under the service's own
/// code (lower-cased to the engine's style: `NoSuchHostedZone` → `no-such-hosted-zone`) unless
/// `known` names the engine's code for it.
pub fn classify<E, R>(
    error: &aws_sdk_route53::error::SdkError<E, R>,
    known: impl Fn(&str, &str) -> Option<CapabilityError>,
) -> CapabilityError
where
    E: aws_sdk_route53::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    use aws_sdk_route53::error::SdkError;
    match error {
        SdkError::ServiceError(service) => {
            let e = service.err();
            let code = e.code().unwrap_or("Unknown");
            let message = e.message().unwrap_or_default();
            if let Some(mapped) = known(code, message) {
                return mapped;
            }
            let transient = matches!(
                code,
                "Throttling"
                    | "ThrottlingException"
                    | "TooManyRequestsException"
                    | "PriorRequestNotComplete"
                    | "ServiceUnavailable"
                    | "InternalFailure"
                    | "InternalError"
                    | "RequestTimeout"
            );
            let code_text = kebab(code);
            if transient {
                CapabilityError::transient(&code_text, message)
            } else {
                CapabilityError::permanent(&code_text, message)
            }
        }
        SdkError::ConstructionFailure(_) => {
            CapabilityError::permanent("invalid-request", format!("{error}"))
        }
        // No answer, or one that could not be read: the call may be repeated.
        other => CapabilityError::transient(
            "unavailable",
            format!("AWS did not answer: {}", source_chain(other)),
        ),
    }
}

/// `NoSuchHostedZone` → `no-such-hosted-zone`.
fn kebab(code: &str) -> String {
    let mut out = String::new();
    for (i, c) in code.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// An error and its causes on one line (the SDK's top-level message alone says "dispatch
/// failure").
fn source_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn service_codes_read_as_the_engines() {
        assert_eq!(super::kebab("NoSuchHostedZone"), "no-such-hosted-zone");
        assert_eq!(super::kebab("Throttling"), "throttling");
    }
}
