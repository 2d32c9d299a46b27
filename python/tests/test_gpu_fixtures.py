"""The snapshots recorded on an NVIDIA H200 under torch 2.11 (fixtures/gpu_h200_torch2.11: by
PyTorch's allocator and by memsnap.torch), read as PyTorch's tools read them."""

import gzip
import pathlib
import pickle
import pickletools

import pytest

import memsnap

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "gpu_h200_torch2.11"
SNAPSHOTS = sorted(FIXTURES.glob("*.pickle.gz"))

# What MemoryViz.js (PyTorch's browser viewer) unpickles: protocols 2 to 4 and these opcodes;
# any other opcode stops it with "UNKNOWN OPCODE".
MEMORYVIZ_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWTRUE", "NEWFALSE",
    "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE",
}


def opcodes(data):
    used, protocol = set(), None
    for op, arg, _ in pickletools.genops(data):
        used.add(op.name)
        if op.name == "PROTO":
            protocol = arg
    return used, protocol


def test_the_fixtures_are_there():
    names = {p.name for p in SNAPSHOTS}
    assert {"native.pickle.gz", "memsnap.pickle.gz", "memsnap.on_oom.pickle.gz"} <= names


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.name)
def test_memsnap_load_equals_pickle_load(path):
    data = gzip.decompress(path.read_bytes())
    assert memsnap.load(data) == pickle.loads(data)


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.name)
def test_memoryviz_js_can_unpickle_them_and_memsnaps_rewrite(path):
    data = gzip.decompress(path.read_bytes())
    for pickled in (data, memsnap.dumps(memsnap.load(data))):
        used, protocol = opcodes(pickled)
        assert 2 <= protocol <= 4
        assert used <= MEMORYVIZ_OPCODES, sorted(used - MEMORYVIZ_OPCODES)


IMPORTS = ["profiler.pt.trace.json.gz", "memory_timeline.raw.json.gz", "memory_timeline.json.gz"]
# Keys of PyTorch's `_snapshot()` dict: `_memory_viz.py` and MemoryViz.js read these and
# ignore the rest, so memsnap's own data goes under one key of its own.
PYTORCH_KEYS = {"segments", "device_traces", "allocator_settings", "external_annotations"}


@pytest.mark.parametrize("name", IMPORTS)
def test_an_imported_trace_is_a_snapshot_pytorchs_viewers_read(name, tmp_path):
    """`memsnap import` of the H200 profiler trace and memory timelines writes a pickle that
    PyTorch's viewers read as one of their own: plain dicts and lists in protocol 2-4 with
    MemoryViz.js's opcodes, PyTorch's keys, and the numbers only the source knew (memory from
    before the profile, the reserved series, the categories) under `"memsnap"`."""
    from conftest import console_script
    import subprocess

    out = tmp_path / "imported.pickle"
    subprocess.run([console_script("memsnap"), "import", str(FIXTURES / name), "-o", str(out)],
                   check=True, capture_output=True)
    data = out.read_bytes()
    used, protocol = opcodes(data)
    assert 2 <= protocol <= 4
    assert used <= MEMORYVIZ_OPCODES, sorted(used - MEMORYVIZ_OPCODES)
    snapshot = pickle.loads(data)
    assert set(snapshot) - {"memsnap"} <= PYTORCH_KEYS
    assert {"segments", "device_traces"} <= set(snapshot)
    # What `_memory_viz.py trace` and the Active Memory Timeline read of each entry.
    entries = snapshot["device_traces"][0]
    assert entries
    for entry in entries:
        assert {"action", "addr", "size", "stream", "frames"} <= set(entry)
        assert isinstance(entry["size"], int) and isinstance(entry["frames"], list)
    assert [s["source"] for s in snapshot["memsnap"]["sources"]] != []
    assert memsnap.load(data) == snapshot
