//! Functions on AWS Lambda (`[providers.functions] kind = "lambda"`), through the AWS SDK for
//! Rust (`capstan-aws`).
//!
//! - **Publishing.** `publish-version` answers the newest published version when its code hash
//!   is the one asked for (a repeat after a crash, or nothing changed), else `PublishVersion`
//!   with `CodeSha256`, which Lambda refuses if `$LATEST` holds other code; a version answered
//!   with other code than asked (Lambda answers its last version when it sees nothing new) is the
//!   permanent `code-mismatch`. A version is never published twice for one request, and never
//!   answered with code the caller did not name.
//! - **Aliases.** `update-alias` and `route-alias` read the alias and change it under the
//!   revision id they read (a concurrent change is the transient `precondition-failed`, and the
//!   retry reads again). `update-alias` points it at the one version (a canary's weighted
//!   routing ends: promoting a version); `route-alias` sets Lambda's additional version weights
//!   too (at most one other version, Lambda's limit). The answer's `before` has the routing, so
//!   a rollback restores the alias exactly; the ledger keeps it, so a repeat answers the same.
//! - **Deleting a version** refuses one an alias routes to (`resource-in-use`, permanent), as
//!   the simulated cloud does; the answer is the version as it was (kept in the ledger).
//! - **Code hashes.** The WIT speaks of a package's SHA-256 in hex (what `sha256sum` prints and
//!   the orchestration API takes); Lambda's `CodeSha256` is the same digest in base64. The
//!   adapter translates both ways.
//! - **Probe.** The alias is invoked synchronously with `probe_payload`. Healthy: Lambda answered
//!   2xx without a function error and, if the function returned a JSON object with a boolean
//!   `healthy`, that is `true`.

use crate::ledger::{Entry, Ledger};
use crate::model::arg;
use crate::{Node, SettingsError};
use async_trait::async_trait;
use capstan_aws::lambda::{self, Alias, Invocation, Version};
use capstan_core::{Capability, CapabilityError, Clock, Providers};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

type Answer = Result<Value, CapabilityError>;

/// `[providers.functions] kind = "lambda"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LambdaSettings {
    /// The functions' region (default: the AWS chain's region, else `us-east-1`).
    #[serde(default)]
    pub region: Option<String>,
    /// Another endpoint than AWS's (a VPC endpoint; moto in the tests).
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// Deadline of one call to Lambda (a probe included).
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
    /// The JSON event a probe sends (default `{"capstanProbe": true}`).
    #[serde(default = "default_probe_payload")]
    pub probe_payload: String,
}

fn default_timeout_ms() -> u64 {
    30_000
}

fn default_probe_payload() -> String {
    r#"{"capstanProbe": true}"#.to_owned()
}

/// A hex SHA-256 as Lambda writes it (base64); anything else as given.
fn to_lambda(sha: &str) -> String {
    use base64::Engine as _;
    match hex::decode(sha) {
        Ok(bytes) if bytes.len() == 32 => base64::engine::general_purpose::STANDARD.encode(bytes),
        _ => sha.to_owned(),
    }
}

/// Lambda's base64 SHA-256 in hex, as the WIT speaks of it; anything else as given.
fn from_lambda(sha: &str) -> String {
    use base64::Engine as _;
    match base64::engine::general_purpose::STANDARD.decode(sha) {
        Ok(bytes) if bytes.len() == 32 => hex::encode(bytes),
        _ => sha.to_owned(),
    }
}

fn version_view(v: &Version) -> Value {
    json!({"function_name": v.function_name, "version": v.version, "code_sha256": from_lambda(&v.code_sha256)})
}

fn alias_view(a: &Alias) -> Value {
    let routing: Vec<Value> = a
        .weighted
        .iter()
        .map(|(version, weight)| json!({"version": version, "weight": weight}))
        .collect();
    json!({"function_name": a.function_name, "name": a.name, "version": a.version, "routing": routing})
}

/// A `routing` argument as Lambda's additional version weights: at most one other version
/// (Lambda's limit), its weight from 0 to 1.
fn routing_of(request: &Value, version: &str) -> Result<Vec<(String, f64)>, CapabilityError> {
    #[derive(Deserialize)]
    struct Weight {
        version: String,
        weight: f64,
    }
    let routing: Vec<Weight> = match request.get("routing") {
        None | Some(Value::Null) => Vec::new(),
        Some(_) => arg(request, "routing")?,
    };
    if routing.len() > 1 {
        return Err(CapabilityError::permanent(
            "invalid-request",
            "Lambda routes an alias to at most one other version",
        ));
    }
    routing
        .into_iter()
        .map(|w| {
            if !(0.0..=1.0).contains(&w.weight) || w.version == version {
                Err(CapabilityError::permanent(
                    "invalid-request",
                    format!(
                        "routing {} at {} is not a weight from 0 to 1 for another version than {version}",
                        w.version, w.weight
                    ),
                ))
            } else {
                Ok((w.version, w.weight))
            }
        })
        .collect()
}

/// Whether a probe's invocation says healthy.
fn healthy(invocation: &Invocation) -> bool {
    if !(200..300).contains(&invocation.status) || invocation.function_error.is_some() {
        return false;
    }
    match serde_json::from_slice::<Value>(&invocation.payload) {
        Ok(Value::Object(answer)) => answer
            .get("healthy")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        _ => true,
    }
}

pub struct Lambda {
    client: lambda::Lambda,
    probe_payload: Vec<u8>,
    ledger: Ledger,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Lambda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lambda").finish_non_exhaustive()
    }
}

impl Lambda {
    pub async fn new(s: &LambdaSettings, node: &Node) -> Result<Self, SettingsError> {
        if let Err(e) = serde_json::from_str::<Value>(&s.probe_payload) {
            return Err(SettingsError::new(
                Capability::Functions,
                "probe_payload",
                format!("is not JSON: {e}"),
            ));
        }
        let aws = crate::aws::Access {
            capability: Capability::Functions,
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
            client: lambda::Lambda::new(&aws),
            probe_payload: s.probe_payload.as_bytes().to_vec(),
            ledger: Ledger::new(node.store.writer().clone(), "lambda"),
            clock: node.clock.clone(),
        })
    }

    fn now(&self) -> i64 {
        i64::try_from(self.clock.now_millis()).unwrap_or(i64::MAX)
    }

    async fn publish(&self, request: &Value) -> Answer {
        let name: String = arg(request, "function_name")?;
        let sha = to_lambda(&arg::<String>(request, "code_sha256")?);
        if let Some(newest) = self.client.versions(&name).await?.pop()
            && newest.code_sha256 == sha
        {
            return Ok(version_view(&newest));
        }
        let published = self.client.publish(&name, &sha).await?;
        // Lambda answers its last version when it sees nothing new to publish: that version's
        // code must still be the code asked for.
        if published.code_sha256 != sha {
            return Err(CapabilityError::permanent(
                "code-mismatch",
                format!(
                    "Lambda answered version {} of {name}, whose code is not the one asked for: update the function's code first",
                    published.version
                ),
            ));
        }
        Ok(version_view(&published))
    }

    async fn delete_version(&self, request: &Value, token: &str) -> Answer {
        const OP: &str = "functions.delete-version";
        let name: String = arg(request, "function_name")?;
        let version: String = arg(request, "version")?;
        let earlier = if token.is_empty() {
            None
        } else {
            self.ledger.get(token, OP, request).await?
        };
        let was =
            match earlier {
                Some(Entry::Done(answer)) => return Ok(answer),
                Some(Entry::Intent(was)) => was,
                None => {
                    let was = version_view(&self.client.version(&name, &version).await?);
                    if let Some(alias) = self.client.aliases(&name).await?.into_iter().find(|a| {
                        a.version == version || a.weighted.iter().any(|(v, _)| *v == version)
                    }) {
                        return Err(CapabilityError::permanent(
                            "resource-in-use",
                            format!(
                                "version {version} of {name} is a target of alias {}",
                                alias.name
                            ),
                        ));
                    }
                    if !token.is_empty() {
                        self.ledger
                            .intend(token, OP, request, &was, self.now())
                            .await?;
                    }
                    was
                }
            };
        match self.client.delete_version(&name, &version).await {
            Ok(()) => {}
            // Deleted before a crash.
            Err(e) if e.code == "not-found" => {}
            Err(e) => return Err(e),
        }
        if !token.is_empty() {
            self.ledger.done(token, OP, &was, self.now()).await?;
        }
        Ok(was)
    }

    /// `update-alias` (`routing` absent: all traffic to `version`) and `route-alias`.
    async fn update_alias(&self, op: &'static str, request: &Value, token: &str) -> Answer {
        let name: String = arg(request, "function_name")?;
        let alias: String = arg(request, "alias")?;
        let version: String = arg(request, "version")?;
        let routing = routing_of(request, &version)?;
        let earlier = if token.is_empty() {
            None
        } else {
            self.ledger.get(token, op, request).await?
        };
        let current = match earlier {
            Some(Entry::Done(answer)) => return Ok(answer),
            Some(Entry::Intent(before)) => (before, self.client.alias(&name, &alias).await?),
            None => {
                let current = self.client.alias(&name, &alias).await?;
                // The versions must exist: Lambda says so too, but after the ledger's intent.
                self.client.version(&name, &version).await?;
                for (other, _) in &routing {
                    self.client.version(&name, other).await?;
                }
                let before = alias_view(&current);
                if !token.is_empty() {
                    self.ledger
                        .intend(token, op, request, &before, self.now())
                        .await?;
                }
                (before, current)
            }
        };
        let (before, current) = current;
        let after = if current.version == version && current.weighted == routing {
            current
        } else {
            self.client.point(&current, &version, &routing).await?
        };
        let answer = json!({"before": before, "after": alias_view(&after)});
        if !token.is_empty() {
            self.ledger.done(token, op, &answer, self.now()).await?;
        }
        Ok(answer)
    }

    async fn probe(&self, request: &Value) -> Answer {
        let name: String = arg(request, "function_name")?;
        let alias: String = arg(request, "alias")?;
        let invocation = self
            .client
            .invoke(&name, &alias, &self.probe_payload)
            .await?;
        if !healthy(&invocation) {
            tracing::info!(
                function = %name,
                alias = %alias,
                status = invocation.status,
                function_error = invocation.function_error.as_deref().unwrap_or(""),
                "probe answered unhealthy"
            );
        }
        Ok(json!(healthy(&invocation)))
    }
}

#[async_trait]
impl Providers for Lambda {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Answer {
        match op {
            "functions.publish-version" => self.publish(request).await,
            "functions.delete-version" => self.delete_version(request, token).await,
            "functions.get-alias" => Ok(alias_view(
                &self
                    .client
                    .alias(
                        &arg::<String>(request, "function_name")?,
                        &arg::<String>(request, "alias")?,
                    )
                    .await?,
            )),
            "functions.update-alias" => {
                self.update_alias("functions.update-alias", request, token)
                    .await
            }
            "functions.route-alias" => {
                self.update_alias("functions.route-alias", request, token)
                    .await
            }
            "functions.probe" => self.probe(request).await,
            other => Err(CapabilityError::permanent(
                "unsupported",
                format!("the lambda provider has no operation {other}"),
            )),
        }
    }

    fn kind(&self) -> &'static str {
        "lambda"
    }

    async fn reachable(&self) -> Result<(), String> {
        self.client.ping().await.map_err(|e| e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_hashes_are_hex_in_the_wit_and_base64_at_lambda() {
        let hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let b64 = "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=";
        assert_eq!(to_lambda(hex), b64);
        assert_eq!(to_lambda(&hex.to_ascii_uppercase()), b64);
        assert_eq!(from_lambda(b64), hex);
        assert_eq!(to_lambda("not-a-digest"), "not-a-digest");
    }

    #[test]
    fn a_probe_is_healthy_only_on_a_clean_answer_that_does_not_say_otherwise() {
        let answer = |status: i32, error: Option<&str>, payload: &str| Invocation {
            status,
            function_error: error.map(str::to_owned),
            payload: payload.as_bytes().to_vec(),
        };
        assert!(healthy(&answer(200, None, r#"{"healthy": true}"#)));
        assert!(healthy(&answer(200, None, "\"pong\"")));
        assert!(healthy(&answer(200, None, "")));
        assert!(healthy(&answer(200, None, r#"{"status": "ok"}"#)));
        assert!(!healthy(&answer(200, None, r#"{"healthy": false}"#)));
        assert!(!healthy(&answer(200, Some("Unhandled"), "{}")));
        assert!(!healthy(&answer(500, None, "{}")));
    }
}
