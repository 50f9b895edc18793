#!/usr/bin/env python3
"""PyTorch's own CUDA IPC sharing (torch.multiprocessing), measured for the
same sizes as scripts/bench_cuda_ipc.sh, for comparison in the same run.

For each size the producer process allocates a CUDA tensor and sends it
through a torch.multiprocessing queue (PyTorch sends a cudaIpcMemHandle of
the storage's allocation plus an offset and an IPC event); the consumer
measures:
  first_open_us   queue.get() of a new tensor (handle opened in the consumer)
  cached_p50_us   queue.get() of the same tensor again (PyTorch caches the
                  opened storage per handle in the consumer)
  d2d_fetch_gbs   dst.copy_(received) + synchronize: device-to-device copy
                  out of the producer's memory
  local_dtod_gbs  dst.copy_(local) between two consumer tensors, same size
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


def producer(q_tensors, q_ctl, iters):
    for size in SIZES:
        t = torch.full((size,), 7, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        for _ in range(iters + 1):
            q_tensors.put(t)
            q_ctl.get()  # the consumer is done with this send
        del t
    q_tensors.put(None)


def gbs(nbytes, seconds):
    return nbytes / seconds / 1e9


def consumer(q_tensors, q_ctl, iters):
    print("size_bytes first_open_us cached_p50_us d2d_fetch_gbs local_dtod_gbs")
    for size in SIZES:
        t0 = time.perf_counter()
        x = q_tensors.get()
        first = (time.perf_counter() - t0) * 1e6
        assert x.numel() == size and int(x[0]) == 7
        dst = torch.empty_like(x)
        del x
        q_ctl.put(1)
        cached = []
        d2d_total = 0.0
        for _ in range(iters):
            t0 = time.perf_counter()
            x = q_tensors.get()
            cached.append((time.perf_counter() - t0) * 1e6)
            t1 = time.perf_counter()
            dst.copy_(x)
            torch.cuda.synchronize()
            d2d_total += time.perf_counter() - t1
            del x
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
            f"{gbs(size * iters, d2d_total):.2f} {gbs(size * iters, local):.2f}"
        )
    assert q_tensors.get() is None


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    if not torch.cuda.is_available():
        skip("no CUDA GPU visible to PyTorch")
    mp.set_start_method("spawn")
    q_tensors, q_ctl = mp.Queue(), mp.Queue()
    p = mp.Process(target=producer, args=(q_tensors, q_ctl, iters))
    p.start()
    consumer(q_tensors, q_ctl, iters)
    p.join()


if __name__ == "__main__":
    main()
