//! `memsnap convert`: rewrite a snapshot in another format or compression.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use memsnap_converters::Source;
use memsnap_format::{Compression, Format, Snapshot};

use super::common;

/// Convert a snapshot between pickle, msgpack and JSON (optionally gzip or zstd).
///
/// The input format is detected from the content. The output format comes from `--to`, else
/// from the output file name (`.pickle`/`.pkl`, `.msgpack`/`.mpk`, `.json`); a `.gz` or `.zst`
/// suffix compresses. Nothing is lost: keys memsnap does not know are carried through. The
/// output is written atomically (a temporary file, then a rename).
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  memsnap convert snapshot.pickle -o snapshot.json          for PyTorch's browser viewer too
  memsnap convert snapshot.pickle -o snapshot.msgpack.zst   compact, fast to load
  memsnap convert run.json -o run.pickle                    back to what _memory_viz.py reads
  memsnap convert in.pickle -o out.bin --to msgpack         format from the flag")]
pub struct Args {
    /// Snapshot to read (`-` reads stdin).
    input: PathBuf,
    /// File to write.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Output format (default: from the output file name).
    #[arg(long, value_enum, value_name = "FORMAT")]
    to: Option<FormatArg>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum FormatArg {
    Pickle,
    Msgpack,
    Json,
}

impl From<FormatArg> for Format {
    fn from(f: FormatArg) -> Format {
        match f {
            FormatArg::Pickle => Format::Pickle,
            FormatArg::Msgpack => Format::Msgpack,
            FormatArg::Json => Format::Json,
        }
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    let format = output_format(args.to, &args.output)?;
    let (snapshot, source) = common::load(&args.input)?;
    write_and_report(&args.input, &source, &args.output, &snapshot, format)?;
    Ok(ExitCode::SUCCESS)
}

/// The output format: `--to`, else the output file's name (`memsnap import` shares this).
pub(super) fn output_format(to: Option<FormatArg>, output: &Path) -> Result<Format> {
    match to.map(Format::from).or_else(|| Format::from_path(output)) {
        Some(f) => Ok(f),
        None => bail!(
            "cannot tell the output format from the name {}: use --to pickle|msgpack|json, or end the name in .pickle, .msgpack or .json",
            output.display()
        ),
    }
}

/// Writes `snapshot` to `output` atomically and prints `input (source) -> output (encoding,
/// size)` (`memsnap import` shares this).
pub(super) fn write_and_report(
    input: &Path,
    source: &Source,
    output: &Path,
    snapshot: &Snapshot,
    format: Format,
) -> Result<()> {
    let written = memsnap_format::write_path(output, snapshot, Some(format))
        .with_context(|| format!("cannot write {}", output.display()))?;
    let bytes = std::fs::metadata(output).map(|m| m.len()).unwrap_or(0);
    outln!(
        "{} ({}) -> {} ({}, {})",
        input.display(),
        source.describe(),
        output.display(),
        common::describe_encoding(written, Compression::from_path(output)),
        common::format_size(bytes)
    );
    Ok(())
}
