//! The one seam between the engine and whatever answers a workflow's capability calls.
//!
//! A call is an operation name (`dns.change-records`) and its request as the JSON of the WIT
//! arguments; the answer is the JSON of the WIT result's `Ok` payload or a [`CapabilityError`].
//! The simulated cloud, every real adapter (RFC 2136, ACME, …) and the per-node router that picks
//! one per capability implement the same [`Providers`] trait, so the engine and the API know none
//! of them by name.

use crate::CapabilityError;
use async_trait::async_trait;
use serde_json::Value;

/// What answers capability calls: one provider, or a router over several.
#[async_trait]
pub trait Providers: Send + Sync {
    /// The `Ok` payload of the WIT result, or the capability error. `token` is the engine's
    /// idempotency token of a side effect (empty for reads): a repeated token must be answered
    /// as the same request and change nothing more.
    async fn call(&self, op: &str, request: &Value, token: &str) -> Result<Value, CapabilityError>;

    /// [`Providers::call`] of a side effect whose `token` no earlier attempt can have used: the
    /// first attempt of a live call in a run's first activation. A provider that looks tokens up
    /// before acting may skip the lookup (it must still refuse to record a token twice). By
    /// default the same as `call`.
    async fn call_first(
        &self,
        op: &str,
        request: &Value,
        token: &str,
    ) -> Result<Value, CapabilityError> {
        self.call(op, request, token).await
    }

    /// The implementation's name as operators configure it (`simulated`, `rfc2136`, `acme`).
    fn kind(&self) -> &'static str {
        "custom"
    }

    /// Whether the service behind the provider answers now (for `/readyz`): `Err` says what
    /// failed, without secrets. Providers with nothing remote to reach are always reachable.
    async fn reachable(&self) -> Result<(), String> {
        Ok(())
    }
}

/// An operator's read-only view of a provider's whole state (`GET /v1/admin/simulator`).
#[async_trait]
pub trait Inspect: Send + Sync + std::fmt::Debug {
    async fn snapshot(&self) -> Result<Value, String>;
}
