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
