//! The one `wit_bindgen::generate!` of the SDK. Workflow authors never use this module directly:
//! the rest of the SDK wraps it, and `export_workflow!` wires a type to the world's exports.
//!
//! Only the `workflow` world is generated here: two worlds in one crate would merge their
//! component-type sections into every guest. Fulfilment steps get their own crate
//! (`capstan-step-sdk`).
#![allow(missing_docs, clippy::all)]

/// Bindings of the `capstan:host/workflow` world.
pub mod workflow {
    wit_bindgen::generate!({
        world: "capstan:host/workflow",
        path: "../wit",
        pub_export_macro: true,
        export_macro_name: "__export_workflow_world",
        default_bindings_module: "capstan_sdk::bindings::workflow",
        additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
        generate_all,
    });
}
