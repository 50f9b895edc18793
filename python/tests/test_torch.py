"""torch interop; skipped with the reason printed where torch is missing."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (optional dependency; too heavy for CI)")


def test_from_dlpack_is_zero_copy_and_a_write_never_crashes(node):
    from helpers import mapping_of

    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    s = node.fetch(node.put(t))
    for u in (torch.from_dlpack(s), s.torch()):
        assert torch.equal(u, t)
        # Zero-copy: a private mapping of the owner's segment.
        assert mapping_of(u.data_ptr()) == mapping_of(np.asarray(s).__array_interface__["data"][0])
        assert mapping_of(u.data_ptr()).startswith("/dev/shm/")
        u.add_(1)  # torch writes in place, ignoring read-only flags: private pages
        assert torch.equal(u, t + 1)
    assert np.array_equal(np.asarray(s), t.numpy())
    assert torch.equal(node.fetch(node.put(t), mode="copy").torch(), t)


def test_bf16_roundtrip(node):
    t = torch.randn(5, 7).to(torch.bfloat16)
    h = node.put(t)
    assert h.dtype == "bfloat16"
    u = node.fetch(h).torch()
    assert u.dtype == torch.bfloat16 and torch.equal(u, t)


def test_strided_and_grad_tensors(node):
    t = torch.randn(6, 6, requires_grad=True)[:, ::2]
    u = node.fetch(node.put(t), mode="copy").torch()
    assert torch.equal(u, t.detach())
