//! The trace-entry fast path of the pickle reader.
//!
//! Nearly all of a snapshot pickle is trace entries, and nearly every entry is laid out the
//! same way (by CPython's pickler in PyTorch's exporter, and by our writer). When the pickle
//! machine meets `EMPTY_DICT`, [`Machine::fast_entry`] tries to read the entry that follows straight
//! from the stream's window into a [`TraceEntry`], without the VM's stack, marks and
//! containers.
//!
//! ## The layout it accepts
//!
//! `EMPTY_DICT` (just read), an optional memo store of the dict (`MEMOIZE`, `BINPUT`,
//! `LONG_BINPUT`), `MARK`, then key/value pairs and `SETITEMS`, with `FRAME` headers allowed
//! anywhere in between (a frame boundary may fall inside an entry):
//!
//! * each key a memo reference (`BINGET`/`LONG_BINGET`) to a str the VM recognised as an
//!   entry key ([`Sym`]), the keys strictly in the writer's order (the schema's
//!   `ENTRY_ORDER`: `action`, `addr`, `size`, `stream`, `time_us`, `compile_context`,
//!   `user_metadata`, `frames`);
//!   `action`, `addr`, `size` and `stream` present;
//! * `action`: a memo reference to a known action name;
//! * `addr`, `size`: an int opcode (`BININT1`/`BININT2`/`BININT`, `LONG1` of at most 8
//!   bytes) with a non-negative value; `stream`, `time_us`: such an int of any sign;
//! * `compile_context`, `user_metadata`: a memoized str, or a fresh `SHORT_BINUNICODE`
//!   (optionally memoized);
//! * `frames`: a memo reference to a frames list or a frame list read before, or a fresh list
//!   (`EMPTY_LIST`, optional memo store, then `MARK` frame refs `APPENDS`, one ref `APPEND`,
//!   or nothing) whose items are memo references to frame dicts.
//!
//! Anything else gives up: an OOM entry (`device_free`), a rare or unknown key, keys in
//! another order, a negative address or a 9-byte `LONG1` (an exact-int override), another
//! value shape, a memo store the undo log cannot hold, or the end of the window.
//!
//! ## Where its time goes
//!
//! An entry is about 80 bytes and 18 opcodes. The decoding reads them from a borrowed
//! [`Window`] (a bounds check per byte, not a look into the feed's buffer); the references
//! to the keys and the action name, the same bytes in every entry, are matched by those
//! bytes ([`SymRefs`]) rather than decoded; and the read position stays in a register (the
//! rare paths that are calls take it by value). Instructions per entry of the shared-lists
//! layout (callgrind, 100k entries, the whole load): 1,470 before these three, 1,300 after.
//!
//! ## Giving up
//!
//! The attempt changes nothing the generic path could see if it gives up: the memo stores it
//! made are undone ([`Undo`]: truncating the dense memo, and a small log for the others), the
//! string heap is truncated to where it was, the per-field string cache
//! (`ConvState::recent_strs`) and the expansion budget are restored, and frames and stacks
//! it converted are forgotten from the conversion caches (`ConvState::cache_journal`). The
//! read position is untouched, so the generic VM reads the same bytes again and reaches the
//! same entry, or the same error at the same offset. `workload/tests/it/format/reader_paths.rs` checks this
//! on real, generated, hand-made and randomly damaged files.

use crate::intern::{FrameId, StackId, StrId};
use crate::model::{Action, TraceEntry};

use super::super::arena::{Val, NONE};
use super::super::convert::Conv;
use super::super::machine::{short_long, Feed, Machine};
use super::super::memo::{MemoPut, ValPacking};
use super::super::opcodes::op;
use super::super::sym::Sym;
use super::Snap;

/// The snapshot reader's memo.
type Memo = super::super::memo::Memo<ValPacking>;

/// Bytes [`Machine::fast_entry`] wants in the window (an entry is about 60).
const FAST_ENTRY_WINDOW: usize = 4096;

/// Most of a real file is trace entries each with a fresh frames list of memoized frame dicts
/// (`EMPTY_LIST MEMOIZE MARK`, a `BINGET`/`LONG_BINGET` per frame, `APPENDS`), and a run
/// has few distinct stacks. Resolving each reference and hashing the frames to find the stack
/// was a third of the load time; equal bytes from `MARK` to `APPENDS` mean equal memo
/// references, so the stack is looked up by those bytes instead.
///
/// A cached stack stays right while the memo slots it was read from hold what they held
/// ([`Memo::changes`] unchanged: the map is emptied otherwise) and the frame dicts they hold
/// do not change (a dict read as a frame is frozen, and a list is only added when its entry
/// was read: a rollback unfreezes the frames it converted).
pub(super) struct ListCache {
    /// The lists read: bytes after `MARK` through `APPENDS`, stack, and the lists that came
    /// next.
    lists: Vec<CachedList>,
    /// Index in `lists` by bytes.
    by_refs: foldhash::HashMap<Box<[u8]>, u32>,
    /// Bytes of the lists held (bounded by [`LIST_CACHE_BYTES`]).
    bytes: usize,
    /// [`Memo::changes`] when the lists were last known right.
    memo_changes: u64,
    /// The list the last lookup found (`NONE` if none).
    last: u32,
    /// The list read by the entry being tried, added when the entry is read.
    pending: Option<PendingList>,
}

impl Default for ListCache {
    fn default() -> Self {
        ListCache {
            lists: Vec::new(),
            by_refs: Default::default(),
            bytes: 0,
            memo_changes: 0,
            last: NONE,
            pending: None,
        }
    }
}

struct CachedList {
    refs: Box<[u8]>,
    stack: StackId,
    /// The lists that came next, most recent first (`NONE` past the end).
    next: [u32; FOLLOWERS],
}

/// How many lists that came after a list [`ListCache`] tries before it looks one up by hash
/// (in real files one guess is right 76-92% of the time, four 89-99%).
const FOLLOWERS: usize = 4;

/// A frames list read frame by frame: its bytes after `MARK` in the window, and its stack.
#[derive(Clone, Copy)]
pub(super) struct PendingList {
    at: usize,
    end: usize,
    stack: StackId,
    /// [`Memo::changes`] when its references were resolved.
    memo_changes: u64,
}

/// What [`ListCache::find`] found at a position.
enum Found {
    /// The stack, and the position after `APPENDS`.
    Stack(StackId, usize),
    /// Not read before; where the refs end, if they are plain refs through `APPENDS`.
    New(Option<usize>),
}

/// The most list bytes [`ListCache`] holds (real runs need a few KiB to a few 100 KiB; past
/// this, lists are read frame by frame).
const LIST_CACHE_BYTES: usize = 16 << 20;

impl ListCache {
    /// The stack of the list whose bytes after `MARK` start at `window[at..]`, if a list with
    /// the same bytes was read before.
    #[inline]
    fn find(&mut self, window: &[u8], at: usize, memo_changes: u64) -> Found {
        if memo_changes != self.memo_changes {
            self.lists.clear();
            self.by_refs.clear();
            self.bytes = 0;
            self.last = NONE;
            self.memo_changes = memo_changes;
        }
        // A training step repeats its stacks in order: first try the lists that came after
        // the last one found, most recent first (a comparison each; no scan, no hash).
        if let Some(last) = self.lists.get(self.last as usize) {
            for (k, &next) in last.next.iter().enumerate() {
                let Some(guess) = self.lists.get(next as usize) else {
                    break;
                };
                let len = guess.refs.len();
                if window.get(at..at + len) == Some(&guess.refs[..]) {
                    let stack = guess.stack;
                    if k > 0 {
                        // Most recent first.
                        let followers = &mut self.lists[self.last as usize].next;
                        for j in (1..=k).rev() {
                            followers[j] = followers[j - 1];
                        }
                        followers[0] = next;
                    }
                    self.last = next;
                    return Found::Stack(stack, at + len);
                }
            }
        }
        let Some(end) = refs_end(window, at) else {
            return Found::New(None);
        };
        match self.by_refs.get(&window[at..end]) {
            Some(&found) => {
                self.follows(found);
                Found::Stack(self.lists[found as usize].stack, end)
            }
            None => Found::New(Some(end)),
        }
    }

    /// Notes that list `index` came after the last one found.
    #[inline]
    fn follows(&mut self, index: u32) {
        if let Some(last) = self.lists.get_mut(self.last as usize) {
            let followers = &mut last.next;
            for j in (1..FOLLOWERS).rev() {
                followers[j] = followers[j - 1];
            }
            followers[0] = index;
        }
        self.last = index;
    }

    fn insert(&mut self, refs: &[u8], list: PendingList, memo_changes: u64) {
        if list.memo_changes != memo_changes
            || memo_changes != self.memo_changes
            || self.bytes + refs.len() > LIST_CACHE_BYTES
        {
            return;
        }
        let index = self.lists.len() as u32;
        self.bytes += refs.len();
        self.lists.push(CachedList {
            refs: refs.into(),
            stack: list.stack,
            next: [NONE; FOLLOWERS],
        });
        self.by_refs.insert(refs.into(), index);
        self.follows(index);
    }
}

/// The memo references an entry's keys and action name are made of, by their bytes.
///
/// An entry's keys and action are memo references to the strs read once at the top of the
/// trace, the same few bytes in every entry (`LONG_BINGET` and its index). Decoding each one
/// (the opcode, the index, the memo slot, what its str was recognised as) was most of an
/// entry's instructions; comparing the next bytes with those of the reference last seen for
/// the key the writer's order puts there is a load and a compare.
///
/// A reference read this way stays right while the memo slot holds what it held
/// ([`Memo::changes`] unchanged: the table is emptied otherwise). An attempt that learned a
/// reference and then gives up empties the table, since the slots it stored to are taken
/// back.
pub(super) struct SymRefs {
    /// By [`Sym`] (as a number): the reference's bytes (opcode and index, little-endian) and a
    /// mask as long as they are; a zero mask for none.
    refs: [(u64, u64); SYMS],
    /// Byte counts of the references, by [`Sym`].
    lens: [u8; SYMS],
    /// [`Memo::changes`] when they were known right.
    memo_changes: u64,
    /// Whether the attempt under way learned a reference.
    learned: bool,
}

/// [`SymRefs`]'s slots, one per [`Sym`].
const SYMS: usize = Sym::ALL.len();

/// The keys of a trace entry the fast path reads, in the writer's order: tried when the next
/// bytes are not the reference to the key expected there (an optional key left out).
const KEYS: [Sym; 8] = [
    Sym::Action,
    Sym::Addr,
    Sym::Size,
    Sym::Stream,
    Sym::TimeUs,
    Sym::CompileContext,
    Sym::UserMetadata,
    Sym::Frames,
];

impl Default for SymRefs {
    fn default() -> Self {
        SymRefs {
            refs: [(0, 0); SYMS],
            lens: [0; SYMS],
            memo_changes: 0,
            learned: false,
        }
    }
}

impl SymRefs {
    /// The first of `syms` whose reference, as last seen, starts `next8` (the next 8 bytes),
    /// and the reference's length; none while the memo is not at `memo_changes` any more.
    #[inline(always)]
    fn find(&self, next8: u64, syms: &[Sym], memo_changes: u64) -> Option<(Sym, usize)> {
        if memo_changes != self.memo_changes {
            return None;
        }
        for &sym in syms {
            let (bytes, mask) = self.refs[sym as usize];
            if mask != 0 && next8 & mask == bytes {
                return Some((sym, self.lens[sym as usize] as usize));
            }
        }
        None
    }

    /// Notes that `reference` (a whole `BINGET`/`LONG_BINGET`) fetches a str recognised as
    /// `sym` while the memo is at `memo_changes`.
    #[inline]
    fn learn(&mut self, reference: &[u8], sym: Sym, memo_changes: u64) {
        let mut bytes = [0u8; 8];
        let Some(prefix) = bytes.get_mut(..reference.len()) else {
            return;
        };
        prefix.copy_from_slice(reference);
        let known = (
            u64::from_le_bytes(bytes),
            u64::MAX >> (64 - 8 * reference.len() as u32),
        );
        if memo_changes == self.memo_changes && self.refs[sym as usize] == known {
            return;
        }
        if memo_changes != self.memo_changes {
            self.forget();
            self.memo_changes = memo_changes;
        }
        self.refs[sym as usize] = known;
        self.lens[sym as usize] = reference.len() as u8;
        self.learned = true;
    }

    fn forget(&mut self) {
        self.refs = [(0, 0); SYMS];
    }
}

/// The end (after `APPENDS`) of the `BINGET`/`LONG_BINGET` run at `at`, when the window holds
/// it whole with nothing else in it (a `FRAME` header, another opcode).
#[inline]
fn refs_end(window: &[u8], mut at: usize) -> Option<usize> {
    loop {
        match *window.get(at)? {
            op::BINGET => at += 2,
            op::LONG_BINGET => at += 5,
            op::APPENDS => return Some(at + 1),
            _ => return None,
        }
    }
}

/// Memo stores made by a [`Machine::fast_entry`] attempt, undone if it gives up: stores at the
/// dense end (nearly all) by truncating, the others from a log.
struct Undo {
    dense_len: usize,
    count: usize,
    others: [MemoPut<Val>; 4],
    len: usize,
}

impl Undo {
    fn new(memo: &Memo) -> Self {
        Undo {
            dense_len: memo.dense.len(),
            count: memo.count,
            others: Default::default(),
            len: 0,
        }
    }

    /// Stores to the memo and logs it; `None` when the log is full (the attempt gives up).
    #[inline(always)]
    fn put(&mut self, memo: &mut Memo, index: u64, v: Val) -> Option<()> {
        if memo.try_push(index, v).is_ok() {
            return Some(());
        }
        if self.len == self.others.len() {
            return None;
        }
        self.others[self.len] = memo.put_elsewhere(index, v);
        self.len += 1;
        Some(())
    }

    /// Puts the memo back as it was when this log started.
    fn roll_back(&self, memo: &mut Memo) {
        for &put in self.others[..self.len].iter().rev() {
            memo.undo(put);
        }
        memo.dense.truncate(self.dense_len);
        memo.count = self.count;
    }
}

impl<F: Feed> Machine<'_, Snap<'_>, F> {
    #[inline]
    /// Reads a trace entry dict straight into a [`TraceEntry`] when it is laid out the way
    /// PyTorch's exporter and our writer lay it out: `EMPTY_DICT` (just read), an optional
    /// memo store, `MARK`, memoized keys of a plain entry in the
    /// writer's order with int, str and memoized frames-list values, `SETITEMS`. That is
    /// nearly every entry of a real file, and skipping the generic stack and container work
    /// halves the load time. Anything else (an unknown or rare key, another value shape, a
    /// window boundary) returns `false` with nothing changed, and the generic opcodes run
    /// and reach the same result, or the same error.
    pub(super) fn fast_entry(&mut self) -> bool {
        if self.b.state.entries.len() >= NONE as usize {
            return false;
        }
        let window = self.feed.window().len();
        if window - self.pos < FAST_ENTRY_WINDOW && self.offset(window) < self.total {
            // Near the window's end with more input to come: read on, so the entry is not
            // cut (a read error comes back on the generic path's own read).
            let _ = self.fill(FAST_ENTRY_WINDOW, "trace entry");
        }
        let heap_len = self.b.arena.heap.len();
        // They may come to name heap bytes the rollback removes.
        let recent_strs = self.b.state.recent_strs;
        // A frame converted on the way may have charged the expansion budget; the generic
        // path will charge it again.
        let budget = self.b.state.budget;
        let mut undo = Undo::new(&self.memo);
        self.b.refs.learned = false;
        let mut journal = std::mem::take(&mut self.b.journal_buf);
        journal.clear();
        self.b.state.cache_journal = Some(journal);
        let mut reader = EntryReader {
            w: Window {
                bytes: self.feed.window(),
                base: self.base,
                total: self.total,
            },
            memo: &mut self.memo,
            b: &mut self.b,
            undo: &mut undo,
        };
        let decoded = reader.entry(self.pos);
        if decoded.is_none() {
            self.b.state.forget_journal();
        }
        self.b.journal_buf = self.b.state.cache_journal.take().unwrap_or_default();
        let list = self.b.lists.pending.take();
        match decoded {
            Some((end, entry, frames_node)) => {
                if let Some(list) = list {
                    // Only now: had the attempt given up, the frames it converted would be
                    // forgotten (and could change) while the cache still named them.
                    let refs = &self.feed.window()[list.at..list.end];
                    self.b.lists.insert(refs, list, self.memo.changes);
                }
                self.pos = end;
                if let Some(list) = frames_node {
                    self.b.arena.nodes[list as usize].shared = true;
                }
                let index = self.b.state.entries.len() as u32;
                let at = self.offset(self.pos);
                self.b.state.push_entry(entry, at, self.total);
                self.b.state.fast_entries += 1;
                // What EMPTY_DICT would have pushed, filled (the memo already holds it).
                self.push(Val::Entry(index));
                true
            }
            None => {
                // It may have learned references to the memo stores taken back here.
                if self.b.refs.learned {
                    self.b.refs.forget();
                }
                undo.roll_back(&mut self.memo);
                self.b.arena.heap.truncate(heap_len);
                self.b.state.recent_strs = recent_strs;
                self.b.state.budget = budget;
                false
            }
        }
    }
}

/// The input [`Machine::fast_entry`] reads an entry from, taken from the feed once per
/// entry: the byte reads below are a bounds check each, not a look into the feed's buffer
/// (its start and end) per byte.
#[derive(Clone, Copy)]
struct Window<'w> {
    bytes: &'w [u8],
    /// Input offset of `bytes[0]`.
    base: u64,
    /// Input length.
    total: u64,
}

impl Window<'_> {
    /// The next opcode, stepping over `FRAME` headers (their lengths checked as the generic
    /// path checks them): a frame boundary may fall inside an entry.
    #[inline(always)]
    fn op(&self, p: &mut usize) -> Option<u8> {
        loop {
            let code = self.byte(p)?;
            if code != op::FRAME {
                return Some(code);
            }
            let len = u64::from_le_bytes(self.bytes(p)?);
            if len > self.total.saturating_sub(self.base + *p as u64) {
                return None;
            }
        }
    }

    #[inline(always)]
    fn byte(&self, p: &mut usize) -> Option<u8> {
        let b = *self.bytes.get(*p)?;
        *p += 1;
        Some(b)
    }

    #[inline(always)]
    fn bytes<const N: usize>(&self, p: &mut usize) -> Option<[u8; N]> {
        let b = self.bytes.get(*p..*p + N)?.try_into().ok()?;
        *p += N;
        Some(b)
    }

    /// The memo index a `MEMOIZE`, `BINPUT` or `LONG_BINPUT` at `code` stores to.
    #[inline(always)]
    fn memo_store_index(&self, code: u8, p: &mut usize, memo: &Memo) -> Option<u64> {
        match code {
            op::MEMOIZE => Some(memo.count as u64),
            op::BINPUT => self.byte(p).map(u64::from),
            op::LONG_BINPUT => self.bytes::<4>(p).map(|b| u32::from_le_bytes(b).into()),
            _ => None,
        }
    }

    /// The index a `BINGET` or `LONG_BINGET` at `code` fetches.
    #[inline(always)]
    fn memo_index(&self, code: u8, p: &mut usize) -> Option<u64> {
        match code {
            op::BINGET => Some(u64::from(self.byte(p)?)),
            op::LONG_BINGET => Some(u32::from_le_bytes(self.bytes::<4>(p)?).into()),
            _ => None,
        }
    }

    /// An int opcode's value (`LONG1` up to 8 bytes).
    #[inline(always)]
    fn int(&self, p: &mut usize) -> Option<i64> {
        Some(match self.op(p)? {
            op::BININT1 => self.byte(p)?.into(),
            op::BININT2 => u16::from_le_bytes(self.bytes(p)?).into(),
            op::BININT => i32::from_le_bytes(self.bytes(p)?).into(),
            op::LONG1 => {
                let n = usize::from(self.byte(p)?);
                if n > 8 {
                    return None;
                }
                let v = short_long(self.bytes, *p, n)?;
                *p += n;
                v
            }
            _ => return None,
        })
    }
}

/// One [`Machine::fast_entry`] attempt: the window, and what the decoding changes (the memo,
/// with its stores logged in `undo`, and the builder).
struct EntryReader<'a, 'o> {
    w: Window<'a>,
    memo: &'a mut Memo,
    b: &'a mut Snap<'o>,
    undo: &'a mut Undo,
}

impl EntryReader<'_, '_> {
    /// The position after `SETITEMS`, the entry, and the frames list node it references,
    /// from `p` (after `EMPTY_DICT`). Memo stores are made as they come (a later key may
    /// reference them).
    fn entry(&mut self, mut p: usize) -> Option<(usize, TraceEntry, Option<u32>)> {
        let p = &mut p;
        let mut code = self.w.op(p)?;
        if code != op::MARK {
            let index = self.w.memo_store_index(code, p, self.memo)?;
            // Stored as the entry it becomes; if a key or value fetched it back, the fast
            // path would give up (an entry is no key, string or frames list).
            let entry = Val::Entry(self.b.state.entries.len() as u32);
            self.undo.put(self.memo, index, entry)?;
            code = self.w.op(p)?;
            if code != op::MARK {
                return None;
            }
        }
        let mut entry = TraceEntry::new(Action::Alloc, 0, 0, 0);
        let mut frames_node = None;
        // The keys in the writer's order (the schema's `ENTRY_ORDER`), each at most once, as
        // a straight line of steps (branches that follow the file's one layout, not a jump
        // per key): `action`, `addr`, `size` and `stream`, then the optional ones. Any other
        // key, or a key out of place, gives up.
        if self.key(p, Sym::Action)? != Sym::Action {
            return None;
        }
        entry.action = self.action(p)?;
        if self.key(p, Sym::Addr)? != Sym::Addr {
            return None;
        }
        entry.addr = u64::try_from(self.w.int(p)?).ok()?;
        if self.key(p, Sym::Size)? != Sym::Size {
            return None;
        }
        entry.size = u64::try_from(self.w.int(p)?).ok()?;
        if self.key(p, Sym::Stream)? != Sym::Stream {
            return None;
        }
        entry.stream = self.w.int(p)?;
        let mut key = self.key(p, Sym::TimeUs)?;
        if key == Sym::TimeUs {
            entry.set_time_us(Some(self.w.int(p)?));
            key = self.key(p, Sym::CompileContext)?;
        }
        if key == Sym::CompileContext {
            let id = self.interned_str(p, 0)?;
            entry.set_compile_context(Some(id), self.b.state.strings());
            key = self.key(p, Sym::UserMetadata)?;
        }
        if key == Sym::UserMetadata {
            let id = self.interned_str(p, 1)?;
            entry.set_user_metadata(Some(id), self.b.state.strings());
            key = self.key(p, Sym::Frames)?;
        }
        if key == Sym::Frames {
            let code = self.w.op(p)?;
            let stack = if code == op::EMPTY_LIST {
                // By value: a position whose address went to a call that is not inlined
                // would live in memory, a store for every byte read.
                let (stack, end) = self.frames_list(*p)?;
                *p = end;
                stack
            } else {
                let v = self.memo_ref(code, p)?;
                match v {
                    Val::Node(list) => {
                        frames_node = Some(list);
                        // A list shared through the memo (PyTorch's layout: one list per
                        // distinct stack, referenced by every entry with that stack) is
                        // converted once; every later reference is this one lookup.
                        match self.b.state.cached_stack(list) {
                            Some(stack) => stack,
                            None => Conv::new(&self.b.arena, &mut self.b.state).stack(v).ok()?,
                        }
                    }
                    Val::Stack(stack) => StackId::from_index(stack as usize),
                    _ => Conv::new(&self.b.arena, &mut self.b.state).stack(v).ok()?,
                }
            };
            entry.frames = Some(stack);
            key = self.key(p, Sym::Other)?;
        }
        // `SETITEMS` (which `key` reads as `Sym::Other`) ends the entry.
        (key == Sym::Other).then_some((*p, entry, frames_node))
    }

    /// The next key of an entry: what the memoized str a `BINGET`/`LONG_BINGET` fetches was
    /// recognised as, or [`Sym::Other`] for `SETITEMS`; `None` (give up) for anything else, an
    /// unknown key included. `expect` is the key the writer's order puts here, tried first
    /// by its bytes ([`SymRefs`]).
    #[inline(always)]
    fn key(&mut self, p: &mut usize, expect: Sym) -> Option<Sym> {
        let next8 = self.next8(*p);
        let changes = self.memo.changes;
        if let Some((sym, len)) = self.b.refs.find(next8, &[expect], changes) {
            *p += len;
            return Some(sym);
        }
        if next8 as u8 == op::SETITEMS {
            *p += 1;
            return Some(Sym::Other);
        }
        // An optional key left out: the next one is one of the others.
        let (sym, end) = match self.b.refs.find(next8, &KEYS, changes) {
            Some((sym, len)) => (sym, *p + len),
            None => self.read_ref(*p)?,
        };
        *p = end;
        Some(sym)
    }

    /// The action an entry's `action` references.
    #[inline(always)]
    fn action(&mut self, p: &mut usize) -> Option<Action> {
        let next8 = self.next8(*p);
        let (sym, end) = match self.b.refs.find(next8, Sym::ACTIONS, self.memo.changes) {
            Some((sym, len)) => (sym, *p + len),
            None => self.read_ref(*p)?,
        };
        *p = end;
        sym.action()
    }

    /// What the memo reference at `start` fetches, recognised as a key or action name
    /// ([`Sym::Other`] for `SETITEMS`, `None` for anything else), and the position after
    /// it; the reference is learned ([`SymRefs`]). Out of line, and the position by value:
    /// one whose address went to a call would live in memory, a store for every byte read.
    #[inline(never)]
    fn read_ref(&mut self, start: usize) -> Option<(Sym, usize)> {
        let mut p = start;
        let code = self.w.op(&mut p)?;
        if code == op::SETITEMS {
            return Some((Sym::Other, p));
        }
        match self.memo_sym(code, &mut p)? {
            Sym::Other => None,
            sym => {
                self.learn(start, p, code, sym);
                Some((sym, p))
            }
        }
    }

    /// The 8 bytes at `p` (zeros past the window's end: no reference is matched there, since
    /// a mask never covers more bytes than a reference has and a reference's first byte, its
    /// opcode, is never 0).
    #[inline(always)]
    fn next8(&self, p: usize) -> u64 {
        match self.w.bytes.get(p..p + 8) {
            Some(b) => u64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
            None => 0,
        }
    }

    /// Notes the reference `window[start..end]` (opcode `code`) to a str recognised as `sym`,
    /// when it is a reference alone (no `FRAME` header read on the way).
    #[inline(always)]
    fn learn(&mut self, start: usize, end: usize, code: u8, sym: Sym) {
        if self.w.bytes.get(start) == Some(&code) {
            if let Some(reference) = self.w.bytes.get(start..end) {
                self.b.refs.learn(reference, sym, self.memo.changes);
            }
        }
    }

    /// What the memoized str a `BINGET` or `LONG_BINGET` at `code` fetches was recognised
    /// as (`None` when it is no str, or stored sparse: the generic path handles those).
    #[inline(always)]
    fn memo_sym(&self, code: u8, p: &mut usize) -> Option<Sym> {
        self.memo.sym_at(self.w.memo_index(code, p)?)
    }

    /// The value a `BINGET` or `LONG_BINGET` at `code` fetches.
    #[inline(always)]
    fn memo_ref(&self, code: u8, p: &mut usize) -> Option<Val> {
        self.memo.get(self.w.memo_index(code, p)?)
    }

    /// A `compile_context` (`slot` 0) or `user_metadata` (1) value, interned. Inlined: a
    /// call per field cost more than the usual case's work (the string of the last entry).
    #[inline(always)]
    fn interned_str(&mut self, p: &mut usize, slot: usize) -> Option<StrId> {
        let v = self.str(p, slot)?;
        match self.b.state.recent_str_id(&self.b.arena, v, slot) {
            Some(id) => Some(id),
            None => Conv::new(&self.b.arena, &mut self.b.state)
                .recent_str(v, slot)
                .ok(),
        }
    }

    /// A memoized str, or a short one (copied to the heap, stored to the memo when a memo
    /// opcode follows). Inlined: returned through memory from a call, the value was
    /// read back before its stores had landed (a stall per field).
    #[inline(always)]
    fn str(&mut self, p: &mut usize, slot: usize) -> Option<Val> {
        let code = self.w.op(p)?;
        if code != op::SHORT_BINUNICODE {
            return self.memo_ref(code, p);
        }
        let n = usize::from(self.w.byte(p)?);
        let bytes = self.w.bytes.get(*p..*p + n)?;
        // A fresh copy of the string the last entry had here (PyTorch writes a new `'N/A'`
        // object per entry) shares that copy's heap bytes (and what it was recognised as).
        let recent = self.b.state.recent_strs[slot];
        let (start, sym) = if recent.len as usize == n
            && short_eq(&self.b.arena.heap[recent.start..recent.start + n], bytes)
        {
            (recent.start, recent.sym)
        } else {
            let sym = if bytes.is_ascii() {
                Sym::classify(bytes)
            } else {
                std::str::from_utf8(bytes).ok()?;
                Sym::Other
            };
            let start = self.b.arena.heap.len();
            self.b.arena.heap.extend_from_slice(bytes);
            (start, sym)
        };
        *p += n;
        let v = Val::Str {
            start,
            len: n as u32,
            sym,
        };
        let mut after = *p;
        if let Some(index) = self
            .w
            .op(&mut after)
            .and_then(|code| self.w.memo_store_index(code, &mut after, self.memo))
        {
            self.undo.put(self.memo, index, v)?;
            *p = after;
        }
        Some(v)
    }

    /// A frames list written in place (`EMPTY_LIST` just read): an optional memo store, then
    /// its memoized frame dicts (`MARK` refs `APPENDS`, one ref `APPEND`, or none), read
    /// straight into a stack. The memo gets a [`Val::Stack`], so the list never needs a node.
    fn frames_list(&mut self, mut p: usize) -> Option<(StackId, usize)> {
        let mut q = p;
        let mut memo_index = None;
        let mut code = self.w.op(&mut q)?;
        if let Some(index) = self.w.memo_store_index(code, &mut q, self.memo) {
            memo_index = Some(index);
            p = q;
            code = self.w.op(&mut q)?;
        }
        let stack = if code == op::MARK {
            self.marked_refs(&mut q)?
        } else {
            self.refs_stack(code, &mut q)?
        };
        if code == op::MARK || code == op::BINGET || code == op::LONG_BINGET {
            p = q;
        }
        if let Some(index) = memo_index {
            self.undo
                .put(self.memo, index, Val::Stack(stack.index() as u32))?;
        }
        Some((stack, p))
    }

    /// `MARK` refs `APPENDS` (`MARK` just read) as a stack: found by the refs' bytes when a
    /// list with the same bytes was read before ([`ListCache`]), else read frame by frame.
    #[inline]
    fn marked_refs(&mut self, q: &mut usize) -> Option<StackId> {
        let at = *q;
        let end = match self.b.lists.find(self.w.bytes, at, self.memo.changes) {
            Found::Stack(stack, end) => {
                *q = end;
                return Some(stack);
            }
            Found::New(end) => end,
        };
        let stack = self.refs_stack(op::MARK, q)?;
        if end == Some(*q) {
            self.b.lists.pending = Some(PendingList {
                at,
                end: *q,
                stack,
                memo_changes: self.memo.changes,
            });
        }
        Some(stack)
    }

    /// The frame dicts from the opcode after a frames list's memo store, interned as a stack.
    fn refs_stack(&mut self, code: u8, q: &mut usize) -> Option<StackId> {
        let mut frames = std::mem::take(&mut self.b.frames_buf);
        frames.clear();
        let read = self.frame_refs(code, q, &mut frames);
        let stack = read.map(|()| self.b.state.intern_stack(&frames));
        self.b.frames_buf = frames;
        stack
    }

    /// The frame dicts of a frames list, from the opcode after its memo store: `MARK` refs
    /// `APPENDS`, one ref `APPEND`, or nothing (an empty list; `code` is then the next key).
    fn frame_refs(&mut self, code: u8, q: &mut usize, frames: &mut Vec<FrameId>) -> Option<()> {
        match code {
            op::MARK => loop {
                let code = self.w.op(q)?;
                if code == op::APPENDS {
                    return Some(());
                }
                frames.push(self.memo_frame(code, q)?);
            },
            op::BINGET | op::LONG_BINGET => {
                frames.push(self.memo_frame(code, q)?);
                (self.w.op(q)? == op::APPEND).then_some(())
            }
            _ => Some(()),
        }
    }

    /// The frame a `BINGET` or `LONG_BINGET` of a frame dict fetches.
    #[inline]
    fn memo_frame(&mut self, code: u8, p: &mut usize) -> Option<FrameId> {
        let index = self.w.memo_index(code, p)?;
        // Nearly always a frame dict read before: straight from the packed memo slot.
        if let Some(id) = self.memo.node_at(index) {
            if let Some(frame) = self.b.state.cached_frame(id) {
                return Some(frame);
            }
        }
        let v = self.memo.get(index)?;
        Conv::new(&self.b.arena, &mut self.b.state).frame(v).ok()
    }
}

/// Byte equality of short strings without a `memcmp` call.
#[inline]
fn short_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}
