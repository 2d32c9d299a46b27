//! Unit tests pinning the checklist of `caching_allocator.md` §12 (items 1–2 and 9 live next
//! to `round_size` and the ring buffer).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use memsnap_format::{Action, BlockState};

use crate::config::MIB;
use crate::{
    CachingAllocator, ContextMode, Error, HistoryMode, HistoryOptions, SimulatedDevice, StatType,
    Stream,
};

const S0: Stream = Stream(0);
const S1: Stream = Stream(1);

fn alloc_with(capacity: u64, conf: &str) -> CachingAllocator<SimulatedDevice> {
    let a = CachingAllocator::with_conf(SimulatedDevice::new(capacity), conf).unwrap();
    a.record_memory_history(HistoryOptions::without_stacks());
    a
}

fn alloc() -> CachingAllocator<SimulatedDevice> {
    alloc_with(80 << 30, "")
}

fn sound(a: &CachingAllocator<SimulatedDevice>) {
    let v = a.check_invariants();
    assert!(v.is_empty(), "invariants broken: {v:#?}");
}

/// (action, addr, size) of the trace, oldest first.
fn actions(a: &CachingAllocator<SimulatedDevice>) -> Vec<(Action, u64, u64)> {
    let snap = a.snapshot();
    snap.traces()[0]
        .iter()
        .map(|e| (e.action, e.addr, e.size))
        .collect()
}

fn names(a: &CachingAllocator<SimulatedDevice>) -> Vec<Action> {
    actions(a).into_iter().map(|e| e.0).collect()
}

#[test]
fn best_fit_takes_lowest_address_among_equal_sizes() {
    let a = alloc();
    let p: Vec<u64> = (0..4).map(|_| a.malloc(1000, S0).unwrap()).collect();
    a.free(p[2]).unwrap();
    a.free(p[0]).unwrap();
    // Two free 1024-byte blocks (p0 and p2); the lower address wins.
    assert_eq!(a.malloc(1024, S0).unwrap(), p[0]);
    sound(&a);
}

#[test]
fn best_fit_prefers_the_smallest_block_that_fits() {
    let a = alloc();
    let big = a.malloc(8192, S0).unwrap();
    let _sep = a.malloc(512, S0).unwrap();
    let small = a.malloc(2048, S0).unwrap();
    let _sep2 = a.malloc(512, S0).unwrap();
    a.free(big).unwrap();
    a.free(small).unwrap();
    assert_eq!(a.malloc(1500, S0).unwrap(), small);
    sound(&a);
}

#[test]
fn blocks_are_never_reused_across_streams() {
    let a = alloc();
    let p = a.malloc(4096, S0).unwrap();
    a.free(p).unwrap();
    let q = a.malloc(4096, S1).unwrap();
    assert_ne!(q, p);
    assert_eq!(a.stats().segment.get(StatType::All).current, 2);
    sound(&a);
}

#[test]
fn small_pool_splits_when_512_bytes_remain() {
    let a = alloc();
    let p = a.malloc(MIB, S0).unwrap();
    assert_eq!(a.block_size(p), Some(MIB));
    let stats = a.stats();
    assert_eq!(
        stats.reserved_bytes.get(StatType::SmallPool).current,
        2 * MIB as i64
    );
    assert_eq!(stats.inactive_split.get(StatType::SmallPool).current, 1);
    assert_eq!(
        stats.inactive_split_bytes.get(StatType::All).current,
        MIB as i64
    );
    sound(&a);
}

#[test]
fn large_pool_splits_only_when_more_than_1mib_remains() {
    let a = alloc();
    // 19 MiB in a 20 MiB segment leaves exactly 1 MiB: handed out whole.
    let whole = a.malloc(19 * MIB, S0).unwrap();
    assert_eq!(a.block_size(whole), Some(20 * MIB));
    // 5 MiB in a 20 MiB segment leaves 15 MiB: split.
    let split = a.malloc(5 * MIB, S1).unwrap();
    assert_eq!(a.block_size(split), Some(5 * MIB));
    assert_eq!(a.stats().inactive_split.get(StatType::LargePool).current, 1);
    sound(&a);
}

#[test]
fn oversize_blocks_follow_max_split_size_rules() {
    let a = alloc_with(80 << 30, "max_split_size_mb:64");
    let big = a.malloc(100 * MIB, S0).unwrap();
    assert_eq!(a.stats().oversize_allocations.current, 1);
    assert_eq!(a.stats().oversize_segments.current, 1);
    a.free(big).unwrap();
    // (a) a request below max_split never takes an oversize block.
    let small = a.malloc(30 * MIB, S0).unwrap();
    assert_ne!(small, big);
    // (b) an oversize request takes a block less than 20 MiB bigger, whole (no split).
    let reuse = a.malloc(85 * MIB, S0).unwrap();
    assert_eq!(reuse, big);
    assert_eq!(a.block_size(reuse), Some(100 * MIB));
    a.free(reuse).unwrap();
    // ...but not one 20 MiB or more bigger.
    let other = a.malloc(70 * MIB, S0).unwrap();
    assert_ne!(other, big);
    sound(&a);
}

#[test]
fn free_emits_requested_then_completed_in_the_same_call() {
    let a = alloc();
    let p = a.malloc(1000, S0).unwrap();
    a.free(p).unwrap();
    assert_eq!(
        actions(&a),
        vec![
            (Action::SegmentAlloc, p, 2 * MIB),
            (Action::Alloc, p, 1000),
            (Action::FreeRequested, p, 1000),
            (Action::FreeCompleted, p, 1000),
        ]
    );
}

#[test]
fn record_stream_defers_free_completed_until_events_complete() {
    let a = CachingAllocator::new(SimulatedDevice::new(80 << 30).with_manual_events());
    a.record_memory_history(HistoryOptions::without_stacks());
    let p = a.malloc(1000, S0).unwrap();
    a.record_stream(p, S1);
    a.record_stream(p, S0); // the allocation stream is not recorded
    a.free(p).unwrap();
    assert_eq!(a.device().pending_events(), 1);
    let snap = a.snapshot();
    let state = snap.segments[0].blocks[0].state;
    assert_eq!(state, BlockState::ActivePendingFree);
    assert_eq!(a.stats().active.get(StatType::All).current, 1);
    assert_eq!(a.stats().allocation.get(StatType::All).current, 0);
    // A malloc while the event is pending does not reuse the block.
    let q = a.malloc(1000, S0).unwrap();
    assert_ne!(q, p);
    a.device().complete_stream(S1);
    // The next malloc sees the event completed and frees the block first.
    let r = a.malloc(1000, S0).unwrap();
    assert_eq!(r, p);
    let n = names(&a);
    let completed = n.iter().position(|x| *x == Action::FreeCompleted).unwrap();
    let requested = n.iter().position(|x| *x == Action::FreeRequested).unwrap();
    assert!(
        completed > requested + 2,
        "free_completed must come after the next alloc: {n:?}"
    );
    sound(&a);
}

#[test]
fn empty_cache_synchronizes_pending_frees() {
    let a = CachingAllocator::new(SimulatedDevice::new(80 << 30).with_manual_events());
    let p = a.malloc(1000, S0).unwrap();
    a.record_stream(p, S1);
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    let s = a.stats();
    assert_eq!(s.num_sync_all_streams, 1);
    assert_eq!(s.reserved_bytes(), 0);
    assert_eq!(a.device().pending_events(), 0);
    sound(&a);
}

#[test]
fn freed_middle_block_absorbs_both_free_neighbours() {
    let a = alloc();
    let x = a.malloc(512, S0).unwrap();
    let y = a.malloc(512, S0).unwrap();
    let z = a.malloc(512, S0).unwrap();
    let _w = a.malloc(512, S0).unwrap();
    a.free(x).unwrap();
    a.free(z).unwrap();
    // Free fragments: x, z, and the segment tail.
    assert_eq!(a.stats().inactive_split.get(StatType::All).current, 3);
    a.free(y).unwrap();
    let s = a.stats();
    assert_eq!(s.inactive_split.get(StatType::All).current, 2);
    assert_eq!(
        s.inactive_split_bytes.get(StatType::All).current,
        1536 + (2 * MIB as i64 - 2048)
    );
    let snap = a.snapshot();
    let sizes: Vec<u64> = snap.segments[0].blocks.iter().map(|b| b.size).collect();
    assert_eq!(sizes, vec![1536, 512, 2 * MIB - 2048]);
    sound(&a);
}

#[test]
fn oom_ladder_releases_cache_then_retries_once() {
    let a = alloc_with(60 * MIB, "");
    let p = a.malloc(30 * MIB, S0).unwrap();
    a.free(p).unwrap(); // cached 30 MiB segment
    let q = a.malloc(40 * MIB, S0).unwrap();
    let s = a.stats();
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_ooms, 0);
    assert_eq!(a.block_size(q), Some(40 * MIB));
    let n = names(&a);
    assert_eq!(
        &n[n.len() - 3..],
        &[Action::SegmentFree, Action::SegmentAlloc, Action::Alloc]
    );
    sound(&a);
}

#[test]
fn oom_records_entry_and_calls_observer_after_the_lock_is_released() {
    let a = Arc::new(alloc_with(60 * MIB, ""));
    let calls = Arc::new(AtomicUsize::new(0));
    {
        let (a2, calls) = (Arc::downgrade(&a), calls.clone());
        a.add_oom_observer(move |info| {
            // Taking a snapshot here deadlocks if the observer ran under the lock.
            let snap = a2.upgrade().unwrap().snapshot();
            assert!(!snap.traces()[0].is_empty());
            assert_eq!(info.alloc_size, 100 * MIB);
            calls.fetch_add(1, Ordering::SeqCst);
        });
    }
    let keep = a.malloc(30 * MIB, S0).unwrap();
    let err = a.malloc(100 * MIB, S0).unwrap_err();
    let Error::OutOfMemory(info) = err else {
        panic!("expected OOM, got {err}")
    };
    assert_eq!(info.device_free, 30 * MIB);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let s = a.stats();
    assert_eq!(s.num_ooms, 1);
    assert_eq!(s.num_alloc_retries, 1);
    let snap = a.snapshot();
    let oom = snap.traces()[0]
        .iter()
        .find(|e| e.action == Action::Oom)
        .unwrap();
    assert_eq!(oom.device_free(), Some(30 * MIB));
    assert_eq!(oom.size, 100 * MIB);
    assert!(!oom.has_addr());
    a.free(keep).unwrap();
    sound(&a);
}

#[test]
fn observer_panic_does_not_reach_the_caller() {
    let a = alloc_with(10 * MIB, "");
    a.add_oom_observer(|_| panic!("observer bug"));
    assert!(matches!(a.malloc(64 * MIB, S0), Err(Error::OutOfMemory(_))));
    assert!(a.malloc(1024, S0).is_ok());
}

#[test]
fn empty_cache_frees_only_unsplit_segments_large_then_small() {
    let a = alloc();
    let small = a.malloc(1000, S0).unwrap();
    let large = a.malloc(12 * MIB, S0).unwrap();
    let keep = a.malloc(1000, S1).unwrap(); // its small segment stays split and live
    a.free(small).unwrap();
    a.free(large).unwrap();
    a.empty_cache().unwrap();
    let frees: Vec<(u64, u64)> = actions(&a)
        .into_iter()
        .filter(|e| e.0 == Action::SegmentFree)
        .map(|e| (e.1, e.2))
        .collect();
    assert_eq!(frees, vec![(large, 12 * MIB), (small, 2 * MIB)]);
    assert_eq!(a.stats().reserved_bytes(), 2 * MIB);
    a.free(keep).unwrap();
    sound(&a);
}

#[test]
fn snapshot_entry_is_appended_after_collecting_the_trace() {
    let a = alloc();
    let p = a.malloc(3000, S0).unwrap();
    let q = a.malloc(100, S1).unwrap();
    let first = a.snapshot();
    assert!(first.traces()[0]
        .iter()
        .all(|e| e.action != Action::Snapshot));
    let addrs: Vec<u64> = first.segments.iter().map(|s| s.address).collect();
    let mut sorted = addrs.clone();
    sorted.sort();
    assert_eq!(addrs, sorted);
    let second = a.snapshot();
    let last = second.traces()[0].last().unwrap();
    assert_eq!(last.action, Action::Snapshot);
    assert_eq!((last.addr, last.size, last.frames), (0, 3072 + 512, None));
    a.free(p).unwrap();
    a.free(q).unwrap();
}

#[test]
fn history_off_records_nothing_and_disabling_clears() {
    let a = alloc();
    a.malloc(100, S0).unwrap();
    assert_eq!(a.history_len(), 2);
    a.record_memory_history(HistoryOptions::off());
    assert_eq!(a.history_len(), 0);
    a.malloc(100, S0).unwrap();
    assert_eq!(a.history_len(), 0);
    assert!(a.snapshot().traces()[0].is_empty());
}

#[test]
fn state_mode_keeps_only_the_newest_entry_and_counts_drops() {
    let a = alloc();
    a.record_memory_history(HistoryOptions {
        enabled: HistoryMode::State,
        ..HistoryOptions::without_stacks()
    });
    let p = a.malloc(100, S0).unwrap();
    a.free(p).unwrap();
    let snap = a.snapshot();
    assert_eq!(snap.traces()[0].len(), 1);
    assert_eq!(snap.traces()[0][0].action, Action::FreeCompleted);
    assert_eq!(
        snap.recorder_info.as_ref().unwrap().dropped_entries,
        vec![3]
    );
}

#[test]
fn ring_wraps_through_the_allocator() {
    let a = alloc();
    a.record_memory_history(HistoryOptions {
        max_entries: 4,
        ..HistoryOptions::without_stacks()
    });
    for _ in 0..5 {
        let p = a.malloc(100, S0).unwrap();
        a.free(p).unwrap();
    }
    let snap = a.snapshot();
    let n: Vec<Action> = snap.traces()[0].iter().map(|e| e.action).collect();
    // 1 segment_alloc + 15 more entries; the newest 4 remain, oldest first.
    assert_eq!(
        n,
        vec![
            Action::FreeCompleted,
            Action::Alloc,
            Action::FreeRequested,
            Action::FreeCompleted
        ]
    );
    assert_eq!(
        snap.recorder_info.as_ref().unwrap().dropped_entries,
        vec![16 - 4]
    );
    let times: Vec<i64> = snap.traces()[0]
        .iter()
        .map(|e| e.time_us().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn memory_fraction_limits_new_segments() {
    let a = alloc_with(100 * MIB, "");
    a.set_memory_fraction(0.5).unwrap();
    assert!(a.malloc(40 * MIB, S0).is_ok());
    let err = a.malloc(20 * MIB, S0).unwrap_err();
    let Error::OutOfMemory(info) = err else {
        panic!("{err}")
    };
    assert_eq!(info.allowed, Some(50 * MIB));
    assert!(matches!(
        a.set_memory_fraction(1.5),
        Err(Error::InvalidFraction { .. })
    ));
    sound(&a);
}

#[test]
fn garbage_collection_frees_old_cached_segments_before_malloc() {
    let a = alloc_with(100 * MIB, "garbage_collection_threshold:0.5");
    a.set_memory_fraction(0.9).unwrap();
    let p = a.malloc(30 * MIB, S0).unwrap();
    let q = a.malloc(20 * MIB, S0).unwrap();
    a.free(p).unwrap();
    a.free(q).unwrap();
    // 50 MiB cached > 0.5 * 90 MiB: the next new segment first collects garbage.
    let _r = a.malloc(40 * MIB, S1).unwrap();
    let s = a.stats();
    assert!(s.num_device_free >= 1, "GC freed nothing");
    assert_eq!(s.num_alloc_retries, 0);
    sound(&a);
}

#[test]
fn release_available_cached_blocks_frees_oversize_before_retry() {
    let a = alloc_with(200 * MIB, "max_split_size_mb:20");
    let p = a.malloc(150 * MIB, S0).unwrap();
    a.free(p).unwrap();
    // A 100 MiB request cannot take the 150 MiB block (>= 100 + 20) and does not fit beside
    // it: the oversize block is released without the full empty_cache retry.
    let _q = a.malloc(100 * MIB, S0).unwrap();
    let s = a.stats();
    assert_eq!(s.num_alloc_retries, 0);
    assert_eq!(s.num_device_free, 1);
    sound(&a);
}

#[test]
fn expandable_segments_map_and_unmap_pages() {
    let a = alloc_with(1 << 30, "expandable_segments:True");
    let p = a.malloc(30 * MIB, S0).unwrap();
    let q = a.malloc(15 * MIB, S0).unwrap();
    // The second allocation extends the same reservation right after the first.
    assert_eq!(q, p + 30 * MIB);
    sound(&a);
    a.free(p).unwrap();
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes(), 0);
    assert_eq!(a.device().live_allocations(), 0, "reservation not released");
    let n = names(&a);
    assert!(n.contains(&Action::SegmentMap), "{n:?}");
    assert!(n.contains(&Action::SegmentUnmap), "{n:?}");
    assert!(!n.contains(&Action::SegmentAlloc));
    sound(&a);
}

#[test]
fn expandable_snapshot_has_one_segment_per_mapped_range() {
    let a = alloc_with(1 << 30, "expandable_segments:True");
    let p = a.malloc(50 * MIB, S0).unwrap();
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 1);
    let seg = &snap.segments[0];
    assert_eq!(seg.is_expandable, Some(true));
    assert_eq!(seg.address, p);
    assert_eq!(seg.total_size, 60 * MIB);
    assert!(memsnap_format::validate(&snap).is_empty());
    a.free(p).unwrap();
}

#[test]
fn unknown_pointer_free_is_an_error_and_changes_nothing() {
    let a = alloc();
    let p = a.malloc(100, S0).unwrap();
    a.free(p).unwrap();
    assert!(matches!(a.free(p), Err(Error::UnknownPointer { .. })));
    assert!(a.free(0).is_ok());
    assert_eq!(a.malloc(0, S0).unwrap(), 0);
    sound(&a);
}

#[test]
fn non_oom_device_error_is_returned_not_retried() {
    let a = alloc();
    a.device().fail_next_malloc(crate::DeviceError::Driver {
        call: "cuMemAlloc",
        code: 999,
        message: "unknown".into(),
    });
    assert!(matches!(a.malloc(100, S0), Err(Error::Device { .. })));
    assert_eq!(a.stats().num_alloc_retries, 0);
    assert!(a.malloc(100, S0).is_ok());
    sound(&a);
}

#[test]
fn context_alloc_reuses_the_allocation_stack_on_frees() {
    let a = alloc();
    a.record_memory_history(HistoryOptions {
        context: ContextMode::Alloc,
        unwinder: crate::Unwinder::Backtrace,
        ..HistoryOptions::default()
    });
    let p = a.malloc(100, S0).unwrap();
    a.free(p).unwrap();
    let snap = a.snapshot();
    let t = &snap.traces()[0];
    let alloc_frames = t[1].frames.unwrap();
    assert_eq!(t[1].action, Action::Alloc);
    assert_eq!(t[2].frames, Some(alloc_frames));
    assert_eq!(t[3].frames, Some(alloc_frames));
    assert!(snap.stack_frames(alloc_frames).len() > 0);
}

#[test]
fn stats_reset_peak_and_accumulated() {
    let a = alloc();
    let p = a.malloc(4096, S0).unwrap();
    a.free(p).unwrap();
    a.reset_peak_memory_stats();
    assert_eq!(a.stats().allocated_bytes.get(StatType::All).peak, 0);
    a.reset_accumulated_memory_stats();
    let s = a.stats();
    assert_eq!(s.allocated_bytes.get(StatType::All).allocated, 0);
    assert_eq!(s.num_device_alloc, 0);
}

/// Found by the model test: mapping an unmapped middle page left the newly mapped range and
/// a free mapped block after it as two mergeable neighbours.
#[test]
fn expandable_map_merges_with_the_free_block_after_the_mapped_range() {
    let a = alloc_with(1 << 30, "expandable_segments:True");
    let x = a.malloc(10 * MIB, S0).unwrap();
    let y = a.malloc(40 * MIB, S0).unwrap();
    let z = a.malloc(10 * MIB, S0).unwrap();
    a.free(y).unwrap();
    // Unmaps the whole page inside y, leaving mapped free pieces on both sides.
    a.empty_cache().unwrap();
    sound(&a);
    assert_eq!(a.stats().reserved_bytes(), 40 * MIB);
    let w = a.malloc(25 * MIB, S0).unwrap();
    assert_eq!(w, y);
    sound(&a);
    for p in [x, z, w] {
        a.free(p).unwrap();
    }
    sound(&a);
}

#[test]
fn a_stack_seen_before_is_interned_once() {
    let a = alloc();
    a.record_memory_history(HistoryOptions {
        unwinder: crate::Unwinder::Backtrace,
        ..HistoryOptions::default()
    });
    for _ in 0..100 {
        let p = a.malloc(4096, S0).unwrap();
        a.free(p).unwrap();
    }
    // One stack for the malloc site and one for the free site.
    assert_eq!(a.distinct_stacks(), 2);
    assert_eq!(a.history_len(), 301);
}

#[test]
fn allocator_is_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<CachingAllocator<SimulatedDevice>>();
    send_sync::<CachingAllocator<crate::HostDevice>>();
}

/// Trace times are microseconds since the Unix epoch from the counter-based history clock:
/// never decreasing, and each within a fraction of a millisecond of the OS clock read just
/// before and after its call (across the clock's calibration and several
/// resynchronisations).
#[test]
fn trace_times_follow_the_os_clock() {
    use crate::history::{epoch_micros, now_ns};
    let a = alloc();
    let os_us = || epoch_micros(now_ns());
    let mut brackets = Vec::new();
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(40) {
        let before = os_us();
        let p = a.malloc(4096, S0).unwrap();
        a.free(p).unwrap();
        brackets.push((before, os_us()));
    }
    let snap = a.snapshot();
    let trace = &snap.traces()[0];
    // segment_alloc, then alloc, free_requested, free_completed per pair.
    assert_eq!(trace.len(), 1 + 3 * brackets.len());
    let times: Vec<i64> = trace.iter().map(|e| e.time_us().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "times go back");
    const SLACK_US: i64 = 200;
    for (i, &(before, after)) in brackets.iter().enumerate() {
        for &t in &times[1 + 3 * i..4 + 3 * i] {
            assert!(
                before - SLACK_US <= t && t <= after + SLACK_US,
                "pair {i}: {t} outside [{before}, {after}]"
            );
        }
    }
    let wall_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    assert!((wall_us - times[times.len() - 1]).abs() < 1_000_000);
}

/// Regression (found replaying real snapshot 14, device 1, event 189): with expandable
/// segments, best fit counts a free block followed by unmapped pages as its size plus those
/// pages, and walks on to the next blocks while theirs is smaller — PyTorch's
/// `get_free_block`. The smallest free block (a 10 MiB tail before unmapped pages) loses to
/// a 25 MiB block elsewhere.
#[test]
fn expandable_best_fit_counts_the_unmapped_tail() {
    let a = alloc_with(1 << 30, "expandable_segments:True");
    let p = a.malloc(25 * MIB, S0).unwrap(); // maps [0, 40): p [0, 25), free [25, 40)
    let q = a.malloc(15 * MIB, S0).unwrap(); // [25, 40) exactly
    let r = a.malloc(30 * MIB, S0).unwrap(); // maps [40, 80): r [40, 70), free tail [70, 80)
    assert_eq!((q - p, r - p), (25 * MIB, 40 * MIB));
    a.free(p).unwrap(); // free [0, 25), between nothing and q
    let d = a.malloc(8 * MIB, S0).unwrap();
    assert_eq!(
        d, p,
        "takes the 25 MiB block, not the 10 MiB tail before unmapped pages"
    );
    sound(&a);
}

/// Regression (`find_expandable_block`): the room for a new mapping is the first run of free
/// and unmapped blocks with enough bytes, through free blocks between holes, and the mapping
/// merges the pieces. Here a free 10 MiB block, a 20 MiB hole and a free 10 MiB block hold a
/// 35 MiB request with one 20 MiB mapping, instead of mapping 40 MiB at the end.
#[test]
fn expandable_space_spans_free_and_unmapped_runs() {
    let a = alloc_with(1 << 30, "expandable_segments:True");
    let base = a.malloc(30 * MIB, S0).unwrap(); // maps [0, 40)
    let b = a.malloc(30 * MIB, S0).unwrap(); // maps [40, 60): b [30, 60)
    let c = a.malloc(10 * MIB, S0).unwrap(); // maps [60, 80): c [60, 70)
    let d = a.malloc(30 * MIB, S0).unwrap(); // maps [80, 100): d [70, 100)
    assert_eq!(
        (b, c, d),
        (base + 30 * MIB, base + 60 * MIB, base + 70 * MIB)
    );
    a.free(b).unwrap();
    a.free(c).unwrap(); // free [30, 70)
    a.empty_cache().unwrap(); // unmaps the whole page [40, 60)
    let e = a.malloc(35 * MIB, S0).unwrap();
    assert_eq!(e, base + 30 * MIB);
    let trace = actions(&a);
    let maps: Vec<(u64, u64)> = trace
        .iter()
        .filter(|t| t.0 == Action::SegmentMap)
        .map(|t| (t.1 - base, t.2))
        .collect();
    assert_eq!(maps.last(), Some(&(40 * MIB, 20 * MIB)));
    sound(&a);
}

/// `restore_segment` rebuilds a recorded segment: allocated blocks at their addresses
/// (freeable), free neighbours merged, statistics counted; a layout that does not tile, or
/// an overlap, changes nothing.
#[test]
fn restore_segment_rebuilds_a_recorded_layout() {
    use memsnap_format::{Block, Segment, SegmentType};
    let a = alloc();
    let base = 0x1000_0000_0000;
    let block = |addr: u64, size: u64, state: BlockState| Block {
        address: Some(addr),
        size,
        requested_size: Some(size - 100),
        state,
        ..Default::default()
    };
    let mut seg = Segment::new(0, base, 20 * MIB, 3);
    seg.segment_type = Some(SegmentType::Large);
    seg.blocks = vec![
        block(base, 4 * MIB, BlockState::ActiveAllocated),
        block(base + 4 * MIB, 2 * MIB, BlockState::Inactive),
        block(base + 6 * MIB, 2 * MIB, BlockState::Inactive),
        block(base + 8 * MIB, 12 * MIB, BlockState::ActiveAllocated),
    ];
    let mut bad = seg.clone();
    bad.total_size += 512;
    assert!(!a.restore_segment(&bad));
    assert!(a.restore_segment(&seg));
    assert!(!a.restore_segment(&seg), "overlaps the restored segment");
    sound(&a);
    let s = a.stats();
    assert_eq!(s.reserved_bytes(), 20 * MIB);
    assert_eq!(s.allocated_bytes(), 16 * MIB);
    assert_eq!(a.block_size(base + 8 * MIB), Some(12 * MIB));
    // The merged 4 MiB free block serves a 3 MiB request on stream 3.
    assert_eq!(a.malloc(3 * MIB, Stream(3)).unwrap(), base + 4 * MIB);
    sound(&a);
}
