//! The trace device: a simulated GPU that hands out the addresses the trace recorded.
//!
//! Before each replayed step the simulator passes the step's recorded `segment_alloc` /
//! `segment_map` entries as *hints*. A `cudaMalloc` of the same size takes the recorded
//! address (and a fresh expandable reservation starts at the recorded first mapping), so that
//! when the replay makes PyTorch's decision it also gets PyTorch's addresses, and best-fit
//! tie-breaks by address keep lining up. A call without a fitting hint gets an address from a
//! range above everything the file mentions. Memory held before the window is *adopted*.
//!
//! Every successful `cudaMalloc`/`cudaFree`/map/unmap is logged as a [`SegmentDecision`]: the
//! replay's decisions, compared with the recorded ones. Events stay pending until the
//! simulator completes them (at the recorded `free_completed`).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use memsnap_recorder::{Device, DeviceError, Event, MemInfo, Stream};
use serde::Serialize;

/// Alignment of addresses the device invents (`cudaMalloc` gives at least 2 MiB in practice).
const ALIGN: u64 = 2 << 20;

/// A segment-level decision: what PyTorch writes as `segment_alloc`, `segment_free`,
/// `segment_map` or `segment_unmap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentAction {
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
}

impl SegmentAction {
    /// The trace action's name.
    pub fn name(self) -> &'static str {
        match self {
            SegmentAction::SegmentAlloc => "segment_alloc",
            SegmentAction::SegmentFree => "segment_free",
            SegmentAction::SegmentMap => "segment_map",
            SegmentAction::SegmentUnmap => "segment_unmap",
        }
    }

    /// Whether it adds reserved memory.
    pub fn grows(self) -> bool {
        matches!(
            self,
            SegmentAction::SegmentAlloc | SegmentAction::SegmentMap
        )
    }
}

/// One segment decision with its address range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentDecision {
    pub action: SegmentAction,
    pub addr: u64,
    pub size: u64,
}

#[derive(Clone, Copy, Debug)]
enum Range {
    Malloc,
    Reservation { mapped: u64 },
}

struct Inner {
    used: u64,
    /// Live `cudaMalloc`s and reservations: start -> (length, kind). Disjoint.
    live: BTreeMap<u64, (u64, Range)>,
    hints: Vec<(SegmentDecision, bool)>,
    next_fallback: u64,
    next_event: u64,
    pending_events: HashSet<u64>,
    last_event: Option<u64>,
    log: Vec<SegmentDecision>,
}

/// A simulated device with `capacity` bytes that prefers the recorded addresses.
pub struct TraceDevice {
    capacity: u64,
    inner: Mutex<Inner>,
}

impl TraceDevice {
    /// A device of `capacity` bytes; addresses without a hint are taken from `fallback_base`
    /// upwards (choose it above every address of the file).
    pub fn new(capacity: u64, fallback_base: u64) -> Self {
        TraceDevice {
            capacity,
            inner: Mutex::new(Inner {
                used: 0,
                live: BTreeMap::new(),
                hints: Vec::new(),
                next_fallback: fallback_base.next_multiple_of(ALIGN),
                next_event: 1,
                pending_events: HashSet::new(),
                last_event: None,
                log: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means a panic elsewhere; the data is still consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes held (`cudaMalloc`ed plus mapped).
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// Takes over a `cudaMalloc` made before the window. False if it overlaps a held range.
    pub fn adopt_segment(&self, addr: u64, size: u64) -> bool {
        let mut inner = self.lock();
        if !inner.is_free(addr, size) {
            return false;
        }
        inner.live.insert(addr, (size, Range::Malloc));
        inner.used = inner.used.saturating_add(size);
        true
    }

    /// Takes over an expandable reservation with `mapped` bytes mapped.
    pub fn adopt_reservation(&self, base: u64, size: u64, mapped: u64) -> bool {
        let mut inner = self.lock();
        if !inner.is_free(base, size) {
            return false;
        }
        inner
            .live
            .insert(base, (size, Range::Reservation { mapped }));
        inner.used = inner.used.saturating_add(mapped);
        true
    }

    /// The recorded segment decisions of the step about to run.
    pub fn set_hints(&self, hints: &[SegmentDecision]) {
        self.lock().hints = hints.iter().map(|h| (*h, false)).collect();
    }

    /// The decisions made since the last call.
    pub fn take_log(&self) -> Vec<SegmentDecision> {
        std::mem::take(&mut self.lock().log)
    }

    /// The event recorded last (by a `free` of a block used on another stream).
    pub fn take_last_event(&self) -> Option<Event> {
        self.lock().last_event.take().map(Event)
    }

    /// Completes an event (the recorded `free_completed` was reached).
    pub fn complete_event(&self, event: Event) {
        self.lock().pending_events.remove(&event.0);
    }
}

impl Inner {
    /// Whether `[addr, addr + size)` overlaps nothing held.
    fn is_free(&self, addr: u64, size: u64) -> bool {
        let Some(end) = addr.checked_add(size) else {
            return false;
        };
        if size == 0 {
            return false;
        }
        match self.live.range(..end).next_back() {
            Some((&start, &(len, _))) => start.saturating_add(len) <= addr,
            None => true,
        }
    }

    /// Whether a reservation of `size` bytes fits at `addr`, allowing the one held range it
    /// overlaps to be a reservation that starts below `addr`.
    fn can_reserve_at(&self, addr: u64, size: u64) -> bool {
        let Some(end) = addr.checked_add(size) else {
            return false;
        };
        let mut overlapping = self
            .live
            .range(..end)
            .rev()
            .take_while(|(&start, &(len, _))| start.saturating_add(len) > addr);
        match (overlapping.next(), overlapping.next()) {
            (None, _) => true,
            (Some((&start, &(_, kind))), None) => {
                start < addr && matches!(kind, Range::Reservation { .. })
            }
            _ => false,
        }
    }

    /// An address for `size` bytes: the first unused hint that `accept`s and fits, else the
    /// fallback range.
    fn place(&mut self, size: u64, accept: impl Fn(&SegmentDecision) -> bool) -> Option<u64> {
        let pick = self
            .hints
            .iter()
            .position(|(h, used)| !used && accept(h) && self.is_free(h.addr, size));
        if let Some(i) = pick {
            self.hints[i].1 = true;
            return Some(self.hints[i].0.addr);
        }
        loop {
            let addr = self.next_fallback;
            let end = addr.checked_add(size)?;
            self.next_fallback = end.checked_next_multiple_of(ALIGN)?;
            if self.is_free(addr, size) {
                return Some(addr);
            }
        }
    }

    fn reservation_of(&self, addr: u64, size: u64) -> Option<u64> {
        let (&base, &(len, kind)) = self.live.range(..=addr).next_back()?;
        let fits = addr.checked_add(size)? <= base.saturating_add(len);
        (fits && matches!(kind, Range::Reservation { .. })).then_some(base)
    }
}

impl Device for TraceDevice {
    fn description(&self) -> String {
        format!("trace-replay device with {} bytes", self.capacity)
    }

    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        let used = self.lock().used;
        Ok(MemInfo {
            free: self.capacity.saturating_sub(used),
            total: self.capacity,
        })
    }

    fn malloc(&self, size: u64) -> Result<u64, DeviceError> {
        let mut inner = self.lock();
        let oom = DeviceError::OutOfMemory { requested: size };
        if size == 0 || inner.used.saturating_add(size) > self.capacity {
            return Err(oom);
        }
        let addr = inner
            .place(size, |h| {
                h.action == SegmentAction::SegmentAlloc && h.size == size
            })
            .ok_or(oom)?;
        inner.live.insert(addr, (size, Range::Malloc));
        inner.used += size;
        inner.log.push(SegmentDecision {
            action: SegmentAction::SegmentAlloc,
            addr,
            size,
        });
        Ok(addr)
    }

    fn free(&self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        let mut inner = self.lock();
        match inner.live.get(&ptr) {
            Some(&(len, Range::Malloc)) if len == size => {}
            _ => return Err(DeviceError::InvalidPointer { ptr }),
        }
        inner.live.remove(&ptr);
        inner.used = inner.used.saturating_sub(size);
        inner.log.push(SegmentDecision {
            action: SegmentAction::SegmentFree,
            addr: ptr,
            size,
        });
        Ok(())
    }

    fn record_event(&self, _stream: Stream) -> Result<Event, DeviceError> {
        let mut inner = self.lock();
        let id = inner.next_event;
        inner.next_event += 1;
        inner.pending_events.insert(id);
        inner.last_event = Some(id);
        Ok(Event(id))
    }

    fn query_event(&self, event: Event) -> Result<bool, DeviceError> {
        Ok(!self.lock().pending_events.contains(&event.0))
    }

    fn synchronize_event(&self, event: Event) -> Result<(), DeviceError> {
        self.lock().pending_events.remove(&event.0);
        Ok(())
    }

    fn supports_virtual_memory(&self) -> bool {
        true
    }

    fn reserve(&self, size: u64) -> Result<u64, DeviceError> {
        let mut inner = self.lock();
        // The recorded first mapping of a fresh reservation is its base. A reservation the
        // replay made earlier may reach past it (its size comes from the device's total,
        // which the file does not record); the recorded address proves the real one ended
        // before it, so it is cut short there.
        let hint = inner.hints.iter().position(|(h, used)| {
            !used && h.action == SegmentAction::SegmentMap && inner.can_reserve_at(h.addr, size)
        });
        let addr = match hint {
            Some(i) => {
                inner.hints[i].1 = true;
                let addr = inner.hints[i].0.addr;
                if let Some((&start, _)) = inner.live.range(..addr).next_back() {
                    if let Some((len, Range::Reservation { .. })) = inner.live.get_mut(&start) {
                        *len = (*len).min(addr - start);
                    }
                }
                addr
            }
            None => inner
                .place(size, |_| false)
                .ok_or(DeviceError::OutOfMemory { requested: size })?,
        };
        inner
            .live
            .insert(addr, (size, Range::Reservation { mapped: 0 }));
        Ok(addr)
    }

    fn release_reservation(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let mut inner = self.lock();
        match inner.live.get(&addr) {
            Some(&(len, Range::Reservation { mapped: 0 })) if len == size => {}
            _ => return Err(DeviceError::InvalidPointer { ptr: addr }),
        }
        inner.live.remove(&addr);
        Ok(())
    }

    fn map(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let mut inner = self.lock();
        let base = inner
            .reservation_of(addr, size)
            .ok_or(DeviceError::InvalidPointer { ptr: addr })?;
        if inner.used.saturating_add(size) > self.capacity {
            return Err(DeviceError::OutOfMemory { requested: size });
        }
        inner.used += size;
        if let Some((_, Range::Reservation { mapped })) = inner.live.get_mut(&base) {
            *mapped = mapped.saturating_add(size);
        }
        inner.log.push(SegmentDecision {
            action: SegmentAction::SegmentMap,
            addr,
            size,
        });
        Ok(())
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let mut inner = self.lock();
        let base = inner
            .reservation_of(addr, size)
            .ok_or(DeviceError::InvalidPointer { ptr: addr })?;
        match inner.live.get_mut(&base) {
            Some((_, Range::Reservation { mapped })) if *mapped >= size => *mapped -= size,
            _ => return Err(DeviceError::InvalidPointer { ptr: addr }),
        }
        inner.used = inner.used.saturating_sub(size);
        inner.log.push(SegmentDecision {
            action: SegmentAction::SegmentUnmap,
            addr,
            size,
        });
        Ok(())
    }
}
