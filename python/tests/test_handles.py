"""Handles are picklable and ride a multiprocessing queue to another process."""

import pickle

import pytest

import numpy as np

import shardport
from helpers import child_fetch_pickled, digest


def test_pickle_roundtrip(node):
    h = node.put(np.arange(6, dtype=np.int16).reshape(2, 3))
    h2 = pickle.loads(pickle.dumps(h, protocol=pickle.HIGHEST_PROTOCOL))
    assert h2 == h and hash(h2) == hash(h) and repr(h2) == repr(h)
    assert {h: 1}[h2] == 1


def test_pickled_handle_across_processes(node, prefix, spawn):
    arrays = [np.random.default_rng(i).standard_normal((64, 32)).astype(np.float32) for i in range(3)]
    q_in, q_out = spawn.Queue(), spawn.Queue()
    p = spawn.Process(target=child_fetch_pickled, args=(prefix, q_in, q_out))
    p.start()
    hs = [node.put(a) for a in arrays]
    for h in hs:
        q_in.put(h)
    q_in.put(None)
    got = [q_out.get(timeout=120) for _ in hs]
    p.join(60)
    assert p.exitcode == 0
    for h, a, r in zip(hs, arrays, got):
        assert r[0] == "ok", r
        assert r[1] == h.id and r[2] == digest(a)
        assert r[3] == "posix-shm" and "zero-copy" in r[4]


def test_stats_and_metrics(node):
    h = node.put(np.arange(10, dtype=np.float32))
    node.fetch(h)
    st = node.stats()
    assert st["shards_owned"] == 1 and st["bytes_owned"] == 40
    assert {p["name"] for p in st["plugins"]} >= {"posix-shm"}
    assert "posix-shm" in st["transports"]
    m = node.metrics()
    assert "shardport_" in m and "posix-shm" in m
    assert isinstance(shardport.__version__, str)


def test_a_node_without_config_has_a_unique_name_and_no_fixed_port():
    # The library default is not the demo's: no shared name, no port 7070.
    with shardport.Node() as a, shardport.Node() as b:
        assert a.name != b.name
        assert a.name.startswith("node-") and b.name.startswith("node-")
        h = a.put(np.arange(3, dtype=np.int32))
        assert h.owner == "127.0.0.1:0"
        assert np.asarray(b.fetch(h)).tolist() == [0, 1, 2]
    assert "7070" not in shardport.DEFAULT_CONFIG
    assert "name" not in shardport.default_config()["node"]


def test_base64url_form_round_trips_and_refuses_garbage(node):
    import base64

    h = node.put(np.arange(5, dtype=np.int16))
    text = h.to_base64url()
    assert text == base64.urlsafe_b64encode(h.to_bytes()).decode("ascii")
    assert shardport.Handle.from_base64url(text) == h
    for bad in ("!!!!", text[:-4], "", text[:-8]):
        with pytest.raises(shardport.BadHandleError, match="invalid handle"):
            shardport.Handle.from_base64url(bad)
