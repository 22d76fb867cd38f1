//! `point-record`: point `host` at `target` with a CNAME, wait for DNS to be in sync, and report
//! what was there before — the shape of every infrastructure change, in one screen.

use capstan_sdk::convergence::Condition;
use capstan_sdk::dns::{Change, RecordSet, RecordType};
use capstan_sdk::{Ctx, Descriptor, Error, Workflow};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Input {
    /// The name to point, e.g. `docs.example.com`.
    pub host: String,
    /// Where it should point, e.g. `d111.cdn.example`.
    pub target: String,
    /// Record TTL in seconds (default 300).
    #[serde(default = "default_ttl")]
    pub ttl: u32,
}

fn default_ttl() -> u32 {
    300
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    pub zone_id: String,
    pub change_id: String,
    /// Values the name had before (empty if it was new).
    pub previous: Vec<String>,
}

pub struct PointRecord;

impl Workflow for PointRecord {
    type Input = Input;
    type Output = Output;

    fn descriptor() -> Descriptor {
        Descriptor::new("point-record", env!("CARGO_PKG_VERSION"))
            .description(
                "Points a host name at a target with a CNAME and waits until DNS is in sync.",
            )
            .stages(&["find-zone", "upsert-record", "wait-insync"])
            .estimated_duration_seconds(90)
    }

    fn run(ctx: &mut Ctx, input: Input) -> Result<Output, Error> {
        let host = input.host.trim().trim_end_matches('.').to_ascii_lowercase();
        let zone = ctx.stage("find-zone", |ctx| {
            ctx.dns()
                .find_zone(&host)?
                .ok_or_else(|| Error::permanent("no-zone", format!("no hosted zone serves {host}")))
        })?;
        let receipt = ctx.stage("upsert-record", |ctx| {
            let record = RecordSet {
                name: host.clone(),
                type_: RecordType::Cname,
                ttl: Some(input.ttl),
                values: vec![input.target.clone()],
                alias_target: None,
            };
            ctx.dns()
                .change_records(&zone.id, &[Change::Upsert(record)])
        })?;
        ctx.stage("wait-insync", |ctx| {
            ctx.convergence().await_converged(
                &Condition::DnsChangeInsync(receipt.change_id.clone()),
                120_000,
            )
        })?;
        Ok(Output {
            zone_id: zone.id,
            change_id: receipt.change_id,
            previous: receipt.prior.into_iter().flat_map(|r| r.values).collect(),
        })
    }
}

capstan_sdk::export_workflow!(PointRecord);

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_sdk::harness::Harness;
    use capstan_sdk::json;

    fn harness() -> Harness {
        Harness::new()
            .reply("dns.find-zone", json!({"id": "Z1", "name": "example.com"}))
            .reply("dns.change-records", json!({
                "change_id": "C1", "zone_id": "Z1", "status": "Pending",
                "prior": [{"name": "docs.example.com", "type_": "Cname", "ttl": 60, "values": ["old.cdn.example"], "alias_target": null}]
            }))
            .reply("convergence.await-converged", json!(null))
    }

    #[test]
    fn upserts_the_record_and_waits_for_insync() {
        let report = harness()
            .run::<PointRecord>(json!({"host": "Docs.Example.com.", "target": "d1.cdn.example"}));
        let output: Output = serde_json::from_value(report.output.clone().unwrap()).unwrap();
        assert_eq!(
            output,
            Output {
                zone_id: "Z1".into(),
                change_id: "C1".into(),
                previous: vec!["old.cdn.example".into()]
            }
        );
        assert_eq!(
            report.stage_names(),
            ["find-zone", "upsert-record", "wait-insync"]
        );
        let change = &report.calls("dns.change-records")[0].request;
        assert_eq!(change["changes"][0]["Upsert"]["name"], "docs.example.com");
        assert_eq!(change["changes"][0]["Upsert"]["ttl"], 300);
        assert_eq!(
            report.calls("convergence.await-converged")[0].request["condition"],
            json!({"DnsChangeInsync": "C1"})
        );
    }

    #[test]
    fn a_missing_zone_fails_the_first_stage_permanently() {
        let report = Harness::new()
            .reply("dns.find-zone", json!(null))
            .run::<PointRecord>(json!({"host": "x.nowhere", "target": "t"}));
        let error = report.output.clone().unwrap_err();
        assert_eq!(error.code, "no-zone");
        assert!(!error.is_transient());
        assert_eq!(
            report
                .stage("find-zone")
                .unwrap()
                .error
                .as_ref()
                .unwrap()
                .code,
            "no-zone"
        );
        assert!(report.calls("dns.change-records").is_empty());
    }
}
