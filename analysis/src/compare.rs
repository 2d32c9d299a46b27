//! Comparing snapshots: two runs (`memsnap diff`) and the ranks of one job (`memsnap ranks`).

use std::collections::HashMap;
use std::sync::Arc;

use memsnap_format::Snapshot;
use serde::Serialize;

use crate::error::Result;
use crate::sites::GroupBy;
use crate::steps::StepAnalysis;
use crate::summary::{summarize_device_with_steps, DeviceSummary, SummaryOptions};
use crate::timeline::DeviceTimeline;

/// One device of one file, reduced to what is compared.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceProfile {
    pub summary: DeviceSummary,
    /// Every site (grouped by top frame, labelled `file:line:function`, which is stable across
    /// runs): `(bytes live at the peak, total bytes allocated)`.
    pub sites: HashMap<String, (u64, u64)>,
}

/// Summarises and profiles each device of a snapshot: per device, a
/// [`DeviceTimeline::build`] and [`device_profile`].
pub fn profile(snapshot: &Snapshot, options: &SummaryOptions) -> Result<Vec<DeviceProfile>> {
    DeviceTimeline::devices(snapshot)
        .into_iter()
        .map(|d| {
            let timeline = DeviceTimeline::build(snapshot, d)?;
            Ok(device_profile(snapshot, &timeline, options))
        })
        .collect()
}

/// The profile of one device whose timeline is already built: the steps
/// ([`DeviceTimeline::steps`]), then [`device_profile_with_steps`].
pub fn device_profile(
    snapshot: &Snapshot,
    timeline: &DeviceTimeline,
    options: &SummaryOptions,
) -> DeviceProfile {
    let steps = timeline.steps(&options.steps);
    device_profile_with_steps(snapshot, timeline, options, Arc::new(steps))
}

/// [`device_profile`] with the steps already found (`timeline.steps(&options.steps)`): the
/// summary, then the sites by top frame, O(m + k log k) in the allocations and sites (each
/// stack's top frame found once).
pub fn device_profile_with_steps(
    snapshot: &Snapshot,
    timeline: &DeviceTimeline,
    options: &SummaryOptions,
    steps: Arc<StepAnalysis>,
) -> DeviceProfile {
    let summary = summarize_device_with_steps(snapshot, timeline, options, steps);
    let mut sites: HashMap<String, (u64, u64)> = HashMap::new();
    for s in timeline.top_sites(snapshot, GroupBy::Frame) {
        let e = sites.entry(s.key.label(snapshot)).or_default();
        e.0 = e.0.saturating_add(s.bytes_at_peak);
        e.1 = e.1.saturating_add(s.total_bytes);
    }
    DeviceProfile { summary, sites }
}

/// A site's change between two runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteDelta {
    pub site: String,
    pub before_bytes_at_peak: u64,
    pub after_bytes_at_peak: u64,
    pub delta_bytes_at_peak: i64,
    pub delta_total_bytes: i64,
}

/// One step's change (steps aligned by index).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepDelta {
    pub index: usize,
    pub before_peak_bytes: u64,
    pub after_peak_bytes: u64,
    pub delta_peak_bytes: i64,
    /// The change of what the step starts from (live bytes before its first event,
    /// [`crate::Step::before_bytes`]).
    pub delta_start_bytes: i64,
}

/// The change of one device between two runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceDiff {
    pub device: i64,
    pub before_peak_bytes: u64,
    pub after_peak_bytes: u64,
    pub delta_peak_bytes: i64,
    /// `delta / before × 100`; `None` when before is 0.
    pub delta_peak_percent: Option<f64>,
    pub before_steps: usize,
    pub after_steps: usize,
    pub steps: Vec<StepDelta>,
    /// Sites by change of bytes at the peak: the biggest growth first.
    pub grew: Vec<SiteDelta>,
    /// The biggest shrink first.
    pub shrank: Vec<SiteDelta>,
}

fn delta(a: u64, b: u64) -> i64 {
    i64::try_from(i128::from(b) - i128::from(a)).unwrap_or(if b > a { i64::MAX } else { i64::MIN })
}

/// Compares devices present in both runs; `top` sites are listed each way.
///
/// O(d + Σ (k log k + s)) for `d` devices, `k` sites and `s` steps of each compared device:
/// each device of `after` is found by hash (a search per device was O(d²)).
pub fn diff(before: &[DeviceProfile], after: &[DeviceProfile], top: usize) -> Vec<DeviceDiff> {
    // The first profile of each device, as a search from the front would find it.
    let mut after_by_device: HashMap<i64, &DeviceProfile> = HashMap::new();
    for b in after {
        after_by_device.entry(b.summary.device).or_insert(b);
    }
    let mut out = Vec::new();
    for a in before {
        let Some(&b) = after_by_device.get(&a.summary.device) else {
            continue;
        };
        let (sa, sb) = (&a.summary, &b.summary);
        let steps = sa
            .steps
            .steps()
            .iter()
            .zip(sb.steps.steps())
            .enumerate()
            .map(|(index, (x, y))| StepDelta {
                index,
                before_peak_bytes: x.peak_bytes,
                after_peak_bytes: y.peak_bytes,
                delta_peak_bytes: delta(x.peak_bytes, y.peak_bytes),
                delta_start_bytes: delta(x.before_bytes, y.before_bytes),
            })
            .collect();
        let mut sites: Vec<SiteDelta> = a
            .sites
            .keys()
            .chain(b.sites.keys().filter(|k| !a.sites.contains_key(*k)))
            .map(|k| {
                let (pa, ta) = a.sites.get(k).copied().unwrap_or_default();
                let (pb, tb) = b.sites.get(k).copied().unwrap_or_default();
                SiteDelta {
                    site: k.clone(),
                    before_bytes_at_peak: pa,
                    after_bytes_at_peak: pb,
                    delta_bytes_at_peak: delta(pa, pb),
                    delta_total_bytes: delta(ta, tb),
                }
            })
            .filter(|d| d.delta_bytes_at_peak != 0 || d.delta_total_bytes != 0)
            .collect();
        sites.sort_by(|x, y| {
            (y.delta_bytes_at_peak, y.delta_total_bytes)
                .cmp(&(x.delta_bytes_at_peak, x.delta_total_bytes))
                .then_with(|| x.site.cmp(&y.site))
        });
        let grew = sites
            .iter()
            .filter(|d| {
                d.delta_bytes_at_peak > 0 || (d.delta_bytes_at_peak == 0 && d.delta_total_bytes > 0)
            })
            .take(top)
            .cloned()
            .collect();
        let shrank = sites
            .iter()
            .rev()
            .filter(|d| {
                d.delta_bytes_at_peak < 0 || (d.delta_bytes_at_peak == 0 && d.delta_total_bytes < 0)
            })
            .take(top)
            .cloned()
            .collect();
        let delta_peak_bytes = delta(sa.peak.bytes, sb.peak.bytes);
        out.push(DeviceDiff {
            device: sa.device,
            before_peak_bytes: sa.peak.bytes,
            after_peak_bytes: sb.peak.bytes,
            delta_peak_bytes,
            delta_peak_percent: (sa.peak.bytes > 0)
                .then(|| delta_peak_bytes as f64 / sa.peak.bytes as f64 * 100.0),
            before_steps: sa.steps.len(),
            after_steps: sb.steps.len(),
            steps,
            grew,
            shrank,
        });
    }
    out
}

/// One rank (file) of a multi-GPU job: its busiest device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankRow {
    pub file: String,
    pub device: i64,
    pub peak_bytes: u64,
    pub peak_event: u32,
    pub peak_time_us: Option<i64>,
    pub steps: usize,
    pub step_duration_us: Option<i64>,
    pub drift_bytes_per_step: f64,
    pub leak_suspected: bool,
}

impl RankRow {
    /// The row of a file from its busiest device (`None` if it has no device). O(devices).
    pub fn from_summary(file: String, devices: &[DeviceSummary]) -> Option<RankRow> {
        let d = devices.iter().max_by_key(|d| (d.peak.bytes, -d.device))?;
        Some(RankRow {
            file,
            device: d.device,
            peak_bytes: d.peak.bytes,
            peak_event: d.peak.event,
            peak_time_us: d.peak.time_us,
            steps: d.steps.len(),
            step_duration_us: d.step_duration_us,
            drift_bytes_per_step: d.drift_bytes_per_step,
            leak_suspected: d.leak_suspected,
        })
    }
}

/// Spread across ranks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Skew {
    pub ranks: usize,
    pub min_peak_bytes: u64,
    pub max_peak_bytes: u64,
    pub peak_spread_bytes: u64,
    /// `(max - min) / max × 100`.
    pub peak_spread_percent: f64,
    pub max_peak_file: String,
    /// Spread of the median step duration, when every rank has one.
    pub step_duration_spread_us: Option<i64>,
}

impl Skew {
    /// The spread of the rows (`None` without rows). O(rows).
    pub fn of(rows: &[RankRow]) -> Option<Skew> {
        let max = rows.iter().max_by_key(|r| r.peak_bytes)?;
        let min = rows.iter().min_by_key(|r| r.peak_bytes)?;
        let spread = max.peak_bytes - min.peak_bytes;
        let durations: Option<Vec<i64>> = rows.iter().map(|r| r.step_duration_us).collect();
        Some(Skew {
            ranks: rows.len(),
            min_peak_bytes: min.peak_bytes,
            max_peak_bytes: max.peak_bytes,
            peak_spread_bytes: spread,
            peak_spread_percent: if max.peak_bytes > 0 {
                spread as f64 / max.peak_bytes as f64 * 100.0
            } else {
                0.0
            },
            max_peak_file: max.file.clone(),
            step_duration_spread_us: durations
                .and_then(|d| Some(d.iter().max()? - d.iter().min()?)),
        })
    }
}
