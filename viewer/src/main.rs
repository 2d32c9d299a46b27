//! `memsnap-viewer [FILE…]`: opens the desktop viewer on the given snapshot files.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Desktop viewer for PyTorch GPU memory snapshots.
///
/// Opens pickle (`torch.cuda.memory._dump_snapshot`), memsnap msgpack or JSON snapshots,
/// optionally gzip- or zstd-compressed. Several files open as ranks. Files can also be dropped
/// on the window or opened with File > Open.
#[derive(Parser)]
#[command(name = "memsnap-viewer", version, about, long_about)]
struct Args {
    /// Snapshot files to open.
    files: Vec<PathBuf>,

    /// Open a simulated training run (no file needed).
    #[arg(long)]
    demo: bool,

    /// Measure instead of opening a window: generate (or load FILE) a snapshot, then time the
    /// timeline layout and tessellation of N frames while zooming and panning, and print the
    /// numbers.
    #[arg(long, value_name = "N")]
    bench_frames: Option<usize>,

    /// Trace entries of the generated snapshot for `--bench-frames`.
    #[arg(long, default_value_t = 1_000_000)]
    bench_entries: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.bench_frames {
        Some(frames) => run_bench(&args, frames),
        None => memsnap_viewer::run_native(args.files, args.demo)
            .map_err(|e| anyhow::anyhow!("cannot start the viewer: {e}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("memsnap-viewer: error: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn run_bench(args: &Args, frames: usize) -> anyhow::Result<()> {
    let report = match args.files.first() {
        Some(path) => memsnap_viewer::bench::bench_file(path, frames)?,
        None => memsnap_viewer::bench::bench_generated(args.bench_entries, frames)?,
    };
    println!("{report}");
    Ok(())
}
