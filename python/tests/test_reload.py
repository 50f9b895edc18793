"""Node.reload: a new config under a live node, shards kept, bad configs refused."""

import copy

import numpy as np
import pytest

import shardport

from helpers import config


def test_reload_applies_a_new_policy_and_keeps_shards(prefix):
    cfg = config(prefix)
    with shardport.Node(cfg) as node:
        a = np.arange(1024, dtype=np.float32)
        h = node.put(a)
        same = node.reload(copy.deepcopy(cfg))
        assert same["generation"] == 1
        assert same["changes"] == [], "the same config changes nothing"
        nxt = copy.deepcopy(cfg)
        nxt["cache"] = {"policy": "lru", "max-bytes": "1MiB"}
        report = node.reload(nxt)
        assert report["generation"] == 2
        assert report["changes"] == ['cache.policy: "none" -> "lru"', 'cache.max-bytes: none -> "1MiB"'], report
        assert node.stats()["generation"] == 2
        # The shard put under the first config is still served.
        assert np.array_equal(np.asarray(node.fetch(h, mode="copy")), a)


def test_a_refused_reload_raises_config_error_and_the_node_keeps_serving(prefix):
    cfg = config(prefix)
    with shardport.Node(cfg) as node:
        h = node.put(np.ones(16, dtype=np.int64))
        bad = copy.deepcopy(cfg)
        bad["fetch"] = {"mode": "sideways"}
        with pytest.raises(shardport.ConfigError, match="sideways"):
            node.reload(bad)
        renamed = copy.deepcopy(cfg)
        renamed.setdefault("node", {})["name"] = "someone-else"
        with pytest.raises(shardport.ConfigError, match="restart"):
            node.reload(renamed)
        # Started from a dict: there is no file to read again.
        with pytest.raises(shardport.ConfigError, match="name a config file"):
            node.reload()
        assert node.stats()["generation"] == 0
        assert np.asarray(node.fetch(h)).sum() == 16
