//! `memsnap export`: write a snapshot in another tool's format.
//!
//! Each target format has its own module here; the conversion itself lives in
//! `memsnap-converters`, so this is argument handling only.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

mod chrome;
mod parquet;
mod profiles;

/// Export a snapshot to another tool's format.
///
/// Inputs are opened by content, like every memsnap command (PyTorch pickles, memsnap msgpack
/// and JSON, and the formats `memsnap import` reads).
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  memsnap export run.pickle --to chrome -o run.trace.json       open in ui.perfetto.dev
  memsnap export run.pickle --to flamegraph --at peak -o peak.svg
  memsnap export run.pickle --to pprof -o run.pb.gz             go tool pprof run.pb.gz
  memsnap export rank*.pickle --to parquet -o tables/           query with DuckDB:
      duckdb -c \"FROM 'tables/allocations/*.parquet' SELECT rank, site, sum(size) GROUP BY ALL\"")]
pub struct Args {
    /// Snapshot(s) to read. Several only with `--to parquet`.
    #[arg(required = true, value_name = "FILE")]
    pub inputs: Vec<PathBuf>,
    /// Target format.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub to: Target,
    /// File (or, for parquet, folder) to write.
    #[arg(short, long, value_name = "PATH")]
    pub output: PathBuf,
    #[command(flatten)]
    pub parquet: parquet::ParquetArgs,
}

/// The formats `memsnap export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// Chrome Trace Event JSON (ui.perfetto.dev, chrome://tracing).
    Chrome,
    /// Perfetto's native protobuf trace (`.pftrace`).
    Perfetto,
    /// A flame graph SVG of live bytes by stack.
    Flamegraph,
    /// A gzipped pprof `profile.proto` (go tool pprof, speedscope).
    Pprof,
    /// Parquet tables for DuckDB, Spark, Trino or Polars.
    Parquet,
}

pub fn run(args: Args) -> Result<ExitCode> {
    match args.to {
        Target::Chrome | Target::Perfetto => chrome::run(&args),
        Target::Flamegraph | Target::Pprof => profiles::run(&args),
        Target::Parquet => parquet::run(&args),
    }
}
