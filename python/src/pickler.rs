//! Writes Python data (dicts, lists, tuples, strings, bytes, ints, floats, bools, `None`) as a
//! protocol-4 pickle, the way CPython's pickler spells it: every string and container memoized
//! and written once, a shared object written again as a memo reference (`BINGET`), so
//! `pickle.load` of the result gives back equal objects with the same sharing. Anything else
//! (class instances, functions, NumPy arrays) is refused: a snapshot pickle holds only data.
//!
//! The framing follows CPython's C pickler too (a frame is closed at the start of the first
//! `save` once it holds 64 KiB; payloads of 64 KiB or more go between frames), so
//! `dumps(pickle.load(f))` gives back the bytes of a file CPython wrote.

use std::collections::HashMap;

use pyo3::exceptions::{PyRecursionError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple,
};

/// Items per `APPENDS`/`SETITEMS` batch (CPython's).
const BATCH: usize = 1000;
/// Deeper nesting than this is refused (a snapshot is about six levels deep).
const MAX_DEPTH: usize = 1000;
/// A frame is closed at the first opcode boundary once it holds this many bytes.
const FRAME_TARGET: usize = 64 * 1024;
const FRAME_HEADER: usize = 9;

pub fn dumps(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let mut pickler = Pickler {
        out: Vec::with_capacity(1 << 16),
        memo: HashMap::new(),
        path: Vec::new(),
        frame_start: 0,
    };
    pickler.out.extend_from_slice(&[0x80, 4]);
    pickler.start_frame();
    pickler.save(obj)?;
    pickler.out.push(b'.');
    pickler.commit_frame();
    Ok(pickler.out)
}

/// One step down from the root: a list or tuple index, or a dict key.
enum Step {
    Index(usize),
    Key(Py<PyAny>),
}

struct Pickler {
    out: Vec<u8>,
    /// Object address -> memo index. The objects stay alive: the root holds them.
    memo: HashMap<usize, u32>,
    /// Where we are (`['device_traces'][0][12]`), for error messages.
    path: Vec<Step>,
    /// Offset of the open frame's header.
    frame_start: usize,
}

impl Pickler {
    fn start_frame(&mut self) {
        self.frame_start = self.out.len();
        self.out.extend_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    /// Writes the open frame's length, or drops its header when it holds under 4 bytes
    /// (as CPython does).
    fn commit_frame(&mut self) {
        let body = self.out.len() - self.frame_start - FRAME_HEADER;
        if body >= 4 {
            let len = (body as u64).to_le_bytes();
            self.out[self.frame_start + 1..self.frame_start + FRAME_HEADER].copy_from_slice(&len);
        } else {
            self.out
                .drain(self.frame_start..self.frame_start + FRAME_HEADER);
        }
    }

    fn save(&mut self, obj: &Bound<'_, PyAny>) -> PyResult<()> {
        // An opcode boundary, as CPython checks it at the start of every `save`: start a new
        // frame once the open one is full.
        if self.out.len() - self.frame_start - FRAME_HEADER >= FRAME_TARGET {
            self.commit_frame();
            self.start_frame();
        }
        self.save_object(obj)
    }

    fn save_object(&mut self, obj: &Bound<'_, PyAny>) -> PyResult<()> {
        if obj.is_none() {
            self.out.push(b'N');
            return Ok(());
        }
        if let Ok(b) = obj.cast_exact::<PyBool>() {
            self.out.push(if b.is_true() { 0x88 } else { 0x89 });
            return Ok(());
        }
        if let Ok(int) = obj.cast_exact::<PyInt>() {
            return self.save_int(int);
        }
        if let Ok(float) = obj.cast_exact::<PyFloat>() {
            self.out.push(b'G');
            self.out.extend_from_slice(&float.value().to_be_bytes());
            return Ok(());
        }
        let address = obj.as_ptr() as usize;
        if let Some(&index) = self.memo.get(&address) {
            self.get(index);
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
            self.sized(bytes, 0x8c, b'X', 0x8d);
            self.memoize(address);
            return Ok(());
        }
        if let Ok(b) = obj.cast_exact::<PyBytes>() {
            self.sized(b.as_bytes(), b'C', b'B', 0x8e);
            self.memoize(address);
            return Ok(());
        }
        if let Ok(b) = obj.cast_exact::<PyByteArray>() {
            let bytes = b.to_vec();
            self.out.push(0x96);
            self.out
                .extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            self.out.extend_from_slice(&bytes);
            self.memoize(address);
            return Ok(());
        }
        if self.path.len() >= MAX_DEPTH {
            return Err(PyRecursionError::new_err(format!(
                "memsnap.dump: nesting deeper than {MAX_DEPTH} levels at {}",
                self.where_(obj.py())
            )));
        }
        if let Ok(list) = obj.cast_exact::<PyList>() {
            self.out.push(b']');
            self.memoize(address);
            let items: Vec<_> = list.iter().collect();
            for (batch_index, batch) in items.chunks(BATCH).enumerate() {
                if items.len() > 1 {
                    self.out.push(b'(');
                }
                for (i, item) in batch.iter().enumerate() {
                    self.path.push(Step::Index(batch_index * BATCH + i));
                    self.save(item)?;
                    self.path.pop();
                }
                // CPython: one item is `APPEND`; more go in `MARK ... APPENDS` batches, a final
                // batch of one included.
                self.out.push(if items.len() > 1 { b'e' } else { b'a' });
            }
            return Ok(());
        }
        if let Ok(dict) = obj.cast_exact::<PyDict>() {
            self.out.push(b'}');
            self.memoize(address);
            let items: Vec<_> = dict.iter().collect();
            for batch in items.chunks(BATCH) {
                if items.len() > 1 {
                    self.out.push(b'(');
                }
                for (key, value) in batch {
                    self.path.push(Step::Key(key.clone().unbind()));
                    self.save(key)?;
                    self.save(value)?;
                    self.path.pop();
                }
                self.out.push(if items.len() > 1 { b'u' } else { b's' });
            }
            return Ok(());
        }
        if let Ok(tuple) = obj.cast_exact::<PyTuple>() {
            let len = tuple.len();
            if len == 0 {
                self.out.push(b')');
                return Ok(());
            }
            if len > 3 {
                self.out.push(b'(');
            }
            for (i, item) in tuple.iter().enumerate() {
                self.path.push(Step::Index(i));
                self.save(&item)?;
                self.path.pop();
            }
            self.out.push(match len {
                1 => 0x85,
                2 => 0x86,
                3 => 0x87,
                _ => b't',
            });
            self.memoize(address);
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
            if (0..=0xff).contains(&value) {
                self.out.extend_from_slice(&[b'K', value as u8]);
            } else if (0..=0xffff).contains(&value) {
                self.out.push(b'M');
                self.out.extend_from_slice(&(value as u16).to_le_bytes());
            } else if let Ok(v) = i32::try_from(value) {
                self.out.push(b'J');
                self.out.extend_from_slice(&v.to_le_bytes());
            } else {
                // The shortest two's complement that keeps the sign (CPython's encode_long).
                let raw = value.to_le_bytes();
                let mut n = 8;
                while n > 1 {
                    let top = raw[n - 1];
                    let below_sign = raw[n - 2] & 0x80;
                    if (top == 0 && below_sign == 0) || (top == 0xff && below_sign != 0) {
                        n -= 1;
                    } else {
                        break;
                    }
                }
                self.out.extend_from_slice(&[0x8a, n as u8]);
                self.out.extend_from_slice(&raw[..n]);
            }
            return Ok(());
        }
        // Beyond 64 bits: Python's own arithmetic gives the bytes.
        let bits: usize = int.call_method0("bit_length")?.extract()?;
        let mut nbytes = bits / 8 + 1;
        let signed = pyo3::types::PyDict::new(int.py());
        signed.set_item("signed", true)?;
        let bytes_obj = int.call_method("to_bytes", (nbytes, "little"), Some(&signed))?;
        let mut bytes = bytes_obj.cast::<PyBytes>()?.as_bytes().to_vec();
        let negative = int.lt(0)?;
        if negative && nbytes > 1 && bytes[nbytes - 1] == 0xff && bytes[nbytes - 2] & 0x80 != 0 {
            bytes.pop();
            nbytes -= 1;
        }
        if nbytes < 256 {
            self.out.extend_from_slice(&[0x8a, nbytes as u8]);
        } else {
            self.out.push(0x8b);
            self.out.extend_from_slice(&(nbytes as u32).to_le_bytes());
        }
        self.out.extend_from_slice(&bytes);
        Ok(())
    }

    /// A string or bytes opcode with a 1-, 4- or 8-byte length; large payloads go between
    /// frames (CPython's rule).
    fn sized(&mut self, bytes: &[u8], short: u8, long: u8, huge: u8) {
        let n = bytes.len();
        if n >= FRAME_TARGET {
            self.commit_frame();
            self.sized_unframed(bytes, short, long, huge);
            self.start_frame();
        } else {
            self.sized_unframed(bytes, short, long, huge);
        }
    }

    fn sized_unframed(&mut self, bytes: &[u8], short: u8, long: u8, huge: u8) {
        let n = bytes.len();
        if n < 256 {
            self.out.extend_from_slice(&[short, n as u8]);
        } else if let Ok(n) = u32::try_from(n) {
            self.out.push(long);
            self.out.extend_from_slice(&n.to_le_bytes());
        } else {
            self.out.push(huge);
            self.out.extend_from_slice(&(n as u64).to_le_bytes());
        }
        self.out.extend_from_slice(bytes);
    }

    fn memoize(&mut self, address: usize) {
        let index = self.memo.len() as u32;
        self.memo.insert(address, index);
        self.out.push(0x94);
    }

    fn get(&mut self, index: u32) {
        if let Ok(small) = u8::try_from(index) {
            self.out.extend_from_slice(&[b'h', small]);
        } else {
            self.out.push(b'j');
            self.out.extend_from_slice(&index.to_le_bytes());
        }
    }
}
