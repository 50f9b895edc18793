"""shardport.weights: a state dict published in buckets, received in place,
verified against the publisher's hashes, all or nothing. Receivers run in
this process (posix-shm views, http copies) and in spawned processes; the
failure cases check that the receiver's arrays and version are exactly as
they were."""

import pickle

import ml_dtypes
import numpy as np
import pytest

import shardport
from shardport import weights

from helpers import config, in_child


def state_dict(seed: int) -> dict:
    """A small model's worth of mixed tensors: big matrices, small biases,
    bfloat16, an int buffer."""
    rng = np.random.default_rng(seed)
    sd = {}
    for i in range(6):
        sd[f"layers.{i}.attn.weight"] = rng.standard_normal((128, 256)).astype(np.float32)
        sd[f"layers.{i}.attn.bias"] = rng.standard_normal(256).astype(np.float32)
        sd[f"layers.{i}.ln.weight"] = rng.standard_normal(128).astype(ml_dtypes.bfloat16)
    sd["embed.weight"] = rng.standard_normal((1000, 64)).astype(np.float32)
    sd["steps"] = np.array([seed], dtype=np.int64)
    return sd


def zeros_like(sd: dict) -> dict:
    return {k: np.zeros_like(v) for k, v in sd.items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)) for k in a
    )


def http_only(prefix: str) -> dict:
    cfg = config(prefix)
    cfg["plugin"] = [p for p in cfg["plugin"] if p["name"] == "http"]
    cfg.pop("route", None)
    cfg.pop("experiment", None)
    cfg["put"] = {"storage": "heap"}
    return cfg


def test_an_update_lands_every_tensor_in_place_and_says_how(prefix):
    sd = state_dict(1)
    with shardport.Node(config(prefix)) as owner, shardport.Node(config(prefix)) as node:
        pub = weights.Publisher(owner, bucket_size="256KiB")
        m = pub.publish(sd, version=1)
        assert m.version == 1 and len(m) == len(sd)
        assert 2 <= m.num_buckets < len(sd), "small tensors share buckets"
        # Per tensor beyond its name and shape: tens of bytes at most.
        names = sum(len(k) for k in sd)
        assert len(m.to_bytes()) < names + 16 * len(sd) + 260 * m.num_buckets
        dst = zeros_like(sd)
        ptrs = {k: v.ctypes.data for k, v in dst.items()}
        rx = weights.Receiver(node, into=dst)
        assert rx.version is None
        report = rx.update(m.to_bytes())
        assert same(dst, sd)
        assert {k: v.ctypes.data for k, v in dst.items()} == ptrs, "written in place"
        assert rx.version == 1
        assert report["changed"] and report["tensors"] == len(sd)
        assert report["buckets"] == m.num_buckets and report["bytes"] == m.nbytes
        assert report["transports"] == {"posix-shm": m.num_buckets}
        # Views of the owner's own memory on this machine are not hashed by default.
        assert report["verified"] == 0
        again = rx.update(m)
        assert not again["changed"] and rx.version == 1


def test_over_http_every_bucket_is_verified_and_a_receiver_can_skip_versions(prefix):
    with shardport.Node(http_only(prefix)) as owner, shardport.Node(http_only(prefix)) as node:
        pub = weights.Publisher(owner, bucket_size="128KiB", keep_versions=3)
        m1 = pub.publish(state_dict(1), 1)
        pub.publish(state_dict(2), 2)
        m3 = pub.publish(state_dict(3), 3)
        dst = zeros_like(state_dict(0))
        rx = weights.Receiver(node, into=dst, verify="always")
        r = rx.update(m3)
        assert same(dst, state_dict(3)) and rx.version == 3
        assert r["verified"] == r["buckets"] == m3.num_buckets
        assert r["transports"] == {"http": m3.num_buckets}
        with pytest.raises(shardport.StaleVersionError, match="version 1 is older than the committed version 3"):
            rx.update(m1)
        assert same(dst, state_dict(3))


def test_a_strided_destination_and_a_pickled_manifest(prefix):
    sd = {"w": np.arange(24, dtype=np.float32).reshape(4, 6), "b": np.ones(3, np.float32)}
    with shardport.Node(config(prefix)) as owner, shardport.Node(config(prefix)) as node:
        pub = weights.Publisher(owner)
        m = pub.publish(sd, 5)
        m = pickle.loads(pickle.dumps(m))
        # "w" lives transposed in the receiver's memory (a column-major tensor).
        storage = np.zeros((6, 4), np.float32)
        dst = {"w": storage.T, "b": np.zeros(3, np.float32)}
        weights.Receiver(node, into=dst).update(m)
        assert np.array_equal(storage.T, sd["w"]) and np.array_equal(dst["b"], sd["b"])


def test_a_manifest_of_another_model_changes_nothing_and_names_each_tensor(prefix):
    sd = state_dict(1)
    with shardport.Node(config(prefix)) as owner, shardport.Node(config(prefix)) as node:
        pub = weights.Publisher(owner)
        m = pub.publish(sd, 1)
        dst = zeros_like(sd)
        dst["embed.weight"] = np.zeros((999, 64), np.float32)
        dst["extra"] = np.zeros(4, np.float32)
        del dst["steps"]
        rx = weights.Receiver(node, into=dst)
        with pytest.raises(shardport.InvalidInputError) as e:
            rx.update(m)
        text = str(e.value)
        assert '"embed.weight": shape [1000, 64] published, [999, 64] here' in text, text
        assert '"steps": in version 1 but not in this receiver' in text, text
        assert '"extra": not in version 1' in text, text
        assert all(not v.any() for v in dst.values()) and rx.version is None
        # A rank holding part of the model takes only its tensors.
        part = {"layers.0.attn.weight": np.zeros((128, 256), np.float32)}
        weights.Receiver(node, into=part, partial=True).update(m)
        assert np.array_equal(part["layers.0.attn.weight"], sd["layers.0.attn.weight"])


def _flip_first_hash(data: bytes) -> bytes:
    """Flips a bit of bucket 0's hash (the layout is in the manifest docs)."""

    def varint(at: int) -> tuple[int, int]:
        v, shift = 0, 0
        while True:
            b = data[at]
            v |= (b & 0x7F) << shift
            at += 1
            if not b & 0x80:
                return v, at
            shift += 7

    _, at = varint(5)  # version
    _, at = varint(at)  # bucket count
    hlen, at = varint(at)
    at += hlen
    out = bytearray(data)
    out[at] ^= 1
    return bytes(out)


def test_bytes_that_do_not_match_the_publishers_hash_change_nothing(prefix):
    with shardport.Node(http_only(prefix)) as owner, shardport.Node(http_only(prefix)) as node:
        pub = weights.Publisher(owner, bucket_size="64KiB")
        m1 = pub.publish(state_dict(1), 1)
        m2 = pub.publish(state_dict(2), 2)
        dst = zeros_like(state_dict(0))
        rx = weights.Receiver(node, into=dst)
        rx.update(m1)
        forged = weights.Manifest.from_bytes(_flip_first_hash(m2.to_bytes()))
        with pytest.raises(shardport.IntegrityError, match="do not match the publisher's BLAKE3 hash; nothing was changed"):
            rx.update(forged)
        assert same(dst, state_dict(1)) and rx.version == 1
        rx.update(m2)
        assert same(dst, state_dict(2)) and rx.version == 2


def test_truncated_and_foreign_manifests_are_refused():
    with shardport.Node() as owner:
        pub = weights.Publisher(owner)
        data = pub.publish(state_dict(1), 1).to_bytes()
    for cut in (0, 3, 5, len(data) // 2, len(data) - 1):
        with pytest.raises(shardport.BadManifestError, match="bad manifest"):
            weights.Manifest.from_bytes(data[:cut])
    with pytest.raises(shardport.BadManifestError, match="not a weights manifest"):
        weights.Manifest.from_bytes(b"SPHD" + data[4:])


def test_bad_publishes_are_refused_naming_the_tensor(node):
    pub = weights.Publisher(node)
    pub.publish({"a": np.zeros(4, np.float32)}, 3)
    with pytest.raises(shardport.InvalidInputError, match="versions move forward; version 3 was published"):
        pub.publish({"a": np.zeros(4, np.float32)}, 3)
    with pytest.raises(shardport.InvalidInputError, match="'x'.*cannot be published"):
        pub.publish({"x": object()}, 4)
    assert pub.versions == [3]


def test_versions_retire_when_every_receiver_committed_or_the_grace_ran_out(prefix):
    with shardport.Node(config(prefix)) as owner:
        pub = weights.Publisher(owner, keep_versions=3, grace=3600)
        pub.expect(["r0", "r1"])
        pub.publish(state_dict(1), 1)
        pub.publish(state_dict(2), 2)
        assert pub.versions == [1, 2]
        assert pub.committed("r0", 2) == []
        assert pub.committed("r1", 2) == [1], "both moved on: version 1 goes"
        pub.publish(state_dict(3), 3)
        assert pub.forget("r1") == [] and pub.committed("r0", 3) == [2]
        assert pub.versions == [3]
        nothing = weights.Publisher(owner, grace=0)
        nothing.publish(state_dict(1), 10)
        nothing.publish(state_dict(2), 11)
        assert nothing.versions == [11], "no receiver reported: the grace (0 s) decides"
        pub.retire_all()
        nothing.retire_all()
        assert pub.versions == [] == nothing.versions
        assert owner.stats()["shards_owned"] == 0, "every bucket removed"


def receiver_child(prefix: str, manifests: list, out) -> None:
    """Child process: one receiver taking each manifest in turn; reports
    the version and a digest per update, or the error."""
    try:
        with shardport.Node(http_only(prefix)) as node:
            dst = zeros_like(state_dict(0))
            rx = weights.Receiver(node, into=dst)
            seen = []
            for data in manifests:
                try:
                    rx.update(data)
                    seen.append(("ok", rx.version, same(dst, state_dict(rx.version))))
                except shardport.ShardportError as e:
                    seen.append((type(e).__name__, rx.version, str(e)))
            out.put(("ok", seen))
    except BaseException as e:
        out.put(("err", f"{type(e).__name__}: {e}"))


def test_receivers_in_other_processes_and_a_retired_version(prefix, spawn):
    with shardport.Node(http_only(prefix)) as owner:
        pub = weights.Publisher(owner, bucket_size="128KiB", keep_versions=1)
        m1 = pub.publish(state_dict(1), 1).to_bytes()
        m2 = pub.publish(state_dict(2), 2).to_bytes()  # retires 1 (keep_versions=1)
        status, seen = in_child(spawn, receiver_child, prefix, [m2, m1])
        assert status == "ok", seen
        assert seen[0] == ("ok", 2, True)
        assert seen[1][0] == "StaleVersionError" and seen[1][1] == 2
        status, seen = in_child(spawn, receiver_child, prefix, [m1, m2])
        assert status == "ok", seen
        # Version 1 is gone everywhere: its update fails whole, the next lands.
        assert seen[0][0] in ("NotFoundError", "TransportError"), seen
        assert seen[0][1] is None and "nothing was changed" in seen[0][2]
        assert seen[1] == ("ok", 2, True)


def test_tensor_parallel_ranks_take_only_their_parts(prefix):
    """A column-split and a row-split matrix in 2 parts, a bias whole: each
    rank gets its slices and the bias, and fetches only its own buckets."""
    rng = np.random.default_rng(3)
    sd = {
        "qkv.weight": rng.standard_normal((64, 32)).astype(np.float32),  # split along 1
        "proj.weight": rng.standard_normal((32, 64)).astype(np.float32),  # split along 0
        "ln.bias": rng.standard_normal(32).astype(np.float32),
    }
    split = {"qkv.weight": 1, "proj.weight": 0}
    with shardport.Node(http_only(prefix)) as owner, shardport.Node(http_only(prefix)) as node:
        pub = weights.Publisher(owner)
        m = pub.publish(sd, 1, split=split, parts=2)
        assert m.num_buckets == 3, "one bucket of whole tensors and one per part"
        reports = []
        for rank in range(2):
            dst = {
                "qkv.weight": np.zeros((64, 16), np.float32),
                "proj.weight": np.zeros((16, 64), np.float32),
                "ln.bias": np.zeros(32, np.float32),
            }
            reports.append(weights.Receiver(node, into=dst, part=(rank, 2)).update(m))
            assert np.array_equal(dst["qkv.weight"], sd["qkv.weight"][:, rank * 16 : (rank + 1) * 16])
            assert np.array_equal(dst["proj.weight"], sd["proj.weight"][rank * 16 : (rank + 1) * 16])
            assert np.array_equal(dst["ln.bias"], sd["ln.bias"])
        for r in reports:
            assert r["buckets"] == 2 and r["bytes"] < m.nbytes, r
        # A receiver that takes whole tensors is told the tensors came in parts.
        whole = {k: np.zeros_like(v) for k, v in sd.items()}
        with pytest.raises(shardport.InvalidInputError, match='"qkv.weight": published in 2 parts; this receiver takes whole tensors'):
            weights.Receiver(node, into=whole).update(m)
        assert all(not v.any() for v in whole.values())
        with pytest.raises(shardport.InvalidInputError, match="does not split into 3 equal parts"):
            pub.publish(sd, 2, split={"ln.bias": 0}, parts=3)


def test_the_verl_engine_says_what_it_needs_where_verl_is_missing():
    try:
        import torch  # noqa: F401
        import verl  # noqa: F401

        pytest.skip("verl and torch are installed: scripts/verl-suite.sh runs the engine for real")
    except ImportError:
        pass
    with pytest.raises(ImportError, match="shardport.verl needs verl and torch"):
        import shardport.verl  # noqa: F401
