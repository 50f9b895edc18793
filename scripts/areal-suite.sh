#!/usr/bin/env bash
# AReaL's own RTensor tests, run twice: with AReaL's stock backend and with
# shardport's (`rtensor.set_backend(ShardportRTensorBackend())`, set in every
# process of the run by scripts/areal/sitecustomize.py). The tests are
# AReaL's code and stay out of this repository: pass a checkout of the AReaL
# repository (inclusionAI/AReaL; commit 5cee735a4 or later, whose rtensor
# code matches areal 1.0.4 on the package index).
#
#   scripts/areal-suite.sh PATH-TO-AREAL-CHECKOUT [PYTHON]
#
# PYTHON (default: python3) must have areal 1.0.4 (`pip install --no-deps
# areal==1.0.4`), what its rtensor code imports (aiohttp, orjson, pydantic,
# flask, httpx, tenacity, colorlog, psutil, torch, and for `import areal`
# torchdata, lark, uvloop, hydra-core, omegaconf, transformers, numba,
# pillow, einops, aiofiles, openai), pytest-asyncio and fastapi 0.115.x.
# This script installs shardport into it from ./python. Without a checkout
# it says why it skips and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
areal=${1:-}
py=${2:-python3}
if [ -z "$areal" ]; then
    echo "areal-suite: skipped (no AReaL checkout given: scripts/areal-suite.sh PATH-TO-AREAL [PYTHON])"
    exit 0
fi
files=(tests/test_rtensor.py tests/experimental/inference_service/test_data_proxy_rtensor.py)
for f in "${files[@]}"; do
    [ -f "$areal/$f" ] || { echo "areal-suite: $areal/$f not found" >&2; exit 2; }
done
# The checkout's own `areal` comes first everywhere (the tests import its
# modules, and the switch below imports AReaL before pytest sets its paths).
areal=$(cd "$areal" && pwd)
export PYTHONPATH="$areal${PYTHONPATH:+:$PYTHONPATH}"
if ! "$py" -c 'import areal.infra.rpc.rtensor' 2>/dev/null; then
    echo "areal-suite: $py cannot import areal.infra.rpc.rtensor (see this script's header)" >&2
    exit 2
fi
"$py" -m pip install -q --disable-pip-version-check --no-deps ./python || exit 2

run() {
    local label=$1
    shift
    local log
    log=$(mktemp)
    (cd "$areal" && env "$@" "$py" -m pytest -q -p no:cacheprovider "${files[@]}" >"$log" 2>&1)
    local summary
    summary=$(grep -E '^[0-9]+ (passed|failed)|passed|failed|error' "$log" | tail -1)
    echo "areal-suite: $label: $summary"
    grep -E '^(FAILED|ERROR) ' "$log" | sed "s/^/areal-suite: $label: /"
    rm -f "$log"
}
run "stock backend" SHARDPORT_AREAL_BACKEND=0
run "shardport backend" SHARDPORT_AREAL_BACKEND=1 PYTHONPATH="$PYTHONPATH:$root/scripts/areal"
