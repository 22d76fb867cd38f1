//! The hot calls, decided in memory and written behind their answers.
//!
//! A ten-stage workflow makes ten DNS changes. Decided inside a group commit and answered after
//! it, each one cost its caller a commit's wait and the writer a commit of its own: ten of an
//! execution's thirteen commit waits (BENCHMARKS.md). So a DNS change is decided
//! here, in memory, and answered at once; its writes are queued for the group writer
//! ([`capstan_store::Store::write_behind`]), where they wait for company and commit with the
//! caller's own next commit, which is queued after them and so is durable only if they are. A
//! crash before they commit loses the answer with them, and the replay asks again under the same
//! token.
//!
//! What memory holds ([`Memory`]): the zones and record sets changes have read or written (the
//! database's state plus every change decided since, committed or not), and the answers and
//! change ids whose writes are queued and not yet answered by the writer. What it does not hold
//! is read on the calling thread first (`Store::fetch_all`): the token (an answer committed by
//! an earlier process or by the ordinary path), unless the engine says no earlier attempt can
//! have used it ([`capstan_core::Providers::call_first`]); the zone and record sets, the first
//! time. Anything unusual (a fault rule fits the call, a token already answered in the
//! database, an error to report, no group writer to write behind answers) takes the ordinary
//! path: one transaction that reads and writes, which first waits for the writes queued behind
//! answers and afterwards empties memory, while the fast path steps aside
//! ([`Memory::exclusive`]).
//!
//! On PostgreSQL other nodes change the same tables, so memory may be out of date. The writes
//! therefore carry what they were decided from: a record set memory found absent is created by
//! a plain insert, which fails if one exists ([`claims`]); one memory found is changed under its
//! lock (the one the ordinary path takes, in the same order) only if it still holds what memory
//! said ([`checked_write`]); and the zone must still exist. If another node changed one
//! meanwhile, the write fails like any other: the epoch moves, memory is emptied, and the runs
//! that may have recorded the answer replay the call, which then reads the record set as it is.
//!
//! If a write behind an answer fails, the store's epoch moves
//! ([`capstan_store::Store::write_behind`]): the commits of activations begun under the old epoch
//! are refused (their runs replay their calls), and memory, which decided on what the failed
//! write said, is emptied before the next decision.

use super::dns::{CHANGE_INSERT, ChangePlan, Write, dns_key, parse_changes, record_set_lock};
use super::{SimulatedCloud, s};
use capstan_core::CapabilityError;
use capstan_core::store::json_string;
use capstan_store::{Backend, Sql};
use serde_json::{Value, json};
use sqlx::Row;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// How often a decision reads again because memory was emptied while it read (an ordinary
/// call, a failed write); then the ordinary path.
const READ_TRIES: usize = 4;

/// Answers whose writes are queued behind them, kept in memory at most: past this, the next
/// change takes the ordinary path, which waits for them and empties memory.
const MAX_QUEUED: usize = 100_000;

/// Record sets kept in memory at most (read or decided). Reaching it, memory forgets those the
/// database already holds as memory does (read from it, or decided by a write the writer has
/// committed) and keeps those decided by writes still queued; if those alone fill it, the next
/// change takes the ordinary path, likewise. So a simulator that has seen many names holds no
/// more of them than this, and a long-lived one does not fall back to the ordinary path (which
/// empties memory, and every change in progress with it) each time it fills.
const MAX_RECORDS: usize = 100_000;

/// A zone with at most this many record sets is read whole the first time a change needs it:
/// afterwards memory knows that a name it lacks has no record set, and a change of a new name
/// (the common case: a workflow adds the records of its own domain) reads nothing. A larger
/// zone is read a record set at a time, as each change needs it.
const ZONE_READ: usize = 10_000;

/// Memory's maps hash with foldhash, not std's SipHash: a change looks up and inserts each of its
/// record sets' (zone, name, type) keys, and SipHash was 1.2 % of the server's CPU at 32 in
/// flight (BENCHMARKS.md). Seeded at random per map, as std's are.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type Set<K> = HashSet<K, foldhash::fast::RandomState>;

/// The simulated DNS as decided in memory; see the module's text.
#[derive(Debug, Default)]
pub(super) struct Memory {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The store's epoch of writes behind answers this memory was built under.
    epoch: Option<u64>,
    /// Ordinary calls in progress: while there are any, the fast path steps aside.
    ordinary: usize,
    /// Bumped each time memory is emptied: a read begun before does not fill it.
    generation: u64,
    /// Zone id → its name (`None`: no such zone), as read.
    zones: Map<String, Option<String>>,
    /// Zones read whole: every record set of theirs is in `records`, so one missing from it
    /// has none. (On PostgreSQL another node may add one meanwhile; the write's guard, which
    /// checks what memory decided from, then fails, and the call is decided again from a read.)
    whole: Set<String>,
    /// Zones found larger than [`ZONE_READ`]: read a record set at a time.
    large: Set<String>,
    /// (zone id, name, type) → the record set's body (`None`: none), as read or decided, and
    /// the number of the write behind an answer that decided it (0: as read).
    records: Map<(String, String, String), (Option<String>, u64)>,
    /// Token → (request, answer) as the JSON texts its effect row is written with, for changes
    /// whose writes the writer has not answered yet. Text, not values: a value would be cloned
    /// for every change and dropped when forgotten, while a token is looked up again only when
    /// a call repeats it.
    tokens: Map<String, (String, String)>,
    /// Change id → when it goes `Insync`, likewise.
    changes: Map<String, i64>,
    /// (the write's number in the store's queue, token, change id), oldest first.
    queued: VecDeque<(u64, String, String)>,
    /// Reads in progress, by how many writes behind answers had been answered when each began:
    /// memory keeps what was answered after the oldest began, which that read may not see.
    reads: std::collections::BTreeMap<u64, usize>,
}

impl State {
    fn end_read(&mut self, answered: u64) {
        if let Some(n) = self.reads.get_mut(&answered) {
            *n -= 1;
            if *n == 0 {
                self.reads.remove(&answered);
            }
        }
    }

    /// What memory knows of `token`: its answer when `request` is the one it was given for;
    /// `Some(None)` for another request, which the ordinary path refuses; `None` if unknown.
    fn answered(
        &self,
        token: &str,
        request: &Value,
    ) -> Option<Option<Result<Value, CapabilityError>>> {
        let (first, answer) = self.tokens.get(token)?;
        // Compared as values, as the ordinary path compares a token's recorded request. Both
        // texts were printed from values, so they parse.
        let first: Value = serde_json::from_str(first).unwrap_or(Value::Null);
        Some((first == *request).then(|| {
            serde_json::from_str(answer).map_err(|e| {
                CapabilityError::transient(
                    "unavailable",
                    format!("the simulated cloud's remembered answer did not parse: {e}"),
                )
            })
        }))
    }

    fn clear(&mut self) {
        // `reads` stays: its reads end as they began.
        self.generation += 1;
        self.epoch = None;
        self.zones.clear();
        self.whole.clear();
        self.large.clear();
        self.records.clear();
        self.tokens.clear();
        self.changes.clear();
        self.queued.clear();
    }

    /// Ready for a decision under `epoch` (memory emptied when it has moved), answers and change
    /// ids the writer had answered before every read in progress began forgotten (the
    /// database has them, and each of those reads sees them); false while an ordinary call is
    /// in progress.
    fn ready(&mut self, epoch: u64, answered: u64) -> bool {
        if self.ordinary > 0 {
            return false;
        }
        if self.epoch != Some(epoch) {
            self.clear();
            self.epoch = Some(epoch);
        }
        let seen_by_all = self
            .reads
            .first_key_value()
            .map_or(answered, |(oldest, _)| answered.min(*oldest));
        while let Some((number, token, change)) = self.queued.front() {
            if *number > seen_by_all {
                break;
            }
            self.tokens.remove(token);
            self.changes.remove(change);
            self.queued.pop_front();
        }
        if self.records.len() >= MAX_RECORDS {
            // What the database holds and every read in progress sees: read again when needed.
            self.records.retain(|_, (_, by)| *by > seen_by_all);
            // A name missing from a zone read whole no longer means it has no record set.
            self.whole.clear();
            // A decision under way may have counted on what was forgotten: it reads again.
            self.generation += 1;
        }
        true
    }
}

/// An ordinary call in progress: the fast path steps aside until it is dropped, which empties
/// memory (the call may have changed what memory holds).
pub(super) struct Exclusive<'a>(&'a Memory);

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.clear();
        state.ordinary -= 1;
    }
}

/// A read in progress ([`State::reads`]), counted until it is dropped.
struct Reading<'a> {
    memory: &'a Memory,
    answered: u64,
}

impl Reading<'_> {
    /// Ends the read under the lock its caller holds.
    fn end(self, state: &mut State) {
        state.end_read(self.answered);
        std::mem::forget(self);
    }
}

impl Drop for Reading<'_> {
    /// A read given up on (an error, a dropped call).
    fn drop(&mut self) {
        self.memory.lock().end_read(self.answered);
    }
}

impl Memory {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Steps the fast path aside and waits until every write queued behind an answer so far has
    /// been answered, so an ordinary call reads what the fast path decided.
    pub(super) async fn exclusive(&self, store: &capstan_store::Store) -> Exclusive<'_> {
        self.lock().ordinary += 1;
        let exclusive = Exclusive(self);
        store.settle_behind().await;
        exclusive
    }
}

impl SimulatedCloud {
    /// The answer, or `None` to take the ordinary path.
    /// `first`: see [`capstan_core::Providers::call_first`].
    /// `under`: decide only while the store's epoch of writes behind answers is this one (a
    /// caller whose commits that epoch's end would refuse: [`capstan_core::Providers::call_behind`]).
    pub(super) async fn fast(
        &self,
        op: &str,
        request: &Value,
        token: &str,
        first: bool,
        under: Option<u64>,
    ) -> Option<Result<Value, CapabilityError>> {
        // A call that a fault rule fits takes the ordinary path, which counts and applies faults.
        let epoch = self.store.behind_epoch()?;
        if under.is_some_and(|under| under != epoch)
            || self.settings.faults.iter().any(|f| f.fits(op, request))
        {
            return None;
        }
        match op {
            "dns.get-change" if token.is_empty() => self.get_change(request).await,
            "dns.change-records" if !token.is_empty() => {
                self.change_records(request, token, first, under).await
            }
            _ => None,
        }
    }

    async fn get_change(&self, request: &Value) -> Option<Result<Value, CapabilityError>> {
        let id = s(request, "change_id");
        // Memory first: a change it has forgotten was answered by the writer before, so the
        // read after it finds the change committed.
        let remembered = {
            let mut state = self.memory.lock();
            if !state.ready(self.store.behind_epoch()?, self.store.behind_answered()) {
                return None;
            }
            state.changes.get(id).copied()
        };
        let at = match remembered {
            Some(at) => at,
            None => {
                let read =
                    Sql::new("SELECT insync_ms FROM sim_changes WHERE id = $1").arg(id.to_owned());
                let row = self.store.fetch_optional(read).await.ok()?;
                // An unknown id is an error: the ordinary path words it.
                row?.try_get(0).ok()?
            }
        };
        Some(Ok(json!(if self.now() >= at {
            "Insync"
        } else {
            "Pending"
        })))
    }

    /// `first`: no earlier attempt can have used the token, so the database is not asked for
    /// it (were that wrong, the write behind would fail on the token's primary key, the epoch
    /// would move and the run would replay). `under`: as for [`SimulatedCloud::fast`].
    async fn change_records(
        &self,
        request: &Value,
        token: &str,
        first: bool,
        under: Option<u64>,
    ) -> Option<Result<Value, CapabilityError>> {
        let zone_id = s(request, "zone_id").to_owned();
        let changes = parse_changes(request).ok()?;
        let keys: Vec<(String, String, String)> = changes
            .iter()
            .map(|c| (zone_id.clone(), c.name.clone(), c.ty.clone()))
            .collect();
        for _ in 0..READ_TRIES {
            // What memory lacks, read before deciding: the token always, the zone and the
            // record sets the first time.
            let (reading, generation, zone_known, missing, read_whole) = {
                let mut state = self.memory.lock();
                let answered = self.store.behind_answered();
                if !state.ready(self.store.behind_epoch()?, answered)
                    || state.queued.len() >= MAX_QUEUED
                    || state.records.len() >= MAX_RECORDS
                {
                    return None;
                }
                if let Some(answered) = state.answered(token, request) {
                    return answered;
                }
                *state.reads.entry(answered).or_default() += 1;
                let reading = Reading {
                    memory: &self.memory,
                    answered,
                };
                let whole = state.whole.contains(&zone_id);
                let missing: Vec<&(String, String, String)> = keys
                    .iter()
                    .filter(|k| !whole && !state.records.contains_key(*k))
                    .collect();
                (
                    reading,
                    state.generation,
                    state.zones.contains_key(&zone_id),
                    missing,
                    !whole && !state.large.contains(&zone_id),
                )
            };
            // One statement, its parts told apart by their first column.
            let mut read = Sql::default();
            let mut parts = 0;
            let mut part = |read: &mut Sql, text: &str| {
                if parts > 0 {
                    read.push(" UNION ALL ");
                }
                parts += 1;
                read.push(text);
            };
            if !first {
                part(
                    &mut read,
                    "SELECT 'done', NULL, NULL, NULL FROM sim_effects WHERE token = ",
                );
                read.push_bind(token.to_owned());
            }
            if !zone_known {
                part(
                    &mut read,
                    "SELECT 'zone', name, NULL, NULL FROM sim_zones WHERE id = ",
                );
                read.push_bind(zone_id.clone());
            }
            if read_whole && !missing.is_empty() {
                // One more than fits, to tell a zone that fits from one that does not.
                part(
                    &mut read,
                    "SELECT 'all', body, name, type FROM (SELECT body, name, type FROM sim_records WHERE zone_id = ",
                );
                read.push_bind(zone_id.clone())
                    .push(" LIMIT ")
                    .push_bind(ZONE_READ as i64 + 1)
                    .push(") AS zone_records");
            }
            for (zone, name, ty) in &missing {
                part(
                    &mut read,
                    "SELECT 'record', body, name, type FROM sim_records WHERE zone_id = ",
                );
                read.push_bind(zone.clone())
                    .push(" AND dns_key = ")
                    .push_bind(dns_key(name))
                    .push(" AND type = ")
                    .push_bind(ty.clone());
            }
            let rows = match parts {
                0 => Vec::new(),
                _ => self.store.fetch_all(read).await.ok()?,
            };
            let mut zone_name = None;
            let mut found: HashMap<(String, String), String> = HashMap::new();
            let mut whole_rows = 0;
            for row in &rows {
                let kind: String = row.try_get(0).ok()?;
                match kind.as_str() {
                    // Answered before, in the database: the ordinary path answers it again.
                    "done" => return None,
                    "zone" => zone_name = row.try_get::<Option<String>, _>(1).ok()?,
                    kind => {
                        whole_rows += usize::from(kind == "all");
                        let body: String = row.try_get(1).ok()?;
                        let name: String = row.try_get(2).ok()?;
                        let ty: String = row.try_get(3).ok()?;
                        found.insert((name, ty), body);
                    }
                }
            }
            let mut state = self.memory.lock();
            // Still counted as reading here, so nothing this read may have missed is forgotten.
            let epoch = self
                .store
                .behind_epoch()
                .filter(|epoch| state.ready(*epoch, self.store.behind_answered()));
            reading.end(&mut state);
            // Under the lock that queues the write: an epoch that moves after this check
            // refuses the write, which names it.
            let epoch = epoch.filter(|epoch| under.is_none_or(|under| under == *epoch))?;
            if state.generation != generation {
                // Emptied while this call read (an ordinary call, a failed write): read again.
                continue;
            }
            if let Some(answered) = state.answered(token, request) {
                return answered;
            }
            // What was read fills only what memory still lacks: a record set decided while
            // this call read is newer than what it read.
            if !zone_known {
                state.zones.entry(zone_id.clone()).or_insert(zone_name);
            }
            for key in &missing {
                let body = found.remove(&(key.1.clone(), key.2.clone()));
                state.records.entry((*key).clone()).or_insert((body, 0));
            }
            if read_whole && !missing.is_empty() {
                if whole_rows <= ZONE_READ {
                    for ((name, ty), body) in found.drain() {
                        state
                            .records
                            .entry((zone_id.clone(), name, ty))
                            .or_insert((Some(body), 0));
                    }
                    state.whole.insert(zone_id.clone());
                } else {
                    state.large.insert(zone_id.clone());
                }
            }
            let zone_name = state.zones.get(&zone_id).cloned().flatten()?;
            let olds: Vec<Option<String>> = keys
                .iter()
                .map(|k| state.records.get(k).and_then(|(body, _)| body.clone()))
                .collect();
            let now = self.now();
            let propagation_ms = self.settings.dns_propagation_ms;
            let change_id = self.new_change_id();
            // A batch to refuse is worded by the ordinary path.
            let plan =
                ChangePlan::new(&zone_id, &zone_name, changes, &olds, change_id.clone()).ok()?;
            let answer = plan.answer(propagation_ms);
            let texts = (json_string(request), json_string(&answer));
            let sql = if self.store.backend() == Backend::Postgres && plan.only_creates() {
                claims(&plan, &keys, token, &texts, now, propagation_ms)
            } else if self.store.backend() == Backend::Postgres {
                checked_write(&plan, &keys, &olds, token, &texts, now, propagation_ms)
            } else {
                let mut sql = Sql::default();
                for write in plan.writes(now, propagation_ms) {
                    let (Write::Claim(statement) | Write::Plain(statement)) = write;
                    sql.extend(statement);
                }
                push_effect(&mut sql, token, &texts, now);
                sql
            };
            // Queued under the lock, so the writes reach the writer in the order decided.
            let number = self.store.write_behind(sql, epoch).ok()?;
            for (key, body) in keys.into_iter().zip(plan.bodies()) {
                state.records.insert(key, (body.clone(), number));
            }
            state.tokens.insert(token.to_owned(), texts);
            state
                .changes
                .insert(change_id.clone(), now + propagation_ms);
            state
                .queued
                .push_back((number, token.to_owned(), change_id));
            return Some(Ok(answer));
        }
        None
    }
}

const EFFECT_INSERT: &str =
    "INSERT INTO sim_effects (token, op, request, response, at_ms) VALUES ($1, $2, $3, $4, $5)";

/// On PostgreSQL, a change decided in memory that only creates record sets (the common case: a
/// workflow adds the records of its own domain) is written as plain single-row inserts, which the
/// group writer merges with the same inserts of the group's other changes (one statement per
/// table for all of them): the zone's `FOR SHARE` guard (once per group), then each record set's
/// row, the change's and the effect's. A record set is claimed by its primary key rather than
/// under its lock: one that another node created meanwhile fails the insert, and so the write,
/// as [`checked_write`]'s guard would; the ordinary path, which reads under the lock and may read
/// a record set as absent while such an insert is in flight, checks that its own creation
/// created its row and decides again if not ([`Write::Claim`]).
fn claims(
    plan: &ChangePlan,
    keys: &[(String, String, String)],
    token: &str,
    texts: &(String, String),
    now: i64,
    propagation_ms: i64,
) -> Sql {
    let zone_id = plan.zone_id().to_owned();
    let mut sql = Sql::default();
    sql.push_statement(ZONE_GUARD)
        .bind(zone_id.clone())
        .guard()
        .once();
    for ((zone, name, ty), body) in keys.iter().zip(plan.bodies()) {
        sql.push_statement(
            "INSERT INTO sim_records (zone_id, dns_key, name, type, body) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(zone.clone())
        .bind(dns_key(name))
        .bind(name.clone())
        .bind(ty.clone())
        .bind(body.clone());
    }
    sql.push_statement(CHANGE_INSERT)
        .bind(plan.change_id().to_owned())
        .bind(zone_id)
        .bind(now)
        .bind(now + propagation_ms);
    push_effect(&mut sql, token, texts, now);
    sql
}

/// The effect's row: the token's answer, for a replay that asks again. `texts`: the request's
/// and the answer's JSON.
fn push_effect(sql: &mut Sql, token: &str, texts: &(String, String), now: i64) {
    sql.push_statement(EFFECT_INSERT)
        .bind(token.to_owned())
        .bind("dns.change-records".to_owned())
        .bind(texts.0.clone())
        .bind(texts.1.clone())
        .bind(now);
}

const ZONE_GUARD: &str = "SELECT 1 FROM sim_zones WHERE id = $1 FOR SHARE";

/// On PostgreSQL, where other nodes change the same tables, a change decided in memory that
/// replaces or deletes a record set is written as one statement that fails unless every record set still holds what memory decided
/// from (`olds`) and the zone still exists: the zone's `FOR SHARE` guard (once per group), then
/// one data-modifying statement whose parts are each record set's write, made conditional on
/// its old body (an insert that meets a row, an update or a delete that finds another body,
/// changes nothing), the change's row and the effect's row; `capstan_guard` raises unless each
/// record set's write changed its row.
///
/// Each write takes the record set's advisory lock (the ordinary path's, which reads, decides and
/// writes under it) before it changes the row; its condition, read under the statement's
/// snapshot, is checked again against the newest row when another transaction changed it
/// meanwhile (READ COMMITTED), and an insert meets a row committed after the snapshot as a
/// conflict. So one statement replaces a lock, a guard and a write per record set: five
/// statements per change became one, the largest share of the simulator's PostgreSQL time in
/// the engine bench. The writes come in the order of their locks, as the ordinary path takes
/// them (PostgreSQL runs the parts a statement reads in the order it reads them); a deadlock
/// with another node's group, which the server breaks, fails the write like any other.
fn checked_write(
    plan: &ChangePlan,
    keys: &[(String, String, String)],
    olds: &[Option<String>],
    token: &str,
    texts: &(String, String),
    now: i64,
    propagation_ms: i64,
) -> Sql {
    let zone_id = plan.zone_id();
    let mut sql = Sql::default();
    sql.push_statement(ZONE_GUARD)
        .bind(zone_id.to_string())
        .guard()
        .once();
    let mut writes: Vec<_> = keys
        .iter()
        .zip(olds)
        .zip(plan.bodies())
        .map(|(((zone, name, ty), old), new)| (record_set_lock(zone, name, ty), name, ty, old, new))
        .collect();
    writes.sort_by(|a, b| a.0.cmp(&b.0));
    sql.push_statement("WITH ");
    for (i, (lock, name, ty, old, new)) in writes.into_iter().enumerate() {
        let (zone, name, ty) = (zone_id.to_string(), name.clone(), ty.clone());
        sql.push(&format!("w{i} AS ("));
        match (old, new) {
            (None, Some(new)) => {
                sql.push("INSERT INTO sim_records (zone_id, dns_key, name, type, body) SELECT ")
                    .push_bind(zone)
                    .push(", ")
                    .push_bind(dns_key(&name))
                    .push(", ")
                    .push_bind(name)
                    .push(", ")
                    .push_bind(ty)
                    .push(", ")
                    .push_bind(new.clone())
                    .push(" WHERE pg_advisory_xact_lock(hashtext(")
                    .push_bind(lock)
                    .push(")) IS NOT NULL ON CONFLICT (zone_id, dns_key, type) DO NOTHING");
            }
            (old, new) => {
                // `ChangePlan::new` refuses to delete a record set there is none of.
                let old = old.clone().unwrap_or_default();
                match new {
                    Some(new) => sql
                        .push("UPDATE sim_records SET body = ")
                        .push_bind(new.clone()),
                    None => sql.push("DELETE FROM sim_records"),
                };
                sql.push(" WHERE zone_id = ")
                    .push_bind(zone)
                    .push(" AND dns_key = ")
                    .push_bind(dns_key(&name))
                    .push(" AND type = ")
                    .push_bind(ty)
                    .push(" AND pg_advisory_xact_lock(hashtext(")
                    .push_bind(lock)
                    .push(")) IS NOT NULL AND body = ")
                    .push_bind(old);
            }
        }
        sql.push(" RETURNING 1), ");
    }
    let count = keys.len();
    sql.push("change AS (INSERT INTO sim_changes (id, zone_id, submitted_ms, insync_ms) VALUES (")
        .push_bind(plan.change_id().to_owned())
        .push(", ")
        .push_bind(zone_id.to_string())
        .push(", ")
        .push_bind(now)
        .push(", ")
        .push_bind(now + propagation_ms)
        .push(
            ")), effect AS (INSERT INTO sim_effects (token, op, request, response, at_ms) VALUES (",
        )
        .push_bind(token.to_owned())
        .push(", 'dns.change-records', ")
        .push_bind(texts.0.clone())
        .push(", ")
        .push_bind(texts.1.clone())
        .push(", ")
        .push_bind(now)
        .push(")) SELECT capstan_guard(LEAST(");
    for i in 0..count {
        if i > 0 {
            sql.push(", ");
        }
        sql.push(&format!("(SELECT count(*) FROM w{i})"));
    }
    sql.push("), NULL, false)");
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Full, memory forgets the record sets the database holds as memory does (read from it, or
    /// decided by a write answered before every read in progress began) and keeps those decided
    /// by writes not yet answered; a zone read whole is whole no more. Below the cap it forgets
    /// none.
    #[test]
    fn a_full_memory_forgets_what_the_database_holds_and_keeps_what_is_queued() {
        let mut state = State {
            epoch: Some(7),
            ..State::default()
        };
        let key = |i: usize| ("z".to_owned(), format!("n{i}"), "A".to_owned());
        for i in 0..MAX_RECORDS {
            // Even: as read; odd: decided by write number `i`.
            let by = if i % 2 == 0 { 0 } else { i as u64 };
            state.records.insert(key(i), (Some(format!("b{i}")), by));
        }
        state.whole.insert("z".to_owned());
        // 1,000 writes answered; a read in progress began when 500 were.
        state.reads.insert(500, 1);
        assert!(state.ready(7, 1_000));
        let kept: Vec<usize> = (0..MAX_RECORDS)
            .filter(|&i| state.records.contains_key(&key(i)))
            .collect();
        assert_eq!(
            kept,
            (501..MAX_RECORDS)
                .filter(|i| i % 2 == 1)
                .collect::<Vec<_>>()
        );
        assert!(state.whole.is_empty(), "a forgotten name may exist");
        assert_eq!(state.generation, 1, "decisions under way read again");

        state.whole.insert("z".to_owned());
        let before = state.records.len();
        state.end_read(500);
        assert!(state.ready(7, u64::MAX));
        assert_eq!(state.records.len(), before, "below the cap");
        assert!(state.whole.contains("z"));
        assert_eq!(state.generation, 1);
    }
}
