//! Deterministic recordings: a manual clock, stacks given as frames, annotations.

use std::time::Duration;

use memsnap_format::{validate, Action, Frame};
use memsnap_recorder::{
    CachingAllocator, ContextMode, HistoryOptions, SimulatedDevice, StackMode, Stream,
};

fn recorder(context: ContextMode, max_entries: usize) -> CachingAllocator<SimulatedDevice> {
    let gpu = CachingAllocator::new(SimulatedDevice::new(1 << 30));
    gpu.use_manual_clock(1_700_000_000_000_000);
    gpu.record_memory_history(HistoryOptions {
        context,
        stacks: StackMode::None,
        max_entries,
        ..HistoryOptions::default()
    });
    gpu
}

fn frames(names: &[&str]) -> Vec<Frame> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| Frame::new(*n, "model.py", i as i64 + 1))
        .collect()
}

#[test]
fn manual_clock_stamps_calls_with_the_time_it_was_moved_to() {
    let gpu = recorder(ContextMode::All, usize::MAX);
    let a = gpu.malloc(4096, Stream::DEFAULT).unwrap();
    gpu.advance_clock(Duration::from_micros(25));
    gpu.free(a).unwrap();
    gpu.advance_clock(Duration::from_nanos(1500));
    assert_eq!(gpu.clock_now_us(), 1_700_000_000_000_026);
    let snapshot = gpu.snapshot();
    let times: Vec<_> = snapshot.traces()[0].iter().map(|e| e.time_us()).collect();
    let start = 1_700_000_000_000_000;
    // segment_alloc and alloc share the first call's reading; the free pair the second's.
    assert_eq!(
        times,
        [Some(start), Some(start), Some(start + 25), Some(start + 25)]
    );
    // The same calls give the same file.
    let again = recorder(ContextMode::All, usize::MAX);
    let b = again.malloc(4096, Stream::DEFAULT).unwrap();
    again.advance_clock(Duration::from_micros(25));
    again.free(b).unwrap();
    assert_eq!(again.snapshot().device_traces, snapshot.device_traces);
}

#[test]
fn given_stacks_are_recorded_as_their_frames() {
    let gpu = recorder(ContextMode::All, usize::MAX);
    let forward = gpu.register_stack(&frames(&["linear", "forward"])).unwrap();
    let backward = gpu.register_stack(&frames(&["engine"])).unwrap();
    assert_eq!(
        gpu.register_stack(&frames(&["linear", "forward"])),
        Some(forward),
        "an equal stack is the same handle"
    );
    let a = gpu
        .malloc_with_stack(1 << 20, Stream::DEFAULT, forward)
        .unwrap();
    let kept = gpu
        .malloc_with_stack(512, Stream::DEFAULT, forward)
        .unwrap();
    gpu.free_with_stack(a, backward).unwrap();
    let snapshot = gpu.snapshot();
    assert!(validate(&snapshot).is_empty());
    let names = |id| -> Vec<String> { snapshot.stack_frames(id).map(|f| f.name.clone()).collect() };
    let trace = &snapshot.traces()[0];
    let alloc = trace.iter().find(|e| e.action == Action::Alloc).unwrap();
    assert_eq!(names(alloc.frames.unwrap()), ["linear", "forward"]);
    let free = trace
        .iter()
        .find(|e| e.action == Action::FreeCompleted)
        .unwrap();
    assert_eq!(
        names(free.frames.unwrap()),
        ["engine"],
        "the free's call site"
    );
    let block = snapshot
        .segments
        .iter()
        .flat_map(|s| s.block_addresses())
        .find(|(addr, _)| *addr == kept)
        .unwrap()
        .1;
    assert_eq!(names(block.frames.unwrap()), ["linear", "forward"]);
}

#[test]
fn given_free_stacks_need_context_all() {
    let gpu = recorder(ContextMode::Alloc, usize::MAX);
    let forward = gpu.register_stack(&frames(&["forward"])).unwrap();
    let backward = gpu.register_stack(&frames(&["engine"])).unwrap();
    let a = gpu
        .malloc_with_stack(4096, Stream::DEFAULT, forward)
        .unwrap();
    gpu.free_with_stack(a, backward).unwrap();
    let snapshot = gpu.snapshot();
    for e in &snapshot.traces()[0] {
        if let Some(id) = e.frames {
            let names: Vec<_> = snapshot.stack_frames(id).map(|f| f.name.as_str()).collect();
            assert_eq!(
                names,
                ["forward"],
                "{:?} keeps the allocation's stack",
                e.action
            );
        }
    }
}

#[test]
fn annotations_share_the_clock_and_the_ring_size() {
    let gpu = recorder(ContextMode::Never, 3);
    for step in 0..3 {
        gpu.advance_clock(Duration::from_micros(10));
        gpu.record_annotation(&[
            ("stage", "START"),
            ("name", &format!("ProfilerStep#{step}")),
        ]);
        let p = gpu.malloc(4096, Stream::DEFAULT).unwrap();
        gpu.free(p).unwrap();
    }
    assert_eq!(
        gpu.recorded_entries(),
        10,
        "segment_alloc + 3 x (alloc, free pair)"
    );
    let snapshot = gpu.snapshot();
    assert_eq!(snapshot.traces()[0].len(), 3, "the ring keeps 3 entries");
    let annotations = snapshot.external_annotations.as_ref().unwrap();
    let names: Vec<_> = annotations.iter().filter_map(|a| a.name()).collect();
    assert_eq!(
        names,
        ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    );
    assert_eq!(annotations[2].time_us, 1_700_000_000_000_030);
    assert_eq!(annotations[2].device, 0);
    // Off records nothing and clears them.
    gpu.record_memory_history(HistoryOptions::off());
    gpu.record_annotation(&[("stage", "END")]);
    assert_eq!(gpu.snapshot().external_annotations, Some(Vec::new()));
}

#[test]
fn into_snapshot_is_the_snapshot_without_a_copy_of_the_ring() {
    let record = || {
        let gpu = recorder(ContextMode::All, 5);
        let stack = gpu.register_stack(&frames(&["forward"])).unwrap();
        for i in 0..4u64 {
            gpu.advance_clock(Duration::from_micros(3));
            let p = gpu
                .malloc_with_stack(4096 * (i + 1), Stream::DEFAULT, stack)
                .unwrap();
            gpu.free(p).unwrap();
        }
        gpu
    };
    let copied = record().snapshot();
    let moved = record().into_snapshot();
    assert_eq!(moved.device_traces, copied.device_traces);
    assert_eq!(moved.segments, copied.segments);
    assert_eq!(moved.recorder_info, copied.recorder_info);
    assert_eq!(moved.traces()[0].len(), 5, "the ring wrapped");
}
