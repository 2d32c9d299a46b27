//! Concurrent stress: 8 threads allocate, free (also each other's pointers), record streams
//! and empty the cache at once; invariants hold and nothing leaks.
//!
//! The full 1M operations run in debug builds too (about 12 s on 2 cores).

use std::sync::{Arc, Barrier, Mutex};

use memsnap_recorder::{CachingAllocator, HistoryOptions, SimulatedDevice, Stream};

use super::common::assert_sound;

const THREADS: usize = 8;
const TOTAL_OPS: usize = 1_000_000;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn eight_threads_keep_invariants_and_leak_nothing() {
    let alloc = Arc::new(CachingAllocator::new(SimulatedDevice::new(4 << 30)));
    alloc.record_memory_history(HistoryOptions {
        max_entries: 100_000,
        ..HistoryOptions::without_stacks()
    });
    let shared: Arc<Mutex<Vec<u64>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (alloc, shared, barrier) = (alloc.clone(), shared.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9 + t as u64 * 7919);
                let stream = Stream(t as i64 % 4);
                let mut live: Vec<u64> = Vec::new();
                barrier.wait();
                for i in 0..TOTAL_OPS / THREADS {
                    let r = rng.next();
                    match r % 100 {
                        0..=47 => {
                            let size = match r >> 8 & 7 {
                                0 => 1 + (r >> 16) % (24 << 20),
                                1 | 2 => 1 + (r >> 16) % (4 << 20),
                                _ => 1 + (r >> 16) % 8192,
                            };
                            if let Ok(p) = alloc.malloc(size, stream) {
                                live.push(p);
                            }
                        }
                        48..=93 if !live.is_empty() => {
                            let p = live.swap_remove((r >> 8) as usize % live.len());
                            if r.is_multiple_of(7) {
                                shared.lock().unwrap().push(p);
                            } else {
                                alloc.free(p).unwrap();
                            }
                        }
                        94..=96 => {
                            if let Some(p) = shared.lock().unwrap().pop() {
                                alloc.free(p).unwrap();
                            }
                        }
                        97 if !live.is_empty() => {
                            alloc.record_stream(live[0], Stream((r >> 8) as i64 % 4));
                        }
                        98 if i.is_multiple_of(64) => alloc.empty_cache().unwrap(),
                        _ => {}
                    }
                }
                for p in live {
                    alloc.free(p).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for p in shared.lock().unwrap().drain(..) {
        alloc.free(p).unwrap();
    }
    assert_sound(&alloc, "after the stress run");
    let stats = alloc.stats();
    assert_eq!(stats.allocated_bytes(), 0);
    alloc.empty_cache().unwrap();
    assert_sound(&alloc, "after empty_cache");
    assert_eq!(alloc.stats().reserved_bytes(), 0);
    assert_eq!(alloc.device().used(), 0, "device memory leaked");
    assert_eq!(alloc.device().live_allocations(), 0);
    let snap = alloc.snapshot();
    assert!(memsnap_format::validate(&snap).is_empty());
    assert!(
        snap.recorder_info.unwrap().dropped_entries[0] > 0,
        "the ring should have wrapped"
    );
}
