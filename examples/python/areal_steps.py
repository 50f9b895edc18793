#!/usr/bin/env python3
"""AReaL's own RPC workers exchanging tensors through shardport, step after
step, cleaned up by AReaL's own cleanup path.

Two real AReaL RPC servers (`areal.infra.rpc.rpc_server`, one process each):
a producer and a consumer, each switched to shardport's backend by one
constructor (`rtensor.set_backend(ShardportRTensorBackend())`) before the
server starts. This script is the controller, as AReaL's TrainController
is: every step it

1. calls the producer engine's `produce` (`POST /call`): the server turns the
   result tensors into RTensors, whose shards the producer's backend puts in
   its shardport pool;
2. passes those RTensors to the consumer engine's `consume`: the consumer's
   server localizes them, i.e. fetches them through shardport (shared memory
   here), and returns a checksum the controller checks;
3. runs AReaL's cleanup for the step (`RTensor.collect_shards` and
   `RTensor.clear_node`, what the controller's clear path does): the
   controller's backend sends AReaL's `DELETE /data/clear` to the producer;
4. asks the producer for its pool: back at zero bytes after every step.

Needs areal 1.0.4 and torch (the header of scripts/areal-suite.sh lists the
rest); `--areal PATH` puts an AReaL checkout first on every process's path.
Without areal it says why and exits 0.

    PYTHONPATH=PATH-TO-AREAL python examples/python/areal_steps.py --steps 4
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

try:
    import torch
    from areal.api.engine_api import InferenceEngine
except ImportError as e:  # the engines below need both
    torch = None
    InferenceEngine = object
    _MISSING = str(e)
else:
    _MISSING = ""

ROWS, COLS = 8, 4096  # a float32 shard of 128 KiB and an int64 one of 64 KiB


def _payload(step: int) -> dict:
    logits = torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS) + step
    ids = torch.arange(ROWS * 1024, dtype=torch.int64).reshape(ROWS, 1024) * (step + 1)
    return {"logits": logits, "ids": ids}


def _checksum(batch: dict) -> float:
    return float(batch["logits"].double().sum() + batch["ids"].double().sum())


class Producer(InferenceEngine):
    """A worker whose results are tensors (a rollout engine's shape)."""

    @property
    def initialized(self) -> bool:
        return True

    def produce(self, step: int) -> dict:
        return _payload(step)

    def pool(self) -> dict:
        """This worker's shardport pool and backend, after applying the
        deletes AReaL's cleanup sent here."""
        from areal.infra.rpc import rtensor

        be = rtensor.get_backend()
        stats = be.storage_stats()  # reconciles first
        shm = next(p for p in be.node.stats()["plugins"] if p["name"] == "posix-shm")
        return {
            "backend": type(be).__name__,
            "shards": stats["num_tensors"],
            "pool_bytes_used": shm["stats"]["pool_bytes_used"],
        }


class Consumer(InferenceEngine):
    """A worker that receives tensors (a trainer's shape)."""

    @property
    def initialized(self) -> bool:
        return True

    def consume(self, batch: dict) -> dict:
        from areal.infra.rpc import rtensor

        return {"checksum": _checksum(batch), "backend": type(rtensor.get_backend()).__name__}


# The worker processes: AReaL's RPC server with shardport's backend set first.
LAUNCH = (
    "import sys\n"
    "from areal.infra.rpc import rtensor\n"
    "from shardport.areal import ShardportRTensorBackend\n"
    "rtensor.set_backend(ShardportRTensorBackend())\n"
    "from areal.infra.rpc.rpc_server import main\n"
    "sys.argv[0] = 'rpc_server'\n"
    "main()\n"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    import requests

    r = requests.post(url, json=body, timeout=120)
    if r.status_code != 200:
        raise RuntimeError(f"{url}: {r.status_code} {r.text[:500]}")
    return r.json()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--areal", type=Path, default=None, help="an AReaL checkout to import areal from")
    args = ap.parse_args()
    if _MISSING:
        print(f"areal_steps: skipped ({_MISSING}; needs areal and torch)")
        return 0
    import asyncio

    import requests
    from areal.infra.rpc import rtensor
    from areal.infra.rpc.rtensor import RTensor
    from areal.infra.rpc.serialization import deserialize_value, serialize_value

    from shardport.areal import ShardportRTensorBackend

    rtensor.set_backend(ShardportRTensorBackend())  # the controller's side
    here = Path(__file__).resolve().parent
    path = [str(here)] + ([str(args.areal.resolve())] if args.areal else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")]))
    workers, procs = {}, []
    try:
        for role in ("producer", "consumer"):
            port = _free_port()
            cmd = [sys.executable, "-c", LAUNCH, "--host", "127.0.0.1", "--port", str(port),
                   "--experiment-name", "shardport-areal-steps", "--trial-name", "t0",
                   "--role", role, "--worker-index", "0"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            workers[role] = f"127.0.0.1:{port}"
        for role, addr in workers.items():
            for _ in range(240):
                try:
                    if requests.get(f"http://{addr}/health", timeout=1).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.25)
            else:
                raise RuntimeError(f"the {role} worker at {addr} did not start")
            _post(f"http://{addr}/create_engine", {
                "engine": f"areal_steps.{role.capitalize()}",
                "engine_name": role,
                "init_args": serialize_value([]),
                "init_kwargs": serialize_value({}),
            })
        for step in range(args.steps):
            out = _post(f"http://{workers['producer']}/call", {
                "method": "produce", "engine_name": "producer",
                "args": serialize_value([step]), "kwargs": serialize_value({}),
            })
            batch = deserialize_value(out["result"])
            assert all(isinstance(v, RTensor) for v in batch.values()), batch
            held = _post(f"http://{workers['producer']}/call", {
                "method": "pool", "engine_name": "producer",
                "args": serialize_value([]), "kwargs": serialize_value({}),
            })["result"]
            res = _post(f"http://{workers['consumer']}/call", {
                "method": "consume", "engine_name": "consumer",
                "args": serialize_value([batch]), "kwargs": serialize_value({}),
            })["result"]
            want = _checksum(_payload(step))
            ok = abs(res["checksum"] - want) <= 1e-6 * abs(want)
            # AReaL's cleanup of the step, as its controller runs it.
            for node_addr, sids in RTensor.collect_shards(batch).items():
                asyncio.run(RTensor.clear_node(node_addr, sids))
            after = _post(f"http://{workers['producer']}/call", {
                "method": "pool", "engine_name": "producer",
                "args": serialize_value([]), "kwargs": serialize_value({}),
            })["result"]
            print(f"step {step}: {len(batch)} shards via {held['backend']}, pool during the step "
                  f"{held['pool_bytes_used']} bytes; consumer ({res['backend']}) checksum "
                  f"{'matches' if ok else 'DIFFERS'}; after AReaL's cleanup {after['shards']} shards, "
                  f"pool {after['pool_bytes_used']} bytes")
            if not ok or after["shards"] or after["pool_bytes_used"]:
                return 1
        print("ok")
        return 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
