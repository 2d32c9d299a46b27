//! `memsnap export`: write a snapshot in another tool's format.
//!
//! Each target format has its own module here; the conversion itself lives in
//! `memsnap-converters`, so this is argument handling only.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use memsnap_analysis::Instant;

use super::common;

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
  memsnap export run.pickle --to chrome --merge prof.json.gz -o both.json.gz
                                              memory under the kernels of a torch.profiler trace
  memsnap export run.pickle --to flamegraph --at peak -o peak.svg
  memsnap export run.pickle --to flamegraph --by site --min-size 1MiB -o sites.svg
  memsnap export run.pickle --to pprof -o run.pb.gz             go tool pprof run.pb.gz
  memsnap export run.pickle --to pprof --at event:1200 --device 1 -o e1200.pb.gz
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
    /// chrome: a torch.profiler trace (`.json` or `.json.gz`) to merge into: its events and
    /// keys are kept, memsnap's are added in its time base.
    #[arg(long, value_name = "TRACE")]
    pub merge: Option<PathBuf>,
    /// chrome: the rank, for row names and ids (default: the merged trace's
    /// `distributedInfo.rank`, else none).
    #[arg(long, value_name = "N")]
    pub rank: Option<u32>,
    /// chrome: do not detect training steps (no `phases` row; faster on huge traces).
    #[arg(long)]
    pub no_phases: bool,
    /// The instant a flame graph or pprof profile shows: `peak` (the first trace entry at
    /// which live bytes peak, as `memsnap summary` reports it), `end`, a trace entry index
    /// (`event:1234`, or `'#1234'` quoted), a time_us as the snapshot has it
    /// (`1700000000123456us`), or a time after the first entry (`+2.5s`, `+150ms`, `+300us`).
    /// The same as `memsnap top --at`.
    #[arg(long, default_value = "peak", value_name = "WHEN", value_parser = common::parse_instant)]
    pub at: Instant,
    /// Group a flame graph or pprof profile by the whole stack, or only by the site (the
    /// innermost frame of your code).
    #[arg(long, value_enum, default_value_t = By::Stack)]
    pub by: By,
    /// Leave out blocks smaller than this (`1MiB`, `512KiB`, `4096`); the title says how much
    /// was left out.
    #[arg(long, value_parser = common::parse_size, default_value = "0", value_name = "SIZE")]
    pub min_size: u64,
    /// The device a flame graph or pprof profile shows (default: the one whose live bytes peak
    /// highest).
    #[arg(long, value_name = "N")]
    pub device: Option<i64>,
    #[command(flatten)]
    pub parquet: parquet::ParquetArgs,
}

/// How a flame graph or pprof profile groups the live blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// The whole stack, outermost frame first.
    Stack,
    /// Only the site: the innermost frame of your code.
    Site,
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
