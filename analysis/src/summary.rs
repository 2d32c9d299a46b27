//! The per-file summary behind `memsnap summary`, `check`, `diff` and `ranks`, with its JSON
//! schema.
//!
//! # JSON schema (`memsnap summary --json`, `"schema": "memsnap.summary/1"`)
//!
//! ```text
//! {
//!   "schema": "memsnap.summary/1",
//!   "devices": [{
//!     "device": 0,                      // CUDA ordinal
//!     "entries": N,                     // trace entries
//!     "has_time": bool,                 // the trace has time_us
//!     "start_time_us": T|null,          // time of the first event
//!     "allocations": N,                 // allocation intervals (incl. before the window)
//!     "peak": {"bytes": N, "event": I, "time_us": T|null},   // active curve (alloc to free_completed)
//!     "peak_allocated_bytes": N,        // frees counted at free_requested instead
//!     "peak_reserved_bytes": N, "reserved_known": B, "allocated_known": B,
//!     "final_bytes": N, "final_reserved_bytes": N,
//!     "peak_top_sites": [{"site": "file:line:function", "bytes": N, "count": N}],
//!     "categories_at_peak": {"parameter": B, "optimizer_state": B, "gradient": B,
//!                            "activation": B, "temporary": B, "unknown": B,
//!                            "input": B, "autograd_detail": B},  // these two: only when > 0
//!     "modules_at_peak": [{"module": "blocks.3.attn" | "model.py:212 > model.py:54"
//!                                    | "<no module>", "bytes": N,  // paths: modules=True
//!                          "categories": {"activation": B, ...}}],  // [] without user modules
//!     "categories_source": "export_memory_timeline" | null,  // null: inferred from phases
//!     "peak_phase": {"step": I|null, "kind": "forward"|...} | null,  // null: peak outside phases
//!     "step_method": "stacks" | "annotations:<name>" | "curve_shape" | "none",
//!     "step_method_reason": "..." | null,   // why better evidence was not used, e.g.
//!                                       // "stack labels incoherent: 41% of the allocations
//!                                       // while memory rises (forward) carry backward frames"
//!     "setup_phase": PHASE | null,      // model construction/loading before the first step
//!     "steps": [{"start_event", "peak_event", "end_event",
//!                "before_bytes",                   // live bytes before its first event
//!                "start_bytes", "peak_bytes", "end_bytes", "min_bytes",  // after those events
//!                "start_time_us", "peak_time_us", "end_time_us",          // null without times
//!                "forward_bytes", "forward_events", "forward_duration_us",
//!                "forward_bytes_per_s", "forward_bytes_per_event",      // bytes_per_s: null without times
//!                "backward_bytes", "backward_events", "backward_duration_us",
//!                "backward_bytes_per_s", "backward_bytes_per_event",   // release rate, positive
//!                "outliving_bytes", "outliving_count",
//!                "phases": [PHASE],                // in order, tiling the step
//!                "partial": bool,                  // the window misses the step's start
//!                "warmup": bool, "optimizer_state_bytes": B}],   // warm-up: creates optimizer state
//!     "step_duration_us": T|null,       // median step duration
//!     "drift_bytes_per_step": D,        // Theil–Sen slope of the step minimum
//!     "peak_drift_bytes_per_step": D,
//!     "drift_percent": P,               // minimum growth over the steps, % of the top peak
//!     "peak_drift_percent": P,
//!     "leak_suspected": bool, "peak_growth_suspected": bool, "drift_tolerance_percent": P,
//!     "leaking_sites": [{"site": "file:line:function" | "<no stack>",  // crate::leaks, at most
//!                        "steps": N, "first_step": I, "last_step": I,  // top_sites of them,
//!                        "allocations": N, "bytes": B,        // most bytes held at the end first:
//!                        "bytes_per_step": B,                 // what steps made and still hold
//!                        "before_window_allocations": N, "before_window_bytes": B}],
//!     "before_window_bytes": B,         // live before event 0 (frees without alloc + untraced blocks)
//!     "before_window_allocations": N,
//!     "live_in_segments_bytes": B,      // of which: blocks only the final segments show
//!     "dropped_entries": N|null,        // ring-buffer drops, when the file records them
//!     "truncated": bool,
//!     "oom_events": [I],
//!     "notes": ["..."]                  // truncation and anomaly notes, human-readable
//!   }]
//! }
//! PHASE = {"kind": "setup"|"forward"|"backward"|"optimizer",
//!          "start_event", "end_event",        // inclusive trace indices
//!          "start_bytes",                     // live bytes before its first event
//!          "end_bytes", "peak_bytes", "peak_event", "start_time_us", "end_time_us",
//!          "bytes",                           // end_bytes - start_bytes
//!          "events", "duration_us", "bytes_per_s", "bytes_per_event",
//!          "allocations", "allocated_bytes",  // made in the phase
//!          "categories_at_peak": {...}}       // live bytes by category at the phase's peak
//! ```
//! Bytes are the trace's sizes (what callers requested), live from `alloc` to
//! `free_completed` as in PyTorch's Active Memory Timeline, counting memory from before the
//! window. Event indices are positions in the device trace; a step runs from its first event
//! to its last (inclusive), and "bytes at an event" means right after it.

use std::sync::Arc;

use memsnap_format::Snapshot;
use serde::Serialize;

use crate::categories::{Category, CategoryBytes};
use crate::curve::CurveKind;
use crate::error::Result;
use crate::leaks::{leaking_sites, LeakingSite};
use crate::phases::Phase;
use crate::sites::GroupBy;
use crate::steps::{Step, StepAnalysis, StepOptions};
use crate::timeline::{DeviceTimeline, Peak};

/// Schema tag of [`Summary`].
pub const SUMMARY_SCHEMA: &str = "memsnap.summary/1";

/// Options for [`summarize`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SummaryOptions {
    pub steps: StepOptions,
    /// Number of sites listed at the peak.
    pub top_sites: usize,
    /// Grouping of those sites.
    pub group_by: GroupBy,
    /// Whether each step phase gets the live bytes by category at its peak (one sweep over
    /// the allocations; 64 bytes a phase, 58 MB for a run of 303,030 steps). Without them
    /// the phases' categories read as empty ([`StepSummary::phases`] gives zero bytes):
    /// for callers that never show them (the viewer's profile, which ranks and compares
    /// devices and runs by their peaks, steps and sites).
    pub phase_categories: bool,
}

impl Default for SummaryOptions {
    fn default() -> Self {
        SummaryOptions {
            steps: StepOptions::default(),
            top_sites: 10,
            group_by: GroupBy::Frame,
            phase_categories: true,
        }
    }
}

/// A site at the peak.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteBytes {
    pub site: String,
    pub bytes: u64,
    pub count: u64,
}

/// The summary's steps: the steps as found, and the live bytes by category at each of their
/// phases' peaks.
///
/// Kept as the found steps (moved in, not copied) beside one flat array of categories in phase
/// order. A run of 303,030 steps rebuilt every step's phases with their categories: 276 MB
/// more at the summary's peak (`memsnap summary` on a 10M-entry run, issue 22).
///
/// Written to JSON as an array of steps ([`StepSummary`]).
#[derive(Clone, Debug, Default)]
pub struct StepSummaries {
    steps: StepList,
    /// Categories at each step phase's peak, the steps' phases one after the other.
    phase_categories: Vec<CategoryBytes>,
    /// Where each step's phases begin in `phase_categories`.
    first_phase: Vec<usize>,
}

impl StepSummaries {
    /// `phase_categories[first..]` holds one entry per phase of `steps`, in order (missing
    /// ones read as zero bytes).
    fn new(steps: StepList, phase_categories: Vec<CategoryBytes>, first: usize) -> Self {
        let mut first_phase = Vec::with_capacity(steps.len());
        let mut next = first;
        for step in steps.iter() {
            first_phase.push(next);
            next += step.phases.len();
        }
        StepSummaries {
            steps,
            phase_categories,
            first_phase,
        }
    }

    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Step `index` (as numbered in the summary) with its phases' categories.
    pub fn get(&self, index: usize) -> Option<StepSummary<'_>> {
        let step = self.steps.get(index)?;
        let first = self.first_phase[index];
        let categories = self
            .phase_categories
            .get(first..(first + step.phases.len()).min(self.phase_categories.len()))
            .unwrap_or(&[]);
        Some(StepSummary { step, categories })
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = StepSummary<'_>> + '_ {
        (0..self.steps.len()).map(|i| self.get(i).expect("an index below len"))
    }

    /// The steps as found, without the categories.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }
}

impl PartialEq for StepSummaries {
    fn eq(&self, other: &Self) -> bool {
        self.steps() == other.steps()
            && self.phase_categories == other.phase_categories
            && self.first_phase == other.first_phase
    }
}

/// A summary's steps: its own, or the step analysis it was given, shared (the viewer keeps
/// the analysis; a copy was 211 MB for a run of 303,030 steps).
#[derive(Clone, Debug)]
enum StepList {
    Owned(Vec<Step>),
    Shared(Arc<StepAnalysis>),
}

impl Default for StepList {
    fn default() -> Self {
        StepList::Owned(Vec::new())
    }
}

impl std::ops::Deref for StepList {
    type Target = [Step];

    fn deref(&self) -> &[Step] {
        match self {
            StepList::Owned(steps) => steps,
            StepList::Shared(analysis) => &analysis.steps,
        }
    }
}

impl Serialize for StepSummaries {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

/// One step in the summary: the step as found, its phases with their categories.
///
/// Written to JSON flat, as schema `memsnap.summary/1` has it: the step's fields, its
/// forward and backward slopes as `forward_bytes`, `forward_events`, ... `backward_...`,
/// then `phases`, `partial`, `warmup`, `optimizer_state_bytes`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepSummary<'a> {
    /// The step, its phases in order (they tile the step).
    pub step: &'a Step,
    categories: &'a [CategoryBytes],
}

impl<'a> StepSummary<'a> {
    /// The step's phases in order, each with the live bytes by category at its peak.
    pub fn phases(&self) -> impl ExactSizeIterator<Item = PhaseSummaryRef<'a>> + 'a {
        let categories = self.categories;
        self.step
            .phases
            .iter()
            .enumerate()
            .map(move |(i, phase)| PhaseSummaryRef {
                phase,
                categories_at_peak: categories.get(i).unwrap_or(&NO_CATEGORIES),
            })
    }
}

static NO_CATEGORIES: CategoryBytes = CategoryBytes([0; 8]);

/// A step's phase in the summary, borrowed from [`StepSummaries`]; written to JSON as
/// [`PhaseSummary`] is.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PhaseSummaryRef<'a> {
    #[serde(flatten)]
    pub phase: &'a Phase,
    #[serde(serialize_with = "category_bytes_ref_as_map")]
    pub categories_at_peak: &'a CategoryBytes,
}

/// A step's phases, written as an array of [`PhaseSummaryRef`].
struct PhasesOf<'a>(StepSummary<'a>);

impl Serialize for PhasesOf<'_> {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.phases())
    }
}

impl Serialize for StepSummary<'_> {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let s = self.step;
        let mut out = serializer.serialize_struct("StepSummary", 26)?;
        out.serialize_field("start_event", &s.start_event)?;
        out.serialize_field("peak_event", &s.peak_event)?;
        out.serialize_field("end_event", &s.end_event)?;
        out.serialize_field("before_bytes", &s.before_bytes)?;
        out.serialize_field("start_bytes", &s.start_bytes)?;
        out.serialize_field("peak_bytes", &s.peak_bytes)?;
        out.serialize_field("end_bytes", &s.end_bytes)?;
        out.serialize_field("min_bytes", &s.min_bytes)?;
        out.serialize_field("start_time_us", &s.start_time_us)?;
        out.serialize_field("peak_time_us", &s.peak_time_us)?;
        out.serialize_field("end_time_us", &s.end_time_us)?;
        // The slopes flat, under static field names (serde wants them).
        const SLOPE_FIELDS: [[&str; 5]; 2] = [
            [
                "forward_bytes",
                "forward_events",
                "forward_duration_us",
                "forward_bytes_per_s",
                "forward_bytes_per_event",
            ],
            [
                "backward_bytes",
                "backward_events",
                "backward_duration_us",
                "backward_bytes_per_s",
                "backward_bytes_per_event",
            ],
        ];
        for (slope, [bytes, events, duration, per_s, per_event]) in
            [s.forward(), s.backward()].into_iter().zip(SLOPE_FIELDS)
        {
            out.serialize_field(bytes, &slope.bytes)?;
            out.serialize_field(events, &slope.events)?;
            out.serialize_field(duration, &slope.duration_us)?;
            out.serialize_field(per_s, &slope.bytes_per_s)?;
            out.serialize_field(per_event, &slope.bytes_per_event)?;
        }
        out.serialize_field("outliving_bytes", &s.outliving_bytes)?;
        out.serialize_field("outliving_count", &s.outliving_count)?;
        out.serialize_field("phases", &PhasesOf(*self))?;
        out.serialize_field("partial", &s.partial)?;
        out.serialize_field("warmup", &s.warmup)?;
        out.serialize_field("optimizer_state_bytes", &s.optimizer_state_bytes)?;
        out.end()
    }
}

/// One phase of a step (or the set-up before the first step): the phase's own fields
/// (flattened: `kind`, `start_event`, `end_event`, `start_bytes`, `end_bytes`, `bytes_per_s`,
/// ...) and the live bytes by category at its peak.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhaseSummary {
    #[serde(flatten)]
    pub phase: Phase,
    /// Live bytes by category at the phase's peak, written as the device's map is (by
    /// category name). Kept as the array: a long run has hundreds of thousands of phases, and
    /// a map of names each took about 700 bytes (140 MB at 10M entries).
    #[serde(serialize_with = "category_bytes_as_map")]
    pub categories_at_peak: CategoryBytes,
}

fn category_bytes_ref_as_map<S: serde::Serializer>(
    bytes: &&CategoryBytes,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    category_bytes_as_map(bytes, serializer)
}

fn category_bytes_as_map<S: serde::Serializer>(
    bytes: &CategoryBytes,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    let mut by_name: Vec<(&str, u64)> = Category::ALL
        .iter()
        .filter(|&&c| !c.is_pytorch_only() || bytes.get(c) > 0)
        .map(|&c| (c.name(), bytes.get(c)))
        .collect();
    by_name.sort_unstable_by_key(|&(name, _)| name);
    serializer.collect_map(by_name)
}

/// Where the device's peak falls.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeakPhase {
    /// Index into `steps`; `null` for the set-up.
    pub step: Option<usize>,
    pub kind: String,
}

fn category_map(bytes: &CategoryBytes) -> std::collections::BTreeMap<String, u64> {
    Category::ALL
        .iter()
        .filter(|&&c| !c.is_pytorch_only() || bytes.get(c) > 0)
        .map(|&c| (c.name().to_string(), bytes.get(c)))
        .collect()
}

fn phase_summary(p: &Phase, categories: &CategoryBytes) -> PhaseSummary {
    PhaseSummary {
        phase: p.clone(),
        categories_at_peak: *categories,
    }
}

/// Bytes live at the peak under one module call chain.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModuleBytes {
    /// `model.py:212 > model.py:54`, or `<no module>`.
    pub module: String,
    pub bytes: u64,
    /// By category name, as `categories_at_peak` (categories with no bytes left out).
    pub categories: std::collections::BTreeMap<String, u64>,
}

/// The summary of one device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceSummary {
    pub device: i64,
    pub entries: u32,
    pub has_time: bool,
    /// `time_us` of the first event.
    pub start_time_us: Option<i64>,
    pub allocations: u64,
    pub peak: Peak,
    /// Peak of the allocated curve (frees counted at `free_requested`).
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// `false` for an import whose source records no reserved memory (`export_memory_timeline`
    /// data): the reserved numbers are then 0 because nothing is known, not because nothing
    /// was reserved.
    pub reserved_known: bool,
    /// `false` for an import whose source sees only the driver's allocations (rocprofv3): the
    /// blocks and the peak are reserved memory, and the allocated (tensor) bytes are unknown.
    pub allocated_known: bool,
    pub final_bytes: u64,
    pub final_reserved_bytes: u64,
    pub peak_top_sites: Vec<SiteBytes>,
    pub step_method: String,
    /// Why the steps do not come from better evidence (stacks that contradict the curve);
    /// `None` when the best evidence the file has was used.
    pub step_method_reason: Option<String>,
    /// The set-up before the first step (model construction or loading), when seen.
    pub setup_phase: Option<PhaseSummary>,
    pub steps: StepSummaries,
    /// The phase the peak falls in.
    pub peak_phase: Option<PeakPhase>,
    /// Live bytes by category at the peak: `parameter`, `optimizer_state`, `gradient`,
    /// `activation`, `temporary`, `unknown` (and `input`, `autograd_detail` when the source
    /// gave them).
    pub categories_at_peak: std::collections::BTreeMap<String, u64>,
    /// Live bytes at the peak by module call chain (`memsnap_analysis::modules`), biggest
    /// first (at most [`SummaryOptions::top_sites`]), each split by category; empty when no
    /// allocation live at the peak was made inside a user module.
    pub modules_at_peak: Vec<ModuleBytes>,
    /// Where the categories come from: the import's source (`export_memory_timeline`) when it
    /// gave them, `None` when memsnap inferred them from the phases.
    pub categories_source: Option<String>,
    pub step_duration_us: Option<i64>,
    pub drift_bytes_per_step: f64,
    pub peak_drift_bytes_per_step: f64,
    pub drift_percent: f64,
    pub peak_drift_percent: f64,
    pub leak_suspected: bool,
    pub peak_growth_suspected: bool,
    pub drift_tolerance_percent: f64,
    /// The code that keeps memory step after step ([`crate::leaks`]), most bytes held at the
    /// end first (at most [`SummaryOptions::top_sites`]; their allocation lists left out).
    pub leaking_sites: Vec<LeakingSite>,
    pub before_window_bytes: u64,
    pub before_window_allocations: u64,
    pub live_in_segments_bytes: u64,
    pub dropped_entries: Option<u64>,
    pub truncated: bool,
    pub oom_events: Vec<u32>,
    pub notes: Vec<String>,
}

/// The summary of a snapshot.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub schema: &'static str,
    pub devices: Vec<DeviceSummary>,
}

impl Summary {
    /// The device with the highest allocated peak.
    pub fn busiest(&self) -> Option<&DeviceSummary> {
        self.devices
            .iter()
            .max_by_key(|d| (d.peak.bytes, -d.device))
    }
}

/// Summarises every device that has a trace or segments.
///
/// O(n log n) per device for n trace entries: [`DeviceTimeline::build`] and
/// [`summarize_device`].
pub fn summarize(snapshot: &Snapshot, options: &SummaryOptions) -> Result<Summary> {
    let devices = DeviceTimeline::devices(snapshot)
        .into_iter()
        .map(|d| {
            let timeline = DeviceTimeline::build(snapshot, d)?;
            Ok(summarize_device(snapshot, &timeline, options))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Summary {
        schema: SUMMARY_SCHEMA,
        devices,
    })
}

/// [`summarize`] for a caller done with the snapshot (`memsnap summary`): the same answer,
/// each device's timeline built by [`DeviceTimeline::build_releasing`], which drops the
/// device's trace entries once they are replayed and the annotations once the last
/// device's named ranges are made. Nothing after reads them (the timeline holds the replay,
/// the curves, the time axis and the named ranges; sites and modules read the stack and
/// frame tables), and they are the largest part of the snapshot: 48 bytes an entry (480 MB
/// of a 10M-entry run) and some 330 bytes an annotation, held until now beside the curves,
/// the steps and their categories.
///
/// O(n log n) per device for n trace entries, as [`summarize`].
pub fn summarize_owned(mut snapshot: Snapshot, options: &SummaryOptions) -> Result<Summary> {
    let devices = DeviceTimeline::devices(&snapshot);
    let mut summaries = Vec::with_capacity(devices.len());
    for (k, &device) in devices.iter().enumerate() {
        let last = k + 1 == devices.len();
        let timeline = DeviceTimeline::build_releasing(&mut snapshot, device, last)?;
        summaries.push(summarize_device(&snapshot, &timeline, options));
    }
    Ok(Summary {
        schema: SUMMARY_SCHEMA,
        devices: summaries,
    })
}

/// Summarises one device from its timeline.
///
/// O(n log n) for n entries: the steps ([`crate::steps::find_steps`]), then
/// [`summarize_device_with_steps`].
pub fn summarize_device(
    snapshot: &Snapshot,
    timeline: &DeviceTimeline,
    options: &SummaryOptions,
) -> DeviceSummary {
    let analysis = timeline.steps(&options.steps);
    summarize_device_from(snapshot, timeline, options, Arc::new(analysis))
}

/// [`summarize_device`] with the steps already found (`timeline.steps(&options.steps)`): a
/// viewer that has them does not find them again (at 10M entries that is 0.4 s and its
/// per-allocation vectors).
///
/// The summary's steps are `analysis`'s, shared, not copied.
///
/// O(n log n + p log p) for n allocations and p phases: the top sites are one grouping pass,
/// the categories at the peak and at every phase's peak one sorted sweep.
pub fn summarize_device_with_steps(
    snapshot: &Snapshot,
    timeline: &DeviceTimeline,
    options: &SummaryOptions,
    analysis: Arc<StepAnalysis>,
) -> DeviceSummary {
    summarize_device_from(snapshot, timeline, options, analysis)
}

/// Both of the above: steps only the summary holds are moved into it (a run of 300,000
/// steps kept them twice), shared ones shared.
fn summarize_device_from(
    snapshot: &Snapshot,
    timeline: &DeviceTimeline,
    options: &SummaryOptions,
    analysis: Arc<StepAnalysis>,
) -> DeviceSummary {
    let replay = timeline.replay();
    let curves = timeline.curves();
    let peak = timeline.peak(CurveKind::Active);
    let peak_top_sites = timeline
        .top_sites(snapshot, options.group_by)
        .into_iter()
        .filter(|s| s.bytes_at_peak > 0)
        .take(options.top_sites)
        .map(|s| SiteBytes {
            site: s.key.label(snapshot),
            bytes: s.bytes_at_peak,
            count: s.count_at_peak,
        })
        .collect();
    // One sweep answers every phase's category query (their peaks come in order), one more
    // the device's peak.
    let by_phase = if options.phase_categories {
        let phase_peaks: Vec<u32> = analysis.phases().map(|(_, p)| p.peak_event).collect();
        analysis.categories_at(replay, &phase_peaks)
    } else {
        Vec::new()
    };
    // A peak before the first event (the window only frees) is the memory from before it.
    let peak_categories = if curves.active.at(peak.event) == peak.bytes {
        analysis.categories_at(replay, &[peak.event])[0]
    } else {
        analysis.categories_before_window(replay)
    };
    let modules = crate::modules::modules_at(snapshot, timeline, &analysis.categories, peak.event);
    let modules_at_peak = if modules
        .iter()
        .any(|m| m.module != crate::modules::NO_MODULE)
    {
        modules
            .iter()
            .take(options.top_sites)
            .map(|m| ModuleBytes {
                module: m.module.clone(),
                bytes: m.bytes,
                categories: m
                    .categories
                    .iter()
                    .filter(|(_, b)| *b > 0)
                    .map(|(c, b)| (c.name().to_string(), b))
                    .collect(),
            })
            .collect()
    } else {
        Vec::new()
    };
    let setup_phase = analysis
        .setup
        .as_ref()
        .map(|p| phase_summary(p, by_phase.first().unwrap_or(&CategoryBytes::default())));
    let mut durations: Vec<i64> = analysis
        .steps
        .iter()
        .filter_map(|s| Some(s.end_time_us? - s.start_time_us?))
        .collect();
    durations.sort_unstable();
    let step_duration_us = durations.get(durations.len() / 2).copied();

    let mut notes = Vec::new();
    if replay.before_window_allocations > 0 {
        notes.push(format!(
            "{} bytes in {} allocations existed before the trace window ({} bytes only known from the final segments)",
            replay.before_window_bytes, replay.before_window_allocations, replay.live_in_segments_bytes
        ));
    }
    if replay.unattributed_bytes > 0 {
        notes.push(format!(
            "{} bytes of them before the profile, unattributed: counted by the source ({}), in no block it recorded",
            replay.unattributed_bytes,
            replay.source.as_deref().unwrap_or("the import")
        ));
    }
    if let Some(d) = replay.dropped_entries.filter(|&d| d > 0) {
        notes.push(format!("the ring buffer dropped {d} older trace entries"));
    }
    if replay.trace_len == 0 {
        notes.push("no trace entries: only the final segment state is known".into());
    }
    if replay.anomaly_count > 0 {
        notes.push(format!(
            "{} inconsistent trace entries were accounted for (first: event {}: {})",
            replay.anomaly_count,
            replay.anomalies.first().map_or(0, |a| a.event),
            replay.anomalies.first().map_or("", |a| a.what.as_str())
        ));
    }
    if analysis.steps.is_empty() && replay.trace_len > 0 {
        notes.push("no training steps found".into());
    }
    for s in analysis.steps.iter().filter(|s| s.warmup) {
        notes.push(format!(
            "step {} is a warm-up step: it creates {} of optimizer state, which stays (not a leak)",
            s.index,
            memsnap_units::format_size(s.optimizer_state_bytes)
        ));
    }
    let mut leaking = leaking_sites(snapshot, replay, &analysis.steps);
    leaking.truncate(options.top_sites);
    for site in &mut leaking {
        site.kept = Vec::new();
        site.before_window = Vec::new();
    }
    let peak_phase = analysis.phase_at(peak.event).map(|(step, p)| PeakPhase {
        step,
        kind: p.kind.name().to_string(),
    });
    let step_method = analysis.method.label();
    let step_method_reason = analysis.fallback_reason.clone();
    let drift = analysis.drift.clone();
    // Last: the steps leave the analysis (moved when it is owned).
    let found = match Arc::try_unwrap(analysis) {
        Ok(a) => StepList::Owned(a.steps),
        Err(shared) => StepList::Shared(shared),
    };
    // The categories of the steps' phases follow the set-up's.
    let first_step_phase = usize::from(setup_phase.is_some());
    let steps = StepSummaries::new(found, by_phase, first_step_phase);
    DeviceSummary {
        device: replay.device,
        entries: replay.trace_len,
        has_time: timeline.time().has_time(),
        start_time_us: timeline.time().time_of(0),
        allocations: replay.allocations.len() as u64,
        peak,
        peak_allocated_bytes: curves.allocated.max().0,
        peak_reserved_bytes: curves.reserved.max().0,
        allocated_known: replay.allocated_known,
        reserved_known: replay.reserved_known(),
        final_bytes: curves.active.at(replay.axis_len() - 1),
        final_reserved_bytes: curves.reserved.at(replay.axis_len() - 1),
        peak_top_sites,
        step_method,
        step_method_reason,
        setup_phase,
        steps,
        peak_phase,
        categories_at_peak: category_map(&peak_categories),
        modules_at_peak,
        categories_source: replay.categories_source.clone(),
        step_duration_us,
        drift_bytes_per_step: drift.min_bytes_per_step,
        peak_drift_bytes_per_step: drift.peak_bytes_per_step,
        drift_percent: drift.min_growth_percent,
        peak_drift_percent: drift.peak_growth_percent,
        leak_suspected: drift.leak_suspected,
        peak_growth_suspected: drift.peak_growth_suspected,
        drift_tolerance_percent: drift.tolerance_percent,
        leaking_sites: leaking,
        before_window_bytes: replay.before_window_bytes,
        before_window_allocations: replay.before_window_allocations,
        live_in_segments_bytes: replay.live_in_segments_bytes,
        dropped_entries: replay.dropped_entries,
        truncated: replay.truncated,
        oom_events: replay.oom_events.clone(),
        notes,
    }
}
