//! Memory history: the options of `_record_memory_history`, the per-device ring buffer of
//! trace entries and the clock.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::stacks::{RawStackId, Unwinder, NO_STACK};
use memsnap_format::Action;

/// `enabled` of `_record_memory_history`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum HistoryMode {
    /// No recording; turning it off clears the buffer.
    Off,
    /// Stacks of live blocks; the trace keeps only the newest entry.
    State,
    /// Stacks and the event history (up to `max_entries`).
    #[default]
    All,
}

/// `context` of `_record_memory_history`: which events get a stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum ContextMode {
    /// No stacks anywhere.
    Never,
    /// Stacks on live blocks only (captured at malloc).
    State,
    /// Also on trace entries; frees reuse the allocation stack.
    Alloc,
    /// Also the stack of the free and `empty_cache` call sites.
    #[default]
    All,
}

/// `stacks` of `_record_memory_history`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StackMode {
    /// Record no frames even where the context level asks for them.
    None,
    /// The native (Rust/C/C++) call stack of the caller.
    #[default]
    Native,
}

/// Options of [`crate::CachingAllocator::record_memory_history`], with PyTorch's meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryOptions {
    pub enabled: HistoryMode,
    pub context: ContextMode,
    pub stacks: StackMode,
    /// Ring-buffer size per device (clamped to at least 1; `State` forces 1).
    pub max_entries: usize,
    /// How native stacks are walked.
    pub unwinder: Unwinder,
    /// Empty the buffer when (re)enabling.
    pub clear_history: bool,
}

impl Default for HistoryOptions {
    /// PyTorch's defaults: `enabled="all", context="all", stacks="all", max_entries=maxsize`.
    fn default() -> Self {
        HistoryOptions {
            enabled: HistoryMode::All,
            context: ContextMode::All,
            stacks: StackMode::Native,
            max_entries: usize::MAX,
            unwinder: Unwinder::default(),
            clear_history: false,
        }
    }
}

impl HistoryOptions {
    /// Recording off (`enabled=None`).
    pub fn off() -> Self {
        HistoryOptions {
            enabled: HistoryMode::Off,
            ..Default::default()
        }
    }

    /// Full history without stacks.
    pub fn without_stacks() -> Self {
        HistoryOptions {
            stacks: StackMode::None,
            context: ContextMode::Never,
            ..Default::default()
        }
    }
}

/// A trace entry (the ring stores it packed, see `Slot`), stack as an id into the device's
/// stack table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawEntry {
    pub action: Action,
    /// Address, or `device_free` for `oom`.
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    /// Nanoseconds since the process clock anchor (see [`epoch_micros`]).
    pub time_ns: u64,
    pub stack: RawStackId,
}

/// Nanoseconds since the process anchor: a monotonic clock read (vDSO, no syscall).
#[inline]
pub fn now_ns() -> u64 {
    let (anchor, _) = anchor();
    anchor.elapsed().as_nanos() as u64
}

/// Converts a [`now_ns`] reading to microseconds since the Unix epoch.
pub fn epoch_micros(time_ns: u64) -> i64 {
    let (_, epoch_us) = anchor();
    epoch_us + (time_ns / 1000) as i64
}

fn anchor() -> (Instant, i64) {
    static ANCHOR: OnceLock<(Instant, i64)> = OnceLock::new();
    *ANCHOR.get_or_init(|| {
        let epoch_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        (Instant::now(), epoch_us)
    })
}

/// Bits of [`Slot::time_action`] holding the action.
const ACTION_BITS: u32 = 4;
const ACTION_MASK: u64 = (1 << ACTION_BITS) - 1;
/// A slot's action tag is the action's index in [`Action::ALL`] (its discriminant), or this:
/// the tag of a slot that holds two entries: `free_requested` then `free_completed`,
/// equal but for the action (a block freed at once). One slot instead of two saves a third
/// of the ring traffic of an alloc+free pair.
const FREE_PAIR_TAG: u64 = Action::ALL.len() as u64;

/// One or two [`RawEntry`]s as the ring stores them: 32 bytes (two per cache line) instead of
/// 40 or 80, since the ring is written at every event and is usually far larger than the
/// caches. The clock reading and the action share a word (60 bits of nanoseconds since the
/// anchor are 36 years; the action [`FREE_PAIR_TAG`] stands for two entries), and the stream
/// is an index into the ring's table of distinct streams.
#[derive(Clone, Copy, Debug)]
struct Slot {
    addr: u64,
    size: u64,
    time_action: u64,
    stream: u32,
    stack: RawStackId,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 32);

impl Slot {
    /// `tag` is a [`Action`] or [`FREE_PAIR_TAG`].
    #[inline]
    fn new(tag: u64, addr: u64, size: u64, stream: u32, time_ns: u64, stack: RawStackId) -> Self {
        Slot {
            addr,
            size,
            time_action: (time_ns << ACTION_BITS) | tag,
            stream,
            stack,
        }
    }

    /// How many entries the slot holds (1 or 2).
    #[inline]
    fn entries(&self) -> usize {
        1 + usize::from(self.time_action & ACTION_MASK == FREE_PAIR_TAG)
    }

    /// The slot's entries (`streams` is the ring's stream table).
    fn expand(&self, streams: &[i64]) -> impl Iterator<Item = RawEntry> {
        let tag = self.time_action & ACTION_MASK;
        let entry = |action| RawEntry {
            action,
            addr: self.addr,
            size: self.size,
            stream: streams
                .get(self.stream as usize)
                .copied()
                .unwrap_or_default(),
            time_ns: self.time_action >> ACTION_BITS,
            stack: self.stack,
        };
        let (first, second) = match Action::ALL.get(tag as usize) {
            Some(&action) => (entry(action), None),
            None => (
                entry(Action::FreeRequested),
                Some(entry(Action::FreeCompleted)),
            ),
        };
        std::iter::once(first).chain(second)
    }
}

/// The entries the ring holds: its slots' entries, less the oldest that are over
/// `capacity` (a slot holding two entries can straddle the limit).
fn held_entries(slots: &[Slot], capacity: usize) -> (usize, usize) {
    let held = slots.len() + slots.iter().filter(|s| s.entries() == 2).count();
    (held.min(capacity), held.saturating_sub(capacity))
}

/// A `record_function`-style annotation (`{stage: START, name: ProfilerStep#3}`), kept in its
/// own ring buffer like PyTorch's `external_annotations`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawAnnotation {
    /// Key and value pairs, in the order given.
    pub metadata: Vec<(String, String)>,
    /// The clock reading (as [`RawEntry::time_ns`]).
    pub time_ns: u64,
}

/// The trace entries of a ring buffer, taken out of it for a snapshot.
#[derive(Debug, Default)]
pub(crate) struct RingTrace {
    slots: Vec<Slot>,
    /// The oldest slot once the ring wrapped.
    next: usize,
    streams: Vec<i64>,
    /// Entries kept (the ring's capacity at most).
    len: usize,
    /// Entries of the oldest slots that are over the capacity, left out.
    skip: usize,
}

impl RingTrace {
    fn new(slots: Vec<Slot>, next: usize, streams: Vec<i64>, capacity: usize) -> Self {
        let (len, skip) = held_entries(&slots, capacity);
        RingTrace {
            slots,
            next,
            streams,
            len,
            skip,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The entries, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = RawEntry> + '_ {
        let split = self.next.min(self.slots.len());
        self.slots[split..]
            .iter()
            .chain(&self.slots[..split])
            .flat_map(|slot| slot.expand(&self.streams))
            .skip(self.skip)
    }
}

/// The ring buffer of one device.
#[derive(Debug)]
pub(crate) struct History {
    pub options: HistoryOptions,
    /// Effective capacity in entries (1 under `State`); the ring holds at most this many
    /// slots, so at least this many entries once full.
    capacity: usize,
    entries: Vec<Slot>,
    /// Slot the next entry overwrites once the buffer is full.
    next: usize,
    /// Entries recorded since recording began: those the ring keeps and those dropped
    /// (overwritten, not stored for lack of host memory, or cut by a smaller capacity).
    recorded: u64,
    /// Distinct streams of the stored entries (a handful in practice).
    streams: Vec<i64>,
    /// The most recently used stream and its index in `streams`.
    last_stream: Option<(i64, u32)>,
    /// `options.enabled != Off`, and `options.context >= Alloc` (trace entries keep their
    /// stacks), decided once in [`History::configure`] instead of at every entry.
    on: bool,
    keep_stacks: bool,
    /// The newest annotations, oldest first: a second ring of the same capacity, as PyTorch
    /// keeps them (annotations are not trace entries and are not counted as dropped).
    annotations: std::collections::VecDeque<RawAnnotation>,
    /// Entries recorded before the last `clear_history` or history off: a live listener's
    /// entry numbers are `live_base + recorded` and never restart (with them restarting, a
    /// listener connected before a clear received nothing until the new count passed its
    /// own, then silently missed the entries in between).
    live_base: u64,
    /// Annotations recorded since this history was made (never restarts): a live
    /// listener's annotation numbers.
    annotations_recorded: u64,
}

impl Default for History {
    fn default() -> Self {
        History {
            options: HistoryOptions::off(),
            capacity: 1,
            entries: Vec::new(),
            next: 0,
            recorded: 0,
            streams: Vec::new(),
            last_stream: None,
            on: false,
            keep_stacks: false,
            annotations: std::collections::VecDeque::new(),
            live_base: 0,
            annotations_recorded: 0,
        }
    }
}

impl History {
    #[inline]
    pub fn enabled(&self) -> bool {
        self.on
    }

    pub fn configure(&mut self, options: HistoryOptions) {
        if options.enabled == HistoryMode::Off {
            let (live_base, annotations_recorded) =
                (self.live_recorded(), self.annotations_recorded);
            *self = History {
                live_base,
                annotations_recorded,
                ..History::default()
            };
            return;
        }
        let capacity = match options.enabled {
            HistoryMode::State => 1,
            _ => options.max_entries.max(1),
        };
        let mut kept = if options.clear_history {
            self.live_base += self.recorded;
            self.recorded = 0;
            self.streams.clear();
            self.last_stream = None;
            Vec::new()
        } else {
            self.ordered_slots()
        };
        // The newest entries that fit the new capacity, of those kept now: the newest slots
        // that hold them. When that leaves only the `free_completed` half of the oldest
        // slot (its other half is over the capacity, or already was), the slot becomes a
        // plain `free_completed` one, so that the dropped half does not come back.
        let keep = held_entries(&kept, self.capacity).0.min(capacity);
        let mut held = 0;
        let mut newest = 0;
        for slot in kept.iter().rev() {
            if held >= keep {
                break;
            }
            held += slot.entries();
            newest += 1;
        }
        kept.drain(..kept.len() - newest);
        if held > keep {
            if let Some(oldest) = kept.first_mut() {
                oldest.time_action =
                    (oldest.time_action & !ACTION_MASK) | Action::FreeCompleted as u64;
            }
        }
        if options.clear_history {
            self.annotations.clear();
        }
        while self.annotations.len() > capacity {
            self.annotations.pop_front();
        }
        self.entries = kept;
        self.next = 0;
        self.capacity = capacity;
        self.options = options;
        self.on = true;
        self.keep_stacks = options.context >= ContextMode::Alloc;
    }

    /// The index of `stream` in the stream table (adding it), or `None` when host memory is
    /// short.
    #[inline]
    fn stream_index(&mut self, stream: i64) -> Option<u32> {
        if let Some((s, i)) = self.last_stream {
            if s == stream {
                return Some(i);
            }
        }
        let i = match self.streams.iter().position(|&s| s == stream) {
            Some(i) => i as u32,
            None => {
                if self.streams.try_reserve(1).is_err() {
                    return None;
                }
                self.streams.push(stream);
                (self.streams.len() - 1) as u32
            }
        };
        self.last_stream = Some((stream, i));
        Some(i)
    }

    /// Appends `entry` (when enabled), keeping its stack as given.
    #[inline]
    pub fn push(&mut self, entry: RawEntry) {
        if !self.enabled() {
            return;
        }
        self.store(
            entry.action,
            entry.addr,
            entry.size,
            entry.stream,
            entry.time_ns,
            entry.stack,
        );
    }

    /// The allocator's entry point: appends an entry when enabled, dropping its stack unless
    /// the context level puts stacks on trace entries (`alloc` or `all`).
    #[inline]
    pub(crate) fn record(
        &mut self,
        action: Action,
        addr: u64,
        size: u64,
        stream: i64,
        time_ns: u64,
        stack: RawStackId,
    ) {
        if !self.on {
            return;
        }
        let stack = if self.keep_stacks { stack } else { NO_STACK };
        self.store(action, addr, size, stream, time_ns, stack);
    }

    /// `free_requested` then `free_completed` of a block freed at once: two entries equal but
    /// for the action, stored in one slot.
    #[inline]
    pub(crate) fn record_free_pair(
        &mut self,
        addr: u64,
        size: u64,
        stream: i64,
        time_ns: u64,
        stack: RawStackId,
    ) {
        if !self.on {
            return;
        }
        let stack = if self.keep_stacks { stack } else { NO_STACK };
        self.recorded += 2;
        let Some(stream) = self.stream_index(stream) else {
            return;
        };
        self.put(Slot::new(FREE_PAIR_TAG, addr, size, stream, time_ns, stack));
    }

    #[inline]
    fn store(
        &mut self,
        action: Action,
        addr: u64,
        size: u64,
        stream: i64,
        time_ns: u64,
        stack: RawStackId,
    ) {
        self.recorded += 1;
        let Some(stream) = self.stream_index(stream) else {
            return;
        };
        self.put(Slot::new(action as u64, addr, size, stream, time_ns, stack));
    }

    /// Puts a slot in the ring (its entries are already counted in `recorded`): grows the
    /// buffer up to the capacity, then overwrites the oldest slot.
    #[inline]
    fn put(&mut self, slot: Slot) {
        if self.entries.len() < self.capacity {
            // Growing the buffer must not abort the host process when memory is short (the
            // entry is then counted as dropped).
            if self.entries.len() == self.entries.capacity() && self.entries.try_reserve(1).is_err()
            {
                return;
            }
            self.entries.push(slot);
        } else if let Some(old) = self.entries.get_mut(self.next) {
            *old = slot;
            self.next += 1;
            if self.next >= self.capacity {
                self.next = 0;
            }
        }
    }

    fn ordered_slots(&self) -> Vec<Slot> {
        let split = self.next.min(self.entries.len());
        let mut out = Vec::with_capacity(self.entries.len());
        out.extend_from_slice(&self.entries[split..]);
        out.extend_from_slice(&self.entries[..split]);
        out
    }

    /// A copy of the ring as stored (slots are 32 bytes, a [`RawEntry`] 40), read oldest
    /// first by [`RingTrace::iter`].
    pub(crate) fn trace_copy(&self) -> RingTrace {
        RingTrace::new(
            self.entries.clone(),
            self.next,
            self.streams.clone(),
            self.capacity,
        )
    }

    /// The ring itself, leaving this history empty (no copy: for an allocator that is done).
    /// The entries taken are no longer counted as recorded; the dropped ones still are.
    pub(crate) fn take_trace(&mut self) -> RingTrace {
        let next = std::mem::take(&mut self.next);
        let trace = RingTrace::new(
            std::mem::take(&mut self.entries),
            next,
            self.streams.clone(),
            self.capacity,
        );
        self.recorded -= trace.len() as u64;
        // Live numbers go on from where they were.
        self.live_base += trace.len() as u64;
        trace
    }

    /// The entries numbered `seq..` (an entry's number is its position among all entries
    /// recorded, see [`History::recorded`]), at most `max`, appended to `out`; returns the
    /// number of the first one given. When the ring no longer holds entry `seq` the result
    /// is the oldest entry it holds (a live listener that fell behind: the entries between
    /// were dropped).
    ///
    /// O(recorded − seq) slot reads (a walk back from the newest slot: slots hold one or two
    /// entries) plus O(max) copies.
    pub(crate) fn entries_since(&self, seq: u64, max: usize, out: &mut Vec<RawEntry>) -> u64 {
        // Live numbers to this history's (those before the last clear are gone: a `seq`
        // among them gets the oldest entry held, and the listener a `Dropped`).
        let local = seq.saturating_sub(self.live_base);
        self.live_base + self.entries_since_local(local, max, out)
    }

    /// [`History::entries_since`] in this history's numbers (from the last clear).
    fn entries_since_local(&self, seq: u64, max: usize, out: &mut Vec<RawEntry>) -> u64 {
        let want = self.recorded.saturating_sub(seq);
        let n = self.entries.len();
        if max == 0 {
            return seq;
        }
        if want == 0 || n == 0 {
            return self.recorded;
        }
        let split = self.next.min(n);
        let slot = |i: usize| &self.entries[(split + i) % n];
        // Walk back from the newest slot until `want` entries are covered.
        let mut counted = 0u64;
        let mut first = n;
        while first > 0 && counted < want {
            first -= 1;
            counted += slot(first).entries() as u64;
        }
        let avail = counted.min(want).min(self.capacity as u64);
        let skip = (counted - avail) as usize;
        let start = self.recorded - avail;
        out.extend(
            (first..n)
                .flat_map(|i| slot(i).expand(&self.streams))
                .skip(skip)
                .take(max),
        );
        start
    }

    /// The entries, oldest first.
    pub fn ordered(&self) -> Vec<RawEntry> {
        let split = self.next.min(self.entries.len());
        let (len, skip) = held_entries(&self.entries, self.capacity);
        let mut out = Vec::with_capacity(len);
        out.extend(
            self.entries[split..]
                .iter()
                .chain(&self.entries[..split])
                .flat_map(|slot| slot.expand(&self.streams))
                .skip(skip),
        );
        out
    }

    /// Entries the ring keeps (walks the ring: slots hold one or two entries).
    pub fn len(&self) -> usize {
        held_entries(&self.entries, self.capacity).0
    }

    /// Entries recorded since recording began: those kept and those dropped.
    pub fn recorded(&self) -> u64 {
        self.recorded
    }

    /// The number the next entry will have for a live listener: entries recorded since this
    /// history was made, across `clear_history` and history off (unlike [`History::recorded`],
    /// it never restarts).
    pub fn live_recorded(&self) -> u64 {
        self.live_base + self.recorded
    }

    /// Annotations recorded since this history was made (never restarts).
    pub fn annotations_recorded(&self) -> u64 {
        self.annotations_recorded
    }

    /// The annotations numbered `seq..` (an annotation's number is its position among all
    /// annotations recorded), at most `max`, appended to `out`; returns the number of the
    /// first one given, past `seq` when the ring no longer holds those (overwritten or
    /// cleared before a listener was sent them). O(max).
    pub(crate) fn annotations_since(
        &self,
        seq: u64,
        max: usize,
        out: &mut Vec<RawAnnotation>,
    ) -> u64 {
        let oldest = self.annotations_recorded - self.annotations.len() as u64;
        let first = seq.clamp(oldest, self.annotations_recorded);
        out.extend(
            self.annotations
                .range((first - oldest) as usize..)
                .take(max)
                .cloned(),
        );
        first
    }

    /// Entries dropped since recording began: overwritten, not stored for lack of host
    /// memory, or cut by a smaller capacity.
    pub fn dropped(&self) -> u64 {
        self.recorded - self.len() as u64
    }

    /// Appends an annotation (when enabled), dropping the oldest past the capacity.
    pub fn annotate(&mut self, annotation: RawAnnotation) {
        if !self.on {
            return;
        }
        if self.annotations.len() >= self.capacity {
            self.annotations.pop_front();
        }
        if self.annotations.try_reserve(1).is_ok() {
            self.annotations.push_back(annotation);
            // Counted when kept, so that the ring's annotations are numbered
            // `annotations_recorded - len..`.
            self.annotations_recorded += 1;
        }
    }

    /// The annotations, oldest first.
    pub fn annotations(&self) -> Vec<RawAnnotation> {
        self.annotations.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u64) -> RawEntry {
        RawEntry {
            action: Action::Alloc,
            addr: i,
            size: i,
            stream: 0,
            time_ns: i,
            stack: NO_STACK,
        }
    }

    fn all(max_entries: usize) -> HistoryOptions {
        HistoryOptions {
            max_entries,
            ..HistoryOptions::without_stacks()
        }
    }

    #[test]
    fn live_numbers_go_on_across_a_clear_history_off_and_a_taken_trace() {
        let mut h = History::default();
        h.configure(all(4));
        for i in 0..6 {
            h.push(entry(i));
        }
        assert_eq!(h.live_recorded(), 6);
        h.configure(HistoryOptions {
            clear_history: true,
            ..all(4)
        });
        assert_eq!((h.recorded(), h.live_recorded()), (0, 6));
        h.push(entry(6));
        // A listener that was sent 3 of the cleared entries gets the oldest one held (6).
        let mut out = Vec::new();
        assert_eq!(h.entries_since(3, 10, &mut out), 6);
        assert_eq!(out.iter().map(|e| e.addr).collect::<Vec<_>>(), [6]);
        h.configure(HistoryOptions {
            enabled: HistoryMode::Off,
            ..all(4)
        });
        h.configure(all(4));
        assert_eq!(h.live_recorded(), 7);
        h.push(entry(7));
        let _ = h.take_trace();
        assert_eq!(h.live_recorded(), 8);
    }

    #[test]
    fn annotations_are_numbered_and_those_overwritten_are_skipped() {
        let mut h = History::default();
        h.configure(all(2));
        for i in 0..5 {
            h.annotate(RawAnnotation {
                metadata: vec![("i".into(), i.to_string())],
                time_ns: i,
            });
        }
        let mut out = Vec::new();
        // Annotations 1 and 2 were overwritten: the ring holds 3 and 4.
        assert_eq!(h.annotations_since(1, 10, &mut out), 3);
        assert_eq!(out.iter().map(|a| a.time_ns).collect::<Vec<_>>(), [3, 4]);
        out.clear();
        assert_eq!(h.annotations_since(5, 10, &mut out), 5);
        assert!(out.is_empty());
    }

    #[test]
    fn packed_slots_round_trip_every_action_and_stream() {
        let mut h = History::default();
        h.configure(all(100));
        let mut pushed = Vec::new();
        for (i, &action) in Action::ALL.iter().enumerate() {
            assert_eq!(action as usize, i);
            let e = RawEntry {
                action,
                addr: u64::MAX - i as u64,
                size: i as u64 * 512,
                stream: [0, -1, i64::MAX, 0x7f00_dead_beef][i % 4],
                time_ns: (1 << 59) + i as u64,
                stack: i as u32,
            };
            h.push(e);
            pushed.push(e);
        }
        assert_eq!(h.ordered(), pushed);
    }

    #[test]
    fn ring_wraps_and_reads_oldest_first() {
        let mut h = History::default();
        h.configure(all(3));
        for i in 0..7 {
            h.push(entry(i));
        }
        let addrs: Vec<u64> = h.ordered().iter().map(|e| e.addr).collect();
        assert_eq!(addrs, vec![4, 5, 6]);
        assert_eq!(h.dropped(), 4);
    }

    #[test]
    fn state_mode_keeps_one_entry() {
        let mut h = History::default();
        h.configure(HistoryOptions {
            enabled: HistoryMode::State,
            ..all(1000)
        });
        for i in 0..5 {
            h.push(entry(i));
        }
        assert_eq!(h.ordered(), vec![entry(4)]);
    }

    #[test]
    fn disabling_clears_the_buffer() {
        let mut h = History::default();
        h.configure(all(10));
        h.push(entry(1));
        h.configure(HistoryOptions::off());
        assert_eq!(h.len(), 0);
        assert_eq!(h.dropped(), 0);
        h.push(entry(2));
        h.configure(all(10));
        assert_eq!(h.len(), 0, "entries pushed while off must not be kept");
    }

    #[test]
    fn shrinking_keeps_the_newest() {
        let mut h = History::default();
        h.configure(all(10));
        for i in 0..6 {
            h.push(entry(i));
        }
        h.configure(all(2));
        let addrs: Vec<u64> = h.ordered().iter().map(|e| e.addr).collect();
        assert_eq!(addrs, vec![4, 5]);
        assert_eq!(h.dropped(), 4);
    }

    #[test]
    fn a_block_freed_at_once_reads_as_free_requested_then_free_completed() {
        let mut h = History::default();
        h.configure(all(10));
        h.push(entry(1));
        h.record_free_pair(0x7f00_0000_0200, 1000, -3, 42, NO_STACK);
        let free = |action| RawEntry {
            action,
            addr: 0x7f00_0000_0200,
            size: 1000,
            stream: -3,
            time_ns: 42,
            stack: NO_STACK,
        };
        assert_eq!(
            h.ordered(),
            vec![
                entry(1),
                free(Action::FreeRequested),
                free(Action::FreeCompleted)
            ]
        );
        assert_eq!((h.len(), h.recorded(), h.dropped()), (3, 3, 0));
        assert_eq!(h.trace_copy().iter().collect::<Vec<_>>(), h.ordered());
    }

    /// One slot holds both free entries, so the ring can hold more entries than its
    /// capacity: the oldest over it (the `free_requested` half of a slot, possibly) are left
    /// out when read and counted as dropped.
    #[test]
    fn ring_wraps_to_exactly_the_newest_entries_when_a_free_pair_straddles_the_limit() {
        let mut h = History::default();
        h.configure(all(3));
        h.push(entry(1));
        h.record_free_pair(2, 2, 0, 2, NO_STACK);
        h.push(entry(3));
        h.record_free_pair(4, 4, 0, 4, NO_STACK);
        let read: Vec<(Action, u64)> = h.ordered().iter().map(|e| (e.action, e.addr)).collect();
        assert_eq!(
            read,
            vec![
                (Action::Alloc, 3),
                (Action::FreeRequested, 4),
                (Action::FreeCompleted, 4)
            ]
        );
        assert_eq!((h.len(), h.recorded(), h.dropped()), (3, 6, 3));
        h.push(entry(5));
        let read: Vec<(Action, u64)> = h.ordered().iter().map(|e| (e.action, e.addr)).collect();
        assert_eq!(
            read,
            vec![
                (Action::FreeRequested, 4),
                (Action::FreeCompleted, 4),
                (Action::Alloc, 5)
            ]
        );
        assert_eq!((h.len(), h.dropped()), (3, 4));
        assert!(
            h.entries.len() <= 3,
            "the ring holds at most capacity slots"
        );
    }

    #[test]
    fn taking_the_trace_keeps_the_dropped_count() {
        let mut h = History::default();
        h.configure(all(2));
        h.record_free_pair(1, 1, 0, 1, NO_STACK);
        h.record_free_pair(2, 2, 0, 2, NO_STACK);
        h.push(entry(3));
        assert_eq!((h.len(), h.dropped()), (2, 3));
        let trace = h.take_trace();
        assert_eq!(trace.len(), 2);
        let read: Vec<(Action, u64)> = trace.iter().map(|e| (e.action, e.addr)).collect();
        assert_eq!(read, vec![(Action::FreeCompleted, 2), (Action::Alloc, 3)]);
        assert_eq!((h.len(), h.dropped(), h.recorded()), (0, 3, 3));
    }

    /// Found by `ring_keeps_the_newest_entries_exactly`: with capacity 1, a free pair reads
    /// as its `free_completed` entry alone; growing the ring brought the dropped
    /// `free_requested` back.
    #[test]
    fn growing_the_ring_does_not_bring_back_a_dropped_free_requested() {
        let mut h = History::default();
        h.configure(all(1));
        h.record_free_pair(8, 8, 0, 8, NO_STACK);
        assert_eq!((h.len(), h.dropped()), (1, 1));
        h.configure(all(5));
        let read: Vec<Action> = h.ordered().iter().map(|e| e.action).collect();
        assert_eq!(read, vec![Action::FreeCompleted]);
        assert_eq!((h.len(), h.dropped()), (1, 1));
        h.record_free_pair(9, 9, 0, 9, NO_STACK);
        assert_eq!(h.len(), 3);
    }

    #[derive(Clone, Debug)]
    enum Op {
        One(u64),
        FreePair(u64),
        Resize(usize),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => any::<u64>().prop_map(Op::One),
            4 => any::<u64>().prop_map(Op::FreePair),
            1 => (1usize..12).prop_map(Op::Resize),
        ]
    }

    proptest::proptest! {
        #[test]
        fn ring_keeps_the_newest_entries_exactly(
            capacity in 1usize..12,
            ops in proptest::collection::vec(op(), 0..80),
        ) {
            let mut h = History::default();
            h.configure(all(capacity));
            // What the ring must keep: the newest `capacity` entries recorded since the last
            // resize, and the newest of those kept before it that fit.
            let mut capacity = capacity;
            let mut model: Vec<RawEntry> = Vec::new();
            let mut recorded = 0u64;
            for (i, op) in ops.into_iter().enumerate() {
                let time_ns = i as u64;
                match op {
                    Op::One(addr) => {
                        let e = RawEntry { addr, time_ns, ..entry(0) };
                        h.push(e);
                        model.push(e);
                        recorded += 1;
                    }
                    Op::FreePair(addr) => {
                        h.record_free_pair(addr, 512, 7, time_ns, NO_STACK);
                        for action in [Action::FreeRequested, Action::FreeCompleted] {
                            model.push(RawEntry { action, addr, size: 512, stream: 7, time_ns, stack: NO_STACK });
                        }
                        recorded += 2;
                    }
                    Op::Resize(c) => {
                        capacity = c;
                        h.configure(all(c));
                    }
                }
                model.drain(..model.len().saturating_sub(capacity));
                proptest::prop_assert_eq!(h.ordered(), model.clone());
                proptest::prop_assert_eq!(h.trace_copy().iter().collect::<Vec<_>>(), model.clone());
                proptest::prop_assert_eq!(h.len(), model.len());
                proptest::prop_assert_eq!(h.recorded(), recorded);
                proptest::prop_assert_eq!(h.dropped(), recorded - model.len() as u64);
                proptest::prop_assert!(h.entries.len() <= capacity);
            }
        }
    }
}
