//! The documented JSON shapes, built from engine records. No extra properties. Every handler
//! returns one of these types, and the OpenAPI document (`openapi.rs`) is derived from them.

use capstan_core::execution::{ExecutionStatus, StageStatus};
use capstan_core::store::{ExecutionRecord, JsonText, OutboxRecord, StageRecord};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// RFC 3339 in UTC with milliseconds: `2026-01-01T00:00:00.000Z`.
pub fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    if !(0..=9999).contains(&year) {
        return format!(
            "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{millis:03}Z"
        );
    }
    // Every response carries a few dozen of these: digits into a fixed buffer, not `format!`.
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut value: i64| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, hour);
    put(14, 2, minute);
    put(17, 2, second);
    put(20, 3, millis);
    String::from_utf8_lossy(&out).into_owned()
}

fn opt_time(ms: Option<i64>) -> Option<String> {
    ms.map(rfc3339)
}

/// Execution status, exactly the document's enum (the OpenAPI schema of
/// [`capstan_core::execution::ExecutionStatus`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = ExecutionStatus)]
pub enum ExecutionStatusView {
    Canceled,
    Failed,
    Paused,
    Queued,
    RolledBack,
    Running,
    Succeeded,
    Waiting,
}

impl From<ExecutionStatus> for ExecutionStatusView {
    fn from(s: ExecutionStatus) -> Self {
        match s {
            ExecutionStatus::Canceled => Self::Canceled,
            ExecutionStatus::Failed => Self::Failed,
            ExecutionStatus::Paused => Self::Paused,
            ExecutionStatus::Queued => Self::Queued,
            ExecutionStatus::RolledBack => Self::RolledBack,
            ExecutionStatus::Running => Self::Running,
            ExecutionStatus::Succeeded => Self::Succeeded,
            ExecutionStatus::Waiting => Self::Waiting,
        }
    }
}

/// Stage status, exactly the document's enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = StageStatus)]
pub enum StageStatusView {
    Failed,
    Running,
    Succeeded,
    Waiting,
}

impl From<StageStatus> for StageStatusView {
    fn from(s: StageStatus) -> Self {
        match s {
            StageStatus::Failed => Self::Failed,
            StageStatus::Running => Self::Running,
            StageStatus::Succeeded => Self::Succeeded,
            StageStatus::Waiting => Self::Waiting,
        }
    }
}

/// ExecutionSummary: an Execution without inputJson, stages and outcome.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecutionSummary {
    /// Set when a cooperative cancel was requested (always present here, `null` when not).
    #[schema(format = DateTime)]
    pub cancellation_requested_at: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(required = true)]
    pub current_stage: Option<String>,
    pub execution_id: String,
    #[schema(required = true, format = DateTime)]
    pub finished_at: Option<String>,
    /// The requesting principal.
    pub principal_id: String,
    pub status: ExecutionStatusView,
    /// The workflow name.
    pub workflow: String,
}

/// ExecutionSummary.
pub fn summary(e: &ExecutionRecord) -> ExecutionSummary {
    ExecutionSummary {
        cancellation_requested_at: opt_time(e.cancellation_requested_ms),
        created_at: rfc3339(e.created_ms),
        current_stage: e.current_stage.clone(),
        execution_id: e.id.clone(),
        finished_at: opt_time(e.finished_ms),
        principal_id: e.principal_id.clone(),
        status: e.status.into(),
        workflow: e.workflow.clone(),
    }
}

/// ExecutionStage.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecutionStage {
    // Stored JSON texts, sent on unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub error_json: Option<JsonText>,
    pub execution_id: String,
    /// Present, `null` until the stage ends.
    #[schema(format = DateTime)]
    pub finished_at: Option<String>,
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub output_json: Option<JsonText>,
    pub stage_name: String,
    #[schema(format = DateTime)]
    pub started_at: String,
    pub status: StageStatusView,
}

pub fn stage(s: &StageRecord) -> ExecutionStage {
    ExecutionStage {
        error_json: s.error_json.clone(),
        execution_id: s.execution_id.clone(),
        finished_at: opt_time(s.finished_ms),
        id: s.id.clone(),
        output_json: s.output_json.clone(),
        stage_name: s.stage_name.clone(),
        started_at: rfc3339(s.started_ms),
        status: s.status.into(),
    }
}

/// The schema of `Execution.outcome` (the normalized onboarding outcome); its body is
/// `tests/schemas/domain-onboarding-outcome.schema.json`, put in the document by `openapi.rs`.
#[derive(Debug, Clone, Copy)]
pub struct DomainOnboardingOutcome;

/// The add-subdomain plan (`GET /v1/executions/{id}/plan`); its body is
/// `tests/schemas/add-subdomain-plan.schema.json`, put in the document by `openapi.rs`.
#[derive(Debug, Clone, Copy)]
pub struct AddSubdomainPlan;

macro_rules! external_schema {
    ($t:ident) => {
        impl utoipa::PartialSchema for $t {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::schema::Object::new().into()
            }
        }
        impl ToSchema for $t {}
    };
}
external_schema!(DomainOnboardingOutcome);
external_schema!(AddSubdomainPlan);

/// Execution, with stages in order and the outcome when there is one.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Execution {
    #[schema(format = DateTime)]
    pub cancellation_requested_at: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(required = true)]
    pub current_stage: Option<String>,
    pub execution_id: String,
    #[schema(required = true, format = DateTime)]
    pub finished_at: Option<String>,
    /// The trigger body as accepted.
    #[schema(value_type = Value)]
    pub input_json: JsonText,
    /// The normalized onboarding outcome (onboard-domain executions that have one).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<DomainOnboardingOutcome>, nullable = false)]
    pub outcome: Option<JsonText>,
    pub principal_id: String,
    /// In order.
    pub stages: Vec<ExecutionStage>,
    pub status: ExecutionStatusView,
    pub workflow: String,
}

pub fn execution(e: &ExecutionRecord, stages: &[StageRecord]) -> Execution {
    let s = summary(e);
    Execution {
        cancellation_requested_at: s.cancellation_requested_at,
        created_at: s.created_at,
        current_stage: s.current_stage,
        execution_id: s.execution_id,
        finished_at: s.finished_at,
        input_json: e.input_json.clone(),
        outcome: e.outcome_json.clone(),
        principal_id: s.principal_id,
        stages: stages.iter().map(stage).collect(),
        status: s.status,
        workflow: s.workflow,
    }
}

/// OutboxEvent.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutboxEvent {
    #[schema(format = DateTime)]
    pub dispatched_at: Option<String>,
    pub event_id: String,
    pub event_type: String,
    pub event_version: String,
    pub execution_id: String,
    #[schema(format = DateTime)]
    pub occurred_at: String,
    // Its text as written: sent on unchanged, described as any JSON.
    #[schema(value_type = Value)]
    pub payload_json: capstan_core::store::JsonText,
    pub principal_id: String,
    #[schema(format = DateTime)]
    pub routed_at: Option<String>,
    #[schema(format = DateTime)]
    pub stream_published_at: Option<String>,
    pub traceparent: Option<String>,
}

/// The view of a record the caller keeps (a webhook signs and sends it, then records it).
pub fn event(e: &OutboxRecord) -> OutboxEvent {
    OutboxEvent::from(e.clone())
}

/// The view of a record the caller is done with: its texts and payload move into the view, not
/// copied (an SSE stream turns each event it reads into one).
impl From<OutboxRecord> for OutboxEvent {
    fn from(e: OutboxRecord) -> Self {
        OutboxEvent {
            dispatched_at: opt_time(e.dispatched_ms),
            event_id: e.event_id,
            event_type: e.event_type,
            event_version: e.event_version,
            execution_id: e.execution_id,
            occurred_at: rfc3339(e.occurred_ms),
            payload_json: e.payload_json,
            principal_id: e.principal_id,
            routed_at: opt_time(e.routed_ms),
            stream_published_at: opt_time(e.stream_published_ms),
            traceparent: e.traceparent,
        }
    }
}

/// `links` of a WorkflowTriggerResponse.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionLinks {
    pub cancel: String,
    pub events: String,
    #[serde(rename = "self")]
    pub self_: String,
}

impl ExecutionLinks {
    pub fn of(id: &str) -> Self {
        Self {
            cancel: format!("/v1/executions/{id}/cancel"),
            events: format!("/v1/executions/{id}/events"),
            self_: format!("/v1/executions/{id}"),
        }
    }
}

/// WorkflowTriggerResponse.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkflowTriggerResponse {
    pub estimated_duration_seconds: u32,
    pub execution_id: String,
    pub links: ExecutionLinks,
    pub stages: Vec<String>,
    pub status: ExecutionStatusView,
    pub workflow: String,
    pub workflow_run_id: String,
}

/// `POST /v1/workflows/onboard-domain` body (validated at run time against the workflow's own
/// input schema; this is the documented contract).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OnboardDomainRequest {
    /// Trimmed and lowercased.
    #[schema(min_length = 1)]
    pub domain: String,
    #[serde(default = "yes")]
    #[schema(default = true)]
    pub is_cms: bool,
    /// Normalized.
    #[serde(default)]
    #[schema(min_length = 1, nullable = false)]
    pub ticket_id: Option<String>,
    #[serde(default)]
    #[schema(min_length = 1, nullable = true)]
    pub recent_cert_override_domain: Option<String>,
    #[serde(default)]
    pub options: OnboardDomainOptions,
}

fn yes() -> bool {
    true
}

/// `options` of [`OnboardDomainRequest`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(default = json!({"skipReadinessCheck": false, "dryRun": false}))]
pub struct OnboardDomainOptions {
    #[serde(default)]
    #[schema(default = false)]
    pub skip_readiness_check: bool,
    #[serde(default)]
    #[schema(default = false)]
    pub dry_run: bool,
}

/// `{executions: ExecutionSummary[]}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionList {
    pub executions: Vec<ExecutionSummary>,
}

/// What one side effect of an execution did, and what a rollback does about it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecutionReceipt {
    pub id: String,
    /// The run (the execution's first, or a recovery's) that made the change.
    pub workflow_run_id: String,
    /// `<capability>.<operation>`, e.g. `dns.change-records`.
    pub op: String,
    /// What the provider was asked.
    pub request: Value,
    /// What it answered: the ids created and the prior state replaced.
    pub response: Value,
    #[schema(format = DateTime)]
    pub created_at: String,
    /// When a rollback undid it; `null` until then.
    #[schema(required = true, format = DateTime)]
    pub compensated_at: Option<String>,
    /// What a rollback does: `call` (undo with `undoOp`), `nothing` (it changed nothing) or
    /// `irreversible` (kept, `undoNote` says why).
    pub undo: UndoKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undo_op: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undo_note: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UndoKind {
    Call,
    Nothing,
    Irreversible,
}

pub fn receipt(r: &capstan_core::store::Receipt) -> ExecutionReceipt {
    use capstan_engine::effects::{Compensation, compensation};
    let (request, response) = (r.request.value(), r.response.value());
    let (undo, undo_op, undo_note) = match compensation(&r.op, &request, &response) {
        Compensation::Call { op, .. } => (UndoKind::Call, Some(op.to_owned()), None),
        Compensation::Nothing => (UndoKind::Nothing, None, None),
        Compensation::Irreversible(why) => (UndoKind::Irreversible, None, Some(why.to_owned())),
    };
    ExecutionReceipt {
        id: r.id.clone(),
        workflow_run_id: r.run_id.clone(),
        op: r.op.clone(),
        request,
        response,
        created_at: rfc3339(r.created_ms),
        compensated_at: opt_time(r.compensated_ms),
        undo,
        undo_op,
        undo_note,
    }
}

/// `{receipts: ExecutionReceipt[]}`, in the order the changes were made.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReceiptList {
    pub receipts: Vec<ExecutionReceipt>,
}

/// `{events: OutboxEvent[]}`, in order.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventList {
    pub events: Vec<OutboxEvent>,
}

/// `{execution}`: an execution after a control operation finished at once.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionEnvelope {
    pub execution: ExecutionSummary,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CancelStatus {
    CancellationRequested,
}

/// 202 of `POST /v1/executions/{id}/cancel`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelResponse {
    pub execution: ExecutionSummary,
    /// `cancellation_requested` for cooperative cancels (the workflow ends at its next safe point).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub status: Option<CancelStatus>,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResumeStatus {
    RetryQueued,
    RetryAlreadyQueued,
}

/// 202 of `POST /v1/executions/{id}/resume`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeResponse {
    pub execution: ExecutionSummary,
    pub status: ResumeStatus,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CommandOperation {
    Rollback,
    RetryFinalization,
    RetryMapsWhitelist,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CommandState {
    Active,
    Queued,
}

/// A queued control command.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Command {
    #[schema(required = true)]
    pub command_id: Option<String>,
    pub operation: CommandOperation,
    pub status: CommandState,
}

/// 202 of rollback, retry-finalization and retry-maps-whitelist.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandResponse {
    pub command: Command,
    pub execution: ExecutionSummary,
    pub workflow_run_id: String,
}

pub fn command(
    outcome: &capstan_engine::CommandOutcome,
    operation: CommandOperation,
) -> CommandResponse {
    let status = match outcome.command.as_ref().map(|c| c.status) {
        Some(capstan_core::store::CommandStatus::Active) => CommandState::Active,
        _ => CommandState::Queued,
    };
    CommandResponse {
        command: Command {
            command_id: outcome.command.as_ref().map(|c| c.id.clone()),
            operation,
            status,
        },
        execution: summary(&outcome.execution),
        workflow_run_id: outcome.execution.run_id.clone(),
    }
}

/// Body of `POST /v1/executions/{id}/plan/approve`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanApproval {
    /// The `planHash` of the plan the caller read.
    #[schema(pattern = "^[a-f0-9]{64}$")]
    pub plan_hash: String,
}

/// 202 of `POST /v1/executions/{id}/plan/approve`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanApproved {
    pub execution: ExecutionSummary,
    #[schema(pattern = "^[a-f0-9]{64}$")]
    pub plan_hash: String,
}

/// ApiKeyMetadata (never the secret).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKeyMetadata {
    pub api_key_id: String,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub expires_at: String,
    #[schema(required = true, format = DateTime)]
    pub last_used_at: Option<String>,
    pub pepper_version: i64,
    /// Display prefix of the key.
    pub prefix: String,
    pub principal_id: String,
    #[schema(required = true, format = DateTime)]
    pub revoked_at: Option<String>,
}

pub fn key_metadata(k: &capstan_store::auth::ApiKeyRecord) -> ApiKeyMetadata {
    ApiKeyMetadata {
        api_key_id: k.id.clone(),
        created_at: rfc3339(k.created_ms),
        expires_at: rfc3339(k.expires_ms),
        last_used_at: opt_time(k.last_used_ms),
        pepper_version: k.pepper_version,
        prefix: k.prefix.clone(),
        principal_id: k.principal_id.clone(),
        revoked_at: opt_time(k.revoked_ms),
    }
}

/// MintedApiKey: the plaintext is shown here once.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MintedApiKey {
    pub api_key_id: String,
    #[schema(format = DateTime)]
    pub expires_at: String,
    pub pepper_version: i64,
    pub plaintext_token: String,
    pub prefix: String,
    pub principal_id: String,
}

pub fn minted(m: &crate::Minted) -> MintedApiKey {
    let k = &m.record;
    MintedApiKey {
        api_key_id: k.id.clone(),
        expires_at: rfc3339(k.expires_ms),
        pepper_version: k.pepper_version,
        plaintext_token: m.plaintext.clone(),
        prefix: k.prefix.clone(),
        principal_id: k.principal_id.clone(),
    }
}

/// Body of `POST /v1/principals/{principalId}/api-keys` (may be empty).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MintApiKeyRequest {
    /// Lifetime in days (the configured default when absent or `null`).
    #[schema(minimum = 1, maximum = 3650, nullable = true)]
    pub expires_in_days: Option<i64>,
}

/// `{apiKey: MintedApiKey}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MintedApiKeyEnvelope {
    pub api_key: MintedApiKey,
}

/// `{apiKeys: ApiKeyMetadata[]}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKeyList {
    pub api_keys: Vec<ApiKeyMetadata>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuditResult {
    Allowed,
    Denied,
}

/// AuditLog: one authorization decision.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditLog {
    pub action: String,
    #[schema(format = DateTime)]
    pub at: String,
    #[schema(required = true)]
    pub execution_id: Option<String>,
    pub id: String,
    #[schema(required = true)]
    pub ip: Option<String>,
    pub method: String,
    pub principal_id: String,
    pub resource: String,
    pub result: AuditResult,
    pub route: String,
    #[schema(required = true)]
    pub user_agent: Option<String>,
}

pub fn audit_log(a: &capstan_store::auth::AuditRecord) -> AuditLog {
    AuditLog {
        action: a.action.clone(),
        at: rfc3339(a.at_ms),
        execution_id: a.execution_id.clone(),
        id: a.id.clone(),
        ip: a.ip.clone(),
        method: a.method.clone(),
        principal_id: a.principal_id.clone(),
        resource: a.resource.clone(),
        result: if a.result == "allowed" {
            AuditResult::Allowed
        } else {
            AuditResult::Denied
        },
        route: a.route.clone(),
        user_agent: a.user_agent.clone(),
    }
}

/// `{auditLogs: AuditLog[]}`, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditLogList {
    pub audit_logs: Vec<AuditLog>,
}

/// Error: every non-2xx body of `/v1`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Error {
    /// A stable code, e.g. `unauthorized`, `forbidden`, `not_found`, `validation_error`,
    /// `state_invalid`.
    pub error: String,
    /// Human-readable text (every `/v1` error has one).
    #[schema(required = false)]
    pub message: String,
    /// Validation problems, each with a JSON pointer `path` and a `message`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub issues: Option<Vec<Value>>,
    /// Why a control operation is not valid now, e.g. `past_point_of_no_return`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_rfc3339_with_milliseconds() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            super::rfc3339(1_767_225_600_123),
            "2026-01-01T00:00:00.123Z"
        );
        assert_eq!(super::rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(super::rfc3339(86_399_999), "1970-01-01T23:59:59.999Z");
        assert_eq!(super::rfc3339(-1), "1969-12-31T23:59:59.999Z");
        // Outside four-digit years: still every field, the year as wide as it needs.
        assert_eq!(
            super::rfc3339(253_402_300_800_000),
            "10000-01-01T00:00:00.000Z"
        );
    }
}
