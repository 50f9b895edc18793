"""The Python examples run and report what they should."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "python"


@pytest.mark.parametrize(
    "script, transport, mode",
    [("rollout.py", "posix-shm", "view"), ("rollout_http.py", "http", "copy")],
)
def test_rollout(script, transport, mode):
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--workers", "2", "--steps", "2", "--mib", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [l for l in r.stdout.splitlines() if l.startswith("step ")]
    assert len(lines) == 4, r.stdout
    for l in lines:
        assert "checksums match" in l and f"via {transport} ({mode})" in l, l
    assert "/dev/shm after the run: 0 segment(s)" in r.stdout
    assert r.stdout.strip().endswith("ok")
