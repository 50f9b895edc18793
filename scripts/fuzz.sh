#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for SECONDS each (default 60) and prints,
# per target, the executions, coverage, corpus size and whether it found
# anything. Needs nightly Rust and cargo-fuzz; installs nothing unless
# asked:
#
#   scripts/fuzz.sh [--install] [SECONDS] [TARGET...]
#
#   --install   run `cargo install cargo-fuzz` first
#   SECONDS     libFuzzer's -max_total_time per target
#   TARGET...   only these targets (default: all, from `cargo fuzz list`)
#
# New inputs go to fuzz/target/corpus/<target>/ (ignored by git), seeded from
# the checked-in fuzz/corpus/<target>/. A finding is written to
# fuzz/artifacts/<target>/; make it a regression test and copy it into
# fuzz/corpus/<target>/finding-<what> (tests/fuzz_corpus*.rs replay it).
# Exit status: 0 when no target found anything, 1 otherwise, 2 on misuse.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"

install=0
seconds=60
targets=()
for arg in "$@"; do
    case "$arg" in
        --install) install=1 ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        ''|*[!0-9]*) targets+=("$arg") ;;
        *) seconds="$arg" ;;
    esac
done

if [ "$install" = 1 ]; then
    cargo install cargo-fuzz || exit 2
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz: cargo-fuzz or nightly Rust is missing (run scripts/fuzz.sh --install," \
        "and rustup toolchain install nightly)" >&2
    exit 2
fi
if [ "${#targets[@]}" = 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

# One build of every target first, so the time budget is spent fuzzing.
mkdir -p target
if ! cargo +nightly fuzz build >target/build.log 2>&1; then
    tail -30 target/build.log >&2
    echo "fuzz: build failed (fuzz/target/build.log)" >&2
    exit 2
fi

found=0
printf '%-22s %8s %12s %8s %8s %8s  %s\n' target seconds runs cov ft corpus result
for t in "${targets[@]}"; do
    work="target/corpus/$t"
    mkdir -p "$work" "artifacts/$t"
    log="target/fuzz-$t.log"
    start=$(date +%s)
    cargo +nightly fuzz run "$t" "$work" "corpus/$t" -- \
        -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1
    status=$?
    took=$(( $(date +%s) - start ))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    # The last status line: "#N ... cov: C ft: F corp: K/..."
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
    if [ "$status" = 0 ]; then
        result="nothing found"
    else
        found=1
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        result="FOUND (exit $status) ${artifact:-see fuzz/$log}"
    fi
    printf '%-22s %8s %12s %8s %8s %8s  %s\n' "$t" "$took" "${runs:-?}" "${cov:-?}" \
        "${ft:-?}" "${corp:-?}" "$result"
done
exit "$found"
