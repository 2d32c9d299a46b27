//! The one stream of events both exports are written from.
//!
//! [`for_each_event`] walks a snapshot's device timelines once and hands each event to a
//! writer: the Chrome JSON writer (`write`) and the Perfetto protobuf writer (`perfetto`) only
//! decide how an event looks in their format, never which events there are, where a slice
//! starts and ends, which lane it takes or what its label says. Per device, in this order:
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
//! Times are µs on the device's clock: the trace's `time_us`, or the entry index when the
//! trace has no times.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use foldhash::HashMap;
use memsnap_analysis::curve::{Curve, TimeAxis};
use memsnap_analysis::phases::Phase;
use memsnap_analysis::sites::{is_filtered_frame, GroupBy, SiteKeyer};
use memsnap_analysis::{CurveKind, DeviceTimeline, Lifetime, StepOptions};
use memsnap_format::{Snapshot, StackId, TraceEntry};

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
    /// `file:line:name`, one frame a line, innermost first; empty without frames.
    pub(crate) stack: &'e str,
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

/// Walks every device of `snapshot` once, handing its events to `visit` in the order the
/// module documents. Returns what was exported (`events` is left for the writer to count).
pub(crate) fn for_each_event<'s>(
    snapshot: &'s Snapshot,
    options: &ChromeOptions,
    visit: &mut dyn FnMut(Event<'s, '_>) -> Result<()>,
) -> Result<ExportSummary> {
    let mut summary = ExportSummary::default();
    let mut labels = Labels::new(snapshot);
    for device in DeviceTimeline::devices(snapshot) {
        let timeline = DeviceTimeline::build(snapshot, device)?;
        let device_summary = device_events(snapshot, options, &timeline, &mut labels, visit)?;
        summary.devices.push(device_summary);
    }
    Ok(summary)
}

fn device_events<'s>(
    snapshot: &'s Snapshot,
    options: &ChromeOptions,
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

    for (curve, values) in timeline.known_curves() {
        for (time_us, bytes) in clock.counter_points(values) {
            visit(Event::Counter(Counter {
                curve,
                time_us,
                bytes,
            }))?;
        }
    }

    let replay = timeline.replay();
    let axis_len = replay.axis_len();
    let mut lanes = Lanes::default();
    for a in &replay.allocations {
        let (start_us, end_us) = clock.span(a.start(), a.end(Lifetime::Active, axis_len));
        let lane = lanes.place(start_us, end_us);
        let (site, stack) = labels.get(a.stack);
        visit(Event::Allocation(Slice {
            lane,
            start_us,
            end_us,
            site,
            stack,
            size: a.size,
            addr: a.addr,
            stream: a.stream,
            begin_entries: [a.alloc_event(), None],
            end_entries: [a.free_requested(), a.free_completed()],
        }))?;
    }
    summary.allocations = replay.allocations.len();
    summary.lanes = lanes.count;

    let mut lanes = Lanes::default();
    for s in &replay.segments {
        let (start_us, end_us) = clock.span(s.start(), s.end(clock.trace_len));
        let lane = lanes.place(start_us, end_us);
        visit(Event::Segment(Slice {
            lane,
            start_us,
            end_us,
            site: "segment",
            stack: "",
            size: s.size,
            addr: s.addr,
            stream: s.stream,
            begin_entries: [s.alloc_event, None],
            end_entries: [s.free_event, None],
        }))?;
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

    if options.phases && !trace.is_empty() {
        let steps = timeline.steps(&StepOptions::default());
        for (step, phase) in steps.phases() {
            let (start_us, end_us) = clock.phase_span(phase);
            visit(Event::Phase(PhaseSpan {
                step,
                phase,
                start_us,
                end_us,
            }))?;
            summary.phases += 1;
        }
    }
    visit(Event::DeviceEnd)?;
    Ok(summary)
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

/// Site labels and stack texts, computed once per stack.
struct Labels<'s> {
    snapshot: &'s Snapshot,
    keyer: SiteKeyer<'s>,
    cache: HashMap<Option<StackId>, (String, String)>,
}

impl<'s> Labels<'s> {
    fn new(snapshot: &'s Snapshot) -> Self {
        Labels {
            snapshot,
            keyer: SiteKeyer::new(snapshot, GroupBy::Frame),
            cache: HashMap::default(),
        }
    }

    /// `(site, stack text)` of a stack: `file:line:name`, one frame a line, innermost first.
    fn get(&mut self, stack: Option<StackId>) -> (&str, &str) {
        let (snapshot, keyer) = (self.snapshot, &mut self.keyer);
        let (site, text) = self.cache.entry(stack).or_insert_with(|| {
            let site = keyer.key(stack).label(snapshot);
            let text = match stack {
                // The frames PyTorch's viewers show (the exact stack rides in the records).
                Some(id) if id.index() < snapshot.stacks.len() => snapshot
                    .stack_frames(id)
                    .filter(|f| !is_filtered_frame(f))
                    .map(|f| format!("{}:{}:{}", f.filename, f.line, f.name))
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => String::new(),
            };
            (site, text)
        });
        (site, text)
    }
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
