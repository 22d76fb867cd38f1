//! The hot calls without holding the writer (SQLite).
//!
//! SQLite has one writer, and a simulated call that reads and decides inside its write
//! transaction holds it for several round trips to the connection's thread, while every
//! execution's durable points wait behind it. So the calls a workflow makes most — a DNS change
//! and polling it — read on a read connection, decide, and commit what they decided with the
//! engine's group commit under guards that what they read still holds
//! ([`capstan_store::Store::commit_guarded`]). When a guard fails (another call changed the same
//! record set meanwhile) or anything else is unusual (a fault rule fits the call, a repeated token,
//! an error to report), the call takes the ordinary path: one transaction that reads and writes.

use super::dns::{ChangePlan, parse_changes};
use super::{SimulatedCloud, s};
use capstan_core::CapabilityError;
use capstan_store::{Backend, Sql};
use serde_json::{Value, json};
use sqlx::Row;

impl SimulatedCloud {
    /// The answer, or `None` to take the ordinary path.
    pub(super) async fn fast(
        &self,
        op: &str,
        request: &Value,
        token: &str,
    ) -> Option<Result<Value, CapabilityError>> {
        // A call that a fault rule fits takes the ordinary path, which counts and applies faults.
        if self.store.backend() != Backend::Sqlite
            || self.settings.faults.iter().any(|f| f.fits(op, request))
        {
            return None;
        }
        match op {
            "dns.get-change" if token.is_empty() => self.get_change(request).await,
            "dns.change-records" if !token.is_empty() => {
                self.change_records(request, token).await.ok().flatten()
            }
            _ => None,
        }
    }

    async fn get_change(&self, request: &Value) -> Option<Result<Value, CapabilityError>> {
        let read = Sql::new("SELECT insync_ms FROM sim_changes WHERE id = $1")
            .arg(s(request, "change_id").to_owned());
        let insync: Option<i64> = match self.store.fetch_optional(read).await.ok()? {
            Some(row) => Some(row.try_get(0).ok()?),
            None => None,
        };
        // An unknown id is an error: the ordinary path words it.
        let at = insync?;
        Some(Ok(json!(if self.now() >= at {
            "Insync"
        } else {
            "Pending"
        })))
    }

    async fn change_records(
        &self,
        request: &Value,
        token: &str,
    ) -> Result<Option<Result<Value, CapabilityError>>, sqlx::Error> {
        let zone_id = s(request, "zone_id");
        let Ok(changes) = parse_changes(request) else {
            return Ok(None);
        };
        // Everything the decision needs in one statement (one snapshot, no read transaction to
        // begin and end): the token's answer, the zone, and the record sets the batch touches,
        // told apart by their first column.
        let mut read =
            Sql::new("SELECT 'done', response, NULL, NULL FROM sim_effects WHERE token = ");
        read.push_bind(token.to_owned())
            .push(" UNION ALL SELECT 'zone', name, NULL, NULL FROM sim_zones WHERE id = ")
            .push_bind(zone_id.to_owned());
        for c in &changes {
            read.push(
                " UNION ALL SELECT 'record', body, name, type FROM sim_records WHERE zone_id = ",
            )
            .push_bind(zone_id.to_owned())
            .push(" AND name = ")
            .push_bind(c.name.clone())
            .push(" AND type = ")
            .push_bind(c.ty.clone());
        }
        let rows = self.store.fetch_all(read).await?;
        let mut zone_name = None;
        let mut olds: Vec<Option<String>> = vec![None; changes.len()];
        for row in &rows {
            match row.try_get::<&str, _>(0)? {
                // Already done under this token: the ordinary path answers it again.
                "done" => return Ok(None),
                "zone" => zone_name = Some(row.try_get::<String, _>(1)?),
                _ => {
                    let (name, ty): (String, String) = (row.try_get(2)?, row.try_get(3)?);
                    if let Some(i) = changes.iter().position(|c| c.name == name && c.ty == ty) {
                        olds[i] = Some(row.try_get(1)?);
                    }
                }
            }
        }
        let Some(zone_name) = zone_name else {
            return Ok(None);
        };
        let Ok(plan) = ChangePlan::new(zone_id, &zone_name, changes, &olds, self.new_change_id())
        else {
            return Ok(None);
        };
        let now = self.now();
        let answer = plan.answer(self.settings.dns_propagation_ms);
        let mut sql = Sql::default();
        let guards = plan.guards(&mut sql, &olds);
        for statement in plan.writes(now, self.settings.dns_propagation_ms) {
            sql.extend(statement);
        }
        // The token's record: a concurrent call with the same token fails here (primary key).
        sql.push_statement(
            "INSERT INTO sim_effects (token, op, request, response, at_ms) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(token.to_owned())
        .bind("dns.change-records".to_owned())
        .bind(request.to_string())
        .bind(answer.to_string())
        .bind(now);
        Ok(match self.store.commit_guarded(sql, guards).await {
            Ok(()) => Some(Ok(answer)),
            Err(error) => {
                tracing::debug!(%error, "simulated DNS change: guarded commit refused; retrying in a transaction");
                None
            }
        })
    }
}
