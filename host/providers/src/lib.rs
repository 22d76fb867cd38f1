//! # capstan-providers
//!
//! What answers a workflow's capability calls. The [`SimulatedCloud`] is the embedded default:
//! its state lives in the same database as the engine (it survives restarts), and it behaves like
//! the real services where it matters to workflows — DNS changes are `Pending` until a delay has
//! passed on the injected clock, then `Insync`.
//!
//! Every side effect is deduplicated by the engine's idempotency token: a repeated token gets the
//! recorded answer and changes nothing, which is what makes crash-replay exact (and lets tests
//! count effects).
//!
//! Covered now: `dns`. The other capabilities answer a permanent `not-configured` error until
//! their simulations land (issue [4/8]).

use async_trait::async_trait;
use capstan_core::{CapabilityError, Clock};
use capstan_engine::Providers;
use serde_json::{Value, json};
use sqlx::{Row, SqlitePool};
use std::sync::Arc;

/// How the simulation behaves.
#[derive(Debug, Clone)]
pub struct SimulationSettings {
    /// Delay from a DNS change's submission to `Insync`.
    pub dns_propagation_ms: i64,
    /// Zones created on first start when there are none.
    pub seed_zones: Vec<String>,
}

impl Default for SimulationSettings {
    fn default() -> Self {
        Self {
            dns_propagation_ms: 2_000,
            seed_zones: vec!["example.com".to_owned(), "example.org".to_owned()],
        }
    }
}

/// The simulated cloud on the engine's SQLite database.
#[derive(Debug, Clone)]
pub struct SimulatedCloud {
    pool: SqlitePool,
    clock: Arc<dyn Clock>,
    settings: SimulationSettings,
}

fn unavailable(e: sqlx::Error) -> CapabilityError {
    CapabilityError::transient(
        "unavailable",
        format!("the simulated cloud's storage failed: {e}"),
    )
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or_default()
}

fn zone_id_for(name: &str) -> String {
    format!("Z{}", name.to_ascii_uppercase().replace('.', "-"))
}

impl SimulatedCloud {
    /// `pool` must have Capstan's migrations applied.
    pub async fn new(
        pool: SqlitePool,
        clock: Arc<dyn Clock>,
        settings: SimulationSettings,
    ) -> Result<Self, sqlx::Error> {
        let cloud = Self {
            pool,
            clock,
            settings,
        };
        let zones: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sim_zones")
            .fetch_one(&cloud.pool)
            .await?;
        if zones == 0 {
            for zone in &cloud.settings.seed_zones {
                sqlx::query("INSERT OR IGNORE INTO sim_zones (id, name) VALUES (?, ?)")
                    .bind(zone_id_for(zone))
                    .bind(zone)
                    .execute(&cloud.pool)
                    .await?;
            }
        }
        Ok(cloud)
    }

    fn now(&self) -> i64 {
        self.clock.now_millis() as i64
    }

    /// The whole simulated state, for operators (`GET /v1/admin/simulator`) and tests.
    pub async fn snapshot(&self) -> Result<Value, sqlx::Error> {
        let zones = sqlx::query("SELECT id, name FROM sim_zones ORDER BY name")
            .fetch_all(&self.pool)
            .await?;
        let records =
            sqlx::query("SELECT zone_id, body FROM sim_records ORDER BY zone_id, name, type")
                .fetch_all(&self.pool)
                .await?;
        let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sim_effects")
            .fetch_one(&self.pool)
            .await?;
        Ok(json!({
            "dns": {
                "zones": zones.iter().map(|r| json!({"id": r.get::<String, _>("id"), "name": r.get::<String, _>("name")})).collect::<Vec<_>>(),
                "records": records.iter().map(|r| json!({
                    "zoneId": r.get::<String, _>("zone_id"),
                    "recordSet": serde_json::from_str::<Value>(&r.get::<String, _>("body")).unwrap_or(Value::Null),
                })).collect::<Vec<_>>(),
            },
            "effects": effects,
        }))
    }

    async fn dns(
        &self,
        tx: &mut sqlx::SqliteConnection,
        op: &str,
        request: &Value,
    ) -> Result<Value, CapabilityError> {
        let now = self.now();
        match op {
            "dns.find-zone" => {
                let domain = s(request, "domain")
                    .trim_end_matches('.')
                    .to_ascii_lowercase();
                let zones = sqlx::query("SELECT id, name FROM sim_zones")
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                let best = zones
                    .iter()
                    .map(|r| (r.get::<String, _>("id"), r.get::<String, _>("name")))
                    .filter(|(_, name)| domain == *name || domain.ends_with(&format!(".{name}")))
                    .max_by_key(|(_, name)| name.len());
                Ok(best.map_or(Value::Null, |(id, name)| json!({"id": id, "name": name})))
            }
            "dns.create-zone" => {
                let name = s(request, "domain")
                    .trim_end_matches('.')
                    .to_ascii_lowercase();
                let id = zone_id_for(&name);
                sqlx::query(
                    "INSERT INTO sim_zones (id, name) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                )
                .bind(&id)
                .bind(&name)
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?;
                Ok(json!({"id": id, "name": name}))
            }
            "dns.delete-zone" => {
                let id = s(request, "zone_id");
                let row = sqlx::query("DELETE FROM sim_zones WHERE id = ? RETURNING name")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                let Some(row) = row else {
                    return Err(CapabilityError::permanent(
                        "not-found",
                        format!("no zone {id}"),
                    ));
                };
                sqlx::query("DELETE FROM sim_records WHERE zone_id = ?")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                Ok(json!({"id": id, "name": row.get::<String, _>("name")}))
            }
            "dns.list-records" => {
                let rows = sqlx::query(
                    "SELECT body FROM sim_records WHERE zone_id = ? AND name = ? ORDER BY type",
                )
                .bind(s(request, "zone_id"))
                .bind(s(request, "name").to_ascii_lowercase())
                .fetch_all(&mut *tx)
                .await
                .map_err(unavailable)?;
                Ok(Value::Array(
                    rows.iter()
                        .filter_map(|r| serde_json::from_str(&r.get::<String, _>("body")).ok())
                        .collect(),
                ))
            }
            "dns.change-records" => {
                let zone_id = s(request, "zone_id");
                let exists: Option<String> =
                    sqlx::query_scalar("SELECT id FROM sim_zones WHERE id = ?")
                        .bind(zone_id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(unavailable)?;
                if exists.is_none() {
                    return Err(CapabilityError::permanent(
                        "not-found",
                        format!("no hosted zone {zone_id}"),
                    ));
                }
                let mut prior = Vec::new();
                for change in request
                    .get("changes")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let (set, upsert) = match change.get("Upsert") {
                        Some(set) => (set, true),
                        None => (change.get("Delete").unwrap_or(&Value::Null), false),
                    };
                    let name = s(set, "name").to_ascii_lowercase();
                    let ty = s(set, "type_");
                    if name.is_empty() || ty.is_empty() {
                        return Err(CapabilityError::permanent(
                            "invalid-change",
                            format!("a record set needs a name and a type: {set}"),
                        ));
                    }
                    let old: Option<String> = sqlx::query_scalar(
                        "SELECT body FROM sim_records WHERE zone_id = ? AND name = ? AND type = ?",
                    )
                    .bind(zone_id)
                    .bind(&name)
                    .bind(ty)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                    if let Some(old) = &old {
                        prior.push(serde_json::from_str::<Value>(old).unwrap_or(Value::Null));
                    }
                    if upsert {
                        let mut body = set.clone();
                        body["name"] = Value::String(name.clone());
                        sqlx::query("INSERT INTO sim_records (zone_id, name, type, body) VALUES (?, ?, ?, ?) ON CONFLICT (zone_id, name, type) DO UPDATE SET body = excluded.body")
                            .bind(zone_id)
                            .bind(&name)
                            .bind(ty)
                            .bind(body.to_string())
                            .execute(&mut *tx)
                            .await
                            .map_err(unavailable)?;
                    } else if old.is_none() {
                        return Err(CapabilityError::permanent(
                            "not-found",
                            format!("no {ty} record {name} to delete"),
                        ));
                    } else {
                        sqlx::query(
                            "DELETE FROM sim_records WHERE zone_id = ? AND name = ? AND type = ?",
                        )
                        .bind(zone_id)
                        .bind(&name)
                        .bind(ty)
                        .execute(&mut *tx)
                        .await
                        .map_err(unavailable)?;
                    }
                }
                let id = format!(
                    "C{}",
                    capstan_core::ids::new_id()
                        .replace('-', "")
                        .to_ascii_uppercase()
                );
                sqlx::query("INSERT INTO sim_changes (id, zone_id, submitted_ms, insync_ms) VALUES (?, ?, ?, ?)")
                    .bind(&id)
                    .bind(zone_id)
                    .bind(now)
                    .bind(now + self.settings.dns_propagation_ms)
                    .execute(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                let status = if self.settings.dns_propagation_ms <= 0 {
                    "Insync"
                } else {
                    "Pending"
                };
                Ok(json!({"change_id": id, "zone_id": zone_id, "status": status, "prior": prior}))
            }
            "dns.get-change" => {
                let id = s(request, "change_id");
                let insync: Option<i64> =
                    sqlx::query_scalar("SELECT insync_ms FROM sim_changes WHERE id = ?")
                        .bind(id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(unavailable)?;
                match insync {
                    Some(at) if now >= at => Ok(json!("Insync")),
                    Some(_) => Ok(json!("Pending")),
                    None => Err(CapabilityError::permanent(
                        "not-found",
                        format!("no change {id}"),
                    )),
                }
            }
            other => Err(CapabilityError::permanent(
                "unsupported",
                format!("the simulated DNS has no operation {other}"),
            )),
        }
    }
}

#[async_trait]
impl Providers for SimulatedCloud {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Result<Value, CapabilityError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(unavailable)?;
        if !token.is_empty() {
            let done: Option<String> =
                sqlx::query_scalar("SELECT response FROM sim_effects WHERE token = ?")
                    .bind(token)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(unavailable)?;
            if let Some(done) = done {
                return serde_json::from_str(&done)
                    .map_err(|e| CapabilityError::permanent("corrupt", e.to_string()));
            }
        }
        let answer = match op.split('.').next().unwrap_or_default() {
            "dns" => self.dns(&mut tx, op, request).await?,
            capability => {
                return Err(CapabilityError::permanent(
                    "not-configured",
                    format!("the simulated cloud does not simulate `{capability}` yet ({op})"),
                ));
            }
        };
        if !token.is_empty() {
            sqlx::query("INSERT INTO sim_effects (token, op, request, response, at_ms) VALUES (?, ?, ?, ?, ?)")
                .bind(token)
                .bind(op)
                .bind(request.to_string())
                .bind(answer.to_string())
                .bind(self.now())
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?;
        }
        tx.commit().await.map_err(unavailable)?;
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_core::ManualClock;

    async fn cloud() -> (SimulatedCloud, ManualClock, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = capstan_store::Store::open(&format!("sqlite://{}/c.db", dir.path().display()))
            .await
            .unwrap();
        let clock = ManualClock::new(1_000_000);
        let cloud = SimulatedCloud::new(
            store.writer().clone(),
            Arc::new(clock.clone()),
            SimulationSettings::default(),
        )
        .await
        .unwrap();
        (cloud, clock, dir)
    }

    #[tokio::test]
    async fn dns_changes_go_insync_after_the_propagation_delay_and_repeat_tokens_change_nothing() {
        let (cloud, clock, _dir) = cloud().await;
        let zone = cloud
            .call("dns.find-zone", &json!({"domain": "www.Example.com"}), "")
            .await
            .unwrap();
        assert_eq!(zone["name"], "example.com");
        let set = json!({"name": "www.example.com", "type_": "Cname", "ttl": 300, "values": ["d1.cdn"], "alias_target": null});
        let request = json!({"zone_id": zone["id"], "changes": [{"Upsert": set}]});
        let first = cloud
            .call("dns.change-records", &request, "t1")
            .await
            .unwrap();
        assert_eq!(first["prior"], json!([]));
        let again = cloud
            .call("dns.change-records", &request, "t1")
            .await
            .unwrap();
        assert_eq!(first, again, "the same token answers the same");
        assert_eq!(cloud.snapshot().await.unwrap()["effects"], 1);
        let change = json!({"change_id": first["change_id"]});
        assert_eq!(
            cloud.call("dns.get-change", &change, "").await.unwrap(),
            "Pending"
        );
        clock.advance(2_000);
        assert_eq!(
            cloud.call("dns.get-change", &change, "").await.unwrap(),
            "Insync"
        );
        let second = cloud
            .call("dns.change-records", &request, "t2")
            .await
            .unwrap();
        assert_eq!(
            second["prior"][0]["values"],
            json!(["d1.cdn"]),
            "the prior state is in the receipt"
        );
        let missing = cloud
            .call(
                "dns.change-records",
                &json!({"zone_id": "Znope", "changes": []}),
                "t3",
            )
            .await
            .unwrap_err();
        assert_eq!(missing.code, "not-found");
        let unsupported = cloud
            .call("maps.list-keys", &json!({}), "")
            .await
            .unwrap_err();
        assert_eq!(unsupported.code, "not-configured");
    }
}
