"""Weight updates in one call: publish a state dict, receive it in place.

The trainer publishes; every rollout or inference process receives the
whole state dict into its own tensors, verified and all-or-nothing::

    # trainer
    pub = shardport.weights.Publisher(node)
    manifest = pub.publish(model, version=step)        # or a state dict
    send_to_rollouts(manifest.to_bytes())              # your RPC (or pickle it)

    # each rollout
    rx = shardport.weights.Receiver(node, into=model)  # binds the parameters once
    report = rx.update(shardport.weights.Manifest.from_bytes(data))
    tell_trainer(rx.version)                           # then pub.committed(name, version)

How it moves: small tensors are packed into buckets of ``bucket_size``
(large ones get a bucket each); each bucket is one shard, so it rides the
node's transports, routes and relays like any shard (``relay = "on"`` on
the http transport makes a broadcast take about one link's time). Every
bucket is checked against the BLAKE3 hash the publisher put in the
manifest before any byte lands, whatever path it took; an update that
fails for any reason (a dead peer, a corrupted or forged piece, a version
already retired) leaves every tensor and :attr:`Receiver.version` as they
were. The cost of that guarantee: the update's bytes are held until the
commit (a same-node view holds no copy) and one memory-speed copy into
place.

Receivers take CPU tensors (torch or NumPy, any strides) of the published
dtype and shape. The publisher keeps a version until every receiver it
knows reported committing a newer one (:meth:`Publisher.committed`), or
``grace`` seconds after a newer one was published, then removes it
everywhere, relay copies included.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Union

import numpy as np

from . import errors
from ._core import Manifest
from ._core import _Publisher, _Receiver

__all__ = ["Manifest", "Publisher", "Receiver", "DEFAULT_BUCKET_SIZE"]

#: Default bucket size: 16 MiB (a bucket's request is a small part of its
#: transfer on any link; a 64 MiB state dict still moves in parallel).
DEFAULT_BUCKET_SIZE = 16 << 20

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def _size(v: Union[int, str]) -> int:
    if isinstance(v, int):
        return v
    s = v.strip().lower()
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num) :].strip()
    if unit not in _UNITS or not num.strip():
        raise errors.InvalidInputError(
            f"bucket_size {v!r}: a byte count or a size like \"16MiB\""
        )
    return int(float(num) * _UNITS[unit])


def _items(state: Any) -> list[tuple[str, Any]]:
    """``(name, tensor)`` of a torch module (its ``state_dict()``: the
    parameters and buffers, sharing their storage) or a mapping."""
    if hasattr(state, "state_dict") and callable(state.state_dict):
        state = state.state_dict()
    if not isinstance(state, Mapping):
        raise errors.InvalidInputError(
            f"expected a torch module or a mapping of names to tensors, not {type(state).__name__}"
        )
    return [(str(k), v) for k, v in state.items()]


def _buffer(node: Any, name: str, x: Any) -> tuple[Any, Optional[str]]:
    """A NumPy view (or buffer) of ``x`` and its dtype override."""
    got = node._as_buffer(x)
    if got is None:
        device = getattr(x, "device", None)
        where = f" on {device}" if device is not None else ""
        raise errors.InvalidInputError(
            f"tensor {name!r}: a {type(x).__name__}{where} cannot be published or received "
            "by shardport.weights; give CPU tensors or NumPy arrays"
        )
    return got


class Publisher:
    """Publishes versions of a state dict from ``node`` (which owns the
    buckets). Keep both open while receivers update: a publisher that is
    closed or garbage-collected removes every version it holds.

    ``bucket_size``: the largest bucket of packed tensors (bytes or
    ``"16MiB"``); ``tags``: tags of every bucket (what routes and relay rules
    match); ``keep_versions``: most versions held at once; ``grace``:
    seconds an older version outlives a newer one's publish when some
    receiver has not reported committing it; ``threads``: buckets put at
    once (default: the cores, at most 8).
    """

    def __init__(
        self,
        node: Any,
        *,
        bucket_size: Union[int, str] = DEFAULT_BUCKET_SIZE,
        tags: Optional[Mapping[str, str]] = None,
        keep_versions: int = 2,
        grace: float = 60.0,
        threads: Optional[int] = None,
    ) -> None:
        self._node = node
        self._core = _Publisher(
            node,
            _size(bucket_size),
            dict(tags) if tags is not None else None,
            keep_versions,
            float(grace),
            threads,
        )

    def publish(
        self,
        state: Any,
        version: int,
        *,
        split: Optional[Mapping[str, int]] = None,
        parts: Optional[int] = None,
    ) -> Manifest:
        """Publishes ``state`` (a torch module, or a mapping of names to CPU
        tensors or NumPy arrays) as ``version`` (greater than any published
        before) and returns its :class:`Manifest`. Every tensor is copied
        once into its bucket with the GIL released; a failed publish
        removes what it had put.

        ``split`` and ``parts``: the tensors named in ``split`` (name to the
        dimension to split along: 0 for a row-parallel layout of an output
        projection, 1 for a column-parallel one) are published in ``parts``
        equal parts, one per tensor-parallel rank of the receivers; a
        :class:`Receiver` with ``part=(rank, parts)`` fetches only its part
        of them (and every tensor published whole)."""
        if (split is None) != (parts is None):
            raise errors.InvalidInputError("split and parts go together")
        names, arrays, dtypes = [], [], []
        for name, x in _items(state):
            buf, dtype = _buffer(self._node, name, x)
            if isinstance(buf, np.ndarray) and not buf.flags.c_contiguous:
                buf = np.ascontiguousarray(buf)
            names.append(name)
            arrays.append(buf)
            dtypes.append(dtype)
        return self._core.publish(
            int(version), names, arrays, dtypes, dict(split) if split else None, int(parts or 0)
        )

    def expect(self, receivers: Iterable[str]) -> None:
        """The receivers whose commits decide when an older version may go."""
        self._core.expect(list(receivers))

    def committed(self, receiver: str, version: int) -> list[int]:
        """Records that ``receiver`` committed ``version``; returns the
        versions this retired."""
        return self._core.committed(receiver, int(version))

    def forget(self, receiver: str) -> list[int]:
        """Stops waiting for ``receiver`` (dead or gone); returns the versions
        this retired."""
        return self._core.forget(receiver)

    def sweep(self) -> list[int]:
        """Retires the versions whose grace ran out; returns them."""
        return self._core.sweep()

    def retire_all(self) -> list[int]:
        """Removes every version held (owner and relay copies)."""
        return self._core.retire_all()

    def close(self) -> None:
        """Removes every version held; the publisher publishes no more."""
        self._core.retire_all()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()

    @property
    def versions(self) -> list[int]:
        """The versions held, oldest first."""
        return self._core.versions


class Receiver:
    """Takes versions of a state dict into this process's tensors through
    ``node``.

    ``into``: the destination, bound now (see :meth:`bind`), or given to
    each :meth:`update`. ``verify``: ``"fetched"`` (default) hashes every
    bucket except views of the owner's own memory on this machine;
    ``"always"`` hashes those too. ``partial``: take only the tensors the
    destination has (a rank holding part of a model); by default a tensor
    missing on either side is an error. ``part``: ``(rank, count)`` for a
    tensor-parallel rank: of every tensor published in parts it takes part
    ``rank`` (its destination has that part's shape), and only the buckets
    of its part move. ``fetches``: buckets fetched at once (default 4);
    ``threads``: threads of the copies into place (default: the cores, at
    most 8).
    """

    def __init__(
        self,
        node: Any,
        into: Any = None,
        *,
        verify: str = "fetched",
        partial: bool = False,
        threads: Optional[int] = None,
        fetches: Optional[int] = None,
        part: Optional[tuple[int, int]] = None,
    ) -> None:
        self._node = node
        self._core = _Receiver(
            node, verify, bool(partial), threads, fetches, tuple(part) if part else None
        )
        self._dests: Optional[list[tuple[str, Optional[str], Any]]] = None
        if into is not None:
            self.bind(into)

    def bind(self, into: Any) -> None:
        """Binds the destination: a torch module (its ``state_dict()``
        tensors: parameters and buffers) or a mapping of names to CPU tensors
        or writable NumPy arrays. Views of their memory are made once, so an
        update runs no Python per tensor. Bind again if the tensors are
        replaced (not updated in place) between updates."""
        dests = []
        for name, x in _items(into):
            buf, dtype = _buffer(self._node, name, x)
            dests.append((name, dtype, buf))
        self._dests = dests

    def update(self, manifest: Union[Manifest, bytes], into: Any = None) -> dict:
        """Takes ``manifest``'s version into the bound destination (or
        ``into``): all of it or, on any error, nothing. Returns a report:
        ``version``, ``changed`` (false when already on it), ``buckets``,
        ``bytes``, ``verified`` (buckets hashed), ``tensors``, ``transports``
        (buckets per transport), ``fetch_s``, ``commit_s``.

        Raises :class:`~shardport.errors.StaleVersionError` for a version
        older than the committed one, ``InvalidInputError`` naming every
        tensor that does not fit, ``IntegrityError`` for bytes that do not
        match the publisher's hash, ``BadManifestError`` for manifest bytes
        that do not decode, and the fetch's error when a bucket cannot be
        fetched. Do not read or write the destination tensors from other
        threads while an update runs."""
        if isinstance(manifest, (bytes, bytearray, memoryview)):
            manifest = Manifest.from_bytes(bytes(manifest))
        if into is not None:
            self.bind(into)
        if self._dests is None:
            raise errors.InvalidInputError(
                "no destination: pass into= here or to Receiver(...), or call bind()"
            )
        return self._core.update(manifest, self._dests)

    @property
    def version(self) -> Optional[int]:
        """The version committed last (``None`` before the first update)."""
        return self._core.version
