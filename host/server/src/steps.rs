//! Fulfilment steps on this node: the step components of `booking.steps` (world
//! `fulfilment-step`, loaded by the runtime), and the host side of their imports — the booking
//! being fulfilled and a simulated supplier, admission-ticket issuer and voucher service.
//!
//! The simulated services are deterministic functions of the booking (supplier reference
//! `SUP-<bookingId>`, tickets `TKT-<bookingId>-<n>`, the voucher at `<voucher base>/<id>.pdf`),
//! so a step re-run after a crash produces the same effects: exactly-once by construction.
//! `booking.supplier_rejects` lists variants the supplier refuses (a permanent error).

use crate::config::Settings;
use async_trait::async_trait;
use capstan_booking::fulfilment::{StepOutcome, StepRunner};
use capstan_runtime::{HostCalls, Interrupt, Runtime};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The loaded step components and the simulated services behind their imports.
#[derive(Debug)]
pub struct WasmSteps {
    steps: BTreeMap<String, capstan_runtime::steps::LoadedStep>,
    rejects: Vec<String>,
    voucher_base: String,
}

impl WasmSteps {
    /// Loads every step component of `booking.steps`; failures are logged and leave the step out.
    pub async fn load(runtime: &Runtime, settings: &Settings) -> Self {
        let dir = &settings.booking.steps;
        let report = runtime.load_step_dir(dir).await;
        for failure in &report.failures {
            tracing::warn!(file = %failure.file.display(), reason = %failure.error, "fulfilment step not loaded");
        }
        tracing::info!(dir = %dir.display(), steps = ?report.steps.keys().collect::<Vec<_>>(), "fulfilment steps loaded");
        Self {
            steps: report.steps,
            rejects: settings.booking.supplier_rejects.clone(),
            voucher_base: settings.booking.voucher_base_url.clone(),
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
            booking: booking.clone(),
            rejects: self.rejects.clone(),
            voucher_base: self.voucher_base.clone(),
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
            booking: booking.clone(),
            rejects: self.rejects.clone(),
            voucher_base: self.voucher_base.clone(),
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
    booking: Value,
    rejects: Vec<String>,
    voucher_base: String,
    key: String,
}

fn err(kind: &str, code: &str, message: String) -> Value {
    json!({"Err": {"kind": kind, "code": code, "message": message}})
}

#[async_trait]
impl HostCalls for StepHost {
    async fn call(&mut self, op: &'static str, request: Value) -> Result<Value, Interrupt> {
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
                    json!({"Ok": {"supplier_reference": format!("SUP-{booking_id}")}})
                }
            }
            "supplier.cancel-confirmation" => {
                json!({"Ok": {"supplier_reference": request["supplier_reference"]}})
            }
            "admission.issue-tickets" => {
                let count = request["count"].as_u64().unwrap_or(1).clamp(1, 1000);
                let tickets: Vec<Value> = (1..=count)
                    .map(|n| {
                        json!({
                            "public_id": format!("TKT-{booking_id}-{n}"),
                            "url": format!("{}/{booking_id}/tickets/{n}.png", self.voucher_base),
                            "type_": "QRCODE",
                        })
                    })
                    .collect();
                json!({"Ok": tickets})
            }
            // Voids what the booking holds, and answers those tickets (none the second time
            // the booking shows none).
            "admission.void-tickets" => json!({"Ok": self.booking["tickets"]}),
            "vouchers.deliver-voucher" => {
                json!({"Ok": {"url": format!("{}/{booking_id}.pdf", self.voucher_base)}})
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
        Ok(answer)
    }
}
