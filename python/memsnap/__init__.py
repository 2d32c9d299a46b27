"""memsnap: safe, fast loading of PyTorch GPU memory snapshots, and the memsnap tools.

    import memsnap
    snapshot = memsnap.load("snapshot.pickle")     # what pickle.load returns, executing nothing
    memsnap.dump(snapshot, "copy.pickle")          # a pickle PyTorch's tools read
    snap = memsnap.open("snapshot.pickle")         # typed and lazy: columns, stacks on demand
    memsnap.summary("snapshot.pickle")["devices"]  # the `memsnap summary --json` report
    memsnap.plot("snapshot.pickle")                # the timeline as PNG (inline in Jupyter)

``memsnap.torch`` records PyTorch's CUDA allocations with memsnap's allocator, and the wheel
installs the ``memsnap`` and ``memsnap-viewer`` programs.
"""

from __future__ import annotations

import gc as _gc
import os as _os

from . import _memsnap
from ._memsnap import FormatError

# `import memsnap` stays cheap (a few ms) because `memsnap.load` is often the first thing a
# script does and is measured against `pickle.load`: NumPy (for `memsnap.open`'s columns),
# `typing`, `subprocess` and `importlib.metadata` are imported on first use, through the
# module `__getattr__` below (PEP 562), not here.
TYPE_CHECKING = False
if TYPE_CHECKING:  # for type checkers only; `typing` is not imported at run time
    from typing import Any, BinaryIO, Union

    from ._snapshot import Blocks, Frame, Segments, Snapshot, Trace
    from ._tools import Plot, plot, program_path, summary, view

__all__ = [
    "FormatError",
    "load",
    "loads",
    "dump",
    "dumps",
    "open",
    "Snapshot",
    "Segments",
    "Blocks",
    "Trace",
    "Frame",
    "summary",
    "plot",
    "Plot",
    "view",
    "program_path",
]

_LAZY = {
    "Snapshot": "_snapshot",
    "Segments": "_snapshot",
    "Blocks": "_snapshot",
    "Trace": "_snapshot",
    "Frame": "_snapshot",
    "summary": "_tools",
    "plot": "_tools",
    "Plot": "_tools",
    "view": "_tools",
    "program_path": "_tools",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is not None:
        import importlib

        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value
    if name == "__version__":
        try:
            from importlib.metadata import version

            value = version("memsnap")
        except Exception:  # pragma: no cover - running from a source tree
            value = "0.0.0"
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})


def _without_gc(function, *args):
    # A snapshot is millions of dicts and lists and no cycles: the cyclic collector would
    # scan them again and again while they are built. It runs again afterwards as usual.
    enabled = _gc.isenabled()
    _gc.disable()
    try:
        return function(*args)
    finally:
        if enabled:
            _gc.enable()


def load(source: Union[str, "_os.PathLike[str]", bytes, bytearray, memoryview, BinaryIO]) -> Any:
    """Reads a snapshot and returns exactly what ``pickle.load`` returns for it.

    ``source`` is a path (``str`` or ``os.PathLike``), ``bytes``-like data, or a binary file
    object. The same dicts, lists, ints and strings come back, and a frames list that the
    file shares between entries is one shared list again. Nothing in the file is executed:
    opcodes that would import or call anything (``GLOBAL``, ``REDUCE``, ``BUILD``, ...) raise
    :class:`FormatError` with the byte offset.

    msgpack and JSON snapshots (memsnap's formats) and gzip/zstd-compressed files are read
    too: they give the objects ``pickle.load`` gives for the PyTorch pickle of the same
    snapshot.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        return loads(source)
    if hasattr(source, "read"):
        data = source.read()
        name = getattr(source, "name", "<file>")
        return _without_gc(_memsnap.load_bytes, bytes(data), str(name))
    return _without_gc(_memsnap.load_path, _os.fspath(source))


def loads(data: Union[bytes, bytearray, memoryview]) -> Any:
    """:func:`load` for ``bytes``-like data."""
    return _without_gc(_memsnap.load_bytes, bytes(data), "<bytes>")


def dumps(obj: Any) -> bytes:
    """The protocol-4 pickle of ``obj`` (dicts, lists, tuples, str, bytes, int, float, bool and
    None only; anything else raises ``TypeError`` naming where it is), with shared objects
    written once, as ``pickle.dumps`` does."""
    return _memsnap.dumps(obj)


def dump(obj: Any, path: Union[str, "_os.PathLike[str]"]) -> None:
    """Writes ``obj`` (a snapshot, e.g. from :func:`load`) to ``path`` as a pickle that
    ``pickle.load`` and PyTorch's tools (``torch.cuda._memory_viz``, pytorch.org/memory_viz)
    read. A ``.gz`` or ``.zst`` suffix compresses; a ``.msgpack`` or ``.json`` name writes
    memsnap's msgpack or JSON of the snapshot instead (``obj`` must then be a snapshot).
    The file is replaced atomically."""
    _memsnap.dump(obj, _os.fspath(path))


def open(path: Union[str, "_os.PathLike[str]"]) -> Snapshot:  # noqa: A001 - memsnap.open is the name people look for
    """Opens a snapshot for analysis: a typed, lazy :class:`Snapshot`.

    Only the segments are decoded before this returns (for a file in PyTorch's layout); the
    trace entries are decoded on a background thread and the first query that needs them
    waits for it. Trace columns are NumPy arrays when NumPy is installed, ``array.array``
    otherwise; stacks are resolved to frames on demand (:meth:`Snapshot.stack`).
    """
    from ._snapshot import Snapshot

    return Snapshot._open(_os.fspath(path))
