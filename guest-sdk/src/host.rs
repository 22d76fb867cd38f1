//! The guest side of the host boundary.
//!
//! Every call a guest makes to the host goes through this module. On `wasm32` it calls the WIT
//! import; natively it calls [`crate::harness`], with the operation name the host journals
//! (`<interface>.<function>`) and the arguments as a JSON object keyed by parameter name. The host
//! uses the same names and shapes, so a journal asserted in a harness test reads like the host's.

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
                        crate::bindings::workflow::capstan::infra::$module::$name,
                        concat!($iface, ".", $op),
                        ($($arg),*)
                    )
                }
            )*
        }
    };
}

/// Platform calls used by [`crate::Ctx`].
pub(crate) mod platform {
    #[cfg(not(target_arch = "wasm32"))]
    use super::{arg, harness};
    use crate::Error;
    // `approvals` and `time` appear only in the calls a guest makes (native builds answer them
    // from the test harness).
    #[cfg(target_arch = "wasm32")]
    use crate::bindings::workflow::capstan::platform::{approvals, time};
    use crate::bindings::workflow::capstan::platform::{context, types};

    pub fn info() -> context::ExecutionInfo {
        host_call!(context::info, "context.info", ())
    }
    pub fn stage_begin(name: &str) {
        host_call!(context::stage_begin, "context.stage-begin", (name))
    }
    pub fn stage_succeeded(name: &str, output: Option<&str>) {
        host_call!(
            context::stage_succeeded,
            "context.stage-succeeded",
            (name, output)
        )
    }
    pub fn stage_failed(name: &str, error: &Error) {
        host_call!(context::stage_failed, "context.stage-failed", (name, error))
    }
    pub fn log(level: types::LogLevel, message: &str) {
        host_call!(context::log, "context.log", (level, message))
    }
    pub fn emit(event_type: &str, payload: &str) {
        host_call!(context::emit, "context.emit", (event_type, payload))
    }
    pub fn cancellation_requested() -> bool {
        host_call!(
            context::cancellation_requested,
            "context.cancellation-requested",
            ()
        )
    }
    pub fn now() -> u64 {
        host_call!(time::now, "time.now", ())
    }
    pub fn sleep(millis: u64) {
        host_call!(time::sleep, "time.sleep", (millis))
    }
    pub fn await_approval(name: &str, digest: &str, payload: &str) -> Result<String, Error> {
        host_call!(
            approvals::await_approval,
            "approvals.await-approval",
            (name, digest, payload)
        )
    }
}

/// DNS zones and record sets.
pub mod dns {
    #[cfg(not(target_arch = "wasm32"))]
    use super::{arg, harness};
    use crate::Error;
    pub use crate::bindings::workflow::capstan::infra::dns::{
        AliasTarget, Change, ChangeReceipt, ChangeStatus, RecordSet, RecordType, Zone,
    };

    capability! {
        /// The `capstan:infra/dns` capability.
        Dns = dns, "dns" {
            /// The hosted zone serving `domain` (longest matching suffix), if any.
            fn find_zone(domain: &str) -> Result<Option<Zone>, Error> = "find-zone";
            fn create_zone(domain: &str) -> Result<Zone, Error> = "create-zone";
            fn delete_zone(zone_id: &str) -> Result<Zone, Error> = "delete-zone";
            fn list_records(zone_id: &str, name: &str) -> Result<Vec<RecordSet>, Error> = "list-records";
            /// Applies `changes` atomically; the receipt carries the record sets it replaced.
            fn change_records(zone_id: &str, changes: &[Change]) -> Result<ChangeReceipt, Error> = "change-records";
            fn get_change(change_id: &str) -> Result<ChangeStatus, Error> = "get-change";
        }
    }
}

/// Domain registration.
pub mod registrar {
    #[cfg(not(target_arch = "wasm32"))]
    use super::{arg, harness};
    use crate::Error;
    pub use crate::bindings::workflow::capstan::infra::registrar::{
        DomainDetail, DomainStatus, NameServersChange, Registration,
    };

    capability! {
        /// The `capstan:infra/registrar` capability.
        Registrar = registrar, "registrar" {
            fn check_domain(name: &str) -> Result<DomainStatus, Error> = "check-domain";
            fn register_domain(name: &str, years: u32) -> Result<Registration, Error> = "register-domain";
            fn get_domain(name: &str) -> Result<Option<DomainDetail>, Error> = "get-domain";
            fn set_name_servers(name: &str, name_servers: &[String]) -> Result<NameServersChange, Error> = "set-name-servers";
        }
    }
}

/// TLS certificates validated through DNS.
pub mod certificates {
    #[cfg(not(target_arch = "wasm32"))]
    use super::{arg, harness};
    use crate::Error;
    pub use crate::bindings::workflow::capstan::infra::certificates::{
        Certificate, CertificateStatus,
    };

    capability! {
        /// The `capstan:infra/certificates` capability.
        Certificates = certificates, "certificates" {
            fn find_certificates(domain: &str) -> Result<Vec<Certificate>, Error> = "find-certificates";
            fn request_certificate(domain: &str, subject_alternative_names: &[String]) -> Result<Certificate, Error> = "request-certificate";
            fn describe_certificate(arn: &str) -> Result<Certificate, Error> = "describe-certificate";
            fn delete_certificate(arn: &str) -> Result<Certificate, Error> = "delete-certificate";
        }
    }
}

/// CDN distributions.
pub mod cdn {
    #[cfg(not(target_arch = "wasm32"))]
    use super::{arg, harness};
    use crate::Error;
    pub use crate::bindings::workflow::capstan::infra::cdn::{
        Distribution, DistributionSpec, DistributionStatus, DistributionUpdate,
    };

    capability! {
        /// The `capstan:infra/cdn` capability.
        Cdn = cdn, "cdn" {
            fn find_distribution_by_alias(alias: &str) -> Result<Option<Distribution>, Error> = "find-distribution-by-alias";
            fn get_distribution(id: &str) -> Result<Distribution, Error> = "get-distribution";
            fn create_distribution(spec: &DistributionSpec) -> Result<Distribution, Error> = "create-distribution";
            fn update_distribution(id: &str, spec: &DistributionSpec) -> Result<DistributionUpdate, Error> = "update-distribution";
            fn delete_distribution(id: &str) -> Result<Distribution, Error> = "delete-distribution";
        }
    }
}

/// Maps API keys and their referrer whitelists.
pub mod maps {
    #[cfg(not(target_arch = "wasm32"))]
    use super::{arg, harness};
    use crate::Error;
    pub use crate::bindings::workflow::capstan::infra::maps::{ApiKey, ReferrerChange};

    capability! {
        /// The `capstan:infra/maps` capability.
        Maps = maps, "maps" {
            fn list_keys() -> Result<Vec<ApiKey>, Error> = "list-keys";
            /// Fails with code `capacity-exhausted` when the key is full.
            fn add_referrer(key_id: &str, referrer: &str) -> Result<ReferrerChange, Error> = "add-referrer";
            fn remove_referrer(key_id: &str, referrer: &str) -> Result<ReferrerChange, Error> = "remove-referrer";
        }
    }
}

/// Serverless function versions and aliases.
pub mod functions {
    #[cfg(not(target_arch = "wasm32"))]
    use super::{arg, harness};
    use crate::Error;
    pub use crate::bindings::workflow::capstan::infra::functions::{
        Alias, AliasChange, FunctionVersion, VersionWeight,
    };

    capability! {
        /// The `capstan:infra/functions` capability.
        Functions = functions, "functions" {
            fn publish_version(function_name: &str, code_sha256: &str) -> Result<FunctionVersion, Error> = "publish-version";
            fn delete_version(function_name: &str, version: &str) -> Result<FunctionVersion, Error> = "delete-version";
            fn get_alias(function_name: &str, alias: &str) -> Result<Alias, Error> = "get-alias";
            fn update_alias(function_name: &str, alias: &str, version: &str) -> Result<AliasChange, Error> = "update-alias";
            fn route_alias(function_name: &str, alias: &str, version: &str, routing: &[VersionWeight]) -> Result<AliasChange, Error> = "route-alias";
            fn probe(function_name: &str, alias: &str) -> Result<bool, Error> = "probe";
        }
    }
}

/// Tickets in the change-management system.
pub mod ticketing {
    #[cfg(not(target_arch = "wasm32"))]
    use super::{arg, harness};
    use crate::Error;
    pub use crate::bindings::workflow::capstan::infra::ticketing::{
        CommentReceipt, Ticket, TransitionReceipt,
    };

    capability! {
        /// The `capstan:infra/ticketing` capability.
        Ticketing = ticketing, "ticketing" {
            fn get_ticket(id: &str) -> Result<Option<Ticket>, Error> = "get-ticket";
            fn add_comment(id: &str, body: &str) -> Result<CommentReceipt, Error> = "add-comment";
            fn transition_ticket(id: &str, status: &str) -> Result<TransitionReceipt, Error> = "transition-ticket";
        }
    }
}

/// Waiting for a provider to converge, without holding the instance.
pub mod convergence {
    #[cfg(not(target_arch = "wasm32"))]
    use super::{arg, harness};
    use crate::Error;
    pub use crate::bindings::workflow::capstan::infra::convergence::Condition;

    capability! {
        /// The `capstan:infra/convergence` capability.
        Convergence = convergence, "convergence" {
            /// Ok once `condition` holds; a transient `timeout` error if it did not in time.
            fn await_converged(condition: &Condition, timeout_ms: u64) -> Result<(), Error> = "await-converged";
        }
    }
}
