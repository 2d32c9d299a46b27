//! Layout invariants: bands never overlap, stack totals equal the curve at every column,
//! hit testing finds what is drawn.

use memsnap_analysis::{Axis, DeviceTimeline, Hit, Layout, LayoutRequest, Lifetime};
use memsnap_workload::{generate, TrainingRun};

fn timeline(run: &TrainingRun) -> DeviceTimeline {
    let (snapshot, _) = generate(run);
    DeviceTimeline::build(&snapshot, 0).unwrap()
}

/// In every column the drawn bands tile `[0, drawn_bytes)` in stacking order, and the
/// residual fills the rest up to the curve.
fn check_invariants(t: &DeviceTimeline, layout: &Layout) {
    let curve = t.curves().for_lifetime(layout.request.lifetime);
    for (c, column) in layout.columns.iter().enumerate() {
        let mut expected_bottom = 0u64;
        for band in &layout.bands {
            if let Some(bottom) = band.bottom_at(c as u32) {
                assert_eq!(
                    bottom, expected_bottom,
                    "column {c}: band {:?} overlaps or leaves a gap",
                    band.alloc
                );
                expected_bottom += band.size;
            }
        }
        assert_eq!(expected_bottom, column.drawn_bytes, "column {c}");
        assert_eq!(column.total_bytes, curve.at(column.event), "column {c}");
        assert!(column.drawn_bytes <= column.total_bytes, "column {c}");
        assert!(column.total_min <= column.total_bytes && column.total_bytes <= column.total_max);
    }
    // Bands are in allocation order, so `Layout::band` finds each by binary search.
    for band in &layout.bands {
        assert_eq!(layout.band(band.alloc), Some(band));
    }
    assert!(layout.bands.windows(2).all(|w| w[0].alloc < w[1].alloc));
}

#[test]
fn bands_never_overlap_and_stack_to_the_curve() {
    let run = TrainingRun {
        steps: 6,
        layers: 6,
        max_entries: Some(900),
        ..Default::default()
    };
    let t = timeline(&run);
    let n = t.replay().axis_len() as f64;
    for (start, end, width, min_size, max_bands) in [
        (0.0, n, 1000, 0, usize::MAX),
        (0.0, n, 37, 0, usize::MAX),
        (n / 3.0, n / 2.0, 800, 1 << 20, 50),
        (10.5, 20.25, 500, 0, 3),
        (0.0, n, 200, 0, 10),
    ] {
        let req = LayoutRequest {
            axis: Axis::Event,
            start,
            end,
            width_px: width,
            min_size,
            max_bands,
            lifetime: Lifetime::Active,
        };
        let layout = t.layout(&req).unwrap();
        check_invariants(&t, &layout);
    }
}

#[test]
fn without_filter_every_live_allocation_is_drawn_at_full_resolution() {
    let t = timeline(&TrainingRun::default());
    let n = t.replay().axis_len();
    let layout = t
        .layout(&LayoutRequest {
            width_px: n,
            max_bands: usize::MAX,
            ..LayoutRequest::whole(&t, n)
        })
        .unwrap();
    check_invariants(&t, &layout);
    for (c, column) in layout.columns.iter().enumerate() {
        assert_eq!(column.event, c as u32);
        assert_eq!(column.drawn_bytes, column.total_bytes, "column {c}");
    }
}

#[test]
fn time_axis_layout_keeps_the_invariants() {
    let t = timeline(&TrainingRun::default());
    let (first, last) = t.time().span().unwrap();
    let (t0, t1) = (first as f64, last as f64 + 1.0);
    let layout = t
        .layout(&LayoutRequest {
            axis: Axis::Time,
            start: t0,
            end: t1,
            width_px: 640,
            min_size: 0,
            max_bands: 100,
            lifetime: Lifetime::Allocated,
        })
        .unwrap();
    check_invariants(&t, &layout);
}

#[test]
fn hit_test_finds_the_band_drawn_under_the_pointer() {
    let t = timeline(&TrainingRun::default());
    let layout = t.layout(&LayoutRequest::whole(&t, 300)).unwrap();
    let mut checked = 0;
    for band in layout.bands.iter().take(50) {
        let c = band.first_column;
        let column = &layout.columns[c as usize];
        let x = (column.x0 + column.x1) / 2.0;
        let bottom = band.bottom_at(c).unwrap();
        assert_eq!(layout.hit_test(x, bottom), Some(Hit::Band(band.alloc)));
        assert_eq!(
            layout.hit_test(x, bottom + band.size - 1),
            Some(Hit::Band(band.alloc))
        );
        checked += 1;
    }
    assert!(checked > 0);
    let c = &layout.columns[0];
    assert_eq!(layout.hit_test(c.x0, c.total_bytes), None);
}

#[test]
fn bad_layout_requests_are_errors_not_panics() {
    let t = timeline(&TrainingRun::default());
    let mut req = LayoutRequest::whole(&t, 0);
    assert!(t.layout(&req).is_err());
    req.width_px = 10;
    req.start = f64::NAN;
    assert!(t.layout(&req).is_err());
    req.start = 5.0;
    req.end = 5.0;
    assert!(t.layout(&req).is_err());
    // Far outside the trace is fine: it shows the last state.
    req.start = 1e12;
    req.end = 2e12;
    assert!(t.layout(&req).is_ok());
}
