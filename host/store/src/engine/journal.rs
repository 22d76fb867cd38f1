//! The journal as stored: one row per commit of a run (`journal_chunks`), not one per host call.
//!
//! An activation's commit carries every call since its last commit, so the [`Write::PutJournal`]s
//! of one run in one batch become one row: its entries as a JSON array. Entries are never edited
//! in place. A later row's entry replaces an earlier one's of the same `seq` (an intent or a wait
//! answered), and [`Write::TruncateJournal`] writes a row with `truncate_from` that drops every
//! entry from that sequence number on (rows that begin there are deleted outright). A run's rows
//! are read in `id` order, which is commit order: a run's writes are fenced to one activation at
//! a time. See docs/decisions.md, "The journal is written one row per commit".

use super::Batch;
use capstan_core::store::{
    EntryStatus, JournalEntry, JsonText, Millis, OutboxRecord, StoreError, Write,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The columns a reader selects, in this order (see [`fold`]).
pub(crate) const SELECT_CHUNKS: &str =
    "SELECT truncate_from, entries FROM journal_chunks WHERE run_id = $1 ORDER BY id";

/// One entry as a chunk holds it (its run is the row's).
#[derive(Serialize)]
struct EntryOut<'a> {
    seq: i64,
    op: &'a str,
    request: &'a JsonText,
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<&'a JsonText>,
    status: EntryStatus,
    at: Millis,
}

#[derive(Deserialize)]
struct EntryIn {
    seq: i64,
    op: String,
    request: JsonText,
    /// Absent when the call has no answer yet; a JSON `null` is an answer.
    #[serde(default, deserialize_with = "present")]
    response: Option<JsonText>,
    status: EntryStatus,
    at: Millis,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<JsonText>, D::Error> {
    JsonText::deserialize(d).map(Some)
}

/// A batch's writes with the journal entries of each run gathered into one chunk, and, where
/// the batch asks for it, its outbox events into rows of one insert.
#[allow(
    clippy::large_enum_variant,
    reason = "a batch's writes, moved once into their statements: boxing would allocate per write"
)]
pub(crate) enum Staged {
    One(Write),
    Chunk(Vec<JournalEntry>),
    Events(Vec<OutboxRecord>),
}

/// Gathers the [`Write::PutJournal`]s of each run into one chunk, which takes the place of the
/// run's first entry in the batch. Nothing but journal writes reads or writes the journal, so
/// moving an entry up to its chunk changes nothing, except across a truncation of the same run:
/// a [`Write::TruncateJournal`] closes its run's chunk, and entries after it start a new one.
///
/// With `rows` (SQLite, whose group writer sends each statement as it is: PostgreSQL's merges
/// single-row inserts itself, `crate::pg_writer`), the batch's [`Write::Event`]s likewise take
/// the place of its first one, in their order. Nothing else in a batch reads or writes the
/// outbox, so an event moved up changes nothing, and its sequence number still follows the
/// batch's order.
pub(crate) fn stage(writes: Vec<Write>, rows: bool) -> Vec<Staged> {
    let mut staged: Vec<Staged> = Vec::with_capacity(writes.len());
    // Run id → the index of its open chunk in `staged`.
    let mut open: Vec<(String, usize)> = Vec::new();
    let mut events: Option<usize> = None;
    for write in writes {
        match write {
            Write::Event(event) if rows => match events {
                Some(at) => {
                    if let Staged::Events(gathered) = &mut staged[at] {
                        gathered.push(event);
                    }
                }
                None => {
                    events = Some(staged.len());
                    staged.push(Staged::Events(vec![event]));
                }
            },
            Write::PutJournal(entry) => match open.iter().find(|(run, _)| *run == entry.run_id) {
                Some(&(_, at)) => {
                    if let Staged::Chunk(entries) = &mut staged[at] {
                        entries.push(entry);
                    }
                }
                None => {
                    open.push((entry.run_id.clone(), staged.len()));
                    staged.push(Staged::Chunk(vec![entry]));
                }
            },
            Write::TruncateJournal { run_id, from_seq } => {
                open.retain(|(run, _)| *run != run_id);
                staged.push(Staged::One(Write::TruncateJournal { run_id, from_seq }));
            }
            write => staged.push(Staged::One(write)),
        }
    }
    staged
}

/// A chunk's `entries` text.
fn encode(entries: &[JournalEntry]) -> String {
    let out: Vec<EntryOut<'_>> = entries
        .iter()
        .map(|e| EntryOut {
            seq: e.seq,
            op: &e.op,
            request: &e.request,
            response: e.response.as_ref(),
            status: e.status,
            at: e.at_ms,
        })
        .collect();
    // Serialising a `Vec` of plain values cannot fail.
    serde_json::to_string(&out).unwrap_or_default()
}

/// Appends one chunk's row.
pub(crate) fn push_chunk(batch: &mut Batch, entries: &[JournalEntry]) {
    let Some(first) = entries.first() else {
        return;
    };
    let text = encode(entries);
    let first_seq = entries.iter().map(|e| e.seq).min().unwrap_or(first.seq);
    // Every value a placeholder (`truncate_from` is left out, so NULL): PostgreSQL's group writer
    // sends the chunks of a group's activations as one insert.
    batch
        .statement("INSERT INTO journal_chunks (run_id, first_seq, entries) VALUES ($1, $2, $3)")
        .bind(first.run_id.clone())
        .bind(first_seq)
        .bind(text);
}

/// Appends a truncation: the run's rows that begin at or after `from_seq` go, and a marker row
/// drops the entries from `from_seq` on that earlier rows still hold.
pub(crate) fn push_truncate(batch: &mut Batch, run_id: String, from_seq: i64) {
    batch
        .statement("DELETE FROM journal_chunks WHERE run_id = $1 AND first_seq >= $2")
        .bind(run_id.clone())
        .bind(from_seq);
    batch
        .statement(
            "INSERT INTO journal_chunks (run_id, first_seq, truncate_from, entries) VALUES ($1, $2, $2, '[]')",
        )
        .bind(run_id)
        .bind(from_seq);
}

/// Folds a run's rows (`truncate_from`, `entries`, in `id` order) into its journal, by `seq`.
pub(crate) fn fold(
    run_id: &str,
    rows: impl IntoIterator<Item = (Option<i64>, String)>,
) -> Result<Vec<JournalEntry>, StoreError> {
    let mut journal: BTreeMap<i64, JournalEntry> = BTreeMap::new();
    for (truncate_from, text) in rows {
        if let Some(from) = truncate_from {
            journal.split_off(&from);
        }
        let entries: Vec<EntryIn> = serde_json::from_str(&text)
            .map_err(|e| StoreError::Corrupt(format!("bad journal chunk of run {run_id}: {e}")))?;
        for e in entries {
            journal.insert(
                e.seq,
                JournalEntry {
                    run_id: run_id.to_owned(),
                    seq: e.seq,
                    op: e.op,
                    request: e.request,
                    response: e.response,
                    status: e.status,
                    at_ms: e.at,
                },
            );
        }
    }
    Ok(journal.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn entry(seq: i64, status: EntryStatus, response: Option<Value>) -> JournalEntry {
        JournalEntry {
            run_id: "r1".into(),
            seq,
            op: "dns.change-records".into(),
            request: JsonText::new(&json!({"zone_id": "Z", "n": seq})),
            response: response.as_ref().map(JsonText::new),
            status,
            at_ms: 100 + seq,
        }
    }

    fn chunk_text(entries: &[JournalEntry]) -> String {
        let mut batch = Batch::new(crate::Backend::Sqlite);
        push_chunk(&mut batch, entries);
        let statements = batch.into_sql().into_statements();
        assert_eq!(statements.len(), 1, "one row per chunk");
        assert!(statements[0].text.starts_with("INSERT INTO journal_chunks"));
        encode(entries)
    }

    /// With `rows`, a batch's events take the place of its first, in their order; without
    /// (PostgreSQL, whose writer merges rows itself) each stays where it was.
    #[test]
    fn a_batchs_events_gather_at_the_first_of_them_only_when_asked() {
        let event = |id: &str| {
            Write::Event(OutboxRecord {
                seq: 0,
                event_id: id.into(),
                execution_id: "e1".into(),
                event_type: "StageStarted".into(),
                event_version: "1".into(),
                principal_id: "p".into(),
                workflow: "w".into(),
                payload_json: JsonText::new(&json!({})),
                occurred_ms: 1,
                traceparent: None,
                routed_ms: None,
                stream_published_ms: None,
                dispatched_ms: None,
            })
        };
        let writes = || {
            vec![
                Write::PutJournal(entry(0, EntryStatus::Done, None)),
                event("a"),
                Write::PutJournal(entry(1, EntryStatus::Done, None)),
                event("b"),
                Write::TruncateJournal {
                    run_id: "r1".into(),
                    from_seq: 1,
                },
                event("c"),
            ]
        };
        let shape = |staged: Vec<Staged>| -> Vec<String> {
            staged
                .iter()
                .map(|s| match s {
                    Staged::Chunk(entries) => format!("chunk {}", entries.len()),
                    Staged::Events(events) => format!(
                        "events {}",
                        events
                            .iter()
                            .map(|e| e.event_id.as_str())
                            .collect::<String>()
                    ),
                    Staged::One(Write::Event(e)) => format!("event {}", e.event_id),
                    Staged::One(_) => "other".into(),
                })
                .collect()
        };
        assert_eq!(
            shape(stage(writes(), true)),
            ["chunk 2", "events abc", "other"]
        );
        assert_eq!(
            shape(stage(writes(), false)),
            ["chunk 2", "event a", "event b", "other", "event c"]
        );
    }

    #[test]
    fn a_batch_gathers_each_runs_entries_into_one_chunk_split_by_its_truncations() {
        let other = JournalEntry {
            run_id: "r2".into(),
            ..entry(0, EntryStatus::Done, Some(json!(1)))
        };
        let staged = stage(
            vec![
                Write::PutJournal(entry(0, EntryStatus::Done, None)),
                Write::PutJournal(other.clone()),
                Write::PutJournal(entry(1, EntryStatus::Done, None)),
                Write::TruncateJournal {
                    run_id: "r1".into(),
                    from_seq: 1,
                },
                Write::PutJournal(entry(1, EntryStatus::Waiting, None)),
                Write::PutJournal(other),
            ],
            true,
        );
        let shape: Vec<String> = staged
            .iter()
            .map(|s| match s {
                Staged::Chunk(entries) => format!(
                    "{}:{:?}",
                    entries[0].run_id,
                    entries.iter().map(|e| e.seq).collect::<Vec<_>>()
                ),
                Staged::One(Write::TruncateJournal { from_seq, .. }) => format!("cut {from_seq}"),
                Staged::One(_) | Staged::Events(_) => "other".into(),
            })
            .collect();
        assert_eq!(shape, ["r1:[0, 1]", "r2:[0, 0]", "cut 1", "r1:[1]"]);
    }

    #[test]
    fn later_chunks_replace_entries_and_truncations_drop_them() {
        let first = chunk_text(&[
            entry(0, EntryStatus::Done, Some(json!({"Ok": "a"}))),
            entry(1, EntryStatus::Done, Some(json!({"Ok": "b"}))),
            entry(2, EntryStatus::Waiting, None),
        ]);
        assert_eq!(
            fold("r1", [(None, first.clone())]).unwrap()[2],
            entry(2, EntryStatus::Waiting, None),
            "a call with no answer yet reads back with none"
        );
        let answered = chunk_text(&[entry(2, EntryStatus::Done, Some(Value::Null))]);
        let journal = fold("r1", [(None, first.clone()), (None, answered.clone())]).unwrap();
        assert_eq!(
            journal,
            vec![
                entry(0, EntryStatus::Done, Some(json!({"Ok": "a"}))),
                entry(1, EntryStatus::Done, Some(json!({"Ok": "b"}))),
                entry(2, EntryStatus::Done, Some(Value::Null)),
            ],
            "the answered wait replaces the waiting entry; a null answer stays an answer"
        );
        let again = chunk_text(&[entry(1, EntryStatus::Done, Some(json!({"Ok": "c"})))]);
        let journal = fold(
            "r1",
            [
                (None, first),
                (None, answered),
                (Some(1), "[]".to_owned()),
                (None, again),
            ],
        )
        .unwrap();
        assert_eq!(
            journal,
            vec![
                entry(0, EntryStatus::Done, Some(json!({"Ok": "a"}))),
                entry(1, EntryStatus::Done, Some(json!({"Ok": "c"}))),
            ]
        );
        assert!(matches!(
            fold("r1", [(None, "{not json".to_owned())]),
            Err(StoreError::Corrupt(_))
        ));
        assert!(
            matches!(
                fold(
                    "r1",
                    [(
                        None,
                        r#"[{"seq":0,"op":"x","request":{"a":},"status":"done","at":1}]"#
                            .to_owned()
                    )]
                ),
                Err(StoreError::Corrupt(_))
            ),
            "a request that is not JSON is refused when the chunk is read"
        );
    }

    #[test]
    fn entries_keep_their_text_and_compare_by_value() {
        // As PostgreSQL's migration from one row per call wrote them (`jsonb` text: spaces,
        // its own key order).
        let migrated = r#"[{"at": 100, "op": "dns.change-records", "seq": 0, "status": "done",
            "request": {"n": 0, "zone_id": "Z"}, "response": {"Ok": "a"}}]"#;
        let journal = fold("r1", [(None, migrated.to_owned())]).unwrap();
        assert_eq!(journal[0].request.as_str(), r#"{"n": 0, "zone_id": "Z"}"#);
        assert_eq!(
            journal,
            [entry(0, EntryStatus::Done, Some(json!({"Ok": "a"})))]
        );
        assert_eq!(
            journal[0].request,
            JsonText::new(&json!({"zone_id": "Z", "n": 0}))
        );
        assert_ne!(
            journal[0].request,
            JsonText::new(&json!({"zone_id": "Z", "n": 1}))
        );
        let written = chunk_text(&journal);
        assert!(
            written.contains(r#""request":{"n": 0, "zone_id": "Z"}"#),
            "a chunk copies each entry's text: {written}"
        );
    }
}
