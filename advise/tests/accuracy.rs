//! Every fix's prediction against a generated run made with that change: the predicted peaks
//! (the recorded run's trace, edited and replayed) must be within 3 % of the peaks of the run
//! regenerated with the change (its own trace, replayed the same way).

use memsnap_advise::{Advisor, Fix};
use memsnap_format::Snapshot;
use memsnap_workload::{generate, TrainingRun};

fn run() -> TrainingRun {
    TrainingRun {
        steps: 3,
        layers: 6,
        activations_per_layer: 8,
        activation_bytes: 24 << 20,
        param_bytes_per_layer: 16 << 20,
        ordered_forward_stacks: true,
        ..TrainingRun::default()
    }
}

/// Allocated and reserved peaks of memsnap's replay of a snapshot as recorded.
fn replayed_peaks(snapshot: &Snapshot) -> (u64, u64) {
    let sim = memsnap_simulate::simulate(snapshot, &memsnap_simulate::Options::default()).unwrap();
    let d = &sim.devices[0];
    (d.allocated_peak_bytes, d.reserved_peak_bytes)
}

fn within(what: &str, predicted: u64, actual: u64) {
    let error = (predicted as f64 - actual as f64).abs() / actual as f64;
    eprintln!(
        "{what}: predicted {predicted}, actual {actual}, error {:.3}%",
        error * 100.0
    );
    assert!(
        error <= 0.03,
        "{what}: predicted {predicted}, actual {actual}"
    );
}

fn check(name: &str, fixes: &[Fix], changed: TrainingRun) {
    let (recorded, _) = generate(&run());
    let advisor = Advisor::new(&recorded, None).unwrap();
    let p = advisor.predict(fixes, None).unwrap();
    let (actual_allocated, actual_reserved) = replayed_peaks(&generate(&changed).0);
    let (base_allocated, _) = replayed_peaks(&recorded);
    eprintln!("{name}: recorded allocated peak {base_allocated}");
    within(
        &format!("{name} allocated"),
        p.allocated_peak_bytes,
        actual_allocated,
    );
    within(
        &format!("{name} reserved"),
        p.reserved_peak_bytes,
        actual_reserved,
    );
}

fn blocks(advisor: &Advisor<'_>) -> Fix {
    let top = advisor.module_bytes().into_iter().next().unwrap();
    assert_eq!(
        top.module, "model.py:212",
        "the model's loop over its blocks"
    );
    Fix::Checkpoint {
        module: top.module,
        node: top.node,
    }
}

#[test]
fn checkpointing_every_block_is_predicted_within_3_percent() {
    let (recorded, _) = generate(&run());
    let fix = blocks(&Advisor::new(&recorded, None).unwrap());
    let changed = TrainingRun {
        checkpoint_layers: (0..6).collect(),
        ..run()
    };
    check("checkpoint", &[fix], changed);
}

#[test]
fn micro_batches_are_predicted_within_3_percent() {
    for count in [2u32, 4] {
        let changed = TrainingRun {
            micro_batches: count as usize,
            ..run()
        };
        check(
            &format!("micro-batches {count}"),
            &[Fix::MicroBatches { count }],
            changed,
        );
    }
}

#[test]
fn optimizer_state_in_8_bits_or_offloaded_is_predicted_within_3_percent() {
    for percent in [25u8, 0] {
        let changed = TrainingRun {
            optimizer_state_percent: percent,
            ..run()
        };
        check(
            &format!("optimizer state {percent}%"),
            &[Fix::OptimizerState { percent }],
            changed,
        );
    }
}

#[test]
fn expandable_segments_are_predicted_within_3_percent() {
    let changed = TrainingRun {
        expandable_segments: true,
        ..run()
    };
    let fix = Fix::Allocator {
        alloc_conf: "expandable_segments:True".into(),
    };
    check("expandable segments", &[fix], changed);
}

#[test]
fn checkpointing_with_micro_batches_is_predicted_within_3_percent() {
    let (recorded, _) = generate(&run());
    let fix = blocks(&Advisor::new(&recorded, None).unwrap());
    let changed = TrainingRun {
        checkpoint_layers: (0..6).collect(),
        micro_batches: 2,
        optimizer_state_percent: 25,
        ..run()
    };
    check(
        "checkpoint + micro-batches 2 + 8-bit",
        &[
            fix,
            Fix::MicroBatches { count: 2 },
            Fix::OptimizerState { percent: 25 },
        ],
        changed,
    );
}
