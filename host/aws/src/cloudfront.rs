//! Amazon CloudFront as the CDN adapter needs it: distributions read as the WIT's spec (origin,
//! aliases, ACM certificate, comment), created under a `CallerReference`, and changed or deleted
//! only under the `If-Match` of the configuration they were read with. An update changes those
//! four things and keeps everything else the distribution's configuration holds (cache
//! behaviours, logging, restrictions an operator set by hand).

use crate::{Aws, classify};
use aws_sdk_cloudfront::types::{
    Aliases, CustomOriginConfig, DefaultCacheBehavior, DistributionConfig, MinimumProtocolVersion,
    Origin, OriginProtocolPolicy, Origins, PriceClass, SslSupportMethod, ViewerCertificate,
    ViewerProtocolPolicy,
};
use capstan_core::CapabilityError;

/// The hosted zone of every CloudFront distribution's domain name: the target of Route 53
/// alias records, the same in every account.
pub const HOSTED_ZONE_ID: &str = "Z2FDTNDATAQYW2";

/// The id of the origin a distribution created here serves from.
const ORIGIN_ID: &str = "capstan-origin";

/// What the WIT says of a distribution's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Spec {
    /// The host name CloudFront fetches from.
    pub origin: String,
    pub aliases: Vec<String>,
    pub certificate_arn: Option<String>,
    pub comment: String,
}

/// A distribution as the adapter speaks of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Distribution {
    pub id: String,
    /// `d123.cloudfront.net`.
    pub domain_name: String,
    /// `InProgress` or `Deployed`.
    pub status: String,
    pub enabled: bool,
    pub spec: Spec,
    /// Set when the distribution was read whole (not from a listing).
    pub caller_reference: Option<String>,
}

impl Distribution {
    pub fn deployed(&self) -> bool {
        self.status == "Deployed"
    }
}

/// How distributions created here are shaped beyond the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// `PriceClass_100`, `PriceClass_200` or `PriceClass_All`.
    pub price_class: String,
    /// The cache policy of the default behaviour (AWS's managed `CachingOptimized` unless set).
    pub cache_policy_id: String,
}

/// A CloudFront client.
#[derive(Debug, Clone)]
pub struct CloudFront {
    client: aws_sdk_cloudfront::Client,
}

fn build_error(e: impl std::fmt::Display) -> CapabilityError {
    CapabilityError::permanent("invalid-request", e.to_string())
}

/// CloudFront's own codes read as the engine's.
fn known(code: &str, message: &str) -> Option<CapabilityError> {
    match code {
        "NoSuchDistribution" => Some(CapabilityError::permanent("not-found", message)),
        "CNAMEAlreadyExists" => Some(CapabilityError::permanent("alias-in-use", message)),
        // Someone changed the distribution since it was read: read again and retry.
        "PreconditionFailed" | "InvalidIfMatchVersion" => {
            Some(CapabilityError::transient("precondition-failed", message))
        }
        "DistributionNotDisabled" => Some(CapabilityError::transient(
            "distribution-disabling",
            message,
        )),
        "DistributionAlreadyExists" => {
            Some(CapabilityError::permanent("distribution-exists", message))
        }
        "InvalidViewerCertificate" => {
            Some(CapabilityError::permanent("invalid-certificate", message))
        }
        "TooManyDistributions" => Some(CapabilityError::permanent("limit-exceeded", message)),
        "InvalidArgument" | "MalformedInput" | "InconsistentQuantities" | "InvalidOrigin" => {
            Some(CapabilityError::permanent("invalid-request", message))
        }
        _ => None,
    }
}

fn bare(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

fn aliases(names: &[String]) -> Result<Aliases, CapabilityError> {
    Aliases::builder()
        .quantity(i32::try_from(names.len()).map_err(build_error)?)
        .set_items(Some(names.to_vec()))
        .build()
        .map_err(build_error)
}

fn viewer_certificate(arn: Option<&str>) -> ViewerCertificate {
    match arn {
        Some(arn) => ViewerCertificate::builder()
            .acm_certificate_arn(arn)
            .ssl_support_method(SslSupportMethod::SniOnly)
            .minimum_protocol_version(MinimumProtocolVersion::TlSv122021)
            .build(),
        None => ViewerCertificate::builder()
            .cloud_front_default_certificate(true)
            .build(),
    }
}

/// The spec a configuration holds: the origin of its default behaviour.
fn spec_of(config: &DistributionConfig) -> Spec {
    let target = config
        .default_cache_behavior
        .as_ref()
        .map(|b| b.target_origin_id.as_str());
    let origins = config
        .origins
        .as_ref()
        .map(|o| o.items.as_slice())
        .unwrap_or(&[]);
    let origin = origins
        .iter()
        .find(|o| Some(o.id.as_str()) == target)
        .or_else(|| origins.first())
        .map(|o| bare(&o.domain_name))
        .unwrap_or_default();
    Spec {
        origin,
        aliases: config
            .aliases
            .as_ref()
            .and_then(|a| a.items.as_ref())
            .map(|items| items.iter().map(|a| bare(a)).collect())
            .unwrap_or_default(),
        certificate_arn: config
            .viewer_certificate
            .as_ref()
            .and_then(|v| v.acm_certificate_arn.clone()),
        comment: config.comment.clone(),
    }
}

/// `config` changed to say `spec`, everything else kept.
fn apply(config: &mut DistributionConfig, spec: &Spec) -> Result<(), CapabilityError> {
    config.aliases = Some(aliases(&spec.aliases)?);
    config.comment = spec.comment.clone();
    config.viewer_certificate = Some(viewer_certificate(spec.certificate_arn.as_deref()));
    let target = config
        .default_cache_behavior
        .as_ref()
        .map(|b| b.target_origin_id.clone());
    if let Some(origins) = config.origins.as_mut() {
        let at = origins
            .items
            .iter()
            .position(|o| Some(&o.id) == target.as_ref())
            .unwrap_or(0);
        if let Some(origin) = origins.items.get_mut(at) {
            origin.domain_name = spec.origin.clone();
        }
    }
    Ok(())
}

impl CloudFront {
    pub fn new(aws: &Aws) -> Self {
        Self {
            client: aws_sdk_cloudfront::Client::new(&aws.config),
        }
    }

    /// One cheap call that needs the account's credentials (`/readyz`).
    pub async fn ping(&self) -> Result<(), CapabilityError> {
        self.client
            .list_distributions()
            .max_items(1)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        Ok(())
    }

    /// Every distribution of the account, from the listing (no caller reference).
    pub async fn list(&self) -> Result<Vec<Distribution>, CapabilityError> {
        let mut found = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let out = self
                .client
                .list_distributions()
                .set_marker(marker.take())
                .send()
                .await
                .map_err(|e| classify(&e, known))?;
            let Some(list) = out.distribution_list() else {
                break;
            };
            for d in list.items() {
                let target = d.default_cache_behavior().map(|b| b.target_origin_id());
                let origins = d.origins().map(|o| o.items()).unwrap_or(&[]);
                let origin = origins
                    .iter()
                    .find(|o| Some(o.id()) == target)
                    .or_else(|| origins.first())
                    .map(|o| bare(o.domain_name()))
                    .unwrap_or_default();
                found.push(Distribution {
                    id: d.id().to_owned(),
                    domain_name: bare(d.domain_name()),
                    status: d.status().to_owned(),
                    enabled: d.enabled(),
                    spec: Spec {
                        origin,
                        aliases: d
                            .aliases()
                            .map(|a| a.items().iter().map(|a| bare(a)).collect())
                            .unwrap_or_default(),
                        certificate_arn: d
                            .viewer_certificate()
                            .and_then(|v| v.acm_certificate_arn())
                            .map(str::to_owned),
                        comment: d.comment().to_owned(),
                    },
                    caller_reference: None,
                });
            }
            match (list.is_truncated(), list.next_marker()) {
                (true, Some(next)) if !next.is_empty() => marker = Some(next.to_owned()),
                _ => break,
            }
        }
        Ok(found)
    }

    /// The distribution `id`, read whole.
    pub async fn get(&self, id: &str) -> Result<Distribution, CapabilityError> {
        let out = self
            .client
            .get_distribution()
            .id(id)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        let d = out.distribution().ok_or_else(|| {
            CapabilityError::transient("unavailable", "CloudFront answered no distribution")
        })?;
        let config = d.distribution_config().ok_or_else(|| {
            CapabilityError::transient("unavailable", "CloudFront answered no configuration")
        })?;
        Ok(Distribution {
            id: d.id().to_owned(),
            domain_name: bare(d.domain_name()),
            status: d.status().to_owned(),
            enabled: config.enabled,
            spec: spec_of(config),
            caller_reference: Some(config.caller_reference.clone()),
        })
    }

    /// Creates a distribution saying `spec` under `caller_reference`.
    pub async fn create(
        &self,
        spec: &Spec,
        caller_reference: &str,
        shape: &Shape,
    ) -> Result<Distribution, CapabilityError> {
        let origin = Origin::builder()
            .id(ORIGIN_ID)
            .domain_name(&spec.origin)
            .custom_origin_config(
                CustomOriginConfig::builder()
                    .http_port(80)
                    .https_port(443)
                    .origin_protocol_policy(OriginProtocolPolicy::HttpsOnly)
                    .build()
                    .map_err(build_error)?,
            )
            .build()
            .map_err(build_error)?;
        let config = DistributionConfig::builder()
            .caller_reference(caller_reference)
            .aliases(aliases(&spec.aliases)?)
            .origins(
                Origins::builder()
                    .quantity(1)
                    .items(origin)
                    .build()
                    .map_err(build_error)?,
            )
            .default_cache_behavior(
                DefaultCacheBehavior::builder()
                    .target_origin_id(ORIGIN_ID)
                    .viewer_protocol_policy(ViewerProtocolPolicy::RedirectToHttps)
                    .cache_policy_id(&shape.cache_policy_id)
                    .compress(true)
                    .build()
                    .map_err(build_error)?,
            )
            .comment(&spec.comment)
            .enabled(true)
            .price_class(PriceClass::from(shape.price_class.as_str()))
            .viewer_certificate(viewer_certificate(spec.certificate_arn.as_deref()))
            .build()
            .map_err(build_error)?;
        let out = self
            .client
            .create_distribution()
            .distribution_config(config)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        let d = out.distribution().ok_or_else(|| {
            CapabilityError::transient("unavailable", "CloudFront answered no distribution")
        })?;
        Ok(Distribution {
            id: d.id().to_owned(),
            domain_name: bare(d.domain_name()),
            status: d.status().to_owned(),
            enabled: true,
            spec: d
                .distribution_config()
                .map(spec_of)
                .unwrap_or_else(|| spec.clone()),
            caller_reference: Some(caller_reference.to_owned()),
        })
    }

    /// The configuration of `id` and its ETag.
    async fn config(&self, id: &str) -> Result<(DistributionConfig, String), CapabilityError> {
        let out = self
            .client
            .get_distribution_config()
            .id(id)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        let etag = out.e_tag().map(str::to_owned).ok_or_else(|| {
            CapabilityError::transient("unavailable", "CloudFront answered no ETag")
        })?;
        let config = out.distribution_config().cloned().ok_or_else(|| {
            CapabilityError::transient("unavailable", "CloudFront answered no configuration")
        })?;
        Ok((config, etag))
    }

    async fn put(
        &self,
        id: &str,
        config: DistributionConfig,
        etag: &str,
    ) -> Result<(), CapabilityError> {
        self.client
            .update_distribution()
            .id(id)
            .if_match(etag)
            .distribution_config(config)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        Ok(())
    }

    /// Makes `id` say `spec` (under the ETag of the configuration just read), keeping the rest
    /// of its configuration; the distribution as it is then.
    pub async fn update(&self, id: &str, spec: &Spec) -> Result<Distribution, CapabilityError> {
        let (mut config, etag) = self.config(id).await?;
        if spec_of(&config) != *spec {
            apply(&mut config, spec)?;
            self.put(id, config, &etag).await?;
        }
        self.get(id).await
    }

    /// Disables `id` (CloudFront deletes only a disabled, deployed distribution).
    pub async fn disable(&self, id: &str) -> Result<(), CapabilityError> {
        let (mut config, etag) = self.config(id).await?;
        if config.enabled {
            config.enabled = false;
            self.put(id, config, &etag).await?;
        }
        Ok(())
    }

    /// Deletes `id` under the ETag of its configuration as read now.
    pub async fn delete(&self, id: &str) -> Result<(), CapabilityError> {
        let (_, etag) = self.config(id).await?;
        self.client
            .delete_distribution()
            .id(id)
            .if_match(etag)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_update_changes_the_spec_and_keeps_the_rest() {
        let origin =
            |id: &str, host: &str| Origin::builder().id(id).domain_name(host).build().unwrap();
        let mut config = DistributionConfig::builder()
            .caller_reference("ref")
            .comment("old")
            .enabled(true)
            .origins(
                Origins::builder()
                    .quantity(2)
                    .items(origin("logs", "logs.example.org"))
                    .items(origin("web", "old.example.org"))
                    .build()
                    .unwrap(),
            )
            .default_cache_behavior(
                DefaultCacheBehavior::builder()
                    .target_origin_id("web")
                    .viewer_protocol_policy(ViewerProtocolPolicy::AllowAll)
                    .build()
                    .unwrap(),
            )
            .price_class(PriceClass::PriceClassAll)
            .build()
            .unwrap();
        assert_eq!(spec_of(&config).origin, "old.example.org");
        let spec = Spec {
            origin: "new.example.org".into(),
            aliases: vec!["shop.example.org".into()],
            certificate_arn: Some("arn:aws:acm:us-east-1:1:certificate/c".into()),
            comment: "new".into(),
        };
        apply(&mut config, &spec).unwrap();
        assert_eq!(spec_of(&config), spec);
        let origins = &config.origins.as_ref().unwrap().items;
        assert_eq!(
            origins[0].domain_name, "logs.example.org",
            "other origins kept"
        );
        assert_eq!(config.price_class, Some(PriceClass::PriceClassAll));
        assert_eq!(
            config
                .default_cache_behavior
                .unwrap()
                .viewer_protocol_policy,
            ViewerProtocolPolicy::AllowAll
        );
    }
}
