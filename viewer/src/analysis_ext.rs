//! Queries the viewer needs that `memsnap-analysis` does not offer (yet). They are pure
//! functions over the snapshot and the analysis model, kept here (not in UI code) so they can
//! move into the analysis crate unchanged:
//!
//! * [`StackMatch`]: which stacks contain a function or file name (the search box).
//! * [`StackSites`]: the user-code site of every stack, once (band colours, labels).
//! * [`flame_tree`]: the live set at an instant as a frame tree (the flame graph).
//! * [`segment_blocks`]: each segment's live blocks at an instant, allocated or pending free.
//! * [`device_profile`]: `compare::profile` for one device whose timeline is already built
//!   (`compare::profile` rebuilds every timeline).

use std::collections::HashMap;

use memsnap_analysis::compare::DeviceProfile;
use memsnap_analysis::sites::{is_filtered_frame, top_frame};
use memsnap_analysis::summary::summarize_device;
use memsnap_analysis::{AllocId, DeviceTimeline, Instant, Lifetime};
use memsnap_analysis::{GroupBy, SiteKey, SummaryOptions};
use memsnap_format::{FrameId, Snapshot, StackId};

/// The user-code site ([`top_frame`]) of every stack of a snapshot, found once (on the loader
/// thread) so that colouring thousands of bands per frame does not walk their stacks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackSites {
    /// Indexed by `StackId`.
    by_stack: Vec<Option<FrameId>>,
}

impl StackSites {
    pub fn new(snapshot: &Snapshot) -> Self {
        let count = u32::try_from(snapshot.stacks.len()).unwrap_or(u32::MAX);
        StackSites {
            by_stack: (0..count)
                .map(|i| top_frame(snapshot, StackId(i)))
                .collect(),
        }
    }

    /// The site of a stack; `None` without a stack, for an empty one or an unknown id.
    pub fn site(&self, stack: Option<StackId>) -> Option<FrameId> {
        stack.and_then(|s| self.by_stack.get(s.0 as usize).copied().flatten())
    }

    /// `file:line:function` of the site, or why there is none.
    pub fn label(&self, snapshot: &Snapshot, stack: Option<StackId>) -> String {
        match (stack, self.site(stack)) {
            (None, _) => SiteKey::Unknown.label(snapshot),
            (Some(_), None) => "<no frames>".to_owned(),
            (Some(_), Some(frame)) => SiteKey::Frame(frame).label(snapshot),
        }
    }
}

/// The stacks whose frames mention a search text (function name or file path,
/// case-insensitive).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackMatch {
    pub query: String,
    /// Indexed by `StackId`.
    matches: Vec<bool>,
    pub matching_stacks: usize,
}

impl StackMatch {
    pub fn new(snapshot: &Snapshot, query: &str) -> Self {
        let needle = query.trim().to_lowercase();
        let frame_hits: Vec<bool> = snapshot
            .frames
            .iter()
            .map(|f| {
                f.name.to_lowercase().contains(&needle)
                    || f.filename.to_lowercase().contains(&needle)
            })
            .collect();
        let matches: Vec<bool> = snapshot
            .stacks
            .iter()
            .map(|(_, frames)| frames.iter().any(|f| frame_hits[f.0 as usize]))
            .collect();
        let matching_stacks = matches.iter().filter(|m| **m).count();
        StackMatch {
            query: query.to_owned(),
            matches,
            matching_stacks,
        }
    }

    /// Whether an allocation with this stack matches (no stack never matches).
    pub fn matches(&self, stack: Option<StackId>) -> bool {
        stack.is_some_and(|s| self.matches.get(s.0 as usize).copied().unwrap_or(false))
    }
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

/// The profile `memsnap diff` compares, from an already built timeline: the device summary
/// and the bytes per top-frame site (at the peak, and in total).
pub fn device_profile(snapshot: &Snapshot, timeline: &DeviceTimeline) -> DeviceProfile {
    let summary = summarize_device(snapshot, timeline, &SummaryOptions::default());
    let mut sites: HashMap<String, (u64, u64)> = HashMap::new();
    for s in timeline.top_sites(snapshot, GroupBy::Frame) {
        let e = sites.entry(s.key.label(snapshot)).or_default();
        e.0 = e.0.saturating_add(s.bytes_at_peak);
        e.1 = e.1.saturating_add(s.total_bytes);
    }
    DeviceProfile { summary, sites }
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
    fn search_matches_function_or_file_names_case_insensitively() {
        let s = snapshot();
        let by_function = StackMatch::new(&s, "LINEAR");
        assert_eq!(by_function.matching_stacks, 1);
        assert!(by_function.matches(Some(StackId(0))));
        assert!(!by_function.matches(Some(StackId(1))));
        assert!(!by_function.matches(None));
        assert_eq!(StackMatch::new(&s, "train.py").matching_stacks, 2);
        assert_eq!(StackMatch::new(&s, "nothing").matching_stacks, 0);
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
