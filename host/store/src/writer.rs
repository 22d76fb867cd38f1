//! SQLite's group writer: one thread with its own connection that commits group commits
//! (`engine.rs`, [`crate::Store::commit_guarded`]) from statements it keeps prepared.
//!
//! A group is many callers' statements in one transaction. Sent through sqlx as one text, SQLite
//! parsed it anew every time (a group's text never repeats, so sqlx cannot cache it): a third of
//! the writer's time in the profile (BENCHMARKS.md). Here every statement keeps its own text
//! (`Sql` keeps statements apart), so the few dozen distinct texts stay prepared ([`Prepared`])
//! and a group costs binding and stepping only.
//!
//! Callers queue their statements ([`GroupWriter::enqueue`]) and the thread takes whatever is
//! queued each time it is free: while one group commits, the next gathers, and no async task
//! stands between one commit and the next. (Handing each group over from a tokio task leaves the
//! thread idle while that task waits its turn behind the very callers the last commit has just
//! woken: measured that way, the writer was busy half the time and the machine a third idle at
//! 32 executions in flight; BENCHMARKS.md.)
//!
//! When one caller's guard fails (a lost lease, a cancel, a value that moved) or one of its
//! statements is refused (a unique key), the transaction rolls back, that caller alone gets the
//! error, and the group runs again without it; the others commit.
//!
//! SQLite allows one writer: the process's other writes go through sqlx's single-connection
//! writer pool. The thread commits only in a *session*, while a tokio task holds that pool's
//! connection for it ([`crate::Store`]'s `group_session`), so the two never race for the file's
//! write lock (other processes, like the CLI, wait in the busy timeout). A session ends
//! when nothing has been queued for [`LINGER`], after [`SLICE`], or at its next group when a
//! transaction waits for the pool, so the pool's other users get their turn; the task then gives
//! the connection back (and takes it again for the next session).

use crate::engine::Returned;
use crate::sql::Statement;
use capstan_core::store::StoreError;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OpenFlags};
use sqlx_core::any::AnyValueKind;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

/// Prepared statements kept per connection: every distinct text the engine, the simulator and
/// the relay write (partial updates have a text per combination of columns) fits many times.
/// Texts past it (none are expected) are prepared through rusqlite's cache, which keeps as many.
const PREPARED: usize = 512;

/// How long a session waits for the next caller once the queue is empty. Under load the next
/// caller comes within microseconds; waiting a little spares it opening a session (a task and
/// the pool's connection) and costs sqlx's writers at most this much.
const LINGER: Duration = Duration::from_millis(1);

/// The longest patient parts ([`Job::patient`]: writes behind their answers, audit records riding
/// a change or written behind a read's answer) wait, when nothing else is queued, for a part to
/// commit with: committing each on its own (a `COMMIT` and its WAL pages apiece: ten per
/// execution alone) buys nothing. Any other part, a transaction waiting for the writer pool, or a
/// caller settling or hurrying them ([`GroupWriter::hurry`]) ends the wait.
pub(crate) const BEHIND_COMPANY: Duration = Duration::from_millis(2);

/// The longest a session keeps the writer pool's connection while callers keep coming. A
/// transaction waiting for that connection ([`crate::Store::begin_write`]) ends the session at the
/// next group instead; other statements on the pool wait at most this long.
const SLICE: Duration = Duration::from_millis(25);

/// Bytes of statements (texts and values) queued for the writer at most. A slow disk makes
/// callers wait for room ([`GroupWriter::room`]) instead of growing the queue without bound;
/// writes behind answers, which cannot wait, are refused when there is none
/// ([`GroupWriter::try_room`]) and their callers take the ordinary path, which waits.
pub(crate) const QUEUE_BYTES: usize = 64 << 20;

/// One caller's part of a group: statements, guards marked ([`Statement::check`]).
pub(crate) enum Part {
    Statements(Vec<Statement>),
}

impl Part {
    /// What the part counts against [`QUEUE_BYTES`].
    fn weight(&self) -> usize {
        match self {
            Part::Statements(statements) => statements.iter().map(Statement::weight).sum(),
        }
    }
}

/// A job's share of the queue's room, given back once the job is answered.
pub(crate) struct Room {
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// A part's answer: the first column of every row its statements returned, guards aside.
pub(crate) type Answer = Result<Vec<Returned>, StoreError>;

/// What a waiting caller receives: its answer, and its part back. The part's statements and
/// values were allocated on the caller's thread; freed there, they go back to that thread's
/// own pages, where the writer's thread would free them from afar (mimalloc queues such a
/// free for the owning thread to collect later, which showed as ~6 % of the server's samples
/// at 32 in flight, besides the writer's own time spent dropping them).
pub(crate) struct Answered {
    pub(crate) answer: Answer,
    /// Held to be dropped where the answer is received; read only by a test.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "carried back only to be freed by its caller")
    )]
    pub(crate) part: Part,
}

impl Answered {
    /// The answer; the part is dropped here, on the receiving thread.
    pub(crate) fn into_answer(self) -> Answer {
        self.answer
    }
}

/// How a part someone waits for rides the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waits {
    /// Its caller waits for it: the thread takes it at once.
    Hurried,
    /// It waits for company ([`Job::patient`]).
    Patient,
    /// Its caller waits for it, and work builds on it before it commits ([`Job::ahead`]): the
    /// thread takes it at once, so its sync overlaps the first steps built on it.
    Ahead,
}

/// One caller's statements waiting for the next group commit.
pub(crate) struct Job {
    pub(crate) part: Part,
    /// The statements insert outbox events (wake the streams after the commit).
    pub(crate) events: bool,
    /// The part is refused, unrun, unless the [`Behind`] epoch is still this one.
    pub(crate) requires: Option<u64>,
    /// Work already builds on the part before it commits (a trigger whose run started at once,
    /// [`capstan_core::store::RunStore::queue_ahead`]): if it fails, the epoch moves, as for a
    /// write behind its answer, so nothing decided on it commits.
    pub(crate) ahead: bool,
    /// Who waits for the answer; `None`: a write behind its answer ([`Behind`]), which nobody
    /// waits for: if it fails, the epoch moves.
    pub(crate) done: Option<tokio::sync::oneshot::Sender<Answered>>,
    /// The part waits for company ([`BEHIND_COMPANY`]) instead of waking the thread: a write
    /// behind its answer, or a part its caller expects another of its parts to carry (an audit
    /// record queued while the change it records is decided, [`crate::Store::insert_audit_during`]).
    pub(crate) patient: bool,
    /// When it was queued (how long writes behind answers have waited for company).
    pub(crate) queued_at: Instant,
    /// Its room in the queue ([`GroupWriter::room`]).
    pub(crate) room: Room,
}

/// Writes made behind their answers ([`crate::Store::write_behind`]): a caller that decided in
/// memory answers at once and queues its writes, and whoever recorded the answer commits after
/// them (the queue is first in, first out, and groups commit in order), so its commit is durable
/// only if they are. If one of them fails, the epoch moves: every part that named the epoch
/// before is refused from then on — the other writes behind answers decided on what the failed
/// one said, and the commits that record such answers —, so nothing that depends on a write that
/// did not commit ever commits.
#[derive(Debug)]
pub(crate) struct Behind {
    epoch: AtomicU64,
    /// Writes behind answers queued so far.
    queued: AtomicU64,
    /// Of those, how many the writer has answered (committed or failed), in queue order.
    answered: tokio::sync::watch::Sender<u64>,
    /// Callers waiting for them ([`Behind::settled`]): the writer commits them without waiting
    /// for company.
    settling: AtomicUsize,
    /// The activations under way on this node, by run: the epoch the oldest began under, and
    /// how many there are (a run claimed again after its lease lapsed may briefly have two; the
    /// older epoch holds both to the stricter check). A commit under a run's fence is refused
    /// if the epoch moved since: it may record an answer whose write failed.
    activations: Mutex<std::collections::HashMap<String, (u64, usize)>>,
}

impl Default for Behind {
    fn default() -> Self {
        Self {
            epoch: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            answered: tokio::sync::watch::Sender::new(0),
            settling: AtomicUsize::new(0),
            activations: Mutex::default(),
        }
    }
}

/// Counts a caller settling writes behind answers while it lives.
struct Settling<'a>(&'a AtomicUsize);

impl Drop for Settling<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The error of a part refused because its epoch moved.
pub(crate) const REFUSED_BEHIND: &str = "a write made behind a provider's answer failed, and this commit may depend on it: the run replays the call";

impl Behind {
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// An activation of `run_id` begins: the answers it gets from now on are given under the
    /// current epoch or a later one.
    pub(crate) fn activation_began(&self, run_id: &str) {
        let epoch = self.epoch();
        let mut activations = self
            .activations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let entry = activations.entry(run_id.to_owned()).or_insert((epoch, 0));
        entry.1 += 1;
    }

    pub(crate) fn activation_ended(&self, run_id: &str) {
        let mut activations = self
            .activations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = activations.get_mut(run_id) {
            entry.1 -= 1;
            if entry.1 == 0 {
                activations.remove(run_id);
            }
        }
    }

    /// The epoch a commit under `run_id`'s fence must still find: the one its activation began
    /// under; `None` when no activation of the run is under way here (nothing it commits can
    /// record an answer given behind its write).
    pub(crate) fn required_by(&self, run_id: &str) -> Option<u64> {
        let activations = self
            .activations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        activations.get(run_id).map(|(epoch, _)| *epoch)
    }

    /// Counts a write behind its answer before it is queued; its number in the queue.
    pub(crate) fn queue(&self) -> u64 {
        self.queued.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// How many writes behind answers the writer has answered.
    pub(crate) fn answered(&self) -> u64 {
        *self.answered.borrow()
    }

    /// Returns once every write behind its answer queued before the call is answered; `nudge`
    /// wakes the writer, which then commits them without waiting for company.
    pub(crate) async fn settled(&self, nudge: impl FnOnce()) {
        let target = self.queued.load(Ordering::Acquire);
        if self.answered() >= target {
            return;
        }
        self.settling.fetch_add(1, Ordering::AcqRel);
        let _settling = Settling(&self.settling);
        nudge();
        let mut answered = self.answered.subscribe();
        let _ = answered.wait_for(|n| *n >= target).await;
    }

    pub(crate) fn fail(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether a caller waits for the writes behind answers ([`Behind::settled`]).
    pub(crate) fn settling(&self) -> bool {
        self.settling.load(Ordering::Acquire) > 0
    }

    /// A write counted by [`Behind::queue`] that could not be queued: it failed.
    pub(crate) fn give_up(&self) {
        self.fail();
        self.count_answered(1);
    }

    pub(crate) fn count_answered(&self, n: u64) {
        if n > 0 {
            self.answered.send_modify(|a| *a += n);
        }
    }
}

/// A caller hurrying patient parts ([`GroupWriter::hurry`]).
pub(crate) struct Hurry<'a>(&'a AtomicUsize);

impl Drop for Hurry<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Jobs waiting for the thread, and whether a session is open to take them.
#[derive(Default)]
struct Queue {
    jobs: Vec<Job>,
    /// A session is open or being opened: a caller that queues need not open one.
    open: bool,
    /// The thread waits on [`Shared::arrived`] for the next job.
    parked: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    arrived: Condvar,
    behind: Arc<Behind>,
    /// Callers waiting for a patient part of theirs ([`GroupWriter::hurry`]): the thread commits
    /// patient parts without waiting for company.
    hurried: AtomicUsize,
    /// Transactions committed so far.
    committed: AtomicU64,
}

impl Shared {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Nothing was queued for [`LINGER`]; the session is closed (the next caller opens one).
    Drained,
    /// [`SLICE`] is up and callers are still queued: open the next session at once.
    SliceUsed,
}

/// A session: the thread commits until it ends, then says how.
struct Session {
    ended: tokio::sync::oneshot::Sender<Ended>,
}

/// How often the checkpointer copies the WAL's committed pages into the database file.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// WAL pages after which the group writer checkpoints in its own commit, as SQLite does by
/// default at 1,000: only when the checkpointer thread has not kept up (or could not start), so
/// the WAL stays bounded (~40 MiB) whatever happens to that thread.
const BACKSTOP_PAGES: u32 = 10_000;

/// The handle to the writer thread (and its checkpointer); both end when it is dropped.
pub(crate) struct GroupWriter {
    sessions: mpsc::Sender<Session>,
    shared: Arc<Shared>,
    /// Room in the queue, in bytes ([`QUEUE_BYTES`]).
    room: Arc<tokio::sync::Semaphore>,
    capacity: usize,
    _checkpoints: mpsc::Sender<()>,
    /// Checkpoints the checkpointer has run (not those it skipped: [`checkpoint_until_stopped`]).
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "counted for the test that the checkpointer rests")
    )]
    checkpointed: Arc<AtomicU64>,
}

impl std::fmt::Debug for GroupWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupWriter")
    }
}

impl GroupWriter {
    /// Starts the thread; it opens its connection to the database file at `path` itself (an
    /// open that fails is answered to every job). `events` is bumped after a commit that wrote
    /// outbox events.
    pub(crate) fn start(
        path: String,
        synchronous: crate::Synchronous,
        events: Arc<tokio::sync::watch::Sender<u64>>,
        wanted: Arc<AtomicUsize>,
        behind: Arc<Behind>,
        capacity: usize,
    ) -> std::io::Result<Self> {
        let (checkpoints, stop) = mpsc::channel::<()>();
        let checkpointer_path = path.clone();
        let checkpointed = Arc::new(AtomicU64::new(0));
        let ran = checkpointed.clone();
        std::thread::Builder::new()
            .name("capstan-sqlite-checkpoint".to_owned())
            .spawn(move || {
                checkpoint_until_stopped(&checkpointer_path, synchronous, &stop, &ran)
            })?;
        let (sessions, receive) = mpsc::channel::<Session>();
        let shared = Arc::new(Shared {
            behind,
            ..Shared::default()
        });
        let queue = shared.clone();
        std::thread::Builder::new()
            .name("capstan-sqlite-writer".to_owned())
            .spawn(move || {
                let connection = open(&path, synchronous);
                let mut prepared = connection.as_ref().map(Prepared::new);
                while let Ok(session) = receive.recv() {
                    let ended = match &mut prepared {
                        Ok(prepared) => run_session(prepared, &queue, &events, &wanted),
                        Err(e) => queue.fail_all(&StoreError::Unavailable(e.clone())),
                    };
                    let _ = session.ended.send(ended);
                }
            })?;
        let capacity = capacity.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        Ok(Self {
            sessions,
            shared,
            room: Arc::new(tokio::sync::Semaphore::new(capacity)),
            capacity,
            _checkpoints: checkpoints,
            checkpointed,
        })
    }

    /// The bytes `part` takes in the queue: a part larger than the whole queue takes all of it
    /// (and waits for the queue to empty).
    fn share(&self, part: &Part) -> u32 {
        let share = part.weight().clamp(1, self.capacity);
        u32::try_from(share).unwrap_or(u32::MAX)
    }

    /// Waits until the queue has room for `part`.
    pub(crate) async fn room(&self, part: &Part) -> Result<Room, StoreError> {
        self.room
            .clone()
            .acquire_many_owned(self.share(part))
            .await
            .map(|permit| Room { _permit: permit })
            .map_err(|_| crate::engine::interrupted())
    }

    /// Room for `part` if the queue has it now.
    pub(crate) fn try_room(&self, part: &Part) -> Option<Room> {
        self.room
            .clone()
            .try_acquire_many_owned(self.share(part))
            .ok()
            .map(|permit| Room { _permit: permit })
    }

    /// Queues a job for the next group; true when no session is open, and the caller must open
    /// one ([`GroupWriter::session`]) while it holds the writer pool's connection.
    pub(crate) fn enqueue(&self, job: Job) -> bool {
        // A patient part does not wake the thread: it waits for company anyway, and the thread
        // finds it when its wait ends (at most [`LINGER`] or [`BEHIND_COMPANY`]).
        let waited = !job.patient;
        let (parked, open) = {
            let mut queue = self.shared.queue();
            queue.jobs.push(job);
            (
                queue.parked && waited,
                std::mem::replace(&mut queue.open, true),
            )
        };
        // Woken after the lock is let go: the thread, woken while the caller still held it,
        // often ran at once on the caller's core and blocked on that lock (~100 such switches a
        // second on each side in a `sched_switch` profile, BENCHMARKS.md). It finds
        // the job either way: it looks for jobs under the lock before it parks.
        if parked {
            self.shared.arrived.notify_one();
        }
        !open
    }

    /// Wakes the thread if it waits (a caller settles writes behind answers).
    pub(crate) fn nudge(&self) {
        if self.shared.queue().parked {
            self.shared.arrived.notify_one();
        }
    }

    /// Patient parts queued so far commit without waiting for company while the guard lives: a
    /// caller now waits for one of them, and no part of its own will come to carry it.
    pub(crate) fn hurry(&self) -> Hurry<'_> {
        self.shared.hurried.fetch_add(1, Ordering::AcqRel);
        self.nudge();
        Hurry(&self.shared.hurried)
    }

    /// Checkpoints the checkpointer thread has run so far.
    #[cfg(test)]
    pub(crate) fn checkpoints(&self) -> u64 {
        self.checkpointed.load(Ordering::Acquire)
    }

    /// Transactions the thread has committed so far (a group that runs again without a failed
    /// part is one more).
    pub(crate) fn committed(&self) -> u64 {
        self.shared.committed.load(Ordering::Acquire)
    }

    /// Runs one session on the thread (the caller holds the writer pool's connection until it
    /// ends).
    pub(crate) async fn session(&self) -> Ended {
        let (ended, answer) = tokio::sync::oneshot::channel();
        if self.sessions.send(Session { ended }).is_err() {
            return self.fail_all(&crate::engine::interrupted());
        }
        match answer.await {
            Ok(ended) => ended,
            Err(_) => self.fail_all(&crate::engine::interrupted()),
        }
    }

    /// Fails every queued job and closes the session (the thread is gone, or the writer pool's
    /// connection could not be had).
    pub(crate) fn fail_all(&self, e: &StoreError) -> Ended {
        self.shared.fail_all(e)
    }
}

impl Shared {
    fn fail_all(&self, e: &StoreError) -> Ended {
        let jobs = {
            let mut queue = self.queue();
            queue.open = false;
            std::mem::take(&mut queue.jobs)
        };
        let behind = jobs.iter().filter(|job| job.done.is_none()).count() as u64;
        if behind > 0 || jobs.iter().any(|job| job.ahead) {
            self.behind.fail();
        }
        for job in jobs {
            if let Some(done) = job.done {
                let _ = done.send(Answered {
                    answer: Err(e.clone()),
                    part: job.part,
                });
            }
        }
        self.behind.count_answered(behind);
        Ended::Drained
    }
}

/// Commits what is queued, group after group, until nothing comes for [`LINGER`], [`SLICE`] is
/// up, or a transaction waits for the writer pool (`wanted`).
fn run_session(
    conn: &mut Prepared<'_>,
    shared: &Shared,
    events: &tokio::sync::watch::Sender<u64>,
    wanted: &AtomicUsize,
) -> Ended {
    let started = Instant::now();
    loop {
        let jobs = {
            let mut queue = shared.queue();
            let give_up = Instant::now() + LINGER;
            loop {
                let now = Instant::now();
                let wait_until = match queue.jobs.first() {
                    None if now >= give_up => {
                        queue.open = false;
                        return Ended::Drained;
                    }
                    None => give_up,
                    // Only patient parts: they wait a little for company.
                    Some(oldest)
                        if queue.jobs.iter().all(|job| job.patient)
                            && now < oldest.queued_at + BEHIND_COMPANY
                            && shared.behind.settling.load(Ordering::Acquire) == 0
                            && shared.hurried.load(Ordering::Acquire) == 0
                            && wanted.load(Ordering::Relaxed) == 0 =>
                    {
                        oldest.queued_at + BEHIND_COMPANY
                    }
                    Some(_) => break,
                };
                queue.parked = true;
                queue = shared
                    .arrived
                    .wait_timeout(queue, wait_until - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                queue.parked = false;
            }
            std::mem::take(&mut queue.jobs)
        };
        crate::count_write();
        // Given back once every part is answered: until then the parts are still in memory.
        let mut rooms = Vec::with_capacity(jobs.len());
        let (parts, waiters): (Vec<Entry>, Vec<_>) = jobs
            .into_iter()
            .map(|job| {
                rooms.push(job.room);
                let entry = Entry {
                    part: job.part,
                    requires: job.requires,
                    moves_epoch: job.done.is_none() || job.ahead,
                };
                (entry, (job.events, job.done))
            })
            .unzip();
        let answers = commit(conn, &parts, shared);
        if waiters
            .iter()
            .zip(&answers)
            .any(|((events, _), answer)| *events && answer.is_ok())
        {
            events.send_modify(|n| *n = n.wrapping_add(1));
        }
        // Writes behind answers are counted before anyone is answered: a caller answered next
        // finds every write queued ahead of it counted.
        let mut behind = 0;
        for ((_, done), answer) in waiters.iter().zip(&answers) {
            if done.is_none() {
                if let Err(error) = answer {
                    tracing::warn!(%error, "a write made behind its answer failed");
                }
                behind += 1;
            }
        }
        shared.behind.count_answered(behind);
        for ((entry, (_, done)), answer) in parts.into_iter().zip(waiters).zip(answers) {
            if let Some(done) = done {
                let _ = done.send(Answered {
                    answer,
                    part: entry.part,
                });
            }
        }
        drop(rooms);
        if started.elapsed() >= SLICE || wanted.load(Ordering::Relaxed) > 0 {
            return Ended::SliceUsed;
        }
    }
}

/// Checkpoints the WAL every [`CHECKPOINT_EVERY`] on a connection of its own until `stop`'s
/// sender is dropped.
///
/// SQLite checkpoints automatically in the commit that grows the WAL past 1,000 pages, so the
/// group writer would copy pages and `fsync` the database file in the middle of its commits
/// (~12 % of its time in a profile, BENCHMARKS.md) while every caller waited. Its
/// connection moves that threshold out of the way ([`BACKSTOP_PAGES`]) and this thread
/// checkpoints instead, `PASSIVE`ly: it copies what no reader still needs and never blocks the
/// writer or a reader.
///
/// Once a checkpoint has copied the whole WAL, the next ones wait until the WAL file changes
/// (its length or modification time): a checkpoint with nothing to copy still runs a statement
/// and takes and gives back SQLite's locks, ten times a second on an idle node, where one `statx`
/// tells the same (BENCHMARKS.md, "What an idle node spends"). The file's metadata is read before
/// the checkpoint, so a commit that lands during it shows as a change and is copied by the next
/// one; a change the file's timestamps are too coarse to show waits for the next commit, in the
/// WAL, where it is as durable.
fn checkpoint_until_stopped(
    path: &str,
    synchronous: crate::Synchronous,
    stop: &mpsc::Receiver<()>,
    ran: &AtomicU64,
) {
    let conn = match open(path, synchronous) {
        Ok(conn) => conn,
        Err(error) => {
            tracing::warn!(%error, "no WAL checkpointer: SQLite's automatic checkpoints remain");
            return;
        }
    };
    let wal = std::path::PathBuf::from(format!("{path}-wal"));
    // The WAL as it stood before the last checkpoint that copied all of it.
    let mut copied = None;
    while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(CHECKPOINT_EVERY) {
        let stamp = wal_stamp(&wal);
        if stamp.is_some() && stamp == copied {
            continue;
        }
        let outcome = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, i64>(2)?,
            ))
        });
        ran.fetch_add(1, Ordering::AcqRel);
        copied = match outcome {
            // Not blocked, and every frame of the log copied into the database file.
            Ok((0, log, done)) if log == done => stamp,
            Ok(_) => None,
            Err(error) => {
                tracing::debug!(%error, "WAL checkpoint failed; retrying");
                None
            }
        };
    }
}

/// The WAL file's length and modification time, which every write to it changes; `None` when
/// they cannot be read (no file yet, an in-memory database): then the checkpointer never rests.
fn wal_stamp(wal: &std::path::Path) -> Option<(u64, std::time::SystemTime)> {
    let metadata = std::fs::metadata(wal).ok()?;
    Some((metadata.len(), metadata.modified().ok()?))
}

fn open(path: &str, synchronous: crate::Synchronous) -> Result<Connection, String> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    // Commits that sync the WAL write their frames in a call or two instead of two per frame
    // (`gather`); the weaker mode has no sync to write them by, so it keeps SQLite's own VFS.
    let conn = match synchronous {
        crate::Synchronous::Full => crate::gather::register()
            .map_err(|code| format!("the SQLite group writer cannot register its VFS: code {code}"))
            .and_then(|()| {
                Connection::open_with_flags_and_vfs(path, flags, crate::gather::NAME)
                    .map_err(|e| format!("the SQLite group writer cannot open {path}: {e}"))
            })?,
        crate::Synchronous::Normal => Connection::open_with_flags(path, flags)
            .map_err(|e| format!("the SQLite group writer cannot open {path}: {e}"))?,
    };
    // As sqlx's connections (`Store::connect_sqlite`); WAL is the file's own, set by them.
    conn.execute_batch(synchronous.pragmas())
        .map_err(|e| format!("the SQLite group writer cannot configure {path}: {e}"))?;
    crate::reader::plan_once(&conn)
        .map_err(|e| format!("the SQLite group writer cannot configure {path}: {e}"))?;
    // Checkpoints are the checkpointer thread's (`checkpoint_until_stopped`).
    conn.execute_batch(&format!("PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}"))
        .map_err(|e| format!("the SQLite group writer cannot configure {path}: {e}"))?;
    conn.set_prepared_statement_cache_capacity(PREPARED);
    Ok(conn)
}

pub(crate) fn failed(e: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// Runs a prepared statement without arguments (transaction control).
fn control(conn: &mut Prepared<'_>, text: &'static str) -> Result<(), StoreError> {
    conn.run(text, &[]).map(|_| ()).map_err(failed)
}

/// The group writer's statements, each prepared once for the life of its connection, with the
/// value each of its parameters takes.
///
/// rusqlite's own cache (`prepare_cached`) takes a statement out of its LRU list and puts it back
/// on every use, copying the statement's text into a new `Arc<str>` each time and clearing its
/// bindings; the writer runs a hundred statements per ten-stage execution, one after the other
/// on its one thread, so it keeps them in a map of its own. And SQLite finds a `$N` parameter's
/// name by walking the statement's list of names, so looking each one up at every bind cost a
/// statement of n parameters n² steps (BENCHMARKS.md, "changes measured"); which value each
/// parameter takes is worked out once, when the statement is prepared. A statement keeps SQLite's
/// copies of its last values until its next run rebinds them: at most one set of values per text.
pub(crate) struct Prepared<'c> {
    conn: &'c Connection,
    statements: std::collections::HashMap<Box<str>, Kept<'c>, foldhash::fast::RandomState>,
}

/// A prepared statement and, for each of its parameters in order, the index of the value it
/// takes ([`Statement::values`]).
struct Kept<'c> {
    statement: rusqlite::Statement<'c>,
    values: Vec<usize>,
}

impl<'c> Prepared<'c> {
    fn new(conn: &'c Connection) -> Self {
        Self {
            conn,
            statements: std::collections::HashMap::default(),
        }
    }

    fn is_autocommit(&self) -> bool {
        self.conn.is_autocommit()
    }

    /// Binds `values` to the statement of `text` and runs it; the first column of each row it
    /// returns.
    fn run(&mut self, text: &str, values: &[AnyValueKind]) -> rusqlite::Result<Vec<Returned>> {
        if let Some(kept) = self.statements.get_mut(text) {
            return kept.run(values);
        }
        if self.statements.len() >= PREPARED {
            let mut prepared = self.conn.prepare_cached(text)?;
            bind(&mut prepared, values)?;
            return returned(&mut prepared);
        }
        let statement = self
            .conn
            .prepare_with_flags(text, rusqlite::PrepFlags::SQLITE_PREPARE_PERSISTENT)?;
        let at = (1..=statement.parameter_count())
            .map(|index| value_index(&statement, index))
            .collect();
        self.statements
            .entry(text.into())
            .or_insert(Kept {
                statement,
                values: at,
            })
            .run(values)
    }
}

impl Kept<'_> {
    fn run(&mut self, values: &[AnyValueKind]) -> rusqlite::Result<Vec<Returned>> {
        for (index, &at) in self.values.iter().enumerate() {
            bind_value(&mut self.statement, index + 1, values, at)?;
        }
        returned(&mut self.statement)
    }
}

/// Steps a bound statement to its end (resetting it): the first column of each row.
fn returned(prepared: &mut rusqlite::Statement<'_>) -> rusqlite::Result<Vec<Returned>> {
    let mut rows = prepared.raw_query();
    let mut returned = Vec::new();
    while let Some(row) = rows.next()? {
        returned.push(row.get::<_, Returned>(0)?);
    }
    Ok(returned)
}

/// The index of the value the statement's `index`-th parameter (from 1) takes: `$N` takes the
/// statement's N-th value (as sqlx binds them), `?` the next one.
fn value_index(prepared: &rusqlite::Statement<'_>, index: usize) -> usize {
    prepared
        .parameter_name(index)
        .and_then(|name| name.strip_prefix('$'))
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(index)
        .saturating_sub(1)
}

/// A part of a group with what the writer checks around it.
struct Entry {
    part: Part,
    requires: Option<u64>,
    /// A write behind its answer, or a part work builds on ahead of its commit
    /// ([`Job::ahead`]): its failure moves the epoch.
    moves_epoch: bool,
}

/// Commits the group in one transaction and answers each part. A part that fails (a guard that
/// does not hold, a refused statement) rolls the transaction back; it gets its error, and the
/// group runs again without it, so the others commit as if it had not been there. (Failures are
/// rare, so this costs less than a savepoint per part, whose sub-journal copies every page a
/// part first touches.) When the transaction itself fails, every part still waiting fails.
///
/// A part that names an epoch of [`Behind`] that has moved is refused without running. A write
/// behind its answer that fails moves the epoch at once, so the parts after it that named the
/// old one — in this group's next run or in later groups — are refused.
fn commit(conn: &mut Prepared<'_>, parts: &[Entry], shared: &Shared) -> Vec<Answer> {
    let behind = &shared.behind;
    let mut answers: Vec<Option<Answer>> = parts.iter().map(|_| None).collect();
    'group: loop {
        let waiting: Vec<usize> = (0..parts.len()).filter(|&i| answers[i].is_none()).collect();
        if waiting.is_empty() {
            break;
        }
        let started = std::time::Instant::now();
        if let Err(e) = control(conn, "BEGIN IMMEDIATE") {
            return fail_waiting(answers, parts, behind, &e);
        }
        let mut returned = Vec::with_capacity(waiting.len());
        let mut ran = Vec::with_capacity(waiting.len());
        for &i in &waiting {
            if parts[i].requires.is_some_and(|e| e != behind.epoch()) {
                // Nothing of it ran: the transaction goes on without it.
                answers[i] = Some(Err(StoreError::Unavailable(REFUSED_BEHIND.to_owned())));
                continue;
            }
            match run_part(conn, &parts[i].part) {
                Ok(rows) => {
                    returned.push(rows);
                    ran.push(i);
                }
                Err(e) => {
                    if parts[i].moves_epoch {
                        behind.fail();
                    }
                    if !conn.is_autocommit() && control(conn, "ROLLBACK").is_err() {
                        answers[i] = Some(Err(e.clone()));
                        return fail_waiting(answers, parts, behind, &e);
                    }
                    answers[i] = Some(Err(e));
                    continue 'group;
                }
            }
        }
        if let Err(e) = control(conn, "COMMIT") {
            if !conn.is_autocommit() {
                let _ = control(conn, "ROLLBACK");
            }
            return fail_waiting(answers, parts, behind, &e);
        }
        shared.committed.fetch_add(1, Ordering::AcqRel);
        crate::observe_commit("sqlite", ran.len(), started);
        for (i, rows) in ran.into_iter().zip(returned) {
            answers[i] = Some(Ok(rows));
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Ok(Vec::new())))
        .collect()
}

/// Every part not answered yet fails with `e` (a write behind its answer or a part worked on
/// ahead among them moves the epoch).
fn fail_waiting(
    answers: Vec<Option<Answer>>,
    parts: &[Entry],
    behind: &Behind,
    e: &StoreError,
) -> Vec<Answer> {
    if answers
        .iter()
        .zip(parts)
        .any(|(answer, part)| answer.is_none() && part.moves_epoch)
    {
        behind.fail();
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(e.clone())))
        .collect()
}

/// One caller's part; the first error (or failed guard) ends it.
fn run_part(conn: &mut Prepared<'_>, part: &Part) -> Answer {
    match part {
        Part::Statements(statements) => run_statements(conn, statements),
    }
}

/// Statements in order; the first error (or failed guard) ends them.
fn run_statements(conn: &mut Prepared<'_>, statements: &[Statement]) -> Answer {
    let mut returned = Vec::new();
    for statement in statements {
        let rows = conn
            .run(&statement.text, statement.values())
            .map_err(failed)?;
        match statement.check {
            Some(check) => check.verdict(rows.first().map(|v| match v {
                Returned::Integer(i) => *i,
                _ => 0,
            }))?,
            None => returned.extend(rows),
        }
    }
    Ok(returned)
}

/// Binds the statement's values to its prepared form (the readers' statements, `reader.rs`, and
/// the writer's past [`PREPARED`]).
pub(crate) fn bind(
    prepared: &mut rusqlite::Statement<'_>,
    values: &[AnyValueKind],
) -> rusqlite::Result<()> {
    for index in 1..=prepared.parameter_count() {
        let at = value_index(prepared, index);
        bind_value(prepared, index, values, at)?;
    }
    Ok(())
}

/// Binds `values[at]` to the statement's `index`-th parameter (from 1); too few values is an
/// error, not a value out of place.
fn bind_value(
    prepared: &mut rusqlite::Statement<'_>,
    index: usize,
    values: &[AnyValueKind],
    at: usize,
) -> rusqlite::Result<()> {
    let value = values
        .get(at)
        .ok_or_else(|| rusqlite::Error::InvalidParameterCount(at + 1, values.len()))?;
    prepared.raw_bind_parameter(index, value_of(value)?)
}

/// An sqlx argument as SQLite's value (the types sqlx's SQLite driver binds them as).
fn value_of(value: &AnyValueKind) -> rusqlite::Result<ToSqlOutput<'_>> {
    Ok(ToSqlOutput::Borrowed(match value {
        AnyValueKind::Null(_) => ValueRef::Null,
        AnyValueKind::Bool(b) => ValueRef::Integer(i64::from(*b)),
        AnyValueKind::SmallInt(i) => ValueRef::Integer(i64::from(*i)),
        AnyValueKind::Integer(i) => ValueRef::Integer(i64::from(*i)),
        AnyValueKind::BigInt(i) => ValueRef::Integer(*i),
        AnyValueKind::Real(f) => ValueRef::Real(f64::from(*f)),
        AnyValueKind::Double(f) => ValueRef::Real(*f),
        AnyValueKind::Text(s) => ValueRef::Text(s.as_bytes()),
        AnyValueKind::TextSlice(s) => ValueRef::Text(s.as_bytes()),
        AnyValueKind::Blob(b) => ValueRef::Blob(b.as_slice()),
        other => {
            return Err(rusqlite::Error::ToSqlConversionFailure(
                format!("cannot bind {other:?} on SQLite").into(),
            ));
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::{PREPARED, Prepared};
    use rusqlite::types::Value;
    use sqlx_core::any::AnyValueKind;
    use std::sync::Arc;

    fn text(s: &str) -> AnyValueKind {
        AnyValueKind::Text(Arc::new(s.to_owned()))
    }

    /// Each parameter takes the value its `$N` names, however the text orders or repeats them,
    /// on the statement's first run and on every later one; a statement past the writer's own
    /// map runs as well, through rusqlite's cache.
    #[test]
    fn a_kept_statement_binds_each_value_where_its_number_says() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let mut prepared = Prepared::new(&conn);
        let shuffled = "SELECT $2 || ':' || $1 || ':' || $2 || ':' || $3";
        for (a, b) in [("a", "b"), ("c", "d")] {
            let rows = prepared
                .run(shuffled, &[text(a), text(b), AnyValueKind::BigInt(7)])
                .unwrap();
            assert_eq!(rows, vec![Value::Text(format!("{b}:{a}:{b}:7"))]);
        }
        // Too few values for the numbers the text names: an error, not a value out of place.
        assert!(prepared.run(shuffled, &[text("a")]).is_err());

        for n in 0..PREPARED {
            prepared
                .run(&format!("SELECT {n} + $1"), &[AnyValueKind::BigInt(1)])
                .unwrap();
        }
        assert_eq!(prepared.statements.len(), PREPARED);
        let past = prepared
            .run(
                "SELECT $2 - $1",
                &[AnyValueKind::BigInt(1), AnyValueKind::BigInt(10)],
            )
            .unwrap();
        assert_eq!(past, vec![Value::Integer(9)]);
        assert_eq!(
            prepared.statements.len(),
            PREPARED,
            "kept through rusqlite's cache instead"
        );
    }
}
