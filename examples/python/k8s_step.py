#!/usr/bin/env python3
"""One trainer -> rollout step, as the pods of deploy/k8s/ run it.

    python examples/python/k8s_step.py trainer      # serves handles on --port
    python examples/python/k8s_step.py rollout --trainer http://HOST:9000

Both roles read the node config from `--config` (the ConfigMap's
`shardport.toml`, mounted at /etc/shardport) and take their address and name
from the environment (`SHARDPORT_ADDR_FROM`, set to `k8s` in the manifests:
`POD_IP`, `POD_NAME`; see shardport.env). The http transport's token comes
from the environment variable the config names (`auth-token-env`, filled
from a Secret).

trainer: puts a dict of NumPy arrays and serves, on one small HTTP port,
`GET /handles` (the handles as JSON and the CRCs of the arrays), `POST /done`
(a rollout's report) and `GET /metrics` (the node's Prometheus text, for the
scrape annotations). After `--rollouts` reports it removes the shards and
exits: 0 when every report matched.
rollout: fetches the handles from the trainer, fetches every array through
shardport (shared memory when it shares /dev/shm with the trainer, http
otherwise), checks the CRCs, posts its report and exits: 0 when they
matched. Prints the transport and the reason either way.

The handle channel is this example's own (plain HTTP, no token: handles are
addresses, not data); a real job uses its own RPC.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.request
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

import shardport

#: The application port: handles, reports and /metrics (containerPort `app`).
DEFAULT_PORT = 9000
DEFAULT_CONFIG = "/etc/shardport/shardport.toml"


def crc(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8))


def make_weights(mib: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    side = max(1, int((mib * (1 << 20) / 4 / 2) ** 0.5))
    return {
        "embed.weight": rng.standard_normal((side, side), dtype=np.float32),
        "mlp.weight": rng.standard_normal((side, side), dtype=np.float32),
        "step": np.array([1], dtype=np.int64),
    }


def metrics_server(node: shardport.Node, bind: str, port: int) -> ThreadingHTTPServer:
    """Serves the node's Prometheus text at GET /metrics (rollout role)."""

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/metrics"
            data = node.metrics().encode() if ok else b"not found\n"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer((bind, port), Metrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def trainer(args: argparse.Namespace) -> int:
    reports: list[dict] = []
    done = threading.Event()
    with shardport.Node(args.config) as node:
        weights = make_weights(args.mib)
        handles = {name: node.put(a) for name, a in weights.items()}
        body = json.dumps(
            {
                "handles": {n: h.to_json() for n, h in handles.items()},
                "crc": {n: crc(a) for n, a in weights.items()},
            }
        ).encode()
        print(f"trainer {node.name}: {len(handles)} arrays put, owner {next(iter(handles.values())).owner}", flush=True)

        class App(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/handles":
                    self._send(200, body, "application/json")
                elif self.path == "/metrics":
                    self._send(200, node.metrics().encode(), "text/plain; version=0.0.4")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def do_POST(self):
                if self.path != "/done":
                    return self._send(404, b"not found\n", "text/plain")
                n = int(self.headers.get("Content-Length") or 0)
                if not 0 < n <= 1 << 20:
                    return self._send(400, b"bad length\n", "text/plain")
                reports.append(json.loads(self.rfile.read(n)))
                self._send(200, b"{}", "application/json")
                if len(reports) >= args.rollouts:
                    done.set()

            def _send(self, code: int, data: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        srv = ThreadingHTTPServer((args.bind, args.port), App)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        print(f"trainer: serving handles on {args.bind}:{srv.server_address[1]}", flush=True)
        finished = done.wait(args.timeout)
        srv.shutdown()
        removed = node.remove(list(handles.values()))
    ok = finished and removed == len(handles) and all(r.get("ok") for r in reports)
    for r in reports:
        print(f"trainer: report from {r.get('name')}: ok={r.get('ok')} via {r.get('transport')}", flush=True)
    if not finished:
        print(f"trainer: {len(reports)} of {args.rollouts} reports after {args.timeout}s", flush=True)
    print("ok" if ok else "FAILED", flush=True)
    return 0 if ok else 1


def rollout(args: argparse.Namespace) -> int:
    base = args.trainer.rstrip("/")
    deadline = time.monotonic() + args.timeout
    while True:  # the trainer pod may start later than this one
        try:
            with urllib.request.urlopen(f"{base}/handles", timeout=10) as r:
                msg = json.loads(r.read())
            break
        except OSError as e:
            if time.monotonic() > deadline:
                print(f"rollout: trainer at {base} not reachable: {e}", flush=True)
                return 1
            time.sleep(1)
    with shardport.Node(args.config) as node:
        srv = metrics_server(node, args.bind, args.port)
        good, first = True, None
        try:
            for name, text in msg["handles"].items():
                shard = node.fetch(shardport.Handle.from_json(text))
                good &= crc(shard.numpy()) == msg["crc"][name]
                first = first or (shard.transport, shard.mode, shard.reason)
                del shard
            print(
                f"rollout {node.name}: {len(msg['handles'])} arrays "
                f"{'checksums match' if good else 'CHECKSUM MISMATCH'}, "
                f"via {first[0]} ({first[1]}): {first[2]}",
                flush=True,
            )
            report = {"name": node.name, "ok": good, "transport": first[0]}
        except shardport.ShardportError as e:
            # Tell the trainer, so it ends the step instead of waiting.
            print(f"rollout {node.name}: fetch failed: {type(e).__name__}: {e}", flush=True)
            good = False
            report = {"name": node.name, "ok": False, "transport": None, "error": str(e)}
        srv.shutdown()
    report = json.dumps(report).encode()
    req = urllib.request.Request(f"{base}/done", data=report, method="POST")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30):
        pass
    return 0 if good else 1


def on_sigterm(signum, frame) -> None:
    """Kubernetes stops a pod with SIGTERM: leave through the `with` blocks,
    so the node closes and unlinks its segments (exit status 143)."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, on_sigterm)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["trainer", "rollout"])
    ap.add_argument("--config", default=os.environ.get("SHARDPORT_CONFIG", DEFAULT_CONFIG))
    ap.add_argument("--bind", default="0.0.0.0", help="the app port's address")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help="the app port (rollout: /metrics only)")
    ap.add_argument("--rollouts", type=int, default=1, help="trainer: reports to wait for")
    ap.add_argument("--trainer", default=os.environ.get("TRAINER_URL", f"http://127.0.0.1:{DEFAULT_PORT}"))
    ap.add_argument("--mib", type=float, default=4.0)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the other side")
    args = ap.parse_args(argv)
    if not 0 <= args.port <= 65535 or args.rollouts < 1 or args.mib <= 0:
        ap.error("--port must be in 0..=65535, --rollouts >= 1, --mib > 0")
    return trainer(args) if args.role == "trainer" else rollout(args)


if __name__ == "__main__":
    sys.exit(main())
