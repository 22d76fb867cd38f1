//! What the audit log keeps of requests nobody vouches for: failed authentication (a missing or
//! wrong key, a used or void stream token, a partner key that does not check out) and requests
//! refused for their rate.
//!
//! Each such failure would otherwise be one committed row with attacker-chosen fields: a flood
//! of them is a flood of writes. Here the first failure of a source (its address, the principal
//! it claimed, the action) in a window is written behind its answer, with every stored field cut
//! to a bound; the rest of the window is counted in memory and written as one row when the
//! window closes (`resource` says how many and since when). Sources beyond [`MAX_SOURCES`] share
//! one overflow entry, so memory stays bounded too.

use capstan_store::Store;
use capstan_store::auth::AuditRecord;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// How long one source's failures are gathered into one row.
pub const WINDOW_MS: i64 = 60_000;
/// Sources tracked at once; further ones are counted under one overflow source.
pub const MAX_SOURCES: usize = 10_000;
/// The most characters kept of a stored field (route, resource, user agent, principal).
pub const FIELD_CHARS: usize = 256;

/// `text` cut to [`FIELD_CHARS`] characters, marked when cut.
pub fn bounded(text: &str) -> String {
    let mut text = text.to_owned();
    bound(&mut text);
    text
}

/// Cuts `text` to [`FIELD_CHARS`] characters in place, marked when cut (a text within the bound,
/// as nearly every one is, is left where it is).
fn bound(text: &mut String) {
    if text.len() <= FIELD_CHARS {
        return;
    }
    if let Some((end, _)) = text.char_indices().nth(FIELD_CHARS) {
        text.truncate(end);
        text.push('…');
    }
}

/// Every stored field of `record` bounded.
pub fn bound_record(mut record: AuditRecord) -> AuditRecord {
    bound(&mut record.principal_id);
    bound(&mut record.route);
    bound(&mut record.resource);
    for text in [&mut record.user_agent, &mut record.ip]
        .into_iter()
        .flatten()
    {
        bound(text);
    }
    record
}

#[derive(Debug)]
struct Window {
    started_ms: i64,
    /// Failures after the first (which was written when it happened).
    more: u64,
    first: AuditRecord,
}

/// Failures gathered per source and window.
#[derive(Debug, Default)]
pub struct Failures {
    windows: Mutex<HashMap<(String, String, String), Window>>,
}

impl Failures {
    /// Records a failure: written (behind its answer) when it opens its source's window,
    /// counted otherwise.
    pub fn record(&self, store: &Store, record: AuditRecord) {
        let record = bound_record(record);
        let now = record.at_ms;
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        let mut key = (
            record.ip.clone().unwrap_or_default(),
            record.principal_id.clone(),
            record.action.clone(),
        );
        if !windows.contains_key(&key) && windows.len() >= MAX_SOURCES {
            key = ("*".to_owned(), "*".to_owned(), record.action.clone());
        }
        match windows.get_mut(&key) {
            Some(window) if now < window.started_ms + WINDOW_MS => window.more += 1,
            _ => {
                if let Some(closed) = windows.remove(&key) {
                    write_summary(store, closed);
                }
                store.insert_audit_behind(record.clone());
                windows.insert(
                    key,
                    Window {
                        started_ms: now,
                        more: 0,
                        first: record,
                    },
                );
            }
        }
    }

    /// Writes the summary of every window closed by `now_ms` and forgets it.
    pub fn flush(&self, store: &Store, now_ms: i64) {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        let closed: Vec<_> = windows
            .iter()
            .filter(|(_, w)| now_ms >= w.started_ms + WINDOW_MS)
            .map(|(k, _)| k.clone())
            .collect();
        for key in closed {
            if let Some(window) = windows.remove(&key) {
                write_summary(store, window);
            }
        }
    }
}

/// One row for the failures a window counted after its first (none when there were none).
fn write_summary(store: &Store, window: Window) {
    if window.more == 0 {
        return;
    }
    let mut summary = window.first;
    summary.id = capstan_core::ids::new_id();
    summary.at_ms = window.started_ms + WINDOW_MS;
    summary.resource = bounded(&format!(
        "{} more failures like this from the same source within {} s; first: {}",
        window.more,
        WINDOW_MS / 1000,
        summary.resource
    ));
    store.insert_audit_behind(summary);
}

/// How often the gathered failures are looked at for closed windows.
const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// How often retention runs (and once a minute after start).
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(3_600);

/// The node's upkeep until `stop`: closed failure windows written every [`FLUSH_EVERY`], the
/// retention sweep every [`SWEEP_EVERY`]. On several nodes each sweeps; the deletes agree.
pub async fn maintain(
    state: crate::ApiState,
    retention: capstan_store::retention::Retention,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut flush = tokio::time::interval(FLUSH_EVERY);
    let mut sweep = tokio::time::interval_at(
        tokio::time::Instant::now() + std::time::Duration::from_secs(60),
        SWEEP_EVERY,
    );
    loop {
        tokio::select! {
            () = async { drop(stop.wait_for(|s| *s).await) } => {
                state.failures.flush(&state.store, i64::MAX);
                return;
            }
            _ = flush.tick() => state.failures.flush(&state.store, state.now()),
            _ = sweep.tick() => match state.store.sweep(&retention, state.now()).await {
                Ok(swept) => tracing::info!(?swept, "retention sweep"),
                Err(error) => tracing::warn!(%error, "retention sweep failed; trying again next time"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_fields_are_cut_and_marked() {
        let long = "é".repeat(1000);
        let cut = bounded(&long);
        assert_eq!(cut.chars().count(), FIELD_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(bounded("short"), "short");
        // Bytes past the bound are not characters past it.
        let at_bound = "é".repeat(FIELD_CHARS);
        assert_eq!(bounded(&at_bound), at_bound);
        let over = "a".repeat(FIELD_CHARS + 1);
        assert_eq!(bounded(&over), format!("{}…", "a".repeat(FIELD_CHARS)));
        let mut record = AuditRecord {
            id: "id".to_owned(),
            at_ms: 0,
            principal_id: "p".repeat(300),
            action: "a".to_owned(),
            method: "GET".to_owned(),
            route: "/r".to_owned(),
            resource: "r".repeat(300),
            result: "allowed".to_owned(),
            execution_id: None,
            ip: Some("127.0.0.1".to_owned()),
            user_agent: Some("u".repeat(300)),
        };
        record = bound_record(record);
        for field in [
            &record.principal_id,
            &record.resource,
            record.user_agent.as_ref().unwrap(),
        ] {
            assert_eq!(field.chars().count(), FIELD_CHARS + 1, "{field}");
        }
        assert_eq!(record.ip.as_deref(), Some("127.0.0.1"));
        assert_eq!(record.route, "/r");
    }
}
