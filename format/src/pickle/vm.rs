//! The pickle virtual machine: runs the data opcodes into an arena, executes nothing.
//!
//! Strings, bytes and big integers stay byte ranges of the input; small integers, floats and
//! bools are stored inline in [`Val`]; lists, dicts and tuples are [`Node`]s whose items live
//! in one flat vector, in chunks (one chunk per `APPENDS`/`SETITEMS` batch, merged when
//! batches are adjacent). A memo reference pushes the same `Val::Node`, so a list shared a
//! thousand times is stored once and the conversion pass can cache per node.

use std::collections::HashMap;

use crate::error::{FormatError, Result};
use crate::io::Progress;

use super::convert::{Conv, ConvState};

/// Highest protocol we read (`PROTO 5` is byte-identical to 4 for snapshot data).
const MAX_PROTOCOL: u8 = 5;
/// Call the progress callback about this often.
const PROGRESS_STEP: usize = 1 << 20;
/// Memo indices above `memo.len() + MEMO_DENSE_SLACK` go to a sparse map, so a hostile
/// `LONG_BINPUT 0xffffffff` cannot make us allocate a 64 GiB vector.
const MEMO_DENSE_SLACK: usize = 1 << 16;

/// No chunk / no node marker.
pub(crate) const NONE: u32 = u32::MAX;

/// One value on the VM stack, in the memo, or inside a container.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Val {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// A `LONG1`/`LONG4` integer outside `i64`: little-endian two's complement input bytes.
    BigInt {
        start: usize,
        len: u32,
    },
    /// UTF-8 (validated where used) input bytes.
    Str {
        start: usize,
        len: u32,
    },
    Bytes {
        start: usize,
        len: u32,
    },
    /// A list, dict or tuple in [`Arena::nodes`].
    Node(u32),
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
}

/// The result of running a pickle: the object graph and its root.
pub(crate) struct Arena<'a> {
    pub input: &'a [u8],
    pub nodes: Vec<Node>,
    chunks: Vec<Chunk>,
    items: Vec<Val>,
    pub root: Val,
}

impl<'a> Arena<'a> {
    /// The entry index of a node packed as a trace entry.
    pub fn entry_index(&self, id: u32) -> Option<usize> {
        let node = &self.nodes[id as usize];
        (node.kind == Kind::Entry).then_some(node.first as usize)
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

    /// The raw bytes of a `Str`, `Bytes` or `BigInt` value.
    pub fn bytes(&self, start: usize, len: u32) -> &'a [u8] {
        &self.input[start..start + len as usize]
    }
}

/// Iterator over a container's items.
pub(crate) struct Items<'a> {
    arena: &'a Arena<'a>,
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
                let v = self.arena.items[(c.start + self.pos) as usize];
                self.pos += 1;
                return Some(v);
            }
            self.chunk = c.next;
            self.pos = 0;
        }
    }
}

/// Opcodes (names as in CPython's `pickle.py`).
pub(crate) mod op {
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

/// The name of an opcode we refuse or do not support, for error messages.
fn opcode_name(code: u8) -> Option<&'static str> {
    Some(match code {
        op::GLOBAL => "GLOBAL",
        op::STACK_GLOBAL => "STACK_GLOBAL",
        op::REDUCE => "REDUCE",
        op::BUILD => "BUILD",
        op::INST => "INST",
        op::OBJ => "OBJ",
        op::NEWOBJ => "NEWOBJ",
        op::NEWOBJ_EX => "NEWOBJ_EX",
        op::PERSID => "PERSID",
        op::BINPERSID => "BINPERSID",
        op::EXT1 => "EXT1",
        op::EXT2 => "EXT2",
        op::EXT4 => "EXT4",
        op::EMPTY_SET => "EMPTY_SET",
        op::ADDITEMS => "ADDITEMS",
        op::FROZENSET => "FROZENSET",
        op::BYTEARRAY8 => "BYTEARRAY8",
        op::NEXT_BUFFER => "NEXT_BUFFER",
        op::READONLY_BUFFER => "READONLY_BUFFER",
        op::STRING => "STRING",
        op::BINSTRING => "BINSTRING",
        op::SHORT_BINSTRING => "SHORT_BINSTRING",
        op::UNICODE => "UNICODE",
        op::FLOAT => "FLOAT",
        op::INT => "INT",
        op::LONG => "LONG",
        _ => return None,
    })
}

/// Whether an opcode would import or call something.
fn executes_code(code: u8) -> bool {
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

struct Vm<'a, 'p> {
    input: &'a [u8],
    pos: usize,
    /// Offset of the opcode being run, for errors.
    at: usize,
    stack: Vec<Val>,
    marks: Vec<usize>,
    memo: Vec<Option<Val>>,
    sparse_memo: HashMap<u64, Val>,
    memo_count: usize,
    arena: Arena<'a>,
    state: ConvState,
    progress: Progress<'p>,
}

/// Runs the pickle in `input` and returns its object graph, with trace entries already
/// converted (they are most of a snapshot, and converting them as they complete keeps their
/// keys and values out of the arena).
pub(crate) fn run<'a>(input: &'a [u8], progress: Progress<'_>) -> Result<(Arena<'a>, ConvState)> {
    let mut vm = Vm {
        input,
        pos: 0,
        at: 0,
        stack: Vec::with_capacity(1024),
        marks: Vec::with_capacity(64),
        memo: Vec::new(),
        sparse_memo: HashMap::new(),
        memo_count: 0,
        arena: Arena {
            input,
            nodes: Vec::new(),
            chunks: Vec::new(),
            items: Vec::new(),
            root: Val::None,
        },
        state: ConvState::new(input.len()),
        progress,
    };
    vm.arena.root = vm.run()?;
    Ok((vm.arena, vm.state))
}

impl<'a> Vm<'a, '_> {
    fn err(&self, what: impl Into<String>) -> FormatError {
        FormatError::Pickle {
            offset: self.at as u64,
            what: what.into(),
        }
    }

    #[inline]
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let input: &'a [u8] = self.input;
        let rest = input.len() - self.pos;
        if n > rest {
            return Err(self.err(format!(
                "truncated input: {what} needs {n} bytes, {rest} left"
            )));
        }
        let s = &input[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    #[inline]
    fn u16(&mut self, what: &str) -> Result<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    #[inline]
    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    #[inline]
    fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// A text line ending in `\n` (text opcodes GET/PUT), without the newline.
    fn line(&mut self, what: &str) -> Result<&'a [u8]> {
        let input: &'a [u8] = self.input;
        let rest = &input[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            None => Err(self.err(format!("truncated input: {what} has no end of line"))),
        }
    }

    /// Checks a declared length against the remaining input before anything is read.
    fn payload(&mut self, len: u64, what: &str) -> Result<(usize, u32)> {
        let rest = (self.input.len() - self.pos) as u64;
        if len > rest {
            return Err(self.err(format!(
                "{what} declares {len} bytes but only {rest} remain"
            )));
        }
        let len32 =
            u32::try_from(len).map_err(|_| self.err(format!("{what} longer than 4 GiB")))?;
        let start = self.pos;
        self.pos += len as usize;
        Ok((start, len32))
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
        let at = self.at as u64;
        let too_many = move || FormatError::Pickle {
            offset: at,
            what: "too many container items".into(),
        };
        let n32 = u32::try_from(n).map_err(|_| too_many())?;
        let start = self.arena.items.len();
        if start + n >= NONE as usize {
            return Err(too_many());
        }
        let nd = self.arena.nodes[node as usize];
        let new_len = nd.len.checked_add(n32).ok_or_else(too_many)?;
        self.arena.items.extend_from_slice(&self.stack[from..]);
        self.stack.truncate(from);
        let last = nd.last;
        if last != NONE {
            let c = &mut self.arena.chunks[last as usize];
            if (c.start + c.len) as usize == start {
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
        if let Val::Node(id) = target {
            let node = &self.arena.nodes[id as usize];
            if node.kind == Kind::Entry || self.state.is_frozen(id) {
                return Err(self.err(format!(
                    "{name} modifies a dict or list after it was read as a trace entry, stack or frame (not supported)"
                )));
            }
        }
        match target {
            Val::Node(id) if self.arena.nodes[id as usize].kind == kind => Ok(id),
            other => Err(self.err(format!(
                "{name} on a {}, expected a {}",
                self.describe(other),
                match kind {
                    Kind::List => "list",
                    Kind::Dict | Kind::Entry => "dict",
                    Kind::Tuple => "tuple",
                }
            ))),
        }
    }

    fn describe(&self, v: Val) -> &'static str {
        match v {
            Val::None => "None",
            Val::Bool(_) => "bool",
            Val::Int(_) | Val::BigInt { .. } => "int",
            Val::Float(_) => "float",
            Val::Str { .. } => "str",
            Val::Bytes { .. } => "bytes",
            Val::Node(id) => match self.arena.nodes[id as usize].kind {
                Kind::List => "list",
                Kind::Dict | Kind::Entry => "dict",
                Kind::Tuple => "tuple",
            },
        }
    }

    /// Converts a dict that is being filled in one batch to a trace entry now, when it has
    /// the shape of one and converts losslessly; otherwise it stays a generic dict (and the
    /// conversion pass reports any error with its path).
    fn try_pack_entry(&mut self, id: u32, from: usize) -> bool {
        let pairs = &self.stack[from..];
        let looks_like_entry = pairs.len() >= 8
            && pairs
                .iter()
                .step_by(2)
                .take(2)
                .any(|k| matches!(k, Val::Str { start, len: 6 } if &self.arena.input[*start..*start + 6] == b"action"));
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

    fn memo_put(&mut self, index: u64, v: Val) {
        let dense_limit = self.memo.len() + MEMO_DENSE_SLACK;
        if (index as usize) < dense_limit && index < u32::MAX as u64 {
            let i = index as usize;
            if i >= self.memo.len() {
                self.memo.resize(i + 1, None);
            }
            if self.memo[i].replace(v).is_none() {
                self.memo_count += 1;
            }
        } else if self.sparse_memo.insert(index, v).is_none() {
            self.memo_count += 1;
        }
    }

    fn memo_get(&mut self, index: u64) -> Result<()> {
        let v = self
            .memo
            .get(index as usize)
            .copied()
            .flatten()
            .or_else(|| self.sparse_memo.get(&index).copied())
            .ok_or_else(|| self.err(format!("memo index {index} was never stored")))?;
        self.mark_shared(v);
        self.push(v);
        Ok(())
    }

    #[inline]
    fn mark_shared(&mut self, v: Val) {
        if let Val::Node(id) = v {
            self.arena.nodes[id as usize].shared = true;
        }
    }

    fn long(&mut self, len: u64, name: &str) -> Result<Val> {
        let (start, len32) = self.payload(len, name)?;
        let bytes = &self.input[start..start + len32 as usize];
        Ok(match long_to_i64(bytes) {
            Some(i) => Val::Int(i),
            None => Val::BigInt { start, len: len32 },
        })
    }

    fn text_index(&mut self, name: &str) -> Result<u64> {
        let line = self.line(name)?;
        std::str::from_utf8(line)
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
                        String::from_utf8_lossy(m),
                        String::from_utf8_lossy(q)
                    ),
                    _ => String::new(),
                }
            }
            op::STACK_GLOBAL => {
                let n = self.stack.len();
                let name_of = |v: Option<&Val>| match v {
                    Some(Val::Str { start, len }) => Some(String::from_utf8_lossy(
                        &self.input[*start..*start + *len as usize],
                    )),
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

    fn run(&mut self) -> Result<Val> {
        let total = self.input.len();
        let mut next_progress = PROGRESS_STEP.min(total);
        loop {
            if self.pos >= next_progress && total > 0 {
                if !(self.progress)(self.pos as u64, total as u64) {
                    return Err(FormatError::Cancelled);
                }
                next_progress = self.pos.saturating_add(PROGRESS_STEP).min(total.max(1));
                if next_progress <= self.pos {
                    next_progress = usize::MAX;
                }
            }
            self.at = self.pos;
            let Some(&code) = self.input.get(self.pos) else {
                return Err(self.err("truncated input: ended before the STOP opcode"));
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
                    let rest = (total - self.pos) as u64;
                    if len > rest {
                        return Err(
                            self.err(format!("FRAME declares {len} bytes but only {rest} remain"))
                        );
                    }
                }
                op::STOP => {
                    // Like CPython, a dangling MARK or extra stack items are ignored.
                    let v = self
                        .stack
                        .pop()
                        .ok_or_else(|| self.err("STOP with an empty stack"))?;
                    if (self.progress)(total as u64, total as u64) {
                        return Ok(v);
                    }
                    return Err(FormatError::Cancelled);
                }
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
                    let b = self.take(8, "BINFLOAT")?;
                    let v = f64::from_be_bytes(b.try_into().expect("8 bytes"));
                    self.push(Val::Float(v));
                }
                op::SHORT_BINUNICODE => {
                    let n = self.u8("SHORT_BINUNICODE length")?;
                    let (start, len) = self.payload(n.into(), "SHORT_BINUNICODE")?;
                    self.push(Val::Str { start, len });
                }
                op::BINUNICODE => {
                    let n = self.u32("BINUNICODE length")?;
                    let (start, len) = self.payload(n.into(), "BINUNICODE")?;
                    self.push(Val::Str { start, len });
                }
                op::BINUNICODE8 => {
                    let n = self.u64("BINUNICODE8 length")?;
                    let (start, len) = self.payload(n, "BINUNICODE8")?;
                    self.push(Val::Str { start, len });
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
                    let id = self.new_node(Kind::Dict)?;
                    self.push(Val::Node(id));
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
                op::SETITEMS => {
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
                }
                op::MEMOIZE => {
                    let v = self.top("MEMOIZE")?;
                    self.memo_put(self.memo_count as u64, v);
                }
                op::BINPUT => {
                    let i = self.u8("BINPUT")?;
                    let v = self.top("BINPUT")?;
                    self.memo_put(i.into(), v);
                }
                op::LONG_BINPUT => {
                    let i = self.u32("LONG_BINPUT")?;
                    let v = self.top("LONG_BINPUT")?;
                    self.memo_put(i.into(), v);
                }
                op::PUT => {
                    let i = self.text_index("PUT")?;
                    let v = self.top("PUT")?;
                    self.memo_put(i, v);
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
        assert_eq!(long_to_u64(&[0xff]), None);
    }
}
