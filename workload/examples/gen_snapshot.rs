//! Writes a synthetic training-run snapshot (see `memsnap_workload`).
//!
//! ```text
//! cargo run --release -p memsnap-workload --example gen_snapshot -- --entries 1000000 -o big.pickle
//! ```
//!
//! The format comes from the file name (`.pickle`, `.json`, `.msgpack`, optionally `.gz` or
//! `.zst`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use memsnap_workload::{generate, TrainingRun};

const USAGE: &str = "\
usage: gen_snapshot -o PATH [options]

  -o, --output PATH       file to write; format from the extension (.pickle .json .msgpack [.gz|.zst])
      --entries N         about N trace entries per device (overrides --steps)
      --steps N           training steps (default 4)
      --devices N         devices (default 1)
      --layers N          layers (default 4)
      --activations N     activations kept per layer (default 4)
      --max-entries N     ring buffer: keep the newest N entries per device
      --leak BYTES        bytes leaked per step (default 0)
      --no-optimizer      no Adam-like optimizer phase
      --no-time           2.1-era file without time_us
      --no-annotations    no external_annotations
      --stacks N          distinct call sites (default 48)
      --seed N            random seed (default 0)
      --activation-bytes B  typical activation size (default 8388608)
      --param-bytes B     parameter bytes per layer (default 4194304)
      --device-memory B   simulated GPU memory (default 85899345920)
      --stack-noise PCT   percent of forward/backward/optimizer allocations carrying another
                          phase's stack (default 0)
      --frameless         record no frames (context=None)
      --stack-depth N     pad stacks to about N frames (2/3 N to 4/3 N; default 0: 25-40)
      --rotate-stacks     every allocation and free takes the next stack of its kind, so the
                          whole --stacks pool appears in the trace
      --annotations-per-step N  extra record_function START/END pairs per step (default 0)
      --empty-cache       torch.cuda.empty_cache() after every step (segment churn)
      --expandable        expandable_segments:True (segment_map/segment_unmap)
      --modules           memsnap.module: PATH ranges around every module call, as
                          memsnap.torch.enable(modules=True) records them";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("gen_snapshot: {message}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let mut spec = TrainingRun::default();
    let mut output: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .ok_or_else(|| format!("{name} needs a value\n\n{USAGE}"))
        };
        match arg.as_str() {
            "-o" | "--output" => output = Some(PathBuf::from(value(&arg)?)),
            "--entries" => spec.target_entries = Some(number(&arg, &value(&arg)?)?),
            "--steps" => spec.steps = number(&arg, &value(&arg)?)?,
            "--devices" => spec.devices = number(&arg, &value(&arg)?)?,
            "--layers" => spec.layers = number(&arg, &value(&arg)?)?,
            "--activations" => spec.activations_per_layer = number(&arg, &value(&arg)?)?,
            "--max-entries" => spec.max_entries = Some(number(&arg, &value(&arg)?)?),
            "--leak" => spec.leak_bytes_per_step = number(&arg, &value(&arg)?)?,
            "--stacks" => spec.stack_pool = number(&arg, &value(&arg)?)?,
            "--seed" => spec.seed = number(&arg, &value(&arg)?)?,
            "--activation-bytes" => spec.activation_bytes = number(&arg, &value(&arg)?)?,
            "--param-bytes" => spec.param_bytes_per_layer = number(&arg, &value(&arg)?)?,
            "--device-memory" => spec.device_memory = number(&arg, &value(&arg)?)?,
            "--stack-noise" => {
                spec.stack_noise_percent = number(&arg, &value(&arg)?)?;
                if spec.stack_noise_percent > 100 {
                    return Err(format!("{arg}: a percentage is at most 100"));
                }
            }
            "--frameless" => spec.frameless = true,
            "--stack-depth" => spec.stack_depth = number(&arg, &value(&arg)?)?,
            "--rotate-stacks" => spec.rotate_stacks = true,
            "--annotations-per-step" => {
                spec.annotations_per_step = number(&arg, &value(&arg)?)?;
            }
            "--empty-cache" => spec.empty_cache_every_step = true,
            "--expandable" => spec.expandable_segments = true,
            "--modules" => spec.module_ranges = true,
            "--no-optimizer" => spec.optimizer = false,
            "--no-time" => spec.with_time = false,
            "--no-annotations" => spec.with_annotations = false,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}\n\n{USAGE}")),
        }
    }
    let output = output.ok_or_else(|| format!("missing -o PATH\n\n{USAGE}"))?;

    let started = Instant::now();
    let (snapshot, truth) = generate(&spec);
    let generated = started.elapsed();
    let format = memsnap_format::write_path(&output, &snapshot, None).map_err(|e| e.to_string())?;
    let written = started.elapsed() - generated;

    let steps: usize = truth.devices.iter().map(|d| d.steps.len()).sum();
    let annotations = snapshot.external_annotations.as_ref().map_or(0, Vec::len);
    // Segment churn in the trace (the final `segments` are only what is left at the end).
    let churn = snapshot
        .traces()
        .iter()
        .flatten()
        .filter(|e| {
            use memsnap_format::Action::*;
            matches!(
                e.action,
                SegmentAlloc | SegmentFree | SegmentMap | SegmentUnmap
            )
        })
        .count();
    println!(
        "{}: {} entries on {} device(s), {} segments, {churn} segment entries, {} stacks, \
         {annotations} annotations, {steps} complete steps; \
         generated in {:.3} s, encoded as {} and written in {:.3} s",
        output.display(),
        snapshot.entry_count(),
        snapshot.traces().len(),
        snapshot.segments.len(),
        snapshot.stacks.len(),
        generated.as_secs_f64(),
        format.name(),
        written.as_secs_f64(),
    );
    Ok(())
}

fn number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{flag}: {text:?} is not a valid number"))
}
