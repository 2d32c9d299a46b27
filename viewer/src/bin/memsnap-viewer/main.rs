//! `memsnap-viewer [FILE…]`: opens the desktop viewer on the given snapshot files;
//! `memsnap-viewer --bench-frames N`: measures it instead ([`bench`]).

mod bench;
mod bench_attach;
mod bench_window;

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

    /// Attach to a live recording (`unix:/path.sock`, `tcp:127.0.0.1:PORT` or a socket path;
    /// a program serves one with `CachingAllocator::serve_live`): the timeline grows as
    /// the program runs. Repeat it to attach to several.
    #[arg(long, value_name = "ADDR")]
    attach: Vec<String>,

    /// The token of a recorder run with `MEMSNAP_LIVE_TOKEN` (needed to attach to one that
    /// serves other machines, `tcp:0.0.0.0:PORT`); default `$MEMSNAP_LIVE_TOKEN`. Also in
    /// File → Attach.
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,

    /// Measure instead of opening a window: generate snapshots (see `--bench-entries`) or
    /// load each FILE, then time the analysis the picture needs, the first frame, and the
    /// timeline layout and tessellation of N frames while zooming and panning, and print the
    /// numbers (with the triangles per frame, which do not depend on how busy the CPU is).
    /// Run it under `/usr/bin/time -v` for the peak memory, one size at a time.
    #[arg(long, value_name = "N")]
    bench_frames: Option<usize>,

    /// Measure attaching instead of opening a window: record N entries in this process on
    /// the host backend, serving them live, while a live session attached to them is polled
    /// as the window polls it; print the updates per second, each rebuild's duration and
    /// the peak memory.
    #[arg(long, value_name = "N")]
    bench_attach: Option<u64>,

    /// How long the `--bench-attach` recording takes (its entries at an even pace).
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    bench_attach_seconds: f64,

    /// With `--bench-attach`: attach the real window instead (vsync off, a frame asked for
    /// after every frame) and print its frame intervals while the entries arrive and, once
    /// all are shown, while the pointer hovers and the wheel zooms and pans for this long.
    #[arg(long, value_name = "SECONDS", requires = "bench_attach")]
    bench_window: Option<f64>,

    /// Trace entries of the generated snapshots for `--bench-frames`, one run each
    /// (comma-separated). The 10M run needs about 2 GB of memory.
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000")]
    bench_entries: Vec<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match (args.bench_frames, args.bench_attach) {
        (Some(frames), _) => run_bench(&args, frames),
        (None, Some(entries)) => match args.bench_window {
            Some(after) => bench_window::bench_window(entries, args.bench_attach_seconds, after),
            None => bench_attach::bench_attach(entries, args.bench_attach_seconds),
        }
        .map(|report| print!("{report}")),
        (None, None) => start(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("memsnap-viewer: error: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn start(args: Args) -> anyhow::Result<()> {
    let attach = args
        .attach
        .iter()
        .map(|a| {
            memsnap_viewer::live::Address::parse(a)
                .map_err(|e| anyhow::anyhow!("--attach {a}: {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let token = args
        .token
        .or_else(|| std::env::var("MEMSNAP_LIVE_TOKEN").ok())
        .filter(|t| !t.is_empty());
    memsnap_viewer::run_native(args.files, args.demo, attach, token)
        .map_err(|e| anyhow::anyhow!("cannot start the viewer: {e}"))
}

fn run_bench(args: &Args, frames: usize) -> anyhow::Result<()> {
    if args.files.is_empty() {
        for (i, &entries) in args.bench_entries.iter().enumerate() {
            if i > 0 {
                println!();
            }
            println!("{}", bench::bench_generated(entries, frames)?);
        }
    }
    for (i, path) in args.files.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!("{}:", path.display());
        println!("{}", bench::bench_file(path, frames)?);
    }
    Ok(())
}
