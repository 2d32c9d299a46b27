//! `memsnap ranks`: one row per rank of a multi-GPU job, and the skew across ranks. Files are
//! loaded and analysed in parallel.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{anyhow, Result};
use memsnap_analysis::compare::{RankRow, Skew};
use memsnap_analysis::StepSource;
use serde::Serialize;

use crate::cmd::common::format_size;
use crate::cmd::summary::{format_duration_us, summarize_file};

/// Compare the ranks of a multi-GPU job: peak, when, step time and drift per file, and the
/// skew across them.
///
/// Each file is one rank; its busiest device is reported. Files are processed in parallel
/// (`--jobs`, default: the number of cores), and each is loaded, reduced to its row and
/// dropped before its worker takes the next: memory grows with `--jobs`, not with the number
/// of files (64 ranks of 1M entries: 228 MiB peak with `--jobs 1`, 416 MiB with 2).
#[derive(clap::Args)]
#[command(after_help = "Example:\n  memsnap ranks rank*.pickle")]
pub struct Args {
    /// One snapshot per rank.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Files processed at once (default: available cores).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report {
    ranks: Vec<RankRow>,
    skew: Option<Skew>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, args.files.len().max(1));
    // Workers take the next file index until none is left; results keep the command-line order.
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Option<RankRow>>>>> =
        Mutex::new((0..args.files.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(path) = args.files.get(i) else {
                    break;
                };
                let row = summarize_file(path, 0, 1.0, StepSource::Auto).map(|summary| {
                    RankRow::from_summary(path.display().to_string(), &summary.devices)
                });
                if let Ok(mut r) = results.lock() {
                    r[i] = Some(row);
                }
            });
        }
    });
    let results = results
        .into_inner()
        .map_err(|_| anyhow!("a worker thread failed"))?;
    let mut rows = Vec::new();
    for (path, result) in args.files.iter().zip(results) {
        match result {
            Some(Ok(Some(row))) => rows.push(row),
            Some(Ok(None)) => eprintln!(
                "memsnap: warning: {}: no device has a trace or segments",
                path.display()
            ),
            Some(Err(e)) => return Err(e),
            None => return Err(anyhow!("{}: not analysed (worker failed)", path.display())),
        }
    }
    let report = Report {
        skew: Skew::of(&rows),
        ranks: rows,
    };
    if args.json {
        crate::write_json_stdout(&report);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{:<40} {:>4} {:>10} {:>9} {:>6} {:>10} {:>12}",
        "file",
        "dev",
        "peak",
        "at event",
        "steps",
        "step time",
        "drift/step"
    );
    for r in &report.ranks {
        outln!(
            "{:<40} {:>4} {:>10} {:>9} {:>6} {:>10} {:>12}{}",
            r.file,
            r.device,
            format_size(r.peak_bytes),
            r.peak_event,
            r.steps,
            r.step_duration_us.map_or("-".into(), format_duration_us),
            crate::cmd::summary::format_delta(r.drift_bytes_per_step.round() as i64),
            if r.leak_suspected { "  leak?" } else { "" }
        );
    }
    if let Some(s) = &report.skew {
        outln!(
            "skew: peak {} .. {} (spread {}, {:.1}% of the max; highest: {}){}",
            format_size(s.min_peak_bytes),
            format_size(s.max_peak_bytes),
            format_size(s.peak_spread_bytes),
            s.peak_spread_percent,
            s.max_peak_file,
            s.step_duration_spread_us.map_or(String::new(), |d| format!(
                "; step time spread {}",
                format_duration_us(d)
            ))
        );
    }
    Ok(ExitCode::SUCCESS)
}
