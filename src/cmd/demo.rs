//! `memsnap demo`: memsnap's simulated training run (`memsnap-workload`), recorded by the
//! recorder's caching allocator on a simulated GPU, written as a PyTorch snapshot and opened
//! in the viewer.
//!
//! The workload is the one the viewer's `--demo`, the benchmarks and the tests' ground truth
//! use: a transformer-like model whose forward pass keeps its activations (the up-slope),
//! whose backward pass on the autograd engine's thread frees them while creating gradients
//! (the down-slope), then an Adam step (state on the first step, temporaries on every step)
//! and `zero_grad`. Stacks are the Python and C++ frames PyTorch records with
//! `stacks="all"`; times come from a fake clock, so the same arguments give the same file.

use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context, Result};
use memsnap_format::{Action, Snapshot};
use memsnap_workload::{generate, TrainingRun};

use crate::cmd::common::{format_size, parse_size};

/// Simulate a transformer training run and open its memory snapshot.
///
/// Runs the model's allocations (parameters, activations, gradients, Adam state) through
/// memsnap's caching allocator on a simulated GPU, with the Python and C++ stacks PyTorch
/// would record and `ProfilerStep#N` annotations, writes the snapshot, prints what is in it
/// and opens the viewer when one is built and a display is available. The same arguments
/// always give the same file (a fake clock and `--seed`).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  memsnap demo\n  memsnap demo --steps 5 --layers 12 --out run.pickle --no-view\n  memsnap demo --oom-at-step 3\n  memsnap demo --leak 64MiB --steps 8   # a tensor kept every step: watch the drift\n  memsnap demo --checkpoint --micro-batches 2 --optimizer-state-percent 25   # what `memsnap advise` suggested\n  memsnap demo --modules --checkpoint-blocks 0-2   # blocks named as enable(modules=True) records them; blocks.0 to blocks.2 checkpointed"
)]
pub struct Args {
    /// Where to write the snapshot (.pickle, .msgpack or .json; .gz/.zst compress).
    #[arg(long, default_value = "memsnap-demo.pickle")]
    pub out: PathBuf,
    /// Training steps to run.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub steps: u32,
    /// Transformer layers.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=512))]
    pub layers: u32,
    /// Sequences per batch.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub batch: u64,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub seq_len: u64,
    /// Model width.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(64..=65536))]
    pub hidden: u64,
    /// Make step N (counting from 1) run out of memory (a batch of very long sequences), as a
    /// crashing run would.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub oom_at_step: Option<u32>,
    /// Bytes a step keeps and never frees (a leak), e.g. 64MiB.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub leak: u64,
    /// Free the --leak tensor at the end of its step: the run with its leak stopped, as
    /// `memsnap advise` predicts it ("stop keeping what metrics.py:33:record makes every step").
    #[arg(long, requires = "leak")]
    pub free_leak: bool,
    /// Memory of the simulated GPU.
    #[arg(long, default_value = "80GiB", value_parser = parse_size)]
    pub device_memory: u64,
    /// Seed of the run's sizes and timings.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Checkpoint every block (`torch.utils.checkpoint`): activations dropped after each
    /// block's forward and recomputed at the start of its backward.
    #[arg(long, conflicts_with = "checkpoint_blocks")]
    pub checkpoint: bool,
    /// Checkpoint blocks FIRST to LAST only (counting from 0, as `blocks.0`), e.g. 0-2.
    #[arg(long, value_name = "FIRST-LAST", value_parser = parse_block_range)]
    pub checkpoint_blocks: Option<(u32, u32)>,
    /// Checkpoint a sub-module of every block instead: `attn` (the first half of its
    /// activations) or `mlp` (the rest); repeat for both.
    #[arg(long, value_name = "attn|mlp", value_parser = ["attn", "mlp"])]
    pub checkpoint_sub_module: Vec<String>,
    /// Record module names, as `memsnap.torch.enable(modules=True)`'s forward hooks do: a
    /// `memsnap.module: PATH` range around the model's call (`GPT`), each block's (`blocks.0`,
    /// `blocks.1`, ...) and its sub-modules' (`blocks.0.attn`, `blocks.0.mlp`).
    #[arg(long)]
    pub modules: bool,
    /// Micro-batches per step, with gradient accumulation.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub micro_batches: u32,
    /// Adam's state in percent of fp32 (25: 8-bit Adam, 0: offloaded to the host).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub optimizer_state_percent: u8,
    /// Do not open the viewer.
    #[arg(long)]
    pub no_view: bool,
}

/// `FIRST-LAST` (or one block, `N`) with FIRST <= LAST.
fn parse_block_range(s: &str) -> Result<(u32, u32), String> {
    let (first, last) = s.split_once('-').unwrap_or((s, s));
    let number = |t: &str| {
        t.trim()
            .parse::<u32>()
            .map_err(|_| format!("{s:?}: expected FIRST-LAST, such as 0-2"))
    };
    let (first, last) = (number(first)?, number(last)?);
    if first > last {
        return Err(format!("{s:?}: the first block comes after the last"));
    }
    Ok((first, last))
}

pub fn run(args: Args) -> Result<ExitCode> {
    if let Some((first, last)) = args.checkpoint_blocks {
        anyhow::ensure!(
            last < args.layers,
            "--checkpoint-blocks {first}-{last}: the model has {} blocks (0 to {})",
            args.layers,
            args.layers - 1
        );
    }
    let run = TrainingRun {
        steps: args.steps as usize,
        leak_bytes_per_step: args.leak,
        leak_freed_at_step_end: args.free_leak,
        device_memory: args.device_memory,
        oom_at_step: args.oom_at_step.map(|n| n as usize - 1),
        seed: args.seed,
        checkpoint_layers: match (args.checkpoint, args.checkpoint_blocks) {
            (true, _) => (0..args.layers as usize).collect(),
            (false, Some((first, last))) => (first as usize..=last as usize).collect(),
            (false, None) => Vec::new(),
        },
        checkpoint_submodules: args.checkpoint_sub_module.clone(),
        module_ranges: args.modules,
        micro_batches: args.micro_batches as usize,
        optimizer_state_percent: args.optimizer_state_percent,
        // Each block's forward line by line, as real code runs: `memsnap advise` finds where
        // one block's call ends from the stacks.
        ordered_forward_stacks: true,
        ..TrainingRun::transformer(args.layers as usize, args.batch, args.seq_len, args.hidden)
    };
    outln!(
        "memsnap demo: training a {}-layer transformer (hidden {}, batch {} x {} tokens) for {} steps on a simulated {} GPU",
        args.layers,
        args.hidden,
        args.batch,
        args.seq_len,
        args.steps,
        format_size(args.device_memory)
    );

    let (snapshot, truth) = generate(&run);
    let device = truth.devices.first().cloned().unwrap_or_default();
    match device.oom {
        None => outln!("trained {} steps", device.steps.len()),
        Some(oom) if args.oom_at_step.is_some() => outln!(
            "step {}: out of memory in the forward pass, asking for {} (--oom-at-step); the run stops here, as a real one would",
            oom.step + 1,
            format_size(oom.requested_bytes)
        ),
        Some(oom) => outln!(
            "step {}: out of memory asking for {} (the GPU holds {}); the run stops here, as a real one would",
            oom.step + 1,
            format_size(oom.requested_bytes),
            format_size(args.device_memory)
        ),
    }

    memsnap_format::write_path(&args.out, &snapshot, None)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    outln!("wrote {}", args.out.display());
    outln!();
    if let Err(err) = print_info(&args.out) {
        // `memsnap info` reads the file back; if that fails, summarise what we have in memory.
        eprintln!("memsnap: `memsnap info` failed ({err:#}); a short summary instead:");
        print_summary(&snapshot);
    }
    outln!();
    outln!(
        "its steps, phases and peak: memsnap summary {}",
        args.out.display()
    );
    open_viewer(&args);
    Ok(ExitCode::SUCCESS)
}

/// Runs `memsnap info` on the written file (the same output as the command).
fn print_info(path: &std::path::Path) -> Result<()> {
    use clap::{Args as _, FromArgMatches};
    let command = crate::cmd::info::Args::augment_args(clap::Command::new("info"));
    let matches = command.try_get_matches_from([std::ffi::OsStr::new("info"), path.as_os_str()])?;
    let args = crate::cmd::info::Args::from_arg_matches(&matches)?;
    let code = crate::cmd::info::run(args)?;
    anyhow::ensure!(
        code == ExitCode::SUCCESS,
        "`memsnap info` could not read it"
    );
    Ok(())
}

/// A short summary of the snapshot (entries, segments, peak), in the spirit of `memsnap info`.
fn print_summary(snapshot: &Snapshot) {
    let trace = snapshot.traces().first().map(Vec::as_slice).unwrap_or(&[]);
    let count = |action: Action| trace.iter().filter(|e| e.action == action).count();
    let mut live = 0i128;
    let mut peak = 0i128;
    for entry in trace {
        match entry.action {
            Action::Alloc => live += i128::from(entry.size),
            Action::FreeCompleted => live -= i128::from(entry.size),
            _ => {}
        }
        peak = peak.max(live);
    }
    let reserved: u64 = snapshot.segments.iter().map(|s| s.total_size).sum();
    outln!(
        "  {} trace entries: {} alloc, {} free, {} segment_alloc, {} segment_free, {} oom",
        trace.len(),
        count(Action::Alloc),
        count(Action::FreeCompleted),
        count(Action::SegmentAlloc),
        count(Action::SegmentFree),
        count(Action::Oom),
    );
    outln!(
        "  {} segments reserving {}; peak allocated during the trace {}; {} distinct stacks",
        snapshot.segments.len(),
        format_size(reserved),
        format_size(u64::try_from(peak).unwrap_or(0)),
        snapshot.stacks.len()
    );
}

/// Opens the viewer on the snapshot when one is built and a display exists.
fn open_viewer(args: &Args) {
    let display = ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    let viewer = crate::cmd::view::viewer_path();
    match (args.no_view, display, viewer) {
        (true, _, _) => outln!("view it with: memsnap view {}", args.out.display()),
        (false, true, Some(viewer)) => {
            let spawned = Command::new(&viewer)
                .arg(&args.out)
                .stdin(Stdio::null())
                .spawn();
            match spawned {
                Ok(_) => outln!("opened {} in {}", args.out.display(), viewer.display()),
                Err(err) => outln!(
                    "cannot start {} ({err}); view it with: memsnap view {}",
                    viewer.display(),
                    args.out.display()
                ),
            }
        }
        (false, false, _) => outln!(
            "no display (DISPLAY/WAYLAND_DISPLAY unset); view it elsewhere with: memsnap view {}",
            args.out.display()
        ),
        (false, true, None) => outln!(
            "the viewer is not built (cargo build --release -p memsnap-viewer); then: memsnap view {}",
            args.out.display()
        ),
    }
}
