"""What publishing the history live costs a Python caller of the C ABI (memsnap.torch's path):
per-op µs of memsnap_alloc + memsnap_free through ctypes, Python stacks on, on the recorder's
simulated device, in three settings, each in processes of its own, alternating over rounds:

* history: history on, nothing published;
* published: the device published live (`serve_live`), no listener: each call also notes the
  live numbers of its entries (two more lock acquisitions);
* reader: published, with a raw listener that reads the stream and discards it: the
  recorder's own cost of a listener (its thread copies, symbolises, encodes and writes);
* listener: published, with `memsnap watch` attached, receiving and finding the steps while the
  loop runs (on a 2-core machine the watch's analysis competes with the loop for the cores).

    python bench_live_cost.py [--ops N] [--rounds R]

Needs the memsnap package (the wheel, or MEMSNAP_LIBRARY / MEMSNAP_BIN_DIR for a build).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import os, sys, time
import memsnap.torch as mt
setting, ops, sock = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lib = mt.load_library()
mt.record_history("all", context="all", stacks="python", max_entries=1_000_000)
if setting != "history":
    mt.serve_live("unix:" + sock)
    if setting in ("reader", "listener"):
        while not os.path.exists(sock + ".go"):
            time.sleep(0.01)
sizes = [512 << (i % 12) for i in range(64)]
live = [None] * 64

def loop(n):
    for i in range(n):
        j = i % 64
        if live[j]:
            lib.memsnap_free(live[j], 0, 0, None)
        live[j] = lib.memsnap_alloc(sizes[j], 0, None)

loop(2000)  # warm-up: segments made, stacks interned
started = time.perf_counter()
loop(ops)
elapsed = time.perf_counter() - started
print(elapsed / ops * 1e6)
"""


READER = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
while s.recv(1 << 20):
    pass
"""


def run(setting, ops, workdir):
    sock = os.path.join(workdir, f"{setting}.sock")
    env = dict(os.environ, MEMSNAP_BACKEND="simulated")
    env.pop("MEMSNAP_LIVE", None)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, setting, str(ops), sock],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    watch = None
    if setting in ("reader", "listener"):
        import memsnap

        while not os.path.exists(sock):
            time.sleep(0.01)
        command = (
            [memsnap.program_path("memsnap"), "watch", "unix:" + sock]
            if setting == "listener"
            else [sys.executable, "-c", READER, sock]
        )
        watch = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        open(sock + ".go", "w").close()
    out, _ = child.communicate(timeout=600)
    if watch:
        watch.wait(timeout=60)
    return float(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = ["history", "published", "reader", "listener"]
    results = {s: [] for s in settings}
    with tempfile.TemporaryDirectory() as workdir:
        for _ in range(args.rounds):
            for s in settings:
                results[s].append(run(s, args.ops, workdir))
    base = statistics.median(results["history"])
    for s in settings:
        m = statistics.median(results[s])
        runs = ", ".join(f"{v:.2f}" for v in results[s])
        print(f"{s:10s} median {m:.2f} us/op ({runs})  {m / base:.2f}x history")


if __name__ == "__main__":
    main()
