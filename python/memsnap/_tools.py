"""The memsnap programs shipped in the wheel, and the reports built on them."""

import json
import os
import subprocess
import sys
import tempfile
from typing import Optional, Sequence, Union

from ._memsnap import FormatError

_BIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin")
_EXE = ".exe" if sys.platform == "win32" else ""


def program_path(name: str = "memsnap") -> str:
    """Path of a memsnap program (``"memsnap"`` or ``"memsnap-viewer"``):
    ``$MEMSNAP_BIN_DIR/<name>`` when set, else the one inside this package."""
    candidates = [os.path.join(_BIN_DIR, name + _EXE)]
    if os.environ.get("MEMSNAP_BIN_DIR"):
        candidates.insert(0, os.path.join(os.environ["MEMSNAP_BIN_DIR"], name + _EXE))
    for candidate in candidates:
        if os.path.isfile(candidate):
            if not os.access(candidate, os.X_OK):
                try:
                    os.chmod(candidate, 0o755)
                except OSError:
                    pass
            return candidate
    # No PATH lookup: on PATH, `memsnap` is this package's own console script.
    raise FileNotFoundError(
        f"the {name} program is not in this memsnap package ({_BIN_DIR}); "
        "reinstall the wheel, or set MEMSNAP_BIN_DIR to a folder with a memsnap build"
    )


def _run(args: Sequence[str]) -> subprocess.CompletedProcess:
    done = subprocess.run([program_path("memsnap"), *args], capture_output=True)
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip()
        # Exit status 2 is bad input (an unreadable or invalid file).
        error = FormatError if done.returncode == 2 else RuntimeError
        raise error(message or f"memsnap {args[0]} exited with status {done.returncode}")
    return done


def summary(path, steps_from: str = "auto", top: int = 5) -> dict:
    """The ``memsnap summary --json`` report of ``path`` as a dict (schema
    ``memsnap.summary/1``): per device the peak, its phase and top sites, the bytes per
    category at the peak, the steps with their phases, and the drift verdict.
    ``steps_from`` is ``"auto"``, ``"stacks"``, ``"annotations"`` or ``"shape"``."""
    done = _run(
        ["summary", os.fspath(path), "--json", "--steps-from", steps_from, "--top", str(top)]
    )
    return json.loads(done.stdout)


class Plot:
    """A rendered timeline: ``data`` is the PNG (or SVG) bytes. Jupyter shows it inline."""

    def __init__(self, data: bytes, kind: str = "png"):
        self.data = data
        self.kind = kind

    def _repr_png_(self):
        return self.data if self.kind == "png" else None

    def _repr_svg_(self):
        return self.data.decode("utf-8") if self.kind == "svg" else None

    def __bytes__(self):
        return self.data

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        return f"<memsnap.Plot: {len(self.data)} bytes of {self.kind.upper()}>"

    def save(self, path):
        with open(path, "wb") as f:
            f.write(self.data)


def plot(
    path,
    out=None,
    min_size: Union[int, str] = 0,
    device: Optional[int] = None,
    range: Optional[str] = None,  # noqa: A002 - the command's option name
    colour_by: str = "site",
    width: int = 1600,
    height: int = 900,
) -> Plot:
    """The memory timeline of ``path`` (what ``memsnap plot`` draws: one band per allocation
    coloured by site, the steps' phases and slopes). Returns a :class:`Plot` (PNG bytes,
    shown inline in Jupyter); with ``out`` also writes it there (``.svg`` writes SVG).
    ``min_size`` folds smaller allocations into one band (``4096``, ``"1MiB"``); ``range`` is
    ``"A..B"`` in events; ``colour_by`` is ``"site"``, ``"category"`` or ``"phase"``."""
    kind = "svg" if out is not None and os.fspath(out).lower().endswith(".svg") else "png"
    with tempfile.TemporaryDirectory(prefix="memsnap-plot-") as tmp:
        target = os.path.join(tmp, "plot." + kind)
        args = ["plot", os.fspath(path), "-o", target, "--min-size", str(min_size)]
        args += ["--colour-by", colour_by, "--width", str(width), "--height", str(height)]
        if device is not None:
            args += ["--device", str(device)]
        if range is not None:
            args += ["--range", range]
        _run(args)
        with open(target, "rb") as f:
            data = f.read()
    result = Plot(data, kind)
    if out is not None:
        result.save(out)
    return result


def view(*paths, wait: bool = False) -> subprocess.Popen:
    """Opens the memsnap viewer on the files (it needs a display). Returns the process;
    ``wait=True`` waits until the window is closed."""
    process = subprocess.Popen([program_path("memsnap-viewer"), *map(os.fspath, paths)])
    if wait:
        process.wait()
    return process
