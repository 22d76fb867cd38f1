//! Maps referrer keys on the Google Cloud API Keys API v2 (`[providers.maps] kind = "apikeys"`),
//! over HTTPS with a service account's OAuth 2 access token (`gcp_auth` signs the JWT grant
//! and keeps the token until it expires).
//!
//! - **Which keys.** The project's browser keys: those with website restrictions
//!   (`restrictions.browserKeyRestrictions`), or only the ids of `keys` when the settings name
//!   them. A key without website restrictions is never changed: giving it a first referrer
//!   would shut out every site that uses it now (`not-a-browser-key`).
//! - **Changing referrers.** Read the key, then `PATCH ...?updateMask=restrictions` with the
//!   whole restriction and the `etag` read: a concurrent change is refused by Google (`ABORTED`)
//!   and is the transient `precondition-failed`, so the engine's retry reads again. The change
//!   is a long-running operation, polled until done (within `operation_timeout_ms`; after that
//!   the transient `operation-pending`, and the retry polls the same operation). Each change
//!   sends the whole list, so the key is read back once the operation is done: a change another
//!   writer replaced meanwhile is the transient `precondition-failed`, and the retry sends it
//!   again. Changes from one node go one at a time.
//! - **Idempotency.** The API has no request ids, so the token ledger records, before the
//!   PATCH, whether the referrer was already there (and then the operation's name): a repeat
//!   after a crash answers `changed` as the first call would have, and a rollback removes only
//!   what this call added.
//! - **Capacity.** `referrer_capacity` (default 1200, the console's limit) is what a key may
//!   hold; a full key is the permanent `capacity-exhausted` before anything is sent.

use crate::http::{self, segment};
use crate::ledger::{Entry, Ledger};
use crate::model::arg;
use crate::{Node, SettingsError};
use async_trait::async_trait;
use capstan_core::{Capability, CapabilityError, Clock, Providers};
use gcp_auth::TokenProvider;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

type Answer = Result<Value, CapabilityError>;

const SERVICE: &str = "Google API Keys";
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// `[providers.maps] kind = "apikeys"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeysSettings {
    /// The Google Cloud project (id or number) that holds the keys.
    pub project: String,
    /// Only these key ids (the last segment of a key's name); default: every browser key.
    #[serde(default)]
    pub keys: Option<Vec<String>>,
    /// How many referrers a key may hold.
    #[serde(default = "default_capacity")]
    pub referrer_capacity: u32,
    /// The service account's JSON key, from a file or a named environment variable.
    #[serde(default)]
    pub service_account_key_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub service_account_key_env: Option<String>,
    /// Another endpoint than `https://apikeys.googleapis.com` (a private endpoint; the tests'
    /// contract server). The token endpoint is the key's own `token_uri`.
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// Deadline of one request.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// How long one call polls a change's long-running operation before it answers the
    /// transient `operation-pending`.
    #[serde(default = "default_operation_timeout_ms")]
    pub operation_timeout_ms: u64,
}

fn default_capacity() -> u32 {
    1200
}

fn default_timeout_ms() -> u64 {
    30_000
}

fn default_operation_timeout_ms() -> u64 {
    60_000
}

/// A key as the API answers it (the fields the adapter reads).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Key {
    name: String,
    #[serde(default)]
    display_name: String,
    #[serde(default)]
    restrictions: Option<Value>,
    #[serde(default)]
    etag: Option<String>,
    #[serde(default)]
    delete_time: Option<String>,
}

impl Key {
    fn id(&self) -> &str {
        self.name.rsplit('/').next().unwrap_or(&self.name)
    }

    /// The website restriction's referrers, or `None` when the key has none.
    fn referrers(&self) -> Option<Vec<String>> {
        let browser = self.restrictions.as_ref()?.get("browserKeyRestrictions")?;
        Some(
            browser
                .get("allowedReferrers")
                .and_then(Value::as_array)
                .map(|all| {
                    all.iter()
                        .filter_map(|r| r.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
        )
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyPage {
    #[serde(default)]
    keys: Vec<Key>,
    #[serde(default)]
    next_page_token: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Operation {
    name: String,
    #[serde(default)]
    done: bool,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    response: Option<Value>,
}

/// What the ledger keeps of a referrer change before it is answered.
#[derive(Debug, Serialize, Deserialize)]
struct Intent {
    /// Whether the referrer was on the key before this call (so `changed` is the first
    /// call's answer on every repeat).
    was_present: bool,
    /// The long-running operation of the PATCH, once sent.
    #[serde(default)]
    operation: Option<String>,
}

pub struct ApiKeys {
    http: reqwest::Client,
    auth: gcp_auth::CustomServiceAccount,
    endpoint: String,
    project: String,
    keys: Option<Vec<String>>,
    capacity: u32,
    operation_timeout: Duration,
    ledger: Ledger,
    clock: Arc<dyn Clock>,
    /// One change at a time from this node: each sends a key's whole referrer list, so two at
    /// once would race for the etag (other nodes are kept apart by the etag and the read-back).
    changing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeys")
            .field("project", &self.project)
            .finish_non_exhaustive()
    }
}

impl ApiKeys {
    pub fn new(s: &ApiKeysSettings, node: &Node) -> Result<Self, SettingsError> {
        let c = Capability::Maps;
        segment("project", &s.project).map_err(|e| SettingsError::new(c, "project", e.message))?;
        for id in s.keys.iter().flatten() {
            segment("key id", id).map_err(|e| SettingsError::new(c, "keys", e.message))?;
        }
        if s.referrer_capacity == 0 {
            return Err(SettingsError::new(
                c,
                "referrer_capacity",
                "must be above 0",
            ));
        }
        let key = crate::secret::read(
            c,
            "service_account_key",
            s.service_account_key_file.as_ref(),
            s.service_account_key_env.as_deref(),
        )?;
        let auth = gcp_auth::CustomServiceAccount::from_json(&key).map_err(|e| {
            SettingsError::new(
                c,
                "service_account_key",
                format!("is not a service account's JSON key: {e}"),
            )
        })?;
        let endpoint = match &s.endpoint_url {
            Some(url) => http::base_url(c, "endpoint_url", url)?,
            None => "https://apikeys.googleapis.com".to_owned(),
        };
        Ok(Self {
            http: http::client(c, s.timeout_ms)?,
            auth,
            endpoint,
            project: s.project.clone(),
            keys: s.keys.clone(),
            capacity: s.referrer_capacity,
            operation_timeout: Duration::from_millis(s.operation_timeout_ms),
            ledger: Ledger::new(node.store.writer().clone(), "apikeys"),
            clock: node.clock.clone(),
            changing: tokio::sync::Mutex::new(()),
        })
    }

    fn now(&self) -> i64 {
        i64::try_from(self.clock.now_millis()).unwrap_or(i64::MAX)
    }

    /// One request with the access token; the answer's JSON, or the capability error.
    async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let token = self.auth.token(&[SCOPE]).await.map_err(|e| {
            CapabilityError::transient(
                "token-unavailable",
                format!("no access token for the service account: {e}"),
            )
        })?;
        let (status, headers, json) =
            http::exchange(SERVICE, request.bearer_auth(token.as_str())).await?;
        if status.is_success() {
            return Ok(json);
        }
        // Google's error body: {"error": {"code", "message", "status"}}.
        let error = &json["error"];
        let detail = error["message"].as_str().unwrap_or_default();
        if error["status"] == "ABORTED" {
            return Err(CapabilityError::transient(
                "precondition-failed",
                format!("{SERVICE}: the key changed meanwhile ({detail}); read it again"),
            ));
        }
        Err(http::status_error(SERVICE, status, &headers, detail))
    }

    fn key_url(&self, id: &str) -> String {
        format!(
            "{}/v2/projects/{}/locations/global/keys/{id}",
            self.endpoint, self.project
        )
    }

    fn managed(&self, key: &Key) -> bool {
        key.delete_time.is_none()
            && key.referrers().is_some()
            && self
                .keys
                .as_ref()
                .is_none_or(|ids| ids.iter().any(|id| id == key.id()))
    }

    fn view(&self, key: &Key, referrers: &[String]) -> Value {
        json!({
            "id": key.id(),
            "display_name": key.display_name,
            "referrers": referrers,
            "capacity": self.capacity,
        })
    }

    async fn list(&self) -> Answer {
        let mut keys = Vec::new();
        let mut page_token: Option<String> = None;
        loop {
            let mut request = self
                .http
                .get(format!(
                    "{}/v2/projects/{}/locations/global/keys",
                    self.endpoint, self.project
                ))
                .query(&[("pageSize", "300")]);
            if let Some(t) = &page_token {
                request = request.query(&[("pageToken", t)]);
            }
            let page: KeyPage = parse(self.send(request).await?)?;
            for key in page.keys.iter().filter(|k| self.managed(k)) {
                keys.push(self.view(key, &key.referrers().unwrap_or_default()));
            }
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(next) => page_token = Some(next),
                None => return Ok(Value::Array(keys)),
            }
        }
    }

    async fn key(&self, id: &str) -> Result<(Key, Vec<String>), CapabilityError> {
        let key: Key = parse(self.send(self.http.get(self.key_url(id))).await?)?;
        if key.delete_time.is_some() {
            return Err(CapabilityError::permanent(
                "not-found",
                format!("maps API key {id} is deleted"),
            ));
        }
        if self
            .keys
            .as_ref()
            .is_some_and(|ids| !ids.iter().any(|k| k == id))
        {
            return Err(CapabilityError::permanent(
                "not-found",
                format!("maps API key {id} is not one of this provider's keys"),
            ));
        }
        let Some(referrers) = key.referrers() else {
            return Err(CapabilityError::permanent(
                "not-a-browser-key",
                format!(
                    "maps API key {} ({id}) has no website restrictions; a first referrer would shut out every site that uses it",
                    key.display_name
                ),
            ));
        };
        Ok((key, referrers))
    }

    /// Polls a long-running operation until it is done, within the operation timeout.
    async fn finish(&self, operation: Operation) -> Result<(), CapabilityError> {
        let started = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(200);
        let mut operation = operation;
        loop {
            if operation.done {
                if let Some(error) = operation.error {
                    return Err(CapabilityError::permanent(
                        "operation-failed",
                        format!(
                            "{SERVICE} operation {} failed: {}",
                            operation.name,
                            error["message"].as_str().unwrap_or("no message")
                        ),
                    ));
                }
                if operation.response.is_none() {
                    tracing::debug!(operation = %operation.name, "operation done without a response");
                }
                return Ok(());
            }
            if started.elapsed() >= self.operation_timeout {
                return Err(CapabilityError::transient(
                    "operation-pending",
                    format!("{SERVICE} operation {} is not done yet", operation.name),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
            segment_path(&operation.name)?;
            operation = parse(
                self.send(
                    self.http
                        .get(format!("{}/v2/{}", self.endpoint, operation.name)),
                )
                .await?,
            )?;
        }
    }

    async fn change(&self, op: &'static str, request: &Value, token: &str) -> Answer {
        let adding = op == "maps.add-referrer";
        let id: String = arg(request, "key_id")?;
        segment("key id", &id)?;
        let referrer = arg::<String>(request, "referrer")?.trim().to_owned();
        if referrer.is_empty() {
            return Err(CapabilityError::permanent(
                "invalid-request",
                "the referrer is empty",
            ));
        }
        let earlier = if token.is_empty() {
            None
        } else {
            self.ledger.get(token, op, request).await?
        };
        let intent = match earlier {
            Some(Entry::Done(answer)) => return Ok(answer),
            Some(Entry::Intent(intent)) => {
                Some(serde_json::from_value::<Intent>(intent).map_err(|e| {
                    CapabilityError::permanent("invalid-ledger", format!("intent of {op}: {e}"))
                })?)
            }
            None => None,
        };
        // An operation sent before a crash finishes first, so the key read next shows it.
        if let Some(Intent {
            operation: Some(name),
            ..
        }) = &intent
        {
            segment_path(name)?;
            let operation: Operation = parse(
                self.send(self.http.get(format!("{}/v2/{name}", self.endpoint)))
                    .await?,
            )?;
            self.finish(operation).await?;
        }
        let (key, referrers) = self.key(&id).await?;
        let present = referrers.contains(&referrer);
        let was_present = intent.as_ref().map_or(present, |i| i.was_present);
        let answer = |referrers: &[String]| json!({"key": self.view(&key, referrers), "changed": was_present != adding});
        if present == adding {
            // Nothing (more) to do: the key is as asked.
            let done = answer(&referrers);
            if !token.is_empty() {
                self.ledger.done(token, op, &done, self.now()).await?;
            }
            return Ok(done);
        }
        let mut wanted = referrers.clone();
        if adding {
            if wanted.len() as u64 >= u64::from(self.capacity) {
                if intent.is_some() {
                    self.ledger.forget(token).await?;
                }
                return Err(CapabilityError::permanent(
                    "capacity-exhausted",
                    format!(
                        "maps API key {} ({id}) holds its maximum of {} referrers",
                        key.display_name, self.capacity
                    ),
                ));
            }
            wanted.push(referrer.clone());
        } else {
            wanted.retain(|r| *r != referrer);
        }
        if !token.is_empty() {
            let intent = Intent {
                was_present,
                operation: None,
            };
            self.ledger
                .intend(token, op, request, &json!(intent), self.now())
                .await?;
        }
        let mut restrictions = key.restrictions.clone().unwrap_or_else(|| json!({}));
        restrictions["browserKeyRestrictions"]["allowedReferrers"] = json!(wanted);
        let mut body = json!({"name": key.name, "restrictions": restrictions});
        if let Some(etag) = &key.etag {
            body["etag"] = json!(etag);
        }
        let operation: Operation = parse(
            self.send(
                self.http
                    .patch(self.key_url(&id))
                    .query(&[("updateMask", "restrictions")])
                    .json(&body),
            )
            .await?,
        )?;
        if !token.is_empty() {
            let intent = Intent {
                was_present,
                operation: Some(operation.name.clone()),
            };
            self.ledger
                .intend(token, op, request, &json!(intent), self.now())
                .await?;
        }
        self.finish(operation).await?;
        // A change another writer made while this one's operation ran may have replaced it
        // (each sends the whole list): read it back. Lost, the retry sends it again.
        let (_, now) = self.key(&id).await?;
        if now.contains(&referrer) != adding {
            return Err(CapabilityError::transient(
                "precondition-failed",
                format!(
                    "{SERVICE}: a concurrent change to key {id} replaced this one; sending it again"
                ),
            ));
        }
        let done = answer(&now);
        if !token.is_empty() {
            self.ledger.done(token, op, &done, self.now()).await?;
        }
        Ok(done)
    }
}

/// An operation's name as a path under `/v2/` (`operations/akmf.p7-...`).
fn segment_path(name: &str) -> Result<(), CapabilityError> {
    match name.split_once('/') {
        Some(("operations", id)) => segment("operation", id).map(|_| ()),
        _ => Err(CapabilityError::permanent(
            "invalid-response",
            format!("{SERVICE} answered an operation named `{name}`"),
        )),
    }
}

fn parse<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, CapabilityError> {
    http::parse(SERVICE, value)
}

#[async_trait]
impl Providers for ApiKeys {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Answer {
        match op {
            "maps.list-keys" => self.list().await,
            "maps.add-referrer" | "maps.remove-referrer" => {
                let op = if op == "maps.add-referrer" {
                    "maps.add-referrer"
                } else {
                    "maps.remove-referrer"
                };
                let _one_at_a_time = self.changing.lock().await;
                self.change(op, request, token).await
            }
            other => Err(CapabilityError::permanent(
                "unsupported",
                format!("the apikeys provider has no operation {other}"),
            )),
        }
    }

    fn kind(&self) -> &'static str {
        "apikeys"
    }

    async fn reachable(&self) -> Result<(), String> {
        let request = self
            .http
            .get(format!(
                "{}/v2/projects/{}/locations/global/keys",
                self.endpoint, self.project
            ))
            .query(&[("pageSize", "1")]);
        self.send(request).await.map(|_| ()).map_err(|e| e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_without_website_restrictions_has_no_referrers_to_change() {
        let key = |restrictions: Value| Key {
            name: "projects/p/locations/global/keys/k1".into(),
            display_name: "web".into(),
            restrictions: Some(restrictions),
            etag: None,
            delete_time: None,
        };
        assert_eq!(
            key(json!({"browserKeyRestrictions": {"allowedReferrers": ["*.a.com/*"]}})).referrers(),
            Some(vec!["*.a.com/*".to_owned()])
        );
        assert_eq!(
            key(json!({"browserKeyRestrictions": {}})).referrers(),
            Some(vec![])
        );
        assert_eq!(
            key(json!({"serverKeyRestrictions": {"allowedIps": ["1.2.3.4"]}})).referrers(),
            None
        );
        assert_eq!(key(json!({})).id(), "k1");
    }

    #[test]
    fn only_operations_are_polled() {
        assert!(segment_path("operations/akmf.p7-1234").is_ok());
        assert!(segment_path("projects/p/keys/k").is_err());
        assert!(segment_path("operations/../keys").is_err());
    }
}
