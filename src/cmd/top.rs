//! `memsnap top`: what is live at an instant (the peak by default), grouped by stack, top
//! frame, file or module.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use memsnap_analysis::{DeviceTimeline, GroupBy, Instant, Lifetime};
use serde::Serialize;

use crate::cmd::common::{format_size, load, parse_instant, parse_size};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    Stack,
    Frame,
    File,
    /// The `nn.Module` call chain that made the allocation (`model.py:245 > model.py:54`:
    /// the user `forward`s `nn.Module.__call__` entered, outermost first).
    Module,
}

/// Show what is live at an instant, grouped by allocation site.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  memsnap top run.pickle\n  memsnap top run.pickle --at event:1200 --by file\n  memsnap top run.pickle --by module\n  memsnap top run.pickle --at +2.5s --min-size 1MiB"
)]
pub struct Args {
    /// Snapshot file.
    pub file: PathBuf,
    /// `peak`, `end`, a trace entry (`event:1234`), a time_us as the snapshot has it
    /// (`1700000000123456us`) or a time after the first entry (`+2.5s`): the same as
    /// `memsnap export --at`.
    #[arg(long, default_value = "peak", value_name = "WHEN", value_parser = parse_instant)]
    pub at: Instant,
    /// Grouping.
    #[arg(long, value_enum, default_value_t = By::Frame)]
    pub by: By,
    /// Leave out allocations smaller than this (e.g. 1MiB).
    #[arg(long, value_parser = parse_size, default_value = "0", value_name = "BYTES")]
    pub min_size: u64,
    /// Device (default: the one with the highest peak).
    #[arg(long)]
    pub device: Option<i64>,
    /// Rows to print.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Row {
    site: String,
    bytes: u64,
    count: u64,
    largest: u64,
    first_alloc_event: Option<u32>,
}

#[derive(Serialize)]
struct Report {
    device: i64,
    event: u32,
    time_us: Option<i64>,
    live_bytes: u64,
    shown_bytes: u64,
    groups: usize,
    rows: Vec<Row>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let (snapshot, _) = load(&args.file)?;
    let timeline = match args.device {
        Some(d) => DeviceTimeline::build(&snapshot, d)?,
        None => match memsnap_analysis::live::highest_peak_timeline(&snapshot)? {
            Some(t) => t,
            None => bail!("{}: no device has a trace or segments", args.file.display()),
        },
    };
    let event = timeline.resolve_exact(args.at)?;
    let instant = Instant::Event(event);
    let by = match args.by {
        By::Stack => GroupBy::Stack,
        By::Frame => GroupBy::Frame,
        By::File => GroupBy::File,
        By::Module => GroupBy::Module,
    };
    let groups = timeline.live_groups(&snapshot, instant, Lifetime::Active, by, args.min_size);
    let report = Report {
        device: timeline.device(),
        event,
        time_us: timeline.time().time_of(event),
        live_bytes: timeline.curves().active.at(event),
        shown_bytes: groups.iter().map(|g| g.bytes).sum(),
        groups: groups.len(),
        rows: groups
            .iter()
            .take(args.limit)
            .map(|g| Row {
                site: g.key.label(&snapshot),
                bytes: g.bytes,
                count: g.count,
                largest: g.largest,
                first_alloc_event: g.first_alloc_event,
            })
            .collect(),
    };
    if args.json {
        crate::write_json_stdout(&report);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{}: device {} at event {}: {} live{}",
        args.file.display(),
        report.device,
        report.event,
        format_size(report.live_bytes),
        if args.min_size > 0 {
            format!(
                ", {} in allocations of at least {}",
                format_size(report.shown_bytes),
                format_size(args.min_size)
            )
        } else {
            String::new()
        }
    );
    outln!(
        "{:>10} {:>7} {:>10} {:>9}  site",
        "bytes",
        "count",
        "largest",
        "since"
    );
    for r in &report.rows {
        let since = r
            .first_alloc_event
            .map_or("before".to_string(), |e| e.to_string());
        outln!(
            "{:>10} {:>7} {:>10} {:>9}  {}",
            format_size(r.bytes),
            r.count,
            format_size(r.largest),
            since,
            r.site
        );
    }
    if report.groups > report.rows.len() {
        outln!(
            "... {} more groups (--limit)",
            report.groups - report.rows.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}
