//! Creating and freeing a whole plain segment: one `cudaMalloc` made into one free block, and
//! one wholly free segment given back with `cudaFree`.

use super::State;
use crate::allocator::arena::Idx;
use crate::allocator::block::{Block, SegmentRec};
use crate::device::Device;
use crate::error::DeviceError;
use crate::stacks::{RawStackId, NO_STACK};
use memsnap_format::Action;

impl State {
    /// `alloc_block`: a new segment (or newly mapped expandable pages). `Ok(None)` is out of
    /// memory; other device errors are returned.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn alloc_block<D: Device>(
        &mut self,
        device: &D,
        rounded: u64,
        alloc_size: u64,
        small: bool,
        stream: i64,
        is_retry: bool,
        ctx: RawStackId,
    ) -> Result<Option<Idx>, DeviceError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if self.set_fraction
            && self.total_allocated_memory.saturating_add(alloc_size) > self.allowed_max
        {
            return Ok(None);
        }
        if self.expandable_active {
            return self.try_allocate_expandable_block(device, rounded, small, stream, ctx);
        }
        let ptr = match device.malloc(alloc_size) {
            Ok(ptr) => ptr,
            Err(DeviceError::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        self.total_allocated_memory += alloc_size;
        let segment = self.segments.insert(SegmentRec {
            base: ptr,
            size: alloc_size,
            stream,
            small,
            expandable: false,
            stack: ctx,
            live: true,
        });
        let idx = self
            .blocks
            .insert(Block::whole_segment(segment, &self.segments[segment], true));
        self.count_segment_added(small, alloc_size);
        self.stats.reserved_bytes.increase(small, alloc_size);
        self.stats.num_device_alloc += 1;
        self.record(Action::SegmentAlloc, ptr, alloc_size, stream, ctx);
        Ok(Some(idx))
    }

    /// `release_block`: `cudaFree` of a whole free segment.
    pub(super) fn release_block<D: Device>(
        &mut self,
        device: &D,
        idx: Idx,
        ctx: RawStackId,
    ) -> Result<(), DeviceError> {
        let b = self.blocks[idx].clone();
        device.free(b.addr, b.size)?;
        self.pool_remove(idx);
        self.total_allocated_memory -= b.size;
        self.count_segment_removed(b.small, b.size);
        self.stats.reserved_bytes.decrease(b.small, b.size);
        self.stats.num_device_free += 1;
        let seg_stack = self.segments[b.segment].stack;
        let stack = if ctx != NO_STACK { ctx } else { seg_stack };
        self.record(Action::SegmentFree, b.addr, b.size, b.stream, stack);
        self.segments.remove(b.segment);
        self.blocks.remove(idx);
        Ok(())
    }
}
