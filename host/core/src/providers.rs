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
    /// as the same request and change nothing more. A token is bound to its operation and
    /// request: one that comes again with another must be refused with
    /// [`CapabilityError::token_reused`], never answered with what the first call got.
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

    /// A call answered only if the provider acts on nothing outside the engine's store: its
    /// writes queued behind its answer for the store's group commit
    /// (`capstan_store::Store::write_behind`) under the epoch `epoch`, so they commit only after
    /// everything queued before them, and never if that epoch has moved. `None`: it cannot
    /// (a remote service, a fault to inject, memory full, the epoch moved); the engine then
    /// makes the run durable first and calls [`Providers::call`]. Asked for a run that started
    /// before its trigger was durable (`capstan_core::store::RunStore::queue_ahead`). `first` as
    /// for [`Providers::call_first`]. By default `None`.
    async fn call_behind(
        &self,
        _op: &str,
        _request: &Value,
        _token: &str,
        _first: bool,
        _epoch: u64,
    ) -> Option<Result<Value, CapabilityError>> {
        None
    }

    /// The read that tells whether an `await-converged` condition holds now. The conditions
    /// are the capabilities' own vocabulary, so they are decided here, beside the calls, not by
    /// the engine; a provider with conditions of its own overrides this.
    fn probe(&self, condition: &Value) -> Result<Probe, CapabilityError> {
        Probe::standard(condition)
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

/// The code of [`CapabilityError::token_reused`].
pub const TOKEN_REUSED: &str = "idempotency-token-reused";

impl CapabilityError {
    /// A token came again with another operation or request than it was first used for: the
    /// caller's replay diverged from what it did before (the engine pauses the execution as
    /// nondeterministic). Permanent: asking again cannot make the two calls the same.
    pub fn token_reused(op: &str, first_op: &str) -> Self {
        Self::permanent(
            TOKEN_REUSED,
            format!(
                "idempotency token used before for another call (`{first_op}` with other arguments); refused `{op}` rather than answer it with that call's result"
            ),
        )
    }

    pub fn is_token_reused(&self) -> bool {
        self.code == TOKEN_REUSED
    }
}

/// Whether a token's first call and this one are the same call.
pub fn same_call(first_op: &str, first_request: &Value, op: &str, request: &Value) -> bool {
    first_op == op && first_request == request
}

/// A call's operation and request as one SHA-256 (hex), for a token ledger that keeps what its
/// token was first used for without keeping the request itself.
pub fn call_digest(op: &str, request: &Value) -> String {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    hash.update(op.as_bytes());
    hash.update(b"\n");
    hash.update(crate::store::json_string(request).as_bytes());
    hex::encode(hash.finalize())
}

/// The idempotency tokens a provider's API accepts: at most `max_len` characters, and only
/// ASCII letters, digits and `_` when `word_only`. The engine's token (`<run>:<epoch>:<seq>`)
/// goes through [`TokenFormat::derive`] before it reaches such an API, so a repeat after a crash
/// is the same token there too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenFormat {
    pub max_len: usize,
    pub word_only: bool,
}

impl TokenFormat {
    /// The engine's `token` as this API accepts it: unchanged when it fits, else the hex of its
    /// SHA-256, cut to `max_len` (32 characters still carry 128 bits). Deterministic: the same
    /// engine token always gives the same API token.
    pub fn derive(self, token: &str) -> String {
        let fits = token.len() <= self.max_len
            && (!self.word_only
                || token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        if fits {
            return token.to_owned();
        }
        use sha2::Digest as _;
        let mut hex = hex::encode(sha2::Sha256::digest(token.as_bytes()));
        hex.truncate(self.max_len);
        hex
    }
}

/// A read and the test of its answer: `holds(answer of op(request))`.
#[derive(Debug, Clone)]
pub struct Probe {
    pub op: &'static str,
    pub request: Value,
    pub holds: fn(&Value) -> bool,
}

impl Probe {
    /// The conditions of the WIT `convergence` interface: a DNS change in sync, a certificate
    /// issued, a distribution deployed.
    pub fn standard(condition: &Value) -> Result<Self, CapabilityError> {
        let probe = |op, request, holds| Ok(Self { op, request, holds });
        if let Some(id) = condition.get("DnsChangeInsync") {
            probe(
                "dns.get-change",
                serde_json::json!({"change_id": id}),
                |v| v == "Insync",
            )
        } else if let Some(arn) = condition.get("CertificateIssued") {
            probe(
                "certificates.describe-certificate",
                serde_json::json!({"arn": arn}),
                |v| v.get("status").is_some_and(|s| s == "Issued"),
            )
        } else if let Some(id) = condition.get("DistributionDeployed") {
            probe("cdn.get-distribution", serde_json::json!({"id": id}), |v| {
                v.get("status").is_some_and(|s| s == "Deployed")
            })
        } else {
            Err(CapabilityError::permanent(
                "invalid-condition",
                format!("unknown condition {condition}"),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_that_fits_is_kept_and_one_that_does_not_is_hashed_to_the_format() {
        let word32 = TokenFormat {
            max_len: 32,
            word_only: true,
        };
        assert_eq!(word32.derive("abc_123"), "abc_123");
        let engine = "0194f8a2-7c1d-7e3a-9b2f-4d5e6f708192:0:17";
        let derived = word32.derive(engine);
        assert_eq!(derived.len(), 32);
        assert!(derived.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(derived, word32.derive(engine), "deterministic");
        assert_ne!(
            derived,
            word32.derive("0194f8a2-7c1d-7e3a-9b2f-4d5e6f708192:0:18")
        );
        let any128 = TokenFormat {
            max_len: 128,
            word_only: false,
        };
        assert_eq!(any128.derive(engine), engine);
    }

    #[test]
    fn a_reused_token_is_a_permanent_error_that_says_so() {
        let e = CapabilityError::token_reused("dns.change-records", "dns.change-records");
        assert!(e.is_token_reused());
        assert!(!e.is_transient());
        assert!(same_call(
            "a",
            &serde_json::json!({"x": 1}),
            "a",
            &serde_json::json!({"x": 1})
        ));
        assert!(!same_call(
            "a",
            &serde_json::json!({"x": 1}),
            "a",
            &serde_json::json!({"x": 2})
        ));
    }

    #[test]
    fn the_standard_conditions_read_their_capability_and_test_its_answer() {
        use serde_json::json;
        let dns = Probe::standard(&json!({"DnsChangeInsync": "C1"})).unwrap();
        assert_eq!(dns.op, "dns.get-change");
        assert_eq!(dns.request, json!({"change_id": "C1"}));
        assert!((dns.holds)(&json!("Insync")) && !(dns.holds)(&json!("Pending")));
        let cert = Probe::standard(&json!({"CertificateIssued": "arn:1"})).unwrap();
        assert_eq!(cert.op, "certificates.describe-certificate");
        assert!((cert.holds)(&json!({"status": "Issued"})));
        assert!(!(cert.holds)(&json!({"status": "PendingValidation"})));
        let cdn = Probe::standard(&json!({"DistributionDeployed": "D1"})).unwrap();
        assert!((cdn.holds)(&json!({"status": "Deployed"})));
        let unknown = Probe::standard(&json!({"Sunrise": 1})).unwrap_err();
        assert_eq!(unknown.code, "invalid-condition");
    }
}
