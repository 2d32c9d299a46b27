"""A GPT-style training run for the checks that need a real GPU (scripts/gpu_check.sh): 8
transformer blocks (causal attention + MLP), bf16 autocast, AdamW, batches of varying sequence
length, a few GB of activations. Deterministic, so two runs make the same allocation requests.

    python3 gpt_workload.py native     OUT_DIR   PyTorch's caching allocator, its recorder on
    python3 gpt_workload.py memsnap    OUT_DIR   memsnap.torch.enable(stacks="all")
    python3 gpt_workload.py expandable OUT_DIR   PyTorch's allocator with expandable segments
    python3 gpt_workload.py profiler   OUT_DIR   torch.profiler(profile_memory, with_stack) and
                                                  export_memory_timeline, PyTorch's allocator
    python3 gpt_workload.py live OUT_DIR --live unix:PATH
                                                  memsnap.torch.enable(live=..., modules=True)
                                                  for live_check.py: waits for OUT_DIR/go,
                                                  records the steps, dumps live.pickle, stops

native and memsnap: record the first RECORDED_STEPS steps from the start of the program with
stacks="all", write OUT_DIR/<mode>.pickle and <mode>.stats.json (memory_stats() then), then
run out of memory on purpose (an allocation larger than the GPU: <mode>.on_oom.pickle is the
snapshot at that moment) and one more training step, then measure the cost: median step time and
a torch.empty loop over random sizes, with the history off and on (stacks="all"), alternating. Everything measured goes to OUT_DIR/<mode>.json.
"""

import argparse
import json
import os
import random
import statistics
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["native", "memsnap", "expandable", "profiler", "live"])
parser.add_argument("out")
parser.add_argument("--cost-rounds", type=int, default=2)
parser.add_argument("--skip-oom", action="store_true", help="stop after the recorded steps' snapshot")
parser.add_argument("--cost-only", action="store_true",
                    help="no recording, snapshot or OOM: the cost rounds alone, into <mode>.cost.json")
parser.add_argument("--cost-steps", type=int, default=12, help="timed steps per round and setting")
parser.add_argument("--live", help="live mode: the address to publish the history at")
args = parser.parse_args()
out = args.out
results = {"mode": args.mode}

if args.mode == "memsnap":
    import memsnap.torch as memsnap_torch

    started = time.perf_counter()
    memsnap_torch.enable(max_entries=2_000_000, stacks="all",
                         dump_on_oom=os.path.join(out, "memsnap.on_oom.pickle"))
    results["enable_s"] = time.perf_counter() - started
    results["oom_shim"] = memsnap_torch._oom_shim_path or None
elif args.mode == "live":
    import memsnap.torch as memsnap_torch

    started = time.perf_counter()
    memsnap_torch.enable(max_entries=2_000_000, stacks="all", live=args.live, modules=True)
    results["enable_s"] = time.perf_counter() - started
    results["live_address"] = memsnap_torch.live_address()
    # live_check.py attaches `memsnap watch` first, so that the entries reach it as they are
    # recorded (a later listener would get them all in the state at connect).
    go = os.path.join(out, "go")
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

if args.mode in ("native", "expandable") and not args.cost_only:
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="all")

torch.manual_seed(0)
torch.backends.cudnn.benchmark = False
RECORDED_STEPS = [(8, 1024), (8, 768), (12, 512), (8, 1024), (8, 896), (8, 640)]


class Block(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, 4 * width)
        self.out = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab=32768, width=1024, heads=16, layers=8, context=1024):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


model = GPT().cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
generator = torch.Generator(device="cuda").manual_seed(1)


def train_step(batch, seq):
    tokens = torch.randint(0, 32768, (batch, seq + 1), device="cuda", generator=generator)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def set_history(on):
    if args.mode in ("memsnap", "live"):
        memsnap_torch.record_history("all" if on else None, stacks="all", max_entries=2_000_000)
    else:
        torch.cuda.memory._record_memory_history("all" if on else None, stacks="all", max_entries=2_000_000)


def stats():
    return memsnap_torch.memory_stats() if args.mode in ("memsnap", "live") else torch.cuda.memory_stats()


def dump(path):
    started = time.perf_counter()
    if args.mode in ("memsnap", "live"):
        memsnap_torch.dump(path)
    else:
        torch.cuda.memory._dump_snapshot(path)
    return time.perf_counter() - started


def timed_steps(n):
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        started = time.perf_counter()
        train_step(8, 1024)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return times


rng = random.Random(7)
EMPTY_SIZES = [int(2 ** rng.uniform(9, 26)) for _ in range(20_000)]


def empty_loop():
    """Per-op µs of torch.empty over random sizes (512 B to 64 MiB), 64 kept alive: each op is
    one allocation and (after the first 64) one free."""
    live = [None] * 64
    torch.cuda.synchronize()
    started = time.perf_counter()
    for i, size in enumerate(EMPTY_SIZES):
        live[i % 64] = torch.empty(size, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    del live
    return elapsed / len(EMPTY_SIZES) * 1e6


def run_recorded_steps():
    """The recorded steps, each timed; their peaks into `results`; returns memory_stats()."""
    step_times = []
    for batch, seq in RECORDED_STEPS:
        torch.cuda.synchronize()
        started = time.perf_counter()
        train_step(batch, seq)
        torch.cuda.synchronize()
        step_times.append(time.perf_counter() - started)
    results["recorded_step_s"] = step_times
    final = stats()
    results["peak_allocated"] = final["allocated_bytes.all.peak"]
    results["peak_reserved"] = final["reserved_bytes.all.peak"]
    return final


if args.mode == "live":
    run_recorded_steps()
    results["dump_s"] = dump(os.path.join(out, "live.pickle"))
    # History stays on: the listener gets what it has not been sent yet (its first native
    # stacks are symbolised from libtorch's symbols) before the exit.
    time.sleep(5.0)
    with open(os.path.join(out, "live.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("live:", results, flush=True)
    sys.exit(0)

if args.mode == "profiler":
    from torch.profiler import ProfilerActivity, profile

    for batch, seq in RECORDED_STEPS[:2]:  # warm-up outside the profile
        train_step(batch, seq)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_stats()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True,
                 with_stack=True, record_shapes=True) as prof:
        for batch, seq in RECORDED_STEPS[:2]:
            train_step(batch, seq)
        torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    results["allocated_at_start"] = before["allocated_bytes.all.current"]
    results["reserved_at_start"] = before["reserved_bytes.all.current"]
    results["peak_allocated"] = after["allocated_bytes.all.peak"]
    results["peak_reserved"] = after["reserved_bytes.all.peak"]
    results["allocated_at_end"] = after["allocated_bytes.all.current"]
    prof.export_chrome_trace(os.path.join(out, "profiler.pt.trace.json"))
    prof.export_memory_timeline(os.path.join(out, "memory_timeline.raw.json.gz"), device="cuda:0")
    prof.export_memory_timeline(os.path.join(out, "memory_timeline.json.gz"), device="cuda:0")
    with open(os.path.join(out, "profiler.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("profiler:", results)
    sys.exit(0)

def record_and_run_out_of_memory():
    """The recorded steps from the first allocation of the program, their snapshot, then the
    planned out-of-memory and the step after it."""
    final = run_recorded_steps()
    with open(os.path.join(out, f"{args.mode}.stats.json"), "w") as f:
        json.dump(final, f, indent=1, sort_keys=True)
    snapshot = os.path.join(out, f"{args.mode}.pickle")
    results["dump_s"] = dump(snapshot)
    results["snapshot_bytes"] = os.path.getsize(snapshot)
    print(f"{args.mode}: {len(RECORDED_STEPS)} steps recorded, peak allocated {results['peak_allocated']}, "
          f"dump {results['dump_s']:.2f} s, {results['snapshot_bytes']} bytes", flush=True)
    if args.mode == "expandable" or args.skip_oom:
        return
    # Out of memory on purpose, with the history on: an allocation larger than the GPU.
    try:
        huge = torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
        results["oom"] = f"no error: the tensor's data_ptr is {huge.data_ptr():#x}"
        del huge
    except torch.OutOfMemoryError as e:
        results["oom"] = "torch.OutOfMemoryError: " + str(e).splitlines()[0]
        if args.mode == "native":
            torch.cuda.memory._dump_snapshot(os.path.join(out, "native.on_oom.pickle"))
    except RuntimeError as e:
        results["oom"] = f"{type(e).__name__}: " + str(e).splitlines()[0]
    results["oom_dump_written"] = os.path.exists(os.path.join(out, f"{args.mode}.on_oom.pickle"))
    loss = train_step(8, 1024)
    torch.cuda.synchronize()
    results["step_after_oom_loss"] = loss.item()
    print(f"{args.mode}: OOM -> {results['oom']}; the next step ran (loss {loss.item():.3f})", flush=True)


def measure_cost():
    """History off and on (stacks="all"), alternating in rounds, after a warm-up."""
    set_history(False)
    timed_steps(3)
    empty_loop()
    cost = {"off": {"step_s": [], "empty_us": []}, "on": {"step_s": [], "empty_us": []}}
    for _ in range(args.cost_rounds):
        for setting in ("off", "on"):
            set_history(setting == "on")
            cost[setting]["step_s"] += timed_steps(args.cost_steps)
            cost[setting]["empty_us"] += [empty_loop() for _ in range(3)]
    for setting, measured in cost.items():
        measured["median_step_s"] = statistics.median(measured["step_s"])
        measured["median_empty_us"] = statistics.median(measured["empty_us"])
        print(f"{args.mode} history {setting}: median step {measured['median_step_s'] * 1e3:.2f} ms, "
              f"torch.empty {measured['median_empty_us']:.2f} us/op", flush=True)
    results["cost"] = cost


if args.cost_only:
    set_history(False)
    for batch, seq in RECORDED_STEPS:  # the recorded run's steps, unrecorded, as a warm-up
        train_step(batch, seq)
    measure_cost()
    name = f"{args.mode}.cost.json"
else:
    record_and_run_out_of_memory()
    if args.mode != "expandable" and not args.skip_oom and args.cost_rounds:
        measure_cost()
    name = f"{args.mode}.json"
with open(os.path.join(out, name), "w") as f:
    json.dump(results, f, indent=1)
