"""Names the rows of the execution transition table that no test decided.

`just test` runs the suites with CAPSTAN_TRANSITIONS_WITNESS set to a directory; every process
(test binaries and the servers they start) appends the index of each row it decides to a file
there. The rows are read from the table in host/core/src/transitions.rs's module documentation,
which a unit test keeps equal to the code's table, in the same order.

Exits 1 if a row was never decided, listing it, so a new transition comes with a test.
"""

import pathlib
import sys

root = pathlib.Path(__file__).resolve().parents[2]
witness = pathlib.Path(sys.argv[1])
doc = (root / "host/core/src/transitions.rs").read_text().splitlines()
rows = [
    line[len("//! "):]
    for line in doc
    if line.startswith("//! | ") and not line.startswith("//! | from ")
]
seen = set()
for f in witness.glob("*"):
    seen.update(int(x) for x in f.read_text().split())
missing = [(i, r) for i, r in enumerate(rows) if i not in seen]
print(f"transition table: {len(rows) - len(missing)} of {len(rows)} rows decided by a test")
for i, r in missing:
    print(f"  never decided: row {i}: {r}")
sys.exit(1 if missing else 0)
