//! Training steps, their phases and slopes, and drift across steps.
//!
//! Steps and their forward / backward / optimizer phases come from the best evidence the file
//! has ([`crate::phases`]): the allocations' stacks, then annotations, then the curve's shape
//! described below. Partial steps at the window's ends are kept (and marked), but only whole
//! steps count for drift.
//!
//! A training step's memory (the active curve) rises through the forward pass to a peak and
//! falls through the backward pass. Steps come from annotations where the snapshot has them
//! (`ProfilerStep#N` ranges, or the ends of optimizer-step ranges such as
//! `Optimizer.step#AdamW.step`; a last `ProfilerStep#N` that never ended, the step the
//! recording stopped in, runs to the window's end), otherwise from the curve's shape: the
//! curve is split with
//! hysteresis into "high" regions (more than 60% of the largest height above the floor)
//! separated by "low" valleys (below 30%), a height taken above the floor the rest of the
//! run returns to (the lowest value from that point on: a leak that raises the floor by more
//! than a step's rise hides no step); a step ends at the bottom of the last dip of the valley
//! after its high region, the next starts on the following event, and a step's peak is the
//! first maximum in it. A step is
//! `[start_event, end_event]`, both inclusive, like the ground truth of
//! `memsnap_workload`.
//!
//! **Drift** is the Theil–Sen slope (median of pairwise slopes, robust to a warm-up step that
//! allocates optimizer state) of the step floor (bytes after the step's last event, the
//! minimum it returns to) and of the step peak, in bytes per step. A rising floor is memory
//! that outlives every step: a leak.

use serde::Serialize;

use crate::categories::{bytes_at, categorize, Category, CategoryBytes};
use crate::curve::{Curve, TimeAxis};
pub use crate::phases::Slope;
use crate::phases::{plan_from_evidence, Evidence, Phase, PhaseKind, PhasePlan, PhaseSpan};
use crate::ranges::NamedRange;
use crate::replay::{Lifetime, Replay};

/// Where step boundaries come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum StepSource {
    /// The best evidence the file has: stacks, then annotations (at least one step), then
    /// the curve's shape.
    #[default]
    Auto,
    /// Phases from the stacks (helped by annotations) only.
    Stacks,
    Annotations,
    CurveShape,
}

/// How steps were found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum StepMethod {
    /// From the allocations' stacks (and annotations where stacks say nothing).
    Stacks,
    /// From annotation ranges with this name.
    Annotations {
        name: String,
    },
    CurveShape,
    /// No steps found.
    None,
}

impl StepMethod {
    /// `stacks`, `annotations:<name>`, `curve_shape` or `none`.
    pub fn label(&self) -> String {
        match self {
            StepMethod::Stacks => "stacks".into(),
            StepMethod::Annotations { name } => format!("annotations:{name}"),
            StepMethod::CurveShape => "curve_shape".into(),
            StepMethod::None => "none".into(),
        }
    }
}

/// Options for [`find_steps`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StepOptions {
    pub source: StepSource,
    /// Drift above this percentage is flagged: the step minimum's (or peak's) growth over all
    /// recorded steps, relative to the highest step peak.
    pub drift_tolerance_percent: f64,
}

impl Default for StepOptions {
    fn default() -> Self {
        StepOptions {
            source: StepSource::Auto,
            drift_tolerance_percent: 1.0,
        }
    }
}

/// One training step on the active curve.
///
/// Its forward and backward slopes are computed from its fields when asked
/// ([`Step::forward`], [`Step::backward`]), not kept (112 of a step's 264 bytes).
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub index: usize,
    pub start_event: u32,
    pub peak_event: u32,
    pub end_event: u32,
    /// Live bytes (active curve) before its first event: what the step starts from.
    pub before_bytes: u64,
    /// Curve values after those events.
    pub start_bytes: u64,
    pub peak_bytes: u64,
    pub end_bytes: u64,
    /// Lowest value in the step.
    pub min_bytes: u64,
    pub start_time_us: Option<i64>,
    pub peak_time_us: Option<i64>,
    pub end_time_us: Option<i64>,
    /// Allocations made in the step and still live after its end.
    pub outliving_count: u64,
    pub outliving_bytes: u64,
    /// The step's phases in order; they tile `start_event..=end_event`.
    pub phases: Vec<Phase>,
    /// The window holds only part of the step: it does not begin with a forward phase.
    pub partial: bool,
    /// Optimizer state the step created (allocated in its optimizer phase, outliving it).
    pub optimizer_state_bytes: u64,
    /// A warm-up step: it creates the optimizer's state, so memory after it stays higher
    /// (this is not a leak).
    pub warmup: bool,
}

/// A step as JSON: its fields, with `forward` and `backward` after the times.
impl Serialize for Step {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct StepJson<'a> {
            index: usize,
            start_event: u32,
            peak_event: u32,
            end_event: u32,
            before_bytes: u64,
            start_bytes: u64,
            peak_bytes: u64,
            end_bytes: u64,
            min_bytes: u64,
            start_time_us: Option<i64>,
            peak_time_us: Option<i64>,
            end_time_us: Option<i64>,
            forward: Slope,
            backward: Slope,
            outliving_count: u64,
            outliving_bytes: u64,
            phases: &'a [Phase],
            partial: bool,
            optimizer_state_bytes: u64,
            warmup: bool,
        }
        StepJson {
            index: self.index,
            start_event: self.start_event,
            peak_event: self.peak_event,
            end_event: self.end_event,
            before_bytes: self.before_bytes,
            start_bytes: self.start_bytes,
            peak_bytes: self.peak_bytes,
            end_bytes: self.end_bytes,
            min_bytes: self.min_bytes,
            start_time_us: self.start_time_us,
            peak_time_us: self.peak_time_us,
            end_time_us: self.end_time_us,
            forward: self.forward(),
            backward: self.backward(),
            outliving_count: self.outliving_count,
            outliving_bytes: self.outliving_bytes,
            phases: &self.phases,
            partial: self.partial,
            optimizer_state_bytes: self.optimizer_state_bytes,
            warmup: self.warmup,
        }
        .serialize(serializer)
    }
}

impl Step {
    /// What the step keeps: live bytes after its last event minus before its first. A step
    /// whose first event allocates (the batch) would show that allocation as freed if this
    /// were counted from `start_bytes`, which is after the first event. O(1).
    pub fn kept_bytes(&self) -> i64 {
        signed_difference(self.end_bytes, self.before_bytes)
    }

    /// Start to peak: the bytes gained, over the events and time from the start to the peak.
    /// O(1).
    pub fn forward(&self) -> Slope {
        Slope::over(
            signed_difference(self.peak_bytes, self.start_bytes),
            self.peak_event.saturating_sub(self.start_event),
            self.start_time_us,
            self.peak_time_us,
        )
    }

    /// Peak to end: `bytes` is the bytes released. O(1).
    pub fn backward(&self) -> Slope {
        Slope::over(
            signed_difference(self.peak_bytes, self.end_bytes),
            self.end_event.saturating_sub(self.peak_event),
            self.peak_time_us,
            self.end_time_us,
        )
    }

    /// The phase containing `event`, if any.
    pub fn phase_at(&self, event: u32) -> Option<&Phase> {
        self.phases
            .iter()
            .find(|p| p.start_event <= event && event <= p.end_event)
    }
}

/// Drift across steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Drift {
    /// Theil–Sen slope of the step floor (bytes after its last event, the minimum the step
    /// returns to), bytes per step (0 with fewer than 2 steps).
    pub min_bytes_per_step: f64,
    /// Theil–Sen slope of the step peak, bytes per step.
    pub peak_bytes_per_step: f64,
    /// Minimum growth over all steps as a percentage of the highest step peak.
    pub min_growth_percent: f64,
    /// Peak growth over all steps as a percentage of the highest step peak.
    pub peak_growth_percent: f64,
    pub tolerance_percent: f64,
    /// The minimum grows by more than the tolerance: memory leaks from step to step.
    pub leak_suspected: bool,
    /// The peak grows by more than the tolerance.
    pub peak_growth_suspected: bool,
}

/// Steps, phases, categories and drift of one device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepAnalysis {
    pub method: StepMethod,
    /// Why better evidence was not used (`None` when the first choice worked or was asked
    /// for), e.g. `stack labels incoherent: 41% of the allocations while memory rises carry
    /// backward or optimizer frames`.
    pub fallback_reason: Option<String>,
    /// The set-up before the first step (model construction or loading), when seen.
    pub setup: Option<Phase>,
    pub steps: Vec<Step>,
    pub drift: Drift,
    /// The category of every allocation, in [`Replay::allocations`] order.
    #[serde(skip)]
    pub categories: Vec<Category>,
}

impl StepAnalysis {
    /// `(step index, phase)` containing `event`; the set-up has no step index.
    pub fn phase_at(&self, event: u32) -> Option<(Option<usize>, &Phase)> {
        if let Some(p) = self
            .setup
            .as_ref()
            .filter(|p| p.start_event <= event && event <= p.end_event)
        {
            return Some((None, p));
        }
        let i = self.steps.partition_point(|s| s.end_event < event);
        let step = self.steps.get(i).filter(|s| s.start_event <= event)?;
        step.phase_at(event).map(|p| (Some(i), p))
    }

    /// Every phase (the set-up first), in event order.
    pub fn phases(&self) -> impl Iterator<Item = (Option<usize>, &Phase)> {
        self.setup.iter().map(|p| (None, p)).chain(
            self.steps
                .iter()
                .enumerate()
                .flat_map(|(i, s)| s.phases.iter().map(move |p| (Some(i), p))),
        )
    }

    /// Bytes by category live before the first event (memory from before the window).
    pub fn categories_before_window(&self, replay: &Replay) -> CategoryBytes {
        let mut out = CategoryBytes::default();
        for (a, c) in replay.allocations.iter().zip(&self.categories) {
            if a.alloc_event().is_none() {
                out.0[*c as usize] = out.0[*c as usize].saturating_add(a.size);
            }
        }
        out
    }

    /// Bytes by category live after each of `events`, in the order given.
    ///
    /// O(m log q + q) for m allocations and q events, plus O(q log q) when `events` is not
    /// ascending. Memory: the answer, plus an order of the events when they must be sorted.
    pub fn categories_at(&self, replay: &Replay, events: &[u32]) -> Vec<CategoryBytes> {
        if events.is_sorted() {
            return bytes_at(replay, &self.categories, events);
        }
        let mut order: Vec<usize> = (0..events.len()).collect();
        order.sort_by_key(|&i| events[i]);
        let sorted: Vec<u32> = order.iter().map(|&i| events[i]).collect();
        let found = bytes_at(replay, &self.categories, &sorted);
        let mut out = vec![CategoryBytes::default(); events.len()];
        for (k, &i) in order.iter().enumerate() {
            out[i] = found[k];
        }
        out
    }
}

/// What the stacks of a device's allocations say, computed once per timeline.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StackEvidence {
    /// Per allocation, in [`Replay::allocations`] order.
    pub evidence: Vec<Evidence>,
    /// The file's stacks have Python frames only.
    pub python_only: bool,
}

/// Finds the steps of a device (see the module docs and [`crate::phases`]).
///
/// O(n log n) for n events and allocations: each evidence source is one or a few passes
/// (stacks: `plan_from_evidence`; the shape: one pass over the curve's block extremes and
/// one per step found; annotations: sorted once), each phase and step is measured by binary
/// search plus a pass over its own allocations, and drift's Theil–Sen slope samples at most
/// about 200 × 200 pairs.
pub fn find_steps(
    curve: &Curve,
    time: &TimeAxis,
    ranges: &[NamedRange],
    replay: &Replay,
    evidence: &StackEvidence,
    options: &StepOptions,
) -> StepAnalysis {
    let from_stacks =
        || plan_from_evidence(replay, &evidence.evidence, evidence.python_only, ranges);
    let from_annotations = || {
        annotation_bounds(ranges, time, replay.truncated, replay.trace_len).map(|steps| {
            let plan = split_at_peaks(&steps.bounds, curve, Some(ranges), steps.stopped);
            (steps.name, plan)
        })
    };
    let from_shape = |bounds: Vec<(u32, u32)>| {
        let mut plan = split_at_peaks(&bounds, curve, None, false);
        // In a trace that starts with the run, memory built before the first forward pass
        // is the set-up (the model and its weights).
        plan.setup = !replay.truncated && bounds.first().is_some_and(|&(start, _)| start > 0);
        plan
    };
    let mut fallback_reason = None;
    let (method, plan) = match options.source {
        StepSource::Stacks => match from_stacks() {
            Some(plan) => (StepMethod::Stacks, plan),
            None => (StepMethod::None, PhasePlan::default()),
        },
        StepSource::Annotations => match from_annotations() {
            Some((name, plan)) => (StepMethod::Annotations { name }, plan),
            None => (StepMethod::None, PhasePlan::default()),
        },
        StepSource::CurveShape => (
            StepMethod::CurveShape,
            from_shape(shape_steps(curve, replay)),
        ),
        StepSource::Auto => match from_stacks() {
            Some(plan) => {
                // The shape's steps judge the stacks, and give the steps if they fail.
                let bounds = shape_steps(curve, replay);
                match stack_incoherence(&plan, &bounds, curve, replay, &evidence.evidence) {
                    None => (StepMethod::Stacks, plan),
                    Some(reason) => {
                        fallback_reason = Some(reason);
                        match from_annotations() {
                            Some((name, plan)) if !plan.steps.is_empty() => {
                                (StepMethod::Annotations { name }, plan)
                            }
                            _ => (StepMethod::CurveShape, from_shape(bounds)),
                        }
                    }
                }
            }
            None => match from_annotations() {
                Some((name, plan)) if !plan.steps.is_empty() => {
                    (StepMethod::Annotations { name }, plan)
                }
                _ => (
                    StepMethod::CurveShape,
                    from_shape(shape_steps(curve, replay)),
                ),
            },
        },
    };
    let method = if plan.steps.is_empty() {
        StepMethod::None
    } else {
        method
    };
    let spans: Vec<PhaseSpan> = plan.phases(replay.trace_len);
    let step_count = plan.steps.len();
    drop(plan);
    let categories = categorize(replay, &evidence.evidence, &spans);
    let measure = |kind: PhaseKind, s: u32, e: u32| Phase::measure(kind, s, e, curve, time, replay);
    let setup = spans
        .iter()
        .find(|p| p.0.is_none())
        .map(|&(_, kind, s, e)| measure(kind, s, e));
    // Each step's spans in one pass: `plan.phases` lists them step by step (the set-up
    // first), one per phase start. (Filtering all spans per step was quadratic: 68,000 steps
    // of a 10M-entry run took 25 s; a vector of spans per step was 8 MB at its peak.)
    let mut next_span = spans.iter().take_while(|span| span.0.is_none()).count();
    let steps: Vec<Step> = (0..step_count)
        .map(|index| {
            let first = next_span;
            while spans
                .get(next_span)
                .is_some_and(|span| span.0 == Some(index as u32))
            {
                next_span += 1;
            }
            let phases: Vec<Phase> = spans[first..next_span]
                .iter()
                .map(|&(_, kind, s, e)| measure(kind, s, e))
                .collect();
            let start = phases.first().map_or(0, |p| p.start_event);
            let end = phases.last().map_or(0, |p| p.end_event);
            let mut step = measure_step(index, start, end, curve, time, replay);
            step.partial = phases.first().is_some_and(|p| p.kind != PhaseKind::Forward);
            step.phases = phases;
            step
        })
        .collect();
    let mut analysis = StepAnalysis {
        method,
        fallback_reason,
        setup,
        steps,
        drift: Drift::default(),
        categories,
    };
    mark_warmups(&mut analysis, replay);
    analysis.drift = drift(
        &steps_for_drift(&analysis.steps),
        options.drift_tolerance_percent,
    );
    analysis
}

/// Changes of label between consecutive labelled allocations while memory rises, as a share
/// of those allocations, above which stack labels are not trusted (with more than
/// [`SWITCHES_PER_RISE`] changes a rise on average).
const SWITCH_SHARE_LIMIT: f64 = 0.2;
/// A rise's own story has a few changes of label: forward, gradients near the peak, a hook.
const SWITCHES_PER_RISE: u64 = 8;

/// Why a plan from stack evidence contradicts the curve it describes (`None`: it does not).
///
/// Stacks are trusted only when they tell the story memory tells. Two checks, in this order,
/// against the steps the curve's shape finds (`bounds`, from `shape_steps`; no rises, no
/// judgement):
///
/// * **Labels interleave within a rise.** While memory rises to a step's peak, work goes
///   from one phase to the next a few times at most (forward, then the first gradients of
///   backward; a run whose gradients outweigh its activations rises in backward too). When
///   consecutive labelled allocations there change label more than 8 times a rise and for
///   more than a fifth of them (activation checkpointing that recomputes under forward
///   frames, hooks, a profiler's synthetic frames, mixed-up stacks), the labels cut the run
///   into pieces that are not steps.
/// * **More steps than rises, made of strays.** A plan with more than `4 × rises + 8` steps
///   (236,208 "steps" for 12,000 iterations) is not believed. Nor is one with more than
///   `rises + 1 + rises / 16` steps when its labels hold at least as many strays (runs of
///   one or two allocations between two runs of one other label) as it has extra steps: a
///   few mixed-up stacks at a phase's edge open steps that are not there (3% of the stacks
///   mixed up gave 14 steps for 12). Clean stacks that find more steps than the shape (which
///   misses steps whose fall is shallow, and the steps of a run whose leak outgrows a step's
///   rise) have few strays, and are kept: a one-allocation optimizer step between backward
///   and the next forward is no stray (counted as one, a leaking run's 52 steps were judged
///   by the shape's 11).
///
/// O(n + s log n) for n allocations and s shape steps: each rise is found by binary search
/// in the allocations and its labels read once.
fn stack_incoherence(
    plan: &PhasePlan,
    bounds: &[(u32, u32)],
    curve: &Curve,
    replay: &Replay,
    evidence: &[Evidence],
) -> Option<String> {
    let rises = bounds.len() as u64;
    if rises == 0 {
        return None;
    }
    if let Some(reason) = labels_interleave(bounds, curve, replay, evidence) {
        return Some(reason);
    }
    let stack_steps = plan.steps.len() as u64;
    let extra = stack_steps.saturating_sub(rises);
    let made_of_strays = stack_steps > rises + 1 + rises / 16 && plan.short_runs as u64 >= extra;
    (stack_steps > 4 * rises + 8 || made_of_strays).then(|| {
        format!(
            "stack labels incoherent: they give {stack_steps} steps where memory rises and falls \
             {rises} times"
        )
    })
}

/// The first check of [`stack_incoherence`]: labels that change back and forth while memory
/// rises to each step's peak (`bounds`, the shape's steps). O(n + s log n).
fn labels_interleave(
    bounds: &[(u32, u32)],
    curve: &Curve,
    replay: &Replay,
    evidence: &[Evidence],
) -> Option<String> {
    let rises = bounds.len() as u64;
    let first_traced = replay.before_window_allocations as usize;
    let traced = replay.allocations.get(first_traced..)?;
    let evidence = evidence.get(first_traced..)?;
    // Labelled allocations in the rises, changes of label between consecutive ones, and
    // those outside their rise's majority kind.
    let (mut labelled, mut switches, mut minority) = (0u64, 0u64, 0u64);
    for &(start, end) in bounds {
        let (peak, _, _) = curve.peak_in(start, end);
        let from = traced.partition_point(|a| a.start() < start);
        let to = traced
            .partition_point(|a| a.start() <= peak)
            .min(evidence.len());
        let mut counts = [0u64; 3];
        let mut last = None;
        for e in evidence.get(from..to).unwrap_or(&[]) {
            let kind = match e {
                Evidence::Forward => 0,
                Evidence::Backward => 1,
                Evidence::Optimizer => 2,
                _ => continue,
            };
            counts[kind] += 1;
            switches += u64::from(last.is_some_and(|k| k != kind));
            last = Some(kind);
        }
        let majority = (0..3).max_by_key(|&k| counts[k]).unwrap_or(0);
        minority += counts.iter().sum::<u64>() - counts[majority];
        labelled += counts.iter().sum::<u64>();
    }
    if switches <= SWITCHES_PER_RISE * rises
        || (switches as f64) <= SWITCH_SHARE_LIMIT * labelled as f64
    {
        return None;
    }
    Some(format!(
        "stack labels incoherent: while memory rises, {:.0}% of the labelled allocations carry \
         another phase's frames than most of the rise ({switches} changes of label in {rises} \
         rises)",
        minority as f64 * 100.0 / labelled.max(1) as f64
    ))
}

/// Optimizer state created per step. The warm-up is the window's first optimizer phase, when
/// it creates some: a window with optimizer state from before it, or with an earlier optimizer
/// phase that created none, starts after the warm-up (a ring buffer's window of a long run).
/// Without this, the last step of such a window, cut short by an out-of-memory error in its
/// optimizer phase, was called a warm-up: the temporaries it held when the run stopped look
/// like state that stays.
fn mark_warmups(analysis: &mut StepAnalysis, replay: &Replay) {
    // Allocations from before the window come first.
    let state_before_window = replay
        .allocations
        .iter()
        .zip(&analysis.categories)
        .take_while(|(a, _)| a.before_window())
        .any(|(_, c)| *c == Category::OptimizerState);
    let mut seen_state = state_before_window;
    let mut seen_optimizer = false;
    for step in &mut analysis.steps {
        let Some(opt) = step.phases.iter().find(|p| p.kind == PhaseKind::Optimizer) else {
            continue;
        };
        let first = replay
            .allocations
            .partition_point(|a| a.alloc_event().is_none_or(|e| e < opt.start_event));
        let bytes = replay.allocations[first..]
            .iter()
            .zip(&analysis.categories[first..])
            .take_while(|(a, _)| a.alloc_event().is_some_and(|e| e <= opt.end_event))
            .filter(|(_, c)| **c == Category::OptimizerState)
            .fold(0u64, |acc, (a, _)| acc.saturating_add(a.size));
        step.optimizer_state_bytes = bytes;
        step.warmup = bytes > 0 && !seen_state && !seen_optimizer;
        seen_state |= bytes > 0;
        seen_optimizer = true;
    }
}

/// Phases of steps known only by their bounds: optimizer ranges (when annotations are
/// given) mark the optimizer phase; before it, forward runs to the step's peak and backward
/// after it. `stopped_last`: the recording stopped inside the last step, so what follows its
/// peak is a backward only if it releases at least half of what the step built up to it.
fn split_at_peaks(
    bounds: &[(u32, u32)],
    curve: &Curve,
    ranges: Option<&[NamedRange]>,
    stopped_last: bool,
) -> PhasePlan {
    let mut optimizer_starts: Vec<u32> = ranges
        .unwrap_or(&[])
        .iter()
        .filter(|r| r.name.starts_with("Optimizer.step#"))
        .filter_map(|r| r.start_event)
        .collect();
    // Sorted, so each step finds its first optimizer start by binary search (a scan per step
    // is quadratic in the steps).
    optimizer_starts.sort_unstable();
    let steps = bounds
        .iter()
        .enumerate()
        .map(|(index, &(start, end))| {
            let first_after = optimizer_starts.partition_point(|&o| o <= start);
            let optimizer = optimizer_starts
                .get(first_after)
                .copied()
                .filter(|&o| o <= end);
            let before_optimizer = optimizer.map_or(end, |o| o - 1);
            let mut peak = start;
            for e in start..=before_optimizer {
                if curve.at(e) > curve.at(peak) {
                    peak = e;
                }
            }
            let mut phases = vec![(PhaseKind::Forward, start)];
            let mut backward = peak < before_optimizer;
            if backward && stopped_last && index + 1 == bounds.len() {
                // A forward's temporaries fall back a little after its highest point too (the
                // step that ran out of memory in its forward, its last event the `oom`); a
                // backward releases much of what the forward built.
                let top = curve.at(peak);
                let low = (peak + 1..=before_optimizer)
                    .map(|e| curve.at(e))
                    .min()
                    .unwrap_or(top);
                let built = top.saturating_sub(curve.at(start));
                // `low` is at most `top`: the peak is the highest point before the optimizer.
                backward = low < top && top - low >= built / 2;
            }
            if backward {
                phases.push((PhaseKind::Backward, peak + 1));
            }
            if let Some(o) = optimizer {
                phases.push((PhaseKind::Optimizer, o));
            }
            phases
        })
        .collect();
    PhasePlan {
        setup: false,
        steps,
        short_runs: 0,
    }
}

/// Steps found from annotations.
struct AnnotatedSteps {
    /// The range name used.
    name: String,
    /// `(first event, last event)` of each step.
    bounds: Vec<(u32, u32)>,
    /// The recording stopped inside the last step: its `ProfilerStep#` range is open (an OOM,
    /// a snapshot taken mid-step, a live session), and it runs to the window's last event.
    stopped: bool,
}

/// The steps annotations give (see [`AnnotatedSteps`]).
fn annotation_bounds(
    ranges: &[NamedRange],
    time: &TimeAxis,
    truncated: bool,
    trace_len: u32,
) -> Option<AnnotatedSteps> {
    let first_time = time.time_of(0)?;
    // A range that starts before the first event of a truncated trace may have lost events.
    let complete = |r: &NamedRange| {
        r.start_time_us
            .is_some_and(|t| t > first_time || !truncated)
    };
    // ProfilerStep#N ranges are steps themselves.
    let mut profiler: Vec<(u32, u32)> = ranges
        .iter()
        .filter(|r| r.name.starts_with("ProfilerStep#") && complete(r))
        .filter_map(|r| Some((r.start_event?, r.end_event?)))
        .filter(|(s, e)| e > s)
        .collect();
    // Steps are disjoint and in order: a range that overlaps the one kept before it (nested
    // or repeated `ProfilerStep#` ranges in a hostile or merged file) is dropped, so every
    // step's measure costs its own events and no more (R overlapping ranges over the whole
    // trace cost R × n).
    profiler.sort_unstable();
    let mut last_end: Option<u32> = None;
    profiler.retain(|&(start, end)| {
        let keep = last_end.is_none_or(|last| start > last);
        if keep {
            last_end = Some(end);
        }
        keep
    });
    // The step the recording stopped in has a START and no END. Left out, its events went
    // to the step before, which then held two steps' work: the forward of a step that ran
    // out of memory counted as the optimizer phase of the one before it.
    let open = ranges
        .iter()
        .filter(|r| r.name.starts_with("ProfilerStep#") && complete(r) && r.end_time_us.is_none())
        .filter_map(|r| r.start_event)
        .max();
    let mut stopped = false;
    if let (Some(start), Some(last)) = (open, trace_len.checked_sub(1)) {
        if start < last && last_end.is_none_or(|end| start > end) {
            profiler.push((start, last));
            stopped = true;
        }
    }
    if profiler.len() >= 2 {
        return Some(AnnotatedSteps {
            name: "ProfilerStep#".to_string(),
            bounds: profiler,
            stopped,
        });
    }
    // Otherwise a step ends where an optimizer step ends.
    let is_optimizer = |name: &str| {
        if name.starts_with(crate::sites::MODULE_RANGE_PREFIX) {
            return false;
        }
        let lower = name.to_ascii_lowercase();
        lower.contains("optimizer") && lower.contains("step")
    };
    let name = ranges.iter().find(|r| is_optimizer(&r.name))?.name.clone();
    let mut ends: Vec<u32> = ranges
        .iter()
        .filter(|r| r.name == name)
        .filter_map(|r| r.end_event)
        .collect();
    ends.sort_unstable();
    ends.dedup();
    // The first step runs from the window's start to the first optimizer end, unless the
    // window starts mid-run (then its start is unknown).
    let mut bounds: Vec<(u32, u32)> = Vec::new();
    if let Some(&first_end) = ends.first().filter(|&&e| e > 0 && !truncated) {
        bounds.push((0, first_end));
    }
    bounds.extend(ends.windows(2).map(|w| (w[0] + 1, w[1])));
    Some(AnnotatedSteps {
        name,
        bounds,
        stopped: false,
    })
}

/// [`shape_bounds`], plus the first step of an untruncated trace, found by its call site:
/// a training loop's steps begin with an allocation from the same stack, so the earliest
/// allocation before the first found step with the stack (and size; with another size when
/// none has it, as batch shapes vary) that begins the next step begins the first one (with
/// the `segment_alloc`s right before it, which it caused); failing that, when the source
/// gives categories, its first input or activation. The first step must hold the highest
/// point before the next one. O(n log n).
fn shape_steps(curve: &Curve, replay: &Replay) -> Vec<(u32, u32)> {
    let mut bounds = shape_bounds_of(
        curve.len(),
        |i| curve.at(i as u32),
        |lo, hi| curve.min_max(lo, hi),
    );
    // Allocations are in start order; traced ones follow those from before the window.
    let traced = &replay.allocations[replay.before_window_allocations as usize..];
    refine_starts(&mut bounds, curve, traced);
    let Some(&(first_start, _)) = bounds.first() else {
        return bounds;
    };
    if replay.truncated {
        return bounds;
    }
    let opener = traced
        .iter()
        .skip_while(|a| a.start() < first_start)
        .take_while(|a| a.start() <= bounds[0].1)
        .find(|a| a.alloc_event().is_some());
    let Some(opener) = opener else {
        return bounds;
    };
    let before = traced.partition_point(|a| a.start() < first_start);
    let candidates: Vec<&crate::replay::Allocation> = if opener.stack.is_some() {
        // The same call site and size; then the same call site alone: with batches of
        // varying shape (sequence lengths), each step's first tensor has another size.
        let same_size = traced[..before]
            .iter()
            .find(|a| a.stack == opener.stack && a.size == opener.size);
        let same_site = traced[..before].iter().find(|a| a.stack == opener.stack);
        same_size.into_iter().chain(same_site).collect()
    } else {
        // No stacks: the step's opening sizes, in order, recognise it (a training loop
        // makes the same allocations each step).
        let opening: Vec<u64> = traced[before..]
            .iter()
            .take_while(|a| a.start() <= bounds[0].1)
            .filter(|a| a.alloc_event().is_some())
            .take(OPENING_SIZES)
            .map(|a| a.size)
            .collect();
        // The shape starts a step after the dip that ends the one before, so a step's first
        // allocations may be the last of the step before (an optimizer's one kept block,
        // made after backward's dip), which the first step has no step before it to make:
        // the opening is also tried without its first one or two sizes.
        (0..=OPENING_SKIPPABLE)
            .filter(|&skip| opening.len() >= skip + OPENING_SIZES / 2)
            .find_map(|skip| first_match_of_sizes(&traced[..before], &opening[skip..]))
            .map(|i| &traced[i])
            .into_iter()
            .collect()
    };
    // Sorted once: a run with 100k segments must not scan them all per event.
    let mut segment_allocs: Vec<u32> = replay
        .segments
        .iter()
        .filter_map(|s| s.alloc_event)
        .collect();
    segment_allocs.sort_unstable();
    let low_peak = bounds
        .iter()
        .map(|&(s, e)| curve.peak_in(s, e).1)
        .min()
        .unwrap_or(0);
    // A source that names its categories (PyTorch's memory profiler) knows the first
    // tensor a forward pass makes: the first input or activation, after the set-up's
    // parameters. Tried when no call site opens the first step (the plot data of
    // `export_memory_timeline` has synthetic blocks: no call site and no size repeats).
    let first_forward_tensor = replay
        .categories_source
        .is_some()
        .then(|| {
            traced[..before].iter().find(|a| {
                matches!(
                    replay.source_category(a.alloc_event()),
                    Some(Category::Input | Category::Activation)
                )
            })
        })
        .flatten();
    for a in candidates.into_iter().chain(first_forward_tensor) {
        let mut start = a.start();
        while start > 0 && segment_allocs.binary_search(&(start - 1)).is_ok() {
            start -= 1;
        }
        // Only a real step: it must reach the high region like the others do, and hold the
        // highest point before the next step (a candidate in the valley after the first
        // step's peak would leave that peak in the set-up and make a step of the valley).
        let this_peak = curve
            .min_max(start as usize, first_start as usize)
            .map_or(0, |(_, max)| max);
        let peak_before = curve.min_max(0, start as usize).map_or(0, |(_, max)| max);
        if start + 1 < first_start
            && this_peak as f64 >= 0.5 * low_peak as f64
            && this_peak >= peak_before
        {
            bounds.insert(0, (start, first_start - 1));
            break;
        }
    }
    bounds
}

/// Allocation sizes that recognise a step's opening in a run without stacks.
const OPENING_SIZES: usize = 8;

/// Leading sizes of a step's opening that may belong to the step before it (see
/// `shape_steps`).
const OPENING_SKIPPABLE: usize = 2;

/// Index of the first allocation in `allocations` from which the allocated sizes run as
/// `sizes` (allocations without an alloc event are skipped in both); `None` when they never
/// do, or `sizes` is empty. O(n × sizes.len()).
fn first_match_of_sizes(allocations: &[crate::replay::Allocation], sizes: &[u64]) -> Option<usize> {
    if sizes.is_empty() {
        return None;
    }
    let allocated: Vec<(usize, u64)> = allocations
        .iter()
        .enumerate()
        .filter(|(_, a)| a.alloc_event().is_some())
        .map(|(i, a)| (i, a.size))
        .collect();
    allocated
        .windows(sizes.len())
        .find(|w| w.iter().map(|&(_, size)| size).eq(sizes.iter().copied()))
        .map(|w| w[0].0)
}

/// Moves a step's start forward to its opening call site where the curve's shape put it too
/// early. A warm-up step can dip low at the end of its backward pass and then allocate state
/// (an optimizer's moments) worth too little to count as a climb, so the valley's last dip
/// lies before that state and the next step would begin with it. A step begins with an
/// allocation the step before also made (same stack and size): allocations from the start
/// of a found step on that the step before never made belong to the step before, as long
/// as the curve stays in the valley (within 30% of the way from the dip to the step's
/// peak, the low level of [`shape_bounds`]' hysteresis). The step before ends just before the opener, on the first event of the flat stretch
/// leading to it (as the shape's boundaries do).
fn refine_starts(bounds: &mut [(u32, u32)], curve: &Curve, traced: &[crate::replay::Allocation]) {
    use foldhash::HashSet;
    let first_of = |event: u32| traced.partition_point(|a| a.start() < event);
    for k in 0..bounds.len() {
        let (start, end) = bounds[k];
        let prev_start = if k == 0 { 0 } else { bounds[k - 1].0 };
        if start == 0 {
            continue;
        }
        let dip = start - 1;
        let (floor, peak) = (curve.at(dip), (start..=end).map(|e| curve.at(e)).max());
        let Some(peak) = peak.filter(|&p| p > floor) else {
            continue;
        };
        let ceiling = floor + (peak - floor) / 10 * 3;
        let earlier: HashSet<_> = traced[first_of(prev_start)..first_of(start)]
            .iter()
            .filter(|a| a.stack.is_some())
            .map(|a| (a.stack, a.size))
            .collect();
        if earlier.is_empty() {
            continue;
        }
        // Only allocations the step before never made move the start, not frees.
        let (mut opener, mut skipped) = (None, false);
        for a in traced[first_of(start)..]
            .iter()
            .take_while(|a| a.start() <= end)
        {
            // The curve before this allocation must still be in the valley.
            if curve.at(a.start() - 1) > ceiling {
                break;
            }
            if a.stack.is_some() && earlier.contains(&(a.stack, a.size)) {
                opener = Some(a.start());
                break;
            }
            skipped = true;
        }
        let Some(opener) = opener.filter(|_| skipped) else {
            continue;
        };
        if opener <= start || (k > 0 && opener - 1 <= bounds[k - 1].0) {
            continue;
        }
        let mut new_end = opener - 1;
        while new_end > dip && curve.at(new_end - 1) == curve.at(new_end) {
            new_end -= 1;
        }
        if new_end <= dip || new_end + 1 > end {
            continue;
        }
        bounds[k].0 = new_end + 1;
        if k > 0 {
            bounds[k - 1].1 = new_end;
        }
    }
}

/// Step `(first event, last event)` pairs from the curve's shape (see the module docs).
///
/// A step ends at the bottom of the last dip of the valley after its high region; the next
/// starts right after. The first step is reported only when the trace shows a fall before it (the
/// end of the step before): in an untruncated trace the first forward pass rises straight
/// from the parameters' allocation, and nothing in the curve tells where one ends and the
/// other begins ([`find_steps`] then finds it by its call site).
pub fn shape_bounds(values: &[u64]) -> Vec<(u32, u32)> {
    let min_max = |lo: usize, hi: usize| {
        let range = values.get(lo..hi)?;
        range.iter().min().copied().zip(range.iter().max().copied())
    };
    shape_bounds_of(values.len(), |i| values[i], min_max)
}

/// [`shape_bounds`] of `n` values read through `value`, with `min_max(lo, hi)` the (min, max)
/// of `lo..hi` (`None` when empty): a curve keeps its values compressed and scans ranges
/// faster than value by value.
fn shape_bounds_of(
    n: usize,
    value: impl Fn(usize) -> u64,
    min_max: impl Fn(usize, usize) -> Option<(u64, u64)>,
) -> Vec<(u32, u32)> {
    if n < 4 {
        return Vec::new();
    }
    // Heights are taken above the floor the rest of the run returns to (the lowest value from
    // each point on): a run whose leak raises the floor by more than a step's rise still
    // shows every step as a rise and a fall. (Thresholds from the whole run's lowest and
    // highest values missed them: a 52-step run keeping 1 MiB a step of 30 MiB steps gave
    // 11.) Where the floor holds still this is the run's low level after its set-up ramp,
    // as before.
    let floors = || SuffixFloors::new(n, &value, &min_max);
    let amplitude = floors()
        .enumerate()
        .map(|(i, floor)| value(i) - floor)
        .max()
        .unwrap_or(0) as f64;
    if amplitude <= 0.0 {
        return Vec::new();
    }
    // High regions as (enter, exit); a region still high at the end is dropped.
    let mut regions: Vec<(usize, usize)> = Vec::new();
    let mut high_since: Option<usize> = None;
    for (i, floor) in floors().enumerate() {
        let height = (value(i) - floor) as f64;
        match high_since {
            None if height >= 0.6 * amplitude => high_since = Some(i),
            Some(enter) if height <= 0.3 * amplitude => {
                regions.push((enter, i));
                high_since = None;
            }
            _ => {}
        }
    }
    // The bottom of the valley's last dip: scanning back from the rise into the next high
    // region, the lowest point before the curve climbs more than 10% of its range again. (The
    // valley's overall minimum can lie earlier: a first step allocates optimizer state after
    // its backward pass, so its floor ends higher than it dipped.)
    // Small differences (optimizer temporaries, tiny state) do not move the boundary back.
    let last_dip = |from: usize, to: usize| -> usize {
        let (climb, notable) = (0.1 * amplitude, 0.02 * amplitude);
        let mut best = to.saturating_sub(1).max(from);
        for i in (from..to).rev() {
            let (v, b) = (value(i) as f64, value(best) as f64);
            if v + notable < b || (v <= b && i + 1 == best) {
                best = i;
            } else if v > b + climb {
                break;
            }
        }
        best
    };
    // Step ends: the valley after each high region (the last valley runs to the trace end).
    let mut ends = Vec::new();
    if let Some(&(enter, _)) = regions.first() {
        if enter > 0 {
            let b = last_dip(0, enter);
            let fell =
                min_max(0, b + 1).is_some_and(|(_, m)| (m - value(b)) as f64 >= 0.3 * amplitude);
            if fell {
                ends.push(b);
            }
        }
    }
    for (k, &(_, exit)) in regions.iter().enumerate() {
        let to = regions.get(k + 1).map_or(n, |r| r.0);
        ends.push(last_dip(exit, to));
    }
    ends.windows(2)
        .filter(|w| w[1] > w[0] + 1)
        .map(|w| ((w[0] + 1) as u32, w[1] as u32))
        .collect()
}

/// The lowest value from each point to the end (`min(value(i..n))`) for `i = 0..n` in order,
/// in O(n / BLOCK + BLOCK) memory: the minimum of each later block (from `min_max`), and the
/// suffix minima inside the block being read, made when it is entered. O(n) in all.
struct SuffixFloors<'a, V, M> {
    n: usize,
    value: &'a V,
    /// `after[b]`: the lowest value in blocks `b + 1..`.
    after: Vec<u64>,
    /// Suffix minima of the current block.
    inside: Vec<u64>,
    i: usize,
    _min_max: std::marker::PhantomData<&'a M>,
}

const FLOOR_BLOCK: usize = 4096;

impl<'a, V: Fn(usize) -> u64, M: Fn(usize, usize) -> Option<(u64, u64)>> SuffixFloors<'a, V, M> {
    fn new(n: usize, value: &'a V, min_max: &'a M) -> Self {
        let blocks = n.div_ceil(FLOOR_BLOCK);
        let mut after = vec![u64::MAX; blocks];
        let mut lowest = u64::MAX;
        for b in (0..blocks).rev() {
            after[b] = lowest;
            let (lo, hi) = (b * FLOOR_BLOCK, ((b + 1) * FLOOR_BLOCK).min(n));
            lowest = lowest.min(min_max(lo, hi).map_or(u64::MAX, |(min, _)| min));
        }
        SuffixFloors {
            n,
            value,
            after,
            inside: Vec::with_capacity(FLOOR_BLOCK),
            i: 0,
            _min_max: std::marker::PhantomData,
        }
    }
}

impl<V: Fn(usize) -> u64, M> Iterator for SuffixFloors<'_, V, M> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.i >= self.n {
            return None;
        }
        let (b, k) = (self.i / FLOOR_BLOCK, self.i % FLOOR_BLOCK);
        if k == 0 {
            let end = ((b + 1) * FLOOR_BLOCK).min(self.n);
            self.inside.clear();
            self.inside.resize(end - self.i, 0);
            let mut lowest = self.after[b];
            for j in (self.i..end).rev() {
                lowest = lowest.min((self.value)(j));
                self.inside[j - self.i] = lowest;
            }
        }
        self.i += 1;
        Some(self.inside[k])
    }
}

fn measure_step(
    index: usize,
    start: u32,
    end: u32,
    curve: &Curve,
    time: &TimeAxis,
    replay: &Replay,
) -> Step {
    let (peak_event, peak_bytes, min_bytes) = curve.peak_in(start, end);
    let (start_bytes, end_bytes) = (curve.at(start), curve.at(end));
    let before_bytes = curve.before(start);
    // Allocations made in (start, end] still live after end.
    let axis = replay.axis_len();
    let first = replay.allocations.partition_point(|a| a.start() <= start);
    let (mut outliving_count, mut outliving_bytes) = (0u64, 0u64);
    for a in replay.allocations[first..]
        .iter()
        .take_while(|a| a.start() <= end)
    {
        if a.end(Lifetime::Active, axis) > end {
            outliving_count += 1;
            outliving_bytes = outliving_bytes.saturating_add(a.size);
        }
    }
    Step {
        index,
        start_event: start,
        peak_event,
        end_event: end,
        before_bytes,
        start_bytes,
        peak_bytes,
        end_bytes,
        min_bytes,
        start_time_us: time.time_of(start),
        peak_time_us: time.time_of(peak_event),
        end_time_us: time.time_of(end),
        outliving_count,
        outliving_bytes,
        phases: Vec::new(),
        partial: false,
        optimizer_state_bytes: 0,
        warmup: false,
    }
}

/// `a - b`, 0 when it does not fit an `i64`.
fn signed_difference(a: u64, b: u64) -> i64 {
    i64::try_from(i128::from(a) - i128::from(b)).unwrap_or(0)
}

/// Median of pairwise slopes (Theil–Sen) of `values` against their index.
pub fn theil_sen(values: &[f64]) -> f64 {
    // Long runs: subsample the pairs to keep this O(n) in practice.
    let stride = (values.len() / 200).max(1);
    let mut slopes = Vec::new();
    for i in (0..values.len()).step_by(stride) {
        for j in (i + 1..values.len()).step_by(stride) {
            slopes.push((values[j] - values[i]) / (j - i) as f64);
        }
    }
    if slopes.is_empty() {
        return 0.0;
    }
    slopes.sort_unstable_by(f64::total_cmp);
    let mid = slopes.len() / 2;
    if slopes.len() % 2 == 1 {
        slopes[mid]
    } else {
        (slopes[mid - 1] + slopes[mid]) / 2.0
    }
}

/// The steps drift is measured over: whole steps (a partial one starts inside the window),
/// without the warm-up step when at least two others remain, because its lower peak is the
/// optimizer state it has not created yet, not a trend (four steps with a warm-up first gave a
/// Theil–Sen peak slope of half a warm-up's state per step). By reference: copies of 68,000
/// steps with their phases were 35 MB at a 10M-entry run's peak.
fn steps_for_drift(steps: &[Step]) -> Vec<&Step> {
    let whole = steps.iter().filter(|s| !s.partial);
    let steady: Vec<&Step> = whole.clone().filter(|s| !s.warmup).collect();
    if steady.len() >= 2 {
        steady
    } else {
        whole.collect()
    }
}

fn drift(steps: &[&Step], tolerance_percent: f64) -> Drift {
    // The floor a step leaves behind; its minimum can lie before a warm-up step allocates
    // optimizer state, which is not a leak.
    let mins: Vec<f64> = steps.iter().map(|s| s.end_bytes as f64).collect();
    let peaks: Vec<f64> = steps.iter().map(|s| s.peak_bytes as f64).collect();
    let min_slope = theil_sen(&mins);
    let peak_slope = theil_sen(&peaks);
    let top = peaks.iter().copied().fold(0.0, f64::max);
    let span = steps.len().saturating_sub(1) as f64;
    let percent = |slope: f64| {
        if top > 0.0 {
            slope * span / top * 100.0
        } else {
            0.0
        }
    };
    let (min_growth_percent, peak_growth_percent) = (percent(min_slope), percent(peak_slope));
    Drift {
        min_bytes_per_step: min_slope,
        peak_bytes_per_step: peak_slope,
        min_growth_percent,
        peak_growth_percent,
        tolerance_percent,
        leak_suspected: min_growth_percent > tolerance_percent,
        peak_growth_suspected: peak_growth_percent > tolerance_percent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn optimizer_range(start_event: u32) -> NamedRange {
        NamedRange {
            name: format!("Optimizer.step#Adam.step#{start_event}"),
            start_time_us: Some(i64::from(start_event)),
            end_time_us: None,
            start_event: Some(start_event),
            end_event: None,
            depth: 0,
        }
    }

    #[test]
    fn split_at_peaks_finds_each_steps_first_optimizer_start_in_unsorted_annotations() {
        // Three steps of ten events; the curve rises to event 4 of each step, then falls.
        let deltas: Vec<i128> = (0..30)
            .map(|e| if e % 10 <= 4 { 100 } else { -100 })
            .collect();
        let curve = Curve::from_deltas(0, &deltas);
        // Unsorted, two in step 0 (the earlier one counts), one on a step's first event (it
        // belongs to no step: an optimizer start must come after the step's start).
        let ranges: Vec<NamedRange> = [27, 8, 7, 17, 10].map(optimizer_range).to_vec();
        let plan = split_at_peaks(&[(0, 9), (10, 19), (20, 29)], &curve, Some(&ranges), false);
        assert_eq!(
            plan.steps,
            vec![
                vec![
                    (PhaseKind::Forward, 0),
                    (PhaseKind::Backward, 5),
                    (PhaseKind::Optimizer, 7)
                ],
                vec![
                    (PhaseKind::Forward, 10),
                    (PhaseKind::Backward, 15),
                    (PhaseKind::Optimizer, 17)
                ],
                vec![
                    (PhaseKind::Forward, 20),
                    (PhaseKind::Backward, 25),
                    (PhaseKind::Optimizer, 27)
                ],
            ]
        );
    }
}
