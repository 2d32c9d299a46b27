//! `memsnap export --to parquet`: tables of many ranks' snapshots for SQL engines.

use std::process::ExitCode;

use anyhow::{bail, Result};
use memsnap_converters::parquet::{export_files, ExportOptions};

use super::{Args, Target};
use crate::cmd::common::format_size;

/// Options of `--to parquet`. The output folder gets one folder per table (snapshots,
/// devices, allocations, steps, segments, frames, stacks) holding one file per input
/// (`allocations/rank-00003.parquet`); ranks come from `rank<N>` in the file names when every
/// name has a distinct one, else from the input order. The folder appears only once every
/// input is exported (see `memsnap_converters::parquet`).
#[derive(clap::Args, Clone, Debug, Default)]
#[command(next_help_heading = "Parquet (--to parquet)")]
pub struct ParquetArgs {
    /// Replace the output if it is an earlier export (or a file). A folder memsnap did not
    /// write is never deleted.
    #[arg(long)]
    pub force: bool,
    /// Snapshots read at once, each held in memory with its analysis (default: the cores).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    if args.to != Target::Parquet {
        bail!("--to {:?} is not a Parquet target", args.to);
    }
    let options = ExportOptions::default()
        .force(args.parquet.force)
        .jobs(args.parquet.jobs.unwrap_or(0));
    let summary = export_files(&args.inputs, &args.output, &options)?;
    let rows = summary
        .tables
        .iter()
        .map(|(table, n)| format!("{table} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    outln!(
        "{} ({} input{}, {}): {rows} rows",
        summary.path.display(),
        summary.inputs.len(),
        if summary.inputs.len() == 1 { "" } else { "s" },
        format_size(summary.bytes),
    );
    Ok(ExitCode::SUCCESS)
}
