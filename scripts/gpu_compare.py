"""Compares what scripts/gpu_check.sh brought back from a GPU machine, on any machine.

    python3 scripts/gpu_compare.py RESULTS_DIR [--memsnap target/release/memsnap]
        [--python PY_WITH_MEMSNAP_WHEEL] [--markdown table.md]

RESULTS_DIR holds misc.tar.gz, native.tar.gz, memsnap.tar.gz, expandable.tar.gz and
profiler.tar.gz. The checks (each prints ok or FAIL; exit 1 if any failed):
1. the recorder's real-CUDA tests passed; the cuda_alloc and ctypes snapshots read;
2. the same GPT run under PyTorch's allocator and under memsnap's: every memory_stats() counter,
   the history entry by entry (action, size, stream), the segments at the end, the peaks;
   `memsnap simulate` on both reproduces every segment decision; `memsnap summary` finds the 6
   steps with forward, backward and optimizer on both; the peak's sites name the script's lines;
   `memsnap memviz` byte-identical to that PyTorch's _memory_viz.py; MemoryViz.js reads every
   snapshot (node, scripts/gpu/memoryviz_check.js); memsnap.load == pickle.load (with --python);
   the planned out-of-memory: PyTorch's snapshot has its `oom` entry, memsnap raised
   torch.OutOfMemoryError, wrote dump_on_oom, and the next step ran;
3. expandable segments: `memsnap simulate` reproduces every map and unmap;
4. torch.profiler: `memsnap import` of the Chrome trace and of export_memory_timeline gives the
   profiler's own peak;
5. the cost (history off / on, step time and torch.empty per op) as ratios, and dump time and size.
"""

import argparse
import gzip
import json
import math
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
import tempfile

parser = argparse.ArgumentParser()
parser.add_argument("results")
parser.add_argument("--memsnap", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "memsnap"))
parser.add_argument("--python", help="a Python with the memsnap wheel installed (memsnap.load == pickle.load)")
parser.add_argument("--markdown", help="write the results table here")
parser.add_argument("--keep", help="extract into this folder (kept) instead of a temporary one")
args = parser.parse_args()
memsnap = os.path.abspath(args.memsnap)
here = os.path.dirname(os.path.abspath(__file__))

work = args.keep or tempfile.mkdtemp(prefix="memsnap-gpu-")
os.makedirs(work, exist_ok=True)
for part in ("misc", "native", "memsnap", "native2", "expandable", "profiler", "cost"):
    archive = os.path.join(args.results, f"{part}.tar.gz")
    if os.path.exists(archive):
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
# Snapshots come gzipped; memsnap reads .gz, CPython's pickle and _memory_viz.py need them plain.
for root, _, files in os.walk(work):
    for name in files:
        if name.endswith((".pickle.gz", ".json.gz")) and not name.startswith("memory_timeline"):
            plain = os.path.join(root, name[:-3])
            if not os.path.exists(plain):
                with gzip.open(os.path.join(root, name)) as src, open(plain, "wb") as dst:
                    shutil.copyfileobj(src, dst)

path = lambda part, name: os.path.join(work, part, name)  # noqa: E731
failures = []
table = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)
    return ok


def note(text):
    print("      " + text)


def run(*command, **kw):
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, **kw)


def load(p):
    with open(p, "rb") as f:
        return pickle.load(f)


def read_json(p):
    return json.load(open(p)) if os.path.exists(p) else None


def mib(n):
    return f"{n / 2**20:,.1f} MiB"


# 1. Machine and the recorder's own tests.
print(open(path("misc", "machine.txt")).read().strip())
real_cuda = open(path("misc", "real_cuda.txt")).read() if os.path.exists(path("misc", "real_cuda.txt")) else ""
check("test result: ok" in real_cuda and " 0 failed" in real_cuda,
      "recorder-it real_cuda: " + next((line for line in real_cuda.splitlines() if "test result" in line), "no result"))
for snap in ("cuda_alloc.pickle", "ctypes.pickle"):
    r = run(memsnap, "info", path("misc", snap))
    check(r.returncode == 0, f"memsnap info {snap}")

# 2. The same GPT run under both allocators.
native_result = read_json(path("native", "native.json")) or {}
memsnap_result = read_json(path("memsnap", "memsnap.json")) or {}
native_stats = read_json(path("native", "native.stats.json")) or {}
memsnap_stats = read_json(path("memsnap", "memsnap.stats.json")) or {}
native2_stats = read_json(path("native2", "native.stats.json"))
shared = sorted(set(native_stats) & set(memsnap_stats))
differ = [k for k in shared if native_stats[k] != memsnap_stats[k]]
for k in differ:
    note(f"{k}: torch {native_stats[k]}, memsnap {memsnap_stats[k]}")
# Counters that differ between two runs of PyTorch itself (native2) are not memsnap's doing.
varying = {k for k in native_stats if native2_stats and native_stats[k] != native2_stats.get(k)}
if native2_stats:
    note(f"between two PyTorch runs these differ: {', '.join(sorted(varying)) or 'none'}")
check(shared and set(differ) <= varying,
      f"memory_stats() after the 6 steps: {len(shared) - len(differ)} of {len(shared)} counters equal"
      + (f"; the {len(differ)} others differ between two PyTorch runs too" if differ and set(differ) <= varying else ""))

native = load(path("native", "native.pickle"))
ours = load(path("memsnap", "memsnap.pickle"))


def history(snapshot):
    streams, out = {}, []
    for e in snapshot["device_traces"][0]:
        stream = streams.setdefault(e.get("stream", 0), len(streams))
        out.append((e["action"], e["size"], stream))
    return out


hn, hm = history(native), history(ours)
first = next((i for i, (a, b) in enumerate(zip(hn, hm)) if a != b), None)
if first is None and len(hn) != len(hm):
    first = min(len(hn), len(hm))
if first is not None:
    note(f"first difference at entry {first} of {len(hn)} / {len(hm)}:")
    for i in range(max(0, first - 3), first + 4):
        note(f"  {i}: torch {hn[i] if i < len(hn) else '-'}  memsnap {hm[i] if i < len(hm) else '-'}")
note(f"history: {len(hn)} torch entries, {len(hm)} memsnap entries; "
     + ("same actions, sizes and streams" if first is None else f"first difference at entry {first}"))


def canonical(snapshot):
    """The history with each run of frees made by autocast's cache clear (torch.autocast's
    __exit__) as a sorted multiset: that cache is a hash map keyed by host pointers, so the
    order it frees its casts in differs from one process to the next (two PyTorch runs
    differ there too, see native2)."""
    out, run = [], []
    for e in snapshot["device_traces"][0]:
        if e["action"].startswith("free") and any(
                f.get("name") == "__exit__" and f.get("filename", "").endswith("autocast_mode.py")
                for f in e.get("frames", [])):
            run.append((e["action"], e["size"]))
            continue
        if run:
            out.append(("autocast cache frees", tuple(sorted(run))))
            run = []
        out.append((e["action"], e["size"]))
    if run:
        out.append(("autocast cache frees", tuple(sorted(run))))
    return out


if os.path.exists(path("native2", "native.pickle")):
    h2 = history(load(path("native2", "native.pickle")))
    first2 = next((i for i, (a, b) in enumerate(zip(hn, h2)) if a != b), None)
    note(f"two PyTorch runs: first difference at entry {first2} ({hn[first2] if first2 is not None else '-'} / "
         f"{h2[first2] if first2 is not None else '-'})")
cn, cm = canonical(native), canonical(ours)
runs = [len(x[1]) for x in cn if x[0] == "autocast cache frees"]
check(cn == cm, f"history: equal once the {len(runs)} autocast cache clears ({sum(runs)} frees) are compared as sets")
seg = lambda s: sorted(x["total_size"] for x in s["segments"])  # noqa: E731
check(seg(native) == seg(ours), f"segments at the end: {len(seg(native))} / {len(seg(ours))}, same sizes")
for key in ("peak_allocated", "peak_reserved"):
    check(native_result.get(key) == memsnap_result.get(key),
          f"{key}: torch {native_result.get(key)}, memsnap {memsnap_result.get(key)}")
for name, snapshot in (("torch", native), ("memsnap", ours)):
    entries = snapshot["device_traces"][0]
    framed = sum(1 for e in entries if any(f.get("filename", "").endswith("gpt_workload.py") for f in e.get("frames", [])))
    note(f"{name}: {framed} of {len(entries)} entries carry a gpt_workload.py frame")

for snap, part in (("native.pickle", "native"), ("memsnap.pickle", "memsnap")):
    r = run(memsnap, "simulate", "--json", path(part, snap))
    if check(r.returncode == 0, f"memsnap simulate {snap}"):
        for dev in json.loads(r.stdout)["devices"]:
            fid = dev["fidelity"]
            check(fid["reproduced"] == fid["segment_decisions"] and fid["extra"] == 0
                  and fid["placed_at_recorded_address"] == fid["allocations"],
                  f"  simulate {snap}: {fid['reproduced']}/{fid['segment_decisions']} segment decisions, "
                  f"{fid['extra']} extra, {fid['placed_at_recorded_address']}/{fid['allocations']} at the recorded address")
    r = run(memsnap, "summary", "--json", path(part, snap))
    if check(r.returncode == 0, f"memsnap summary {snap}"):
        dev = json.loads(r.stdout)["devices"][0]
        steps = dev["steps"]
        kinds = [sorted({p["kind"] for p in s["phases"]}) for s in steps]
        complete = sum(1 for k in kinds if {"forward", "backward", "optimizer"} <= set(k))
        check(len(steps) == 6 and complete == 6,
              f"  summary {snap}: {len(steps)} steps by {dev['step_method']}, {complete} with forward, backward and optimizer")
        sites = [s["site"] for s in dev["peak_top_sites"]]
        ours_sites = [s for s in sites if "gpt_workload.py:" in s]
        check(bool(ours_sites), f"  summary {snap}: peak sites {sites}")
    r = run(memsnap, "top", "--json", "--limit", "10", path(part, snap))
    if r.returncode == 0:
        rows = json.loads(r.stdout)
        rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
        note(f"memsnap top {snap} at the peak: " + "; ".join(
            f"{row.get('site', row.get('key'))} {mib(row.get('bytes', 0))}" for row in rows[:6]))

# _memory_viz.py byte for byte, and MemoryViz.js.
home = os.path.join(work, "home")
os.makedirs(os.path.join(home, ".cache"), exist_ok=True)
with open(os.path.join(home, ".cache", "flamegraph.pl"), "w") as f:
    # _memory_viz.py writes the whole input before reading the output: the stand-in for
    # flamegraph.pl must read all of its input first, or both wait on a full pipe.
    f.write('#!/bin/sh\nf="$(mktemp)"; cat > "$f"; cat "$f"; rm -f "$f"\n')
os.chmod(os.path.join(home, ".cache", "flamegraph.pl"), 0o755)
snapshots = [("native", "native.pickle"), ("native", "native.on_oom.pickle"), ("memsnap", "memsnap.pickle"),
             ("memsnap", "memsnap.on_oom.pickle"), ("expandable", "expandable.pickle")]
viz = path("misc", "_memory_viz.py")
for part, snap in snapshots:
    p = path(part, snap)
    if not check(os.path.exists(p), f"{snap} was written"):
        continue
    for report in ("stats", "trace", "segments", "memory"):
        mine, theirs = p + f".{report}.ours", p + f".{report}.torch"
        if report in ("segments", "memory"):
            a = run(memsnap, "memviz", report, p, "-o", mine)
            b = run(sys.executable, viz, report, p, "-o", theirs, env=dict(os.environ, HOME=home))
        else:
            a = subprocess.run([memsnap, "memviz", report, p], stdout=open(mine, "wb"))
            b = subprocess.run([sys.executable, viz, report, p], stdout=open(theirs, "wb"), env=dict(os.environ, HOME=home))
        same = a.returncode == 0 and b.returncode == 0 and open(mine, "rb").read() == open(theirs, "rb").read()
        check(same, f"memviz {report} {snap}: identical to _memory_viz.py")
# MemoryViz.js (PyTorch's browser viewer, loaded from pytorch@main by the HTML _memory_viz.py
# writes) has its own unpickler: protocols 2 to 4 and the opcodes below, nothing else.
MEMORYVIZ_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWTRUE", "NEWFALSE",
    "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE",
}
import pickletools  # noqa: E402

for part, snap in snapshots:
    p = path(part, snap)
    if not os.path.exists(p):
        continue
    used, protocol = set(), None
    for op, arg, _ in pickletools.genops(open(p, "rb").read()):
        used.add(op.name)
        if op.name == "PROTO":
            protocol = arg
    unknown = sorted(used - MEMORYVIZ_OPCODES)
    check(not unknown and protocol is not None and 2 <= protocol <= 4,
          f"MemoryViz.js can read {snap}: protocol {protocol}, {len(used)} opcodes"
          + (f", unknown to it: {unknown}" if unknown else ""))

for part, snap in (("native", "native.pickle"), ("memsnap", "memsnap.pickle")):
    back = path(part, snap + ".roundtrip.pickle")
    r = run(memsnap, "convert", path(part, snap), "-o", back)
    check(r.returncode == 0 and load(back) == load(path(part, snap)), f"memsnap convert {snap} -> pickle: equal in CPython")
    if args.python:
        code = ("import memsnap, pickle, sys; a = memsnap.load(sys.argv[1]); "
                "b = pickle.load(open(sys.argv[1], 'rb')); print(a == b)")
        r = run(args.python, "-c", code, path(part, snap))
        check(r.stdout.strip() == "True", f"memsnap.load({snap}) == pickle.load: {r.stdout.strip()} {r.stderr.strip()[-300:]}")

# Out of memory.
oom_entries = [e for e in load(path("native", "native.on_oom.pickle"))["device_traces"][0] if e["action"] == "oom"] \
    if os.path.exists(path("native", "native.on_oom.pickle")) else []
check(len(oom_entries) == 1, f"PyTorch's OOM snapshot has {len(oom_entries)} oom entry "
      f"(size {oom_entries[0]['size'] if oom_entries else '-'}, device_free {oom_entries[0].get('device_free') if oom_entries else '-'})")
note(f"torch:   {native_result.get('oom')}")
note(f"memsnap: {memsnap_result.get('oom')}")
check(str(memsnap_result.get("oom", "")).startswith("torch.OutOfMemoryError"), "memsnap: torch.OutOfMemoryError raised")
check(bool(memsnap_result.get("oom_dump_written")), "memsnap: dump_on_oom written")
ours_oom = [e for e in load(path("memsnap", "memsnap.on_oom.pickle"))["device_traces"][0] if e["action"] == "oom"] \
    if os.path.exists(path("memsnap", "memsnap.on_oom.pickle")) else []
check(len(ours_oom) == 1, f"memsnap's OOM snapshot has {len(ours_oom)} oom entry")
for name, result in (("torch", native_result), ("memsnap", memsnap_result)):
    loss = result.get("step_after_oom_loss")
    check(loss is not None and math.isfinite(loss), f"{name}: the training step after the OOM ran (loss {loss})")

# 3. Expandable segments.
if os.path.exists(path("expandable", "expandable.pickle")):
    r = run(memsnap, "simulate", "--json", path("expandable", "expandable.pickle"))
    if check(r.returncode == 0, "memsnap simulate expandable.pickle"):
        report = json.loads(r.stdout)
        note(f"settings: {report.get('alloc_conf')} ({report.get('settings_source')})")
        for dev in report["devices"]:
            fid, rec = dev["fidelity"], dev["recorded"]
            maps = sum(1 for e in dev["segment_events"] if e[0] == "segment_map")
            unmaps = sum(1 for e in dev["segment_events"] if e[0] == "segment_unmap")
            check(fid["reproduced"] == fid["segment_decisions"] and fid["extra"] == 0,
                  f"  expandable: {fid['reproduced']}/{fid['segment_decisions']} map/unmap decisions reproduced "
                  f"({maps} maps, {unmaps} unmaps replayed; recorded {rec['device_mallocs']} / {rec['device_frees']}), "
                  f"{fid['placed_at_recorded_address']}/{fid['allocations']} at the recorded address")
else:
    check(False, "expandable.pickle was written")

# 4. torch.profiler imports.
profiler = read_json(path("profiler", "profiler.json"))
trace = path("profiler", "profiler.pt.trace.json")
if profiler and os.path.exists(trace):
    events = json.load(open(trace))
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    memory = [e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 1]
    trace_peak = max((e["args"]["Total Allocated"] for e in memory), default=None)
    trace_reserved = max((e["args"]["Total Reserved"] for e in memory), default=None)
    note(f"profiler: {len(memory)} CUDA [memory] events; max Total Allocated {trace_peak}, max Total Reserved "
         f"{trace_reserved}; torch.cuda max_memory_allocated {profiler['peak_allocated']}, "
         f"max_memory_reserved {profiler['peak_reserved']}, allocated at the start {profiler['allocated_at_start']}")
    imported = trace + ".imported.pickle"
    r = run(memsnap, "import", trace, "-o", imported)
    if check(r.returncode == 0, f"memsnap import profiler.pt.trace.json {r.stderr.strip()[-300:]}"):
        r = run(memsnap, "summary", "--json", imported)
        dev = json.loads(r.stdout)["devices"][0]
        check(dev["peak_allocated_bytes"] == trace_peak == profiler["peak_allocated"],
              f"  imported trace: peak allocated {dev['peak_allocated_bytes']} (trace {trace_peak}, torch {profiler['peak_allocated']})")
        check(dev["peak_reserved_bytes"] == trace_reserved == profiler["peak_reserved"],
              f"  imported trace: peak reserved {dev['peak_reserved_bytes']} (trace {trace_reserved}, torch {profiler['peak_reserved']})")
    for timeline in ("memory_timeline.raw.json.gz", "memory_timeline.json.gz"):
        p = path("profiler", timeline)
        if not check(os.path.exists(p), f"{timeline} was written"):
            continue
        imported = p + ".imported.pickle"
        r = run(memsnap, "import", p, "-o", imported)
        if check(r.returncode == 0, f"memsnap import {timeline} {r.stderr.strip()[-300:]}"):
            r = run(memsnap, "summary", "--json", imported)
            dev = json.loads(r.stdout)["devices"][0]
            if timeline.endswith("raw.json.gz"):
                raw = json.load(gzip.open(p))
                live, peak = 0, 0
                # Rows [time_ns, action, bytes, category]: action 1 pre-existing, 2 create,
                # 3 increment version (a -bytes row and a +bytes row), 4 destroy (-bytes); the
                # running sum of the bytes is the timeline's total.
                for row in raw:
                    live += row[2]
                    peak = max(peak, live)
                note(f"  {timeline}: {len(raw)} raw events")
            else:
                data = json.load(gzip.open(p))
                # [times, sizes]: one row of per-category bytes for each time.
                peak = max((sum(row) for row in data[1]), default=0)
            check(dev["peak_allocated_bytes"] == peak or dev["peak"]["bytes"] == peak,
                  f"  imported {timeline}: peak {dev['peak_allocated_bytes']} / live {dev['peak']['bytes']}; the timeline's own peak {peak}")
else:
    check(False, "profiler.json and profiler.pt.trace.json came back")

# 5. Cost, dump time and size.
rows = []
cost_runs = sorted(d for d in os.listdir(os.path.join(work, "run-cost"))) if os.path.isdir(os.path.join(work, "run-cost")) else []
if cost_runs:
    import statistics  # noqa: E402

    pooled = {(a, st, k): [] for a in ("native", "memsnap") for st in ("off", "on") for k in ("step_s", "empty_us")}
    ratios = {(st, k): [] for st in ("off", "on") for k in ("step_s", "empty_us")}
    for r in cost_runs:
        got = {a: read_json(os.path.join(work, "run-cost", r, f"{a}.cost.json")) for a in ("native", "memsnap")}
        if not all(got.values()):
            note(f"cost round {r}: a process did not finish")
            continue
        for st in ("off", "on"):
            for k in ("step_s", "empty_us"):
                for a in ("native", "memsnap"):
                    pooled[(a, st, k)] += got[a]["cost"][st][k]
                ratios[(st, k)].append(statistics.median(got["memsnap"]["cost"][st][k])
                                       / statistics.median(got["native"]["cost"][st][k]))
    med = {key: statistics.median(v) for key, v in pooled.items() if v}
    labels = {("off", "step_s"): ("median step time, history off", 1.05), ("on", "step_s"): ("median step time, history on (stacks=\"all\")", 1.0),
              ("off", "empty_us"): ("torch.empty per op, history off", 1.05), ("on", "empty_us"): ("torch.empty per op, history on (stacks=\"all\")", 1.0)}
    for (st, k), (what, target) in labels.items():
        if ("native", st, k) not in med:
            continue
        t, m = med[("native", st, k)], med[("memsnap", st, k)]
        fmt = (lambda v: f"{v * 1e3:.2f} ms") if k == "step_s" else (lambda v: f"{v:.2f} µs")
        ratio = m / t
        rows.append((what, fmt(t), fmt(m), ratio, target))
        per_round = ", ".join(f"{x:.3f}" for x in ratios[(st, k)])
        check(ratio <= target, f"cost (alternating processes, {len(cost_runs)} rounds): {what}: torch {fmt(t)}, "
              f"memsnap {fmt(m)}: {ratio:.3f}x pooled; per round {per_round} (target <= {target})")
    note(f"pooled: {len(pooled[('native', 'off', 'step_s')])} timed steps and {len(pooled[('native', 'off', 'empty_us')])} "
         "torch.empty loops (20,000 ops each) per allocator and setting")
elif native_result.get("cost") and memsnap_result.get("cost"):
    nc, mc = native_result["cost"], memsnap_result["cost"]
    off_step = mc["off"]["median_step_s"] / nc["off"]["median_step_s"]
    on_step = mc["on"]["median_step_s"] / nc["on"]["median_step_s"]
    off_empty = mc["off"]["median_empty_us"] / nc["off"]["median_empty_us"]
    on_empty = mc["on"]["median_empty_us"] / nc["on"]["median_empty_us"]
    rows = [
        ("median step time, history off", f"{nc['off']['median_step_s'] * 1e3:.2f} ms", f"{mc['off']['median_step_s'] * 1e3:.2f} ms", off_step, 1.05),
        ("median step time, history on (stacks=\"all\")", f"{nc['on']['median_step_s'] * 1e3:.2f} ms", f"{mc['on']['median_step_s'] * 1e3:.2f} ms", on_step, 1.0),
        ("torch.empty per op, history off", f"{nc['off']['median_empty_us']:.2f} µs", f"{mc['off']['median_empty_us']:.2f} µs", off_empty, 1.05),
        ("torch.empty per op, history on (stacks=\"all\")", f"{nc['on']['median_empty_us']:.2f} µs", f"{mc['on']['median_empty_us']:.2f} µs", on_empty, 1.0),
    ]
    for what, t, m, ratio, target in rows:
        check(ratio <= target, f"cost: {what}: torch {t}, memsnap {m}: {ratio:.3f}x (target <= {target})")
    n_steps = len(nc["off"]["step_s"])
    note(f"{n_steps} timed steps per setting and allocator; torch.empty: 20,000 ops, {len(nc['off']['empty_us'])} loops each")
for name, result in (("torch", native_result), ("memsnap", memsnap_result)):
    if "dump_s" in result:
        note(f"{name}: dump {result['dump_s']:.2f} s, {result['snapshot_bytes']:,} bytes; peak allocated "
             f"{mib(result['peak_allocated'])}, reserved {mib(result['peak_reserved'])}")
if args.markdown:
    with open(args.markdown, "w") as f:
        f.write("| | PyTorch | memsnap | memsnap / PyTorch | target |\n| --- | ---: | ---: | ---: | ---: |\n")
        for what, t, m, ratio, target in rows:
            f.write(f"| {what} | {t} | {m} | {ratio:.3f} | ≤ {target} |\n")
        for label, key, fmt in (("dump time", "dump_s", lambda v: f"{v:.2f} s"),
                                ("snapshot size", "snapshot_bytes", lambda v: f"{v / 1e6:.1f} MB")):
            if key in native_result and key in memsnap_result:
                ratio = memsnap_result[key] / native_result[key]
                f.write(f"| {label} | {fmt(native_result[key])} | {fmt(memsnap_result[key])} | {ratio:.3f} | |\n")

print(f"\n{len(failures)} failed" if failures else "\nall agree")
sys.exit(1 if failures else 0)
