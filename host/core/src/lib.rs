//! # capstan-core
//!
//! Capstan's vocabulary as plain data: workflow descriptors, capabilities, the injected
//! [`Clock`], and identifiers. No I/O and no heavy dependencies, so every other crate can depend
//! on it and it rebuilds in a moment.
//!
//! # Layout
//! - `clock` — [`Clock`], [`SystemClock`], [`ManualClock`] (tests move time by hand).
//! - `workflow` — [`WorkflowDescriptor`] and the [`Capability`] set operators grant.
//! - `execution` — execution and stage statuses and the status machine.
//! - `store` — the engine's storage contract by role ([`store::RunStore`] for workers,
//!   [`store::ExecutionReads`] for reads; [`store::EngineStore`] is both) and its records.
//! - `ids` — UUIDv7 identifiers (time-ordered, so lists sort by creation).
//! - `secrets` — the at-rest keyring (AES-256-GCM) that seals webhook secrets and certificate keys.
//! - `providers` — [`Providers`], the one seam every capability provider implements.
//! - `trace` — W3C trace context carried across the engine's queue (a no-op until the binary
//!   that exports traces installs its propagation).
//! - `transitions` — every move of an execution's status as one table, and `decide`, which
//!   picks the row a control command follows.

pub mod clock;
pub mod execution;
pub mod ids;
pub mod providers;
pub mod secrets;
pub mod store;
pub mod trace;
pub mod transitions;
pub mod workflow;

pub use clock::{Clock, ManualClock, SystemClock};
pub use execution::{ExecutionStatus, StageStatus};
pub use providers::{Inspect, Providers};
pub use workflow::{
    CancelMode, Capability, CapabilityError, CapabilityGrants, ErrorKind, OutcomeCondition,
    RecoveryOperation, WorkflowDescriptor,
};
