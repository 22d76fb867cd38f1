//! What the host knows about a workflow: its self-description (exported by the component) and the
//! capabilities an operator may grant it.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How the host cancels a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CancelMode {
    /// Stopped at the next host call boundary or while waiting.
    Immediate,
    /// `cancellationRequestedAt` is recorded; the workflow decides at its next safe point.
    Cooperative,
}

/// A named operation that re-runs a finished run from `from_stage`, replaying earlier outputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryOperation {
    pub name: String,
    pub from_stage: String,
    /// The statuses it applies to.
    pub from_statuses: Vec<crate::execution::ExecutionStatus>,
    /// It applies only while the outcome holds this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_outcome: Option<OutcomeCondition>,
}

/// The string at a JSON pointer of an execution's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeCondition {
    pub pointer: String,
    pub equals: String,
}

impl RecoveryOperation {
    /// Whether it applies to an execution in `status` with `outcome`.
    pub fn applies(
        &self,
        status: crate::execution::ExecutionStatus,
        outcome: Option<&serde_json::Value>,
    ) -> bool {
        self.from_statuses.contains(&status)
            && self.when_outcome.as_ref().is_none_or(|c| {
                outcome
                    .and_then(|o| o.pointer(&c.pointer))
                    .and_then(serde_json::Value::as_str)
                    == Some(c.equals.as_str())
            })
    }
}

/// A workflow component's self-description.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowDescriptor {
    pub name: String,
    pub version: String,
    pub description: String,
    pub stages: Vec<String>,
    pub estimated_duration_seconds: u32,
    /// JSON Schema of the trigger body.
    pub input_schema: serde_json::Value,
    pub recovery_operations: Vec<RecoveryOperation>,
    pub cancel_mode: CancelMode,
    pub resumable_when_failed: bool,
    /// Once this stage has begun, cancel is refused (409 `state_invalid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub point_of_no_return: Option<String>,
    /// Rollback only from a terminal status (not while paused).
    #[serde(default)]
    pub rollback_requires_terminal: bool,
}

/// Whether repeating a failed request may succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    Transient,
    Permanent,
}

/// The shared error of every capability, as guests and providers exchange it. Its JSON is the
/// JSON of the WIT `capstan:platform/types.error` record on both sides of the boundary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct CapabilityError {
    pub kind: ErrorKind,
    pub code: String,
    pub message: String,
    /// How long the provider asked to be left alone before a retry (an HTTP `Retry-After`).
    /// The engine's retry waits at least this long, up to its policy's `max_ms`. Not part of
    /// the WIT record: it matters only to the retry that is under way, never to a guest.
    #[serde(skip)]
    pub retry_after_ms: Option<u64>,
}

impl CapabilityError {
    pub fn permanent(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Permanent,
            code: code.into(),
            message: message.into(),
            retry_after_ms: None,
        }
    }

    pub fn transient(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Transient,
            code: code.into(),
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// The same error, with the wait the provider asked for before a retry.
    pub fn retry_after(mut self, ms: Option<u64>) -> Self {
        self.retry_after_ms = ms;
        self
    }

    pub fn is_transient(&self) -> bool {
        self.kind == ErrorKind::Transient
    }
}

/// Which capabilities each workflow may import, by workflow name. A workflow that is not listed
/// gets none: it may use only the platform (stages, time, approvals, log, events).
pub type CapabilityGrants =
    std::collections::BTreeMap<String, std::collections::BTreeSet<Capability>>;

/// A capability an operator grants to a workflow. Platform interfaces (context, time, approvals)
/// are always available; these are the ones that reach the outside world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Capability {
    Dns,
    Registrar,
    Certificates,
    Cdn,
    Maps,
    Functions,
    Ticketing,
    Convergence,
    Booking,
    Supplier,
    Admission,
    Vouchers,
}

impl Capability {
    pub const ALL: [Capability; 12] = [
        Self::Dns,
        Self::Registrar,
        Self::Certificates,
        Self::Cdn,
        Self::Maps,
        Self::Functions,
        Self::Ticketing,
        Self::Convergence,
        Self::Booking,
        Self::Supplier,
        Self::Admission,
        Self::Vouchers,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dns => "dns",
            Self::Registrar => "registrar",
            Self::Certificates => "certificates",
            Self::Cdn => "cdn",
            Self::Maps => "maps",
            Self::Functions => "functions",
            Self::Ticketing => "ticketing",
            Self::Convergence => "convergence",
            Self::Booking => "booking",
            Self::Supplier => "supplier",
            Self::Admission => "admission",
            Self::Vouchers => "vouchers",
        }
    }

    /// The capability of a journaled operation name such as `dns.change-records`.
    pub fn of_op(op: &str) -> Option<Self> {
        let name = op.split('.').next()?;
        Self::ALL.into_iter().find(|c| c.as_str() == name)
    }

    /// The WIT interface a component imports for this capability (without version).
    pub fn interface(self) -> &'static str {
        match self {
            Self::Dns => "capstan:infra/dns",
            Self::Registrar => "capstan:infra/registrar",
            Self::Certificates => "capstan:infra/certificates",
            Self::Cdn => "capstan:infra/cdn",
            Self::Maps => "capstan:infra/maps",
            Self::Functions => "capstan:infra/functions",
            Self::Ticketing => "capstan:infra/ticketing",
            Self::Convergence => "capstan:infra/convergence",
            Self::Booking => "capstan:booking/booking",
            Self::Supplier => "capstan:booking/supplier",
            Self::Admission => "capstan:booking/admission",
            Self::Vouchers => "capstan:booking/vouchers",
        }
    }

    /// The capability behind an imported interface name such as `capstan:infra/dns@0.1.0`.
    pub fn from_interface(import: &str) -> Option<Self> {
        let bare = import.split('@').next().unwrap_or(import);
        Self::ALL.into_iter().find(|c| c.interface() == bare)
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parsing a capability name failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown capability `{0}` (expected one of: dns, registrar, certificates, cdn, maps, functions, ticketing, convergence, booking, supplier, admission, vouchers)"
)]
pub struct UnknownCapability(pub String);

impl FromStr for Capability {
    type Err = UnknownCapability;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownCapability(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_round_trip_through_names_and_interfaces() {
        for c in Capability::ALL {
            assert_eq!(c.as_str().parse::<Capability>(), Ok(c));
            assert_eq!(
                Capability::from_interface(&format!("{}@0.1.0", c.interface())),
                Some(c)
            );
        }
        assert_eq!(
            Capability::from_interface("capstan:platform/time@0.1.0"),
            None
        );
        assert!(
            "dnz"
                .parse::<Capability>()
                .unwrap_err()
                .to_string()
                .contains("dnz")
        );
    }
}
