"""memsnap.torch: the recorder library shipped in the wheel, driven through ctypes.

PyTorch and a GPU are not needed: the recorder's host backend (MEMSNAP_BACKEND=host) serves
the allocations, as recorder-ffi/python/test_memsnap_ctypes.py does."""

import os
import subprocess
import sys
import textwrap

import memsnap
import memsnap.torch


def _record_on_the_host_backend(script, out):
    """Runs ``script`` in a fresh interpreter on the recorder's host backend (no GPU, no
    torch) and loads the snapshot it dumped to ``out``."""
    env = dict(os.environ, MEMSNAP_BACKEND="host")
    subprocess.run([sys.executable, "-c", script], check=True, env=env)
    return memsnap.load(out)


def test_the_library_is_shipped():
    assert os.path.isfile(memsnap.torch.library_path())


def test_enable_without_torch_says_what_is_missing():
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        import pytest

        pytest.skip("torch is installed")
    try:
        memsnap.torch.enable()
    except memsnap.torch.MemsnapError as error:
        assert "needs PyTorch" in str(error)
    else:
        raise AssertionError("enable() without torch did not raise")


def test_recording_through_the_shipped_library(tmp_path):
    out = tmp_path / "run.pickle"
    script = textwrap.dedent(
        f"""
        import memsnap, memsnap.torch
        lib = memsnap.torch.load_library()
        memsnap.torch.record_history("all", context="all", stacks="python", max_entries=1000)
        def allocate_activations():
            return [lib.memsnap_alloc(4 << 20, 0, None) for _ in range(3)]
        activations = allocate_activations()
        assert all(activations), lib.memsnap_last_error()
        assert memsnap.torch.max_memory_allocated() >= 12 << 20
        for p in activations:
            lib.memsnap_free(p, 4 << 20, 0, None)
        try:
            memsnap.torch.record_history("sometimes")
        except memsnap.torch.MemsnapError as e:
            assert "sometimes" in str(e)
        else:
            raise AssertionError("bad mode accepted")
        memsnap.torch.dump({str(out)!r})
        """
    )
    snapshot = _record_on_the_host_backend(script, out)
    entries = snapshot["device_traces"][0]
    allocs = [e for e in entries if e["action"] == "alloc"]
    assert [e["size"] for e in allocs] == [4 << 20] * 3
    names = {f["name"] for e in allocs for f in e["frames"]}
    assert "allocate_activations" in names


def test_annotations_recorded_through_the_library_are_the_snapshots_steps(tmp_path):
    """annotation() ranges reach the dump's external_annotations, in order, and the analysis
    finds the steps from them (a run without stacks has no other evidence)."""
    out = tmp_path / "annotated.pickle"
    script = textwrap.dedent(
        f"""
        import memsnap.torch
        lib = memsnap.torch.load_library()
        memsnap.torch.record_history("all", context="all", stacks="none", max_entries=10000)
        weights = lib.memsnap_alloc(64 << 20, 0, None)
        for step in range(4):
            with memsnap.torch.annotation(f"ProfilerStep#{{step}}"):
                activations = [lib.memsnap_alloc((1 + i) << 20, 0, None) for i in range(8)]
                for i, p in reversed(list(enumerate(activations))):
                    lib.memsnap_free(p, (1 + i) << 20, 0, None)
        try:
            memsnap.torch.annotate("", "x")
        except memsnap.torch.MemsnapError as e:
            assert "stage" in str(e), e
        else:
            raise AssertionError("an empty stage was accepted")
        memsnap.torch.dump({str(out)!r})
        """
    )
    snapshot = _record_on_the_host_backend(script, out)
    marks = [(a["stage"], a["name"]) for a in snapshot["external_annotations"]]
    assert marks == [
        (stage, f"ProfilerStep#{step}") for step in range(4) for stage in ("START", "END")
    ]
    times = [a["time_us"] for a in snapshot["external_annotations"]]
    assert times == sorted(times)
    device = memsnap.summary(out)["devices"][0]
    assert len(device["steps"]) == 4, device["steps"]
    assert device["step_method"].startswith("annotations"), device["step_method"]


class _Module:
    """What ModuleTracker reads of an nn.Module: its ``_modules`` dict."""

    def __init__(self, **children):
        self._modules = dict(children)


class Block(_Module):
    pass


class GPT(_Module):
    pass


class CrossEntropyLoss(_Module):
    pass


def test_module_calls_are_named_by_their_path_as_named_modules_names_them():
    attn = [_Module(), _Module()]
    blocks = _Module(**{"0": Block(attn=attn[0]), "1": Block(attn=attn[1])})  # a ModuleList
    model = GPT(blocks=blocks, head=_Module())
    marks = []
    tracker = memsnap.torch.ModuleTracker(lambda stage, name: marks.append((stage, name)))

    def call(module, body=()):
        tracker.pre(module)
        for inner in body:
            inner()
        tracker.post(module)

    call(
        model,
        [lambda b=b: call(b, [lambda b=b: call(b._modules["attn"])]) for b in blocks._modules.values()]
        + [lambda: call(model._modules["head"])],
    )
    call(CrossEntropyLoss())
    prefix = memsnap.torch.MODULE_RANGE_PREFIX
    names = [(stage, name[len(prefix):]) for stage, name in marks]
    assert all(name.startswith(prefix) for _, name in marks)
    assert names == [
        ("START", "GPT"),
        ("START", "blocks.0"),
        ("START", "blocks.0.attn"),
        ("END", "blocks.0.attn"),
        ("END", "blocks.0"),
        ("START", "blocks.1"),
        ("START", "blocks.1.attn"),
        ("END", "blocks.1.attn"),
        ("END", "blocks.1"),
        ("START", "head"),
        ("END", "head"),
        ("END", "GPT"),
        ("START", "CrossEntropyLoss"),
        ("END", "CrossEntropyLoss"),
    ]


def test_a_module_whose_forward_raised_is_closed_with_its_caller():
    inner = _Module()
    model = GPT(inner=inner)
    marks = []
    tracker = memsnap.torch.ModuleTracker(lambda stage, name: marks.append((stage, name)))
    tracker.pre(model)
    tracker.pre(inner)  # its forward raises where no hook runs
    tracker.post(model)
    prefix = memsnap.torch.MODULE_RANGE_PREFIX
    assert marks == [
        ("START", prefix + "GPT"),
        ("START", prefix + "inner"),
        ("END", prefix + "inner"),
        ("END", prefix + "GPT"),
    ]
    marks.clear()
    tracker.pre(model)
    tracker.post(model)
    assert marks == [("START", prefix + "GPT"), ("END", prefix + "GPT")]


def test_track_modules_installs_torchs_global_forward_hooks_and_names_the_calls(tmp_path):
    """track_modules() against PyTorch's hook API (``register_module_forward_pre_hook(hook)``,
    ``register_module_forward_hook(hook, *, always_call=False)``), faked: it registers both
    once, asks for ``always_call``, and the hooks, called as torch calls them, record
    ``memsnap.module:`` ranges into the history, so the summary names the memory at the peak
    by module path."""
    out = tmp_path / "modules.pickle"
    script = textwrap.dedent(
        f"""
        import types
        import memsnap.torch
        lib = memsnap.torch.load_library()
        memsnap.torch.record_history("all", context="all", stacks="none", max_entries=10000)
        registered = []
        class Handle:
            def remove(self):
                pass
        def register_pre(hook):
            registered.append(("pre", hook, None))
            return Handle()
        def register_post(hook, *, always_call=False):
            registered.append(("post", hook, always_call))
            return Handle()
        module_api = types.SimpleNamespace(
            register_module_forward_pre_hook=register_pre,
            register_module_forward_hook=register_post,
        )
        torch = types.SimpleNamespace(
            nn=types.SimpleNamespace(modules=types.SimpleNamespace(module=module_api)),
            cuda=types.SimpleNamespace(current_device=lambda: 0),
        )
        memsnap.torch.track_modules(torch)
        memsnap.torch.track_modules(torch)  # installed once
        assert [(kind, always) for kind, _, always in registered] == [("pre", None), ("post", True)]
        pre, post = registered[0][1], registered[1][1]
        class GPT:
            def __init__(self, **children):
                self._modules = children
        class Block(GPT):
            pass
        blocks = GPT(**{{"0": Block(), "1": Block()}})
        model = GPT(blocks=blocks)
        kept = []
        pre(model, (None,))
        for block in blocks._modules.values():
            pre(block, (None,))
            kept.append(lib.memsnap_alloc(8 << 20, 0, None))
            post(block, (None,), None)
        post(model, (None,), None)
        memsnap.torch.dump({str(out)!r})
        """
    )
    snapshot = _record_on_the_host_backend(script, out)
    prefix = memsnap.torch.MODULE_RANGE_PREFIX
    marks = [(a["stage"], a["name"][len(prefix):]) for a in snapshot["external_annotations"]]
    assert marks == [
        ("START", "GPT"),
        ("START", "blocks.0"),
        ("END", "blocks.0"),
        ("START", "blocks.1"),
        ("END", "blocks.1"),
        ("END", "GPT"),
    ]
    device = memsnap.summary(out)["devices"][0]
    modules = {m["module"]: m["bytes"] for m in device["modules_at_peak"]}
    assert modules == {"blocks.0": 8 << 20, "blocks.1": 8 << 20}, device["modules_at_peak"]


def test_serve_live_publishes_the_history_without_torch(tmp_path):
    """serve_live() through the shipped library: the address comes back, a listener gets the
    protocol's Hello and State frames (length-prefixed msgpack), and live_address() says it."""
    socket_path = tmp_path / "run.sock"
    script = textwrap.dedent(
        f"""
        import socket, struct
        import memsnap.torch
        lib = memsnap.torch.load_library()
        assert memsnap.torch.live_address() is None
        url = memsnap.torch.serve_live("unix:{socket_path}")
        assert url == "unix:{socket_path}", url
        assert memsnap.torch.live_address() == url
        assert memsnap.torch.serve_live(True) == url
        memsnap.torch.record_history("all", context="all", stacks="none", max_entries=1000)
        assert lib.memsnap_alloc(1 << 20, 0, None)
        listener = socket.socket(socket.AF_UNIX)
        listener.settimeout(30)
        listener.connect("{socket_path}")
        def frame():
            head = b""
            while len(head) < 4:
                head += listener.recv(4 - len(head))
            (length,) = struct.unpack("<I", head)
            body = b""
            while len(body) < length:
                body += listener.recv(length - len(body))
            return body
        assert b"Hello" in frame()
        assert b"State" in frame()
        print("ok")
        """
    )
    env = dict(os.environ, MEMSNAP_BACKEND="simulated")
    env.pop("MEMSNAP_LIVE", None)
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"
    assert f"memsnap: live at unix:{socket_path}" in run.stderr
    assert not socket_path.exists(), "the socket is removed at exit"
