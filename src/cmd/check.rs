//! `memsnap check`: exit 1 when a snapshot is over a memory budget, for CI jobs that gate
//! memory regressions.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};

use crate::cmd::common::{format_size, parse_size};
use crate::cmd::summary::summarize_file;
use memsnap_analysis::StepSource;

/// Check a snapshot against a memory budget: exit 0 within budget, 1 over it (with the reason),
/// 2 on bad input.
///
/// The peak is the highest requested bytes live on any device (alloc to free_completed).
/// Drift is the growth of the step floor over all recorded steps, as a percentage of the peak.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  memsnap check run.pickle --max-peak 70GiB\n  memsnap check run.pickle --max-peak 70GiB --max-drift 0.5"
)]
pub struct Args {
    /// Snapshot file.
    pub file: PathBuf,
    /// Highest allowed peak (e.g. 70GiB, 512MiB, 80GB).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub max_peak: Option<u64>,
    /// Highest allowed floor growth over the steps, in percent of the peak.
    #[arg(long, value_name = "PCT")]
    pub max_drift: Option<f64>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    if args.max_peak.is_none() && args.max_drift.is_none() {
        bail!("nothing to check: give --max-peak SIZE and/or --max-drift PCT");
    }
    if let Some(p) = args.max_drift {
        if !p.is_finite() || p < 0.0 {
            bail!("--max-drift must be a non-negative percentage, not {p}");
        }
    }
    let summary = summarize_file(
        &args.file,
        0,
        args.max_drift.unwrap_or(1.0),
        StepSource::Auto,
    )?;
    let mut failures = Vec::new();
    for d in &summary.devices {
        if let Some(max) = args.max_peak {
            if d.peak.bytes > max {
                failures.push(format!(
                    "device {}: peak {} ({} bytes) at event {} is over the budget of {} ({} bytes)",
                    d.device,
                    format_size(d.peak.bytes),
                    d.peak.bytes,
                    d.peak.event,
                    format_size(max),
                    max
                ));
            }
        }
        if let Some(max) = args.max_drift {
            if d.steps.len() >= 2 && d.drift_percent > max {
                failures.push(format!(
                    "device {}: the step floor grows {:.2}% of the peak over {} steps ({} bytes/step), over the allowed {max}%",
                    d.device,
                    d.drift_percent,
                    d.steps.len(),
                    d.drift_bytes_per_step.round()
                ));
            }
        }
    }
    let name = args.file.display();
    if failures.is_empty() {
        let peak = summary.busiest().map_or(0, |d| d.peak.bytes);
        outln!("{name}: ok (peak {})", format_size(peak));
        Ok(ExitCode::SUCCESS)
    } else {
        for f in &failures {
            outln!("{name}: FAIL: {f}");
        }
        Ok(ExitCode::from(1))
    }
}
