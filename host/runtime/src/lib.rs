//! # capstan-runtime
//!
//! The one place wasmtime lives. It owns the [`Engine`](wasmtime::Engine), compiles components
//! once (content-addressed by sha256, artifacts cached on disk), checks each component's imports
//! against the operator's capability grants, and runs activations inside the sandbox: a memory cap,
//! a CPU budget (fuel), a stack limit, a wall-clock deadline (epoch interruption), bounds on
//! what a guest hands the host, and WASI with nothing behind it.
//!
//! It knows nothing of journals, databases or HTTP. Every host call a guest makes is handed to a
//! [`HostCalls`] implementation as `(operation, JSON request)` and answered with the JSON of its
//! WIT return type ([`Answer`]: a value, or a journal's recorded text); the engine crate supplies
//! the one that journals and replays.
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
pub use sandbox::{Answer, GuestState, HostCalls, Interrupt, LimitExceeded, Request};
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

/// Advances `engine`'s epoch every [`EPOCH_TICK`] while a store is alive, until the engine is
/// dropped. An epoch matters only to running wasm, so with no store alive the ticker sleeps
/// ([`Alive`]) instead of waking a hundred times a second on an idle node; a store's deadline
/// counts from the tick after it was created either way.
fn tick_epochs(engine: &Engine, alive: Arc<Alive>) -> anyhow::Result<()> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("capstan-epoch".to_owned())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
                // Woken at once by the next store; now and then anyway, to notice a dropped
                // engine and end.
                alive.wait_for_a_store(std::time::Duration::from_secs(1));
            }
        })?;
    Ok(())
}

/// How many stores are alive, for the epoch ticker.
#[derive(Debug, Default)]
pub(crate) struct Alive {
    stores: std::sync::Mutex<usize>,
    first: std::sync::Condvar,
}

impl Alive {
    fn count(&self) -> std::sync::MutexGuard<'_, usize> {
        self.stores
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One more store, until the guard drops.
    fn store(self: &Arc<Self>) -> StoreAlive {
        let mut n = self.count();
        *n += 1;
        if *n == 1 {
            self.first.notify_all();
        }
        StoreAlive(self.clone())
    }

    /// Returns once a store is alive, or after `at_most`.
    fn wait_for_a_store(&self, at_most: std::time::Duration) {
        let n = self.count();
        let _ = self
            .first
            .wait_timeout_while(n, at_most, |n| *n == 0)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }
}

/// A store counted in [`Alive`] while this lives.
#[derive(Debug)]
pub(crate) struct StoreAlive(Arc<Alive>);

impl Drop for StoreAlive {
    fn drop(&mut self) {
        *self.0.count() -= 1;
    }
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

/// The pool's slots: one per activation alive at once ([`RuntimeConfig::instance_pool`]), and
/// the count of stores alive that keeps the epoch ticker going.
#[derive(Debug, Clone)]
pub(crate) struct Slots {
    pool: Option<Arc<tokio::sync::Semaphore>>,
    alive: Arc<Alive>,
}

/// A slot held for the life of one store (no permit without a pool).
#[derive(Debug)]
pub(crate) struct Slot {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    _alive: StoreAlive,
}

impl Slots {
    fn new(pool: u32, alive: Arc<Alive>) -> Self {
        Self {
            pool: (pool > 0).then(|| Arc::new(tokio::sync::Semaphore::new(pool as usize))),
            alive,
        }
    }

    /// Waits for a free slot. The semaphore is never closed, so this only waits.
    pub(crate) async fn take(&self) -> Slot {
        let permit = match &self.pool {
            Some(semaphore) => semaphore.clone().acquire_owned().await.ok(),
            None => None,
        };
        Slot {
            _permit: permit,
            _alive: self.alive.store(),
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
        let alive = Arc::new(Alive::default());
        tick_epochs(&engine, alive.clone())?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        bindings::Workflow::add_to_linker::<GuestState, wasmtime::component::HasSelf<GuestState>>(
            &mut linker,
            |s| s,
        )?;
        let step_linker = steps::linker(&engine)?;
        let cache = cache::ComponentCache::new(&engine, config.cache_dir.clone())?;
        let slots = Slots::new(config.instance_pool, alive);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_epoch_ticker_waits_only_while_no_store_is_alive() {
        let alive = Arc::new(Alive::default());
        let first = alive.store();
        let second = alive.store();
        assert_eq!(*alive.count(), 2);
        // A store is alive: no wait at all (an hour would hang the test).
        alive.wait_for_a_store(std::time::Duration::from_secs(3_600));
        drop(first);
        drop(second);
        assert_eq!(*alive.count(), 0);
        // None: the ticker sleeps until one is created on another thread.
        let waiter = {
            let alive = alive.clone();
            std::thread::spawn(move || {
                alive.wait_for_a_store(std::time::Duration::from_secs(3_600))
            })
        };
        let store = alive.store();
        waiter.join().unwrap();
        drop(store);
    }
}
