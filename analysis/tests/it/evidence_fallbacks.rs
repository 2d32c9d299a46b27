//! When the best evidence lies or is missing: stacks that contradict the curve are not
//! trusted (annotations, then the curve's shape, give the steps, and the analysis says why),
//! and a run recorded without stacks still finds every step, the first after the set-up too.

use memsnap_analysis::{DeviceTimeline, PhaseKind, StepMethod, StepOptions};
use memsnap_format::Action;
use memsnap_workload::{generate, Role, TrainingRun};

/// A run without annotations whose allocations' stacks are mixed up: `percent` of the
/// forward allocations carry a gradient's (backward) stack and as many of the backward
/// allocations an activation's (forward) stack, chosen by a fixed pseudo-random sequence.
fn noisy_run(steps: usize, percent: u64, annotations: bool) -> (memsnap_format::Snapshot, usize) {
    let run = TrainingRun {
        steps,
        layers: 8,
        activations_per_layer: 6,
        with_annotations: annotations,
        seed: 21,
        ..TrainingRun::default()
    };
    let (mut snapshot, truth) = generate(&run);
    let roles = &truth.devices[0].roles;
    let stack_of = |role: Role, snapshot: &memsnap_format::Snapshot| {
        let (event, _) = roles.iter().find(|(_, r)| *r == role).copied().unwrap();
        snapshot.traces()[0][event].frames
    };
    let backward = stack_of(Role::Gradient, &snapshot);
    let forward = stack_of(Role::Activation, &snapshot);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let trace = &mut snapshot.device_traces.as_mut().unwrap()[0];
    for &(event, role) in roles {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        if state % 100 >= percent {
            continue;
        }
        assert_eq!(trace[event].action, Action::Alloc);
        trace[event].frames = match role {
            Role::Activation => backward,
            Role::Gradient => forward,
            _ => continue,
        };
    }
    (snapshot, truth.devices[0].steps.len())
}

/// Regression: noisy stacks (forward allocations with backward frames mixed in) cut a
/// 12,000-iteration run into 236,208 "steps"; the labels contradict the curve, so the
/// curve's shape gives the steps and the analysis names the reason.
#[test]
fn incoherent_stack_labels_fall_back_to_the_curve_and_say_why() {
    let (snapshot, true_steps) = noisy_run(12, 40, false);
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let analysis = timeline.steps(&StepOptions::default());
    assert_eq!(analysis.method, StepMethod::CurveShape);
    let reason = analysis.fallback_reason.as_deref().unwrap_or("");
    assert!(reason.starts_with("stack labels incoherent"), "{reason}");
    assert_eq!(analysis.steps.len(), true_steps, "{reason}");
}

/// With annotations, incoherent stacks give way to the `ProfilerStep#` ranges first.
#[test]
fn incoherent_stack_labels_fall_back_to_annotations_first() {
    let (snapshot, true_steps) = noisy_run(6, 40, true);
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let analysis = timeline.steps(&StepOptions::default());
    assert!(
        matches!(analysis.method, StepMethod::Annotations { .. }),
        "{:?}",
        analysis.method
    );
    assert!(analysis.fallback_reason.is_some());
    assert_eq!(analysis.steps.len(), true_steps);
}

/// A few mixed-up stacks (a hook, a stray recompute) are strays, not a reason to distrust
/// the stacks: they still give every step.
#[test]
fn a_little_stack_noise_keeps_the_stacks() {
    let (snapshot, true_steps) = noisy_run(6, 3, false);
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let analysis = timeline.steps(&StepOptions::default());
    assert_found_by_stacks(&analysis);
    assert_eq!(analysis.fallback_reason, None);
    assert_eq!(analysis.steps.len(), true_steps);
}

/// Regression: a run recorded without stacks (`context=None`) and without annotations found
/// 7 of its 8 steps: the first step after the set-up was found by its opening call site,
/// which needs a stack. Its opening sizes find it now, and what comes before it is the
/// set-up.
#[test]
fn a_frameless_run_finds_its_first_step_after_the_set_up() {
    for (steps, layers, seed) in [(8, 4, 0), (5, 6, 3), (3, 12, 17)] {
        let run = TrainingRun {
            steps,
            layers,
            with_annotations: false,
            seed,
            ..TrainingRun::default()
        };
        let (mut snapshot, truth) = generate(&run);
        for entry in snapshot.device_traces.iter_mut().flatten().flatten() {
            entry.frames = None;
        }
        let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
        let analysis = timeline.steps(&StepOptions::default());
        let want = &truth.devices[0].steps;
        assert_eq!(analysis.method, StepMethod::CurveShape);
        assert_eq!(
            analysis.steps.len(),
            want.len(),
            "{steps} steps, {layers} layers"
        );
        for (got, want) in analysis.steps.iter().zip(want) {
            // A deferred `free_completed` recorded as a step's first event may move a
            // boundary by one event.
            assert!(
                got.start_event.abs_diff(want.start_event as u32) <= 1,
                "{got:?} {want:?}"
            );
            assert!(
                got.end_event.abs_diff(want.end_event as u32) <= 1,
                "{got:?} {want:?}"
            );
            assert_eq!(got.peak_bytes, want.peak_bytes);
            // Forward up to the peak, backward after it: the forward phase holds the step's
            // first allocation, the backward phase the true backward's last.
            assert_eq!(got.phases[0].kind, PhaseKind::Forward);
            assert!(got.phases[0].start_event <= want.phases[0].1 as u32);
            assert_eq!(got.phases[0].end_event, got.peak_event);
        }
        let setup = analysis
            .setup
            .as_ref()
            .expect("the parameters are the set-up");
        assert_eq!(setup.start_event, 0);
        assert_eq!(setup.end_event + 1, analysis.steps[0].start_event);
    }
}

/// However few or many stacks are mixed up, the steps are the run's: a few at a phase's edge
/// (3% gave 14 steps for 12 while the stacks were believed) as much as most of them.
#[test]
fn every_level_of_stack_noise_gives_the_true_steps() {
    for percent in [3, 5, 10, 15, 20, 30, 40] {
        let (snapshot, true_steps) = noisy_run(12, percent, false);
        let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
        let analysis = timeline.steps(&StepOptions::default());
        assert_eq!(
            analysis.steps.len(),
            true_steps,
            "{percent}%: {:?}",
            analysis.fallback_reason
        );
    }
}

/// The workload's own adversarial shapes (`stack_noise_percent`, `frameless`), with and
/// without annotations, two devices, a ring buffer that starts mid-step: the steps are the
/// run's, and the analysis says when it set the stacks aside.
#[test]
fn the_workloads_noisy_and_frameless_shapes_give_the_true_steps() {
    for (name, noise, frameless, annotations, max_entries) in [
        ("noisy", 40, false, false, None),
        ("noisy_annotated", 40, false, true, None),
        ("slightly_noisy", 5, false, false, None),
        ("frameless", 0, true, false, None),
        ("frameless_ring", 0, true, false, Some(3_000)),
        ("noisy_ring", 30, false, false, Some(3_000)),
    ] {
        let run = TrainingRun {
            devices: 2,
            steps: 14,
            layers: 6,
            stack_noise_percent: noise,
            frameless,
            with_annotations: annotations,
            max_entries,
            seed: 5,
            ..TrainingRun::default()
        };
        let (snapshot, truth) = generate(&run);
        for device in 0..2 {
            let timeline = DeviceTimeline::build(&snapshot, device).unwrap();
            let analysis = timeline.steps(&StepOptions::default());
            let want = &truth.devices[device as usize];
            // Whole steps found: a ring buffer that starts mid-step leaves a partial one first
            // (and may hide the first whole one from the curve's shape).
            let whole = analysis.steps.iter().filter(|s| !s.partial).count();
            let slack = usize::from(want.dropped_entries > 0);
            assert!(
                whole <= want.steps.len() + slack && whole + slack >= want.steps.len(),
                "{name} device {device}: {whole} whole steps of {} ({:?}, {:?})",
                want.steps.len(),
                analysis.method,
                analysis.fallback_reason
            );
            if noise >= 30 {
                assert!(analysis.fallback_reason.is_some(), "{name}");
                assert_ne!(analysis.method, StepMethod::Stacks, "{name}");
            }
            if frameless {
                assert_eq!(analysis.method, StepMethod::CurveShape, "{name}");
            }
        }
    }
}

/// Which check sets the stacks aside: labels that flip back and forth while memory rises
/// when many are mixed up; the steps made of strays when a few are.
#[test]
fn the_reason_names_what_contradicts_the_curve() {
    let reason = |percent| {
        let (snapshot, _) = noisy_run(12, percent, false);
        let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
        timeline
            .steps(&StepOptions::default())
            .fallback_reason
            .unwrap_or_default()
    };
    let many = reason(40);
    assert!(
        many.contains("while memory rises") && many.contains("another phase"),
        "{many}"
    );
    let few = reason(3);
    assert!(
        few.contains("they give 14 steps where memory rises and falls 12 times"),
        "{few}"
    );
}

/// 52 steps of 30 MiB of activations (and a gradient each in backward), each keeping 1 MiB
/// through a one-allocation `optimizer_step`: the leak outgrows a step's rise.
fn leaking_run() -> memsnap_format::Snapshot {
    use memsnap_format::{Frame, Snapshot, TraceEntry};
    let mut snapshot = Snapshot::new(1);
    let mut stack = |name: &str, line| {
        snapshot.intern_stack([
            Frame::new(name, "model.py", line),
            Frame::new("train", "train.py", 3),
        ])
    };
    let (forward, backward, optimizer) = (
        stack("forward", 10),
        stack("backward", 20),
        stack("optimizer_step", 30),
    );
    let entry = |action, addr, size, frames| {
        let mut e = TraceEntry::new(action, addr, size, 0);
        e.frames = Some(frames);
        e
    };
    let mut trace = Vec::new();
    let mut next_addr = 0x7f00_0000_0000u64;
    let mut fresh = || {
        next_addr += 8 << 20;
        next_addr
    };
    for _ in 0..LEAKING_STEPS {
        let acts: Vec<(u64, u64)> = (0..12u64).map(|i| (fresh(), (1 + i % 4) << 20)).collect();
        for &(addr, size) in &acts {
            trace.push(entry(Action::Alloc, addr, size, forward));
        }
        for &(addr, size) in acts.iter().rev() {
            let grad = fresh();
            trace.push(entry(Action::Alloc, grad, 512 << 10, backward));
            trace.push(entry(Action::FreeRequested, addr, size, backward));
            trace.push(entry(Action::FreeCompleted, addr, size, backward));
            trace.push(entry(Action::FreeRequested, grad, 512 << 10, backward));
            trace.push(entry(Action::FreeCompleted, grad, 512 << 10, backward));
        }
        // 1 MiB kept each step: over 52 steps more than a step's 30 MiB rise.
        trace.push(entry(Action::Alloc, fresh(), 1 << 20, optimizer));
    }
    snapshot.device_traces = Some(vec![trace]);
    snapshot
}

const LEAKING_STEPS: usize = 52;

/// Regression: a leaking run's stacks were judged by the shape's rises and its
/// one-allocation optimizer runs counted as strays: "stack labels incoherent: they give 52
/// steps where memory rises and falls 11 times" (a live recording's picture showed it). A
/// short run between two different labels is the run's structure, not a stray.
#[test]
fn a_leaking_run_with_a_one_allocation_optimizer_step_keeps_its_stacks() {
    let timeline = DeviceTimeline::build(&leaking_run(), 0).unwrap();
    let analysis = timeline.steps(&StepOptions::default());
    assert_found_by_stacks(&analysis);
    assert_eq!(analysis.steps.len(), LEAKING_STEPS);
}

/// Regression: the curve's shape took its thresholds from the whole run's lowest and highest
/// values, so a leak that outgrows a step's rise hid the early steps (never high enough) and
/// the late ones (never low enough): 10 rises for 52 steps. Heights are now taken above the
/// floor the rest of the run returns to. (The shape reports a step once it sees the fall
/// before it: every step but the first, which the call site or opening sizes find.)
#[test]
fn a_leak_that_outgrows_a_step_hides_no_rise_from_the_shape() {
    let timeline = DeviceTimeline::build(&leaking_run(), 0).unwrap();
    let active: Vec<u64> = timeline.curves().active.values().collect();
    let rises = memsnap_analysis::steps::shape_bounds(&active);
    assert_eq!(rises.len(), LEAKING_STEPS - 1);
}

/// Regression: recorded without stacks, the leaking run (no set-up before its first step)
/// reported that first step as the set-up. The shape starts each later step with the block
/// the step before kept after its dip, so their opening sizes never matched the first
/// step's; the opening is also tried without its first sizes now.
#[test]
fn a_frameless_leaking_run_that_starts_with_a_step_finds_that_step() {
    let mut snapshot = leaking_run();
    for entry in snapshot.device_traces.as_mut().unwrap()[0].iter_mut() {
        entry.frames = None;
    }
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let analysis = timeline.steps(&StepOptions::default());
    assert_eq!(analysis.method, StepMethod::CurveShape);
    assert_eq!(analysis.steps.len(), LEAKING_STEPS);
    assert!(analysis.setup.is_none(), "{:?}", analysis.setup);
    assert_eq!(analysis.steps[0].start_event, 0);
}

/// The steps came from the stacks (the reason they did not, if not).
fn assert_found_by_stacks(analysis: &memsnap_analysis::StepAnalysis) {
    assert_eq!(
        analysis.method,
        StepMethod::Stacks,
        "{:?}",
        analysis.fallback_reason
    );
}

/// A run that ran out of memory ends inside its last `ProfilerStep#N` range, which has a
/// START and no END. That range was dropped, so the failed step's events went to the step
/// before it: its forward counted as the optimizer phase of the step before, and the advice
/// could not complete the failed step (it looked longer than a whole step).
#[test]
fn the_step_a_run_ran_out_of_memory_in_is_its_own_step_by_annotations() {
    let run = TrainingRun {
        steps: 5,
        oom_at_step: Some(3),
        device_memory: 4 << 30,
        ..TrainingRun::default()
    };
    let (snapshot, truth) = generate(&run);
    let truth = &truth.devices[0];
    let oom = truth.oom.expect("out of memory");
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let analysis = timeline.steps(&StepOptions {
        source: memsnap_analysis::StepSource::Annotations,
        ..Default::default()
    });
    assert!(matches!(analysis.method, StepMethod::Annotations { .. }));
    assert_eq!(analysis.steps.len(), oom.step + 1);
    let failed = analysis.steps.last().unwrap();
    assert_eq!(failed.end_event as usize, oom.event);
    // It stopped in its forward pass: no backward, no optimizer.
    let kinds: Vec<PhaseKind> = failed.phases.iter().map(|p| p.kind).collect();
    assert_eq!(kinds, [PhaseKind::Forward]);
    // The steps before it are the run's, exactly.
    for (got, want) in analysis.steps.iter().zip(&truth.steps).take(oom.step) {
        assert_eq!(
            (got.start_event as usize, got.end_event as usize),
            (want.start_event, want.end_event)
        );
    }
}
