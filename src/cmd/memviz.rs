//! `memsnap memviz`: a drop-in for the text outputs of PyTorch's
//! `python -m torch.cuda._memory_viz`. The reports themselves are
//! `memsnap_converters::memviz`; this is the command line around them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use memsnap_converters::memviz::{self, Check};
use memsnap_converters::ConvertError;

use super::common;

/// Print the text reports of PyTorch's `_memory_viz.py`, byte for byte.
///
/// Each subcommand prints exactly what `python -m torch.cuda._memory_viz <cmd> FILE` prints
/// with torch 2.15. `segments` and `memory` print the collapsed-stack text that Python pipes
/// to flamegraph.pl (one `frame;frame;... bytes` line per block) instead of an SVG: pipe it to
/// `flamegraph.pl --countname bytes` yourself, or load it in speedscope or inferno.
///
/// Unlike Python, any snapshot memsnap reads works: pickle, msgpack or JSON, gzip or zstd.
///
/// `stats`, `segments` and `memory` read only the segments of a pickle laid out as PyTorch
/// writes it (they come first), not the trace behind them, so damage there goes unnoticed;
/// `--validate` reads every byte, as Python does, and checks the invariants `memsnap validate`
/// checks.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  memsnap memviz stats snapshot.pickle          segment page map and totals
  memsnap memviz trace snapshot.pickle | less   every event as pseudo-Python
  memsnap memviz segments snapshot.pickle -o segments.txt
  memsnap memviz memory snapshot.pickle | flamegraph.pl --countname bytes > memory.svg
  memsnap memviz stats --validate snapshot.pickle   read and check the whole file first

Exit codes: 0 success; 1 where Python's script fails too (for example `trace` on a bare
segment list, which has no history), or `--validate` finds a broken invariant; 2 unreadable
input.")]
pub struct Args {
    #[command(subcommand)]
    command: Report,
    /// Decode the whole file (not only what the report needs) and check its invariants.
    #[arg(long, global = true)]
    validate: bool,
}

#[derive(clap::Subcommand)]
enum Report {
    /// Page map of every segment of at least 20 MiB, then reserved, allocated and free totals.
    Stats {
        /// Snapshot file (`-` reads stdin).
        input: PathBuf,
    },
    /// Every trace event as pseudo-Python: `a = seg_0[0:2.0MiB]`, `del a # 2.0MiB`, ...
    ///
    /// Needs a snapshot with history (`device_traces`); fails with exit code 1 on a bare segment
    /// list, like Python.
    Trace {
        /// Snapshot file (`-` reads stdin).
        input: PathBuf,
    },
    /// Collapsed stacks `stream;segment;state;frames bytes`, one line per block.
    Segments {
        /// Snapshot file (`-` reads stdin).
        input: PathBuf,
        /// Write the text to this file instead of stdout.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Collapsed stacks `stream;state;frames bytes`, one line per block (no segment level).
    Memory {
        /// Snapshot file (`-` reads stdin).
        input: PathBuf,
        /// Write the text to this file instead of stdout.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

pub fn run(args: Args) -> Result<ExitCode> {
    let (input, output) = match &args.command {
        Report::Stats { input } | Report::Trace { input } => (input, None),
        Report::Segments { input, output } | Report::Memory { input, output } => {
            (input, output.as_deref())
        }
    };
    let report = match args.command {
        Report::Stats { .. } => memviz::Report::Stats,
        Report::Trace { .. } => memviz::Report::Trace,
        Report::Segments { .. } => memviz::Report::Segments,
        Report::Memory { .. } => memviz::Report::Memory,
    };
    let check = if args.validate {
        Check::Full
    } else {
        Check::Needed
    };
    let read = if input.as_os_str() == "-" {
        let bytes = common::read_input(input)?;
        memviz::read(report, &bytes, check, &mut |_, _| true)
    } else {
        memviz::read_path(report, input, check, &mut |_, _| true)
    };
    let rendered = match read {
        Ok(snapshot) => memviz::render(report, &snapshot),
        // A snapshot that breaks invariants is a failed check (exit 1), as a report Python
        // cannot render is.
        Err(invalid @ ConvertError::Invalid { .. }) => {
            report_failure(input, &invalid);
            return Ok(ExitCode::from(1));
        }
        Err(err) => return Err(common::open_error(input, err)),
    };
    let text = match rendered {
        Ok(text) => text,
        Err(failure) => {
            report_failure(input, &failure);
            return Ok(ExitCode::from(1));
        }
    };
    match output {
        // Atomic, as every file memsnap writes: a failed write leaves no half report.
        Some(path) => memsnap_format::io::write_atomic(path, text.as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => out!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Where Python's script raises (or validation fails) we print nothing on stdout and say why.
fn report_failure(input: &Path, failure: &dyn std::fmt::Display) {
    eprintln!("memsnap: error: {}: {failure}", input.display());
}
