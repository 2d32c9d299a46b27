//! Leaking sites ([`memsnap_analysis::leaks`]), the categories of a leak's memory from before a
//! ring buffer's window, and warm-up steps in such a window.

use memsnap_analysis::{
    leaking_sites, Category, DeviceTimeline, LeakingSite, PhaseKind, StepAnalysis, StepOptions,
};
use memsnap_format::{Action, Snapshot, TraceEntry};
use memsnap_workload::{generate, Role, TrainingRun};

fn leaky(steps: usize, leak: u64, max_entries: Option<usize>) -> TrainingRun {
    TrainingRun {
        steps,
        layers: 3,
        activations_per_layer: 3,
        leak_bytes_per_step: leak,
        max_entries,
        seed: 7,
        ..TrainingRun::default()
    }
}

fn analyse(snapshot: &Snapshot) -> (DeviceTimeline, StepAnalysis, Vec<LeakingSite>) {
    let timeline = DeviceTimeline::build(snapshot, 0).expect("timeline");
    let steps = timeline.steps(&StepOptions::default());
    let leaks = leaking_sites(snapshot, timeline.replay(), &steps.steps);
    (timeline, steps, leaks)
}

fn is_the_workloads_leak(site: &str) -> bool {
    site.starts_with("metrics.py:") && site.ends_with(":record")
}

#[test]
fn a_tensor_kept_every_step_is_named_with_what_it_keeps_per_step() {
    let (snapshot, truth) = generate(&leaky(8, 3 << 20, None));
    let (_, steps, leaks) = analyse(&snapshot);
    assert_eq!(steps.steps.len(), 8);
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    let leak = &leaks[0];
    assert!(is_the_workloads_leak(&leak.site), "{}", leak.site);
    let kept = truth.devices[0]
        .roles
        .iter()
        .filter(|(_, r)| *r == Role::Unknown)
        .count() as u64;
    assert_eq!((leak.steps, leak.first_step, leak.last_step), (8, 0, 7));
    assert_eq!(leak.allocations, kept);
    assert_eq!(leak.bytes, 8 * (3 << 20));
    assert_eq!(leak.bytes_per_step, 3 << 20);
    assert_eq!(leak.before_window_allocations, 0);
}

#[test]
fn a_run_without_a_leak_names_no_site() {
    // Its warm-up creates optimizer state that stays, each backward makes gradients that
    // zero_grad frees: neither is kept step after step.
    let (snapshot, _) = generate(&leaky(8, 0, None));
    let (_, steps, leaks) = analyse(&snapshot);
    assert!(steps.steps[0].warmup);
    assert!(leaks.is_empty(), "{leaks:#?}");
}

/// A ring buffer's window of a long leaking run: the leak's tensors from the dropped steps are
/// the same site's, counted apart, and are not parameters (they were 40 times the real
/// parameters' bytes in a week-long run's summary).
#[test]
fn a_leaks_memory_from_before_the_window_is_its_own_and_not_parameters() {
    let (snapshot, truth) = generate(&leaky(40, 1 << 20, Some(1500)));
    assert!(truth.devices[0].dropped_entries > 0);
    let (timeline, steps, leaks) = analyse(&snapshot);
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    let leak = &leaks[0];
    assert!(is_the_workloads_leak(&leak.site), "{}", leak.site);
    assert!(leak.before_window_allocations > 0);
    // Every step of the run kept one: those the window holds, and the rest before it.
    assert_eq!(leak.allocations + leak.before_window_allocations, 40);
    assert_eq!(
        leak.before_window_bytes,
        leak.before_window_allocations << 20
    );
    for &a in &leak.before_window {
        assert!(timeline.replay().allocations[a as usize].before_window());
        assert_eq!(steps.categories[a as usize], Category::Unknown);
    }
    // What is still called a parameter from before the window is the model's weights.
    let parameters: u64 = timeline
        .replay()
        .allocations
        .iter()
        .zip(&steps.categories)
        .filter(|(a, c)| a.before_window() && **c == Category::Parameter)
        .map(|(a, _)| a.size)
        .sum();
    let run = leaky(40, 1 << 20, Some(1500));
    let weights = run.layers as u64 * run.param_bytes_per_layer;
    assert!(
        parameters <= weights + (64 << 10),
        "{parameters} bytes of parameters; the model has {weights}"
    );
}

/// Appends a free of each of `allocations` to the end of the trace.
fn free_at_the_end(snapshot: &mut Snapshot, frees: &[(u64, u64)]) {
    let trace = &mut snapshot.device_traces.as_mut().expect("traces")[0];
    for &(addr, size) in frees {
        trace.push(TraceEntry::new(Action::FreeRequested, addr, size, 0));
        trace.push(TraceEntry::new(Action::FreeCompleted, addr, size, 0));
    }
}

#[test]
fn memory_kept_by_the_first_steps_only_is_not_a_leak() {
    // A cache filled in the first three steps and kept: the run's leak, freed at the end for
    // every step after the third.
    let (mut snapshot, _) = generate(&leaky(12, 1 << 20, None));
    let (timeline, steps, leaks) = analyse(&snapshot);
    let third_end = steps.steps[2].end_event;
    let later: Vec<(u64, u64)> = leaks[0]
        .kept
        .iter()
        .filter(|&&(_, end)| end > third_end)
        .map(|&(a, _)| {
            let a = &timeline.replay().allocations[a as usize];
            (a.addr, a.size)
        })
        .collect();
    assert_eq!(later.len(), 9);
    free_at_the_end(&mut snapshot, &later);
    let (_, steps, leaks) = analyse(&snapshot);
    assert!(steps.steps.len() >= 12);
    assert!(leaks.is_empty(), "{leaks:#?}");
}

/// Cuts the trace inside the last step's optimizer phase, after some of its temporaries are
/// made: the run ran out of memory there, and what the optimizer held looks like state that
/// stays.
fn cut_in_the_last_optimizer_phase(snapshot: &mut Snapshot) {
    let (_, steps, _) = analyse(snapshot);
    let optimizer = steps
        .steps
        .last()
        .and_then(|s| s.phases.iter().find(|p| p.kind == PhaseKind::Optimizer))
        .expect("an optimizer phase")
        .clone();
    let trace = &mut snapshot.device_traces.as_mut().expect("traces")[0];
    let allocs: Vec<usize> = (optimizer.start_event as usize..=optimizer.end_event as usize)
        .filter(|&e| trace[e].action == Action::Alloc)
        .collect();
    assert!(allocs.len() >= 4, "{allocs:?}");
    trace.truncate(allocs[3] + 1);
}

/// Regression: the last step of a week-long run's window, which ran out of memory in its
/// optimizer phase, was called "a warm-up step: it creates 104.8 MiB of optimizer state, which
/// stays (not a leak)". A window that starts mid-run holds no warm-up.
#[test]
fn a_window_from_mid_run_cut_in_an_optimizer_phase_has_no_warm_up() {
    for frameless in [false, true] {
        let (mut snapshot, truth) = generate(&TrainingRun {
            frameless,
            ..leaky(12, 0, Some(900))
        });
        assert!(truth.devices[0].dropped_entries > 0);
        cut_in_the_last_optimizer_phase(&mut snapshot);
        let (_, steps, _) = analyse(&snapshot);
        assert!(steps.steps.len() >= 3, "frameless {frameless}");
        let last = steps.steps.last().expect("steps");
        assert!(last.optimizer_state_bytes > 0, "frameless {frameless}");
        assert!(
            steps.steps.iter().all(|s| !s.warmup),
            "frameless {frameless}: {:?}",
            steps
                .steps
                .iter()
                .map(|s| (s.index, s.warmup))
                .collect::<Vec<_>>()
        );
    }
    // The same cut in a run recorded from its start keeps the first step's warm-up.
    let (mut snapshot, _) = generate(&leaky(4, 0, None));
    cut_in_the_last_optimizer_phase(&mut snapshot);
    let (_, steps, _) = analyse(&snapshot);
    assert!(steps.steps[0].warmup);
    assert!(steps.steps[1..].iter().all(|s| !s.warmup));
}
