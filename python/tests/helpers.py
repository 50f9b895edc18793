"""Shared by the tests and the child processes they spawn (importable by name)."""

from __future__ import annotations

import hashlib
import os
import secrets

import numpy as np

import shardport


def in_child(spawn, target, *args):
    """Runs ``target(*args, out)`` in a spawned process and returns what it
    put on ``out`` (a ``(status, result)`` pair by the children's habit)."""
    out = spawn.Queue()
    p = spawn.Process(target=target, args=(*args, out))
    p.start()
    reported = out.get(timeout=120)
    p.join(60)
    return reported


def unique_prefix() -> str:
    """A shared-memory segment prefix no other process uses, so a test can
    check that nothing it created is left in /dev/shm."""
    return "sptest" + secrets.token_hex(4)


def config(prefix: str, **put: str) -> dict:
    cfg = shardport.default_config()
    for p in cfg["plugin"]:
        if p["name"] == "posix-shm":
            p["config"]["segment-prefix"] = prefix
            p["config"]["pool-size"] = "64MiB"
    cfg["put"].update(put)
    return cfg


def leftovers(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if prefix in n)


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).view(np.uint8).tobytes()).hexdigest()


def child_fetch(prefix: str, handle_bytes: list[bytes], mode: str, out) -> None:
    """Child process: fetch every handle, report (dtype, shape, digest,
    transport, readonly) or the exception."""
    try:
        with shardport.Node(config(prefix)) as node:
            res = []
            for b in handle_bytes:
                h = shardport.Handle.from_bytes(b)
                s = node.fetch(h, mode=mode)
                a = np.asarray(s)
                res.append((str(a.dtype), a.shape, digest(a), s.transport, a.flags.writeable))
                del a, s
            out.put(("ok", res))
    except BaseException as e:  # reported to the parent
        out.put(("err", f"{type(e).__name__}: {e}"))


def child_fetch_pickled(prefix: str, q_in, q_out) -> None:
    """Child process: handles arrive pickled through a queue."""
    try:
        with shardport.Node(config(prefix)) as node:
            while True:
                h = q_in.get()
                if h is None:
                    break
                s = node.fetch(h)
                q_out.put(("ok", h.id, digest(np.asarray(s)), s.transport, s.reason))
    except BaseException as e:
        q_out.put(("err", f"{type(e).__name__}: {e}"))


def mapping_of(addr: int) -> str:
    """The file (or ``[anon]`` and the like) mapped at ``addr`` in this
    process, from /proc/self/maps."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return parts[5].strip() if len(parts) > 5 else ""
    raise AssertionError(f"address {addr:#x} is not mapped")
