//! Per-stack lookups the pictures need, computed once per snapshot so that colouring or fading
//! thousands of bands per frame does not walk their stacks:
//!
//! * [`StackSites`]: the user-code site of every stack (band colours, labels).
//! * [`StackMatch`]: which stacks mention a function or file name (the viewer's search).

use memsnap_analysis::sites::{module_chain, top_frame};
use memsnap_analysis::SiteKey;
use std::sync::OnceLock;

use memsnap_format::{FrameId, Snapshot, StackId};

/// The user-code site ([`top_frame`]) of every stack of a snapshot, found once (on the loader
/// thread) so that colouring thousands of bands per frame does not walk their stacks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackSites {
    /// Indexed by `StackId`.
    by_stack: Vec<Option<FrameId>>,
    /// The module path of each stack as a key (a hash of its frames; 0: outside every
    /// module), indexed by `StackId` (band colours by module). Found on first need
    /// ([`StackSites::find_modules`]): it walks every frame of every stack, three times the
    /// sites' cost (3.8 vs 1.1 ms for the 1,171 stacks of a real 2.7B-parameter snapshot), and
    /// the first picture waits for the sites.
    module_by_stack: OnceLock<Vec<u64>>,
}

impl StackSites {
    /// The site of every stack. O(stacks × the frames walked to the innermost user frame).
    pub fn new(snapshot: &Snapshot) -> Self {
        let count = u32::try_from(snapshot.stacks.len()).unwrap_or(u32::MAX);
        StackSites {
            by_stack: (0..count)
                .map(|i| top_frame(snapshot, StackId::from_index(i as usize)))
                .collect(),
            module_by_stack: OnceLock::new(),
        }
    }

    /// Finds the module path of every stack of `snapshot` (the one these sites are of), once;
    /// until then [`StackSites::module`] answers `None`. O(total frames of the stacks).
    pub fn find_modules(&self, snapshot: &Snapshot) -> &Self {
        self.module_by_stack.get_or_init(|| {
            let count = u32::try_from(snapshot.stacks.len()).unwrap_or(u32::MAX);
            (0..count)
                .map(|i| module_key(&module_chain(snapshot, StackId::from_index(i as usize))))
                .collect()
        });
        self
    }

    /// The module path of a stack as a key ([`crate::palette::module_colour`]); `None`
    /// outside every module, without a stack, for an unknown id, or before
    /// [`StackSites::find_modules`].
    pub fn module(&self, stack: Option<StackId>) -> Option<u64> {
        stack
            .and_then(|s| self.module_by_stack.get()?.get(s.index()).copied())
            .filter(|&k| k != 0)
    }

    /// The site of a stack; `None` without a stack, for an empty one or an unknown id.
    pub fn site(&self, stack: Option<StackId>) -> Option<FrameId> {
        stack.and_then(|s| self.by_stack.get(s.index()).copied().flatten())
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

/// A named module path's key (`blocks.0.attn`, from `memsnap.module:` ranges): FNV-1a over
/// its bytes, so a path has the same colour in every file; never 0.
pub fn module_path_key(path: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

/// A module path's key: a hash of its frames (FNV-1a over the frame indices), never 0 for a
/// path; 0 for the empty path (outside every module).
fn module_key(chain: &[FrameId]) -> u64 {
    if chain.is_empty() {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in chain {
        h = (h ^ f.index() as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
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
            .map(|(_, frames)| frames.iter().any(|f| frame_hits[f.index()]))
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
        stack.is_some_and(|s| self.matches.get(s.index()).copied().unwrap_or(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_format::{Action, Frame, TraceEntry};

    #[test]
    fn stacks_under_the_same_module_path_share_a_module_key() {
        const MODULE: &str = "/venv/site-packages/torch/nn/modules/module.py";
        let mut s = Snapshot::new(1);
        let under = |s: &mut Snapshot, inner: Frame, block_line: u32| {
            s.intern_stack([
                inner,
                Frame::new("_call_impl", MODULE, 1790),
                Frame::new("forward", "/p/model.py", block_line),
                Frame::new("_call_impl", MODULE, 1790),
                Frame::new("forward", "/p/model.py", 212),
                Frame::new("_call_impl", MODULE, 1790),
                Frame::new("train_step", "/p/train.py", 88),
            ])
        };
        let linear = Frame::new(
            "forward",
            "/venv/site-packages/torch/nn/modules/linear.py",
            125,
        );
        let conv = Frame::new(
            "forward",
            "/venv/site-packages/torch/nn/modules/conv.py",
            450,
        );
        let a = under(&mut s, linear.clone(), 52);
        let b = under(&mut s, conv, 52);
        let c = under(&mut s, linear, 54);
        let outside = s.intern_stack([Frame::new("step", "/p/train.py", 95)]);
        let sites = StackSites::new(&s);
        assert_eq!(sites.module(Some(a)), None, "not found yet");
        sites.find_modules(&s);
        // `model.py:212 > model.py:52` for both; PyTorch's own modules are leaves, not part of
        // the path.
        assert!(sites.module(Some(a)).is_some());
        assert_eq!(sites.module(Some(a)), sites.module(Some(b)));
        assert_ne!(sites.module(Some(a)), sites.module(Some(c)));
        assert_eq!(sites.module(Some(outside)), None);
    }

    #[test]
    fn search_matches_function_or_file_names_case_insensitively() {
        let mut s = Snapshot::new(1);
        let forward = s.intern_stack([
            Frame::new("linear", "model.py", 10),
            Frame::new("main", "train.py", 1),
        ]);
        let backward = s.intern_stack([
            Frame::new("grad", "autograd.py", 5),
            Frame::new("main", "train.py", 1),
        ]);
        let trace = &mut s.device_traces.as_mut().expect("traces")[0];
        let mut a = TraceEntry::new(Action::Alloc, 0x10000, 4096, 0);
        a.frames = Some(forward);
        trace.push(a);
        let mut b = TraceEntry::new(Action::Alloc, 0x11000, 1024, 0);
        b.frames = Some(backward);
        trace.push(b);
        let by_function = StackMatch::new(&s, "LINEAR");
        assert_eq!(by_function.matching_stacks, 1);
        assert!(by_function.matches(Some(StackId::from_index(0))));
        assert!(!by_function.matches(Some(StackId::from_index(1))));
        assert!(!by_function.matches(None));
        assert_eq!(StackMatch::new(&s, "train.py").matching_stacks, 2);
        assert_eq!(StackMatch::new(&s, "nothing").matching_stacks, 0);
        let sites = StackSites::new(&s);
        assert_eq!(sites.label(&s, Some(forward)), "model.py:10:linear");
        assert_eq!(sites.site(None), None);
        // No `nn.Module.__call__` frame in either: outside every module.
        assert_eq!(sites.find_modules(&s).module(Some(forward)), None);
        assert_eq!(sites.module(None), None);
    }
}
