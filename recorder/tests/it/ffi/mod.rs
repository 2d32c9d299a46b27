//! Tests of the C ABI, the Python module and the `GlobalAlloc` adapter.
//!
//! The C and Python tests run real programs against the libraries cargo builds beside this
//! test binary (`libmemsnap_recorder.a` / `.so`); the never-panics test calls the exported
//! functions in process.

mod c_program;
mod global_alloc;
mod never_panics;
mod python;

use std::path::PathBuf;

/// The cargo profile folder holding this test binary's libraries (`target/debug`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/debug/deps/it-<hash> -> target/debug
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// A library cargo built for this crate, with a clear message when it is missing.
///
/// `deps/` holds the cdylib and staticlib of the build that produced this test binary;
/// `target/<profile>/` only gets a copy on `cargo build`, so it may be older.
pub fn built_library(file_name: &str) -> PathBuf {
    let path = profile_dir().join("deps").join(file_name);
    assert!(
        path.is_file(),
        "{} is missing: run the tests with `cargo test -p memsnap-recorder` (it builds the \
         cdylib and staticlib beside the test binary)",
        path.display()
    );
    path
}

/// Whether `program --version` runs; prints a notice when it does not.
pub fn have_program(program: &str, why: &str) -> bool {
    let ok = std::process::Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("notice: `{program}` not found; skipping {why}");
    }
    ok
}

/// `(name, filename, line)` of every frame of every alloc entry on device 0.
pub fn alloc_frames(snapshot: &memsnap_format::Snapshot) -> Vec<Vec<(String, String, i64)>> {
    snapshot.traces()[0]
        .iter()
        .filter(|e| e.action == memsnap_format::Action::Alloc)
        .map(|e| {
            e.frames
                .map(|id| {
                    snapshot
                        .stack_frames(id)
                        .map(|f| {
                            (
                                f.name.clone(),
                                f.filename.clone(),
                                f.line.as_i64().unwrap_or(i64::MIN),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}
