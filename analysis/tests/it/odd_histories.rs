//! Weird but valid histories never panic and are accounted for. Regression tests are named
//! after what broke.

use memsnap_analysis::{
    summarize, summarize_owned, CurveKind, DeviceTimeline, GroupBy, Instant, LayoutRequest,
    Lifetime, Origin, StepOptions, SummaryOptions,
};
use memsnap_format::{Action, Block, BlockState, Segment, Snapshot, TraceEntry};

use crate::util::snapshot_of;

fn exercise(snapshot: &Snapshot) {
    let summary = summarize(snapshot, &SummaryOptions::default()).expect("summary");
    let owned = summarize_owned(snapshot.clone(), &SummaryOptions::default()).expect("summary");
    assert_eq!(
        owned, summary,
        "dropping the entries after the build changed the summary"
    );
    for device in DeviceTimeline::devices(snapshot) {
        let t = DeviceTimeline::build(snapshot, device).expect("timeline");
        let _ = t.steps(&StepOptions::default());
        for at in [
            Instant::Peak,
            Instant::Event(0),
            Instant::Event(u32::MAX),
            Instant::TimeUs(0),
        ] {
            let _ = t.live_groups(snapshot, at, Lifetime::Active, GroupBy::File, 0);
            let _ = t.fragmentation(at);
        }
        let _ = t.top_sites(snapshot, GroupBy::Stack);
        t.layout(&LayoutRequest::whole(&t, 64)).expect("layout");
        t.curve_envelope(CurveKind::Reserved, 0, t.replay().axis_len(), 7)
            .expect("envelope");
    }
}

#[test]
fn empty_snapshot_and_empty_traces() {
    exercise(&Snapshot::default());
    exercise(&Snapshot::new(4));
    let s = summarize(&Snapshot::new(2), &SummaryOptions::default()).unwrap();
    assert!(s.devices.is_empty());
    assert!(DeviceTimeline::build(&Snapshot::new(1), 5).is_err());
}

#[test]
fn frees_without_allocs_count_from_the_start_of_the_window() {
    let snapshot = snapshot_of(&[
        (Action::FreeRequested, 0x10, 300),
        (Action::Alloc, 0x20, 100),
        (Action::FreeCompleted, 0x10, 300),
        (Action::FreeCompleted, 0x30, 50),
    ]);
    exercise(&snapshot);
    let t = DeviceTimeline::build(&snapshot, 0).unwrap();
    let replay = t.replay();
    assert_eq!(replay.before_window_bytes, 350);
    assert_eq!(replay.before_window_allocations, 2);
    assert!(replay.truncated);
    assert_eq!(
        t.curves().active.values().collect::<Vec<_>>(),
        vec![350, 450, 150, 100]
    );
    assert_eq!(
        t.curves().allocated.values().collect::<Vec<_>>(),
        vec![50, 150, 150, 100]
    );
}

#[test]
fn peak_counts_memory_from_before_the_window_that_the_first_event_frees() {
    // Real file 08 has a single `free_completed`: the peak is the state before it.
    let snapshot = snapshot_of(&[(Action::FreeCompleted, 0x10, 4096)]);
    let t = DeviceTimeline::build(&snapshot, 0).unwrap();
    let peak = t.peak(CurveKind::Active);
    assert_eq!((peak.bytes, peak.event), (4096, 0));
}

#[test]
fn live_blocks_the_trace_never_allocated_come_from_the_segments() {
    let mut snapshot = snapshot_of(&[(Action::Alloc, 0x1000, 700)]);
    let mut seg = Segment::new(0, 0x1000, 4096, 0);
    let block = |address, size, requested, state| Block {
        requested_size: Some(requested),
        ..Block::new(address, size, state)
    };
    seg.blocks = vec![
        block(0x1000, 1024, 700, BlockState::ActiveAllocated),
        block(0x1400, 1024, 1000, BlockState::ActiveAllocated),
        block(0x1800, 2048, 8, BlockState::Inactive),
    ];
    snapshot.segments.push(seg);
    exercise(&snapshot);
    let t = DeviceTimeline::build(&snapshot, 0).unwrap();
    let replay = t.replay();
    assert_eq!(replay.live_in_segments_bytes, 1000);
    assert_eq!(replay.allocations[0].origin, Origin::LiveInSegments);
    assert_eq!(t.curves().active.values().collect::<Vec<_>>(), vec![1700]);
    assert_eq!(t.curves().reserved.values().collect::<Vec<_>>(), vec![4096]);
    let frag = t.fragmentation(Instant::Event(0));
    assert_eq!(frag.len(), 1);
    assert_eq!(frag[0].allocated_bytes, 1700);
    assert_eq!(frag[0].largest_free_block, 2048);
}

#[test]
fn state_only_snapshot_shows_its_live_blocks_at_event_zero() {
    let mut snapshot = Snapshot::new(1);
    let mut seg = Segment::new(0, 0x1000, 1024, 0);
    seg.blocks = vec![Block {
        address: None,
        size: 1024,
        requested_size: Some(1000),
        state: BlockState::ActiveAllocated,
        frames: None,
        forward_frames: None,
        history: None,
        extra: Vec::new(),
        exact: Default::default(),
    }];
    snapshot.segments.push(seg);
    exercise(&snapshot);
    let t = DeviceTimeline::build(&snapshot, 0).unwrap();
    assert_eq!(t.peak(CurveKind::Active).bytes, 1000);
    let layout = t.layout(&LayoutRequest::whole(&t, 10)).unwrap();
    assert_eq!(layout.bands.len(), 1);
}

#[test]
fn unknown_actions_zero_sizes_double_allocs_and_missing_times() {
    let mut snapshot = snapshot_of(&[
        (Action::Alloc, 0x10, 0),
        (Action::Alloc, 0x20, 64),
        (Action::Alloc, 0x20, 64), // never freed in between
        (Action::SegmentFree, 0x9000, 2 << 20),
        (Action::Oom, 0, 1 << 30),
        (Action::Snapshot, 0, 0),
        (Action::Annotate, 0x20, 0),
        (Action::FreeCompleted, 0x20, 64),
        (Action::Free, 0x10, 0),
    ]);
    let other = snapshot.strings.intern("mystery_action");
    let trace = &mut snapshot.device_traces.as_mut().unwrap()[0];
    let mut odd = TraceEntry::new(Action::Other, 0x40, 12, 0);
    odd.set_other_action(other);
    odd.set_time_us(Some(10));
    trace.push(odd);
    trace[1].set_time_us(Some(20)); // backwards relative to the one after, absent elsewhere
    exercise(&snapshot);
    let t = DeviceTimeline::build(&snapshot, 0).unwrap();
    let replay = t.replay();
    assert_eq!(replay.anomaly_count, 1);
    assert_eq!(replay.oom_events, vec![4]);
    assert_eq!(replay.actions.other, 2);
    assert_eq!(t.curves().active.values().last(), Some(0));
    assert!(t.time().has_time());
}

#[test]
fn hostile_sizes_saturate_instead_of_overflowing() {
    let snapshot = snapshot_of(&[
        (Action::Alloc, 0x10, u64::MAX),
        (Action::Alloc, 0x20, u64::MAX),
        (Action::FreeCompleted, 0x30, u64::MAX),
        (Action::SegmentAlloc, 0x40, u64::MAX),
        (Action::SegmentAlloc, 0x80, u64::MAX),
    ]);
    exercise(&snapshot);
}

#[test]
fn first_step_floor_is_not_a_leak() {
    // The warm-up step allocates optimizer state after its backward pass; its minimum lies
    // below the later steps' floor, which once read as a leak of several MiB per step.
    let run = memsnap_workload::TrainingRun::default();
    let (snapshot, _) = memsnap_workload::generate(&run);
    let t = DeviceTimeline::build(&snapshot, 0).unwrap();
    let analysis = t.steps(&StepOptions::default());
    assert!(analysis.steps.len() >= 3);
    assert_eq!(analysis.drift.min_bytes_per_step, 0.0);
    assert!(!analysis.drift.leak_suspected);
}

/// The curves as exact `i128` sums of the replay's intervals and the trace's segment events,
/// clamped to `0..=u64::MAX`: what `Curves::build` computed before it summed in `i64` in
/// place (falling back to this when a sum leaves `i64`).
fn exact_curves(snapshot: &Snapshot, t: &DeviceTimeline) -> [Vec<u64>; 3] {
    let replay = t.replay();
    let n = replay.trace_len as usize;
    let (mut allocated, mut active, mut reserved) =
        (vec![0i128; n], vec![0i128; n], vec![0i128; n]);
    let mut initial = 0u64;
    for a in &replay.allocations {
        let size = i128::from(a.size);
        match a.alloc_event() {
            Some(e) => {
                allocated[e as usize] += size;
                active[e as usize] += size;
            }
            None => initial = initial.saturating_add(a.size),
        }
        if let Some(f) = a.free_requested().or(a.free_completed()) {
            allocated[f as usize] -= size;
        }
        if let Some(f) = a.free_completed() {
            active[f as usize] -= size;
        }
    }
    for (i, e) in snapshot.traces()[0].iter().enumerate() {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => reserved[i] += i128::from(e.size),
            Action::SegmentFree | Action::SegmentUnmap => reserved[i] -= i128::from(e.size),
            _ => {}
        }
    }
    let sum = |start: u64, deltas: Vec<i128>| -> Vec<u64> {
        let mut value = i128::from(start);
        deltas
            .into_iter()
            .map(|d| {
                value += d;
                u64::try_from(value.max(0)).unwrap_or(u64::MAX)
            })
            .collect()
    };
    [
        sum(initial, allocated),
        sum(initial, active),
        sum(replay.reserved_before_window, reserved),
    ]
}

#[test]
fn curves_summed_in_place_equal_the_exact_sums_also_past_i64() {
    let generated = memsnap_workload::generate(&memsnap_workload::TrainingRun::default()).0;
    let past_i64 = snapshot_of(&[
        (Action::Alloc, 0x10, u64::MAX),
        (Action::Alloc, 0x20, i64::MAX as u64),
        (Action::FreeCompleted, 0x10, u64::MAX),
        (Action::SegmentAlloc, 0x40, u64::MAX),
        (Action::SegmentFree, 0x40, u64::MAX),
        (Action::SegmentFree, 0x80, 1 << 40),
    ]);
    // Each value fits in i64, but two live ones do not.
    let sum_past_i64 = snapshot_of(&[
        (Action::Alloc, 0x10, 1 << 62),
        (Action::Alloc, 0x20, 1 << 62),
        (Action::SegmentAlloc, 0x40, 3 << 61),
        (Action::SegmentAlloc, 0x80, 3 << 61),
    ]);
    // More freed than reserved before, then reserved again (the net change is positive, so
    // nothing counts as reserved before the window): the sum goes below zero and clamps.
    let below_zero = snapshot_of(&[
        (Action::SegmentAlloc, 0x40, 4096),
        (Action::SegmentFree, 0x80, 8192),
        (Action::SegmentAlloc, 0xc0, 8192),
    ]);
    for snapshot in [&generated, &past_i64, &sum_past_i64, &below_zero] {
        let t = DeviceTimeline::build(snapshot, 0).unwrap();
        let [allocated, active, reserved] = exact_curves(snapshot, &t);
        assert_eq!(t.curves().allocated.values().collect::<Vec<_>>(), allocated);
        assert_eq!(t.curves().active.values().collect::<Vec<_>>(), active);
        assert_eq!(t.curves().reserved.values().collect::<Vec<_>>(), reserved);
        assert!(!allocated.is_empty());
    }
}

#[test]
fn the_drawing_indexes_built_with_the_timeline_equal_those_built_later() {
    let (snapshot, _) = memsnap_workload::generate(&memsnap_workload::TrainingRun::default());
    let eager = DeviceTimeline::build_for_drawing(&snapshot, 0).unwrap();
    let lazy = DeviceTimeline::build(&snapshot, 0).unwrap();
    assert_eq!(eager.by_size_desc(), lazy.by_size_desc());
    // Largest first, ties in stacking order.
    assert!(eager.by_size_desc().windows(2).all(|w| {
        let size =
            |o: &memsnap_analysis::SizeOrdered| eager.replay().allocations[o.id.0 as usize].size;
        (std::cmp::Reverse(size(&w[0])), w[0].id) < (std::cmp::Reverse(size(&w[1])), w[1].id)
    }));
    let axis = eager.replay().axis_len();
    for o in eager.by_size_desc() {
        let a = &eager.replay().allocations[o.id.0 as usize];
        assert_eq!(
            (o.start, o.end_allocated, o.end_active),
            (
                a.start(),
                a.end(Lifetime::Allocated, axis),
                a.end(Lifetime::Active, axis)
            )
        );
    }
    for kind in [CurveKind::Allocated, CurveKind::Active, CurveKind::Reserved] {
        assert_eq!(
            eager.curve_envelope(kind, 0, axis, 97).unwrap(),
            lazy.curve_envelope(kind, 0, axis, 97).unwrap()
        );
    }
}

#[test]
fn a_profile_from_steps_already_found_equals_one_that_finds_them_and_shares_them() {
    let (snapshot, _) = memsnap_workload::generate(&memsnap_workload::TrainingRun::default());
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let options = memsnap_analysis::SummaryOptions::default();
    let steps = std::sync::Arc::new(timeline.steps(&options.steps));
    assert!(!steps.steps.is_empty());
    let reused = memsnap_analysis::compare::device_profile_with_steps(
        &snapshot,
        &timeline,
        &options,
        steps.clone(),
    );
    assert_eq!(
        reused,
        memsnap_analysis::compare::device_profile(&snapshot, &timeline, &options)
    );
    assert!(!reused.summary.steps.is_empty());
    // The profile shares the steps it was given (a copy was 211 MB for 303,030 steps).
    assert!(std::ptr::eq(
        reused.summary.steps.steps().as_ptr(),
        steps.steps.as_ptr()
    ));
}

/// The viewer's profile skips the phases' categories (58 MB for a run of 303,030 steps):
/// the same summary otherwise, its phases' categories empty.
#[test]
fn a_summary_without_phase_categories_differs_only_in_them() {
    let (snapshot, _) = memsnap_workload::generate(&memsnap_workload::TrainingRun::default());
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let with = memsnap_analysis::SummaryOptions::default();
    let without = memsnap_analysis::SummaryOptions {
        phase_categories: false,
        ..with
    };
    let full = memsnap_analysis::compare::device_profile(&snapshot, &timeline, &with);
    let lean = memsnap_analysis::compare::device_profile(&snapshot, &timeline, &without);
    assert_eq!(full.summary.steps.steps(), lean.summary.steps.steps());
    assert_eq!(full.summary.peak, lean.summary.peak);
    assert_eq!(full.sites, lean.sites);
    let phase_bytes = |p: &memsnap_analysis::compare::DeviceProfile| -> Vec<u64> {
        p.summary
            .steps
            .iter()
            .flat_map(|s| {
                s.phases()
                    .map(|ph| ph.categories_at_peak.total())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    assert!(phase_bytes(&full).iter().any(|&b| b > 0));
    assert!(phase_bytes(&lean).iter().all(|&b| b == 0));
}

/// Live bytes by category after `event`, summed exactly (`i128`) and saturated: what
/// `categories_at` computed for every query before it summed in wrapping `u64` in place.
fn exact_categories_at(
    t: &DeviceTimeline,
    categories: &[memsnap_analysis::Category],
    event: u32,
) -> [u64; 8] {
    let replay = t.replay();
    let axis = replay.axis_len();
    let mut live = [0i128; 8];
    for (a, c) in replay.allocations.iter().zip(categories) {
        if a.start() <= event && event < a.end(Lifetime::Active, axis) {
            live[*c as usize] += i128::from(a.size);
        }
    }
    live.map(|v| u64::try_from(v.max(0)).unwrap_or(u64::MAX))
}

#[test]
fn categories_summed_in_place_equal_the_exact_sums_also_past_u64() {
    let generated = memsnap_workload::generate(&memsnap_workload::TrainingRun::default()).0;
    // Two live allocations of one category whose sum leaves u64.
    let past_u64 = snapshot_of(&[
        (Action::Alloc, 0x10, u64::MAX - 1),
        (Action::Alloc, 0x20, u64::MAX / 2),
        (Action::FreeCompleted, 0x10, u64::MAX - 1),
        (Action::Alloc, 0x30, 4096),
    ]);
    for snapshot in [&generated, &past_u64] {
        let t = DeviceTimeline::build(snapshot, 0).unwrap();
        let analysis = t.steps(&StepOptions::default());
        let axis = t.replay().axis_len();
        let every = (axis / 300).max(1);
        let ascending: Vec<u32> = (0..axis).step_by(every as usize).collect();
        let found = analysis.categories_at(t.replay(), &ascending);
        for (&event, got) in ascending.iter().zip(&found) {
            assert_eq!(
                got.0,
                exact_categories_at(&t, &analysis.categories, event),
                "event {event}"
            );
        }
        // Out of order, as asked.
        let descending: Vec<u32> = ascending.iter().rev().copied().collect();
        let found_back = analysis.categories_at(t.replay(), &descending);
        assert!(found_back.iter().eq(found.iter().rev()));
    }
}

/// `memsnap summary` drops each device's entries once its timeline is built, and the
/// annotations after the last device: a run of several devices whose steps come from the
/// annotations (no stacks) gets the same summary as when the snapshot is kept whole.
#[test]
fn a_summary_that_drops_the_entries_after_the_build_is_the_same_summary() {
    let (snapshot, _) = memsnap_workload::generate(&memsnap_workload::TrainingRun {
        devices: 3,
        steps: 5,
        frameless: true,
        annotations_per_step: 2,
        ..Default::default()
    });
    let summary = summarize(&snapshot, &SummaryOptions::default()).unwrap();
    assert_eq!(summary.devices.len(), 3);
    assert!(
        summary.devices.iter().all(|d| d.steps.len() == 5),
        "{summary:?}"
    );
    let owned = summarize_owned(snapshot, &SummaryOptions::default()).unwrap();
    assert_eq!(owned, summary);
}
