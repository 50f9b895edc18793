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
    return f"{ID_PREFIX}{kind}:" + handle.to_base64url()


def decode_id(shard_id: Any) -> tuple[Handle, str]:
    """The handle and kind in a shard id (raises :class:`BadHandleError`)."""
    sid = getattr(shard_id, "shard_id", shard_id)  # a TensorShardInfo or the id
    if not isinstance(sid, str) or not sid.startswith(ID_PREFIX) or sid[4:5] != ":":
        raise BadHandleError(f"not a shardport shard id: {str(sid)[:40]!r}")
    return Handle.from_base64url(sid[5:]), sid[3]


def _areal_storage() -> Any:
    """AReaL's ``rtensor`` module (its process storage) where AReaL is
    already imported by this process, else ``None`` (the adapter never
    imports AReaL itself for this)."""
    import sys

    return sys.modules.get("areal.infra.rpc.rtensor")


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
        # Ids also registered in AReaL's process storage (see `store`).
        self._mirrored: set[str] = set()
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
        """Stores a tensor (torch CPU/CUDA or NumPy) and returns its shard id.

        Where AReaL is loaded in this process (an AReaL worker), a torch
        tensor is also registered in AReaL's own process storage under the same id (the tensor object, no
        copy), as AReaL's backend does: AReaL's ``/data/<id>`` endpoints and
        module functions see it, and AReaL's ``DELETE /data/clear`` (what its
        controller's cleanup sends to the owner) removes it there, after
        which this backend removes the shardport shard too (see
        :meth:`reconcile`)."""
        self.reconcile()
        kind = "n" if isinstance(tensor, np.ndarray) else "t"
        h = self.node.put(tensor)
        sid = encode_id(h, kind)
        self._bytes[sid] = h.nbytes
        areal = _areal_storage()
        if areal is not None and kind == "t":
            areal.store(sid, tensor)
            self._mirrored.add(sid)
        return sid

    def reconcile(self) -> int:
        """Removes the shardport shards whose entry in AReaL's process storage
        is gone: AReaL's cleanup (``DELETE /data/clear`` from the
        controller, or ``rtensor.remove`` here) reached this owner. Runs at
        every :meth:`store` and :meth:`storage_stats`; returns how many were
        removed."""
        if not self._mirrored:
            return 0
        areal = _areal_storage()
        if areal is None:
            return 0
        gone = [sid for sid in self._mirrored if sid not in areal._storage]
        if not gone:
            return 0
        self._mirrored.difference_update(gone)
        return self.remove(gone)

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
        areal = _areal_storage()
        for sid in sids:
            self._bytes.pop(sid, None)
            if sid in self._mirrored:
                self._mirrored.discard(sid)
                if areal is not None:
                    areal.remove(sid)  # AReaL's entry too (and its fetch buffer)
        return n

    async def delete(self, node_addr: str, shard_ids: Sequence[Any]) -> None:
        """AReaL's ``delete``, called in any process (AReaL's controller calls
        it for every worker at the end of a step): shards this process owns
        are removed at once; the others go to the owner at ``node_addr``
        through AReaL's own ``DELETE /data/clear`` (the delegate), which
        drops them from the owner's AReaL storage, and the owner's backend
        then removes its shardport shards (:meth:`reconcile`, at its next
        ``store`` or ``storage_stats``). Where AReaL is not loaded in this
        process and no delegate was given, ids owned elsewhere are ignored.
        NumPy shards are not registered with AReaL (its storage holds torch
        tensors): only their owner removes them."""
        sids = [getattr(s, "shard_id", s) for s in shard_ids]
        mine = {s for s in sids if s in self._bytes}
        self.remove(mine)
        rest = [s for s in sids if s not in mine]
        if rest and node_addr and (_areal_storage() is not None or self._delegate is not None):
            await self.delegate().delete(node_addr, rest)

    def storage_stats(self) -> dict[str, int]:
        """``{"num_tensors", "total_bytes"}`` stored by this backend."""
        self.reconcile()
        return {"num_tensors": len(self._bytes), "total_bytes": sum(self._bytes.values())}

    # -- consumer side ------------------------------------------------------

    def fetch(self, shards: Sequence[Any]) -> list[Any]:
        """Fetches shards (``TensorShardInfo`` objects or shard ids), in input
        order: shardport's in batches of ``max_shards_per_request``, AReaL's
        own through the delegate. Raises :class:`ShardportRTensorError`."""
        if len(shards) == 1:
            # AReaL's to_local: one shard at a time, the common case; the
            # same checks as the loop below, without its lists.
            sid = getattr(shards[0], "shard_id", shards[0])
            if sid.__class__ is str and sid[4:5] == ":" and sid.startswith(ID_PREFIX):
                try:
                    shard = self.node.fetch(Handle.from_base64url(sid[5:]), mode=self.mode)
                    return [shard.torch() if sid[3] == "t" else shard.numpy()]
                except ShardportError as e:
                    raise ShardportRTensorError(f"Failed to fetch shard: {e}") from e
        out: list[Any] = [None] * len(shards)
        theirs: list[int] = []
        ours: list[tuple[int, Handle, str]] = []
        from_b64 = Handle.from_base64url
        try:
            # is_shardport_id + decode_id, inlined: this loop is the
            # adapter's whole cost per shard.
            for i, s in enumerate(shards):
                sid = getattr(s, "shard_id", s)
                if sid.__class__ is str and sid[4:5] == ":" and sid.startswith(ID_PREFIX):
                    ours.append((i, from_b64(sid[5:]), sid[3]))
                else:
                    theirs.append(i)
            if theirs:
                got = self.delegate().fetch([shards[i] for i in theirs])
                for i, t in zip(theirs, got):
                    out[i] = t
            if len(ours) == 1 and not theirs:  # AReaL's to_local: one shard
                i, h, kind = ours[0]
                shard = self.node.fetch(h, mode=self.mode)
                out[i] = shard.torch() if kind == "t" else shard.numpy()
                return out
            step = self.max_shards_per_request
            for k in range(0, len(ours), step):
                chunk = ours[k : k + step]
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
