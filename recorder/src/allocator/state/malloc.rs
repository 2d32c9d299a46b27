//! The allocation path: PyTorch's `malloc` and the block it hands out.
//!
//! A request is rounded (`AllocatorConfig::round_size`), looked up in its pool by best fit
//! (`crate::allocator::pool`), and only when nothing fits goes down the retry ladder: garbage
//! collection, a new segment, freeing oversize cached blocks, freeing every cached block, and
//! finally an out-of-memory report. The block found is split when the rest is worth keeping.

use super::State;
use crate::allocator::arena::{Idx, NIL};
use crate::allocator::block::Block;
use crate::allocator::free_set::Pos;
use crate::allocator::pool::{pool_index, FitRules, FreeKey};
use crate::config::{MIN_BLOCK_SIZE, SMALL_SIZE};
use crate::device::{Device, Stream};
use crate::error::{DeviceError, OomInfo};
use crate::stacks::{RawStackId, NO_STACK};
use memsnap_format::Action;

impl State {
    pub fn malloc<D: Device>(
        &mut self,
        device: &D,
        orig_size: u64,
        stream: Stream,
        ctx: RawStackId,
    ) -> Result<u64, MallocFailure> {
        self.call_time = None;
        self.process_events(device, ctx)?;
        let rounded = self.config.round_size(orig_size);
        let small = rounded <= SMALL_SIZE;
        let alloc_size = self.config.allocation_size(rounded);
        let stream = stream.0;

        // The common case: a cached block fits; it is taken out of (or, split, replaced in) its
        // pool at the position the search found.
        if let Some((idx, pos, key)) = self.get_free_block(stream, rounded, small) {
            return Ok(self.alloc_found_block(idx, Some((pos, key)), rounded, orig_size, ctx));
        }
        if self.gc_enabled() {
            self.garbage_collect_cached_blocks(device, ctx)?;
        }
        let mut found = self.alloc_block(device, rounded, alloc_size, small, stream, false, ctx)?;
        if found.is_none()
            && self.release_available_cached_blocks(device, rounded, small, stream, ctx)?
        {
            found = self.alloc_block(device, rounded, alloc_size, small, stream, false, ctx)?;
        }
        if found.is_none() {
            self.release_cached_blocks(device, ctx)?;
            found = self.alloc_block(device, rounded, alloc_size, small, stream, true, ctx)?;
        }
        let Some(idx) = found else {
            return Err(MallocFailure::Oom(
                self.oom(device, orig_size, rounded, alloc_size, stream, ctx),
            ));
        };
        Ok(self.alloc_found_block(idx, None, rounded, orig_size, ctx))
    }

    pub(super) fn oom<D: Device>(
        &mut self,
        device: &D,
        orig_size: u64,
        rounded: u64,
        alloc_size: u64,
        stream: i64,
        ctx: RawStackId,
    ) -> OomInfo {
        let info = device.mem_info().unwrap_or(crate::device::MemInfo {
            free: 0,
            total: self.allowed_max,
        });
        self.record(Action::Oom, info.free, rounded, stream, ctx);
        self.stats.num_ooms += 1;
        OomInfo {
            device: self.device_index,
            requested: orig_size,
            rounded,
            alloc_size,
            device_free: info.free,
            device_total: info.total,
            allowed: self.set_fraction.then_some(self.allowed_max),
            allocated: self.stats.allocated_bytes(),
            reserved: self.stats.reserved_bytes(),
        }
    }

    /// Best fit in the pool of this size (see
    /// [`crate::allocator::pool::BlockPool::best_fit`]), with the settings of now. The block
    /// stays in its pool; its position and key are returned for [`State::alloc_found_block`].
    #[inline]
    pub(super) fn get_free_block(
        &mut self,
        stream: i64,
        rounded: u64,
        small: bool,
    ) -> Option<(Idx, Pos, FreeKey)> {
        let rules = FitRules {
            max_split_size: self.config.max_split_size,
            max_non_split_rounding_size: self.config.max_non_split_rounding_size,
            expandable_active: self.expandable_active,
            count_for_gc: self.gc_enabled(),
        };
        self.pools[pool_index(small)].best_fit(&self.blocks, &self.segments, stream, rounded, rules)
    }

    pub(super) fn should_split(&self, idx: Idx, rounded: u64) -> bool {
        let b = &self.blocks[idx];
        let remaining = b.size - rounded;
        if b.small || self.is_expandable(idx) {
            remaining >= MIN_BLOCK_SIZE
        } else {
            rounded < self.config.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// Allocates `rounded` bytes from the free block `idx`, splitting off the rest. `in_pool`
    /// is where [`State::get_free_block`] found the block while it is still in its pool
    /// (`None`: a block already out of the pool, from a new segment or expandable pages).
    pub(super) fn alloc_found_block(
        &mut self,
        idx: Idx,
        in_pool: Option<(Pos, FreeKey)>,
        rounded: u64,
        orig_size: u64,
        ctx: RawStackId,
    ) -> u64 {
        let already_split = self.blocks[idx].is_split();
        let expandable = self.is_expandable(idx);
        let small = self.blocks[idx].small;
        let mut block = idx;
        if self.should_split(idx, rounded) {
            // The front part becomes the allocation; the old block keeps the remainder.
            let r = &self.blocks[idx];
            let rem_prev = r.prev;
            let front_block = Block {
                addr: r.addr,
                size: rounded,
                requested: 0,
                stream: r.stream,
                small: r.small,
                segment: r.segment,
                prev: r.prev,
                next: idx,
                allocated: false,
                mapped: r.mapped,
                event_count: 0,
                stream_uses: Vec::new(),
                gc_count_base: r.gc_count_base,
                stack: NO_STACK,
                live: true,
            };
            let front = self.blocks.insert(front_block);
            if rem_prev != NIL {
                self.blocks[rem_prev].next = front;
            }
            {
                let r = &mut self.blocks[idx];
                r.prev = front;
                r.addr += rounded;
                r.size -= rounded;
            }
            match in_pool {
                // The remainder takes the block's place in the pool under its new key (built
                // from the old one, not re-read from the block just written).
                Some((pos, key)) => {
                    let (stream, size, addr, _) = key;
                    let new_key = (stream, size - rounded, addr + rounded, idx);
                    self.pools[pool_index(small)]
                        .blocks
                        .replace_at(pos, &key, new_key);
                }
                None => self.pool_insert(idx),
            }
            let remaining = self.blocks[idx].size;
            if !expandable {
                if already_split {
                    self.stats.inactive_split_bytes.decrease(small, rounded);
                } else {
                    self.stats.inactive_split.increase(small, 1);
                    self.stats.inactive_split_bytes.increase(small, remaining);
                }
            }
            block = front;
        } else {
            if let Some((pos, key)) = in_pool {
                self.pools[pool_index(small)].blocks.remove_at(pos, &key);
            }
            if already_split && !expandable {
                let size = self.blocks[idx].size;
                self.stats.inactive_split.decrease(small, 1);
                self.stats.inactive_split_bytes.decrease(small, size);
            }
        }

        let b = &mut self.blocks[block];
        b.allocated = true;
        b.requested = orig_size;
        b.stack = ctx;
        let (addr, size, stream) = (b.addr, b.size, b.stream);
        self.live.insert(addr, block);
        self.count_allocated_block(small, size, orig_size);
        self.record(Action::Alloc, addr, orig_size, stream, ctx);
        addr
    }
}

/// Why an allocation failed: out of memory (after the whole retry ladder), or a device error
/// that is not out of memory.
pub(crate) enum MallocFailure {
    Oom(OomInfo),
    Device(DeviceError),
}

impl From<DeviceError> for MallocFailure {
    fn from(e: DeviceError) -> Self {
        MallocFailure::Device(e)
    }
}
