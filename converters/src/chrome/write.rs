//! The Chrome JSON writer: the event stream ([`super::events`]) as Trace Event JSON, one
//! event at a time.
//!
//! Stacks are the Trace Event Format's shared stack frames: a top-level `"stackFrames"`
//! dictionary of `{"name", "parent"}` nodes (a tree from the outermost frame in), an
//! allocation's `b` event naming its innermost frame's node by `"sf"`. Each distinct stack is
//! written once however many allocations share it, and a frame once per distinct path to it:
//! with 150-frame stacks, writing each allocation's stack inline made a 1M-entry run's export
//! 3.7 GB.

use std::io::{self, Write};
use std::path::Path;

use foldhash::HashMap;
use memsnap_format::{Action, FrameId, Snapshot, StackId, StrTable, TraceEntry};

use super::events::{for_each_event, shown_frames, write_frame, Entry, Event, Order, Slice};
use super::{tid, ChromeOptions, ExportSummary, TimeBase, LAYOUT_VERSION};
use crate::{ConvertError, Result};

/// Writes `snapshot` as a whole Chrome trace (`{"traceEvents": [...], "otherData": ...}`).
pub fn write_trace(
    snapshot: &Snapshot,
    options: &ChromeOptions,
    out: &mut dyn Write,
) -> Result<ExportSummary> {
    out.write_all(b"{\"traceEvents\":[").map_err(write_err)?;
    let mut sink = Sink::new(out, options.time_base);
    let summary = write_events(snapshot, options, &mut sink)?;
    let Sink { out, stacks, .. } = sink;
    out.write_all(b"\n]").map_err(write_err)?;
    // Only when a slice has a stack: a stackless file's export stays as it was.
    if !stacks.is_empty() {
        out.write_all(b",\"stackFrames\":{").map_err(write_err)?;
        stacks.write_members(snapshot, out).map_err(write_err)?;
        out.write_all(b"}").map_err(write_err)?;
    }
    out.write_all(b",\"displayTimeUnit\":\"ms\",\"otherData\":{\"memsnap\":")
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
    /// The stack frames the events name (written after the events).
    pub(crate) stacks: StackFrames,
}

impl<'a> Sink<'a> {
    pub(crate) fn new(out: &'a mut dyn Write, time_base: TimeBase) -> Self {
        Sink {
            out,
            continues: false,
            count: 0,
            time_base,
            stacks: StackFrames::default(),
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

/// Writes every device's events into `sink`.
pub(crate) fn write_events(
    snapshot: &Snapshot,
    options: &ChromeOptions,
    sink: &mut Sink<'_>,
) -> Result<ExportSummary> {
    let mut device = Device::default();
    let mut summary = for_each_event(snapshot, options, Order::ByKind, &mut |event| {
        write_event(sink, snapshot, &mut device, event).map_err(write_err)
    })?;
    summary.events = sink.count;
    Ok(summary)
}

/// The device whose events are being written.
#[derive(Default)]
struct Device<'s> {
    pid: i64,
    device: i64,
    trace: &'s [TraceEntry],
    /// Which entries ride on an event already: each rides on exactly one, so the importer
    /// gets each back once.
    carried: Vec<bool>,
}

fn write_event<'s>(
    sink: &mut Sink<'_>,
    snapshot: &Snapshot,
    d: &mut Device<'s>,
    event: Event<'s, '_>,
) -> io::Result<()> {
    let strings = &snapshot.strings;
    let pid = d.pid;
    match event {
        Event::Device(start) => {
            *d = Device {
                pid: start.pid,
                device: start.device,
                trace: start.trace,
                carried: vec![false; start.trace.len()],
            };
            let pid = start.pid;
            // Names and order.
            sink.open("M", pid, 0)?;
            sink.name("process_name")?;
            sink.out.write_all(b",\"args\":{\"name\":")?;
            sink.str(&start.process_name)?;
            sink.out.write_all(b"}}")?;
            sink.open("M", pid, 0)?;
            sink.name("process_sort_index")?;
            write!(
                sink.out,
                ",\"args\":{{\"sort_index\":{}}}}}",
                start.sort_index
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
        }
        Event::Counter(c) => {
            sink.open("C", pid, tid::MEMORY)?;
            sink.name(c.curve.name())?;
            sink.ts(c.time_us)?;
            write!(sink.out, ",\"args\":{{\"bytes\":{}}}}}", c.bytes)?;
        }
        Event::Allocation(slice) => write_slice(sink, snapshot, d, "memsnap.alloc", &slice)?,
        Event::Segment(slice) => write_slice(sink, snapshot, d, "memsnap.segment", &slice)?,
        // Entries no slice carried become instants, so the importer gets each one back.
        Event::Entry(Entry {
            index,
            time_us,
            entry,
        }) => {
            if d.carried.get(index as usize).copied().unwrap_or(true) {
                return Ok(());
            }
            let (name, cat) = match entry.action {
                Action::Oom => ("oom", "memsnap"),
                Action::Snapshot => ("snapshot", "memsnap"),
                _ => (entry.action_name(strings), "memsnap.entry"),
            };
            sink.open("i", pid, tid::MEMORY)?;
            sink.out.write_all(b",\"s\":\"p\",\"cat\":")?;
            sink.str(cat)?;
            sink.name(name)?;
            sink.ts(time_us)?;
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
                write!(sink.out, "{index}")?;
            }
            let entries = (d.trace, strings);
            records(sink, entries, &mut d.carried, &[Some(index)], after_args)?;
            sink.out.write_all(b"}}")?;
        }
        Event::Range(range) => {
            for (ph, time) in [("B", range.start_us), ("E", range.end_us)] {
                sink.open(ph, pid, tid::ANNOTATIONS)?;
                sink.name(range.name)?;
                sink.ts(time)?;
                sink.out.write_all(b"}")?;
            }
        }
        Event::Phase(p) => {
            sink.open("X", pid, tid::PHASES)?;
            sink.out.write_all(b",\"cat\":\"memsnap.phase\"")?;
            sink.name(p.phase.kind.name())?;
            sink.ts(p.start_us)?;
            write!(
                sink.out,
                ",\"dur\":{},\"args\":{{\"peak_bytes\":{},\"allocations\":{}",
                p.end_us - p.start_us,
                p.phase.peak_bytes,
                p.phase.allocations
            )?;
            if let Some(step) = p.step {
                write!(sink.out, ",\"step\":{step}")?;
            }
            sink.out.write_all(b"}}")?;
        }
        Event::DeviceEnd => {}
    }
    Ok(())
}

/// An async slice's `b` and `e` events on the lane's id, with the trace entries it stands for
/// (the `b` names the slice's stack by `sf`).
fn write_slice(
    sink: &mut Sink<'_>,
    snapshot: &Snapshot,
    d: &mut Device<'_>,
    cat: &str,
    slice: &Slice<'_>,
) -> io::Result<()> {
    let (pid, entries) = (d.pid, (d.trace, &snapshot.strings));
    let head = |sink: &mut Sink<'_>| {
        write!(
            sink.out,
            ",\"cat\":\"{cat}\",\"id2\":{{\"local\":\"{:#x}\"}}",
            slice.lane
        )?;
        sink.name(slice.site)
    };
    sink.open("b", pid, tid::MEMORY)?;
    head(sink)?;
    sink.ts(slice.start_us)?;
    if let Some(node) = slice.stack.and_then(|s| sink.stacks.leaf(snapshot, s)) {
        write!(sink.out, ",\"sf\":{node}")?;
    }
    write!(
        sink.out,
        ",\"args\":{{\"size\":{},\"addr\":\"{:#x}\",\"stream\":{},\"device\":{}",
        slice.size, slice.addr, slice.stream, d.device
    )?;
    records(sink, entries, &mut d.carried, &slice.begin_entries, true)?;
    sink.out.write_all(b"}}")?;
    sink.open("e", pid, tid::MEMORY)?;
    head(sink)?;
    sink.ts(slice.end_us)?;
    sink.out.write_all(b",\"args\":{")?;
    records(sink, entries, &mut d.carried, &slice.end_entries, false)?;
    sink.out.write_all(b"}}")
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

/// The Trace Event Format's shared stack frames of the stacks the events name: a tree of
/// frames from the outermost in, so a frame is written once per distinct path to it and each
/// stack is a node (its innermost frame's). Node `i` is written as `"base + i"`.
///
/// Memory: two words and a map entry a node, one map entry a stack. Nodes are at most the
/// frames of the distinct stacks named, usually far fewer (stacks share their outer frames).
#[derive(Default)]
pub(crate) struct StackFrames {
    /// Added to every node's id (a merge keeps clear of the torch trace's own frames).
    pub(crate) base: u64,
    /// Per node: its parent's index + 1 (0 for an outermost frame), its frame.
    nodes: Vec<(u32, FrameId)>,
    children: HashMap<(u32, FrameId), u32>,
    /// Each stack's node (`None` when no frame of it is shown).
    stacks: HashMap<StackId, Option<u32>>,
}

impl StackFrames {
    pub(crate) fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The id of `stack`'s node (its innermost shown frame), adding its frames the tree does
    /// not have yet; `None` when no frame of it is shown. O(depth) the first time, O(1) after.
    pub(crate) fn leaf(&mut self, snapshot: &Snapshot, stack: StackId) -> Option<u64> {
        let node = match self.stacks.get(&stack) {
            Some(&node) => node,
            None => {
                let frames: Vec<FrameId> =
                    shown_frames(snapshot, stack).map(|(id, _)| id).collect();
                let (nodes, children) = (&mut self.nodes, &mut self.children);
                let mut node = None;
                for &frame in frames.iter().rev() {
                    let parent = node.map_or(0, |n: u32| n + 1);
                    let next = nodes.len() as u32;
                    let id = *children.entry((parent, frame)).or_insert_with(|| {
                        nodes.push((parent, frame));
                        next
                    });
                    node = Some(id);
                }
                self.stacks.insert(stack, node);
                node
            }
        };
        node.map(|n| self.base + u64::from(n))
    }

    /// The dictionary's members, `"id":{"name":"file:line:name","parent":"id"}`, comma
    /// separated (the caller writes the braces).
    pub(crate) fn write_members(&self, snapshot: &Snapshot, out: &mut dyn Write) -> io::Result<()> {
        let mut name = String::new();
        for (i, &(parent, frame)) in self.nodes.iter().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            name.clear();
            write_frame(&mut name, snapshot.frames.get(frame));
            write!(out, "\"{}\":{{\"name\":", self.base + i as u64)?;
            serde_json::to_writer(&mut *out, &name).map_err(io::Error::from)?;
            if parent > 0 {
                write!(out, ",\"parent\":\"{}\"", self.base + u64::from(parent - 1))?;
            }
            out.write_all(b"}")?;
        }
        Ok(())
    }
}
