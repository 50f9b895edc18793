#!/usr/bin/env python3
"""The first fetch of a fresh consumer process (a script, not a test;
numbers go to BENCHMARKS.md). Build optimised first:

    SHARDPORT_PY_PROFILE=release bash scripts/setup.sh
    .venv/bin/python scripts/bench_first_fetch.py [runs]

Two owners (this process, and a child it starts) each put a 4 KiB shard.
Then, `runs` times, a fresh Python process imports shardport, starts a node
(the embedded library config), and times with perf_counter:
  first_us     its very first fetch (view) of the first owner's shard
  again_us     the same fetch again
  new_owner_us its first fetch of the second owner's shard
Medians and the range over the runs are printed.
"""
import statistics
import subprocess
import sys
import textwrap

import numpy as np

import shardport

CONSUMER = textwrap.dedent(
    """
    import sys, time
    import shardport
    a, b = (shardport.Handle.from_bytes(bytes.fromhex(x)) for x in sys.argv[1:3])
    node = shardport.Node()
    t0 = time.perf_counter(); s = node.fetch(a, mode="view"); t1 = time.perf_counter()
    del s
    t2 = time.perf_counter(); s = node.fetch(a, mode="view"); t3 = time.perf_counter()
    del s
    t4 = time.perf_counter(); s = node.fetch(b, mode="view"); t5 = time.perf_counter()
    del s
    print((t1 - t0) * 1e6, (t3 - t2) * 1e6, (t5 - t4) * 1e6)
    node.close()
    """
)

SECOND_OWNER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import shardport
    with shardport.Node() as node:
        h = node.put(np.full(4096, 2, dtype=np.uint8))
        print(h.to_bytes().hex(), flush=True)
        sys.stdin.readline()
    """
)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    with shardport.Node() as node:
        a = node.put(np.full(4096, 1, dtype=np.uint8)).to_bytes().hex()
        owner = subprocess.Popen(
            [sys.executable, "-c", SECOND_OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            b = owner.stdout.readline().strip()
            rows = []
            for _ in range(runs):
                out = subprocess.run(
                    [sys.executable, "-c", CONSUMER, a, b], capture_output=True, text=True, timeout=120
                )
                if out.returncode != 0:
                    sys.exit(f"consumer failed: {out.stderr}")
                rows.append([float(x) for x in out.stdout.split()])
        finally:
            owner.stdin.write("\n")
            owner.stdin.flush()
            owner.wait(timeout=60)
    for i, name in enumerate(["first_us", "again_us", "new_owner_us"]):
        col = [r[i] for r in rows]
        print(f"{name}: median {statistics.median(col):.1f} (min {min(col):.1f}, max {max(col):.1f}) over {runs}")


if __name__ == "__main__":
    main()
