//! A scripted training-like workload on an 80 GB simulated GPU, recorded with native stacks and
//! dumped as a snapshot. It emits every trace action (alloc, free_requested, free_completed,
//! segment_alloc, segment_free, segment_map, segment_unmap, oom, snapshot), including a
//! `record_stream`ed block and an `empty_cache`.
//!
//! ```text
//! cargo run --release -p memsnap-recorder --example dump -- OUT.pickle
//! ```

use std::error::Error;

use memsnap_recorder::{CachingAllocator, HistoryOptions, SimulatedDevice, Stream};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const COMPUTE: Stream = Stream(0);
const COPY: Stream = Stream(0x7f3a_1000);

type Allocator = CachingAllocator<SimulatedDevice>;

#[inline(never)]
fn load_weights(alloc: &Allocator) -> Result<Vec<u64>, Box<dyn Error>> {
    let mut weights = Vec::new();
    for layer in 0..8u64 {
        weights.push(alloc.malloc(96 * MIB + layer * 4096, COMPUTE)?);
        weights.push(alloc.malloc(384 * 1024 + layer, COMPUTE)?); // bias: small pool
    }
    Ok(weights)
}

#[inline(never)]
fn forward(alloc: &Allocator, step: u64) -> Result<Vec<u64>, Box<dyn Error>> {
    let mut activations = Vec::new();
    for layer in 0..8u64 {
        activations.push(alloc.malloc((64 + 8 * layer) * MIB + step * 512, COMPUTE)?);
        let scratch = alloc.malloc(3 * MIB + 1000, COMPUTE)?;
        alloc.free(scratch)?;
    }
    Ok(activations)
}

#[inline(never)]
fn backward(alloc: &Allocator, activations: Vec<u64>) -> Result<Vec<u64>, Box<dyn Error>> {
    let mut grads = Vec::new();
    for ptr in activations.into_iter().rev() {
        grads.push(alloc.malloc(24 * MIB, COMPUTE)?);
        alloc.free(ptr)?;
    }
    Ok(grads)
}

/// Gradients go to the host on a copy stream: their memory is reused only after the copy.
#[inline(never)]
fn offload_gradients(alloc: &Allocator, grads: Vec<u64>) -> Result<(), Box<dyn Error>> {
    for ptr in grads {
        alloc.record_stream(ptr, COPY);
        alloc.free(ptr)?;
    }
    Ok(())
}

#[inline(never)]
fn training_step(alloc: &Allocator, step: u64) -> Result<(), Box<dyn Error>> {
    let activations = forward(alloc, step)?;
    let grads = backward(alloc, activations)?;
    offload_gradients(alloc, grads)?;
    // The copy stream finishes; the next malloc completes the pending frees.
    alloc.device().complete_stream(COPY);
    Ok(())
}

#[inline(never)]
fn expandable_phase(alloc: &Allocator) -> Result<(), Box<dyn Error>> {
    alloc.set_allocator_settings("expandable_segments:True")?;
    let kv_cache = alloc.malloc(300 * MIB, COMPUTE)?;
    let more = alloc.malloc(150 * MIB, COMPUTE)?;
    alloc.free(more)?;
    alloc.free(kv_cache)?;
    alloc.empty_cache()?; // segment_unmap
    alloc.set_allocator_settings("")?;
    Ok(())
}

#[inline(never)]
fn oversized_request(alloc: &Allocator) {
    // 120 GB on an 80 GB device: the OOM path records an `oom` entry and returns an error.
    match alloc.malloc(120 * GIB, COMPUTE) {
        Err(e) => eprintln!("expected failure: {e}"),
        Ok(_) => eprintln!("unexpected: a 120 GB allocation succeeded"),
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let out = std::env::args()
        .nth(1)
        .ok_or("usage: dump OUT.pickle (or .json, .msgpack, .gz/.zst)")?;
    let alloc = CachingAllocator::new(SimulatedDevice::new(80 * GIB).with_manual_events());
    alloc.record_memory_history(HistoryOptions::default());
    alloc.add_oom_observer(|oom| {
        eprintln!(
            "OOM observer: device {} free {}",
            oom.device, oom.device_free
        )
    });

    let weights = load_weights(&alloc)?;
    for step in 0..3 {
        training_step(&alloc, step)?;
    }
    let _ = alloc.snapshot(); // its `snapshot` entry shows in the dump below
    alloc.empty_cache()?; // segment_free of cached activations
    expandable_phase(&alloc)?;
    oversized_request(&alloc);
    for ptr in weights.into_iter().skip(12) {
        alloc.free(ptr)?;
    }
    alloc.dump_snapshot(&out)?;
    let stats = alloc.stats();
    println!(
        "wrote {out}: {} trace entries, {} bytes allocated, {} bytes reserved, {} OOMs",
        alloc.history_len(),
        stats.allocated_bytes(),
        stats.reserved_bytes(),
        stats.num_ooms
    );
    Ok(())
}
