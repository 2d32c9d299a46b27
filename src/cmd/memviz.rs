//! `memsnap memviz`: a drop-in for the text outputs of PyTorch's
//! `python -m torch.cuda._memory_viz` (checked byte for byte against torch 2.15.0).

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use memsnap_format::Snapshot;

use super::common;

mod blocks;
mod flame;
pub mod pyfmt;
mod segments_only;
mod stats;
mod trace;

/// Print the text reports of PyTorch's `_memory_viz.py`, byte for byte.
///
/// Each subcommand prints exactly what `python -m torch.cuda._memory_viz <cmd> FILE` prints
/// with torch 2.15. `segments` and `memory` print the collapsed-stack text that Python pipes
/// to flamegraph.pl (one `frame;frame;... bytes` line per block) instead of an SVG: pipe it to
/// `flamegraph.pl --countname bytes` yourself, or load it in speedscope or inferno.
///
/// Unlike Python, any snapshot memsnap reads works: pickle, msgpack or JSON, gzip or zstd.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  memsnap memviz stats snapshot.pickle          segment page map and totals
  memsnap memviz trace snapshot.pickle | less   every event as pseudo-Python
  memsnap memviz segments snapshot.pickle -o segments.txt
  memsnap memviz memory snapshot.pickle | flamegraph.pl --countname bytes > memory.svg

Exit codes: 0 success; 1 where Python's script fails too (for example `trace` on a bare
segment list, which has no history); 2 unreadable input.")]
pub struct Args {
    #[command(subcommand)]
    command: Report,
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

/// A place where PyTorch's `_memory_viz.py` raises instead of printing. We stop there too, print
/// nothing to stdout and exit 1 as Python does, and explain why.
#[derive(Debug)]
pub struct ReferenceFailure {
    /// What Python's script raises, e.g. `KeyError: 'device_traces'`.
    python: String,
    /// What is wrong with the input, in words.
    why: String,
}

impl ReferenceFailure {
    fn new(python: impl Into<String>, why: String) -> Self {
        ReferenceFailure {
            python: python.into(),
            why,
        }
    }

    fn key_error(key: &str, why: String) -> Self {
        ReferenceFailure::new(format!("KeyError: '{key}'"), why)
    }

    /// A limit of ours where Python goes on (`python` stays empty).
    fn ours(why: String) -> Self {
        ReferenceFailure::new("", why)
    }
}

/// An exact int as `i128`, which holds every value PyTorch writes (and sums of them). Python's
/// ints are unbounded; we refuse what does not fit rather than print a wrong number.
fn wide(v: &memsnap_format::PyInt, place: &dyn Fn() -> String) -> Result<i128, ReferenceFailure> {
    v.as_i128().ok_or_else(|| {
        ReferenceFailure::ours(format!(
            "{}: the integer {v} is too large for memsnap memviz (128-bit arithmetic)",
            place()
        ))
    })
}

/// `a + b` or `a - b` on exact ints, refused where 128 bits overflow.
fn checked(r: Option<i128>, place: &dyn Fn() -> String) -> Result<i128, ReferenceFailure> {
    r.ok_or_else(|| {
        ReferenceFailure::ours(format!(
            "{}: a sum overflows memsnap memviz's 128-bit arithmetic",
            place()
        ))
    })
}

impl fmt::Display for ReferenceFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.python.is_empty() {
            return f.write_str(&self.why);
        }
        write!(
            f,
            "{} (PyTorch's _memory_viz.py fails here too: {})",
            self.why, self.python
        )
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    let (input, output) = match &args.command {
        Report::Stats { input } | Report::Trace { input } => (input, None),
        Report::Segments { input, output } | Report::Memory { input, output } => {
            (input, output.as_deref())
        }
    };
    let bytes = common::read_input(input)?;
    let snapshot = match args.command {
        Report::Trace { .. } => common::decode(&bytes, input)?.0,
        _ => load_segments(&bytes, input)?,
    };
    let text = match args.command {
        Report::Stats { .. } => stats::stats(&snapshot),
        Report::Trace { .. } => trace::trace(&snapshot),
        Report::Segments { .. } => flame::collapsed(&snapshot, true),
        Report::Memory { .. } => flame::collapsed(&snapshot, false),
    };
    let text = match text {
        Ok(text) => text,
        Err(failure) => {
            eprintln!("memsnap: error: {}: {failure}", input.display());
            return Ok(ExitCode::from(1));
        }
    };
    match output {
        Some(path) => write_file(path, &text)?,
        None => write_stdout(&text)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// A snapshot with at least the file's segments: `stats`, `segments` and `memory` read nothing
/// else, so for a plain pickle we skip decoding the trace (see [`segments_only`]).
fn load_segments(bytes: &[u8], path: &Path) -> Result<Snapshot> {
    if let Some(cut) = segments_only::segments_only_pickle(bytes) {
        if let Ok(snapshot) = memsnap_format::pickle::read(&cut) {
            return Ok(snapshot);
        }
    }
    Ok(common::decode(bytes, path)?.0)
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
fn write_stdout(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("cannot write to stdout"),
    }
}

#[cfg(test)]
mod tests;
