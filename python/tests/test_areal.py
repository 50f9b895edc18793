"""The AReaL-style adapter: same surface as RTensor's storage backend."""

import asyncio
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

import shardport
from helpers import config
from shardport.areal import ShardportRTensorBackend


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
        with pytest.raises(shardport.NotFoundError):
            be.fetch([ids[0]])
        assert be.remove(ids) == 3 and be.storage_stats()["num_tensors"] == 0


def test_view_mode_and_bad_ids(prefix):
    with ShardportRTensorBackend(config=config(prefix), mode="view") as be:
        sid = be.store(np.arange(4.0))
        v = be.fetch([sid])[0]
        assert not v.flags.writeable and v.tolist() == [0.0, 1.0, 2.0, 3.0]
        del v
        with pytest.raises(shardport.BadHandleError):
            be.fetch(["6f0c-not-ours"])
        with pytest.raises(shardport.BadHandleError):
            be.fetch([sid[:-10]])
    with pytest.raises(ValueError):
        ShardportRTensorBackend(mode="zero")
