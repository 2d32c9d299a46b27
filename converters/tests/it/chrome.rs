//! Chrome trace export, merge, and the imports (memsnap's own export, torch.profiler,
//! export_memory_timeline), checked against values computed here from the inputs.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use memsnap_analysis::DeviceTimeline;
use memsnap_converters::chrome::{self, ChromeOptions};
use memsnap_converters::{open_path, ConvertError, Source};
use memsnap_format::{Action, Snapshot, StackId, TraceEntry};
use memsnap_workload::{generate, TrainingRun};
use serde_json::Value;

use super::common::{real_snapshots_dir, snapshot_files, write_file};

fn export(snapshot: &Snapshot, options: &ChromeOptions) -> Vec<u8> {
    let mut out = Vec::new();
    chrome::write_trace(snapshot, options, &mut out).expect("export");
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip")
}

/// An entry with its frames resolved to text (stack ids differ between snapshots).
type Resolved = (String, Option<u64>, u64, i64, Option<i64>, String);

fn resolved(snapshot: &Snapshot) -> Vec<Vec<Resolved>> {
    // One text per distinct stack: real stacks are a hundred frames deep.
    let mut texts: BTreeMap<StackId, String> = BTreeMap::new();
    snapshot
        .traces()
        .iter()
        .map(|trace| {
            trace
                .iter()
                .map(|e: &TraceEntry| {
                    let frames = e
                        .frames
                        .map(|s| {
                            texts
                                .entry(s)
                                .or_insert_with(|| {
                                    snapshot
                                        .stack_frames(s)
                                        .map(|f| format!("{}:{}:{}\n", f.filename, f.line, f.name))
                                        .collect()
                                })
                                .clone()
                        })
                        .unwrap_or_default();
                    (
                        e.action_name(&snapshot.strings).to_string(),
                        e.has_addr().then_some(e.addr),
                        e.size,
                        e.stream,
                        e.time_us(),
                        frames,
                    )
                })
                .collect()
        })
        .collect()
}

fn events(json: &Value) -> &Vec<Value> {
    json["traceEvents"].as_array().expect("traceEvents array")
}

/// Checks what any viewer needs: every `b` has its `e` on the same lane, and the slices of a
/// lane never overlap (Perfetto drops mis-nested async slices).
fn assert_lanes_do_not_overlap(json: &Value) {
    let mut lanes: BTreeMap<(i64, String, String), Vec<(i64, i64)>> = BTreeMap::new();
    let mut open: BTreeMap<(i64, String, String), Vec<i64>> = BTreeMap::new();
    for e in events(json) {
        let ph = e["ph"].as_str().unwrap_or("");
        if ph != "b" && ph != "e" {
            continue;
        }
        let key = (
            e["pid"].as_i64().unwrap(),
            e["cat"].as_str().unwrap().to_string(),
            // Process-scoped ids, hex strings as the Trace Event Format writes them.
            e["id2"]["local"].as_str().unwrap().to_string(),
        );
        let ts = e["ts"].as_i64().unwrap();
        if ph == "b" {
            open.entry(key).or_default().push(ts);
        } else {
            let start = open
                .get_mut(&key)
                .and_then(Vec::pop)
                .expect("e after its b");
            assert!(ts >= start);
            lanes.entry(key).or_default().push((start, ts));
        }
    }
    assert!(open.values().all(Vec::is_empty), "every b has its e");
    for (key, mut slices) in lanes {
        slices.sort();
        for w in slices.windows(2) {
            assert!(
                w[0].1 < w[1].0,
                "lane {key:?}: {:?} overlaps {:?}",
                w[0],
                w[1]
            );
        }
    }
}

/// The last value of each counter per pid.
fn last_counters(json: &Value) -> BTreeMap<(i64, String), (i64, u64)> {
    let mut last: BTreeMap<(i64, String), (i64, u64)> = BTreeMap::new();
    for e in events(json).iter().filter(|e| e["ph"] == "C") {
        let key = (
            e["pid"].as_i64().unwrap(),
            e["name"].as_str().unwrap().to_string(),
        );
        let ts = e["ts"].as_i64().unwrap();
        let bytes = e["args"]["bytes"].as_u64().unwrap();
        let slot = last.entry(key).or_insert((ts, bytes));
        if ts >= slot.0 {
            *slot = (ts, bytes);
        }
    }
    last
}

#[test]
fn a_generated_run_round_trips_through_the_chrome_export() {
    let run = TrainingRun {
        devices: 2,
        steps: 3,
        ..TrainingRun::default()
    };
    let (snapshot, _) = generate(&run);
    let bytes = export(&snapshot, &ChromeOptions::default().with_rank(Some(3)));
    let json: Value = serde_json::from_slice(&bytes).expect("valid JSON");
    assert_lanes_do_not_overlap(&json);

    // Rows: one process per device, named, with the spec's pid.
    for device in 0..2i64 {
        let pid = 1_000_000_000 + 3 * 1000 + device;
        let name = events(&json)
            .iter()
            .find(|e| e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == pid)
            .expect("process_name");
        assert_eq!(
            name["args"]["name"],
            format!("memsnap GPU {device} (rank 3)")
        );
        // The allocated counter ends at the bytes alloc'ed and not free_requested, summed here.
        let trace = &snapshot.traces()[device as usize];
        let mut live: BTreeMap<u64, u64> = BTreeMap::new();
        for e in trace {
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr, e.size);
                }
                Action::FreeRequested => {
                    live.remove(&e.addr);
                }
                _ => {}
            }
        }
        let counters = last_counters(&json);
        assert_eq!(
            counters[&(pid, "allocated".to_string())].1,
            live.values().sum::<u64>()
        );
        assert!(counters.contains_key(&(pid, "active".to_string())));
        assert!(counters.contains_key(&(pid, "reserved".to_string())));
        // Phases: the workload's steps have forward, backward and optimizer.
        let phases: Vec<&str> = events(&json)
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == pid)
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        for kind in ["forward", "backward", "optimizer"] {
            assert_eq!(
                phases.iter().filter(|p| **p == kind).count(),
                3,
                "{kind} once per step: {phases:?}"
            );
        }
        // One allocation slice per alloc in the trace.
        let allocs = trace.iter().filter(|e| e.action == Action::Alloc).count();
        let slices = events(&json)
            .iter()
            .filter(|e| e["ph"] == "b" && e["cat"] == "memsnap.alloc" && e["pid"] == pid)
            .count();
        assert_eq!(slices, allocs);
    }
    assert_eq!(
        json["otherData"]["memsnap"]["ranks"],
        serde_json::json!([3])
    );

    // The import gives back every entry exactly.
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "run.trace.json", &bytes);
    let (back, source) = open_path(&path).expect("import");
    assert!(matches!(source, Source::MemsnapChrome(_)), "{source:?}");
    assert_eq!(resolved(&back), resolved(&snapshot));
    assert_eq!(
        back.external_annotations.as_ref().map(Vec::len),
        snapshot.external_annotations.as_ref().map(Vec::len)
    );
}

#[test]
fn a_gzipped_export_opens_and_a_bounded_history_round_trips() {
    // A ring buffer: frees of blocks allocated before the window.
    let run = TrainingRun {
        steps: 4,
        max_entries: Some(300),
        ..TrainingRun::default()
    };
    let (snapshot, _) = generate(&run);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.trace.json.gz");
    let summary = chrome::export_path(&snapshot, &ChromeOptions::default(), &path).expect("export");
    assert_eq!(summary.devices.len(), 1);
    assert_eq!(&std::fs::read(&path).unwrap()[..2], &[0x1f, 0x8b]);
    let (back, source) = open_path(&path).expect("import");
    assert_eq!(
        source,
        Source::MemsnapChrome(memsnap_format::Compression::Gzip)
    );
    assert_eq!(resolved(&back), resolved(&snapshot));
}

#[test]
fn a_trace_without_times_uses_the_entry_index_and_round_trips() {
    let run = TrainingRun {
        steps: 2,
        with_time: false,
        with_annotations: false,
        ..TrainingRun::default()
    };
    let (snapshot, _) = generate(&run);
    let bytes = export(&snapshot, &ChromeOptions::default());
    let json: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(json["otherData"]["memsnap"]["devices"][0]["timed"], false);
    let max_ts = events(&json)
        .iter()
        .filter_map(|e| e["ts"].as_i64())
        .max()
        .unwrap();
    assert_eq!(max_ts as usize, snapshot.traces()[0].len() - 1);
    let dir = tempfile::tempdir().unwrap();
    let (back, _) = open_path(&write_file(dir.path(), "t.json", &bytes)).unwrap();
    assert_eq!(resolved(&back), resolved(&snapshot));
}

const BASE_NS: i64 = 1_700_000_000_000_000_000;

/// A torch.profiler trace as Kineto writes it (PyTorch ≥ 2.4 with `base`, else epoch µs `ts`):
/// enclosing Python and op slices on the thread, GPU `[memory]` events (a 2 MiB block with
/// 1024 bytes live before the profile, a free of a block from before the profile, an OOM),
/// a CPU event to skip and a HIP device 1 event.
fn torch_trace(with_base: bool) -> String {
    let ts = |us: i64| -> String {
        if with_base {
            format!("{}.000", us)
        } else {
            (BASE_NS / 1000 + us).to_string()
        }
    };
    let mem = |t: i64, addr: i64, bytes: i64, total: i64, dev_type: i64, dev: i64, idx: i64| {
        format!(
            r#"{{"ph":"i","cat":"cpu_instant_event","s":"t","name":"[memory]","pid":4242,"tid":4242,"ts":{},
            "args":{{"Total Reserved":20971520,"Total Allocated":{total},"Bytes":{bytes},"Addr":{addr},
            "Device Id":{dev},"Device Type":{dev_type},"Ev Idx":{idx}}}}}"#,
            ts(t)
        )
    };
    let x = |cat: &str, name: &str, t: i64, dur: i64| {
        format!(
            r#"{{"ph":"X","cat":"{cat}","name":"{name}","pid":4242,"tid":4242,"ts":{},"dur":{dur}}}"#,
            ts(t)
        )
    };
    let events = [
        x("python_function", "train.py(10): step", 100, 1000),
        x("python_function", "model.py(42): forward", 150, 300),
        x("cpu_op", "aten::empty", 200, 10),
        // Not enclosing (another thread's op).
        r#"{"ph":"X","cat":"cpu_op","name":"aten::other","pid":4242,"tid":7,"ts":"0","dur":100000}"#
            .replace("\"0\"", &ts(0)),
        mem(205, 139888158572544, 2097152, 2097152 + 1024, 1, 0, 1),
        mem(300, 4096, 64, 64, 0, -1, 2),
        mem(500, 139888160669696, -512, 2097152 + 512, 1, 0, 3),
        mem(900, 139888158572544, -2097152, 512, 1, 0, 4),
        mem(905, 139888158572544, 1024, 1024, 6, 1, 5),
        format!(
            r#"{{"ph":"i","cat":"cpu_instant_event","s":"t","name":"[OutOfMemory]","pid":4242,"tid":4242,"ts":{},
            "args":{{"Device Type":1,"Device Id":0,"Bytes":8589934592,"Total Allocated":512,"Total Reserved":20971520}}}}"#,
            ts(950)
        ),
    ];
    let base = if with_base {
        format!(r#""baseTimeNanoseconds": {BASE_NS},"#)
    } else {
        String::new()
    };
    format!(
        r#"{{"schemaVersion": 1, "deviceProperties": [{{"id": 0, "name": "NVIDIA H100"}}],
        "distributedInfo": {{"backend": "nccl", "rank": 5, "world_size": 8}},
        {base} "traceEvents": [{}], "traceName": "x"}}"#,
        events.join(",\n")
    )
}

#[test]
fn a_torch_profiler_trace_imports_to_the_expected_entries() {
    let dir = tempfile::tempdir().unwrap();
    let t = |us: i64| Some(BASE_NS / 1000 + us);
    let frames = [
        ":0:aten::empty\n",
        "model.py:42:forward\n",
        "train.py:10:step\n",
    ];
    let stack = |from: usize| frames[from..].concat();
    let big = 139888158572544u64;
    let old = 139888160669696u64;
    let expected_device_0: Vec<Resolved> = vec![
        ("alloc".into(), Some(old), 512, 0, t(205), String::new()),
        ("alloc".into(), Some(big), 2097152, 0, t(205), stack(0)),
        ("free_requested".into(), Some(old), 512, 0, t(500), stack(2)),
        ("free_completed".into(), Some(old), 512, 0, t(500), stack(2)),
        (
            "free_requested".into(),
            Some(big),
            2097152,
            0,
            t(900),
            stack(2),
        ),
        (
            "free_completed".into(),
            Some(big),
            2097152,
            0,
            t(900),
            stack(2),
        ),
        ("oom".into(), None, 8589934592, 0, t(950), stack(2)),
    ];
    for with_base in [true, false] {
        let text = torch_trace(with_base);
        for (name, bytes) in [
            ("prof.pt.trace.json", text.as_bytes().to_vec()),
            ("prof.pt.trace.json.gz", gzip(text.as_bytes())),
        ] {
            let path = write_file(dir.path(), name, &bytes);
            let import = memsnap_converters::OpenOptions::new()
                .open(&path)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(matches!(import.source, Source::TorchProfiler(_)));
            let traces = resolved(&import.snapshot);
            assert_eq!(traces.len(), 2, "devices 0 and 1 (HIP)");
            assert_eq!(traces[0], expected_device_0, "base {with_base}");
            assert_eq!(traces[1].len(), 1);
            assert_eq!(traces[1][0].2, 1024);
            let report = import.report.expect("report");
            assert_eq!(report.rank, Some(5));
            let notes = report.warnings.join("\n");
            assert!(notes.contains("rounded"), "{notes}");
            assert!(
                notes.contains("1 frees of blocks allocated before the profile (512 bytes)"),
                "{notes}"
            );
            // 1024 live before; the early free explains 512.
            assert!(
                notes.contains("512 bytes were live before the profile"),
                "{notes}"
            );
            assert!(notes.contains("1 CPU memory events"), "{notes}");
            assert_eq!(report.devices[0].with_stack, 1);
            assert_eq!(report.devices[0].ooms, 1);
            // Allocated after each event's last entry is its Total Allocated: the 512
            // bytes no free explains are memory from before the profile; reserved is Total
            // Reserved.
            let timeline = DeviceTimeline::build(&import.snapshot, 0).unwrap();
            let curves = timeline.curves();
            let after: Vec<u64> = [1, 3, 5, 6].map(|i| curves.allocated.at(i)).to_vec();
            assert_eq!(after, [2097152 + 1024, 2097152 + 512, 512, 512]);
            assert_eq!(curves.allocated.initial, 512);
            assert!((0..7).all(|i| curves.reserved.at(i) == 20971520));
            assert_eq!(timeline.replay().unattributed_bytes, 512);
        }
    }
}

/// A profiler trace whose `Total Allocated` moves by more than its events' `Bytes` (memory the
/// profile did not see come and go): the unattributed memory follows it, so allocated stays
/// the profiler's total at every event, and the change survives the Chrome round trip.
#[test]
fn a_changing_unattributed_baseline_keeps_allocated_equal_to_the_profilers_total() {
    let mem = |t: i64, addr: i64, bytes: i64, total: i64, reserved: i64| {
        format!(
            r#"{{"ph":"i","name":"[memory]","pid":1,"tid":1,"ts":{t},"args":{{"Total Reserved":{reserved},
            "Total Allocated":{total},"Bytes":{bytes},"Addr":{addr},"Device Id":0,"Device Type":1}}}}"#
        )
    };
    // Baseline 500, rises by 300 at the second event, falls by 600 at the third.
    let events = [
        mem(1, 4096, 1000, 1500, 2 << 20),
        mem(2, 8192, 2000, 3800, 4 << 20),
        mem(3, 4096, -1000, 2200, 4 << 20),
        mem(4, 8192, -2000, 200, 2 << 20),
    ];
    let text = format!(r#"{{"traceEvents": [{}]}}"#, events.join(","));
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "prof.json", text.as_bytes());
    let (snapshot, _) = open_path(&path).unwrap();
    let check = |snapshot: &Snapshot| {
        let timeline = DeviceTimeline::build(snapshot, 0).unwrap();
        let c = timeline.curves();
        let at = |i| (c.allocated.at(i), c.active.at(i), c.reserved.at(i));
        assert_eq!(c.allocated.initial, 500);
        assert_eq!(at(0), (1500, 1500, 2 << 20));
        assert_eq!(at(1), (3800, 3800, 4 << 20));
        assert_eq!(at(3), (2200, 2200, 4 << 20));
        assert_eq!(at(5), (200, 200, 2 << 20));
        assert_eq!(c.active.max(), (3800, Some(1)));
    };
    check(&snapshot);
    let back = write_file(
        dir.path(),
        "back.json",
        &export(&snapshot, &ChromeOptions::default()),
    );
    check(&open_path(&back).unwrap().0);
}

#[test]
fn bad_traces_name_the_file_and_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Vec<u8>, &str); 6] = [
        (
            "no_memory.json",
            br#"{"traceEvents": [{"ph": "X", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}"#.to_vec(),
            "no [memory] events among the trace's 1 events: record with torch.profiler.profile(profile_memory=True)",
        ),
        (
            "truncated.json",
            torch_trace(true).as_bytes()[..600].to_vec(),
            "the file ends too early: truncated?",
        ),
        (
            "timeline.html",
            b"<html>\n<head><meta charset=\"utf-8\" />\n<title>GPU Memory Timeline HTML</title></head>\n<body><img src=\"data:image/png;base64,AAAA\"></body></html>".to_vec(),
            "re-export with a .raw.json.gz path",
        ),
        (
            "old.json",
            br#"{"traceEvents": [{"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512}}]}"#.to_vec(),
            "no Addr (a PyTorch 1.8-era trace)",
        ),
        (
            "no_device.json",
            br#"{"traceEvents": [{"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1, "args": {"Device Type": 1, "Addr": 4096, "Bytes": 512}}]}"#.to_vec(),
            "traceEvents[0]: 1 GPU [memory] events, none with a usable \"Device Id\"",
        ),
        (
            "bad_timeline.raw.json",
            b"[[1, 2, 512, 3], [2, 9, 512, 3]]".to_vec(),
            "row 1: action 9 is not 1..=4",
        ),
    ];
    for (name, bytes, expected) in cases {
        let path = write_file(dir.path(), name, &bytes);
        let err = open_path(&path).expect_err(name);
        assert!(matches!(err, ConvertError::Trace { .. }), "{name}: {err:?}");
        let text = err.to_string();
        assert!(text.contains(name), "{text}");
        assert!(text.contains(expected), "{name}: {text}");
    }
}

#[test]
fn memory_timeline_raw_events_import_with_synthetic_blocks() {
    // PREEXISTING (t = -1) parameter, an activation created, its version bumped (category
    // change), a temporary created and destroyed, then the activation destroyed.
    let t0 = 1_700_000_000_000_000_000i64;
    let rows = format!(
        "[[-1, 1, 4096, 0], [{a}, 2, 1024, 4], [{b}, 3, -1024, 4], [{b}, 3, 1024, 5], \
         [{c}, 2, 512, 3], [{d}, 4, -512, 3], [{e}, 4, -1024, 5]]",
        a = t0 + 1000,
        b = t0 + 2000,
        c = t0 + 3000,
        d = t0 + 4000,
        e = t0 + 5000
    );
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "tl.raw.json.gz", &gzip(rows.as_bytes()));
    let import = memsnap_converters::OpenOptions::new()
        .open(&path)
        .expect("import");
    assert_eq!(
        import.source,
        Source::MemoryTimelineRaw(memsnap_format::Compression::Gzip)
    );
    let trace = &import.snapshot.traces()[0];
    let summary: Vec<(&str, u64, Option<i64>)> = trace
        .iter()
        .map(|e| (e.action_name(&import.snapshot.strings), e.size, e.time_us()))
        .collect();
    let us = t0 / 1000;
    assert_eq!(
        summary,
        vec![
            ("alloc", 4096, Some(us + 1)),
            ("alloc", 1024, Some(us + 1)),
            // The new version: the block closes and reopens in its new category.
            ("free_requested", 1024, Some(us + 2)),
            ("free_completed", 1024, Some(us + 2)),
            ("alloc", 1024, Some(us + 2)),
            ("alloc", 512, Some(us + 3)),
            ("free_requested", 512, Some(us + 4)),
            ("free_completed", 512, Some(us + 4)),
            ("free_requested", 1024, Some(us + 5)),
            ("free_completed", 1024, Some(us + 5)),
        ]
    );
    // Distinct addresses; each free closes its own block.
    assert_eq!(trace[1].addr, trace[2].addr);
    assert_eq!(trace[5].addr, trace[6].addr);
    assert_eq!(trace[4].addr, trace[8].addr);
    assert_ne!(trace[0].addr, trace[1].addr);
    // The categories are PyTorch's, kept as the source's; the one frame is marked synthetic.
    let info = import.snapshot.recorder_info.as_ref().unwrap();
    let categories = info.source_of(0).unwrap().categories.unwrap();
    let of = |i| categories.of(i);
    assert_eq!(
        [of(0), of(1), of(4), of(5)],
        [
            Some("PARAMETER"),
            Some("ACTIVATION"),
            Some("GRADIENT"),
            Some("TEMPORARY")
        ]
    );
    let frame = |e: &TraceEntry| {
        import
            .snapshot
            .stack_frames(e.frames.unwrap())
            .next()
            .unwrap()
            .clone()
    };
    assert_eq!(frame(&trace[4]).name, "GRADIENT");
    assert!(trace.iter().all(|e| frame(e).is_synthetic()));
}

#[test]
fn memory_timeline_plot_data_keeps_each_categorys_total() {
    // µs times; 9 values per row (index 0 unused, k+1 = category k).
    let text = "[[1700000000000001, 1700000000000002, 1700000000000003], \
                [[0, 4096, 0, 0, 0, 1024, 0, 0, 0], [0, 4096, 0, 0, 512, 3072, 0, 0, 0], \
                 [0, 4096, 0, 0, 0, 2048, 0, 0, 0]]]";
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "tl.json", text.as_bytes());
    let (snapshot, source) = open_path(&path).expect("import");
    assert!(matches!(source, Source::MemoryTimelinePlot(_)));
    // Live bytes after each time, from the entries.
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let mut totals = BTreeMap::new();
    for e in &snapshot.traces()[0] {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, e.size);
            }
            Action::FreeCompleted => {
                live.remove(&e.addr);
            }
            _ => {}
        }
        totals.insert(e.time_us().unwrap(), live.values().sum::<u64>());
    }
    assert_eq!(
        totals.into_values().collect::<Vec<_>>(),
        vec![4096 + 1024, 4096 + 512 + 3072, 4096 + 2048]
    );
}

#[test]
fn merging_keeps_the_torch_trace_and_reports_the_clock_offset() {
    let run = TrainingRun {
        steps: 2,
        ..TrainingRun::default()
    };
    let (snapshot, _) = generate(&run);
    let trace = &snapshot.traces()[0];
    let first_us = trace.iter().find_map(|e| e.time_us()).unwrap();
    // A torch trace whose [memory] allocs are the snapshot's, seen 2 µs later.
    let base_ns = (first_us - 5_000_000) * 1000;
    for with_base in [true, false] {
        let mut torch_events = vec![
            r#"{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":1.5,"dur":3}"#
                .to_string(),
        ];
        for (i, e) in trace
            .iter()
            .enumerate()
            .filter(|(_, e)| e.action == Action::Alloc)
        {
            let t = e.time_us().unwrap() + 2;
            let ts = if with_base {
                format!("{}.000", t - base_ns / 1000)
            } else {
                t.to_string()
            };
            torch_events.push(format!(
                r#"{{"ph":"i","name":"[memory]","pid":9,"tid":9,"ts":{ts},"args":{{"Device Type":1,"Device Id":0,"Addr":{},"Bytes":{},"Total Allocated":0,"Total Reserved":0,"Ev Idx":{i}}}}}"#,
                e.addr,
                e.size.div_ceil(512) * 512
            ));
        }
        let base = if with_base {
            format!(r#""baseTimeNanoseconds":{base_ns},"#)
        } else {
            String::new()
        };
        let torch = format!(
            r#"{{"schemaVersion":1,"deviceProperties":[{{"id":0}}],{base}"traceEvents":[{}],"traceName":"t"}}"#,
            torch_events.join(",")
        );
        let mut out = Vec::new();
        let report = chrome::merge_write(
            &snapshot,
            &ChromeOptions::default(),
            torch.as_bytes(),
            Path::new("torch.json"),
            &mut out,
        )
        .expect("merge");
        assert_eq!(report.median_offset_us, Some(2.0));
        let allocs = trace.iter().filter(|e| e.action == Action::Alloc).count();
        assert_eq!((report.torch_allocations, report.matched), (allocs, allocs));
        let json: Value = serde_json::from_slice(&out).expect("valid JSON");
        assert_eq!(json["schemaVersion"], 1);
        assert_eq!(json["traceName"], "t");
        assert_eq!(json["deviceProperties"][0]["id"], 0);
        let all = events(&json);
        assert_eq!(all.len() as u64, 1 + allocs as u64 + report.memsnap_events);
        assert_eq!(all[0]["name"], "gemm");
        // memsnap's first alloc slice sits at its time in the torch time base.
        let b = all
            .iter()
            .find(|e| e["ph"] == "b" && e["cat"] == "memsnap.alloc")
            .unwrap();
        let first_alloc = trace.iter().find(|e| e.action == Action::Alloc).unwrap();
        let expected = if with_base {
            (first_alloc.time_us().unwrap() - base_ns / 1000) as f64
        } else {
            first_alloc.time_us().unwrap() as f64
        };
        assert_eq!(b["ts"].as_f64().unwrap(), expected);
        // Read back, memsnap's entries come back exactly (not torch's rounded ones).
        let dir = tempfile::tempdir().unwrap();
        let (back, source) = open_path(&write_file(dir.path(), "merged.json", &out)).unwrap();
        assert!(matches!(source, Source::MemsnapChrome(_)));
        assert_eq!(resolved(&back), resolved(&snapshot));
    }
}

#[test]
fn every_real_snapshot_exports_and_round_trips() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let files = snapshot_files(&dir);
    assert!(files.len() >= 15, "{} files", files.len());
    let out_dir = tempfile::tempdir().unwrap();
    for file in files {
        let (snapshot, _) = open_path(&file).expect("read");
        let bytes = export(&snapshot, &ChromeOptions::default());
        let json: Value =
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_lanes_do_not_overlap(&json);
        let counters = last_counters(&json);
        let devices = memsnap_analysis::DeviceTimeline::devices(&snapshot);
        for d in &devices {
            for name in ["allocated", "active", "reserved"] {
                assert!(
                    counters.contains_key(&(1_000_000_000 + d, name.to_string())),
                    "{}: device {d} has no {name} counter",
                    file.display()
                );
            }
        }
        // The final reserved bytes are the segments' (every real file ends in its segments).
        for d in &devices {
            let reserved: u64 = snapshot
                .segments
                .iter()
                .filter(|s| s.device == *d)
                .map(|s| s.total_size)
                .sum();
            let last = counters[&(1_000_000_000 + d, "reserved".to_string())].1;
            if snapshot
                .traces()
                .get(*d as usize)
                .is_none_or(|t| t.is_empty())
            {
                assert_eq!(last, reserved, "{} device {d}", file.display());
            }
        }
        // The protobuf of the same picture decodes, one packet per event written.
        let mut proto = Vec::new();
        let summary = chrome::write_perfetto(&snapshot, &ChromeOptions::default(), &mut proto)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let decoded =
            <memsnap_converters::chrome::perfetto::Trace as prost::Message>::decode(&proto[..])
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_eq!(decoded.packet.len() as u64, summary.events);
        let path = write_file(out_dir.path(), "real.json", &bytes);
        let (back, _) = open_path(&path).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_eq!(
            resolved(&back),
            resolved(&snapshot),
            "{} round trip",
            file.display()
        );
    }
}

#[test]
fn the_perfetto_protobuf_decodes_with_its_own_types() {
    use memsnap_converters::chrome::perfetto::{
        Trace, TYPE_COUNTER, TYPE_SLICE_BEGIN, TYPE_SLICE_END,
    };
    use prost::Message;
    let (snapshot, _) = generate(&TrainingRun {
        steps: 2,
        ..TrainingRun::default()
    });
    let mut out = Vec::new();
    let summary =
        chrome::write_perfetto(&snapshot, &ChromeOptions::default(), &mut out).expect("export");
    let trace = Trace::decode(&out[..]).expect("decodes");
    assert_eq!(trace.packet.len() as u64, summary.events);
    let mut names: BTreeMap<u64, String> = BTreeMap::new();
    let mut open: BTreeMap<u64, u64> = BTreeMap::new();
    let mut slices: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    let mut allocated = None;
    let mut alloc_slices = 0;
    let mut last_ts = 0;
    for p in &trace.packet {
        assert_eq!(p.trusted_packet_sequence_id, Some(7));
        if let Some(d) = &p.track_descriptor {
            let name = d
                .name
                .clone()
                .or_else(|| d.process.as_ref().and_then(|p| p.process_name.clone()));
            names.insert(d.uuid.unwrap(), name.unwrap_or_default());
        }
        let Some(e) = &p.track_event else { continue };
        let ts = p.timestamp.unwrap();
        assert!(ts >= last_ts, "events in time order");
        last_ts = ts;
        let track = e.track_uuid.unwrap();
        let name = names.get(&track).expect("track declared before its events");
        match e.r#type {
            Some(TYPE_COUNTER) if name == "allocated" => allocated = e.counter_value,
            Some(TYPE_SLICE_BEGIN) => {
                assert!(open.insert(track, ts).is_none(), "{name}: nested begin");
                alloc_slices += usize::from(name == "allocations");
            }
            Some(TYPE_SLICE_END) => {
                let start = open.remove(&track).expect("end after begin");
                slices.entry(track).or_default().push((start, ts));
            }
            _ => {}
        }
    }
    assert!(open.is_empty());
    // The allocated counter ends at the live bytes, summed here from the trace.
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    for e in &snapshot.traces()[0] {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, e.size);
            }
            Action::FreeRequested => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    assert_eq!(allocated, Some(live.values().sum::<u64>() as i64));
    let allocs = snapshot.traces()[0]
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .count();
    assert_eq!(alloc_slices, allocs);
    assert_eq!(names[&1_000_000_000], "memsnap GPU 0");
}

/// A run whose stacks are deep (about 150 frames) and many, every allocation taking the next
/// stack of its pool: the shape whose Chrome export was 3.7 GB at 1M entries, when each
/// allocation carried its stack inline.
fn deep_stack_run() -> Snapshot {
    generate(&TrainingRun {
        steps: 10,
        stack_pool: 40,
        stack_depth: 150,
        rotate_stacks: true,
        ..TrainingRun::default()
    })
    .0
}

/// A stack as the exports show it: `file:line:name` lines, innermost first, without the
/// frames PyTorch's viewers hide.
fn shown_stack(snapshot: &Snapshot, stack: StackId) -> String {
    snapshot
        .stack_frames(stack)
        .filter(|f| !memsnap_analysis::sites::is_filtered_frame(f))
        .map(|f| format!("{}:{}:{}", f.filename, f.line, f.name))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The stack a `stackFrames` node stands for, innermost first.
fn stack_of_node(frames: &Value, node: &str) -> String {
    let mut names = Vec::new();
    let mut node = &frames[node];
    loop {
        names.push(node["name"].as_str().expect("a frame's name").to_string());
        match node.get("parent") {
            Some(parent) => node = &frames[parent.as_str().expect("a parent id")],
            None => break,
        }
    }
    names.join("\n")
}

#[test]
fn a_deep_stack_runs_chrome_export_holds_each_stack_once() {
    let snapshot = deep_stack_run();
    let bytes = export(&snapshot, &ChromeOptions::default());
    let json: Value = serde_json::from_slice(&bytes).expect("valid JSON");
    let frames = &json["stackFrames"];
    let mut named = BTreeMap::new();
    let mut allocations = 0;
    for b in events(&json)
        .iter()
        .filter(|e| e["ph"] == "b" && e["cat"] == "memsnap.alloc")
    {
        allocations += 1;
        assert!(b["args"].get("stack").is_none(), "no stack inline: {b}");
        // The alloc's record names its stack; the event's `sf` node is that stack.
        let record = &b["args"]["memsnap"][0];
        let stack = StackId::from_index(record[6].as_u64().expect("a stack id") as usize);
        let node = b["sf"].as_u64().expect("an sf").to_string();
        assert_eq!(stack_of_node(frames, &node), shown_stack(&snapshot, stack));
        named.insert(node, stack);
    }
    // Every stack is used many times, and written once: a frame once per path to it.
    assert!(
        allocations > 5 * named.len(),
        "{allocations} allocations, {} stacks",
        named.len()
    );
    let depth_sum: usize = named
        .values()
        .map(|&s| shown_stack(&snapshot, s).lines().count())
        .sum();
    let nodes = frames.as_object().expect("stackFrames").len();
    assert!(nodes <= depth_sum, "{nodes} nodes for {depth_sum} frames");
    let (_, &some_stack) = named.iter().next().expect("a stack");
    let outermost = shown_stack(&snapshot, some_stack)
        .lines()
        .last()
        .expect("frames")
        .to_string();
    let quoted = serde_json::to_string(&outermost).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    assert_eq!(text.matches(&quoted).count(), 1, "{quoted}");
    // And the import still gives back every entry exactly.
    let dir = tempfile::tempdir().unwrap();
    let (back, _) = open_path(&write_file(dir.path(), "deep.json", text.as_bytes())).unwrap();
    assert_eq!(resolved(&back), resolved(&snapshot));
}

#[test]
fn a_deep_stack_runs_perfetto_export_interns_each_stack_once() {
    use memsnap_converters::chrome::perfetto::{Trace, TYPE_SLICE_BEGIN};
    use prost::Message;
    let snapshot = deep_stack_run();
    let mut out = Vec::new();
    chrome::write_perfetto(&snapshot, &ChromeOptions::default(), &mut out).expect("export");
    let trace = Trace::decode(&out[..]).expect("decodes");
    // The interned strings, each iid defined once before its first use.
    let (mut names, mut annotation_names, mut strings) =
        (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    let mut slices: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (i, p) in trace.packet.iter().enumerate() {
        assert_eq!(p.sequence_flags.unwrap_or(0) & 1 == 1, i == 0, "packet {i}");
        if let Some(new) = &p.interned_data {
            assert_eq!(
                p.sequence_flags.unwrap_or(0) & 2,
                2,
                "packet {i} needs the state"
            );
            for n in &new.event_names {
                assert!(names
                    .insert(n.iid.unwrap(), n.name.clone().unwrap())
                    .is_none());
            }
            for n in &new.debug_annotation_names {
                assert!(annotation_names
                    .insert(n.iid.unwrap(), n.name.clone().unwrap())
                    .is_none());
            }
            for s in &new.debug_annotation_string_values {
                let text = String::from_utf8(s.str.clone().unwrap()).unwrap();
                assert!(strings.insert(s.iid.unwrap(), text).is_none());
            }
        }
        let Some(e) = &p.track_event else { continue };
        if e.r#type != Some(TYPE_SLICE_BEGIN) || e.category_iids.is_empty() {
            continue;
        }
        let name = names[&e.name_iid.expect("an interned name")].clone();
        let stack = e
            .debug_annotations
            .iter()
            .find(|a| annotation_names[&a.name_iid.unwrap()] == "stack")
            .expect("a stack");
        assert!(stack.string_value.is_none(), "no stack inline");
        let text = strings[&stack.string_value_iid.expect("an interned stack")].clone();
        *slices.entry((name, text)).or_default() += 1;
    }
    // Each distinct stack once, and the allocations see the stacks and names the Chrome
    // export shows them.
    let distinct: std::collections::BTreeSet<&String> = strings.values().collect();
    assert_eq!(distinct.len(), strings.len(), "a stack interned twice");
    let json: Value =
        serde_json::from_slice(&export(&snapshot, &ChromeOptions::default())).unwrap();
    let mut expected: BTreeMap<(String, String), usize> = BTreeMap::new();
    for b in events(&json)
        .iter()
        .filter(|e| e["ph"] == "b" && e["cat"] == "memsnap.alloc")
    {
        let node = b["sf"].as_u64().unwrap().to_string();
        let key = (
            b["name"].as_str().unwrap().to_string(),
            stack_of_node(&json["stackFrames"], &node),
        );
        *expected.entry(key).or_default() += 1;
    }
    assert_eq!(slices, expected);
    assert!(slices.values().sum::<usize>() > 5 * strings.len());
}

#[test]
fn a_merge_keeps_the_torch_traces_stack_frames_apart_from_memsnaps() {
    let snapshot = deep_stack_run();
    let torch = r#"{"traceEvents":[{"ph":"X","name":"k","pid":0,"tid":1,"ts":1,"dur":2,"sf":7}],"stackFrames":{"3":{"name":"main"},"7":{"name":"k","parent":"3"},"x":{"name":"odd id"}}}"#;
    let mut out = Vec::new();
    chrome::merge_write(
        &snapshot,
        &ChromeOptions::default(),
        torch.as_bytes(),
        Path::new("torch.json"),
        &mut out,
    )
    .expect("merge");
    let json: Value = serde_json::from_slice(&out).expect("valid JSON");
    let frames = &json["stackFrames"];
    // The torch trace's frames are kept as they were; memsnap's come after its numeric ids.
    assert_eq!(frames["3"], serde_json::json!({"name": "main"}));
    assert_eq!(frames["7"], serde_json::json!({"name": "k", "parent": "3"}));
    assert_eq!(frames["x"]["name"], "odd id");
    assert_eq!(events(&json)[0]["sf"], 7);
    let mut checked = 0;
    for b in events(&json)
        .iter()
        .filter(|e| e["ph"] == "b" && e["cat"] == "memsnap.alloc")
    {
        let node = b["sf"].as_u64().unwrap();
        assert!(node >= 8, "{node}");
        let record = &b["args"]["memsnap"][0];
        let stack = StackId::from_index(record[6].as_u64().unwrap() as usize);
        assert_eq!(
            stack_of_node(frames, &node.to_string()),
            shown_stack(&snapshot, stack)
        );
        checked += 1;
    }
    assert!(checked > 0);
    // An id too large to number memsnap's frames after it is refused, not wrapped around.
    let huge = r#"{"traceEvents":[],"stackFrames":{"18446744073709551615":{"name":"x"}}}"#;
    let err = chrome::merge_write(
        &snapshot,
        &ChromeOptions::default(),
        huge.as_bytes(),
        Path::new("torch.json"),
        &mut Vec::new(),
    )
    .expect_err("no room for memsnap's frames");
    assert!(err.to_string().contains("stackFrames id"), "{err}");
}
