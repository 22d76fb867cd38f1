//! Fulfilment: capture queues a job; workers advance it one step component at a time
//! (per product type, e.g. confirm-supplier → issue-tickets → deliver-voucher), each step's output
//! being the next step's input. A step's progress is committed before the next begins, so a crash
//! re-runs at most the step that was running — and its effects are keyed
//! `booking:<id>:step:<index>`, so the providers deduplicate them.
//!
//! Success → COMPLETED with the tickets and voucher URL the steps produced; a permanent error (or
//! transient errors past the retry budget) → FAILED with the seats returned.

use crate::{BookingError, BookingRow, Bookings, Environment, record_status};
use serde_json::{Value, json};
use sqlx::Row;
use std::collections::BTreeMap;

/// What a step came to.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    Done(Value),
    Transient(String),
    Permanent(String),
}

/// Runs one named step for a booking (the server wires the WebAssembly step components).
#[async_trait::async_trait]
pub trait StepRunner: Send + Sync + std::fmt::Debug {
    /// `booking` is the booking-view JSON, `input` the previous step's output, `key` the
    /// idempotency prefix for the step's effects.
    async fn run(
        &self,
        step: &str,
        booking: &Value,
        input: &Value,
        key: &str,
    ) -> anyhow::Result<StepOutcome>;
}

/// Which steps fulfil which product type.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct Pipelines {
    pub default: Vec<String>,
    #[serde(default)]
    pub by_product_type: BTreeMap<String, Vec<String>>,
    /// Retries of a step's transient failure before the booking fails.
    #[serde(default = "default_retries")]
    pub max_retries: u32,
}

fn default_retries() -> u32 {
    5
}

impl Default for Pipelines {
    fn default() -> Self {
        Self {
            default: vec![
                "confirm-supplier".into(),
                "issue-tickets".into(),
                "deliver-voucher".into(),
            ],
            by_product_type: BTreeMap::new(),
            max_retries: default_retries(),
        }
    }
}

impl Pipelines {
    pub fn steps(&self, product_type: &str) -> &[String] {
        self.by_product_type
            .get(product_type)
            .unwrap_or(&self.default)
    }
}

/// The booking-view record of the `capstan:booking/types` WIT interface, as JSON.
pub fn booking_view(b: &BookingRow) -> Value {
    let customers: Vec<Value> = b.customers["customers"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    json!({
                        "person_type": c["personType"],
                        "is_primary": c["isPrimary"],
                        "input_fields": c["inputFields"].as_array().map(|fs| fs.iter().map(|f| json!([f["id"], f["value"]])).collect::<Vec<_>>()).unwrap_or_default(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let seat_codes: Vec<Value> = b
        .seat_info
        .as_ref()
        .and_then(Value::as_array)
        .map(|s| s.iter().map(|x| x["seatCode"].clone()).collect())
        .unwrap_or_default();
    let tickets: Vec<Value> = b
        .tickets
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| json!({"public_id": t["publicId"], "url": t["url"], "type_": t["type"]}))
                .collect()
        })
        .unwrap_or_default();
    json!({
        "booking_id": b.id.to_string(),
        "partner_id": b.partner_id,
        "product_id": b.product_id,
        "product_name": b.product_name,
        "product_type": b.product_type,
        "variant_id": b.variant_id,
        "variant_name": b.variant_name,
        "start_date_time": b.start_local,
        "customers": customers,
        "seat_codes": seat_codes,
        "amount_minor": (b.price_amount * 100.0).round() as i64,
        "currency_code": b.price_currency,
        "tickets": tickets,
    })
}

/// A claimed job.
#[derive(Debug, Clone)]
struct Job {
    booking_id: i64,
    step_index: i64,
    step_input: Value,
    attempts: i64,
}

impl Bookings {
    /// Claims due jobs (lease `lease_ms`) and advances each by one step. Returns how many steps ran.
    pub async fn run_fulfilment(
        &self,
        runner: &dyn StepRunner,
        pipelines: &Pipelines,
        lease_ms: i64,
        limit: i64,
    ) -> Result<usize, BookingError> {
        let now = self.now_ms();
        let rows = sqlx::query(
            "SELECT booking_id, step_index, step_input, attempts FROM fulfilment_jobs
             WHERE state = 'running' AND next_attempt_ms <= $1 AND (lease_until_ms IS NULL OR lease_until_ms <= $2)
             ORDER BY next_attempt_ms LIMIT $3",
        )
        .bind(now)
        .bind(now)
        .bind(limit)
        .fetch_all(self.store().pool())
        .await?;
        let mut ran = 0;
        for r in rows {
            let job = Job {
                booking_id: r.get(0),
                step_index: r.get(1),
                step_input: serde_json::from_str(r.get::<&str, _>(2)).unwrap_or(Value::Null),
                attempts: r.get(3),
            };
            // Claim: only one worker (or node) runs a job at a time.
            let claimed = sqlx::query(
                "UPDATE fulfilment_jobs SET lease_until_ms = $1 WHERE booking_id = $2 AND state = 'running'
                 AND step_index = $3 AND (lease_until_ms IS NULL OR lease_until_ms <= $4)",
            )
            .bind(now + lease_ms)
            .bind(job.booking_id)
            .bind(job.step_index)
            .bind(now)
            .execute(self.store().writer())
            .await?;
            if claimed.rows_affected() == 0 {
                continue;
            }
            self.advance(runner, pipelines, job).await?;
            ran += 1;
        }
        Ok(ran)
    }

    async fn advance(
        &self,
        runner: &dyn StepRunner,
        pipelines: &Pipelines,
        job: Job,
    ) -> Result<(), BookingError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{} WHERE id = $1",
            crate::SELECT_BOOKING
        )))
        .bind(job.booking_id)
        .fetch_one(self.store().writer())
        .await?;
        let booking = BookingRow::from_row(&row);
        let env = Environment::parse(&booking.environment).unwrap_or(Environment::Production);
        let steps = pipelines.steps(&booking.product_type);
        let index = usize::try_from(job.step_index).unwrap_or(usize::MAX);
        let outcome = match steps.get(index) {
            None => StepOutcome::Done(job.step_input.clone()),
            Some(step) => {
                let key = format!("booking:{}:step:{index}", booking.id);
                match runner
                    .run(step, &booking_view(&booking), &job.step_input, &key)
                    .await
                {
                    Ok(o) => o,
                    Err(e) => StepOutcome::Transient(format!("step `{step}` could not run: {e:#}")),
                }
            }
        };
        let now = self.now_ms();
        let mut tx = self.store().begin_write().await?;
        match outcome {
            StepOutcome::Done(output) => {
                // Steps may hand over tickets and a voucher URL (in the Booking's JSON shape).
                if let Some(tickets) = output.get("tickets").filter(|t| t.is_array()) {
                    let tickets: Vec<Value> = tickets
                        .as_array()
                        .map(|ts| ts.iter().map(|t| json!({"publicId": t.get("publicId").or(t.get("public-id")), "url": t["url"], "type": t["type"]})).collect())
                        .unwrap_or_default();
                    sqlx::query("UPDATE bookings SET tickets = $1 WHERE id = $2")
                        .bind(Value::from(tickets).to_string())
                        .bind(booking.id)
                        .execute(&mut *tx)
                        .await?;
                }
                if let Some(url) = output.get("voucherUrl").and_then(Value::as_str) {
                    sqlx::query("UPDATE bookings SET voucher_url = $1 WHERE id = $2")
                        .bind(url)
                        .bind(booking.id)
                        .execute(&mut *tx)
                        .await?;
                }
                let next = job.step_index + 1;
                if usize::try_from(next).unwrap_or(usize::MAX) >= steps.len() {
                    sqlx::query("UPDATE fulfilment_jobs SET state = 'done', step_index = $1, step_input = $2, lease_until_ms = NULL WHERE booking_id = $3")
                        .bind(next)
                        .bind(output.to_string())
                        .bind(booking.id)
                        .execute(&mut *tx)
                        .await?;
                    let moved = sqlx::query("UPDATE bookings SET status = 'COMPLETED', updated_ms = $1 WHERE id = $2 AND status = 'PENDING'")
                        .bind(now)
                        .bind(booking.id)
                        .execute(&mut *tx)
                        .await?;
                    if moved.rows_affected() == 1 {
                        record_status(
                            &mut tx,
                            env,
                            &booking.partner_id,
                            booking.id,
                            "COMPLETED",
                            now,
                        )
                        .await?;
                    }
                } else {
                    sqlx::query(
                        "UPDATE fulfilment_jobs SET step_index = $1, step_input = $2, attempts = 0, next_attempt_ms = $3, lease_until_ms = NULL, last_error = NULL
                         WHERE booking_id = $4",
                    )
                    .bind(next)
                    .bind(output.to_string())
                    .bind(now)
                    .bind(booking.id)
                    .execute(&mut *tx)
                    .await?;
                }
            }
            StepOutcome::Transient(error) if job.attempts < i64::from(pipelines.max_retries) => {
                let delay = 1_000i64 << job.attempts.clamp(0, 10);
                sqlx::query("UPDATE fulfilment_jobs SET attempts = attempts + 1, next_attempt_ms = $1, lease_until_ms = NULL, last_error = $2 WHERE booking_id = $3")
                    .bind(now + delay)
                    .bind(&error)
                    .bind(booking.id)
                    .execute(&mut *tx)
                    .await?;
            }
            StepOutcome::Transient(error) | StepOutcome::Permanent(error) => {
                sqlx::query("UPDATE fulfilment_jobs SET state = 'failed', lease_until_ms = NULL, last_error = $1 WHERE booking_id = $2")
                    .bind(&error)
                    .bind(booking.id)
                    .execute(&mut *tx)
                    .await?;
                let moved = sqlx::query("UPDATE bookings SET status = 'FAILED', failure_reason = $1, updated_ms = $2 WHERE id = $3 AND status = 'PENDING'")
                    .bind(&error)
                    .bind(now)
                    .bind(booking.id)
                    .execute(&mut *tx)
                    .await?;
                if moved.rows_affected() == 1 {
                    crate::release_seats(&mut tx, env, &booking).await?;
                    record_status(&mut tx, env, &booking.partner_id, booking.id, "FAILED", now)
                        .await?;
                }
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// The fulfilment job of a booking: `{state, step, attempts, lastError}` (for operators).
    pub async fn fulfilment_state(&self, booking_id: i64) -> Result<Option<Value>, BookingError> {
        let row = sqlx::query("SELECT state, step_index, attempts, last_error FROM fulfilment_jobs WHERE booking_id = $1")
            .bind(booking_id)
            .fetch_optional(self.store().pool())
            .await?;
        Ok(row.map(|r| {
            json!({"state": r.get::<&str, _>(0), "step": r.get::<i64, _>(1), "attempts": r.get::<i64, _>(2), "lastError": r.get::<Option<String>, _>(3)})
        }))
    }
}
