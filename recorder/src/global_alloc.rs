//! Records a Rust program's host heap in the snapshot format, through a [`GlobalAlloc`]
//! adapter: two lines profile any Rust binary.
//!
//! ```no_run
//! use memsnap_recorder::global_alloc::RecordingAllocator;
//!
//! #[global_allocator]
//! static HEAP: RecordingAllocator = RecordingAllocator::system();
//!
//! fn main() {
//!     let _recording = memsnap_recorder::global_alloc::record_to("heap.pickle");
//!     // ... the program; the snapshot is written when `_recording` drops.
//! }
//! ```
//!
//! Each heap allocation becomes an `alloc` trace entry (with the native stack of the caller)
//! and each deallocation a `free_requested`/`free_completed` pair, on device 0, stream 0. Live
//! allocations are listed as one segment each (one `active_allocated` block), so every tool
//! that reads PyTorch snapshots shows the heap over time and what holds memory at the end.
//!
//! The recorder allocates too (its ring buffer, stack tables, the snapshot). A thread-local
//! flag marks the thread as "inside the recorder", and allocations made meanwhile go straight
//! to the wrapped allocator without being recorded, so the recorder never recurses into itself.
//! When recording is off the adapter costs one atomic load per call.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use memsnap_format::{
    Action, Block, BlockState, RecorderInfo, Segment, SegmentType, Snapshot, StackId, TraceEntry,
};

use crate::history::{epoch_micros, now_ns, History, HistoryMode, HistoryOptions, RawEntry};
use crate::stacks::{symbolize, CapturedStack, RawStackId, StackInterner, Unwinder, NO_STACK};

/// A [`GlobalAlloc`] that forwards to `A` (the system allocator by default) and records every
/// allocation while recording is on (see [`start`]).
pub struct RecordingAllocator<A = System> {
    inner: A,
}

impl RecordingAllocator<System> {
    /// Wraps the system allocator.
    pub const fn system() -> Self {
        RecordingAllocator { inner: System }
    }
}

impl<A> RecordingAllocator<A> {
    /// Wraps another global allocator (jemalloc, mimalloc, ...).
    pub const fn new(inner: A) -> Self {
        RecordingAllocator { inner }
    }
}

// SAFETY: every method forwards to the wrapped allocator with the caller's arguments unchanged
// and returns its result; recording only reads the pointer values.
unsafe impl<A: GlobalAlloc> GlobalAlloc for RecordingAllocator<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees (non-zero size).
        let ptr = unsafe { self.inner.alloc(layout) };
        if !ptr.is_null() {
            record_alloc(ptr as u64, layout.size() as u64);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let ptr = unsafe { self.inner.alloc_zeroed(layout) };
        if !ptr.is_null() {
            record_alloc(ptr as u64, layout.size() as u64);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Recorded before the memory is released, so no other thread can be handed the same
        // address (and record its alloc) before this free is in the trace.
        record_free(ptr as u64, layout.size() as u64);
        // SAFETY: forwarded with the caller's guarantees (`ptr` came from this allocator).
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record_free(ptr as u64, layout.size() as u64);
        // SAFETY: forwarded with the caller's guarantees.
        let new = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if new.is_null() {
            // The old block is still live: put it back.
            record_alloc(ptr as u64, layout.size() as u64);
        } else {
            record_alloc(new as u64, new_size as u64);
        }
        new
    }
}

/// Options of [`start`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapHistoryOptions {
    /// Ring-buffer size: the newest `max_entries` events are kept.
    pub max_entries: usize,
    /// Capture the native stack of allocations of at least this many bytes (`usize::MAX`: no
    /// stacks). A stack costs a few microseconds, so programs with millions of tiny
    /// allocations run faster with a threshold such as 4096.
    pub min_stack_size: usize,
    pub unwinder: Unwinder,
}

impl Default for HeapHistoryOptions {
    fn default() -> Self {
        HeapHistoryOptions {
            max_entries: 1_000_000,
            min_stack_size: 0,
            unwinder: Unwinder::default(),
        }
    }
}

/// A failure of [`dump`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeapDumpError {
    #[error("the heap is not being recorded (call memsnap_recorder::global_alloc::start first)")]
    NotRecording,
    #[error("writing the heap snapshot: {0}")]
    Write(#[from] memsnap_format::FormatError),
}

/// The recording: ring buffer, stack table and the live allocations.
struct HeapState {
    history: History,
    stacks: StackInterner,
    /// address -> (size, allocation stack)
    live: HashMap<u64, (u64, RawStackId)>,
}

static RECORDING: AtomicBool = AtomicBool::new(false);
/// `min_stack_size` and the unwinder, read without the lock before capturing a stack.
static MIN_STACK_SIZE: AtomicU64 = AtomicU64::new(u64::MAX);
static FRAME_POINTERS: AtomicBool = AtomicBool::new(false);
static STATE: Mutex<Option<HeapState>> = Mutex::new(None);

thread_local! {
    /// Set while this thread runs recorder code: its allocations are not recorded.
    static IN_RECORDER: Cell<bool> = const { Cell::new(false) };
}

/// Marks the current thread as inside the recorder until dropped.
struct ReentrancyGuard;

impl ReentrancyGuard {
    /// `None` when the thread is already inside the recorder (or is being torn down).
    fn enter() -> Option<ReentrancyGuard> {
        IN_RECORDER
            // `then`, not `then_some`: an eagerly built guard would be dropped on the "already
            // inside" path and clear the flag.
            .try_with(|inside| (!inside.replace(true)).then(|| ReentrancyGuard))
            .ok()
            .flatten()
    }
}

impl Drop for ReentrancyGuard {
    fn drop(&mut self) {
        let _ = IN_RECORDER.try_with(|inside| inside.set(false));
    }
}

fn lock_state() -> MutexGuard<'static, Option<HeapState>> {
    // A panic while recording leaves consistent data (every update is a single push/insert).
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn record_alloc(addr: u64, size: u64) {
    if !RECORDING.load(Ordering::Relaxed) {
        return;
    }
    let Some(_guard) = ReentrancyGuard::enter() else {
        return;
    };
    let captured = (size >= MIN_STACK_SIZE.load(Ordering::Relaxed))
        .then(|| CapturedStack::capture(current_unwinder()));
    // The lock is taken after the capture: unwinding is the slow part and needs no lock.
    let mut state = lock_state();
    let Some(state) = state.as_mut() else {
        return;
    };
    let stack = match &captured {
        Some(c) => state.stacks.intern(c.as_slice()),
        None => NO_STACK,
    };
    state.history.push(RawEntry {
        action: Action::Alloc,
        addr,
        size,
        stream: 0,
        time_ns: now_ns(),
        stack,
    });
    state.live.insert(addr, (size, stack));
}

fn record_free(addr: u64, size: u64) {
    if !RECORDING.load(Ordering::Relaxed) {
        return;
    }
    let Some(_guard) = ReentrancyGuard::enter() else {
        return;
    };
    let mut state = lock_state();
    let Some(state) = state.as_mut() else {
        return;
    };
    // Only allocations made while recording are tracked; frees of older memory (and of the
    // recorder's own, unrecorded allocations) are not events of the recorded program.
    // Frees reuse the allocation's stack (PyTorch's context "alloc").
    let Some((_, stack)) = state.live.remove(&addr) else {
        return;
    };
    let time_ns = now_ns();
    for action in [Action::FreeRequested, Action::FreeCompleted] {
        state.history.push(RawEntry {
            action,
            addr,
            size,
            stream: 0,
            time_ns,
            stack,
        });
    }
}

fn current_unwinder() -> Unwinder {
    if FRAME_POINTERS.load(Ordering::Relaxed) {
        Unwinder::FramePointers
    } else {
        Unwinder::Backtrace
    }
}

/// Starts recording the heap (again, from an empty history). Allocations made before are not
/// tracked: neither they nor their frees are in the trace.
pub fn start(options: HeapHistoryOptions) {
    let Some(_guard) = ReentrancyGuard::enter() else {
        return;
    };
    let mut history = History::default();
    history.configure(HistoryOptions {
        enabled: HistoryMode::All,
        max_entries: options.max_entries,
        unwinder: options.unwinder,
        ..HistoryOptions::default()
    });
    *lock_state() = Some(HeapState {
        history,
        stacks: StackInterner::default(),
        live: HashMap::new(),
    });
    MIN_STACK_SIZE.store(options.min_stack_size as u64, Ordering::Relaxed);
    FRAME_POINTERS.store(
        options.unwinder == Unwinder::FramePointers,
        Ordering::Relaxed,
    );
    RECORDING.store(true, Ordering::Release);
}

/// Stops recording and drops the history.
pub fn stop() {
    let Some(_guard) = ReentrancyGuard::enter() else {
        return;
    };
    RECORDING.store(false, Ordering::Release);
    let old = lock_state().take();
    drop(old);
}

/// Whether [`start`] was called (and not [`stop`]).
pub fn is_recording() -> bool {
    RECORDING.load(Ordering::Acquire)
}

/// The heap history and the live allocations as a snapshot (`None` when not recording).
pub fn snapshot() -> Option<Snapshot> {
    // The whole build runs inside the recorder: its allocations are not recorded.
    let _guard = ReentrancyGuard::enter()?;
    // Copy under the lock, symbolise after releasing it (symbolising is slow).
    let (entries, mut live, stack_ips, dropped) = {
        let state = lock_state();
        let state = state.as_ref()?;
        let entries = state.history.ordered();
        let live: Vec<(u64, u64, RawStackId)> = state
            .live
            .iter()
            .map(|(&addr, &(size, stack))| (addr, size, stack))
            .collect();
        let mut stack_ips: HashMap<RawStackId, Vec<usize>> = HashMap::new();
        let used = entries
            .iter()
            .map(|e| e.stack)
            .chain(live.iter().map(|l| l.2));
        for id in used.filter(|&id| id != NO_STACK) {
            stack_ips
                .entry(id)
                .or_insert_with(|| state.stacks.get(id).to_vec());
        }
        (entries, live, stack_ips, state.history.dropped())
    };

    let mut snapshot = Snapshot::new(1);
    let mut stack_ids: HashMap<RawStackId, StackId> = HashMap::new();
    let mut stack_of = |snapshot: &mut Snapshot, id: RawStackId| -> Option<StackId> {
        if id == NO_STACK {
            return None;
        }
        if let Some(&sid) = stack_ids.get(&id) {
            return Some(sid);
        }
        let frames =
            trim_allocator_frames(symbolize(stack_ips.get(&id).map_or(&[][..], Vec::as_slice)));
        let sid = snapshot.intern_stack(frames);
        stack_ids.insert(id, sid);
        Some(sid)
    };

    let mut trace = Vec::with_capacity(entries.len());
    for raw in &entries {
        let mut entry = TraceEntry::new(raw.action, raw.addr, raw.size, raw.stream);
        entry.set_time_us(Some(epoch_micros(raw.time_ns)));
        entry.frames = stack_of(&mut snapshot, raw.stack);
        trace.push(entry);
    }
    snapshot.device_traces = Some(vec![trace]);

    live.sort_unstable_by_key(|l| l.0);
    for (addr, size, stack) in live {
        let frames = stack_of(&mut snapshot, stack);
        let mut segment = Segment::new(0, addr, size, 0);
        segment.segment_type = Some(if size <= 1 << 20 {
            SegmentType::Small
        } else {
            SegmentType::Large
        });
        segment.allocated_size = Some(size);
        segment.active_size = Some(size);
        segment.requested_size = Some(size);
        segment.frames = frames;
        segment.frames_after_blocks = frames.is_some();
        segment.blocks.push(Block {
            address: Some(addr),
            size,
            requested_size: Some(size),
            state: BlockState::ActiveAllocated,
            frames,
            forward_frames: None,
            history: None,
            extra: Vec::new(),
            exact: Default::default(),
        });
        snapshot.segments.push(segment);
    }
    snapshot.recorder_info = Some(RecorderInfo {
        producer: format!("memsnap-recorder {} (host heap)", env!("CARGO_PKG_VERSION")),
        dropped_entries: vec![dropped],
        extra: Vec::new(),
        dropped_entries_exact: None,
    });
    Some(snapshot)
}

/// Writes [`snapshot`] to `path` atomically (format from the file name, pickle by default).
pub fn dump(path: impl AsRef<Path>) -> Result<(), HeapDumpError> {
    let snapshot = snapshot().ok_or(HeapDumpError::NotRecording)?;
    // Encoding allocates a lot; none of it is the program's.
    let _guard = ReentrancyGuard::enter();
    memsnap_format::write_path(path.as_ref(), &snapshot, None)?;
    Ok(())
}

/// Starts recording with the default options and returns a guard that writes the snapshot to
/// `path` when dropped (at the end of `main`). A failed write is reported on stderr.
#[must_use = "the snapshot is written when the returned guard drops"]
pub fn record_to(path: impl Into<PathBuf>) -> HeapRecording {
    start(HeapHistoryOptions::default());
    HeapRecording { path: path.into() }
}

/// Returned by [`record_to`]: dumps the heap snapshot when dropped.
pub struct HeapRecording {
    path: PathBuf,
}

impl HeapRecording {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for HeapRecording {
    fn drop(&mut self) {
        if let Err(err) = dump(&self.path) {
            eprintln!(
                "memsnap: cannot write the heap snapshot {}: {err}",
                self.path.display()
            );
        }
        stop();
    }
}

/// Removes the allocator shims (`__rust_alloc`, `alloc::alloc::alloc`, ...) from the top of a
/// heap stack, so the first frame is the code that allocated.
fn trim_allocator_frames(mut frames: Vec<memsnap_format::Frame>) -> Vec<memsnap_format::Frame> {
    let shim = |name: &str| {
        let name = name.trim_start_matches('<');
        name.starts_with("__rust")
            || name.starts_with("__rdl")
            || name.starts_with("__rg_")
            || name.starts_with("alloc::alloc::")
            || name.starts_with("std::alloc::")
            || name.starts_with("std::sys::alloc")
            || name.starts_with("core::alloc::")
    };
    let n = frames.iter().take_while(|f| shim(&f.name)).count();
    frames.drain(..n);
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_guard_is_refused_and_leaves_the_flag_set() {
        let outer = ReentrancyGuard::enter().expect("not inside yet");
        assert!(ReentrancyGuard::enter().is_none());
        assert!(
            ReentrancyGuard::enter().is_none(),
            "the refused attempt must not clear the flag"
        );
        drop(outer);
        assert!(ReentrancyGuard::enter().is_some());
    }

    #[test]
    fn allocator_shims_are_trimmed_from_the_top_only() {
        let frames = [
            "__rustc::__rust_alloc",
            "alloc::alloc::alloc",
            "my_app::load",
            "alloc::alloc::alloc",
        ]
        .map(|n| memsnap_format::Frame::new(n, "", 0))
        .to_vec();
        let names: Vec<String> = trim_allocator_frames(frames)
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert_eq!(names, ["my_app::load", "alloc::alloc::alloc"]);
    }
}
