//! The one stream of events both exports are written from.
//!
//! [`for_each_event`] walks a snapshot's device timelines once and hands each event to a
//! writer: the Chrome JSON writer (`write`) and the Perfetto protobuf writer (`perfetto`) only
//! decide how an event looks in their format, never which events there are, where a slice
//! starts and ends, which lane it takes or what its label says. A slice names its stack by id
//! ([`Slice::stack`]): each writer writes a stack's frames once, however many slices share it
//! (the JSON in its `stackFrames` tree, the protobuf as interned data), so the frames the
//! viewers show come from [`shown_frames`] alone. Per device, [`Order::ByKind`] hands the
//! events out in this order:
//!
//! 1. [`Event::Device`]: the device's process (pid, name, the curves its source records);
//! 2. [`Event::Counter`]: each recorded curve's points, curve by curve;
//! 3. [`Event::Allocation`]: allocation lifetimes, in replay order, packed into lanes;
//! 4. [`Event::Segment`]: segment lifetimes, in their own lanes;
//! 5. [`Event::Entry`]: every trace entry, oldest first (the JSON writes those no slice
//!    carried as instants, so each entry rides on one event; the protobuf draws OOMs and
//!    snapshots);
//! 6. [`Event::Range`]: `record_function` ranges, on a timed trace only (annotations carry
//!    epoch times; the protobuf does not draw them);
//! 7. [`Event::Phase`]: the training step phases, when asked for;
//! 8. [`Event::DeviceEnd`].
//!
//! [`Order::ByStart`] hands out the same events (but the ranges, which no writer in that order
//! draws) merged by start time, kind by kind in the order above at equal times, so a writer
//! that must write in time order (the protobuf) writes each event as it comes and holds only
//! the slices still open, never the whole device's events.
//!
//! Times are µs on the device's clock: the trace's `time_us`, or the entry index when the
//! trace has no times. The clock never goes back ([`TimeAxis`] raises an earlier time to the
//! one before it), so entry order is time order.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use foldhash::HashMap;
use memsnap_analysis::curve::{Curve, TimeAxis};
use memsnap_analysis::phases::Phase;
use memsnap_analysis::sites::{is_filtered_frame, GroupBy, SiteKeyer};
use memsnap_analysis::{CurveKind, DeviceTimeline, Lifetime, StepOptions};
use memsnap_format::{Frame, FrameId, Snapshot, StackId, TraceEntry};

use super::{pid_of, ChromeOptions};
use crate::Result;

/// What an export wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExportSummary {
    /// One per exported device, ascending.
    pub devices: Vec<DeviceSummary>,
    /// Events written (all devices).
    pub events: u64,
}

/// What an export wrote for one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceSummary {
    pub device: i64,
    pub pid: i64,
    /// Trace entries (each rides on one event).
    pub entries: usize,
    /// Allocation lifetimes written as async slices.
    pub allocations: usize,
    /// Lanes the lifetimes were packed into.
    pub lanes: usize,
    /// Step phases written.
    pub phases: usize,
    /// Whether the trace has times (else the entry index is the clock).
    pub timed: bool,
    /// Time of the first and last event (µs, the trace's clock).
    pub first_time_us: i64,
    pub last_time_us: i64,
}

/// One event of the stream. `'s` borrows from the snapshot, `'e` from the device's analysis
/// (alive only while the event is handled).
pub(crate) enum Event<'s, 'e> {
    /// A device's events begin.
    Device(&'e DeviceStart<'s>),
    /// A curve's value from `time_us` on.
    Counter(Counter),
    /// An allocation's lifetime.
    Allocation(Slice<'e>),
    /// A segment's lifetime (`site` is `"segment"`, `stack` empty).
    Segment(Slice<'e>),
    /// A trace entry.
    Entry(Entry<'s>),
    /// A `record_function` range.
    Range(Range<'e>),
    /// A training step's phase.
    Phase(PhaseSpan<'e>),
    /// The device's events are over.
    DeviceEnd,
}

/// What a device's events share.
pub(crate) struct DeviceStart<'s> {
    pub(crate) device: i64,
    /// `rank * 1000 + device`: the order of the device's rows.
    pub(crate) sort_index: i64,
    pub(crate) pid: i64,
    /// `memsnap GPU 0 (rank 1)`.
    pub(crate) process_name: String,
    /// The curves the source records (each has at least one [`Event::Counter`]).
    pub(crate) curves: Vec<CurveKind>,
    pub(crate) trace: &'s [TraceEntry],
}

/// A lifetime on a lane: no two slices of one lane (of allocations, or of segments) overlap.
pub(crate) struct Slice<'e> {
    /// Lanes are numbered from 0 in the order they are first used.
    pub(crate) lane: usize,
    pub(crate) start_us: i64,
    pub(crate) end_us: i64,
    /// The user's site (the slice's name).
    pub(crate) site: &'e str,
    /// The allocation's stack (`None` for segments and stackless allocations); its frames
    /// are [`shown_frames`].
    pub(crate) stack: Option<StackId>,
    pub(crate) size: u64,
    pub(crate) addr: u64,
    pub(crate) stream: i64,
    /// The trace entries the start stands for (the alloc), and the end (the frees).
    pub(crate) begin_entries: [Option<u32>; 2],
    pub(crate) end_entries: [Option<u32>; 2],
}

/// A point of a counter track.
pub(crate) struct Counter {
    pub(crate) curve: CurveKind,
    pub(crate) time_us: i64,
    pub(crate) bytes: u64,
}

/// Trace entry `index`, at its time.
pub(crate) struct Entry<'s> {
    pub(crate) index: u32,
    pub(crate) time_us: i64,
    pub(crate) entry: &'s TraceEntry,
}

/// A `record_function` range.
pub(crate) struct Range<'e> {
    pub(crate) name: &'e str,
    pub(crate) start_us: i64,
    pub(crate) end_us: i64,
}

/// A training step's phase (`step` is `None` for the set-up before the first step).
pub(crate) struct PhaseSpan<'e> {
    pub(crate) step: Option<usize>,
    pub(crate) phase: &'e Phase,
    pub(crate) start_us: i64,
    pub(crate) end_us: i64,
}

/// In which order a device's events are handed out (see the module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// Kind by kind: counters, allocations, segments, entries, ranges, phases.
    ByKind,
    /// Merged by start time (kinds in that order at equal times), ranges left out.
    ByStart,
}

/// Walks every device of `snapshot` once, handing its events to `visit` in `order`. Returns
/// what was exported (`events` is left for the writer to count).
///
/// O(n + a log a) per device for `n` trace entries and `a` allocation slices (the lanes' heap;
/// [`Order::ByStart`] adds a sort of the slices when the replay's order is not their start
/// order); memory beyond the device's timeline: one site label per distinct stack, and for
/// [`Order::ByStart`] at most 8 bytes per slice.
pub(crate) fn for_each_event<'s>(
    snapshot: &'s Snapshot,
    options: &ChromeOptions,
    order: Order,
    visit: &mut dyn FnMut(Event<'s, '_>) -> Result<()>,
) -> Result<ExportSummary> {
    let mut summary = ExportSummary::default();
    let mut labels = Labels::new(snapshot);
    for device in DeviceTimeline::devices(snapshot) {
        let timeline = DeviceTimeline::build(snapshot, device)?;
        let device_summary =
            device_events(snapshot, options, order, &timeline, &mut labels, visit)?;
        summary.devices.push(device_summary);
    }
    Ok(summary)
}

fn device_events<'s>(
    snapshot: &'s Snapshot,
    options: &ChromeOptions,
    order: Order,
    timeline: &DeviceTimeline,
    labels: &mut Labels<'_>,
    visit: &mut dyn FnMut(Event<'s, '_>) -> Result<()>,
) -> Result<DeviceSummary> {
    let device = timeline.device();
    let rank = options.rank.unwrap_or(0);
    let pid = pid_of(rank, device);
    let trace: &'s [TraceEntry] = usize::try_from(device)
        .ok()
        .and_then(|d| snapshot.traces().get(d))
        .map_or(&[], Vec::as_slice);
    let clock = Clock {
        times: Some(timeline.time()).filter(|t| t.has_time()),
        trace_len: u32::try_from(trace.len()).unwrap_or(u32::MAX),
    };
    let mut summary = DeviceSummary {
        device,
        pid,
        entries: trace.len(),
        timed: clock.times.is_some(),
        first_time_us: clock.at(0),
        last_time_us: clock.last(),
        ..DeviceSummary::default()
    };
    let start = DeviceStart {
        device,
        sort_index: i64::from(rank) * 1000 + device,
        pid,
        process_name: match options.rank {
            Some(r) => format!("memsnap GPU {device} (rank {r})"),
            None => format!("memsnap GPU {device}"),
        },
        curves: timeline.known_curves().map(|(kind, _)| kind).collect(),
        trace,
    };
    visit(Event::Device(&start))?;
    let steps =
        (options.phases && !trace.is_empty()).then(|| timeline.steps(&StepOptions::default()));
    let phases = steps.iter().flat_map(|s| s.phases()).map(|(step, phase)| {
        let (start_us, end_us) = clock.phase_span(phase);
        PhaseSpan {
            step,
            phase,
            start_us,
            end_us,
        }
    });
    let replay = timeline.replay();
    let axis_len = replay.axis_len();
    summary.allocations = replay.allocations.len();

    match order {
        Order::ByKind => {
            for (curve, values) in timeline.known_curves() {
                for (time_us, bytes) in clock.counter_points(values) {
                    visit(Event::Counter(Counter {
                        curve,
                        time_us,
                        bytes,
                    }))?;
                }
            }
            let mut lanes = Lanes::default();
            for a in &replay.allocations {
                let (start_us, end_us) = clock.span(a.start(), a.end(Lifetime::Active, axis_len));
                let lane = lanes.place(start_us, end_us);
                visit(Event::Allocation(allocation_slice(
                    a,
                    lane,
                    (start_us, end_us),
                    labels,
                )))?;
            }
            summary.lanes = lanes.count;
            let mut lanes = Lanes::default();
            for s in &replay.segments {
                let (start_us, end_us) = clock.span(s.start(), s.end(clock.trace_len));
                let lane = lanes.place(start_us, end_us);
                visit(Event::Segment(segment_slice(s, lane, (start_us, end_us))))?;
            }
            for (i, entry) in trace.iter().enumerate() {
                visit(Event::Entry(Entry {
                    index: i as u32,
                    time_us: clock.at(i as u32),
                    entry,
                }))?;
            }
            if summary.timed {
                for range in timeline.named_ranges() {
                    let start_us = range.start_time_us.unwrap_or(summary.first_time_us);
                    let end_us = range
                        .end_time_us
                        .unwrap_or(summary.last_time_us)
                        .max(start_us);
                    visit(Event::Range(Range {
                        name: &range.name,
                        start_us,
                        end_us,
                    }))?;
                }
            }
            for phase in phases {
                visit(Event::Phase(phase))?;
                summary.phases += 1;
            }
        }
        Order::ByStart => {
            let mut counters: Vec<_> = timeline
                .known_curves()
                .map(|(curve, values)| (curve, clock.counter_points(values).peekable()))
                .collect();
            let mut allocations = SliceSource::new(replay.allocations.len(), |i| {
                let a = &replay.allocations[i];
                clock.span(a.start(), a.end(Lifetime::Active, axis_len))
            });
            let mut segments = SliceSource::new(replay.segments.len(), |i| {
                let s = &replay.segments[i];
                clock.span(s.start(), s.end(clock.trace_len))
            });
            let mut phases: Vec<PhaseSpan<'_>> = phases.collect();
            // Stable: at equal starts, in the order the analysis gives them.
            phases.sort_by_key(|p| p.start_us);
            let mut phases = phases.into_iter().peekable();
            let mut entry = 0usize;
            loop {
                // The next event: the earliest start, kinds in the module's order at a tie.
                let mut next: Option<(i64, u8, usize)> = None;
                let mut consider = |time: i64, kind: u8, index: usize| {
                    if next.is_none_or(|(t, k, _)| (time, kind) < (t, k)) {
                        next = Some((time, kind, index));
                    }
                };
                for (c, (_, points)) in counters.iter_mut().enumerate() {
                    if let Some(&(time, _)) = points.peek() {
                        consider(time, 0, c);
                    }
                }
                if let Some((_, (start, _))) = allocations.peek() {
                    consider(start, 1, 0);
                }
                if let Some((_, (start, _))) = segments.peek() {
                    consider(start, 2, 0);
                }
                if entry < trace.len() {
                    consider(clock.at(entry as u32), 3, 0);
                }
                if let Some(p) = phases.peek() {
                    consider(p.start_us, 4, 0);
                }
                let Some((_, kind, index)) = next else { break };
                match kind {
                    0 => {
                        let (curve, points) = &mut counters[index];
                        if let Some((time_us, bytes)) = points.next() {
                            visit(Event::Counter(Counter {
                                curve: *curve,
                                time_us,
                                bytes,
                            }))?;
                        }
                    }
                    1 => {
                        if let Some((i, span, lane)) = allocations.take() {
                            let a = &replay.allocations[i];
                            visit(Event::Allocation(allocation_slice(a, lane, span, labels)))?;
                        }
                    }
                    2 => {
                        if let Some((i, span, lane)) = segments.take() {
                            visit(Event::Segment(segment_slice(
                                &replay.segments[i],
                                lane,
                                span,
                            )))?;
                        }
                    }
                    3 => {
                        visit(Event::Entry(Entry {
                            index: entry as u32,
                            time_us: clock.at(entry as u32),
                            entry: &trace[entry],
                        }))?;
                        entry += 1;
                    }
                    _ => {
                        if let Some(phase) = phases.next() {
                            visit(Event::Phase(phase))?;
                            summary.phases += 1;
                        }
                    }
                }
            }
            summary.lanes = allocations.lanes();
        }
    }
    visit(Event::DeviceEnd)?;
    Ok(summary)
}

/// An allocation's slice on `lane` over `span`.
fn allocation_slice<'e>(
    a: &memsnap_analysis::Allocation,
    lane: usize,
    span: (i64, i64),
    labels: &'e mut Labels<'_>,
) -> Slice<'e> {
    Slice {
        lane,
        start_us: span.0,
        end_us: span.1,
        site: labels.site(a.stack),
        stack: a.stack,
        size: a.size,
        addr: a.addr,
        stream: a.stream,
        begin_entries: [a.alloc_event(), None],
        end_entries: [a.free_requested(), a.free_completed()],
    }
}

/// A segment's slice on `lane` over `span`.
fn segment_slice(
    s: &memsnap_analysis::SegmentInterval,
    lane: usize,
    span: (i64, i64),
) -> Slice<'static> {
    Slice {
        lane,
        start_us: span.0,
        end_us: span.1,
        site: "segment",
        stack: None,
        size: s.size,
        addr: s.addr,
        stream: s.stream,
        begin_entries: [s.alloc_event, None],
        end_entries: [s.free_event, None],
    }
}

/// One kind of slices in start order, each on the lane [`Order::ByKind`] gives it (lanes are
/// placed in the replay's order, which usually is start order already: then nothing is held;
/// else the start order and the lanes, 8 bytes a slice).
struct SliceSource<F> {
    span: F,
    len: usize,
    next: usize,
    /// Indices in start order, when the replay's order is not.
    order: Option<Vec<u32>>,
    /// Lanes by index, placed in replay order, when `order` is set.
    lanes: Option<Vec<u32>>,
    /// Places lanes as the slices come, when `order` is not set.
    placer: Lanes,
}

impl<F: Fn(usize) -> (i64, i64)> SliceSource<F> {
    fn new(len: usize, span: F) -> Self {
        let sorted = (1..len).all(|i| span(i - 1).0 <= span(i).0);
        let (order, lanes) = if sorted {
            (None, None)
        } else {
            let mut placer = Lanes::default();
            let lanes = (0..len)
                .map(|i| {
                    let (start, end) = span(i);
                    placer.place(start, end) as u32
                })
                .collect();
            let mut order: Vec<u32> = (0..len as u32).collect();
            order.sort_by_key(|&i| span(i as usize).0);
            (Some(order), Some(lanes))
        };
        SliceSource {
            span,
            len,
            next: 0,
            order,
            lanes,
            placer: Lanes::default(),
        }
    }

    fn index(&self, k: usize) -> usize {
        self.order.as_ref().map_or(k, |o| o[k] as usize)
    }

    /// The next slice's index and span.
    fn peek(&self) -> Option<(usize, (i64, i64))> {
        (self.next < self.len).then(|| {
            let i = self.index(self.next);
            (i, (self.span)(i))
        })
    }

    /// The next slice's index, span and lane.
    fn take(&mut self) -> Option<(usize, (i64, i64), usize)> {
        let (i, span) = self.peek()?;
        self.next += 1;
        let lane = match &self.lanes {
            Some(lanes) => lanes[i] as usize,
            None => self.placer.place(span.0, span.1),
        };
        Some((i, span, lane))
    }

    /// How many lanes the slices took.
    fn lanes(&self) -> usize {
        match &self.lanes {
            Some(lanes) => lanes.iter().map(|&l| l as usize + 1).max().unwrap_or(0),
            None => self.placer.count,
        }
    }
}

/// One device's event clock: entry times, or entry indices when the trace has none.
struct Clock<'t> {
    times: Option<&'t TimeAxis>,
    trace_len: u32,
}

impl Clock<'_> {
    /// The time of entry `event` (the last entry's for events past the end).
    fn at(&self, event: u32) -> i64 {
        match self.times {
            Some(t) => t.time_of(event).unwrap_or_default(),
            None => i64::from(event.min(self.trace_len.saturating_sub(1))),
        }
    }

    fn last(&self) -> i64 {
        self.at(self.trace_len.saturating_sub(1))
    }

    /// The time of an event that ends at entry `end`: the last entry's past the trace.
    fn end_at(&self, end: u32) -> i64 {
        if end >= self.trace_len {
            self.last()
        } else {
            self.at(end)
        }
    }

    /// The times of a span from entry `start` to entry `end`, never ending before it starts.
    fn span(&self, start: u32, end: u32) -> (i64, i64) {
        let start = self.at(start);
        (start, self.end_at(end).max(start))
    }

    /// A step phase's span: its recorded times on a timed trace, else its entries'.
    fn phase_span(&self, phase: &Phase) -> (i64, i64) {
        let timed = self.times.is_some();
        let start = phase
            .start_time_us
            .filter(|_| timed)
            .unwrap_or_else(|| self.at(phase.start_event));
        let end = phase
            .end_time_us
            .filter(|_| timed)
            .unwrap_or_else(|| self.end_at(phase.end_event))
            .max(start);
        (start, end)
    }

    /// The points a counter track shows for `curve`: its initial value, then the value after
    /// the last entry at each time where it changed (viewers keep the last value anyway).
    fn counter_points<'c>(&'c self, curve: &'c Curve) -> impl Iterator<Item = (i64, u64)> + 'c {
        let mut written = curve.initial;
        let len = curve.len();
        let changes = curve
            .values()
            .enumerate()
            .filter_map(move |(event, bytes)| {
                let time = self.at(event as u32);
                let last_at_time = event + 1 == len || self.at(event as u32 + 1) != time;
                (last_at_time && bytes != written).then(|| {
                    written = bytes;
                    (time, bytes)
                })
            });
        std::iter::once((self.at(0), curve.initial)).chain(changes)
    }
}

/// Site labels, computed once per stack (the stacks' frames are the writers', written once
/// per stack each).
struct Labels<'s> {
    snapshot: &'s Snapshot,
    keyer: SiteKeyer<'s>,
    cache: HashMap<Option<StackId>, String>,
}

impl<'s> Labels<'s> {
    fn new(snapshot: &'s Snapshot) -> Self {
        Labels {
            snapshot,
            keyer: SiteKeyer::new(snapshot, GroupBy::Frame),
            cache: HashMap::default(),
        }
    }

    /// The user's site of a stack.
    fn site(&mut self, stack: Option<StackId>) -> &str {
        let (snapshot, keyer) = (self.snapshot, &mut self.keyer);
        self.cache
            .entry(stack)
            .or_insert_with(|| keyer.key(stack).label(snapshot))
    }
}

/// The frames of `stack` PyTorch's viewers show, innermost first (the exact stack rides in
/// the JSON's records): none for an id the snapshot does not have.
pub(crate) fn shown_frames(
    snapshot: &Snapshot,
    stack: StackId,
) -> impl Iterator<Item = (FrameId, &Frame)> + '_ {
    let ids: &[FrameId] = if stack.index() < snapshot.stacks.len() {
        snapshot.stacks.get(stack)
    } else {
        &[]
    };
    ids.iter()
        .map(|&id| (id, snapshot.frames.get(id)))
        .filter(|(_, f)| !is_filtered_frame(f))
}

/// How a frame reads in a stack: `file:line:name`.
pub(crate) fn write_frame(out: &mut String, frame: &Frame) {
    use std::fmt::Write as _;
    let _ = write!(out, "{}:{}:{}", frame.filename, frame.line, frame.name);
}

/// A stack as text, one frame a line, innermost first (empty when no frame is shown).
pub(crate) fn stack_text(snapshot: &Snapshot, stack: StackId) -> String {
    let mut text = String::new();
    for (i, (_, frame)) in shown_frames(snapshot, stack).enumerate() {
        if i > 0 {
            text.push('\n');
        }
        write_frame(&mut text, frame);
    }
    text
}

/// Greedy interval packing: a slice reuses the lane that freed first, when it ended strictly
/// before the slice starts (equal times could be ordered either way by a viewer).
#[derive(Default)]
struct Lanes {
    free_at: BinaryHeap<Reverse<(i64, usize)>>,
    count: usize,
}

impl Lanes {
    fn place(&mut self, start: i64, end: i64) -> usize {
        let lane = match self.free_at.peek() {
            Some(&Reverse((ends, lane))) if ends < start => {
                self.free_at.pop();
                lane
            }
            _ => {
                self.count += 1;
                self.count - 1
            }
        };
        self.free_at.push(Reverse((end, lane)));
        lane
    }
}
