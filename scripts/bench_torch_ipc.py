#!/usr/bin/env python3
"""PyTorch's own CUDA IPC sharing (torch.multiprocessing), measured for the
same sizes as scripts/bench_cuda_ipc.sh, for comparison in the same run.

For each size the producer process allocates a CUDA tensor and sends it
through a torch.multiprocessing queue (PyTorch sends a cudaIpcMemHandle of
the storage's allocation plus an offset and an IPC event); the consumer
measures:
  first_open_us   queue.get() of a new tensor (handle opened in the consumer)
  cached_p50_us   queue.get() of the same tensor again while the first one
                  is still alive (PyTorch's consumer keeps an opened storage
                  only while a tensor references it, so the first is kept)
  d2d_fetch_gbs   dst.copy_(received) + synchronize: device-to-device copy
                  out of the producer's memory
  local_dtod_gbs  dst.copy_(local) between two consumer tensors, same size,
                  synchronized after each copy like the Rust bench
Both processes initialise CUDA before anything is timed, and each get is
timed only once the producer has sent (a control message), so the figures
hold the consumer's own cost, not the peer's start-up.
Without torch or a CUDA GPU it prints why and exits 0.

Usage: python3 scripts/bench_torch_ipc.py [iters]
"""
import sys
import time

SIZES = [4096, 1 << 20, 16 << 20, 64 << 20, 256 << 20]


def skip(why):
    print(f"bench_torch_ipc: skipped: {why}")
    sys.exit(0)


try:
    import torch
    import torch.multiprocessing as mp
except ImportError as e:  # pragma: no cover - depends on the machine
    skip(f"PyTorch is not installed ({e})")


def producer(q_tensors, q_sent, q_ctl, iters):
    torch.cuda.init()
    torch.zeros(1, device="cuda:0")  # create the context before any timing
    q_sent.put("ready")
    for size in SIZES:
        t = torch.full((size,), 7, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        for _ in range(iters + 1):
            q_ctl.get()  # the consumer is ready to time the next get
            q_tensors.put(t)
            q_sent.put(1)
        q_ctl.get()  # the consumer released every received tensor
        del t
    q_tensors.put(None)
    # Stay alive until the consumer is done: a producer that exits while a
    # consumer still maps its memory makes PyTorch warn (and leak).
    q_ctl.get()


def gbs(nbytes, seconds):
    return nbytes / seconds / 1e9


def timed_get(q_tensors, q_sent, q_ctl):
    """Asks for the next send, waits until it was sent, then times the get
    (unpickling: the IPC handle open, or the cache hit, and the event)."""
    q_ctl.put(1)
    q_sent.get()
    t0 = time.perf_counter()
    x = q_tensors.get()
    return x, (time.perf_counter() - t0) * 1e6


def consumer(q_tensors, q_sent, q_ctl, iters):
    torch.cuda.init()
    torch.zeros(1, device="cuda:0")  # create the context before any timing
    assert q_sent.get() == "ready"
    print("size_bytes first_open_us cached_p50_us d2d_fetch_gbs local_dtod_gbs")
    for size in SIZES:
        first_x, first = timed_get(q_tensors, q_sent, q_ctl)
        assert first_x.numel() == size and int(first_x[0]) == 7
        dst = torch.empty_like(first_x)
        cached = []
        d2d_total = 0.0
        for _ in range(iters):
            x, us = timed_get(q_tensors, q_sent, q_ctl)
            cached.append(us)
            t1 = time.perf_counter()
            dst.copy_(x)
            torch.cuda.synchronize()
            d2d_total += time.perf_counter() - t1
            del x
        del first_x  # the opened storage closes with its last tensor
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
            f"{size} {first:.1f} {cached[len(cached) // 2]:.1f} "
            f"{gbs(size * iters, d2d_total):.2f} {gbs(size * iters, local):.2f}",
            flush=True,
        )
    assert q_tensors.get() is None
    q_ctl.put(1)


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    if iters < 1:
        sys.exit("iters must be at least 1")
    if not torch.cuda.is_available():
        skip("no CUDA GPU visible to PyTorch")
    # CUDA tensors can be shared only with spawned (or forkserver) children.
    mp.set_start_method("spawn")
    q_tensors, q_sent, q_ctl = mp.Queue(), mp.Queue(), mp.Queue()
    p = mp.Process(target=producer, args=(q_tensors, q_sent, q_ctl, iters))
    p.start()
    try:
        consumer(q_tensors, q_sent, q_ctl, iters)
    finally:
        p.join(timeout=60)
        if p.is_alive():
            p.terminate()
    if p.exitcode != 0:
        sys.exit(f"producer exited with {p.exitcode}")


if __name__ == "__main__":
    main()
