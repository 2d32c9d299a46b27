//! Helpers shared by the subcommands: loading with a progress bar, human sizes.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use memsnap_converters::{ConvertError, Failure, Import, OpenOptions, Source};
use memsnap_format::{Compression, Format, Snapshot};

/// Reads a snapshot file (`-` is stdin), showing a progress bar on stderr when decoding takes
/// over a second. Any input `memsnap import` reads opens here too (by content, through
/// `memsnap-converters`). A pickle file is decoded as it is read, never held in memory whole.
pub fn load(path: &Path) -> Result<(Snapshot, Source)> {
    let import = open(path, OpenOptions::new())?;
    Ok((import.snapshot, import.source))
}

/// Opens `path` (`-` is stdin) through `options`, the one way memsnap opens an input, with a
/// progress bar on stderr when it takes over a second. A failure names the file once.
pub fn open(path: &Path, options: OpenOptions<'_>) -> Result<Import> {
    let bar = ProgressBar::hidden().with_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(format!("reading {}", path.display()));
    let started = Instant::now();
    let shown = bar.clone();
    let options = options.progress(move |done, total| {
        if shown.is_hidden() && started.elapsed() > Duration::from_secs(1) {
            shown.set_draw_target(ProgressDrawTarget::stderr());
        }
        shown.set_length(total);
        shown.set_position(done);
        true
    });
    let opened = if path.as_os_str() == "-" {
        options.open_bytes(&read_input(path)?, path)
    } else {
        options.open(path)
    };
    bar.finish_and_clear();
    opened.map_err(|e| open_error(path, e))
}

/// How the command line tells of an input that did not open: the converters decide which
/// kind of failure it is ([`ConvertError::failure`]), this words it with the file's name once.
pub fn open_error(path: &Path, error: ConvertError) -> anyhow::Error {
    match error.failure() {
        Failure::Read { source, .. } => {
            anyhow::anyhow!("cannot read {}: {source}", path.display())
        }
        // These name the file already.
        Failure::Import => anyhow::Error::new(error),
        _ => anyhow::Error::new(error).context(format!("cannot decode {}", path.display())),
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
