//! What the advise tests share: memsnap's replay of a run as recorded, and the 3 % check of a
//! prediction against the run made with its change.

use memsnap_advise::Prediction;
use memsnap_format::Snapshot;

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
