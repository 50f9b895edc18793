"""A node's address and identity from the environment the engine gives it.

shardport does not start processes: Ray, torchrun or Kubernetes does, and
each tells the process where it runs in its own way. This module reads that
and turns it into config overrides, so a node advertises an address other
machines can reach and names itself after its place in the job:

- ``ray``: the address is ``ray.util.get_node_ip_address()`` (Ray must be
  initialized in this process: a driver after ``ray.init()``, any actor or
  task); the name ``ray-<actor id>``, ``ray-task-<pid>`` or
  ``ray-driver-<pid>``.
- ``torchrun``: the address is the local address of the route to
  ``MASTER_ADDR`` (no packet is sent; ``127.0.0.1`` when ``MASTER_ADDR`` is
  loopback); the name ``rank<RANK>``; ``RANK``, ``LOCAL_RANK``,
  ``WORLD_SIZE``, ``GROUP_RANK`` are read and checked.
- ``k8s`` (the downward API): the address is ``POD_IP``; the name
  ``POD_NAME``, else ``pod-<POD_IP>``; ``NODE_NAME`` is read too.
- ``none``: nothing changes, the config as written.

**Choosing the source.** The ``addr_from`` argument of :class:`shardport.Node`
(or of :func:`detect`/:func:`apply`), else the environment variable
``SHARDPORT_ADDR_FROM``, one of ``auto``, ``ray``, ``torchrun``, ``k8s``,
``none``. **Default: ``none``**: a node binds and advertises loopback unless
told otherwise (an engine's variables being present is not consent to serve
shard bytes on the network). ``auto`` takes the first that applies: Ray if it
is initialized in this process, torchrun if ``TORCHELASTIC_RUN_ID`` or all of
``MASTER_ADDR``, ``RANK`` and ``WORLD_SIZE`` are set, Kubernetes if
``POD_IP`` is set, else none. A source named explicitly whose variables are
missing or malformed is an :class:`~shardport.errors.InvalidInputError`
naming the variable.

**What the overrides change** (every other key stays as written; the
host applies them, to the config a :class:`shardport.Node` starts with and
to every config it reloads, so a node started from a file can ``reload()``
it and its errors point at ``file:line:col``):

- ``node.name``: the name above.
- ``node.advertise``: ``<address>:<port>``, the port kept from the config
  (the address decides locality: an owner whose advertised address is one of
  this machine's is "same node" by address; shared memory also needs the
  identity to agree, see ``locality.same-node``).
- the ``bind`` of every plugin whose transport is http: ``<address>:<port>``
  with the configured port (``0``: ephemeral) when the address is not loopback, so consumers on other
  machines reach it; a ``bind`` on the unspecified address (``0.0.0.0:7071``)
  is kept and ``advertise`` is set to the address instead. An http transport
  that would serve beyond loopback without ``auth-token``/``auth-token-env``
  gives a :class:`ExposedWithoutTokenWarning`.

The node's locality identity (boot id, ``/dev/shm`` device, namespaces) is
always read from the machine itself, never from the environment: it is the
evidence that shared memory is really reachable.
"""

from __future__ import annotations

import copy
import ipaddress
import os
import socket
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .errors import InvalidInputError, ShardportWarning

__all__ = [
    "ADDR_FROM_ENV",
    "SOURCES",
    "DEFAULT_SOURCE",
    "EngineEnv",
    "ExposedWithoutTokenWarning",
    "detect",
    "apply",
]

#: The environment variable that selects the source (see the module doc).
ADDR_FROM_ENV = "SHARDPORT_ADDR_FROM"
#: Accepted values of ``SHARDPORT_ADDR_FROM`` / ``addr_from``.
SOURCES = ("auto", "ray", "torchrun", "k8s", "none")
#: The source when neither the argument nor the variable is set: none, so a
#: node stays on loopback unless the operator opts in.
DEFAULT_SOURCE = "none"
#: torchrun's default rendezvous port, used to pick the route to MASTER_ADDR
#: when MASTER_PORT is unset (no packet is sent to it).
DEFAULT_MASTER_PORT = 29500
#: Longest node name taken from the environment (a Kubernetes object name is
#: at most 253 characters; handles and metrics labels stay short).
MAX_NAME = 253


class ExposedWithoutTokenWarning(ShardportWarning):
    """The http transport will serve shard bytes beyond loopback with no auth
    token: anyone who can reach the port can read every shard."""


@dataclass(frozen=True)
class EngineEnv:
    """What the engine's environment says about this process."""

    #: ``ray``, ``torchrun``, ``k8s`` or ``none``.
    source: str
    #: The address other processes reach this node at (an IP address or a
    #: host name); ``None`` for ``none``.
    host: Optional[str] = None
    #: The node name the overrides give (``None``: keep the config's).
    name: Optional[str] = None
    #: torchrun's global rank, local rank, world size and group (machine) rank.
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    world_size: Optional[int] = None
    group_rank: Optional[int] = None
    #: The machine: Kubernetes ``NODE_NAME``, Ray's node id.
    node_name: Optional[str] = None
    #: Kubernetes ``POD_NAME``.
    pod_name: Optional[str] = None

    def overrides(self, config: Mapping[str, Any]) -> dict:
        """``config`` (a dict as :func:`shardport.default_config` returns) with
        this environment's overrides applied; ``config`` is not modified."""
        if self.source == "none" or self.host is None:
            return copy.deepcopy(dict(config))
        return self._applied(dict(config))

    def _engine(self) -> Optional[tuple[Optional[str], str]]:
        """What :class:`shardport.Node` hands the core: ``(name, host)``, or
        ``None`` when nothing changes."""
        if self.source == "none" or self.host is None:
            return None
        return (self.name, self.host)

    def _applied(self, config: Any) -> dict:
        # The host applies the overrides (its config::EngineOverrides): the
        # same code a node runs at start and, as its reload hook, at every
        # reload.
        from ._core import _engine_config

        out, exposed = _engine_config(config, self.name, self.host)
        for message in exposed:
            _warn_exposed(message)
        return out


def detect(addr_from: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> EngineEnv:
    """Reads the engine's environment. ``addr_from``: one of :data:`SOURCES`;
    ``None``: ``$SHARDPORT_ADDR_FROM``, else :data:`DEFAULT_SOURCE`.
    ``environ``: the variables to read (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    source = _source(addr_from, env)
    if source == "auto":
        if _ray_initialized():
            source = "ray"
        elif env.get("TORCHELASTIC_RUN_ID") or all(
            env.get(k) for k in ("MASTER_ADDR", "RANK", "WORLD_SIZE")
        ):
            source = "torchrun"
        elif env.get("POD_IP"):
            source = "k8s"
        else:
            source = "none"
    if source == "ray":
        return _from_ray()
    if source == "torchrun":
        return _from_torchrun(env)
    if source == "k8s":
        return _from_k8s(env)
    return EngineEnv(source="none")


def apply(
    config: Any = None,
    addr_from: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Any:
    """``config`` (``None``, a dict, a TOML file path or TOML text, as
    :class:`shardport.Node` takes) with the overrides of
    ``detect(addr_from, environ)`` applied, as a dict. When the source is
    ``none``, ``config`` is returned as given."""
    e = detect(addr_from, environ)
    if e.source == "none":
        return config
    return e._applied(config)


# --------------------------------------------------------------------------
# Sources.


def _source(addr_from: Optional[str], env: Mapping[str, str]) -> str:
    if addr_from is not None:
        what, value = "addr_from", addr_from
    elif env.get(ADDR_FROM_ENV) is not None:
        what, value = ADDR_FROM_ENV, env[ADDR_FROM_ENV]
    else:
        return DEFAULT_SOURCE
    v = value.strip().lower() if isinstance(value, str) else value
    if v not in SOURCES:
        raise InvalidInputError(
            f"{what}: expected one of {', '.join(SOURCES)}, found {value!r}"
        )
    return v


def _ray_initialized() -> bool:
    ray = sys.modules.get("ray")  # only if the process already uses Ray
    try:
        return bool(ray is not None and ray.is_initialized())
    except Exception:
        return False


def _from_ray() -> EngineEnv:
    if not _ray_initialized():
        raise InvalidInputError(
            f"{ADDR_FROM_ENV}/addr_from = ray, but Ray is not initialized in this "
            "process: call ray.init() first, or create the node inside a Ray actor or task"
        )
    import ray

    ip = _check_ip(ray.util.get_node_ip_address(), "ray.util.get_node_ip_address()")
    ctx = ray.get_runtime_context()
    actor = ctx.get_actor_id()
    if actor:
        name = f"ray-{actor[:16]}"
    elif ctx.get_task_id():
        name = f"ray-task-{os.getpid()}"
    else:
        name = f"ray-driver-{os.getpid()}"
    return EngineEnv(source="ray", host=ip, name=name, node_name=ctx.get_node_id())


def _from_torchrun(env: Mapping[str, str]) -> EngineEnv:
    master = env.get("MASTER_ADDR", "").strip()
    if not master:
        raise InvalidInputError(
            "torchrun: environment variable MASTER_ADDR is not set or empty "
            "(start the process with torchrun / python -m torch.distributed.run)"
        )
    rank = _int_var(env, "RANK", required=True)
    world = _int_var(env, "WORLD_SIZE", required=True, minimum=1)
    local_rank = _int_var(env, "LOCAL_RANK")
    group_rank = _int_var(env, "GROUP_RANK")
    if rank >= world:
        raise InvalidInputError(
            f"torchrun: environment variable RANK={rank} is not below WORLD_SIZE={world}"
        )
    port = _int_var(env, "MASTER_PORT", maximum=65535) or DEFAULT_MASTER_PORT
    host = _route_to(master, port)
    return EngineEnv(
        source="torchrun",
        host=host,
        name=f"rank{rank}",
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        group_rank=group_rank,
    )


def _from_k8s(env: Mapping[str, str]) -> EngineEnv:
    raw = env.get("POD_IP")
    if raw is None or not raw.strip():
        raise InvalidInputError(
            "k8s: environment variable POD_IP is not set or empty; expose it with the "
            "downward API: env: [{name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]"
        )
    ip = _check_ip(raw.strip(), "environment variable POD_IP")
    pod = _name_var(env, "POD_NAME")
    node = _name_var(env, "NODE_NAME")
    return EngineEnv(source="k8s", host=ip, name=pod or f"pod-{ip}", node_name=node, pod_name=pod)


# --------------------------------------------------------------------------
# Checks and helpers.


def _int_var(
    env: Mapping[str, str],
    var: str,
    required: bool = False,
    minimum: int = 0,
    maximum: Optional[int] = None,
) -> Optional[int]:
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        if required:
            raise InvalidInputError(f"torchrun: environment variable {var} is not set")
        return None
    try:
        v = int(raw.strip(), 10)
    except ValueError:
        raise InvalidInputError(
            f"torchrun: environment variable {var}={raw!r} is not an integer"
        ) from None
    if v < minimum or (maximum is not None and v > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..={maximum}"
        raise InvalidInputError(f"torchrun: environment variable {var}={v} must be {bound}")
    return v


def _name_var(env: Mapping[str, str], var: str) -> Optional[str]:
    raw = env.get(var)
    if raw is None or raw == "":
        return None
    if len(raw) > MAX_NAME or not raw.isprintable() or any(c.isspace() for c in raw):
        raise InvalidInputError(
            f"k8s: environment variable {var}={raw[:80]!r} is not a Kubernetes name "
            f"(at most {MAX_NAME} printable characters, no spaces)"
        )
    return raw


def _check_ip(value: Any, what: str) -> str:
    try:
        return str(ipaddress.ip_address(str(value)))
    except ValueError:
        raise InvalidInputError(f"{what}: expected an IP address, found {value!r}") from None


def _route_to(master: str, port: int) -> str:
    """The local address of the route to ``master`` (a UDP socket's connect
    picks it; nothing is sent)."""
    try:
        infos = socket.getaddrinfo(master, port, type=socket.SOCK_DGRAM)
    except socket.gaierror as e:
        raise InvalidInputError(
            f"torchrun: environment variable MASTER_ADDR={master!r} does not resolve: {e}"
        ) from None
    family, _, _, _, sockaddr = infos[0]
    if ipaddress.ip_address(sockaddr[0]).is_loopback:
        return "127.0.0.1" if family == socket.AF_INET else "::1"
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect(sockaddr)
        except OSError as e:
            raise InvalidInputError(
                f"torchrun: no route to MASTER_ADDR={master!r}: {e}"
            ) from None
        return s.getsockname()[0]


def _warn_exposed(message: str) -> None:
    """Gives an :class:`ExposedWithoutTokenWarning` (the host's text),
    pointing at the caller's line outside this package."""
    warnings.warn(message, ExposedWithoutTokenWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside
    this package (the user's ``Node(...)`` or ``apply(...)`` call)."""
    pkg = os.path.dirname(os.path.abspath(__file__))
    f, level = sys._getframe(1), 1
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == pkg:
        f, level = f.f_back, level + 1
    return level

