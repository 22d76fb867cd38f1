//! The control commands, one file each. Each loads the [`Facts`] its rows of
//! [`capstan_core::transitions::TABLE`] read, asks `decide` for the row, and applies it.
//!
//! - `cancel` — cancel.
//! - `requeue` — resume and the recovery operations, on the run's command lane.
//! - `rollback` — rollback and the rollback run.
//! - `approve` — plan approval.

mod approve;
mod cancel;
mod requeue;
mod rollback;

use crate::{EngineError, invalid};
use capstan_core::execution::ExecutionStatus;
use capstan_core::transitions::{Answer, Facts, On, Row};

/// The row for command `on`, or the refusal it names as the engine's error.
pub(crate) fn decide(
    on: On,
    status: ExecutionStatus,
    facts: &Facts,
    why: impl FnOnce(&'static str) -> String,
) -> Result<&'static Row, EngineError> {
    let row = capstan_core::transitions::decide(on, status, facts)
        .ok_or_else(|| invalid("not_a_command", format!("{} is not a command", on.as_str())))?;
    match row.answer {
        Answer::Refused(reason) => Err(invalid(reason, why(reason))),
        _ => Ok(row),
    }
}
