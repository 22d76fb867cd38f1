//! The guest side of the host boundary.
//!
//! Every call a step makes to the host goes through this module. On `wasm32` it calls the WIT
//! import; natively it calls [`crate::harness`], with the operation name the host sees
//! (`<interface>.<function>`) and the arguments as a JSON object keyed by parameter name, exactly
//! as `capstan-runtime` forwards them (see its `steps` module for the JSON of each operation).

#[cfg(not(target_arch = "wasm32"))]
use crate::harness;

/// JSON of one argument. Our WIT types always serialize; `Null` only if that ever changed.
#[cfg(not(target_arch = "wasm32"))]
fn arg<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

/// Declares a host call: on wasm the import, natively the harness.
macro_rules! host_call {
    ($import:path, $op:expr, ($($arg:ident),*)) => {{
        #[cfg(target_arch = "wasm32")]
        { $import($($arg),*) }
        #[cfg(not(target_arch = "wasm32"))]
        {
            #[allow(unused_mut)]
            let mut request = serde_json::Map::new();
            $( request.insert(stringify!($arg).to_owned(), arg(&$arg)); )*
            harness::call($op, serde_json::Value::Object(request))
        }
    }};
}

/// Declares a capability: a zero-sized handle whose methods are the interface's functions.
macro_rules! capability {
    (
        $(#[$doc:meta])*
        $handle:ident = $module:ident, $iface:literal {
            $( $(#[$fdoc:meta])* fn $name:ident($($arg:ident : $ty:ty),*) -> $ret:ty = $op:literal; )*
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $handle;

        impl $handle {
            $(
                $(#[$fdoc])*
                pub fn $name(&self, $($arg: $ty),*) -> $ret {
                    host_call!(
                        crate::bindings::capstan::booking::$module::$name,
                        concat!($iface, ".", $op),
                        ($($arg),*)
                    )
                }
            )*
        }
    };
}

/// Platform and booking calls used by [`crate::Ctx`].
pub(crate) mod platform {
    #[cfg(not(target_arch = "wasm32"))]
    use super::{arg, harness};
    use crate::bindings::capstan::booking::types::BookingView;
    use crate::bindings::capstan::platform::types;
    #[cfg(target_arch = "wasm32")]
    use crate::bindings::capstan::{
        booking::booking,
        platform::{context, time},
    };

    pub fn current_booking() -> BookingView {
        host_call!(booking::current, "booking.current", ())
    }
    pub fn log(level: types::LogLevel, message: &str) {
        host_call!(context::log, "context.log", (level, message))
    }
    pub fn now() -> u64 {
        host_call!(time::now, "time.now", ())
    }
}

/// The supplier of the booked product.
pub mod supplier {
    #[cfg(not(target_arch = "wasm32"))]
    use super::{arg, harness};
    use crate::Error;
    pub use crate::bindings::capstan::booking::supplier::Confirmation;

    capability! {
        /// The `capstan:booking/supplier` capability.
        Supplier = supplier, "supplier" {
            /// Confirms the booking with the supplier; `pax` is the number of people.
            fn confirm(booking_id: &str, product_id: &str, variant_id: &str, start_date_time: &str, pax: u32) -> Result<Confirmation, Error> = "confirm";
            /// Cancels an earlier confirmation.
            fn cancel_confirmation(supplier_reference: &str) -> Result<Confirmation, Error> = "cancel-confirmation";
        }
    }
}

/// Admission tickets.
pub mod admission {
    #[cfg(not(target_arch = "wasm32"))]
    use super::{arg, harness};
    use crate::Error;
    pub use crate::bindings::capstan::booking::types::Ticket;

    capability! {
        /// The `capstan:booking/admission` capability.
        Admission = admission, "admission" {
            /// Issues `count` tickets for the booking.
            fn issue_tickets(booking_id: &str, count: u32) -> Result<Vec<Ticket>, Error> = "issue-tickets";
            /// Voids the booking's tickets; answers the voided ones.
            fn void_tickets(booking_id: &str) -> Result<Vec<Ticket>, Error> = "void-tickets";
        }
    }
}

/// Vouchers sent to the customer.
pub mod vouchers {
    #[cfg(not(target_arch = "wasm32"))]
    use super::{arg, harness};
    use crate::Error;
    pub use crate::bindings::capstan::booking::types::Ticket;
    pub use crate::bindings::capstan::booking::vouchers::Voucher;

    capability! {
        /// The `capstan:booking/vouchers` capability.
        Vouchers = vouchers, "vouchers" {
            /// Builds and delivers the booking's voucher with its tickets; answers its URL.
            fn deliver_voucher(booking_id: &str, tickets: &[Ticket]) -> Result<Voucher, Error> = "deliver-voucher";
        }
    }
}
