//! No two modules import each other, directly or through others, in any crate of the
//! workspace.
//!
//! Regressions: the pickle codec's VM held the value arena, the memo, the feeds and the opcode
//! table and imported the converter, which imported the arena back from the VM (8 files in one
//! circle); the viewer's `allocator_ui` and `document` imported each other, and
//! `details_ui` → `timeline` → `timeline::interaction` → `details_ui` went round. A circle means
//! neither side can be understood, tested or moved alone.
//!
//! This reads every crate's `src/` (one copy of the check for the whole workspace: it used to
//! be written twice, for the codec and for the viewer). Each file is a module (`a/b.rs` and
//! `a/b/mod.rs` are `a::b`). A path it names through `crate::`, `super::` or `self::` is an
//! edge between the two modules' ancestors that are siblings: `a::b::c` naming `a::d::e` is
//! the edge `b → d` among the children of `a`; naming an ancestor's own items (`super::X`
//! declared in `a/mod.rs`) is no edge. Every family of siblings must be free of circles. Test
//! modules (`mod tests` after `#[cfg(test)]`, `tests.rs`), comments and `src/bin/` programs
//! are left out. O(lines) to read, O(modules + edges) to search.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every crate folder of the workspace with a `src/`, read from the root manifest's members.
fn crate_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let members = manifest
        .split("members = [")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .expect("a [workspace] members list");
    let mut sources = vec![root.join("src")];
    sources.extend(
        members
            .split(',')
            .map(|m| m.trim().trim_matches('"'))
            .filter(|m| !m.is_empty() && *m != ".")
            .map(|m| root.join(m).join("src")),
    );
    sources.retain(|s| s.is_dir());
    sources
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("source folder") {
        let path = entry.expect("folder entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "bin" || n == "tests") {
                continue;
            }
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// The module path of a source file: `lib.rs` is `[]`, `a/b.rs` and `a/b/mod.rs` are
/// `["a", "b"]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("under src/");
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_str().expect("utf-8 path").to_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.strip_suffix(".rs").unwrap_or(&last);
    let is_root = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !is_root {
        parts.push(stem.to_owned());
    }
    parts
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Reads `ident::ident::…` from the start of `text`; also returns what follows.
fn path_segments(text: &str) -> (Vec<String>, &str) {
    let mut segments = Vec::new();
    let mut rest = text;
    loop {
        let len = rest.find(|c: char| !is_ident_char(c)).unwrap_or(rest.len());
        if len == 0 {
            break;
        }
        segments.push(rest[..len].to_owned());
        rest = &rest[len..];
        match rest.strip_prefix("::") {
            Some(after) if after.starts_with(is_ident_char) => rest = after,
            _ => break,
        }
    }
    (segments, rest)
}

/// The absolute paths one line of `module`'s code names through `crate::`, `super::` and
/// `self::` (a `{a, b::c}` group after the prefix gives each first name).
fn references(line: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = line[at..].find(['c', 's']) {
        let start = at + offset;
        at = start + 1;
        if start > 0 && line[..start].ends_with(|c: char| is_ident_char(c) || c == ':') {
            continue;
        }
        let mut rest = &line[start..];
        let mut base: Vec<String> = if let Some(r) = rest.strip_prefix("crate::") {
            rest = r;
            Vec::new()
        } else if rest.starts_with("super::") || rest.starts_with("self::") {
            let mut base = module.to_vec();
            loop {
                if let Some(r) = rest.strip_prefix("super::") {
                    if base.pop().is_none() {
                        break;
                    }
                    rest = r;
                } else if let Some(r) = rest.strip_prefix("self::") {
                    rest = r;
                } else {
                    break;
                }
            }
            base
        } else {
            continue;
        };
        let (segments, after) = path_segments(rest);
        base.extend(segments);
        if let Some(group) = after.strip_prefix("::{").or(rest.strip_prefix('{')) {
            let group = group.split('}').next().unwrap_or("");
            for item in group.split(',') {
                let (names, _) = path_segments(item.trim());
                if let Some(first) = names.into_iter().next() {
                    let mut path = base.clone();
                    path.push(first);
                    found.push(path);
                }
            }
        } else {
            found.push(base);
        }
    }
    found
}

/// Circles among the children of each module of one crate, as `a → b → a` strings.
fn circles(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    collect_rs(src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_path(src, f)).collect();
    // parent → child → children of the same parent it names
    let mut families: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for file in &files {
        let from = module_path(src, file);
        let text = std::fs::read_to_string(file).expect("readable source");
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        for line in code.lines() {
            let line = line.split("//").next().unwrap_or("");
            for to in references(line, &from) {
                let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
                if common >= from.len() || common >= to.len() {
                    continue; // a module naming itself, an ancestor or a descendant
                }
                let parent = from[..common].to_vec();
                let target = to[..=common].to_vec();
                if !modules.contains(&target) {
                    continue; // an item of the parent, not a sibling module
                }
                families
                    .entry(parent)
                    .or_default()
                    .entry(from[common].clone())
                    .or_default()
                    .insert(to[common].clone());
            }
        }
    }
    let mut found = Vec::new();
    for (parent, edges) in &families {
        let prefix = if parent.is_empty() {
            String::new()
        } else {
            format!("{}::", parent.join("::"))
        };
        for circle in circles_in(edges) {
            let names: Vec<String> = circle.iter().map(|m| format!("{prefix}{m}")).collect();
            found.push(format!("{}: {}", src.display(), names.join(" → ")));
        }
    }
    found
}

/// One circle through each strongly connected part of a small graph (depth-first search with
/// a path stack), each printed from its smallest name and closed.
fn circles_in(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    fn visit<'a>(
        node: &'a str,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        found: &mut BTreeSet<Vec<String>>,
    ) {
        if let Some(at) = path.iter().position(|&n| n == node) {
            let mut circle: Vec<String> = path[at..].iter().map(|s| s.to_string()).collect();
            let smallest = (0..circle.len()).min_by_key(|&i| &circle[i]).unwrap_or(0);
            circle.rotate_left(smallest);
            circle.push(circle[0].clone());
            found.insert(circle);
            return;
        }
        if done.contains(node) {
            return;
        }
        path.push(node);
        for next in edges.get(node).into_iter().flatten() {
            visit(next, edges, path, done, found);
        }
        path.pop();
        done.insert(node);
    }
    let mut found = BTreeSet::new();
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        visit(node, edges, &mut Vec::new(), &mut done, &mut found);
    }
    found.into_iter().collect()
}

#[test]
fn no_two_modules_of_any_crate_import_each_other() {
    let sources = crate_sources();
    assert!(sources.len() >= 10, "found only {sources:?}");
    let found: Vec<String> = sources.iter().flat_map(|s| circles(s)).collect();
    assert!(
        found.is_empty(),
        "modules that import each other:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_reader_sees_each_kind_of_path() {
    let module = vec!["a".to_owned(), "b".to_owned()];
    let refs = |line: &str| references(line, &module);
    assert_eq!(refs("use crate::x::Y;"), [vec!["x", "Y"]]);
    assert_eq!(refs("use super::c::D;"), [vec!["a", "c", "D"]]);
    assert_eq!(refs("super::super::e()"), [vec!["e"]]);
    assert_eq!(refs("use self::f::G;"), [vec!["a", "b", "f", "G"]]);
    assert_eq!(
        refs("use super::{c, d::E};"),
        [vec!["a", "c"], vec!["a", "d"]]
    );
    assert_eq!(
        refs("my_crate::x; supercrate::y"),
        Vec::<Vec<String>>::new()
    );
}

#[test]
fn a_circle_among_siblings_is_found_and_a_chain_is_not() {
    let graph = |pairs: &[(&str, &str)]| {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            edges
                .entry(a.to_string())
                .or_default()
                .insert(b.to_string());
        }
        edges
    };
    assert!(circles_in(&graph(&[("a", "b"), ("b", "c")])).is_empty());
    assert_eq!(
        circles_in(&graph(&[("b", "c"), ("c", "a"), ("a", "b")])),
        [vec!["a", "b", "c", "a"]]
    );
}
