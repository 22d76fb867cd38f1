//! The simulated cloud: every capability on the engine's own database (docs/simulator.md).
//!
//! Each call runs in one write transaction: a repeated idempotency token answers what it answered
//! the first time and changes nothing; otherwise the configured faults are consulted, the
//! capability's simulation runs, and the answer is recorded under the token.

mod dns;
mod services;
mod transaction;
mod write_behind;

use async_trait::async_trait;
use capstan_core::providers::same_call;
use capstan_core::store::json_string;
use capstan_core::{Capability, CapabilityError, Clock, Inspect, Providers};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::{AnyPool, Row};
use std::sync::Arc;
use transaction::SimTx;

/// How the simulation behaves (`[simulator]` in the config file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimulationSettings {
    /// Delay from a DNS change's submission to `Insync`.
    pub dns_propagation_ms: i64,
    /// Delay from a certificate request to its issue (once its validation records exist).
    pub certificate_issue_ms: i64,
    /// Delay from a distribution's creation or update to `Deployed`.
    pub cdn_deploy_ms: i64,
    /// Zones of the demo world created on first start (when no seed file is given).
    pub seed_zones: Vec<String>,
    /// A seed file applied on first start instead of the demo world.
    pub seed_file: Option<std::path::PathBuf>,
    /// Faults: the first rule that fits a call applies.
    pub faults: Vec<FaultRule>,
}

impl Default for SimulationSettings {
    fn default() -> Self {
        Self {
            dns_propagation_ms: 2_000,
            certificate_issue_ms: 1_000,
            cdn_deploy_ms: 3_000,
            seed_zones: vec!["example.com".to_owned(), "example.org".to_owned()],
            seed_file: None,
            faults: Vec::new(),
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    /// An operation (`maps.add-referrer`), a capability (`maps.*`) or `*`.
    pub op: String,
    /// A glob (`*` wildcards) tested against every string in the request; absent = any call.
    #[serde(default, rename = "match")]
    pub pattern: Option<String>,
    /// `transient` or `permanent`; absent = latency only.
    #[serde(default)]
    pub error: Option<FaultKind>,
    /// The error code the workflow sees.
    #[serde(default = "default_fault_code")]
    pub code: String,
    /// Fail only the first N matching calls.
    #[serde(default)]
    pub times: Option<u32>,
    /// Real-time delay before answering.
    #[serde(default)]
    pub latency_ms: u64,
}

fn default_fault_code() -> String {
    "injected-fault".to_owned()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultKind {
    Transient,
    Permanent,
}

impl FaultRule {
    fn fits(&self, op: &str, request: &Value) -> bool {
        let op_fits = self.op == "*"
            || self.op == op
            || self
                .op
                .strip_suffix(".*")
                .is_some_and(|cap| op.split('.').next() == Some(cap));
        op_fits
            && self
                .pattern
                .as_deref()
                .is_none_or(|p| strings(request).iter().any(|s| glob(p, s)))
    }

    fn key(&self, index: usize) -> String {
        format!(
            "{index}:{}:{}",
            self.op,
            self.pattern.as_deref().unwrap_or("")
        )
    }
}

/// Every string in a JSON value.
fn strings(v: &Value) -> Vec<&str> {
    match v {
        Value::String(s) => vec![s.as_str()],
        Value::Array(items) => items.iter().flat_map(strings).collect(),
        Value::Object(map) => map.values().flat_map(strings).collect(),
        _ => Vec::new(),
    }
}

/// `*` matches any run of characters (case-insensitive); everything else matches itself.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (
        pattern.to_lowercase().chars().collect(),
        text.to_lowercase().chars().collect(),
    );
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] != '*' && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// A seed: the simulated world to start from (docs/simulator.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Seed {
    #[serde(default)]
    pub zones: Vec<String>,
    #[serde(default)]
    pub records: Vec<SeedRecord>,
    #[serde(default)]
    pub domains: Vec<SeedDomain>,
    #[serde(default)]
    pub certificates: Vec<SeedCertificate>,
    #[serde(default)]
    pub maps_keys: Vec<SeedMapsKey>,
    #[serde(default)]
    pub tickets: Vec<SeedTicket>,
    #[serde(default)]
    pub functions: Vec<SeedFunction>,
    #[serde(default)]
    pub distributions: Vec<SeedDistribution>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SeedDistribution {
    pub id: String,
    pub origin: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    /// The ARN of a seeded certificate (give the certificate an `arn`).
    #[serde(default)]
    pub certificate_arn: Option<String>,
    #[serde(default)]
    pub comment: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SeedRecord {
    pub zone: String,
    pub name: String,
    #[serde(rename = "type")]
    pub record_type: String,
    #[serde(default)]
    pub ttl: Option<u32>,
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SeedDomain {
    pub name: String,
    pub owned: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SeedCertificate {
    pub domain: String,
    #[serde(default)]
    pub subject_alternative_names: Vec<String>,
    #[serde(default = "issued")]
    pub status: String,
    #[serde(default)]
    pub arn: Option<String>,
}

fn issued() -> String {
    "issued".to_owned()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SeedMapsKey {
    pub id: String,
    pub display_name: String,
    pub capacity: u32,
    #[serde(default)]
    pub referrers: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SeedTicket {
    pub id: String,
    pub title: String,
    #[serde(default = "open")]
    pub status: String,
}

fn open() -> String {
    "open".to_owned()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SeedFunction {
    pub name: String,
    /// Code digests of versions "1", "2", … in order.
    #[serde(default)]
    pub versions: Vec<String>,
    #[serde(default)]
    pub aliases: std::collections::BTreeMap<String, String>,
}

impl Seed {
    /// The demo world of `just run`: the configured zones, one domain of ours, two maps keys (one
    /// nearly full), open tickets and a function with a live alias.
    pub fn demo(zones: &[String]) -> Self {
        let sha = |n: u8| format!("{n:x}").repeat(64);
        Self {
            zones: zones.to_vec(),
            domains: zones
                .iter()
                .take(1)
                .map(|z| SeedDomain {
                    name: z.clone(),
                    owned: true,
                })
                .collect(),
            maps_keys: vec![
                SeedMapsKey {
                    id: "web".to_owned(),
                    display_name: "Web key".to_owned(),
                    capacity: 50,
                    referrers: vec![],
                },
                SeedMapsKey {
                    id: "embed".to_owned(),
                    display_name: "Embed key".to_owned(),
                    capacity: 3,
                    referrers: vec!["*.example.net/*".to_owned()],
                },
            ],
            tickets: (1..=3)
                .map(|n| SeedTicket {
                    id: format!("OPS-{n}"),
                    title: format!("Demo request {n}"),
                    status: "open".to_owned(),
                })
                .collect(),
            functions: vec![SeedFunction {
                name: "edge-router".to_owned(),
                versions: vec![sha(1)],
                aliases: [("live".to_owned(), "1".to_owned())].into(),
            }],
            ..Self::default()
        }
    }
}

/// The simulated cloud, in the engine's database.
#[derive(Debug, Clone)]
pub struct SimulatedCloud {
    /// The store's writer.
    pool: AnyPool,
    /// For reads outside a transaction and writes behind answers (`write_behind.rs`).
    store: capstan_store::Store,
    clock: Arc<dyn Clock>,
    settings: SimulationSettings,
    /// The DNS as decided in memory, written behind its answers (`write_behind.rs`).
    memory: Arc<write_behind::Memory>,
}

pub(crate) fn unavailable(e: sqlx::Error) -> CapabilityError {
    CapabilityError::transient(
        "unavailable",
        format!("the simulated cloud's storage failed: {e}"),
    )
}

pub(crate) fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or_default()
}

pub(crate) fn zone_id_for(name: &str) -> String {
    format!("Z{}", name.to_ascii_uppercase().replace('.', "-"))
}

/// The WIT record-type enum as the host serializes it.
fn record_type(text: &str) -> Option<&'static str> {
    match text.to_ascii_uppercase().as_str() {
        "A" => Some("A"),
        "AAAA" => Some("Aaaa"),
        "CNAME" => Some("Cname"),
        "TXT" => Some("Txt"),
        "MX" => Some("Mx"),
        "CAA" => Some("Caa"),
        _ => None,
    }
}

impl SimulatedCloud {
    /// The simulation on the store's database (its tables come with Capstan's migrations).
    /// On first start the simulation is seeded (`seed_file`, else the demo world).
    pub async fn new(
        store: &capstan_store::Store,
        clock: Arc<dyn Clock>,
        settings: SimulationSettings,
    ) -> Result<Self, SeedError> {
        let cloud = Self {
            pool: store.writer().clone(),
            store: store.clone(),
            clock,
            settings,
            memory: Arc::default(),
        };
        let seeded: Option<String> =
            sqlx::query_scalar("SELECT id FROM sim_objects WHERE kind = 'meta' AND id = 'seeded'")
                .fetch_optional(&cloud.pool)
                .await?;
        let zones: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sim_zones")
            .fetch_one(&cloud.pool)
            .await?;
        if seeded.is_none() && zones == 0 {
            let seed = match &cloud.settings.seed_file {
                Some(path) => Seed::read(path)?,
                None => Seed::demo(&cloud.settings.seed_zones),
            };
            cloud.seed(&seed).await?;
        }
        Ok(cloud)
    }

    /// A Route 53-shaped change id.
    fn new_change_id(&self) -> String {
        capstan_core::ids::new_upper_hex_id('C')
    }

    fn now(&self) -> i64 {
        i64::try_from(self.clock.now_millis()).unwrap_or(i64::MAX)
    }

    pub fn settings(&self) -> &SimulationSettings {
        &self.settings
    }

    /// Adds a seed's objects to the simulation (existing objects of the same id are replaced).
    pub async fn seed(&self, seed: &Seed) -> Result<(), SeedError> {
        let _exclusive = self.memory.exclusive(&self.store).await;
        let mut tx = SimTx::begin(&self.pool).await?;
        let now = self.now();
        for zone in &seed.zones {
            let name = zone.trim_end_matches('.').to_ascii_lowercase();
            sqlx::query("INSERT INTO sim_zones (id, name) VALUES ($1, $2) ON CONFLICT DO NOTHING")
                .bind(zone_id_for(&name))
                .bind(&name)
                .execute(tx.conn().await?)
                .await?;
        }
        for r in &seed.records {
            let ty = record_type(&r.record_type).ok_or_else(|| {
                SeedError::Invalid(format!(
                    "record {}: type must be A, AAAA, CNAME, TXT, MX or CAA, not {}",
                    r.name, r.record_type
                ))
            })?;
            let zone = zone_id_for(&r.zone.to_ascii_lowercase());
            let name = r.name.to_ascii_lowercase();
            let body = json!({"name": name, "type_": ty, "ttl": r.ttl, "values": r.values, "alias_target": null});
            let known: Option<String> =
                sqlx::query_scalar("SELECT id FROM sim_zones WHERE id = $1")
                    .bind(&zone)
                    .fetch_optional(tx.conn().await?)
                    .await?;
            if known.is_none() {
                return Err(SeedError::Invalid(format!(
                    "record {}: zone {} is not in the seed's zones",
                    r.name, r.zone
                )));
            }
            sqlx::query("INSERT INTO sim_records (zone_id, dns_key, name, type, body) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (zone_id, dns_key, type) DO UPDATE SET body = excluded.body")
                .bind(&zone)
                .bind(dns::dns_key(&name))
                .bind(&name)
                .bind(ty)
                .bind(json_string(&body))
                .execute(tx.conn().await?)
                .await?;
        }
        for d in &seed.domains {
            let name = d.name.to_ascii_lowercase();
            let body = json!({"name": name, "owned": d.owned, "registration_id": format!("REG-{}", name.to_ascii_uppercase()), "expires_at": now + 365 * 86_400_000});
            put(&mut tx, "domain", &name, &body).await?;
        }
        for (i, c) in seed.certificates.iter().enumerate() {
            let status = match c.status.as_str() {
                "issued" => "Issued",
                "pending-validation" => "PendingValidation",
                "failed" => "Failed",
                "revoked" => "Revoked",
                other => {
                    return Err(SeedError::Invalid(format!(
                        "certificate {}: status must be issued, pending-validation, failed or revoked, not {other}",
                        c.domain
                    )));
                }
            };
            let arn = c
                .arn
                .clone()
                .unwrap_or_else(|| format!("arn:sim:acm::certificate/seed-{i}"));
            let body = json!({
                "arn": arn, "domain": c.domain.to_ascii_lowercase(),
                "subject_alternative_names": c.subject_alternative_names,
                "status": status, "validation_records": [],
                "issued_at": if status == "Issued" { Some(now) } else { None },
                "in_use_by": [], "requested_ms": now,
            });
            put(&mut tx, "certificate", &arn, &body).await?;
        }
        for k in &seed.maps_keys {
            let body = json!({"id": k.id, "display_name": k.display_name, "referrers": k.referrers, "capacity": k.capacity});
            put(&mut tx, "maps-key", &k.id, &body).await?;
        }
        for t in &seed.tickets {
            let body = json!({"id": t.id, "title": t.title, "status": t.status, "comments": []});
            put(&mut tx, "ticket", &t.id, &body).await?;
        }
        for f in &seed.functions {
            let versions: Vec<Value> = f.versions.iter().enumerate().map(|(i, sha)| json!({"function_name": f.name, "version": (i + 1).to_string(), "code_sha256": sha})).collect();
            for (alias, version) in &f.aliases {
                if !versions.iter().any(|v| v["version"] == version.as_str()) {
                    return Err(SeedError::Invalid(format!(
                        "function {}: alias {alias} points at version {version}, which the seed does not list",
                        f.name
                    )));
                }
            }
            let body = json!({"name": f.name, "versions": versions, "aliases": f.aliases});
            put(&mut tx, "function", &f.name, &body).await?;
        }
        for d in &seed.distributions {
            let aliases: Vec<String> = d.aliases.iter().map(|a| a.to_ascii_lowercase()).collect();
            let body = json!({
                "id": d.id, "domain_name": format!("d{}.cdn.sim.capstan.dev", d.id.to_ascii_lowercase()),
                "hosted_zone_id": "ZCDNSIMULATED",
                "spec": {"origin": d.origin, "aliases": aliases, "certificate_arn": d.certificate_arn, "comment": d.comment},
                "deploy_at_ms": now,
            });
            put(&mut tx, "distribution", &d.id, &body).await?;
        }
        put(&mut tx, "meta", "seeded", &json!({"at": now})).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The whole simulated state, for operators (`GET /v1/admin/simulator`) and tests.
    pub async fn snapshot(&self) -> Result<Value, sqlx::Error> {
        // What the fast path answered is in the database once its writes are answered.
        self.store.settle_behind().await;
        let mut tx = SimTx::begin(&self.pool).await?;
        let zones = sqlx::query("SELECT id, name FROM sim_zones ORDER BY name")
            .fetch_all(tx.conn().await?)
            .await?;
        let records =
            sqlx::query("SELECT zone_id, body FROM sim_records ORDER BY zone_id, name, type")
                .fetch_all(tx.conn().await?)
                .await?;
        let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sim_effects")
            .fetch_one(tx.conn().await?)
            .await?;
        let mut certificates = Vec::new();
        for c in list(&mut tx, "certificate").await? {
            certificates.push(self.certificate_view(&mut tx, c).await?);
        }
        let mut distributions = Vec::new();
        for d in list(&mut tx, "distribution").await? {
            distributions.push(self.distribution_view(d));
        }
        let snapshot = json!({
            "dns": {
                "zones": zones.iter().map(|r| json!({"id": r.get::<String, _>("id"), "name": r.get::<String, _>("name")})).collect::<Vec<_>>(),
                "records": records.iter().map(|r| json!({
                    "zoneId": r.get::<String, _>("zone_id"),
                    "recordSet": serde_json::from_str::<Value>(&r.get::<String, _>("body")).unwrap_or(Value::Null),
                })).collect::<Vec<_>>(),
            },
            "registrar": {"domains": list(&mut tx, "domain").await?},
            "certificates": certificates,
            "distributions": distributions,
            "maps": {"keys": list(&mut tx, "maps-key").await?},
            "functions": list(&mut tx, "function").await?,
            "tickets": list(&mut tx, "ticket").await?,
            "effects": effects,
        });
        tx.commit().await?;
        Ok(snapshot)
    }

    /// Which fault applies to this call, counting it when it has a budget.
    async fn fault(
        &self,
        tx: &mut SimTx,
        op: &str,
        request: &Value,
    ) -> Result<Option<FaultRule>, CapabilityError> {
        for (index, rule) in self.settings.faults.iter().enumerate() {
            if !rule.fits(op, request) {
                continue;
            }
            if let Some(times) = rule.times {
                let key = rule.key(index);
                tx.statement(
                    "INSERT INTO sim_fault_hits (rule, hits) VALUES ($1, 1)
                     ON CONFLICT (rule) DO UPDATE SET hits = sim_fault_hits.hits + 1 RETURNING hits",
                )
                .bind(key);
                let rows = tx.fetch().await.map_err(unavailable)?;
                let hits: i64 = match rows.first() {
                    Some(row) => row.try_get(0).map_err(unavailable)?,
                    None => 0,
                };
                if hits > i64::from(times) {
                    continue;
                }
            }
            return Ok(Some(rule.clone()));
        }
        Ok(None)
    }
}

#[async_trait]
impl Providers for SimulatedCloud {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Result<Value, CapabilityError> {
        self.answer(op, request, token, false).await
    }

    async fn call_first(
        &self,
        op: &str,
        request: &Value,
        token: &str,
    ) -> Result<Value, CapabilityError> {
        self.answer(op, request, token, true).await
    }

    /// The fast path alone (`write_behind.rs`), deciding only under `epoch`.
    async fn call_behind(
        &self,
        op: &str,
        request: &Value,
        token: &str,
        first: bool,
        epoch: u64,
    ) -> Option<Result<Value, CapabilityError>> {
        self.fast(op, request, token, first, Some(epoch)).await
    }

    fn kind(&self) -> &'static str {
        "simulated"
    }
}

#[async_trait]
impl Inspect for SimulatedCloud {
    async fn snapshot(&self) -> Result<Value, String> {
        SimulatedCloud::snapshot(self)
            .await
            .map_err(|e| e.to_string())
    }
}

impl SimulatedCloud {
    /// The fast path where it applies, else one transaction (`first`: see
    /// [`capstan_core::Providers::call_first`]).
    async fn answer(
        &self,
        op: &str,
        request: &Value,
        token: &str,
        first: bool,
    ) -> Result<Value, CapabilityError> {
        if let Some(answer) = self.fast(op, request, token, first, None).await {
            return answer;
        }
        // The fast path steps aside, and this call reads what it decided.
        let mut exclusive = Some(self.memory.exclusive(&self.store).await);
        let mut tx = SimTx::begin(&self.pool).await.map_err(unavailable)?;
        if !token.is_empty() {
            tx.statement("SELECT op, request, response FROM sim_effects WHERE token = $1")
                .bind(token.to_owned());
            let rows = tx.fetch().await.map_err(unavailable)?;
            if let Some(row) = rows.first() {
                let first_op: String = row.try_get(0).map_err(unavailable)?;
                let first_request: String = row.try_get(1).map_err(unavailable)?;
                let done: String = row.try_get(2).map_err(unavailable)?;
                tx.commit().await.map_err(unavailable)?;
                let first_request: Value = serde_json::from_str(&first_request)
                    .map_err(|e| CapabilityError::permanent("corrupt", e.to_string()))?;
                if !same_call(&first_op, &first_request, op, request) {
                    return Err(CapabilityError::token_reused(op, &first_op));
                }
                return serde_json::from_str(&done)
                    .map_err(|e| CapabilityError::permanent("corrupt", e.to_string()));
            }
        }
        if let Some(fault) = self.fault(&mut tx, op, request).await? {
            // Commit the hit count before waiting, so the single writer is not held, and let
            // the fast path serve other calls while this one waits.
            tx.commit().await.map_err(unavailable)?;
            drop(exclusive.take());
            if fault.latency_ms > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(fault.latency_ms)).await;
            }
            let message = format!("injected {op} fault (simulator.faults)");
            match fault.error {
                Some(FaultKind::Transient) => {
                    return Err(CapabilityError::transient(&fault.code, message));
                }
                Some(FaultKind::Permanent) => {
                    return Err(CapabilityError::permanent(&fault.code, message));
                }
                None => {}
            }
            exclusive = Some(self.memory.exclusive(&self.store).await);
            tx = SimTx::begin(&self.pool).await.map_err(unavailable)?;
        }
        let answer = match Capability::of_op(op) {
            Some(Capability::Dns) => self.dns(&mut tx, op, request).await?,
            Some(Capability::Registrar) => self.registrar(&mut tx, op, request).await?,
            Some(Capability::Certificates) => self.certificates(&mut tx, op, request).await?,
            Some(Capability::Cdn) => self.cdn(&mut tx, op, request).await?,
            Some(Capability::Maps) => self.maps(&mut tx, op, request).await?,
            Some(Capability::Functions) => self.functions(&mut tx, op, request).await?,
            Some(Capability::Ticketing) => self.ticketing(&mut tx, op, request).await?,
            _ => {
                return Err(CapabilityError::permanent(
                    "unsupported",
                    format!("the simulated cloud has no operation {op}"),
                ));
            }
        };
        if !token.is_empty() {
            tx.statement("INSERT INTO sim_effects (token, op, request, response, at_ms) VALUES ($1, $2, $3, $4, $5)")
                .bind(token.to_owned())
                .bind(op.to_owned())
                .bind(json_string(request))
                .bind(json_string(&answer))
                .bind(self.now());
            tx.done().await.map_err(unavailable)?;
        }
        tx.commit().await.map_err(unavailable)?;
        drop(exclusive);
        Ok(answer)
    }
}

/// A seed that cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("cannot read the simulator seed {path}: {message}")]
    Read { path: String, message: String },
    #[error("invalid simulator seed: {0}")]
    Invalid(String),
    #[error("simulator storage: {0}")]
    Storage(#[from] sqlx::Error),
}

impl Seed {
    pub fn read(path: &std::path::Path) -> Result<Self, SeedError> {
        let text = std::fs::read_to_string(path).map_err(|e| SeedError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        serde_json::from_str(&text).map_err(|e| SeedError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }
}

// The object store the services share: one JSON document per (kind, id).

pub(crate) async fn get(
    tx: &mut SimTx,
    kind: &str,
    id: &str,
) -> Result<Option<Value>, sqlx::Error> {
    tx.statement("SELECT body FROM sim_objects WHERE kind = $1 AND id = $2")
        .bind(kind.to_owned())
        .bind(id.to_owned());
    let rows = tx.fetch().await?;
    Ok(match rows.first() {
        Some(row) => serde_json::from_str(&row.try_get::<String, _>(0)?).ok(),
        None => None,
    })
}

pub(crate) async fn put(
    tx: &mut SimTx,
    kind: &str,
    id: &str,
    body: &Value,
) -> Result<(), sqlx::Error> {
    tx.statement("INSERT INTO sim_objects (kind, id, body) VALUES ($1, $2, $3) ON CONFLICT (kind, id) DO UPDATE SET body = excluded.body")
        .bind(kind.to_owned())
        .bind(id.to_owned())
        .bind(json_string(body));
    tx.done().await
}

pub(crate) async fn delete(tx: &mut SimTx, kind: &str, id: &str) -> Result<(), sqlx::Error> {
    tx.statement("DELETE FROM sim_objects WHERE kind = $1 AND id = $2")
        .bind(kind.to_owned())
        .bind(id.to_owned());
    tx.done().await
}

pub(crate) async fn list(tx: &mut SimTx, kind: &str) -> Result<Vec<Value>, sqlx::Error> {
    tx.statement("SELECT body FROM sim_objects WHERE kind = $1 ORDER BY id")
        .bind(kind.to_owned());
    let rows = tx.fetch().await?;
    rows.iter()
        .map(|row| row.try_get::<String, _>(0))
        .filter_map(|body| match body {
            Ok(b) => serde_json::from_str(&b).ok().map(Ok),
            Err(e) => Some(Err(e)),
        })
        .collect()
}

#[cfg(test)]
mod tests;
