//! The store state of one activation and the walls around it: memory cap, fuel (CPU budget),
//! and a WASI context with no files, sockets, environment, ambient clock or ambient randomness.

use crate::limits::{GuestClock, GuestLimits, Limit, Usage};
use async_trait::async_trait;
use capstan_core::store::JsonText;
use serde::de::DeserializeOwned;
use serde_json::Value;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// Answers a guest's host calls. The engine implements it (journal, replay, providers); tests
/// implement it with fakes. `op` is `<interface>.<function>`, `request` a JSON object keyed by
/// parameter name (with its text, see [`Request`]), and the answer must be the JSON of the WIT
/// return type (`{"Ok": ..}` / `{"Err": ..}` for results), as a value or as text ([`Answer`]).
#[async_trait]
pub trait HostCalls: Send {
    async fn call(&mut self, op: &'static str, request: Request) -> Result<Answer, Interrupt>;
}

/// A boxed host is a host, so APIs taking `impl HostCalls` also take a `Box<dyn HostCalls>`.
#[async_trait]
impl<H: HostCalls + ?Sized> HostCalls for Box<H> {
    async fn call(&mut self, op: &'static str, request: Request) -> Result<Answer, Interrupt> {
        (**self).call(op, request).await
    }
}

/// A host's answer to a call: the JSON of the WIT return type, built as a value by a host that
/// computes it, or as the text a journal recorded for a call it replays. Text is decoded
/// straight into the WIT type, without a `Value` tree in between: a replayed activation answers
/// every call from text.
#[derive(Debug, Clone)]
pub enum Answer {
    Value(Value),
    Text(JsonText),
}

impl From<Value> for Answer {
    fn from(value: Value) -> Self {
        Self::Value(value)
    }
}

impl From<JsonText> for Answer {
    fn from(text: JsonText) -> Self {
        Self::Text(text)
    }
}

impl Answer {
    /// The answer as a value (text is parsed).
    pub fn into_value(self) -> Value {
        match self {
            Self::Value(value) => value,
            Self::Text(text) => text.value(),
        }
    }

    fn decode<T: DeserializeOwned>(&self) -> serde_json::Result<T> {
        match self {
            Self::Value(value) => T::deserialize(value),
            Self::Text(text) => serde_json::from_str(text.as_str()),
        }
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Value(value) => value.fmt(f),
            Self::Text(text) => f.write_str(text.as_str()),
        }
    }
}

/// A host call's arguments: the JSON object keyed by parameter name, and its text. The text is
/// written once, where the call comes in: its length is what `call_bytes` limits, the journal
/// keeps it as it is, and a replay compares it with the recorded one.
#[derive(Debug, Clone)]
pub struct Request {
    pub value: Value,
    pub text: JsonText,
}

impl Request {
    pub fn new(value: Value) -> Self {
        let text = JsonText::new(&value);
        Self { value, text }
    }
}

impl std::ops::Deref for Request {
    type Target = Value;

    fn deref(&self) -> &Value {
        &self.value
    }
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text.as_str())
    }
}

/// Why a host call stops the guest instead of answering it. The activation unwinds (a trap) and
/// the engine learns why from [`crate::Outcome`].
#[derive(Debug, thiserror::Error)]
pub enum Interrupt {
    /// The run must wait (a timer, an approval, a condition): persist, drop the instance, replay later.
    #[error("suspended: {0}")]
    Suspend(String),
    /// The run was canceled.
    #[error("canceled")]
    Cancel,
    /// The call does not match the journal at its sequence number.
    #[error("nondeterministic replay: {0}")]
    Nondeterminism(String),
    /// The host could not answer (storage down, say); the run should be retried later.
    #[error("host failure: {0}")]
    Host(String),
}

/// A sandbox wall the guest ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitExceeded {
    #[error(
        "wall-clock deadline of {limit_ms} ms per activation exceeded (`runtime.limits.deadline_ms`): the guest ran or blocked too long; wait with the platform's durable `time.sleep`, not the WASI clock"
    )]
    Deadline { limit_ms: u64 },
    #[error("limit `{}` exceeded: {actual} {} (at most {allowed})", .limit.key(), .limit.measures())]
    Exceeded {
        limit: Limit,
        allowed: u64,
        actual: u64,
    },
    #[error("memory limit of {limit_bytes} bytes exceeded (the guest asked for {requested_bytes})")]
    Memory {
        limit_bytes: usize,
        requested_bytes: usize,
    },
    #[error("CPU budget of {fuel} fuel units exhausted (the guest ran too long or looped)")]
    Cpu { fuel: u64 },
    #[error("wasm stack limit of {limit_bytes} bytes exceeded (unbounded recursion?)")]
    Stack { limit_bytes: usize },
}

/// Caps linear memory growth. Returns an error (a trap naming the limit) rather than a failed
/// `memory.grow`, so the failure says which wall was hit instead of a guest-side abort.
#[derive(Debug)]
pub(crate) struct MemoryCap {
    pub limit_bytes: usize,
}

impl wasmtime::ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit_bytes {
            return Err(LimitExceeded::Memory {
                limit_bytes: self.limit_bytes,
                requested_bytes: desired,
            }
            .into());
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// Store data of one activation.
pub struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) memory: MemoryCap,
    host: Box<dyn HostCalls>,
    /// The interrupt that unwound the guest, kept so the activation can report it.
    pub(crate) interrupt: Option<Interrupt>,
    usage: Usage,
    pub(crate) clock: GuestClock,
}

impl GuestState {
    pub(crate) fn new(
        host: Box<dyn HostCalls>,
        seed: u64,
        memory_limit_bytes: usize,
        limits: GuestLimits,
    ) -> Self {
        Self {
            wasi: deterministic_wasi(seed),
            table: ResourceTable::new(),
            memory: MemoryCap {
                limit_bytes: memory_limit_bytes,
            },
            host,
            interrupt: None,
            usage: Usage::new(limits),
            clock: GuestClock::start(),
        }
    }

    /// One host call: checked against the limits, forwarded to [`HostCalls`], its answer decoded
    /// into the WIT return type. A call over a limit traps before the host sees it.
    pub(crate) async fn call<T: DeserializeOwned>(
        &mut self,
        op: &'static str,
        request: Value,
    ) -> wasmtime::Result<T> {
        let request = Request::new(request);
        self.usage.admit(op, &request)?;
        self.clock.enter_host();
        let answer = self.host.call(op, request).await;
        self.clock.leave_host();
        match answer {
            // Decoded from a borrow: the answer is kept for the error's message only.
            Ok(answer) => answer.decode().map_err(|e| {
                wasmtime::Error::msg(format!("the host's answer to `{op}` does not fit its WIT type: {e}; answer was {answer}"))
            }),
            Err(interrupt) => {
                let message = interrupt.to_string();
                self.interrupt = Some(interrupt);
                Err(wasmtime::Error::msg(message))
            }
        }
    }
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// WASI for guests: Rust's std imports `wasi:cli` and friends, so WASI is linked, but with nothing
/// behind it. No preopened directories, no environment or arguments, no network, and clocks and
/// random numbers that are a pure function of `seed` (derived from the run id), so a replay sees
/// the same values. Real time and randomness come from `capstan:platform` and are journaled.
fn deterministic_wasi(seed: u64) -> WasiCtx {
    use rand_core::SeedableRng;
    let mut builder = WasiCtx::builder();
    builder
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .wall_clock(FrozenWallClock)
        .monotonic_clock(FrozenMonotonicClock)
        .secure_random(rand_pcg::Pcg64Mcg::seed_from_u64(seed))
        .insecure_random(rand_pcg::Pcg64Mcg::seed_from_u64(
            seed ^ 0x9e37_79b9_7f4a_7c15,
        ))
        .insecure_random_seed(u128::from(seed));
    builder.build()
}

/// 2000-01-01T00:00:00Z: any guest reading the ambient clock gets the same, obviously-fake time.
struct FrozenWallClock;

impl wasmtime_wasi::HostWallClock for FrozenWallClock {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }
    fn now(&self) -> std::time::Duration {
        std::time::Duration::from_secs(946_684_800)
    }
}

struct FrozenMonotonicClock;

impl wasmtime_wasi::HostMonotonicClock for FrozenMonotonicClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}
