//! Expandable segments: a virtual reservation of more than the device holds, with physical
//! pages mapped into it as allocations need them and unmapped when the cache is emptied.
//!
//! Inside a reservation, the mapped parts are ordinary blocks; the unmapped parts are blocks
//! with `mapped == false`, kept in their pool's `unmapped` set. Pages are the pool's segment
//! size (2 MiB small, `large_segment_size` large), so mappings always cover whole pages.

use super::State;
use crate::allocator::arena::{Idx, NIL};
use crate::allocator::block::{Block, SegmentRec};
use crate::allocator::pool::pool_index;
use crate::config::SMALL_BUFFER;
use crate::device::Device;
use crate::error::DeviceError;
use crate::stacks::{RawStackId, NO_STACK};
use memsnap_format::Action;

impl State {
    pub(super) fn page_size(&self, small: bool) -> u64 {
        if small {
            SMALL_BUFFER
        } else {
            self.config.large_segment_size
        }
    }

    /// Expandable segments (PyTorch's `try_allocate_expandable_block`): finds a run of free
    /// and unmapped blocks with room for `rounded` bytes (`find_expandable_block`), maps pages
    /// into it until one free block is big enough, and returns that block out of the pool.
    pub(super) fn try_allocate_expandable_block<D: Device>(
        &mut self,
        device: &D,
        rounded: u64,
        small: bool,
        stream: i64,
        ctx: RawStackId,
    ) -> Result<Option<Idx>, DeviceError> {
        let page = self.page_size(small);
        let pool = pool_index(small);
        // The lowest unmapped block of the stream (or the free block right before it) that
        // starts a run of free and unmapped blocks of at least `rounded` bytes.
        let mut candidate = None;
        for &(s, _, u) in self.pools[pool].unmapped.range_from((stream, 0, 0)) {
            if s != stream {
                break;
            }
            let prev = self.blocks[u].prev;
            let c = if prev != NIL && self.blocks[prev].is_mergeable_free() {
                prev
            } else {
                u
            };
            let mut bytes = 0u64;
            let mut b = c;
            while bytes < rounded && b != NIL && self.blocks[b].is_mergeable_free() {
                bytes = bytes.saturating_add(self.blocks[b].size);
                b = self.blocks[b].next;
            }
            if bytes >= rounded {
                candidate = Some(c);
                break;
            }
        }
        let (mut cand, fresh) = match candidate {
            Some(c) => (c, false),
            None => {
                let total = device
                    .mem_info()
                    .map(|m| m.total)
                    .unwrap_or(self.allowed_max);
                let reserve = (total + total / 8).div_ceil(page).max(1) * page;
                if rounded.next_multiple_of(page) > reserve {
                    return Ok(None);
                }
                let base = match device.reserve(reserve) {
                    Ok(base) => base,
                    Err(DeviceError::OutOfMemory { .. }) => return Ok(None),
                    Err(e) => return Err(e),
                };
                let segment = self.segments.insert(SegmentRec {
                    base,
                    size: reserve,
                    stream,
                    small,
                    expandable: true,
                    stack: ctx,
                    live: true,
                });
                let u = self.blocks.insert(Block::whole_segment(
                    segment,
                    &self.segments[segment],
                    false,
                ));
                self.pool_insert(u);
                (u, true)
            }
        };
        if !self.blocks[cand].mapped {
            let size = self.blocks[cand].size.min(rounded);
            if !self.map_block(device, cand, size, ctx)? {
                if fresh {
                    // Do not keep a reservation nothing was ever mapped into.
                    self.pool_remove(cand);
                    let b = &self.blocks[cand];
                    let (seg, base, size) = (b.segment, b.addr, b.size);
                    device.release_reservation(base, size)?;
                    self.segments.remove(seg);
                    self.blocks.remove(cand);
                }
                return Ok(None);
            }
        }
        // Invariant: a free mapped block followed by an unmapped one; each mapping merges
        // the newly mapped pages into the block before them.
        while self.blocks[cand].size < rounded {
            let next = self.blocks[cand].next;
            if next == NIL || self.blocks[next].mapped {
                return Ok(None);
            }
            let remaining = rounded - self.blocks[cand].size;
            let size = remaining.min(self.blocks[next].size);
            if !self.map_block(device, next, size, ctx)? {
                return Ok(None);
            }
            cand = next;
        }
        self.pool_remove(cand);
        Ok(Some(cand))
    }

    /// `map_block`: maps whole pages at the start of the unmapped block `u` covering `size`
    /// bytes, splits off the still unmapped rest, merges the mapped block with its free
    /// neighbours and puts it in the pool. `Ok(false)`: out of memory.
    pub(super) fn map_block<D: Device>(
        &mut self,
        device: &D,
        u: Idx,
        size: u64,
        ctx: RawStackId,
    ) -> Result<bool, DeviceError> {
        let ub = self.blocks[u].clone();
        let seg_base = self.segments[ub.segment].base;
        let page = self.page_size(ub.small);
        let end = seg_base + (ub.addr + size - seg_base).next_multiple_of(page);
        let bytes = (end - ub.addr).min(ub.size);
        if let Err(e) = device.map(ub.addr, bytes) {
            return match e {
                DeviceError::OutOfMemory { .. } => Ok(false),
                e => Err(e),
            };
        }
        self.pool_remove(u);
        if ub.size > bytes {
            let rest = self.blocks.insert(Block {
                addr: ub.addr + bytes,
                size: ub.size - bytes,
                prev: u,
                next: ub.next,
                stream_uses: Vec::new(),
                ..ub.clone()
            });
            if ub.next != NIL {
                self.blocks[ub.next].prev = rest;
            }
            let b = &mut self.blocks[u];
            b.next = rest;
            b.size = bytes;
            self.pool_insert(rest);
        }
        self.blocks[u].mapped = true;
        self.total_allocated_memory += bytes;
        self.stats.reserved_bytes.increase(ub.small, bytes);
        self.stats.num_device_alloc += 1;
        self.record(Action::SegmentMap, ub.addr, bytes, ub.stream, ctx);
        for neighbour in [self.blocks[u].prev, self.blocks[u].next] {
            self.try_merge_blocks(u, neighbour);
        }
        self.blocks[u].gc_count_base = self.pools[pool_index(ub.small)].get_free_blocks_call_count;
        self.pool_insert(u);
        Ok(true)
    }

    /// Unmaps the whole pages inside a free expandable block.
    pub(super) fn unmap_block<D: Device>(
        &mut self,
        device: &D,
        idx: Idx,
        ctx: RawStackId,
    ) -> Result<(), DeviceError> {
        let b = self.blocks[idx].clone();
        let seg = self.segments[b.segment].clone();
        let page = self.page_size(b.small);
        let begin = seg.base + (b.addr - seg.base).next_multiple_of(page);
        let end = seg.base + (b.addr + b.size - seg.base) / page * page;
        if begin >= end {
            return Ok(());
        }
        let bytes = end - begin;
        device.unmap(begin, bytes)?;
        self.pool_remove(idx);
        let middle = idx;
        if begin > b.addr {
            // Keep the mapped head as its own free block.
            let head = self.blocks.insert(Block {
                size: begin - b.addr,
                next: idx,
                stream_uses: Vec::new(),
                ..b.clone()
            });
            if b.prev != NIL {
                self.blocks[b.prev].next = head;
            }
            let m = &mut self.blocks[idx];
            m.prev = head;
            m.addr = begin;
            m.size -= begin - b.addr;
            self.pool_insert(head);
        }
        if end < b.addr + b.size {
            let m = self.blocks[middle].clone();
            let tail = self.blocks.insert(Block {
                addr: end,
                size: b.addr + b.size - end,
                prev: middle,
                next: m.next,
                stream_uses: Vec::new(),
                ..m
            });
            if m.next != NIL {
                self.blocks[m.next].prev = tail;
            }
            let mm = &mut self.blocks[middle];
            mm.next = tail;
            mm.size = end - mm.addr;
            self.pool_insert(tail);
        }
        self.blocks[middle].mapped = false;
        self.total_allocated_memory -= bytes;
        self.stats.reserved_bytes.decrease(b.small, bytes);
        self.stats.num_device_free += 1;
        let stack = if ctx != NO_STACK { ctx } else { seg.stack };
        self.record(Action::SegmentUnmap, begin, bytes, b.stream, stack);
        for neighbour in [self.blocks[middle].prev, self.blocks[middle].next] {
            self.try_merge_blocks(middle, neighbour);
        }
        let m = &self.blocks[middle];
        if !m.is_split() {
            // The whole reservation is unmapped: give it back (no trace entry, as PyTorch).
            device.release_reservation(seg.base, seg.size)?;
            self.segments.remove(m.segment);
            self.blocks.remove(middle);
            return Ok(());
        }
        self.pool_insert(middle);
        Ok(())
    }
}
