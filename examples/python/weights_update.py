#!/usr/bin/env python3
"""A trainer updates the weights of N rollout processes in place, step after
step, with shardport.weights, and every rollout's forward pass matches the
trainer's.

The model is a GPT-like stack built in code (random init): with torch, a
``torch.nn`` module (``--gpt2-small``: the 124M-parameter shape, 12 layers
of width 768); without torch, the same parameters as NumPy arrays and a
NumPy forward pass. Each step the trainer changes every parameter,
publishes the state dict as a new version and sends the manifest (bytes)
to every rollout through a queue; each rollout updates its own model in
place (the parameters keep their storage), runs the forward pass on the
step's input and reports a digest of the output, which must equal the
trainer's. The trainer retires a version once every rollout reported
committing a newer one.

    python examples/python/weights_update.py --rollouts 8 --steps 3
    python examples/python/weights_update.py --gpt2-small --rollouts 2
    python examples/python/weights_update.py --http   # every rollout fetches over http

With ``--http`` every node exports and fetches through the http transport
only (loopback here; the path a rollout on another machine takes, with
``relay = "on"`` on the rollouts' nodes for a broadcast).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import secrets
import sys
import time

import numpy as np

import shardport
from shardport import weights


def have_torch() -> bool:
    try:
        import torch  # noqa: F401

        return True
    except ImportError:
        return False


def shapes(width: int, layers: int, vocab: int, ctx: int) -> dict[str, tuple[int, ...]]:
    """The parameters of a GPT-like stack, as a state dict's names and shapes."""
    s: dict[str, tuple[int, ...]] = {"wte.weight": (vocab, width), "wpe.weight": (ctx, width)}
    for i in range(layers):
        p = f"h.{i}."
        s |= {
            p + "ln_1.weight": (width,),
            p + "ln_1.bias": (width,),
            p + "attn.c_attn.weight": (3 * width, width),
            p + "attn.c_attn.bias": (3 * width,),
            p + "attn.c_proj.weight": (width, width),
            p + "attn.c_proj.bias": (width,),
            p + "ln_2.weight": (width,),
            p + "ln_2.bias": (width,),
            p + "mlp.c_fc.weight": (4 * width, width),
            p + "mlp.c_fc.bias": (4 * width,),
            p + "mlp.c_proj.weight": (width, 4 * width),
            p + "mlp.c_proj.bias": (width,),
        }
    return s | {"ln_f.weight": (width,), "ln_f.bias": (width,)}


def build(backend: str, dims: dict, seed: int):
    """The model: a torch module, or a dict of NumPy arrays."""
    rng = np.random.default_rng(seed)
    arrays = {k: (rng.standard_normal(v) * 0.02).astype(np.float32) for k, v in shapes(**dims).items()}
    if backend == "numpy":
        return arrays
    import torch

    class Gpt(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for k, a in arrays.items():
                self.register_parameter(k.replace(".", "_"), torch.nn.Parameter(torch.from_numpy(a.copy())))
            self.names = list(arrays)

        def state_dict(self, *args, **kwargs):  # the dotted names, sharing storage
            return {k: getattr(self, k.replace(".", "_")).detach() for k in self.names}

    return Gpt()


def params(model) -> dict:
    """name -> array view of the parameter (NumPy for either backend)."""
    if isinstance(model, dict):
        return model
    return {k: v.numpy() for k, v in model.state_dict().items()}


def forward(model, tokens: np.ndarray, layers: int) -> np.ndarray:
    """A simple causal-free GPT-like forward pass (layer norms, an attention
    projection and an MLP per layer), the same code for both backends."""
    p = params(model)

    def ln(x, w, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + 1e-5) * w + b

    x = p["wte.weight"][tokens] + p["wpe.weight"][: len(tokens)]
    for i in range(layers):
        q = f"h.{i}."
        h = ln(x, p[q + "ln_1.weight"], p[q + "ln_1.bias"])
        qkv = h @ p[q + "attn.c_attn.weight"].T + p[q + "attn.c_attn.bias"]
        a, k, v = np.split(qkv, 3, axis=-1)
        att = np.exp(a @ k.T / np.sqrt(a.shape[-1]))
        att /= att.sum(-1, keepdims=True)
        x = x + (att @ v) @ p[q + "attn.c_proj.weight"].T + p[q + "attn.c_proj.bias"]
        h = ln(x, p[q + "ln_2.weight"], p[q + "ln_2.bias"])
        h = np.maximum(h @ p[q + "mlp.c_fc.weight"].T + p[q + "mlp.c_fc.bias"], 0)
        x = x + h @ p[q + "mlp.c_proj.weight"].T + p[q + "mlp.c_proj.bias"]
    return ln(x, p["ln_f.weight"], p["ln_f.bias"]) @ p["wte.weight"].T


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def config(prefix: str, http: bool) -> dict:
    cfg = shardport.default_config()
    for p in cfg["plugin"]:
        if p["name"] == "posix-shm":
            p["config"]["segment-prefix"] = prefix
            p["config"]["pool-size"] = "2GiB"
            p["config"]["on-full"] = "spill"
    if http:
        cfg["plugin"] = [p for p in cfg["plugin"] if p["name"] == "http"]
        cfg["put"] = {"storage": "heap"}
        cfg.pop("route", None)
    return cfg


def rollout(rank: int, args, prefix: str, inbox, outbox) -> None:
    """A rollout process: its own model (another random init), updated in
    place from each manifest; reports (rank, version, output digest)."""
    try:
        model = build(args.backend, args.dims, seed=1000 + rank)
        with shardport.Node(config(prefix, args.http)) as node:
            rx = weights.Receiver(node, into=model)
            ptrs = {k: v.ctypes.data for k, v in params(model).items()}
            while (msg := inbox.get()) is not None:
                data, tokens = msg
                report = rx.update(data)
                same_storage = {k: v.ctypes.data for k, v in params(model).items()} == ptrs
                out = forward(model, tokens, args.dims["layers"])
                outbox.put(("ok", rank, rx.version, digest(out), same_storage, report["transports"]))
    except BaseException as e:  # reported to the trainer
        outbox.put(("err", rank, f"{type(e).__name__}: {e}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--gpt2-small", action="store_true", help="the 124M-parameter shape")
    ap.add_argument("--backend", choices=["auto", "torch", "numpy"], default="auto")
    ap.add_argument("--http", action="store_true", help="export and fetch through http only")
    args = ap.parse_args()
    if args.backend == "auto":
        args.backend = "torch" if have_torch() else "numpy"
    args.dims = (
        dict(width=768, layers=12, vocab=50257, ctx=1024)
        if args.gpt2_small
        else dict(width=256, layers=4, vocab=4096, ctx=256)
    )
    prefix = "spweights" + secrets.token_hex(4)
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    inboxes = [ctx.Queue() for _ in range(args.rollouts)]
    procs = [
        ctx.Process(target=rollout, args=(r, args, prefix, inboxes[r], outbox)) for r in range(args.rollouts)
    ]
    for p in procs:
        p.start()
    model = build(args.backend, args.dims, seed=0)
    n_params = sum(a.size for a in params(model).values())
    print(f"model: {args.backend}, {len(params(model))} tensors, {n_params / 1e6:.1f}M parameters")
    ok = True
    with shardport.Node(config(prefix, args.http)) as node, weights.Publisher(node) as pub:
        pub.expect(f"r{r}" for r in range(args.rollouts))
        rng = np.random.default_rng(7)
        for step in range(1, args.steps + 1):
            for a in params(model).values():  # the "optimizer step", in place
                a += rng.standard_normal(a.shape).astype(np.float32) * 0.01
            t = time.perf_counter()
            manifest = pub.publish(model, version=step)
            publish_s = time.perf_counter() - t
            tokens = rng.integers(0, args.dims["vocab"], 16)
            want = digest(forward(model, tokens, args.dims["layers"]))
            data = manifest.to_bytes()
            t = time.perf_counter()
            for q in inboxes:
                q.put((data, tokens))
            replies = [outbox.get(timeout=600) for _ in procs]
            update_s = time.perf_counter() - t
            for rep in replies:
                if rep[0] != "ok":
                    print(f"rollout {rep[1]} failed: {rep[2]}")
                    ok = False
                    continue
                _, rank, version, got, same_storage, transports = rep
                ok &= version == step and got == want and same_storage
                pub.committed(f"r{rank}", version)
            via = replies[0][5] if replies[0][0] == "ok" else {}
            print(
                f"step {step}: {manifest.nbytes / 2**20:.1f} MiB in {manifest.num_buckets} buckets, "
                f"manifest {len(data)} bytes, published in {publish_s * 1e3:.0f} ms, "
                f"{args.rollouts} rollouts updated and ran the forward pass in {update_s * 1e3:.0f} ms (via {via}); "
                f"outputs {'match' if all(r[0] == 'ok' and r[3] == want for r in replies) else 'DIFFER'}; "
                f"versions held {pub.versions}"
            )
    for q in inboxes:
        q.put(None)
    for p in procs:
        p.join(60)
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
