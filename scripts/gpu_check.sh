#!/usr/bin/env bash
# The checks that need an NVIDIA GPU and PyTorch, as one short script for a machine that has
# them but no Rust toolchain. Build the bundle first on any x86-64 Linux machine:
#
#     bash scripts/gpu_bundle.sh            # -> .gpu-bundle/ (release builds, stripped, the wheel)
#
# then, on the GPU machine, from the repository root:
#
#     bash scripts/gpu_check.sh OUT_DIR
#
# 1. the recorder's CUDA backend against the real driver (recorder-it real_cuda), the C ABI
#    through ctypes on the cuda backend, and the cuda_alloc example;
# 2. scripts/gpu/gpt_workload.py (8-block GPT, bf16 autocast, AdamW) under PyTorch's caching
#    allocator with _record_memory_history(stacks="all") and under memsnap.torch.enable(stacks=
#    "all") from the installed wheel: snapshots, memory_stats(), dump time and size, the planned
#    out-of-memory and the step after it, and the cost (step time, torch.empty per op) with the
#    history off and on;
# 3. the same run with expandable segments, and under torch.profiler(profile_memory=True,
#    with_stack=True) with export_memory_timeline;
# 4. live (issue 26): the run under memsnap.torch.enable(live=..., modules=True) with `memsnap
#    watch --json --save` attached while it trains (scripts/gpu/live_check.py): what the watch
#    received against the program's own dump, its step lines against `memsnap summary`, and
#    `memsnap advise` aiming checkpointing at the recorded module names.
# Each part writes its own OUT_DIR/<part>.tar.gz as soon as it ends (what a timeout leaves still
# comes back); scripts/gpu_compare.py compares them on any machine. GPU_CHECK_PARTS picks parts
# (default "misc native memsnap expandable profiler live"; "native2" is a second PyTorch run of the
# recorded steps alone, to see what differs between two runs of PyTorch itself; "cost" measures
# the cost alone in alternating processes).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: gpu_check.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
bundle="$PWD/.gpu-bundle"
work="$(mktemp -d)"
status=0
started=$SECONDS
step() { echo; echo "== $* (+$((SECONDS - started)) s)"; }
pack() { # pack NAME FILES... : gzip the snapshots, tar them into OUT_DIR/NAME.tar.gz
    local name="$1"; shift
    mkdir -p "$work/$name"
    for f in "$@"; do [ -e "$f" ] && mv "$f" "$work/$name/"; done
    (cd "$work/$name" && for f in *.pickle *.json; do [ -e "$f" ] && [ "$(stat -c %s "$f")" -gt 65536 ] && gzip -6 "$f"; done; true)
    tar -C "$work" -czf "$out/$name.tar.gz" "$name"
    ls -l "$work/$name"
}

parts=" ${GPU_CHECK_PARTS:-misc native memsnap expandable profiler live} "
want() { [[ "$parts" == *" $1 "* ]]; }

step "machine"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "python", sys.version.split()[0])'
    nproc
} | tee "$work/machine.txt" || status=1

step "memsnap wheel"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/memsnap-site \
    "$bundle"/memsnap-*.whl || status=1
export PYTHONPATH=/tmp/memsnap-site
export MEMSNAP_CACHE_DIR="$work/cache"
python3 -c 'import memsnap, memsnap.torch; print(memsnap.__file__, memsnap.torch.library_path())' || status=1

if want misc; then
step "recorder: CUDA backend against the real driver"
MEMSNAP_REAL_CUDA=1 timeout 90 "$bundle/recorder-it" real_cuda --test-threads=1 2>&1 | tee "$work/real_cuda.txt" || status=1

step "C ABI through ctypes on the cuda backend"
MEMSNAP_BACKEND=cuda timeout 45 python3 recorder-ffi/python/test_memsnap_ctypes.py \
    --library "$bundle/libmemsnap_recorder.so" --out "$work/ctypes.pickle" --expect "$work/ctypes-frames.tsv" || status=1

step "cuda_alloc example"
timeout 30 "$bundle/cuda_alloc" "$work/cuda_alloc.pickle" || status=1
cp "$(python3 -c 'import torch.cuda._memory_viz as m; print(m.__file__)')" "$work/_memory_viz.py"
pack misc "$work/machine.txt" "$work/real_cuda.txt" "$work/ctypes.pickle" "$work/ctypes-frames.tsv" \
    "$work/cuda_alloc.pickle" "$work/_memory_viz.py"
fi

for mode in native memsnap; do
    want "$mode" || continue
    step "GPT training under the $mode allocator"
    mkdir -p "$work/run-$mode"
    PYTHONUNBUFFERED=1 timeout 120 python3 scripts/gpu/gpt_workload.py "$mode" "$work/run-$mode" \
        2>&1 | tee "$work/run-$mode/$mode.log" || status=1
    pack "$mode" "$work/run-$mode"/*
done

if want native2; then
    step "GPT training under PyTorch's allocator again: the recorded steps alone"
    mkdir -p "$work/run-native2"
    PYTHONUNBUFFERED=1 timeout 90 python3 scripts/gpu/gpt_workload.py native "$work/run-native2" --cost-rounds 0 \
        --skip-oom 2>&1 | tee "$work/run-native2/native2.log" || status=1
    pack native2 "$work/run-native2"/*
fi

if want cost; then
    # The cost alone, PyTorch's allocator and memsnap's in alternating processes (3 each), so
    # that a drift of the machine shows in both.
    mkdir -p "$work/run-cost"
    for round in 1 2 3; do
        for mode in native memsnap; do
            step "cost, round $round, $mode"
            mkdir -p "$work/run-cost/$round"
            PYTHONUNBUFFERED=1 timeout 60 python3 scripts/gpu/gpt_workload.py "$mode" "$work/run-cost/$round" \
                --cost-only --cost-rounds 3 2>&1 | tail -3 || status=1
        done
    done
    (cd "$work" && tar -czf "$out/cost.tar.gz" run-cost)
fi

if want expandable; then
step "GPT training, PyTorch's allocator with expandable segments"
mkdir -p "$work/run-expandable"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1 timeout 75 \
    python3 scripts/gpu/gpt_workload.py expandable "$work/run-expandable" 2>&1 | tee "$work/run-expandable/expandable.log" || status=1
pack expandable "$work/run-expandable"/*
fi

if want profiler; then
step "GPT training under torch.profiler(profile_memory=True, with_stack=True)"
mkdir -p "$work/run-profiler"
PYTHONUNBUFFERED=1 timeout 100 python3 scripts/gpu/gpt_workload.py profiler "$work/run-profiler" \
    2>&1 | tee "$work/run-profiler/profiler.log" || status=1
pack profiler "$work/run-profiler"/*
fi

if want live; then
step "GPT training published live, memsnap watch attached"
mkdir -p "$work/run-live"
# LIVE_CHECK_ARGS=--stand-in tries this part on a machine without a GPU or PyTorch.
PYTHONUNBUFFERED=1 timeout 200 python3 scripts/gpu/live_check.py "$work/run-live" ${LIVE_CHECK_ARGS:-} \
    2>&1 | tee "$work/run-live/live_check.log" || status=1
rm -f "$work/run-live/live.sock" "$work/run-live/go"
pack live "$work/run-live"/*
fi

ls -l "$out"
echo; echo "gpu_check: $([ $status = 0 ] && echo passed || echo FAILED) in $((SECONDS - started)) s"
exit $status
