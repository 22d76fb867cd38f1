//! # capstan-providers
//!
//! What answers a workflow's capability calls. The engine sees one [`Providers`] seam — an
//! operation name and its JSON request — and this crate routes each capability to the provider
//! configured for it ([`ProviderSet`]): the embedded [`SimulatedCloud`] by default, a real adapter
//! (RFC 2136 DNS, ACME, …) where an operator configures one.
//!
//! The simulated cloud keeps its state in the engine's database (it survives restarts), behaves
//! like the real services where it matters to workflows (docs/simulator.md), deduplicates every
//! side effect by the engine's idempotency token, and injects configured faults.

mod sim;

pub use sim::{FaultKind, FaultRule, Seed, SeedError, SimulatedCloud, SimulationSettings, glob};

use async_trait::async_trait;
use capstan_core::{Capability, CapabilityError};
use capstan_engine::Providers;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A provider of one or more capabilities. `token` is the engine's idempotency token for a side
/// effect (empty for reads): a provider must answer a repeated token as the same request.
#[async_trait]
pub trait CapabilityProvider: Send + Sync + std::fmt::Debug {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Result<Value, CapabilityError>;

    /// [`CapabilityProvider::call`] of a token no earlier attempt can have used
    /// ([`capstan_engine::Providers::call_first`]). By default the same as `call`.
    async fn call_first(
        &self,
        op: &str,
        request: &Value,
        token: &str,
    ) -> Result<Value, CapabilityError> {
        self.call(op, request, token).await
    }
}

/// The providers of a node, one per capability.
#[derive(Debug, Clone, Default)]
pub struct ProviderSet {
    routes: BTreeMap<Capability, Arc<dyn CapabilityProvider>>,
}

impl ProviderSet {
    /// Every infrastructure capability answered by `provider`.
    pub fn all(provider: Arc<dyn CapabilityProvider>) -> Self {
        let mut set = Self::default();
        for capability in [
            Capability::Dns,
            Capability::Registrar,
            Capability::Certificates,
            Capability::Cdn,
            Capability::Maps,
            Capability::Functions,
            Capability::Ticketing,
        ] {
            set = set.with(capability, provider.clone());
        }
        set
    }

    /// Routes `capability` to `provider` (replacing the previous one).
    pub fn with(mut self, capability: Capability, provider: Arc<dyn CapabilityProvider>) -> Self {
        self.routes.insert(capability, provider);
        self
    }
}

impl ProviderSet {
    fn route(&self, op: &str) -> Result<&Arc<dyn CapabilityProvider>, CapabilityError> {
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
}
