#!/usr/bin/env python3
"""Benchmark of the Python package (a script, not a test; numbers go to
BENCHMARKS.md). Build optimised first:

    SHARDPORT_PY_PROFILE=release bash scripts/setup.sh
    .venv/bin/python scripts/bench_python.py

Measures, in one run on one node (owner and consumer in this process, the
posix-shm transport):
  * view-mode fetch p50 at 4 KiB and 256 MiB (a zero-copy fetch should cost
    the same at every size), bare and with np.asarray on the result;
  * copy-mode fetch of 256 MiB vs np.copy of the same bytes (both allocate
    and fault in fresh pages), and fetch_into a reused array vs np.copyto
    into a reused array;
  * put of a 256 MiB array into a warm pool vs np.copyto of the same bytes;
  * fetch_many copies vs fetch copies of 64 MiB and 256 MiB shards (a batch
    must copy at single-fetch speed: both allocate fresh buffers);
  * the Python layer's overhead over the Rust API (the same fetch timed in a
    Rust loop inside this process).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

import shardport

KIB, MIB = 1 << 10, 1 << 20


def p50(samples_ns: list[int]) -> float:
    return statistics.median(samples_ns) / 1000.0  # us


def timed(fn, iters: int) -> list[int]:
    out = []
    for _ in range(iters):
        t = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t)
    return out


def paired(f, g, iters: int) -> tuple[list[int], list[int]]:
    """Times f and g alternately, so both see the same load on a shared machine."""
    a, b = [], []
    for _ in range(iters):
        a += timed(f, 1)
        b += timed(g, 1)
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small-iters", type=int, default=20000)
    ap.add_argument("--big-iters", type=int, default=21)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    cfg = shardport.default_config()
    for p in cfg["plugin"]:
        if p["name"] == "posix-shm":
            p["config"]["pool-size"] = "1GiB"
            # A prefix of our own: starting a pool sweeps dead owners'
            # segments under its prefix, which other test runs may be watching.
            p["config"]["segment-prefix"] = f"spbench{os.getpid()}"
    res: dict[str, float] = {}
    with shardport.Node(cfg) as node:
        small = np.random.default_rng(0).integers(0, 255, 4 * KIB, dtype=np.uint8)
        big = np.random.default_rng(1).integers(0, 1 << 31, 256 * MIB // 4, dtype=np.uint32)
        hs, hb = node.put(small), node.put(big)

        # -- view-mode fetch ------------------------------------------------
        for name, h, n in (("4KiB", hs, args.small_iters), ("256MiB", hb, max(args.small_iters // 10, 100))):
            timed(lambda: node.fetch(h, mode="view"), 200)  # warm-up
            res[f"view_fetch_{name}_us"] = p50(timed(lambda: node.fetch(h, mode="view"), n))
            res[f"view_fetch_asarray_{name}_us"] = p50(timed(lambda: np.asarray(node.fetch(h, mode="view")), n))
            res[f"view_fetch_dlpack_{name}_us"] = p50(timed(lambda: np.from_dlpack(node.fetch(h, mode="view")), n))
            res[f"rust_view_fetch_{name}_us"] = p50(node._bench_fetch(h, "view", n))
            res[f"overhead_view_fetch_{name}_us"] = res[f"view_fetch_{name}_us"] - res[f"rust_view_fetch_{name}_us"]

        # -- copy-mode fetch vs np.copy / np.copyto --------------------------
        it = args.big_iters
        timed(lambda: node.fetch(hb, mode="copy"), 2)
        f, g = paired(lambda: node.fetch(hb, mode="copy"), lambda: np.copy(big), it)
        res["copy_fetch_256MiB_ms"], res["np_copy_256MiB_ms"] = p50(f) / 1000, p50(g) / 1000
        res["ratio_copy_fetch_vs_np_copy"] = res["np_copy_256MiB_ms"] / res["copy_fetch_256MiB_ms"]
        dst = np.empty_like(big)
        np.copyto(dst, big)  # fault the pages in once
        f, g = paired(lambda: node.fetch_into(hb, dst), lambda: np.copyto(dst, big), it)
        res["fetch_into_256MiB_ms"], res["np_copyto_256MiB_ms"] = p50(f) / 1000, p50(g) / 1000
        res["ratio_fetch_into_vs_np_copyto"] = res["np_copyto_256MiB_ms"] / res["fetch_into_256MiB_ms"]
        assert np.array_equal(dst, big)

        # -- fetch_many copy vs fetch copy -----------------------------------
        h64 = node.put(big[: 64 * MIB // 4])
        for name, h in (("64MiB", h64), ("256MiB", hb)):
            f, g = paired(lambda: node.fetch(h, mode="copy"), lambda: node.fetch_many([h], mode="copy"), it)
            res[f"copy_fetch_{name}_ms"], res[f"copy_fetch_many_{name}_ms"] = p50(f) / 1000, p50(g) / 1000
            res[f"ratio_fetch_many_vs_fetch_copy_{name}"] = p50(f) / p50(g)

        # -- put into a warm pool vs np.copyto -------------------------------
        def put_remove():
            node.remove(node.put(big))

        timed(put_remove, 4)  # the pool's pages are touched once
        f, g = paired(put_remove, lambda: np.copyto(dst, big), it)
        res["put_256MiB_warm_ms"], res["np_copyto_put_256MiB_ms"] = p50(f) / 1000, p50(g) / 1000
        res["ratio_put_vs_np_copyto"] = res["np_copyto_put_256MiB_ms"] / res["put_256MiB_warm_ms"]

    res["machine"] = f"{platform.node()} {platform.machine()} {platform.processor() or ''} cpus={os.cpu_count()}"
    if args.json:
        print(json.dumps(res, indent=1))
        return
    w = max(len(k) for k in res)
    for k, v in res.items():
        print(f"{k:<{w}}  {v:.3f}" if isinstance(v, float) else f"{k:<{w}}  {v}")


if __name__ == "__main__":
    main()
