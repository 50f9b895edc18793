"""The AReaL-style adapter: same surface as RTensor's storage backend."""

import asyncio
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

import shardport
from helpers import config
from shardport.areal import ShardportRTensorBackend, ShardportRTensorError, is_shardport_id


@dataclass
class TensorShardInfo:  # AReaL's handle type, as it is shaped there
    shard_id: object
    node_addr: str


def test_store_fetch_batch_and_clear(prefix):
    with ShardportRTensorBackend(max_shards_per_request=2, config=config(prefix)) as be:
        arrays = [
            np.array([1, 2, 3, 4], dtype=np.uint32),  # corrupted by AReaL's path
            np.arange(6, dtype=ml_dtypes.bfloat16).reshape(2, 3),  # upcast there
            np.arange(5, dtype=np.complex64),  # refused there
            np.ones((2, 2), dtype=np.float32),
            np.arange(3, dtype=np.uint16),
        ]
        ids = [be.store(a) for a in arrays]
        assert all(isinstance(i, str) for i in ids)
        assert be.storage_stats() == {"num_tensors": 5, "total_bytes": sum(a.nbytes for a in arrays)}
        shards = [TensorShardInfo(i, be.node.address) for i in ids]
        out = be.fetch(shards)
        for a, b in zip(arrays, out):
            assert b.dtype == a.dtype and b.shape == a.shape
            assert np.array_equal(b.view(np.uint8), a.view(np.uint8))
            assert b.flags.writeable  # copy mode: private tensors, like AReaL's
        assert be.fetch([ids[0]])[0].tolist() == [1, 2, 3, 4]  # plain ids work too
        asyncio.run(be.delete(be.node.address, ids[:2]))
        assert be.storage_stats()["num_tensors"] == 3
        # AReaL's callers catch RuntimeError; the shardport error is the cause.
        with pytest.raises(RuntimeError, match="Failed to fetch shard") as e:
            be.fetch([ids[0]])
        assert isinstance(e.value, ShardportRTensorError)
        assert isinstance(e.value.__cause__, shardport.NotFoundError)
        assert be.remove(ids) == 3 and be.storage_stats()["num_tensors"] == 0


def test_view_mode_and_bad_ids(prefix):
    with ShardportRTensorBackend(config=config(prefix), mode="view") as be:
        sid = be.store(np.arange(4.0))
        v = be.fetch([sid])[0]
        assert not v.flags.writeable and v.tolist() == [0.0, 1.0, 2.0, 3.0]
        del v
        with pytest.raises(ShardportRTensorError) as e:
            be.fetch([sid[:-10]])  # ours, truncated
        assert isinstance(e.value.__cause__, shardport.BadHandleError)
    with pytest.raises(ValueError):
        ShardportRTensorBackend(mode="zero")


class FakeAReaL:
    """Stands in for AReaL's HttpRTensorBackend (the delegate) where AReaL
    is not installed: records what it is asked, serves its own ids."""

    def __init__(self):
        self.store = {"uuid-1": np.arange(3.0), "uuid-2": np.ones(2)}
        self.fetched, self.deleted = [], []

    def fetch(self, shards):
        self.fetched.append([s.shard_id for s in shards])
        try:
            return [self.store[s.shard_id] for s in shards]
        except KeyError as e:
            raise RuntimeError(f"Failed to fetch shard batch: {e}") from None

    async def delete(self, node_addr, ids):
        self.deleted.append((node_addr, list(ids)))


def test_ids_that_are_not_shardports_go_to_areals_backend(prefix):
    fake = FakeAReaL()
    with ShardportRTensorBackend(config=config(prefix), delegate=fake) as be:
        ours = be.store(np.arange(4, dtype=np.int32))
        assert is_shardport_id(ours) and not is_shardport_id("uuid-1")
        shards = [
            TensorShardInfo("uuid-1", "10.0.0.9:1"),
            TensorShardInfo(ours, be.node.address),
            TensorShardInfo("uuid-2", "10.0.0.9:1"),
        ]
        out = be.fetch(shards)
        # In input order; AReaL's ids in one call to AReaL's backend.
        assert out[0].tolist() == [0.0, 1.0, 2.0] and out[2].tolist() == [1.0, 1.0]
        assert out[1].tolist() == [0, 1, 2, 3]
        assert fake.fetched == [["uuid-1", "uuid-2"]]
        asyncio.run(be.delete("10.0.0.9:1", [ours, "uuid-1"]))
        assert fake.deleted == [("10.0.0.9:1", ["uuid-1"])]
        assert be.storage_stats()["num_tensors"] == 0  # ours was removed here
        # AReaL's own errors pass through as AReaL raises them.
        with pytest.raises(RuntimeError, match="Failed to fetch shard batch"):
            be.fetch([TensorShardInfo("uuid-3", "10.0.0.9:1")])


def test_a_foreign_id_without_areal_is_a_clear_error(prefix):
    try:
        import areal  # noqa: F401

        pytest.skip("areal is installed: the delegate exists")
    except ImportError:
        pass
    with ShardportRTensorBackend(config=config(prefix)) as be:
        with pytest.raises(ShardportRTensorError, match="areal is not importable"):
            be.fetch([TensorShardInfo("6f0c-not-ours", "10.0.0.9:1")])


def test_areals_cleanup_reaches_the_owner(prefix, monkeypatch):
    """AReaL's controller deletes through AReaL's HTTP path; the owner's
    handler drops the ids from AReaL's process storage, and the owner's
    backend then removes its shardport shards. AReaL's rtensor module is
    stood in for here (AReaL is not installed in CI; scripts/areal-suite.sh
    runs AReaL's own suite against the real one)."""
    import sys
    import types

    fake = types.ModuleType("areal.infra.rpc.rtensor")
    fake._storage = {}
    fake.store = lambda sid, t: fake._storage.__setitem__(sid, t)
    fake.remove = lambda sid: int(fake._storage.pop(sid, None) is not None)
    monkeypatch.setitem(sys.modules, "areal.infra.rpc.rtensor", fake)
    with ShardportRTensorBackend(config=config(prefix), delegate=FakeAReaL()) as owner:
        # Non-NumPy input is returned as torch: mirrored as AReaL does.
        a = owner.store(bytearray(b"a" * 4096))
        b = owner.store(bytearray(b"b" * 4096))
        assert set(fake._storage) == {a, b}
        assert owner.node.stats()["shards_owned"] == 2
        fake.remove(a)  # what the owner's DELETE /data/clear handler does
        assert owner.storage_stats()["num_tensors"] == 1
        assert owner.node.stats()["shards_owned"] == 1
        # The owner's own remove drops AReaL's entry too.
        assert owner.remove([b]) == 1 and fake._storage == {}
        # A delete called in another process (the controller) goes to the
        # owner through AReaL's backend; one called here removes at once.
        c = owner.store(bytearray(b"c" * 4096))
        http = FakeAReaL()
        with ShardportRTensorBackend(config=config(prefix), delegate=http) as controller:
            asyncio.run(controller.delete("10.0.0.9:1", [c]))
        assert http.deleted == [("10.0.0.9:1", [c])]
        asyncio.run(owner.delete("", [c]))
        assert owner.node.stats()["shards_owned"] == 0 and fake._storage == {}


def test_the_areal_suite_script_says_why_it_does_not_run(tmp_path):
    """scripts/areal-suite.sh runs AReaL's own tests against a checkout of
    AReaL; without one it skips with the reason, with a wrong one it names
    the missing file (the AReaL run itself is recorded in BENCHMARKS.md)."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "areal-suite.sh"
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "skipped (no AReaL checkout given" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(["bash", str(script), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "tests/test_rtensor.py not found" in r.stderr, r.stdout + r.stderr
