//! The size filter: allocations below a threshold fold into a residual whose total is exact
//! at every instant.

use memsnap_analysis::{DeviceTimeline, LayoutRequest, Lifetime};
use memsnap_format::Action;
use proptest::prelude::*;

use crate::util::snapshot_of;

/// Random histories: allocs, frees (some of addresses never allocated), free pairs split.
fn history() -> impl Strategy<Value = Vec<(Action, u64, u64)>> {
    let op = (0u8..4, 0u64..12, 0u64..5000);
    proptest::collection::vec(op, 0..120).prop_map(|ops| {
        ops.into_iter()
            .map(|(kind, slot, size)| {
                let action = match kind {
                    0 | 1 => Action::Alloc,
                    2 => Action::FreeRequested,
                    _ => Action::FreeCompleted,
                };
                (action, 0x1000 * (slot + 1), size)
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn residual_plus_large_allocations_equals_the_curve_at_every_event(
        events in history(),
        threshold in 0u64..6000,
    ) {
        let snapshot = snapshot_of(&events);
        let t = DeviceTimeline::build(&snapshot, 0).unwrap();
        let replay = t.replay();
        for lifetime in [Lifetime::Allocated, Lifetime::Active] {
            let residual = t.residual_curve(threshold, lifetime);
            let curve = t.curves().for_lifetime(lifetime);
            for e in 0..replay.axis_len() {
                let large: u64 = replay
                    .live_at(e, lifetime)
                    .iter()
                    .map(|id| replay.allocations[id.0 as usize].size)
                    .filter(|&s| s >= threshold)
                    .sum();
                prop_assert_eq!(large + residual.at(e), curve.at(e));
            }
            // The layout's residual band closes the same gap in every column.
            let layout = t.layout(&LayoutRequest {
                min_size: threshold,
                max_bands: usize::MAX,
                lifetime,
                width_px: replay.axis_len(),
                ..LayoutRequest::whole(&t, 1)
            }).unwrap();
            for c in &layout.columns {
                prop_assert_eq!(c.total_bytes - c.drawn_bytes, residual.at(c.event));
            }
        }
    }
}
