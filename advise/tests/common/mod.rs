//! What the advise tests share: memsnap's replay of a run as recorded, and the 3 % check of a
//! prediction against the run made with its change.

use memsnap_advise::{Advice, Prediction};
use memsnap_format::Snapshot;
use memsnap_workload::{generate, DeviceTruth, TrainingRun};

/// Allocated and reserved peaks of memsnap's replay of a snapshot as recorded.
pub fn replayed_peaks(snapshot: &Snapshot) -> (u64, u64) {
    let sim = memsnap_simulate::simulate(snapshot, &memsnap_simulate::Options::default()).unwrap();
    let d = &sim.devices[0];
    (d.allocated_peak_bytes, d.reserved_peak_bytes)
}

/// `predicted` within 3 % of `actual`.
pub fn within(what: &str, predicted: u64, actual: u64) {
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

/// Both of `p`'s peaks within 3 % of `actual` (allocated, reserved).
pub fn peaks_within(what: &str, p: &Prediction, (allocated, reserved): (u64, u64)) {
    within(
        &format!("{what} allocated"),
        p.allocated_peak_bytes,
        allocated,
    );
    within(&format!("{what} reserved"), p.reserved_peak_bytes, reserved);
}

/// Six blocks of eight ~24 MiB activations a step, 3 steps: the run the accuracy tests
/// make with and without each fix (their stacks say nothing of order or names yet).
pub fn six_blocks() -> TrainingRun {
    TrainingRun {
        steps: 3,
        layers: 6,
        activations_per_layer: 8,
        activation_bytes: 24 << 20,
        param_bytes_per_layer: 16 << 20,
        ..TrainingRun::default()
    }
}

/// `whole` on a device of `device` bytes, which it must outgrow, and `advise`'s answer for that
/// budget: the completed run's peaks must be within 3 % of `whole`'s own. Returns the small
/// run, the truth of its device, and the advice.
pub fn advise_out_of_memory(
    whole: &TrainingRun,
    device: u64,
) -> (TrainingRun, DeviceTruth, Advice) {
    let small = TrainingRun {
        device_memory: device,
        ..whole.clone()
    };
    let (recorded, truth) = generate(&small);
    let truth = truth.devices[0].clone();
    assert!(truth.oom.is_some(), "the run outgrows {device} bytes");
    let options = memsnap_advise::Options {
        budget: Some(device),
        ..memsnap_advise::Options::default()
    };
    let advice = memsnap_advise::advise(&recorded, &options).unwrap();
    assert!(advice.completion.is_some(), "completed");
    peaks_within(
        "completed run",
        &advice.baseline,
        replayed_peaks(&generate(whole).0),
    );
    (small, truth, advice)
}
