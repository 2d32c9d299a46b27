//! Flame graph and pprof exports: the live set they show, checked against live bytes the tests
//! compute themselves from the trace (or the segments), never from the code under test.

use std::collections::{HashMap, HashSet};
use std::io::Read;

use memsnap_analysis::{AnalysisError, Instant, InstantParseError};
use memsnap_converters::pprof::{
    self, proto, ALLOC_OBJECTS, ALLOC_SPACE, INUSE_OBJECTS, INUSE_SPACE,
};
use memsnap_converters::profile::{By, LiveProfile, LiveSource, ProfileError, ProfileOptions};
use memsnap_converters::{flamegraph, open_path};
use memsnap_format::{Action, Block, BlockState, Frame, Segment, Snapshot, TraceEntry};
use prost::Message;

use super::common::real_snapshots;

// ---------------------------------------------------------------------------------------------
// Reading the outputs back.

/// A frame of the SVG: its `<title>` name and bytes, its row and its extent in bytes.
#[derive(Debug)]
struct SvgFrame {
    name: String,
    bytes: u64,
    y: i64,
    x: u64,
    width: u64,
}

/// Every `<g><title>…</title><rect …/>` of an inferno SVG.
fn svg_frames(svg: &str) -> Vec<SvgFrame> {
    let mut frames = Vec::new();
    for part in svg.split("<title>").skip(1) {
        let (title, rest) = part.split_once("</title>").expect("closed title");
        let title = title
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&");
        // `name (1,234 bytes, 12.34%)`
        let (name, count) = title.rsplit_once(" (").expect("title has a count");
        let digits = count.split(' ').next().expect("count");
        let bytes: u64 = digits
            .replace(',', "")
            .parse()
            .expect("en-US grouped digits");
        let attr = |key: &str| -> Option<String> {
            let rect = rest.split("/>").next()?;
            let start = rect.find(&format!(" {key}=\""))? + key.len() + 3;
            Some(rect[start..].split('"').next()?.to_string())
        };
        let parse = |key: &str| attr(key).and_then(|v| v.parse::<i64>().ok());
        frames.push(SvgFrame {
            name: name.to_string(),
            bytes,
            y: parse("y").unwrap_or(-1),
            x: parse("fg:x").unwrap_or(0) as u64,
            width: parse("fg:w").unwrap_or(0) as u64,
        });
    }
    frames
}

fn root_bytes(frames: &[SvgFrame]) -> u64 {
    frames
        .iter()
        .find(|f| f.name == "all")
        .expect("root frame")
        .bytes
}

/// Frames with no frame drawn on top of them (the next row up, inside their extent).
fn leaves(frames: &[SvgFrame]) -> Vec<&SvgFrame> {
    let row_step = {
        let mut ys: Vec<i64> = frames.iter().map(|f| f.y).collect();
        ys.sort_unstable();
        ys.dedup();
        ys.windows(2).map(|w| w[1] - w[0]).min().unwrap_or(16)
    };
    frames
        .iter()
        .filter(|f| f.name != "all")
        .filter(|f| {
            !frames
                .iter()
                .any(|c| c.y == f.y - row_step && c.x >= f.x && c.x + c.width <= f.x + f.width)
        })
        .collect()
}

/// Bytes of each frame not covered by frames on top of it, summed: the root's total when the
/// widths add up.
fn self_bytes_sum(frames: &[SvgFrame]) -> u64 {
    let row_step = 16;
    frames
        .iter()
        .filter(|f| f.name != "all")
        .map(|f| {
            let children: u64 = frames
                .iter()
                .filter(|c| c.y == f.y - row_step && c.x >= f.x && c.x + c.width <= f.x + f.width)
                .map(|c| c.bytes)
                .sum();
            f.bytes - children
        })
        .sum()
}

fn decode_pprof(gzipped: &[u8]) -> proto::Profile {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(gzipped)
        .read_to_end(&mut bytes)
        .expect("gzip");
    proto::Profile::decode(&bytes[..]).expect("profile.proto")
}

/// The rules of `profile.proto` a reader relies on.
fn check_pprof_rules(p: &proto::Profile) {
    assert_eq!(p.string_table.first().map(String::as_str), Some(""));
    let string = |i: i64| -> &str {
        usize::try_from(i)
            .ok()
            .and_then(|i| p.string_table.get(i))
            .expect("string index in the table")
    };
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (string(t.r#type), string(t.unit)))
        .collect();
    assert_eq!(
        types,
        [
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
            ("alloc_objects", "count"),
            ("alloc_space", "bytes")
        ]
    );
    assert_eq!(string(p.default_sample_type), "inuse_space");
    let period = p.period_type.as_ref().expect("period type");
    assert_eq!(
        (string(period.r#type), string(period.unit)),
        ("space", "bytes")
    );
    let function_ids: HashSet<u64> = p.function.iter().map(|f| f.id).collect();
    assert_eq!(function_ids.len(), p.function.len(), "function ids unique");
    assert!(!function_ids.contains(&0), "function ids non-zero");
    let location_ids: HashSet<u64> = p.location.iter().map(|l| l.id).collect();
    assert_eq!(location_ids.len(), p.location.len(), "location ids unique");
    assert!(!location_ids.contains(&0), "location ids non-zero");
    for f in &p.function {
        string(f.name);
        string(f.system_name);
        string(f.filename);
    }
    for l in &p.location {
        assert_eq!(l.mapping_id, 0);
        for line in &l.line {
            assert!(function_ids.contains(&line.function_id));
        }
    }
    for s in &p.sample {
        assert_eq!(s.value.len(), p.sample_type.len());
        assert!(!s.location_id.is_empty());
        for id in &s.location_id {
            assert!(location_ids.contains(id), "sample names location {id}");
        }
        for l in &s.label {
            string(l.key);
            string(l.str);
            string(l.num_unit);
        }
        assert!(s.value[INUSE_SPACE] <= s.value[ALLOC_SPACE]);
    }
}

fn sum(p: &proto::Profile, index: usize) -> i64 {
    p.sample.iter().map(|s| s.value[index]).sum()
}

/// The function name of a sample's leaf location.
fn leaf_name<'p>(p: &'p proto::Profile, sample: &proto::Sample) -> &'p str {
    let location = p
        .location
        .iter()
        .find(|l| l.id == sample.location_id[0])
        .expect("location");
    let function = p
        .function
        .iter()
        .find(|f| f.id == location.line[0].function_id)
        .expect("function");
    &p.string_table[function.name as usize]
}

fn export<'s>(
    snapshot: &'s Snapshot,
    options: &ProfileOptions,
) -> (LiveProfile<'s>, String, proto::Profile) {
    let live = LiveProfile::select(snapshot, options).expect("live set");
    let mut svg = Vec::new();
    flamegraph::render(&live, &mut svg).expect("svg");
    let profile = decode_pprof(&pprof::encode(&live).expect("pprof"));
    check_pprof_rules(&profile);
    (live, String::from_utf8(svg).expect("utf-8"), profile)
}

fn options(at: Instant, by: By, min_size: u64) -> ProfileOptions {
    let mut o = ProfileOptions::default();
    o.at = at;
    o.by = by;
    o.min_size = min_size;
    o
}

// ---------------------------------------------------------------------------------------------
// A hand-made trace whose live sets are known.

/// Device 0, times 100..=170 µs:
/// 0 alloc A 1000 B (forward) · 1 alloc B 3000 B (loss) · 2 alloc C 500 B (no frames) ·
/// 3 free_requested A · 4 free_completed A · 5 alloc D 7000 B (forward) ·
/// 6 free_requested B · 7 free_completed B.
/// Live (active): after 2: 4500; after 3: 4500 (A pending); after 5: 10500 (the peak);
/// after 7: 7500 (the end).
fn hand_made() -> Snapshot {
    let mut s = Snapshot::new(1);
    let main = Frame::new("main", "/home/me/train.py", 1);
    let step = Frame::new("train_step", "/home/me/train.py", 10);
    // Frames the viewer hides stay out of the graph.
    let eval = Frame::new("_PyEval_EvalFrameDefault", "Python/ceval.c", 4000);
    let forward = s.intern_stack(vec![
        Frame::new("forward", "/home/me/model.py", 42),
        eval.clone(),
        step.clone(),
        main.clone(),
    ]);
    let loss = s.intern_stack(vec![
        Frame::new("loss", "/home/me/model.py", 50),
        step,
        main,
    ]);
    let events = [
        (Action::Alloc, 0x1000, 1000, Some(forward)),
        (Action::Alloc, 0x2000, 3000, Some(loss)),
        (Action::Alloc, 0x3000, 500, None),
        (Action::FreeRequested, 0x1000, 1000, None),
        (Action::FreeCompleted, 0x1000, 1000, None),
        (Action::Alloc, 0x4000, 7000, Some(forward)),
        (Action::FreeRequested, 0x2000, 3000, None),
        (Action::FreeCompleted, 0x2000, 3000, None),
    ];
    let trace = &mut s.device_traces.as_mut().expect("traces")[0];
    for (i, (action, addr, size, frames)) in events.into_iter().enumerate() {
        let mut e = TraceEntry::new(action, addr, size, 0);
        e.frames = frames;
        e.set_time_us(Some(100 + 10 * i as i64));
        trace.push(e);
    }
    s
}

#[test]
fn the_peak_flame_graph_adds_up_to_the_live_bytes() {
    let s = hand_made();
    let (live, svg, _) = export(&s, &options(Instant::Peak, By::Stack, 0));
    assert_eq!(
        (live.device, live.event, live.time_us),
        (Some(0), 5, Some(150))
    );
    assert_eq!(live.source, LiveSource::Trace);
    let frames = svg_frames(&svg);
    assert_eq!(root_bytes(&frames), 10_500);
    // No stack is a prefix of another here, so the leaves alone add up to the root.
    let leaves = leaves(&frames);
    let mut named: Vec<(&str, u64)> = leaves.iter().map(|f| (f.name.as_str(), f.bytes)).collect();
    named.sort_unstable();
    assert_eq!(
        named,
        [
            ("<no frames>", 500),
            ("model.py:42:forward", 7000),
            ("model.py:50:loss", 3000)
        ]
    );
    assert_eq!(leaves.iter().map(|f| f.bytes).sum::<u64>(), 10_500);
    assert!(svg.contains("train.py:1:main"), "outermost frame drawn");
    assert!(
        !svg.contains("EvalFrame"),
        "the viewer's hidden frames stay hidden"
    );
    assert!(
        svg.contains("Live memory at the peak (trace entry 5, t+50 µs): 10.3 KiB in 3 blocks"),
        "{}",
        &svg[..2000]
    );
}

#[test]
fn folded_lines_are_root_first_and_by_site_keeps_only_the_site() {
    let s = hand_made();
    let live = LiveProfile::select(&s, &options(Instant::Peak, By::Stack, 0)).expect("live");
    assert_eq!(
        flamegraph::folded_lines(&live),
        [
            "<no frames> 500",
            "train.py:1:main;train.py:10:train_step;model.py:42:forward 7000",
            "train.py:1:main;train.py:10:train_step;model.py:50:loss 3000",
        ]
    );
    let (_, svg, profile) = export(&s, &options(Instant::Peak, By::Site, 0));
    let frames = svg_frames(&svg);
    let depth_one: Vec<&SvgFrame> = frames.iter().filter(|f| f.name != "all").collect();
    assert_eq!(depth_one.len(), 3, "one level under the root");
    assert_eq!(depth_one.iter().map(|f| f.bytes).sum::<u64>(), 10_500);
    assert!(profile.sample.iter().all(|s| s.location_id.len() == 1));
}

#[test]
fn instants_pick_the_entry_the_user_named() {
    let s = hand_made();
    let bytes_at = |at: Instant, min_size: u64| {
        let (live, svg, profile) = export(&s, &options(at, By::Stack, min_size));
        let from_svg = root_bytes(&svg_frames(&svg));
        assert_eq!(from_svg, live.bytes);
        assert_eq!(sum(&profile, INUSE_SPACE) as u64, live.bytes);
        (live.event, live.bytes)
    };
    assert_eq!(bytes_at(Instant::End, 0), (7, 7500));
    assert_eq!(bytes_at(Instant::Event(2), 0), (2, 4500));
    // A's free is requested but not completed: its block is still active.
    assert_eq!(bytes_at(Instant::Event(3), 0), (3, 4500));
    assert_eq!(bytes_at(Instant::Event(4), 0), (4, 3500));
    assert_eq!(bytes_at(Instant::TimeUs(135), 0), (3, 4500));
    assert_eq!(bytes_at(Instant::AfterStartUs(50), 0), (5, 10_500));
    assert_eq!(bytes_at(Instant::TimeUs(1_000_000), 0), (7, 7500));
    // --min-size drops the 500 and 3000 byte blocks.
    assert_eq!(bytes_at(Instant::Peak, 3001), (5, 7000));
}

#[test]
fn min_size_leaves_small_blocks_out_and_says_so() {
    let s = hand_made();
    let (live, svg, profile) = export(&s, &options(Instant::Peak, By::Stack, 1000));
    assert_eq!(
        (live.bytes, live.smaller_bytes, live.smaller_count),
        (10_000, 500, 1)
    );
    assert!(!svg.contains("&lt;no frames&gt;"));
    assert!(
        svg.contains("500 B in 1 smaller ones left out"),
        "subtitle says what is left out"
    );
    // alloc_* also leaves the small block out: A, B and D.
    assert_eq!(sum(&profile, ALLOC_SPACE), 11_000);
}

#[test]
fn pprof_holds_the_live_set_and_every_allocation_of_the_window() {
    let s = hand_made();
    let (_, _, p) = export(&s, &options(Instant::Peak, By::Stack, 0));
    assert_eq!(sum(&p, INUSE_SPACE), 10_500);
    assert_eq!(sum(&p, INUSE_OBJECTS), 3);
    assert_eq!(sum(&p, ALLOC_SPACE), 1000 + 3000 + 500 + 7000);
    assert_eq!(sum(&p, ALLOC_OBJECTS), 4);
    assert_eq!(p.time_nanos, 150_000);
    assert_eq!(p.duration_nanos, 70_000);
    assert_eq!(p.period, 1);
    // The biggest in-use sample first; its leaf is `forward` (leaf-first locations), 7000 B
    // live of 8000 B allocated (A and D differ in size, so two samples).
    let top = &p.sample[0];
    assert_eq!(leaf_name(&p, top), "forward");
    assert_eq!(
        (top.value[INUSE_SPACE], top.value[ALLOC_SPACE]),
        (7000, 7000)
    );
    assert_eq!(
        top.location_id.len(),
        3,
        "forward, train_step, main; ceval hidden"
    );
    let labels: HashMap<&str, (i64, &str)> = top
        .label
        .iter()
        .map(|l| {
            (
                p.string_table[l.key as usize].as_str(),
                (l.num, p.string_table[l.str as usize].as_str()),
            )
        })
        .collect();
    assert_eq!(labels["bytes"], (7000, ""));
    assert_eq!(labels["device"], (0, "0"));
    assert_eq!(labels["stream"], (0, "0"));
    assert!(labels.contains_key("category"));
    // One function per name and file, one location per function and line.
    let names: Vec<&str> = p
        .function
        .iter()
        .map(|f| p.string_table[f.name as usize].as_str())
        .collect();
    assert_eq!(names.iter().filter(|n| **n == "forward").count(), 1);
    assert_eq!(p.location.len(), p.function.len());
}

#[test]
fn bad_instants_are_refused_with_the_reason() {
    let s = hand_made();
    let err = |at: Instant| {
        LiveProfile::select(&s, &options(at, By::Stack, 0))
            .expect_err("refused")
            .to_string()
    };
    assert_eq!(
        err(Instant::Event(8)),
        "trace entry 8 is past the end of device 0's trace (8 entries)"
    );
    assert_eq!(
        err(Instant::TimeUs(99)),
        "time_us 99 is before device 0's first trace entry (time_us 100)"
    );
    let mut no_times = hand_made();
    for e in &mut no_times.device_traces.as_mut().expect("traces")[0] {
        e.set_time_us(None);
    }
    let e = LiveProfile::select(&no_times, &options(Instant::TimeUs(120), By::Stack, 0))
        .expect_err("no times");
    assert!(
        matches!(
            e,
            ProfileError::Analysis(AnalysisError::NoTimes { device: 0 })
        ),
        "{e}"
    );
    let mut on_device_3 = options(Instant::Peak, By::Stack, 0);
    on_device_3.device = Some(3);
    let e = LiveProfile::select(&s, &on_device_3).expect_err("no device 3");
    assert!(
        e.to_string().contains("device 3 is not in the snapshot"),
        "{e}"
    );
}

#[test]
fn instants_parse_from_the_command_line_forms() {
    let parse = |t: &str| t.parse::<Instant>();
    assert_eq!(parse("peak"), Ok(Instant::Peak));
    assert_eq!(parse("END"), Ok(Instant::End));
    assert_eq!(parse("#1234"), Ok(Instant::Event(1234)));
    assert_eq!(parse("event:12"), Ok(Instant::Event(12)));
    // A bare number was a time_us here and an event in `memsnap top`: now it says which to
    // write.
    assert_eq!(
        parse("1700000000123456"),
        Err(InstantParseError::BareNumber {
            text: "1700000000123456".into()
        })
    );
    assert_eq!(
        parse("1700000000123456us"),
        Ok(Instant::TimeUs(1_700_000_000_123_456))
    );
    assert_eq!(parse("+2.5s"), Ok(Instant::AfterStartUs(2_500_000)));
    assert_eq!(parse("+150ms"), Ok(Instant::AfterStartUs(150_000)));
    for bad in ["", "#", "#-1", "+3", "later", "+-1s", "event:x"] {
        assert!(parse(bad).is_err(), "{bad:?} parses");
    }
}

#[test]
fn frame_names_cannot_break_the_folded_format() {
    let mut s = Snapshot::new(1);
    let stack = s.intern_stack(vec![
        Frame::new("f<int; 2>\nnext", "kernel.cu", 7),
        Frame::new("outer <&>", "", 0),
    ]);
    let mut e = TraceEntry::new(Action::Alloc, 0x1000, 4096, 0);
    e.frames = Some(stack);
    s.device_traces.as_mut().expect("traces")[0].push(e);
    let live = LiveProfile::select(&s, &ProfileOptions::default()).expect("live");
    assert_eq!(
        flamegraph::folded_lines(&live),
        ["outer <&>;kernel.cu:7:f<int, 2> next 4096"]
    );
    let (_, svg, _) = export(&s, &ProfileOptions::default());
    let frames = svg_frames(&svg);
    assert!(frames
        .iter()
        .any(|f| f.name == "outer <&>" && f.bytes == 4096));
}

#[test]
fn sizes_no_device_holds_are_refused_not_wrapped() {
    let mut s = Snapshot::new(1);
    let trace = &mut s.device_traces.as_mut().expect("traces")[0];
    trace.push(TraceEntry::new(Action::Alloc, 0x1000, 1 << 63, 0));
    trace.push(TraceEntry::new(Action::Alloc, 0x2000, 1 << 63, 0));
    let live = LiveProfile::select(&s, &ProfileOptions::default()).expect("live");
    let err = flamegraph::render(&live, &mut Vec::new()).expect_err("refused");
    assert!(matches!(err, ProfileError::Implausible { .. }), "{err}");
    // pprof values saturate instead.
    let p = decode_pprof(&pprof::encode(&live).expect("pprof"));
    assert_eq!(sum(&p, INUSE_OBJECTS), 2);
}

// ---------------------------------------------------------------------------------------------
// Snapshots without a trace, and without anything.

#[test]
fn a_snapshot_without_a_trace_shows_its_segments_active_blocks() {
    let mut s = Snapshot {
        device_traces: None,
        ..Snapshot::default()
    };
    let weights = s.intern_stack(vec![Frame::new("load", "/home/me/model.py", 7)]);
    let mut segment = Segment::new(1, 0x10_0000, 1 << 20, 0);
    let mut with_frames = Block::new(0x10_0000, 4096, BlockState::ActiveAllocated);
    with_frames.requested_size = Some(4000);
    with_frames.frames = Some(weights);
    segment.blocks = vec![
        with_frames,
        Block::new(0x10_1000, 8192, BlockState::ActiveAllocated),
        Block::new(0x10_3000, 512, BlockState::Inactive),
        Block::new(0x10_3200, (1 << 20) - 0x3200, BlockState::Inactive),
    ];
    s.segments.push(segment);
    // Requested bytes of the active_allocated blocks: 4000 + 8192.
    let (live, svg, p) = export(&s, &ProfileOptions::default());
    assert_eq!(live.source, LiveSource::SegmentsOnly);
    assert_eq!(live.device, Some(1));
    let frames = svg_frames(&svg);
    assert_eq!(root_bytes(&frames), 12_192);
    assert!(frames
        .iter()
        .any(|f| f.name == "model.py:7:load" && f.bytes == 4000));
    assert!(frames
        .iter()
        .any(|f| f.name == "<no frames>" && f.bytes == 8192));
    assert!(
        svg.contains("no trace"),
        "the title says where the live set comes from"
    );
    assert_eq!(sum(&p, INUSE_SPACE), 12_192);
    assert_eq!(sum(&p, ALLOC_SPACE), 12_192);
    assert_eq!(p.time_nanos, 0);
    let err = LiveProfile::select(&s, &options(Instant::Event(1), By::Stack, 0))
        .expect_err("no entry 1")
        .to_string();
    assert!(
        err.contains("past the end of device 1's trace (0 entries)"),
        "{err}"
    );
}

#[test]
fn an_empty_snapshot_exports_an_empty_profile() {
    let s = Snapshot::new(4);
    let (live, svg, p) = export(&s, &ProfileOptions::default());
    assert_eq!(
        (live.source, live.device, live.bytes),
        (LiveSource::Empty, None, 0)
    );
    assert!(svg.starts_with("<?xml"));
    assert!(svg.contains("no trace entries and no segments"));
    assert_eq!(root_bytes(&svg_frames(&svg)), 0);
    assert!(p.sample.is_empty());
}

// ---------------------------------------------------------------------------------------------
// A generated training run through the real allocator.

/// Active bytes after each entry, computed from the trace alone (alloc adds, free_completed
/// or free removes), and the first entry where they peak.
fn replay_by_hand(trace: &[TraceEntry]) -> (Vec<u64>, usize) {
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut after = Vec::with_capacity(trace.len());
    let mut bytes = 0u64;
    for e in trace {
        match e.action {
            Action::Alloc => {
                bytes += e.size;
                assert!(live.insert(e.addr, e.size).is_none());
            }
            Action::FreeCompleted | Action::Free => {
                bytes -= live.remove(&e.addr).expect("freed block was allocated");
            }
            _ => {}
        }
        after.push(bytes);
    }
    let peak = after.iter().copied().max().unwrap_or(0);
    let at = after.iter().position(|&b| b == peak).unwrap_or(0);
    (after, at)
}

#[test]
fn a_generated_run_exports_its_live_bytes_at_the_peak_and_between() {
    let run = memsnap_workload::TrainingRun {
        steps: 2,
        devices: 2,
        seed: 7,
        ..Default::default()
    };
    let (s, _) = memsnap_workload::generate(&run);
    // Device 1's trace, checked with --device; device choice by peak checked too.
    let trace = &s.traces()[1];
    let (after, peak) = replay_by_hand(trace);
    let mut on_device_1 = options(Instant::Peak, By::Stack, 0);
    on_device_1.device = Some(1);
    let (live, svg, p) = export(&s, &on_device_1);
    assert_eq!(live.event as usize, peak);
    let frames = svg_frames(&svg);
    assert_eq!(root_bytes(&frames), after[peak]);
    assert_eq!(
        self_bytes_sum(&frames),
        after[peak],
        "widths add up to the live bytes"
    );
    assert_eq!(sum(&p, INUSE_SPACE) as u64, after[peak]);
    let allocated: u64 = trace
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .map(|e| e.size)
        .sum();
    assert_eq!(sum(&p, ALLOC_SPACE) as u64, allocated);
    // The whole stack, as the viewer shows it: the allocator's frames on top.
    assert!(frames
        .iter()
        .any(|f| f.name.contains("CUDACachingAllocator")));
    for at in [trace.len() / 3, trace.len() - 1] {
        let mut o = options(Instant::Event(at as u32), By::Site, 0);
        o.device = Some(1);
        let (_, svg, p) = export(&s, &o);
        let frames = svg_frames(&svg);
        assert_eq!(root_bytes(&frames), after[at]);
        assert_eq!(sum(&p, INUSE_SPACE) as u64, after[at]);
        // Sites are the user's code, not the allocator's.
        assert!(frames.iter().all(|f| !f.name.contains("CachingAllocator")));
        assert!(
            frames.iter().any(|f| f.name.contains("model.py")),
            "{frames:?}"
        );
    }
    let (_, peak_0) = replay_by_hand(&s.traces()[0]);
    let peaks = [replay_by_hand(&s.traces()[0]).0[peak_0], after[peak]];
    let chosen = LiveProfile::select(&s, &ProfileOptions::default()).expect("live");
    let expected = if peaks[1] > peaks[0] { 1 } else { 0 };
    assert_eq!(chosen.device, Some(expected));
}

// ---------------------------------------------------------------------------------------------
// Every real snapshot.

#[test]
fn every_real_snapshot_exports_to_both_formats() {
    for file in real_snapshots() {
        let (s, _) = open_path(&file).expect("real file opens");
        // The peak by stack on the device with the highest peak, then the end by site on it.
        let mut o = options(Instant::Peak, By::Stack, 0);
        for step in 0..2 {
            let live =
                LiveProfile::select(&s, &o).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let mut svg = Vec::new();
            flamegraph::render(&live, &mut svg)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let svg = String::from_utf8(svg).expect("utf-8");
            let p = decode_pprof(&pprof::encode(&live).expect("pprof"));
            check_pprof_rules(&p);
            let frames = svg_frames(&svg);
            assert_eq!(root_bytes(&frames), live.bytes, "{}", file.display());
            assert_eq!(
                sum(&p, INUSE_SPACE) as u64,
                live.bytes,
                "{}",
                file.display()
            );
            if step == 0 {
                o = options(Instant::End, By::Site, 0);
                o.device = live.device;
            }
        }
    }
}
