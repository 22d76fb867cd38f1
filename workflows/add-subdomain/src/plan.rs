//! The plan a human approves: `AddSubdomainPlan` exactly as the API document defines it, the
//! disposition of each hostname from its live record sets, and the canonical `planHash`.
//!
//! Pure functions over plain data: no host calls here, so every rule is unit-testable as is.

use capstan_sdk::dns::{AliasTarget, RecordSet, RecordType};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The alias target every subdomain points at (the apex's CDN distribution).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApexAlias {
    /// The target's DNS name, e.g. `d123.cdn.sim.capstan.dev`.
    #[schemars(length(min = 1, max = 253))]
    pub dns_name: String,
    /// Whether the DNS service evaluates the target's health.
    #[serde(default)]
    pub evaluate_target_health: bool,
    /// The hosted zone of the target (a CDN's fixed zone id, e.g. `ZCDNSIMULATED`).
    #[schemars(length(min = 1, max = 128))]
    pub hosted_zone_id: String,
}

impl ApexAlias {
    /// Trims and lowercases the DNS name and drops a trailing dot; trims the zone id.
    pub fn normalized(&self) -> Self {
        Self {
            dns_name: normalize_name(&self.dns_name),
            evaluate_target_health: self.evaluate_target_health,
            hosted_zone_id: self.hosted_zone_id.trim().to_owned(),
        }
    }

    pub fn from_wit(target: &AliasTarget) -> Self {
        Self {
            dns_name: normalize_name(&target.dns_name),
            evaluate_target_health: target.evaluate_target_health,
            hosted_zone_id: target.hosted_zone_id.clone(),
        }
    }

    pub fn to_wit(&self) -> AliasTarget {
        AliasTarget {
            dns_name: self.dns_name.clone(),
            hosted_zone_id: self.hosted_zone_id.clone(),
            evaluate_target_health: self.evaluate_target_health,
        }
    }

    /// True when `target` is this alias (DNS names compared case- and trailing-dot-insensitively).
    pub fn is(&self, target: &AliasTarget) -> bool {
        Self::from_wit(target) == *self
    }
}

/// What the workflow will do to one hostname.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Disposition {
    /// An `A` alias to the apex target is already there: nothing to change.
    AlreadyCorrect,
    /// Neither an `A` nor a `CNAME` record exists: one is created.
    Create,
    /// An `A` record pointing elsewhere, or a `CNAME`, exists: it is replaced.
    Replace,
}

/// The `A` or `CNAME` record set a hostname has now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CurrentType {
    A,
    #[serde(rename = "CNAME")]
    Cname,
}

/// `current` of a plan item: the existing record, shaped as the API document says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CurrentRecord {
    pub name: String,
    #[serde(rename = "type")]
    pub type_: CurrentType,
    #[serde(default)]
    pub values: Vec<String>,
    /// Omitted when the record has none (alias records) or it is 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias_target: Option<ApexAlias>,
}

impl CurrentRecord {
    fn of(set: &RecordSet, type_: CurrentType) -> Self {
        Self {
            name: normalize_name(&set.name),
            type_,
            values: set.values.clone(),
            ttl: set.ttl.filter(|ttl| *ttl > 0),
            alias_target: set.alias_target.as_ref().map(ApexAlias::from_wit),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PlanItem {
    pub hostname: String,
    pub disposition: Disposition,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<CurrentRecord>,
}

/// `AddSubdomainPlan` of the API document: these properties, no others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AddSubdomainPlan {
    pub apex_alias: ApexAlias,
    pub execution_id: String,
    pub hosted_zone_id: String,
    pub items: Vec<PlanItem>,
    pub plan_hash: String,
    pub replacement_required: bool,
    pub root_domain: String,
}

impl AddSubdomainPlan {
    /// Builds the plan and seals it with its hash.
    pub fn new(
        execution_id: String,
        root_domain: String,
        hosted_zone_id: String,
        apex_alias: ApexAlias,
        items: Vec<PlanItem>,
    ) -> Self {
        let replacement_required = items.iter().any(|i| i.disposition == Disposition::Replace);
        let mut plan = Self {
            apex_alias,
            execution_id,
            hosted_zone_id,
            items,
            plan_hash: String::new(),
            replacement_required,
            root_domain,
        };
        plan.plan_hash = plan.compute_hash();
        plan
    }

    /// The canonical form: the plan without `planHash`, keys sorted, no whitespace.
    pub fn canonical(&self) -> String {
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.remove("planHash");
        }
        canonical_json(&value)
    }

    /// Lowercase hex SHA-256 of [`Self::canonical`].
    pub fn compute_hash(&self) -> String {
        hex::encode(Sha256::digest(self.canonical().as_bytes()))
    }

    /// True when nothing needs to change.
    pub fn is_noop(&self) -> bool {
        self.items
            .iter()
            .all(|i| i.disposition == Disposition::AlreadyCorrect)
    }
}

/// JSON with object keys sorted (by their UTF-8 bytes; every key here is ASCII) at every level,
/// arrays in order, and no insignificant whitespace. For the plan's value types (strings,
/// booleans, non-negative integers) this is the RFC 8785 (JCS) form. Written out here rather
/// than trusting `serde_json`'s map order, which a `preserve_order` feature elsewhere in the
/// build would change.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(&mut out, value);
    out
}

fn write_canonical(out: &mut String, value: &Value) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(key) {
                    write_canonical(out, v);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(out, item);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// A hostname's disposition, from the record sets DNS lists for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    pub item: PlanItem,
    /// The `CNAME` set to delete in the same change (a `CNAME` cannot sit beside an `A`).
    pub cname: Option<RecordSet>,
}

/// Decides what to do with `hostname`, given its live record sets and the target alias:
/// - a `CNAME` exists → `replace` (it is deleted and an `A` alias upserted), `current` = the CNAME;
/// - an `A` alias to the target exists → `already-correct`, `current` = that record;
/// - another `A` record exists → `replace`, `current` = that record;
/// - neither → `create`, no `current`.
///
/// Other types (`AAAA`, `TXT`) are left alone.
pub fn assess(hostname: &str, records: &[RecordSet], target: &ApexAlias) -> Assessment {
    let of_type = |ty: RecordType| {
        records
            .iter()
            .find(|r| r.type_ == ty && normalize_name(&r.name) == hostname)
    };
    let cname = of_type(RecordType::Cname);
    let a = of_type(RecordType::A);
    let (disposition, current) = match (cname, a) {
        (Some(cname), _) => (
            Disposition::Replace,
            Some(CurrentRecord::of(cname, CurrentType::Cname)),
        ),
        (None, Some(a)) if a.alias_target.as_ref().is_some_and(|t| target.is(t)) => (
            Disposition::AlreadyCorrect,
            Some(CurrentRecord::of(a, CurrentType::A)),
        ),
        (None, Some(a)) => (
            Disposition::Replace,
            Some(CurrentRecord::of(a, CurrentType::A)),
        ),
        (None, None) => (Disposition::Create, None),
    };
    Assessment {
        item: PlanItem {
            hostname: hostname.to_owned(),
            disposition,
            current,
        },
        cname: cname.cloned(),
    }
}

/// The record set every subdomain gets: an `A` alias to the apex target.
pub fn desired_record(hostname: &str, target: &ApexAlias) -> RecordSet {
    RecordSet {
        name: hostname.to_owned(),
        type_: RecordType::A,
        ttl: None,
        values: Vec::new(),
        alias_target: Some(target.to_wit()),
    }
}

/// Trimmed, lowercased, without a trailing dot.
pub fn normalize_name(raw: &str) -> String {
    raw.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// A DNS host label: 1–63 of `a-z`, `0-9`, `-`, not starting or ending with `-`.
fn is_label(label: &str) -> bool {
    (1..=63).contains(&label.len())
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

/// A normalized domain name of at least `min_labels` valid labels, at most 253 characters.
pub fn parse_domain(raw: &str, min_labels: usize) -> Option<String> {
    let name = normalize_name(raw);
    let ok =
        name.len() <= 253 && name.split('.').count() >= min_labels && name.split('.').all(is_label);
    ok.then_some(name)
}

/// The full hostname of `subdomain` under `root`: a full hostname ending in `.root` is kept, a
/// label (or dotted labels) is prefixed to `root`. The apex itself is not a subdomain.
pub fn hostname_under(subdomain: &str, root: &str) -> Result<String, String> {
    let name = normalize_name(subdomain);
    if name == root {
        return Err(format!(
            "`{subdomain}` is the root domain itself, not a subdomain"
        ));
    }
    let full = if name.ends_with(&format!(".{root}")) {
        name
    } else {
        format!("{name}.{root}")
    };
    parse_domain(&full, 2).ok_or_else(|| {
        format!(
            "`{subdomain}` is not a valid host label or hostname under `{root}` (labels of a-z, 0-9 and -, at most 63 characters each, 253 in all)"
        )
    })
}
