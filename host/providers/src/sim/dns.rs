//! Simulated DNS: hosted zones, record sets, changes that go `Pending` → `Insync`.

use super::{SimulatedCloud, s, unavailable, zone_id_for};
use capstan_core::CapabilityError;
use serde_json::{Value, json};
use sqlx::Row;

impl SimulatedCloud {
    pub(super) async fn dns(
        &self,
        tx: &mut sqlx::AnyConnection,
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
                    "INSERT INTO sim_zones (id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
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
                let row = sqlx::query("DELETE FROM sim_zones WHERE id = $1 RETURNING name")
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
                sqlx::query("DELETE FROM sim_records WHERE zone_id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(unavailable)?;
                Ok(json!({"id": id, "name": row.get::<String, _>("name")}))
            }
            "dns.list-records" => {
                let rows = sqlx::query(
                    "SELECT body FROM sim_records WHERE zone_id = $1 AND name = $2 ORDER BY type",
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
                    sqlx::query_scalar("SELECT name FROM sim_zones WHERE id = $1")
                        .bind(zone_id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(unavailable)?;
                let Some(zone_name) = exists else {
                    return Err(CapabilityError::permanent(
                        "not-found",
                        format!("no hosted zone {zone_id}"),
                    ));
                };
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
                            "invalid-change-batch",
                            format!("a record set needs a name and a type: {set}"),
                        ));
                    }
                    let bare = name.trim_end_matches('.');
                    if bare != zone_name && !bare.ends_with(&format!(".{zone_name}")) {
                        return Err(CapabilityError::permanent(
                            "invalid-change-batch",
                            format!("{name} is not in zone {zone_name}"),
                        ));
                    }
                    let old: Option<String> = sqlx::query_scalar(
                        "SELECT body FROM sim_records WHERE zone_id = $1 AND name = $2 AND type = $3",
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
                        sqlx::query("INSERT INTO sim_records (zone_id, name, type, body) VALUES ($1, $2, $3, $4) ON CONFLICT (zone_id, name, type) DO UPDATE SET body = excluded.body")
                            .bind(zone_id)
                            .bind(&name)
                            .bind(ty)
                            .bind(body.to_string())
                            .execute(&mut *tx)
                            .await
                            .map_err(unavailable)?;
                    } else if old.is_none() {
                        return Err(CapabilityError::permanent(
                            "invalid-change-batch",
                            format!("no {ty} record {name} to delete"),
                        ));
                    } else {
                        sqlx::query(
                            "DELETE FROM sim_records WHERE zone_id = $1 AND name = $2 AND type = $3",
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
                sqlx::query("INSERT INTO sim_changes (id, zone_id, submitted_ms, insync_ms) VALUES ($1, $2, $3, $4)")
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
                    sqlx::query_scalar("SELECT insync_ms FROM sim_changes WHERE id = $1")
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
