//! The predicted curves on the recorded axis (`predicted_curve`): the edited trace's entries
//! placed at the recorded entries they stand for.

use memsnap_advise::{advise, predicted_curve, Fix, Options};
use memsnap_format::Action;
use memsnap_simulate::{simulate, Options as SimOptions};
use memsnap_workload::{generate, TrainingRun};

fn run() -> TrainingRun {
    TrainingRun {
        steps: 3,
        layers: 4,
        activations_per_layer: 4,
        ordered_forward_stacks: true,
        ..TrainingRun::default()
    }
}

#[test]
fn an_identity_edit_maps_exactly_onto_the_recorded_curve() {
    let (snapshot, _) = generate(&run());
    let n = snapshot.traces()[0].len();
    let curve = predicted_curve(&snapshot, 0, &[], None).unwrap();
    let replayed = simulate(&snapshot, &SimOptions::default()).unwrap();
    let d = &replayed.devices[0];
    assert_eq!(curve.events, (0..n as u32).collect::<Vec<_>>());
    assert_eq!(curve.allocated, d.allocated_curve);
    assert_eq!(curve.reserved, d.reserved_curve);
    let (allocated, reserved) = curve.per_event_max(n);
    assert_eq!(allocated, d.allocated_curve);
    assert_eq!(reserved, d.reserved_curve);
    assert_eq!(allocated.iter().max(), Some(&d.allocated_peak_bytes));
}

#[test]
fn every_fix_s_mapped_curve_peaks_at_its_predicted_peak() {
    let (snapshot, _) = generate(&run());
    let n = snapshot.traces()[0].len();
    let advice = advise(&snapshot, &Options::default()).unwrap();
    assert!(advice.predictions.len() >= 5, "{:#?}", advice.predictions);
    let mut checkpoints = 0;
    for p in &advice.predictions {
        let curve = predicted_curve(&snapshot, 0, &p.fixes, None).unwrap();
        assert_eq!(curve.events.len(), curve.allocated.len());
        assert_eq!(curve.events.len(), curve.reserved.len());
        assert!(curve.events.iter().all(|&e| (e as usize) < n));
        let (allocated, reserved) = curve.per_event_max(n);
        assert_eq!(
            allocated.iter().max(),
            Some(&p.allocated_peak_bytes),
            "{}",
            p.description
        );
        assert_eq!(
            reserved.iter().max(),
            Some(&p.reserved_peak_bytes),
            "{}",
            p.description
        );
        let repeats = p
            .fixes
            .iter()
            .any(|f| matches!(f, Fix::MicroBatches { .. }));
        if !repeats {
            assert!(
                curve.events.windows(2).all(|w| w[0] <= w[1]),
                "{}: the points go forward on the recorded axis",
                p.description
            );
        }
        if matches!(p.fixes[..], [Fix::Checkpoint { .. }]) {
            // The recomputation's allocations stand at recorded entries of the backward: more
            // points there than recorded entries.
            checkpoints += 1;
            assert!(curve.events.len() > n, "{}", p.description);
            assert!(
                curve.events.windows(2).any(|w| w[0] == w[1]),
                "{}",
                p.description
            );
            // What it checkpoints: recorded allocations, made in the module's calls.
            assert!(!curve.checkpointed_events.is_empty(), "{}", p.description);
            let trace = &snapshot.traces()[0];
            assert!(curve
                .checkpointed_events
                .iter()
                .all(|&e| trace[e as usize].action == Action::Alloc));
        } else if !p.fixes.iter().any(|f| matches!(f, Fix::Checkpoint { .. })) {
            assert!(curve.checkpointed_events.is_empty(), "{}", p.description);
        }
    }
    assert!(checkpoints >= 1);
}

#[test]
fn a_completed_oom_run_maps_the_completion_onto_the_oom_entry() {
    const DEVICE: u64 = 160 << 20;
    let (snapshot, truth) = generate(&TrainingRun {
        device_memory: DEVICE,
        ..run()
    });
    assert!(
        truth.devices[0].oom.is_some(),
        "the run outgrows the device"
    );
    let trace = &snapshot.traces()[0];
    let oom = trace
        .iter()
        .position(|e| e.action == Action::Oom)
        .expect("an oom entry") as u32;
    let advice = advise(
        &snapshot,
        &Options {
            budget: Some(DEVICE),
            device: Some(0),
            ..Options::default()
        },
    )
    .unwrap();
    let completion = advice.completion.clone().expect("completed");
    for p in std::iter::once(&advice.baseline).chain(&advice.predictions) {
        let curve = predicted_curve(&snapshot, 0, &p.fixes, Some(DEVICE)).unwrap();
        assert!(curve.events.iter().all(|&e| e <= oom), "{}", p.description);
        let at_oom = curve.events.iter().filter(|&&e| e == oom).count();
        if p.fixes.is_empty() {
            assert_eq!(at_oom, completion.entries_added, "the completion's rest");
        }
        let (allocated, reserved) = curve.per_event_max(trace.len());
        assert_eq!(allocated.iter().max(), Some(&p.allocated_peak_bytes));
        assert_eq!(reserved.iter().max(), Some(&p.reserved_peak_bytes));
    }
}
