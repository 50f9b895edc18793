#!/usr/bin/env bash
# shardport as verl's checkpoint engine (python/python/shardport/verl.py),
# driven by verl's own code: scripts/verl_check.py. verl stays out of this
# repository: this installs it from the package index into PYTHON
# (`--no-deps`, with the modules `verl.checkpoint_engine` imports), and
# shardport from ./python.
#
#   scripts/verl-suite.sh [PYTHON]
#
# PYTHON (default: python3) must have torch. Without torch it says why it
# skips and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${1:-python3}
if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "verl-suite: skipped ($py has no torch; verl's checkpoint engines need it)"
    exit 0
fi
pip() { "$py" -m pip install -q --disable-pip-version-check "$@"; }
pip --no-deps 'verl==0.9.1' || exit 2
# What `import verl.checkpoint_engine.base` needs.
pip ray tensordict omegaconf transformers codetiming orjson uvicorn fastapi pyyaml || exit 2
pip --no-deps ./python || exit 2
"$py" scripts/verl_check.py
