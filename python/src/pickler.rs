//! Writes Python data (dicts, lists, tuples, strings, bytes, ints, floats, bools, `None`) as a
//! protocol-4 pickle, the way CPython's pickler spells it: every string and container memoized
//! and written once, a shared object written again as a memo reference (`BINGET`), so
//! `pickle.load` of the result gives back equal objects with the same sharing. Anything else
//! (class instances, functions, NumPy arrays) is refused: a snapshot pickle holds only data.
//!
//! The framing follows CPython's C pickler too (a frame is closed at the start of the first
//! `save` once it holds 64 KiB; payloads of 64 KiB or more go between frames), so
//! `dumps(pickle.load(f))` gives back the bytes of a file CPython wrote. The opcodes and frames
//! are memsnap-format's [`Emitter`], which writes the snapshot pickles too, with its rules for
//! containers (batches of 1000, `APPEND`/`SETITEM` for a lone item, tuples memoized after their
//! items) and the shortest `LONG1`; this module walks the Python objects, and memoizes by
//! identity (a shared object is written once, then referenced).

use std::collections::HashMap;

use memsnap_format::pickle::emit::{op, Emitter};
use pyo3::exceptions::{PyRecursionError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple,
};

/// Deeper nesting than this is refused (a snapshot is about six levels deep).
const MAX_DEPTH: usize = 1000;

pub fn dumps(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let mut pickler = Pickler {
        e: Emitter::new(1 << 16),
        memo: HashMap::new(),
        path: Vec::new(),
    };
    pickler.save(obj)?;
    Ok(pickler.e.finish())
}

/// One step down from the root: a list or tuple index, or a dict key.
enum Step {
    Index(usize),
    Key(Py<PyAny>),
}

struct Pickler {
    e: Emitter,
    /// Object address -> memo index. The objects stay alive: the root holds them.
    memo: HashMap<usize, u32>,
    /// Where we are (`['device_traces'][0][12]`), for error messages.
    path: Vec<Step>,
}

impl Pickler {
    fn save(&mut self, obj: &Bound<'_, PyAny>) -> PyResult<()> {
        // An opcode boundary, as CPython checks it at the start of every `save`: start a new
        // frame once the open one is full.
        self.e.boundary();
        self.save_object(obj)
    }

    fn save_object(&mut self, obj: &Bound<'_, PyAny>) -> PyResult<()> {
        if obj.is_none() {
            self.e.op(op::NONE);
            return Ok(());
        }
        if let Ok(b) = obj.cast_exact::<PyBool>() {
            self.e.bool(b.is_true());
            return Ok(());
        }
        if let Ok(int) = obj.cast_exact::<PyInt>() {
            return self.save_int(int);
        }
        if let Ok(float) = obj.cast_exact::<PyFloat>() {
            self.e.float(float.value());
            return Ok(());
        }
        let address = obj.as_ptr() as usize;
        if let Some(&index) = self.memo.get(&address) {
            self.e.get(index);
            return Ok(());
        }
        if let Ok(s) = obj.cast_exact::<PyString>() {
            let encoded;
            let text = s.to_cow();
            let bytes = match &text {
                Ok(text) => text.as_bytes(),
                Err(_) => {
                    // Lone surrogates: pickle writes them with `surrogatepass`.
                    encoded = s.call_method1("encode", ("utf-8", "surrogatepass"))?;
                    encoded.cast::<PyBytes>()?.as_bytes()
                }
            };
            self.e.str(bytes);
            self.memoize(address);
            return Ok(());
        }
        if let Ok(b) = obj.cast_exact::<PyBytes>() {
            self.e.bytes(b.as_bytes());
            self.memoize(address);
            return Ok(());
        }
        if let Ok(b) = obj.cast_exact::<PyByteArray>() {
            self.e.bytearray(&b.to_vec());
            self.memoize(address);
            return Ok(());
        }
        if self.path.len() >= MAX_DEPTH {
            return Err(PyRecursionError::new_err(format!(
                "memsnap.dump: nesting deeper than {MAX_DEPTH} levels at {}",
                self.where_(obj.py())
            )));
        }
        // Containers: the emitter's batching and memoization rules (CPython's), the same
        // calls the snapshot writer makes.
        if let Ok(list) = obj.cast_exact::<PyList>() {
            self.e.op(op::EMPTY_LIST);
            self.memoize(address);
            let items: Vec<_> = list.iter().collect();
            let len = items.len();
            for (i, item) in items.iter().enumerate() {
                self.e.batch_item_begin(i, len);
                self.path.push(Step::Index(i));
                self.save(item)?;
                self.path.pop();
                self.e.batch_item_end(i, len, false);
            }
            return Ok(());
        }
        if let Ok(dict) = obj.cast_exact::<PyDict>() {
            self.e.op(op::EMPTY_DICT);
            self.memoize(address);
            let items: Vec<_> = dict.iter().collect();
            let len = items.len();
            for (i, (key, value)) in items.iter().enumerate() {
                self.e.batch_item_begin(i, len);
                self.path.push(Step::Key(key.clone().unbind()));
                self.save(key)?;
                self.save(value)?;
                self.path.pop();
                self.e.batch_item_end(i, len, true);
            }
            return Ok(());
        }
        if let Ok(tuple) = obj.cast_exact::<PyTuple>() {
            let len = tuple.len();
            self.e.tuple_begin(len);
            for (i, item) in tuple.iter().enumerate() {
                self.path.push(Step::Index(i));
                self.save(&item)?;
                self.path.pop();
            }
            if let Some(index) = self.e.tuple_end(len) {
                self.memo.insert(address, index);
            }
            return Ok(());
        }
        Err(PyTypeError::new_err(format!(
            "memsnap.dump: cannot write a {} at {}: a snapshot pickle holds only dict, list, tuple, str, bytes, int, float, bool and None",
            obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into()),
            self.where_(obj.py())
        )))
    }

    fn where_(&self, py: Python<'_>) -> String {
        if self.path.is_empty() {
            return "the top level".to_owned();
        }
        let mut out = "obj".to_owned();
        for step in &self.path {
            match step {
                Step::Index(i) => out.push_str(&format!("[{i}]")),
                Step::Key(key) => {
                    let shown = key.bind(py).repr().map(|r| r.to_string());
                    out.push_str(&format!("[{}]", shown.unwrap_or_else(|_| "?".into())));
                }
            }
        }
        out
    }

    fn save_int(&mut self, int: &Bound<'_, PyInt>) -> PyResult<()> {
        if let Ok(value) = int.extract::<i64>() {
            self.e.int(value);
            return Ok(());
        }
        // Beyond 64 bits: Python's own arithmetic gives the bytes (one more than the bits
        // need, so the sign fits), and the emitter writes the shortest of them.
        let bits: usize = int.call_method0("bit_length")?.extract()?;
        let signed = pyo3::types::PyDict::new(int.py());
        signed.set_item("signed", true)?;
        let bytes = int.call_method("to_bytes", (bits / 8 + 1, "little"), Some(&signed))?;
        self.e.long_shortest(bytes.cast::<PyBytes>()?.as_bytes());
        Ok(())
    }

    fn memoize(&mut self, address: usize) {
        let index = self.e.memoize();
        self.memo.insert(address, index);
    }
}
