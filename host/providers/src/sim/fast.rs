//! The hot calls without a transaction of their own (SQLite).
//!
//! SQLite has one writer, and a simulated call that reads and decides inside an sqlx write
//! transaction holds it for several round trips to the connection's thread, while every
//! execution's durable points wait behind it. So the calls a workflow makes most take shorter
//! ways: polling a change reads on a read connection, and a DNS change reads, decides and writes
//! inside the engine's next group commit, on the writer's own thread
//! ([`capstan_store::Store::commit_decided`]): one wait for the caller, no guard to fail. Anything
//! unusual (a fault rule fits the call, a repeated token, an error to report, a refused write)
//! takes the ordinary path: one transaction that reads and writes.

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
                match self.change_records(request, token).await {
                    Ok(answer) => answer,
                    Err(error) => {
                        tracing::debug!(%error, "simulated DNS change: group commit refused it; retrying in a transaction");
                        None
                    }
                }
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
    ) -> Result<Option<Result<Value, CapabilityError>>, capstan_core::store::StoreError> {
        let zone_id = s(request, "zone_id").to_owned();
        let Ok(changes) = parse_changes(request) else {
            return Ok(None);
        };
        // Everything the decision needs in one statement: the token's answer, the zone, and the
        // record sets the batch touches, told apart by their first column.
        let mut read =
            Sql::new("SELECT 'done', response, NULL, NULL FROM sim_effects WHERE token = ");
        read.push_bind(token.to_owned())
            .push(" UNION ALL SELECT 'zone', name, NULL, NULL FROM sim_zones WHERE id = ")
            .push_bind(zone_id.clone());
        for c in &changes {
            read.push(
                " UNION ALL SELECT 'record', body, name, type FROM sim_records WHERE zone_id = ",
            )
            .push_bind(zone_id.clone())
            .push(" AND name = ")
            .push_bind(c.name.clone())
            .push(" AND type = ")
            .push_bind(c.ty.clone());
        }
        let now = self.now();
        let propagation_ms = self.settings.dns_propagation_ms;
        let change_id = self.new_change_id();
        let token = token.to_owned();
        let request = request.to_string();
        // Decided on the writer's thread, inside the commit: nothing changes between the read
        // and the writes. `None` (already done under this token, no such zone, a batch to
        // refuse) writes nothing, and the ordinary path answers.
        let decide = move |rows: Vec<Vec<Value>>| {
            let text =
                |row: &[Value], i: usize| row.get(i).and_then(Value::as_str).map(str::to_owned);
            let mut zone_name = None;
            let mut olds: Vec<Option<String>> = vec![None; changes.len()];
            for row in &rows {
                match row.first().and_then(Value::as_str) {
                    Some("done") => return None,
                    Some("zone") => zone_name = text(row, 1),
                    _ => {
                        let (name, ty) = (text(row, 2)?, text(row, 3)?);
                        if let Some(i) = changes.iter().position(|c| c.name == name && c.ty == ty) {
                            olds[i] = text(row, 1);
                        }
                    }
                }
            }
            let plan = ChangePlan::new(
                &zone_id,
                &zone_name?,
                changes.clone(),
                &olds,
                change_id.clone(),
            )
            .ok()?;
            let answer = plan.answer(propagation_ms);
            let mut sql = Sql::default();
            for statement in plan.writes(now, propagation_ms) {
                sql.extend(statement);
            }
            sql.push_statement(
                "INSERT INTO sim_effects (token, op, request, response, at_ms) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(token.clone())
            .bind("dns.change-records".to_owned())
            .bind(request.clone())
            .bind(answer.to_string())
            .bind(now);
            Some((sql, answer))
        };
        Ok(self.store.commit_decided(read, decide).await?.map(Ok))
    }
}
