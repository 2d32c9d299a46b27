#!/usr/bin/env bash
# Times `memsnap memviz stats|trace` against PyTorch 2.15's `_memory_viz.py` on the same
# generated 1,000,000-entry snapshot, side by side in one run (best of 3, runs interleaved;
# wall-clock and CPU time, the latter steadier on a busy machine), checks that both print the
# same bytes, and prints the ratios.
#
# Usage: scripts/bench_memviz.sh [ENTRIES]
# Environment: BIG (snapshot path, default /tmp/memsnap-bench-<ENTRIES>.pickle),
#              CARGO_TARGET_DIR (default target), PYTHON (default python3), RUNS (default 3).
set -euo pipefail

cd "$(dirname "$0")/.."
entries="${1:-1000000}"
big="${BIG:-/tmp/memsnap-bench-${entries}.pickle}"
target="${CARGO_TARGET_DIR:-target}"
python="${PYTHON:-python3}"
runs="${RUNS:-3}"
cache="${HOME}/.cache/memsnap"
reference="${cache}/_memory_viz.py"

echo "building release..." >&2
cargo build --release -p memsnap >&2
memsnap="${target}/release/memsnap"

if [ ! -s "$big" ]; then
    echo "generating $big ($entries entries)..." >&2
    cargo run --release -p memsnap-workload --example gen_snapshot -- --entries "$entries" -o "$big" >&2
fi

if [ ! -s "$reference" ]; then
    # _memory_viz.py only needs the standard library; it ships inside the torch wheel.
    echo "fetching _memory_viz.py from the torch 2.15.0 wheel (~540 MB download)..." >&2
    mkdir -p "$cache"
    wheel_dir="$(mktemp -d)"
    trap 'rm -rf "$wheel_dir"' EXIT
    "$python" -m pip download torch==2.15.0 --no-deps -d "$wheel_dir" >&2
    unzip -p "$wheel_dir"/torch-2.15.0-*.whl torch/cuda/_memory_viz.py > "$reference.tmp"
    mv "$reference.tmp" "$reference"
fi

echo "snapshot: $big ($(du -h "$big" | cut -f1)), best of $runs" >&2
"$python" - "$memsnap" "$reference" "$big" "$runs" <<'PY'
import subprocess, sys, time, tempfile, filecmp, os

memsnap, reference, big, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
python = sys.executable
out_dir = tempfile.mkdtemp()

def timed(cmd, out_path):
    """Wall-clock and CPU (user + sys) seconds of one run."""
    with open(out_path, "wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    if status != 0:
        sys.exit(f"{cmd} failed with status {status}")
    return wall, usage.ru_utime + usage.ru_stime

for report in ("stats", "trace"):
    ours_out = os.path.join(out_dir, f"ours.{report}")
    py_out = os.path.join(out_dir, f"python.{report}")
    ours, theirs = [], []
    for _ in range(runs):
        ours.append(timed([memsnap, "memviz", report, big], ours_out))
        theirs.append(timed([python, reference, report, big], py_out))
    same = filecmp.cmp(ours_out, py_out, shallow=False)
    (ours_wall, ours_cpu), (py_wall, py_cpu) = min(ours), min(theirs)
    print(f"memviz {report}: ours {ours_wall:.3f} s, python {py_wall:.3f} s, "
          f"ratio {py_wall / ours_wall:.1f}x "
          f"(CPU: ours {min(c for _, c in ours):.3f} s, python {min(c for _, c in theirs):.3f} s, "
          f"ratio {min(c for _, c in theirs) / min(c for _, c in ours):.1f}x), "
          f"output {'identical' if same else 'DIFFERENT'}")
    if not same:
        sys.exit(f"memviz {report}: outputs differ ({ours_out} vs {py_out})")
PY
