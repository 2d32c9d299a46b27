//! The segments of a live listener's snapshot, kept in step with the entries that follow the
//! state (issue 26).
//!
//! A listener gets the allocator's segments once, at connect; the entries after it say what
//! changed. Left as they were at connect, the segments contradicted the trace: a block
//! allocated at connect and freed later stayed `active_allocated` in the final segments, so
//! a replay (memsnap's, or PyTorch's `_memory_viz.py`, which walks the trace back from the
//! final segments) counted it as live for the whole window, and segments made or released
//! after connect were missing or still there. [`SegmentModel`] applies each entry to the
//! segments instead:
//!
//! * `segment_alloc`/`segment_free` add and remove a segment (one `inactive` block);
//!   `segment_map`/`segment_unmap` grow an expandable segment (a mapped range that ends where
//!   another starts extends it, as the recorder's snapshot shows one segment per contiguous
//!   mapped range) or cut a range out of one, splitting it;
//! * `alloc` turns the front of the `inactive` block holding its address `active_allocated`;
//!   `free_requested` makes it `active_pending_free`, `free_completed` `inactive` again,
//!   merged with `inactive` neighbours, as the caching allocator merges.
//!
//! The segment list (addresses, sizes, streams) and the block states are exact. Block *sizes*
//! are not always: a trace entry carries the requested size, and the block the allocator
//! gave may be larger (its rounding, or a remainder too small to split off). A block made
//! here is the request rounded up to 512 bytes, the rest of the free block staying
//! `inactive`; blocks still tile their segments, and every allocation made after connect is
//! in the trace, so the replays count each one once. A segment made after connect is
//! `small` when it is 2 MiB (PyTorch's small-pool segment size), else `large`.
//!
//! Each entry costs O(log b) for b blocks (ordered maps by address; a `segment_unmap` also
//! O(the smaller part split off)); [`SegmentModel::write`] builds the snapshot's segment
//! list, O(b), when a listener asks for the snapshot.
//!
//! A state whose segments of the device are not well formed (overlapping segments, blocks
//! that do not tile their segment) is not modelled: its segments stay those at connect.

use std::collections::BTreeMap;

use crate::intern::StackId;
use crate::model::{Action, Block, BlockState, Segment, SegmentType};

/// PyTorch's small-pool segment size (`kSmallBuffer`).
const SMALL_SEGMENT: u64 = 2 << 20;
/// The allocator's block granularity (`kMinBlockSize`).
const MIN_BLOCK: u64 = 512;

/// One segment: its fields (with `blocks` empty) and its blocks by address.
#[derive(Debug, Clone)]
struct Seg {
    head: Segment,
    blocks: BTreeMap<u64, Block>,
}

impl Seg {
    fn end(&self) -> u64 {
        self.head.address.saturating_add(self.head.total_size)
    }

    /// The segment as the snapshot holds it, with its size sums.
    fn to_segment(&self) -> Segment {
        let mut seg = self.head.clone();
        let (mut allocated, mut active, mut requested) = (0u64, 0u64, 0u64);
        seg.blocks = self
            .blocks
            .values()
            .inspect(|b| {
                if b.state == BlockState::ActiveAllocated {
                    allocated = allocated.saturating_add(b.size);
                }
                if b.state.is_active() {
                    active = active.saturating_add(b.size);
                    requested = requested.saturating_add(b.requested_size.unwrap_or(b.size));
                }
            })
            .cloned()
            .collect();
        seg.allocated_size = Some(allocated);
        seg.active_size = Some(active);
        seg.requested_size = Some(requested);
        seg
    }
}

/// One device's segments, changed by its trace entries (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct SegmentModel {
    device: i64,
    segments: BTreeMap<u64, Seg>,
    /// Segments of other devices, left as they were.
    others: Vec<Segment>,
    /// The empty stack, for blocks and segments made without one.
    empty: StackId,
}

/// What a trace entry says, as the model needs it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Change {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    pub frames: Option<StackId>,
}

impl SegmentModel {
    /// Takes `device`'s segments out of `segments` (the state's) to model them; `None`, and
    /// `segments` untouched, when they are not well formed. O(b log b).
    pub fn new(segments: &mut Vec<Segment>, device: i64, empty: StackId) -> Option<Self> {
        let mut mine: Vec<&Segment> = segments.iter().filter(|s| s.device == device).collect();
        mine.sort_by_key(|s| s.address);
        let mut prev_end = 0u64;
        for s in &mine {
            let end = s.address.checked_add(s.total_size)?;
            if s.address < prev_end || s.total_size == 0 {
                return None;
            }
            let mut next = s.address;
            for (addr, b) in s.block_addresses() {
                if addr != next || b.size == 0 {
                    return None;
                }
                next = addr.checked_add(b.size)?;
            }
            if next != end {
                return None;
            }
            prev_end = end;
        }
        let (mine, others): (Vec<Segment>, Vec<Segment>) = std::mem::take(segments)
            .into_iter()
            .partition(|s| s.device == device);
        let segments = mine
            .into_iter()
            .map(|mut head| {
                let blocks = std::mem::take(&mut head.blocks);
                let mut next = head.address;
                let blocks = blocks
                    .into_iter()
                    .map(|mut b| {
                        let addr = b.address.unwrap_or(next);
                        b.address = Some(addr);
                        next = addr.wrapping_add(b.size);
                        (addr, b)
                    })
                    .collect();
                (head.address, Seg { head, blocks })
            })
            .collect();
        Some(SegmentModel {
            device,
            segments,
            others,
            empty,
        })
    }

    /// The segment list of the snapshot: this device's, by address, then the others'. O(b).
    pub fn write(&self, out: &mut Vec<Segment>) {
        out.clear();
        out.extend(self.segments.values().map(Seg::to_segment));
        out.extend(self.others.iter().cloned());
    }

    /// Applies one trace entry. O(log b); entries that do not fit the segments (an address
    /// in no segment, a block in another state than the action expects) change nothing.
    pub fn apply(&mut self, c: Change) {
        match c.action {
            Action::SegmentAlloc => self.add_segment(c, false),
            Action::SegmentMap => self.add_segment(c, true),
            Action::SegmentFree => {
                self.segments.remove(&c.addr);
            }
            Action::SegmentUnmap => self.unmap(c.addr, c.size),
            Action::Alloc => self.alloc(c),
            Action::FreeRequested => {
                if let Some(b) = self.block_at(c.addr) {
                    if b.state == BlockState::ActiveAllocated {
                        b.state = BlockState::ActivePendingFree;
                    }
                }
            }
            Action::FreeCompleted => self.free(c.addr),
            _ => {}
        }
    }

    /// The segment holding `addr`.
    fn holding(&mut self, addr: u64) -> Option<&mut Seg> {
        self.segments
            .range_mut(..=addr)
            .next_back()
            .map(|(_, s)| s)
            .filter(|s| addr < s.end())
    }

    /// The block that starts at `addr`.
    fn block_at(&mut self, addr: u64) -> Option<&mut Block> {
        self.holding(addr)?.blocks.get_mut(&addr)
    }

    fn inactive_block(&self, addr: u64, size: u64) -> Block {
        let mut b = Block::new(addr, size, BlockState::Inactive);
        b.frames = Some(self.empty);
        b
    }

    /// `segment_alloc` (a new segment) or `segment_map` (`expandable`: extends the
    /// expandable segment that ends at `addr`, or starts one).
    fn add_segment(&mut self, c: Change, expandable: bool) {
        let Some(end) = c.addr.checked_add(c.size) else {
            return;
        };
        let overlaps = self
            .segments
            .range(..end)
            .next_back()
            .is_some_and(|(_, s)| s.end() > c.addr);
        if c.size == 0 || overlaps {
            return;
        }
        let block = self.inactive_block(c.addr, c.size);
        if expandable {
            let before = self.segments.range_mut(..c.addr).next_back();
            if let Some((_, seg)) = before.filter(|(_, s)| {
                s.end() == c.addr && s.head.is_expandable == Some(true) && s.head.stream == c.stream
            }) {
                seg.head.total_size += c.size;
                match seg.blocks.iter_mut().next_back() {
                    Some((_, last)) if last.state == BlockState::Inactive => last.size += c.size,
                    _ => {
                        seg.blocks.insert(c.addr, block);
                    }
                }
                return;
            }
        }
        let mut head = Segment::new(self.device, c.addr, c.size, c.stream);
        head.segment_type = Some(if c.size == SMALL_SEGMENT && !expandable {
            SegmentType::Small
        } else {
            SegmentType::Large
        });
        head.is_expandable = Some(expandable);
        head.frames = Some(c.frames.unwrap_or(self.empty));
        head.frames_after_blocks = c.frames.is_some_and(|f| f != self.empty);
        let blocks = BTreeMap::from([(c.addr, block)]);
        self.segments.insert(c.addr, Seg { head, blocks });
    }

    /// `segment_unmap`: cuts `[addr, addr + size)` out of the segment holding it (a range
    /// that leaves its segment changes nothing).
    fn unmap(&mut self, addr: u64, size: u64) {
        let Some(end) = addr.checked_add(size) else {
            return;
        };
        let Some(start) = self
            .holding(addr)
            .filter(|s| end <= s.end() && size > 0)
            .map(|s| s.head.address)
        else {
            return;
        };
        let Some(mut seg) = self.segments.remove(&start) else {
            return;
        };
        let seg_end = seg.end();
        let mut right = seg.blocks.split_off(&end);
        let mut middle = seg.blocks.split_off(&addr);
        // A block that straddles a cut keeps its part outside the range.
        if let Some((&a, b)) = seg.blocks.iter_mut().next_back() {
            let b_end = a.saturating_add(b.size);
            if b_end > addr {
                b.size = addr - a;
                if b_end > end {
                    let mut tail = b.clone();
                    tail.address = Some(end);
                    tail.size = b_end - end;
                    right.insert(end, tail);
                }
            }
        }
        if let Some((&a, b)) = middle.iter_mut().next_back() {
            let b_end = a.saturating_add(b.size);
            if b_end > end {
                let mut tail = b.clone();
                tail.address = Some(end);
                tail.size = b_end - end;
                right.insert(end, tail);
            }
        }
        drop(middle);
        if end < seg_end {
            let mut head = seg.head.clone();
            head.address = end;
            head.total_size = seg_end - end;
            self.segments.insert(
                end,
                Seg {
                    head,
                    blocks: right,
                },
            );
        }
        if addr > start {
            seg.head.total_size = addr - start;
            self.segments.insert(start, seg);
        }
    }

    /// `alloc`: the front of the `inactive` block holding `addr` becomes the allocation.
    fn alloc(&mut self, c: Change) {
        let want = c.size.max(1).div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK);
        let empty = self.empty;
        let inactive = self.inactive_block(0, 0);
        let Some(seg) = self.holding(c.addr) else {
            return;
        };
        let Some((&start, block)) = seg.blocks.range_mut(..=c.addr).next_back() else {
            return;
        };
        let block_end = start.saturating_add(block.size);
        if block.state != BlockState::Inactive || c.addr >= block_end {
            return;
        }
        let size = want.min(block_end - c.addr);
        if c.addr > start {
            block.size = c.addr - start;
        }
        let mut made = Block::new(c.addr, size, BlockState::ActiveAllocated);
        made.requested_size = Some(c.size);
        made.frames = Some(c.frames.unwrap_or(empty));
        seg.blocks.insert(c.addr, made);
        let rest = c.addr + size;
        if rest < block_end {
            let mut tail = inactive;
            tail.address = Some(rest);
            tail.size = block_end - rest;
            tail.requested_size = Some(tail.size);
            seg.blocks.insert(rest, tail);
        }
    }

    /// `free_completed`: the block at `addr` becomes `inactive`, merged with `inactive`
    /// neighbours.
    fn free(&mut self, addr: u64) {
        let empty = self.empty;
        let Some(seg) = self.holding(addr) else {
            return;
        };
        let Some(block) = seg.blocks.get_mut(&addr) else {
            return;
        };
        if !block.state.is_active() {
            return;
        }
        block.state = BlockState::Inactive;
        block.frames = Some(empty);
        let mut size = block.size;
        let next = addr.saturating_add(size);
        if seg
            .blocks
            .get(&next)
            .is_some_and(|b| b.state == BlockState::Inactive)
        {
            if let Some(b) = seg.blocks.remove(&next) {
                size += b.size;
            }
            if let Some(block) = seg.blocks.get_mut(&addr) {
                block.size = size;
            }
        }
        let before = seg.blocks.range_mut(..addr).next_back();
        if let Some((_, prev)) = before
            .filter(|(a, b)| b.state == BlockState::Inactive && a.saturating_add(b.size) == addr)
        {
            prev.size += size;
            seg.blocks.remove(&addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn change(action: Action, addr: u64, size: u64) -> Change {
        Change {
            action,
            addr,
            size,
            stream: 0,
            frames: None,
        }
    }

    fn model() -> SegmentModel {
        SegmentModel::new(&mut Vec::new(), 0, StackId::from_index(0)).unwrap()
    }

    /// `(address, total_size, [(block address, size, state)])` of a segment.
    type Shape = (u64, u64, Vec<(u64, u64, BlockState)>);

    fn shape(m: &SegmentModel) -> Vec<Shape> {
        let mut out = Vec::new();
        m.write(&mut out);
        out.iter()
            .map(|s| {
                let blocks = s
                    .block_addresses()
                    .map(|(a, b)| (a, b.size, b.state))
                    .collect();
                (s.address, s.total_size, blocks)
            })
            .collect()
    }

    #[test]
    fn an_unmap_in_the_middle_splits_the_expandable_segment_in_two() {
        let mut m = model();
        m.apply(change(Action::SegmentMap, 0, 4 * MIB));
        m.apply(change(Action::SegmentMap, 4 * MIB, 4 * MIB));
        m.apply(change(Action::Alloc, 0, MIB));
        m.apply(change(Action::Alloc, MIB, MIB));
        assert_eq!(
            shape(&m).len(),
            1,
            "a range that ends where another starts extends it"
        );
        m.apply(change(Action::SegmentUnmap, 3 * MIB, 2 * MIB));
        use BlockState::*;
        assert_eq!(
            shape(&m),
            [
                (
                    0,
                    3 * MIB,
                    vec![
                        (0, MIB, ActiveAllocated),
                        (MIB, MIB, ActiveAllocated),
                        (2 * MIB, MIB, Inactive)
                    ]
                ),
                (5 * MIB, 3 * MIB, vec![(5 * MIB, 3 * MIB, Inactive)]),
            ]
        );
    }

    #[test]
    fn entries_that_do_not_fit_the_segments_change_nothing() {
        let mut m = model();
        m.apply(change(Action::SegmentAlloc, 0, 2 * MIB));
        m.apply(change(Action::Alloc, 0, 4096));
        let before = shape(&m);
        for c in [
            // Inside an allocated block, outside any segment, overlapping a segment.
            change(Action::Alloc, 512, 512),
            change(Action::Alloc, 64 * MIB, 512),
            change(Action::SegmentAlloc, MIB, 2 * MIB),
            change(Action::SegmentAlloc, u64::MAX - 10, 100),
            change(Action::SegmentUnmap, MIB, 4 * MIB),
            change(Action::FreeCompleted, 8192, 512),
            change(Action::SegmentFree, 12345, 0),
        ] {
            m.apply(c);
            assert_eq!(shape(&m), before, "{c:?}");
        }
        // A free merges the block back with its free neighbour.
        m.apply(change(Action::FreeRequested, 0, 4096));
        m.apply(change(Action::FreeCompleted, 0, 4096));
        assert_eq!(
            shape(&m),
            [(0, 2 * MIB, vec![(0, 2 * MIB, BlockState::Inactive)])]
        );
    }

    #[test]
    fn a_state_whose_blocks_do_not_tile_their_segment_is_not_modelled() {
        let mut seg = Segment::new(0, 0, 2 * MIB, 0);
        seg.blocks.push(Block::new(0, MIB, BlockState::Inactive));
        let mut segments = vec![seg];
        assert!(SegmentModel::new(&mut segments, 0, StackId::from_index(0)).is_none());
        assert_eq!(segments.len(), 1, "left as they were");
    }
}
