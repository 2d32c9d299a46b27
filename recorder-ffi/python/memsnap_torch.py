"""memsnap_torch: record PyTorch's GPU memory with memsnap's allocator.

Plain Python (ctypes), no build step. Copy this file next to your script or put
``recorder-ffi/python`` on ``PYTHONPATH``.

    import memsnap_torch
    memsnap_torch.enable(max_entries=200_000, stacks="all", dump_on_oom="oom.pickle")
    ...  # train as usual; tensors now come from memsnap
    memsnap_torch.dump("snapshot.pickle")    # then: memsnap view snapshot.pickle
    print(memsnap_torch.memory_stats()["allocated_bytes.all.peak"])

``enable()`` installs ``libmemsnap_recorder.so`` as PyTorch's CUDA allocator through
``torch.cuda.memory.CUDAPluggableAllocator``; it must run before the first CUDA tensor exists.

Limits (PyTorch's, not memsnap's): under a pluggable allocator PyTorch's own
``torch.cuda.memory_stats()``, ``memory_allocated()``, ``_record_memory_history()`` and
``_dump_snapshot()`` raise "CUDAPluggableAllocator does not yet support ...". Use
:func:`memory_stats`, :func:`record_history` and :func:`dump` from this module instead.
CUDA graphs' private pools, IPC (tensor sharing across processes) and ``cudnn.benchmark``'s
cache queries do not work under any pluggable allocator.

Python frames: PyTorch releases the GIL inside its operators, so memsnap takes the GIL to read
the frames, before taking any lock of its own, as PyTorch's own recorder does
(``MEMSNAP_PYTHON_GIL=held`` never waits for it; then only allocations made while Python code
holds the GIL get frames).

Out of memory: PyTorch's pluggable-allocator interface does not check the pointer returned, so
torch (2.11) raises no ``OutOfMemoryError``: the tensor gets a NULL data pointer. memsnap prints
the failure to stderr and writes ``dump_on_oom`` at that moment.
"""

import ctypes
import json
import os

__all__ = [
    "MemsnapError",
    "library_path",
    "load",
    "enable",
    "record_history",
    "dump",
    "set_oom_dump_path",
    "memory_stats",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "empty_cache",
]

LIBRARY_NAME = "libmemsnap_recorder.so"

_lib = None
_lib_path = None


class MemsnapError(RuntimeError):
    """A memsnap call failed; the message is memsnap_last_error()."""


def library_path():
    """Where the shared library is: ``$MEMSNAP_LIBRARY``, else a cargo build of this checkout
    (release first), else the name alone (found through ``LD_LIBRARY_PATH``)."""
    explicit = os.environ.get("MEMSNAP_LIBRARY")
    if explicit:
        return explicit
    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    for profile in ("release", "debug"):
        candidate = os.path.join(repo, "target", profile, LIBRARY_NAME)
        if os.path.isfile(candidate):
            return candidate
    return LIBRARY_NAME


def load(path=None):
    """Loads the library (once) and declares its C signatures. Returns the ctypes handle.

    The handle is a ``ctypes.PyDLL``: calls keep the GIL, so memsnap reads the caller's
    Python frames without waiting for it.
    """
    global _lib, _lib_path
    if _lib is not None:
        if path is not None and os.path.abspath(path) != os.path.abspath(_lib_path):
            raise MemsnapError(f"memsnap is already loaded from {_lib_path}")
        return _lib
    path = path or library_path()
    lib = ctypes.PyDLL(path)
    c_int, c_size_t, c_void_p, c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
    signatures = {
        "memsnap_alloc": (c_void_p, [c_size_t, c_int, c_void_p]),
        "memsnap_free": (None, [c_void_p, c_size_t, c_int, c_void_p]),
        "memsnap_init": (c_int, [c_char_p]),
        "memsnap_record_history": (c_int, [c_char_p, c_char_p, c_char_p, c_size_t]),
        "memsnap_dump_snapshot": (c_int, [c_char_p]),
        "memsnap_set_oom_dump_path": (c_int, [c_char_p]),
        "memsnap_empty_cache": (c_int, []),
        "memsnap_set_memory_fraction": (c_int, [ctypes.c_double, c_int]),
        "memsnap_record_stream": (c_int, [c_void_p, c_void_p]),
        "memsnap_stats_json": (c_int, [c_int, c_char_p, c_size_t, ctypes.POINTER(c_size_t)]),
        "memsnap_last_error": (c_char_p, []),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    _lib, _lib_path = lib, path
    return lib


def _encode(text):
    return None if text is None else os.fsencode(text)


def _check(status):
    if status != 0:
        message = _lib.memsnap_last_error() or b"unknown error"
        raise MemsnapError(message.decode("utf-8", "replace"))


def _function_address(name):
    return ctypes.cast(getattr(_lib, name), ctypes.c_void_p).value


def enable(max_entries=1_000_000, stacks="all", dump_on_oom=None, context="all", library=None):
    """Makes memsnap PyTorch's CUDA allocator and starts recording the history.

    Call it before anything allocates CUDA memory (``change_current_allocator`` refuses
    afterwards). ``stacks`` is "python", "native", "all" (both, merged as PyTorch does) or
    "none"; ``dump_on_oom`` is a path written when an allocation runs out of memory.
    The backend is ``$MEMSNAP_BACKEND`` (default cuda; hip on ROCm builds of PyTorch).
    """
    import torch  # only enable() needs torch

    lib = load(library)
    if "MEMSNAP_BACKEND" not in os.environ and getattr(torch.version, "hip", None):
        _check(lib.memsnap_init(b"hip"))
    allocator = torch.cuda.memory.CUDAPluggableAllocator(_lib_path, "memsnap_alloc", "memsnap_free")
    hooks = allocator.allocator()
    hooks.set_init_fn(_function_address("memsnap_init_hook"))
    hooks.set_reset_fn(_function_address("memsnap_reset_hook"))
    hooks.set_memory_fraction_fn(_function_address("memsnap_memory_fraction_hook"))
    hooks.set_record_stream_fn(_function_address("memsnap_record_stream_hook"))
    torch.cuda.memory.change_current_allocator(allocator)
    record_history("all", context=context, stacks=stacks, max_entries=max_entries)
    if dump_on_oom is not None:
        set_oom_dump_path(dump_on_oom)
    return allocator


def record_history(enabled="all", context="all", stacks="all", max_entries=1_000_000):
    """Like ``torch.cuda.memory._record_memory_history``: enabled is None/"off", "state" or
    "all"; context "never", "state", "alloc" or "all"; stacks "none", "native", "python" or
    "all"."""
    lib = load()
    enabled = "off" if enabled is None else enabled
    _check(lib.memsnap_record_history(_encode(enabled), _encode(context), _encode(stacks), max_entries))


def dump(path):
    """Writes the snapshot (PyTorch's pickle schema; .msgpack/.json/.gz/.zst by name)."""
    _check(load().memsnap_dump_snapshot(_encode(os.fspath(path))))


def set_oom_dump_path(path):
    """Path written when an allocation runs out of memory; None stops it."""
    _check(load().memsnap_set_oom_dump_path(_encode(None if path is None else os.fspath(path))))


def empty_cache():
    """Releases cached, unused segments (what ``torch.cuda.empty_cache()`` does)."""
    _check(load().memsnap_empty_cache())


def memory_stats(device=0):
    """The allocator's counters with ``torch.cuda.memory_stats()``'s keys."""
    lib = load()
    needed = ctypes.c_size_t(0)
    status = lib.memsnap_stats_json(device, None, 0, ctypes.byref(needed))
    if status not in (0, 1):
        _check(status)
    buffer = ctypes.create_string_buffer(needed.value + 1)
    _check(lib.memsnap_stats_json(device, buffer, len(buffer), ctypes.byref(needed)))
    return json.loads(buffer.value.decode("utf-8"))


def memory_allocated(device=0):
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=0):
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=0):
    return memory_stats(device).get("reserved_bytes.all.current", 0)
