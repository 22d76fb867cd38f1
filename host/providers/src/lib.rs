//! # capstan-providers
//!
//! What answers a workflow's capability calls. Every provider implements the one seam of
//! `capstan-core`, [`Providers`] (an operation name and its JSON request); [`ProviderSet`] routes
//! each capability to the provider configured for it: the embedded [`SimulatedCloud`] by default,
//! a real adapter (`capstan-adapters`: RFC 2136 DNS, ACME, …) where an operator configures one.
//!
//! The simulated cloud keeps its state in the engine's database (it survives restarts), behaves
//! like the real services where it matters to workflows (docs/simulator.md), deduplicates every
//! side effect by the engine's idempotency token, and injects configured faults.
//!
//! # Layout
//! - `lib.rs` — [`ProviderSet`], the per-node router, and its readiness report.
//! - `sim/` — the simulated cloud: `mod.rs` (calls, seeds, faults), `dns.rs`, `services.rs`
//!   (the other capabilities), `write_behind.rs` (SQLite's in-memory DNS path), `transaction.rs`.

mod sim;

pub use sim::{FaultKind, FaultRule, Seed, SeedError, SimulatedCloud, SimulationSettings, glob};

use async_trait::async_trait;
use capstan_core::{Capability, CapabilityError, Providers};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The capabilities a provider can serve (the platform and booking ones are the host's own).
pub const INFRASTRUCTURE: [Capability; 7] = [
    Capability::Dns,
    Capability::Registrar,
    Capability::Certificates,
    Capability::Cdn,
    Capability::Maps,
    Capability::Functions,
    Capability::Ticketing,
];

/// The providers of a node, one per capability.
#[derive(Clone, Default)]
pub struct ProviderSet {
    routes: BTreeMap<Capability, Arc<dyn Providers>>,
}

impl std::fmt::Debug for ProviderSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.routes.iter().map(|(c, p)| (c.as_str(), p.kind())))
            .finish()
    }
}

/// One capability's provider as `/readyz` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderReadiness {
    pub capability: Capability,
    pub kind: &'static str,
    /// `ok`, or `unreachable: <why>`.
    pub status: String,
}

impl ProviderSet {
    /// Every infrastructure capability answered by `provider`.
    pub fn all(provider: Arc<dyn Providers>) -> Self {
        let mut set = Self::default();
        for capability in INFRASTRUCTURE {
            set = set.with(capability, provider.clone());
        }
        set
    }

    /// Routes `capability` to `provider` (replacing the previous one).
    pub fn with(mut self, capability: Capability, provider: Arc<dyn Providers>) -> Self {
        self.routes.insert(capability, provider);
        self
    }

    /// The implementation serving `capability` (`simulated`, `rfc2136`, …), if any.
    pub fn kind_of(&self, capability: Capability) -> Option<&'static str> {
        self.routes.get(&capability).map(|p| p.kind())
    }

    /// Asks every provider that is not the simulated cloud whether its service answers, all at
    /// once, each within `timeout`.
    pub async fn readiness(&self, timeout: std::time::Duration) -> Vec<ProviderReadiness> {
        let checks = self
            .routes
            .iter()
            .filter(|(_, p)| p.kind() != "simulated")
            .map(|(capability, provider)| async move {
                let status = match tokio::time::timeout(timeout, provider.reachable()).await {
                    Ok(Ok(())) => "ok".to_owned(),
                    Ok(Err(e)) => format!("unreachable: {e}"),
                    Err(_) => format!("unreachable: no answer within {} ms", timeout.as_millis()),
                };
                ProviderReadiness {
                    capability: *capability,
                    kind: provider.kind(),
                    status,
                }
            });
        futures_util::future::join_all(checks).await
    }

    fn route(&self, op: &str) -> Result<&Arc<dyn Providers>, CapabilityError> {
        Capability::of_op(op)
            .and_then(|c| self.routes.get(&c))
            .ok_or_else(|| {
                CapabilityError::permanent(
                    "not-configured",
                    format!("no provider is configured for {op}"),
                )
            })
    }
}

#[async_trait]
impl Providers for ProviderSet {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Result<Value, CapabilityError> {
        self.route(op)?.call(op, request, token).await
    }

    async fn call_first(
        &self,
        op: &str,
        request: &Value,
        token: &str,
    ) -> Result<Value, CapabilityError> {
        self.route(op)?.call_first(op, request, token).await
    }

    async fn call_behind(
        &self,
        op: &str,
        request: &Value,
        token: &str,
        first: bool,
        epoch: u64,
    ) -> Option<Result<Value, CapabilityError>> {
        self.route(op)
            .ok()?
            .call_behind(op, request, token, first, epoch)
            .await
    }

    fn kind(&self) -> &'static str {
        "router"
    }
}
