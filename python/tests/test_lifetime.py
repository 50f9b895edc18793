"""The zero-copy lease lives exactly as long as the last Python object that
reaches the memory."""

import gc

import numpy as np

import shardport


def leases(node):
    gc.collect()
    return node.stats()["leases_active"]


def test_lease_follows_the_last_numpy_array(node):
    h = node.put(np.arange(1000, dtype=np.float64))
    assert leases(node) == 0
    s = node.fetch(h, mode="view")
    assert s.mode == "view" and s.readonly
    assert leases(node) == 1
    a = np.asarray(s)  # buffer protocol
    b = np.from_dlpack(s)  # DLPack
    c = a[10:20]  # a view of a view
    del s
    assert leases(node) == 1
    del a, b
    assert leases(node) == 1, "c still reaches the memory"
    assert c[0] == 10.0
    del c
    assert leases(node) == 0


def test_lease_of_memoryview_and_unconsumed_capsule(node):
    h = node.put(np.arange(10, dtype=np.int32))
    s = node.fetch(h)
    m = memoryview(s)
    cap = s.__dlpack__(max_version=(1, 0))  # never consumed: its destructor releases
    del s
    assert leases(node) == 1
    del m
    assert leases(node) == 1
    del cap
    assert leases(node) == 0


def test_copy_mode_holds_no_lease(node):
    h = node.put(np.arange(10))
    s = node.fetch(h, mode="copy")
    assert s.mode == "copy" and not s.readonly
    assert leases(node) == 0
    del s


def test_removed_shard_stays_readable_while_leased(node):
    a = np.arange(100, dtype=np.int64)
    h = node.put(a)
    v = np.asarray(node.fetch(h))
    assert node.remove(h) == 1
    assert node.stats()["shards_owned"] == 0
    # Reclaim waits for the lease: the bytes are still the shard's.
    node.put(np.full(100, -1, dtype=np.int64))
    assert np.array_equal(v, a)
    del v
    assert leases(node) == 0


def test_views_outlive_a_closed_node(prefix):
    from helpers import config

    n = shardport.Node(config(prefix))
    a = np.arange(50, dtype=np.float32)
    v = np.asarray(n.fetch(n.put(a)))
    n.close()
    assert np.array_equal(v, a)
    del v
    gc.collect()


def test_fetch_many_and_drain(node):
    hs = [node.put(np.full(4, i, dtype=np.int32)) for i in range(5)]
    out = node.fetch_many(hs)
    assert [int(np.asarray(s)[0]) for s in out] == list(range(5))
    assert leases(node) == 5
    del out
    assert leases(node) == 0
    copies = node.fetch_many(hs, mode="copy")
    assert all(s.mode == "copy" for s in copies)
    assert node.drain() == 0  # cache policy "none": nothing cached


def test_two_nodes_owner_and_consumer_lease_counts(prefix):
    """Owner and consumer are different nodes (their own transports): the
    consumer's lease count and the owner's count of leases on its shards
    both follow the last array."""
    from helpers import config

    def owner_leases(n):
        gc.collect()
        st = n.stats()
        return sum(p["stats"].get("leases_held_on_owner", 0) for p in st["plugins"])

    with shardport.Node(config(prefix)) as owner, shardport.Node(config(prefix)) as consumer:
        h = owner.put(np.arange(256, dtype=np.uint16))
        a = np.from_dlpack(consumer.fetch(h))
        assert leases(consumer) == 1 and owner_leases(owner) == 1
        assert leases(owner) == 0
        b = a[::2]
        del a
        assert leases(consumer) == 1 and owner_leases(owner) == 1
        del b
        assert leases(consumer) == 0 and owner_leases(owner) == 0


def test_a_view_is_never_exported_as_writable_memory(node):
    h = node.put(np.arange(16, dtype=np.int32))
    s = node.fetch(h, mode="view")
    # DLPack before 1.0 cannot mark memory read-only: refused, not handed
    # out writable over a read-only mapping.
    try:
        s.__dlpack__()
    except BufferError as e:
        assert "read-only" in str(e)
    else:
        raise AssertionError("a read-only view was exported as a legacy capsule")
    # DLPack 1.0 says read-only; NumPy then gives a read-only array.
    a = np.from_dlpack(s)
    assert not a.flags.writeable
    assert a[3] == 3
    # A copy may be writable.
    c = np.from_dlpack(s, copy=True)
    c[0] = 42
    assert c.flags.writeable and np.asarray(s)[0] == 0


def _own_and_hang(cfg, q) -> None:
    """Child: puts a shard, reports its handle, then waits to be killed."""
    import time

    with shardport.Node(cfg) as n:
        h = n.put(np.arange(4096, dtype=np.uint8))
        q.put(h.to_bytes())
        time.sleep(120)


def test_sweep_reclaims_the_segments_of_a_killed_owner(prefix, spawn):
    import os
    import signal

    from helpers import config, leftovers

    cfg = config(prefix)
    # The sweeper starts first: its own start-up sweep finds nothing yet.
    with shardport.Node(cfg) as n:
        q = spawn.Queue()
        p = spawn.Process(target=_own_and_hang, args=(cfg, q))
        p.start()
        shardport.Handle.from_bytes(q.get(timeout=60))
        assert leftovers(prefix), "the owner made its pool"
        os.kill(p.pid, signal.SIGKILL)
        p.join(timeout=30)
        report = n.sweep()
        assert report["posix-shm"]["segments_swept"] >= 2, report
        # What is left is this node's own (it put nothing: maybe nothing).
        mine = [s for s in leftovers(prefix) if str(os.getpid()) in s]
        assert leftovers(prefix) == mine
