//! A native test harness: runs a [`Step`] without the host, against a booking and fakes, and
//! reports its output, its host calls (as the host sees them) and its logs.
//!
//! ```ignore
//! let report = Harness::new()
//!     .reply("supplier.confirm", json!({"supplier_reference": "SUP-1"}))
//!     .run::<ConfirmSupplier>(json!(null));
//! assert_eq!(report.output.unwrap()["supplierReference"], "SUP-1");
//! assert_eq!(report.calls("supplier.confirm")[0].request["pax"], 2);
//! ```
//!
//! `booking.current` answers the booking view given to [`Harness::booking`] (by default
//! [`sample_booking`]); `time.now` a clock ([`Harness::clock_millis`]); `context.*` calls are
//! recorded. The capabilities (`supplier.*`, `admission.*`, `vouchers.*`) are answered by fakes
//! with the `Ok` value (or fail with an [`Error`]); a call without a fake panics with its name.
//! Requests and answers are the JSON the host sees: parameter and field names as in Rust
//! (`booking_id`, `public_id`, `type_`).

use crate::step::{self, Step};
use crate::{Error, LogLevel};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::cell::RefCell;
use std::collections::HashMap;

type Fake = Box<dyn FnMut(&Value) -> Result<Value, Error>>;

/// 2026-01-01T00:00:00Z, the harness clock's default.
pub const DEFAULT_CLOCK_MILLIS: u64 = 1_767_225_600_000;

/// A booking view as the host would answer `booking.current`: booking `B-1`, two customers
/// (an adult, primary, and a child), no tickets yet.
pub fn sample_booking() -> Value {
    json!({
        "booking_id": "B-1",
        "partner_id": "partner-1",
        "product_id": "1001",
        "product_name": "Colosseum: skip-the-line entry",
        "product_type": "ATTRACTION",
        "variant_id": "2001",
        "variant_name": "Skip-the-line, English",
        "start_date_time": "2026-12-31T09:00:00",
        "customers": [
            {"person_type": "ADULT", "is_primary": true, "input_fields": [["fullName", "Ada Lovelace"]]},
            {"person_type": "CHILD", "is_primary": false, "input_fields": []}
        ],
        "seat_codes": [],
        "amount_minor": 7500,
        "currency_code": "EUR",
        "tickets": []
    })
}

/// One host call as the host would see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub op: String,
    pub request: Value,
    pub response: Value,
}

/// What a run did.
#[derive(Debug)]
pub struct Report {
    /// The step's output JSON, or its error.
    pub output: Result<Value, Error>,
    pub journal: Vec<Entry>,
    pub logs: Vec<(LogLevel, String)>,
}

impl Report {
    /// The calls of one operation (`"supplier.confirm"`), in order.
    pub fn calls(&self, op: &str) -> Vec<&Entry> {
        self.journal.iter().filter(|e| e.op == op).collect()
    }

    /// Every operation called, in order.
    pub fn ops(&self) -> Vec<&str> {
        self.journal.iter().map(|e| e.op.as_str()).collect()
    }
}

/// Builds a run: the booking, fakes and clock, then [`Harness::run`].
pub struct Harness {
    booking: Value,
    fakes: HashMap<String, Fake>,
    clock_millis: u64,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut fakes: Vec<_> = self.fakes.keys().collect();
        fakes.sort();
        f.debug_struct("Harness")
            .field("booking", &self.booking)
            .field("fakes", &fakes)
            .finish_non_exhaustive()
    }
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Self {
        Self {
            booking: sample_booking(),
            fakes: HashMap::new(),
            clock_millis: DEFAULT_CLOCK_MILLIS,
        }
    }

    /// The booking view `booking.current` answers (JSON of the WIT `booking-view`).
    pub fn booking(mut self, view: Value) -> Self {
        self.booking = view;
        self
    }

    /// Answers `op` (`"<interface>.<function>"`) with `f(request)`; the request is a JSON object
    /// keyed by parameter name, `Ok` is the result's `Ok` value.
    pub fn fake(
        mut self,
        op: &str,
        f: impl FnMut(&Value) -> Result<Value, Error> + 'static,
    ) -> Self {
        self.fakes.insert(op.to_owned(), Box::new(f));
        self
    }

    /// Answers `op` with `value` every time.
    pub fn reply(self, op: &str, value: Value) -> Self {
        self.fake(op, move |_| Ok(value.clone()))
    }

    /// Fails `op` with `error` every time.
    pub fn fail(self, op: &str, error: Error) -> Self {
        self.fake(op, move |_| Err(error.clone()))
    }

    pub fn clock_millis(mut self, millis: u64) -> Self {
        self.clock_millis = millis;
        self
    }

    /// Runs `S`'s compensation on `handover` and reports what happened (the output is `null`
    /// on success).
    pub fn compensate<S: Step>(self, handover: Value) -> Report {
        self.activate(|| step::compensate::<S>(&handover.to_string()).map(|()| Value::Null))
    }

    /// Runs `S` on `input` (serialized as the host would) and reports what happened.
    pub fn run<S: Step>(self, input: Value) -> Report {
        self.activate(|| {
            step::run::<S>(&input.to_string())
                .map(|text| serde_json::from_str(&text).unwrap_or(Value::Null))
        })
    }

    fn activate(self, body: impl FnOnce() -> Result<Value, Error>) -> Report {
        ACTIVE.with(|a| {
            *a.borrow_mut() = Some(State {
                harness: self,
                journal: Vec::new(),
                logs: Vec::new(),
            })
        });
        let output = body();
        let state = ACTIVE.with(|a| a.borrow_mut().take());
        let Some(state) = state else {
            panic!("capstan-step-sdk harness: run state vanished (nested Harness::run?)");
        };
        Report {
            output,
            journal: state.journal,
            logs: state.logs,
        }
    }
}

struct State {
    harness: Harness,
    journal: Vec<Entry>,
    logs: Vec<(LogLevel, String)>,
}

thread_local! {
    static ACTIVE: RefCell<Option<State>> = const { RefCell::new(None) };
}

impl State {
    fn answer(&mut self, op: &str, request: &Value) -> Value {
        match op {
            "booking.current" => self.harness.booking.clone(),
            "time.now" => json!(self.harness.clock_millis),
            "context.log" => {
                let level = request
                    .get("level")
                    .and_then(|l| serde_json::from_value(l.clone()).ok())
                    .unwrap_or(LogLevel::Info);
                let message = request
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                self.logs.push((level, message.to_owned()));
                Value::Null
            }
            _ => {
                let Some(fake) = self.harness.fakes.get_mut(op) else {
                    panic!(
                        "capstan-step-sdk harness: no fake for `{op}` (request {request}); add `.fake(\"{op}\", ...)`"
                    );
                };
                serde_json::to_value(fake(request)).unwrap_or(Value::Null)
            }
        }
    }
}

/// Answers one host call made by the SDK natively.
pub(crate) fn call<T: DeserializeOwned>(op: &str, request: Value) -> T {
    let response = ACTIVE.with(|a| {
        let mut active = a.borrow_mut();
        let Some(state) = active.as_mut() else {
            panic!(
                "capstan-step-sdk: `{op}` called outside Harness::run (natively, steps run only in the harness)"
            );
        };
        let response = state.answer(op, &request);
        state.journal.push(Entry {
            op: op.to_owned(),
            request,
            response: response.clone(),
        });
        response
    });
    match serde_json::from_value(response.clone()) {
        Ok(value) => value,
        Err(e) => panic!(
            "capstan-step-sdk harness: the answer to `{op}` does not fit its WIT type: {e}; answer was {response}"
        ),
    }
}
