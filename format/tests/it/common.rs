//! Helpers shared by the integration tests.

use std::path::PathBuf;

/// The real snapshot files named by `MEMSNAP_REAL_SNAPSHOTS`, sorted; `None` (with a printed
/// notice) when the variable is unset, so a fresh clone still passes.
#[allow(dead_code)]
pub fn real_snapshots() -> Option<Vec<PathBuf>> {
    let Some(dir) = std::env::var_os("MEMSNAP_REAL_SNAPSHOTS") else {
        eprintln!("notice: MEMSNAP_REAL_SNAPSHOTS is unset; skipping the real-snapshot tests");
        return None;
    };
    let dir = PathBuf::from(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("MEMSNAP_REAL_SNAPSHOTS={}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("pickle") | Some("pkl")
            )
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no snapshots in {}", dir.display());
    Some(files)
}

/// The folder of PyTorch 2.15 `_memory_viz.py` outputs beside the real snapshots.
#[allow(dead_code)]
pub fn golden_dir() -> Option<PathBuf> {
    std::env::var_os("MEMSNAP_REAL_SNAPSHOTS")
        .map(|d| PathBuf::from(d).join("golden_memory_viz_torch2.15.0"))
}
