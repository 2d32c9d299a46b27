#!/usr/bin/env bash
# Regenerates viewer/screenshot.png (the README picture) from the real app under Xvfb.
#
#   viewer/scripts/screenshot.sh [SNAPSHOT_FILE]
#
# Without a file it opens the built-in demo run. Needs: xvfb, imagemagick (import), xdotool
# (optional: moves the pointer off the plot),
# libgl1-mesa-dri libegl1 libgl1 (software GL), and a release build of memsnap-viewer
# (built here if missing; or set VIEWER_BIN). Uses display :97 unless DISPLAY_NUMBER is set.
set -euo pipefail
cd "$(dirname "$0")/../.."

target_dir="${CARGO_TARGET_DIR:-target}"
# VIEWER_BIN picks another build (e.g. the debug one); the picture is the same.
viewer="${VIEWER_BIN:-$target_dir/release/memsnap-viewer}"
if [ ! -x "$viewer" ]; then
  cargo build --release -p memsnap-viewer
fi
out="viewer/screenshot.png"
display=":${DISPLAY_NUMBER:-97}"

Xvfb "$display" -screen 0 1280x800x24 -nolisten tcp &
xvfb_pid=$!
runtime_dir="$(mktemp -d)"
chmod 700 "$runtime_dir"
viewer_pid=""
cleanup() {
  [ -n "$viewer_pid" ] && kill "$viewer_pid" 2>/dev/null || true
  kill "$xvfb_pid" 2>/dev/null || true
  rm -rf "$runtime_dir"
}
trap cleanup EXIT
sleep 1

args=(--demo)
if [ $# -gt 0 ]; then args=("$@"); fi
# A fresh settings folder, so recent files and theme of the person running this do not leak in.
DISPLAY="$display" XDG_RUNTIME_DIR="$runtime_dir" XDG_DATA_HOME="$runtime_dir" \
  XDG_CONFIG_HOME="$runtime_dir" HOME="$runtime_dir" \
  "$viewer" "${args[@]}" &
viewer_pid=$!
# Loading, analysis and the first frames.
sleep "${SCREENSHOT_DELAY:-6}"
if ! kill -0 "$viewer_pid" 2>/dev/null; then
  echo "screenshot.sh: the viewer exited early" >&2
  exit 1
fi
# Park the pointer in the bottom-right corner, so no hover card covers the timeline.
if command -v xdotool >/dev/null 2>&1; then
  DISPLAY="$display" xdotool mousemove 1279 799 || true
  sleep 1
fi
DISPLAY="$display" import -window root "$out"
echo "wrote $out"
