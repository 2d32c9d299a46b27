//! Opening any supported input by its content (never by its name).
//!
//! | content | read as |
//! |---|---|
//! | gzip | inflated, then detected again |
//! | JSON object with `traceEvents`, or an array of events with `ph` | a Chrome trace: memsnap's own export (`otherData.memsnap`) or torch.profiler's `[memory]` events ([`crate::torch`]) |
//! | JSON array of 4-number arrays | `export_memory_timeline` raw events |
//! | JSON `[times[], sizes[][]]` | `export_memory_timeline` plot data |
//! | HTML titled `GPU Memory Timeline HTML` | refused: a picture, no data |
//! | anything else | memsnap's own readers: pickle, msgpack, JSON snapshot (gzip/zstd) |

use std::io::Read;
use std::path::Path;

use memsnap_format::io::{Detected, Progress};
use memsnap_format::{Compression, Format, Snapshot};

use crate::sniff::{json_shape, JsonShape};
use crate::torch::{ImportReport, Imported, TraceError};
use crate::{ConvertError, Result};

/// Where an opened snapshot came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// One of memsnap's own encodings (a PyTorch pickle, msgpack or JSON snapshot).
    Snapshot(Detected),
    /// memsnap's own Chrome trace export (`memsnap export --to chrome`), read back exactly.
    MemsnapChrome(Compression),
    /// A torch.profiler Chrome trace with `[memory]` events.
    TorchProfiler(Compression),
    /// `export_memory_timeline`'s raw events (`*.raw.json.gz`).
    MemoryTimelineRaw(Compression),
    /// `export_memory_timeline`'s plot data (`[times, sizes]`).
    MemoryTimelinePlot(Compression),
    /// An AMD ROCm allocation trace ([`crate::rocm`]), all its processes in one snapshot.
    Rocm(crate::rocm::RocmFormat),
}

fn with_compression(name: &str, c: Compression) -> String {
    match c {
        Compression::None => name.to_string(),
        Compression::Gzip => format!("{name}, gzip"),
        Compression::Zstd => format!("{name}, zstd"),
    }
}

impl Source {
    /// A short human name: `pickle, gzip`, `torch.profiler trace`, ...
    pub fn describe(&self) -> String {
        match *self {
            Source::Snapshot(d) => with_compression(d.format.name(), d.compression),
            Source::MemsnapChrome(c) => with_compression("memsnap Chrome trace", c),
            Source::TorchProfiler(c) => with_compression("torch.profiler trace", c),
            Source::MemoryTimelineRaw(c) => with_compression("memory timeline raw events", c),
            Source::MemoryTimelinePlot(c) => with_compression("memory timeline plot data", c),
            Source::Rocm(f) => f.name().to_string(),
        }
    }

    /// Whether the input was another tool's format (converted, possibly with losses).
    pub fn is_import(&self) -> bool {
        !matches!(self, Source::Snapshot(_))
    }
}

/// A snapshot and where it came from.
pub type Opened = (Snapshot, Source);

/// A snapshot, where it came from, and for an import what the import found.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Import {
    pub snapshot: Snapshot,
    pub source: Source,
    /// `None` for memsnap's own formats.
    pub report: Option<ImportReport>,
}

/// Opens a file of any supported kind, told apart by its content.
pub fn open_path(path: &Path) -> Result<Opened> {
    open_path_with(path, &mut |_, _| true)
}

/// [`open_path`] with a progress callback (see [`memsnap_format::io::Progress`]).
pub fn open_path_with(path: &Path, progress: Progress<'_>) -> Result<Opened> {
    let import = import_path_with(path, progress)?;
    Ok((import.snapshot, import.source))
}

/// Decodes bytes of any supported kind, told apart by their content.
pub fn open_bytes_with(bytes: &[u8], progress: Progress<'_>) -> Result<Opened> {
    let import = import_bytes_with(bytes, Path::new("<input>"), progress)?;
    Ok((import.snapshot, import.source))
}

/// [`open_path_with`], with the import's report.
pub fn import_path_with(path: &Path, progress: Progress<'_>) -> Result<Import> {
    if !is_regular_file(path) {
        // A pipe (`<(zcat run.pickle.gz)`) or a device can be read only once: telling its
        // format apart would eat the bytes the reader needs, so it is read whole first.
        let bytes = std::fs::read(path).map_err(io_err(path))?;
        return import_bytes_with(&bytes, path, progress);
    }
    let sniffed = crate::rocm::sniff_path(path).map_err(|e| match e {
        // A file that cannot be read is an I/O error whatever it holds.
        crate::rocm::RocmError::Io { path, source } => ConvertError::Io { path, source },
        other => other.into(),
    })?;
    if sniffed.is_some() {
        return Ok(crate::rocm::import_paths(&[path])?.into_open_import());
    }
    match detect_path(path)? {
        Detection::Own => {
            let (snapshot, detected) = memsnap_format::io::read_path_with(path, progress)?;
            Ok(Import {
                snapshot,
                source: Source::Snapshot(detected),
                report: None,
            })
        }
        Detection::Text { bytes, compression } => {
            let len = bytes.len() as u64;
            let import = import_text(&bytes, compression, path)?;
            progress(len, len);
            Ok(import)
        }
    }
}

/// [`open_bytes_with`], with the import's report; `path` names the input in errors.
pub fn import_bytes_with(bytes: &[u8], path: &Path, progress: Progress<'_>) -> Result<Import> {
    if crate::rocm::sniff(bytes).is_some() {
        return Ok(crate::rocm::import_bytes(bytes, path)?.into_open_import());
    }
    let compression = Compression::detect(bytes);
    let inflated;
    let raw = if compression == Compression::Gzip {
        inflated = inflate(bytes, path)?;
        &inflated[..]
    } else {
        bytes
    };
    if is_text(raw) {
        let import = import_text(raw, compression, path)?;
        progress(bytes.len() as u64, bytes.len() as u64);
        return Ok(import);
    }
    let (snapshot, detected) = memsnap_format::io::read_bytes_with(bytes, progress)?;
    Ok(Import {
        snapshot,
        source: Source::Snapshot(detected),
        report: None,
    })
}

/// Whether `path` is a regular file (or cannot be examined: opening it will say why), as
/// opposed to a pipe or a device, which can be read only once.
pub fn is_regular_file(path: &Path) -> bool {
    std::fs::metadata(path).map_or(true, |m| m.is_file())
}

/// Whether `path` is a pickle or msgpack snapshot (compressed or not): one that
/// [`memsnap_format::io::read_path_observing`] reads as it goes. Everything else (JSON, the
/// imported formats) is read whole; a viewer shows a growing preview only for these.
pub fn is_own_binary(path: &Path) -> Result<bool> {
    let head = head_of(path, 64)?;
    let inner = match Compression::detect(&head) {
        Compression::Gzip => inflated_head(path, 64)?,
        Compression::Zstd => return Ok(true),
        Compression::None => head,
    };
    Ok(matches!(
        Format::detect(&inner),
        Some(Format::Pickle | Format::Msgpack)
    ))
}

/// What the first bytes say.
enum Detection {
    /// memsnap's own readers (streamed from the file).
    Own,
    /// JSON or HTML, read whole (inflated): the shape decides.
    Text {
        bytes: Vec<u8>,
        compression: Compression,
    },
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> ConvertError + '_ {
    move |source| ConvertError::Io {
        path: path.to_owned(),
        source,
    }
}

fn head_of(path: &Path, n: u64) -> Result<Vec<u8>> {
    let mut head = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(n).read_to_end(&mut head))
        .map_err(io_err(path))?;
    Ok(head)
}

/// The first `n` inflated bytes of a gzip file (fewer if it is damaged: the full read says
/// where).
fn inflated_head(path: &Path, n: u64) -> Result<Vec<u8>> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let mut head = Vec::new();
    let _ = flate2::read::MultiGzDecoder::new(file)
        .take(n)
        .read_to_end(&mut head);
    Ok(head)
}

fn inflate(bytes: &[u8], path: &Path) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .take(memsnap_format::io::MAX_DECOMPRESSED_BYTES)
        .read_to_end(&mut out)
        .map_err(|e| ConvertError::Io {
            path: path.to_owned(),
            source: std::io::Error::new(e.kind(), format!("cannot inflate (gzip): {e}")),
        })?;
    Ok(out)
}

/// JSON or HTML: the formats read whole and told apart by shape.
fn is_text(bytes: &[u8]) -> bool {
    let start = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    matches!(
        start.iter().find(|b| !b.is_ascii_whitespace()),
        Some(b'{' | b'[' | b'<')
    )
}

fn detect_path(path: &Path) -> Result<Detection> {
    let head = head_of(path, 64)?;
    let compression = Compression::detect(&head);
    let inner = match compression {
        Compression::Gzip => inflated_head(path, 64)?,
        _ => head,
    };
    if compression == Compression::Zstd || !is_text(&inner) {
        return Ok(Detection::Own);
    }
    let raw = std::fs::read(path).map_err(io_err(path))?;
    let bytes = match compression {
        Compression::Gzip => inflate(&raw, path)?,
        _ => raw,
    };
    Ok(Detection::Text { bytes, compression })
}

/// Dispatches JSON and HTML by shape.
fn import_text(bytes: &[u8], compression: Compression, path: &Path) -> Result<Import> {
    let trace_err = |source: TraceError| ConvertError::Trace {
        path: path.to_owned(),
        source,
    };
    let start = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    if start.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'<') {
        let head = &start[..start.len().min(8192)];
        if contains(head, b"GPU Memory Timeline HTML") {
            return Err(trace_err(TraceError::HtmlTimeline));
        }
        return Err(trace_err(TraceError::Json {
            what: "an HTML or XML document, not a snapshot or trace".into(),
            line: 1,
            column: 1,
        }));
    }
    let imported = |result: std::result::Result<Imported, TraceError>, source: Source| {
        let Imported { snapshot, report } = result.map_err(trace_err)?;
        Ok(Import {
            snapshot,
            source,
            report: Some(report),
        })
    };
    match json_shape(start) {
        shape @ JsonShape::Object(_) if shape.has_key("traceEvents") => {
            chrome(start, compression, path)
        }
        JsonShape::ArrayOfObjects(keys) if keys.iter().any(|k| k == "ph") => {
            chrome(start, compression, path)
        }
        JsonShape::ArrayOfNumberArrays { len: 4 } => imported(
            crate::torch::import_memory_timeline_raw(start),
            Source::MemoryTimelineRaw(compression),
        ),
        JsonShape::TimesAndSizes => imported(
            crate::torch::import_memory_timeline_plot(start),
            Source::MemoryTimelinePlot(compression),
        ),
        // memsnap's JSON snapshot (a dict or a segment list), or nothing we know: its
        // reader says what is wrong.
        _ => {
            let snapshot = memsnap_format::json::read(start)?;
            Ok(Import {
                snapshot,
                source: Source::Snapshot(Detected {
                    format: Format::Json,
                    compression,
                }),
                report: None,
            })
        }
    }
}

fn chrome(bytes: &[u8], compression: Compression, path: &Path) -> Result<Import> {
    let Imported { snapshot, report } =
        crate::torch::import_chrome_trace(bytes).map_err(|source| ConvertError::Trace {
            path: path.to_owned(),
            source,
        })?;
    let source = if report.format.starts_with("memsnap") {
        Source::MemsnapChrome(compression)
    } else {
        Source::TorchProfiler(compression)
    };
    Ok(Import {
        snapshot,
        source,
        report: Some(report),
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
