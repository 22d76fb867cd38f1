//! Fulfilment steps (placeholder until the step runtime lands).
use crate::config::Settings;
use async_trait::async_trait;
use capstan_booking::fulfilment::{StepOutcome, StepRunner};
use capstan_runtime::Runtime;
use serde_json::Value;

#[derive(Debug)]
pub struct WasmSteps;

impl WasmSteps {
    pub async fn load(_runtime: &Runtime, _settings: &Settings) -> Self {
        Self
    }
}

#[async_trait]
impl StepRunner for WasmSteps {
    async fn run(
        &self,
        step: &str,
        _booking: &Value,
        _input: &Value,
        _key: &str,
    ) -> anyhow::Result<StepOutcome> {
        Ok(StepOutcome::Transient(format!(
            "step `{step}` is not loaded"
        )))
    }
}
