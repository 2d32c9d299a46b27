//! Real host memory as a "device", for CPU training binaries.
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::collections::HashMap;

use parking_lot::Mutex;

use super::{Device, Event, MemInfo, Stream};
use crate::error::DeviceError;

/// Segment alignment (what `cudaMalloc` guarantees is 256; the allocator works in 512s).
const HOST_ALIGN: usize = 512;

/// Host memory from the global allocator, limited to `capacity` bytes. Work is synchronous,
/// so every event is complete when recorded.
pub struct HostDevice {
    capacity: u64,
    state: Mutex<HostState>,
}

struct HostState {
    used: u64,
    live: HashMap<u64, Layout>,
}

impl HostDevice {
    pub fn new(capacity: u64) -> Self {
        HostDevice {
            capacity,
            state: Mutex::new(HostState {
                used: 0,
                live: HashMap::new(),
            }),
        }
    }
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        for (ptr, layout) in self.state.get_mut().live.drain() {
            // SAFETY: `ptr` came from `std::alloc::alloc` with this `layout` and was not freed
            // (it is still in `live`).
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        }
    }
}

impl Device for HostDevice {
    fn description(&self) -> String {
        format!("host memory limited to {} bytes", self.capacity)
    }

    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        let used = self.state.lock().used;
        Ok(MemInfo {
            free: self.capacity.saturating_sub(used),
            total: self.capacity,
        })
    }

    fn malloc(&self, size: u64) -> Result<u64, DeviceError> {
        let mut state = self.state.lock();
        if size == 0 || state.used.saturating_add(size) > self.capacity {
            return Err(DeviceError::OutOfMemory { requested: size });
        }
        let layout = usize::try_from(size)
            .ok()
            .and_then(|s| Layout::from_size_align(s, HOST_ALIGN).ok())
            .ok_or(DeviceError::OutOfMemory { requested: size })?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(DeviceError::OutOfMemory { requested: size });
        }
        state.used += size;
        state.live.insert(ptr as u64, layout);
        Ok(ptr as u64)
    }

    fn free(&self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        let mut state = self.state.lock();
        match state.live.get(&ptr) {
            Some(layout) if layout.size() as u64 == size => {}
            _ => return Err(DeviceError::InvalidPointer { ptr }),
        }
        let Some(layout) = state.live.remove(&ptr) else {
            return Err(DeviceError::InvalidPointer { ptr });
        };
        // SAFETY: `ptr` is live (it was in `live`) and was allocated with `layout`.
        unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        state.used -= size;
        Ok(())
    }

    fn record_event(&self, _stream: Stream) -> Result<Event, DeviceError> {
        Ok(Event(0))
    }

    fn query_event(&self, _event: Event) -> Result<bool, DeviceError> {
        Ok(true)
    }

    fn synchronize_event(&self, _event: Event) -> Result<(), DeviceError> {
        Ok(())
    }
}
