//! Synthetic training-run snapshots with known answers.
//!
//! [`generate`] simulates a training script on top of a small model of PyTorch's caching
//! allocator and returns the snapshot PyTorch would have written, plus the [`GroundTruth`] an
//! analysis should recover from it (per-step start, peak and end, each step's forward /
//! backward / optimizer phases, the role of every allocation, the leak rate, what the ring
//! buffer dropped).
//!
//! The simulated script, per device:
//!
//! 1. **Parameters** (a weight and a bias per layer) are allocated once and live forever.
//! 2. Each **step** runs a **forward** pass that allocates `activations_per_layer` activations
//!    per layer and keeps them for backward (memory rises; a short-lived temporary per layer
//!    comes and goes), computes a small loss, and, with `leak_bytes_per_step`, stores a tensor
//!    that is never freed (a leak).
//! 3. The **backward** pass walks the layers in reverse: it allocates the parameter gradients
//!    and an input gradient, then frees the layer's activations (memory falls). Some frees
//!    complete later (`free_requested` now, `free_completed` at the next allocation), as with
//!    tensors used on a side stream.
//! 4. With `optimizer`, an **Adam-like step** allocates its state once (two buffers per
//!    parameter) and two temporaries per parameter each step; then `zero_grad` frees the
//!    gradients.
//!
//! The allocator rounds block sizes to 512 bytes while the trace keeps the requested sizes, uses
//! 2 MiB segments for blocks of 1 MiB or less and 20 MiB (or 2 MiB-rounded) segments for larger
//! ones, best fit with splitting and merging; the final `segments` list is its state at the end.
//! With `max_entries` the trace is cut to the newest entries exactly like PyTorch's ring buffer,
//! so it starts mid-run.
//!
//! The output passes [`crate::validate()`] and is deterministic for a given [`TrainingRun`].

mod allocator;
mod rng;
mod stacks;

use allocator::{CachingAllocator, EventSink};
use rng::Rng;
use stacks::{CallSites, Site};

use crate::intern::{StackId, StrId};
use crate::model::{Action, AllocatorSettings, Annotation, RecorderInfo, Snapshot, TraceEntry};
use crate::value::Value;

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
    /// Typical activation size; actual sizes vary around it, and some are much smaller.
    pub activation_bytes: u64,
    /// Parameter bytes per layer (a weight and a small bias); 0 for none.
    pub param_bytes_per_layer: u64,
    /// An Adam-like optimizer phase: persistent state plus temporaries each step.
    pub optimizer: bool,
    /// Bytes allocated each step and never freed (a leak); 0 for none.
    pub leak_bytes_per_step: u64,
    /// Ring buffer: keep only the newest N entries per device (and N annotations), like
    /// PyTorch's `max_entries`.
    pub max_entries: Option<usize>,
    /// Run whole steps until each device has recorded about N entries (before the ring buffer
    /// drops any); overrides `steps`.
    pub target_entries: Option<usize>,
    /// `false` writes a 2.1-era file: no `time_us`, `compile_context`, `user_metadata`,
    /// `allocator_settings` or `external_annotations`.
    pub with_time: bool,
    /// `external_annotations` START/END for `ProfilerStep#i` and `Optimizer.step#Adam.step`
    /// (needs `with_time`).
    pub with_annotations: bool,
    /// About how many distinct call sites (stacks) the script has; at least 8.
    pub stack_pool: usize,
    pub seed: u64,
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
            seed: 0,
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
    /// The steps that lie entirely inside the emitted trace, in order.
    pub steps: Vec<StepTruth>,
    pub leak_bytes_per_step: u64,
    /// Entries the ring buffer dropped (the oldest).
    pub dropped_entries: u64,
    /// Requested bytes live at the start of the emitted trace (allocated before the window).
    pub before_window_bytes: u64,
    /// The window starts with the model's set-up (parameters allocated before the first step).
    pub has_setup: bool,
    /// `(alloc event, role)` of every allocation in the window, in event order.
    pub roles: Vec<(usize, Role)>,
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

/// One training step. Event indices point into the device's emitted trace; byte counts are the
/// total requested bytes live right after that event, counting memory allocated before the
/// window. An allocation is live from its `alloc` to its `free_completed` (PyTorch's viewer
/// also ignores `free_requested`).
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

/// Simulates `run` and returns the snapshot and its ground truth.
pub fn generate(run: &TrainingRun) -> (Snapshot, GroundTruth) {
    let mut snapshot = Snapshot::new(run.devices);
    let sites = CallSites::new(&mut snapshot, run.stack_pool);
    let no_stack = snapshot.intern_stack(std::iter::empty());
    let stamps = run.with_time.then(|| EntryStamps {
        compile_context: snapshot.strings.intern("N/A"),
        user_metadata: snapshot.strings.intern(""),
    });
    let start_us = 1_760_000_000_000_000 + (run.seed % 10_000_000) as i64 * 1_000;

    let mut traces = Vec::with_capacity(run.devices);
    let mut truths = Vec::with_capacity(run.devices);
    let mut annotations = Vec::new();
    for device in 0..run.devices {
        let device_seed = run
            .seed
            .wrapping_mul(0x2545_f491_4f6c_dd1d)
            .wrapping_add(device as u64);
        let mut sim = DeviceRun {
            run,
            device,
            sites: &sites,
            allocator: CachingAllocator::new(
                0x7f00_0000_0000 + device as u64 * 0x40_0000_0000,
                device_seed ^ 0x5eed,
            ),
            recorder: Recorder {
                entries: Vec::new(),
                live_bytes: 0,
                clock_us: start_us + device as i64 * 37,
                rng: Rng::new(device_seed),
                stamps,
                step: None,
            },
            annotations: Vec::new(),
            steps: Vec::new(),
            roles: Vec::new(),
            phases: Vec::new(),
            opening: None,
        };
        sim.simulate();
        let DeviceRun {
            allocator,
            recorder,
            annotations: device_annotations,
            steps,
            roles,
            ..
        } = sim;
        snapshot
            .segments
            .extend(allocator.export(device as i64, no_stack));
        let (trace, truth) = cut_window(recorder.entries, steps, roles, run);
        traces.push(trace);
        truths.push(truth);
        annotations.extend(device_annotations);
    }

    let dropped = truths.iter().map(|t| t.dropped_entries).collect();
    snapshot.device_traces = Some(traces);
    snapshot.recorder_info = Some(RecorderInfo {
        producer: concat!("memsnap-format synth ", env!("CARGO_PKG_VERSION")).into(),
        dropped_entries: dropped,
        extra: Vec::new(),
        dropped_entries_exact: None,
    });
    if run.with_time {
        snapshot.allocator_settings = Some(allocator_settings());
        let mut kept = Vec::new();
        if run.with_annotations {
            // One global ring buffer, oldest first.
            annotations.sort_by_key(|a: &Annotation| a.time_us);
            let skip = run
                .max_entries
                .map_or(0, |max| annotations.len().saturating_sub(max.max(1)));
            kept = annotations.split_off(skip);
        }
        snapshot.external_annotations = Some(kept);
    }
    (snapshot, GroundTruth { devices: truths })
}

/// Applies the ring buffer to a device's full trace and maps the step answers into it.
fn cut_window(
    mut entries: Vec<TraceEntry>,
    steps: Vec<StepTruth>,
    roles: Vec<(usize, Role)>,
    run: &TrainingRun,
) -> (Vec<TraceEntry>, DeviceTruth) {
    let dropped = run
        .max_entries
        .map_or(0, |max| entries.len().saturating_sub(max.max(1)));
    let before_window_bytes = entries[..dropped]
        .iter()
        .fold(0u64, |live, e| apply(live, e.action, e.size));
    entries.drain(..dropped);
    let steps = steps
        .into_iter()
        .filter(|s| s.start_event >= dropped)
        .map(|s| StepTruth {
            start_event: s.start_event - dropped,
            peak_event: s.peak_event - dropped,
            end_event: s.end_event - dropped,
            phases: s.phases.iter().map(|&(p, e)| (p, e - dropped)).collect(),
            ..s
        })
        .collect();
    let roles = roles
        .into_iter()
        .filter(|&(e, _)| e >= dropped)
        .map(|(e, r)| (e - dropped, r))
        .collect();
    let truth = DeviceTruth {
        steps,
        leak_bytes_per_step: run.leak_bytes_per_step,
        dropped_entries: dropped as u64,
        before_window_bytes,
        has_setup: dropped == 0 && run.param_bytes_per_layer > 0 && run.layers > 0,
        roles,
    };
    (entries, truth)
}

/// Live requested bytes after an event.
fn apply(live: u64, action: Action, size: u64) -> u64 {
    match action {
        Action::Alloc => live.saturating_add(size),
        Action::FreeCompleted => live.saturating_sub(size),
        _ => live,
    }
}

/// The 2.10-era defaults.
fn allocator_settings() -> AllocatorSettings {
    let divisions = (0..16)
        .map(|i| ((1u64 << i).to_string(), 0.into()))
        .collect();
    AllocatorSettings {
        alloc_conf: Some(String::new()),
        max_split_size: Some((-1).into()),
        garbage_collection_threshold: Some(0.0),
        expandable_segments: Some(false),
        pinned_num_register_threads: Some(1.into()),
        release_lock_on_cudamalloc: Some(false),
        pinned_use_cuda_host_register: Some(false),
        graph_capture_record_stream_reuse: Some(false),
        roundup_power2_divisions: Some(divisions),
        max_round_threshold: None,
        max_cached_size: None,
        extra: Vec::new(),
    }
}

/// The per-entry strings of 2.10+ files.
#[derive(Clone, Copy)]
struct EntryStamps {
    compile_context: StrId,
    user_metadata: StrId,
}

/// A step being recorded: absolute indices into the full trace.
struct StepProgress {
    start: Option<(usize, u64)>,
    peak: (usize, u64),
}

/// Turns allocator events into trace entries, with the clock and the live-byte count.
struct Recorder {
    entries: Vec<TraceEntry>,
    live_bytes: u64,
    clock_us: i64,
    rng: Rng,
    stamps: Option<EntryStamps>,
    step: Option<StepProgress>,
}

impl EventSink for Recorder {
    fn record(&mut self, action: Action, addr: u64, size: u64, stack: Option<StackId>) {
        self.clock_us += self.rng.range(1, 40) as i64;
        self.live_bytes = apply(self.live_bytes, action, size);
        let mut entry = TraceEntry::new(action, addr, size, 0);
        entry.frames = stack;
        if let Some(stamps) = self.stamps {
            entry.time_us = Some(self.clock_us);
            entry.compile_context = Some(stamps.compile_context);
            entry.user_metadata = Some(stamps.user_metadata);
        }
        let index = self.entries.len();
        self.entries.push(entry);
        if let Some(step) = &mut self.step {
            if step.start.is_none() {
                step.start = Some((index, self.live_bytes));
                step.peak = (index, self.live_bytes);
            } else if self.live_bytes > step.peak.1 {
                step.peak = (index, self.live_bytes);
            }
        }
    }
}

impl Recorder {
    fn pause(&mut self, min_us: u64, max_us: u64) {
        self.clock_us += self.rng.range(min_us, max_us) as i64;
    }
}

/// A live tensor: its block address and requested size.
#[derive(Clone, Copy)]
struct Tensor {
    addr: u64,
    bytes: u64,
}

struct DeviceRun<'a> {
    run: &'a TrainingRun,
    device: usize,
    sites: &'a CallSites,
    allocator: CachingAllocator,
    recorder: Recorder,
    annotations: Vec<Annotation>,
    steps: Vec<StepTruth>,
    roles: Vec<(usize, Role)>,
    /// Phases of the step being simulated, with their first allocation's event.
    phases: Vec<(PhaseName, usize)>,
    /// The phase the next allocation opens.
    opening: Option<PhaseName>,
}

impl DeviceRun<'_> {
    fn malloc(&mut self, bytes: u64, site: Site, key: usize, role: Role) -> Tensor {
        let stack = self.sites.pick(site, key);
        let addr = self.allocator.malloc(bytes, stack, &mut self.recorder);
        // The allocator records the `alloc` last.
        let event = self.recorder.entries.len() - 1;
        self.roles.push((event, role));
        if let Some(phase) = self.opening.take() {
            self.phases.push((phase, event));
        }
        Tensor { addr, bytes }
    }

    fn free(&mut self, tensor: Tensor) {
        self.allocator.free(tensor.addr, false, &mut self.recorder);
    }

    fn free_later(&mut self, tensor: Tensor) {
        self.allocator.free(tensor.addr, true, &mut self.recorder);
    }

    fn annotate(&mut self, stage: &str, name: String) {
        if !(self.run.with_time && self.run.with_annotations) {
            return;
        }
        self.recorder.pause(1, 5);
        self.annotations.push(Annotation {
            metadata: vec![
                ("stage".into(), Value::Str(stage.into())),
                ("name".into(), Value::Str(name)),
            ],
            device: self.device as i64,
            time_us: self.recorder.clock_us,
            extra: Vec::new(),
            exact: Default::default(),
        });
    }

    /// Requested sizes are element counts times 2 (bf16), never multiples of 512 by design.
    fn activation_sizes(&mut self) -> Vec<Vec<u64>> {
        let base = self.run.activation_bytes.max(2);
        let rng = &mut self.recorder.rng;
        (0..self.run.layers)
            .map(|_| {
                (0..self.run.activations_per_layer)
                    .map(|a| {
                        let bytes = if a % 4 == 3 {
                            // Normalisation statistics and masks: small-pool sizes.
                            rng.range(2, (base / 64).clamp(2, 1 << 20))
                        } else {
                            rng.range(base / 2, base.saturating_add(base / 2))
                        };
                        let even = bytes.max(2) & !1;
                        if even % 512 == 0 {
                            even + 2
                        } else {
                            even
                        }
                    })
                    .collect()
            })
            .collect()
    }

    fn simulate(&mut self) {
        let run = self.run;
        let weight_bytes = run.param_bytes_per_layer - run.param_bytes_per_layer / 64;
        let bias_bytes = run.param_bytes_per_layer / 64;
        let mut params: Vec<Vec<Tensor>> = Vec::with_capacity(run.layers);
        for layer in 0..run.layers {
            let mut layer_params = Vec::with_capacity(2);
            for (i, bytes) in [weight_bytes, bias_bytes].into_iter().enumerate() {
                if bytes > 0 {
                    layer_params.push(self.malloc(
                        bytes,
                        Site::Parameter,
                        layer * 2 + i,
                        Role::Parameter,
                    ));
                }
            }
            params.push(layer_params);
        }
        self.recorder.pause(100_000, 2_000_000);

        let shapes = self.activation_sizes();
        let mut optimizer_state = Vec::new();
        for step in 0.. {
            let finished = match run.target_entries {
                Some(target) => self.recorder.entries.len() >= target,
                None => step >= run.steps,
            };
            if finished {
                break;
            }
            let before = self.recorder.entries.len();
            self.recorder.step = Some(StepProgress {
                start: None,
                peak: (0, 0),
            });
            self.annotate("START", format!("ProfilerStep#{step}"));
            self.phases.clear();
            self.step(step, &shapes, &params, &mut optimizer_state);
            self.annotate("END", format!("ProfilerStep#{step}"));
            let progress = self.recorder.step.take();
            let end_event = self.recorder.entries.len();
            match progress {
                Some(StepProgress {
                    start: Some((start_event, start_bytes)),
                    peak: (peak_event, peak_bytes),
                }) if end_event > before => self.steps.push(StepTruth {
                    start_event,
                    peak_event,
                    end_event: end_event - 1,
                    start_bytes,
                    peak_bytes,
                    end_bytes: self.recorder.live_bytes,
                    phases: std::mem::take(&mut self.phases),
                }),
                // A step that allocates nothing would never reach the target.
                _ => break,
            }
            self.recorder.pause(2_000, 50_000);
        }
    }

    fn step(
        &mut self,
        step: usize,
        shapes: &[Vec<u64>],
        params: &[Vec<Tensor>],
        optimizer_state: &mut Vec<Tensor>,
    ) {
        let run = self.run;
        // Forward: activations pile up, one temporary per layer comes and goes.
        self.opening = Some(PhaseName::Forward);
        let mut saved: Vec<Vec<Tensor>> = Vec::with_capacity(run.layers);
        for (layer, sizes) in shapes.iter().enumerate() {
            let mut kept = Vec::with_capacity(sizes.len());
            for (a, &bytes) in sizes.iter().enumerate() {
                kept.push(self.malloc(bytes, Site::Activation, layer * 7 + a, Role::Activation));
            }
            if let Some(&largest) = sizes.iter().max() {
                let temporary = self.malloc(
                    largest / 3 + 2,
                    Site::ForwardTemporary,
                    layer,
                    Role::Temporary,
                );
                self.free(temporary);
            }
            saved.push(kept);
            self.recorder.pause(10, 200);
        }
        let loss = self.malloc(4, Site::Loss, 0, Role::Activation);
        if run.leak_bytes_per_step > 0 {
            self.malloc(run.leak_bytes_per_step, Site::Leak, step, Role::Unknown);
        }
        self.recorder.pause(50, 500);

        // Backward: gradients appear, activations go.
        self.opening = Some(PhaseName::Backward);
        // Without an optimizer phase, zero_grad frees the gradients in the backward phase.
        let gradient = if run.optimizer {
            Role::Gradient
        } else {
            Role::Temporary
        };
        let mut grads = Vec::new();
        let mut grad_output: Option<Tensor> = None;
        for layer in (0..run.layers).rev() {
            for (i, param) in params[layer].iter().enumerate() {
                grads.push(self.malloc(param.bytes, Site::Gradient, layer * 2 + i, gradient));
            }
            let input_bytes = shapes[layer].first().copied().unwrap_or(2);
            let grad_input =
                self.malloc(input_bytes, Site::Gradient, 1000 + layer, Role::Temporary);
            if let Some(previous) = grad_output.replace(grad_input) {
                self.free(previous);
            }
            for (a, activation) in saved.pop().unwrap_or_default().into_iter().enumerate() {
                if (layer + a + step) % 7 == 3 {
                    self.free_later(activation);
                } else {
                    self.free(activation);
                }
            }
            self.recorder.pause(10, 200);
        }
        if let Some(last) = grad_output {
            self.free(last);
        }
        self.free(loss);

        let params: Vec<Tensor> = params.iter().flatten().copied().collect();
        if run.optimizer {
            self.annotate("START", "Optimizer.step#Adam.step".into());
            self.opening = Some(PhaseName::Optimizer);
            if optimizer_state.is_empty() {
                for (i, param) in params.iter().enumerate() {
                    for moment in 0..2 {
                        let state = self.malloc(
                            param.bytes,
                            Site::OptimizerState,
                            i * 2 + moment,
                            Role::OptimizerState,
                        );
                        optimizer_state.push(state);
                    }
                }
            }
            for (i, param) in params.iter().enumerate() {
                let numerator = self.malloc(
                    param.bytes,
                    Site::OptimizerTemporary,
                    i * 2,
                    Role::Temporary,
                );
                let denominator = self.malloc(
                    param.bytes,
                    Site::OptimizerTemporary,
                    i * 2 + 1,
                    Role::Temporary,
                );
                self.free(numerator);
                self.free(denominator);
            }
            self.annotate("END", "Optimizer.step#Adam.step".into());
        }
        // zero_grad(set_to_none=True)
        for grad in grads {
            self.free(grad);
        }
    }
}
