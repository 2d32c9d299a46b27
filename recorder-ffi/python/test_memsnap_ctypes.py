"""Drives libmemsnap_recorder.so through ctypes, the way memsnap_torch does, without torch.

    MEMSNAP_BACKEND=host python3 recorder-ffi/python/test_memsnap_ctypes.py \
        --library target/debug/libmemsnap_recorder.so --out /tmp/py.pickle --expect /tmp/py-frames.tsv

It allocates "activations" from Python functions of this file, checks memory_stats(), dumps a
snapshot, and writes to --expect the Python frames the snapshot must contain, outermost first,
one "function<TAB>line<TAB>file" per line. The Rust test recorder-ffi/tests/it/python.rs runs it and checks the snapshot.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memsnap_torch  # noqa: E402

MiB = 1 << 20
EXPECTED_FRAMES = []


def expect_next_line(function):
    """Records that the line after the caller's current line allocates from `function`."""
    caller = sys._getframe(1)
    EXPECTED_FRAMES.append(
        {"filename": caller.f_code.co_filename, "line": caller.f_lineno + 1, "name": function}
    )


def allocate_activations(lib, layers):
    expect_next_line("allocate_activations")
    activations = [lib.memsnap_alloc(4 * MiB, 0, None)]
    for _ in range(layers - 1):
        activations.append(lib.memsnap_alloc(4 * MiB, 0, None))
    return activations


def release_activations(lib, activations):
    for ptr in reversed(activations):
        lib.memsnap_free(ptr, 4 * MiB, 0, None)


def train_step(lib):
    expect_next_line("train_step")
    activations = allocate_activations(lib, layers=3)
    assert all(activations), memsnap_torch.load().memsnap_last_error()
    release_activations(lib, activations)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--library", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--expect", required=True)
    parser.add_argument("--stacks", default="all")
    args = parser.parse_args()

    lib = memsnap_torch.load(args.library)
    memsnap_torch.record_history("all", context="all", stacks=args.stacks, max_entries=10_000)

    # PyTorch's pluggable allocator may ask for 0 bytes and free NULL.
    assert lib.memsnap_alloc(0, 0, None) is None
    lib.memsnap_free(None, 0, 0, None)

    expect_next_line("main")
    train_step(lib)
    kept = lib.memsnap_alloc(3 * MiB, 0, None)

    stats = memsnap_torch.memory_stats(0)
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current"):
        assert key in stats, f"memory_stats() lacks {key}: {sorted(stats)[:10]}"
    assert stats["allocated_bytes.all.peak"] >= 3 * 4 * MiB, stats["allocated_bytes.all.peak"]
    assert memsnap_torch.memory_allocated() >= 3 * MiB

    try:
        memsnap_torch.record_history("sometimes")
    except memsnap_torch.MemsnapError as error:
        assert "sometimes" in str(error), str(error)
    else:
        raise AssertionError("an invalid history mode was accepted")

    memsnap_torch.dump(args.out)
    lib.memsnap_free(kept, 3 * MiB, 0, None)
    with open(args.expect, "w") as f:
        for frame in EXPECTED_FRAMES:  # one "name<TAB>line<TAB>filename" per line
            f.write(f"{frame['name']}\t{frame['line']}\t{frame['filename']}\n")
    print(f"ok: {len(EXPECTED_FRAMES)} expected Python frames, snapshot in {args.out}")


if __name__ == "__main__":
    main()
