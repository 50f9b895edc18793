"""torch interop; skipped with the reason printed where torch is missing."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (optional dependency; too heavy for CI)")


def test_from_dlpack_is_zero_copy(node):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    s = node.fetch(node.put(t))
    u = torch.from_dlpack(s)
    assert torch.equal(u, t)
    assert u.data_ptr() == np.asarray(s).__array_interface__["data"][0]


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
