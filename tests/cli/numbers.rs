//! Lossless numbers through the command line: a frame line of 2^64 − 1 (what `torch.compile`d
//! runs write), negative and 100-bit ints load, convert and print exactly as Python prints
//! them.

use std::path::Path;
use std::process::Output;

use memsnap_format::{
    Action, Block, BlockState, ExactInts, Frame, IntField, PyInt, Segment, Snapshot, TraceEntry,
};

use crate::common::memsnap;

const U64_MAX: &str = "18446744073709551615";
const TWO_100: &str = "1267650600228229401496703205376";

fn arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8 output")
}

/// A `torch.compile` frame with line 2^64 − 1 on a block and on trace entries, a C++-path
/// negative address, a negative `segment_map` size and a 100-bit size.
fn snapshot() -> Snapshot {
    let mut snap = Snapshot::new(1);
    let stack = snap.intern_stack([
        Frame::new("compiled_fn", "/tmp/torchinductor/xy.py", u64::MAX),
        Frame::new("forward", "/src/model.py", 54),
    ]);
    let mut seg = Segment::new(0, 0x7f00_0000_0000, 2 << 20, 0);
    seg.allocated_size = Some(1 << 20);
    seg.active_size = Some(1 << 20);
    seg.requested_size = Some(1000);
    seg.blocks = vec![
        Block {
            address: Some(0x7f00_0000_0000),
            size: 1 << 20,
            requested_size: Some(1000),
            state: BlockState::ActiveAllocated,
            frames: Some(stack),
            ..Block::default()
        },
        Block {
            address: Some(0x7f00_0010_0000),
            size: 1 << 20,
            requested_size: Some(0),
            state: BlockState::Inactive,
            frames: Some(snap.intern_stack([])),
            ..Block::default()
        },
    ];
    snap.segments.push(seg);

    let mut alloc = TraceEntry::new(Action::Alloc, 0x7f00_0000_0000, 1000, 0);
    alloc.frames = Some(stack);
    // C++ path: an address >= 2^63 arrives as a negative int64.
    let mut cpp = TraceEntry::new(Action::Alloc, 0, 0, 0);
    let mut x = ExactInts::default();
    cpp.addr = x.store_u64(IntField::Addr, PyInt::Small(-4096));
    cpp.size = x.store_u64(IntField::Size, PyInt::parse_decimal(TWO_100).unwrap());
    cpp.rare_mut().exact = x;
    let mut map = TraceEntry::new(Action::SegmentMap, 0x7f00_0000_0000, 0, 0);
    let mut x = ExactInts::default();
    map.size = x.store_u64(IntField::Size, PyInt::Small(-512));
    map.stream = x.store_i64(IntField::Stream, PyInt::from(u64::MAX));
    map.frames = Some(stack);
    map.rare_mut().exact = x;
    snap.device_traces.as_mut().unwrap()[0] = vec![alloc, cpp, map];
    snap
}

#[test]
fn frame_line_u64_max_info_convert_and_memviz_print_it_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("compiled.pickle");
    std::fs::write(&path, memsnap_format::pickle::to_vec(&snapshot())).unwrap();

    let info = ok(&memsnap(&["info", arg(&path)]));
    assert!(info.contains("entries"), "{info}");

    let segments = ok(&memsnap(&["memviz", "segments", arg(&path)]));
    assert!(
        segments.contains(&format!("xy.py:{U64_MAX}:compiled_fn")),
        "{segments}"
    );
    let memory = ok(&memsnap(&["memviz", "memory", arg(&path)]));
    assert!(
        memory.contains(&format!("xy.py:{U64_MAX}:compiled_fn")),
        "{memory}"
    );

    let trace = ok(&memsnap(&["memviz", "trace", arg(&path)]));
    // Python: `repr(entry)` for segment_map, the exact ints verbatim.
    assert!(
        trace.contains(&format!(
            "{{'action': 'segment_map', 'addr': 139637976727552, 'size': -512, 'stream': {U64_MAX}, 'frames': [{{'name': 'compiled_fn', 'filename': '/tmp/torchinductor/xy.py', 'line': {U64_MAX}}}"
        )),
        "{trace}"
    );
    // `MEM[addr:size]` with the negative address, `_format_size` of 2^100 (float division).
    assert!(trace.contains("b = MEM[-4096:1048576.0YiB]"), "{trace}");

    let stats = ok(&memsnap(&["memviz", "stats", arg(&path)]));
    assert!(stats.contains("segments: 1"), "{stats}");

    for ext in ["json", "msgpack", "pickle"] {
        let out = dir.path().join(format!("out.{ext}"));
        ok(&memsnap(&["convert", arg(&path), "-o", arg(&out)]));
        let (back, _) = memsnap_format::read_path(&out).unwrap();
        assert_eq!(
            memsnap_format::compare::diff(&snapshot(), &back),
            None,
            "{ext}"
        );
        if ext == "json" {
            let text = std::fs::read_to_string(&out).unwrap();
            assert!(text.contains(&format!("\"line\":{U64_MAX}")), "{text}");
            assert!(text.contains("\"addr\":-4096"), "{text}");
            assert!(text.contains(&format!("\"size\":{TWO_100}")), "{text}");
        }
        let again = ok(&memsnap(&["memviz", "trace", arg(&out)]));
        assert_eq!(again, trace, "{ext}");
    }
    let back = dir.path().join("out.pickle");
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&path).unwrap());
}

/// A segment whose sizes arrive negative (int64 casts of huge values): `stats` does Python's
/// arithmetic on them; a segment too large to map fails like Python (MemoryError), no abort.
#[test]
fn memviz_stats_of_negative_and_huge_sizes() {
    let mut snap = Snapshot::new(1);
    let mut seg = Segment::new(0, 0, 0, -1);
    let x = &mut seg.exact;
    seg.address = x.store_u64(IntField::Address, PyInt::Small(-4096));
    seg.total_size = x.store_u64(IntField::TotalSize, PyInt::Small(-(2 << 20)));
    seg.allocated_size = Some(x.store_u64(IntField::AllocatedSize, PyInt::Small(-5)));
    let empty = snap.intern_stack([]);
    let mut used = Block {
        state: BlockState::ActiveAllocated,
        frames: Some(empty),
        ..Block::default()
    };
    used.address = Some(used.exact.store_u64(IntField::Address, PyInt::Small(-4096)));
    used.size = used.exact.store_u64(IntField::Size, PyInt::Small(-512));
    used.requested_size = Some(
        used.exact
            .store_u64(IntField::RequestedSize, PyInt::Small(-600)),
    );
    let mut free = Block {
        address: Some(0),
        requested_size: Some(0),
        state: BlockState::Inactive,
        frames: Some(empty),
        ..Block::default()
    };
    free.size = free
        .exact
        .store_u64(IntField::Size, PyInt::Small(-(2 << 20) + 512));
    seg.blocks = vec![used, free];
    snap.segments.push(seg);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("negative.pickle");
    std::fs::write(&path, memsnap_format::pickle::to_vec(&snap)).unwrap();
    let stats = ok(&memsnap(&["memviz", "stats", arg(&path)]));
    // Python: _format_size(-2097152) divides on abs(); 88 / -2096640 * 100 is -0.0042.
    assert!(
        stats.contains(
            "segments: 1\ntotal_reserved: -2.0MiB\ntotal_allocated: -600.0B\ntotal_free: -2.0MiB (-0.0% internal)\n"
        ),
        "{stats}"
    );
    let segments = ok(&memsnap(&["memviz", "segments", arg(&path)]));
    assert_eq!(
        segments,
        "stream_-1;seg_-4096;active_allocated;<non-python> -600\n\
         stream_-1;seg_-4096;active_allocated;<gaps> 88\n\
         stream_-1;seg_-4096;inactive;<non-python> 0\n\
         stream_-1;seg_-4096;inactive;<gaps> -2096640\n"
    );

    let seg = &mut snap.segments[0];
    seg.exact = ExactInts::default();
    seg.total_size = u64::MAX;
    std::fs::write(&path, memsnap_format::pickle::to_vec(&snap)).unwrap();
    let out = memsnap(&["memviz", "stats", arg(&path)]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("MemoryError"), "{err}");
}
