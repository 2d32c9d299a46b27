//! Opening any supported input by its content (never by its name), the one way in:
//! [`OpenOptions`] (progress, preview, part, validation) for the command line, the viewer
//! and library callers alike.
//!
//! | content | read as |
//! |---|---|
//! | a ROCm trace: rocpd SQLite, rocprofv3 CSV or JSON | [`crate::rocm`], its processes side by side |
//! | gzip | inflated, then detected again |
//! | JSON object with `traceEvents`, or an array of events with `ph` | a Chrome trace: memsnap's own export (`otherData.memsnap`) or torch.profiler's `[memory]` events ([`crate::torch`]) |
//! | JSON array of 4-number arrays | `export_memory_timeline` raw events |
//! | JSON `[times[], sizes[][]]` | `export_memory_timeline` plot data |
//! | HTML titled `GPU Memory Timeline HTML` | refused: a picture, no data |
//! | anything else | memsnap's own readers: pickle, msgpack, JSON snapshot (gzip/zstd) |

use std::io::Read;
use std::path::Path;

use memsnap_format::io::{Detected, Progress};
use memsnap_format::pickle::{self, Part};
use memsnap_format::{Action, Compression, Format, Snapshot, TraceEntry};

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

/// Opens a file of any supported kind, told apart by its content: [`OpenOptions::open`]
/// with nothing to report and everything read.
pub fn open_path(path: &Path) -> Result<Opened> {
    let import = OpenOptions::new().open(path)?;
    Ok((import.snapshot, import.source))
}

/// How to open an input, and the one way in: the command line, the viewer and every library
/// caller open files through [`OpenOptions::open`] (or [`OpenOptions::open_bytes`]), so the
/// regular-file check, the detection by content and the fallback to memsnap's own readers
/// happen in one place.
///
/// What a caller may ask for:
/// - **progress**: `(bytes done, bytes total)` about every MiB while a pickle is decoded (the
///   file's bytes, compressed ones for a compressed file); inputs read whole report once, at
///   the end. Returning `false` stops the read with [`memsnap_format::FormatError::Cancelled`].
/// - **preview**: the trace entries read so far, at each progress tick, while a pickle
///   (compressed or not) is decoded, so a viewer can draw a big file as it loads. Other inputs
///   are read whole and show nothing.
/// - **part**: [`Part::Segments`] reads an uncompressed pickle in PyTorch's layout only up to
///   the end of its segments (see [`memsnap_format::pickle::read_part`]): what the segment
///   reports need, without the trace. Any other input is read whole. No preview is shown then.
/// - **validate**: check the snapshot's invariants as `memsnap validate` does and refuse it
///   with [`ConvertError::Invalid`] when any is broken.
///
/// ```no_run
/// use std::path::Path;
/// use memsnap_converters::OpenOptions;
///
/// let import = OpenOptions::new()
///     .progress(|done, total| {
///         eprintln!("{done}/{total} bytes");
///         true
///     })
///     .open(Path::new("run.pickle.gz"))?;
/// println!("{}: {} trace entries", import.source.describe(), import.snapshot.entry_count());
/// # Ok::<(), memsnap_converters::ConvertError>(())
/// ```
pub struct OpenOptions<'a> {
    progress: Box<dyn FnMut(u64, u64) -> bool + 'a>,
    preview: Option<PreviewCallback<'a>>,
    part: Part,
    validate: bool,
}

/// What [`OpenOptions::preview`] keeps: it owns the callback, so that an `OpenOptions` can be
/// built in one place and handed on (the command line adds its progress bar to options its
/// commands made).
type PreviewCallback<'a> = Box<dyn FnMut(&[TraceEntry]) + 'a>;

impl std::fmt::Debug for OpenOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenOptions")
            .field("preview", &self.preview.is_some())
            .field("part", &self.part)
            .field("validate", &self.validate)
            .finish()
    }
}

impl Default for OpenOptions<'_> {
    fn default() -> Self {
        OpenOptions {
            progress: Box::new(|_, _| true),
            preview: None,
            part: Part::Whole,
            validate: false,
        }
    }
}

impl<'a> OpenOptions<'a> {
    /// Everything read, nothing reported, nothing checked beyond decoding.
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls `progress(bytes_done, bytes_total)` while reading; `false` cancels.
    pub fn progress(mut self, progress: impl FnMut(u64, u64) -> bool + 'a) -> Self {
        self.progress = Box::new(progress);
        self
    }

    /// Shows `preview` the trace entries read so far while a pickle is decoded.
    pub fn preview(mut self, preview: impl FnMut(&[TraceEntry]) + 'a) -> Self {
        self.preview = Some(Box::new(preview));
        self
    }

    /// Reads only `part` of an uncompressed pickle ([`Part::Segments`]: the segments).
    pub fn part(mut self, part: Part) -> Self {
        self.part = part;
        self
    }

    /// Refuses a snapshot that breaks the invariants `memsnap validate` checks.
    pub fn validate(mut self, validate: bool) -> Self {
        self.validate = validate;
        self
    }

    /// Opens a file of any supported kind, told apart by its content (never by its name).
    pub fn open(mut self, path: &Path) -> Result<Import> {
        if !is_regular_file(path) {
            // A pipe (`<(zcat run.pickle.gz)`) or a device can be read only once: telling its
            // format apart would eat the bytes the reader needs, so it is read whole first.
            let bytes = std::fs::read(path).map_err(io_err(path))?;
            return self.open_bytes(&bytes, path);
        }
        let sniffed = crate::rocm::sniff_path(path).map_err(|e| match e {
            // A file that cannot be read is an I/O error whatever it holds.
            crate::rocm::RocmError::Io { path, source } => ConvertError::Io { path, source },
            other => other.into(),
        })?;
        let import = if sniffed.is_some() {
            from_rocm(crate::rocm::import_paths(&[path])?)
        } else {
            let head = head_of(path, HEAD_BYTES)?;
            let compression = Compression::detect(&head);
            let inner = match compression {
                Compression::Gzip => {
                    inflated_head(std::fs::File::open(path).map_err(io_err(path))?)
                }
                _ => head,
            };
            match self.reader_for(&inner, compression) {
                Reader::Text => {
                    let raw = std::fs::read(path).map_err(io_err(path))?;
                    self.open_text(&raw, compression, path)?
                }
                Reader::PickleSegments => {
                    let file = std::fs::File::open(path).map_err(io_err(path))?;
                    let len = file.metadata().map_err(io_err(path))?.len();
                    let snapshot =
                        pickle::read_part_from(file, len, self.part, self.progress.as_mut())?;
                    own((snapshot, PLAIN_PICKLE))
                }
                Reader::Own => {
                    let (progress, preview) = self.callbacks();
                    own(memsnap_format::io::read_path_with(path, progress, preview)?)
                }
            }
        };
        self.report_done(std::fs::metadata(path).map_or(0, |m| m.len()));
        self.checked(import)
    }

    /// Decodes bytes of any supported kind, told apart by their content, as [`Self::open`]
    /// opens a file; `name` names the input in errors.
    pub fn open_bytes(mut self, bytes: &[u8], name: &Path) -> Result<Import> {
        let import = if crate::rocm::sniff(bytes).is_some() {
            from_rocm(crate::rocm::import_bytes(bytes, name)?)
        } else {
            let compression = Compression::detect(bytes);
            let inner = match compression {
                Compression::Gzip => inflated_head(bytes),
                _ => bytes[..bytes.len().min(HEAD_BYTES as usize)].to_vec(),
            };
            match self.reader_for(&inner, compression) {
                Reader::Text => self.open_text(bytes, compression, name)?,
                Reader::PickleSegments => {
                    let snapshot = pickle::read_part(bytes, self.part, self.progress.as_mut())?;
                    own((snapshot, PLAIN_PICKLE))
                }
                Reader::Own => {
                    let (progress, preview) = self.callbacks();
                    own(memsnap_format::io::read_bytes_with(
                        bytes, progress, preview,
                    )?)
                }
            }
        };
        self.report_done(bytes.len() as u64);
        self.checked(import)
    }

    /// Which reader opens an input that is no ROCm trace, from its first bytes (`head`,
    /// inflated when the input is gzip) and what was asked for: decided here for files and
    /// bytes alike.
    fn reader_for(&self, head: &[u8], compression: Compression) -> Reader {
        if compression != Compression::Zstd && is_text(head) {
            Reader::Text
        } else if self.part == Part::Segments
            && compression == Compression::None
            && Format::detect(head) == Some(Format::Pickle)
        {
            Reader::PickleSegments
        } else {
            Reader::Own
        }
    }

    /// JSON or HTML (`raw` as stored, gzip or not): read whole, told apart by shape.
    fn open_text(&mut self, raw: &[u8], compression: Compression, path: &Path) -> Result<Import> {
        let inflated;
        let text = match compression {
            Compression::Gzip => {
                inflated = inflate(raw, path)?;
                &inflated[..]
            }
            _ => raw,
        };
        import_text(text, compression, path)
    }

    /// Both callbacks, for the readers that take both.
    fn callbacks(&mut self) -> (Progress<'_>, Option<pickle::Observe<'_>>) {
        // The cast shortens the boxed preview's lifetime to this borrow's, a coercion that
        // `Option` would otherwise hide.
        let preview = self
            .preview
            .as_mut()
            .map(|preview| preview.as_mut() as pickle::Observe<'_>);
        (self.progress.as_mut(), preview)
    }

    /// Says the input is read to its end: inputs read whole report nothing while they are
    /// read, and a pickle's last tick may come before its end.
    fn report_done(&mut self, len: u64) {
        (self.progress)(len, len);
    }

    fn checked(self, import: Import) -> Result<Import> {
        if self.validate {
            let problems = memsnap_format::validate(&import.snapshot);
            if !problems.is_empty() {
                let problems = problems.iter().map(ToString::to_string).collect();
                return Err(ConvertError::Invalid { problems });
            }
        }
        Ok(import)
    }
}

/// How many bytes (inflated, for gzip) tell the input's kind apart.
const HEAD_BYTES: u64 = 64;

/// What [`Reader::PickleSegments`] reads.
const PLAIN_PICKLE: Detected = Detected {
    format: Format::Pickle,
    compression: Compression::None,
};

/// A snapshot read by memsnap's own readers, as an [`Import`] (with nothing to report).
fn own((snapshot, detected): (Snapshot, Detected)) -> Import {
    Import {
        snapshot,
        source: Source::Snapshot(detected),
        report: None,
    }
}

/// The reader [`OpenOptions::reader_for`] picks.
enum Reader {
    /// JSON or HTML, read whole and told apart by shape ([`import_text`]).
    Text,
    /// An uncompressed pickle of which only the segments are asked for.
    PickleSegments,
    /// memsnap's own readers: pickle (streamed), msgpack, JSON snapshot; gzip or zstd.
    Own,
}

/// Whether `path` is a regular file (or cannot be examined: opening it will say why), as
/// opposed to a pipe or a device, which can be read only once.
fn is_regular_file(path: &Path) -> bool {
    std::fs::metadata(path).map_or(true, |m| m.is_file())
}

/// A ROCm import as one snapshot ([`crate::rocm::Import::into_single`]), its warnings and
/// its devices' counts in the report.
fn from_rocm(import: crate::rocm::Import) -> Import {
    let format = import.format;
    let warnings = import.warnings.iter().map(ToString::to_string).collect();
    let snapshot = import.into_single();
    let devices = snapshot
        .traces()
        .iter()
        .enumerate()
        .filter(|(_, trace)| !trace.is_empty())
        .map(|(device, trace)| crate::torch::DeviceReport {
            device: device as i64,
            entries: trace.len(),
            allocs: trace.iter().filter(|e| e.action == Action::Alloc).count() as u64,
            frees: trace
                .iter()
                .filter(|e| e.action == Action::FreeCompleted)
                .count() as u64,
            ..Default::default()
        })
        .collect();
    Import {
        snapshot,
        source: Source::Rocm(format),
        report: Some(ImportReport {
            format: format.name().to_string(),
            rank: None,
            devices,
            warnings,
        }),
    }
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

/// The first inflated bytes of a gzip stream, enough to tell its content apart (fewer if it
/// is damaged: the full read says where).
fn inflated_head(gzip: impl Read) -> Vec<u8> {
    let mut head = Vec::new();
    let _ = flate2::read::MultiGzDecoder::new(gzip)
        .take(HEAD_BYTES)
        .read_to_end(&mut head);
    head
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
