#!/usr/bin/env bash
# The one check: what CI runs and what a person runs before pushing.
# Format, lints (warnings are errors), then the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The GPU backends are cargo features (the C ABI crate forwards them); their tests drive stub
# driver libraries built with gcc.
cargo clippy -p memsnap-recorder -p memsnap-recorder-ffi --all-targets \
  --features cuda,hip,frame-pointers --locked -- -D warnings

echo "== cargo test"
# Examples are not built here: clippy --all-targets above already compiles them, and linking
# each one against the workspace costs CI time. Doc tests run on their own line.
cargo test --workspace --lib --bins --tests --locked
cargo test --workspace --doc --locked
cargo test -p memsnap-recorder -p memsnap-recorder-ffi --features cuda,hip --lib --tests --locked

echo "== python package"
# The wheel (dev profile, reusing the debug build above), a fresh virtualenv, pytest.
bash scripts/check_python.sh
