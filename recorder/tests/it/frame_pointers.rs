//! Frame-pointer stacks in the default build: the workspace's `.cargo/config.toml` builds
//! everything with `-C force-frame-pointers=yes`, so the default unwinder (the frame-pointer
//! walk) sees the same stack DWARF unwinding does, minus std's prebuilt start-up frames.

use memsnap_format::{Action, Snapshot};
use memsnap_recorder::stacks::{
    check_frame_pointers, first_capture_check, FramePointerCheck, FRAME_POINTER_MISS_ALLOWANCE,
    FRAME_POINTER_WALK_SUPPORTED,
};
use memsnap_recorder::{CachingAllocator, HistoryOptions, SimulatedDevice, Stream, Unwinder};

const DEPTH: usize = 20;

#[inline(never)]
fn check_at(depth: usize) -> Option<FramePointerCheck> {
    if depth == 0 {
        check_frame_pointers()
    } else {
        std::hint::black_box(check_at(std::hint::black_box(depth - 1)))
    }
}

#[test]
fn the_workspace_build_keeps_frame_pointers() {
    if !FRAME_POINTER_WALK_SUPPORTED {
        eprintln!("skipped: no frame-pointer walk on this platform");
        return;
    }
    assert_eq!(Unwinder::default(), Unwinder::FramePointers);
    let check = check_at(DEPTH).unwrap();
    // If this fails, the build lost `-C force-frame-pointers=yes` (a RUSTFLAGS variable
    // replaces the workspace's .cargo/config.toml flags).
    assert!(check.walked > DEPTH, "{check:?}");
    assert!(check.missed <= FRAME_POINTER_MISS_ALLOWANCE, "{check:?}");
    assert!(!check.host_lacks_frame_pointers(), "{check:?}");
}

#[inline(never)]
fn allocate_in_layer(alloc: &CachingAllocator<SimulatedDevice>) -> u64 {
    std::hint::black_box(alloc.malloc(3 << 20, Stream(0)).unwrap())
}

fn alloc_frames(unwinder: Unwinder) -> Vec<String> {
    let alloc = CachingAllocator::new(SimulatedDevice::new(1 << 30));
    alloc.record_memory_history(HistoryOptions {
        unwinder,
        ..HistoryOptions::default()
    });
    allocate_in_layer(&alloc);
    let snapshot: Snapshot = alloc.snapshot();
    let trace = &snapshot.traces()[0];
    let entry = trace.iter().find(|e| e.action == Action::Alloc).unwrap();
    snapshot
        .stack_frames(entry.frames.unwrap())
        .map(|f| f.name.clone())
        .collect()
}

#[test]
fn default_stacks_are_the_dwarf_stacks_without_std_start_up_frames() {
    if !FRAME_POINTER_WALK_SUPPORTED {
        eprintln!("skipped: no frame-pointer walk on this platform");
        return;
    }
    let walked = alloc_frames(Unwinder::default());
    let unwound = alloc_frames(Unwinder::Backtrace);
    assert!(walked[0].contains("allocate_in_layer"), "{walked:?}");
    assert!(walked.len() + FRAME_POINTER_MISS_ALLOWANCE >= unwound.len());
    // The walk finds the same frames in this crate's code (below the test harness, which
    // is prebuilt without frame pointers).
    assert_eq!(walked[..3], unwound[..3]);
    assert!(walked[1].contains("alloc_frames"), "{walked:?}");
    // The first frame-pointer capture checked the build, and found it complete.
    let first = first_capture_check().unwrap();
    assert!(!first.host_lacks_frame_pointers(), "{first:?}");
}
