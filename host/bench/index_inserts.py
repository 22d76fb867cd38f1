#!/usr/bin/env python3
"""What SQLite spends on an execution's stage and event rows, with and without the indexes
nothing reads (docs/decisions.md, "An execution's rows are written to the keys that are read").

usage: index_inserts.py [ROUNDS [TABLE…]]

Inserts the rows of 4,000 ten-stage executions, one commit per execution (11 stages, 25 events,
or 10 receipts, simulated effects or simulated changes), into a fresh WAL database
(`synchronous=OFF`, so the figure is CPU, not syncs; checkpoints off, so the WAL keeps every frame
written), once per schema and round, alternating: `stages` with its id's automatic index and
`stages_by_execution` against `WITHOUT ROWID` keyed by (execution_id, position); `outbox` with a
UNIQUE `event_id` against without; `receipts`, `sim_effects` and `sim_changes` as tables with a
TEXT primary key against `WITHOUT ROWID`; `audit_logs` (32 records per commit, as a group commit
under reads carries) with an `id` key and a time index against `WITHOUT ROWID` keyed by
(at_ms, id). Ids are time-ordered, as UUIDv7s are. Prints the median
µs per execution and the WAL pages per execution of each, for the tables named (all by default).
Python's own per-row cost is in every figure alike; the differences are SQLite's.
"""

import itertools
import os
import sqlite3
import statistics
import sys
import tempfile
import time

STAGE_COLUMNS = """execution_id TEXT NOT NULL, position INTEGER NOT NULL, stage_name TEXT NOT NULL,
    status TEXT NOT NULL, started_ms INTEGER NOT NULL, finished_ms INTEGER, output_json TEXT,
    error_json TEXT"""
OUTBOX_COLUMNS = """execution_id TEXT NOT NULL, event_type TEXT NOT NULL, event_version TEXT NOT NULL,
    principal_id TEXT NOT NULL, workflow TEXT NOT NULL, payload_json TEXT NOT NULL,
    occurred_ms INTEGER NOT NULL, traceparent TEXT, routed_ms INTEGER, stream_published_ms INTEGER,
    dispatched_ms INTEGER"""
RECEIPT_COLUMNS = """execution_id TEXT NOT NULL, run_id TEXT NOT NULL, seq INTEGER NOT NULL,
    op TEXT NOT NULL, request TEXT NOT NULL, response TEXT NOT NULL, created_ms INTEGER NOT NULL,
    compensated_ms INTEGER"""
EFFECT_COLUMNS = "op TEXT NOT NULL, request TEXT NOT NULL, response TEXT NOT NULL, at_ms INTEGER NOT NULL"
CHANGE_COLUMNS = "zone_id TEXT NOT NULL, submitted_ms INTEGER NOT NULL, insync_ms INTEGER NOT NULL"
AUDIT_COLUMNS = """principal_id TEXT NOT NULL, action TEXT NOT NULL, method TEXT NOT NULL,
    route TEXT NOT NULL, resource TEXT NOT NULL, result TEXT NOT NULL, execution_id TEXT, ip TEXT,
    user_agent TEXT"""
# Audit records per commit: a group commit under `capstan-bench --only api` carries the
# records of many reads (64 connections).
AUDITS_PER_COMMIT = 32

counter = itertools.count()


def time_ordered_id():
    n = next(counter)
    ms = 1_765_000_000_000 + n // 50
    return "%08x-%04x-7%03x-8000-%012x" % (ms >> 16, ms & 0xFFFF, n & 0xFFF, int.from_bytes(os.urandom(6), "big"))


def change_request(e, j):
    return (
        '{"zone_id":"Z%s","changes":[{"action":"UPSERT","record_set":{"name":"step-%d.%s.example.",'
        '"type":"TXT","ttl":60,"records":["\\"value-%d\\""]}}]}' % (e[:8], j, e, j)
    )


def change_answer(e):
    return '{"change_id":"C%s","zone_id":"Z%s","status":"PENDING","prior":[]}' % (time_ordered_id().replace("-", "").upper(), e[:8])


def stage_rows(e):
    return [(time_ordered_id(), e, j, f"step-{j}", "succeeded", 1, 2, '{"changed":true}', None) for j in range(11)]


def event_rows(e):
    payload = '{"executionId":"%s","workflow":"fixture-steps","stage":"step-3"}' % e
    return [(time_ordered_id(), e, "StageStarted", "1", "p", "fixture-steps", payload, 1, None, None, 1, None) for _ in range(25)]


def receipt_rows(e):
    run = time_ordered_id()
    return [(f"{run}:1:{2 * j + 1}", e, run, 2 * j + 1, "dns.change-records", change_request(e, j), change_answer(e), 1, None) for j in range(10)]


def effect_rows(e):
    run = time_ordered_id()
    return [(f"{run}:1:{2 * j + 1}", "dns.change-records", change_request(e, j), change_answer(e), 1) for j in range(10)]


def change_rows(e):
    return [("C" + time_ordered_id().replace("-", "").upper(), "Z" + e[:8], 1, 2) for _ in range(10)]


def audit_rows(e):
    rows = []
    for _ in range(AUDITS_PER_COMMIT):
        n = next(counter)
        rows.append((time_ordered_id(), 1_765_000_000_000 + n // 50, "bench", "workflows:hello", "GET",
                     "/v1/executions/{id}", f"/v1/executions/{e}", "allowed", e, "127.0.0.1", "reqwest/0.12"))
    return rows


def table(name, key, columns, without_rowid=False):
    if without_rowid:
        return f"CREATE TABLE {name} ({key} TEXT NOT NULL, {columns}, PRIMARY KEY ({key})) WITHOUT ROWID"
    return f"CREATE TABLE {name} ({key} TEXT PRIMARY KEY NOT NULL, {columns})"


# name: (schema, rows of one execution, their insert)
SCHEMAS = {
    "stages, id indexed": (
        [
            f"CREATE TABLE stages (id TEXT PRIMARY KEY NOT NULL, {STAGE_COLUMNS})",
            "CREATE UNIQUE INDEX stages_by_execution ON stages (execution_id, position)",
        ],
        stage_rows,
    ),
    "stages, WITHOUT ROWID": (
        [f"CREATE TABLE stages (id TEXT NOT NULL, {STAGE_COLUMNS}, PRIMARY KEY (execution_id, position)) WITHOUT ROWID"],
        stage_rows,
    ),
    "events, event_id UNIQUE": (
        [
            f"CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL UNIQUE, {OUTBOX_COLUMNS})",
            "CREATE INDEX outbox_by_execution ON outbox (execution_id, seq)",
        ],
        event_rows,
    ),
    "events, event_id not indexed": (
        [
            f"CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL, {OUTBOX_COLUMNS})",
            "CREATE INDEX outbox_by_execution ON outbox (execution_id, seq)",
        ],
        event_rows,
    ),
    "receipts, rowid": (
        [table("receipts", "id", RECEIPT_COLUMNS), "CREATE INDEX receipts_by_execution ON receipts (execution_id, created_ms)"],
        receipt_rows,
    ),
    "receipts, WITHOUT ROWID": (
        [table("receipts", "id", RECEIPT_COLUMNS, True), "CREATE INDEX receipts_by_execution ON receipts (execution_id, created_ms)"],
        receipt_rows,
    ),
    "sim_effects, rowid": ([table("sim_effects", "token", EFFECT_COLUMNS)], effect_rows),
    "sim_effects, WITHOUT ROWID": ([table("sim_effects", "token", EFFECT_COLUMNS, True)], effect_rows),
    "sim_changes, rowid": ([table("sim_changes", "id", CHANGE_COLUMNS)], change_rows),
    "sim_changes, WITHOUT ROWID": ([table("sim_changes", "id", CHANGE_COLUMNS, True)], change_rows),
    "audit_logs, id and at_ms indexed": (
        [
            f"CREATE TABLE audit_logs (id TEXT PRIMARY KEY NOT NULL, at_ms INTEGER NOT NULL, {AUDIT_COLUMNS})",
            "CREATE INDEX audit_logs_by_time ON audit_logs (at_ms)",
        ],
        audit_rows,
    ),
    "audit_logs, WITHOUT ROWID": (
        [f"CREATE TABLE audit_logs (id TEXT NOT NULL, at_ms INTEGER NOT NULL, {AUDIT_COLUMNS}, PRIMARY KEY (at_ms, id)) WITHOUT ROWID"],
        audit_rows,
    ),
}


def run(name, directory, n=4000):
    """µs and WAL pages per execution (checkpoints off, so the WAL holds every frame written)."""
    path = os.path.join(directory, f"{next(counter)}.db")
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode = WAL")
    c.execute("PRAGMA synchronous = OFF")
    c.execute("PRAGMA wal_autocheckpoint = 0")
    schema, rows_of = SCHEMAS[name]
    for statement in schema:
        c.execute(statement)
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    table_name = schema[0].split()[2]
    rows = [rows_of(time_ordered_id()) for _ in range(n)]
    insert = f"INSERT INTO {table_name} VALUES ({','.join('?' * len(rows[0][0]))})"
    if table_name == "audit_logs":
        insert = f"INSERT INTO audit_logs (id, at_ms, principal_id, action, method, route, resource, result, execution_id, ip, user_agent) VALUES ({','.join('?' * 11)})"
    if table_name == "outbox":
        insert = f"INSERT INTO outbox (event_id, execution_id, event_type, event_version, principal_id, workflow, payload_json, occurred_ms, traceparent, routed_ms, stream_published_ms, dispatched_ms) VALUES ({','.join('?' * 12)})"
    start = time.perf_counter()
    for execution in rows:
        c.execute("BEGIN")
        c.executemany(insert, execution)
        c.execute("COMMIT")
    elapsed = time.perf_counter() - start
    page_size = c.execute("PRAGMA page_size").fetchone()[0]
    frames = (os.path.getsize(path + "-wal") - 32) / (page_size + 24)
    c.close()
    return elapsed / n * 1e6, frames / n


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    names = [n for n in SCHEMAS if len(sys.argv) <= 2 or any(n.startswith(t) for t in sys.argv[2:])]
    figures = {name: [] for name in names}
    pages = {}
    with tempfile.TemporaryDirectory() as directory:
        for _ in range(rounds):
            for name in names:
                micros, frames = run(name, directory)
                figures[name].append(micros)
                pages[name] = frames
    for name in names:
        print(f"{name:30} {statistics.median(figures[name]):6.0f} µs, {pages[name]:5.2f} WAL pages per execution (median of {rounds})")


if __name__ == "__main__":
    main()
