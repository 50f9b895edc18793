#!/usr/bin/env python3
"""shardport's Python CUDA view (``Node.fetch_cuda`` + ``torch.from_dlpack``),
measured for the same sizes and with the same columns as
scripts/bench_torch_ipc.py, for comparison in the same run.

For each size a producer process puts a CUDA tensor into its shardport node
(cuda-ipc exports it) and sends the handle's bytes; the consumer (this
process) measures:
  first_open_us   fetch_cuda + torch.from_dlpack of a new shard (the owner's
                  IPC handle opened here)
  cached_p50_us   the same again while the first tensor is alive (cuda-ipc
                  keeps the opened mapping)
  fetch_p50_us    Node.fetch_cuda alone (no torch tensor made), cached
  d2d_fetch_gbs   dst.copy_(tensor) + synchronize: device-to-device copy
                  out of the producer's memory
  local_dtod_gbs  dst.copy_(local) between two consumer tensors, same size
Both processes initialise CUDA before anything is timed. Without torch, a
CUDA GPU or the cuda-ipc transport it prints why and exits 0.

Usage: python3 scripts/bench_fetch_cuda.py [iters]
       (shardport importable: the venv, or PYTHONPATH=.device-carry/py)
"""
import sys
import time

SIZES = [4096, 1 << 20, 16 << 20, 64 << 20, 256 << 20]


def skip(why):
    print(f"bench_fetch_cuda: skipped: {why}")
    sys.exit(0)


try:
    import torch
    import torch.multiprocessing as mp
except ImportError as e:  # pragma: no cover - depends on the machine
    skip(f"PyTorch is not installed ({e})")

import shardport


def producer(q_handles, q_ctl):
    torch.zeros(1, device="cuda:0")  # create the context before any timing
    with shardport.Node() as node:
        if "cuda-ipc" not in node.transports:
            q_handles.put(("skip", "the cuda-ipc transport is not available"))
            return
        q_handles.put(("ready", None))
        for size in SIZES:
            t = torch.full((size,), 7, dtype=torch.uint8, device="cuda:0")
            torch.cuda.synchronize()
            h = node.put(t)
            q_handles.put(("handle", h.to_bytes()))
            q_ctl.get()  # the consumer released every view of it
            node.remove(h)
            del t
        q_ctl.get()  # stay alive until the consumer is done


def gbs(nbytes, seconds):
    return nbytes / seconds / 1e9


def view(node, h):
    """fetch_cuda + from_dlpack, timed."""
    t0 = time.perf_counter()
    x = torch.from_dlpack(node.fetch_cuda(h))
    return x, (time.perf_counter() - t0) * 1e6


def consumer(q_handles, q_ctl, iters):
    torch.zeros(1, device="cuda:0")
    status, why = q_handles.get(timeout=120)
    if status == "skip":
        skip(why)
    print("size_bytes first_open_us cached_p50_us fetch_p50_us d2d_fetch_gbs local_dtod_gbs")
    with shardport.Node() as node:
        for size in SIZES:
            status, b = q_handles.get(timeout=120)
            assert status == "handle"
            h = shardport.Handle.from_bytes(b)
            first_x, first = view(node, h)
            assert first_x.numel() == size and int(first_x[0]) == 7
            dst = torch.empty_like(first_x)
            cached = []
            d2d_total = 0.0
            for _ in range(iters):
                x, us = view(node, h)
                cached.append(us)
                t1 = time.perf_counter()
                dst.copy_(x)
                torch.cuda.synchronize()
                d2d_total += time.perf_counter() - t1
                del x
            fetch_only = []
            for _ in range(iters):
                t0 = time.perf_counter()
                s = node.fetch_cuda(h)
                fetch_only.append((time.perf_counter() - t0) * 1e6)
                del s
            fetch_only.sort()
            del first_x
            q_ctl.put(1)
            src = torch.empty_like(dst)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            for _ in range(iters):
                dst.copy_(src)
                torch.cuda.synchronize()
            local = time.perf_counter() - t1
            cached.sort()
            print(
                f"{size} {first:.1f} {cached[len(cached) // 2]:.1f} {fetch_only[len(fetch_only) // 2]:.1f} "
                f"{gbs(size * iters, d2d_total):.2f} {gbs(size * iters, local):.2f}",
                flush=True,
            )
    q_ctl.put(1)


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    if iters < 1:
        sys.exit("iters must be at least 1")
    if not torch.cuda.is_available():
        skip("no CUDA GPU visible to PyTorch")
    mp.set_start_method("spawn")
    q_handles, q_ctl = mp.Queue(), mp.Queue()
    p = mp.Process(target=producer, args=(q_handles, q_ctl))
    p.start()
    try:
        consumer(q_handles, q_ctl, iters)
    finally:
        p.join(timeout=60)
        if p.is_alive():
            p.terminate()
    if p.exitcode not in (0, None):
        sys.exit(f"producer exited with {p.exitcode}")


if __name__ == "__main__":
    main()
