//! Allocation sites: grouping allocations by stack, by top frame or by file.
//!
//! The **site** of a stack ([`top_frame`]) is its innermost frame that is the user's code: the
//! unwinder, the caching allocator, `c10::`/`at::` dispatch and CPython's eval loop are
//! skipped, the innermost Python frame outside PyTorch's own package wins (code Inductor
//! generated counts as PyTorch's: the frame after it maps it back to the user's source), else
//! the innermost native frame outside that machinery (an autograd node such as
//! `MmBackward0::apply` on the autograd thread, or the user's own C++/Rust function). The full
//! stack stays with the allocation.

use foldhash::HashMap;
use std::sync::Arc;

use memsnap_format::{Frame, FrameId, Snapshot, StackId};

use crate::ranges::NamedRange;
use crate::replay::Replay;
use serde::Serialize;

/// How to group allocations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum GroupBy {
    /// The whole stack.
    #[default]
    Stack,
    /// The top frame (see the module docs).
    Frame,
    /// The top frame's file.
    File,
    /// The module call chain ([`module_chain`]): the user `forward`s that
    /// `nn.Module.__call__` entered.
    Module,
}

/// A group of allocations.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum SiteKey {
    Stack(StackId),
    Frame(FrameId),
    /// A file name as the frame has it.
    File(String),
    /// A module call chain, outermost first (empty: outside every module).
    Module(Vec<FrameId>),
    /// The innermost `memsnap.module: PATH` range the allocation was made in
    /// ([`ModulePaths`]; by module, when the run recorded them).
    ModulePath(String),
    /// No stack was recorded.
    Unknown,
    /// Allocated before the recording began (live in the final segments, or freed in the
    /// window) and without a stack: the model's weights, typically.
    BeforeWindow,
    /// Memory an imported trace's source counted but could not attribute to any block
    /// ([`crate::Origin::Unattributed`]): no address, no stack.
    Unattributed,
}

impl SiteKey {
    /// A one-line label: `file:line:function` of the top frame (for stacks, followed by the
    /// number of frames), the file name, `<no stack>`, or for memory from before the recording
    /// without a stack `<allocated before the recording (no stack)>`. O(1); O(d) in the
    /// stack's frames for [`SiteKey::Stack`].
    pub fn label(&self, snapshot: &Snapshot) -> String {
        match self {
            SiteKey::Stack(id) => match top_frame(snapshot, *id) {
                Some(f) => format!("{}", FrameLabel(snapshot.frames.get(f))),
                None => "<no frames>".to_string(),
            },
            SiteKey::Frame(f) => format!("{}", FrameLabel(snapshot.frames.get(*f))),
            SiteKey::File(name) => name.clone(),
            SiteKey::Module(chain) => chain_label(snapshot, chain),
            SiteKey::ModulePath(path) => path.clone(),
            SiteKey::Unknown => "<no stack>".to_string(),
            SiteKey::BeforeWindow => "<allocated before the recording (no stack)>".to_string(),
            SiteKey::Unattributed => "<before the profile, unattributed>".to_string(),
        }
    }
}

struct FrameLabel<'a>(&'a Frame);

impl std::fmt::Display for FrameLabel<'_> {
    /// `file:line:function`; native frames without a source file show the symbol alone,
    /// without its argument list.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let frame = self.0;
        if frame.filename.ends_with(".py") {
            return write!(f, "{}:{}:{}", frame.basename(), frame.line, frame.name);
        }
        let name = symbol_without_arguments(&frame.name);
        match frame.basename() {
            "" | "??" => f.write_str(name),
            file => write!(f, "{file}:{}:{name}", frame.line),
        }
    }
}

/// `ns::f(int, long) const` -> `ns::f` (the argument list starts at the first `(` outside
/// template brackets; `(anonymous namespace)` is kept).
pub fn symbol_without_arguments(name: &str) -> &str {
    let mut depth = 0i32;
    for (i, c) in name.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '(' if depth == 0 && !name[i..].starts_with("(anonymous namespace)") && i > 0 => {
                return &name[..i];
            }
            _ => {}
        }
    }
    name
}

/// Frames PyTorch's viewers hide (format spec §6.5).
pub fn is_filtered_frame(frame: &Frame) -> bool {
    const NAMES: [&str; 8] = [
        "unwind::unwind",
        "CapturedTraceback::gather",
        "gather_with_cpp",
        "_start",
        "__libc_start_main",
        "PyEval_",
        "PyObject_",
        "PyFunction_",
    ];
    const FILES: [&str; 10] = [
        "core/boxing",
        "/Register",
        "/Redispatch",
        "pythonrun.c",
        "Modules/main.c",
        "Objects/call.c",
        "Objects/methodobject.c",
        "pycore_ceval.h",
        "ceval.c",
        "cpython/abstract.h",
    ];
    NAMES.iter().any(|n| frame.name.contains(n)) || FILES.iter().any(|n| frame.filename.contains(n))
}

/// Machinery that is never the user's code: the unwinder, the caching allocator (PyTorch's, or
/// memsnap's C ABI and its out-of-memory shim, `memsnap_*`), `c10::` and
/// `at::` dispatch, autograd's dispatch and engine plumbing, pybind glue, CPython's eval loop
/// and C-API, libc's thread and process entry points.
pub fn is_internal_frame(frame: &Frame) -> bool {
    const PREFIXES: [&str; 24] = [
        "c10::",
        "memsnap_",
        "at::",
        "void c10::",
        "void at::",
        "std::",
        "torch::unwind",
        "torch::CapturedTraceback",
        "torch::cuda::",
        "torch::autograd::VariableType",
        "torch::autograd::Node::operator()",
        "torch::autograd::impl::",
        "torch::autograd::Engine::",
        "torch::autograd::python::",
        "torch::ADInplaceOrView",
        "torch::autograd::THP",
        "torch::autograd::utils::",
        "pybind11::",
        "THP",
        "_Py",
        "Py",
        "__",
        "start_thread",
        "execute_native_thread_routine",
    ];
    const CONTAINS: [&str; 3] = [
        "CUDACachingAllocator",
        "gather_with_cpp",
        "method_vectorcall",
    ];
    let name = frame.name.as_str();
    is_filtered_frame(frame)
        || PREFIXES.iter().any(|p| name.starts_with(p))
        || CONTAINS.iter().any(|c| name.contains(c))
        || matches!(
            name,
            "main" | "_start" | "clone" | "clone3" | "cfunction_call" | "slot_tp_call" | ""
        )
}

/// Whether a Python frame belongs to PyTorch itself (its installed package, a source checkout,
/// or code Inductor generated), not to the user.
pub fn is_torch_python_frame(frame: &Frame) -> bool {
    let path = frame.filename.replace('\\', "/");
    path.starts_with("torch/")
        || path.contains("-packages/torch/")
        || path.contains("/pytorch/torch/")
        || path.contains("/torchinductor_")
        || is_generated_module(&path)
}

/// Inductor's generated modules are named by a 52-character base32 hash (`c2ab….py`).
fn is_generated_module(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.strip_suffix(".py").is_some_and(|stem| {
        stem.len() >= 50
            && stem
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    })
}

fn is_python(frame: &Frame) -> bool {
    frame.filename.ends_with(".py")
}

/// The site of a stack: its innermost frame that is the user's code; `None` for an empty
/// stack or one of synthetic frames only ([`memsnap_format::Frame::is_synthetic`]).
///
/// The innermost Python frame outside PyTorch's own package wins; else the innermost native
/// (C++ or Rust) frame outside the machinery ([`is_internal_frame`]), such as an autograd node
/// (`torch::autograd::generated::MmBackward0::apply`) or the user's own function; else (a
/// stack of machinery only) the outermost `at::_ops::…` call, the op its caller ran; else the
/// innermost frame PyTorch's viewers show that is not the allocator or the unwinder; else the
/// innermost frame.
///
/// O(d) in the stack's frames (string tests on each, a few passes): callers that ask per
/// allocation go through [`SiteKeyer`], which asks once per stack.
pub fn top_frame(snapshot: &Snapshot, stack: StackId) -> Option<FrameId> {
    if stack.index() >= snapshot.stacks.len() {
        return None;
    }
    let ids: Vec<FrameId> = snapshot
        .stacks
        .get(stack)
        .iter()
        .copied()
        // Frames an import made up are never the user's code.
        .filter(|f| f.index() < snapshot.frames.len() && !snapshot.frames.get(*f).is_synthetic())
        .collect();
    let frame = |f: &FrameId| snapshot.frames.get(*f);
    ids.iter()
        .find(|f| is_python(frame(f)) && !is_torch_python_frame(frame(f)))
        .or_else(|| {
            ids.iter()
                .find(|f| !is_python(frame(f)) && !is_internal_frame(frame(f)))
        })
        // All machinery (an op the autograd engine called): the op, as the caller called it.
        .or_else(|| {
            ids.iter()
                .rev()
                .find(|f| frame(f).name.starts_with("at::_ops::"))
        })
        .or_else(|| {
            ids.iter().find(|f| {
                let fr = frame(f);
                !is_filtered_frame(fr)
                    && !fr.name.contains("CachingAllocator")
                    && !fr.name.contains("torch::unwind")
            })
        })
        .or_else(|| ids.first())
        .copied()
}

/// Maps stacks to site keys, caching the top frame of each stack: O(1) amortized a lookup,
/// [`top_frame`] once per distinct stack.
pub struct SiteKeyer<'a> {
    snapshot: &'a Snapshot,
    by: GroupBy,
    cache: HashMap<StackId, SiteKey>,
}

impl<'a> SiteKeyer<'a> {
    pub fn new(snapshot: &'a Snapshot, by: GroupBy) -> Self {
        SiteKeyer {
            snapshot,
            by,
            cache: HashMap::default(),
        }
    }

    /// The site of an allocation: its stack's site, or [`SiteKey::BeforeWindow`] when it has no
    /// frames and predates the recorded window.
    pub fn key_of(&mut self, allocation: &crate::replay::Allocation) -> SiteKey {
        if allocation.origin == crate::replay::Origin::Unattributed {
            return SiteKey::Unattributed;
        }
        let key = self.key(allocation.stack);
        let no_frames = match &key {
            SiteKey::Unknown => true,
            SiteKey::Stack(id) => {
                id.index() < self.snapshot.stacks.len() && self.snapshot.stacks.get(*id).is_empty()
            }
            _ => false,
        };
        if no_frames && allocation.before_window() {
            SiteKey::BeforeWindow
        } else {
            key
        }
    }

    pub fn key(&mut self, stack: Option<StackId>) -> SiteKey {
        let Some(stack) = stack else {
            return SiteKey::Unknown;
        };
        if let Some(k) = self.cache.get(&stack) {
            return k.clone();
        }
        let key = match self.by {
            GroupBy::Stack => SiteKey::Stack(stack),
            GroupBy::Frame => {
                top_frame(self.snapshot, stack).map_or(SiteKey::Unknown, SiteKey::Frame)
            }
            GroupBy::File => top_frame(self.snapshot, stack).map_or(SiteKey::Unknown, |f| {
                SiteKey::File(self.snapshot.frames.get(f).filename.clone())
            }),
            GroupBy::Module => SiteKey::Module(module_chain(self.snapshot, stack)),
        };
        self.cache.insert(stack, key.clone());
        key
    }
}

/// The prefix of the annotation ranges `memsnap.torch.enable(modules=True)` records around
/// each module call (`memsnap.module: blocks.3.attn`). They are never phase evidence.
pub const MODULE_RANGE_PREFIX: &str = "memsnap.module: ";

/// Each allocation's innermost named module range (see [`crate::modules`]), from the device's
/// `memsnap.module: PATH` ranges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModulePaths {
    /// The distinct paths.
    pub paths: Vec<String>,
    /// Per allocation (replay order): an index into `paths`, or `u32::MAX` for none.
    of_allocation: Vec<u32>,
    /// Per allocation: the outermost module range open when it was made (the model's call).
    outer_of_allocation: Vec<u32>,
    /// Every module range, by start (outer first among ranges starting at one event).
    calls: Vec<ModuleCall>,
}

/// One module call: a `memsnap.module: PATH` range, by the events it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleCall {
    /// First event at or after its START (0 when the START is not in the window).
    pub start_event: u32,
    /// Last event at or before its END (`u32::MAX` when it had not ended).
    pub end_event: u32,
    /// Index into [`ModulePaths::paths`].
    pub path: u32,
}

impl ModulePaths {
    /// O((n + r) + r log r) for n allocations and r ranges (both are usually in order
    /// already): a sweep over the allocations by event with a stack of the ranges open.
    /// A range without a START (it began before the window) opens at the first event, one
    /// without an END stays open to the last.
    pub fn build(named_ranges: &[NamedRange], replay: &Replay) -> ModulePaths {
        let mut index: HashMap<&str, u32> = HashMap::default();
        let mut paths = Vec::new();
        // (start, end, path) of each module range, by start.
        let mut ranges: Vec<(u32, u32, u32)> = Vec::new();
        for r in named_ranges {
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
        let mut of_allocation = vec![u32::MAX; replay.allocations.len()];
        let mut outer_of_allocation = vec![u32::MAX; replay.allocations.len()];
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
                // Ranges that ended before this one began hold neither it nor what follows
                // (nested ranges: they are the top of the stack).
                while open.last().is_some_and(|&(open_end, _)| open_end < start) {
                    open.pop();
                }
                open.push((end, id));
                next += 1;
            }
            while open.last().is_some_and(|&(end, _)| end < event) {
                open.pop();
            }
            // Nested ranges: when the innermost open one holds the event, so do those under it.
            if let (Some(&(_, inner)), Some(&(_, outer))) = (open.last(), open.first()) {
                of_allocation[i] = inner;
                outer_of_allocation[i] = outer;
            }
        }
        ModulePaths {
            paths,
            of_allocation,
            outer_of_allocation,
            calls: ranges
                .into_iter()
                .map(|(start_event, end_event, path)| ModuleCall {
                    start_event,
                    end_event,
                    path,
                })
                .collect(),
        }
    }

    /// Every module call (range), by start event: what a fix aimed at a named module
    /// (checkpointing `blocks.0` to `blocks.2`) finds its calls among.
    pub fn calls(&self) -> &[ModuleCall] {
        &self.calls
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

    /// The path of the outermost module range open when allocation `index` was made (the
    /// model's own call, named by its class: `GPT`), if it was made in one.
    pub fn outer_of(&self, index: usize) -> Option<&str> {
        let id = *self.outer_of_allocation.get(index)?;
        self.paths.get(id as usize).map(String::as_str)
    }
}

// Module chains (see `crate::modules` for what they mean).

/// The label of an allocation made outside every user module (the loss function called from
/// the training loop, the optimizer, the set-up).
pub const NO_MODULE: &str = "<no module>";

/// Whether `frame` is `nn.Module.__call__`'s own machinery (`_call_impl`,
/// `_wrapped_call_impl`, or `__call__` before PyTorch 2.0) in `torch/nn/modules/module.py`,
/// under either path separator.
pub fn is_module_call_frame(frame: &Frame) -> bool {
    let path = frame.filename.as_str();
    (path.ends_with("nn/modules/module.py") || path.ends_with("nn\\modules\\module.py"))
        && matches!(
            frame.name.as_str(),
            "_call_impl" | "_wrapped_call_impl" | "__call__"
        )
}

/// The module chain of `stack`, outermost first (see [`crate::modules`]): the user's Python frames
/// whose next Python frame outward is `nn.Module.__call__` machinery. Empty for a stack without
/// such frames (native-only stacks, the autograd thread, the optimizer) or an unknown id.
///
/// O(d) in the stack's frames: one pass from the outermost frame inward, remembering whether
/// the last Python frame seen was a module call.
pub fn module_chain(snapshot: &Snapshot, stack: StackId) -> Vec<FrameId> {
    if stack.index() >= snapshot.stacks.len() {
        return Vec::new();
    }
    let mut chain = Vec::new();
    let mut entered = false;
    // Stacks are innermost first; walk them outermost first.
    for &id in snapshot.stacks.get(stack).iter().rev() {
        if id.index() >= snapshot.frames.len() {
            continue;
        }
        let frame = snapshot.frames.get(id);
        if !is_python(frame) {
            continue;
        }
        if entered && !is_torch_python_frame(frame) {
            chain.push(id);
        }
        if is_module_call_frame(frame) {
            entered = true;
        } else if !is_torch_python_frame(frame) {
            entered = false;
        }
        // A PyTorch frame between `__call__` and the user's `forward` (a compile wrapper, a
        // hook runner) leaves `entered` as it was.
    }
    chain
}

/// `model.py:245 > model.py:54`: each frame's file name (without folders) and line; the empty
/// chain is [`NO_MODULE`]. O(k) in the chain.
pub fn chain_label(snapshot: &Snapshot, chain: &[FrameId]) -> String {
    if chain.is_empty() {
        return NO_MODULE.to_string();
    }
    let mut out = String::new();
    for (i, id) in chain.iter().enumerate() {
        if i > 0 {
            out.push_str(" > ");
        }
        let frame = snapshot.frames.get(*id);
        let path = frame.filename.as_str();
        let base = path.rsplit(['/', '\\']).next().unwrap_or(path);
        out.push_str(&format!("{base}:{}", frame.line));
    }
    out
}

/// Maps stacks to module chains, computing each distinct stack's chain once (O(1) amortized a
/// lookup, [`module_chain`] once per stack).
pub struct ModuleKeyer<'a> {
    snapshot: &'a Snapshot,
    cache: HashMap<StackId, Arc<[FrameId]>>,
}

impl<'a> ModuleKeyer<'a> {
    pub fn new(snapshot: &'a Snapshot) -> Self {
        ModuleKeyer {
            snapshot,
            cache: HashMap::default(),
        }
    }

    /// The chain of `stack` (empty without a stack).
    pub fn chain(&mut self, stack: Option<StackId>) -> Arc<[FrameId]> {
        let Some(stack) = stack else {
            return Arc::from(Vec::new());
        };
        self.cache
            .entry(stack)
            .or_insert_with(|| Arc::from(module_chain(self.snapshot, stack)))
            .clone()
    }
}
