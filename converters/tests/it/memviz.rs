//! `memviz`: PyTorch's `_memory_viz.py` text reports.
//!
//! The snapshot of `memviz/testdata/fixture.py`, built in code, must print what torch 2.15's
//! `_memory_viz.py` printed for it (`memviz/testdata/fixture.*.txt`). It covers what the real
//! files do not: legacy history blocks, names past `z`, a segment range reused, frees of
//! unknown addresses, `oom`, `annotate`, dict reprs of odd values, legacy key order, hidden
//! frames. The real snapshots are compared with Python's outputs of them (golden files).

use std::io::Read;
use std::path::Path;

use memsnap_converters::memviz::{self, Check, MemvizError, Report};
use memsnap_converters::ConvertError;
use memsnap_format::{
    Action, Block, BlockState, Frame, HistoryItem, Segment, Snapshot, StackId, TraceEntry, Value,
};

use super::common::{real_snapshots_dir, snapshot_files};

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
    e.set_time_us(time_us);
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
    oom.set_compile_context(Some(na), &s.strings);
    oom.set_user_metadata(Some(blank), &s.strings);
    oom.rare_mut().device_free = Some(95_682_560);
    oom.rare_mut().no_addr = true;
    d0.push(oom);
    let mut annotate = entry(Action::Annotate, BASE + 2048, 0, Some(13));
    let tag = s.strings.intern("tag {\"k\": 1}");
    annotate.set_user_metadata(Some(tag), &s.strings);
    d0.push(annotate);
    let mut map = entry(Action::SegmentMap, 0x9000, 2 * MIB, Some(14));
    map.stream = 7;
    map.set_compile_context(Some(na), &s.strings);
    let its = s.strings.intern("it's");
    map.set_user_metadata(Some(its), &s.strings);
    map.frames = Some(b);
    d0.push(map);
    d0.push(entry(Action::Snapshot, 0, 123, Some(15)));
    let mut weird = TraceEntry::new(Action::Other, 1, 2, -3);
    weird.set_other_action(s.strings.intern("weird"));
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
fn fixture_reports_match_python() {
    let s = fixture();
    for (report, python) in [
        (
            Report::Stats,
            include_str!("memviz/testdata/fixture.stats.txt"),
        ),
        (
            Report::Trace,
            include_str!("memviz/testdata/fixture.trace.txt"),
        ),
        (
            Report::Segments,
            include_str!("memviz/testdata/fixture.segments.txt"),
        ),
        (
            Report::Memory,
            include_str!("memviz/testdata/fixture.memory.txt"),
        ),
    ] {
        let ours = memviz::render(report, &s).unwrap_or_else(|e| panic!("{report:?}: {e}"));
        assert_text_eq(&ours, python);
    }
}

#[test]
fn trace_of_a_bare_segment_list_fails_like_python() {
    let mut s = fixture();
    s.shape = memsnap_format::Shape::SegmentList;
    s.device_traces = None;
    let err = memviz::render(Report::Trace, &s).expect_err("no device_traces");
    assert!(matches!(err, MemvizError::LikePython { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("KeyError: 'device_traces'"), "{text}");
    assert!(text.contains("bare segment list"), "{text}");
}

#[test]
fn broken_segment_accounting_fails_like_python() {
    let mut s = fixture();
    s.segments[0].total_size += 512;
    let err = memviz::render(Report::Stats, &s).expect_err("mismatch");
    assert!(err.to_string().contains("Segment size mismatch"), "{err}");
}

/// The reports that read only the segments print the same from the fixture's pickle whether
/// the trace is read or not; a validated read refuses what `memsnap validate` refuses.
#[test]
fn reading_only_the_segments_prints_the_same_as_reading_everything() {
    let bytes = memsnap_format::pickle::to_vec(&fixture());
    let whole =
        memviz::read(Report::Trace, &bytes, Check::Needed, &mut |_, _| true).expect("whole file");
    assert!(whole.device_traces.is_some());
    for report in [Report::Stats, Report::Segments, Report::Memory] {
        let part = memviz::read(report, &bytes, Check::Needed, &mut |_, _| true).expect("part");
        assert!(part.device_traces.is_none(), "{report:?} read the trace");
        assert_eq!(
            memviz::render(report, &part).expect("part"),
            memviz::render(report, &whole).expect("whole")
        );
    }
    let mut broken = fixture();
    broken.segments[1].blocks[0].size += 1;
    let bytes = memsnap_format::pickle::to_vec(&broken);
    match memviz::read(Report::Stats, &bytes, Check::Full, &mut |_, _| true) {
        Err(ConvertError::Invalid { problems }) => {
            assert!(
                problems.iter().any(|p| p.contains("segments[1]")),
                "{problems:?}"
            )
        }
        other => panic!("expected a validation error, got {other:?}"),
    }
    assert!(memviz::read(Report::Stats, &bytes, Check::Needed, &mut |_, _| true).is_ok());
}

/// A file cut anywhere after its segments still prints `stats` when only the segments are
/// read, and fails with a byte offset when the whole file is validated.
#[test]
fn damage_after_the_segments_is_found_only_when_validating() {
    let bytes = memsnap_format::pickle::to_vec(&fixture());
    let cut = &bytes[..bytes.len() - 40];
    let text = memviz::render(
        Report::Stats,
        &memviz::read(Report::Stats, cut, Check::Needed, &mut |_, _| true).expect("segments"),
    )
    .expect("stats");
    assert!(text.starts_with("Summary of segments"));
    let err = memviz::read(Report::Stats, cut, Check::Full, &mut |_, _| true)
        .expect_err("truncated")
        .to_string();
    assert!(err.contains("at byte"), "{err}");
}

/// Python's output of `report` for a real file, from the gzipped golden files.
fn golden(dir: &Path, stem: &str, report: Report) -> Option<Vec<u8>> {
    let name = match report {
        Report::Stats => format!("{stem}.stats.txt.gz"),
        Report::Trace => format!("{stem}.trace.txt.gz"),
        Report::Segments => format!("{stem}.segments.collapsed.txt.gz"),
        Report::Memory => format!("{stem}.memory.collapsed.txt.gz"),
        _ => return None,
    };
    let file = std::fs::File::open(dir.join("golden_memory_viz_torch2.15.0").join(name)).ok()?;
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(file)
        .read_to_end(&mut text)
        .expect("golden file inflates");
    Some(text)
}

/// Every real file, each report, through the library: the segments-only read and the full
/// validated read give Python's bytes (the CLI test checks exit codes and the `trace` failure).
#[test]
fn every_real_file_renders_as_python_from_the_part_it_needs() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let mut compared = 0;
    let files = snapshot_files(&dir);
    for file in &files {
        let bytes = std::fs::read(file).expect("real file");
        let stem = file.file_stem().and_then(|s| s.to_str()).expect("name");
        for report in [
            Report::Stats,
            Report::Segments,
            Report::Memory,
            Report::Trace,
        ] {
            let want = golden(&dir, stem, report).expect("golden file");
            for check in [Check::Needed, Check::Full] {
                let read = memviz::read(report, &bytes, check, &mut |_, _| true);
                let snapshot = read.unwrap_or_else(|e| panic!("{stem} {report:?}: {e}"));
                match memviz::render(report, &snapshot) {
                    Ok(text) => assert!(
                        text.as_bytes() == want.as_slice(),
                        "{stem} {report:?} {check:?} differs from Python"
                    ),
                    // Python fails on `trace` of the bare segment list (file 06) too.
                    Err(MemvizError::LikePython { .. }) if report == Report::Trace => {
                        assert!(want.is_empty(), "{stem}: Python printed a trace")
                    }
                    Err(e) => panic!("{stem} {report:?}: {e}"),
                }
                compared += 1;
            }
        }
    }
    assert_eq!(compared, files.len() * 8);
    assert_eq!(files.len(), 15, "the real snapshots folder holds 15 files");
}
