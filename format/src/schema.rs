//! The PyTorch snapshot schema, written once: for each model struct, the keys it writes, in
//! PyTorch's order for its era, and how each value is emitted.
//!
//! A walk (`snapshot`, `segment`, `block`, `entry`, ...) drives an [`Emit`] implementation:
//! the pickle writer, the JSON writer and [`crate::compare`]'s recorder. The walk decides
//! everything about the schema: which keys an era has (`Option` fields), the key-order quirks
//! (`Segment::frames_after_blocks`, `EntryRare::legacy_frames_first` with its `cpp_frames`),
//! legacy `history`, the `extra` keys after the known ones, and which exact int
//! ([`ExactInts`]) overrides a typed field. An emitter only decides how a dict, a key, an int,
//! a string, a stack or a list is spelled in its format.
//!
//! The walks are generic over the emitter, so each codec gets its own monomorphised copy:
//! the pickle writer's trace-entry loop compiles to straight-line code, as if written by hand.
//! Pickle needs a dict's key count before its keys (`MARK` or not); an emitter that says so
//! ([`Emit::COUNTS_PAIRS`]) gets it from the same walk run over a [`Counter`], which only
//! counts keys.
//!
//! The readers (the JSON parser, the pickle converter and its fast path) recognise the same
//! keys by their text ([`Key::text`]); msgpack serialises the model structs with serde, and a
//! test checks that every model field is either a key here or a flag that these walks read.

use std::convert::Infallible;

use crate::int::{ExactInts, IntField, PyInt};
use crate::intern::{Frame, StackId, StrId};
use crate::model::*;
use crate::value::{Extras, Value};

macro_rules! keys {
    ($($id:ident = $s:literal,)*) => {
        /// Every key of the schema and every enumerated value (action names, segment types,
        /// block states), so writers can memoize them through an array.
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum Key { $($id,)* }

        impl Key {
            /// Every key, in declaration order (`Key::ALL[k as usize] == k`).
            pub(crate) const ALL: &'static [Key] = &[$(Key::$id,)*];
            const TEXT: &'static [&'static str] = &[$($s,)*];
        }
    };
}

keys! {
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

impl Key {
    /// The key (or value) as written in the file.
    #[inline]
    pub(crate) fn text(self) -> &'static str {
        Self::TEXT[self as usize]
    }
}

/// What a format does with the schema's parts. The walks below call these in file order.
pub(crate) trait Emit<'s> {
    type Error;
    /// Whether [`Emit::dict_begin`] / [`Emit::dict_end`] need the dict's key count (otherwise
    /// they get 0 and the walk does not count).
    const COUNTS_PAIRS: bool;

    fn dict_begin(&mut self, pairs: usize);
    fn dict_end(&mut self, pairs: usize);
    /// A schema key.
    fn key(&mut self, key: Key);
    /// A key the schema does not know (an `extra` or annotation metadata key).
    fn extra_key(&mut self, key: &'s str);
    /// An enumerated string value (an action name, a segment type, a block state).
    fn known(&mut self, value: Key);
    fn uint(&mut self, v: u64);
    fn int(&mut self, v: i64);
    fn pyint(&mut self, v: &'s PyInt) -> Result<(), Self::Error>;
    fn float(&mut self, v: f64);
    fn bool(&mut self, v: bool);
    fn str(&mut self, s: &'s str);
    fn str_id(&mut self, id: StrId);
    /// A `frames` list.
    fn stack(&mut self, id: StackId) -> Result<(), Self::Error>;
    /// A generic value (under an unknown key, or the 2.14+ host keys).
    fn value(&mut self, v: &'s Value) -> Result<(), Self::Error>;
    /// A list whose items are walked by [`Walk`].
    fn list<T: Walk<'s>>(&mut self, items: &'s [T]) -> Result<(), Self::Error>;
    /// A 2-tuple (`segment_pool_id`): begin, between the items, end.
    fn pair_begin(&mut self);
    fn pair_next(&mut self);
    fn pair_end(&mut self);
    /// `roundup_power2_divisions`: a dict of str keys and int values.
    fn divisions(&mut self, d: &'s [(String, PyInt)]) -> Result<(), Self::Error>;
}

/// A list item the schema knows how to walk.
pub(crate) trait Walk<'s> {
    fn walk<E: Emit<'s>>(&'s self, w: &mut E) -> Result<(), E::Error>;
}

/// An emitter that only counts keys: how pickle learns a dict's size from the same walk.
pub(crate) struct Counter(usize);

impl Counter {
    #[inline(always)]
    fn pairs(fields: impl FnOnce(&mut Counter) -> Result<(), Infallible>) -> usize {
        let mut c = Counter(0);
        let Ok(()) = fields(&mut c);
        c.0
    }
}

impl<'s> Emit<'s> for Counter {
    type Error = Infallible;
    const COUNTS_PAIRS: bool = false;
    #[inline(always)]
    fn dict_begin(&mut self, _: usize) {}
    #[inline(always)]
    fn dict_end(&mut self, _: usize) {}
    #[inline(always)]
    fn key(&mut self, _: Key) {
        self.0 += 1;
    }
    #[inline(always)]
    fn extra_key(&mut self, _: &'s str) {
        self.0 += 1;
    }
    #[inline(always)]
    fn known(&mut self, _: Key) {}
    #[inline(always)]
    fn uint(&mut self, _: u64) {}
    #[inline(always)]
    fn int(&mut self, _: i64) {}
    #[inline(always)]
    fn pyint(&mut self, _: &'s PyInt) -> Result<(), Infallible> {
        Ok(())
    }
    #[inline(always)]
    fn float(&mut self, _: f64) {}
    #[inline(always)]
    fn bool(&mut self, _: bool) {}
    #[inline(always)]
    fn str(&mut self, _: &'s str) {}
    #[inline(always)]
    fn str_id(&mut self, _: StrId) {}
    #[inline(always)]
    fn stack(&mut self, _: StackId) -> Result<(), Infallible> {
        Ok(())
    }
    #[inline(always)]
    fn value(&mut self, _: &'s Value) -> Result<(), Infallible> {
        Ok(())
    }
    #[inline(always)]
    fn list<T: Walk<'s>>(&mut self, _: &'s [T]) -> Result<(), Infallible> {
        Ok(())
    }
    #[inline(always)]
    fn pair_begin(&mut self) {}
    #[inline(always)]
    fn pair_next(&mut self) {}
    #[inline(always)]
    fn pair_end(&mut self) {}
    #[inline(always)]
    fn divisions(&mut self, _: &'s [(String, PyInt)]) -> Result<(), Infallible> {
        Ok(())
    }
}

/// Walks a dict: its key count first when the emitter needs it, then `fields`.
macro_rules! dict {
    ($w:ident, $fields:ident($($arg:expr),*)) => {{
        let pairs = if E::COUNTS_PAIRS {
            Counter::pairs(|c| $fields(c, $($arg),*))
        } else {
            0
        };
        $w.dict_begin(pairs);
        $fields($w, $($arg),*)?;
        $w.dict_end(pairs);
        Ok(())
    }};
}

/// An unsigned typed int field: its exact value when `exact` has a current one.
#[inline(always)]
fn uint_x<'s, E: Emit<'s>>(
    w: &mut E,
    exact: Option<&'s ExactInts>,
    field: IntField,
    v: u64,
) -> Result<(), E::Error> {
    match exact.and_then(|x| x.current(field, v)) {
        Some(x) => w.pyint(x),
        None => {
            w.uint(v);
            Ok(())
        }
    }
}

/// A signed typed int field: its exact value when `exact` has a current one.
#[inline(always)]
fn int_x<'s, E: Emit<'s>>(
    w: &mut E,
    exact: Option<&'s ExactInts>,
    field: IntField,
    v: i64,
) -> Result<(), E::Error> {
    match exact.and_then(|x| x.current(field, v as u64)) {
        Some(x) => w.pyint(x),
        None => {
            w.int(v);
            Ok(())
        }
    }
}

#[inline(always)]
fn extras<'s, E: Emit<'s>>(w: &mut E, extra: &'s Extras) -> Result<(), E::Error> {
    for (k, v) in extra {
        w.extra_key(k);
        w.value(v)?;
    }
    Ok(())
}

#[inline(always)]
fn stack_key<'s, E: Emit<'s>>(w: &mut E, frames: Option<StackId>) -> Result<(), E::Error> {
    match frames {
        Some(f) => {
            w.key(Key::frames);
            w.stack(f)
        }
        None => Ok(()),
    }
}

#[inline(always)]
fn str_key<'s, E: Emit<'s>>(w: &mut E, key: Key, v: Option<StrId>) {
    if let Some(id) = v {
        w.key(key);
        w.str_id(id);
    }
}

#[inline(always)]
fn pyint_key<'s, E: Emit<'s>>(w: &mut E, key: Key, v: &'s Option<PyInt>) -> Result<(), E::Error> {
    match v {
        Some(v) => {
            w.key(key);
            w.pyint(v)
        }
        None => Ok(()),
    }
}

#[inline(always)]
fn bool_key<'s, E: Emit<'s>>(w: &mut E, key: Key, v: Option<bool>) {
    if let Some(b) = v {
        w.key(key);
        w.bool(b);
    }
}

// ------------------------------------------------------------------------------ the snapshot

/// The whole snapshot: a dict, or (`Shape::SegmentList`) the bare segment list.
pub(crate) fn snapshot<'s, E: Emit<'s>>(w: &mut E, snap: &'s Snapshot) -> Result<(), E::Error> {
    if snap.shape == Shape::SegmentList {
        return w.list(&snap.segments);
    }
    dict!(w, snapshot_fields(snap))
}

fn snapshot_fields<'s, E: Emit<'s>>(w: &mut E, snap: &'s Snapshot) -> Result<(), E::Error> {
    w.key(Key::segments);
    w.list(&snap.segments)?;
    if let Some(traces) = &snap.device_traces {
        w.key(Key::device_traces);
        w.list(traces)?;
    }
    if let Some(s) = &snap.allocator_settings {
        w.key(Key::allocator_settings);
        settings(w, s)?;
    }
    if let Some(a) = &snap.external_annotations {
        w.key(Key::external_annotations);
        w.list(a)?;
    }
    if let Some(h) = &snap.host_segments {
        w.key(Key::host_segments);
        w.value(h)?;
    }
    if let Some(h) = &snap.host_traces {
        w.key(Key::host_traces);
        w.value(h)?;
    }
    extras(w, &snap.extra)?;
    if let Some(info) = &snap.recorder_info {
        w.key(Key::memsnap);
        recorder_info(w, info)?;
    }
    Ok(())
}

/// memsnap's own `"memsnap"` dict.
fn recorder_info<'s, E: Emit<'s>>(w: &mut E, info: &'s RecorderInfo) -> Result<(), E::Error> {
    dict!(w, recorder_info_fields(info))
}

fn recorder_info_fields<'s, E: Emit<'s>>(
    w: &mut E,
    info: &'s RecorderInfo,
) -> Result<(), E::Error> {
    w.key(Key::producer);
    w.str(&info.producer);
    w.key(Key::dropped_entries);
    match info.current_dropped_entries_exact() {
        Some(exact) => w.list(exact)?,
        None => w.list(&info.dropped_entries)?,
    }
    extras(w, &info.extra)
}

// ------------------------------------------------------------------------------ segments

impl<'s> Walk<'s> for Segment {
    #[inline]
    fn walk<E: Emit<'s>>(&'s self, w: &mut E) -> Result<(), E::Error> {
        dict!(w, segment_fields(self))
    }
}

fn segment_fields<'s, E: Emit<'s>>(w: &mut E, seg: &'s Segment) -> Result<(), E::Error> {
    let x = Some(&seg.exact);
    w.key(Key::device);
    int_x(w, x, IntField::Device, seg.device)?;
    w.key(Key::address);
    uint_x(w, x, IntField::Address, seg.address)?;
    w.key(Key::total_size);
    uint_x(w, x, IntField::TotalSize, seg.total_size)?;
    let sums = [
        (
            Key::allocated_size,
            IntField::AllocatedSize,
            seg.allocated_size,
        ),
        (Key::active_size, IntField::ActiveSize, seg.active_size),
        (
            Key::requested_size,
            IntField::RequestedSize,
            seg.requested_size,
        ),
    ];
    for (key, field, v) in sums {
        if let Some(v) = v {
            w.key(key);
            uint_x(w, x, field, v)?;
        }
    }
    w.key(Key::stream);
    int_x(w, x, IntField::Stream, seg.stream)?;
    if let Some(t) = seg.segment_type {
        w.key(Key::segment_type);
        match t {
            SegmentType::Large => w.known(Key::large),
            SegmentType::Small => w.known(Key::small),
            SegmentType::Other(id) => w.str_id(id),
        }
    }
    if let Some((a, b)) = seg.segment_pool_id {
        w.key(Key::segment_pool_id);
        w.pair_begin();
        int_x(w, x, IntField::PoolId0, a)?;
        w.pair_next();
        int_x(w, x, IntField::PoolId1, b)?;
        w.pair_end();
    }
    bool_key(w, Key::is_expandable, seg.is_expandable);
    // PyTorch writes an empty `frames` before `blocks` and a recorded one after.
    stack_key(w, seg.frames.filter(|_| !seg.frames_after_blocks))?;
    w.key(Key::blocks);
    w.list(&seg.blocks)?;
    stack_key(w, seg.frames.filter(|_| seg.frames_after_blocks))?;
    extras(w, &seg.extra)
}

impl<'s> Walk<'s> for Block {
    #[inline]
    fn walk<E: Emit<'s>>(&'s self, w: &mut E) -> Result<(), E::Error> {
        dict!(w, block_fields(self))
    }
}

fn block_fields<'s, E: Emit<'s>>(w: &mut E, b: &'s Block) -> Result<(), E::Error> {
    let x = Some(&b.exact);
    if let Some(a) = b.address {
        w.key(Key::address);
        uint_x(w, x, IntField::Address, a)?;
    }
    w.key(Key::size);
    uint_x(w, x, IntField::Size, b.size)?;
    if let Some(r) = b.requested_size {
        w.key(Key::requested_size);
        uint_x(w, x, IntField::RequestedSize, r)?;
    }
    w.key(Key::state);
    match b.state {
        BlockState::ActiveAllocated => w.known(Key::active_allocated),
        BlockState::ActivePendingFree => w.known(Key::active_pending_free),
        BlockState::Inactive => w.known(Key::inactive),
        BlockState::Other(id) => w.str_id(id),
    }
    stack_key(w, b.frames)?;
    if let Some(ff) = &b.forward_frames {
        w.key(Key::forward_frames);
        w.list(ff)?;
    }
    if let Some(h) = &b.history {
        w.key(Key::history);
        w.list(h)?;
    }
    extras(w, &b.extra)
}

/// A legacy (≤ 2.0) block history item.
impl<'s> Walk<'s> for HistoryItem {
    #[inline]
    fn walk<E: Emit<'s>>(&'s self, w: &mut E) -> Result<(), E::Error> {
        dict!(w, history_fields(self))
    }
}

fn history_fields<'s, E: Emit<'s>>(w: &mut E, item: &'s HistoryItem) -> Result<(), E::Error> {
    let x = Some(&item.exact);
    w.key(Key::addr);
    uint_x(w, x, IntField::Addr, item.addr)?;
    w.key(Key::real_size);
    uint_x(w, x, IntField::RealSize, item.real_size)?;
    stack_key(w, item.frames)?;
    extras(w, &item.extra)
}

// ------------------------------------------------------------------------------ traces

/// One device's trace.
impl<'s> Walk<'s> for Vec<TraceEntry> {
    #[inline]
    fn walk<E: Emit<'s>>(&'s self, w: &mut E) -> Result<(), E::Error> {
        w.list(self)
    }
}

impl<'s> Walk<'s> for TraceEntry {
    #[inline(always)]
    fn walk<E: Emit<'s>>(&'s self, w: &mut E) -> Result<(), E::Error> {
        dict!(w, entry_fields(self))
    }
}

/// The action's name: a known one as its [`Key`].
#[inline(always)]
fn action<'s, E: Emit<'s>>(w: &mut E, a: Action) {
    let key = match a {
        Action::Alloc => Key::a_alloc,
        Action::FreeRequested => Key::a_free_requested,
        Action::FreeCompleted => Key::a_free_completed,
        Action::SegmentAlloc => Key::a_segment_alloc,
        Action::SegmentFree => Key::a_segment_free,
        Action::SegmentMap => Key::a_segment_map,
        Action::SegmentUnmap => Key::a_segment_unmap,
        Action::Snapshot => Key::a_snapshot,
        Action::Oom => Key::a_oom,
        Action::Annotate => Key::a_annotate,
        Action::Free => Key::a_free,
        Action::Other(id) => return w.str_id(id),
    };
    w.known(key);
}

/// A trace entry: `action`, `addr` or (OOM) `device_free`, `size`, `stream`, then the keys of
/// later eras, `frames` (last but for `forward_frames` and unknown keys; first in legacy files,
/// with `cpp_frames`).
#[inline(always)]
fn entry_fields<'s, E: Emit<'s>>(w: &mut E, e: &'s TraceEntry) -> Result<(), E::Error> {
    let rare = e.rare.as_deref();
    let legacy = rare.is_some_and(|r| r.legacy_frames_first);
    let extra: &'s [(String, Value)] = rare.map_or(&[], |r| &r.extra[..]);
    // Legacy (<= 2.0) entries start with `frames` and `cpp_frames`.
    if legacy {
        stack_key(w, e.frames)?;
        for (_, v) in extra.iter().filter(|(k, _)| k == Key::cpp_frames.text()) {
            w.key(Key::cpp_frames);
            w.value(v)?;
        }
    }
    w.key(Key::action);
    action(w, e.action);
    let x = rare.map(|r| &r.exact);
    if e.has_addr() {
        w.key(Key::addr);
        uint_x(w, x, IntField::Addr, e.addr)?;
    }
    if let Some(f) = e.device_free() {
        w.key(Key::device_free);
        uint_x(w, x, IntField::DeviceFree, f)?;
    }
    w.key(Key::size);
    uint_x(w, x, IntField::Size, e.size)?;
    w.key(Key::stream);
    int_x(w, x, IntField::Stream, e.stream)?;
    if let Some(t) = e.time_us {
        w.key(Key::time_us);
        int_x(w, x, IntField::TimeUs, t)?;
    }
    str_key(w, Key::compile_context, e.compile_context);
    str_key(w, Key::user_metadata, e.user_metadata);
    if let Some(r) = rare {
        str_key(w, Key::internal_metadata, r.internal_metadata);
    }
    if !legacy {
        stack_key(w, e.frames)?;
    }
    if let Some(r) = rare {
        if let Some(ff) = &r.forward_frames {
            w.key(Key::forward_frames);
            w.list(ff)?;
        }
        for (k, v) in extra {
            if legacy && k == Key::cpp_frames.text() {
                continue;
            }
            w.extra_key(k);
            w.value(v)?;
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------ the rest

/// `allocator_settings` (2.3+).
fn settings<'s, E: Emit<'s>>(w: &mut E, s: &'s AllocatorSettings) -> Result<(), E::Error> {
    dict!(w, settings_fields(s))
}

fn settings_fields<'s, E: Emit<'s>>(w: &mut E, s: &'s AllocatorSettings) -> Result<(), E::Error> {
    if let Some(v) = &s.alloc_conf {
        w.key(Key::alloc_conf);
        w.str(v);
    }
    pyint_key(w, Key::max_split_size, &s.max_split_size)?;
    if let Some(v) = s.garbage_collection_threshold {
        w.key(Key::garbage_collection_threshold);
        w.float(v);
    }
    bool_key(w, Key::expandable_segments, s.expandable_segments);
    pyint_key(
        w,
        Key::pinned_num_register_threads,
        &s.pinned_num_register_threads,
    )?;
    bool_key(
        w,
        Key::release_lock_on_cudamalloc,
        s.release_lock_on_cudamalloc,
    );
    bool_key(
        w,
        Key::pinned_use_cuda_host_register,
        s.pinned_use_cuda_host_register,
    );
    bool_key(
        w,
        Key::graph_capture_record_stream_reuse,
        s.graph_capture_record_stream_reuse,
    );
    if let Some(d) = &s.roundup_power2_divisions {
        w.key(Key::roundup_power2_divisions);
        w.divisions(d)?;
    }
    pyint_key(w, Key::max_round_threshold, &s.max_round_threshold)?;
    pyint_key(w, Key::max_cached_size, &s.max_cached_size)?;
    extras(w, &s.extra)
}

/// An `external_annotations` entry (2.5+): its metadata keys first, in file order.
impl<'s> Walk<'s> for Annotation {
    #[inline]
    fn walk<E: Emit<'s>>(&'s self, w: &mut E) -> Result<(), E::Error> {
        dict!(w, annotation_fields(self))
    }
}

fn annotation_fields<'s, E: Emit<'s>>(w: &mut E, a: &'s Annotation) -> Result<(), E::Error> {
    extras(w, &a.metadata)?;
    let x = Some(&a.exact);
    w.key(Key::device);
    int_x(w, x, IntField::Device, a.device)?;
    w.key(Key::time_us);
    int_x(w, x, IntField::TimeUs, a.time_us)?;
    extras(w, &a.extra)
}

/// A frame dict of a `frames` list: `name`, `filename`, `line`, then FX and unknown keys.
pub(crate) fn frame<'s, E: Emit<'s>>(w: &mut E, f: &'s Frame) -> Result<(), E::Error> {
    dict!(w, frame_fields(f))
}

fn frame_fields<'s, E: Emit<'s>>(w: &mut E, f: &'s Frame) -> Result<(), E::Error> {
    w.key(Key::name);
    w.str(&f.name);
    w.key(Key::filename);
    w.str(&f.filename);
    w.key(Key::line);
    w.pyint(&f.line)?;
    extras(w, &f.extra)
}

impl<'s> Walk<'s> for String {
    #[inline]
    fn walk<E: Emit<'s>>(&'s self, w: &mut E) -> Result<(), E::Error> {
        w.str(self);
        Ok(())
    }
}

impl<'s> Walk<'s> for u64 {
    #[inline]
    fn walk<E: Emit<'s>>(&'s self, w: &mut E) -> Result<(), E::Error> {
        w.uint(*self);
        Ok(())
    }
}

impl<'s> Walk<'s> for PyInt {
    #[inline]
    fn walk<E: Emit<'s>>(&'s self, w: &mut E) -> Result<(), E::Error> {
        w.pyint(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field names a model struct serialises with (what msgpack writes, through serde).
    fn fields<T: serde::Serialize>(v: &T) -> Vec<String> {
        match serde_json::to_value(v) {
            Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
            other => panic!("not a struct: {other:?}"),
        }
    }

    /// msgpack serialises the model with serde derives rather than through these walks; its
    /// field list must not drift from the schema: every field is a schema key (by its `Key`
    /// name) or a flag or container the walks read (`extra`, `exact`, key-order flags, ...).
    #[test]
    fn every_model_field_msgpack_writes_is_in_the_schema() {
        const WALKED: &[&str] = &[
            "extra",
            "exact",
            "frames_after_blocks",
            "rare",
            "legacy_frames_first",
            "no_addr",
            "metadata",
            "dropped_entries_exact",
        ];
        let mut rare = EntryRare {
            device_free: Some(1),
            internal_metadata: Some(StrId(0)),
            forward_frames: Some(vec![]),
            ..Default::default()
        };
        rare.exact.set(IntField::Size, Some(PyInt::from(-1i64)));
        let mut entry = TraceEntry::new(Action::Alloc, 1, 2, 3);
        entry.rare = Some(Box::new(rare.clone()));
        let block = Block {
            history: Some(vec![]),
            ..Default::default()
        };
        let history = HistoryItem {
            addr: 0,
            real_size: 0,
            frames: None,
            extra: Extras::new(),
            exact: ExactInts::default(),
        };
        let annotation = Annotation {
            metadata: Vec::new(),
            device: 0,
            time_us: 0,
            extra: Extras::new(),
            exact: ExactInts::default(),
        };
        let all = [
            fields(&Segment::new(0, 0, 0, 0)),
            fields(&block),
            fields(&history),
            fields(&entry),
            fields(&rare),
            fields(&AllocatorSettings::default()),
            fields(&annotation),
            fields(&RecorderInfo::default()),
        ];
        for field in all.iter().flatten() {
            let is_key = Key::ALL.iter().any(|k| format!("{k:?}") == *field);
            assert!(
                is_key || WALKED.contains(&field.as_str()),
                "model field `{field}` is neither a schema key nor walked by the schema"
            );
        }
    }

    #[test]
    fn keys_index_their_text() {
        for (i, k) in Key::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
            assert!(!k.text().is_empty());
        }
    }
}
