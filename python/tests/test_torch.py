"""torch interop; skipped with the reason printed where torch is missing."""

import numpy as np
import pytest

import shardport

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


def test_a_weights_update_lands_in_a_modules_parameters_in_place(node):
    """A torch module's parameters (float32 and bfloat16, one stored
    transposed) take a published state dict in place: same storage, the
    trainer's values, and a mismatched module changes nothing."""
    from shardport import weights

    def model(seed):
        torch.manual_seed(seed)
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))
        m[1].to(torch.bfloat16)
        return m

    trainer, rollout = model(0), model(1)
    # One parameter of the rollout lives transposed in memory.
    w = rollout[2].weight
    rollout[2].weight = torch.nn.Parameter(w.detach().t().contiguous().t())
    assert not rollout[2].weight.is_contiguous()
    ptrs = {k: v.data_ptr() for k, v in rollout.state_dict().items()}
    pub = weights.Publisher(node)
    m = pub.publish(trainer, version=1)
    rx = weights.Receiver(node, into=rollout)
    rx.update(m)
    for k, v in rollout.state_dict().items():
        assert torch.equal(v, trainer.state_dict()[k]), k
        assert v.data_ptr() == ptrs[k], f"{k} updated in place"
    x = torch.randn(4, 16)
    with torch.no_grad():
        rollout[1].float(), trainer[1].float()
        assert torch.equal(rollout(x), trainer(x))
    other = torch.nn.Sequential(torch.nn.Linear(16, 33))
    before = [p.clone() for p in other.parameters()]
    with pytest.raises(shardport.InvalidInputError, match="do not fit"):
        weights.Receiver(node, into=other).update(m)
    assert all(torch.equal(a, b) for a, b in zip(before, other.parameters()))
