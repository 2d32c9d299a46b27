//! Errors of the format crate. Every error says what went wrong and where: a byte offset for
//! the pickle and msgpack decoders, a path into the snapshot (`device_traces[0][17].size`) for
//! schema problems.

use std::path::PathBuf;

/// Everything that can go wrong reading or writing a snapshot.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The pickle stream is malformed, truncated, hostile or too large.
    #[error("pickle: {what} at byte {offset}")]
    Pickle { offset: u64, what: String },

    /// The decoded data does not have the snapshot schema.
    #[error("snapshot schema: {path}: {what}")]
    Schema { path: String, what: String },

    #[error("JSON: {what} (line {line}, column {column})")]
    Json {
        line: usize,
        column: usize,
        what: String,
    },

    #[error("msgpack: {what}")]
    Msgpack { what: String },

    /// Not a pickle, msgpack or JSON snapshot (after decompression).
    #[error("unrecognised file format: {what}")]
    UnknownFormat { what: String },

    #[error("{codec} decompression failed: {what}")]
    Decompress { codec: &'static str, what: String },

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The input stream failed while a snapshot was being decoded from it.
    #[error("read failed at byte {offset}: {source}")]
    Read {
        offset: u64,
        #[source]
        source: std::io::Error,
    },

    /// The output failed while a snapshot was being written to it.
    #[error("write failed: {source}")]
    Write {
        #[source]
        source: std::io::Error,
    },

    /// Reading was cancelled through the progress callback.
    #[error("cancelled")]
    Cancelled,
}

impl FormatError {
    pub(crate) fn schema(path: impl Into<String>, what: impl Into<String>) -> Self {
        FormatError::Schema {
            path: path.into(),
            what: what.into(),
        }
    }
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;
