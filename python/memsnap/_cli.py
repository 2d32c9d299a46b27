"""Console scripts: `memsnap` and `memsnap-viewer` run the programs shipped in the wheel."""

import os
import subprocess
import sys

from ._tools import program_path


def _exec(name):
    try:
        program = program_path(name)
    except FileNotFoundError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 127
    args = [program, *sys.argv[1:]]
    if sys.platform == "win32":  # pragma: no cover - no exec on Windows
        return subprocess.call(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(program, args)
    return 0  # pragma: no cover - execv does not return


def memsnap():
    sys.exit(_exec("memsnap"))


def memsnap_viewer():
    sys.exit(_exec("memsnap-viewer"))
