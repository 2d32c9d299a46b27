//! Snapshots: a recorded run validates in memory and survives a dump and read-back.

use memsnap_format::{io, validate, Action, Snapshot};
use memsnap_recorder::{CachingAllocator, HistoryOptions, SimulatedDevice, Stream, Unwinder};

const MIB: u64 = 1 << 20;

#[inline(never)]
fn allocate_activations(alloc: &CachingAllocator<SimulatedDevice>) -> Vec<u64> {
    let mut activations = Vec::new();
    for i in 1..=4 {
        activations.push(alloc.malloc(i * 3 * MIB + 17, Stream(0)).unwrap());
    }
    activations
}

fn recorded_run() -> Snapshot {
    let alloc =
        CachingAllocator::with_conf(SimulatedDevice::new(1 << 30), "max_split_size_mb:64").unwrap();
    alloc.record_memory_history(HistoryOptions {
        unwinder: Unwinder::Backtrace,
        ..HistoryOptions::default()
    });
    let acts = allocate_activations(&alloc);
    let small = alloc.malloc(1000, Stream(1)).unwrap();
    alloc.free(acts[1]).unwrap();
    alloc.free(small).unwrap();
    alloc.empty_cache().unwrap();
    let _ = alloc.snapshot(); // leaves a `snapshot` entry for the next one
    alloc.snapshot()
}

#[test]
fn recorded_run_validates_and_has_symbolized_stacks() {
    let snap = recorded_run();
    assert_eq!(validate(&snap), vec![]);
    let trace = &snap.traces()[0];
    assert!(trace.iter().any(|e| e.action == Action::Snapshot));
    let alloc = trace.iter().find(|e| e.action == Action::Alloc).unwrap();
    let frames: Vec<&str> = snap
        .stack_frames(alloc.frames.unwrap())
        .map(|f| f.name.as_str())
        .collect();
    assert!(
        frames
            .first()
            .is_some_and(|f| f.contains("allocate_activations")),
        "innermost frame should be the caller of malloc: {frames:?}"
    );
    let settings = snap.allocator_settings.as_ref().unwrap();
    assert_eq!(settings.max_split_size, Some((64 * MIB as i64).into()));
    assert_eq!(
        settings.roundup_power2_divisions.as_ref().unwrap().len(),
        16
    );
    assert_eq!(settings.alloc_conf.as_deref(), Some("max_split_size_mb:64"));
}

fn round_trip(extension: &str) {
    let snap = recorded_run();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("run.{extension}"));
    io::write_path(&path, &snap, None).unwrap();
    let (back, _) = io::read_path(&path).unwrap();
    assert_eq!(validate(&back), vec![]);
    assert_eq!(back.segments.len(), snap.segments.len());
    assert_eq!(back.entry_count(), snap.entry_count());
    assert_eq!(back.recorder_info, snap.recorder_info);
    let actions = |s: &Snapshot| s.traces()[0].iter().map(|e| e.action).collect::<Vec<_>>();
    assert_eq!(actions(&back), actions(&snap));
}

#[test]
fn dump_round_trips_through_pickle() {
    round_trip("pickle");
}

#[test]
fn dump_snapshot_writes_a_readable_file() {
    let alloc = CachingAllocator::new(SimulatedDevice::new(1 << 30));
    alloc.record_memory_history(HistoryOptions::without_stacks());
    let p = alloc.malloc(5000, Stream(0)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dump.pickle");
    alloc.dump_snapshot(&path).unwrap();
    let (back, _) = io::read_path(&path).unwrap();
    assert_eq!(back.segments.len(), 1);
    assert_eq!(back.traces()[0].len(), 2);
    alloc.free(p).unwrap();
}

/// PyTorch's own viewer script, where a copy is available (`MEMSNAP_MEMORY_VIZ`, or the copy
/// memsnap's tooling caches). Without one the check is reported and skipped.
fn memory_viz_script() -> Option<std::path::PathBuf> {
    let candidates = [
        std::env::var_os("MEMSNAP_MEMORY_VIZ").map(std::path::PathBuf::from),
        std::env::var_os("HOME")
            .map(|h| std::path::Path::new(&h).join(".cache/memsnap/_memory_viz.py")),
    ];
    candidates.into_iter().flatten().find(|p| p.is_file())
}

#[test]
fn dumped_pickle_loads_in_pytorch_memory_viz() {
    let Some(script) = memory_viz_script() else {
        eprintln!("skipped: no _memory_viz.py (set MEMSNAP_MEMORY_VIZ)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.pickle");
    io::write_path(&path, &recorded_run(), None).unwrap();
    for command in ["stats", "trace"] {
        let out = std::process::Command::new("python3")
            .arg(&script)
            .arg(command)
            .arg(&path)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "_memory_viz.py {command} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
