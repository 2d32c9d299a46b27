//! The adversarial shapes (issue 22): noisy stacks, no stacks, deep stacks, many annotations,
//! segment churn. Each knob changes what it says and leaves the run itself (sizes, times,
//! ground truth) as it was.

use std::collections::HashSet;

use memsnap_format::{validate, Action, Snapshot};
use memsnap_workload::{generate, Role, TrainingRun};

use crate::generator::check_truth;

fn small() -> TrainingRun {
    TrainingRun {
        steps: 5,
        layers: 6,
        leak_bytes_per_step: 1000,
        ..TrainingRun::default()
    }
}

/// Per device, what each entry did (action, address, size, time), without its stack.
type Events = Vec<Vec<(Action, u64, u64, Option<i64>)>>;

fn events(snapshot: &Snapshot) -> Events {
    snapshot
        .traces()
        .iter()
        .map(|t| {
            t.iter()
                .map(|e| (e.action, e.addr, e.size, e.time_us()))
                .collect()
        })
        .collect()
}

fn frame_names(snapshot: &Snapshot, e: &memsnap_format::TraceEntry) -> Vec<String> {
    e.frames
        .map(|s| snapshot.stack_frames(s).map(|f| f.name.clone()).collect())
        .unwrap_or_default()
}

#[test]
fn stack_noise_changes_stacks_but_not_the_run_or_its_ground_truth() {
    let (clean, clean_truth) = generate(&small());
    let (noisy, noisy_truth) = generate(&TrainingRun {
        stack_noise_percent: 40,
        ..small()
    });
    assert!(validate(&noisy).is_empty());
    assert_eq!(
        events(&clean),
        events(&noisy),
        "sizes and times are drawn as before"
    );
    assert_eq!(clean_truth, noisy_truth);
    check_truth(&noisy, &noisy_truth);
    // Activations (forward) carrying the autograd engine's frames: none without noise, some
    // with it; and not all of them.
    let with_autograd = |snapshot: &Snapshot| {
        let trace = &snapshot.traces()[0];
        let activations = noisy_truth.devices[0]
            .roles
            .iter()
            .filter(|(_, role)| *role == Role::Activation);
        activations
            .clone()
            .filter(|&&(event, _)| {
                frame_names(snapshot, &trace[event])
                    .iter()
                    .any(|n| n.contains("Engine::thread_main"))
            })
            .count()
            * 100
            / activations.count()
    };
    assert_eq!(with_autograd(&clean), 0);
    let percent = with_autograd(&noisy);
    assert!((5..60).contains(&percent), "{percent}% of activations");
}

#[test]
fn frameless_records_no_frames_and_the_same_run() {
    let (with_stacks, truth) = generate(&small());
    let (frameless, frameless_truth) = generate(&TrainingRun {
        frameless: true,
        ..small()
    });
    assert!(validate(&frameless).is_empty());
    assert_eq!(events(&with_stacks), events(&frameless));
    assert_eq!(truth, frameless_truth);
    assert_eq!(frameless.frames.len(), 0);
    let trace = &frameless.traces()[0];
    assert!(trace.iter().all(|e| frame_names(&frameless, e).is_empty()));
    assert!(frameless
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .all(|b| b.frames.is_none_or(|s| frameless.stacks.get(s).is_empty())));
}

#[test]
fn stack_depth_pads_every_stack_and_rotation_uses_the_whole_pool() {
    let depth = 150;
    let run = TrainingRun {
        stack_depth: depth,
        rotate_stacks: true,
        stack_pool: 400,
        ..small()
    };
    let (snapshot, truth) = generate(&run);
    assert!(validate(&snapshot).is_empty());
    check_truth(&snapshot, &truth);
    let trace = &snapshot.traces()[0];
    let mut distinct = HashSet::new();
    for e in trace.iter().filter(|e| e.frames.is_some()) {
        let names = frame_names(&snapshot, e);
        if names.is_empty() {
            continue;
        }
        assert!(
            (depth * 2 / 3..=depth * 4 / 3).contains(&names.len()),
            "{} frames",
            names.len()
        );
        // Innermost the allocator, outermost the process's or thread's entry.
        assert_eq!(names[0], "torch::unwind::unwind()");
        let last = names.last().map(String::as_str);
        assert!(matches!(last, Some("_start" | "__clone3")), "{last:?}");
        distinct.insert(e.frames);
    }
    // Rotated, nearly the whole pool shows; without rotation a site reuses the stacks its
    // layer and slot pick (about 120 in this run).
    assert!(distinct.len() > 300, "{} distinct stacks", distinct.len());
    let (fixed, _) = generate(&TrainingRun {
        rotate_stacks: false,
        ..run
    });
    let fixed_distinct: HashSet<_> = fixed.traces()[0].iter().map(|e| e.frames).collect();
    assert!(
        fixed_distinct.len() < distinct.len() / 2,
        "{} of {}",
        fixed_distinct.len(),
        distinct.len()
    );
}

#[test]
fn annotations_per_step_adds_record_function_pairs_and_keeps_the_steps() {
    let (_, plain_truth) = generate(&small());
    let (annotated, truth) = generate(&TrainingRun {
        annotations_per_step: 13,
        devices: 2,
        ..small()
    });
    assert!(validate(&annotated).is_empty());
    check_truth(&annotated, &truth);
    let annotations = annotated.external_annotations.as_ref().unwrap();
    for device in 0..2 {
        let names: Vec<_> = annotations
            .iter()
            .filter(|a| a.device == device)
            .filter_map(|a| a.name())
            .collect();
        // ProfilerStep and Adam START/END per step, then the 13 extra pairs.
        assert_eq!(names.len(), 5 * (4 + 13 * 2), "device {device}");
        assert!(names.contains(&"nn.Module: Linear_0") && names.contains(&"aten::mm"));
    }
    // Annotations add no entry: the steps are the same entries with the same bytes.
    let steps = |t: &memsnap_workload::GroundTruth| {
        t.devices[0]
            .steps
            .iter()
            .map(|s| (s.start_event, s.end_event, s.peak_bytes))
            .collect::<Vec<_>>()
    };
    assert_eq!(steps(&plain_truth), steps(&truth));
}

#[test]
fn empty_cache_every_step_frees_and_maps_segments_again() {
    let count = |s: &Snapshot, action| s.traces()[0].iter().filter(|e| e.action == action).count();
    let (plain, _) = generate(&small());
    let (churn, truth) = generate(&TrainingRun {
        empty_cache_every_step: true,
        ..small()
    });
    assert!(validate(&churn).is_empty());
    check_truth(&churn, &truth);
    assert_eq!(count(&plain, Action::SegmentFree), 0);
    assert!(count(&churn, Action::SegmentFree) >= 5);
    assert!(count(&churn, Action::SegmentAlloc) > 2 * count(&plain, Action::SegmentAlloc));
    assert_eq!(truth.devices[0].steps.len(), 5);

    let (expandable, truth) = generate(&TrainingRun {
        empty_cache_every_step: true,
        expandable_segments: true,
        ..small()
    });
    assert!(validate(&expandable).is_empty());
    check_truth(&expandable, &truth);
    assert!(count(&expandable, Action::SegmentMap) >= 5);
    assert!(count(&expandable, Action::SegmentUnmap) >= 5);
    let settings = expandable.allocator_settings.as_ref().unwrap();
    assert_eq!(settings.expandable_segments, Some(true));
}

#[test]
fn every_shape_at_once_is_deterministic_and_a_mid_step_window_holds() {
    let run = TrainingRun {
        devices: 2,
        steps: 6,
        stack_noise_percent: 30,
        stack_depth: 60,
        rotate_stacks: true,
        stack_pool: 200,
        annotations_per_step: 5,
        empty_cache_every_step: true,
        expandable_segments: true,
        ..small()
    };
    let (a, truth_a) = generate(&run);
    let (b, truth_b) = generate(&run);
    assert_eq!(a.device_traces, b.device_traces);
    assert_eq!(a.segments, b.segments);
    assert_eq!(a.external_annotations, b.external_annotations);
    assert_eq!(truth_a, truth_b);
    // A ring that starts in the middle of the third step: the steps after it are whole,
    // the cut one is not reported.
    let full = &truth_a.devices[0].steps;
    let cut_at = (full[2].start_event + full[2].end_event) / 2;
    let keep = a.traces()[0].len() - cut_at;
    let (window, truth) = generate(&TrainingRun {
        max_entries: Some(keep),
        ..run
    });
    assert!(validate(&window).is_empty());
    check_truth(&window, &truth);
    assert_eq!(truth.devices[0].steps.len(), full.len() - 3);
    assert!(truth.devices[0].dropped_entries > 0);
}
