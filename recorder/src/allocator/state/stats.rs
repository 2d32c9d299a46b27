//! Statistics updates that several steps make alike.
//!
//! Most counters move where the step that changes them happens (a split, a merge, a mapping).
//! A block handed to the caller and a segment added or removed are counted the same way by
//! more than one step (allocation and restoring; creating, restoring and freeing a segment),
//! so those updates live here once.

use super::State;

impl State {
    /// Counts a block handed to the caller: `size` bytes of the block, `requested` by the
    /// caller. Blocks of at least `max_split_size` are counted as oversize too.
    #[inline]
    pub(super) fn count_allocated_block(&mut self, small: bool, size: u64, requested: u64) {
        let s = &mut self.stats;
        s.allocation.increase(small, 1);
        s.allocated_bytes.increase(small, size);
        s.active.increase(small, 1);
        s.active_bytes.increase(small, size);
        s.requested_bytes.increase(small, requested);
        if size >= self.config.max_split_size {
            s.oversize_allocations.increase(1);
        }
    }

    /// Counts a new plain segment of `size` bytes (its reserved bytes are counted apart, as
    /// its blocks are mapped). Expandable reservations are not counted as segments.
    pub(super) fn count_segment_added(&mut self, small: bool, size: u64) {
        self.stats.segment.increase(small, 1);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
    }

    /// Counts a plain segment of `size` bytes given back to the device.
    pub(super) fn count_segment_removed(&mut self, small: bool, size: u64) {
        self.stats.segment.decrease(small, 1);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
    }
}
