//! The free path: a block the caller dropped goes back to its pool (at once, or once the
//! events of the other streams that used it complete), merged with its free neighbours.

use super::State;
use crate::allocator::arena::{Idx, NIL};
use crate::allocator::pool::{free_key, pool_index, FreeKey};
use crate::device::Device;
use crate::stacks::{RawStackId, NO_STACK};
use memsnap_format::Action;

impl State {
    /// `free()`: the caller dropped the block. Returns false for an unknown pointer.
    pub fn free<D: Device>(&mut self, device: &D, ptr: u64, ctx: RawStackId) -> bool {
        let Some(idx) = self.live.remove(&ptr) else {
            return false;
        };
        self.call_time = None;
        let b = &mut self.blocks[idx];
        b.allocated = false;
        let (small, size, requested, stream, stack) =
            (b.small, b.size, b.requested, b.stream, b.stack);
        self.stats.allocation.decrease(small, 1);
        self.stats.allocated_bytes.decrease(small, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        let entry_stack = if ctx != NO_STACK { ctx } else { stack };
        let b = &self.blocks[idx];
        if b.stream_uses.is_empty() && b.event_count == 0 {
            // The usual case: no other stream used the block, so it is free at once. Both
            // trace entries (identical but for the action) are written in one go, after the
            // pool work: the counter read is cheapest late in the critical section, away from
            // the lock's atomic instructions (measured, see the crate README).
            self.return_to_pool(idx);
            self.record_free_pair(ptr, requested, stream, entry_stack);
            return true;
        }
        self.record(Action::FreeRequested, ptr, requested, stream, entry_stack);
        if !self.blocks[idx].stream_uses.is_empty() {
            self.insert_events(device, idx);
        }
        if self.blocks[idx].event_count == 0 {
            self.free_block(idx, ctx);
        }
        true
    }
    /// `free_block`: returns a block to its pool, merging with free neighbours.
    pub(super) fn free_block(&mut self, idx: Idx, ctx: RawStackId) {
        let b = &self.blocks[idx];
        let (addr, requested, stream, stack) = (b.addr, b.requested, b.stream, b.stack);
        let entry_stack = if ctx != NO_STACK { ctx } else { stack };
        self.record(Action::FreeCompleted, addr, requested, stream, entry_stack);
        self.return_to_pool(idx);
    }

    /// The rest of `free_block` after its `free_completed` entry: merges the block with its
    /// free neighbours, puts it in its pool and updates the statistics.
    pub(super) fn return_to_pool(&mut self, idx: Idx) {
        let b = &self.blocks[idx];
        let (addr, size, requested, stream, small) =
            (b.addr, b.size, b.requested, b.stream, b.small);
        self.blocks[idx].stack = NO_STACK;
        let expandable = self.is_expandable(idx);
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        let pool = pool_index(small);
        let count = self.pools[pool].get_free_blocks_call_count;
        // Blocks being freed are always mapped; the general path below stays for safety.
        if self.blocks[idx].mapped {
            // Pool keys of the free neighbours merged into this block: the merged block takes
            // the place of one of them in the pool (one `memmove` instead of a removal and an
            // insertion).
            let mut absorbed: [Option<FreeKey>; 2] = [None, None];
            let neighbours = [self.blocks[idx].prev, self.blocks[idx].next];
            // The merged block's extent, tracked here rather than re-read from the block.
            let (mut merged_addr, mut merged_size) = (addr, size);
            for (slot, neighbour) in absorbed.iter_mut().zip(neighbours) {
                if let Some(key) = self.absorb_free_neighbour(idx, neighbour) {
                    let (_, n_size, n_addr, _) = key;
                    net_blocks -= 1;
                    net_bytes -= n_size as i64;
                    merged_addr = merged_addr.min(n_addr);
                    merged_size += n_size;
                    *slot = Some(key);
                }
            }
            self.blocks[idx].gc_count_base = count;
            let key = (stream, merged_size, merged_addr, idx);
            let set = &mut self.pools[pool].blocks;
            match absorbed {
                [None, None] => {
                    set.insert(key);
                }
                [Some(old), None] | [None, Some(old)] => set.replace(&old, key),
                [Some(prev), Some(next)] => {
                    set.remove(&prev);
                    set.replace(&next, key);
                }
            }
        } else {
            for neighbour in [self.blocks[idx].prev, self.blocks[idx].next] {
                let subsumed = self.try_merge_blocks(idx, neighbour);
                if subsumed > 0 {
                    net_blocks -= 1;
                    net_bytes -= subsumed as i64;
                }
            }
            self.blocks[idx].gc_count_base = count;
            self.pool_insert(idx);
        }
        let b = &self.blocks[idx];
        if b.is_split() {
            net_blocks += 1;
            net_bytes += b.size as i64;
        }
        if !expandable {
            self.stats.inactive_split.update(small, net_blocks);
            self.stats.inactive_split_bytes.update(small, net_bytes);
        }
        self.stats.active.decrease(small, 1);
        self.stats.active_bytes.decrease(small, size);
        self.stats.requested_bytes.decrease(small, requested);
    }

    /// [`State::try_merge_blocks`] for a mapped `dst` that is not in a pool, leaving the pool
    /// to the caller: merges the free mapped neighbour `src` into `dst` and returns the pool
    /// key `src` had (still in the pool), or `None` when nothing merged.
    #[inline]
    pub(super) fn absorb_free_neighbour(&mut self, dst: Idx, src: Idx) -> Option<FreeKey> {
        if src == NIL || !self.blocks[src].is_mergeable_free() || !self.blocks[src].mapped {
            return None;
        }
        let key = free_key(&self.blocks[src], src);
        self.fold_neighbour(dst, src);
        Some(key)
    }

    /// Folds the neighbour `src` into `dst` (address, links and size), deletes `src` and
    /// returns its size. Its pool entry is the caller's business.
    #[inline]
    pub(super) fn fold_neighbour(&mut self, dst: Idx, src: Idx) -> u64 {
        let (s_addr, s_size, s_prev, s_next) = {
            let s = &self.blocks[src];
            (s.addr, s.size, s.prev, s.next)
        };
        if self.blocks[dst].prev == src {
            let d = &mut self.blocks[dst];
            d.addr = s_addr;
            d.prev = s_prev;
            if s_prev != NIL {
                self.blocks[s_prev].next = dst;
            }
        } else {
            self.blocks[dst].next = s_next;
            if s_next != NIL {
                self.blocks[s_next].prev = dst;
            }
        }
        self.blocks[dst].size += s_size;
        self.blocks.remove(src);
        s_size
    }

    /// Merges `src` into `dst` when `src` is free, has no pending events and the same mapped
    /// state. Returns the bytes absorbed (0 if nothing merged).
    pub(super) fn try_merge_blocks(&mut self, dst: Idx, src: Idx) -> u64 {
        if src == NIL
            || !self.blocks[src].is_mergeable_free()
            || self.blocks[src].mapped != self.blocks[dst].mapped
        {
            return 0;
        }
        self.pool_remove(src);
        self.fold_neighbour(dst, src)
    }
}
