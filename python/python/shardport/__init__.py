"""shardport: move tensor shards between the processes of distributed ML jobs.

A process **puts** a tensor and gets a small, picklable :class:`Handle`; it
sends the handle through its own channel (a multiprocessing queue, an RPC);
a consumer **fetches** it, and shardport picks the fastest transport that
reaches the owner: POSIX shared memory on the same machine (zero-copy), CUDA
IPC for GPU tensors, HTTP across machines. Every fetch says which transport
served it and why.

    >>> import numpy as np, shardport
    >>> with shardport.Node() as node:
    ...     h = node.put(np.arange(4, dtype=np.float32))
    ...     shard = node.fetch(h)              # zero-copy view
    ...     np.asarray(shard).tolist(), shard.transport
    ([0.0, 1.0, 2.0, 3.0], 'posix-shm')

Start with :class:`Node`; :mod:`shardport.areal` is a drop-in for AReaL's
RTensor storage backend.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import numpy as np

from . import env, errors, weights
from ._core import (
    DEFAULT_CONFIG,
    CudaShard,
    Handle,
    Shard,
    __version__,
    flush_logs,
    remove_remote,
)
from ._core import Node as _CoreNode
from .errors import (
    BadHandleError,
    BadManifestError,
    StaleVersionError,
    ClosedError,
    ConfigError,
    ConfigWarning,
    DowngradeWarning,
    IntegrityError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    ShardportError,
    StorageError,
    TransportError,
    ShardportWarning,
    TransportUnavailableError,
    UnsupportedObjectError,
)

__all__ = [
    "Node",
    "Handle",
    "Shard",
    "CudaShard",
    "plugin_dir",
    "default_config",
    "DEFAULT_CONFIG",
    "errors",
    "env",
    "weights",
    "ShardportError",
    "ConfigError",
    "InvalidInputError",
    "UnsupportedObjectError",
    "BadHandleError",
    "BadManifestError",
    "StaleVersionError",
    "NotFoundError",
    "IntegrityError",
    "TransportError",
    "TransportUnavailableError",
    "ClosedError",
    "StorageError",
    "PermissionDeniedError",
    "ShardportWarning",
    "DowngradeWarning",
    "ConfigWarning",
    "flush_logs",
    "remove_remote",
    "__version__",
]

#: Environment variable naming a directory with the transport plugins
#: (``libshardport_*.so``); by default the ones bundled in the package.
PLUGIN_DIR_ENV = "SHARDPORT_PLUGIN_DIR"

# ml_dtypes types (NumPy has no native bfloat16/float8), by NumPy dtype name.
_ML_DTYPES = {
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
}
_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def plugin_dir() -> Path:
    """Where this package loads transport plugins from: ``$SHARDPORT_PLUGIN_DIR``
    or the plugins bundled next to the package."""
    env = os.environ.get(PLUGIN_DIR_ENV)
    return Path(env) if env else Path(__file__).with_name("_plugins")


_default_plugin_dir = plugin_dir  # `Node(plugin_dir=...)` shadows the name


def default_config() -> dict:
    """The embedded library config (what ``Node()`` starts with) as a dict,
    to edit and pass to :class:`Node` (``DEFAULT_CONFIG`` is the same as TOML
    text, with comments). It names no node (a node started from it names
    itself ``node-<pid>-<n>``) and advertises ``127.0.0.1:0`` (loopback: this
    machine; port 0: no fixed port). ``shardport demo``'s config is another
    one (``configs/default.toml`` in the repository)."""
    import tomllib

    return tomllib.loads(DEFAULT_CONFIG)


def _torch_tensor_type() -> Any:
    import sys

    torch = sys.modules.get("torch")  # only if the caller already uses torch
    return getattr(torch, "Tensor", None) if torch is not None else None


class Node(_CoreNode):
    """A shardport node: owns the shards this process puts, fetches shards by
    handle. Several nodes per process are fine; each has its own transports.

    ``config``: ``None`` (the embedded default: shared-memory pool, http,
    cuda-ipc where available), a path to a TOML file, TOML text, or a dict
    with the same structure. Relative plugin paths also resolve in
    :func:`plugin_dir`.

    ``addr_from``: where the node takes its address and name from: ``"ray"``,
    ``"torchrun"``, ``"k8s"``, ``"auto"`` or ``"none"`` (see
    :mod:`shardport.env`); ``None``: ``$SHARDPORT_ADDR_FROM``, else
    ``"none"`` (the config as written, loopback by default).

    Use as a context manager or call :meth:`close`: closing removes every
    shard this node owns (shards other processes already fetched as views
    stay readable until released).

    Methods: :meth:`put`, ``fetch(handle, mode=None)``,
    ``fetch_many(handles, mode=None)``, ``fetch_into(handle, out)``,
    ``fetch_cuda(handle)`` (a CUDA shard in place, for ``torch.from_dlpack``),
    ``remove(handles)``, ``clear()``,
    ``drain(handles=None)``, ``stats()``, ``metrics()``, ``close()``.
    """

    def __new__(
        cls,
        config: Any = None,
        *,
        plugin_dir: Optional[os.PathLike] = None,
        addr_from: Optional[str] = None,
    ) -> Node:
        d = Path(plugin_dir) if plugin_dir is not None else _default_plugin_dir()
        # The core reads the config and applies the engine's overrides (at
        # start and at every reload), so a file stays a file.
        engine = env.detect(addr_from)._engine()
        self = super().__new__(cls, config, str(d), engine)
        self._device_refs = {}
        return self

    def __init__(
        self,
        config: Any = None,
        *,
        plugin_dir: Optional[os.PathLike] = None,
        addr_from: Optional[str] = None,
    ) -> None:
        """Starts the node (see the class docstring); ``plugin_dir`` overrides
        :func:`plugin_dir` for this node."""

    def put(self, x: Any, tags: Optional[Mapping[str, str]] = None) -> Handle:
        """Puts ``x`` and returns its :class:`Handle`.

        ``x``: a NumPy array (any dtype shardport carries, incl. ml_dtypes'
        bfloat16/float8; any layout: strided input is gathered in one pass),
        a torch tensor (CPU: copied once into shared memory; CUDA: exported
        in place through cuda-ipc, or :class:`TransportUnavailableError`
        naming why not), ``bytes``/``bytearray``/``memoryview``, or anything
        with ``__dlpack__`` or the buffer protocol. Contiguous input is
        copied exactly once, straight into the node's storage, with the GIL
        released.

        ``tags``: str -> str routing tags (config routes match on them).
        """
        tags = dict(tags) if tags is not None else None
        tensor_type = _torch_tensor_type()
        if tensor_type is not None and isinstance(x, tensor_type):
            return self._put_torch(x, tags)
        if isinstance(x, (np.ndarray, np.generic)):
            return self._put_numpy(np.asarray(x), tags)
        if hasattr(x, "__dlpack__") and not isinstance(x, (bytes, bytearray, memoryview)):
            try:
                arr = np.from_dlpack(x)
            except (BufferError, TypeError, RuntimeError, ValueError) as e:
                raise UnsupportedObjectError(
                    f"cannot put a {type(x).__name__}: its __dlpack__ export failed: {e}"
                ) from e
            return self._put_numpy(arr, tags)
        return self._put_buffer(x, None, tags)

    def put_many(
        self, xs: Iterable[Any], tags: Optional[Mapping[str, str]] = None
    ) -> list[Handle]:
        """Puts every object of ``xs`` (as :meth:`put` takes them), with the
        same ``tags``; returns their handles in order.

        NumPy arrays, CPU tensors and buffers go to the node in one call
        with the GIL released once, which is what makes many small shards
        (token ids, masks, rewards) cheap; CUDA tensors are put one by one.
        The first failure raises; the shards put before it stay and are
        named in the error.
        """
        tags = dict(tags) if tags is not None else None
        items = list(xs)
        out: list[Optional[Handle]] = [None] * len(items)
        batch: list[tuple[int, Any, Optional[str]]] = []
        for i, x in enumerate(items):
            buf = self._as_buffer(x)
            if buf is None:
                out[i] = self.put(x, tags)
            else:
                batch.append((i, buf[0], buf[1]))
        if batch:
            handles = self._put_buffers([b[1] for b in batch], [b[2] for b in batch], tags)
            for (i, _, _), h in zip(batch, handles):
                out[i] = h
        return [h for h in out if h is not None]

    def _as_buffer(self, x: Any) -> Optional[tuple[Any, Optional[str]]]:
        """``(buffer object, dtype override)`` for what :meth:`put` copies
        from a buffer; ``None`` for what it puts otherwise (CUDA tensors,
        refused objects: :meth:`put` raises the error)."""
        tensor_type = _torch_tensor_type()
        if tensor_type is not None and isinstance(x, tensor_type):
            t = x.detach()
            if t.device.type != "cpu":
                return None
            t = t.resolve_conj().resolve_neg()
            name = str(t.dtype).removeprefix("torch.")
            if name in _ML_DTYPES:
                import torch

                bits = {1: torch.uint8, 2: torch.int16}[t.element_size()]
                return t.view(bits).numpy(), name
            return t.numpy(), name
        if isinstance(x, (np.ndarray, np.generic)):
            a = np.asarray(x)
            if a.dtype.name in _ML_DTYPES:
                return a.view(_UINT_OF_SIZE[a.dtype.itemsize]), a.dtype.name
            if a.dtype.kind in "biufc":
                return a, None
            return None
        if isinstance(x, (bytes, bytearray, memoryview)):
            return x, None
        return None

    def _put_numpy(self, a: np.ndarray, tags: Optional[dict]) -> Handle:
        name = a.dtype.name
        if name in _ML_DTYPES:
            # Same item size, any strides: reinterpret the bits, keep the name.
            return self._put_buffer(a.view(_UINT_OF_SIZE[a.dtype.itemsize]), name, tags)
        if a.dtype.kind in "biufc":
            # The buffer's format carries the type (and refuses big-endian data).
            return self._put_buffer(a, None, tags)
        raise UnsupportedObjectError(
            f"cannot put a NumPy array of dtype {a.dtype}: shardport carries bool, "
            "integers, floats (incl. bfloat16/float8 via ml_dtypes) and complex"
        )

    def _put_torch(self, t: Any, tags: Optional[dict]) -> Handle:
        import torch

        t = t.detach()
        name = str(t.dtype).removeprefix("torch.")
        if t.device.type == "cuda":
            t = t.contiguous()
            h = self._put_device(
                t.data_ptr(),
                t.numel() * t.element_size(),
                name,
                list(t.shape),
                t.device.index or 0,
                tags,
            )
            # The GPU memory must outlive the shard: keep the tensor until removed.
            self._device_refs[h.id] = t
            return h
        if t.device.type != "cpu":
            raise InvalidInputError(
                f"cannot put a tensor on {t.device}: shardport moves CPU and CUDA tensors"
            )
        t = t.resolve_conj().resolve_neg()
        if name in _ML_DTYPES:
            bits = {1: torch.uint8, 2: torch.int16}[t.element_size()]
            return self._put_buffer(t.view(bits).numpy(), name, tags)
        return self._put_buffer(t.numpy(), name, tags)

    def remove(self, handles: Any) -> int:
        """Removes owned shards (a Handle or an iterable of them): unexported
        at once; the memory is reclaimed when no consumer lease holds it.
        Returns how many were owned here (others are ignored)."""
        hs = [handles] if isinstance(handles, Handle) else list(handles)
        n = super().remove(hs)
        for h in hs:
            self._device_refs.pop(getattr(h, "id", None), None)
        return n

    def clear(self) -> None:
        """Removes every owned shard and drops every cached fetched shard."""
        super().clear()
        self._device_refs.clear()

    def close(self) -> None:
        """Removes every owned shard and stops this node's transports.
        Idempotent. Shards already fetched as views stay readable."""
        super().close()
        self._device_refs.clear()

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.close()
        return False
