"""summary, plot, view and the console scripts, from the installed wheel."""

import json
import subprocess

import pytest

import memsnap
from conftest import REAL, console_script


def test_summary_is_the_json_report(generated_runs):
    report = memsnap.summary(generated_runs[0])
    cli = json.loads(
        subprocess.run([console_script("memsnap"), "summary", str(generated_runs[0]), "--json"],
                       check=True, capture_output=True).stdout
    )
    assert report == cli
    assert report["schema"] == "memsnap.summary/1"
    assert report["devices"][0]["steps"], "the generated run has steps"


def test_summary_of_a_bad_file_raises_format_error(tmp_path):
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"\x80\x04cos\nsystem\n.")
    with pytest.raises(memsnap.FormatError, match="bad.pickle"):
        memsnap.summary(bad)


def test_plot_is_a_png(generated_runs, tmp_path):
    picture = memsnap.plot(generated_runs[0], min_size="64KiB", width=480, height=270)
    assert picture.data.startswith(b"\x89PNG\r\n\x1a\n")
    assert picture._repr_png_() == picture.data
    out = tmp_path / "t.png"
    svg = memsnap.plot(generated_runs[0], out=tmp_path / "t.svg", colour_by="phase", width=480, height=270)
    assert (tmp_path / "t.svg").read_bytes() == svg.data
    assert b"<svg" in svg.data[:500] and svg._repr_png_() is None


@pytest.mark.skipif(not REAL, reason="MEMSNAP_REAL_SNAPSHOTS is unset")
def test_summary_of_a_real_snapshot():
    path = [p for p in REAL if p.name.startswith("11_")][0]
    report = memsnap.summary(path)
    assert report["devices"][0]["peak"]["bytes"] > 0


def test_console_scripts_run(generated_runs):
    out = subprocess.run([console_script("memsnap"), "--version"], check=True, capture_output=True)
    assert out.stdout.startswith(b"memsnap ")
    info = subprocess.run([console_script("memsnap"), "info", str(generated_runs[0])],
                          check=True, capture_output=True)
    assert b"entries" in info.stdout
    viewer = subprocess.run([console_script("memsnap-viewer"), "--help"], check=True, capture_output=True)
    assert b"memsnap-viewer" in viewer.stdout or b"Usage" in viewer.stdout
    failed = subprocess.run([console_script("memsnap"), "info", "/nonexistent.pickle"], capture_output=True)
    assert failed.returncode == 2 and b"nonexistent" in failed.stderr


def test_program_paths_are_inside_the_package():
    import os

    for name in ("memsnap", "memsnap-viewer"):
        path = memsnap.program_path(name)
        assert os.path.dirname(memsnap.__file__) in path and os.access(path, os.X_OK)
