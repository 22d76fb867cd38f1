#!/usr/bin/env python3
"""Bytes each `capstan serve` of a bench run wrote to disk, per execution.

usage: disk_writes.py wrap BIN DIR       write DIR/server.sh, a server for CAPSTAN_BENCH_SERVER
       disk_writes.py report DIR N       each server's bytes per execution (N executions a row)

`wrap` writes a wrapper that runs BIN (the bench strips `CAPSTAN_*` variables from the servers it
spawns, so the wrapper names its binary itself) and, for each `serve`, keeps the server's
`write_bytes` from `/proc/PID/io` (bytes it sent towards the disk: SQLite's WAL frames and the
checkpoints' copies) in DIR/io.PID, read every 100 ms without forking. `report` prints them in the
order the servers started, one per engine row, divided by N. A row's figure leaves out what the
server wrote in its last 100 ms; compare builds row by row, alternated, not against other figures.

    python3 host/bench/disk_writes.py wrap /tmp/capstan-A /tmp/dw-A
    CAPSTAN_BENCH_SERVER=/tmp/dw-A/server.sh /tmp/bench-A --only engine --backend sqlite
    python3 host/bench/disk_writes.py report /tmp/dw-A 2000
"""

import os
import pathlib
import sys

WRAPPER = """#!/bin/bash
case "$*" in *serve*)
  (
    pid=$$
    while [ -r /proc/$pid/io ]; do
      while read -r key value; do
        [ "$key" = write_bytes: ] && echo "$value" > "{dir}/io.$pid"
      done < /proc/$pid/io
      sleep 0.1
    done
  ) &
  ;;
esac
exec {bin} "$@"
"""


def wrap(binary, directory):
    d = pathlib.Path(directory).resolve()
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("io.*"):
        old.unlink()
    script = d / "server.sh"
    script.write_text(WRAPPER.replace("{dir}", str(d)).replace("{bin}", str(pathlib.Path(binary).resolve())))
    script.chmod(0o755)
    print(script)


def report(directory, executions):
    files = sorted(pathlib.Path(directory).glob("io.*"), key=os.path.getctime)
    for f in files:
        text = f.read_text().strip()
        if text:
            print(f"{f.name}: {int(text) / executions / 1024:.1f} KiB per execution")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "wrap":
        wrap(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "report":
        report(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(__doc__)
