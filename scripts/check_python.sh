#!/usr/bin/env bash
# The Python package (python/): builds the wheel, installs it into a fresh virtualenv with
# pytest, and runs python/tests against the installed wheel. scripts/check.sh calls it after
# `cargo test`, whose build it reuses: the wheel (its extension built with the dev profile in
# the same target dir) ships the `memsnap`/`memsnap-viewer` programs and the recorder library
# that `cargo test` already built. Needs python3 with venv and pip (Debian: python3-venv,
# python3-pip); maturin, pytest and numpy come from PyPI at the versions pinned below.
set -euo pipefail
cd "$(dirname "$0")/.."

MATURIN_VERSION=1.9.6
PYTEST_VERSION=8.3.4
NUMPY_VERSION=2.2.6
PYTHON="${PYTHON:-python3}"
TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
# Where maturin builds the extension: the same folder unless told (scripts/check.sh gives it a
# folder of its own so that it can build while `cargo test` runs in the other).
WHEEL_TARGET_DIR="${MEMSNAP_WHEEL_TARGET_DIR:-$TARGET_DIR}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
started=$SECONDS
step() { echo "== python: $1 (+$((SECONDS - started)) s)"; }

step "programs (cargo test's build)"
# scripts/check.sh sets MEMSNAP_CHECK_BUILT: its `cargo test` built the programs and, in the C
# ABI tests, the recorder's library with its GPU backends, as the lines below would.
if [ -z "${MEMSNAP_CHECK_BUILT:-}" ]; then
  cargo test --workspace --exclude memsnap-python --lib --bins --tests --locked --no-run \
    --features memsnap-recorder/cuda,memsnap-recorder/hip,memsnap-recorder-ffi/cuda,memsnap-recorder-ffi/hip
fi
# The recorder library with its GPU backends (loaded at run time), in the test profile.
# scripts/check.sh built it in its one test build (the same folder); a build of this crate
# alone would resolve features differently and rebuild its dependencies.
if [ -z "${MEMSNAP_CHECK_BUILT:-}" ]; then
  cargo build -p memsnap-recorder-ffi --lib --features cuda,hip --profile test --locked --quiet
fi
bin="python/memsnap/_bin"
lib="python/memsnap/_lib"
rm -rf "$bin" "$lib"
mkdir -p "$bin" "$lib"
for program in memsnap memsnap-viewer; do
  # Line tables off: the wheel is for the tests, not for debugging.
  if command -v strip >/dev/null 2>&1; then
    strip --strip-debug -o "$bin/$program" "$TARGET_DIR/debug/$program"
  else
    cp "$TARGET_DIR/debug/$program" "$bin/$program"
  fi
done
cp "$TARGET_DIR/debug/libmemsnap_recorder.so" "$lib/"

step "virtualenv"
"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "maturin==$MATURIN_VERSION" "pytest==$PYTEST_VERSION" "numpy==$NUMPY_VERSION"

step "wheel (dev profile)"
CARGO_TARGET_DIR="$WHEEL_TARGET_DIR" "$WORK/venv/bin/maturin" build --quiet --profile dev --manifest-path python/Cargo.toml \
  --out "$WORK/dist" --locked
"$WORK/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index \
  "$WORK"/dist/memsnap-*.whl

step "pytest"
# Run from the tests folder so `import memsnap` is the installed wheel, not python/memsnap.
(cd python/tests && PATH="$WORK/venv/bin:$PATH" "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider)
step "done"
