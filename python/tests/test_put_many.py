"""Node.put_many: many shards in one call, in order, each copied once."""

import ml_dtypes
import numpy as np
import pytest

import shardport


def test_put_many_returns_handles_in_order_for_mixed_objects(node):
    arrays = [
        np.arange(1024, dtype=np.int64),
        np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2],  # strided
        np.ones(7, dtype=ml_dtypes.bfloat16),
        np.array(3.5),
    ]
    objs = [*arrays, b"raw bytes", memoryview(bytearray(b"view"))]
    hs = node.put_many(objs, tags={"step": "7"})
    assert len(hs) == len(objs)
    assert len({h.id for h in hs}) == len(objs)
    for a, h in zip(arrays, hs):
        got = np.asarray(node.fetch(h, mode="copy"))
        assert got.dtype == a.dtype and got.shape == a.shape
        assert np.array_equal(got.astype(np.float64), np.asarray(a).astype(np.float64))
        assert h.tags == {"step": "7"}
    assert bytes(np.asarray(node.fetch(hs[4], mode="copy"))) == b"raw bytes"
    assert bytes(np.asarray(node.fetch(hs[5], mode="copy"))) == b"view"
    assert node.stats()["shards_owned"] == len(objs)


def test_put_many_of_many_small_shards(node):
    xs = [np.full(1024, i, dtype=np.int32) for i in range(500)]
    hs = node.put_many(xs)
    fetched = node.fetch_many(hs, mode="copy")
    assert [int(np.asarray(f)[0]) for f in fetched] == list(range(500))


def test_put_many_refuses_bad_input_before_putting_anything(node):
    good = np.zeros(16, dtype=np.float32)
    big_endian = np.zeros(16, dtype=">f4")
    with pytest.raises(shardport.InvalidInputError):
        node.put_many([good, big_endian])
    with pytest.raises(shardport.UnsupportedObjectError):
        node.put_many([good, object()])
    assert node.stats()["shards_owned"] == 0
    assert node.put_many([]) == []
