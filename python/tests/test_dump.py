"""memsnap.dump writes pickles that pickle.load (and so PyTorch's tools) read back equal."""

import gzip
import pickle

import pytest

import memsnap
from conftest import real_snapshot
from test_load import pickle_load, sharing


@real_snapshot
def test_dumps_of_a_real_snapshot_is_byte_identical_to_cpython(path):
    # The real files were written by CPython's pickler; memsnap spells pickles the same way.
    data = path.read_bytes()
    assert memsnap.dumps(pickle.loads(data)) == data
    # memsnap.load hands out one str object per distinct string (pickle.load makes a new one
    # per occurrence), so dumping its result memoizes more strings: equal, not identical bytes.
    again = memsnap.dumps(memsnap.load(data))
    assert len(again) <= len(data)
    assert pickle.loads(again) == pickle.loads(data)


@real_snapshot
def test_dump_then_pickle_load_is_equal(path, tmp_path):
    snapshot = memsnap.load(path)
    out = tmp_path / "copy.pickle"
    memsnap.dump(snapshot, out)
    back = pickle_load(out)
    assert back == snapshot
    assert sharing(back) == sharing(snapshot)


def test_dump_of_generated_runs_and_compression(generated_runs, tmp_path):
    for path in generated_runs:
        snapshot = pickle_load(path)
        for name in ("a.pickle", "a.pkl.gz", "a.pickle.zst"):
            out = tmp_path / name
            memsnap.dump(snapshot, out)
            assert memsnap.load(out) == snapshot
        assert pickle.loads(gzip.decompress((tmp_path / "a.pkl.gz").read_bytes())) == snapshot
        assert pickle_load(tmp_path / "a.pickle") == snapshot


def test_dump_as_msgpack_and_json_reads_back_equal(generated_runs, tmp_path):
    snapshot = pickle_load(generated_runs[1])
    for name in ("a.msgpack", "a.json.gz"):
        out = tmp_path / name
        memsnap.dump(snapshot, out)
        assert memsnap.load(out) == snapshot
    with pytest.raises(memsnap.FormatError, match="not a snapshot"):
        memsnap.dump({"hello": 1}, tmp_path / "b.json")


def test_dumps_matches_pickle_dumps_on_edge_values():
    obj = {"s": "\ud800x", "big": 1 << 100, "neg": -(1 << 70), "i64": -(1 << 63), "u64": (1 << 64) - 1,
           "ints": [0, 255, 256, 65535, 65536, -1, -129, 2**31 - 1, -(2**31), 2**31],
           "f": [1.5, float("inf")], "b": b"\x00\xff", "t": (1, "a", None, True, False), "t4": (1, 2, 3, 4),
           "e": (), "long": "x" * 70000, "list": list(range(2500)), "d": {i: str(i) for i in range(1500)}}
    shared = [1, 2]
    obj["shared"] = [shared, shared, (shared,)]
    assert memsnap.dumps(obj) == pickle.dumps(obj, protocol=4)
    assert pickle.loads(memsnap.dumps(obj)) == obj


def test_dump_refuses_objects_that_are_not_data(tmp_path):
    class Custom:
        pass

    with pytest.raises(TypeError, match=r"obj\['device_traces'\]\[0\]\[1\]"):
        memsnap.dumps({"device_traces": [[1, Custom()]]})
    with pytest.raises(TypeError, match="set"):
        memsnap.dump({1, 2}, tmp_path / "x.pickle")
    assert not (tmp_path / "x.pickle").exists()
