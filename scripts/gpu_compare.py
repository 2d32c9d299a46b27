"""Compares what scripts/gpu_check.sh brought back from a GPU machine (gpu-results.tar.gz).

    python3 scripts/gpu_compare.py gpu-results.tar.gz [--memsnap target/release/memsnap]

1. memory_stats() of the same training workload under PyTorch's caching allocator and under
   memsnap's: every counter both report must be equal (memsnap replays PyTorch's algorithm).
2. The two histories entry by entry: action, size and stream order (addresses differ).
3. `memsnap memviz stats|trace|segments|memory` against the _memory_viz.py of the PyTorch that
   wrote the snapshots, on both snapshots: byte-identical output.
4. `memsnap info` and `memsnap summary` read both; a pickle written back by `memsnap convert`
   loads in CPython equal to the original.
Exits non-zero on the first class of disagreement it finds, after printing all of them.
"""

import argparse
import json
import os
import pickle
import subprocess
import sys
import tarfile
import tempfile

parser = argparse.ArgumentParser()
parser.add_argument("results")
parser.add_argument("--memsnap", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "memsnap"))
args = parser.parse_args()

work = tempfile.mkdtemp(prefix="memsnap-gpu-")
with tarfile.open(args.results) as tar:
    tar.extractall(work, filter="data")
path = lambda name: os.path.join(work, name)  # noqa: E731
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


print("snapshots from torch", open(path("torch_version.txt")).read().strip())

# 1. Counters.
native_stats = json.load(open(path("native.stats.json")))
memsnap_stats = json.load(open(path("memsnap.stats.json")))
shared = sorted(set(native_stats) & set(memsnap_stats))
only_native = sorted(set(native_stats) - set(memsnap_stats))
differ = [k for k in shared if native_stats[k] != memsnap_stats[k]]
for k in differ:
    print(f"      {k}: torch {native_stats[k]}, memsnap {memsnap_stats[k]}")
check(not differ, f"memory_stats(): {len(shared) - len(differ)} of {len(shared)} shared counters equal")
if only_native:
    print(f"      reported by torch only: {', '.join(only_native)}")
for mode in ("native", "memsnap"):
    print(f"      {mode} OOM: {open(path(mode + '.oom.txt')).read().strip()}")


# 2. Histories.
def load(name):
    with open(path(name), "rb") as f:
        return pickle.load(f)


native, ours = load("native.pickle"), load("memsnap.pickle")


def history(snapshot):
    streams = {}
    out = []
    for e in snapshot["device_traces"][0]:
        stream = streams.setdefault(e.get("stream", 0), len(streams))
        out.append((e["action"], e["size"], stream))
    return out


hn, hm = history(native), history(ours)
first = next((i for i, (a, b) in enumerate(zip(hn, hm)) if a != b), None)
if first is None and len(hn) != len(hm):
    first = min(len(hn), len(hm))
if first is not None:
    print(f"      first difference at entry {first} of {len(hn)} / {len(hm)}:")
    for i in range(max(0, first - 3), first + 4):
        print(f"        {i}: torch {hn[i] if i < len(hn) else '-'}  memsnap {hm[i] if i < len(hm) else '-'}")
check(first is None, f"history: {len(hn)} torch entries, {len(hm)} memsnap entries, same actions, sizes and streams")
seg = lambda s: sorted(x["total_size"] for x in s["segments"])  # noqa: E731
check(seg(native) == seg(ours), f"segments at the end: {len(seg(native))} / {len(seg(ours))}, same sizes")
python_frames = sum(
    1 for e in ours["device_traces"][0]
    if any(f.get("filename", "").endswith("torch_workload.py") for f in e.get("frames", []))
)
print(f"      memsnap entries with a torch_workload.py frame: {python_frames} of {len(hm)}")

# 3. memviz against the same PyTorch's _memory_viz.py.
home = path("home")
os.makedirs(os.path.join(home, ".cache"), exist_ok=True)
shim = os.path.join(home, ".cache", "flamegraph.pl")
with open(shim, "w") as f:
    f.write("#!/bin/sh\nexec cat\n")
os.chmod(shim, 0o755)
for snap in ("native.pickle", "native.on_oom.pickle", "memsnap.pickle", "memsnap.on_oom.pickle"):
    if not os.path.exists(path(snap)):
        check(False, f"{snap} was not written")
        continue
    for report in ("stats", "trace", "segments", "memory"):
        ours_out, theirs_out = path(f"{snap}.{report}.ours"), path(f"{snap}.{report}.torch")
        if report in ("segments", "memory"):
            a = subprocess.run([args.memsnap, "memviz", report, path(snap), "-o", ours_out])
            b = subprocess.run([sys.executable, path("_memory_viz.py"), report, path(snap), "-o", theirs_out],
                               env=dict(os.environ, HOME=home))
        else:
            a = subprocess.run([args.memsnap, "memviz", report, path(snap)], stdout=open(ours_out, "wb"))
            b = subprocess.run([sys.executable, path("_memory_viz.py"), report, path(snap)],
                               stdout=open(theirs_out, "wb"), env=dict(os.environ, HOME=home))
        same = a.returncode == 0 and b.returncode == 0 and open(ours_out, "rb").read() == open(theirs_out, "rb").read()
        check(same, f"memviz {report} {snap}: identical to _memory_viz.py")

# 4. Our tools read them; a round trip through memsnap's writer loads equal in CPython.
for snap in ("native.pickle", "memsnap.pickle"):
    for cmd in (["info"], ["summary"]):
        r = subprocess.run([args.memsnap, *cmd, path(snap)], capture_output=True, text=True)
        check(r.returncode == 0, f"memsnap {cmd[0]} {snap}")
        if cmd == ["info"]:
            print("      " + "\n      ".join(r.stdout.strip().splitlines()[:6]))
    back = path(snap + ".roundtrip.pickle")
    r = subprocess.run([args.memsnap, "convert", path(snap), "-o", back], capture_output=True, text=True)
    check(r.returncode == 0 and load(os.path.basename(back)) == load(snap),
          f"memsnap convert {snap} -> pickle: equal in CPython {r.stderr.strip()}")

print(f"\n{len(failures)} failed" if failures else "\nall agree")
sys.exit(1 if failures else 0)
