//! Fulfilment steps: components of the `fulfilment-step` world (`wit/worlds.wit`), one per step of
//! a booking's fulfilment pipeline (`confirm-supplier`, `issue-tickets`, `deliver-voucher`, ...).
//!
//! Steps share everything with workflows except their world: the same [`Engine`], the same
//! content-addressed compile cache, the same sandbox (memory cap, fuel, stack limit, WASI with
//! nothing behind it) and the same call boundary: every import is forwarded to
//! [`HostCalls::call`]`(op, request)` with `op = "<interface>.<function>"` and the arguments as a
//! JSON object keyed by the Rust parameter name (snake_case); the answer must be the JSON of the
//! WIT return type as serde writes the generated Rust type (see `docs/decisions.md`, "One call
//! boundary").
//!
//! - [`Runtime::load_step_dir`] / [`Runtime::load_step_file`] / [`Runtime::load_step_bytes`] load
//!   and describe step components; a component of another world (a workflow, say) is refused with
//!   [`LoadError::NotAStep`], naming the file.
//! - [`LoadedStep::run`] runs one step on its input (the previous step's output, or `null`);
//!   [`LoadedStep::compensate`] undoes it on a cancelled booking's handover.
//!
//! # The JSON of each operation
//!
//! Records use the Rust field names of the generated types (`booking_id`; `type_` for the WIT
//! field `%type`), `option` is `null` or the value, `tuple<string, string>` a two-element array,
//! enum cases their Rust names (`"Permanent"`, `"Info"`), and a `result` is `{"Ok": ..}` or
//! `{"Err": error}` where `error` is `{"kind": "Transient" | "Permanent", "code": "kebab-code",
//! "message": ".."}` (the JSON of [`CapabilityError`]).
//!
//! | op | request | answer |
//! |---|---|---|
//! | `booking.current` | `{}` | `booking-view` (below; not wrapped in `Ok`) |
//! | `supplier.confirm` | `{"booking_id", "product_id", "variant_id", "start_date_time": str, "pax": u32}` | `{"Ok": {"supplier_reference": str}}` / `{"Err": error}` |
//! | `supplier.cancel-confirmation` | `{"supplier_reference": str}` | `{"Ok": {"supplier_reference": str}}` / `{"Err": error}` |
//! | `admission.issue-tickets` | `{"booking_id": str, "count": u32}` | `{"Ok": [ticket]}` / `{"Err": error}` |
//! | `admission.void-tickets` | `{"booking_id": str}` | `{"Ok": [ticket]}` / `{"Err": error}` |
//! | `vouchers.deliver-voucher` | `{"booking_id": str, "tickets": [ticket]}` | `{"Ok": {"url": str}}` / `{"Err": error}` |
//! | `context.info` | `{}` | `{"execution_id", "workflow_run_id", "workflow", "principal_id"}` (strings) |
//! | `context.log` | `{"level": "Trace" \| "Debug" \| "Info" \| "Warn" \| "Error", "message": str}` | `null` |
//! | `context.emit` | `{"event_type": str, "payload": str (JSON text)}` | `null` |
//! | `context.stage-begin` | `{"name": str}` | `null` |
//! | `context.stage-succeeded` | `{"name": str, "output": str (JSON text) \| null}` | `null` |
//! | `context.stage-failed` | `{"name": str, "error": error}` | `null` |
//! | `context.cancellation-requested` | `{}` | `bool` |
//! | `time.now` | `{}` | `u64` (milliseconds since the Unix epoch) |
//! | `time.sleep` | `{"millis": u64}` | `null` |
//!
//! The step SDK (`step-sdk/`) calls only `booking.current`, the `supplier`, `admission` and
//! `vouchers` operations above, `context.log` and `time.now`; the other `context.*` and
//! `time.sleep` exist because the world imports the whole `context` and `time` interfaces, and a
//! host may refuse them with [`Interrupt::Host`].
//!
//! `ticket` is `{"public_id": str, "url": str | null, "type_": str}` and `booking-view` is
//!
//! ```json
//! {"booking_id": "42", "partner_id": "p1", "product_id": "1001", "product_name": "Colosseum",
//!  "product_type": "ATTRACTION", "variant_id": "2001", "variant_name": "Skip-the-line",
//!  "start_date_time": "2026-12-31T21:00:00",
//!  "customers": [{"person_type": "ADULT", "is_primary": true, "input_fields": [["fullName", "Ada"]]}],
//!  "seat_codes": [], "amount_minor": 4500, "currency_code": "EUR", "tickets": []}
//! ```
//!
//! An answer that does not fit the WIT type traps the step ([`StepFailure::Trapped`], with the
//! operation and the answer in the message).

use crate::bindings::forward;
use crate::loader::{
    LoadError, LoadFailure, VIRTUALIZED_WASI, classify, guest_error, new_store, within_deadline,
};
use crate::sandbox::{GuestState, HostCalls, Interrupt, LimitExceeded};
use crate::{CompileStats, Outcome, Runtime, RuntimeConfig, Slots, cache};
use capstan_core::CapabilityError;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use wasmtime::Engine;
use wasmtime::component::{HasSelf, Linker};

/// The interface every step component exports.
pub const STEP_EXPORT: &str = "capstan:booking/step@0.1.0";

/// Interfaces a step may import (besides the virtualized WASI of Rust's std).
const STEP_IMPORTS: [&str; 4] = [
    "capstan:platform/types@",
    "capstan:platform/context@",
    "capstan:platform/time@",
    "capstan:booking/",
];

/// The `bindgen!` of the `fulfilment-step` world. The `capstan:platform` interfaces are the
/// workflow bindings' own (same types, same `Host` impls, same op names).
mod wit {
    wasmtime::component::bindgen!({
        world: "capstan:host/fulfilment-step",
        path: "../../wit",
        imports: { default: async | trappable },
        exports: { default: async },
        additional_derives: [serde::Serialize, serde::Deserialize],
        with: { "capstan:platform": crate::bindings::capstan::platform },
    });
}

pub use wit::capstan::booking::types::{BookingView, Customer, Ticket};
use wit::capstan::booking::{admission, booking, supplier, types, vouchers};
pub use wit::capstan::booking::{supplier::Confirmation, vouchers::Voucher};
use wit::{FulfilmentStep, FulfilmentStepPre};

type Error = crate::bindings::types::Error;

impl types::Host for GuestState {}

impl booking::Host for GuestState {
    forward! { "booking";
        fn current() -> BookingView = "current";
    }
}

impl supplier::Host for GuestState {
    forward! { "supplier";
        fn confirm(booking_id: String, product_id: String, variant_id: String, start_date_time: String, pax: u32) -> Result<Confirmation, Error> = "confirm";
        fn cancel_confirmation(supplier_reference: String) -> Result<Confirmation, Error> = "cancel-confirmation";
    }
}

impl admission::Host for GuestState {
    forward! { "admission";
        fn issue_tickets(booking_id: String, count: u32) -> Result<Vec<Ticket>, Error> = "issue-tickets";
        fn void_tickets(booking_id: String) -> Result<Vec<Ticket>, Error> = "void-tickets";
    }
}

impl vouchers::Host for GuestState {
    forward! { "vouchers";
        fn deliver_voucher(booking_id: String, tickets: Vec<Ticket>) -> Result<Voucher, Error> = "deliver-voucher";
    }
}

/// The linker of step components: the deterministic WASI and the `fulfilment-step` imports.
pub(crate) fn linker(engine: &Engine) -> anyhow::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    FulfilmentStep::add_to_linker::<GuestState, HasSelf<GuestState>>(&mut linker, |s| s)?;
    Ok(linker)
}

/// Why a step run produced no result (the step's own error is `Ok(Err(..))` instead).
#[derive(Debug, thiserror::Error)]
pub enum StepFailure {
    /// A host call answered with an [`Interrupt`] (the host could not answer, say).
    #[error("step interrupted: {0}")]
    Interrupted(Interrupt),
    /// The step ran into a sandbox wall.
    #[error(transparent)]
    Limit(LimitExceeded),
    /// The step trapped (a panic, `unreachable`, a host answer that does not fit its WIT type).
    #[error("step trapped: {0}")]
    Trapped(String),
    /// The step returned text that is not JSON.
    #[error("step output is not JSON: {0}")]
    InvalidOutput(String),
}

impl StepFailure {
    /// True when the step component itself is at fault (limit, trap, bad output): running it
    /// again on the same input fails the same way. False for interrupts raised by the host.
    pub fn is_guest_fault(&self) -> bool {
        !matches!(self, Self::Interrupted(_))
    }
}

/// What loading a steps directory produced.
#[derive(Debug, Default)]
pub struct StepLoadReport {
    /// The loaded steps by descriptor name.
    pub steps: BTreeMap<String, LoadedStep>,
    pub failures: Vec<LoadFailure>,
}

/// A compiled, checked, described step component, ready to run.
pub struct LoadedStep {
    /// The descriptor's name, by which pipelines (`[booking.fulfilment]`) refer to the step.
    pub name: String,
    pub version: String,
    pub description: String,
    pub file: PathBuf,
    /// sha256 of the component's bytes.
    pub digest: String,
    /// Every interface the component imports.
    pub imports: Vec<String>,
    pub stats: CompileStats,
    config: RuntimeConfig,
    slots: Slots,
    pre: FulfilmentStepPre<GuestState>,
}

impl std::fmt::Debug for LoadedStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedStep")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("file", &self.file)
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

impl LoadedStep {
    /// Runs the step once on `input` (the previous step's output, `null` for the first step):
    /// instantiate, call `run`, drop the instance. Every import goes to `calls`.
    ///
    /// `Ok(Ok(output))` is the step's output JSON, `Ok(Err(error))` its own error (a capability
    /// error it propagated unchanged, or one it raised), `Err(..)` a run that produced no result.
    /// The guest's WASI random is seeded from the input, so the same input runs the same way.
    pub async fn run(
        &self,
        calls: impl HostCalls + 'static,
        input: Value,
    ) -> Result<Result<Value, CapabilityError>, StepFailure> {
        let input = input.to_string();
        let seed = seed_of(&input);
        let engine = self.pre.engine();
        let (_slot, mut store) =
            new_store(engine, &self.config, &self.slots, Box::new(calls), seed).await;
        let ran = within_deadline(&mut store, &self.config, async |store| {
            let step = self.pre.instantiate_async(&mut *store).await?;
            step.capstan_booking_step().call_run(store, &input).await
        })
        .await;
        match ran {
            Ok(Ok(output)) => serde_json::from_str(&output)
                .map(Ok)
                .map_err(|e| StepFailure::InvalidOutput(format!("{e}; output was {output}"))),
            Ok(Err(error)) => Ok(Err(guest_error(error))),
            Err(trap) => Err(failure(classify(trap, &mut store, &self.config))),
        }
    }
}

impl LoadedStep {
    /// Runs the step's compensation once on `handover` (what the pipeline had handed on when
    /// the booking was cancelled): instantiate, call `compensate`, drop the instance. Answers
    /// as [`LoadedStep::run`], with `Ok(Ok(()))` for an undo that is done.
    pub async fn compensate(
        &self,
        calls: impl HostCalls + 'static,
        handover: Value,
    ) -> Result<Result<(), CapabilityError>, StepFailure> {
        let handover = handover.to_string();
        let seed = seed_of(&handover);
        let engine = self.pre.engine();
        let (_slot, mut store) =
            new_store(engine, &self.config, &self.slots, Box::new(calls), seed).await;
        let ran = within_deadline(&mut store, &self.config, async |store| {
            let step = self.pre.instantiate_async(&mut *store).await?;
            step.capstan_booking_step()
                .call_compensate(store, &handover)
                .await
        })
        .await;
        match ran {
            Ok(Ok(())) => Ok(Ok(())),
            Ok(Err(error)) => Ok(Err(guest_error(error))),
            Err(trap) => Err(failure(classify(trap, &mut store, &self.config))),
        }
    }
}

fn seed_of(input: &str) -> u64 {
    let hash = Sha256::digest(input.as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&hash[..8]);
    u64::from_le_bytes(bytes)
}

fn failure(activation: Outcome) -> StepFailure {
    match activation {
        Outcome::Interrupted(interrupt) => StepFailure::Interrupted(interrupt),
        Outcome::Limit(limit) => StepFailure::Limit(limit),
        Outcome::Trapped(message) => StepFailure::Trapped(message),
        Outcome::Completed(_) => StepFailure::Trapped("the step stopped without a result".into()),
    }
}

impl Runtime {
    /// Loads one step component file.
    pub async fn load_step_file(&self, path: &Path) -> Result<LoadedStep, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        self.load_step_bytes(path, &bytes).await
    }

    /// Loads a step component from its bytes; `path` names it in errors. Checks that it exports
    /// `capstan:booking/step` and imports nothing beyond the `fulfilment-step` world, then asks
    /// it to describe itself (without host calls).
    pub async fn load_step_bytes(
        &self,
        path: &Path,
        bytes: &[u8],
    ) -> Result<LoadedStep, LoadError> {
        let digest = cache::digest(bytes);
        let (component, stats) = self
            .cache
            .get(&self.engine, &digest, bytes)
            .map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
        let ty = component.component_type();
        let exports: Vec<String> = ty
            .exports(&self.engine)
            .map(|(name, _)| name.to_owned())
            .collect();
        if !exports.iter().any(|name| name == STEP_EXPORT) {
            return Err(LoadError::NotAStep {
                path: path.to_owned(),
                is_workflow: exports
                    .iter()
                    .any(|name| name == crate::loader::WORKFLOW_EXPORT),
            });
        }
        let imports: Vec<String> = ty
            .imports(&self.engine)
            .map(|(name, _)| name.to_owned())
            .collect();
        if let Some(import) = imports.iter().find(|import| {
            !STEP_IMPORTS.iter().any(|p| import.starts_with(p))
                && !VIRTUALIZED_WASI.iter().any(|p| import.starts_with(p))
        }) {
            return Err(LoadError::StepForbiddenImport {
                path: path.to_owned(),
                import: import.clone(),
            });
        }
        let instance_pre = self
            .step_linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
        let pre = FulfilmentStepPre::new(instance_pre)
            .map_err(|e| LoadError::Invalid(format!("{e:#}")))?;

        let (_slot, mut store) = self.describe_store().await;
        let described = within_deadline(&mut store, &self.config, async |store| {
            let instance = pre.instantiate_async(&mut *store).await?;
            instance.capstan_booking_step().call_describe(store).await
        })
        .await;
        let descriptor = match described {
            Ok(d) => d,
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
        if descriptor.name.is_empty()
            || !descriptor
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(LoadError::Describe(format!(
                "step name `{}` must be non-empty kebab-case (a-z, 0-9, -): pipelines name steps by it",
                descriptor.name
            )));
        }
        Ok(LoadedStep {
            name: descriptor.name,
            version: descriptor.version,
            description: descriptor.description,
            file: path.to_owned(),
            digest,
            imports,
            stats,
            config: self.config.clone(),
            slots: self.slots.clone(),
            pre,
        })
    }

    /// Loads every `*.wasm` file of `dir` (not recursively) as a step. Bad files are reported, not
    /// fatal. When two files declare the same step name, the one modified last wins (ties: the
    /// later file name), so dropping a new component into the directory replaces the step of the
    /// same name; the replaced file is reported with [`LoadError::StepReplaced`].
    pub async fn load_step_dir(&self, dir: &Path) -> StepLoadReport {
        let mut report = StepLoadReport::default();
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
        let mut files: Vec<(SystemTime, PathBuf)> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|ext| ext == "wasm"))
            .map(|p| {
                let modified = std::fs::metadata(&p)
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                (modified, p)
            })
            .collect();
        // Oldest first: a later file of the same name replaces an earlier one.
        files.sort();
        for (_, file) in files {
            if std::fs::symlink_metadata(&file).is_ok_and(|m| m.file_type().is_symlink()) {
                report.failures.push(LoadFailure {
                    file,
                    error: LoadError::Symlink,
                });
                continue;
            }
            match self.load_step_file(&file).await {
                Ok(step) => {
                    if let Some(replaced) = report.steps.remove(&step.name) {
                        report.failures.push(LoadFailure {
                            file: replaced.file,
                            error: LoadError::StepReplaced {
                                name: step.name.clone(),
                                by: file,
                            },
                        });
                    }
                    report.steps.insert(step.name.clone(), step);
                }
                Err(error) => report.failures.push(LoadFailure { file, error }),
            }
        }
        report
    }
}
