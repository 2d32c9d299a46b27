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

/// Bytes live at an instant under one module chain, by category.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleAt {
    /// [`chain_label`] of the chain.
    pub module: String,
    pub bytes: u64,
    pub categories: CategoryBytes,
}

/// The allocations live at `event` (active lifetime) grouped by module chain, biggest first,
/// each split by category (`categories`: one per allocation, in replay order, as
/// `StepAnalysis::categories` has them; missing ones count as unknown).
///
/// O(m + g log g): the live set (see [`DeviceTimeline::live_at`]), one hash lookup per member
/// (each stack's chain found once), the groups sorted.
pub fn modules_at(
    snapshot: &Snapshot,
    timeline: &DeviceTimeline,
    categories: &[Category],
    event: u32,
) -> Vec<ModuleAt> {
    let replay = timeline.replay();
    let mut keyer = ModuleKeyer::new(snapshot);
    let mut groups: HashMap<Arc<[FrameId]>, (u64, CategoryBytes)> = HashMap::default();
    for id in replay.live_at(event, Lifetime::Active) {
        let i = id.0 as usize;
        let a = &replay.allocations[i];
        let category = categories.get(i).copied().unwrap_or(Category::Unknown);
        let g = groups.entry(keyer.chain(a.stack)).or_default();
        g.0 = g.0.saturating_add(a.size);
        let slot = &mut g.1 .0[category as usize];
        *slot = slot.saturating_add(a.size);
    }
    let mut out: Vec<ModuleAt> = groups
        .into_iter()
        .map(|(chain, (bytes, categories))| ModuleAt {
            module: chain_label(snapshot, &chain),
            bytes,
            categories,
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.module.cmp(&b.module)));
    out
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
