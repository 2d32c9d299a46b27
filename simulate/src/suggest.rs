//! `--suggest`: the settings people actually use, each replayed, ranked by reserved peak.

use memsnap_format::Snapshot;
use memsnap_units::format_size;
use serde::Serialize;

use crate::error::Result;
use crate::replay::{simulate, Options, Simulation};
use crate::settings;

/// The candidates tried, each applied on top of the file's own settings.
///
/// `garbage_collection_threshold` only acts when a memory fraction is set, so those
/// candidates also set `per_process_memory_fraction:0.99` (1 % less memory for the run).
pub const CANDIDATES: &[&str] = &[
    "expandable_segments:True",
    "max_split_size_mb:64",
    "max_split_size_mb:128",
    "max_split_size_mb:256",
    "max_split_size_mb:512",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:0.99",
    "garbage_collection_threshold:0.8,per_process_memory_fraction:0.99",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:8",
    "expandable_segments:True,roundup_power2_divisions:4",
    "max_split_size_mb:128,roundup_power2_divisions:4",
    "max_split_size_mb:256,garbage_collection_threshold:0.8,per_process_memory_fraction:0.99",
];

/// One candidate's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// The candidate's keys (what to add to `PYTORCH_CUDA_ALLOC_CONF`).
    pub change: String,
    /// The whole settings replayed.
    pub alloc_conf: String,
    /// Highest reserved peak over the devices.
    pub reserved_peak_bytes: u64,
    pub fragmentation_bytes: u64,
    pub device_mallocs: u64,
    pub device_frees: u64,
    /// First out-of-memory: (device, event).
    pub oom: Option<(i64, usize)>,
    /// One sentence comparing it with the file's own settings.
    pub verdict: String,
}

/// The baseline (the file's settings, replayed) and the candidates, best first: runs that do
/// not run out of memory first, then those that run out latest, then by reserved peak.
#[derive(Clone, Debug, Serialize)]
pub struct Suggestions {
    pub baseline: Candidate,
    pub candidates: Vec<Candidate>,
}

fn summarize(change: &str, sim: &Simulation) -> Candidate {
    let peak = sim
        .devices
        .iter()
        .map(|d| d.reserved_peak_bytes)
        .max()
        .unwrap_or(0);
    let at_peak = sim
        .devices
        .iter()
        .max_by_key(|d| d.reserved_peak_bytes)
        .map_or(0, |d| d.fragmentation_bytes);
    Candidate {
        change: change.to_string(),
        alloc_conf: sim.alloc_conf.clone(),
        reserved_peak_bytes: peak,
        fragmentation_bytes: at_peak,
        device_mallocs: sim.devices.iter().map(|d| d.device_mallocs).sum(),
        device_frees: sim.devices.iter().map(|d| d.device_frees).sum(),
        oom: sim
            .devices
            .iter()
            .find_map(|d| d.oom.as_ref().map(|o| (d.device, o.event))),
        verdict: String::new(),
    }
}

/// Replays `snapshot` under the file's settings and under every [`CANDIDATES`] entry.
pub fn suggest(
    snapshot: &Snapshot,
    memory_limit: Option<u64>,
    device: Option<i64>,
) -> Result<Suggestions> {
    let (file_config, _) = settings::file_config(snapshot);
    let base_options = Options {
        config: None,
        memory_limit,
        device,
    };
    let baseline = summarize("(the file's settings)", &simulate(snapshot, &base_options)?);
    let mut candidates = Vec::new();
    for change in CANDIDATES {
        let config = settings::overlay(&file_config, change)?;
        let options = Options {
            config: Some(config),
            ..base_options.clone()
        };
        let mut c = summarize(change, &simulate(snapshot, &options)?);
        c.verdict = verdict(&baseline, &c);
        candidates.push(c);
    }
    // A run that ends in an OOM earlier has a lower peak only because it stopped sooner.
    candidates.sort_by_key(|c| {
        (
            c.oom.is_some(),
            std::cmp::Reverse(c.oom.map(|o| o.1)),
            c.reserved_peak_bytes,
        )
    });
    Ok(Suggestions {
        baseline,
        candidates,
    })
}

/// "expandable_segments:True would have cut the reserved peak from 23.4 GiB to 21.1 GiB; the
/// OOM at event 6120 would not have happened".
fn verdict(base: &Candidate, c: &Candidate) -> String {
    let (a, b) = (base.reserved_peak_bytes, c.reserved_peak_bytes);
    let same = format_size(a) == format_size(b);
    let mut s = match b.cmp(&a) {
        _ if same => format!(
            "{} would have left the reserved peak at {}",
            c.change,
            format_size(b)
        ),
        std::cmp::Ordering::Less => format!(
            "{} would have cut the reserved peak from {} to {}",
            c.change,
            format_size(a),
            format_size(b)
        ),
        std::cmp::Ordering::Greater => format!(
            "{} would have raised the reserved peak from {} to {}",
            c.change,
            format_size(a),
            format_size(b)
        ),
        std::cmp::Ordering::Equal => format!(
            "{} would have left the reserved peak at {}",
            c.change,
            format_size(a)
        ),
    };
    match (base.oom, c.oom) {
        (Some((d, e)), None) => s.push_str(&format!(
            "; the OOM at event {e} (device {d}) would not have happened"
        )),
        (Some((_, b)), Some((d, e))) if e < b => s.push_str(&format!(
            "; it would run out of memory earlier (event {e}, device {d})"
        )),
        (Some(_), Some((d, e))) => s.push_str(&format!(
            "; it would still run out of memory (event {e}, device {d})"
        )),
        (None, Some((d, e))) => s.push_str(&format!(
            "; it would run out of memory at event {e} (device {d})"
        )),
        (None, None) => {}
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(change: &str, reserved_peak_bytes: u64) -> Candidate {
        Candidate {
            change: change.to_string(),
            alloc_conf: String::new(),
            reserved_peak_bytes,
            fragmentation_bytes: 0,
            device_mallocs: 0,
            device_frees: 0,
            oom: None,
            verdict: String::new(),
        }
    }

    /// The verdict formatted sizes itself (`0.5 MiB`, `1536.0 GiB`) while every other line of
    /// `memsnap simulate` used `memsnap_units::format_size` (`512.0 KiB`, `1.5 TiB`).
    #[test]
    fn verdict_sizes_read_like_the_rest_of_simulate() {
        let base = candidate("", 3 << 39);
        let small = candidate("max_split_size_mb:64", 512 << 10);
        assert_eq!(
            verdict(&base, &small),
            "max_split_size_mb:64 would have cut the reserved peak from 1.5 TiB to 512.0 KiB"
        );
        let same = candidate("expandable_segments:True", (3 << 39) + 1);
        assert_eq!(
            verdict(&base, &same),
            "expandable_segments:True would have left the reserved peak at 1.5 TiB"
        );
    }
}
