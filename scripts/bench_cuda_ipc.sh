#!/usr/bin/env bash
# GPU benchmark of the cuda-ipc transport (needs a CUDA GPU; prints why and
# exits 0 without one). Two processes of examples/cuda_ipc_peer: the owner
# puts device buffers of each size with Node::put_device, the consumer
# measures, in one run:
#   first_open_us   first fetch_device of a new allocation (cuIpcOpenMemHandle,
#                   event wait, lease) - includes the open
#   cached_p50_us   later fetch_device of the same allocation (handle cached)
#   d2d_fetch_gbs   fetch_device_into (device-to-device copy out of the owner's
#                   allocation, waited for) bandwidth
#   local_dtod_gbs  cuMemcpyDtoD between two of the consumer's own buffers,
#                   the same size, same run: the baseline
# Each size is measured for every allocator in BENCH_ALLOCATORS (default
# `plain vmm:20971520`: cuMemAlloc memory through legacy IPC handles, and
# VMM memory in 20 MiB chunks, as PyTorch's expandable segments allocate,
# through file descriptors).
# Then a GPU shard staged over http to a consumer whose config loads http
# only (as a consumer on another machine would), at 256 MiB and 1 GiB:
#   staged_gbs      fetch_device_into through http, 10 iterations (device-to-host pieces on
#                   the owner, host-to-device on the consumer, one connection)
#   d2h_gbs h2d_gbs pinned copies of the same size, same run
#   tcp_gbs         raw TCP over loopback, one connection, same bytes
#   ratio           staged over the slowest of the three
#   http_host_gbs   the same bytes as a host shard over http (fetch_into):
#                   the plain http path, to tell staging from http overhead
# Compare with PyTorch's own CUDA IPC sharing: scripts/bench_torch_ipc.py.
#
# Usage: scripts/bench_cuda_ipc.sh [iters]   (from the repository root)
# On a machine without cargo (a GPU box the binaries were copied to), set
# SHARDPORT_BIN_DIR to the directory holding examples/cuda_ipc_peer and
# libshardport_cuda_ipc.so (a copy of target/<profile>/); nothing is built.
set -euo pipefail
iters=${1:-50}
bindir=${SHARDPORT_BIN_DIR:-}
if [ -z "$bindir" ]; then
    if ! command -v cargo >/dev/null; then
        echo "bench_cuda_ipc: no cargo here: build elsewhere and set SHARDPORT_BIN_DIR" >&2
        exit 2
    fi
    cargo build --quiet --release -p shardport --example cuda_ipc_peer
    cargo build --quiet --release -p shardport-cuda-ipc
    bindir=${CARGO_TARGET_DIR:-target}/release
fi
bindir=$(cd "$bindir" && pwd)
peer=$bindir/examples/cuda_ipc_peer
so=$bindir/libshardport_cuda_ipc.so
[ -f "$so" ] || so=$bindir/deps/libshardport_cuda_ipc.so
http=$bindir/libshardport_http.so
[ -f "$http" ] || http=$bindir/deps/libshardport_http.so
for f in "$peer" "$so" "$http"; do
    [ -e "$f" ] || { echo "bench_cuda_ipc: $f is missing" >&2; exit 2; }
done
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for role in owner consumer; do
    cat >"$dir/$role.toml" <<TOML
[node]
name = "$role"
[[plugin]]
name = "cuda-ipc"
path = "$so"
required = true
TOML
done
cat >>"$dir/owner.toml" <<TOML
[[plugin]]
name = "http"
path = "$http"
TOML
cat >"$dir/remote.toml" <<TOML
[node]
name = "remote"
[[plugin]]
name = "http"
path = "$http"
TOML
first=$("$peer" owner "$dir/owner.toml" </dev/null | head -1)
case "$first" in
SKIP*) echo "bench_cuda_ipc: skipped: ${first#SKIP }"; exit 0 ;;
esac
# Two peers on named pipes (bash runs only one coproc at a time reliably).
mkfifo "$dir/owner.in" "$dir/owner.out" "$dir/consumer.in" "$dir/consumer.out" \
    "$dir/remote.in" "$dir/remote.out"
"$peer" owner "$dir/owner.toml" <"$dir/owner.in" >"$dir/owner.out" &
"$peer" consumer "$dir/consumer.toml" <"$dir/consumer.in" >"$dir/consumer.out" &
"$peer" consumer "$dir/remote.toml" <"$dir/remote.in" >"$dir/remote.out" &
exec 3>"$dir/owner.in" 4<"$dir/owner.out" 5>"$dir/consumer.in" 6<"$dir/consumer.out" \
    7>"$dir/remote.in" 8<"$dir/remote.out"
OWNER=(4 3)
CONSUMER=(6 5)
REMOTE=(8 7)
read -r r <&4; [ "$r" = READY ] || { echo "owner: $r" >&2; exit 1; }
read -r r <&6; [ "$r" = READY ] || { echo "consumer: $r" >&2; exit 1; }
read -r r <&8; [ "$r" = READY ] || { echo "remote: $r" >&2; exit 1; }
echo "allocator size_bytes first_open_us cached_p50_us d2d_fetch_gbs local_dtod_gbs"
for alloc in ${BENCH_ALLOCATORS:-plain vmm:20971520}; do
for size in 4096 1048576 16777216 67108864 268435456; do
    echo "PUT $size 1 0 $alloc" >&"${OWNER[1]}"
    read -r reply <&"${OWNER[0]}"
    case "$reply" in
    HANDLE*) handle=${reply#HANDLE } ;;
    *) echo "size $size: owner: $reply" >&2; exit 1 ;;
    esac
    echo "BENCH $handle $iters" >&"${CONSUMER[1]}"
    read -r r <&"${CONSUMER[0]}"
    case "$r" in
    OK*) echo "$r" | sed -E "s/OK bytes=([0-9]+) first_open_us=([^ ]+) cached_p50_us=([^ ]+) d2d_fetch_gbs=([^ ]+) local_dtod_gbs=([^ ]+)/$alloc \1 \2 \3 \4 \5/" ;;
    *) echo "$alloc size $size: $r" >&2; exit 1 ;;
    esac
done
done
echo "staged over http: size_bytes staged_gbs d2h_gbs h2d_gbs tcp_gbs ratio http_host_gbs"
for size in 268435456 1073741824; do
    echo "PUT $size 2 0 plain" >&"${OWNER[1]}"
    read -r reply <&"${OWNER[0]}"
    case "$reply" in
    HANDLE*) handle=${reply#HANDLE } ;;
    *) echo "staged size $size: owner: $reply" >&2; exit 1 ;;
    esac
    echo "PUTHOST $size 2" >&"${OWNER[1]}"
    read -r reply <&"${OWNER[0]}"
    case "$reply" in
    HANDLE*) host_handle=${reply#HANDLE } ;;
    *) echo "host size $size: owner: $reply" >&2; exit 1 ;;
    esac
    echo "STAGEDBENCH $handle ${STAGED_ITERS:-10}" >&"${REMOTE[1]}"
    read -r r <&"${REMOTE[0]}"
    case "$r" in
    OK*) staged=$(echo "$r" | sed -E "s/OK bytes=([0-9]+) staged_gbs=([^ ]+) d2h_gbs=([^ ]+) h2d_gbs=([^ ]+) tcp_gbs=([^ ]+) ratio=([^ ]+)/\1 \2 \3 \4 \5 \6/") ;;
    *) echo "staged size $size: $r" >&2; exit 1 ;;
    esac
    echo "HOSTBENCH $host_handle ${STAGED_ITERS:-10}" >&"${REMOTE[1]}"
    read -r r <&"${REMOTE[0]}"
    case "$r" in
    OK*) echo "$staged $(echo "$r" | sed -E 's/.*http_host_gbs=([^ ]+).*/\1/')" ;;
    *) echo "host size $size: $r" >&2; exit 1 ;;
    esac
done
echo EXIT >&"${REMOTE[1]}"
echo EXIT >&"${CONSUMER[1]}"
echo EXIT >&"${OWNER[1]}"
wait
