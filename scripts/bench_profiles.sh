#!/usr/bin/env bash
# Times `memsnap export --to flamegraph|pprof` (by stack and by site, at the peak) on a generated
# 1,000,000-entry training run and on the largest real snapshot, with `memsnap info` (reading
# the file alone) as the baseline in the same run; prints the best of RUNS wall-clock seconds
# and the output sizes.
#
# Usage: scripts/bench_profiles.sh [ENTRIES]
# Environment: BIG (snapshot path, default /tmp/memsnap-bench-<ENTRIES>.pickle),
#              REAL (default ../shared/real_snapshots/15_kkaitlyn_2p7b_compile_annotations.pickle),
#              CARGO_TARGET_DIR (default target), RUNS (default 3).
set -euo pipefail

cd "$(dirname "$0")/.."
entries="${1:-1000000}"
big="${BIG:-/tmp/memsnap-bench-${entries}.pickle}"
real="${REAL:-../shared/real_snapshots/15_kkaitlyn_2p7b_compile_annotations.pickle}"
target="${CARGO_TARGET_DIR:-target}"
runs="${RUNS:-3}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "building release..." >&2
cargo build --release --locked -p memsnap -p memsnap-workload --bin memsnap --example gen_snapshot >&2
memsnap="${target}/release/memsnap"
if [ ! -s "$big" ]; then
    echo "generating $big ($entries entries)..." >&2
    "${target}/release/examples/gen_snapshot" --entries "$entries" -o "$big" >&2
fi

# best_of CMD...: the lowest wall-clock seconds of $runs runs.
best_of() {
    local best="" start end t
    for _ in $(seq "$runs"); do
        start=$(date +%s.%N)
        "$@" >"$out/stdout"
        end=$(date +%s.%N)
        t=$(echo "$end - $start" | bc)
        if [ -z "$best" ] || [ "$(echo "$t < $best" | bc)" = 1 ]; then best=$t; fi
    done
    printf '%.3f' "$best"
}

for file in "$big" "$real"; do
    [ -s "$file" ] || { echo "skipping $file (missing)" >&2; continue; }
    echo "$(basename "$file") ($(stat -c %s "$file") bytes)"
    echo "  memsnap info (reading alone): $(best_of "$memsnap" info "$file") s"
    for to in flamegraph pprof; do
        for by in stack site; do
            t=$(best_of "$memsnap" export "$file" --to "$to" --by "$by" -o "$out/export")
            echo "  export --to $to --by $by: $t s, $(stat -c %s "$out/export") bytes;$(sed -n 2p "$out/stdout")"
        done
    done
done
