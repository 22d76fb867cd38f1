//! Fulfilment steps on this node: the step components of `booking.steps` (world
//! `fulfilment-step`, loaded by the runtime), and the host side of their imports — the booking
//! being fulfilled and a simulated supplier, admission-ticket issuer and voucher service.
//!
//! The simulated services behave as a real supplier with idempotency keys does: each effect
//! (a confirmation `SUP-…`, tickets `TKT-…`, a cancellation, a voucher) is made once per
//! idempotency key and kept in `sim_step_effects`, with fresh random references, so a step
//! re-run after a crash under its key gets the first answer back, and a step re-run under
//! another key would show as a second effect (what the crash tests count).
//! `booking.supplier_rejects` lists variants the supplier refuses (a permanent error).

use crate::config::Settings;
use async_trait::async_trait;
use capstan_booking::fulfilment::{StepOutcome, StepRunner};
use capstan_runtime::{Answer, HostCalls, Interrupt, Request, Runtime};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The loaded step components and the simulated services behind their imports.
#[derive(Debug)]
pub struct WasmSteps {
    steps: BTreeMap<String, capstan_runtime::steps::LoadedStep>,
    store: capstan_store::Store,
    rejects: Vec<String>,
    voucher_base: String,
    answer_after: std::time::Duration,
}

impl WasmSteps {
    /// Loads every step component of `booking.steps`; failures are logged and leave the step out.
    pub async fn load(runtime: &Runtime, settings: &Settings, store: capstan_store::Store) -> Self {
        let dir = &settings.booking.steps;
        let report = runtime.load_step_dir(dir).await;
        for failure in &report.failures {
            tracing::warn!(file = %failure.file.display(), reason = %failure.error, "fulfilment step not loaded");
        }
        tracing::info!(dir = %dir.display(), steps = ?report.steps.keys().collect::<Vec<_>>(), "fulfilment steps loaded");
        Self {
            steps: report.steps,
            store,
            rejects: settings.booking.supplier_rejects.clone(),
            voucher_base: settings.booking.voucher_base_url.clone(),
            answer_after: std::time::Duration::from_millis(settings.booking.simulated_answer_ms),
        }
    }

    pub fn names(&self) -> Vec<String> {
        self.steps.keys().cloned().collect()
    }
}

#[async_trait]
impl StepRunner for WasmSteps {
    fn has(&self, name: &str) -> bool {
        self.steps.contains_key(name)
    }

    async fn compensate(
        &self,
        step: &str,
        booking: &Value,
        handover: &Value,
        key: &str,
    ) -> anyhow::Result<StepOutcome> {
        let Some(loaded) = self.steps.get(step) else {
            return Ok(StepOutcome::Transient(format!(
                "no fulfilment step component named `{step}` is loaded (booking.steps)"
            )));
        };
        let host = StepHost {
            store: self.store.clone(),
            booking: booking.clone(),
            rejects: self.rejects.clone(),
            voucher_base: self.voucher_base.clone(),
            answer_after: self.answer_after,
            key: key.to_owned(),
        };
        Ok(outcome(
            step,
            loaded
                .compensate(host, handover.clone())
                .await
                .map(|undone| undone.map(|()| Value::Null)),
        ))
    }

    async fn run(
        &self,
        step: &str,
        booking: &Value,
        input: &Value,
        key: &str,
    ) -> anyhow::Result<StepOutcome> {
        let Some(loaded) = self.steps.get(step) else {
            // Transient: the node reports itself not ready (`/readyz`) until an operator puts
            // the component in place, and the booking waits PENDING meanwhile.
            return Ok(StepOutcome::Transient(format!(
                "no fulfilment step component named `{step}` is loaded (booking.steps)"
            )));
        };
        let host = StepHost {
            store: self.store.clone(),
            booking: booking.clone(),
            rejects: self.rejects.clone(),
            voucher_base: self.voucher_base.clone(),
            answer_after: self.answer_after,
            key: key.to_owned(),
        };
        Ok(outcome(step, loaded.run(host, input.clone()).await))
    }
}

/// What a step's run or compensation came to, for the booking's fulfilment.
fn outcome(
    step: &str,
    ran: Result<Result<Value, capstan_core::CapabilityError>, capstan_runtime::steps::StepFailure>,
) -> StepOutcome {
    match ran {
        Ok(Ok(output)) => StepOutcome::Done(output),
        Ok(Err(error)) if error.is_transient() => {
            StepOutcome::Transient(format!("{}: {}", error.code, error.message))
        }
        Ok(Err(error)) => StepOutcome::Permanent(format!("{}: {}", error.code, error.message)),
        Err(failure) if failure.is_guest_fault() => {
            StepOutcome::Permanent(format!("step `{step}` failed: {failure}"))
        }
        Err(failure) => StepOutcome::Transient(format!("step `{step}`: {failure}")),
    }
}

/// Answers one step's host calls.
struct StepHost {
    store: capstan_store::Store,
    booking: Value,
    rejects: Vec<String>,
    voucher_base: String,
    answer_after: std::time::Duration,
    key: String,
}

fn err(kind: &str, code: &str, message: String) -> Value {
    json!({"Err": {"kind": kind, "code": code, "message": message}})
}

impl StepHost {
    /// The effect `op` for this step's idempotency key: made (answer from `make`) the first
    /// time, the stored answer every later time. A database that does not answer is a
    /// transient supplier error: the step is retried.
    async fn once(&self, op: &str, make: impl FnOnce() -> Value) -> Value {
        let booking_id = self.booking["booking_id"].as_str().unwrap_or_default();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let answer = sqlx::query_scalar::<_, String>(
            "INSERT INTO sim_step_effects (idempotency_key, op, booking_id, answer, amount_minor, currency, calls, created_ms)
             VALUES ($1, $2, $3, $4, $5, $6, 1, $7)
             ON CONFLICT (idempotency_key, op) DO UPDATE SET calls = sim_step_effects.calls + 1
             RETURNING answer",
        )
        .bind(&self.key)
        .bind(op)
        .bind(booking_id)
        .bind(make().to_string())
        .bind(self.booking["amount_minor"].as_i64())
        .bind(self.booking["currency_code"].as_str())
        .bind(now)
        .fetch_one(self.store.writer())
        .await;
        if !self.answer_after.is_zero() {
            tokio::time::sleep(self.answer_after).await;
        }
        match answer.map(|a| serde_json::from_str::<Value>(&a)) {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => err("Permanent", "supplier-garbled", e.to_string()),
            Err(e) => err(
                "Transient",
                "supplier-unavailable",
                format!("the simulated supplier's ledger did not answer: {e}"),
            ),
        }
    }
}

/// A reference nobody can guess or derive from the booking: `PREFIX-` and twelve characters.
fn reference(prefix: &str) -> String {
    format!("{prefix}-{}", capstan_core::secrets::random_base62(12))
}

#[async_trait]
impl HostCalls for StepHost {
    async fn call(&mut self, op: &'static str, request: Request) -> Result<Answer, Interrupt> {
        let request = request.value;
        let booking_id = self.booking["booking_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let answer = match op {
            "booking.current" => self.booking.clone(),
            "supplier.confirm" => {
                let variant = request["variant_id"].as_str().unwrap_or_default();
                if self.rejects.iter().any(|r| r == variant) {
                    err(
                        "Permanent",
                        "supplier-rejected",
                        format!("the supplier refused variant {variant}"),
                    )
                } else {
                    self.once(
                        op,
                        || json!({"Ok": {"supplier_reference": reference("SUP")}}),
                    )
                    .await
                }
            }
            "supplier.cancel-confirmation" => {
                self.once(
                    op,
                    || json!({"Ok": {"supplier_reference": request["supplier_reference"]}}),
                )
                .await
            }
            "admission.issue-tickets" => {
                let count = request["count"].as_u64().unwrap_or(1).clamp(1, 1000);
                let voucher_base = &self.voucher_base;
                self.once(op, || {
                    let tickets: Vec<Value> = (1..=count)
                        .map(|n| {
                            json!({
                                "public_id": reference("TKT"),
                                "url": format!("{voucher_base}/{booking_id}/tickets/{n}.png"),
                                "type_": "QRCODE",
                            })
                        })
                        .collect();
                    json!({"Ok": tickets})
                })
                .await
            }
            // Voids what the booking holds, and answers those tickets (none the second time
            // the booking shows none).
            "admission.void-tickets" => {
                let tickets = self.booking["tickets"].clone();
                self.once(op, || json!({"Ok": tickets})).await
            }
            "vouchers.deliver-voucher" => {
                let url = format!("{}/{booking_id}.pdf", self.voucher_base);
                self.once(op, || json!({"Ok": {"url": url}})).await
            }
            "context.log" => {
                tracing::info!(key = %self.key, message = %request["message"], "fulfilment step log");
                Value::Null
            }
            "time.now" => json!(0),
            other => {
                return Err(Interrupt::Host(format!(
                    "fulfilment steps cannot call `{other}`"
                )));
            }
        };
        Ok(answer.into())
    }
}
