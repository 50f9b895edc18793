#!/usr/bin/env bash
# Installs what building and testing shardport needs on a fresh machine of
# this kind (Debian + rustup toolchain). Idempotent; CI runs it first.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
# The two-node test joins two network namespaces with a veth pair (`ip netns`).
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
    else
        echo "setup: missing ${need_apt[*]}; install them (needs root)" >&2
        exit 1
    fi
fi

# promtool (Prometheus' own checker) for the alerting rules' test
# (python/tests/test_monitoring.py): the Debian package's binary, unpacked
# into .tools/ (git-ignored) and never installed: no Prometheus server, no
# service started. Where apt cannot fetch it the test skips with its reason.
fetch_promtool() {
    (cd "$tools_tmp" && apt-get download -qq -o Acquire::Retries=0 -o Acquire::http::Timeout=20 \
        prometheus >/dev/null 2>&1)
}
if ! command -v promtool >/dev/null 2>&1 && ! [ -x .tools/prometheus/usr/bin/promtool ] &&
    command -v apt-get >/dev/null 2>&1; then
    tools_tmp=$(mktemp -d)
    # A fresh container may have no package lists yet: update them once (root).
    if { fetch_promtool || { [ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null 2>&1 && fetch_promtool; }; } &&
        mkdir -p .tools && dpkg-deb -x "$tools_tmp"/prometheus_*.deb .tools/prometheus; then
        rm -rf .tools/prometheus/usr/share .tools/prometheus/etc .tools/prometheus/usr/bin/prometheus
    else
        echo "setup: could not fetch promtool (apt-get download prometheus); the rules check will skip" >&2
    fi
    rm -rf "$tools_tmp"
fi

# rustfmt and clippy come with the machine's toolchain; add them if a
# minimal profile left them out.
for comp in rustfmt clippy; do
    if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1; then
        rustup component add "$comp"
    fi
done

# /dev/shm must be a writable tmpfs: the posix-shm transport lives there.
if ! [ -w /dev/shm ]; then
    echo "setup: /dev/shm is not writable; shared-memory tests cannot run" >&2
    exit 1
fi

# ---------------------------------------------------------------------------
# The Python package (python/): a venv under the repository (.venv/, git-
# ignored) with the test dependencies from the Python package index, the
# transport plugins copied into the package, and the extension built in place
# by `maturin develop` (editable install). Incremental: cargo reuses target/.
# SHARDPORT_PY_PROFILE=release builds optimised (benchmarks); default: debug,
# which shares the artifacts `cargo test --workspace` builds.
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "setup: the Python package needs CPython >= 3.11 ($PY is $("$PY" --version 2>&1))" >&2
    exit 1
fi
if ! [ -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c 'import maturin, numpy, ml_dtypes, pytest' 2>/dev/null; then
    .venv/bin/python -m pip install -q --disable-pip-version-check \
        'maturin>=1.16,<2' 'numpy>=2.1' 'ml_dtypes>=0.4' 'pytest>=7'
fi
# Test dependencies of the engine integrations (docs/engines.md): PyYAML for
# the Kubernetes manifest checks, Ray for the Ray example and its tests. Ray
# has no wheel for some platforms and Python versions: then its tests skip
# with their reason, and setup goes on. torch is not installed here (its
# wheels are several GB); the torch tests skip without it.
if ! .venv/bin/python -c 'import yaml' 2>/dev/null; then
    .venv/bin/python -m pip install -q --disable-pip-version-check 'pyyaml>=6,<7'
fi
if ! .venv/bin/python -c 'import ray' 2>/dev/null; then
    .venv/bin/python -m pip install -q --disable-pip-version-check 'ray>=2.40,<3' ||
        echo "setup: ray did not install; the Ray tests will skip" >&2
fi
profile=${SHARDPORT_PY_PROFILE:-debug}
release_flag=()
[ "$profile" = release ] && release_flag=(--release)
cargo build -q "${release_flag[@]}" -p shardport-posix-shm -p shardport-http -p shardport-cuda-ipc
target_dir=$(cargo metadata --format-version 1 --no-deps | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
mkdir -p python/python/shardport/_plugins
for so in libshardport_posix_shm.so libshardport_http.so libshardport_cuda_ipc.so; do
    cp -f "$target_dir/$profile/$so" python/python/shardport/_plugins/
done
if ! log=$(cd python && SHARDPORT_PLUGINS_PREBUILT=1 VIRTUAL_ENV="$PWD/../.venv" PATH="$PWD/../.venv/bin:$PATH" \
    maturin develop -q "${release_flag[@]}" 2>&1); then
    echo "$log" >&2
    echo "setup: maturin develop failed" >&2
    exit 1
fi
.venv/bin/python -c 'import shardport' || { echo "setup: the shardport Python package does not import" >&2; exit 1; }
