//! # memsnap (Python extension)
//!
//! The Rust half of the `memsnap` Python package (`memsnap._memsnap`; the Python half is
//! `python/memsnap/`). It reads PyTorch memory snapshots without executing anything:
//!
//! * `unpickle`: a builder for memsnap-format's pickle machine (the opcode loop, stack, memo
//!   and refusals the snapshot reader runs) that makes the same Python objects `pickle.load`
//!   builds (with the same sharing); the machine refuses every opcode that could run code;
//!   msgpack and JSON snapshots
//!   go through memsnap-format's reader and its pickle writer first, so every format gives the
//!   objects `pickle.load` gives for the PyTorch pickle of the same snapshot;
//! * `pickler`: the reverse, for `memsnap.dump`, through memsnap-format's emitter;
//! * `snapshot`: `memsnap.open`, a typed view over memsnap-format's `Snapshot` model whose
//!   trace columns are packed arrays.
//!
//! File reading, decompression and the format crate's decoding run with the GIL released.

use std::path::{Path, PathBuf};

use memsnap_format::{Compression, Format};
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

mod pickler;
mod snapshot;
mod unpickle;

create_exception!(
    _memsnap,
    FormatError,
    PyValueError,
    "The input is not a snapshot memsnap can read, or it is corrupt or hostile (the message names the file and the byte offset)."
);

fn format_error(name: &str, what: impl std::fmt::Display) -> PyErr {
    FormatError::new_err(format!("{name}: {what}"))
}

/// The bytes inside a gzip or zstd wrapper (the bytes themselves when there is none).
fn decompressed<'a>(bytes: &'a [u8], name: &str) -> PyResult<std::borrow::Cow<'a, [u8]>> {
    memsnap_format::io::decompressed(bytes).map_err(|e| format_error(name, e))
}

/// The pickle to run for `bytes`: the bytes themselves (decompressed) for a pickle, else the
/// PyTorch pickle of the msgpack or JSON snapshot.
fn as_pickle<'a>(bytes: &'a [u8], name: &str) -> PyResult<std::borrow::Cow<'a, [u8]>> {
    let plain = decompressed(bytes, name)?;
    match Format::detect(&plain) {
        Some(Format::Msgpack) | Some(Format::Json) => {
            let (snapshot, _) =
                memsnap_format::read_bytes(&plain).map_err(|e| format_error(name, e))?;
            Ok(std::borrow::Cow::Owned(memsnap_format::pickle::to_vec(
                &snapshot,
            )))
        }
        _ => Ok(plain),
    }
}

/// An I/O error as the matching Python exception (`FileNotFoundError`, ...), naming the file.
pub(crate) fn io_error(path: &Path, e: std::io::Error) -> PyErr {
    let message = format!("{}: {e}", path.display());
    match e.kind() {
        std::io::ErrorKind::NotFound => pyo3::exceptions::PyFileNotFoundError::new_err(message),
        std::io::ErrorKind::PermissionDenied => {
            pyo3::exceptions::PyPermissionError::new_err(message)
        }
        _ => pyo3::exceptions::PyOSError::new_err(message),
    }
}

fn run_pickle<'py>(py: Python<'py>, pickle: &[u8], name: &str) -> PyResult<Bound<'py, PyAny>> {
    if pickle.is_empty() {
        return Err(format_error(name, "the input is empty"));
    }
    unpickle::load(py, pickle).map_err(|e| format_error(name, e))
}

/// `memsnap.load` on bytes: `name` is used in error messages.
#[pyfunction]
fn load_bytes<'py>(py: Python<'py>, data: &[u8], name: &str) -> PyResult<Bound<'py, PyAny>> {
    let pickle = py.detach(|| as_pickle(data, name))?;
    run_pickle(py, &pickle, name)
}

/// `memsnap.load` on a file. A plain pickle (PyTorch's snapshots) is run as it is read, a
/// window of a few hundred KiB at a time, as `pickle.load` reads it: the file's bytes are
/// never all in memory (153 MB for 1M entries), and no time goes to copying them in and
/// faulting their pages first. Anything else (compressed, msgpack, JSON) is read whole and
/// converted first.
#[pyfunction]
fn load_path(py: Python<'_>, path: PathBuf) -> PyResult<Bound<'_, PyAny>> {
    use std::io::Read;
    let name = path.display().to_string();
    let (mut file, len, plain_pickle) = py.detach(|| open_for_load(&path))?;
    if plain_pickle {
        return unpickle::load_from(py, file, len).map_err(|e| load_error(&path, &name, e));
    }
    let owned = py.detach(|| -> PyResult<Vec<u8>> {
        // Read from the file already open (`read_to_end` sizes the buffer from its length,
        // fallibly: a sparse file claiming a terabyte is an error, not an abort).
        let mut data = Vec::new();
        file.read_to_end(&mut data)
            .map_err(|e| io_error(&path, e))?;
        // Bytes that are neither compressed, msgpack nor JSON are run as read (not copied):
        // the machine says what is wrong with them (a protocol 0/1 pickle, garbage).
        let converted = match as_pickle(&data, &name)? {
            std::borrow::Cow::Borrowed(_) => None,
            std::borrow::Cow::Owned(pickle) => Some(pickle),
        };
        Ok(converted.unwrap_or(data))
    })?;
    run_pickle(py, &owned, &name)
}

/// The file at `path`, positioned at its start, its length, and whether it begins as a
/// pickle of protocol 2 to 5 does (not: compressed, msgpack, JSON, empty).
fn open_for_load(path: &Path) -> PyResult<(std::fs::File, u64, bool)> {
    use std::io::{Read, Seek};
    let mut file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let len = file.metadata().map_err(|e| io_error(path, e))?.len();
    let mut head = [0u8; 2];
    let plain_pickle = match file.read_exact(&mut head) {
        Ok(()) => Format::detect(&head) == Some(Format::Pickle),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => false,
        Err(e) => return Err(io_error(path, e)),
    };
    file.rewind().map_err(|e| io_error(path, e))?;
    Ok((file, len, plain_pickle))
}

/// A load's error: a read that failed part-way as the `OSError` it is, the rest as
/// [`FormatError`] naming the file.
fn load_error(path: &Path, name: &str, e: unpickle::LoadError) -> PyErr {
    match e {
        unpickle::LoadError::Other(memsnap_format::FormatError::Read { source, .. }) => {
            io_error(path, source)
        }
        other => format_error(name, other),
    }
}

/// `pickle.dumps(obj, protocol=4)` for data-only objects, refusing anything else.
#[pyfunction]
fn dumps<'py>(py: Python<'py>, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let bytes = pickler::dumps(obj)?;
    Ok(PyBytes::new(py, &bytes))
}

/// `memsnap.dump`: the pickle (compressed by a `.gz`/`.zst` suffix), or the msgpack/JSON of
/// the snapshot when the name asks for one.
#[pyfunction]
fn dump(py: Python<'_>, obj: &Bound<'_, PyAny>, path: PathBuf) -> PyResult<()> {
    let pickle = pickler::dumps(obj)?;
    let name = path.display().to_string();
    py.detach(|| -> PyResult<()> {
        match Format::from_path(&path) {
            Some(format @ (Format::Msgpack | Format::Json)) => {
                let snapshot = memsnap_format::pickle::read(&pickle).map_err(|e| {
                    format_error(
                        &name,
                        format!(
                            "the object is not a snapshot memsnap can write as {}: {e}",
                            format.name()
                        ),
                    )
                })?;
                memsnap_format::write_path(&path, &snapshot, Some(format))
                    .map_err(|e| format_error(&name, e))?;
            }
            _ => {
                let bytes = compress(pickle, Compression::from_path(&path), &name)?;
                memsnap_format::io::write_atomic(&path, &bytes)
                    .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))?;
            }
        }
        Ok(())
    })
}

fn compress(bytes: Vec<u8>, compression: Compression, name: &str) -> PyResult<Vec<u8>> {
    memsnap_format::io::compress(bytes, compression).map_err(|e| format_error(name, e))
}

#[pymodule]
fn _memsnap(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FormatError", m.py().get_type::<FormatError>())?;
    m.add_function(wrap_pyfunction!(load_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(load_path, m)?)?;
    m.add_function(wrap_pyfunction!(dumps, m)?)?;
    m.add_function(wrap_pyfunction!(dump, m)?)?;
    snapshot::register(m)?;
    Ok(())
}
