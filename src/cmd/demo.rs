//! `memsnap demo`: a simulated transformer training run, recorded by memsnap's caching
//! allocator on a simulated 80 GiB GPU, written as a PyTorch snapshot and opened in the viewer.
//!
//! The workload follows what PyTorch does per step, so step detection and the viewer's
//! timeline look like a real run: the forward pass allocates activations and keeps them for
//! backward (the up-slope), backward frees them layer by layer while allocating gradients (the
//! down-slope), the optimizer allocates its state on the first step and temporaries on every
//! step, and `zero_grad(set_to_none=True)` frees the gradients. Every allocation happens in a
//! real function named after the model part (`attention_forward`, `mlp_backward`, `adam_step`,
//! ...), so the recorded native stacks read like a model's call tree.

use std::hint::black_box;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context, Result};
use memsnap_format::{Action, Snapshot};
use memsnap_recorder::{
    CachingAllocator, ContextMode, HistoryMode, HistoryOptions, SimulatedDevice, StackMode, Stream,
};

use crate::cmd::common::{format_size, parse_size};

/// Simulate a transformer training run and open its memory snapshot.
///
/// Runs the model's allocations (parameters, activations, gradients, Adam state) through
/// memsnap's caching allocator on a simulated GPU with native stacks, writes the snapshot,
/// prints a summary and opens the viewer when one is built and a display is available.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  memsnap demo\n  memsnap demo --steps 5 --layers 12 --out run.pickle --no-view\n  memsnap demo --oom-at-step 3"
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
    /// Make step N run out of memory (a batch of very long sequences), as a crashing run would.
    #[arg(long, value_name = "N")]
    pub oom_at_step: Option<u32>,
    /// Memory of the simulated GPU.
    #[arg(long, default_value = "80GiB", value_parser = parse_size)]
    pub device_memory: u64,
    /// Do not open the viewer.
    #[arg(long)]
    pub no_view: bool,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let shape = ModelShape {
        layers: args.layers as usize,
        batch: args.batch,
        seq_len: args.seq_len,
        hidden: args.hidden,
        heads: (args.hidden / 64).max(1),
        vocab: 32_000,
    };
    println!(
        "memsnap demo: training a {}-layer transformer (hidden {}, batch {} x {} tokens) for {} steps on a simulated {} GPU",
        shape.layers,
        shape.hidden,
        shape.batch,
        shape.seq_len,
        args.steps,
        format_size(args.device_memory)
    );

    let allocator = CachingAllocator::new(SimulatedDevice::new(args.device_memory));
    allocator.record_memory_history(HistoryOptions {
        enabled: HistoryMode::All,
        context: ContextMode::All,
        stacks: StackMode::Native,
        max_entries: 1_000_000,
        ..HistoryOptions::default()
    });

    let mut gpu = Gpu {
        allocator: &allocator,
    };
    let outcome = train(&mut gpu, &shape, args.steps, args.oom_at_step);
    match &outcome {
        Ok(()) => println!("trained {} steps", args.steps),
        Err(TrainError::OutOfMemory { step, function }) => println!(
            "step {step}: out of memory in {function} (asked for with --oom-at-step); the run stops here, as a real one would"
        ),
        Err(TrainError::Allocator(err)) => return Err(anyhow::anyhow!("{err}")),
    }

    let snapshot = allocator.snapshot();
    memsnap_format::write_path(&args.out, &snapshot, None)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    println!();
    if let Err(err) = print_info(&args.out) {
        // `memsnap info` reads the file back; if that fails, summarise what we have in memory.
        eprintln!("memsnap: `memsnap info` failed ({err:#}); a short summary instead:");
        print_summary(&snapshot);
    }
    println!();
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
    println!(
        "  {} trace entries: {} alloc, {} free, {} segment_alloc, {} segment_free, {} oom",
        trace.len(),
        count(Action::Alloc),
        count(Action::FreeCompleted),
        count(Action::SegmentAlloc),
        count(Action::SegmentFree),
        count(Action::Oom),
    );
    println!(
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
        (true, _, _) => println!("view it with: memsnap view {}", args.out.display()),
        (false, true, Some(viewer)) => {
            let spawned = Command::new(&viewer)
                .arg(&args.out)
                .stdin(Stdio::null())
                .spawn();
            match spawned {
                Ok(_) => println!("opened {} in {}", args.out.display(), viewer.display()),
                Err(err) => println!(
                    "cannot start {} ({err}); view it with: memsnap view {}",
                    viewer.display(),
                    args.out.display()
                ),
            }
        }
        (false, false, _) => println!(
            "no display (DISPLAY/WAYLAND_DISPLAY unset); view it elsewhere with: memsnap view {}",
            args.out.display()
        ),
        (false, true, None) => println!(
            "the viewer is not built (cargo build --release -p memsnap-viewer); then: memsnap view {}",
            args.out.display()
        ),
    }
}

/// Dimensions of the simulated model. Tensors are fp32.
#[derive(Clone, Debug)]
struct ModelShape {
    layers: usize,
    batch: u64,
    seq_len: u64,
    hidden: u64,
    heads: u64,
    vocab: u64,
}

const F32: u64 = 4;

impl ModelShape {
    fn tokens(&self) -> u64 {
        self.batch * self.seq_len
    }

    /// One `[batch, seq, hidden]` activation.
    fn hidden_states(&self) -> u64 {
        self.tokens() * self.hidden * F32
    }
}

#[derive(Debug)]
enum TrainError {
    OutOfMemory { step: u32, function: &'static str },
    Allocator(String),
}

/// A device tensor: a pointer from the caching allocator and its size.
#[derive(Clone, Copy, Debug)]
struct Tensor {
    ptr: u64,
    bytes: u64,
}

/// The simulated GPU's allocator.
struct Gpu<'a> {
    allocator: &'a CachingAllocator<SimulatedDevice>,
}

/// Allocates `bytes` in the calling function itself. A macro rather than a method, so the
/// innermost frame of the recorded stack is the model function that asked for the memory
/// (`attention_forward`, `adam_step`, ...), which is what `memsnap top` and the viewer show.
macro_rules! empty {
    ($gpu:expr, $bytes:expr, $step:expr, $site:expr) => {{
        let bytes: u64 = $bytes;
        match $gpu.allocator.malloc(bytes, Stream::DEFAULT) {
            Ok(ptr) => Ok(Tensor { ptr, bytes }),
            Err(memsnap_recorder::Error::OutOfMemory(_)) => Err(TrainError::OutOfMemory {
                step: $step,
                function: $site,
            }),
            Err(err) => Err(TrainError::Allocator(err.to_string())),
        }
    }};
}

impl Gpu<'_> {
    fn drop_tensor(&mut self, tensor: Tensor) -> Result<(), TrainError> {
        self.allocator
            .free(tensor.ptr)
            .map_err(|err| TrainError::Allocator(err.to_string()))
    }
}

/// The weights of one transformer block.
struct BlockParams {
    ln1: Tensor,
    qkv: Tensor,
    proj: Tensor,
    ln2: Tensor,
    mlp_up: Tensor,
    mlp_down: Tensor,
}

impl BlockParams {
    fn all(&self) -> [Tensor; 6] {
        [
            self.ln1,
            self.qkv,
            self.proj,
            self.ln2,
            self.mlp_up,
            self.mlp_down,
        ]
    }
}

struct Model {
    embedding: Tensor,
    blocks: Vec<BlockParams>,
    lm_head: Tensor,
}

impl Model {
    fn parameters(&self) -> Vec<Tensor> {
        let mut out = vec![self.embedding];
        out.extend(self.blocks.iter().flat_map(BlockParams::all));
        out.push(self.lm_head);
        out
    }
}

/// What one block keeps from forward for its backward.
struct BlockActivations {
    ln1_out: Tensor,
    qkv: Tensor,
    attention_probs: Tensor,
    attention_out: Tensor,
    ln2_out: Tensor,
    mlp_hidden: Tensor,
    mlp_activation: Tensor,
    block_out: Tensor,
}

/// Adam's `exp_avg` and `exp_avg_sq`, created on the first step.
struct AdamState {
    moments: Vec<(Tensor, Tensor)>,
}

#[inline(never)]
fn train(
    gpu: &mut Gpu,
    shape: &ModelShape,
    steps: u32,
    oom_at: Option<u32>,
) -> Result<(), TrainError> {
    let model = init_model(gpu, shape)?;
    let mut adam = AdamState {
        moments: Vec::new(),
    };
    for step in 1..=steps {
        let long_batch = oom_at == Some(step);
        train_step(gpu, shape, &model, &mut adam, step, long_batch)?;
    }
    black_box(&model);
    Ok(())
}

#[inline(never)]
fn init_model(gpu: &mut Gpu, shape: &ModelShape) -> Result<Model, TrainError> {
    let h = shape.hidden;
    let embedding = empty!(gpu, shape.vocab * h * F32, 0, "init_model")?;
    let mut blocks = Vec::with_capacity(shape.layers);
    for _ in 0..shape.layers {
        blocks.push(init_block(gpu, h)?);
    }
    let lm_head = empty!(gpu, h * shape.vocab * F32, 0, "init_model")?;
    Ok(black_box(Model {
        embedding,
        blocks,
        lm_head,
    }))
}

#[inline(never)]
fn init_block(gpu: &mut Gpu, h: u64) -> Result<BlockParams, TrainError> {
    let site = "init_block";
    Ok(black_box(BlockParams {
        ln1: empty!(gpu, 2 * h * F32, 0, site)?,
        qkv: empty!(gpu, 3 * h * h * F32, 0, site)?,
        proj: empty!(gpu, h * h * F32, 0, site)?,
        ln2: empty!(gpu, 2 * h * F32, 0, site)?,
        mlp_up: empty!(gpu, 4 * h * h * F32, 0, site)?,
        mlp_down: empty!(gpu, 4 * h * h * F32, 0, site)?,
    }))
}

#[inline(never)]
fn train_step(
    gpu: &mut Gpu,
    shape: &ModelShape,
    model: &Model,
    adam: &mut AdamState,
    step: u32,
    long_batch: bool,
) -> Result<(), TrainError> {
    let tokens = empty!(gpu, shape.tokens() * 8, step, "train_step")?;
    let (embedded, saved, logits) = forward(gpu, shape, model, tokens, step, long_batch)?;
    let (loss, probs) = cross_entropy_loss(gpu, shape, logits, step)?;
    let grads = backward(gpu, shape, model, embedded, saved, logits, probs, step)?;
    gpu.drop_tensor(loss)?;
    gpu.drop_tensor(tokens)?;
    adam_step(gpu, model, &grads, adam, step)?;
    zero_grad(gpu, grads)?;
    black_box(step);
    Ok(())
}

type Forward = (Tensor, Vec<BlockActivations>, Tensor);

#[inline(never)]
fn forward(
    gpu: &mut Gpu,
    shape: &ModelShape,
    model: &Model,
    tokens: Tensor,
    step: u32,
    long_batch: bool,
) -> Result<Forward, TrainError> {
    let embedded = embedding_forward(gpu, shape, tokens, step)?;
    let mut saved = Vec::with_capacity(model.blocks.len());
    let mut x = embedded;
    for (i, params) in model.blocks.iter().enumerate() {
        let last = i + 1 == model.blocks.len();
        let activations = block_forward(gpu, shape, params, x, step, long_batch && last)?;
        x = activations.block_out;
        saved.push(activations);
    }
    let logits = lm_head_forward(gpu, shape, x, step)?;
    Ok(black_box((embedded, saved, logits)))
}

#[inline(never)]
fn embedding_forward(
    gpu: &mut Gpu,
    shape: &ModelShape,
    tokens: Tensor,
    step: u32,
) -> Result<Tensor, TrainError> {
    black_box(tokens);
    let out = empty!(gpu, shape.hidden_states(), step, "embedding_forward")?;
    Ok(black_box(out))
}

#[inline(never)]
fn block_forward(
    gpu: &mut Gpu,
    shape: &ModelShape,
    params: &BlockParams,
    x: Tensor,
    step: u32,
    long_batch: bool,
) -> Result<BlockActivations, TrainError> {
    let ln1_out = layer_norm_forward(gpu, shape, x, step)?;
    let (qkv, attention_probs, attention_out) =
        attention_forward(gpu, shape, params, ln1_out, step, long_batch)?;
    let ln2_out = layer_norm_forward(gpu, shape, attention_out, step)?;
    let (mlp_hidden, mlp_activation, block_out) = mlp_forward(gpu, shape, params, ln2_out, step)?;
    Ok(black_box(BlockActivations {
        ln1_out,
        qkv,
        attention_probs,
        attention_out,
        ln2_out,
        mlp_hidden,
        mlp_activation,
        block_out,
    }))
}

#[inline(never)]
fn layer_norm_forward(
    gpu: &mut Gpu,
    shape: &ModelShape,
    x: Tensor,
    step: u32,
) -> Result<Tensor, TrainError> {
    black_box(x);
    // The per-token mean and variance are a temporary; only the normalised output is kept.
    let stats = empty!(gpu, shape.tokens() * 2 * F32, step, "layer_norm_forward")?;
    let out = empty!(gpu, shape.hidden_states(), step, "layer_norm_forward")?;
    gpu.drop_tensor(stats)?;
    Ok(black_box(out))
}

#[inline(never)]
fn attention_forward(
    gpu: &mut Gpu,
    shape: &ModelShape,
    params: &BlockParams,
    x: Tensor,
    step: u32,
    long_batch: bool,
) -> Result<(Tensor, Tensor, Tensor), TrainError> {
    black_box((x, params.qkv, params.proj));
    let site = "attention_forward";
    let qkv = empty!(gpu, 3 * shape.hidden_states(), step, site)?;
    let scores_for =
        |seq_len: u64| shape.batch * shape.heads * seq_len.saturating_mul(seq_len) * F32;
    let scores_bytes = if long_batch {
        // A batch of much longer sequences: the scores grow with the square of the length,
        // past what the device holds.
        let capacity = gpu.allocator.device().capacity();
        let mut seq_len = 16 * shape.seq_len;
        while scores_for(seq_len) <= capacity {
            seq_len *= 2;
        }
        scores_for(seq_len)
    } else {
        scores_for(shape.seq_len)
    };
    let scores = empty!(gpu, scores_bytes, step, site)?;
    let probs = empty!(gpu, scores_bytes, step, site)?;
    gpu.drop_tensor(scores)?;
    let context = empty!(gpu, shape.hidden_states(), step, site)?;
    let out = empty!(gpu, shape.hidden_states(), step, site)?;
    gpu.drop_tensor(context)?;
    Ok(black_box((qkv, probs, out)))
}

#[inline(never)]
fn mlp_forward(
    gpu: &mut Gpu,
    shape: &ModelShape,
    params: &BlockParams,
    x: Tensor,
    step: u32,
) -> Result<(Tensor, Tensor, Tensor), TrainError> {
    black_box((x, params.mlp_up, params.mlp_down));
    let site = "mlp_forward";
    let hidden = empty!(gpu, 4 * shape.hidden_states(), step, site)?;
    let activation = empty!(gpu, 4 * shape.hidden_states(), step, site)?;
    let out = empty!(gpu, shape.hidden_states(), step, site)?;
    Ok(black_box((hidden, activation, out)))
}

#[inline(never)]
fn lm_head_forward(
    gpu: &mut Gpu,
    shape: &ModelShape,
    x: Tensor,
    step: u32,
) -> Result<Tensor, TrainError> {
    black_box(x);
    let logits = empty!(
        gpu,
        shape.tokens() * shape.vocab * F32,
        step,
        "lm_head_forward"
    )?;
    Ok(black_box(logits))
}

#[inline(never)]
fn cross_entropy_loss(
    gpu: &mut Gpu,
    shape: &ModelShape,
    logits: Tensor,
    step: u32,
) -> Result<(Tensor, Tensor), TrainError> {
    black_box(logits);
    let probs = empty!(gpu, logits.bytes, step, "cross_entropy_loss")?;
    let per_token = empty!(gpu, shape.tokens() * F32, step, "cross_entropy_loss")?;
    let loss = empty!(gpu, F32, step, "cross_entropy_loss")?;
    gpu.drop_tensor(per_token)?;
    Ok(black_box((loss, probs)))
}

/// Gradients, one per parameter, in [`Model::parameters`] order.
type Grads = Vec<Tensor>;

#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn backward(
    gpu: &mut Gpu,
    shape: &ModelShape,
    model: &Model,
    embedded: Tensor,
    saved: Vec<BlockActivations>,
    logits: Tensor,
    probs: Tensor,
    step: u32,
) -> Result<Grads, TrainError> {
    let (grad_head, mut grad_x) = lm_head_backward(gpu, shape, model, logits, probs, step)?;
    let mut block_grads = Vec::with_capacity(saved.len());
    for (params, activations) in model.blocks.iter().zip(saved).rev() {
        let (grads, grad_in) = block_backward(gpu, shape, params, activations, grad_x, step)?;
        grad_x = grad_in;
        block_grads.push(grads);
    }
    let grad_embedding = embedding_backward(gpu, model, embedded, grad_x, step)?;
    let mut grads = vec![grad_embedding];
    grads.extend(block_grads.into_iter().rev().flatten());
    grads.push(grad_head);
    Ok(black_box(grads))
}

#[inline(never)]
fn lm_head_backward(
    gpu: &mut Gpu,
    shape: &ModelShape,
    model: &Model,
    logits: Tensor,
    probs: Tensor,
    step: u32,
) -> Result<(Tensor, Tensor), TrainError> {
    let site = "lm_head_backward";
    let grad_logits = empty!(gpu, logits.bytes, step, site)?;
    gpu.drop_tensor(probs)?;
    gpu.drop_tensor(logits)?;
    let grad_head = empty!(gpu, model.lm_head.bytes, step, site)?;
    let grad_x = empty!(gpu, shape.hidden_states(), step, site)?;
    gpu.drop_tensor(grad_logits)?;
    Ok(black_box((grad_head, grad_x)))
}

#[inline(never)]
fn block_backward(
    gpu: &mut Gpu,
    shape: &ModelShape,
    params: &BlockParams,
    saved: BlockActivations,
    grad_out: Tensor,
    step: u32,
) -> Result<([Tensor; 6], Tensor), TrainError> {
    gpu.drop_tensor(saved.block_out)?;
    let (mlp_grads, grad_mid) = mlp_backward(gpu, shape, params, &saved, grad_out, step)?;
    let ln2_grad = layer_norm_backward(gpu, params.ln2, saved.ln2_out, step)?;
    let (attention_grads, grad_in) =
        attention_backward(gpu, shape, params, &saved, grad_mid, step)?;
    let ln1_grad = layer_norm_backward(gpu, params.ln1, saved.ln1_out, step)?;
    let grads = [
        ln1_grad,
        attention_grads.0,
        attention_grads.1,
        ln2_grad,
        mlp_grads.0,
        mlp_grads.1,
    ];
    Ok(black_box((grads, grad_in)))
}

#[inline(never)]
fn mlp_backward(
    gpu: &mut Gpu,
    shape: &ModelShape,
    params: &BlockParams,
    saved: &BlockActivations,
    grad_out: Tensor,
    step: u32,
) -> Result<((Tensor, Tensor), Tensor), TrainError> {
    let site = "mlp_backward";
    let grad_down = empty!(gpu, params.mlp_down.bytes, step, site)?;
    let grad_hidden = empty!(gpu, 4 * shape.hidden_states(), step, site)?;
    gpu.drop_tensor(grad_out)?;
    gpu.drop_tensor(saved.mlp_activation)?;
    let grad_up = empty!(gpu, params.mlp_up.bytes, step, site)?;
    let grad_in = empty!(gpu, shape.hidden_states(), step, site)?;
    gpu.drop_tensor(grad_hidden)?;
    gpu.drop_tensor(saved.mlp_hidden)?;
    Ok(black_box(((grad_up, grad_down), grad_in)))
}

#[inline(never)]
fn attention_backward(
    gpu: &mut Gpu,
    shape: &ModelShape,
    params: &BlockParams,
    saved: &BlockActivations,
    grad_out: Tensor,
    step: u32,
) -> Result<((Tensor, Tensor), Tensor), TrainError> {
    let site = "attention_backward";
    let grad_proj = empty!(gpu, params.proj.bytes, step, site)?;
    gpu.drop_tensor(saved.attention_out)?;
    let grad_scores = empty!(gpu, saved.attention_probs.bytes, step, site)?;
    gpu.drop_tensor(saved.attention_probs)?;
    let grad_qkv_act = empty!(gpu, saved.qkv.bytes, step, site)?;
    gpu.drop_tensor(grad_scores)?;
    gpu.drop_tensor(saved.qkv)?;
    let grad_qkv = empty!(gpu, params.qkv.bytes, step, site)?;
    let grad_in = empty!(gpu, shape.hidden_states(), step, site)?;
    gpu.drop_tensor(grad_qkv_act)?;
    gpu.drop_tensor(grad_out)?;
    Ok(black_box(((grad_qkv, grad_proj), grad_in)))
}

#[inline(never)]
fn layer_norm_backward(
    gpu: &mut Gpu,
    weight: Tensor,
    saved_out: Tensor,
    step: u32,
) -> Result<Tensor, TrainError> {
    let grad = empty!(gpu, weight.bytes, step, "layer_norm_backward")?;
    gpu.drop_tensor(saved_out)?;
    Ok(black_box(grad))
}

#[inline(never)]
fn embedding_backward(
    gpu: &mut Gpu,
    model: &Model,
    embedded: Tensor,
    grad_x: Tensor,
    step: u32,
) -> Result<Tensor, TrainError> {
    let grad = empty!(gpu, model.embedding.bytes, step, "embedding_backward")?;
    gpu.drop_tensor(grad_x)?;
    gpu.drop_tensor(embedded)?;
    Ok(black_box(grad))
}

#[inline(never)]
fn adam_step(
    gpu: &mut Gpu,
    model: &Model,
    grads: &Grads,
    adam: &mut AdamState,
    step: u32,
) -> Result<(), TrainError> {
    let params = model.parameters();
    if adam.moments.is_empty() {
        adam.moments = adam_init_state(gpu, &params, step)?;
    }
    for ((param, grad), moments) in params.iter().zip(grads).zip(&adam.moments) {
        // The bias-corrected update is a temporary the size of the parameter.
        let update = empty!(gpu, param.bytes, step, "adam_step")?;
        black_box((grad, moments));
        gpu.drop_tensor(update)?;
    }
    Ok(())
}

#[inline(never)]
fn adam_init_state(
    gpu: &mut Gpu,
    params: &[Tensor],
    step: u32,
) -> Result<Vec<(Tensor, Tensor)>, TrainError> {
    let mut moments = Vec::with_capacity(params.len());
    for param in params {
        let exp_avg = empty!(gpu, param.bytes, step, "adam_init_state")?;
        let exp_avg_sq = empty!(gpu, param.bytes, step, "adam_init_state")?;
        moments.push((exp_avg, exp_avg_sq));
    }
    Ok(black_box(moments))
}

#[inline(never)]
fn zero_grad(gpu: &mut Gpu, grads: Grads) -> Result<(), TrainError> {
    let count = grads.len();
    for grad in grads {
        gpu.drop_tensor(grad)?;
    }
    // Keeps this frame out of a tail call, so it shows in the free stacks.
    black_box(count);
    Ok(())
}
