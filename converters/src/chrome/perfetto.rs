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

use memsnap_analysis::{CurveKind, DeviceTimeline, Lifetime, StepOptions};
use memsnap_format::{Action, Snapshot};
use prost::Message;

use super::write::{write_atomically, write_err, DeviceView, Labels, Lanes};
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
    let mut summary = ExportSummary::default();
    let mut labels = Labels::new(snapshot);
    let mut first = true;
    let mut emit = |packet: TracePacket, count: &mut u64| -> Result<()> {
        let mut packet = packet;
        packet.trusted_packet_sequence_id = Some(SEQUENCE_ID);
        if first {
            packet.sequence_flags = Some(1);
            first = false;
        }
        // Field 1 of `Trace`, length-delimited: the file is the packets one after another.
        let mut bytes = Vec::with_capacity(packet.encoded_len() + 11);
        prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut bytes);
        packet
            .encode_length_delimited(&mut bytes)
            .map_err(|e| write_err(std::io::Error::other(e)))?;
        out.write_all(&bytes).map_err(write_err)?;
        *count += 1;
        Ok(())
    };
    let descriptor = |d: TrackDescriptor| TracePacket {
        track_descriptor: Some(d),
        ..TracePacket::default()
    };
    for device in DeviceTimeline::devices(snapshot) {
        let timeline = DeviceTimeline::build(snapshot, device)?;
        let DeviceView {
            pid,
            trace,
            clock,
            process_name: name,
            summary: mut d,
        } = DeviceView::new(snapshot, options, &timeline);
        let ns = |us: i64| u64::try_from(i128::from(us) * 1000).unwrap_or(0);
        let process = pid as u64;
        emit(
            descriptor(TrackDescriptor {
                uuid: Some(process),
                process: Some(ProcessDescriptor {
                    pid: i32::try_from(pid).ok(),
                    process_name: Some(name),
                }),
                ..TrackDescriptor::default()
            }),
            &mut summary.events,
        )?;
        let child = |uuid: u64, name: &str, counter: bool| {
            descriptor(TrackDescriptor {
                uuid: Some(uuid),
                name: Some(name.into()),
                parent_uuid: Some(process),
                counter: counter.then_some(CounterDescriptor {
                    unit: Some(UNIT_SIZE_BYTES),
                }),
                ..TrackDescriptor::default()
            })
        };
        // A counter track for each curve the source records.
        let counter_track = |kind: CurveKind| uuid(pid, KIND_COUNTER, kind as usize);
        for (kind, _) in timeline.known_curves() {
            emit(
                child(counter_track(kind), kind.name(), true),
                &mut summary.events,
            )?;
        }
        emit(
            child(uuid(pid, KIND_EVENTS, 0), "events", false),
            &mut summary.events,
        )?;
        emit(
            child(uuid(pid, KIND_PHASES, 0), "phases", false),
            &mut summary.events,
        )?;

        // Events of the device, then sorted by time (stable: begin/end order kept).
        let mut events: Vec<(u64, TracePacket)> = Vec::new();
        let event = |time: i64, e: TrackEvent| {
            (
                ns(time),
                TracePacket {
                    timestamp: Some(ns(time)),
                    track_event: Some(e),
                    ..TracePacket::default()
                },
            )
        };
        for (kind, curve) in timeline.known_curves() {
            let track = counter_track(kind);
            let counter = |time, bytes: u64| {
                event(
                    time,
                    TrackEvent {
                        r#type: Some(TYPE_COUNTER),
                        track_uuid: Some(track),
                        counter_value: Some(i64::try_from(bytes).unwrap_or(i64::MAX)),
                        ..TrackEvent::default()
                    },
                )
            };
            for (time, bytes) in clock.counter_points(curve) {
                events.push(counter(time, bytes));
            }
        }
        let replay = timeline.replay();
        let mut lanes = Lanes::default();
        let mut new_tracks = Vec::new();
        for a in &replay.allocations {
            let (start, end) = clock.span(a.start(), a.end(Lifetime::Active, replay.axis_len()));
            let before = lanes.count;
            let lane = lanes.place(start, end);
            let track = uuid(pid, KIND_ALLOC_LANE, lane);
            if lanes.count > before {
                new_tracks.push(child(track, "allocations", false));
            }
            let (site, stack) = labels.get(a.stack);
            let mut annotations = vec![
                DebugAnnotation {
                    uint_value: Some(a.size),
                    ..annotation("size")
                },
                DebugAnnotation {
                    pointer_value: Some(a.addr),
                    ..annotation("addr")
                },
                DebugAnnotation {
                    int_value: Some(a.stream),
                    ..annotation("stream")
                },
            ];
            if !stack.is_empty() {
                annotations.push(DebugAnnotation {
                    string_value: Some(stack.clone()),
                    ..annotation("stack")
                });
            }
            events.push(event(
                start,
                TrackEvent {
                    r#type: Some(TYPE_SLICE_BEGIN),
                    track_uuid: Some(track),
                    name: Some(site.clone()),
                    categories: vec!["memsnap.alloc".into()],
                    debug_annotations: annotations,
                    ..TrackEvent::default()
                },
            ));
            events.push(event(
                end,
                TrackEvent {
                    r#type: Some(TYPE_SLICE_END),
                    track_uuid: Some(track),
                    ..TrackEvent::default()
                },
            ));
        }
        d.allocations = replay.allocations.len();
        d.lanes = lanes.count;
        let mut segment_lanes = Lanes::default();
        for s in &replay.segments {
            let (start, end) = clock.span(s.start(), s.end(clock.trace_len));
            let before = segment_lanes.count;
            let lane = segment_lanes.place(start, end);
            let track = uuid(pid, KIND_SEGMENT_LANE, lane);
            if segment_lanes.count > before {
                new_tracks.push(child(track, "segments", false));
            }
            events.push(event(
                start,
                TrackEvent {
                    r#type: Some(TYPE_SLICE_BEGIN),
                    track_uuid: Some(track),
                    name: Some("segment".into()),
                    debug_annotations: vec![
                        DebugAnnotation {
                            uint_value: Some(s.size),
                            ..annotation("size")
                        },
                        DebugAnnotation {
                            pointer_value: Some(s.addr),
                            ..annotation("addr")
                        },
                    ],
                    ..TrackEvent::default()
                },
            ));
            events.push(event(
                end,
                TrackEvent {
                    r#type: Some(TYPE_SLICE_END),
                    track_uuid: Some(track),
                    ..TrackEvent::default()
                },
            ));
        }
        for (i, entry) in trace.iter().enumerate() {
            let name = match entry.action {
                Action::Oom => "oom",
                Action::Snapshot => "snapshot",
                _ => continue,
            };
            let mut annotations = vec![DebugAnnotation {
                uint_value: Some(entry.size),
                ..annotation("size")
            }];
            if let Some(free) = entry.device_free() {
                annotations.push(DebugAnnotation {
                    uint_value: Some(free),
                    ..annotation("device_free")
                });
            }
            events.push(event(
                clock.at(i as u32),
                TrackEvent {
                    r#type: Some(TYPE_INSTANT),
                    track_uuid: Some(uuid(pid, KIND_EVENTS, 0)),
                    name: Some(name.into()),
                    debug_annotations: annotations,
                    ..TrackEvent::default()
                },
            ));
        }
        if options.phases && !trace.is_empty() {
            let track = uuid(pid, KIND_PHASES, 0);
            for (step, phase) in timeline.steps(&StepOptions::default()).phases() {
                let (start, end) = clock.phase_span(phase);
                let mut annotations = Vec::new();
                if let Some(step) = step {
                    annotations.push(DebugAnnotation {
                        uint_value: Some(step as u64),
                        ..annotation("step")
                    });
                }
                events.push(event(
                    start,
                    TrackEvent {
                        r#type: Some(TYPE_SLICE_BEGIN),
                        track_uuid: Some(track),
                        name: Some(phase.kind.name().into()),
                        debug_annotations: annotations,
                        ..TrackEvent::default()
                    },
                ));
                events.push(event(
                    end,
                    TrackEvent {
                        r#type: Some(TYPE_SLICE_END),
                        track_uuid: Some(track),
                        ..TrackEvent::default()
                    },
                ));
                d.phases += 1;
            }
        }
        for track in new_tracks {
            emit(track, &mut summary.events)?;
        }
        events.sort_by_key(|(time, _)| *time);
        for (_, packet) in events {
            emit(packet, &mut summary.events)?;
        }
        summary.devices.push(d);
    }
    Ok(summary)
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
