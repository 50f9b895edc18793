"""A broadcast through http relays, from Python: nothing new to call. Three
nodes in this process, http only (as if on three machines): the first
consumer fetches from the owner, the second from the first, every byte
checked; the fetch's reason says where the bytes came from; the owner's
removal reaches the relay's copy."""

import time

import numpy as np
import shardport


def _http_only(relay: bool) -> dict:
    cfg = shardport.default_config()
    cfg["plugin"] = [p for p in cfg["plugin"] if p["name"] == "http"]
    cfg.pop("route", None)
    cfg.pop("experiment", None)
    cfg["put"] = {"storage": "heap", "checksum": "xxh3"}
    http = cfg["plugin"][0]
    http["required"] = True
    http.setdefault("config", {})
    if relay:
        http["config"]["relay"] = "on"
    return cfg


def _plugin_stat(node: shardport.Node, key: str) -> int:
    http = next(p for p in node.stats()["plugins"] if p["name"] == "http")
    return http["stats"][key]


def test_the_second_consumer_fetches_from_the_first():
    data = np.random.default_rng(7).standard_normal(1 << 19).astype(np.float32)  # 2 MiB
    with (
        shardport.Node(_http_only(False)) as owner,
        shardport.Node(_http_only(True)) as first,
        shardport.Node(_http_only(True)) as second,
    ):
        h = owner.put(data)
        a = first.fetch(h, mode="copy")
        b = second.fetch(h, mode="copy")
        assert np.array_equal(np.asarray(a).view(np.float32), data)
        assert np.array_equal(np.asarray(b).view(np.float32), data)
        assert a.transport == b.transport == "http"
        assert "from owner" in a.reason, a.reason
        assert "from relay" in b.reason, b.reason
        assert _plugin_stat(second, "relay_bytes_from_holders_total") == data.nbytes
        assert _plugin_stat(first, "relay_copies") == 1
        owner.remove(h)
        deadline = time.monotonic() + 30
        while _plugin_stat(first, "relay_copies") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _plugin_stat(first, "relay_copies") == 0, "the removal reached the relay's copy"


def _relay_by_tag(relay: bool) -> dict:
    """Two instances of the http plugin: `http` for every shard, relaying
    nothing, and `broadcast` (the same library, `transport = "http"`),
    whose consumers relay; routes send shards tagged `kind = "weights"`
    through `broadcast` and the rest through `http`. This is how relaying
    is chosen by tag (docs: the http plugin's README, "Which shards")."""
    cfg = _http_only(False)
    http = cfg["plugin"][0]
    broadcast = {
        "name": "broadcast",
        "transport": "http",
        "path": http["path"],
        "required": True,
        "config": {"relay": "on" if relay else "off"},
    }
    cfg["plugin"].append(broadcast)
    cfg["route"] = [
        {"name": "weights", "tags": {"kind": "weights"}, "transports": ["broadcast"]},
        {"name": "the rest", "transports": ["http"]},
    ]
    return cfg


def _instance_stat(node: shardport.Node, instance: str, key: str) -> int:
    plugin = next(p for p in node.stats()["plugins"] if p["name"] == instance)
    return plugin["stats"][key]


def test_only_shards_with_a_tag_go_through_relays():
    rng = np.random.default_rng(11)
    weights = rng.standard_normal(1 << 19).astype(np.float32)  # 2 MiB
    other = rng.standard_normal(1 << 19).astype(np.float32)
    with (
        shardport.Node(_relay_by_tag(False)) as owner,
        shardport.Node(_relay_by_tag(True)) as first,
        shardport.Node(_relay_by_tag(True)) as second,
    ):
        hw = owner.put(weights, tags={"kind": "weights"})
        ho = owner.put(other)
        for node in (first, second):
            w = node.fetch(hw, mode="copy")
            o = node.fetch(ho, mode="copy")
            assert np.array_equal(np.asarray(w).view(np.float32), weights)
            assert np.array_equal(np.asarray(o).view(np.float32), other)
            assert w.transport == "broadcast", w.reason
            assert o.transport == "http", o.reason
            assert "from relay" not in o.reason, o.reason
        # The second consumer got the tagged shard from the first, the
        # other one from the owner; only the tagged one has relay copies.
        assert "from relay" in w.reason, w.reason
        assert _instance_stat(second, "broadcast", "relay_bytes_from_holders_total") == weights.nbytes
        assert _instance_stat(first, "broadcast", "relay_copies") == 1
        assert _instance_stat(first, "http", "relay_copies") == 0
        assert _instance_stat(second, "http", "relay_bytes_from_holders_total") == 0
        # Both joined the tagged shard's relay tree at the owner; nothing
        # joined a tree of the instance that relays nothing.
        assert _instance_stat(owner, "broadcast", "relay_joins_total") == 2
        assert _instance_stat(owner, "http", "relay_joins_total") == 0
        owner.remove(hw)
        deadline = time.monotonic() + 30
        while _instance_stat(first, "broadcast", "relay_copies") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _instance_stat(first, "broadcast", "relay_copies") == 0
