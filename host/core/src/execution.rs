//! Executions, stages, runs and the status machine, as plain data and pure functions.
//!
//! The status machine (DESIGN.md §3), every move and every control answer, is one table:
//! [`crate::transitions`].

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Execution status, exactly the document's enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    Queued,
    Running,
    Waiting,
    Paused,
    Succeeded,
    Failed,
    Canceled,
    RolledBack,
}

impl ExecutionStatus {
    pub const ALL: [ExecutionStatus; 8] = [
        Self::Canceled,
        Self::Failed,
        Self::Paused,
        Self::Queued,
        Self::RolledBack,
        Self::Running,
        Self::Succeeded,
        Self::Waiting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Paused => "paused",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::RolledBack => "rolled_back",
        }
    }

    /// No further work happens without a command.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::Failed | Self::Canceled | Self::RolledBack
        )
    }

    /// The engine moves it on by itself (no wait, approval, pause or end in the way): what a
    /// long poll of the execution waits out.
    pub fn is_moving(self) -> bool {
        matches!(self, Self::Queued | Self::Running)
    }

    /// A run is in flight: the engine may still act on it.
    pub fn is_active(self) -> bool {
        matches!(self, Self::Queued | Self::Running | Self::Waiting)
    }
}

impl fmt::Display for ExecutionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown status `{0}` (expected one of canceled, failed, paused, queued, rolled_back, running, succeeded, waiting)"
)]
pub struct UnknownStatus(pub String);

impl FromStr for ExecutionStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

/// Stage status, exactly the document's enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageStatus {
    Running,
    Waiting,
    Succeeded,
    Failed,
}

impl StageStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }
}

impl FromStr for StageStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Self::Running, Self::Waiting, Self::Succeeded, Self::Failed]
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_and_classify() {
        for s in ExecutionStatus::ALL {
            assert_eq!(s.as_str().parse::<ExecutionStatus>(), Ok(s));
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::json!(s.as_str())
            );
            assert!(!(s.is_terminal() && s.is_active()));
        }
        assert!("done".parse::<ExecutionStatus>().is_err());
    }
}
