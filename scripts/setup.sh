#!/usr/bin/env bash
# Installs what building and testing shardport needs on a fresh machine of
# this kind (Debian + rustup toolchain). Idempotent; CI runs it first.
set -euo pipefail

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
