//! The `bindgen!` of the `workflow` world, and one `Host` impl per WIT interface (the
//! `fulfilment-step` world has its own in `crate::steps`, sharing the platform interfaces).
//!
//! Every import forwards to [`GuestState::call`] with the operation name `<interface>.<function>`
//! and its arguments as a JSON object keyed by parameter name — the same names and shapes the
//! guest SDK's harness uses — so the engine can journal, replay and route any call generically.

use crate::sandbox::GuestState;

wasmtime::component::bindgen!({
    world: "capstan:host/workflow",
    path: "../../wit",
    imports: { default: async | trappable },
    exports: { default: async },
    additional_derives: [serde::Serialize, serde::Deserialize],
});

pub use capstan::infra::{
    cdn, certificates, convergence, dns, functions, maps, registrar, ticketing,
};
pub use capstan::platform::{approvals, context, descriptor, time, types};

/// Forwards each listed function to [`GuestState::call`]. Also used by `crate::steps`.
macro_rules! forward {
    ($iface:literal; $( fn $name:ident($($arg:ident : $ty:ty),*) -> $ret:ty = $op:literal; )*) => {
        $(
            async fn $name(&mut self, $($arg: $ty),*) -> wasmtime::Result<$ret> {
                #[allow(unused_mut)]
                let mut request = ::serde_json::Map::new();
                $( request.insert(stringify!($arg).to_owned(), ::serde_json::to_value(&$arg)?); )*
                self.call(concat!($iface, ".", $op), ::serde_json::Value::Object(request)).await
            }
        )*
    };
}
pub(crate) use forward;

use types::{Error, LogLevel};

impl types::Host for GuestState {}
impl descriptor::Host for GuestState {}

impl context::Host for GuestState {
    forward! { "context";
        fn info() -> context::ExecutionInfo = "info";
        fn stage_begin(name: String) -> () = "stage-begin";
        fn stage_succeeded(name: String, output: Option<String>) -> () = "stage-succeeded";
        fn stage_failed(name: String, error: Error) -> () = "stage-failed";
        fn log(level: LogLevel, message: String) -> () = "log";
        fn emit(event_type: String, payload: String) -> () = "emit";
        fn cancellation_requested() -> bool = "cancellation-requested";
    }
}

impl time::Host for GuestState {
    forward! { "time";
        fn now() -> u64 = "now";
        fn sleep(millis: u64) -> () = "sleep";
    }
}

impl approvals::Host for GuestState {
    forward! { "approvals";
        fn await_approval(name: String, digest: String, payload: String) -> Result<String, Error> = "await-approval";
    }
}

impl dns::Host for GuestState {
    forward! { "dns";
        fn find_zone(domain: String) -> Result<Option<dns::Zone>, Error> = "find-zone";
        fn create_zone(domain: String) -> Result<dns::Zone, Error> = "create-zone";
        fn delete_zone(zone_id: String) -> Result<dns::Zone, Error> = "delete-zone";
        fn list_records(zone_id: String, name: String) -> Result<Vec<dns::RecordSet>, Error> = "list-records";
        fn change_records(zone_id: String, changes: Vec<dns::Change>) -> Result<dns::ChangeReceipt, Error> = "change-records";
        fn get_change(change_id: String) -> Result<dns::ChangeStatus, Error> = "get-change";
    }
}

impl registrar::Host for GuestState {
    forward! { "registrar";
        fn check_domain(name: String) -> Result<registrar::DomainStatus, Error> = "check-domain";
        fn register_domain(name: String, years: u32) -> Result<registrar::Registration, Error> = "register-domain";
        fn get_domain(name: String) -> Result<Option<registrar::DomainDetail>, Error> = "get-domain";
        fn set_name_servers(name: String, name_servers: Vec<String>) -> Result<registrar::NameServersChange, Error> = "set-name-servers";
    }
}

impl certificates::Host for GuestState {
    forward! { "certificates";
        fn find_certificates(domain: String) -> Result<Vec<certificates::Certificate>, Error> = "find-certificates";
        fn request_certificate(domain: String, subject_alternative_names: Vec<String>) -> Result<certificates::Certificate, Error> = "request-certificate";
        fn describe_certificate(arn: String) -> Result<certificates::Certificate, Error> = "describe-certificate";
        fn delete_certificate(arn: String) -> Result<certificates::Certificate, Error> = "delete-certificate";
    }
}

impl cdn::Host for GuestState {
    forward! { "cdn";
        fn find_distribution_by_alias(alias: String) -> Result<Option<cdn::Distribution>, Error> = "find-distribution-by-alias";
        fn get_distribution(id: String) -> Result<cdn::Distribution, Error> = "get-distribution";
        fn create_distribution(spec: cdn::DistributionSpec) -> Result<cdn::Distribution, Error> = "create-distribution";
        fn update_distribution(id: String, spec: cdn::DistributionSpec) -> Result<cdn::DistributionUpdate, Error> = "update-distribution";
        fn delete_distribution(id: String) -> Result<cdn::Distribution, Error> = "delete-distribution";
    }
}

impl maps::Host for GuestState {
    forward! { "maps";
        fn list_keys() -> Result<Vec<maps::ApiKey>, Error> = "list-keys";
        fn add_referrer(key_id: String, referrer: String) -> Result<maps::ReferrerChange, Error> = "add-referrer";
        fn remove_referrer(key_id: String, referrer: String) -> Result<maps::ReferrerChange, Error> = "remove-referrer";
    }
}

impl functions::Host for GuestState {
    forward! { "functions";
        fn publish_version(function_name: String, code_sha256: String) -> Result<functions::FunctionVersion, Error> = "publish-version";
        fn delete_version(function_name: String, version: String) -> Result<functions::FunctionVersion, Error> = "delete-version";
        fn get_alias(function_name: String, alias: String) -> Result<functions::Alias, Error> = "get-alias";
        fn update_alias(function_name: String, alias: String, version: String) -> Result<functions::AliasChange, Error> = "update-alias";
        fn route_alias(function_name: String, alias: String, version: String, routing: Vec<functions::VersionWeight>) -> Result<functions::AliasChange, Error> = "route-alias";
        fn probe(function_name: String, alias: String) -> Result<bool, Error> = "probe";
    }
}

impl ticketing::Host for GuestState {
    forward! { "ticketing";
        fn get_ticket(id: String) -> Result<Option<ticketing::Ticket>, Error> = "get-ticket";
        fn add_comment(id: String, body: String) -> Result<ticketing::CommentReceipt, Error> = "add-comment";
        fn transition_ticket(id: String, status: String) -> Result<ticketing::TransitionReceipt, Error> = "transition-ticket";
    }
}

impl convergence::Host for GuestState {
    forward! { "convergence";
        fn await_converged(condition: convergence::Condition, timeout_ms: u64) -> Result<(), Error> = "await-converged";
    }
}
