#!/usr/bin/env bash
# The README's test command: sets up what the tests need (scripts/setup.sh:
# toolchain components, the Python package in .venv/), then runs the Rust
# workspace's tests, the Python package's pytest suite (which also runs
# the Python examples), and the same suite against the wheel a user gets
# from `pip wheel ./python` (scripts/test-wheel.sh). `.ci/run` calls this
# after fmt and clippy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo test --workspace
bash scripts/test-python.sh
bash scripts/test-wheel.sh
