"""memsnap.load returns what pickle.load returns, and refuses what could run code."""

import gzip
import io
import os
import pickle
import subprocess
import sys

import pytest

import memsnap
from conftest import REAL, console_script, real_snapshot


def sharing(obj):
    """The object graph's sharing pattern, computed independently of memsnap: for each
    container met in a depth-first walk, the index of its first visit."""
    seen, pattern = {}, []

    def walk(o):
        if isinstance(o, (list, dict, tuple)):
            first = seen.setdefault(id(o), len(seen))
            pattern.append(first)
            if first != len(seen) - 1:
                return
            for child in (o.items() if isinstance(o, dict) else o):
                walk(child)

    walk(obj)
    return pattern


def pickle_load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


@real_snapshot
def test_load_equals_pickle_load_on_real_snapshots(path):
    expected = pickle_load(path)
    got = memsnap.load(path)
    assert got == expected
    assert sharing(got) == sharing(expected)


def test_load_equals_pickle_load_on_generated_runs(generated_runs):
    for path in generated_runs:
        expected = pickle_load(path)
        got = memsnap.load(path)
        assert got == expected, path
        assert sharing(got) == sharing(expected)
        assert got["device_traces"][0], "the generated run has trace entries"


def test_shared_frames_lists_are_shared_again(generated_runs):
    snapshot = memsnap.load(generated_runs[0])
    entries = [e for t in snapshot["device_traces"] for e in t if e.get("frames")]
    by_content = {}
    for e in entries:
        by_content.setdefault(repr(e["frames"]), set()).add(id(e["frames"]))
    # memsnap's writer stores each distinct stack once, so equal stacks are one list.
    assert all(len(ids) == 1 for ids in by_content.values())
    assert len(by_content) < len(entries)


def test_every_input_kind_gives_the_same_objects(generated_runs, tmp_path):
    path = generated_runs[1]
    expected = pickle_load(path)
    data = path.read_bytes()
    assert memsnap.load(data) == expected
    assert memsnap.loads(bytearray(data)) == expected
    assert memsnap.load(memoryview(data)) == expected
    with open(path, "rb") as f:
        assert memsnap.load(f) == expected
    assert memsnap.load(str(path)) == expected
    gz = tmp_path / "s.pickle.gz"
    gz.write_bytes(gzip.compress(data))
    assert memsnap.load(gz) == expected


@pytest.mark.parametrize("target", ["s.msgpack", "s.json", "s.json.zst", "s.msgpack.gz"])
def test_msgpack_and_json_give_what_pickle_load_gives_for_the_pickle(generated_runs, tmp_path, target):
    source = generated_runs[1]
    out = tmp_path / target
    subprocess.run([console_script("memsnap"), "convert", str(source), "-o", str(out)], check=True)
    # The same snapshot as a pickle, written by memsnap from the converted file.
    back = tmp_path / "back.pickle"
    subprocess.run([console_script("memsnap"), "convert", str(out), "-o", str(back)], check=True)
    assert memsnap.load(out) == pickle_load(back)
    assert memsnap.load(out) == pickle_load(source)


# --------------------------------------------------------------------------- hostile input

class Marker:
    """A class whose unpickling would create a file: proof that code ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def hostile_pickles(marker):
    """Pickles that run code when pickle.load reads them, one per refused opcode family."""
    path = str(marker)
    system = f"touch {path}"
    return {
        "REDUCE+STACK_GLOBAL": pickle.dumps(Marker(path), protocol=4),
        "REDUCE+GLOBAL": pickle.dumps(Marker(path), protocol=2),
        "os.system": b"cos\nsystem\n(" + pickle.dumps(system, protocol=0)[:-1] + b"tR.",
        "BUILD": b"\x80\x04}\x94(\x8c\x01a\x94K\x01ub.",
        "INST": b"(ios\nsystem\n.",
        "OBJ": b"\x80\x02(]o.",
        "NEWOBJ": b"\x80\x02])\x81.",
        "PERSID": b"Pfoo\n.",
        "BINPERSID": b"\x80\x02K\x01Q.",
        "EXT1": b"\x80\x02\x82\x01.",
        "nested in a snapshot": pickle.dumps({"segments": [], "device_traces": [[{"action": Marker(path)}]]}, protocol=4),
    }


@pytest.mark.parametrize("name", list(hostile_pickles("x")))
def test_hostile_pickles_are_refused_and_run_nothing(tmp_path, name):
    marker = tmp_path / "ran"
    data = hostile_pickles(marker)[name]
    with pytest.raises(memsnap.FormatError) as error:
        memsnap.load(data)
    message = str(error.value)
    assert "byte " in message
    assert "refused" in message or "corrupt" in message or "opcode" in message
    assert not marker.exists(), "code ran"
    # A file gets its name in the message.
    file = tmp_path / "evil.pickle"
    file.write_bytes(data)
    with pytest.raises(memsnap.FormatError, match="evil.pickle"):
        memsnap.load(file)
    assert not marker.exists()


def test_refusal_names_the_opcode_and_offset():
    data = pickle.dumps(Marker("/nonexistent/x"), protocol=4)
    with pytest.raises(memsnap.FormatError) as error:
        memsnap.load(data)
    offset = data.index(b"\x93")  # STACK_GLOBAL
    assert f"byte {offset}: opcode STACK_GLOBAL (0x93) refused" in str(error.value)


@pytest.mark.parametrize(
    "name,data,needle",
    [
        ("empty", b"", "empty"),
        ("not a pickle", b"\x00garbage", "unknown opcode 0x00"),
        ("huge string length", b"\x80\x04\x8d" + (1 << 62).to_bytes(8, "little") + b"x.", "truncated"),
        ("huge LONG4", b"\x80\x04\x8b\xff\xff\xff\xff.", "truncated"),
        ("memo get before put", b"\x80\x04h\x05.", "memo entry 5"),
        ("huge memo put then get", b"\x80\x04K\x01r\xff\xff\xff\xffj\xfe\xff\xff\xff.", "memo entry"),
        ("no stop", b"\x80\x04K\x01", "STOP"),
        ("stop on empty stack", b"\x80\x04.", "needs an item"),
        ("appends without mark", b"\x80\x04]K\x01e.", "MARK"),
        ("setitems on a list", b"\x80\x04](K\x01K\x02u.", "a dict"),
        ("unhashable key", b"\x80\x04}]K\x01s.", "unhashable"),
        ("protocol 9", b"\x80\x09N.", "protocol 9"),
        ("bad utf-8", b"\x80\x04\x8c\x02\xff\xfe.", "utf-8"),
    ],
)
def test_corrupt_pickles_raise_format_error(name, data, needle):
    with pytest.raises(memsnap.FormatError) as error:
        memsnap.load(data)
    assert needle.lower() in str(error.value).lower(), str(error.value)


@pytest.mark.skipif(not REAL, reason="MEMSNAP_REAL_SNAPSHOTS is unset")
def test_every_truncation_and_many_corruptions_raise_format_error_or_load():
    data = REAL[2].read_bytes()  # a small real file
    for cut in range(len(data)):
        with pytest.raises(memsnap.FormatError):
            memsnap.load(data[:cut])
    import random

    rng = random.Random(15)
    for _ in range(3000):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        try:
            memsnap.load(bytes(mutated))
        except memsnap.FormatError:
            pass


def test_deep_nesting_and_cycles_do_not_crash():
    deep = b"\x80\x04" + b"]" * 200_000 + b"a" * 199_999 + b"."
    result = memsnap.load(deep)
    depth = 0
    while result:
        result = result[0]
        depth += 1
    assert depth == 199_999
    # A list that contains itself, as pickle.load builds it.
    cyclic = memsnap.load(b"\x80\x04]\x94h\x00a.")
    assert cyclic[0] is cyclic


def test_surrogates_and_big_ints_round_trip():
    obj = {"s": "\ud800x", "big": 1 << 100, "neg": -(1 << 70), "i64": -(1 << 63), "f": 1.5, "b": b"\x00\xff",
           "t": (1, "a", None, True, False), "e": ()}
    data = pickle.dumps(obj, protocol=4)
    assert memsnap.load(data) == obj
    del obj["b"]  # protocol 2 writes bytes through a GLOBAL (codecs.encode), which is refused
    assert memsnap.load(pickle.dumps(obj, protocol=2)) == obj
    assert memsnap.load(pickle.dumps(obj, protocol=5)) == obj


def test_dicts_read_in_one_piece_keep_pickles_sharing_and_corner_cases():
    # Dicts the loader builds straight from the input (memoized str keys, plain values) and
    # the ones it leaves to the opcode loop: a value stored inside the dict and referenced
    # again in it, a dict or list that contains itself, memo stores that overwrite, and
    # every truncation of each.
    shared = ["a", "b"]
    name = "n" * 3
    entry = {"action": "alloc", "addr": 1 << 40, "size": 512, "stream": -1, "f": 1.5, "none": None,
             "t": True, "frames": shared, "empty": [], "one": [shared]}
    inner = {"x": name, "y": name, "l": shared, "m": shared}
    me = {"k": 1}
    me["me"] = me
    lst = []
    lst.append({"l": lst, "k": 2})
    obj = [entry, entry, dict(entry), inner, inner, me, lst, {"action": "free", "frames": shared}] * 3
    for protocol in (2, 4, 5):
        data = pickle.dumps(obj, protocol=protocol)
        got = memsnap.load(data)
        assert repr(got) == repr(pickle.loads(data))
        assert got[0] is got[1] and got[3]["x"] is got[3]["y"] and got[3]["l"] is got[0]["frames"]
        assert got[5]["me"] is got[5] and got[6][0]["l"] is got[6]
        assert got[0]["one"][0] is got[0]["frames"]
        for cut in range(len(data)):
            with pytest.raises(memsnap.FormatError):
                memsnap.load(data[:cut])
    # BINPUT over an index stored before, inside a dict: the overwrite is the generic path's.
    data = b"\x80\x04\x8c\x01k\x94\x8c\x01v\x94}\x94(h\x00h\x01q\x00h\x00h\x00u."
    assert memsnap.load(data) == pickle.loads(data)


def test_a_file_is_read_as_it_runs_across_many_windows_and_every_cut_of_it_is_refused(tmp_path):
    # A plain pickle file is run as it is read, a window of a few hundred KiB at a time: a
    # dict, a list or an int split across two windows is read the same, and a file cut
    # anywhere is refused with FormatError, not read past its end.
    entries = [
        {"action": "alloc", "addr": (1 << 40) + 512 * i, "size": 512 * (i % 7), "time_us": 10**15 + i,
         "frames": [{"filename": f"f{i % 13}.py", "line": i % 101, "name": "forward"}] * (i % 4)}
        for i in range(40_000)
    ]
    obj = {"segments": [], "device_traces": [entries]}
    data = pickle.dumps(obj, protocol=4)
    assert len(data) > 1 << 20, "spans several of the reader's windows"
    path = tmp_path / "big.pickle"
    path.write_bytes(data)
    got = memsnap.load(path)
    assert got == obj
    assert sharing(got) == sharing(pickle.loads(data))
    cut_file = tmp_path / "cut.pickle"
    for cut in list(range(0, 64)) + list(range(64, len(data), len(data) // 97)):
        cut_file.write_bytes(data[:cut])
        with pytest.raises(memsnap.FormatError):
            memsnap.load(cut_file)


def test_ints_are_what_pickle_load_gives_whichever_way_the_loader_shares_them():
    # The loader shares equal ints three ways (a key's last value, a small cache, a fresh
    # int for keys whose values never repeat) and switches a key between them after its
    # first 4096 values; the keys of the last dicts are stored beyond the memo indices it
    # tracks. Whatever it picks, the values are pickle.load's.
    rows = []
    for i in range(12_000):
        rows.append({
            "unique": 10**15 + 7 * i,          # never repeats
            "same": 1 << 33,                   # always the last value
            "pairs": (1 << 40) + i // 2,       # each value twice in a row
            "cycle": 4096 * (i % 300),         # repeats, but never twice in a row
            "small": i % 5,
            "neg": -(1 << 35) - (i % 3),
            "late": i if i < 6000 else 5,     # unique, then one value
        })
    tail = [{f"k{j}": 1000 + j, "unique": j} for j in range(5000)]  # keys memoized past 4096
    obj = rows + tail
    for protocol in (2, 4, 5):
        data = pickle.dumps(obj, protocol=protocol)
        assert memsnap.load(data) == pickle.loads(data)


def test_import_memsnap_leaves_numpy_typing_and_subprocess_unimported():
    # `import memsnap` is what a script pays before `memsnap.load`; NumPy alone took 94 ms of
    # the 176 ms it took (and started BLAS threads). They load on first use.
    code = (
        "import sys, memsnap\n"
        "heavy = [m for m in ('numpy', 'typing', 'subprocess', 'importlib.metadata') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
        "memsnap.Snapshot, memsnap.summary, memsnap.__version__\n"
        "print('numpy' in sys.modules or memsnap._snapshot._np is None)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines == ["", "True"], out.stdout
