//! The pickle virtual machine: runs the data opcodes into an [`Arena`], executes nothing.
//!
//! The input comes through a [`Feed`] (a slice, or a reader seen through a window), opcodes
//! are told apart by the one opcode table ([`super::opcodes`]), memo stores go to the packed
//! [`Memo`], and values to the arena. A trace entry dict is converted as soon as it is
//! complete (by the converter, `convert`, whose state [`ConvState`] the VM carries), and
//! `fast_path` reads entries in the usual layout straight from the window.

use crate::error::{FormatError, Result};
use crate::progress::Progress;

use super::arena::{Arena, Chunk, Kind, Node, Val, NONE};
use super::convert::{Conv, ConvState};
use super::feed::Feed;
use super::memo::Memo;
use super::opcodes::{executes_code, op, opcode_info};
use super::sym::Sym;

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
/// Longest text line (protocol-0 `GET`/`PUT` indices, `GLOBAL` names) we look for.
const MAX_LINE: usize = 64 << 10;

/// The name of an opcode, for error messages.
fn opcode_name(code: u8) -> Option<&'static str> {
    opcode_info(code).map(|(name, _)| name)
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
    /// Where to end the top-level dict as if `SETITEMS STOP` stood there (see [`Run::end_at`]).
    end_at: Option<u64>,
}

/// How to run the VM over one input: everything but the bytes themselves.
pub(crate) struct Run<'p, 'o> {
    /// Input length (bounds every declared length; progress is reported against it).
    pub total: u64,
    pub progress: Progress<'p>,
    /// Shown the trace entries read so far, at each progress tick.
    pub observe: Option<Observe<'o>>,
    /// Take the trace-entry fast path when it applies (off only to test it against the
    /// generic path).
    pub fast_entries: bool,
    /// Where to end the top-level dict as if `SETITEMS STOP` stood there (reading only the
    /// segments, see `part`).
    pub end_at: Option<u64>,
}

/// Runs the pickle in `feed` and returns its object graph, with trace entries already
/// converted (they are most of a snapshot, and converting them as they complete keeps their
/// keys and values out of the arena).
///
/// With [`Run::end_at`], the opcode at that offset is not read: the top-level dict is closed
/// there as if `SETITEMS STOP` followed, and the rest of the input is left alone.
pub(crate) fn run<F: Feed>(feed: F, options: Run<'_, '_>) -> Result<(Arena, ConvState)> {
    let Run {
        total,
        progress,
        observe,
        fast_entries,
        end_at,
    } = options;
    let mut vm = Vm {
        feed,
        base: 0,
        total,
        pos: 0,
        at: 0,
        stack: Vec::with_capacity(1024),
        marks: Vec::with_capacity(64),
        memo: Memo::default(),
        arena: Arena::new(),
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
