//! Helpers shared by the tests.

use std::path::PathBuf;

use memsnap_format::{Action, Snapshot, TraceEntry};

/// The real snapshots folder, or `None` with a printed notice when `MEMSNAP_REAL_SNAPSHOTS` is
/// unset.
pub fn real_snapshots_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("MEMSNAP_REAL_SNAPSHOTS");
    if dir.is_none() {
        eprintln!("notice: MEMSNAP_REAL_SNAPSHOTS is unset; skipping the real-snapshot tests");
    }
    dir.map(PathBuf::from)
}

/// A one-device snapshot from `(action, addr, size)` triples.
pub fn snapshot_of(events: &[(Action, u64, u64)]) -> Snapshot {
    let mut snapshot = Snapshot::new(1);
    let trace = &mut snapshot.device_traces.as_mut().expect("traces")[0];
    for &(action, addr, size) in events {
        trace.push(TraceEntry::new(action, addr, size, 0));
    }
    snapshot
}
