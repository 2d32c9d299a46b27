"""memsnap.open: typed columns that match the snapshot pickle.load gives."""

import pytest

import memsnap
from conftest import real_snapshot
from test_load import pickle_load


def expected_segment_columns(snapshot):
    segments = snapshot if isinstance(snapshot, list) else snapshot.get("segments", [])
    return {
        "device": [s["device"] for s in segments],
        "address": [s["address"] for s in segments],
        "total_size": [s["total_size"] for s in segments],
        "block_count": [len(s["blocks"]) for s in segments],
    }


def check_against_pickle(path):
    snapshot = pickle_load(path)
    snap = memsnap.open(path)
    segments = snap.segments
    expected = expected_segment_columns(snapshot)
    assert len(segments) == len(expected["address"])
    for name, values in expected.items():
        assert [int(v) for v in getattr(segments, name)] == values, name
    blocks = snap.blocks
    assert len(blocks) == sum(expected["block_count"])
    if not isinstance(snapshot, dict):
        return
    all_blocks = [b for s in snapshot.get("segments", []) for b in s["blocks"]]
    assert [int(x) for x in blocks.size] == [b["size"] for b in all_blocks]
    assert blocks.state == [b["state"] for b in all_blocks]
    traces = snapshot.get("device_traces", [])
    assert len(snap.traces) == len(traces)
    for index, trace in enumerate(traces):
        columns = snap.trace(index)
        assert len(columns) == len(trace)
        assert columns.action == [e["action"] for e in trace]
        assert [int(x) for x in columns.addr] == [e.get("addr", 0) & (2**64 - 1) for e in trace]
        assert [int(x) for x in columns.size] == [e.get("size", 0) for e in trace]
        assert [int(x) for x in columns.time_us] == [e.get("time_us", -1) for e in trace]
        for i in range(0, len(trace), max(1, len(trace) // 50)):
            frames = [(f["filename"], f["line"], f["name"]) for f in trace[i].get("frames", [])]
            assert [tuple(f) for f in columns.stack(i)] == frames, (index, i)
    assert snap.entry_count == sum(len(t) for t in traces)
    for i in range(0, len(segments), max(1, len(segments) // 20)):
        seg = snapshot["segments"][i]
        frames = [(f["filename"], f["line"], f["name"]) for f in seg.get("frames", [])]
        assert [tuple(f) for f in segments.stack(i)] == frames


@real_snapshot
def test_open_matches_pickle_load_on_real_snapshots(path):
    check_against_pickle(path)


def test_open_matches_pickle_load_on_generated_runs(generated_runs):
    for path in generated_runs:
        check_against_pickle(path)


def test_columns_are_numpy_arrays_when_numpy_is_installed(generated_runs):
    np = pytest.importorskip("numpy")
    snap = memsnap.open(generated_runs[0])
    trace = snap.trace(0)
    assert isinstance(trace.size, np.ndarray) and trace.size.dtype == np.uint64
    allocs = trace.size[trace.action_code == trace.action_names.index("alloc")]
    assert int(allocs.sum()) == sum(
        e["size"] for e in pickle_load(generated_runs[0])["device_traces"][0] if e["action"] == "alloc"
    )


def test_open_is_lazy_and_reports_bad_files(tmp_path, generated_runs):
    snap = memsnap.open(generated_runs[0])
    assert "segments" in repr(snap)
    snap.wait()
    assert snap.is_decoded()
    assert snap.devices == [0]
    # Segments first, then garbage: open succeeds, the trace query reports the bad bytes.
    data = bytearray(generated_runs[0].read_bytes())
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(bytes(data[: len(data) - 40]))
    try:
        snap = memsnap.open(bad)
    except memsnap.FormatError as error:
        assert "bad.pickle" in str(error)
    else:
        with pytest.raises(memsnap.FormatError, match="bad.pickle"):
            snap.trace(0)
    with pytest.raises(FileNotFoundError):
        memsnap.open(tmp_path / "missing.pickle")
    with pytest.raises(IndexError, match="trace 7"):
        memsnap.open(generated_runs[0]).trace(7)
