//! DNS on AWS Route 53 (`[providers.dns] kind = "route53"`), through the AWS SDK for Rust
//! (`capstan-aws`). Credentials and region come from the standard AWS chain; `endpoint_url`
//! points the adapter at another endpoint (a VPC endpoint, or moto in the tests).
//!
//! - **Idempotency.** `ChangeResourceRecordSets` takes no idempotency token, so the engine's
//!   token goes to the ledger: the prior record sets are read and recorded (the intent) before
//!   the batch is sent, and the answer is recorded after. A repeat after a crash answers the
//!   recorded receipt, or re-sends the batch: upserts are Route 53's UPSERT (a repeat leaves the
//!   set as it is) and a delete whose set is already gone is dropped. `CreateHostedZone` takes
//!   a `CallerReference`: the token, derived to what the API accepts ([`TokenFormat`]), so a
//!   repeat finds the zone the first request created.
//! - **Prior state.** The receipt's `prior` holds each set as it stood before the change, so a
//!   rollback restores it exactly. Route 53 has no prerequisites: a set changed by someone else
//!   between the read and the write is overwritten by an upsert, and makes a delete fail (a
//!   transient `conflict`, after which the retry reads again).
//! - **Aliases.** Alias records (to CloudFront, say) are native: `alias_target` set, no values,
//!   no TTL. Route 53 never answers `alias-unsupported`.
//! - **Convergence.** `get-change` is Route 53's GetChange: `Insync` once every Route 53 name
//!   server serves the change.
//! - **Scope.** `zones` limits the hosted zones this node may read or change (by name); empty,
//!   every zone the credentials reach.

use crate::ledger::{Entry, Ledger, storage};
use crate::model::{
    self, AliasTarget, Change, ChangeReceipt, ChangeStatus, RecordSet, RecordType, arg,
};
use crate::{Node, SettingsError};
use async_trait::async_trait;
use capstan_aws::route53::{self as r53, Action};
use capstan_core::providers::TokenFormat;
use capstan_core::{Capability, CapabilityError, Clock, Providers};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

type Answer = Result<Value, CapabilityError>;

/// The change id of a repeated batch that had nothing left to do (its deletes had all been
/// applied before a crash): in sync by definition.
const NOTHING_LEFT: &str = "capstan-nothing-left";

/// A `CallerReference` is at most 128 characters of any kind.
const CALLER_REFERENCE: TokenFormat = TokenFormat {
    max_len: 128,
    word_only: false,
};

/// `[providers.dns] kind = "route53"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route53Settings {
    /// The region requests are signed for (Route 53 is global; default: the AWS chain's
    /// region, else `us-east-1`).
    #[serde(default)]
    pub region: Option<String>,
    /// Another endpoint than AWS's (a VPC endpoint; moto in the tests).
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// The hosted zones (by name) this node may read and change; empty: every zone the
    /// credentials reach.
    #[serde(default)]
    pub zones: Vec<String>,
    /// TTL of a record set the workflow gives none (an alias has none).
    #[serde(default = "default_ttl")]
    pub default_ttl: u32,
    /// Deadline of one call to Route 53.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// An access key of this adapter's own, instead of the standard AWS credential chain
    /// (environment, profile, web identity, container or instance role); its secret comes
    /// from `secret_access_key_file` or `secret_access_key_env`.
    #[serde(default)]
    pub access_key_id: Option<String>,
    #[serde(default)]
    pub secret_access_key_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub secret_access_key_env: Option<String>,
}

fn default_ttl() -> u32 {
    300
}

fn default_timeout_ms() -> u64 {
    10_000
}

/// What the ledger records before a batch is sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Intent {
    prior: Vec<RecordSet>,
}

pub struct Route53 {
    client: r53::Route53,
    ledger: Ledger,
    clock: Arc<dyn Clock>,
    zones: Vec<String>,
    /// Zone ids found to be in `zones`: a zone's id names one zone for its whole life, so each
    /// is looked up once, not with a `ListHostedZones` before every call (Route 53 allows an
    /// account five requests a second across all of them).
    allowed_ids: std::sync::Mutex<std::collections::HashSet<String>>,
    default_ttl: u32,
}

impl std::fmt::Debug for Route53 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route53")
            .field("zones", &self.zones)
            .finish_non_exhaustive()
    }
}

fn to_set(set: &RecordSet, default_ttl: u32) -> r53::Set {
    r53::Set {
        name: set.name.clone(),
        kind: set.type_.mnemonic().to_owned(),
        ttl: match set.alias_target {
            Some(_) => None,
            None => Some(set.ttl.unwrap_or(default_ttl)),
        },
        values: set.values.clone(),
        alias: set.alias_target.as_ref().map(|a| r53::Alias {
            dns_name: a.dns_name.clone(),
            hosted_zone_id: a.hosted_zone_id.clone(),
            evaluate_target_health: a.evaluate_target_health,
        }),
    }
}

/// A Route 53 set in the WIT's shape; `None` for types the WIT has no name for (NS, SOA, ...).
fn from_set(set: r53::Set) -> Option<RecordSet> {
    let type_ = RecordType::ALL
        .into_iter()
        .find(|t| t.mnemonic() == set.kind)?;
    Some(RecordSet {
        name: set.name,
        type_,
        ttl: if set.alias.is_some() { None } else { set.ttl },
        values: set.values,
        alias_target: set.alias.map(|a| AliasTarget {
            dns_name: a.dns_name,
            hosted_zone_id: a.hosted_zone_id,
            evaluate_target_health: a.evaluate_target_health,
        }),
    })
}

/// What Route 53 would refuse, refused before anything is read or sent.
fn check(changes: &[Change]) -> Result<(), CapabilityError> {
    let invalid = |m: String| CapabilityError::permanent("invalid-change-batch", m);
    if changes.is_empty() {
        return Err(invalid("a change batch needs at least one change".into()));
    }
    let mut seen = std::collections::BTreeSet::new();
    for change in changes {
        let set = change.set();
        if !seen.insert((model::bare(&set.name), set.type_)) {
            return Err(invalid(format!(
                "{} {} appears twice in one batch",
                set.type_.mnemonic(),
                set.name
            )));
        }
        if let Change::Upsert(set) = change {
            match (&set.alias_target, set.values.is_empty()) {
                (Some(_), false) => {
                    return Err(invalid(format!(
                        "{} {}: an alias has no values",
                        set.type_.mnemonic(),
                        set.name
                    )));
                }
                (None, true) => {
                    return Err(invalid(format!(
                        "{} {}: a record set needs at least one value",
                        set.type_.mnemonic(),
                        set.name
                    )));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

impl Route53 {
    pub async fn new(s: &Route53Settings, node: &Node) -> Result<Self, SettingsError> {
        let aws = crate::aws::Access {
            capability: Capability::Dns,
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
            client: r53::Route53::new(&aws),
            ledger: Ledger::new(node.store.writer().clone(), "route53"),
            clock: node.clock.clone(),
            zones: s.zones.iter().map(|z| model::bare(z)).collect(),
            allowed_ids: std::sync::Mutex::default(),
            default_ttl: s.default_ttl,
        })
    }

    fn now(&self) -> i64 {
        i64::try_from(self.clock.now_millis()).unwrap_or(i64::MAX)
    }

    fn allowed(&self, name: &str) -> bool {
        self.zones.is_empty() || self.zones.iter().any(|z| z == name)
    }

    /// The zone `id`, if this node may use it.
    async fn zone(&self, id: &str) -> Result<r53::Zone, CapabilityError> {
        self.client
            .zones()
            .await?
            .into_iter()
            .find(|z| z.id == id && self.allowed(&z.name))
            .ok_or_else(|| CapabilityError::permanent("not-found", format!("no hosted zone {id}")))
    }

    /// Refuses a zone id outside `zones` (`not-found`, as Route 53 answers an unknown one).
    /// Without `zones` every zone is allowed, and Route 53 itself answers for unknown ids.
    async fn check_zone(&self, id: &str) -> Result<(), CapabilityError> {
        let known = |ids: &std::collections::HashSet<String>| ids.contains(id);
        let lock = || {
            self.allowed_ids
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if self.zones.is_empty() || known(&lock()) {
            return Ok(());
        }
        self.zone(id).await?;
        lock().insert(id.to_owned());
        Ok(())
    }

    /// The set of `name` and `type_` as it stands, in the WIT's shape.
    async fn current(
        &self,
        zone_id: &str,
        name: &str,
        type_: RecordType,
    ) -> Result<Option<RecordSet>, CapabilityError> {
        Ok(self
            .client
            .sets_at(zone_id, name)
            .await?
            .into_iter()
            .filter_map(from_set)
            .find(|s| s.type_ == type_))
    }

    async fn find_zone(&self, request: &Value) -> Answer {
        let domain = model::bare(&arg::<String>(request, "domain")?);
        let zones = self.client.zones().await?;
        // The longest suffix of the domain; a public zone before a private one of its name.
        let best = zones
            .into_iter()
            .filter(|z| {
                self.allowed(&z.name)
                    && (domain == z.name || domain.ends_with(&format!(".{}", z.name)))
            })
            .max_by_key(|z| (z.name.len(), !z.private));
        Ok(best.map_or(Value::Null, |z| json!({"id": z.id, "name": z.name})))
    }

    async fn create_zone(&self, request: &Value, token: &str) -> Answer {
        let domain = model::bare(&arg::<String>(request, "domain")?);
        if !self.allowed(&domain) {
            return Err(CapabilityError::permanent(
                "zone-not-allowed",
                format!("{domain} is not in providers.dns.zones"),
            ));
        }
        let reference = if token.is_empty() {
            capstan_core::ids::new_id()
        } else {
            CALLER_REFERENCE.derive(token)
        };
        // A repeat after a crash finds the zone the first request made (the reference is the
        // token's), whether or not the API itself refuses a reference twice.
        let zone = match self
            .client
            .zones()
            .await?
            .into_iter()
            .find(|z| z.caller_reference == reference)
        {
            Some(zone) => zone,
            None => self.client.create_zone(&domain, &reference).await?,
        };
        Ok(json!({"id": zone.id, "name": zone.name}))
    }

    async fn delete_zone(&self, request: &Value) -> Answer {
        let id: String = arg(request, "zone_id")?;
        let zone = self.zone(&id).await?;
        self.client.delete_zone(&zone.id).await?;
        Ok(json!({"id": zone.id, "name": zone.name}))
    }

    async fn list_records(&self, request: &Value) -> Answer {
        let zone_id: String = arg(request, "zone_id")?;
        let name: String = arg(request, "name")?;
        self.check_zone(&zone_id).await?;
        let sets: Vec<RecordSet> = self
            .client
            .sets_at(&zone_id, &name)
            .await?
            .into_iter()
            .filter_map(from_set)
            .collect();
        serde_json::to_value(sets).map_err(storage)
    }

    async fn change_records(&self, request: &Value, token: &str) -> Answer {
        let zone_id: String = arg(request, "zone_id")?;
        let changes: Vec<Change> = arg(request, "changes")?;
        check(&changes)?;
        self.check_zone(&zone_id).await?;
        let earlier = if token.is_empty() {
            None
        } else {
            self.ledger
                .get(token, "dns.change-records", request)
                .await?
        };
        // What each changed set holds now, when it was read in this call (`None` inside: it
        // does not exist); a replay reads again, since the batch may have been applied.
        let mut standing: Vec<Option<Option<RecordSet>>> = vec![None; changes.len()];
        let prior = match earlier {
            Some(Entry::Done(answer)) => return Ok(answer),
            // Sent, perhaps, before a crash: what stood before is what was recorded.
            Some(Entry::Intent(body)) => {
                serde_json::from_value::<Intent>(body)
                    .map_err(storage)?
                    .prior
            }
            None => {
                let mut prior = Vec::new();
                for (change, read) in changes.iter().zip(standing.iter_mut()) {
                    let set = change.set();
                    let now = self.current(&zone_id, &set.name, set.type_).await?;
                    *read = Some(now.clone());
                    match now {
                        // Named as the request names it: rollback matches prior to change.
                        Some(before) => prior.push(RecordSet {
                            name: set.name.clone(),
                            ..before
                        }),
                        None if matches!(change, Change::Delete(_)) => {
                            return Err(CapabilityError::permanent(
                                "invalid-change-batch",
                                format!(
                                    "no {} record {} to delete",
                                    set.type_.mnemonic(),
                                    set.name
                                ),
                            ));
                        }
                        None => {}
                    }
                }
                if !token.is_empty() {
                    let intent = Intent {
                        prior: prior.clone(),
                    };
                    self.ledger
                        .intend(
                            token,
                            "dns.change-records",
                            request,
                            &serde_json::to_value(&intent).map_err(storage)?,
                            self.now(),
                        )
                        .await?;
                }
                prior
            }
        };
        // Route 53 deletes a set only as it stands: each delete sends the set read now (none
        // left: it was deleted before a crash, and is dropped from the batch).
        let mut batch = Vec::new();
        for (change, read) in changes.iter().zip(standing) {
            match change {
                Change::Upsert(set) => batch.push((Action::Upsert, to_set(set, self.default_ttl))),
                Change::Delete(set) => {
                    let now = match read {
                        Some(now) => now,
                        None => self.current(&zone_id, &set.name, set.type_).await?,
                    };
                    if let Some(now) = now {
                        batch.push((Action::Delete, to_set(&now, self.default_ttl)));
                    }
                }
            }
        }
        let (change_id, insync) = if batch.is_empty() {
            (NOTHING_LEFT.to_owned(), true)
        } else {
            let comment: String = format!("capstan {token}").chars().take(256).collect();
            match self.client.change(&zone_id, &batch, &comment).await {
                Ok(done) => done,
                Err(error) => {
                    if !token.is_empty() && error.code == "conflict" {
                        // The prior read is stale: the retry reads it again.
                        self.ledger.forget(token).await?;
                    }
                    return Err(error);
                }
            }
        };
        let receipt = ChangeReceipt {
            change_id,
            zone_id,
            status: if insync {
                ChangeStatus::Insync
            } else {
                ChangeStatus::Pending
            },
            prior,
        };
        let answer = serde_json::to_value(&receipt).map_err(storage)?;
        if !token.is_empty() {
            self.ledger
                .done(token, "dns.change-records", &answer, self.now())
                .await?;
        }
        Ok(answer)
    }

    async fn get_change(&self, request: &Value) -> Answer {
        let id: String = arg(request, "change_id")?;
        let insync = id == NOTHING_LEFT || self.client.in_sync(&id).await?;
        Ok(json!(if insync {
            ChangeStatus::Insync
        } else {
            ChangeStatus::Pending
        }))
    }
}

#[async_trait]
impl Providers for Route53 {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Answer {
        match op {
            "dns.find-zone" => self.find_zone(request).await,
            "dns.create-zone" => self.create_zone(request, token).await,
            "dns.delete-zone" => self.delete_zone(request).await,
            "dns.list-records" => self.list_records(request).await,
            "dns.change-records" => self.change_records(request, token).await,
            "dns.get-change" => self.get_change(request).await,
            other => Err(CapabilityError::permanent(
                "unsupported",
                format!("the route53 provider has no operation {other}"),
            )),
        }
    }

    fn kind(&self) -> &'static str {
        "route53"
    }

    async fn reachable(&self) -> Result<(), String> {
        let zones = self.client.zones().await.map_err(|e| e.message)?;
        match self
            .zones
            .iter()
            .find(|want| !zones.iter().any(|z| &&z.name == want))
        {
            Some(missing) => Err(format!(
                "hosted zone {missing} is not visible to these credentials"
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(name: &str, values: &[&str], alias: bool) -> RecordSet {
        RecordSet {
            name: name.into(),
            type_: RecordType::A,
            ttl: None,
            values: values.iter().map(|v| (*v).to_owned()).collect(),
            alias_target: alias.then(|| AliasTarget {
                dns_name: "d1.cloudfront.net".into(),
                hosted_zone_id: "Z2FDTNDATAQYW2".into(),
                evaluate_target_health: false,
            }),
        }
    }

    #[test]
    fn batches_route_53_would_refuse_are_refused_first() {
        let ok = [Change::Upsert(set("a.example.com", &[], true))];
        assert!(check(&ok).is_ok());
        for bad in [
            vec![],
            vec![Change::Upsert(set("a.example.com", &["192.0.2.1"], true))],
            vec![Change::Upsert(set("a.example.com", &[], false))],
            vec![
                Change::Upsert(set("a.example.com", &["192.0.2.1"], false)),
                Change::Delete(set("A.example.com.", &["192.0.2.1"], false)),
            ],
        ] {
            let e = check(&bad).unwrap_err();
            assert_eq!(e.code, "invalid-change-batch", "{bad:?}");
        }
    }

    #[test]
    fn sets_cross_to_route_53_and_back_unchanged() {
        for s in [
            set("a.example.com", &[], true),
            set("b.example.com", &["192.0.2.1"], false),
        ] {
            let back = from_set(to_set(&s, 300)).unwrap();
            assert_eq!(back.alias_target, s.alias_target);
            assert_eq!(back.values, s.values);
            assert_eq!(
                back.ttl,
                if s.alias_target.is_some() {
                    None
                } else {
                    Some(300)
                }
            );
        }
    }
}
