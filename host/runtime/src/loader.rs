//! Loading workflow components: read, digest, compile (or load the cached artifact), check the
//! component's exports and its imports against the operator's grants, ask it to describe itself.
//! A bad file never stops the others from loading; [`LoadReport`] says which failed and why.

use crate::bindings::{self, WorkflowPre};
use crate::sandbox::{GuestState, HostCalls, Interrupt, LimitExceeded};
use crate::{CompileStats, Outcome, Runtime, RuntimeConfig, Slot, Slots, cache};
use async_trait::async_trait;
use capstan_core::{
    CancelMode, Capability, CapabilityError, CapabilityGrants, ErrorKind, OutcomeCondition,
    RecoveryOperation, WorkflowDescriptor,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::{Engine, Store};

/// The interface every workflow component exports.
pub const WORKFLOW_EXPORT: &str = "capstan:platform/workflow@0.1.0";

/// WASI interfaces a guest may import: Rust's std needs them, and the sandbox answers them with
/// nothing (no env, frozen clocks, seeded random). Filesystem and sockets are never linked for use.
pub(crate) const VIRTUALIZED_WASI: [&str; 4] =
    ["wasi:cli/", "wasi:io/", "wasi:clocks/", "wasi:random/"];

/// Why a component was refused.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not a valid component: {0}")]
    Invalid(String),
    #[error("not a workflow component: it does not export `{WORKFLOW_EXPORT}` (wrong world?)")]
    WrongWorld,
    #[error(
        "not a workflow component: {path} is a fulfilment step (it exports `{}`); steps load from the steps directory (`booking.steps`)",
        crate::steps::STEP_EXPORT
    )]
    StepNotWorkflow { path: PathBuf },
    #[error(
        "{path} is not a fulfilment step component: it does not export `{}` ({})",
        crate::steps::STEP_EXPORT,
        if *.is_workflow { "it is a workflow component; workflows load from the workflows directory" } else { "wrong world?" }
    )]
    NotAStep { path: PathBuf, is_workflow: bool },
    #[error(
        "{path} imports `{import}`, which no fulfilment step may use (only capstan:platform/context, capstan:platform/time and capstan:booking/*)"
    )]
    StepForbiddenImport { path: PathBuf, import: String },
    #[error("step `{name}` is replaced by {by}, a newer component declaring the same name")]
    StepReplaced { name: String, by: PathBuf },
    #[error(
        "workflow `{workflow}` imports `{import}`, but capability `{capability}` is not granted to it (grant it under [workflows.grants] in the config)"
    )]
    NotGranted {
        workflow: String,
        import: String,
        capability: Capability,
    },
    #[error(
        "workflow `{workflow}` imports `{import}`, which no workflow may use (no filesystem, sockets or unknown interfaces)"
    )]
    ForbiddenImport { workflow: String, import: String },
    #[error("describe() failed: {0}")]
    Describe(String),
    #[error("duplicate workflow name `{name}`: already loaded from {first}")]
    Duplicate { name: String, first: PathBuf },
    #[error("symbolic links are not followed in the workflows directory")]
    Symlink,
}

/// A component file that did not load.
#[derive(Debug)]
pub struct LoadFailure {
    pub file: PathBuf,
    pub error: LoadError,
}

/// What loading a directory produced.
#[derive(Debug, Default)]
pub struct LoadReport {
    pub workflows: Vec<Arc<LoadedWorkflow>>,
    pub failures: Vec<LoadFailure>,
}

/// A compiled, checked, described workflow component, ready to activate.
pub struct LoadedWorkflow {
    pub file: PathBuf,
    /// sha256 of the component's bytes: runs are pinned to it.
    pub digest: String,
    pub descriptor: WorkflowDescriptor,
    /// `descriptor.input_schema`, compiled once: every trigger body is validated with it.
    pub input_validator: jsonschema::Validator,
    /// Every interface the component imports.
    pub imports: Vec<String>,
    /// The capabilities it uses (all granted).
    pub capabilities: BTreeSet<Capability>,
    pub stats: CompileStats,
    pre: WorkflowPre<GuestState>,
}

impl std::fmt::Debug for LoadedWorkflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedWorkflow")
            .field("file", &self.file)
            .field("digest", &self.digest)
            .field("name", &self.descriptor.name)
            .field("capabilities", &self.capabilities)
            .finish_non_exhaustive()
    }
}

impl LoadedWorkflow {
    /// One activation: instantiate (through the pre-linked `InstancePre`), call `run(input)`,
    /// drop the instance. `seed` makes the guest's WASI clocks and random deterministic.
    pub async fn activate(
        &self,
        runtime: &Runtime,
        host: Box<dyn HostCalls>,
        seed: u64,
        input: &str,
    ) -> Outcome {
        let (_slot, mut store) =
            new_store(&runtime.engine, &runtime.config, &runtime.slots, host, seed).await;
        let input = input.to_owned();
        let ran = within_deadline(&mut store, &runtime.config, async |store| {
            let workflow = self.pre.instantiate_async(&mut *store).await?;
            workflow
                .capstan_platform_workflow()
                .call_run(store, &input)
                .await
        })
        .await;
        match ran {
            Ok(Ok(output)) => Outcome::Completed(Ok(output)),
            Ok(Err(error)) => Outcome::Completed(Err(guest_error(error))),
            Err(trap) => classify(trap, &mut store, &runtime.config),
        }
    }
}

/// A store for one activation (of a workflow or a step) with the sandbox limits of `config`, in
/// a slot of the instance pool (waited for when all are taken). Keep the slot until the store is
/// dropped.
pub(crate) async fn new_store(
    engine: &Engine,
    config: &RuntimeConfig,
    slots: &Slots,
    host: Box<dyn HostCalls>,
    seed: u64,
) -> (Slot, Store<GuestState>) {
    let slot = slots.take().await;
    let mut store = Store::new(
        engine,
        GuestState::new(host, seed, config.memory_limit_bytes, config.limits),
    );
    store.limiter(|state| &mut state.memory);
    // Both only fail when fuel is not enabled, and `Runtime::new` always enables it.
    let _ = store.set_fuel(config.fuel_per_activation);
    let _ = store.fuel_async_yield_interval(Some(10_000_000));
    // At each epoch tick running wasm checks the guest's own time: past the deadline it traps,
    // otherwise it yields to the executor (so a busy guest shares its thread) and goes on.
    let limit_ms = config.limits.deadline_ms;
    let deadline = Duration::from_millis(limit_ms);
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |store| {
        if store.data().clock.guest_elapsed() >= deadline {
            return Err(LimitExceeded::Deadline { limit_ms }.into());
        }
        Ok(wasmtime::UpdateDeadline::Yield(1))
    });
    (slot, store)
}

/// Runs `work` (an instantiation, a guest export) on `store` under the activation's deadline.
/// Running wasm is stopped by the epoch callback ([`new_store`]); this covers the time a guest
/// spends blocked in a WASI call (a `poll` on a clock pollable), where no epoch check runs: the
/// call is dropped, which unwinds the guest, and the activation reports the deadline.
pub(crate) async fn within_deadline<T>(
    store: &mut Store<GuestState>,
    config: &RuntimeConfig,
    work: impl AsyncFnOnce(&mut Store<GuestState>) -> wasmtime::Result<T>,
) -> wasmtime::Result<T> {
    let clock = store.data().clock.clone();
    let deadline = Duration::from_millis(config.limits.deadline_ms);
    tokio::select! {
        biased;
        done = work(store) => done,
        () = clock.expired(deadline) => Err(LimitExceeded::Deadline {
            limit_ms: config.limits.deadline_ms,
        }
        .into()),
    }
}

pub(crate) fn guest_error(error: bindings::types::Error) -> CapabilityError {
    CapabilityError {
        kind: match error.kind {
            bindings::types::ErrorKind::Transient => ErrorKind::Transient,
            bindings::types::ErrorKind::Permanent => ErrorKind::Permanent,
        },
        code: error.code,
        message: error.message,
        retry_after_ms: None,
    }
}

/// Says why the guest stopped: a host interrupt, a sandbox limit, or its own trap.
pub(crate) fn classify(
    trap: wasmtime::Error,
    store: &mut Store<GuestState>,
    config: &RuntimeConfig,
) -> Outcome {
    if let Some(interrupt) = store.data_mut().interrupt.take() {
        return Outcome::Interrupted(interrupt);
    }
    if let Some(limit) = trap.downcast_ref::<LimitExceeded>() {
        return Outcome::Limit(*limit);
    }
    // The pool ran out of some part (a component with more modules than the pool allows
    // for): the host's shortage, not the guest's fault, so the run is retried, not failed.
    if trap
        .downcast_ref::<wasmtime::PoolConcurrencyLimitError>()
        .is_some()
    {
        return Outcome::Interrupted(Interrupt::Host(format!("{trap:#}")));
    }
    match trap.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::OutOfFuel) => Outcome::Limit(LimitExceeded::Cpu {
            fuel: config.fuel_per_activation,
        }),
        Some(wasmtime::Trap::StackOverflow) => Outcome::Limit(LimitExceeded::Stack {
            limit_bytes: config.max_wasm_stack_bytes,
        }),
        _ => Outcome::Trapped(format!("{trap:#}")),
    }
}

/// `describe()` may not call the host.
pub(crate) struct NoHostCalls;

#[async_trait]
impl HostCalls for NoHostCalls {
    async fn call(
        &mut self,
        op: &'static str,
        _request: crate::sandbox::Request,
    ) -> Result<crate::sandbox::Answer, Interrupt> {
        Err(Interrupt::Host(format!(
            "describe() may not call the host (it called `{op}`)"
        )))
    }
}

impl Runtime {
    /// A store without host calls, for asking a freshly loaded component to describe itself.
    pub(crate) async fn describe_store(&self) -> (Slot, Store<GuestState>) {
        new_store(
            &self.engine,
            &self.config,
            &self.slots,
            Box::new(NoHostCalls),
            0,
        )
        .await
    }

    /// Loads one component file.
    pub async fn load_file(
        &self,
        path: &Path,
        grants: &CapabilityGrants,
    ) -> Result<LoadedWorkflow, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        self.load_bytes(path, &bytes, grants).await
    }

    /// Loads a component from its bytes; `path` names it in errors.
    pub async fn load_bytes(
        &self,
        path: &Path,
        bytes: &[u8],
        grants: &CapabilityGrants,
    ) -> Result<LoadedWorkflow, LoadError> {
        let digest = cache::digest(bytes);
        let (component, stats) = self
            .cache
            .get(&self.engine, &digest, bytes)
            .map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
        let ty = component.component_type();
        if !ty
            .exports(&self.engine)
            .any(|(name, _)| name == WORKFLOW_EXPORT)
        {
            if ty
                .exports(&self.engine)
                .any(|(name, _)| name == crate::steps::STEP_EXPORT)
            {
                return Err(LoadError::StepNotWorkflow {
                    path: path.to_owned(),
                });
            }
            return Err(LoadError::WrongWorld);
        }
        let imports: Vec<String> = ty
            .imports(&self.engine)
            .map(|(name, _)| name.to_owned())
            .collect();
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
        let pre =
            WorkflowPre::new(instance_pre).map_err(|e| LoadError::Invalid(format!("{e:#}")))?;

        let (_slot, mut store) = self.describe_store().await;
        let described = within_deadline(&mut store, &self.config, async |store| {
            let instance = pre.instantiate_async(&mut *store).await?;
            instance
                .capstan_platform_workflow()
                .call_describe(store)
                .await
        })
        .await;
        let descriptor = match described {
            Ok(d) => descriptor(d)?,
            Err(trap) => {
                let why = match classify(trap, &mut store, &self.config) {
                    Outcome::Interrupted(i) => i.to_string(),
                    Outcome::Limit(l) => l.to_string(),
                    Outcome::Trapped(t) => t,
                    Outcome::Completed(_) => "no result".to_owned(),
                };
                return Err(LoadError::Describe(why));
            }
        };

        let input_validator = input_validator(&descriptor.input_schema)?;
        let granted = grants.get(&descriptor.name).cloned().unwrap_or_default();
        let mut capabilities = BTreeSet::new();
        for import in &imports {
            if import.starts_with("capstan:platform/")
                || VIRTUALIZED_WASI.iter().any(|p| import.starts_with(p))
            {
                continue;
            }
            match Capability::from_interface(import) {
                Some(capability) if granted.contains(&capability) => {
                    capabilities.insert(capability);
                }
                Some(capability) => {
                    return Err(LoadError::NotGranted {
                        workflow: descriptor.name,
                        import: import.clone(),
                        capability,
                    });
                }
                None => {
                    return Err(LoadError::ForbiddenImport {
                        workflow: descriptor.name,
                        import: import.clone(),
                    });
                }
            }
        }
        Ok(LoadedWorkflow {
            file: path.to_owned(),
            digest,
            descriptor,
            input_validator,
            imports,
            capabilities,
            stats,
            pre,
        })
    }

    /// Loads every `*.wasm` file of `dir` (not recursively, in name order). Bad files are reported,
    /// not fatal; a second component with an already-loaded name is refused.
    pub async fn load_dir(&self, dir: &Path, grants: &CapabilityGrants) -> LoadReport {
        let mut report = LoadReport::default();
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(source) => {
                report.failures.push(LoadFailure {
                    file: dir.to_owned(),
                    error: LoadError::Read {
                        path: dir.to_owned(),
                        source,
                    },
                });
                return report;
            }
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|ext| ext == "wasm"))
            .collect();
        files.sort();
        let mut names: BTreeMap<String, PathBuf> = BTreeMap::new();
        for file in files {
            if std::fs::symlink_metadata(&file).is_ok_and(|m| m.file_type().is_symlink()) {
                report.failures.push(LoadFailure {
                    file,
                    error: LoadError::Symlink,
                });
                continue;
            }
            match self.load_file(&file, grants).await {
                Ok(workflow) => {
                    if let Some(first) = names.get(&workflow.descriptor.name) {
                        let error = LoadError::Duplicate {
                            name: workflow.descriptor.name.clone(),
                            first: first.clone(),
                        };
                        report.failures.push(LoadFailure { file, error });
                        continue;
                    }
                    names.insert(workflow.descriptor.name.clone(), file);
                    report.workflows.push(Arc::new(workflow));
                }
                Err(error) => report.failures.push(LoadFailure { file, error }),
            }
        }
        report
    }
}

/// The trigger body's validator. A schema that does not compile refuses the component at load,
/// where the operator sees it, rather than failing every trigger.
fn input_validator(schema: &serde_json::Value) -> Result<jsonschema::Validator, LoadError> {
    jsonschema::validator_for(schema)
        .map_err(|e| LoadError::Describe(format!("input schema is not a valid JSON Schema: {e}")))
}

fn descriptor(
    d: bindings::descriptor::WorkflowDescriptor,
) -> Result<WorkflowDescriptor, LoadError> {
    let input_schema = serde_json::from_str(&d.input_schema)
        .map_err(|e| LoadError::Describe(format!("input schema is not JSON: {e}")))?;
    if d.name.is_empty()
        || !d
            .name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(LoadError::Describe(format!(
            "workflow name `{}` must be non-empty kebab-case (a-z, 0-9, -): it becomes a route",
            d.name
        )));
    }
    Ok(WorkflowDescriptor {
        name: d.name,
        version: d.version,
        description: d.description,
        stages: d.stages,
        estimated_duration_seconds: d.estimated_duration_seconds,
        input_schema,
        recovery_operations: d
            .recovery_operations
            .into_iter()
            .map(|r| {
                let from_statuses = r
                    .from_statuses
                    .iter()
                    .map(|s| {
                        s.parse().map_err(|_| {
                            LoadError::Describe(format!(
                                "recovery `{}` names an unknown status `{s}`",
                                r.name
                            ))
                        })
                    })
                    .collect::<Result<_, _>>()?;
                Ok(RecoveryOperation {
                    name: r.name,
                    from_stage: r.from_stage,
                    from_statuses,
                    when_outcome: r.when_outcome.map(|c| OutcomeCondition {
                        pointer: c.pointer,
                        equals: c.equals,
                    }),
                })
            })
            .collect::<Result<_, LoadError>>()?,
        cancel_mode: match d.cancel_mode {
            bindings::descriptor::CancelMode::Immediate => CancelMode::Immediate,
            bindings::descriptor::CancelMode::Cooperative => CancelMode::Cooperative,
        },
        resumable_when_failed: d.resumable_when_failed,
        point_of_no_return: d.point_of_no_return,
        rollback_requires_terminal: d.rollback_requires_terminal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_input_schema_that_does_not_compile_refuses_the_component() {
        let schema = json!({"type": "object", "properties": {"domain": {"type": 12}}});
        let Err(LoadError::Describe(why)) = input_validator(&schema) else {
            panic!("a schema whose type is a number compiled");
        };
        assert!(
            why.starts_with("input schema is not a valid JSON Schema"),
            "{why}"
        );
        let valid = input_validator(&json!({
            "type": "object",
            "required": ["domain"],
            "properties": {"domain": {"type": "string"}},
        }))
        .map_err(|e| e.to_string());
        let Ok(valid) = valid else {
            panic!("{valid:?}");
        };
        assert!(valid.is_valid(&json!({"domain": "example.com"})));
        assert!(!valid.is_valid(&json!({})));
    }
}
