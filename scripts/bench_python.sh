#!/usr/bin/env bash
# memsnap.load / memsnap.open vs pickle.load on a 1M-entry snapshot in both of PyTorch's
# layouts (frames lists shared through the memo; a fresh frames list per entry), release
# build, side by side in the same run.
#   bash scripts/bench_python.sh [ENTRIES [bench_load.py options: --runs N --only load --together]]
# (ENTRIES defaults to 1000000; needs python3 with venv)
set -euo pipefail
cd "$(dirname "$0")/.."
ENTRIES="${1:-1000000}"
shift || true
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "== snapshot ($ENTRIES entries, pytorch and pytorch-fresh-frames layouts)"
cargo run --release --locked -q -p memsnap-workload --example bench_pickle -- \
  --entries "$ENTRIES" --layout pytorch,pytorch-fresh-frames --runs 1 --keep "$WORK/bench.pickle" >"$WORK/make.log"
grep -E "^(snapshot|==)" "$WORK/make.log"
echo "== release wheel"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check maturin==1.9.6 numpy==2.2.6
"$WORK/venv/bin/maturin" build --quiet --release --manifest-path python/Cargo.toml --out "$WORK/dist" --locked
"$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index "$WORK"/dist/memsnap-*.whl
echo "== benchmark"
(cd "$WORK" && "$WORK/venv/bin/python" "$OLDPWD/python/bench/bench_load.py" "$WORK/bench.pickle.pytorch" "$WORK/bench.pickle.pytorch-fresh-frames" "$@")
