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
pub use crate::sites::{
    chain_label, is_module_call_frame, module_chain, ModuleCall, ModuleKeyer, ModulePaths,
    MODULE_RANGE_PREFIX, NO_MODULE,
};
use crate::timeline::DeviceTimeline;

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
    let named = timeline.module_paths();
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
    /// (`None` for the root of what is outside every module, and for a named module path's
    /// segments).
    pub frame: Option<FrameId>,
    /// `file:line` of `frame`, a segment of a named module path (`GPT`, `blocks`, `3`,
    /// `attn`), or [`NO_MODULE`] for the root outside every module.
    pub label: String,
    /// [`chain_label`] of the whole path, or a named path's segments joined by ` > `.
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
/// tree of module paths (named ones, from [`ModulePaths`], as the outermost module call and
/// then the segments of the innermost's path: `GPT` > `blocks` > `3` > `attn`; the others
/// by their stack's chain): a root per outermost module call (and one, [`NO_MODULE`], for what
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
    let named = timeline.module_paths();
    #[derive(PartialEq, Eq, Hash)]
    enum Key<'a> {
        /// The outermost module call's path (when another), then the innermost's.
        Named(Option<&'a str>, &'a str),
        Chain(Arc<[FrameId]>),
    }
    let mut paths: HashMap<Key<'_>, (u64, u64)> = HashMap::default();
    for id in replay.live_at(event, lifetime) {
        let i = id.0 as usize;
        let a = &replay.allocations[i];
        if a.size < min_size {
            continue;
        }
        let key = match named.of(i) {
            Some(path) => Key::Named(named.outer_of(i).filter(|&outer| outer != path), path),
            None => Key::Chain(keyer.chain(a.stack)),
        };
        let g = paths.entry(key).or_default();
        g.0 = g.0.saturating_add(a.size);
        g.1 += 1;
    }
    /// One step down a path: a frame of a chain, a segment of a named module path, or the
    /// root of what is outside every module.
    #[derive(Clone, PartialEq, Eq, Hash)]
    enum Step<'a> {
        Outside,
        Frame(FrameId),
        Name(&'a str),
    }
    // An arena of nodes (0: a virtual root), each with its children by step.
    struct Slot<'a> {
        step: Step<'a>,
        bytes: u64,
        own_bytes: u64,
        count: u64,
        children: HashMap<Step<'a>, usize>,
    }
    let slot = |step| Slot {
        step,
        bytes: 0,
        own_bytes: 0,
        count: 0,
        children: HashMap::default(),
    };
    let mut arena = vec![slot(Step::Outside)];
    for (key, (bytes, count)) in &paths {
        let steps: Vec<Step<'_>> = match key {
            // Under the model's call: `GPT` > `blocks` > `0` > `attn`.
            Key::Named(outer, path) => outer
                .iter()
                .copied()
                .chain(path.split('.'))
                .take(MAX_TREE_DEPTH)
                .map(Step::Name)
                .collect(),
            // The empty chain is the root of what is outside every module.
            Key::Chain(chain) if chain.is_empty() => vec![Step::Outside],
            Key::Chain(chain) => chain
                .iter()
                .take(MAX_TREE_DEPTH)
                .map(|&f| Step::Frame(f))
                .collect(),
        };
        let mut at = 0;
        for step in steps {
            let next = match arena[at].children.get(&step) {
                Some(&i) => i,
                None => {
                    arena.push(slot(step.clone()));
                    let i = arena.len() - 1;
                    arena[at].children.insert(step, i);
                    i
                }
            };
            at = next;
            arena[at].bytes = arena[at].bytes.saturating_add(*bytes);
            arena[at].count += count;
        }
        arena[at].own_bytes = arena[at].own_bytes.saturating_add(*bytes);
    }
    fn build(
        snapshot: &Snapshot,
        arena: &[Slot<'_>],
        i: usize,
        frames: &[FrameId],
        names: &[&str],
    ) -> Vec<ModuleNode> {
        let mut out: Vec<ModuleNode> = arena[i]
            .children
            .values()
            .map(|&c| {
                let s = &arena[c];
                let (mut frames, mut names) = (frames.to_vec(), names.to_vec());
                let (frame, label, path) = match s.step {
                    Step::Outside => (None, NO_MODULE.to_owned(), NO_MODULE.to_owned()),
                    Step::Frame(f) => {
                        frames.push(f);
                        (
                            Some(f),
                            chain_label(snapshot, &[f]),
                            chain_label(snapshot, &frames),
                        )
                    }
                    Step::Name(name) => {
                        names.push(name);
                        (None, name.to_owned(), names.join(" > "))
                    }
                };
                ModuleNode {
                    frame,
                    label,
                    path,
                    bytes: s.bytes,
                    own_bytes: s.own_bytes,
                    count: s.count,
                    children: build(snapshot, arena, c, &frames, &names),
                }
            })
            .collect();
        out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.label.cmp(&b.label)));
        out
    }
    build(snapshot, &arena, 0, &[], &[])
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
