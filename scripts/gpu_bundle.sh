#!/usr/bin/env bash
# Builds what scripts/gpu_check.sh runs on a GPU machine without Rust, in .gpu-bundle/: the
# recorder's test binary and the C ABI library (both with the cuda feature), the cuda_alloc
# example, and the Python wheel (scripts/build_python_wheel.sh) without the viewer program, which
# the GPU checks do not run and which would take most of the 64 MiB a device call may carry.
# Release builds, stripped. Needs maturin for the wheel (MATURIN=path/to/maturin).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
rm -rf .gpu-bundle
mkdir -p .gpu-bundle
test_binary="$(cargo test --release --locked -p memsnap-recorder --features cuda --no-run \
    --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" and m.get("executable"):
        print(m["executable"])')"
cargo build --release --locked -p memsnap-recorder-ffi --features cuda
cargo build --release --locked --features cuda --example cuda_alloc
cp "$test_binary" .gpu-bundle/recorder-it
cp "$target/release/libmemsnap_recorder.so" .gpu-bundle/
cp "$target/release/examples/cuda_alloc" .gpu-bundle/
strip .gpu-bundle/recorder-it .gpu-bundle/libmemsnap_recorder.so .gpu-bundle/cuda_alloc
rm -f dist/memsnap-*.whl
bash scripts/build_python_wheel.sh
wheel="$(ls dist/memsnap-*.whl)"
cp "$wheel" .gpu-bundle/
# The viewer stays behind; the other programs and the library are stripped (the release
# profile keeps debug info, which would take most of the 64 MiB a device call may carry).
python3 - ".gpu-bundle/$(basename "$wheel")" <<'PY'
import os, subprocess, sys, tempfile, zipfile
path = sys.argv[1]
items = []
with zipfile.ZipFile(path) as src:
    for info in src.infolist():
        if info.filename.endswith("_bin/memsnap-viewer"):
            continue
        data = src.read(info.filename)
        if "/_bin/" in info.filename or "/_lib/" in info.filename:
            with tempfile.NamedTemporaryFile(delete=False) as f:
                f.write(data)
            subprocess.run(["strip", f.name], check=True)
            data = open(f.name, "rb").read()
            os.unlink(f.name)
        items.append((info, data))
tmp = path + ".tmp"
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
    for info, data in items:
        dst.writestr(info, data)
os.replace(tmp, path)
PY
ls -l .gpu-bundle
