//! Synthetic training runs (`memsnap_workload`) with known steps, leaks and truncation.

use memsnap_analysis::{CurveKind, DeviceTimeline, PhaseKind, StepMethod, StepOptions, StepSource};
use memsnap_workload::{generate, GroundTruth, PhaseName, Role, TrainingRun};

fn runs() -> Vec<(&'static str, TrainingRun)> {
    let base = TrainingRun::default();
    vec![
        ("default", base.clone()),
        (
            "deep_leaky",
            TrainingRun {
                steps: 8,
                layers: 12,
                activations_per_layer: 3,
                leak_bytes_per_step: 3 << 20,
                seed: 7,
                ..base.clone()
            },
        ),
        (
            "no_optimizer_two_devices",
            TrainingRun {
                devices: 2,
                steps: 6,
                optimizer: false,
                activation_bytes: 1 << 20,
                seed: 11,
                ..base.clone()
            },
        ),
        (
            "ring_truncated",
            TrainingRun {
                steps: 10,
                layers: 6,
                max_entries: Some(700),
                leak_bytes_per_step: 1 << 20,
                seed: 3,
                ..base.clone()
            },
        ),
        (
            "no_time_truncated",
            TrainingRun {
                steps: 9,
                layers: 5,
                with_time: false,
                with_annotations: false,
                max_entries: Some(600),
                seed: 5,
                ..base.clone()
            },
        ),
        (
            "no_annotations_big",
            TrainingRun {
                target_entries: Some(20_000),
                layers: 16,
                activations_per_layer: 6,
                with_annotations: false,
                leak_bytes_per_step: 256 << 10,
                seed: 99,
                ..base.clone()
            },
        ),
        (
            "small_params_large_activations",
            TrainingRun {
                steps: 5,
                layers: 3,
                param_bytes_per_layer: 64 << 10,
                activation_bytes: 64 << 20,
                seed: 1234,
                ..base
            },
        ),
    ]
}

fn check_accounting(name: &str, timeline: &DeviceTimeline, truth: &GroundTruth, device: usize) {
    let t = &truth.devices[device];
    let replay = timeline.replay();
    assert_eq!(
        replay.before_window_bytes, t.before_window_bytes,
        "{name} device {device}: before-window bytes"
    );
    assert_eq!(
        replay.dropped_entries,
        Some(t.dropped_entries),
        "{name} device {device}: dropped entries"
    );
    // Curve values match the truth's byte counts at the step events.
    let active = &timeline.curves().active;
    for s in &t.steps {
        assert_eq!(
            active.at(s.start_event as u32),
            s.start_bytes,
            "{name}: start bytes"
        );
        assert_eq!(
            active.at(s.peak_event as u32),
            s.peak_bytes,
            "{name}: peak bytes"
        );
        assert_eq!(
            active.at(s.end_event as u32),
            s.end_bytes,
            "{name}: end bytes"
        );
    }
}

#[test]
fn replay_accounts_for_memory_from_before_the_window() {
    for (name, run) in runs() {
        let (snapshot, truth) = generate(&run);
        for device in 0..run.devices {
            let timeline = DeviceTimeline::build(&snapshot, device as i64).unwrap();
            check_accounting(name, &timeline, &truth, device);
        }
    }
}

#[test]
fn annotated_runs_give_the_exact_steps() {
    for (name, run) in runs() {
        if !(run.with_time && run.with_annotations) {
            continue;
        }
        let (snapshot, truth) = generate(&run);
        for device in 0..run.devices {
            let timeline = DeviceTimeline::build(&snapshot, device as i64).unwrap();
            let analysis = timeline.steps(&StepOptions {
                source: StepSource::Annotations,
                ..Default::default()
            });
            assert!(
                matches!(analysis.method, StepMethod::Annotations { .. }),
                "{name}: {:?}",
                analysis.method
            );
            let got: Vec<_> = analysis
                .steps
                .iter()
                .map(|s| {
                    (
                        s.start_event as usize,
                        s.peak_event as usize,
                        s.end_event as usize,
                        s.start_bytes,
                        s.peak_bytes,
                        s.end_bytes,
                    )
                })
                .collect();
            let want: Vec<_> = truth.devices[device]
                .steps
                .iter()
                .map(|s| {
                    (
                        s.start_event,
                        s.peak_event,
                        s.end_event,
                        s.start_bytes,
                        s.peak_bytes,
                        s.end_bytes,
                    )
                })
                .collect();
            assert_eq!(got, want, "{name} device {device}");
        }
    }
}

#[test]
fn curve_shape_finds_the_steps_without_annotations() {
    for (name, run) in runs() {
        let (snapshot, truth) = generate(&run);
        for device in 0..run.devices {
            let timeline = DeviceTimeline::build(&snapshot, device as i64).unwrap();
            let analysis = timeline.steps(&StepOptions {
                source: StepSource::CurveShape,
                ..Default::default()
            });
            let want = &truth.devices[device].steps;
            let got = &analysis.steps;
            eprintln!(
                "{name} device {device}: {} found, {} true",
                got.len(),
                want.len()
            );
            // In an untruncated trace every true step is found, the first one by its call site
            // (the curve rises from the parameters straight into the first forward pass). In a
            // truncated one the first complete step is missed when the window starts so close
            // to it that no fall is visible before it. Boundaries may be one event off: a
            // deferred `free_completed` that the simulator records as the next step's first
            // event already lowers the curve.
            if truth.devices[device].dropped_entries == 0 {
                assert_eq!(
                    got.len(),
                    want.len(),
                    "{name}: found {} of {}",
                    got.len(),
                    want.len()
                );
            } else {
                assert!(
                    got.len() + 1 >= want.len(),
                    "{name}: found {} of {}",
                    got.len(),
                    want.len()
                );
            }
            for s in got {
                let t = want
                    .iter()
                    .find(|t| t.peak_event == s.peak_event as usize)
                    .unwrap_or_else(|| panic!("{name}: step {s:?} matches no true step"));
                assert!(
                    (s.start_event as i64 - t.start_event as i64).abs() <= 1,
                    "{name}: start {s:?} vs {t:?}"
                );
                assert!(
                    (s.end_event as i64 - t.end_event as i64).abs() <= 1,
                    "{name}: end {s:?} vs {t:?}"
                );
                assert_eq!(s.peak_bytes, t.peak_bytes, "{name}");
            }
        }
    }
}

/// Regression: four steps with a warm-up first (its peak lacks the optimizer state the later
/// steps keep) said "the peak grows" by half the state per step; a warm-up is not a trend.
#[test]
fn a_warm_up_step_is_not_peak_growth() {
    let run = TrainingRun {
        steps: 4,
        ..TrainingRun::default()
    };
    let (snapshot, _) = generate(&run);
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let analysis = timeline.steps(&StepOptions::default());
    assert_eq!(analysis.steps.len(), 4);
    assert!(analysis.steps[0].warmup);
    assert!(
        analysis.steps[0].peak_bytes < analysis.steps[1].peak_bytes,
        "the warm-up's peak is lower: the case this test is about"
    );
    assert!(
        !analysis.drift.peak_growth_suspected,
        "peak slope {} B/step",
        analysis.drift.peak_bytes_per_step
    );
    assert!(!analysis.drift.leak_suspected);
}

#[test]
fn drift_estimates_the_leak_per_step() {
    for (name, run) in runs() {
        let (snapshot, truth) = generate(&run);
        let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
        let analysis = timeline.steps(&StepOptions::default());
        if analysis.steps.len() < 3 {
            continue;
        }
        let leak = truth.devices[0].leak_bytes_per_step as f64;
        let drift = analysis.drift.min_bytes_per_step;
        eprintln!(
            "{name}: drift {drift} leak {leak} flagged {}",
            analysis.drift.leak_suspected
        );
        assert!(
            (drift - leak).abs() <= leak * 0.05 + 4096.0,
            "{name}: drift {drift} vs leak {leak}"
        );
        if leak == 0.0 {
            assert!(
                !analysis.drift.leak_suspected,
                "{name}: no leak, but flagged"
            );
        }
    }
}

#[test]
fn peak_is_the_highest_step_peak() {
    for (name, run) in runs() {
        let (snapshot, truth) = generate(&run);
        let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
        let peak = timeline.peak(CurveKind::Active);
        for s in &truth.devices[0].steps {
            assert!(peak.bytes >= s.peak_bytes, "{name}");
        }
    }
}

/// Each curve's peak is found once and kept (a window asks for them every frame, and each
/// was an O(n) scan: 3 of them at 10M entries were most of a frame's `update`): the kept one is
/// that curve's own highest point, asked in any order, as often as asked.
#[test]
fn a_peak_found_once_is_its_own_curves_highest_point() {
    for (name, run) in runs() {
        let (snapshot, _) = generate(&run);
        let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
        let fresh = DeviceTimeline::build(&snapshot, 0).unwrap();
        for kind in [CurveKind::Reserved, CurveKind::Allocated, CurveKind::Active] {
            let (bytes, event) = timeline.curves().get(kind).max();
            for _ in 0..2 {
                let peak = timeline.peak(kind);
                assert_eq!(
                    (peak.bytes, peak.event),
                    (bytes, event.unwrap_or(0)),
                    "{name} {kind:?}"
                );
            }
        }
        // The same answers as a timeline asked in the other order.
        for kind in CurveKind::ALL {
            assert_eq!(fresh.peak(kind), timeline.peak(kind), "{name} {kind:?}");
        }
    }
}

fn phase_kind(name: PhaseName) -> PhaseKind {
    match name {
        PhaseName::Forward => PhaseKind::Forward,
        PhaseName::Backward => PhaseKind::Backward,
        PhaseName::Optimizer => PhaseKind::Optimizer,
    }
}

/// The stacks find every step, the first one after the model's set-up included, and each
/// phase begins at the phase's first allocation.
#[test]
fn stacks_give_every_step_and_its_phases() {
    for (name, run) in runs() {
        let (snapshot, truth) = generate(&run);
        for device in 0..run.devices {
            let timeline = DeviceTimeline::build(&snapshot, device as i64).unwrap();
            let analysis = timeline.steps(&StepOptions::default());
            assert_eq!(analysis.method, StepMethod::Stacks, "{name}");
            let t = &truth.devices[device];
            // Whole steps: those that begin with their forward phase, less a first step that
            // may have lost its start to the ring buffer.
            let whole: Vec<_> = analysis
                .steps
                .iter()
                .filter(|s| !s.partial)
                .filter(|s| !(t.dropped_entries > 0 && s.start_event == 0))
                .collect();
            let got: Vec<Vec<(PhaseKind, u32)>> = whole
                .iter()
                .map(|s| s.phases.iter().map(|p| (p.kind, p.start_event)).collect())
                .collect();
            let want: Vec<Vec<(PhaseKind, u32)>> = t
                .steps
                .iter()
                .map(|s| {
                    s.phases
                        .iter()
                        .map(|&(p, e)| (phase_kind(p), e as u32))
                        .collect()
                })
                .collect();
            assert_eq!(got, want, "{name} device {device}");
            // Phases tile each step, steps tile the window after the set-up.
            let mut next = analysis.setup.as_ref().map_or(0, |p| p.end_event + 1);
            for s in &analysis.steps {
                assert_eq!(s.start_event, next, "{name}: steps tile the window");
                // A step starts from what was live before its first event: its first phase's
                // start, and the end of the step (or set-up) before it.
                assert_eq!(
                    s.phases.first().map(|p| p.start_bytes),
                    Some(s.before_bytes),
                    "{name}"
                );
                for p in &s.phases {
                    assert_eq!(p.start_event, next, "{name}: phases tile the step");
                    assert!(p.end_event >= p.start_event);
                    next = p.end_event + 1;
                }
                assert_eq!(s.end_event + 1, next, "{name}");
                // Phases chain: each starts where the one before ended.
                for w in s.phases.windows(2) {
                    assert_eq!(w[0].end_bytes, w[1].start_bytes, "{name}");
                }
            }
            assert_eq!(next, timeline.replay().trace_len, "{name}: to the end");
            for w in analysis.steps.windows(2) {
                assert_eq!(w[0].end_bytes, w[1].before_bytes, "{name}: steps chain");
                assert_eq!(
                    w[1].kept_bytes(),
                    w[1].end_bytes as i64 - w[0].end_bytes as i64,
                    "{name}"
                );
            }
            // The set-up (the parameters) is seen exactly when the window holds it, and ends
            // right before the first step's first allocation.
            assert_eq!(analysis.setup.is_some(), t.has_setup, "{name}");
            if let (Some(setup), Some(first)) = (&analysis.setup, t.steps.first()) {
                assert_eq!(setup.start_event, 0);
                assert_eq!(
                    setup.end_event + 1,
                    first.phases[0].1 as u32,
                    "{name}: set-up ends before the first forward allocation"
                );
                assert_eq!(setup.end_bytes, setup.peak_bytes, "{name}: only parameters");
            }
            // Every step that runs the optimizer the first time is a warm-up.
            if run.optimizer && t.has_setup {
                assert!(
                    analysis.steps[0].warmup,
                    "{name}: step 0 creates Adam's state"
                );
                assert!(analysis.steps[1..].iter().all(|s| !s.warmup), "{name}");
            }
        }
    }
}

/// Every allocation's category is the role the simulation gave it.
#[test]
fn categories_are_the_roles_of_the_allocations() {
    for (name, run) in runs() {
        let (snapshot, truth) = generate(&run);
        for device in 0..run.devices {
            let timeline = DeviceTimeline::build(&snapshot, device as i64).unwrap();
            let analysis = timeline.steps(&StepOptions::default());
            let replay = timeline.replay();
            let by_event: std::collections::HashMap<u32, usize> = replay
                .allocations
                .iter()
                .enumerate()
                .filter_map(|(i, a)| Some((a.alloc_event()?, i)))
                .collect();
            let t = &truth.devices[device];
            // In a truncated window the first (partial) step can hold forward allocations
            // whose step began before the window: their role needs its backward phase, which
            // the analysis sees, so they are checked too.
            let mut wrong = Vec::new();
            for &(event, role) in &t.roles {
                let i = by_event[&(event as u32)];
                let got = analysis.categories[i].name();
                if got != role.name() {
                    wrong.push((event, role.name(), got));
                }
            }
            assert!(
                wrong.is_empty(),
                "{name} device {device}: {} of {} wrong, first {:?}",
                wrong.len(),
                t.roles.len(),
                &wrong[..wrong.len().min(5)]
            );
            // Memory from before the window that stays is a parameter or optimizer state, or
            // the leak's, whose role is its role in the window.
            let mut sites = memsnap_analysis::sites::SiteKeyer::new(
                &snapshot,
                memsnap_analysis::GroupBy::Frame,
            );
            for (a, c) in replay.allocations.iter().zip(&analysis.categories) {
                if a.alloc_event().is_none()
                    && a.free_requested().is_none()
                    && a.free_completed().is_none()
                {
                    let site = sites.key_of(a).label(&snapshot);
                    let leak = run.leak_bytes_per_step > 0 && site.starts_with("metrics.py:");
                    assert!(
                        matches!(c.name(), "parameter" | "optimizer_state" | "gradient")
                            || (leak && c.name() == Role::Unknown.name()),
                        "{name}: {c:?} {site}"
                    );
                }
            }
            // At the peak the categories add up to the peak.
            let peak = timeline.peak(CurveKind::Active);
            let at = analysis.categories_at(replay, &[peak.event]);
            assert_eq!(at[0].total(), peak.bytes, "{name}");
        }
    }
}

/// Without stacks (`context=None`) annotations give the steps, their optimizer phase from the
/// `Optimizer.step#` ranges; without annotations either, the curve's shape does, forward up to
/// each step's peak and backward after it.
#[test]
fn without_stacks_annotations_then_the_curve_give_the_phases() {
    for (name, run) in runs() {
        let (mut snapshot, truth) = generate(&run);
        for trace in snapshot.device_traces.iter_mut().flatten() {
            for entry in trace {
                entry.frames = None;
            }
        }
        let annotated = run.with_time && run.with_annotations;
        for device in 0..run.devices {
            let timeline = DeviceTimeline::build(&snapshot, device as i64).unwrap();
            let analysis = timeline.steps(&StepOptions::default());
            let t = &truth.devices[device];
            if annotated {
                assert!(
                    matches!(analysis.method, StepMethod::Annotations { .. }),
                    "{name}: {:?}",
                    analysis.method
                );
                assert_eq!(analysis.steps.len(), t.steps.len(), "{name}");
                for (s, want) in analysis.steps.iter().zip(&t.steps) {
                    let kinds: Vec<_> = s.phases.iter().map(|p| p.kind).collect();
                    let want_kinds: Vec<_> = want.phases.iter().map(|p| phase_kind(p.0)).collect();
                    assert_eq!(kinds, want_kinds, "{name}");
                    if run.optimizer {
                        let opt = s.phases.last().unwrap();
                        let (_, first_alloc) = want.phases[2];
                        // The range starts just before its first allocation.
                        assert!(opt.start_event as usize <= first_alloc, "{name}");
                    }
                }
            } else {
                assert_eq!(analysis.method, StepMethod::CurveShape, "{name}");
                for s in &analysis.steps {
                    assert_eq!(s.phases[0].kind, PhaseKind::Forward, "{name}");
                    assert_eq!(s.phases[0].end_event, s.peak_event, "{name}");
                    if let Some(b) = s.phases.get(1) {
                        assert_eq!(b.kind, PhaseKind::Backward, "{name}");
                    }
                }
            }
        }
    }
}
