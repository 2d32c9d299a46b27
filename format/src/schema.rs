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
//! The read side is here too, once for both readers: the JSON parser and the pickle
//! converter implement [`Source`] (how to get an int, a str, a stack, a dict's keys, a list's
//! items from their tokens or VM values), and `snapshot_dict`, `read_segment`,
//! `read_block`, `read_history_item`, [`EntryIn`], [`setting`], `read_annotation` and
//! `read_frame` decide, per key ([`Key::of_bytes`]), which model field it fills, which int
//! field keeps an exact override, the era flags (`frames_after_blocks`,
//! `legacy_frames_first`), what a repeat does, that unknown keys go to `extra` in file order,
//! and which missing key is an error. [`ENTRY_ORDER`] is the trace-entry key order the walk
//! writes (a test checks it against [`entry_fields`]): the readers' canonical-order check
//! ranks keys by it, and the pickle fast path's `Sym` key variants are declared in it (a
//! const assertion in `pickle/convert.rs`). msgpack serialises the model structs with serde,
//! and a test checks that every model field is either a key here or a flag these walks read.

use std::convert::Infallible;

use crate::error::{FormatError, Result};
use crate::int::{ExactInts, IntField, PyInt};
use crate::intern::{
    Frame, StackId, StrId, StrTable, COMPILE_CONTEXT_DEFAULT, USER_METADATA_DEFAULT,
};
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
    /// Open-addressing table from [`Key::hash`] of a key's text to the key (`0xff`: empty).
    const LOOKUP: [u8; 256] = {
        assert!(Key::TEXT.len() < 128);
        let mut table = [0xffu8; 256];
        let mut k = 0;
        while k < Key::TEXT.len() {
            let mut i = Key::hash(Key::TEXT[k].as_bytes());
            while table[i] != 0xff {
                i = (i + 1) & 0xff;
            }
            table[i] = k as u8;
            k += 1;
        }
        table
    };

    #[inline(always)]
    const fn hash(text: &[u8]) -> usize {
        let n = text.len();
        if n == 0 {
            return 0;
        }
        (n.wrapping_mul(29)
            ^ (text[0] as usize).wrapping_mul(7)
            ^ (text[n / 2] as usize).wrapping_mul(17)
            ^ (text[n - 1] as usize).wrapping_mul(131))
            & 0xff
    }

    /// The key (or enumerated value) a text read from a file is, if the schema has it: how
    /// the readers recognise keys (a hash probe and a comparison, not a match arm per key).
    #[inline]
    pub(crate) fn of_bytes(text: &[u8]) -> Option<Key> {
        let mut i = Key::hash(text);
        loop {
            let k = Key::LOOKUP[i] as usize;
            if k == 0xff {
                return None;
            }
            if same_text(Key::TEXT[k].as_bytes(), text) {
                return Some(Key::ALL[k]);
            }
            i = (i + 1) & 0xff;
        }
    }

    /// The key (or value) as written in the file.
    #[inline]
    pub(crate) fn text(self) -> &'static str {
        Self::TEXT[self as usize]
    }
}

/// Whether two short texts are equal, compared in place with overlapping word loads (keys are
/// 3 to 33 bytes; a `memcmp` call per key would cost the JSON reader more than the lookup).
#[inline(always)]
fn same_text(a: &[u8], b: &[u8]) -> bool {
    fn word(s: &[u8], at: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[at..at + 8]);
        u64::from_le_bytes(w)
    }
    fn half(s: &[u8], at: usize) -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&s[at..at + 4]);
        u32::from_le_bytes(w)
    }
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n >= 8 {
        let mut i = 0;
        while i + 8 < n {
            if word(a, i) != word(b, i) {
                return false;
            }
            i += 8;
        }
        word(a, n - 8) == word(b, n - 8)
    } else if n >= 4 {
        half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4)
    } else {
        a.iter().zip(b).all(|(x, y)| x == y)
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
    /// The snapshot's string table, which gives the ids of the defaults a trace entry keeps
    /// as flags (`TraceEntry::compile_context`); `None` for emitters that write no values.
    fn strings(&self) -> Option<&'s StrTable>;
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
    fn strings(&self) -> Option<&'s StrTable> {
        None
    }
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
fn extras<'s, E: Emit<'s>>(w: &mut E, extra: &'s [(String, Value)]) -> Result<(), E::Error> {
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
fn action<'s, E: Emit<'s>>(w: &mut E, e: &TraceEntry) {
    let key = match e.action {
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
        Action::Other => {
            // Without its name (code that set `Action::Other` directly; `check_ids` refuses
            // it) the key still gets a value: `action_name`'s "".
            match e.other_action() {
                Some(id) => w.str_id(id),
                None => w.str(""),
            }
            return;
        }
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
    action(w, e);
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
    if let Some(t) = e.time_us() {
        w.key(Key::time_us);
        int_x(w, x, IntField::TimeUs, t)?;
    }
    // A default whose id the table lacks (an entry moved between snapshots without its
    // strings; `check_ids` refuses it) is still written, as its text.
    let strings = w.strings();
    if e.has_compile_context() {
        w.key(Key::compile_context);
        match strings.and_then(|s| e.compile_context(s)) {
            Some(id) => w.str_id(id),
            None => w.str(COMPILE_CONTEXT_DEFAULT),
        }
    }
    if e.has_user_metadata() {
        w.key(Key::user_metadata);
        match strings.and_then(|s| e.user_metadata(s)) {
            Some(id) => w.str_id(id),
            None => w.str(USER_METADATA_DEFAULT),
        }
    }
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
    for (k, v) in a.metadata.iter() {
        w.extra_key(k);
        w.value(v)?;
    }
    let x = Some(a.exact());
    w.key(Key::device);
    int_x(w, x, IntField::Device, a.device)?;
    w.key(Key::time_us);
    int_x(w, x, IntField::TimeUs, a.time_us)?;
    extras(w, a.extra())
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

// ------------------------------------------------------------------------------ reading

/// What a reader does to get the schema's values: the JSON parser from its tokens (it stands
/// at the value, `V = ()`), the pickle converter from the VM's values (`V = Val`). The read
/// side below (`segment`, `block`, [`EntryIn`], ...) decides everything else, as the walks do
/// for the writers: which key fills which model field, which int field keeps an exact
/// override, the key-order flags (`frames_after_blocks`, `legacy_frames_first`), unknown keys
/// kept in file order in `extra`, repeated keys, and the errors for missing keys.
pub(crate) trait Source: Sized {
    /// A value in hand.
    type V: Copy;
    /// A dict key as read (an unknown one goes to `extra` under it).
    type Name;

    /// The snapshot's string table (what `get_interned` interns into).
    fn strings(&self) -> &StrTable;

    /// An error at the reader's current place.
    fn fail(&self, what: String) -> FormatError;
    /// A struct (`what`) lacks a required key.
    fn missing(&self, what: &str, key: Key) -> FormatError {
        self.fail(format!("{what} lacks key '{}'", key.text()))
    }
    /// Runs `f` with `key` appended to the error path.
    fn at_key<T>(&mut self, key: Key, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T>;
    /// Calls `each` for every key of a dict (its schema key, if any, its name and value).
    fn get_dict(
        &mut self,
        v: Self::V,
        each: impl FnMut(&mut Self, Option<Key>, Self::Name, Self::V) -> Result<()>,
    ) -> Result<()>;
    /// A list, each item read by `item` (under its index in the error path).
    fn get_list<T>(
        &mut self,
        v: Self::V,
        item: impl FnMut(&mut Self, Self::V) -> Result<T>,
    ) -> Result<Vec<T>>;
    /// Any int, exactly.
    fn get_int(&mut self, v: Self::V) -> Result<PyInt>;
    /// An int for a typed field under `key`: its 64 bits, the exact value kept in `exact` if
    /// they do not say it all (a repeated key replaces an earlier exact value).
    fn get_field(
        &mut self,
        key: Key,
        v: Self::V,
        field: IntField,
        exact: &mut ExactInts,
    ) -> Result<u64>;
    fn get_string(&mut self, v: Self::V) -> Result<String>;
    /// A str interned; `slot` (0 `compile_context`, 1 `user_metadata`) names a one-entry
    /// cache a reader may keep per trace-entry field.
    fn get_interned(&mut self, v: Self::V, slot: Option<usize>) -> Result<StrId>;
    /// An enumerated str: `known` for a name the model has, else `other` of the interned text.
    fn get_named<T>(
        &mut self,
        v: Self::V,
        known: fn(&str) -> Option<T>,
        other: fn(StrId) -> T,
    ) -> Result<T>;
    /// A trace entry's `action`, with the interned name of one this version does not know.
    fn get_action(&mut self, v: Self::V) -> Result<(Action, Option<StrId>)> {
        self.get_named(
            v,
            |name| Action::from_name(name).map(|a| (a, None)),
            |id| (Action::Other, Some(id)),
        )
    }
    fn get_bool(&mut self, v: Self::V) -> Result<bool>;
    /// A `frames` list.
    fn get_stack(&mut self, v: Self::V) -> Result<StackId>;
    fn get_strings(&mut self, v: Self::V) -> Result<Vec<String>>;
    /// A generic value (the 2.14+ host keys).
    fn get_value(&mut self, v: Self::V) -> Result<Value>;
    /// `segment_pool_id`: a 2-tuple of ints (a 2-item array in JSON).
    fn get_pool_id(&mut self, v: Self::V, exact: &mut ExactInts) -> Result<(i64, i64)>;
    /// `device_traces`: a list of lists of trace entries (read with [`EntryIn`]).
    fn get_traces(&mut self, v: Self::V) -> Result<Vec<Vec<TraceEntry>>>;
    /// `allocator_settings` (read with [`setting`]).
    fn get_settings(&mut self, v: Self::V) -> Result<AllocatorSettings>;
    /// Keeps an unknown key and its value, in file order.
    fn put_extra(&mut self, name: Self::Name, v: Self::V, out: &mut Extras) -> Result<()>;
}

/// The snapshot dict (the bare segment list is the reader's to recognise), with empty
/// tables: the reader interns into its own and moves them in ([`adopt_tables`]).
pub(crate) fn snapshot_dict<S: Source>(s: &mut S, v: S::V) -> Result<Snapshot> {
    let mut segments = None;
    let mut out = Snapshot::default();
    s.get_dict(v, |s, key, name, v| {
        match key {
            Some(k @ Key::segments) => segments = Some(s.at_key(k, |s| segment_list(s, v))?),
            Some(k @ Key::device_traces) => {
                out.device_traces = Some(s.at_key(k, |s| s.get_traces(v))?)
            }
            Some(k @ Key::allocator_settings) => {
                out.allocator_settings = Some(s.at_key(k, |s| s.get_settings(v))?)
            }
            Some(k @ Key::external_annotations) => {
                out.external_annotations =
                    Some(s.at_key(k, |s| s.get_list(v, |s, v| read_annotation(s, v)))?)
            }
            Some(k @ Key::host_segments) => {
                out.host_segments = Some(s.at_key(k, |s| s.get_value(v))?)
            }
            Some(k @ Key::host_traces) => out.host_traces = Some(s.at_key(k, |s| s.get_value(v))?),
            Some(k @ Key::memsnap) => {
                out.recorder_info = Some(s.at_key(k, |s| read_recorder_info(s, v))?)
            }
            _ => s.put_extra(name, v, &mut out.extra)?,
        }
        Ok(())
    })?;
    out.segments = segments.ok_or_else(|| s.missing("snapshot", Key::segments))?;
    Ok(out)
}

/// Moves the interning tables the reader filled into the snapshot [`snapshot_dict`] read.
pub(crate) fn adopt_tables(snap: &mut Snapshot, tables: &mut Snapshot) {
    snap.frames = std::mem::take(&mut tables.frames);
    snap.stacks = std::mem::take(&mut tables.stacks);
    snap.strings = std::mem::take(&mut tables.strings);
}

/// memsnap's own `"memsnap"` dict.
fn read_recorder_info<S: Source>(s: &mut S, v: S::V) -> Result<RecorderInfo> {
    let mut info = RecorderInfo::default();
    let mut producer = None;
    s.get_dict(v, |s, key, name, v| {
        match key {
            Some(k @ Key::producer) => producer = Some(s.at_key(k, |s| s.get_string(v))?),
            Some(k @ Key::dropped_entries) => {
                let exact = s.at_key(k, |s| s.get_list(v, |s, v| s.get_int(v)))?;
                info.set_dropped_entries(exact);
            }
            _ => s.put_extra(name, v, &mut info.extra)?,
        }
        Ok(())
    })?;
    info.producer = producer.ok_or_else(|| s.missing("\"memsnap\"", Key::producer))?;
    Ok(info)
}

/// A list of segments (the snapshot's `segments`, or the whole of a pre-2.0 file).
pub(crate) fn segment_list<S: Source>(s: &mut S, v: S::V) -> Result<Vec<Segment>> {
    s.get_list(v, |s, v| read_segment(s, v))
}

fn read_segment<S: Source>(s: &mut S, v: S::V) -> Result<Segment> {
    let (mut device, mut address, mut total_size, mut stream) = (None, None, None, None);
    let mut seg = Segment::new(0, 0, 0, 0);
    seg.allocated_size = None;
    seg.active_size = None;
    seg.requested_size = None;
    seg.segment_type = None;
    seg.segment_pool_id = None;
    seg.is_expandable = None;
    let mut blocks = None;
    s.get_dict(v, |s, key, name, v| {
        let x = &mut seg.exact;
        match key {
            Some(k @ Key::device) => device = Some(s.get_field(k, v, IntField::Device, x)? as i64),
            Some(k @ Key::address) => address = Some(s.get_field(k, v, IntField::Address, x)?),
            Some(k @ Key::total_size) => {
                total_size = Some(s.get_field(k, v, IntField::TotalSize, x)?)
            }
            Some(k @ Key::allocated_size) => {
                seg.allocated_size = Some(s.get_field(k, v, IntField::AllocatedSize, x)?)
            }
            Some(k @ Key::active_size) => {
                seg.active_size = Some(s.get_field(k, v, IntField::ActiveSize, x)?)
            }
            Some(k @ Key::requested_size) => {
                seg.requested_size = Some(s.get_field(k, v, IntField::RequestedSize, x)?)
            }
            Some(k @ Key::stream) => stream = Some(s.get_field(k, v, IntField::Stream, x)? as i64),
            Some(k @ Key::segment_type) => {
                seg.segment_type = Some(s.at_key(k, |s| {
                    s.get_named(v, SegmentType::from_name, SegmentType::Other)
                })?)
            }
            Some(k @ Key::segment_pool_id) => {
                seg.segment_pool_id = Some(s.at_key(k, |s| s.get_pool_id(v, x))?)
            }
            Some(k @ Key::is_expandable) => {
                seg.is_expandable = Some(s.at_key(k, |s| s.get_bool(v))?)
            }
            // PyTorch writes an empty `frames` before `blocks` and a recorded one after.
            Some(k @ Key::frames) => {
                seg.frames = Some(s.at_key(k, |s| s.get_stack(v))?);
                seg.frames_after_blocks = blocks.is_some();
            }
            Some(k @ Key::blocks) => {
                blocks = Some(s.at_key(k, |s| s.get_list(v, |s, v| read_block(s, v)))?)
            }
            _ => s.put_extra(name, v, &mut seg.extra)?,
        }
        Ok(())
    })?;
    let missing = |s: &S, key| s.missing("segment", key);
    seg.device = device.ok_or_else(|| missing(s, Key::device))?;
    seg.address = address.ok_or_else(|| missing(s, Key::address))?;
    seg.total_size = total_size.ok_or_else(|| missing(s, Key::total_size))?;
    seg.stream = stream.ok_or_else(|| missing(s, Key::stream))?;
    seg.blocks = blocks.ok_or_else(|| missing(s, Key::blocks))?;
    Ok(seg)
}

fn read_block<S: Source>(s: &mut S, v: S::V) -> Result<Block> {
    let mut b = Block::default();
    let (mut size, mut state) = (None, None);
    s.get_dict(v, |s, key, name, v| {
        let x = &mut b.exact;
        match key {
            Some(k @ Key::address) => b.address = Some(s.get_field(k, v, IntField::Address, x)?),
            Some(k @ Key::size) => size = Some(s.get_field(k, v, IntField::Size, x)?),
            Some(k @ Key::requested_size) => {
                b.requested_size = Some(s.get_field(k, v, IntField::RequestedSize, x)?)
            }
            Some(k @ Key::state) => {
                state = Some(s.at_key(k, |s| {
                    s.get_named(v, BlockState::from_name, BlockState::Other)
                })?)
            }
            Some(k @ Key::frames) => b.frames = Some(s.at_key(k, |s| s.get_stack(v))?),
            Some(k @ Key::forward_frames) => {
                b.forward_frames = Some(s.at_key(k, |s| s.get_strings(v))?)
            }
            Some(k @ Key::history) => {
                b.history = Some(s.at_key(k, |s| s.get_list(v, |s, v| read_history_item(s, v)))?)
            }
            _ => s.put_extra(name, v, &mut b.extra)?,
        }
        Ok(())
    })?;
    b.size = size.ok_or_else(|| s.missing("block", Key::size))?;
    b.state = state.ok_or_else(|| s.missing("block", Key::state))?;
    Ok(b)
}

/// A legacy (≤ 2.0) block history item.
fn read_history_item<S: Source>(s: &mut S, v: S::V) -> Result<HistoryItem> {
    let mut h = HistoryItem {
        addr: 0,
        real_size: 0,
        frames: None,
        extra: Extras::new(),
        exact: ExactInts::default(),
    };
    let (mut addr, mut real_size) = (None, None);
    s.get_dict(v, |s, key, name, v| {
        match key {
            Some(k @ Key::addr) => addr = Some(s.get_field(k, v, IntField::Addr, &mut h.exact)?),
            Some(k @ Key::real_size) => {
                real_size = Some(s.get_field(k, v, IntField::RealSize, &mut h.exact)?)
            }
            Some(k @ Key::frames) => h.frames = Some(s.at_key(k, |s| s.get_stack(v))?),
            _ => s.put_extra(name, v, &mut h.extra)?,
        }
        Ok(())
    })?;
    h.addr = addr.ok_or_else(|| s.missing("history item", Key::addr))?;
    h.real_size = real_size.ok_or_else(|| s.missing("history item", Key::real_size))?;
    Ok(h)
}

/// The order the walk writes a trace entry's known keys in ([`entry_fields`]; a legacy entry's
/// leading `frames` ranks 0, an unknown key [`ENTRY_RANK_UNKNOWN`]). A reader calls an entry
/// canonical when its ranks strictly increase; the pickle reader's fast path expects its keys
/// in this order (its `Sym` key variants are declared in it, which `convert.rs` asserts).
pub(crate) const ENTRY_ORDER: [Key; 11] = [
    Key::action,
    Key::addr,
    Key::device_free,
    Key::size,
    Key::stream,
    Key::time_us,
    Key::compile_context,
    Key::user_metadata,
    Key::internal_metadata,
    Key::frames,
    Key::forward_frames,
];

/// The rank of a key [`ENTRY_ORDER`] does not have.
pub(crate) const ENTRY_RANK_UNKNOWN: u8 = ENTRY_ORDER.len() as u8 + 1;

/// A known entry key's rank: its place in [`ENTRY_ORDER`] plus 1.
#[inline(always)]
pub(crate) const fn entry_rank(key: Key) -> u8 {
    let mut i = 0;
    while i < ENTRY_ORDER.len() {
        if ENTRY_ORDER[i] as u8 == key as u8 {
            return i as u8 + 1;
        }
        i += 1;
    }
    ENTRY_RANK_UNKNOWN
}

/// A trace entry being read, one key at a time ([`EntryIn::key`]), then [`EntryIn::finish`].
pub(crate) struct EntryIn {
    e: TraceEntry,
    action: Option<(Action, Option<StrId>)>,
    time_us: Option<i64>,
    compile_context: Option<StrId>,
    user_metadata: Option<StrId>,
    addr: Option<u64>,
    size: Option<u64>,
    stream: Option<i64>,
    rare: Option<Box<EntryRare>>,
    exact: ExactInts,
    first: bool,
}

impl EntryIn {
    #[inline(always)]
    pub(crate) fn new() -> Self {
        EntryIn {
            e: TraceEntry::new(Action::Alloc, 0, 0, 0),
            action: None,
            time_us: None,
            compile_context: None,
            user_metadata: None,
            addr: None,
            size: None,
            stream: None,
            rare: None,
            exact: ExactInts::default(),
            first: true,
        }
    }

    #[inline(always)]
    fn rare(&mut self) -> &mut EntryRare {
        self.rare.get_or_insert_with(Default::default)
    }

    /// Reads one key's value into the entry; returns the key's rank (see [`ENTRY_ORDER`]).
    #[inline(always)]
    pub(crate) fn key<S: Source>(
        &mut self,
        s: &mut S,
        key: Option<Key>,
        name: S::Name,
        v: S::V,
    ) -> Result<u8> {
        let first = std::mem::replace(&mut self.first, false);
        let x = &mut self.exact;
        match key {
            Some(k @ Key::action) => self.action = Some(s.at_key(k, |s| s.get_action(v))?),
            Some(k @ Key::addr) => self.addr = Some(s.get_field(k, v, IntField::Addr, x)?),
            Some(k @ Key::device_free) => {
                let f = s.get_field(k, v, IntField::DeviceFree, x)?;
                self.rare().device_free = Some(f);
            }
            Some(k @ Key::size) => self.size = Some(s.get_field(k, v, IntField::Size, x)?),
            Some(k @ Key::stream) => {
                self.stream = Some(s.get_field(k, v, IntField::Stream, x)? as i64)
            }
            Some(k @ Key::time_us) => {
                self.time_us = Some(s.get_field(k, v, IntField::TimeUs, x)? as i64)
            }
            Some(k @ Key::compile_context) => {
                let id = s.at_key(k, |s| s.get_interned(v, Some(0)))?;
                self.compile_context = Some(id);
            }
            Some(k @ Key::user_metadata) => {
                let id = s.at_key(k, |s| s.get_interned(v, Some(1)))?;
                self.user_metadata = Some(id);
            }
            Some(k @ Key::internal_metadata) => {
                let id = s.at_key(k, |s| s.get_interned(v, None))?;
                self.rare().internal_metadata = Some(id);
            }
            Some(k @ Key::frames) => {
                self.e.frames = Some(s.at_key(k, |s| s.get_stack(v))?);
                // Legacy (<= 2.0) entries start with `frames`.
                if first {
                    self.rare().legacy_frames_first = true;
                    return Ok(0);
                }
            }
            Some(k @ Key::forward_frames) => {
                let f = s.at_key(k, |s| s.get_strings(v))?;
                self.rare().forward_frames = Some(f);
            }
            _ => {
                let rare = self.rare.get_or_insert_with(Default::default);
                s.put_extra(name, v, &mut rare.extra)?;
                return Ok(ENTRY_RANK_UNKNOWN);
            }
        }
        Ok(key.map_or(ENTRY_RANK_UNKNOWN, entry_rank))
    }

    /// The entry, or an error for a missing required key.
    #[inline(always)]
    pub(crate) fn finish<S: Source>(mut self, s: &S) -> Result<TraceEntry> {
        let missing = |key| s.missing("trace entry", key);
        let (action, other_action) = self.action.ok_or_else(|| missing(Key::action))?;
        if other_action.is_some() {
            self.rare().other_action = other_action;
        }
        self.e.action = action;
        self.e.size = self.size.ok_or_else(|| missing(Key::size))?;
        self.e.stream = self.stream.ok_or_else(|| missing(Key::stream))?;
        match self.addr {
            Some(a) => self.e.addr = a,
            None => self.rare().no_addr = true,
        }
        if !self.exact.is_empty() {
            let exact = std::mem::take(&mut self.exact);
            self.rare().exact = exact;
        }
        self.e.rare = self.rare;
        self.e.set_time_us(self.time_us);
        let strings = s.strings();
        self.e.set_compile_context(self.compile_context, strings);
        self.e.set_user_metadata(self.user_metadata, strings);
        Ok(self.e)
    }
}

/// Where an `allocator_settings` key's value goes: a typed slot the reader fills when the
/// value has that type.
pub(crate) enum Setting<'m> {
    Str(&'m mut Option<String>),
    Int(&'m mut Option<PyInt>),
    Float(&'m mut Option<f64>),
    Bool(&'m mut Option<bool>),
    /// `{'1': 0, '2': 0, ...}`: str keys, int values.
    Divisions(&'m mut Option<Vec<(String, PyInt)>>),
}

/// The slot of an `allocator_settings` key; `None` for an unknown key or one already filled
/// (a repeat), which the reader keeps in `extra`, as it does a value of another type.
pub(crate) fn setting(s: &mut AllocatorSettings, key: Option<Key>) -> Option<Setting<'_>> {
    let slot = match key? {
        Key::alloc_conf => Setting::Str(&mut s.alloc_conf),
        Key::max_split_size => Setting::Int(&mut s.max_split_size),
        Key::garbage_collection_threshold => Setting::Float(&mut s.garbage_collection_threshold),
        Key::expandable_segments => Setting::Bool(&mut s.expandable_segments),
        Key::pinned_num_register_threads => Setting::Int(&mut s.pinned_num_register_threads),
        Key::release_lock_on_cudamalloc => Setting::Bool(&mut s.release_lock_on_cudamalloc),
        Key::pinned_use_cuda_host_register => Setting::Bool(&mut s.pinned_use_cuda_host_register),
        Key::graph_capture_record_stream_reuse => {
            Setting::Bool(&mut s.graph_capture_record_stream_reuse)
        }
        Key::roundup_power2_divisions => Setting::Divisions(&mut s.roundup_power2_divisions),
        Key::max_round_threshold => Setting::Int(&mut s.max_round_threshold),
        Key::max_cached_size => Setting::Int(&mut s.max_cached_size),
        _ => return None,
    };
    let filled = match &slot {
        Setting::Str(o) => o.is_some(),
        Setting::Int(o) => o.is_some(),
        Setting::Float(o) => o.is_some(),
        Setting::Bool(o) => o.is_some(),
        Setting::Divisions(o) => o.is_some(),
    };
    (!filled).then_some(slot)
}

/// An `external_annotations` entry: keys before `device` and `time_us` are its metadata.
fn read_annotation<S: Source>(s: &mut S, v: S::V) -> Result<Annotation> {
    let (mut device, mut time_us) = (None, None);
    let mut metadata = Extras::new();
    let mut extra = Extras::new();
    let mut exact = ExactInts::default();
    s.get_dict(v, |s, key, name, v| {
        match key {
            Some(k @ Key::device) if device.is_none() => {
                device = Some(s.get_field(k, v, IntField::Device, &mut exact)? as i64)
            }
            Some(k @ Key::time_us) if time_us.is_none() => {
                time_us = Some(s.get_field(k, v, IntField::TimeUs, &mut exact)? as i64)
            }
            _ if device.is_none() && time_us.is_none() => s.put_extra(name, v, &mut metadata)?,
            _ => s.put_extra(name, v, &mut extra)?,
        }
        Ok(())
    })?;
    // A run can hold millions of annotations: `Metadata` holds record_function's two keys
    // compactly, and the rare keys after them are boxed only when there are any.
    Ok(Annotation::new(
        metadata.into(),
        device.ok_or_else(|| s.missing("annotation", Key::device))?,
        time_us.ok_or_else(|| s.missing("annotation", Key::time_us))?,
    )
    .with_rare(extra, exact))
}

/// A frame dict's fields (the reader interns and caches the frame).
pub(crate) fn read_frame<S: Source>(s: &mut S, v: S::V) -> Result<Frame> {
    let (mut name, mut filename, mut line) = (None, None, None);
    let mut extra = Extras::new();
    s.get_dict(v, |s, key, key_name, v| {
        match key {
            Some(k @ Key::name) => name = Some(s.at_key(k, |s| s.get_string(v))?),
            Some(k @ Key::filename) => filename = Some(s.at_key(k, |s| s.get_string(v))?),
            Some(k @ Key::line) => line = Some(s.at_key(k, |s| s.get_int(v))?),
            _ => s.put_extra(key_name, v, &mut extra)?,
        }
        Ok(())
    })?;
    let (Some(name), Some(filename), Some(line)) = (name, filename, line) else {
        return Err(s.fail("frame lacks one of the keys 'name', 'filename', 'line'".into()));
    };
    Ok(Frame {
        name,
        filename,
        line,
        extra,
    })
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
        // With a rare part, so that `exact` is written too.
        let mut annotation = Annotation::new(Metadata::new(), 0, 0);
        annotation
            .exact_mut()
            .set(IntField::Device, Some(PyInt::Small(0)));
        let all = [
            fields(&Segment::new(0, 0, 0, 0)),
            fields(&block),
            fields(&history),
            crate::msgpack::trace_entry_wire_fields(),
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

    /// Records the schema keys a walk writes.
    struct Keys(Vec<Key>);

    impl<'s> Emit<'s> for Keys {
        type Error = Infallible;
        const COUNTS_PAIRS: bool = false;
        fn dict_begin(&mut self, _: usize) {}
        fn dict_end(&mut self, _: usize) {}
        fn key(&mut self, key: Key) {
            self.0.push(key);
        }
        fn extra_key(&mut self, _: &'s str) {}
        fn known(&mut self, _: Key) {}
        fn uint(&mut self, _: u64) {}
        fn int(&mut self, _: i64) {}
        fn pyint(&mut self, _: &'s PyInt) -> Result<(), Infallible> {
            Ok(())
        }
        fn float(&mut self, _: f64) {}
        fn bool(&mut self, _: bool) {}
        fn str(&mut self, _: &'s str) {}
        fn str_id(&mut self, _: StrId) {}
        fn strings(&self) -> Option<&'s StrTable> {
            None
        }
        fn stack(&mut self, _: StackId) -> Result<(), Infallible> {
            Ok(())
        }
        fn value(&mut self, _: &'s Value) -> Result<(), Infallible> {
            Ok(())
        }
        fn list<T: Walk<'s>>(&mut self, _: &'s [T]) -> Result<(), Infallible> {
            Ok(())
        }
        fn pair_begin(&mut self) {}
        fn pair_next(&mut self) {}
        fn pair_end(&mut self) {}
        fn divisions(&mut self, _: &'s [(String, PyInt)]) -> Result<(), Infallible> {
            Ok(())
        }
    }

    /// The readers' entry key order (and the pickle fast path's) is the order the walk writes.
    #[test]
    fn entry_order_is_the_walks() {
        let mut entry = TraceEntry::new(Action::Oom, 1, 2, 3);
        let mut strings = StrTable::default();
        let id = strings.intern("x");
        entry.set_time_us(Some(4));
        entry.set_compile_context(Some(id), &strings);
        entry.set_user_metadata(Some(id), &strings);
        entry.frames = Some(StackId::from_index(0));
        let rare = entry.rare_mut();
        rare.device_free = Some(5);
        rare.internal_metadata = Some(id);
        rare.forward_frames = Some(vec![]);
        let mut keys = Keys(Vec::new());
        let Ok(()) = entry.walk(&mut keys);
        assert_eq!(keys.0, ENTRY_ORDER);
        for (i, key) in ENTRY_ORDER.iter().enumerate() {
            assert_eq!(usize::from(entry_rank(*key)), i + 1);
        }
        assert_eq!(entry_rank(Key::device), ENTRY_RANK_UNKNOWN);
    }

    #[test]
    fn keys_are_recognised_by_their_text() {
        for k in Key::ALL {
            assert_eq!(Key::of_bytes(k.text().as_bytes()), Some(*k));
        }
        for other in [
            "",
            "x",
            "Action",
            "action ",
            "frame",
            "sizes",
            "cpp_frame",
            "N/A",
        ] {
            assert_eq!(Key::of_bytes(other.as_bytes()), None, "{other:?}");
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
