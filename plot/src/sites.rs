//! Per-stack lookups the pictures need, computed once per snapshot so that colouring or fading
//! thousands of bands per frame does not walk their stacks:
//!
//! * [`StackSites`]: the user-code site of every stack (band colours, labels).
//! * [`StackMatch`]: which stacks mention a function or file name (the viewer's search).

use memsnap_analysis::sites::top_frame;
use memsnap_analysis::SiteKey;
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
                .map(|i| top_frame(snapshot, StackId::from_index(i as usize)))
                .collect(),
        }
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
    }
}
