//! The `memsnap` package's pickle loader: memsnap-format's pickle machine
//! ([`memsnap_format::pickle::machine`]) with a builder that makes Python objects, and
//! executes nothing.
//!
//! The machine is the one the snapshot reader runs: it reads the opcodes (protocols 0 to 5)
//! through the format crate's one opcode table, checks every length against the remaining
//! input before anything is read, keeps the stack, the `MARK`s and the memo (bounded against
//! hostile indices), and refuses every opcode that would look up a class or call an object
//! (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ*`, `PERSID`,
//! `BINPERSID`, `EXT*`) and out-of-band buffers. This module is only the [`Build`]er: what
//! each value is as a Python object. They are the ones `pickle.load` builds (dicts, lists,
//! tuples, sets, strings, bytes, ints, floats, bools and `None`), with the same sharing: a
//! memo reference pushes the same object again, so a frames list shared by a thousand entries
//! is one list again.
//!
//! Where the speed comes from: a snapshot repeats the same few hundred strings (keys, action
//! names, file and function names) and ints (sizes, line numbers, addresses) millions of times.
//! `pickle.load` makes a new `str` for each occurrence; this builder makes each one once and
//! hands out new references to it (strings and ints are immutable, so nobody can tell, except
//! by `is`); an int a dict key had just before is handed out again, and a key whose ints
//! never repeat (timestamps) gets new ones without a cache lookup ([`KeyInts`]). And at
//! `EMPTY_DICT` (the machine's [`Build::empty_dict`] hook) it reads a dict of memoized keys and
//! plain values in one piece, straight from the input, and a list of memo references made at
//! its final size.
//!
//! A file is run as it is read ([`load_from`]), a window at a time, as `pickle.load` reads
//! it: reading it whole first cost a copy and the page faults of 81–153 MB per 1M entries.

use std::collections::HashMap;

use memsnap_format::pickle::machine::{
    self, long_to_i64, opcode_name, Build, BuildError, Container, Feed, Machine, Memo, Packing,
    Parts,
};
use memsnap_format::pickle::ops::op;
use memsnap_format::FormatError;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PyNone, PySet,
    PyString, PyTuple,
};

/// Strings longer than this are not looked up in the cache (snapshot strings that repeat are
/// keys, names and file paths).
const MAX_CACHED_STR: usize = 512;
/// Distinct strings kept in the cache (a bound on the memory a hostile file can make the cache
/// hold beyond the objects themselves).
const MAX_CACHED: usize = 1 << 20;
/// Slots of the int cache: direct-mapped, so the unique values of a trace (timestamps,
/// addresses) cost one overwrite each instead of growing a map, and the repeated ones
/// (sizes, line numbers, streams) are found again. Small on purpose: 64 KiB stays in the
/// CPU's cache, and an int it evicts was made recently, so dropping the cache's reference
/// to it touches warm memory. With 65,536 slots (1 MiB) a slot read and an eviction were
/// each a cache miss: the 1M-entry shared-layout load took 1.13–1.73 s with them, 0.97–1.39 s
/// with 4,096 and the per-key choice of [`KeyInts`] (five alternating runs of each).
const INT_CACHE_SLOTS: usize = 1 << INT_CACHE_BITS;
const INT_CACHE_BITS: u32 = 12;
/// Dict keys (by memo index) whose int values are tried in the int cache before it is
/// decided whether that key's ints are worth it ([`KeyInts`]); later keys always use it.
const INT_POLICY_KEYS: usize = 4096;

/// Why a pickle was not loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// Malformed, truncated or hostile input (an opcode that would run code is
    /// `opcode NAME (0xNN) refused`), or an object Python would not build (an unhashable key):
    /// what the machine says, at the offending opcode's byte offset.
    #[error("byte {offset}: {what}")]
    Pickle { offset: u64, what: String },
    #[error(transparent)]
    Other(FormatError),
}

type Result<T> = std::result::Result<T, LoadError>;
type BuildResult<T> = std::result::Result<T, BuildError>;

/// Runs the pickle in `data` and returns the object `STOP` returns.
pub fn load<'py>(py: Python<'py>, data: &[u8]) -> Result<Bound<'py, PyAny>> {
    loaded(machine::load(data, PyBuild::new(py)))
}

/// [`load`] from a stream of `len` bytes (a file), read a window at a time: the file's
/// bytes are never all in memory at once, as with `pickle.load`.
pub fn load_from<'py>(
    py: Python<'py>,
    reader: impl std::io::Read,
    len: u64,
) -> Result<Bound<'py, PyAny>> {
    loaded(machine::load_from(reader, len, PyBuild::new(py)))
}

fn loaded<'py>(
    result: std::result::Result<(Bound<'py, PyAny>, PyBuild<'py>), FormatError>,
) -> Result<Bound<'py, PyAny>> {
    match result {
        Ok((object, _)) => Ok(object),
        Err(FormatError::Pickle { offset, what }) => Err(LoadError::Pickle { offset, what }),
        Err(other) => Err(LoadError::Other(other)),
    }
}

impl<'py> PyBuild<'py> {
    fn new(py: Python<'py>) -> Self {
        PyBuild {
            py,
            strings: HashMap::with_hasher(Default::default()),
            // Every slot holds a value and its int, 0 at first (a true pair wherever it is).
            ints: vec![(0, 0i64.into_pyobject(py).into_any_ok()); INT_CACHE_SLOTS],
            int_keys: std::iter::repeat_with(|| KeyInts::NEW)
                .take(INT_POLICY_KEYS)
                .collect(),
            list_items: Vec::new(),
        }
    }
}

/// The builder: Python objects, and the caches of the strings and ints made.
struct PyBuild<'py> {
    py: Python<'py>,
    strings: HashMap<Box<[u8]>, Bound<'py, PyAny>, foldhash::fast::RandomState>,
    ints: Vec<(i64, Bound<'py, PyAny>)>,
    /// Per dict key (a memo index below [`INT_POLICY_KEYS`]): how its int values fared in
    /// the int cache.
    int_keys: Vec<KeyInts<'py>>,
    /// The memo indices of the list [`PyBuild::fast_list`] is reading (kept for its capacity).
    list_items: Vec<usize>,
}

/// One dict key's ints: the last value it had (an entry's `time_us` or `addr` is often the
/// one before it: a free request and its completion, two events of one instant), and how
/// its other values fared in the int cache over the key's first [`KeyInts::TRIAL`] lookups,
/// which decides whether its later values go through the cache at all.
///
/// Why: a key whose values are unique (most `time_us`, `addr`s) gains nothing from the
/// cache and costs two cache misses a value (the slot, then the old object it evicts, whose
/// reference is dropped). Sizes, lines and streams repeat and stay cached.
struct KeyInts<'py> {
    last: Option<(i64, Bound<'py, PyAny>)>,
    looked_up: u32,
    found: u32,
}

impl KeyInts<'_> {
    const TRIAL: u32 = 4096;
    const NEW: Self = KeyInts {
        last: None,
        looked_up: 0,
        found: 0,
    };

    /// Whether this key's ints are looked up in the cache: always during the trial, then
    /// when at least a quarter of the trial's lookups found their value.
    #[inline]
    fn cached(&self) -> bool {
        self.looked_up < Self::TRIAL || self.found >= Self::TRIAL / 4
    }

    #[inline]
    fn count(&mut self, found: bool) {
        if self.looked_up < Self::TRIAL {
            self.looked_up += 1;
            self.found += u32::from(found);
        }
    }
}

/// The loader's memo: an object per slot.
type PyMemo<'py> = Memo<PyBuild<'py>>;

impl<'py> Packing for PyBuild<'py> {
    type Value = Bound<'py, PyAny>;
    type Slot = Option<Bound<'py, PyAny>>;
    const EMPTY: Self::Slot = None;

    #[inline(always)]
    fn is_empty(slot: &Self::Slot) -> bool {
        slot.is_none()
    }

    #[inline(always)]
    fn pack(v: Self::Value, _wide: &mut Vec<Self::Value>) -> Self::Slot {
        Some(v)
    }

    #[inline(always)]
    fn unpack(slot: &Self::Slot, _wide: &[Self::Value]) -> Option<Self::Value> {
        slot.clone()
    }
}

impl<'py> Build for PyBuild<'py> {
    type Value = Bound<'py, PyAny>;
    type Packing = Self;
    const PROTOCOL_0_AND_SETS: bool = true;

    #[inline]
    fn none(&mut self) -> Self::Value {
        PyNone::get(self.py).to_owned().into_any()
    }

    #[inline]
    fn bool(&mut self, value: bool) -> Self::Value {
        PyBool::new(self.py, value).to_owned().into_any()
    }

    #[inline]
    fn int(&mut self, value: i64) -> Self::Value {
        // CPython keeps -5..=256 itself; the cache is for sizes, lines and addresses.
        if (-5..=256).contains(&value) {
            return value.into_pyobject(self.py).into_any_ok();
        }
        let (slot, _) = self.int_slot(value);
        self.ints[slot].1.clone()
    }

    /// `LONG1`/`LONG4` beyond 64 bits: `int.from_bytes`, signed.
    fn big_int(&mut self, bytes: &[u8]) -> BuildResult<Self::Value> {
        let py = self.py;
        py.get_type::<PyInt>()
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
            .map_err(py_err)
    }

    fn decimal_int(&mut self, digits: &str) -> BuildResult<Self::Value> {
        self.py.get_type::<PyInt>().call1((digits,)).map_err(py_err)
    }

    #[inline]
    fn float(&mut self, value: f64) -> Self::Value {
        PyFloat::new(self.py, value).into_any()
    }

    #[inline]
    fn str(&mut self, bytes: &[u8]) -> BuildResult<Self::Value> {
        if bytes.len() <= MAX_CACHED_STR {
            if let Some(cached) = self.strings.get(bytes) {
                return Ok(cached.clone());
            }
        }
        let py = self.py;
        let object = match std::str::from_utf8(bytes) {
            Ok(text) => PyString::new(py, text).into_any(),
            // pickle writes lone surrogates with `surrogatepass`; decode them the same way.
            Err(_) => PyBytes::new(py, bytes)
                .call_method1("decode", ("utf-8", "surrogatepass"))
                .map_err(py_err)?,
        };
        if bytes.len() <= MAX_CACHED_STR && self.strings.len() < MAX_CACHED {
            self.strings.insert(bytes.into(), object.clone());
        }
        Ok(object)
    }

    #[inline]
    fn bytes(&mut self, bytes: &[u8]) -> BuildResult<Self::Value> {
        Ok(PyBytes::new(self.py, bytes).into_any())
    }

    fn bytearray(&mut self, bytes: &[u8]) -> BuildResult<Self::Value> {
        Ok(PyByteArray::new(self.py, bytes).into_any())
    }

    #[inline]
    fn empty(&mut self, kind: Container) -> BuildResult<Self::Value> {
        let py = self.py;
        Ok(match kind {
            Container::List => PyList::empty(py).into_any(),
            Container::Dict => PyDict::new(py).into_any(),
            Container::Tuple => PyTuple::empty(py).into_any(),
            Container::Set => PySet::empty(py).map_err(py_err)?.into_any(),
            _ => PyFrozenSet::empty(py).map_err(py_err)?.into_any(),
        })
    }

    fn collect(
        &mut self,
        kind: Container,
        stack: &mut Vec<Self::Value>,
        from: usize,
    ) -> BuildResult<Self::Value> {
        let py = self.py;
        let items = stack.drain(from..);
        Ok(match kind {
            Container::List => PyList::new(py, items).map_err(py_err)?.into_any(),
            Container::Tuple => PyTuple::new(py, items).map_err(py_err)?.into_any(),
            Container::Dict => {
                let dict = PyDict::new(py);
                set_items(&dict, items)?;
                dict.into_any()
            }
            Container::FrozenSet => {
                let items: Vec<_> = items.collect();
                PyFrozenSet::new(py, items).map_err(py_err)?.into_any()
            }
            _ => {
                let items: Vec<_> = items.collect();
                PySet::new(py, items).map_err(py_err)?.into_any()
            }
        })
    }

    fn extend(
        &mut self,
        code: u8,
        stack: &mut Vec<Self::Value>,
        target: usize,
        from: usize,
    ) -> BuildResult<()> {
        let name = opcode_name(code).unwrap_or("?");
        let target = &stack[target];
        match code {
            op::APPEND | op::APPENDS => {
                let list = container::<PyList>(target, name, "a list")?;
                for item in stack.drain(from..) {
                    list.append(item).map_err(py_err)?;
                }
            }
            op::SETITEM | op::SETITEMS => {
                let dict = container::<PyDict>(target, name, "a dict")?;
                set_items(&dict, stack.drain(from..))?;
            }
            _ => {
                let set = container::<PySet>(target, name, "a set")?;
                for item in stack.drain(from..) {
                    set.add(item).map_err(py_err)?;
                }
            }
        }
        Ok(())
    }

    fn text(&self, value: &Self::Value) -> Option<String> {
        value
            .cast::<PyString>()
            .ok()?
            .to_cow()
            .ok()
            .map(|text| text.into_owned())
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
    /// an object stored inside the dict, a memo store that is no append, a `FRAME` that
    /// declares more than is left) gives up: the memo is cut back to its length before the
    /// dict (every store made was an append), the input position is untouched, and the
    /// machine runs the opcodes from `EMPTY_DICT` on. What was built is dropped unseen; the
    /// int and str caches keep what they learned (they are caches).
    fn empty_dict<F: Feed>(m: &mut Machine<'_, Self, F>) -> bool {
        let Parts {
            rest,
            builder,
            memo,
            stack,
        } = m.parts();
        let memo_len = memo.dense_slots().len();
        let mut pos = 0;
        match builder.fast_dict_items(rest, &mut pos, memo, memo_len) {
            Some(dict) => {
                stack.push(dict.into_any());
                m.advance(pos);
                true
            }
            None => {
                memo.truncate_dense(memo_len);
                false
            }
        }
    }
}

/// The container at `target` as a `T` (what `APPENDS`, `SETITEMS`, `ADDITEMS` add to).
#[inline]
fn container<'py, T: pyo3::type_object::PyTypeCheck>(
    target: &Bound<'py, PyAny>,
    name: &str,
    what: &str,
) -> BuildResult<Bound<'py, T>> {
    target
        .cast::<T>()
        .cloned()
        .map_err(|_| BuildError::new(format!("{name} needs {what} below its items")))
}

/// Puts keys and values, interleaved, into `dict`.
fn set_items<'py>(
    dict: &Bound<'py, PyDict>,
    mut items: impl Iterator<Item = Bound<'py, PyAny>>,
) -> BuildResult<()> {
    while let (Some(key), Some(value)) = (items.next(), items.next()) {
        dict.set_item(key, value).map_err(py_err)?;
    }
    Ok(())
}

impl<'py> PyBuild<'py> {
    /// [`Build::empty_dict`]'s reading, from `data[*pos..]` (the opcode after `EMPTY_DICT`).
    fn fast_dict_items<'a>(
        &mut self,
        data: &'a [u8],
        pos: &mut usize,
        memo: &mut PyMemo<'py>,
        memo_len: usize,
    ) -> Option<Bound<'py, PyDict>> {
        let py = self.py;
        let dict = PyDict::new(py);
        let mut op = fast_op(data, pos)?;
        if fast_store(&op, memo, dict.as_any())? {
            op = fast_op(data, pos)?;
        }
        if op.code != op::MARK {
            return None;
        }
        loop {
            let key_op = fast_op(data, pos)?;
            if key_op.code == op::SETITEMS {
                return Some(dict);
            }
            let key = memo_ref(&key_op).filter(|&i| i < memo_len)?;
            if !memo.dense_slots()[key]
                .as_ref()?
                .is_exact_instance_of::<PyString>()
            {
                return None;
            }
            let value_op = fast_op(data, pos)?;
            let value = match value_op.code {
                op::BINGET | op::LONG_BINGET => {
                    Value::Memo(memo_ref(&value_op).filter(|&i| i < memo_len)?)
                }
                op::BININT1 => self.int_value(key, i64::from(value_op.array::<1>()[0])),
                op::BININT2 => self.int_value(key, i64::from(u16::from_le_bytes(value_op.array()))),
                op::BININT => self.int_value(key, i64::from(i32::from_le_bytes(value_op.array()))),
                op::LONG1 => self.int_value(key, long_to_i64(value_op.arg)?),
                op::SHORT_BINUNICODE => self.fast_str(value_op.arg)?,
                op::NONE => Value::None,
                op::NEWTRUE => Value::Bool(true),
                op::NEWFALSE => Value::Bool(false),
                op::BINFLOAT => {
                    Value::Owned(PyFloat::new(py, f64::from_be_bytes(value_op.array())).into_any())
                }
                op::EMPTY_LIST => Value::Owned(self.fast_list(data, pos, memo, memo_len)?),
                _ => return None,
            };
            // A memo store of the value (a fresh str PyTorch memoizes, say).
            let mut ahead = *pos;
            match store_index(&fast_op(data, &mut ahead)?, memo) {
                Store::None => {}
                Store::Elsewhere => return None,
                Store::Append(index) => {
                    *pos = ahead;
                    let object = match value {
                        Value::Owned(object) => object,
                        Value::Memo(i) => memo.dense_slots()[i].clone()?,
                        Value::Int(slot) => self.ints[slot].1.clone(),
                        Value::KeyLast(k) => self.int_keys[k].last.as_ref()?.1.clone(),
                        Value::Str(bytes) => self.strings.get(bytes)?.clone(),
                        Value::None => PyNone::get(py).to_owned().into_any(),
                        Value::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
                    };
                    if !memo.push_dense(index, object) {
                        return None;
                    }
                    let slots = memo.dense_slots();
                    dict.set_item(slots[key].as_ref()?, slots.last()?.as_ref()?)
                        .ok()?;
                    continue;
                }
            }
            let slots = memo.dense_slots();
            let key = slots[key].as_ref()?;
            match value {
                Value::Memo(i) => dict.set_item(key, slots[i].as_ref()?),
                Value::Int(slot) => dict.set_item(key, &self.ints[slot].1),
                Value::KeyLast(k) => dict.set_item(key, &self.int_keys[k].last.as_ref()?.1),
                Value::Str(bytes) => dict.set_item(key, self.strings.get(bytes)?),
                Value::Owned(object) => dict.set_item(key, object),
                Value::None => dict.set_item(key, PyNone::get(py)),
                Value::Bool(b) => dict.set_item(key, PyBool::new(py, b)),
            }
            .ok()?;
        }
    }

    /// A list of memo references (`EMPTY_LIST` just read): an optional memo store, then
    /// `MARK` refs `APPENDS`, one ref `APPEND`, or nothing. The references are gathered
    /// first and the list made at its final size (`APPEND` by `APPEND`, a 27-frame list grew
    /// five times); it goes into the memo afterwards, at the index its store named (the
    /// references are all to objects stored before the dict, so none can name the list).
    fn fast_list(
        &mut self,
        data: &[u8],
        pos: &mut usize,
        memo: &mut PyMemo<'py>,
        memo_len: usize,
    ) -> Option<Bound<'py, PyAny>> {
        let mut ahead = *pos;
        let mut op = fast_op(data, &mut ahead)?;
        let store = match store_index(&op, memo) {
            Store::None => None,
            Store::Append(index) => {
                *pos = ahead;
                op = fast_op(data, &mut ahead)?;
                Some(index)
            }
            Store::Elsewhere => return None,
        };
        let items = &mut self.list_items;
        items.clear();
        match op.code {
            op::MARK => loop {
                let item = fast_op(data, &mut ahead)?;
                if item.code == op::APPENDS {
                    break;
                }
                items.push(memo_ref(&item).filter(|&i| i < memo_len)?);
            },
            op::BINGET | op::LONG_BINGET => {
                items.push(memo_ref(&op).filter(|&i| i < memo_len)?);
                if fast_op(data, &mut ahead)?.code != op::APPEND {
                    return None;
                }
            }
            // An empty list: `op` is the next key, not read here.
            _ => ahead = *pos,
        }
        let slots = memo.dense_slots();
        if items.iter().any(|&i| slots[i].is_none()) {
            return None;
        }
        // Never used (every slot was just checked): `PyList::new` wants an exact length.
        let none = PyNone::get(self.py);
        let list = PyList::new(
            self.py,
            items.iter().map(|&i| slots[i].as_ref().unwrap_or(&none)),
        )
        .ok()?
        .into_any();
        if let Some(index) = store {
            if !memo.push_dense(index, list.clone()) {
                return None;
            }
        }
        *pos = ahead;
        Some(list)
    }

    /// An int value of the dict key at memo index `key`: the key's last value when it is that
    /// again, else a slot of the int cache, or a new int when that key's values do not
    /// repeat ([`KeyInts`]); it becomes the key's last value.
    #[inline]
    fn int_value<'a>(&mut self, key: usize, value: i64) -> Value<'py, 'a> {
        let Some(ints) = self.int_keys.get_mut(key) else {
            return Value::Int(self.int_slot(value).0);
        };
        if let Some((last, _)) = &ints.last {
            if *last == value {
                return Value::KeyLast(key);
            }
        }
        let object = if ints.cached() {
            let (slot, found) = self.int_slot(value);
            self.int_keys[key].count(found);
            self.ints[slot].1.clone()
        } else {
            value.into_pyobject(self.py).into_any_ok()
        };
        self.int_keys[key].last = Some((value, object));
        Value::KeyLast(key)
    }

    /// The int cache's slot holding `value` (filled first if it holds another), and whether
    /// it held `value` already.
    #[inline]
    fn int_slot(&mut self, value: i64) -> (usize, bool) {
        let slot = int_cache_slot(value);
        if self.ints[slot].0 == value {
            return (slot, true);
        }
        self.ints[slot] = (value, value.into_pyobject(self.py).into_any_ok());
        (slot, false)
    }

    /// A `SHORT_BINUNICODE` value: the cached str (added if new), or a new one when it is not
    /// cached (long, or the cache is full); `None` for bytes that are not UTF-8 (the generic
    /// path decodes those as pickle does).
    #[inline]
    fn fast_str<'a>(&mut self, bytes: &'a [u8]) -> Option<Value<'py, 'a>> {
        if self.strings.contains_key(bytes) {
            return Some(Value::Str(bytes));
        }
        let text = std::str::from_utf8(bytes).ok()?;
        let object = PyString::new(self.py, text).into_any();
        if bytes.len() <= MAX_CACHED_STR && self.strings.len() < MAX_CACHED {
            self.strings.insert(bytes.into(), object);
            return Some(Value::Str(bytes));
        }
        Some(Value::Owned(object))
    }
}

/// A memo store at `op` of `object` when it appends to the memo (`Some(true)`), or
/// `Some(false)` when `op` stores nothing; `None` (give up) for a store elsewhere.
#[inline]
fn fast_store<'py>(
    op: &FastOp<'_>,
    memo: &mut PyMemo<'py>,
    object: &Bound<'py, PyAny>,
) -> Option<bool> {
    match store_index(op, memo) {
        Store::None => Some(false),
        Store::Append(index) => memo.push_dense(index, object.clone()).then_some(true),
        Store::Elsewhere => None,
    }
}

/// A value of [`Build::empty_dict`]'s dict: where to find it (by reference), or the new object.
enum Value<'py, 'a> {
    Memo(usize),
    /// A slot of the int cache.
    Int(usize),
    /// The last int value of the dict key at this memo index ([`KeyInts`]).
    KeyLast(usize),
    /// A key of the str cache.
    Str(&'a [u8]),
    Owned(Bound<'py, PyAny>),
    None,
    Bool(bool),
}

/// What a memo store opcode does to the memo.
enum Store {
    /// Not a memo store.
    None,
    /// Stores at this index, the next dense one.
    Append(u64),
    /// Stores anywhere else.
    Elsewhere,
}

#[inline]
fn store_index(op: &FastOp<'_>, memo: &PyMemo<'_>) -> Store {
    let index = match op.code {
        op::MEMOIZE => memo.count() as u64,
        op::BINPUT => u64::from(op.array::<1>()[0]),
        op::LONG_BINPUT => u64::from(u32::from_le_bytes(op.array())),
        _ => return Store::None,
    };
    if index == memo.dense_slots().len() as u64 {
        Store::Append(index)
    } else {
        Store::Elsewhere
    }
}

/// The int cache's slot for `value`: Fibonacci hashing, the top bits of the product.
#[inline]
fn int_cache_slot(value: i64) -> usize {
    ((value as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - INT_CACHE_BITS)) as usize
}

/// An opcode [`Build::empty_dict`] reads: its code and argument (after the length byte of
/// `LONG1` and `SHORT_BINUNICODE`).
struct FastOp<'a> {
    code: u8,
    arg: &'a [u8],
}

impl FastOp<'_> {
    /// The argument as `N` bytes (their lengths are fixed by the opcode, so this is a
    /// load; a copy of a length known only at run time was a call to `memcpy` per opcode).
    #[inline]
    fn array<const N: usize>(&self) -> [u8; N] {
        self.arg.first_chunk::<N>().copied().unwrap_or([0; N])
    }
}

/// The opcode at `data[*pos..]` when it is one [`Build::empty_dict`] reads, stepping over `FRAME`
/// headers (a length prefix for buffered readers; one that declares more than is left gives
/// up, as the machine refuses it). `None` for any other opcode and where the input ends
/// first: the machine reads it and reports any error. Decoding these few opcodes here costs
/// a fifth of the general decoder's work per opcode.
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
        let declared = u64::from_le_bytes(arg.try_into().ok()?);
        if declared > (data.len() - *pos) as u64 {
            return None;
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

/// A Python error raised while building (an unhashable dict key, a surrogate-decoding error):
/// the machine reports it at its opcode.
fn py_err(e: PyErr) -> BuildError {
    BuildError::new(e.to_string())
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
