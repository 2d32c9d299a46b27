//! Live-set queries the viewer needs that `memsnap-analysis` does not offer yet. They are pure
//! functions over the snapshot and the analysis model, kept out of UI code so they can move
//! into the analysis crate (next to `DeviceTimeline::live_at`) unchanged:
//!
//! * [`flame_tree`]: the live set at an instant as a frame tree (the flame graph).
//! * [`segment_blocks`]: each segment's live blocks at an instant, allocated or pending free.
//!
//! The per-stack lookups (user-code site, search) live in `memsnap_plot::sites`, and a
//! device's profile for the diff comes from `memsnap_analysis::compare::device_profile`.

use memsnap_analysis::sites::is_filtered_frame;
use memsnap_analysis::{AllocId, DeviceTimeline, Instant, Lifetime};
use memsnap_format::{FrameId, Snapshot};

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

/// The allocations live at `at` (at least `min_size` bytes) as a tree from the outermost frame
/// to the innermost. Frames PyTorch's viewer hides are left out; allocations without a stack
/// sit directly under the root.
pub fn flame_tree(
    snapshot: &Snapshot,
    timeline: &DeviceTimeline,
    at: Instant,
    lifetime: Lifetime,
    min_size: u64,
) -> FlameNode {
    let mut root = FlameNode::default();
    for id in timeline.live_at(at, lifetime) {
        let Some(a) = timeline.replay().get(id) else {
            continue;
        };
        if a.size < min_size {
            continue;
        }
        root.bytes = root.bytes.saturating_add(a.size);
        root.count += 1;
        let Some(stack) = a.stack else { continue };
        let mut node = &mut root;
        // Stacks are innermost first; the flame graph grows from the outermost frame.
        for &frame in snapshot.stacks.get(stack).iter().rev() {
            if is_filtered_frame(snapshot.frames.get(frame)) {
                continue;
            }
            let i = match node.children.iter().position(|c| c.frame == Some(frame)) {
                Some(i) => i,
                None => {
                    node.children.push(FlameNode {
                        frame: Some(frame),
                        ..FlameNode::default()
                    });
                    node.children.len() - 1
                }
            };
            node = &mut node.children[i];
            node.bytes = node.bytes.saturating_add(a.size);
            node.count += 1;
        }
    }
    sort_biggest_first(&mut root);
    root
}

fn sort_biggest_first(node: &mut FlameNode) {
    node.children.sort_by_key(|c| std::cmp::Reverse(c.bytes));
    for child in &mut node.children {
        sort_biggest_first(child);
    }
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

/// The segments reserved at `at` with their live blocks.
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
    use memsnap_format::{Action, Frame, Segment, TraceEntry};

    fn snapshot() -> Snapshot {
        let mut s = Snapshot::new(1);
        let forward = s.intern_stack([
            Frame::new("linear", "model.py", 10),
            Frame::new("forward", "model.py", 20),
            Frame::new("main", "train.py", 1),
        ]);
        let backward = s.intern_stack([
            Frame::new("grad", "autograd.py", 5),
            Frame::new("main", "train.py", 1),
        ]);
        let mut seg = Segment::new(0, 0x10000, 1 << 20, 0);
        seg.blocks.clear();
        s.segments.push(seg);
        let trace = &mut s.device_traces.as_mut().expect("traces")[0];
        trace.push(TraceEntry::new(Action::SegmentAlloc, 0x10000, 1 << 20, 0));
        let mut a = TraceEntry::new(Action::Alloc, 0x10000, 4096, 0);
        a.frames = Some(forward);
        trace.push(a);
        let mut b = TraceEntry::new(Action::Alloc, 0x11000, 1024, 0);
        b.frames = Some(backward);
        trace.push(b);
        trace.push(TraceEntry::new(Action::FreeRequested, 0x11000, 1024, 0));
        s
    }

    #[test]
    fn flame_tree_sums_live_bytes_from_the_outermost_frame() {
        let s = snapshot();
        let t = DeviceTimeline::build(&s, 0).expect("timeline");
        let root = flame_tree(&s, &t, Instant::Event(2), Lifetime::Active, 0);
        assert_eq!(root.bytes, 4096 + 1024);
        assert_eq!(root.children.len(), 1, "both stacks start in main");
        let main = &root.children[0];
        assert_eq!(s.frames.get(main.frame.expect("frame")).name, "main");
        assert_eq!(main.bytes, 5120);
        assert_eq!(main.children[0].bytes, 4096, "biggest child first");
    }

    #[test]
    fn pending_frees_are_told_apart_from_allocated_blocks() {
        let s = snapshot();
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
