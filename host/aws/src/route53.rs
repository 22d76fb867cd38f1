//! Route 53 as the DNS adapter needs it: hosted zones, the record sets at a name, a batch of
//! changes, and a change's status. Names come back bare (lower case, no trailing dot, `*`
//! unescaped); TXT values are single unquoted strings on this side, quoted (and split into
//! 255-byte strings) on Route 53's.

use crate::{Aws, classify};
use aws_sdk_route53::types::{
    AliasTarget, Change, ChangeAction, ChangeBatch, ChangeStatus, ResourceRecord,
    ResourceRecordSet, RrType,
};
use capstan_core::CapabilityError;

/// A record set as the adapter speaks of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub name: String,
    /// The mnemonic: `A`, `AAAA`, `CNAME`, `TXT`, `MX`, `CAA`.
    pub kind: String,
    pub ttl: Option<u32>,
    pub values: Vec<String>,
    pub alias: Option<Alias>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    pub dns_name: String,
    pub hosted_zone_id: String,
    pub evaluate_target_health: bool,
}

/// What a change does to a set: `Upsert` creates or replaces it (Route 53's UPSERT, which a
/// repeat after a crash leaves as it is), `Delete` removes it (Route 53 wants the set exactly as
/// it stands).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Upsert,
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    /// Without the `/hostedzone/` prefix.
    pub id: String,
    pub name: String,
    pub caller_reference: String,
    pub private: bool,
}

/// A Route 53 client.
#[derive(Debug, Clone)]
pub struct Route53 {
    client: aws_sdk_route53::Client,
}

fn build_error(e: impl std::fmt::Display) -> CapabilityError {
    CapabilityError::permanent("invalid-request", e.to_string())
}

/// `/hostedzone/Z1` or `/change/C1` → `Z1` / `C1`.
fn strip(id: &str) -> String {
    id.rsplit('/').next().unwrap_or(id).to_owned()
}

/// Lower case, no trailing dot, Route 53's octal escapes (`\052` for `*`) read back.
pub fn bare(name: &str) -> String {
    let mut out = String::new();
    let mut chars = name.trim().trim_end_matches('.').chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let digits: String = chars.by_ref().take(3).collect();
            match u8::from_str_radix(&digits, 8) {
                Ok(byte) => out.push(char::from(byte)),
                Err(_) => {
                    out.push('\\');
                    out.push_str(&digits);
                }
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// A TXT value as Route 53 takes it: quoted, `"` and `\` escaped, in strings of at most 255
/// bytes (split on character boundaries).
pub fn quote_txt(value: &str) -> String {
    let mut parts = Vec::new();
    let mut part = String::new();
    for c in value.chars() {
        if part.len() + c.len_utf8() > 255 {
            parts.push(std::mem::take(&mut part));
        }
        part.push(c);
    }
    if !part.is_empty() || parts.is_empty() {
        parts.push(part);
    }
    parts
        .iter()
        .map(|p| format!("\"{}\"", p.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A TXT value as Route 53 answers it (one or more quoted strings), joined.
pub fn unquote_txt(value: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => inside = !inside,
            '\\' if inside => {
                if let Some(next) = chars.next() {
                    out.push(next);
                }
            }
            c if inside => out.push(c),
            _ => {}
        }
    }
    out
}

fn rr_type(kind: &str) -> Result<RrType, CapabilityError> {
    Ok(match kind {
        "A" => RrType::A,
        "AAAA" => RrType::Aaaa,
        "CNAME" => RrType::Cname,
        "TXT" => RrType::Txt,
        "MX" => RrType::Mx,
        "CAA" => RrType::Caa,
        other => {
            return Err(CapabilityError::permanent(
                "unsupported",
                format!("record type {other} is not supported"),
            ));
        }
    })
}

fn to_aws(set: &Set) -> Result<ResourceRecordSet, CapabilityError> {
    let mut builder = ResourceRecordSet::builder()
        .name(&set.name)
        .r#type(rr_type(&set.kind)?);
    match &set.alias {
        Some(alias) => {
            builder = builder.alias_target(
                AliasTarget::builder()
                    .dns_name(&alias.dns_name)
                    .hosted_zone_id(&alias.hosted_zone_id)
                    .evaluate_target_health(alias.evaluate_target_health)
                    .build()
                    .map_err(build_error)?,
            );
        }
        None => {
            builder = builder.ttl(i64::from(set.ttl.unwrap_or(300)));
            for value in &set.values {
                let value = if set.kind == "TXT" {
                    quote_txt(value)
                } else {
                    value.clone()
                };
                builder = builder.resource_records(
                    ResourceRecord::builder()
                        .value(value)
                        .build()
                        .map_err(build_error)?,
                );
            }
        }
    }
    builder.build().map_err(build_error)
}

fn from_aws(set: &ResourceRecordSet) -> Set {
    let kind = set.r#type().as_str().to_owned();
    let txt = kind == "TXT";
    Set {
        name: bare(set.name()),
        ttl: set.ttl().and_then(|t| u32::try_from(t).ok()),
        values: set
            .resource_records()
            .iter()
            .map(|r| {
                if txt {
                    unquote_txt(r.value())
                } else {
                    r.value().to_owned()
                }
            })
            .collect(),
        alias: set.alias_target().map(|a| Alias {
            dns_name: bare(a.dns_name()),
            hosted_zone_id: a.hosted_zone_id().to_owned(),
            evaluate_target_health: a.evaluate_target_health(),
        }),
        kind,
    }
}

impl Route53 {
    pub fn new(aws: &Aws) -> Self {
        Self {
            client: aws_sdk_route53::Client::new(&aws.config),
        }
    }

    /// Every hosted zone of the account.
    pub async fn zones(&self) -> Result<Vec<Zone>, CapabilityError> {
        let mut zones = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let page = self
                .client
                .list_hosted_zones()
                .set_marker(marker.clone())
                .send()
                .await
                .map_err(|e| classify(&e, |_, _| None))?;
            for z in page.hosted_zones() {
                zones.push(Zone {
                    id: strip(z.id()),
                    name: bare(z.name()),
                    caller_reference: z.caller_reference().to_owned(),
                    private: z.config().is_some_and(|c| c.private_zone()),
                });
            }
            match page.next_marker() {
                Some(next) if page.is_truncated() => marker = Some(next.to_owned()),
                _ => return Ok(zones),
            }
        }
    }

    /// Creates a public hosted zone; `caller_reference` makes a repeat of the request the same
    /// request (Route 53 refuses a second zone under it, and the adapter finds the first).
    pub async fn create_zone(
        &self,
        name: &str,
        caller_reference: &str,
    ) -> Result<Zone, CapabilityError> {
        let created = self
            .client
            .create_hosted_zone()
            .name(name)
            .caller_reference(caller_reference)
            .send()
            .await;
        match created {
            Ok(out) => {
                let z = out.hosted_zone().ok_or_else(|| {
                    CapabilityError::transient("unavailable", "Route 53 answered no hosted zone")
                })?;
                Ok(Zone {
                    id: strip(z.id()),
                    name: bare(z.name()),
                    caller_reference: z.caller_reference().to_owned(),
                    private: false,
                })
            }
            Err(e) => {
                let error = classify(&e, |_, _| None);
                if error.code == "hosted-zone-already-exists"
                    && let Some(zone) = self
                        .zones()
                        .await?
                        .into_iter()
                        .find(|z| z.caller_reference == caller_reference)
                {
                    return Ok(zone);
                }
                Err(error)
            }
        }
    }

    pub async fn delete_zone(&self, id: &str) -> Result<(), CapabilityError> {
        self.client
            .delete_hosted_zone()
            .id(id)
            .send()
            .await
            .map(drop)
            .map_err(|e| {
                classify(&e, |code, message| {
                    (code == "NoSuchHostedZone")
                        .then(|| CapabilityError::permanent("not-found", message))
                })
            })
    }

    /// The record sets at exactly `name` in zone `zone_id` (every type).
    pub async fn sets_at(&self, zone_id: &str, name: &str) -> Result<Vec<Set>, CapabilityError> {
        let wanted = bare(name);
        let mut sets = Vec::new();
        let mut start: Option<(String, RrType)> = None;
        loop {
            let mut request = self
                .client
                .list_resource_record_sets()
                .hosted_zone_id(zone_id)
                .max_items(100);
            request = match &start {
                Some((name, kind)) => request
                    .start_record_name(name)
                    .start_record_type(kind.clone()),
                None => request.start_record_name(&wanted),
            };
            let page = request.send().await.map_err(|e| {
                classify(&e, |code, message| {
                    (code == "NoSuchHostedZone")
                        .then(|| CapabilityError::permanent("not-found", message))
                })
            })?;
            let mut past = false;
            for set in page.resource_record_sets() {
                let set = from_aws(set);
                if set.name != wanted {
                    // Listed in Route 53's name order from `wanted`: another name ends them.
                    past = true;
                    break;
                }
                sets.push(set);
            }
            match (
                past,
                page.is_truncated(),
                page.next_record_name(),
                page.next_record_type(),
            ) {
                (false, true, Some(name), Some(kind)) => {
                    start = Some((name.to_owned(), kind.clone()));
                }
                _ => return Ok(sets),
            }
        }
    }

    /// Applies `changes` as one batch (all or nothing); the change's id and whether it is
    /// already in sync.
    pub async fn change(
        &self,
        zone_id: &str,
        changes: &[(Action, Set)],
        comment: &str,
    ) -> Result<(String, bool), CapabilityError> {
        let mut batch = ChangeBatch::builder().comment(comment);
        for (action, set) in changes {
            let action = match action {
                Action::Upsert => ChangeAction::Upsert,
                Action::Delete => ChangeAction::Delete,
            };
            batch = batch.changes(
                Change::builder()
                    .action(action)
                    .resource_record_set(to_aws(set)?)
                    .build()
                    .map_err(build_error)?,
            );
        }
        let out = self
            .client
            .change_resource_record_sets()
            .hosted_zone_id(zone_id)
            .change_batch(batch.build().map_err(build_error)?)
            .send()
            .await
            .map_err(|e| {
                classify(&e, |code, message| match code {
                    "NoSuchHostedZone" => Some(CapabilityError::permanent("not-found", message)),
                    // A delete whose set changed since it was read: read again and retry.
                    "InvalidChangeBatch"
                        if message.contains("not found")
                            || message.contains("values provided do not match") =>
                    {
                        Some(CapabilityError::transient("conflict", message))
                    }
                    "InvalidChangeBatch" => {
                        Some(CapabilityError::permanent("invalid-change-batch", message))
                    }
                    "InvalidInput" => Some(CapabilityError::permanent("invalid-request", message)),
                    _ => None,
                })
            })?;
        let info = out.change_info().ok_or_else(|| {
            CapabilityError::transient("unavailable", "Route 53 answered no change")
        })?;
        Ok((strip(info.id()), *info.status() == ChangeStatus::Insync))
    }

    /// Whether change `id` has reached every Route 53 name server.
    pub async fn in_sync(&self, id: &str) -> Result<bool, CapabilityError> {
        let out = self.client.get_change().id(id).send().await.map_err(|e| {
            classify(&e, |code, message| {
                (code == "NoSuchChange").then(|| CapabilityError::permanent("not-found", message))
            })
        })?;
        let info = out.change_info().ok_or_else(|| {
            CapabilityError::transient("unavailable", "Route 53 answered no change")
        })?;
        Ok(*info.status() == ChangeStatus::Insync)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn txt_values_round_trip_through_route_53s_quoting() {
        for value in ["v=spf1 -all", "say \"hi\" \\ bye", &"x".repeat(600), ""] {
            assert_eq!(unquote_txt(&quote_txt(value)), value, "{value}");
        }
        assert_eq!(quote_txt(&"y".repeat(300)).matches('"').count(), 4);
    }

    #[test]
    fn names_read_back_bare() {
        assert_eq!(bare("\\052.Example.COM."), "*.example.com");
        assert_eq!(strip("/hostedzone/Z123"), "Z123");
        assert_eq!(strip("C9"), "C9");
    }
}
