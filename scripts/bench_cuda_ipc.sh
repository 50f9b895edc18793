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
# Compare with PyTorch's own CUDA IPC sharing: scripts/bench_torch_ipc.py.
#
# Usage: scripts/bench_cuda_ipc.sh [iters]   (from the repository root)
set -euo pipefail
iters=${1:-50}
cargo build --quiet -p shardport --example cuda_ipc_peer
cargo build --quiet -p shardport-posix-shm -p shardport-cuda-ipc
peer=target/debug/examples/cuda_ipc_peer
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for role in owner consumer; do
    cat >"$dir/$role.toml" <<TOML
[node]
name = "$role"
[[plugin]]
name = "cuda-ipc"
path = "$PWD/target/debug/libshardport_cuda_ipc.so"
required = true
TOML
done
first=$("$peer" owner "$dir/owner.toml" </dev/null | head -1)
case "$first" in
SKIP*) echo "bench_cuda_ipc: skipped: ${first#SKIP }"; exit 0 ;;
esac
coproc OWNER { "$peer" owner "$dir/owner.toml"; }
coproc CONSUMER { "$peer" consumer "$dir/consumer.toml"; }
read -r _ <&"${OWNER[0]}"
read -r _ <&"${CONSUMER[0]}"
echo "size_bytes first_open_us cached_p50_us d2d_fetch_gbs local_dtod_gbs"
for size in 4096 1048576 16777216 67108864 268435456; do
    echo "PUT $size 1 0" >&"${OWNER[1]}"
    read -r reply <&"${OWNER[0]}"
    handle=${reply#HANDLE }
    echo "BENCH $handle $iters" >&"${CONSUMER[1]}"
    read -r r <&"${CONSUMER[0]}"
    case "$r" in
    OK*) echo "$r" | sed -E 's/OK bytes=([0-9]+) first_open_us=([^ ]+) cached_p50_us=([^ ]+) d2d_fetch_gbs=([^ ]+) local_dtod_gbs=([^ ]+)/\1 \2 \3 \4 \5/' ;;
    *) echo "size $size: $r" >&2; exit 1 ;;
    esac
done
echo EXIT >&"${CONSUMER[1]}"
echo EXIT >&"${OWNER[1]}"
wait
