#!/usr/bin/env python3
"""A trainer shares its weights with N rollout workers through shardport.

The trainer puts a dict of tensors (the weights) each step; N rollout worker
processes (multiprocessing, spawn) receive only the handles through a queue,
fetch the tensors zero-copy, checksum them and report the transport that
served them; at step end the trainer removes the shards. At exit nothing is
left in /dev/shm.

    python examples/python/rollout.py --workers 2 --steps 3
    python examples/python/rollout.py --http     # two nodes, http chosen by config

`--http`: the trainer's config exports shards through the http transport only
(`put.export-to = ["http"]`, heap storage), so every worker fetches over loopback HTTP: the
path a worker on another machine takes.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import secrets
import sys
import zlib

import ml_dtypes
import numpy as np

import shardport


def node_config(prefix: str, http_only: bool) -> dict:
    """The default config with a segment prefix of our own (so the /dev/shm
    check sees only this run) and, for --http, exports through http only."""
    cfg = shardport.default_config()
    cfg["node"]["name"] = "rollout"
    for p in cfg["plugin"]:
        if p["name"] == "posix-shm":
            p["config"]["segment-prefix"] = prefix
            p["config"]["pool-size"] = "256MiB"
    if http_only:
        cfg["put"]["export-to"] = ["http"]
        cfg["put"]["storage"] = "heap"  # not the shm pool, which would export too
        cfg["fetch"]["mode"] = "copy"  # a remote owner's bytes arrive as a copy
    return cfg


def make_weights(step: int, mib: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    n = max(1, int(mib * (1 << 20) / 4 / 3))
    side = max(1, int(n**0.5))
    return {
        "embed.weight": rng.standard_normal((side, side), dtype=np.float32),
        "mlp.weight": rng.standard_normal((side, side)).astype(ml_dtypes.bfloat16),
        "mlp.bias": rng.standard_normal(side, dtype=np.float32),
        "step": np.array([step], dtype=np.int64),
    }


def crc(a: np.ndarray) -> int:
    """CRC32 of the array's bytes, read in place (no copy)."""
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8))


def worker(rank: int, cfg: dict, mode: str, q_in, q_out) -> None:
    with shardport.Node(cfg) as node:
        while (msg := q_in.get()) is not None:
            step, handles = msg
            report = {}
            for name, h in handles.items():
                shard = node.fetch(h, mode=mode)
                report[name] = (crc(shard.numpy()), shard.transport, shard.mode, shard.reason)
                del shard  # the lease ends with the last reference
            q_out.put((rank, step, report))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--mib", type=float, default=8.0, help="weights per step, MiB")
    ap.add_argument("--http", action="store_true", help="two nodes, http chosen by config")
    args = ap.parse_args(argv)

    prefix = "sproll" + secrets.token_hex(4)
    trainer_cfg = node_config(prefix, http_only=args.http)
    worker_cfg = node_config(prefix, http_only=False)
    mode = "copy" if args.http else "view"
    ctx = mp.get_context("spawn")
    q_out = ctx.Queue()
    queues = [ctx.Queue() for _ in range(args.workers)]
    procs = [
        ctx.Process(target=worker, args=(r, worker_cfg, mode, queues[r], q_out), daemon=True)
        for r in range(args.workers)
    ]
    for p in procs:
        p.start()
    ok = True
    with shardport.Node(trainer_cfg) as trainer:
        for step in range(args.steps):
            weights = make_weights(step, args.mib)
            handles = {name: trainer.put(t) for name, t in weights.items()}
            expect = {name: crc(t) for name, t in weights.items()}
            for q in queues:
                q.put((step, handles))  # only handles cross the queue
            for _ in procs:
                rank, s, report = q_out.get(timeout=300)
                for name, (c, transport, served, reason) in report.items():
                    good = c == expect[name] and s == step
                    ok &= good
                    if name == "embed.weight":
                        print(
                            f"step {step} worker {rank}: {len(report)} tensors "
                            f"{'checksums match' if good else 'CHECKSUM MISMATCH'}, "
                            f"via {transport} ({served}): {reason}"
                        )
            removed = trainer.remove(list(handles.values()))
            assert removed == len(handles)
        for q in queues:
            q.put(None)
        for p in procs:
            p.join(60)
            ok &= p.exitcode == 0
    left = [n for n in os.listdir("/dev/shm") if prefix in n]
    print(f"/dev/shm after the run: {len(left)} segment(s) of this run left {left if left else ''}")
    ok &= not left
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
