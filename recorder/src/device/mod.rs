//! Device backends. The allocator is generic over [`Device`]: where segments come from
//! (`cudaMalloc`), where events live (`cudaEventRecord`), and optional virtual memory for
//! expandable segments.

use crate::error::DeviceError;

mod host;
mod host_tensor;
mod simulated;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "hip")]
pub mod hip;

pub use host::HostDevice;
pub use host_tensor::HostTensor;
pub use simulated::SimulatedDevice;

/// A stream: the raw `cudaStream_t` value as an integer (0 is the legacy default stream).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stream(pub i64);

impl Stream {
    pub const DEFAULT: Stream = Stream(0);
}

impl From<i64> for Stream {
    fn from(raw: i64) -> Self {
        Stream(raw)
    }
}

/// An event recorded on a stream; the backend decides what the handle means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Event(pub u64);

/// Free and total device bytes (`cudaMemGetInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}

/// What the caching allocator needs from a device.
///
/// Implementations must be thread-safe; the allocator calls them while holding its device
/// lock, so they must not call back into the allocator.
pub trait Device: Send + Sync + 'static {
    /// A short description for messages ("simulated 80 GiB", "CUDA device 0", ...).
    fn description(&self) -> String;

    /// `cudaMemGetInfo`.
    fn mem_info(&self) -> Result<MemInfo, DeviceError>;

    /// `cudaMalloc`: a new segment of exactly `size` bytes. Out of memory is
    /// [`DeviceError::OutOfMemory`]; the allocator then tries to free cached memory.
    fn malloc(&self, size: u64) -> Result<u64, DeviceError>;

    /// `cudaFree` of a segment returned by [`Device::malloc`] with that `size`.
    fn free(&self, ptr: u64, size: u64) -> Result<(), DeviceError>;

    /// Records an event on `stream` (after the work queued so far).
    fn record_event(&self, stream: Stream) -> Result<Event, DeviceError>;

    /// Whether the work before `event` is done.
    fn query_event(&self, event: Event) -> Result<bool, DeviceError>;

    /// Waits for `event`.
    fn synchronize_event(&self, event: Event) -> Result<(), DeviceError>;

    /// Releases an event handle (after it completed).
    fn destroy_event(&self, _event: Event) {}

    /// Whether [`Device::reserve`], [`Device::map`] and friends work (expandable segments).
    fn supports_virtual_memory(&self) -> bool {
        false
    }

    /// Reserves `size` bytes of address space without memory behind it.
    fn reserve(&self, _size: u64) -> Result<u64, DeviceError> {
        Err(DeviceError::Unsupported {
            operation: "virtual memory reservation",
        })
    }

    /// Gives back a reservation (all of it must be unmapped).
    fn release_reservation(&self, _addr: u64, _size: u64) -> Result<(), DeviceError> {
        Err(DeviceError::Unsupported {
            operation: "virtual memory reservation",
        })
    }

    /// Puts physical memory behind `[addr, addr + size)` of a reservation.
    fn map(&self, _addr: u64, _size: u64) -> Result<(), DeviceError> {
        Err(DeviceError::Unsupported {
            operation: "virtual memory mapping",
        })
    }

    /// Removes the physical memory behind `[addr, addr + size)`.
    fn unmap(&self, _addr: u64, _size: u64) -> Result<(), DeviceError> {
        Err(DeviceError::Unsupported {
            operation: "virtual memory mapping",
        })
    }
}
