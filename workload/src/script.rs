//! The training script, run through the recorder, and the ground truth read off its trace.

use std::time::Duration;

use memsnap_format::{Action, Snapshot};
use memsnap_recorder::snapshot::merge_device_snapshots;
use memsnap_recorder::{
    CachingAllocator, ContextMode, GivenStack, HistoryMode, HistoryOptions, SimulatedDevice,
    StackMode, Stream,
};

use crate::rng::Rng;
use crate::stacks::{CallSites, Site, SITES};
use crate::{DeviceTruth, GroundTruth, OomTruth, PhaseName, Role, StepTruth, TrainingRun};

/// The stream tensors used on a second stream are recorded on (`record_stream`).
const SIDE_STREAM: Stream = Stream(7);

/// Mixed into a device's seed for the stack-noise draws, so that turning noise on leaves the
/// main stream's draws (sizes, times) as they were.
const NOISE_STREAM: u64 = 0x6e6f_6973_795f_7374;

/// `record_function` names of the extra annotations (`annotations_per_step`), besides the
/// layer's `nn.Module: Linear_N`.
const OPERATOR_ANNOTATIONS: [&str; 6] = [
    "aten::mm",
    "aten::addmm",
    "aten::native_layer_norm",
    "aten::gelu",
    "aten::native_dropout",
    "aten::_scaled_dot_product_efficient_attention",
];

/// Simulates `run` and returns the snapshot and its ground truth. Deterministic: the same
/// `run` gives the same snapshot on every machine.
pub fn generate(run: &TrainingRun) -> (Snapshot, GroundTruth) {
    let sites = CallSites::new(run.stack_pool, run.stack_depth);
    let start_us = 1_760_000_000_000_000 + (run.seed % 10_000_000) as i64 * 1_000;
    let devices = run.devices.max(1);
    let mut snapshots = Vec::with_capacity(devices);
    let mut truths = Vec::with_capacity(devices);
    for device in 0..devices {
        let device_seed = run
            .seed
            .wrapping_mul(0x2545_f491_4f6c_dd1d)
            .wrapping_add(device as u64);
        let gpu =
            CachingAllocator::new(SimulatedDevice::new(run.device_memory).with_manual_events())
                .with_device_index(device as i64);
        if run.expandable_segments {
            // The simulated device has virtual memory, so the setting takes effect.
            let _ = gpu.set_allocator_settings("expandable_segments:True");
        }
        if !run.alloc_conf.is_empty() {
            let _ = gpu.set_allocator_settings(&run.alloc_conf);
        }
        gpu.use_manual_clock(start_us + device as i64 * 37);
        gpu.record_memory_history(HistoryOptions {
            enabled: HistoryMode::All,
            context: ContextMode::All,
            // Stacks come from the script (`malloc_with_stack`), not from unwinding this
            // process.
            stacks: StackMode::None,
            max_entries: run.max_entries.unwrap_or(usize::MAX).max(1),
            ..HistoryOptions::default()
        });
        // Each stack's frames are made, registered and dropped one at a time (the recorder
        // keeps its own copy): a pool of deep stacks is held once, not twice.
        let stacks = if run.frameless {
            Vec::new()
        } else {
            sites.register(|frames| gpu.register_stack(frames))
        };
        let mut sim = DeviceRun {
            run,
            gpu,
            stacks,
            rng: Rng::new(device_seed),
            noise: Rng::new(device_seed ^ NOISE_STREAM),
            cursors: [0; SITES.len()],
            roles: Vec::new(),
            steps: Vec::new(),
            phases: Vec::new(),
            opening: None,
            oom: None,
            saved: Vec::new(),
            leak_this_step: None,
        };
        // A run that stops early (out of memory) keeps what it recorded.
        let _ = sim.simulate();
        let DeviceRun {
            gpu,
            roles,
            steps,
            oom,
            ..
        } = sim;
        let snapshot = gpu.into_snapshot();
        let record = Record { roles, steps, oom };
        truths.push(record.truth(run, &snapshot, device));
        snapshots.push(snapshot);
    }
    let mut snapshot = if snapshots.len() == 1 {
        snapshots.pop().unwrap_or_else(|| Snapshot::new(1))
    } else {
        merge_device_snapshots(snapshots, |frames| frames)
    };
    if let Some(info) = snapshot.recorder_info.as_mut() {
        info.producer = concat!(
            "memsnap-workload ",
            env!("CARGO_PKG_VERSION"),
            " (memsnap-recorder on a simulated GPU)"
        )
        .into();
    }
    if !run.with_time {
        strip_to_2_1(&mut snapshot);
    }
    (snapshot, GroundTruth { devices: truths })
}

/// Removes what PyTorch 2.1 did not write: times, compile contexts, user metadata, allocator
/// settings and annotations.
fn strip_to_2_1(snapshot: &mut Snapshot) {
    let strings = &snapshot.strings;
    for trace in snapshot.device_traces.iter_mut().flatten() {
        for entry in trace {
            entry.set_time_us(None);
            entry.set_compile_context(None, strings);
            entry.set_user_metadata(None, strings);
        }
    }
    snapshot.allocator_settings = None;
    snapshot.external_annotations = None;
}

/// Why the script stopped before its end.
#[derive(Debug)]
enum Stop {
    OutOfMemory,
    Allocator,
}

/// A live tensor: its pointer and requested size.
#[derive(Clone, Copy)]
struct Tensor {
    ptr: u64,
    bytes: u64,
}

/// A recorded step, by absolute entry index (as if the ring kept everything).
struct StepMarks {
    /// Index of the step's first entry.
    start: u64,
    /// One past the step's last entry.
    end: u64,
    /// Each phase with the index of its first allocation among all allocations.
    phases: Vec<(PhaseName, usize)>,
}

struct DeviceRun<'a> {
    run: &'a TrainingRun,
    gpu: CachingAllocator<SimulatedDevice>,
    /// The registered stacks of each site kind, in [`SITES`] order.
    stacks: Vec<Vec<GivenStack>>,
    rng: Rng,
    /// Draws for `stack_noise_percent` only.
    noise: Rng,
    /// Per site kind, the next stack of its family (`rotate_stacks`).
    cursors: [usize; SITES.len()],
    /// The role of every successful allocation, in order.
    roles: Vec<Role>,
    steps: Vec<StepMarks>,
    /// Phases of the step being run.
    phases: Vec<(PhaseName, usize)>,
    /// The phase the next allocation opens.
    opening: Option<PhaseName>,
    /// (step, absolute index of the `oom` entry, bytes requested).
    oom: Option<(usize, u64, u64)>,
    /// The activations each block of the forward being run keeps for its backward.
    saved: Vec<Vec<Tensor>>,
    /// The step's leak, when `leak_freed_at_step_end` frees it at the end of the step.
    leak_this_step: Option<Tensor>,
}

impl DeviceRun<'_> {
    fn stack(&mut self, site: Site, key: usize) -> Option<GivenStack> {
        let kind = SITES.iter().position(|&s| s == site)?;
        let family = self.stacks.get(kind)?;
        let key = if self.run.rotate_stacks {
            let next = self.cursors[kind];
            self.cursors[kind] = next.wrapping_add(1);
            next
        } else {
            key
        };
        family.get(key % family.len().max(1)).copied()
    }

    /// The site whose stack an allocation at `site` carries: itself, or with
    /// `stack_noise_percent` another phase's site kind (forward work with backward or
    /// optimizer frames, backward work with forward or optimizer frames, the optimizer with
    /// forward or backward frames). Set-up, leak and free sites keep theirs.
    fn noisy(&mut self, site: Site) -> Site {
        let percent = u64::from(self.run.stack_noise_percent.min(100));
        if percent == 0 {
            return site;
        }
        let others: &[Site] = match site {
            Site::Activation | Site::ForwardTemporary | Site::Loss => &[
                Site::Gradient,
                Site::InputGradient,
                Site::OptimizerTemporary,
            ],
            Site::Gradient | Site::InputGradient => &[
                Site::Activation,
                Site::ForwardTemporary,
                Site::OptimizerTemporary,
            ],
            Site::OptimizerState | Site::OptimizerTemporary => {
                &[Site::Activation, Site::Gradient, Site::InputGradient]
            }
            _ => return site,
        };
        if self.noise.range(0, 99) >= percent {
            return site;
        }
        let pick = self.noise.range(0, others.len() as u64 - 1) as usize;
        others.get(pick).copied().unwrap_or(site)
    }

    /// Time passes between two calls into the allocator.
    fn pause(&mut self, min_us: u64, max_us: u64) {
        let us = self.rng.range(min_us, max_us);
        self.gpu.advance_clock(Duration::from_micros(us));
    }

    fn malloc(
        &mut self,
        bytes: u64,
        site: Site,
        key: usize,
        role: Role,
        step: usize,
    ) -> Result<Tensor, Stop> {
        self.pause(1, 40);
        let stack_site = self.noisy(site);
        let result = match self.stack(stack_site, key) {
            Some(stack) => self.gpu.malloc_with_stack(bytes, Stream::DEFAULT, stack),
            None => self.gpu.malloc(bytes, Stream::DEFAULT),
        };
        match result {
            Ok(ptr) => {
                let index = self.roles.len();
                self.roles.push(role);
                if let Some(phase) = self.opening.take() {
                    self.phases.push((phase, index));
                }
                Ok(Tensor { ptr, bytes })
            }
            Err(memsnap_recorder::Error::OutOfMemory(_)) => {
                // The `oom` entry is the last one the failed call recorded.
                let event = self.gpu.recorded_entries().saturating_sub(1);
                self.oom = Some((step, event, bytes));
                Err(Stop::OutOfMemory)
            }
            Err(_) => Err(Stop::Allocator),
        }
    }

    fn free(&mut self, tensor: Tensor, site: Site, key: usize) -> Result<(), Stop> {
        self.pause(1, 40);
        let result = match self.stack(site, key) {
            Some(stack) => self.gpu.free_with_stack(tensor.ptr, stack),
            None => self.gpu.free(tensor.ptr),
        };
        result.map_err(|_| Stop::Allocator)
    }

    /// Frees a tensor that was also used on the side stream: the `free_requested` comes now,
    /// the `free_completed` at the next allocation (once the side stream's work is done).
    fn free_later(&mut self, tensor: Tensor, site: Site, key: usize) -> Result<(), Stop> {
        self.gpu.record_stream(tensor.ptr, SIDE_STREAM);
        self.free(tensor, site, key)?;
        self.gpu.device().complete_stream(SIDE_STREAM);
        Ok(())
    }

    fn annotate(&mut self, stage: &str, name: &str) {
        if self.run.with_time && self.run.with_annotations {
            self.pause(1, 5);
            self.gpu
                .record_annotation(&[("stage", stage), ("name", name)]);
        }
    }

    /// Runs `call` inside a `memsnap.module: PATH` range (`TrainingRun::module_ranges`); the
    /// range ends also when the call fails, as the hooks' `always_call=True` makes it.
    fn in_module<T>(
        &mut self,
        path: &str,
        call: impl FnOnce(&mut Self) -> Result<T, Stop>,
    ) -> Result<T, Stop> {
        let recorded = self.run.with_time && self.run.module_ranges;
        let name = format!("memsnap.module: {path}");
        if recorded {
            self.pause(1, 5);
            self.gpu
                .record_annotation(&[("stage", "START"), ("name", &name)]);
        }
        let result = call(self);
        if recorded {
            self.pause(1, 5);
            self.gpu
                .record_annotation(&[("stage", "END"), ("name", &name)]);
        }
        result
    }

    /// Requested sizes are element counts times 2 (bf16), never multiples of 512 by design.
    fn activation_sizes(&mut self) -> Vec<Vec<u64>> {
        let base = self.run.activation_bytes.max(2);
        let rng = &mut self.rng;
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

    /// `count` `record_function`-like START/END pairs for `layer`: the module, then the
    /// operators it calls.
    fn extra_annotations(&mut self, layer: usize, count: usize) {
        for k in 0..count {
            let name = if k % 2 == 0 {
                format!("nn.Module: Linear_{layer}")
            } else {
                OPERATOR_ANNOTATIONS[(k / 2) % OPERATOR_ANNOTATIONS.len()].to_owned()
            };
            self.annotate("START", &name);
            self.annotate("END", &name);
        }
    }

    fn simulate(&mut self) -> Result<(), Stop> {
        let run = self.run;
        let weight_bytes = run.param_bytes_per_layer - run.param_bytes_per_layer / 64;
        let bias_bytes = run.param_bytes_per_layer / 64;
        let mut params: Vec<Vec<Tensor>> = Vec::with_capacity(run.layers);
        for layer in 0..run.layers {
            let mut layer_params = Vec::with_capacity(2);
            for (i, bytes) in [weight_bytes, bias_bytes].into_iter().enumerate() {
                if bytes > 0 {
                    let key = layer * 2 + i;
                    layer_params.push(self.malloc(
                        bytes,
                        Site::Parameter,
                        key,
                        Role::Parameter,
                        0,
                    )?);
                }
            }
            params.push(layer_params);
        }
        self.pause(100_000, 2_000_000);

        let shapes = self.activation_sizes();
        let mut optimizer_state = Vec::new();
        for step in 0.. {
            let finished = match run.target_entries {
                Some(target) => self.gpu.recorded_entries() >= target as u64,
                None => step >= run.steps,
            };
            if finished {
                break;
            }
            let name = format!("ProfilerStep#{step}");
            self.annotate("START", &name);
            self.phases.clear();
            let start = self.gpu.recorded_entries();
            self.step(step, &shapes, &params, &mut optimizer_state)?;
            let end = self.gpu.recorded_entries();
            self.annotate("END", &name);
            if run.empty_cache_every_step {
                // Between steps: its `segment_free`s (or `segment_unmap`s) belong to no step.
                self.gpu.empty_cache().map_err(|_| Stop::Allocator)?;
            }
            if end == start {
                // A step that records nothing would never reach the target.
                break;
            }
            let phases = std::mem::take(&mut self.phases);
            self.steps.push(StepMarks { start, end, phases });
            self.pause(2_000, 50_000);
        }
        Ok(())
    }

    /// One micro-batch's forward and backward passes (`TrainingRun::micro_batches`): the
    /// gradients are allocated into `grads` by the first only.
    fn forward_backward(
        &mut self,
        step: usize,
        shapes: &[Vec<u64>],
        params: &[Vec<Tensor>],
        micro_batch: usize,
        gradient: Role,
        grads: &mut Vec<Tensor>,
    ) -> Result<(), Stop> {
        let run = self.run;
        let first = micro_batch == 0;
        let parts = run.micro_batches.max(1) as u64;
        // A micro-batch's share of a batch-sized request.
        let part = |bytes: u64| bytes.div_ceil(parts);
        // Forward: activations pile up, one temporary per layer comes and goes.
        if first {
            self.opening = Some(PhaseName::Forward);
        }
        let loss = self.in_module("GPT", |this| this.model_forward(step, shapes, micro_batch))?;
        let mut saved = std::mem::take(&mut self.saved);
        if run.leak_bytes_per_step > 0 && first {
            let bytes = run.leak_bytes_per_step;
            let leak = self.malloc(bytes, Site::Leak, step, Role::Unknown, step)?;
            if run.leak_freed_at_step_end {
                self.leak_this_step = Some(leak);
            }
        }
        self.pause(50, 500);

        // Backward: gradients appear, activations go.
        if first {
            self.opening = Some(PhaseName::Backward);
        }
        let mut grad_output: Option<Tensor> = None;
        for layer in (0..run.layers).rev() {
            let mut saved_here = saved.pop().unwrap_or_default();
            if run.checkpoint_layers.contains(&layer) {
                // The recomputation: the layer's forward again, its activations kept for its
                // backward.
                saved_here = self.in_module("Block", |this| {
                    this.layer_forward(layer, &shapes[layer], step, LayerPass::Recompute)
                })?;
            } else if !run.checkpoint_slots.is_empty() || !run.checkpoint_submodules.is_empty() {
                self.sub_recompute(layer, &shapes[layer], &mut saved_here, step)?;
            }
            if first {
                // Later micro-batches accumulate into these in place.
                for (i, param) in params[layer].iter().enumerate() {
                    let key = layer * 2 + i;
                    grads.push(self.malloc(param.bytes, Site::Gradient, key, gradient, step)?);
                }
            }
            let input_bytes = part(shapes[layer].first().copied().unwrap_or(2));
            let grad_input = self.malloc(
                input_bytes,
                Site::InputGradient,
                layer,
                Role::Temporary,
                step,
            )?;
            if let Some(previous) = grad_output.replace(grad_input) {
                self.free(previous, Site::BackwardRelease, layer)?;
            }
            for (a, activation) in saved_here.into_iter().enumerate() {
                if (layer + a + step) % 7 == 3 {
                    self.free_later(activation, Site::BackwardRelease, a)?;
                } else {
                    self.free(activation, Site::BackwardRelease, a)?;
                }
            }
            self.pause(10, 200);
        }
        if let Some(last) = grad_output {
            self.free(last, Site::BackwardRelease, 0)?;
        }
        self.free(loss, Site::BackwardRelease, 0)?;

        Ok(())
    }

    /// The model's forward (one micro-batch's): the blocks, each keeping its activations in
    /// `self.saved` for the backward, then the loss, which is returned.
    fn model_forward(
        &mut self,
        step: usize,
        shapes: &[Vec<u64>],
        micro_batch: usize,
    ) -> Result<Tensor, Stop> {
        let run = self.run;
        let first = micro_batch == 0;
        let parts = run.micro_batches.max(1) as u64;
        self.saved = Vec::with_capacity(run.layers);
        let mut extra_annotations = if first { run.annotations_per_step } else { 0 };
        if shapes.is_empty() {
            self.extra_annotations(0, extra_annotations);
        }
        for (layer, sizes) in shapes.iter().enumerate() {
            // This layer's share of the step's extra annotations.
            let share = extra_annotations.div_ceil(shapes.len() - layer);
            extra_annotations -= share;
            self.extra_annotations(layer, share);
            let checkpointed = run.checkpoint_layers.contains(&layer);
            let mut kept = self.in_module(&format!("blocks.{layer}"), |this| {
                this.layer_forward(
                    layer,
                    sizes,
                    step,
                    LayerPass::Forward {
                        whole: checkpointed,
                    },
                )
            })?;
            if checkpointed {
                // Only the layer's input is saved; what it made is dropped now and made again
                // in backward.
                for activation in kept.drain(..) {
                    self.free(activation, Site::ForwardTemporary, layer)?;
                }
            }
            if run.oom_at_step == Some(step) && layer + 1 == shapes.len() {
                // A batch of much longer sequences: the attention scores alone outgrow the
                // device.
                let scores = run.device_memory | 2;
                self.malloc(scores, Site::Activation, 4, Role::Activation, step)?;
            }
            self.saved.push(kept);
            self.pause(10, 200);
        }
        self.malloc(4u64.div_ceil(parts), Site::Loss, 0, Role::Activation, step)
    }

    /// A layer's forward: its activations in order (a micro-batch's share of each), then its
    /// temporary, which comes and goes. Returns the activations.
    ///
    /// The block calls two sub-modules, `attn` (the first half of the activation slots) and
    /// `mlp` (the rest and the temporary), each in a `memsnap.module:` range of its own with
    /// `TrainingRun::module_ranges`. In a forward of a layer not checkpointed whole, an
    /// activation checkpointed on its own (`TrainingRun::checkpoint_slots`) is freed as soon
    /// as it is made (its call returns), and those of a checkpointed sub-module
    /// (`TrainingRun::checkpoint_submodules`) when the sub-module's call returns;
    /// [`Self::sub_recompute`] makes them again in the backward. Their places in the returned
    /// vector hold the freed tensors until then.
    fn layer_forward(
        &mut self,
        layer: usize,
        sizes: &[u64],
        step: usize,
        pass: LayerPass,
    ) -> Result<Vec<Tensor>, Stop> {
        let run = self.run;
        let role = match pass {
            LayerPass::Forward { whole: true } => Role::Temporary,
            _ => Role::Activation,
        };
        let parts = run.micro_batches.max(1) as u64;
        let mut kept = Vec::with_capacity(sizes.len());
        for (name, slots) in sub_modules(sizes.len()) {
            let with_temporary = name == "mlp";
            let dropped_sub = pass == (LayerPass::Forward { whole: false })
                && run.checkpoint_submodules.iter().any(|s| s == name);
            let path = match pass {
                LayerPass::Forward { .. } => format!("blocks.{layer}.{name}"),
                // The hooks name a module called inside the recomputation's `Block` from it.
                LayerPass::Recompute => name.to_owned(),
            };
            let first = kept.len();
            self.in_module(&path, |this| {
                for a in slots {
                    let key = this.activation_key(layer, a);
                    let bytes = sizes[a].div_ceil(parts);
                    let dropped_slot = pass == (LayerPass::Forward { whole: false })
                        && run.checkpoint_slots.contains(&a);
                    let role = if dropped_slot || dropped_sub {
                        Role::Temporary
                    } else {
                        role
                    };
                    let tensor = this.malloc(bytes, Site::Activation, key, role, step)?;
                    if dropped_slot && !dropped_sub {
                        this.free(tensor, Site::ForwardTemporary, layer)?;
                    }
                    kept.push(tensor);
                }
                if with_temporary {
                    this.temporary(layer, sizes, step)?;
                }
                Ok(())
            })?;
            if dropped_sub {
                for &tensor in &kept[first..] {
                    self.free(tensor, Site::ForwardTemporary, layer)?;
                }
            }
        }
        Ok(kept)
    }

    /// The layer's forward temporary (a third of its largest activation), made and freed.
    fn temporary(&mut self, layer: usize, sizes: &[u64], step: usize) -> Result<(), Stop> {
        if let Some(&largest) = sizes.iter().max() {
            let parts = self.run.micro_batches.max(1) as u64;
            let bytes = (largest / 3 + 2).div_ceil(parts);
            let temporary =
                self.malloc(bytes, Site::ForwardTemporary, layer, Role::Temporary, step)?;
            self.free(temporary, Site::ForwardTemporary, layer)?;
        }
        Ok(())
    }

    /// The stack key of activation slot `a` of `layer`.
    fn activation_key(&self, layer: usize, a: usize) -> usize {
        if self.run.ordered_forward_stacks {
            a
        } else {
            layer * 7 + a
        }
    }

    /// The recomputation, at the start of a layer's backward, of what its forward freed early
    /// (see [`Self::layer_forward`]), in slot order, into the places in `saved`: a checkpointed
    /// sub-module's call again (its activations and temporary; in a range named by its class,
    /// `Attention` or `MLP`: the autograd engine's thread runs it, where no module call is
    /// running), and each slot checkpointed on its own.
    fn sub_recompute(
        &mut self,
        layer: usize,
        sizes: &[u64],
        saved: &mut [Tensor],
        step: usize,
    ) -> Result<(), Stop> {
        let run = self.run;
        let parts = run.micro_batches.max(1) as u64;
        for (name, slots) in sub_modules(sizes.len()) {
            let whole = run.checkpoint_submodules.iter().any(|s| s == name);
            let remade: Vec<usize> = slots
                .filter(|a| whole || run.checkpoint_slots.contains(a))
                .collect();
            if remade.is_empty() {
                continue;
            }
            let class = if name == "mlp" { "MLP" } else { "Attention" };
            let mut remake = |this: &mut Self| -> Result<(), Stop> {
                for &a in &remade {
                    let key = this.activation_key(layer, a);
                    let bytes = sizes[a].div_ceil(parts);
                    let tensor =
                        this.malloc(bytes, Site::Activation, key, Role::Activation, step)?;
                    if let Some(place) = saved.get_mut(a) {
                        *place = tensor;
                    }
                }
                if whole && name == "mlp" {
                    this.temporary(layer, sizes, step)?;
                }
                Ok(())
            };
            if whole {
                self.in_module(class, remake)?;
            } else {
                remake(self)?;
            }
        }
        Ok(())
    }

    fn step(
        &mut self,
        step: usize,
        shapes: &[Vec<u64>],
        params: &[Vec<Tensor>],
        optimizer_state: &mut Vec<Tensor>,
    ) -> Result<(), Stop> {
        let run = self.run;
        let micro_batches = run.micro_batches.max(1);
        // Without an optimizer phase, zero_grad frees the gradients in the backward phase.
        let gradient = if run.optimizer {
            Role::Gradient
        } else {
            Role::Temporary
        };
        let mut grads = Vec::new();
        for micro_batch in 0..micro_batches {
            self.forward_backward(step, shapes, params, micro_batch, gradient, &mut grads)?;
        }

        let params: Vec<Tensor> = params.iter().flatten().copied().collect();
        if run.optimizer {
            self.annotate("START", "Optimizer.step#Adam.step");
            self.opening = Some(PhaseName::Optimizer);
            let percent = u64::from(run.optimizer_state_percent.min(100));
            if optimizer_state.is_empty() && percent > 0 {
                for (i, param) in params.iter().enumerate() {
                    for moment in 0..2 {
                        let key = i * 2 + moment;
                        let role = Role::OptimizerState;
                        let bytes = param.bytes.saturating_mul(percent).div_ceil(100);
                        let state = self.malloc(bytes, Site::OptimizerState, key, role, step)?;
                        optimizer_state.push(state);
                    }
                }
            }
            for (i, param) in params.iter().enumerate() {
                let site = Site::OptimizerTemporary;
                let numerator = self.malloc(param.bytes, site, i * 2, Role::Temporary, step)?;
                let denominator =
                    self.malloc(param.bytes, site, i * 2 + 1, Role::Temporary, step)?;
                self.free(numerator, site, i * 2)?;
                self.free(denominator, site, i * 2 + 1)?;
            }
            self.annotate("END", "Optimizer.step#Adam.step");
        }
        // zero_grad(set_to_none=True)
        for (i, grad) in grads.into_iter().enumerate() {
            self.free(grad, Site::ZeroGrad, i)?;
        }
        if let Some(leak) = self.leak_this_step.take() {
            self.free(leak, Site::Leak, step)?;
        }
        Ok(())
    }
}

/// Which run of a layer's forward [`DeviceRun::layer_forward`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LayerPass {
    /// The step's forward; `whole`: the layer is checkpointed whole (`checkpoint_layers`).
    Forward { whole: bool },
    /// A checkpointed layer's recomputation in its backward.
    Recompute,
}

/// A block's two sub-modules and the activation slots each makes: `attn` the first half,
/// `mlp` the rest (and the layer's temporary). A layer of one activation has only `mlp`.
fn sub_modules(slots: usize) -> [(&'static str, std::ops::Range<usize>); 2] {
    let half = slots / 2;
    [("attn", 0..half), ("mlp", half..slots)]
}

/// What a device's run did, by allocation and absolute entry index, to be mapped onto the
/// window the recorder kept.
struct Record {
    roles: Vec<Role>,
    steps: Vec<StepMarks>,
    oom: Option<(usize, u64, u64)>,
}

impl Record {
    /// The answers for this device, read off its recorded window.
    fn truth(&self, run: &TrainingRun, snapshot: &Snapshot, device: usize) -> DeviceTruth {
        let trace: &[memsnap_format::TraceEntry] =
            snapshot.traces().get(device).map_or(&[], Vec::as_slice);
        let dropped = snapshot
            .recorder_info
            .as_ref()
            .and_then(|info| info.dropped_entries.get(device).copied())
            .unwrap_or(0);

        // The k-th `alloc` of the window is the allocation made after all those dropped.
        let alloc_events: Vec<usize> = trace
            .iter()
            .enumerate()
            .filter(|(_, e)| e.action == Action::Alloc)
            .map(|(i, _)| i)
            .collect();
        let first_in_window = self.roles.len().saturating_sub(alloc_events.len());
        let event_of = |allocation: usize| {
            allocation
                .checked_sub(first_in_window)
                .and_then(|k| alloc_events.get(k).copied())
        };
        let roles = alloc_events
            .iter()
            .zip(&self.roles[first_in_window..])
            .map(|(&e, &r)| (e, r))
            .collect();

        // Live requested bytes at the end are those of the active blocks; what the window
        // adds up to, taken from them, was live before it.
        let live_at_end: u128 = snapshot
            .segments
            .iter()
            .filter(|s| s.device == device as i64)
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state.is_active())
            .map(|b| u128::from(b.requested_size.unwrap_or(b.size)))
            .sum();
        let (added, removed) = trace
            .iter()
            .fold((0u128, 0u128), |(a, r), e| match e.action {
                Action::Alloc => (a + u128::from(e.size), r),
                Action::FreeCompleted => (a, r + u128::from(e.size)),
                _ => (a, r),
            });
        let before_window_bytes =
            u64::try_from((live_at_end + removed).saturating_sub(added)).unwrap_or(u64::MAX);
        // The steps in the window (they never overlap), then one pass over the trace that
        // fills in their bytes.
        let mut steps: Vec<StepTruth> = self
            .steps
            .iter()
            .filter(|s| s.start >= dropped && s.end > s.start)
            .filter_map(|s| {
                let start_event = usize::try_from(s.start - dropped).ok()?;
                let end_event = usize::try_from(s.end - 1 - dropped).ok()?;
                let phases = s
                    .phases
                    .iter()
                    .map(|&(p, allocation)| Some((p, event_of(allocation)?)))
                    .collect::<Option<Vec<_>>>()?;
                (end_event < trace.len()).then_some(StepTruth {
                    start_event,
                    peak_event: start_event,
                    end_event,
                    phases,
                    ..StepTruth::default()
                })
            })
            .collect();
        let mut live = before_window_bytes;
        let mut next = 0;
        for (i, e) in trace.iter().enumerate() {
            match e.action {
                Action::Alloc => live = live.saturating_add(e.size),
                Action::FreeCompleted => live = live.saturating_sub(e.size),
                _ => {}
            }
            let Some(step) = steps.get_mut(next) else {
                break;
            };
            if i < step.start_event {
                continue;
            }
            if i == step.start_event {
                step.start_bytes = live;
            }
            if i == step.start_event || live > step.peak_bytes {
                step.peak_bytes = live;
                step.peak_event = i;
            }
            if i == step.end_event {
                step.end_bytes = live;
                next += 1;
            }
        }
        let oom = self.oom.and_then(|(step, event, requested_bytes)| {
            Some(OomTruth {
                step,
                event: usize::try_from(event.checked_sub(dropped)?).ok()?,
                requested_bytes,
            })
        });
        DeviceTruth {
            steps,
            leak_bytes_per_step: run.leak_bytes_per_step,
            dropped_entries: dropped,
            before_window_bytes,
            has_setup: dropped == 0 && run.param_bytes_per_layer > 0 && run.layers > 0,
            roles,
            oom,
        }
    }
}
