"""Every dtype round-trips bit-exact, in this process and across two."""

import ml_dtypes
import numpy as np
import pytest

import shardport
from helpers import child_fetch, digest, in_child

RNG = np.random.default_rng(12)


def random_bits(dtype, shape):
    """Every bit pattern the dtype's width allows (NaNs and all), not just
    values a float conversion would keep."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return RNG.integers(0, 2, size=shape).astype(np.bool_)
    raw = RNG.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


DTYPES = [
    np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32,
    np.uint64, np.int64, np.float16, np.float32, np.float64,
    np.complex64, np.complex128,
    ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
]


def names(d):
    return np.dtype(d).name


@pytest.mark.parametrize("dtype", DTYPES, ids=names)
def test_same_process_roundtrip(node, dtype):
    a = random_bits(dtype, (3, 5))
    h = node.put(a)
    assert h.dtype == np.dtype(dtype).name
    assert h.shape == (3, 5) and h.nbytes == a.nbytes
    for mode in ("view", "copy"):
        s = node.fetch(h, mode=mode)
        b = np.asarray(s)
        assert b.dtype == a.dtype and b.shape == a.shape
        assert digest(b) == digest(a), mode
        assert b.flags.writeable == (mode == "copy")


def test_every_dtype_across_two_processes(node, prefix, spawn):
    arrays = [random_bits(d, (4, 7)) for d in DTYPES]
    arrays.append(np.array([0, 1, 2**31, 2**32 - 1, 0xDEADBEEF], dtype=np.uint32))
    arrays.append(np.array(3.5, dtype=np.float32))  # 0-d
    arrays.append(np.float64(2.5))  # a NumPy scalar
    arrays.append(np.zeros((0, 3), np.int16))  # empty
    handles = [node.put(a) for a in arrays]
    status, res = in_child(spawn, child_fetch, prefix, [h.to_bytes() for h in handles], "view")
    assert status == "ok", res
    for a, (dt, shape, dig, transport, writeable) in zip(arrays, res):
        assert dt == a.dtype.name and tuple(shape) == np.shape(a)
        assert dig == digest(a), dt
        assert transport == "posix-shm"
        assert not writeable


def test_uint32_is_bit_exact(node):
    """AReaL's RTensor path reads uint32 as float32 and corrupts it; here the
    bits come back unchanged."""
    a = np.array([1, 2, 3, 4, 2**32 - 1, 0x7FC00001], dtype=np.uint32)
    s = node.fetch(node.put(a))
    assert np.asarray(s).dtype == np.uint32
    assert np.array_equal(np.asarray(s), a)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(60, dtype=np.float32).reshape(6, 10)[::2, 1::3],
        lambda: np.arange(24, dtype=np.int64).reshape(2, 3, 4).transpose(2, 0, 1),
        lambda: np.arange(10, dtype=np.float64)[::-1],
        lambda: np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4)),
        lambda: np.arange(12, dtype=ml_dtypes.bfloat16).reshape(3, 4).T,
    ],
    ids=["sliced", "transposed", "reversed", "fortran", "bf16-transposed"],
)
def test_any_layout_is_gathered_in_c_order(node, make):
    a = make()
    b = np.asarray(node.fetch(node.put(a)))
    assert b.shape == a.shape and b.dtype == a.dtype
    assert np.array_equal(b.view(np.uint8), np.ascontiguousarray(a).view(np.uint8))
    assert b.flags.c_contiguous


def test_bytes_memoryview_and_array_module(node):
    import array

    assert np.asarray(node.fetch(node.put(b"abc"))).tobytes() == b"abc"
    assert node.fetch(node.put(bytearray(b"xyz"))).tobytes() == b"xyz"
    mv = memoryview(b"abcdef")[::2]
    assert node.fetch(node.put(mv)).tobytes() == b"ace"
    h = node.put(array.array("f", [1.0, 2.0]))
    assert h.dtype == "float32"
    assert np.asarray(node.fetch(h)).tolist() == [1.0, 2.0]


def test_dlpack_exporter_is_accepted(node):
    class OnlyDlpack:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    a = np.arange(5, dtype=np.int32)
    assert np.array_equal(np.asarray(node.fetch(node.put(OnlyDlpack(a)))), a)


def test_dlpack_and_buffer_exports_are_zero_copy(node):
    from helpers import mapping_of

    a = np.arange(8, dtype=np.float32)
    s = node.fetch(node.put(a), mode="view")
    x, y, z = np.from_dlpack(s), np.asarray(s), np.asarray(memoryview(s))
    # The buffer exports lend the view itself, read-only.
    for v in (y, z):
        assert v.__array_interface__["data"][0] == y.__array_interface__["data"][0]
        assert np.array_equal(v, a) and not v.flags.writeable
    # DLPack lends a private copy-on-write mapping of the same segment.
    assert np.array_equal(x, a) and x.flags.writeable
    xa, ya = x.__array_interface__["data"][0], y.__array_interface__["data"][0]
    assert xa != ya and mapping_of(xa) == mapping_of(ya)
    assert s.__dlpack_device__() == (1, 0)


def test_copy_mode_is_private_and_writable(node):
    a = np.arange(4, dtype=np.int64)
    h = node.put(a)
    c = np.asarray(node.fetch(h, mode="copy"))
    c[0] = 99
    assert np.asarray(node.fetch(h))[0] == 0


def test_bf16_numpy_and_dlpack_errors_are_clear(node):
    s = node.fetch(node.put(np.ones(3, ml_dtypes.bfloat16)))
    assert s.numpy().dtype == ml_dtypes.bfloat16
    with pytest.raises(TypeError, match="bfloat16 has no buffer-protocol format"):
        memoryview(s)


def test_torch_style_dtype_names_and_handle_properties(node):
    h = node.put(np.zeros((2, 3), np.float16), tags={"layer": "7"})
    assert (h.dtype, h.shape, h.nbytes, h.device) == ("float16", (2, 3), 12, "cpu")
    assert h.tags == {"layer": "7"}
    assert h.owner == node.address
    assert "posix-shm" in h.transports
    assert repr(h).startswith("Handle(id=") and "float16" in repr(h) and "(2, 3)" in repr(h)
    assert isinstance(h, shardport.Handle)
    # Shapes read as Python tuples in a fetched shard's repr too.
    for shape, text in [((2, 3), "shape=(2, 3)"), ((5,), "shape=(5,)"), ((), "shape=()")]:
        r = repr(node.fetch(node.put(np.zeros(shape, np.float32))))
        assert r.startswith("Shard(id=") and text in r, r


def test_fetch_into_a_reused_array(node):
    a = np.arange(100, dtype=np.float64)
    h = node.put(a)
    out = np.empty_like(a)
    assert node.fetch_into(h, out) == "posix-shm"
    assert np.array_equal(out, a)
    with pytest.raises(shardport.InvalidInputError, match="destination is 400 bytes"):
        node.fetch_into(h, np.empty(50))
    with pytest.raises(shardport.InvalidInputError, match="writable, C-contiguous"):
        node.fetch_into(h, np.empty((100, 2))[:, 0])


@pytest.mark.parametrize("a", [np.zeros((0, 3), np.int16), np.array(7.5), np.arange(5 << 20, dtype=np.uint8)], ids=["empty", "0-d", "5MiB"])
def test_copy_mode_edge_sizes(node, a):
    for mode in ("copy", "view"):
        s = node.fetch(node.put(a), mode=mode)
        b = np.asarray(s)
        assert b.shape == a.shape and b.dtype == a.dtype and np.array_equal(b, a)
        assert np.array_equal(np.from_dlpack(s), a)
        assert s.nbytes == a.nbytes


def test_buffer_exports_describe_the_memory(node):
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    s = node.fetch(node.put(a))
    m = memoryview(s)
    assert (m.format, m.itemsize, m.shape, m.strides, m.readonly) == ("i", 4, (3, 4), (16, 4), True)
    assert m.c_contiguous and m.nbytes == a.nbytes
    assert m.tolist() == a.tolist()
    assert bytes(s) == a.tobytes()
    with pytest.raises(ValueError, match="WRITEABLE"):
        np.frombuffer(s, dtype=np.int32).setflags(write=True)  # a view is never writable
    del m
    w = node.fetch(node.put(a), mode="copy")
    mw = memoryview(w)
    assert not mw.readonly
    mw.cast("B")[0] = 99
    assert np.asarray(w)[0, 0] == 99


def test_dlpack_versions_and_float8(node):
    # float8 codes exist from DLPack 1.1 on: an older consumer is refused
    # with what to use instead; a 1.1 consumer gets a versioned capsule.
    f8 = node.fetch(node.put(random_bits(ml_dtypes.float8_e4m3fn, (4,))), mode="copy")
    for kwargs in ({}, {"max_version": (0, 8)}, {"max_version": (1, 0)}):
        with pytest.raises(BufferError, match=r"needs DLPack >= 1.1 .*shard.numpy\(\)"):
            f8.__dlpack__(**kwargs)
    assert type(f8.__dlpack__(max_version=(1, 1))).__name__ == "PyCapsule"
    assert type(f8.__dlpack__(max_version=(2, 0))).__name__ == "PyCapsule"
    # A writable copy of any other dtype goes to a legacy consumer too.
    f32 = node.fetch(node.put(np.arange(3, dtype=np.float32)), mode="copy")
    assert type(f32.__dlpack__()).__name__ == "PyCapsule"
