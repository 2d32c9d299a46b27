//! The `GlobalAlloc` adapter records this test binary's own heap.
//!
//! The checks run in a child process (this binary, filtered to this one test) so that other
//! tests allocating in parallel do not interleave with the recorded heap.

use std::hint::black_box;
use std::process::Command;

use memsnap_format::{validate, Action, BlockState};
use memsnap_recorder::global_alloc::{self, HeapHistoryOptions, RecordingAllocator};

#[global_allocator]
static HEAP: RecordingAllocator = RecordingAllocator::system();

const CHILD_ENV: &str = "MEMSNAP_TEST_HEAP_CHILD";
const WEIGHTS: usize = (3 << 20) + 5;
const SCRATCH: usize = 1_234_567;

#[inline(never)]
fn allocate_model_weights() -> Vec<u8> {
    black_box(vec![1u8; WEIGHTS])
}

#[inline(never)]
fn use_scratch_buffer() -> usize {
    let scratch = black_box(vec![0u8; SCRATCH]);
    scratch.len()
}

#[test]
fn the_heap_of_a_rust_program_is_recorded() {
    if std::env::var_os(CHILD_ENV).is_none() {
        let exe = std::env::current_exe().unwrap();
        let out = Command::new(exe)
            .args([
                "global_alloc::the_heap_of_a_rust_program_is_recorded",
                "--exact",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(CHILD_ENV, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "the heap-recording child failed:\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }

    assert!(!global_alloc::is_recording());
    global_alloc::start(HeapHistoryOptions::default());
    let weights = allocate_model_weights();
    assert_eq!(use_scratch_buffer(), SCRATCH);
    let snapshot = global_alloc::snapshot().expect("recording");
    global_alloc::stop();
    // Not recorded any more: allocating after stop changes nothing (and does not recurse).
    black_box(vec![0u8; 1000]);
    assert!(global_alloc::snapshot().is_none());

    assert_eq!(validate(&snapshot), vec![]);
    let trace = &snapshot.traces()[0];
    let frames_of = |e: &memsnap_format::TraceEntry| -> Vec<String> {
        e.frames
            .map(|id| snapshot.stack_frames(id).map(|f| f.name.clone()).collect())
            .unwrap_or_default()
    };
    let weights_alloc = trace
        .iter()
        .find(|e| e.action == Action::Alloc && e.size == WEIGHTS as u64)
        .expect("the weights allocation is in the trace");
    assert_eq!(weights_alloc.addr, weights.as_ptr() as u64);
    let names = frames_of(weights_alloc);
    assert!(
        names.iter().any(|n| n.contains("allocate_model_weights")),
        "no allocate_model_weights frame in {names:?}"
    );
    assert!(
        !names
            .first()
            .is_some_and(|n| n.contains("memsnap_recorder") || n.starts_with("__rust")),
        "the recorder's own frames are trimmed: {names:?}"
    );

    let scratch: Vec<Action> = trace
        .iter()
        .filter(|e| e.size == SCRATCH as u64)
        .map(|e| e.action)
        .collect();
    assert_eq!(
        scratch,
        [Action::Alloc, Action::FreeRequested, Action::FreeCompleted]
    );

    let live_weights = snapshot
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .find(|b| b.address == Some(weights.as_ptr() as u64))
        .expect("the live weights are a block");
    assert_eq!(live_weights.state, BlockState::ActiveAllocated);
    assert_eq!(live_weights.size, WEIGHTS as u64);
    assert!(
        !snapshot
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .any(|b| b.size == SCRATCH as u64),
        "the freed scratch buffer is not live"
    );
    drop(weights);
}
