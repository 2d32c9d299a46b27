//! The conversion pass: object graph ([`Arena`]) to the typed, interned [`Snapshot`].
//!
//! Memo-shared frame lists and frame dicts are converted once: a per-node cache maps a list
//! node to its [`StackId`] and a frame dict node to its [`FrameId`]. Everything else that is
//! expanded (segments, blocks, entries, unknown keys as [`Value`]) is charged to a budget
//! proportional to the input, so a memo bomb cannot make us allocate without bound.
//!
//! What each key of the snapshot means is the schema's read side ([`schema`]); [`Conv`]
//! implements its [`Source`] over the VM's values (and keeps the list of all trace entries the
//! VM converted while reading, and the per-node caches).

use std::fmt::Write as _;

use crate::error::{FormatError, Result};
use crate::int::{ExactInts, IntField, PyInt};
use crate::intern::{FrameId, StackId, StrId, StrTable};
use crate::model::*;
use crate::schema::{self, EntryIn, Key, Setting, Source, ENTRY_RANK_UNKNOWN};
use crate::value::{Extras, Value};

use super::arena::{Arena, Kind, Val, NONE};
use super::sym::Sym;

/// Deepest nesting of unknown values we expand (and later drop) recursively; real snapshots
/// nest a few levels, and 256 levels fit in a 2 MiB thread stack even in debug builds.
pub(crate) const MAX_DEPTH: usize = 256;

/// Room for the first trace entries, before their bytes per entry are known.
const FIRST_ENTRIES: usize = 4096;

#[derive(Clone, Debug)]
enum Seg {
    Key(&'static str),
    Name(String),
    /// A key name still in the arena's string heap (`start`, `len`): spelled out only when an
    /// error needs the path (an unknown key's value is converted for every annotation).
    HeapName(usize, u32),
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
    /// Input offset and `entries.len()` when [`ConvState::push_entry`] first grew `entries`:
    /// the bytes per entry since then size the next growth.
    entries_grown_at: Option<(u64, usize)>,
    /// The last string interned per entry field (`compile_context`, `user_metadata`) as a
    /// heap range: consecutive entries nearly always repeat it, so this skips hashing it
    /// again (and the fast path stores a fresh copy's bytes only once).
    pub recent_strs: [RecentStr; 2],
}

/// A string interned through [`ConvState::recent_strs`]: its heap range, id, and what the VM
/// recognised it as.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecentStr {
    pub start: usize,
    pub len: u32,
    pub id: StrId,
    pub sym: Sym,
}

impl ConvState {
    /// The string table of the snapshot being built.
    #[inline]
    pub(crate) fn strings(&self) -> &StrTable {
        &self.snap.strings
    }

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
            entries_grown_at: None,
            recent_strs: [RecentStr {
                start: 0,
                len: u32::MAX,
                id: StrId::from_index(0),
                sym: Sym::Other,
            }; 2],
        }
    }

    /// Adds a trace entry that starts at input offset `at` of `total`.
    #[inline(always)]
    pub fn push_entry(&mut self, entry: TraceEntry, at: u64, total: u64) {
        if self.entries.len() == self.entries.capacity() {
            self.grow_entries(at, total);
        }
        self.entries.push(entry);
    }

    /// Makes room for the entries the rest of the input is likely to hold, at the bytes per
    /// entry read since the first growth. Growing by doubling copied the entries about once
    /// more and faulted in every new buffer's pages (a tenth of a 1M-entry load); this grows
    /// about once, to within a sixteenth. Pages reserved past the last entry are never
    /// touched, and the trace gives them back when it is taken (`Conv::trace`). When the
    /// estimate is low (entries get shorter further on) it still grows by at least half,
    /// so pushing stays amortised O(1); when the room cannot be had, `push` grows as usual.
    #[cold]
    #[inline(never)]
    fn grow_entries(&mut self, at: u64, total: u64) {
        let len = self.entries.len();
        let expected = match self.entries_grown_at {
            Some((from, from_len)) if len > from_len && at > from => {
                let per_entry = (at - from) / (len - from_len) as u64;
                let more = total.saturating_sub(at) / per_entry.max(1);
                usize::try_from(more + more / 16)
                    .unwrap_or(usize::MAX)
                    .min(NONE as usize)
            }
            _ => {
                self.entries_grown_at = Some((at, len));
                FIRST_ENTRIES
            }
        };
        let _ = self.entries.try_reserve_exact(expected.max(len / 2).max(1));
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
        (cached != NONE).then(|| FrameId::from_index(cached as usize))
    }

    /// The stack a list node was read as, if it was.
    #[inline]
    pub fn cached_stack(&self, id: u32) -> Option<StackId> {
        let cached = *self.stack_cache.get(id as usize)?;
        (cached != NONE).then(|| StackId::from_index(cached as usize))
    }

    /// The id of `v` if it is the string last interned through `slot` of `recent_strs`.
    #[inline(always)]
    pub fn recent_str_id(&self, arena: &Arena, v: Val, slot: usize) -> Option<StrId> {
        let Val::Str { start, len, .. } = v else {
            return None;
        };
        let r = self.recent_strs[slot];
        (r.len == len
            && (r.start == start || arena.bytes(r.start, r.len) == arena.bytes(start, len)))
        .then_some(r.id)
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
                Seg::HeapName(start, len) => {
                    if !s.is_empty() {
                        s.push('.');
                    }
                    s.push_str(&String::from_utf8_lossy(self.arena.bytes(*start, *len)));
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
        let seg = match k {
            Val::Str { start, len, .. } => Seg::HeapName(start, len),
            _ => Seg::Name(name.clone()),
        };
        let value = self.at(seg, |c| c.value(v, 0))?;
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
                let sid = StackId::from_index(sid as usize);
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
            return Ok(StackId::from_index(sid as usize));
        }
        let id = self.list(v)?;
        if id as usize >= self.st.stack_cache.len() {
            self.st.stack_cache.resize(self.arena.nodes.len(), NONE);
        }
        let cached = self.st.stack_cache[id as usize];
        if cached != NONE {
            return Ok(StackId::from_index(cached as usize));
        }
        let frames: Vec<Val> = self.arena.items(id).collect();
        let sid = self.stack_of_frames(&frames)?;
        self.st.stack_cache[id as usize] = sid.index() as u32;
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
            return Ok(FrameId::from_index(cached as usize));
        }
        let frame = schema::read_frame(self, v)?;
        let fid = self.st.snap.frames.intern(frame);
        self.st.frame_cache[id as usize] = fid.index() as u32;
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
                self.st.snap.segments = schema::segment_list(self, root)?;
                Ok(())
            }
            Val::Node(id) if self.arena.node(id).kind == Kind::Dict => {
                let mut snap = schema::snapshot_dict(self, root)?;
                schema::adopt_tables(&mut snap, &mut self.st.snap);
                self.st.snap = snap;
                Ok(())
            }
            other => Err(self.expected("a snapshot dict or a segment list", other)),
        }
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

    // ---------------------------------------------------------------- traces

    fn traces(&mut self, v: Val) -> Result<Vec<Vec<TraceEntry>>> {
        let id = self.list(v)?;
        let devices: Vec<Val> = self.arena.items(id).collect();
        self.charge(devices.len() as u64)?;
        if let Some(split) = self.split_entries_by_device(&devices)? {
            return Ok(split);
        }
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
            let mut entries = std::mem::take(&mut self.st.entries);
            // The room reserved for entries the input turned out not to hold.
            entries.shrink_to_fit();
            return Ok(entries);
        }
        let mut entries = Vec::with_capacity(len);
        for (i, item) in self.arena.items(lid).enumerate() {
            entries.push(self.at(Seg::Index(i), |c| c.entry(item))?);
        }
        Ok(entries)
    }

    /// The list's items are exactly the packed entries `0..n`, in order, each referenced once.
    fn holds_all_entries(&self, lid: u32) -> bool {
        self.holds_entries_from(lid, 0)
    }

    /// The list's items are exactly the packed entries `start..start + n`, in order, each
    /// referenced once.
    fn holds_entries_from(&self, lid: u32, start: usize) -> bool {
        // (Entries are counted in u32: a start past that holds none of them.)
        u32::try_from(start).is_ok_and(|s| self.arena.is_entry_run(lid, s))
    }

    /// Several devices' traces whose lists hold the packed entries one run after the other,
    /// in order and each once (how PyTorch and memsnap write them), split into the devices'
    /// vectors without two copies of the entries at once: from the last device back, each
    /// run is copied out and the packed vector shrunk to the runs before it (a large vector
    /// shrinks in place, its tail returned to the system); the first device keeps the
    /// vector. Peak: the entries and the largest device's run; copying every device's run
    /// out of the packed vector held both whole (an 8-device, 10M-entry file: 96% more than
    /// the entries at the load's peak). `None` for any other layout, read item by item.
    ///
    /// O(d + c) for d devices and c chunks, plus the copy of every device's entries but
    /// the first.
    fn split_entries_by_device(&mut self, devices: &[Val]) -> Result<Option<Vec<Vec<TraceEntry>>>> {
        if devices.len() < 2 || self.st.entries_taken {
            return Ok(None);
        }
        let mut runs = Vec::with_capacity(devices.len());
        let mut next = 0usize;
        for &device in devices {
            let Val::Node(lid) = device else {
                return Ok(None);
            };
            let node = self.arena.node(lid);
            if node.kind != Kind::List {
                return Ok(None);
            }
            let len = node.len as usize;
            if !self.holds_entries_from(lid, next) {
                return Ok(None);
            }
            runs.push(len);
            next += len;
        }
        if next != self.st.entries.len() {
            return Ok(None);
        }
        for &len in &runs {
            self.charge(len as u64)?;
        }
        self.st.entries_taken = true;
        let mut packed = std::mem::take(&mut self.st.entries);
        let mut out = vec![Vec::new(); devices.len()];
        for (device, &len) in runs.iter().enumerate().skip(1).rev() {
            let start = packed.len() - len;
            out[device] = packed[start..].to_vec();
            packed.truncate(start);
            packed.shrink_to_fit();
        }
        packed.shrink_to_fit();
        out[0] = packed;
        Ok(Some(out))
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
        let mut entry = EntryIn::new();
        let (mut canonical, mut last_rank) = (true, -1i16);
        for pair in items.chunks_exact(2) {
            let (k, v) = (pair[0], pair[1]);
            let rank = entry.key(self, Self::sym(k).key(), k, v)?;
            canonical &= rank != ENTRY_RANK_UNKNOWN && i16::from(rank) > last_rank;
            last_rank = i16::from(rank);
        }
        Ok((entry.finish(self)?, canonical))
    }

    /// Interns a string through the one-entry cache `slot` of [`ConvState::recent_strs`].
    #[inline]
    pub(crate) fn recent_str(&mut self, v: Val, slot: usize) -> Result<StrId> {
        if let Some(id) = self.st.recent_str_id(self.arena, v, slot) {
            return Ok(id);
        }
        let text = self.str(v)?;
        let id = self.st.snap.strings.intern(text);
        if let Val::Str { start, len, sym } = v {
            self.st.recent_strs[slot] = RecentStr {
                start,
                len,
                id,
                sym,
            };
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
        d.push((s("action"), s(e.action_name(strings))));
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
        if let Some(c) = e.compile_context(strings) {
            d.push((s("compile_context"), s(strings.get(c))));
        }
        if let Some(u) = e.user_metadata(strings) {
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
            // A known key with an unexpected type (or a repeated one) is kept in `extra`.
            let kept = match schema::setting(&mut s, self.key_of(k)) {
                Some(Setting::Str(slot)) => match v {
                    Val::Str { .. } => {
                        *slot = Some(self.str(v)?.to_owned());
                        true
                    }
                    _ => false,
                },
                Some(Setting::Int(slot)) => {
                    *slot = self.int(v).ok();
                    slot.is_some()
                }
                Some(Setting::Float(slot)) => match v {
                    Val::Float(f) => {
                        *slot = Some(f);
                        true
                    }
                    _ => false,
                },
                Some(Setting::Bool(slot)) => match v {
                    Val::Bool(b) => {
                        *slot = Some(b);
                        true
                    }
                    _ => false,
                },
                Some(Setting::Divisions(slot)) => {
                    *slot = self.divisions(v)?;
                    slot.is_some()
                }
                None => false,
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

    /// The schema key a dict key is, if any.
    #[inline]
    fn key_of(&self, k: Val) -> Option<Key> {
        self.key_bytes(k).and_then(Key::of_bytes)
    }
}

/// The pickle converter reads the schema ([`schema`]'s read side) from the VM's values.
impl Source for Conv<'_> {
    #[inline]
    fn strings(&self) -> &StrTable {
        &self.st.snap.strings
    }

    type V = Val;
    type Name = Val;

    fn fail(&self, what: String) -> FormatError {
        self.schema(what)
    }

    fn missing(&self, what: &str, key: Key) -> FormatError {
        match key {
            Key::segments => self.schema("the snapshot dict has no 'segments' key"),
            Key::producer => self.schema("missing key 'producer'"),
            _ => self.schema(format!("{what} lacks key '{}'", key.text())),
        }
    }

    #[inline]
    fn at_key<T>(&mut self, key: Key, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.at(Seg::Key(key.text()), f)
    }

    fn get_dict(
        &mut self,
        v: Val,
        mut each: impl FnMut(&mut Self, Option<Key>, Val, Val) -> Result<()>,
    ) -> Result<()> {
        for (k, v) in self.dict_pairs(v)? {
            let key = self.key_of(k);
            each(self, key, k, v)?;
        }
        Ok(())
    }

    fn get_list<T>(
        &mut self,
        v: Val,
        mut item: impl FnMut(&mut Self, Val) -> Result<T>,
    ) -> Result<Vec<T>> {
        let id = self.list(v)?;
        self.charge(self.arena.node(id).len.into())?;
        let items: Vec<Val> = self.arena.items(id).collect();
        let mut out = Vec::with_capacity(items.len());
        for (i, x) in items.into_iter().enumerate() {
            out.push(self.at(Seg::Index(i), |c| item(c, x))?);
        }
        Ok(out)
    }

    #[inline]
    fn get_int(&mut self, v: Val) -> Result<PyInt> {
        self.int(v)
    }

    #[inline(always)]
    fn get_field(
        &mut self,
        key: Key,
        v: Val,
        field: IntField,
        exact: &mut ExactInts,
    ) -> Result<u64> {
        self.int_at(key.text(), v, field, exact)
    }

    fn get_string(&mut self, v: Val) -> Result<String> {
        self.str(v).map(str::to_owned)
    }

    #[inline]
    fn get_interned(&mut self, v: Val, slot: Option<usize>) -> Result<StrId> {
        match slot {
            Some(slot) => self.recent_str(v, slot),
            None => {
                let s = self.str(v)?;
                Ok(self.st.snap.strings.intern(s))
            }
        }
    }

    fn get_named<T>(
        &mut self,
        v: Val,
        known: fn(&str) -> Option<T>,
        other: fn(StrId) -> T,
    ) -> Result<T> {
        let name = self.str(v)?;
        Ok(known(name).unwrap_or_else(|| other(self.st.snap.strings.intern(name))))
    }

    /// A known action name was recognised when the VM read it.
    #[inline]
    fn get_action(&mut self, v: Val) -> Result<(Action, Option<StrId>)> {
        match Self::sym(v).action() {
            Some(known) => Ok((known, None)),
            None => self.get_named(
                v,
                |name| Action::from_name(name).map(|a| (a, None)),
                |id| (Action::Other, Some(id)),
            ),
        }
    }

    fn get_bool(&mut self, v: Val) -> Result<bool> {
        self.bool(v)
    }

    #[inline]
    fn get_stack(&mut self, v: Val) -> Result<StackId> {
        self.stack(v)
    }

    fn get_strings(&mut self, v: Val) -> Result<Vec<String>> {
        self.string_list(v)
    }

    fn get_value(&mut self, v: Val) -> Result<Value> {
        self.value(v, 0)
    }

    fn get_pool_id(&mut self, v: Val, exact: &mut ExactInts) -> Result<(i64, i64)> {
        self.pool_id(v, exact)
    }

    fn get_traces(&mut self, v: Val) -> Result<Vec<Vec<TraceEntry>>> {
        self.traces(v)
    }

    fn get_settings(&mut self, v: Val) -> Result<AllocatorSettings> {
        self.settings(v)
    }

    fn put_extra(&mut self, name: Val, v: Val, out: &mut Extras) -> Result<()> {
        self.extra(name, v, out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{feed::SliceFeed, vm};
    use super::*;
    use crate::model::Action;

    fn run(entries: u64) -> (Arena, ConvState, Snapshot) {
        let mut snap = Snapshot::new(1);
        let trace = (0..entries)
            .map(|i| TraceEntry::new(Action::Alloc, 0x7f00_0000_0000 + i * 512, 512, 0))
            .collect();
        snap.device_traces = Some(vec![trace]);
        let bytes = super::super::to_vec(&snap);
        let (arena, state) = vm::run(
            SliceFeed::new(&bytes),
            vm::Run {
                total: bytes.len() as u64,
                progress: &mut |_, _| true,
                observe: None,
                fast_entries: true,
                end_at: None,
            },
        )
        .expect("read");
        (arena, state, snap)
    }

    /// The first entry of a file is read before its keys are in the memo, so it is not
    /// the fast path's: it becomes an entry node in a chunk of its own kind. The trace list
    /// is still known to be the entries in order from its chunks (its million items used
    /// to be walked one by one, 2% of a load).
    #[test]
    fn a_trace_list_that_starts_with_entry_nodes_is_an_entry_run() {
        let (arena, state, _) = run(5_000);
        assert!(
            state.fast_entries < 5_000,
            "the first entry is not the fast path's"
        );
        assert!(state.fast_entries > 4_000);
        let trace = (0..arena.nodes.len() as u32)
            .find(|&id| arena.node(id).kind == Kind::List && arena.node(id).len == 5_000)
            .expect("the trace list");
        assert!(arena.is_entry_run(trace, 0));
        assert!(
            !arena.is_entry_run(trace, 1),
            "a run from 1 is not this list"
        );
    }

    /// The room reserved for entries the input might hold is given back when the trace
    /// is taken.
    #[test]
    fn the_taken_trace_holds_no_spare_room() {
        let (arena, state, snap) = run(50_000);
        let read = convert(&arena, state).expect("convert");
        let trace = &read.device_traces.as_ref().expect("traces")[0];
        assert_eq!(trace, &snap.device_traces.as_ref().expect("traces")[0]);
        assert_eq!(trace.capacity(), trace.len());
    }
}
