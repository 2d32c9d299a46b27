#!/usr/bin/env bash
# Times `memsnap memviz stats|segments|memory|trace` (and `stats --validate`) against PyTorch
# 2.15's `_memory_viz.py` on the same generated 1,000,000-entry snapshot in PyTorch's layout
# (re-dumped by CPython with a fresh frames list and fresh strings per entry, as
# `_dump_snapshot()` writes them), side by side in one run (best of RUNS, runs interleaved;
# wall-clock and CPU time, the latter steadier on a busy machine), checks that both print the
# same bytes, and prints the ratios. Python's `segments` and `memory` pipe their text to
# `flamegraph.pl`; a pass-through shim (`cat`) stands in for it, in a private HOME.
#
# Usage: scripts/bench_memviz.sh [ENTRIES]
# Environment: BIG (snapshot path, default /tmp/memsnap-bench-<ENTRIES>-pytorch.pickle),
#              CARGO_TARGET_DIR (default target), PYTHON (default python3), RUNS (default 5).
set -euo pipefail

cd "$(dirname "$0")/.."
entries="${1:-1000000}"
big="${BIG:-/tmp/memsnap-bench-${entries}-pytorch.pickle}"
target="${CARGO_TARGET_DIR:-target}"
python="${PYTHON:-python3}"
runs="${RUNS:-5}"
cache="${HOME}/.cache/memsnap"
reference="${cache}/_memory_viz.py"

echo "building release..." >&2
cargo build --release -p memsnap >&2
memsnap="${target}/release/memsnap"

if [ ! -s "$big" ]; then
    echo "generating $big ($entries entries, PyTorch's layout)..." >&2
    cargo run --release -p memsnap-workload --example gen_snapshot -- --entries "$entries" -o "$big.memsnap" >&2
    "$python" - "$big.memsnap" "$big" <<'PY'
import os, pickle, sys
with open(sys.argv[1], "rb") as f:
    snapshot = pickle.load(f)
for trace in snapshot.get("device_traces", []):
    for entry in trace:
        for key in ("compile_context", "user_metadata"):
            if key in entry:
                entry[key] = (entry[key] + ".")[:-1]
        if "frames" in entry:
            entry["frames"] = list(entry["frames"])
with open(sys.argv[2] + ".tmp", "wb") as f:
    pickle.dump(snapshot, f, protocol=4)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
os.remove(sys.argv[1])
PY
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
# Python's segments/memory pipe their text through ~/.cache/flamegraph.pl: a shim that passes
# it through, in a HOME of our own, so both sides write the same collapsed text.
home = os.path.join(out_dir, "home")
os.makedirs(os.path.join(home, ".cache"))
shim = os.path.join(home, ".cache", "flamegraph.pl")
with open(shim, "w") as f:
    f.write("#!/bin/sh\nexec cat\n")
os.chmod(shim, 0o755)
python_env = dict(os.environ, HOME=home)

def timed(cmd, out_path, env=None):
    """Wall-clock and CPU (user + sys) seconds of one run."""
    with open(out_path, "wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    if status != 0:
        sys.exit(f"{cmd} failed with status {status}")
    return wall, usage.ru_utime + usage.ru_stime

# (label, our arguments, Python's report). Python always reads the whole file, as
# `--validate` does.
cases = [
    ("stats", ["stats"], "stats"),
    ("segments", ["segments"], "segments"),
    ("memory", ["memory"], "memory"),
    ("stats --validate", ["stats", "--validate"], "stats"),
    ("trace", ["trace"], "trace"),
]
for label, ours_args, report in cases:
    ours_out = os.path.join(out_dir, f"ours.{report}")
    py_out = os.path.join(out_dir, f"python.{report}")
    # `segments` and `memory` write to `-o` on both sides; `stats` and `trace` print.
    to_file = report in ("segments", "memory")
    ours, theirs = [], []
    for _ in range(runs):
        if to_file:
            ours.append(timed([memsnap, "memviz", *ours_args, big, "-o", ours_out], os.devnull))
            theirs.append(
                timed([python, reference, report, big, "-o", py_out], os.devnull, python_env)
            )
        else:
            ours.append(timed([memsnap, "memviz", *ours_args, big], ours_out))
            theirs.append(timed([python, reference, report, big], py_out, python_env))
    same = filecmp.cmp(ours_out, py_out, shallow=False)
    report = label
    ours_wall, py_wall = min(w for w, _ in ours), min(w for w, _ in theirs)
    # CPU time is counted in clock ticks: a run under a tick reads 0.
    ours_cpu, py_cpu = min(c for _, c in ours), min(c for _, c in theirs)
    print(f"memviz {report}: ours {ours_wall:.3f} s, python {py_wall:.3f} s, "
          f"ratio {py_wall / ours_wall:.1f}x "
          f"(CPU: ours {ours_cpu:.3f} s, python {py_cpu:.3f} s, "
          f"ratio {py_cpu / max(ours_cpu, 0.001):.1f}x), "
          f"output {'identical' if same else 'DIFFERENT'}")
    if not same:
        sys.exit(f"memviz {report}: outputs differ ({ours_out} vs {py_out})")
PY
