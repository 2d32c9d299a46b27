//! The public caching allocator: one device, one lock, PyTorch's behaviour.

mod arena;
mod block;
mod free_set;
mod live_tail;
mod pool;
mod ptr_map;
mod snapshot;
pub(crate) mod state;
#[cfg(test)]
mod tests;

pub use live_tail::LiveState;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memsnap_format::{BlockState, SegmentType, Snapshot};
use parking_lot::{Mutex, MutexGuard, RwLock};

use crate::config::AllocatorConfig;
use crate::device::{Device, Stream};
use crate::error::{Error, OomInfo, Result};
use crate::history::{ContextMode, HistoryMode, HistoryOptions, StackMode};
use crate::stacks::{CapturedStack, GivenStack, RawStackId, Unwinder};
use crate::stats::DeviceStats;
use state::malloc::MallocFailure;
use state::restore::{RestoreBlock, RestoreKind, RestoreSegment};
use state::State;

/// A callback run after an allocation finally failed, outside the allocator lock (so it may
/// call [`CachingAllocator::dump_snapshot`]).
pub type OomObserver = dyn Fn(&OomInfo) + Send + Sync;

// Capture decisions are read before taking the lock, from one atomic byte.
const FLAG_CONTEXT_MASK: u8 = 0b11;
const FLAG_NATIVE: u8 = 0b100;
const FLAG_FRAME_POINTERS: u8 = 0b1000;
const FLAG_LIBGCC: u8 = 0b1_0000;

/// PyTorch's caching allocator over one [`Device`], recording its history.
///
/// All methods take `&self`; the allocator is `Send + Sync` (one lock per device, like
/// PyTorch) and can live in a `static OnceLock`.
pub struct CachingAllocator<D: Device> {
    device: D,
    device_index: i64,
    state: Mutex<State>,
    capture_flags: AtomicU8,
    observers: RwLock<Vec<Arc<OomObserver>>>,
}

impl<D: Device> CachingAllocator<D> {
    /// An allocator with PyTorch's default settings, device index 0, history off.
    pub fn new(device: D) -> Self {
        Self::with_config(device, AllocatorConfig::default())
    }

    /// An allocator with settings parsed from a `PYTORCH_CUDA_ALLOC_CONF`-style string.
    pub fn with_conf(device: D, conf: &str) -> Result<Self> {
        Ok(Self::with_config(device, AllocatorConfig::parse(conf)?))
    }

    /// An allocator with settings from `PYTORCH_CUDA_ALLOC_CONF` (see
    /// [`AllocatorConfig::from_env`]).
    pub fn from_env(device: D) -> Result<Self> {
        Ok(Self::with_config(device, AllocatorConfig::from_env()?))
    }

    pub fn with_config(device: D, config: AllocatorConfig) -> Self {
        let total = device.mem_info().map(|m| m.total).unwrap_or(u64::MAX);
        let fraction = config.per_process_memory_fraction;
        let mut state = State::new(0, config, total, device.supports_virtual_memory());
        if let Some(f) = fraction {
            state.set_memory_fraction(f, total);
        }
        CachingAllocator {
            device,
            device_index: 0,
            state: Mutex::new(state),
            capture_flags: AtomicU8::new(0),
            observers: RwLock::new(Vec::new()),
        }
    }

    /// Sets the device index written into snapshots and OOM reports.
    pub fn with_device_index(mut self, index: i64) -> Self {
        self.device_index = index;
        self.state.get_mut().device_index = index;
        self
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    pub fn device_index(&self) -> i64 {
        self.device_index
    }

    /// The current settings.
    pub fn config(&self) -> AllocatorConfig {
        self.state.lock().config.clone()
    }

    /// Changes the settings at run time (`torch.cuda.memory._set_allocator_settings`).
    pub fn set_allocator_settings(&self, conf: &str) -> Result<()> {
        let config = AllocatorConfig::parse(conf)?;
        let vm = self.device.supports_virtual_memory();
        let mut st = self.state.lock();
        st.expandable_active = config.expandable_segments && vm;
        st.stats.max_split_size = config.max_split_size;
        st.config = config;
        Ok(())
    }

    /// `torch.cuda.memory._record_memory_history`: starts, changes or stops recording.
    pub fn record_memory_history(&self, options: HistoryOptions) {
        let mut st = self.state.lock();
        st.history.configure(options);
        let mut flags = 0;
        if options.enabled != HistoryMode::Off && options.stacks == StackMode::Native {
            flags = options.context as u8 & FLAG_CONTEXT_MASK;
            flags |= FLAG_NATIVE;
            match options.unwinder {
                Unwinder::FramePointers => flags |= FLAG_FRAME_POINTERS,
                Unwinder::Libgcc => flags |= FLAG_LIBGCC,
                Unwinder::Backtrace => {}
            }
        }
        self.capture_flags.store(flags, Ordering::Relaxed);
    }

    /// The history options in effect.
    pub fn history_options(&self) -> HistoryOptions {
        self.state.lock().history.options
    }

    /// Captures a stack when the context level is at least `level` (outside the lock, as
    /// PyTorch does).
    #[inline]
    fn capture(&self, level: ContextMode) -> Option<CapturedStack> {
        let flags = self.capture_flags.load(Ordering::Relaxed);
        if flags & FLAG_NATIVE == 0 || flags & FLAG_CONTEXT_MASK < level as u8 {
            return None;
        }
        let unwinder = if flags & FLAG_FRAME_POINTERS != 0 {
            Unwinder::FramePointers
        } else if flags & FLAG_LIBGCC != 0 {
            Unwinder::Libgcc
        } else {
            Unwinder::Backtrace
        };
        Some(CapturedStack::capture(unwinder))
    }

    /// Allocates `size` bytes for use on `stream`. `size == 0` returns the null pointer 0.
    ///
    /// Out of memory (after freeing cached blocks) records an `oom` trace entry, calls the OOM
    /// observers after the lock is released, and returns [`Error::OutOfMemory`].
    pub fn malloc(&self, size: u64, stream: Stream) -> Result<u64> {
        if size == 0 {
            return Ok(0);
        }
        let stack = self.capture(ContextMode::State);
        let mut st = self.state.lock();
        let ctx = st.intern(stack.as_ref().map(CapturedStack::as_slice));
        self.malloc_locked(st, size, stream, ctx)
    }

    /// [`CachingAllocator::malloc`] recording `stack` (see [`GivenStack`]) instead of
    /// capturing the native one. The context level of the history options applies as for a
    /// captured stack; the stack mode does not (it says whether to walk native stacks).
    pub fn malloc_with_stack(&self, size: u64, stream: Stream, stack: GivenStack) -> Result<u64> {
        if size == 0 {
            return Ok(0);
        }
        let st = self.state.lock();
        let ctx = st.given(stack, ContextMode::State);
        self.malloc_locked(st, size, stream, ctx)
    }

    fn malloc_locked(
        &self,
        mut st: MutexGuard<'_, State>,
        size: u64,
        stream: Stream,
        ctx: RawStackId,
    ) -> Result<u64> {
        match st.malloc(&self.device, size, stream, ctx) {
            Ok(ptr) => Ok(ptr),
            Err(MallocFailure::Device(source)) => Err(Error::Device {
                device: self.device_index,
                source,
            }),
            Err(MallocFailure::Oom(info)) => {
                drop(st);
                self.notify_oom(&info);
                Err(Error::OutOfMemory(Box::new(info)))
            }
        }
    }

    /// Frees a pointer from [`CachingAllocator::malloc`]. Freeing 0 does nothing; an unknown
    /// pointer is an error (and changes nothing).
    pub fn free(&self, ptr: u64) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let stack = self.capture(ContextMode::All);
        let mut st = self.state.lock();
        let ctx = st.intern(stack.as_ref().map(CapturedStack::as_slice));
        self.free_locked(st, ptr, ctx)
    }

    /// [`CachingAllocator::free`] recording `stack` as the free's call site (with the context
    /// level `all`; below it the free entries keep the allocation's stack, as usual).
    pub fn free_with_stack(&self, ptr: u64, stack: GivenStack) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let st = self.state.lock();
        let ctx = st.given(stack, ContextMode::All);
        self.free_locked(st, ptr, ctx)
    }

    fn free_locked(&self, mut st: MutexGuard<'_, State>, ptr: u64, ctx: RawStackId) -> Result<()> {
        if st.free(&self.device, ptr, ctx) {
            Ok(())
        } else {
            Err(Error::UnknownPointer {
                device: self.device_index,
                ptr,
            })
        }
    }

    /// Registers a stack given as frames, innermost first (see [`GivenStack`]). Registering
    /// an equal stack again returns the same handle. `None` when the table of given stacks
    /// is full (2^31 - 1 stacks).
    pub fn register_stack(&self, frames: &[memsnap_format::Frame]) -> Option<GivenStack> {
        self.state
            .lock()
            .given_stacks
            .register(frames)
            .map(GivenStack)
    }

    /// Replaces the history clock with a manual one, for deterministic recordings (tests,
    /// simulated workloads): it reads `start_us` (µs since the Unix epoch) until
    /// [`CachingAllocator::advance_clock`] moves it. Call it before recording starts, since
    /// entries already recorded keep the old clock's time base.
    pub fn use_manual_clock(&self, start_us: i64) {
        self.state.lock().use_manual_clock(start_us);
    }

    /// Moves a manual clock forward by `by` (nanoseconds count; the trace keeps
    /// microseconds). Does nothing to the real clock.
    pub fn advance_clock(&self, by: Duration) {
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.state.lock().advance_clock(ns);
    }

    /// The history clock now, in µs since the Unix epoch.
    pub fn clock_now_us(&self) -> i64 {
        self.state.lock().clock_now_us()
    }

    /// Records an annotation, like PyTorch's `record_function` markers with
    /// `_record_memory_history`: `[("stage", "START"), ("name", "ProfilerStep#3")]`. Stamped
    /// with the history clock and kept in a ring of `max_entries` annotations; written to the
    /// snapshot's `external_annotations`. Nothing is recorded while history is off.
    pub fn record_annotation(&self, metadata: &[(&str, &str)]) {
        let metadata = metadata
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        self.state.lock().record_annotation(metadata);
    }

    /// Trace entries recorded since recording began, kept or dropped by the ring: the index
    /// the next entry will have in an unbounded trace.
    pub fn recorded_entries(&self) -> u64 {
        self.state.lock().history.recorded()
    }

    /// The number the next trace entry will have for a live listener (see
    /// [`CachingAllocator::serve_live`]): like [`CachingAllocator::recorded_entries`], but it
    /// never restarts, also across `clear_history` and history off.
    pub fn live_entries(&self) -> u64 {
        self.state.lock().history.live_recorded()
    }

    /// `Tensor.record_stream`: the block is also used on `stream`, so its memory is reused
    /// only after the work queued on `stream` when it is freed has completed. Pointers this
    /// allocator does not hold are ignored, as in PyTorch.
    pub fn record_stream(&self, ptr: u64, stream: Stream) {
        self.state.lock().record_stream(ptr, stream);
    }

    /// `torch.cuda.empty_cache()`: waits for pending frees, then returns every free whole
    /// segment to the device (and unmaps free expandable pages).
    pub fn empty_cache(&self) -> Result<()> {
        let stack = self.capture(ContextMode::All);
        let mut st = self.state.lock();
        let ctx = st.intern(stack.as_ref().map(CapturedStack::as_slice));
        st.release_cached_blocks(&self.device, ctx)
            .map_err(|source| Error::Device {
                device: self.device_index,
                source,
            })
    }

    /// `set_per_process_memory_fraction`: new segments may not push the reserved memory past
    /// `fraction × total`.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::InvalidFraction { fraction });
        }
        let total = self
            .device
            .mem_info()
            .map_err(|source| Error::Device {
                device: self.device_index,
                source,
            })?
            .total;
        self.state.lock().set_memory_fraction(fraction, total);
        Ok(())
    }

    pub fn memory_fraction(&self) -> f64 {
        self.state.lock().fraction
    }

    /// `torch.cuda.memory_stats()` of this device.
    pub fn stats(&self) -> DeviceStats {
        self.state.lock().stats.clone()
    }

    pub fn reset_peak_memory_stats(&self) {
        self.state.lock().stats.reset_peak();
    }

    pub fn reset_accumulated_memory_stats(&self) {
        self.state.lock().stats.reset_accumulated();
    }

    /// The size of the block behind an allocated pointer (rounded), if any.
    pub fn block_size(&self, ptr: u64) -> Option<u64> {
        let st = self.state.lock();
        st.live.get(&ptr).map(|&i| st.blocks[i].size)
    }

    /// Registers a callback for allocation failures (the hook to dump a snapshot on OOM).
    pub fn add_oom_observer(&self, observer: impl Fn(&OomInfo) + Send + Sync + 'static) {
        self.observers.write().push(Arc::new(observer));
    }

    fn notify_oom(&self, info: &OomInfo) {
        let observers: Vec<Arc<OomObserver>> = self.observers.read().clone();
        for observer in observers {
            // An observer's panic must not unwind into the caller's allocation path.
            let _ = catch_unwind(AssertUnwindSafe(|| observer(info)));
        }
    }

    /// `torch.cuda.memory._snapshot()` of this device: segments with their blocks, the trace
    /// (oldest first), allocator settings, and the entries the ring dropped. Appends a
    /// `snapshot` entry to the trace after collecting it (it shows in the *next* snapshot).
    pub fn snapshot(&self) -> Snapshot {
        let raw = {
            let mut st = self.state.lock();
            snapshot::collect(&mut st, false)
        };
        snapshot::build(raw, self.device_index)
    }

    /// [`CachingAllocator::snapshot`] of an allocator that is done: the history ring is moved
    /// into the snapshot instead of copied (a recording of 10M entries holds 320 MB there).
    pub fn into_snapshot(self) -> Snapshot {
        let mut st = self.state.into_inner();
        let raw = snapshot::collect(&mut st, true);
        snapshot::build(raw, self.device_index)
    }

    /// Writes [`CachingAllocator::snapshot`] atomically; the format follows the extension
    /// (`.pickle`, `.json`, `.msgpack`, optionally `.gz`/`.zst`).
    pub fn dump_snapshot(&self, path: impl AsRef<Path>) -> Result<()> {
        let snapshot = self.snapshot();
        memsnap_format::io::write_path(path.as_ref(), &snapshot, None)?;
        Ok(())
    }

    /// Puts a segment described the way a snapshot does (its blocks with their states) into
    /// the cache, without asking the device for memory: the way to start from a recorded
    /// state, for example to replay a trace from the middle of a run (`memsnap simulate`).
    ///
    /// **The device must already hold `[address, address + total_size)`** and let the
    /// allocator free it later: use a [`Device`] built for the purpose (memsnap-simulate's
    /// trace device adopts the recorded ranges); [`crate::SimulatedDevice`] does not.
    ///
    /// `active_allocated` and `active_pending_free` blocks become allocated blocks at their
    /// addresses (free them with [`CachingAllocator::free`]), sized by `size` and with
    /// `requested_size` as the caller's size; `inactive` blocks become cached free blocks,
    /// adjacent ones merged as PyTorch keeps them. The pool is `segment_type` (a 2 MiB segment
    /// without one is small). Statistics count the restored memory; no trace entry is
    /// recorded. For an expandable segment use [`CachingAllocator::restore_expandable_segment`].
    ///
    /// Returns false and changes nothing when the segment cannot be restored: blocks that do
    /// not tile the segment or are not multiples of 512 bytes, an unknown block state or
    /// segment type, `is_expandable`, or an overlap with a segment already held.
    pub fn restore_segment(&self, segment: &memsnap_format::Segment) -> bool {
        if segment.is_expandable == Some(true) {
            return false;
        }
        let Some(small) = segment_is_small(segment) else {
            return false;
        };
        let Some(blocks) = restore_blocks(segment.address, segment) else {
            return false;
        };
        let seg = RestoreSegment {
            base: segment.address,
            size: segment.total_size,
            stream: segment.stream,
            small,
            expandable: false,
        };
        self.state.lock().restore_segment(&seg, &blocks)
    }

    /// Restores an expandable segment: a reservation `[base, base + size)` of which the
    /// snapshot segments in `mapped` (each one contiguous mapped range, `is_expandable`) are
    /// mapped and the rest is not. The ranges must lie inside the reservation, in address
    /// order, and share one stream and pool. Otherwise as
    /// [`CachingAllocator::restore_segment`]: the device must already hold the reservation
    /// and the mapped memory, and false means nothing changed.
    pub fn restore_expandable_segment(
        &self,
        base: u64,
        size: u64,
        mapped: &[memsnap_format::Segment],
    ) -> bool {
        let Some(first) = mapped.first() else {
            return false;
        };
        let Some(small) = segment_is_small(first) else {
            return false;
        };
        let Some(end) = base.checked_add(size) else {
            return false;
        };
        let mut blocks = Vec::new();
        let mut cursor = base;
        for segment in mapped {
            if segment.stream != first.stream
                || segment_is_small(segment) != Some(small)
                || segment.address < cursor
            {
                return false;
            }
            if segment.address > cursor {
                blocks.push(RestoreBlock {
                    size: segment.address - cursor,
                    kind: RestoreKind::Unmapped,
                });
            }
            let Some(mut seg_blocks) = restore_blocks(segment.address, segment) else {
                return false;
            };
            blocks.append(&mut seg_blocks);
            cursor = match segment.address.checked_add(segment.total_size) {
                Some(c) => c,
                None => return false,
            };
        }
        if cursor > end {
            return false;
        }
        if cursor < end {
            blocks.push(RestoreBlock {
                size: end - cursor,
                kind: RestoreKind::Unmapped,
            });
        }
        let seg = RestoreSegment {
            base,
            size,
            stream: first.stream,
            small,
            expandable: true,
        };
        let vm = self.device.supports_virtual_memory();
        vm && self.state.lock().restore_segment(&seg, &blocks)
    }

    /// Checks the allocator's invariants (blocks tile segments, no mergeable free neighbours,
    /// reserved ≥ active ≥ allocated, stats equal a recomputation from the block lists).
    /// Returns the violations; empty when sound. Costs a walk over every block.
    pub fn check_invariants(&self) -> Vec<String> {
        self.state.lock().check_invariants()
    }

    /// Number of distinct native stacks interned so far.
    pub fn distinct_stacks(&self) -> usize {
        self.state.lock().stacks.len()
    }

    /// Number of entries in the history ring.
    pub fn history_len(&self) -> usize {
        self.state.lock().history.len()
    }
}

/// The pool of a snapshot segment: its `segment_type`, or (older files) small when it is one
/// small-pool segment of 2 MiB.
fn segment_is_small(segment: &memsnap_format::Segment) -> Option<bool> {
    match segment.segment_type {
        Some(SegmentType::Small) => Some(true),
        Some(SegmentType::Large) => Some(false),
        Some(SegmentType::Other(_)) => None,
        None => Some(segment.total_size == crate::config::SMALL_BUFFER),
    }
}

/// The blocks of a snapshot segment as restore blocks; `None` unless they tile it from
/// `start` (block addresses, when given, must follow on).
fn restore_blocks(start: u64, segment: &memsnap_format::Segment) -> Option<Vec<RestoreBlock>> {
    let mut blocks = Vec::with_capacity(segment.blocks.len());
    let mut expected = start;
    for (addr, block) in segment.block_addresses() {
        if addr != expected {
            return None;
        }
        let kind = match block.state {
            BlockState::ActiveAllocated | BlockState::ActivePendingFree => {
                RestoreKind::Allocated(block.requested_size.unwrap_or(block.size))
            }
            BlockState::Inactive => RestoreKind::Free,
            BlockState::Other(_) => return None,
        };
        blocks.push(RestoreBlock {
            size: block.size,
            kind,
        });
        expected = expected.checked_add(block.size)?;
    }
    if expected.checked_sub(start)? != segment.total_size {
        return None;
    }
    Some(blocks)
}
