//! # memsnap-workload
//!
//! memsnap's one simulated training run. [`generate`] runs a transformer-like training script
//! through the recorder's caching allocator ([`memsnap_recorder::CachingAllocator`], PyTorch's
//! rules) on a simulated GPU, with a fake clock and a seed so the same [`TrainingRun`] always
//! gives the same snapshot, and returns that snapshot plus the [`GroundTruth`] an analysis
//! should recover from it: each step's start, peak and end, its forward / backward / optimizer
//! phases, the role of every allocation, the leak rate, what the ring buffer dropped, the OOM.
//!
//! `memsnap demo`, `memsnap-viewer --demo`, the benchmarks and the tests' ground truth all use
//! it, so what the demo shows is what the tests check.
//!
//! The script, per device:
//!
//! 1. **Set-up**: the parameters (a weight and a small bias per layer) are allocated once
//!    (`build_model`) and live forever.
//! 2. Each **step** (between `ProfilerStep#N` START and END annotations) runs a **forward**
//!    pass that allocates `activations_per_layer` activations per layer and keeps them for
//!    backward (memory rises; a short-lived temporary per layer comes and goes), then a small
//!    loss; with `leak_bytes_per_step` it stores a tensor it never frees (a leak).
//! 3. The **backward** pass, on the autograd engine's thread, walks the layers in reverse:
//!    it allocates the parameters' gradients and an input gradient, then releases the layer's
//!    activations (memory falls). Some activations were used on a side stream
//!    (`record_stream`), so their memory is only reused after that stream's work is done: the
//!    trace has their `free_requested` at once and their `free_completed` at the next
//!    allocation.
//! 4. With `optimizer`, an **Adam** step (inside `Optimizer.step#Adam.step` annotations)
//!    allocates its state on the first step (two moments per parameter) and two temporaries
//!    per parameter every step; then `zero_grad(set_to_none=True)` frees the gradients.
//!
//! Every allocation and free carries the stack PyTorch would record with
//! `_record_memory_history(stacks="all")`: the caching allocator's and ATen's C++ frames, then
//! the script's Python frames (module `forward` calls, `Adam.step`), or the autograd engine's
//! frames for backward work. Requested sizes are never multiples of 512, so the allocator's
//! rounding shows; the final `segments` are the allocator's state at the end; `max_entries`
//! is the recorder's own ring buffer, so a capture can start mid-run.
//!
//! ```
//! use memsnap_workload::{generate, TrainingRun};
//!
//! let (snapshot, truth) = generate(&TrainingRun { steps: 3, ..TrainingRun::default() });
//! assert_eq!(truth.devices[0].steps.len(), 3);
//! assert!(memsnap_format::validate(&snapshot).is_empty());
//! ```

mod rng;
mod script;
mod stacks;

use memsnap_format::Snapshot;

pub use script::generate;

/// The shape of a simulated training run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainingRun {
    /// Devices, each running the same script (data parallel) with its own allocator and trace.
    pub devices: usize,
    /// Training steps (ignored when `target_entries` is set).
    pub steps: usize,
    pub layers: usize,
    /// Activations each layer keeps from forward to backward.
    pub activations_per_layer: usize,
    /// Typical activation size; actual sizes vary around it, and every fourth is much smaller
    /// (normalisation statistics, masks).
    pub activation_bytes: u64,
    /// Parameter bytes per layer (a weight and a small bias); 0 for none.
    pub param_bytes_per_layer: u64,
    /// An Adam optimizer phase: persistent state plus temporaries each step.
    pub optimizer: bool,
    /// Bytes allocated each step and never freed (a leak); 0 for none.
    pub leak_bytes_per_step: u64,
    /// The recorder's ring buffer: keep only the newest N entries per device (and N
    /// annotations), like PyTorch's `max_entries`.
    pub max_entries: Option<usize>,
    /// Run whole steps until each device has recorded about N entries (before the ring buffer
    /// drops any); overrides `steps`.
    pub target_entries: Option<usize>,
    /// `false` writes a 2.1-era file: no `time_us`, `compile_context`, `user_metadata`,
    /// `allocator_settings` or `external_annotations`.
    pub with_time: bool,
    /// `ProfilerStep#N` and `Optimizer.step#Adam.step` START/END annotations (needs
    /// `with_time`).
    pub with_annotations: bool,
    /// About how many distinct call sites (stacks) the script has; at least one per kind.
    pub stack_pool: usize,
    /// Memory of each simulated GPU.
    pub device_memory: u64,
    /// Step N (counting from 0) runs out of memory in its forward pass (a batch of much longer
    /// sequences): the allocator records the `oom` and the run stops there, as a real one
    /// would.
    pub oom_at_step: Option<usize>,
    pub seed: u64,
    /// Percent (0 to 100) of the forward, backward and optimizer allocations that carry the
    /// stack of another phase's call site (a forward allocation with a gradient's autograd
    /// frames or Adam's, a backward one with an activation's module frames, ...), as
    /// activation checkpointing's recompute, hooks, fused optimizers and noisy unwinds make
    /// real stacks lie about their phase. Drawn from a stream of its own, so the sizes and
    /// times are those of the run without noise; the ground truth does not change.
    pub stack_noise_percent: u8,
    /// Record no frames at all: plain `malloc`/`free` without a stack, as PyTorch's
    /// `_record_memory_history(context=None)` / `stacks=None` writes.
    pub frameless: bool,
    /// About how many frames each stack has (0: as the call site has, 25 to 40): each call
    /// site's stack is padded with deeper module nesting up to between 2/3 and 4/3 of this.
    pub stack_depth: usize,
    /// Each allocation and free takes the next stack of its site kind's family in turn, so
    /// every stack of the pool ends up in the trace (up to one per entry); otherwise a site
    /// reuses the few stacks its layer and slot pick, as a real script does.
    pub rotate_stacks: bool,
    /// `record_function`-like START/END annotation pairs per step (`aten::mm`,
    /// `nn.Module: Linear_3`, ...), spread over the forward pass, besides `ProfilerStep#N`.
    pub annotations_per_step: usize,
    /// `torch.cuda.empty_cache()` after every step: the cached segments go back to the device
    /// and the next step maps new ones (segment churn).
    pub empty_cache_every_step: bool,
    /// The allocator's `expandable_segments:True`: the large pool grows and shrinks one
    /// mapped segment (`segment_map` / `segment_unmap` entries).
    pub expandable_segments: bool,
    /// More allocator settings, as `PYTORCH_CUDA_ALLOC_CONF` gives them
    /// (`max_split_size_mb:128,roundup_power2_divisions:4`; empty: none), applied after
    /// `expandable_segments`. Settings the recorder's allocator refuses are left out.
    pub alloc_conf: String,
    /// Layers whose forward is checkpointed (`torch.utils.checkpoint`): their activations are
    /// freed at the end of the layer's forward and made again, in the same order and with the
    /// layer's forward temporary, at the start of the layer's backward (the recomputation).
    pub checkpoint_layers: Vec<usize>,
    /// Activation slots (counting from 0) checkpointed in every layer not in
    /// `checkpoint_layers`, as if each were a sub-module call of the block (with
    /// `ordered_forward_stacks`, slot `a` is made at `model.py:50 + a`) wrapped in
    /// `torch.utils.checkpoint`: freed as soon as it is made, and made again at the start of
    /// the layer's backward, before its gradients.
    pub checkpoint_slots: Vec<usize>,
    /// Sub-modules of every block (`attn`: the first half of its activation slots; `mlp`:
    /// the rest and the layer's temporary) checkpointed in every layer not in
    /// `checkpoint_layers`: the sub-module's activations are freed when its call returns, and
    /// its call is made again (activations and temporary) at the start of the layer's
    /// backward, before its gradients. Other names are ignored.
    pub checkpoint_submodules: Vec<String>,
    /// Micro-batches per step with gradient accumulation (1: none): the forward and backward
    /// passes run this many times on `1/N` of the batch (every size they allocate and free
    /// within them divided by N, rounded up), the gradients are allocated by the first and
    /// accumulated into by the others, and the optimizer steps once.
    pub micro_batches: usize,
    /// Adam's state as a percent of the fp32 state (100: as is; 25: 8-bit Adam; 0: offloaded
    /// to the host, no device memory), rounded up per tensor.
    pub optimizer_state_percent: u8,
    /// Forward stacks in the order the code runs: a layer's activations take the call sites of
    /// its block's `forward` line by line (`model.py:50`, `:51`, ...), so a stack-only analysis
    /// can tell where one block's call ends and the next begins, as in a real model's loop.
    /// Otherwise each activation's site is picked by its layer and slot.
    pub ordered_forward_stacks: bool,
    /// `memsnap.module: PATH` START/END annotations around every module call, as
    /// `memsnap.torch.enable(modules=True)`'s forward hooks record them (needs `with_time`):
    /// `GPT` around the model's forward (its blocks and the loss), `blocks.N` around block N's
    /// forward, `blocks.N.attn` and `blocks.N.mlp` around its two sub-modules, and `Block`
    /// (with `attn` and `mlp` inside) around a checkpointed block's recomputation (run by the
    /// autograd engine's thread, where no module call is running, so the hooks name it by its
    /// class; `Attention` or `MLP` for a checkpointed sub-module's).
    /// A call that runs out of memory still ends its range (the hooks run with
    /// `always_call=True`).
    pub module_ranges: bool,
    /// The tensor `leak_bytes_per_step` makes is freed at the end of its step (after
    /// `zero_grad`): the run with its leak stopped, as `memsnap advise` predicts it.
    pub leak_freed_at_step_end: bool,
}

impl Default for TrainingRun {
    /// A small run: one device, 4 steps of a 4-layer model, about 600 entries.
    fn default() -> Self {
        TrainingRun {
            devices: 1,
            steps: 4,
            layers: 4,
            activations_per_layer: 4,
            activation_bytes: 8 << 20,
            param_bytes_per_layer: 4 << 20,
            optimizer: true,
            leak_bytes_per_step: 0,
            max_entries: None,
            target_entries: None,
            with_time: true,
            with_annotations: true,
            stack_pool: 48,
            device_memory: 80 << 30,
            oom_at_step: None,
            seed: 0,
            stack_noise_percent: 0,
            frameless: false,
            stack_depth: 0,
            rotate_stacks: false,
            annotations_per_step: 0,
            empty_cache_every_step: false,
            expandable_segments: false,
            alloc_conf: String::new(),
            checkpoint_layers: Vec::new(),
            checkpoint_slots: Vec::new(),
            checkpoint_submodules: Vec::new(),
            micro_batches: 1,
            optimizer_state_percent: 100,
            ordered_forward_stacks: false,
            module_ranges: false,
            leak_freed_at_step_end: false,
        }
    }
}

impl TrainingRun {
    /// A GPT-style transformer of `layers` blocks of width `hidden`, trained on batches of
    /// `batch` sequences of `seq_len` tokens, in fp32: each block keeps eight activations of
    /// about `batch × seq_len × hidden` floats and holds `12 × hidden²` parameters.
    pub fn transformer(layers: usize, batch: u64, seq_len: u64, hidden: u64) -> Self {
        const F32: u64 = 4;
        TrainingRun {
            layers,
            activations_per_layer: 8,
            activation_bytes: batch
                .saturating_mul(seq_len)
                .saturating_mul(hidden)
                .saturating_mul(F32),
            param_bytes_per_layer: 12u64.saturating_mul(hidden).saturating_mul(hidden) * F32,
            ..TrainingRun::default()
        }
    }
}

/// What an analysis of the generated snapshot should find.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroundTruth {
    pub devices: Vec<DeviceTruth>,
}

/// The answers for one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceTruth {
    /// The complete steps that lie entirely inside the recorded trace, in order.
    pub steps: Vec<StepTruth>,
    pub leak_bytes_per_step: u64,
    /// Entries the ring buffer dropped (the oldest).
    pub dropped_entries: u64,
    /// Requested bytes live at the start of the recorded trace (allocated before the window).
    pub before_window_bytes: u64,
    /// The window starts with the model's set-up (parameters allocated before the first step).
    pub has_setup: bool,
    /// `(alloc event, role)` of every allocation in the window, in event order.
    pub roles: Vec<(usize, Role)>,
    /// The out-of-memory failure that ended the run (`oom_at_step`), if it is in the window.
    pub oom: Option<OomTruth>,
}

/// Where the run ran out of memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomTruth {
    /// The step (counting from 0) whose forward pass failed.
    pub step: usize,
    /// The `oom` entry in the device's trace.
    pub event: usize,
    /// The request that failed, in bytes.
    pub requested_bytes: u64,
}

/// What an allocation is for, by the categories an analysis should find: the phase that
/// allocates it and the phase whose code frees it (`free_requested`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// A weight or bias: allocated in the set-up, never freed.
    Parameter,
    /// Adam's moments: allocated in the first optimizer phase, never freed.
    OptimizerState,
    /// A parameter's gradient: allocated in backward, freed by `zero_grad` after the optimizer
    /// step.
    Gradient,
    /// Kept from forward for backward, freed there (the loss too).
    Activation,
    /// Freed in the phase that allocated it (forward temporaries, input gradients, the
    /// optimizer's temporaries, and gradients when there is no optimizer phase to outlive).
    Temporary,
    /// Outlives its step without being state (the simulated leak).
    Unknown,
}

impl Role {
    /// The category name an analysis reports (`optimizer_state`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Role::Parameter => "parameter",
            Role::OptimizerState => "optimizer_state",
            Role::Gradient => "gradient",
            Role::Activation => "activation",
            Role::Temporary => "temporary",
            Role::Unknown => "unknown",
        }
    }
}

/// A phase of a simulated step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PhaseName {
    Forward,
    Backward,
    Optimizer,
}

/// One training step. Event indices point into the device's recorded trace; byte counts are
/// the total requested bytes live right after that event, counting memory allocated before
/// the window. An allocation is live from its `alloc` to its `free_completed` (PyTorch's
/// viewer also ignores `free_requested`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepTruth {
    /// The step's first event.
    pub start_event: usize,
    /// The first event after which the step's live bytes are highest.
    pub peak_event: usize,
    /// The step's last event.
    pub end_event: usize,
    pub start_bytes: u64,
    pub peak_bytes: u64,
    pub end_bytes: u64,
    /// Each phase with the event of its first allocation, in order. A step's first event can
    /// lie before its forward phase's first allocation: a `free_completed` deferred from the
    /// step before is recorded just before the next allocation.
    pub phases: Vec<(PhaseName, usize)>,
}

/// The snapshot and its ground truth, as [`generate`] returns them.
pub type Generated = (Snapshot, GroundTruth);
