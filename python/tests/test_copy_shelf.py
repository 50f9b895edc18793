"""Copies fetched from Python go back to the node's shelf of copy
destinations (`fetch.copy-buffers`) when the last Python object reaching
them is gone, so the next copy of the same length writes warm memory; and
never while an array, memoryview or DLPack tensor still reaches them."""

import gc

import numpy as np
import pytest

import shardport

from helpers import config

MIB = 1 << 20


def shelf(node):
    gc.collect()
    return node.stats()["copy_buffers"]


def address(x) -> int:
    """Where the bytes of a Shard (or anything NumPy reads) start."""
    return np.frombuffer(x, dtype=np.uint8).ctypes.data


def pattern(n: int, seed: int) -> np.ndarray:
    """Bytes no other pattern of another seed repeats at the same place."""
    return ((np.arange(n, dtype=np.int64) * 7 + seed) % 251).astype(np.uint8)


def consumer_config(prefix, **fetch):
    cfg = config(prefix)
    cfg["fetch"].update(fetch)
    return cfg


@pytest.fixture
def pair(prefix):
    """An owner node and a consumer node: the consumer's shelf holds only
    the copies the test fetches."""
    with shardport.Node(config(prefix)) as owner, shardport.Node(config(prefix)) as consumer:
        yield owner, consumer


def test_a_dropped_copy_is_the_next_copys_destination(pair):
    owner, consumer = pair
    first, second = pattern(MIB, 1), pattern(MIB, 2)
    h1, h2 = owner.put(first), owner.put(second)
    s = consumer.fetch(h1, mode="copy")
    assert s.mode == "copy" and not s.readonly
    at = address(s)
    a = np.asarray(s)
    assert np.array_equal(a, first)
    a[:] = 0xEE  # Python owns the copy and writes into it
    del a
    st = shelf(consumer)
    assert (st["kept"], st["fresh"], st["reused"]) == (0, 1, 0), "the Shard holds it"
    del s
    st = shelf(consumer)
    assert (st["kept"], st["kept_bytes"]) == (1, MIB), "back on the shelf"

    t = consumer.fetch(h2, mode="copy")
    st = shelf(consumer)
    assert (st["kept"], st["fresh"], st["reused"]) == (0, 1, 1)
    assert address(t) == at, "the same memory, handed out again"
    assert np.array_equal(np.asarray(t), second), "holding exactly the new bytes"
    assert not t.readonly
    del t
    assert shelf(consumer)["kept"] == 1


@pytest.mark.parametrize("export", ["numpy", "slice", "memoryview", "dlpack"])
def test_a_live_export_keeps_its_buffer_off_the_shelf(pair, export):
    owner, consumer = pair
    first, second = pattern(MIB, 1), pattern(MIB, 2)
    h1, h2 = owner.put(first), owner.put(second)
    s = consumer.fetch(h1, mode="copy")
    at = address(s)
    if export == "numpy":
        x = np.asarray(s)
    elif export == "slice":
        x = np.asarray(s)[MIB // 2 :]
    elif export == "memoryview":
        x = memoryview(s)
    else:
        x = np.from_dlpack(s)
    expected = first[MIB // 2 :] if export == "slice" else first
    del s
    assert shelf(consumer)["kept"] == 0, f"the {export} export still reaches the copy"
    for _ in range(3):
        t = consumer.fetch(h2, mode="copy")
        assert address(t) != at
        assert np.array_equal(np.asarray(t), second)
        del t
    assert np.array_equal(np.frombuffer(x, dtype=np.uint8), expected), "unchanged"
    st = shelf(consumer)
    # The second and third later fetches reused the first one's buffer.
    assert (st["kept"], st["fresh"], st["reused"]) == (1, 2, 2)
    del x
    st = shelf(consumer)
    assert (st["kept"], st["kept_bytes"]) == (2, 2 * MIB)


def test_fetch_many_copies_go_back_and_are_reused(pair):
    owner, consumer = pair
    hs = [owner.put(pattern(MIB, i)) for i in range(3)]
    out = consumer.fetch_many(hs, mode="copy")
    assert all(s.mode == "copy" and not s.readonly for s in out)
    ats = {address(s) for s in out}
    del out
    st = shelf(consumer)
    assert (st["kept"], st["fresh"]) == (3, 3)
    hs2 = [owner.put(pattern(MIB, 10 + i)) for i in range(3)]
    out = consumer.fetch_many(hs2, mode="copy")
    st = shelf(consumer)
    assert (st["kept"], st["reused"]) == (0, 3)
    assert {address(s) for s in out} == ats
    for i, s in enumerate(out):
        assert np.array_equal(np.asarray(s), pattern(MIB, 10 + i))
    # A single fetch reuses what a batch left, and the other way round.
    del out
    one = consumer.fetch(hs[0], mode="copy")
    assert address(one) in ats and np.array_equal(np.asarray(one), pattern(MIB, 0))
    assert shelf(consumer)["reused"] == 4


def test_the_shelf_bounds_hold_for_python_copies(prefix):
    with (
        shardport.Node(config(prefix)) as owner,
        shardport.Node(consumer_config(prefix, **{"copy-buffers": "2MiB"})) as two,
        shardport.Node(consumer_config(prefix, **{"copy-buffers": 0})) as none,
    ):
        hs = [owner.put(pattern(MIB, i)) for i in range(3)]
        small = owner.put(pattern(1 << 10, 0))
        held = [two.fetch(h, mode="copy") for h in hs] + [two.fetch(small, mode="copy")]
        del held
        st = shelf(two)
        # Over the budget of two: the oldest freed; a small copy not kept.
        assert (st["kept"], st["kept_bytes"], st["dropped"]) == (2, 2 * MIB, 2)
        s = none.fetch(hs[0], mode="copy")
        del s
        st = shelf(none)
        assert (st["kept"], st["dropped"]) == (0, 1)
        t = none.fetch(hs[1], mode="copy")
        assert np.array_equal(np.asarray(t), pattern(MIB, 1))
        assert shelf(none)["reused"] == 0


def test_a_copy_outlives_its_node(prefix):
    with shardport.Node(config(prefix)) as owner:
        h = owner.put(pattern(MIB, 5))
        consumer = shardport.Node(config(prefix))
        s = consumer.fetch(h, mode="copy")
        a = np.asarray(s)
        m = memoryview(s)
        consumer.close()
        del consumer
        gc.collect()
        assert np.array_equal(a, pattern(MIB, 5))
        a[:16] = 1  # still this process's own memory
        assert bytes(m[:16]) == b"\x01" * 16
        del s, m
        gc.collect()
        del a  # the last reference: the node is gone, the bytes are freed
        gc.collect()
        # Another node's copies are unaffected.
        with shardport.Node(config(prefix)) as again:
            t = again.fetch(h, mode="copy")
            assert np.array_equal(np.asarray(t), pattern(MIB, 5))
