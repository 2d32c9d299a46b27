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
//! `is`). The opcodes and their arguments are decoded by memsnap-format's opcode decoder
//! ([`memsnap_format::pickle::ops`], the format crate's one opcode table), which checks every
//! length against the remaining input before anything is read; this VM gives them meaning.

use std::collections::HashMap;

use memsnap_format::pickle::ops::{self, op, OpError, Ops};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PyNone, PySet,
    PyString, PyTuple,
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
    /// Unknown opcode, truncated argument, no `STOP`: memsnap-format's opcode decoder says it.
    #[error(transparent)]
    Decode(#[from] OpError),
}

type Result<T> = std::result::Result<T, LoadError>;

/// Runs the pickle in `data` and returns the object `STOP` returns.
pub fn load<'py>(py: Python<'py>, data: &[u8]) -> Result<Bound<'py, PyAny>> {
    let mut vm = Vm {
        py,
        data,
        ops: Ops::new(data),
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
    /// The whole input (what [`Vm::fast_dict`] decodes itself).
    data: &'a [u8],
    /// The opcodes, decoded by memsnap-format's opcode table.
    ops: Ops<'a>,
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
    ops::opcode_info(op).map_or("?", |(name, _)| name)
}

impl<'py, 'a> Vm<'py, 'a> {
    fn run(&mut self) -> Result<Bound<'py, PyAny>> {
        let py = self.py;
        loop {
            // Refused before anything of their argument is read.
            let offset = self.ops.offset();
            if let Some(code) = self.ops.peek() {
                if ops::executes_code(code) || matches!(code, op::NEXT_BUFFER | op::READONLY_BUFFER)
                {
                    return Err(LoadError::Refused {
                        offset,
                        opcode: code,
                        name: opcode_name(code),
                    });
                }
                if matches!(
                    code,
                    op::STRING | op::BINSTRING | op::SHORT_BINSTRING | op::UNICODE
                ) {
                    return Err(bad(
                        offset,
                        code,
                        "Python 2 and protocol-0 text strings are not read (PyTorch writes protocol 2 or later)",
                    ));
                }
            }
            let decoded = self.ops.next_op()?;
            let (code, arg) = (decoded.code, decoded.arg);
            match code {
                op::STOP => return self.pop(offset, code),
                op::PROTO => {
                    let [protocol] = decoded.array();
                    if protocol > MAX_PROTOCOL {
                        return Err(LoadError::Protocol { offset, protocol });
                    }
                }
                // A length prefix for buffered readers; the data is already here.
                op::FRAME => {}
                op::MARK => self.marks.push(self.stack.len()),
                op::POP => {
                    self.pop(offset, code)?;
                }
                op::POP_MARK => {
                    let start = self.pop_mark(offset, code)?;
                    self.stack.truncate(start);
                }
                op::DUP => {
                    let top = self.top(offset, code)?.clone();
                    self.stack.push(top);
                }
                op::NONE => self.stack.push(py.None().into_bound(py)),
                op::NEWTRUE => self
                    .stack
                    .push(pyo3::types::PyBool::new(py, true).to_owned().into_any()),
                op::NEWFALSE => self
                    .stack
                    .push(pyo3::types::PyBool::new(py, false).to_owned().into_any()),
                op::BININT1 => {
                    let [v] = decoded.array();
                    self.push_int(i64::from(v));
                }
                op::BININT2 => self.push_int(i64::from(u16::from_le_bytes(decoded.array()))),
                op::BININT => self.push_int(i64::from(i32::from_le_bytes(decoded.array()))),
                op::LONG1 | op::LONG4 => self.push_long(offset, code, arg)?,
                op::INT => self.push_text_int(offset, code, arg)?,
                op::LONG => {
                    let line = arg.strip_suffix(b"L").unwrap_or(arg);
                    self.push_text_int(offset, code, line)?;
                }
                op::BINFLOAT => {
                    let value = f64::from_be_bytes(decoded.array());
                    self.stack.push(PyFloat::new(py, value).into_any());
                }
                op::FLOAT => {
                    let value = std::str::from_utf8(arg)
                        .ok()
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .ok_or_else(|| bad(offset, code, "not a float literal"))?;
                    self.stack.push(PyFloat::new(py, value).into_any());
                }
                op::SHORT_BINUNICODE | op::BINUNICODE | op::BINUNICODE8 => {
                    self.push_str(offset, code, arg)?
                }
                op::SHORT_BINBYTES | op::BINBYTES | op::BINBYTES8 => {
                    self.stack.push(PyBytes::new(py, arg).into_any())
                }
                op::BYTEARRAY8 => self.stack.push(PyByteArray::new(py, arg).into_any()),
                op::EMPTY_LIST => self.stack.push(PyList::empty(py).into_any()),
                op::EMPTY_DICT => {
                    if !self.fast_dict() {
                        self.stack.push(PyDict::new(py).into_any());
                    }
                }
                op::EMPTY_TUPLE => self.stack.push(PyTuple::empty(py).into_any()),
                op::EMPTY_SET => self
                    .stack
                    .push(PySet::empty(py).map_err(py_err(offset, code))?.into_any()),
                op::LIST => {
                    let start = self.pop_mark(offset, code)?;
                    let list =
                        PyList::new(py, self.stack.drain(start..)).map_err(py_err(offset, code))?;
                    self.stack.push(list.into_any());
                }
                op::TUPLE => {
                    let start = self.pop_mark(offset, code)?;
                    let tuple = PyTuple::new(py, self.stack.drain(start..))
                        .map_err(py_err(offset, code))?;
                    self.stack.push(tuple.into_any());
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = usize::from(code - op::TUPLE1) + 1;
                    if self.stack.len() < n + self.floor() {
                        return Err(stack_err(offset, code, "enough items"));
                    }
                    let start = self.stack.len() - n;
                    let tuple = PyTuple::new(py, self.stack.drain(start..))
                        .map_err(py_err(offset, code))?;
                    self.stack.push(tuple.into_any());
                }
                op::FROZENSET => {
                    let start = self.pop_mark(offset, code)?;
                    let items: Vec<_> = self.stack.drain(start..).collect();
                    let set = PyFrozenSet::new(py, items).map_err(py_err(offset, code))?;
                    self.stack.push(set.into_any());
                }
                op::DICT => {
                    let start = self.pop_mark(offset, code)?;
                    let dict = PyDict::new(py);
                    self.set_items(offset, code, &dict, start)?;
                    self.stack.push(dict.into_any());
                }
                op::APPEND => {
                    let item = self.pop(offset, code)?;
                    let list =
                        self.container::<PyList>(offset, code, self.stack.len(), "a list")?;
                    list.append(item).map_err(py_err(offset, code))?;
                }
                op::APPENDS => {
                    let start = self.pop_mark(offset, code)?;
                    let list = self.container::<PyList>(offset, code, start, "a list")?;
                    for item in self.stack.drain(start..) {
                        list.append(item).map_err(py_err(offset, code))?;
                    }
                }
                op::SETITEM => {
                    if self.stack.len() < 2 + self.floor() {
                        return Err(stack_err(offset, code, "a key and a value"));
                    }
                    let start = self.stack.len() - 2;
                    let dict = self.container::<PyDict>(offset, code, start, "a dict")?;
                    self.set_items(offset, code, &dict, start)?;
                }
                op::SETITEMS => {
                    let start = self.pop_mark(offset, code)?;
                    let dict = self.container::<PyDict>(offset, code, start, "a dict")?;
                    self.set_items(offset, code, &dict, start)?;
                }
                op::ADDITEMS => {
                    let start = self.pop_mark(offset, code)?;
                    let set = self.container::<PySet>(offset, code, start, "a set")?;
                    for item in self.stack.drain(start..) {
                        set.add(item).map_err(py_err(offset, code))?;
                    }
                }
                op::MEMOIZE => {
                    let top = self.top(offset, code)?.clone();
                    self.memo.push(Some(top));
                }
                op::BINPUT => {
                    let [index] = decoded.array();
                    self.put(offset, code, u64::from(index))?;
                }
                op::LONG_BINPUT => {
                    self.put(offset, code, u64::from(u32::from_le_bytes(decoded.array())))?
                }
                op::PUT => {
                    let index = text_index(offset, code, arg)?;
                    self.put(offset, code, index)?;
                }
                op::BINGET => {
                    let [index] = decoded.array();
                    self.get(offset, code, u64::from(index))?;
                }
                op::LONG_BINGET => {
                    self.get(offset, code, u64::from(u32::from_le_bytes(decoded.array())))?
                }
                op::GET => {
                    let index = text_index(offset, code, arg)?;
                    self.get(offset, code, index)?;
                }
                // Every opcode of the table is above or refused before it was decoded.
                _ => return Err(OpError::Unknown { offset, code }.into()),
            }
        }
    }

    /// A dict filled in one batch of memoized str keys and plain values, built straight from
    /// the input (`EMPTY_DICT` just read): `EMPTY_DICT`, an optional memo store, `MARK`, pairs,
    /// `SETITEMS`, with `FRAME` headers anywhere. Nearly every dict of a snapshot is one (trace
    /// entries, frames, blocks). Each key is a memo reference to a `str` stored before the
    /// dict; each value a memo reference (to an object stored before the dict), an int, a
    /// short str, `None`, a bool, a float, or a list of memo references (`EMPTY_LIST`, an
    /// optional memo store, then `MARK` refs `APPENDS`, one ref `APPEND`, or nothing), each
    /// optionally followed by a memo store.
    ///
    /// The objects it builds and stores are the generic path's. It is faster because the
    /// values go into the dict straight from the memo and the caches, by reference: no stack,
    /// and no reference count taken and dropped again per key and value (two calls into
    /// libpython each under the stable ABI). Anything else (another opcode, a reference to
    /// an object stored inside the dict, a memo store that is no append) gives up: the memo
    /// is cut back to its length before the dict (every store made was an append), the input
    /// position is untouched, and the generic opcodes run from `EMPTY_DICT` on. What was built
    /// is dropped unseen; the int and str caches keep what they learned (they are caches).
    fn fast_dict(&mut self) -> bool {
        let memo_len = self.memo.len();
        let mut pos = self.ops.offset();
        match self.fast_dict_items(&mut pos, memo_len) {
            Some(dict) => {
                self.ops = Ops::new_at(self.data, pos);
                self.stack.push(dict.into_any());
                true
            }
            None => {
                self.memo.truncate(memo_len);
                false
            }
        }
    }

    fn fast_dict_items(&mut self, pos: &mut usize, memo_len: usize) -> Option<Bound<'py, PyDict>> {
        let py = self.py;
        let dict = PyDict::new(py);
        let mut op = fast_op(self.data, pos)?;
        if self.fast_store(&op, dict.as_any())? {
            op = fast_op(self.data, pos)?;
        }
        if op.code != op::MARK {
            return None;
        }
        loop {
            let key_op = fast_op(self.data, pos)?;
            if key_op.code == op::SETITEMS {
                return Some(dict);
            }
            let key = memo_ref(&key_op).filter(|&i| i < memo_len)?;
            if !self.memo[key].as_ref()?.is_exact_instance_of::<PyString>() {
                return None;
            }
            let value_op = fast_op(self.data, pos)?;
            let value = match value_op.code {
                op::BINGET | op::LONG_BINGET => {
                    Value::Memo(memo_ref(&value_op).filter(|&i| i < memo_len)?)
                }
                op::BININT1 => Value::Int(self.int_slot(i64::from(value_op.array::<1>()[0]))),
                op::BININT2 => {
                    Value::Int(self.int_slot(i64::from(u16::from_le_bytes(value_op.array()))))
                }
                op::BININT => {
                    Value::Int(self.int_slot(i64::from(i32::from_le_bytes(value_op.array()))))
                }
                op::LONG1 => Value::Int(self.int_slot(short_long(value_op.arg)?)),
                op::SHORT_BINUNICODE => self.fast_str(value_op.arg)?,
                op::NONE => Value::None,
                op::NEWTRUE => Value::Bool(true),
                op::NEWFALSE => Value::Bool(false),
                op::BINFLOAT => {
                    Value::Owned(PyFloat::new(py, f64::from_be_bytes(value_op.array())).into_any())
                }
                op::EMPTY_LIST => Value::Owned(self.fast_list(pos, memo_len)?),
                _ => return None,
            };
            // A memo store of the value (a fresh str PyTorch memoizes, say).
            let mut ahead = *pos;
            let stored = match store_index(&fast_op(self.data, &mut ahead)?, self.memo.len()) {
                Store::None => false,
                Store::Append => true,
                Store::Elsewhere => return None,
            };
            if stored {
                *pos = ahead;
                let object = match value {
                    Value::Owned(object) => object,
                    Value::Memo(i) => self.memo[i].as_ref()?.clone(),
                    Value::Int(slot) => self.ints[slot].as_ref()?.1.clone(),
                    Value::Str(bytes) => self.strings.get(bytes)?.clone(),
                    Value::None => PyNone::get(py).to_owned().into_any(),
                    Value::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
                };
                self.memo.push(Some(object));
                let value = self.memo.last()?.as_ref()?;
                dict.set_item(self.memo[key].as_ref()?, value).ok()?;
                continue;
            }
            let key = self.memo[key].as_ref()?;
            match value {
                Value::Memo(i) => dict.set_item(key, self.memo[i].as_ref()?),
                Value::Int(slot) => dict.set_item(key, &self.ints[slot].as_ref()?.1),
                Value::Str(bytes) => dict.set_item(key, self.strings.get(bytes)?),
                Value::Owned(object) => dict.set_item(key, object),
                Value::None => dict.set_item(key, PyNone::get(py)),
                Value::Bool(b) => dict.set_item(key, PyBool::new(py, b)),
            }
            .ok()?;
        }
    }

    /// A memo store at `op` of `object` when it appends to the memo (`Some(true)`), or
    /// `Some(false)` when `op` stores nothing; `None` (give up) for a store elsewhere.
    #[inline]
    fn fast_store(&mut self, op: &FastOp<'a>, object: &Bound<'py, PyAny>) -> Option<bool> {
        match store_index(op, self.memo.len()) {
            Store::None => Some(false),
            Store::Append => {
                self.memo.push(Some(object.clone()));
                Some(true)
            }
            Store::Elsewhere => None,
        }
    }

    /// A list of memo references (`EMPTY_LIST` just read): an optional memo store, then
    /// `MARK` refs `APPENDS`, one ref `APPEND`, or nothing.
    fn fast_list(&mut self, pos: &mut usize, memo_len: usize) -> Option<Bound<'py, PyAny>> {
        let list = PyList::empty(self.py);
        let mut ahead = *pos;
        let mut op = fast_op(self.data, &mut ahead)?;
        if self.fast_store(&op, list.as_any())? {
            *pos = ahead;
            op = fast_op(self.data, &mut ahead)?;
        }
        match op.code {
            op::MARK => loop {
                let item = fast_op(self.data, &mut ahead)?;
                if item.code == op::APPENDS {
                    break;
                }
                let index = memo_ref(&item).filter(|&i| i < memo_len)?;
                list.append(self.memo[index].as_ref()?).ok()?;
            },
            op::BINGET | op::LONG_BINGET => {
                let index = memo_ref(&op).filter(|&i| i < memo_len)?;
                list.append(self.memo[index].as_ref()?).ok()?;
                if fast_op(self.data, &mut ahead)?.code != op::APPEND {
                    return None;
                }
            }
            // An empty list: `op` is the next key (or a store of the list... taken above).
            _ => return Some(list.into_any()),
        }
        *pos = ahead;
        Some(list.into_any())
    }

    /// The int cache's slot holding `value` (filled first if it holds another).
    #[inline]
    fn int_slot(&mut self, value: i64) -> usize {
        let slot = int_cache_slot(value);
        match &self.ints[slot] {
            Some((cached, _)) if *cached == value => {}
            _ => {
                let object = value.into_pyobject(self.py).into_any_ok();
                self.ints[slot] = Some((value, object));
            }
        }
        slot
    }

    /// A `SHORT_BINUNICODE` value: the cached str (added if new), or a new one when it is not
    /// cached (long, or the cache is full); `None` for bytes that are not UTF-8 (the generic
    /// path decodes those as pickle does).
    #[inline]
    fn fast_str(&mut self, bytes: &'a [u8]) -> Option<Value<'py, 'a>> {
        if self.strings.contains_key(bytes) {
            return Some(Value::Str(bytes));
        }
        let text = std::str::from_utf8(bytes).ok()?;
        let object = PyString::new(self.py, text).into_any();
        if bytes.len() <= MAX_CACHED_STR && self.strings.len() < MAX_CACHED {
            self.strings.insert(bytes, object);
            return Some(Value::Str(bytes));
        }
        Some(Value::Owned(object))
    }

    /// The stack index below which the current `MARK` protects the items.
    #[inline]
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
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
        let slot = int_cache_slot(value);
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

    fn push_str(&mut self, offset: usize, op: u8, bytes: &'a [u8]) -> Result<()> {
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

/// A value of [`Vm::fast_dict`]: where to find it (by reference), or the new object.
enum Value<'py, 'a> {
    Memo(usize),
    /// A slot of the int cache.
    Int(usize),
    /// A key of the str cache.
    Str(&'a [u8]),
    Owned(Bound<'py, PyAny>),
    None,
    Bool(bool),
}

/// What a memo store opcode does to a memo of `len` indices.
enum Store {
    /// Not a memo store.
    None,
    /// Stores at index `len`.
    Append,
    /// Stores anywhere else.
    Elsewhere,
}

#[inline]
fn store_index(op: &FastOp<'_>, len: usize) -> Store {
    let index = match op.code {
        op::MEMOIZE => return Store::Append,
        op::BINPUT => usize::from(op.array::<1>()[0]),
        op::LONG_BINPUT => match usize::try_from(u32::from_le_bytes(op.array())) {
            Ok(index) => index,
            Err(_) => return Store::Elsewhere,
        },
        _ => return Store::None,
    };
    if index == len {
        Store::Append
    } else {
        Store::Elsewhere
    }
}

/// The int cache's slot for `value`: Fibonacci hashing, the top bits of the product.
#[inline]
fn int_cache_slot(value: i64) -> usize {
    ((value as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48) as usize % INT_CACHE_SLOTS
}

/// An opcode [`Vm::fast_dict`] reads: its code and argument (after the length byte of
/// `LONG1` and `SHORT_BINUNICODE`).
struct FastOp<'a> {
    code: u8,
    arg: &'a [u8],
}

impl FastOp<'_> {
    /// The argument as `N` bytes (their lengths are fixed by the opcode).
    #[inline]
    fn array<const N: usize>(&self) -> [u8; N] {
        let mut out = [0; N];
        let n = N.min(self.arg.len());
        out[..n].copy_from_slice(&self.arg[..n]);
        out
    }
}

/// The opcode at `data[*pos..]` when it is one [`Vm::fast_dict`] reads, stepping over `FRAME`
/// headers (a length prefix for buffered readers: the generic path does nothing with it
/// either). `None` for any other opcode and where the input ends first: the generic path,
/// with memsnap-format's decoder, reads it and reports any error. Decoding these few
/// opcodes here costs a fifth of the general decoder's work per opcode.
#[inline(always)]
fn fast_op<'a>(data: &'a [u8], pos: &mut usize) -> Option<FastOp<'a>> {
    loop {
        let at = *pos;
        let code = *data.get(at)?;
        let (start, len) = match code {
            op::MARK
            | op::SETITEMS
            | op::MEMOIZE
            | op::NONE
            | op::NEWTRUE
            | op::NEWFALSE
            | op::EMPTY_LIST
            | op::APPENDS
            | op::APPEND => (at + 1, 0),
            op::BINPUT | op::BINGET | op::BININT1 => (at + 1, 1),
            op::BININT2 => (at + 1, 2),
            op::LONG_BINPUT | op::LONG_BINGET | op::BININT => (at + 1, 4),
            op::BINFLOAT | op::FRAME => (at + 1, 8),
            op::LONG1 | op::SHORT_BINUNICODE => (at + 2, usize::from(*data.get(at + 1)?)),
            _ => return None,
        };
        let arg = data.get(start..start + len)?;
        *pos = start + len;
        if code != op::FRAME {
            return Some(FastOp { code, arg });
        }
    }
}

/// The memo index a `BINGET` or `LONG_BINGET` fetches (`None` for any other opcode).
#[inline]
fn memo_ref(op: &FastOp<'_>) -> Option<usize> {
    match op.code {
        op::BINGET => Some(usize::from(op.array::<1>()[0])),
        op::LONG_BINGET => usize::try_from(u32::from_le_bytes(op.array())).ok(),
        _ => None,
    }
}

/// A `LONG1` argument of at most 8 bytes as an `i64` (little-endian two's complement).
#[inline]
fn short_long(bytes: &[u8]) -> Option<i64> {
    if bytes.len() > 8 {
        return None;
    }
    Some(match bytes.last() {
        None => 0,
        Some(&last) => {
            let fill = if last & 0x80 != 0 { 0xff } else { 0 };
            let mut raw = [fill; 8];
            raw[..bytes.len()].copy_from_slice(bytes);
            i64::from_le_bytes(raw)
        }
    })
}

/// A protocol-0 memo index (`GET`/`PUT`): a decimal line.
fn text_index(offset: usize, op: u8, line: &[u8]) -> Result<u64> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .ok_or_else(|| bad(offset, op, "not a memo index"))
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
