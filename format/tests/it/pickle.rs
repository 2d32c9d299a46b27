//! The pickle codec against the real snapshots: every file parses, a write/read round trip
//! keeps the model, and (where `python3` exists) CPython loads our output as the same object
//! graph as the original, from a file no larger than the original.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::process::Command;

use memsnap_format::{pickle, Action, FormatError, Shape, Snapshot, StackId, StrId, TraceEntry};

use crate::common::real_snapshots;

/// The snapshot's content as text with every `StackId` replaced by the ordinal of its frames
/// (in order of first appearance, the frames listed at the end) and every `StrId` by its
/// string, so two snapshots with different interning orders compare equal when their data is.
pub fn canonical(s: &Snapshot) -> String {
    let mut raw = String::new();
    let _ = writeln!(raw, "{:?}", s.shape);
    let _ = writeln!(raw, "{:?}", s.segments);
    let _ = writeln!(raw, "{:?}", s.device_traces);
    let _ = writeln!(raw, "{:?}", s.allocator_settings);
    let _ = writeln!(raw, "{:?}", s.external_annotations);
    let _ = writeln!(raw, "{:?}", s.host_segments);
    let _ = writeln!(raw, "{:?}", s.host_traces);
    let _ = writeln!(raw, "{:?}", s.recorder_info);
    let _ = writeln!(raw, "{:?}", s.extra);
    let mut ordinal_of_stack: HashMap<u32, usize> = HashMap::new();
    let mut ordinal_of_content: HashMap<String, usize> = HashMap::new();
    let mut contents: Vec<String> = Vec::new();
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw.as_str();
    // One forward scan: `StackId(` and `StrId(` both contain `Id(`.
    while let Some(found) = rest.find("Id(") {
        let before = &rest[..found];
        let (at, is_stack) = if before.ends_with("Stack") {
            (found - 5, true)
        } else if before.ends_with("Str") {
            (found - 3, false)
        } else {
            out.push_str(&rest[..found + 3]);
            rest = &rest[found + 3..];
            continue;
        };
        out.push_str(&rest[..at]);
        let open = found + 3;
        let close = open + rest[open..].find(')').expect("closing paren");
        let id: u32 = rest[open..close].parse().expect("numeric id");
        if is_stack {
            let ordinal = *ordinal_of_stack.entry(id).or_insert_with(|| {
                let content = format!(
                    "{:?}",
                    s.stack_frames(StackId::from_index(id as usize))
                        .collect::<Vec<_>>()
                );
                let next = ordinal_of_content.len();
                let ordinal = *ordinal_of_content.entry(content.clone()).or_insert(next);
                if ordinal == contents.len() {
                    contents.push(content);
                }
                ordinal
            });
            let _ = write!(out, "Stack#{ordinal}");
        } else {
            let _ = write!(out, "{:?}", s.str(StrId::from_index(id as usize)));
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    for (i, c) in contents.iter().enumerate() {
        let _ = writeln!(out, "Stack#{i} = {c}");
    }
    out
}

fn summary(s: &Snapshot) -> String {
    format!(
        "{:?}, {} segments, {} devices, {} entries, {} stacks, {} frames",
        s.shape,
        s.segments.len(),
        s.traces().len(),
        s.entry_count(),
        s.stacks.len(),
        s.frames.len()
    )
}

#[test]
fn every_real_snapshot_parses() {
    let Some(files) = real_snapshots() else {
        return;
    };
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        let snap = pickle::read(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("{}: {}", path.display(), summary(&snap));
        // Interning worked: no two stack ids hold the same frames.
        let distinct: std::collections::HashSet<&[memsnap_format::FrameId]> =
            snap.stacks.iter().map(|(_, frames)| frames).collect();
        assert_eq!(distinct.len(), snap.stacks.len(), "{}", path.display());
    }
}

#[test]
fn real_snapshot_facts_survive_reading() {
    let Some(files) = real_snapshots() else {
        return;
    };
    let find = |prefix: &str| {
        let path = files
            .iter()
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
            .unwrap_or_else(|| panic!("no file {prefix}*"));
        pickle::read(&std::fs::read(path).unwrap()).unwrap()
    };
    let empty = find("01_");
    assert_eq!(empty.traces().len(), 4);
    assert!(empty.segments.is_empty());
    let settings = empty.allocator_settings.as_ref().unwrap();
    assert_eq!(settings.max_split_size, Some(67108864.into()));
    assert_eq!(
        settings.alloc_conf.as_deref(),
        Some("expandable_segments:True,max_split_size_mb:64")
    );

    assert_eq!(find("06_").shape, Shape::SegmentList);

    // 08: segments with `frames` before and after `blocks`.
    let both = find("08_");
    assert!(both.segments.iter().any(|s| s.frames_after_blocks));
    assert!(both
        .segments
        .iter()
        .any(|s| !s.frames_after_blocks && s.frames.is_some()));

    // 14: the oom entry writes device_free instead of addr.
    let oom = find("14_");
    let entry: &TraceEntry = oom
        .traces()
        .iter()
        .flatten()
        .find(|e| e.action == Action::Oom)
        .expect("an oom entry");
    assert!(!entry.has_addr());
    assert!(entry.device_free().is_some());

    // 10: 2.1 era, no time_us.
    let old = find("10_");
    assert!(old.entry_count() > 0);
    assert!(old.traces().iter().flatten().all(|e| e.time_us().is_none()));

    // 15: 1802 annotations, stage then name.
    let ann = find("15_");
    let annotations = ann.external_annotations.as_ref().unwrap();
    assert_eq!(annotations.len(), 1802);
    assert!(annotations
        .iter()
        .all(|a| a.stage().is_some() && a.name().is_some()));
}

#[test]
fn round_trip_keeps_the_model_of_every_real_snapshot() {
    let Some(files) = real_snapshots() else {
        return;
    };
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        let first = pickle::read(&bytes).unwrap();
        let ours = pickle::to_vec(&first);
        let second = pickle::read(&ours)
            .unwrap_or_else(|e| panic!("{}: re-reading our output: {e}", path.display()));
        assert!(
            canonical(&first) == canonical(&second),
            "{}: the model changed in a round trip",
            path.display()
        );
        eprintln!(
            "{}: original {} bytes, ours {} bytes ({:.1}%)",
            path.file_name().unwrap().to_string_lossy(),
            bytes.len(),
            ours.len(),
            100.0 * ours.len() as f64 / bytes.len() as f64
        );
        assert!(
            ours.len() <= bytes.len(),
            "{}: our pickle is larger than PyTorch's",
            path.display()
        );
    }
}

const PY_COMPARE: &str = r#"
import pickle, sys
class NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name} refused")
def load(path):
    with open(path, "rb") as f:
        return NoGlobals(f).load()
ok = True
for original, ours in zip(sys.argv[1::2], sys.argv[2::2]):
    if load(original) != load(ours):
        print("DIFFERENT", original)
        ok = False
print("OK" if ok else "FAIL")
sys.exit(0 if ok else 1)
"#;

#[test]
fn cpython_loads_our_output_as_the_original_object_graph() {
    let Some(files) = real_snapshots() else {
        return;
    };
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("notice: python3 not found; skipping the CPython comparison");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut args = Vec::new();
    for path in &files {
        let bytes = std::fs::read(path).unwrap();
        let ours = pickle::to_vec(&pickle::read(&bytes).unwrap());
        let out = dir.path().join(path.file_name().unwrap());
        memsnap_format::io::write_atomic(&out, &ours).unwrap();
        args.push(path.clone());
        args.push(out);
    }
    let result = Command::new("python3")
        .arg("-c")
        .arg(PY_COMPARE)
        .args(&args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(
        result.status.success(),
        "CPython sees a difference:\n{stdout}\n{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(stdout.contains("OK"));
}

#[test]
fn progress_is_reported_and_can_cancel() {
    let Some(files) = real_snapshots() else {
        return;
    };
    let biggest = files
        .iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let bytes = std::fs::read(biggest).unwrap();
    let mut calls = Vec::new();
    pickle::read_with(&bytes, &mut |done, total| {
        calls.push((done, total));
        true
    })
    .unwrap();
    let mib = bytes.len() / (1 << 20);
    assert!(calls.len() >= mib, "{} calls for {mib} MiB", calls.len());
    assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0));
    assert_eq!(
        calls.last(),
        Some(&(bytes.len() as u64, bytes.len() as u64))
    );

    let cancelled = pickle::read_with(&bytes, &mut |_, _| false);
    assert!(matches!(cancelled, Err(FormatError::Cancelled)));
}

/// A multi-device trace is split into the devices' vectors from the one packed vector the
/// reader fills (each device's run copied out from the last one back, the first keeping the
/// vector): every entry lands on its own device, in order, empty devices included, as the
/// generic path (item by item) reads it.
#[test]
fn a_multi_device_trace_split_from_the_packed_entries_keeps_each_devices_entries() {
    let lens = [5usize, 0, 3, 1, 0, 7];
    let mut snap = Snapshot::new(lens.len());
    let traces = snap.device_traces.as_mut().unwrap();
    for (device, &len) in lens.iter().enumerate() {
        for i in 0..len {
            let addr = ((device as u64) << 32) + 512 * i as u64;
            traces[device].push(TraceEntry::new(Action::Alloc, addr, 512 + i as u64, 0));
        }
    }
    let bytes = pickle::to_vec(&snap);
    let fast = pickle::read(&bytes).unwrap();
    let (generic, _) = pickle::read_with_fast_path(&bytes, false).unwrap();
    assert_eq!(fast.traces(), snap.traces());
    assert_eq!(generic.traces(), snap.traces());
    for (device, trace) in fast.traces().iter().enumerate() {
        assert_eq!(trace.len(), lens[device]);
        assert!(trace.iter().all(|e| e.addr >> 32 == device as u64));
    }
}
