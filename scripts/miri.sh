#!/usr/bin/env bash
# Runs Miri over the unsafe code that calls neither the OS nor a plugin:
# the kit's descriptor codec, lent bytes (lent), the abi's byte views
# (view), and the host's handle decoding (host is forbid(unsafe_code), but
# its decoder runs over abi types). Tests that map memory, open files or
# spawn threads on sockets are outside Miri's reach and are filtered out by
# module. Usage: scripts/miri.sh [extra test-name filter]
set -euo pipefail
# Needs: rustup component add --toolchain nightly miri rust-src
cd "$(dirname "$0")/.."
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "miri: skipped (cargo +nightly miri is not installed)"
    exit 0
fi
# proptest looks up the working directory for its failure file: let that
# one OS call fail softly instead of aborting.
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-strict-provenance -Zmiri-isolation-error=warn-nobacktrace}"
# Proptest cases are slow under Miri: a handful are enough to run the code.
export PROPTEST_CASES="${PROPTEST_CASES:-4}"
echo "== miri: shardport-kit codec, lent"
cargo +nightly miri test -p shardport-kit --lib -- codec:: lent:: ${1:+"$1"}
echo "== miri: shardport-abi view (leased views and allocations over a heap transport)"
cargo +nightly miri test -p shardport-abi --lib -- view:: ${1:+"$1"}
echo "== miri: shardport-host handle"
cargo +nightly miri test -p shardport-host --lib -- handle:: ${1:+"$1"}
