//! `memsnap.open`: a typed, lazy view over memsnap-format's [`Snapshot`] model.
//!
//! Opening an uncompressed pickle in PyTorch's layout (`segments` first) reads only the bytes
//! up to the end of the segments ([`pickle::read_part_from`]); a background thread decodes the
//! whole file meanwhile, and the first query that needs the trace waits for it (with the GIL
//! released). Other files are decoded whole before `open` returns. Columns are handed to
//! Python as little-endian `bytes` that the Python side wraps as NumPy arrays (or
//! `array.array`) without copying.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use memsnap_format::pickle::{self, Part};
use memsnap_format::{Snapshot, StackId};
use pyo3::exceptions::{PyIndexError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::format_error;

type Decoded = Result<Arc<Snapshot>, String>;

enum Whole {
    Decoding(JoinHandle<Decoded>),
    Done(Decoded),
    /// A thread panicked or the handle was lost; never expected.
    Lost,
}

/// The Rust side of `memsnap.Snapshot`.
#[pyclass(frozen, module = "memsnap._memsnap")]
pub struct RawSnapshot {
    path: String,
    /// The segments (and, when the file was read whole, everything).
    part: Arc<Snapshot>,
    whole: Mutex<Whole>,
}

/// Lengths of the 2-byte pickle header that marks an uncompressed pickle.
fn is_plain_pickle(head: &[u8]) -> bool {
    matches!(head, [0x80, 2..=5, ..])
}

impl RawSnapshot {
    fn open_detached(path: PathBuf) -> PyResult<RawSnapshot> {
        let name = path.display().to_string();
        let file = std::fs::File::open(&path).map_err(|e| crate::io_error(&path, e))?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut head = [0u8; 2];
        let plain = {
            use std::io::Read;
            let mut peek = &file;
            let n = peek.read(&mut head).unwrap_or(0);
            is_plain_pickle(&head[..n])
        };
        if plain {
            use std::io::Seek;
            let mut reader = std::io::BufReader::new(file);
            reader
                .seek(std::io::SeekFrom::Start(0))
                .map_err(|e| crate::io_error(&path, e))?;
            let part = pickle::read_part_from(reader, len, Part::Segments, &mut |_, _| true)
                .map_err(|e| format_error(&name, e))?;
            if part.device_traces.is_some() {
                // Read whole already (not PyTorch's layout, or nothing after the segments).
                let part = Arc::new(part);
                return Ok(RawSnapshot {
                    path: name,
                    whole: Mutex::new(Whole::Done(Ok(part.clone()))),
                    part,
                });
            }
            let thread_path = path.clone();
            let handle = std::thread::Builder::new()
                .name("memsnap-open".into())
                .spawn(move || {
                    memsnap_format::read_path(&thread_path)
                        .map(|(snapshot, _)| Arc::new(snapshot))
                        .map_err(|e| format!("{}: {e}", thread_path.display()))
                })
                .map_err(|e| {
                    PyRuntimeError::new_err(format!("{name}: cannot start a thread: {e}"))
                })?;
            return Ok(RawSnapshot {
                path: name,
                part: Arc::new(part),
                whole: Mutex::new(Whole::Decoding(handle)),
            });
        }
        let (snapshot, _) = memsnap_format::read_path(&path).map_err(|e| format_error(&name, e))?;
        let snapshot = Arc::new(snapshot);
        Ok(RawSnapshot {
            path: name,
            whole: Mutex::new(Whole::Done(Ok(snapshot.clone()))),
            part: snapshot,
        })
    }

    /// The whole snapshot, waiting for the background decoding with the GIL released.
    fn whole(&self, py: Python<'_>) -> PyResult<Arc<Snapshot>> {
        let result = py.detach(|| {
            let mut state = match self.whole.lock() {
                Ok(state) => state,
                Err(poisoned) => poisoned.into_inner(),
            };
            if let Whole::Decoding(_) = &*state {
                let Whole::Decoding(handle) = std::mem::replace(&mut *state, Whole::Lost) else {
                    return Err("lost the decoding thread".to_owned());
                };
                *state = match handle.join() {
                    Ok(decoded) => Whole::Done(decoded),
                    Err(_) => {
                        Whole::Done(Err(format!("{}: the decoding thread panicked", self.path)))
                    }
                };
            }
            match &*state {
                Whole::Done(decoded) => decoded.clone(),
                _ => Err(format!("{}: lost the decoding thread", self.path)),
            }
        });
        result.map_err(crate::FormatError::new_err)
    }
}

/// A column of u64/i64 as little-endian bytes.
fn column<'py, T: Copy>(
    py: Python<'py>,
    values: impl ExactSizeIterator<Item = T>,
    to_bytes: impl Fn(T) -> [u8; 8],
) -> Bound<'py, PyBytes> {
    let mut out = Vec::with_capacity(values.len() * 8);
    for v in values {
        out.extend_from_slice(&to_bytes(v));
    }
    PyBytes::new(py, &out)
}

fn stack_index(stack: Option<StackId>) -> i64 {
    stack.map_or(-1, |s| s.index() as i64)
}

/// Names in first-seen order, and each item's index in them.
///
/// O(n) in the items: one hash lookup each. (A search of the names seen was O(n × names),
/// and a file can give every entry an action of its own.)
fn codes<'a>(names: impl Iterator<Item = &'a str>) -> (Vec<&'a str>, Vec<u32>) {
    let mut seen: Vec<&str> = Vec::new();
    let mut index: HashMap<&str, u32> = HashMap::new();
    let codes = names
        .map(|name| {
            *index.entry(name).or_insert_with(|| {
                seen.push(name);
                (seen.len() - 1) as u32
            })
        })
        .collect();
    (seen, codes)
}

fn code_bytes<'py>(py: Python<'py>, codes: &[u32]) -> Bound<'py, PyBytes> {
    let mut out = Vec::with_capacity(codes.len() * 4);
    for c in codes {
        out.extend_from_slice(&c.to_le_bytes());
    }
    PyBytes::new(py, &out)
}

#[pymethods]
impl RawSnapshot {
    #[staticmethod]
    fn open(py: Python<'_>, path: PathBuf) -> PyResult<RawSnapshot> {
        py.detach(|| Self::open_detached(path))
    }

    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// Whether the whole file is decoded (the trace is ready).
    fn is_decoded(&self) -> bool {
        match self.whole.lock() {
            Ok(state) => match &*state {
                Whole::Decoding(handle) => handle.is_finished(),
                _ => true,
            },
            Err(_) => true,
        }
    }

    /// Waits for the background decoding; raises its error.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        self.whole(py).map(|_| ())
    }

    fn devices(&self, py: Python<'_>) -> PyResult<Vec<i64>> {
        Ok(self.whole(py)?.devices())
    }

    fn trace_count(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.whole(py)?.traces().len())
    }

    fn has_traces(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.whole(py)?.device_traces.is_some())
    }

    fn stack_count(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.whole(py)?.stacks.len())
    }

    /// Segment columns: `device`, `address`, `total_size`, `allocated_size`, `active_size`,
    /// `requested_size`, `stream`, `block_count`, `stack` (-1: none) as bytes; `segment_type`
    /// as a list of names ("" when absent).
    fn segment_columns<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = &self.part;
        let d = PyDict::new(py);
        let seg = &s.segments;
        let i64le = |v: i64| v.to_le_bytes();
        let u64le = |v: u64| v.to_le_bytes();
        d.set_item("device", column(py, seg.iter().map(|x| x.device), i64le))?;
        d.set_item("address", column(py, seg.iter().map(|x| x.address), u64le))?;
        d.set_item(
            "total_size",
            column(py, seg.iter().map(|x| x.total_size), u64le),
        )?;
        d.set_item(
            "allocated_size",
            column(py, seg.iter().map(|x| x.allocated_size.unwrap_or(0)), u64le),
        )?;
        d.set_item(
            "active_size",
            column(py, seg.iter().map(|x| x.active_size.unwrap_or(0)), u64le),
        )?;
        d.set_item(
            "requested_size",
            column(py, seg.iter().map(|x| x.requested_size.unwrap_or(0)), u64le),
        )?;
        d.set_item("stream", column(py, seg.iter().map(|x| x.stream), i64le))?;
        d.set_item(
            "block_count",
            column(py, seg.iter().map(|x| x.blocks.len() as i64), i64le),
        )?;
        d.set_item(
            "stack",
            column(py, seg.iter().map(|x| stack_index(x.frames)), i64le),
        )?;
        let types: Vec<&str> = seg
            .iter()
            .map(|x| x.segment_type.as_ref().map_or("", |t| t.name(&s.strings)))
            .collect();
        d.set_item("segment_type", PyList::new(py, types)?)?;
        Ok(d)
    }

    /// Block columns over all segments in order: `segment` (its index), `address`, `size`,
    /// `requested_size`, `stack` as bytes; `state` codes (u32 bytes) and `state_names`.
    fn block_columns<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = &self.part;
        let blocks: Vec<(usize, u64, &memsnap_format::Block)> = s
            .segments
            .iter()
            .enumerate()
            .flat_map(|(i, seg)| {
                let mut next = seg.address;
                seg.blocks.iter().map(move |b| {
                    // Legacy files have no block addresses: blocks tile the segment in order.
                    let address = b.address.unwrap_or(next);
                    next = address.wrapping_add(b.size);
                    (i, address, b)
                })
            })
            .collect();
        let d = PyDict::new(py);
        let i64le = |v: i64| v.to_le_bytes();
        let u64le = |v: u64| v.to_le_bytes();
        d.set_item(
            "segment",
            column(py, blocks.iter().map(|b| b.0 as i64), i64le),
        )?;
        d.set_item("address", column(py, blocks.iter().map(|b| b.1), u64le))?;
        d.set_item("size", column(py, blocks.iter().map(|b| b.2.size), u64le))?;
        d.set_item(
            "requested_size",
            column(
                py,
                blocks
                    .iter()
                    .map(|b| b.2.requested_size.unwrap_or(b.2.size)),
                u64le,
            ),
        )?;
        d.set_item(
            "stack",
            column(py, blocks.iter().map(|b| stack_index(b.2.frames)), i64le),
        )?;
        let (names, codes) = codes(blocks.iter().map(|b| b.2.state.name(&s.strings)));
        d.set_item("state", code_bytes(py, &codes))?;
        d.set_item("state_names", PyList::new(py, names)?)?;
        Ok(d)
    }

    /// Trace columns of trace `index` (the `device_traces` list index): `addr`, `size`,
    /// `stream`, `time_us` (-1: absent), `stack` (-1: none) as bytes; `action` codes (u32
    /// bytes) and `action_names`.
    fn trace_columns<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Bound<'py, PyDict>> {
        let s = self.whole(py)?;
        let trace = s.traces().get(index).ok_or_else(|| {
            PyIndexError::new_err(format!(
                "{}: trace {index} does not exist (the file has {} device traces)",
                self.path,
                s.traces().len()
            ))
        })?;
        let (columns, names, codes) = py.detach(|| {
            let col = |f: &dyn Fn(&memsnap_format::TraceEntry) -> [u8; 8]| {
                let mut out = Vec::with_capacity(trace.len() * 8);
                for e in trace {
                    out.extend_from_slice(&f(e));
                }
                out
            };
            let columns = [
                ("addr", col(&|e| e.addr.to_le_bytes())),
                ("size", col(&|e| e.size.to_le_bytes())),
                ("stream", col(&|e| e.stream.to_le_bytes())),
                ("time_us", col(&|e| e.time_us().unwrap_or(-1).to_le_bytes())),
                ("stack", col(&|e| stack_index(e.frames).to_le_bytes())),
            ];
            let (names, codes) = codes(trace.iter().map(|e| e.action_name(&s.strings)));
            let names: Vec<String> = names.into_iter().map(str::to_owned).collect();
            (columns, names, codes)
        });
        let d = PyDict::new(py);
        for (name, bytes) in columns {
            d.set_item(name, PyBytes::new(py, &bytes))?;
        }
        d.set_item("action", code_bytes(py, &codes))?;
        d.set_item("action_names", PyList::new(py, names)?)?;
        Ok(d)
    }

    /// The frames of stack `id`, innermost first, as `(filename, line, name)` tuples. Stack
    /// ids of the segment and block columns are looked up with `segments=True` (they come from
    /// the segments-only read, whose stack table is numbered on its own).
    #[pyo3(signature = (id, segments = false))]
    fn stack<'py>(&self, py: Python<'py>, id: i64, segments: bool) -> PyResult<Bound<'py, PyList>> {
        let s = if segments {
            self.part.clone()
        } else {
            self.whole(py)?
        };
        let index = u32::try_from(id)
            .ok()
            .filter(|&i| (i as usize) < s.stacks.len())
            .ok_or_else(|| {
                PyIndexError::new_err(format!(
                    "{}: stack {id} does not exist (the snapshot has {} stacks)",
                    self.path,
                    s.stacks.len()
                ))
            })?;
        let list = PyList::empty(py);
        for frame in s.stack_frames(StackId::from_index(index as usize)) {
            let line: Bound<'py, PyAny> = match frame.line.as_i64() {
                Some(v) => v.into_pyobject(py)?.into_any(),
                None => py
                    .get_type::<pyo3::types::PyInt>()
                    .call1((frame.line.to_decimal(),))?,
            };
            list.append((frame.filename.as_str(), line, frame.name.as_str()))?;
        }
        Ok(list)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RawSnapshot>()?;
    Ok(())
}
