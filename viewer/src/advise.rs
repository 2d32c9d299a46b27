//! The Advise view's model, free of UI: the budget field's parsing, the work that runs
//! `memsnap_advise::advise` (in a background job), and the words and numbers the view shows
//! for each fix, as `memsnap advise` prints them.

use memsnap_advise::{Advice, Fix, PredictedCurve, Prediction};
use memsnap_analysis::curve::RangeMinMax;
use memsnap_analysis::AllocId;
use memsnap_format::Snapshot;

/// Why advice could not be given.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdviseError {
    /// The budget field is not a size above 0.
    #[error("`{text}` is not a memory budget (a size above 0, e.g. 40GB, 24GiB, 512MiB)")]
    Budget { text: String },
    /// The advisor refused the file (no trace to edit, a bad allocator setting, ...).
    #[error(transparent)]
    Advise(#[from] memsnap_advise::AdviseError),
}

/// Parses the budget field as `memsnap advise --budget` does (`memsnap-units`' sizes); empty
/// means no budget (the fixes ranked by reserved peak only).
pub fn parse_budget(text: &str) -> Result<Option<u64>, AdviseError> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    match crate::units::parse_bytes(text) {
        Some(0) | None => Err(AdviseError::Budget {
            text: text.to_owned(),
        }),
        Some(bytes) => Ok(Some(bytes)),
    }
}

/// Ranks the fixes for `device` under `budget` (in a background job): one analysis, then one
/// edit and replay per candidate (see `memsnap_advise::advise`; about 15 replays without a
/// budget, at most 40 with one), as many at once as it runs by default.
pub fn run(snapshot: &Snapshot, device: i64, budget: Option<u64>) -> Result<Advice, AdviseError> {
    Ok(memsnap_advise::advise(
        snapshot,
        &memsnap_advise::Options {
            budget,
            device: Some(device),
            device_memory_budget: false,
            jobs: None,
        },
    )?)
}

/// The recompute column: checkpointing's extra forward work in percent, `-` for none.
pub fn recompute_text(p: &Prediction) -> String {
    if p.extra_forward_compute > 0.0 {
        format!("+{:.0}%", p.extra_forward_compute * 100.0)
    } else {
        "-".to_owned()
    }
}

/// The modules a prediction's fixes edit (checkpointed module nodes, `blocks.0 to blocks.2`),
/// in its order; empty for fixes that touch no module (micro-batches, optimizer state,
/// allocator settings).
pub fn modules_touched(p: &Prediction) -> Vec<String> {
    p.fixes.iter().filter_map(Fix::touches).collect()
}

/// A fix's predicted run, ready to be drawn over the recorded timeline: its allocated and
/// reserved curves on the recorded event axis ([`memsnap_advise::predicted_curve`]: each entry
/// of the edited trace at the recorded entry it stands for), as the highest value per
/// recorded event with min/max tables for any range of them, and which recorded allocations
/// the fix's checkpointing frees early and makes again (the modules it touches).
pub struct PredictedOverlay {
    /// `predicted: <the fix in words>`, the legend's entry.
    pub label: String,
    pub allocated_peak_bytes: u64,
    pub reserved_peak_bytes: u64,
    /// Highest predicted bytes per recorded event (`PredictedCurve::per_event_max`).
    allocated: Vec<u64>,
    reserved: Vec<u64>,
    allocated_table: RangeMinMax,
    reserved_table: RangeMinMax,
    /// Per allocation of the recorded replay ([`AllocId`] order): made in a checkpointed call.
    touched: Vec<bool>,
    /// How many allocations are `touched`.
    pub touched_count: usize,
}

impl PredictedOverlay {
    /// The overlay of `curve` over a recorded trace of `events` entries whose allocations
    /// were made at `alloc_events` (in [`AllocId`] order; `None`: before the window).
    ///
    /// O(p + n + m log c) in the curve's points, the events, the allocations and the
    /// checkpointed ones.
    pub fn new(
        curve: &PredictedCurve,
        description: &str,
        events: usize,
        alloc_events: &[Option<u32>],
    ) -> Self {
        let (allocated, reserved) = curve.per_event_max(events);
        let touched: Vec<bool> = alloc_events
            .iter()
            .map(|e| e.is_some_and(|e| curve.checkpointed_events.binary_search(&e).is_ok()))
            .collect();
        PredictedOverlay {
            label: format!("predicted: {description}"),
            allocated_peak_bytes: curve.allocated_peak_bytes,
            reserved_peak_bytes: curve.reserved_peak_bytes,
            allocated_table: RangeMinMax::build(&allocated),
            reserved_table: RangeMinMax::build(&reserved),
            allocated,
            reserved,
            touched_count: touched.iter().filter(|&&t| t).count(),
            touched,
        }
    }

    /// The highest predicted (allocated, reserved) bytes over the recorded events `lo..hi`;
    /// `None` for an empty range. O(1) plus at most two partial blocks of 256 events, so a
    /// frame's line costs O(columns), whatever the zoom.
    pub fn max_in(&self, lo: usize, hi: usize) -> Option<(u64, u64)> {
        let allocated = self.allocated_table.query(&self.allocated, lo, hi)?.1;
        let reserved = self.reserved_table.query(&self.reserved, lo, hi)?.1;
        Some((allocated, reserved))
    }

    /// Recorded events covered.
    pub fn len(&self) -> usize {
        self.allocated.len()
    }

    pub fn is_empty(&self) -> bool {
        self.allocated.is_empty()
    }

    /// Whether the fix's checkpointing frees the allocation early and makes it again.
    pub fn touches(&self, id: AllocId) -> bool {
        self.touched.get(id.0 as usize).copied().unwrap_or(false)
    }
}

/// The predicted run of `prediction` (one of the advice's for `device`, given under `budget`)
/// as an overlay of the recorded timeline (in a background job): the completion, one
/// analysis, one edit and one or two replays ([`memsnap_advise::predicted_curve`]), then
/// [`PredictedOverlay::new`].
pub fn predict_overlay(
    snapshot: &Snapshot,
    device: i64,
    prediction: &Prediction,
    budget: Option<u64>,
    events: usize,
    alloc_events: &[Option<u32>],
) -> Result<PredictedOverlay, AdviseError> {
    let curve = memsnap_advise::predicted_curve(snapshot, device, &prediction.fixes, budget)?;
    Ok(PredictedOverlay::new(
        &curve,
        &prediction.description,
        events,
        alloc_events,
    ))
}

/// The note on a run that ran out of memory and was completed, as `memsnap advise` prints it.
pub fn completion_note(advice: &Advice) -> Option<String> {
    advice.completion.as_ref().map(|c| {
        format!(
            "The recording ends where step {} ran out of memory (event {}); it is completed with the rest of step {} ({} entries), and every prediction is of the completed run.",
            c.failed_step, c.oom_event, c.model_step, c.entries_added
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_like_the_command_line_and_zero_or_words_are_refused() {
        assert_eq!(parse_budget("").unwrap(), None);
        assert_eq!(parse_budget("  ").unwrap(), None);
        assert_eq!(parse_budget("1GiB").unwrap(), Some(1 << 30));
        assert_eq!(parse_budget("40GB").unwrap(), Some(40_000_000_000));
        for bad in ["0", "lots", "12 parsecs"] {
            assert!(
                matches!(parse_budget(bad), Err(AdviseError::Budget { ref text }) if text == bad),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_overlay_of_a_fix_peaks_at_its_prediction_and_marks_what_it_checkpoints() {
        let (snapshot, _) = memsnap_workload::generate(&memsnap_workload::TrainingRun {
            steps: 2,
            layers: 3,
            activations_per_layer: 3,
            ordered_forward_stacks: true,
            ..Default::default()
        });
        let timeline = memsnap_analysis::DeviceTimeline::build(&snapshot, 0).unwrap();
        let replay = timeline.replay();
        let alloc_events: Vec<Option<u32>> =
            replay.allocations.iter().map(|a| a.alloc_event()).collect();
        let advice = run(&snapshot, 0, None).unwrap();
        let n = replay.trace_len as usize;
        let checkpoint = advice
            .predictions
            .iter()
            .find(|p| matches!(p.fixes[..], [Fix::Checkpoint { .. }]))
            .expect("a checkpointing fix");
        let overlay = predict_overlay(&snapshot, 0, checkpoint, None, n, &alloc_events).unwrap();
        assert_eq!(overlay.len(), n);
        assert_eq!(
            overlay.label,
            format!("predicted: {}", checkpoint.description)
        );
        assert_eq!(
            overlay.max_in(0, n),
            Some((
                checkpoint.allocated_peak_bytes,
                checkpoint.reserved_peak_bytes
            ))
        );
        assert_eq!(overlay.max_in(5, 5), None);
        // The checkpointed allocations: some, all of them activations' or transients' made in
        // a forward, none of the parameters made before the first step.
        assert!(overlay.touched_count > 0);
        assert!(!overlay.touches(AllocId(0)), "a parameter");
        let micro = advice
            .predictions
            .iter()
            .find(|p| matches!(p.fixes[..], [Fix::MicroBatches { .. }]))
            .expect("a micro-batch fix");
        let overlay = predict_overlay(&snapshot, 0, micro, None, n, &alloc_events).unwrap();
        assert_eq!(overlay.touched_count, 0, "micro-batches touch no module");
        assert_eq!(
            overlay.max_in(0, n).map(|m| m.0),
            Some(micro.allocated_peak_bytes)
        );
    }
}
