//! Leaking sites: the code that keeps memory step after step.
//!
//! Drift ([`crate::steps`]) says that the floor rises from step to step; this says which code
//! raises it, so that the user knows what to change (`losses.append(loss)` keeping a graph
//! alive, a metrics list of GPU tensors, a cache that never evicts).
//!
//! An allocation is **kept** when a training step made it and it is still allocated (no
//! `free_requested`) when the window ends. A site (the allocation's innermost user frame,
//! [`crate::sites::top_frame`]; `<no stack>` for allocations without one) **leaks** when
//! * allocations made in at least [`MIN_LEAK_STEPS`] different steps are kept, and
//! * the last of those steps is in the last quarter of the window's steps (or is one of its
//!   last two: a run that ran out of memory may have stopped before the leaking code ran in
//!   its last step): the site still keeps memory as the recording ends. A cache filled in the first steps and then left
//!   alone, gradients made in the first backward, the warm-up's optimizer state: each is made
//!   in a few early steps and is not a leak.
//!
//! Memory of a leaking site from before the window (a ring buffer that dropped the first
//! steps) that is still allocated at the end is counted with it, apart: the same code kept it
//! in the steps the window does not hold.
//!
//! Complexity: O(m + s) in the allocations and the steps (allocations come in the order of
//! their alloc events, so one cursor walks the steps), plus one site lookup per kept
//! allocation (a hash lookup after the first of each stack) and O(k log k) to sort the k
//! leaking sites.

use foldhash::HashMap;
use serde::Serialize;

use memsnap_format::Snapshot;

use crate::replay::Replay;
use crate::sites::{GroupBy, SiteKey, SiteKeyer};
use crate::steps::Step;

/// Different steps whose allocations a site must keep for it to leak: the number the
/// categories use for memory from before the window, so that a site named here has its older
/// memory categorized with the rest.
pub const MIN_LEAK_STEPS: usize = crate::categories::MIN_KEPT_STEPS as usize;

/// A site that keeps memory step after step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LeakingSite {
    /// `file:line:function` of the site (see [`SiteKey::label`]).
    pub site: String,
    #[serde(skip)]
    pub key: SiteKey,
    /// Steps that made at least one kept allocation of the site.
    pub steps: usize,
    /// Index of the first and of the last of those steps.
    pub first_step: usize,
    pub last_step: usize,
    /// Kept allocations made in the window's steps, and their bytes.
    pub allocations: u64,
    pub bytes: u64,
    /// Bytes kept per step, from the first step that kept some to the last:
    /// `bytes / (last_step - first_step + 1)`.
    pub bytes_per_step: u64,
    /// Allocations of the site from before the window still allocated at its end, and their
    /// bytes (the same code, in the steps the ring buffer dropped).
    pub before_window_allocations: u64,
    pub before_window_bytes: u64,
    /// The kept allocations (indices into [`Replay::allocations`], ascending), each with the
    /// last event of the step that made it.
    #[serde(skip)]
    pub kept: Vec<(u32, u32)>,
    /// The site's allocations from before the window still allocated at its end (indices
    /// into [`Replay::allocations`]).
    #[serde(skip)]
    pub before_window: Vec<u32>,
}

impl LeakingSite {
    /// Everything the site holds when the window ends.
    pub fn live_bytes(&self) -> u64 {
        self.bytes.saturating_add(self.before_window_bytes)
    }
}

/// The device's leaking sites, most bytes held at the end first (see the module docs).
pub fn leaking_sites(snapshot: &Snapshot, replay: &Replay, steps: &[Step]) -> Vec<LeakingSite> {
    if steps.len() < MIN_LEAK_STEPS {
        return Vec::new();
    }
    let mut keyer = SiteKeyer::new(snapshot, GroupBy::Frame);
    let mut by_site: HashMap<SiteKey, LeakingSite> = HashMap::default();
    // Memory from before the window still held: keyed only once some site leaks.
    let mut before: Vec<u32> = Vec::new();
    let mut cursor = 0usize;
    for (i, a) in replay.allocations.iter().enumerate() {
        if a.free_requested().is_some() || a.free_completed().is_some() {
            continue;
        }
        let Some(event) = a.alloc_event() else {
            before.push(i as u32);
            continue;
        };
        while steps.get(cursor).is_some_and(|s| s.end_event < event) {
            cursor += 1;
        }
        let Some(step) = steps.get(cursor).filter(|s| s.start_event <= event) else {
            continue;
        };
        let key = keyer.key_of(a);
        let site = by_site.entry(key.clone()).or_insert_with(|| LeakingSite {
            site: String::new(),
            key,
            steps: 0,
            first_step: cursor,
            last_step: cursor,
            allocations: 0,
            bytes: 0,
            bytes_per_step: 0,
            before_window_allocations: 0,
            before_window_bytes: 0,
            kept: Vec::new(),
            before_window: Vec::new(),
        });
        if site.steps == 0 || site.last_step != cursor {
            site.steps += 1;
        }
        site.last_step = cursor;
        site.allocations += 1;
        site.bytes = site.bytes.saturating_add(a.size);
        site.kept.push((i as u32, step.end_event));
    }
    // The last quarter of the steps, and at least the two last (the last of a run that ran
    // out of memory can have stopped before the leaking code ran).
    let recent = steps.len() - 1 - (steps.len() / 4).max(1);
    let mut out: Vec<LeakingSite> = by_site
        .into_values()
        .filter(|s| s.steps >= MIN_LEAK_STEPS && s.last_step >= recent)
        .collect();
    if out.is_empty() {
        return out;
    }
    let index: HashMap<SiteKey, usize> = out
        .iter()
        .enumerate()
        .map(|(i, s)| (s.key.clone(), i))
        .collect();
    for a in before {
        if let Some(&i) = index.get(&keyer.key_of(&replay.allocations[a as usize])) {
            let site = &mut out[i];
            site.before_window_allocations += 1;
            site.before_window_bytes = site
                .before_window_bytes
                .saturating_add(replay.allocations[a as usize].size);
            site.before_window.push(a);
        }
    }
    for s in &mut out {
        s.site = s.key.label(snapshot);
        s.bytes_per_step = s.bytes / (s.last_step - s.first_step + 1) as u64;
    }
    out.sort_by(|a, b| {
        b.live_bytes()
            .cmp(&a.live_bytes())
            .then_with(|| a.site.cmp(&b.site))
    });
    out
}
