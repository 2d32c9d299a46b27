//! Errors of the simulator. A hostile or inconsistent file gives one of these (or an anomaly
//! in the report), never a panic.

use memsnap_recorder::ConfigError;

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimulateError {
    /// The file has no `device_traces`, or every trace is empty.
    #[error("the snapshot has no trace events to replay (a segments-only file, or one recorded with enabled=\"state\")")]
    NoTrace,
    /// `--device` named a device without a trace.
    #[error("device {device} has no trace to replay (devices with one: {available:?})")]
    NoSuchDevice { device: i64, available: Vec<i64> },
    /// The settings to simulate do not parse.
    #[error("allocator settings: {source}")]
    Config {
        #[from]
        source: ConfigError,
    },
    /// The allocator reported a device failure other than running out of memory (the file's
    /// state is inconsistent in a way the replay could not absorb).
    #[error("device {device}, event {event}: the allocator failed: {source}")]
    Allocator {
        device: i64,
        event: usize,
        #[source]
        source: memsnap_recorder::Error,
    },
}

pub type Result<T, E = SimulateError> = std::result::Result<T, E>;
