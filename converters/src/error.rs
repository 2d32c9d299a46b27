//! The converters' error type.

use std::path::PathBuf;

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
}

/// `Result` with [`ConvertError`].
pub type Result<T, E = ConvertError> = std::result::Result<T, E>;
