#!/usr/bin/env bash
# Builds what scripts/gpu_check.sh runs on a GPU machine without Rust: the recorder's test
# binary and the C ABI library, both with the cuda feature, release, stripped, in .gpu-bundle/.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
mkdir -p .gpu-bundle
test_binary="$(cargo test --release --locked -p memsnap-recorder --features cuda --no-run \
    --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" and m.get("executable"):
        print(m["executable"])')"
cargo build --release --locked -p memsnap-recorder-ffi --features cuda
cp "$test_binary" .gpu-bundle/recorder-it
cp "$target/release/libmemsnap_recorder.so" .gpu-bundle/
strip .gpu-bundle/recorder-it .gpu-bundle/libmemsnap_recorder.so
ls -l .gpu-bundle
