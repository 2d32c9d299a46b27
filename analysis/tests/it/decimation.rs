//! The decimated curves the timeline draws (a min and max per pixel column) equal the exact
//! curve's min and max over the events each column covers.

use memsnap_analysis::curve::{Curve, CurveMinMax, RangeMinMax};
use memsnap_analysis::{Axis, CurveKind, DeviceTimeline, LayoutRequest, Lifetime};
use memsnap_workload::{generate, TrainingRun};
use proptest::prelude::*;

fn exact(values: &[u64], lo: usize, hi: usize) -> Option<(u64, u64)> {
    let slice = values.get(lo..hi.min(values.len()))?;
    let min = slice.iter().min()?;
    let max = slice.iter().max()?;
    Some((*min, *max))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn range_min_max_equals_a_scan_of_the_range(
        values in proptest::collection::vec(0u64..1_000_000, 0..3000),
        ranges in proptest::collection::vec((0usize..3100, 0usize..3100), 1..40),
    ) {
        let table = RangeMinMax::build(&values);
        prop_assert_eq!(table.len(), values.len());
        for (a, b) in ranges {
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert_eq!(table.query(&values, lo, hi), exact(&values, lo, hi), "{}..{}", lo, hi);
        }
    }

    /// A curve kept as its changes (the reserved curve) answers as the same curve with every
    /// value kept: values, `at` (also past the end), the peak and range min/max.
    #[test]
    fn a_curve_kept_as_changes_answers_as_every_value_would(
        initial in 0u64..1000,
        len in 0usize..400,
        raw in proptest::collection::vec((0u32..400, -600i128..600), 0..60),
        ranges in proptest::collection::vec((0usize..420, 0usize..420), 1..20),
    ) {
        let mut changes: Vec<(u32, i128)> =
            raw.into_iter().filter(|&(e, _)| (e as usize) < len).collect();
        changes.sort_by_key(|&(e, _)| e);
        let mut deltas = vec![0i128; len];
        for &(e, d) in &changes {
            deltas[e as usize] += d;
        }
        let every = Curve::from_deltas(initial, &deltas);
        let kept = Curve::from_changes(initial, len, changes);
        prop_assert_eq!(kept.len(), every.len());
        prop_assert_eq!(kept.values().collect::<Vec<_>>(), every.values().collect::<Vec<_>>());
        prop_assert_eq!(kept.max(), every.max());
        for e in 0..len as u32 + 3 {
            prop_assert_eq!(kept.at(e), every.at(e), "event {}", e);
        }
        let (kept_table, every_table) = (CurveMinMax::build(&kept), CurveMinMax::build(&every));
        for (a, b) in ranges {
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert_eq!(
                kept_table.query(&kept, lo, hi),
                every_table.query(&every, lo, hi),
                "{}..{}", lo, hi
            );
            prop_assert_eq!(kept.min_max(lo, hi), every_table.query(&every, lo, hi));
        }
    }

    #[test]
    fn curve_envelope_and_layout_columns_equal_the_exact_min_max_per_pixel(
        entries in 200usize..4000,
        seed in 0u64..1000,
        width in 1u32..700,
        window in (0.0f64..1.0, 0.0f64..1.0),
    ) {
        let run = TrainingRun { target_entries: Some(entries), seed, ..TrainingRun::default() };
        let (snapshot, _) = generate(&run);
        let t = DeviceTimeline::build(&snapshot, 0).unwrap();
        let n = t.replay().axis_len();
        let (a, b) = (window.0.min(window.1), window.0.max(window.1));
        let start = (a * f64::from(n)) as u32;
        let end = ((b * f64::from(n)) as u32).max(start + 1);

        // The envelope: `width` equal slices of [start, end).
        for kind in [CurveKind::Allocated, CurveKind::Active, CurveKind::Reserved] {
            let curve = &t.curves().get(kind);
            let envelope = t.curve_envelope(kind, start, end, width).unwrap();
            prop_assert_eq!(envelope.len(), width as usize);
            let span = f64::from(end - start);
            for (c, &got) in envelope.iter().enumerate() {
                let lo = start as usize + (span * c as f64 / f64::from(width)) as usize;
                let hi = (start as usize + (span * (c + 1) as f64 / f64::from(width)) as usize)
                    .max(lo + 1);
                let v = curve.at(lo as u32);
                let want = exact(&curve.values().collect::<Vec<_>>(), lo, hi).unwrap_or((v, v));
                prop_assert_eq!(got, want, "{:?} column {}", kind, c);
            }
        }

        // The layout's columns: from the sampled event to the event at the column's right
        // edge (rounded up), as the layout documents.
        for lifetime in [Lifetime::Allocated, Lifetime::Active] {
            let request = LayoutRequest {
                axis: Axis::Event,
                start: f64::from(start),
                end: f64::from(end),
                width_px: width,
                min_size: 0,
                max_bands: 100,
                lifetime,
            };
            let layout = t.layout(&request).unwrap();
            let curve = t.curves().for_lifetime(lifetime);
            let last = n - 1;
            for (c, column) in layout.columns.iter().enumerate() {
                let s = column.event;
                let right = (column.x1.ceil().max(0.0) as u32).min(last).max(s);
                let (lo, hi) = (s..=right)
                    .map(|e| curve.at(e))
                    .fold((u64::MAX, 0), |(lo, hi), v| (lo.min(v), hi.max(v)));
                prop_assert_eq!((column.total_min, column.total_max), (lo, hi), "column {}", c);
            }
        }
    }
}
