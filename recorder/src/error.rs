//! Errors of the recorder. Allocation failures are values, never panics: the process hosting
//! the recorder (a training job) must survive them.

use memsnap_format::FormatError;

/// A failure reported by a [`crate::Device`] backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The device has no memory left for this request (`cudaErrorMemoryAllocation`).
    #[error("out of device memory allocating {requested} bytes")]
    OutOfMemory { requested: u64 },
    /// The backend cannot do this (for example virtual memory for expandable segments).
    #[error("the device backend does not support {operation}")]
    Unsupported { operation: &'static str },
    /// A pointer the backend did not hand out.
    #[error("pointer {ptr:#x} was not allocated by this device")]
    InvalidPointer { ptr: u64 },
    /// The driver library is missing or has no usable device.
    #[error("{backend} backend unavailable: {reason}")]
    Unavailable {
        backend: &'static str,
        reason: String,
    },
    /// A driver call returned an error code.
    #[error("{call} failed with code {code}: {message}")]
    Driver {
        call: &'static str,
        code: i64,
        message: String,
    },
}

/// Why an allocation finally failed (the values of PyTorch's `OutOfMemoryError` message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomInfo {
    /// Device index of the allocator.
    pub device: i64,
    /// The caller's request in bytes.
    pub requested: u64,
    /// The request after `round_size`.
    pub rounded: u64,
    /// The size of the segment that could not be obtained (what PyTorch reports as
    /// "tried to allocate").
    pub alloc_size: u64,
    /// Free bytes reported by the device at the time of the failure.
    pub device_free: u64,
    /// Total device bytes.
    pub device_total: u64,
    /// The per-process limit when a memory fraction is set, else `None`.
    pub allowed: Option<u64>,
    /// `allocated_bytes.all.current` at the failure.
    pub allocated: u64,
    /// `reserved_bytes.all.current` at the failure.
    pub reserved: u64,
}

impl std::fmt::Display for OomInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "out of memory: tried to allocate {} bytes (request of {} bytes); device {} has a total capacity of {} bytes of which {} bytes are free",
            self.alloc_size, self.requested, self.device, self.device_total, self.device_free
        )?;
        if let Some(allowed) = self.allowed {
            write!(f, "; {allowed} bytes allowed by the memory fraction")?;
        }
        write!(
            f,
            "; {} bytes allocated, {} bytes reserved but unallocated (try expandable_segments:True to reduce fragmentation)",
            self.allocated,
            self.reserved.saturating_sub(self.allocated)
        )
    }
}

/// Everything the allocator API can return as an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No memory left after the whole retry ladder (the `oom` trace entry was recorded and the
    /// OOM observers were called).
    #[error("{0}")]
    OutOfMemory(Box<OomInfo>),
    /// The device failed with something other than out-of-memory.
    #[error("device {device}: {source}")]
    Device {
        device: i64,
        #[source]
        source: DeviceError,
    },
    /// `free` of a pointer this allocator does not hold (never allocated, or freed twice).
    #[error("device {device}: free of pointer {ptr:#x}, which this allocator did not allocate or already freed")]
    UnknownPointer { device: i64, ptr: u64 },
    /// `set_memory_fraction` outside `0.0..=1.0`.
    #[error("memory fraction {fraction} is outside 0.0..=1.0")]
    InvalidFraction { fraction: f64 },
    /// A bad allocator configuration string.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Writing the snapshot failed.
    #[error("writing the snapshot: {0}")]
    Dump(#[from] FormatError),
}

/// A bad `PYTORCH_CUDA_ALLOC_CONF`-style configuration string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("unrecognized key '{key}' in the allocator config (known keys: {known})")]
    UnknownKey { key: String, known: &'static str },
    #[error("allocator config key '{key}': {reason} (got '{value}')")]
    BadValue {
        key: String,
        value: String,
        reason: &'static str,
    },
    #[error("allocator config: expected {expected} at token {position}, found '{found}'")]
    Syntax {
        position: usize,
        expected: &'static str,
        found: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
