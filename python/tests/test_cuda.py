"""CUDA torch tensors through the cuda-ipc transport, across processes.

Skipped with the reason printed where torch or a CUDA GPU is missing (CI
machines here have neither); run on a GPU machine by
`.device-carry/run-gpu-checks.sh` (scripts/gpu-carry.sh packs these tests).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import shardport

from helpers import config, digest, in_child

torch = pytest.importorskip("torch", reason="torch is not installed (optional dependency; too heavy for CI)")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

DTYPES = ["float32", "bfloat16", "float16", "int64", "uint8", "bool"]


def make(dtype: str, n: int = 4099) -> "torch.Tensor":
    """A CUDA tensor with distinct bytes (odd length: not a multiple of any
    page or vector width)."""
    g = torch.Generator().manual_seed(n)
    x = torch.randint(0, 2**31 - 1, (n,), generator=g, dtype=torch.int64)
    td = getattr(torch, dtype)
    if dtype == "bool":
        t = (x % 2).to(torch.bool)
    elif td.is_floating_point:
        t = (x.to(torch.float64) / 7.0).to(td)
    else:
        t = (x % 251).to(td)
    return t.reshape(-1, 1).cuda()


def host_digest(t: "torch.Tensor") -> str:
    c = t.detach().cpu().contiguous()
    if c.dtype in (torch.bfloat16, torch.float16):
        c = c.view(torch.int16)
    return digest(c.numpy())


def child_fetch_cuda(prefix: str, handle_bytes: list[bytes], out) -> None:
    """Child process (spawned): fetch each GPU shard to the host and report
    (digest, shape, transport) or the exception."""
    try:
        with shardport.Node(config(prefix)) as node:
            res = []
            for b in handle_bytes:
                s = node.fetch(shardport.Handle.from_bytes(b), mode="copy")
                a = np.asarray(s).view(np.uint8)
                res.append((digest(a), tuple(s.shape), s.transport))
                del a, s
            out.put(("ok", res))
    except BaseException as e:  # reported to the parent
        out.put(("err", f"{type(e).__name__}: {e}"))


def child_view_cuda(prefix: str, handle_bytes: list[bytes], out) -> None:
    """Child process (spawned): view each GPU shard in place with
    fetch_cuda, take it as a torch tensor, and report (digest, shape,
    transport, device, dlpack device); the tensor must outlive the
    CudaShard (the capsule holds the lease)."""
    try:
        import torch as t

        with shardport.Node(config(prefix)) as node:
            res = []
            for b in handle_bytes:
                s = node.fetch_cuda(shardport.Handle.from_bytes(b))
                info = (s.transport, s.device, s.__dlpack_device__(), s.nbytes, s.dtype)
                x = t.from_dlpack(s) if len(res) % 2 == 0 else s.torch()
                del s  # the tensor keeps the lease
                t.cuda.synchronize()
                res.append((host_digest(x), tuple(x.shape), str(x.device)) + info)
                del x
            out.put(("ok", res))
    except BaseException as e:  # reported to the parent
        out.put(("err", f"{type(e).__name__}: {e}"))


def child_put_disabled(prefix: str, out) -> None:
    """Child process: cuda-ipc disabled by its environment variable and no
    http (which also moves GPU shards, staged); a CUDA put must fail naming
    why."""
    os.environ["SHARDPORT_CUDA_IPC_DISABLE"] = "disabled by test_cuda"
    try:
        import torch as t

        cfg = config(prefix)
        cfg["plugin"] = [p for p in cfg["plugin"] if p["name"] != "http"]
        cfg.pop("route", None)  # the library config routes to http
        with shardport.Node(cfg) as node:
            node.put(t.ones(16, device="cuda"))
        out.put(("ok", "put succeeded"))
    except shardport.TransportUnavailableError as e:
        out.put(("unavailable", str(e)))
    except BaseException as e:
        out.put(("err", f"{type(e).__name__}: {e}"))


def test_cuda_tensors_cross_processes_through_cuda_ipc(node, prefix, spawn):
    ts = [make(d) for d in DTYPES]
    hs = [node.put(t) for t in ts]
    for h, d in zip(hs, DTYPES):
        assert h.dtype == d and h.device == "cuda:0", h
    status, res = in_child(spawn, child_fetch_cuda, prefix, [h.to_bytes() for h in hs])
    assert status == "ok", res
    for t, (dig, shape, transport) in zip(ts, res):
        assert transport == "cuda-ipc"
        assert shape == tuple(t.shape)
        assert dig == host_digest(t)
    assert node.remove(hs) == len(hs)


def test_cuda_shards_are_viewed_in_place_in_another_process(node, prefix, spawn):
    ts = [make(d) for d in DTYPES]
    hs = [node.put(t) for t in ts]
    status, res = in_child(spawn, child_view_cuda, prefix, [h.to_bytes() for h in hs])
    assert status == "ok", res
    for t, d, (dig, shape, device, transport, index, dl_dev, nbytes, dtype) in zip(ts, DTYPES, res):
        assert (transport, index, dl_dev, device) == ("cuda-ipc", 0, (2, 0), "cuda:0")
        assert (shape, nbytes, dtype) == (tuple(t.shape), t.numel() * t.element_size(), d)
        assert dig == host_digest(t)
    assert node.remove(hs) == len(hs)


def test_a_process_fetching_its_own_cuda_shard_gets_a_copy_through_http(node):
    # CUDA cannot open a process's own IPC handle: no view, a copy (said so).
    t = make("float32")
    h = node.put(t)
    s = node.fetch_cuda(h)
    assert (s.owned, s.transport) == (True, "http")
    assert host_digest(torch.from_dlpack(s)) == host_digest(t)
    host = node.fetch(h, mode="copy")
    assert host.transport == "http"
    node.remove(h)


def test_cuda_put_without_the_transport_names_the_reason(prefix, spawn):
    status, msg = in_child(spawn, child_put_disabled, prefix)
    assert status == "unavailable", msg
    assert "disabled by test_cuda" in msg


def plugin_stat(node: shardport.Node, name: str) -> int:
    """One counter or gauge of the cuda-ipc plugin (0 when absent)."""
    for p in node.stats()["plugins"]:
        if p["name"] == "cuda-ipc":
            return int(p["stats"].get(name, 0))
    return 0


def child_owner(prefix: str, alloc_conf: str, out, ctl) -> None:
    """Child process (spawned with PYTORCH_CUDA_ALLOC_CONF=alloc_conf, set
    before its first CUDA allocation): puts tensors of several sizes, one a
    slice at an offset inside a larger tensor, reports their handles and
    digests and what cuda-ipc did, and stays alive until told to go."""
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    try:
        import torch as t

        with shardport.Node(config(prefix)) as node:
            big = make("float32", (48 << 20) // 4 + 17)  # spans several 20 MiB segments
            ts = [make("uint8", 4099), big, big[1000:], make("bfloat16", (3 << 20) + 5)]
            t.cuda.synchronize()
            hs = [node.put(x) for x in ts]
            out.put(
                (
                    "ok",
                    (
                        [h.to_bytes() for h in hs],
                        [host_digest(x) for x in ts],
                        plugin_stat(node, "exports_vmm_total"),
                        plugin_stat(node, "exports_staged_total"),
                    ),
                )
            )
            ctl.get(timeout=120)
    except BaseException as e:  # reported to the parent
        out.put(("err", f"{type(e).__name__}: {e}"))


@pytest.mark.parametrize(
    "alloc_conf,kind",
    [("", "legacy"), ("expandable_segments:True", "vmm"), ("backend:cudaMallocAsync", "staged")],
)
def test_tensors_from_every_torch_allocator_are_viewed_in_another_process(node, prefix, spawn, alloc_conf, kind):
    out, ctl = spawn.Queue(), spawn.Queue()
    saved = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf  # inherited by the child at its start
    try:
        p = spawn.Process(target=child_owner, args=(prefix, alloc_conf, out, ctl))
        p.start()
    finally:
        if saved is None:
            os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        else:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = saved
    try:
        status, res = out.get(timeout=120)
        assert status == "ok", res
        handles, digests, vmm, staged = res
        expected = {"legacy": (0, 0), "vmm": (len(handles), 0), "staged": (0, len(handles))}[kind]
        assert (vmm, staged) == expected, f"{alloc_conf!r}: exports_vmm={vmm} exports_staged={staged}"
        for b, want in zip(handles, digests):
            s = node.fetch_cuda(shardport.Handle.from_bytes(b))
            assert s.transport == "cuda-ipc"
            x = torch.from_dlpack(s)
            torch.cuda.synchronize()
            assert host_digest(x) == want, alloc_conf
            # A second view of the same shard (the mapping cached) reads the same.
            y = torch.from_dlpack(node.fetch_cuda(shardport.Handle.from_bytes(b)))
            assert host_digest(y) == want
            del x, y, s
    finally:
        ctl.put(1)
        p.join(60)
    assert p.exitcode == 0


def child_fetch_remote(prefix: str, handle_bytes: list[bytes], out) -> None:
    """Child process (spawned) standing for a consumer on another machine:
    its config loads no cuda-ipc, so each GPU shard arrives through http
    into device memory it owns; reports (digest, transport, owned, device)
    and checks the copy is writable."""
    try:
        import torch as t

        cfg = config(prefix)
        cfg["plugin"] = [p for p in cfg["plugin"] if p["name"] != "cuda-ipc"]
        with shardport.Node(cfg) as node:
            res = []
            for b in handle_bytes:
                s = node.fetch_cuda(shardport.Handle.from_bytes(b))
                x = t.from_dlpack(s)
                t.cuda.synchronize()
                res.append((host_digest(x), s.transport, s.owned, str(x.device)))
                x.view(t.uint8).fill_(1)  # our own memory: writable
                t.cuda.synchronize()
                del x, s
            out.put(("ok", res))
    except BaseException as e:  # reported to the parent
        out.put(("err", f"{type(e).__name__}: {e}"))


def test_a_gpu_shard_reaches_a_consumer_without_cuda_ipc_as_its_own_cuda_tensor(node, prefix, spawn):
    ts = [make("float32", (5 << 20) // 4 + 3), make("bfloat16"), make("uint8", 1)]
    hs = [node.put(x) for x in ts]
    status, res = in_child(spawn, child_fetch_remote, prefix, [h.to_bytes() for h in hs])
    assert status == "ok", res
    for x, (dig, transport, owned, device) in zip(ts, res):
        assert (transport, owned, device) == ("http", True, "cuda:0")
        assert dig == host_digest(x)
    # The owner's tensors are untouched by the consumer's writes.
    assert [host_digest(x) for x in ts] == [r[0] for r in res]
    assert node.remove(hs) == len(hs)
