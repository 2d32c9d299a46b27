//! # memsnap-advise
//!
//! What would make a training run fit in a memory budget: concrete fixes, each predicted by
//! **editing the recorded trace the way the fix would change the run and replaying the edited
//! trace through memsnap's allocator** ([`memsnap_simulate::simulate`]: rounding, pools,
//! splitting, segment decisions and fragmentation included), never by arithmetic on totals.
//!
//! The fixes ([`Fix`]):
//!
//! - **activation checkpointing** of a module node ([`node`]: a pattern over the module paths
//!   a run recorded with `memsnap.torch.enable(modules=True)`, such as `blocks.*`, or without
//!   them a module call chain prefix from [`memsnap_analysis::modules`], such as every block
//!   the model's loop calls), or of a range of its calls (`blocks.0` to `blocks.2`): its
//!   activations are freed after each call's forward and made again at the start of the
//!   call's backward, with the transients the call made (the recomputation); the extra
//!   forward work is reported as a fraction (by bytes the forward allocates);
//! - **micro-batches** with gradient accumulation: the forward and backward run N times on
//!   `1/N` of the batch (what they make and release divided by N), the gradients once;
//! - **optimizer state** in 8 bits (25 % of fp32 Adam's state) or offloaded (0 %), the
//!   state made before a ring buffer's window included (taken out of the start state and made
//!   again, smaller, before the window's first event);
//! - **allocator settings** (`PYTORCH_CUDA_ALLOC_CONF`), replayed as `simulate --suggest` does;
//! - **stopping a leak**: what a leaking site ([`memsnap_analysis::leaks`]: code whose
//!   allocations, made step after step, are still held when the window ends) keeps is freed at
//!   the end of the step that made it, and its memory from before the window is gone: the run
//!   as it would be if that code dropped the tensor (kept `loss.item()`, not `loss`). A
//!   week-long run that runs out of memory on the fifth day is most often this, and no
//!   checkpointing or micro-batching fixes it;
//! - **combinations**: when no single fix fits the budget, the best one is combined with the
//!   best of each other kind, one at a time, until the budget fits.
//!
//! [`edit`] says exactly how each fix edits the trace. A run that ran out of memory is first
//! completed ([`complete`]): the step that failed is finished the way an earlier step went, so
//! that fixes are judged on whole steps. The crate sits on floor 4: it needs the
//! analysis (floor 3: categories, phases, module chains) to know what to edit and the simulator
//! (floor 2) to replay the result, and neither of those may name the other.
//!
//! Complexity: one analysis of the device (`DeviceTimeline::build`, the steps), then per
//! prediction one edit (O(n + m)) and one replay (O(n log s) in the trace's entries and the
//! allocator's free blocks); about 15 predictions without a budget, at most 40 with one,
//! [`Options::jobs`] of them at a time. Each replay reads the edited trace beside the
//! snapshot ([`memsnap_simulate::replay_trace`]): only stopping a leak, and shrinking
//! optimizer state made before the window, copy the snapshot (the start state changes).

pub mod complete;
pub mod edit;
pub mod node;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use memsnap_analysis::modules::{chain_label, ModuleKeyer};
use memsnap_analysis::{Category, CurveKind, DeviceTimeline, LeakingSite, Lifetime, StepOptions};
use memsnap_format::{Action, FrameId, Snapshot};
use memsnap_simulate::{replay_trace, settings, Options as SimOptions};
use serde::Serialize;

pub use complete::Completion;
pub use edit::Edit;
pub use node::ModuleNode;

/// Why advice could not be given.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdviseError {
    #[error("{0}")]
    Analysis(#[from] memsnap_analysis::AnalysisError),
    #[error("{0}")]
    Simulate(#[from] memsnap_simulate::SimulateError),
    #[error("allocator settings {conf:?}: {source}")]
    Config {
        conf: String,
        #[source]
        source: memsnap_recorder::ConfigError,
    },
    #[error("the snapshot has no device with a trace to edit")]
    NoTrace,
}

pub type Result<T, E = AdviseError> = std::result::Result<T, E>;

/// What to advise on.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Memory the run must fit in (reserved bytes); `None`: rank by reserved peak only, or
    /// see `device_memory_budget`.
    pub budget: Option<u64>,
    /// Without `budget`, take the device's memory the file states (an OOM file's, see
    /// [`memsnap_simulate::device_memory`]) as the budget: the run has to fit the GPU it
    /// ran out of.
    pub device_memory_budget: bool,
    /// Device; `None`: the one with the highest peak.
    pub device: Option<i64>,
    /// Replays run at once; `None`: one per core, at most [`MAX_JOBS`].
    pub jobs: Option<usize>,
}

/// The most replays [`advise`] runs at once when [`Options::jobs`] does not say. Each one
/// holds its own edited copy of the trace and its own allocator state (about 1 GB for a
/// 10M-entry trace: the week-long run of the benchmarks takes 3.6 GB with one, 4.6 GB with
/// two), so more cores would buy a little time for a lot of memory.
pub const MAX_JOBS: usize = 4;

/// One change to the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fix {
    /// Activation checkpointing of the calls of a module node.
    Checkpoint {
        /// The node's label: its pattern (`blocks.*`) or its chain (`model.py:212`, see
        /// [`chain_label`]).
        module: String,
        #[serde(skip)]
        node: ModuleNode,
        /// Only these calls of the node in each forward (first and last index, inclusive: the
        /// numbers at a named pattern's `*`, so `(0, 2)` of `blocks.*` is `blocks.0` to
        /// `blocks.2`; otherwise counting from 0 in event order); `None`: every call.
        calls: Option<(u32, u32)>,
    },
    /// Micro-batches per step with gradient accumulation.
    MicroBatches { count: u32 },
    /// Optimizer state in percent of the recorded (25: 8-bit; 0: offloaded).
    OptimizerState { percent: u8 },
    /// Allocator settings added to the file's.
    Allocator { alloc_conf: String },
    /// Stop keeping what leaking sites keep every step ([`memsnap_analysis::leaks`]).
    ReleaseKept {
        /// The sites' labels (`file:line:function`), as [`memsnap_analysis::LeakingSite::site`].
        sites: Vec<String>,
        /// What they keep per step, together.
        bytes_per_step: u64,
    },
}

impl Fix {
    /// What to change, in words.
    pub fn describe(&self) -> String {
        match self {
            Fix::Checkpoint {
                module,
                node: ModuleNode::Named(pattern),
                calls: Some((first, last)),
            } if pattern.contains('*') && first != last => format!(
                "checkpoint the activations of {} ({module})",
                self.touches().unwrap_or_default()
            ),
            Fix::Checkpoint { .. } => format!(
                "checkpoint the activations of {}",
                self.touches().unwrap_or_default()
            ),
            Fix::MicroBatches { count } => {
                format!("{count} micro-batches with gradient accumulation")
            }
            Fix::OptimizerState { percent: 0 } => "optimizer state offloaded to the host".into(),
            Fix::OptimizerState { percent: 25 } => "optimizer state in 8 bits".into(),
            Fix::OptimizerState { percent } => format!("optimizer state at {percent}%"),
            Fix::Allocator { alloc_conf } => format!("PYTORCH_CUDA_ALLOC_CONF={alloc_conf}"),
            Fix::ReleaseKept {
                sites,
                bytes_per_step,
            } => {
                let rate = memsnap_analysis::format_size(*bytes_per_step);
                match sites.as_slice() {
                    [one] => format!("stop keeping what {one} makes every step ({rate}/step)"),
                    _ => format!(
                        "stop keeping what {} sites make every step ({}; {rate}/step)",
                        sites.len(),
                        sites.join(", ")
                    ),
                }
            }
        }
    }

    /// The modules a checkpointing fix frees early and makes again, in words (`blocks.0 to
    /// blocks.2`, `calls 0-2 of model.py:212`, `blocks.*.mlp`); `None` for the other fixes.
    pub fn touches(&self) -> Option<String> {
        let Fix::Checkpoint {
            module,
            node,
            calls,
        } = self
        else {
            return None;
        };
        Some(match (node, calls) {
            (_, None) => module.clone(),
            (ModuleNode::Named(pattern), Some((first, last))) if pattern.contains('*') => {
                let (first, last) = (u64::from(*first), u64::from(*last));
                if first == last {
                    node::with_index(pattern, first)
                } else {
                    format!(
                        "{} to {}",
                        node::with_index(pattern, first),
                        node::with_index(pattern, last)
                    )
                }
            }
            (_, Some((first, last))) => format!("calls {first}-{last} of {module}"),
        })
    }

    /// Whether a checkpointing fix touches the module node `m` of [`Advice::modules`]: `m` is
    /// its node, or a named module it takes among its calls (`blocks.1` for `blocks.0` to
    /// `blocks.2`, and `blocks.1.mlp` for `blocks.*.mlp`).
    pub fn covers(&self, m: &ModuleBytes) -> bool {
        let Fix::Checkpoint { node, calls, .. } = self else {
            return false;
        };
        if *node == m.node {
            return true;
        }
        let (ModuleNode::Named(pattern), ModuleNode::Named(path)) = (node, &m.node) else {
            return false;
        };
        if path.contains('*') {
            return false;
        }
        match (node::match_path(pattern, path), calls) {
            (Some(Some(n)), Some((first, last))) => {
                (u64::from(*first)..=u64::from(*last)).contains(&n)
            }
            (Some(_), None) => true,
            _ => false,
        }
    }

    fn kind(&self) -> u8 {
        match self {
            Fix::Checkpoint { .. } => 0,
            Fix::MicroBatches { .. } => 1,
            Fix::OptimizerState { .. } => 2,
            Fix::Allocator { .. } => 3,
            Fix::ReleaseKept { .. } => 4,
        }
    }
}

/// A set of fixes and what the replay of the edited run predicts.
#[derive(Clone, Debug, Serialize)]
pub struct Prediction {
    pub fixes: Vec<Fix>,
    /// The fixes in words, joined with ` + `; `(as recorded)` for none.
    pub description: String,
    pub allocated_peak_bytes: u64,
    pub reserved_peak_bytes: u64,
    /// Whether the replay on a device of the budget's size ran to the end without running out
    /// of memory (the allocator releasing its cache under pressure, as the run's would) and
    /// its reserved peak is within the budget (memory reserved before a ring buffer's window
    /// is taken as it was: a window that starts above the budget never runs out of memory in
    /// the replay, yet does not fit); `None` without a budget. The peaks are those of that
    /// replay when it fits, else of a replay without the limit (what the run would need).
    pub fits: Option<bool>,
    /// The replay ran out of memory even without the budget's limit (on the device the file
    /// implies: an OOM file's own GPU, when the run could not be completed).
    pub out_of_memory: bool,
    /// Extra forward work of checkpointing, as a fraction of the forward (by bytes allocated).
    pub extra_forward_compute: f64,
    /// What the run's leaking sites ([`memsnap_analysis::leaks`]) that these fixes do not stop
    /// keep per step, together: a prediction that fits with a leak going on fits the recorded
    /// steps only.
    pub leak_bytes_per_step: u64,
    /// With a budget, a fit and a leak going on: the steps after the recorded ones until the
    /// leak has filled what the budget leaves above the reserved peak.
    pub steps_to_budget: Option<u64>,
}

/// A prediction's allocated and reserved curves on the **recorded** trace's event axis, for
/// drawing over the recorded timeline. The predicted run is a replay of an edited trace whose
/// entries differ from the recorded ones (checkpointing frees activations early and makes them
/// again, micro-batches repeat each step's forward and backward, an offloaded optimizer state
/// leaves entries out, a completed OOM run adds the rest of a step), so each replayed entry is
/// placed at the recorded entry it stands for ([`edit::Edited::origin`]; the completion's rest
/// at the `oom` entry). Several points can stand at one event (a recomputation, the copies of
/// a micro-batched step), so the curve is a set of points, not a function of the event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PredictedCurve {
    /// The recorded event each point stands at, one point per replayed entry of the edited
    /// trace in replay order.
    pub events: Vec<u32>,
    /// Allocated bytes after each point (blocks as the allocator rounds them).
    pub allocated: Vec<u64>,
    /// Reserved bytes after each point.
    pub reserved: Vec<u64>,
    /// The prediction's peaks ([`Prediction`]'s).
    pub allocated_peak_bytes: u64,
    pub reserved_peak_bytes: u64,
    /// The recorded alloc events of the allocations the fixes' checkpointing frees early and
    /// makes again (those made in the checkpointed calls), sorted; empty without
    /// checkpointing. What a picture marks as the modules the fix touches.
    pub checkpointed_events: Vec<u32>,
}

impl Prediction {
    /// The "fits" column of `memsnap advise` and the viewer: `OOM` when the replay ran out of
    /// memory even without the budget's limit, `yes`/`no` against the budget (`yes*`: the
    /// recorded steps fit, but a leak goes on, see [`Prediction::steps_to_budget`]), `-`
    /// without one.
    pub fn verdict(&self) -> &'static str {
        match (self.fits, self.out_of_memory) {
            (_, true) => "OOM",
            (Some(true), _) if self.leak_bytes_per_step > 0 => "yes*",
            (Some(true), _) => "yes",
            (Some(false), _) => "no",
            (None, _) => "-",
        }
    }

    /// For a `yes*` verdict: what the star means, in words.
    pub fn leak_note(&self) -> Option<String> {
        let steps = self.steps_to_budget?;
        Some(format!(
            "fits the recorded steps only: a leak of {}/step goes on and fills the budget {}",
            memsnap_analysis::format_size(self.leak_bytes_per_step),
            when_full(steps, steps)
        ))
    }
}

/// When a leak that goes on fills the budget, in words, from the fewest and the most
/// [`Prediction::steps_to_budget`] of some fixes (the steps that still fit after the recorded
/// ones; the budget fills in the one after them): "in the next step", "within 4 more steps",
/// "within 1 to 4 more steps".
pub fn when_full(fewest: u64, most: u64) -> String {
    let (first, last) = (fewest.saturating_add(1), most.saturating_add(1));
    match (first, last) {
        (1, 1) => "in the next step".to_string(),
        (a, b) if a == b => format!("within {a} more steps"),
        (a, b) => format!("within {a} to {b} more steps"),
    }
}

impl PredictedCurve {
    /// For each of the recorded trace's `events` events, the highest allocated and reserved
    /// bytes of the points that stand at it; an event no point stands at (an entry the edit
    /// left out, or past the end of a replay that ran out of memory) keeps the values of the
    /// event before it (0 before the first point). Points past `events` are dropped.
    ///
    /// O(p + n) in the points and the events.
    pub fn per_event_max(&self, events: usize) -> (Vec<u64>, Vec<u64>) {
        let mut allocated: Vec<Option<u64>> = vec![None; events];
        let mut reserved: Vec<Option<u64>> = vec![None; events];
        for (k, &e) in self.events.iter().enumerate() {
            let e = e as usize;
            if e >= events {
                continue;
            }
            let a = &mut allocated[e];
            *a = Some(a.unwrap_or(0).max(self.allocated[k]));
            let r = &mut reserved[e];
            *r = Some(r.unwrap_or(0).max(self.reserved[k]));
        }
        let fill = |values: Vec<Option<u64>>| -> Vec<u64> {
            let mut last = 0;
            values
                .into_iter()
                .map(|v| {
                    last = v.unwrap_or(last);
                    last
                })
                .collect()
        };
        (fill(allocated), fill(reserved))
    }
}

/// A prediction's curves on the recorded axis of `device` in `snapshot` (see
/// [`PredictedCurve`]): the run completed first when it ran out of memory, as [`advise`] does,
/// then `fixes` replayed as [`Advisor::predict`] replays them under `budget`, so the curves'
/// peaks are the prediction's. `fixes` are those of a [`Prediction`] of [`advise`] for the
/// same snapshot and device (a checkpointed module is named by its frames).
///
/// O(analysis) once (the completion's and the advisor's), one edit O(n + m), one or two
/// replays, and O(n) for the points.
pub fn predicted_curve(
    snapshot: &Snapshot,
    device: i64,
    fixes: &[Fix],
    budget: Option<u64>,
) -> Result<PredictedCurve> {
    let completed = complete::complete_mapped(snapshot, device)?;
    let (target, completion_origin) = match &completed {
        Some((s, _, origin)) => (s, Some(origin)),
        None => (snapshot, None),
    };
    let advisor = Advisor::new(target, Some(device))?;
    let mut curve = advisor.predicted_curve(fixes, budget)?;
    if let Some(origin) = completion_origin {
        let recorded = |e: &mut u32| *e = origin.get(*e as usize).copied().unwrap_or(*e);
        curve.events.iter_mut().for_each(recorded);
        // The completion's rest stands at the `oom` entry: no recorded allocation there.
        let oom = origin.last().copied().unwrap_or(0);
        curve.checkpointed_events.iter_mut().for_each(recorded);
        curve.checkpointed_events.retain(|&e| e < oom);
    }
    Ok(curve)
}

/// A module node and its activations live at the allocated peak.
#[derive(Clone, Debug, Serialize)]
pub struct ModuleBytes {
    /// The node's label: its pattern (`blocks.*`) or its chain's (`model.py:212`).
    pub module: String,
    /// Segments of the pattern, or frames of the chain.
    pub depth: usize,
    pub activation_bytes_at_peak: u64,
    #[serde(skip)]
    pub node: ModuleNode,
}

/// The advice for one device.
#[derive(Clone, Debug, Serialize)]
pub struct Advice {
    pub device: i64,
    pub budget_bytes: Option<u64>,
    /// The budget is the device's memory the file states ([`Options::device_memory_budget`]),
    /// none was given.
    pub budget_is_device_memory: bool,
    /// The run ran out of memory and was completed with an earlier step's rest (see
    /// [`complete`]); every prediction, the baseline included, is of the completed run.
    pub completion: Option<Completion>,
    /// The recorded run (completed, after an OOM), replayed unedited.
    pub baseline: Prediction,
    /// The checkpointing candidates: module nodes by activation bytes at the peak.
    pub modules: Vec<ModuleBytes>,
    /// Steps with a forward and a backward phase (what checkpointing and micro-batches edit).
    pub passes: usize,
    /// Every prediction that changes a peak, best first: those that fit, then those that leave
    /// no leak going on, then fewer changes, then lower reserved peak.
    pub predictions: Vec<Prediction>,
    /// Fixes tried whose replay has the recorded peaks (nothing to edit, or no effect).
    pub unchanged: Vec<String>,
}

/// Module nodes tried for checkpointing.
pub const CHECKPOINT_CANDIDATES: usize = 3;
/// Micro-batch counts tried.
pub const MICRO_BATCHES: [u32; 2] = [2, 4];
/// Allocator settings tried (the most useful of `simulate --suggest`'s).
pub const ALLOCATOR_SETTINGS: [&str; 3] = [
    "expandable_segments:True",
    "max_split_size_mb:128",
    "roundup_power2_divisions:4",
];

/// One device's analysis, kept for the predictions.
pub struct Advisor<'a> {
    snapshot: &'a Snapshot,
    device: i64,
    timeline: DeviceTimeline,
    steps: memsnap_analysis::StepAnalysis,
    chains: Vec<Arc<[FrameId]>>,
    /// The device's leaking sites, most bytes held first.
    leaks: Vec<LeakingSite>,
}

impl<'a> Advisor<'a> {
    /// Analyses `device` (or the one with the highest peak). O(analysis) once.
    pub fn new(snapshot: &'a Snapshot, device: Option<i64>) -> Result<Self> {
        let timeline = match device {
            Some(d) => DeviceTimeline::build(snapshot, d)?,
            None => memsnap_analysis::live::highest_peak_timeline(snapshot)?
                .ok_or(AdviseError::NoTrace)?,
        };
        let device = timeline.device();
        if snapshot
            .traces()
            .get(usize::try_from(device).unwrap_or(usize::MAX))
            .is_none_or(Vec::is_empty)
        {
            return Err(AdviseError::NoTrace);
        }
        let steps = timeline.steps(&StepOptions::default());
        let mut keyer = ModuleKeyer::new(snapshot);
        let chains = timeline
            .replay()
            .allocations
            .iter()
            .map(|a| keyer.chain(a.stack))
            .collect();
        let leaks = memsnap_analysis::leaking_sites(snapshot, timeline.replay(), &steps.steps);
        Ok(Advisor {
            snapshot,
            device,
            timeline,
            steps,
            chains,
            leaks,
        })
    }

    pub fn device(&self) -> i64 {
        self.device
    }

    /// The device's leaking sites ([`memsnap_analysis::leaks`]), most bytes held first.
    pub fn leaks(&self) -> &[LeakingSite] {
        &self.leaks
    }

    /// Steps with a forward and a backward phase.
    pub fn passes(&self) -> usize {
        let trace = &self.snapshot.traces()[self.device as usize];
        edit::Analysed::new(
            self.snapshot,
            trace,
            self.timeline.replay(),
            &self.steps,
            &self.chains,
            self.timeline.module_paths(),
        )
        .passes()
        .len()
    }

    /// Module nodes by the activation bytes live at the allocated peak under them, biggest
    /// first. When the run recorded module paths and an activation live at the peak was made
    /// in one, named patterns ([`node::named_nodes`]: `blocks.*`, `blocks.*.attn`); otherwise
    /// (or when no pattern is worth checkpointing: only the model's own call was named)
    /// chain prefixes of at most 4 frames, where a node whose bytes are all in one child is
    /// left out in favour of the outermost. O(m × d) in the live allocations and the depth of
    /// their paths or chains.
    pub fn module_bytes(&self) -> Vec<ModuleBytes> {
        let peak = self.timeline.peak(CurveKind::Allocated).event;
        let replay = self.timeline.replay();
        let live: Vec<(usize, u64)> = replay
            .live_at(peak, Lifetime::Allocated)
            .into_iter()
            .map(|id| id.0 as usize)
            .filter(|&i| self.steps.categories.get(i) == Some(&Category::Activation))
            .map(|i| (i, replay.allocations[i].size))
            .collect();
        let paths = self.timeline.module_paths();
        if live.iter().any(|&(i, _)| paths.of(i).is_some()) {
            let named: Vec<ModuleBytes> = node::named_nodes(paths, live.iter().copied())
                .into_iter()
                .map(|(pattern, depth, bytes)| ModuleBytes {
                    module: pattern.clone(),
                    depth,
                    activation_bytes_at_peak: bytes,
                    node: ModuleNode::Named(pattern),
                })
                .collect();
            // Only the model's own call named (nothing inside it is worth checkpointing by
            // name): the stacks may still tell its parts apart.
            if !named.is_empty() {
                return named;
            }
        }
        let mut by_node: std::collections::HashMap<Vec<FrameId>, u64> = Default::default();
        for (i, size) in live {
            let chain = &self.chains[i];
            for depth in 1..=chain.len().min(4) {
                *by_node.entry(chain[..depth].to_vec()).or_default() += size;
            }
        }
        let mut out: Vec<ModuleBytes> = by_node
            .iter()
            .filter(|(node, &bytes)| {
                // Same bytes as the parent: the parent says it.
                node.len() == 1 || by_node.get(&node[..node.len() - 1]) != Some(&bytes)
            })
            .map(|(node, &bytes)| ModuleBytes {
                module: chain_label(self.snapshot, node),
                depth: node.len(),
                activation_bytes_at_peak: bytes,
                node: ModuleNode::Chain(node.clone()),
            })
            .collect();
        out.sort_by(|a, b| {
            b.activation_bytes_at_peak
                .cmp(&a.activation_bytes_at_peak)
                .then(a.depth.cmp(&b.depth))
                .then(a.module.cmp(&b.module))
        });
        out
    }

    /// Replays the run with `fixes` applied. O(n + m) edit plus one replay.
    pub fn predict(&self, fixes: &[Fix], budget: Option<u64>) -> Result<Prediction> {
        Ok(self.replay_fixes(fixes, budget)?.0)
    }

    /// The curves of [`Advisor::predict`]'s replay on the event axis of the trace the advisor
    /// was made for: one point per replayed entry of the edited trace, at the entry it stands
    /// for ([`edit::Edited::origin`]). O(n + m) edit plus one replay, and O(n) for the points.
    pub fn predicted_curve(&self, fixes: &[Fix], budget: Option<u64>) -> Result<PredictedCurve> {
        let (prediction, report, edited) = self.replay_fixes(fixes, budget)?;
        let (events, checkpointed_events): (Vec<u32>, Vec<u32>) = match edited {
            Some(edited) => {
                let allocations = &self.timeline.replay().allocations;
                let mut checkpointed: Vec<u32> = edited
                    .checkpointed
                    .iter()
                    .filter_map(|&a| allocations.get(a as usize)?.alloc_event())
                    .collect();
                checkpointed.sort_unstable();
                checkpointed.dedup();
                let events = edited
                    .origin
                    .into_iter()
                    .take(report.allocated_curve.len())
                    .collect();
                (events, checkpointed)
            }
            None => (
                (0..report.allocated_curve.len() as u32).collect(),
                Vec::new(),
            ),
        };
        let mut allocated = report.allocated_curve;
        let mut reserved = report.reserved_curve;
        allocated.truncate(events.len());
        reserved.truncate(events.len());
        Ok(PredictedCurve {
            events,
            allocated,
            reserved,
            allocated_peak_bytes: prediction.allocated_peak_bytes,
            reserved_peak_bytes: prediction.reserved_peak_bytes,
            checkpointed_events,
        })
    }

    /// The prediction, the replay's report and, when the trace was edited, the edit (the
    /// recorded entry each edited entry stands for, the checkpointed allocations).
    fn replay_fixes(
        &self,
        fixes: &[Fix],
        budget: Option<u64>,
    ) -> Result<(
        Prediction,
        memsnap_simulate::DeviceReport,
        Option<edit::Edited>,
    )> {
        let mut edit = Edit::none();
        let mut conf = String::new();
        // Memory from before the window that a fix takes out of the start state (a stopped
        // leak's, smaller optimizer state's).
        let mut released_before_window: Vec<u64> = Vec::new();
        for fix in fixes {
            match fix {
                Fix::Checkpoint { node, calls, .. } => edit.checkpoint.push((node.clone(), *calls)),
                Fix::MicroBatches { count } => edit.micro_batches = edit.micro_batches.max(*count),
                Fix::OptimizerState { percent } => {
                    edit.optimizer_state_percent = edit.optimizer_state_percent.min(*percent)
                }
                Fix::Allocator { alloc_conf } => {
                    if !conf.is_empty() {
                        conf.push(',');
                    }
                    conf.push_str(alloc_conf);
                }
                Fix::ReleaseKept { sites, .. } => {
                    let allocations = &self.timeline.replay().allocations;
                    for leak in self.leaks.iter().filter(|l| sites.contains(&l.site)) {
                        edit.release.extend(&leak.kept);
                        released_before_window.extend(
                            leak.before_window
                                .iter()
                                .map(|&a| allocations[a as usize].addr),
                        );
                    }
                }
            }
        }
        edit.release.sort_unstable();
        edit.release.dedup();
        let stopped = |site: &str| {
            fixes.iter().any(
                |f| matches!(f, Fix::ReleaseKept { sites, .. } if sites.iter().any(|s| s == site)),
            )
        };
        let leak_bytes_per_step: u64 = self
            .leaks
            .iter()
            .filter(|l| !stopped(&l.site))
            .map(|l| l.bytes_per_step)
            .sum();
        let trace = &self.snapshot.traces()[self.device as usize];
        let replay = self.timeline.replay();
        let analysed = edit::Analysed::new(
            self.snapshot,
            trace,
            replay,
            &self.steps,
            &self.chains,
            self.timeline.module_paths(),
        );
        if edit.optimizer_state_percent < 100 {
            // The state from before the window leaves the start state: `edit_trace` makes it
            // again, smaller, before the first event.
            let allocations = &replay.allocations;
            released_before_window.extend(
                analysed
                    .state_before_window()
                    .into_iter()
                    .map(|a| allocations[a as usize].addr),
            );
        }
        let (edited, edit_out, recompute) = if edit == Edit::none() {
            (None, None, edit::Recompute::default())
        } else {
            let mut e = edit::edit_trace(self.snapshot, &analysed, &edit);
            let recompute = e.recompute;
            (Some(std::mem::take(&mut e.trace)), Some(e), recompute)
        };
        let config = if conf.is_empty() {
            None
        } else {
            let (file_config, _) = settings::file_config(self.snapshot);
            Some(
                settings::overlay(&file_config, &conf)
                    .map_err(|source| AdviseError::Config { conf, source })?,
            )
        };
        // Only stopping a leak and optimizer state from before the window change the start
        // state; every other fix is replayed from the recorded one, without a copy of the
        // snapshot.
        let released = (!released_before_window.is_empty()).then(|| {
            let mut copy = self.snapshot.clone();
            release_before_window(&mut copy, self.device, released_before_window);
            copy
        });
        let start = released.as_ref().unwrap_or(self.snapshot);
        let trace = edited.as_deref().unwrap_or(trace);
        let replay = |memory_limit: Option<u64>| -> Result<memsnap_simulate::DeviceReport> {
            let options = SimOptions {
                config: config.clone(),
                memory_limit,
                device: Some(self.device),
            };
            Ok(replay_trace(start, self.device, trace, &options)?)
        };
        // On a GPU of the budget's size, as the run would be: under pressure the allocator
        // releases its cache and retries, which changes the reserved peak. A run that does not
        // fit there is replayed again without the limit, for what it would need.
        let mut report = replay(budget)?;
        let fits = budget.map(|limit| report.oom.is_none() && report.reserved_peak_bytes <= limit);
        if fits == Some(false) {
            report = replay(None)?;
        }
        let out_of_memory = report.oom.is_some();
        let prediction = Prediction {
            description: describe(fixes),
            fixes: fixes.to_vec(),
            allocated_peak_bytes: report.allocated_peak_bytes,
            reserved_peak_bytes: report.reserved_peak_bytes,
            fits,
            out_of_memory,
            extra_forward_compute: if recompute.forward_bytes == 0 {
                0.0
            } else {
                recompute.bytes as f64 / recompute.forward_bytes as f64
            },
            leak_bytes_per_step,
            steps_to_budget: match (budget, fits) {
                (Some(limit), Some(true)) if leak_bytes_per_step > 0 => {
                    Some(limit.saturating_sub(report.reserved_peak_bytes) / leak_bytes_per_step)
                }
                _ => None,
            },
        };
        Ok((prediction, report, edit_out))
    }

    /// The single fixes tried: checkpointing of the top module nodes, micro-batches, 8-bit
    /// and offloaded optimizer state (when the run has any), allocator settings.
    pub fn candidates(&self) -> Vec<Fix> {
        let trace = &self.snapshot.traces()[self.device as usize];
        let analysed = edit::Analysed::new(
            self.snapshot,
            trace,
            self.timeline.replay(),
            &self.steps,
            &self.chains,
            self.timeline.module_paths(),
        );
        let mut fixes: Vec<Fix> = Vec::new();
        for m in self.module_bytes().into_iter().take(CHECKPOINT_CANDIDATES) {
            let checkpoint = |calls| Fix::Checkpoint {
                module: m.module.clone(),
                node: m.node.clone(),
                calls,
            };
            // The first half of a module called several times (the first blocks, whose
            // activations live longest): less recomputation than all of them.
            match &m.node {
                ModuleNode::Named(pattern) if pattern.contains('*') => {
                    // Named by the blocks' own numbers: `blocks.0` to `blocks.2`.
                    let numbers: Vec<u32> = edit::call_indices(&analysed, &m.node)
                        .into_iter()
                        .filter_map(|n| u32::try_from(n).ok())
                        .collect();
                    match (numbers.first(), numbers.last()) {
                        (Some(&first), Some(&last)) => {
                            if numbers.len() >= 4 {
                                let half = numbers[numbers.len() / 2 - 1];
                                fixes.push(checkpoint(Some((first, half))));
                            }
                            fixes.push(checkpoint(Some((first, last))));
                        }
                        _ => fixes.push(checkpoint(None)),
                    }
                }
                ModuleNode::Named(_) => fixes.push(checkpoint(None)),
                ModuleNode::Chain(_) => {
                    let calls = edit::call_indices(&analysed, &m.node).len() as u32;
                    if m.depth == 1 && calls >= 4 {
                        fixes.push(checkpoint(Some((0, calls / 2 - 1))));
                    }
                    fixes.push(checkpoint(None));
                }
            }
        }
        fixes.extend(MICRO_BATCHES.map(|count| Fix::MicroBatches { count }));
        if self.steps.categories.contains(&Category::OptimizerState) {
            fixes.push(Fix::OptimizerState { percent: 25 });
            fixes.push(Fix::OptimizerState { percent: 0 });
        }
        fixes.extend(ALLOCATOR_SETTINGS.map(|c| Fix::Allocator {
            alloc_conf: c.to_string(),
        }));
        // The leak that holds the most, then every leak together.
        if let Some(top) = self.leaks.first() {
            fixes.push(Fix::ReleaseKept {
                sites: vec![top.site.clone()],
                bytes_per_step: top.bytes_per_step,
            });
        }
        if self.leaks.len() > 1 {
            let top = &self.leaks[..self.leaks.len().min(LEAKS_RELEASED_TOGETHER)];
            fixes.push(Fix::ReleaseKept {
                sites: top.iter().map(|l| l.site.clone()).collect(),
                bytes_per_step: top.iter().map(|l| l.bytes_per_step).sum(),
            });
        }
        fixes
    }
}

/// Leaking sites that one fix stops at most (those that hold the most).
pub const LEAKS_RELEASED_TOGETHER: usize = 8;

/// Takes the blocks allocated before the window at `addresses` out of `device`'s final
/// segments (the start state of the replay is rebuilt from them, [`memsnap_simulate`]'s
/// `start`): they are freed, and a segment left with no allocated block is dropped, because
/// the run without them would not have reserved it, unless the window's segment entries
/// name it (the start state is walked back from the final segments through them). Blocks the
/// window makes in its free space are laid out by the replay's allocator wherever it puts
/// them, as every block is.
///
/// O(b + n log c) in the device's blocks, the trace's entries and the c segments emptied.
fn release_before_window(snapshot: &mut Snapshot, device: i64, mut addresses: Vec<u64>) {
    addresses.sort_unstable();
    let mut emptied: Vec<(u64, u64, usize)> = Vec::new();
    for (i, segment) in snapshot.segments.iter_mut().enumerate() {
        if segment.device != device {
            continue;
        }
        let at: Vec<u64> = segment.block_addresses().map(|(a, _)| a).collect();
        let mut released = false;
        for (block, addr) in segment.blocks.iter_mut().zip(at) {
            if block.state.is_active() && addresses.binary_search(&addr).is_ok() {
                block.state = memsnap_format::BlockState::Inactive;
                released = true;
            }
        }
        if released && !segment.blocks.iter().any(|b| b.state.is_active()) {
            emptied.push((segment.address, segment.total_size, i));
        }
    }
    if emptied.is_empty() {
        return;
    }
    emptied.sort_unstable();
    let mut touched = vec![false; emptied.len()];
    let traces = snapshot.device_traces.as_deref().unwrap_or(&[]);
    let segment_entries = traces
        .get(device as usize)
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter(|e| {
            matches!(
                e.action,
                Action::SegmentAlloc
                    | Action::SegmentFree
                    | Action::SegmentMap
                    | Action::SegmentUnmap
            )
        });
    for e in segment_entries {
        let k = emptied.partition_point(|&(base, _, _)| base <= e.addr);
        if let Some(k) = k.checked_sub(1) {
            let (base, size, _) = emptied[k];
            if e.addr < base.saturating_add(size) {
                touched[k] = true;
            }
        }
    }
    let mut dropped: Vec<usize> = emptied
        .iter()
        .zip(&touched)
        .filter(|(_, &t)| !t)
        .map(|(&(_, _, i), _)| i)
        .collect();
    dropped.sort_unstable();
    let mut index = 0;
    snapshot.segments.retain(|_| {
        let keep = dropped.binary_search(&index).is_err();
        index += 1;
        keep
    });
}

fn describe(fixes: &[Fix]) -> String {
    if fixes.is_empty() {
        return "(as recorded)".to_string();
    }
    fixes
        .iter()
        .map(Fix::describe)
        .collect::<Vec<_>>()
        .join(" + ")
}

fn rank(p: &[Prediction]) -> Vec<Prediction> {
    let mut out = p.to_vec();
    out.sort_by(|a, b| {
        // A leak that goes on outgrows any budget in the end: the fixes that stop it first.
        let key = |p: &Prediction| {
            (
                p.fits == Some(false),
                p.out_of_memory,
                p.leak_bytes_per_step > 0,
                p.fixes.len(),
            )
        };
        key(a)
            .cmp(&key(b))
            .then(a.reserved_peak_bytes.cmp(&b.reserved_peak_bytes))
            .then(a.extra_forward_compute.total_cmp(&b.extra_forward_compute))
    });
    out
}

/// [`Advisor::predict`] for each set of fixes, `jobs` replays at a time, in the order of
/// `sets`. A worker takes the next set until none is left; the first error (in that order)
/// is returned.
fn predict_all(
    advisor: &Advisor<'_>,
    sets: &[Vec<Fix>],
    budget: Option<u64>,
    jobs: usize,
) -> Result<Vec<Prediction>> {
    let jobs = jobs.clamp(1, sets.len().max(1));
    if jobs == 1 {
        return sets
            .iter()
            .map(|fixes| advisor.predict(fixes, budget))
            .collect();
    }
    let next = AtomicUsize::new(0);
    let done: Vec<Vec<(usize, Result<Prediction>)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..jobs)
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(fixes) = sets.get(i) else {
                            break out;
                        };
                        out.push((i, advisor.predict(fixes, budget)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            // A worker that panicked is re-raised here: the replays have no panics of their
            // own to hide, and a half-done ranking must not pass for a whole one.
            .map(|w| {
                w.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let mut ordered: Vec<(usize, Result<Prediction>)> = done.into_iter().flatten().collect();
    ordered.sort_unstable_by_key(|(i, _)| *i);
    ordered.into_iter().map(|(_, p)| p).collect()
}

/// Ranks the fixes for `snapshot` (see the crate docs). The replays run side by side
/// ([`Options::jobs`]); the result does not depend on how many.
pub fn advise(snapshot: &Snapshot, options: &Options) -> Result<Advice> {
    let device = match options.device {
        Some(d) => d,
        None => memsnap_analysis::live::highest_peak_timeline(snapshot)?
            .ok_or(AdviseError::NoTrace)?
            .device(),
    };
    let completed = complete::complete(snapshot, device)?;
    let (target, completion) = match &completed {
        Some((s, c)) => (s, Some(c.clone())),
        None => (snapshot, None),
    };
    let advisor = Advisor::new(target, Some(device))?;
    // The recorded file states the device's memory (its `oom` entry), not the completed run.
    let device_memory = match options.budget {
        None if options.device_memory_budget => {
            memsnap_simulate::device_memory(snapshot, device).filter(|&bytes| bytes > 0)
        }
        _ => None,
    };
    let budget = options.budget.or(device_memory);
    let jobs = options.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_JOBS))
    });
    // The baseline and every single fix, replayed side by side.
    let mut sets = vec![Vec::new()];
    sets.extend(advisor.candidates().into_iter().map(|fix| vec![fix]));
    let mut singles = predict_all(&advisor, &sets, budget, jobs)?.into_iter();
    let baseline = singles.next().ok_or(AdviseError::NoTrace)?;
    let mut predictions = Vec::new();
    let mut unchanged = Vec::new();
    for p in singles {
        if (
            p.allocated_peak_bytes,
            p.reserved_peak_bytes,
            p.out_of_memory,
        ) == (
            baseline.allocated_peak_bytes,
            baseline.reserved_peak_bytes,
            baseline.out_of_memory,
        ) {
            unchanged.push(p.description);
        } else {
            predictions.push(p);
        }
    }
    if budget.is_some() {
        // Combine: the best so far plus the best of each kind it lacks, until it fits.
        let singles = predictions.clone();
        let mut current = rank(&singles).into_iter().next();
        while let Some(best) = current.clone() {
            if best.fits == Some(true) {
                break;
            }
            let kinds: Vec<u8> = best.fixes.iter().map(Fix::kind).collect();
            let combinations: Vec<Vec<Fix>> = singles
                .iter()
                .map(|single| &single.fixes[0])
                .filter(|fix| !kinds.contains(&fix.kind()))
                .map(|fix| {
                    let mut fixes = best.fixes.clone();
                    fixes.push(fix.clone());
                    fixes
                })
                .collect();
            let key =
                |p: &Prediction| (p.fits != Some(true), p.out_of_memory, p.reserved_peak_bytes);
            // The first of the best, in the order of the singles.
            let next = predict_all(&advisor, &combinations, budget, jobs)?
                .into_iter()
                .reduce(|n, p| if key(&p) < key(&n) { p } else { n });
            match next {
                Some(p)
                    if p.fits == Some(true) || p.reserved_peak_bytes < best.reserved_peak_bytes =>
                {
                    predictions.push(p.clone());
                    current = Some(p);
                }
                _ => break,
            }
        }
    }
    Ok(Advice {
        device: advisor.device(),
        budget_bytes: budget,
        budget_is_device_memory: device_memory.is_some(),
        completion,
        baseline,
        modules: advisor.module_bytes(),
        passes: advisor.passes(),
        predictions: rank(&predictions),
        unchanged,
    })
}

#[cfg(test)]
mod tests {
    use super::when_full;

    /// A fix that leaves no room above its reserved peak for one more step of the leak once
    /// read "fills the budget within about 0 more steps".
    #[test]
    fn a_budget_the_next_step_fills_is_not_zero_steps_away() {
        assert_eq!(when_full(0, 0), "in the next step");
        assert_eq!(when_full(3, 3), "within 4 more steps");
        assert_eq!(when_full(0, 2), "within 1 to 3 more steps");
        assert_eq!(
            when_full(u64::MAX, u64::MAX),
            format!("within {} more steps", u64::MAX)
        );
    }
}
