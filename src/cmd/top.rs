//! `memsnap top`: what is live at an instant (the peak by default), grouped by stack, top
//! frame or file.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use memsnap_analysis::{CurveKind, DeviceTimeline, GroupBy, Instant, Lifetime};
use serde::Serialize;

use crate::cmd::common::{format_size, load, parse_size};

/// Where to look.
#[derive(Clone, Copy, Debug)]
pub enum At {
    Peak,
    Event(u32),
    /// Absolute `time_us`.
    Time(i64),
    /// Microseconds after the first event.
    AfterStart(i64),
}

fn parse_at(text: &str) -> Result<At, String> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("peak") {
        return Ok(At::Peak);
    }
    if let Ok(e) = t.parse::<u32>() {
        return Ok(At::Event(e));
    }
    let relative = t.strip_prefix('+');
    let body = relative.unwrap_or(t);
    let (num, scale) = if let Some(n) = body.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = body.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = body.strip_suffix('s') {
        (n, 1e6)
    } else {
        return Err(format!(
            "`{text}` is not an instant: use `peak`, an event index (`1234`), a time_us (`1760000000123456us`) or a time after the start (`+2.5s`, `+150ms`)"
        ));
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    let us = v * scale;
    if !us.is_finite() || us.abs() > i64::MAX as f64 {
        return Err(format!("`{text}` is out of range"));
    }
    Ok(match relative {
        Some(_) => At::AfterStart(us.round() as i64),
        None => At::Time(us.round() as i64),
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    Stack,
    Frame,
    File,
}

/// Show what is live at an instant, grouped by allocation site.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  memsnap top run.pickle\n  memsnap top run.pickle --at 1200 --by file\n  memsnap top run.pickle --at +2.5s --min-size 1MiB"
)]
pub struct Args {
    /// Snapshot file.
    pub file: PathBuf,
    /// `peak`, an event index, a time_us with `us` suffix, or `+TIME` after the first event.
    #[arg(long, default_value = "peak", value_parser = parse_at)]
    pub at: At,
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
    let devices = DeviceTimeline::devices(&snapshot);
    let timeline = match args.device {
        Some(d) => DeviceTimeline::build(&snapshot, d)?,
        None => {
            let mut best: Option<DeviceTimeline> = None;
            for d in devices {
                let t = DeviceTimeline::build(&snapshot, d)?;
                if best.as_ref().is_none_or(|b| {
                    t.peak(CurveKind::Active).bytes > b.peak(CurveKind::Active).bytes
                }) {
                    best = Some(t);
                }
            }
            match best {
                Some(t) => t,
                None => bail!("{}: no device has a trace or segments", args.file.display()),
            }
        }
    };
    let instant = match args.at {
        At::Peak => Instant::Peak,
        At::Event(e) => {
            let len = timeline.replay().axis_len();
            if e >= len {
                bail!(
                    "event {e} is past the trace end (device {} has {len} events)",
                    timeline.device()
                );
            }
            Instant::Event(e)
        }
        At::Time(t) => {
            if !timeline.time().has_time() {
                bail!("this trace has no time_us; give an event index");
            }
            Instant::TimeUs(t)
        }
        At::AfterStart(dt) => {
            let t0 = timeline
                .time()
                .time_of(0)
                .context("this trace has no time_us; give an event index")?;
            Instant::TimeUs(t0.saturating_add(dt))
        }
    };
    let by = match args.by {
        By::Stack => GroupBy::Stack,
        By::Frame => GroupBy::Frame,
        By::File => GroupBy::File,
    };
    let event = timeline.resolve(instant);
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
        outln!("{}", serde_json::to_string_pretty(&report)?);
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
