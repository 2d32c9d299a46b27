"""memsnap.load and memsnap.open side by side with pickle.load, on the same file, same run.

    python python/bench/bench_load.py FILE [FILE...] [--runs 3] [--only load] [--together]

(scripts/bench_python.sh makes the FILEs: a 1M-entry snapshot in both of PyTorch's layouts,
frames lists shared through the memo and a fresh frames list per entry, and builds the
release wheel.) Several files are measured one after the other in the same run. Each
measurement runs in a fresh interpreter, so peak RSS (ru_maxrss) is that of one method alone.
The two methods of a pair alternate, --runs times (with --together they run at the same
time, one per core, so both see the same machine); times are the best of each, ratios are
pickle / memsnap, of the bests and of each run's pair.

* load: build the whole object graph (``pickle.load(f)`` vs ``memsnap.load(path)``), then
  one full cyclic-GC pass (``gc.collect()``) so neither side leaves collection work behind;
* the same with the cyclic collector disabled around ``pickle.load`` (memsnap.load disables it
  while it builds; this shows how much of the difference that alone is);
* first query: the bytes reserved per device from the segments (what ``memviz stats``, the
  viewer's overview and most notebooks ask first): ``pickle.load`` + a sum over
  ``snapshot['segments']`` vs ``memsnap.open(path).segments.total_size``;
* trace query: the bytes allocated by ``alloc`` events over the whole trace: ``pickle.load`` +
  a loop over the entries vs ``memsnap.open(path).trace(0)`` columns.
"""

import argparse
import json
import subprocess
import sys

CHILD = r"""
import gc, json, resource, sys, time
method, path = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if method == "pickle.load":
    import pickle
    with open(path, "rb") as f:
        obj = pickle.load(f)
    gc.collect()
    result = len(obj["device_traces"][0])
elif method == "pickle.load gc off":
    import pickle
    gc.disable()
    with open(path, "rb") as f:
        obj = pickle.load(f)
    gc.enable()
    gc.collect()
    result = len(obj["device_traces"][0])
elif method == "memsnap.load":
    import memsnap
    obj = memsnap.load(path)
    gc.collect()
    result = len(obj["device_traces"][0])
elif method == "pickle first query":
    import pickle
    with open(path, "rb") as f:
        obj = pickle.load(f)
    result = sum(s["total_size"] for s in obj["segments"])
elif method == "memsnap.open first query":
    import memsnap
    snap = memsnap.open(path)
    result = int(snap.segments.total_size.sum())
elif method == "pickle trace query":
    import pickle
    with open(path, "rb") as f:
        obj = pickle.load(f)
    result = sum(e["size"] for e in obj["device_traces"][0] if e["action"] == "alloc")
elif method == "memsnap.open trace query":
    import memsnap
    trace = memsnap.open(path).trace(0)
    result = int(trace.size[trace.action_code == trace.action_names.index("alloc")].sum())
seconds = time.perf_counter() - t
print(json.dumps({"s": seconds, "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "result": result}))
"""

PAIRS = [
    ("load", "pickle.load", "memsnap.load"),
    ("load, pickle with gc off", "pickle.load gc off", "memsnap.load"),
    ("first query (segments)", "pickle first query", "memsnap.open first query"),
    ("trace query (alloc bytes)", "pickle trace query", "memsnap.open trace query"),
]


def child(method, path):
    return subprocess.Popen([sys.executable, "-c", CHILD, method, path], stdout=subprocess.PIPE, text=True)


def result(process):
    out, _ = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"a measurement failed (exit status {process.returncode})")
    return json.loads(out)


def measure_pair(reference, ours, path, runs, together):
    """`runs` rounds of the two methods, alternating (or, with `together`, at the same time,
    one per core, so that both see the same machine: on a shared VM the speed of the whole
    machine moves by a third from one second to the next). The best of each, and the ratio
    of each round's two times."""
    refs, gots = [], []
    for _ in range(runs):
        if together:
            pair = [child(reference, path), child(ours, path)]
            ref, got = (result(p) for p in pair)
        else:
            ref = result(child(reference, path))
            got = result(child(ours, path))
        refs.append(ref)
        gots.append(got)
    ratios = sorted(r["s"] / g["s"] for r, g in zip(refs, gots))
    return min(refs, key=lambda m: m["s"]), min(gots, key=lambda m: m["s"]), ratios


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=["load"], help="only the two load comparisons")
    parser.add_argument(
        "--together",
        action="store_true",
        help="run the two methods of a pair at the same time, one per core (needs 2 cores)",
    )
    args = parser.parse_args()
    import memsnap

    pairs = PAIRS[:2] if args.only == "load" else PAIRS
    mode = "each pair at the same time" if args.together else "alternating"
    print(f"python {sys.version.split()[0]}, memsnap {memsnap.__version__}, {args.runs} runs, {mode}")
    for path in args.files:
        print(f"== {path}")
        for title, reference, ours in pairs:
            ref, got, ratios = measure_pair(reference, ours, path, args.runs, args.together)
            if ref["result"] != got["result"]:
                raise SystemExit(f"{title}: results differ: {ref['result']} vs {got['result']}")
            print(
                f"{title:28} {reference} {ref['s']:.3f} s, {ref['rss_kib'] / 1024:.0f} MiB | "
                f"{ours} {got['s']:.3f} s, {got['rss_kib'] / 1024:.0f} MiB | "
                f"{ref['s'] / got['s']:.2f}x faster (best of each; per run "
                f"{' '.join(f'{r:.2f}' for r in ratios)}), "
                f"{got['rss_kib'] / ref['rss_kib']:.2f} of the memory"
            )


if __name__ == "__main__":
    main()
