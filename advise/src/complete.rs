//! Completing a run that ran out of memory: the step that failed is finished the way the step
//! before it went, so that a fix can be judged on a whole step (its backward included), not on
//! the part of a forward pass that was recorded.
//!
//! The trace of an OOM snapshot ends at the `oom` entry, in the middle of a step S. When an
//! earlier step P has a forward and a backward phase and S's allocations so far have the sizes
//! of P's first ones, in order (the same model on the same batch shape), the completed trace is
//! S's entries up to the `oom`, then P's entries from its request that corresponds to the one
//! that failed to P's end: P's allocations made before that point stand for S's (matched in
//! order), P's later allocations are made afresh, and what P made and kept past its end (the
//! optimizer state of a warm-up step) is left out, because S already holds it, unless a
//! leaking site ([`memsnap_analysis::leaks`]) keeps it: code that keeps memory every step
//! would have kept S's too (and the request that failed is often that very allocation: a
//! run that leaks runs out of memory making its leak). Segment entries
//! of the continuation are left out too (the replay makes its own), and its times are shifted
//! to follow the `oom`. The releases the full device forced are left out of the recorded part:
//! the `segment_free`s just before the `oom` (the failed request's retry releasing the cache)
//! and every earlier run of them followed by a `segment_alloc` that would not have fit beside
//! the cache (the device's size is the `oom` entry's free bytes plus what was reserved then):
//! a run with a fix would not have made them, and the replay, on a device of the budget's
//! size, releases its cache itself when it must. Frees in P of memory made before P are left out (S's counterparts are
//! unknown). A run recorded with module names keeps them: P's `memsnap.module:` ranges over
//! its rest are carried along with its entries, so a named fix finds S's calls too.
//!
//! Complexity: O(n) in the trace's entries plus one analysis of the device and its leaking
//! sites (O(m + s) in its allocations and steps).

use foldhash::{HashMap, HashSet};

use memsnap_analysis::modules::MODULE_RANGE_PREFIX;
use memsnap_analysis::{DeviceTimeline, PhaseKind, StepOptions};
use memsnap_format::{Action, Annotation, Snapshot, TraceEntry};
use serde::Serialize;

/// How an OOM run was completed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Completion {
    /// The `oom` entry where the recording ends.
    pub oom_event: usize,
    /// The step that ran out of memory, and the step whose rest completes it (indices of the
    /// analysis' steps).
    pub failed_step: usize,
    pub model_step: usize,
    /// Entries added after the `oom` entry's place.
    pub entries_added: usize,
}

/// The model step's module ranges go with its rest (a run recorded with module names): its
/// `memsnap.module:` marks on `device` in `rest` (the times of its entries from the point the
/// failed request stands for to its end) are copied, shifted by `shift` as those entries are,
/// and the failed step's marks from the `oom` on are dropped (the ENDs its hooks recorded as
/// the error unwound the calls). The failed step's calls still open at the `oom` are then
/// closed by the model step's ENDs of the same paths, and its blocks after the failure get
/// the model step's ranges. O(a) in the annotations.
fn carry_module_ranges(
    annotations: &mut Vec<Annotation>,
    device: i64,
    shift: i64,
    rest: std::ops::RangeInclusive<i64>,
) {
    let is_module = |a: &Annotation| {
        a.device == device && a.name().is_some_and(|n| n.starts_with(MODULE_RANGE_PREFIX))
    };
    let oom_time = rest.start().saturating_add(shift);
    let copied: Vec<Annotation> = annotations
        .iter()
        .filter(|a| is_module(a) && rest.contains(&a.time_us))
        .map(|a| {
            let mut copy = a.clone();
            copy.time_us = a.time_us.saturating_add(shift);
            copy
        })
        .collect();
    annotations.retain(|a| !(is_module(a) && a.time_us >= oom_time));
    annotations.extend(copied);
}

fn is_alloc(e: &TraceEntry) -> bool {
    e.action == Action::Alloc
}

/// The snapshot with `device`'s trace completed (see the module docs), or `None` when the trace
/// has no `oom` entry or no earlier step matches the failed one.
pub fn complete(
    snapshot: &Snapshot,
    device: i64,
) -> memsnap_analysis::Result<Option<(Snapshot, Completion)>> {
    Ok(complete_mapped(snapshot, device)?.map(|(s, c, _)| (s, c)))
}

/// [`complete`], with the recorded entry each entry of the completed trace stands for: a kept
/// recorded entry its own index, an entry of the model step's rest the `oom` entry (where the
/// recording stops, the only place on the recorded axis the rest of the step can be drawn).
pub fn complete_mapped(
    snapshot: &Snapshot,
    device: i64,
) -> memsnap_analysis::Result<Option<(Snapshot, Completion, Vec<u32>)>> {
    let Some(trace) = usize::try_from(device)
        .ok()
        .and_then(|d| snapshot.traces().get(d))
    else {
        return Ok(None);
    };
    let Some(oom) = trace.iter().position(|e| e.action == Action::Oom) else {
        return Ok(None);
    };
    let timeline = DeviceTimeline::build(snapshot, device)?;
    let steps = timeline.steps(&StepOptions::default()).steps;
    let Some(failed) = steps.iter().rposition(|s| s.start_event as usize <= oom) else {
        return Ok(None);
    };
    let has = |s: &memsnap_analysis::Step, k: PhaseKind| s.phases.iter().any(|p| p.kind == k);
    let Some(model) = steps[..failed].iter().rposition(|p| {
        has(p, PhaseKind::Forward) && has(p, PhaseKind::Backward) && (p.end_event as usize) < oom
    }) else {
        return Ok(None);
    };
    // What leaking code keeps every step (`loss` appended to a list): S would have made it
    // too, and it is often the very request that failed, so P's rest makes it again.
    let leaked: HashSet<u32> = {
        let replay = timeline.replay();
        memsnap_analysis::leaking_sites(snapshot, replay, &steps)
            .iter()
            .flat_map(|site| &site.kept)
            .filter_map(|&(a, _)| replay.allocations.get(a as usize)?.alloc_event())
            .collect()
    };
    let (s, p) = (&steps[failed], &steps[model]);
    let p_range = p.start_event as usize..=(p.end_event as usize).min(trace.len() - 1);
    let s_allocs: Vec<usize> = (s.start_event as usize..oom)
        .filter(|&i| is_alloc(&trace[i]))
        .collect();
    let p_allocs: Vec<usize> = p_range.clone().filter(|&i| is_alloc(&trace[i])).collect();
    let c = s_allocs.len();
    if c == 0 || c >= p_allocs.len() {
        return Ok(None);
    }
    if s_allocs
        .iter()
        .zip(&p_allocs)
        .any(|(&a, &b)| trace[a].size != trace[b].size)
    {
        return Ok(None);
    }
    let point = p_allocs[c];

    // P's addresses live at the point -> S's.
    let mut map: HashMap<u64, u64> = HashMap::default();
    let mut k = 0;
    for i in p.start_event as usize..point {
        let e = &trace[i];
        match e.action {
            Action::Alloc => {
                map.insert(e.addr, trace[s_allocs[k]].addr);
                k += 1;
            }
            Action::FreeCompleted | Action::Free => {
                map.remove(&e.addr);
            }
            _ => {}
        }
    }
    // Which of P's later allocations it frees itself.
    let end = *p_range.end();
    let mut open: HashMap<u64, usize> = HashMap::default();
    let mut freed = vec![false; end + 1 - point];
    for (k, e) in trace[point..=end].iter().enumerate() {
        match e.action {
            Action::Alloc => {
                open.insert(e.addr, k);
            }
            Action::FreeRequested | Action::FreeCompleted | Action::Free => {
                if let Some(&j) = open.get(&e.addr) {
                    freed[j] = true;
                }
                if e.action != Action::FreeRequested {
                    open.remove(&e.addr);
                }
            }
            _ => {}
        }
    }
    let mut next_key = crate::edit::fresh_base(snapshot, trace);
    let shift = match (trace[oom].time_us(), trace[point].time_us()) {
        (Some(a), Some(b)) => Some(a - b),
        _ => None,
    };
    // The release of the cache that the failed request's retry made (`segment_free`s just
    // before the `oom`) belongs to the failure: a run that goes on never made it.
    let mut kept = oom;
    while kept > 0
        && matches!(
            trace[kept - 1].action,
            Action::SegmentFree | Action::SegmentUnmap
        )
    {
        kept -= 1;
    }
    // Likewise every earlier release the allocator made to retry a request on this full
    // device: a run of `segment_free`s followed by a `segment_alloc` that would not have fit
    // beside the cache it released (the device's size is the `oom` entry's free bytes plus
    // what was reserved then). The replay, on the budget's device, releases when it must.
    let grows = |a: Action| matches!(a, Action::SegmentAlloc | Action::SegmentMap);
    let shrinks = |a: Action| matches!(a, Action::SegmentFree | Action::SegmentUnmap);
    let reserved_at_oom = trace[..oom].iter().fold(0u64, |r, e| {
        if grows(e.action) {
            r.saturating_add(e.size)
        } else if shrinks(e.action) {
            r.saturating_sub(e.size)
        } else {
            r
        }
    });
    let capacity = trace[oom]
        .device_free()
        .map(|free| free.saturating_add(reserved_at_oom));
    let mut completed: Vec<TraceEntry> = Vec::with_capacity(kept);
    let mut origin: Vec<u32> = Vec::with_capacity(kept);
    let mut reserved = 0u64;
    let mut i = 0;
    while i < kept {
        let e = &trace[i];
        if shrinks(e.action) {
            let run_end = (i..kept)
                .find(|&j| !shrinks(trace[j].action))
                .unwrap_or(kept);
            let retry = capacity.is_some_and(|cap| {
                trace
                    .get(run_end)
                    .is_some_and(|n| grows(n.action) && reserved.saturating_add(n.size) > cap)
            });
            for (j, e) in trace.iter().enumerate().take(run_end).skip(i) {
                reserved = reserved.saturating_sub(e.size);
                if !retry {
                    completed.push(e.clone());
                    origin.push(j as u32);
                }
            }
            i = run_end;
            continue;
        }
        if grows(e.action) {
            reserved = reserved.saturating_add(e.size);
        }
        completed.push(e.clone());
        origin.push(i as u32);
        i += 1;
    }
    let recorded_part = completed.len();
    let mut fresh: HashMap<u64, u64> = HashMap::default();
    for i in point..=end {
        let e = &trace[i];
        let key = match e.action {
            Action::Alloc if freed[i - point] || leaked.contains(&(i as u32)) => {
                let key = next_key;
                next_key = next_key.saturating_add(512);
                fresh.insert(e.addr, key);
                Some(key)
            }
            Action::FreeRequested | Action::FreeCompleted | Action::Free => {
                let key = fresh.get(&e.addr).or(map.get(&e.addr)).copied();
                if e.action != Action::FreeRequested {
                    fresh.remove(&e.addr);
                    map.remove(&e.addr);
                }
                key
            }
            _ => None,
        };
        if let Some(key) = key {
            let mut entry = e.clone();
            entry.addr = key;
            if let (Some(shift), Some(t)) = (shift, e.time_us()) {
                entry.set_time_us(Some(t.saturating_add(shift)));
            }
            completed.push(entry);
            origin.push(oom as u32);
        }
    }
    let entries_added = completed.len() - recorded_part;
    let mut out = snapshot.clone();
    if let Some(traces) = out.device_traces.as_mut() {
        traces[device as usize] = completed;
    }
    if let (Some(shift), Some(from), Some(to), Some(annotations)) = (
        shift,
        trace[point].time_us(),
        trace[end].time_us(),
        out.external_annotations.as_mut(),
    ) {
        carry_module_ranges(annotations, device, shift, from..=to);
    }
    Ok(Some((
        out,
        Completion {
            oom_event: oom,
            failed_step: failed,
            model_step: model,
            entries_added,
        },
        origin,
    )))
}
