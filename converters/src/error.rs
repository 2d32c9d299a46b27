//! The converters' error type.

use std::path::{Path, PathBuf};

/// Everything a conversion can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// The input is one of memsnap's own formats and its reader failed.
    #[error(transparent)]
    Format(#[from] memsnap_format::FormatError),
    /// A `_memory_viz.py` report cannot be rendered ([`crate::memviz`]).
    #[error(transparent)]
    Memviz(#[from] crate::memviz::MemvizError),
    /// The snapshot's analysis (replay, curves) failed while exporting.
    #[error(transparent)]
    Analysis(#[from] memsnap_analysis::AnalysisError),
    /// Writing an export to a stream failed (see [`ConvertError::Io`] for files).
    #[error("cannot write the output: {source}")]
    Write {
        #[source]
        source: std::io::Error,
    },
    /// A trace (Chrome trace, torch.profiler, memory timeline) cannot be imported.
    #[error("{}: {source}", path.display())]
    Trace {
        path: PathBuf,
        #[source]
        source: crate::torch::TraceError,
    },
    /// A ROCm trace cannot be imported ([`crate::rocm`]).
    #[error(transparent)]
    Rocm(#[from] crate::rocm::RocmError),
    /// A flame graph or pprof profile cannot be made ([`crate::profile`]).
    #[error(transparent)]
    Profile(#[from] crate::profile::ProfileError),
    /// A Parquet export failed ([`crate::parquet`]).
    #[error(transparent)]
    Parquet(#[from] crate::parquet::ParquetError),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The snapshot breaks invariants that [`crate::OpenOptions::validate`] asked to check, as
    /// `memsnap validate` checks them (one line each, with where they are).
    #[error("the snapshot breaks {} invariant(s):\n{}", problems.len(), problems.join("\n"))]
    Invalid { problems: Vec<String> },
}

/// What kind of failure a [`ConvertError`] is, for the person who tried to open a file.
///
/// Front ends word a failed open differently (the command line says `cannot read FILE: ...`,
/// the viewer shows a notice), but which errors are I/O, which were a cancel, and which
/// messages name the file already is decided here, once, by [`ConvertError::failure`].
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Failure<'a> {
    /// The progress callback asked to stop ([`memsnap_format::FormatError::Cancelled`]).
    Cancelled,
    /// The input could not be read. `source` does not name the file; `path` does.
    Read {
        path: &'a Path,
        source: &'a std::io::Error,
    },
    /// The input was read but is not a snapshot memsnap can decode (or breaks the invariants
    /// it was asked to check). The message does not name the file: put its name in front.
    Decode,
    /// Another tool's recording that cannot be imported. The message starts with the file's
    /// path already; [`ConvertError::reason`] is the message without it.
    Import,
}

impl ConvertError {
    /// Which kind of failure this is (see [`Failure`]).
    pub fn failure(&self) -> Failure<'_> {
        use memsnap_format::FormatError;
        match self {
            ConvertError::Format(FormatError::Cancelled) => Failure::Cancelled,
            ConvertError::Format(FormatError::Io { path, source })
            | ConvertError::Io { path, source } => Failure::Read { path, source },
            ConvertError::Trace { .. } | ConvertError::Rocm(_) => Failure::Import,
            _ => Failure::Decode,
        }
    }

    /// What went wrong, for a caller that names the file itself: the message without the path
    /// a trace import's message starts with ([`ConvertError::Trace`]).
    pub fn reason(&self) -> String {
        match self {
            ConvertError::Trace { source, .. } => source.to_string(),
            other => other.to_string(),
        }
    }
}

/// `Result` with [`ConvertError`].
pub type Result<T, E = ConvertError> = std::result::Result<T, E>;
