//! Memory by module: which `nn.Module` call made each allocation, read from the Python frames of
//! its stack.
//!
//! PyTorch calls a module's `forward` through `nn.Module.__call__`, which shows in every
//! recorded stack as `torch/nn/modules/module.py` frames (`_wrapped_call_impl`, `_call_impl`,
//! `__call__` before 2.0) directly outside the `forward` it entered. A stack's **module chain**
//! is the user's own Python frames (not PyTorch's package, [`crate::sites::is_torch_python_frame`]) that such
//! a call entered, outermost first: for a GPT block's attention,
//! `model.py:245 forward` (the model's forward, at the line calling the block) →
//! `model.py:54 forward` (the block's forward, at the line calling attention) → `attention.py:77
//! forward` (where attention allocated). PyTorch's own modules (`nn.Linear`) are leaves inside the
//! user's module and are not part of the chain. Wrappers between `__call__` and `forward`
//! (`torch.compile`'s `compile_wrapper`, hooks) are skipped, because only the innermost Python
//! frame outside a user frame decides.
//!
//! Each chain is also a path in the **module tree**: its prefixes are the enclosing module
//! calls. A prefix ending at a frame names "what the module at that line calls", so the prefix
//! `[model.py:245]` is every block the model's loop calls, and a fix (activation checkpointing)
//! can be aimed at it. Without module names (PyTorch records none), a chain is labelled by its
//! frames' `file:line`, joined with ` > `.
//!
//! **Named modules.** `memsnap.torch.enable(modules=True)` records a `record_function`-like
//! range named `memsnap.module: PATH` around every module call's forward, PATH as
//! `model.named_modules()` names it (`blocks.3.attn`). Where those ranges exist,
//! [`ModulePaths`] gives each allocation the innermost one open when it was made, and
//! [`modules_at`] (the summary's memory by module) groups by that path instead of the stack's
//! chain; allocations made outside every module range keep their chain.
//!
//! Complexity: [`module_chain`] is O(d) in the stack's frames (one pass from the outermost
//! frame inward); [`ModuleKeyer`] asks once per distinct stack. Those two, like a stack's site,
//! are [`crate::sites`]' (re-exported here): the sites key allocations by module chain
//! (`top --by module`), and this module's [`modules_at`] needs the timeline, which needs the
//! sites, so the chain lives below both.

use foldhash::HashMap;
use std::sync::Arc;

use memsnap_format::{FrameId, Snapshot};

use crate::categories::{Category, CategoryBytes};
use crate::replay::Lifetime;
pub use crate::sites::{chain_label, is_module_call_frame, module_chain, ModuleKeyer, NO_MODULE};
use crate::timeline::DeviceTimeline;

/// The prefix of the annotation ranges `memsnap.torch.enable(modules=True)` records around
/// each module call (`memsnap.module: blocks.3.attn`). They are never phase evidence.
pub const MODULE_RANGE_PREFIX: &str = "memsnap.module: ";

/// Each allocation's innermost named module range (see the module docs), from the device's
/// `memsnap.module: PATH` ranges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModulePaths {
    /// The distinct paths.
    pub paths: Vec<String>,
    /// Per allocation (replay order): an index into `paths`, or `u32::MAX` for none.
    of_allocation: Vec<u32>,
}

impl ModulePaths {
    /// O((n + r) + r log r) for n allocations and r ranges (both are usually in order
    /// already): a sweep over the allocations by event with a stack of the ranges open.
    /// A range without a START (it began before the window) opens at the first event, one
    /// without an END stays open to the last.
    pub fn build(timeline: &DeviceTimeline) -> ModulePaths {
        let mut index: HashMap<&str, u32> = HashMap::default();
        let mut paths = Vec::new();
        // (start, end, path) of each module range, by start.
        let mut ranges: Vec<(u32, u32, u32)> = Vec::new();
        for r in timeline.named_ranges() {
            let Some(path) = r.name.strip_prefix(MODULE_RANGE_PREFIX) else {
                continue;
            };
            let start = match (r.start_time_us, r.start_event) {
                (None, _) => 0,
                (Some(_), Some(start)) => start,
                // Started after every event (or the trace has no times): holds none.
                (Some(_), None) => continue,
            };
            let end = match (r.end_time_us, r.end_event) {
                (None, _) => u32::MAX,
                (Some(_), Some(end)) => end,
                // Ended before every event: holds none.
                (Some(_), None) => continue,
            };
            if end < start {
                continue;
            }
            let id = *index.entry(path).or_insert_with(|| {
                paths.push(path.to_owned());
                (paths.len() - 1) as u32
            });
            ranges.push((start, end, id));
        }
        if ranges.is_empty() {
            return ModulePaths::default();
        }
        let replay = timeline.replay();
        let mut of_allocation = vec![u32::MAX; replay.allocations.len()];
        if !ranges.is_sorted_by_key(|r| r.0) {
            // Outer first among ranges starting at one event (the longer one).
            ranges.sort_by_key(|r| (r.0, std::cmp::Reverse(r.1)));
        }
        let mut made: Vec<(u32, usize)> = replay
            .allocations
            .iter()
            .enumerate()
            .filter_map(|(i, a)| Some((a.alloc_event()?, i)))
            .collect();
        if !made.is_sorted() {
            made.sort_unstable();
        }
        let mut open: Vec<(u32, u32)> = Vec::new();
        let mut next = 0;
        for (event, i) in made {
            while let Some(&(start, end, id)) = ranges.get(next) {
                if start > event {
                    break;
                }
                open.push((end, id));
                next += 1;
            }
            while open.last().is_some_and(|&(end, _)| end < event) {
                open.pop();
            }
            if let Some(&(_, id)) = open.last() {
                of_allocation[i] = id;
            }
        }
        ModulePaths {
            paths,
            of_allocation,
        }
    }

    /// Whether the device has module ranges at all.
    pub fn is_empty(&self) -> bool {
        self.of_allocation.is_empty()
    }

    /// The path of allocation `index`'s innermost module range, if it was made in one.
    pub fn of(&self, index: usize) -> Option<&str> {
        let id = *self.of_allocation.get(index)?;
        self.paths.get(id as usize).map(String::as_str)
    }
}

/// Bytes live at an instant under one module chain, by category.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleAt {
    /// [`chain_label`] of the chain.
    pub module: String,
    pub bytes: u64,
    pub categories: CategoryBytes,
}

/// The allocations live at `event` (active lifetime) grouped by module, biggest first, each
/// split by category (`categories`: one per allocation, in replay order, as
/// `StepAnalysis::categories` has them; missing ones count as unknown). The module is the
/// named module range the allocation was made in, where the run recorded them
/// ([`ModulePaths`]), else its stack's module chain.
///
/// O(m + g log g), plus [`ModulePaths::build`] when the device has module ranges: the live
/// set (see [`DeviceTimeline::live_at`]), one hash lookup per member (each stack's chain found
/// once), the groups sorted.
pub fn modules_at(
    snapshot: &Snapshot,
    timeline: &DeviceTimeline,
    categories: &[Category],
    event: u32,
) -> Vec<ModuleAt> {
    let replay = timeline.replay();
    let mut keyer = ModuleKeyer::new(snapshot);
    let named = ModulePaths::build(timeline);
    #[derive(PartialEq, Eq, Hash)]
    enum Key<'a> {
        Named(&'a str),
        Chain(Arc<[FrameId]>),
    }
    let mut groups: HashMap<Key<'_>, (u64, CategoryBytes)> = HashMap::default();
    for id in replay.live_at(event, Lifetime::Active) {
        let i = id.0 as usize;
        let a = &replay.allocations[i];
        let category = categories.get(i).copied().unwrap_or(Category::Unknown);
        let key = match named.of(i) {
            Some(path) => Key::Named(path),
            None => Key::Chain(keyer.chain(a.stack)),
        };
        let g = groups.entry(key).or_default();
        g.0 = g.0.saturating_add(a.size);
        let slot = &mut g.1 .0[category as usize];
        *slot = slot.saturating_add(a.size);
    }
    let mut out: Vec<ModuleAt> = groups
        .into_iter()
        .map(|(key, (bytes, categories))| ModuleAt {
            module: match key {
                Key::Named(path) => path.to_owned(),
                Key::Chain(chain) => chain_label(snapshot, &chain),
            },
            bytes,
            categories,
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.module.cmp(&b.module)));
    out
}

/// One node of the module tree at an instant: a module path (a chain prefix, see the module
/// docs) and what is live under it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleNode {
    /// The frame this node adds to its parent's path: the line the module's code was at
    /// (`None` for the root of what is outside every module).
    pub frame: Option<FrameId>,
    /// `file:line` of `frame` ([`NO_MODULE`] for the root outside every module).
    pub label: String,
    /// [`chain_label`] of the whole path.
    pub path: String,
    /// Bytes live under the path (its own and its children's).
    pub bytes: u64,
    /// Bytes of the allocations whose path ends here.
    pub own_bytes: u64,
    /// Allocations live under the path.
    pub count: u64,
    /// The calls inside it, largest first.
    pub children: Vec<ModuleNode>,
}

/// Deepest module path the tree keeps: the calls nested deeper count as the node at this depth
/// (real models nest a few dozen; a file with thousands must not exhaust the stack).
pub const MAX_TREE_DEPTH: usize = 64;

/// The allocations live at `event` (`lifetime`; those smaller than `min_size` left out) as a
/// tree of module paths: a root per outermost module call (and one, [`NO_MODULE`], for what
/// is outside every module), each node's children the calls inside it, largest first (ties by
/// label), at most [`MAX_TREE_DEPTH`] deep. A node's `bytes` is its own plus its children's.
///
/// O(m + g·d + k log k): the live set (see [`DeviceTimeline::live_at`]), one hash lookup per
/// member (each stack's chain found once), each of the g distinct paths walked once down its d
/// frames, the k nodes sorted.
pub fn module_tree_at(
    snapshot: &Snapshot,
    timeline: &DeviceTimeline,
    event: u32,
    lifetime: Lifetime,
    min_size: u64,
) -> Vec<ModuleNode> {
    let replay = timeline.replay();
    let mut keyer = ModuleKeyer::new(snapshot);
    let mut paths: HashMap<Arc<[FrameId]>, (u64, u64)> = HashMap::default();
    for id in replay.live_at(event, lifetime) {
        let a = &replay.allocations[id.0 as usize];
        if a.size < min_size {
            continue;
        }
        let g = paths.entry(keyer.chain(a.stack)).or_default();
        g.0 = g.0.saturating_add(a.size);
        g.1 += 1;
    }
    // An arena of nodes (0: a virtual root), each with its children by frame.
    struct Slot {
        frame: Option<FrameId>,
        bytes: u64,
        own_bytes: u64,
        count: u64,
        children: HashMap<Option<FrameId>, usize>,
    }
    let slot = |frame| Slot {
        frame,
        bytes: 0,
        own_bytes: 0,
        count: 0,
        children: HashMap::default(),
    };
    let mut arena = vec![slot(None)];
    for (chain, (bytes, count)) in &paths {
        // The empty path is the root of what is outside every module.
        let steps: Vec<Option<FrameId>> = if chain.is_empty() {
            vec![None]
        } else {
            chain
                .iter()
                .take(MAX_TREE_DEPTH)
                .map(|&f| Some(f))
                .collect()
        };
        let mut at = 0;
        for frame in steps {
            let next = match arena[at].children.get(&frame) {
                Some(&i) => i,
                None => {
                    arena.push(slot(frame));
                    let i = arena.len() - 1;
                    arena[at].children.insert(frame, i);
                    i
                }
            };
            at = next;
            arena[at].bytes = arena[at].bytes.saturating_add(*bytes);
            arena[at].count += count;
        }
        arena[at].own_bytes = arena[at].own_bytes.saturating_add(*bytes);
    }
    fn build(snapshot: &Snapshot, arena: &[Slot], i: usize, parent: &[FrameId]) -> Vec<ModuleNode> {
        let mut out: Vec<ModuleNode> = arena[i]
            .children
            .values()
            .map(|&c| {
                let s = &arena[c];
                let mut path = parent.to_vec();
                path.extend(s.frame);
                ModuleNode {
                    frame: s.frame,
                    label: match s.frame {
                        Some(f) => chain_label(snapshot, &[f]),
                        None => NO_MODULE.to_owned(),
                    },
                    path: chain_label(snapshot, &path),
                    bytes: s.bytes,
                    own_bytes: s.own_bytes,
                    count: s.count,
                    children: build(snapshot, arena, c, &path),
                }
            })
            .collect();
        out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.label.cmp(&b.label)));
        out
    }
    build(snapshot, &arena, 0, &[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_format::Frame;
    use memsnap_format::StackId;

    fn snapshot_with(frames: Vec<Frame>) -> (Snapshot, StackId) {
        let mut s = Snapshot::new(1);
        let ids: Vec<FrameId> = frames.into_iter().map(|f| s.frames.intern(f)).collect();
        let stack = s.stacks.intern(&ids);
        (s, stack)
    }

    const MODULE: &str = "/venv/site-packages/torch/nn/modules/module.py";

    #[test]
    fn a_chain_is_the_user_forwards_that_module_calls_entered_outermost_first() {
        let (s, stack) = snapshot_with(vec![
            Frame::new("c10::malloc", "??", 0),
            Frame::new(
                "forward",
                "/venv/site-packages/torch/nn/modules/linear.py",
                125,
            ),
            Frame::new("_call_impl", MODULE, 1790),
            Frame::new("_wrapped_call_impl", MODULE, 1779),
            Frame::new("forward", "/p/attention.py", 77),
            Frame::new("_call_impl", MODULE, 1790),
            Frame::new(
                "compile_wrapper",
                "/venv/site-packages/torch/_dynamo/eval_frame.py",
                9,
            ),
            Frame::new("_wrapped_call_impl", MODULE, 1779),
            Frame::new("helper", "/p/model.py", 54),
            Frame::new("forward", "/p/model.py", 300),
            Frame::new("_call_impl", MODULE, 1790),
            Frame::new("forward", "/p/model.py", 245),
            Frame::new("_call_impl", MODULE, 1790),
            Frame::new("train_step", "/p/train.py", 88),
            Frame::new("<module>", "/p/train.py", 1),
        ]);
        let chain = module_chain(&s, stack);
        // `model.py:300` is the frame `_call_impl` entered (the block's forward); `model.py:54`
        // is a plain function it called, not a module, and PyTorch's `compile_wrapper`
        // between `__call__` and attention's forward is skipped.
        assert_eq!(
            chain_label(&s, &chain),
            "model.py:245 > model.py:300 > attention.py:77"
        );
    }

    #[test]
    fn the_module_tree_at_an_instant_adds_up_and_lists_the_largest_first() {
        let (snapshot, _) = memsnap_workload::generate(&memsnap_workload::TrainingRun {
            steps: 2,
            layers: 3,
            activations_per_layer: 3,
            ordered_forward_stacks: true,
            ..Default::default()
        });
        let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
        let peak = timeline.peak(crate::CurveKind::Active).event;
        let replay = timeline.replay();
        let live: u64 = replay
            .live_at(peak, Lifetime::Active)
            .iter()
            .map(|id| replay.allocations[id.0 as usize].size)
            .sum();
        let tree = module_tree_at(&snapshot, &timeline, peak, Lifetime::Active, 0);
        assert_eq!(tree.iter().map(|n| n.bytes).sum::<u64>(), live);
        // The parameters and the optimizer are outside every module; the model's loop over
        // its blocks is a root with the blocks' lines inside.
        assert!(tree
            .iter()
            .any(|n| n.label == NO_MODULE && n.frame.is_none()));
        let blocks = tree
            .iter()
            .find(|n| n.label == "model.py:212")
            .expect("the model's loop");
        assert!(!blocks.children.is_empty());
        assert!(blocks.children[0].path.starts_with("model.py:212 > "));
        fn check(nodes: &[ModuleNode]) {
            assert!(nodes.windows(2).all(|w| w[0].bytes >= w[1].bytes));
            for n in nodes {
                let children: u64 = n.children.iter().map(|c| c.bytes).sum();
                assert_eq!(n.bytes, n.own_bytes + children, "{}", n.path);
                assert!(n.count >= n.children.iter().map(|c| c.count).sum::<u64>());
                check(&n.children);
            }
        }
        check(&tree);
        // The size filter leaves the small ones out.
        let big = module_tree_at(&snapshot, &timeline, peak, Lifetime::Active, 1 << 20);
        assert!(big.iter().map(|n| n.bytes).sum::<u64>() < live);
        // Before anything is allocated, nothing is live.
        assert!(module_tree_at(&snapshot, &timeline, 0, Lifetime::Active, 0)
            .iter()
            .all(|n| n.bytes <= live));
    }

    #[test]
    fn a_module_tree_deeper_than_its_limit_is_cut_there() {
        let mut frames = vec![Frame::new("c10::malloc", "??", 0)];
        for depth in 0..(MAX_TREE_DEPTH as u32 + 40) {
            frames.push(Frame::new("forward", "/p/deep.py", 1000 - depth));
            frames.push(Frame::new("_call_impl", MODULE, 1790));
        }
        let (mut s, stack) = snapshot_with(frames);
        let mut entry =
            memsnap_format::TraceEntry::new(memsnap_format::Action::Alloc, 0x1000, 512, 0);
        entry.frames = Some(stack);
        s.device_traces.as_mut().unwrap()[0].push(entry);
        let timeline = DeviceTimeline::build(&s, 0).unwrap();
        let tree = module_tree_at(&s, &timeline, 0, Lifetime::Active, 0);
        let mut depth = 0;
        let mut level = &tree;
        while let Some(n) = level.first() {
            assert_eq!(n.bytes, 512);
            depth += 1;
            level = &n.children;
        }
        assert_eq!(depth, MAX_TREE_DEPTH);
    }

    #[test]
    fn a_stack_outside_every_module_has_an_empty_chain() {
        let (s, stack) = snapshot_with(vec![
            Frame::new("step", "/venv/site-packages/torch/optim/adam.py", 247),
            Frame::new("train_step", "/p/train.py", 95),
        ]);
        assert!(module_chain(&s, stack).is_empty());
        assert_eq!(chain_label(&s, &[]), NO_MODULE);
    }

    #[test]
    fn windows_paths_are_read_as_module_calls() {
        let (s, stack) = snapshot_with(vec![
            Frame::new("forward", "D:\\p\\model.py", 54),
            Frame::new(
                "_call_impl",
                "D:\\venv\\Lib\\site-packages\\torch\\nn\\modules\\module.py",
                1790,
            ),
            Frame::new("<module>", "D:\\p\\bench.py", 65),
        ]);
        assert_eq!(chain_label(&s, &module_chain(&s, stack)), "model.py:54");
    }
}
