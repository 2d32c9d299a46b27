//! `memsnap export --to chrome` (and `--merge`), `memsnap import`, and every command opening
//! imported formats by content.

use std::path::Path;
use std::process::Output;

use memsnap_format::Action;
use memsnap_workload::{generate, TrainingRun};
use serde_json::Value;

use crate::common::memsnap;

fn arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn export_to_chrome_then_import_gives_the_same_trace() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (snapshot, _) = generate(&TrainingRun {
        steps: 2,
        ..TrainingRun::default()
    });
    let input = tmp.path().join("run.pickle");
    memsnap_format::write_path(&input, &snapshot, None).expect("write");
    let trace = tmp.path().join("run.trace.json.gz");
    let out = memsnap(&["export", arg(&input), "--to", "chrome", "-o", arg(&trace)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("Chrome trace"), "{text}");
    assert!(text.contains("GPU 0: pid 1000000000"), "{text}");

    // Other commands open the trace by content.
    let out = memsnap(&["info", arg(&trace)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("memsnap Chrome trace, gzip"),
        "{}",
        stdout(&out)
    );

    let back = tmp.path().join("back.pickle");
    let out = memsnap(&["import", arg(&trace), "-o", arg(&back)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let allocs = snapshot.traces()[0]
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .count();
    assert!(text.contains(&format!("{allocs} allocs")), "{text}");
    let (reread, _) = memsnap_format::read_path(&back).expect("read back");
    // Stack ids are renumbered by the import: compare the entries' fields and frame names.
    let fields = |s: &memsnap_format::Snapshot| -> Vec<_> {
        s.traces()[0]
            .iter()
            .map(|e| {
                let frames: Vec<String> = e
                    .frames
                    .map(|id| s.stack_frames(id).map(|f| f.name.clone()).collect())
                    .unwrap_or_default();
                (e.action, e.addr, e.size, e.stream, e.time_us(), frames)
            })
            .collect()
    };
    assert_eq!(fields(&reread), fields(&snapshot));
}

#[test]
fn export_to_perfetto_writes_a_protobuf_trace() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (snapshot, _) = generate(&TrainingRun {
        steps: 1,
        ..TrainingRun::default()
    });
    let input = tmp.path().join("run.pickle");
    memsnap_format::write_path(&input, &snapshot, None).expect("write");
    let output = tmp.path().join("run.pftrace");
    let out = memsnap(&[
        "export",
        arg(&input),
        "--to",
        "perfetto",
        "-o",
        arg(&output),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("Perfetto protobuf trace"),
        "{}",
        stdout(&out)
    );
    let bytes = std::fs::read(&output).unwrap();
    // The first packet is field 1 of `Trace`, length-delimited (key 0x0a).
    assert_eq!(bytes[0], 0x0a);
    let out = memsnap(&[
        "export",
        arg(&input),
        "--to",
        "perfetto",
        "--merge",
        arg(&input),
        "-o",
        arg(&output),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("use --to chrome"), "{}", stderr(&out));
}

const TORCH_TRACE: &str = r#"{"schemaVersion": 1, "baseTimeNanoseconds": 1700000000000000000,
 "distributedInfo": {"rank": 2},
 "traceEvents": [
  {"ph":"X","cat":"python_function","name":"model.py(42): forward","pid":7,"tid":7,"ts":100.0,"dur":500.0},
  {"ph":"i","cat":"cpu_instant_event","s":"t","name":"[memory]","pid":7,"tid":7,"ts":150.5,
   "args":{"Total Reserved":2097152,"Total Allocated":1024,"Bytes":1024,"Addr":139888158572544,"Device Id":0,"Device Type":1,"Ev Idx":1}},
  {"ph":"i","cat":"cpu_instant_event","s":"t","name":"[memory]","pid":7,"tid":7,"ts":700.0,
   "args":{"Total Reserved":2097152,"Total Allocated":0,"Bytes":-1024,"Addr":139888158572544,"Device Id":0,"Device Type":1,"Ev Idx":2}}
 ]}"#;

#[test]
fn import_of_a_torch_profiler_trace_says_what_it_could_not_know() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let trace = tmp.path().join("prof.pt.trace.json");
    std::fs::write(&trace, TORCH_TRACE).expect("write");
    let out_path = tmp.path().join("prof.json");
    let out = memsnap(&["import", arg(&trace), "-o", arg(&out_path)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("torch.profiler trace"), "{text}");
    assert!(text.contains("rank 2"), "{text}");
    assert!(
        text.contains("device 0: 3 trace entries: 1 allocs (1 with a stack), 1 frees"),
        "{text}"
    );
    assert!(
        text.contains("note: sizes are the caching allocator's rounded block sizes"),
        "{text}"
    );
    // The written snapshot is plain JSON of PyTorch's schema.
    let json: Value = serde_json::from_slice(&std::fs::read(&out_path).unwrap()).unwrap();
    let entry = &json["device_traces"][0][0];
    assert_eq!(entry["action"], "alloc");
    assert_eq!(entry["size"], 1024);
    assert_eq!(entry["time_us"], 1_700_000_000_000_150i64);
    assert_eq!(entry["frames"][0]["filename"], "model.py");
    // And the trace opens in the analysis commands directly.
    let out = memsnap(&["summary", arg(&trace)]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn merge_keeps_the_torch_trace_and_adds_memory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (snapshot, _) = generate(&TrainingRun {
        steps: 1,
        ..TrainingRun::default()
    });
    let input = tmp.path().join("run.pickle");
    memsnap_format::write_path(&input, &snapshot, None).expect("write");
    let torch = tmp.path().join("prof.json");
    std::fs::write(&torch, TORCH_TRACE).expect("write");
    let merged = tmp.path().join("both.json");
    let out = memsnap(&[
        "export",
        arg(&input),
        "--to",
        "chrome",
        "--merge",
        arg(&torch),
        "-o",
        arg(&merged),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("baseTimeNanoseconds 1700000000000000000"),
        "{text}"
    );
    assert!(text.contains("rank: 2"), "{text}");
    let json: Value = serde_json::from_slice(&std::fs::read(&merged).unwrap()).unwrap();
    assert_eq!(json["schemaVersion"], 1);
    assert_eq!(json["distributedInfo"]["rank"], 2);
    let events = json["traceEvents"].as_array().unwrap();
    assert_eq!(events[0]["name"], "model.py(42): forward");
    assert!(events
        .iter()
        .any(|e| e["name"] == "process_name" && e["args"]["name"] == "memsnap GPU 0 (rank 2)"));
}

#[test]
fn bad_imports_exit_2_and_name_the_file_and_what_is_missing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let no_memory = tmp.path().join("kernels_only.json");
    std::fs::write(
        &no_memory,
        r#"{"traceEvents":[{"ph":"X","name":"gemm","pid":0,"tid":1,"ts":1,"dur":2}]}"#,
    )
    .unwrap();
    let html = tmp.path().join("timeline.html");
    std::fs::write(
        &html,
        "<html><head><title>GPU Memory Timeline HTML</title></head><body></body></html>",
    )
    .unwrap();
    let truncated = tmp.path().join("cut.json");
    std::fs::write(&truncated, &TORCH_TRACE[..300]).unwrap();
    let out_path = tmp.path().join("out.pickle");
    for (input, expected) in [
        (&no_memory, "no [memory] events"),
        (&html, "re-export with a .raw.json.gz path"),
        (&truncated, "truncated?"),
    ] {
        let out = memsnap(&["import", arg(input), "-o", arg(&out_path)]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(arg(input)), "{err}");
        assert!(err.contains(expected), "{err}");
        assert!(!out_path.exists());
    }
}

/// Per device: the peak, the reserved peak, the allocations and the memory from before the
/// window, as `memsnap summary --json` counts them.
fn totals(path: &Path) -> Vec<(i64, u64, u64, u64, u64)> {
    let out = memsnap(&["summary", "--json", arg(path)]);
    assert!(out.status.success(), "{}: {}", path.display(), stderr(&out));
    let json: Value = serde_json::from_slice(&out.stdout).expect("summary JSON");
    json["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| {
            let n = |v: &Value| v.as_u64().unwrap_or(0);
            (
                d["device"].as_i64().unwrap(),
                n(&d["peak"]["bytes"]),
                n(&d["peak_reserved_bytes"]),
                n(&d["allocations"]),
                n(&d["before_window_bytes"]),
            )
        })
        .collect()
}

#[test]
fn every_real_snapshot_exported_to_chrome_imports_back_with_the_same_totals() {
    // The export carried the traces only: memory live before a ring buffer's window (known
    // from the segments) was lost, e.g. 33.9 GB of peak came back as 4.2 GB, and snapshots of
    // the allocator's state alone came back empty.
    let mut files: Vec<std::path::PathBuf> = [
        "native.pickle.gz",
        "memsnap.on_oom.pickle.gz",
        "expandable.pickle.gz",
    ]
    .iter()
    .map(|f| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/gpu_h200_torch2.11")
            .join(f)
    })
    .collect();
    if let Some(dir) = crate::common::real_snapshots_dir() {
        let mut real: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("pickle" | "pkl")
                )
            })
            .collect();
        real.sort();
        assert_eq!(real.len(), 15);
        files.extend(real);
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    for file in &files {
        let trace = tmp.path().join("export.trace.json.gz");
        let back = tmp.path().join("back.pickle");
        let out = memsnap(&["export", arg(file), "--to", "chrome", "-o", arg(&trace)]);
        assert!(out.status.success(), "{}: {}", file.display(), stderr(&out));
        let out = memsnap(&["import", arg(&trace), "-o", arg(&back)]);
        assert!(out.status.success(), "{}: {}", file.display(), stderr(&out));
        assert!(
            !stdout(&out).contains("not part of this export"),
            "{}",
            stdout(&out)
        );
        assert_eq!(totals(&back), totals(file), "{}", file.display());
    }
}
