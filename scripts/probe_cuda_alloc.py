#!/usr/bin/env python3
"""What the CUDA driver says about the memory each PyTorch allocator hands
out, and whether it can be shared with another process: a diagnostic for
cuda-ipc's allocation kinds (run on a GPU machine; prints why and exits 0
without torch or a GPU).

For each allocator setting (the default caching allocator, expandable
segments, cudaMallocAsync) a child process allocates a 64 MiB tensor and
prints the pointer attributes (legacy-IPC capable, allowed handle types,
memory pool, range), the VMM chunks under the tensor
(cuMemGetAddressRange walked chunk by chunk, cuMemRetainAllocationHandle,
the allocation properties' requested handle types) and tries
cuMemExportToShareableHandle(POSIX_FD) for each chunk. Where that works,
the file descriptors go to a second process over a Unix socket
(SCM_RIGHTS), which imports, maps them into one reserved range and reads
the bytes back; the script says whether they match.

Usage: python3 scripts/probe_cuda_alloc.py
"""
import ctypes
import os
import socket
import subprocess
import sys

MIB = 1 << 20
SIZE = 64 * MIB


def cu():
    lib = ctypes.CDLL("libcuda.so.1")
    assert lib.cuInit(0) == 0
    return lib


def attr(lib, kind, ptr, width=8):
    buf = ctypes.create_string_buffer(width)
    rc = lib.cuPointerGetAttribute(buf, kind, ctypes.c_uint64(ptr))
    if rc != 0:
        return f"err{rc}"
    return int.from_bytes(buf.raw[:width], "little")


def chunks(lib, ptr, size):
    """(base, size) of each mapping under [ptr, ptr+size)."""
    out = []
    addr = ptr
    while addr < ptr + size:
        base, length = ctypes.c_uint64(), ctypes.c_size_t()
        rc = lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(length), ctypes.c_uint64(addr))
        if rc != 0:
            out.append(("err", rc))
            break
        out.append((base.value, length.value))
        addr = base.value + length.value
    return out


def export_chunks(lib, ptr, size):
    fds, sizes, offset0 = [], [], None
    for base, length in chunks(lib, ptr, size):
        if base == "err":
            print(f"    cuMemGetAddressRange failed: {length}")
            return None
        if offset0 is None:
            offset0 = ptr - base
        h = ctypes.c_uint64()
        rc = lib.cuMemRetainAllocationHandle(ctypes.byref(h), ctypes.c_void_p(base))
        if rc != 0:
            print(f"    chunk {base:#x}+{length}: cuMemRetainAllocationHandle -> {rc}")
            return None
        prop = ctypes.create_string_buffer(64)
        rc = lib.cuMemGetAllocationPropertiesFromHandle(prop, h)
        ints = [int.from_bytes(prop.raw[i : i + 4], "little") for i in range(0, 16, 4)]
        fd = ctypes.c_int(-1)
        rc2 = lib.cuMemExportToShareableHandle(ctypes.byref(fd), h, 1, ctypes.c_ulonglong(0))
        gran = ctypes.c_size_t()
        rc3 = lib.cuMemGetAllocationGranularity(ctypes.byref(gran), prop, 0)
        print(
            f"    chunk {base:#x}+{length}: props rc={rc} type={ints[0]} handle_types={ints[1]} "
            f"loc=({ints[2]},{ints[3]}) export rc={rc2} fd={fd.value} granularity rc={rc3} {gran.value}"
        )
        lib.cuMemRelease(h)
        if rc2 != 0:
            return None
        fds.append(fd.value)
        sizes.append(length)
    return fds, sizes, offset0


def importer(sock_fd):
    """Second process: receive fds, map them contiguously, read bytes."""
    s = socket.socket(fileno=sock_fd)
    msg, fds, _, _ = socket.recv_fds(s, 4096, 64)
    sizes = [int(x) for x in msg.decode().split(",")[1:]]
    offset0 = int(msg.decode().split(",")[0])
    lib = cu()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    lib.cuDeviceGet(ctypes.byref(dev), 0)
    lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    lib.cuCtxSetCurrent(ctx)
    total = sum(sizes)
    va = ctypes.c_uint64()
    rc = lib.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(total), ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_ulonglong(0))
    print(f"    importer: reserve rc={rc} va={va.value:#x} total={total}")
    off = 0
    for fd, length in zip(fds, sizes):
        h = ctypes.c_uint64()
        rc1 = lib.cuMemImportFromShareableHandle(ctypes.byref(h), ctypes.c_void_p(fd), 1)
        rc2 = lib.cuMemMap(ctypes.c_uint64(va.value + off), ctypes.c_size_t(length), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0))
        lib.cuMemRelease(h)
        os.close(fd)
        if rc1 or rc2:
            print(f"    importer: import rc={rc1} map rc={rc2}")
            return
        off += length
    desc = (ctypes.c_int * 3)(1, 0, 3)  # location DEVICE id 0, READWRITE
    rc = lib.cuMemSetAccess(ctypes.c_uint64(va.value), ctypes.c_size_t(total), desc, ctypes.c_size_t(1))
    host = ctypes.create_string_buffer(SIZE)
    rc2 = lib.cuMemcpyDtoH_v2(host, ctypes.c_uint64(va.value + offset0), ctypes.c_size_t(SIZE))
    ok = rc == 0 and rc2 == 0 and host.raw[:4] == b"\x07" * 4 and host.raw[-4:] == b"\x07" * 4
    print(f"    importer: setaccess rc={rc} copy rc={rc2} bytes match: {ok}")


def owner(conf):
    import torch

    torch.zeros(1, device="cuda:0")
    t = torch.full((SIZE,), 7, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    lib = cu()
    p = t.data_ptr()
    print(f"  {conf or 'default'}: ptr {p:#x}")
    for name, kind in [("legacy_ipc", 10), ("allowed_handle_types", 14), ("mempool", 17), ("is_managed", 8), ("buffer_id", 7), ("range_start", 11), ("range_size", 12), ("mapped", 13)]:
        print(f"    {name}: {attr(lib, kind, p)}")
    print(f"    chunks: {[(hex(b) if b != 'err' else b, n) for b, n in chunks(lib, p, SIZE)]}")
    legacy = bytes(64)
    h = ctypes.create_string_buffer(64)
    base = chunks(lib, p, SIZE)[0][0]
    print(f"    cuIpcGetMemHandle(base): {lib.cuIpcGetMemHandle(h, ctypes.c_uint64(base)) if base != 'err' else 'n/a'}")
    got = export_chunks(lib, p, SIZE)
    if got is None:
        print("    not exportable as POSIX fds")
        return
    fds, sizes, offset0 = got
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = subprocess.Popen([sys.executable, __file__, "--import", str(b.fileno())], pass_fds=[b.fileno()])
    b.close()
    socket.send_fds(a, [(",".join([str(offset0)] + [str(s) for s in sizes])).encode()], fds)
    child.wait(timeout=60)
    del legacy


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--import":
        importer(int(sys.argv[2]))
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--owner":
        owner(sys.argv[2])
        return
    try:
        import torch
    except ImportError as e:
        print(f"probe_cuda_alloc: skipped: no torch ({e})")
        return
    if not torch.cuda.is_available():
        print("probe_cuda_alloc: skipped: no CUDA GPU visible to PyTorch")
        return
    for conf in ["", "expandable_segments:True", "backend:cudaMallocAsync"]:
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        subprocess.run([sys.executable, __file__, "--owner", conf], env=env, timeout=120)


if __name__ == "__main__":
    main()
