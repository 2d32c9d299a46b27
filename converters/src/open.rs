//! Opening any supported input by its content.

use std::path::Path;

use memsnap_format::io::{Detected, Progress};
use memsnap_format::Snapshot;

use crate::Result;

/// Where an opened snapshot came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// One of memsnap's own encodings (a PyTorch pickle, msgpack or JSON snapshot).
    Snapshot(Detected),
    /// An AMD ROCm allocation trace ([`crate::rocm`]), all its processes in one snapshot.
    Rocm(crate::rocm::RocmFormat),
}

impl Source {
    /// A short human name: `pickle, gzip`, `torch.profiler trace`, ...
    pub fn describe(&self) -> String {
        match self {
            Source::Snapshot(d) => match d.compression {
                memsnap_format::Compression::None => d.format.name().to_string(),
                memsnap_format::Compression::Gzip => format!("{}, gzip", d.format.name()),
                memsnap_format::Compression::Zstd => format!("{}, zstd", d.format.name()),
            },
            Source::Rocm(f) => f.name().to_string(),
        }
    }
}

/// A snapshot and where it came from.
pub type Opened = (Snapshot, Source);

/// Opens a file of any supported kind, told apart by its content.
pub fn open_path(path: &Path) -> Result<Opened> {
    open_path_with(path, &mut |_, _| true)
}

/// [`open_path`] with a progress callback (see [`memsnap_format::io::Progress`]).
pub fn open_path_with(path: &Path, progress: Progress<'_>) -> Result<Opened> {
    // A file that cannot be read is reported by memsnap's own reader, as before.
    if let Ok(Some(format)) = crate::rocm::sniff_path(path) {
        let import = crate::rocm::import_paths(&[path])?;
        return Ok((import.into_single(), Source::Rocm(format)));
    }
    let (snapshot, detected) = memsnap_format::io::read_path_with(path, progress)?;
    Ok((snapshot, Source::Snapshot(detected)))
}

/// Decodes bytes of any supported kind, told apart by their content.
pub fn open_bytes_with(bytes: &[u8], progress: Progress<'_>) -> Result<Opened> {
    if let Some(format) = crate::rocm::sniff(bytes) {
        let import = crate::rocm::import_bytes(bytes, Path::new("<input>"))?;
        return Ok((import.into_single(), Source::Rocm(format)));
    }
    let (snapshot, detected) = memsnap_format::io::read_bytes_with(bytes, progress)?;
    Ok((snapshot, Source::Snapshot(detected)))
}
