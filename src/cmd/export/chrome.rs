//! `memsnap export --to chrome|perfetto`: Chrome Trace Event JSON for ui.perfetto.dev and
//! chrome://tracing, optionally merged into a torch.profiler trace, or Perfetto's protobuf.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use memsnap_converters::chrome::{self, ChromeOptions};

use super::{Args, Target};
use crate::cmd::common;

pub fn run(args: &Args) -> Result<ExitCode> {
    let [input] = args.inputs.as_slice() else {
        bail!(
            "--to chrome takes one snapshot ({} given): export each on its own, with --rank",
            args.inputs.len()
        );
    };
    let (snapshot, source) = common::load(input)?;
    let options = ChromeOptions::default()
        .with_rank(args.rank)
        .with_phases(!args.no_phases);
    let size = |path: &std::path::Path| {
        std::fs::metadata(path)
            .map(|m| common::format_size(m.len()))
            .unwrap_or_default()
    };
    if args.to == Target::Perfetto && args.merge.is_some() {
        bail!("--merge writes a Chrome trace (JSON): use --to chrome");
    }
    match &args.merge {
        None => {
            let (summary, what) = if args.to == Target::Perfetto {
                let s = chrome::export_perfetto_path(&snapshot, &options, &args.output);
                (s, "Perfetto protobuf trace")
            } else {
                let s = chrome::export_path(&snapshot, &options, &args.output);
                (s, "Chrome trace")
            };
            let summary = summary.with_context(|| format!("cannot export {}", input.display()))?;
            outln!(
                "{} ({}) -> {} ({what}, {} events, {})",
                input.display(),
                source.describe(),
                args.output.display(),
                summary.events,
                size(&args.output)
            );
            for d in &summary.devices {
                outln!(
                    "  GPU {}: pid {}, {} trace entries, {} allocations in {} lanes, {} phases{}",
                    d.device,
                    d.pid,
                    d.entries,
                    d.allocations,
                    d.lanes,
                    d.phases,
                    if d.timed {
                        ""
                    } else {
                        " (no times: the entry index is the clock)"
                    }
                );
            }
        }
        Some(torch) => {
            let report = chrome::merge_path(&snapshot, &options, torch, &args.output)
                .with_context(|| {
                    format!("cannot merge {} into {}", input.display(), torch.display())
                })?;
            outln!(
                "{} ({}) + {} ({} events) -> {} ({} memsnap events added, {})",
                input.display(),
                source.describe(),
                torch.display(),
                report.torch_events,
                args.output.display(),
                report.memsnap_events,
                size(&args.output)
            );
            match report.base_time_ns {
                Some(base) => outln!("  time base: baseTimeNanoseconds {base} (ts relative to it)"),
                None => outln!("  time base: epoch µs (no baseTimeNanoseconds)"),
            }
            if let Some(rank) = report.rank {
                outln!("  rank: {rank}");
            }
            match report.median_offset_us {
                Some(offset) => outln!(
                    "  clock offset: torch − memsnap = {offset:.1} µs (median of {} matched allocations of {})",
                    report.matched,
                    report.torch_allocations
                ),
                None if report.torch_allocations > 0 => outln!(
                    "  clock offset: none of the trace's {} [memory] allocations matched the snapshot's (different run or device?)",
                    report.torch_allocations
                ),
                None => outln!("  clock offset: unknown (the trace has no [memory] events)"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
