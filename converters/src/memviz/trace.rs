//! `trace`: every trace event as a line of pseudo-Python (`a = seg_3[0:2.0MiB]`, `del a`, ...).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use memsnap_format::{Action, IntField, Segment, Snapshot, TraceEntry};

use super::pyfmt::{format_size, stack_repr, str_list_repr, DictWriter};
use super::{checked, wide, MemvizError};

/// The text `print(trace(data))` writes, final newline included.
pub(crate) fn trace(snapshot: &Snapshot) -> Result<String, MemvizError> {
    let traces = snapshot.device_traces.as_ref().ok_or_else(|| {
        let why = match snapshot.shape {
            memsnap_format::Shape::SegmentList => {
                "this file is a bare segment list (what torch.cuda.memory_snapshot() returns): it has segments but no allocation history. `stats`, `segments` and `memory` work on it; for `trace`, save the snapshot with torch.cuda.memory._dump_snapshot()"
            }
            memsnap_format::Shape::Dict => "this snapshot has no device_traces (allocation history)",
        };
        MemvizError::key_error("device_traces", why.to_string())
    })?;
    let mut out = String::new();
    let static_segments = StaticSegments::new(&snapshot.segments)?;
    for (device, entries) in traces.iter().enumerate() {
        if !entries.is_empty() {
            let _ = writeln!(out, "Device {device} ----------------");
            format_device(&mut out, snapshot, &static_segments, device, entries)?;
        }
    }
    out.push('\n');
    Ok(out)
}

/// The per-device `format(entries)` of `trace()`.
fn format_device(
    out: &mut String,
    snapshot: &Snapshot,
    static_segments: &StaticSegments,
    device: usize,
    entries: &[TraceEntry],
) -> Result<(), MemvizError> {
    let _ = writeln!(out, "{} entries", entries.len());
    // Python keys both maps by address but tests `name in map` with the name, which never
    // matches: names are never recycled and entries are never removed. We keep that.
    let mut allocation_names: HashMap<i128, u64> = HashMap::new();
    let mut segment_names: HashMap<i128, u64> = HashMap::new();
    let mut segment_intervals = SegmentIntervals::default();
    let mut next_name = 0u64;
    // Python reuses the loop counter as the byte total, so only the last entry's index and
    // size reach `TOTAL MEM`; we reproduce that number.
    let mut count: i128 = 0;
    for (i, e) in entries.iter().enumerate() {
        count = i as i128;
        let place = || format!("device_traces[{device}][{i}]");
        let size = || entry_int(e, IntField::Size, &place);
        match e.action {
            Action::Alloc => {
                let addr = entry_addr(e, &place)?;
                let name = next_name;
                next_name += 1;
                write_name(out, name);
                out.push_str(" = ");
                match segment_intervals
                    .find(addr)
                    .map(|(name, saddr)| (SegName::Traced(name), saddr))
                    .or_else(|| static_segments.find(addr))
                {
                    Some(found) => {
                        match found.0 {
                            SegName::Traced(n) => write_name(out, n),
                            SegName::Snapshot(si) => {
                                let _ = write!(out, "seg_{si}");
                            }
                        }
                        let offset = checked(addr.checked_sub(found.1), &place)?;
                        let _ = write!(out, "[{offset}:");
                    }
                    None => {
                        let missing = static_segments.missing_allocated_size;
                        if let Some(si) = missing {
                            return Err(MemvizError::key_error(
                                "allocated_size",
                                format!("segments[{si}] has no allocated_size, which `trace` reads to place {}", place()),
                            ));
                        }
                        let _ = write!(out, "MEM[{addr}:");
                    }
                }
                let size = size()?;
                format_size(out, size);
                out.push_str("]\n");
                allocation_names.insert(addr, name);
                count = checked(count.checked_add(size), &place)?;
            }
            Action::FreeRequested => {
                let addr = entry_addr(e, &place)?;
                out.push_str("del ");
                write_name_or_addr(out, allocation_names.get(&addr).copied(), addr);
                out.push_str(" # ");
                format_size(out, size()?);
                out.push('\n');
            }
            Action::FreeCompleted => {
                let addr = entry_addr(e, &place)?;
                let size = size()?;
                count = checked(count.checked_sub(size), &place)?;
                out.push_str("# free completed for ");
                write_name_or_addr(out, allocation_names.get(&addr).copied(), addr);
                out.push(' ');
                format_size(out, size);
                out.push('\n');
            }
            Action::SegmentAlloc => {
                let addr = entry_addr(e, &place)?;
                let name = next_name;
                next_name += 1;
                write_name(out, name);
                let _ = write!(out, " = cudaMalloc({addr}, ");
                let size = size()?;
                format_size(out, size);
                out.push_str(")\n");
                segment_intervals.insert(name, addr, size);
                segment_names.insert(addr, name);
            }
            Action::SegmentFree => {
                let addr = entry_addr(e, &place)?;
                out.push_str("cudaFree(");
                write_name_or_addr(out, segment_names.get(&addr).copied(), addr);
                out.push_str(") # ");
                format_size(out, size()?);
                out.push('\n');
            }
            Action::Oom => {
                let free = e.exact_int(IntField::DeviceFree).ok_or_else(|| {
                    MemvizError::key_error(
                        "device_free",
                        format!("{} is an oom entry without device_free", place()),
                    )
                })?;
                out.push_str("raise OutOfMemoryError # ");
                format_size(out, size()?);
                out.push_str(" requested, ");
                format_size(out, wide(&free, &place)?);
                out.push_str(" free in CUDA\n");
            }
            Action::Annotate => {
                let addr = entry_addr(e, &place)?;
                let meta = e.user_metadata(&snapshot.strings).ok_or_else(|| {
                    MemvizError::key_error(
                        "user_metadata",
                        format!("{} is an annotate entry without user_metadata", place()),
                    )
                })?;
                out.push_str("# annotate ");
                write_name_or_addr(out, allocation_names.get(&addr).copied(), addr);
                let _ = writeln!(out, ": {}", snapshot.str(meta));
            }
            _ => {
                entry_repr(out, snapshot, e);
                out.push('\n');
            }
        }
    }
    out.push_str("TOTAL MEM: ");
    format_size(out, count);
    Ok(())
}

fn entry_addr(e: &TraceEntry, place: &dyn Fn() -> String) -> Result<i128, MemvizError> {
    match e.exact_int(IntField::Addr) {
        Some(addr) => wide(&addr, place),
        None => Err(MemvizError::key_error(
            "addr",
            format!("{} has no addr", place()),
        )),
    }
}

/// An int field every entry has (`size`), exactly.
fn entry_int(
    e: &TraceEntry,
    field: IntField,
    place: &dyn Fn() -> String,
) -> Result<i128, MemvizError> {
    let v = e.exact_int(field).unwrap_or_default();
    wide(&v, place)
}

/// `_name()`: `a` .. `z`, then `a1` .. `z1`, `a2`, ...
fn write_name(out: &mut String, n: u64) {
    out.push(char::from(b'a' + (n % 26) as u8));
    let round = n / 26;
    if round != 0 {
        let _ = write!(out, "{round}");
    }
}

/// A known name, else the address itself (Python's `dict.get(addr, addr)`).
fn write_name_or_addr(out: &mut String, name: Option<u64>, addr: i128) {
    match name {
        Some(n) => write_name(out, n),
        None => {
            let _ = write!(out, "{addr}");
        }
    }
}

enum SegName {
    /// A `segment_alloc` of this trace, by name number.
    Traced(u64),
    /// `seg_<index>` into the snapshot's segments (all devices).
    Snapshot(usize),
}

/// The snapshot's segments as `find_segment` scans them: `[address, address +
/// allocated_size)`, first match in list order.
struct StaticSegments {
    /// The visible (first-in-list-order) pieces of the non-empty ranges, disjoint and sorted
    /// by start: `(start, end, segment start, index)`, exact. Overlapping segments were
    /// scanned whole for every `alloc` (O(entries × segments)); the pieces answer each by
    /// binary search.
    pieces: Vec<(i128, i128, i128, usize)>,
    /// A segment without `allocated_size`: Python fails when it reaches it.
    missing_allocated_size: Option<usize>,
}

impl StaticSegments {
    /// O(s log s) in the segments.
    fn new(segments: &[Segment]) -> Result<Self, MemvizError> {
        let missing_allocated_size = segments.iter().position(|s| s.allocated_size.is_none());
        let limit = missing_allocated_size.unwrap_or(segments.len());
        let mut covered = Coverage::default();
        let mut pieces: Vec<(i128, i128, i128, usize)> = Vec::with_capacity(limit);
        for (i, s) in segments[..limit].iter().enumerate() {
            let place = || format!("segments[{i}]");
            let int = |field| wide(&s.exact_int(field).unwrap_or_default(), &place);
            let start = int(IntField::Address)?;
            let end = checked(start.checked_add(int(IntField::AllocatedSize)?), &place)?;
            if end > start {
                // In list order: a segment shows only where none before it does.
                for (gs, ge) in covered.cover(start, end) {
                    pieces.push((gs, ge, start, i));
                }
            }
        }
        pieces.sort_unstable();
        Ok(StaticSegments {
            pieces,
            missing_allocated_size,
        })
    }

    /// The first segment (in list order, before any without `allocated_size`) holding `addr`.
    fn find(&self, a: i128) -> Option<(SegName, i128)> {
        let pos = self.pieces.partition_point(|&(s, _, _, _)| s <= a);
        let hit = pos
            .checked_sub(1)
            .map(|p| self.pieces[p])
            .filter(|&(_, e, _, _)| a < e);
        hit.map(|(_, _, s, i)| (SegName::Snapshot(i), s))
    }
}

/// The union of the ranges covered so far, as disjoint `start -> end` intervals: which parts
/// of a new range are not covered yet. Every interval a new range overlaps is merged into
/// one, so each is walked once before it is merged away: O(log n) amortized a range.
#[derive(Default)]
struct Coverage {
    intervals: BTreeMap<i128, i128>,
    /// Intervals walked over all calls (the work, counted for the scaling test).
    #[cfg(test)]
    walked: u64,
}

impl Coverage {
    /// Covers `[start, end)` (`start < end`), returning its parts not covered before, in
    /// address order.
    fn cover(&mut self, start: i128, end: i128) -> Vec<(i128, i128)> {
        let first = self
            .intervals
            .range(..=start)
            .next_back()
            .filter(|&(_, &e)| e > start)
            .map(|(&s, &e)| (s, e));
        let overlapping: Vec<(i128, i128)> = first
            .into_iter()
            .chain(self.intervals.range(start + 1..end).map(|(&s, &e)| (s, e)))
            .collect();
        let (mut cursor, mut lo, mut hi) = (start, start, end);
        let mut gaps = Vec::new();
        for &(s, e) in &overlapping {
            if s > cursor {
                gaps.push((cursor, s));
            }
            cursor = cursor.max(e);
            (lo, hi) = (lo.min(s), hi.max(e));
            self.intervals.remove(&s);
        }
        if cursor < end {
            gaps.push((cursor, end));
        }
        #[cfg(test)]
        {
            self.walked += overlapping.len() as u64;
        }
        self.intervals.insert(lo, hi);
        gaps
    }
}

/// The `segment_alloc` ranges seen so far. Python scans them in order and never removes one,
/// so an address maps to the first range that ever covered it. We keep only the visible
/// (first-covering) pieces, disjoint, keyed by start: `start -> (end, name, segment base)`.
#[derive(Default)]
struct SegmentIntervals {
    pieces: BTreeMap<i128, (i128, u64, i128)>,
    /// What the pieces cover: a new range's gaps come from it without walking the pieces
    /// it overlaps (a range over many earlier ones walked them all on every insert).
    covered: Coverage,
}

impl SegmentIntervals {
    /// O(log n) amortized in the ranges inserted, plus the pieces it adds.
    fn insert(&mut self, name: u64, addr: i128, size: i128) {
        let start = addr;
        let end = start.saturating_add(size);
        if end <= start {
            // An empty (or negative) range covers nothing.
            return;
        }
        for (s, e) in self.covered.cover(start, end) {
            self.pieces.insert(s, (e, name, addr));
        }
    }

    fn find(&self, a: i128) -> Option<(u64, i128)> {
        self.pieces
            .range(..=a)
            .next_back()
            .filter(|(_, (e, _, _))| a < *e)
            .map(|(_, (_, name, base))| (*name, *base))
    }
}

/// `repr(entry)`: the entry dict with its keys in the order PyTorch wrote them.
fn entry_repr(out: &mut String, snapshot: &Snapshot, e: &TraceEntry) {
    let rare = e.rare.as_deref();
    let legacy_first = rare.is_some_and(|r| r.legacy_frames_first);
    let extras = rare.map(|r| r.extra.as_slice()).unwrap_or_default();
    let mut dict = DictWriter::open(out);
    if legacy_first {
        // ≤2.0 entries: frames (and cpp_frames) came first.
        if let Some(frames) = e.frames {
            stack_repr(dict.key("frames"), snapshot, frames);
        }
        for (k, v) in extras.iter().filter(|(k, _)| k == "cpp_frames") {
            dict.value(k, v);
        }
    }
    dict.str("action", e.action_name(&snapshot.strings));
    for field in [
        IntField::Addr,
        IntField::DeviceFree,
        IntField::Size,
        IntField::Stream,
        IntField::TimeUs,
    ] {
        if let Some(v) = e.exact_int(field) {
            dict.int(field.key(), v);
        }
    }
    if let Some(c) = e.compile_context(&snapshot.strings) {
        dict.str("compile_context", snapshot.str(c));
    }
    if let Some(m) = e.user_metadata(&snapshot.strings) {
        dict.str("user_metadata", snapshot.str(m));
    }
    if let Some(m) = rare.and_then(|r| r.internal_metadata) {
        dict.str("internal_metadata", snapshot.str(m));
    }
    if !legacy_first {
        if let Some(frames) = e.frames {
            stack_repr(dict.key("frames"), snapshot, frames);
        }
    }
    if let Some(ff) = rare.and_then(|r| r.forward_frames.as_deref()) {
        str_list_repr(dict.key("forward_frames"), ff);
    }
    for (k, v) in extras {
        if !(legacy_first && k == "cpp_frames") {
            dict.value(k, v);
        }
    }
    dict.close();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_go_a_to_z_then_count_rounds() {
        let name = |n| {
            let mut s = String::new();
            write_name(&mut s, n);
            s
        };
        assert_eq!(name(0), "a");
        assert_eq!(name(25), "z");
        assert_eq!(name(26), "a1");
        assert_eq!(name(27 * 26), "a27");
    }

    #[test]
    fn first_segment_range_that_covered_an_address_wins() {
        let mut iv = SegmentIntervals::default();
        iv.insert(0, 100, 50); // [100, 150) is a
        iv.insert(1, 100, 50); // same range again: still a
        iv.insert(2, 140, 40); // [150, 180) is visible as c
        assert_eq!(iv.find(100), Some((0, 100)));
        assert_eq!(iv.find(149), Some((0, 100)));
        assert_eq!(iv.find(150), Some((2, 140)));
        assert_eq!(iv.find(179), Some((2, 140)));
        assert_eq!(iv.find(180), None);
        assert_eq!(iv.find(99), None);
        iv.insert(3, 50, 200); // covers [50, 250): visible in the gaps only
        assert_eq!(iv.find(60), Some((3, 50)));
        assert_eq!(iv.find(120), Some((0, 100)));
        assert_eq!(iv.find(200), Some((3, 50)));
    }

    /// `n` small ranges, then `n` ranges over all of them: the coverage walks each interval
    /// once before merging it (walking the pieces themselves was n² here).
    fn walked_after_covering(n: i128) -> u64 {
        let mut iv = SegmentIntervals::default();
        for k in 0..n {
            iv.insert(k as u64, k * 100, 50);
        }
        for k in 0..n {
            iv.insert((n + k) as u64, -1, n * 100 + 2);
        }
        iv.covered.walked
    }

    #[test]
    fn covering_ranges_walk_linearly_many_intervals() {
        let (small, big) = (walked_after_covering(1_000), walked_after_covering(4_000));
        assert!(small >= 1_000, "the first cover walks every range: {small}");
        assert!(big <= 5 * small, "{small} -> {big}: superlinear");
    }

    /// Overlapping segments in list order: an address is in the first that holds it.
    #[test]
    fn static_segments_find_the_first_in_list_order_among_overlapping_ones() {
        let segment = |addr: u64, size: u64| {
            let mut s = Segment::new(0, addr, size, 0);
            s.allocated_size = Some(size);
            s
        };
        let segments = [
            segment(100, 50),  // 0: [100, 150)
            segment(50, 200),  // 1: [50, 250), visible around 0
            segment(140, 20),  // 2: hidden under 0 and 1
            segment(300, 10),  // 3
            segment(240, 100), // 4: [250, 300) and [310, 340) visible
        ];
        let found = StaticSegments::new(&segments).expect("valid");
        let at = |a| {
            found.find(a).map(|(n, s)| match n {
                SegName::Snapshot(i) => (i, s),
                SegName::Traced(_) => unreachable!(),
            })
        };
        let brute = |a: i128| {
            segments.iter().enumerate().find_map(|(i, s)| {
                let (lo, hi) = (i128::from(s.address), i128::from(s.address + s.total_size));
                (lo <= a && a < hi).then_some((i, lo))
            })
        };
        for a in 0..400 {
            assert_eq!(at(a), brute(a), "address {a}");
        }
    }
}
