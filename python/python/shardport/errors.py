"""The exceptions shardport raises, and the warnings it gives.

Every exception is a :class:`ShardportError` carrying the Rust library's
message; several also subclass the builtin exception a Python user would
catch for that kind of mistake. Every warning is a :class:`ShardportWarning`
(a ``UserWarning``): filter them as usual, e.g. ``-W
error::shardport.DowngradeWarning`` turns a downgrade into an exception.

Log records of the Rust library and of every transport plugin go to the
``logging`` logger ``shardport`` (children ``shardport.loader``,
``shardport.select``, ``shardport.plugin``, ...; a plugin's records carry
``record.plugin``). See :func:`shardport.flush_logs`."""

from __future__ import annotations

__all__ = [
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
]


class ShardportError(Exception):
    """Base class of every shardport error."""


class ConfigError(ShardportError, ValueError):
    """The config (path, TOML text or dict) is invalid; the message points at
    the offending key, line and column."""


class InvalidInputError(ShardportError, ValueError):
    """An argument is wrong: dtype, shape, tags, mode, size limits."""


class UnsupportedObjectError(InvalidInputError, TypeError):
    """``put`` got an object that has neither ``__dlpack__`` nor the buffer
    protocol (or an element type shardport does not carry)."""


class BadHandleError(ShardportError, ValueError):
    """Handle bytes that are truncated, corrupted or from an incompatible
    version."""


class BadManifestError(BadHandleError):
    """Weights-manifest bytes that are truncated, altered or from an
    incompatible version (the message names what and where)."""


class StaleVersionError(InvalidInputError):
    """A weights update older than the version the receiver committed."""


class NotFoundError(ShardportError, KeyError):
    """The shard does not exist (any more) at its owner, or is not owned by
    this node."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class IntegrityError(ShardportError):
    """Fetched bytes do not match the handle's checksum."""


class TransportError(ShardportError):
    """Every candidate transport failed (the message lists each failure), or
    a downgrade was refused by ``fetch.on-downgrade = "fail"``."""


class TransportUnavailableError(TransportError):
    """No loaded transport can export or reach the shard: a plugin is not
    loaded, or cannot work here (e.g. cuda-ipc without a CUDA driver)."""


class ClosedError(ShardportError):
    """The node was closed."""


class StorageError(ShardportError):
    """The owner's storage refused the shard, e.g. the shared-memory pool is
    full (the message says how full and which setting to raise)."""


class PermissionDeniedError(ShardportError, PermissionError):
    """A node's control endpoint refused the request's bearer token (none
    given, or the wrong one): see :func:`shardport.remove_remote`."""


class ShardportWarning(UserWarning):
    """Base class of every shardport warning."""


class DowngradeWarning(ShardportWarning):
    """A fetch was not served the way it was asked: a faster transport failed
    and a slower one served it (each error is in the ``shardport.select``
    log), or a view was asked and a copy served (the owner is on another
    machine, or no same-node transport can map it). Silenced by the config's
    ``fetch.on-downgrade = "allow"``; ``"fail"`` makes the first case a
    :class:`TransportError`."""


class ConfigWarning(ShardportWarning):
    """The config has something shardport did not use: an unknown key (a
    typo such as ``fetch.mdoe`` or a ``[fecth]`` table; the message gives its
    dotted path and ``file:line:col``), or a rule naming a transport no
    plugin loads."""
