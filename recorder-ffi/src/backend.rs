//! The device behind the C ABI, chosen at run time (`MEMSNAP_BACKEND`).

use recorder::device::{Device, Event, HostDevice, MemInfo, SimulatedDevice, Stream};
use recorder::DeviceError;

use crate::env::BackendKind;

/// One of the backends, behind one type so the C ABI holds a single allocator type.
pub enum AnyDevice {
    Simulated(SimulatedDevice),
    Host(HostDevice),
    #[cfg(feature = "cuda")]
    Cuda(recorder::CudaDevice),
    #[cfg(feature = "hip")]
    Hip(recorder::HipDevice),
}

impl AnyDevice {
    /// Opens device `index` of `kind`; `capacity` sizes simulated and host devices.
    pub fn open(kind: BackendKind, index: usize, capacity: u64) -> Result<AnyDevice, DeviceError> {
        match kind {
            BackendKind::Simulated => Ok(AnyDevice::Simulated(SimulatedDevice::new(capacity))),
            BackendKind::Host => Ok(AnyDevice::Host(HostDevice::new(capacity))),
            BackendKind::Cuda => open_cuda(index),
            BackendKind::Hip => open_hip(index),
        }
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(index: usize) -> Result<AnyDevice, DeviceError> {
    recorder::CudaDevice::new(index).map(AnyDevice::Cuda)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_index: usize) -> Result<AnyDevice, DeviceError> {
    Err(DeviceError::Unavailable {
        backend: "cuda",
        reason: "this library was built without the `cuda` feature \
                 (cargo build --release -p memsnap-recorder-ffi --features cuda); \
                 MEMSNAP_BACKEND=simulated or host run without a GPU"
            .into(),
    })
}

#[cfg(feature = "hip")]
fn open_hip(index: usize) -> Result<AnyDevice, DeviceError> {
    recorder::HipDevice::new(index).map(AnyDevice::Hip)
}

#[cfg(not(feature = "hip"))]
fn open_hip(_index: usize) -> Result<AnyDevice, DeviceError> {
    Err(DeviceError::Unavailable {
        backend: "hip",
        reason: "this library was built without the `hip` feature \
                 (cargo build --release -p memsnap-recorder-ffi --features hip)"
            .into(),
    })
}

macro_rules! dispatch {
    ($self:ident, $d:ident => $call:expr) => {
        match $self {
            AnyDevice::Simulated($d) => $call,
            AnyDevice::Host($d) => $call,
            #[cfg(feature = "cuda")]
            AnyDevice::Cuda($d) => $call,
            #[cfg(feature = "hip")]
            AnyDevice::Hip($d) => $call,
        }
    };
}

impl Device for AnyDevice {
    fn description(&self) -> String {
        dispatch!(self, d => d.description())
    }

    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        dispatch!(self, d => d.mem_info())
    }

    fn malloc(&self, size: u64) -> Result<u64, DeviceError> {
        dispatch!(self, d => d.malloc(size))
    }

    fn free(&self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        dispatch!(self, d => d.free(ptr, size))
    }

    fn record_event(&self, stream: Stream) -> Result<Event, DeviceError> {
        dispatch!(self, d => d.record_event(stream))
    }

    fn query_event(&self, event: Event) -> Result<bool, DeviceError> {
        dispatch!(self, d => d.query_event(event))
    }

    fn synchronize_event(&self, event: Event) -> Result<(), DeviceError> {
        dispatch!(self, d => d.synchronize_event(event))
    }

    fn destroy_event(&self, event: Event) {
        dispatch!(self, d => d.destroy_event(event))
    }

    fn supports_virtual_memory(&self) -> bool {
        dispatch!(self, d => d.supports_virtual_memory())
    }

    fn reserve(&self, size: u64) -> Result<u64, DeviceError> {
        dispatch!(self, d => d.reserve(size))
    }

    fn release_reservation(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        dispatch!(self, d => d.release_reservation(addr, size))
    }

    fn map(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        dispatch!(self, d => d.map(addr, size))
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        dispatch!(self, d => d.unmap(addr, size))
    }
}
