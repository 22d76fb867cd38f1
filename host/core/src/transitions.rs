//! Every move of an execution's status, as one table ([`TABLE`]), and the decision read from it
//! ([`decide`]). Pure: no clock, and no I/O but the test suite's record of the rows it reached.
//! The engine loads the [`Facts`] a move needs, asks [`decide`], and applies the row it gets.
//!
//! Rows are tried in order; the first whose `from` holds the status and whose condition holds
//! decides. "any" means every status; "stays" means the status does not change.
//!
//! What moves an execution: a request (trigger and the control commands, each answered), a
//! worker claiming its run, the guest's outcome, a cancel reaching the run, and a rollback run
//! ending. Time and leases move runs, not executions: a wake time, an approval or a converged
//! condition makes a waiting run claimable, and a lapsed lease makes a running one claimable
//! again; the claim rows say what each claim does to the execution.
//!
//! | from | on | when | to | event | answer |
//! |---|---|---|---|---|---|
//! | (new) | trigger | a worker slot is free | running | ExecutionQueued, ExecutionStarted | 202 the status committed |
//! | (new) | trigger | always | queued | ExecutionQueued | 202 the status committed |
//! | paused, succeeded, failed, canceled, rolled_back | claim | always | stays | — | — |
//! | queued, running, waiting | claim | the run's component is not loaded | paused | ExecutionPaused | — |
//! | queued, waiting | claim | always | running | ExecutionStarted | — |
//! | running | claim | always | running | — | — |
//! | running | guest returns | always | succeeded | ExecutionSucceeded | — |
//! | running | guest waits | always | waiting | ExecutionWaiting | — |
//! | running | guest fails | the error is transient, or the replay diverged | paused | ExecutionPaused | — |
//! | running | guest fails | the error is `canceled` and the workflow cancels cooperatively | canceled | ExecutionCanceled | — |
//! | running | guest fails | always | failed | ExecutionFailed | — |
//! | queued, running, waiting, paused | cancel stops the run | always | canceled | ExecutionCanceled | — |
//! | succeeded, failed, canceled, paused | rollback run ends | a compensation failed permanently | stays | RollbackFailed | — |
//! | succeeded, failed, canceled, paused | rollback run ends | always | rolled_back | ExecutionRolledBack | — |
//! | succeeded, failed, canceled, rolled_back | cancel | always | stays | — | 409 not_cancelable |
//! | queued, running, waiting | cancel | the workflow cancels cooperatively | stays | ExecutionCancellationRequested | 202 cancellation_requested |
//! | queued, running, waiting, paused | cancel | its point of no return has begun | stays | — | 409 past_point_of_no_return |
//! | queued, running, waiting | cancel | a worker holds the run | stays | ExecutionCancellationRequested | 202 cancellation_requested |
//! | queued, running, waiting, paused | cancel | always | canceled | ExecutionCanceled | 202 canceled |
//! | any | resume | the same command is pending | stays | — | 202 retry_already_queued |
//! | any | resume | another command is pending | stays | — | 409 command_pending |
//! | paused | resume | always | queued | CommandQueued, ExecutionQueued | 202 retry_queued |
//! | failed, canceled | resume | the workflow resumes failed runs | queued | CommandQueued, ExecutionQueued | 202 retry_queued |
//! | any | resume | always | stays | — | 409 not_resumable |
//! | any | recover | the same command is pending | stays | — | 202 the pending command |
//! | any | recover | another command is pending | stays | — | 409 command_pending |
//! | any | recover | the execution has no source run | stays | — | 409 no_source_run |
//! | any | recover | the run's component is not loaded | stays | — | 409 component_missing |
//! | any | recover | the workflow does not declare it | stays | — | 409 not_supported |
//! | any | recover | the status or outcome is not the one it declares | stays | — | 409 not_eligible |
//! | any | recover | the run never reached its stage | stays | — | 409 not_eligible |
//! | any | recover | always | queued | CommandQueued, ExecutionQueued | 202 queued |
//! | any | rollback | the same command is pending | stays | — | 202 the pending command |
//! | any | rollback | another command is pending | stays | — | 409 command_pending |
//! | queued, running, waiting | rollback | always | stays | — | 409 not_rollbackable |
//! | rolled_back | rollback | always | stays | — | 409 not_rollbackable |
//! | paused | rollback | the workflow rolls back only terminal executions | stays | — | 409 not_rollbackable |
//! | succeeded, failed, canceled, paused | rollback | nothing to compensate | rolled_back | ExecutionRolledBack | 200 rolled_back |
//! | succeeded, failed, canceled, paused | rollback | always | stays | CommandQueued, RollbackStarted | 202 queued |
//! | queued, running, paused, succeeded, failed, canceled, rolled_back | approve | always | stays | — | 409 not_waiting |
//! | waiting | approve | it waits for no approval | stays | — | 409 not_waiting |
//! | waiting | approve | it was approved already | stays | — | 409 already_approved |
//! | waiting | approve | the plan hash is not the current one | stays | — | 409 stale_plan_hash |
//! | waiting | approve | always | stays | — | 202 approved (the run wakes) |
//!
//! `tests` renders [`TABLE`] and checks it against this page, and checks that every row of a
//! command can be reached through [`decide`].

use crate::execution::ExecutionStatus;

/// What moves an execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    Trigger,
    Claim,
    GuestReturns,
    GuestWaits,
    GuestFails,
    RunStopped,
    RollbackRunEnds,
    /// Control commands: the rows [`decide`] reads.
    Cancel,
    Resume,
    Recover,
    Rollback,
    Approve,
}

impl On {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Trigger => "trigger",
            Self::Claim => "claim",
            Self::GuestReturns => "guest returns",
            Self::GuestWaits => "guest waits",
            Self::GuestFails => "guest fails",
            Self::RunStopped => "cancel stops the run",
            Self::RollbackRunEnds => "rollback run ends",
            Self::Cancel => "cancel",
            Self::Resume => "resume",
            Self::Recover => "recover",
            Self::Rollback => "rollback",
            Self::Approve => "approve",
        }
    }

    /// After this move the execution has no run under way: the guest's outcome but a wait, a
    /// cancel stopping the run, the rollback run's end.
    fn ends_run(self) -> bool {
        matches!(
            self,
            Self::GuestReturns | Self::GuestFails | Self::RunStopped | Self::RollbackRunEnds
        )
    }

    pub fn is_command(self) -> bool {
        matches!(
            self,
            Self::Cancel | Self::Resume | Self::Recover | Self::Rollback | Self::Approve
        )
    }
}

/// What the engine knows when it decides. A command fills what its rows read; the rest keep
/// their defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// The operation of the execution's pending command (queued or active), if any.
    pub pending: Option<String>,
    /// The recovery operation asked for (`retry-finalization`, ...).
    pub operation: Option<String>,
    pub cooperative: bool,
    pub past_point_of_no_return: bool,
    pub leased: bool,
    pub resumable_when_failed: bool,
    pub no_source_run: bool,
    pub component_missing: bool,
    pub not_declared: bool,
    /// The declared recovery does not apply to this status or outcome.
    pub not_eligible: bool,
    pub stage_not_reached: bool,
    pub rollback_requires_terminal: bool,
    pub nothing_to_compensate: bool,
    pub no_approval_wait: bool,
    pub already_approved: bool,
    pub stale_digest: bool,
    /// A worker slot is free when the trigger commits: the execution starts at once.
    pub slot_free: bool,
    /// The guest's error is transient.
    pub transient: bool,
    /// The replay diverged from the journal.
    pub diverged: bool,
    /// The guest stopped with `canceled` because a cooperative cancel asked it to.
    pub stopped_on_request: bool,
    /// A compensation of the rollback run failed permanently.
    pub compensation_failed: bool,
}

/// When a row applies, beyond its `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Always,
    SlotFree,
    PausesOnError,
    StoppedOnRequest,
    CompensationFailed,
    PendingSame,
    PendingOther,
    Cooperative,
    PastPointOfNoReturn,
    Leased,
    ResumableWhenFailed,
    NoSourceRun,
    ComponentMissing,
    NotDeclared,
    NotEligible,
    StageNotReached,
    RollbackRequiresTerminal,
    NothingToCompensate,
    NoApprovalWait,
    AlreadyApproved,
    StaleDigest,
}

impl When {
    fn holds(self, on: On, facts: &Facts) -> bool {
        let same = |p: &String| match on {
            On::Resume => p == "resume",
            On::Rollback => p == "rollback",
            On::Recover => facts.operation.as_ref() == Some(p),
            _ => false,
        };
        match self {
            Self::Always => true,
            Self::SlotFree => facts.slot_free,
            Self::PausesOnError => facts.transient || facts.diverged,
            Self::StoppedOnRequest => facts.stopped_on_request,
            Self::CompensationFailed => facts.compensation_failed,
            Self::PendingSame => facts.pending.as_ref().is_some_and(same),
            Self::PendingOther => facts.pending.as_ref().is_some_and(|p| !same(p)),
            Self::Cooperative => facts.cooperative,
            Self::PastPointOfNoReturn => facts.past_point_of_no_return,
            Self::Leased => facts.leased,
            Self::ResumableWhenFailed => facts.resumable_when_failed,
            Self::NoSourceRun => facts.no_source_run,
            Self::ComponentMissing => facts.component_missing,
            Self::NotDeclared => facts.not_declared,
            Self::NotEligible => facts.not_eligible,
            Self::StageNotReached => facts.stage_not_reached,
            Self::RollbackRequiresTerminal => facts.rollback_requires_terminal,
            Self::NothingToCompensate => facts.nothing_to_compensate,
            Self::NoApprovalWait => facts.no_approval_wait,
            Self::AlreadyApproved => facts.already_approved,
            Self::StaleDigest => facts.stale_digest,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Always => "always",
            Self::SlotFree => "a worker slot is free",
            Self::PausesOnError => "the error is transient, or the replay diverged",
            Self::StoppedOnRequest => {
                "the error is `canceled` and the workflow cancels cooperatively"
            }
            Self::CompensationFailed => "a compensation failed permanently",
            Self::PendingSame => "the same command is pending",
            Self::PendingOther => "another command is pending",
            Self::Cooperative => "the workflow cancels cooperatively",
            Self::PastPointOfNoReturn => "its point of no return has begun",
            Self::Leased => "a worker holds the run",
            Self::ResumableWhenFailed => "the workflow resumes failed runs",
            Self::NoSourceRun => "the execution has no source run",
            Self::ComponentMissing => "the run's component is not loaded",
            Self::NotDeclared => "the workflow does not declare it",
            Self::NotEligible => "the status or outcome is not the one it declares",
            Self::StageNotReached => "the run never reached its stage",
            Self::RollbackRequiresTerminal => "the workflow rolls back only terminal executions",
            Self::NothingToCompensate => "nothing to compensate",
            Self::NoApprovalWait => "it waits for no approval",
            Self::AlreadyApproved => "it was approved already",
            Self::StaleDigest => "the plan hash is not the current one",
        }
    }
}

/// What a command's answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Not a command: nobody is answered.
    None,
    /// 202 with the status the trigger committed.
    Triggered,
    /// 202 `status: cancellation_requested`.
    CancellationRequested,
    /// 202 with the execution canceled.
    Canceled,
    /// 202 `status: retry_queued` (resume) or the new command (recoveries).
    Queued,
    /// 202 the pending command again (`retry_already_queued` for a resume).
    Pending,
    /// 200 rolled back at once.
    RolledBack,
    /// 202 the plan is approved; the run wakes.
    Approved,
    /// 409 `state_invalid` with this reason.
    Refused(&'static str),
}

impl Answer {
    fn as_str(self, on: On) -> String {
        match self {
            Self::None => "—".to_owned(),
            Self::Triggered => "202 the status committed".to_owned(),
            Self::CancellationRequested => "202 cancellation_requested".to_owned(),
            Self::Canceled => "202 canceled".to_owned(),
            Self::Queued if on == On::Resume => "202 retry_queued".to_owned(),
            Self::Queued => "202 queued".to_owned(),
            Self::Pending if on == On::Resume => "202 retry_already_queued".to_owned(),
            Self::Pending => "202 the pending command".to_owned(),
            Self::RolledBack => "200 rolled_back".to_owned(),
            Self::Approved => "202 approved (the run wakes)".to_owned(),
            Self::Refused(reason) => format!("409 {reason}"),
        }
    }
}

/// One move. `to: None` keeps the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// Empty: any status (or, for a trigger, a new execution).
    pub from: &'static [ExecutionStatus],
    pub on: On,
    pub when: When,
    pub to: Option<ExecutionStatus>,
    pub events: &'static [&'static str],
    pub answer: Answer,
}

use ExecutionStatus::{
    Canceled as CANCELED, Failed as FAILED, Paused as PAUSED, Queued as QUEUED,
    RolledBack as ROLLED_BACK, Running as RUNNING, Succeeded as SUCCEEDED, Waiting as WAITING,
};

const ANY: &[ExecutionStatus] = &[];
const ACTIVE: &[ExecutionStatus] = &[QUEUED, RUNNING, WAITING];
const CANCELABLE: &[ExecutionStatus] = &[QUEUED, RUNNING, WAITING, PAUSED];
const FINISHED: &[ExecutionStatus] = &[SUCCEEDED, FAILED, CANCELED, ROLLED_BACK];
/// Where a claimed run has nothing to do: it ends and the execution stays.
const RESTING: &[ExecutionStatus] = &[PAUSED, SUCCEEDED, FAILED, CANCELED, ROLLED_BACK];
const ROLLBACKABLE: &[ExecutionStatus] = &[SUCCEEDED, FAILED, CANCELED, PAUSED];
const NOT_WAITING: &[ExecutionStatus] = &[
    QUEUED,
    RUNNING,
    PAUSED,
    SUCCEEDED,
    FAILED,
    CANCELED,
    ROLLED_BACK,
];

const fn row(
    from: &'static [ExecutionStatus],
    on: On,
    when: When,
    to: Option<ExecutionStatus>,
    events: &'static [&'static str],
    answer: Answer,
) -> Row {
    Row {
        from,
        on,
        when,
        to,
        events,
        answer,
    }
}

const REQUEUED: &[&str] = &["CommandQueued", "ExecutionQueued"];

/// A guest's permanent failure (error, trap, limit): the last row of its outcomes.
const GUEST_FAILS: Row = row(
    &[RUNNING],
    On::GuestFails,
    When::Always,
    Some(FAILED),
    &["ExecutionFailed"],
    Answer::None,
);

/// Every transition, in the order [`decide`] tries them.
#[rustfmt::skip]
pub static TABLE: &[Row] = &[
    row(ANY, On::Trigger, When::SlotFree, Some(RUNNING), &["ExecutionQueued", "ExecutionStarted"], Answer::Triggered),
    row(ANY, On::Trigger, When::Always, Some(QUEUED), &["ExecutionQueued"], Answer::Triggered),
    row(RESTING, On::Claim, When::Always, None, &[], Answer::None),
    row(ACTIVE, On::Claim, When::ComponentMissing, Some(PAUSED), &["ExecutionPaused"], Answer::None),
    row(&[QUEUED, WAITING], On::Claim, When::Always, Some(RUNNING), &["ExecutionStarted"], Answer::None),
    row(&[RUNNING], On::Claim, When::Always, Some(RUNNING), &[], Answer::None),
    row(&[RUNNING], On::GuestReturns, When::Always, Some(SUCCEEDED), &["ExecutionSucceeded"], Answer::None),
    row(&[RUNNING], On::GuestWaits, When::Always, Some(WAITING), &["ExecutionWaiting"], Answer::None),
    row(&[RUNNING], On::GuestFails, When::PausesOnError, Some(PAUSED), &["ExecutionPaused"], Answer::None),
    row(&[RUNNING], On::GuestFails, When::StoppedOnRequest, Some(CANCELED), &["ExecutionCanceled"], Answer::None),
    GUEST_FAILS,
    row(CANCELABLE, On::RunStopped, When::Always, Some(CANCELED), &["ExecutionCanceled"], Answer::None),
    row(ROLLBACKABLE, On::RollbackRunEnds, When::CompensationFailed, None, &["RollbackFailed"], Answer::None),
    row(ROLLBACKABLE, On::RollbackRunEnds, When::Always, Some(ROLLED_BACK), &["ExecutionRolledBack"], Answer::None),
    // cancel
    row(FINISHED, On::Cancel, When::Always, None, &[], Answer::Refused("not_cancelable")),
    row(ACTIVE, On::Cancel, When::Cooperative, None, &["ExecutionCancellationRequested"], Answer::CancellationRequested),
    row(CANCELABLE, On::Cancel, When::PastPointOfNoReturn, None, &[], Answer::Refused("past_point_of_no_return")),
    row(ACTIVE, On::Cancel, When::Leased, None, &["ExecutionCancellationRequested"], Answer::CancellationRequested),
    row(CANCELABLE, On::Cancel, When::Always, Some(CANCELED), &["ExecutionCanceled"], Answer::Canceled),
    // resume
    row(ANY, On::Resume, When::PendingSame, None, &[], Answer::Pending),
    row(ANY, On::Resume, When::PendingOther, None, &[], Answer::Refused("command_pending")),
    row(&[PAUSED], On::Resume, When::Always, Some(QUEUED), REQUEUED, Answer::Queued),
    row(&[FAILED, CANCELED], On::Resume, When::ResumableWhenFailed, Some(QUEUED), REQUEUED, Answer::Queued),
    row(ANY, On::Resume, When::Always, None, &[], Answer::Refused("not_resumable")),
    // recover
    row(ANY, On::Recover, When::PendingSame, None, &[], Answer::Pending),
    row(ANY, On::Recover, When::PendingOther, None, &[], Answer::Refused("command_pending")),
    row(ANY, On::Recover, When::NoSourceRun, None, &[], Answer::Refused("no_source_run")),
    row(ANY, On::Recover, When::ComponentMissing, None, &[], Answer::Refused("component_missing")),
    row(ANY, On::Recover, When::NotDeclared, None, &[], Answer::Refused("not_supported")),
    row(ANY, On::Recover, When::NotEligible, None, &[], Answer::Refused("not_eligible")),
    row(ANY, On::Recover, When::StageNotReached, None, &[], Answer::Refused("not_eligible")),
    row(ANY, On::Recover, When::Always, Some(QUEUED), REQUEUED, Answer::Queued),
    // rollback
    row(ANY, On::Rollback, When::PendingSame, None, &[], Answer::Pending),
    row(ANY, On::Rollback, When::PendingOther, None, &[], Answer::Refused("command_pending")),
    row(ACTIVE, On::Rollback, When::Always, None, &[], Answer::Refused("not_rollbackable")),
    row(&[ROLLED_BACK], On::Rollback, When::Always, None, &[], Answer::Refused("not_rollbackable")),
    row(&[PAUSED], On::Rollback, When::RollbackRequiresTerminal, None, &[], Answer::Refused("not_rollbackable")),
    row(ROLLBACKABLE, On::Rollback, When::NothingToCompensate, Some(ROLLED_BACK), &["ExecutionRolledBack"], Answer::RolledBack),
    row(ROLLBACKABLE, On::Rollback, When::Always, None, &["CommandQueued", "RollbackStarted"], Answer::Queued),
    // approve
    row(NOT_WAITING, On::Approve, When::Always, None, &[], Answer::Refused("not_waiting")),
    row(&[WAITING], On::Approve, When::NoApprovalWait, None, &[], Answer::Refused("not_waiting")),
    row(&[WAITING], On::Approve, When::AlreadyApproved, None, &[], Answer::Refused("already_approved")),
    row(&[WAITING], On::Approve, When::StaleDigest, None, &[], Answer::Refused("stale_plan_hash")),
    row(&[WAITING], On::Approve, When::Always, None, &[], Answer::Approved),
];

/// The row that decides `on` for an execution in `status`: the first whose `from` holds
/// `status` and whose condition holds. Every command's last row holds always, so a command
/// always gets a row; `None` when nothing moves an execution in `status` on `on` (a guest
/// outcome of a run that is not running).
pub fn decide(on: On, status: ExecutionStatus, facts: &Facts) -> Option<&'static Row> {
    let (index, row) = TABLE.iter().enumerate().find(|(_, r)| {
        r.on == on && (r.from.is_empty() || r.from.contains(&status)) && r.when.holds(on, facts)
    })?;
    witness::saw(index);
    Some(row)
}

/// The test suite's record of which rows were decided, so that `just test` can name the rows
/// no test reached. `CAPSTAN_TRANSITIONS_WITNESS` names a directory; a process appends a row's
/// index to its own file there the first time it decides that row. Unset, as in production,
/// nothing is written and a decision costs one atomic read more.
mod witness {
    /// Not in this crate's own unit tests: they decide every row on purpose.
    #[cfg(test)]
    pub(super) fn saw(_: usize) {}

    #[cfg(not(test))]
    pub(super) use record::saw;

    #[cfg(not(test))]
    mod record {
        use std::io::Write as _;
        use std::path::PathBuf;
        use std::sync::OnceLock;
        use std::sync::atomic::{AtomicU64, Ordering};

        static SEEN: AtomicU64 = AtomicU64::new(0);
        static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();

        pub(in super::super) fn saw(index: usize) {
            let Some(dir) = DIR
                .get_or_init(|| std::env::var_os("CAPSTAN_TRANSITIONS_WITNESS").map(PathBuf::from))
            else {
                return;
            };
            let bit = 1u64 << (index % 64);
            if SEEN.fetch_or(bit, Ordering::Relaxed) & bit != 0 {
                return;
            }
            let _ = std::fs::create_dir_all(dir);
            if let Ok(mut file) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(std::process::id().to_string()))
            {
                let _ = writeln!(file, "{index}");
            }
        }
    }
}

/// The row a running execution follows on its guest's outcome (`GuestReturns`, `GuestWaits`
/// or `GuestFails`). Each outcome's last row from `running` holds always (the tests check it),
/// so the fallback is never taken.
pub fn on_guest_outcome(on: On, facts: &Facts) -> &'static Row {
    decide(on, ExecutionStatus::Running, facts).unwrap_or(&GUEST_FAILS)
}

/// Whether an execution has come to rest with an event of `event_type`, which says the execution
/// is in `status` (read only when it matters): the event is the last of a row that moves the
/// execution to a terminal status ([`ExecutionStatus::is_terminal`]), or of a row that ends its
/// run and leaves it where it was, when that is a terminal status (a rollback whose compensation
/// failed, `RollbackFailed`, on a succeeded execution). Such an event is the last one written
/// until a command (resume, rollback) moves the execution again, so an execution's own feed can
/// end after it (`host/api`'s streams).
pub fn comes_to_rest(event_type: &str, status: impl FnOnce() -> Option<ExecutionStatus>) -> bool {
    // Every event an execution's feed sends is asked about: the rows that cannot bring it to
    // rest are passed over before their events' names are compared.
    let mut stays_at_run_end = false;
    for r in TABLE {
        let may_rest = match r.to {
            Some(to) => to.is_terminal(),
            None => r.on.ends_run(),
        };
        if may_rest && r.events.last() == Some(&event_type) {
            if r.to.is_some() {
                return true;
            }
            stays_at_run_end = true;
        }
    }
    stays_at_run_end && status().is_some_and(ExecutionStatus::is_terminal)
}

/// The table as the markdown of this module's documentation.
pub fn render() -> Vec<String> {
    TABLE
        .iter()
        .map(|r| {
            let from = if r.from.is_empty() {
                if r.on == On::Trigger { "(new)" } else { "any" }.to_owned()
            } else {
                r.from
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let to = r.to.map_or("stays", ExecutionStatus::as_str);
            let events = if r.events.is_empty() {
                "—".to_owned()
            } else {
                r.events.join(", ")
            };
            format!(
                "| {from} | {} | {} | {to} | {events} | {} |",
                r.on.as_str(),
                r.when.as_str(),
                r.answer.as_str(r.on)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_table_is_the_code_table() {
        let doc: Vec<String> = include_str!("transitions.rs")
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .filter_map(|l| l.strip_prefix("//! "))
            .filter(|l| l.starts_with("| ") && !l.starts_with("| from ") && !l.starts_with("|---"))
            .map(str::to_owned)
            .collect();
        let rendered = render();
        assert_eq!(
            doc,
            rendered,
            "the table in this module's documentation is not TABLE; it should read:\n{}",
            rendered
                .iter()
                .map(|l| format!("//! {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// An event that brings an execution to rest is written only by a move to a terminal
    /// status or by the end of a run that keeps the status, and last in it: what follows it was
    /// caused by a later command.
    #[test]
    fn an_execution_comes_to_rest_only_at_the_end_of_a_move_that_leaves_it_finished() {
        let terminal = |e: &str| comes_to_rest(e, || None);
        let resting: Vec<&str> = TABLE
            .iter()
            .flat_map(|r| r.events.iter().copied())
            .filter(|e| terminal(e))
            .collect();
        for event in [
            "ExecutionSucceeded",
            "ExecutionFailed",
            "ExecutionCanceled",
            "ExecutionRolledBack",
        ] {
            assert!(resting.contains(&event), "{event}");
        }
        for event in [
            "ExecutionQueued",
            "ExecutionPaused",
            "ExecutionWaiting",
            "RollbackStarted",
            "ExecutionCancellationRequested",
        ] {
            for status in ExecutionStatus::ALL {
                assert!(!comes_to_rest(event, || Some(status)), "{event} {status:?}");
            }
        }
        // A failed rollback leaves the execution where it was: at rest when that is terminal.
        for status in ExecutionStatus::ALL {
            assert_eq!(
                comes_to_rest("RollbackFailed", || Some(status)),
                status.is_terminal(),
                "{status:?}"
            );
        }
        assert!(!comes_to_rest("RollbackFailed", || None));
        for row in TABLE {
            for (i, event) in row.events.iter().enumerate() {
                if comes_to_rest(event, || Some(ExecutionStatus::Succeeded)) {
                    assert!(
                        (row.to.is_some_and(ExecutionStatus::is_terminal)
                            || (row.to.is_none() && row.on.ends_run()))
                            && i + 1 == row.events.len(),
                        "{event} in {row:?}"
                    );
                }
            }
        }
    }

    /// Every row is some status's decision under some facts: no row is shadowed.
    #[test]
    fn every_row_can_decide() {
        let flags: [fn(&mut Facts); 20] = [
            |f| f.slot_free = true,
            |f| f.transient = true,
            |f| f.diverged = true,
            |f| f.stopped_on_request = true,
            |f| f.compensation_failed = true,
            |f| f.cooperative = true,
            |f| f.past_point_of_no_return = true,
            |f| f.leased = true,
            |f| f.resumable_when_failed = true,
            |f| f.no_source_run = true,
            |f| f.component_missing = true,
            |f| f.not_declared = true,
            |f| f.not_eligible = true,
            |f| f.stage_not_reached = true,
            |f| f.rollback_requires_terminal = true,
            |f| f.nothing_to_compensate = true,
            |f| f.no_approval_wait = true,
            |f| f.already_approved = true,
            |f| f.stale_digest = true,
            |_| {},
        ];
        for (i, wanted) in TABLE.iter().enumerate() {
            let mut reached = false;
            for status in ExecutionStatus::ALL {
                for pending in [
                    None,
                    Some("resume"),
                    Some("rollback"),
                    Some("retry-finalization"),
                ] {
                    for flag in flags {
                        let mut facts = Facts {
                            pending: pending.map(str::to_owned),
                            operation: Some("retry-finalization".to_owned()),
                            ..Facts::default()
                        };
                        flag(&mut facts);
                        if decide(wanted.on, status, &facts) == Some(&TABLE[i]) {
                            reached = true;
                        }
                    }
                }
            }
            assert!(
                reached,
                "row {i} ({:?} {:?}) never decides",
                wanted.on, wanted.when
            );
        }
    }

    #[test]
    fn the_witness_has_a_bit_for_every_row() {
        assert!(TABLE.len() <= 64, "witness::SEEN holds 64 rows");
    }

    #[test]
    fn every_guest_outcome_of_a_running_execution_has_a_row() {
        for on in [On::GuestReturns, On::GuestWaits, On::GuestFails] {
            let row = decide(on, ExecutionStatus::Running, &Facts::default());
            assert!(
                row.is_some_and(|r| r.when == When::Always && r.on == on),
                "{on:?}"
            );
        }
    }

    #[test]
    fn every_command_from_every_status_gets_a_row() {
        for on in [
            On::Cancel,
            On::Resume,
            On::Recover,
            On::Rollback,
            On::Approve,
        ] {
            for status in ExecutionStatus::ALL {
                assert!(
                    decide(on, status, &Facts::default()).is_some(),
                    "{on:?} {status:?}"
                );
            }
        }
    }

    #[test]
    fn the_control_answers_of_the_orchestration_document() {
        use ExecutionStatus::*;
        let facts = Facts::default();
        let answer = |on, status, facts: &Facts| decide(on, status, facts).map(|r| r.answer);
        // Resume only from paused; a fresh queued execution is not "already queued".
        assert_eq!(answer(On::Resume, Paused, &facts), Some(Answer::Queued));
        assert_eq!(
            answer(On::Resume, Queued, &facts),
            Some(Answer::Refused("not_resumable"))
        );
        let pending_resume = Facts {
            pending: Some("resume".into()),
            ..Facts::default()
        };
        assert_eq!(
            answer(On::Resume, Running, &pending_resume),
            Some(Answer::Pending)
        );
        // A pending rollback is not a queued retry.
        let pending_rollback = Facts {
            pending: Some("rollback".into()),
            ..Facts::default()
        };
        assert_eq!(
            answer(On::Resume, Paused, &pending_rollback),
            Some(Answer::Refused("command_pending"))
        );
        // A leased run's cancel is requested, not done.
        let leased = Facts {
            leased: true,
            ..Facts::default()
        };
        assert_eq!(
            answer(On::Cancel, Running, &leased),
            Some(Answer::CancellationRequested)
        );
        // update-function-version rolls back only from a terminal status.
        let terminal_only = Facts {
            rollback_requires_terminal: true,
            ..Facts::default()
        };
        assert_eq!(
            answer(On::Rollback, Paused, &terminal_only),
            Some(Answer::Refused("not_rollbackable"))
        );
        assert_eq!(
            answer(On::Rollback, Failed, &terminal_only),
            Some(Answer::Queued)
        );
    }
}
