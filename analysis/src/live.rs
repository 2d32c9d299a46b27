//! The live set at an instant, as a picture shows it: a frame tree for a flame graph
//! ([`flame_tree`]) and each segment's live blocks for a memory map ([`segment_blocks`]).
//! Both are queries on a [`DeviceTimeline`], built on [`DeviceTimeline::live_at`].
//! [`live_set`] is the live set itself split by a size threshold (what the flame graph and
//! pprof exports weigh), and [`highest_peak_timeline`] picks the device a report shows when
//! none is named.

use foldhash::HashMap;
use memsnap_format::{FrameId, Snapshot, StackId};

use crate::sites::is_filtered_frame;
use crate::{AllocId, CurveKind, DeviceTimeline, Instant, Lifetime};

/// One device's allocations live after one event, split by a size threshold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveSet {
    /// The live allocations of at least the threshold, in stacking order.
    pub allocations: Vec<AllocId>,
    /// Their requested bytes.
    pub bytes: u64,
    /// Live allocations smaller than the threshold: not in `allocations`, only counted.
    pub smaller_count: u64,
    pub smaller_bytes: u64,
}

/// The allocations live after `event` (start <= event < end for `lifetime`), those smaller
/// than `min_size` only counted. O(m) (see [`crate::Replay::live_at`]).
pub fn live_set(
    timeline: &DeviceTimeline,
    event: u32,
    lifetime: Lifetime,
    min_size: u64,
) -> LiveSet {
    let replay = timeline.replay();
    let mut set = LiveSet::default();
    for id in replay.live_at(event, lifetime) {
        let Some(a) = replay.get(id) else { continue };
        if a.size < min_size {
            set.smaller_count += 1;
            set.smaller_bytes = set.smaller_bytes.saturating_add(a.size);
        } else {
            set.bytes = set.bytes.saturating_add(a.size);
            set.allocations.push(id);
        }
    }
    set
}

/// The timeline of the device whose active curve peaks highest (the lowest device on a tie),
/// the device `memsnap top` and the profile exports show when none is named; `None` when no
/// device has trace entries or segments. A [`DeviceTimeline::build`] and an O(n) peak per
/// device.
pub fn highest_peak_timeline(snapshot: &Snapshot) -> crate::Result<Option<DeviceTimeline>> {
    let mut best: Option<DeviceTimeline> = None;
    for device in DeviceTimeline::devices(snapshot) {
        let timeline = DeviceTimeline::build(snapshot, device)?;
        let peak = timeline.peak(CurveKind::Active).bytes;
        if best
            .as_ref()
            .is_none_or(|b| peak > b.peak(CurveKind::Active).bytes)
        {
            best = Some(timeline);
        }
    }
    Ok(best)
}

/// One node of the flame graph: a frame and the live bytes under it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlameNode {
    /// `None` for the root.
    pub frame: Option<FrameId>,
    pub bytes: u64,
    pub count: u64,
    /// Biggest first.
    pub children: Vec<FlameNode>,
}

/// Dropped without recursion: a tree is as deep as the deepest stack the file holds, and
/// the nested drops of a deep one would overflow the thread's stack.
impl Drop for FlameNode {
    fn drop(&mut self) {
        let mut pending = std::mem::take(&mut self.children);
        while let Some(mut node) = pending.pop() {
            pending.append(&mut node.children);
        }
    }
}

/// The allocations live at `at` (at least `min_size` bytes) as a tree from the outermost frame
/// to the innermost. Frames PyTorch's viewer hides are left out; allocations without a stack
/// sit directly under the root. Children are biggest first; equal ones in the order they were
/// first met.
///
/// O(l + f log f): `l` the live allocations and their frames (each frame one hash lookup
/// for its child, each stack's frames filtered once), `f` the tree's nodes (sorted per
/// parent). Looking each child up among its siblings was quadratic in the children of a
/// node (thousands of distinct call sites under one frame). The tree is built without
/// recursion, so a stack of any depth does not overflow the thread's stack here.
pub fn flame_tree(
    snapshot: &Snapshot,
    timeline: &DeviceTimeline,
    at: Instant,
    lifetime: Lifetime,
    min_size: u64,
) -> FlameNode {
    /// A node while the tree is built: children by index into the arena, in the order
    /// they were first met.
    struct Building {
        frame: Option<FrameId>,
        bytes: u64,
        count: u64,
        children: Vec<u32>,
    }
    let mut nodes = vec![Building {
        frame: None,
        bytes: 0,
        count: 0,
        children: Vec::new(),
    }];
    // (parent, frame) -> child.
    let mut child_of: HashMap<(u32, FrameId), u32> = HashMap::default();
    // Per stack, its frames outermost first without the hidden ones (each stack once).
    let mut shown: HashMap<StackId, Vec<FrameId>> = HashMap::default();
    for id in timeline.live_at(at, lifetime) {
        let Some(a) = timeline.replay().get(id) else {
            continue;
        };
        if a.size < min_size {
            continue;
        }
        nodes[0].bytes = nodes[0].bytes.saturating_add(a.size);
        nodes[0].count += 1;
        let Some(stack) = a.stack else { continue };
        // Stacks are innermost first; the flame graph grows from the outermost frame.
        let frames = shown.entry(stack).or_insert_with(|| {
            snapshot
                .stacks
                .get(stack)
                .iter()
                .rev()
                .copied()
                .filter(|&f| !is_filtered_frame(snapshot.frames.get(f)))
                .collect()
        });
        let mut node = 0u32;
        for &frame in frames.iter() {
            node = match child_of.get(&(node, frame)) {
                Some(&child) => child,
                None => {
                    let child = nodes.len() as u32;
                    nodes.push(Building {
                        frame: Some(frame),
                        bytes: 0,
                        count: 0,
                        children: Vec::new(),
                    });
                    nodes[node as usize].children.push(child);
                    child_of.insert((node, frame), child);
                    child
                }
            };
            let n = &mut nodes[node as usize];
            n.bytes = n.bytes.saturating_add(a.size);
            n.count += 1;
        }
    }
    // A child is created after its parent: building from the last node back finds every
    // node's children built.
    let mut built: Vec<Option<FlameNode>> = Vec::with_capacity(nodes.len());
    built.resize_with(nodes.len(), || None);
    for (i, n) in nodes.into_iter().enumerate().rev() {
        let mut children: Vec<FlameNode> = n
            .children
            .iter()
            .filter_map(|&c| built[c as usize].take())
            .collect();
        // Stable: equal children keep the order they were met in.
        children.sort_by_key(|c| std::cmp::Reverse(c.bytes));
        built[i] = Some(FlameNode {
            frame: n.frame,
            bytes: n.bytes,
            count: n.count,
            children,
        });
    }
    built[0].take().unwrap_or_default()
}

/// A block's state at an instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    /// Held by the caller.
    Allocated,
    /// Freed by the caller, waiting for other streams (`free_requested` without
    /// `free_completed` yet).
    PendingFree,
}

/// A live block inside a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSpan {
    pub alloc: AllocId,
    pub addr: u64,
    pub size: u64,
    pub kind: BlockKind,
}

/// A segment and its live blocks at an instant, by address; the gaps are free (cached) memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentBlocks {
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    pub blocks: Vec<BlockSpan>,
}

/// The segments reserved at `at` with their live blocks. O(m + s log s + k log k) for `m`
/// allocations, `s` segments and `k` live blocks: each block's segment found by binary
/// search, each segment's blocks sorted once.
pub fn segment_blocks(timeline: &DeviceTimeline, at: Instant) -> Vec<SegmentBlocks> {
    let event = timeline.resolve(at);
    let replay = timeline.replay();
    let axis = replay.axis_len();
    let mut segments: Vec<SegmentBlocks> = replay
        .segments
        .iter()
        .filter(|s| s.start() <= event && event < s.end(axis))
        .map(|s| SegmentBlocks {
            addr: s.addr,
            size: s.size,
            stream: s.stream,
            blocks: Vec::new(),
        })
        .collect();
    segments.sort_by_key(|s| s.addr);
    for id in replay.live_at(event, Lifetime::Active) {
        let Some(a) = replay.get(id) else { continue };
        let i = segments.partition_point(|s| s.addr <= a.addr);
        let Some(segment) = i.checked_sub(1).map(|i| &mut segments[i]) else {
            continue;
        };
        if a.addr >= segment.addr.saturating_add(segment.size) {
            continue;
        }
        let kind = if a.is_live_at(event, Lifetime::Allocated, axis) {
            BlockKind::Allocated
        } else {
            BlockKind::PendingFree
        };
        segment.blocks.push(BlockSpan {
            alloc: id,
            addr: a.addr,
            size: a.size,
            kind,
        });
    }
    for segment in &mut segments {
        segment.blocks.sort_by_key(|b| b.addr);
    }
    segments
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_format::{Action, Frame, Segment, StackId, TraceEntry};

    /// One 1 MiB segment holding a 4 KiB block allocated in `forward` and a 1 KiB block from
    /// `grad` whose free was requested but has not completed; both stacks start in `main`.
    fn two_blocks() -> Snapshot {
        let mut s = Snapshot::new(1);
        let frames = |names: &[&str]| {
            names
                .iter()
                .map(|name| Frame::new(*name, "train.py", name.len() as u64))
                .collect::<Vec<_>>()
        };
        let forward = s.intern_stack(frames(&["linear", "forward", "main"]));
        let grad = s.intern_stack(frames(&["grad", "main"]));
        let mut segment = Segment::new(0, 0x10000, 1 << 20, 0);
        segment.blocks.clear();
        s.segments.push(segment);
        let events: [(Action, u64, u64, Option<StackId>); 4] = [
            (Action::SegmentAlloc, 0x10000, 1 << 20, None),
            (Action::Alloc, 0x10000, 4096, Some(forward)),
            (Action::Alloc, 0x11000, 1024, Some(grad)),
            (Action::FreeRequested, 0x11000, 1024, None),
        ];
        let trace = &mut s.device_traces.as_mut().expect("traces")[0];
        trace.extend(events.into_iter().map(|(action, addr, size, frames)| {
            let mut entry = TraceEntry::new(action, addr, size, 0);
            entry.frames = frames;
            entry
        }));
        s
    }

    #[test]
    fn flame_tree_sums_live_bytes_from_the_outermost_frame() {
        let s = two_blocks();
        let t = DeviceTimeline::build(&s, 0).expect("timeline");
        let root = flame_tree(&s, &t, Instant::Event(2), Lifetime::Active, 0);
        assert_eq!(root.bytes, 4096 + 1024);
        assert_eq!(root.children.len(), 1, "both stacks start in main");
        let main = &root.children[0];
        assert_eq!(s.frames.get(main.frame.expect("frame")).name, "main");
        assert_eq!(main.bytes, 5120);
        assert_eq!(main.children[0].bytes, 4096, "biggest child first");
        let small = flame_tree(&s, &t, Instant::Event(2), Lifetime::Active, 2048);
        assert_eq!(small.bytes, 4096, "min_size leaves the 1 KiB block out");
    }

    /// The tree as it was built first: each child looked up among its siblings, sorted
    /// recursively (the reference the indexed build must match node for node).
    fn reference_tree(s: &Snapshot, t: &DeviceTimeline, at: Instant) -> FlameNode {
        let mut root = FlameNode::default();
        for id in t.live_at(at, Lifetime::Active) {
            let a = t.replay().get(id).expect("live id");
            root.bytes += a.size;
            root.count += 1;
            let Some(stack) = a.stack else { continue };
            let mut node = &mut root;
            for &frame in s.stacks.get(stack).iter().rev() {
                if is_filtered_frame(s.frames.get(frame)) {
                    continue;
                }
                let i = match node.children.iter().position(|c| c.frame == Some(frame)) {
                    Some(i) => i,
                    None => {
                        node.children.push(FlameNode {
                            frame: Some(frame),
                            bytes: 0,
                            count: 0,
                            children: Vec::new(),
                        });
                        node.children.len() - 1
                    }
                };
                node = &mut node.children[i];
                node.bytes += a.size;
                node.count += 1;
            }
        }
        fn sort(node: &mut FlameNode) {
            node.children.sort_by_key(|c| std::cmp::Reverse(c.bytes));
            node.children.iter_mut().for_each(sort);
        }
        sort(&mut root);
        root
    }

    /// Stacks drawn from a few shared frames (and a hidden one), with equal sizes so ties
    /// decide the order: the same tree as the sibling search built.
    #[test]
    fn flame_tree_matches_the_sibling_search_it_replaced() {
        let mut s = Snapshot::new(1);
        let frame = |k: u64| {
            if k == 7 {
                Frame::new("PyEval_EvalFrame", "ceval.c", 1)
            } else {
                Frame::new(format!("f{k}"), "m.py", k)
            }
        };
        let mut entries = Vec::new();
        let mut x = 12345u64;
        for i in 0..400u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let depth = 1 + (x >> 60) as usize;
            let frames: Vec<Frame> = (0..depth).map(|d| frame((x >> (d * 3)) % 9)).collect();
            let stack = s.intern_stack(frames);
            let mut e = TraceEntry::new(Action::Alloc, 0x1000 * (i + 1), 512 * (1 + i % 3), 0);
            e.frames = (i % 11 != 0).then_some(stack);
            entries.push(e);
        }
        s.device_traces.as_mut().expect("traces")[0].extend(entries);
        let t = DeviceTimeline::build(&s, 0).expect("timeline");
        for event in [0, 57, 399] {
            let at = Instant::Event(event);
            assert_eq!(
                flame_tree(&s, &t, at, Lifetime::Active, 0),
                reference_tree(&s, &t, at)
            );
        }
    }

    /// One allocation whose stack is 200,000 frames deep: the tree is built and dropped
    /// without recursion (the recursive sort and drop overflowed the test thread's stack).
    #[test]
    fn flame_tree_of_a_very_deep_stack_does_not_overflow() {
        let mut s = Snapshot::new(1);
        let frames: Vec<Frame> = (0..200_000u64)
            .map(|k| Frame::new(format!("f{k}"), "deep.py", k))
            .collect();
        let stack = s.intern_stack(frames);
        let mut e = TraceEntry::new(Action::Alloc, 0x1000, 512, 0);
        e.frames = Some(stack);
        s.device_traces.as_mut().expect("traces")[0].push(e);
        let t = DeviceTimeline::build(&s, 0).expect("timeline");
        let root = flame_tree(&s, &t, Instant::Event(0), Lifetime::Active, 0);
        let (mut depth, mut node) = (0, &root);
        while let Some(child) = node.children.first() {
            depth += 1;
            node = child;
        }
        assert_eq!(depth, 200_000);
    }

    #[test]
    fn live_set_counts_blocks_below_the_threshold_apart() {
        let s = two_blocks();
        let t = DeviceTimeline::build(&s, 0).expect("timeline");
        // After event 3 the 1 KiB block's free is requested, not completed.
        let active = live_set(&t, 3, Lifetime::Active, 2048);
        assert_eq!((active.bytes, active.allocations.len()), (4096, 1));
        assert_eq!((active.smaller_bytes, active.smaller_count), (1024, 1));
        let allocated = live_set(&t, 3, Lifetime::Allocated, 0);
        assert_eq!((allocated.bytes, allocated.smaller_count), (4096, 0));
        let before = live_set(&t, 1, Lifetime::Active, 0);
        assert_eq!(
            before.bytes, 4096,
            "only the first alloc has happened after event 1"
        );
    }

    #[test]
    fn highest_peak_timeline_picks_the_busiest_device() {
        let mut s = Snapshot::new(2);
        let traces = s.device_traces.as_mut().expect("traces");
        traces[0].push(TraceEntry::new(Action::Alloc, 0x1000, 512, 0));
        traces[1].push(TraceEntry::new(Action::Alloc, 0x1000, 4096, 0));
        let t = highest_peak_timeline(&s)
            .expect("builds")
            .expect("a device");
        assert_eq!(t.device(), 1);
        assert!(highest_peak_timeline(&Snapshot::new(3))
            .expect("builds")
            .is_none());
    }

    #[test]
    fn pending_frees_are_told_apart_from_allocated_blocks() {
        let s = two_blocks();
        let t = DeviceTimeline::build(&s, 0).expect("timeline");
        let segments = segment_blocks(&t, Instant::Event(3));
        assert_eq!(segments.len(), 1);
        let kinds: Vec<_> = segments[0]
            .blocks
            .iter()
            .map(|b| (b.addr, b.kind))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (0x10000, BlockKind::Allocated),
                (0x11000, BlockKind::PendingFree)
            ]
        );
    }
}
