#!/usr/bin/env bash
# Packs what the GPU checks need into .device-carry/ (git-ignored, < 64 MiB),
# for a GPU machine that has CUDA, nvcc and PyTorch but no Rust toolchain:
#
#   .device-carry/release/shardport                  the CLI (bench, worker)
#   .device-carry/release/libshardport_*.so          the plugins
#   .device-carry/release/examples/cuda_ipc_peer     the two-process GPU peer
#   .device-carry/release/deps/e2e-gpu               the end-to-end test binary
#   .device-carry/release/deps/shardport_cuda_ipc-gpu  cuda-ipc's unit tests
#   .device-carry/release/deps/conformance-gpu         its conformance suite
#   .device-carry/release/deps/shardport_cuda-gpu      the CUDA driver crate's tests
#   .device-carry/release/deps/shardport_cli-gpu       the CLI's unit tests (GPU cells' memory)
#   .device-carry/release/deps/libshardport_http.so  (tests look in deps/; the
#                                                     other plugins are copied
#                                                     there from release/ at run
#                                                     time, to stay under 64 MiB)
#   .device-carry/run-gpu-checks.sh                  what to run there
#
# The layout mirrors target/release so the tests find the .so files and the
# example relative to their own executable. Binaries are stripped.
# Usage: scripts/gpu-carry.sh   (then carry `.device-carry` with the device tool
# and run `bash .device-carry/run-gpu-checks.sh`)
set -euo pipefail
cd "$(dirname "$0")/.."
out=.device-carry/release
rm -rf .device-carry
mkdir -p "$out/deps" "$out/examples"
cargo build --release --quiet -p shardport-cli -p shardport-posix-shm -p shardport-http -p shardport-cuda-ipc -p shardport-faulty-plugin
cargo build --release --quiet -p shardport --example cuda_ipc_peer
# The release plugins (what the CLI and the Python package load), copied
# now: a test build below rewrites the same files in target/.
for so in target/release/libshardport_{posix_shm,http,cuda_ipc,faulty_plugin}.so; do
    cp "$so" "$out/"
done
# Test executables: the e2e binary of the root package and the cuda-ipc
# crate's unit tests (their paths come from cargo's JSON messages).
collect() {
    cargo test --release --no-run --message-format=json "$@" 2>/dev/null |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"] + " " + m["executable"])'
}
mapfile -t tests < <(collect -p shardport --test e2e; collect -p shardport-cuda-ipc --lib --test conformance
    collect -p shardport-cuda --lib; collect -p shardport-cli --lib)
[ "${#tests[@]}" -eq 5 ] || { echo "gpu-carry: expected 5 test binaries, found: ${tests[*]}" >&2; exit 1; }
for t in "${tests[@]}"; do
    name=${t%% *}; exe=${t#* }
    cp "$exe" "$out/deps/${name//-/_}-gpu"
done
cp target/release/shardport "$out/"
cp target/release/examples/cuda_ipc_peer "$out/examples/"
# faulty-plugin: the e2e cuda tests load it (its `unreachable` mode).
# The tests load the plugins of their own build from deps/: there the http
# plugin has the test-only `test-device-is-host` feature (the e2e staging
# tests with host memory standing in need it); the one beside the CLI, which
# the benchmarks and the Python package use, is the release build without it.
# Both http builds write target/release/deps/libshardport_http.so and cargo
# does not rewrite a build it deems fresh, so the test build is forced and
# copied at once, then the release build is made again for target/'s sake.
touch plugins/http/src/lib.rs
cargo build --release --quiet -p shardport-http --features test-device-is-host
cp target/release/deps/libshardport_http.so "$out/deps/"
touch plugins/http/src/lib.rs
cargo build --release --quiet -p shardport-http
refusal="does not accept it"
grep -q "$refusal" "$out/libshardport_http.so" ||
    { echo "gpu-carry: the release http plugin accepts test-device-is-host" >&2; exit 1; }
! grep -q "$refusal" "$out/deps/libshardport_http.so" ||
    { echo "gpu-carry: the tests' http plugin lacks test-device-is-host" >&2; exit 1; }
strip "$out"/shardport "$out"/examples/* "$out"/deps/*-gpu "$out"/*.so "$out"/deps/*.so
cp scripts/bench_torch_ipc.py scripts/bench_fetch_cuda.py scripts/bench_cuda_ipc.sh scripts/probe_cuda_alloc.py .device-carry/
# The Python package (release wheel, unpacked; release plugins inside) and
# its tests, with pytest's pure-Python packages from the venv that
# scripts/setup.sh made, for the CUDA tests in python/tests/test_cuda.py.
if [ -x .venv/bin/maturin ]; then
    wheels=$(mktemp -d)
    (cd python && ../.venv/bin/maturin build --quiet --release -o "$wheels" >/dev/null 2>&1) ||
        { echo "gpu-carry: maturin build failed" >&2; exit 1; }
    mkdir -p .device-carry/py
    .venv/bin/python -m zipfile -e "$wheels"/shardport-*.whl .device-carry/py
    rm -rf "$wheels" .device-carry/py/shardport-*.dist-info
    # The package's plugins are the release ones beside the CLI, copied
    # into _plugins/ at run time (carried once).
    rm -f .device-carry/py/shardport/_plugins/*.so
    strip .device-carry/py/shardport/*.so
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    for pkg in _pytest pytest pluggy iniconfig packaging py.py; do
        cp -r "$site/$pkg" .device-carry/py/
    done
    cp -r python/tests .device-carry/py-tests
else
    echo "gpu-carry: no .venv (run scripts/setup.sh): the Python CUDA tests are not packed" >&2
fi
cat > .device-carry/run-gpu-checks.sh <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine from the repository root: the GPU-gated tests
# (they print "skipped" without a driver), then the benchmarks (Rust
# cuda-ipc, torch IPC, shardport's Python fetch_cuda, with PyTorch's
# default allocator and with expandable segments), and ends by checking
# that /dev/shm holds nothing of shardport's.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
nvidia-smi -L || true
shm_before=$(ls /dev/shm | sort)
# Plugins carried once: the tests' deps/ (http excepted: its test build is
# carried) and the Python package take the release builds.
for so in posix_shm cuda_ipc faulty_plugin; do
    cp "$here/release/libshardport_$so.so" "$here/release/deps/"
done
if [ -d "$here/py" ]; then
    mkdir -p "$here/py/shardport/_plugins"
    cp "$here"/release/libshardport_{posix_shm,http,cuda_ipc}.so "$here/py/shardport/_plugins/"
fi
rc=0
python3 "$here"/probe_cuda_alloc.py || rc=1
"$here"/release/deps/shardport_cuda_ipc-gpu --nocapture --test-threads 1 || rc=1
"$here"/release/deps/e2e-gpu cuda --nocapture --test-threads 1 || rc=1
"$here"/release/deps/conformance-gpu --nocapture --test-threads 1 || rc=1
"$here"/release/deps/e2e-gpu conformance::cuda_ipc --nocapture --test-threads 1 || rc=1
"$here"/release/deps/shardport_cuda-gpu --nocapture --test-threads 1 || rc=1
"$here"/release/deps/shardport_cli-gpu gpu --nocapture --test-threads 1 || rc=1
# The CLI's GPU cells: put_device, the view (fetch_device), the device copy
# (fetch_device_into) and the staged fetch forced over http, each beside its
# same-run limit (cuMemcpyDtoD; the slowest of pinned D2H, raw TCP, pinned H2D).
# A config of its own: no posix-shm pool (the machine's /dev/shm may be
# small, and the GPU paths need none).
cat > "$here/gpu-bench.toml" <<TOML
[node]
name = "gpu-bench"
[put]
storage = "heap"
checksum = "none"
[[plugin]]
name = "http"
path = "$here/release/libshardport_http.so"
[plugin.config]
bind = "127.0.0.1:0"
[[plugin]]
name = "cuda-ipc"
path = "$here/release/libshardport_cuda_ipc.so"
TOML
"$here"/release/shardport bench --config "$here/gpu-bench.toml" \
    --paths cuda-ipc,cuda-copy,cuda-http --sizes 4KiB,1MiB,64MiB,256MiB,1GiB \
    --reps 10 --json "$here/bench-gpu.json" || rc=1
SHARDPORT_BIN_DIR="$here/release" bash "$here"/bench_cuda_ipc.sh || rc=1
python3 "$here"/bench_torch_ipc.py || rc=1
if [ -d "$here/py" ]; then
    # numpy and torch come from the machine; pytest from the carry.
    (cd "$here/py-tests" && PYTHONPATH="$here/py:$here/py-tests" \
        python3 -m pytest -q -rs -p no:cacheprovider test_cuda.py test_torch.py) || rc=1
    PYTHONPATH="$here/py" python3 "$here"/bench_fetch_cuda.py || rc=1
    echo "bench_fetch_cuda with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (VMM memory):"
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH="$here/py" \
        python3 "$here"/bench_fetch_cuda.py || rc=1
fi
# Nothing of shardport's may be left: every node removed its boards and
# segments (torch's own cuda.shm.* files are listed, not judged).
new_files=$(comm -13 <(echo "$shm_before") <(ls /dev/shm | sort))
echo "new in /dev/shm after the checks: ${new_files:-nothing}"
if echo "$new_files" | grep -q shardport; then
    echo "FAIL: shardport files left in /dev/shm" >&2
    rc=1
fi
exit $rc
RUN
chmod +x .device-carry/run-gpu-checks.sh
du -sh .device-carry
