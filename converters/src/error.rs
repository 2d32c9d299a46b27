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
