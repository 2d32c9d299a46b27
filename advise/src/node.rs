//! What activation checkpointing is aimed at: a **module node**, and the nodes worth trying.
//!
//! A node names a set of module calls in a forward pass, in one of two ways:
//!
//! - **By name** ([`ModuleNode::Named`]), when the run recorded `memsnap.module: PATH` ranges
//!   (`memsnap.torch.enable(modules=True)`): a dotted **pattern** over the paths
//!   `model.named_modules()` gives, where `*` stands for a number (an index into a
//!   `ModuleList` or `Sequential`). `blocks.*` is every block, `blocks.*.attn` every block's
//!   attention, `lm_head` one module. Each range whose path matches is one call, exactly: the
//!   hooks that recorded it ran at the call's start and end. A call's **index** is the number
//!   at the `*` (`blocks.3` is call 3 of `blocks.*`), so a range of calls is a range of blocks
//!   as the model numbers them; a pattern without `*` numbers its calls in event order (a
//!   module called more than once per forward).
//! - **By stack** ([`ModuleNode::Chain`]), without names: a prefix of the module chains of
//!   [`memsnap_analysis::modules`] (`model.py:212` is every block the model's loop calls). Its
//!   calls are told apart by where the code inside goes back to an earlier line (see
//!   [`crate::edit`]), and numbered in event order.
//!
//! [`named_nodes`] ranks the patterns by the activation bytes live at the allocated peak under
//! them, as [`crate::Advisor::module_bytes`] ranks chain prefixes.

use std::collections::{HashMap, HashSet};

use memsnap_analysis::modules::ModulePaths;
use memsnap_format::FrameId;

/// What a checkpointing fix is aimed at (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ModuleNode {
    /// A module chain prefix (the stacks' `forward` frames, outermost first).
    Chain(Vec<FrameId>),
    /// A pattern over the recorded module paths (`blocks.*`, `blocks.*.attn`, `lm_head`).
    Named(String),
}

/// Whether `path` matches `pattern` (same number of dotted segments; a `*` segment matches a
/// segment of decimal digits, any other must be equal), and the number at the pattern's first
/// `*`: `None` for no match, `Some(None)` for a match of a pattern without `*`.
/// O(length of the two).
pub fn match_path(pattern: &str, path: &str) -> Option<Option<u64>> {
    let mut number = None;
    let mut segments = path.split('.');
    for want in pattern.split('.') {
        let got = segments.next()?;
        if want == "*" {
            let n: u64 = (!got.is_empty() && got.bytes().all(|b| b.is_ascii_digit()))
                .then(|| got.parse().ok())
                .flatten()?;
            number.get_or_insert(n);
        } else if want != got {
            return None;
        }
    }
    segments.next().is_none().then_some(number)
}

/// `pattern` with its `*` replaced by `index` (`blocks.*`, 3: `blocks.3`).
pub fn with_index(pattern: &str, index: u64) -> String {
    pattern.replacen('*', &index.to_string(), 1)
}

/// Segments of a path considered: deeper ones are folded into their ancestor at this depth.
const MAX_SEGMENTS: usize = 32;

/// The patterns an allocation made in a call of `path` counts under: each prefix of the path
/// (`blocks`, `blocks.3`, `blocks.3.attn`) and, where the prefix has a numbered segment, the
/// same prefix with its last numbered segment as `*` (`blocks.*`, `blocks.*.attn`). A prefix
/// counts only when a call of it was recorded (`recorded` holds that literal path): a
/// container (`ModuleList`) is never called, so `blocks` alone is no node, while `blocks.*` is.
fn patterns_of(path: &str, recorded: &HashSet<&str>, out: &mut Vec<String>) {
    out.clear();
    let segments: Vec<&str> = path.split('.').take(MAX_SEGMENTS).collect();
    for end in 1..=segments.len() {
        let prefix = &segments[..end];
        let literal = prefix.join(".");
        if !recorded.contains(literal.as_str()) {
            continue;
        }
        if let Some(star) = prefix
            .iter()
            .rposition(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        {
            let mut starred: Vec<&str> = prefix.to_vec();
            starred[star] = "*";
            out.push(starred.join("."));
        }
        out.push(literal);
    }
}

/// Activation bytes live at the peak under each named pattern (see `patterns_of`), from
/// the innermost module path of each allocation (`live`: allocation indices in replay order
/// and their sizes). Left out: the outermost calls' own paths (the model, named by its
/// class: checkpointing all of the forward frees nothing before the backward needs it again),
/// a pattern with the bytes of the one it extends (the parent says it), and a pattern with
/// one call per forward that holds a numbered one (`transformer` around `transformer.h.*`:
/// the repeated blocks say where to checkpoint). Biggest first, numbered patterns before
/// others of the same bytes, then shallower. Each entry: `(pattern, depth, bytes)`.
///
/// O(m × s + (p + k) × l + r) for m live allocations, paths of at most s segments, p distinct
/// paths and k patterns of at most l bytes, and r module calls.
pub fn named_nodes(
    paths: &ModulePaths,
    live: impl Iterator<Item = (usize, u64)>,
) -> Vec<(String, usize, u64)> {
    let recorded: HashSet<&str> = paths.paths.iter().map(String::as_str).collect();
    // Outermost calls: not inside any call before them (calls are by start).
    let mut outermost: HashSet<u32> = HashSet::new();
    let mut reach: Option<u32> = None;
    for call in paths.calls() {
        if reach.is_none_or(|r| call.start_event > r) {
            outermost.insert(call.path);
        }
        reach = Some(reach.map_or(call.end_event, |r| r.max(call.end_event)));
    }
    let outer_names: HashSet<&str> = outermost
        .iter()
        .filter_map(|&p| paths.paths.get(p as usize).map(String::as_str))
        .collect();
    let mut cache: HashMap<&str, Vec<String>> = HashMap::new();
    let mut bytes: HashMap<String, u64> = HashMap::new();
    let mut scratch = Vec::new();
    for (i, size) in live {
        let Some(path) = paths.of(i) else {
            continue;
        };
        let patterns = cache.entry(path).or_insert_with(|| {
            patterns_of(path, &recorded, &mut scratch);
            scratch
                .iter()
                .filter(|p| !outer_names.contains(p.as_str()))
                .cloned()
                .collect()
        });
        for p in patterns.iter() {
            *bytes.entry(p.clone()).or_default() += size;
        }
    }
    // Each numbered pattern's ancestors without a `*` (`transformer` of `transformer.h.*`).
    let mut holding: HashSet<&str> = HashSet::new();
    for p in bytes.keys() {
        let Some(star) = p.find('*') else {
            continue;
        };
        let before = &p[..star];
        for (i, b) in before.bytes().enumerate() {
            if b == b'.' {
                holding.insert(&p[..i]);
            }
        }
    }
    let mut out: Vec<(String, usize, u64)> = bytes
        .iter()
        .filter(|(pattern, &b)| {
            let parent = pattern.rsplit_once('.').map(|(parent, _)| parent);
            let same_as_parent = parent.is_some_and(|parent| bytes.get(parent) == Some(&b));
            !same_as_parent && !holding.contains(pattern.as_str())
        })
        .map(|(pattern, &b)| (pattern.clone(), pattern.split('.').count(), b))
        .collect();
    out.sort_by(|a, b| {
        b.2.cmp(&a.2)
            .then(b.0.contains('*').cmp(&a.0.contains('*')))
            .then(a.1.cmp(&b.1))
            .then(a.0.cmp(&b.0))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_star_matches_a_number_and_gives_it() {
        assert_eq!(match_path("blocks.*", "blocks.12"), Some(Some(12)));
        assert_eq!(match_path("blocks.*.attn", "blocks.3.attn"), Some(Some(3)));
        assert_eq!(match_path("lm_head", "lm_head"), Some(None));
        assert_eq!(match_path("blocks.*", "blocks.3.attn"), None);
        assert_eq!(match_path("blocks.*", "blocks.attn"), None);
        assert_eq!(match_path("blocks.*", "blocks."), None);
        assert_eq!(match_path("blocks.*.attn", "blocks.3"), None);
        assert_eq!(match_path("blocks.*", "heads.3"), None);
        // A number too big for u64 is no index.
        assert_eq!(
            match_path("blocks.*", "blocks.99999999999999999999999"),
            None
        );
        assert_eq!(with_index("blocks.*.attn", 4), "blocks.4.attn");
    }

    #[test]
    fn prefixes_count_only_when_a_call_of_them_was_recorded() {
        let recorded: HashSet<&str> = ["transformer", "transformer.h.3", "transformer.h.3.attn"]
            .into_iter()
            .collect();
        let mut out = Vec::new();
        patterns_of("transformer.h.3.attn", &recorded, &mut out);
        assert_eq!(
            out,
            [
                "transformer",
                "transformer.h.*",
                "transformer.h.3",
                "transformer.h.*.attn",
                "transformer.h.3.attn"
            ]
        );
    }
}
