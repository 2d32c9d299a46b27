//! Editing one device's trace the way a fix would change the run, so that the edited trace can
//! be replayed through the allocator.
//!
//! The edit works on the original trace's events and the analysis of them (allocations with
//! their alloc and free events, categories, steps and phases, module chains):
//!
//! - **Optimizer state** (`percent`): every optimizer-state allocation's size is scaled (rounded
//!   up); at 0 its alloc and frees are left out (offloaded to the host).
//! - **Activation checkpointing** of a module node ([`crate::node`]): in each step's forward,
//!   the node's calls are found in event order. A named node's calls are the
//!   `memsnap.module: PATH` ranges whose path matches its pattern (a call holds the
//!   allocations made between its range's start and end). A chain prefix's call ends where the
//!   code inside it goes back to an earlier line, or where an allocation outside the node
//!   comes. A call's activations (allocated in it, freed after the
//!   forward) are freed right after the call, and the call's allocations (activations and the
//!   transients it made and freed) are made again, in their order, at the start of its backward:
//!   before the backward's first allocation after the releases of what the forward made after
//!   the call and the backward released before the call's first release (what ran after the
//!   call in forward has its backward first; for a block, that is the next block's backward).
//!   The activations are then freed where the recording freed them.
//!
//!   (Only the node's own calls used to order the backward, so a node called once per forward,
//!   `blocks.4` alone, had its recomputation at the backward's first allocation, where
//!   everything is still live, and the prediction kept the recorded peak.)
//! - **Stopping a leak** (`release`): each allocation a leaking site
//!   ([`memsnap_analysis::leaks`]) made in a step and still held at the end of the window is
//!   freed right after the step's last event, as it would be if the code dropped it (kept a
//!   number, not the tensor; moved it to the host). The site's memory from before the window
//!   is taken out of the start state by the caller ([`crate::Advisor`]).
//! - **Micro-batches** (`count`): each step's forward and backward run `count` times; the
//!   allocations made and released within them (activations, transients, input gradients) are
//!   divided by `count` (rounded up) and made in every micro-batch; what outlives them
//!   (gradients) and everything else is made once, in the first.
//!
//! Replayed allocations take fresh addresses (above every recorded one) so that no two live
//! allocations of the edited trace share one; the recorded segment events stay as they were
//! (the replay makes its own segment decisions; they only hint at addresses).
//!
//! Complexity: O(n + m) in the trace's entries and allocations, plus O(f log f) per checkpointed
//! node and step for the f allocations of the step's forward (where each call's backward
//! starts), plus O(n) per micro-batch of the steps' forward and backward.

use foldhash::HashMap;
use std::sync::Arc;

use memsnap_analysis::modules::ModulePaths;
use memsnap_analysis::{Category, PhaseKind, Replay, StepAnalysis};
use memsnap_format::{Action, FrameId, Snapshot, TraceEntry};

use crate::node::{match_path, ModuleNode};

/// A module node and the range of its calls in a forward pass (first and last index,
/// inclusive, see [`crate::node`]; `None`: every call).
pub type CheckpointTarget = (ModuleNode, Option<(u32, u32)>);

/// What to change in a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Edit {
    /// Module nodes to checkpoint, each with the range of its calls in a forward pass to
    /// checkpoint (first and last index, inclusive; `None`: every call).
    pub checkpoint: Vec<CheckpointTarget>,
    /// Micro-batches per step (1: as recorded).
    pub micro_batches: u32,
    /// Optimizer state in percent of the recorded (100: as recorded).
    pub optimizer_state_percent: u8,
    /// Allocations freed right after the last event of the step that made them (a leak
    /// stopped: [`memsnap_analysis::leaks`]'s kept allocations), each with that event.
    pub release: Vec<(u32, u32)>,
}

impl Edit {
    pub fn none() -> Self {
        Edit {
            checkpoint: Vec::new(),
            micro_batches: 1,
            optimizer_state_percent: 100,
            release: Vec::new(),
        }
    }
}

/// One entry of the edited trace, before addresses are given.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// The recorded entry.
    Orig(u32),
    /// The allocation made again (checkpointing's recomputation).
    Alloc(u32),
    /// The allocation freed now (`free_requested` and `free_completed`).
    FreeNow(u32),
}

/// The analysis of one device the edits read.
pub struct Analysed<'a> {
    pub snapshot: &'a Snapshot,
    pub trace: &'a [TraceEntry],
    pub replay: &'a Replay,
    pub steps: &'a StepAnalysis,
    /// Module chain of every allocation, in `replay.allocations` order.
    pub chains: &'a [Arc<[FrameId]>],
    /// The device's named module calls (empty without `memsnap.module:` ranges).
    pub paths: &'a ModulePaths,
    /// Allocation index of each trace entry that allocates or frees one.
    pub alloc_of_event: Vec<Option<u32>>,
}

impl<'a> Analysed<'a> {
    pub fn new(
        snapshot: &'a Snapshot,
        trace: &'a [TraceEntry],
        replay: &'a Replay,
        steps: &'a StepAnalysis,
        chains: &'a [Arc<[FrameId]>],
        paths: &'a ModulePaths,
    ) -> Self {
        let mut alloc_of_event = vec![None; trace.len()];
        for (i, a) in replay.allocations.iter().enumerate() {
            for e in [a.alloc_event(), a.free_requested(), a.free_completed()]
                .into_iter()
                .flatten()
            {
                if let Some(slot) = alloc_of_event.get_mut(e as usize) {
                    *slot = Some(i as u32);
                }
            }
        }
        Analysed {
            snapshot,
            trace,
            replay,
            steps,
            chains,
            paths,
            alloc_of_event,
        }
    }

    fn category(&self, a: u32) -> Category {
        self.steps
            .categories
            .get(a as usize)
            .copied()
            .unwrap_or(Category::Unknown)
    }

    /// Optimizer state made before the window and still held at its end (indices into the
    /// replay's allocations): a ring buffer's window of a long run starts long after the
    /// warm-up made the state, which the start state then holds. O(m).
    pub fn state_before_window(&self) -> Vec<u32> {
        self.replay
            .allocations
            .iter()
            .enumerate()
            .take_while(|(_, a)| a.before_window())
            .filter(|&(i, a)| {
                a.free_requested().is_none() && self.category(i as u32) == Category::OptimizerState
            })
            .map(|(i, _)| i as u32)
            .collect()
    }

    /// `(forward start, forward end, backward start, backward end)` of each step that has both.
    pub fn passes(&self) -> Vec<(u32, u32, u32, u32)> {
        self.steps
            .steps
            .iter()
            .filter_map(|s| {
                let f = s.phases.iter().find(|p| p.kind == PhaseKind::Forward)?;
                let b = s.phases.iter().rfind(|p| p.kind == PhaseKind::Backward)?;
                (f.end_event < b.start_event).then_some((
                    f.start_event,
                    f.end_event,
                    b.start_event,
                    b.end_event,
                ))
            })
            .collect()
    }
}

/// One call of a checkpointed module node in a forward pass.
struct Call {
    /// Its index among the node's calls ([`crate::node`]: the number at a named pattern's
    /// `*`, else its place in event order).
    index: u64,
    /// Its allocations, in order.
    members: Vec<u32>,
    /// Last event of the call.
    end: u32,
}

/// The indices of `node`'s calls in the first step's forward, sorted, each once (empty without
/// a step that has a forward and a backward). O(events in that forward).
pub fn call_indices(an: &Analysed<'_>, node: &ModuleNode) -> Vec<u64> {
    let Some(&(fs, fe, _, _)) = an.passes().first() else {
        return Vec::new();
    };
    let mut indices: Vec<u64> = CallFinder::new(an, node)
        .calls(an, 0, fs, fe)
        .iter()
        .map(|c| c.index)
        .collect();
    indices.sort_unstable();
    indices.dedup();
    indices
}

/// Finds a node's calls in each forward (see the module docs); made once per node.
enum CallFinder<'n> {
    Chain(&'n [FrameId]),
    /// For each recorded module path, whether it matches the pattern, and the number at its
    /// `*` ([`match_path`]): O(p) once, for p paths.
    Named(Vec<Option<Option<u64>>>),
}

impl<'n> CallFinder<'n> {
    fn new(an: &Analysed<'_>, node: &'n ModuleNode) -> Self {
        match node {
            ModuleNode::Chain(chain) => CallFinder::Chain(chain),
            ModuleNode::Named(pattern) => CallFinder::Named(
                an.paths
                    .paths
                    .iter()
                    .map(|path| match_path(pattern, path))
                    .collect(),
            ),
        }
    }

    /// The node's calls in the forward `[fs, fe]`; `since`: the first event after the step
    /// before's backward.
    fn calls(&self, an: &Analysed<'_>, since: u32, fs: u32, fe: u32) -> Vec<Call> {
        match self {
            CallFinder::Chain(chain) => chain_calls(an, chain, fs, fe),
            CallFinder::Named(matches) => named_calls(an, matches, since, fs, fe),
        }
    }
}

/// The module ranges whose path `matches` that start in the forward `[fs, fe]`, or between the
/// step before's backward (`since`) and it: the forward phase starts at the analysis' first
/// forward allocation, which can come after the first block's range began (a segment mapped
/// first, or allocations the analysis gave the set-up). One inside an earlier one of them (a
/// module calling itself) is part of that call; a range still open ends with the forward.
/// O(log r + ranges and events in the forward) for r ranges.
fn named_calls(
    an: &Analysed<'_>,
    matches: &[Option<Option<u64>>],
    since: u32,
    fs: u32,
    fe: u32,
) -> Vec<Call> {
    let module_calls = an.paths.calls();
    let first = module_calls.partition_point(|c| c.start_event < since.min(fs));
    let last_event = (an.trace.len() as u32).saturating_sub(1);
    let mut out: Vec<Call> = Vec::new();
    for c in module_calls[first..]
        .iter()
        .take_while(|c| c.start_event <= fe)
    {
        let Some(&Some(number)) = matches.get(c.path as usize) else {
            continue;
        };
        if out.last().is_some_and(|prev| c.start_event <= prev.end) {
            continue;
        }
        let end = c.end_event.min(fe).min(last_event);
        let members = (c.start_event..=end)
            .filter(|&e| an.trace[e as usize].action == Action::Alloc)
            .filter_map(|e| an.alloc_of_event[e as usize])
            .collect();
        out.push(Call {
            index: number.unwrap_or(out.len() as u64),
            members,
            end,
        });
    }
    out
}

/// A chain prefix's calls in the forward `[fs, fe]` (see the module docs). O(events in the
/// forward).
fn chain_calls(an: &Analysed<'_>, node: &[FrameId], fs: u32, fe: u32) -> Vec<Call> {
    let mut calls: Vec<Call> = Vec::new();
    let mut open: Option<(Call, i64)> = None;
    let Some(last) = (an.trace.len() as u32).checked_sub(1) else {
        return calls;
    };
    let call = |members: Vec<u32>, end: u32, calls: &Vec<Call>| Call {
        index: calls.len() as u64,
        members,
        end,
    };
    for e in fs..=fe.min(last) {
        if an.trace[e as usize].action != Action::Alloc {
            continue;
        }
        let Some(a) = an.alloc_of_event[e as usize] else {
            continue;
        };
        let chain = &an.chains[a as usize];
        let member = chain.len() >= node.len() && chain[..node.len()] == *node;
        if !member {
            if let Some((mut c, _)) = open.take() {
                c.end = e - 1;
                calls.push(c);
            }
            continue;
        }
        // Where inside the node's call the code is: the line of the frame below the node.
        let position = chain
            .get(node.len())
            .map_or(0, |f| an.snapshot.frames.get(*f).line.as_i64().unwrap_or(0));
        match open.take() {
            Some((mut c, last)) if position >= last => {
                c.members.push(a);
                open = Some((c, position));
            }
            Some((mut c, _)) => {
                c.end = e - 1;
                calls.push(c);
                open = Some((call(vec![a], e, &calls), position));
            }
            None => open = Some((call(vec![a], e, &calls), position)),
        }
    }
    if let Some((mut c, _)) = open {
        c.end = fe;
        calls.push(c);
    }
    calls
}

/// Bytes the recomputation allocates again and the forward allocated in all, over the steps
/// (the extra forward work, by bytes).
#[derive(Clone, Copy, Debug, Default)]
pub struct Recompute {
    pub bytes: u64,
    pub forward_bytes: u64,
}

/// An edited trace, with the recorded entry each of its entries stands for.
#[derive(Clone, Debug, Default)]
pub struct Edited {
    pub trace: Vec<TraceEntry>,
    /// For each entry of `trace`, the index of the recorded entry it stands for: a recorded
    /// entry (resized, or repeated in every micro-batch) its own index; an allocation made
    /// again by checkpointing's recomputation, or freed right after its call, the recorded
    /// entry at whose place it is inserted. Non-decreasing, except across the micro-batches of
    /// a step, whose copies each run over the step's forward and backward again. The
    /// predicted curve is drawn on the recorded axis through it
    /// ([`crate::PredictedCurve`]).
    pub origin: Vec<u32>,
    /// The allocations (indices into the analysis' allocations) made in the checkpointed
    /// calls, in every step: what the checkpointing frees early and makes again.
    pub checkpointed: Vec<u32>,
    pub recompute: Recompute,
}

/// The edited trace of the device, the recorded entry each of its entries stands for, and the
/// recomputation's size.
pub fn edit_trace(snapshot: &Snapshot, an: &Analysed<'_>, edit: &Edit) -> Edited {
    let n = an.trace.len();
    let allocations = &an.replay.allocations;
    let mut before: HashMap<u32, Vec<Op>> = HashMap::default();
    let mut after: HashMap<u32, Vec<Op>> = HashMap::default();
    let mut recompute = Recompute::default();
    let mut checkpointed_allocations: Vec<u32> = Vec::new();
    let passes = an.passes();
    // The pass (forward start to backward end) holding an event: passes are in event order
    // and do not overlap, so a binary search.
    let pass_of = |e: u32| {
        let i = passes.partition_point(|p| p.3 < e);
        passes.get(i).filter(|p| p.0 <= e)
    };
    for a in allocations {
        if let Some(e) = a.alloc_event() {
            if pass_of(e).is_some_and(|p| e <= p.1) {
                recompute.forward_bytes = recompute.forward_bytes.saturating_add(a.size);
            }
        }
    }
    for (node, range) in &edit.checkpoint {
        let finder = CallFinder::new(an, node);
        let mut since = 0;
        for &(fs, fe, bs, be) in &passes {
            let step_calls = finder.calls(an, since, fs, fe);
            since = be.saturating_add(1);
            // A checkpointed call's activations: allocated in it, released in this step's
            // backward.
            let mut checkpointed: Vec<(u32, Call, Vec<u32>)> = Vec::new();
            for call in step_calls {
                if !range.is_none_or(|(first, last)| {
                    (u64::from(first)..=u64::from(last)).contains(&call.index)
                }) {
                    continue;
                }
                let activations: Vec<u32> = call
                    .members
                    .iter()
                    .copied()
                    .filter(|&a| {
                        allocations[a as usize]
                            .free_requested()
                            .is_some_and(|f| f >= bs && f <= be)
                    })
                    .collect();
                let Some(first_release) = activations
                    .iter()
                    .filter_map(|&a| allocations[a as usize].free_requested())
                    .min()
                else {
                    continue;
                };
                checkpointed_allocations.extend(&call.members);
                after
                    .entry(call.end)
                    .or_default()
                    .extend(activations.iter().map(|&a| Op::FreeNow(a)));
                checkpointed.push((first_release, call, activations));
            }
            if checkpointed.is_empty() {
                continue;
            }
            // Where each call's backward starts: after the releases of what the forward made
            // after the call and the backward released before the call's first release (the
            // work that ran after the call in forward has its backward before the call's).
            // One sweep from the forward's end, the releases seen so far in a sorted set:
            // O((f + c) log f) for f forward allocations and c calls.
            let made_in_forward: Vec<(u32, u32)> = (fs..=fe.min(n.saturating_sub(1) as u32))
                .filter(|&e| an.trace[e as usize].action == Action::Alloc)
                .filter_map(|e| {
                    let a = an.alloc_of_event[e as usize]?;
                    let f = allocations[a as usize].free_requested()?;
                    (f >= bs && f <= be).then_some((e, f))
                })
                .collect();
            let mut by_end: Vec<usize> = (0..checkpointed.len()).collect();
            by_end.sort_by_key(|&i| std::cmp::Reverse(checkpointed[i].1.end));
            let mut seen = std::collections::BTreeSet::new();
            let mut next = made_in_forward.len();
            let mut starts = vec![bs; checkpointed.len()];
            for i in by_end {
                let (first_release, call, _) = &checkpointed[i];
                while next > 0 && made_in_forward[next - 1].0 > call.end {
                    next -= 1;
                    seen.insert(made_in_forward[next].1);
                }
                if let Some(&r) = seen.range(..*first_release).next_back() {
                    starts[i] = r + 1;
                }
            }
            // In backward order, so that calls whose recomputations fall at one place make
            // theirs in that order.
            let mut order: Vec<usize> = (0..checkpointed.len()).collect();
            order.sort_by_key(|&i| checkpointed[i].0);
            for i in order {
                let (_, call, activations) = &checkpointed[i];
                // The recomputation goes before the backward's first allocation after the
                // work before it.
                let at = (starts[i]..n as u32)
                    .find(|&e| an.trace[e as usize].action == Action::Alloc)
                    .unwrap_or(n as u32);
                let ops = before.entry(at).or_default();
                let mut kept = activations.clone();
                kept.sort_unstable();
                for &m in &call.members {
                    let a = &allocations[m as usize];
                    let is_activation = kept.binary_search(&m).is_ok();
                    let transient = a.free_requested().is_some_and(|f| f <= call.end);
                    if !is_activation && !transient {
                        continue;
                    }
                    // An activation the recorded backward released before the recomputation
                    // point (a noisy stack can put a call's backward later than some of its
                    // releases) is not made again: nothing after the point would release it,
                    // and the replay would keep it for good, a leak every step.
                    if is_activation && a.free_requested().is_some_and(|f| f < at) {
                        continue;
                    }
                    ops.push(Op::Alloc(m));
                    recompute.bytes = recompute.bytes.saturating_add(a.size);
                    if transient {
                        ops.push(Op::FreeNow(m));
                    }
                }
            }
        }
    }

    // Optimizer state from before the window is in the start state, which the advisor takes
    // it out of (`release_before_window`); smaller, it is made again before the first event
    // (offloaded: not at all), where the allocator lays it out as the run would have.
    if edit.optimizer_state_percent < 100 {
        let made_again = before.entry(0).or_default();
        made_again.extend(an.state_before_window().into_iter().map(Op::Alloc));
    }

    // A stopped leak: what a step kept is freed when the step ends.
    for &(a, end) in &edit.release {
        after.entry(end).or_default().push(Op::FreeNow(a));
    }

    // The edited order of operations, each with the recorded event it stands at.
    let mut ops: Vec<(u32, Op)> = Vec::with_capacity(n);
    for e in 0..=n as u32 {
        if let Some(b) = before.remove(&e) {
            ops.extend(b.into_iter().map(|op| (e, op)));
        }
        if e < n as u32 {
            ops.push((e, Op::Orig(e)));
            if let Some(x) = after.remove(&e) {
                ops.extend(x.into_iter().map(|op| (e, op)));
            }
        }
    }

    let k = edit.micro_batches.max(1);
    // Allocations made and released within a step's forward and backward: made in every
    // micro-batch, divided.
    let mut per_micro_batch = vec![false; allocations.len()];
    if k > 1 {
        for (i, a) in allocations.iter().enumerate() {
            if let (Some(e), Some(f)) = (a.alloc_event(), a.free_requested()) {
                if let Some(p) = pass_of(e) {
                    per_micro_batch[i] = f <= p.3;
                }
            }
        }
    }
    let percent = u64::from(edit.optimizer_state_percent.min(100));
    let size_of = |a: u32| -> Option<u64> {
        let size = allocations[a as usize].size;
        if an.category(a) == Category::OptimizerState && percent < 100 {
            return (percent > 0).then(|| size.saturating_mul(percent).div_ceil(100));
        }
        Some(if per_micro_batch[a as usize] {
            size.div_ceil(u64::from(k))
        } else {
            size
        })
    };

    let mut out = Emitter {
        trace: an.trace,
        alloc_of_event: &an.alloc_of_event,
        allocations,
        keys: allocations.iter().map(|a| a.addr).collect(),
        next_key: fresh_base(snapshot, an.trace),
        out: Vec::with_capacity(n),
        origin: Vec::with_capacity(n),
        anchor: 0,
        per_micro_batch: &per_micro_batch,
    };
    let mut i = 0;
    while i < ops.len() {
        let anchor = ops[i].0;
        let span = if k > 1 {
            pass_of(anchor).map(|p| p.3)
        } else {
            None
        };
        match span {
            Some(be) => {
                let j = ops[i..]
                    .iter()
                    .position(|&(e, _)| e > be)
                    .map_or(ops.len(), |p| i + p);
                for copy in 0..k {
                    for &(e, op) in &ops[i..j] {
                        out.anchor = e;
                        out.emit(op, copy, &size_of, true);
                    }
                }
                i = j;
            }
            None => {
                out.anchor = anchor;
                out.emit(ops[i].1, 0, &size_of, k > 1);
                i += 1;
            }
        }
    }
    Edited {
        trace: out.out,
        origin: out.origin,
        checkpointed: checkpointed_allocations,
        recompute,
    }
}

/// Addresses above every recorded one, for allocations the edit makes again.
pub(crate) fn fresh_base(snapshot: &Snapshot, trace: &[TraceEntry]) -> u64 {
    let highest = snapshot
        .segments
        .iter()
        .map(|s| s.address.saturating_add(s.total_size))
        .chain(trace.iter().map(|e| e.addr.saturating_add(e.size)))
        .max()
        .unwrap_or(0);
    (highest.saturating_add(1 << 32) & !511).max(1 << 48)
}

struct Emitter<'a, 'b> {
    trace: &'a [TraceEntry],
    alloc_of_event: &'b [Option<u32>],
    allocations: &'a [memsnap_analysis::Allocation],
    /// The address each allocation's entries carry now.
    keys: Vec<u64>,
    next_key: u64,
    out: Vec<TraceEntry>,
    /// The recorded entry each of `out` stands for.
    origin: Vec<u32>,
    /// The recorded entry the operation being emitted stands at.
    anchor: u32,
    per_micro_batch: &'b [bool],
}

impl Emitter<'_, '_> {
    fn push(&mut self, entry: TraceEntry) {
        self.out.push(entry);
        self.origin.push(self.anchor);
    }

    fn push_entry(&mut self, a: u32, action: Action, size: u64) {
        let entry = self.entry(a, action, size);
        self.push(entry);
    }

    fn fresh(&mut self) -> u64 {
        let k = self.next_key;
        self.next_key = self.next_key.saturating_add(512);
        k
    }

    fn entry(&self, a: u32, action: Action, size: u64) -> TraceEntry {
        let alloc = &self.allocations[a as usize];
        let template = alloc
            .alloc_event()
            .and_then(|e| self.trace.get(e as usize))
            .cloned()
            .unwrap_or_else(|| {
                TraceEntry::new(Action::Alloc, alloc.addr, alloc.size, alloc.stream)
            });
        let mut e = template;
        e.action = action;
        e.addr = self.keys[a as usize];
        e.size = size;
        e
    }

    /// Emits `op` for micro-batch `copy`. `in_micro_batches`: allocations made per micro-batch
    /// are released at once (their deferred completion dropped), so that each copy's
    /// allocations are gone before the next copy makes them again.
    fn emit(
        &mut self,
        op: Op,
        copy: u32,
        size_of: &dyn Fn(u32) -> Option<u64>,
        in_micro_batches: bool,
    ) {
        match op {
            Op::Orig(e) => {
                let trace = self.trace;
                let entry = &trace[e as usize];
                let Some(a) = self.alloc_of_event[e as usize].filter(|_| {
                    matches!(
                        entry.action,
                        Action::Alloc
                            | Action::FreeRequested
                            | Action::FreeCompleted
                            | Action::Free
                    )
                }) else {
                    if copy == 0 {
                        self.push(entry.clone());
                    }
                    return;
                };
                let repeated = in_micro_batches && self.per_micro_batch[a as usize];
                if copy > 0 && !repeated {
                    return;
                }
                let Some(size) = size_of(a) else {
                    return;
                };
                match entry.action {
                    Action::Alloc => {
                        if copy > 0 {
                            self.keys[a as usize] = self.fresh();
                        }
                        self.push_entry(a, Action::Alloc, size);
                    }
                    Action::FreeRequested if repeated => {
                        self.push_entry(a, Action::FreeRequested, size);
                        self.push_entry(a, Action::FreeCompleted, size);
                    }
                    Action::FreeCompleted if repeated => {}
                    action => self.push_entry(a, action, size),
                }
            }
            Op::Alloc(a) => {
                if copy > 0 && !(in_micro_batches && self.per_micro_batch[a as usize]) {
                    return;
                }
                let Some(size) = size_of(a) else {
                    return;
                };
                self.keys[a as usize] = self.fresh();
                self.push_entry(a, Action::Alloc, size);
            }
            Op::FreeNow(a) => {
                if copy > 0 && !(in_micro_batches && self.per_micro_batch[a as usize]) {
                    return;
                }
                let Some(size) = size_of(a) else {
                    return;
                };
                self.push_entry(a, Action::FreeRequested, size);
                self.push_entry(a, Action::FreeCompleted, size);
            }
        }
    }
}
