#!/usr/bin/env python3
"""One trainer -> rollout step in Ray: ray.put/ray.get vs shardport handles.

A script, not a test (numbers go to BENCHMARKS.md). Build optimised first:

    SHARDPORT_PY_PROFILE=release bash scripts/setup.sh
    .venv/bin/python examples/python/bench_ray.py

In one local Ray cluster (2 CPUs, no dashboard) a trainer actor holds one
NumPy array per size, and `--actors` rollout actors consume it. One step,
timed both ways in the same run, alternating:

- **ray**: the trainer `ray.put`s the array (one copy into Ray's object
  store, or inline for small objects) and returns the ObjectRef wrapped in a
  list; each actor `ray.get`s it (a zero-copy read-only view of the object
  store on this machine); the trainer then drops the ref.
- **shardport**: the trainer `node.put`s it (one copy into its posix-shm
  pool) and returns the Handle; each actor `node.fetch`es it as a view; the
  trainer then removes the shard.

Each actor touches the first and last element (proof of a usable array, no
full read: both ways are zero-copy). Per cell: `--warmup` untimed steps, then
`--reps` timed steps; medians of the trainer's put time (in the trainer), the
actors' get/fetch time (in the actor), and the whole step as the driver sees
it (put call + consume calls + release call: includes Ray's actor-call
overhead, the same both ways).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

import shardport

try:
    import ray
except ImportError as e:  # pragma: no cover
    print(f"skipped: ray is not importable ({e})")
    sys.exit(2)

KIB, MIB = 1 << 10, 1 << 20
SIZES = {"4KiB": 4 * KIB, "1MiB": MIB, "256MiB": 256 * MIB}


def node_config() -> dict:
    cfg = shardport.default_config()
    for p in cfg["plugin"]:
        if p["name"] == "posix-shm":
            p["config"]["pool-size"] = "768MiB"
            p["config"]["segment-prefix"] = "spbench"
    return cfg


class Trainer:
    def __init__(self, sizes: dict[str, int]) -> None:
        self.node = shardport.Node(node_config())
        rng = np.random.default_rng(0)
        self.arrays = {k: rng.integers(0, 255, n, dtype=np.uint8) for k, n in sizes.items()}
        self.refs: list = []
        self.handle = None

    def ray_put(self, size: str) -> tuple[list, int]:
        t0 = time.perf_counter_ns()
        ref = ray.put(self.arrays[size])
        dt = time.perf_counter_ns() - t0
        self.refs = [ref]
        return [ref], dt  # in a list: Ray passes it on unresolved

    def ray_release(self) -> None:
        self.refs = []

    def sp_put(self, size: str) -> tuple[shardport.Handle, int]:
        t0 = time.perf_counter_ns()
        self.handle = self.node.put(self.arrays[size])
        return self.handle, time.perf_counter_ns() - t0

    def sp_release(self) -> None:
        self.node.remove(self.handle)
        self.handle = None

    def close(self) -> None:
        self.node.close()


class Rollout:
    def __init__(self) -> None:
        self.node = shardport.Node(node_config())

    def ray_get(self, boxed: list, nbytes: int) -> int:
        t0 = time.perf_counter_ns()
        a = ray.get(boxed[0])
        dt = time.perf_counter_ns() - t0
        assert a.nbytes == nbytes and int(a[0]) >= 0 and int(a[-1]) >= 0
        return dt

    def sp_fetch(self, h: shardport.Handle, nbytes: int) -> int:
        t0 = time.perf_counter_ns()
        a = self.node.fetch(h, mode="view").numpy()
        dt = time.perf_counter_ns() - t0
        assert a.nbytes == nbytes and int(a[0]) >= 0 and int(a[-1]) >= 0
        return dt

    def close(self) -> None:
        self.node.close()


def step(way: str, trainer, rollouts, size: str, nbytes: int) -> tuple[int, int, int]:
    """One step; (driver ns, put ns, median consumer ns)."""
    t0 = time.perf_counter_ns()
    if way == "ray":
        obj, put_ns = ray.get(trainer.ray_put.remote(size))
        got = ray.get([a.ray_get.remote(obj, nbytes) for a in rollouts])
        ray.get(trainer.ray_release.remote())
    else:
        obj, put_ns = ray.get(trainer.sp_put.remote(size))
        got = ray.get([a.sp_fetch.remote(obj, nbytes) for a in rollouts])
        ray.get(trainer.sp_release.remote())
    return time.perf_counter_ns() - t0, put_ns, int(statistics.median(got))


def fmt(ns: float) -> str:
    return f"{ns / 1e3:.1f} us" if ns < 1e6 else f"{ns / 1e6:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--sizes", default="4KiB,1MiB,256MiB", help=f"comma list of {list(SIZES)}")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--reps-large", type=int, default=7, help="reps at 256 MiB")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = ap.parse_args(argv)
    sizes = {}
    for s in args.sizes.split(","):
        if s not in SIZES:
            ap.error(f"--sizes: unknown size {s!r}; choose from {', '.join(SIZES)}")
        sizes[s] = SIZES[s]
    if args.actors < 1 or args.reps < 1 or args.reps_large < 1 or args.warmup < 0:
        ap.error("--actors, --reps and --reps-large must be >= 1, --warmup >= 0")

    ray.init(
        address="local",  # a new local cluster, never one RAY_ADDRESS names
        num_cpus=2,
        object_store_memory=1 << 30,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    rows = []
    try:
        trainer = ray.remote(num_cpus=0)(Trainer).remote(sizes)
        rollouts = [ray.remote(num_cpus=0)(Rollout).remote() for _ in range(args.actors)]
        for size, nbytes in sizes.items():
            reps = args.reps_large if nbytes >= 64 * MIB else args.reps
            samples = {"ray": [], "shardport": []}
            for i in range(args.warmup + reps):
                for way in ("ray", "shardport") if i % 2 == 0 else ("shardport", "ray"):
                    s = step(way, trainer, rollouts, size, nbytes)
                    if i >= args.warmup:
                        samples[way].append(s)
            for way, ss in samples.items():
                med = [statistics.median(x[k] for x in ss) for k in range(3)]
                rows.append(
                    {"size": size, "way": way, "reps": reps, "step_ns": med[0], "put_ns": med[1], "get_ns": med[2]}
                )
        ray.get([a.close.remote() for a in rollouts] + [trainer.close.remote()])
    finally:
        ray.shutdown()

    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.2f}, Python {platform.python_version()}, ray {ray.__version__}, "
        f"{args.actors} rollout actors, medians"
    )
    print("| size | way | put (trainer) | get/fetch (per actor) | step (driver) | reps |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['size']} | {r['way']} | {fmt(r['put_ns'])} | {fmt(r['get_ns'])} | "
            f"{fmt(r['step_ns'])} | {r['reps']} |"
        )
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
