//! The pickle machine: the opcode loop both pickle readers run, generic over what it builds.
//!
//! A pickle is a program for a stack machine. Everything about running that program that does
//! not depend on the values it makes lives here, once: reading opcodes and their arguments
//! through a [`Feed`] (told apart by the one opcode table, `opcodes`), checking every declared
//! length against the remaining input before anything is read, the value stack and its
//! `MARK`s, the memo ([`Memo`]: dense for the indices picklers use, bounded against hostile
//! ones), the protocol and `FRAME` checks, refusing every opcode that would import or call
//! code, and errors that name the opcode's byte offset. What the values *are* is a
//! [`Build`]er's business:
//!
//! * the snapshot reader (`vm`) builds its arena of [`crate::pickle`] values and converts
//!   trace entries as they complete; its trace-entry fast path is its hook at `EMPTY_DICT`
//!   ([`Build::empty_dict`]);
//! * the `memsnap` Python package builds Python objects, exactly those `pickle.load` builds,
//!   with the same sharing (its own hook reads plain dicts in one piece);
//! * [`super::tree::Tree`] builds a plain Rust value tree: what the fuzz target `machine` drives, so the
//!   code the Python package runs is fuzzed without Python.
//!
//! The machine is generic over the builder and the feed, never `dyn`: each reader gets its own
//! copy of the loop with the builder's calls inlined, as if it had written the loop itself.

use crate::error::{FormatError, Result};
use crate::progress::Progress;

use super::feed::ReaderFeed;
pub use super::feed::{Feed, SliceFeed};
pub use super::memo::{Memo, Packing};
use super::opcodes::{executes_code, op, opcode_info};

/// Highest protocol read (`PROTO 5` adds only out-of-band buffers, which are not read).
const MAX_PROTOCOL: u8 = 5;
/// Call the progress callback about this often.
const PROGRESS_STEP: usize = 1 << 20;
/// Longest text line (protocol-0 `GET`/`PUT` indices and numbers, `GLOBAL` names) we look for.
const MAX_LINE: usize = 64 << 10;

/// The name of an opcode, for error messages.
pub fn opcode_name(code: u8) -> Option<&'static str> {
    opcode_info(code).map(|(name, _)| name)
}

/// The kinds of container a pickle makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Container {
    List,
    Dict,
    Tuple,
    /// `EMPTY_SET`, filled by `ADDITEMS` (only with [`Build::PROTOCOL_0_AND_SETS`]).
    Set,
    /// `FROZENSET` (only with [`Build::PROTOCOL_0_AND_SETS`]).
    FrozenSet,
}

/// Why a builder could not make a value: the machine reports it at the opcode's byte offset
/// (or, for [`BuildError::in_payload`], at the offending byte of the opcode's payload).
#[derive(Debug)]
pub struct BuildError {
    what: String,
    in_payload: Option<usize>,
}

impl BuildError {
    pub fn new(what: impl Into<String>) -> Self {
        BuildError {
            what: what.into(),
            in_payload: None,
        }
    }

    /// An error at byte `at` of the payload being built from (invalid UTF-8 there, say).
    pub fn in_payload(at: usize, what: impl Into<String>) -> Self {
        BuildError {
            what: what.into(),
            in_payload: Some(at),
        }
    }
}

/// What the [`Machine`] calls to make values. Every method gets what the opcode decoded,
/// already checked (lengths, stack depth, `MARK`s, memo indices); the builder only checks what
/// depends on its values (the target of `APPENDS` is a list, a dict key is hashable).
pub trait Build: Sized {
    /// A value on the stack and in the memo (pushing a memo reference pushes a clone: a copy
    /// of a handle, never of the container).
    type Value: Clone;
    /// How values sit in the memo's dense slots.
    type Packing: Packing<Value = Self::Value>;
    /// Whether the protocol-0 text numbers (`INT`, `LONG`, `FLOAT`), sets (`EMPTY_SET`,
    /// `ADDITEMS`, `FROZENSET`) and `BYTEARRAY8` are read; otherwise they are refused as
    /// unsupported opcodes (a snapshot never has them).
    const PROTOCOL_0_AND_SETS: bool = false;

    fn none(&mut self) -> Self::Value;
    fn bool(&mut self, value: bool) -> Self::Value;
    fn int(&mut self, value: i64) -> Self::Value;
    /// An integer outside `i64`, as little-endian two's complement bytes.
    fn big_int(&mut self, le_bytes: &[u8]) -> std::result::Result<Self::Value, BuildError>;
    fn float(&mut self, value: f64) -> Self::Value;
    /// A `str` from its UTF-8 bytes, as pickle wrote them (CPython writes lone surrogates
    /// with `surrogatepass`: a builder checks what it accepts).
    fn str(&mut self, utf8: &[u8]) -> std::result::Result<Self::Value, BuildError>;
    fn bytes(&mut self, bytes: &[u8]) -> std::result::Result<Self::Value, BuildError>;
    /// A protocol-0 integer literal outside `i64` (only with [`Build::PROTOCOL_0_AND_SETS`]).
    fn decimal_int(&mut self, _digits: &str) -> std::result::Result<Self::Value, BuildError> {
        Err(BuildError::new(
            "integer literals outside 64 bits are not read",
        ))
    }
    /// A `bytearray` (only with [`Build::PROTOCOL_0_AND_SETS`]).
    fn bytearray(&mut self, _bytes: &[u8]) -> std::result::Result<Self::Value, BuildError> {
        Err(BuildError::new("bytearrays are not read"))
    }
    /// A new empty container (`EMPTY_LIST`, `EMPTY_DICT`, `EMPTY_TUPLE`, `EMPTY_SET`).
    fn empty(&mut self, kind: Container) -> std::result::Result<Self::Value, BuildError>;
    /// A container made of `stack[from..]` (`LIST`, `DICT`: keys and values interleaved, an
    /// even number; `TUPLE`, `TUPLE1..3`, `FROZENSET`), which it removes from the stack.
    fn collect(
        &mut self,
        kind: Container,
        stack: &mut Vec<Self::Value>,
        from: usize,
    ) -> std::result::Result<Self::Value, BuildError>;
    /// `code` (`APPEND`, `APPENDS`, `SETITEM`, `SETITEMS`, `ADDITEMS`) adds `stack[from..]`
    /// (pairs for the dict ones, an even number) to the container at `stack[target]`
    /// (`target < from`), and removes them from the stack. The builder checks the target is
    /// the right kind of container.
    fn extend(
        &mut self,
        code: u8,
        stack: &mut Vec<Self::Value>,
        target: usize,
        from: usize,
    ) -> std::result::Result<(), BuildError>;
    /// `value` is pushed again (a memo fetch or `DUP`): it may be referenced more than once.
    #[inline(always)]
    fn shared(&mut self, _value: &Self::Value) {}
    /// `value` as text when it is a `str` (to name what `STACK_GLOBAL` would have imported).
    fn text(&self, _value: &Self::Value) -> Option<String> {
        None
    }
    /// At `EMPTY_DICT` (just read), before the machine makes an empty dict: a builder may read
    /// the dict that follows straight from the input itself (through
    /// [`Machine::parts`]/[`Machine::advance`], or its own access inside this crate), push it
    /// and return `true`. It must then have left everything as running the opcodes would
    /// have; returning `false` it must have changed nothing the machine can see.
    #[inline(always)]
    fn empty_dict<F: Feed>(_m: &mut Machine<'_, Self, F>) -> bool {
        false
    }
    /// Called between opcodes at each progress tick (the snapshot reader shows the trace
    /// entries read so far).
    #[inline(always)]
    fn checkpoint(&mut self) {}
}

/// The machine: input, stack, marks and memo, and the builder it runs for.
pub struct Machine<'p, B: Build, F: Feed> {
    pub(crate) feed: F,
    /// Input offset of the window start.
    pub(crate) base: u64,
    /// Input length (for length checks and progress).
    pub(crate) total: u64,
    /// Read position in the window.
    pub(crate) pos: usize,
    /// Input offset of the opcode being run, for errors.
    pub(crate) at: u64,
    pub(crate) stack: Vec<B::Value>,
    /// Stack lengths at each `MARK`.
    pub(crate) marks: Vec<usize>,
    pub(crate) memo: Memo<B::Packing>,
    /// The builder (named `b`: it is on every line of the snapshot reader's fast path).
    pub(crate) b: B,
    progress: Progress<'p>,
    /// Where to end the top-level dict as if `SETITEMS STOP` stood there.
    end_at: Option<u64>,
}

/// What a builder's [`Build::empty_dict`] hook may use at once: the input not read yet (from
/// the opcode after `EMPTY_DICT`), the builder, the memo and the stack.
pub struct Parts<'m, B: Build> {
    pub rest: &'m [u8],
    pub builder: &'m mut B,
    pub memo: &'m mut Memo<B::Packing>,
    pub stack: &'m mut Vec<B::Value>,
}

/// Runs the pickle in `bytes` with `builder`: the value `STOP` returns, and the builder.
pub fn load<B: Build>(bytes: &[u8], builder: B) -> Result<(B::Value, B)> {
    let mut progress = |_: u64, _: u64| true;
    let mut machine = Machine::new(
        SliceFeed::new(bytes),
        builder,
        bytes.len() as u64,
        &mut progress,
    );
    let value = machine.run()?;
    Ok((value, machine.b))
}

/// [`load`] from a stream of `len` bytes (a file), read through a window of a few hundred
/// KiB instead of held whole: the memory of a load is the builder's alone. `len` bounds
/// every declared length as the slice's length does for [`load`]; a stream that ends early
/// is reported as truncated, a failing read as [`FormatError::Read`] with its byte offset.
pub fn load_from<B: Build>(
    reader: impl std::io::Read,
    len: u64,
    builder: B,
) -> Result<(B::Value, B)> {
    let mut progress = |_: u64, _: u64| true;
    let mut machine = Machine::new(ReaderFeed::new(reader), builder, len, &mut progress);
    let value = machine.run()?;
    Ok((value, machine.b))
}

impl<'p, B: Build, F: Feed> Machine<'p, B, F> {
    /// A machine reading `total` bytes from `feed` (every declared length is checked against
    /// what is left of `total`), calling `progress(bytes_done, total)` about every MiB; it
    /// stops with [`FormatError::Cancelled`] when that returns `false`.
    pub fn new(feed: F, builder: B, total: u64, progress: Progress<'p>) -> Self {
        Machine {
            feed,
            base: 0,
            total,
            pos: 0,
            at: 0,
            stack: Vec::with_capacity(1024),
            marks: Vec::with_capacity(64),
            memo: Memo::default(),
            b: builder,
            progress,
            end_at: None,
        }
    }

    /// With `Some(offset)`, the opcode at that offset is not read: the top-level dict is
    /// closed there as if `SETITEMS STOP` followed, and the rest of the input is left alone
    /// (reading only the segments, see `part`). A `FRAME` may then declare bytes never read.
    pub(crate) fn end_at(mut self, end_at: Option<u64>) -> Self {
        self.end_at = end_at;
        self
    }

    /// The builder, after [`Machine::run`].
    pub fn into_builder(self) -> B {
        self.b
    }

    /// The input from the read position, the builder, the memo and the stack, borrowed
    /// together (for a [`Build::empty_dict`] hook).
    #[inline]
    pub fn parts(&mut self) -> Parts<'_, B> {
        Parts {
            rest: &self.feed.window()[self.pos..],
            builder: &mut self.b,
            memo: &mut self.memo,
            stack: &mut self.stack,
        }
    }

    /// Moves the read position `n` bytes on, over what a [`Build::empty_dict`] hook read from
    /// [`Parts::rest`] (at most its length).
    #[inline]
    pub fn advance(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.feed.window().len());
    }

    /// Input offset of window position `pos`.
    #[inline]
    pub(crate) fn offset(&self, pos: usize) -> u64 {
        self.base + pos as u64
    }

    pub(crate) fn err(&self, what: impl Into<String>) -> FormatError {
        FormatError::Pickle {
            offset: self.at,
            what: what.into(),
        }
    }

    #[cold]
    fn build_err(&self, e: BuildError, payload_at: u64) -> FormatError {
        FormatError::Pickle {
            offset: match e.in_payload {
                Some(at) => payload_at + at as u64,
                None => self.at,
            },
            what: e.what,
        }
    }

    /// Input bytes not read yet.
    pub(crate) fn remaining(&self) -> u64 {
        self.total.saturating_sub(self.offset(self.pos))
    }

    /// Makes at least `n` bytes available at `pos` (which becomes the window start).
    #[cold]
    pub(crate) fn fill(&mut self, n: usize, what: &str) -> Result<()> {
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

    /// A text line ending in `\n` (protocol-0 opcodes, `GLOBAL`), without the newline.
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

    /// Hands a declared-length payload to `build`, checking the length against the remaining
    /// input before anything is read or allocated.
    #[inline]
    fn payload<R>(
        &mut self,
        len: u64,
        what: &str,
        build: impl FnOnce(&mut B, &[u8]) -> std::result::Result<R, BuildError>,
    ) -> Result<R> {
        let rest = self.remaining();
        if len > rest {
            return Err(self.err(format!(
                "truncated input: {what} declares {len} bytes but only {rest} remain"
            )));
        }
        if len > u64::from(u32::MAX) {
            return Err(self.err(format!("{what} longer than 4 GiB")));
        }
        let n = len as usize;
        if self.feed.window().len() - self.pos < n {
            // Across the window's end (a stream): have the feed hold it whole.
            self.fill(n, what)?;
        }
        let payload_at = self.offset(self.pos);
        let window = self.feed.window();
        let built = build(&mut self.b, &window[self.pos..self.pos + n]);
        self.pos += n;
        built.map_err(|e| self.build_err(e, payload_at))
    }

    #[inline]
    pub(crate) fn push(&mut self, v: B::Value) {
        self.stack.push(v);
    }

    /// The stack index below which the current `MARK` protects the items.
    #[inline]
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    #[inline]
    fn pop(&mut self, what: &str) -> Result<B::Value> {
        if self.stack.len() <= self.floor() {
            return Err(self.err(format!("stack underflow in {what}")));
        }
        Ok(self.stack.pop().expect("non-empty"))
    }

    #[inline]
    fn top(&self, what: &str) -> Result<&B::Value> {
        if self.stack.len() <= self.floor() {
            return Err(self.err(format!("stack underflow in {what}")));
        }
        Ok(self.stack.last().expect("non-empty"))
    }

    fn pop_mark(&mut self, what: &str) -> Result<usize> {
        self.marks
            .pop()
            .ok_or_else(|| self.err(format!("{what} without a MARK")))
    }

    #[inline]
    fn empty(&mut self, kind: Container) -> Result<()> {
        let v = self.b.empty(kind).map_err(|e| self.build_err(e, 0))?;
        self.push(v);
        Ok(())
    }

    /// A container of the stack values above the last MARK (`LIST`, `DICT`, `TUPLE`,
    /// `FROZENSET`).
    fn collect_from_mark(&mut self, kind: Container, name: &str) -> Result<()> {
        let from = self.pop_mark(name)?;
        if kind == Container::Dict && !(self.stack.len() - from).is_multiple_of(2) {
            return Err(self.err(format!("{name} with an odd number of items")));
        }
        self.collect(kind, from)
    }

    #[inline]
    fn collect(&mut self, kind: Container, from: usize) -> Result<()> {
        let v = self
            .b
            .collect(kind, &mut self.stack, from)
            .map_err(|e| self.build_err(e, 0))?;
        self.push(v);
        Ok(())
    }

    fn tuple_of(&mut self, n: usize, name: &str) -> Result<()> {
        if self.stack.len() < self.floor() + n {
            return Err(self.err(format!("stack underflow in {name}")));
        }
        self.collect(Container::Tuple, self.stack.len() - n)
    }

    /// `APPENDS`, `SETITEMS`, `ADDITEMS`: the items above the last MARK go into the container
    /// below it.
    fn extend_from_mark(&mut self, code: u8, name: &str, below: &str) -> Result<()> {
        let from = self.pop_mark(name)?;
        let Some(target) = from.checked_sub(1) else {
            return Err(self.err(format!("{name} with no {below} below the MARK")));
        };
        if target < self.floor() {
            return Err(self.err(format!("{name} with no {below} below the MARK")));
        }
        if code == op::SETITEMS && !(self.stack.len() - from).is_multiple_of(2) {
            return Err(self.err(format!("{name} with an odd number of items")));
        }
        self.extend(code, target, from)
    }

    #[inline]
    fn extend(&mut self, code: u8, target: usize, from: usize) -> Result<()> {
        self.b
            .extend(code, &mut self.stack, target, from)
            .map_err(|e| self.build_err(e, 0))
    }

    #[inline]
    fn memo_get(&mut self, index: u64) -> Result<()> {
        let v = self
            .memo
            .get(index)
            .ok_or_else(|| self.err(format!("memo entry {index} was never stored")))?;
        self.b.shared(&v);
        self.push(v);
        Ok(())
    }

    #[inline]
    fn memo_put(&mut self, index: u64, what: &str) -> Result<()> {
        let v = self.top(what)?.clone();
        self.memo.put(index, v);
        Ok(())
    }

    /// `LONG1`/`LONG4`: little-endian two's complement.
    #[inline]
    fn long(&mut self, len: u64, name: &str) -> Result<B::Value> {
        let window = self.feed.window();
        if len <= 8 && window.len() - self.pos >= len as usize {
            // The common case (addresses, timestamps) is read in place.
            let n = len as usize;
            if let Some(v) = short_long(window, self.pos, n) {
                self.pos += n;
                return Ok(self.b.int(v));
            }
        }
        self.payload(len, name, |b, bytes| match long_to_i64(bytes) {
            Some(i) => Ok(b.int(i)),
            None => b.big_int(bytes),
        })
    }

    /// A protocol-0 decimal memo index (`GET`/`PUT`).
    fn text_index(&mut self, name: &str) -> Result<u64> {
        let line = self.line(name)?;
        std::str::from_utf8(&line)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| self.err(format!("{name} with a malformed memo index")))
    }

    /// Protocol-0 `INT` / `LONG`: a decimal literal (`INT` `01`/`00` are `True`/`False`).
    fn text_int(&mut self, code: u8, name: &str) -> Result<B::Value> {
        let line = self.line(name)?;
        let line = match code {
            op::LONG => line.strip_suffix(b"L").unwrap_or(&line),
            _ => &line[..],
        };
        if code == op::INT && (line == b"01" || line == b"00") {
            return Ok(self.b.bool(line == b"01"));
        }
        let text = std::str::from_utf8(line)
            .ok()
            .map(str::trim)
            .filter(|s| {
                let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
                !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
            })
            .ok_or_else(|| self.err(format!("{name} is not a decimal integer literal")))?;
        match text.parse::<i64>() {
            Ok(value) => Ok(self.b.int(value)),
            Err(_) => self.b.decimal_int(text).map_err(|e| self.build_err(e, 0)),
        }
    }

    /// Protocol-0 `FLOAT`: a decimal literal (as `repr` writes it: `inf`, `nan` too).
    fn text_float(&mut self) -> Result<B::Value> {
        let line = self.line("FLOAT")?;
        let value = std::str::from_utf8(&line)
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .ok_or_else(|| self.err("FLOAT is not a float literal"))?;
        Ok(self.b.float(value))
    }

    #[cold]
    fn unsupported(&self, code: u8) -> FormatError {
        self.err(match opcode_name(code) {
            Some(name) => format!("unsupported opcode {name} (not used by snapshot pickles)"),
            None => format!("unknown opcode 0x{code:02x}"),
        })
    }

    /// The error for an opcode that would import or call code, naming what it would have
    /// imported when that is at hand.
    #[cold]
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
                let module = n.checked_sub(2).and_then(|i| self.stack.get(i));
                match (
                    module.and_then(|v| self.b.text(v)),
                    self.stack.last().and_then(|v| self.b.text(v)),
                ) {
                    (Some(m), Some(q)) => format!(" '{m} {q}'"),
                    _ => String::new(),
                }
            }
            _ => String::new(),
        };
        self.err(format!(
            "opcode {name} (0x{code:02x}) refused: refusing to execute {name}{detail} (snapshots are plain data; this pickle would import or call code)"
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
    fn stop(&mut self) -> Result<B::Value> {
        // Like CPython, a dangling MARK or extra stack items are ignored.
        let v = self
            .stack
            .pop()
            .ok_or_else(|| self.err("STOP with an empty stack: it needs an item to return"))?;
        if (self.progress)(self.total, self.total) {
            return Ok(v);
        }
        Err(FormatError::Cancelled)
    }

    /// Runs the pickle to its `STOP` and returns the value `STOP` returns.
    pub fn run(&mut self) -> Result<B::Value> {
        let total = self.total;
        // One comparison per opcode serves both the progress callback and `end_at`.
        let mut next_checkpoint = self.next_checkpoint(0);
        loop {
            self.at = self.offset(self.pos);
            if self.at >= next_checkpoint && total > 0 {
                if self.end_at == Some(self.at) {
                    self.extend_from_mark(op::SETITEMS, "SETITEMS", "dict")?;
                    return self.stop();
                }
                if !(self.progress)(self.at.min(total), total) {
                    return Err(FormatError::Cancelled);
                }
                self.b.checkpoint();
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
                        return Err(self.err(format!(
                            "unsupported pickle protocol {v} (the highest read is {MAX_PROTOCOL})"
                        )));
                    }
                }
                op::FRAME => {
                    let len = self.u64("FRAME length")?;
                    let rest = self.remaining();
                    // Reading part of a file, the frame may hold bytes we never read.
                    if len > rest && self.end_at.is_none() {
                        return Err(self.err(format!(
                            "truncated input: FRAME declares {len} bytes but only {rest} remain"
                        )));
                    }
                }
                op::STOP => return self.stop(),
                op::MARK => self.marks.push(self.stack.len()),
                op::POP => {
                    if self.stack.len() > self.floor() {
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
                    let v = self.top("DUP")?.clone();
                    self.b.shared(&v);
                    self.push(v);
                }
                op::NONE => {
                    let v = self.b.none();
                    self.push(v);
                }
                op::NEWTRUE => {
                    let v = self.b.bool(true);
                    self.push(v);
                }
                op::NEWFALSE => {
                    let v = self.b.bool(false);
                    self.push(v);
                }
                op::BININT1 => {
                    let v = self.u8("BININT1")?;
                    let v = self.b.int(v.into());
                    self.push(v);
                }
                op::BININT2 => {
                    let v = self.u16("BININT2")?;
                    let v = self.b.int(v.into());
                    self.push(v);
                }
                op::BININT => {
                    let v = self.u32("BININT")? as i32;
                    let v = self.b.int(v.into());
                    self.push(v);
                }
                op::LONG1 => {
                    let n = self.u8("LONG1 length")?;
                    let v = self.long(n.into(), "LONG1")?;
                    self.push(v);
                }
                op::LONG4 => {
                    let n = self.u32("LONG4 length")? as i32;
                    if n < 0 {
                        return Err(self.err(
                            "LONG4 with a negative length: the input is corrupt or truncated",
                        ));
                    }
                    let v = self.long(n as u64, "LONG4")?;
                    self.push(v);
                }
                op::BINFLOAT => {
                    let v = f64::from_be_bytes(self.array("BINFLOAT")?);
                    let v = self.b.float(v);
                    self.push(v);
                }
                op::SHORT_BINUNICODE => {
                    let n = self.u8("SHORT_BINUNICODE length")?;
                    let v = self.payload(n.into(), "SHORT_BINUNICODE", B::str)?;
                    self.push(v);
                }
                op::BINUNICODE => {
                    let n = self.u32("BINUNICODE length")?;
                    let v = self.payload(n.into(), "BINUNICODE", B::str)?;
                    self.push(v);
                }
                op::BINUNICODE8 => {
                    let n = self.u64("BINUNICODE8 length")?;
                    let v = self.payload(n, "BINUNICODE8", B::str)?;
                    self.push(v);
                }
                op::SHORT_BINBYTES => {
                    let n = self.u8("SHORT_BINBYTES length")?;
                    let v = self.payload(n.into(), "SHORT_BINBYTES", B::bytes)?;
                    self.push(v);
                }
                op::BINBYTES => {
                    let n = self.u32("BINBYTES length")?;
                    let v = self.payload(n.into(), "BINBYTES", B::bytes)?;
                    self.push(v);
                }
                op::BINBYTES8 => {
                    let n = self.u64("BINBYTES8 length")?;
                    let v = self.payload(n, "BINBYTES8", B::bytes)?;
                    self.push(v);
                }
                op::EMPTY_LIST => self.empty(Container::List)?,
                op::EMPTY_DICT => {
                    if !B::empty_dict(self) {
                        self.empty(Container::Dict)?;
                    }
                }
                op::EMPTY_TUPLE => self.empty(Container::Tuple)?,
                op::LIST => self.collect_from_mark(Container::List, "LIST")?,
                op::DICT => self.collect_from_mark(Container::Dict, "DICT")?,
                op::TUPLE => self.collect_from_mark(Container::Tuple, "TUPLE")?,
                op::TUPLE1 => self.tuple_of(1, "TUPLE1")?,
                op::TUPLE2 => self.tuple_of(2, "TUPLE2")?,
                op::TUPLE3 => self.tuple_of(3, "TUPLE3")?,
                op::APPEND => {
                    let v = self.pop("APPEND")?;
                    self.top("APPEND")?;
                    self.push(v);
                    let from = self.stack.len() - 1;
                    self.extend(code, from - 1, from)?;
                }
                op::APPENDS => self.extend_from_mark(code, "APPENDS", "list")?,
                op::SETITEM => {
                    let v = self.pop("SETITEM")?;
                    let k = self.pop("SETITEM")?;
                    self.top("SETITEM")?;
                    self.push(k);
                    self.push(v);
                    let from = self.stack.len() - 2;
                    self.extend(code, from - 1, from)?;
                }
                op::SETITEMS => self.extend_from_mark(code, "SETITEMS", "dict")?,
                op::MEMOIZE => self.memo_put(self.memo.count as u64, "MEMOIZE")?,
                op::BINPUT => {
                    let i = self.u8("BINPUT")?;
                    self.memo_put(i.into(), "BINPUT")?;
                }
                op::LONG_BINPUT => {
                    let i = self.u32("LONG_BINPUT")?;
                    self.memo_put(i.into(), "LONG_BINPUT")?;
                }
                op::PUT => {
                    let i = self.text_index("PUT")?;
                    self.memo_put(i, "PUT")?;
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
                op::INT | op::LONG if B::PROTOCOL_0_AND_SETS => {
                    let name = if code == op::INT { "INT" } else { "LONG" };
                    let v = self.text_int(code, name)?;
                    self.push(v);
                }
                op::FLOAT if B::PROTOCOL_0_AND_SETS => {
                    let v = self.text_float()?;
                    self.push(v);
                }
                op::BYTEARRAY8 if B::PROTOCOL_0_AND_SETS => {
                    let n = self.u64("BYTEARRAY8 length")?;
                    let v = self.payload(n, "BYTEARRAY8", B::bytearray)?;
                    self.push(v);
                }
                op::EMPTY_SET if B::PROTOCOL_0_AND_SETS => self.empty(Container::Set)?,
                op::FROZENSET if B::PROTOCOL_0_AND_SETS => {
                    self.collect_from_mark(Container::FrozenSet, "FROZENSET")?
                }
                op::ADDITEMS if B::PROTOCOL_0_AND_SETS => {
                    self.extend_from_mark(code, "ADDITEMS", "set")?
                }
                code => return Err(self.unsupported(code)),
            }
        }
    }
}

/// The `n <= 8` byte little-endian two's-complement integer at `window[at..]`, or `None` when
/// the window ends first. Sign-extends with shifts when 8 bytes can be loaded at once.
#[inline]
pub(crate) fn short_long(window: &[u8], at: usize, n: usize) -> Option<i64> {
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

/// A little-endian two's-complement integer (a `LONG1`/`LONG4` argument), if it fits `i64`.
/// Up to 8 bytes are put together a byte at a time (a copy of a length known only at run
/// time is a call to `memcpy`). Also the Python extension's fast path for `LONG1`.
#[inline]
pub fn long_to_i64(bytes: &[u8]) -> Option<i64> {
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
    let mut raw = 0u64;
    for (i, &byte) in bytes.iter().enumerate() {
        raw |= u64::from(byte) << (8 * i);
    }
    if negative && bytes.len() < 8 {
        raw |= u64::MAX << (8 * bytes.len());
    }
    Some(raw as i64)
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
