//! Model-based property test: random operation sequences over several streams keep every
//! invariant after every step, and the recorded trace replays to the allocator's live set.

use memsnap_format::validate;
use memsnap_recorder::{CachingAllocator, HistoryOptions, SimulatedDevice, Stream};
use proptest::prelude::*;

use super::common::{assert_sound, blocks_by_state, replay_trace};

const MIB: u64 = 1 << 20;

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: u64, stream: i64 },
    Free { pick: usize },
    RecordStream { pick: usize, stream: i64 },
    EmptyCache,
    SetFraction { fraction: f64 },
    CompleteStream { stream: i64 },
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        4 => 1u64..=MIB,
        2 => MIB..12 * MIB,
        1 => 12 * MIB..70 * MIB,
    ];
    prop_oneof![
        8 => (size, 0i64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        6 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), 0i64..3).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        1 => Just(Op::EmptyCache),
        1 => (0.3f64..=1.0).prop_map(|fraction| Op::SetFraction { fraction }),
        2 => (0i64..3).prop_map(|stream| Op::CompleteStream { stream }),
    ]
}

fn conf() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just(""),
        Just("max_split_size_mb:20"),
        Just("expandable_segments:True"),
        Just("garbage_collection_threshold:0.5"),
        Just("roundup_power2_divisions:4,max_split_size_mb:40"),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_invariants_and_replay(conf in conf(), ops in prop::collection::vec(op(), 1..120)) {
        let device = SimulatedDevice::new(256 * MIB).with_manual_events();
        let alloc = CachingAllocator::with_conf(device, conf).unwrap();
        alloc.record_memory_history(HistoryOptions::without_stacks());
        let mut live: Vec<u64> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc { size, stream } => {
                    if let Ok(ptr) = alloc.malloc(size, Stream(stream)) {
                        live.push(ptr);
                    }
                }
                Op::Free { pick } if !live.is_empty() => {
                    let ptr = live.swap_remove(pick % live.len());
                    alloc.free(ptr).unwrap();
                }
                Op::RecordStream { pick, stream } if !live.is_empty() => {
                    alloc.record_stream(live[pick % live.len()], Stream(stream));
                }
                Op::EmptyCache => alloc.empty_cache().unwrap(),
                Op::SetFraction { fraction } => alloc.set_memory_fraction(fraction).unwrap(),
                Op::CompleteStream { stream } => alloc.device().complete_stream(Stream(stream)),
                _ => {}
            }
            assert_sound(&alloc, &format!("step {step} ({op:?}) with conf {conf:?}"));
        }
        let snap = alloc.snapshot();
        prop_assert!(validate(&snap).is_empty(), "{:?}", validate(&snap));
        let (replayed_live, replayed_pending) = replay_trace(&snap, 0);
        let (live_blocks, pending_blocks) = blocks_by_state(&snap);
        prop_assert_eq!(&replayed_live, &live_blocks);
        prop_assert_eq!(&replayed_pending, &pending_blocks);
        prop_assert_eq!(live_blocks.len(), live.len());

        // Everything returns to the device.
        for ptr in live {
            alloc.free(ptr).unwrap();
        }
        alloc.empty_cache().unwrap();
        assert_sound(&alloc, "after releasing everything");
        prop_assert_eq!(alloc.stats().reserved_bytes(), 0);
        prop_assert_eq!(alloc.device().used(), 0);
        prop_assert_eq!(alloc.device().live_allocations(), 0);
    }
}
