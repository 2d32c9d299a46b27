//! The allocation pattern of `train_mlp` (activations kept for backward, gradients, Adam
//! state) on a real GPU through memsnap's caching allocator and the CUDA driver API.
//!
//! ```text
//! cargo run --release --features cuda --example cuda_alloc -- cuda.pickle
//! memsnap view cuda.pickle
//! ```
//!
//! No kernels run: the point is what the allocator does with real `cuMemAlloc` segments and
//! real device addresses. Without an NVIDIA driver or GPU it exits with the driver's reason.

use std::path::PathBuf;

use anyhow::{Context, Result};
use memsnap_recorder::{CachingAllocator, CudaDevice, HistoryOptions, Stream};

const BATCH: u64 = 256;
/// Layer widths: input, hidden layers, output.
const WIDTHS: [u64; 6] = [1024, 4096, 4096, 4096, 4096, 1000];
const STEPS: usize = 4;
const F32: u64 = 4;

type Gpu = CachingAllocator<CudaDevice>;

fn main() -> Result<()> {
    let out = std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from("cuda_alloc.pickle"), PathBuf::from);

    let gpu = CachingAllocator::new(CudaDevice::new(0).context("cannot open CUDA device 0")?);
    gpu.record_memory_history(HistoryOptions::default());

    let params = init_params(&gpu)?;
    let mut adam_state: Vec<u64> = Vec::new();
    for step in 1..=STEPS {
        train_step(&gpu, &params, &mut adam_state)?;
        let stats = gpu.stats();
        println!(
            "step {step}: allocated {} MiB, reserved {} MiB",
            stats.allocated_bytes() >> 20,
            stats.reserved_bytes() >> 20
        );
    }
    gpu.dump_snapshot(&out)
        .with_context(|| format!("cannot write {}", out.display()))?;
    println!(
        "wrote {} (open it with `memsnap view {}`)",
        out.display(),
        out.display()
    );
    Ok(())
}

/// Weight and bias sizes of each layer, in bytes.
fn param_sizes() -> Vec<u64> {
    WIDTHS
        .windows(2)
        .flat_map(|w| [w[0] * w[1] * F32, w[1] * F32])
        .collect()
}

#[inline(never)]
fn init_params(gpu: &Gpu) -> Result<Vec<u64>> {
    param_sizes()
        .into_iter()
        .map(|bytes| Ok(gpu.malloc(bytes, Stream::DEFAULT)?))
        .collect()
}

#[inline(never)]
fn train_step(gpu: &Gpu, params: &[u64], adam_state: &mut Vec<u64>) -> Result<()> {
    let activations = forward(gpu)?;
    let grads = backward(gpu, activations)?;
    adam_step(gpu, params, adam_state)?;
    for grad in grads {
        gpu.free(grad)?;
    }
    Ok(())
}

/// Keeps each layer's pre-activation and activation: the up-slope.
#[inline(never)]
fn forward(gpu: &Gpu) -> Result<Vec<u64>> {
    let mut saved = Vec::new();
    for &width in &WIDTHS[1..] {
        saved.push(gpu.malloc(BATCH * width * F32, Stream::DEFAULT)?);
        saved.push(gpu.malloc(BATCH * width * F32, Stream::DEFAULT)?);
    }
    Ok(saved)
}

/// Frees the saved tensors layer by layer while gradients appear: the down-slope.
#[inline(never)]
fn backward(gpu: &Gpu, mut saved: Vec<u64>) -> Result<Vec<u64>> {
    let sizes = param_sizes();
    let mut grads = Vec::new();
    for layer in (0..WIDTHS.len() - 1).rev() {
        let grad_input = gpu.malloc(BATCH * WIDTHS[layer] * F32, Stream::DEFAULT)?;
        grads.push(gpu.malloc(sizes[2 * layer], Stream::DEFAULT)?);
        grads.push(gpu.malloc(sizes[2 * layer + 1], Stream::DEFAULT)?);
        for _ in 0..2 {
            if let Some(ptr) = saved.pop() {
                gpu.free(ptr)?;
            }
        }
        gpu.free(grad_input)?;
    }
    Ok(grads)
}

#[inline(never)]
fn adam_step(gpu: &Gpu, params: &[u64], adam_state: &mut Vec<u64>) -> Result<()> {
    if adam_state.is_empty() {
        for bytes in param_sizes() {
            adam_state.push(gpu.malloc(bytes, Stream::DEFAULT)?);
            adam_state.push(gpu.malloc(bytes, Stream::DEFAULT)?);
        }
    }
    std::hint::black_box((params, adam_state));
    Ok(())
}
