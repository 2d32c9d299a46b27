//! Replay: a device trace turned into allocation intervals.
//!
//! Every `alloc` in the trace opens an [`Allocation`]; its `free_requested` and
//! `free_completed` close it. A bounded (ring-buffer) history starts mid-run, so two kinds of
//! memory existed before the window, and PyTorch's viewer counts both as "initially
//! allocated" (`process_alloc_data`); so do we:
//!
//! * a free whose `alloc` is not in the trace ([`Origin::FreedBeforeAlloc`]): live from the
//!   start of the window until that free;
//! * an `active_allocated` block in the final segments that no traced allocation accounts
//!   for ([`Origin::LiveInSegments`]): live for the whole window, sized by the block's
//!   `requested_size`.
//!
//! * memory an imported trace's source counted but could not attribute to a block
//!   ([`Origin::Unattributed`]: torch.profiler's `Total Allocated` minus the blocks the trace
//!   shows, kept by the import as [`memsnap_format::SourceInfo::unattributed`]): live for the
//!   whole window, or until the source's baseline drops.
//!
//! Their sum is [`Replay::before_window_bytes`], the value of every curve before event 0.
//!
//! An import's source may also have a reserved series without segments (torch.profiler's
//! `Total Reserved`): it becomes the reserved curve's changes when the trace has no segment
//! events of its own.
//!
//! **Axes.** Event `i` is the `i`-th entry of the device trace. An allocation occupies the
//! half-open event range `[start, end)`: `start` is its alloc event (0 when it predates the
//! window), `end` its free event (the trace length when still live). "After event `i`" the
//! live set is every allocation with `start <= i < end`.

// Seeded fast hashing: SipHash was a tenth of a whole summary here.
use foldhash::{HashMap, HashSet};

use memsnap_format::{Action, BlockState, Snapshot, StackId};
use serde::Serialize;

use crate::error::{AnalysisError, Result};

/// Index of an allocation in [`Replay::allocations`]. Allocations are in stacking order:
/// memory from before the window first, then traced allocations in alloc order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct AllocId(pub u32);

/// Where an allocation's start comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Origin {
    /// Its `alloc` event is in the trace.
    Traced,
    /// Freed in the trace, allocated before the window (ring buffer dropped the alloc, or
    /// recording started later).
    FreedBeforeAlloc,
    /// An `active_allocated` block of the final segments with no alloc in the trace.
    LiveInSegments,
    /// Memory the source of an imported trace counted but could not attribute to a block
    /// (no address, no stack): from before the window, or a later rise of that baseline.
    Unattributed,
}

/// Which end of an allocation's life a query uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum Lifetime {
    /// From `alloc` to `free_requested`: while the caller holds the tensor.
    Allocated,
    /// From `alloc` to `free_completed`: until the block returns to the cache (includes
    /// frees pending on other streams). PyTorch's "Active Memory Timeline" uses this, and so
    /// do peaks, steps and summaries.
    #[default]
    Active,
}

/// An optional event index in 4 bytes: `u32::MAX` (never an event: a trace has fewer
/// entries, see [`AnalysisError::TooManyEntries`]) is none. `Option<u32>` takes 8, and an
/// allocation holds three (3.3M allocations at 10M entries).
#[derive(Clone, Copy, PartialEq, Eq)]
struct OptEvent(u32);

impl OptEvent {
    const NONE: OptEvent = OptEvent(u32::MAX);

    fn some(event: u32) -> OptEvent {
        debug_assert!(event != u32::MAX);
        OptEvent(event)
    }

    fn get(self) -> Option<u32> {
        (self.0 != u32::MAX).then_some(self.0)
    }
}

impl From<Option<u32>> for OptEvent {
    fn from(event: Option<u32>) -> OptEvent {
        event.map_or(OptEvent::NONE, OptEvent::some)
    }
}

impl std::fmt::Debug for OptEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl Serialize for OptEvent {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        self.get().serialize(serializer)
    }
}

/// One allocation interval (48 bytes: a replay keeps one per `alloc` of the trace).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Allocation {
    pub addr: u64,
    /// Requested bytes (the trace's `size`; `requested_size` for blocks from the segments).
    pub size: u64,
    pub stream: i64,
    /// Stack of the alloc (or of the free / block when the alloc is not in the trace).
    pub stack: Option<StackId>,
    pub origin: Origin,
    /// See [`Allocation::alloc_event`].
    alloc_event: OptEvent,
    /// See [`Allocation::free_requested`].
    free_requested: OptEvent,
    /// See [`Allocation::free_completed`].
    free_completed: OptEvent,
}

impl Allocation {
    /// Index of the `alloc` entry; `None` when it predates the window.
    pub fn alloc_event(&self) -> Option<u32> {
        self.alloc_event.get()
    }

    /// Index of the `free_requested` (or merged `free`) entry; `None` if never freed.
    pub fn free_requested(&self) -> Option<u32> {
        self.free_requested.get()
    }

    /// Index of the `free_completed` (or merged `free`) entry; `None` if not returned.
    pub fn free_completed(&self) -> Option<u32> {
        self.free_completed.get()
    }

    /// First event index at which the allocation is live (0 for memory from before the window).
    pub fn start(&self) -> u32 {
        self.alloc_event().unwrap_or(0)
    }

    /// One past the last event at which it is live: the free event, or `axis_len` (see
    /// [`Replay::axis_len`]) when live at the end.
    pub fn end(&self, lifetime: Lifetime, axis_len: u32) -> u32 {
        self.end_event(lifetime)
            .unwrap_or(axis_len)
            .max(self.start())
    }

    /// The event that ends the allocation for `lifetime`; `None` when it is live at the end.
    pub fn end_event(&self, lifetime: Lifetime) -> Option<u32> {
        match lifetime {
            Lifetime::Allocated => self.free_requested().or(self.free_completed()),
            Lifetime::Active => self.free_completed(),
        }
    }

    /// Whether the allocation is live after event `event`.
    pub fn is_live_at(&self, event: u32, lifetime: Lifetime, axis_len: u32) -> bool {
        self.start() <= event && event < self.end(lifetime, axis_len)
    }

    /// Records the first `free_requested` (a later one does not move it).
    #[cfg(test)]
    fn free_requested_at(&mut self, event: u32) {
        if self.free_requested == OptEvent::NONE {
            self.free_requested = OptEvent::some(event);
        }
    }

    /// Whether it existed before the trace window.
    pub fn before_window(&self) -> bool {
        self.alloc_event == OptEvent::NONE
    }
}

/// Counts of trace entries by action.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ActionCounts {
    pub alloc: u64,
    pub free_requested: u64,
    pub free_completed: u64,
    pub segment_alloc: u64,
    pub segment_free: u64,
    pub segment_map: u64,
    pub segment_unmap: u64,
    pub snapshot: u64,
    pub oom: u64,
    /// `annotate` and actions this version does not know.
    pub other: u64,
}

/// A segment (or mapped range of an expandable segment) over the window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SegmentInterval {
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    /// Event of the `segment_alloc`/`segment_map`; `None` when it predates the window.
    pub alloc_event: Option<u32>,
    /// Event of the `segment_free`/`segment_unmap`; `None` when reserved at the end.
    pub free_event: Option<u32>,
}

impl SegmentInterval {
    pub fn start(&self) -> u32 {
        self.alloc_event.unwrap_or(0)
    }

    pub fn end(&self, trace_len: u32) -> u32 {
        self.free_event.unwrap_or(trace_len).max(self.start())
    }
}

/// An allocation-event anomaly that was accounted for rather than trusted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Anomaly {
    pub event: u32,
    pub what: String,
}

/// The replay of one device.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Replay {
    pub device: i64,
    /// Number of trace entries (the event axis is `0..trace_len`).
    pub trace_len: u32,
    /// All allocations in stacking order ([`AllocId`] indexes this).
    pub allocations: Vec<Allocation>,
    /// Bytes live before event 0 (frees without allocs plus untraced live blocks).
    pub before_window_bytes: u64,
    /// Number of allocations from before the window.
    pub before_window_allocations: u64,
    /// Of those, bytes and count only known from the final segments.
    pub live_in_segments_bytes: u64,
    pub live_in_segments_allocations: u64,
    /// Of those, bytes and count the source counted but no block accounts for
    /// ([`Origin::Unattributed`]).
    pub unattributed_bytes: u64,
    pub unattributed_allocations: u64,
    /// Which tool counted the numbers of an imported trace (`torch.profiler`, ...), when the
    /// snapshot says ([`memsnap_format::SourceInfo::source`]).
    pub source: Option<String>,
    /// `false` when the source sees only reserved memory: the allocated and active curves
    /// are unknown (empty), not zero.
    pub allocated_known: bool,
    /// The reserved curve is the source's series, not the trace's segment events.
    pub reserved_from_source: bool,
    /// Which tool gave the allocations their categories, when the source did (see
    /// [`crate::categories`]).
    pub categories_source: Option<String>,
    /// `(alloc entry, category)` from the source, entries ascending.
    #[serde(skip)]
    pub(crate) source_categories: Vec<(u32, crate::category::Category)>,
    /// Entries the ring buffer dropped, when the file says (memsnap's recorder writes it;
    /// PyTorch does not).
    pub dropped_entries: Option<u64>,
    /// Whether the history looks truncated: memory from before the window, or dropped entries.
    pub truncated: bool,
    pub actions: ActionCounts,
    /// Event indices of `oom` entries.
    pub oom_events: Vec<u32>,
    /// Segments over the window.
    pub segments: Vec<SegmentInterval>,
    /// Reserved bytes before event 0: final reserved bytes minus the traced net change
    /// (0 if that is negative, which a consistent file never gives).
    pub reserved_before_window: u64,
    /// Inconsistencies (double alloc of an address, ...), at most [`MAX_ANOMALIES`] kept.
    pub anomalies: Vec<Anomaly>,
    pub anomaly_count: u64,
    /// `(event, bytes)` of every segment event in trace order, signed (`segment_free` and
    /// `segment_unmap` negative): the reserved curve's changes, so it is built without
    /// reading the whole trace again.
    #[serde(skip)]
    pub(crate) reserved_changes: Vec<(u32, i128)>,
}

/// How many anomalies a replay keeps (the count is exact).
pub const MAX_ANOMALIES: usize = 100;

impl Replay {
    /// Replays the trace of `device` against its final segments.
    ///
    /// O(n + b + s log s) for `n` trace entries and the device's `b` final blocks and `s`
    /// segments, one hash lookup per `alloc` or free in a map of the live addresses that
    /// stays cache-sized (cut into parts once it grows: `FreeMatcher`), open segments in a
    /// B-tree (O(log s) per segment event). Finding the device's segments reads the snapshot's segments of every device
    /// once: building every device of a file costs O(devices × all segments) there.
    pub fn build(snapshot: &Snapshot, device: i64) -> Result<Replay> {
        let traces = snapshot.traces();
        let has_segments = snapshot.segments.iter().any(|s| s.device == device);
        let trace: &[memsnap_format::TraceEntry] = match usize::try_from(device) {
            Ok(d) if d < traces.len() => &traces[d],
            _ if has_segments => &[],
            _ => {
                return Err(AnalysisError::NoSuchDevice {
                    device,
                    available: snapshot.devices(),
                })
            }
        };
        let trace_len = u32::try_from(trace.len())
            .ok()
            .filter(|&n| n < u32::MAX - 1)
            .ok_or(AnalysisError::TooManyEntries {
                device,
                entries: trace.len(),
                max: u32::MAX as usize - 2,
            })?;

        let mut replay = Replay {
            device,
            trace_len,
            allocated_known: true,
            ..Default::default()
        };
        let mut traced: Vec<Allocation> = Vec::new();
        let mut open_segments: std::collections::BTreeMap<u64, SegmentInterval> =
            Default::default();
        let mut reserved_delta: i128 = 0;
        let mut frees = FreeMatcher::new(&replay, SPILL_LIVE);

        for (i, entry) in trace.iter().enumerate() {
            let i = i as u32;
            match entry.action {
                Action::Alloc => {
                    replay.actions.alloc += 1;
                    let index = traced.len() as u32;
                    traced.push(Allocation {
                        addr: entry.addr,
                        size: entry.size,
                        stream: entry.stream,
                        stack: entry.frames,
                        origin: Origin::Traced,
                        alloc_event: OptEvent::some(i),
                        free_requested: OptEvent::NONE,
                        free_completed: OptEvent::NONE,
                    });
                    frees.event(entry, i, index, &mut traced, &mut replay);
                }
                Action::FreeRequested => {
                    replay.actions.free_requested += 1;
                    let what = match trace.get(i as usize + 1) {
                        Some(next) if completes(entry, next) => AddrEvent::FREE_BOTH,
                        _ => AddrEvent::FREE_REQUESTED,
                    };
                    frees.event(entry, i, what, &mut traced, &mut replay);
                }
                Action::FreeCompleted | Action::Free => {
                    if entry.action == Action::Free {
                        replay.actions.free_requested += 1;
                    }
                    replay.actions.free_completed += 1;
                    frees.event(
                        entry,
                        i,
                        AddrEvent::FREE_COMPLETED,
                        &mut traced,
                        &mut replay,
                    );
                }
                Action::SegmentAlloc | Action::SegmentMap => {
                    if entry.action == Action::SegmentAlloc {
                        replay.actions.segment_alloc += 1;
                    } else {
                        replay.actions.segment_map += 1;
                    }
                    reserved_delta += i128::from(entry.size);
                    replay.reserved_changes.push((i, i128::from(entry.size)));
                    if let Some(prev) = open_segments.insert(
                        entry.addr,
                        SegmentInterval {
                            addr: entry.addr,
                            size: entry.size,
                            stream: entry.stream,
                            alloc_event: Some(i),
                            free_event: None,
                        },
                    ) {
                        let mut prev = prev;
                        prev.free_event = Some(i);
                        replay.segments.push(prev);
                        replay.note(i, format!("segment at {:#x} mapped twice", entry.addr));
                    }
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    if entry.action == Action::SegmentFree {
                        replay.actions.segment_free += 1;
                    } else {
                        replay.actions.segment_unmap += 1;
                    }
                    reserved_delta -= i128::from(entry.size);
                    replay.reserved_changes.push((i, -i128::from(entry.size)));
                    close_range(
                        &mut open_segments,
                        &mut replay.segments,
                        entry.addr,
                        entry.size,
                        entry.stream,
                        i,
                    );
                }
                Action::Snapshot => replay.actions.snapshot += 1,
                Action::Oom => {
                    replay.actions.oom += 1;
                    replay.oom_events.push(i);
                }
                Action::Annotate | Action::Other => replay.actions.other += 1,
            }
        }
        let (mut freed_before, open) =
            frees.finish(trace, &mut traced, &mut replay, MATCH_ROUND_EVENTS);

        // Blocks live in the final segments that the trace never allocated. The set of the
        // traced addresses still open is sized before it is filled (grown as it is filled,
        // it rehashes everything it holds at each doubling), and not made without segments.
        let mut traced_live: HashSet<u64> = HashSet::default();
        if has_segments {
            traced_live.reserve(open.len());
            traced_live.extend(open);
        }
        let mut ghosts = Vec::new();
        let mut final_reserved: i128 = 0;
        for seg in snapshot.segments.iter().filter(|s| s.device == device) {
            final_reserved += i128::from(seg.total_size);
            for (addr, block) in seg.block_addresses() {
                if block.state == BlockState::ActiveAllocated && !traced_live.contains(&addr) {
                    ghosts.push(Allocation {
                        addr,
                        size: block.requested_size.unwrap_or(block.size),
                        stream: seg.stream,
                        stack: block.frames,
                        origin: Origin::LiveInSegments,
                        alloc_event: OptEvent::NONE,
                        free_requested: OptEvent::NONE,
                        free_completed: OptEvent::NONE,
                    });
                }
            }
            // Segments the trace never allocated were reserved for the whole window.
            let known = open_segments
                .range(..=seg.address)
                .next_back()
                .is_some_and(|(&a, s)| a.saturating_add(s.size) > seg.address);
            if !known {
                replay.segments.push(SegmentInterval {
                    addr: seg.address,
                    size: seg.total_size,
                    stream: seg.stream,
                    alloc_event: None,
                    free_event: None,
                });
            }
        }
        replay.segments.extend(open_segments.into_values());
        replay
            .segments
            .sort_by_key(|s| (s.start(), s.addr, s.free_event));
        replay.reserved_before_window =
            u64::try_from((final_reserved - reserved_delta).max(0)).unwrap_or(u64::MAX);

        // Stacking order: never-freed ghosts at the bottom, then frees without allocs with the
        // latest-freed lowest (so earlier frees do not shift the bands above them), then the
        // traced allocations in alloc order.
        freed_before.sort_by_key(|a| {
            std::cmp::Reverse(
                a.free_completed()
                    .or(a.free_requested())
                    .unwrap_or(u32::MAX),
            )
        });
        replay.live_in_segments_allocations = ghosts.len() as u64;
        replay.live_in_segments_bytes = ghosts.iter().fold(0u64, |s, a| s.saturating_add(a.size));
        replay.before_window_allocations = (ghosts.len() + freed_before.len()) as u64;
        replay.before_window_bytes = ghosts
            .iter()
            .chain(&freed_before)
            .fold(0u64, |s, a| s.saturating_add(a.size));
        // The traced allocations are nearly all of them (200 MB at 10M entries): the few from
        // before the window go in front of them in place rather than all being copied after.
        replay.allocations = traced;
        replay
            .allocations
            .splice(0..0, ghosts.into_iter().chain(freed_before));

        if let Some(source) = snapshot
            .recorder_info
            .as_ref()
            .and_then(|r| r.source_of(device))
        {
            replay.apply_source(&source);
        }

        replay.dropped_entries = snapshot
            .recorder_info
            .as_ref()
            .and_then(|r| {
                usize::try_from(device)
                    .ok()
                    .and_then(|d| r.dropped_entries.get(d))
            })
            .copied();
        replay.truncated =
            replay.before_window_allocations > 0 || replay.dropped_entries.is_some_and(|d| d > 0);
        Ok(replay)
    }

    /// Length of the event axis: the trace length, but at least 1, so that a snapshot without
    /// a trace still shows its live blocks at event 0 (as PyTorch's viewer does).
    /// Allocations freed in the trace whose `alloc` is not in it (it came before the window).
    pub fn frees_without_alloc(&self) -> u64 {
        self.before_window_allocations
            .saturating_sub(self.live_in_segments_allocations)
            .saturating_sub(self.unattributed_allocations)
    }

    /// Whether the reserved curve means something: `false` for an import whose source records
    /// no reserved memory (`export_memory_timeline` data: no segments, no reserved series),
    /// where it is 0 because nothing is known. O(1).
    pub fn reserved_known(&self) -> bool {
        self.source.is_none() || self.reserved_from_source || !self.segments.is_empty()
    }

    /// Takes in what an imported trace's source knew beside the blocks: its unattributed
    /// memory as allocations of their own, its reserved series as the reserved curve (when
    /// the trace has no segment events), whether allocated bytes are known.
    ///
    /// The unattributed series is cut into layers, like a stack of blocks: a rise at event
    /// `e` opens a layer there, a drop closes layers from the top (splitting the last one).
    /// O(changes + allocations).
    fn apply_source(&mut self, source: &memsnap_format::SourceInfo) {
        self.source = Some(source.source.clone());
        self.allocated_known = source.allocated_known;
        let n = self.trace_len;
        if let Some(steps) = &source.unattributed {
            let layer = |size: u64, start: Option<u32>| Allocation {
                addr: 0,
                size,
                stream: 0,
                stack: None,
                origin: Origin::Unattributed,
                alloc_event: start.into(),
                free_requested: OptEvent::NONE,
                free_completed: OptEvent::NONE,
            };
            let mut made: Vec<Allocation> = Vec::new();
            let mut open: Vec<usize> = Vec::new();
            if steps.before > 0 {
                open.push(made.len());
                made.push(layer(steps.before, None));
            }
            let mut current = steps.before;
            for &(e, v) in steps.after.iter().filter(|&&(e, _)| e < n) {
                if v > current {
                    open.push(made.len());
                    made.push(layer(v - current, Some(e)));
                } else {
                    let mut drop = current - v;
                    while drop > 0 {
                        let Some(top) = open.pop() else { break };
                        let a = &mut made[top];
                        a.free_requested = OptEvent::some(e);
                        a.free_completed = OptEvent::some(e);
                        if a.size > drop {
                            let rest = a.size - drop;
                            open.push(made.len());
                            made.push(layer(rest, Some(e)));
                            drop = 0;
                        } else {
                            drop -= a.size;
                        }
                    }
                }
                current = v;
            }
            let (before, during): (Vec<Allocation>, Vec<Allocation>) =
                made.into_iter().partition(Allocation::before_window);
            self.unattributed_allocations = before.len() as u64;
            self.unattributed_bytes = before.iter().fold(0u64, |s, a| s.saturating_add(a.size));
            self.before_window_allocations += before.len() as u64;
            self.before_window_bytes = self
                .before_window_bytes
                .saturating_add(self.unattributed_bytes);
            // At the bottom of the stack: live for the whole window, like the final
            // segments' untraced blocks.
            self.allocations.splice(0..0, before);
            if !during.is_empty() {
                // Merged in start order (the allocations are sorted by start).
                let all = std::mem::take(&mut self.allocations);
                let mut merged = Vec::with_capacity(all.len() + during.len());
                let mut during = during.into_iter().peekable();
                for a in all {
                    while during.peek().is_some_and(|d| d.start() < a.start()) {
                        merged.extend(during.next());
                    }
                    merged.push(a);
                }
                merged.extend(during);
                self.allocations = merged;
            }
        }
        if let Some(c) = &source.categories {
            self.categories_source = Some(source.source.clone());
            let of_name: Vec<crate::category::Category> = c
                .names
                .iter()
                .map(|n| crate::category::Category::from_pytorch(n))
                .collect();
            self.source_categories = c
                .of_allocs
                .iter()
                .filter(|&&(e, _)| e < n)
                .map(|&(e, i)| (e, of_name[i as usize]))
                .collect();
        }
        if let Some(steps) = &source.reserved {
            if self.reserved_changes.is_empty() && self.segments.is_empty() {
                self.reserved_from_source = true;
                self.reserved_before_window = steps.before;
                let mut current = i128::from(steps.before);
                for &(e, v) in steps.after.iter().filter(|&&(e, _)| e < n) {
                    self.reserved_changes.push((e, i128::from(v) - current));
                    current = i128::from(v);
                }
            }
        }
    }

    pub fn axis_len(&self) -> u32 {
        self.trace_len.max(1)
    }

    /// The category the source gave the `alloc` at `event`, if it gave one.
    pub fn source_category(&self, event: Option<u32>) -> Option<crate::category::Category> {
        let event = event?;
        self.source_categories
            .binary_search_by_key(&event, |&(e, _)| e)
            .ok()
            .map(|i| self.source_categories[i].1)
    }

    /// The allocation with this id.
    pub fn get(&self, id: AllocId) -> Option<&Allocation> {
        self.allocations.get(id.0 as usize)
    }

    /// Allocations live after `event`, in stacking order. O(log m + p) for the `p`
    /// allocations started by `event` (at most all `m`).
    pub fn live_at(&self, event: u32, lifetime: Lifetime) -> Vec<AllocId> {
        // Allocations are sorted by start, so only a prefix can be live.
        let upto = self.allocations.partition_point(|a| a.start() <= event);
        self.allocations[..upto]
            .iter()
            .enumerate()
            .filter(|(_, a)| event < a.end(lifetime, self.axis_len()))
            .map(|(i, _)| AllocId(i as u32))
            .collect()
    }

    fn note(&mut self, event: u32, what: String) {
        self.anomaly_count += 1;
        if self.anomalies.len() < MAX_ANOMALIES {
            self.anomalies.push(Anomaly { event, what });
        }
    }
}

/// How many parts the map of live addresses is cut into once it grows large (see
/// [`FreeMatcher`]).
const LIVE_PARTITIONS: usize = 256;

/// The part of the map of live addresses `addr` falls in: the top bits of a multiplicative
/// hash, so the 512-byte-aligned addresses of one segment spread over every part. An input
/// whose addresses all land in one part only makes that part as large as the whole map was.
fn live_partition(addr: u64) -> usize {
    (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - LIVE_PARTITIONS.trailing_zeros())) as usize
}

/// Live addresses past which [`FreeMatcher`] matches the rest of the trace part by part
/// (a map of this many stays in a core's cache; the unit tests' traces are small, so there
/// it is small too, and they take both ways).
const SPILL_LIVE: usize = if cfg!(test) { 8 } else { 1 << 17 };

/// Most `alloc` and free events [`FreeMatcher`] lays out at once (16 bytes each: 64 MB, half
/// the one map of 4M live addresses it replaces; one giant step's `summary` peaks here).
/// Small in the unit tests, so that they take rounds.
const MATCH_ROUND_EVENTS: usize = if cfg!(test) { 64 } else { 4 << 20 };

/// Closes each traced allocation with its frees, by address, and makes an allocation from
/// before the window for each free whose alloc the trace does not hold.
///
/// While the addresses live at once are few, one map of them is walked with the trace. One
/// map of millions of live addresses (a 128 MB table, each insert and remove a cache miss)
/// was most of the way to the first picture of one giant step. So once more than
/// [`SPILL_LIVE`] are live, the rest of the trace is matched part by part: addresses never
/// interact, so the remaining events are laid out by the part of the map their address falls
/// in (a counting sort, in event order within each part, each event with its address and
/// what it does so that the trace is not read again out of order), and each part is matched
/// on its own, from the live addresses it had at the switch, with a map small enough to stay
/// in cache. An allocation is written once, when its block returns (its first request kept
/// in the map till then), so no step waits on reading it back. In the parts, a second thread
/// does those writes behind the matching (each a cache miss into the allocations: half the
/// matching's time on one giant step), handed each matched part in place of its events, so
/// no memory is added. The same answer as one map walked in event order: an address's
/// events all fall in one part, in their order.
///
/// A `free_requested` whose `free_completed` is the next entry (nearly every free: PyTorch
/// writes them one after the other unless the block waits on another stream) is one event,
/// matched with one lookup, and laid out once.
///
/// O(n) in the `n` entries, one hash lookup per event; after a switch, 16 bytes per `alloc`
/// or free for at most [`MATCH_ROUND_EVENTS`] events at a time (more are laid out and
/// matched in rounds of parts, each round one more read of the trace in order).
struct FreeMatcher {
    live: HashMap<u64, LiveBlock>,
    /// The first event matched part by part, once the map grew past [`SPILL_LIVE`].
    spilled_at: Option<u32>,
    /// Events from `spilled_at` on, by part.
    partition_sizes: Vec<usize>,
    /// Addresses of the traced allocations still open at the end (neither requested nor
    /// completed): gathered from the maps as they are emptied, not by reading every
    /// allocation again.
    open: Vec<u64>,
    /// The last event was a request with its completion ([`AddrEvent::FREE_BOTH`]): the
    /// next, the completion, is done.
    completion_taken: bool,
    freed_before: Vec<Allocation>,
    /// Anomalies noted in the walk or the part under way: each keeps its first
    /// [`MAX_ANOMALIES`] (the first of the whole trace are among them).
    noted: usize,
    anomalies_before: usize,
    spill_live: usize,
    /// The requests of the traced allocations still open at the end of the walk or a part,
    /// written by [`FreeMatcher::finish`].
    open_requests: Vec<Close>,
}

impl FreeMatcher {
    fn new(replay: &Replay, spill_live: usize) -> FreeMatcher {
        FreeMatcher {
            live: HashMap::default(),
            spilled_at: None,
            partition_sizes: Vec::new(),
            completion_taken: false,
            open: Vec::new(),
            freed_before: Vec::new(),
            noted: 0,
            anomalies_before: replay.anomalies.len(),
            spill_live,
            open_requests: Vec::new(),
        }
    }

    /// The next `alloc` or free of the trace, in event order (a request with its completion
    /// once, as [`AddrEvent::FREE_BOTH`]).
    fn event(
        &mut self,
        entry: &memsnap_format::TraceEntry,
        event: u32,
        what: u32,
        traced: &mut [Allocation],
        replay: &mut Replay,
    ) {
        if std::mem::take(&mut self.completion_taken) {
            return;
        }
        self.completion_taken = what == AddrEvent::FREE_BOTH;
        if self.spilled_at.is_some() {
            self.partition_sizes[live_partition(entry.addr)] += 1;
            return;
        }
        let close = self.apply(
            AddrEvent {
                addr: entry.addr,
                event,
                what,
            },
            || entry,
            traced.len(),
            replay,
        );
        if let Some(close) = close {
            close.write(traced);
        }
        if self.live.len() > self.spill_live {
            // After the completion too, when this was a request with its completion.
            self.spilled_at = Some(event + 1 + u32::from(self.completion_taken));
            self.partition_sizes = vec![0; LIVE_PARTITIONS];
        }
    }

    /// Matches one event against the live addresses, and returns what it closes among the
    /// `traced_len` traced allocations, for the caller to write (an allocation from before
    /// the window is written here); `entry` is read only for a free whose alloc the trace
    /// does not hold.
    fn apply<'t>(
        &mut self,
        AddrEvent { addr, event, what }: AddrEvent,
        entry: impl FnOnce() -> &'t memsnap_format::TraceEntry,
        traced_len: usize,
        replay: &mut Replay,
    ) -> Option<Close> {
        let freed_before = &mut self.freed_before;
        match what {
            AddrEvent::FREE_REQUESTED => match self.live.get_mut(&addr) {
                Some(block) => {
                    if block.free_requested == OptEvent::NONE {
                        block.free_requested = OptEvent::some(event);
                    }
                }
                None => {
                    let slot = Slot::before(freed_before.len());
                    freed_before.push(before_window(entry(), Some(event), None));
                    self.live.insert(
                        addr,
                        LiveBlock {
                            slot,
                            free_requested: OptEvent::some(event),
                        },
                    );
                }
            },
            AddrEvent::FREE_COMPLETED => match self.live.remove(&addr) {
                Some(block) => return block.close(event, event, traced_len, freed_before),
                None => freed_before.push(before_window(entry(), Some(event), Some(event))),
            },
            // A request and its completion on the next event: what the two give one after
            // the other, with one lookup.
            AddrEvent::FREE_BOTH => match self.live.remove(&addr) {
                Some(block) => return block.close(event, event + 1, traced_len, freed_before),
                None => freed_before.push(before_window(entry(), Some(event), Some(event + 1))),
            },
            traced_index => {
                let block = LiveBlock {
                    slot: Slot::traced(traced_index as usize),
                    free_requested: OptEvent::NONE,
                };
                if let Some(prev) = self.live.insert(addr, block) {
                    // Alloc of an address nobody freed: the free was not recorded.
                    let close = prev.close(event, event, traced_len, freed_before);
                    replay.anomaly_count += 1;
                    if self.noted < MAX_ANOMALIES {
                        self.noted += 1;
                        replay.anomalies.push(Anomaly {
                            event,
                            what: format!("alloc at {addr:#x}, which is still allocated; treating the earlier allocation as freed here"),
                        });
                    }
                    return close;
                }
            }
        }
        None
    }

    /// Blocks still live at the end of the walk or a part: their requests are kept for
    /// [`FreeMatcher::finish`] to write (few: a request whose completion the window does not
    /// hold).
    fn keep_open_requests(&mut self, traced_len: usize) {
        for (addr, block) in self.live.drain() {
            if block.free_requested != OptEvent::NONE {
                let close = block.slot.close(
                    block.free_requested,
                    OptEvent::NONE,
                    traced_len,
                    &mut self.freed_before,
                );
                self.open_requests.extend(close);
            } else if block.slot.is_traced(traced_len) {
                self.open.push(addr);
            }
        }
    }

    /// Matches what was left for the parts, and returns the allocations from before the
    /// window and the addresses of the traced allocations still open.
    fn finish(
        mut self,
        trace: &[memsnap_format::TraceEntry],
        traced: &mut [Allocation],
        replay: &mut Replay,
        round_events: usize,
    ) -> (Vec<Allocation>, Vec<u64>) {
        if let Some(spilled_at) = self.spilled_at {
            self.match_parts(spilled_at, trace, traced, replay, round_events);
        }
        self.keep_open_requests(traced.len());
        for close in std::mem::take(&mut self.open_requests) {
            close.write(traced);
        }
        // The anomalies kept are the first of the trace, as one walk in event order keeps
        // them: those noted before (segment events), in the walk and in each part, merged.
        if replay.anomalies.len() > self.anomalies_before {
            replay.anomalies.sort_by_key(|a| a.event);
            replay.anomalies.truncate(MAX_ANOMALIES);
        }
        (self.freed_before, self.open)
    }

    fn match_parts(
        &mut self,
        spilled_at: u32,
        trace: &[memsnap_format::TraceEntry],
        traced: &mut [Allocation],
        replay: &mut Replay,
        round_events: usize,
    ) {
        // What each part had live at the switch.
        let mut carried: Vec<Vec<(u64, LiveBlock)>> = vec![Vec::new(); LIVE_PARTITIONS];
        for (addr, block) in self.live.drain() {
            carried[live_partition(addr)].push((addr, block));
        }
        let sizes = std::mem::take(&mut self.partition_sizes);
        let rest = &trace[spilled_at as usize..];
        // The traced index of the first `alloc` from the switch on.
        let first_traced = traced.partition_point(|a| a.start() < spilled_at) as u32;
        let mut events: Vec<AddrEvent> = Vec::new();
        let mut parts = 0..0;
        while parts.end < sizes.len() {
            // The next round: as many parts as fit in `round_events` (at least one).
            parts = parts.end..parts.end + 1;
            let mut total = sizes[parts.start];
            while parts.end < sizes.len() && total + sizes[parts.end] <= round_events {
                total += sizes[parts.end];
                parts.end += 1;
            }
            let mut next = Vec::with_capacity(parts.len());
            let mut at = 0usize;
            for &size in &sizes[parts.clone()] {
                next.push(at);
                at += size;
            }
            events.clear();
            events.resize(total, AddrEvent::default());
            let mut traced_index = first_traced;
            let mut completion_laid_out = false;
            for (i, entry) in rest.iter().enumerate() {
                if std::mem::take(&mut completion_laid_out) {
                    continue;
                }
                let what = match entry.action {
                    Action::Alloc => {
                        traced_index += 1;
                        traced_index - 1
                    }
                    // As `event` took it: a completion right after its request is laid out
                    // with it.
                    Action::FreeRequested
                        if rest.get(i + 1).is_some_and(|next| completes(entry, next)) =>
                    {
                        completion_laid_out = true;
                        AddrEvent::FREE_BOTH
                    }
                    Action::FreeRequested => AddrEvent::FREE_REQUESTED,
                    Action::FreeCompleted | Action::Free => AddrEvent::FREE_COMPLETED,
                    _ => continue,
                };
                let part = live_partition(entry.addr);
                if parts.contains(&part) {
                    let slot = &mut next[part - parts.start];
                    events[*slot] = AddrEvent {
                        addr: entry.addr,
                        event: spilled_at + i as u32,
                        what,
                    };
                    *slot += 1;
                }
            }

            // This thread matches the parts one after the other, each event turned into the
            // allocation it closes; a second writes those into the allocations behind it.
            // Each write is a cache miss (4M allocations of 48 bytes): half the matching of
            // one giant step, now beside the other half.
            let traced_len = traced.len();
            std::thread::scope(|scope| {
                let (matched, to_write) = std::sync::mpsc::channel::<&[AddrEvent]>();
                let traced = &mut *traced;
                let writer = scope.spawn(move || {
                    for part in to_write {
                        for close in part.iter().filter_map(|e| e.as_close()) {
                            close.write(traced);
                        }
                    }
                });
                let mut rest = &mut events[..];
                for part in parts.clone() {
                    let (these, after) = std::mem::take(&mut rest).split_at_mut(sizes[part]);
                    rest = after;
                    self.live.extend(std::mem::take(&mut carried[part]));
                    self.noted = 0;
                    for event in these.iter_mut() {
                        let close =
                            self.apply(*event, || &trace[event.event as usize], traced_len, replay);
                        *event = AddrEvent::matched(close);
                    }
                    self.keep_open_requests(traced_len);
                    // Sending fails only when the writer is gone: it panicked, and the join
                    // below passes that on.
                    let _ = matched.send(these);
                }
                drop(matched);
                crate::join(writer);
            });
        }
    }
}

/// An `alloc` or free as [`FreeMatcher`] lays it out: its address, its event, and what it
/// does (the traced allocation it opens, or one of the two kinds of free).
#[derive(Clone, Copy, Default)]
struct AddrEvent {
    addr: u64,
    event: u32,
    what: u32,
}

impl AddrEvent {
    /// Never a traced allocation's index: there are fewer than the events, which are fewer
    /// than `u32::MAX - 1` ([`AnalysisError::TooManyEntries`]).
    const FREE_REQUESTED: u32 = u32::MAX;
    const FREE_COMPLETED: u32 = u32::MAX - 1;
    /// A `free_requested` and, on the next event, its `free_completed` (nearly every free of
    /// a trace: a third fewer events to lay out, one round of them fewer on one giant step).
    const FREE_BOTH: u32 = u32::MAX - 2;

    /// A matched event, as [`FreeMatcher::match_parts`] hands it to its writer: the traced
    /// allocation it closes (its index in `what`, its request in `addr`, its completion in
    /// `event`), or nothing to write (`what` a free's tag).
    fn matched(close: Option<Close>) -> AddrEvent {
        match close {
            Some(Close {
                index,
                requested,
                completed,
            }) => AddrEvent {
                addr: u64::from(requested.0),
                event: completed.0,
                what: index,
            },
            None => AddrEvent {
                addr: 0,
                event: 0,
                what: AddrEvent::FREE_COMPLETED,
            },
        }
    }

    /// What [`AddrEvent::matched`] made.
    fn as_close(&self) -> Option<Close> {
        (self.what < AddrEvent::FREE_BOTH).then_some(Close {
            index: self.what,
            requested: OptEvent(self.addr as u32),
            completed: OptEvent(self.event),
        })
    }
}

/// A traced allocation's frees, found by [`FreeMatcher::apply`]: written into the allocation
/// at once in the walk, by a second thread in the parts.
#[derive(Clone, Copy)]
struct Close {
    index: u32,
    requested: OptEvent,
    completed: OptEvent,
}

impl Close {
    fn write(self, traced: &mut [Allocation]) {
        let a = &mut traced[self.index as usize];
        a.free_requested = self.requested;
        a.free_completed = self.completed;
    }
}

/// A live address's allocation and the first `free_requested` seen for it.
#[derive(Clone, Copy)]
struct LiveBlock {
    slot: Slot,
    free_requested: OptEvent,
}

impl LiveBlock {
    /// The block returns at `completed`, requested at the first request seen (or at
    /// `requested`): an allocation from before the window is written, a traced one returned
    /// for the caller to write.
    fn close(
        self,
        requested: u32,
        completed: u32,
        traced_len: usize,
        before: &mut [Allocation],
    ) -> Option<Close> {
        let requested = if self.free_requested == OptEvent::NONE {
            OptEvent::some(requested)
        } else {
            self.free_requested
        };
        self.slot
            .close(requested, OptEvent::some(completed), traced_len, before)
    }
}

/// Where the allocation of a live address is, in a `u32`: with the address's first request a
/// map bucket is 16 bytes (24 with a tagged `usize`). Indices into the traced allocations
/// count up from 0, those into the allocations from before the window down from
/// `u32::MAX - 1`: together they are at most the events replayed, fewer than `u32::MAX`
/// ([`AnalysisError::TooManyEntries`]), so they never meet.
#[derive(Clone, Copy)]
struct Slot(u32);

impl Slot {
    fn traced(index: usize) -> Slot {
        Slot(index as u32)
    }

    fn before(index: usize) -> Slot {
        Slot(u32::MAX - 1 - index as u32)
    }

    fn is_traced(self, traced_len: usize) -> bool {
        (self.0 as usize) < traced_len
    }

    /// Sets the allocation's frees: one from before the window here, a traced one (of
    /// `traced_len`) returned for the caller to write.
    fn close(
        self,
        requested: OptEvent,
        completed: OptEvent,
        traced_len: usize,
        before: &mut [Allocation],
    ) -> Option<Close> {
        if self.is_traced(traced_len) {
            return Some(Close {
                index: self.0,
                requested,
                completed,
            });
        }
        let a = &mut before[(u32::MAX - 1 - self.0) as usize];
        a.free_requested = requested;
        a.free_completed = completed;
        None
    }
}

/// Whether `next`, the entry after the `free_requested` `request`, completes it (then they
/// are one [`AddrEvent::FREE_BOTH`]).
fn completes(request: &memsnap_format::TraceEntry, next: &memsnap_format::TraceEntry) -> bool {
    matches!(next.action, Action::FreeCompleted | Action::Free) && next.addr == request.addr
}

fn before_window(
    entry: &memsnap_format::TraceEntry,
    free_requested: Option<u32>,
    free_completed: Option<u32>,
) -> Allocation {
    Allocation {
        addr: entry.addr,
        size: entry.size,
        stream: entry.stream,
        stack: entry.frames,
        origin: Origin::FreedBeforeAlloc,
        alloc_event: OptEvent::NONE,
        free_requested: free_requested.into(),
        free_completed: free_completed.into(),
    }
}

/// Closes the open segment ranges overlapping `[addr, addr + size)` at `event`; the parts
/// outside the range stay open (an unmap can cover part of a mapped range). A range freed
/// without being opened in the trace was reserved before the window.
fn close_range(
    open: &mut std::collections::BTreeMap<u64, SegmentInterval>,
    closed: &mut Vec<SegmentInterval>,
    addr: u64,
    size: u64,
    stream: i64,
    event: u32,
) {
    let end = addr.saturating_add(size);
    let overlapping: Vec<u64> = open
        .range(..end)
        .rev()
        .take_while(|(&a, s)| a.saturating_add(s.size) > addr || a >= addr)
        .filter(|(&a, s)| a.saturating_add(s.size) > addr)
        .map(|(&a, _)| a)
        .collect();
    if overlapping.is_empty() {
        closed.push(SegmentInterval {
            addr,
            size,
            stream,
            alloc_event: None,
            free_event: Some(event),
        });
        return;
    }
    for a in overlapping {
        let Some(mut seg) = open.remove(&a) else {
            continue;
        };
        let seg_end = seg.addr.saturating_add(seg.size);
        if seg.addr < addr {
            open.insert(
                seg.addr,
                SegmentInterval {
                    size: addr - seg.addr,
                    alloc_event: Some(event),
                    ..seg.clone()
                },
            );
        }
        if seg_end > end {
            open.insert(
                end,
                SegmentInterval {
                    addr: end,
                    size: seg_end - end,
                    alloc_event: Some(event),
                    ..seg.clone()
                },
            );
        }
        seg.free_event = Some(event);
        closed.push(seg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replay keeps one allocation per `alloc` (3.3M at 10M entries): 64 bytes with
    /// `Option<u32>` event indexes, 48 with sentinels.
    #[test]
    fn allocation_takes_48_bytes() {
        assert_eq!(std::mem::size_of::<Allocation>(), 48);
    }

    #[test]
    fn event_sentinels_read_back_as_the_options_they_stand_for() {
        for event in [None, Some(0), Some(7), Some(u32::MAX - 1)] {
            assert_eq!(OptEvent::from(event).get(), event);
        }
        let mut a = Allocation {
            addr: 0,
            size: 1,
            stream: 0,
            stack: None,
            origin: Origin::Traced,
            alloc_event: OptEvent::some(3),
            free_requested: OptEvent::NONE,
            free_completed: OptEvent::NONE,
        };
        a.free_requested_at(5);
        a.free_requested_at(9);
        assert_eq!(
            (a.alloc_event(), a.free_requested(), a.free_completed()),
            (Some(3), Some(5), None)
        );
        assert_eq!(a.end(Lifetime::Allocated, 20), 5);
        assert_eq!(a.end(Lifetime::Active, 20), 20);
    }

    /// The allocation a slot of [`one_map_walk`]'s map stands for.
    fn slot_mut<'a>(
        slot: Slot,
        traced: &'a mut [Allocation],
        before: &'a mut [Allocation],
    ) -> &'a mut Allocation {
        if slot.is_traced(traced.len()) {
            &mut traced[slot.0 as usize]
        } else {
            &mut before[(u32::MAX - 1 - slot.0) as usize]
        }
    }

    /// The replay before the map of live addresses was cut into parts: one map, walked in
    /// event order. Returns the allocations (traced, then those from before the window in
    /// the replay's order) with the anomalies noted and their count.
    fn one_map_walk(trace: &[memsnap_format::TraceEntry]) -> (Vec<Allocation>, Vec<Anomaly>, u64) {
        let mut traced: Vec<Allocation> = Vec::new();
        let mut before: Vec<Allocation> = Vec::new();
        let mut live: HashMap<u64, Slot> = HashMap::default();
        let mut anomalies = Vec::new();
        let mut count = 0;
        for (i, entry) in trace.iter().enumerate() {
            let i = i as u32;
            match entry.action {
                Action::Alloc => {
                    if let Some(slot) = live.remove(&entry.addr) {
                        let prev = slot_mut(slot, &mut traced, &mut before);
                        prev.free_requested_at(i);
                        prev.free_completed = OptEvent::some(i);
                        count += 1;
                        if anomalies.len() < MAX_ANOMALIES {
                            anomalies.push(i);
                        }
                    }
                    live.insert(entry.addr, Slot::traced(traced.len()));
                    traced.push(Allocation {
                        addr: entry.addr,
                        size: entry.size,
                        stream: entry.stream,
                        stack: entry.frames,
                        origin: Origin::Traced,
                        alloc_event: OptEvent::some(i),
                        free_requested: OptEvent::NONE,
                        free_completed: OptEvent::NONE,
                    });
                }
                Action::FreeRequested => match live.get(&entry.addr) {
                    Some(&slot) => slot_mut(slot, &mut traced, &mut before).free_requested_at(i),
                    None => {
                        live.insert(entry.addr, Slot::before(before.len()));
                        before.push(before_window(entry, Some(i), None));
                    }
                },
                _ => match live.remove(&entry.addr) {
                    Some(slot) => {
                        let a = slot_mut(slot, &mut traced, &mut before);
                        a.free_requested_at(i);
                        a.free_completed = OptEvent::some(i);
                    }
                    None => before.push(before_window(entry, Some(i), Some(i))),
                },
            }
        }
        before.sort_by_key(|a| {
            std::cmp::Reverse(
                a.free_completed()
                    .or(a.free_requested())
                    .unwrap_or(u32::MAX),
            )
        });
        let anomalies = anomalies
            .into_iter()
            .map(|event| Anomaly {
                event,
                what: format!(
                    "alloc at {:#x}, which is still allocated; treating the earlier allocation as freed here",
                    trace[event as usize].addr
                ),
            })
            .collect();
        (before.into_iter().chain(traced).collect(), anomalies, count)
    }

    /// An entry per event; 4 is a `free_requested` and its `free_completed` right after it
    /// (as most frees are written).
    fn trace_of(events: &[(u8, u64)]) -> Vec<memsnap_format::TraceEntry> {
        events
            .iter()
            .flat_map(|&(action, addr)| {
                let actions: &[Action] = match action % 5 {
                    0 => &[Action::Alloc],
                    1 => &[Action::FreeRequested],
                    2 => &[Action::FreeCompleted],
                    3 => &[Action::Free],
                    _ => &[Action::FreeRequested, Action::FreeCompleted],
                };
                actions.iter().map(move |&action| {
                    memsnap_format::TraceEntry::new(action, addr, addr % 7 + 1, 0)
                })
            })
            .collect()
    }

    fn replay_of(trace: Vec<memsnap_format::TraceEntry>) -> Replay {
        let mut snapshot = Snapshot::new(1);
        snapshot.device_traces = Some(vec![trace]);
        Replay::build(&snapshot, 0).expect("replay")
    }

    proptest::proptest! {
        /// Any order of allocs and frees over a few addresses (double allocs, frees without
        /// allocs, frees twice): the parts of the map give what one map gives.
        #[test]
        fn matching_frees_part_by_part_equals_one_map_walked_in_event_order(
            events in proptest::collection::vec((0u8..5, 0u64..40), 0..400),
        ) {
            let trace = trace_of(&events.iter().map(|&(a, addr)| (a, addr * 512)).collect::<Vec<_>>());
            let (allocations, anomalies, count) = one_map_walk(&trace);
            let replay = replay_of(trace);
            proptest::prop_assert_eq!(&replay.allocations, &allocations);
            proptest::prop_assert_eq!(
                replay.anomalies.iter().map(|a| (a.event, &a.what)).collect::<Vec<_>>(),
                anomalies.iter().map(|a| (a.event, &a.what)).collect::<Vec<_>>()
            );
            proptest::prop_assert_eq!(replay.anomaly_count, count);
        }

        /// The same with a final segment whose blocks at some of those addresses are live:
        /// the blocks no traced allocation still holds (neither requested nor completed at
        /// the end) are the ones from before the window.
        #[test]
        fn live_blocks_no_open_traced_allocation_holds_come_from_the_segments(
            events in proptest::collection::vec((0u8..5, 0u64..40), 0..400),
            live in proptest::collection::btree_set(0u64..40, 0..40),
        ) {
            let trace = trace_of(&events.iter().map(|&(a, addr)| (a, addr * 512)).collect::<Vec<_>>());
            let (allocations, _, _) = one_map_walk(&trace);
            let mut segment = memsnap_format::Segment::new(0, 0, 40 * 512, 0);
            segment.blocks = (0..40u64)
                .map(|a| {
                    let state = if live.contains(&a) {
                        BlockState::ActiveAllocated
                    } else {
                        BlockState::Inactive
                    };
                    memsnap_format::Block::new(a * 512, 512, state)
                })
                .collect();
            let mut snapshot = Snapshot::new(1);
            snapshot.device_traces = Some(vec![trace]);
            snapshot.segments.push(segment);
            let replay = Replay::build(&snapshot, 0).expect("replay");
            let open: std::collections::BTreeSet<u64> = allocations
                .iter()
                .filter(|a| a.origin == Origin::Traced && a.free_requested().is_none() && a.free_completed().is_none())
                .map(|a| a.addr)
                .collect();
            let expected: Vec<u64> = live.iter().map(|a| a * 512).filter(|a| !open.contains(a)).collect();
            let ghosts: Vec<u64> = replay
                .allocations
                .iter()
                .filter(|a| a.origin == Origin::LiveInSegments)
                .map(|a| a.addr)
                .collect();
            proptest::prop_assert_eq!(ghosts, expected);
        }
    }

    /// More anomalies than are kept, spread over every part: the first by event are kept, as
    /// one walk in event order keeps them.
    #[test]
    fn the_anomalies_kept_are_the_first_of_the_trace_across_the_parts() {
        let addrs = (0..3 * MAX_ANOMALIES as u64).map(|a| a * 512 + 0x10000);
        let events: Vec<(u8, u64)> = addrs
            .clone()
            .map(|a| (0, a))
            .chain(addrs.map(|a| (0, a)))
            .collect();
        let trace = trace_of(&events);
        let (allocations, anomalies, count) = one_map_walk(&trace);
        let replay = replay_of(trace);
        assert_eq!(replay.anomaly_count, count);
        assert_eq!(count, 3 * MAX_ANOMALIES as u64);
        assert_eq!(replay.anomalies.len(), MAX_ANOMALIES);
        let events = |a: &[Anomaly]| a.iter().map(|a| a.event).collect::<Vec<_>>();
        assert_eq!(events(&replay.anomalies), events(&anomalies));
        assert_eq!(replay.allocations, allocations);
    }
}
