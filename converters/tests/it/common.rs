//! Helpers the converter test modules share.

use std::path::{Path, PathBuf};

/// `$MEMSNAP_REAL_SNAPSHOTS` (real snapshots, never in the repo), or `None` with a notice: the
/// real-snapshot tests then return early.
pub fn real_snapshots_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("MEMSNAP_REAL_SNAPSHOTS");
    if dir.is_none() {
        eprintln!("notice: MEMSNAP_REAL_SNAPSHOTS is unset; skipping the real-snapshot tests");
    }
    dir.map(PathBuf::from)
}

/// The snapshot pickles (`.pickle`, `.pkl`) in `dir`, sorted by name.
pub fn snapshot_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "pickle" || x == "pkl"))
        .collect();
    files.sort();
    files
}

/// The real snapshot pickles, sorted; none when `$MEMSNAP_REAL_SNAPSHOTS` is unset.
pub fn real_snapshots() -> Vec<PathBuf> {
    real_snapshots_dir().map_or_else(Vec::new, |dir| snapshot_files(&dir))
}

/// Writes `bytes` to `dir/name` and returns the path.
pub fn write_file(dir: &Path, name: &str, bytes: &(impl AsRef<[u8]> + ?Sized)) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes.as_ref()).expect("write");
    path
}
