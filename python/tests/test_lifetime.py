"""The zero-copy lease lives exactly as long as the last Python object that
reaches the memory."""

import ctypes
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
    b = np.from_dlpack(s)  # DLPack: a private view of its own, with its own lease
    assert leases(node) == 2
    c = a[10:20]  # a view of a view
    del s
    assert leases(node) == 2
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
    assert leases(node) == 2  # the view's (held by m) and the private view's
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


def test_a_view_is_never_exported_as_writable_shared_memory(prefix):
    """The buffer protocol lends a view read-only (NumPy refuses writes);
    DLPack, which torch imports without honouring read-only flags, lends a
    private copy-on-write view of the same shard: writable, zero-copy until
    written, and a write reaches neither the owner nor any other view."""
    from helpers import config, mapping_of

    with shardport.Node(config(prefix)) as owner, shardport.Node(config(prefix)) as consumer:
        a0 = np.arange(4096, dtype=np.int32)  # 4 pages
        h = owner.put(a0)
        neighbour = owner.put(np.full(16, 7, dtype=np.int32))  # shares a page
        s = consumer.fetch(h, mode="view")
        shared = np.asarray(s)
        assert not shared.flags.writeable
        try:
            shared[0] = 1
        except ValueError as e:
            assert "read-only" in str(e)
        else:
            raise AssertionError("a view's buffer export was writable")
        class Legacy:  # asks for a pre-1.0 capsule, as torch does
            def __dlpack__(self, **_):
                return s.__dlpack__()

            def __dlpack_device__(self):
                return s.__dlpack_device__()

        # Every DLPack door (versioned, legacy) is private. NumPy marks a
        # legacy import read-only (it cannot know better); torch would not.
        for d in (np.from_dlpack(s), np.from_dlpack(Legacy())):
            assert np.array_equal(d, a0)
            addr = d.__array_interface__["data"][0]
            assert addr != shared.__array_interface__["data"][0]
            # Zero-copy: the memory is a mapping of the owner's segment.
            seg = mapping_of(addr)
            assert seg.startswith(f"/dev/shm/{prefix}-") and seg.endswith("-p0"), seg
            assert seg == mapping_of(shared.__array_interface__["data"][0])
            # What a torch user's in-place op does, flag or not: a write
            # through the pointer. Into a read-only mapping it would kill
            # this process.
            ctypes.memset(addr, 0xFF, d.nbytes)
            assert (d == -1).all()
        assert np.from_dlpack(s).flags.writeable  # a versioned import is writable
        # Nothing written reached the view, a new fetch, the owner or the
        # neighbouring shard.
        assert np.array_equal(shared, a0)
        assert np.array_equal(np.asarray(consumer.fetch(h, mode="copy")), a0)
        assert np.array_equal(np.asarray(owner.fetch(h, mode="view")), a0)
        assert np.asarray(consumer.fetch(neighbour, mode="copy")).tolist() == [7] * 16
        # An explicit copy stays a copy.
        c = np.from_dlpack(s, copy=True)
        c[0] = 42
        assert c.flags.writeable and shared[0] == 0


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


def test_a_view_keeps_neither_its_node_nor_its_dlpack_doors_hostage(prefix):
    """A view holds its node weakly: close() does not wait for it, and a
    DLPack export after close (or after the owner removed the shard) lends
    a private copy of the bytes the view's lease still holds; copy=False
    then says a copy is all there is."""
    from helpers import config, leftovers

    n = shardport.Node(config(prefix))
    a = np.arange(1000, dtype=np.int64)
    h = n.put(a)
    s = n.fetch(h)
    n.close()
    assert n.closed
    d = np.from_dlpack(s)
    assert np.array_equal(d, a) and d.flags.writeable
    d[0] = -1
    assert np.asarray(s)[0] == 0
    try:
        s.__dlpack__(copy=False)
    except BufferError as e:
        assert "copy=False" in str(e)
    else:
        raise AssertionError("copy=False was honoured with a copy")
    del s, d
    gc.collect()
    assert leftovers(prefix) == []


def test_dlpack_of_a_view_whose_shard_the_owner_removed(prefix):
    from helpers import config

    with shardport.Node(config(prefix)) as owner, shardport.Node(config(prefix)) as consumer:
        a = np.arange(64, dtype=np.float32)
        h = owner.put(a)
        s = consumer.fetch(h)
        owner.remove(h)  # the lease keeps the bytes; a new fetch would fail
        d = np.from_dlpack(s)
        assert np.array_equal(d, a)
        d[:] = 0
        assert np.array_equal(np.asarray(s), a)
