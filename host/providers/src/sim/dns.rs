//! Simulated DNS: hosted zones, record sets, changes that go `Pending` → `Insync`.

use super::{SimulatedCloud, s, unavailable, zone_id_for};
use capstan_core::CapabilityError;
use capstan_core::store::json_string;
use serde_json::{Value, json};
use sqlx::Row;

impl SimulatedCloud {
    pub(super) async fn dns(
        &self,
        tx: &mut super::transaction::SimTx,
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
                    .fetch_all(tx.conn().await.map_err(unavailable)?)
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
                .execute(tx.conn().await.map_err(unavailable)?)
                .await
                .map_err(unavailable)?;
                Ok(json!({"id": id, "name": name}))
            }
            "dns.delete-zone" => {
                let id = s(request, "zone_id");
                let row = sqlx::query("DELETE FROM sim_zones WHERE id = $1 RETURNING name")
                    .bind(id)
                    .fetch_optional(tx.conn().await.map_err(unavailable)?)
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
                    .execute(tx.conn().await.map_err(unavailable)?)
                    .await
                    .map_err(unavailable)?;
                Ok(json!({"id": id, "name": row.get::<String, _>("name")}))
            }
            "dns.list-records" => {
                let rows = sqlx::query(
                    "SELECT body FROM sim_records WHERE zone_id = $1 AND dns_key = $2 ORDER BY type",
                )
                .bind(s(request, "zone_id"))
                .bind(dns_key(&s(request, "name").to_ascii_lowercase()))
                .fetch_all(tx.conn().await.map_err(unavailable)?)
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
                tx.statement("SELECT name FROM sim_zones WHERE id = $1")
                    .bind(zone_id.to_owned());
                let exists: Option<String> = match tx.fetch().await.map_err(unavailable)?.first() {
                    Some(row) => Some(row.try_get(0).map_err(unavailable)?),
                    None => None,
                };
                let Some(zone_name) = exists else {
                    return Err(no_zone(zone_id));
                };
                let changes = parse_changes(request)?;
                let postgres = tx.backend() == capstan_store::Backend::Postgres;
                if postgres {
                    // READ COMMITTED would let two changes of one record set both read it
                    // before either wrote it: one change of a record set at a time (SQLite's
                    // single writer already is). A change is decided from its own record sets
                    // only (`ChangePlan`), so changes of other record sets of the zone go on
                    // meanwhile; the locks are taken in one order, so two batches that share
                    // record sets cannot deadlock.
                    let mut sets: Vec<String> = changes
                        .iter()
                        .map(|c| record_set_lock(zone_id, &c.name, &c.ty))
                        .collect();
                    sets.sort();
                    for set in sets {
                        tx.statement("SELECT pg_advisory_xact_lock(hashtext($1))")
                            .bind(set);
                        tx.fetch().await.map_err(unavailable)?;
                    }
                    // A record set another node creates without the lock (a claim, see
                    // `Write::Claim`) may appear after the read: the writes then go back to
                    // here and the batch is decided again from what is read.
                    tx.statement("SAVEPOINT decide");
                    tx.done().await.map_err(unavailable)?;
                }
                let mut tries = 0;
                let plan = loop {
                    let mut olds = Vec::new();
                    for c in &changes {
                        tx.statement(
                            "SELECT body FROM sim_records WHERE zone_id = $1 AND dns_key = $2 AND type = $3",
                        )
                        .bind(zone_id.to_owned())
                        .bind(dns_key(&c.name))
                        .bind(c.ty.clone());
                        olds.push(match tx.fetch().await.map_err(unavailable)?.first() {
                            Some(row) => Some(row.try_get::<String, _>(0).map_err(unavailable)?),
                            None => None,
                        });
                    }
                    let plan = ChangePlan::new(
                        zone_id,
                        &zone_name,
                        changes.clone(),
                        &olds,
                        self.new_change_id(),
                    )?;
                    let mut claimed = true;
                    for write in plan.writes(now, self.settings.dns_propagation_ms) {
                        match write {
                            Write::Claim(mut sql) if postgres => {
                                sql.push(" RETURNING 1");
                                tx.append(&sql);
                                if tx.fetch().await.map_err(unavailable)?.is_empty() {
                                    claimed = false;
                                    break;
                                }
                            }
                            Write::Claim(sql) | Write::Plain(sql) => {
                                tx.append(&sql);
                                tx.done().await.map_err(unavailable)?;
                            }
                        }
                    }
                    if claimed {
                        break plan;
                    }
                    tries += 1;
                    if tries == DECIDE_TRIES {
                        return Err(CapabilityError::transient(
                            "unavailable",
                            format!(
                                "the record sets of zone {zone_id} kept being created while this change was decided"
                            ),
                        ));
                    }
                    tx.statement("ROLLBACK TO SAVEPOINT decide");
                    tx.done().await.map_err(unavailable)?;
                };
                Ok(plan.answer(self.settings.dns_propagation_ms))
            }
            "dns.get-change" => {
                let id = s(request, "change_id");
                tx.statement("SELECT insync_ms FROM sim_changes WHERE id = $1")
                    .bind(id.to_owned());
                let insync: Option<i64> = match tx.fetch().await.map_err(unavailable)?.first() {
                    Some(row) => Some(row.try_get(0).map_err(unavailable)?),
                    None => None,
                };
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

/// The text whose hash names a record set's advisory lock on PostgreSQL; taken in the order of
/// these texts, by the ordinary path and by writes behind answers alike.
pub(super) fn record_set_lock(zone_id: &str, name: &str, ty: &str) -> String {
    format!("{zone_id}\u{1f}{name}\u{1f}{ty}")
}

/// A record set's name with its labels in reverse order (`www.example.com` →
/// `com.example.www`): `sim_records`' key, so that a domain's record sets sit side by side in the
/// primary key (Route 53 lists a zone in this order too) and a change of several of them writes
/// one leaf, not one per name. Every label is kept, empty ones too, so distinct names keep
/// distinct keys (`www.example.com.` → `.com.example.www`). The migrations that added the key
/// compute the same text in SQL for the rows they found.
pub(super) fn dns_key(name: &str) -> String {
    let mut labels: Vec<&str> = name.split('.').collect();
    labels.reverse();
    labels.join(".")
}

pub(super) fn no_zone(zone_id: &str) -> CapabilityError {
    CapabilityError::permanent("not-found", format!("no hosted zone {zone_id}"))
}

/// One change of a `dns.change-records` request, its name lower-cased.
#[derive(Clone)]
pub(super) struct Change {
    pub name: String,
    pub ty: String,
    /// The record set to write; `None` deletes.
    pub upsert: Option<Value>,
}

/// Times the ordinary path decides a batch again because a record set it read as absent was
/// created meanwhile ([`Write::Claim`]).
const DECIDE_TRIES: usize = 4;

/// The changes of a request, each naming a record set; several changes of one record set in
/// one batch are refused, as Route 53 does.
pub(super) fn parse_changes(request: &Value) -> Result<Vec<Change>, CapabilityError> {
    let mut changes: Vec<Change> = Vec::new();
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
        let ty = s(set, "type_").to_owned();
        if name.is_empty() || ty.is_empty() {
            return Err(CapabilityError::permanent(
                "invalid-change-batch",
                format!("a record set needs a name and a type: {set}"),
            ));
        }
        if changes.iter().any(|c| c.name == name && c.ty == ty) {
            return Err(CapabilityError::permanent(
                "invalid-change-batch",
                format!("the batch changes {ty} {name} more than once"),
            ));
        }
        let upsert = upsert.then(|| {
            let mut body = set.clone();
            body["name"] = Value::String(name.clone());
            body
        });
        changes.push(Change { name, ty, upsert });
    }
    Ok(changes)
}

/// One statement of [`ChangePlan::writes`].
pub(super) enum Write {
    /// Creates a record set the batch found absent, and changes nothing if one exists by then.
    /// On PostgreSQL a change decided in memory creates its record sets without their locks
    /// (`write_behind.rs`: a new record set is claimed by its primary key, which lets those
    /// writes merge with the group's), so one may appear after the ordinary path read it as
    /// absent, and the ordinary path checks that each claim created its row.
    Claim(capstan_store::Sql),
    Plain(capstan_store::Sql),
}

/// A record set's insert where the batch found none ([`Write::Claim`]).
const CLAIM: &str = "INSERT INTO sim_records (zone_id, dns_key, name, type, body) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (zone_id, dns_key, type) DO NOTHING";
const UPSERT: &str = "INSERT INTO sim_records (zone_id, dns_key, name, type, body) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (zone_id, dns_key, type) DO UPDATE SET body = excluded.body";
pub(super) const CHANGE_INSERT: &str =
    "INSERT INTO sim_changes (id, zone_id, submitted_ms, insync_ms) VALUES ($1, $2, $3, $4)";

/// What a change batch does, decided from the zone and the record sets as they are (`olds`,
/// one per change): the same decision whether it runs inside a transaction or in memory
/// (`write_behind.rs`).
pub(super) struct ChangePlan {
    zone_id: String,
    changes: Vec<Change>,
    prior: Vec<Value>,
    /// Per change: it creates its record set (there was none).
    claims: Vec<bool>,
    /// Per change: its record set's stored body afterwards, `None` where it is deleted.
    bodies: Vec<Option<String>>,
    change_id: String,
}

impl ChangePlan {
    pub(super) fn new(
        zone_id: &str,
        zone_name: &str,
        changes: Vec<Change>,
        olds: &[Option<String>],
        change_id: String,
    ) -> Result<Self, CapabilityError> {
        let mut prior = Vec::new();
        for (c, old) in changes.iter().zip(olds) {
            let bare = c.name.trim_end_matches('.');
            let in_zone = bare == zone_name
                || bare
                    .strip_suffix(zone_name)
                    .is_some_and(|head| head.ends_with('.'));
            if !in_zone {
                return Err(CapabilityError::permanent(
                    "invalid-change-batch",
                    format!("{} is not in zone {zone_name}", c.name),
                ));
            }
            match old {
                Some(old) => prior.push(serde_json::from_str::<Value>(old).unwrap_or(Value::Null)),
                None if c.upsert.is_none() => {
                    return Err(CapabilityError::permanent(
                        "invalid-change-batch",
                        format!("no {} record {} to delete", c.ty, c.name),
                    ));
                }
                None => {}
            }
        }
        let claims = changes
            .iter()
            .zip(olds)
            .map(|(c, old)| old.is_none() && c.upsert.is_some())
            .collect();
        let bodies = changes
            .iter()
            .map(|c| c.upsert.as_ref().map(json_string))
            .collect();
        Ok(Self {
            zone_id: zone_id.to_owned(),
            changes,
            prior,
            claims,
            bodies,
            change_id,
        })
    }

    /// The statements that apply the batch and record the change, one `Sql` each.
    pub(super) fn writes(&self, now: i64, propagation_ms: i64) -> Vec<Write> {
        let mut out = Vec::new();
        for ((c, claim), body) in self.changes.iter().zip(&self.claims).zip(&self.bodies) {
            let mut sql = capstan_store::Sql::default();
            match body {
                Some(body) => {
                    let text = if *claim { CLAIM } else { UPSERT };
                    sql.push_statement(text)
                        .bind(self.zone_id.clone())
                        .bind(dns_key(&c.name))
                        .bind(c.name.clone())
                        .bind(c.ty.clone())
                        .bind(body.clone());
                }
                None => {
                    sql.push_statement(
                        "DELETE FROM sim_records WHERE zone_id = $1 AND dns_key = $2 AND type = $3",
                    )
                    .bind(self.zone_id.clone())
                    .bind(dns_key(&c.name))
                    .bind(c.ty.clone());
                }
            }
            out.push(if *claim {
                Write::Claim(sql)
            } else {
                Write::Plain(sql)
            });
        }
        let mut sql = capstan_store::Sql::default();
        sql.push_statement(CHANGE_INSERT)
            .bind(self.change_id.clone())
            .bind(self.zone_id.clone())
            .bind(now)
            .bind(now + propagation_ms);
        out.push(Write::Plain(sql));
        out
    }

    /// Whether the batch only creates record sets (none of its record sets existed).
    pub(super) fn only_creates(&self) -> bool {
        self.claims.iter().all(|claim| *claim)
    }

    pub(super) fn zone_id(&self) -> &str {
        &self.zone_id
    }

    pub(super) fn change_id(&self) -> &str {
        &self.change_id
    }

    /// Each change's record set as [`ChangePlan::writes`] leaves it (its stored body), `None`
    /// where it is deleted.
    pub(super) fn bodies(&self) -> &[Option<String>] {
        &self.bodies
    }

    pub(super) fn answer(&self, propagation_ms: i64) -> Value {
        let status = if propagation_ms <= 0 {
            "Insync"
        } else {
            "Pending"
        };
        json!({"change_id": self.change_id, "zone_id": self.zone_id, "status": status, "prior": self.prior})
    }
}
