//! Putting recorded segments back: a replay that starts mid-run first rebuilds the cache as
//! the file's snapshot shows it (see `CachingAllocator::restore_segment`).

use super::State;
use crate::allocator::arena::NIL;
use crate::allocator::block::{Block, SegmentRec};
use crate::allocator::pool::pool_index;
use crate::config::MIN_BLOCK_SIZE;
use crate::stacks::NO_STACK;

/// A segment to restore (see [`State::restore_segment`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RestoreSegment {
    pub base: u64,
    pub size: u64,
    pub stream: i64,
    pub small: bool,
    pub expandable: bool,
}

/// What a restored block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RestoreKind {
    Free,
    /// Allocated, with the caller's requested size.
    Allocated(u64),
    /// An unmapped part of an expandable reservation.
    Unmapped,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct RestoreBlock {
    pub size: u64,
    pub kind: RestoreKind,
}

impl State {
    /// Puts a segment the device already holds into the cache with the given block layout
    /// (see [`crate::allocator::CachingAllocator::restore_segment`]). Blocks must be non-empty
    /// multiples of 512 bytes that tile `[base, base + size)`; adjacent free (or unmapped)
    /// blocks are merged as PyTorch keeps them. Returns false, changing nothing, when the layout is invalid or
    /// overlaps a segment, an allocated pointer or a block already held.
    pub fn restore_segment(&mut self, seg: &RestoreSegment, blocks: &[RestoreBlock]) -> bool {
        let Some(end) = seg.base.checked_add(seg.size) else {
            return false;
        };
        if seg.size == 0 || blocks.is_empty() {
            return false;
        }
        let mut total = 0u64;
        for b in blocks {
            if b.size == 0 || !b.size.is_multiple_of(MIN_BLOCK_SIZE) {
                return false;
            }
            if !seg.expandable && b.kind == RestoreKind::Unmapped {
                return false;
            }
            total = match total.checked_add(b.size) {
                Some(t) => t,
                None => return false,
            };
        }
        if total != seg.size {
            return false;
        }
        let overlaps = self
            .segments
            .iter_live()
            .any(|(_, s)| s.base < end && seg.base < s.base.saturating_add(s.size));
        if overlaps {
            return false;
        }
        // Merge neighbours PyTorch would have merged.
        let mut merged: Vec<RestoreBlock> = Vec::with_capacity(blocks.len());
        for b in blocks {
            if let Some(last) = merged.last_mut() {
                if last.kind == b.kind
                    && matches!(b.kind, RestoreKind::Free | RestoreKind::Unmapped)
                {
                    last.size += b.size;
                    continue;
                }
            }
            merged.push(*b);
        }
        let mut addr = seg.base;
        for b in &merged {
            if matches!(b.kind, RestoreKind::Allocated(_)) && self.live.contains_key(&addr) {
                return false;
            }
            addr += b.size;
        }
        if seg.expandable && merged.iter().all(|b| b.kind == RestoreKind::Unmapped) {
            // PyTorch destroys a reservation once it is wholly unmapped.
            return false;
        }
        let small = seg.small;
        let segment = self.segments.insert(SegmentRec {
            base: seg.base,
            size: seg.size,
            stream: seg.stream,
            small,
            expandable: seg.expandable,
            stack: NO_STACK,
            live: true,
        });
        let split = merged.len() > 1;
        let count = self.pools[pool_index(small)].get_free_blocks_call_count;
        let mut prev = NIL;
        let mut addr = seg.base;
        for b in &merged {
            let (allocated, requested) = match b.kind {
                RestoreKind::Allocated(requested) => (true, requested),
                _ => (false, 0),
            };
            let mapped = b.kind != RestoreKind::Unmapped;
            let idx = self.blocks.insert(Block {
                addr,
                size: b.size,
                requested,
                stream: seg.stream,
                small,
                segment,
                prev,
                next: NIL,
                allocated,
                mapped,
                event_count: 0,
                stream_uses: Vec::new(),
                gc_count_base: count,
                stack: NO_STACK,
                live: true,
            });
            if prev != NIL {
                self.blocks[prev].next = idx;
            }
            if mapped {
                self.total_allocated_memory += b.size;
                self.stats.reserved_bytes.increase(small, b.size);
            }
            if allocated {
                self.live.insert(addr, idx);
                self.count_allocated_block(small, b.size, requested);
            } else {
                self.pool_insert(idx);
                if mapped && split && !seg.expandable {
                    self.stats.inactive_split.increase(small, 1);
                    self.stats.inactive_split_bytes.increase(small, b.size);
                }
            }
            prev = idx;
            addr += b.size;
        }
        if !seg.expandable {
            self.count_segment_added(small, seg.size);
        }
        true
    }

    // ---- introspection -----------------------------------------------------------------
}
