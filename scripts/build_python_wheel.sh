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
# The release profile keeps line tables for profiling here; the wheel's copies need none
# (with them the wheel was 94 MB).
if command -v strip >/dev/null; then
  strip --strip-all python/memsnap/_bin/memsnap python/memsnap/_bin/memsnap-viewer
  strip --strip-unneeded python/memsnap/_lib/libmemsnap_recorder.so
else
  echo "notice: no strip: the wheel keeps the programs' debug info" >&2
fi
"$MATURIN" build --release --locked --manifest-path python/Cargo.toml --out dist
ls -l dist/memsnap-*.whl
