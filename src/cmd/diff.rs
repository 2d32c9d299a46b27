//! `memsnap diff`: how the peak, the steps and the allocation sites changed between two runs.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use memsnap_analysis::compare::{diff, profile, DeviceDiff};
use memsnap_analysis::SummaryOptions;

use crate::cmd::common::{format_size, load};
use crate::cmd::summary::format_delta;

/// Compare two snapshots: peak and per-step deltas, and the sites that grew or shrank most.
///
/// Devices are matched by ordinal, steps by index, sites by their top frame
/// (`file:line:function`), which is stable across runs.
#[derive(clap::Args)]
#[command(after_help = "Example:\n  memsnap diff before.pickle after.pickle")]
pub struct Args {
    /// The baseline snapshot.
    pub before: PathBuf,
    /// The snapshot to compare with it.
    pub after: PathBuf,
    /// Sites listed each way.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let options = SummaryOptions::default();
    let load_profile = |path: &PathBuf| -> Result<_> {
        let (snapshot, _) = load(path)?;
        profile(&snapshot, &options).with_context(|| format!("cannot analyse {}", path.display()))
    };
    let (before, after) = std::thread::scope(|s| {
        let a = s.spawn(|| load_profile(&args.before));
        let b = load_profile(&args.after);
        (
            a.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("analysis thread failed"))),
            b,
        )
    });
    let diffs = diff(&before?, &after?, args.top);
    if args.json {
        crate::write_json_stdout(&serde_json::json!({ "devices": diffs }));
        return Ok(ExitCode::SUCCESS);
    }
    if diffs.is_empty() {
        outln!("no device in common");
    }
    for d in &diffs {
        render(d);
    }
    Ok(ExitCode::SUCCESS)
}

fn render(d: &DeviceDiff) {
    outln!(
        "device {}: peak {} -> {} ({}{})",
        d.device,
        format_size(d.before_peak_bytes),
        format_size(d.after_peak_bytes),
        format_delta(d.delta_peak_bytes),
        d.delta_peak_percent
            .map_or(String::new(), |p| format!(", {p:+.1}%"))
    );
    outln!("  steps: {} -> {}", d.before_steps, d.after_steps);
    for s in &d.steps {
        outln!(
            "    step {:>3}: peak {} -> {} ({}), start {}",
            s.index,
            format_size(s.before_peak_bytes),
            format_size(s.after_peak_bytes),
            format_delta(s.delta_peak_bytes),
            format_delta(s.delta_start_bytes)
        );
    }
    for (title, sites) in [("grew", &d.grew), ("shrank", &d.shrank)] {
        if sites.is_empty() {
            continue;
        }
        outln!("  sites that {title} most (bytes at the peak, total allocated):");
        for s in sites {
            outln!(
                "    {:>12} {:>12}  {}",
                format_delta(s.delta_bytes_at_peak),
                format_delta(s.delta_total_bytes),
                s.site
            );
        }
    }
}
