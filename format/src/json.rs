//! The JSON codec: the pickle's schema written as JSON.
//!
//! PyTorch's browser viewer (MemoryViz.js) tries `JSON.parse` before unpickling, so a snapshot
//! written by [`to_vec`] opens there like the original pickle. The layout is exactly the
//! pickle's: dicts with the same keys in the same order, each `frames` list expanded inline as
//! `{"name", "filename", "line"}` dicts, tuples such as `segment_pool_id` as arrays, and
//! `memsnap`'s [`crate::RecorderInfo`] under the top-level key `"memsnap"`.
//!
//! Integers are written exactly, however large (`Value::BigInt` too, and the exact values the
//! typed fields keep: a negative address, a frame line of 2^64 − 1). Values JSON has no type
//! for, found only under unknown keys, are written as one-key objects so they read back
//! unchanged: `{"$tuple": [...]}`, `{"$bytes": "<hex>"}`, and `{"$dict": [[key, value], ...]}`
//! for dicts with non-string keys (or a single key that looks like one of these tags). Floats
//! that are not finite are written as Python's `json` module writes them (`NaN`, `Infinity`).
//!
//! [`read`] is a streaming parser that builds the typed snapshot directly, interning frames and
//! stacks as it goes (an identical `frames` list is recognised from its text and parsed once).
//! What each key means is the schema's read side (`schema`, through the parser's `Source`
//! implementation), as the writer is the schema's walk.
//! Errors give the line and column and the schema path (`device_traces[0][17].size`). Memory is
//! proportional to the input, nesting is bounded, and numbers longer than Python's 4300-digit
//! limit are refused.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

use crate::error::{FormatError, Result};
use crate::int::{ExactInts, IntField, PyInt};
use crate::intern::{FrameId, StackId, StrId, StrTable};
use crate::model::*;
use crate::schema::{self, Emit, EntryIn, Key, Setting, Source, Walk};
use crate::value::{Extras, Value};

/// Deepest nesting of arrays and objects accepted.
pub const MAX_DEPTH: usize = 500;

/// Longest integer accepted or written, in decimal digits (Python's `int` string limit).
pub const MAX_INT_DIGITS: usize = 4300;

const TUPLE_TAG: &str = "$tuple";
const BYTES_TAG: &str = "$bytes";
const DICT_TAG: &str = "$dict";

// ================================================================================== writing

/// Encodes a snapshot as JSON. Fails only on a snapshot whose ids do not resolve, or on a
/// value under an unknown key that [`read`] would refuse (an integer over
/// [`MAX_INT_DIGITS`] digits, nesting near [`MAX_DEPTH`]).
pub fn to_vec(snapshot: &Snapshot) -> Result<Vec<u8>> {
    check_writable(snapshot)?;
    let mut w = Writer::new(
        snapshot,
        Vec::with_capacity(256 + snapshot.entry_count() * 160),
        None,
    );
    schema::snapshot(&mut w, snapshot)?;
    Ok(w.out)
}

/// [`to_vec`] written to `out` as it is made, in pieces of about 64 KiB: a snapshot
/// whose blocks repeat long stacks is many times its own size as JSON (1.6 GB for the final
/// state of a 3M-entry run, built in memory before it was written into a Chrome trace).
pub fn to_writer(snapshot: &Snapshot, out: &mut dyn std::io::Write) -> Result<()> {
    check_writable(snapshot)?;
    let mut w = Writer::new(snapshot, Vec::with_capacity(FLUSH_BYTES + 4096), Some(out));
    let walked = schema::snapshot(&mut w, snapshot);
    // A write error stops the output first; then the walk's own error, if any.
    w.flush_all()?;
    walked
}

/// How much [`to_writer`] buffers before it writes.
const FLUSH_BYTES: usize = 1 << 16;

/// The checks both writers make before they write anything.
fn check_writable(snapshot: &Snapshot) -> Result<()> {
    crate::compare::check_ids(snapshot)?;
    // A tagged tuple or dict takes up to three JSON levels; the schema around values about 8.
    let deepest = crate::compare::deepest_value(snapshot);
    if 3 * deepest + 8 > MAX_DEPTH {
        return Err(FormatError::schema(
            "(an unknown key's value)",
            format!("nested {deepest} levels deep, more than JSON reading accepts"),
        ));
    }
    Ok(())
}

struct Writer<'s> {
    out: Vec<u8>,
    snap: &'s Snapshot,
    /// Each stack's JSON text, made on first use (a stack is shared by many entries).
    stack_text: Vec<Option<Box<[u8]>>>,
    /// Where `out` goes when it grows past [`FLUSH_BYTES`] (`None`: kept whole).
    sink: Option<&'s mut dyn std::io::Write>,
    /// The first write error; nothing is written after it.
    write_error: Option<std::io::Error>,
    /// `out` holds a stack's text being made, not the output: not flushed meanwhile.
    making_stack: bool,
}

impl<'s> Writer<'s> {
    fn new(snap: &'s Snapshot, out: Vec<u8>, sink: Option<&'s mut dyn std::io::Write>) -> Self {
        Writer {
            out,
            snap,
            stack_text: vec![None; snap.stacks.len()],
            sink,
            write_error: None,
            making_stack: false,
        }
    }

    /// Writes `out` to the sink but its last byte, which [`Writer::sep`] reads.
    fn flush_but_last(&mut self) {
        let Some(sink) = self.sink.as_mut() else {
            return;
        };
        let Some(last) = self.out.pop() else {
            return;
        };
        if self.write_error.is_none() {
            if let Err(err) = sink.write_all(&self.out) {
                self.write_error = Some(err);
            }
        }
        self.out.clear();
        self.out.push(last);
    }

    /// Writes what is left; the first write error, if any.
    fn flush_all(&mut self) -> Result<()> {
        if let (Some(sink), None) = (self.sink.as_mut(), &self.write_error) {
            if let Err(err) = sink.write_all(&self.out) {
                self.write_error = Some(err);
            }
            self.out.clear();
        }
        match self.write_error.take() {
            Some(source) => Err(FormatError::Write { source }),
            None => Ok(()),
        }
    }

    /// A comma unless this is the first item of an object or array.
    fn sep(&mut self) {
        if !matches!(self.out.last(), Some(b'{') | Some(b'[')) {
            self.out.push(b',');
        }
        if self.out.len() >= FLUSH_BYTES && !self.making_stack {
            self.flush_but_last();
        }
    }

    fn key(&mut self, key: &str) {
        self.sep();
        write_str(&mut self.out, key);
        self.out.push(b':');
    }

    fn uint(&mut self, v: u64) {
        let _ = write!(Bytes(&mut self.out), "{v}");
    }

    fn int(&mut self, v: i64) {
        let _ = write!(Bytes(&mut self.out), "{v}");
    }

    /// Any int, in decimal; fails past [`MAX_INT_DIGITS`] digits, which [`read`] refuses.
    fn pyint(&mut self, v: &PyInt) -> Result<()> {
        match v {
            PyInt::Small(i) => self.int(*i),
            PyInt::Big(bytes) => self.big(bytes)?,
        }
        Ok(())
    }

    fn big(&mut self, bytes: &[u8]) -> Result<()> {
        let text = bigint_to_decimal(bytes).ok_or_else(|| {
            FormatError::schema(
                "(an integer)",
                format!(
                    "an integer of {} bytes is longer than JSON's {MAX_INT_DIGITS}-digit limit",
                    bytes.len()
                ),
            )
        })?;
        self.out.extend_from_slice(text.as_bytes());
        Ok(())
    }

    fn str(&mut self, s: &str) {
        write_str(&mut self.out, s);
    }

    fn str_id(&mut self, id: StrId) {
        write_str(&mut self.out, self.snap.str(id));
    }

    fn bool(&mut self, b: bool) {
        self.out
            .extend_from_slice(if b { b"true" } else { b"false" });
    }

    fn stack(&mut self, id: StackId) -> Result<()> {
        let slot = id.index();
        if self.stack_text[slot].is_none() {
            let outer = std::mem::take(&mut self.out);
            self.making_stack = true;
            let written = self.frames(id);
            self.making_stack = false;
            let text = std::mem::replace(&mut self.out, outer);
            written?;
            self.stack_text[slot] = Some(text.into_boxed_slice());
        }
        if let Some(text) = &self.stack_text[slot] {
            self.out.extend_from_slice(text);
        }
        Ok(())
    }

    fn frames(&mut self, id: StackId) -> Result<()> {
        let snap = self.snap;
        self.out.push(b'[');
        for frame in snap.stack_frames(id) {
            self.sep();
            schema::frame(self, frame)?;
        }
        self.out.push(b']');
        Ok(())
    }

    fn value(&mut self, v: &Value) -> Result<()> {
        match v {
            Value::None => self.out.extend_from_slice(b"null"),
            Value::Bool(b) => self.bool(*b),
            Value::Int(i) => self.int(*i),
            Value::BigInt(bytes) => self.big(bytes)?,
            Value::Float(f) => write_float(&mut self.out, *f),
            Value::Str(s) => self.str(s),
            Value::Bytes(b) => {
                self.out.push(b'{');
                self.key(BYTES_TAG);
                self.out.push(b'"');
                for byte in b {
                    let _ = write!(Bytes(&mut self.out), "{byte:02x}");
                }
                self.out.extend_from_slice(b"\"}");
            }
            Value::List(items) => self.array(items)?,
            Value::Tuple(items) => {
                self.out.push(b'{');
                self.key(TUPLE_TAG);
                self.array(items)?;
                self.out.push(b'}');
            }
            Value::Dict(pairs) => {
                let plain = pairs.iter().all(|(k, _)| matches!(k, Value::Str(_)))
                    && !matches!(&pairs[..], [(Value::Str(k), _)] if is_tag(k));
                self.out.push(b'{');
                if plain {
                    for (k, v) in pairs {
                        if let Value::Str(k) = k {
                            self.key(k);
                        }
                        self.value(v)?;
                    }
                } else {
                    self.key(DICT_TAG);
                    self.out.push(b'[');
                    for (k, v) in pairs {
                        self.sep();
                        self.out.push(b'[');
                        self.value(k)?;
                        self.out.push(b',');
                        self.value(v)?;
                        self.out.push(b']');
                    }
                    self.out.push(b']');
                }
                self.out.push(b'}');
            }
        }
        Ok(())
    }

    fn array(&mut self, items: &[Value]) -> Result<()> {
        self.out.push(b'[');
        for item in items {
            self.sep();
            self.value(item)?;
        }
        self.out.push(b']');
        Ok(())
    }
}

/// The JSON spelling of the schema ([`schema`] decides the keys and their order).
impl<'s> Emit<'s> for Writer<'s> {
    type Error = FormatError;
    const COUNTS_PAIRS: bool = false;

    fn dict_begin(&mut self, _: usize) {
        self.out.push(b'{');
    }

    fn dict_end(&mut self, _: usize) {
        self.out.push(b'}');
    }

    #[inline]
    fn key(&mut self, key: Key) {
        Writer::key(self, key.text());
    }

    fn extra_key(&mut self, key: &'s str) {
        Writer::key(self, key);
    }

    #[inline]
    fn known(&mut self, value: Key) {
        Writer::str(self, value.text());
    }

    #[inline]
    fn uint(&mut self, v: u64) {
        Writer::uint(self, v);
    }

    #[inline]
    fn int(&mut self, v: i64) {
        Writer::int(self, v);
    }

    fn pyint(&mut self, v: &'s PyInt) -> Result<()> {
        Writer::pyint(self, v)
    }

    fn float(&mut self, v: f64) {
        write_float(&mut self.out, v);
    }

    fn bool(&mut self, v: bool) {
        Writer::bool(self, v);
    }

    fn str(&mut self, s: &'s str) {
        Writer::str(self, s);
    }

    #[inline(always)]
    fn strings(&self) -> Option<&'s crate::intern::StrTable> {
        Some(&self.snap.strings)
    }

    fn str_id(&mut self, id: StrId) {
        Writer::str_id(self, id);
    }

    fn stack(&mut self, id: StackId) -> Result<()> {
        Writer::stack(self, id)
    }

    fn value(&mut self, v: &'s Value) -> Result<()> {
        Writer::value(self, v)
    }

    fn list<T: Walk<'s>>(&mut self, items: &'s [T]) -> Result<()> {
        self.out.push(b'[');
        for item in items {
            self.sep();
            item.walk(self)?;
        }
        self.out.push(b']');
        Ok(())
    }

    fn pair_begin(&mut self) {
        self.out.push(b'[');
    }

    fn pair_next(&mut self) {
        self.out.push(b',');
    }

    fn pair_end(&mut self) {
        self.out.push(b']');
    }

    fn divisions(&mut self, d: &'s [(String, PyInt)]) -> Result<()> {
        self.out.push(b'{');
        for (k, v) in d {
            Writer::key(self, k);
            Writer::pyint(self, v)?;
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// `fmt::Write` into a byte vector.
struct Bytes<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Bytes<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            let _ = write!(Bytes(out), "\\u{b:04x}");
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Shortest text that reads back to the same bits; always with a `.` or exponent so it reads
/// back as a float.
fn write_float(out: &mut Vec<u8>, f: f64) {
    if f.is_nan() {
        out.extend_from_slice(b"NaN");
    } else if f.is_infinite() {
        out.extend_from_slice(if f > 0.0 { b"Infinity" } else { b"-Infinity" });
    } else {
        let _ = write!(Bytes(out), "{f:?}");
    }
}

fn is_tag(key: &str) -> bool {
    matches!(key, TUPLE_TAG | BYTES_TAG | DICT_TAG)
}

/// Decimal text of a little-endian two's-complement integer; `None` when it would be longer
/// than [`MAX_INT_DIGITS`].
fn bigint_to_decimal(bytes: &[u8]) -> Option<String> {
    // 2.41 decimal digits per byte, bounded before any quadratic work.
    if bytes.len() > MAX_INT_DIGITS * 10 / 24 {
        return None;
    }
    let text = crate::int::le_to_decimal(bytes);
    (text.len() <= MAX_INT_DIGITS + 1).then_some(text)
}

/// Minimal little-endian two's complement of a decimal integer (`digits` are ASCII digits).
fn decimal_to_bigint(negative: bool, digits: &[u8]) -> Vec<u8> {
    crate::int::decimal_to_le(negative, digits)
}

// ================================================================================== reading

/// Decodes a JSON snapshot (a snapshot dict, or a bare segment list).
pub fn read(bytes: &[u8]) -> Result<Snapshot> {
    let mut p = Parser {
        input: bytes,
        pos: 0,
        depth: 0,
        path: Vec::new(),
        snap: Snapshot::default(),
        stack_cache: HashMap::new(),
    };
    // A UTF-8 byte-order mark is harmless; skip it.
    if bytes.starts_with(b"\xef\xbb\xbf") {
        p.pos = 3;
    }
    p.top()?;
    if p.peek().is_some() {
        return Err(p.error("unexpected characters after the snapshot"));
    }
    Ok(p.snap)
}

#[derive(Clone, Debug)]
enum Seg {
    Key(&'static str),
    Name(String),
    Index(usize),
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
    depth: usize,
    path: Vec<Seg>,
    snap: Snapshot,
    /// The exact text of each `frames` list seen, so a repeated list is not parsed again.
    stack_cache: HashMap<StackText<'a>, StackId>,
}

/// A JSON number token: its sign and digits, and whether it has a fraction or exponent.
struct Number<'a> {
    text: &'a str,
    is_float: bool,
}

impl<'a> Parser<'a> {
    // ------------------------------------------------------------------ errors and paths

    fn error(&self, what: impl std::fmt::Display) -> FormatError {
        let before = &self.input[..self.pos.min(self.input.len())];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let column = before[line_start..]
            .iter()
            .filter(|&&b| b & 0xc0 != 0x80)
            .count()
            + 1;
        let mut path = String::new();
        for seg in &self.path {
            match seg {
                Seg::Key(k) => push_key(&mut path, k),
                Seg::Name(k) => push_key(&mut path, k),
                Seg::Index(i) => {
                    let _ = write!(path, "[{i}]");
                }
            }
        }
        let what = if path.is_empty() {
            what.to_string()
        } else {
            format!("{path}: {what}")
        };
        FormatError::Json { line, column, what }
    }

    fn at<T>(&mut self, seg: Seg, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.path.push(seg);
        let r = f(self)?;
        self.path.pop();
        Ok(r)
    }

    fn found(&mut self) -> &'static str {
        match self.peek() {
            None => "the end of the input",
            Some(b'{') => "an object",
            Some(b'[') => "an array",
            Some(b'"') => "a string",
            Some(b'-' | b'0'..=b'9') => "a number",
            Some(b't' | b'f') => "a boolean",
            Some(b'n') => "null",
            Some(_) => "an unexpected character",
        }
    }

    fn expected(&mut self, what: &str) -> FormatError {
        let found = self.found();
        self.error(format!("expected {what}, found {found}"))
    }

    // ------------------------------------------------------------------ lexing

    fn peek(&mut self) -> Option<u8> {
        while let Some(&b) = self.input.get(self.pos) {
            if matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                self.pos += 1;
            } else {
                return Some(b);
            }
        }
        None
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        if self.input[self.pos..].starts_with(word) {
            self.pos += word.len();
            true
        } else {
            false
        }
    }

    fn enter(&mut self) -> Result<()> {
        if self.depth >= MAX_DEPTH {
            return Err(self.error(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        self.depth += 1;
        Ok(())
    }

    /// Calls `f` for each key of an object, with the parser at the key's value.
    fn object(&mut self, mut f: impl FnMut(&mut Self, Cow<'a, str>) -> Result<()>) -> Result<()> {
        if self.peek() != Some(b'{') {
            return Err(self.expected("an object"));
        }
        self.enter()?;
        self.pos += 1;
        if self.peek() == Some(b'}') {
            self.pos += 1;
            self.depth -= 1;
            return Ok(());
        }
        loop {
            if self.peek() != Some(b'"') {
                return Err(self.expected("a string key"));
            }
            let key = self.string()?;
            if self.peek() != Some(b':') {
                return Err(self.expected("':'"));
            }
            self.pos += 1;
            f(self, key)?;
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    break;
                }
                _ => return Err(self.expected("',' or '}'")),
            }
        }
        self.depth -= 1;
        Ok(())
    }

    /// Calls `f` for each item of an array (under its index in the error path).
    fn array(&mut self, mut f: impl FnMut(&mut Self, usize) -> Result<()>) -> Result<()> {
        if self.peek() != Some(b'[') {
            return Err(self.expected("an array"));
        }
        self.enter()?;
        self.pos += 1;
        if self.peek() == Some(b']') {
            self.pos += 1;
            self.depth -= 1;
            return Ok(());
        }
        let mut index = 0;
        loop {
            self.at(Seg::Index(index), |p| f(p, index))?;
            index += 1;
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    break;
                }
                _ => return Err(self.expected("',' or ']'")),
            }
        }
        self.depth -= 1;
        Ok(())
    }

    fn string(&mut self) -> Result<Cow<'a, str>> {
        if self.peek() != Some(b'"') {
            return Err(self.expected("a string"));
        }
        self.pos += 1;
        let start = self.pos;
        // Fast path: no escapes, borrowed.
        while let Some(&b) = self.input.get(self.pos) {
            match b {
                b'"' => {
                    let raw = &self.input[start..self.pos];
                    self.pos += 1;
                    return std::str::from_utf8(raw)
                        .map(Cow::Borrowed)
                        .map_err(|e| self.utf8_error(start + e.valid_up_to()));
                }
                b'\\' => break,
                0..=0x1f => return Err(self.error("control character in a string")),
                _ => self.pos += 1,
            }
        }
        let mut out: Vec<u8> = self.input[start..self.pos].to_vec();
        loop {
            let Some(&b) = self.input.get(self.pos) else {
                return Err(self.error("unterminated string"));
            };
            self.pos += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let Some(&esc) = self.input.get(self.pos) else {
                        return Err(self.error("unterminated string"));
                    };
                    self.pos += 1;
                    let c = match esc {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => {
                            self.pos -= 1;
                            return Err(self.error("invalid escape in a string"));
                        }
                    };
                    let mut buf = [0; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                0..=0x1f => {
                    self.pos -= 1;
                    return Err(self.error("control character in a string"));
                }
                _ => out.push(b),
            }
        }
        String::from_utf8(out)
            .map(Cow::Owned)
            .map_err(|_| self.error("invalid UTF-8 in a string"))
    }

    fn utf8_error(&mut self, at: usize) -> FormatError {
        self.pos = at;
        self.error("invalid UTF-8 in a string")
    }

    /// The character of a `\uXXXX` escape (the `\u` already read), joining surrogate pairs.
    fn unicode_escape(&mut self) -> Result<char> {
        let high = self.hex4()?;
        let code = if (0xd800..0xdc00).contains(&high) {
            if !self.literal(b"\\u") {
                return Err(self.error("unpaired surrogate in a \\u escape"));
            }
            let low = self.hex4()?;
            if !(0xdc00..0xe000).contains(&low) {
                return Err(self.error("unpaired surrogate in a \\u escape"));
            }
            0x10000 + ((high - 0xd800) << 10) + (low - 0xdc00)
        } else {
            high
        };
        char::from_u32(code).ok_or_else(|| self.error("unpaired surrogate in a \\u escape"))
    }

    fn hex4(&mut self) -> Result<u32> {
        let digits = self.input.get(self.pos..self.pos + 4);
        let value = digits
            .and_then(|d| std::str::from_utf8(d).ok())
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|d| u32::from_str_radix(d, 16).ok());
        match value {
            Some(v) => {
                self.pos += 4;
                Ok(v)
            }
            None => Err(self.error("expected 4 hex digits after \\u")),
        }
    }

    fn number(&mut self) -> Result<Number<'a>> {
        if !matches!(self.peek(), Some(b'-' | b'0'..=b'9')) {
            return Err(self.expected("a number"));
        }
        let start = self.pos;
        let input = self.input;
        let digits = |pos: &mut usize| {
            let from = *pos;
            while input.get(*pos).is_some_and(u8::is_ascii_digit) {
                *pos += 1;
            }
            *pos - from
        };
        let mut pos = self.pos;
        if input[pos] == b'-' {
            pos += 1;
        }
        let int_digits = digits(&mut pos);
        let leading_zero = int_digits > 1 && input[pos - int_digits] == b'0';
        let mut is_float = false;
        let mut ok = int_digits > 0 && !leading_zero;
        if ok && input.get(pos) == Some(&b'.') {
            pos += 1;
            is_float = true;
            ok = digits(&mut pos) > 0;
        }
        if ok && matches!(input.get(pos), Some(b'e' | b'E')) {
            pos += 1;
            is_float = true;
            if matches!(input.get(pos), Some(b'+' | b'-')) {
                pos += 1;
            }
            ok = digits(&mut pos) > 0;
        }
        if !ok {
            self.pos = pos;
            return Err(self.error("malformed number"));
        }
        if pos - start > MAX_INT_DIGITS + 1 {
            return Err(self.error(format!("number longer than {MAX_INT_DIGITS} digits")));
        }
        self.pos = pos;
        // ASCII by construction.
        let text = std::str::from_utf8(&input[start..pos]).unwrap_or_default();
        Ok(Number { text, is_float })
    }

    // ------------------------------------------------------------------ typed values

    /// Any integer, exactly.
    fn int(&mut self) -> Result<PyInt> {
        let start = self.pos;
        let n = self.number()?;
        let int = if n.is_float {
            None
        } else {
            PyInt::parse_decimal(n.text)
        };
        int.ok_or_else(|| {
            self.pos = start;
            self.error(format!("expected an integer, found {}", n.text))
        })
    }

    /// An integer for a typed field under `key`: its 64 bits, the exact value kept in `exact`
    /// if they do not say it all.
    fn int_at(&mut self, key: &'static str, field: IntField, exact: &mut ExactInts) -> Result<u64> {
        self.at(Seg::Key(key), |p| Ok(exact.store(field, p.int()?)))
    }

    fn bool(&mut self) -> Result<bool> {
        self.peek();
        if self.literal(b"true") {
            Ok(true)
        } else if self.literal(b"false") {
            Ok(false)
        } else {
            Err(self.expected("true or false"))
        }
    }

    fn intern(&mut self) -> Result<StrId> {
        let s = self.string()?;
        Ok(self.snap.strings.intern(&s))
    }

    fn string_list(&mut self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        self.array(|p, _| {
            out.push(p.string()?.into_owned());
            Ok(())
        })?;
        Ok(out)
    }

    fn value(&mut self) -> Result<Value> {
        match self.peek() {
            Some(b'{') => {
                let mut pairs: Vec<(Value, Value)> = Vec::new();
                self.object(|p, key| {
                    let v = p.at(Seg::Name(key.to_string()), Self::value)?;
                    pairs.push((Value::Str(key.into_owned()), v));
                    Ok(())
                })?;
                self.untag(pairs)
            }
            Some(b'[') => {
                let mut items = Vec::new();
                self.array(|p, _| {
                    items.push(p.value()?);
                    Ok(())
                })?;
                Ok(Value::List(items))
            }
            Some(b'"') => Ok(Value::Str(self.string()?.into_owned())),
            Some(b't' | b'f') => Ok(Value::Bool(self.bool()?)),
            Some(b'n') if self.literal(b"null") => Ok(Value::None),
            Some(b'N') if self.literal(b"NaN") => Ok(Value::Float(f64::NAN)),
            Some(b'I') if self.literal(b"Infinity") => Ok(Value::Float(f64::INFINITY)),
            Some(b'-') if self.literal(b"-Infinity") => Ok(Value::Float(f64::NEG_INFINITY)),
            Some(b'-' | b'0'..=b'9') => {
                let start = self.pos;
                let n = self.number()?;
                if n.is_float {
                    return n.text.parse().map(Value::Float).map_err(|_| {
                        self.pos = start;
                        self.error("malformed number")
                    });
                }
                if let Ok(i) = n.text.parse::<i64>() {
                    return Ok(Value::Int(i));
                }
                let (negative, digits) = match n.text.strip_prefix('-') {
                    Some(d) => (true, d),
                    None => (false, n.text),
                };
                Ok(Value::BigInt(decimal_to_bigint(
                    negative,
                    digits.as_bytes(),
                )))
            }
            _ => Err(self.expected("a value")),
        }
    }

    /// Turns the one-key objects that stand for tuples, bytes and general dicts back into them.
    fn untag(&mut self, mut pairs: Vec<(Value, Value)>) -> Result<Value> {
        let tag = match &pairs[..] {
            [(Value::Str(k), _)] if is_tag(k) => k.clone(),
            _ => return Ok(Value::Dict(pairs)),
        };
        let Some((_, inner)) = pairs.pop() else {
            return Ok(Value::Dict(pairs));
        };
        match (tag.as_str(), inner) {
            (TUPLE_TAG, Value::List(items)) => Ok(Value::Tuple(items)),
            (BYTES_TAG, Value::Str(hex)) => decode_hex(&hex)
                .map(Value::Bytes)
                .ok_or_else(|| self.error("\"$bytes\" must be a string of hex digit pairs")),
            (DICT_TAG, Value::List(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    match item {
                        Value::List(kv) if kv.len() == 2 => {
                            let mut kv = kv.into_iter();
                            if let (Some(k), Some(v)) = (kv.next(), kv.next()) {
                                out.push((k, v));
                            }
                        }
                        _ => return Err(self.error("\"$dict\" items must be [key, value] pairs")),
                    }
                }
                Ok(Value::Dict(out))
            }
            (_, inner) => Err(self.error(format!(
                "{tag:?} holds a {}, which is not what the tag stands for",
                inner.type_name()
            ))),
        }
    }

    // ------------------------------------------------------------------ frames and stacks

    /// The end (exclusive) of the array starting at `self.pos`, found without parsing; `None`
    /// when it does not end.
    fn array_end(&self) -> Option<usize> {
        let mut depth = 0usize;
        let mut in_string = false;
        let mut i = self.pos;
        while let Some(&b) = self.input.get(i) {
            if in_string {
                // Jump to the next quote or backslash.
                let rest = &self.input[i..];
                match rest.iter().position(|&c| c == b'"' || c == b'\\') {
                    Some(n) if rest[n] == b'"' => {
                        in_string = false;
                        i += n;
                    }
                    Some(n) => i += n + 1,
                    None => return None,
                }
            } else {
                match b {
                    b'"' => in_string = true,
                    b'[' | b'{' => depth += 1,
                    b']' | b'}' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
            }
            i += 1;
        }
        None
    }

    fn stack(&mut self) -> Result<StackId> {
        if self.peek() != Some(b'[') {
            return Err(self.expected("a frames list"));
        }
        let text = self
            .array_end()
            .map(|end| StackText(&self.input[self.pos..end]));
        if let Some(&id) = text.and_then(|t| self.stack_cache.get(&t)) {
            self.pos += text.map_or(0, |t| t.0.len());
            return Ok(id);
        }
        let mut frames = Vec::new();
        self.array(|p, _| {
            frames.push(p.frame()?);
            Ok(())
        })?;
        let id = self.snap.stacks.intern(&frames);
        if let Some(text) = text {
            self.stack_cache.insert(text, id);
        }
        Ok(id)
    }

    fn frame(&mut self) -> Result<FrameId> {
        let frame = schema::read_frame(self, ())?;
        Ok(self.snap.frames.intern(frame))
    }

    fn extra(&mut self, key: Cow<'a, str>, out: &mut Extras) -> Result<()> {
        let v = self.at(Seg::Name(key.to_string()), Self::value)?;
        out.push((key.into_owned(), v));
        Ok(())
    }

    // ------------------------------------------------------------------ the snapshot schema

    fn top(&mut self) -> Result<()> {
        match self.peek() {
            Some(b'[') => {
                self.snap.shape = Shape::SegmentList;
                self.snap.segments = schema::segment_list(self, ())?;
                Ok(())
            }
            Some(b'{') => {
                let mut snap = schema::snapshot_dict(self, ())?;
                schema::adopt_tables(&mut snap, &mut self.snap);
                self.snap = snap;
                Ok(())
            }
            _ => Err(self.expected("a snapshot object or a segment list")),
        }
    }

    fn pool_id(&mut self, exact: &mut ExactInts) -> Result<(i64, i64)> {
        let mut items = Vec::new();
        self.array(|p, i| {
            if i >= 2 {
                return Err(p.error("expected a 2-item [int, int] pool id"));
            }
            let field = [IntField::PoolId0, IntField::PoolId1][i];
            items.push(exact.store_i64(field, p.int()?));
            Ok(())
        })?;
        match items[..] {
            [a, b] => Ok((a, b)),
            _ => Err(self.error(format!(
                "expected a 2-item [int, int] pool id, found {} items",
                items.len()
            ))),
        }
    }

    fn traces(&mut self) -> Result<Vec<Vec<TraceEntry>>> {
        let mut out = Vec::new();
        self.array(|p, _| {
            let mut entries = Vec::new();
            p.array(|p, _| {
                entries.push(p.entry()?);
                Ok(())
            })?;
            out.push(entries);
            Ok(())
        })?;
        Ok(out)
    }

    fn entry(&mut self) -> Result<TraceEntry> {
        let mut entry = EntryIn::new();
        self.object(|p, key| {
            entry.key(p, Key::of_bytes(key.as_bytes()), key, ())?;
            Ok(())
        })?;
        entry.finish(self)
    }

    fn settings(&mut self) -> Result<AllocatorSettings> {
        let mut s = AllocatorSettings::default();
        self.object(|p, key| {
            let v = p.at(Seg::Name(key.to_string()), Self::value)?;
            // A known key with an unexpected type (or a repeated one) is kept in `extra`.
            let rest = match (schema::setting(&mut s, Key::of_bytes(key.as_bytes())), v) {
                (Some(Setting::Str(slot)), Value::Str(v)) => {
                    *slot = Some(v);
                    None
                }
                (Some(Setting::Int(slot)), v @ (Value::Int(_) | Value::BigInt(_))) => {
                    *slot = PyInt::from_value(&v);
                    None
                }
                (Some(Setting::Float(slot)), Value::Float(f)) => {
                    *slot = Some(f);
                    None
                }
                (Some(Setting::Bool(slot)), Value::Bool(b)) => {
                    *slot = Some(b);
                    None
                }
                (Some(Setting::Divisions(slot)), Value::Dict(pairs))
                    if pairs.iter().all(|(k, v)| {
                        matches!(k, Value::Str(_)) && PyInt::from_value(v).is_some()
                    }) =>
                {
                    let divisions = pairs
                        .into_iter()
                        .filter_map(|(k, v)| match k {
                            Value::Str(k) => Some((k, PyInt::from_value(&v)?)),
                            _ => None,
                        })
                        .collect();
                    *slot = Some(divisions);
                    None
                }
                (_, v) => Some(v),
            };
            if let Some(v) = rest {
                s.extra.push((key.into_owned(), v));
            }
            Ok(())
        })?;
        Ok(s)
    }
}

/// The JSON parser reads the schema ([`schema`]'s read side) from its tokens: it stands at
/// each value as it is read.
impl<'a> Source for Parser<'a> {
    #[inline]
    fn strings(&self) -> &StrTable {
        &self.snap.strings
    }

    type V = ();
    type Name = Cow<'a, str>;

    fn fail(&self, what: String) -> FormatError {
        self.error(what)
    }

    fn missing(&self, what: &str, key: Key) -> FormatError {
        match key {
            Key::segments => self.error("the snapshot object has no \"segments\" key"),
            _ => self.error(format!("{what} lacks key '{}'", key.text())),
        }
    }

    #[inline]
    fn at_key<T>(&mut self, key: Key, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.at(Seg::Key(key.text()), f)
    }

    #[inline]
    fn get_dict(
        &mut self,
        _: (),
        mut each: impl FnMut(&mut Self, Option<Key>, Cow<'a, str>, ()) -> Result<()>,
    ) -> Result<()> {
        self.object(|p, name| each(p, Key::of_bytes(name.as_bytes()), name, ()))
    }

    #[inline]
    fn get_list<T>(
        &mut self,
        _: (),
        mut item: impl FnMut(&mut Self, ()) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        self.array(|p, _| {
            out.push(item(p, ())?);
            Ok(())
        })?;
        Ok(out)
    }

    #[inline]
    fn get_int(&mut self, _: ()) -> Result<PyInt> {
        self.int()
    }

    #[inline]
    fn get_field(
        &mut self,
        key: Key,
        _: (),
        field: IntField,
        exact: &mut ExactInts,
    ) -> Result<u64> {
        self.int_at(key.text(), field, exact)
    }

    fn get_string(&mut self, _: ()) -> Result<String> {
        Ok(self.string()?.into_owned())
    }

    #[inline]
    fn get_interned(&mut self, _: (), _: Option<usize>) -> Result<StrId> {
        self.intern()
    }

    #[inline]
    fn get_named<T>(
        &mut self,
        _: (),
        known: fn(&str) -> Option<T>,
        other: fn(StrId) -> T,
    ) -> Result<T> {
        let name = self.string()?;
        Ok(known(&name).unwrap_or_else(|| other(self.snap.strings.intern(&name))))
    }

    fn get_bool(&mut self, _: ()) -> Result<bool> {
        self.bool()
    }

    #[inline]
    fn get_stack(&mut self, _: ()) -> Result<StackId> {
        self.stack()
    }

    fn get_strings(&mut self, _: ()) -> Result<Vec<String>> {
        self.string_list()
    }

    fn get_value(&mut self, _: ()) -> Result<Value> {
        self.value()
    }

    fn get_pool_id(&mut self, _: (), exact: &mut ExactInts) -> Result<(i64, i64)> {
        self.pool_id(exact)
    }

    fn get_traces(&mut self, _: ()) -> Result<Vec<Vec<TraceEntry>>> {
        self.traces()
    }

    fn get_settings(&mut self, _: ()) -> Result<AllocatorSettings> {
        self.settings()
    }

    fn put_extra(&mut self, name: Cow<'a, str>, _: (), out: &mut Extras) -> Result<()> {
        self.extra(name, out)
    }
}

/// The text of a `frames` list as a map key. Stacks run to kilobytes, so the hash samples
/// the text (length, both ends, a stride through the middle) and equality compares it all.
#[derive(Clone, Copy, PartialEq, Eq)]
struct StackText<'a>(&'a [u8]);

impl std::hash::Hash for StackText<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let t = self.0;
        state.write_usize(t.len());
        state.write(&t[..t.len().min(64)]);
        state.write(&t[t.len().saturating_sub(64)..]);
        let stride = (t.len() / 32).max(1);
        for b in t.iter().step_by(stride) {
            state.write_u8(*b);
        }
    }
}

fn push_key(path: &mut String, key: &str) {
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(key);
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    hex.as_bytes()
        .chunks(2)
        .map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|s| u8::from_str_radix(s, 16).ok())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_integers_convert_both_ways() {
        for text in [
            "0",
            "1",
            "-1",
            "127",
            "128",
            "-128",
            "-129",
            "9223372036854775808",
            "-9223372036854775809",
            "18446744073709551616",
            "123456789012345678901234567890123456789",
            "-340282366920938463463374607431768211456",
        ] {
            let (negative, digits) = match text.strip_prefix('-') {
                Some(d) => (true, d),
                None => (false, text),
            };
            let bytes = decimal_to_bigint(negative, digits.as_bytes());
            assert_eq!(
                bigint_to_decimal(&bytes).as_deref(),
                Some(text),
                "{bytes:?}"
            );
        }
        assert_eq!(decimal_to_bigint(false, b"255"), vec![0xff, 0x00]);
        assert_eq!(decimal_to_bigint(true, b"256"), vec![0x00, 0xff]);
        assert_eq!(bigint_to_decimal(&[]).as_deref(), Some("0"));
    }

    #[test]
    fn errors_give_line_column_and_path() {
        let text = b"{\"segments\": [],\n \"device_traces\": [[{\"action\": \"alloc\", \"addr\": 1,\n \"size\": \"big\", \"stream\": 0}]]}";
        let err = read(text).unwrap_err();
        match err {
            FormatError::Json { line, column, what } => {
                assert_eq!((line, column), (3, 10), "{what}");
                assert!(
                    what.starts_with("device_traces[0][0].size: expected a number"),
                    "{what}"
                );
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn values_json_lacks_a_type_for_round_trip() {
        let mut snap = Snapshot::new(0);
        let tricky = Value::Dict(vec![
            (
                Value::Int(1),
                Value::Tuple(vec![Value::Bytes(vec![0, 255])]),
            ),
            (Value::None, Value::Float(f64::NAN)),
        ]);
        let tag_lookalike = Value::Dict(vec![(Value::Str("$tuple".into()), Value::Int(3))]);
        snap.extra = vec![
            ("tricky".into(), tricky),
            ("lookalike".into(), tag_lookalike),
            ("big".into(), Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1])),
            ("float".into(), Value::Float(1.0)),
            ("text".into(), Value::Str("tab\t quote\" nul\0 é 😀".into())),
        ];
        let bytes = to_vec(&snap).unwrap();
        let back = read(&bytes).unwrap();
        assert_eq!(crate::compare::diff(&snap, &back), None);
    }

    #[test]
    fn values_too_deep_to_read_back_are_refused_when_writing() {
        let mut v = Value::Int(1);
        for _ in 0..150 {
            v = Value::List(vec![v]);
        }
        let mut snap = Snapshot::new(0);
        snap.extra.push(("deep".into(), v));
        assert_eq!(
            crate::compare::diff(&snap, &read(&to_vec(&snap).unwrap()).unwrap()),
            None
        );
        for _ in 0..20 {
            snap.extra[0].1 = Value::List(vec![snap.extra[0].1.clone()]);
        }
        let err = to_vec(&snap).unwrap_err();
        assert!(err.to_string().contains("nested 171 levels"), "{err}");
    }
}
