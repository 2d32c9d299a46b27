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

# The Python package (a fresh virtualenv, the wheel, pytest) needs only the programs and the
# recorder library built above; it runs beside the Rust tests, which leave a core idle much of
# the time (they spawn programs, read files, wait on sockets). maturin builds the extension in
# a target folder of its own: its feature resolution for memsnap-python alone differs from the
# workspace's, so it compiles its crates anew in any folder, and apart it never waits on the
# folder `cargo test` holds. Its output is printed when it ends.
PYTHON_LOG="$(mktemp)"
python_started=$SECONDS
MEMSNAP_CHECK_BUILT=1 MEMSNAP_WHEEL_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/python-wheel" \
  bash scripts/check_python.sh >"$PYTHON_LOG" 2>&1 &
python_pid=$!
# A failing Rust test ends this script at once: the Python checks go with it.
trap 'kill "$python_pid" 2>/dev/null || true' EXIT

timed cargo test "${TEST_SET[@]}"
timed cargo test --workspace --exclude memsnap-python --features "$GPU_FEATURES" --doc --locked

echo "== python package (started beside the Rust tests)"
python_status=0
wait "$python_pid" || python_status=$?
cat "$PYTHON_LOG"
rm -f "$PYTHON_LOG"
echo "   ($((SECONDS - python_started)) s from its start: bash scripts/check_python.sh)"
if [ "$python_status" -ne 0 ]; then
  echo "== the Python package's checks failed (exit $python_status)"
  exit "$python_status"
fi
echo "== all checks passed in $SECONDS s"
