//! PyTorch's `_memory_viz.py` text outputs, byte for byte (checked against torch 2.15.0).
//!
//! Each [`Report`] renders exactly what `python -m torch.cuda._memory_viz <report> FILE`
//! prints: [`Report::Stats`] the segment page map and totals, [`Report::Trace`] every event as
//! pseudo-Python, [`Report::Segments`] and [`Report::Memory`] the collapsed-stack text Python
//! pipes to `flamegraph.pl` (one `frame;frame;... bytes` line per block).
//!
//! ```
//! use memsnap_converters::memviz::{self, Check, Report};
//! use memsnap_format::{pickle, Snapshot};
//!
//! let file = pickle::to_vec(&Snapshot::new(1));
//!
//! // `stats` reads only the segments of the file; the trace is never decoded.
//! let read = memviz::read(Report::Stats, &file, Check::Needed, &mut |_, _| true)?;
//! assert!(read.device_traces.is_none());
//! let text = memviz::render(Report::Stats, &read)?;
//! assert!(text.starts_with("Summary of segments >= 20.0MiB in size\nsegments: 0\n"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Numbers are exact: 128-bit integers on the file's exact values, so negative and huge sizes
//! print as Python prints them, and what does not fit is refused ([`MemvizError::Limit`]),
//! never printed wrong. Where Python's script raises, rendering fails with
//! [`MemvizError::LikePython`], quoting Python's exception.

use std::path::Path;

use memsnap_format::io::Progress;
use memsnap_format::pickle::Part;
use memsnap_format::Snapshot;

use crate::OpenOptions;

mod blocks;
mod flame;
mod pyfmt;
mod stats;
mod trace;

/// One of `_memory_viz.py`'s text reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Report {
    /// `segsum()`: the page map of every segment of at least 20 MiB, then the totals.
    Stats,
    /// `trace()`: every trace event as pseudo-Python (`a = seg_0[0:2.0MiB]`, `del a`).
    Trace,
    /// `segments()`: collapsed stacks `stream;segment;state;frames bytes`.
    Segments,
    /// `memory()`: collapsed stacks `stream;state;frames bytes` (no segment level).
    Memory,
}

impl Report {
    /// The part of a snapshot the report reads: everything but `trace` reads the segments only.
    pub fn needs(self) -> Part {
        match self {
            Report::Trace => Part::Whole,
            Report::Stats | Report::Segments | Report::Memory => Part::Segments,
        }
    }
}

/// How much of the input [`read`] decodes and checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Check {
    /// Only what the report needs ([`Report::needs`]): damage in the parts it does not read
    /// goes unnoticed. The fast default.
    #[default]
    Needed,
    /// Every byte decoded, as Python's `pickle.load` does, and the snapshot's invariants
    /// checked as `memsnap validate` checks them: any violation is an error
    /// ([`crate::ConvertError::Invalid`]).
    Full,
}

/// Reasons a report cannot be rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemvizError {
    /// PyTorch's `_memory_viz.py` raises here too; `python` is its exception
    /// (`KeyError: 'device_traces'`), `why` says what is wrong with the input.
    #[error("{why} (PyTorch's _memory_viz.py fails here too: {python})")]
    LikePython { python: String, why: String },
    /// A limit of ours where Python goes on (a number beyond 128 bits).
    #[error("{why}")]
    Limit { why: String },
}

impl MemvizError {
    fn python(python: impl Into<String>, why: String) -> Self {
        MemvizError::LikePython {
            python: python.into(),
            why,
        }
    }

    fn key_error(key: &str, why: String) -> Self {
        MemvizError::python(format!("KeyError: '{key}'"), why)
    }

    fn limit(why: String) -> Self {
        MemvizError::Limit { why }
    }
}

/// Decodes `bytes` (any input memsnap reads: pickle, msgpack or JSON, gzip or zstd) for
/// `report`, through [`OpenOptions`]: with [`Check::Needed`], an uncompressed pickle is read
/// only as far as the report needs ([`Report::needs`]); with [`Check::Full`], the whole input
/// is decoded and validated ([`crate::ConvertError::Invalid`]).
pub fn read(
    report: Report,
    bytes: &[u8],
    check: Check,
    progress: Progress<'_>,
) -> crate::Result<Snapshot> {
    let import = options(report, check, progress).open_bytes(bytes, Path::new("<input>"))?;
    Ok(import.snapshot)
}

/// [`read`] from a file. With [`Check::Needed`], only the part of an uncompressed pickle the
/// report needs is read from the disk: a million-entry trace behind the segments is never
/// loaded for `stats`.
pub fn read_path(
    report: Report,
    path: &Path,
    check: Check,
    progress: Progress<'_>,
) -> crate::Result<Snapshot> {
    Ok(options(report, check, progress).open(path)?.snapshot)
}

/// What `report` needs read, and checked, to be printed.
fn options<'a>(report: Report, check: Check, progress: Progress<'a>) -> OpenOptions<'a> {
    let (part, validate) = match check {
        Check::Needed => (report.needs(), false),
        Check::Full => (Part::Whole, true),
    };
    OpenOptions::new()
        .progress(progress)
        .part(part)
        .validate(validate)
}

/// The text `report` prints for `snapshot`, final newline included, exactly as Python's.
pub fn render(report: Report, snapshot: &Snapshot) -> Result<String, MemvizError> {
    match report {
        Report::Stats => stats::stats(snapshot),
        Report::Trace => trace::trace(snapshot),
        Report::Segments => flame::collapsed(snapshot, true),
        Report::Memory => flame::collapsed(snapshot, false),
    }
}

/// An exact int as `i128`, which holds every value PyTorch writes (and sums of them). Python's
/// ints are unbounded; we refuse what does not fit rather than print a wrong number.
fn wide(v: &memsnap_format::PyInt, place: &dyn Fn() -> String) -> Result<i128, MemvizError> {
    v.as_i128().ok_or_else(|| {
        MemvizError::limit(format!(
            "{}: the integer {v} is too large for memsnap memviz (128-bit arithmetic)",
            place()
        ))
    })
}

/// `a + b` or `a - b` on exact ints, refused where 128 bits overflow.
fn checked(r: Option<i128>, place: &dyn Fn() -> String) -> Result<i128, MemvizError> {
    r.ok_or_else(|| {
        MemvizError::limit(format!(
            "{}: a sum overflows memsnap memviz's 128-bit arithmetic",
            place()
        ))
    })
}
