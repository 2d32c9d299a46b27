//! `torch.profiler.profile.export_memory_timeline` outputs (see the [module docs](super)).
//!
//! Neither output has addresses, streams or stacks, nor says which device it is (one device
//! per file, `cuda:0` by default): the import puts it on device 0. Blocks get synthetic
//! addresses (a 2 MiB-aligned range per block, counting up from `0x7e00_0000_0000`) and a
//! one-frame stack naming their category, marked synthetic ([`Frame::synthetic`]: never stack
//! evidence nor a site). The categories themselves are kept as the source's
//! ([`memsnap_format::SourceInfo::categories`]), which the analysis reports as they are.
//!
//! An `INCREMENT_VERSION` (a `−n` row in the old version's category, then `+n` in the new
//! one's) closes a block of that size and category and opens one in the new category at the
//! same time, as PyTorch's own running total does: the live bytes per category equal
//! PyTorch's after every row.

use std::collections::VecDeque;

use foldhash::HashMap;

use memsnap_format::{
    Action, EntryCategories, Frame, RecorderInfo, Snapshot, SourceInfo, StackId, TraceEntry,
};

use super::{DeviceReport, ImportReport, Imported, TraceError};

/// `_memory_profiler.Category` by index; 7 is "unknown" (`None` in Python).
const CATEGORIES: [&str; 8] = [
    "PARAMETER",
    "OPTIMIZER_STATE",
    "INPUT",
    "TEMPORARY",
    "ACTIVATION",
    "GRADIENT",
    "AUTOGRAD_DETAIL",
    "UNKNOWN",
];

/// `_memory_profiler.Action`.
const PREEXISTING: i64 = 1;
const CREATE: i64 = 2;
const INCREMENT_VERSION: i64 = 3;
const DESTROY: i64 = 4;

const SYNTHETIC_BASE: u64 = 0x7e00_0000_0000;

/// Hands out distinct synthetic addresses.
struct Addresses(u64);

impl Addresses {
    fn next(&mut self, size: u64) -> u64 {
        let addr = self.0;
        // Next 2 MiB boundary past this block, so no two blocks overlap.
        self.0 = self
            .0
            .saturating_add(size.max(1).div_ceil(2 << 20) * (2 << 20));
        addr
    }
}

fn category_stacks(snapshot: &mut Snapshot) -> Vec<StackId> {
    CATEGORIES
        .iter()
        .map(|c| snapshot.intern_stack([Frame::synthetic(*c)]))
        .collect()
}

/// Keeps the categories as the source's, in the snapshot's `"memsnap"` dict.
fn keep_categories(snapshot: &mut Snapshot, of_allocs: Vec<(u32, u32)>, what: &str) {
    let mut source = SourceInfo::new(0, "export_memory_timeline");
    source.categories = Some(EntryCategories {
        names: CATEGORIES.iter().map(|c| c.to_string()).collect(),
        of_allocs,
    });
    let mut info = RecorderInfo {
        producer: format!("memsnap import of export_memory_timeline {what}"),
        ..RecorderInfo::default()
    };
    info.set_sources(&[source]);
    snapshot.recorder_info = Some(info);
}

fn bad(what: impl Into<String>) -> TraceError {
    TraceError::Timeline { what: what.into() }
}

/// A JSON number as an integer (the raw file writes sizes and times as integers, but a float
/// that is whole is accepted).
fn whole(v: &serde_json::Value) -> Option<i64> {
    v.as_i64().or_else(|| {
        v.as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18)
            .map(|f| f as i64)
    })
}

/// Imports the raw events: `[[t_ns, action, bytes, category], ...]`.
pub(crate) fn import_raw(bytes: &[u8]) -> Result<Imported, TraceError> {
    let rows: Vec<Vec<serde_json::Value>> =
        serde_json::from_slice(bytes).map_err(TraceError::json)?;
    let mut parsed = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let [t, action, size, category] = row.as_slice() else {
            return Err(bad(format!("row {i}: {} values, expected 4", row.len())));
        };
        let (Some(t), Some(action), Some(size)) = (whole(t), whole(action), whole(size)) else {
            return Err(bad(format!(
                "row {i}: time, action and bytes must be integers"
            )));
        };
        let category = whole(category).unwrap_or(7);
        let category = usize::try_from(category)
            .ok()
            .filter(|&c| c < CATEGORIES.len())
            .ok_or_else(|| bad(format!("row {i}: category {category} is not 0..=7")))?;
        if !(PREEXISTING..=DESTROY).contains(&action) {
            return Err(bad(format!("row {i}: action {action} is not 1..=4")));
        }
        parsed.push((t, action, size, category));
    }
    if parsed.is_empty() {
        return Err(bad("no events (the profile recorded no GPU memory)"));
    }
    let first_time = parsed
        .iter()
        .filter(|r| r.0 >= 0)
        .map(|r| r.0)
        .min()
        .unwrap_or(0);
    let mut snapshot = Snapshot::new(1);
    let stacks = category_stacks(&mut snapshot);
    let mut addresses = Addresses(SYNTHETIC_BASE);
    let mut unmatched_category_warning = None;
    // Live blocks by (size, category), oldest first.
    let mut live: HashMap<(u64, usize), VecDeque<u64>> = HashMap::default();
    let mut entries = Vec::with_capacity(parsed.len());
    let mut of_allocs: Vec<(u32, u32)> = Vec::new();
    let mut stats = DeviceReport::default();
    let mut unmatched = 0u64;
    let mut other_category = 0u64;
    for &(t, action, size, category) in &parsed {
        let t = if t < 0 { first_time } else { t };
        let entry = |action, addr, size: u64| {
            let mut e = TraceEntry::new(action, addr, size, 0);
            e.set_time_us(Some(t.div_euclid(1000)));
            e.frames = Some(stacks[category]);
            e
        };
        let opens = matches!(action, PREEXISTING | CREATE | INCREMENT_VERSION) && size > 0;
        let closes = action == DESTROY || (action == INCREMENT_VERSION && size < 0);
        let size = size.unsigned_abs();
        if opens {
            let addr = addresses.next(size);
            live.entry((size, category)).or_default().push_back(addr);
            of_allocs.push((
                u32::try_from(entries.len()).unwrap_or(u32::MAX),
                category as u32,
            ));
            entries.push(entry(Action::Alloc, addr, size));
            stats.allocs += 1;
            stats.with_stack += 1;
        } else if closes {
            // The oldest live block of this size and category; else of this size in another
            // category (a file whose versions disagree), counted.
            let found = live
                .get_mut(&(size, category))
                .and_then(VecDeque::pop_front)
                .map(|addr| (addr, category))
                .or_else(|| {
                    (0..CATEGORIES.len()).find_map(|c| {
                        live.get_mut(&(size, c))
                            .and_then(VecDeque::pop_front)
                            .map(|addr| (addr, c))
                    })
                });
            match found {
                Some((addr, c)) => {
                    other_category += u64::from(c != category);
                    entries.push(entry(Action::FreeRequested, addr, size));
                    entries.push(entry(Action::FreeCompleted, addr, size));
                    stats.frees += 1;
                }
                None => unmatched += 1,
            }
        }
    }
    keep_categories(&mut snapshot, of_allocs, "raw events");
    if other_category > 0 {
        unmatched_category_warning = Some(format!(
            "{other_category} DESTROY or version rows found no live block of their size in \
             their category: a block of that size in another category was closed"
        ));
    }
    stats.entries = entries.len();
    snapshot.device_traces = Some(vec![entries]);
    let mut warnings = vec![
        "no addresses, streams or stacks in memory-timeline data: blocks have synthetic \
         addresses and their category as their one (synthetic) frame; the categories are \
         PyTorch's; sizes are rounded; the device is put on 0"
            .to_string(),
    ];
    warnings.extend(unmatched_category_warning);
    if unmatched > 0 {
        warnings.push(format!(
            "{unmatched} DESTROY rows with no live block of their size skipped"
        ));
    }
    Ok(Imported {
        snapshot,
        report: ImportReport {
            format: "export_memory_timeline raw events".into(),
            devices: vec![stats],
            warnings,
            ..ImportReport::default()
        },
    })
}

/// Imports the plot data: `[times, sizes]`, `sizes[i]` = 9 totals (index `k+1` = category
/// `k`) after `times[i]`. Totals only: each category's total is rebuilt from synthetic blocks
/// (a rise allocates a block of the difference, a fall frees the newest blocks and allocates
/// back what it overshot), so the categories' sums are exact at every time.
pub(crate) fn import_plot(bytes: &[u8]) -> Result<Imported, TraceError> {
    let (times, sizes): (Vec<f64>, Vec<Vec<f64>>) =
        serde_json::from_slice(bytes).map_err(TraceError::json)?;
    if times.len() != sizes.len() {
        return Err(bad(format!(
            "{} times but {} size rows",
            times.len(),
            sizes.len()
        )));
    }
    if times.is_empty() {
        return Err(bad("no times (the profile recorded no GPU memory)"));
    }
    // Newer releases write µs, older ns: epoch ns are ~1.7e18, µs ~1.7e15.
    let per_us = if times.iter().any(|&t| t.abs() > 1e17) {
        1000.0
    } else {
        1.0
    };
    let mut snapshot = Snapshot::new(1);
    let stacks = category_stacks(&mut snapshot);
    let mut addresses = Addresses(SYNTHETIC_BASE);
    let mut blocks: Vec<Vec<(u64, u64)>> = vec![Vec::new(); CATEGORIES.len()];
    let mut totals = vec![0u64; CATEGORIES.len()];
    let mut entries = Vec::new();
    let mut of_allocs: Vec<(u32, u32)> = Vec::new();
    let mut stats = DeviceReport::default();
    for (i, (time, row)) in times.iter().zip(&sizes).enumerate() {
        if row.len() != CATEGORIES.len() + 1 {
            return Err(bad(format!(
                "sizes[{i}]: {} values, expected {}",
                row.len(),
                CATEGORIES.len() + 1
            )));
        }
        let time_us = (time / per_us).round() as i64;
        for (c, &value) in row[1..].iter().enumerate() {
            if !(value.is_finite() && value >= 0.0) {
                return Err(bad(format!("sizes[{i}][{}]: {value} is not a size", c + 1)));
            }
            let target = value as u64;
            let entry = |action, addr, size| {
                let mut e = TraceEntry::new(action, addr, size, 0);
                e.set_time_us(Some(time_us));
                e.frames = Some(stacks[c]);
                e
            };
            while totals[c] > target {
                let Some((addr, size)) = blocks[c].pop() else {
                    break;
                };
                entries.push(entry(Action::FreeRequested, addr, size));
                entries.push(entry(Action::FreeCompleted, addr, size));
                totals[c] -= size;
                stats.frees += 1;
            }
            if target > totals[c] {
                let size = target - totals[c];
                let addr = addresses.next(size);
                of_allocs.push((u32::try_from(entries.len()).unwrap_or(u32::MAX), c as u32));
                entries.push(entry(Action::Alloc, addr, size));
                blocks[c].push((addr, size));
                totals[c] = target;
                stats.allocs += 1;
                stats.with_stack += 1;
            }
        }
    }
    stats.entries = entries.len();
    snapshot.device_traces = Some(vec![entries]);
    keep_categories(&mut snapshot, of_allocs, "plot data");
    Ok(Imported {
        snapshot,
        report: ImportReport {
            format: "export_memory_timeline plot data".into(),
            devices: vec![stats],
            warnings: vec![
                "plot data holds totals per category only: the blocks are synthetic (one per \
                 rise), their sums per category are exact; for real blocks export \
                 \"….raw.json.gz\""
                    .into(),
            ],
            ..ImportReport::default()
        },
    })
}
