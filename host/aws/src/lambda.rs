//! AWS Lambda as the functions adapter needs it: published versions and their code hashes,
//! aliases changed under their revision id, and a probe by synchronous invocation.

use crate::{Aws, classify};
use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::{AliasRoutingConfiguration, InvocationType};
use capstan_core::CapabilityError;

/// A published version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub function_name: String,
    pub version: String,
    pub code_sha256: String,
}

/// An alias and the revision it was read at.
#[derive(Debug, Clone, PartialEq)]
pub struct Alias {
    pub function_name: String,
    pub name: String,
    pub version: String,
    /// Versions that get a share of the alias's traffic besides `version`, with their share
    /// (0 to 1), by version.
    pub weighted: Vec<(String, f64)>,
    pub revision_id: Option<String>,
}

/// What a synchronous invocation answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub status: i32,
    /// Set when the function raised (`Unhandled`) or returned an error.
    pub function_error: Option<String>,
    pub payload: Vec<u8>,
}

/// A Lambda client.
#[derive(Debug, Clone)]
pub struct Lambda {
    client: aws_sdk_lambda::Client,
}

/// Lambda's own codes read as the engine's.
fn known(code: &str, message: &str) -> Option<CapabilityError> {
    match code {
        "ResourceNotFoundException" => Some(CapabilityError::permanent("not-found", message)),
        "ResourceConflictException" => {
            Some(CapabilityError::transient("resource-conflict", message))
        }
        // The alias changed since it was read: read again and retry.
        "PreconditionFailedException" => {
            Some(CapabilityError::transient("precondition-failed", message))
        }
        "InvalidParameterValueException" => {
            Some(CapabilityError::permanent("invalid-request", message))
        }
        "CodeStorageExceededException" => {
            Some(CapabilityError::permanent("limit-exceeded", message))
        }
        "TooManyRequestsException" => Some(CapabilityError::transient("throttling", message)),
        _ => None,
    }
}

fn version_of(
    function_name: &str,
    version: Option<&str>,
    sha: Option<&str>,
) -> Result<Version, CapabilityError> {
    Ok(Version {
        function_name: function_name.to_owned(),
        version: version.map(str::to_owned).ok_or_else(|| {
            CapabilityError::transient("unavailable", "Lambda answered no version")
        })?,
        code_sha256: sha.unwrap_or_default().to_owned(),
    })
}

impl Lambda {
    pub fn new(aws: &Aws) -> Self {
        Self {
            client: aws_sdk_lambda::Client::new(&aws.config),
        }
    }

    /// One cheap call that needs the account's credentials (`/readyz`).
    pub async fn ping(&self) -> Result<(), CapabilityError> {
        self.client
            .list_functions()
            .max_items(1)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        Ok(())
    }

    /// The published versions of `function_name`, oldest first (`$LATEST` left out).
    pub async fn versions(&self, function_name: &str) -> Result<Vec<Version>, CapabilityError> {
        let mut versions = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let out = self
                .client
                .list_versions_by_function()
                .function_name(function_name)
                .set_marker(marker.take())
                .send()
                .await
                .map_err(|e| classify(&e, known))?;
            for v in out.versions() {
                if v.version() == Some("$LATEST") {
                    continue;
                }
                versions.push(version_of(function_name, v.version(), v.code_sha256())?);
            }
            match out.next_marker() {
                Some(next) if !next.is_empty() => marker = Some(next.to_owned()),
                _ => break,
            }
        }
        versions.sort_by_key(|v| v.version.parse::<u64>().unwrap_or(u64::MAX));
        Ok(versions)
    }

    /// Publishes `$LATEST` as a version, only if its code hash is `code_sha256`.
    pub async fn publish(
        &self,
        function_name: &str,
        code_sha256: &str,
    ) -> Result<Version, CapabilityError> {
        let out = self
            .client
            .publish_version()
            .function_name(function_name)
            .code_sha256(code_sha256)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        version_of(function_name, out.version(), out.code_sha256())
    }

    /// The version `version` of `function_name`.
    pub async fn version(
        &self,
        function_name: &str,
        version: &str,
    ) -> Result<Version, CapabilityError> {
        let out = self
            .client
            .get_function_configuration()
            .function_name(function_name)
            .qualifier(version)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        version_of(function_name, out.version(), out.code_sha256())
    }

    pub async fn delete_version(
        &self,
        function_name: &str,
        version: &str,
    ) -> Result<(), CapabilityError> {
        self.client
            .delete_function()
            .function_name(function_name)
            .qualifier(version)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        Ok(())
    }

    fn alias_of(
        function_name: &str,
        name: Option<&str>,
        version: Option<&str>,
        routing: Option<&AliasRoutingConfiguration>,
        revision_id: Option<&str>,
    ) -> Alias {
        let mut weighted: Vec<(String, f64)> = routing
            .and_then(|r| r.additional_version_weights())
            .map(|w| w.iter().map(|(v, share)| (v.clone(), *share)).collect())
            .unwrap_or_default();
        weighted.sort_by(|a, b| a.0.cmp(&b.0));
        Alias {
            function_name: function_name.to_owned(),
            name: name.unwrap_or_default().to_owned(),
            version: version.unwrap_or_default().to_owned(),
            weighted,
            revision_id: revision_id.map(str::to_owned),
        }
    }

    pub async fn alias(&self, function_name: &str, name: &str) -> Result<Alias, CapabilityError> {
        let out = self
            .client
            .get_alias()
            .function_name(function_name)
            .name(name)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        Ok(Self::alias_of(
            function_name,
            out.name().or(Some(name)),
            out.function_version(),
            out.routing_config(),
            out.revision_id(),
        ))
    }

    /// Every alias of `function_name`.
    pub async fn aliases(&self, function_name: &str) -> Result<Vec<Alias>, CapabilityError> {
        let mut aliases = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let out = self
                .client
                .list_aliases()
                .function_name(function_name)
                .set_marker(marker.take())
                .send()
                .await
                .map_err(|e| classify(&e, known))?;
            for a in out.aliases() {
                aliases.push(Self::alias_of(
                    function_name,
                    a.name(),
                    a.function_version(),
                    a.routing_config(),
                    a.revision_id(),
                ));
            }
            match out.next_marker() {
                Some(next) if !next.is_empty() => marker = Some(next.to_owned()),
                _ => break,
            }
        }
        Ok(aliases)
    }

    /// Points `alias` (as read at `revision_id`) at `version`, sending each `weighted` version
    /// its share of the traffic (none: all of it goes to `version`).
    pub async fn point(
        &self,
        alias: &Alias,
        version: &str,
        weighted: &[(String, f64)],
    ) -> Result<Alias, CapabilityError> {
        let routing = AliasRoutingConfiguration::builder()
            .set_additional_version_weights(Some(weighted.iter().cloned().collect()))
            .build();
        let out = self
            .client
            .update_alias()
            .function_name(&alias.function_name)
            .name(&alias.name)
            .function_version(version)
            .routing_config(routing)
            .set_revision_id(alias.revision_id.clone())
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        Ok(Self::alias_of(
            &alias.function_name,
            out.name().or(Some(&alias.name)),
            out.function_version(),
            out.routing_config(),
            out.revision_id(),
        ))
    }

    /// Invokes `qualifier` of `function_name` synchronously with `payload`.
    pub async fn invoke(
        &self,
        function_name: &str,
        qualifier: &str,
        payload: &[u8],
    ) -> Result<Invocation, CapabilityError> {
        let out = self
            .client
            .invoke()
            .function_name(function_name)
            .qualifier(qualifier)
            .invocation_type(InvocationType::RequestResponse)
            .payload(Blob::new(payload))
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        Ok(Invocation {
            status: out.status_code(),
            function_error: out.function_error().map(str::to_owned),
            payload: out
                .payload()
                .map(|b| b.as_ref().to_vec())
                .unwrap_or_default(),
        })
    }
}
