//! # capstan-adapters
//!
//! Real providers behind the one seam of `capstan-core` ([`capstan_core::Providers`]), chosen per
//! capability by the operator's `[providers.<capability>]` tables ([`ProviderSettings`]); a
//! capability with no table is served by the simulated cloud. Each adapter reads the prior state
//! before changing anything (receipts restore it exactly), maps the engine's idempotency token to
//! what its protocol offers (the token ledger where the protocol has nothing), classifies errors
//! as transient or permanent, and never logs, journals or returns a secret. See docs/providers.md.
//!
//! # Layout
//! - `lib.rs` — [`ProviderSettings`] and [`build`], which turns them into providers.
//! - `secret.rs` — secrets from files or environment variables.
//! - `ledger.rs` — the token ledger (`provider_effects`) shared by the adapters.
//! - `model.rs` — the WIT records of `dns` and `certificates`, typed.
//! - `rfc2136.rs` — DNS by RFC 2136 dynamic update signed with TSIG (BIND, Knot, PowerDNS).
//! - `acme.rs` — certificates by ACME v2 with DNS-01 (Let's Encrypt, Pebble, any RFC 8555 CA).
//! - `aws.rs` — what the AWS adapters' settings share (region, endpoint, keys, deadline).
//! - `route53.rs` — DNS on AWS Route 53 (the SDK calls are `capstan-aws`'s).
//! - `acm.rs` — certificates on AWS Certificate Manager, DNS-validated.
//! - `route53domains.rs` — the registrar on Amazon Route 53 Domains.
//! - `cloudfront.rs` — the CDN on Amazon CloudFront.
//! - `lambda.rs` — functions on AWS Lambda.
//! - `http.rs` — what the adapters of plain HTTPS APIs share (client, errors, path segments).
//! - `apikeys.rs` — maps referrer keys on the Google Cloud API Keys API.
//! - `jira.rs` — ticketing on Jira Cloud.
//!
//! The AWS adapters (and the AWS SDK) are the `aws` feature, on by default; a build without it
//! (the benchmark's server) does not know their `kind`s.
//!
//! It must not know the engine or the simulated cloud: both meet adapters only through the trait.

#[cfg(feature = "aws")]
pub mod acm;
pub mod acme;
pub mod apikeys;
#[cfg(feature = "aws")]
mod aws;
#[cfg(feature = "aws")]
pub mod cloudfront;
mod http;
pub mod jira;
#[cfg(feature = "aws")]
pub mod lambda;
mod ledger;
pub mod model;
pub mod rfc2136;
#[cfg(feature = "aws")]
pub mod route53;
#[cfg(feature = "aws")]
pub mod route53domains;
mod secret;

use capstan_core::{Capability, Clock, Providers, secrets::Keyring};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[cfg(feature = "aws")]
pub use acm::AcmSettings;
pub use acme::AcmeSettings;
pub use apikeys::ApiKeysSettings;
#[cfg(feature = "aws")]
pub use cloudfront::CloudFrontSettings;
pub use jira::JiraSettings;
#[cfg(feature = "aws")]
pub use lambda::LambdaSettings;
pub use rfc2136::Rfc2136Settings;
#[cfg(feature = "aws")]
pub use route53::Route53Settings;
#[cfg(feature = "aws")]
pub use route53domains::Route53DomainsSettings;

/// `[providers.<capability>]`: which implementation serves a capability, and its settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ProviderSettings {
    /// The embedded simulated cloud (what a capability with no table gets).
    Simulated,
    /// DNS by RFC 2136 dynamic update with TSIG.
    Rfc2136(Rfc2136Settings),
    /// Certificates by ACME v2 with DNS-01 challenges.
    Acme(AcmeSettings),
    /// Maps referrer keys on the Google Cloud API Keys API.
    ApiKeys(ApiKeysSettings),
    /// Ticketing on Jira Cloud.
    Jira(JiraSettings),
    /// DNS on AWS Route 53.
    #[cfg(feature = "aws")]
    Route53(Route53Settings),
    /// Certificates on AWS Certificate Manager.
    #[cfg(feature = "aws")]
    Acm(AcmSettings),
    /// The registrar on Amazon Route 53 Domains.
    #[cfg(feature = "aws")]
    Route53Domains(Route53DomainsSettings),
    /// The CDN on Amazon CloudFront.
    #[cfg(feature = "aws")]
    CloudFront(CloudFrontSettings),
    /// Functions on AWS Lambda.
    #[cfg(feature = "aws")]
    Lambda(LambdaSettings),
}

impl ProviderSettings {
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderSettings::Simulated => "simulated",
            ProviderSettings::Rfc2136(_) => "rfc2136",
            ProviderSettings::Acme(_) => "acme",
            ProviderSettings::ApiKeys(_) => "apikeys",
            ProviderSettings::Jira(_) => "jira",
            #[cfg(feature = "aws")]
            ProviderSettings::Route53(_) => "route53",
            #[cfg(feature = "aws")]
            ProviderSettings::Acm(_) => "acm",
            #[cfg(feature = "aws")]
            ProviderSettings::Route53Domains(_) => "route53domains",
            #[cfg(feature = "aws")]
            ProviderSettings::CloudFront(_) => "cloudfront",
            #[cfg(feature = "aws")]
            ProviderSettings::Lambda(_) => "lambda",
        }
    }

    /// The capabilities this kind can serve.
    fn serves(&self, capability: Capability) -> bool {
        match self {
            ProviderSettings::Simulated => true,
            ProviderSettings::Rfc2136(_) => capability == Capability::Dns,
            ProviderSettings::Acme(_) => capability == Capability::Certificates,
            ProviderSettings::ApiKeys(_) => capability == Capability::Maps,
            ProviderSettings::Jira(_) => capability == Capability::Ticketing,
            #[cfg(feature = "aws")]
            ProviderSettings::Route53(_) => capability == Capability::Dns,
            #[cfg(feature = "aws")]
            ProviderSettings::Acm(_) => capability == Capability::Certificates,
            #[cfg(feature = "aws")]
            ProviderSettings::Route53Domains(_) => capability == Capability::Registrar,
            #[cfg(feature = "aws")]
            ProviderSettings::CloudFront(_) => capability == Capability::Cdn,
            #[cfg(feature = "aws")]
            ProviderSettings::Lambda(_) => capability == Capability::Functions,
        }
    }
}

/// A provider configuration that cannot serve: the message names the key.
#[derive(Debug, thiserror::Error)]
#[error("providers.{capability}.{key}: {message}")]
pub struct SettingsError {
    pub capability: String,
    pub key: String,
    pub message: String,
}

impl SettingsError {
    pub(crate) fn new(capability: Capability, key: &str, message: impl Into<String>) -> Self {
        Self {
            capability: capability.as_str().to_owned(),
            key: key.to_owned(),
            message: message.into(),
        }
    }
}

/// What adapters need of the node: its database (token ledger, certificate store), its clock and
/// the secret keyring that seals what they keep.
#[derive(Debug, Clone)]
pub struct Node {
    pub store: capstan_store::Store,
    pub clock: Arc<dyn Clock>,
    pub keyring: Keyring,
}

/// The real provider `settings` describe for `capability`, or `None` for the simulated cloud.
/// Checks everything that can be checked without the network: a bad value stops start-up with
/// the key that holds it.
pub async fn build(
    capability: Capability,
    settings: &ProviderSettings,
    node: &Node,
) -> Result<Option<Arc<dyn Providers>>, SettingsError> {
    if !settings.serves(capability) {
        return Err(SettingsError::new(
            capability,
            "kind",
            format!(
                "`{}` cannot serve {}: rfc2136 and route53 serve dns, acme and acm serve certificates, route53domains serves registrar, cloudfront serves cdn, lambda serves functions, apikeys serves maps, jira serves ticketing, simulated serves any",
                settings.kind(),
                capability.as_str()
            ),
        ));
    }
    Ok(match settings {
        ProviderSettings::Simulated => None,
        ProviderSettings::Rfc2136(s) => Some(Arc::new(rfc2136::Rfc2136::new(s, node)?)),
        ProviderSettings::Acme(s) => Some(Arc::new(acme::Acme::new(s, node).await?)),
        ProviderSettings::ApiKeys(s) => Some(Arc::new(apikeys::ApiKeys::new(s, node)?)),
        ProviderSettings::Jira(s) => Some(Arc::new(jira::Jira::new(s, node)?)),
        #[cfg(feature = "aws")]
        ProviderSettings::Route53(s) => Some(Arc::new(route53::Route53::new(s, node).await?)),
        #[cfg(feature = "aws")]
        ProviderSettings::Acm(s) => Some(Arc::new(acm::Acm::new(s, node).await?)),
        #[cfg(feature = "aws")]
        ProviderSettings::Route53Domains(s) => Some(Arc::new(
            route53domains::Route53Domains::new(s, node).await?,
        )),
        #[cfg(feature = "aws")]
        ProviderSettings::CloudFront(s) => {
            Some(Arc::new(cloudfront::CloudFront::new(s, node).await?))
        }
        #[cfg(feature = "aws")]
        ProviderSettings::Lambda(s) => Some(Arc::new(lambda::Lambda::new(s, node).await?)),
    })
}
