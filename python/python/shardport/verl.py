"""shardport as a checkpoint engine of verl (the weight transfer from actor
to rollout workers), over :mod:`shardport.weights`.

verl moves weights through a ``CheckpointEngine`` chosen by name
(``rollout.checkpoint_engine.backend``); importing this module registers
``"shardport"``. Point verl at it with its own plugin hook::

    rollout:
      checkpoint_engine:
        backend: shardport
        custom_backend_module: shardport.verl
        engine_kwargs:
          shardport: {config: /etc/shardport/rollout.toml, bind: "0.0.0.0:7090"}

How it moves: the master actor publishes each step's weights as a
:class:`~shardport.weights.Publisher` version (buckets over the node's
transports: shared memory on one machine, http with relays across
machines) and serves the manifest from a small endpoint (``bind``); every
rollout worker waits for the step's manifest, takes the version into
buffers of its own (verified against the actor's BLAKE3 hashes, whole or
not at all) and yields them to verl's server adapter, then reports the
commit, so the actor retires the previous version once every rollout has
the new one. A rollout that missed steps takes the newest.

Keyword arguments (``engine_kwargs.shardport``): ``config`` (the node's
config: a path, TOML text or dict; default: the library config),
``bind`` (the manifest endpoint of the master actor, ``host:port``;
default ``127.0.0.1:0``), ``advertise`` (the address rollouts reach it at;
default: ``bind``'s), ``token`` (a bearer token the endpoint requires;
default ``$SHARDPORT_TOKEN`` if set), ``wait`` (seconds a rollout waits for
a step's manifest; default 600), ``keep_versions`` and ``grace`` (the
publisher's). Tensors on a GPU are copied to the host before they are
published and come out as CPU tensors.
"""

from __future__ import annotations

import hmac
import http.server
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Any, AsyncGenerator, Generator, Optional

from . import Node, errors, weights

try:
    import torch
    from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
except ImportError as e:  # pragma: no cover - the module is for verl's processes
    raise ImportError(f"shardport.verl needs verl and torch: {e}") from e

__all__ = ["ShardportCheckpointEngine"]

#: Longest manifest the endpoint accepts or serves (a manifest of a
#: million tensors is far smaller).
MAX_MANIFEST = 64 << 20


class _Board:
    """The master actor's manifests by version, and who committed what."""

    def __init__(self, publisher: weights.Publisher) -> None:
        self.publisher = publisher
        self.cond = threading.Condition()
        self.newest: Optional[tuple[int, bytes]] = None

    def put(self, version: int, data: bytes) -> None:
        with self.cond:
            self.newest = (version, data)
            self.cond.notify_all()

    def wait(self, version: int, seconds: float) -> Optional[tuple[int, bytes]]:
        """The newest manifest of at least ``version``, waiting up to ``seconds``."""
        end = time.monotonic() + seconds
        with self.cond:
            while self.newest is None or self.newest[0] < version:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(min(left, 1.0))
            return self.newest


def _handler(board: _Board, token: Optional[str], wait_cap: float) -> type:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 30  # seconds a request's head and body may take

        def log_message(self, *_args: Any) -> None:  # quiet
            return

        def _authorized(self) -> bool:
            if token is None:
                return True
            got = self.headers.get("authorization", "")
            return hmac.compare_digest(got.encode(), f"Bearer {token}".encode())

        def _reply(self, code: int, body: bytes = b"") -> None:
            self.send_response(code)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # GET /v1/manifest/<version>
            if not self._authorized():
                return self._reply(403, b"bad token")
            parts = self.path.split("/")
            if len(parts) != 4 or parts[1:3] != ["v1", "manifest"] or not parts[3].isdigit():
                return self._reply(404, b"not found")
            got = board.wait(int(parts[3]), wait_cap)
            if got is None:
                return self._reply(404, b"no such version yet")
            self.send_response(200)
            self.send_header("x-version", str(got[0]))
            self.send_header("content-length", str(len(got[1])))
            self.end_headers()
            self.wfile.write(got[1])

        def do_POST(self) -> None:  # POST /v1/committed/<receiver>/<version>
            if not self._authorized():
                return self._reply(403, b"bad token")
            parts = self.path.split("/")
            if len(parts) != 5 or parts[1:3] != ["v1", "committed"] or not parts[4].isdigit():
                return self._reply(404, b"not found")
            board.publisher.committed(parts[3][:128], int(parts[4]))
            return self._reply(204)

    return Handler


@CheckpointEngineRegistry.register("shardport")
class ShardportCheckpointEngine(CheckpointEngine):
    """verl's ``CheckpointEngine`` over shardport (see the module docs)."""

    def __init__(
        self,
        bucket_size: int,
        is_master: bool = False,
        *,
        config: Any = None,
        bind: str = "127.0.0.1:0",
        advertise: Optional[str] = None,
        token: Optional[str] = None,
        wait: float = 600.0,
        keep_versions: int = 2,
        grace: float = 60.0,
        **_ignored: Any,
    ) -> None:
        self.bucket_size = int(bucket_size)
        self.is_master = bool(is_master)
        self.node = Node(config)
        self.bind, self.advertise = bind, advertise
        self.token = token if token is not None else os.environ.get("SHARDPORT_TOKEN")
        self.wait = float(wait)
        self.keep_versions, self.grace = int(keep_versions), float(grace)
        self.role: Optional[str] = None
        self.rank = 0
        self.master_url: Optional[str] = None
        self._publisher: Optional[weights.Publisher] = None
        self._server: Optional[http.server.ThreadingHTTPServer] = None
        self._board: Optional[_Board] = None
        self._receiver: Optional[weights.Receiver] = None
        self._buffers: dict[str, Any] = {}
        self._step = 0
        self.last_update: Optional[dict] = None

    # -- topology -----------------------------------------------------------

    def prepare(self) -> dict[str, Any]:
        """The master actor starts its publisher and manifest endpoint and
        returns the endpoint's address; every other worker returns nothing."""
        if not self.is_master or self._server is not None:
            return {"manifest_url": self.master_url} if self._server else {}
        self._publisher = weights.Publisher(
            self.node, bucket_size=self.bucket_size, keep_versions=self.keep_versions, grace=self.grace
        )
        self._board = _Board(self._publisher)
        host, _, port = self.bind.rpartition(":")
        server = http.server.ThreadingHTTPServer((host, int(port)), _handler(self._board, self.token, self.wait))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="shardport-verl-manifests", daemon=True).start()
        self._server = server
        shown = self.advertise or f"{host}:{server.server_address[1]}"
        self.master_url = f"http://{shown}"
        return {"manifest_url": self.master_url}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Every worker learns the master actor's endpoint; actors are
        ranks 0.. of the actor group, rollouts ranks 0.. of theirs."""
        urls = [m.get("manifest_url") for m in metadata if m and m.get("manifest_url")]
        if not urls:
            raise errors.InvalidInputError("no master actor: no worker's prepare() returned a manifest endpoint")
        actor = {
            "role": ["actor"] * actor_wg_world_size,
            "rank": list(range(actor_wg_world_size)),
            "master_url": [urls[0]] * actor_wg_world_size,
        }
        rollout = {
            "role": ["rollout"] * rollout_world_size,
            "rank": list(range(rollout_world_size)),
            "master_url": [urls[0]] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, role: str, rank: int, master_url: str, **_ignored: Any) -> None:
        self.role, self.rank, self.master_url = role, int(rank), master_url

    def finalize(self) -> None:
        """Nothing per step: versions are retired as rollouts commit."""

    def close(self) -> None:
        """Stops the endpoint, retires every version and closes the node."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._publisher is not None:
            self._publisher.close()
        self.node.close()

    # -- the transfer -------------------------------------------------------

    async def send_weights(
        self,
        weights_iter: Generator[tuple[str, torch.Tensor], None, None],
        global_steps: Optional[int] = None,
    ) -> None:
        """The master actor publishes the step's tensors (the others only
        drain the generator, whose collectives every rank must join)."""
        state: dict[str, torch.Tensor] = {}
        for name, t in weights_iter:
            if not self.is_master:
                continue
            t = t.detach()
            if hasattr(t, "full_tensor"):
                t = t.full_tensor()
            state[name] = t.cpu().contiguous()
        if not self.is_master:
            return
        if self._publisher is None or self._board is None:
            self.prepare()
        self._step = int(global_steps) if global_steps is not None else self._step + 1
        manifest = self._publisher.publish(state, version=self._step)
        self._board.put(self._step, manifest.to_bytes())

    def _get(self, url: str, method: str = "GET") -> tuple[int, bytes, dict]:
        req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
        if self.token is not None:
            req.add_header("authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.wait + 30) as r:
                return r.status, r.read(MAX_MANIFEST + 1), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read(4096), {}

    async def receive_weights(
        self, global_steps: Optional[int] = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Waits for the step's manifest (or a newer one), takes it whole
        into this worker's buffers, reports the commit, yields the tensors."""
        if self.master_url is None:
            raise errors.InvalidInputError("receive_weights before init_process_group: no master endpoint")
        want = int(global_steps) if global_steps is not None else self._step + 1
        status, body, _ = self._get(f"{self.master_url}/v1/manifest/{want}")
        if status != 200:
            raise errors.TransportError(
                f"manifest of step {want} from {self.master_url}: HTTP {status}: {body[:200]!r}"
            )
        if len(body) > MAX_MANIFEST:
            raise errors.BadManifestError(f"manifest from {self.master_url} is over {MAX_MANIFEST} bytes")
        manifest = weights.Manifest.from_bytes(body)
        if self._receiver is None:
            self._receiver = weights.Receiver(self.node)
        self._ensure_buffers(manifest)
        self.last_update = self._receiver.update(manifest, into=self._buffers)
        self._step = manifest.version
        self._get(f"{self.master_url}/v1/committed/rollout-{self.rank}/{manifest.version}", "POST")
        for name, _dtype, _shape in manifest.tensors:
            yield name, self._buffers[name]

    def _ensure_buffers(self, manifest: weights.Manifest) -> None:
        """Buffers of the manifest's names, dtypes and shapes, made once and
        reused while they match (an update writes into them in place)."""
        want = {name: (dtype, tuple(shape)) for name, dtype, shape in manifest.tensors}
        have = {k: (str(v.dtype).removeprefix("torch."), tuple(v.shape)) for k, v in self._buffers.items()}
        if have == want:
            return
        self._buffers = {
            name: torch.empty(shape, dtype=_torch_dtype(dtype)) for name, (dtype, shape) in want.items()
        }


def _torch_dtype(name: str) -> "torch.dtype":
    aliases = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}
    name = aliases.get(name, name)
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise errors.InvalidInputError(f"no torch dtype for {name!r}")
    return dt
