//! `DomainOnboardingOutcome`, exactly as the orchestration API documents it: the host copies the
//! workflow output's `outcome` into the execution's `outcome` field, and the published schema
//! (`tests/schemas/domain-onboarding-outcome.schema.json`) allows no extra property anywhere.

use serde::{Deserialize, Serialize};

/// The normalized result of one onboarding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DomainOnboardingOutcome {
    pub execution_id: String,
    /// `onboarded` (nothing left to do), `assistance-required` (see `assistance.reasons`) or
    /// `dry-run` (nothing was changed; `assistance.reasons` lists what a real run would do).
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_run_id: Option<String>,
    pub assistance: Assistance,
    pub certificate: CertificateOutcome,
    pub cleanup: CleanupOutcome,
    pub distributions: Distributions,
    pub domain: DomainOutcome,
    pub maps_provider: MapsOutcome,
    pub ticketing: TicketingOutcome,
}

pub const STATUS_ONBOARDED: &str = "onboarded";
pub const STATUS_ASSISTANCE_REQUIRED: &str = "assistance-required";
pub const STATUS_DRY_RUN: &str = "dry-run";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assistance {
    pub required: bool,
    pub reasons: Vec<Reason>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Audience {
    /// The platform team (capacity, provider problems, leftovers to clean).
    Platform,
    /// Whoever asked for the onboarding (a missing ticket, say).
    Requester,
}

/// Something a person has to do (or, in a dry run, something a real run would do).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reason {
    pub action: String,
    pub audience: Audience,
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Vec<String>>,
}

impl Reason {
    pub fn new(
        audience: Audience,
        code: &str,
        action: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            action: action.into(),
            audience,
            code: code.to_owned(),
            message: message.into(),
            resources: None,
        }
    }

    /// Names the resources the reason is about (empty names are dropped: the schema wants
    /// every string non-empty).
    pub fn on(mut self, resources: impl IntoIterator<Item = String>) -> Self {
        let resources: Vec<String> = resources.into_iter().filter(|r| !r.is_empty()).collect();
        self.resources = (!resources.is_empty()).then_some(resources);
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CertificateState {
    Created,
    Adopted,
    NotCreated,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificateOutcome {
    pub primary_domain: String,
    pub state: CertificateState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CleanupState {
    Completed,
    AlreadyClean,
    NotRequired,
    ManualRequired,
    NotReached,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CleanupOutcome {
    pub state: CleanupState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_arn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_attachments: Option<Vec<String>>,
}

impl CleanupOutcome {
    pub fn just(state: CleanupState) -> Self {
        Self {
            state,
            action: None,
            certificate_arn: None,
            remaining_attachments: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DistributionState {
    Created,
    Updated,
    Adopted,
    NotCreated,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Distributions {
    pub cms: DistributionOutcome,
    pub proxy: DistributionOutcome,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistributionOutcome {
    pub state: DistributionState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DomainState {
    Registered,
    AlreadyRegistered,
    NotRegistered,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainOutcome {
    pub name: String,
    pub state: DomainState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyState {
    Updated,
    AlreadyPresent,
    CapacityExhausted,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeyOutcome {
    pub display_name: String,
    pub state: KeyState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MapsState {
    Updated,
    AlreadyPresent,
    ManualRequired,
    NotReached,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MapsOutcome {
    pub keys: Vec<KeyOutcome>,
    pub outcome: MapsState,
    /// How many more root domains fit on the fullest key (its free referrer slots) after this run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_root_domains: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TicketState {
    Updated,
    ManualRequired,
    NotRequested,
    NotReached,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TicketingOutcome {
    pub state: TicketState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intended_action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket_id: Option<String>,
}
