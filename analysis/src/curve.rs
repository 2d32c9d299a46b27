//! Memory curves over the event axis, the time axis, and range min/max queries for drawing
//! them at any zoom.

use memsnap_format::Snapshot;
use serde::Serialize;

use crate::replay::{Allocation, Lifetime, Replay};

/// Which curve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum CurveKind {
    /// Requested bytes from `alloc` to `free_requested` (the trace's sizes).
    Allocated,
    /// Requested bytes from `alloc` to `free_completed` (includes pending frees).
    Active,
    /// Segment bytes (`segment_alloc`/`map` minus `segment_free`/`unmap`).
    Reserved,
}

impl CurveKind {
    pub const ALL: [CurveKind; 3] = [CurveKind::Allocated, CurveKind::Active, CurveKind::Reserved];

    /// The name counters and columns use: `allocated`, `active`, `reserved`.
    pub fn name(self) -> &'static str {
        match self {
            CurveKind::Allocated => "allocated",
            CurveKind::Active => "active",
            CurveKind::Reserved => "reserved",
        }
    }
}

/// A step function over the event axis: `initial` before event 0, then a value after each
/// event. A curve that changes at most events (allocated, active) keeps every value in 4 bytes
/// (an offset from its block's lowest value); one that changes rarely (reserved: segment
/// events are a few thousand of 10M) keeps only its changes, 12 bytes each.
#[derive(Clone, Debug, Default)]
pub struct Curve {
    pub initial: u64,
    values: CurveValues,
}

#[derive(Clone, Debug)]
enum CurveValues {
    /// The value after every event.
    Every(BlockValues),
    /// `values[k]` from event `events[k]` (ascending) until the next change; `initial`
    /// before the first. `len` events in all.
    Changes {
        len: usize,
        events: Vec<u32>,
        values: Vec<u64>,
    },
}

impl Default for CurveValues {
    fn default() -> Self {
        CurveValues::Every(BlockValues::default())
    }
}

/// Every value of a curve in blocks of [`BLOCK`] events: the block's lowest value and each
/// value's `u32` offset from it (8 bytes an event → 4; 10M events: 80 → 40 MB). A block whose
/// values span more than `u32::MAX` (4 GiB allocated or freed within 256 events), or whose
/// lowest value is `u64::MAX`, keeps its values in full in `wide`.
#[derive(Clone, Debug, Default)]
struct BlockValues {
    /// Each block's lowest value, or [`WIDE`] for a block kept in full.
    bases: Vec<u64>,
    offsets: Vec<u32>,
    /// `(block, values)` of the blocks kept in full, by block.
    wide: Vec<(u32, Vec<u64>)>,
}

/// The base of a block kept in full.
const WIDE: u64 = u64::MAX;

fn fold_min_max(values: impl Iterator<Item = u64>) -> (u64, u64) {
    values.fold((u64::MAX, 0), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

impl BlockValues {
    fn from_values(values: &[u64]) -> BlockValues {
        let mut bases = Vec::with_capacity(values.len().div_ceil(BLOCK));
        let mut offsets = Vec::with_capacity(values.len());
        let mut wide = Vec::new();
        for (block, chunk) in values.chunks(BLOCK).enumerate() {
            let (lo, hi) = fold_min_max(chunk.iter().copied());
            if lo != WIDE && hi - lo <= u64::from(u32::MAX) {
                bases.push(lo);
                offsets.extend(chunk.iter().map(|&v| (v - lo) as u32));
            } else {
                bases.push(WIDE);
                offsets.resize(offsets.len() + chunk.len(), 0);
                wide.push((block as u32, chunk.to_vec()));
            }
        }
        BlockValues {
            bases,
            offsets,
            wide,
        }
    }

    fn len(&self) -> usize {
        self.offsets.len()
    }

    /// The value after event `i` (`i < len`).
    #[inline]
    fn get(&self, i: usize) -> u64 {
        match self.bases[i / BLOCK] {
            WIDE => self.wide_block(i / BLOCK)[i % BLOCK],
            base => base + u64::from(self.offsets[i]),
        }
    }

    /// The values of a block kept in full.
    #[cold]
    fn wide_block(&self, block: usize) -> &[u64] {
        let k = self.wide.partition_point(|w| (w.0 as usize) < block);
        &self.wide[k].1
    }

    /// (min, max) of the values after events `lo..hi` (`lo < hi <= len`).
    fn min_max(&self, lo: usize, hi: usize) -> (u64, u64) {
        let mut acc = (u64::MAX, 0u64);
        let mut a = lo;
        while a < hi {
            let block = a / BLOCK;
            let b = hi.min((block + 1) * BLOCK);
            let part = match self.bases[block] {
                WIDE => {
                    let first = block * BLOCK;
                    fold_min_max(self.wide_block(block)[a - first..b - first].iter().copied())
                }
                base => {
                    let (l, h) = self.offsets[a..b]
                        .iter()
                        .fold((u32::MAX, 0u32), |(l, h), &o| (l.min(o), h.max(o)));
                    (base + u64::from(l), base + u64::from(h))
                }
            };
            acc = (acc.0.min(part.0), acc.1.max(part.1));
            a = b;
        }
        acc
    }

    /// (min, max) of each block.
    fn block_min_max(&self) -> Vec<(u64, u64)> {
        (0..self.bases.len())
            .map(|block| self.min_max(block * BLOCK, self.len().min((block + 1) * BLOCK)))
            .collect()
    }
}

impl Curve {
    /// A curve from its value after every event. O(n).
    pub fn from_values(initial: u64, after: &[u64]) -> Curve {
        Curve {
            initial,
            values: CurveValues::Every(BlockValues::from_values(after)),
        }
    }

    /// A curve of `len` events from `initial` and signed changes `(event, bytes)` in event
    /// order (several per event allowed, `event < len`); values are clamped to
    /// `0..=u64::MAX`. It keeps only the events where the value changes, unless every value
    /// takes less room. O(c), or O(c + len) when every value is kept.
    pub fn from_changes(
        initial: u64,
        len: usize,
        changes: impl IntoIterator<Item = (u32, i128)>,
    ) -> Curve {
        let mut events: Vec<u32> = Vec::new();
        let mut values: Vec<u64> = Vec::new();
        let mut sum = i128::from(initial);
        let mut last = initial;
        let mut pending: Option<u32> = None;
        let mut flush = |event: u32, sum: i128, last: &mut u64| {
            let v = clamp_u64(sum);
            if v != *last {
                events.push(event);
                values.push(v);
                *last = v;
            }
        };
        for (event, bytes) in changes {
            debug_assert!((event as usize) < len && pending.is_none_or(|p| p <= event));
            if let Some(p) = pending.filter(|&p| p != event) {
                flush(p, sum, &mut last);
            }
            pending = Some(event);
            sum = sum.saturating_add(bytes);
        }
        if let Some(p) = pending {
            flush(p, sum, &mut last);
        }
        // 12 bytes a change against 4 an event.
        let kept_as_changes = events.len() * 12 <= len * 4;
        let curve = Curve {
            initial,
            values: CurveValues::Changes {
                len,
                events,
                values,
            },
        };
        if kept_as_changes {
            curve
        } else {
            let every: Vec<u64> = curve.values().collect();
            Curve::from_values(initial, &every)
        }
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        match &self.values {
            CurveValues::Every(every) => every.len(),
            CurveValues::Changes { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value after event `event` (`initial` when the trace is empty; the last value past
    /// the end). O(1); O(log c) for a curve kept as its `c` changes.
    pub fn at(&self, event: u32) -> u64 {
        match &self.values {
            CurveValues::Every(every) => match every.len() {
                0 => self.initial,
                n => every.get((event as usize).min(n - 1)),
            },
            CurveValues::Changes { events, values, .. } => {
                match events.partition_point(|&e| e <= event) {
                    0 => self.initial,
                    k => values[k - 1],
                }
            }
        }
    }

    /// The value before event `event`: after the one before it, `initial` before the first.
    /// What a step or phase starting at `event` starts from. Cost of [`Curve::at`].
    pub fn before(&self, event: u32) -> u64 {
        match event.checked_sub(1) {
            Some(previous) => self.at(previous),
            None => self.initial,
        }
    }

    /// The value after every event, in event order (O(1) each).
    pub fn values(&self) -> Values<'_> {
        Values {
            curve: self,
            event: 0,
            change: 0,
            value: self.initial,
        }
    }

    /// (min, max) of the values after events `lo..hi` (clamped to the curve; `None` when
    /// empty), from the values it keeps: a pass over many events is faster this way than
    /// through [`Curve::at`] event by event. O(hi - lo); O(log c + changes in the range) for
    /// a curve kept as changes.
    pub fn min_max(&self, lo: usize, hi: usize) -> Option<(u64, u64)> {
        let hi = hi.min(self.len());
        if lo >= hi {
            return None;
        }
        Some(match &self.values {
            CurveValues::Every(every) => every.min_max(lo, hi),
            CurveValues::Changes { events, values, .. } => {
                let first = self.at(lo as u32);
                let inside = (
                    events.partition_point(|&e| e as usize <= lo),
                    events.partition_point(|&e| (e as usize) < hi),
                );
                let (min, max) = fold_min_max(values[inside.0..inside.1].iter().copied());
                (min.min(first), max.max(first))
            }
        })
    }

    /// Over the values after events `start..=end` (past the end, the last value, as
    /// [`Curve::at`] reads): the first event reaching the highest, that value, and the lowest.
    /// Inside the curve the extremes come from [`Curve::min_max`] and only the search for the
    /// first peak reads event by event. O(end - start) (times O(log c) for a curve kept as
    /// changes).
    pub fn peak_in(&self, start: u32, end: u32) -> (u32, u64, u64) {
        let inside = start <= end && (end as usize) < self.len();
        if let Some((min, max)) = self
            .min_max(start as usize, end as usize + 1)
            .filter(|_| inside)
        {
            let first = (start..=end).find(|&e| self.at(e) == max).unwrap_or(start);
            return (first, max, min);
        }
        let (mut peak_event, mut peak, mut min) = (start, self.at(start), self.at(start));
        for e in start..=end {
            let v = self.at(e);
            if v > peak {
                peak = v;
                peak_event = e;
            }
            min = min.min(v);
        }
        (peak_event, peak, min)
    }

    /// The highest value and the first event reaching it. The state before event 0 counts
    /// too (memory from before the window that the first events free): then the event is
    /// `None`, as it is for an empty trace. O(n); O(c) for a curve kept as changes.
    pub fn max(&self) -> (u64, Option<u32>) {
        let mut best = (self.initial, None);
        match &self.values {
            CurveValues::Every(every) => {
                // The first event reaching the highest value, if that is not below `initial`.
                let n = every.len();
                let Some(highest) = (0..every.bases.len())
                    .map(|block| every.min_max(block * BLOCK, n.min((block + 1) * BLOCK)).1)
                    .max()
                else {
                    return best;
                };
                if highest >= best.0 {
                    let first = (0..n).find(|&i| every.get(i) == highest);
                    best = (highest, first.map(|i| i as u32));
                }
            }
            CurveValues::Changes {
                len,
                events,
                values,
            } => {
                if *len == 0 {
                    return best;
                }
                // Event 0 reaches `initial` too; after it, only a change can rise higher.
                let first = self.at(0);
                if first >= best.0 {
                    best = (first, Some(0));
                }
                for (&e, &v) in events.iter().zip(values) {
                    if e > 0 && v > best.0 {
                        best = (v, Some(e));
                    }
                }
            }
        }
        best
    }

    /// Builds a curve from per-event signed deltas and an initial value; values are clamped to
    /// `0..=u64::MAX` so inconsistent input cannot wrap. O(n).
    pub fn from_deltas(initial: u64, deltas: &[i128]) -> Curve {
        curve_from_deltas(initial, deltas.len(), |delta| {
            for (event, &bytes) in deltas.iter().enumerate() {
                delta(event as u32, bytes);
            }
        })
    }
}

/// The same JSON as when a curve was `{initial, after: [every value]}`.
impl Serialize for Curve {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Every<'c>(&'c Curve);
        impl Serialize for Every<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.values())
            }
        }
        let mut s = serializer.serialize_struct("Curve", 2)?;
        s.serialize_field("initial", &self.initial)?;
        s.serialize_field("after", &Every(self))?;
        s.end()
    }
}

/// [`Curve::values`]: the value after each event, in order.
pub struct Values<'c> {
    curve: &'c Curve,
    event: usize,
    /// The next change not yet reached (for a curve kept as changes).
    change: usize,
    value: u64,
}

impl Iterator for Values<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let event = self.event;
        if event >= self.curve.len() {
            return None;
        }
        self.event += 1;
        match &self.curve.values {
            CurveValues::Every(every) => Some(every.get(event)),
            CurveValues::Changes { events, values, .. } => {
                if events
                    .get(self.change)
                    .is_some_and(|&e| e as usize == event)
                {
                    self.value = values[self.change];
                    self.change += 1;
                }
                Some(self.value)
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.curve.len() - self.event;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Values<'_> {}

/// A curve of `n` events from `initial` and the deltas `visit` reports (`delta(event, bytes)`,
/// any number per event, `event < n`); values are clamped to `0..=u64::MAX`, so inconsistent
/// input cannot wrap.
///
/// Each event's deltas are summed as an `i32` in the slot that becomes its offset (deltas or
/// sums beyond `i32`, tensors of 2 GiB and more, are summed apart), and each block's values
/// are then turned into offsets in place: building costs the 4 bytes an event the curve
/// keeps, not 8 (or 16) an event of deltas on top.
pub(crate) fn curve_from_deltas(
    initial: u64,
    n: usize,
    visit: impl FnOnce(&mut dyn FnMut(u32, i128)),
) -> Curve {
    // Written with zeros first, not `vec![0; n]`: that gets the kernel's shared zero pages,
    // so reading a slot before adding to it faulted twice per page (the zero page mapped,
    // then copied on the write with a TLB flush across every thread of the process): one
    // giant step's curves took twice as long. The zero goes through `black_box` so that the
    // compiler cannot fold the allocation and the fill back into that zeroed allocation.
    let mut slots = Vec::with_capacity(n);
    slots.resize(n, std::hint::black_box(0u32));
    let mut wide_deltas: Vec<(u32, i128)> = Vec::new();
    visit(&mut |event, bytes| {
        let slot = &mut slots[event as usize];
        match i32::try_from(bytes)
            .ok()
            .and_then(|b| (*slot as i32).checked_add(b))
        {
            Some(sum) => *slot = sum as u32,
            None => wide_deltas.push((event, bytes)),
        }
    });
    wide_deltas.sort_unstable_by_key(|&(event, _)| event);
    let mut wide_deltas = wide_deltas.into_iter().peekable();
    let mut sum = i128::from(initial);
    let mut bases = Vec::with_capacity(n.div_ceil(BLOCK));
    let mut wide = Vec::new();
    let mut values = [0u64; BLOCK];
    for (block, chunk) in slots.chunks_mut(BLOCK).enumerate() {
        for (j, slot) in chunk.iter().enumerate() {
            sum += i128::from(*slot as i32);
            let event = (block * BLOCK + j) as u32;
            while let Some((_, bytes)) = wide_deltas.next_if(|&(e, _)| e == event) {
                sum += bytes;
            }
            values[j] = clamp_u64(sum);
        }
        let values = &values[..chunk.len()];
        let (lo, hi) = fold_min_max(values.iter().copied());
        if lo != WIDE && hi - lo <= u64::from(u32::MAX) {
            bases.push(lo);
            for (slot, &v) in chunk.iter_mut().zip(values) {
                *slot = (v - lo) as u32;
            }
        } else {
            bases.push(WIDE);
            chunk.fill(0);
            wide.push((block as u32, values.to_vec()));
        }
    }
    Curve {
        initial,
        values: CurveValues::Every(BlockValues {
            bases,
            offsets: slots,
            wide,
        }),
    }
}

/// The bytes of `allocations` live for `lifetime` after each of `n` events (those from before
/// the window make the initial value).
pub(crate) fn allocation_curve<'a>(
    allocations: impl Iterator<Item = &'a Allocation> + Clone,
    n: usize,
    lifetime: Lifetime,
) -> Curve {
    let initial = allocations
        .clone()
        .filter(|a| a.before_window())
        .fold(0u64, |s, a| s.saturating_add(a.size));
    curve_from_deltas(initial, n, |delta| {
        for a in allocations {
            if let Some(e) = a.alloc_event() {
                delta(e, i128::from(a.size));
            }
            if let Some(f) = a.end_event(lifetime) {
                delta(f, -i128::from(a.size));
            }
        }
    })
}

pub(crate) fn clamp_u64(v: i128) -> u64 {
    u64::try_from(v.max(0)).unwrap_or(u64::MAX)
}

/// The three curves of a device.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Curves {
    pub allocated: Curve,
    pub active: Curve,
    pub reserved: Curve,
}

impl Curves {
    /// Computes the curves from a replay (which keeps the trace's segment events).
    ///
    /// Each curve's per-event deltas are summed in place in the vector that becomes the curve
    /// (see `curve_from_deltas`): at 10M events building costs the 40 MB a curve keeps.
    /// The allocated and active curves are built side by side (each writes its frees at
    /// random events: one giant step's 4M allocations took 0.4 s for the two one after the
    /// other). O(n + m) in the events and allocations.
    pub fn build(replay: &Replay) -> Curves {
        let n = replay.trace_len as usize;
        let (allocated, active) = std::thread::scope(|scope| {
            let allocated =
                scope.spawn(|| allocation_curve(replay.allocations.iter(), n, Lifetime::Allocated));
            let active = allocation_curve(replay.allocations.iter(), n, Lifetime::Active);
            (crate::join(allocated), active)
        });
        // Segment events are few: the reserved curve keeps only its changes (at 10M events
        // that is a few KB instead of 80 MB).
        let reserved = Curve::from_changes(
            replay.reserved_before_window,
            n,
            replay.reserved_changes.iter().copied(),
        );
        Curves {
            allocated,
            active,
            reserved,
        }
    }

    pub fn get(&self, kind: CurveKind) -> &Curve {
        match kind {
            CurveKind::Allocated => &self.allocated,
            CurveKind::Active => &self.active,
            CurveKind::Reserved => &self.reserved,
        }
    }

    /// The curve whose value is the sum of the live set for this lifetime.
    pub fn for_lifetime(&self, lifetime: Lifetime) -> &Curve {
        match lifetime {
            Lifetime::Allocated => &self.allocated,
            Lifetime::Active => &self.active,
        }
    }
}

/// The time axis: `time_us` per event, when the trace has times.
///
/// Entries without a time take the previous entry's (the first ones the first known time),
/// and a time earlier than the one before it is raised to it, so the axis is monotonic and
/// can be searched.
#[derive(Clone, Debug, Default)]
pub struct TimeAxis {
    times: Option<Times>,
}

/// The per-event times: as 32-bit microsecond offsets from the first time of their block of
/// [`TIME_BLOCK`] events (4 bytes an event instead of 8: 40 MB of a 10M-entry run), when
/// every block spans at most `u32::MAX` µs (71 minutes); else in full. (One offset from the
/// first time of the whole window held only while the window spanned 71 minutes: a week-long
/// job's ring buffer kept full times.)
#[derive(Clone, Debug)]
enum Times {
    Blocks {
        /// The first time of each block.
        bases: Vec<i64>,
        offsets: Vec<u32>,
    },
    Full(Vec<i64>),
}

/// Events per block of [`Times::Blocks`].
const TIME_BLOCK_BITS: u32 = 12;
const TIME_BLOCK: usize = 1 << TIME_BLOCK_BITS;

impl Times {
    /// The monotonic times of entries with these raw times, `first` the first time among
    /// them. One pass while every offset fits (the usual case); a block that spans more than
    /// 71 minutes starts over with full times.
    fn build(first: i64, raw: impl Iterator<Item = Option<i64>> + Clone) -> Times {
        let monotonic = || {
            let mut last = first;
            raw.clone().map(move |t| {
                last = t.unwrap_or(last).max(last);
                last
            })
        };
        // Sized once: grown by doubling, the offsets of a 10M-entry trace were copied about
        // twenty times and, at their last growth, held twice.
        let (len, _) = raw.size_hint();
        let mut bases = Vec::with_capacity(len.div_ceil(TIME_BLOCK));
        let mut offsets = Vec::with_capacity(len);
        let mut base = first;
        for (i, t) in monotonic().enumerate() {
            if i % TIME_BLOCK == 0 {
                base = t;
                bases.push(t);
            }
            match u32::try_from(i128::from(t) - i128::from(base)) {
                Ok(offset) => offsets.push(offset),
                Err(_) => {
                    drop(offsets);
                    return Times::Full(monotonic().collect());
                }
            }
        }
        Times::Blocks { bases, offsets }
    }

    fn len(&self) -> usize {
        match self {
            Times::Blocks { offsets, .. } => offsets.len(),
            Times::Full(times) => times.len(),
        }
    }

    /// The time of event `i` (`i < len`).
    #[inline]
    fn get(&self, i: usize) -> i64 {
        match self {
            Times::Blocks { bases, offsets } => bases[i >> TIME_BLOCK_BITS] + i64::from(offsets[i]),
            Times::Full(times) => times[i],
        }
    }

    /// The number of leading events whose time satisfies `pred` (monotonic: true, then false).
    fn partition_point(&self, pred: impl Fn(i64) -> bool) -> usize {
        match self {
            Times::Blocks { bases, offsets } => {
                // The blocks whose first time satisfies it; the answer is in the last of them.
                let Some(block) = bases.partition_point(|&b| pred(b)).checked_sub(1) else {
                    return 0;
                };
                let base = bases[block];
                let from = block << TIME_BLOCK_BITS;
                let to = (from + TIME_BLOCK).min(offsets.len());
                from + offsets[from..to].partition_point(|&o| pred(base + i64::from(o)))
            }
            Times::Full(times) => times.partition_point(|&t| pred(t)),
        }
    }
}

impl TimeAxis {
    /// The axis of a device's trace. O(n). Its queries: O(1) by event, O(log n) by time.
    pub fn build(snapshot: &Snapshot, device: i64) -> TimeAxis {
        let trace = usize::try_from(device)
            .ok()
            .and_then(|d| snapshot.traces().get(d));
        let Some(trace) = trace else {
            return TimeAxis { times: None };
        };
        let Some(first) = trace.iter().find_map(|e| e.time_us()) else {
            return TimeAxis { times: None };
        };
        TimeAxis {
            times: Some(Times::build(first, trace.iter().map(|e| e.time_us()))),
        }
    }

    /// Whether the trace has times.
    pub fn has_time(&self) -> bool {
        self.times.is_some()
    }

    /// The number of events with a time (0 when the trace has none).
    pub fn len(&self) -> usize {
        self.times.as_ref().map_or(0, Times::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first and last times.
    pub fn span(&self) -> Option<(i64, i64)> {
        let t = self.times.as_ref()?;
        let n = t.len();
        (n > 0).then(|| (t.get(0), t.get(n - 1)))
    }

    /// The time of event `event` (clamped to the trace).
    pub fn time_of(&self, event: u32) -> Option<i64> {
        let t = self.times.as_ref()?;
        let n = t.len();
        (n > 0).then(|| t.get((event as usize).min(n - 1)))
    }

    /// The time at a fractional event position (linear between events).
    pub fn time_at(&self, x: f64) -> Option<f64> {
        let t = self.times.as_ref()?;
        let n = t.len();
        if n == 0 || !x.is_finite() {
            return None;
        }
        let x = x.clamp(0.0, (n - 1) as f64);
        let i = x.floor() as usize;
        let frac = x - i as f64;
        let a = t.get(i) as f64;
        let b = if i + 1 < n { t.get(i + 1) as f64 } else { a };
        Some(a + (b - a) * frac)
    }

    /// The fractional event position of a time: the inverse of [`TimeAxis::time_at`]
    /// (clamped to the trace).
    pub fn event_at(&self, time_us: f64) -> Option<f64> {
        let t = self.times.as_ref()?;
        let n = t.len();
        if n == 0 || !time_us.is_finite() {
            return None;
        }
        // First event whose time is > time_us.
        let upper = t.partition_point(|v| (v as f64) <= time_us);
        if upper == 0 {
            return Some(0.0);
        }
        let i = upper - 1;
        if i + 1 >= n {
            return Some(i as f64);
        }
        let (a, b) = (t.get(i) as f64, t.get(i + 1) as f64);
        Some(if b > a {
            i as f64 + (time_us - a) / (b - a)
        } else {
            i as f64
        })
    }

    /// The first event at or after `time_us` (for named ranges and step boundaries).
    pub fn first_event_at_or_after(&self, time_us: i64) -> Option<u32> {
        let t = self.times.as_ref()?;
        Some(t.partition_point(|v| v < time_us) as u32)
    }

    /// The last event at or before `time_us` (`None` if every event is later).
    pub fn last_event_at_or_before(&self, time_us: i64) -> Option<u32> {
        let t = self.times.as_ref()?;
        (t.partition_point(|v| v <= time_us) as u32).checked_sub(1)
    }
}

/// The same JSON as when the axis was `{times: [every time] | null}`.
impl Serialize for TimeAxis {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Every<'t>(&'t Times);
        impl Serialize for Every<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq((0..self.0.len()).map(|i| self.0.get(i)))
            }
        }
        let mut s = serializer.serialize_struct("TimeAxis", 1)?;
        s.serialize_field("times", &self.times.as_ref().map(Every))?;
        s.end()
    }
}

/// Min and max of a curve over any event range in O(1) (a [`RangeMinMax`] over the values
/// the curve keeps; for a curve kept as changes, the value at the range's start and the
/// changes inside it).
#[derive(Clone, Debug, Default)]
pub struct CurveMinMax {
    table: RangeMinMax,
}

impl CurveMinMax {
    pub fn build(curve: &Curve) -> CurveMinMax {
        let table = match &curve.values {
            CurveValues::Every(every) => {
                RangeMinMax::from_blocks(every.len(), every.block_min_max())
            }
            CurveValues::Changes { values, .. } => RangeMinMax::build(values),
        };
        CurveMinMax { table }
    }

    /// (min, max) of the values after events `lo..hi` of `curve` (the curve the table was
    /// built from); `None` for an empty range.
    pub fn query(&self, curve: &Curve, lo: usize, hi: usize) -> Option<(u64, u64)> {
        match &curve.values {
            CurveValues::Every(every) => self.table.query_with(lo, hi, |a, b| every.min_max(a, b)),
            CurveValues::Changes {
                len,
                events,
                values,
            } => {
                let hi = hi.min(*len);
                if lo >= hi {
                    return None;
                }
                let first = curve.at(lo as u32);
                let inside = (
                    events.partition_point(|&e| e as usize <= lo),
                    events.partition_point(|&e| (e as usize) < hi),
                );
                Some(match self.table.query(values, inside.0, inside.1) {
                    Some((min, max)) => (min.min(first), max.max(first)),
                    None => (first, first),
                })
            }
        }
    }
}

/// Min and max of a value slice over any index range, in O(1) after an O(n) build: a block
/// decomposition (256 values per block) with a sparse table over the blocks. It does not
/// keep the values (a curve of 10M events is 80 MB): queries take the slice it was built
/// from.
#[derive(Clone, Debug, Default)]
pub struct RangeMinMax {
    len: usize,
    /// `levels[k][b]` = (min, max) over blocks `b .. b + 2^k`.
    levels: Vec<Vec<(u64, u64)>>,
}

/// Values per block: the table is about `n / BLOCK * log2(n / BLOCK)` pairs (10 MB for 10M
/// values), and a query scans at most two partial blocks.
const BLOCK: usize = 256;

impl RangeMinMax {
    pub fn build(values: &[u64]) -> RangeMinMax {
        let blocks = values
            .chunks(BLOCK)
            .map(|c| fold_min_max(c.iter().copied()))
            .collect();
        Self::from_blocks(values.len(), blocks)
    }

    /// The table over `len` values from each block's (min, max).
    fn from_blocks(len: usize, blocks: Vec<(u64, u64)>) -> RangeMinMax {
        let mut levels = vec![blocks];
        let mut width = 1;
        while width * 2 <= levels[0].len() {
            let prev = &levels[levels.len() - 1];
            let next: Vec<(u64, u64)> = (0..prev.len() - width)
                .map(|b| {
                    let (a, c) = (prev[b], prev[b + width]);
                    (a.0.min(c.0), a.1.max(c.1))
                })
                .collect();
            levels.push(next);
            width *= 2;
        }
        RangeMinMax { len, levels }
    }

    /// (min, max) over `values[lo..hi]`, where `values` is the slice the table was built
    /// from; `None` for an empty range (or a slice of another length).
    pub fn query(&self, values: &[u64], lo: usize, hi: usize) -> Option<(u64, u64)> {
        if values.len() != self.len {
            return None;
        }
        self.query_with(lo, hi, |a, b| fold_min_max(values[a..b].iter().copied()))
    }

    /// (min, max) over `lo..hi` with `scan(a, b)` giving the (min, max) of `a..b` (`a < b`)
    /// for the partial blocks at either end.
    fn query_with(
        &self,
        lo: usize,
        hi: usize,
        scan: impl Fn(usize, usize) -> (u64, u64),
    ) -> Option<(u64, u64)> {
        let hi = hi.min(self.len);
        if lo >= hi {
            return None;
        }
        let (first_block, last_block) = (lo.div_ceil(BLOCK), hi / BLOCK);
        if first_block >= last_block {
            return Some(scan(lo, hi));
        }
        let mut acc = (u64::MAX, 0u64);
        let mut merge = |(l, h): (u64, u64)| acc = (acc.0.min(l), acc.1.max(h));
        if lo < first_block * BLOCK {
            merge(scan(lo, first_block * BLOCK));
        }
        if last_block * BLOCK < hi {
            merge(scan(last_block * BLOCK, hi));
        }
        let count = last_block - first_block;
        let k = usize::BITS as usize - 1 - count.leading_zeros() as usize;
        let level = &self.levels[k];
        merge(level[first_block]);
        merge(level[last_block - (1 << k)]);
        Some(acc)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The axis of these raw times, compact where the span allows, and the same kept in full.
    fn both_axes(raw: &[Option<i64>]) -> Option<(TimeAxis, TimeAxis)> {
        let first = raw.iter().find_map(|&t| t)?;
        let compact = Times::build(first, raw.iter().copied());
        let full = Times::Full((0..compact.len()).map(|i| compact.get(i)).collect());
        Some((
            TimeAxis {
                times: Some(compact),
            },
            TimeAxis { times: Some(full) },
        ))
    }

    /// Every query the axis answers, on both representations.
    fn assert_same_answers(compact: &TimeAxis, full: &TimeAxis, probes: &[i64]) {
        let n = full.len() as u32;
        assert_eq!((compact.len(), compact.span()), (full.len(), full.span()));
        for e in 0..n + 2 {
            assert_eq!(compact.time_of(e), full.time_of(e), "time_of({e})");
            let x = f64::from(e) - 0.25;
            assert_eq!(compact.time_at(x), full.time_at(x), "time_at({x})");
        }
        for &t in probes {
            assert_eq!(
                compact.first_event_at_or_after(t),
                full.first_event_at_or_after(t)
            );
            assert_eq!(
                compact.last_event_at_or_before(t),
                full.last_event_at_or_before(t)
            );
            let x = t as f64 + 0.5;
            assert_eq!(compact.event_at(x), full.event_at(x), "event_at({x})");
        }
    }

    #[test]
    fn time_offsets_hold_while_a_block_spans_up_to_71_minutes_and_else_full_times() {
        let max = i64::from(u32::MAX);
        // A week of events 5 minutes apart: each block of 4,096 spans 14 days, too long;
        // 10 ms apart, 14 blocks that each span 41 s, however long the whole window.
        let week: Vec<Option<i64>> = (0..2_016).map(|i| Some(i * 300_000_000)).collect();
        let long_window: Vec<Option<i64>> = (0..14 * 4_096 + 5)
            .map(|i| Some(1_700_000_000_000_000 + i * 10_000))
            .collect();
        // A block boundary right before a jump longer than 71 minutes: each block fits.
        let jump_at_block: Vec<Option<i64>> = (0..2 * 4_096)
            .map(|i| Some(if i < 4_096 { i } else { 2 * max + i }))
            .collect();
        let cases: [(&[Option<i64>], bool); 9] = [
            (&[Some(5)], true),
            (&[None, Some(-40), None, Some(-50), Some(10)], true),
            (&[Some(1_000), None, Some(1_000 + max)], true),
            // One microsecond past 71 minutes: offsets would wrap.
            (&[Some(1_000), Some(2_000), Some(1_001 + max)], false),
            (&[Some(i64::MIN), Some(0), Some(i64::MAX)], false),
            (&[Some(-3 * max), None, Some(0), Some(3 * max)], false),
            (&week, false),
            (&long_window, true),
            (&jump_at_block, true),
        ];
        for (raw, compact_expected) in cases {
            let (axis, full) = both_axes(raw).unwrap();
            assert_eq!(
                matches!(axis.times, Some(Times::Blocks { .. })),
                compact_expected,
                "{raw:?}"
            );
            let mut probes: Vec<i64> = raw.iter().flatten().copied().collect();
            probes.extend(
                probes
                    .clone()
                    .iter()
                    .flat_map(|&t| [t.saturating_sub(1), t.saturating_add(1)]),
            );
            assert_same_answers(&axis, &full, &probes);
        }
        assert!(both_axes(&[None, None]).is_none());
    }

    /// The highest value and its first event as the curve defines it, on plain values.
    fn reference_max(initial: u64, values: &[u64]) -> (u64, Option<u32>) {
        let mut best = (initial, None);
        for (i, &v) in values.iter().enumerate() {
            if v > best.0 || (best.1.is_none() && v == best.0) {
                best = (v, Some(i as u32));
            }
        }
        best
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Times kept as offsets from their block's first answer every query as the same
        /// times kept in full, across block boundaries, missing and backward times.
        #[test]
        fn block_time_offsets_answer_as_full_times(
            first in -(1i64 << 50)..(1i64 << 50),
            // Mostly small steps; a jump of 35 minutes to 2.4 hours now and then (a block
            // that holds one longer than 71 minutes keeps the whole axis in full).
            steps in proptest::collection::vec(
                prop_oneof![
                    3000 => (0i64..50).prop_map(Some),
                    300 => (-20i64..0).prop_map(Some),
                    300 => Just(None),
                    1 => (1i64 << 31..1 << 33).prop_map(Some),
                ],
                1..9_000,
            ),
            probe_every in 1usize..200,
        ) {
            let mut t = first;
            let raw: Vec<Option<i64>> = steps
                .iter()
                .map(|step| step.map(|d| {
                    t += d;
                    t
                }))
                .collect();
            let Some((axis, full)) = both_axes(&raw) else {
                return Ok(());
            };
            // Every `probe_every`-th time and the times around each block boundary.
            let boundary = |i: usize| matches!(i % TIME_BLOCK, 0 | 1 | 4094 | 4095);
            let probes: Vec<i64> = (0..full.len())
                .filter(|&i| i % probe_every == 0 || boundary(i))
                .filter_map(|i| full.time_of(i as u32))
                .flat_map(|t| [t - 1, t, t + 1])
                .collect();
            assert_same_answers(&axis, &full, &probes);
        }

        /// Values kept as offsets from their block's lowest (and blocks spanning more than
        /// `u32`, or at `u64::MAX`, kept in full) read back as they were.
        #[test]
        fn block_offsets_read_back_every_value(
            initial in prop_oneof![Just(0u64), Just(u64::MAX), 0u64..1 << 40],
            // Runs of small values, some lifted high (offsets from a high base), some with a
            // value 8 GiB up or at `u64::MAX` (blocks kept in full).
            runs in proptest::collection::vec(
                (0u8..4, proptest::collection::vec(0u64..1000, 1..300)),
                0..6,
            ),
            ranges in proptest::collection::vec((0usize..1900, 0usize..1900), 1..20),
        ) {
            let mut values = Vec::new();
            for (kind, run) in runs {
                let start = values.len();
                values.extend(run.iter().map(|&v| if kind == 1 { v + (1 << 40) } else { v }));
                match kind {
                    2 => values[start] = 1 << 33,
                    3 => values[start] = u64::MAX,
                    _ => {}
                }
            }
            let curve = Curve::from_values(initial, &values);
            prop_assert_eq!(curve.len(), values.len());
            prop_assert_eq!(curve.values().collect::<Vec<_>>(), values.clone());
            for e in 0..values.len() as u32 + 2 {
                let want = values.get(e as usize).or(values.last()).copied().unwrap_or(initial);
                prop_assert_eq!(curve.at(e), want);
            }
            prop_assert_eq!(curve.max(), reference_max(initial, &values));
            let table = CurveMinMax::build(&curve);
            for &(a, b) in &ranges {
                let (start, end) = (a as u32, b as u32);
                let (mut peak_event, mut peak, mut min) = (start, curve.at(start), curve.at(start));
                for e in start..=end {
                    let v = curve.at(e);
                    if v > peak {
                        peak = v;
                        peak_event = e;
                    }
                    min = min.min(v);
                }
                prop_assert_eq!(curve.peak_in(start, end), (peak_event, peak, min), "{}..={}", start, end);
            }
            for (a, b) in ranges {
                let (lo, hi) = (a.min(b), a.max(b).min(values.len()));
                let want = (lo < hi).then(|| fold_min_max(values[lo..hi].iter().copied()));
                prop_assert_eq!(table.query(&curve, lo, a.max(b)), want, "{}..{}", lo, hi);
                prop_assert_eq!(curve.min_max(lo, a.max(b)), want, "{}..{}", lo, hi);
            }
        }

        /// Deltas summed in `i32` slots (those beyond `i32` apart) give the exact running
        /// sum, clamped, whatever the mix of small and huge deltas per event.
        #[test]
        fn curve_from_deltas_equals_the_clamped_running_sum(
            initial in prop_oneof![Just(0u64), Just(u64::MAX), 0u64..1 << 40],
            len in 0usize..700,
            raw in proptest::collection::vec(
                (
                    0u32..700,
                    prop_oneof![
                        -1000i128..1000,
                        Just(i128::from(i32::MAX)),
                        Just(i128::from(i32::MIN)),
                        (1i128 << 31)..(1 << 42),
                        -(1i128 << 42)..-(1 << 31),
                        Just(i128::from(u64::MAX)),
                        Just(-i128::from(u64::MAX)),
                    ],
                ),
                0..200,
            ),
        ) {
            let deltas: Vec<(u32, i128)> =
                raw.into_iter().filter(|&(e, _)| (e as usize) < len).collect();
            let mut per_event = vec![0i128; len];
            for &(e, d) in &deltas {
                per_event[e as usize] += d;
            }
            let mut sum = i128::from(initial);
            let want: Vec<u64> = per_event
                .iter()
                .map(|d| {
                    sum += d;
                    clamp_u64(sum)
                })
                .collect();
            let curve = curve_from_deltas(initial, len, |delta| {
                for &(e, d) in &deltas {
                    delta(e, d);
                }
            });
            prop_assert_eq!(curve.values().collect::<Vec<_>>(), want.clone());
            prop_assert_eq!(curve.max(), reference_max(initial, &want));
        }

        #[test]
        fn compact_and_full_time_axes_give_the_same_answers(
            start in -1_000_000_000_000i64..1_000_000_000_000,
            steps in proptest::collection::vec(proptest::option::of(-50i64..5_000_000_000 / 40), 1..40),
            probes in proptest::collection::vec(-10_000_000i64..6_000_000_000, 1..20),
        ) {
            let mut t = start;
            let raw: Vec<Option<i64>> = steps
                .iter()
                .map(|step| step.map(|d| { t += d; t }))
                .collect();
            if let Some((compact, full)) = both_axes(&raw) {
                let probes: Vec<i64> = probes.iter().map(|p| start + p).collect();
                assert_same_answers(&compact, &full, &probes);
            }
        }
    }

    #[test]
    fn a_rarely_changing_curve_keeps_only_its_changes() {
        let curve = Curve::from_changes(10, 1000, [(5, 4), (5, -4), (7, 6), (900, -16)]);
        assert!(
            matches!(&curve.values, CurveValues::Changes { events, .. } if events == &[7, 900])
        );
        assert_eq!(
            (curve.at(6), curve.at(7), curve.at(899), curve.at(5000)),
            (10, 16, 16, 0)
        );
        assert_eq!(curve.max(), (16, Some(7)));
        // Changing at most events, every value takes less room than the changes.
        let busy = Curve::from_changes(0, 3, [(0, 1), (1, 1), (2, 1)]);
        assert!(matches!(busy.values, CurveValues::Every(_)));
        assert_eq!(busy.values().collect::<Vec<_>>(), [1, 2, 3]);
    }
}
