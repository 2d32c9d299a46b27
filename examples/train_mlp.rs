//! Trains a small MLP on host memory with every tensor allocated through memsnap's caching
//! allocator, and writes the memory history as a PyTorch snapshot.
//!
//! ```text
//! cargo run --release --example train_mlp -- mlp.pickle
//! memsnap view mlp.pickle
//! ```
//!
//! Each step shows the shape of real training: the forward pass allocates and keeps every
//! layer's pre-activation and activation (the up-slope), the backward pass frees them layer by
//! layer while gradients appear (the down-slope), Adam creates its two moment buffers on the
//! first step, and dropping the gradients ends the step. The loss goes down: the math is real.

use std::hint::black_box;
use std::path::PathBuf;

use anyhow::{Context, Result};
use memsnap_recorder::{CachingAllocator, HistoryOptions, HostDevice, HostTensor};

type Gpu = CachingAllocator<HostDevice>;

const BATCH: usize = 64;
/// Layer widths: input, three hidden layers, output.
const WIDTHS: [usize; 5] = [128, 512, 512, 256, 8];
const STEPS: usize = 6;
const LEARNING_RATE: f32 = 1e-3;

/// A deterministic pseudo-random stream (no dependency needed for an example).
struct Lcg(u64);

impl Lcg {
    /// Uniform in [-1, 1).
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// `y = x W + b`, W stored row-major `[fan_in, fan_out]`.
struct Linear<'a> {
    weight: HostTensor<'a>,
    bias: HostTensor<'a>,
    fan_in: usize,
    fan_out: usize,
}

/// What one layer keeps from forward for backward.
struct Saved<'a> {
    pre_activation: HostTensor<'a>,
    output: HostTensor<'a>,
}

struct Grads<'a> {
    weight: HostTensor<'a>,
    bias: HostTensor<'a>,
}

/// Adam's first and second moments per parameter, created on the first step.
struct Adam<'a> {
    moments: Vec<(HostTensor<'a>, HostTensor<'a>)>,
    step: i32,
}

fn main() -> Result<()> {
    let out = std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from("train_mlp.pickle"), PathBuf::from);

    // One line for the allocator, one to record, one to dump (at the end).
    let gpu = CachingAllocator::new(HostDevice::new(1 << 30));
    gpu.record_memory_history(HistoryOptions::default());

    let mut rng = Lcg(42);
    let layers = init_layers(&gpu, &mut rng)?;
    // A fixed batch and a fixed random "teacher" target the MLP learns to fit.
    let mut inputs = HostTensor::zeros(&gpu, BATCH * WIDTHS[0])?;
    inputs.iter_mut().for_each(|x| *x = rng.next());
    let mut targets = HostTensor::zeros(&gpu, BATCH * WIDTHS[4])?;
    targets.iter_mut().for_each(|y| *y = rng.next() * 0.5);

    let mut adam = Adam {
        moments: Vec::new(),
        step: 0,
    };
    let mut layers = layers;
    let mut losses = Vec::new();
    for step in 1..=STEPS {
        let loss = train_step(&gpu, &mut layers, &inputs, &targets, &mut adam)?;
        println!("step {step}: loss {loss:.5}");
        losses.push(loss);
    }
    anyhow::ensure!(
        losses.last() < losses.first(),
        "the loss did not decrease: {losses:?}"
    );

    gpu.dump_snapshot(&out)
        .with_context(|| format!("cannot write {}", out.display()))?;
    let stats = gpu.stats();
    println!(
        "peak allocated {} bytes, {} trace entries; wrote {} (open it with `memsnap view {}`)",
        stats
            .allocated_bytes
            .get(memsnap_recorder::StatType::All)
            .peak,
        gpu.history_len(),
        out.display(),
        out.display()
    );
    Ok(())
}

#[inline(never)]
fn init_layers<'a>(gpu: &'a Gpu, rng: &mut Lcg) -> Result<Vec<Linear<'a>>> {
    let mut layers = Vec::new();
    for pair in WIDTHS.windows(2) {
        let (fan_in, fan_out) = (pair[0], pair[1]);
        let mut weight = HostTensor::zeros(gpu, fan_in * fan_out)?;
        let scale = (1.0 / fan_in as f32).sqrt();
        weight.iter_mut().for_each(|w| *w = rng.next() * scale);
        let bias = HostTensor::zeros(gpu, fan_out)?;
        layers.push(Linear {
            weight,
            bias,
            fan_in,
            fan_out,
        });
    }
    Ok(layers)
}

#[inline(never)]
fn train_step<'a>(
    gpu: &'a Gpu,
    layers: &mut [Linear<'a>],
    inputs: &HostTensor<'a>,
    targets: &HostTensor<'a>,
    adam: &mut Adam<'a>,
) -> Result<f32> {
    let saved = forward(gpu, layers, inputs)?;
    let prediction = &saved.last().expect("at least one layer").output;
    let (loss, grad_prediction) = mse_loss(gpu, prediction, targets)?;
    let grads = backward(gpu, layers, inputs, saved, grad_prediction)?;
    adam_step(gpu, layers, &grads, adam)?;
    drop(grads); // zero_grad(set_to_none=True)
    Ok(black_box(loss))
}

#[inline(never)]
fn forward<'a>(
    gpu: &'a Gpu,
    layers: &[Linear<'a>],
    inputs: &HostTensor<'a>,
) -> Result<Vec<Saved<'a>>> {
    let mut saved: Vec<Saved<'a>> = Vec::with_capacity(layers.len());
    for (i, layer) in layers.iter().enumerate() {
        let input = saved.last().map_or(inputs, |s| &s.output);
        let pre_activation = linear_forward(gpu, layer, input)?;
        let last = i + 1 == layers.len();
        let output = if last {
            copy(gpu, &pre_activation)?
        } else {
            relu_forward(gpu, &pre_activation)?
        };
        saved.push(Saved {
            pre_activation,
            output,
        });
    }
    Ok(saved)
}

#[inline(never)]
fn linear_forward<'a>(gpu: &'a Gpu, layer: &Linear<'a>, input: &[f32]) -> Result<HostTensor<'a>> {
    let mut out = HostTensor::zeros(gpu, BATCH * layer.fan_out)?;
    for b in 0..BATCH {
        let row = &input[b * layer.fan_in..(b + 1) * layer.fan_in];
        let out_row = &mut out[b * layer.fan_out..(b + 1) * layer.fan_out];
        out_row.copy_from_slice(&layer.bias);
        for (k, &x) in row.iter().enumerate() {
            let w_row = &layer.weight[k * layer.fan_out..(k + 1) * layer.fan_out];
            out_row.iter_mut().zip(w_row).for_each(|(o, w)| *o += x * w);
        }
    }
    Ok(out)
}

#[inline(never)]
fn relu_forward<'a>(gpu: &'a Gpu, input: &[f32]) -> Result<HostTensor<'a>> {
    let mut out = HostTensor::zeros(gpu, input.len())?;
    out.iter_mut()
        .zip(input)
        .for_each(|(o, &x)| *o = x.max(0.0));
    Ok(out)
}

fn copy<'a>(gpu: &'a Gpu, input: &[f32]) -> Result<HostTensor<'a>> {
    let mut out = HostTensor::zeros(gpu, input.len())?;
    out.copy_from_slice(input);
    Ok(out)
}

/// Mean squared error and its gradient with respect to the prediction.
#[inline(never)]
fn mse_loss<'a>(
    gpu: &'a Gpu,
    prediction: &[f32],
    targets: &[f32],
) -> Result<(f32, HostTensor<'a>)> {
    let mut grad = HostTensor::zeros(gpu, prediction.len())?;
    let n = prediction.len() as f32;
    let mut loss = 0.0;
    for ((g, &p), &t) in grad.iter_mut().zip(prediction).zip(targets) {
        let diff = p - t;
        loss += diff * diff / n;
        *g = 2.0 * diff / n;
    }
    Ok((loss, grad))
}

/// Walks the layers backwards, freeing each layer's saved tensors once its gradients exist.
#[inline(never)]
fn backward<'a>(
    gpu: &'a Gpu,
    layers: &[Linear<'a>],
    inputs: &HostTensor<'a>,
    mut saved: Vec<Saved<'a>>,
    grad_prediction: HostTensor<'a>,
) -> Result<Vec<Grads<'a>>> {
    let mut grads: Vec<Option<Grads<'a>>> = layers.iter().map(|_| None).collect();
    let mut grad_output = grad_prediction;
    for i in (0..layers.len()).rev() {
        let this = saved.pop().expect("one saved entry per layer");
        let last = i + 1 == layers.len();
        if !last {
            relu_backward(&mut grad_output, &this.pre_activation);
        }
        drop(this); // the activation's memory goes back to the cache: the down-slope
        let input: &[f32] = saved.last().map_or(inputs, |s| &s.output);
        let (layer_grads, grad_input) =
            linear_backward(gpu, &layers[i], input, &grad_output, i > 0)?;
        grads[i] = Some(layer_grads);
        grad_output = match grad_input {
            Some(g) => g,
            None => break,
        };
    }
    Ok(grads
        .into_iter()
        .map(|g| g.expect("every layer has gradients"))
        .collect())
}

#[inline(never)]
fn relu_backward(grad: &mut [f32], pre_activation: &[f32]) {
    grad.iter_mut().zip(pre_activation).for_each(|(g, &z)| {
        if z <= 0.0 {
            *g = 0.0
        }
    });
}

/// Gradients of W and b, and (unless this is the first layer) of the layer's input.
#[inline(never)]
fn linear_backward<'a>(
    gpu: &'a Gpu,
    layer: &Linear<'a>,
    input: &[f32],
    grad_output: &[f32],
    need_input_grad: bool,
) -> Result<(Grads<'a>, Option<HostTensor<'a>>)> {
    let (fan_in, fan_out) = (layer.fan_in, layer.fan_out);
    let mut weight = HostTensor::zeros(gpu, fan_in * fan_out)?;
    let mut bias = HostTensor::zeros(gpu, fan_out)?;
    for b in 0..BATCH {
        let g_row = &grad_output[b * fan_out..(b + 1) * fan_out];
        bias.iter_mut().zip(g_row).for_each(|(gb, g)| *gb += g);
        for (k, &x) in input[b * fan_in..(b + 1) * fan_in].iter().enumerate() {
            let gw_row = &mut weight[k * fan_out..(k + 1) * fan_out];
            gw_row
                .iter_mut()
                .zip(g_row)
                .for_each(|(gw, g)| *gw += x * g);
        }
    }
    let grad_input = if need_input_grad {
        let mut gi = HostTensor::zeros(gpu, BATCH * fan_in)?;
        for b in 0..BATCH {
            let g_row = &grad_output[b * fan_out..(b + 1) * fan_out];
            for k in 0..fan_in {
                let w_row = &layer.weight[k * fan_out..(k + 1) * fan_out];
                gi[b * fan_in + k] = w_row.iter().zip(g_row).map(|(w, g)| w * g).sum();
            }
        }
        Some(gi)
    } else {
        None
    };
    Ok((Grads { weight, bias }, grad_input))
}

#[inline(never)]
fn adam_step<'a>(
    gpu: &'a Gpu,
    layers: &mut [Linear<'a>],
    grads: &[Grads<'a>],
    adam: &mut Adam<'a>,
) -> Result<()> {
    const BETA1: f32 = 0.9;
    const BETA2: f32 = 0.999;
    const EPS: f32 = 1e-8;
    if adam.moments.is_empty() {
        for layer in layers.iter() {
            for len in [layer.weight.len(), layer.bias.len()] {
                adam.moments
                    .push((HostTensor::zeros(gpu, len)?, HostTensor::zeros(gpu, len)?));
            }
        }
    }
    adam.step += 1;
    let correction1 = 1.0 - BETA1.powi(adam.step);
    let correction2 = 1.0 - BETA2.powi(adam.step);
    let params = layers.iter_mut().flat_map(|l| [&mut l.weight, &mut l.bias]);
    let grads = grads.iter().flat_map(|g| [&g.weight, &g.bias]);
    for ((param, grad), (m, v)) in params.zip(grads).zip(adam.moments.iter_mut()) {
        for i in 0..param.len() {
            m[i] = BETA1 * m[i] + (1.0 - BETA1) * grad[i];
            v[i] = BETA2 * v[i] + (1.0 - BETA2) * grad[i] * grad[i];
            let update = (m[i] / correction1) / ((v[i] / correction2).sqrt() + EPS);
            param[i] -= LEARNING_RATE * update;
        }
    }
    Ok(())
}
