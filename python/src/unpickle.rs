//! A pickle virtual machine that builds Python objects and executes nothing.
//!
//! It runs the data opcodes of protocols 0 to 5 (what a PyTorch snapshot is made of: dicts,
//! lists, tuples, strings, bytes, ints, floats, bools and `None`, shared through the memo) and
//! refuses every opcode that would look up a class or call an object (`GLOBAL`,
//! `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ*`, `PERSID`, `BINPERSID`, `EXT*`,
//! out-of-band buffers). The objects it builds are the ones `pickle.load` builds, with the same
//! sharing: a memo reference pushes the same object again, so a frames list shared by a
//! thousand entries is one list again.
//!
//! Where the speed comes from: a snapshot repeats the same few hundred strings (keys, action
//! names, file and function names) and ints (sizes, line numbers, addresses) millions of times.
//! `pickle.load` makes a new `str` for each occurrence; this VM makes each one once and hands
//! out new references to it (strings and ints are immutable, so nobody can tell, except by
//! `is`). Every length is checked against the remaining input before anything is read.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::{
    PyByteArray, PyBytes, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PySet, PyString, PyTuple,
};

/// Memo indices above `memo.len() + MEMO_DENSE_SLACK` go to a map, so a hostile
/// `LONG_BINPUT 0xffffffff` cannot make us allocate a huge vector.
const MEMO_DENSE_SLACK: usize = 1 << 16;
/// Strings longer than this are not looked up in the cache (snapshot strings that repeat are
/// keys, names and file paths).
const MAX_CACHED_STR: usize = 512;
/// Distinct strings kept in the cache (a bound on the memory a hostile file can make the cache
/// hold beyond the objects themselves).
const MAX_CACHED: usize = 1 << 20;
/// Slots of the int cache: direct-mapped, so the unique values of a trace (timestamps,
/// addresses) cost one overwrite each instead of growing a map, and the repeated ones
/// (sizes, line numbers, streams) are found again.
const INT_CACHE_SLOTS: usize = 1 << 16;
/// Highest protocol read (5 adds only out-of-band buffers, which are refused).
const MAX_PROTOCOL: u8 = 5;

/// Why a pickle was not loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    #[error("byte {offset}: opcode {name} (0x{opcode:02x}) refused: it would look up or call Python code, and memsnap executes nothing (a PyTorch snapshot never needs it)")]
    Refused {
        offset: usize,
        opcode: u8,
        name: &'static str,
    },
    #[error("byte {offset}: unknown opcode 0x{opcode:02x}: not a pickle, or a corrupt one")]
    UnknownOpcode { offset: usize, opcode: u8 },
    #[error("byte {offset}: the input ends inside opcode {name} (needs {needed} more bytes, {left} left): the file is truncated")]
    Truncated {
        offset: usize,
        name: &'static str,
        needed: u64,
        left: usize,
    },
    #[error("the input ends at byte {offset} without the STOP opcode: the file is truncated")]
    NoStop { offset: usize },
    #[error("byte {offset}: opcode {name} needs {what} on the stack: the pickle is corrupt")]
    Stack {
        offset: usize,
        name: &'static str,
        what: &'static str,
    },
    #[error("byte {offset}: opcode {name} refers to memo entry {index}, which was never stored: the pickle is corrupt")]
    Memo {
        offset: usize,
        name: &'static str,
        index: u64,
    },
    #[error("byte {offset}: opcode {name}: {what}")]
    Bad {
        offset: usize,
        name: &'static str,
        what: String,
    },
    #[error("byte {offset}: pickle protocol {protocol} is newer than the highest memsnap reads ({MAX_PROTOCOL})")]
    Protocol { offset: usize, protocol: u8 },
}

type Result<T> = std::result::Result<T, LoadError>;

/// Runs the pickle in `data` and returns the object `STOP` returns.
pub fn load<'py>(py: Python<'py>, data: &[u8]) -> Result<Bound<'py, PyAny>> {
    let mut vm = Vm {
        py,
        data,
        pos: 0,
        stack: Vec::with_capacity(64),
        marks: Vec::new(),
        memo: Vec::new(),
        sparse_memo: HashMap::new(),
        strings: HashMap::with_hasher(Default::default()),
        ints: vec![None; INT_CACHE_SLOTS],
    };
    vm.run()
}

struct Vm<'py, 'a> {
    py: Python<'py>,
    data: &'a [u8],
    pos: usize,
    stack: Vec<Bound<'py, PyAny>>,
    /// Stack lengths at each `MARK`.
    marks: Vec<usize>,
    memo: Vec<Option<Bound<'py, PyAny>>>,
    sparse_memo: HashMap<u64, Bound<'py, PyAny>>,
    strings: HashMap<&'a [u8], Bound<'py, PyAny>, foldhash::fast::RandomState>,
    ints: Vec<Option<(i64, Bound<'py, PyAny>)>>,
}

/// The name of an opcode, for messages.
fn opcode_name(op: u8) -> &'static str {
    match op {
        b'(' => "MARK",
        b'.' => "STOP",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'F' => "FLOAT",
        b'I' => "INT",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'L' => "LONG",
        b'M' => "BININT2",
        b'N' => "NONE",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        b'R' => "REDUCE",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'X' => "BINUNICODE",
        b'a' => "APPEND",
        b'b' => "BUILD",
        b'c' => "GLOBAL",
        b'd' => "DICT",
        b'}' => "EMPTY_DICT",
        b'e' => "APPENDS",
        b'g' => "GET",
        b'h' => "BINGET",
        b'i' => "INST",
        b'j' => "LONG_BINGET",
        b'l' => "LIST",
        b']' => "EMPTY_LIST",
        b'o' => "OBJ",
        b'p' => "PUT",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        b's' => "SETITEM",
        b't' => "TUPLE",
        b')' => "EMPTY_TUPLE",
        b'u' => "SETITEMS",
        b'G' => "BINFLOAT",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x80 => "PROTO",
        0x81 => "NEWOBJ",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        0x8a => "LONG1",
        0x8b => "LONG4",
        0x8c => "SHORT_BINUNICODE",
        0x8d => "BINUNICODE8",
        0x8e => "BINBYTES8",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x92 => "NEWOBJ_EX",
        0x93 => "STACK_GLOBAL",
        0x94 => "MEMOIZE",
        0x95 => "FRAME",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "?",
    }
}

impl<'py, 'a> Vm<'py, 'a> {
    fn run(&mut self) -> Result<Bound<'py, PyAny>> {
        let py = self.py;
        loop {
            let offset = self.pos;
            let Some(&op) = self.data.get(offset) else {
                return Err(LoadError::NoStop { offset });
            };
            self.pos += 1;
            match op {
                b'.' => return self.pop(offset, op),
                0x80 => {
                    let protocol = self.take(offset, op, 1)?[0];
                    if protocol > MAX_PROTOCOL {
                        return Err(LoadError::Protocol { offset, protocol });
                    }
                }
                0x95 => {
                    // FRAME: a length prefix for buffered readers; the data is already here.
                    self.take(offset, op, 8)?;
                }
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    self.pop(offset, op)?;
                }
                b'1' => {
                    let start = self.pop_mark(offset, op)?;
                    self.stack.truncate(start);
                }
                b'2' => {
                    let top = self.top(offset, op)?.clone();
                    self.stack.push(top);
                }
                b'N' => self.stack.push(py.None().into_bound(py)),
                0x88 => self.stack.push(pyo3::types::PyBool::new(py, true).to_owned().into_any()),
                0x89 => self.stack.push(pyo3::types::PyBool::new(py, false).to_owned().into_any()),
                b'K' => {
                    let v = self.take(offset, op, 1)?[0];
                    self.push_int(i64::from(v));
                }
                b'M' => {
                    let b = self.take(offset, op, 2)?;
                    self.push_int(i64::from(u16::from_le_bytes([b[0], b[1]])));
                }
                b'J' => {
                    let b = self.take(offset, op, 4)?;
                    self.push_int(i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])));
                }
                0x8a => {
                    let n = usize::from(self.take(offset, op, 1)?[0]);
                    let bytes = self.take(offset, op, n as u64)?;
                    self.push_long(offset, op, bytes)?;
                }
                0x8b => {
                    let n = self.len4(offset, op)?;
                    let bytes = self.take(offset, op, n)?;
                    self.push_long(offset, op, bytes)?;
                }
                b'I' => {
                    let line = self.line(offset, op)?;
                    self.push_text_int(offset, op, line)?;
                }
                b'L' => {
                    let line = self.line(offset, op)?;
                    let line = line.strip_suffix(b"L").unwrap_or(line);
                    self.push_text_int(offset, op, line)?;
                }
                b'G' => {
                    let b = self.take(offset, op, 8)?;
                    let mut raw = [0u8; 8];
                    raw.copy_from_slice(b);
                    self.stack
                        .push(PyFloat::new(py, f64::from_be_bytes(raw)).into_any());
                }
                b'F' => {
                    let line = self.line(offset, op)?;
                    let value = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .ok_or_else(|| bad(offset, op, "not a float literal"))?;
                    self.stack.push(PyFloat::new(py, value).into_any());
                }
                0x8c => {
                    let n = u64::from(self.take(offset, op, 1)?[0]);
                    self.push_str(offset, op, n)?;
                }
                b'X' => {
                    let n = self.len4(offset, op)?;
                    self.push_str(offset, op, n)?;
                }
                0x8d => {
                    let n = self.len8(offset, op)?;
                    self.push_str(offset, op, n)?;
                }
                b'C' => {
                    let n = u64::from(self.take(offset, op, 1)?[0]);
                    let b = self.take(offset, op, n)?;
                    self.stack.push(PyBytes::new(py, b).into_any());
                }
                b'B' => {
                    let n = self.len4(offset, op)?;
                    let b = self.take(offset, op, n)?;
                    self.stack.push(PyBytes::new(py, b).into_any());
                }
                0x8e => {
                    let n = self.len8(offset, op)?;
                    let b = self.take(offset, op, n)?;
                    self.stack.push(PyBytes::new(py, b).into_any());
                }
                0x96 => {
                    let n = self.len8(offset, op)?;
                    let b = self.take(offset, op, n)?;
                    self.stack.push(PyByteArray::new(py, b).into_any());
                }
                b']' => self.stack.push(PyList::empty(py).into_any()),
                b'}' => self.stack.push(PyDict::new(py).into_any()),
                b')' => self.stack.push(PyTuple::empty(py).into_any()),
                0x8f => self.stack.push(PySet::empty(py).map_err(py_err(offset, op))?.into_any()),
                b'l' => {
                    let start = self.pop_mark(offset, op)?;
                    let list = PyList::new(py, self.stack.drain(start..)).map_err(py_err(offset, op))?;
                    self.stack.push(list.into_any());
                }
                b't' => {
                    let start = self.pop_mark(offset, op)?;
                    let tuple = PyTuple::new(py, self.stack.drain(start..)).map_err(py_err(offset, op))?;
                    self.stack.push(tuple.into_any());
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    if self.stack.len() < n + self.floor() {
                        return Err(stack_err(offset, op, "enough items"));
                    }
                    let start = self.stack.len() - n;
                    let tuple = PyTuple::new(py, self.stack.drain(start..)).map_err(py_err(offset, op))?;
                    self.stack.push(tuple.into_any());
                }
                0x91 => {
                    let start = self.pop_mark(offset, op)?;
                    let items: Vec<_> = self.stack.drain(start..).collect();
                    let set = PyFrozenSet::new(py, items).map_err(py_err(offset, op))?;
                    self.stack.push(set.into_any());
                }
                b'd' => {
                    let start = self.pop_mark(offset, op)?;
                    let dict = PyDict::new(py);
                    self.set_items(offset, op, &dict, start)?;
                    self.stack.push(dict.into_any());
                }
                b'a' => {
                    let item = self.pop(offset, op)?;
                    let list = self.container::<PyList>(offset, op, self.stack.len(), "a list")?;
                    list.append(item).map_err(py_err(offset, op))?;
                }
                b'e' => {
                    let start = self.pop_mark(offset, op)?;
                    let list = self.container::<PyList>(offset, op, start, "a list")?;
                    for item in self.stack.drain(start..) {
                        list.append(item).map_err(py_err(offset, op))?;
                    }
                }
                b's' => {
                    if self.stack.len() < 2 + self.floor() {
                        return Err(stack_err(offset, op, "a key and a value"));
                    }
                    let start = self.stack.len() - 2;
                    let dict = self.container::<PyDict>(offset, op, start, "a dict")?;
                    self.set_items(offset, op, &dict, start)?;
                }
                b'u' => {
                    let start = self.pop_mark(offset, op)?;
                    let dict = self.container::<PyDict>(offset, op, start, "a dict")?;
                    self.set_items(offset, op, &dict, start)?;
                }
                0x90 => {
                    let start = self.pop_mark(offset, op)?;
                    let set = self.container::<PySet>(offset, op, start, "a set")?;
                    for item in self.stack.drain(start..) {
                        set.add(item).map_err(py_err(offset, op))?;
                    }
                }
                0x94 => {
                    let top = self.top(offset, op)?.clone();
                    self.memo.push(Some(top));
                }
                b'q' => {
                    let index = u64::from(self.take(offset, op, 1)?[0]);
                    self.put(offset, op, index)?;
                }
                b'r' => {
                    let index = self.len4(offset, op)?;
                    self.put(offset, op, index)?;
                }
                b'p' => {
                    let index = self.text_index(offset, op)?;
                    self.put(offset, op, index)?;
                }
                b'h' => {
                    let index = u64::from(self.take(offset, op, 1)?[0]);
                    self.get(offset, op, index)?;
                }
                b'j' => {
                    let index = self.len4(offset, op)?;
                    self.get(offset, op, index)?;
                }
                b'g' => {
                    let index = self.text_index(offset, op)?;
                    self.get(offset, op, index)?;
                }
                b'c' | 0x93 | b'R' | b'b' | b'i' | b'o' | 0x81 | 0x92 | b'P' | b'Q' | 0x82
                | 0x83 | 0x84 | 0x97 | 0x98 => {
                    return Err(LoadError::Refused {
                        offset,
                        opcode: op,
                        name: opcode_name(op),
                    })
                }
                b'S' | b'T' | b'U' | b'V' => {
                    return Err(bad(
                        offset,
                        op,
                        "Python 2 and protocol-0 text strings are not read (PyTorch writes protocol 2 or later)",
                    ))
                }
                _ => return Err(LoadError::UnknownOpcode { offset, opcode: op }),
            }
        }
    }

    /// The stack index below which the current `MARK` protects the items.
    #[inline]
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    #[inline]
    fn take(&mut self, offset: usize, op: u8, n: u64) -> Result<&'a [u8]> {
        let left = self.data.len() - self.pos;
        match usize::try_from(n) {
            Ok(n) if n <= left => {
                let bytes = &self.data[self.pos..self.pos + n];
                self.pos += n;
                Ok(bytes)
            }
            _ => Err(LoadError::Truncated {
                offset,
                name: opcode_name(op),
                needed: n,
                left,
            }),
        }
    }

    fn len4(&mut self, offset: usize, op: u8) -> Result<u64> {
        let b = self.take(offset, op, 4)?;
        Ok(u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
    }

    fn len8(&mut self, offset: usize, op: u8) -> Result<u64> {
        let b = self.take(offset, op, 8)?;
        let mut raw = [0u8; 8];
        raw.copy_from_slice(b);
        Ok(u64::from_le_bytes(raw))
    }

    /// A protocol-0 argument: the bytes up to the next newline.
    fn line(&mut self, offset: usize, op: u8) -> Result<&'a [u8]> {
        let rest = &self.data[self.pos..];
        let Some(end) = rest.iter().position(|&b| b == b'\n') else {
            return Err(LoadError::Truncated {
                offset,
                name: opcode_name(op),
                needed: 1,
                left: 0,
            });
        };
        self.pos += end + 1;
        Ok(&rest[..end])
    }

    fn text_index(&mut self, offset: usize, op: u8) -> Result<u64> {
        let line = self.line(offset, op)?;
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| bad(offset, op, "not a memo index"))
    }

    #[inline]
    fn pop(&mut self, offset: usize, op: u8) -> Result<Bound<'py, PyAny>> {
        if self.stack.len() <= self.floor() {
            return Err(stack_err(offset, op, "an item"));
        }
        self.stack
            .pop()
            .ok_or_else(|| stack_err(offset, op, "an item"))
    }

    #[inline]
    fn top(&self, offset: usize, op: u8) -> Result<&Bound<'py, PyAny>> {
        self.stack
            .last()
            .ok_or_else(|| stack_err(offset, op, "an item"))
    }

    #[inline]
    fn pop_mark(&mut self, offset: usize, op: u8) -> Result<usize> {
        self.marks
            .pop()
            .ok_or_else(|| stack_err(offset, op, "a MARK"))
    }

    /// The container just below `start` (where the items to add begin), as a `T`.
    #[inline]
    fn container<T: pyo3::type_object::PyTypeCheck>(
        &self,
        offset: usize,
        op: u8,
        start: usize,
        what: &'static str,
    ) -> Result<Bound<'py, T>> {
        let target = start
            .checked_sub(1)
            .and_then(|i| self.stack.get(i))
            .filter(|_| start > self.floor())
            .ok_or_else(|| stack_err(offset, op, what))?;
        target
            .cast::<T>()
            .cloned()
            .map_err(|_| stack_err(offset, op, what))
    }

    /// Moves the key/value pairs from `start` to the top of the stack into `dict`.
    fn set_items(
        &mut self,
        offset: usize,
        op: u8,
        dict: &Bound<'py, PyDict>,
        start: usize,
    ) -> Result<()> {
        if !self.stack.len().saturating_sub(start).is_multiple_of(2) {
            return Err(stack_err(
                offset,
                op,
                "an even number of items (keys and values)",
            ));
        }
        let mut items = self.stack.drain(start..);
        while let (Some(key), Some(value)) = (items.next(), items.next()) {
            dict.set_item(key, value).map_err(py_err(offset, op))?;
        }
        Ok(())
    }

    #[inline]
    fn push_int(&mut self, value: i64) {
        let py = self.py;
        // CPython keeps -5..=256 itself; the cache is for sizes, lines and addresses.
        if (-5..=256).contains(&value) {
            self.stack.push(value.into_pyobject(py).into_any_ok());
            return;
        }
        // Fibonacci hashing: the top bits of the product pick the slot.
        let slot =
            ((value as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48) as usize % INT_CACHE_SLOTS;
        if let Some((cached_value, cached)) = &self.ints[slot] {
            if *cached_value == value {
                self.stack.push(cached.clone());
                return;
            }
        }
        let object = value.into_pyobject(py).into_any_ok();
        self.ints[slot] = Some((value, object.clone()));
        self.stack.push(object);
    }

    /// `LONG1`/`LONG4`: little-endian two's complement.
    fn push_long(&mut self, offset: usize, op: u8, bytes: &[u8]) -> Result<()> {
        if bytes.len() <= 8 {
            let value = match bytes.last() {
                None => 0,
                Some(&last) => {
                    let fill = if last & 0x80 != 0 { 0xff } else { 0 };
                    let mut raw = [fill; 8];
                    raw[..bytes.len()].copy_from_slice(bytes);
                    i64::from_le_bytes(raw)
                }
            };
            self.push_int(value);
            return Ok(());
        }
        let py = self.py;
        let int = py
            .get_type::<PyInt>()
            .call_method1("from_bytes", (PyBytes::new(py, bytes), "little"))
            .and_then(|unsigned| {
                // `signed=True` as a keyword would need a dict; do the sign by hand.
                if bytes.last().is_some_and(|&b| b & 0x80 != 0) {
                    let one: Bound<'py, PyAny> = 1i64.into_pyobject(py).into_any_ok();
                    let modulus = one.lshift(8 * bytes.len())?;
                    unsigned.sub(modulus)
                } else {
                    Ok(unsigned)
                }
            })
            .map_err(py_err(offset, op))?;
        self.stack.push(int);
        Ok(())
    }

    /// Protocol-0 `INT`/`LONG`: a decimal literal (`INT` `01`/`00` are `True`/`False`).
    fn push_text_int(&mut self, offset: usize, op: u8, line: &[u8]) -> Result<()> {
        let py = self.py;
        if op == b'I' && line == b"01" {
            self.stack
                .push(pyo3::types::PyBool::new(py, true).to_owned().into_any());
            return Ok(());
        }
        if op == b'I' && line == b"00" {
            self.stack
                .push(pyo3::types::PyBool::new(py, false).to_owned().into_any());
            return Ok(());
        }
        let text = std::str::from_utf8(line)
            .ok()
            .filter(|s| {
                let digits = s.strip_prefix('-').unwrap_or(s);
                !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
            })
            .ok_or_else(|| bad(offset, op, "not a decimal integer literal"))?;
        if let Ok(value) = text.parse::<i64>() {
            self.push_int(value);
            return Ok(());
        }
        let int = py
            .get_type::<PyInt>()
            .call1((text,))
            .map_err(py_err(offset, op))?;
        self.stack.push(int);
        Ok(())
    }

    fn push_str(&mut self, offset: usize, op: u8, n: u64) -> Result<()> {
        let bytes = self.take(offset, op, n)?;
        if bytes.len() <= MAX_CACHED_STR {
            if let Some(cached) = self.strings.get(bytes) {
                self.stack.push(cached.clone());
                return Ok(());
            }
        }
        let py = self.py;
        let object = match std::str::from_utf8(bytes) {
            Ok(text) => PyString::new(py, text).into_any(),
            // pickle writes lone surrogates with `surrogatepass`; decode them the same way.
            Err(_) => PyBytes::new(py, bytes)
                .call_method1("decode", ("utf-8", "surrogatepass"))
                .map_err(py_err(offset, op))?,
        };
        if bytes.len() <= MAX_CACHED_STR && self.strings.len() < MAX_CACHED {
            self.strings.insert(bytes, object.clone());
        }
        self.stack.push(object);
        Ok(())
    }

    fn put(&mut self, offset: usize, op: u8, index: u64) -> Result<()> {
        let top = self.top(offset, op)?.clone();
        match usize::try_from(index) {
            Ok(i) if i < self.memo.len() => self.memo[i] = Some(top),
            Ok(i) if i < self.memo.len() + MEMO_DENSE_SLACK => {
                self.memo.resize(i, None);
                self.memo.push(Some(top));
            }
            _ => {
                self.sparse_memo.insert(index, top);
            }
        }
        Ok(())
    }

    fn get(&mut self, offset: usize, op: u8, index: u64) -> Result<()> {
        let found = usize::try_from(index)
            .ok()
            .and_then(|i| self.memo.get(i))
            .and_then(|slot| slot.as_ref())
            .or_else(|| self.sparse_memo.get(&index))
            .cloned()
            .ok_or(LoadError::Memo {
                offset,
                name: opcode_name(op),
                index,
            })?;
        self.stack.push(found);
        Ok(())
    }
}

fn bad(offset: usize, op: u8, what: &str) -> LoadError {
    LoadError::Bad {
        offset,
        name: opcode_name(op),
        what: what.to_owned(),
    }
}

fn stack_err(offset: usize, op: u8, what: &'static str) -> LoadError {
    LoadError::Stack {
        offset,
        name: opcode_name(op),
        what,
    }
}

/// A Python error raised while building (an unhashable dict key, a surrogate-decoding error),
/// placed at its opcode.
fn py_err(offset: usize, op: u8) -> impl Fn(PyErr) -> LoadError {
    move |e| LoadError::Bad {
        offset,
        name: opcode_name(op),
        what: e.to_string(),
    }
}

/// `into_pyobject` of an int never fails; this spells that without `unwrap`.
trait IntoAnyOk<'py> {
    fn into_any_ok(self) -> Bound<'py, PyAny>;
}

impl<'py> IntoAnyOk<'py> for std::result::Result<Bound<'py, PyInt>, std::convert::Infallible> {
    fn into_any_ok(self) -> Bound<'py, PyAny> {
        match self {
            Ok(int) => int.into_any(),
            Err(never) => match never {},
        }
    }
}
