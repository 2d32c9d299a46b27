//! The snapshot of `testdata/fixture.py`, built in code, must print what torch 2.15's
//! `_memory_viz.py` printed for it (`testdata/fixture.*.txt`). It covers what the real files do
//! not: legacy history blocks, names past `z`, a segment range reused, frees of unknown
//! addresses, `oom`, `annotate`, dict reprs of odd values, legacy key order, hidden frames.

use memsnap_format::{
    Action, Block, BlockState, Frame, HistoryItem, Segment, Snapshot, StackId, TraceEntry, Value,
};

use super::{flame, stats, trace};

const MIB: u64 = 1 << 20;
const BASE: u64 = 0x7f00_0000_0000;

fn block(
    address: Option<u64>,
    size: u64,
    requested: Option<u64>,
    state: BlockState,
    frames: Option<StackId>,
) -> Block {
    Block {
        address,
        size,
        requested_size: requested,
        state,
        frames,
        forward_frames: None,
        history: None,
        extra: Vec::new(),
        exact: Default::default(),
    }
}

fn entry(action: Action, addr: u64, size: u64, time_us: Option<i64>) -> TraceEntry {
    let mut e = TraceEntry::new(action, addr, size, 0);
    e.time_us = time_us;
    e
}

fn fixture() -> Snapshot {
    let mut s = Snapshot::new(3);
    let a = s.intern_stack([
        Frame::new("forward", "/home/u/model.py", 54),
        Frame::new("PyEval_EvalFrame", "ceval.c", 0),
        Frame::new("<module>", "C:\\train\\train.py", 10),
    ]);
    let b = s.intern_stack([Frame::new("it's \"q\"", "x/y.py", 3)]);
    let hidden = s.intern_stack([Frame::new("torch::unwind::unwind()", "", 0)]);
    let empty = s.intern_stack([]);
    use BlockState::{ActiveAllocated as Allocated, Inactive};

    let mut seg0 = Segment::new(0, BASE, 45 * MIB, 0);
    seg0.allocated_size = Some(30 * MIB);
    seg0.active_size = Some(30 * MIB);
    seg0.requested_size = Some(25 * MIB);
    seg0.frames = Some(b);
    seg0.frames_after_blocks = true;
    seg0.blocks = vec![
        block(Some(BASE), 30 * MIB, Some(25 * MIB), Allocated, Some(a)),
        block(
            Some(BASE + 30 * MIB),
            15 * MIB,
            Some(8),
            Inactive,
            Some(empty),
        ),
    ];

    let base1 = BASE + 64 * MIB;
    let mut seg1 = Segment::new(0, base1, 22 * MIB, 140_000);
    seg1.allocated_size = Some(3 * MIB);
    seg1.active_size = Some(3 * MIB);
    seg1.requested_size = Some(3 * MIB);
    seg1.frames = Some(empty);
    seg1.blocks = vec![
        block(Some(base1), MIB, Some(MIB), Allocated, Some(hidden)),
        block(Some(base1 + MIB), MIB, Some(MIB), Allocated, Some(b)),
        block(
            Some(base1 + 2 * MIB),
            MIB,
            Some(MIB),
            Allocated,
            Some(empty),
        ),
        block(
            Some(base1 + 3 * MIB),
            19 * MIB,
            Some(0),
            Inactive,
            Some(empty),
        ),
    ];

    // A legacy (≤2.0) segment: no address on blocks, history instead of frames.
    let mut seg2 = Segment::new(1, 0x1000_0000, 2 * MIB, 0);
    seg2.allocated_size = Some(1536);
    seg2.active_size = None;
    seg2.requested_size = None;
    seg2.segment_type = None;
    seg2.segment_pool_id = None;
    seg2.is_expandable = None;
    let mut legacy = block(None, 1024, None, Allocated, None);
    let item = |real_size, frames| HistoryItem {
        addr: 0x1000_0000,
        real_size,
        frames,
        extra: Vec::new(),
        exact: Default::default(),
    };
    legacy.history = Some(vec![item(800, Some(a)), item(100, None)]);
    seg2.blocks = vec![
        legacy,
        block(None, 512, Some(500), Allocated, None),
        block(None, 2 * MIB - 1536, None, Inactive, None),
    ];
    s.segments = vec![seg0, seg1, seg2];

    let mut d0 = vec![
        entry(Action::SegmentAlloc, 0x5000, 2 * MIB, Some(1)),
        entry(Action::Alloc, 0x5200, 512, Some(2)),
        entry(Action::Alloc, BASE + 2048, 1000, Some(3)),
        entry(Action::Alloc, 0x99, 3 << 30, Some(4)),
        entry(Action::FreeRequested, 0x5200, 512, Some(5)),
        entry(Action::FreeCompleted, 0x5200, 512, Some(6)),
        entry(Action::FreeCompleted, 0x1234, 77, Some(7)),
        entry(Action::SegmentFree, 0x5000, 2 * MIB, Some(8)),
        entry(Action::SegmentFree, 0x6000, 2 * MIB, Some(9)),
        entry(Action::SegmentAlloc, 0x5000, 4 * MIB, Some(10)),
        entry(Action::Alloc, 0x5000 + 3 * MIB, 5, Some(11)),
    ];
    d0[0].frames = Some(b);
    let na = s.strings.intern("N/A");
    let blank = s.strings.intern("");
    let mut oom = entry(Action::Oom, 0, 5_308_694_528, Some(12));
    oom.compile_context = Some(na);
    oom.user_metadata = Some(blank);
    oom.rare_mut().device_free = Some(95_682_560);
    oom.rare_mut().no_addr = true;
    d0.push(oom);
    let mut annotate = entry(Action::Annotate, BASE + 2048, 0, Some(13));
    annotate.user_metadata = Some(s.strings.intern("tag {\"k\": 1}"));
    d0.push(annotate);
    let mut map = entry(Action::SegmentMap, 0x9000, 2 * MIB, Some(14));
    map.stream = 7;
    map.compile_context = Some(na);
    map.user_metadata = Some(s.strings.intern("it's"));
    map.frames = Some(b);
    d0.push(map);
    d0.push(entry(Action::Snapshot, 0, 123, Some(15)));
    let mut weird = TraceEntry::new(Action::Other(s.strings.intern("weird")), 1, 2, -3);
    let mut two_pow_64 = vec![0u8; 8];
    two_pow_64.push(1);
    weird.rare_mut().extra = vec![
        ("extra_f".into(), Value::Float(0.1)),
        ("extra_t".into(), Value::Tuple(vec![Value::Int(1)])),
        ("extra_n".into(), Value::None),
        ("extra_b".into(), Value::Bytes(b"a'\x00".to_vec())),
        ("extra_big".into(), Value::BigInt(two_pow_64)),
    ];
    d0.push(weird);
    d0.extend((0..30).map(|i| entry(Action::Alloc, 0x10_0000 + i * 512, 512, None)));

    let mut unmap = TraceEntry::new(Action::SegmentUnmap, 5, 6, 0);
    unmap.frames = Some(b);
    unmap.rare_mut().legacy_frames_first = true;
    unmap.rare_mut().extra = vec![(
        "cpp_frames".into(),
        Value::List(vec![Value::Str("c++ frame".into())]),
    )];
    s.device_traces = Some(vec![d0, Vec::new(), vec![unmap]]);
    s
}

/// Compares line by line first, so a failure shows the first differing line.
fn assert_text_eq(ours: &str, python: &str) {
    for (i, (o, p)) in ours.lines().zip(python.lines()).enumerate() {
        assert_eq!(o, p, "line {} differs", i + 1);
    }
    assert_eq!(ours, python);
}

#[test]
fn stats_matches_python() {
    let ours = stats::stats(&fixture()).expect("stats");
    assert_text_eq(&ours, include_str!("testdata/fixture.stats.txt"));
}

#[test]
fn trace_matches_python() {
    let ours = trace::trace(&fixture()).expect("trace");
    assert_text_eq(&ours, include_str!("testdata/fixture.trace.txt"));
}

#[test]
fn segments_and_memory_match_python() {
    let s = fixture();
    let segments = flame::collapsed(&s, true).expect("segments");
    assert_text_eq(&segments, include_str!("testdata/fixture.segments.txt"));
    let memory = flame::collapsed(&s, false).expect("memory");
    assert_text_eq(&memory, include_str!("testdata/fixture.memory.txt"));
}

#[test]
fn trace_of_a_bare_segment_list_fails_like_python() {
    let mut s = fixture();
    s.shape = memsnap_format::Shape::SegmentList;
    s.device_traces = None;
    let err = trace::trace(&s).expect_err("no device_traces");
    let text = err.to_string();
    assert!(text.contains("KeyError: 'device_traces'"), "{text}");
    assert!(text.contains("bare segment list"), "{text}");
}

#[test]
fn broken_segment_accounting_fails_like_python() {
    let mut s = fixture();
    s.segments[0].total_size += 512;
    let err = stats::stats(&s).expect_err("mismatch");
    assert!(err.to_string().contains("Segment size mismatch"), "{err}");
}
