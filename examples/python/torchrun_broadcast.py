#!/usr/bin/env python3
"""torchrun: rank 0 puts tensors, every rank fetches them by handle.

Run under torchrun (one process per rank, gloo on CPU):

    python -m torch.distributed.run --nproc_per_node=2 examples/python/torchrun_broadcast.py

Rank 0 puts a dict of CPU tensors into its shardport node and sends only the
handles to every rank with `torch.distributed.broadcast_object_list` (the
handles pickle to a few hundred bytes; the tensors never go through gloo).
Every rank, rank 0 included, fetches them (zero-copy views on one machine,
http across machines), checks their bytes against rank 0's CRCs and prints
the transport and the reason. After a barrier rank 0 removes the shards; at
the end rank 0 checks that nothing of the run is left in /dev/shm and prints
`ok` when every rank passed.

Each node takes its address and name from torchrun's environment
(`addr_from="torchrun"`: the local address of the route to MASTER_ADDR, name
`rank<RANK>`; see shardport.env). Across machines the http transport then
serves beyond loopback: give every rank the same token in
`SHARDPORT_TOKEN` (read through `auth-token-env`).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import zlib

import numpy as np
import torch
import torch.distributed as dist

import shardport

#: The environment variable holding the http transport's token, when set.
TOKEN_ENV = "SHARDPORT_TOKEN"


def node_config(prefix: str) -> dict:
    cfg = shardport.default_config()
    for p in cfg["plugin"]:
        if p["name"] == "posix-shm":
            p["config"]["segment-prefix"] = prefix
            p["config"]["pool-size"] = "128MiB"
        if p["name"] == "http" and os.environ.get(TOKEN_ENV):
            p["config"]["auth-token-env"] = TOKEN_ENV
    return cfg


def make_tensors(mib: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    side = max(1, int((mib * (1 << 20) / 4 / 2) ** 0.5))
    return {
        "embed.weight": torch.randn(side, side, generator=g),
        "mlp.weight": torch.randn(side, side, generator=g).to(torch.bfloat16),
        "mlp.bias": torch.randn(side, generator=g),
        "step": torch.tensor([7], dtype=torch.int64),
    }


def crc_bytes(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8))


def crc_tensor(t: torch.Tensor) -> int:
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return crc_bytes(t.numpy())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=2.0, help="tensors to broadcast, MiB")
    ap.add_argument("--prefix", help="segment prefix (default: a random one chosen by rank 0)")
    args = ap.parse_args(argv)
    if args.mib <= 0:
        ap.error("--mib must be > 0")
    if "RANK" not in os.environ:
        ap.error("run me under torchrun: python -m torch.distributed.run --nproc_per_node=2 ...")

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        box = [args.prefix or "sptorch" + secrets.token_hex(4)]
        dist.broadcast_object_list(box, src=0)  # every rank uses rank 0's prefix
        prefix = box[0]
        with shardport.Node(node_config(prefix), addr_from="torchrun") as node:
            if rank == 0:
                tensors = make_tensors(args.mib)
                handles = {name: node.put(t) for name, t in tensors.items()}
                msg = [handles, {name: crc_tensor(t) for name, t in tensors.items()}]
            else:
                msg = [None, None]
            dist.broadcast_object_list(msg, src=0)  # only handles travel
            handles, expect = msg

            good = True
            for name, h in handles.items():
                shard = node.fetch(h)
                t = shard.torch()
                good &= crc_tensor(t) == expect[name] and str(t.dtype) == f"torch.{h.dtype}"
                if name == "embed.weight":
                    first = (shard.transport, shard.mode, shard.reason)
                del t, shard
            print(
                f"rank {rank} ({node.name}): {len(handles)} tensors "
                f"{'checksums match' if good else 'CHECKSUM MISMATCH'}, "
                f"via {first[0]} ({first[1]}): {first[2]}",
                flush=True,
            )
            results = [None] * world
            dist.all_gather_object(results, good)  # also: every rank is done fetching
            if rank == 0:
                removed = node.remove(list(handles.values()))
                good_all = all(results) and removed == len(handles)
        if rank == 0:
            left = sorted(n for n in os.listdir("/dev/shm") if prefix in n)
            print(f"/dev/shm after the run: {len(left)} segment(s) of this run left {left if left else ''}")
            ok = good_all and not left
            print("ok" if ok else "FAILED", flush=True)
            return 0 if ok else 1
        return 0 if good else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
