#!/usr/bin/env python3
"""What a lone commit's WAL writes cost as SQLite issues them, against one gathered call.

Usage: python3 host/bench/write_calls.py [DIR]   (DIR: where the file goes; default target/)

SQLite writes each WAL frame with two `pwrite`s, its 24-byte header and its page; a lone
execution's commit is ~60 frames (BENCHMARKS.md, "What a lone execution writes"). Each of 300
iterations writes 60 frames either that way (120 calls) or as one `pwritev`, then syncs, 1 ms
asleep between iterations. Prints each way's median write time and the median sync after it.
Python adds ~1 µs per call, so the gap it prints is an upper bound on what gathering the writes
would save per commit; the sync after it shows whether the bytes cost more than the calls.
"""
import os
import statistics
import sys
import time

directory = sys.argv[1] if len(sys.argv) > 1 else "target"
os.makedirs(directory, exist_ok=True)
path = os.path.join(directory, "write_calls.tmp")
FRAMES = 60
HEADER = b"h" * 24
PAGE = b"p" * 4096
FRAME = len(HEADER) + len(PAGE)
SLOTS = 40

fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)


def apart(offset):
    for i in range(FRAMES):
        at = offset + i * FRAME
        os.pwrite(fd, HEADER, at)
        os.pwrite(fd, PAGE, at + len(HEADER))


def gathered(offset):
    os.pwritev(fd, [HEADER, PAGE] * FRAMES, offset)


try:
    os.pwrite(fd, (HEADER + PAGE) * FRAMES * SLOTS, 0)
    os.fsync(fd)
    for name, write in (("120 pwrites", apart), ("1 pwritev", gathered)) * 2:
        wrote, synced = [], []
        for i in range(300):
            offset = (i % SLOTS) * FRAME * FRAMES
            t0 = time.perf_counter()
            write(offset)
            t1 = time.perf_counter()
            os.fdatasync(fd)
            t2 = time.perf_counter()
            wrote.append((t1 - t0) * 1e3)
            synced.append((t2 - t1) * 1e3)
            time.sleep(0.001)
        print(
            f"{name:>11}: write p50 {statistics.median(wrote):.3f} ms, "
            f"then fdatasync p50 {statistics.median(synced):.3f} ms"
        )
finally:
    os.close(fd)
    os.unlink(path)
