"""The Python examples run and report what they should."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "python"


def run_example(script: str, *args: str, timeout: int = 300) -> tuple[str, list[str]]:
    """Runs an example to its end; asserts it exited 0. Its stdout and the
    lines of it that report a step."""
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, [l for l in r.stdout.splitlines() if l.startswith("step ")]


@pytest.mark.parametrize(
    "script, transport, mode",
    [("rollout.py", "posix-shm", "view"), ("rollout_http.py", "http", "copy")],
)
def test_rollout(script, transport, mode):
    out, lines = run_example(script, "--workers", "2", "--steps", "2", "--mib", "2")
    assert len(lines) == 4, out
    for l in lines:
        assert "checksums match" in l and f"via {transport} ({mode})" in l, l
    assert "/dev/shm after the run: 0 segment(s)" in out
    assert out.strip().endswith("ok")


def test_areal_workers_step_with_areals_own_cleanup():
    """Two real AReaL RPC workers on shardport's backend: every step's
    shards reach the consumer and AReaL's cleanup leaves the producer's
    pool at zero. Needs areal and torch."""
    for mod in ("torch", "areal.api.engine_api"):
        pytest.importorskip(mod, reason=f"{mod} is not importable (AReaL is not installed in CI)")
    out, steps = run_example("areal_steps.py", "--steps", "3")
    assert len(steps) == 3, out
    for l in steps:
        assert "checksum matches" in l and "after AReaL's cleanup 0 shards, pool 0 bytes" in l, l


def test_areal_example_without_areal_says_why():
    try:
        import areal.api.engine_api  # noqa: F401
        import torch  # noqa: F401

        pytest.skip("areal and torch are installed: the example runs for real above")
    except ImportError:
        pass
    out, _ = run_example("areal_steps.py", timeout=60)
    assert "areal_steps: skipped" in out, out


@pytest.mark.parametrize("http", [False, True])
def test_weights_update_keeps_every_rollouts_output_equal_to_the_trainers(http):
    """A trainer and 3 rollout processes, 3 versions: each rollout updates
    its own model in place and its forward pass matches the trainer's;
    old versions are retired as the rollouts commit."""
    args = ["--rollouts", "3", "--steps", "3"] + (["--http"] if http else [])
    out, steps = run_example("weights_update.py", *args)
    assert len(steps) == 3, out
    via = "http" if http else "posix-shm"
    for i, l in enumerate(steps, 1):
        assert "outputs match" in l and f"'{via}'" in l, l
        assert f"versions held [{i}]" in l, l
    assert out.strip().endswith("ok")
