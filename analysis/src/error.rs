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

    /// An instant past the device's last trace entry.
    #[error("trace entry {event} is past the end of device {device}'s trace ({len} entries)")]
    EventPastEnd { event: u32, device: i64, len: u32 },

    /// A time asked of a trace whose entries have no `time_us` (PyTorch 2.1 files,
    /// segments-only files).
    #[error("device {device} has no trace entry with a time_us: give a trace entry (`--at event:N`), `peak` or `end`")]
    NoTimes { device: i64 },

    /// A time before the device's first trace entry.
    #[error("time_us {time_us} is before device {device}'s first trace entry (time_us {first})")]
    BeforeFirstEntry {
        time_us: i64,
        device: i64,
        first: i64,
    },
}

pub type Result<T, E = AnalysisError> = std::result::Result<T, E>;
