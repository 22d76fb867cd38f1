//! Wake-ups for what waits on outbox events.
//!
//! A reader of every event (the shared SSE stream, the webhook relay) is woken by every commit
//! that wrote events. A waiter for one execution (`GET /v1/executions/{id}?wait=`, the
//! execution's own event feed) is woken only by commits that wrote that execution's events:
//! with 32 clients each awaiting its own execution, a commit wakes one of them, not all 32, and
//! the others do not read their execution again for nothing. A waiter for the execution to stop
//! moving (the long poll) is woken only by the commit that takes it out of `queued`/`running`,
//! not by each of the stage events before. Another node's commit wakes the same waiters, from the
//! executions its `NOTIFY` names ([`Announcement`]). Events this node cannot attribute (a
//! redelivery, a `NOTIFY` that names no executions) wake every waiter.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::watch;

/// What a waiter of one execution is woken by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeOn {
    /// Every commit that wrote the execution's events (its event feed).
    Events,
    /// The commit that took it out of `queued`/`running` ([`ExecutionStatus::is_moving`]).
    ///
    /// [`ExecutionStatus::is_moving`]: capstan_core::ExecutionStatus::is_moving
    Stopped,
}

/// One execution's channels, and how many waiters use them.
#[derive(Debug)]
struct Channels {
    events: watch::Sender<u64>,
    stopped: watch::Sender<u64>,
    waiters: usize,
}

/// The per-execution channels of waiters present now.
#[derive(Debug, Default)]
pub(crate) struct ExecutionWakes {
    waiting: Mutex<HashMap<String, Channels>>,
    /// How many executions have waiters: commits skip the lookup when none has.
    executions: AtomicUsize,
}

impl ExecutionWakes {
    /// A channel for one waiter of `execution_id`.
    fn subscribe(
        self: &Arc<Self>,
        execution_id: &str,
        on: WakeOn,
    ) -> (watch::Receiver<u64>, Registered) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let channels = waiting.entry(execution_id.to_owned()).or_insert_with(|| {
            self.executions.fetch_add(1, Ordering::SeqCst);
            Channels {
                events: watch::Sender::new(0),
                stopped: watch::Sender::new(0),
                waiters: 0,
            }
        });
        channels.waiters += 1;
        let sender = match on {
            WakeOn::Events => &channels.events,
            WakeOn::Stopped => &channels.stopped,
        };
        (
            sender.subscribe(),
            Registered {
                wakes: self.clone(),
                execution_id: execution_id.to_owned(),
            },
        )
    }

    /// Wakes the waiters of the executions a commit wrote events of (`moved`) and of those it
    /// took out of `queued`/`running` (`stopped`).
    pub(crate) fn wake<'a>(
        &self,
        moved: impl IntoIterator<Item = &'a str>,
        stopped: impl IntoIterator<Item = &'a str>,
    ) {
        if self.executions.load(Ordering::SeqCst) == 0 {
            return;
        }
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let bump = |sender: &watch::Sender<u64>| sender.send_modify(|n| *n = n.wrapping_add(1));
        for id in moved {
            if let Some(channels) = waiting.get(id) {
                bump(&channels.events);
            }
        }
        for id in stopped {
            if let Some(channels) = waiting.get(id) {
                bump(&channels.stopped);
            }
        }
    }
}

/// The executions a commit concerns: whose events it wrote (their feeds' waiters wake) and
/// which it took out of `queued`/`running` (their long polls answer).
#[derive(Debug, Default, Clone)]
pub(crate) struct Touched {
    pub(crate) moved: Vec<String>,
    pub(crate) stopped: Vec<String>,
}

/// What a PostgreSQL commit that wrote outbox events tells the other nodes (`NOTIFY
/// capstan_events`): the committing node's id, so that its own listener skips it, and, when it
/// fits, the executions whose events it wrote and those it took out of `queued`/`running`.
///
/// Without the executions, another node's waiter of one execution could not tell whether the
/// commit concerns it: every such waiter on every other node read its execution again at every
/// commit of every node, reads multiplied by waiters and nodes for nothing. With them, a foreign
/// commit wakes the waiters it concerns, as a local one does.
///
/// The payload is text: the node's id alone (nothing attributed: wake every waiter), or three
/// lines, the node's id, the ids of the executions whose events the commit wrote, and the ids of
/// those it stopped, each list separated by spaces. Lists longer than [`Announcement::MAX`]
/// bytes together (PostgreSQL refuses a payload of 8,000 bytes or more), or an id with a space
/// or a line break in it, fall back to the node's id alone.
#[derive(Debug, Default)]
pub(crate) struct Announcement {
    moved: String,
    stopped: String,
    /// Too long or not representable: nothing is attributed.
    whole: bool,
}

impl Announcement {
    /// The payload's limit, below PostgreSQL's 8,000 bytes with room for the node's id.
    pub(crate) const MAX: usize = 7_000;

    /// Adds one commit's executions (a group carries several).
    pub(crate) fn add(&mut self, touched: &Touched) {
        if self.whole {
            return;
        }
        for (list, ids) in [
            (&mut self.moved, &touched.moved),
            (&mut self.stopped, &touched.stopped),
        ] {
            for id in ids {
                if id.is_empty() || id.contains([' ', '\n']) {
                    self.whole = true;
                    return;
                }
                if !list.is_empty() {
                    list.push(' ');
                }
                list.push_str(id);
            }
        }
        if self.moved.len() + self.stopped.len() > Self::MAX {
            self.whole = true;
        }
    }

    /// The payload, signed with `node_id`.
    pub(crate) fn payload(&self, node_id: &str) -> String {
        if self.whole {
            node_id.to_owned()
        } else {
            format!("{node_id}\n{}\n{}", self.moved, self.stopped)
        }
    }
}

/// A payload of [`Announcement::payload`] as the listener reads it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Announced<'a> {
    pub(crate) node_id: &'a str,
    /// The executions whose events were written and those stopped; `None`: not known.
    pub(crate) executions: Option<(Vec<&'a str>, Vec<&'a str>)>,
}

impl<'a> Announced<'a> {
    /// Any other text (a node of an older build, a hand-made `NOTIFY`) is taken as a node's
    /// id with nothing attributed: every waiter wakes, which is always safe.
    pub(crate) fn parse(payload: &'a str) -> Self {
        let mut lines = payload.split('\n');
        let node_id = lines.next().unwrap_or_default();
        let executions = match (lines.next(), lines.next(), lines.next()) {
            (Some(moved), Some(stopped), None) => Some((
                moved.split(' ').filter(|id| !id.is_empty()).collect(),
                stopped.split(' ').filter(|id| !id.is_empty()).collect(),
            )),
            _ => None,
        };
        Self {
            node_id,
            executions,
        }
    }
}

/// One waiter's place in [`ExecutionWakes`], given back when it goes.
#[derive(Debug)]
pub struct Registered {
    wakes: Arc<ExecutionWakes>,
    execution_id: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut waiting = self
            .wakes
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(channels) = waiting.get_mut(&self.execution_id) {
            channels.waiters -= 1;
            if channels.waiters == 0 {
                waiting.remove(&self.execution_id);
                self.wakes.executions.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// What a reader of events waits on: every commit with events, or one execution's.
#[derive(Debug)]
pub enum Wake {
    All(watch::Receiver<u64>),
    Execution {
        own: watch::Receiver<u64>,
        /// Events of unknown executions (another node's, a redelivery).
        foreign: watch::Receiver<u64>,
        _registered: Registered,
    },
}

impl Wake {
    pub(crate) fn execution(
        wakes: &Arc<ExecutionWakes>,
        execution_id: &str,
        on: WakeOn,
        foreign: watch::Receiver<u64>,
    ) -> Self {
        let (own, registered) = wakes.subscribe(execution_id, on);
        Self::Execution {
            own,
            foreign,
            _registered: registered,
        }
    }

    /// Marks what happened so far as seen: call before reading, so a commit between the read
    /// and [`Wake::changed`] is not missed.
    pub fn mark_seen(&mut self) {
        match self {
            Self::All(rx) => {
                rx.borrow_and_update();
            }
            Self::Execution { own, foreign, .. } => {
                own.borrow_and_update();
                foreign.borrow_and_update();
            }
        }
    }

    /// Returns at the next commit that concerns this reader since [`Wake::mark_seen`]; never
    /// when the store is gone.
    pub async fn changed(&mut self) {
        let ok = match self {
            Self::All(rx) => rx.changed().await.is_ok(),
            Self::Execution { own, foreign, .. } => tokio::select! {
                r = own.changed() => r.is_ok(),
                r = foreign.changed() => r.is_ok(),
            },
        };
        if !ok {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_names_its_executions_while_they_fit() {
        let touched = |moved: &[&str], stopped: &[&str]| Touched {
            moved: moved.iter().map(|s| (*s).to_owned()).collect(),
            stopped: stopped.iter().map(|s| (*s).to_owned()).collect(),
        };
        let mut a = Announcement::default();
        a.add(&touched(&["e1", "e2"], &["e2"]));
        a.add(&touched(&["e3"], &[]));
        let payload = a.payload("node-a");
        assert_eq!(
            Announced::parse(&payload),
            Announced {
                node_id: "node-a",
                executions: Some((vec!["e1", "e2", "e3"], vec!["e2"])),
            }
        );
        // A commit of events with no execution stopped, and one of none at all.
        let mut quiet = Announcement::default();
        quiet.add(&touched(&["e1"], &[]));
        assert_eq!(
            Announced::parse(&quiet.payload("n")).executions,
            Some((vec!["e1"], vec![]))
        );
        // Too many to fit: the node's id alone, which wakes everyone.
        let mut many = Announcement::default();
        many.add(&Touched {
            moved: (0..300).map(|_| capstan_core::ids::new_id()).collect(),
            stopped: Vec::new(),
        });
        let payload = many.payload("node-a");
        assert_eq!(payload, "node-a");
        assert!(Announced::parse(&payload).executions.is_none());
        // An id the format cannot carry: the same.
        let mut odd = Announcement::default();
        odd.add(&touched(&["e 1"], &[]));
        assert_eq!(odd.payload("n"), "n");
        // Once too long, it stays so.
        many.add(&touched(&["e2"], &[]));
        assert_eq!(many.payload("n"), "n");
        // What an older node sends, or anything else, attributes nothing.
        assert_eq!(
            Announced::parse("0190-node"),
            Announced {
                node_id: "0190-node",
                executions: None
            }
        );
        assert!(Announced::parse("n\na\nb\nc").executions.is_none());
        // Every id fits under PostgreSQL's limit of 8,000 bytes at the largest.
        let mut full = Announcement::default();
        for _ in 0..1_000 {
            let id = capstan_core::ids::new_id();
            full.add(&touched(&[&id], &[&id]));
        }
        assert!(full.payload(&capstan_core::ids::new_id()).len() < 8_000);
    }

    #[test]
    fn a_waiter_is_woken_by_its_execution_only_and_leaves_nothing_behind() {
        let wakes = Arc::new(ExecutionWakes::default());
        let foreign = watch::Sender::new(0u64);
        let mut a = Wake::execution(&wakes, "a", WakeOn::Events, foreign.subscribe());
        let mut b = Wake::execution(&wakes, "b", WakeOn::Events, foreign.subscribe());
        let mut a_stops = Wake::execution(&wakes, "a", WakeOn::Stopped, foreign.subscribe());
        let changed = |w: &Wake| match w {
            Wake::Execution { own, foreign, .. } => {
                own.has_changed().unwrap_or(false) || foreign.has_changed().unwrap_or(false)
            }
            Wake::All(rx) => rx.has_changed().unwrap_or(false),
        };
        wakes.wake(["a", "c"], []);
        assert!(changed(&a));
        assert!(!changed(&b), "another execution's commit does not wake b");
        assert!(
            !changed(&a_stops),
            "a stage's events do not wake a long poll"
        );
        a.mark_seen();
        assert!(!changed(&a));
        wakes.wake(["a"], ["a"]);
        assert!(changed(&a) && changed(&a_stops), "its end wakes both");
        a.mark_seen();
        a_stops.mark_seen();
        // Events of no known execution wake everyone.
        foreign.send_modify(|n| *n += 1);
        assert!(changed(&a) && changed(&b));
        b.mark_seen();
        // Waiters of one execution share its channels; they go with the last of them.
        let a2 = Wake::execution(&wakes, "a", WakeOn::Events, foreign.subscribe());
        drop(a);
        drop(a_stops);
        assert_eq!(wakes.executions.load(Ordering::SeqCst), 2);
        drop(a2);
        drop(b);
        assert_eq!(wakes.executions.load(Ordering::SeqCst), 0);
        assert!(
            wakes
                .waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_empty()
        );
    }
}
