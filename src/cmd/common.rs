//! Helpers shared by the subcommands: loading with a progress bar, human sizes.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use memsnap_converters::{ConvertError, Source};
use memsnap_format::io::Progress;
use memsnap_format::{Compression, Format, Snapshot};

/// Reads a snapshot file (`-` is stdin), showing a progress bar on stderr when decoding takes
/// over a second. Any input `memsnap import` reads opens here too (by content, through
/// `memsnap-converters`). A pickle file is decoded as it is read, never held in memory whole.
pub fn load(path: &Path) -> Result<(Snapshot, Source)> {
    if path.as_os_str() == "-" {
        return decode(&read_input(path)?, path);
    }
    with_progress(path, |progress| {
        memsnap_converters::open_path_with(path, progress)
    })
}

/// Decodes the bytes of `path` (named in errors and on the progress bar), with a progress bar
/// on stderr when decoding takes over a second.
pub fn decode(bytes: &[u8], path: &Path) -> Result<(Snapshot, Source)> {
    with_progress(path, |progress| {
        memsnap_converters::import_bytes_with(bytes, path, progress)
            .map(|import| (import.snapshot, import.source))
    })
}

/// Runs a decoder with a progress bar that appears when it takes over a second.
pub fn with_progress<T>(
    path: &Path,
    decoder: impl FnOnce(Progress<'_>) -> memsnap_converters::Result<T>,
) -> Result<T> {
    let started = Instant::now();
    let mut bar: Option<ProgressBar> = None;
    let mut progress = |done: u64, total: u64| {
        if bar.is_none() && started.elapsed() > Duration::from_secs(1) {
            let b = ProgressBar::new(total).with_style(
                ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")
                    .expect("static template")
                    .progress_chars("=> "),
            );
            b.set_message(format!("reading {}", path.display()));
            bar = Some(b);
        }
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
        true
    };
    let result = decoder(&mut progress);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    match result {
        Ok(value) => Ok(value),
        Err(ConvertError::Format(memsnap_format::FormatError::Io { source, .. }))
        | Err(ConvertError::Io { source, .. }) => {
            Err(anyhow::Error::new(source).context(format!("cannot read {}", path.display())))
        }
        // These name the file already.
        Err(e @ ConvertError::Trace { .. }) => Err(anyhow::Error::new(e)),
        Err(e) => Err(anyhow::Error::new(e).context(format!("cannot decode {}", path.display()))),
    }
}

/// The bytes of a file, or of stdin for `-`.
pub fn read_input(path: &Path) -> Result<Vec<u8>> {
    if path.as_os_str() == "-" {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes)
            .context("cannot read stdin")?;
        return Ok(bytes);
    }
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// `pickle`, `msgpack, gzip`, `json, zstd`.
pub fn describe_encoding(format: Format, compression: Compression) -> String {
    match compression {
        Compression::None => format.name().to_string(),
        Compression::Gzip => format!("{}, gzip", format.name()),
        Compression::Zstd => format!("{}, zstd", format.name()),
    }
}

/// Parses a byte size: `1234`, `512KiB`, `1.5GiB`, `2GB` (powers of 1000), `3g` (= GiB).
pub fn parse_size(text: &str) -> Result<u64, String> {
    memsnap_units::parse_size(text).map_err(|e| e.to_string())
}

pub use memsnap_units::format_size;

/// Parses `--at`, the same in every command (see [`memsnap_analysis::instant`]).
pub fn parse_instant(text: &str) -> Result<memsnap_analysis::Instant, String> {
    text.parse()
        .map_err(|e: memsnap_analysis::InstantParseError| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5GiB"), Ok(1610612736));
        assert_eq!(parse_size("2 MiB"), Ok(2 << 20));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("3g"), Ok(3 << 30));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
    }
}
