//! What the node's claimer knows of when runs fall due, so an idle node sleeps instead of polling.
//!
//! Every write the engine commits goes through [`EngineState::apply`], which reads off the batch
//! whether it made a run claimable ([`claimable_at`]): a run inserted without a lease, a lease
//! given up, a run made runnable again. Due now, the claimer is woken to claim at once; due
//! later, the time is noted ([`Schedule::next_ms`]) and the claimer moves its alarm forward. Runs
//! other writers made due (another node's commits, which its `NOTIFY` announces; a lease that
//! expires on a node that died) are found by the claimer's own read of the earliest due time
//! after a claim that found nothing ([`EngineStore::next_wake`]), by other nodes' announcements
//! ([`Engine::spawn_workers`]), and, for anything else, by a claim at least every
//! [`EngineConfig::idle_poll`].

use super::*;
use std::sync::atomic::{AtomicI64, Ordering};

/// The claimer's wake-ups.
#[derive(Debug)]
pub(crate) struct Schedule {
    /// A run may be due now that no claim has taken: claim at once.
    pub now: tokio::sync::Notify,
    /// [`Schedule::next_ms`] moved earlier: the claimer sets its alarm again.
    pub sooner: tokio::sync::Notify,
    /// The earliest time a run this node made claimable is due, since the claimer last took it
    /// into its alarm (`Millis::MAX`: none).
    pub next_ms: AtomicI64,
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            now: tokio::sync::Notify::new(),
            sooner: tokio::sync::Notify::new(),
            next_ms: AtomicI64::new(Millis::MAX),
        }
    }
}

impl Schedule {
    /// A committed batch made a run claimable at `due_ms`.
    ///
    /// `notify_one`, not `notify_waiters`: the node has one claimer, which listens only between
    /// the top of its loop and its next turn, and a wake-up given while it was between two turns
    /// would otherwise be lost; the run would then wait for the claimer's alarm (up to
    /// `idle_poll`, a second by default). `notify_one` keeps it for the claimer's next turn
    /// (which costs at most one claim that finds nothing).
    fn due(&self, due_ms: Millis, now_ms: Millis) {
        if due_ms <= now_ms {
            self.now.notify_one();
        } else if due_ms < self.next_ms.fetch_min(due_ms, Ordering::SeqCst) {
            self.sooner.notify_one();
        }
    }

    /// What was noted since the last call, for the claimer's alarm.
    pub fn take_next(&self) -> Option<Millis> {
        Some(self.next_ms.swap(Millis::MAX, Ordering::SeqCst)).filter(|ms| *ms != Millis::MAX)
    }
}

/// When the earliest run `writes` makes claimable falls due, if they make one so: a run inserted
/// runnable without a lease, a patch that gives a run's lease up while it stays (or becomes)
/// runnable, a patch that makes a run runnable. A patch that leaves `wake_ms` as it was counts as
/// due now (a claim that finds it not yet due costs one empty claim).
pub(crate) fn claimable_at(writes: &[Write], now_ms: Millis) -> Option<Millis> {
    writes
        .iter()
        .filter_map(|w| match w {
            Write::InsertRun(run)
                if run.state == RunState::Runnable && run.lease_owner.is_none() =>
            {
                Some(run.wake_ms)
            }
            Write::UpdateRun(patch)
                if patch.state == Some(RunState::Runnable)
                    || (patch.release_lease && patch.state.is_none()) =>
            {
                Some(patch.wake_ms.unwrap_or(now_ms))
            }
            _ => None,
        })
        .min()
}

impl EngineState {
    /// Commits `writes` (under `fence`) and tells the claimer about the runs they made claimable.
    /// The engine's every write goes through here, so no path can forget to wake the claimer.
    pub(crate) async fn apply(
        &self,
        fence: Option<&Fence>,
        writes: Vec<Write>,
    ) -> Result<(), StoreError> {
        let due = claimable_at(&writes, self.now());
        self.store.apply(fence, writes).await?;
        if let Some(due) = due {
            self.schedule.due(due, self.now());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(state: RunState, lease_owner: Option<&str>, wake_ms: Millis) -> Write {
        Write::InsertRun(RunRecord {
            id: "r".into(),
            execution_id: "e".into(),
            workflow: "w".into(),
            digest: "d".into(),
            kind: RunKind::Workflow,
            state,
            wake_ms,
            lease_owner: lease_owner.map(str::to_owned),
            lease_expires_ms: lease_owner.map(|_| wake_ms + 30_000),
            activations: 0,
            cancel_requested: false,
            created_ms: 0,
            epoch: 0,
        })
    }

    fn patch(state: Option<RunState>, wake_ms: Option<Millis>, release_lease: bool) -> Write {
        Write::UpdateRun(RunPatch {
            id: "r".into(),
            state,
            wake_ms,
            release_lease,
            cancel_requested: None,
        })
    }

    #[test]
    fn batches_that_make_a_run_claimable_say_when() {
        let now = 1_000;
        // A trigger with no free slot: its run waits for a claim.
        assert_eq!(
            claimable_at(&[run(RunState::Runnable, None, now)], now),
            Some(now)
        );
        // A trigger that started its run itself: leased to this node, nothing to claim.
        assert_eq!(
            claimable_at(&[run(RunState::Runnable, Some("me"), now)], now),
            None
        );
        // A timer: the run gives its lease up and is due later.
        assert_eq!(
            claimable_at(
                &[patch(Some(RunState::Runnable), Some(now + 500), true)],
                now
            ),
            Some(now + 500)
        );
        // An approval: a waiting run made runnable now.
        assert_eq!(
            claimable_at(&[patch(Some(RunState::Runnable), Some(now), false)], now),
            Some(now)
        );
        // A lease given up with the wake time unchanged: due as far as the engine knows.
        assert_eq!(claimable_at(&[patch(None, None, true)], now), Some(now));
        // The earliest of several.
        assert_eq!(
            claimable_at(
                &[
                    patch(Some(RunState::Runnable), Some(now + 500), true),
                    run(RunState::Runnable, None, now + 100),
                ],
                now
            ),
            Some(now + 100)
        );
    }

    #[test]
    fn batches_that_make_nothing_claimable_say_nothing() {
        let now = 1_000;
        // Finished, or waiting for an approval: no claim will take it.
        assert_eq!(
            claimable_at(&[patch(Some(RunState::Done), None, true)], now),
            None
        );
        assert_eq!(
            claimable_at(&[patch(Some(RunState::Waiting), Some(now), true)], now),
            None
        );
        assert_eq!(
            claimable_at(&[run(RunState::Waiting, None, now)], now),
            None
        );
        // A cancel flag on a run whose lease is kept.
        assert_eq!(
            claimable_at(
                &[Write::UpdateRun(RunPatch {
                    id: "r".into(),
                    cancel_requested: Some(true),
                    ..RunPatch::default()
                })],
                now
            ),
            None
        );
        assert_eq!(claimable_at(&[], now), None);
    }

    #[tokio::test]
    async fn the_claimer_hears_of_due_runs_and_of_sooner_ones() {
        let schedule = Schedule::default();
        let now = schedule.now.notified();
        tokio::pin!(now);
        now.as_mut().enable();
        schedule.due(1_000, 1_000);
        assert!(futures_now(now.as_mut()), "a run due now wakes the claimer");
        assert_eq!(schedule.take_next(), None, "and is not noted for later");

        let sooner = schedule.sooner.notified();
        tokio::pin!(sooner);
        sooner.as_mut().enable();
        schedule.due(5_000, 1_000);
        assert!(
            futures_now(sooner.as_mut()),
            "the first later run moves the alarm"
        );
        let later = schedule.sooner.notified();
        tokio::pin!(later);
        later.as_mut().enable();
        schedule.due(9_000, 1_000);
        assert!(!futures_now(later.as_mut()), "a run due after it does not");
        schedule.due(2_000, 1_000);
        assert!(futures_now(later.as_mut()), "one due before it does");
        assert_eq!(schedule.take_next(), Some(2_000));
        assert_eq!(schedule.take_next(), None, "taken once");
    }

    /// A wake-up given while the claimer is between two turns (listening for neither) reaches
    /// its next turn, once.
    #[tokio::test]
    async fn a_wake_up_between_the_claimers_turns_is_kept_for_its_next_turn() {
        let schedule = Schedule::default();
        schedule.due(1_000, 1_000);
        schedule.due(1_000, 1_000);
        schedule.due(5_000, 1_000);
        assert!(turn_takes(&schedule.now), "kept for the next turn");
        assert!(turn_takes(&schedule.sooner), "the sooner alarm too");
        assert_eq!(schedule.take_next(), Some(5_000));
        assert!(!turn_takes(&schedule.now), "two wake-ups make one turn");
    }

    /// A wake-up kept for the claimer's next turn is taken by that turn's `enable`, and the
    /// answer is then its only record: a future dropped before it is awaited (the turn ended on
    /// another branch, a finished task) takes it along. So the claimer acts on what `enable`
    /// answers ([`Engine::spawn_workers`]).
    #[tokio::test]
    async fn a_kept_wake_up_lives_only_in_the_answer_of_the_turn_that_takes_it() {
        let schedule = Schedule::default();
        schedule.due(1_000, 1_000);
        assert!(turn_takes(&schedule.now), "the turn takes it");
        assert!(!turn_takes(&schedule.now), "gone with the dropped turn");
    }

    /// What a claimer's turn does first: listen, taking a wake-up kept for it (the answer),
    /// then drop its future unawaited, as a turn another branch ended does.
    fn turn_takes(notify: &tokio::sync::Notify) -> bool {
        let turn = notify.notified();
        tokio::pin!(turn);
        turn.as_mut().enable()
    }

    /// Whether a future is ready without waiting.
    fn futures_now<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> bool {
        let waker = std::task::Waker::noop();
        f.poll(&mut std::task::Context::from_waker(waker))
            .is_ready()
    }
}
