//! Reading and writing snapshot files: format detection, decompression, atomic writes.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::error::{FormatError, Result};
use crate::model::Snapshot;
pub use crate::progress::Progress;

/// Decompressed input larger than this is refused (a compression bomb must not take the
/// machine's memory).
pub const MAX_DECOMPRESSED_BYTES: u64 = 16 << 30;

/// A snapshot encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// Python pickle, as `torch.cuda.memory._dump_snapshot()` writes it.
    Pickle,
    /// memsnap's compact msgpack encoding with interned frames and stacks.
    Msgpack,
    /// JSON with the pickle's schema (PyTorch's browser viewer loads it too).
    Json,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Pickle => "pickle",
            Format::Msgpack => "msgpack",
            Format::Json => "json",
        }
    }

    /// The format a file name asks for (`.pickle`, `.pkl`, `.msgpack`, `.mpk`, `.json`), looking
    /// through a `.gz` or `.zst` suffix.
    pub fn from_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let name = name
            .strip_suffix(".gz")
            .or_else(|| name.strip_suffix(".zst"))
            .unwrap_or(&name);
        let ext = name.rsplit_once('.')?.1;
        match ext {
            "pickle" | "pkl" | "pck" => Some(Format::Pickle),
            "msgpack" | "mpk" | "memsnap" => Some(Format::Msgpack),
            "json" => Some(Format::Json),
            _ => None,
        }
    }

    /// Recognises the encoding from the first bytes of (decompressed) content.
    pub fn detect(bytes: &[u8]) -> Option<Format> {
        match bytes {
            [0x80, 2..=5, ..] => Some(Format::Pickle),
            _ if crate::msgpack::looks_like(bytes) => Some(Format::Msgpack),
            _ => match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
                Some(b'{') | Some(b'[') => Some(Format::Json),
                _ => None,
            },
        }
    }
}

/// A compression wrapper around the encoded snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    pub fn detect(bytes: &[u8]) -> Compression {
        match bytes {
            [0x1f, 0x8b, ..] => Compression::Gzip,
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Zstd,
            _ => Compression::None,
        }
    }

    pub fn from_path(path: &Path) -> Compression {
        match path.extension().and_then(|e| e.to_str()) {
            Some("gz") => Compression::Gzip,
            Some("zst") => Compression::Zstd,
            _ => Compression::None,
        }
    }
}

/// What [`read_bytes`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Detected {
    pub format: Format,
    pub compression: Compression,
}

/// Decodes a snapshot of any supported format and compression.
pub fn read_bytes(bytes: &[u8]) -> Result<(Snapshot, Detected)> {
    read_bytes_with(bytes, &mut |_, _| true, None)
}

/// [`read_bytes`] with a progress callback, also showing `observe` (when given) the trace
/// entries of a pickle as they are read (see [`crate::pickle::Observe`]); other formats are
/// read whole first and show nothing. Opening any input, other tools' formats included, with
/// these callbacks is `memsnap_converters::OpenOptions`.
pub fn read_bytes_with(
    bytes: &[u8],
    progress: Progress<'_>,
    observe: Option<crate::pickle::Observe<'_>>,
) -> Result<(Snapshot, Detected)> {
    let compression = Compression::detect(bytes);
    let decompressed;
    let raw = match compression {
        Compression::None => bytes,
        _ => {
            decompressed = decompress(bytes, compression)?;
            &decompressed[..]
        }
    };
    let format = Format::detect(raw).ok_or_else(|| FormatError::UnknownFormat {
        what: describe_start(raw),
    })?;
    let snapshot = match format {
        Format::Pickle => {
            crate::pickle::read_part_observing(raw, crate::pickle::Part::Whole, progress, observe)?
        }
        Format::Msgpack => crate::msgpack::read(raw)?,
        Format::Json => crate::json::read(raw)?,
    };
    Ok((
        snapshot,
        Detected {
            format,
            compression,
        },
    ))
}

/// Reads and decodes a snapshot file.
pub fn read_path(path: &Path) -> Result<(Snapshot, Detected)> {
    read_path_with(path, &mut |_, _| true, None)
}

/// [`read_path`] with a progress callback, also showing `observe` (when given) the trace
/// entries of a pickle as they are read (see [`crate::pickle::Observe`]). A pickle,
/// compressed (gzip, zstd) or not, is decoded as it is read (and inflated), through a small
/// buffer, so neither the file nor its inflated bytes are ever held in memory whole; msgpack
/// and JSON are read into memory first. Progress counts the file's bytes (compressed bytes for
/// a compressed file). Opening any input, other tools' formats included, with these callbacks
/// is `memsnap_converters::OpenOptions`.
pub fn read_path_with(
    path: &Path,
    progress: Progress<'_>,
    observe: Option<crate::pickle::Observe<'_>>,
) -> Result<(Snapshot, Detected)> {
    let io_err = |source| FormatError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io_err)?;
    let metadata = file.metadata().map_err(io_err)?;
    // A pipe or device has no length to check declared lengths against: read it whole.
    let len = metadata.is_file().then_some(metadata.len());
    // Enough to tell the compression and the encoding apart.
    let mut head = Vec::with_capacity(64);
    (&mut file)
        .take(64)
        .read_to_end(&mut head)
        .map_err(io_err)?;
    let compression = Compression::detect(&head);
    let Some(len) = len else {
        let mut bytes = head;
        file.read_to_end(&mut bytes).map_err(io_err)?;
        return read_bytes_with(&bytes, progress, observe);
    };
    let raw = std::io::Cursor::new(head).chain(file);
    if compression == Compression::None {
        if Format::detect(raw.get_ref().0.get_ref()) != Some(Format::Pickle) {
            return read_whole(raw, progress, path, false);
        }
        let snapshot = crate::pickle::read_ahead_observing(raw, len, progress, observe).map_err(
            |e| match e {
                FormatError::Read { source, .. } => io_err(source),
                other => other,
            },
        )?;
        return Ok((
            snapshot,
            Detected {
                format: Format::Pickle,
                compression,
            },
        ));
    }
    // Compressed: count the compressed bytes for progress, inflate as the reader asks.
    // Atomic: the inflating runs on the read-ahead thread, the progress on this one.
    let consumed = std::sync::atomic::AtomicU64::new(0);
    let counted = Counted {
        inner: raw,
        count: &consumed,
    };
    let (codec, mut inflated): (&'static str, Box<dyn Read + Send + '_>) = match compression {
        Compression::Gzip => ("gzip", Box::new(flate2::read::MultiGzDecoder::new(counted))),
        _ => (
            "zstd",
            Box::new(zstd::stream::read::Decoder::new(counted).map_err(|e| {
                FormatError::Decompress {
                    codec: "zstd",
                    what: e.to_string(),
                }
            })?),
        ),
    };
    let mut inner_head = Vec::with_capacity(64);
    (&mut inflated)
        .take(64)
        .read_to_end(&mut inner_head)
        .map_err(|e| decompress_err(codec, e))?;
    let format = Format::detect(&inner_head).ok_or_else(|| FormatError::UnknownFormat {
        what: describe_start(&inner_head),
    })?;
    let inflated = std::io::Cursor::new(inner_head)
        .chain(inflated)
        .take(MAX_DECOMPRESSED_BYTES);
    if format != Format::Pickle {
        let (snapshot, detected) = read_whole(inflated, progress, path, true)?;
        return Ok((
            snapshot,
            Detected {
                compression,
                ..detected
            },
        ));
    }
    // The inflated length is unknown: declared lengths are bounded by the decompression
    // limit, and payloads are copied as they arrive, so a lying length cannot allocate more
    // than the input holds.
    let mut by_file_bytes = |_: u64, _: u64| progress(consumed.load(Ordering::Relaxed), len);
    // Inflated on the read-ahead thread, beside the decoding.
    let snapshot = crate::pickle::read_ahead_observing(
        inflated,
        MAX_DECOMPRESSED_BYTES,
        &mut by_file_bytes,
        observe,
    )
    .map_err(|e| match e {
        FormatError::Read { source, offset } => FormatError::Decompress {
            codec,
            what: format!("{source} (at inflated byte {offset})"),
        },
        other => other,
    })?;
    Ok((
        snapshot,
        Detected {
            format: Format::Pickle,
            compression,
        },
    ))
}

/// Reads a whole stream into memory and decodes it; an inflated one (limited to
/// [`MAX_DECOMPRESSED_BYTES`]) is refused when it reaches the limit.
fn read_whole(
    mut reader: impl Read,
    progress: Progress<'_>,
    path: &Path,
    inflated: bool,
) -> Result<(Snapshot, Detected)> {
    let mut bytes = Vec::new();
    reader
        .read_to_end(&mut bytes)
        .map_err(|source| FormatError::Io {
            path: path.to_owned(),
            source,
        })?;
    if inflated && bytes.len() as u64 >= MAX_DECOMPRESSED_BYTES {
        return Err(FormatError::Decompress {
            codec: "gzip or zstd",
            what: format!("output exceeds {MAX_DECOMPRESSED_BYTES} bytes"),
        });
    }
    read_bytes_with(&bytes, progress, None)
}

fn decompress_err(codec: &'static str, e: std::io::Error) -> FormatError {
    FormatError::Decompress {
        codec,
        what: e.to_string(),
    }
}

/// A reader that counts the bytes read through it.
struct Counted<'a, R> {
    inner: R,
    count: &'a std::sync::atomic::AtomicU64,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Encodes a snapshot.
pub fn encode(snapshot: &Snapshot, format: Format) -> Result<Vec<u8>> {
    Ok(match format {
        Format::Pickle => crate::pickle::to_vec(snapshot),
        Format::Msgpack => crate::msgpack::to_vec(snapshot)?,
        Format::Json => crate::json::to_vec(snapshot)?,
    })
}

/// Writes a snapshot atomically (a temporary file in the same folder, then a rename). The
/// format comes from `format`, else from the file name, else pickle; a `.gz` or `.zst` suffix
/// compresses.
pub fn write_path(path: &Path, snapshot: &Snapshot, format: Option<Format>) -> Result<Format> {
    let format = format
        .or_else(|| Format::from_path(path))
        .unwrap_or(Format::Pickle);
    let mut bytes = encode(snapshot, format)?;
    bytes = compress(bytes, Compression::from_path(path))?;
    write_atomic(path, &bytes)?;
    Ok(format)
}

/// Writes bytes to `path` through a temporary file and a rename, so a crash never leaves a
/// half-written file under the final name.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io_err = |path: &Path| {
        let path = path.to_owned();
        move |source| FormatError::Io { path, source }
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("snapshot");
    let tmp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(bytes).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io_err(path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `bytes` in a gzip (default level) or zstd (level 3) wrapper, or as they are: the one
/// compression of output (the writers here and the Python extension use it).
pub fn compress(bytes: Vec<u8>, compression: Compression) -> Result<Vec<u8>> {
    let fail = |codec: &'static str| {
        move |e: std::io::Error| FormatError::Decompress {
            codec,
            what: e.to_string(),
        }
    };
    match compression {
        Compression::None => Ok(bytes),
        Compression::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(&bytes).map_err(fail("gzip"))?;
            enc.finish().map_err(fail("gzip"))
        }
        Compression::Zstd => zstd::encode_all(&bytes[..], 3).map_err(fail("zstd")),
    }
}

/// The bytes inside a gzip or zstd wrapper ([`Compression::detect`]), or the bytes
/// themselves when there is none; more than [`MAX_DECOMPRESSED_BYTES`] is refused. The one
/// inflation of in-memory input (the readers here and the Python extension use it).
pub fn decompressed(bytes: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>> {
    match Compression::detect(bytes) {
        Compression::None => Ok(std::borrow::Cow::Borrowed(bytes)),
        compression => decompress(bytes, compression).map(std::borrow::Cow::Owned),
    }
}

fn decompress(bytes: &[u8], compression: Compression) -> Result<Vec<u8>> {
    let (codec, reader): (&'static str, Box<dyn Read + '_>) = match compression {
        Compression::None => return Ok(bytes.to_vec()),
        Compression::Gzip => ("gzip", Box::new(flate2::read::MultiGzDecoder::new(bytes))),
        Compression::Zstd => (
            "zstd",
            Box::new(zstd::stream::read::Decoder::new(bytes).map_err(|e| {
                FormatError::Decompress {
                    codec: "zstd",
                    what: e.to_string(),
                }
            })?),
        ),
    };
    let mut out = Vec::new();
    let n = reader
        .take(MAX_DECOMPRESSED_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| FormatError::Decompress {
            codec,
            what: e.to_string(),
        })?;
    if n as u64 > MAX_DECOMPRESSED_BYTES {
        return Err(FormatError::Decompress {
            codec,
            what: format!("output exceeds {MAX_DECOMPRESSED_BYTES} bytes"),
        });
    }
    Ok(out)
}

fn describe_start(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "the file is empty".into();
    }
    let head: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!(
        "starts with bytes {} (expected a pickle, msgpack or JSON snapshot, optionally gzip or zstd compressed)",
        head.join(" ")
    )
}
