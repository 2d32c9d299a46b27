//! Perfetto's native protobuf trace (`.pftrace`), the same picture as the JSON export.
//!
//! The file is a `Trace { repeated TracePacket packet = 1; }`; the few messages used are
//! written here as `prost` structs with google/perfetto's field numbers
//! (`protos/perfetto/trace/…`), no protoc needed. Layout (Perfetto's "synthetic track
//! events"): a process track per device, child counter tracks `allocated`, `active`,
//! `reserved` (bytes), one child track per allocation lane, all named `allocations`
//! (same-name siblings merge visually), segment lanes named `segments`, a track `events` for
//! OOM and snapshot instants and a track `phases` for the step phases. Times are ns
//! (`time_us * 1000`); packets are written in time order per device, each track declared
//! before its first event, on one sequence. Debug annotations carry size, address, stream and
//! stack. It is a picture: memsnap reads back the JSON export, not this one.

use std::io::Write;
use std::path::Path;
use std::rc::Rc;

use foldhash::HashMap;
use memsnap_format::{Action, Snapshot};
use prost::Message;

use super::events::{for_each_event, DeviceStart, Entry, Event, Slice};
use super::write::{write_atomically, write_err};
use super::{ChromeOptions, ExportSummary};
use crate::Result;

/// `Trace`.
#[derive(Clone, PartialEq, Message)]
pub struct Trace {
    #[prost(message, repeated, tag = "1")]
    pub packet: Vec<TracePacket>,
}

/// `TracePacket` (the fields used).
#[derive(Clone, PartialEq, Message)]
pub struct TracePacket {
    #[prost(uint64, optional, tag = "8")]
    pub timestamp: Option<u64>,
    #[prost(uint32, optional, tag = "10")]
    pub trusted_packet_sequence_id: Option<u32>,
    #[prost(message, optional, tag = "11")]
    pub track_event: Option<TrackEvent>,
    /// 1 = `SEQ_INCREMENTAL_STATE_CLEARED`.
    #[prost(uint32, optional, tag = "13")]
    pub sequence_flags: Option<u32>,
    #[prost(message, optional, tag = "60")]
    pub track_descriptor: Option<TrackDescriptor>,
}

/// `TrackDescriptor`.
#[derive(Clone, PartialEq, Message)]
pub struct TrackDescriptor {
    #[prost(uint64, optional, tag = "1")]
    pub uuid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    #[prost(message, optional, tag = "3")]
    pub process: Option<ProcessDescriptor>,
    #[prost(uint64, optional, tag = "5")]
    pub parent_uuid: Option<u64>,
    #[prost(message, optional, tag = "8")]
    pub counter: Option<CounterDescriptor>,
}

/// `ProcessDescriptor`.
#[derive(Clone, PartialEq, Message)]
pub struct ProcessDescriptor {
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    #[prost(string, optional, tag = "6")]
    pub process_name: Option<String>,
}

/// `CounterDescriptor`: `unit` 3 = `UNIT_SIZE_BYTES`.
#[derive(Clone, PartialEq, Message)]
pub struct CounterDescriptor {
    #[prost(int32, optional, tag = "3")]
    pub unit: Option<i32>,
}

/// `TrackEvent` (the fields used).
#[derive(Clone, PartialEq, Message)]
pub struct TrackEvent {
    #[prost(message, repeated, tag = "4")]
    pub debug_annotations: Vec<DebugAnnotation>,
    /// 1 `TYPE_SLICE_BEGIN`, 2 `TYPE_SLICE_END`, 3 `TYPE_INSTANT`, 4 `TYPE_COUNTER`.
    #[prost(int32, optional, tag = "9")]
    pub r#type: Option<i32>,
    #[prost(uint64, optional, tag = "11")]
    pub track_uuid: Option<u64>,
    #[prost(string, repeated, tag = "22")]
    pub categories: Vec<String>,
    #[prost(string, optional, tag = "23")]
    pub name: Option<String>,
    #[prost(int64, optional, tag = "30")]
    pub counter_value: Option<i64>,
}

/// `DebugAnnotation` (the fields used).
#[derive(Clone, PartialEq, Message)]
pub struct DebugAnnotation {
    #[prost(uint64, optional, tag = "3")]
    pub uint_value: Option<u64>,
    #[prost(int64, optional, tag = "4")]
    pub int_value: Option<i64>,
    #[prost(string, optional, tag = "6")]
    pub string_value: Option<String>,
    #[prost(uint64, optional, tag = "7")]
    pub pointer_value: Option<u64>,
    #[prost(string, optional, tag = "10")]
    pub name: Option<String>,
}

pub const TYPE_SLICE_BEGIN: i32 = 1;
pub const TYPE_SLICE_END: i32 = 2;
pub const TYPE_INSTANT: i32 = 3;
pub const TYPE_COUNTER: i32 = 4;
const UNIT_SIZE_BYTES: i32 = 3;
/// The one packet sequence.
pub const SEQUENCE_ID: u32 = 7;

/// Child track uuids: `pid << 32 | kind << 28 | index`.
fn uuid(pid: i64, kind: u64, index: usize) -> u64 {
    ((pid as u64) << 32) | (kind << 28) | (index as u64 & 0x0fff_ffff)
}
const KIND_COUNTER: u64 = 1;
const KIND_ALLOC_LANE: u64 = 2;
const KIND_SEGMENT_LANE: u64 = 3;
const KIND_EVENTS: u64 = 4;
const KIND_PHASES: u64 = 5;

fn annotation(name: &str) -> DebugAnnotation {
    DebugAnnotation {
        name: Some(name.into()),
        ..DebugAnnotation::default()
    }
}

/// Writes `snapshot` as a Perfetto protobuf trace.
pub fn write_perfetto(
    snapshot: &Snapshot,
    options: &ChromeOptions,
    out: &mut dyn Write,
) -> Result<ExportSummary> {
    let mut writer = Writer {
        out,
        first: true,
        packets: 0,
        device: None,
    };
    let mut summary = for_each_event(snapshot, options, &mut |event| writer.event(event))?;
    summary.events = writer.packets;
    Ok(summary)
}

/// The protobuf writer's state while the stream passes.
struct Writer<'w> {
    out: &'w mut dyn Write,
    /// Whether no packet was written yet (the first clears the sequence's state).
    first: bool,
    packets: u64,
    device: Option<Device>,
}

/// The device whose events are being collected: they are written at its end, in time order,
/// after the lanes' track descriptors.
///
/// Collected compact ([`Pending`], 64 bytes an event, names and stacks as indexes into the
/// device's [`Texts`]) and made into packets only as they are written: as whole packets,
/// with their own copies of every site and stack, a 1M-entry run held 1.65 GB (26x its Chrome
/// export) and one with 150-frame stacks 4.5 GB.
struct Device {
    pid: i64,
    /// Lane tracks in the order their lanes were first used (allocations', then segments').
    new_tracks: Vec<TracePacket>,
    alloc_lanes: usize,
    segment_lanes: usize,
    events: Vec<(u64, Pending)>,
    /// Each curve's points apart, 16 bytes each: there can be one per trace entry and curve
    /// (as `Pending`s, 1.9 GB of a 10M-entry run's 2.6 GB). Their track, then `(ns, bytes)`.
    counters: Vec<(u64, Vec<(u64, i64)>)>,
    texts: Texts,
}

/// Each distinct site or stack text of a device once.
#[derive(Default)]
struct Texts {
    /// The map and the list share each text (a deep stack is kilobytes, and a run can
    /// have tens of thousands).
    ids: HashMap<Rc<str>, u32>,
    texts: Vec<Rc<str>>,
}

impl Texts {
    fn id(&mut self, text: &str) -> u32 {
        if let Some(&id) = self.ids.get(text) {
            return id;
        }
        let id = self.texts.len() as u32;
        let text: Rc<str> = Rc::from(text);
        self.texts.push(Rc::clone(&text));
        self.ids.insert(text, id);
        id
    }
}

/// One track event waiting for its turn, with what its packet needs.
enum Pending {
    /// An allocation's (`stream` set) or a segment's slice begins.
    SliceBegin {
        track: u64,
        name: u32,
        size: u64,
        addr: u64,
        /// `Some` for an allocation (also named by its category and stream).
        stream: Option<i64>,
        stack: Option<u32>,
    },
    /// A phase's slice begins.
    PhaseBegin {
        track: u64,
        name: &'static str,
        step: Option<u64>,
    },
    SliceEnd {
        track: u64,
    },
    Instant {
        track: u64,
        name: &'static str,
        size: u64,
        device_free: Option<u64>,
    },
}

impl Pending {
    /// The packet, as it is written.
    fn packet(self, ns: u64, texts: &Texts) -> TracePacket {
        let text = |id: u32| texts.texts[id as usize].to_string();
        let event = match self {
            Pending::SliceBegin {
                track,
                name,
                size,
                addr,
                stream,
                stack,
            } => {
                let mut annotations = place(size, addr);
                if let Some(stream) = stream {
                    annotations.push(DebugAnnotation {
                        int_value: Some(stream),
                        ..annotation("stream")
                    });
                }
                if let Some(stack) = stack {
                    annotations.push(DebugAnnotation {
                        string_value: Some(text(stack)),
                        ..annotation("stack")
                    });
                }
                TrackEvent {
                    r#type: Some(TYPE_SLICE_BEGIN),
                    track_uuid: Some(track),
                    name: Some(text(name)),
                    categories: match stream {
                        Some(_) => vec!["memsnap.alloc".into()],
                        None => Vec::new(),
                    },
                    debug_annotations: annotations,
                    ..TrackEvent::default()
                }
            }
            Pending::PhaseBegin { track, name, step } => TrackEvent {
                r#type: Some(TYPE_SLICE_BEGIN),
                track_uuid: Some(track),
                name: Some(name.into()),
                debug_annotations: step
                    .map(|step| DebugAnnotation {
                        uint_value: Some(step),
                        ..annotation("step")
                    })
                    .into_iter()
                    .collect(),
                ..TrackEvent::default()
            },
            Pending::SliceEnd { track } => TrackEvent {
                r#type: Some(TYPE_SLICE_END),
                track_uuid: Some(track),
                ..TrackEvent::default()
            },
            Pending::Instant {
                track,
                name,
                size,
                device_free,
            } => {
                let mut annotations = vec![DebugAnnotation {
                    uint_value: Some(size),
                    ..annotation("size")
                }];
                if let Some(free) = device_free {
                    annotations.push(DebugAnnotation {
                        uint_value: Some(free),
                        ..annotation("device_free")
                    });
                }
                TrackEvent {
                    r#type: Some(TYPE_INSTANT),
                    track_uuid: Some(track),
                    name: Some(name.into()),
                    debug_annotations: annotations,
                    ..TrackEvent::default()
                }
            }
        };
        TracePacket {
            timestamp: Some(ns),
            track_event: Some(event),
            ..TracePacket::default()
        }
    }
}

/// A time in µs as the packets' ns (0 before the epoch).
fn ns_of(time_us: i64) -> u64 {
    u64::try_from(i128::from(time_us) * 1000).unwrap_or(0)
}

/// A counter's packet.
fn counter_packet(track: u64, ns: u64, value: i64) -> TracePacket {
    TracePacket {
        timestamp: Some(ns),
        track_event: Some(TrackEvent {
            r#type: Some(TYPE_COUNTER),
            track_uuid: Some(track),
            counter_value: Some(value),
            ..TrackEvent::default()
        }),
        ..TracePacket::default()
    }
}

impl Device {
    fn push(&mut self, time_us: i64, pending: Pending) {
        self.events.push((ns_of(time_us), pending));
    }

    /// A child track of the device's process.
    fn child(&self, uuid: u64, name: &str, counter: bool) -> TracePacket {
        descriptor(TrackDescriptor {
            uuid: Some(uuid),
            name: Some(name.into()),
            parent_uuid: Some(self.pid as u64),
            counter: counter.then_some(CounterDescriptor {
                unit: Some(UNIT_SIZE_BYTES),
            }),
            ..TrackDescriptor::default()
        })
    }

    /// A slice's begin and end on its lane's track, declaring the track on the lane's first.
    fn slice(&mut self, kind: u64, slice: &Slice<'_>, stream: Option<i64>) {
        let track = uuid(self.pid, kind, slice.lane);
        let (seen, lanes_name) = match kind {
            KIND_ALLOC_LANE => (&mut self.alloc_lanes, "allocations"),
            _ => (&mut self.segment_lanes, "segments"),
        };
        if slice.lane >= *seen {
            *seen = slice.lane + 1;
            let child = self.child(track, lanes_name, false);
            self.new_tracks.push(child);
        }
        let name = self.texts.id(slice.site);
        // Only allocations carry their stack.
        let stack =
            (stream.is_some() && !slice.stack.is_empty()).then(|| self.texts.id(slice.stack));
        let begin = Pending::SliceBegin {
            track,
            name,
            size: slice.size,
            addr: slice.addr,
            stream,
            stack,
        };
        self.push(slice.start_us, begin);
        self.push(slice.end_us, Pending::SliceEnd { track });
    }

    /// Turns an event of the device into pending packets (the process and its end are the
    /// writer's).
    fn collect(&mut self, event: Event<'_, '_>) {
        match event {
            Event::Counter(c) => {
                let track = uuid(self.pid, KIND_COUNTER, c.curve as usize);
                let value = i64::try_from(c.bytes).unwrap_or(i64::MAX);
                if self.counters.last().is_none_or(|(t, _)| *t != track) {
                    self.counters.push((track, Vec::new()));
                }
                if let Some((_, points)) = self.counters.last_mut() {
                    points.push((ns_of(c.time_us), value));
                }
            }
            Event::Allocation(slice) => self.slice(KIND_ALLOC_LANE, &slice, Some(slice.stream)),
            Event::Segment(slice) => self.slice(KIND_SEGMENT_LANE, &slice, None),
            // The picture shows OOMs and snapshots; the other entries are in the slices.
            Event::Entry(Entry { time_us, entry, .. }) => {
                let name = match entry.action {
                    Action::Oom => "oom",
                    Action::Snapshot => "snapshot",
                    _ => return,
                };
                let track = uuid(self.pid, KIND_EVENTS, 0);
                let instant = Pending::Instant {
                    track,
                    name,
                    size: entry.size,
                    device_free: entry.device_free(),
                };
                self.push(time_us, instant);
            }
            Event::Phase(p) => {
                let track = uuid(self.pid, KIND_PHASES, 0);
                let begin = Pending::PhaseBegin {
                    track,
                    name: p.phase.kind.name(),
                    step: p.step.map(|s| s as u64),
                };
                self.push(p.start_us, begin);
                self.push(p.end_us, Pending::SliceEnd { track });
            }
            // record_function ranges are not drawn here (yet).
            Event::Range { .. } | Event::Device(_) | Event::DeviceEnd => {}
        }
    }
}

/// A slice's `size` and `addr` annotations.
fn place(size: u64, addr: u64) -> Vec<DebugAnnotation> {
    vec![
        DebugAnnotation {
            uint_value: Some(size),
            ..annotation("size")
        },
        DebugAnnotation {
            pointer_value: Some(addr),
            ..annotation("addr")
        },
    ]
}

fn descriptor(d: TrackDescriptor) -> TracePacket {
    TracePacket {
        track_descriptor: Some(d),
        ..TracePacket::default()
    }
}

impl Writer<'_> {
    fn emit(&mut self, mut packet: TracePacket) -> Result<()> {
        packet.trusted_packet_sequence_id = Some(SEQUENCE_ID);
        if self.first {
            packet.sequence_flags = Some(1);
            self.first = false;
        }
        // Field 1 of `Trace`, length-delimited: the file is the packets one after another.
        let mut bytes = Vec::with_capacity(packet.encoded_len() + 11);
        prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut bytes);
        packet
            .encode_length_delimited(&mut bytes)
            .map_err(|e| write_err(std::io::Error::other(e)))?;
        self.out.write_all(&bytes).map_err(write_err)?;
        self.packets += 1;
        Ok(())
    }

    fn event(&mut self, event: Event<'_, '_>) -> Result<()> {
        match event {
            Event::Device(start) => self.start(start),
            Event::DeviceEnd => self.end(),
            event => {
                if let Some(d) = self.device.as_mut() {
                    d.collect(event);
                }
                Ok(())
            }
        }
    }

    /// The device's lane tracks, then its events in time order.
    fn end(&mut self) -> Result<()> {
        let Some(Device {
            new_tracks,
            mut events,
            mut counters,
            texts,
            ..
        }) = self.device.take()
        else {
            return Ok(());
        };
        for track in new_tracks {
            self.emit(track)?;
        }
        // In time order, and at equal times in the order collected (a slice's begin before
        // its end): each source sorted stably, then merged, earlier sources first at a tie.
        // The counters came first, curve by curve.
        for (_, points) in &mut counters {
            points.sort_by_key(|&(ns, _)| ns);
        }
        events.sort_by_key(|&(ns, _)| ns);
        let mut next = vec![0usize; counters.len()];
        let mut events = events.into_iter().peekable();
        loop {
            let counter = (0..counters.len())
                .filter_map(|c| counters[c].1.get(next[c]).map(|&(ns, _)| (ns, c)))
                .min();
            match (counter, events.peek()) {
                (Some((ns, c)), event) if event.is_none_or(|&(event_ns, _)| ns <= event_ns) => {
                    let (track, points) = &counters[c];
                    let (_, value) = points[next[c]];
                    next[c] += 1;
                    self.emit(counter_packet(*track, ns, value))?;
                }
                (_, Some(_)) => {
                    let Some((ns, pending)) = events.next() else {
                        break;
                    };
                    self.emit(pending.packet(ns, &texts))?;
                }
                (_, None) => break,
            }
        }
        Ok(())
    }
    /// The device's process track and the tracks it always has: a counter track per recorded
    /// curve, `events` and `phases`.
    fn start(&mut self, start: &DeviceStart<'_>) -> Result<()> {
        let pid = start.pid;
        self.emit(descriptor(TrackDescriptor {
            uuid: Some(pid as u64),
            process: Some(ProcessDescriptor {
                pid: i32::try_from(pid).ok(),
                process_name: Some(start.process_name.clone()),
            }),
            ..TrackDescriptor::default()
        }))?;
        let d = Device {
            pid,
            new_tracks: Vec::new(),
            alloc_lanes: 0,
            segment_lanes: 0,
            events: Vec::new(),
            counters: Vec::new(),
            texts: Texts::default(),
        };
        for &curve in &start.curves {
            self.emit(d.child(uuid(pid, KIND_COUNTER, curve as usize), curve.name(), true))?;
        }
        self.emit(d.child(uuid(pid, KIND_EVENTS, 0), "events", false))?;
        self.emit(d.child(uuid(pid, KIND_PHASES, 0), "phases", false))?;
        self.device = Some(d);
        Ok(())
    }
}

/// Writes `snapshot` as a Perfetto protobuf trace to `path` (gzipped when it ends in `.gz`),
/// atomically.
pub fn export_perfetto_path(
    snapshot: &Snapshot,
    options: &ChromeOptions,
    path: &Path,
) -> Result<ExportSummary> {
    write_atomically(path, |out| write_perfetto(snapshot, options, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events waiting to be written in time order are held compact: as whole packets, a
    /// 1M-entry run's export peaked at 1.65 GB (26x its Chrome export), one with 150-frame
    /// stacks at 4.5 GB.
    #[test]
    fn a_perfetto_export_holds_its_pending_events_compact() {
        assert!(std::mem::size_of::<(u64, Pending)>() <= 64);
        let mut texts = Texts::default();
        let stack = "a.py:1:f\nb.py:2:g";
        assert_eq!(texts.id(stack), texts.id(stack));
        assert_eq!(texts.texts.len(), 1);
    }
}
