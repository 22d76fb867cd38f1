//! The workflows this process serves: loaded once at start-up from the workflows directory, with
//! the files that failed and why (shown by `capstan workflows list` and `/readyz`).

use crate::config::Settings;
use capstan_core::Capability;
use capstan_runtime::{LoadReport, LoadedWorkflow, Runtime, RuntimeConfig};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A loaded workflow, as listed.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowSummary {
    pub name: String,
    pub version: String,
    pub digest: String,
    pub file: String,
    pub stages: Vec<String>,
    /// What it is granted, each with what serves it.
    pub capabilities: Vec<Grant>,
    pub cached: bool,
    pub load_millis: f64,
}

/// A granted capability and its implementation: the kind of its `[providers.*]` table
/// (`rfc2136`, `acme`), `simulated`, or `host` for what the host itself serves (convergence,
/// booking, …).
#[derive(Debug, Clone, Serialize)]
pub struct Grant {
    pub name: String,
    pub implementation: &'static str,
}

/// A file that did not load.
#[derive(Debug, Clone, Serialize)]
pub struct FailedFile {
    pub file: String,
    pub error: String,
}

/// Loaded workflows by name, plus the failures.
#[derive(Debug)]
pub struct Registry {
    pub runtime: Arc<Runtime>,
    pub workflows: BTreeMap<String, Arc<LoadedWorkflow>>,
    pub failures: Vec<FailedFile>,
}

pub fn runtime_config(settings: &Settings) -> RuntimeConfig {
    RuntimeConfig {
        memory_limit_bytes: usize::try_from(settings.runtime.memory_limit_mib).unwrap_or(64) << 20,
        fuel_per_activation: settings.runtime.fuel_per_activation,
        max_wasm_stack_bytes: usize::try_from(settings.runtime.max_stack_kib).unwrap_or(1024) << 10,
        cache_dir: settings
            .runtime
            .cache_components
            .then(|| settings.data_dir.join("components")),
        instance_pool: settings.runtime.instance_pool,
        limits: settings.runtime.limits,
    }
}

impl Registry {
    /// Builds the runtime and loads every component of `settings.workflows`.
    pub async fn load(settings: &Settings) -> anyhow::Result<Self> {
        let runtime = Arc::new(Runtime::new(runtime_config(settings))?);
        let LoadReport {
            workflows,
            failures,
        } = runtime
            .load_dir(&settings.workflows, &settings.grants)
            .await;
        let failures = failures
            .into_iter()
            .map(|f| FailedFile {
                file: f.file.display().to_string(),
                error: f.error.to_string(),
            })
            .collect::<Vec<_>>();
        for failure in &failures {
            tracing::error!(file = %failure.file, error = %failure.error, "workflow component refused");
        }
        let workflows: BTreeMap<_, _> = workflows
            .into_iter()
            .map(|w| (w.descriptor.name.clone(), w))
            .collect();
        for w in workflows.values() {
            tracing::info!(
                workflow = %w.descriptor.name, version = %w.descriptor.version, digest = %&w.digest[..12],
                cached = !w.stats.compiled, millis = w.stats.elapsed.as_secs_f64() * 1e3, "workflow loaded"
            );
        }
        Ok(Self {
            runtime,
            workflows,
            failures,
        })
    }

    /// The loaded workflows, each grant with what serves it (`implementation` of a capability).
    pub fn summaries(
        &self,
        implementation: impl Fn(Capability) -> &'static str,
    ) -> Vec<WorkflowSummary> {
        self.workflows
            .values()
            .map(|w| WorkflowSummary {
                name: w.descriptor.name.clone(),
                version: w.descriptor.version.clone(),
                digest: w.digest.clone(),
                file: w.file.display().to_string(),
                stages: w.descriptor.stages.clone(),
                capabilities: w
                    .capabilities
                    .iter()
                    .map(|c| Grant {
                        name: c.as_str().to_owned(),
                        implementation: implementation(*c),
                    })
                    .collect(),
                cached: !w.stats.compiled,
                load_millis: w.stats.elapsed.as_secs_f64() * 1e3,
            })
            .collect()
    }
}
