//! Introspection: the block chains of the live segments, and a check of every structural
//! invariant and statistic against a recomputation from those chains
//! (`CachingAllocator::check_invariants`, which the tests call after every step).

use super::State;
use crate::allocator::arena::{Idx, NIL};
use crate::allocator::block::Block;
use crate::allocator::pool::pool_index;
use crate::config::MIN_BLOCK_SIZE;

impl State {
    /// Heads of every live segment's block chain (expandable: the reservation's first block).
    pub fn segment_heads(&self) -> Vec<Idx> {
        self.blocks
            .iter_live()
            .filter(|(_, b)| b.prev == NIL)
            .map(|(i, _)| i)
            .collect()
    }

    pub fn chain(&self, head: Idx) -> impl Iterator<Item = (Idx, &Block)> + '_ {
        let mut cur = head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let i = cur;
            let b = self.blocks.get(cur)?;
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
            let seg_idx = self.blocks[head].segment;
            let Some(seg) = self.segments.get(seg_idx).filter(|s| s.live) else {
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
                let free_here = self.blocks[idx].is_mergeable_free();
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
        let live_blocks = self.blocks.iter_live().count();
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
