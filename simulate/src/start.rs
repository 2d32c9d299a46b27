//! The allocator's state at the start of the recorded window, rebuilt from the file.
//!
//! * **Segments** alive then: the final segments, minus the ranges the window
//!   `segment_alloc`ed / `segment_map`ped, plus the ranges it `segment_free`d /
//!   `segment_unmap`ped (walking the trace backwards).
//! * **Allocated blocks** then: the final live blocks whose address the window never touches
//!   (exact sizes), plus every address whose first event in the window is a free (allocated
//!   before the window). The trace gives only their requested size; the block size is
//!   `round_size` of it, and in a large, non-expandable segment a following gap of at most
//!   1 MiB belongs to the block (PyTorch does not split off a remainder that small, and every
//!   other large-pool block is bigger than 1 MiB).
//! * The rest of each segment is free, neighbours merged. Expandable segments become one
//!   reservation per (stream, pool) from the lowest address seen, whose size is PyTorch's
//!   1⅛ × device memory (cut short before the next known range).

use std::collections::BTreeMap;

// The first event of every address in the trace: SipHash was a tenth of a replay.
use foldhash::HashMap;

use memsnap_format::{Action, Block, BlockState, Segment, SegmentType, Snapshot, TraceEntry};
use memsnap_recorder::config::{MIB, SMALL_BUFFER, SMALL_SIZE};
use memsnap_recorder::AllocatorConfig;

#[derive(Clone, Copy, Debug)]
struct RangeInfo {
    len: u64,
    stream: i64,
    /// `None`: pool not known yet.
    small: Option<bool>,
    expandable: bool,
}

/// An expandable reservation at the start of the window.
#[derive(Clone, Debug)]
pub struct Reservation {
    pub base: u64,
    pub size: u64,
    /// Its mapped ranges, as snapshot segments with blocks.
    pub mapped: Vec<Segment>,
}

/// The state at the start of the window.
#[derive(Clone, Debug, Default)]
pub struct StartState {
    /// Plain segments with their blocks (addresses set).
    pub segments: Vec<Segment>,
    pub reservations: Vec<Reservation>,
    /// Reserved bytes then (plain segments plus mapped ranges).
    pub reserved_bytes: u64,
    /// Allocated blocks then, and how many of them have an estimated size.
    pub allocated_blocks: u64,
    pub estimated_blocks: u64,
    /// Inconsistencies that were absorbed (first few kept; the count is exact).
    pub anomalies: Vec<String>,
    pub anomaly_count: u64,
}

impl StartState {
    fn note(&mut self, what: String) {
        self.anomaly_count += 1;
        if self.anomalies.len() < 20 {
            self.anomalies.push(what);
        }
    }
}

/// The reserved ranges alive at the start of the window, and their total.
pub struct Ranges {
    map: BTreeMap<u64, RangeInfo>,
    pub reserved_bytes: u64,
    anomalies: Vec<String>,
}

/// Walks the trace backwards from the final segments.
pub fn ranges_at_start(snapshot: &Snapshot, device: i64, trace: &[TraceEntry]) -> Ranges {
    let mut r = Ranges {
        map: BTreeMap::new(),
        reserved_bytes: 0,
        anomalies: Vec::new(),
    };
    for seg in snapshot.segments.iter().filter(|s| s.device == device) {
        let info = RangeInfo {
            len: seg.total_size,
            stream: seg.stream,
            small: match seg.segment_type {
                Some(SegmentType::Small) => Some(true),
                Some(SegmentType::Large) => Some(false),
                _ => Some(seg.total_size == SMALL_BUFFER),
            },
            expandable: seg.is_expandable == Some(true),
        };
        r.insert(seg.address, info);
    }
    for entry in trace.iter().rev() {
        match entry.action {
            Action::SegmentAlloc | Action::SegmentMap => r.subtract(entry.addr, entry.size),
            Action::SegmentFree => r.insert(
                entry.addr,
                RangeInfo {
                    len: entry.size,
                    stream: entry.stream,
                    small: Some(entry.size == SMALL_BUFFER),
                    expandable: false,
                },
            ),
            Action::SegmentUnmap => r.insert(
                entry.addr,
                RangeInfo {
                    len: entry.size,
                    stream: entry.stream,
                    small: None,
                    expandable: true,
                },
            ),
            _ => {}
        }
    }
    r.reserved_bytes = r.map.values().fold(0u64, |s, i| s.saturating_add(i.len));
    r
}

impl Ranges {
    fn insert(&mut self, addr: u64, info: RangeInfo) {
        if info.len == 0 || addr.checked_add(info.len).is_none() {
            self.anomalies.push(format!(
                "segment range at {addr:#x} of {} bytes ignored",
                info.len
            ));
            return;
        }
        let end = addr + info.len;
        let overlaps = self
            .map
            .range(..end)
            .next_back()
            .is_some_and(|(&a, i)| a.saturating_add(i.len) > addr);
        if overlaps {
            self.anomalies.push(format!(
                "segment range at {addr:#x} overlaps another; the later one is kept"
            ));
            self.subtract(addr, info.len);
        }
        self.map.insert(addr, info);
    }

    /// Removes `[addr, addr + len)`, keeping the parts of ranges outside it.
    fn subtract(&mut self, addr: u64, len: u64) {
        let end = addr.saturating_add(len);
        let hits: Vec<u64> = self
            .map
            .range(..end)
            .rev()
            .take_while(|(&a, i)| a >= addr || a.saturating_add(i.len) > addr)
            .filter(|(&a, i)| a.saturating_add(i.len) > addr)
            .map(|(&a, _)| a)
            .collect();
        if hits.is_empty() {
            self.anomalies.push(format!(
                "segment at {addr:#x} ({len} bytes) allocated in the window is not in the final segments"
            ));
        }
        for a in hits {
            let Some(info) = self.map.remove(&a) else {
                continue;
            };
            let a_end = a.saturating_add(info.len);
            if a < addr {
                self.map.insert(
                    a,
                    RangeInfo {
                        len: addr - a,
                        ..info
                    },
                );
            }
            if a_end > end {
                self.map.insert(
                    end,
                    RangeInfo {
                        len: a_end - end,
                        ..info
                    },
                );
            }
        }
    }
}

struct StartBlock {
    size: u64,
    requested: u64,
    estimated: bool,
}

/// Lays out the blocks of the start state into the start ranges. `capacity` sizes expandable
/// reservations.
pub fn layout(
    snapshot: &Snapshot,
    device: i64,
    trace: &[TraceEntry],
    ranges: Ranges,
    config: &AllocatorConfig,
    capacity: u64,
) -> StartState {
    let mut state = StartState {
        reserved_bytes: ranges.reserved_bytes,
        ..Default::default()
    };
    for a in ranges.anomalies {
        state.note(a);
    }
    // First event of each block address in the window.
    let mut first: HashMap<u64, &TraceEntry> = HashMap::default();
    for e in trace {
        if matches!(
            e.action,
            Action::Alloc | Action::FreeRequested | Action::FreeCompleted | Action::Free
        ) {
            first.entry(e.addr).or_insert(e);
        }
    }
    let mut blocks: BTreeMap<u64, StartBlock> = BTreeMap::new();
    for seg in snapshot.segments.iter().filter(|s| s.device == device) {
        for (addr, b) in seg.block_addresses() {
            if b.state.is_active() && !first.contains_key(&addr) {
                blocks.insert(
                    addr,
                    StartBlock {
                        size: b.size,
                        requested: b.requested_size.unwrap_or(b.size),
                        estimated: false,
                    },
                );
            }
        }
    }
    for (&addr, e) in &first {
        if e.action != Action::Alloc {
            blocks.insert(
                addr,
                StartBlock {
                    size: config.round_size(e.size),
                    requested: e.size,
                    estimated: true,
                },
            );
        }
    }

    // Pools of expandable ranges only known from unmaps: by their blocks, else their size.
    let large_page = config.large_segment_size.max(1);
    let mut map = ranges.map;
    for (&addr, info) in map.iter_mut() {
        if info.small.is_none() {
            let end = addr.saturating_add(info.len);
            let small_block = blocks
                .range(addr..end)
                .next()
                .map(|(_, b)| b.size <= SMALL_SIZE);
            info.small = Some(small_block.unwrap_or(info.len % large_page != 0));
        }
    }

    // Expandable ranges grouped per (stream, pool), with the window's mappings.
    let mut groups: BTreeMap<(i64, bool), Vec<(u64, RangeInfo)>> = BTreeMap::new();
    let mut window_maps: BTreeMap<(i64, bool), (u64, u64)> = BTreeMap::new();
    for e in trace {
        if matches!(e.action, Action::SegmentMap | Action::SegmentUnmap) {
            let small = e.size % large_page != 0;
            let end = e.addr.saturating_add(e.size);
            let span = window_maps
                .entry((e.stream, small))
                .or_insert((e.addr, end));
            span.0 = span.0.min(e.addr);
            span.1 = span.1.max(end);
        }
    }
    // Sorted: each group finds the next start past it by binary search (a scan of every
    // start per group was O(groups × ranges), a group per stream).
    let mut all_starts: Vec<u64> = map
        .keys()
        .copied()
        .chain(window_maps.values().map(|s| s.0))
        .collect();
    all_starts.sort_unstable();

    for (&addr, &info) in &map {
        let small = info.small.unwrap_or(false);
        let segment = build_segment(device, addr, info, small, &blocks, &mut state);
        if info.expandable {
            groups
                .entry((info.stream, small))
                .or_default()
                .push((addr, info));
            // Adjacent mapped ranges form one snapshot segment; kept apart here, merged below.
            state.reservations.push(Reservation {
                base: addr,
                size: 0,
                mapped: vec![segment],
            });
        } else {
            state.segments.push(segment);
        }
    }

    // The single-range reservations by the (stream, pool) of their mapping, in order: a
    // group only takes those of its own key.
    let mut by_key: BTreeMap<(i64, bool), Vec<usize>> = BTreeMap::new();
    for (i, r) in state.reservations.iter().enumerate() {
        if let Some(first) = r.mapped.first() {
            let small = first.segment_type == Some(SegmentType::Small);
            by_key.entry((first.stream, small)).or_default().push(i);
        }
    }
    // One reservation per group.
    let mut reservations: Vec<Reservation> = Vec::new();
    for ((stream, small), members) in &groups {
        let page = if *small { SMALL_BUFFER } else { large_page };
        let mut base = members.iter().map(|m| m.0).min().unwrap_or(0);
        let mut end = members
            .iter()
            .map(|m| m.0.saturating_add(m.1.len))
            .max()
            .unwrap_or(0);
        if let Some(&(lo, hi)) = window_maps.get(&(*stream, *small)) {
            base = base.min(lo);
            end = end.max(hi);
        }
        let wanted = capacity
            .saturating_add(capacity / 8)
            .checked_next_multiple_of(page)
            .unwrap_or(u64::MAX - page);
        let past = all_starts.partition_point(|&s| s <= base || s < end);
        let next = all_starts.get(past).copied().unwrap_or(u64::MAX);
        let min_size = (end - base).next_multiple_of(page);
        let size = wanted.max(min_size).min(next - base).max(min_size);
        let mut mapped: Vec<Segment> = Vec::new();
        for &i in by_key.get(&(*stream, *small)).into_iter().flatten() {
            let r = &mut state.reservations[i];
            let Some(first) = r.mapped.first() else {
                continue;
            };
            if first.address >= base && first.address < base.saturating_add(size) {
                mapped.append(&mut r.mapped);
            }
        }
        mapped.sort_by_key(|s| s.address);
        reservations.push(Reservation {
            base,
            size,
            mapped: merge_adjacent(mapped),
        });
    }
    state.reservations = reservations;

    // Blocks that fall in no range.
    let placed: u64 = state
        .segments
        .iter()
        .chain(state.reservations.iter().flat_map(|r| r.mapped.iter()))
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .count() as u64;
    let total = blocks.len() as u64;
    if placed < total {
        state.note(format!(
            "{} blocks allocated before the window lie outside every segment of the start state and were left out",
            total - placed
        ));
    }
    state.allocated_blocks = placed;
    state
}

/// A plain segment or mapped range with the start blocks inside it; the rest free.
fn build_segment(
    device: i64,
    addr: u64,
    info: RangeInfo,
    small: bool,
    blocks: &BTreeMap<u64, StartBlock>,
    state: &mut StartState,
) -> Segment {
    let end = addr.saturating_add(info.len);
    let mut seg = Segment::new(device, addr, info.len, info.stream);
    seg.segment_type = Some(if small {
        SegmentType::Small
    } else {
        SegmentType::Large
    });
    seg.is_expandable = Some(info.expandable);
    let inside: Vec<(u64, &StartBlock)> = blocks.range(addr..end).map(|(&a, b)| (a, b)).collect();
    let mut cursor = addr;
    let mut out: Vec<Block> = Vec::new();
    for (i, &(a, b)) in inside.iter().enumerate() {
        if a < cursor || !(a - addr).is_multiple_of(512) {
            state.note(format!(
                "block at {a:#x} overlaps the block before it or is misaligned; left out"
            ));
            continue;
        }
        let next = inside.get(i + 1).map_or(end, |n| n.0).min(end);
        let mut size = b.size;
        if a.saturating_add(size) > next {
            if b.estimated {
                size = next - a;
            } else {
                state.note(format!("block at {a:#x} runs past its neighbour; left out"));
                continue;
            }
        }
        let gap = next - a - size;
        if b.estimated && !small && !info.expandable && gap > 0 && gap <= MIB {
            size += gap;
        }
        if size == 0 || !size.is_multiple_of(512) {
            state.note(format!("block at {a:#x} has size {size}; left out"));
            continue;
        }
        if a > cursor {
            out.push(free_block(cursor, a - cursor));
        }
        out.push(Block {
            address: Some(a),
            size,
            requested_size: Some(b.requested),
            state: BlockState::ActiveAllocated,
            ..Default::default()
        });
        if b.estimated {
            state.estimated_blocks += 1;
        }
        cursor = a + size;
    }
    if cursor < end {
        out.push(free_block(cursor, end - cursor));
    }
    seg.blocks = out;
    seg
}

fn free_block(addr: u64, size: u64) -> Block {
    Block {
        address: Some(addr),
        size,
        requested_size: Some(0),
        state: BlockState::Inactive,
        ..Default::default()
    }
}

/// Joins mapped ranges that touch (a snapshot writes each contiguous mapped range once).
fn merge_adjacent(segments: Vec<Segment>) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    for s in segments {
        if let Some(last) = out.last_mut() {
            if last.address.saturating_add(last.total_size) == s.address {
                last.total_size += s.total_size;
                last.blocks.extend(s.blocks);
                continue;
            }
        }
        out.push(s);
    }
    out
}
