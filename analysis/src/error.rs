//! Errors of the analysis crate.
//!
//! Analysis never fails on odd-but-valid histories (frees without allocs, empty traces,
//! missing times): those are accounted for and reported. Errors are for requests that cannot
//! be answered at all.

/// A request the analysis cannot answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AnalysisError {
    /// The device has neither a trace nor segments in the snapshot.
    #[error("device {device} is not in the snapshot (devices: {available:?})")]
    NoSuchDevice { device: i64, available: Vec<i64> },

    /// A device trace longer than event indices (`u32`) can address.
    #[error("device {device} has {entries} trace entries; at most {max} are supported")]
    TooManyEntries {
        device: i64,
        entries: usize,
        max: usize,
    },

    /// A layout or query request with parameters that make no sense (zero width, NaN range).
    #[error("invalid request: {what}")]
    InvalidRequest { what: String },
}

pub type Result<T, E = AnalysisError> = std::result::Result<T, E>;
