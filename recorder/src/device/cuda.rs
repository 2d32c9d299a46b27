//! `CudaDevice`: segments from `cuMemAlloc` through cudarc's driver API, loaded at run time.
//!
//! cudarc panics when `libcuda` is missing or lacks a symbol; the driver library is therefore
//! probed with `is_culib_present()` first, and every driver call runs inside `catch_unwind`, so
//! a machine without a driver gets [`DeviceError::Unavailable`] and never a panic.
#![allow(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

use super::{Device, Event, MemInfo, Stream};
use crate::error::DeviceError;

/// One CUDA device through its primary context.
pub struct CudaDevice {
    ordinal: usize,
    /// `CUcontext` (a pointer owned by the driver), kept as an integer to be `Send + Sync`.
    context: usize,
    total: u64,
}

fn driver_error(call: &'static str, e: DriverError) -> DeviceError {
    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return DeviceError::OutOfMemory { requested: 0 };
    }
    let message = catch_unwind(|| e.error_string().map(|s| s.to_string_lossy().into_owned()))
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| format!("{:?}", e.0));
    DeviceError::Driver {
        call,
        code: e.0 as i64,
        message,
    }
}

/// Runs a driver call, turning cudarc's panics (missing library or symbol) into errors.
fn guarded<T>(
    call: &'static str,
    f: impl FnOnce() -> Result<T, DriverError>,
) -> Result<T, DeviceError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(driver_error(call, e)),
        Err(panic) => Err(DeviceError::Unavailable {
            backend: "cuda",
            reason: format!(
                "{call}: {}",
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("the driver library failed")
            ),
        }),
    }
}

impl CudaDevice {
    /// Opens CUDA device `ordinal`. Without `libcuda` (no NVIDIA driver), or without a device,
    /// returns [`DeviceError::Unavailable`].
    pub fn new(ordinal: usize) -> Result<Self, DeviceError> {
        // SAFETY: only tries to dlopen the driver library by its usual names.
        let present = catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
        if !present {
            return Err(DeviceError::Unavailable {
                backend: "cuda",
                reason: "the CUDA driver library (libcuda.so.1) was not found; \
                         is the NVIDIA driver installed?"
                    .into(),
            });
        }
        let ordinal_c = i32::try_from(ordinal).map_err(|_| DeviceError::Unavailable {
            backend: "cuda",
            reason: format!("device ordinal {ordinal} is out of range"),
        })?;
        let unavailable = |e: DeviceError| match e {
            DeviceError::Unavailable { .. } => e,
            other => DeviceError::Unavailable {
                backend: "cuda",
                reason: format!("cannot open CUDA device {ordinal}: {other}"),
            },
        };
        guarded("cuInit", result::init).map_err(unavailable)?;
        let dev = guarded("cuDeviceGet", || result::device::get(ordinal_c)).map_err(unavailable)?;
        // SAFETY: `dev` is a valid device handle from cuDeviceGet.
        let context = guarded("cuDevicePrimaryCtxRetain", || unsafe {
            result::primary_ctx::retain(dev)
        })
        .map_err(unavailable)?;
        // SAFETY: `context` was just retained.
        guarded("cuCtxSetCurrent", || unsafe {
            result::ctx::set_current(context)
        })
        .map_err(unavailable)?;
        // SAFETY: `dev` is a valid device handle.
        let total = guarded("cuDeviceTotalMem", || unsafe {
            result::device::total_mem(dev)
        })
        .map_err(unavailable)? as u64;
        Ok(CudaDevice {
            ordinal,
            context: context as usize,
            total,
        })
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Makes the primary context current on the calling thread (contexts are per thread).
    fn make_current(&self) -> Result<(), DeviceError> {
        // SAFETY: `self.context` is the primary context retained in `new` and never released
        // while `self` lives.
        guarded("cuCtxSetCurrent", || unsafe {
            result::ctx::set_current(self.context as sys::CUcontext)
        })
    }
}

impl Device for CudaDevice {
    fn description(&self) -> String {
        format!("CUDA device {} ({} bytes)", self.ordinal, self.total)
    }

    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        self.make_current()?;
        let (free, total) = guarded("cuMemGetInfo", result::mem_get_info)?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn malloc(&self, size: u64) -> Result<u64, DeviceError> {
        self.make_current()?;
        let bytes =
            usize::try_from(size).map_err(|_| DeviceError::OutOfMemory { requested: size })?;
        // SAFETY: the context is current; the returned memory is owned by the allocator until
        // it calls `free`.
        match guarded("cuMemAlloc", || unsafe { result::malloc_sync(bytes) }) {
            Ok(ptr) => Ok(ptr),
            Err(DeviceError::OutOfMemory { .. }) => {
                Err(DeviceError::OutOfMemory { requested: size })
            }
            Err(e) => Err(e),
        }
    }

    fn free(&self, ptr: u64, _size: u64) -> Result<(), DeviceError> {
        self.make_current()?;
        // SAFETY: `ptr` came from `malloc` above and the allocator frees it once.
        guarded("cuMemFree", || unsafe { result::free_sync(ptr) })
    }

    fn record_event(&self, stream: Stream) -> Result<Event, DeviceError> {
        self.make_current()?;
        let event = guarded("cuEventCreate", || {
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
        })?;
        // SAFETY: `event` was just created; `stream` is the caller's stream handle (0 is the
        // legacy default stream).
        let recorded = guarded("cuEventRecord", || unsafe {
            result::event::record(event, stream.0 as usize as sys::CUstream)
        });
        if let Err(e) = recorded {
            // SAFETY: `event` is valid and not used afterwards.
            let _ = guarded("cuEventDestroy", || unsafe {
                result::event::destroy(event)
            });
            return Err(e);
        }
        Ok(Event(event as usize as u64))
    }

    fn query_event(&self, event: Event) -> Result<bool, DeviceError> {
        self.make_current()?;
        // SAFETY: `event` was created by `record_event` and not destroyed yet.
        let status =
            catch_unwind(|| unsafe { result::event::query(event.0 as usize as sys::CUevent) });
        match status {
            Ok(Ok(())) => Ok(true),
            Ok(Err(e)) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Ok(Err(e)) => Err(driver_error("cuEventQuery", e)),
            Err(_) => Err(DeviceError::Unavailable {
                backend: "cuda",
                reason: "cuEventQuery is missing from the driver library".into(),
            }),
        }
    }

    fn synchronize_event(&self, event: Event) -> Result<(), DeviceError> {
        self.make_current()?;
        // SAFETY: `event` was created by `record_event` and not destroyed yet.
        guarded("cuEventSynchronize", || unsafe {
            result::event::synchronize(event.0 as usize as sys::CUevent)
        })
    }

    fn destroy_event(&self, event: Event) {
        // SAFETY: the allocator destroys each event once, after it completed.
        let _ = guarded("cuEventDestroy", || unsafe {
            result::event::destroy(event.0 as usize as sys::CUevent)
        });
    }
}
