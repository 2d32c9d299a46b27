//! A device with an address range and a capacity but no memory behind it: an 80 GB "GPU" on a
//! laptop, deterministic, for tests and what-if runs.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;

use super::{Device, Event, MemInfo, Stream};
use crate::error::DeviceError;

/// Addresses the simulated device hands out start here (a typical CUDA heap address).
pub const SIMULATED_BASE: u64 = 0x7f00_0000_0000;
/// Alignment of every simulated `malloc` and reservation.
const ALIGN: u64 = 2 << 20;

/// A simulated GPU: segments get distinct, reused, 2 MiB-aligned addresses from a fixed
/// range, and `capacity` bytes can be held at once. Nothing is backed by real memory.
///
/// Events complete immediately unless [`SimulatedDevice::with_manual_events`] is used; then
/// they stay pending until [`SimulatedDevice::complete_stream`] or
/// [`SimulatedDevice::complete_all_events`] (or a synchronisation) — the way to test
/// `record_stream`.
pub struct SimulatedDevice {
    capacity: u64,
    manual_events: bool,
    state: Mutex<SimState>,
}

struct SimState {
    used: u64,
    /// Free address ranges: start -> length.
    free_ranges: BTreeMap<u64, u64>,
    /// Live allocations and reservations: start -> (length, is_reservation).
    live: HashMap<u64, (u64, bool)>,
    /// Mapped bytes per reservation start (used only for checks).
    mapped: BTreeMap<u64, u64>,
    next_event: u64,
    pending_events: HashMap<u64, Stream>,
    fail_next_malloc: Option<DeviceError>,
}

impl SimulatedDevice {
    /// A device with `capacity` bytes of memory.
    pub fn new(capacity: u64) -> Self {
        // Address space: 4x the capacity plus headroom, so expandable reservations (1.125x)
        // and fragmentation of the address range never run out before memory does.
        let span = capacity
            .saturating_mul(4)
            .saturating_add(1 << 40)
            .min(u64::MAX - SIMULATED_BASE);
        let mut free_ranges = BTreeMap::new();
        free_ranges.insert(SIMULATED_BASE, span);
        SimulatedDevice {
            capacity,
            manual_events: false,
            state: Mutex::new(SimState {
                used: 0,
                free_ranges,
                live: HashMap::new(),
                mapped: BTreeMap::new(),
                next_event: 1,
                pending_events: HashMap::new(),
                fail_next_malloc: None,
            }),
        }
    }

    /// Events stay pending until completed explicitly.
    pub fn with_manual_events(mut self) -> Self {
        self.manual_events = true;
        self
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes currently held (malloc'd plus mapped).
    pub fn used(&self) -> u64 {
        self.state.lock().used
    }

    /// Number of live `malloc` segments and reservations.
    pub fn live_allocations(&self) -> usize {
        self.state.lock().live.len()
    }

    /// Completes every pending event recorded on `stream`.
    pub fn complete_stream(&self, stream: Stream) {
        self.state.lock().pending_events.retain(|_, s| *s != stream);
    }

    /// Completes every pending event.
    pub fn complete_all_events(&self) {
        self.state.lock().pending_events.clear();
    }

    /// Number of events not completed yet.
    pub fn pending_events(&self) -> usize {
        self.state.lock().pending_events.len()
    }

    /// Makes the next `malloc` fail with `error` (fault injection for tests).
    pub fn fail_next_malloc(&self, error: DeviceError) {
        self.state.lock().fail_next_malloc = Some(error);
    }

    fn take_range(state: &mut SimState, size: u64) -> Option<u64> {
        let len = size.checked_next_multiple_of(ALIGN)?;
        let (&start, &free_len) = state.free_ranges.iter().find(|(_, &l)| l >= len)?;
        state.free_ranges.remove(&start);
        if free_len > len {
            state.free_ranges.insert(start + len, free_len - len);
        }
        Some(start)
    }

    fn return_range(state: &mut SimState, start: u64, size: u64) {
        let mut start = start;
        let mut len = size.next_multiple_of(ALIGN);
        // Merge with the following and the preceding free range.
        if let Some(next_len) = state.free_ranges.remove(&(start + len)) {
            len += next_len;
        }
        if let Some((&prev_start, &prev_len)) = state.free_ranges.range(..start).next_back() {
            if prev_start + prev_len == start {
                state.free_ranges.remove(&prev_start);
                start = prev_start;
                len += prev_len;
            }
        }
        state.free_ranges.insert(start, len);
    }
}

impl Device for SimulatedDevice {
    fn description(&self) -> String {
        format!("simulated device with {} bytes", self.capacity)
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
        if let Some(error) = state.fail_next_malloc.take() {
            return Err(error);
        }
        if size == 0 || state.used.saturating_add(size) > self.capacity {
            return Err(DeviceError::OutOfMemory { requested: size });
        }
        let ptr = Self::take_range(&mut state, size)
            .ok_or(DeviceError::OutOfMemory { requested: size })?;
        state.used += size;
        state.live.insert(ptr, (size, false));
        Ok(ptr)
    }

    fn free(&self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        let mut state = self.state.lock();
        match state.live.get(&ptr) {
            Some(&(len, false)) if len == size => {}
            _ => return Err(DeviceError::InvalidPointer { ptr }),
        }
        state.live.remove(&ptr);
        state.used -= size;
        Self::return_range(&mut state, ptr, size);
        Ok(())
    }

    fn record_event(&self, stream: Stream) -> Result<Event, DeviceError> {
        let mut state = self.state.lock();
        let id = state.next_event;
        state.next_event += 1;
        if self.manual_events {
            state.pending_events.insert(id, stream);
        }
        Ok(Event(id))
    }

    fn query_event(&self, event: Event) -> Result<bool, DeviceError> {
        Ok(!self.state.lock().pending_events.contains_key(&event.0))
    }

    fn synchronize_event(&self, event: Event) -> Result<(), DeviceError> {
        self.state.lock().pending_events.remove(&event.0);
        Ok(())
    }

    fn supports_virtual_memory(&self) -> bool {
        true
    }

    fn reserve(&self, size: u64) -> Result<u64, DeviceError> {
        let mut state = self.state.lock();
        let ptr = Self::take_range(&mut state, size)
            .ok_or(DeviceError::OutOfMemory { requested: size })?;
        state.live.insert(ptr, (size, true));
        state.mapped.insert(ptr, 0);
        Ok(ptr)
    }

    fn release_reservation(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let mut state = self.state.lock();
        match (state.live.get(&addr), state.mapped.get(&addr)) {
            (Some(&(len, true)), Some(0)) if len == size => {}
            _ => return Err(DeviceError::InvalidPointer { ptr: addr }),
        }
        state.live.remove(&addr);
        state.mapped.remove(&addr);
        Self::return_range(&mut state, addr, size);
        Ok(())
    }

    fn map(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let mut state = self.state.lock();
        let base = reservation_of(&state, addr, size)?;
        if state.used.saturating_add(size) > self.capacity {
            return Err(DeviceError::OutOfMemory { requested: size });
        }
        state.used += size;
        *state.mapped.entry(base).or_insert(0) += size;
        Ok(())
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let mut state = self.state.lock();
        let base = reservation_of(&state, addr, size)?;
        let mapped = state.mapped.entry(base).or_insert(0);
        if *mapped < size {
            return Err(DeviceError::InvalidPointer { ptr: addr });
        }
        *mapped -= size;
        state.used -= size;
        Ok(())
    }
}

/// The reservation holding `[addr, addr + size)`.
fn reservation_of(state: &SimState, addr: u64, size: u64) -> Result<u64, DeviceError> {
    let (&base, _) = state
        .mapped
        .range(..=addr)
        .next_back()
        .ok_or(DeviceError::InvalidPointer { ptr: addr })?;
    match state.live.get(&base) {
        Some(&(len, true)) if addr.saturating_add(size) <= base + len => Ok(base),
        _ => Err(DeviceError::InvalidPointer { ptr: addr }),
    }
}
