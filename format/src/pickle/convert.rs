//! The conversion pass: object graph ([`Arena`]) to the typed, interned [`Snapshot`].
//!
//! Memo-shared frame lists and frame dicts are converted once: a per-node cache maps a list
//! node to its [`StackId`] and a frame dict node to its [`FrameId`]. Everything else that is
//! expanded (segments, blocks, entries, unknown keys as [`Value`]) is charged to a budget
//! proportional to the input, so a memo bomb cannot make us allocate without bound.

use std::fmt::Write as _;

use crate::error::{FormatError, Result};
use crate::int::{ExactInts, IntField, PyInt};
use crate::intern::{Frame, FrameId, StackId, StrId};
use crate::model::*;
use crate::value::{Extras, Value};

use super::vm::{Arena, Kind, Val, NONE};

/// Deepest nesting of unknown values we expand (and later drop) recursively; real snapshots
/// nest a few levels, and 256 levels fit in a 2 MiB thread stack even in debug builds.
pub(crate) const MAX_DEPTH: usize = 256;

#[derive(Clone, Debug)]
enum Seg {
    Key(&'static str),
    Name(String),
    Index(usize),
}

/// What the conversion keeps between calls: the snapshot being built (its interning tables),
/// the per-node caches, the expansion budget, and the trace entries converted while reading.
pub(crate) struct ConvState {
    snap: Snapshot,
    /// List node -> StackId (`NONE` when not converted); grown on demand.
    stack_cache: Vec<u32>,
    /// Frame dict node -> FrameId.
    frame_cache: Vec<u32>,
    frame_buf: Vec<FrameId>,
    pub budget: u64,
    /// Trace entries converted by the VM, indexed by `Kind::Entry` nodes.
    pub entries: Vec<TraceEntry>,
    /// While the VM's fast path tries an entry: the `(stack?, node)` cache entries it set,
    /// cleared again if it gives up (a node read as a stack or frame may not change after).
    pub cache_journal: Option<Vec<(bool, u32)>>,
    /// How many of `entries` the VM's fast path read.
    pub fast_entries: usize,
    /// `entries` was moved out whole into one device trace.
    entries_taken: bool,
    /// The last string interned per entry field (`compile_context`, `user_metadata`) as a
    /// heap range: consecutive entries nearly always repeat it, so this skips hashing it
    /// again (and the fast path stores a fresh copy's bytes only once).
    pub recent_strs: [(usize, u32, StrId); 2],
}

impl ConvState {
    pub fn new(input_len: u64) -> Self {
        ConvState {
            snap: Snapshot::default(),
            stack_cache: Vec::new(),
            frame_cache: Vec::new(),
            frame_buf: Vec::new(),
            budget: input_len.saturating_mul(4).saturating_add(1 << 16),
            entries: Vec::new(),
            cache_journal: None,
            fast_entries: 0,
            entries_taken: false,
            recent_strs: [(0, u32::MAX, StrId(0)); 2],
        }
    }

    /// Forgets the conversions logged in `cache_journal` (the fast path gave up).
    pub fn forget_journal(&mut self) {
        if let Some(journal) = &mut self.cache_journal {
            for &(stack, id) in journal.iter() {
                let cache = if stack {
                    &mut self.stack_cache
                } else {
                    &mut self.frame_cache
                };
                cache[id as usize] = NONE;
            }
            journal.clear();
        }
    }

    /// The frame a frame dict node was read as, if it was.
    #[inline]
    pub fn cached_frame(&self, id: u32) -> Option<FrameId> {
        let cached = *self.frame_cache.get(id as usize)?;
        (cached != NONE).then_some(FrameId(cached))
    }

    pub fn intern_stack(&mut self, frames: &[FrameId]) -> StackId {
        self.snap.stacks.intern(frames)
    }

    /// Whether a node was already read as a stack or a frame (so it must not change).
    pub fn is_frozen(&self, id: u32) -> bool {
        let cached = |cache: &[u32]| cache.get(id as usize).is_some_and(|&c| c != NONE);
        cached(&self.stack_cache) || cached(&self.frame_cache)
    }
}

/// Strings the VM recognises once, as it reads them: the keys of a trace entry and the action
/// names. Memoized strings are read once and referenced many times, so matching bytes per
/// use would be the reader's hottest work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Sym {
    Other,
    Action,
    Addr,
    DeviceFree,
    Size,
    Stream,
    TimeUs,
    CompileContext,
    UserMetadata,
    InternalMetadata,
    Frames,
    ForwardFrames,
    ActAlloc,
    ActFreeRequested,
    ActFreeCompleted,
    ActSegmentAlloc,
    ActSegmentFree,
    ActSegmentMap,
    ActSegmentUnmap,
    ActSnapshot,
    ActOom,
    ActAnnotate,
    ActFree,
}

impl Sym {
    /// What a string read from the input is.
    #[inline]
    pub fn classify(bytes: &[u8]) -> Sym {
        match bytes {
            b"action" => Sym::Action,
            b"addr" => Sym::Addr,
            b"device_free" => Sym::DeviceFree,
            b"size" => Sym::Size,
            b"stream" => Sym::Stream,
            b"time_us" => Sym::TimeUs,
            b"compile_context" => Sym::CompileContext,
            b"user_metadata" => Sym::UserMetadata,
            b"internal_metadata" => Sym::InternalMetadata,
            b"frames" => Sym::Frames,
            b"forward_frames" => Sym::ForwardFrames,
            b"alloc" => Sym::ActAlloc,
            b"free_requested" => Sym::ActFreeRequested,
            b"free_completed" => Sym::ActFreeCompleted,
            b"segment_alloc" => Sym::ActSegmentAlloc,
            b"segment_free" => Sym::ActSegmentFree,
            b"segment_map" => Sym::ActSegmentMap,
            b"segment_unmap" => Sym::ActSegmentUnmap,
            b"snapshot" => Sym::ActSnapshot,
            b"oom" => Sym::ActOom,
            b"annotate" => Sym::ActAnnotate,
            b"free" => Sym::ActFree,
            _ => Sym::Other,
        }
    }

    /// The symbol with discriminant `n` (`Other` for anything else).
    pub(crate) fn from_u8(n: u8) -> Sym {
        const ALL: [Sym; 23] = [
            Sym::Other,
            Sym::Action,
            Sym::Addr,
            Sym::DeviceFree,
            Sym::Size,
            Sym::Stream,
            Sym::TimeUs,
            Sym::CompileContext,
            Sym::UserMetadata,
            Sym::InternalMetadata,
            Sym::Frames,
            Sym::ForwardFrames,
            Sym::ActAlloc,
            Sym::ActFreeRequested,
            Sym::ActFreeCompleted,
            Sym::ActSegmentAlloc,
            Sym::ActSegmentFree,
            Sym::ActSegmentMap,
            Sym::ActSegmentUnmap,
            Sym::ActSnapshot,
            Sym::ActOom,
            Sym::ActAnnotate,
            Sym::ActFree,
        ];
        ALL.get(usize::from(n)).copied().unwrap_or(Sym::Other)
    }

    /// The action a known action name stands for.
    pub(crate) fn action(self) -> Option<Action> {
        Some(match self {
            Sym::ActAlloc => Action::Alloc,
            Sym::ActFreeRequested => Action::FreeRequested,
            Sym::ActFreeCompleted => Action::FreeCompleted,
            Sym::ActSegmentAlloc => Action::SegmentAlloc,
            Sym::ActSegmentFree => Action::SegmentFree,
            Sym::ActSegmentMap => Action::SegmentMap,
            Sym::ActSegmentUnmap => Action::SegmentUnmap,
            Sym::ActSnapshot => Action::Snapshot,
            Sym::ActOom => Action::Oom,
            Sym::ActAnnotate => Action::Annotate,
            Sym::ActFree => Action::Free,
            _ => return None,
        })
    }
}

pub(crate) struct Conv<'b> {
    arena: &'b Arena,
    st: &'b mut ConvState,
    path: Vec<Seg>,
}

/// Converts a whole arena.
pub(crate) fn convert(arena: &Arena, mut state: ConvState) -> Result<Snapshot> {
    let mut conv = Conv::new(arena, &mut state);
    conv.top(arena.root)?;
    Ok(state.snap)
}

/// Keys of a dict in order, with their values.
type Pairs = Vec<(Val, Val)>;

impl<'b> Conv<'b> {
    pub fn new(arena: &'b Arena, st: &'b mut ConvState) -> Self {
        Conv {
            arena,
            st,
            path: Vec::new(),
        }
    }

    fn path_string(&self) -> String {
        let mut s = String::new();
        for seg in &self.path {
            match seg {
                Seg::Key(k) => {
                    if !s.is_empty() {
                        s.push('.');
                    }
                    s.push_str(k);
                }
                Seg::Name(k) => {
                    if !s.is_empty() {
                        s.push('.');
                    }
                    s.push_str(k);
                }
                Seg::Index(i) => {
                    let _ = write!(s, "[{i}]");
                }
            }
        }
        if s.is_empty() {
            s.push_str("<top level>");
        }
        s
    }

    fn schema(&self, what: impl Into<String>) -> FormatError {
        FormatError::schema(self.path_string(), what)
    }

    fn charge(&mut self, n: u64) -> Result<()> {
        if self.st.budget < n {
            return Err(self.schema(
                "memo-shared containers expand to far more values than the input holds (memo bomb?)",
            ));
        }
        self.st.budget -= n;
        Ok(())
    }

    fn type_name(&self, v: Val) -> &'static str {
        self.arena.type_name(v)
    }

    fn expected(&self, what: &str, v: Val) -> FormatError {
        self.schema(format!("expected {what}, found {}", self.type_name(v)))
    }

    fn key_bytes(&self, v: Val) -> Option<&'b [u8]> {
        match v {
            Val::Str { start, len, .. } => Some(self.arena.bytes(start, len)),
            _ => None,
        }
    }

    fn str(&self, v: Val) -> Result<&'b str> {
        match v {
            // The VM validated it when it was read (and reported the byte offset).
            Val::Str { start, len, .. } => std::str::from_utf8(self.arena.bytes(start, len))
                .map_err(|_| self.schema("invalid UTF-8 in a string")),
            other => Err(self.expected("a str", other)),
        }
    }

    /// What the VM recognised a string as (`Sym::Other` for anything else, str or not).
    fn sym(v: Val) -> Sym {
        match v {
            Val::Str { sym, .. } => sym,
            _ => Sym::Other,
        }
    }

    /// Any int, exactly.
    fn int(&self, v: Val) -> Result<PyInt> {
        match v {
            Val::Int(i) => Ok(PyInt::Small(i)),
            Val::BigInt { start, len } => Ok(PyInt::from_le_bytes(self.arena.bytes(start, len))),
            other => Err(self.expected("an int", other)),
        }
    }

    /// An int for a typed field: its 64 bits, the exact value kept in `exact` if they do not
    /// say it all.
    #[inline]
    fn field(&self, v: Val, field: IntField, exact: &mut ExactInts) -> Result<u64> {
        match v {
            Val::Int(i) if exact.is_empty() && (i >= 0 || !field.is_unsigned()) => Ok(i as u64),
            _ => Ok(exact.store(field, self.int(v)?)),
        }
    }

    /// [`Conv::field`] under the key `key` of the error path.
    #[inline]
    fn int_at(
        &mut self,
        key: &'static str,
        v: Val,
        field: IntField,
        exact: &mut ExactInts,
    ) -> Result<u64> {
        if let Val::Int(i) = v {
            // A repeated key replaces an earlier exact value, as in a Python dict.
            if exact.is_empty() && (i >= 0 || !field.is_unsigned()) {
                return Ok(i as u64);
            }
        }
        self.at(Seg::Key(key), |c| c.field(v, field, exact))
    }

    /// Fills an int setting once; `false` (keep it in `extra`) for a repeat or a non-int.
    fn set_int(&self, slot: &mut Option<PyInt>, v: Val) -> bool {
        if slot.is_some() {
            return false;
        }
        *slot = self.int(v).ok();
        slot.is_some()
    }

    fn bool(&self, v: Val) -> Result<bool> {
        match v {
            Val::Bool(b) => Ok(b),
            other => Err(self.expected("a bool", other)),
        }
    }

    fn node_of(&self, v: Val, kind: Kind, what: &str) -> Result<u32> {
        match v {
            Val::Node(id) if self.arena.node(id).kind == kind => Ok(id),
            other => Err(self.expected(what, other)),
        }
    }

    fn list(&self, v: Val) -> Result<u32> {
        self.node_of(v, Kind::List, "a list")
    }

    fn dict_pairs(&self, v: Val) -> Result<Pairs> {
        if self.arena.entry_of(v).is_some() {
            return Err(self.schema("expected a dict of another kind, found a trace entry"));
        }
        let id = self.node_of(v, Kind::Dict, "a dict")?;
        let mut items = self.arena.items(id);
        let mut out = Vec::with_capacity(self.arena.node(id).len as usize / 2);
        while let (Some(k), Some(v)) = (items.next(), items.next()) {
            out.push((k, v));
        }
        Ok(out)
    }

    /// Runs `f` with `seg` appended to the error path.
    #[inline]
    fn at<T>(&mut self, seg: Seg, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.path.push(seg);
        let r = f(self)?;
        self.path.pop();
        Ok(r)
    }

    /// An unknown key's name (non-str keys of typed dicts are schema errors).
    fn key_name(&self, k: Val) -> Result<String> {
        match k {
            Val::Str { .. } => Ok(self.str(k)?.to_owned()),
            other => Err(self.schema(format!(
                "dict key is a {}, expected str",
                self.type_name(other)
            ))),
        }
    }

    fn extra(&mut self, k: Val, v: Val, out: &mut Extras) -> Result<()> {
        let name = self.key_name(k)?;
        let value = self.at(Seg::Name(name.clone()), |c| c.value(v, 0))?;
        out.push((name, value));
        Ok(())
    }

    // ---------------------------------------------------------------- generic values

    pub(crate) fn value(&mut self, v: Val, depth: usize) -> Result<Value> {
        self.charge(1)?;
        Ok(match v {
            Val::None => Value::None,
            Val::Bool(b) => Value::Bool(b),
            Val::Int(i) => Value::Int(i),
            Val::BigInt { start, len } => Value::BigInt(self.arena.bytes(start, len).to_vec()),
            Val::Float(f) => Value::Float(f),
            Val::Str { .. } => Value::Str(self.str(v)?.to_owned()),
            Val::Bytes { start, len } => Value::Bytes(self.arena.bytes(start, len).to_vec()),
            Val::Entry(_) => {
                let entry = self.entry(v)?;
                self.entry_value(&entry)?
            }
            Val::Stack(sid) => {
                let sid = StackId(sid);
                self.charge(self.st.snap.stacks.get(sid).len() as u64)?;
                self.stack_value(sid)
            }
            Val::Node(_) if self.arena.entry_of(v).is_some() => {
                let entry = self.entry(v)?;
                self.entry_value(&entry)?
            }
            Val::Node(id) => {
                if depth >= MAX_DEPTH {
                    return Err(
                        self.schema(format!("containers nested deeper than {MAX_DEPTH} levels"))
                    );
                }
                let node = *self.arena.node(id);
                self.charge(node.len.into())?;
                let items: Vec<Val> = self.arena.items(id).collect();
                match node.kind {
                    Kind::Entry => unreachable!("handled above"),
                    Kind::List | Kind::Tuple => {
                        let mut out = Vec::with_capacity(items.len());
                        for (i, item) in items.into_iter().enumerate() {
                            out.push(self.at(Seg::Index(i), |c| c.value(item, depth + 1))?);
                        }
                        if node.kind == Kind::List {
                            Value::List(out)
                        } else {
                            Value::Tuple(out)
                        }
                    }
                    Kind::Dict => {
                        let mut out = Vec::with_capacity(items.len() / 2);
                        for pair in items.chunks_exact(2) {
                            let key = self.value(pair[0], depth + 1)?;
                            let seg = match &key {
                                Value::Str(s) => Seg::Name(s.clone()),
                                _ => Seg::Name(format!("<{} key>", key.type_name())),
                            };
                            let val = self.at(seg, |c| c.value(pair[1], depth + 1))?;
                            out.push((key, val));
                        }
                        Value::Dict(out)
                    }
                }
            }
        })
    }

    fn string_list(&mut self, v: Val) -> Result<Vec<String>> {
        let id = self.list(v)?;
        self.charge(self.arena.node(id).len.into())?;
        let items: Vec<Val> = self.arena.items(id).collect();
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            out.push(self.at(Seg::Index(i), |c| c.str(item).map(str::to_owned))?);
        }
        Ok(out)
    }

    // ---------------------------------------------------------------- frames and stacks

    pub(crate) fn stack(&mut self, v: Val) -> Result<StackId> {
        if let Val::Stack(sid) = v {
            return Ok(StackId(sid));
        }
        let id = self.list(v)?;
        if id as usize >= self.st.stack_cache.len() {
            self.st.stack_cache.resize(self.arena.nodes.len(), NONE);
        }
        let cached = self.st.stack_cache[id as usize];
        if cached != NONE {
            return Ok(StackId(cached));
        }
        let frames: Vec<Val> = self.arena.items(id).collect();
        let sid = self.stack_of_frames(&frames)?;
        self.st.stack_cache[id as usize] = sid.0;
        if let Some(journal) = &mut self.st.cache_journal {
            journal.push((true, id));
        }
        Ok(sid)
    }

    /// The stack of a frames list given as its frame dicts.
    pub(crate) fn stack_of_frames(&mut self, frames: &[Val]) -> Result<StackId> {
        let mut buf = std::mem::take(&mut self.st.frame_buf);
        buf.clear();
        for (i, &item) in frames.iter().enumerate() {
            // A frame dict already read (nearly all of them): no error path to set up.
            if let Val::Node(id) = item {
                if let Some(frame) = self.st.cached_frame(id) {
                    buf.push(frame);
                    continue;
                }
            }
            match self.at(Seg::Index(i), |c| c.frame(item)) {
                Ok(fid) => buf.push(fid),
                Err(e) => {
                    self.st.frame_buf = buf;
                    return Err(e);
                }
            }
        }
        let sid = self.st.snap.stacks.intern(&buf);
        self.st.frame_buf = buf;
        Ok(sid)
    }

    pub(crate) fn frame(&mut self, v: Val) -> Result<FrameId> {
        let id = self.node_of(v, Kind::Dict, "a frame dict")?;
        if id as usize >= self.st.frame_cache.len() {
            self.st.frame_cache.resize(self.arena.nodes.len(), NONE);
        }
        let cached = self.st.frame_cache[id as usize];
        if cached != NONE {
            return Ok(FrameId(cached));
        }
        let (mut name, mut filename, mut line) = (None, None, None);
        let mut extra = Extras::new();
        for (k, v) in self.dict_pairs(v)? {
            match self.key_bytes(k) {
                Some(b"name") => name = Some(self.at(Seg::Key("name"), |c| c.str(v))?),
                Some(b"filename") => filename = Some(self.at(Seg::Key("filename"), |c| c.str(v))?),
                Some(b"line") => line = Some(self.at(Seg::Key("line"), |c| c.int(v))?),
                _ => self.extra(k, v, &mut extra)?,
            }
        }
        let (Some(name), Some(filename), Some(line)) = (name, filename, line) else {
            return Err(self.schema("frame lacks one of the keys 'name', 'filename', 'line'"));
        };
        let frame = Frame {
            name: name.to_owned(),
            filename: filename.to_owned(),
            line,
            extra,
        };
        let fid = self.st.snap.frames.intern(frame);
        self.st.frame_cache[id as usize] = fid.0;
        if let Some(journal) = &mut self.st.cache_journal {
            journal.push((false, id));
        }
        Ok(fid)
    }

    // ---------------------------------------------------------------- top level

    fn top(&mut self, root: Val) -> Result<()> {
        match root {
            Val::Node(id) if self.arena.node(id).kind == Kind::List => {
                self.st.snap.shape = Shape::SegmentList;
                self.st.snap.segments = self.segments(root)?;
                Ok(())
            }
            Val::Node(id) if self.arena.node(id).kind == Kind::Dict => {
                let mut segments = None;
                for (k, v) in self.dict_pairs(root)? {
                    match self.key_bytes(k) {
                        Some(b"segments") => {
                            segments = Some(self.at(Seg::Key("segments"), |c| c.segments(v))?)
                        }
                        Some(b"device_traces") => {
                            let traces = self.at(Seg::Key("device_traces"), |c| c.traces(v))?;
                            self.st.snap.device_traces = Some(traces);
                        }
                        Some(b"allocator_settings") => {
                            let s = self.at(Seg::Key("allocator_settings"), |c| c.settings(v))?;
                            self.st.snap.allocator_settings = Some(s);
                        }
                        Some(b"external_annotations") => {
                            let a =
                                self.at(Seg::Key("external_annotations"), |c| c.annotations(v))?;
                            self.st.snap.external_annotations = Some(a);
                        }
                        Some(b"host_segments") => {
                            let h = self.at(Seg::Key("host_segments"), |c| c.value(v, 0))?;
                            self.st.snap.host_segments = Some(h);
                        }
                        Some(b"host_traces") => {
                            let h = self.at(Seg::Key("host_traces"), |c| c.value(v, 0))?;
                            self.st.snap.host_traces = Some(h);
                        }
                        Some(b"memsnap") => {
                            let r = self.at(Seg::Key("memsnap"), |c| c.recorder_info(v))?;
                            self.st.snap.recorder_info = Some(r);
                        }
                        _ => {
                            let mut extra = std::mem::take(&mut self.st.snap.extra);
                            self.extra(k, v, &mut extra)?;
                            self.st.snap.extra = extra;
                        }
                    }
                }
                self.st.snap.segments = segments
                    .ok_or_else(|| self.schema("the snapshot dict has no 'segments' key"))?;
                Ok(())
            }
            other => Err(self.expected("a snapshot dict or a segment list", other)),
        }
    }

    fn recorder_info(&mut self, v: Val) -> Result<RecorderInfo> {
        let mut info = RecorderInfo::default();
        let mut producer = None;
        for (k, v) in self.dict_pairs(v)? {
            match self.key_bytes(k) {
                Some(b"producer") => {
                    producer = Some(self.at(Seg::Key("producer"), |c| c.str(v))?.to_owned())
                }
                Some(b"dropped_entries") => {
                    let exact: Vec<PyInt> = self.at(Seg::Key("dropped_entries"), |c| {
                        let id = c.list(v)?;
                        c.charge(c.arena.node(id).len.into())?;
                        let items: Vec<Val> = c.arena.items(id).collect();
                        items
                            .into_iter()
                            .enumerate()
                            .map(|(i, x)| c.at(Seg::Index(i), |c| c.int(x)))
                            .collect()
                    })?;
                    info.set_dropped_entries(exact);
                }
                _ => self.extra(k, v, &mut info.extra)?,
            }
        }
        info.producer = producer.ok_or_else(|| self.schema("missing key 'producer'"))?;
        Ok(info)
    }

    // ---------------------------------------------------------------- segments and blocks

    fn segments(&mut self, v: Val) -> Result<Vec<Segment>> {
        let id = self.list(v)?;
        self.charge(self.arena.node(id).len.into())?;
        let items: Vec<Val> = self.arena.items(id).collect();
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            out.push(self.at(Seg::Index(i), |c| c.segment(item))?);
        }
        Ok(out)
    }

    fn segment(&mut self, v: Val) -> Result<Segment> {
        let (mut device, mut address, mut total_size, mut stream) = (None, None, None, None);
        let mut seg = Segment::new(0, 0, 0, 0);
        seg.allocated_size = None;
        seg.active_size = None;
        seg.requested_size = None;
        seg.segment_type = None;
        seg.segment_pool_id = None;
        seg.is_expandable = None;
        let mut blocks = None;
        for (k, v) in self.dict_pairs(v)? {
            match self.key_bytes(k) {
                Some(b"device") => {
                    device =
                        Some(self.int_at("device", v, IntField::Device, &mut seg.exact)? as i64)
                }
                Some(b"address") => {
                    address = Some(self.int_at("address", v, IntField::Address, &mut seg.exact)?)
                }
                Some(b"total_size") => {
                    total_size =
                        Some(self.int_at("total_size", v, IntField::TotalSize, &mut seg.exact)?)
                }
                Some(b"allocated_size") => {
                    seg.allocated_size = Some(self.int_at(
                        "allocated_size",
                        v,
                        IntField::AllocatedSize,
                        &mut seg.exact,
                    )?)
                }
                Some(b"active_size") => {
                    seg.active_size =
                        Some(self.int_at("active_size", v, IntField::ActiveSize, &mut seg.exact)?)
                }
                Some(b"requested_size") => {
                    seg.requested_size = Some(self.int_at(
                        "requested_size",
                        v,
                        IntField::RequestedSize,
                        &mut seg.exact,
                    )?)
                }
                Some(b"stream") => {
                    stream =
                        Some(self.int_at("stream", v, IntField::Stream, &mut seg.exact)? as i64)
                }
                Some(b"segment_type") => {
                    let t = self.at(Seg::Key("segment_type"), |c| c.str(v))?;
                    seg.segment_type = Some(
                        SegmentType::from_name(t)
                            .unwrap_or_else(|| SegmentType::Other(self.st.snap.strings.intern(t))),
                    );
                }
                Some(b"segment_pool_id") => {
                    let mut exact = std::mem::take(&mut seg.exact);
                    seg.segment_pool_id =
                        Some(self.at(Seg::Key("segment_pool_id"), |c| c.pool_id(v, &mut exact))?);
                    seg.exact = exact;
                }
                Some(b"is_expandable") => {
                    seg.is_expandable = Some(self.at(Seg::Key("is_expandable"), |c| c.bool(v))?)
                }
                Some(b"frames") => {
                    seg.frames = Some(self.at(Seg::Key("frames"), |c| c.stack(v))?);
                    seg.frames_after_blocks = blocks.is_some();
                }
                Some(b"blocks") => blocks = Some(self.at(Seg::Key("blocks"), |c| c.blocks(v))?),
                _ => self.extra(k, v, &mut seg.extra)?,
            }
        }
        let missing = |c: &Self, key: &str| c.schema(format!("segment lacks key '{key}'"));
        seg.device = device.ok_or_else(|| missing(self, "device"))?;
        seg.address = address.ok_or_else(|| missing(self, "address"))?;
        seg.total_size = total_size.ok_or_else(|| missing(self, "total_size"))?;
        seg.stream = stream.ok_or_else(|| missing(self, "stream"))?;
        seg.blocks = blocks.ok_or_else(|| missing(self, "blocks"))?;
        Ok(seg)
    }

    fn pool_id(&mut self, v: Val, exact: &mut ExactInts) -> Result<(i64, i64)> {
        let id = self.node_of(v, Kind::Tuple, "a (int, int) tuple")?;
        let items: Vec<Val> = self.arena.items(id).take(3).collect();
        match items[..] {
            [a, b] => Ok((
                self.field(a, IntField::PoolId0, exact)? as i64,
                self.field(b, IntField::PoolId1, exact)? as i64,
            )),
            _ => Err(self.schema(format!(
                "expected a 2-tuple, found {} items",
                self.arena.node(id).len
            ))),
        }
    }

    fn blocks(&mut self, v: Val) -> Result<Vec<Block>> {
        let id = self.list(v)?;
        self.charge(self.arena.node(id).len.into())?;
        let items: Vec<Val> = self.arena.items(id).collect();
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            out.push(self.at(Seg::Index(i), |c| c.block(item))?);
        }
        Ok(out)
    }

    fn block(&mut self, v: Val) -> Result<Block> {
        let mut b = Block::default();
        let (mut size, mut state) = (None, None);
        for (k, v) in self.dict_pairs(v)? {
            match self.key_bytes(k) {
                Some(b"address") => {
                    b.address = Some(self.int_at("address", v, IntField::Address, &mut b.exact)?)
                }
                Some(b"size") => {
                    size = Some(self.int_at("size", v, IntField::Size, &mut b.exact)?)
                }
                Some(b"requested_size") => {
                    b.requested_size = Some(self.int_at(
                        "requested_size",
                        v,
                        IntField::RequestedSize,
                        &mut b.exact,
                    )?)
                }
                Some(b"state") => {
                    let s = self.at(Seg::Key("state"), |c| c.str(v))?;
                    state = Some(
                        BlockState::from_name(s)
                            .unwrap_or_else(|| BlockState::Other(self.st.snap.strings.intern(s))),
                    );
                }
                Some(b"frames") => b.frames = Some(self.at(Seg::Key("frames"), |c| c.stack(v))?),
                Some(b"forward_frames") => {
                    b.forward_frames =
                        Some(self.at(Seg::Key("forward_frames"), |c| c.string_list(v))?)
                }
                Some(b"history") => {
                    b.history = Some(self.at(Seg::Key("history"), |c| c.history(v))?)
                }
                _ => self.extra(k, v, &mut b.extra)?,
            }
        }
        b.size = size.ok_or_else(|| self.schema("block lacks key 'size'"))?;
        b.state = state.ok_or_else(|| self.schema("block lacks key 'state'"))?;
        Ok(b)
    }

    fn history(&mut self, v: Val) -> Result<Vec<HistoryItem>> {
        let id = self.list(v)?;
        self.charge(self.arena.node(id).len.into())?;
        let items: Vec<Val> = self.arena.items(id).collect();
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            out.push(self.at(Seg::Index(i), |c| {
                let mut h = HistoryItem {
                    addr: 0,
                    real_size: 0,
                    frames: None,
                    extra: Extras::new(),
                    exact: ExactInts::default(),
                };
                let (mut addr, mut real_size) = (None, None);
                for (k, v) in c.dict_pairs(item)? {
                    match c.key_bytes(k) {
                        Some(b"addr") => {
                            addr = Some(c.int_at("addr", v, IntField::Addr, &mut h.exact)?)
                        }
                        Some(b"real_size") => {
                            real_size =
                                Some(c.int_at("real_size", v, IntField::RealSize, &mut h.exact)?)
                        }
                        Some(b"frames") => {
                            h.frames = Some(c.at(Seg::Key("frames"), |c| c.stack(v))?)
                        }
                        _ => c.extra(k, v, &mut h.extra)?,
                    }
                }
                h.addr = addr.ok_or_else(|| c.schema("history item lacks key 'addr'"))?;
                h.real_size =
                    real_size.ok_or_else(|| c.schema("history item lacks key 'real_size'"))?;
                Ok(h)
            })?);
        }
        Ok(out)
    }

    // ---------------------------------------------------------------- traces

    fn traces(&mut self, v: Val) -> Result<Vec<Vec<TraceEntry>>> {
        let id = self.list(v)?;
        let devices: Vec<Val> = self.arena.items(id).collect();
        self.charge(devices.len() as u64)?;
        let mut out = Vec::with_capacity(devices.len());
        for (d, dev) in devices.into_iter().enumerate() {
            out.push(self.at(Seg::Index(d), |c| c.trace(dev))?);
        }
        Ok(out)
    }

    fn trace(&mut self, v: Val) -> Result<Vec<TraceEntry>> {
        let lid = self.list(v)?;
        let len = self.arena.node(lid).len as usize;
        self.charge(len as u64)?;
        if len > 0
            && len == self.st.entries.len()
            && !self.st.entries_taken
            && self.holds_all_entries(lid)
        {
            // The common case: one list holds every entry the VM converted, in order.
            self.st.entries_taken = true;
            return Ok(std::mem::take(&mut self.st.entries));
        }
        let mut entries = Vec::with_capacity(len);
        for (i, item) in self.arena.items(lid).enumerate() {
            entries.push(self.at(Seg::Index(i), |c| c.entry(item))?);
        }
        Ok(entries)
    }

    /// The list's items are exactly the packed entries `0..n`, in order, each referenced once.
    fn holds_all_entries(&self, lid: u32) -> bool {
        self.arena
            .items(lid)
            .enumerate()
            .all(|(i, item)| self.arena.entry_of(item) == Some(i) && !self.arena.is_shared(item))
    }

    fn entry(&mut self, v: Val) -> Result<TraceEntry> {
        if let Some(index) = self.arena.entry_of(v) {
            return self
                .st
                .entries
                .get(index)
                .cloned()
                .ok_or_else(|| self.schema("trace entry referenced after it was moved"));
        }
        let id = self.node_of_dict(v, "a trace entry dict")?;
        let items: Vec<Val> = self.arena.items(id).collect();
        Ok(self.entry_from(&items)?.0)
    }

    fn node_of_dict(&self, v: Val, what: &str) -> Result<u32> {
        match v {
            Val::Node(id) if matches!(self.arena.node(id).kind, Kind::Dict | Kind::Entry) => Ok(id),
            other => Err(self.expected(what, other)),
        }
    }

    /// Converts a complete entry dict while reading, when it converts without error, has no
    /// unknown keys and its keys are in the order the writer would write them back.
    pub(crate) fn packed_entry(&mut self, pairs: &[Val]) -> Option<TraceEntry> {
        match self.entry_from(pairs) {
            Ok((entry, true)) => Some(entry),
            _ => None,
        }
    }

    /// A trace entry from its keys and values (interleaved); also says whether the dict is in
    /// canonical form (known keys only, in the writer's order).
    fn entry_from(&mut self, items: &[Val]) -> Result<(TraceEntry, bool)> {
        let mut e = TraceEntry::new(Action::Alloc, 0, 0, 0);
        let (mut action, mut addr, mut size, mut stream) = (None, None, None, None);
        let mut rare: Option<Box<EntryRare>> = None;
        let mut exact = ExactInts::default();
        let (mut canonical, mut last_rank) = (true, -1i32);
        for (i, pair) in items.chunks_exact(2).enumerate() {
            let (k, v) = (pair[0], pair[1]);
            let rank = match Self::sym(k) {
                Sym::Action => {
                    action = Some(match Self::sym(v).action() {
                        Some(known) => known,
                        None => {
                            let name = self.at(Seg::Key("action"), |c| c.str(v))?;
                            Action::from_name(name)
                                .unwrap_or_else(|| Action::Other(self.st.snap.strings.intern(name)))
                        }
                    });
                    1
                }
                Sym::Addr => {
                    addr = Some(self.int_at("addr", v, IntField::Addr, &mut exact)?);
                    2
                }
                Sym::DeviceFree => {
                    let f = self.int_at("device_free", v, IntField::DeviceFree, &mut exact)?;
                    rare.get_or_insert_with(Default::default).device_free = Some(f);
                    3
                }
                Sym::Size => {
                    size = Some(self.int_at("size", v, IntField::Size, &mut exact)?);
                    4
                }
                Sym::Stream => {
                    stream = Some(self.int_at("stream", v, IntField::Stream, &mut exact)? as i64);
                    5
                }
                Sym::TimeUs => {
                    e.time_us =
                        Some(self.int_at("time_us", v, IntField::TimeUs, &mut exact)? as i64);
                    6
                }
                Sym::CompileContext => {
                    e.compile_context =
                        Some(self.at(Seg::Key("compile_context"), |c| c.recent_str(v, 0))?);
                    7
                }
                Sym::UserMetadata => {
                    e.user_metadata =
                        Some(self.at(Seg::Key("user_metadata"), |c| c.recent_str(v, 1))?);
                    8
                }
                Sym::InternalMetadata => {
                    let s = self.at(Seg::Key("internal_metadata"), |c| c.str(v))?;
                    let s = self.st.snap.strings.intern(s);
                    rare.get_or_insert_with(Default::default).internal_metadata = Some(s);
                    9
                }
                Sym::Frames => {
                    e.frames = Some(self.at(Seg::Key("frames"), |c| c.stack(v))?);
                    if i == 0 {
                        rare.get_or_insert_with(Default::default)
                            .legacy_frames_first = true;
                        0
                    } else {
                        10
                    }
                }
                Sym::ForwardFrames => {
                    let f = self.at(Seg::Key("forward_frames"), |c| c.string_list(v))?;
                    rare.get_or_insert_with(Default::default).forward_frames = Some(f);
                    11
                }
                _ => {
                    let r = rare.get_or_insert_with(Default::default);
                    let mut extra = std::mem::take(&mut r.extra);
                    self.extra(k, v, &mut extra)?;
                    rare.as_mut().expect("just set").extra = extra;
                    canonical = false;
                    12
                }
            };
            canonical &= rank > last_rank;
            last_rank = rank;
        }
        e.action = action.ok_or_else(|| self.schema("trace entry lacks key 'action'"))?;
        e.size = size.ok_or_else(|| self.schema("trace entry lacks key 'size'"))?;
        e.stream = stream.ok_or_else(|| self.schema("trace entry lacks key 'stream'"))?;
        match addr {
            Some(a) => e.addr = a,
            None => rare.get_or_insert_with(Default::default).no_addr = true,
        }
        if !exact.is_empty() {
            rare.get_or_insert_with(Default::default).exact = exact;
        }
        e.rare = rare;
        Ok((e, canonical))
    }

    /// Interns a string through the one-entry cache `slot` of [`ConvState::recent_strs`].
    #[inline]
    pub(crate) fn recent_str(&mut self, v: Val, slot: usize) -> Result<StrId> {
        if let Val::Str { start, len, .. } = v {
            let (s0, l0, id) = self.st.recent_strs[slot];
            if l0 == len
                && (s0 == start || self.arena.bytes(s0, l0) == self.arena.bytes(start, len))
            {
                return Ok(id);
            }
        }
        let text = self.str(v)?;
        let id = self.st.snap.strings.intern(text);
        if let Val::Str { start, len, .. } = v {
            self.st.recent_strs[slot] = (start, len, id);
        }
        Ok(id)
    }

    /// A packed entry back as a generic dict, keys in the writer's order.
    fn entry_value(&mut self, e: &TraceEntry) -> Result<Value> {
        self.charge(16)?;
        let strings = &self.st.snap.strings;
        let s = |k: &str| Value::Str(k.to_owned());
        let mut d: Vec<(Value, Value)> = Vec::new();
        let rare = e.rare.as_deref();
        let legacy = rare.is_some_and(|r| r.legacy_frames_first);
        let frames = e.frames.map(|f| self.stack_value(f));
        if legacy {
            if let Some(f) = &frames {
                d.push((s("frames"), f.clone()));
            }
        }
        d.push((s("action"), s(e.action.name(strings))));
        let int = |field| e.exact_int(field).map(|v| v.to_value());
        if let Some(a) = int(IntField::Addr) {
            d.push((s("addr"), a));
        }
        if let Some(f) = int(IntField::DeviceFree) {
            d.push((s("device_free"), f));
        }
        for field in [IntField::Size, IntField::Stream, IntField::TimeUs] {
            if let Some(v) = int(field) {
                d.push((s(field.key()), v));
            }
        }
        if let Some(c) = e.compile_context {
            d.push((s("compile_context"), s(strings.get(c))));
        }
        if let Some(u) = e.user_metadata {
            d.push((s("user_metadata"), s(strings.get(u))));
        }
        if let Some(m) = rare.and_then(|r| r.internal_metadata) {
            d.push((s("internal_metadata"), s(strings.get(m))));
        }
        if !legacy {
            if let Some(f) = frames {
                d.push((s("frames"), f));
            }
        }
        if let Some(ff) = rare.and_then(|r| r.forward_frames.as_ref()) {
            d.push((
                s("forward_frames"),
                Value::List(ff.iter().map(|x| s(x)).collect()),
            ));
        }
        Ok(Value::Dict(d))
    }

    fn stack_value(&self, id: StackId) -> Value {
        let snap = &self.st.snap;
        Value::List(
            snap.stack_frames(id)
                .map(|f| {
                    let mut d = vec![
                        (Value::Str("name".into()), Value::Str(f.name.clone())),
                        (
                            Value::Str("filename".into()),
                            Value::Str(f.filename.clone()),
                        ),
                        (Value::Str("line".into()), f.line.to_value()),
                    ];
                    d.extend(
                        f.extra
                            .iter()
                            .map(|(k, v)| (Value::Str(k.clone()), v.clone())),
                    );
                    Value::Dict(d)
                })
                .collect(),
        )
    }

    // ---------------------------------------------------------------- settings, annotations

    fn settings(&mut self, v: Val) -> Result<AllocatorSettings> {
        let mut s = AllocatorSettings::default();
        for (k, v) in self.dict_pairs(v)? {
            // A known key with an unexpected type is kept in `extra` rather than rejected.
            let kept = match self.key_bytes(k) {
                Some(b"PYTORCH_CUDA_ALLOC_CONF") if s.alloc_conf.is_none() => {
                    if let Val::Str { .. } = v {
                        s.alloc_conf = Some(self.str(v)?.to_owned());
                    }
                    s.alloc_conf.is_some()
                }
                Some(b"max_split_size") => self.set_int(&mut s.max_split_size, v),
                Some(b"garbage_collection_threshold") => match v {
                    Val::Float(f) if s.garbage_collection_threshold.is_none() => {
                        s.garbage_collection_threshold = Some(f);
                        true
                    }
                    _ => false,
                },
                Some(b"expandable_segments") => set_bool(&mut s.expandable_segments, v),
                Some(b"pinned_num_register_threads") => {
                    self.set_int(&mut s.pinned_num_register_threads, v)
                }
                Some(b"release_lock_on_cudamalloc") => {
                    set_bool(&mut s.release_lock_on_cudamalloc, v)
                }
                Some(b"pinned_use_cuda_host_register") => {
                    set_bool(&mut s.pinned_use_cuda_host_register, v)
                }
                Some(b"graph_capture_record_stream_reuse") => {
                    set_bool(&mut s.graph_capture_record_stream_reuse, v)
                }
                Some(b"roundup_power2_divisions") if s.roundup_power2_divisions.is_none() => {
                    match self.divisions(v)? {
                        Some(d) => {
                            s.roundup_power2_divisions = Some(d);
                            true
                        }
                        None => false,
                    }
                }
                Some(b"max_round_threshold") => self.set_int(&mut s.max_round_threshold, v),
                Some(b"max_cached_size") => self.set_int(&mut s.max_cached_size, v),
                _ => false,
            };
            if !kept {
                self.extra(k, v, &mut s.extra)?;
            }
        }
        Ok(s)
    }

    /// `{'1': 0, '2': 0, ...}`, or `None` when it has another shape (then kept as a value).
    fn divisions(&mut self, v: Val) -> Result<Option<Vec<(String, PyInt)>>> {
        let Val::Node(id) = v else { return Ok(None) };
        if self.arena.node(id).kind != Kind::Dict {
            return Ok(None);
        }
        let pairs = self.dict_pairs(v)?;
        self.charge(pairs.len() as u64)?;
        let mut out = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            match (k, v) {
                (Val::Str { .. }, Val::Int(_) | Val::BigInt { .. }) => {
                    out.push((self.str(k)?.to_owned(), self.int(v)?))
                }
                _ => return Ok(None),
            }
        }
        Ok(Some(out))
    }

    fn annotations(&mut self, v: Val) -> Result<Vec<Annotation>> {
        let id = self.list(v)?;
        self.charge(self.arena.node(id).len.into())?;
        let items: Vec<Val> = self.arena.items(id).collect();
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            out.push(self.at(Seg::Index(i), |c| c.annotation(item))?);
        }
        Ok(out)
    }

    fn annotation(&mut self, v: Val) -> Result<Annotation> {
        let (mut device, mut time_us) = (None, None);
        let mut metadata = Vec::new();
        let mut extra = Extras::new();
        let mut exact = ExactInts::default();
        for (k, v) in self.dict_pairs(v)? {
            match self.key_bytes(k) {
                Some(b"device") if device.is_none() => {
                    device = Some(self.int_at("device", v, IntField::Device, &mut exact)? as i64)
                }
                Some(b"time_us") if time_us.is_none() => {
                    time_us = Some(self.int_at("time_us", v, IntField::TimeUs, &mut exact)? as i64)
                }
                _ if device.is_none() && time_us.is_none() => self.extra(k, v, &mut metadata)?,
                _ => self.extra(k, v, &mut extra)?,
            }
        }
        Ok(Annotation {
            metadata,
            device: device.ok_or_else(|| self.schema("annotation lacks key 'device'"))?,
            time_us: time_us.ok_or_else(|| self.schema("annotation lacks key 'time_us'"))?,
            extra,
            exact,
        })
    }
}

fn set_bool(slot: &mut Option<bool>, v: Val) -> bool {
    match v {
        Val::Bool(b) if slot.is_none() => {
            *slot = Some(b);
            true
        }
        _ => false,
    }
}
