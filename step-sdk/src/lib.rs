//! # capstan-step-sdk
//!
//! Write one step of a booking's fulfilment (world `capstan:host/fulfilment-step`) as plain Rust:
//! implement [`Step`] (a [`Descriptor`], `run(ctx, input)` and, when a cancelled booking must
//! undo what the step did, `compensate(ctx, handover)`), read the booking with
//! [`Ctx::booking`], call the booking capabilities (`ctx.supplier()`, `ctx.admission()`,
//! `ctx.vouchers()`) as ordinary functions, and hand your results to the next step in the output
//! ([`Handover`]). `export_step!(MyStep)` turns the crate into a component for `wasm32-wasip2`;
//! [`harness::Harness`] runs the same code natively against fakes so it can be unit-tested.
//!
//! This crate is separate from `capstan-sdk` (workflows) on purpose: one `wit_bindgen::generate!`
//! world per crate keeps the other world's component-type section out of every guest.
//!
//! The host chains steps: each step's output is the next step's input (`null` for the first), and
//! the last step's output carries what the booking shows (`tickets`, `voucherUrl`). See
//! `docs/authoring.md`, "Writing a fulfilment step".
//!
//! # Layout
//! - `bindings` — the generated bindings (do not use directly).
//! - `host` — the call boundary (import or harness), one handle type per capability.
//! - `step` — [`Step`], [`Descriptor`], [`Ctx`], [`Handover`], [`TicketJson`], the export glue.
//! - `error` — the one error of every capability, shared with the host.
//! - `harness` — the native test harness (not on `wasm32`).

#[doc(hidden)]
pub mod bindings;
mod error;
pub mod host;
mod step;

#[cfg(not(target_arch = "wasm32"))]
pub mod harness;

pub use error::{Error, ErrorKind};
pub use host::{admission, supplier, vouchers};
pub use step::{
    BookingView, Ctx, Customer, Descriptor, Handover, LogLevel, Step, Ticket, TicketJson,
};

/// Re-exported for convenience.
pub use serde_json::{Value, json};

#[doc(hidden)]
pub mod __private {
    pub use crate::step::{compensate, describe, run};
}

/// Exports `$ty` (a type implementing [`Step`]) as the component's `capstan:booking/step`.
///
/// Use it once, at the root of a step crate. It expands to nothing outside `wasm32`, so the same
/// crate builds natively for its harness tests.
#[macro_export]
macro_rules! export_step {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct __CapstanStepExport;
            impl $crate::bindings::exports::capstan::booking::step::Guest for __CapstanStepExport {
                fn describe() -> $crate::bindings::exports::capstan::booking::step::StepDescriptor {
                    $crate::__private::describe::<$ty>()
                }
                fn run(
                    input: ::std::string::String,
                ) -> ::std::result::Result<::std::string::String, $crate::Error> {
                    $crate::__private::run::<$ty>(&input)
                }
                fn compensate(
                    handover: ::std::string::String,
                ) -> ::std::result::Result<(), $crate::Error> {
                    $crate::__private::compensate::<$ty>(&handover)
                }
            }
            $crate::bindings::__export_step_world!(__CapstanStepExport);
        };
    };
}
