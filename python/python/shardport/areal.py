"""A drop-in for AReaL's RTensor storage backend, over shardport.

AReaL (``areal.infra.rpc.rtensor``) keeps a worker's result tensors in a
process-global dict and serves them over HTTP as base64 JSON; its backend
has ``store(tensor) -> shard_id``, ``fetch(shards) -> [tensor]`` and
``async delete(node_addr, shard_ids)``. :class:`ShardportRTensorBackend` has
the same surface, so a job switches by changing one constructor::

    from areal.infra.rpc import rtensor
    from shardport.areal import ShardportRTensorBackend

    rtensor.set_backend(ShardportRTensorBackend())   # was HttpRTensorBackend()

Shard ids are strings (the shard's handle, base64): they ride in
``TensorShardInfo`` and AReaL's JSON serialization unchanged. Tensors in,
tensors out: torch tensors come back as torch tensors, NumPy arrays as NumPy
arrays, every dtype bit-exact (bfloat16 stays bfloat16; uint32 is not
reinterpreted), shape and dtype preserved. On the same machine fetches go
through shared memory; across machines through shardport's http transport.

Ids that are not shardport's (AReaL's own uuids: shards a worker stored with
AReaL's ``rtensor.store`` or ``PUT /data/<id>``) are fetched and deleted
through AReaL's own ``HttpRTensorBackend`` (the ``delegate``), so a job can
switch backends while shards of both kinds are in flight. Failures are
:class:`ShardportRTensorError`, a ``RuntimeError`` (what AReaL's callers
catch) with the shardport error as its ``__cause__``.
"""

from __future__ import annotations

import base64
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from . import Handle, Node
from .errors import BadHandleError, ShardportError

#: Prefix of shard ids made by this adapter; the letter after it says what
#: to return (``t`` torch, ``n`` NumPy).
ID_PREFIX = "sp1"


class ShardportRTensorError(RuntimeError):
    """A failure of the adapter: a ``RuntimeError``, as AReaL's own backend
    raises, so AReaL's callers catch it; the shardport error (a
    :class:`~shardport.ShardportError` subclass naming what went wrong) is
    its ``__cause__``."""


def is_shardport_id(shard_id: Any) -> bool:
    """Whether ``shard_id`` (an id or a ``TensorShardInfo``) was made by this
    adapter (the others are AReaL's own)."""
    sid = getattr(shard_id, "shard_id", shard_id)
    return isinstance(sid, str) and sid.startswith(ID_PREFIX) and sid[4:5] == ":"


def encode_id(handle: Handle, kind: str = "n") -> str:
    """The shard id string of a handle (``kind``: ``t`` torch, ``n`` NumPy)."""
    return f"{ID_PREFIX}{kind}:" + base64.urlsafe_b64encode(handle.to_bytes()).decode("ascii")


def decode_id(shard_id: Any) -> tuple[Handle, str]:
    """The handle and kind in a shard id (raises :class:`BadHandleError`)."""
    sid = getattr(shard_id, "shard_id", shard_id)  # a TensorShardInfo or the id
    if not isinstance(sid, str) or not sid.startswith(ID_PREFIX) or sid[4:5] != ":":
        raise BadHandleError(f"not a shardport shard id: {str(sid)[:40]!r}")
    try:
        raw = base64.urlsafe_b64decode(sid[5:])
    except ValueError as e:
        raise BadHandleError(f"shard id is not base64: {e}") from None
    return Handle.from_bytes(raw), sid[3]


class ShardportRTensorBackend:
    """AReaL's RTensor storage backend surface over a shardport :class:`Node`.

    ``node``: share an existing node (default: a new one with ``config``).
    ``mode``: ``"copy"`` (default) returns private, writable tensors like
    AReaL's HTTP backend; ``"view"`` returns zero-copy ones (no copy at all
    on one machine): torch tensors over private copy-on-write views of the
    owner's memory (writable; a write copies the touched pages into that
    tensor alone), NumPy arrays read-only.
    ``max_shards_per_request``: largest batch per fetch call (AReaL's knob).
    ``delegate``: the backend for ids that are not shardport's (default:
    AReaL's ``HttpRTensorBackend``, made when first needed).
    """

    def __init__(
        self,
        max_shards_per_request: int = 32,
        *,
        node: Optional[Node] = None,
        config: Any = None,
        mode: str = "copy",
        delegate: Any = None,
    ) -> None:
        if mode not in ("copy", "view"):
            raise ValueError(f'mode must be "copy" or "view", not {mode!r}')
        self.max_shards_per_request = max(1, int(max_shards_per_request))
        self.mode = mode
        self._own_node = node is None
        self.node = node if node is not None else Node(config)
        self._bytes: dict[str, int] = {}
        self._delegate = delegate

    def delegate(self) -> Any:
        """The backend serving ids that are not shardport's: the one given to
        the constructor, or AReaL's ``HttpRTensorBackend`` (same
        ``max_shards_per_request``). Raises :class:`ShardportRTensorError`
        when AReaL is not importable."""
        if self._delegate is None:
            try:
                from areal.infra.rpc.rtensor import HttpRTensorBackend
            except ImportError as e:
                raise ShardportRTensorError(
                    "a shard id that is not shardport's needs AReaL's own backend, "
                    f"and areal is not importable here: {e}"
                ) from e
            self._delegate = HttpRTensorBackend(max_shards_per_request=self.max_shards_per_request)
        return self._delegate

    # -- owner side ---------------------------------------------------------

    def store(self, tensor: Any) -> str:
        """Stores a tensor (torch CPU/CUDA or NumPy) and returns its shard id."""
        kind = "n" if isinstance(tensor, np.ndarray) else "t"
        h = self.node.put(tensor)
        sid = encode_id(h, kind)
        self._bytes[sid] = h.nbytes
        return sid

    def remove(self, shard_ids: Iterable[Any]) -> int:
        """Removes shards this process stores; unknown ids are ignored.
        Returns how many were removed."""
        hs, sids = [], []
        for s in shard_ids:
            sid = getattr(s, "shard_id", s)
            try:
                hs.append(decode_id(sid)[0])
                sids.append(sid)
            except BadHandleError:
                continue
        n = self.node.remove(hs) if hs else 0
        for sid in sids:
            self._bytes.pop(sid, None)
        return n

    async def delete(self, node_addr: str, shard_ids: Sequence[Any]) -> None:
        """AReaL's ``delete``: removes the shards. shardport shards are
        removed where this process owns them (ids owned elsewhere are
        ignored: a delete that reaches the owner from another process is not
        built yet); AReaL's own ids go to the delegate's ``delete``, which
        reaches their owner over AReaL's HTTP path."""
        ours = [s for s in shard_ids if is_shardport_id(s)]
        theirs = [s for s in shard_ids if not is_shardport_id(s)]
        self.remove(ours)
        if theirs:
            await self.delegate().delete(node_addr, theirs)

    def storage_stats(self) -> dict[str, int]:
        """``{"num_tensors", "total_bytes"}`` stored by this backend."""
        return {"num_tensors": len(self._bytes), "total_bytes": sum(self._bytes.values())}

    # -- consumer side ------------------------------------------------------

    def fetch(self, shards: Sequence[Any]) -> list[Any]:
        """Fetches shards (``TensorShardInfo`` objects or shard ids), in input
        order: shardport's in batches of ``max_shards_per_request``, AReaL's
        own through the delegate. Raises :class:`ShardportRTensorError`."""
        shards = list(shards)
        out: list[Any] = [None] * len(shards)
        ours = [i for i, s in enumerate(shards) if is_shardport_id(s)]
        theirs = [i for i, s in enumerate(shards) if not is_shardport_id(s)]
        if theirs:
            got = self.delegate().fetch([shards[i] for i in theirs])
            for i, t in zip(theirs, got):
                out[i] = t
        try:
            decoded = [(i, *decode_id(shards[i])) for i in ours]
            for k in range(0, len(decoded), self.max_shards_per_request):
                chunk = decoded[k : k + self.max_shards_per_request]
                fetched = self.node.fetch_many([h for _, h, _ in chunk], mode=self.mode)
                for (i, _, kind), shard in zip(chunk, fetched):
                    out[i] = shard.torch() if kind == "t" else shard.numpy()
        except ShardportError as e:
            raise ShardportRTensorError(f"Failed to fetch shard: {e}") from e
        return out

    def close(self) -> None:
        """Closes the node if this backend created it."""
        if self._own_node:
            self.node.close()

    def __enter__(self) -> ShardportRTensorBackend:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
