//! Principals' grants, API keys and the audit log.

use crate::Store;
use sqlx::Row;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiKeyRecord {
    pub id: String,
    pub principal_id: String,
    pub prefix: String,
    pub hash: String,
    pub pepper_version: i64,
    pub created_ms: i64,
    pub expires_ms: i64,
    pub last_used_ms: Option<i64>,
    pub revoked_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AuditRecord {
    pub id: String,
    pub at_ms: i64,
    pub principal_id: String,
    pub action: String,
    pub method: String,
    pub route: String,
    pub resource: String,
    pub result: String,
    pub execution_id: Option<String>,
    pub ip: Option<String>,
    pub user_agent: Option<String>,
}

/// Filters of the audit query.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub principal_id: Option<String>,
    pub result: Option<String>,
    pub route: Option<String>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    pub limit: i64,
}

/// How often a node records a key's `lastUsedAt` at most.
pub const TOUCH_EVERY_MS: i64 = 60_000;

/// How long a node answers a key lookup from memory ([`Store::api_keys_with_grants`]): a key
/// revoked, or a grant changed, by another process (the CLI, another node) is seen within this
/// time; changes made through this process are seen at once.
pub const KEY_CACHE_MS: i64 = 1_000;

/// Prefixes kept in the key cache at most (it is emptied when full).
const KEY_CACHE_ENTRIES: usize = 10_000;

/// The keys of one prefix, each with its principal's grants.
pub type KeysWithGrants = Vec<(ApiKeyRecord, Vec<String>)>;

/// Keys with their principals' grants, by prefix, as read at some time.
#[derive(Debug, Default)]
pub(crate) struct KeyCache {
    entries: std::collections::HashMap<String, (i64, KeysWithGrants)>,
    /// Bumped by every key or grant change through this process, so a read that began before a
    /// change does not store what it read.
    generation: u64,
}

/// Audit records written by one `INSERT` at most (11 values each, under every backend's limit).
const AUDIT_BATCH: usize = 256;

/// How long an audit record written behind its answer ([`Store::insert_audit_behind`]) may wait
/// for others to share its commit. Records of a steady stream of reads then take one commit per
/// window instead of one per group the writer happens to form.
const BEHIND_WINDOW: std::time::Duration = std::time::Duration::from_millis(2);

/// Audit records written behind their answers: queued, written by one task a window at a time.
#[derive(Debug, Default)]
pub(crate) struct BehindQueue {
    pending: Vec<AuditRecord>,
    /// Records ever queued; [`StoreState::audit_written`] counts those written (or given up on).
    queued: u64,
    flushing: bool,
}

/// Audit records waiting for the next group commit.
#[derive(Debug, Default)]
pub(crate) struct AuditQueue {
    pending: Vec<(
        AuditRecord,
        tokio::sync::oneshot::Sender<Result<(), String>>,
    )>,
    flushing: bool,
}

fn key_row(r: &sqlx::any::AnyRow) -> ApiKeyRecord {
    ApiKeyRecord {
        id: r.get("id"),
        principal_id: r.get("principal_id"),
        prefix: r.get("prefix"),
        hash: r.get("hash"),
        pepper_version: r.get("pepper_version"),
        created_ms: r.get("created_ms"),
        expires_ms: r.get("expires_ms"),
        last_used_ms: r.get("last_used_ms"),
        revoked_ms: r.get("revoked_ms"),
    }
}

impl Store {
    pub async fn insert_api_key(&self, k: &ApiKeyRecord) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO api_keys (id, principal_id, prefix, hash, pepper_version, created_ms, expires_ms, last_used_ms, revoked_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)")
            .bind(&k.id)
            .bind(&k.principal_id)
            .bind(&k.prefix)
            .bind(&k.hash)
            .bind(k.pepper_version)
            .bind(k.created_ms)
            .bind(k.expires_ms)
            .bind(k.last_used_ms)
            .bind(k.revoked_ms)
            .execute(&self.writer)
            .await?;
        self.forget_keys();
        Ok(())
    }

    pub async fn api_keys_by_prefix(&self, prefix: &str) -> Result<Vec<ApiKeyRecord>, sqlx::Error> {
        let read =
            crate::Sql::new("SELECT * FROM api_keys WHERE prefix = $1").arg(prefix.to_owned());
        let rows = self.fetch_all(read).await?;
        Ok(rows.iter().map(key_row).collect())
    }

    /// The keys with this prefix, each with its principal's grants: what authenticating a
    /// request needs, in one query.
    ///
    /// Answered from memory when this node read the same prefix less than [`KEY_CACHE_MS`]
    /// before `now_ms` and changed no key or grant since: the read is a request's second
    /// database round trip, and a client sends many requests with one key.
    pub async fn api_keys_with_grants(
        &self,
        prefix: &str,
        now_ms: i64,
    ) -> Result<KeysWithGrants, sqlx::Error> {
        let generation = {
            let cache = self.key_cache();
            if let Some((at, keys)) = cache.entries.get(prefix)
                && now_ms >= *at
                && now_ms - at < KEY_CACHE_MS
            {
                return Ok(keys.clone());
            }
            cache.generation
        };
        let keys = self.read_keys_with_grants(prefix).await?;
        let mut cache = self.key_cache();
        if cache.generation == generation {
            if cache.entries.len() >= KEY_CACHE_ENTRIES {
                cache.entries.clear();
            }
            cache
                .entries
                .insert(prefix.to_owned(), (now_ms, keys.clone()));
        }
        Ok(keys)
    }

    fn key_cache(&self) -> std::sync::MutexGuard<'_, KeyCache> {
        self.inner
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forgets every cached key: a key or grant changed through this process.
    fn forget_keys(&self) {
        let mut cache = self.key_cache();
        cache.entries.clear();
        cache.generation += 1;
    }

    async fn read_keys_with_grants(&self, prefix: &str) -> Result<KeysWithGrants, sqlx::Error> {
        let read = crate::Sql::new(
            "SELECT k.*, g.permission AS granted FROM api_keys k
             LEFT JOIN principal_grants g ON g.principal_id = k.principal_id
             WHERE k.prefix = $1 ORDER BY k.id, g.permission",
        )
        .arg(prefix.to_owned());
        let rows = self.fetch_all(read).await?;
        let mut keys: KeysWithGrants = Vec::new();
        for row in &rows {
            let key = key_row(row);
            let granted: Option<String> = row.try_get("granted")?;
            match keys.last_mut() {
                Some((last, grants)) if last.id == key.id => grants.extend(granted),
                _ => keys.push((key, granted.into_iter().collect())),
            }
        }
        Ok(keys)
    }

    pub async fn api_key(&self, id: &str) -> Result<Option<ApiKeyRecord>, sqlx::Error> {
        let read = crate::Sql::new("SELECT * FROM api_keys WHERE id = $1").arg(id.to_owned());
        let row = self.fetch_optional(read).await?;
        Ok(row.as_ref().map(key_row))
    }

    pub async fn api_keys_of(&self, principal_id: &str) -> Result<Vec<ApiKeyRecord>, sqlx::Error> {
        let rows =
            sqlx::query("SELECT * FROM api_keys WHERE principal_id = $1 ORDER BY created_ms, id")
                .bind(principal_id)
                .fetch_all(&mut *self.read().await?)
                .await?;
        Ok(rows.iter().map(key_row).collect())
    }

    /// Records that the key was used at `now_ms`. `lastUsedAt` is kept to the minute: a node
    /// writes it at most once per [`TOUCH_EVERY_MS`] per key, so authenticated reads do not each
    /// cost a write transaction.
    pub async fn touch_api_key(&self, id: &str, now_ms: i64) -> Result<(), sqlx::Error> {
        {
            let mut touched = self
                .inner
                .touched
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match touched.get(id) {
                Some(&at) if now_ms >= at && now_ms - at < TOUCH_EVERY_MS => return Ok(()),
                _ => {
                    if touched.len() > 100_000 {
                        touched.clear();
                    }
                    touched.insert(id.to_owned(), now_ms);
                }
            }
        }
        crate::count_write();
        let done = sqlx::query("UPDATE api_keys SET last_used_ms = $1 WHERE id = $2")
            .bind(now_ms)
            .bind(id)
            .execute(&self.writer)
            .await;
        if done.is_err() {
            // Not recorded: try again on the next use.
            self.inner
                .touched
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(id);
        }
        done.map(|_| ())
    }

    /// Revokes the key; false if it does not exist.
    pub async fn revoke_api_key(&self, id: &str, now_ms: i64) -> Result<bool, sqlx::Error> {
        let done =
            sqlx::query("UPDATE api_keys SET revoked_ms = COALESCE(revoked_ms, $1) WHERE id = $2")
                .bind(now_ms)
                .bind(id)
                .execute(&self.writer)
                .await;
        self.forget_keys();
        Ok(done?.rows_affected() > 0)
    }

    pub async fn grant(&self, principal_id: &str, permission: &str) -> Result<(), sqlx::Error> {
        let done = sqlx::query(
            "INSERT INTO principal_grants (principal_id, permission) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(principal_id)
        .bind(permission)
        .execute(&self.writer)
        .await;
        self.forget_keys();
        done?;
        Ok(())
    }

    pub async fn revoke_grant(
        &self,
        principal_id: &str,
        permission: &str,
    ) -> Result<bool, sqlx::Error> {
        let done =
            sqlx::query("DELETE FROM principal_grants WHERE principal_id = $1 AND permission = $2")
                .bind(principal_id)
                .bind(permission)
                .execute(&self.writer)
                .await;
        self.forget_keys();
        Ok(done?.rows_affected() > 0)
    }

    pub async fn grants_of(&self, principal_id: &str) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT permission FROM principal_grants WHERE principal_id = $1 ORDER BY permission",
        )
        .bind(principal_id)
        .fetch_all(&mut *self.read().await?)
        .await
    }

    /// Queues the audit record of an answer that changes nothing (an allowed read) and returns at
    /// once: a task writes the records queued within [`BEHIND_WINDOW`] in one commit. The answer
    /// does not wait for its record, so a crash can lose the records of the last few milliseconds'
    /// reads (docs/decisions.md, "Audit records are group-committed"); readers of the audit log
    /// ([`Store::audit`]) and a stopping server ([`Store::audit_settled`]) wait for them.
    pub fn insert_audit_behind(&self, a: AuditRecord) {
        let start = {
            let mut queue = self
                .inner
                .audit_behind
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            queue.pending.push(a);
            queue.queued += 1;
            !std::mem::replace(&mut queue.flushing, true)
        };
        if start {
            let store = self.clone();
            tokio::spawn(async move { store.flush_behind().await });
        }
    }

    /// Returns once every record queued behind its answer before the call is written (or its
    /// write failed and was logged).
    pub async fn audit_settled(&self) {
        let target = self
            .inner
            .audit_behind
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .queued;
        let mut written = self.inner.audit_written.subscribe();
        // Queued records are patient parts of the group writer: they commit now instead of
        // waiting for company.
        let _hurry = (self.backend() == crate::Backend::Sqlite)
            .then(|| self.group_writer().ok().map(|writer| writer.hurry()))
            .flatten();
        if let Some(writer) = self.pg_writer() {
            writer.nudge();
        }
        // The sender lives as long as the store, which `self` holds.
        let _ = written.wait_for(|&n| n >= target).await;
    }

    /// Writes the records queued behind their answers, a window at a time, until none is left.
    async fn flush_behind(&self) {
        loop {
            tokio::time::sleep(BEHIND_WINDOW).await;
            let (batch, upto) = {
                let mut queue = self
                    .inner
                    .audit_behind
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if queue.pending.is_empty() {
                    queue.flushing = false;
                    return;
                }
                (std::mem::take(&mut queue.pending), queue.queued)
            };
            // One patient part of prepared single-row statements on the group writer (either
            // backend's): it rides the next commit someone waits for (an execution's, usually
            // the one the read awaits) instead of taking a commit of its own, and commits alone
            // only when none comes within the writer's patience
            // ([`crate::writer::BEHIND_COMPANY`]) or a reader of the log hurries it
            // ([`Store::audit_settled`]).
            let records = batch.len();
            let written = if self.backend() == crate::Backend::Sqlite {
                self.grouped_patiently(audit_inserts(batch))
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            } else if let Some(writer) = self.pg_writer() {
                match writer
                    .queue_patiently(audit_inserts(batch).into_statements())
                    .await
                {
                    Ok(answer) => answer
                        .await
                        .unwrap_or_else(|_| Err(crate::engine::interrupted()))
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            } else {
                let mut result = Ok(());
                for chunk in batch.chunks(AUDIT_BATCH) {
                    if let Err(e) = self.insert_audit_rows(chunk).await {
                        result = Err(e.to_string());
                    }
                }
                result
            };
            if let Err(error) = written {
                tracing::error!(%error, records, "could not write audit records");
            }
            self.inner
                .audit_written
                .send_modify(|n| *n = (*n).max(upto));
        }
    }

    /// Writes the audit record, durably, before returning.
    ///
    /// Group commit: every authorised request writes one record, so records that arrive while a
    /// write is under way are written together by the next one (one multi-row `INSERT`, one
    /// transaction), and each caller returns once its own record is committed. The flushing runs
    /// on its own task, so a caller that goes away (a dropped request) strands nobody.
    /// Where the backend has a group writer, the record joins the engine's group commits
    /// instead (one prepared single-row `INSERT` per record, see `writer.rs` and
    /// `pg_writer.rs`); the batches here serve PostgreSQL without its group writer.
    pub async fn insert_audit(&self, a: &AuditRecord) -> Result<(), sqlx::Error> {
        let failed = |e: capstan_core::store::StoreError| sqlx::Error::Protocol(e.to_string());
        if self.backend() == crate::Backend::Sqlite {
            let mut sql = crate::Sql::default();
            push_audit_insert(&mut sql, a.clone());
            return self.commit_guarded(sql, 0).await.map_err(failed);
        }
        if let Some(writer) = self.pg_writer() {
            let mut sql = crate::Sql::default();
            push_audit_insert(&mut sql, a.clone());
            return writer
                .commit(sql.into_statements(), Vec::new(), None, Default::default())
                .await
                .map_err(failed);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let start = {
            let mut queue = self
                .inner
                .audit
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            queue.pending.push((a.clone(), tx));
            !std::mem::replace(&mut queue.flushing, true)
        };
        if start {
            let store = self.clone();
            tokio::spawn(async move { store.flush_audit().await });
        }
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(sqlx::Error::Protocol(message)),
            Err(_) => Err(sqlx::Error::WorkerCrashed),
        }
    }

    /// Writes the audit record durably while `work` runs, and returns both outcomes once both
    /// are known: the record's write, and what `work` answered.
    ///
    /// For a change whose work is itself a commit (a trigger): on SQLite the record waits in the
    /// group writer's queue as a patient part ([`crate::writer::Job::patient`]), so the commit
    /// `work` queues carries it and one `COMMIT` makes both durable, where two in a row (the
    /// record's, then the change's) were each a flush of the WAL on the request's path. When
    /// `work` ends without that commit having taken the record (it failed before committing, or
    /// committed elsewhere), the record is hurried and committed at once. PostgreSQL's group
    /// writer does the same with a patient job ([`crate::pg_writer::PgGroupWriter::queue_patiently`]);
    /// without it the record is written as [`Store::insert_audit`] writes it, concurrently with
    /// `work`.
    pub async fn insert_audit_during<T>(
        &self,
        a: &AuditRecord,
        work: impl std::future::Future<Output = T>,
    ) -> (Result<(), sqlx::Error>, T) {
        let failed = |e: capstan_core::store::StoreError| sqlx::Error::Protocol(e.to_string());
        let mut sql = crate::Sql::default();
        push_audit_insert(&mut sql, a.clone());
        if self.backend() == crate::Backend::Postgres {
            let Some(writer) = self.pg_writer() else {
                return tokio::join!(self.insert_audit(a), work);
            };
            let answer = match writer.queue_patiently(sql.into_statements()).await {
                Ok(answer) => answer,
                Err(e) => return (Err(failed(e)), work.await),
            };
            let done = work.await;
            let written = patient_answer(answer, || writer.nudge(), |a| a).await;
            return (written.map_err(failed), done);
        }
        let part = crate::writer::Part::Statements(sql.into_statements());
        let answer = match self
            .queue_part(part, false, None, crate::writer::Waits::Patient)
            .await
        {
            Ok(answer) => answer,
            Err(e) => return (Err(failed(e)), work.await),
        };
        let done = work.await;
        // The part is queued, so the writer has started.
        let written = patient_answer(
            answer,
            || self.group_writer().map(|w| w.hurry()),
            crate::writer::Answered::into_answer,
        )
        .await;
        (written.map(drop).map_err(failed), done)
    }

    /// Writes queued audit records until none is left.
    async fn flush_audit(&self) {
        loop {
            let batch: Vec<_> = {
                let mut queue = self
                    .inner
                    .audit
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if queue.pending.is_empty() {
                    queue.flushing = false;
                    return;
                }
                let n = queue.pending.len().min(AUDIT_BATCH);
                queue.pending.drain(..n).collect()
            };
            let (records, waiting): (Vec<AuditRecord>, Vec<_>) = batch.into_iter().unzip();
            let done = self
                .insert_audit_rows(&records)
                .await
                .map_err(|e| e.to_string());
            for tx in waiting {
                let _ = tx.send(done.clone());
            }
        }
    }

    /// One multi-row `INSERT` of `records` on the writer pool (PostgreSQL's audit batches).
    async fn insert_audit_rows(&self, records: &[AuditRecord]) -> Result<(), sqlx::Error> {
        let mut q = crate::Sql::new(
            "INSERT INTO audit_logs (id, at_ms, principal_id, action, method, route, resource, result, execution_id, ip, user_agent) VALUES ",
        );
        for (i, a) in records.iter().enumerate() {
            if i > 0 {
                q.push(", ");
            }
            q.push("(")
                .push_bind(a.id.clone())
                .push(", ")
                .push_bind(a.at_ms)
                .push(", ")
                .push_bind(a.principal_id.clone())
                .push(", ")
                .push_bind(a.action.clone())
                .push(", ")
                .push_bind(a.method.clone())
                .push(", ")
                .push_bind(a.route.clone())
                .push(", ")
                .push_bind(a.resource.clone())
                .push(", ")
                .push_bind(a.result.clone())
                .push(", ")
                .push_bind(a.execution_id.clone())
                .push(", ")
                .push_bind(a.ip.clone())
                .push(", ")
                .push_bind(a.user_agent.clone())
                .push(")");
        }
        crate::count_write();
        q.build()
            .persistent(records.len() == 1)
            .execute(&self.writer)
            .await
            .map(|_| ())
    }

    /// Newest first, including every record queued behind its answer before the call.
    pub async fn audit(&self, f: &AuditFilter) -> Result<Vec<AuditRecord>, sqlx::Error> {
        self.audit_settled().await;
        let mut q = crate::Sql::new("SELECT * FROM audit_logs WHERE 1 = 1");
        if let Some(p) = &f.principal_id {
            q.push(" AND principal_id = ").push_bind(p.clone());
        }
        if let Some(r) = &f.result {
            q.push(" AND result = ").push_bind(r.clone());
        }
        if let Some(r) = &f.route {
            q.push(" AND route = ").push_bind(r.clone());
        }
        if let Some(s) = f.since_ms {
            q.push(" AND at_ms >= ").push_bind(s);
        }
        if let Some(u) = f.until_ms {
            q.push(" AND at_ms < ").push_bind(u);
        }
        q.push(" ORDER BY at_ms DESC, id DESC").push_limit(f.limit);
        let rows = q.build().fetch_all(&mut *self.read().await?).await?;
        Ok(rows
            .iter()
            .map(|r| AuditRecord {
                id: r.get("id"),
                at_ms: r.get("at_ms"),
                principal_id: r.get("principal_id"),
                action: r.get("action"),
                method: r.get("method"),
                route: r.get("route"),
                resource: r.get("resource"),
                result: r.get("result"),
                execution_id: r.get("execution_id"),
                ip: r.get("ip"),
                user_agent: r.get("user_agent"),
            })
            .collect())
    }
}

/// The answer of a patient part or job whose change has ended: at once when a commit took it,
/// else after `hurry` (whose value is held until the answer comes) has sent it on. `written`
/// takes the answer out of what the writer sends (SQLite's sends the part back with it).
async fn patient_answer<T, R, G>(
    mut answer: tokio::sync::oneshot::Receiver<T>,
    hurry: impl FnOnce() -> G,
    written: impl FnOnce(T) -> Result<R, capstan_core::store::StoreError>,
) -> Result<R, capstan_core::store::StoreError> {
    match answer.try_recv() {
        Ok(answered) => written(answered),
        Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
            let _hurried = hurry();
            answer
                .await
                .map_or_else(|_| Err(crate::engine::interrupted()), written)
        }
        Err(tokio::sync::oneshot::error::TryRecvError::Closed) => Err(crate::engine::interrupted()),
    }
}

/// The prepared single-row `INSERT` of one audit record (either backend's group writer).
/// The record's fields move into the statement's values (a read's record is built for this).
fn push_audit_insert(sql: &mut crate::Sql, a: AuditRecord) {
    sql.push_statement(
        "INSERT INTO audit_logs (id, at_ms, principal_id, action, method, route, resource, result, execution_id, ip, user_agent)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(a.id)
    .bind(a.at_ms)
    .bind(a.principal_id)
    .bind(a.action)
    .bind(a.method)
    .bind(a.route)
    .bind(a.resource)
    .bind(a.result)
    .bind(a.execution_id)
    .bind(a.ip)
    .bind(a.user_agent);
}

/// One prepared single-row statement per record.
fn audit_inserts(records: Vec<AuditRecord>) -> crate::Sql {
    let mut sql = crate::Sql::default();
    for a in records {
        push_audit_insert(&mut sql, a);
    }
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: i64) -> AuditRecord {
        AuditRecord {
            id: capstan_core::ids::new_id(),
            at_ms: 1_000 + i,
            principal_id: "reader".to_owned(),
            action: "workflows:hello".to_owned(),
            method: "GET".to_owned(),
            route: "/v1/executions/{id}".to_owned(),
            resource: format!("/v1/executions/e{i}"),
            result: "allowed".to_owned(),
            execution_id: Some(format!("e{i}")),
            ip: Some("127.0.0.1".to_owned()),
            user_agent: None,
        }
    }

    /// Records written behind their answers are all in the log for the next reader of it, and a
    /// stopping server can wait for them.
    #[tokio::test]
    async fn records_written_behind_their_answers_are_in_the_log_for_its_next_reader() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        let records: Vec<AuditRecord> = (0..300).map(record).collect();
        for r in &records {
            store.insert_audit_behind(r.clone());
        }
        // A synchronous record (a write's, a denial's) next to them.
        let mut denied = record(300);
        denied.result = "denied".to_owned();
        store.insert_audit(&denied).await.unwrap();
        let all = AuditFilter {
            limit: 100,
            principal_id: Some("reader".to_owned()),
            ..AuditFilter::default()
        };
        let newest = store.audit(&all).await.unwrap();
        assert_eq!(newest.len(), 100);
        assert_eq!(newest[0].at_ms, 1_300, "newest first");
        let allowed = AuditFilter {
            result: Some("allowed".to_owned()),
            since_ms: Some(1_000),
            until_ms: Some(1_300),
            limit: 100,
            ..AuditFilter::default()
        };
        assert_eq!(store.audit(&allowed).await.unwrap().len(), 100);
        let settled = AuditFilter {
            since_ms: Some(1_200),
            ..allowed
        };
        assert_eq!(store.audit(&settled).await.unwrap().len(), 100);
        // Nothing queued: settling returns at once; later records settle too.
        store.audit_settled().await;
        store.insert_audit_behind(record(400));
        store.audit_settled().await;
        let last = AuditFilter {
            since_ms: Some(1_400),
            limit: 10,
            ..AuditFilter::default()
        };
        assert_eq!(store.audit(&last).await.unwrap().len(), 1);
        // Every field of every record as it was queued.
        let mut logged = Vec::new();
        for from in (1_000..1_300).step_by(100) {
            let page = AuditFilter {
                since_ms: Some(from),
                until_ms: Some(from + 100),
                limit: 100,
                ..AuditFilter::default()
            };
            logged.extend(store.audit(&page).await.unwrap());
        }
        logged.sort_by_key(|r| r.at_ms);
        assert_eq!(logged, records);
    }

    /// The record of a change commits with the change, in one transaction on SQLite; when the
    /// work fails before committing anything, the record is still written (alone). (Here the
    /// change is queued before the writer's session has even started, so this shows the
    /// outcome, not the wait that makes it likely under a live server: the bench's write
    /// transactions per execution show that.)
    #[tokio::test]
    async fn an_audit_record_rides_the_commit_of_the_change_it_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
        if store.backend() == crate::Backend::Sqlite {
            // Started now, so the counts below are of this test's commits.
            store.group_writer().unwrap();
        }
        let committed = || store.group_commits();
        let in_log = |i: i64| {
            let store = store.clone();
            async move {
                let only = AuditFilter {
                    since_ms: Some(1_000 + i),
                    until_ms: Some(1_001 + i),
                    limit: 10,
                    ..AuditFilter::default()
                };
                store.audit(&only).await.unwrap().len()
            }
        };
        // The change: a write on the group writer (SQLite) that someone waits for.
        let before = committed();
        let (audited, changed) = store
            .insert_audit_during(&record(1), store.insert_audit(&record(2)))
            .await;
        audited.unwrap();
        changed.unwrap();
        assert_eq!((in_log(1).await, in_log(2).await), (1, 1));
        if let (Some(before), Some(after)) = (before, committed()) {
            assert_eq!(after - before, 1, "the record and the change in one commit");
        }
        // Work refused before it committed anything.
        let before = committed();
        let (audited, refused) = store
            .insert_audit_during(&record(3), async { Err::<(), _>("invalid input") })
            .await;
        audited.unwrap();
        assert_eq!(refused, Err("invalid input"));
        assert_eq!(in_log(3).await, 1);
        if let (Some(before), Some(after)) = (before, committed()) {
            assert_eq!(after - before, 1, "the record alone");
        }
    }
}
