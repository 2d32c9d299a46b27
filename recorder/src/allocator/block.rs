//! What the arenas hold: blocks and the segments they tile.
//!
//! A **segment** is one device allocation (`cudaMalloc`), or for expandable segments one
//! virtual reservation that pages are mapped into. Its **blocks** tile it exactly, in address
//! order, as a doubly linked chain (`prev`/`next`, [`NIL`] at the ends). A block is allocated
//! (handed to the caller), pending (freed, but waiting for events of other streams that used
//! it) or free; in an expandable segment a free block may also be unmapped (no pages behind
//! it). Splitting a free block makes a new block in front of it; merging folds a free
//! neighbour into it.

use super::arena::{Idx, Slot, NIL};
use crate::stacks::{RawStackId, NO_STACK};

#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub addr: u64,
    pub size: u64,
    /// The caller's size at the last allocation (stale once freed, as in PyTorch).
    pub requested: u64,
    pub stream: i64,
    pub small: bool,
    pub segment: Idx,
    pub prev: Idx,
    pub next: Idx,
    pub allocated: bool,
    pub mapped: bool,
    pub event_count: u32,
    pub stream_uses: Vec<i64>,
    pub gc_count_base: u64,
    /// Stack of the last allocation; cleared when freed.
    pub stack: RawStackId,
    /// Arena slot in use.
    pub live: bool,
}

impl Block {
    /// The one free block of the new segment `segment` (stored at index `segment_idx`),
    /// covering all of it: never allocated, no events, no stack, not yet aged by garbage
    /// collection. `mapped` is false for an expandable segment's fresh reservation.
    pub fn whole_segment(segment_idx: Idx, segment: &SegmentRec, mapped: bool) -> Self {
        Block {
            addr: segment.base,
            size: segment.size,
            requested: 0,
            stream: segment.stream,
            small: segment.small,
            segment: segment_idx,
            prev: NIL,
            next: NIL,
            allocated: false,
            mapped,
            event_count: 0,
            stream_uses: Vec::new(),
            gc_count_base: 0,
            stack: NO_STACK,
            live: true,
        }
    }

    /// Whether the block shares its segment with other blocks.
    #[inline]
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    /// Whether the block could merge with a free neighbour: not allocated, no outstanding
    /// events and no other stream still to be waited for.
    #[inline]
    pub fn is_mergeable_free(&self) -> bool {
        !self.allocated && self.event_count == 0 && self.stream_uses.is_empty()
    }
}

impl Slot for Block {
    #[inline]
    fn is_live(&self) -> bool {
        self.live
    }

    #[inline]
    fn vacate(&mut self) {
        self.live = false;
        self.stream_uses = Vec::new();
    }
}

#[derive(Clone, Debug)]
pub(crate) struct SegmentRec {
    /// `malloc` base, or reservation base for expandable segments.
    pub base: u64,
    /// `malloc` size, or reservation size.
    pub size: u64,
    pub stream: i64,
    pub small: bool,
    pub expandable: bool,
    pub stack: RawStackId,
    pub live: bool,
}

impl Slot for SegmentRec {
    #[inline]
    fn is_live(&self) -> bool {
        self.live
    }

    #[inline]
    fn vacate(&mut self) {
        self.live = false;
    }
}
