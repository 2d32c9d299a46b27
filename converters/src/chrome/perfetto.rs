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
//!
//! **Interned.** Slice names, categories, annotation names and stacks are the sequence's
//! interned data (`InternedData.event_names`, `event_categories`, `debug_annotation_names`,
//! `debug_annotation_string_values`): each is written once, in the packet that first uses it,
//! and referred to by its iid after (`name_iid`, `category_iids`, `DebugAnnotation.name_iid`,
//! `string_value_iid`). The first packet clears the sequence's incremental state, the packets
//! that carry or use interned data say they need it (`sequence_flags` 1 and 2, google/perfetto
//! `docs/reference/synthetic-track-event.md`, "Interning"). Trace processor resolves an
//! interned string value into the same string argument as an inline one
//! (`src/trace_processor/util/debug_annotation_parser.cc`), so a selected slice shows its
//! `stack` in ui.perfetto.dev as before. Inline, every allocation carried its whole stack: a
//! 1M-entry run with 150-frame stacks wrote 3.4 GB.
//!
//! **Streamed.** The events come merged by start time (`events::Order::ByStart`); each is written as
//! it comes, and a slice's end waits in a heap until the stream passes its time. Memory is the
//! slices open at once (about the lanes) and the interned ids, not the run's events: collecting
//! them to sort them held 1.8 GB at 10M entries.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Write;
use std::path::Path;

use foldhash::HashMap;
use memsnap_format::{Action, Snapshot, StackId};
use prost::Message;

use super::events::{for_each_event, stack_text, DeviceStart, Entry, Event, Order, Slice};
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
    #[prost(message, optional, tag = "12")]
    pub interned_data: Option<InternedData>,
    /// 1 = `SEQ_INCREMENTAL_STATE_CLEARED`, 2 = `SEQ_NEEDS_INCREMENTAL_STATE`.
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

/// `InternedData` (the fields used): new entries of the sequence's interning indexes.
#[derive(Clone, PartialEq, Message)]
pub struct InternedData {
    #[prost(message, repeated, tag = "1")]
    pub event_categories: Vec<EventCategory>,
    #[prost(message, repeated, tag = "2")]
    pub event_names: Vec<EventName>,
    #[prost(message, repeated, tag = "3")]
    pub debug_annotation_names: Vec<DebugAnnotationName>,
    #[prost(message, repeated, tag = "29")]
    pub debug_annotation_string_values: Vec<InternedString>,
}

/// `EventCategory`.
#[derive(Clone, PartialEq, Message)]
pub struct EventCategory {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
}

/// `EventName`.
#[derive(Clone, PartialEq, Message)]
pub struct EventName {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
}

/// `DebugAnnotationName`.
#[derive(Clone, PartialEq, Message)]
pub struct DebugAnnotationName {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
}

/// `InternedString` (`str` is `bytes` in the proto).
#[derive(Clone, PartialEq, Message)]
pub struct InternedString {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub str: Option<Vec<u8>>,
}

/// `TrackEvent` (the fields used).
#[derive(Clone, PartialEq, Message)]
pub struct TrackEvent {
    #[prost(uint64, repeated, packed = "false", tag = "3")]
    pub category_iids: Vec<u64>,
    #[prost(message, repeated, tag = "4")]
    pub debug_annotations: Vec<DebugAnnotation>,
    /// 1 `TYPE_SLICE_BEGIN`, 2 `TYPE_SLICE_END`, 3 `TYPE_INSTANT`, 4 `TYPE_COUNTER`.
    #[prost(int32, optional, tag = "9")]
    pub r#type: Option<i32>,
    #[prost(uint64, optional, tag = "10")]
    pub name_iid: Option<u64>,
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
    #[prost(uint64, optional, tag = "1")]
    pub name_iid: Option<u64>,
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
    #[prost(uint64, optional, tag = "17")]
    pub string_value_iid: Option<u64>,
}

pub const TYPE_SLICE_BEGIN: i32 = 1;
pub const TYPE_SLICE_END: i32 = 2;
pub const TYPE_INSTANT: i32 = 3;
pub const TYPE_COUNTER: i32 = 4;
const UNIT_SIZE_BYTES: i32 = 3;
/// `TracePacket.sequence_flags`: the first packet clears the incremental state (the interned
/// data); packets that carry or use interned data need it.
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;
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

/// Writes `snapshot` as a Perfetto protobuf trace.
pub fn write_perfetto(
    snapshot: &Snapshot,
    options: &ChromeOptions,
    out: &mut dyn Write,
) -> Result<ExportSummary> {
    let mut writer = Writer::new(snapshot, out);
    let mut summary = for_each_event(snapshot, options, Order::ByStart, &mut |event| {
        writer.event(event)
    })?;
    summary.events = writer.packets;
    Ok(summary)
}

/// The protobuf writer's state while the stream passes.
struct Writer<'w> {
    snapshot: &'w Snapshot,
    out: &'w mut dyn Write,
    /// Whether no packet was written yet (the first clears the sequence's state).
    first: bool,
    packets: u64,
    /// The packet being encoded (its buffer is reused).
    buffer: Vec<u8>,
    interned: Interned,
    device: Device,
    /// The most slice ends that waited at once (the writer's memory, counted by tests).
    most_open: usize,
}

/// The device whose events are being written.
#[derive(Default)]
struct Device {
    pid: i64,
    /// Lanes whose tracks are declared.
    alloc_lanes: usize,
    segment_lanes: usize,
    /// The ends of the slices begun and not ended: `(ns, order, track)`, the earliest first
    /// (`order` keeps ends at one time in the order their slices began).
    open: BinaryHeap<Reverse<(u64, u64, u64)>>,
    begun: u64,
}

/// The sequence's interning indexes: each string's iid, from 1 (0 is not an iid). Stacks are
/// keyed by id, so a stack's text is made once, written, and not kept.
#[derive(Default)]
struct Interned {
    names: HashMap<Box<str>, u64>,
    categories: HashMap<&'static str, u64>,
    annotations: HashMap<&'static str, u64>,
    stacks: HashMap<StackId, Option<u64>>,
    /// Stack texts interned so far.
    stack_texts: u64,
    /// The entries the next packet brings in.
    new: InternedData,
}

impl Interned {
    fn name(&mut self, name: &str) -> u64 {
        if let Some(&iid) = self.names.get(name) {
            return iid;
        }
        let iid = self.names.len() as u64 + 1;
        self.names.insert(name.into(), iid);
        self.new.event_names.push(EventName {
            iid: Some(iid),
            name: Some(name.into()),
        });
        iid
    }

    fn category(&mut self, category: &'static str) -> u64 {
        let next = self.categories.len() as u64 + 1;
        *self.categories.entry(category).or_insert_with(|| {
            self.new.event_categories.push(EventCategory {
                iid: Some(next),
                name: Some(category.into()),
            });
            next
        })
    }

    /// An annotation named `name` (its value is the caller's).
    fn annotation(&mut self, name: &'static str) -> DebugAnnotation {
        let next = self.annotations.len() as u64 + 1;
        let iid = *self.annotations.entry(name).or_insert_with(|| {
            self.new.debug_annotation_names.push(DebugAnnotationName {
                iid: Some(next),
                name: Some(name.into()),
            });
            next
        });
        DebugAnnotation {
            name_iid: Some(iid),
            ..DebugAnnotation::default()
        }
    }

    /// The iid of a stack's text (`None` when no frame of it is shown).
    fn stack(&mut self, snapshot: &Snapshot, stack: StackId) -> Option<u64> {
        if let Some(&iid) = self.stacks.get(&stack) {
            return iid;
        }
        let text = stack_text(snapshot, stack);
        let iid = (!text.is_empty()).then(|| {
            self.stack_texts += 1;
            let iid = self.stack_texts;
            self.new
                .debug_annotation_string_values
                .push(InternedString {
                    iid: Some(iid),
                    str: Some(text.into_bytes()),
                });
            iid
        });
        self.stacks.insert(stack, iid);
        iid
    }

    /// The entries interned since the last packet, if any.
    fn take(&mut self) -> Option<InternedData> {
        let new = &self.new;
        let empty = new.event_names.is_empty()
            && new.event_categories.is_empty()
            && new.debug_annotation_names.is_empty()
            && new.debug_annotation_string_values.is_empty();
        (!empty).then(|| std::mem::take(&mut self.new))
    }
}

/// A time in µs as the packets' ns (0 before the epoch).
fn ns_of(time_us: i64) -> u64 {
    u64::try_from(i128::from(time_us) * 1000).unwrap_or(0)
}

/// A track event's packet at `ns`.
fn event_packet(ns: u64, event: TrackEvent) -> TracePacket {
    TracePacket {
        timestamp: Some(ns),
        track_event: Some(event),
        ..TracePacket::default()
    }
}

fn descriptor(d: TrackDescriptor) -> TracePacket {
    TracePacket {
        track_descriptor: Some(d),
        ..TracePacket::default()
    }
}

/// A child track of the device's process.
fn child(pid: i64, uuid: u64, name: &str, counter: bool) -> TracePacket {
    descriptor(TrackDescriptor {
        uuid: Some(uuid),
        name: Some(name.into()),
        parent_uuid: Some(pid as u64),
        counter: counter.then_some(CounterDescriptor {
            unit: Some(UNIT_SIZE_BYTES),
        }),
        ..TrackDescriptor::default()
    })
}

impl<'w> Writer<'w> {
    fn new(snapshot: &'w Snapshot, out: &'w mut dyn Write) -> Self {
        Writer {
            snapshot,
            out,
            first: true,
            packets: 0,
            buffer: Vec::new(),
            interned: Interned::default(),
            device: Device::default(),
            most_open: 0,
        }
    }

    /// Writes a packet on the sequence, with the interned entries it brings in.
    fn emit(&mut self, mut packet: TracePacket) -> Result<()> {
        packet.trusted_packet_sequence_id = Some(SEQUENCE_ID);
        packet.interned_data = self.interned.take();
        let interned = packet.interned_data.is_some()
            || packet.track_event.as_ref().is_some_and(|e| {
                e.name_iid.is_some()
                    || !e.category_iids.is_empty()
                    || e.debug_annotations.iter().any(|a| a.name_iid.is_some())
            });
        let mut flags = if interned {
            SEQ_NEEDS_INCREMENTAL_STATE
        } else {
            0
        };
        if self.first {
            flags |= SEQ_INCREMENTAL_STATE_CLEARED;
            self.first = false;
        }
        packet.sequence_flags = (flags != 0).then_some(flags);
        // Field 1 of `Trace`, length-delimited: the file is the packets one after another.
        self.buffer.clear();
        prost::encoding::encode_key(
            1,
            prost::encoding::WireType::LengthDelimited,
            &mut self.buffer,
        );
        packet
            .encode_length_delimited(&mut self.buffer)
            .map_err(|e| write_err(std::io::Error::other(e)))?;
        self.out.write_all(&self.buffer).map_err(write_err)?;
        self.packets += 1;
        Ok(())
    }

    /// Writes the ends of the slices that end at or before `ns`, earliest first, so every
    /// packet after them is at a later time.
    fn end_until(&mut self, ns: u64) -> Result<()> {
        while let Some(&Reverse((end, _, track))) = self.device.open.peek() {
            if end > ns {
                break;
            }
            self.device.open.pop();
            let event = TrackEvent {
                r#type: Some(TYPE_SLICE_END),
                track_uuid: Some(track),
                ..TrackEvent::default()
            };
            self.emit(event_packet(end, event))?;
        }
        Ok(())
    }

    /// Begins a slice at `ns` (after the ends before it) and keeps its end for its time.
    fn begin(&mut self, ns: u64, end_ns: u64, event: TrackEvent) -> Result<()> {
        let track = event.track_uuid.unwrap_or_default();
        self.end_until(ns)?;
        self.emit(event_packet(ns, event))?;
        let d = &mut self.device;
        d.open.push(Reverse((end_ns, d.begun, track)));
        d.begun += 1;
        self.most_open = self.most_open.max(d.open.len());
        Ok(())
    }

    fn event(&mut self, event: Event<'_, '_>) -> Result<()> {
        match event {
            Event::Device(start) => self.start(start),
            Event::DeviceEnd => self.end_until(u64::MAX),
            Event::Counter(c) => {
                let ns = ns_of(c.time_us);
                self.end_until(ns)?;
                let event = TrackEvent {
                    r#type: Some(TYPE_COUNTER),
                    track_uuid: Some(uuid(self.device.pid, KIND_COUNTER, c.curve as usize)),
                    counter_value: Some(i64::try_from(c.bytes).unwrap_or(i64::MAX)),
                    ..TrackEvent::default()
                };
                self.emit(event_packet(ns, event))
            }
            Event::Allocation(slice) => self.slice(KIND_ALLOC_LANE, &slice),
            Event::Segment(slice) => self.slice(KIND_SEGMENT_LANE, &slice),
            // The picture shows OOMs and snapshots; the other entries are in the slices.
            Event::Entry(Entry { time_us, entry, .. }) => {
                let name = match entry.action {
                    Action::Oom => "oom",
                    Action::Snapshot => "snapshot",
                    _ => return Ok(()),
                };
                let ns = ns_of(time_us);
                self.end_until(ns)?;
                let i = &mut self.interned;
                let mut annotations = vec![DebugAnnotation {
                    uint_value: Some(entry.size),
                    ..i.annotation("size")
                }];
                if let Some(free) = entry.device_free() {
                    annotations.push(DebugAnnotation {
                        uint_value: Some(free),
                        ..i.annotation("device_free")
                    });
                }
                let event = TrackEvent {
                    r#type: Some(TYPE_INSTANT),
                    track_uuid: Some(uuid(self.device.pid, KIND_EVENTS, 0)),
                    name_iid: Some(i.name(name)),
                    debug_annotations: annotations,
                    ..TrackEvent::default()
                };
                self.emit(event_packet(ns, event))
            }
            Event::Phase(p) => {
                let i = &mut self.interned;
                let event = TrackEvent {
                    r#type: Some(TYPE_SLICE_BEGIN),
                    track_uuid: Some(uuid(self.device.pid, KIND_PHASES, 0)),
                    name_iid: Some(i.name(p.phase.kind.name())),
                    debug_annotations: p
                        .step
                        .map(|step| DebugAnnotation {
                            uint_value: Some(step as u64),
                            ..i.annotation("step")
                        })
                        .into_iter()
                        .collect(),
                    ..TrackEvent::default()
                };
                self.begin(ns_of(p.start_us), ns_of(p.end_us), event)
            }
            // record_function ranges are not drawn here (yet), and not in this order.
            Event::Range { .. } => Ok(()),
        }
    }

    /// A slice on its lane's track, declaring the track on the lane's first slice. Only
    /// allocations carry a category, stream and stack.
    fn slice(&mut self, kind: u64, slice: &Slice<'_>) -> Result<()> {
        let pid = self.device.pid;
        let track = uuid(pid, kind, slice.lane);
        let (seen, lanes_name) = match kind {
            KIND_ALLOC_LANE => (&mut self.device.alloc_lanes, "allocations"),
            _ => (&mut self.device.segment_lanes, "segments"),
        };
        if slice.lane >= *seen {
            *seen = slice.lane + 1;
            self.emit(child(pid, track, lanes_name, false))?;
        }
        let allocation = kind == KIND_ALLOC_LANE;
        let i = &mut self.interned;
        let mut annotations = vec![
            DebugAnnotation {
                uint_value: Some(slice.size),
                ..i.annotation("size")
            },
            DebugAnnotation {
                pointer_value: Some(slice.addr),
                ..i.annotation("addr")
            },
        ];
        if allocation {
            annotations.push(DebugAnnotation {
                int_value: Some(slice.stream),
                ..i.annotation("stream")
            });
            if let Some(iid) = slice.stack.and_then(|s| i.stack(self.snapshot, s)) {
                annotations.push(DebugAnnotation {
                    string_value_iid: Some(iid),
                    ..i.annotation("stack")
                });
            }
        }
        let event = TrackEvent {
            r#type: Some(TYPE_SLICE_BEGIN),
            track_uuid: Some(track),
            name_iid: Some(i.name(slice.site)),
            category_iids: if allocation {
                vec![i.category("memsnap.alloc")]
            } else {
                Vec::new()
            },
            debug_annotations: annotations,
            ..TrackEvent::default()
        };
        self.begin(ns_of(slice.start_us), ns_of(slice.end_us), event)
    }

    /// The device's process track and the tracks it always has: a counter track per recorded
    /// curve, `events` and `phases`.
    fn start(&mut self, start: &DeviceStart<'_>) -> Result<()> {
        // The previous device's slices all ended at its end.
        let pid = start.pid;
        self.device = Device {
            pid,
            ..Device::default()
        };
        self.emit(descriptor(TrackDescriptor {
            uuid: Some(pid as u64),
            process: Some(ProcessDescriptor {
                pid: i32::try_from(pid).ok(),
                process_name: Some(start.process_name.clone()),
            }),
            ..TrackDescriptor::default()
        }))?;
        for &curve in &start.curves {
            self.emit(child(
                pid,
                uuid(pid, KIND_COUNTER, curve as usize),
                curve.name(),
                true,
            ))?;
        }
        self.emit(child(pid, uuid(pid, KIND_EVENTS, 0), "events", false))?;
        self.emit(child(pid, uuid(pid, KIND_PHASES, 0), "phases", false))
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
    use memsnap_workload::{generate, TrainingRun};

    /// The writer holds only the slices open at once, not the run's events: collecting every
    /// event to sort it held 1.8 GB at 10M entries.
    #[test]
    fn a_perfetto_export_holds_only_the_open_slices() {
        let (snapshot, _) = generate(&TrainingRun {
            steps: 30,
            ..TrainingRun::default()
        });
        let mut out = Vec::new();
        let mut writer = Writer::new(&snapshot, &mut out);
        let summary = for_each_event(
            &snapshot,
            &ChromeOptions::default(),
            Order::ByStart,
            &mut |event| writer.event(event),
        )
        .expect("export");
        let (most_open, d) = (writer.most_open, &writer.device);
        // One open slice a lane at most (a lane's slices never overlap), and the phases'.
        assert!(
            most_open <= d.alloc_lanes + d.segment_lanes + 1,
            "{most_open}"
        );
        assert_eq!(d.alloc_lanes, summary.devices[0].lanes);
        let allocations = summary.devices[0].allocations;
        assert!(most_open * 10 < allocations, "{most_open} of {allocations}");
        assert!(d.open.is_empty(), "every slice ended at the device's end");
    }

    /// A stack's text is interned once by its id, and a stack with no shown frame gets none.
    #[test]
    fn a_stack_is_interned_once() {
        let (snapshot, _) = generate(&TrainingRun::default());
        let stack = (0..snapshot.stacks.len())
            .map(StackId::from_index)
            .find(|&s| !stack_text(&snapshot, s).is_empty())
            .expect("a stack");
        let mut interned = Interned::default();
        let iid = interned.stack(&snapshot, stack);
        assert_eq!(iid, Some(1));
        assert_eq!(interned.stack(&snapshot, stack), iid);
        let new = interned.take().expect("new entries");
        assert_eq!(new.debug_annotation_string_values.len(), 1);
        assert!(interned.take().is_none());
    }
}
