//! The free blocks of a pool and the best-fit search over them.
//!
//! Each device has two pools, small (blocks of at most 1 MiB, from 2 MiB segments) and large.
//! A pool keeps its free mapped blocks ordered by `(stream, size, address)`, as PyTorch's
//! `BlockPool` orders them, so that best fit is the first key at or after
//! `(stream, rounded size)`; the unmapped tails of expandable segments are kept apart, ordered
//! by `(stream, address)`. Keys end with the block's [`Idx`], which leads from a key back to
//! its block.

use super::arena::{Arena, Idx};
use super::block::{Block, SegmentRec};
use super::free_set::{FreeSet, Pos, Scan};

/// A free mapped block's key in its pool: (stream, size, address, block).
pub(crate) type FreeKey = (i64, u64, u64, Idx);

#[derive(Debug, Default)]
pub(crate) struct BlockPool {
    /// Free mapped blocks by (stream, size, address).
    pub blocks: FreeSet<FreeKey>,
    /// Unmapped parts of expandable segments by (stream, address).
    pub unmapped: FreeSet<(i64, u64, Idx)>,
    pub get_free_blocks_call_count: u64,
}

/// The pool a block of this kind belongs to: index 0 is the small pool, 1 the large one.
#[inline]
pub(crate) fn pool_index(small: bool) -> usize {
    if small {
        0
    } else {
        1
    }
}

/// The key of the free mapped block `idx` in its pool.
#[inline]
pub(crate) fn free_key(block: &Block, idx: Idx) -> FreeKey {
    (block.stream, block.size, block.addr, idx)
}

/// The settings best fit obeys, read from the allocator's configuration for one search.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FitRules {
    /// Blocks at least this big are "oversize": never split, and only handed out for requests
    /// close to their size.
    pub max_split_size: u64,
    /// How much bigger than the request an oversize block may be.
    pub max_non_split_rounding_size: u64,
    /// Expandable segments are in use: an expandable block counts with the unmapped block
    /// after it.
    pub expandable_active: bool,
    /// Garbage collection is on: each search ages the pool's free blocks by one.
    pub count_for_gc: bool,
}

impl BlockPool {
    /// Best fit: the smallest free block of the same stream with size >= `rounded`, lowest
    /// address on ties, subject to the oversize rules. The block stays in the pool; its
    /// position and key are returned so that the caller can take it out (or put its split
    /// remainder in its place) without searching again.
    ///
    /// Expandable segments (PyTorch's `get_free_block`): when the block found is expandable,
    /// its size for best fit is what it can grow to (its size plus a following unmapped
    /// block), so the search walks on to the next blocks while theirs is smaller. With
    /// expandable segments switched off, expandable blocks are skipped instead.
    #[inline]
    pub fn best_fit(
        &mut self,
        all_blocks: &Arena<Block>,
        all_segments: &Arena<SegmentRec>,
        stream: i64,
        rounded: u64,
        rules: FitRules,
    ) -> Option<(Idx, Pos, FreeKey)> {
        let is_expandable = |idx: Idx| {
            all_blocks
                .get(idx)
                .and_then(|b| all_segments.get(b.segment))
                .is_some_and(|s| s.expandable)
        };
        if rules.count_for_gc {
            self.get_free_blocks_call_count += 1;
        }
        let (mut pos, mut key) =
            self.blocks
                .find_from((stream, rounded, 0, 0), |&(s, _, _, _)| {
                    if s != stream {
                        Scan::Stop
                    } else {
                        Scan::Take
                    }
                })?;
        if is_expandable(key.3) {
            if rules.expandable_active {
                let expandable_size = |idx: Idx| {
                    let b = &all_blocks[idx];
                    let tail = all_blocks
                        .get(b.next)
                        .filter(|n| !n.mapped)
                        .map_or(0, |n| n.size);
                    b.size + tail
                };
                let mut cur = key;
                for &next in self.blocks.range_from(key).skip(1) {
                    if !is_expandable(cur.3)
                        || next.0 != stream
                        || expandable_size(next.3) >= expandable_size(cur.3)
                    {
                        break;
                    }
                    cur = next;
                }
                if cur != key {
                    (pos, key) = self.blocks.find_from(cur, |_| Scan::Take)?;
                }
            } else {
                (pos, key) = self.blocks.find_from(key, |&(s, _, _, idx)| {
                    if s != stream {
                        Scan::Stop
                    } else if is_expandable(idx) {
                        Scan::Skip
                    } else {
                        Scan::Take
                    }
                })?;
            }
        }
        let size = key.1;
        let max_split = rules.max_split_size;
        if max_split != u64::MAX {
            if rounded < max_split && size >= max_split {
                return None;
            }
            if rounded >= max_split
                && size >= rounded.saturating_add(rules.max_non_split_rounding_size)
            {
                return None;
            }
        }
        Some((key.3, pos, key))
    }
}
