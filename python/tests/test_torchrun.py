"""The torchrun example (examples/python/torchrun_broadcast.py): rank 0 puts
tensors and broadcasts only handles (gloo, CPU); every rank fetches and
checks. Needs torch, which CI does not install (its wheels are several GB):
skipped with the reason where torch is not importable."""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import leftovers, unique_prefix

pytest.importorskip("torch", reason="torch is not importable (CI does not install it: too big)")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "python" / "torchrun_broadcast.py"


def test_rank0_broadcasts_handles_and_every_rank_fetches():
    prefix = unique_prefix()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",  # a free rendezvous port on localhost
            "--nproc_per_node=2",
            str(EXAMPLE),
            "--prefix",
            prefix,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = sorted(l for l in r.stdout.splitlines() if l.startswith("rank "))
    assert [l.split(" (")[0] for l in lines] == ["rank 0", "rank 1"], r.stdout
    for rank, l in enumerate(lines):
        assert f"(rank{rank})" in l, l  # the node's name from torchrun's RANK
        assert "4 tensors checksums match" in l and "via posix-shm (view)" in l, l
    assert "/dev/shm after the run: 0 segment(s)" in r.stdout
    assert r.stdout.strip().endswith("ok")
    assert leftovers(prefix) == []


def test_outside_torchrun_it_says_how_to_run_it():
    r = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "run me under torchrun" in r.stderr
