//! Allocation sites: grouping allocations by stack, by top frame or by file.
//!
//! The **top frame** of a stack is the innermost frame a user would call "where it was
//! allocated": PyTorch's frame filter (§6.5 of the format spec) drops unwinder, interpreter
//! and dispatcher frames, and when the stack has Python frames the innermost `.py` frame wins
//! over C++ allocator internals.

use foldhash::HashMap;

use memsnap_format::{Frame, FrameId, Snapshot, StackId};
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
}

/// A group of allocations.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum SiteKey {
    Stack(StackId),
    Frame(FrameId),
    /// A file name as the frame has it.
    File(String),
    /// No stack was recorded.
    Unknown,
}

impl SiteKey {
    /// A one-line label: `file:line:function` of the top frame (for stacks, followed by the
    /// number of frames), the file name, or `<no stack>`.
    pub fn label(&self, snapshot: &Snapshot) -> String {
        match self {
            SiteKey::Stack(id) => match top_frame(snapshot, *id) {
                Some(f) => format!("{}", FrameLabel(snapshot.frames.get(f))),
                None => "<no frames>".to_string(),
            },
            SiteKey::Frame(f) => format!("{}", FrameLabel(snapshot.frames.get(*f))),
            SiteKey::File(name) => name.clone(),
            SiteKey::Unknown => "<no stack>".to_string(),
        }
    }
}

struct FrameLabel<'a>(&'a Frame);

impl std::fmt::Display for FrameLabel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.0.basename(), self.0.line, self.0.name)
    }
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

/// The top frame of a stack (see the module docs); `None` for an empty stack.
pub fn top_frame(snapshot: &Snapshot, stack: StackId) -> Option<FrameId> {
    if stack.0 as usize >= snapshot.stacks.len() {
        return None;
    }
    let ids = snapshot.stacks.get(stack);
    let valid = |f: &&FrameId| (f.0 as usize) < snapshot.frames.len();
    let python = ids
        .iter()
        .filter(valid)
        .find(|f| snapshot.frames.get(**f).filename.ends_with(".py"));
    python
        .or_else(|| {
            ids.iter()
                .filter(valid)
                .find(|f| !is_filtered_frame(snapshot.frames.get(**f)))
        })
        .or_else(|| ids.iter().find(valid))
        .copied()
}

/// Maps stacks to site keys, caching the top frame of each stack.
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
        };
        self.cache.insert(stack, key.clone());
        key
    }
}
