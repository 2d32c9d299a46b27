//! The per-device allocator state and algorithm (PyTorch's `DeviceCachingAllocator`).
//!
//! Everything here runs under the device lock. Blocks and segments live in arenas addressed by
//! index (`super::arena`, `super::block`); a segment's blocks are linked by `prev`/`next`; free
//! blocks sit in two ordered sets per pool (`super::pool`: mapped by `(stream, size, address)`,
//! unmapped expandable tails by `(stream, address)`).
//!
//! [`State`] is defined here with the few helpers every step uses; each step of the algorithm
//! is an `impl State` block in its own file:
//!
//! * `malloc`: the allocation path, PyTorch's `malloc` (best fit, then the out-of-memory retry
//!   ladder), splitting the block found, the out-of-memory report;
//! * `segments`: creating and freeing a whole plain segment (`cudaMalloc`/`cudaFree`);
//! * `expandable`: expandable segments (reserving, mapping and unmapping pages);
//! * `free`: the free path, merging a freed block with its free neighbours;
//! * `events`: `record_stream` and the events that keep a freed block pending;
//! * `release`: giving cached memory back (`empty_cache`, the oversize release before a retry,
//!   garbage collection);
//! * `history`: the hooks that write trace entries, stacks and the clock;
//! * `stats`: the statistics updates shared by several steps;
//! * `restore`: putting recorded segments back (for replaying a file from its start state);
//! * `invariants`: walking the chains and checking every structural rule and statistic.
//!
//! The step files use `State` and the data modules but never each other: one step calls
//! another through `State`'s methods.

mod events;
mod expandable;
mod free;
mod history;
mod invariants;
pub(crate) mod malloc;
mod release;
pub(crate) mod restore;
mod segments;
mod stats;

use std::collections::{BTreeMap, VecDeque};

use crate::allocator::arena::{Arena, Idx};
use crate::allocator::block::{Block, SegmentRec};
use crate::allocator::pool::{free_key, pool_index, BlockPool};
use crate::allocator::ptr_map::PtrMap;
use crate::clock::Clock;
use crate::config::AllocatorConfig;
use crate::device::Event;
use crate::history::History;
use crate::stacks::{GivenStacks, StackInterner};
use crate::stats::DeviceStats;

pub(crate) struct State {
    pub device_index: i64,
    pub config: AllocatorConfig,
    pub blocks: Arena<Block>,
    pub segments: Arena<SegmentRec>,
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
            blocks: Arena::default(),
            segments: Arena::default(),
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

    /// Whether the block's segment is an expandable one.
    #[inline]
    fn is_expandable(&self, idx: Idx) -> bool {
        self.segments[self.blocks[idx].segment].expandable
    }

    /// Puts the free block `idx` into its pool, under the key for its state.
    #[inline]
    fn pool_insert(&mut self, idx: Idx) {
        let b = &self.blocks[idx];
        let pool = pool_index(b.small);
        if b.mapped {
            let key = free_key(b, idx);
            self.pools[pool].blocks.insert(key);
        } else {
            let key = (b.stream, b.addr, idx);
            self.pools[pool].unmapped.insert(key);
        }
    }

    /// Takes the free block `idx` out of its pool (its fields must be as they were put in).
    #[inline]
    fn pool_remove(&mut self, idx: Idx) {
        let b = &self.blocks[idx];
        let pool = pool_index(b.small);
        if b.mapped {
            let key = free_key(b, idx);
            self.pools[pool].blocks.remove(&key);
        } else {
            let key = (b.stream, b.addr, idx);
            self.pools[pool].unmapped.remove(&key);
        }
    }

    /// Garbage collection runs only under a memory fraction and with a threshold set.
    #[inline]
    fn gc_enabled(&self) -> bool {
        self.set_fraction && self.config.garbage_collection_threshold > 0.0
    }

    pub fn set_memory_fraction(&mut self, fraction: f64, device_total: u64) {
        self.fraction = fraction;
        self.allowed_max = (fraction * device_total as f64) as u64;
        self.set_fraction = fraction < 1.0;
    }
}
