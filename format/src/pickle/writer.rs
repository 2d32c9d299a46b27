//! The pickle writer: protocol 4 with framing, following the CPython C pickler's encoding
//! rules (spec §4.2) and PyTorch's key orders (spec §1), with more memo sharing than PyTorch:
//! every string is written once and referenced after, each stack once as a list and each
//! frame once as a dict. So the output is never larger than `_dump_snapshot`'s.

use std::collections::HashMap;

use crate::int::{ExactInts, IntField, PyInt};
use crate::intern::{FrameId, StackId, StrId};
use crate::model::*;
use crate::value::{Extras, Value};

use super::vm::op;

/// A frame is closed at the first opcode boundary once it holds this many bytes.
pub(crate) const FRAME_TARGET: usize = 64 * 1024;
/// Items per `MARK ... APPENDS` / `MARK ... SETITEMS` batch.
pub(crate) const BATCH: usize = 1000;
const FRAME_HEADER: usize = 9;
const NO_MEMO: u32 = u32::MAX;

macro_rules! static_strs {
    ($($id:ident = $s:literal,)*) => {
        /// Strings the writer knows in advance (dict keys and enumerated values), memoized
        /// through an array instead of a hash map.
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy)]
        enum S { $($id,)* }
        const STATIC_STRS: &[&str] = &[$($s,)*];
    };
}

static_strs! {
    segments = "segments",
    device_traces = "device_traces",
    allocator_settings = "allocator_settings",
    external_annotations = "external_annotations",
    host_segments = "host_segments",
    host_traces = "host_traces",
    memsnap = "memsnap",
    producer = "producer",
    dropped_entries = "dropped_entries",
    device = "device",
    address = "address",
    total_size = "total_size",
    allocated_size = "allocated_size",
    active_size = "active_size",
    requested_size = "requested_size",
    stream = "stream",
    segment_type = "segment_type",
    segment_pool_id = "segment_pool_id",
    is_expandable = "is_expandable",
    frames = "frames",
    blocks = "blocks",
    size = "size",
    state = "state",
    forward_frames = "forward_frames",
    history = "history",
    addr = "addr",
    real_size = "real_size",
    action = "action",
    device_free = "device_free",
    time_us = "time_us",
    compile_context = "compile_context",
    user_metadata = "user_metadata",
    internal_metadata = "internal_metadata",
    name = "name",
    filename = "filename",
    line = "line",
    alloc_conf = "PYTORCH_CUDA_ALLOC_CONF",
    max_split_size = "max_split_size",
    garbage_collection_threshold = "garbage_collection_threshold",
    expandable_segments = "expandable_segments",
    pinned_num_register_threads = "pinned_num_register_threads",
    release_lock_on_cudamalloc = "release_lock_on_cudamalloc",
    pinned_use_cuda_host_register = "pinned_use_cuda_host_register",
    graph_capture_record_stream_reuse = "graph_capture_record_stream_reuse",
    roundup_power2_divisions = "roundup_power2_divisions",
    max_round_threshold = "max_round_threshold",
    max_cached_size = "max_cached_size",
    a_alloc = "alloc",
    a_free_requested = "free_requested",
    a_free_completed = "free_completed",
    a_segment_alloc = "segment_alloc",
    a_segment_free = "segment_free",
    a_segment_map = "segment_map",
    a_segment_unmap = "segment_unmap",
    a_snapshot = "snapshot",
    a_oom = "oom",
    a_annotate = "annotate",
    a_free = "free",
    large = "large",
    small = "small",
    active_allocated = "active_allocated",
    active_pending_free = "active_pending_free",
    inactive = "inactive",
    cpp_frames = "cpp_frames",
}

/// Encodes a snapshot as a protocol-4 pickle.
pub(crate) fn to_vec(snapshot: &Snapshot) -> Vec<u8> {
    let mut w = Writer {
        snap: snapshot,
        out: Vec::with_capacity(64 * 1024 + 32 * snapshot.entry_count()),
        frame_start: 0,
        memo_next: 0,
        statics: vec![NO_MEMO; STATIC_STRS.len()],
        str_ids: vec![NO_MEMO; snapshot.strings.len()],
        stack_ids: vec![NO_MEMO; snapshot.stacks.len()],
        frame_ids: vec![NO_MEMO; snapshot.frames.len()],
        dyn_strs: HashMap::new(),
    };
    w.out.extend_from_slice(&[op::PROTO, 4]);
    w.start_frame();
    w.snapshot();
    w.out.push(op::STOP);
    w.commit_frame();
    w.out
}

pub(crate) struct Writer<'s> {
    snap: &'s Snapshot,
    pub(crate) out: Vec<u8>,
    /// Offset of the open frame's header.
    frame_start: usize,
    memo_next: u32,
    statics: Vec<u32>,
    str_ids: Vec<u32>,
    stack_ids: Vec<u32>,
    frame_ids: Vec<u32>,
    dyn_strs: HashMap<&'s str, u32>,
}

impl<'s> Writer<'s> {
    // ---------------------------------------------------------------- framing

    fn start_frame(&mut self) {
        self.frame_start = self.out.len();
        self.out
            .extend_from_slice(&[op::FRAME, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    /// Writes the open frame's length, or drops its header when it holds under 4 bytes
    /// (as CPython does).
    fn commit_frame(&mut self) {
        let body = self.out.len() - self.frame_start - FRAME_HEADER;
        if body >= 4 {
            let len = (body as u64).to_le_bytes();
            self.out[self.frame_start + 1..self.frame_start + FRAME_HEADER].copy_from_slice(&len);
        } else {
            self.out
                .drain(self.frame_start..self.frame_start + FRAME_HEADER);
        }
    }

    /// An opcode boundary: start a new frame once the open one is full.
    #[inline]
    fn boundary(&mut self) {
        if self.out.len() - self.frame_start - FRAME_HEADER >= FRAME_TARGET {
            self.commit_frame();
            self.start_frame();
        }
    }

    // ---------------------------------------------------------------- scalars

    #[inline]
    fn memoize(&mut self) -> u32 {
        self.out.push(op::MEMOIZE);
        let idx = self.memo_next;
        self.memo_next += 1;
        idx
    }

    #[inline]
    fn get(&mut self, idx: u32) {
        if idx < 256 {
            self.out.extend_from_slice(&[op::BINGET, idx as u8]);
        } else {
            self.out.push(op::LONG_BINGET);
            self.out.extend_from_slice(&idx.to_le_bytes());
        }
    }

    #[inline]
    fn int(&mut self, v: i64) {
        if (0..=0xff).contains(&v) {
            self.out.extend_from_slice(&[op::BININT1, v as u8]);
        } else if (0..=0xffff).contains(&v) {
            self.out.push(op::BININT2);
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if i32::try_from(v).is_ok() {
            self.out.push(op::BININT);
            self.out.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            self.long1(v.into());
        }
    }

    #[inline]
    fn uint(&mut self, v: u64) {
        match i64::try_from(v) {
            Ok(i) => self.int(i),
            Err(_) => self.long1(v.into()),
        }
    }

    /// Any int, as CPython writes it (`LONG1`, or `LONG4` past 255 bytes).
    fn pyint(&mut self, v: &PyInt) {
        match v {
            PyInt::Small(i) => self.int(*i),
            PyInt::Big(bytes) => self.long_bytes(bytes),
        }
    }

    /// `LONG1` (or `LONG4`) with these little-endian two's-complement bytes.
    fn long_bytes(&mut self, bytes: &[u8]) {
        if let Ok(n) = u8::try_from(bytes.len()) {
            self.out.extend_from_slice(&[op::LONG1, n]);
        } else {
            self.out.push(op::LONG4);
            self.out
                .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        }
        self.out.extend_from_slice(bytes);
    }

    /// An unsigned typed field: its exact value when `exact` has a current one.
    #[inline]
    fn uint_x(&mut self, exact: Option<&'s ExactInts>, field: IntField, v: u64) {
        match exact.and_then(|x| x.current(field, v)) {
            Some(x) => self.pyint(x),
            None => self.uint(v),
        }
    }

    /// A signed typed field: its exact value when `exact` has a current one.
    #[inline]
    fn int_x(&mut self, exact: Option<&'s ExactInts>, field: IntField, v: i64) {
        match exact.and_then(|x| x.current(field, v as u64)) {
            Some(x) => self.pyint(x),
            None => self.int(v),
        }
    }

    /// `LONG1` with the minimal little-endian two's-complement bytes.
    fn long1(&mut self, v: i128) {
        let bytes = v.to_le_bytes();
        let mut n = bytes.len();
        while n > 1 {
            let (top, below) = (bytes[n - 1], bytes[n - 2] & 0x80);
            if (top == 0 && below == 0) || (top == 0xff && below != 0) {
                n -= 1;
            } else {
                break;
            }
        }
        if v == 0 {
            n = 0;
        }
        self.out.extend_from_slice(&[op::LONG1, n as u8]);
        self.out.extend_from_slice(&bytes[..n]);
    }

    fn bool(&mut self, b: bool) {
        self.out.push(if b { op::NEWTRUE } else { op::NEWFALSE });
    }

    fn float(&mut self, f: f64) {
        self.out.push(op::BINFLOAT);
        self.out.extend_from_slice(&f.to_be_bytes());
    }

    /// A string written in full and memoized; returns its memo index.
    fn str_fresh(&mut self, s: &str) -> u32 {
        let b = s.as_bytes();
        if b.len() < 256 {
            self.out
                .extend_from_slice(&[op::SHORT_BINUNICODE, b.len() as u8]);
            self.out.extend_from_slice(b);
        } else if b.len() < FRAME_TARGET {
            self.out.push(op::BINUNICODE);
            self.out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            self.out.extend_from_slice(b);
        } else {
            // Large payloads go between frames (CPython's rule), so readers can pass them
            // through without buffering a frame.
            self.commit_frame();
            if let Ok(len) = u32::try_from(b.len()) {
                self.out.push(op::BINUNICODE);
                self.out.extend_from_slice(&len.to_le_bytes());
            } else {
                self.out.push(op::BINUNICODE8);
                self.out.extend_from_slice(&(b.len() as u64).to_le_bytes());
            }
            self.out.extend_from_slice(b);
            self.start_frame();
        }
        self.memoize()
    }

    /// A memo reference, unless writing a short string again is smaller than `LONG_BINGET`.
    #[inline]
    fn str_ref(&mut self, idx: u32, s: &str) {
        if idx >= 256 && s.len() <= 2 {
            self.out
                .extend_from_slice(&[op::SHORT_BINUNICODE, s.len() as u8]);
            self.out.extend_from_slice(s.as_bytes());
        } else {
            self.get(idx);
        }
    }

    #[inline]
    fn s(&mut self, key: S) {
        let idx = self.statics[key as usize];
        let text = STATIC_STRS[key as usize];
        if idx == NO_MEMO {
            self.statics[key as usize] = self.str_fresh(text);
        } else {
            self.str_ref(idx, text);
        }
    }

    fn str_id(&mut self, id: StrId) {
        let snap = self.snap;
        let text = snap.strings.get(id);
        let idx = self.str_ids[id.0 as usize];
        if idx == NO_MEMO {
            self.str_ids[id.0 as usize] = self.str_fresh(text);
        } else {
            self.str_ref(idx, text);
        }
    }

    /// Any other string, memoized by value.
    fn str(&mut self, s: &'s str) {
        match self.dyn_strs.get(s) {
            Some(&idx) => self.str_ref(idx, s),
            None => {
                let idx = self.str_fresh(s);
                self.dyn_strs.insert(s, idx);
            }
        }
    }

    // ---------------------------------------------------------------- containers

    /// `EMPTY_DICT MEMOIZE` and, for two or more pairs, `MARK`.
    fn dict_begin(&mut self, pairs: usize) {
        self.out.push(op::EMPTY_DICT);
        self.memoize();
        if pairs >= 2 {
            self.out.push(op::MARK);
        }
    }

    fn dict_end(&mut self, pairs: usize) {
        match pairs {
            0 => {}
            1 => self.out.push(op::SETITEM),
            _ => self.out.push(op::SETITEMS),
        }
        self.boundary();
    }

    /// A list in CPython's batches: one item with `APPEND`, more in `MARK ... APPENDS`
    /// batches of at most 1000 (a final batch of one included).
    fn list<T>(&mut self, items: &'s [T], mut item: impl FnMut(&mut Self, &'s T)) -> u32 {
        self.out.push(op::EMPTY_LIST);
        let idx = self.memoize();
        match items {
            [] => {}
            [one] => {
                item(self, one);
                self.out.push(op::APPEND);
            }
            _ => {
                for batch in items.chunks(BATCH) {
                    self.out.push(op::MARK);
                    for x in batch {
                        item(self, x);
                        self.boundary();
                    }
                    self.out.push(op::APPENDS);
                }
            }
        }
        self.boundary();
        idx
    }

    fn extras(&mut self, extra: &'s Extras) {
        for (k, v) in extra {
            self.str(k);
            self.value(v);
        }
    }

    pub(crate) fn value(&mut self, v: &'s Value) {
        match v {
            Value::None => self.out.push(op::NONE),
            Value::Bool(b) => self.bool(*b),
            Value::Int(i) => self.int(*i),
            Value::BigInt(bytes) => self.long_bytes(bytes),
            Value::Float(f) => self.float(*f),
            Value::Str(s) => self.str(s),
            Value::Bytes(b) => {
                if let Ok(n) = u8::try_from(b.len()) {
                    self.out.extend_from_slice(&[op::SHORT_BINBYTES, n]);
                } else {
                    self.out.push(op::BINBYTES);
                    self.out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                }
                self.out.extend_from_slice(b);
                self.memoize();
            }
            Value::List(items) => {
                self.list(items, |w, x| w.value(x));
            }
            Value::Tuple(items) => {
                match items.len() {
                    0 => self.out.push(op::EMPTY_TUPLE),
                    n @ 1..=3 => {
                        for x in items {
                            self.value(x);
                        }
                        self.out.push([op::TUPLE1, op::TUPLE2, op::TUPLE3][n - 1]);
                    }
                    _ => {
                        self.out.push(op::MARK);
                        for x in items {
                            self.value(x);
                            self.boundary();
                        }
                        self.out.push(op::TUPLE);
                    }
                }
                self.memoize();
            }
            Value::Dict(pairs) => {
                self.out.push(op::EMPTY_DICT);
                self.memoize();
                match &pairs[..] {
                    [] => {}
                    [(k, v)] => {
                        self.value(k);
                        self.value(v);
                        self.out.push(op::SETITEM);
                    }
                    _ => {
                        for batch in pairs.chunks(BATCH) {
                            self.out.push(op::MARK);
                            for (k, v) in batch {
                                self.value(k);
                                self.value(v);
                                self.boundary();
                            }
                            self.out.push(op::SETITEMS);
                        }
                    }
                }
            }
        }
        self.boundary();
    }

    // ---------------------------------------------------------------- stacks

    fn stack(&mut self, id: StackId) {
        let idx = self.stack_ids[id.0 as usize];
        if idx != NO_MEMO {
            self.get(idx);
            return;
        }
        let snap = self.snap;
        let idx = self.list(snap.stacks.get(id), |w, f| w.frame(*f));
        self.stack_ids[id.0 as usize] = idx;
    }

    fn frame(&mut self, id: FrameId) {
        let idx = self.frame_ids[id.0 as usize];
        if idx != NO_MEMO {
            self.get(idx);
            return;
        }
        let snap = self.snap;
        let f = snap.frames.get(id);
        let pairs = 3 + f.extra.len();
        self.dict_begin(pairs);
        self.frame_ids[id.0 as usize] = self.memo_next - 1;
        self.s(S::name);
        self.str(&f.name);
        self.s(S::filename);
        self.str(&f.filename);
        self.s(S::line);
        self.pyint(&f.line);
        self.extras(&f.extra);
        self.dict_end(pairs);
    }

    fn string_list(&mut self, items: &'s [String]) {
        self.list(items, |w, s| w.str(s));
    }

    // ---------------------------------------------------------------- snapshot

    fn snapshot(&mut self) {
        let snap = self.snap;
        if snap.shape == Shape::SegmentList {
            self.list(&snap.segments, |w, s| w.segment(s));
            return;
        }
        let pairs = 1
            + usize::from(snap.device_traces.is_some())
            + usize::from(snap.allocator_settings.is_some())
            + usize::from(snap.external_annotations.is_some())
            + usize::from(snap.host_segments.is_some())
            + usize::from(snap.host_traces.is_some())
            + snap.extra.len()
            + usize::from(snap.recorder_info.is_some());
        self.dict_begin(pairs);
        self.s(S::segments);
        self.list(&snap.segments, |w, s| w.segment(s));
        if let Some(traces) = &snap.device_traces {
            self.s(S::device_traces);
            self.list(traces, |w, t| {
                w.list(t, |w, e| w.entry(e));
            });
        }
        if let Some(s) = &snap.allocator_settings {
            self.s(S::allocator_settings);
            self.settings(s);
        }
        if let Some(a) = &snap.external_annotations {
            self.s(S::external_annotations);
            self.list(a, |w, a| w.annotation(a));
        }
        if let Some(h) = &snap.host_segments {
            self.s(S::host_segments);
            self.value(h);
        }
        if let Some(h) = &snap.host_traces {
            self.s(S::host_traces);
            self.value(h);
        }
        self.extras(&snap.extra);
        if let Some(info) = &snap.recorder_info {
            self.s(S::memsnap);
            let pairs = 2 + info.extra.len();
            self.dict_begin(pairs);
            self.s(S::producer);
            self.str(&info.producer);
            self.s(S::dropped_entries);
            match info.current_dropped_entries_exact() {
                Some(exact) => self.list(exact, |w, n| w.pyint(n)),
                None => self.list(&info.dropped_entries, |w, n| w.uint(*n)),
            };
            self.extras(&info.extra);
            self.dict_end(pairs);
        }
        self.dict_end(pairs);
    }

    fn segment(&mut self, seg: &'s Segment) {
        let pairs = 5
            + usize::from(seg.allocated_size.is_some())
            + usize::from(seg.active_size.is_some())
            + usize::from(seg.requested_size.is_some())
            + usize::from(seg.segment_type.is_some())
            + usize::from(seg.segment_pool_id.is_some())
            + usize::from(seg.is_expandable.is_some())
            + usize::from(seg.frames.is_some())
            + seg.extra.len();
        self.dict_begin(pairs);
        let x = Some(&seg.exact);
        self.s(S::device);
        self.int_x(x, IntField::Device, seg.device);
        self.s(S::address);
        self.uint_x(x, IntField::Address, seg.address);
        self.s(S::total_size);
        self.uint_x(x, IntField::TotalSize, seg.total_size);
        if let Some(v) = seg.allocated_size {
            self.s(S::allocated_size);
            self.uint_x(x, IntField::AllocatedSize, v);
        }
        if let Some(v) = seg.active_size {
            self.s(S::active_size);
            self.uint_x(x, IntField::ActiveSize, v);
        }
        if let Some(v) = seg.requested_size {
            self.s(S::requested_size);
            self.uint_x(x, IntField::RequestedSize, v);
        }
        self.s(S::stream);
        self.int_x(x, IntField::Stream, seg.stream);
        if let Some(t) = seg.segment_type {
            self.s(S::segment_type);
            match t {
                SegmentType::Large => self.s(S::large),
                SegmentType::Small => self.s(S::small),
                SegmentType::Other(id) => self.str_id(id),
            }
        }
        if let Some((a, b)) = seg.segment_pool_id {
            self.s(S::segment_pool_id);
            self.int_x(x, IntField::PoolId0, a);
            self.int_x(x, IntField::PoolId1, b);
            self.out.push(op::TUPLE2);
            self.memoize();
        }
        if let Some(v) = seg.is_expandable {
            self.s(S::is_expandable);
            self.bool(v);
        }
        let frames = seg.frames.filter(|_| !seg.frames_after_blocks);
        if let Some(f) = frames {
            self.s(S::frames);
            self.stack(f);
        }
        self.s(S::blocks);
        self.list(&seg.blocks, |w, b| w.block(b));
        if let Some(f) = seg.frames.filter(|_| seg.frames_after_blocks) {
            self.s(S::frames);
            self.stack(f);
        }
        self.extras(&seg.extra);
        self.dict_end(pairs);
    }

    fn block(&mut self, b: &'s Block) {
        let pairs = 2
            + usize::from(b.address.is_some())
            + usize::from(b.requested_size.is_some())
            + usize::from(b.frames.is_some())
            + usize::from(b.forward_frames.is_some())
            + usize::from(b.history.is_some())
            + b.extra.len();
        self.dict_begin(pairs);
        let x = Some(&b.exact);
        if let Some(a) = b.address {
            self.s(S::address);
            self.uint_x(x, IntField::Address, a);
        }
        self.s(S::size);
        self.uint_x(x, IntField::Size, b.size);
        if let Some(r) = b.requested_size {
            self.s(S::requested_size);
            self.uint_x(x, IntField::RequestedSize, r);
        }
        self.s(S::state);
        match b.state {
            BlockState::ActiveAllocated => self.s(S::active_allocated),
            BlockState::ActivePendingFree => self.s(S::active_pending_free),
            BlockState::Inactive => self.s(S::inactive),
            BlockState::Other(id) => self.str_id(id),
        }
        if let Some(f) = b.frames {
            self.s(S::frames);
            self.stack(f);
        }
        if let Some(ff) = &b.forward_frames {
            self.s(S::forward_frames);
            self.string_list(ff);
        }
        if let Some(h) = &b.history {
            self.s(S::history);
            self.list(h, |w, item| {
                let pairs = 2 + usize::from(item.frames.is_some()) + item.extra.len();
                w.dict_begin(pairs);
                let x = Some(&item.exact);
                w.s(S::addr);
                w.uint_x(x, IntField::Addr, item.addr);
                w.s(S::real_size);
                w.uint_x(x, IntField::RealSize, item.real_size);
                if let Some(f) = item.frames {
                    w.s(S::frames);
                    w.stack(f);
                }
                w.extras(&item.extra);
                w.dict_end(pairs);
            });
        }
        self.extras(&b.extra);
        self.dict_end(pairs);
    }

    fn action(&mut self, a: Action) {
        let key = match a {
            Action::Alloc => S::a_alloc,
            Action::FreeRequested => S::a_free_requested,
            Action::FreeCompleted => S::a_free_completed,
            Action::SegmentAlloc => S::a_segment_alloc,
            Action::SegmentFree => S::a_segment_free,
            Action::SegmentMap => S::a_segment_map,
            Action::SegmentUnmap => S::a_segment_unmap,
            Action::Snapshot => S::a_snapshot,
            Action::Oom => S::a_oom,
            Action::Annotate => S::a_annotate,
            Action::Free => S::a_free,
            Action::Other(id) => return self.str_id(id),
        };
        self.s(key);
    }

    fn entry(&mut self, e: &'s TraceEntry) {
        let rare = e.rare.as_deref();
        let legacy = rare.is_some_and(|r| r.legacy_frames_first);
        let extra: &'s [(String, Value)] = rare.map_or(&[], |r| &r.extra[..]);
        let pairs = 3
            + usize::from(e.has_addr())
            + usize::from(e.device_free().is_some())
            + usize::from(e.time_us.is_some())
            + usize::from(e.compile_context.is_some())
            + usize::from(e.user_metadata.is_some())
            + usize::from(e.frames.is_some())
            + rare.map_or(0, |r| {
                usize::from(r.internal_metadata.is_some())
                    + usize::from(r.forward_frames.is_some())
                    + r.extra.len()
            });
        self.dict_begin(pairs);
        // Legacy (<= 2.0) entries start with `frames` and `cpp_frames`.
        let is_cpp = |(k, _): &&(String, Value)| k == "cpp_frames";
        if legacy {
            if let Some(f) = e.frames {
                self.s(S::frames);
                self.stack(f);
            }
            for (_, v) in extra.iter().filter(is_cpp) {
                self.s(S::cpp_frames);
                self.value(v);
            }
        }
        self.s(S::action);
        self.action(e.action);
        let x = rare.map(|r| &r.exact);
        if e.has_addr() {
            self.s(S::addr);
            self.uint_x(x, IntField::Addr, e.addr);
        }
        if let Some(f) = e.device_free() {
            self.s(S::device_free);
            self.uint_x(x, IntField::DeviceFree, f);
        }
        self.s(S::size);
        self.uint_x(x, IntField::Size, e.size);
        self.s(S::stream);
        self.int_x(x, IntField::Stream, e.stream);
        if let Some(t) = e.time_us {
            self.s(S::time_us);
            self.int_x(x, IntField::TimeUs, t);
        }
        if let Some(c) = e.compile_context {
            self.s(S::compile_context);
            self.str_id(c);
        }
        if let Some(u) = e.user_metadata {
            self.s(S::user_metadata);
            self.str_id(u);
        }
        if let Some(m) = rare.and_then(|r| r.internal_metadata) {
            self.s(S::internal_metadata);
            self.str_id(m);
        }
        if !legacy {
            if let Some(f) = e.frames {
                self.s(S::frames);
                self.stack(f);
            }
        }
        if let Some(ff) = rare.and_then(|r| r.forward_frames.as_ref()) {
            self.s(S::forward_frames);
            self.string_list(ff);
        }
        for (k, v) in extra {
            if legacy && k == "cpp_frames" {
                continue;
            }
            self.str(k);
            self.value(v);
        }
        self.dict_end(pairs);
    }

    fn settings(&mut self, s: &'s AllocatorSettings) {
        let pairs = usize::from(s.alloc_conf.is_some())
            + usize::from(s.max_split_size.is_some())
            + usize::from(s.garbage_collection_threshold.is_some())
            + usize::from(s.expandable_segments.is_some())
            + usize::from(s.pinned_num_register_threads.is_some())
            + usize::from(s.release_lock_on_cudamalloc.is_some())
            + usize::from(s.pinned_use_cuda_host_register.is_some())
            + usize::from(s.graph_capture_record_stream_reuse.is_some())
            + usize::from(s.roundup_power2_divisions.is_some())
            + usize::from(s.max_round_threshold.is_some())
            + usize::from(s.max_cached_size.is_some())
            + s.extra.len();
        self.dict_begin(pairs);
        if let Some(v) = &s.alloc_conf {
            self.s(S::alloc_conf);
            self.str(v);
        }
        if let Some(v) = &s.max_split_size {
            self.s(S::max_split_size);
            self.pyint(v);
        }
        if let Some(v) = s.garbage_collection_threshold {
            self.s(S::garbage_collection_threshold);
            self.float(v);
        }
        let flags = [
            (S::expandable_segments, s.expandable_segments),
            (S::release_lock_on_cudamalloc, s.release_lock_on_cudamalloc),
            (
                S::pinned_use_cuda_host_register,
                s.pinned_use_cuda_host_register,
            ),
            (
                S::graph_capture_record_stream_reuse,
                s.graph_capture_record_stream_reuse,
            ),
        ];
        let [expandable, release_lock, host_register, stream_reuse] = flags;
        self.flag(expandable);
        if let Some(v) = &s.pinned_num_register_threads {
            self.s(S::pinned_num_register_threads);
            self.pyint(v);
        }
        self.flag(release_lock);
        self.flag(host_register);
        self.flag(stream_reuse);
        if let Some(d) = &s.roundup_power2_divisions {
            self.s(S::roundup_power2_divisions);
            self.out.push(op::EMPTY_DICT);
            self.memoize();
            match &d[..] {
                [] => {}
                [(k, v)] => {
                    self.str(k);
                    self.pyint(v);
                    self.out.push(op::SETITEM);
                }
                _ => {
                    for batch in d.chunks(BATCH) {
                        self.out.push(op::MARK);
                        for (k, v) in batch {
                            self.str(k);
                            self.pyint(v);
                        }
                        self.out.push(op::SETITEMS);
                    }
                }
            }
            self.boundary();
        }
        if let Some(v) = &s.max_round_threshold {
            self.s(S::max_round_threshold);
            self.pyint(v);
        }
        if let Some(v) = &s.max_cached_size {
            self.s(S::max_cached_size);
            self.pyint(v);
        }
        self.extras(&s.extra);
        self.dict_end(pairs);
    }

    fn flag(&mut self, (key, value): (S, Option<bool>)) {
        if let Some(b) = value {
            self.s(key);
            self.bool(b);
        }
    }

    fn annotation(&mut self, a: &'s Annotation) {
        let pairs = a.metadata.len() + 2 + a.extra.len();
        self.dict_begin(pairs);
        self.extras(&a.metadata);
        let x = Some(&a.exact);
        self.s(S::device);
        self.int_x(x, IntField::Device, a.device);
        self.s(S::time_us);
        self.int_x(x, IntField::TimeUs, a.time_us);
        self.extras(&a.extra);
        self.dict_end(pairs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intern::Frame;

    fn encode<'s>(f: impl FnOnce(&mut Writer<'s>)) -> Vec<u8> {
        // Leaked so that values borrowed by the writer may live shorter than the snapshot.
        let snap: &'s Snapshot = Box::leak(Box::default());
        let mut w = Writer {
            snap,
            out: Vec::new(),
            frame_start: 0,
            memo_next: 0,
            statics: vec![NO_MEMO; STATIC_STRS.len()],
            str_ids: Vec::new(),
            stack_ids: Vec::new(),
            frame_ids: Vec::new(),
            dyn_strs: HashMap::new(),
        };
        w.start_frame();
        f(&mut w);
        w.out.split_off(FRAME_HEADER)
    }

    #[test]
    fn ints_use_the_smallest_cpython_opcode() {
        let cases: &[(i64, &[u8])] = &[
            (0, &[b'K', 0]),
            (255, &[b'K', 255]),
            (256, &[b'M', 0, 1]),
            (65535, &[b'M', 0xff, 0xff]),
            (65536, &[b'J', 0, 0, 1, 0]),
            (-1, &[b'J', 0xff, 0xff, 0xff, 0xff]),
            (i32::MIN as i64, &[b'J', 0, 0, 0, 0x80]),
            (1 << 31, &[0x8a, 5, 0, 0, 0, 0x80, 0]),
            (
                0x7fe9_c3b0_8000,
                &[0x8a, 6, 0, 0x80, 0xb0, 0xc3, 0xe9, 0x7f],
            ),
            (-(1 << 31) - 1, &[0x8a, 5, 0xff, 0xff, 0xff, 0x7f, 0xff]),
            (i64::MIN, &[0x8a, 8, 0, 0, 0, 0, 0, 0, 0, 0x80]),
        ];
        for &(v, expected) in cases {
            assert_eq!(encode(|w| w.int(v)), expected, "{v}");
        }
        assert_eq!(
            encode(|w| w.uint(1 << 63)),
            [0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0x80, 0]
        );
        assert_eq!(
            encode(|w| w.uint(u64::MAX)),
            [0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]
        );
    }

    #[test]
    fn lists_are_batched_by_1000_like_the_c_pickler() {
        let list = |n: usize| Value::List(vec![Value::Int(7); n]);
        let one = list(1);
        assert_eq!(encode(|w| w.value(&one)), [b']', 0x94, b'K', 7, b'a']);
        let two = list(2);
        assert_eq!(
            encode(|w| w.value(&two)),
            [b']', 0x94, b'(', b'K', 7, b'K', 7, b'e']
        );
        // 1001 items: a full batch, then a batch of one that still uses MARK ... APPENDS.
        let big = list(1001);
        let out = encode(|w| w.value(&big));
        let mut expected = vec![b']', 0x94, b'('];
        expected.extend([b'K', 7].repeat(1000));
        expected.extend([b'e', b'(', b'K', 7, b'e']);
        assert_eq!(out, expected);
        let dict = Value::Dict(vec![(Value::None, Value::None); 2500]);
        let out = encode(|w| w.value(&dict));
        assert_eq!(out.iter().filter(|&&b| b == b'u').count(), 3);
        assert_eq!(out.iter().filter(|&&b| b == b'(').count(), 3);
    }

    #[test]
    fn strings_are_written_once_then_referenced() {
        let out = encode(|w| {
            w.str("abc");
            w.str("abc");
        });
        assert_eq!(out, [0x8c, 3, b'a', b'b', b'c', 0x94, b'h', 0]);
        let long = "x".repeat(300);
        let out = encode(|w| w.str(&long));
        assert_eq!(&out[..5], &[b'X', 44, 1, 0, 0]);
    }

    /// Walks the top-level framing: every frame but the last holds at least 64 KiB, and
    /// anything between frames is a string of at least 64 KiB.
    fn frames_of(out: &[u8]) -> Vec<usize> {
        assert_eq!(&out[..2], &[op::PROTO, 4]);
        let mut pos = 2;
        let mut frames = Vec::new();
        while pos < out.len() {
            match out[pos] {
                op::FRAME => {
                    let len = u64::from_le_bytes(out[pos + 1..pos + 9].try_into().unwrap());
                    frames.push(len as usize);
                    pos += 9 + len as usize;
                }
                op::BINUNICODE => {
                    let len = u32::from_le_bytes(out[pos + 1..pos + 5].try_into().unwrap());
                    assert!(len as usize >= FRAME_TARGET, "short unframed string");
                    pos += 5 + len as usize;
                }
                // CPython leaves a last frame of under 4 bytes without a header.
                other => {
                    assert!(
                        out.len() - pos < 4,
                        "unframed opcode 0x{other:02x} at {pos}"
                    );
                    break;
                }
            }
        }
        frames
    }

    fn big_snapshot(entries: usize) -> Snapshot {
        let mut snap = Snapshot::new(1);
        let stack = snap.intern_stack([
            Frame::new("forward", "/home/user/model.py", 54),
            Frame::new("<module>", "/home/user/train.py", 10),
        ]);
        let na = snap.strings.intern("N/A");
        let trace: Vec<TraceEntry> = (0..entries as u64)
            .map(|i| {
                let mut e = TraceEntry::new(Action::Alloc, 0x7f00_0000_0000 + i * 512, 512, 0);
                e.time_us = Some(1_700_000_000_000_000 + i as i64);
                e.compile_context = Some(na);
                e.frames = Some(stack);
                e
            })
            .collect();
        snap.device_traces = Some(vec![trace]);
        snap
    }

    #[test]
    fn frames_close_at_the_first_boundary_after_64_kib() {
        let out = to_vec(&big_snapshot(20_000));
        let frames = frames_of(&out);
        assert!(frames.len() > 3);
        let (last, full) = frames.split_last().unwrap();
        for &len in full {
            // One trace entry is the largest step between boundaries here.
            assert!((FRAME_TARGET..FRAME_TARGET + 64).contains(&len), "{len}");
        }
        assert!(*last < FRAME_TARGET + 64);
        assert_eq!(out.last(), Some(&op::STOP));
    }

    #[test]
    fn small_pickles_have_no_frame_header_for_under_4_bytes() {
        let snap = Snapshot {
            shape: Shape::SegmentList,
            ..Default::default()
        };
        // `] MEMOIZE .` is 3 bytes: no FRAME.
        assert_eq!(to_vec(&snap), [op::PROTO, 4, b']', 0x94, b'.']);
    }

    #[test]
    fn strings_of_64_kib_or_more_are_written_between_frames() {
        let mut snap = big_snapshot(10);
        let long = "y".repeat(FRAME_TARGET + 5);
        snap.extra.push(("note".into(), Value::Str(long.clone())));
        let out = to_vec(&snap);
        let frames = frames_of(&out);
        assert_eq!(frames.len(), 1, "one frame before the string");
        let at = out
            .windows(5)
            .position(|w| w == [b'X', 5, 0, 1, 0])
            .expect("BINUNICODE header");
        assert_eq!(&out[at + 5..at + 5 + long.len()], long.as_bytes());
        // Then MEMOIZE, SETITEMS, STOP: 3 bytes, too few for a frame header.
        assert_eq!(
            &out[at + 5 + long.len()..],
            [op::MEMOIZE, op::SETITEMS, op::STOP]
        );
    }

    #[test]
    fn each_stack_and_frame_is_written_once() {
        let out = to_vec(&big_snapshot(50));
        let count = |needle: &[u8]| out.windows(needle.len()).filter(|w| *w == needle).count();
        assert_eq!(count(b"/home/user/model.py"), 1);
        assert_eq!(count(b"forward"), 1);
        assert_eq!(count(b"N/A"), 1);
        assert_eq!(count(b"compile_context"), 1);
    }
}
