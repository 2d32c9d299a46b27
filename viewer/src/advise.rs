//! The Advise view's model, free of UI: the budget field's parsing, the device memory the file
//! implies (the budget's default), the work that runs `memsnap_advise::advise` (in a
//! background job), and the words and numbers the view shows for each fix, as
//! `memsnap advise` prints them.

use memsnap_advise::{Advice, Fix, Prediction};
use memsnap_format::{Action, Snapshot};

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

/// The device's memory as the file states it, or `None` when it does not: only an `oom` entry
/// does, with the device's free bytes then; the memory is those plus what was reserved at that
/// moment (the bytes reserved before the window, `reserved_before_window` of the analysis'
/// replay, plus the segment entries before the first `oom`), which is how `memsnap simulate`
/// sizes the device of an OOM file.
///
/// O(n) in the device's trace entries.
pub fn device_memory(snapshot: &Snapshot, device: i64, reserved_before_window: u64) -> Option<u64> {
    let trace = snapshot.traces().get(usize::try_from(device).ok()?)?;
    let at = trace.iter().position(|e| e.action == Action::Oom)?;
    let free = trace[at].device_free()?;
    let reserved = trace[..at]
        .iter()
        .fold(reserved_before_window, |r, e| match e.action {
            Action::SegmentAlloc | Action::SegmentMap => r.saturating_add(e.size),
            Action::SegmentFree | Action::SegmentUnmap => r.saturating_sub(e.size),
            _ => r,
        });
    Some(free.saturating_add(reserved))
}

/// Ranks the fixes for `device` under `budget` (in a background job): one analysis, then one
/// edit and replay per candidate (see `memsnap_advise::advise`; about 15 replays without a
/// budget, at most 40 with one).
pub fn run(snapshot: &Snapshot, device: i64, budget: Option<u64>) -> Result<Advice, AdviseError> {
    Ok(memsnap_advise::advise(
        snapshot,
        &memsnap_advise::Options {
            budget,
            device: Some(device),
        },
    )?)
}

/// The "fits" column, as `memsnap advise` prints it: `OOM` when the replay ran out of memory
/// even without the budget's limit, `yes`/`no` against the budget, `-` without one.
pub fn verdict(p: &Prediction) -> &'static str {
    match (p.fits, p.out_of_memory) {
        (_, true) => "OOM",
        (Some(true), _) => "yes",
        (Some(false), _) => "no",
        (None, _) => "-",
    }
}

/// The recompute column: checkpointing's extra forward work in percent, `-` for none.
pub fn recompute_text(p: &Prediction) -> String {
    if p.extra_forward_compute > 0.0 {
        format!("+{:.0}%", p.extra_forward_compute * 100.0)
    } else {
        "-".to_owned()
    }
}

/// The modules a prediction's fixes edit (checkpointed module nodes), in its order; empty for
/// fixes that touch no module (micro-batches, optimizer state, allocator settings).
pub fn modules_touched(p: &Prediction) -> Vec<&str> {
    p.fixes
        .iter()
        .filter_map(|f| match f {
            Fix::Checkpoint { module, .. } => Some(module.as_str()),
            _ => None,
        })
        .collect()
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
    fn a_file_without_an_oom_entry_states_no_device_memory() {
        let (snapshot, _) = memsnap_workload::generate(&memsnap_workload::TrainingRun {
            steps: 2,
            layers: 2,
            activations_per_layer: 2,
            ..Default::default()
        });
        assert_eq!(device_memory(&snapshot, 0, 0), None);
        assert_eq!(device_memory(&snapshot, -1, 0), None);
        assert_eq!(device_memory(&snapshot, 7, 0), None);
    }
}
