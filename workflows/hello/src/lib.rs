//! `hello`: the smallest workflow worth running. Two stages, a durable sleep between them, and a
//! typed input and output — what every workflow is, without any capability.

use capstan_sdk::{Ctx, Descriptor, Error, Workflow};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Input {
    /// Who to greet.
    pub name: String,
    /// Seconds to wait between the two stages (default 0).
    #[serde(default)]
    pub pause_seconds: u64,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    pub greeting: String,
    pub greeted_at: u64,
    pub farewell_at: u64,
}

pub struct Hello;

impl Workflow for Hello {
    type Input = Input;
    type Output = Output;

    fn descriptor() -> Descriptor {
        Descriptor::new("hello", env!("CARGO_PKG_VERSION"))
            .description("Greets someone, waits durably, and says goodbye.")
            .stages(&["greet", "farewell"])
            .estimated_duration_seconds(1)
    }

    fn run(ctx: &mut Ctx, input: Input) -> Result<Output, Error> {
        if input.name.trim().is_empty() {
            return Err(Error::permanent("invalid-input", "name must not be empty"));
        }
        let greeted_at = ctx.stage("greet", |ctx| Ok(ctx.now_millis()))?;
        ctx.sleep(Duration::from_secs(input.pause_seconds));
        let farewell_at = ctx.stage("farewell", |ctx| Ok(ctx.now_millis()))?;
        Ok(Output {
            greeting: format!("hello, {}", input.name.trim()),
            greeted_at,
            farewell_at,
        })
    }
}

capstan_sdk::export_workflow!(Hello);

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_sdk::harness::{Harness, StageStatus};
    use capstan_sdk::json;

    #[test]
    fn greets_sleeps_durably_and_says_goodbye() {
        let report = Harness::new().run::<Hello>(json!({"name": " Ada ", "pauseSeconds": 3600}));
        let output: Output = serde_json::from_value(report.output.clone().unwrap()).unwrap();
        assert_eq!(output.greeting, "hello, Ada");
        assert_eq!(
            output.farewell_at - output.greeted_at,
            3_600_000,
            "the sleep advanced the simulated clock"
        );
        assert_eq!(report.stage_names(), ["greet", "farewell"]);
        assert!(
            report
                .stages
                .iter()
                .all(|s| s.status == StageStatus::Succeeded)
        );
        assert_eq!(
            report.calls("time.sleep")[0].request,
            json!({"millis": 3_600_000})
        );
    }

    #[test]
    fn refuses_an_empty_name_before_any_stage() {
        let report = Harness::new().run::<Hello>(json!({"name": "  "}));
        assert_eq!(report.output.unwrap_err().code, "invalid-input");
        assert!(report.stages.is_empty());
    }

    #[test]
    fn rejects_unknown_fields() {
        let report = Harness::new().run::<Hello>(json!({"name": "x", "extra": 1}));
        assert_eq!(report.output.unwrap_err().code, "invalid-input");
    }
}
