#!/usr/bin/env python3
"""Which B-trees SQLite's commits write: the WAL frames of the last commits, by B-tree.

usage: wal_pages.py DIR [COMMITS]

DIR holds a copy of a database (`capstan.db`) and of its WAL (`capstan.db-wal`), taken while the
server ran (stop it with SIGSTOP for the copy, so no commit is half written). The script reads the
WAL's valid frames (those carrying the header's salts), groups them by commit (a frame with a
database size ends one), and names each frame's page with SQLite's `dbstat` table (the `sqlite3`
shell, which reads the copied WAL too). It prints the frames of the last COMMITS commits (40 by
default) and how many pages of each B-tree and page type a commit wrote on average.
BENCHMARKS.md ("What a lone execution writes") says how the figures there were taken.
"""

import collections
import shutil
import struct
import subprocess
import sys
import tempfile


def frames(wal):
    """(page number, database size or 0) of each valid frame, in order."""
    _magic, _version, page_size, _seq, salt1, salt2, _c1, _c2 = struct.unpack(">8I", wal[:32])
    out, offset = [], 32
    while offset + 24 + page_size <= len(wal):
        page, size, s1, s2 = struct.unpack(">4I", wal[offset : offset + 16])
        if (s1, s2) != (salt1, salt2):
            break
        out.append((page, size))
        offset += 24 + page_size
    return out


def owners(directory):
    """Page number → (B-tree, page type), from `dbstat`, read from copies of the files: the
    shell checkpoints the WAL it opens and removes it on closing."""
    with tempfile.TemporaryDirectory() as scratch:
        for name in ("capstan.db", "capstan.db-wal"):
            shutil.copy(f"{directory}/{name}", f"{scratch}/{name}")
        rows = subprocess.run(
            ["sqlite3", f"{scratch}/capstan.db", "SELECT pageno, name, pagetype FROM dbstat"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    found = {}
    for line in rows.splitlines():
        page, name, kind = line.split("|")
        found[int(page)] = (name, kind)
    return found


def main():
    directory = sys.argv[1]
    last = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(f"{directory}/capstan.db-wal", "rb") as f:
        wal = f.read()
    commits, current = [], []
    for page, size in frames(wal):
        current.append(page)
        if size:
            commits.append(current)
            current = []
    commits = commits[-last:]
    if not commits:
        sys.exit("no complete commit in the WAL")
    names = owners(directory)
    print(f"frames per commit, last {len(commits)} commits:", [len(c) for c in commits])
    print(f"mean {sum(map(len, commits)) / len(commits):.1f} frames per commit")
    tally = collections.Counter(names.get(page, ("(in no B-tree: freed since)", "?")) for c in commits for page in c)
    for (name, kind), n in tally.most_common():
        print(f"{n / len(commits):6.2f}  {name} ({kind})")


if __name__ == "__main__":
    main()
