//! Which host calls change the world, and how each change is undone.
//!
//! A side effect reaches its provider under an idempotency token and leaves a receipt; rollback
//! walks the receipts in reverse and applies the compensation this table derives from each one
//! (the receipt carries the ids created and the prior state replaced).

use serde_json::{Value, json};

/// Operations that change the world (everything else a provider answers is a read).
pub const EFFECTS: [&str; 18] = [
    "dns.create-zone",
    "dns.delete-zone",
    "dns.change-records",
    "registrar.register-domain",
    "registrar.set-name-servers",
    "certificates.request-certificate",
    "certificates.delete-certificate",
    "cdn.create-distribution",
    "cdn.update-distribution",
    "cdn.delete-distribution",
    "maps.add-referrer",
    "maps.remove-referrer",
    "functions.publish-version",
    "functions.delete-version",
    "functions.update-alias",
    "functions.route-alias",
    "ticketing.add-comment",
    "ticketing.transition-ticket",
];

pub fn is_effect(op: &str) -> bool {
    EFFECTS.contains(&op)
}

/// How to undo one receipt.
#[derive(Debug, Clone, PartialEq)]
pub enum Compensation {
    /// Call `op` with `request`.
    Call { op: &'static str, request: Value },
    /// Nothing to undo (the effect changed nothing).
    Nothing,
    /// Cannot be undone by the host (a registered domain, a posted comment); recorded as such.
    Irreversible(&'static str),
}

/// The compensation of the effect `op` that was asked `request` and answered `ok` (the `Ok` payload).
pub fn compensation(op: &str, request: &Value, ok: &Value) -> Compensation {
    let s = |v: &Value, k: &str| v.get(k).cloned().unwrap_or(Value::Null);
    match op {
        "dns.create-zone" => Compensation::Call {
            op: "dns.delete-zone",
            request: json!({"zone_id": s(ok, "id")}),
        },
        "dns.change-records" => {
            let prior = ok
                .get("prior")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let same = |a: &Value, b: &Value| {
                a.get("name") == b.get("name") && a.get("type_") == b.get("type_")
            };
            // Undone in reverse: servers apply a batch in order (RFC 2136 §3.4.2), and an
            // address record put back before the CNAME that replaced it is gone would be
            // ignored beside it.
            let mut changes = Vec::new();
            for change in request
                .get("changes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .rev()
            {
                if let Some(set) = change.get("Upsert") {
                    match prior.iter().find(|p| same(p, set)) {
                        Some(before) => changes.push(json!({"Upsert": before})),
                        None => changes.push(json!({"Delete": set})),
                    }
                } else if let Some(set) = change.get("Delete")
                    && let Some(before) = prior.iter().find(|p| same(p, set))
                {
                    changes.push(json!({"Upsert": before}));
                }
            }
            if changes.is_empty() {
                Compensation::Nothing
            } else {
                Compensation::Call {
                    op: "dns.change-records",
                    request: json!({"zone_id": s(request, "zone_id"), "changes": changes}),
                }
            }
        }
        "certificates.request-certificate" => Compensation::Call {
            op: "certificates.delete-certificate",
            request: json!({"arn": s(ok, "arn")}),
        },
        "cdn.create-distribution" => Compensation::Call {
            op: "cdn.delete-distribution",
            request: json!({"id": s(ok, "id")}),
        },
        "cdn.update-distribution" => Compensation::Call {
            op: "cdn.update-distribution",
            request: json!({"id": s(request, "id"), "spec": s(&s(ok, "before"), "spec")}),
        },
        "maps.add-referrer" | "maps.remove-referrer" => {
            if ok.get("changed") == Some(&Value::Bool(true)) {
                let undo = if op == "maps.add-referrer" {
                    "maps.remove-referrer"
                } else {
                    "maps.add-referrer"
                };
                Compensation::Call {
                    op: undo,
                    request: json!({"key_id": s(request, "key_id"), "referrer": s(request, "referrer")}),
                }
            } else {
                Compensation::Nothing
            }
        }
        "functions.publish-version" => Compensation::Call {
            op: "functions.delete-version",
            request: json!({"function_name": s(ok, "function_name"), "version": s(ok, "version")}),
        },
        // The alias as it was, its weighted routing included.
        "functions.update-alias" | "functions.route-alias" => {
            let before = s(ok, "before");
            Compensation::Call {
                op: "functions.route-alias",
                request: json!({
                    "function_name": s(&before, "function_name"),
                    "alias": s(&before, "name"),
                    "version": s(&before, "version"),
                    "routing": before.get("routing").cloned().unwrap_or_else(|| json!([])),
                }),
            }
        }
        "ticketing.transition-ticket" => Compensation::Call {
            op: "ticketing.transition-ticket",
            request: json!({"id": s(ok, "ticket_id"), "status": s(ok, "from")}),
        },
        "registrar.set-name-servers" => Compensation::Call {
            op: "registrar.set-name-servers",
            request: json!({"name": s(ok, "name"), "name_servers": s(ok, "before")}),
        },
        "registrar.register-domain" => {
            Compensation::Irreversible("a registered domain is kept until it expires")
        }
        "ticketing.add-comment" => {
            Compensation::Irreversible("a posted comment stays on the ticket")
        }
        _ => Compensation::Irreversible("deletions are not recreated by rollback"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_change_is_undone_by_restoring_prior_sets_and_deleting_new_ones() {
        let old = json!({"name": "a.example.com", "type_": "Cname", "ttl": 60, "values": ["old"], "alias_target": null});
        let new_a = json!({"name": "a.example.com", "type_": "Cname", "ttl": 300, "values": ["new"], "alias_target": null});
        let new_b = json!({"name": "b.example.com", "type_": "A", "ttl": 300, "values": ["1.2.3.4"], "alias_target": null});
        let request = json!({"zone_id": "Z1", "changes": [{"Upsert": new_a}, {"Upsert": new_b}]});
        let ok = json!({"change_id": "C1", "zone_id": "Z1", "status": "Pending", "prior": [old]});
        let Compensation::Call { op, request } = compensation("dns.change-records", &request, &ok)
        else {
            panic!()
        };
        assert_eq!(op, "dns.change-records");
        assert_eq!(
            request["changes"],
            json!([{"Delete": new_b}, {"Upsert": old}])
        );
    }

    #[test]
    fn a_record_that_gave_way_to_a_cname_comes_back_after_the_cname_goes() {
        let a = json!({"name": "www.example.com", "type_": "A", "ttl": 60, "values": ["192.0.2.1"], "alias_target": null});
        let cname = json!({"name": "www.example.com", "type_": "Cname", "ttl": 300, "values": ["d1.cdn.example.net"], "alias_target": null});
        let request = json!({"zone_id": "Z1", "changes": [{"Delete": a}, {"Upsert": cname}]});
        let ok = json!({"change_id": "C1", "zone_id": "Z1", "status": "Pending", "prior": [a]});
        let Compensation::Call { request, .. } = compensation("dns.change-records", &request, &ok)
        else {
            panic!()
        };
        assert_eq!(
            request["changes"],
            json!([{"Delete": cname}, {"Upsert": a}])
        );
    }

    #[test]
    fn an_alias_change_is_undone_by_routing_the_alias_as_it_was() {
        let before = json!({"function_name": "f", "name": "live", "version": "1",
            "routing": [{"version": "2", "weight": 0.1}]});
        let ok = json!({"before": before, "after": {"function_name": "f", "name": "live", "version": "3", "routing": []}});
        for op in ["functions.update-alias", "functions.route-alias"] {
            let Compensation::Call { op, request } = compensation(op, &json!({}), &ok) else {
                panic!()
            };
            assert_eq!(op, "functions.route-alias");
            assert_eq!(
                request,
                json!({"function_name": "f", "alias": "live", "version": "1",
                    "routing": [{"version": "2", "weight": 0.1}]})
            );
        }
    }

    #[test]
    fn a_delegation_is_undone_by_delegating_back() {
        let ok = json!({"name": "example.com", "before": ["ns1.old.net", "ns2.old.net"], "after": ["ns-1.awsdns-01.org", "ns-2.awsdns-02.com"]});
        assert_eq!(
            compensation("registrar.set-name-servers", &json!({}), &ok),
            Compensation::Call {
                op: "registrar.set-name-servers",
                request: json!({"name": "example.com", "name_servers": ["ns1.old.net", "ns2.old.net"]}),
            }
        );
    }

    #[test]
    fn every_effect_has_a_rule() {
        for op in EFFECTS {
            let c = compensation(op, &json!({}), &json!({"changed": true}));
            if op == "dns.change-records" {
                assert_eq!(c, Compensation::Nothing);
            }
        }
        assert_eq!(
            compensation("maps.add-referrer", &json!({}), &json!({"changed": false})),
            Compensation::Nothing
        );
        assert!(matches!(
            compensation("registrar.register-domain", &json!({}), &json!({})),
            Compensation::Irreversible(_)
        ));
    }
}
