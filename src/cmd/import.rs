//! `memsnap import`: turn another tool's recording into a snapshot file.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use super::common;

/// Import another tool's memory recording as a PyTorch memory snapshot.
///
/// Reads, by content: torch.profiler Chrome traces recorded with `profile_memory=True`
/// (`.json`, `.json.gz`; their `[memory]` events), `export_memory_timeline` outputs
/// (`.raw.json.gz` raw events, or the plot data), memsnap's own `export --to chrome`
/// (exactly), and AMD ROCm allocation traces (`rocprofv3 --memory-allocation-trace`: the rocpd
/// `.db`, the CSV with its `agent_info.csv`, the JSON; several processes side by side as
/// devices, named in the producer). Writes a snapshot every memsnap command, the viewer and PyTorch's
/// `_memory_viz.py` read. The output format comes from `--to`, else from the name
/// (`.pickle`, `.msgpack`, `.json`; `.gz`/`.zst` compress); it is written atomically.
///
/// Every memsnap command also opens these inputs directly (`memsnap summary trace.json`):
/// importing once saves the conversion each time and shows what the import could not know.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  memsnap import prof.pt.trace.json.gz -o prof.pickle       torch.profiler, profile_memory=True
  memsnap import timeline.raw.json.gz -o timeline.pickle    export_memory_timeline raw events
  memsnap import run.trace.json -o run.msgpack.zst          memsnap's own chrome export, back
  memsnap import host1/4242_results.db -o rocm.pickle       rocprofv3 (rocpd, CSV or JSON)

What the import cannot know is printed: torch.profiler reports the allocator's rounded block
sizes (not the requested sizes) and no streams; blocks freed in the profile but allocated
before it start at its beginning; memory live before it and never freed is counted but has
no block.")]
pub struct Args {
    /// The recording to import (`-` reads stdin).
    input: PathBuf,
    /// Snapshot file to write.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Output format (default: from the output file name).
    #[arg(long, value_enum, value_name = "FORMAT")]
    to: Option<super::convert::FormatArg>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let format = super::convert::output_format(args.to, &args.output)?;
    let import = common::open(&args.input, memsnap_converters::OpenOptions::new())?;
    super::convert::write_and_report(
        &args.input,
        &import.source,
        &args.output,
        &import.snapshot,
        format,
    )?;
    match &import.report {
        None => outln!("  a memsnap snapshot already: rewritten as is (memsnap convert does this)"),
        Some(report) => {
            if let Some(rank) = report.rank {
                outln!("  rank {rank}");
            }
            for d in &report.devices {
                outln!(
                    "  device {}: {} trace entries: {} allocs ({} with a stack), {} frees, {} OOMs",
                    d.device,
                    d.entries,
                    d.allocs,
                    d.with_stack,
                    d.frees,
                    d.ooms
                );
            }
            for w in &report.warnings {
                outln!("  note: {w}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
