//! Writing memsnap's events, one at a time.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Write};
use std::path::Path;

use foldhash::HashMap;
use memsnap_analysis::curve::{Curve, TimeAxis};
use memsnap_analysis::phases::Phase;
use memsnap_analysis::sites::{is_filtered_frame, GroupBy, SiteKeyer};
use memsnap_analysis::{DeviceTimeline, Lifetime, StepOptions};
use memsnap_format::{Action, Snapshot, StackId, StrTable, TraceEntry};

use super::{pid_of, tid, ChromeOptions, TimeBase, LAYOUT_VERSION};
use crate::{ConvertError, Result};

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

/// Writes `snapshot` as a whole Chrome trace (`{"traceEvents": [...], "otherData": ...}`).
pub fn write_trace(
    snapshot: &Snapshot,
    options: &ChromeOptions,
    out: &mut dyn Write,
) -> Result<ExportSummary> {
    out.write_all(b"{\"traceEvents\":[").map_err(write_err)?;
    let mut sink = Sink::new(out, options.time_base);
    let summary = write_events(snapshot, options, &mut sink)?;
    let out = sink.out;
    out.write_all(b"\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"memsnap\":")
        .map_err(write_err)?;
    write_other_data(snapshot, options, &summary, out).map_err(write_err)?;
    out.write_all(b"}}\n").map_err(write_err)?;
    Ok(summary)
}

/// Writes `snapshot` as a Chrome trace to `path` (gzipped when it ends in `.gz`), through a
/// temporary file and a rename so a failure never leaves half a trace under the name.
pub fn export_path(
    snapshot: &Snapshot,
    options: &ChromeOptions,
    path: &Path,
) -> Result<ExportSummary> {
    write_atomically(path, |out| write_trace(snapshot, options, out))
}

/// Runs `write` on a buffered (and, for `.gz`, gzipping) temporary file beside `path`, then
/// renames it to `path`.
pub(crate) fn write_atomically<T>(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> Result<T>,
) -> Result<T> {
    let io_err = |source| ConvertError::Io {
        path: path.to_owned(),
        source,
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| io_err(io::Error::other("the output path has no file name")))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(file_name);
    temp_name.push(format!(".{}.tmp", std::process::id()));
    let temp = path.with_file_name(temp_name);
    let result = (|| {
        let file = std::fs::File::create(&temp).map_err(io_err)?;
        let mut buffered = io::BufWriter::with_capacity(1 << 20, file);
        let gzip = path.extension().is_some_and(|e| e == "gz");
        let value = if gzip {
            let mut encoder =
                flate2::write::GzEncoder::new(&mut buffered, flate2::Compression::default());
            let value = write(&mut encoder).map_err(|e| with_path(e, path))?;
            encoder.finish().map_err(io_err)?;
            value
        } else {
            write(&mut buffered).map_err(|e| with_path(e, path))?
        };
        let file = buffered.into_inner().map_err(|e| io_err(e.into_error()))?;
        file.sync_all().map_err(io_err)?;
        std::fs::rename(&temp, path).map_err(io_err)?;
        Ok(value)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// A write error without a path gets the output's.
fn with_path(e: ConvertError, path: &Path) -> ConvertError {
    match e {
        ConvertError::Write { source } => ConvertError::Io {
            path: path.to_owned(),
            source,
        },
        other => other,
    }
}

pub(crate) fn write_err(source: io::Error) -> ConvertError {
    ConvertError::Write { source }
}

/// Comma-separated events into an open `traceEvents` array.
pub(crate) struct Sink<'a> {
    pub(crate) out: &'a mut dyn Write,
    /// Whether the array already holds an event (so the next needs a comma).
    pub(crate) continues: bool,
    pub(crate) count: u64,
    time_base: TimeBase,
}

impl<'a> Sink<'a> {
    pub(crate) fn new(out: &'a mut dyn Write, time_base: TimeBase) -> Self {
        Sink {
            out,
            continues: false,
            count: 0,
            time_base,
        }
    }

    /// Starts an event: `{"ph":"<ph>","pid":<pid>,"tid":<tid>` (the caller closes it).
    fn open(&mut self, ph: &str, pid: i64, tid: i64) -> io::Result<()> {
        let sep: &[u8] = if self.continues { b",\n" } else { b"\n" };
        self.continues = true;
        self.count += 1;
        self.out.write_all(sep)?;
        write!(self.out, "{{\"ph\":\"{ph}\",\"pid\":{pid},\"tid\":{tid}")
    }

    /// `,"ts":<time>` in the sink's time base.
    fn ts(&mut self, time_us: i64) -> io::Result<()> {
        self.out.write_all(b",\"ts\":")?;
        write_micros(self.out, self.time_base, time_us)
    }

    fn str(&mut self, s: &str) -> io::Result<()> {
        serde_json::to_writer(&mut *self.out, s).map_err(io::Error::from)
    }

    /// `,"name":"<name>"`.
    fn name(&mut self, name: &str) -> io::Result<()> {
        self.out.write_all(b",\"name\":")?;
        self.str(name)
    }
}

/// Writes a time in µs as `ts` in `base`: integers stay integers, sub-µs parts get 3 decimals.
pub(crate) fn write_micros(out: &mut dyn Write, base: TimeBase, time_us: i64) -> io::Result<()> {
    match base {
        TimeBase::EpochMicros => write!(out, "{time_us}"),
        TimeBase::SinceNanos(base_ns) => {
            let ns = i128::from(time_us) * 1000 - i128::from(base_ns);
            let (whole, frac) = (ns / 1000, (ns % 1000).abs());
            if frac == 0 {
                write!(out, "{whole}")
            } else if ns < 0 && whole == 0 {
                write!(out, "-0.{frac:03}")
            } else {
                write!(out, "{whole}.{frac:03}")
            }
        }
    }
}

/// One device's event clock: entry times, or entry indices when the trace has none.
pub(crate) struct Clock<'t> {
    pub(crate) times: Option<&'t TimeAxis>,
    pub(crate) trace_len: u32,
}

impl Clock<'_> {
    /// The time of entry `event` (the last entry's for events past the end).
    pub(crate) fn at(&self, event: u32) -> i64 {
        match self.times {
            Some(t) => t.time_of(event).unwrap_or_default(),
            None => i64::from(event.min(self.trace_len.saturating_sub(1))),
        }
    }

    pub(crate) fn last(&self) -> i64 {
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
    pub(crate) fn span(&self, start: u32, end: u32) -> (i64, i64) {
        let start = self.at(start);
        (start, self.end_at(end).max(start))
    }

    /// A step phase's span: its recorded times on a timed trace, else its entries'.
    pub(crate) fn phase_span(&self, phase: &Phase) -> (i64, i64) {
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
    pub(crate) fn counter_points<'c>(
        &'c self,
        curve: &'c Curve,
    ) -> impl Iterator<Item = (i64, u64)> + 'c {
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

/// What both writers (the JSON here, the protobuf in `perfetto`) take from one device's
/// timeline before writing its events.
pub(crate) struct DeviceView<'t> {
    pub(crate) pid: i64,
    pub(crate) trace: &'t [TraceEntry],
    pub(crate) clock: Clock<'t>,
    /// `memsnap GPU 0 (rank 1)`.
    pub(crate) process_name: String,
    /// The summary so far: counts are filled in as the events are written.
    pub(crate) summary: DeviceSummary,
}

impl<'t> DeviceView<'t> {
    pub(crate) fn new(
        snapshot: &'t Snapshot,
        options: &ChromeOptions,
        timeline: &'t DeviceTimeline,
    ) -> Self {
        let device = timeline.device();
        let pid = pid_of(options.rank.unwrap_or(0), device);
        let trace: &[TraceEntry] = usize::try_from(device)
            .ok()
            .and_then(|d| snapshot.traces().get(d))
            .map_or(&[], Vec::as_slice);
        let clock = Clock {
            times: Some(timeline.time()).filter(|t| t.has_time()),
            trace_len: u32::try_from(trace.len()).unwrap_or(u32::MAX),
        };
        let process_name = match options.rank {
            Some(r) => format!("memsnap GPU {device} (rank {r})"),
            None => format!("memsnap GPU {device}"),
        };
        let summary = DeviceSummary {
            device,
            pid,
            entries: trace.len(),
            timed: clock.times.is_some(),
            first_time_us: clock.at(0),
            last_time_us: clock.last(),
            ..DeviceSummary::default()
        };
        DeviceView {
            pid,
            trace,
            clock,
            process_name,
            summary,
        }
    }
}

/// Writes every device's events into `sink`.
pub(crate) fn write_events(
    snapshot: &Snapshot,
    options: &ChromeOptions,
    sink: &mut Sink<'_>,
) -> Result<ExportSummary> {
    let mut summary = ExportSummary::default();
    let mut labels = Labels::new(snapshot);
    for device in DeviceTimeline::devices(snapshot) {
        let timeline = DeviceTimeline::build(snapshot, device)?;
        let device_summary =
            write_device(snapshot, options, &timeline, &mut labels, sink).map_err(write_err)?;
        summary.devices.push(device_summary);
    }
    summary.events = sink.count;
    Ok(summary)
}

/// Site labels and stack texts, computed once per stack.
pub(crate) struct Labels<'s> {
    snapshot: &'s Snapshot,
    keyer: SiteKeyer<'s>,
    cache: HashMap<Option<StackId>, (String, String)>,
}

impl<'s> Labels<'s> {
    pub(crate) fn new(snapshot: &'s Snapshot) -> Self {
        Labels {
            snapshot,
            keyer: SiteKeyer::new(snapshot, GroupBy::Frame),
            cache: HashMap::default(),
        }
    }

    /// `(site, stack text)` of a stack: `file:line:name`, one frame a line, innermost first.
    pub(crate) fn get(&mut self, stack: Option<StackId>) -> &(String, String) {
        let (snapshot, keyer) = (self.snapshot, &mut self.keyer);
        self.cache.entry(stack).or_insert_with(|| {
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
        })
    }
}

fn write_device(
    snapshot: &Snapshot,
    options: &ChromeOptions,
    timeline: &DeviceTimeline,
    labels: &mut Labels<'_>,
    sink: &mut Sink<'_>,
) -> io::Result<DeviceSummary> {
    let DeviceView {
        pid,
        trace,
        clock,
        process_name,
        summary: mut out,
    } = DeviceView::new(snapshot, options, timeline);
    let (device, rank) = (out.device, options.rank.unwrap_or(0));
    let replay = timeline.replay();
    let mut carried = vec![false; trace.len()];
    let entries = (trace, &snapshot.strings);

    // Names and order.
    sink.open("M", pid, 0)?;
    sink.name("process_name")?;
    sink.out.write_all(b",\"args\":{\"name\":")?;
    sink.str(&process_name)?;
    sink.out.write_all(b"}}")?;
    sink.open("M", pid, 0)?;
    sink.name("process_sort_index")?;
    write!(
        sink.out,
        ",\"args\":{{\"sort_index\":{}}}}}",
        i64::from(rank) * 1000 + device
    )?;
    for (tid, name) in [
        (tid::MEMORY, "memory"),
        (tid::ANNOTATIONS, "annotations"),
        (tid::PHASES, "phases"),
    ] {
        sink.open("M", pid, tid)?;
        sink.name("thread_name")?;
        sink.out.write_all(b",\"args\":{\"name\":")?;
        sink.str(name)?;
        sink.out.write_all(b"}}")?;
    }

    // Counters: the curves the source records, one event per change.
    for (kind, curve) in timeline.known_curves() {
        let name = kind.name();
        for (time, bytes) in clock.counter_points(curve) {
            counter(sink, pid, name, time, bytes)?;
        }
    }

    // Allocation lifetimes, packed into lanes.
    let axis_len = replay.axis_len();
    let mut lanes = Lanes::default();
    for a in &replay.allocations {
        let (start, end) = clock.span(a.start(), a.end(Lifetime::Active, axis_len));
        let lane = lanes.place(start, end);
        let (site, stack) = labels.get(a.stack);
        sink.open("b", pid, tid::MEMORY)?;
        write!(
            sink.out,
            ",\"cat\":\"memsnap.alloc\",\"id2\":{{\"local\":\"{lane:#x}\"}}"
        )?;
        sink.name(site)?;
        sink.ts(start)?;
        write!(
            sink.out,
            ",\"args\":{{\"size\":{},\"addr\":\"{:#x}\",\"stream\":{},\"device\":{device}",
            a.size, a.addr, a.stream
        )?;
        if !stack.is_empty() {
            sink.out.write_all(b",\"stack\":")?;
            sink.str(stack)?;
        }
        records(sink, entries, &mut carried, &[a.alloc_event()], true)?;
        sink.out.write_all(b"}}")?;
        sink.open("e", pid, tid::MEMORY)?;
        write!(
            sink.out,
            ",\"cat\":\"memsnap.alloc\",\"id2\":{{\"local\":\"{lane:#x}\"}}"
        )?;
        sink.name(site)?;
        sink.ts(end)?;
        sink.out.write_all(b",\"args\":{")?;
        records(
            sink,
            entries,
            &mut carried,
            &[a.free_requested(), a.free_completed()],
            false,
        )?;
        sink.out.write_all(b"}}")?;
    }
    out.allocations = replay.allocations.len();
    out.lanes = lanes.count;

    // Segments, their own lanes.
    let mut lanes = Lanes::default();
    for s in &replay.segments {
        let (start, end) = clock.span(s.start(), s.end(clock.trace_len));
        let lane = lanes.place(start, end);
        sink.open("b", pid, tid::MEMORY)?;
        write!(
            sink.out,
            ",\"cat\":\"memsnap.segment\",\"id2\":{{\"local\":\"{lane:#x}\"}},\"name\":\"segment\""
        )?;
        sink.ts(start)?;
        write!(
            sink.out,
            ",\"args\":{{\"size\":{},\"addr\":\"{:#x}\",\"stream\":{},\"device\":{device}",
            s.size, s.addr, s.stream
        )?;
        records(sink, entries, &mut carried, &[s.alloc_event], true)?;
        sink.out.write_all(b"}}")?;
        sink.open("e", pid, tid::MEMORY)?;
        write!(
            sink.out,
            ",\"cat\":\"memsnap.segment\",\"id2\":{{\"local\":\"{lane:#x}\"}},\"name\":\"segment\""
        )?;
        sink.ts(end)?;
        sink.out.write_all(b",\"args\":{")?;
        records(sink, entries, &mut carried, &[s.free_event], false)?;
        sink.out.write_all(b"}}")?;
    }

    // Instants: OOMs and snapshots, then every entry not carried yet (so the importer gets
    // each one back).
    for (i, entry) in trace.iter().enumerate() {
        if carried[i] {
            continue;
        }
        let (name, cat) = match entry.action {
            Action::Oom => ("oom", "memsnap"),
            Action::Snapshot => ("snapshot", "memsnap"),
            _ => (entry.action_name(&snapshot.strings), "memsnap.entry"),
        };
        sink.open("i", pid, tid::MEMORY)?;
        sink.out.write_all(b",\"s\":\"p\",\"cat\":")?;
        sink.str(cat)?;
        sink.name(name)?;
        sink.ts(clock.at(i as u32))?;
        sink.out.write_all(b",\"args\":{")?;
        match entry.action {
            Action::Oom => write!(
                sink.out,
                "\"size\":{},\"device_free\":{},",
                entry.size,
                entry.device_free().unwrap_or(0)
            )?,
            Action::Snapshot => write!(sink.out, "\"size\":{},", entry.size)?,
            _ => {}
        }
        let after_args = matches!(entry.action, Action::Oom | Action::Snapshot);
        if after_args {
            // The size args were written with a trailing comma: drop it by writing a key.
            sink.out.write_all(b"\"entry\":")?;
            write!(sink.out, "{i}")?;
        }
        records(sink, entries, &mut carried, &[Some(i as u32)], after_args)?;
        sink.out.write_all(b"}}")?;
    }

    // record_function ranges (only on a timed trace: annotations carry epoch times).
    if out.timed {
        for range in timeline.named_ranges() {
            let start = range.start_time_us.unwrap_or(out.first_time_us);
            let end = range.end_time_us.unwrap_or(out.last_time_us).max(start);
            for (ph, time) in [("B", start), ("E", end)] {
                sink.open(ph, pid, tid::ANNOTATIONS)?;
                sink.name(&range.name)?;
                sink.ts(time)?;
                sink.out.write_all(b"}")?;
            }
        }
    }

    // Step phases.
    if options.phases && !trace.is_empty() {
        let steps = timeline.steps(&StepOptions::default());
        for (step, phase) in steps.phases() {
            let (start, end) = clock.phase_span(phase);
            sink.open("X", pid, tid::PHASES)?;
            sink.out.write_all(b",\"cat\":\"memsnap.phase\"")?;
            sink.name(phase.kind.name())?;
            sink.ts(start)?;
            write!(
                sink.out,
                ",\"dur\":{},\"args\":{{\"peak_bytes\":{},\"allocations\":{}",
                end - start,
                phase.peak_bytes,
                phase.allocations
            )?;
            if let Some(step) = step {
                write!(sink.out, ",\"step\":{step}")?;
            }
            sink.out.write_all(b"}}")?;
            out.phases += 1;
        }
    }
    Ok(out)
}

fn counter(sink: &mut Sink<'_>, pid: i64, name: &str, time: i64, bytes: u64) -> io::Result<()> {
    sink.open("C", pid, tid::MEMORY)?;
    sink.name(name)?;
    sink.ts(time)?;
    write!(sink.out, ",\"args\":{{\"bytes\":{bytes}}}}}")
}

/// Greedy interval packing: a slice reuses the lane that freed first, when it ended strictly
/// before the slice starts (equal times could be ordered either way by a viewer).
#[derive(Default)]
pub(crate) struct Lanes {
    free_at: BinaryHeap<Reverse<(i64, usize)>>,
    pub(crate) count: usize,
}

impl Lanes {
    pub(crate) fn place(&mut self, start: i64, end: i64) -> usize {
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

/// Writes `"memsnap":[record, ...]` for the given entries not carried yet (nothing if none;
/// a leading comma `after_args`), marking them carried. A record is `[index, action, addr,
/// size, stream, time_us, stack, device_free]` (`null` for an absent key).
fn records(
    sink: &mut Sink<'_>,
    entries: (&[TraceEntry], &StrTable),
    carried: &mut [bool],
    events: &[Option<u32>],
    after_args: bool,
) -> io::Result<()> {
    let (trace, strings) = entries;
    let mut any = false;
    for &event in events.iter().flatten() {
        let i = event as usize;
        let (Some(entry), Some(done)) = (trace.get(i), carried.get_mut(i)) else {
            continue;
        };
        if *done {
            continue;
        }
        *done = true;
        if any {
            sink.out.write_all(b",")?;
        } else {
            sink.out.write_all(if after_args {
                b",\"memsnap\":["
            } else {
                b"\"memsnap\":["
            })?;
        }
        any = true;
        write!(sink.out, "[{i},")?;
        sink.str(entry.action_name(strings))?;
        let null = |v: Option<String>| v.unwrap_or_else(|| "null".into());
        write!(
            sink.out,
            ",{},{},{},{},{},{}]",
            null(entry.has_addr().then(|| entry.addr.to_string())),
            entry.size,
            entry.stream,
            null(entry.time_us().map(|t| t.to_string())),
            null(entry.frames.map(|s| s.index().to_string())),
            null(entry.device_free().map(|d| d.to_string())),
        )?;
    }
    if any {
        sink.out.write_all(b"]")?;
    }
    Ok(())
}

/// The value of `otherData.memsnap`: layout version, devices, and the frame and stack tables
/// the records' stack ids point into.
pub(crate) fn write_other_data(
    snapshot: &Snapshot,
    options: &ChromeOptions,
    summary: &ExportSummary,
    out: &mut dyn Write,
) -> io::Result<()> {
    let str = |out: &mut dyn Write, s: &str| -> io::Result<()> {
        serde_json::to_writer(&mut *out, s).map_err(io::Error::from)
    };
    write!(out, "{{\"version\":{LAYOUT_VERSION},\"producer\":")?;
    str(
        out,
        concat!("memsnap-converters ", env!("CARGO_PKG_VERSION")),
    )?;
    match options.rank {
        Some(r) => write!(out, ",\"rank\":{r},\"ranks\":[{r}]")?,
        None => out.write_all(b",\"rank\":null,\"ranks\":[]")?,
    }
    write!(
        out,
        ",\"device_traces\":{}",
        snapshot
            .device_traces
            .as_ref()
            .map_or("null".to_string(), |t| t.len().to_string())
    )?;
    out.write_all(b",\"time_base\":")?;
    match options.time_base {
        TimeBase::EpochMicros => out.write_all(b"null")?,
        TimeBase::SinceNanos(n) => write!(out, "{n}")?,
    }
    out.write_all(b",\"devices\":[")?;
    for (i, d) in summary.devices.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        write!(
            out,
            "{{\"device\":{},\"pid\":{},\"entries\":{},\"timed\":{}}}",
            d.device, d.pid, d.entries, d.timed
        )?;
    }
    out.write_all(b"]")?;
    // What an import's source knew beside the blocks (unattributed memory, a reserved
    // series, categories): the import reads it back with the entries, whose indices it uses.
    let sources = snapshot
        .recorder_info
        .as_ref()
        .map(|r| r.sources())
        .unwrap_or_default();
    if !sources.is_empty() {
        out.write_all(b",\"sources\":")?;
        serde_json::to_writer(&mut *out, &sources).map_err(io::Error::from)?;
    }
    // The allocator's state at the end (segments, blocks, their stacks) and its settings:
    // memory live before the trace's window is only known from them, so without them an
    // import lost it (a ring buffer's file imported back with a fraction of its peak). Written
    // as memsnap's JSON snapshot of them, frames inline.
    if !snapshot.segments.is_empty() || snapshot.allocator_settings.is_some() {
        // Only the stacks the segments use travel (not the traces' whole tables).
        let mut state = Snapshot {
            allocator_settings: snapshot.allocator_settings.clone(),
            ..Snapshot::default()
        };
        state.add_segments_from(snapshot, snapshot.segments.iter().cloned());
        out.write_all(b",\"state\":")?;
        // Streamed: with every block's stack inline, this is often larger than the snapshot.
        memsnap_format::json::to_writer(&state, out).map_err(io::Error::other)?;
    }
    out.write_all(b",\"frames\":[")?;
    for (i, f) in snapshot.frames.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        out.write_all(b"[")?;
        str(out, &f.filename)?;
        match (f.line.as_i64(), f.line.as_u64()) {
            (Some(l), _) => write!(out, ",{l},")?,
            (None, Some(l)) => write!(out, ",{l},")?,
            _ => {
                out.write_all(b",")?;
                str(out, &f.line.to_decimal())?;
                out.write_all(b",")?;
            }
        }
        str(out, &f.name)?;
        out.write_all(b"]")?;
    }
    out.write_all(b"],\"stacks\":[")?;
    for (i, (_, frames)) in snapshot.stacks.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        out.write_all(b"[")?;
        for (j, f) in frames.iter().enumerate() {
            if j > 0 {
                out.write_all(b",")?;
            }
            write!(out, "{}", f.index())?;
        }
        out.write_all(b"]")?;
    }
    out.write_all(b"]}")
}
