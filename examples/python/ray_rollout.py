#!/usr/bin/env python3
"""A Ray trainer actor shares its weights with N rollout actors through shardport.

A local Ray cluster (`ray.init()`, 2 CPUs, a small object store, no
dashboard) runs one trainer actor and N rollout actors, each a separate
process with its own shardport Node. Every step the trainer puts a dict of
NumPy arrays (the weights) and the driver passes only the handles (small,
picklable) to the rollout actors as call arguments; each actor fetches the
arrays zero-copy (views into the trainer's shared-memory pool), checks their
bytes against the trainer's CRCs and reports the transport and the reason it
was chosen. At step end the trainer removes the shards. After
`ray.shutdown()` nothing of this run is left in /dev/shm.

    python examples/python/ray_rollout.py --actors 2 --steps 2
    python examples/python/ray_rollout.py --kill rollout   # + a step where a rollout actor dies
    python examples/python/ray_rollout.py --kill trainer   # + a step where the owner dies
    python examples/python/ray_rollout.py --http           # the path across machines

`--http`: the trainer exports through the http transport only (heap
storage), so every actor fetches a copy over http with the token, as an
actor on another machine of the Ray cluster would.
`--kill rollout`: one more step in which a rollout actor is killed
(`ray.kill`) while it holds views of the step's shards; the others finish,
the trainer removes the shards and closes as usual.
`--kill trainer`: one more step in which the trainer (the owner of every
shard) is killed while the rollout actors hold views: they still read the
right bytes (their mappings outlive the owner), and its pool segment, which
nobody unlinked, is swept by the next node that starts with the same
segment prefix (`sweep-on-start`), here the driver's after `ray.shutdown()`.

Exit status 0 and a last line `ok` when every check passed. Prints a reason
and exits 2 when Ray is not installed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
import zlib

import numpy as np

import shardport

try:
    import ray
except ImportError as e:  # pragma: no cover - depends on the environment
    ray = None
    _RAY_IMPORT_ERROR = e

#: Shared-memory pool of each node; the weights of a step are a few MiB.
POOL_SIZE = "128MiB"
#: How long a rollout actor holds its views in a `--kill` step before giving
#: up waiting to be killed (the driver kills it within a second).
HOLD_S = 60.0
#: Whether the fetches are expected zero-copy (not with --http).
ZERO_COPY = True


def node_config(prefix: str, name: str, token: str, http_only: bool = False) -> dict:
    """The default config with a segment prefix of this run (so the /dev/shm
    check sees only this run), a smaller pool, and a token for the http
    transport: with `addr_from="ray"` it serves on the Ray node's IP, not
    loopback, and must not serve shard bytes to anyone who asks."""
    cfg = shardport.default_config()
    cfg["node"]["name"] = name
    for p in cfg["plugin"]:
        if p["name"] == "posix-shm":
            p["config"]["segment-prefix"] = prefix
            p["config"]["pool-size"] = POOL_SIZE
        if p["name"] == "http":
            p["config"]["auth-token"] = token
    if http_only:  # what an actor on another machine gets
        cfg["put"]["export-to"] = ["http"]
        cfg["put"]["storage"] = "heap"  # not the shm pool, which would export too
    return cfg


def make_weights(step: int, mib: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    side = max(1, int((mib * (1 << 20) / 4 / 2) ** 0.5))
    return {
        "embed.weight": rng.standard_normal((side, side), dtype=np.float32),
        "mlp.weight": rng.standard_normal((side, side), dtype=np.float32),
        "mlp.bias": rng.standard_normal(side, dtype=np.float32),
        "step": np.array([step], dtype=np.int64),
    }


def crc(a: np.ndarray) -> int:
    """CRC32 of the array's bytes, read in place (no copy)."""
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8))


class Trainer:
    """Owns the weights: puts them each step, removes them at step end."""

    def __init__(self, prefix: str, token: str, mib: float, http_only: bool) -> None:
        cfg = node_config(prefix, "trainer", token, http_only)
        self.node = shardport.Node(cfg, addr_from="ray")
        self.mib = mib
        self.handles: dict[str, shardport.Handle] = {}

    def pid(self) -> int:
        return os.getpid()

    def put_step(self, step: int) -> tuple[dict, dict]:
        """Puts the step's weights; returns (handles, expected CRCs)."""
        weights = make_weights(step, self.mib)
        self.handles = {name: self.node.put(a) for name, a in weights.items()}
        return self.handles, {name: crc(a) for name, a in weights.items()}

    def end_step(self) -> int:
        """Removes the step's shards; returns how many were removed."""
        n = self.node.remove(list(self.handles.values()))
        self.handles = {}
        return n

    def close(self) -> dict:
        stats = self.node.stats()
        self.node.close()
        return stats


class Rollout:
    """Fetches the weights by handle, zero-copy, and checks them."""

    def __init__(self, rank: int, prefix: str, token: str, mode: str) -> None:
        self.rank = rank
        self.mode = mode
        self.node = shardport.Node(node_config(prefix, f"rollout{rank}", token), addr_from="ray")
        self.held: list = []

    def pid(self) -> int:
        return os.getpid()

    def _fetch(self, handles: dict) -> dict:
        report = {}
        for name, h in handles.items():
            shard = self.node.fetch(h, mode=self.mode)
            a = shard.numpy()
            report[name] = {
                "crc": crc(a),
                "transport": shard.transport,
                "reason": shard.reason,
                "mode": shard.mode,
                "zero_copy": shard.mode == "view" and not a.flags.owndata,
            }
            self.held.append((shard, a))
        return report

    def fetch_step(self, step: int, handles: dict) -> tuple[int, int, dict]:
        """Fetches every handle, checks nothing here, releases the views."""
        try:
            return self.rank, step, self._fetch(handles)
        finally:
            self.held.clear()  # the leases end with the last references

    def fetch_and_hold(self, step: int, handles: dict) -> tuple[int, int, dict]:
        """Fetches, keeps the views, waits (to be killed, or for the owner to
        die), then re-checks the bytes it still holds and releases them."""
        try:
            report = self._fetch(handles)
            deadline = time.monotonic() + HOLD_S
            while not getattr(self, "_release", False) and time.monotonic() < deadline:
                time.sleep(0.05)
            for name, (_, a) in zip(report, self.held):
                report[name]["crc_after"] = crc(a)
            return self.rank, step, report
        finally:
            self.held.clear()
            self._release = False

    def holding(self) -> int:
        return len(self.held)

    def release(self) -> None:
        self._release = True

    def close(self) -> None:
        self.held.clear()
        self.node.close()


def check(report_of: tuple, expect: dict, step: int, key: str = "crc", note: str = "") -> bool:
    rank, s, report = report_of
    good = s == step and set(report) == set(expect)
    good &= all(r[key] == expect[n] and r["zero_copy"] == ZERO_COPY for n, r in report.items())
    r = report["embed.weight"]
    print(
        f"step {step} actor {rank}: {len(report)} arrays "
        f"{'checksums match' if good else 'CHECKSUM MISMATCH'}"
        f"{note}, "
        f"via {r['transport']} ({r['mode']}, zero-copy={r['zero_copy']}): {r['reason']}"
    )
    return good


def wait_until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (killed, not yet reaped by its parent) is dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actors", type=int, default=2, help="rollout actors")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--mib", type=float, default=4.0, help="weights per step, MiB")
    ap.add_argument(
        "--kill",
        choices=["none", "rollout", "trainer"],
        default="none",
        help="add a step in which this actor is killed with ray.kill",
    )
    ap.add_argument("--prefix", help="segment prefix of this run (default: a random one)")
    ap.add_argument(
        "--http",
        action="store_true",
        help="the trainer exports through http only, as to actors on other machines",
    )
    args = ap.parse_args(argv)
    if args.actors < 1 or args.steps < 0 or args.mib <= 0:
        ap.error("--actors must be >= 1, --steps >= 0, --mib > 0")
    if ray is None:
        print(f"skipped: ray is not importable ({_RAY_IMPORT_ERROR})")
        return 2

    global ZERO_COPY
    ZERO_COPY = not args.http  # http delivers copies
    prefix = args.prefix or "spray" + secrets.token_hex(4)
    # In a real job: the same secret in every process's environment
    # (`auth-token-env`); here the driver makes one and hands it to the actors.
    token = secrets.token_hex(16)
    ok = True
    trainer = None
    ray.init(
        address="local",  # a new local cluster, never one RAY_ADDRESS names
        num_cpus=2,
        object_store_memory=100 << 20,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        # Actors take no CPU slot, so N of them fit on a 2-CPU cluster.
        trainer = ray.remote(num_cpus=0)(Trainer).remote(prefix, token, args.mib, args.http)
        rollouts = [
            ray.remote(num_cpus=0, max_concurrency=2)(Rollout).remote(
                r, prefix, token, "copy" if args.http else "view"
            )
            for r in range(args.actors)
        ]
        for step in range(args.steps):
            handles, expect = ray.get(trainer.put_step.remote(step))
            if step == 0:
                h = handles["embed.weight"]
                print(f"trainer: {len(handles)} arrays put, owner {h.owner}, exports {h.transports}")
            # Only handles cross Ray: call arguments, pickled.
            reports = ray.get([a.fetch_step.remote(step, handles) for a in rollouts])
            for rep in reports:
                ok &= check(rep, expect, step)
            removed = ray.get(trainer.end_step.remote())
            ok &= removed == len(handles)

        if args.kill != "none":
            step = args.steps
            handles, expect = ray.get(trainer.put_step.remote(step))
            calls = [a.fetch_and_hold.remote(step, handles) for a in rollouts]
            wait_until(
                lambda: all(ray.get([a.holding.remote() for a in rollouts])),
                120,
                "the rollout actors to hold their views",
            )
            if args.kill == "rollout":
                victim, survivors = rollouts[0], list(zip(rollouts[1:], calls[1:]))
                ray.kill(victim, no_restart=True)
                try:
                    ray.get(calls[0], timeout=120)
                    print(f"step {step} actor 0: NOT KILLED")
                    ok = False
                except ray.exceptions.RayActorError as e:
                    print(f"step {step} actor 0: killed mid-step ({type(e).__name__})")
                for a, _ in survivors:
                    a.release.remote()
                for rep in ray.get([c for _, c in survivors], timeout=120):
                    ok &= check(rep, expect, step) and check(
                        rep, expect, step, "crc_after", " (re-read after actor 0 died)"
                    )
                removed = ray.get(trainer.end_step.remote())
                print(f"step {step}: trainer removed {removed} shards")
                ok &= removed == len(handles)
                rollouts = rollouts[1:]
            else:
                trainer_pid = ray.get(trainer.pid.remote())
                ray.kill(trainer, no_restart=True)
                wait_until(lambda: not pid_alive(trainer_pid), 60, "the trainer to exit")
                print(f"step {step} trainer: killed mid-step")
                for a in rollouts:
                    a.release.remote()
                for rep in ray.get(calls, timeout=120):
                    ok &= check(rep, expect, step, "crc_after", " (re-read after the owner died)")
                trainer = None

        for a in rollouts:
            ray.get(a.close.remote())
        if trainer is not None:
            stats = ray.get(trainer.close.remote())
            trainer = None
            print(f"trainer closed: {stats['bytes_owned']} bytes still owned")
            ok &= stats["bytes_owned"] == 0
    finally:
        # On an error above, close the trainer's node before Ray kills its
        # process (ray.shutdown() runs no close()); best effort.
        if trainer is not None and args.kill != "trainer":
            try:
                ray.get(trainer.close.remote(), timeout=30)
            except Exception as e:  # the error above is the one to see
                print(f"closing the trainer after an error failed too: {e}", file=sys.stderr)
        ray.shutdown()

    left = sorted(n for n in os.listdir("/dev/shm") if prefix in n)
    if args.kill == "trainer":
        # The dead owner's pool is still there: nobody unlinked it. The next
        # node with this prefix sweeps segments whose owner is gone.
        print(f"/dev/shm after ray.shutdown(): {len(left)} segment(s) of the dead trainer")
        with shardport.Node(node_config(prefix, "sweeper", token)):
            pass
        left = sorted(n for n in os.listdir("/dev/shm") if prefix in n)
        print(f"/dev/shm after a node with the same prefix started: {len(left)} segment(s) left {left if left else ''}")
    else:
        print(f"/dev/shm after ray.shutdown(): {len(left)} segment(s) of this run left {left if left else ''}")
    ok &= not left
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
