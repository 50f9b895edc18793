#!/usr/bin/env python3
"""shardport's AReaL adapter against AReaL's own RTensor backend, same run
(a script, not a test; numbers go to BENCHMARKS.md).

Needs an environment with areal 1.0.4 and torch (scripts/areal-suite.sh's
header lists the rest) and shardport installed; pass the AReaL checkout so
its `areal` is imported (as the suite does):

    PYTHONPATH=PATH-TO-AREAL python scripts/bench_areal.py [--sizes 4KiB,1MiB,64MiB,256MiB]

What it measures, per size, a float32 torch tensor fetched by a consumer
(this process) from an owner in another process on this machine:
  * AReaL: the owner is AReaL's RPC server (`python -m
    areal.infra.rpc.rpc_server`), the shard put with AReaL's `PUT
    /data/<uuid>`; the consumer's `HttpRTensorBackend().fetch([shard])`.
  * shardport: the owner is a spawned process whose
    `ShardportRTensorBackend.store(tensor)` gives the id; the consumer's
    `ShardportRTensorBackend(mode=...).fetch([shard])`, copy and view mode,
    and `Node.fetch` of the same handle (the adapter's own cost is the
    difference).
Medians of --reps fetches (fewer for AReaL at 64 MiB and up, where one
fetch takes seconds), and the ratio AReaL / shardport.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid

SIZES = {"4KiB": 4 << 10, "64KiB": 64 << 10, "1MiB": 1 << 20, "64MiB": 64 << 20, "256MiB": 256 << 20}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median_us(f, reps: int) -> float:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        r = f()
        out.append(time.perf_counter() - t)
        del r
    return statistics.median(out) * 1e6


def owner(sizes: list[int], q, done) -> None:
    """Spawned owner: stores one tensor per size, reports the ids, waits."""
    import torch

    from shardport.areal import ShardportRTensorBackend

    be = ShardportRTensorBackend()
    ids = [be.store(torch.arange(n // 4, dtype=torch.float32)) for n in sizes]
    q.put((be.node.address, ids))
    done.wait()
    be.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4KiB,64KiB,1MiB,64MiB,256MiB")
    ap.add_argument("--reps", type=int, default=51)
    args = ap.parse_args()
    sizes = [SIZES[s] for s in args.sizes.split(",")]
    import orjson
    import requests
    import torch
    from areal.infra.rpc.rtensor import HttpRTensorBackend, TensorShardInfo
    from areal.infra.rpc.serialization import serialize_value

    import shardport
    from shardport.areal import ShardportRTensorBackend, decode_id

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "areal.infra.rpc.rpc_server", "--host", "127.0.0.1", "--port", str(port),
         "--experiment-name", "bench", "--trial-name", "t0", "--role", "storage", "--worker-index", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=owner, args=(sizes, q, done))
    p.start()
    try:
        addr = f"127.0.0.1:{port}"
        for _ in range(120):
            try:
                if requests.get(f"http://{addr}/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.5)
        else:
            raise RuntimeError("AReaL's RPC server did not start")
        node_addr, ids = q.get(timeout=120)
        http = HttpRTensorBackend()
        copy_be = ShardportRTensorBackend(mode="copy")
        view_be = ShardportRTensorBackend(mode="view", node=copy_be.node)
        print(f"{'size':>7} {'AReaL http':>12} {'sp copy':>10} {'sp view':>10} {'Node.fetch':>11} "
              f"{'adapter':>8} {'x copy':>8} {'x view':>9}")
        for n, name, sid in zip(sizes, args.sizes.split(","), ids):
            t = torch.arange(n // 4, dtype=torch.float32)
            asid = str(uuid.uuid4())
            r = requests.put(f"http://{addr}/data/{asid}", data=orjson.dumps(serialize_value(t)))
            assert r.status_code == 200, r.text
            a_shard = TensorShardInfo(asid, addr)
            s_shard = TensorShardInfo(sid, node_addr)
            assert torch.equal(http.fetch([a_shard])[0], t)
            assert torch.equal(copy_be.fetch([s_shard])[0], t)
            assert torch.equal(view_be.fetch([s_shard])[0], t)
            reps = args.reps if n < (64 << 20) else 5
            areal_us = median_us(lambda: http.fetch([a_shard]), max(3, reps // 5) if n >= (1 << 20) else reps)
            copy_us = median_us(lambda: copy_be.fetch([s_shard]), reps)
            view_us = median_us(lambda: view_be.fetch([s_shard]), reps)
            h = decode_id(sid)[0]
            node_us = median_us(lambda: copy_be.node.fetch(h, mode="view").torch(), reps)
            print(f"{name:>7} {areal_us:>10.0f}us {copy_us:>8.1f}us {view_us:>8.1f}us {node_us:>9.1f}us "
                  f"{view_us - node_us:>6.1f}us {areal_us / copy_us:>7.0f}x {areal_us / view_us:>8.0f}x")
        copy_be.close()
    finally:
        done.set()
        p.join(timeout=30)
        server.terminate()
        server.wait(timeout=30)
    print(f"machine: {os.uname().nodename} cpus={os.cpu_count()} shardport {shardport.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
