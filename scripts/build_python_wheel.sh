#!/usr/bin/env bash
# Builds the release wheel of the Python package (python/) into dist/: the PyO3 extension,
# the `memsnap` and `memsnap-viewer` programs and the recorder's shared library, for this
# platform. Needs maturin (pip install maturin==1.9.6).
#   bash scripts/build_python_wheel.sh && pip install dist/memsnap-*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
MATURIN="${MATURIN:-maturin}"
cargo build --release --locked --bin memsnap --bin memsnap-viewer
cargo build --release --locked -p memsnap-recorder-ffi --lib --features cuda,hip
rm -rf python/memsnap/_bin python/memsnap/_lib
mkdir -p python/memsnap/_bin python/memsnap/_lib
cp "$TARGET_DIR/release/memsnap" "$TARGET_DIR/release/memsnap-viewer" python/memsnap/_bin/
cp "$TARGET_DIR/release/libmemsnap_recorder.so" python/memsnap/_lib/
"$MATURIN" build --release --locked --manifest-path python/Cargo.toml --out dist
ls -l dist/memsnap-*.whl
