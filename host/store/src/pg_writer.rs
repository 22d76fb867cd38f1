//! PostgreSQL's group commit: one connection per node commits the durable points of many
//! executions in one transaction, its statements pipelined (sent one after the other without
//! waiting for each answer, with one `Sync` at the end: `crate::pg_wire`) and prepared once per
//! connection.
//!
//! Through sqlx every statement of an activation's commit waited for its own round trip, and
//! every commit was a transaction of its own with its own WAL flush, outbox lock and `NOTIFY`.
//! Here a group of any number of callers costs one flush, one lock and one notification, and
//! one round trip.
//!
//! A guard ([`Check`]) cannot stop statements already sent, so each is sent as a statement that
//! raises when its condition fails (`capstan_guard`, PostgreSQL migration 0011). The error aborts
//! the transaction; the statement's place in the pipeline names the caller it belongs to, which
//! gets its verdict, and the group runs again without it — as SQLite's group writer does
//! (`crate::writer`), and for the same reason: failures are rare, savepoints are not free (each
//! writing one takes a subtransaction id, and past 64 of them every snapshot on the server gets
//! slower).
//!
//! Two groups may be out at once ([`IN_FLIGHT`]): the next is sent on the same connection while
//! the server still runs the one before, so the server goes from one to the next without
//! waiting for a round trip. The server runs them one after the other, in order; the later one
//! begins with a check that the one before it committed ([`CHAIN`]) and otherwise changes
//! nothing, and runs again once the earlier one's failures are settled — so what commits, and
//! in what order, is what one group at a time would commit.
//!
//! Outbox events go after every other statement of the group, behind the outbox lock
//! (`crate::engine::outbox_lock` says why it exists), taken once per group: the lock is held
//! from there to the commit only, and is taken after the row locks, in the order every other
//! transaction takes them.

use crate::pg_wire::{Outcome, Request, Sent, Wire, WireError};
use crate::sql::{Check, Statement, value_bytes};
use crate::wakes::{Announcement, Touched};
use crate::writer::{BEHIND_COMPANY, Behind, REFUSED_BEHIND};
use bytes::BytesMut;
use capstan_core::store::StoreError;
use sqlx_core::any::{AnyTypeInfoKind, AnyValueKind};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

/// Callers one group carries at most.
const MAX_JOBS: usize = 256;
/// Callers waiting for the writer at most; more wait for room (back-pressure).
const QUEUE: usize = 1024;
/// A pipeline buffer larger than this (a group of unusually large values) is not kept: a fresh
/// one of a group's size is memory the allocator hands back to the kernel between groups and
/// takes again, page by zeroed page, so the usual size is kept.
const KEPT_WRITE_BUFFER: usize = 4 << 20;

/// The statement that serialises outbox inserts across nodes (`crate::engine::outbox_lock`).
const OUTBOX_LOCK: &str = "SELECT pg_advisory_xact_lock(7310112206040913001)";
const NOTIFY: &str = "SELECT pg_notify('capstan_events', $1)";

/// One caller's writes: `body` under its guards, then its outbox `events`.
struct Job {
    body: Vec<Statement>,
    events: Vec<Statement>,
    /// The executions `events` concern, named in the group's `NOTIFY`.
    touched: Touched,
    /// Refused, unrun, unless the epoch of writes behind answers is still this one.
    requires: Option<u64>,
    /// Who waits for the answer, and whether the job starts a group.
    waiter: Waiter,
}

type Answer = oneshot::Sender<Result<(), StoreError>>;

/// Who a job's answer goes to, which decides whether it starts a group of its own.
enum Waiter {
    /// A caller waits for it: the next group is sent for it.
    Caller(Answer),
    /// A caller waits for it but is in no hurry (an audit record): it waits for company, like a
    /// write behind its answer, and rides the next group a caller sends.
    Patient(Answer),
    /// Nobody waits: a write behind its answer ([`Behind`]).
    Behind,
}

impl Waiter {
    /// Whether the job sends a group (or half of one, when a group is out) without company.
    fn hurries(&self) -> bool {
        matches!(self, Self::Caller(_))
    }

    fn is_behind(&self) -> bool {
        matches!(self, Self::Behind)
    }

    fn into_answer(self) -> Option<Answer> {
        match self {
            Self::Caller(answer) | Self::Patient(answer) => Some(answer),
            Self::Behind => None,
        }
    }
}

/// The handle callers queue their writes on; the writer task ends when the last handle goes.
#[derive(Debug, Clone)]
pub(crate) struct PgGroupWriter {
    jobs: mpsc::Sender<Job>,
    /// Ends a wait for company of jobs in no hurry ([`PgGroupWriter::nudge`]).
    nudge: Arc<tokio::sync::Notify>,
    /// Groups that ran again unmerged because a merged insert failed ([`merge_inserts`]).
    #[cfg(test)]
    unmerged: Arc<std::sync::atomic::AtomicU64>,
}

impl PgGroupWriter {
    /// Starts the writer task on the current tokio runtime. It connects when the first group
    /// comes, and again after a connection is lost.
    pub(crate) fn start(
        target: Target,
        node_id: String,
        events: Arc<watch::Sender<u64>>,
        behind: Arc<Behind>,
    ) -> Self {
        let (jobs, queue) = mpsc::channel(QUEUE);
        let nudge = Arc::new(tokio::sync::Notify::new());
        let unmerged = Arc::default();
        let writer = Writer {
            target,
            node_id,
            events,
            behind,
            nudge: nudge.clone(),
            connection: None,
            out: BytesMut::new(),
            tip: Arc::default(),
            groups: 0,
            unmerged: Arc::clone(&unmerged),
        };
        tokio::spawn(writer.run(queue));
        Self {
            jobs,
            nudge,
            #[cfg(test)]
            unmerged,
        }
    }

    /// How many groups ran again unmerged because a merged insert failed.
    #[cfg(test)]
    pub(crate) fn unmerged_runs(&self) -> u64 {
        self.unmerged.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Commits the jobs in no hurry waiting for company now (a caller settles writes behind
    /// answers, or waits for a patient job). Given while groups are out, it ends the next wait.
    pub(crate) fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// Whether the writer task is gone (its runtime shut down): a new one is needed.
    pub(crate) fn is_closed(&self) -> bool {
        self.jobs.is_closed()
    }

    /// Commits `body` then `events` atomically with the next group; answers once the group
    /// has committed (or the caller's part was refused, or the group failed). `touched`: the
    /// executions `events` concern. `requires`: see [`crate::Store::write_behind`].
    pub(crate) async fn commit(
        &self,
        body: Vec<Statement>,
        events: Vec<Statement>,
        requires: Option<u64>,
        touched: Touched,
    ) -> Result<(), StoreError> {
        let (done, answer) = oneshot::channel();
        self.jobs
            .send(Job {
                body,
                events,
                touched,
                requires,
                waiter: Waiter::Caller(done),
            })
            .await
            .map_err(|_| stopped())?;
        answer
            .await
            .unwrap_or_else(|_| Err(crate::engine::interrupted()))
    }

    /// Queues `body` to commit with the next group a caller sends, or alone once it has waited
    /// [`BEHIND_COMPANY`] or [`PgGroupWriter::nudge`] ends the wait; where its answer comes.
    /// For writes whose callers can wait a moment but should not cost a WAL flush of their own
    /// (audit records, which then commit in the transaction of the change they record).
    pub(crate) async fn queue_patiently(
        &self,
        body: Vec<Statement>,
    ) -> Result<oneshot::Receiver<Result<(), StoreError>>, StoreError> {
        let (done, answer) = oneshot::channel();
        self.jobs
            .send(Job {
                body,
                events: Vec::new(),
                touched: Touched::default(),
                requires: None,
                waiter: Waiter::Patient(done),
            })
            .await
            .map_err(|_| stopped())?;
        Ok(answer)
    }

    /// Queues a write behind its answer ([`crate::Store::write_behind`]) without waiting: with
    /// the queue full it is refused, and the caller takes its ordinary path, which waits.
    pub(crate) fn behind(&self, body: Vec<Statement>, epoch: u64) -> Result<(), StoreError> {
        let job = Job {
            body,
            events: Vec::new(),
            touched: Touched::default(),
            requires: Some(epoch),
            waiter: Waiter::Behind,
        };
        self.jobs.try_send(job).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                StoreError::Unavailable("the PostgreSQL group writer's queue is full".to_owned())
            }
            mpsc::error::TrySendError::Closed(_) => stopped(),
        })
    }
}

/// The connection was dropped after a failure while groups were out on it.
fn given_up() -> WireError {
    WireError::Io("the connection was given up after a failure".to_owned())
}

fn stopped() -> StoreError {
    StoreError::Unavailable("the PostgreSQL group writer has stopped".to_owned())
}

/// Where and how the writer connects: the server, and TLS when the URL's `sslmode` asks for it.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) tls: Option<crate::pg_tls::MakeRustls>,
}

/// What the sqlx URL asks of a connection, for `tokio-postgres`: the server, the user, the
/// options, and TLS as `sslmode` means it to sqlx (`prefer`, the default, tries TLS without
/// checking the certificate and falls back to plain; `disable` and `allow` connect plain).
///
/// `role` names the connection's work in `pg_stat_activity` (`application_name`): `group
/// writer`, `point reader`.
pub(crate) fn config(url: &str, role: &str) -> Result<Target, String> {
    use crate::pg_tls::{MakeRustls, Verify};
    use sqlx::postgres::{PgConnectOptions, PgSslMode};
    use tokio_postgres::config::SslMode;
    let options: PgConnectOptions = url.parse().map_err(|e: sqlx::Error| e.to_string())?;
    let (ssl_mode, verify) = match options.get_ssl_mode() {
        // Nothing to encrypt on a Unix socket (libpq does not either).
        _ if options.get_socket().is_some() => (SslMode::Disable, None),
        PgSslMode::Disable | PgSslMode::Allow => (SslMode::Disable, None),
        PgSslMode::Prefer => (SslMode::Prefer, Some(Verify::Nothing)),
        PgSslMode::Require => (SslMode::Require, Some(Verify::Nothing)),
        PgSslMode::VerifyCa => (SslMode::Require, Some(Verify::Authority)),
        PgSslMode::VerifyFull => (SslMode::Require, Some(Verify::Full)),
    };
    let tls = match verify {
        Some(verify) => Some(MakeRustls::new(verify, root_cert(url).as_deref())?),
        None => None,
    };
    let mut config = tokio_postgres::Config::new();
    config.ssl_mode(ssl_mode);
    match options.get_socket() {
        Some(directory) => config.host_path(directory),
        None => config.host(options.get_host()),
    };
    config.port(options.get_port()).user(options.get_username());
    if let Some(database) = options.get_database() {
        config.dbname(database);
    }
    // Told apart from the pool's connections in `pg_stat_activity`.
    config.application_name(&match options.get_application_name() {
        Some(name) => format!("{name} ({role})"),
        None => format!("capstan {role}"),
    });
    // As the pool's connections (`Store::connect_postgres`): a lock is waited for 5 s at most.
    let mut server_options = "-c lock_timeout=5s".to_owned();
    if let Some(more) = options.get_options() {
        server_options.push(' ');
        server_options.push_str(more);
    }
    config.options(&server_options);
    // sqlx keeps the password to itself: read it where sqlx reads it (the URL, then PGPASSWORD).
    let password = url::Url::parse(url)
        .ok()
        .and_then(|u| {
            u.password().map(|p| {
                percent_encoding::percent_decode_str(p)
                    .decode_utf8_lossy()
                    .into_owned()
            })
        })
        .or_else(|| std::env::var("PGPASSWORD").ok());
    if let Some(password) = password {
        config.password(password);
    }
    Ok(Target { config, tls })
}

/// The PEM file of the authorities to trust, where sqlx reads it: the URL's `sslrootcert`
/// (or `ssl-root-cert`, `ssl-ca`), then `PGSSLROOTCERT`.
fn root_cert(url: &str) -> Option<String> {
    url::Url::parse(url)
        .ok()
        .and_then(|u| {
            u.query_pairs()
                .find(|(k, _)| matches!(k.as_ref(), "sslrootcert" | "ssl-root-cert" | "ssl-ca"))
                .map(|(_, v)| v.into_owned())
        })
        .or_else(|| std::env::var("PGSSLROOTCERT").ok())
}

struct Writer {
    target: Target,
    /// Signs the `NOTIFY` payload ([`Announcement`]): this node's listener skips its own.
    node_id: String,
    events: Arc<watch::Sender<u64>>,
    /// Writes behind answers: their epoch, and how many the writer has answered.
    behind: Arc<Behind>,
    nudge: Arc<tokio::sync::Notify>,
    connection: Option<Wire>,
    /// Pipelines encoded and not yet written, in order.
    out: BytesMut,
    /// The chain value the next group sent on the connection expects ([`CHAIN`]): the last sent
    /// group's; empty on a new connection.
    tip: Arc<String>,
    /// Chain values given so far.
    groups: u64,
    /// See [`PgGroupWriter`].
    unmerged: Arc<std::sync::atomic::AtomicU64>,
}

/// Groups sent and not yet answered, at most. While the server runs one, the next is already
/// on its way: with one at a time the server's connection sat idle while the answers travelled
/// back, the callers were answered and the next group was gathered and encoded, and each group
/// paid a full round trip, longer still to a server on another machine.
const IN_FLIGHT: usize = 2;

/// Each group's first statement. A session setting holds the value the last group that
/// committed on the connection set (a transaction that rolls back leaves it as it was): a group
/// finds its predecessor's value and sets its own, or raises before anything else runs. So a
/// group sent while the one ahead of it still ran commits only if that one did, and otherwise
/// runs again once that one's failure is settled, as it would have run with one group at a
/// time: its jobs may depend on the other's (a commit recording a provider's answer on the
/// write behind that answer), and a write behind its answer that failed refuses the jobs that
/// named its epoch.
const CHAIN: &str = "SELECT CASE WHEN coalesce(current_setting('capstan.group', true), '') = $1 \
     THEN set_config('capstan.group', $2, false) ELSE capstan_guard(0, NULL, false)::text END";

/// Callers' jobs and their answers so far, over the runs of one group.
struct Group {
    jobs: Vec<Job>,
    answers: Vec<Option<Result<(), StoreError>>>,
    /// Whether single-row inserts are merged ([`merge_inserts`]); off after a merged insert
    /// failed.
    merge: bool,
}

impl Group {
    fn new(jobs: Vec<Job>) -> Self {
        let answers = jobs.iter().map(|_| None).collect();
        Self {
            jobs,
            answers,
            merge: true,
        }
    }

    /// The jobs without an answer yet.
    fn waiting(&self) -> Vec<usize> {
        (0..self.jobs.len())
            .filter(|&i| self.answers[i].is_none())
            .collect()
    }
}

/// One run of a group, sent on the connection.
struct Flight {
    group: Group,
    /// The jobs it runs.
    waiting: Vec<usize>,
    /// Who each of its statements answers for.
    owners: Vec<Owner>,
    sent: Sent,
    /// The chain value it expects (the one the server keeps if it does not commit).
    after: Arc<String>,
    started: std::time::Instant,
}

impl Flight {
    /// Of the jobs it runs, how many hurry ([`Waiter::Caller`]).
    fn callers(&self) -> usize {
        self.waiting
            .iter()
            .filter(|&&i| self.group.jobs[i].waiter.hurries())
            .count()
    }
}

impl Writer {
    async fn run(mut self, mut queue: mpsc::Receiver<Job>) {
        let mut flights: VecDeque<Flight> = VecDeque::with_capacity(IN_FLIGHT);
        let mut next: Vec<Job> = Vec::with_capacity(MAX_JOBS);
        let mut open = true;
        loop {
            if flights.is_empty() {
                if next.is_empty() && (!open || queue.recv_many(&mut next, MAX_JOBS).await == 0) {
                    return;
                }
                self.wait_for_company(&mut queue, &mut next).await;
                let group = Group::new(std::mem::replace(&mut next, Vec::with_capacity(MAX_JOBS)));
                match self.launch(group, true).await {
                    Ok(flight) => flights.push_back(flight),
                    Err(group) => self.answer(group),
                }
                continue;
            }
            // A group is out: read its answers and write what is unwritten, and meanwhile
            // gather the next group and send it as soon as someone waits for one of its jobs
            // (jobs in no hurry alone wait for company, as above).
            let room = open && flights.len() < IN_FLIGHT && next.len() < MAX_JOBS;
            let want = MAX_JOBS - next.len();
            let progress = match self.connection.as_mut() {
                Some(wire) => tokio::select! {
                    exchanged = wire.exchange(&mut self.out) => exchanged,
                    received = queue.recv_many(&mut next, want), if room => {
                        open = received > 0;
                        Ok(())
                    }
                },
                None => Err(given_up()),
            };
            if self.out.is_empty() && self.out.capacity() > KEPT_WRITE_BUFFER {
                self.out = BytesMut::new();
            }
            let mut lost = progress.err();
            while lost.is_none()
                && let Some(head) = flights.front_mut()
            {
                let Some(wire) = self.connection.as_mut() else {
                    break;
                };
                match wire.answers(&mut head.sent) {
                    Ok(None) => break,
                    Ok(Some(outcome)) => {
                        let Some(head) = flights.pop_front() else {
                            break;
                        };
                        self.settle(head, Ok(outcome), &mut flights).await;
                    }
                    Err(e) => lost = Some(e),
                }
            }
            if let Some(e) = lost {
                // Whether the groups out committed cannot be known: each gets the error.
                for flight in flights.drain(..) {
                    let group = self.apply(flight, Err(e.clone()), true);
                    self.answer(group);
                }
                continue;
            }
            // Sent once it carries half as many callers as the group ahead of it. Sent at its
            // first caller, a group could hold one while the next gathers the rest, and each
            // group costs a commit (and, with other nodes writing, a turn at the outbox lock);
            // sent only once the one ahead is answered, the server would wait for it.
            let callers = next.iter().filter(|job| job.waiter.hurries()).count();
            let ahead = flights.front().map_or(0, Flight::callers);
            let wanted = next.len() >= MAX_JOBS
                || (callers > 0 && callers * 2 >= ahead)
                || (!next.is_empty() && self.behind.settling());
            if wanted && !flights.is_empty() && flights.len() < IN_FLIGHT {
                let group = Group::new(std::mem::replace(&mut next, Vec::with_capacity(MAX_JOBS)));
                match self.launch(group, false).await {
                    Ok(flight) => flights.push_back(flight),
                    Err(group) => self.answer(group),
                }
            }
        }
    }

    /// When only jobs in no hurry are here (writes behind answers, patient jobs), waits up to
    /// [`BEHIND_COMPANY`] for a caller's job (in practice the activation's own commit) to commit
    /// them with: committing each alone costs a WAL flush apiece (ten per execution alone). A
    /// caller settling them, or a nudge, ends the wait.
    async fn wait_for_company(&self, queue: &mut mpsc::Receiver<Job>, jobs: &mut Vec<Job>) {
        let deadline = tokio::time::Instant::now() + BEHIND_COMPANY;
        while jobs.len() < MAX_JOBS
            && !jobs.iter().any(|job| job.waiter.hurries())
            && !self.behind.settling()
        {
            let room = MAX_JOBS - jobs.len();
            tokio::select! {
                received = queue.recv_many(jobs, room) => if received == 0 { return },
                () = tokio::time::sleep_until(deadline) => return,
                () = self.nudge.notified() => return,
            }
        }
    }

    /// Sends the next run of `group` on the connection (connecting first when there is none),
    /// behind whatever is out already: its jobs still unanswered, but for those refused unrun —
    /// a job that names an epoch of writes behind answers that has moved (a write behind its
    /// answer that failed moves it at once, so the jobs after it that named the old one, in
    /// this group's next run or in later groups, are refused), or whose values cannot be sent.
    /// `Err`: nothing to send, every job answered.
    /// `alone`: nothing else is out (the connection may be checked, which reads what the
    /// server sent).
    async fn launch(&mut self, mut group: Group, alone: bool) -> Result<Flight, Group> {
        loop {
            for (job, answer) in group.jobs.iter().zip(group.answers.iter_mut()) {
                if answer.is_none() && job.requires.is_some_and(|e| e != self.behind.epoch()) {
                    *answer = Some(Err(StoreError::Unavailable(REFUSED_BEHIND.to_owned())));
                }
            }
            let waiting = group.waiting();
            if waiting.is_empty() {
                return Err(group);
            }
            let wire = match connect(&mut self.connection, &self.target, alone).await {
                Ok(wire) => wire,
                Err(e) => {
                    self.fail(&mut group, &waiting, &e);
                    return Err(group);
                }
            };
            self.groups += 1;
            let token = Arc::new(self.groups.to_string());
            let chain = [
                AnyValueKind::Text(self.tip.clone()),
                AnyValueKind::Text(token.clone()),
            ];
            let announcement = announce(&group.jobs, &waiting, &self.node_id);
            let steps = pipeline(&group.jobs, &waiting, &announcement, &chain, group.merge);
            let encoded = encode(wire, &steps, &mut self.out);
            let owners: Vec<Owner> = steps.iter().map(|step| step.owner).collect();
            drop(steps);
            match encoded {
                Ok(sent) => {
                    crate::count_write();
                    let after = std::mem::replace(&mut self.tip, token.clone());
                    return Ok(Flight {
                        group,
                        waiting,
                        owners,
                        sent,
                        after,
                        started: std::time::Instant::now(),
                    });
                }
                // Nothing of it was sent: again without the job, or unmerged.
                Err((at, e)) => match owners[at] {
                    Owner::Job(i, _) => self.fail_job(&mut group, i, unavailable(&e)),
                    Owner::Merged => {
                        tracing::debug!(error = %e, "a merged insert could not be encoded; the group runs again unmerged");
                        self.unmerge(&mut group);
                    }
                    // Nothing of it was sent: the connection stays as it is.
                    Owner::Group | Owner::Chain => {
                        self.fail_jobs(&mut group, &waiting, &unavailable(&e));
                        return Err(group);
                    }
                },
            }
        }
    }

    /// A group that came back: answered when it committed; otherwise the groups sent behind
    /// it, which cannot have committed ([`CHAIN`]), come back too, and this one and then each
    /// of them run alone until every job has its answer, in the order they were sent.
    async fn settle(
        &mut self,
        head: Flight,
        outcome: Result<Outcome, WireError>,
        flights: &mut VecDeque<Flight>,
    ) {
        if matches!(outcome, Ok(Ok(()))) {
            let group = self.apply(head, outcome, true);
            return self.answer(group);
        }
        // Their answers first, while the connection is as the failure left it.
        let mut behind_it = Vec::with_capacity(flights.len());
        for mut flight in flights.drain(..) {
            let outcome = match self.connection.as_mut() {
                Some(wire) => wire.complete(&mut self.out, &mut flight.sent).await,
                None => Err(given_up()),
            };
            behind_it.push((flight, outcome));
        }
        let before = head.after.clone();
        let group = self.apply(head, outcome, true);
        let behind_it: Vec<Group> = behind_it
            .into_iter()
            .map(|(flight, outcome)| self.apply(flight, outcome, false))
            .collect();
        // What the server holds: the value from before the group that failed.
        self.tip = match self.connection {
            Some(_) => before,
            None => Arc::default(),
        };
        self.finish(group).await;
        for group in behind_it {
            self.finish(group).await;
        }
    }

    /// Runs `group` alone on the connection until every job has its answer, then answers.
    async fn finish(&mut self, mut group: Group) {
        loop {
            let mut flight = match self.launch(group, true).await {
                Ok(flight) => flight,
                Err(group) => return self.answer(group),
            };
            let outcome = match self.connection.as_mut() {
                Some(wire) => wire.complete(&mut self.out, &mut flight.sent).await,
                None => Err(given_up()),
            };
            group = self.apply(flight, outcome, true);
        }
    }

    /// The group runs again with each statement as its callers wrote it, which names the caller
    /// whose row failed a merged insert.
    fn unmerge(&mut self, group: &mut Group) {
        self.unmerged
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!(crate::UNMERGED_RERUNS).increment(1);
        group.merge = false;
    }

    /// Takes in how a run of a group went; its group, the jobs that ran answered unless they
    /// are to run again. `first`: nothing was out ahead of it.
    fn apply(&mut self, flight: Flight, outcome: Result<Outcome, WireError>, first: bool) -> Group {
        let Flight {
            mut group,
            waiting,
            owners,
            after,
            started,
            ..
        } = flight;
        let failed = match outcome {
            Err(e) => Failed::Group(unavailable(&e)),
            Ok(Ok(())) => {
                crate::observe_commit("postgres", waiting.len(), started);
                if waiting.iter().any(|&i| !group.jobs[i].events.is_empty()) {
                    self.events.send_modify(|n| *n = n.wrapping_add(1));
                }
                for i in waiting {
                    group.answers[i] = Some(Ok(()));
                }
                return group;
            }
            Ok(Err((at, e))) => {
                let refused = matches!(e, WireError::Db { .. } | WireError::Encode(_));
                match at.map(|i| owners[i]) {
                    Some(Owner::Job(i, check)) if refused => Failed::Job(i, job_error(&e, check)),
                    Some(Owner::Merged) if refused => {
                        tracing::debug!(error = %e, "a merged insert failed; the group runs again unmerged");
                        Failed::Merged
                    }
                    Some(Owner::Chain) if refused => Failed::Chain,
                    _ => Failed::Group(unavailable(&e)),
                }
            }
        };
        // The transaction was rolled back: the server's chain value is the one it found.
        self.tip = after;
        match failed {
            // The group runs again, unmerged.
            Failed::Merged => self.unmerge(&mut group),
            // The group runs again without this job.
            Failed::Job(i, e) => self.fail_job(&mut group, i, e),
            // The group before it did not commit; it runs again.
            Failed::Chain if !first => {}
            // With nothing before it, the session's chain value is not the one this writer
            // set: the session is not the writer's own (a proxy pooling transactions hands it
            // another server session each time). Running it again would meet the same; its
            // jobs, unrun, get the error, and the next group starts on a new connection.
            Failed::Chain => self.fail(
                &mut group,
                &waiting,
                &StoreError::Unavailable(
                    "the PostgreSQL group writer's session changed between transactions (a proxy \
                 pooling transactions?): it needs a session of its own"
                        .to_owned(),
                ),
            ),
            Failed::Group(e) => self.fail(&mut group, &waiting, &e),
        }
        group
    }

    fn fail_job(&self, group: &mut Group, i: usize, e: StoreError) {
        if group.jobs[i].waiter.is_behind() {
            self.behind.fail();
        }
        group.answers[i] = Some(Err(e));
    }

    /// The connection or the transaction failed: every job of `waiting` gets `e`, and the next
    /// group starts on a new connection, whatever state this one is in.
    fn fail(&mut self, group: &mut Group, waiting: &[usize], e: &StoreError) {
        self.connection = None;
        self.tip = Arc::default();
        self.fail_jobs(group, waiting, e);
    }

    fn fail_jobs(&self, group: &mut Group, waiting: &[usize], e: &StoreError) {
        if waiting.iter().any(|&i| group.jobs[i].waiter.is_behind()) {
            self.behind.fail();
        }
        for &i in waiting {
            group.answers[i] = Some(Err(e.clone()));
        }
    }

    /// Answers every job of a group that has all its answers. Writes behind answers are counted
    /// answered before anyone is answered: a caller answered next may look at the count.
    fn answer(&self, group: Group) {
        let mut behind = 0;
        for (job, answer) in group.jobs.iter().zip(&group.answers) {
            if job.waiter.is_behind() {
                if let Some(Err(error)) = answer {
                    tracing::warn!(%error, "a write made behind its answer failed");
                }
                behind += 1;
            }
        }
        self.behind.count_answered(behind);
        for (job, answer) in group.jobs.into_iter().zip(group.answers) {
            // A caller that went away no longer wants its answer.
            if let Some(done) = job.waiter.into_answer() {
                let _ = done.send(answer.unwrap_or(Ok(())));
            }
        }
    }
}

/// The writer's connection, opened (again) when there is none or it was lost.
async fn connect<'a>(
    slot: &'a mut Option<Wire>,
    target: &Target,
    alone: bool,
) -> Result<&'a mut Wire, StoreError> {
    if alone && slot.as_mut().is_some_and(|wire| !wire.is_open()) {
        *slot = None;
    }
    if let Some(wire) = slot {
        return Ok(wire);
    }
    let wire = Wire::connect(target).await.map_err(|e| {
        tracing::warn!(error = %e, "the PostgreSQL group writer cannot connect");
        unavailable(&e)
    })?;
    Ok(slot.insert(wire))
}

/// Why a group did not commit.
enum Failed {
    /// One job's statement failed (a guard among them): it gets the error, the others run again.
    Job(usize, StoreError),
    /// The transaction or the connection failed: every job still waiting gets the error.
    Group(StoreError),
    /// A merged insert failed: the group runs again unmerged, to find whose row it was.
    Merged,
    /// The group sent before it did not commit ([`CHAIN`]): it runs again.
    Chain,
}

/// A prepared statement's key: its text as sent (a guard's, wrapped; a job's own text is
/// borrowed, not copied) and its parameter types.
type Key<'a> = (Cow<'a, str>, Vec<Type>);

/// Who a statement of the pipeline answers for.
#[derive(Clone, Copy)]
enum Owner {
    Group,
    Job(usize, Option<Check>),
    /// Rows of several consecutive inserts, maybe of several jobs ([`merge_inserts`]).
    Merged,
    /// The group's first statement ([`CHAIN`]).
    Chain,
}

/// One statement of the pipeline.
struct Step<'a> {
    owner: Owner,
    key: Key<'a>,
    values: Vec<&'a AnyValueKind>,
    /// A merged insert's rows: `values` holds them one after the other, and each column goes
    /// as one array parameter ([`merge_inserts`]). `None`: `values` are the parameters.
    rows: Option<usize>,
}

impl<'a> Step<'a> {
    fn group(text: &'a str, values: &'a [AnyValueKind]) -> Self {
        Self {
            owner: Owner::Group,
            key: (Cow::Borrowed(text), values.iter().map(pg_type).collect()),
            values: values.iter().collect(),
            rows: None,
        }
    }

    fn job(job: usize, statement: &'a Statement) -> Self {
        let text = match statement.check {
            Some(check) => Cow::Owned(raising(&statement.text, check)),
            None => Cow::Borrowed(&*statement.text),
        };
        let values = statement.values();
        Self {
            owner: Owner::Job(job, statement.check),
            key: (text, values.iter().map(pg_type).collect()),
            values: values.iter().collect(),
            rows: None,
        }
    }
}

/// An insert of one row whose text can take more (`INSERT INTO t (…) VALUES ($1, …, $n) …`,
/// every value a placeholder in order, no placeholder after the row): the text before
/// `VALUES`, how many values the row has, and the text after the row (an `ON CONFLICT` clause).
fn single_row_insert(text: &str) -> Option<(&str, usize, &str)> {
    if !text.starts_with("INSERT INTO ") {
        return None;
    }
    let values = text.rfind("VALUES (")?;
    let open = values + "VALUES ".len();
    let close = open + text[open..].find(')')?;
    let tail = &text[close + 1..];
    // A tail that reads another table (a subquery in `DO UPDATE`) would read it at the first
    // row's place once merged: such inserts go as they are.
    if tail.contains('$')
        || tail.contains("RETURNING")
        || tail
            .split(|c: char| !c.is_ascii_alphabetic())
            .any(|word| word.eq_ignore_ascii_case("select"))
    {
        return None;
    }
    let mut n = 0;
    for (i, value) in text[open + 1..close].split(',').enumerate() {
        let number = value
            .trim()
            .strip_prefix('$')
            .and_then(|n| n.parse::<usize>().ok());
        if number != Some(i + 1) {
            return None;
        }
        n += 1;
    }
    Some((&text[..values], n, tail))
}

/// The array type a merged insert sends a column of `member` values as; `None` for a type
/// the writer has none for (such inserts are not merged).
fn array_of(member: &Type) -> Option<Type> {
    Some(match *member {
        Type::BOOL => Type::BOOL_ARRAY,
        Type::INT2 => Type::INT2_ARRAY,
        Type::INT4 => Type::INT4_ARRAY,
        Type::INT8 => Type::INT8_ARRAY,
        Type::FLOAT4 => Type::FLOAT4_ARRAY,
        Type::FLOAT8 => Type::FLOAT8_ARRAY,
        Type::TEXT => Type::TEXT_ARRAY,
        Type::BYTEA => Type::BYTEA_ARRAY,
        _ => return None,
    })
}

/// The pipeline with the single-row inserts of jobs sent as multi-row inserts: the rows of one
/// text and types go together, at the place of the first of them, in their order, as one
/// `INSERT … SELECT * FROM unnest($1, …, $n)` whose parameters are the columns as arrays
/// (`unnest` yields the rows in array order). One text per table then serves any number of
/// rows, so a table's rows are one statement and one prepared plan of a fixed size.
///
/// Rows move only past statements they commute with. A later row joins the rows before it unless a
/// statement between them names its table (a word of its text: an update, a guard that reads it,
/// another text inserting into it), or is the group's own (the chain, the outbox lock, the
/// notification), after which nothing joins what came before. Nothing the writer runs reaches a
/// table without naming it: the schema has no triggers of its own, the one function,
/// `capstan_guard`, reads no table, and an insert whose conflict clause reads one is not merged. A
/// statement that guards a table without reading it (an advisory lock taken before writing) must
/// name it, or rows would move ahead of it; the simulated DNS takes its record sets' locks inside
/// the statement that writes them. Foreign keys are PostgreSQL's own triggers and read the parent
/// table unnamed: a child row moved ahead of its parent fails the merged insert (and the group runs
/// again unmerged); a parent row moving ahead of a child written before it cannot change an
/// outcome, as only the parent's own caller knows a parent not yet committed, and it writes the
/// parent first. So the activations of a group, each a fence, its stages, receipts and journal
/// chunk, then its updates of `executions` and `runs`, send one statement per table for all of
/// their rows. Any failure of a merged statement (that, a duplicate key, an upsert meeting its own
/// row twice) makes the group run again unmerged, which names the caller whose row failed.
fn merge_inserts(steps: Vec<Step<'_>>) -> Vec<Step<'_>> {
    // Each slot a statement or the rows of one text and types; `open`: the slots later rows
    // may still join, with their table.
    let mut slots: Vec<Vec<Step<'_>>> = Vec::with_capacity(steps.len());
    let mut open: Vec<(usize, String)> = Vec::new();
    for step in steps {
        let table = match step.owner {
            Owner::Job(_, None) if step.key.1.iter().all(|t| array_of(t).is_some()) => {
                single_row_insert(&step.key.0).and_then(|(head, _, _)| inserted_table(head))
            }
            _ => None,
        };
        let Some(table) = table else {
            if matches!(step.owner, Owner::Job(..)) {
                close_named(&step.key.0, &mut open);
            } else {
                open.clear();
            }
            slots.push(vec![step]);
            continue;
        };
        if let Some((slot, _)) = open
            .iter()
            .find(|(slot, _)| slots[*slot][0].key == step.key)
        {
            slots[*slot].push(step);
            continue;
        }
        // Another text or types inserting into the table: its rows keep their place after it.
        // (Compared as PostgreSQL folds unquoted identifiers.)
        let table = table.to_ascii_lowercase();
        open.retain(|(_, open_table)| *open_table != table);
        open.push((slots.len(), table));
        slots.push(vec![step]);
    }
    slots.into_iter().filter_map(merge_rows).collect()
}

/// The table of an insert's text before `VALUES` (`INSERT INTO t (…) `), when it is a plain
/// identifier, as [`close_named`] finds it in other statements (not qualified, not quoted).
fn inserted_table(head: &str) -> Option<&str> {
    let rest = head.strip_prefix("INSERT INTO ")?;
    let end = rest.find(|c: char| c.is_whitespace() || c == '(')?;
    Some(&rest[..end])
        .filter(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

/// Drops from `open` the tables that are words of `text` (compared as PostgreSQL folds unquoted
/// identifiers: the schema's are lower case).
fn close_named(text: &str, open: &mut Vec<(usize, String)>) {
    if open.is_empty() {
        return;
    }
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        open.retain(|(_, table)| !word.eq_ignore_ascii_case(table));
        if open.is_empty() {
            return;
        }
    }
}

/// One slot of [`merge_inserts`]: a statement, or the rows of one text and types as one insert.
fn merge_rows(mut rows: Vec<Step<'_>>) -> Option<Step<'_>> {
    if rows.len() < 2 {
        return rows.pop();
    }
    let Some((head, width, tail)) = single_row_insert(&rows[0].key.0) else {
        unreachable!("rows that go together are single-row inserts")
    };
    let mut text = format!("{head}SELECT * FROM unnest(");
    for column in 1..=width {
        // Writing to a `String` cannot fail.
        let _ = write!(text, "{}${column}", if column > 1 { ", " } else { "" });
    }
    text.push(')');
    text.push_str(tail);
    let types = rows[0].key.1.iter().filter_map(array_of).collect();
    let count = rows.len();
    let mut values = Vec::with_capacity(count * width);
    for step in &mut rows {
        values.append(&mut step.values);
    }
    Some(Step {
        owner: Owner::Merged,
        key: (Cow::Owned(text), types),
        values,
        rows: Some(count),
    })
}

/// The `NOTIFY` payload of one run of the group: the executions of every waiting job's events
/// ([`Announcement`]).
fn announce(jobs: &[Job], waiting: &[usize], node_id: &str) -> AnyValueKind {
    let mut announcement = Announcement::default();
    for &i in waiting {
        if !jobs[i].events.is_empty() {
            announcement.add(&jobs[i].touched);
        }
    }
    AnyValueKind::Text(Arc::new(announcement.payload(node_id)))
}

/// The statements of one run of the group, in order: every waiting job's body, then, when
/// events follow, the outbox lock, the notification (`announcement`) and the events. A
/// statement that holds to the end of its transaction once run ([`Statement::once`]: a zone's
/// lock, taken by each of its changes written behind answers) is run once per group. `merge`:
/// see [`merge_inserts`].
fn pipeline<'a>(
    jobs: &'a [Job],
    waiting: &[usize],
    announcement: &'a AnyValueKind,
    chain: &'a [AnyValueKind; 2],
    merge: bool,
) -> Vec<Step<'a>> {
    let mut steps = vec![Step {
        owner: Owner::Chain,
        ..Step::group(CHAIN, chain)
    }];
    let mut once: std::collections::HashSet<(&str, String)> = std::collections::HashSet::new();
    for &i in waiting {
        for statement in &jobs[i].body {
            if statement.once
                && !once.insert((&statement.text, format!("{:?}", statement.values())))
            {
                continue;
            }
            steps.push(Step::job(i, statement));
        }
    }
    if waiting.iter().any(|&i| !jobs[i].events.is_empty()) {
        steps.push(Step::group(OUTBOX_LOCK, &[]));
        steps.push(Step::group(NOTIFY, std::slice::from_ref(announcement)));
        for &i in waiting {
            steps.extend(jobs[i].events.iter().map(|s| Step::job(i, s)));
        }
    }
    if merge {
        steps = merge_inserts(steps);
    }
    steps
}

/// Appends one run of the group to `out` ([`Wire::encode`]): its [`pipeline`], as one
/// implicit transaction.
fn encode(
    wire: &mut Wire,
    steps: &[Step<'_>],
    out: &mut BytesMut,
) -> Result<Sent, (usize, WireError)> {
    // A step's parameters: its values, or, for a merged insert, its columns as arrays.
    let params: Vec<Vec<Param<'_>>> = steps
        .iter()
        .map(|s| match s.rows {
            None => s.values.iter().map(|v| Param(v)).collect(),
            Some(_) => Vec::new(),
        })
        .collect();
    let columns: Vec<Vec<Vec<Param<'_>>>> = steps
        .iter()
        .map(|s| match s.rows {
            None => Vec::new(),
            Some(rows) => {
                let width = s.values.len() / rows;
                (0..width)
                    .map(|c| (0..rows).map(|r| Param(s.values[r * width + c])).collect())
                    .collect()
            }
        })
        .collect();
    let refs: Vec<Vec<&(dyn ToSql + Sync)>> = params
        .iter()
        .zip(&columns)
        .map(|(p, c)| {
            p.iter()
                .map(|v| v as &(dyn ToSql + Sync))
                .chain(c.iter().map(|a| a as &(dyn ToSql + Sync)))
                .collect()
        })
        .collect();
    let requests: Vec<Request<'_>> = steps
        .iter()
        .zip(&refs)
        .map(|(step, values)| Request {
            text: &step.key.0,
            types: &step.key.1,
            values,
            bytes: step.values.iter().map(|v| 8 + value_bytes(v)).sum(),
        })
        .collect();
    wire.encode(&requests, out)
}

/// A guard as a statement that raises when its condition fails: `capstan_guard` gets how many
/// rows the guard returned and the first column of the first (as `jsonb`), and raises `CP001`
/// for none and, for a run's fence, `CP002` for a cancel request (see [`Check::verdict`]).
fn raising(text: &str, check: Check) -> String {
    match check {
        Check::Fence => format!(
            "WITH guard AS ({text}) SELECT capstan_guard((SELECT count(*) FROM guard), \
             (SELECT first.value FROM guard, jsonb_each(to_jsonb(guard)) AS first LIMIT 1), true)"
        ),
        // Only a fence's first column means anything: the others skip turning a row to jsonb.
        Check::Holds(_) => format!(
            "WITH guard AS ({text}) SELECT capstan_guard((SELECT count(*) FROM guard), NULL, false)"
        ),
    }
}

/// A job's failed statement as the caller's error: a guard's verdict, or the server's refusal.
fn job_error(e: &WireError, check: Option<Check>) -> StoreError {
    let code = match e {
        WireError::Db { code, .. } => Some(code.as_str()),
        _ => None,
    };
    match (check, code) {
        (Some(check), Some("CP001")) => check.verdict(None).err(),
        (Some(check), Some("CP002")) => check.verdict(Some(1)).err(),
        _ => None,
    }
    .unwrap_or_else(|| unavailable(e))
}

fn unavailable(e: &WireError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// The type sqlx's PostgreSQL driver binds each value as, so a statement means here what it
/// means on sqlx's path.
pub(crate) fn pg_type(value: &AnyValueKind) -> Type {
    match value {
        AnyValueKind::Null(kind) => match kind {
            AnyTypeInfoKind::Null | AnyTypeInfoKind::Integer => Type::INT4,
            AnyTypeInfoKind::Bool => Type::BOOL,
            AnyTypeInfoKind::SmallInt => Type::INT2,
            AnyTypeInfoKind::BigInt => Type::INT8,
            AnyTypeInfoKind::Real => Type::FLOAT4,
            AnyTypeInfoKind::Double => Type::FLOAT8,
            AnyTypeInfoKind::Text => Type::TEXT,
            AnyTypeInfoKind::Blob => Type::BYTEA,
        },
        AnyValueKind::Bool(_) => Type::BOOL,
        AnyValueKind::SmallInt(_) => Type::INT2,
        AnyValueKind::Integer(_) => Type::INT4,
        AnyValueKind::BigInt(_) => Type::INT8,
        AnyValueKind::Real(_) => Type::FLOAT4,
        AnyValueKind::Double(_) => Type::FLOAT8,
        AnyValueKind::Text(_) | AnyValueKind::TextSlice(_) => Type::TEXT,
        AnyValueKind::Blob(_) => Type::BYTEA,
        // A kind sqlx may add later: refused when bound (below).
        _ => Type::UNKNOWN,
    }
}

/// A value bound as [`pg_type`] says (the statement was prepared with those types).
#[derive(Debug)]
pub(crate) struct Param<'a>(pub(crate) &'a AnyValueKind);

impl ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self.0 {
            AnyValueKind::Null(_) => Ok(IsNull::Yes),
            AnyValueKind::Bool(v) => v.to_sql(ty, out),
            AnyValueKind::SmallInt(v) => v.to_sql(ty, out),
            AnyValueKind::Integer(v) => v.to_sql(ty, out),
            AnyValueKind::BigInt(v) => v.to_sql(ty, out),
            AnyValueKind::Real(v) => v.to_sql(ty, out),
            AnyValueKind::Double(v) => v.to_sql(ty, out),
            AnyValueKind::Text(v) => v.as_str().to_sql(ty, out),
            AnyValueKind::TextSlice(v) => (&**v).to_sql(ty, out),
            AnyValueKind::Blob(v) => v.as_slice().to_sql(ty, out),
            other => Err(format!("a value the group writer cannot bind: {other:?}").into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer connects where sqlx's pool does: host, port, user, password (percent-decoded),
    /// database and sqlx's `options[…]` (the tests' and the bench's schema per run), with TLS
    /// as `sslmode` says.
    #[test]
    fn reads_the_connection_from_sqlx_urls() {
        let target = config(
            "postgres://capstan:p%40ss%2Fword@db.internal:6543/work?options[search_path]=capstan_t_1&application_name=node-a",
            "group writer",
        )
        .unwrap();
        let config = &target.config;
        assert_eq!(
            config.get_hosts(),
            &[tokio_postgres::config::Host::Tcp("db.internal".to_owned())]
        );
        assert_eq!(config.get_ports(), &[6543]);
        assert_eq!(config.get_user(), Some("capstan"));
        assert_eq!(config.get_password(), Some(&b"p@ss/word"[..]));
        assert_eq!(config.get_dbname(), Some("work"));
        assert_eq!(config.get_application_name(), Some("node-a (group writer)"));
        let options = config.get_options().unwrap();
        assert!(options.contains("-c lock_timeout=5s"), "{options}");
        assert!(options.contains("search_path=capstan_t_1"), "{options}");

        use tokio_postgres::config::SslMode;
        for (mode, ssl, tls) in [
            ("disable", SslMode::Disable, false),
            ("prefer", SslMode::Prefer, true),
            ("require", SslMode::Require, true),
            ("verify-ca", SslMode::Require, true),
            ("verify-full", SslMode::Require, true),
        ] {
            let target = config_of(&format!("postgres://u@h/d?sslmode={mode}"));
            assert_eq!(target.config.get_ssl_mode(), ssl, "{mode}");
            assert_eq!(target.tls.is_some(), tls, "{mode}");
        }
        let socket = config_of("postgres://u@localhost/d?host=/var/run/postgresql&sslmode=require");
        assert_eq!(socket.config.get_ssl_mode(), SslMode::Disable);
        assert!(socket.tls.is_none(), "no TLS on a Unix socket");
        let missing = super::config(
            "postgres://u@h/d?sslmode=verify-full&sslrootcert=/no/such.pem",
            "x",
        );
        assert!(missing.is_err_and(|e| e.contains("/no/such.pem")));
    }

    fn config_of(url: &str) -> Target {
        config(url, "group writer").unwrap()
    }

    /// Single-row inserts of one text and types become one `unnest` insert, their values in
    /// order; a statement naming the table (in any case) or a different text or types inserting
    /// into it end what later rows join; what is not a plain single-row insert of types with
    /// arrays is never merged.
    #[test]
    fn merges_runs_of_single_row_inserts_in_order() {
        const INSERT: &str = "INSERT INTO t (a, b) VALUES ($1, $2)";
        assert_eq!(
            single_row_insert(INSERT),
            Some(("INSERT INTO t (a, b) ", 2, ""))
        );
        assert_eq!(
            single_row_insert("INSERT INTO t (a, b) VALUES ($1, $2) ON CONFLICT (a) DO NOTHING"),
            Some(("INSERT INTO t (a, b) ", 2, " ON CONFLICT (a) DO NOTHING"))
        );
        assert_eq!(inserted_table("INSERT INTO t_2 (a, b) "), Some("t_2"));
        assert_eq!(inserted_table("INSERT INTO public.t (a, b) "), None);
        assert_eq!(inserted_table("INSERT INTO \"T\" (a, b) "), None);
        for not in [
            "INSERT INTO t (a, b) VALUES ($1, $2) ON CONFLICT (a) DO UPDATE SET b = $3",
            "INSERT INTO t (a, b) VALUES ($1, $2) RETURNING a",
            "INSERT INTO t (a, b) VALUES ($2, $1)",
            "INSERT INTO t (a, b) VALUES ($1, now())",
            "INSERT INTO t (a, b) VALUES ($1, $2) ON CONFLICT (a) DO UPDATE SET b = (SELECT max(b) FROM u)",
            "UPDATE t SET a = $1",
        ] {
            assert_eq!(single_row_insert(not), None, "{not}");
        }
        let values: Vec<AnyValueKind> = (0..40).map(AnyValueKind::BigInt).collect();
        let insert = |job: usize, i: usize| Step {
            owner: Owner::Job(job, None),
            key: (INSERT.into(), vec![Type::INT8, Type::INT8]),
            values: vec![&values[2 * i], &values[2 * i + 1]],
            rows: None,
        };
        let mut steps = vec![Step::group("BEGIN", &[])];
        // Thirteen rows of two jobs, a guard, three more rows: one with other types, one of a
        // type without an array.
        steps.extend((0..13).map(|i| insert(i / 7, i)));
        steps.push(Step {
            owner: Owner::Job(1, Some(Check::Holds("x"))),
            key: ("SELECT 1 FROM T WHERE a > 0".into(), Vec::new()),
            values: Vec::new(),
            rows: None,
        });
        steps.extend((13..17).map(|i| insert(2, i)));
        steps[17].key.1 = vec![Type::TEXT, Type::INT8];
        steps[18].key.1 = vec![Type::UNKNOWN, Type::INT8];
        let merged = merge_inserts(steps);
        let shape: Vec<(usize, Option<usize>, bool)> = merged
            .iter()
            .map(|s| (s.values.len(), s.rows, matches!(s.owner, Owner::Merged)))
            .collect();
        assert_eq!(
            shape,
            [
                (0, None, false),
                (26, Some(13), true),
                (0, None, false),
                (4, Some(2), true),
                (2, None, false),
                (2, None, false),
            ]
        );
        assert_eq!(
            merged[1].key,
            (
                Cow::Borrowed("INSERT INTO t (a, b) SELECT * FROM unnest($1, $2)"),
                vec![Type::INT8_ARRAY, Type::INT8_ARRAY]
            )
        );
        let order: Vec<i64> = merged
            .iter()
            .flat_map(|s| s.values.iter())
            .map(|v| match v {
                AnyValueKind::BigInt(n) => *n,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            order,
            (0..34).collect::<Vec<i64>>(),
            "every value, in order"
        );
    }

    /// The rows of each text go together at the place of the first of them, in their order,
    /// their clause after the rows kept, past statements that do not name their table:
    /// interleaved stages and receipts, and those of the next activation after a fence and
    /// updates of other tables, become one statement each. A statement naming the table, or one
    /// of the group's own, ends what later rows join.
    #[test]
    fn gathers_inserts_by_text_past_statements_that_do_not_name_their_table() {
        const A: &str = "INSERT INTO a (x) VALUES ($1) ON CONFLICT (x) DO NOTHING";
        const B: &str = "INSERT INTO b (x) VALUES ($1)";
        let values: Vec<AnyValueKind> = (0..9).map(AnyValueKind::BigInt).collect();
        let step = |text: &'static str, i: usize| Step {
            owner: Owner::Job(i % 2, None),
            key: (text.into(), vec![Type::INT8]),
            values: vec![&values[i]],
            rows: None,
        };
        let other = |owner: Owner, text: &'static str| Step {
            owner,
            key: (text.into(), Vec::new()),
            values: Vec::new(),
            rows: None,
        };
        // a0 b1 a2 b3 a4 | guard of neither | b5 | update of a | a6 b7 | the group's | b8
        let mut steps: Vec<Step<'_>> = (0..5)
            .map(|i| step(if i % 2 == 0 { A } else { B }, i))
            .collect();
        steps.push(other(
            Owner::Job(0, Some(Check::Holds("x"))),
            "UPDATE ab SET x = 1 WHERE a_b = 2 RETURNING x",
        ));
        steps.push(step(B, 5));
        steps.push(other(Owner::Job(1, None), "UPDATE a SET x = 1"));
        steps.push(step(A, 6));
        steps.push(step(B, 7));
        steps.push(other(Owner::Group, "SELECT 1"));
        steps.push(step(B, 8));
        let merged = merge_inserts(steps);
        let shape: Vec<(String, Vec<i64>)> = merged
            .iter()
            .map(|s| {
                let rows = s
                    .values
                    .iter()
                    .map(|v| match v {
                        AnyValueKind::BigInt(n) => *n,
                        other => panic!("{other:?}"),
                    })
                    .collect();
                (s.key.0.to_string(), rows)
            })
            .collect();
        assert_eq!(
            shape,
            [
                (
                    "INSERT INTO a (x) SELECT * FROM unnest($1) ON CONFLICT (x) DO NOTHING"
                        .to_owned(),
                    vec![0, 2, 4]
                ),
                (
                    "INSERT INTO b (x) SELECT * FROM unnest($1)".to_owned(),
                    vec![1, 3, 5, 7]
                ),
                (
                    "UPDATE ab SET x = 1 WHERE a_b = 2 RETURNING x".to_owned(),
                    vec![]
                ),
                ("UPDATE a SET x = 1".to_owned(), vec![]),
                (A.to_owned(), vec![6]),
                ("SELECT 1".to_owned(), vec![]),
                (B.to_owned(), vec![8]),
            ]
        );
    }

    /// A statement marked `once` runs at its first place in the group only, when its text and
    /// values repeat; with other values, or unmarked, it runs each time.
    #[test]
    fn a_once_statement_runs_once_per_group() {
        let job = |zones: &[&str]| {
            let mut sql = crate::Sql::default();
            for zone in zones {
                sql.push_statement("SELECT 1 FROM z WHERE id = $1 FOR SHARE")
                    .bind(zone.to_string())
                    .once();
                sql.push_statement("INSERT INTO r (z) VALUES ($1) RETURNING z")
                    .bind(zone.to_string());
            }
            Job {
                body: sql.into_statements(),
                events: Vec::new(),
                touched: Touched::default(),
                requires: None,
                waiter: Waiter::Behind,
            }
        };
        let jobs = [job(&["a"]), job(&["a", "b"]), job(&["b"])];
        let node = AnyValueKind::Text(Arc::new("n".to_owned()));
        let chain = [
            AnyValueKind::Text(Arc::default()),
            AnyValueKind::Text(Arc::default()),
        ];
        let steps = pipeline(&jobs, &[0, 1, 2], &node, &chain, true);
        assert!(
            matches!(steps[0].owner, Owner::Chain),
            "the chain comes first"
        );
        let shape: Vec<(usize, &str)> = steps[1..]
            .iter()
            .map(|s| match (s.owner, s.values.first()) {
                (Owner::Job(i, _), Some(AnyValueKind::Text(z))) => (i, z.as_str()),
                _ => panic!("only job statements"),
            })
            .collect();
        assert_eq!(
            shape,
            [(0, "a"), (0, "a"), (1, "a"), (1, "b"), (1, "b"), (2, "b")],
            "each zone locked once, every insert kept"
        );
        // Without job 0, job 1 takes the lock on `a` itself.
        let steps = pipeline(&jobs, &[1, 2], &node, &chain, true);
        assert_eq!(steps.len(), 1 + 5);
    }

    /// A guard keeps its text inside the raising wrapper, and only a fence raises for a cancel.
    #[test]
    fn wraps_guards_in_the_raising_function() {
        let fence = raising(
            "UPDATE runs SET x = $1 RETURNING cancel_requested",
            Check::Fence,
        );
        assert!(
            fence.starts_with("WITH guard AS (UPDATE runs SET x = $1 RETURNING cancel_requested)")
        );
        assert!(fence.ends_with(", true)"), "{fence}");
        let holds = raising("SELECT 1 FROM t WHERE id = $1", Check::Holds("moved"));
        assert!(holds.ends_with(", false)"), "{holds}");
    }
}
