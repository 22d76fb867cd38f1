//! Fulfilment: capture queues a job; workers advance it one step component at a time
//! (per product type, e.g. confirm-supplier → issue-tickets → deliver-voucher), each step's output
//! being the next step's input. A step's progress is committed before the next begins, so a crash
//! re-runs at most the step that was running — and its effects are keyed
//! `booking:<id>:step:<index>`, so the providers deduplicate them.
//!
//! Success → COMPLETED with the tickets and voucher URL the steps produced; a permanent error (or
//! transient errors past the retry budget) → FAILED with the seats returned.

use crate::{BookingError, BookingRow, BookingStatus, Bookings, transition};
use serde_json::{Value, json};
use sqlx::Row;
use std::collections::BTreeMap;
use tracing::Instrument;

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

    /// Undoes the step `step` for a cancelled booking; `handover` is what the pipeline had
    /// handed on when it stopped, `key` the idempotency prefix for the undo's effects. `Done`
    /// (its value unused) when undone or when there was nothing to undo. By default a step has
    /// nothing to undo.
    async fn compensate(
        &self,
        _step: &str,
        _booking: &Value,
        _handover: &Value,
        _key: &str,
    ) -> anyhow::Result<StepOutcome> {
        Ok(StepOutcome::Done(Value::Null))
    }

    /// Whether the step `name` can run on this node (its component is loaded).
    fn has(&self, _name: &str) -> bool {
        true
    }
}

/// Which steps fulfil which product type, and how long a step's transient failures are
/// retried.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Pipelines {
    pub default: Vec<String>,
    #[serde(default)]
    pub by_product_type: BTreeMap<String, Vec<String>>,
    /// How long one step's transient failures (a supplier outage, a step component not
    /// loaded) are retried before the booking fails: the sum of the waits between attempts.
    /// The booking stays PENDING meanwhile.
    #[serde(default = "default_retry_for_ms")]
    pub retry_for_ms: i64,
    /// The longest wait between two attempts (waits double from one second up to it).
    #[serde(default = "default_max_backoff_ms")]
    pub max_backoff_ms: i64,
}

fn default_retry_for_ms() -> i64 {
    6 * 3_600_000
}

fn default_max_backoff_ms() -> i64 {
    300_000
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
            retry_for_ms: default_retry_for_ms(),
            max_backoff_ms: default_max_backoff_ms(),
        }
    }
}

impl Pipelines {
    pub fn steps(&self, product_type: &str) -> &[String] {
        self.by_product_type
            .get(product_type)
            .unwrap_or(&self.default)
    }

    /// The wait after a step's `attempts`-th transient failure (counted from 0): one second,
    /// doubling, at most `max_backoff_ms`.
    pub fn backoff_ms(&self, attempts: i64) -> i64 {
        (1_000i64 << attempts.clamp(0, 30)).min(self.max_backoff_ms.max(1_000))
    }

    /// Whether a step that failed transiently `attempts` times before this failure is retried:
    /// while the waits so far stay within `retry_for_ms`.
    pub fn retries(&self, attempts: i64) -> bool {
        let waited: i64 = (0..attempts.max(0)).map(|n| self.backoff_ms(n)).sum();
        waited + self.backoff_ms(attempts) <= self.retry_for_ms
    }
}

/// The booking-view record of the `capstan:booking/types` WIT interface, as JSON. `precision`
/// is the number of decimals of the booking's currency (2 for EUR, 0 for JPY): the amount in
/// minor units is the price times ten to it.
pub fn booking_view(b: &BookingRow, precision: u32) -> Value {
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
        "amount_minor": (b.price_amount * 10f64.powi(precision.min(9) as i32)).round() as i64,
        "currency_code": b.price_currency,
        "tickets": tickets,
    })
}

/// What a fulfilment job is doing; stored as its `state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobState {
    /// Running the pipeline forward; `step_index` is the next step to run.
    Running,
    /// Every step ran.
    Done,
    /// A step failed for good (the booking is FAILED).
    Failed,
    /// The booking was cancelled: undoing the steps backward; `step_index` is the next step to
    /// undo.
    Compensating,
    /// Every step that ran (or may have) is undone.
    Compensated,
    /// An undo failed for good: the operator looks (`lastError`).
    CompensationFailed,
}

impl JobState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Compensating => "compensating",
            Self::Compensated => "compensated",
            Self::CompensationFailed => "compensation_failed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Self::Running,
            Self::Done,
            Self::Failed,
            Self::Compensating,
            Self::Compensated,
            Self::CompensationFailed,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
    }
}

/// A claimed job.
#[derive(Debug, Clone)]
struct Job {
    booking_id: i64,
    state: JobState,
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
        // Only jobs this node can run: a node without one of a pipeline's step components
        // (not ready, `/readyz`) leaves those bookings to a node that has them, or to itself
        // once an operator puts the component in place, instead of spending their retries.
        let runnable = |steps: &[String]| steps.iter().all(|s| runner.has(s));
        let default_runs = runnable(&pipelines.default);
        let types: Vec<&str> = pipelines
            .by_product_type
            .iter()
            .filter(|(_, steps)| runnable(steps) != default_runs)
            .map(|(product_type, _)| product_type.as_str())
            .collect();
        // The default pipeline runs: every type but the listed ones that do not. It does not:
        // only the listed types that do.
        let filter = match (default_runs, types.is_empty()) {
            (true, true) => String::new(),
            (false, true) => "AND 1 = 0".to_owned(),
            (runs, false) => format!(
                "AND b.product_type {} ({})",
                if runs { "NOT IN" } else { "IN" },
                (0..types.len())
                    .map(|i| format!("${}", i + 6))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let mut query = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT j.booking_id, j.step_index, j.step_input, j.attempts, j.state FROM fulfilment_jobs j
             JOIN bookings b ON b.id = j.booking_id
             WHERE j.state IN ($1, $2) AND j.next_attempt_ms <= $3 AND (j.lease_until_ms IS NULL OR j.lease_until_ms <= $4)
             {filter}
             ORDER BY j.next_attempt_ms LIMIT $5"
        )))
        .bind(JobState::Running.as_str())
        .bind(JobState::Compensating.as_str())
        .bind(now)
        .bind(now)
        .bind(limit);
        for product_type in types {
            query = query.bind(product_type);
        }
        let rows = query.fetch_all(self.store().pool()).await?;
        let mut ran = 0;
        for r in rows {
            let Some(state) = JobState::parse(r.get::<&str, _>(4)) else {
                continue;
            };
            let job = Job {
                booking_id: r.get(0),
                state,
                step_index: r.get(1),
                step_input: serde_json::from_str(r.get::<&str, _>(2)).unwrap_or(Value::Null),
                attempts: r.get(3),
            };
            // Claim: only one worker (or node) runs a job at a time.
            let claimed = sqlx::query(
                "UPDATE fulfilment_jobs SET lease_until_ms = $1 WHERE booking_id = $2 AND state = $3
                 AND step_index = $4 AND (lease_until_ms IS NULL OR lease_until_ms <= $5)",
            )
            .bind(now + lease_ms)
            .bind(job.booking_id)
            .bind(job.state.as_str())
            .bind(job.step_index)
            .bind(now)
            .execute(self.store().writer())
            .await?;
            if claimed.rows_affected() == 0 {
                continue;
            }
            match job.state {
                JobState::Compensating => self.undo(runner, pipelines, job, lease_ms).await?,
                _ => self.advance(runner, pipelines, job, lease_ms).await?,
            }
            ran += 1;
        }
        Ok(ran)
    }

    /// Undoes one step of a cancelled booking's pipeline (the job's `step_index`, going
    /// backward), under a lease kept alive while the undo runs. Its effects are keyed
    /// `booking:<id>:undo:<index>`, so an undo repeated after a crash is the same undo.
    async fn undo(
        &self,
        runner: &dyn StepRunner,
        pipelines: &Pipelines,
        job: Job,
        lease_ms: i64,
    ) -> Result<(), BookingError> {
        let (booking, view) = self.step_booking(job.booking_id).await?;
        let steps = pipelines.steps(&booking.product_type);
        // A pipeline shortened since the booking ran starts from its last step.
        let last = i64::try_from(steps.len()).unwrap_or(i64::MAX) - 1;
        let index = job.step_index.min(last);
        let outcome = match usize::try_from(index).ok().and_then(|i| steps.get(i)) {
            None => StepOutcome::Done(Value::Null),
            Some(step) => {
                let key = format!("booking:{}:undo:{index}", booking.id);
                let undo = runner.compensate(step, &view, &job.step_input, &key);
                self.under_lease(&job, lease_ms, &format!("undo of `{step}`"), undo)
                    .await
            }
        };
        let now = self.now_ms();
        let mut tx = self.store().begin_write().await?;
        // The state's name comes from the enum: these statements bind their own values.
        let guard = format!(
            "WHERE booking_id = $2 AND state = '{}' AND step_index = $3",
            JobState::Compensating.as_str()
        );
        match outcome {
            StepOutcome::Done(_) if index <= 0 => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE fulfilment_jobs SET state = $1, step_index = -1, lease_until_ms = NULL, last_error = NULL {guard}"
                )))
                .bind(JobState::Compensated.as_str())
                .bind(booking.id)
                .bind(job.step_index)
                .execute(&mut *tx)
                .await?;
                // The tickets were voided: the booking no longer shows them.
                sqlx::query("UPDATE bookings SET tickets = '[]' WHERE id = $1")
                    .bind(booking.id)
                    .execute(&mut *tx)
                    .await?;
            }
            StepOutcome::Done(_) => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE fulfilment_jobs SET step_index = $1, attempts = 0, next_attempt_ms = $4, lease_until_ms = NULL, last_error = NULL {guard}"
                )))
                .bind(index - 1)
                .bind(booking.id)
                .bind(job.step_index)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            }
            StepOutcome::Transient(error) if pipelines.retries(job.attempts) => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE fulfilment_jobs SET attempts = attempts + 1, next_attempt_ms = $1, lease_until_ms = NULL, last_error = $4 {guard}"
                )))
                .bind(now + pipelines.backoff_ms(job.attempts))
                .bind(booking.id)
                .bind(job.step_index)
                .bind(&error)
                .execute(&mut *tx)
                .await?;
            }
            StepOutcome::Transient(error) | StepOutcome::Permanent(error) => {
                tracing::error!(booking = booking.id, %error, "a cancelled booking's step could not be undone");
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE fulfilment_jobs SET state = $1, lease_until_ms = NULL, last_error = $4 {guard}"
                )))
                .bind(JobState::CompensationFailed.as_str())
                .bind(booking.id)
                .bind(job.step_index)
                .bind(&error)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn advance(
        &self,
        runner: &dyn StepRunner,
        pipelines: &Pipelines,
        job: Job,
        lease_ms: i64,
    ) -> Result<(), BookingError> {
        let (booking, view) = self.step_booking(job.booking_id).await?;
        let steps = pipelines.steps(&booking.product_type);
        let index = usize::try_from(job.step_index).unwrap_or(usize::MAX);
        let outcome = match steps.get(index) {
            None => StepOutcome::Done(job.step_input.clone()),
            Some(step) => {
                let key = format!("booking:{}:step:{index}", booking.id);
                let span = tracing::debug_span!(
                    "booking step",
                    booking = booking.id,
                    step = step.as_str(),
                    index,
                    attempt = job.attempts,
                    outcome = tracing::field::Empty,
                    otel.status_code = tracing::field::Empty,
                );
                let run = runner
                    .run(step, &view, &job.step_input, &key)
                    .instrument(span.clone());
                let outcome = self
                    .under_lease(&job, lease_ms, &format!("step `{step}`"), run)
                    .await;
                let label = match &outcome {
                    StepOutcome::Done(_) => "done",
                    StepOutcome::Transient(_) => "transient",
                    StepOutcome::Permanent(_) => "permanent",
                };
                span.record("outcome", label);
                if label != "done" {
                    span.record("otel.status_code", "ERROR");
                }
                metrics::counter!("capstan_booking_steps_total", "step" => step.clone(), "outcome" => label)
                    .increment(1);
                outcome
            }
        };
        let now = self.now_ms();
        let mut tx = self.store().begin_write().await?;
        // Read again, locked: the booking may have been cancelled or rescheduled while the step
        // ran, and what happens now is decided on what it is.
        let booking = self.locked(&mut tx, job.booking_id).await?;
        if booking.status != BookingStatus::Pending {
            // Cancelled while the step ran: the cancel turned the job to undoing from this very
            // step, and kept its lease while the step went on. The undo gets what the step
            // handed on (a supplier reference it can cancel), and may start now.
            let output = match &outcome {
                StepOutcome::Done(output) => Some(output.to_string()),
                _ => None,
            };
            sqlx::query(
                "UPDATE fulfilment_jobs SET step_input = COALESCE($1, step_input), lease_until_ms = NULL
                 WHERE booking_id = $2 AND state = $3 AND step_index = $4",
            )
            .bind(output)
            .bind(booking.id)
            .bind(JobState::Compensating.as_str())
            .bind(job.step_index)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            return Ok(());
        }
        // Every job update below is for a job still running: one ended meanwhile stays ended.
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
                    sqlx::query("UPDATE fulfilment_jobs SET state = $4, step_index = $1, step_input = $2, lease_until_ms = NULL WHERE booking_id = $3 AND state = $5")
                        .bind(next)
                        .bind(output.to_string())
                        .bind(booking.id)
                        .bind(JobState::Done.as_str())
                        .bind(JobState::Running.as_str())
                        .execute(&mut *tx)
                        .await?;
                    transition(&mut tx, &booking, BookingStatus::Completed, None, now).await?;
                } else {
                    sqlx::query(
                        "UPDATE fulfilment_jobs SET step_index = $1, step_input = $2, attempts = 0, next_attempt_ms = $3, lease_until_ms = NULL, last_error = NULL
                         WHERE booking_id = $4 AND state = $5",
                    )
                    .bind(next)
                    .bind(output.to_string())
                    .bind(now)
                    .bind(booking.id)
                    .bind(JobState::Running.as_str())
                    .execute(&mut *tx)
                    .await?;
                }
            }
            StepOutcome::Transient(error) if pipelines.retries(job.attempts) => {
                let delay = pipelines.backoff_ms(job.attempts);
                sqlx::query("UPDATE fulfilment_jobs SET attempts = attempts + 1, next_attempt_ms = $1, lease_until_ms = NULL, last_error = $2 WHERE booking_id = $3 AND state = $4")
                    .bind(now + delay)
                    .bind(&error)
                    .bind(booking.id)
                    .bind(JobState::Running.as_str())
                    .execute(&mut *tx)
                    .await?;
            }
            StepOutcome::Transient(error) | StepOutcome::Permanent(error) => {
                sqlx::query("UPDATE fulfilment_jobs SET state = $3, lease_until_ms = NULL, last_error = $1 WHERE booking_id = $2 AND state = $4")
                    .bind(&error)
                    .bind(booking.id)
                    .bind(JobState::Failed.as_str())
                    .bind(JobState::Running.as_str())
                    .execute(&mut *tx)
                    .await?;
                transition(&mut tx, &booking, BookingStatus::Failed, None, now).await?;
                sqlx::query("UPDATE bookings SET failure_reason = $1 WHERE id = $2")
                    .bind(&error)
                    .bind(booking.id)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// A job's booking, and its booking view as steps see it (amounts in the minor units of the
    /// catalog's precision for the currency; a currency since dropped from the catalog keeps
    /// the ISO 4217 default of two decimals).
    async fn step_booking(&self, id: i64) -> Result<(BookingRow, Value), BookingError> {
        let booking = self.get_row(id).await?.ok_or_else(|| {
            BookingError::internal(format!(
                "a fulfilment job names booking {id}, which is gone"
            ))
        })?;
        let precision = self
            .catalog()
            .currency(&booking.price_currency)
            .map_or(2, |c| c.precision);
        let view = booking_view(&booking, precision);
        Ok((booking, view))
    }

    /// Runs `work` (a step or its undo, `what`) while the job's lease is renewed, so the lease
    /// can be short: a node killed mid-step leaves a lease that runs out within `lease_ms`, and
    /// another pass (on any node) takes the job over. A renewal that fails (the job ended or
    /// was taken over) stops the work, as a transient failure.
    async fn under_lease(
        &self,
        job: &Job,
        lease_ms: i64,
        what: &str,
        work: impl Future<Output = anyhow::Result<StepOutcome>>,
    ) -> StepOutcome {
        tokio::select! {
            done = work => done.unwrap_or_else(|e| {
                StepOutcome::Transient(format!("{what} could not run: {e:#}"))
            }),
            () = self.keep_leased(job, lease_ms) => {
                StepOutcome::Transient("the job's lease could not be renewed".into())
            }
        }
    }

    /// Renews the job's lease every third of `lease_ms` until it fails to (the job ended, or
    /// another node took it over after a lapse); never returns while renewals succeed.
    ///
    /// A step running forward keeps its lease when a cancel turns its job to undoing from that
    /// step: the step finishes, so the undo learns what it did (its output), instead of being
    /// cut off between its effect and its answer.
    async fn keep_leased(&self, job: &Job, lease_ms: i64) {
        let every =
            std::time::Duration::from_millis(u64::try_from(lease_ms / 3).unwrap_or(1).max(1));
        loop {
            tokio::time::sleep(every).await;
            let renewed = sqlx::query(
                "UPDATE fulfilment_jobs SET lease_until_ms = $1 WHERE booking_id = $2 AND state IN ($3, $4) AND step_index = $5",
            )
            .bind(self.now_ms() + lease_ms)
            .bind(job.booking_id)
            .bind(job.state.as_str())
            .bind(JobState::Compensating.as_str())
            .bind(job.step_index)
            .execute(self.store().writer())
            .await;
            match renewed {
                Ok(done) if done.rows_affected() == 1 => {}
                Ok(_) => return,
                // The database is away: the step goes on; its result is written if it can be.
                Err(error) => tracing::warn!(%error, "fulfilment lease renewal failed; retrying"),
            }
        }
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
