"""Fixtures for the memsnap Python tests (run against the installed wheel).

Real PyTorch snapshots come from $MEMSNAP_REAL_SNAPSHOTS (skipped with a notice when unset);
generated runs come from the wheel's own `memsnap demo` (memsnap-workload's simulated
transformer training through the recorder's allocator).
"""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest


def real_snapshot_paths():
    folder = os.environ.get("MEMSNAP_REAL_SNAPSHOTS")
    if not folder:
        return []
    return sorted(
        p for p in pathlib.Path(folder).iterdir() if p.suffix in (".pickle", ".pkl") and p.is_file()
    )


def pytest_report_header(config):
    if not os.environ.get("MEMSNAP_REAL_SNAPSHOTS"):
        return "notice: MEMSNAP_REAL_SNAPSHOTS is unset; skipping the real-snapshot tests"
    return f"real snapshots: {len(real_snapshot_paths())} files in {os.environ['MEMSNAP_REAL_SNAPSHOTS']}"


REAL = real_snapshot_paths()
real_snapshot = pytest.mark.parametrize(
    "path",
    REAL or [pytest.param(None, marks=pytest.mark.skip(reason="MEMSNAP_REAL_SNAPSHOTS is unset"))],
    ids=[p.name for p in REAL] or ["no-real-snapshots"],
)


def console_script(name):
    """The console script the wheel installed next to this Python."""
    candidate = pathlib.Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else shutil.which(name)


@pytest.fixture(scope="session")
def generated_runs(tmp_path_factory):
    """Two simulated training runs written by `memsnap demo`: a clean one and one that runs
    out of memory with a leak (segment events, an oom entry)."""
    folder = tmp_path_factory.mktemp("generated")
    runs = []
    for name, extra in (
        ("clean.pickle", ["--steps", "3", "--layers", "2"]),
        ("oom.pickle", ["--steps", "4", "--layers", "2", "--oom-at-step", "3", "--leak", "1MiB", "--seed", "7"]),
    ):
        out = folder / name
        subprocess.run(
            [console_script("memsnap"), "demo", "--no-view", "--out", str(out), *extra],
            check=True,
            capture_output=True,
        )
        runs.append(out)
    return runs
