//! A simple model of PyTorch's CUDA caching allocator, enough to make the generated trace and
//! segments agree the way real ones do: 512-byte rounding, a small pool (2 MiB segments for
//! blocks of 1 MiB or less) and a large pool (20 MiB segments, or the request rounded up to
//! 2 MiB from 10 MiB on), best fit by (size, address), splitting and merging of free
//! neighbours, and frees that complete later (`record_stream`). One stream; no `empty_cache`.

use std::collections::{BTreeMap, BTreeSet};

use super::rng::Rng;
use crate::intern::StackId;
use crate::model::{Action, Block, BlockState, Segment, SegmentType};

const MIN_BLOCK_SIZE: u64 = 512;
const SMALL_SIZE: u64 = 1 << 20;
const SMALL_BUFFER: u64 = 2 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const LARGE_BUFFER: u64 = 20 << 20;
const ROUND_LARGE: u64 = 2 << 20;

/// Where the allocator's trace events go.
pub(super) trait EventSink {
    fn record(&mut self, action: Action, addr: u64, size: u64, stack: Option<StackId>);
}

/// The block size the allocator hands out for a request (no `roundup_power2_divisions`).
pub(super) fn round_size(requested: u64) -> u64 {
    if requested < MIN_BLOCK_SIZE {
        MIN_BLOCK_SIZE
    } else {
        requested
            .div_ceil(MIN_BLOCK_SIZE)
            .saturating_mul(MIN_BLOCK_SIZE)
    }
}

/// The size of a new segment for a block of `size` bytes.
fn segment_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pool {
    Small = 0,
    Large = 1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    Allocated,
    /// `free_requested` written, `free_completed` not yet.
    PendingFree,
    Cached,
}

#[derive(Clone, Debug)]
struct BlockRec {
    size: u64,
    /// Stale once the block is cached, as in PyTorch.
    requested: u64,
    state: Use,
    segment: usize,
    stack: Option<StackId>,
}

#[derive(Clone, Debug)]
struct SegmentRec {
    address: u64,
    size: u64,
    pool: Pool,
    stack: Option<StackId>,
}

/// One device's allocator state.
pub(super) struct CachingAllocator {
    /// Every block of every segment, by address.
    blocks: BTreeMap<u64, BlockRec>,
    /// Cached blocks per pool, ordered for best fit: smallest size, then lowest address.
    cached: [BTreeSet<(u64, u64)>; 2],
    segments: Vec<SegmentRec>,
    /// Blocks whose free is waiting on another stream; completed at the next malloc.
    pending: Vec<u64>,
    next_segment_address: u64,
    rng: Rng,
}

impl CachingAllocator {
    pub(super) fn new(base_address: u64, seed: u64) -> Self {
        CachingAllocator {
            blocks: BTreeMap::new(),
            cached: [BTreeSet::new(), BTreeSet::new()],
            segments: Vec::new(),
            pending: Vec::new(),
            next_segment_address: base_address,
            rng: Rng::new(seed),
        }
    }

    /// Allocates `requested` bytes and returns the block address. Records any pending
    /// `free_completed`, then `segment_alloc` if a new segment is needed, then `alloc`.
    pub(super) fn malloc(
        &mut self,
        requested: u64,
        stack: StackId,
        sink: &mut impl EventSink,
    ) -> u64 {
        self.process_pending(sink);
        let size = round_size(requested);
        let pool = if size <= SMALL_SIZE {
            Pool::Small
        } else {
            Pool::Large
        };
        let best_fit = self.cached[pool as usize]
            .range((size, 0)..)
            .next()
            .copied();
        let (addr, block_size) = match best_fit {
            Some(key) => {
                self.cached[pool as usize].remove(&key);
                (key.1, key.0)
            }
            None => self.new_segment(size, pool, stack, sink),
        };

        let remaining = block_size - size;
        let split = match pool {
            Pool::Small => remaining >= MIN_BLOCK_SIZE,
            Pool::Large => remaining > SMALL_SIZE,
        };
        let block = self
            .blocks
            .get_mut(&addr)
            .expect("a cached block is in the block map");
        if split {
            // The old block becomes the remainder and keeps its stale requested size.
            let remainder = BlockRec {
                size: remaining,
                requested: block.requested,
                state: Use::Cached,
                segment: block.segment,
                stack: None,
            };
            block.size = size;
            self.cached[pool as usize].insert((remaining, addr + size));
            self.blocks.insert(addr + size, remainder);
        }
        let block = self
            .blocks
            .get_mut(&addr)
            .expect("the block is still in the map");
        block.state = Use::Allocated;
        block.requested = requested;
        block.stack = Some(stack);
        sink.record(Action::Alloc, addr, requested, Some(stack));
        addr
    }

    /// Frees the block at `addr`. `deferred` models a tensor used on another stream: the
    /// `free_completed` comes at the next malloc.
    pub(super) fn free(&mut self, addr: u64, deferred: bool, sink: &mut impl EventSink) {
        let block = self
            .blocks
            .get_mut(&addr)
            .expect("the generator frees only live blocks");
        debug_assert_eq!(block.state, Use::Allocated);
        sink.record(Action::FreeRequested, addr, block.requested, block.stack);
        if deferred {
            block.state = Use::PendingFree;
            self.pending.push(addr);
        } else {
            self.free_block(addr, sink);
        }
    }

    fn process_pending(&mut self, sink: &mut impl EventSink) {
        for addr in std::mem::take(&mut self.pending) {
            self.free_block(addr, sink);
        }
    }

    fn new_segment(
        &mut self,
        size: u64,
        pool: Pool,
        stack: StackId,
        sink: &mut impl EventSink,
    ) -> (u64, u64) {
        let bytes = segment_size(size);
        let address = self.next_segment_address;
        // cudaMalloc leaves holes now and then (other processes, freed segments).
        let hole = if self.rng.one_in(5) {
            self.rng.range(1, 8) * ROUND_LARGE
        } else {
            0
        };
        self.next_segment_address = address
            .saturating_add(bytes.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE))
            .saturating_add(hole);
        let segment = self.segments.len();
        self.segments.push(SegmentRec {
            address,
            size: bytes,
            pool,
            stack: Some(stack),
        });
        self.blocks.insert(
            address,
            BlockRec {
                size: bytes,
                requested: 0,
                state: Use::Cached,
                segment,
                stack: None,
            },
        );
        sink.record(Action::SegmentAlloc, address, bytes, Some(stack));
        (address, bytes)
    }

    /// Returns a block to its pool, merging it with cached neighbours in the same segment.
    fn free_block(&mut self, addr: u64, sink: &mut impl EventSink) {
        let block = self
            .blocks
            .remove(&addr)
            .expect("the generator frees only live blocks");
        sink.record(Action::FreeCompleted, addr, block.requested, block.stack);
        let pool = self.segments[block.segment].pool as usize;
        let (mut start, mut size) = (addr, block.size);

        let prev = self
            .blocks
            .range(..addr)
            .next_back()
            .map(|(&a, b)| (a, b.size, b.segment, b.state));
        if let Some((prev_addr, prev_size, segment, Use::Cached)) = prev {
            if segment == block.segment && prev_addr + prev_size == addr {
                self.cached[pool].remove(&(prev_size, prev_addr));
                self.blocks.remove(&prev_addr);
                start = prev_addr;
                size += prev_size;
            }
        }
        let next = self
            .blocks
            .get(&(addr + block.size))
            .map(|b| (b.size, b.segment, b.state));
        if let Some((next_size, segment, Use::Cached)) = next {
            if segment == block.segment {
                self.cached[pool].remove(&(next_size, addr + block.size));
                self.blocks.remove(&(addr + block.size));
                size += next_size;
            }
        }
        self.blocks.insert(
            start,
            BlockRec {
                size,
                requested: block.requested,
                state: Use::Cached,
                segment: block.segment,
                stack: None,
            },
        );
        self.cached[pool].insert((size, start));
    }

    /// The segment list of a snapshot taken now, sorted by address. `no_stack` is the interned
    /// empty stack, which PyTorch writes as `frames: []` on cached blocks.
    pub(super) fn export(&self, device: i64, no_stack: StackId) -> Vec<Segment> {
        let mut order: Vec<&SegmentRec> = self.segments.iter().collect();
        order.sort_unstable_by_key(|s| s.address);
        order
            .into_iter()
            .map(|rec| {
                let mut segment = Segment::new(device, rec.address, rec.size, 0);
                segment.segment_type = Some(match rec.pool {
                    Pool::Small => SegmentType::Small,
                    Pool::Large => SegmentType::Large,
                });
                let (mut allocated, mut active, mut requested) = (0, 0, 0);
                for (&address, b) in self.blocks.range(rec.address..rec.address + rec.size) {
                    let state = match b.state {
                        Use::Allocated => BlockState::ActiveAllocated,
                        Use::PendingFree => BlockState::ActivePendingFree,
                        Use::Cached => BlockState::Inactive,
                    };
                    if state == BlockState::ActiveAllocated {
                        allocated += b.size;
                    }
                    if state.is_active() {
                        active += b.size;
                        requested += b.requested;
                    }
                    segment.blocks.push(Block {
                        address: Some(address),
                        size: b.size,
                        requested_size: Some(b.requested),
                        state,
                        frames: Some(b.stack.unwrap_or(no_stack)),
                        forward_frames: None,
                        history: None,
                        extra: Vec::new(),
                        exact: Default::default(),
                    });
                }
                segment.allocated_size = Some(allocated);
                segment.active_size = Some(active);
                segment.requested_size = Some(requested);
                // PyTorch adds a non-empty segment stack after the blocks.
                segment.frames = Some(rec.stack.unwrap_or(no_stack));
                segment.frames_after_blocks = rec.stack.is_some();
                segment
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_like_pytorch() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(segment_size(1 << 20), 2 << 20);
        assert_eq!(segment_size((1 << 20) + 512), 20 << 20);
        assert_eq!(segment_size(10 << 20), 10 << 20);
        assert_eq!(segment_size((10 << 20) + 512), 12 << 20);
    }
}
