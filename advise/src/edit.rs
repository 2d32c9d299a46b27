//! Editing one device's trace the way a fix would change the run, so that the edited trace can
//! be replayed through the allocator.
//!
//! The edit works on the original trace's events and the analysis of them (allocations with
//! their alloc and free events, categories, steps and phases, module chains):
//!
//! - **Optimizer state** (`percent`): every optimizer-state allocation's size is scaled (rounded
//!   up); at 0 its alloc and frees are left out (offloaded to the host).
//! - **Activation checkpointing** of a module node (a module chain prefix, see
//!   `memsnap_analysis::modules`): in each step's forward, the node's calls are found in event
//!   order (a call ends where the code inside it goes back to an earlier line, or where an
//!   allocation outside the node comes); a call's activations (allocated in it, freed after the
//!   forward) are freed right after the call, and the call's allocations (activations and the
//!   transients it made and freed) are made again, in their order, at the start of its backward:
//!   before the first allocation after the previous call's last activation was released (the
//!   backward order of the calls is the order of their releases). The activations are then
//!   freed where the recording freed them.
//! - **Micro-batches** (`count`): each step's forward and backward run `count` times; the
//!   allocations made and released within them (activations, transients, input gradients) are
//!   divided by `count` (rounded up) and made in every micro-batch; what outlives them
//!   (gradients) and everything else is made once, in the first.
//!
//! Replayed allocations take fresh addresses (above every recorded one) so that no two live
//! allocations of the edited trace share one; the recorded segment events stay as they were
//! (the replay makes its own segment decisions; they only hint at addresses).
//!
//! Complexity: O(n + m) in the trace's entries and allocations, plus O(n) per micro-batch of
//! the steps' forward and backward.

use std::collections::HashMap;
use std::sync::Arc;

use memsnap_analysis::{Category, PhaseKind, Replay, StepAnalysis};
use memsnap_format::{Action, FrameId, Snapshot, TraceEntry};

/// A module node (a chain prefix) and the range of its calls in a forward pass (first and
/// last, counting from 0; `None`: every call).
pub type CheckpointTarget = (Vec<FrameId>, Option<(u32, u32)>);

/// What to change in a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Edit {
    /// Module nodes to checkpoint (chain prefixes), each with the range of its calls in a
    /// forward pass to checkpoint (counting from 0, inclusive; `None`: every call).
    pub checkpoint: Vec<CheckpointTarget>,
    /// Micro-batches per step (1: as recorded).
    pub micro_batches: u32,
    /// Optimizer state in percent of the recorded (100: as recorded).
    pub optimizer_state_percent: u8,
}

impl Edit {
    pub fn none() -> Self {
        Edit {
            checkpoint: Vec::new(),
            micro_batches: 1,
            optimizer_state_percent: 100,
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
    /// Its allocations, in order.
    members: Vec<u32>,
    /// Last event of the call.
    end: u32,
}

/// How many calls of `node` the first step's forward makes (0 without a step that has a
/// forward and a backward). O(events in that forward).
pub fn call_count(an: &Analysed<'_>, node: &[FrameId]) -> usize {
    an.passes()
        .first()
        .map_or(0, |&(fs, fe, _, _)| calls(an, node, fs, fe).len())
}

/// The node's calls in the forward `[fs, fe]` (see the module docs). O(events in the forward).
fn calls(an: &Analysed<'_>, node: &[FrameId], fs: u32, fe: u32) -> Vec<Call> {
    let mut calls: Vec<Call> = Vec::new();
    let mut open: Option<(Call, i64)> = None;
    let Some(last) = (an.trace.len() as u32).checked_sub(1) else {
        return calls;
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
                open = Some((
                    Call {
                        members: vec![a],
                        end: e,
                    },
                    position,
                ));
            }
            None => {
                open = Some((
                    Call {
                        members: vec![a],
                        end: e,
                    },
                    position,
                ))
            }
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
    let mut before: HashMap<u32, Vec<Op>> = HashMap::new();
    let mut after: HashMap<u32, Vec<Op>> = HashMap::new();
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
        for &(fs, fe, bs, be) in &passes {
            // A call's activations: allocated in it, released in this step's backward.
            // Every call with activations, checkpointed or not: the backward order of all of
            // them says where a checkpointed call's backward starts.
            let mut released: Vec<(u32, Call, Vec<u32>, bool)> = Vec::new();
            for (k, call) in calls(an, node, fs, fe).into_iter().enumerate() {
                let checkpointed =
                    range.is_none_or(|(first, last)| (first as usize..=last as usize).contains(&k));
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
                if activations.is_empty() {
                    continue;
                }
                let first_release = activations
                    .iter()
                    .filter_map(|&a| allocations[a as usize].free_requested())
                    .min()
                    .unwrap_or(bs);
                if checkpointed {
                    checkpointed_allocations.extend(&call.members);
                    after
                        .entry(call.end)
                        .or_default()
                        .extend(activations.iter().map(|&a| Op::FreeNow(a)));
                }
                released.push((first_release, call, activations, checkpointed));
            }
            released.sort_by_key(|r| r.0);
            let mut previous_release: Option<u32> = None;
            for (_, call, activations, checkpointed) in &released {
                if !checkpointed {
                    previous_release = activations
                        .iter()
                        .filter_map(|&a| allocations[a as usize].free_requested())
                        .max();
                    continue;
                }
                // The recomputation goes before the first allocation after the previous
                // call's releases (the backward's first allocation for the first).
                let from = previous_release.map_or(bs, |r| r + 1);
                let at = (from..n as u32)
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
                    ops.push(Op::Alloc(m));
                    recompute.bytes = recompute.bytes.saturating_add(a.size);
                    if transient {
                        ops.push(Op::FreeNow(m));
                    }
                }
                previous_release = activations
                    .iter()
                    .filter_map(|&a| allocations[a as usize].free_requested())
                    .max();
            }
        }
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
