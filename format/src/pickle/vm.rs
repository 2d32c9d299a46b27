//! The pickle virtual machine: runs the data opcodes into an arena, executes nothing.
//!
//! The input is read through a [`Feed`]: a slice already in memory, or a reader seen through
//! a small window, so loading a file never holds the whole file. Strings, bytes and big
//! integers are copied into the arena's string heap (validated UTF-8 for `str`, with the
//! entry keys and action names recognised once as a [`Sym`]); small integers, floats and bools
//! are stored inline in [`Val`]; lists, dicts and tuples are [`Node`]s whose items live in one
//! flat vector, in chunks (one chunk per `APPENDS`/`SETITEMS` batch, merged when batches are
//! adjacent). A memo reference pushes the same `Val::Node`, so a list shared a thousand times
//! is stored once and the conversion pass can cache per node.

use std::collections::{HashMap, HashSet};
use std::io::Read;

use crate::error::{FormatError, Result};
use crate::io::Progress;

use super::convert::{Conv, ConvState, Sym};

mod fast_path;
use crate::intern::FrameId;

/// Highest protocol we read (`PROTO 5` is byte-identical to 4 for snapshot data).
const MAX_PROTOCOL: u8 = 5;
/// Sees the trace entries read so far, in input order, a batch per progress tick (a preview
/// of a big file while it loads; entries in unusual layouts, converted at the end, are not
/// shown).
pub type Observe<'a> = &'a mut dyn FnMut(&[crate::TraceEntry]);

/// Call the progress callback about this often.
const PROGRESS_STEP: usize = 1 << 20;
/// Memo indices above `memo.len() + MEMO_DENSE_SLACK` go to a sparse map, so a hostile
/// `LONG_BINPUT 0xffffffff` cannot make us allocate a 64 GiB vector.
const MEMO_DENSE_SLACK: usize = 1 << 16;

/// Bytes a [`ReaderFeed`] asks its reader for at a time.
const READ_CHUNK: usize = 256 << 10;
/// Longest text line (protocol-0 `GET`/`PUT` indices, `GLOBAL` names) we look for.
const MAX_LINE: usize = 64 << 10;

/// No chunk / no node marker.
pub(crate) const NONE: u32 = u32::MAX;

/// One value on the VM stack, in the memo, or inside a container.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Val {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// A `LONG1`/`LONG4` integer outside `i64`: little-endian two's complement bytes in the heap.
    BigInt {
        start: usize,
        len: u32,
    },
    /// Valid UTF-8 in the string heap; `sym` names the snapshot keys the reader looks for.
    Str {
        start: usize,
        len: u32,
        sym: Sym,
    },
    Bytes {
        start: usize,
        len: u32,
    },
    /// A list, dict or tuple in [`Arena::nodes`].
    Node(u32),
    /// A frames list the fast path read straight into this [`crate::StackId`] (no node: real
    /// files hold a fresh list per entry).
    Stack(u32),
    /// A dict the fast path read as the trace entry at this index of
    /// [`super::convert::ConvState::entries`] (no node: most of a file's dicts are these).
    Entry(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    List,
    Dict,
    Tuple,
    /// A dict already converted to a [`crate::TraceEntry`] while reading (see
    /// [`super::convert::ConvState::entries`]); `first` is its index there.
    Entry,
}

/// A container: its items are the chunks `first -> ... -> last`. A dict stores keys and
/// values interleaved.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub kind: Kind,
    first: u32,
    last: u32,
    /// Number of items (a dict holds `len / 2` pairs).
    pub len: u32,
    /// Pushed again through the memo or DUP, so it may be referenced more than once.
    pub shared: bool,
}

#[derive(Clone, Copy, Debug)]
struct Chunk {
    start: u32,
    len: u32,
    next: u32,
    /// The items are `Val::Entry(start..start + len)`, not stored in `items` (a trace list
    /// is a million consecutive entries).
    entries: bool,
}

/// The result of running a pickle: the object graph and its root.
pub(crate) struct Arena {
    /// The bytes of every string, bytes object and big integer, in input order.
    heap: Vec<u8>,
    pub nodes: Vec<Node>,
    chunks: Vec<Chunk>,
    items: Vec<Val>,
    /// `Val::Entry`s pushed again through the memo or DUP.
    shared_entries: HashSet<u32>,
    pub root: Val,
}

impl Arena {
    /// The index in the converted entries of a dict read as a trace entry.
    #[inline]
    pub fn entry_of(&self, v: Val) -> Option<usize> {
        match v {
            Val::Entry(index) => Some(index as usize),
            Val::Node(id) => {
                let node = &self.nodes[id as usize];
                (node.kind == Kind::Entry).then_some(node.first as usize)
            }
            _ => None,
        }
    }

    /// The Python type of a value, for error messages.
    pub fn type_name(&self, v: Val) -> &'static str {
        match v {
            Val::None => "None",
            Val::Bool(_) => "bool",
            Val::Int(_) | Val::BigInt { .. } => "int",
            Val::Float(_) => "float",
            Val::Str { .. } => "str",
            Val::Bytes { .. } => "bytes",
            Val::Entry(_) => "dict",
            Val::Stack(_) => "list",
            Val::Node(id) => match self.nodes[id as usize].kind {
                Kind::List => "list",
                Kind::Dict | Kind::Entry => "dict",
                Kind::Tuple => "tuple",
            },
        }
    }

    /// Whether a value may be referenced more than once.
    pub fn is_shared(&self, v: Val) -> bool {
        match v {
            Val::Entry(index) => self.shared_entries.contains(&index),
            Val::Node(id) => self.nodes[id as usize].shared,
            _ => false,
        }
    }

    pub fn node(&self, id: u32) -> &Node {
        &self.nodes[id as usize]
    }

    /// The items of a container, in order.
    pub fn items(&self, id: u32) -> Items<'_> {
        let node = self.nodes[id as usize];
        Items {
            arena: self,
            chunk: if node.kind == Kind::Entry {
                NONE
            } else {
                node.first
            },
            pos: 0,
        }
    }

    /// Whether list `id` is the entries `0..len` in order, none of them shared, told from its
    /// chunks alone (the usual trace list: one chunk of entries). `false` means only that
    /// the chunks do not show it; [`Arena::items`] may.
    pub fn is_entry_run(&self, id: u32) -> bool {
        if !self.shared_entries.is_empty() {
            return false;
        }
        let node = &self.nodes[id as usize];
        if node.kind != Kind::List {
            return false;
        }
        let (mut chunk, mut next) = (node.first, 0u32);
        while chunk != NONE {
            let c = self.chunks[chunk as usize];
            if !c.entries || c.start != next {
                return false;
            }
            next += c.len;
            chunk = c.next;
        }
        true
    }

    /// The raw bytes of a `Str`, `Bytes` or `BigInt` value.
    pub fn bytes(&self, start: usize, len: u32) -> &[u8] {
        &self.heap[start..start + len as usize]
    }
}

/// Iterator over a container's items.
pub(crate) struct Items<'a> {
    arena: &'a Arena,
    chunk: u32,
    pos: u32,
}

impl<'a> Iterator for Items<'a> {
    type Item = Val;

    #[inline]
    fn next(&mut self) -> Option<Val> {
        loop {
            if self.chunk == NONE {
                return None;
            }
            let c = self.arena.chunks[self.chunk as usize];
            if self.pos < c.len {
                let v = if c.entries {
                    Val::Entry(c.start + self.pos)
                } else {
                    self.arena.items[(c.start + self.pos) as usize]
                };
                self.pos += 1;
                return Some(v);
            }
            self.chunk = c.next;
            self.pos = 0;
        }
    }
}

/// Opcodes (names as in CPython's `pickle.py`).
pub mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const FLOAT: u8 = b'F';
    pub const INT: u8 = b'I';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const LONG: u8 = b'L';
    pub const BININT2: u8 = b'M';
    pub const NONE: u8 = b'N';
    pub const PERSID: u8 = b'P';
    pub const BINPERSID: u8 = b'Q';
    pub const REDUCE: u8 = b'R';
    pub const STRING: u8 = b'S';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const UNICODE: u8 = b'V';
    pub const BINUNICODE: u8 = b'X';
    pub const APPEND: u8 = b'a';
    pub const BUILD: u8 = b'b';
    pub const GLOBAL: u8 = b'c';
    pub const DICT: u8 = b'd';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPENDS: u8 = b'e';
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const INST: u8 = b'i';
    pub const LONG_BINGET: u8 = b'j';
    pub const LIST: u8 = b'l';
    pub const EMPTY_LIST: u8 = b']';
    pub const OBJ: u8 = b'o';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SETITEM: u8 = b's';
    pub const TUPLE: u8 = b't';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const SETITEMS: u8 = b'u';
    pub const BINFLOAT: u8 = b'G';
    pub const PROTO: u8 = 0x80;
    pub const NEWOBJ: u8 = 0x81;
    pub const EXT1: u8 = 0x82;
    pub const EXT2: u8 = 0x83;
    pub const EXT4: u8 = 0x84;
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES8: u8 = 0x8e;
    pub const EMPTY_SET: u8 = 0x8f;
    pub const ADDITEMS: u8 = 0x90;
    pub const FROZENSET: u8 = 0x91;
    pub const NEWOBJ_EX: u8 = 0x92;
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const MEMOIZE: u8 = 0x94;
    pub const FRAME: u8 = 0x95;
    pub const BYTEARRAY8: u8 = 0x96;
    pub const NEXT_BUFFER: u8 = 0x97;
    pub const READONLY_BUFFER: u8 = 0x98;
}

/// How an opcode's argument follows the opcode byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// This many bytes.
    Fixed(usize),
    /// A little-endian length in this many bytes, then that many bytes.
    Counted(usize),
    /// This many lines of text, each ending in `\n` (protocol 0 and 1 opcodes).
    Lines(usize),
}

/// The one opcode table: every opcode's name (as in CPython's `pickle.py`) and argument
/// layout. The VM names opcodes in errors with it, and [`super::part`] skips over opcodes with
/// it without running them.
pub const fn opcode_info(code: u8) -> Option<(&'static str, Arg)> {
    use Arg::{Counted, Fixed, Lines};
    Some(match code {
        op::MARK => ("MARK", Fixed(0)),
        op::STOP => ("STOP", Fixed(0)),
        op::POP => ("POP", Fixed(0)),
        op::POP_MARK => ("POP_MARK", Fixed(0)),
        op::DUP => ("DUP", Fixed(0)),
        op::FLOAT => ("FLOAT", Lines(1)),
        op::INT => ("INT", Lines(1)),
        op::BININT => ("BININT", Fixed(4)),
        op::BININT1 => ("BININT1", Fixed(1)),
        op::LONG => ("LONG", Lines(1)),
        op::BININT2 => ("BININT2", Fixed(2)),
        op::NONE => ("NONE", Fixed(0)),
        op::PERSID => ("PERSID", Lines(1)),
        op::BINPERSID => ("BINPERSID", Fixed(0)),
        op::REDUCE => ("REDUCE", Fixed(0)),
        op::STRING => ("STRING", Lines(1)),
        op::BINSTRING => ("BINSTRING", Counted(4)),
        op::SHORT_BINSTRING => ("SHORT_BINSTRING", Counted(1)),
        op::UNICODE => ("UNICODE", Lines(1)),
        op::BINUNICODE => ("BINUNICODE", Counted(4)),
        op::APPEND => ("APPEND", Fixed(0)),
        op::BUILD => ("BUILD", Fixed(0)),
        op::GLOBAL => ("GLOBAL", Lines(2)),
        op::DICT => ("DICT", Fixed(0)),
        op::EMPTY_DICT => ("EMPTY_DICT", Fixed(0)),
        op::APPENDS => ("APPENDS", Fixed(0)),
        op::GET => ("GET", Lines(1)),
        op::BINGET => ("BINGET", Fixed(1)),
        op::INST => ("INST", Lines(2)),
        op::LONG_BINGET => ("LONG_BINGET", Fixed(4)),
        op::LIST => ("LIST", Fixed(0)),
        op::EMPTY_LIST => ("EMPTY_LIST", Fixed(0)),
        op::OBJ => ("OBJ", Fixed(0)),
        op::PUT => ("PUT", Lines(1)),
        op::BINPUT => ("BINPUT", Fixed(1)),
        op::LONG_BINPUT => ("LONG_BINPUT", Fixed(4)),
        op::SETITEM => ("SETITEM", Fixed(0)),
        op::TUPLE => ("TUPLE", Fixed(0)),
        op::EMPTY_TUPLE => ("EMPTY_TUPLE", Fixed(0)),
        op::SETITEMS => ("SETITEMS", Fixed(0)),
        op::BINFLOAT => ("BINFLOAT", Fixed(8)),
        op::PROTO => ("PROTO", Fixed(1)),
        op::NEWOBJ => ("NEWOBJ", Fixed(0)),
        op::EXT1 => ("EXT1", Fixed(1)),
        op::EXT2 => ("EXT2", Fixed(2)),
        op::EXT4 => ("EXT4", Fixed(4)),
        op::TUPLE1 => ("TUPLE1", Fixed(0)),
        op::TUPLE2 => ("TUPLE2", Fixed(0)),
        op::TUPLE3 => ("TUPLE3", Fixed(0)),
        op::NEWTRUE => ("NEWTRUE", Fixed(0)),
        op::NEWFALSE => ("NEWFALSE", Fixed(0)),
        op::LONG1 => ("LONG1", Counted(1)),
        op::LONG4 => ("LONG4", Counted(4)),
        op::BINBYTES => ("BINBYTES", Counted(4)),
        op::SHORT_BINBYTES => ("SHORT_BINBYTES", Counted(1)),
        op::SHORT_BINUNICODE => ("SHORT_BINUNICODE", Counted(1)),
        op::BINUNICODE8 => ("BINUNICODE8", Counted(8)),
        op::BINBYTES8 => ("BINBYTES8", Counted(8)),
        op::EMPTY_SET => ("EMPTY_SET", Fixed(0)),
        op::ADDITEMS => ("ADDITEMS", Fixed(0)),
        op::FROZENSET => ("FROZENSET", Fixed(0)),
        op::NEWOBJ_EX => ("NEWOBJ_EX", Fixed(0)),
        op::STACK_GLOBAL => ("STACK_GLOBAL", Fixed(0)),
        op::MEMOIZE => ("MEMOIZE", Fixed(0)),
        op::FRAME => ("FRAME", Fixed(8)),
        op::BYTEARRAY8 => ("BYTEARRAY8", Counted(8)),
        op::NEXT_BUFFER => ("NEXT_BUFFER", Fixed(0)),
        op::READONLY_BUFFER => ("READONLY_BUFFER", Fixed(0)),
        _ => return None,
    })
}

/// The name of an opcode, for error messages.
fn opcode_name(code: u8) -> Option<&'static str> {
    opcode_info(code).map(|(name, _)| name)
}

/// Whether an opcode would import or call something.
pub const fn executes_code(code: u8) -> bool {
    matches!(
        code,
        op::GLOBAL
            | op::STACK_GLOBAL
            | op::REDUCE
            | op::BUILD
            | op::INST
            | op::OBJ
            | op::NEWOBJ
            | op::NEWOBJ_EX
            | op::PERSID
            | op::BINPERSID
            | op::EXT1
            | op::EXT2
            | op::EXT4
    )
}

/// Where the VM's bytes come from.
pub(crate) trait Feed {
    /// The bytes available now, from the current window start.
    fn window(&self) -> &[u8];
    /// Moves the window start `drop` bytes on (always, even when reading then fails), then
    /// reads until at least `need` bytes are available or the input ends.
    fn refill(&mut self, drop: usize, need: usize) -> std::io::Result<()>;
}

/// Input already in memory: the window is the rest of the slice.
pub(crate) struct SliceFeed<'a> {
    data: &'a [u8],
    start: usize,
}

impl<'a> SliceFeed<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        SliceFeed { data, start: 0 }
    }
}

impl Feed for SliceFeed<'_> {
    #[inline(always)]
    fn window(&self) -> &[u8] {
        &self.data[self.start..]
    }

    fn refill(&mut self, drop: usize, _need: usize) -> std::io::Result<()> {
        self.start += drop;
        Ok(())
    }
}

/// A reader seen through a buffer of about [`READ_CHUNK`] bytes.
pub(crate) struct ReaderFeed<R> {
    reader: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl<R: Read> ReaderFeed<R> {
    pub fn new(reader: R) -> Self {
        ReaderFeed {
            reader,
            buf: Vec::new(),
            start: 0,
            end: 0,
        }
    }
}

impl<R: Read> Feed for ReaderFeed<R> {
    #[inline(always)]
    fn window(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn refill(&mut self, drop: usize, need: usize) -> std::io::Result<()> {
        self.start += drop;
        if self.end - self.start >= need {
            return Ok(());
        }
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        let size = need.max(READ_CHUNK);
        if self.buf.len() < size {
            self.buf.resize(size, 0);
        }
        while self.end < need {
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => break,
                Ok(n) => self.end += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The pickle memo: dense for the indices picklers use (counting up from 0), sparse beyond.
/// Dense slots are [`Val`]s packed into 8 bytes (a 1M-entry file memoizes 2M objects).
#[derive(Default)]
struct Memo {
    dense: Vec<u64>,
    /// Values too wide to pack, referenced from `dense`.
    wide: Vec<Val>,
    sparse: HashMap<u64, Val>,
    /// Number of indices stored (the next `MEMOIZE` index).
    count: usize,
    /// Bumped whenever a stored index changes or is removed (not when one is added): what was
    /// concluded from memo references before then may be stale (see `fast_path::ListCache`).
    changes: u64,
}

/// Where a [`Memo::put`] went and what it replaced, to undo it.
#[derive(Clone, Copy, Debug, Default)]
struct MemoPut {
    index: u64,
    dense: bool,
    old: Option<Val>,
}

/// Packed memo slot layout: the low 3 bits are the tag, 0 is an empty slot.
mod slot {
    pub const EMPTY: u64 = 0;
    pub const NODE: u64 = 1;
    pub const STR: u64 = 2;
    pub const INT: u64 = 3;
    /// `None` (payload 0), `False` (1) or `True` (2).
    pub const SMALL: u64 = 4;
    pub const STACK: u64 = 5;
    pub const WIDE: u64 = 6;
    pub const ENTRY: u64 = 7;
    pub const TAG: u64 = 7;
}

impl Memo {
    #[inline(always)]
    fn pack(&mut self, v: Val) -> u64 {
        match v {
            Val::Node(id) => (u64::from(id) << 32) | slot::NODE,
            Val::Entry(index) => (u64::from(index) << 32) | slot::ENTRY,
            Val::Str { start, len, sym } if start < 1 << 40 && len < 1 << 16 => {
                ((start as u64) << 24)
                    | (u64::from(len) << 8)
                    | (u64::from(sym as u8) << 3)
                    | slot::STR
            }
            Val::Int(i) if (i << 3) >> 3 == i => ((i << 3) as u64) | slot::INT,
            Val::Stack(id) => (u64::from(id) << 32) | slot::STACK,
            Val::None => slot::SMALL,
            Val::Bool(b) => ((1 + u64::from(b)) << 3) | slot::SMALL,
            wide => self.pack_wide(wide),
        }
    }

    #[cold]
    fn pack_wide(&mut self, wide: Val) -> u64 {
        self.wide.push(wide);
        ((self.wide.len() as u64 - 1) << 3) | slot::WIDE
    }

    /// What the str stored at a dense index was recognised as (`None` for anything else).
    #[inline(always)]
    fn sym_at(&self, index: u64) -> Option<Sym> {
        let packed = *self.dense.get(index as usize)?;
        (packed & slot::TAG == slot::STR).then(|| Sym::from_u8(((packed >> 3) & 0x1f) as u8))
    }

    #[inline(always)]
    fn unpack(&self, packed: u64) -> Option<Val> {
        Some(match packed & slot::TAG {
            slot::NODE => Val::Node((packed >> 32) as u32),
            slot::ENTRY => Val::Entry((packed >> 32) as u32),
            slot::STR => Val::Str {
                start: (packed >> 24) as usize,
                len: ((packed >> 8) & 0xffff) as u32,
                sym: Sym::from_u8(((packed >> 3) & 0x1f) as u8),
            },
            slot::INT => Val::Int(packed as i64 >> 3),
            slot::STACK => Val::Stack((packed >> 32) as u32),
            slot::SMALL => match packed >> 3 {
                0 => Val::None,
                small => Val::Bool(small == 2),
            },
            slot::WIDE => *self.wide.get((packed >> 3) as usize)?,
            _ => return None,
        })
    }

    /// Stores `v` at `index`.
    #[inline(always)]
    fn put(&mut self, index: u64, v: Val) -> MemoPut {
        if self.try_push(index, v) {
            return MemoPut {
                index,
                dense: true,
                old: None,
            };
        }
        self.put_elsewhere(index, v)
    }

    /// Stores `v` when `index` is the next dense one (picklers count up: the usual case).
    #[inline(always)]
    fn try_push(&mut self, index: u64, v: Val) -> bool {
        if index as usize != self.dense.len() || index >= u32::MAX as u64 {
            return false;
        }
        let packed = self.pack(v);
        self.dense.push(packed);
        self.count += 1;
        true
    }

    #[inline(never)]
    fn put_elsewhere(&mut self, index: u64, v: Val) -> MemoPut {
        let dense_limit = self.dense.len() + MEMO_DENSE_SLACK;
        let dense = (index as usize) < dense_limit && index < u32::MAX as u64;
        let old = if dense {
            let i = index as usize;
            let packed = self.pack(v);
            if i == self.dense.len() {
                // Picklers count up: the usual case.
                self.dense.push(packed);
                None
            } else {
                if i > self.dense.len() {
                    self.dense.resize(i + 1, slot::EMPTY);
                }
                let old = std::mem::replace(&mut self.dense[i], packed);
                self.unpack(old)
            }
        } else {
            self.sparse.insert(index, v)
        };
        if old.is_none() {
            self.count += 1;
        } else {
            self.changes += 1;
        }
        MemoPut { index, dense, old }
    }

    /// The node stored at a dense index, without unpacking anything else.
    #[inline(always)]
    fn node_at(&self, index: u64) -> Option<u32> {
        let packed = *self.dense.get(index as usize)?;
        (packed & slot::TAG == slot::NODE).then_some((packed >> 32) as u32)
    }

    #[inline(always)]
    fn get(&self, index: u64) -> Option<Val> {
        match self.dense.get(index as usize) {
            Some(&packed) if packed != slot::EMPTY => self.unpack(packed),
            _ => self.sparse.get(&index).copied(),
        }
    }

    /// Undoes a [`Memo::put`].
    fn undo(&mut self, put: MemoPut) {
        self.changes += 1;
        if put.old.is_none() {
            self.count -= 1;
        }
        if put.dense {
            let packed = match put.old {
                Some(v) => self.pack(v),
                None => slot::EMPTY,
            };
            self.dense[put.index as usize] = packed;
        } else {
            match put.old {
                Some(v) => self.sparse.insert(put.index, v),
                None => self.sparse.remove(&put.index),
            };
        }
    }
}

struct Vm<'p, 'o, F> {
    feed: F,
    /// Input offset of the window start.
    base: u64,
    /// Input length (for length checks and progress).
    total: u64,
    /// Read position in the window.
    pos: usize,
    /// Input offset of the opcode being run, for errors.
    at: u64,
    stack: Vec<Val>,
    marks: Vec<usize>,
    memo: Memo,
    arena: Arena,
    state: ConvState,
    progress: Progress<'p>,
    /// Shown the trace entries read since the last call, at each progress tick.
    observe: Option<Observe<'o>>,
    /// Entries already shown to `observe`.
    observed: usize,
    /// Take [`Vm::fast_entry`] when it applies (off only to test it against the generic path).
    fast_entries: bool,
    /// Frames of the frames list [`Vm::fast_frames_list`] is reading.
    frames_buf: Vec<FrameId>,
    /// Reused for [`ConvState::cache_journal`].
    journal_buf: Vec<(bool, u32)>,
    /// Fresh frames lists already read, by their bytes.
    lists: fast_path::ListCache,
    /// Where to end the top-level dict as if `SETITEMS STOP` stood there (see [`super::part`]).
    end_at: Option<u64>,
}

/// Runs the pickle in `input` and returns its object graph, with trace entries already
/// converted (they are most of a snapshot, and converting them as they complete keeps their
/// keys and values out of the arena).
///
/// With `end_at`, the opcode at that offset is not read: the top-level dict is closed there
/// as if `SETITEMS STOP` followed, and the rest of the input is left alone.
pub(crate) fn run<F: Feed>(
    feed: F,
    total: u64,
    progress: Progress<'_>,
    observe: Option<Observe<'_>>,
    fast_entries: bool,
    end_at: Option<u64>,
) -> Result<(Arena, ConvState)> {
    let mut vm = Vm {
        feed,
        base: 0,
        total,
        pos: 0,
        at: 0,
        stack: Vec::with_capacity(1024),
        marks: Vec::with_capacity(64),
        memo: Memo::default(),
        arena: Arena {
            heap: Vec::new(),
            nodes: Vec::new(),
            chunks: Vec::new(),
            items: Vec::new(),
            shared_entries: HashSet::new(),
            root: Val::None,
        },
        state: ConvState::new(total),
        progress,
        observe,
        observed: 0,
        fast_entries,
        frames_buf: Vec::new(),
        journal_buf: Vec::new(),
        lists: fast_path::ListCache::default(),
        end_at,
    };
    vm.arena.root = vm.run()?;
    Ok((vm.arena, vm.state))
}

impl<F: Feed> Vm<'_, '_, F> {
    /// Input offset of window position `pos`.
    fn offset(&self, pos: usize) -> u64 {
        self.base + pos as u64
    }

    fn err(&self, what: impl Into<String>) -> FormatError {
        FormatError::Pickle {
            offset: self.at,
            what: what.into(),
        }
    }

    /// Input bytes not read yet.
    fn remaining(&self) -> u64 {
        self.total.saturating_sub(self.offset(self.pos))
    }

    /// Makes at least `n` bytes available at `pos` (which becomes the window start).
    #[cold]
    fn fill(&mut self, n: usize, what: &str) -> Result<()> {
        let drop = self.pos;
        // The feed moves its window before it reads, so this holds even when reading fails
        // (the fast path ignores that failure, and the generic path meets it again).
        let read = self.feed.refill(drop, n);
        self.base += drop as u64;
        self.pos = 0;
        read.map_err(|source| FormatError::Read {
            offset: self.base,
            source,
        })?;
        let rest = self.feed.window().len() - self.pos;
        if rest < n {
            return Err(self.err(format!(
                "truncated input: {what} needs {n} bytes, {rest} left"
            )));
        }
        Ok(())
    }

    /// The next `N` bytes.
    #[inline]
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        if self.feed.window().len() - self.pos < N {
            self.fill(N, what)?;
        }
        let b: [u8; N] = self.feed.window()[self.pos..self.pos + N]
            .try_into()
            .expect("N bytes");
        self.pos += N;
        Ok(b)
    }

    #[inline]
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    #[inline]
    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    #[inline]
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    #[inline]
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A text line ending in `\n` (text opcodes GET/PUT, GLOBAL), without the newline.
    fn line(&mut self, what: &str) -> Result<Vec<u8>> {
        loop {
            let rest = &self.feed.window()[self.pos..];
            if let Some(n) = rest.iter().position(|&b| b == b'\n') {
                let line = rest[..n].to_vec();
                self.pos += n + 1;
                return Ok(line);
            }
            let have = rest.len();
            if have >= MAX_LINE {
                return Err(self.err(format!("{what} longer than {MAX_LINE} bytes")));
            }
            // Ask for more than we have; too few bytes means the input ended.
            match self.fill(have + 1, what) {
                Ok(()) => {}
                Err(FormatError::Pickle { .. }) => {
                    return Err(self.err(format!("truncated input: {what} has no end of line")))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Copies a declared-length payload into the string heap, checking the length against
    /// the remaining input before anything is allocated. Returns its heap range.
    #[inline]
    fn payload(&mut self, len: u64, what: &str) -> Result<(usize, u32)> {
        let rest = self.remaining();
        if len > rest {
            return Err(self.err(format!(
                "{what} declares {len} bytes but only {rest} remain"
            )));
        }
        let len32 =
            u32::try_from(len).map_err(|_| self.err(format!("{what} longer than 4 GiB")))?;
        let start = self.arena.heap.len();
        let n = len32 as usize;
        let window = self.feed.window();
        if window.len() - self.pos >= n {
            self.arena
                .heap
                .extend_from_slice(&window[self.pos..self.pos + n]);
            self.pos += n;
        } else {
            self.payload_slow(n, what)?;
        }
        Ok((start, len32))
    }

    /// [`Vm::payload`] for a payload that crosses the window: copied piece by piece.
    #[cold]
    fn payload_slow(&mut self, mut n: usize, what: &str) -> Result<()> {
        while n > 0 {
            let window = self.feed.window();
            let take = (window.len() - self.pos).min(n);
            self.arena
                .heap
                .extend_from_slice(&window[self.pos..self.pos + take]);
            self.pos += take;
            n -= take;
            if n > 0 {
                self.fill(1, what)?;
            }
        }
        Ok(())
    }

    /// A `str` payload: copied, validated, and recognised when it is a key we look for.
    #[inline]
    fn str_payload(&mut self, len: u64, what: &str) -> Result<Val> {
        let payload_at = self.offset(self.pos);
        let (start, len) = self.payload(len, what)?;
        let bytes = &self.arena.heap[start..start + len as usize];
        let sym = if bytes.is_ascii() {
            Sym::classify(bytes)
        } else {
            if let Err(e) = std::str::from_utf8(bytes) {
                return Err(FormatError::Pickle {
                    offset: payload_at + e.valid_up_to() as u64,
                    what: format!("invalid UTF-8 in a {what} string"),
                });
            }
            Sym::Other
        };
        Ok(Val::Str { start, len, sym })
    }

    #[inline]
    fn push(&mut self, v: Val) {
        self.stack.push(v);
    }

    #[inline]
    fn pop(&mut self, what: &str) -> Result<Val> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err(format!("stack underflow in {what}")));
        }
        Ok(self.stack.pop().expect("non-empty"))
    }

    #[inline]
    fn top(&self, what: &str) -> Result<Val> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err(format!("stack underflow in {what}")));
        }
        Ok(*self.stack.last().expect("non-empty"))
    }

    fn pop_mark(&mut self, what: &str) -> Result<usize> {
        self.marks
            .pop()
            .ok_or_else(|| self.err(format!("{what} without a MARK")))
    }

    fn new_node(&mut self, kind: Kind) -> Result<u32> {
        let id = u32::try_from(self.arena.nodes.len())
            .ok()
            .filter(|&id| id != NONE)
            .ok_or_else(|| self.err("too many containers"))?;
        self.arena.nodes.push(Node {
            kind,
            first: NONE,
            last: NONE,
            len: 0,
            shared: false,
        });
        Ok(id)
    }

    /// Appends the stack values `from..` to a container and truncates the stack there.
    fn extend_from_stack(&mut self, node: u32, from: usize) -> Result<()> {
        let n = self.stack.len() - from;
        if n == 0 {
            return Ok(());
        }
        let at = self.at;
        let too_many = move || FormatError::Pickle {
            offset: at,
            what: "too many container items".into(),
        };
        let n32 = u32::try_from(n).map_err(|_| too_many())?;
        let nd = self.arena.nodes[node as usize];
        let new_len = nd.len.checked_add(n32).ok_or_else(too_many)?;
        let values = &self.stack[from..];
        let entry_run = match values[0] {
            Val::Entry(first) => values
                .iter()
                .zip(first..)
                .all(|(v, index)| matches!(*v, Val::Entry(e) if e == index))
                .then_some(first),
            _ => None,
        };
        let start = match entry_run {
            Some(first) => first as usize,
            None => {
                let start = self.arena.items.len();
                if start + n >= NONE as usize {
                    return Err(too_many());
                }
                self.arena.items.extend_from_slice(values);
                start
            }
        };
        let entries = entry_run.is_some();
        self.stack.truncate(from);
        let last = nd.last;
        if last != NONE {
            let c = &mut self.arena.chunks[last as usize];
            if c.entries == entries && (c.start + c.len) as usize == start {
                c.len += n32;
                self.arena.nodes[node as usize].len = new_len;
                return Ok(());
            }
        }
        let cid = self.arena.chunks.len() as u32;
        if cid == NONE {
            return Err(too_many());
        }
        self.arena.chunks.push(Chunk {
            start: start as u32,
            len: n32,
            next: NONE,
            entries,
        });
        let nd = &mut self.arena.nodes[node as usize];
        if last == NONE {
            nd.first = cid;
        } else {
            self.arena.chunks[last as usize].next = cid;
        }
        let nd = &mut self.arena.nodes[node as usize];
        nd.last = cid;
        nd.len = new_len;
        Ok(())
    }

    /// A container built from the stack values above the last MARK (LIST, DICT, TUPLE).
    fn container_from_mark(&mut self, kind: Kind, name: &str) -> Result<()> {
        let from = self.pop_mark(name)?;
        if kind == Kind::Dict && !(self.stack.len() - from).is_multiple_of(2) {
            return Err(self.err(format!("{name} with an odd number of items")));
        }
        let id = self.new_node(kind)?;
        self.extend_from_stack(id, from)?;
        self.push(Val::Node(id));
        Ok(())
    }

    fn tuple_of(&mut self, n: usize, name: &str) -> Result<()> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() < floor + n {
            return Err(self.err(format!("stack underflow in {name}")));
        }
        let from = self.stack.len() - n;
        let id = self.new_node(Kind::Tuple)?;
        self.extend_from_stack(id, from)?;
        self.push(Val::Node(id));
        Ok(())
    }

    /// The container `target` must be a mutable one of `kind`.
    fn check_target(&self, target: Val, kind: Kind, name: &str) -> Result<u32> {
        let frozen = match target {
            Val::Node(id) => self.state.is_frozen(id),
            // A frames list the fast path read as a stack: the generic VM would have read
            // (and frozen) its node, so both report the same error.
            Val::Stack(_) => true,
            _ => false,
        };
        if self.arena.entry_of(target).is_some() || frozen {
            return Err(self.err(format!(
                "{name} modifies a dict or list after it was read as a trace entry, stack or frame (not supported)"
            )));
        }
        match target {
            Val::Node(id) if self.arena.nodes[id as usize].kind == kind => Ok(id),
            other => Err(self.err(format!(
                "{name} on a {}, expected a {}",
                self.arena.type_name(other),
                match kind {
                    Kind::List => "list",
                    Kind::Dict | Kind::Entry => "dict",
                    Kind::Tuple => "tuple",
                }
            ))),
        }
    }

    /// Converts a dict that is being filled in one batch to a trace entry now, when it has
    /// the shape of one and converts losslessly; otherwise it stays a generic dict (and the
    /// conversion pass reports any error with its path).
    fn try_pack_entry(&mut self, id: u32, from: usize) -> bool {
        let pairs = &self.stack[from..];
        let looks_like_entry = pairs.len() >= 8
            && pairs.iter().step_by(2).take(2).any(|k| {
                matches!(
                    k,
                    Val::Str {
                        sym: Sym::Action,
                        ..
                    }
                )
            });
        if !looks_like_entry || self.state.entries.len() >= NONE as usize {
            return false;
        }
        let Some(entry) = Conv::new(&self.arena, &mut self.state).packed_entry(pairs) else {
            return false;
        };
        let node = &mut self.arena.nodes[id as usize];
        node.kind = Kind::Entry;
        node.first = self.state.entries.len() as u32;
        self.state.entries.push(entry);
        true
    }

    #[inline]
    fn memo_get(&mut self, index: u64) -> Result<()> {
        let v = self
            .memo
            .get(index)
            .ok_or_else(|| self.err(format!("memo index {index} was never stored")))?;
        self.mark_shared(v);
        self.push(v);
        Ok(())
    }

    #[inline]
    fn mark_shared(&mut self, v: Val) {
        match v {
            Val::Node(id) => self.arena.nodes[id as usize].shared = true,
            Val::Entry(index) => {
                self.arena.shared_entries.insert(index);
            }
            _ => {}
        }
    }

    #[inline]
    fn long(&mut self, len: u64, name: &str) -> Result<Val> {
        let window = self.feed.window();
        if len <= 8 && window.len() - self.pos >= len as usize {
            // The common case (addresses, timestamps) never touches the heap.
            let n = len as usize;
            if let Some(v) = short_long(window, self.pos, n) {
                self.pos += n;
                return Ok(Val::Int(v));
            }
        }
        let (start, len32) = self.payload(len, name)?;
        Ok(match long_to_i64(self.arena.bytes(start, len32)) {
            Some(i) => {
                self.arena.heap.truncate(start);
                Val::Int(i)
            }
            None => Val::BigInt { start, len: len32 },
        })
    }

    fn text_index(&mut self, name: &str) -> Result<u64> {
        let line = self.line(name)?;
        std::str::from_utf8(&line)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| self.err(format!("{name} with a malformed memo index")))
    }

    fn refuse(&mut self, code: u8) -> FormatError {
        let name = opcode_name(code).unwrap_or("?");
        let detail = match code {
            op::GLOBAL => {
                let module = self.line("GLOBAL module").ok();
                let qual = self.line("GLOBAL name").ok();
                match (module, qual) {
                    (Some(m), Some(q)) => format!(
                        " '{} {}'",
                        String::from_utf8_lossy(&m),
                        String::from_utf8_lossy(&q)
                    ),
                    _ => String::new(),
                }
            }
            op::STACK_GLOBAL => {
                let n = self.stack.len();
                let name_of = |v: Option<&Val>| match v {
                    Some(&Val::Str { start, len, .. }) => {
                        Some(String::from_utf8_lossy(self.arena.bytes(start, len)))
                    }
                    _ => None,
                };
                match (
                    name_of(n.checked_sub(2).and_then(|i| self.stack.get(i))),
                    name_of(self.stack.last()),
                ) {
                    (Some(m), Some(q)) => format!(" '{m} {q}'"),
                    _ => String::new(),
                }
            }
            _ => String::new(),
        };
        self.err(format!(
            "refusing to execute {name}{detail} (snapshots are plain data; this pickle would import or call code)"
        ))
    }

    /// The next offset at which the loop stops to report progress or to end early.
    fn next_checkpoint(&self, from: u64) -> u64 {
        let next = from.saturating_add(PROGRESS_STEP as u64).min(self.total);
        let next = match self.end_at {
            Some(end) if end > from => next.min(end),
            _ => next,
        };
        if next <= from {
            u64::MAX
        } else {
            next
        }
    }

    /// `STOP`: the value on top of the stack is the result.
    fn stop(&mut self) -> Result<Val> {
        // Like CPython, a dangling MARK or extra stack items are ignored.
        let v = self
            .stack
            .pop()
            .ok_or_else(|| self.err("STOP with an empty stack"))?;
        if (self.progress)(self.total, self.total) {
            return Ok(v);
        }
        Err(FormatError::Cancelled)
    }

    /// `SETITEMS`: the pairs above the last MARK go into the dict below it.
    fn setitems(&mut self) -> Result<()> {
        let from = self.pop_mark("SETITEMS")?;
        let Some(target_at) = from.checked_sub(1) else {
            return Err(self.err("SETITEMS with no dict below the MARK"));
        };
        if target_at < self.marks.last().copied().unwrap_or(0) {
            return Err(self.err("SETITEMS with no dict below the MARK"));
        }
        if !(self.stack.len() - from).is_multiple_of(2) {
            return Err(self.err("SETITEMS with an odd number of items"));
        }
        let id = self.check_target(self.stack[target_at], Kind::Dict, "SETITEMS")?;
        if self.arena.nodes[id as usize].len == 0 && self.try_pack_entry(id, from) {
            self.stack.truncate(from);
        } else {
            self.extend_from_stack(id, from)?;
        }
        Ok(())
    }

    fn run(&mut self) -> Result<Val> {
        let total = self.total;
        // One comparison per opcode serves both the progress callback and `end_at`.
        let mut next_checkpoint = self.next_checkpoint(0);
        loop {
            self.at = self.offset(self.pos);
            if self.at >= next_checkpoint && total > 0 {
                if self.end_at == Some(self.at) {
                    self.setitems()?;
                    return self.stop();
                }
                if !(self.progress)(self.at.min(total), total) {
                    return Err(FormatError::Cancelled);
                }
                // Between opcodes every entry read is final (a fast-path attempt rolls
                // back within its opcode).
                if let Some(observe) = self.observe.as_mut() {
                    observe(&self.state.entries[self.observed..]);
                    self.observed = self.state.entries.len();
                }
                next_checkpoint = self.next_checkpoint(self.at);
            }
            let code = match self.feed.window().get(self.pos) {
                Some(&code) => code,
                None => {
                    match self.fill(1, "opcode") {
                        Ok(()) => {}
                        Err(FormatError::Pickle { .. }) => {
                            return Err(self.err("truncated input: ended before the STOP opcode"))
                        }
                        Err(e) => return Err(e),
                    }
                    self.feed.window()[self.pos]
                }
            };
            self.pos += 1;
            match code {
                op::PROTO => {
                    let v = self.u8("PROTO")?;
                    if v > MAX_PROTOCOL {
                        return Err(self.err(format!("unsupported pickle protocol {v}")));
                    }
                }
                op::FRAME => {
                    let len = self.u64("FRAME length")?;
                    let rest = self.remaining();
                    // Reading part of a file, the frame may hold bytes we never read.
                    if len > rest && self.end_at.is_none() {
                        return Err(
                            self.err(format!("FRAME declares {len} bytes but only {rest} remain"))
                        );
                    }
                }
                op::STOP => return self.stop(),
                op::MARK => self.marks.push(self.stack.len()),
                op::POP => {
                    if self.stack.len() > self.marks.last().copied().unwrap_or(0) {
                        self.stack.pop();
                    } else {
                        // POP of a MARK (the pure-Python unpickler allows this).
                        self.pop_mark("POP")?;
                    }
                }
                op::POP_MARK => {
                    let from = self.pop_mark("POP_MARK")?;
                    self.stack.truncate(from);
                }
                op::DUP => {
                    let v = self.top("DUP")?;
                    self.mark_shared(v);
                    self.push(v);
                }
                op::NONE => self.push(Val::None),
                op::NEWTRUE => self.push(Val::Bool(true)),
                op::NEWFALSE => self.push(Val::Bool(false)),
                op::BININT1 => {
                    let v = self.u8("BININT1")?;
                    self.push(Val::Int(v.into()));
                }
                op::BININT2 => {
                    let v = self.u16("BININT2")?;
                    self.push(Val::Int(v.into()));
                }
                op::BININT => {
                    let v = self.u32("BININT")? as i32;
                    self.push(Val::Int(v.into()));
                }
                op::LONG1 => {
                    let n = self.u8("LONG1 length")?;
                    let v = self.long(n.into(), "LONG1")?;
                    self.push(v);
                }
                op::LONG4 => {
                    let n = self.u32("LONG4 length")? as i32;
                    if n < 0 {
                        return Err(self.err("LONG4 with a negative length"));
                    }
                    let v = self.long(n as u64, "LONG4")?;
                    self.push(v);
                }
                op::BINFLOAT => {
                    let v = f64::from_be_bytes(self.array("BINFLOAT")?);
                    self.push(Val::Float(v));
                }
                op::SHORT_BINUNICODE => {
                    let n = self.u8("SHORT_BINUNICODE length")?;
                    let v = self.str_payload(n.into(), "SHORT_BINUNICODE")?;
                    self.push(v);
                }
                op::BINUNICODE => {
                    let n = self.u32("BINUNICODE length")?;
                    let v = self.str_payload(n.into(), "BINUNICODE")?;
                    self.push(v);
                }
                op::BINUNICODE8 => {
                    let n = self.u64("BINUNICODE8 length")?;
                    let v = self.str_payload(n, "BINUNICODE8")?;
                    self.push(v);
                }
                op::SHORT_BINBYTES => {
                    let n = self.u8("SHORT_BINBYTES length")?;
                    let (start, len) = self.payload(n.into(), "SHORT_BINBYTES")?;
                    self.push(Val::Bytes { start, len });
                }
                op::BINBYTES => {
                    let n = self.u32("BINBYTES length")?;
                    let (start, len) = self.payload(n.into(), "BINBYTES")?;
                    self.push(Val::Bytes { start, len });
                }
                op::BINBYTES8 => {
                    let n = self.u64("BINBYTES8 length")?;
                    let (start, len) = self.payload(n, "BINBYTES8")?;
                    self.push(Val::Bytes { start, len });
                }
                op::EMPTY_LIST => {
                    let id = self.new_node(Kind::List)?;
                    self.push(Val::Node(id));
                }
                op::EMPTY_DICT => {
                    if !(self.fast_entries && self.fast_entry()) {
                        let id = self.new_node(Kind::Dict)?;
                        self.push(Val::Node(id));
                    }
                }
                op::EMPTY_TUPLE => {
                    let id = self.new_node(Kind::Tuple)?;
                    self.push(Val::Node(id));
                }
                op::LIST => self.container_from_mark(Kind::List, "LIST")?,
                op::DICT => self.container_from_mark(Kind::Dict, "DICT")?,
                op::TUPLE => self.container_from_mark(Kind::Tuple, "TUPLE")?,
                op::TUPLE1 => self.tuple_of(1, "TUPLE1")?,
                op::TUPLE2 => self.tuple_of(2, "TUPLE2")?,
                op::TUPLE3 => self.tuple_of(3, "TUPLE3")?,
                op::APPEND => {
                    let v = self.pop("APPEND")?;
                    let target = self.top("APPEND")?;
                    let id = self.check_target(target, Kind::List, "APPEND")?;
                    self.push(v);
                    let from = self.stack.len() - 1;
                    self.extend_from_stack(id, from)?;
                }
                op::APPENDS => {
                    let from = self.pop_mark("APPENDS")?;
                    let Some(target_at) = from.checked_sub(1) else {
                        return Err(self.err("APPENDS with no list below the MARK"));
                    };
                    if target_at < self.marks.last().copied().unwrap_or(0) {
                        return Err(self.err("APPENDS with no list below the MARK"));
                    }
                    let id = self.check_target(self.stack[target_at], Kind::List, "APPENDS")?;
                    self.extend_from_stack(id, from)?;
                }
                op::SETITEM => {
                    let v = self.pop("SETITEM")?;
                    let k = self.pop("SETITEM")?;
                    let target = self.top("SETITEM")?;
                    let id = self.check_target(target, Kind::Dict, "SETITEM")?;
                    self.push(k);
                    self.push(v);
                    let from = self.stack.len() - 2;
                    self.extend_from_stack(id, from)?;
                }
                op::SETITEMS => self.setitems()?,
                op::MEMOIZE => {
                    let v = self.top("MEMOIZE")?;
                    self.memo.put(self.memo.count as u64, v);
                }
                op::BINPUT => {
                    let i = self.u8("BINPUT")?;
                    let v = self.top("BINPUT")?;
                    self.memo.put(i.into(), v);
                }
                op::LONG_BINPUT => {
                    let i = self.u32("LONG_BINPUT")?;
                    let v = self.top("LONG_BINPUT")?;
                    self.memo.put(i.into(), v);
                }
                op::PUT => {
                    let i = self.text_index("PUT")?;
                    let v = self.top("PUT")?;
                    self.memo.put(i, v);
                }
                op::BINGET => {
                    let i = self.u8("BINGET")?;
                    self.memo_get(i.into())?;
                }
                op::LONG_BINGET => {
                    let i = self.u32("LONG_BINGET")?;
                    self.memo_get(i.into())?;
                }
                op::GET => {
                    let i = self.text_index("GET")?;
                    self.memo_get(i)?;
                }
                code if executes_code(code) => return Err(self.refuse(code)),
                code => {
                    return Err(self.err(match opcode_name(code) {
                        Some(name) => {
                            format!("unsupported opcode {name} (not used by snapshot pickles)")
                        }
                        None => format!("unknown opcode 0x{code:02x}"),
                    }))
                }
            }
        }
    }
}

/// The `n <= 8` byte little-endian two's-complement integer at `window[at..]`, or `None` when
/// the window ends first. Sign-extends with shifts when 8 bytes can be loaded at once.
#[inline]
fn short_long(window: &[u8], at: usize, n: usize) -> Option<i64> {
    debug_assert!(n <= 8);
    if n == 0 {
        return (at <= window.len()).then_some(0);
    }
    if let Some(eight) = window.get(at..at + 8) {
        let raw = u64::from_le_bytes(eight.try_into().ok()?);
        let unused = 64 - 8 * n as u32;
        return Some(((raw << unused) as i64) >> unused);
    }
    long_to_i64(window.get(at..at + n)?)
}

/// A little-endian two's-complement integer, if it fits `i64`.
pub(crate) fn long_to_i64(bytes: &[u8]) -> Option<i64> {
    if bytes.is_empty() {
        return Some(0);
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    let fill = if negative { 0xff } else { 0x00 };
    if bytes.len() > 8 {
        // Fits only if the extra bytes are sign extension of byte 7.
        let (low, high) = bytes.split_at(8);
        if high.iter().any(|&b| b != fill) || (low[7] & 0x80 != 0) != negative {
            return None;
        }
        return Some(i64::from_le_bytes(low.try_into().expect("8 bytes")));
    }
    let mut buf = [fill; 8];
    buf[..bytes.len()].copy_from_slice(bytes);
    Some(i64::from_le_bytes(buf))
}

/// A little-endian two's-complement integer as `u64`, if it is in range.
#[cfg(test)]
pub(crate) fn long_to_u64(bytes: &[u8]) -> Option<u64> {
    if bytes.last().is_some_and(|b| b & 0x80 != 0) {
        return None;
    }
    let (low, high) = bytes.split_at(bytes.len().min(8));
    if high.iter().any(|&b| b != 0) {
        return None;
    }
    let mut buf = [0u8; 8];
    buf[..low.len()].copy_from_slice(low);
    Some(u64::from_le_bytes(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memo_slots_keep_every_value() {
        let values = [
            Val::None,
            Val::Bool(false),
            Val::Bool(true),
            Val::Int(0),
            Val::Int(-1),
            Val::Int(i64::MAX >> 3),
            Val::Int(i64::MIN >> 3),
            Val::Int(i64::MAX),
            Val::Int(i64::MIN),
            Val::Float(-0.5),
            Val::Float(f64::NAN),
            Val::BigInt { start: 3, len: 9 },
            Val::Bytes { start: 7, len: 2 },
            Val::Node(0),
            Val::Node(u32::MAX - 1),
            Val::Str {
                start: 0,
                len: 0,
                sym: Sym::Other,
            },
            Val::Str {
                start: (1 << 40) - 1,
                len: 0xffff,
                sym: Sym::ActFree,
            },
            Val::Str {
                start: 1 << 40,
                len: 3,
                sym: Sym::Action,
            },
            Val::Str {
                start: 5,
                len: 1 << 16,
                sym: Sym::TimeUs,
            },
        ];
        let mut memo = Memo::default();
        for (i, &v) in values.iter().enumerate() {
            memo.put(i as u64, v);
        }
        // Far beyond the dense part: sparse.
        memo.put(1 << 40, Val::Int(7));
        assert_eq!(memo.count, values.len() + 1);
        for (i, &v) in values.iter().enumerate() {
            assert_eq!(
                format!("{:?}", memo.get(i as u64)),
                format!("{:?}", Some(v))
            );
        }
        assert!(matches!(memo.get(1 << 40), Some(Val::Int(7))));
        assert!(memo.get(values.len() as u64).is_none());
        // Undo restores both the value and the count.
        let put = memo.put(2, Val::Node(9));
        let fresh = memo.put(values.len() as u64, Val::None);
        memo.undo(fresh);
        memo.undo(put);
        assert_eq!(memo.count, values.len() + 1);
        assert!(matches!(memo.get(2), Some(Val::Bool(true))));
        assert!(memo.get(values.len() as u64).is_none());
    }

    #[test]
    fn long_decoding_handles_sign_and_width() {
        assert_eq!(long_to_i64(&[]), Some(0));
        assert_eq!(long_to_i64(&[0xff]), Some(-1));
        assert_eq!(
            long_to_i64(&[0x00, 0x80, 0xe9, 0xc3, 0x7f, 0x00]),
            Some(0x7fc3e98000)
        );
        // 2^63 needs 9 bytes: outside i64, inside u64.
        let two63 = [0, 0, 0, 0, 0, 0, 0, 0x80, 0];
        assert_eq!(long_to_i64(&two63), None);
        assert_eq!(long_to_u64(&two63), Some(1 << 63));
        // -1 written with a redundant sign byte still fits.
        assert_eq!(long_to_i64(&[0xff; 9]), Some(-1));
        // The shift path agrees with the byte path for every width and sign.
        for v in [
            0i64,
            1,
            -1,
            127,
            -128,
            255,
            1 << 40,
            -(1 << 40),
            i64::MAX,
            i64::MIN,
        ] {
            let bytes = v.to_le_bytes();
            for n in 1..=8 {
                let Some(expected) = long_to_i64(&bytes[..n]) else {
                    continue;
                };
                let mut padded = bytes[..n].to_vec();
                padded.extend([0xaa; 8]);
                assert_eq!(
                    short_long(&padded, 0, n),
                    Some(expected),
                    "{v} in {n} bytes"
                );
                assert_eq!(
                    short_long(&bytes[..n], 0, n),
                    Some(expected),
                    "{v} in {n} bytes, at the end"
                );
            }
        }
        assert_eq!(short_long(&[1, 2], 1, 2), None);
        assert_eq!(long_to_u64(&[0xff]), None);
    }
}
