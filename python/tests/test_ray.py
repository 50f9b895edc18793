"""The Ray example (examples/python/ray_rollout.py) in a local Ray cluster:
actors are real processes, handles cross Ray as call arguments, and nothing
is left in /dev/shm after ray.shutdown(), also when an actor is killed."""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import leftovers, unique_prefix

ray = pytest.importorskip("ray", reason="ray is not importable (scripts/setup.sh installs it)")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "python" / "ray_rollout.py"


def run_example(*args: str) -> tuple[str, str]:
    prefix = unique_prefix()
    try:
        r = subprocess.run(
            [sys.executable, str(EXAMPLE), "--prefix", prefix, *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        # Checked here too, not only by the example's own report.
        assert leftovers(prefix) == [], "segments left in /dev/shm"
        return r.stdout, prefix
    finally:
        # A failed run must not leave segments for the next test: a node with
        # the same prefix sweeps those of dead owners when it starts.
        if leftovers(prefix):
            import shardport
            from helpers import config

            with shardport.Node(config(prefix)):
                pass


def fetch_lines(out: str) -> list[str]:
    return [l for l in out.splitlines() if l.startswith("step ") and "arrays" in l]


def test_actors_fetch_zero_copy_by_handle_and_a_killed_rollout_leaves_nothing():
    out, _ = run_example("--actors", "2", "--steps", "2", "--mib", "2", "--kill", "rollout")
    lines = fetch_lines(out)
    # 2 steps x 2 actors, then the kill step: the survivor reports its fetch
    # and its re-read after actor 0 died.
    assert len(lines) == 6, out
    for l in lines:
        assert "checksums match" in l and "via posix-shm (view, zero-copy=True)" in l, l
        assert "owner on this node" in l, l
    assert "step 2 actor 0: killed mid-step" in out, out
    assert "step 2: trainer removed 4 shards" in out, out
    assert "/dev/shm after ray.shutdown(): 0 segment(s)" in out, out
    # addr_from="ray": handles name the Ray node's IP as the owner.
    owner = next(l for l in out.splitlines() if l.startswith("trainer: ")).split("owner ")[1]
    assert owner.split(",")[0].rsplit(":", 1)[0] == ray.util.get_node_ip_address(), out
    assert out.strip().endswith("ok")


def test_a_killed_trainer_s_segments_are_swept_and_held_views_stay_valid():
    out, _ = run_example("--actors", "2", "--steps", "1", "--mib", "2", "--kill", "trainer")
    assert "step 1 trainer: killed mid-step" in out, out
    reread = [l for l in fetch_lines(out) if "re-read after the owner died" in l]
    assert len(reread) == 2, out
    assert all("checksums match" in l for l in reread), out
    # Nobody unlinked the dead owner's pool; the next node with the prefix did.
    dead = next(l for l in out.splitlines() if "of the dead trainer" in l)
    assert not dead.startswith("/dev/shm after ray.shutdown(): 0 "), out
    assert "after a node with the same prefix started: 0 segment(s) left" in out, out
    assert out.strip().endswith("ok")


def test_bad_arguments_are_refused():
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), "--actors", "0"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "--actors must be >= 1" in r.stderr


def test_over_http_as_across_machines_with_the_token():
    out, _ = run_example("--actors", "2", "--steps", "2", "--mib", "1", "--http")
    lines = fetch_lines(out)
    assert len(lines) == 4, out
    for l in lines:
        assert "checksums match" in l and "via http (copy, zero-copy=False)" in l, l
    assert "exports ['http']" in out, out
    assert out.strip().endswith("ok")
