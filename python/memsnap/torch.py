"""memsnap.torch: record PyTorch's GPU memory with memsnap's allocator.

    import memsnap.torch
    memsnap.torch.enable(max_entries=200_000, stacks="all", dump_on_oom="oom.pickle")
    ...  # train as usual; tensors now come from memsnap
    memsnap.torch.dump("snapshot.pickle")    # then: memsnap view snapshot.pickle

or, for one region of a program::

    with memsnap.torch.record("run.pickle"):
        train_one_epoch()

``enable()`` installs the recorder's shared library (shipped in this package) as PyTorch's
CUDA allocator through ``torch.cuda.memory.CUDAPluggableAllocator``; it must run before the
first CUDA tensor exists.

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

Out of memory: PyTorch's pluggable-allocator interface does not check the pointer returned (torch
2.11): a plain C allocator that fails gives a tensor with a NULL data pointer and no error. So
``enable()`` installs a small C++ shim (``_oom_shim.cpp``, shipped in this package) between PyTorch
and the recorder that throws PyTorch's own ``c10::OutOfMemoryError``: the allocation raises
``torch.OutOfMemoryError`` as under PyTorch's allocator, ``dump_on_oom`` is written first, and a
training loop that catches it goes on. The shim is compiled once per PyTorch build with the C++
compiler (``$CXX``, else ``c++``) against PyTorch's headers and cached in ``$MEMSNAP_CACHE_DIR``
(default ``~/.cache/memsnap``). Where it cannot be built (no compiler, no headers), ``enable()``
warns once and falls back: the failure is printed to stderr and ``dump_on_oom`` written, but the
tensor gets a NULL data pointer. ``enable(raise_oom=False)`` skips the shim.

This file is also ``memsnap_torch`` for people who build from source:
``recorder-ffi/python/memsnap_torch.py`` loads it from the checkout (no wheel needed), and then
the library comes from the checkout's cargo build.
"""

import contextlib
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import warnings
import weakref

__all__ = [
    "MemsnapError",
    "build_oom_shim",
    "library_path",
    "load_library",
    "enable",
    "is_enabled",
    "record",
    "record_history",
    "dump",
    "set_oom_dump_path",
    "memory_stats",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "empty_cache",
    "annotate",
    "annotation",
    "ModuleTracker",
    "track_modules",
    "serve_live",
    "live_address",
]

LIBRARY_NAME = {"win32": "memsnap_recorder.dll", "darwin": "libmemsnap_recorder.dylib"}.get(
    sys.platform, "libmemsnap_recorder.so"
)

_lib = None
_lib_path = None
_allocator = None


class MemsnapError(RuntimeError):
    """A recorder call failed (the message is the recorder's), or torch/CUDA is missing."""


def library_path():
    """The recorder's shared library: ``$MEMSNAP_LIBRARY`` when set; in a source checkout, its
    cargo build (``target/release``, then ``target/debug``); else the one shipped in this
    package; else the name alone (found through the loader path, ``LD_LIBRARY_PATH``)."""
    explicit = os.environ.get("MEMSNAP_LIBRARY")
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    checkout = os.path.abspath(os.path.join(here, "..", ".."))
    if os.path.isfile(os.path.join(checkout, "Cargo.toml")):
        for profile in ("release", "debug"):
            candidate = os.path.join(checkout, "target", profile, LIBRARY_NAME)
            if os.path.isfile(candidate):
                return candidate
    shipped = os.path.join(here, "_lib", LIBRARY_NAME)
    return shipped if os.path.isfile(shipped) else LIBRARY_NAME


def load_library(path=None):
    """Loads the recorder library (once) and declares its C signatures; returns the handle.

    The handle is a ``ctypes.PyDLL``: calls keep the GIL, so memsnap reads the caller's
    Python frames without waiting for it.
    """
    global _lib, _lib_path
    if _lib is not None:
        if path is not None and os.path.abspath(path) != os.path.abspath(_lib_path):
            raise MemsnapError(f"memsnap is already loaded from {_lib_path}")
        return _lib
    path = path or library_path()
    missing = (
        "(reinstall the memsnap wheel, or set MEMSNAP_LIBRARY to a libmemsnap_recorder built with cargo)"
    )
    if os.path.dirname(path) and not os.path.isfile(path):
        raise MemsnapError(f"the memsnap recorder library is missing: {path} {missing}")
    try:
        lib = ctypes.PyDLL(path)
    except OSError as e:
        raise MemsnapError(f"cannot load the memsnap recorder library {path}: {e} {missing}") from e
    c_int, c_size_t, c_void_p, c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
    signatures = {
        "memsnap_alloc": (c_void_p, [c_size_t, c_int, c_void_p]),
        "memsnap_alloc_checked": (c_int, [c_size_t, c_int, c_void_p, ctypes.POINTER(c_void_p)]),
        "memsnap_free": (None, [c_void_p, c_size_t, c_int, c_void_p]),
        "memsnap_init": (c_int, [c_char_p]),
        "memsnap_record_history": (c_int, [c_char_p, c_char_p, c_char_p, c_size_t]),
        "memsnap_dump_snapshot": (c_int, [c_char_p]),
        "memsnap_set_oom_dump_path": (c_int, [c_char_p]),
        "memsnap_empty_cache": (c_int, []),
        "memsnap_set_memory_fraction": (c_int, [ctypes.c_double, c_int]),
        "memsnap_record_stream": (c_int, [c_void_p, c_void_p]),
        "memsnap_stats_json": (c_int, [c_int, c_char_p, c_size_t, ctypes.POINTER(c_size_t)]),
        "memsnap_serve_live": (c_int, [c_int, c_char_p]),
        "memsnap_live_address": (c_int, [c_int, c_char_p, c_size_t, ctypes.POINTER(c_size_t)]),
        "memsnap_annotate": (c_int, [c_int, c_char_p, c_char_p]),
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


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise MemsnapError(
            f"{__name__}.enable() needs PyTorch (pip install torch); "
            "memsnap.load/open/summary work without it"
        ) from e
    if not torch.cuda.is_available():
        raise MemsnapError(
            f"{__name__}.enable() records CUDA (or ROCm) allocations, and "
            "torch.cuda.is_available() is False: no GPU, no driver, or a CPU-only PyTorch build"
        )
    return torch


OOM_SHIM_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_oom_shim.cpp")
_oom_shim_path = None


def _cache_dir():
    return os.environ.get("MEMSNAP_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "memsnap")


def build_oom_shim(torch=None, cache_dir=None, compiler=None):
    """Compiles the out-of-memory shim (``_oom_shim.cpp``) for this PyTorch, once, and returns
    the library's path; raises :class:`MemsnapError` with the compiler's output when it cannot.

    The library is cached under a name made of the source, PyTorch's version and C++ ABI and the
    compiler, so a new PyTorch builds a new one; the write is atomic (temporary file, rename).
    """
    torch = torch or _import_torch()
    compiler = compiler or os.environ.get("CXX") or "c++"
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    include = os.path.join(torch_dir, "include")
    lib_dir = os.path.join(torch_dir, "lib")
    if not os.path.isfile(os.path.join(include, "c10", "util", "Exception.h")):
        raise MemsnapError(f"PyTorch's C++ headers are not installed (looked in {include})")
    cxx11_abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    with open(OOM_SHIM_SOURCE, "rb") as f:
        source = f.read()
    key = hashlib.sha256(
        b"\0".join([source, torch.__version__.encode(), str(cxx11_abi).encode(), compiler.encode()])
    ).hexdigest()[:16]
    directory = cache_dir or _cache_dir()
    target = os.path.join(directory, f"memsnap_oom_shim-{key}.so")
    if os.path.isfile(target):
        return target
    os.makedirs(directory, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".memsnap_oom_shim-", suffix=".so", dir=directory)
    os.close(fd)
    # PyTorch's headers need C++17 (2.x) or C++20 (newer releases): the newer is tried first.
    errors = []
    for standard in ("-std=c++20", "-std=c++17"):
        command = [
            compiler, "-O2", standard, "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi}",
            f"-I{include}", OOM_SHIM_SOURCE, f"-L{lib_dir}", "-lc10", f"-Wl,-rpath,{lib_dir}", "-o", partial,
        ]
        try:
            result = subprocess.run(command, capture_output=True, text=True)
        except OSError as e:
            os.unlink(partial)
            raise MemsnapError(f"cannot run the C++ compiler {compiler!r}: {e}") from e
        if result.returncode == 0:
            os.replace(partial, target)
            return target
        errors.append(f"{' '.join(command)}\n{result.stderr.strip()[-2000:]}")
    os.unlink(partial)
    raise MemsnapError("building memsnap's OOM shim failed:\n" + "\n".join(errors))


def _oom_shim(torch, lib):
    """The shim's path, initialised with the recorder's functions; None (after one warning)
    when it cannot be built."""
    global _oom_shim_path
    if _oom_shim_path is None:
        try:
            path = build_oom_shim(torch)
            shim = ctypes.CDLL(path)
            shim.memsnap_oom_shim_init.restype = ctypes.c_int
            shim.memsnap_oom_shim_init.argtypes = [ctypes.c_void_p] * 3
            status = shim.memsnap_oom_shim_init(
                _function_address("memsnap_alloc_checked"),
                _function_address("memsnap_free"),
                _function_address("memsnap_last_error"),
            )
            if status != 0:
                raise MemsnapError("memsnap_oom_shim_init refused the recorder's functions")
        except (MemsnapError, OSError) as e:
            warnings.warn(
                f"memsnap: out-of-memory will not raise torch.OutOfMemoryError ({e}); an allocation "
                "that fails is printed to stderr and gives a tensor with a NULL data pointer",
                RuntimeWarning,
                stacklevel=3,
            )
            _oom_shim_path = ""
        else:
            _oom_shim_path = path
    return _oom_shim_path or None


def enable(
    max_entries=1_000_000,
    stacks="all",
    dump_on_oom=None,
    context="all",
    library=None,
    raise_oom=True,
    live=None,
    modules=False,
):
    """Makes memsnap PyTorch's CUDA allocator and starts recording the history.

    Call it before anything allocates CUDA memory (``change_current_allocator`` refuses
    afterwards). ``stacks`` is "python", "native", "all" (both, merged as PyTorch does) or
    "none"; ``dump_on_oom`` is a path written when an allocation runs out of memory.
    The backend is ``$MEMSNAP_BACKEND`` (default cuda; hip on ROCm builds of PyTorch).
    ``raise_oom`` puts the C++ shim in front (see the module's docs) so that running out of
    memory raises ``torch.OutOfMemoryError``. ``live`` publishes device 0's history while it
    records (see :func:`serve_live`: ``True`` for a private socket, or an address); the
    address is printed on stderr and returned by :func:`live_address`. ``modules`` records
    a ``memsnap.module: PATH`` range around every ``nn.Module`` call's forward (global
    forward hooks, see :class:`ModuleTracker`): the analysis attributes each allocation made
    inside one to the innermost module's path (``blocks.3.attn``) instead of its stack's
    ``file:line``. Calling it again changes the recording settings only.
    """
    global _allocator
    torch = _import_torch()
    lib = load_library(library)
    if _allocator is None:
        if "MEMSNAP_BACKEND" not in os.environ and getattr(torch.version, "hip", None):
            _check(lib.memsnap_init(b"hip"))
        shim = _oom_shim(torch, lib) if raise_oom else None
        if shim:
            allocator = torch.cuda.memory.CUDAPluggableAllocator(
                shim, "memsnap_oom_shim_alloc", "memsnap_oom_shim_free"
            )
        else:
            allocator = torch.cuda.memory.CUDAPluggableAllocator(_lib_path, "memsnap_alloc", "memsnap_free")
        hooks = allocator.allocator()
        hooks.set_init_fn(_function_address("memsnap_init_hook"))
        hooks.set_reset_fn(_function_address("memsnap_reset_hook"))
        hooks.set_memory_fraction_fn(_function_address("memsnap_memory_fraction_hook"))
        hooks.set_record_stream_fn(_function_address("memsnap_record_stream_hook"))
        try:
            torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            raise MemsnapError(
                f"{e} ({__name__}.enable() must run before the first CUDA tensor exists)"
            ) from e
        _allocator = allocator
    record_history("all", context=context, stacks=stacks, max_entries=max_entries)
    set_oom_dump_path(dump_on_oom)
    if live:
        serve_live(live)
    if modules:
        track_modules(torch)
    return _allocator


def is_enabled():
    """Whether :func:`enable` made memsnap PyTorch's allocator in this process."""
    return _allocator is not None


@contextlib.contextmanager
def record(path, max_entries=1_000_000, stacks="all", dump_on_oom=None, context="all"):
    """Records the allocations of the ``with`` block and writes them to ``path`` at its end
    (also when the block raises, e.g. on out-of-memory). Enables memsnap first if needed.

        with memsnap.torch.record("run.pickle"):
            train_one_epoch()
    """
    enable(max_entries=max_entries, stacks=stacks, dump_on_oom=dump_on_oom, context=context)
    try:
        yield
    finally:
        dump(path)
        record_history(None)


def record_history(enabled="all", context="all", stacks="all", max_entries=1_000_000):
    """Like ``torch.cuda.memory._record_memory_history``: enabled is None/"off", "state" or
    "all"; context "never", "state", "alloc" or "all"; stacks "none", "native", "python" or
    "all"."""
    lib = load_library()
    enabled = "off" if enabled is None else enabled
    _check(lib.memsnap_record_history(_encode(enabled), _encode(context), _encode(stacks), max_entries))


def dump(path):
    """Writes the snapshot (PyTorch's pickle schema; .msgpack/.json/.gz/.zst by name)."""
    _check(load_library().memsnap_dump_snapshot(_encode(os.fspath(path))))


def set_oom_dump_path(path):
    """Path written when an allocation runs out of memory; None stops it."""
    _check(load_library().memsnap_set_oom_dump_path(_encode(None if path is None else os.fspath(path))))


def empty_cache():
    """Releases cached, unused segments (what ``torch.cuda.empty_cache()`` does)."""
    _check(load_library().memsnap_empty_cache())


def memory_stats(device=0):
    """The allocator's counters with ``torch.cuda.memory_stats()``'s keys."""
    lib = load_library()
    needed = ctypes.c_size_t(0)
    status = lib.memsnap_stats_json(device, None, 0, ctypes.byref(needed))
    if status not in (0, 1):
        _check(status)
    buffer = ctypes.create_string_buffer(needed.value + 1)
    _check(lib.memsnap_stats_json(device, buffer, len(buffer), ctypes.byref(needed)))
    return json.loads(buffer.value.decode("utf-8"))


def memory_allocated(device=0):
    """Bytes allocated now (``allocated_bytes.all.current``)."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=0):
    """Peak bytes allocated (``allocated_bytes.all.peak``)."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=0):
    """Bytes reserved from the device now (``reserved_bytes.all.current``)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def annotate(stage, name, device=0):
    """Records a marker in ``device``'s history, as PyTorch records ``record_function``
    markers: ``{"stage": stage, "name": name}``, stamped with the history clock, written to
    the snapshot's ``external_annotations`` and sent to live listeners. A range is a
    ``"START"`` and an ``"END"`` of the same name (see :func:`annotation`). Nothing is
    recorded while history is off.

    PyTorch's own markers (``torch.profiler``'s ``ProfilerStep#N``) are recorded by PyTorch's
    allocator only; under memsnap, mark what the analysis should see yourself."""
    _check(load_library().memsnap_annotate(device, _encode(stage), _encode(name)))


@contextlib.contextmanager
def annotation(name, device=0):
    """A ``START``/``END`` range around the ``with`` block (the ``END`` also when it raises).
    Ranges named ``ProfilerStep#N`` are the analysis' steps, ``Optimizer.step#...`` its
    optimizer phases, names with ``backward`` its backward phases, as in PyTorch's files::

        for i, batch in enumerate(loader):
            with memsnap.torch.annotation(f"ProfilerStep#{i}"):
                train_step(batch)
    """
    annotate("START", name, device)
    try:
        yield
    finally:
        annotate("END", name, device)


MODULE_RANGE_PREFIX = "memsnap.module: "

_module_hooks = None


class ModuleTracker:
    """Names each ``nn.Module`` call by its path and records a ``memsnap.module: PATH``
    range around it (``pre`` before its forward, ``post`` after, also when it raises).

    The path is the one ``model.named_modules()`` gives, found from the calls running on
    this thread: a module called while another runs is looked up among the running ones'
    children (innermost first), so ``model.blocks[3].attn`` called from the block's forward
    is ``blocks.3.attn``. A module called with none running (the model, a loss) is named by
    its class (``GPT``). Needs no model reference, so global hooks can use it.

    ``annotate(stage, name)`` records a marker (:func:`annotate` on the current device).
    Pure Python over the modules' ``_modules`` dicts: tested without PyTorch."""

    def __init__(self, annotate):
        self._annotate = annotate
        self._local = threading.local()
        # id(module) -> (weak reference to it, its descendants' paths): the reference tells a
        # reused id from the module, without keeping a deleted model alive.
        self._trees = {}

    def _running(self):
        running = getattr(self._local, "running", None)
        if running is None:
            running = self._local.running = []
        return running

    def path(self, module):
        """The path a call of ``module`` gets now (see the class)."""
        return self._find(module)[0]

    def _find(self, module):
        """``(path, outermost)``: ``outermost`` when no running call holds the module."""
        running = self._running()
        for depth in range(len(running) - 1, -1, -1):
            parent, parent_path, parent_outermost = running[depth]
            relative = self._descendants(parent).get(id(module))
            if relative is not None:
                # An outermost call's descendants are named from it, as named_modules().
                return (relative if parent_outermost else f"{parent_path}.{relative}"), False
        return type(module).__name__, True

    def _descendants(self, parent):
        """``{id(module): dotted path}`` of every module under ``parent`` (through containers
        such as ``ModuleList`` that are never called), the first path of a shared one, as
        ``named_modules()``. Made once per parent: each call is then one lookup per running
        call, not a walk of the model."""
        cached = self._trees.get(id(parent))
        if cached is not None and cached[0]() is parent:
            return cached[1]
        paths = {}
        stack = [(parent, "")]
        while stack:
            node, prefix = stack.pop()
            children = list((getattr(node, "_modules", None) or {}).items())
            for name, child in reversed(children):
                if child is None or id(child) in paths or child is parent:
                    continue
                path = f"{prefix}{name}"
                paths[id(child)] = path
                stack.append((child, path + "."))
        self._trees[id(parent)] = (weakref.ref(parent), paths)
        return paths

    def pre(self, module, *_):
        path, outermost = self._find(module)
        self._running().append((module, path, outermost))
        self._annotate("START", MODULE_RANGE_PREFIX + path)

    def post(self, module, *_):
        running = self._running()
        # The innermost call of this module; calls inside it left open (their forward raised
        # where no hook ran) end with it.
        for depth in range(len(running) - 1, -1, -1):
            if running[depth][0] is module:
                for _, path, _ in reversed(running[depth:]):
                    self._annotate("END", MODULE_RANGE_PREFIX + path)
                del running[depth:]
                return


def track_modules(torch=None):
    """Installs :class:`ModuleTracker`'s global forward hooks (once): every ``nn.Module``
    call records a ``memsnap.module: PATH`` range on the current CUDA device."""
    global _module_hooks
    if _module_hooks is not None:
        return
    torch = torch or _import_torch()

    def annotate_current(stage, name):
        annotate(stage, name, torch.cuda.current_device())

    tracker = ModuleTracker(annotate_current)
    hooks = torch.nn.modules.module
    pre = hooks.register_module_forward_pre_hook(tracker.pre)
    try:
        post = hooks.register_module_forward_hook(tracker.post, always_call=True)
    except TypeError:  # PyTorch before 2.1: no always_call
        post = hooks.register_module_forward_hook(tracker.post)
    _module_hooks = (tracker, pre, post)


def serve_live(address=True, device=0):
    """Publishes ``device``'s history while it records, for ``memsnap watch ADDRESS`` (a line
    per finished step, ``--max-peak``/``--max-drift`` alerts, ``--save``) or any listener of
    memsnap's live protocol; returns the address (``"unix:/..."`` or ``"tcp:127.0.0.1:PORT"``).

    ``address`` is ``True`` (or ``"1"``: a unix socket, mode 0600, in a private directory named
    after the pid), ``"unix:/path.sock"`` or ``"tcp:127.0.0.1:PORT"`` (port 0 picks a free
    one; a non-loopback address such as ``"tcp:0.0.0.0:PORT"`` needs ``$MEMSNAP_LIVE_TOKEN``,
    16 bytes or more, set before the recorder starts, and ``memsnap watch --token``). The endpoint lives until the process exits; the allocator never waits
    for a listener. Asking again for a device already published (here or by
    ``$MEMSNAP_LIVE``) returns its address when ``address`` is ``True`` or that address, and
    raises :class:`MemsnapError` otherwise. Works without PyTorch (the recorder's host or
    simulated backend) as well as under :func:`enable`.
    """
    lib = load_library()
    spec = "1" if address is True else os.fspath(address)
    current = live_address(device)
    if current is not None:
        if address is True or spec == current:
            return current
        raise MemsnapError(f"device {device} is already published at {current}")
    _check(lib.memsnap_serve_live(device, _encode(spec)))
    return live_address(device)


def live_address(device=0):
    """The address ``device``'s history is published at (:func:`serve_live`,
    ``enable(live=...)`` or ``$MEMSNAP_LIVE``), or None."""
    lib = load_library()
    needed = ctypes.c_size_t(0)
    if lib.memsnap_live_address(device, None, 0, ctypes.byref(needed)) != 0 and needed.value == 0:
        return None
    buffer = ctypes.create_string_buffer(needed.value + 1)
    _check(lib.memsnap_live_address(device, buffer, len(buffer), ctypes.byref(needed)))
    return buffer.value.decode("utf-8")
