"""Bad input raises the right exception, names what is wrong, loses nothing."""

import numpy as np
import pytest

import shardport
from shardport import errors


def test_hierarchy():
    for name in errors.__all__:
        cls = getattr(shardport, name)
        if name.endswith("Warning"):
            assert issubclass(cls, shardport.ShardportWarning) and issubclass(cls, UserWarning)
        else:
            assert issubclass(cls, shardport.ShardportError)
    assert issubclass(shardport.env.ExposedWithoutTokenWarning, shardport.ShardportWarning)
    assert issubclass(shardport.UnsupportedObjectError, TypeError)
    assert issubclass(shardport.BadHandleError, ValueError)
    assert issubclass(shardport.NotFoundError, KeyError)
    assert issubclass(shardport.TransportUnavailableError, shardport.TransportError)


def test_truncated_and_garbage_handles(node):
    a = np.arange(16, dtype=np.float32)
    h = node.put(a)
    b = h.to_bytes()
    for bad in (b[:-1], b[: len(b) // 2], b"", b"\x00" * 64, b[:8] + b"\xff" * (len(b) - 8)):
        with pytest.raises(shardport.BadHandleError, match="invalid handle"):
            shardport.Handle.from_bytes(bad)
    # Nothing lost: the shard is still there and intact.
    assert np.array_equal(np.asarray(node.fetch(shardport.Handle.from_bytes(b))), a)
    assert shardport.Handle.from_bytes(b) == h
    assert shardport.Handle.from_json(h.to_json()) == h


def test_object_without_dlpack_or_buffer(node):
    with pytest.raises(shardport.UnsupportedObjectError, match="cannot put a object: it has neither __dlpack__ nor the buffer protocol"):
        node.put(object())
    with pytest.raises(TypeError):
        node.put([1, 2, 3])
    assert node.stats()["shards_owned"] == 0


def test_unsupported_dtypes(node):
    with pytest.raises(shardport.UnsupportedObjectError, match="dtype object"):
        node.put(np.array(["a", None], dtype=object))
    with pytest.raises(shardport.UnsupportedObjectError, match="dtype <U1"):
        node.put(np.array(["a"]))
    with pytest.raises(shardport.InvalidInputError, match="big-endian"):
        node.put(np.arange(3, dtype=">i4"))


def test_non_contiguous_array_is_copied_once_not_refused(node):
    a = np.arange(100, dtype=np.float32).reshape(10, 10)[:, ::3]
    assert not a.flags.c_contiguous
    h = node.put(a)
    assert np.array_equal(np.asarray(node.fetch(h)), a)


def test_closed_node(prefix):
    from helpers import config

    n = shardport.Node(config(prefix))
    h = n.put(np.arange(3))
    n.close()
    n.close()  # idempotent
    assert n.closed
    for call in (lambda: n.put(np.arange(3)), lambda: n.fetch(h), n.stats, n.clear, n.metrics):
        with pytest.raises(shardport.ClosedError, match="closed"):
            call()
    assert "closed" in repr(n)


def test_removed_shard_is_not_found(node):
    h = node.put(np.arange(3))
    assert node.remove([h]) == 1
    assert node.remove(h) == 0
    with pytest.raises(shardport.NotFoundError) as e:
        node.fetch(h)
    assert str(h.id) in str(e.value)


def test_bad_arguments(node):
    h = node.put(np.arange(3))
    with pytest.raises(shardport.InvalidInputError, match='mode must be "view" or "copy"'):
        node.fetch(h, mode="zero-copy")
    with pytest.raises(shardport.InvalidInputError, match="fetch takes a Handle"):
        node.fetch(h.to_bytes())
    with pytest.raises(shardport.InvalidInputError, match="tags must map str to str"):
        node.put(np.arange(3), tags={"a": 1})
    with pytest.raises(shardport.InvalidInputError, match="item 1 is a int"):
        node.fetch_many([h, 3])
    with pytest.raises(shardport.InvalidInputError, match="fetch_cuda takes a Handle"):
        node.fetch_cuda(h.to_bytes())
    # A CPU shard has no GPU memory to view; the error says what to use.
    with pytest.raises(shardport.InvalidInputError, match="is on cpu; fetch it with fetch/fetch_into"):
        node.fetch_cuda(h)


def test_config_errors(tmp_path):
    with pytest.raises(shardport.ConfigError, match="fetch"):
        shardport.Node({"fetch": {"mode": "teleport"}})
    with pytest.raises(shardport.ConfigError, match="invalid TOML"):
        shardport.Node("[node\nname = 1")
    with pytest.raises(shardport.ConfigError, match="cannot read config file"):
        shardport.Node(str(tmp_path / "missing.toml"))
    with pytest.raises(shardport.ConfigError, match="config must be None"):
        shardport.Node(42)


def test_config_from_file_and_text(tmp_path, prefix):
    import shutil

    p = tmp_path / "node.toml"
    text = shardport.DEFAULT_CONFIG.replace("[node]\n", '[node]\nname = "from-file"\n').replace(
        'pool-size = "768MiB"', f'pool-size = "16MiB"\nsegment-prefix = "{prefix}"'
    )
    p.write_text(text)
    with shardport.Node(p) as n:  # plugin paths resolve in the package's plugin dir
        assert n.name == "from-file" and "posix-shm" in n.transports
    with shardport.Node(text.replace("from-file", "from-text")) as n:
        assert n.name == "from-text"
    assert shutil.which  # keep import used


def test_cuda_tensor_without_cuda_ipc_names_why(node):
    torch = pytest.importorskip("torch", reason="torch is not installed (optional dependency)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the cuda-ipc put path cannot be exercised here")
    t = torch.arange(4, device="cuda")
    try:
        h = node.put(t)
    except shardport.TransportUnavailableError as e:
        assert "cuda" in str(e)
    else:
        assert h.device.startswith("cuda")


def test_gpu_put_without_cuda_names_why(prefix):
    """The path a CUDA torch tensor takes (`_put_device`), on a machine with
    no CUDA driver, and on a node without the cuda-ipc plugin."""
    from helpers import config

    with shardport.Node(config(prefix)) as n:
        with pytest.raises(shardport.TransportUnavailableError, match="no transport can export cuda:0 memory") as e:
            n._put_device(0x7F0000000000, 16, "float32", [4], 0)
        if "libcuda" not in str(e.value):
            pytest.skip("a CUDA driver is present here")
        # Both transports that move GPU shards say why they cannot.
        assert "cuda-ipc: cuda-ipc unavailable" in str(e.value)
        assert "http: export of shard" in str(e.value) and "needs the CUDA driver" in str(e.value)
    cfg = config(prefix)
    cfg["plugin"] = [p for p in cfg["plugin"] if p["name"] not in ("cuda-ipc", "http")]
    cfg.pop("route", None)  # the library config routes to http
    with shardport.Node(cfg) as n:
        with pytest.raises(shardport.TransportUnavailableError, match="no loaded transport has the cuda capability"):
            n._put_device(0x7F0000000000, 16, "float32", [4], 0)


def test_help_reads_well():
    for obj in (shardport.Node, shardport.Node.put, shardport.Node.fetch, shardport.Node.fetch_many,
                shardport.Node.stats, shardport.Handle, shardport.Handle.from_bytes, shardport.Shard):
        assert obj.__doc__ and len(obj.__doc__) > 20, obj
    assert shardport.Node.fetch.__text_signature__ == "($self, handle, mode=None)"
