#!/usr/bin/env python3
"""What SQLite spends on an execution's stage and event rows, with and without the indexes
nothing reads (docs/decisions.md, "An execution's rows are written to the keys that are read").

usage: index_inserts.py [ROUNDS]

Inserts the rows of 4,000 ten-stage executions, one commit per execution (11 stages, or 25
events), into a fresh WAL database (`synchronous=OFF`, so the figure is CPU, not syncs), once per
schema and round, alternating: `stages` with its id's automatic index and `stages_by_execution`
against `WITHOUT ROWID` keyed by (execution_id, position); `outbox` with a UNIQUE `event_id`
against without. Ids are time-ordered, as UUIDv7s are. Prints the median µs per execution of each.
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

SCHEMAS = {
    "stages, id indexed": [
        f"CREATE TABLE stages (id TEXT PRIMARY KEY NOT NULL, {STAGE_COLUMNS})",
        "CREATE UNIQUE INDEX stages_by_execution ON stages (execution_id, position)",
    ],
    "stages, WITHOUT ROWID": [
        f"CREATE TABLE stages (id TEXT NOT NULL, {STAGE_COLUMNS}, PRIMARY KEY (execution_id, position)) WITHOUT ROWID",
    ],
    "events, event_id UNIQUE": [
        f"CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL UNIQUE, {OUTBOX_COLUMNS})",
        "CREATE INDEX outbox_by_execution ON outbox (execution_id, seq)",
    ],
    "events, event_id not indexed": [
        f"CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL, {OUTBOX_COLUMNS})",
        "CREATE INDEX outbox_by_execution ON outbox (execution_id, seq)",
    ],
}

counter = itertools.count()


def time_ordered_id():
    n = next(counter)
    ms = 1_765_000_000_000 + n // 50
    return "%08x-%04x-7%03x-8000-%012x" % (ms >> 16, ms & 0xFFFF, n & 0xFFF, int.from_bytes(os.urandom(6), "big"))


def executions(stages, n=4000):
    out = []
    for _ in range(n):
        e = time_ordered_id()
        if stages:
            out.append([(time_ordered_id(), e, j, f"step-{j}", "succeeded", 1, 2, '{"changed":true}', None) for j in range(11)])
        else:
            payload = '{"executionId":"%s","workflow":"fixture-steps","stage":"step-3"}' % e
            out.append([(time_ordered_id(), e, "StageStarted", "1", "p", "fixture-steps", payload, 1, None, None, 1, None) for _ in range(25)])
    return out


def run(name, directory):
    path = os.path.join(directory, f"{next(counter)}.db")
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode = WAL")
    c.execute("PRAGMA synchronous = OFF")
    for statement in SCHEMAS[name]:
        c.execute(statement)
    stages = name.startswith("stages")
    insert = (
        "INSERT INTO stages (id, execution_id, position, stage_name, status, started_ms, finished_ms, output_json, error_json) VALUES (?,?,?,?,?,?,?,?,?)"
        if stages
        else "INSERT INTO outbox (event_id, execution_id, event_type, event_version, principal_id, workflow, payload_json, occurred_ms, traceparent, routed_ms, stream_published_ms, dispatched_ms) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
    )
    rows = executions(stages)
    start = time.perf_counter()
    for execution in rows:
        c.execute("BEGIN")
        c.executemany(insert, execution)
        c.execute("COMMIT")
    elapsed = time.perf_counter() - start
    c.close()
    return elapsed / len(rows) * 1e6


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    figures = {name: [] for name in SCHEMAS}
    with tempfile.TemporaryDirectory() as directory:
        for _ in range(rounds):
            for name in SCHEMAS:
                figures[name].append(run(name, directory))
    for name, values in figures.items():
        print(f"{name:30} {statistics.median(values):6.0f} µs per execution (median of {rounds})")


if __name__ == "__main__":
    main()
