#!/usr/bin/env bash
# The one check: what CI runs and what a person runs before pushing.
# Format, lints (warnings are errors), then the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."

# Runs a command and says how long it took: CI has a time budget (about 15 minutes on 2 cores).
timed() {
  local start=$SECONDS
  "$@"
  echo "   ($((SECONDS - start)) s: ${*:1:4})"
}

echo "== cargo fmt --check"
timed cargo fmt --all -- --check

echo "== cargo clippy"
timed cargo clippy --workspace --all-targets --locked -- -D warnings
# The GPU backends are cargo features (the C ABI crate forwards them); their tests drive stub
# driver libraries built with gcc.
timed cargo clippy -p memsnap-recorder -p memsnap-recorder-ffi --all-targets \
  --features cuda,hip,frame-pointers --locked -- -D warnings

echo "== cargo test"
# One build for all tests, with the recorder's CUDA and HIP backends compiled in (their tests
# drive stub driver libraries built with gcc; nothing else changes with them): a second
# feature set would rebuild the recorder and everything above it. Examples are not built
# here: clippy --all-targets above already compiles them. The Python extension is built (and
# tested) by maturin below. Doc tests run on their own line, over the same build.
#
# `cargo build --profile test` over the same targets builds exactly what `cargo test` builds,
# plus the C ABI crate's library files (libmemsnap_recorder.so/.a: a cdylib and a staticlib,
# which `cargo test` does not build). Its tests load them from there
# (MEMSNAP_RECORDER_LIB_DIR) instead of running a `cargo build -p memsnap-recorder-ffi` of
# their own, whose feature resolution differs and rebuilt half the workspace.
GPU_FEATURES=memsnap-recorder/cuda,memsnap-recorder/hip,memsnap-recorder-ffi/cuda,memsnap-recorder-ffi/hip
TEST_SET=(--workspace --exclude memsnap-python --features "$GPU_FEATURES" --lib --bins --tests --locked)
timed cargo build --profile test "${TEST_SET[@]}"
export MEMSNAP_RECORDER_LIB_DIR="${CARGO_TARGET_DIR:-$PWD/target}/debug"
timed cargo test "${TEST_SET[@]}"
timed cargo test --workspace --exclude memsnap-python --features "$GPU_FEATURES" --doc --locked

echo "== python package"
# The wheel (test profile, reusing the build above), a fresh virtualenv, pytest.
MEMSNAP_CHECK_BUILT=1 timed bash scripts/check_python.sh
echo "== all checks passed in $SECONDS s"
