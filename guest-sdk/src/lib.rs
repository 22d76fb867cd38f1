//! # capstan-sdk
//!
//! Write a Capstan workflow as straight-line Rust: implement [`Workflow`], describe it with a
//! [`Descriptor`], wrap each step of the process in [`Ctx::stage`], and call capabilities
//! (`ctx.dns()`, `ctx.certificates()`, ...) as ordinary functions. `export_workflow!(MyWorkflow)`
//! turns the crate into a component for `wasm32-wasip2`; [`harness::Harness`] runs the same code
//! natively against fakes and a simulated clock so it can be unit-tested with `cargo test`.
//!
//! The SDK owns the guest side of the WIT boundary and hides `wit-bindgen`: every capability call
//! goes through [`host`], which on `wasm32` calls the import and natively calls the test harness.
//! Both use the same operation names and JSON request shapes as the host's journal.
//!
//! # Layout
//! - `bindings` — the generated bindings (do not use directly).
//! - `host` — the call boundary (import or harness), and one handle type per capability.
//! - `workflow` — [`Workflow`], [`Descriptor`], [`Ctx`] and the export glue.
//! - `error` — the one error of every capability, shared with the host.
//! - `harness` — the native test harness (not on `wasm32`).

#[doc(hidden)]
pub mod bindings;
mod error;
pub mod host;
mod workflow;

#[cfg(not(target_arch = "wasm32"))]
pub mod harness;

pub use error::{Error, ErrorKind};
pub use workflow::{CancelMode, Ctx, Descriptor, LogLevel, Recovery, Workflow};

/// Capability handle types and the records they exchange.
pub use host::{cdn, certificates, convergence, dns, functions, maps, registrar, ticketing};

/// Re-exported for convenience; workflow crates still depend on `serde` and `schemars` directly
/// because their derive macros name those crates.
pub use serde_json::{Value, json};

#[doc(hidden)]
pub mod __private {
    pub use crate::workflow::{describe, run};
}

/// Exports `$ty` (a type implementing [`Workflow`]) as the component's `workflow` interface.
///
/// Use it once, at the root of a workflow crate. It expands to nothing outside `wasm32`, so the
/// same crate builds natively for its harness tests.
#[macro_export]
macro_rules! export_workflow {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct __CapstanExport;
            impl $crate::bindings::workflow::exports::capstan::platform::workflow::Guest
                for __CapstanExport
            {
                fn describe()
                -> $crate::bindings::workflow::capstan::platform::descriptor::WorkflowDescriptor
                {
                    $crate::__private::describe::<$ty>()
                }
                fn run(
                    input: ::std::string::String,
                ) -> ::std::result::Result<::std::string::String, $crate::Error> {
                    $crate::__private::run::<$ty>(&input)
                }
            }
            $crate::bindings::workflow::__export_workflow_world!(__CapstanExport);
        };
    };
}
