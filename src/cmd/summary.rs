//! `memsnap summary`: per device the peak, the top sites at the peak, the training steps with
//! their slopes, the leak verdict and what the trace window misses.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use memsnap_analysis::summary::{DeviceSummary, Summary, SummaryOptions};
use memsnap_analysis::{StepOptions, StepSource};

use crate::cmd::common::{format_size, load};

/// Summarise a snapshot: peak, top sites, training steps with their phases, categories, drift.
///
/// Bytes are the requested sizes of the trace, live from `alloc` to `free_completed` (as in
/// PyTorch's Active Memory Timeline), counting memory allocated before a truncated history's
/// window.
///
/// Steps and phases. A training step is forward (activations pile up), backward (the autograd
/// engine frees them and creates gradients), then the optimizer step; memory set up before the
/// first step (building or loading the model) is the set-up, not a step. They are found from
/// the best evidence the file has: the allocations' stacks (autograd engine frames mark
/// backward, `torch/optim` frames the optimizer, `nn.Module` calls the forward pass; with
/// Python-only stacks an allocation without frames after forward work is backward work), then
/// `record_function` annotations (`ProfilerStep#N`, `Optimizer.step#...`), then the curve's
/// rise and fall. A capture of one step is one step; an inference capture is one step with
/// only a forward phase; a step cut by the start of a ring-buffer window is marked partial.
/// Each phase prints its events, the bytes at its start and end, and its rate (bytes per second,
/// or per event without times). A warm-up step, the first to create the optimizer's state, is
/// named as such and is not a leak; drift (a floor that rises step after step) is.
///
/// Categories. Every allocation is a parameter (live before the window or from the set-up,
/// never freed), optimizer state (made in an optimizer phase, outlives the step), gradient
/// (made in backward, outlives it), activation (made in forward, freed in backward), temporary
/// (freed in the phase that made it) or unknown; the summary gives the bytes of each at the
/// peak and at each phase's peak.
///
/// Sites. An allocation's site is the innermost frame of the user's code: the unwinder, the
/// caching allocator, c10/at dispatch and CPython's eval loop are skipped, the innermost Python
/// frame outside PyTorch's own package wins, else the innermost native frame outside that
/// machinery (an autograd node such as MmBackward0 on the autograd thread).
///
/// `--json` prints one object with the schema documented in `memsnap_analysis::summary`
/// (`"schema": "memsnap.summary/1"`): `devices[].steps[].phases` (kind, start_event,
/// end_event, start_bytes, end_bytes, bytes_per_s, ...) and `devices[].categories_at_peak`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  memsnap summary run.pickle\n  memsnap summary run.pickle --json | jq '.devices[0].peak'\n  memsnap summary run.pickle --json | jq '.devices[0].steps[0].phases[] | {kind, bytes, bytes_per_s}'\n  memsnap summary run.pickle --json | jq '.devices[0].categories_at_peak'\n  memsnap summary run.pickle --steps-from annotations"
)]
pub struct Args {
    /// Snapshot file (pickle, msgpack or JSON, optionally .gz/.zst; `-` for stdin).
    pub file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Sites listed at the peak.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// Floor or peak growth over all steps above this percentage of the peak is flagged.
    #[arg(long, default_value_t = 1.0, value_name = "PCT")]
    pub drift_tolerance: f64,
    /// Where steps and phases come from: `auto` (the best evidence: stacks, then
    /// annotations, then the curve's shape), or one of them only.
    #[arg(long, value_enum, default_value_t = StepsFrom::Auto, value_name = "SOURCE")]
    pub steps_from: StepsFrom,
    /// Steps the text lists with their phases: the first and last ones and the peak's (a
    /// week-long run has tens of thousands); 0 lists all. `--json` always has every step.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub list_steps: usize,
}

/// `--steps-from`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StepsFrom {
    Auto,
    Stacks,
    Annotations,
    Shape,
}

impl From<StepsFrom> for StepSource {
    fn from(s: StepsFrom) -> Self {
        match s {
            StepsFrom::Auto => StepSource::Auto,
            StepsFrom::Stacks => StepSource::Stacks,
            StepsFrom::Annotations => StepSource::Annotations,
            StepsFrom::Shape => StepSource::CurveShape,
        }
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    let summary = summarize_file(
        &args.file,
        args.top,
        args.drift_tolerance,
        args.steps_from.into(),
    )?;
    if args.json {
        crate::write_json_stdout(&summary);
    } else {
        out!(
            "{}",
            render(&args.file.display().to_string(), &summary, args.list_steps)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Loads and summarises a file.
pub fn summarize_file(
    path: &std::path::Path,
    top: usize,
    tolerance: f64,
    source: StepSource,
) -> Result<Summary> {
    let (snapshot, _) = load(path)?;
    let options = SummaryOptions {
        steps: StepOptions {
            drift_tolerance_percent: tolerance,
            source,
        },
        top_sites: top,
        ..SummaryOptions::default()
    };
    // The file's snapshot is not needed after: its entries go as soon as they are replayed.
    memsnap_analysis::summarize_owned(snapshot, &options)
        .with_context(|| format!("cannot analyse {}", path.display()))
}

pub use memsnap_units::{format_delta, format_duration_us};

/// A phase's rate: per second when the trace has times, else per event.
fn phase_rate(p: &memsnap_analysis::Phase) -> String {
    match p.slope().bytes_per_s {
        Some(r) => memsnap_units::format_rate_signed(r),
        None => memsnap_units::format_per_event_signed(p.slope().bytes_per_event),
    }
}

/// Where an event is: `event 213 (t+12.3 ms)`.
fn when(d: &DeviceSummary, event: u32, time_us: Option<i64>) -> String {
    match (time_us, d.start_time_us) {
        (Some(t), Some(t0)) => format!("event {event} (t+{})", format_duration_us(t - t0)),
        _ => format!("event {event}"),
    }
}

/// The steps the text lists: all when there are at most `limit` (or `limit` is 0), else the
/// first and last `limit / 2` and the one with the peak.
fn listed_steps(count: usize, limit: usize, peak_step: Option<usize>) -> Vec<usize> {
    if limit == 0 || count <= limit {
        return (0..count).collect();
    }
    let half = (limit / 2).max(1);
    let mut listed: Vec<usize> = (0..half).chain(count - half..count).collect();
    if let Some(p) = peak_step.filter(|&p| p < count) {
        listed.push(p);
    }
    listed.sort_unstable();
    listed.dedup();
    listed
}

fn render(name: &str, summary: &Summary, list_steps: usize) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if summary.devices.is_empty() {
        let _ = writeln!(out, "{name}: no device has a trace or segments");
    }
    for d in &summary.devices {
        let _ = writeln!(
            out,
            "{name}: device {}: {} trace entries{}, {} allocations",
            d.device,
            d.entries,
            if d.has_time { "" } else { " (no time_us)" },
            d.allocations
        );
        let reserved = if d.reserved_known {
            format_size(d.peak_reserved_bytes)
        } else {
            "unknown (the source records no reserved memory)".to_owned()
        };
        if d.allocated_known {
            let _ = writeln!(
                out,
                "  peak {} at {}; reserved peak {reserved}",
                format_size(d.peak.bytes),
                when(d, d.peak.event, d.peak.time_us),
            );
        } else {
            let _ = writeln!(
                out,
                "  reserved peak {} at {}; allocated unknown (the source records the driver's \
                 allocations only: under PyTorch's caching allocator, its segments)",
                format_size(d.peak_reserved_bytes),
                when(d, d.peak.event, d.peak.time_us),
            );
        }
        if !d.peak_top_sites.is_empty() {
            let _ = writeln!(out, "  top sites at the peak:");
            for s in &d.peak_top_sites {
                let _ = writeln!(
                    out,
                    "    {:>10}  {:>6}x  {}",
                    format_size(s.bytes),
                    s.count,
                    s.site
                );
            }
        }
        if let Some(p) = &d.peak_phase {
            let _ = match p.step {
                Some(i) => writeln!(out, "  the peak falls in the {} phase of step {i}", p.kind),
                None => writeln!(out, "  the peak falls in the {} phase", p.kind),
            };
        }
        let at_peak: Vec<String> = d
            .categories_at_peak
            .iter()
            .filter(|(_, &b)| b > 0)
            .map(|(c, &b)| format!("{} {}", c.replace('_', " "), format_size(b)))
            .collect();
        if !at_peak.is_empty() {
            let from = match &d.categories_source {
                Some(source) => format!(" (from {source})"),
                None => String::new(),
            };
            let _ = writeln!(
                out,
                "  at the peak by category{from}: {}",
                at_peak.join(", ")
            );
        }
        if !d.modules_at_peak.is_empty() {
            let _ = writeln!(out, "  at the peak by module:");
            for m in &d.modules_at_peak {
                let split: Vec<String> = m
                    .categories
                    .iter()
                    .map(|(c, &b)| format!("{} {}", c.replace('_', " "), format_size(b)))
                    .collect();
                let _ = writeln!(
                    out,
                    "    {:>10}  {}  ({})",
                    format_size(m.bytes),
                    m.module,
                    split.join(", ")
                );
            }
        }
        if let Some(p) = &d.setup_phase {
            let _ = writeln!(
                out,
                "  set-up: events {}..={}, {} -> {}",
                p.phase.start_event,
                p.phase.end_event,
                format_size(p.phase.start_bytes),
                format_size(p.phase.end_bytes)
            );
        }
        if d.steps.is_empty() {
            match &d.step_method_reason {
                Some(reason) => {
                    let _ = writeln!(out, "  steps: none found ({reason})");
                }
                None => {
                    let _ = writeln!(out, "  steps: none found");
                }
            }
        } else {
            match &d.step_method_reason {
                Some(reason) => {
                    let _ = writeln!(
                        out,
                        "  steps ({}, {} ({reason})):",
                        d.steps.len(),
                        d.step_method
                    );
                }
                None => {
                    let _ = writeln!(out, "  steps ({}, {}):", d.steps.len(), d.step_method);
                }
            }
            let _ = writeln!(
                out,
                "    {:>3} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10}  phases",
                "#", "start", "peak", "end", "before", "peak", "end", "outliving"
            );
            let peak_step = d.peak_phase.as_ref().and_then(|p| p.step);
            let listed = listed_steps(d.steps.len(), list_steps, peak_step);
            let mut next = 0;
            for i in listed {
                if i > next {
                    let _ = writeln!(
                        out,
                        "    ... {} steps not listed (--list-steps 0 lists all, --json has every step)",
                        i - next
                    );
                }
                next = i + 1;
                let Some(summary) = d.steps.get(i) else {
                    break;
                };
                let s = summary.step;
                let mut tags = Vec::new();
                if s.partial {
                    tags.push("partial".to_string());
                }
                if s.warmup {
                    tags.push(format!(
                        "warm-up: creates {} optimizer state",
                        format_size(s.optimizer_state_bytes)
                    ));
                }
                let _ = writeln!(
                    out,
                    "    {:>3} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10}  {}{}",
                    i,
                    s.start_event,
                    s.peak_event,
                    s.end_event,
                    format_size(s.before_bytes),
                    format_size(s.peak_bytes),
                    format_size(s.end_bytes),
                    format_size(s.outliving_bytes),
                    s.phases
                        .iter()
                        .map(|p| p.kind.name())
                        .collect::<Vec<_>>()
                        .join(" > "),
                    if tags.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", tags.join("; "))
                    }
                );
                for p in summary.phases() {
                    let rate = phase_rate(p.phase);
                    let _ = writeln!(
                        out,
                        "          {:<9} events {:>7}..={:<7} {:>10} -> {:>10}  {:>11}  {}",
                        p.phase.kind.name(),
                        p.phase.start_event,
                        p.phase.end_event,
                        format_size(p.phase.start_bytes),
                        format_size(p.phase.end_bytes),
                        format_delta(p.phase.slope().bytes),
                        rate
                    );
                }
            }
            if let Some(us) = d.step_duration_us {
                let _ = writeln!(out, "  median step time {}", format_duration_us(us));
            }
            let verdict = if d.leak_suspected {
                "LEAK SUSPECTED: the floor grows from step to step"
            } else {
                "no leak"
            };
            let _ = writeln!(
                out,
                "  drift: floor {}/step ({:+.2}% of the peak over the steps), peak {}/step ({:+.2}%): {verdict}{}",
                format_delta(d.drift_bytes_per_step.round() as i64),
                d.drift_percent,
                format_delta(d.peak_drift_bytes_per_step.round() as i64),
                d.peak_drift_percent,
                if d.peak_growth_suspected { "; the peak grows" } else { "" }
            );
        }
        for leak in &d.leaking_sites {
            let before = if leak.before_window_allocations > 0 {
                format!(
                    ", and {} allocations ({}) from before the window",
                    leak.before_window_allocations,
                    format_size(leak.before_window_bytes)
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "  leaking: {} keeps {}/step: {} allocations ({}) made in {} steps (#{}..#{}) are still held at the end{before}",
                leak.site,
                format_size(leak.bytes_per_step),
                leak.allocations,
                format_size(leak.bytes),
                leak.steps,
                leak.first_step,
                leak.last_step,
            );
        }
        if !d.oom_events.is_empty() {
            let _ = writeln!(out, "  out of memory at events {:?}", d.oom_events);
        }
        for note in &d.notes {
            let _ = writeln!(out, "  note: {note}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::listed_steps;

    #[test]
    fn a_long_run_lists_its_first_and_last_steps_and_the_peaks() {
        // A 10M-entry run has tens of thousands of steps: the text printed every one of
        // them (68,027 rows with their phases).
        assert_eq!(listed_steps(5, 20, Some(3)), [0, 1, 2, 3, 4]);
        assert_eq!(listed_steps(68_027, 0, None).len(), 68_027);
        let listed = listed_steps(68_027, 20, Some(40_000));
        assert_eq!(listed.len(), 21);
        assert_eq!(&listed[..10], &(0..10).collect::<Vec<_>>()[..]);
        assert_eq!(listed[10], 40_000);
        assert_eq!(listed[11..], (68_017..68_027).collect::<Vec<_>>()[..]);
        // The peak among the listed ones, or none: no duplicate, no extra row.
        assert_eq!(listed_steps(100, 4, Some(1)), [0, 1, 98, 99]);
        assert_eq!(listed_steps(100, 4, None), [0, 1, 98, 99]);
        assert_eq!(listed_steps(100, 1, Some(50)), [0, 50, 99]);
    }
}
