#!/usr/bin/env bash
# Scaling benchmark on adversarial snapshot shapes ("any run, any size"): for each shape and
# size, generates a pickle with memsnap-workload's gen_snapshot, times every reader on it
# (wall time and peak RSS from /usr/bin/time), deletes it, and prints a markdown table with the
# 4M/1M and 10M/4M time ratios (a ratio above 5x is flagged: the size ratios are 4x and 2.5x).
#
#   bash scripts/bench_scaling.sh [--sizes 1000000,4000000,10000000] [--shapes a,b,...]
#                                 [--commands summary,viewer,...] [--files DIR]
#                                 [--out FILE.md] [--timeout S] [--python PY]
#
# --commands runs only the named commands (summary, viewer, plot, export chrome as
# export-chrome, export-parquet, simulate, advise, python); --files DIR takes DIR/SHAPE-SIZE.pickle
# where it exists (made by an earlier run or by hand with the shape's arguments) instead of
# generating it, and keeps it.
#
# Shapes (all pickles, ENTRIES = the size):
#   base   the default run (reference row)
#   a      noisy stack labels: 40% of forward/backward/optimizer allocations carry another
#          phase's stack
#   b      tiny steps: 1 layer, 2 activations, no leak (about 30 entries a step)
#   c      one giant step: --steps 1, thousands of layers of 4 KiB activations, 1 TiB device
#   d      deep, distinct stacks: 100-200 frames each, the pool rotated through so that every
#          stack appears; the pool is min(3% of ENTRIES, DEEP_POOL_MAX) (default 100000), not
#          1M: the recorder keeps every registered frame by value (about 0.4 KB a frame while
#          generating: 30k stacks of 150 frames took 1.8 GB and 40 s), so 1M deep stacks
#          would need some 60 GB (workload/README.md)
#   e      300k annotations in all (record_function-like START/END pairs spread over the steps)
#   f      segment churn: torch.cuda.empty_cache() after every step
#   fx     expandable segments + empty_cache after every step (segment_map/unmap churn)
#   g      8 devices, ENTRIES/8 entries each
#   h      no stacks at all (context=None)
#   i      ring buffer of ENTRIES that starts mid-step (1.3 x ENTRIES recorded)
#   w      the week-long run that ran out of memory: i's ring buffer, 20% stack noise, 64 KiB
#          kept every step (a leak), on a GPU the leak fills near the end of the run
#
# Commands per file: memsnap summary (its "steps (N, method)" line goes in the table), the
# viewer's measuring mode (memsnap-viewer --bench-frames 60 FILE: parse + analysis + first
# frame = first picture, then the background steps pass; no window, no display needed),
# memsnap plot -o x.png, memsnap export --to chrome / --to parquet, memsnap simulate,
# memsnap advise (its default budget: the GPU's memory for a file that ran out of it; its
# default replays at once: one per core, at most 4; ADVISE_JOBS=N sets --jobs N), and
# Python memsnap.open + a column query when `PY -c 'import memsnap'` works (else skipped with a
# notice). Each command runs under `timeout S` (default 600): a timeout or a failure is a
# finding, printed and put in the table, and the run goes on.
#
# Memory: one file at a time (generate, measure, delete); 10M entries is about 800 MB of
# pickle and a few GB of RAM per command.
set -uo pipefail
cd "$(dirname "$0")/.."

SIZES="1000000,4000000,10000000"
SHAPES="base,a,b,c,d,e,f,fx,g,h,i,w"
COMMANDS="summary,viewer,plot,export-chrome,export-parquet,simulate,advise,python"
FILES=""
OUT=""
TIMEOUT=600
PY="python3"
DEEP_POOL_MAX="${DEEP_POOL_MAX:-100000}"
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) SIZES="$2"; shift 2 ;;
    --shapes) SHAPES="$2"; shift 2 ;;
    --commands) COMMANDS="$2"; shift 2 ;;
    --files) FILES="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    -h|--help) sed -n '2,47p' "$0"; exit 0 ;;
    *) echo "bench_scaling: unknown argument $1" >&2; exit 2 ;;
  esac
done

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
echo "== building (release, once)" >&2
cargo build --release --locked -q -p memsnap -p memsnap-viewer >&2 || exit 1
cargo build --release --locked -q -p memsnap-workload --example gen_snapshot >&2 || exit 1
BIN="$CARGO_TARGET_DIR/release"
MEMSNAP="$BIN/memsnap"
VIEWER="$BIN/memsnap-viewer"
GEN="$BIN/examples/gen_snapshot"

HAVE_PY=1
if ! "$PY" -c 'import memsnap' 2>/dev/null; then
  HAVE_PY=0
  echo "notice: '$PY -c \"import memsnap\"' fails: the Python rows are skipped (pass --python PY)" >&2
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
RESULTS="$WORK/results.tsv"
: >"$RESULTS"

# The gen_snapshot arguments of shape $1 at $2 entries.
shape_args() {
  local n="$1" shape="$2"
  case "$shape" in
    base) echo "--entries $n" ;;
    a) echo "--entries $n --stack-noise 40" ;;
    b) echo "--entries $n --layers 1 --activations 2" ;;
    # About 54 entries per layer with 8 activations and 2 parameters.
    c) echo "--steps 1 --layers $(( n / 54 )) --activations 8 --activation-bytes 4096 --param-bytes 65536 --device-memory 1099511627776" ;;
    d) local pool=$(( n * 3 / 100 < DEEP_POOL_MAX ? n * 3 / 100 : DEEP_POOL_MAX ))
       echo "--entries $n --stack-depth 150 --rotate-stacks --stacks $pool" ;;
    # The default step records about 150 entries (and 4 annotations): at least 150k extra
    # START/END pairs over its n/150 steps (1M: 340k annotations in all; more at 10M).
    e) echo "--entries $n --annotations-per-step $(( (150000 * 150 + n - 1) / n ))" ;;
    f) echo "--entries $n --empty-cache" ;;
    fx) echo "--entries $n --empty-cache --expandable" ;;
    g) echo "--entries $(( n / 8 )) --devices 8" ;;
    h) echo "--entries $n --frameless" ;;
    i) echo "--entries $(( n + n * 3 / 10 )) --max-entries $n" ;;
    # About 148 entries a step: 1.3 n / 148 steps keep 64 KiB each; the GPU holds 196 MiB (the
    # run without the leak) and 98 % of what the leak keeps, so the last steps run out.
    w) echo "--entries $(( n + n * 3 / 10 )) --max-entries $n --leak 65536 --stack-noise 20 --device-memory $(( 205520896 + (n * 13 / 1480) * 65536 * 98 / 100 ))" ;;
    *) echo "bench_scaling: unknown shape $shape" >&2; return 1 ;;
  esac
}

# measure SHAPE SIZE COMMAND-NAME ARGV...: one timed run; appends a result row.
# Row: shape, size, command, status (ok / timeout / fail rc), seconds, peak KB, note.
measure() {
  local shape="$1" size="$2" name="$3"; shift 3
  local log="$WORK/cmd.log" tf="$WORK/time.txt" rc
  /usr/bin/time -o "$tf" -f '%e %M' timeout "$TIMEOUT" "$@" >"$log" 2>&1
  rc=$?
  local secs kb
  read -r secs kb < <(tail -1 "$tf" 2>/dev/null || echo "? ?")
  local status=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status=timeout
    echo "FINDING: $shape @ $size: '$name' exceeded ${TIMEOUT}s" >&2
  elif [ "$rc" -ne 0 ]; then
    status="fail:$rc"
    echo "FINDING: $shape @ $size: '$name' failed (exit $rc): $(tail -3 "$log" | tr '\n' ' ')" >&2
  fi
  local note=""
  case "$name" in
    gen)
      note="$(grep -o '[0-9]* entries on [0-9]* device(s), [0-9]* segments, [0-9]* segment entries, [0-9]* stacks, [0-9]* annotations, [0-9]* complete steps' "$log" | head -1)" ;;
    summary)
      # One line per device: "steps (N, method)", or "8x steps (N, method)" when devices agree.
      note="$(grep -o 'steps ([0-9]*, [^)]*)' "$log" | sort | uniq -c \
        | sed 's/^ *//; s/^1 //; s/^\([0-9][0-9]*\) steps/\1x steps/' | tr '\n' ';' | sed 's/;$//')" ;;
    viewer)
      local parse first steps
      parse="$(sed -n 's/^parse: *\([0-9.]*\) ms.*/\1/p' "$log" | head -1)"
      first="$(sed -n 's/^open to first picture (after parsing): \([0-9.]*\) ms.*/\1/p' "$log" | head -1)"
      steps="$(sed -n 's/.*then in the background: steps \([0-9.]*\) ms.*/\1/p' "$log" | head -1)"
      if [ -n "$first" ]; then
        note="$(awk -v p="${parse:-0}" -v f="$first" -v s="${steps:-?}" \
          'BEGIN { printf "parse %.2f s, first picture +%.2f s, steps +%s s", p / 1000, f / 1000, (s == "?" ? "?" : sprintf("%.2f", s / 1000)) }')"
      fi ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$shape" "$size" "$name" "$status" "$secs" "$kb" "$note" >>"$RESULTS"
  echo "  $name: $status ${secs}s ${kb}KB $note" >&2
}

# Whether command $1 is among --commands.
wanted() {
  case ",$COMMANDS," in *",$1,"*) return 0 ;; *) return 1 ;; esac
}

IFS=',' read -r -a SIZE_LIST <<<"$SIZES"
IFS=',' read -r -a SHAPE_LIST <<<"$SHAPES"
for shape in "${SHAPE_LIST[@]}"; do
  for size in "${SIZE_LIST[@]}"; do
    args="$(shape_args "$size" "$shape")" || exit 2
    file="$WORK/$shape-$size.pickle"
    kept=0
    if [ -n "$FILES" ] && [ -s "$FILES/$shape-$size.pickle" ]; then
      file="$FILES/$shape-$size.pickle"
      kept=1
      echo "== $shape @ $size ($(uptime | sed 's/.*load average: //')): $file" >&2
    else
      echo "== $shape @ $size ($(uptime | sed 's/.*load average: //')): gen_snapshot $args" >&2
      # shellcheck disable=SC2086
      measure "$shape" "$size" gen "$GEN" $args -o "$file"
    fi
    if [ ! -s "$file" ]; then
      rm -f "$file"
      continue
    fi
    wanted summary && measure "$shape" "$size" summary "$MEMSNAP" summary "$file"
    wanted viewer && measure "$shape" "$size" viewer "$VIEWER" --bench-frames 60 "$file"
    wanted plot && measure "$shape" "$size" plot "$MEMSNAP" plot "$file" -o "$WORK/x.png"
    wanted export-chrome && measure "$shape" "$size" "export chrome" "$MEMSNAP" export "$file" --to chrome -o "$WORK/x.json"
    rm -f "$WORK/x.json" "$WORK/x.png"
    wanted export-parquet && measure "$shape" "$size" "export parquet" "$MEMSNAP" export "$file" --to parquet -o "$WORK/x.parquet"
    rm -rf "$WORK/x.parquet"
    wanted simulate && measure "$shape" "$size" simulate "$MEMSNAP" simulate "$file"
    # shellcheck disable=SC2046
    wanted advise && measure "$shape" "$size" advise "$MEMSNAP" advise "$file" $([ -n "${ADVISE_JOBS:-}" ] && echo "--jobs $ADVISE_JOBS")
    if [ "$HAVE_PY" = 1 ] && wanted python; then
      measure "$shape" "$size" "python open+column" "$PY" -c '
import sys, memsnap
s = memsnap.open(sys.argv[1])
t = s.trace(0)
print(len(t), sum(int(x) for x in t.size[:1000000]))' "$file"
    fi
    [ "$kept" = 1 ] || rm -f "$file"
  done
done

# The table: one row per shape x command, one column per size, then the ratios.
TABLE="$("${PY_TABLE:-python3}" - "$RESULTS" "$SIZES" "$(uptime | sed 's/.*load average: //')" <<'EOF'
import sys
rows, sizes, load = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3]
cells, order = {}, []
for line in open(rows):
    shape, size, cmd, status, secs, kb, note = (line.rstrip("\n").split("\t") + [""] * 7)[:7]
    key = (shape, cmd)
    if key not in cells:
        cells[key] = {}
        order.append(key)
    cells[key][int(size)] = (status, secs, kb, note)

def label(n):
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)

head = ["shape", "command"] + [label(s) + " time / peak RSS" for s in sizes]
pairs = list(zip(sizes, sizes[1:]))
head += [f"{label(b)}/{label(a)} time" for a, b in pairs]
head.append("notes (per size)")
out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
for key in order:
    row = [key[0], key[1]]
    times = {}
    for s in sizes:
        c = cells[key].get(s)
        if c is None:
            row.append("")
            continue
        status, secs, kb, _ = c
        try:
            t = float(secs)
            # /usr/bin/time's %M is KiB; MB here are 10^6 bytes, as the targets are.
            mem = f"{int(kb) * 1024 / 1e6:,.0f} MB"
        except ValueError:
            t, mem = None, "?"
        text = f"{secs} s / {mem}" if t is not None else "?"
        if status != "ok":
            text = f"**{status.upper()}** " + text
        else:
            times[s] = t
        row.append(text)
    for a, b in pairs:
        if a in times and b in times and times[a] > 0:
            r = times[b] / times[a]
            row.append(f"**{r:.1f}x**" if r > 5 else f"{r:.1f}x")
        elif a in times and b in cells[key] and cells[key][b][0] != "ok":
            row.append("**" + cells[key][b][0] + "**")
        else:
            row.append("")
    notes = [f"{label(s)}: {cells[key][s][3]}" for s in sizes if s in cells[key] and cells[key][s][3]]
    row.append("<br>".join(notes).replace("|", "/"))
    out.append("| " + " | ".join(row) + " |")
print("\n".join(out))
print(f"\nLoad average at the end: {load}. Ratios above 5x are in bold (the sizes grow 4x and 2.5x).")
EOF
)"
echo "$TABLE"
if [ -n "$OUT" ]; then
  echo "$TABLE" >"$OUT"
fi
