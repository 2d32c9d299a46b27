//! Odd inputs give advice or a clear error, never a panic: no trace, only frees, only an
//! `oom`, a window that starts mid-run, an OOM that no fix can help, no frames, noisy stacks,
//! several devices.

use memsnap_advise::{advise, AdviseError, Options};
use memsnap_format::{Action, Segment, Snapshot, TraceEntry};
use memsnap_workload::{generate, TrainingRun};

fn with_budget(budget: u64) -> Options {
    Options {
        budget: Some(budget),
        ..memsnap_advise::Options::default()
    }
}

#[test]
fn a_snapshot_without_a_trace_is_a_clear_error() {
    let mut s = Snapshot::new(1);
    s.segments.push(Segment::new(0, 0x1000, 2 << 20, 0));
    assert!(matches!(
        advise(&s, &Options::default()),
        Err(AdviseError::NoTrace | AdviseError::Analysis(_))
    ));
}

#[test]
fn traces_of_only_frees_or_only_an_oom_are_advised_on() {
    let mut frees = Snapshot::new(1);
    frees.device_traces.as_mut().unwrap()[0] = vec![
        TraceEntry::new(Action::FreeRequested, 0x1000, 512, 0),
        TraceEntry::new(Action::FreeCompleted, 0x1000, 512, 0),
    ];
    let mut oom = Snapshot::new(1);
    oom.device_traces.as_mut().unwrap()[0] = vec![TraceEntry::new(Action::Oom, 0, 1 << 30, 0)];
    for s in [frees, oom] {
        match advise(&s, &with_budget(1 << 20)) {
            Ok(advice) => assert_eq!(advice.passes, 0),
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn generated_odd_runs_are_advised_on() {
    let runs = [
        TrainingRun {
            max_entries: Some(300),
            steps: 4,
            ..TrainingRun::default()
        },
        TrainingRun {
            oom_at_step: Some(2),
            device_memory: 4 << 30,
            ..TrainingRun::default()
        },
        TrainingRun {
            frameless: true,
            ..TrainingRun::default()
        },
        TrainingRun {
            stack_noise_percent: 30,
            ..TrainingRun::default()
        },
        TrainingRun {
            devices: 2,
            empty_cache_every_step: true,
            expandable_segments: true,
            ..TrainingRun::default()
        },
    ];
    for run in runs {
        let (snapshot, _) = generate(&run);
        let advice =
            advise(&snapshot, &with_budget(64 << 20)).unwrap_or_else(|e| panic!("{run:?}: {e}"));
        for p in &advice.predictions {
            assert!(p.allocated_peak_bytes > 0, "{run:?}: {p:?}");
        }
        if run.frameless {
            assert!(advice.modules.is_empty());
        }
    }
}

/// Regression: a ring buffer's window that starts with more reserved than the budget never
/// runs out of memory in the replay (its start state is taken as recorded, and no new
/// `cudaMalloc` is asked for), and every fix was called a fit: 13.2 GiB "fit" a 1 GB budget
/// on a real snapshot. A prediction fits only when its reserved peak is within the budget too.
#[test]
fn a_window_that_starts_above_the_budget_does_not_fit() {
    let (snapshot, _) = generate(&TrainingRun {
        max_entries: Some(300),
        steps: 4,
        ..TrainingRun::default()
    });
    let budget = 1 << 20;
    let advice = advise(&snapshot, &with_budget(budget)).expect("advice");
    for p in std::iter::once(&advice.baseline).chain(&advice.predictions) {
        assert!(p.reserved_peak_bytes > budget, "{p:?}");
        assert_eq!(p.fits, Some(false), "{}: {p:?}", p.description);
    }
    // Within a budget above the peaks, the same run fits.
    let roomy = advice.baseline.reserved_peak_bytes * 2;
    let advice = advise(&snapshot, &with_budget(roomy)).expect("advice");
    assert_eq!(advice.baseline.fits, Some(true));
}

/// With noisy stacks a call's backward can be placed after some of its activations were
/// released. Checkpointing made those activations again there, and nothing released them:
/// the prediction grew by the activations every step (1.5 GiB over 4 steps, 4.2 GiB over 16,
/// against a recorded peak of 1.1 GiB).
#[test]
fn checkpointing_a_run_with_noisy_stacks_keeps_nothing_from_step_to_step() {
    let peak = |steps: usize| {
        let (recorded, _) = generate(&TrainingRun {
            steps,
            layers: 6,
            activations_per_layer: 8,
            activation_bytes: 24 << 20,
            param_bytes_per_layer: 16 << 20,
            stack_noise_percent: 20,
            ..TrainingRun::default()
        });
        let advisor = memsnap_advise::Advisor::new(&recorded, None).unwrap();
        let recorded_peak = advisor.predict(&[], None).unwrap().allocated_peak_bytes;
        let every_block = advisor
            .candidates()
            .into_iter()
            .find(|f| matches!(f, memsnap_advise::Fix::Checkpoint { module, calls: None, .. } if module == "model.py:212"))
            .expect("checkpointing every block is offered");
        let p = advisor.predict(&[every_block], None).unwrap();
        assert!(
            p.allocated_peak_bytes < recorded_peak,
            "{steps} steps: {} against {recorded_peak} recorded",
            p.allocated_peak_bytes
        );
        p.allocated_peak_bytes
    };
    let (short, long) = (peak(4), peak(16));
    // Twelve more steps may hold a step with a higher peak, not twelve steps of activations.
    assert!(
        long < short + short / 10,
        "{short} over 4 steps, {long} over 16"
    );
}
