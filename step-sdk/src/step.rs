//! What a step is to the SDK: a [`Step`] type with a [`Descriptor`], a `run` function over a
//! [`Ctx`] and a `compensate` that undoes it (nothing by default). The export glue (`describe`,
//! `run`, `compensate`) converts between JSON on the WIT boundary and the step's typed input and
//! output.

use crate::Error;
use crate::bindings::exports::capstan::booking::step as wit;
use crate::host::{self, platform};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

pub use crate::bindings::capstan::booking::types::{BookingView, Customer, Ticket};
pub use crate::bindings::capstan::platform::types::LogLevel;

/// A step's self-description, exported with the component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    name: &'static str,
    version: &'static str,
    description: &'static str,
}

impl Descriptor {
    /// `name` is how pipelines name the step (`[booking.fulfilment] default = ["<name>", ..]`),
    /// kebab-case; `version` its build version (`env!("CARGO_PKG_VERSION")`).
    pub fn new(name: &'static str, version: &'static str) -> Self {
        Self {
            name,
            version,
            description: "",
        }
    }

    pub fn description(mut self, text: &'static str) -> Self {
        self.description = text;
        self
    }

    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// One step of a booking's fulfilment.
///
/// ```ignore
/// struct ConfirmSupplier;
/// impl Step for ConfirmSupplier {
///     type Input = Handover;
///     type Output = Handover;
///     fn describe() -> Descriptor { Descriptor::new("confirm-supplier", "0.1.0") }
///     fn run(ctx: &mut Ctx, input: Handover) -> Result<Handover, Error> {
///         let booking = ctx.booking();
///         let confirmation = ctx.supplier().confirm(/* .. */)?;
///         input.with("supplierReference", confirmation.supplier_reference)
///     }
/// }
/// capstan_step_sdk::export_step!(ConfirmSupplier);
/// ```
pub trait Step {
    /// The previous step's output (`null` for the first step of a pipeline; a struct input then
    /// reads `{}` instead). [`Handover`] takes any object and `null`.
    type Input: DeserializeOwned;
    /// Becomes the next step's input; the last step's output is the fulfilment's result, from
    /// which the host takes `tickets` and `voucherUrl`.
    type Output: Serialize;

    fn describe() -> Descriptor;

    /// Runs the step for the current booking. A host may run a step again after a crash or a
    /// transient error: the host keys its effects per booking and step, so repeat the same calls.
    /// Return capability errors unchanged (`?`): their kind tells the host whether to retry.
    fn run(ctx: &mut Ctx, input: Self::Input) -> Result<Self::Output, Error>;

    /// Undoes what `run` did, when the booking is cancelled after this step ran (or while it
    /// ran). `handover` is what the pipeline had handed on when it stopped: this step's output,
    /// or its input if the step never finished. The host calls it again after a crash and also
    /// for a step whose effects may never have happened, so make it idempotent and treat
    /// "nothing to undo" as success. By default there is nothing to undo.
    fn compensate(_ctx: &mut Ctx, _handover: Handover) -> Result<(), Error> {
        Ok(())
    }
}

/// The step's handle on the host.
#[derive(Debug, Default)]
pub struct Ctx {
    _private: (),
}

impl Ctx {
    /// The booking being fulfilled (read-only; asks the host each time).
    pub fn booking(&self) -> BookingView {
        platform::current_booking()
    }

    /// Milliseconds since the Unix epoch, from the host.
    pub fn now_millis(&self) -> u64 {
        platform::now()
    }

    pub fn log(&self, level: LogLevel, message: &str) {
        platform::log(level, message)
    }

    pub fn supplier(&self) -> host::supplier::Supplier {
        host::supplier::Supplier
    }

    pub fn admission(&self) -> host::admission::Admission {
        host::admission::Admission
    }

    pub fn vouchers(&self) -> host::vouchers::Vouchers {
        host::vouchers::Vouchers
    }
}

/// The JSON object steps hand to each other: each step reads what earlier steps added and
/// returns it with its own fields, so later steps (and the host) see everything. `null` reads as
/// an empty object.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Handover(Map<String, Value>);

impl<'de> Deserialize<'de> for Handover {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self(
            Option::<Map<String, Value>>::deserialize(deserializer)?.unwrap_or_default(),
        ))
    }
}

impl Handover {
    pub fn new() -> Self {
        Self::default()
    }

    /// The field `key` as a `T`; `None` when absent or `null`, a permanent `invalid-input`
    /// error when present with another shape.
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, Error> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => serde_json::from_value(value.clone())
                .map(Some)
                .map_err(|e| {
                    Error::permanent(
                        "invalid-input",
                        format!("the step input's `{key}` is not what this step expects: {e}"),
                    )
                }),
        }
    }

    /// Sets `key` to `value` (replacing an earlier step's value).
    pub fn with(mut self, key: &str, value: impl Serialize) -> Result<Self, Error> {
        let value = serde_json::to_value(value)
            .map_err(|e| Error::permanent("invalid-output", e.to_string()))?;
        self.0.insert(key.to_owned(), value);
        Ok(self)
    }

    pub fn as_map(&self) -> &Map<String, Value> {
        &self.0
    }

    pub fn into_value(self) -> Value {
        Value::Object(self.0)
    }
}

/// A ticket in the JSON steps hand over and the host stores on the booking:
/// `{"publicId": .., "url": .. | null, "type": ..}` (the WIT [`Ticket`] has `public_id`, `type_`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TicketJson {
    pub public_id: String,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(rename = "type")]
    pub type_: String,
}

impl From<Ticket> for TicketJson {
    fn from(t: Ticket) -> Self {
        Self {
            public_id: t.public_id,
            url: t.url,
            type_: t.type_,
        }
    }
}

impl From<TicketJson> for Ticket {
    fn from(t: TicketJson) -> Self {
        Self {
            public_id: t.public_id,
            url: t.url,
            type_: t.type_,
        }
    }
}

/// The exported `describe`.
pub fn describe<S: Step>() -> wit::StepDescriptor {
    let d = S::describe();
    wit::StepDescriptor {
        name: d.name.to_owned(),
        version: d.version.to_owned(),
        description: d.description.to_owned(),
    }
}

/// The exported `compensate`: the handover JSON in.
pub fn compensate<S: Step>(handover: &str) -> Result<(), Error> {
    let handover = serde_json::from_str::<Handover>(handover).map_err(|e| {
        Error::permanent(
            "invalid-input",
            format!("the handover to compensate is not a JSON object: {e}"),
        )
    })?;
    S::compensate(&mut Ctx::default(), handover)
}

/// The exported `run`: JSON in, JSON out.
pub fn run<S: Step>(input: &str) -> Result<String, Error> {
    let parsed = serde_json::from_str::<S::Input>(input).or_else(|e| {
        if input.trim() == "null" {
            serde_json::from_str::<S::Input>("{}").map_err(|_| e)
        } else {
            Err(e)
        }
    });
    let input = parsed.map_err(|e| {
        Error::permanent(
            "invalid-input",
            format!("the step input does not fit this step: {e}"),
        )
    })?;
    let output = S::run(&mut Ctx::default(), input)?;
    serde_json::to_string(&output).map_err(|e| Error::permanent("invalid-output", e.to_string()))
}
