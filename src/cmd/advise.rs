//! `memsnap advise`: what would make the run fit: fixes (activation checkpointing of a module,
//! micro-batches, 8-bit or offloaded optimizer state, allocator settings, and combinations),
//! each predicted by editing the trace and replaying it through memsnap's allocator.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use memsnap_advise::{advise, when_full, Advice, Options};
use serde::Serialize;

use crate::cmd::common::{format_size, load, parse_size};

/// Rank concrete fixes that lower the run's peak, each with its predicted peaks and whether it
/// fits the budget.
///
/// Each fix edits the recorded trace the way it would change the run and replays the edited
/// trace through memsnap's allocator (as `memsnap simulate` does): activation checkpointing of
/// a module (its activations freed after each call's forward and made again, with the call's
/// transients, at the start of its backward), micro-batches with gradient accumulation (the
/// forward and backward on 1/N of the batch, N times), optimizer state in 8 bits or offloaded,
/// allocator settings. With --budget, when no single fix fits, the best is combined with the
/// best of each other kind until one fits. Modules are named by path (`blocks.0` to
/// `blocks.2`, `blocks.*` for every block) when the run recorded them
/// (`memsnap.torch.enable(modules=True)`), else they are the user `forward`s that
/// nn.Module.__call__ entered, by `file:line` (see `memsnap top --by module`).
///
/// Exit status 1 when there is a budget (given, or the GPU's memory of a file that ran out of
/// it) and no fix fits it.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  memsnap advise run.pickle --budget 40GB
  memsnap advise run.pickle --json")]
pub struct Args {
    /// Snapshot file.
    pub file: PathBuf,
    /// Memory the run must fit in (reserved bytes, e.g. 40GB, 24GiB). Default: the GPU's
    /// memory when the file ran out of it (its out-of-memory entry states it), else none.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub budget: Option<u64>,
    /// Rank by reserved peak only, even for a file that ran out of memory.
    #[arg(long, conflicts_with = "budget")]
    pub no_budget: bool,
    /// Device (default: the one with the highest peak).
    #[arg(long)]
    pub device: Option<i64>,
    /// Replays run at once (default: one per core, at most 4). Each holds its own copy of the
    /// trace and allocator state (about 1 GB for 10M entries): fewer use less memory.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub jobs: Option<u16>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Output<'a> {
    file: String,
    #[serde(flatten)]
    advice: &'a Advice,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let (snapshot, _) = load(&args.file)?;
    let advice = advise(
        &snapshot,
        &Options {
            budget: args.budget,
            device_memory_budget: !args.no_budget,
            device: args.device,
            jobs: args.jobs.map(usize::from),
        },
    )?;
    let fits_any = advice.predictions.iter().any(|p| p.fits == Some(true));
    let code = if advice.budget_bytes.is_some() && !fits_any {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    };
    if args.json {
        crate::write_json_stdout(&Output {
            file: args.file.display().to_string(),
            advice: &advice,
        });
        return Ok(code);
    }
    let b = &advice.baseline;
    if let Some(c) = &advice.completion {
        outln!(
            "the recording ends where step {} ran out of memory (event {}; steps count from 0, as in `memsnap summary`); it is completed with the rest of step {} ({} entries), and every prediction is of the completed run",
            c.failed_step,
            c.oom_event,
            c.model_step,
            c.entries_added
        );
    }
    outln!(
        "{}: device {}{}",
        args.file.display(),
        advice.device,
        match advice.budget_bytes {
            Some(b) if advice.budget_is_device_memory => format!(
                ", budget {} (the GPU's memory, as the file's out-of-memory entry states it; --budget SIZE or --no-budget to change)",
                format_size(b)
            ),
            Some(b) => format!(", budget {}", format_size(b)),
            None => String::new(),
        }
    );
    outln!(
        "{}: allocated peak {}, reserved peak {}{}",
        if advice.completion.is_some() {
            "completed run (replayed)"
        } else {
            "as recorded (replayed)"
        },
        format_size(b.allocated_peak_bytes),
        format_size(b.reserved_peak_bytes),
        match (b.fits, b.out_of_memory) {
            (_, true) => ", runs out of memory",
            (Some(true), _) => ", fits",
            (Some(false), _) => ", does not fit",
            (None, _) => "",
        }
    );
    if !advice.modules.is_empty() {
        outln!();
        outln!("activations live at the peak, by module:");
        let shown = &advice.modules[..advice.modules.len().min(5)];
        for m in shown {
            outln!(
                "{:>12}  {}",
                format_size(m.activation_bytes_at_peak),
                m.module
            );
        }
        if let Some(pattern) = shown.iter().find(|m| m.module.contains('*')) {
            outln!(
                "{:>12}  (* stands for a number: {} is every {})",
                "",
                pattern.module,
                pattern.module.replacen('*', "N", 1)
            );
        }
    }
    outln!();
    if advice.passes == 0 {
        outln!("no step with a forward and a backward phase was found: checkpointing and micro-batches have nothing to edit");
    }
    outln!(
        "{:>3}  {:>4}  {:>10}  {:>10}  {:>9}  fix",
        "#",
        "fits",
        "allocated",
        "reserved",
        "recompute"
    );
    for (i, p) in advice.predictions.iter().enumerate() {
        let recompute = if p.extra_forward_compute > 0.0 {
            format!("+{:.0}%", p.extra_forward_compute * 100.0)
        } else {
            "-".to_string()
        };
        outln!(
            "{:>3}  {:>4}  {:>10}  {:>10}  {:>9}  {}",
            i + 1,
            p.verdict(),
            format_size(p.allocated_peak_bytes),
            format_size(p.reserved_peak_bytes),
            recompute,
            p.description
        );
    }
    let starred: Vec<&memsnap_advise::Prediction> = advice
        .predictions
        .iter()
        .filter(|p| p.steps_to_budget.is_some())
        .collect();
    if !starred.is_empty() {
        let steps = starred.iter().filter_map(|p| p.steps_to_budget);
        let (fewest, most) = (steps.clone().min(), steps.max());
        // A fix that stops one of several leaks leaves a smaller rate going than one that
        // stops none.
        let rates = starred.iter().map(|p| p.leak_bytes_per_step);
        let (slowest, fastest) = (rates.clone().min().unwrap_or(0), rates.max().unwrap_or(0));
        let rate = if slowest == fastest {
            format!("the leak ({}/step)", format_size(slowest))
        } else {
            format!(
                "what leaks ({} to {}/step)",
                format_size(slowest),
                format_size(fastest)
            )
        };
        outln!(
            "yes*: fits the recorded steps only: {rate} goes on, and fills the budget {}",
            when_full(fewest.unwrap_or(0), most.unwrap_or(0))
        );
    }
    if !advice.unchanged.is_empty() {
        outln!("no change: {}", advice.unchanged.join("; "));
    }
    Ok(code)
}
