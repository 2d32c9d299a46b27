//! Helpers shared by the recorder's integration tests.

use std::collections::HashMap;

use memsnap_format::{Action, BlockState, Snapshot};
use memsnap_recorder::{CachingAllocator, Device};

/// Fails the test with every broken invariant.
pub fn assert_sound<D: Device>(alloc: &CachingAllocator<D>, context: &str) {
    let violations = alloc.check_invariants();
    assert!(
        violations.is_empty(),
        "{context}: invariants broken:\n{}",
        violations.join("\n")
    );
}

/// Live and pending-free blocks (address -> requested size) according to the snapshot's
/// blocks.
pub fn blocks_by_state(snap: &Snapshot) -> (HashMap<u64, u64>, HashMap<u64, u64>) {
    let mut allocated = HashMap::new();
    let mut pending = HashMap::new();
    for seg in &snap.segments {
        for (addr, b) in seg.block_addresses() {
            let requested = b.requested_size.unwrap_or(0);
            match b.state {
                BlockState::ActiveAllocated => {
                    allocated.insert(addr, requested);
                }
                BlockState::ActivePendingFree => {
                    pending.insert(addr, requested);
                }
                _ => {}
            }
        }
    }
    (allocated, pending)
}

/// Replays a complete device trace: (allocated, pending free) blocks, address -> size.
pub fn replay_trace(snap: &Snapshot, device: usize) -> (HashMap<u64, u64>, HashMap<u64, u64>) {
    let mut allocated = HashMap::new();
    let mut pending = HashMap::new();
    for e in &snap.traces()[device] {
        match e.action {
            Action::Alloc => {
                assert!(
                    allocated.insert(e.addr, e.size).is_none(),
                    "double alloc at {:#x}",
                    e.addr
                );
            }
            Action::FreeRequested => {
                let size = allocated
                    .remove(&e.addr)
                    .expect("free of a block not allocated");
                assert_eq!(size, e.size);
                pending.insert(e.addr, size);
            }
            Action::FreeCompleted => {
                let size = pending.remove(&e.addr).expect("completion without request");
                assert_eq!(size, e.size);
            }
            _ => {}
        }
    }
    (allocated, pending)
}
