//! # capstan-runtime
//!
//! The one place wasmtime lives. It owns the [`Engine`](wasmtime::Engine), compiles components
//! once (content-addressed by sha256, artifacts cached on disk), checks each component's imports
//! against the operator's capability grants, and runs activations inside the sandbox: a memory cap,
//! a CPU budget (fuel), a stack limit, a wall-clock deadline (epoch interruption), bounds on
//! what a guest hands the host, and WASI with nothing behind it.
//!
//! It knows nothing of journals, databases or HTTP. Every host call a guest makes is handed to a
//! [`HostCalls`] implementation as `(operation, JSON request)`; the engine crate supplies the one
//! that journals and replays.
//!
//! # Layout
//! - `bindings` — the `bindgen!` of the `workflow` world and one `Host` impl per interface.
//! - `sandbox` — [`GuestState`] (store data), memory cap, the deterministic WASI context,
//!   [`HostCalls`].
//! - `limits` — [`GuestLimits`]: the deadline and the bounds on host-call arguments.
//! - `cache` — content-addressed compilation with an on-disk artifact cache.
//! - `loader` — loading a workflows directory: digest, describe, grant check, [`LoadReport`].
//! - [`steps`] — the `fulfilment-step` world: its `bindgen!`, [`Runtime::load_step_dir`],
//!   [`LoadedStep::run`], and the JSON of each step import.

mod bindings;
mod cache;
mod limits;
mod loader;
mod sandbox;
pub mod steps;

pub use cache::CompileStats;
pub use limits::{GuestLimits, Limit};
pub use loader::{LoadError, LoadFailure, LoadReport, LoadedWorkflow};
pub use sandbox::{GuestState, HostCalls, Interrupt, LimitExceeded};
pub use steps::{LoadedStep, StepFailure, StepLoadReport};

use std::path::PathBuf;
use std::sync::Arc;
use wasmtime::component::Linker;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// Pool room per component instance: a component is several core modules (the guest, the WASI
/// adapter, shims), each with its own instance and maybe a memory and a table. Generous, since
/// running out of one of them fails an instantiation even when a slot is free.
const CORE_INSTANCES_PER_COMPONENT: u32 = 32;
const MEMORIES_PER_COMPONENT: u32 = 4;
const TABLES_PER_COMPONENT: u32 = 8;

/// The most of a slot's memory (and of each table) left resident, zeroed, between activations
/// where only written pages are reset (see [`Runtime::new`]). The workflows here write far less
/// than this per activation (with it, `madvise` left the profile), so a slot keeps what its last
/// activation wrote; a guest that writes more has the rest `madvise`d away. Resident
/// memory is bounded by this times the slots in use (`runtime.instance_pool`).
const KEEP_RESIDENT: usize = 4 << 20;

/// Sandbox limits and caching, per [`Runtime`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Largest linear memory an activation may grow to.
    pub memory_limit_bytes: usize,
    /// CPU budget of one activation, in fuel units (about one per wasm instruction).
    pub fuel_per_activation: u64,
    /// Largest wasm stack an activation may use.
    pub max_wasm_stack_bytes: usize,
    /// Where compiled artifacts are cached; `None` compiles on every load.
    pub cache_dir: Option<PathBuf>,
    /// Activations that run at once at most, each in a slot of wasmtime's pooling allocator
    /// (memory, tables and stack reserved once and reused); further activations wait for a slot.
    /// 0 allocates every instance on demand (an `mmap`/`munmap` pair and page faults each).
    pub instance_pool: u32,
    /// The deadline and the bounds on what a guest hands the host.
    pub limits: GuestLimits,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            memory_limit_bytes: 64 << 20,
            fuel_per_activation: 2_000_000_000,
            max_wasm_stack_bytes: 1 << 20,
            cache_dir: None,
            instance_pool: 128,
            limits: GuestLimits::default(),
        }
    }
}

/// How often running wasm checks its activation's deadline (and yields to the executor).
const EPOCH_TICK: std::time::Duration = std::time::Duration::from_millis(10);

/// Advances `engine`'s epoch every [`EPOCH_TICK`] until the engine is dropped.
fn tick_epochs(engine: &Engine) -> anyhow::Result<()> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("capstan-epoch".to_owned())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })?;
    Ok(())
}

/// The result of one activation (one instantiation and `run` call) of a workflow.
#[derive(Debug)]
pub enum Outcome {
    /// The guest returned: its output JSON, or its own error.
    Completed(Result<String, capstan_core::CapabilityError>),
    /// A host call stopped the guest (suspend, cancel, nondeterminism, host failure).
    Interrupted(Interrupt),
    /// The guest ran into a sandbox wall.
    Limit(LimitExceeded),
    /// The guest trapped (a panic, `unreachable`, a malformed call); the message says where.
    Trapped(String),
}

/// The wasmtime engine, the linker and the sandbox limits, shared by every activation.
pub struct Runtime {
    engine: Engine,
    linker: Linker<GuestState>,
    /// The linker of `fulfilment-step` components (see [`steps`]).
    step_linker: Linker<GuestState>,
    config: RuntimeConfig,
    cache: cache::ComponentCache,
    slots: Slots,
}

/// The pool's slots: one per activation alive at once ([`RuntimeConfig::instance_pool`]).
#[derive(Debug, Clone)]
pub(crate) struct Slots(Option<Arc<tokio::sync::Semaphore>>);

/// A slot held for the life of one store (nothing without a pool).
pub(crate) type Slot = Option<tokio::sync::OwnedSemaphorePermit>;

impl Slots {
    fn new(pool: u32) -> Self {
        Self((pool > 0).then(|| Arc::new(tokio::sync::Semaphore::new(pool as usize))))
    }

    /// Waits for a free slot. The semaphore is never closed, so this only waits.
    pub(crate) async fn take(&self) -> Slot {
        match &self.0 {
            Some(semaphore) => semaphore.clone().acquire_owned().await.ok(),
            None => None,
        }
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    pub fn new(config: RuntimeConfig) -> anyhow::Result<Self> {
        let mut wasm = Config::new();
        wasm.wasm_component_model(true)
            .consume_fuel(true)
            .epoch_interruption(true)
            .max_wasm_stack(config.max_wasm_stack_bytes)
            .async_stack_size(config.max_wasm_stack_bytes + (1 << 20))
            .cranelift_opt_level(wasmtime::OptLevel::Speed);
        let n = config.instance_pool;
        if n > 0 {
            let mut pool = PoolingAllocationConfig::new();
            // A slot is reset, when its instance is dropped, by zeroing what the activation wrote.
            // By default wasmtime `madvise`s the whole memory away: on a machine with more than one
            // core the kernel then flushes the other cores' TLBs (an inter-processor interrupt,
            // costly under a hypervisor), and the next activation in the slot faults in again every
            // page it touches — about a tenth of the server's CPU at 32 executions in flight
            // (BENCHMARKS.md, "Where the executions waited"). Where the kernel can say which pages
            // were written (`PAGEMAP_SCAN`, Linux ≥ 6.7), only those are zeroed with `memset` and
            // they stay resident (at most `KEEP_RESIDENT` per memory or table; above that,
            // `madvise`). Elsewhere, `memset` would have to zero the whole first `KEEP_RESIDENT`
            // bytes, which measured dearer than `madvise` for 64 MiB memories: nothing is kept
            // resident there.
            if PoolingAllocationConfig::is_pagemap_scan_available() {
                pool.pagemap_scan(wasmtime::Enabled::Yes)
                    .linear_memory_keep_resident(KEEP_RESIDENT)
                    .table_keep_resident(KEEP_RESIDENT);
            }
            pool.total_component_instances(n)
                .total_core_instances(n.saturating_mul(CORE_INSTANCES_PER_COMPONENT))
                .total_memories(n.saturating_mul(MEMORIES_PER_COMPONENT))
                .total_tables(n.saturating_mul(TABLES_PER_COMPONENT))
                .total_stacks(n)
                .max_memory_size(config.memory_limit_bytes);
            wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        }
        let engine = Engine::new(&wasm)?;
        tick_epochs(&engine)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        bindings::Workflow::add_to_linker::<GuestState, wasmtime::component::HasSelf<GuestState>>(
            &mut linker,
            |s| s,
        )?;
        let step_linker = steps::linker(&engine)?;
        let cache = cache::ComponentCache::new(&engine, config.cache_dir.clone())?;
        let slots = Slots::new(config.instance_pool);
        Ok(Self {
            engine,
            linker,
            step_linker,
            config,
            cache,
            slots,
        })
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }
}
