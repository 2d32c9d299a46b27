//! Building the `format` snapshot: raw data is copied under the lock, stacks are symbolised
//! after it is released.

use std::collections::HashMap;
use std::sync::Arc;

use memsnap_format::{
    Action, AllocatorSettings, Annotation, Block, BlockState, Frame, RecorderInfo, Segment,
    SegmentType, Snapshot, StackId, TraceEntry, Value,
};

use super::state::State;
use crate::config::ROUNDUP_BUCKETS;
use crate::history::{RawAnnotation, RingTrace};
use crate::stacks::{symbolize, RawStackId, NO_STACK};

pub(super) struct RawSnapshot {
    trace: RingTrace,
    segments: Vec<RawSegment>,
    stacks: HashMap<RawStackId, Vec<usize>>,
    given: HashMap<RawStackId, Arc<[Frame]>>,
    dropped: u64,
    settings: AllocatorSettings,
    annotations: Vec<RawAnnotation>,
    /// With a manual clock, the Unix time its reading 0 stands for.
    manual_epoch_us: Option<i64>,
}

struct RawSegment {
    address: u64,
    stream: i64,
    small: bool,
    expandable: bool,
    stack: RawStackId,
    blocks: Vec<RawBlock>,
}

struct RawBlock {
    addr: u64,
    size: u64,
    requested: u64,
    state: BlockState,
    stack: RawStackId,
}

/// Copies what the snapshot needs, then appends the `snapshot` trace entry (spec §3.4: the
/// trace is collected first, so the entry shows in the next snapshot). With `take_trace` the
/// ring is moved out instead of copied, leaving the history empty (for an allocator that is
/// done).
pub(super) fn collect(st: &mut State, take_trace: bool) -> RawSnapshot {
    let raw = collect_quietly(st, take_trace);
    st.record_snapshot_entry();
    raw
}

/// [`collect`] without the `snapshot` entry (a live listener's state at connect is no
/// snapshot the program took).
pub(super) fn collect_quietly(st: &mut State, take_trace: bool) -> RawSnapshot {
    let trace = if take_trace {
        st.history.take_trace()
    } else {
        st.history.trace_copy()
    };
    let mut segments = Vec::new();
    for head in st.segment_heads() {
        let seg = &st.segments[st.blocks[head].segment];
        let mut current: Option<RawSegment> = None;
        for (_, b) in st.chain(head) {
            if !b.mapped {
                // Each contiguous mapped range of an expandable segment is one segment.
                segments.extend(current.take());
                continue;
            }
            let raw = current.get_or_insert_with(|| RawSegment {
                address: b.addr,
                stream: seg.stream,
                small: seg.small,
                expandable: seg.expandable,
                stack: seg.stack,
                blocks: Vec::new(),
            });
            let state = if b.allocated {
                BlockState::ActiveAllocated
            } else if b.event_count > 0 {
                BlockState::ActivePendingFree
            } else {
                BlockState::Inactive
            };
            raw.blocks.push(RawBlock {
                addr: b.addr,
                size: b.size,
                requested: b.requested,
                state,
                stack: b.stack,
            });
        }
        segments.extend(current.take());
    }
    segments.sort_by_key(|s| s.address);

    let mut stacks = HashMap::new();
    let mut given = HashMap::new();
    let referenced = trace
        .iter()
        .map(|e| e.stack)
        .chain(segments.iter().map(|s| s.stack))
        .chain(
            segments
                .iter()
                .flat_map(|s| s.blocks.iter().map(|b| b.stack)),
        );
    for id in referenced {
        if let Some(frames) = st.given_stacks.get(id) {
            given.entry(id).or_insert_with(|| frames.clone());
        } else if id != NO_STACK {
            stacks
                .entry(id)
                .or_insert_with(|| st.stacks.get(id).to_vec());
        }
    }
    let dropped = st.history.dropped();
    let settings = settings(st);
    let annotations = st.history.annotations();
    let manual_epoch_us = st.manual_epoch_us;
    RawSnapshot {
        trace,
        segments,
        stacks,
        given,
        dropped,
        settings,
        annotations,
        manual_epoch_us,
    }
}

fn settings(st: &State) -> AllocatorSettings {
    let c = &st.config;
    AllocatorSettings {
        alloc_conf: Some(c.conf_string.clone()),
        max_split_size: Some(c.max_split_size_for_snapshot().into()),
        garbage_collection_threshold: Some(c.garbage_collection_threshold),
        expandable_segments: Some(st.expandable_active),
        pinned_num_register_threads: Some(c.pinned_num_register_threads.into()),
        release_lock_on_cudamalloc: Some(c.release_lock_on_malloc),
        pinned_use_cuda_host_register: Some(c.pinned_use_host_register),
        graph_capture_record_stream_reuse: Some(c.graph_capture_record_stream_reuse),
        roundup_power2_divisions: Some(
            (0..ROUNDUP_BUCKETS)
                .map(|i| {
                    (
                        (1u64 << i).to_string(),
                        (c.roundup_power2_divisions[i] as i64).into(),
                    )
                })
                .collect(),
        ),
        max_round_threshold: None,
        max_cached_size: None,
        extra: Vec::new(),
    }
}

/// Symbolises each raw stack once and interns it in the snapshot.
struct StackResolver {
    raw: HashMap<RawStackId, Vec<usize>>,
    given: HashMap<RawStackId, Arc<[Frame]>>,
    done: HashMap<RawStackId, StackId>,
    empty: StackId,
    /// The last stack resolved: neighbouring entries often share it (a free's two entries).
    last: Option<(RawStackId, StackId)>,
}

impl StackResolver {
    fn get(&mut self, snap: &mut Snapshot, id: RawStackId) -> Option<StackId> {
        if id == NO_STACK {
            return None;
        }
        if let Some((last, s)) = self.last {
            if last == id {
                return Some(s);
            }
        }
        if let Some(&s) = self.done.get(&id) {
            self.last = Some((id, s));
            return Some(s);
        }
        let frames = match self.given.get(&id) {
            Some(frames) => frames.to_vec(),
            None => self
                .raw
                .get(&id)
                .map(|ips| symbolize(ips))
                .unwrap_or_default(),
        };
        let s = snap.intern_stack(frames);
        self.done.insert(id, s);
        Some(s)
    }

    fn get_or_empty(&mut self, snap: &mut Snapshot, id: RawStackId) -> StackId {
        self.get(snap, id).unwrap_or(self.empty)
    }
}

pub(super) fn build(raw: RawSnapshot, device_index: i64) -> Snapshot {
    let device_slots = usize::try_from(device_index).unwrap_or(0) + 1;
    let mut snap = Snapshot::new(device_slots);
    let empty = snap.intern_stack(std::iter::empty());
    let epoch_us = |time_ns: u64| match raw.manual_epoch_us {
        Some(start) => start.saturating_add((time_ns / 1000) as i64),
        None => crate::history::epoch_micros(time_ns),
    };
    let mut stacks = StackResolver {
        raw: raw.stacks,
        given: raw.given,
        done: HashMap::new(),
        empty,
        last: None,
    };

    for rs in raw.segments {
        let total: u64 = rs.blocks.iter().map(|b| b.size).sum();
        let mut seg = Segment::new(device_index, rs.address, total, rs.stream);
        seg.segment_type = Some(if rs.small {
            SegmentType::Small
        } else {
            SegmentType::Large
        });
        seg.is_expandable = Some(rs.expandable);
        let (mut allocated, mut active, mut requested) = (0, 0, 0);
        for b in &rs.blocks {
            if b.state == BlockState::ActiveAllocated {
                allocated += b.size;
            }
            if b.state.is_active() {
                active += b.size;
                requested += b.requested;
            }
            let frames = stacks.get_or_empty(&mut snap, b.stack);
            seg.blocks.push(Block {
                address: Some(b.addr),
                size: b.size,
                requested_size: Some(b.requested),
                state: b.state,
                frames: Some(frames),
                forward_frames: None,
                history: None,
                extra: Vec::new(),
                exact: Default::default(),
            });
        }
        seg.allocated_size = Some(allocated);
        seg.active_size = Some(active);
        seg.requested_size = Some(requested);
        let frames = stacks.get_or_empty(&mut snap, rs.stack);
        // PyTorch writes a non-empty segment `frames` after `blocks`.
        seg.frames_after_blocks = !snap.stacks.get(frames).is_empty();
        seg.frames = Some(frames);
        snap.segments.push(seg);
    }

    let na = snap.strings.intern("N/A");
    let no_metadata = snap.strings.intern("");
    let mut trace = Vec::with_capacity(raw.trace.len());
    for e in raw.trace.iter() {
        let mut entry = TraceEntry::new(e.action, e.addr, e.size, e.stream);
        entry.set_time_us(Some(epoch_us(e.time_ns)));
        entry.set_compile_context(Some(na), &snap.strings);
        entry.set_user_metadata(Some(no_metadata), &snap.strings);
        entry.frames = stacks.get(&mut snap, e.stack);
        if e.action == Action::Oom {
            entry.addr = 0;
            let rare = entry.rare_mut();
            rare.device_free = Some(e.addr);
            rare.no_addr = true;
        }
        trace.push(entry);
    }
    if let Some(traces) = snap.device_traces.as_mut() {
        if let Some(slot) = traces.get_mut(device_slots - 1) {
            *slot = trace;
        }
    }
    snap.allocator_settings = Some(raw.settings);
    snap.external_annotations = Some(
        raw.annotations
            .iter()
            .map(|a| {
                Annotation::new(
                    a.metadata
                        .iter()
                        .map(|(k, v)| (k.clone(), Value::Str(v.clone())))
                        .collect(),
                    device_index,
                    epoch_us(a.time_ns),
                )
            })
            .collect(),
    );
    let mut dropped_entries = vec![0; device_slots];
    dropped_entries[device_slots - 1] = raw.dropped;
    snap.recorder_info = Some(RecorderInfo {
        producer: concat!("memsnap-recorder ", env!("CARGO_PKG_VERSION")).to_owned(),
        dropped_entries,
        extra: Vec::new(),
        dropped_entries_exact: None,
    });
    snap
}
