//! The simulated registrar, certificates, CDN, maps, functions and ticketing: JSON documents in
//! `sim_objects` shaped as the WIT records the workflows see (docs/simulator.md).

use super::transaction::SimTx;
use super::{SimulatedCloud, delete, get, list, put, s, unavailable};
use capstan_core::CapabilityError;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Every certificate the simulator issues has an ARN that starts so.
const CERTIFICATE_ARN_PREFIX: &str = "arn:sim:acm::certificate/";

type Answer = Result<Value, CapabilityError>;

fn not_found(what: impl std::fmt::Display) -> CapabilityError {
    CapabilityError::permanent("not-found", format!("{what} does not exist"))
}

fn unsupported(op: &str) -> CapabilityError {
    CapabilityError::permanent(
        "unsupported",
        format!("the simulated cloud has no operation {op}"),
    )
}

/// A fresh id: a prefix and the random tail of a UUIDv7, upper-case.
fn new_id(prefix: &str) -> String {
    let id = capstan_core::ids::new_id().replace('-', "");
    format!("{prefix}{}", id[16..].to_ascii_uppercase())
}

fn strings_of(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a certificate name (`example.com`, `*.example.com`) covers `domain`.
fn name_covers(name: &str, domain: &str) -> bool {
    name == domain
        || name.strip_prefix("*.").is_some_and(|parent| {
            domain
                .split_once('.')
                .is_some_and(|(_, rest)| rest == parent)
        })
}

fn certificate_names(cert: &Value) -> Vec<String> {
    let mut names = vec![s(cert, "domain").to_owned()];
    names.extend(strings_of(cert, "subject_alternative_names"));
    names
}

fn certificate_covers(cert: &Value, domain: &str) -> bool {
    certificate_names(cert)
        .iter()
        .any(|n| name_covers(n, domain))
}

/// The validation record that proves control of `name` (wildcards validate on their parent).
fn validation_record(name: &str) -> Value {
    let base = name.strip_prefix("*.").unwrap_or(name);
    let digest = Sha256::digest(base.as_bytes());
    let token: String = digest.iter().take(10).map(|b| format!("{b:02x}")).collect();
    json!({
        "name": format!("_capstan-validation.{base}"),
        "type_": "Cname",
        "ttl": 300,
        "values": [format!("{token}.validations.sim.capstan.dev")],
        "alias_target": null,
    })
}

impl SimulatedCloud {
    pub(super) async fn registrar(&self, tx: &mut SimTx, op: &str, request: &Value) -> Answer {
        let name = s(request, "name").trim().to_ascii_lowercase();
        let known = get(tx, "domain", &name).await.map_err(unavailable)?;
        match op {
            "registrar.check-domain" => {
                let owned = known.as_ref().is_some_and(|d| d["owned"] == true);
                Ok(
                    json!({"name": name, "registered": known.is_some(), "owned": owned, "available": known.is_none()}),
                )
            }
            "registrar.register-domain" => match known {
                Some(d) if d["owned"] == true => Ok(
                    json!({"name": name, "registration_id": d["registration_id"], "expires_at": d["expires_at"]}),
                ),
                Some(_) => Err(CapabilityError::permanent(
                    "domain-unavailable",
                    format!("{name} is registered to someone else"),
                )),
                None if !name.contains('.') => Err(CapabilityError::permanent(
                    "invalid-domain",
                    format!("{name:?} is not a domain name"),
                )),
                None => {
                    let years = request
                        .get("years")
                        .and_then(Value::as_i64)
                        .unwrap_or(1)
                        .max(1);
                    let expires = self.now() + years * 365 * 86_400_000;
                    let body = json!({"name": name, "owned": true, "registration_id": new_id("REG-"), "expires_at": expires});
                    put(tx, "domain", &name, &body).await.map_err(unavailable)?;
                    Ok(
                        json!({"name": name, "registration_id": body["registration_id"], "expires_at": expires}),
                    )
                }
            },
            "registrar.get-domain" => Ok(match known {
                Some(d) if d["owned"] == true => json!({
                    "name": name,
                    "expires_at": d["expires_at"],
                    "name_servers": delegation(&d),
                }),
                _ => Value::Null,
            }),
            "registrar.set-name-servers" => {
                let Some(mut d) = known.filter(|d| d["owned"] == true) else {
                    return Err(not_found(format!("a domain {name} of this account")));
                };
                let mut wanted: Vec<String> = Vec::new();
                for server in strings_of(request, "name_servers") {
                    let server = server.trim().trim_end_matches('.').to_ascii_lowercase();
                    if !server.contains('.') || server.contains(char::is_whitespace) {
                        return Err(CapabilityError::permanent(
                            "invalid-request",
                            format!("name server {server:?} is not a host name"),
                        ));
                    }
                    if !wanted.contains(&server) {
                        wanted.push(server);
                    }
                }
                if !(2..=6).contains(&wanted.len()) {
                    return Err(CapabilityError::permanent(
                        "invalid-request",
                        "a domain is delegated to two to six name servers",
                    ));
                }
                let before = delegation(&d);
                d["name_servers"] = json!(wanted);
                put(tx, "domain", &name, &d).await.map_err(unavailable)?;
                Ok(json!({"name": name, "before": before, "after": wanted}))
            }
            _ => Err(unsupported(op)),
        }
    }

    /// A certificate as the WIT shows it: issued once its validation records exist and the issue
    /// delay has passed (the change is persisted the first time it is observed), with the
    /// distributions that use it.
    pub(super) async fn certificate_view(
        &self,
        tx: &mut SimTx,
        mut cert: Value,
    ) -> Result<Value, sqlx::Error> {
        let arn = s(&cert, "arn").to_owned();
        if cert["status"] == "PendingValidation"
            && self.now()
                >= cert["requested_ms"].as_i64().unwrap_or(0) + self.settings.certificate_issue_ms
        {
            let mut all_present = true;
            for record in cert["validation_records"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                let bodies: Vec<String> = sqlx::query_scalar(
                    "SELECT body FROM sim_records WHERE name = $1 AND type = 'Cname'",
                )
                .bind(s(&record, "name"))
                .fetch_all(tx.conn().await?)
                .await?;
                let wanted = &record["values"][0];
                let present = bodies.iter().any(|b| {
                    serde_json::from_str::<Value>(b)
                        .ok()
                        .and_then(|v| v.get("values").cloned())
                        .and_then(|v| v.as_array().cloned())
                        .is_some_and(|values| values.contains(wanted))
                });
                all_present &= present;
            }
            if all_present {
                cert["status"] = json!("Issued");
                cert["issued_at"] = json!(self.now());
                put(tx, "certificate", &arn, &cert).await?;
            }
        }
        let in_use_by: Vec<Value> = list(tx, "distribution")
            .await?
            .into_iter()
            .filter(|d| d["spec"]["certificate_arn"] == arn.as_str())
            .map(|d| d["id"].clone())
            .collect();
        cert["in_use_by"] = Value::Array(in_use_by);
        if let Some(o) = cert.as_object_mut() {
            o.remove("requested_ms");
        }
        Ok(cert)
    }

    async fn certificate(&self, tx: &mut SimTx, arn: &str) -> Answer {
        let cert = get(tx, "certificate", arn)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| not_found(format!("certificate {arn}")))?;
        self.certificate_view(tx, cert).await.map_err(unavailable)
    }

    pub(super) async fn certificates(&self, tx: &mut SimTx, op: &str, request: &Value) -> Answer {
        match op {
            "certificates.find-certificates" => {
                let domain = s(request, "domain").trim().to_ascii_lowercase();
                let mut found = Vec::new();
                for cert in list(tx, "certificate").await.map_err(unavailable)? {
                    if certificate_covers(&cert, &domain) {
                        found.push(self.certificate_view(tx, cert).await.map_err(unavailable)?);
                    }
                }
                Ok(Value::Array(found))
            }
            "certificates.request-certificate" => {
                let domain = s(request, "domain").trim().to_ascii_lowercase();
                if domain.is_empty() {
                    return Err(CapabilityError::permanent(
                        "invalid-domain",
                        "a certificate needs a domain name",
                    ));
                }
                let sans: Vec<String> = strings_of(request, "subject_alternative_names")
                    .iter()
                    .map(|n| n.trim().to_ascii_lowercase())
                    .collect();
                let mut validation: Vec<Value> = Vec::new();
                for name in std::iter::once(&domain).chain(sans.iter()) {
                    let record = validation_record(name);
                    if !validation.contains(&record) {
                        validation.push(record);
                    }
                }
                let arn = format!("{CERTIFICATE_ARN_PREFIX}{}", capstan_core::ids::new_id());
                let cert = json!({
                    "arn": arn, "domain": domain, "subject_alternative_names": sans,
                    "status": "PendingValidation", "validation_records": validation,
                    "issued_at": null, "in_use_by": [], "requested_ms": self.now(),
                });
                put(tx, "certificate", &arn, &cert)
                    .await
                    .map_err(unavailable)?;
                self.certificate(tx, &arn).await
            }
            "certificates.describe-certificate" => self.certificate(tx, s(request, "arn")).await,
            "certificates.delete-certificate" => {
                let arn = s(request, "arn");
                let cert = self.certificate(tx, arn).await?;
                if cert["in_use_by"].as_array().is_some_and(|a| !a.is_empty()) {
                    return Err(CapabilityError::permanent(
                        "resource-in-use",
                        format!("certificate {arn} is used by {}", cert["in_use_by"]),
                    ));
                }
                delete(tx, "certificate", arn).await.map_err(unavailable)?;
                Ok(cert)
            }
            _ => Err(unsupported(op)),
        }
    }

    /// A distribution as the WIT shows it (`deployed` once its deploy delay has passed).
    pub(super) fn distribution_view(&self, mut d: Value) -> Value {
        let deployed = self.now() >= d["deploy_at_ms"].as_i64().unwrap_or(0);
        d["status"] = json!(if deployed { "Deployed" } else { "InProgress" });
        if let Some(o) = d.as_object_mut() {
            o.remove("deploy_at_ms");
        }
        d
    }

    /// Refuses a spec whose aliases another distribution holds or whose certificate does not
    /// cover them.
    async fn check_spec(
        &self,
        tx: &mut SimTx,
        spec: &Value,
        own: Option<&str>,
    ) -> Result<(), CapabilityError> {
        let aliases: Vec<String> = strings_of(spec, "aliases")
            .iter()
            .map(|a| a.trim().to_ascii_lowercase())
            .collect();
        for other in list(tx, "distribution").await.map_err(unavailable)? {
            if Some(s(&other, "id")) == own {
                continue;
            }
            if let Some(alias) = strings_of(&other["spec"], "aliases")
                .into_iter()
                .find(|a| aliases.contains(a))
            {
                return Err(CapabilityError::permanent(
                    "alias-in-use",
                    format!("{alias} is an alias of distribution {}", s(&other, "id")),
                ));
            }
        }
        // A certificate from another provider (an ACME order URL) is not the simulator's to
        // check: it is taken as the operator's word, as a CDN takes an imported certificate.
        if let Some(arn) = spec
            .get("certificate_arn")
            .and_then(Value::as_str)
            .filter(|arn| arn.starts_with(CERTIFICATE_ARN_PREFIX))
        {
            let cert = self.certificate(tx, arn).await.map_err(|_| {
                CapabilityError::permanent("invalid-certificate", format!("no certificate {arn}"))
            })?;
            if cert["status"] != "Issued" {
                return Err(CapabilityError::permanent(
                    "invalid-certificate",
                    format!("certificate {arn} is not issued"),
                ));
            }
            if let Some(alias) = aliases.iter().find(|a| !certificate_covers(&cert, a)) {
                return Err(CapabilityError::permanent(
                    "invalid-certificate",
                    format!("certificate {arn} does not cover {alias}"),
                ));
            }
        }
        Ok(())
    }

    async fn distribution(&self, tx: &mut SimTx, id: &str) -> Result<Value, CapabilityError> {
        get(tx, "distribution", id)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| not_found(format!("distribution {id}")))
    }

    pub(super) async fn cdn(&self, tx: &mut SimTx, op: &str, request: &Value) -> Answer {
        let deploy_at = self.now() + self.settings.cdn_deploy_ms;
        match op {
            "cdn.find-distribution-by-alias" => {
                let alias = s(request, "alias").trim().to_ascii_lowercase();
                let found = list(tx, "distribution")
                    .await
                    .map_err(unavailable)?
                    .into_iter()
                    .find(|d| strings_of(&d["spec"], "aliases").contains(&alias));
                Ok(found.map_or(Value::Null, |d| self.distribution_view(d)))
            }
            "cdn.get-distribution" => {
                let d = self.distribution(tx, s(request, "id")).await?;
                Ok(self.distribution_view(d))
            }
            "cdn.create-distribution" => {
                let mut spec = request.get("spec").cloned().unwrap_or(Value::Null);
                spec["aliases"] = json!(
                    strings_of(&spec, "aliases")
                        .iter()
                        .map(|a| a.trim().to_ascii_lowercase())
                        .collect::<Vec<_>>()
                );
                self.check_spec(tx, &spec, None).await?;
                let id = new_id("E");
                let d = json!({
                    "id": id, "domain_name": format!("d{}.cdn.sim.capstan.dev", id.to_ascii_lowercase()),
                    "hosted_zone_id": "ZCDNSIMULATED", "spec": spec, "deploy_at_ms": deploy_at,
                });
                put(tx, "distribution", &id, &d)
                    .await
                    .map_err(unavailable)?;
                Ok(self.distribution_view(d))
            }
            "cdn.update-distribution" => {
                let id = s(request, "id");
                let mut d = self.distribution(tx, id).await?;
                let before = self.distribution_view(d.clone());
                let mut spec = request.get("spec").cloned().unwrap_or(Value::Null);
                spec["aliases"] = json!(
                    strings_of(&spec, "aliases")
                        .iter()
                        .map(|a| a.trim().to_ascii_lowercase())
                        .collect::<Vec<_>>()
                );
                self.check_spec(tx, &spec, Some(id)).await?;
                d["spec"] = spec;
                d["deploy_at_ms"] = json!(deploy_at);
                put(tx, "distribution", id, &d).await.map_err(unavailable)?;
                Ok(json!({"before": before, "after": self.distribution_view(d)}))
            }
            "cdn.delete-distribution" => {
                let id = s(request, "id");
                let d = self.distribution(tx, id).await?;
                delete(tx, "distribution", id).await.map_err(unavailable)?;
                Ok(self.distribution_view(d))
            }
            _ => Err(unsupported(op)),
        }
    }

    pub(super) async fn maps(&self, tx: &mut SimTx, op: &str, request: &Value) -> Answer {
        if op == "maps.list-keys" {
            return list(tx, "maps-key")
                .await
                .map_err(unavailable)
                .map(Value::Array);
        }
        let key_id = s(request, "key_id");
        let referrer = s(request, "referrer").trim().to_owned();
        let mut key = get(tx, "maps-key", key_id)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| not_found(format!("maps API key {key_id}")))?;
        let mut referrers = strings_of(&key, "referrers");
        let present = referrers.contains(&referrer);
        let changed = match op {
            "maps.add-referrer" if present => false,
            "maps.add-referrer" => {
                let capacity = key["capacity"].as_u64().unwrap_or(0);
                if referrers.len() as u64 >= capacity {
                    return Err(CapabilityError::permanent(
                        "capacity-exhausted",
                        format!(
                            "maps API key {} ({key_id}) holds its maximum of {capacity} referrers",
                            s(&key, "display_name")
                        ),
                    ));
                }
                referrers.push(referrer);
                true
            }
            "maps.remove-referrer" if !present => false,
            "maps.remove-referrer" => {
                referrers.retain(|r| *r != referrer);
                true
            }
            _ => return Err(unsupported(op)),
        };
        if changed {
            key["referrers"] = json!(referrers);
            put(tx, "maps-key", key_id, &key)
                .await
                .map_err(unavailable)?;
        }
        Ok(json!({"key": key, "changed": changed}))
    }

    pub(super) async fn functions(&self, tx: &mut SimTx, op: &str, request: &Value) -> Answer {
        let name = s(request, "function_name").to_owned();
        let found = get(tx, "function", &name).await.map_err(unavailable)?;
        let missing = || not_found(format!("function {name}"));
        match op {
            "functions.publish-version" => {
                let sha = s(request, "code_sha256").to_owned();
                let mut f =
                    found.unwrap_or_else(|| json!({"name": name, "versions": [], "aliases": {}}));
                let versions = f["versions"].as_array().cloned().unwrap_or_default();
                if let Some(latest) = versions.last()
                    && latest["code_sha256"] == sha.as_str()
                {
                    return Ok(latest.clone());
                }
                let next = versions
                    .iter()
                    .filter_map(|v| v["version"].as_str()?.parse::<u64>().ok())
                    .max()
                    .unwrap_or(0)
                    + 1;
                let version =
                    json!({"function_name": name, "version": next.to_string(), "code_sha256": sha});
                let mut versions = versions;
                versions.push(version.clone());
                f["versions"] = Value::Array(versions);
                put(tx, "function", &name, &f).await.map_err(unavailable)?;
                Ok(version)
            }
            "functions.delete-version" => {
                let mut f = found.ok_or_else(missing)?;
                let version = s(request, "version");
                if let Some(alias) = f["aliases"].as_object().and_then(|all| {
                    all.iter().find(|(_, a)| {
                        let (primary, routing) = alias_state(a);
                        primary == version || routing.iter().any(|w| w["version"] == version)
                    })
                }) {
                    return Err(CapabilityError::permanent(
                        "resource-in-use",
                        format!(
                            "version {version} of {name} is a target of alias {}",
                            alias.0
                        ),
                    ));
                }
                let mut versions = f["versions"].as_array().cloned().unwrap_or_default();
                let Some(at) = versions.iter().position(|v| v["version"] == version) else {
                    return Err(not_found(format!("version {version} of {name}")));
                };
                let removed = versions.remove(at);
                f["versions"] = Value::Array(versions);
                put(tx, "function", &name, &f).await.map_err(unavailable)?;
                Ok(removed)
            }
            "functions.get-alias" => {
                let f = found.ok_or_else(missing)?;
                let alias = s(request, "alias");
                match f["aliases"].get(alias) {
                    Some(state) => Ok(alias_view(&name, alias, state)),
                    None => Err(not_found(format!("alias {alias} of {name}"))),
                }
            }
            "functions.update-alias" | "functions.route-alias" => {
                let mut f = found.ok_or_else(missing)?;
                let alias = s(request, "alias");
                let version = s(request, "version");
                let routing = request
                    .get("routing")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let Some(before) = f["aliases"].get(alias).cloned() else {
                    return Err(not_found(format!("alias {alias} of {name}")));
                };
                let versions = f["versions"].as_array().cloned().unwrap_or_default();
                for wanted in
                    std::iter::once(version).chain(routing.iter().map(|w| s(w, "version")))
                {
                    if !versions.iter().any(|v| v["version"] == wanted) {
                        return Err(not_found(format!("version {wanted} of {name}")));
                    }
                }
                check_routing(version, &routing)?;
                let state = if routing.is_empty() {
                    json!(version)
                } else {
                    json!({"version": version, "routing": routing})
                };
                f["aliases"][alias] = state.clone();
                put(tx, "function", &name, &f).await.map_err(unavailable)?;
                Ok(json!({
                    "before": alias_view(&name, alias, &before),
                    "after": alias_view(&name, alias, &state),
                }))
            }
            "functions.probe" => {
                let f = found.ok_or_else(missing)?;
                let alias = s(request, "alias");
                if f["aliases"].get(alias).is_none() {
                    return Err(not_found(format!("alias {alias} of {name}")));
                }
                Ok(json!(true))
            }
            _ => Err(unsupported(op)),
        }
    }

    pub(super) async fn ticketing(&self, tx: &mut SimTx, op: &str, request: &Value) -> Answer {
        let id = s(request, "id").to_owned();
        let found = get(tx, "ticket", &id).await.map_err(unavailable)?;
        match op {
            "ticketing.get-ticket" => Ok(found.unwrap_or(Value::Null)),
            "ticketing.add-comment" => {
                let mut t = found.ok_or_else(|| not_found(format!("ticket {id}")))?;
                let mut comments = strings_of(&t, "comments");
                comments.push(s(request, "body").to_owned());
                let comment_id = format!("{id}-C{}", comments.len());
                t["comments"] = json!(comments);
                put(tx, "ticket", &id, &t).await.map_err(unavailable)?;
                Ok(json!({"ticket_id": id, "comment_id": comment_id}))
            }
            "ticketing.transition-ticket" => {
                let mut t = found.ok_or_else(|| not_found(format!("ticket {id}")))?;
                let from = s(&t, "status").to_owned();
                let to = s(request, "status").to_owned();
                t["status"] = json!(to);
                put(tx, "ticket", &id, &t).await.map_err(unavailable)?;
                Ok(json!({"ticket_id": id, "from": from, "to": to}))
            }
            _ => Err(unsupported(op)),
        }
    }
}

/// The name servers a simulated domain is delegated to (the simulated DNS's own until changed).
fn delegation(domain: &Value) -> Vec<String> {
    let set = strings_of(domain, "name_servers");
    if set.is_empty() {
        vec![
            "ns1.sim.capstan.dev".to_owned(),
            "ns2.sim.capstan.dev".to_owned(),
        ]
    } else {
        set
    }
}

/// An alias as the simulated cloud keeps it: its version alone, or `{"version", "routing"}`
/// while other versions take a weighted share. Answers the version and the routing.
fn alias_state(state: &Value) -> (&str, Vec<Value>) {
    match state {
        Value::String(version) => (version, Vec::new()),
        other => (
            other["version"].as_str().unwrap_or_default(),
            other["routing"].as_array().cloned().unwrap_or_default(),
        ),
    }
}

fn alias_view(function: &str, alias: &str, state: &Value) -> Value {
    let (version, routing) = alias_state(state);
    json!({"function_name": function, "name": alias, "version": version, "routing": routing})
}

/// Weights from 0 to 1 adding up to at most 1, none for the alias's own version.
fn check_routing(version: &str, routing: &[Value]) -> Result<(), CapabilityError> {
    let mut total = 0.0;
    for w in routing {
        let weight = w["weight"].as_f64().unwrap_or(-1.0);
        if !(0.0..=1.0).contains(&weight) || w["version"] == version {
            return Err(CapabilityError::permanent(
                "invalid-request",
                format!(
                    "routing {w} is not a weight from 0 to 1 for another version than {version}"
                ),
            ));
        }
        total += weight;
    }
    if total > 1.0 {
        return Err(CapabilityError::permanent(
            "invalid-request",
            format!("routing weights add up to {total}, more than all of the traffic"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_cover_one_label() {
        assert!(name_covers("*.example.com", "www.example.com"));
        assert!(!name_covers("*.example.com", "a.b.example.com"));
        assert!(!name_covers("*.example.com", "example.com"));
        assert!(name_covers("example.com", "example.com"));
    }

    #[test]
    fn a_wildcard_validates_on_its_parent() {
        assert_eq!(
            validation_record("*.example.com"),
            validation_record("example.com")
        );
        assert_eq!(
            validation_record("example.com")["name"],
            "_capstan-validation.example.com"
        );
    }
}
