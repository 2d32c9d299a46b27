"""Issue 26 on a real GPU: the GPT run of gpt_workload.py under memsnap.torch.enable(live=...,
modules=True), with `memsnap watch --json --save` attached while it trains.

    python3 live_check.py OUT_DIR

1. starts `gpt_workload.py live OUT_DIR --live unix:OUT_DIR/live.sock`, which enables memsnap
   with the history published on that socket and a module range around every nn.Module call,
   then waits for OUT_DIR/go before its first CUDA allocation;
2. once the socket exists, starts `memsnap watch unix:... --json --save received.pickle`
   (the wheel's program), then writes OUT_DIR/go;
3. the workload trains the recorded steps, dumps live.pickle, turns the history off (nothing
   more is recorded), waits a second for the listener and exits; the watch sees the stream end,
   saves what it received and exits 0;
4. compares what the watch received with the program's own dump (every trace entry and its
   frames, the segments, the annotations), the watch's step lines with `memsnap summary`'s
   steps, and asks `memsnap advise` for checkpointing aimed at the recorded module names.

Every result goes to OUT_DIR/live_check.json; the exit status is 0 when every check passed.

    python3 live_check.py OUT_DIR --stand-in

runs the same checks on a machine without a GPU or PyTorch: the workload is then a small
training loop of this file's own (``stand_in``) on the recorder's simulated device, with the
same module ranges, so the orchestration and the checks are tested before GPU time is spent
(python/tests/test_gpu_scripts.py).
"""

import json
import os
import subprocess
import sys
import time


# Python stacks only by default: a test build's first native symbolisation (its own debug
# info) can take the listener longer than the whole stand-in run; `MEMSNAP_STAND_IN_STACKS=all`
# checks native and Python stacks merged (enable()'s default).
STAND_IN_STACKS = os.environ.get("MEMSNAP_STAND_IN_STACKS", "python")


def stand_in(out, address):
    """A small training loop on the simulated device: a GPT of 4 blocks whose forward keeps
    8 MiB of activations per block until its backward, module ranges as enable(modules=True)
    records them, 6 steps, Python stacks (``MEMSNAP_STAND_IN_STACKS=all``: native too,
    enable()'s default); then what gpt_workload.py's live mode does at its end."""
    import memsnap.torch as memsnap_torch

    lib = memsnap_torch.load_library()
    memsnap_torch.record_history("all", context="all", stacks=STAND_IN_STACKS, max_entries=1_000_000)
    memsnap_torch.serve_live(address)
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < deadline:
        time.sleep(0.02)
    weights = [lib.memsnap_alloc(4 << 20, 0, None) for _ in range(4)]
    optimizer_state = []
    for step in range(6):
        memsnap_torch.annotate("START", "memsnap.module: GPT")
        activations = []
        for block in range(4):
            memsnap_torch.annotate("START", f"memsnap.module: blocks.{block}")
            activations.append([lib.memsnap_alloc(8 << 20, 0, None) for _ in range(2)])
            memsnap_torch.annotate("END", f"memsnap.module: blocks.{block}")
        memsnap_torch.annotate("END", "memsnap.module: GPT")
        grads = []
        for block in reversed(range(4)):
            grads.append(lib.memsnap_alloc(4 << 20, 0, None))
            for ptr in activations.pop():
                lib.memsnap_free(ptr, 0, 0, None)
        if step == 0:
            optimizer_state = [lib.memsnap_alloc(8 << 20, 0, None) for _ in range(4)]
        for ptr in grads:
            lib.memsnap_free(ptr, 0, 0, None)
        time.sleep(0.05)
    memsnap_torch.dump(os.path.join(out, "live.pickle"))
    # No wait: at exit the C ABI lets the listener be sent the end of the run (at most 2 s).
    del weights, optimizer_state


if len(sys.argv) == 4 and sys.argv[1] == "--be-stand-in":
    stand_in(sys.argv[2], sys.argv[3])
    sys.exit(0)

out = os.path.abspath(sys.argv[1])
standing_in = "--stand-in" in sys.argv[2:]
os.makedirs(out, exist_ok=True)
here = os.path.dirname(os.path.abspath(__file__))
sock = os.path.join(out, "live.sock")
go = os.path.join(out, "go")
received = os.path.join(out, "received.pickle")
dumped = os.path.join(out, "live.pickle")
results = {"checks": {}}


def check(name, ok, detail=""):
    results["checks"][name] = {"ok": bool(ok), "detail": detail}
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


import memsnap  # noqa: E402  (from the wheel, PYTHONPATH set by gpu_check.sh)

program = memsnap.program_path("memsnap")
if standing_in:
    workload = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--be-stand-in", out, f"unix:{sock}"],
        env=dict(os.environ, MEMSNAP_BACKEND="simulated"),
    )
else:
    workload = subprocess.Popen(
        [sys.executable, os.path.join(here, "gpt_workload.py"), "live", out, "--live", f"unix:{sock}"]
    )
deadline = time.monotonic() + 60
while not os.path.exists(sock):
    if workload.poll() is not None or time.monotonic() > deadline:
        check("socket", False, f"no socket at {sock} (workload exit {workload.poll()})")
        workload.kill()
        sys.exit(1)
    time.sleep(0.02)
mode = oct(os.stat(sock).st_mode & 0o777)
check("socket_mode_0600", mode == "0o600", mode)
started = time.monotonic()
watch = subprocess.Popen(
    [program, "watch", f"unix:{sock}", "--json", "--save", received],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
)
time.sleep(0.5)
open(go, "w").close()
try:
    watch_out, watch_err = watch.communicate(timeout=150)
except subprocess.TimeoutExpired:
    watch.kill()
    watch_out, watch_err = watch.communicate()
workload_rc = workload.wait(timeout=60)
results["watch_s"] = time.monotonic() - started
results["watch_rc"] = watch.returncode
results["watch_stderr"] = watch_err[-4000:]
lines = [json.loads(line) for line in watch_out.splitlines() if line.startswith("{")]
results["watch_steps"] = lines
with open(os.path.join(out, "watch.jsonl"), "w") as f:
    f.write(watch_out)
check("workload_exit_0", workload_rc == 0, str(workload_rc))
check("watch_exit_0", watch.returncode == 0, f"{watch.returncode}: {watch_err.strip()[-300:]}")
if not (os.path.exists(received) and os.path.exists(dumped)):
    check("snapshots_written", False, f"received {os.path.exists(received)}, dump {os.path.exists(dumped)}")
    json.dump(results, open(os.path.join(out, "live_check.json"), "w"), indent=1)
    sys.exit(1)

# What the watch received against the program's own dump.
mine, theirs = memsnap.load(received), memsnap.load(dumped)
keys = ("action", "addr", "size", "stream", "frames")


def entries(snapshot):
    traces = snapshot.get("device_traces") or [[]]
    return [tuple(str(e.get(k)) for k in keys) for e in traces[0]]


def segments(snapshot):
    """The segments and their blocks; an inactive block's requested size is left out (the
    watch rebuilds the segments from the entries, and a free block keeps no request)."""
    return json.dumps(
        [
            {**seg, "blocks": [{k: v for k, v in b.items() if not (k == "requested_size" and
                                                               b.get("state") == "inactive")}
                               for b in seg.get("blocks", [])]}
            for seg in snapshot.get("segments", [])
        ],
        sort_keys=True,
        default=str,
    )


got, want = entries(mine), entries(theirs)
# The program records on after its dump (the dump's own `snapshot` entry, what its exit frees):
# the dump's entries must be the first ones received, frames included.
after = got[len(want):]
first_difference = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
check(
    "entries_received_equal_recorded",
    got[: len(want)] == want,
    f"{len(got)} received, {len(want)} in the dump, first difference at {first_difference}, "
    f"{len(after)} after the dump",
)
results["entries"] = len(want)
if all(e[0] == "snapshot" for e in after):
    check("segments_equal", segments(mine) == segments(theirs),
          f"{len(theirs.get('segments', []))} segments in the dump")
else:
    results["segments_not_compared"] = f"{len(after)} entries after the dump change them"
annotations = [a for a in theirs.get("external_annotations", []) if a.get("device", 0) == 0]
modules = [a for a in annotations if str(a.get("name", "")).startswith("memsnap.module: ")]
check(
    "annotations_equal",
    [str(a.get("name")) for a in mine.get("external_annotations", [])][: len(annotations)]
    == [str(a.get("name")) for a in theirs.get("external_annotations", [])],
    f"{len(annotations)} in the dump, {len(modules)} of them module ranges",
)
names = sorted({str(a["name"])[len("memsnap.module: "):] for a in modules})
results["module_paths"] = names[:50]
check("module_ranges_recorded", any(n.startswith("blocks.") for n in names), ", ".join(names[:12]))

# The watch's steps against the summary's, and the advice on the named modules.
summary = json.loads(subprocess.run([program, "summary", "--json", dumped], capture_output=True,
                                    text=True, check=True).stdout)
results["summary"] = summary
steps = summary["devices"][0].get("steps", [])
# What the program did after its dump may make one more step.
check("watch_reported_every_step", len(lines) >= len(steps) > 0,
      f"{len(lines)} watch lines, {len(steps)} steps in the summary")
advise = subprocess.run([program, "advise", "--json", dumped], capture_output=True, text=True)
results["advise_rc"] = advise.returncode
try:
    advice = json.loads(advise.stdout)
except ValueError:
    advice = {"error": advise.stderr[-2000:]}
results["advise"] = advice
text = json.dumps(advice)
check("advise_names_modules", "blocks." in text, "a fix aimed at blocks.* or blocks.N"
      if "blocks." in text else advise.stderr.strip()[-300:])

with open(os.path.join(out, "live_check.json"), "w") as f:
    json.dump(results, f, indent=1, default=str)
failed = [name for name, c in results["checks"].items() if not c["ok"]]
print(f"live_check: {'passed' if not failed else 'FAILED: ' + ', '.join(failed)}")
sys.exit(1 if failed else 0)
