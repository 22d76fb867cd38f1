//! The one `wit_bindgen::generate!` of the step SDK: the `capstan:host/fulfilment-step` world.
//! Step authors never use this module directly; `export_step!` wires a type to its exports.
#![allow(missing_docs, clippy::all)]

wit_bindgen::generate!({
    world: "capstan:host/fulfilment-step",
    path: "../wit",
    pub_export_macro: true,
    export_macro_name: "__export_step_world",
    default_bindings_module: "capstan_step_sdk::bindings",
    additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
    generate_all,
});
