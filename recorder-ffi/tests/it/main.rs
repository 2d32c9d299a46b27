//! Tests of the C ABI and the Python module (one binary, shared helpers here).
//!
//! They run what a user runs: a C program compiled against `memsnap.h` and
//! `libmemsnap_recorder.a`, Python scripts that load `libmemsnap_recorder.so` through ctypes
//! (with the environment alone configuring a run, and a dump on `SIGUSR1`), and the exported
//! functions called in this process through `dlopen`.
//!
//! The crate builds no rlib (see `Cargo.toml`), so cargo does not build its libraries for an
//! integration test: [`built_library`] runs `cargo build` for this crate once, with this test
//! binary's profile and features, into the same target folder, unless
//! `MEMSNAP_RECORDER_LIB_DIR` names a folder where they were already built (see
//! [`LIB_DIR_VARIABLE`]).

mod c_program;
mod live;
mod never_panics;
mod python;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The cargo profile folder holding this test binary (`target/debug`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/debug/deps/it-<hash> -> target/debug
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// Names the folder where `scripts/check.sh` built this crate's library files, in the same
/// `cargo build` as the test binaries: a `cargo build -p memsnap-recorder-ffi` of its own
/// resolves the dependencies' features for this crate alone, so it compiled memsnap-format,
/// memsnap-recorder, serde_json and others a second time (about 30 s of the check's 12 minutes).
const LIB_DIR_VARIABLE: &str = "MEMSNAP_RECORDER_LIB_DIR";

/// Builds this crate's libraries (once per test run) into `target/<profile>/`, or finds them
/// where [`LIB_DIR_VARIABLE`] says they were built.
fn build_libraries() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(LIB_DIR_VARIABLE).filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        return match ["libmemsnap_recorder.so", "libmemsnap_recorder.a"]
            .iter()
            .find(|f| !dir.join(f).is_file())
        {
            Some(missing) => Err(format!(
                "{LIB_DIR_VARIABLE}={} holds no {missing}",
                dir.display()
            )),
            None => Ok(dir),
        };
    }
    let dir = profile_dir();
    let target_dir = dir.parent().ok_or("no target folder")?;
    // `target/debug` holds the dev and the test profile's builds; this binary is the test
    // profile's, and building the libraries with it too reuses its settings.
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "test",
        Some(name) => name,
        None => return Err(format!("{} is not a profile folder", dir.display())),
    };
    let features: Vec<&str> = [
        ("cuda", cfg!(feature = "cuda")),
        ("hip", cfg!(feature = "hip")),
        ("frame-pointers", cfg!(feature = "frame-pointers")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .args(["build", "--locked", "--quiet", "-p", env!("CARGO_PKG_NAME")])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .args(["--profile", profile]);
    if !features.is_empty() {
        cargo.arg("--features").arg(features.join(","));
    }
    let output = cargo
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{cargo:?} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(dir)
}

/// A library file of this crate (`libmemsnap_recorder.so` or `.a`), freshly built.
pub fn built_library(file_name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = match BUILT.get_or_init(build_libraries) {
        Ok(dir) => dir,
        Err(message) => panic!("building the C ABI libraries: {message}"),
    };
    let path = dir.join(file_name);
    assert!(path.is_file(), "cargo build made no {}", path.display());
    path
}

/// Whether `program --version` runs; prints a notice when it does not.
pub fn have_program(program: &str, why: &str) -> bool {
    let ok = Command::new(program)
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
