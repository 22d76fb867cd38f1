//! `update-function-version`: publishes a new version of a serverless function, shifts an alias
//! (default `live`) to it, and probes the alias.
//!
//! # Stages
//! 1. `publish` — reads the alias (it must exist: `alias-not-found` before anything changes) and
//!    publishes the code as a version (`functions.publish-version`; the same code as the latest
//!    version gives that version back).
//! 2. `shift-alias` — points the alias at the new version alone (`functions.update-alias`, whose
//!    receipt keeps the alias it replaced, a canary's weighted routing included). Skipped as a
//!    call when the alias already points there with no routing.
//! 3. `verify` — probes the alias (`functions.probe`). Healthy: done. Unhealthy (`false`, or a
//!    permanent probe error): the stage fails permanently with `unhealthy-version` and **the alias
//!    is left on the new version**; the workflow does not undo anything itself. Recovery is the
//!    operator's choice, from durable receipts: `POST rollback` (the host routes the alias back as
//!    it was, weights included, and deletes the published version) or `POST resume` (probes again).
//!    A transient probe error (retries exhausted) pauses the execution instead.
//!
//! # Cancel
//! Cooperative: a cancel only records the request. The workflow checks it at three safe points —
//! before `publish`, before `shift-alias`, before `verify` — and stops there with the permanent
//! error `canceled`, whose message says what had already changed (the receipts of it are what
//! rollback undoes). After `verify` has begun, the run finishes.
//!
//! The workflow is resumable when failed or canceled (`resumable_when_failed`).

use capstan_sdk::{CancelMode, Ctx, Descriptor, Error, Workflow};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Input {
    /// The function, e.g. `edge-router` (letters, digits, `-`, `_`; at most 64).
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9_-]+$"))]
    pub function_name: String,
    /// SHA-256 of the code package, 64 hex digits.
    #[schemars(regex(pattern = r"^[A-Fa-f0-9]{64}$"))]
    pub code_sha256: String,
    /// The alias to shift (default `live`); letters, digits, `-`, `_`, not only digits.
    #[serde(default = "default_alias")]
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9_-]+$"))]
    pub alias: String,
}

fn default_alias() -> String {
    "live".to_owned()
}

/// The execution's output.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    pub function_name: String,
    pub alias: String,
    pub code_sha256: String,
    /// The version the alias now points at.
    pub version: String,
    /// The version the alias pointed at before.
    pub previous_version: String,
    /// False when the alias already pointed at the published version.
    pub alias_changed: bool,
    pub healthy: bool,
}

/// Output of `publish`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Published {
    version: String,
    code_sha256: String,
    /// Where the alias pointed before the run.
    alias_version: String,
    /// Whether other versions took a weighted share of the alias's traffic (a canary).
    alias_weighted: bool,
}

/// Output of `shift-alias`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Shifted {
    before: String,
    after: String,
    changed: bool,
}

pub struct UpdateFunctionVersion;

impl Workflow for UpdateFunctionVersion {
    type Input = Input;
    type Output = Output;

    fn descriptor() -> Descriptor {
        Descriptor::new("update-function-version", env!("CARGO_PKG_VERSION"))
            .description(
                "Publishes a function version, shifts an alias to it and probes it; cancels cooperatively.",
            )
            .stages(&["publish", "shift-alias", "verify"])
            .estimated_duration_seconds(30)
            .cancel_mode(CancelMode::Cooperative)
            .resumable_when_failed(true)
            .rollback_requires_terminal(true)
    }

    fn run(ctx: &mut Ctx, input: Input) -> Result<Output, Error> {
        let (name, sha, alias) = validate(&input)?;

        stop_if_canceled(ctx, "publish", "nothing was changed")?;
        let published = ctx.stage("publish", |ctx| {
            let current =
                ctx.functions()
                    .get_alias(&name, &alias)
                    .map_err(|e| match e.code.as_str() {
                        "not-found" => Error::permanent(
                            "alias-not-found",
                            format!("function `{name}` has no alias `{alias}`: {}", e.message),
                        ),
                        _ => e,
                    })?;
            let version = ctx.functions().publish_version(&name, &sha)?;
            Ok(Published {
                version: version.version,
                code_sha256: version.code_sha256,
                alias_version: current.version,
                alias_weighted: !current.routing.is_empty(),
            })
        })?;

        stop_if_canceled(
            ctx,
            "shift-alias",
            &format!(
                "version {} of `{name}` was published; alias `{alias}` still points at version {}",
                published.version, published.alias_version
            ),
        )?;
        let shifted = ctx.stage("shift-alias", |ctx| {
            if published.alias_version == published.version && !published.alias_weighted {
                return Ok(Shifted {
                    before: published.alias_version.clone(),
                    after: published.version.clone(),
                    changed: false,
                });
            }
            let change = ctx
                .functions()
                .update_alias(&name, &alias, &published.version)?;
            Ok(Shifted {
                changed: change.before != change.after,
                before: change.before.version,
                after: change.after.version,
            })
        })?;

        stop_if_canceled(
            ctx,
            "verify",
            &format!(
                "alias `{alias}` of `{name}` was shifted from version {} to {} and not verified",
                shifted.before, shifted.after
            ),
        )?;
        ctx.stage("verify", |ctx| match ctx.functions().probe(&name, &alias) {
            Ok(true) => Ok(true),
            Ok(false) => Err(unhealthy(
                &name,
                &alias,
                &shifted,
                "the probe answered unhealthy",
            )),
            Err(e) if e.is_transient() => Err(e),
            Err(e) => Err(unhealthy(
                &name,
                &alias,
                &shifted,
                &format!("the probe failed: {}: {}", e.code, e.message),
            )),
        })?;

        Ok(Output {
            function_name: name,
            alias,
            code_sha256: published.code_sha256,
            version: shifted.after,
            previous_version: shifted.before,
            alias_changed: shifted.changed,
            healthy: true,
        })
    }
}

capstan_sdk::export_workflow!(UpdateFunctionVersion);

/// A safe point: stops with `canceled` when a cooperative cancel was requested.
fn stop_if_canceled(ctx: &Ctx, next_stage: &str, state: &str) -> Result<(), Error> {
    let requested = ctx.cancellation_requested();
    // The harness answers every check alike; tests pick the safe point where the cancel lands.
    #[cfg(test)]
    let requested = requested || tests::cancel_lands_before(next_stage);
    if requested {
        return Err(Error::permanent(
            "canceled",
            format!("canceled before `{next_stage}`: {state}"),
        ));
    }
    Ok(())
}

fn unhealthy(name: &str, alias: &str, shifted: &Shifted, why: &str) -> Error {
    Error::permanent(
        "unhealthy-version",
        format!(
            "{why}; alias `{alias}` of `{name}` is left on version {} (was {}): roll back to shift it back and delete the version, or resume to probe again",
            shifted.after, shifted.before
        ),
    )
}

/// Trimmed function name, lowercase code hash and alias, or `invalid-input`.
fn validate(input: &Input) -> Result<(String, String, String), Error> {
    let invalid = |m: String| Err(Error::permanent("invalid-input", m));
    let is_name = |s: &str, max: usize| {
        (1..=max).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    let name = input.function_name.trim().to_owned();
    let sha = input.code_sha256.trim().to_ascii_lowercase();
    let alias = input.alias.trim().to_owned();
    if !is_name(&name, 64) {
        return invalid(format!(
            "functionName `{}` must be 1 to 64 letters, digits, `-` or `_`",
            input.function_name
        ));
    }
    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return invalid(format!(
            "codeSha256 `{}` must be 64 hex digits",
            input.code_sha256
        ));
    }
    if !is_name(&alias, 128) || alias.bytes().all(|b| b.is_ascii_digit()) {
        return invalid(format!(
            "alias `{}` must be 1 to 128 letters, digits, `-` or `_`, and not only digits",
            input.alias
        ));
    }
    Ok((name, sha, alias))
}

#[cfg(test)]
mod tests;
