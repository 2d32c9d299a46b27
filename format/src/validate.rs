//! Invariant checks (`memsnap validate`).
//!
//! The invariants are the ones PyTorch's exporter guarantees and `_memory_viz.py` asserts:
//! blocks tile their segment, the segment's size sums match its blocks, segments of one device
//! do not overlap, trace times never go backwards, and each free matches the size of the
//! allocation it frees. Numbers no allocator can produce (a negative size, anything beyond 64
//! bits) load as data (see [`crate::int`]) and are reported here.

use std::collections::HashMap;
use std::fmt;

use crate::int::{ExactInts, IntField};
use crate::model::{Action, BlockState, Snapshot};

/// One broken invariant and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// A path into the snapshot, e.g. `segments[3].blocks[2]` or `device_traces[0][17]`.
    pub place: String,
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.place, self.what)
    }
}

/// Checks every invariant and returns the violations (empty when the snapshot is sound).
pub fn validate(snapshot: &Snapshot) -> Vec<Violation> {
    let mut out = Vec::new();
    check_numbers(snapshot, &mut out);
    check_segments(snapshot, &mut out);
    check_traces(snapshot, &mut out);
    out
}

/// Exact values no allocator writes: negative sizes, and anything beyond 64 bits (addresses
/// may be negative: PyTorch's C++ path writes addresses as `int64_t`).
fn check_numbers(snapshot: &Snapshot, out: &mut Vec<Violation>) {
    let mut check = |place: &dyn Fn() -> String, exact: &ExactInts| {
        for (field, v) in exact.iter() {
            let what = if v.as_i64().is_none() && v.as_u64().is_none() {
                "does not fit 64 bits"
            } else if v.is_negative()
                && !matches!(field, IntField::Addr | IntField::Address)
                && field.is_unsigned()
            {
                "is negative"
            } else {
                continue;
            };
            out.push(Violation {
                place: place(),
                what: format!("{} {v} {what}", field.key()),
            });
        }
    };
    for (si, seg) in snapshot.segments.iter().enumerate() {
        check(&|| format!("segments[{si}]"), &seg.exact);
        for (bi, block) in seg.blocks.iter().enumerate() {
            check(&|| format!("segments[{si}].blocks[{bi}]"), &block.exact);
            for (hi, item) in block.history.iter().flatten().enumerate() {
                check(
                    &|| format!("segments[{si}].blocks[{bi}].history[{hi}]"),
                    &item.exact,
                );
            }
        }
    }
    for (d, trace) in snapshot.traces().iter().enumerate() {
        for (i, e) in trace.iter().enumerate() {
            if let Some(rare) = &e.rare {
                check(&|| format!("device_traces[{d}][{i}]"), &rare.exact);
            }
        }
    }
}

fn check_segments(snapshot: &Snapshot, out: &mut Vec<Violation>) {
    let mut push = |place: String, what: String| out.push(Violation { place, what });
    for (si, seg) in snapshot.segments.iter().enumerate() {
        let place = format!("segments[{si}]");
        let mut expected_addr = seg.address;
        let (mut total, mut allocated, mut active, mut requested) = (0u64, 0u64, 0u64, 0u64);
        for (bi, block) in seg.blocks.iter().enumerate() {
            if let Some(addr) = block.address {
                if addr != expected_addr {
                    push(
                        format!("{place}.blocks[{bi}]"),
                        format!(
                            "address {addr:#x} does not follow the previous block (expected {expected_addr:#x})"
                        ),
                    );
                }
                expected_addr = addr.wrapping_add(block.size);
            } else {
                expected_addr = expected_addr.wrapping_add(block.size);
            }
            total = total.wrapping_add(block.size);
            if block.state == BlockState::ActiveAllocated {
                allocated = allocated.wrapping_add(block.size);
            }
            if block.state.is_active() {
                active = active.wrapping_add(block.size);
                requested = requested.wrapping_add(block.requested_size.unwrap_or(0));
            }
        }
        if !seg.blocks.is_empty() && total != seg.total_size {
            push(
                place.clone(),
                format!(
                    "blocks sum to {total} bytes but total_size is {}",
                    seg.total_size
                ),
            );
        }
        let sums = [
            ("allocated_size", seg.allocated_size, allocated),
            ("active_size", seg.active_size, active),
            ("requested_size", seg.requested_size, requested),
        ];
        for (key, stated, computed) in sums {
            if let Some(stated) = stated {
                if stated != computed {
                    push(
                        place.clone(),
                        format!("{key} is {stated} but its blocks sum to {computed}"),
                    );
                }
            }
        }
    }

    // Segments of one device must not overlap.
    let mut by_device: HashMap<i64, Vec<(u64, u64, usize)>> = HashMap::new();
    for (si, seg) in snapshot.segments.iter().enumerate() {
        by_device.entry(seg.device).or_default().push((
            seg.address,
            seg.address.saturating_add(seg.total_size),
            si,
        ));
    }
    let mut devices: Vec<_> = by_device.into_iter().collect();
    devices.sort_unstable_by_key(|(d, _)| *d);
    for (_, mut ranges) in devices {
        ranges.sort_unstable();
        // Compare each segment with the furthest-reaching one before it, not only its
        // neighbour: a long segment can cover several that follow.
        let mut reach: Option<(u64, usize)> = None;
        for &(start, end, b) in &ranges {
            if let Some((far_end, a)) = reach {
                if start < far_end {
                    push(
                        format!("segments[{b}]"),
                        format!("overlaps segments[{a}] (starts {start:#x}, which is before its end {far_end:#x})"),
                    );
                }
            }
            if reach.is_none_or(|(far_end, _)| end > far_end) {
                reach = Some((end, b));
            }
        }
    }
}

fn check_traces(snapshot: &Snapshot, out: &mut Vec<Violation>) {
    for (device, trace) in snapshot.traces().iter().enumerate() {
        let mut last_time: Option<(i64, usize)> = None;
        // Live blocks: address -> (requested size, index of the alloc).
        let mut live: HashMap<u64, (u64, usize)> = HashMap::new();
        for (i, entry) in trace.iter().enumerate() {
            let place = || format!("device_traces[{device}][{i}]");
            if let Some(t) = entry.time_us() {
                if let Some((prev, j)) = last_time {
                    if t < prev {
                        out.push(Violation {
                            place: place(),
                            what: format!(
                                "time_us {t} is earlier than entry {j}'s {prev} (times must not go backwards)"
                            ),
                        });
                    }
                }
                last_time = Some((t, i));
            }
            match entry.action {
                Action::Alloc => {
                    if let Some((_, j)) = live.insert(entry.addr, (entry.size, i)) {
                        out.push(Violation {
                            place: place(),
                            what: format!(
                                "alloc at {:#x}, which entry {j} allocated and nothing freed",
                                entry.addr
                            ),
                        });
                    }
                }
                Action::FreeRequested | Action::FreeCompleted | Action::Free => {
                    let found = if entry.action == Action::FreeRequested {
                        live.get(&entry.addr).copied()
                    } else {
                        live.remove(&entry.addr)
                    };
                    if let Some((size, j)) = found {
                        if size != entry.size {
                            out.push(Violation {
                                place: place(),
                                what: format!(
                                    "frees {} bytes at {:#x} but entry {j} allocated {size}",
                                    entry.size, entry.addr
                                ),
                            });
                        }
                    }
                }
                _ => {}
            }
        }
    }
}
