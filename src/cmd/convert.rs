//! `memsnap convert`: rewrite a snapshot in another format or compression.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use memsnap_format::{Compression, Format};

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
    let format = match args.to.map(Format::from).or_else(|| Format::from_path(&args.output)) {
        Some(f) => f,
        None => bail!(
            "cannot tell the output format from the name {}: use --to pickle|msgpack|json, or end the name in .pickle, .msgpack or .json",
            args.output.display()
        ),
    };
    let (snapshot, source) = common::load(&args.input)?;
    let written = memsnap_format::write_path(&args.output, &snapshot, Some(format))
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    let bytes = std::fs::metadata(&args.output)
        .map(|m| m.len())
        .unwrap_or(0);
    outln!(
        "{} ({}) -> {} ({}, {})",
        args.input.display(),
        source.describe(),
        args.output.display(),
        common::describe_encoding(written, Compression::from_path(&args.output)),
        common::format_size(bytes)
    );
    Ok(ExitCode::SUCCESS)
}
