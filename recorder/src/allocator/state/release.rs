//! Giving cached memory back to the device: `empty_cache`, the release of oversize blocks
//! before an allocation retries, and garbage collection under a memory fraction.

use super::State;
use crate::allocator::arena::Idx;
use crate::allocator::pool::pool_index;
use crate::device::Device;
use crate::error::DeviceError;
use crate::stacks::RawStackId;

impl State {
    /// `release_cached_blocks` (`empty_cache`): frees every whole free segment, large pool
    /// first, and unmaps free expandable pages.
    pub fn release_cached_blocks<D: Device>(
        &mut self,
        device: &D,
        ctx: RawStackId,
    ) -> Result<(), DeviceError> {
        self.call_time = None;
        self.synchronize_and_free_events(device, ctx)?;
        self.release_blocks(device, false, ctx)?;
        self.release_blocks(device, true, ctx)
    }

    pub(super) fn release_blocks<D: Device>(
        &mut self,
        device: &D,
        small: bool,
        ctx: RawStackId,
    ) -> Result<(), DeviceError> {
        let keys: Vec<Idx> = self.pools[pool_index(small)]
            .blocks
            .iter()
            .map(|k| k.3)
            .collect();
        let mut to_unmap = Vec::new();
        for idx in keys {
            if self.is_expandable(idx) {
                to_unmap.push(idx);
            } else if !self.blocks[idx].is_split() {
                self.release_block(device, idx, ctx)?;
            }
        }
        for idx in to_unmap {
            self.unmap_block(device, idx, ctx)?;
        }
        Ok(())
    }
    /// `release_available_cached_blocks`: with a finite `max_split_size`, frees one oversize
    /// block big enough, or the largest oversize blocks until enough is freed.
    pub(super) fn release_available_cached_blocks<D: Device>(
        &mut self,
        device: &D,
        rounded: u64,
        small: bool,
        stream: i64,
        ctx: RawStackId,
    ) -> Result<bool, DeviceError> {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let key_size = rounded.max(max_split);
        let pool = pool_index(small);
        let single = self.pools[pool]
            .blocks
            .range_from((stream, key_size, 0, 0))
            .next()
            .copied();
        if let Some((s, _, _, idx)) = single {
            if s == stream && !self.is_expandable(idx) && !self.blocks[idx].is_split() {
                self.release_block(device, idx, ctx)?;
                return Ok(true);
            }
        }
        // Largest blocks of this stream below the key, walking down.
        let candidates: Vec<(u64, Idx)> = self.pools[pool]
            .blocks
            .range_below_rev((stream, key_size, 0, 0))
            .take_while(|&&(s, size, _, _)| s == stream && size >= max_split)
            .map(|&(_, size, _, idx)| (size, idx))
            .collect();
        let mut released = 0;
        for (size, idx) in candidates {
            if released >= key_size {
                break;
            }
            if !self.is_expandable(idx) && !self.blocks[idx].is_split() {
                self.release_block(device, idx, ctx)?;
                released += size;
            }
        }
        Ok(released >= key_size)
    }

    /// `garbage_collect_cached_blocks`: frees old whole free large-pool segments until usage
    /// falls below `threshold * allowed`.
    pub(super) fn garbage_collect_cached_blocks<D: Device>(
        &mut self,
        device: &D,
        ctx: RawStackId,
    ) -> Result<(), DeviceError> {
        let threshold = (self.config.garbage_collection_threshold * self.allowed_max as f64) as u64;
        if self.total_allocated_memory <= threshold {
            return Ok(());
        }
        let target = self.total_allocated_memory - threshold;
        let count = self.pools[1].get_free_blocks_call_count;
        let mut candidates: Vec<(Idx, u64)> = self.pools[1]
            .blocks
            .iter()
            .map(|k| k.3)
            .filter(|&idx| !self.is_expandable(idx) && !self.blocks[idx].is_split())
            .map(|idx| (idx, count.saturating_sub(self.blocks[idx].gc_count_base)))
            .collect();
        let mut reclaimed = 0;
        while reclaimed < target && !candidates.is_empty() {
            let total_age: u64 = candidates.iter().map(|c| c.1).sum();
            let mean = total_age as f64 / candidates.len() as f64;
            let mut freed_any = false;
            let mut kept = Vec::with_capacity(candidates.len());
            for (idx, age) in candidates {
                if age as f64 >= mean {
                    let size = self.blocks[idx].size;
                    self.release_block(device, idx, ctx)?;
                    reclaimed += size;
                    freed_any = true;
                } else {
                    kept.push((idx, age));
                }
            }
            candidates = kept;
            if !freed_any {
                break;
            }
        }
        Ok(())
    }
}
