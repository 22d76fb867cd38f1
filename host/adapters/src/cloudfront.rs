//! The CDN on Amazon CloudFront (`[providers.cdn] kind = "cloudfront"`), through the AWS SDK for
//! Rust (`capstan-aws`).
//!
//! - **Creating.** A distribution serves the spec's origin (HTTPS only) under its aliases with
//!   its ACM certificate (SNI, TLS 1.2 at least; CloudFront's own certificate when there is
//!   none), the price class and cache policy of the settings. The engine's token becomes the
//!   `CallerReference`; the ledger records the intent before the request and the id once
//!   CloudFront answers. A repeat answers from the ledger, or, after a crash before that record,
//!   finds the distribution CloudFront made under that `CallerReference`.
//! - **Changing.** An update reads the distribution's configuration and sends it back with the
//!   spec's four parts changed and everything else as it was, under `If-Match` with the ETag it
//!   read: a change made meanwhile makes CloudFront refuse (`precondition-failed`, transient: the
//!   retry reads again). The answer carries the distribution before and after; the ledger keeps
//!   the before, so a repeat after a crash answers the same before.
//! - **Deleting.** CloudFront deletes only a disabled, deployed distribution: the first call
//!   disables it and answers the transient `distribution-disabling` until CloudFront has
//!   deployed that, then deletes it under `If-Match`. The answer is the distribution as it was
//!   before it was disabled (kept in the ledger).
//! - **Aliases** another distribution of the account holds are refused before any change
//!   (`alias-in-use`), as CloudFront itself refuses them across accounts (`CNAMEAlreadyExists`).
//! - **Convergence** (`DistributionDeployed`) is `get-distribution` saying `Deployed`.

use crate::ledger::{Entry, Ledger, storage};
use crate::model::arg;
use crate::{Node, SettingsError};
use async_trait::async_trait;
use capstan_aws::cloudfront::{self, Distribution, HOSTED_ZONE_ID, Shape, Spec};
use capstan_core::providers::TokenFormat;
use capstan_core::{Capability, CapabilityError, Clock, Providers};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

type Answer = Result<Value, CapabilityError>;

/// CloudFront's `CallerReference`: the token as it is when it fits.
const CALLER_REFERENCE: TokenFormat = TokenFormat {
    max_len: 128,
    word_only: false,
};

/// AWS's managed cache policy `CachingOptimized`.
const CACHING_OPTIMIZED: &str = "658327ea-f89d-4fab-a63d-7e88639e58f6";

const PRICE_CLASSES: [&str; 3] = ["PriceClass_100", "PriceClass_200", "PriceClass_All"];

/// `[providers.cdn] kind = "cloudfront"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloudFrontSettings {
    /// The signing region (CloudFront is global; default `us-east-1`).
    #[serde(default)]
    pub region: Option<String>,
    /// Another endpoint than AWS's (moto in the tests).
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// Deadline of one call to CloudFront.
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
    /// The price class of distributions created here (default `PriceClass_100`).
    #[serde(default = "default_price_class")]
    pub price_class: String,
    /// The cache policy of their default behaviour (default AWS's `CachingOptimized`).
    #[serde(default = "default_cache_policy")]
    pub cache_policy_id: String,
}

fn default_timeout_ms() -> u64 {
    10_000
}

fn default_price_class() -> String {
    "PriceClass_100".to_owned()
}

fn default_cache_policy() -> String {
    CACHING_OPTIMIZED.to_owned()
}

/// The WIT's `distribution-spec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct WitSpec {
    origin: String,
    aliases: Vec<String>,
    certificate_arn: Option<String>,
    comment: String,
}

impl WitSpec {
    fn of(spec: &Spec) -> Self {
        Self {
            origin: spec.origin.clone(),
            aliases: spec.aliases.clone(),
            certificate_arn: spec.certificate_arn.clone(),
            comment: spec.comment.clone(),
        }
    }

    /// The spec as CloudFront is told it, or why it cannot be.
    fn checked(self) -> Result<Spec, CapabilityError> {
        let origin = crate::model::bare(&self.origin);
        if origin.is_empty() || origin.contains('/') || origin.contains(' ') {
            return Err(CapabilityError::permanent(
                "invalid-request",
                format!("origin {:?} is not a host name", self.origin),
            ));
        }
        let mut aliases: Vec<String> = self.aliases.iter().map(|a| crate::model::bare(a)).collect();
        aliases.dedup();
        if !aliases.is_empty() && self.certificate_arn.is_none() {
            return Err(CapabilityError::permanent(
                "invalid-request",
                "a distribution with aliases needs the ACM certificate that covers them",
            ));
        }
        if self.comment.chars().count() > 128 {
            return Err(CapabilityError::permanent(
                "invalid-request",
                "CloudFront keeps at most 128 characters of comment",
            ));
        }
        Ok(Spec {
            origin,
            aliases,
            certificate_arn: self.certificate_arn.filter(|a| !a.is_empty()),
            comment: self.comment,
        })
    }
}

/// A distribution in the WIT's shape.
fn view(d: &Distribution) -> Value {
    json!({
        "id": d.id,
        "domain_name": d.domain_name,
        "hosted_zone_id": HOSTED_ZONE_ID,
        "spec": WitSpec::of(&d.spec),
        "status": if d.deployed() { "Deployed" } else { "InProgress" },
    })
}

/// What the ledger holds of a creation before its answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Created {
    id: Option<String>,
}

pub struct CloudFront {
    client: cloudfront::CloudFront,
    shape: Shape,
    ledger: Ledger,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for CloudFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudFront").finish_non_exhaustive()
    }
}

impl CloudFront {
    pub async fn new(s: &CloudFrontSettings, node: &Node) -> Result<Self, SettingsError> {
        if !PRICE_CLASSES.contains(&s.price_class.as_str()) {
            return Err(SettingsError::new(
                Capability::Cdn,
                "price_class",
                format!(
                    "`{}` is not one of {}",
                    s.price_class,
                    PRICE_CLASSES.join(", ")
                ),
            ));
        }
        if s.cache_policy_id.trim().is_empty() {
            return Err(SettingsError::new(
                Capability::Cdn,
                "cache_policy_id",
                "must not be empty",
            ));
        }
        let aws = crate::aws::Access {
            capability: Capability::Cdn,
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
            client: cloudfront::CloudFront::new(&aws),
            shape: Shape {
                price_class: s.price_class.clone(),
                cache_policy_id: s.cache_policy_id.trim().to_owned(),
            },
            ledger: Ledger::new(node.store.writer().clone(), "cloudfront"),
            clock: node.clock.clone(),
        })
    }

    fn now(&self) -> i64 {
        i64::try_from(self.clock.now_millis()).unwrap_or(i64::MAX)
    }

    /// A distribution other than `own` that holds one of the spec's aliases, with the alias.
    async fn alias_holder(
        &self,
        spec: &Spec,
        own: Option<&str>,
    ) -> Result<Option<(String, Distribution)>, CapabilityError> {
        if spec.aliases.is_empty() {
            return Ok(None);
        }
        for other in self.client.list().await? {
            if Some(other.id.as_str()) == own {
                continue;
            }
            if let Some(alias) = other.spec.aliases.iter().find(|a| spec.aliases.contains(a)) {
                return Ok(Some((alias.clone(), other)));
            }
        }
        Ok(None)
    }

    /// The distribution made under `reference`, if CloudFront has one: those serving the
    /// spec's aliases (or, without aliases, every one) read whole.
    async fn by_reference(
        &self,
        reference: &str,
        spec: &Spec,
    ) -> Result<Option<Distribution>, CapabilityError> {
        for candidate in self.client.list().await? {
            if candidate.spec.aliases != spec.aliases {
                continue;
            }
            let d = match self.client.get(&candidate.id).await {
                Ok(d) => d,
                Err(e) if e.code == "not-found" => continue,
                Err(e) => return Err(e),
            };
            if d.caller_reference.as_deref() == Some(reference) {
                return Ok(Some(d));
            }
        }
        Ok(None)
    }

    async fn create(&self, request: &Value, token: &str) -> Answer {
        const OP: &str = "cdn.create-distribution";
        let spec = arg::<WitSpec>(request, "spec")?.checked()?;
        let token = if token.is_empty() {
            capstan_core::ids::new_id()
        } else {
            token.to_owned()
        };
        let reference = CALLER_REFERENCE.derive(&token);
        let known = match self.ledger.get(&token, OP, request).await? {
            Some(Entry::Done(answer)) => return Ok(answer),
            Some(Entry::Intent(body)) => {
                let created: Created = serde_json::from_value(body).map_err(storage)?;
                match created.id {
                    Some(id) => Some(self.client.get(&id).await?),
                    None => self.by_reference(&reference, &spec).await?,
                }
            }
            None => match self.alias_holder(&spec, None).await? {
                // Made under this token by a node whose ledger is not this one.
                Some((alias, holder)) => {
                    let holder = self.client.get(&holder.id).await?;
                    if holder.caller_reference.as_deref() != Some(reference.as_str()) {
                        return Err(alias_in_use(&alias, &holder.id));
                    }
                    Some(holder)
                }
                None => {
                    self.ledger
                        .intend(&token, OP, request, &json!(Created::default()), self.now())
                        .await?;
                    None
                }
            },
        };
        let d = match known {
            Some(d) => d,
            None => match self.client.create(&spec, &reference, &self.shape).await {
                Ok(d) => d,
                // Made under this reference before (an answer lost to a crash).
                Err(e) if e.code == "distribution-exists" => {
                    self.by_reference(&reference, &spec).await?.ok_or(e)?
                }
                Err(e) => {
                    if !e.is_transient() {
                        self.ledger.forget(&token).await?;
                    }
                    return Err(e);
                }
            },
        };
        let created = Created {
            id: Some(d.id.clone()),
        };
        self.ledger
            .intend(&token, OP, request, &json!(created), self.now())
            .await?;
        let answer = view(&d);
        self.ledger.done(&token, OP, &answer, self.now()).await?;
        Ok(answer)
    }

    async fn update(&self, request: &Value, token: &str) -> Answer {
        const OP: &str = "cdn.update-distribution";
        let id: String = arg(request, "id")?;
        let spec = arg::<WitSpec>(request, "spec")?.checked()?;
        let earlier = if token.is_empty() {
            None
        } else {
            self.ledger.get(token, OP, request).await?
        };
        let before = match earlier {
            Some(Entry::Done(answer)) => return Ok(answer),
            Some(Entry::Intent(before)) => before,
            None => {
                let before = view(&self.client.get(&id).await?);
                if let Some((alias, holder)) = self.alias_holder(&spec, Some(&id)).await? {
                    return Err(alias_in_use(&alias, &holder.id));
                }
                if !token.is_empty() {
                    self.ledger
                        .intend(token, OP, request, &before, self.now())
                        .await?;
                }
                before
            }
        };
        let after = view(&self.client.update(&id, &spec).await?);
        let answer = json!({"before": before, "after": after});
        if !token.is_empty() {
            self.ledger.done(token, OP, &answer, self.now()).await?;
        }
        Ok(answer)
    }

    async fn delete(&self, request: &Value, token: &str) -> Answer {
        const OP: &str = "cdn.delete-distribution";
        let id: String = arg(request, "id")?;
        let earlier = if token.is_empty() {
            None
        } else {
            self.ledger.get(token, OP, request).await?
        };
        let was = match earlier {
            Some(Entry::Done(answer)) => return Ok(answer),
            Some(Entry::Intent(was)) => was,
            None => {
                let was = view(&self.client.get(&id).await?);
                if !token.is_empty() {
                    self.ledger
                        .intend(token, OP, request, &was, self.now())
                        .await?;
                }
                was
            }
        };
        let now = match self.client.get(&id).await {
            Ok(d) => Some(d),
            Err(e) if e.code == "not-found" => None,
            Err(e) => return Err(e),
        };
        if let Some(d) = now {
            if d.enabled {
                self.client.disable(&id).await?;
                return Err(disabling(&id));
            }
            if !d.deployed() {
                return Err(disabling(&id));
            }
            match self.client.delete(&id).await {
                Ok(()) => {}
                Err(e) if e.code == "not-found" => {}
                Err(e) => return Err(e),
            }
        }
        if !token.is_empty() {
            self.ledger.done(token, OP, &was, self.now()).await?;
        }
        Ok(was)
    }

    async fn find(&self, request: &Value) -> Answer {
        let alias = crate::model::bare(&arg::<String>(request, "alias")?);
        let found = self
            .client
            .list()
            .await?
            .into_iter()
            .find(|d| d.spec.aliases.contains(&alias));
        match found {
            // Read whole: the listing's status can lag the distribution's.
            Some(d) => Ok(view(&self.client.get(&d.id).await?)),
            None => Ok(Value::Null),
        }
    }
}

fn alias_in_use(alias: &str, holder: &str) -> CapabilityError {
    CapabilityError::permanent(
        "alias-in-use",
        format!("{alias} is an alias of distribution {holder}"),
    )
}

fn disabling(id: &str) -> CapabilityError {
    CapabilityError::transient(
        "distribution-disabling",
        format!("distribution {id} is being disabled; CloudFront deletes it once that is deployed"),
    )
}

#[async_trait]
impl Providers for CloudFront {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Answer {
        match op {
            "cdn.find-distribution-by-alias" => self.find(request).await,
            "cdn.get-distribution" => Ok(view(
                &self.client.get(&arg::<String>(request, "id")?).await?,
            )),
            "cdn.create-distribution" => self.create(request, token).await,
            "cdn.update-distribution" => self.update(request, token).await,
            "cdn.delete-distribution" => self.delete(request, token).await,
            other => Err(CapabilityError::permanent(
                "unsupported",
                format!("the cloudfront provider has no operation {other}"),
            )),
        }
    }

    fn kind(&self) -> &'static str {
        "cloudfront"
    }

    async fn reachable(&self) -> Result<(), String> {
        self.client.ping().await.map_err(|e| e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(aliases: &[&str], arn: Option<&str>) -> WitSpec {
        WitSpec {
            origin: "Origin.Example.ORG.".into(),
            aliases: aliases.iter().map(|a| (*a).to_owned()).collect(),
            certificate_arn: arn.map(str::to_owned),
            comment: "shop".into(),
        }
    }

    #[test]
    fn a_spec_is_checked_and_normalized_before_cloudfront_hears_of_it() {
        let ok = spec(
            &["Shop.Example.org"],
            Some("arn:aws:acm:us-east-1:1:certificate/c"),
        )
        .checked()
        .unwrap();
        assert_eq!(ok.origin, "origin.example.org");
        assert_eq!(ok.aliases, ["shop.example.org"]);
        let no_cert = spec(&["shop.example.org"], None).checked().unwrap_err();
        assert_eq!(no_cert.code, "invalid-request");
        assert!(!no_cert.is_transient());
        let mut bad_origin = spec(&[], None);
        bad_origin.origin = "https://origin.example.org/x".into();
        assert_eq!(bad_origin.checked().unwrap_err().code, "invalid-request");
        let mut long = spec(&[], None);
        long.comment = "x".repeat(129);
        assert_eq!(long.checked().unwrap_err().code, "invalid-request");
    }
}
