"""The GPU check's scripts, run here without a GPU: scripts/gpu/live_check.py drives its
stand-in workload (the recorder's simulated device, module ranges as enable(modules=True)
records them, Python stacks through the C ABI) with the wheel's `memsnap watch` attached, and
every check it makes on the GPU must pass, so that GPU time is not spent finding its bugs."""

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_live_check_passes_on_its_stand_in_workload(tmp_path):
    out = tmp_path / "live"
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu" / "live_check.py"), str(out), "--stand-in"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((out / "live_check.json").read_text())
    checks = results["checks"]
    # Every check ran, and what the watch received carries the Python frames of the dump.
    assert set(checks) >= {
        "entries_received_equal_recorded",
        "segments_equal",
        "annotations_equal",
        "module_ranges_recorded",
        "watch_reported_every_step",
        "advise_names_modules",
    }, checks
    assert all(c["ok"] for c in checks.values()), checks
    assert results["entries"] > 100
