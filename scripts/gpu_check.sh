#!/usr/bin/env bash
# The checks that need an NVIDIA GPU and PyTorch, as one short script for a machine that has
# them but no Rust toolchain. Build the bundle first on any x86-64 Linux machine:
#
#     bash scripts/gpu_bundle.sh            # -> .gpu-bundle/ (release builds, stripped)
#
# then, on the GPU machine, from the repository root:
#
#     bash scripts/gpu_check.sh OUT_DIR
#
# It runs the recorder's CUDA backend tests against the real driver (MEMSNAP_REAL_CUDA=1), the
# C ABI through ctypes on the cuda backend, and one training workload twice: under PyTorch's own
# caching allocator and under memsnap's (CUDAPluggableAllocator). OUT_DIR/gpu-results.tar.gz
# holds both snapshots, their memory_stats(), the OOM outcomes and PyTorch's _memory_viz.py;
# scripts/gpu_compare.py (any machine with Python) compares them entry by entry and runs
# `memsnap memviz` against that _memory_viz.py.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: gpu_check.sh OUT_DIR}"
bundle=.gpu-bundle
work="$(mktemp -d)"
status=0
step() { echo; echo "== $*"; }

step "machine"
nvidia-smi -L || status=1
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' || status=1

step "recorder: CUDA backend against the real driver"
MEMSNAP_REAL_CUDA=1 "$bundle/recorder-it" real_cuda --test-threads=1 || status=1

step "C ABI through ctypes on the cuda backend"
MEMSNAP_BACKEND=cuda python3 recorder-ffi/python/test_memsnap_ctypes.py \
    --library "$bundle/libmemsnap_recorder.so" --out "$work/ctypes.pickle" --expect "$work/ctypes-frames.tsv" || status=1

for mode in native memsnap; do
    step "training workload under the $mode allocator"
    MEMSNAP_LIBRARY="$bundle/libmemsnap_recorder.so" PYTHONUNBUFFERED=1 \
        timeout 150 python3 scripts/gpu/torch_workload.py "$mode" "$work" || status=1
done

cp "$(python3 -c 'import torch.cuda._memory_viz as m; print(m.__file__)')" "$work/_memory_viz.py"
python3 -c 'import torch; print(torch.__version__)' > "$work/torch_version.txt"
mkdir -p "$out"
tar -C "$work" -czf "$out/gpu-results.tar.gz" .
ls -l "$work"
echo; echo "gpu_check: $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
