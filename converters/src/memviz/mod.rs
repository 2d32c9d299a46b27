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

use std::fs::File;
use std::io::Read;
use std::path::Path;

use memsnap_format::io::Progress;
use memsnap_format::pickle::Part;
use memsnap_format::{Compression, Format, Snapshot};

use crate::ConvertError;

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
    /// checked as `memsnap validate` checks them: any violation is an error.
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
    /// [`Check::Full`] found broken invariants (one line each, with where they are).
    #[error("the snapshot breaks {} invariant(s):\n{}", problems.len(), problems.join("\n"))]
    Invalid { problems: Vec<String> },
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
/// `report`. With [`Check::Needed`], an uncompressed pickle is read only as far as the report
/// needs ([`memsnap_format::pickle::read_part`]); with [`Check::Full`], the whole input is
/// decoded and validated.
pub fn read(
    report: Report,
    bytes: &[u8],
    check: Check,
    progress: Progress<'_>,
) -> crate::Result<Snapshot> {
    let snapshot = match check {
        Check::Needed if is_plain_pickle(bytes) => {
            memsnap_format::pickle::read_part(bytes, report.needs(), progress)?
        }
        _ => crate::open_bytes_with(bytes, progress)?.0,
    };
    if check == Check::Full {
        validated(&snapshot)?;
    }
    Ok(snapshot)
}

/// [`read`] from a file. With [`Check::Needed`], only the part of an uncompressed pickle the
/// report needs is read from the disk ([`memsnap_format::pickle::read_part_from`]): a
/// million-entry trace behind the segments is never loaded for `stats`.
pub fn read_path(
    report: Report,
    path: &Path,
    check: Check,
    progress: Progress<'_>,
) -> crate::Result<Snapshot> {
    let io_error = |source| ConvertError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io_error)?;
    let len = file.metadata().map_err(io_error)?.len();
    let mut magic = Vec::with_capacity(MAGIC_LEN);
    (&mut file)
        .take(MAGIC_LEN as u64)
        .read_to_end(&mut magic)
        .map_err(io_error)?;
    let snapshot = if check == Check::Needed && is_plain_pickle(&magic) {
        let stream = std::io::Cursor::new(magic).chain(file);
        memsnap_format::pickle::read_part_from(stream, len, report.needs(), progress)?
    } else {
        drop(file);
        crate::open_path_with(path, progress)?.0
    };
    if check == Check::Full {
        validated(&snapshot)?;
    }
    Ok(snapshot)
}

/// Enough of a file to tell its format and compression apart.
const MAGIC_LEN: usize = 8;

fn is_plain_pickle(bytes: &[u8]) -> bool {
    Format::detect(bytes) == Some(Format::Pickle) && Compression::detect(bytes) == Compression::None
}

/// [`Check::Full`]'s invariant checks.
fn validated(snapshot: &Snapshot) -> Result<(), MemvizError> {
    let problems = memsnap_format::validate(snapshot);
    if problems.is_empty() {
        return Ok(());
    }
    let problems = problems.iter().map(ToString::to_string).collect();
    Err(MemvizError::Invalid { problems })
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
