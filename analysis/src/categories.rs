//! What each allocation is for — torch.profiler's memory categories, from a snapshot alone.
//!
//! With the phases of every step known ([`crate::phases`]), an allocation's category follows
//! from the phase that allocated it and the phase whose code freed it (`free_requested`: when
//! the tensor died, even if its block returned to the cache later):
//!
//! | category | rule |
//! |---|---|
//! | parameter | live before the window or allocated in the set-up, and never freed in the window |
//! | optimizer state | allocated in an optimizer phase, outlives the step |
//! | gradient | allocated in backward, outlives the backward phase |
//! | activation | allocated in forward, freed in the backward phase of the same step |
//! | temporary | freed in the phase that allocated it |
//! | unknown | anything else (forward tensors that outlive the step, memory from before the window that is freed in it, memory an import's source could not attribute, files without phases) |
//!
//! Memory live for the whole window whose stack says optimizer or backward (state or
//! gradients from steps before the window) is optimizer state or gradient, not a parameter.
//! Nor is memory live for the whole window whose stack also makes allocations that stay, in
//! at least three of the window's steps: a tensor kept every step, from the steps a ring
//! buffer dropped, takes the category most of those get (a week-long run's leak was 1.2 GiB
//! of "parameters" beside 16 MiB of real ones). Only allocations never freed in the window
//! count, and from three steps or more, so that a stack every tensor shares (native frames
//! only) or gradients made once in the first backward do not make parameters something else.
//!
//! **From the source.** An import whose source gave each allocation a category
//! (`export_memory_timeline`: PyTorch's own `_memory_profiler` categories, kept as
//! [`memsnap_format::SourceInfo::categories`]) takes the source's: the rules above are not
//! applied to those allocations, and the two categories only PyTorch's profiler tells apart,
//! input and autograd detail, appear only then ([`Replay::categories_source`] says whose).

use serde::Serialize;

pub use crate::category::Category;
use crate::phases::{Evidence, PhaseKind, PhaseSpan};
use crate::replay::{Lifetime, Origin, Replay};
use foldhash::HashMap;
use memsnap_format::StackId;

/// Bytes per category, indexed like [`Category::ALL`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CategoryBytes(pub [u64; 8]);

impl CategoryBytes {
    pub fn get(&self, c: Category) -> u64 {
        self.0[c as usize]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// `(category, bytes)` in report order.
    pub fn iter(&self) -> impl Iterator<Item = (Category, u64)> + '_ {
        Category::ALL.iter().map(|&c| (c, self.get(c)))
    }
}

/// `phases.partition_point(|p| p.2 <= event)` where every phase before `from` starts at or
/// before `event`: a galloping search from `from`, O(log d) for an answer d phases on.
fn phases_starting_by(phases: &[PhaseSpan], from: usize, event: u32) -> usize {
    let n = phases.len();
    let mut lo = from.min(n);
    let mut step = 1usize;
    while lo + step <= n && phases[lo + step - 1].2 <= event {
        lo += step;
        step = step.saturating_mul(2);
    }
    let hi = lo.saturating_add(step).min(n);
    lo + phases[lo..hi].partition_point(|p| p.2 <= event)
}

/// Steps a stack must keep memory in (allocations made there and never freed in the window)
/// for its memory from before the window to take that memory's category; also the steps a
/// leaking site keeps memory in ([`crate::leaks::MIN_LEAK_STEPS`]).
pub(crate) const MIN_KEPT_STEPS: u32 = 3;

/// A stack's allocations made in steps and never freed in the window: how many of each
/// category, and in how many steps.
#[derive(Default)]
struct KeptInSteps {
    counts: [u32; 8],
    steps: u32,
    last_step: Option<u32>,
}

/// The category of every allocation of the replay (same order). O(m log d) for `m`
/// allocations, d the phases between an allocation's start and the previous one's or its
/// end: allocations come in the order of their starts, so each start's phase is searched
/// from the previous one's and each end's from its start's (a binary search over every
/// phase, twice an allocation, was 6% of the viewer's CPU time on a 10M-entry run of
/// 300,000 steps, a cache miss a probe); O(m log p) for p phases at worst.
pub(crate) fn categorize(
    replay: &Replay,
    evidence: &[Evidence],
    phases: &[PhaseSpan],
) -> Vec<Category> {
    let phase_at = |i: usize, event: u32| -> Option<usize> {
        (i > 0 && event <= phases[i - 1].3).then(|| i - 1)
    };
    // Stacks of memory from before the window that the rules would call parameters: their
    // allocations in the window's steps that stay are counted by category, with the steps
    // that made them.
    let mut in_steps: HashMap<StackId, KeptInSteps> = replay
        .allocations
        .iter()
        .enumerate()
        .take_while(|(_, a)| a.before_window())
        .filter(|(i, a)| {
            a.origin != Origin::Unattributed
                && a.end_event(Lifetime::Allocated).is_none()
                && !matches!(
                    evidence.get(*i),
                    Some(Evidence::Optimizer | Evidence::Backward)
                )
        })
        .filter_map(|(_, a)| Some((a.stack?, KeptInSteps::default())))
        .collect();
    // The last start searched, and the phases starting at or before it.
    let mut cursor: (u32, usize) = (0, 0);
    let mut categories: Vec<Category> = replay
        .allocations
        .iter()
        .enumerate()
        .map(|(i, a)| {
            // Counted by an import's source, never seen as a block: nothing says what it is.
            if a.origin == Origin::Unattributed {
                return Category::Unknown;
            }
            if let Some(c) = replay.source_category(a.alloc_event()) {
                return c;
            }
            let freed = a.end_event(Lifetime::Allocated);
            let Some(alloc) = a.alloc_event() else {
                return match (freed, evidence.get(i)) {
                    (Some(_), _) => Category::Unknown,
                    (None, Some(Evidence::Optimizer)) => Category::OptimizerState,
                    (None, Some(Evidence::Backward)) => Category::Gradient,
                    (None, _) => Category::Parameter,
                };
            };
            let from = if alloc >= cursor.0 { cursor.1 } else { 0 };
            let starting = phases_starting_by(phases, from, alloc);
            cursor = (alloc, starting);
            let Some(p) = phase_at(starting, alloc) else {
                return Category::Unknown;
            };
            let (step, kind, _, _) = phases[p];
            let freed_phase = freed.map(|f| {
                let from = if f >= alloc { starting } else { 0 };
                phase_at(phases_starting_by(phases, from, f), f)
            });
            let same_phase = freed_phase == Some(Some(p));
            let category = match kind {
                PhaseKind::Setup => match freed {
                    None => Category::Parameter,
                    Some(_) if same_phase => Category::Temporary,
                    Some(_) => Category::Unknown,
                },
                PhaseKind::Forward => match freed_phase {
                    _ if same_phase => Category::Temporary,
                    Some(Some(q)) if phases[q].0 == step && phases[q].1 == PhaseKind::Backward => {
                        Category::Activation
                    }
                    _ => Category::Unknown,
                },
                PhaseKind::Backward if same_phase => Category::Temporary,
                PhaseKind::Backward => Category::Gradient,
                PhaseKind::Optimizer if same_phase => Category::Temporary,
                PhaseKind::Optimizer => Category::OptimizerState,
            };
            if let (Some(step), None) = (step, freed) {
                if let Some(kept) = a.stack.and_then(|s| in_steps.get_mut(&s)) {
                    kept.counts[category as usize] += 1;
                    if kept.last_step != Some(step) {
                        kept.steps += 1;
                        kept.last_step = Some(step);
                    }
                }
            }
            category
        })
        .collect();
    in_steps.retain(|_, kept| kept.steps >= MIN_KEPT_STEPS);
    if !in_steps.is_empty() {
        for (a, c) in replay.allocations.iter().zip(&mut categories) {
            if !a.before_window() {
                break;
            }
            let Some(KeptInSteps { counts, .. }) = a.stack.and_then(|s| in_steps.get(&s)) else {
                continue;
            };
            if *c == Category::Parameter {
                // The most common; ties to the earlier in report order.
                let most = (0..8).rev().max_by_key(|&k| counts[k]).unwrap_or(0);
                *c = Category::ALL[most];
            }
        }
    }
    categories
}

/// Bytes live after each of `events` (ascending) by category, active lifetime. O(m log q + q)
/// for `m` allocations and `q` events.
///
/// A difference array over the queried events: each allocation adds its size from the first
/// queried event at or after its start to the first at or after its end, found by binary
/// search. Memory is the answer's (64 bytes an event), not O(allocations) (a sorted list of
/// every alloc and free was 200 MB at 10M entries): the differences are summed in place in
/// wrapping `u64` arithmetic, exact while each category's bytes over all allocations fit in
/// `u64`. Sizes that do not (only a hostile file has them) are summed in `i128` and the live
/// bytes saturate at `u64::MAX`. At 900,000 events (a run of 300,000 steps) the `i128`
/// differences and a copy of the answer held 174 MB more.
pub(crate) fn bytes_at(
    replay: &Replay,
    categories: &[Category],
    events: &[u32],
) -> Vec<CategoryBytes> {
    let mut totals = [0u64; 8];
    let fits = replay.allocations.iter().zip(categories).all(|(a, c)| {
        let total = &mut totals[*c as usize];
        total.checked_add(a.size).map(|t| *total = t).is_some()
    });
    if !fits {
        return bytes_at_saturating(replay, categories, events);
    }
    let mut diff = vec![CategoryBytes::default(); events.len() + 1];
    for_each_live_span(replay, categories, events, |first, past, c, size| {
        let added = &mut diff[first].0[c];
        *added = added.wrapping_add(size);
        let removed = &mut diff[past].0[c];
        *removed = removed.wrapping_sub(size);
    });
    let mut live = [0u64; 8];
    for d in &mut diff {
        for (l, v) in live.iter_mut().zip(&mut d.0) {
            *l = l.wrapping_add(*v);
            *v = *l;
        }
    }
    diff.truncate(events.len());
    diff
}

/// Calls `f(first, past, category, size)` for each allocation live after some of `events`:
/// after `events[first..past]`.
fn for_each_live_span(
    replay: &Replay,
    categories: &[Category],
    events: &[u32],
    mut f: impl FnMut(usize, usize, usize, u64),
) {
    let axis = replay.axis_len();
    for (a, c) in replay.allocations.iter().zip(categories) {
        let (start, end) = (a.start(), a.end(Lifetime::Active, axis));
        // Live after `e` while start <= e < end.
        let first = events.partition_point(|&e| e < start);
        let past = events.partition_point(|&e| e < end);
        if first < past {
            f(first, past, *c as usize, a.size);
        }
    }
}

/// [`bytes_at`] for sizes whose sum overflows `u64`: differences in `i128`, the live bytes
/// saturated.
fn bytes_at_saturating(
    replay: &Replay,
    categories: &[Category],
    events: &[u32],
) -> Vec<CategoryBytes> {
    let mut diff = vec![[0i128; 8]; events.len() + 1];
    for_each_live_span(replay, categories, events, |first, past, c, size| {
        diff[first][c] += i128::from(size);
        diff[past][c] -= i128::from(size);
    });
    let mut live = [0i128; 8];
    diff[..events.len()]
        .iter()
        .map(|d| {
            for (l, v) in live.iter_mut().zip(d) {
                *l += v;
            }
            CategoryBytes(live.map(|v| u64::try_from(v.max(0)).unwrap_or(u64::MAX)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The galloping search answers as a binary search over every phase, from any start it
    /// is allowed (every phase before it starting at or before the event).
    #[test]
    fn phases_starting_by_equals_a_binary_search_from_every_allowed_start() {
        let phases: Vec<PhaseSpan> = [0u32, 3, 3, 7, 20, 21, 50, 51, 52, 90]
            .iter()
            .map(|&s| (None, PhaseKind::Forward, s, s))
            .collect();
        for event in 0..100u32 {
            let want = phases.partition_point(|p| p.2 <= event);
            for from in 0..=want {
                assert_eq!(
                    phases_starting_by(&phases, from, event),
                    want,
                    "{event} {from}"
                );
            }
        }
        assert_eq!(phases_starting_by(&[], 0, 5), 0);
    }
}
