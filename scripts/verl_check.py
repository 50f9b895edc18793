#!/usr/bin/env python3
"""shardport as verl's checkpoint engine, driven by verl's own code.

An actor process and two rollout processes (spawned): the engines are made
by verl's ``CheckpointEngineRegistry`` after verl's plugin hook
(``import_external_libs("shardport.verl")``) registered ``"shardport"``;
the topology comes from the engine's ``build_topology`` over every
worker's ``prepare()``, as verl's ``CheckpointEngineManager`` builds it;
each step the actor's ``send_weights`` takes the step's tensors, and each
rollout runs verl's ``CheckpointEngineWorker.update_weights`` (its real
method: ``receive_weights``, then the server adapter's ``update_weights``)
with an adapter that keeps what it is given. Every step, every tensor of
every rollout must equal the actor's; a rollout that skips a step takes
the newest version. Prints one line per step and ``ok``.

    python scripts/verl_check.py          # needs verl, torch and shardport

``scripts/verl-suite.sh`` installs verl (``--no-deps``, with the modules
``verl.checkpoint_engine`` imports) into a Python and runs this.
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing as mp
import sys


def state(step: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(step)
    sd = {}
    for i in range(4):
        sd[f"model.layers.{i}.self_attn.qkv_proj.weight"] = torch.randn(384, 128, generator=g)
        sd[f"model.layers.{i}.self_attn.qkv_proj.bias"] = torch.randn(384, generator=g)
        sd[f"model.layers.{i}.input_layernorm.weight"] = torch.randn(128, generator=g).to(torch.bfloat16)
    sd["model.embed_tokens.weight"] = torch.randn(2000, 128, generator=g)
    return sd


def digests(items) -> dict:
    return {k: hashlib.sha256(v.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes()).hexdigest() for k, v in items}


def worker(role: str, rank: int, ctl, out) -> None:
    try:
        import torch  # noqa: F401
        from verl.checkpoint_engine.base import CheckpointEngineRegistry, CheckpointEngineWorker
        from verl.utils.import_utils import import_external_libs

        import_external_libs("shardport.verl")  # verl's hook for third-party backends
        engine = CheckpointEngineRegistry.new("shardport", bucket_size=1 << 20, is_master=(role == "actor" and rank == 0))
        out.put(("meta", role, rank, engine.prepare()))
        kwargs = ctl.get()
        engine.init_process_group(**kwargs)
        out.put(("ready", role, rank, None))

        class Adapter:  # the rollout server's side: keeps what verl hands it
            def __init__(self):
                self.got = None

            async def update_weights(self, weights, global_steps=None, **_kw):
                self.got = [(name, t.clone()) async for name, t in weights]

        adapter = Adapter()
        w = CheckpointEngineWorker.__new__(CheckpointEngineWorker)
        w.checkpoint_engine, w.server_adapter = engine, adapter
        while (step := ctl.get()) is not None:
            if role == "actor":
                asyncio.run(engine.send_weights(iter(state(step).items()), global_steps=step))
                out.put(("sent", role, rank, step))
            else:
                asyncio.run(CheckpointEngineWorker.update_weights.__wrapped__(w, global_steps=step))
                out.put(("got", role, rank, (engine.last_update["version"], digests(adapter.got))))
        out.put(("bye", role, rank, None))
        ctl.get()  # hold the node until the parent says every rollout is done
        engine.close()
    except BaseException as e:
        out.put(("err", role, rank, f"{type(e).__name__}: {e}"))


def main() -> int:
    try:
        from verl.checkpoint_engine.base import CheckpointEngineRegistry
        from verl.utils.import_utils import import_external_libs
    except ImportError as e:
        print(f"verl_check: skipped (verl is not importable: {e})")
        return 0
    import_external_libs("shardport.verl")
    cls = CheckpointEngineRegistry.get("shardport")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    roles = [("actor", 0), ("rollout", 0), ("rollout", 1)]
    ctls = {r: ctx.Queue() for r in roles}
    procs = [ctx.Process(target=worker, args=(*r, ctls[r], out)) for r in roles]
    for p in procs:
        p.start()

    def collect(kind, n):
        got = {}
        while len(got) < n:
            k, role, rank, v = out.get(timeout=300)
            if k == "err":
                raise SystemExit(f"verl_check: {role} {rank} failed: {v}")
            assert k == kind, (k, kind)
            got[(role, rank)] = v
        return got

    meta = collect("meta", 3)
    actor_kw, rollout_kw = cls.build_topology(1, 2, [meta[("actor", 0)], meta[("rollout", 0)], meta[("rollout", 1)]])
    for (role, rank), q in ctls.items():
        kw = actor_kw if role == "actor" else rollout_kw
        q.put({k: v[rank] for k, v in kw.items()})
    collect("ready", 3)
    ok = True
    for step in (1, 2, 3, 5):
        ctls[("actor", 0)].put(step)
        collect("sent", 1)
        # Rollout 1 skips step 2: at step 3 it takes version 3 straight away.
        takers = [r for r in roles[1:] if not (step == 2 and r == ("rollout", 1))]
        for r in takers:
            ctls[r].put(step)
        got = collect("got", len(takers))
        want = digests(state(step).items())
        for r, (version, d) in got.items():
            same = d == want and version == step
            ok &= same
            print(f"step {step}: {r[0]} {r[1]} took version {version}: {len(d)} tensors {'equal' if same else 'DIFFER'}")
    for q in ctls.values():
        q.put(None)
    collect("bye", 3)
    for q in ctls.values():
        q.put(None)
    for p in procs:
        p.join(60)
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
