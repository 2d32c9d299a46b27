#!/usr/bin/env bash
# `memsnap ranks` over FILES generated ranks of ENTRIES trace entries each (one generated
# training run per rank, seed = rank), with 1 and then 2 (or JOBS) files in flight, side by
# side in one run: wall time, CPU time and peak RSS (GNU time). Memory is bounded by the files
# in flight, not by the number of files: each worker loads one file, reduces it to its rank
# row and drops it before taking the next.
#
# Usage: scripts/bench_ranks.sh [FILES] [ENTRIES]          (default 16 1000000)
# Environment: DIR (where the ranks are generated, default /tmp/memsnap-ranks-<ENTRIES>),
#              CARGO_TARGET_DIR (default target), JOBS (default "1 2").
# 64 x 1M entries take 4.9 GB of disk (77 MB a file).
set -euo pipefail

cd "$(dirname "$0")/.."
files="${1:-16}"
entries="${2:-1000000}"
dir="${DIR:-/tmp/memsnap-ranks-${entries}}"
target="${CARGO_TARGET_DIR:-target}"
jobs_list="${JOBS:-1 2}"

echo "building release..." >&2
cargo build --release --bin memsnap >&2
memsnap="${target}/release/memsnap"
gen="${target}/release/examples/gen_snapshot"

mkdir -p "$dir"
paths=()
for ((i = 0; i < files; i++)); do
    path="$dir/r$i.pickle"
    if [ ! -s "$path" ]; then
        if [ ! -x "$gen" ]; then
            cargo build --release -p memsnap-workload --example gen_snapshot >&2
        fi
        "$gen" --entries "$entries" --seed "$i" -o "$path" >/dev/null
    fi
    paths+=("$path")
done
echo "$files ranks of $entries entries: $(du -ch "${paths[@]}" | tail -1 | cut -f1) in $dir" >&2
echo "cores: $(nproc); load average $(cut -d' ' -f1-3 /proc/loadavg)"

for jobs in $jobs_list; do
    out="$(mktemp)"
    /usr/bin/time -f "%e %U %S %M" -o "$out.time" "$memsnap" ranks --jobs "$jobs" "${paths[@]}" >"$out"
    read -r wall user sys rss_kb <"$out.time"
    printf 'ranks %d x %d entries, --jobs %d: wall %.2f s, cpu %.2f s, peak RSS %d MiB\n' \
        "$files" "$entries" "$jobs" "$wall" "$(echo "$user + $sys" | bc)" "$((rss_kb / 1024))"
    tail -1 "$out" >&2
    rm -f "$out" "$out.time"
done
