//! `memsnap view`: opens snapshots in the desktop viewer (`memsnap-viewer`, built beside this
//! binary). Kept as a separate program so the CLI does not link the GUI stack.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};

/// Open snapshots in the desktop viewer.
///
/// Launches `memsnap-viewer` from the folder this binary lives in (or from PATH). Files can
/// also be dragged onto the viewer window later.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  memsnap view snapshot.pickle\n  memsnap view rank0.pickle rank1.pickle"
)]
pub struct Args {
    /// Snapshot files to open (pickle, msgpack or JSON; gzip/zstd allowed).
    pub files: Vec<PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let viewer = viewer_path().context(
        "the viewer is not built: run `cargo build --release -p memsnap-viewer` \
         (it is placed beside `memsnap`), then try again",
    )?;
    let status = Command::new(&viewer)
        .args(&args.files)
        .status()
        .with_context(|| format!("cannot start {}", viewer.display()))?;
    if !status.success() {
        bail!("{} exited with {status}", viewer.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `memsnap-viewer` beside the current executable, else on PATH.
pub fn viewer_path() -> Option<PathBuf> {
    let name = format!("memsnap-viewer{}", std::env::consts::EXE_SUFFIX);
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(&name)));
    if let Some(p) = beside.filter(|p| p.is_file()) {
        return Some(p);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(&name))
            .find(|p| Path::new(p).is_file())
    })
}
