//! Phases of a training step: forward, backward and optimizer, and the set-up before the
//! first step.
//!
//! A training step runs **forward** (activations pile up), **backward** (the autograd engine
//! frees them and creates gradients) and the **optimizer** step (state and temporaries, then
//! the gradients are zeroed). Any part can be missing at the ends of a recorded window; a
//! forward-only capture (inference) is one step with only a forward phase. Memory set up
//! before the first step (the model, its weights) is the **set-up** phase, not a step.
//!
//! Phases come from the best evidence a file has, in this order:
//!
//! 1. **Stacks.** Every allocation's stack is classified ([`Evidence`]): the autograd engine
//!    (C++ `torch::autograd::Engine::…` or generated `…Backward…` nodes, Python
//!    `_engine_run_backward`, `torch/autograd/__init__.py:backward`, `torch/_tensor.py:backward`,
//!    or any function named `backward`/`*_backward`) marks backward work; frames under an
//!    `optim*` package or functions named like an optimizer (`adam`, `sgd`, `optimizer`,
//!    `zero_grad`) the optimizer; `nn.Module` calls or functions named `forward`/`*_forward`
//!    the forward pass; module construction, `Module.to`/`cuda`/`_apply`, `load_state_dict`,
//!    `torch/nn/init.py` or functions named `init_*` the set-up. Allocations with other user
//!    frames (data loading, the loss, logging) join the phase around them. Python-only stacks
//!    record no frames on the autograd thread, so an allocation without frames after forward
//!    work is backward work.
//! 2. **Annotations** (`record_function` ranges from `external_annotations`):
//!    `Optimizer.step#…` and `Optimizer.zero_grad#…` mark optimizer work,
//!    `enumerate(DataLoader)#…` the start of a forward pass, and any range whose name says
//!    `forward`, `backward` or `optimizer` its kind; they label allocations the stacks leave
//!    open. Without any stack evidence, `ProfilerStep#N` ranges (or the ends of optimizer
//!    ranges) give the steps.
//! 3. **The curve's shape** when a file has neither (generated runs without stacks,
//!    `context=None` recordings): steps where the curve rises and falls; forward up to the
//!    step's peak, backward after it.
//!
//! Stack evidence that contradicts the curve (labels that flip back and forth while memory
//! rises, or far more steps than the curve has rises) is dropped for annotations, then the
//! curve's shape, and the analysis says why (`StepAnalysis::fallback_reason`).
//!
//! A new step begins where forward work follows backward or optimizer work; allocations with
//! neutral stacks just before it (loading the next batch) open it. A phase runs from its
//! first event to the event before the next phase, so a step's phases tile it exactly and the
//! first phase of the window starts at event 0.

use serde::Serialize;

use memsnap_format::{Frame, Snapshot, StackId};

use crate::curve::{Curve, TimeAxis};
use crate::ranges::NamedRange;
use crate::replay::Replay;

/// The kind of a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PhaseKind {
    /// Before the first step: the model and its weights are built or loaded.
    Setup,
    Forward,
    Backward,
    Optimizer,
}

impl PhaseKind {
    /// The name used in reports and JSON: `setup`, `forward`, `backward`, `optimizer`.
    pub fn name(self) -> &'static str {
        match self {
            PhaseKind::Setup => "setup",
            PhaseKind::Forward => "forward",
            PhaseKind::Backward => "backward",
            PhaseKind::Optimizer => "optimizer",
        }
    }
}

impl std::fmt::Display for PhaseKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What an allocation's stack says about the work that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Evidence {
    Backward,
    Optimizer,
    Forward,
    Setup,
    /// Frames, none of which marks a phase (user code between phases: data, loss, logging).
    Neutral,
    /// An empty stack, or no `frames` at all.
    NoFrames,
}

impl Evidence {
    fn phase(self) -> Option<PhaseKind> {
        match self {
            Evidence::Backward => Some(PhaseKind::Backward),
            Evidence::Optimizer => Some(PhaseKind::Optimizer),
            Evidence::Forward => Some(PhaseKind::Forward),
            Evidence::Setup => Some(PhaseKind::Setup),
            Evidence::Neutral | Evidence::NoFrames => None,
        }
    }
}

const BACKWARD: u8 = 1;
const OPTIMIZER: u8 = 2;
const FORWARD: u8 = 4;
const SETUP: u8 = 8;
/// A C++ (or other native) frame: the file was recorded with `stacks="all"`.
const NATIVE: u8 = 16;

/// Classifies stacks (see the module docs), each frame and stack once.
#[derive(Clone, Debug)]
pub struct StackClassifier {
    frame_flags: Vec<u8>,
    /// Per stack: 0 = not yet classified, else `flags | 0x80`.
    stack_flags: Vec<u8>,
    /// No frame of the file is native: stacks were recorded with `stacks="python"`.
    python_only: bool,
}

impl StackClassifier {
    pub fn new(snapshot: &Snapshot) -> Self {
        let frame_flags: Vec<u8> = snapshot.frames.iter().map(frame_flags).collect();
        let python_only = !frame_flags.iter().any(|f| f & NATIVE != 0);
        StackClassifier {
            frame_flags,
            stack_flags: vec![0; snapshot.stacks.len()],
            python_only,
        }
    }

    /// Whether the file's stacks hold Python frames only (no native frames anywhere).
    pub fn python_only(&self) -> bool {
        self.python_only
    }

    /// The evidence of one stack (`None`: no `frames` recorded).
    pub fn classify(&mut self, snapshot: &Snapshot, stack: Option<StackId>) -> Evidence {
        let Some(stack) = stack else {
            return Evidence::NoFrames;
        };
        let Some(slot) = self.stack_flags.get(stack.index()).copied() else {
            return Evidence::NoFrames;
        };
        let flags = if slot != 0 {
            slot & 0x7f
        } else {
            let ids = snapshot.stacks.get(stack);
            if ids.is_empty() {
                self.stack_flags[stack.index()] = 0x80 | 0x40;
                return Evidence::NoFrames;
            }
            let flags = ids.iter().fold(0u8, |acc, f| {
                acc | self.frame_flags.get(f.index()).copied().unwrap_or(0)
            });
            self.stack_flags[stack.index()] = 0x80 | flags;
            flags
        };
        if flags & 0x40 != 0 {
            Evidence::NoFrames
        } else if flags & BACKWARD != 0 {
            Evidence::Backward
        } else if flags & OPTIMIZER != 0 {
            Evidence::Optimizer
        } else if flags & FORWARD != 0 {
            Evidence::Forward
        } else if flags & SETUP != 0 {
            Evidence::Setup
        } else {
            Evidence::Neutral
        }
    }
}

/// The function's own name: the last `::` component of a C++ or Rust symbol, without
/// arguments, template arguments, closures or a Rust hash suffix.
fn short_name(name: &str) -> &str {
    let head = name.split('(').next().unwrap_or(name);
    let mut parts: Vec<&str> = head.split("::").collect();
    while let Some(last) = parts.last() {
        let is_hash = last.len() == 17
            && last.starts_with('h')
            && last[1..].bytes().all(|b| b.is_ascii_hexdigit());
        if parts.len() > 1 && (is_hash || last.starts_with('{') || last.is_empty()) {
            parts.pop();
        } else {
            break;
        }
    }
    let last = parts.last().copied().unwrap_or(head);
    last.split('<').next().unwrap_or(last).trim()
}

fn named(short: &str, word: &str) -> bool {
    short == word
        || short.strip_suffix(word).is_some_and(|p| p.ends_with('_'))
        || short.strip_prefix(word).is_some_and(|s| s.starts_with('_'))
}

fn frame_flags(frame: &Frame) -> u8 {
    // A frame an import made up (a category's name): no evidence of anything.
    if frame.is_synthetic() {
        return 0;
    }
    let name = frame.name.as_str();
    let path = frame.filename.replace('\\', "/");
    let python = path.ends_with(".py");
    let short = short_name(name);
    let lower = short.to_ascii_lowercase();
    let mut flags = 0;
    if !python && (name.contains("::") || !path.is_empty() && !path.contains('<')) {
        flags |= NATIVE;
    }
    let in_torch = |suffix: &str| path.ends_with(suffix);

    let backward = name.contains("torch::autograd::Engine::")
        || name.contains("torch::autograd::python::PythonEngine")
        || (name.contains("torch::autograd::generated::") && name.contains("Backward"))
        || (python
            && ((in_torch("torch/autograd/graph.py") && name == "_engine_run_backward")
                || (in_torch("torch/autograd/__init__.py") && name == "backward")
                || (in_torch("torch/_tensor.py") && name == "backward")))
        || named(&lower, "backward");
    if backward {
        flags |= BACKWARD;
    }

    let optim_package = python
        && path
            .split('/')
            .any(|c| c.to_ascii_lowercase().starts_with("optim"));
    let optimizer = optim_package
        || ["adam", "sgd", "optimizer", "zero_grad", "lamb"]
            .iter()
            .any(|w| lower.contains(w))
        || named(&lower, "optim");
    if optimizer {
        flags |= OPTIMIZER;
    }

    let module_call = python
        && in_torch("torch/nn/modules/module.py")
        && matches!(name, "_call_impl" | "_wrapped_call_impl" | "__call__");
    if module_call || named(&lower, "forward") {
        flags |= FORWARD;
    }

    let setup = (python && name == "__init__")
        || (python
            && in_torch("torch/nn/modules/module.py")
            && matches!(
                name,
                "_apply" | "to" | "cuda" | "to_empty" | "load_state_dict" | "_load_from_state_dict"
            ))
        || (python && (in_torch("torch/nn/init.py") || in_torch("torch/serialization.py")))
        || matches!(
            short,
            "reset_parameters"
                | "from_pretrained"
                | "load_state_dict"
                | "build_model"
                | "load_model"
        )
        || lower.starts_with("init_");
    if setup {
        flags |= SETUP;
    }
    flags
}

/// Per traced allocation (in [`Replay::allocations`] order, from `before_window_allocations`
/// on), the evidence its stack gives.
pub fn allocation_evidence(snapshot: &Snapshot, replay: &Replay) -> (Vec<Evidence>, bool) {
    let mut classifier = StackClassifier::new(snapshot);
    let evidence = replay
        .allocations
        .iter()
        .map(|a| classifier.classify(snapshot, a.stack))
        .collect();
    (evidence, classifier.python_only())
}

/// Growth or release over an event range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Slope {
    /// Bytes gained (forward) or released (backward); negative if the other way.
    pub bytes: i64,
    pub events: u32,
    pub duration_us: Option<i64>,
    /// `bytes` per second; `None` without times or for a zero duration.
    pub bytes_per_s: Option<f64>,
    /// `bytes` per event; 0 for zero events.
    pub bytes_per_event: f64,
}

impl Slope {
    /// `bytes` over `events` events, timed from `start_time_us` to `end_time_us`.
    pub(crate) fn over(
        bytes: i64,
        events: u32,
        start_time_us: Option<i64>,
        end_time_us: Option<i64>,
    ) -> Slope {
        let duration_us = match (start_time_us, end_time_us) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        Slope {
            bytes,
            events,
            duration_us,
            bytes_per_s: duration_us
                .filter(|&d| d > 0)
                .map(|d| bytes as f64 / (d as f64 / 1e6)),
            bytes_per_event: if events > 0 {
                bytes as f64 / f64::from(events)
            } else {
                0.0
            },
        }
    }
}

/// One phase on the event axis.
///
/// Its slope is computed from its fields when asked ([`Phase::slope`]), not kept: a run of
/// 303,030 steps has 909,090 phases, and the slope was 56 of a phase's 144 bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Phase {
    pub kind: PhaseKind,
    /// First and last event, inclusive.
    pub start_event: u32,
    pub end_event: u32,
    /// Live bytes (active curve) when the phase begins, before its first event.
    pub start_bytes: u64,
    /// Live bytes after its last event.
    pub end_bytes: u64,
    pub peak_bytes: u64,
    /// First event after which the phase's peak is reached.
    pub peak_event: u32,
    pub start_time_us: Option<i64>,
    pub end_time_us: Option<i64>,
    /// Allocations made in the phase.
    pub allocations: u64,
    pub allocated_bytes: u64,
}

/// A phase as JSON: its fields with its slope flattened in (`bytes`, `events`,
/// `duration_us`, `bytes_per_s`, `bytes_per_event`) after the times.
impl Serialize for Phase {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct PhaseJson {
            kind: PhaseKind,
            start_event: u32,
            end_event: u32,
            start_bytes: u64,
            end_bytes: u64,
            peak_bytes: u64,
            peak_event: u32,
            start_time_us: Option<i64>,
            end_time_us: Option<i64>,
            #[serde(flatten)]
            slope: Slope,
            allocations: u64,
            allocated_bytes: u64,
        }
        PhaseJson {
            kind: self.kind,
            start_event: self.start_event,
            end_event: self.end_event,
            start_bytes: self.start_bytes,
            end_bytes: self.end_bytes,
            peak_bytes: self.peak_bytes,
            peak_event: self.peak_event,
            start_time_us: self.start_time_us,
            end_time_us: self.end_time_us,
            slope: self.slope(),
            allocations: self.allocations,
            allocated_bytes: self.allocated_bytes,
        }
        .serialize(serializer)
    }
}

impl Phase {
    /// `end_bytes - start_bytes` over the phase's events (first to last, inclusive), per
    /// second (timed from its first event to its last: the pause before a step, the host
    /// loading the next batch, is not part of its forward pass) and per event. O(1).
    pub fn slope(&self) -> Slope {
        let delta =
            i64::try_from(i128::from(self.end_bytes) - i128::from(self.start_bytes)).unwrap_or(0);
        let events = self
            .end_event
            .saturating_sub(self.start_event)
            .saturating_add(1);
        Slope::over(delta, events, self.start_time_us, self.end_time_us)
    }

    pub(crate) fn measure(
        kind: PhaseKind,
        start: u32,
        end: u32,
        curve: &Curve,
        time: &TimeAxis,
        replay: &Replay,
    ) -> Phase {
        let start_bytes = curve.before(start);
        let (peak_event, peak_bytes, _) = curve.peak_in(start, end);
        let end_bytes = curve.at(end);
        let first = replay
            .allocations
            .partition_point(|a| a.alloc_event().is_none_or(|e| e < start));
        let (mut allocations, mut allocated_bytes) = (0u64, 0u64);
        for a in replay.allocations[first..]
            .iter()
            .take_while(|a| a.alloc_event().is_some_and(|e| e <= end))
        {
            allocations += 1;
            allocated_bytes = allocated_bytes.saturating_add(a.size);
        }
        Phase {
            kind,
            start_event: start,
            end_event: end,
            start_bytes,
            end_bytes,
            peak_bytes,
            peak_event,
            start_time_us: time.time_of(start),
            end_time_us: time.time_of(end),
            allocations,
            allocated_bytes,
        }
    }
}

/// A phase on the event axis: its step (`None` for the set-up), kind and inclusive range.
/// (20 bytes: a run of 303,030 steps has 909,090 of them at once; with the step a `usize`
/// they were 32.)
pub(crate) type PhaseSpan = (Option<u32>, PhaseKind, u32, u32);

/// Phase boundaries of a window: the set-up, then steps as lists of `(kind, first event)`.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PhasePlan {
    /// First event of the set-up phase (always 0) when there is one.
    pub setup: bool,
    /// Per step, its phases' kinds and first events, in order.
    pub steps: Vec<Vec<(PhaseKind, u32)>>,
    /// Strays among the stack labels, before they were merged: runs of one or two labelled
    /// allocations between two runs of one other label. Clean stacks have few, mixed-up ones
    /// many (see `steps::stack_incoherence`); a short run between two different labels (a
    /// one-allocation optimizer step between backward and forward) is not one.
    pub short_runs: usize,
}

impl PhasePlan {
    /// `(kind, start, end)` of every phase, steps in order, with the step index (`None` for
    /// the set-up).
    pub fn phases(&self, trace_len: u32) -> Vec<PhaseSpan> {
        // Made in place, each phase ending where the next begins (a list of the starts
        // first was 24 bytes a phase more, up to twice that while it grew: 909,090 phases
        // in a run of 303,030 steps).
        let count = usize::from(self.setup) + self.steps.iter().map(Vec::len).sum::<usize>();
        let mut spans: Vec<PhaseSpan> = Vec::with_capacity(count);
        let setup = self.setup.then_some((None, PhaseKind::Setup, 0));
        let starts = setup.into_iter().chain(
            self.steps
                .iter()
                .enumerate()
                .flat_map(|(i, step)| step.iter().map(move |&(k, s)| (Some(i as u32), k, s))),
        );
        for (step, kind, start) in starts {
            if let Some(previous) = spans.last_mut() {
                previous.3 = start.saturating_sub(1).max(previous.2);
            }
            spans.push((step, kind, start, 0));
        }
        if let Some(last) = spans.last_mut() {
            last.3 = trace_len.saturating_sub(1).max(last.2);
        }
        spans
    }
}

/// The next open slot at or after an index, with slots closed one at a time: a disjoint-set
/// forest whose root is the first open slot (path splitting), each closed slot pointing at
/// a later slot.
///
/// A closed slot starts pointing straight at the first open slot after it, and after a
/// range's slots are closed one by one (each pointing at the next) [`NextOpen::compress`]
/// points them all at the open slot after the range. Without both, the slots the stacks
/// labelled formed chains as long as the runs of them (closed slot `i` pointing at `i + 1`):
/// each annotation range starting inside a run walked to its end, and at 10M entries with
/// 27,000 step ranges that walk, a cache miss a slot, was a third of the viewer's CPU
/// time. Now a find follows one pointer unless later ranges closed the slot it lands on:
/// O((n + r) log n) in all for n slots and r ranges (path splitting without union by rank),
/// in practice a few steps a find.
struct NextOpen {
    /// `parent[i] == i`: slot `i` is open (`parent[n]` is the end, always open).
    parent: Vec<u32>,
    /// Pointers followed by every `find` and `compress` so far (tests count the work).
    steps: u64,
}

impl NextOpen {
    /// O(n).
    fn new(n: usize, is_open: impl Fn(usize) -> bool) -> Self {
        let mut parent = vec![n as u32; n + 1];
        let mut next_open = n as u32;
        for i in (0..n).rev() {
            if is_open(i) {
                next_open = i as u32;
            }
            parent[i] = next_open;
        }
        NextOpen { parent, steps: 0 }
    }

    /// The first open slot at or after `i` (`n` when none is).
    fn find(&mut self, i: usize) -> usize {
        let mut i = i.min(self.parent.len() - 1);
        while self.parent[i] as usize != i {
            let next = self.parent[i] as usize;
            self.parent[i] = self.parent[next];
            self.steps += 1;
            i = next;
        }
        i
    }

    fn close(&mut self, i: usize) {
        if i + 1 < self.parent.len() {
            self.parent[i] = i as u32 + 1;
        }
    }

    /// Points every slot on the path from `i` to `end` at `end`, the first open slot at or
    /// after `i`: what a range that closed its slots one by one leaves behind.
    fn compress(&mut self, mut i: usize, end: usize) {
        while i < end {
            let next = self.parent[i] as usize;
            self.parent[i] = end as u32;
            self.steps += 1;
            i = next;
        }
    }
}

/// Labels the open slots of `from..to` with `kind` and closes them. O(slots closed) plus the
/// finds ([`NextOpen`]).
fn label_open_slots(
    open: &mut NextOpen,
    labels: &mut [Option<PhaseKind>],
    from: usize,
    to: usize,
    kind: PhaseKind,
) {
    let first = open.find(from);
    let mut i = first;
    while i < to {
        labels[i] = Some(kind);
        open.close(i);
        i = open.find(i + 1);
    }
    open.compress(first, i);
}

/// A run of equal phase labels over traced allocations: `(kind, first index, last index,
/// labelled allocations)`. In `u32` (traced allocations are trace entries, which `u32`
/// indexes): 16 bytes a run instead of 32, and noisy stacks give a 10M-entry run millions.
pub(crate) type LabelRun = (PhaseKind, u32, u32, u32);

/// Folds stray runs into the phase around them: a run of one or two labelled allocations
/// between two longer runs of one kind (X, y, X with y tiny) belongs to that phase, and the
/// three become one run.
///
/// One pass, O(runs): each run is read once and the merged run stays the last one written,
/// so it can absorb the next stray at once, exactly as a left-to-right scan that merges in
/// place would. (Merging in place with `Vec::drain` moved the tail for every merge: a
/// 10M-entry run with noisy stacks has hundreds of thousands of label runs, and `summary`
/// spent 478 s in `memmove`.)
pub(crate) fn merge_stray_runs(runs: &[LabelRun]) -> Vec<LabelRun> {
    let mut merged: Vec<LabelRun> = Vec::with_capacity(runs.len());
    let mut i = 0;
    while i < runs.len() {
        let cur = runs[i];
        if let (Some(prev), Some(&next)) = (merged.last_mut(), runs.get(i + 1)) {
            if cur.3 <= 2 && prev.0 == next.0 && prev.3 > cur.3 && next.3 > cur.3 {
                *prev = (
                    prev.0,
                    prev.1,
                    next.2,
                    prev.3.saturating_add(cur.3).saturating_add(next.3),
                );
                i += 2;
                continue;
            }
        }
        merged.push(cur);
        i += 1;
    }
    merged
}

/// The kind a `record_function` range's name gives the work inside it.
fn range_kind(name: &str) -> Option<PhaseKind> {
    // A module call's range names the module, not the work (`blocks.0.feed_forward`).
    if name.starts_with(crate::sites::MODULE_RANGE_PREFIX) {
        return None;
    }
    if name.starts_with("Optimizer.step#") || name.starts_with("Optimizer.zero_grad#") {
        return Some(PhaseKind::Optimizer);
    }
    if name.starts_with("enumerate(DataLoader)#") {
        return Some(PhaseKind::Forward);
    }
    let lower = name.to_ascii_lowercase();
    if lower.contains("backward") {
        Some(PhaseKind::Backward)
    } else if lower.contains("optimizer") {
        Some(PhaseKind::Optimizer)
    } else if lower.contains("forward") {
        Some(PhaseKind::Forward)
    } else {
        None
    }
}

/// Phases from stack evidence (helped by annotations); `None` when no allocation's stack or
/// annotation says which phase it belongs to.
///
/// O((n + r) α(n) + r log r) for n traced allocations and r annotation ranges: labels and
/// their runs are one pass each, every range is placed by binary search and each open label
/// is written once ([`NextOpen`]), stray runs merge in one pass ([`merge_stray_runs`]).
pub(crate) fn plan_from_evidence(
    replay: &Replay,
    evidence: &[Evidence],
    python_only: bool,
    ranges: &[NamedRange],
) -> Option<PhasePlan> {
    // Traced allocations in alloc order, with their phase label (None = neutral).
    let first_traced = replay.before_window_allocations as usize;
    let traced = replay.allocations.get(first_traced..)?;
    let evidence = evidence.get(first_traced..)?.get(..traced.len())?;
    // Traced allocations are in alloc order, each with its alloc event: their starts are the
    // alloc events, ascending (read from them rather than copied, 13 MB at 10M entries).
    let mut labels: Vec<Option<PhaseKind>> = evidence.iter().map(|e| e.phase()).collect();
    let no_frames: Vec<bool> = evidence.iter().map(|e| *e == Evidence::NoFrames).collect();
    // Without a stack that says forward, backward or optimizer, annotations alone do not
    // make a plan here (see `crate::steps` for steps from annotations).
    if !labels.iter().any(|l| {
        matches!(
            l,
            Some(PhaseKind::Forward | PhaseKind::Backward | PhaseKind::Optimizer)
        )
    }) {
        return None;
    }
    // Annotations label what the stacks leave open, outer ranges first (an allocation takes
    // the kind of the outermost range around it that has one).
    let mut ordered: Vec<(u32, PhaseKind, usize, usize)> = ranges
        .iter()
        .filter_map(|r| {
            let (kind, s, e) = (range_kind(&r.name)?, r.start_event?, r.end_event?);
            let from = traced.partition_point(|a| a.start() < s);
            let to = traced.partition_point(|a| a.start() <= e);
            Some((r.depth, kind, from, to))
        })
        .collect();
    ordered.sort_by_key(|r| r.0);
    if !ordered.is_empty() {
        // Each open label is written once: `open` skips over labelled allocations, so
        // 300,000 ranges over a 10M-entry run (or nested ranges each spanning most of it)
        // cost O((n + ranges) α(n)), not ranges × n.
        let mut open = NextOpen::new(labels.len(), |i| labels[i].is_none());
        for &(_, kind, from, to) in &ordered {
            label_open_slots(&mut open, &mut labels, from, to, kind);
        }
    }
    // Allocations without frames: backward work after forward work when stacks are
    // Python-only (the autograd thread records none), else part of the phase around them.
    let mut last: Option<PhaseKind> = None;
    for (label, &empty) in labels.iter_mut().zip(&no_frames) {
        match *label {
            Some(PhaseKind::Setup) if last.is_some_and(|k| k != PhaseKind::Setup) => {
                // Construction after the first step (a lazily built module) is not set-up.
                *label = None;
            }
            Some(k) => last = Some(k),
            None if empty && python_only => {
                if matches!(last, Some(PhaseKind::Forward | PhaseKind::Backward)) {
                    *label = Some(PhaseKind::Backward);
                    last = *label;
                }
            }
            None => {}
        }
    }
    // Runs of equal labels: (kind, first index, last index, count).
    let mut runs: Vec<LabelRun> = Vec::new();
    for (i, label) in labels.iter().enumerate() {
        let Some(kind) = *label else { continue };
        let i = u32::try_from(i).unwrap_or(u32::MAX);
        match runs.last_mut() {
            Some(run) if run.0 == kind => {
                run.2 = i;
                run.3 += 1;
            }
            _ => runs.push((kind, i, i, 1)),
        }
    }
    drop((labels, no_frames));
    // Strays: runs of one or two allocations between two runs of one other label (`F F B F
    // F`). A short run between two different labels is the run's structure (an optimizer
    // step of one allocation between backward and the next forward, every step).
    let short_runs = runs
        .windows(3)
        .filter(|w| w[1].3 <= 2 && w[0].0 == w[2].0)
        .count();
    // The label runs go as soon as they are merged: at 10M entries with noisy stacks they
    // are tens of MB at the analysis' peak.
    let merged = merge_stray_runs(&runs);
    drop(runs);
    let runs = merged;
    let mut plan = PhasePlan {
        short_runs,
        ..PhasePlan::default()
    };
    let mut prev_last: Option<usize> = None;
    for &(kind, first, last_index, _) in &runs {
        let (first, last_index) = (first as usize, last_index as usize);
        // Neutral allocations between the previous run and this one open a new step, and
        // otherwise belong to the previous phase.
        let opens_step = match (kind, plan.steps.last().and_then(|s| s.last())) {
            (PhaseKind::Setup, _) => false,
            (_, None) => true,
            (PhaseKind::Forward, Some((PhaseKind::Backward | PhaseKind::Optimizer, _))) => true,
            (PhaseKind::Backward, Some((PhaseKind::Optimizer, _))) => true,
            _ => false,
        };
        let first_index = match prev_last {
            Some(p) if opens_step => p + 1,
            _ => first,
        };
        let start = if prev_last.is_none() {
            0
        } else {
            traced[first_index].start()
        };
        prev_last = Some(last_index);
        if kind == PhaseKind::Setup {
            plan.setup = true;
            continue;
        }
        if opens_step {
            plan.steps.push(vec![(kind, start)]);
        } else if let Some(step) = plan.steps.last_mut() {
            if step.last().map(|p| p.0) != Some(kind) {
                step.push((kind, start));
            }
        }
    }
    Some(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slope is computed from the phase's fields (it was kept, 56 bytes a phase): the
    /// bytes and events from its first event to its last, timed between them, and written to
    /// JSON flattened between the times and the allocations, as when it was a field.
    #[test]
    fn a_phase_slope_is_computed_from_its_fields_and_written_flat() {
        let phase = Phase {
            kind: PhaseKind::Forward,
            start_event: 10,
            end_event: 19,
            start_bytes: 1000,
            end_bytes: 6000,
            peak_bytes: 7000,
            peak_event: 15,
            start_time_us: Some(2_000_000),
            end_time_us: Some(2_500_000),
            allocations: 4,
            allocated_bytes: 9000,
        };
        let slope = phase.slope();
        assert_eq!(
            (slope.bytes, slope.events, slope.duration_us),
            (5000, 10, Some(500_000))
        );
        assert_eq!(slope.bytes_per_s, Some(10_000.0));
        assert_eq!(slope.bytes_per_event, 500.0);
        let released = Phase {
            kind: PhaseKind::Backward,
            start_bytes: 6000,
            end_bytes: 1000,
            end_time_us: None,
            ..phase.clone()
        };
        let slope = released.slope();
        assert_eq!(
            (slope.bytes, slope.duration_us, slope.bytes_per_s),
            (-5000, None, None)
        );
        assert_eq!(
            serde_json::to_string(&phase).unwrap(),
            concat!(
                r#"{"kind":"forward","start_event":10,"end_event":19,"start_bytes":1000,"#,
                r#""end_bytes":6000,"peak_bytes":7000,"peak_event":15,"start_time_us":2000000,"#,
                r#""end_time_us":2500000,"bytes":5000,"events":10,"duration_us":500000,"#,
                r#""bytes_per_s":10000.0,"bytes_per_event":500.0,"allocations":4,"#,
                r#""allocated_bytes":9000}"#
            )
        );
    }

    #[test]
    fn module_ranges_are_never_phase_evidence_whatever_their_path_says() {
        assert_eq!(
            range_kind("blocks.0.feed_forward"),
            Some(PhaseKind::Forward)
        );
        for path in ["blocks.0.feed_forward", "loss_backward", "optimizer_step"] {
            let name = format!("{}{path}", crate::sites::MODULE_RANGE_PREFIX);
            assert_eq!(range_kind(&name), None, "{name}");
        }
    }
    use proptest::prelude::*;

    /// The merge as it was written before it became one pass (in place, `Vec::drain` per
    /// merge): the reference for what the one-pass merge must give.
    fn merge_in_place(mut runs: Vec<LabelRun>) -> Vec<LabelRun> {
        let mut i = 1;
        while i + 1 < runs.len() {
            let (prev, cur, next) = (runs[i - 1], runs[i], runs[i + 1]);
            if cur.3 <= 2 && prev.0 == next.0 && prev.3 > cur.3 && next.3 > cur.3 {
                runs[i - 1] = (prev.0, prev.1, next.2, prev.3 + cur.3 + next.3);
                runs.drain(i..=i + 1);
            } else {
                i += 1;
            }
        }
        runs
    }

    fn runs_of(spec: &[(u8, u8)]) -> Vec<LabelRun> {
        let kinds = [
            PhaseKind::Forward,
            PhaseKind::Backward,
            PhaseKind::Optimizer,
            PhaseKind::Setup,
        ];
        let mut next = 0;
        spec.iter()
            .map(|&(kind, count)| {
                let count = u32::from(count % 5) + 1;
                let run = (kinds[usize::from(kind % 4)], next, next + count - 1, count);
                next += count;
                run
            })
            .collect()
    }

    proptest! {
        #[test]
        fn one_pass_stray_merge_equals_the_in_place_merge(
            spec in proptest::collection::vec((0u8..4, 0u8..5), 0..200)
        ) {
            let runs = runs_of(&spec);
            prop_assert_eq!(merge_stray_runs(&runs), merge_in_place(runs));
        }
    }

    /// Regression: noisy stacks gave a 10M-entry run hundreds of thousands of label runs, and
    /// merging the strays one `drain` at a time took 478 s. Alternating long and stray runs
    /// (every stray merges) at 2M runs: one pass, so this ends at once.
    #[test]
    fn merging_two_million_alternating_strays_is_one_pass() {
        let spec: Vec<(u8, u8)> = (0..2_000_001u32)
            .map(|i| if i % 2 == 0 { (0, 4) } else { (1, 0) })
            .collect();
        let merged = merge_stray_runs(&runs_of(&spec));
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].3, 1_000_001 * 5 + 1_000_000);
    }

    /// Annotation labels are written through `NextOpen`: slots labelled by stacks are never
    /// handed out, a slot is handed out once, and the search ends at the end.
    #[test]
    fn next_open_skips_closed_slots_and_ends_at_the_end() {
        let mut open = NextOpen::new(6, |i| i != 1 && i != 2);
        assert_eq!(open.find(1), 3);
        open.close(3);
        assert_eq!(open.find(0), 0);
        assert_eq!(open.find(1), 4);
        open.close(4);
        open.close(5);
        assert_eq!(open.find(1), 6);
        assert_eq!(open.find(99), 6);
    }

    /// The viewer spent a third of its CPU time at 10M entries walking chains of slots the
    /// stacks had labelled (closed slot `i` pointing at `i + 1`), once per annotation range
    /// starting inside them. Stacks label all but every 1,000th slot of 1M; 20,000 ranges
    /// start inside those runs, nested ranges cover them again: the pointers followed stay
    /// under slots + ranges.
    #[test]
    fn ranges_starting_inside_runs_labelled_by_stacks_do_not_walk_the_runs() {
        let n = 1_000_000;
        let mut labels: Vec<Option<PhaseKind>> = (0..n)
            .map(|i| (i % 1000 != 0).then_some(PhaseKind::Forward))
            .collect();
        let mut open = NextOpen::new(n, |i| labels[i].is_none());
        let mut ranges = 0u64;
        for depth in 0..3 {
            for k in 0..(20_000 / (depth + 1)) {
                let from = (k * 50 + 7 * depth) % n;
                let to = (from + 2_000 * (depth + 1)).min(n);
                label_open_slots(&mut open, &mut labels, from, to, PhaseKind::Backward);
                ranges += 1;
            }
        }
        assert!(labels.iter().all(|l| l.is_some()), "every slot is labelled");
        // 84,279 here; the chains followed 5,010,547.
        let budget = n as u64 + ranges;
        assert!(
            open.steps <= budget,
            "{} pointers followed for {n} slots and {ranges} ranges (budget {budget})",
            open.steps
        );
    }
}
