//! The per-device allocator state and algorithm (PyTorch's `DeviceCachingAllocator`).
//!
//! Everything here runs under the device lock. Blocks live in an arena addressed by index and
//! are linked to their segment neighbours by `prev`/`next`; free blocks sit in two ordered sets
//! per pool (mapped: by `(stream, size, address)`; unmapped expandable tails: by
//! `(stream, address)`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use super::free_set::{FreeSet, Pos, Scan};
use crate::clock::{Clock, Source};
use crate::config::{AllocatorConfig, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE};
use crate::device::{Device, Event, Stream};
use crate::error::{DeviceError, OomInfo};
use crate::history::{ContextMode, History, RawAction, RawAnnotation};
use crate::stacks::{GivenStack, GivenStacks, RawStackId, StackInterner, NO_STACK};
use crate::stats::DeviceStats;

pub(crate) type Idx = u32;
pub(crate) const NIL: Idx = u32::MAX;

/// A folded-multiply hasher for pointer keys (the default SipHash costs more than the rest of
/// a malloc/free pair).
///
/// The full 128-bit product is folded (high half XOR low half) so that every bit of the key
/// reaches the *low* bits of the hash, which hashbrown uses to pick the bucket: block
/// addresses are 512-byte aligned and share their high bits within a segment, so a plain
/// `key * K` would send every block of a segment to the same probe group.
#[derive(Default)]
pub(crate) struct PtrHasher(u64);

const HASH_K: u64 = 0x9e37_79b9_7f4a_7c15;

#[inline]
fn folded_mul(a: u64, b: u64) -> u64 {
    let m = u128::from(a) * u128::from(b);
    (m as u64) ^ ((m >> 64) as u64)
}

impl Hasher for PtrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = folded_mul(self.0.rotate_left(8) ^ u64::from(b), HASH_K);
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = folded_mul(n ^ self.0, HASH_K);
    }
}

type PtrMap<V> = HashMap<u64, V, BuildHasherDefault<PtrHasher>>;

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
    fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
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

pub(crate) enum MallocFailure {
    Oom(OomInfo),
    Device(DeviceError),
}

impl From<DeviceError> for MallocFailure {
    fn from(e: DeviceError) -> Self {
        MallocFailure::Device(e)
    }
}

pub(crate) struct State {
    pub device_index: i64,
    pub config: AllocatorConfig,
    pub blocks: Vec<Block>,
    free_block_slots: Vec<Idx>,
    pub segments: Vec<SegmentRec>,
    free_segment_slots: Vec<Idx>,
    /// [small, large]
    pub pools: [BlockPool; 2],
    /// Allocated blocks by address.
    pub live: PtrMap<Idx>,
    /// Outstanding events of `record_stream`ed blocks, per stream, oldest first.
    pub stream_events: BTreeMap<i64, VecDeque<(Event, Idx)>>,
    pub total_allocated_memory: u64,
    pub allowed_max: u64,
    pub set_fraction: bool,
    pub fraction: f64,
    pub stats: DeviceStats,
    pub history: History,
    pub stacks: StackInterner,
    /// Stacks the caller registered as frames.
    pub given_stacks: GivenStacks,
    /// With a manual clock: the Unix time (µs) its reading 0 stands for.
    pub manual_epoch_us: Option<i64>,
    /// Expandable segments are used (configured and supported by the device).
    pub expandable_active: bool,
    /// Clock reading shared by the entries of one API call (read lazily, at most once).
    call_time: Option<u64>,
    /// The device's history clock (monotone; see `crate::clock`).
    clock: Clock,
}

fn pool_index(small: bool) -> usize {
    if small {
        0
    } else {
        1
    }
}

impl State {
    pub fn new(device_index: i64, config: AllocatorConfig, device_total: u64, vm: bool) -> Self {
        let mut stats = DeviceStats {
            max_split_size: config.max_split_size,
            ..Default::default()
        };
        stats.reset_peak();
        let expandable_active = config.expandable_segments && vm;
        State {
            device_index,
            config,
            blocks: Vec::new(),
            free_block_slots: Vec::new(),
            segments: Vec::new(),
            free_segment_slots: Vec::new(),
            pools: Default::default(),
            live: PtrMap::default(),
            stream_events: BTreeMap::new(),
            total_allocated_memory: 0,
            allowed_max: device_total,
            set_fraction: false,
            fraction: 1.0,
            stats,
            history: History::default(),
            stacks: StackInterner::default(),
            given_stacks: GivenStacks::default(),
            manual_epoch_us: None,
            expandable_active,
            call_time: None,
            clock: Clock::default(),
        }
    }

    // ---- arena -------------------------------------------------------------------------

    #[inline]
    fn new_block(&mut self, block: Block) -> Idx {
        if let Some(idx) = self.free_block_slots.pop() {
            self.blocks[idx as usize] = block;
            idx
        } else {
            self.blocks.push(block);
            (self.blocks.len() - 1) as Idx
        }
    }

    fn delete_block(&mut self, idx: Idx) {
        let b = &mut self.blocks[idx as usize];
        b.live = false;
        b.stream_uses = Vec::new();
        self.free_block_slots.push(idx);
    }

    fn new_segment(&mut self, seg: SegmentRec) -> Idx {
        if let Some(idx) = self.free_segment_slots.pop() {
            self.segments[idx as usize] = seg;
            idx
        } else {
            self.segments.push(seg);
            (self.segments.len() - 1) as Idx
        }
    }

    fn delete_segment(&mut self, idx: Idx) {
        self.segments[idx as usize].live = false;
        self.free_segment_slots.push(idx);
    }

    #[inline]
    fn b(&self, idx: Idx) -> &Block {
        &self.blocks[idx as usize]
    }

    #[inline]
    fn bm(&mut self, idx: Idx) -> &mut Block {
        &mut self.blocks[idx as usize]
    }

    fn is_expandable(&self, idx: Idx) -> bool {
        self.segments[self.b(idx).segment as usize].expandable
    }

    fn free_key(&self, idx: Idx) -> FreeKey {
        let b = self.b(idx);
        (b.stream, b.size, b.addr, idx)
    }

    fn pool_insert(&mut self, idx: Idx) {
        let b = self.b(idx);
        let pool = pool_index(b.small);
        if b.mapped {
            let key = self.free_key(idx);
            self.pools[pool].blocks.insert(key);
        } else {
            let key = (b.stream, b.addr, idx);
            self.pools[pool].unmapped.insert(key);
        }
    }

    fn pool_remove(&mut self, idx: Idx) {
        let b = self.b(idx);
        let pool = pool_index(b.small);
        if b.mapped {
            let key = self.free_key(idx);
            self.pools[pool].blocks.remove(&key);
        } else {
            let key = (b.stream, b.addr, idx);
            self.pools[pool].unmapped.remove(&key);
        }
    }

    // ---- history -----------------------------------------------------------------------

    /// Interns a captured stack (only while history is on).
    pub fn intern(&mut self, ips: Option<&[usize]>) -> RawStackId {
        match ips {
            Some(ips) if self.history.enabled() && !ips.is_empty() => self.stacks.intern(ips),
            _ => NO_STACK,
        }
    }

    /// The id to record for a given stack: none unless history is on and the context level
    /// is at least `level` (as for a captured stack).
    pub fn given(&self, stack: GivenStack, level: ContextMode) -> RawStackId {
        if self.history.enabled()
            && self.history.options.context >= level
            && self.given_stacks.get(stack.0).is_some()
        {
            stack.0
        } else {
            NO_STACK
        }
    }

    /// Makes the history clock a manual one reading `start_us` (µs since the Unix epoch).
    pub fn use_manual_clock(&mut self, start_us: i64) {
        self.clock = Clock::with_source(Source::Manual);
        self.manual_epoch_us = Some(start_us);
    }

    /// Moves a manual clock forward (other clocks ignore it).
    pub fn advance_clock(&mut self, ns: u64) {
        self.clock.advance(ns);
    }

    /// The history clock now, in µs since the Unix epoch.
    pub fn clock_now_us(&mut self) -> i64 {
        let ns = self.clock.now_ns();
        self.epoch_us(ns)
    }

    /// A clock reading in µs since the Unix epoch.
    pub fn epoch_us(&self, time_ns: u64) -> i64 {
        match self.manual_epoch_us {
            Some(start) => start.saturating_add((time_ns / 1000) as i64),
            None => crate::history::epoch_micros(time_ns),
        }
    }

    /// Records an annotation stamped with the clock (when history is on).
    pub fn record_annotation(&mut self, metadata: Vec<(String, String)>) {
        if !self.history.enabled() {
            return;
        }
        self.call_time = None;
        let time_ns = self.call_time_ns();
        self.history.annotate(RawAnnotation { metadata, time_ns });
    }

    /// Appends a trace entry (when history is on) stamped with the call's clock reading.
    #[inline]
    fn record(&mut self, action: RawAction, addr: u64, size: u64, stream: i64, stack: RawStackId) {
        if !self.history.enabled() {
            return;
        }
        let time_ns = self.call_time_ns();
        self.history
            .record(action, addr, size, stream, time_ns, stack);
    }

    /// The call's clock reading (read at its first entry, shared by the others).
    #[inline]
    fn call_time_ns(&mut self) -> u64 {
        match self.call_time {
            Some(t) => t,
            None => {
                let t = self.clock.now_ns();
                self.call_time = Some(t);
                t
            }
        }
    }

    /// `free_requested` then `free_completed` of a block freed at once (when history is on).
    #[inline]
    fn record_free_pair(&mut self, addr: u64, size: u64, stream: i64, stack: RawStackId) {
        if !self.history.enabled() {
            return;
        }
        let time_ns = self.call_time_ns();
        self.history
            .record_free_pair(addr, size, stream, time_ns, stack);
    }

    /// Appends the `snapshot` entry (size = active bytes) after a snapshot collected the trace.
    pub fn record_snapshot_entry(&mut self) {
        self.call_time = None;
        let active = self.stats.active_bytes.0[0].current.max(0) as u64;
        self.record(RawAction::Snapshot, 0, active, 0, NO_STACK);
    }

    fn gc_enabled(&self) -> bool {
        self.set_fraction && self.config.garbage_collection_threshold > 0.0
    }

    // ---- malloc ------------------------------------------------------------------------

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

    fn oom<D: Device>(
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
        self.record(RawAction::Oom, info.free, rounded, stream, ctx);
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

    /// Best fit: the smallest free block of the same stream with size >= `rounded`, lowest
    /// address on ties, subject to the oversize rules. The block stays in its pool; its
    /// position and key are returned for [`State::alloc_found_block`].
    ///
    /// Expandable segments (PyTorch's `get_free_block`): when the block found is expandable,
    /// its size for best fit is what it can grow to (its size plus a following unmapped
    /// block), so the search walks on to the next blocks while theirs is smaller. With
    /// expandable segments switched off, expandable blocks are skipped instead.
    #[inline]
    fn get_free_block(
        &mut self,
        stream: i64,
        rounded: u64,
        small: bool,
    ) -> Option<(Idx, Pos, FreeKey)> {
        let gc = self.gc_enabled();
        let max_split = self.config.max_split_size;
        let max_non_split = self.config.max_non_split_rounding_size;
        let expandable_active = self.expandable_active;
        let (blocks, segments) = (&self.blocks, &self.segments);
        let is_expandable = |idx: Idx| {
            blocks
                .get(idx as usize)
                .and_then(|b| segments.get(b.segment as usize))
                .is_some_and(|s| s.expandable)
        };
        let pool = &mut self.pools[pool_index(small)];
        if gc {
            pool.get_free_blocks_call_count += 1;
        }
        let (mut pos, mut key) =
            pool.blocks
                .find_from((stream, rounded, 0, 0), |&(s, _, _, _)| {
                    if s != stream {
                        Scan::Stop
                    } else {
                        Scan::Take
                    }
                })?;
        if is_expandable(key.3) {
            if expandable_active {
                let expandable_size = |idx: Idx| {
                    let b = &blocks[idx as usize];
                    let tail = blocks
                        .get(b.next as usize)
                        .filter(|n| !n.mapped)
                        .map_or(0, |n| n.size);
                    b.size + tail
                };
                let mut cur = key;
                for &next in pool.blocks.range_from(key).skip(1) {
                    if !is_expandable(cur.3)
                        || next.0 != stream
                        || expandable_size(next.3) >= expandable_size(cur.3)
                    {
                        break;
                    }
                    cur = next;
                }
                if cur != key {
                    (pos, key) = pool.blocks.find_from(cur, |_| Scan::Take)?;
                }
            } else {
                (pos, key) = pool.blocks.find_from(key, |&(s, _, _, idx)| {
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
        if max_split != u64::MAX {
            if rounded < max_split && size >= max_split {
                return None;
            }
            if rounded >= max_split && size >= rounded.saturating_add(max_non_split) {
                return None;
            }
        }
        Some((key.3, pos, key))
    }

    fn should_split(&self, idx: Idx, rounded: u64) -> bool {
        let b = self.b(idx);
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
    fn alloc_found_block(
        &mut self,
        idx: Idx,
        in_pool: Option<(Pos, FreeKey)>,
        rounded: u64,
        orig_size: u64,
        ctx: RawStackId,
    ) -> u64 {
        let already_split = self.b(idx).is_split();
        let expandable = self.is_expandable(idx);
        let small = self.b(idx).small;
        let mut block = idx;
        if self.should_split(idx, rounded) {
            // The front part becomes the allocation; the old block keeps the remainder.
            let r = self.b(idx);
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
            let front = self.new_block(front_block);
            if rem_prev != NIL {
                self.bm(rem_prev).next = front;
            }
            {
                let r = self.bm(idx);
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
            let remaining = self.b(idx).size;
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
                let size = self.b(idx).size;
                self.stats.inactive_split.decrease(small, 1);
                self.stats.inactive_split_bytes.decrease(small, size);
            }
        }

        let b = self.bm(block);
        b.allocated = true;
        b.requested = orig_size;
        b.stack = ctx;
        let (addr, size, stream) = (b.addr, b.size, b.stream);
        self.live.insert(addr, block);
        let s = &mut self.stats;
        s.allocation.increase(small, 1);
        s.allocated_bytes.increase(small, size);
        s.active.increase(small, 1);
        s.active_bytes.increase(small, size);
        s.requested_bytes.increase(small, orig_size);
        if size >= self.config.max_split_size {
            s.oversize_allocations.increase(1);
        }
        self.record(RawAction::Alloc, addr, orig_size, stream, ctx);
        addr
    }

    /// `alloc_block`: a new segment (or newly mapped expandable pages). `Ok(None)` is out of
    /// memory; other device errors are returned.
    #[allow(clippy::too_many_arguments)]
    fn alloc_block<D: Device>(
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
        let segment = self.new_segment(SegmentRec {
            base: ptr,
            size: alloc_size,
            stream,
            small,
            expandable: false,
            stack: ctx,
            live: true,
        });
        let idx = self.new_block(Block {
            addr: ptr,
            size: alloc_size,
            requested: 0,
            stream,
            small,
            segment,
            prev: NIL,
            next: NIL,
            allocated: false,
            mapped: true,
            event_count: 0,
            stream_uses: Vec::new(),
            gc_count_base: 0,
            stack: NO_STACK,
            live: true,
        });
        self.stats.segment.increase(small, 1);
        self.stats.reserved_bytes.increase(small, alloc_size);
        if alloc_size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.record(RawAction::SegmentAlloc, ptr, alloc_size, stream, ctx);
        Ok(Some(idx))
    }

    fn page_size(&self, small: bool) -> u64 {
        if small {
            SMALL_BUFFER
        } else {
            self.config.large_segment_size
        }
    }

    fn mergeable_free(&self, idx: Idx) -> bool {
        let b = self.b(idx);
        !b.allocated && b.event_count == 0 && b.stream_uses.is_empty()
    }

    /// Expandable segments (PyTorch's `try_allocate_expandable_block`): finds a run of free
    /// and unmapped blocks with room for `rounded` bytes (`find_expandable_block`), maps pages
    /// into it until one free block is big enough, and returns that block out of the pool.
    fn try_allocate_expandable_block<D: Device>(
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
            let prev = self.b(u).prev;
            let c = if prev != NIL && self.mergeable_free(prev) {
                prev
            } else {
                u
            };
            let mut bytes = 0u64;
            let mut b = c;
            while bytes < rounded && b != NIL && self.mergeable_free(b) {
                bytes = bytes.saturating_add(self.b(b).size);
                b = self.b(b).next;
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
                let segment = self.new_segment(SegmentRec {
                    base,
                    size: reserve,
                    stream,
                    small,
                    expandable: true,
                    stack: ctx,
                    live: true,
                });
                let u = self.new_block(Block {
                    addr: base,
                    size: reserve,
                    requested: 0,
                    stream,
                    small,
                    segment,
                    prev: NIL,
                    next: NIL,
                    allocated: false,
                    mapped: false,
                    event_count: 0,
                    stream_uses: Vec::new(),
                    gc_count_base: 0,
                    stack: NO_STACK,
                    live: true,
                });
                self.pool_insert(u);
                (u, true)
            }
        };
        if !self.b(cand).mapped {
            let size = self.b(cand).size.min(rounded);
            if !self.map_block(device, cand, size, ctx)? {
                if fresh {
                    // Do not keep a reservation nothing was ever mapped into.
                    self.pool_remove(cand);
                    let b = self.b(cand);
                    let (seg, base, size) = (b.segment, b.addr, b.size);
                    device.release_reservation(base, size)?;
                    self.delete_segment(seg);
                    self.delete_block(cand);
                }
                return Ok(None);
            }
        }
        // Invariant: a free mapped block followed by an unmapped one; each mapping merges
        // the newly mapped pages into the block before them.
        while self.b(cand).size < rounded {
            let next = self.b(cand).next;
            if next == NIL || self.b(next).mapped {
                return Ok(None);
            }
            let remaining = rounded - self.b(cand).size;
            let size = remaining.min(self.b(next).size);
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
    fn map_block<D: Device>(
        &mut self,
        device: &D,
        u: Idx,
        size: u64,
        ctx: RawStackId,
    ) -> Result<bool, DeviceError> {
        let ub = self.b(u).clone();
        let seg_base = self.segments[ub.segment as usize].base;
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
            let rest = self.new_block(Block {
                addr: ub.addr + bytes,
                size: ub.size - bytes,
                prev: u,
                next: ub.next,
                stream_uses: Vec::new(),
                ..ub.clone()
            });
            if ub.next != NIL {
                self.bm(ub.next).prev = rest;
            }
            let b = self.bm(u);
            b.next = rest;
            b.size = bytes;
            self.pool_insert(rest);
        }
        self.bm(u).mapped = true;
        self.total_allocated_memory += bytes;
        self.stats.reserved_bytes.increase(ub.small, bytes);
        self.stats.num_device_alloc += 1;
        self.record(RawAction::SegmentMap, ub.addr, bytes, ub.stream, ctx);
        for neighbour in [self.b(u).prev, self.b(u).next] {
            self.try_merge_blocks(u, neighbour);
        }
        self.bm(u).gc_count_base = self.pools[pool_index(ub.small)].get_free_blocks_call_count;
        self.pool_insert(u);
        Ok(true)
    }

    // ---- free --------------------------------------------------------------------------

    /// `free()`: the caller dropped the block. Returns false for an unknown pointer.
    pub fn free<D: Device>(&mut self, device: &D, ptr: u64, ctx: RawStackId) -> bool {
        let Some(idx) = self.live.remove(&ptr) else {
            return false;
        };
        self.call_time = None;
        let b = self.bm(idx);
        b.allocated = false;
        let (small, size, requested, stream, stack) =
            (b.small, b.size, b.requested, b.stream, b.stack);
        self.stats.allocation.decrease(small, 1);
        self.stats.allocated_bytes.decrease(small, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        let entry_stack = if ctx != NO_STACK { ctx } else { stack };
        let b = self.b(idx);
        if b.stream_uses.is_empty() && b.event_count == 0 {
            // The usual case: no other stream used the block, so it is free at once. Both
            // trace entries (identical but for the action) are written in one go, after the
            // pool work: the counter read is cheapest late in the critical section, away from
            // the lock's atomic instructions (measured, see the crate README).
            self.return_to_pool(idx);
            self.record_free_pair(ptr, requested, stream, entry_stack);
            return true;
        }
        self.record(
            RawAction::FreeRequested,
            ptr,
            requested,
            stream,
            entry_stack,
        );
        if !self.b(idx).stream_uses.is_empty() {
            self.insert_events(device, idx);
        }
        if self.b(idx).event_count == 0 {
            self.free_block(idx, ctx);
        }
        true
    }

    /// Records an event on every stream the block was used on; the block stays pending until
    /// they complete. An event that cannot be recorded is treated as complete.
    fn insert_events<D: Device>(&mut self, device: &D, idx: Idx) {
        let streams = std::mem::take(&mut self.bm(idx).stream_uses);
        for s in streams {
            if let Ok(event) = device.record_event(Stream(s)) {
                self.bm(idx).event_count += 1;
                self.stream_events
                    .entry(s)
                    .or_default()
                    .push_back((event, idx));
            }
        }
    }

    /// `free_block`: returns a block to its pool, merging with free neighbours.
    fn free_block(&mut self, idx: Idx, ctx: RawStackId) {
        let b = self.b(idx);
        let (addr, requested, stream, stack) = (b.addr, b.requested, b.stream, b.stack);
        let entry_stack = if ctx != NO_STACK { ctx } else { stack };
        self.record(
            RawAction::FreeCompleted,
            addr,
            requested,
            stream,
            entry_stack,
        );
        self.return_to_pool(idx);
    }

    /// The rest of `free_block` after its `free_completed` entry: merges the block with its
    /// free neighbours, puts it in its pool and updates the statistics.
    fn return_to_pool(&mut self, idx: Idx) {
        let b = self.b(idx);
        let (addr, size, requested, stream, small) =
            (b.addr, b.size, b.requested, b.stream, b.small);
        self.bm(idx).stack = NO_STACK;
        let expandable = self.is_expandable(idx);
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        let pool = pool_index(small);
        let count = self.pools[pool].get_free_blocks_call_count;
        // Blocks being freed are always mapped; the general path below stays for safety.
        if self.b(idx).mapped {
            // Pool keys of the free neighbours merged into this block: the merged block takes
            // the place of one of them in the pool (one `memmove` instead of a removal and an
            // insertion).
            let mut absorbed: [Option<FreeKey>; 2] = [None, None];
            let neighbours = [self.b(idx).prev, self.b(idx).next];
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
            self.bm(idx).gc_count_base = count;
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
            for neighbour in [self.b(idx).prev, self.b(idx).next] {
                let subsumed = self.try_merge_blocks(idx, neighbour);
                if subsumed > 0 {
                    net_blocks -= 1;
                    net_bytes -= subsumed as i64;
                }
            }
            self.bm(idx).gc_count_base = count;
            self.pool_insert(idx);
        }
        let b = self.b(idx);
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
    fn absorb_free_neighbour(&mut self, dst: Idx, src: Idx) -> Option<FreeKey> {
        if src == NIL || !self.mergeable_free(src) || !self.b(src).mapped {
            return None;
        }
        let key = self.free_key(src);
        self.fold_neighbour(dst, src);
        Some(key)
    }

    /// Folds the neighbour `src` into `dst` (address, links and size), deletes `src` and
    /// returns its size. Its pool entry is the caller's business.
    #[inline]
    fn fold_neighbour(&mut self, dst: Idx, src: Idx) -> u64 {
        let (s_addr, s_size, s_prev, s_next) = {
            let s = self.b(src);
            (s.addr, s.size, s.prev, s.next)
        };
        if self.b(dst).prev == src {
            let d = self.bm(dst);
            d.addr = s_addr;
            d.prev = s_prev;
            if s_prev != NIL {
                self.bm(s_prev).next = dst;
            }
        } else {
            self.bm(dst).next = s_next;
            if s_next != NIL {
                self.bm(s_next).prev = dst;
            }
        }
        self.bm(dst).size += s_size;
        self.delete_block(src);
        s_size
    }

    /// Merges `src` into `dst` when `src` is free, has no pending events and the same mapped
    /// state. Returns the bytes absorbed (0 if nothing merged).
    fn try_merge_blocks(&mut self, dst: Idx, src: Idx) -> u64 {
        if src == NIL || !self.mergeable_free(src) || self.b(src).mapped != self.b(dst).mapped {
            return 0;
        }
        self.pool_remove(src);
        self.fold_neighbour(dst, src)
    }

    pub fn record_stream(&mut self, ptr: u64, stream: Stream) {
        if let Some(&idx) = self.live.get(&ptr) {
            let b = self.bm(idx);
            if stream.0 != b.stream && !b.stream_uses.contains(&stream.0) {
                b.stream_uses.push(stream.0);
            }
        }
    }

    /// `process_events`: frees blocks whose events have all completed.
    fn process_events<D: Device>(
        &mut self,
        device: &D,
        ctx: RawStackId,
    ) -> Result<(), DeviceError> {
        if self.stream_events.is_empty() {
            return Ok(());
        }
        let streams: Vec<i64> = self.stream_events.keys().copied().collect();
        for s in streams {
            while let Some(&(event, idx)) = self.stream_events.get(&s).and_then(|q| q.front()) {
                if !device.query_event(event)? {
                    break;
                }
                if let Some(q) = self.stream_events.get_mut(&s) {
                    q.pop_front();
                }
                device.destroy_event(event);
                self.complete_event(idx, ctx);
            }
            if self.stream_events.get(&s).is_some_and(VecDeque::is_empty) {
                self.stream_events.remove(&s);
            }
        }
        Ok(())
    }

    fn complete_event(&mut self, idx: Idx, ctx: RawStackId) {
        let b = self.bm(idx);
        b.event_count = b.event_count.saturating_sub(1);
        if b.event_count == 0 {
            self.free_block(idx, ctx);
        }
    }

    /// `synchronize_and_free_events`.
    fn synchronize_and_free_events<D: Device>(
        &mut self,
        device: &D,
        ctx: RawStackId,
    ) -> Result<(), DeviceError> {
        self.stats.num_sync_all_streams += 1;
        while let Some((s, mut queue)) = self.stream_events.pop_first() {
            while let Some((event, idx)) = queue.pop_front() {
                if let Err(e) = device.synchronize_event(event) {
                    queue.push_front((event, idx));
                    self.stream_events.insert(s, queue);
                    return Err(e);
                }
                device.destroy_event(event);
                self.complete_event(idx, ctx);
            }
        }
        Ok(())
    }

    // ---- releasing cached memory -------------------------------------------------------

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

    fn release_blocks<D: Device>(
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
            } else if !self.b(idx).is_split() {
                self.release_block(device, idx, ctx)?;
            }
        }
        for idx in to_unmap {
            self.unmap_block(device, idx, ctx)?;
        }
        Ok(())
    }

    /// `release_block`: `cudaFree` of a whole free segment.
    fn release_block<D: Device>(
        &mut self,
        device: &D,
        idx: Idx,
        ctx: RawStackId,
    ) -> Result<(), DeviceError> {
        let b = self.b(idx).clone();
        device.free(b.addr, b.size)?;
        self.pool_remove(idx);
        self.total_allocated_memory -= b.size;
        self.stats.segment.decrease(b.small, 1);
        self.stats.reserved_bytes.decrease(b.small, b.size);
        if b.size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.stats.num_device_free += 1;
        let seg_stack = self.segments[b.segment as usize].stack;
        let stack = if ctx != NO_STACK { ctx } else { seg_stack };
        self.record(RawAction::SegmentFree, b.addr, b.size, b.stream, stack);
        self.delete_segment(b.segment);
        self.delete_block(idx);
        Ok(())
    }

    /// Unmaps the whole pages inside a free expandable block.
    fn unmap_block<D: Device>(
        &mut self,
        device: &D,
        idx: Idx,
        ctx: RawStackId,
    ) -> Result<(), DeviceError> {
        let b = self.b(idx).clone();
        let seg = self.segments[b.segment as usize].clone();
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
            let head = self.new_block(Block {
                size: begin - b.addr,
                next: idx,
                stream_uses: Vec::new(),
                ..b.clone()
            });
            if b.prev != NIL {
                self.bm(b.prev).next = head;
            }
            let m = self.bm(idx);
            m.prev = head;
            m.addr = begin;
            m.size -= begin - b.addr;
            self.pool_insert(head);
        }
        if end < b.addr + b.size {
            let m = self.b(middle).clone();
            let tail = self.new_block(Block {
                addr: end,
                size: b.addr + b.size - end,
                prev: middle,
                next: m.next,
                stream_uses: Vec::new(),
                ..m
            });
            if m.next != NIL {
                self.bm(m.next).prev = tail;
            }
            let mm = self.bm(middle);
            mm.next = tail;
            mm.size = end - mm.addr;
            self.pool_insert(tail);
        }
        self.bm(middle).mapped = false;
        self.total_allocated_memory -= bytes;
        self.stats.reserved_bytes.decrease(b.small, bytes);
        self.stats.num_device_free += 1;
        let stack = if ctx != NO_STACK { ctx } else { seg.stack };
        self.record(RawAction::SegmentUnmap, begin, bytes, b.stream, stack);
        for neighbour in [self.b(middle).prev, self.b(middle).next] {
            self.try_merge_blocks(middle, neighbour);
        }
        let m = self.b(middle);
        if !m.is_split() {
            // The whole reservation is unmapped: give it back (no trace entry, as PyTorch).
            device.release_reservation(seg.base, seg.size)?;
            self.delete_segment(m.segment);
            self.delete_block(middle);
            return Ok(());
        }
        self.pool_insert(middle);
        Ok(())
    }

    /// `release_available_cached_blocks`: with a finite `max_split_size`, frees one oversize
    /// block big enough, or the largest oversize blocks until enough is freed.
    fn release_available_cached_blocks<D: Device>(
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
            if s == stream && !self.is_expandable(idx) && !self.b(idx).is_split() {
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
            if !self.is_expandable(idx) && !self.b(idx).is_split() {
                self.release_block(device, idx, ctx)?;
                released += size;
            }
        }
        Ok(released >= key_size)
    }

    /// `garbage_collect_cached_blocks`: frees old whole free large-pool segments until usage
    /// falls below `threshold * allowed`.
    fn garbage_collect_cached_blocks<D: Device>(
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
            .filter(|&idx| !self.is_expandable(idx) && !self.b(idx).is_split())
            .map(|idx| (idx, count.saturating_sub(self.b(idx).gc_count_base)))
            .collect();
        let mut reclaimed = 0;
        while reclaimed < target && !candidates.is_empty() {
            let total_age: u64 = candidates.iter().map(|c| c.1).sum();
            let mean = total_age as f64 / candidates.len() as f64;
            let mut freed_any = false;
            let mut kept = Vec::with_capacity(candidates.len());
            for (idx, age) in candidates {
                if age as f64 >= mean {
                    let size = self.b(idx).size;
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

    pub fn set_memory_fraction(&mut self, fraction: f64, device_total: u64) {
        self.fraction = fraction;
        self.allowed_max = (fraction * device_total as f64) as u64;
        self.set_fraction = fraction < 1.0;
    }

    // ---- restoring recorded state --------------------------------------------------------

    /// Puts a segment the device already holds into the cache with the given block layout
    /// (see [`super::CachingAllocator::restore_segment`]). Blocks must be non-empty multiples of
    /// 512 bytes that tile `[base, base + size)`; adjacent free (or unmapped) blocks are merged
    /// as PyTorch keeps them. Returns false, changing nothing, when the layout is invalid or
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
            .iter()
            .any(|s| s.live && s.base < end && seg.base < s.base.saturating_add(s.size));
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
        let segment = self.new_segment(SegmentRec {
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
            let idx = self.new_block(Block {
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
                self.bm(prev).next = idx;
            }
            if mapped {
                self.total_allocated_memory += b.size;
                self.stats.reserved_bytes.increase(small, b.size);
            }
            if allocated {
                self.live.insert(addr, idx);
                let s = &mut self.stats;
                s.allocation.increase(small, 1);
                s.allocated_bytes.increase(small, b.size);
                s.active.increase(small, 1);
                s.active_bytes.increase(small, b.size);
                s.requested_bytes.increase(small, requested);
                if b.size >= self.config.max_split_size {
                    s.oversize_allocations.increase(1);
                }
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
            self.stats.segment.increase(small, 1);
            if seg.size >= self.config.max_split_size {
                self.stats.oversize_segments.increase(1);
            }
        }
        true
    }

    // ---- introspection -----------------------------------------------------------------

    /// Heads of every live segment's block chain (expandable: the reservation's first block).
    pub fn segment_heads(&self) -> Vec<Idx> {
        self.blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.live && b.prev == NIL)
            .map(|(i, _)| i as Idx)
            .collect()
    }

    pub fn chain(&self, head: Idx) -> impl Iterator<Item = (Idx, &Block)> + '_ {
        let mut cur = head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let i = cur;
            let b = self.blocks.get(cur as usize)?;
            cur = b.next;
            Some((i, b))
        })
    }

    /// Checks every structural invariant and that the stats equal a recomputation from the
    /// block lists. Returns the violations.
    pub fn check_invariants(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let mut err = |s: String| errors.push(s);
        // [all, small, large] recomputed.
        let mut allocation = [0i64; 3];
        let mut allocated_bytes = [0i64; 3];
        let mut active = [0i64; 3];
        let mut active_bytes = [0i64; 3];
        let mut requested = [0i64; 3];
        let mut segments = [0i64; 3];
        let mut reserved = [0i64; 3];
        let mut inactive_split = [0i64; 3];
        let mut inactive_split_bytes = [0i64; 3];
        let add = |a: &mut [i64; 3], small: bool, v: u64| {
            a[0] += v as i64;
            a[if small { 1 } else { 2 }] += v as i64;
        };
        let mut seen_blocks = 0usize;
        let mut free_in_pools = 0usize;
        let mut unmapped_in_pools = 0usize;
        for head in self.segment_heads() {
            let seg_idx = self.b(head).segment;
            let Some(seg) = self.segments.get(seg_idx as usize).filter(|s| s.live) else {
                err(format!("block {head} belongs to a dead segment {seg_idx}"));
                continue;
            };
            let mut expected = seg.base;
            let mut total = 0u64;
            let mut prev_idx = NIL;
            let mut prev_free_state: Option<bool> = None;
            for (idx, b) in self.chain(head) {
                seen_blocks += 1;
                if !b.live {
                    err(format!("dead block {idx} linked in segment {seg_idx}"));
                }
                if b.prev != prev_idx {
                    err(format!("block {idx}: prev link {} != {prev_idx}", b.prev));
                }
                if b.addr != expected {
                    err(format!(
                        "block {idx} at {:#x}, expected {expected:#x}",
                        b.addr
                    ));
                }
                if b.segment != seg_idx || b.stream != seg.stream || b.small != seg.small {
                    err(format!("block {idx} disagrees with its segment {seg_idx}"));
                }
                if b.size == 0 || b.size % MIN_BLOCK_SIZE != 0 {
                    err(format!("block {idx} has size {}", b.size));
                }
                if !seg.expandable && !b.mapped {
                    err(format!("block {idx} of a plain segment is unmapped"));
                }
                let free_here = self.mergeable_free(idx);
                if free_here {
                    if let Some(prev_mapped) = prev_free_state {
                        if prev_mapped == b.mapped {
                            err(format!(
                                "block {idx} and its predecessor are mergeable free neighbours"
                            ));
                        }
                    }
                    prev_free_state = Some(b.mapped);
                } else {
                    prev_free_state = None;
                }
                if b.allocated {
                    if self.live.get(&b.addr) != Some(&idx) {
                        err(format!("allocated block {idx} is not in the pointer map"));
                    }
                    add(&mut allocation, b.small, 1);
                    add(&mut allocated_bytes, b.small, b.size);
                }
                if b.allocated || b.event_count > 0 {
                    add(&mut active, b.small, 1);
                    add(&mut active_bytes, b.small, b.size);
                    add(&mut requested, b.small, b.requested);
                }
                if !b.allocated && b.event_count == 0 {
                    let pool = &self.pools[pool_index(b.small)];
                    let in_pool = if b.mapped {
                        pool.blocks.contains(&(b.stream, b.size, b.addr, idx))
                    } else {
                        pool.unmapped.contains(&(b.stream, b.addr, idx))
                    };
                    if !in_pool {
                        err(format!("free block {idx} is missing from its pool"));
                    }
                    if b.mapped {
                        free_in_pools += 1;
                        if !seg.expandable && b.is_split() {
                            add(&mut inactive_split, b.small, 1);
                            add(&mut inactive_split_bytes, b.small, b.size);
                        }
                    } else {
                        unmapped_in_pools += 1;
                    }
                }
                if b.mapped {
                    add(&mut reserved, b.small, b.size);
                }
                expected = b.addr + b.size;
                total += b.size;
                prev_idx = idx;
            }
            if total != seg.size {
                err(format!(
                    "segment {seg_idx}: blocks sum to {total}, segment is {}",
                    seg.size
                ));
            }
            if !seg.expandable {
                add(&mut segments, seg.small, 1);
            }
        }
        let live_blocks = self.blocks.iter().filter(|b| b.live).count();
        if live_blocks != seen_blocks {
            err(format!(
                "{live_blocks} live blocks but {seen_blocks} reachable from segments"
            ));
        }
        let pooled: usize = self.pools.iter().map(|p| p.blocks.len()).sum();
        if pooled != free_in_pools {
            err(format!(
                "{pooled} blocks in pools but {free_in_pools} free mapped blocks"
            ));
        }
        let unmapped: usize = self.pools.iter().map(|p| p.unmapped.len()).sum();
        if unmapped != unmapped_in_pools {
            err(format!(
                "{unmapped} unmapped entries but {unmapped_in_pools} unmapped blocks"
            ));
        }
        if self.live.len() as i64 != allocation[0] {
            err(format!(
                "pointer map holds {} entries, {} blocks allocated",
                self.live.len(),
                allocation[0]
            ));
        }
        let s = &self.stats;
        let checks: [(&str, &crate::stats::StatArray, [i64; 3]); 9] = [
            ("allocation", &s.allocation, allocation),
            ("allocated_bytes", &s.allocated_bytes, allocated_bytes),
            ("active", &s.active, active),
            ("active_bytes", &s.active_bytes, active_bytes),
            ("requested_bytes", &s.requested_bytes, requested),
            ("segment", &s.segment, segments),
            ("reserved_bytes", &s.reserved_bytes, reserved),
            ("inactive_split", &s.inactive_split, inactive_split),
            (
                "inactive_split_bytes",
                &s.inactive_split_bytes,
                inactive_split_bytes,
            ),
        ];
        for (name, stat, recomputed) in checks {
            for (i, value) in recomputed.iter().enumerate() {
                if stat.0[i].current != *value {
                    err(format!(
                        "{name}[{i}].current is {} but recomputes to {value}",
                        stat.0[i].current
                    ));
                }
                if stat.0[i].peak < stat.0[i].current {
                    err(format!("{name}[{i}].peak below current"));
                }
            }
        }
        if reserved[0] < active_bytes[0] || active_bytes[0] < allocated_bytes[0] {
            err(format!(
                "reserved {} >= active {} >= allocated {} does not hold",
                reserved[0], active_bytes[0], allocated_bytes[0]
            ));
        }
        if self.total_allocated_memory as i64 != reserved[0] {
            err(format!(
                "total_allocated_memory {} != reserved bytes {}",
                self.total_allocated_memory, reserved[0]
            ));
        }
        errors
    }
}
