"""One deterministic training workload, run under PyTorch's own caching allocator or under
memsnap's (``CUDAPluggableAllocator`` over libmemsnap_recorder.so), so the two histories can
be compared entry by entry. Used by scripts/gpu_check.sh on a machine with an NVIDIA GPU.

    python3 torch_workload.py native  OUT_DIR
    python3 torch_workload.py memsnap OUT_DIR   (MEMSNAP_LIBRARY names the library)

Writes OUT_DIR/<mode>.pickle (the snapshot), OUT_DIR/<mode>.stats.json (memory_stats() before
the planned OOM) and OUT_DIR/<mode>.oom.txt (what the planned out-of-memory raised).
"""

import json
import os
import sys

mode, out_dir = sys.argv[1], sys.argv[2]
if mode == "memsnap":
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "recorder-ffi", "python"))
    import memsnap_torch

    memsnap_torch.enable(max_entries=500_000, stacks="all",
                         dump_on_oom=os.path.join(out_dir, "memsnap.on_oom.pickle"))

import torch  # noqa: E402

if mode == "native":
    torch.cuda.memory._record_memory_history(max_entries=500_000)

torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.benchmark = False


class Block(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm1 = torch.nn.LayerNorm(width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def train():
    width, vocab = 512, 8192
    embed = torch.nn.Embedding(vocab, width).cuda()
    blocks = torch.nn.ModuleList(Block(width, 8) for _ in range(4)).cuda()
    head = torch.nn.Linear(width, vocab).cuda()
    params = list(embed.parameters()) + list(blocks.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    side = torch.cuda.Stream()
    # Varying sequence lengths make the allocator split, reuse and grow segments.
    for step, seq in enumerate([128, 256, 192, 320, 96, 256]):
        tokens = torch.randint(0, vocab, (16, seq), device="cuda")
        x = embed(tokens)
        for block in blocks:
            x = block(x)
        loss = torch.nn.functional.cross_entropy(head(x).flatten(0, 1), tokens.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # A tensor used on a side stream: record_stream delays its reuse.
        with torch.cuda.stream(side):
            scratch = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
            scratch.fill_(step)
        scratch.record_stream(torch.cuda.current_stream())
        del scratch
        torch.cuda.synchronize()
    del tokens, x, loss


train()
torch.cuda.synchronize()
if mode == "native":
    stats = torch.cuda.memory_stats()
else:
    stats = memsnap_torch.memory_stats()
with open(os.path.join(out_dir, f"{mode}.stats.json"), "w") as f:
    json.dump(stats, f, indent=1, sort_keys=True)

# A planned out-of-memory under a 2% memory fraction: both allocators must raise it and record it.
torch.cuda.set_per_process_memory_fraction(0.02)
try:
    huge = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    outcome = f"no error: the tensor's data_ptr is {huge.data_ptr():#x}"
    del huge
except torch.OutOfMemoryError as e:
    outcome = "OutOfMemoryError: " + str(e).splitlines()[0]
    if mode == "native":
        # What memsnap's dump_on_oom does, so both histories end with the same `snapshot` entry.
        torch.cuda.memory._dump_snapshot(os.path.join(out_dir, "native.on_oom.pickle"))
except RuntimeError as e:
    outcome = "RuntimeError: " + str(e).splitlines()[0]
with open(os.path.join(out_dir, f"{mode}.oom.txt"), "w") as f:
    f.write(outcome + "\n")
torch.cuda.set_per_process_memory_fraction(1.0)

snapshot = os.path.join(out_dir, f"{mode}.pickle")
if mode == "native":
    torch.cuda.memory._dump_snapshot(snapshot)
else:
    memsnap_torch.dump(snapshot)
print(f"{mode}: {outcome}; wrote {snapshot}")
