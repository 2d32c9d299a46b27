//! Helpers shared by the CLI tests.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs the `memsnap` binary built for this test run.
#[allow(dead_code)]
pub fn memsnap(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .args(args)
        .output()
        .expect("run memsnap")
}

/// The real snapshots folder, or `None` with a printed notice when `MEMSNAP_REAL_SNAPSHOTS` is
/// unset.
#[allow(dead_code)]
pub fn real_snapshots_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("MEMSNAP_REAL_SNAPSHOTS");
    if dir.is_none() {
        eprintln!("notice: MEMSNAP_REAL_SNAPSHOTS is unset; skipping the real-snapshot tests");
    }
    dir.map(PathBuf::from)
}
