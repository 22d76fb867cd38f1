#!/usr/bin/env python3
"""How long an fdatasync takes on this machine, after each kind of pause.

Usage: python3 host/bench/sync_latency.py [DIR]   (DIR: where the file goes; default target/)

Each of 300 iterations writes 240 KiB (about one lone execution's commit of WAL frames) over
the same region of a file and syncs it, after a pause of 1 ms spent asleep (`sleep`: the vCPU may
go idle, as between a lone client's requests), spent spinning (`spin`: the vCPU kept busy), or
no pause (`none`). Prints each kind's median and 90th percentile. On some VMs a sync that comes
after a pause takes several times longer than one right after another: that difference is the
machine's, and it bounds what one commit per execution can reach at 1 in flight.
"""
import os
import sys
import time

directory = sys.argv[1] if len(sys.argv) > 1 else "target"
os.makedirs(directory, exist_ok=True)
path = os.path.join(directory, "sync_latency.tmp")
block = b"x" * (60 * 4120)
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
try:
    os.pwrite(fd, block * 300, 0)
    os.fsync(fd)
    for pause in ("sleep", "spin", "none"):
        took = []
        for i in range(300):
            if pause == "sleep":
                time.sleep(0.001)
            elif pause == "spin":
                until = time.perf_counter() + 0.001
                while time.perf_counter() < until:
                    pass
            os.pwrite(fd, block, i * len(block))
            start = time.perf_counter()
            os.fdatasync(fd)
            took.append(time.perf_counter() - start)
        took.sort()
        print(f"{pause:>5}: fdatasync p50 {took[150] * 1e3:.3f} ms, p90 {took[270] * 1e3:.3f} ms")
finally:
    os.close(fd)
    os.remove(path)
