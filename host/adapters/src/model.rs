//! The `capstan:infra/dns` and `certificates` records as the host's JSON carries them (the Rust
//! names of the generated bindings: `type_`, `Upsert`, `Cname`), typed for the adapters.

use capstan_core::CapabilityError;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RecordType {
    A,
    Aaaa,
    Cname,
    Txt,
    Mx,
    Caa,
}

impl RecordType {
    pub const ALL: [RecordType; 6] = [
        RecordType::A,
        RecordType::Aaaa,
        RecordType::Cname,
        RecordType::Txt,
        RecordType::Mx,
        RecordType::Caa,
    ];

    /// The mnemonic of RFC 1035 and its successors.
    pub fn mnemonic(self) -> &'static str {
        match self {
            RecordType::A => "A",
            RecordType::Aaaa => "AAAA",
            RecordType::Cname => "CNAME",
            RecordType::Txt => "TXT",
            RecordType::Mx => "MX",
            RecordType::Caa => "CAA",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AliasTarget {
    pub dns_name: String,
    pub hosted_zone_id: String,
    pub evaluate_target_health: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordSet {
    pub name: String,
    pub type_: RecordType,
    pub ttl: Option<u32>,
    pub values: Vec<String>,
    pub alias_target: Option<AliasTarget>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    Upsert(RecordSet),
    Delete(RecordSet),
}

impl Change {
    pub fn set(&self) -> &RecordSet {
        match self {
            Change::Upsert(s) | Change::Delete(s) => s,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeStatus {
    Pending,
    Insync,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeReceipt {
    pub change_id: String,
    pub zone_id: String,
    pub status: ChangeStatus,
    pub prior: Vec<RecordSet>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Zone {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CertificateStatus {
    PendingValidation,
    Issued,
    Failed,
    Revoked,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Certificate {
    pub arn: String,
    pub domain: String,
    pub subject_alternative_names: Vec<String>,
    pub status: CertificateStatus,
    pub validation_records: Vec<RecordSet>,
    pub issued_at: Option<u64>,
    pub in_use_by: Vec<String>,
}

/// One argument of a request, typed; a missing or malformed one is the caller's mistake.
pub fn arg<T: serde::de::DeserializeOwned>(
    request: &serde_json::Value,
    name: &str,
) -> Result<T, CapabilityError> {
    serde_json::from_value(
        request
            .get(name)
            .cloned()
            .unwrap_or(serde_json::Value::Null),
    )
    .map_err(|e| CapabilityError::permanent("invalid-request", format!("argument `{name}`: {e}")))
}

/// Whether a certificate name (`example.com`, `*.example.com`) covers `domain`: itself, or
/// for a wildcard one label below its parent.
pub fn covers(name: &str, domain: &str) -> bool {
    name == domain
        || name.strip_prefix("*.").is_some_and(|parent| {
            domain
                .split_once('.')
                .is_some_and(|(_, rest)| rest == parent)
        })
}

/// Lower-case, without the trailing dot.
pub fn bare(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_wildcard_covers_one_label_below_its_parent() {
        use super::covers;
        assert!(covers("*.example.org", "www.example.org"));
        assert!(!covers("*.example.org", "a.b.example.org"));
        assert!(!covers("*.example.org", "example.org"));
        assert!(covers("example.org", "example.org"));
    }
}
