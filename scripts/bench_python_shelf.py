"""Python copy fetches with and without the node's shelf of copy
destinations (`fetch.copy-buffers`), A/B in one run.

An owner process puts one shard per size (1, 4, 16, 64 MiB by default)
into its posix-shm pool; this process runs two consumer nodes, one with
the default shelf (64 MiB) and one with `fetch.copy-buffers = 0`, and
fetches each shard in copy mode in a loop (`s = node.fetch(h,
mode="copy"); del s`), the two nodes alternating round by round. The
limits, measured in the same rounds: `np.copyto` into a warm array (a
memcpy into memory already faulted in: what a reused destination can
reach), the same split in two halves copied by two threads at once from
4 MiB on (the host's copy splits there across the cores, `kit::copy`, so
one thread's memcpy is not its limit), and `np.copy` (a new array each
time; glibc serves it from memory freed before up to its mmap threshold,
at most 32 MiB, so below that it is warm memory too).

    SHARDPORT_PY_PROFILE=release bash scripts/setup.sh
    .venv/bin/python scripts/bench_python_shelf.py [--sizes 1,4,16,64] [--rounds 5]

The library config otherwise: the owner's puts compute no checksum
(`put.checksum`), so the fetches verify none.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import shardport

MIB = 1 << 20


def node_config(prefix: str, **fetch) -> dict:
    cfg = shardport.default_config()
    for p in cfg["plugin"]:
        if p["name"] == "posix-shm":
            p["config"]["segment-prefix"] = prefix
            p["config"]["pool-size"] = "256MiB"
    cfg["fetch"].update(fetch)
    return cfg


def owner(prefix: str, sizes: list[int], out, stop) -> None:
    with shardport.Node(node_config(prefix)) as node:
        rng = np.random.default_rng(7)
        hs = [node.put(rng.integers(0, 256, n, dtype=np.uint8)) for n in sizes]
        out.put([h.to_bytes() for h in hs])
        stop.get()


def per_round(n: int) -> int:
    """Fetches per cell: about 512 MiB, at least 8."""
    return max(8, (512 * MIB) // n)


def timed(fn, count: int) -> float:
    t = time.perf_counter()
    for _ in range(count):
        fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,4,16,64", help="MiB, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) * MIB for s in args.sizes.split(",")]
    prefix = "spbench" + secrets.token_hex(4)
    ctx = mp.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=owner, args=(prefix, sizes, out, stop))
    proc.start()
    rows = []
    try:
        handles = [shardport.Handle.from_bytes(b) for b in out.get(timeout=120)]
        with (
            ThreadPoolExecutor(2) as pool,
            shardport.Node(node_config(prefix)) as shelf,
            shardport.Node(node_config(prefix, **{"copy-buffers": 0})) as fresh,
        ):
            for n, h in zip(sizes, handles):
                count = per_round(n)
                src = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
                warm = np.empty_like(src)
                warm[:] = 0
                cells = {
                    "shelf": [],
                    "fresh": [],
                    "np.copyto (warm)": [],
                    "np.copyto (warm, 2 threads)": [],
                    "np.copy (new array)": [],
                }
                halves = [(warm[: n // 2], src[: n // 2]), (warm[n // 2 :], src[n // 2 :])]

                def split_copy(halves=halves):
                    # np.copyto releases the GIL while it copies.
                    for f in [pool.submit(np.copyto, d, s) for d, s in halves]:
                        f.result()

                # One untimed fetch each: the first copy of a size is fresh
                # on both nodes.
                for node in (shelf, fresh):
                    s = node.fetch(h, mode="copy")
                    assert s.transport == "posix-shm" and s.mode == "copy", s.reason
                    del s
                before = {k: dict(v.stats()["copy_buffers"]) for k, v in (("shelf", shelf), ("fresh", fresh))}
                for _ in range(args.rounds):
                    for name, node in (("shelf", shelf), ("fresh", fresh)):
                        cells[name].append(timed(lambda node=node: node.fetch(h, mode="copy"), count))
                    cells["np.copyto (warm)"].append(timed(lambda: np.copyto(warm, src), count))
                    if n >= 4 * MIB:
                        cells["np.copyto (warm, 2 threads)"].append(timed(split_copy, count))
                    cells["np.copy (new array)"].append(timed(lambda: src.copy(), count))
                after = {k: dict(v.stats()["copy_buffers"]) for k, v in (("shelf", shelf), ("fresh", fresh))}
                row = {"MiB": n // MIB, "fetches_per_round": count}
                for name, secs in cells.items():
                    if not secs:
                        row[name] = None
                        continue
                    gbs = [n * count / s / 1e9 for s in secs]
                    row[name] = {
                        "GB/s median": round(statistics.median(gbs), 2),
                        "GB/s min-max": [round(min(gbs), 2), round(max(gbs), 2)],
                        "per s median": round(statistics.median(count / s for s in secs), 1),
                    }
                for k in ("shelf", "fresh"):
                    row[k]["reused"] = after[k]["reused"] - before[k]["reused"]
                    row[k]["fresh"] = after[k]["fresh"] - before[k]["fresh"]
                rows.append(row)
                del warm, src
    finally:
        stop.put(None)
        proc.join(60)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    if args.json:
        json.dump({"load": load, "rows": rows}, sys.stdout, indent=1)
        print()
        return 0
    print(
        f"load average {' '.join(load)}; {args.rounds} alternating rounds; medians (min-max) GB/s"
    )
    print(
        "| MiB | shelf (default) | copy-buffers = 0 | shelf / none | np.copyto warm | "
        "np.copyto warm, 2 threads | np.copy new array | shelf reused / fresh |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        def cell(k):
            c = r[k]
            if c is None:
                return "-"
            lo, hi = c["GB/s min-max"]
            return f"{c['GB/s median']} ({lo}-{hi}); {c['per s median']}/s"
        ratio = r["shelf"]["GB/s median"] / r["fresh"]["GB/s median"]
        print(
            f"| {r['MiB']} | {cell('shelf')} | {cell('fresh')} | {ratio:.2f}x | "
            f"{cell('np.copyto (warm)')} | {cell('np.copyto (warm, 2 threads)')} | {cell('np.copy (new array)')} | "
            f"{r['shelf']['reused']} / {r['shelf']['fresh']} (none: {r['fresh']['reused']} / {r['fresh']['fresh']}) |"
        )
    leftover = [x for x in os.listdir("/dev/shm") if prefix in x]
    if leftover:
        print(f"left in /dev/shm: {leftover}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
