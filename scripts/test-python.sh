#!/usr/bin/env bash
# The Python package's tests (python/tests, which also run the Python
# examples), in the venv scripts/setup.sh built. Skips print their reason (-rs).
set -uo pipefail
cd "$(dirname "$0")/../python"
../.venv/bin/python -m pytest -q -rs "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    # pytest's "no tests collected": a broken collection, not a pass.
    echo "test-python: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
