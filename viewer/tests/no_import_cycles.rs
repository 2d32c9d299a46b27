//! No two modules of the viewer import each other, directly or through others.
//!
//! Regression: `allocator_ui` and `document` imported each other, and `details_ui` →
//! `timeline` → `timeline::interaction` → `details_ui` went round. A circle means neither
//! side can be understood, tested or moved alone. This reads `src/` and fails on any circle
//! among the crate's top-level modules (a folder module such as `timeline/` is one: its files
//! may use each other through `super::`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level module of each source file, and the other top-level modules its code names
/// through `crate::` (comments left out).
fn module_edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    collect_rs(src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(src, f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(from) = top_module(src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read source");
        let targets = edges.entry(from.clone()).or_default();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            for to in crate_references(code) {
                if to != from && modules.contains(&to) {
                    targets.insert(to);
                }
            }
        }
    }
    edges
}

/// `a` for `src/a.rs`, `src/a/mod.rs` and `src/a/b.rs`; `None` for the crate root and for
/// `src/bin/`, the `memsnap-viewer` program: a crate of its own, where `crate::` names the
/// program's modules, not the library's.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main" && name != "bin").then(|| name.to_owned())
}

/// The first path segment after each `crate::` in `code`, including each name in
/// `crate::{a, b::c}`.
fn crate_references(code: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = code[i + "crate::".len()..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            out.extend(group.split(',').map(|part| ident(part.trim())));
        } else {
            out.push(ident(rest));
        }
    }
    out.retain(|name| !name.is_empty() && name != "self");
    out
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A circle in `edges`, as the modules along it, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|start| visit(start, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_two_viewer_modules_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = module_edges(&src);
    assert!(edges.contains_key("document") && edges.contains_key("timeline"));
    if let Some(cycle) = find_cycle(&edges) {
        panic!("import circle: {}", cycle.join(" → "));
    }
}

#[test]
fn the_check_finds_a_circle_and_grouped_imports() {
    assert_eq!(
        crate_references("use crate::{details_ui, palette}; crate::a::b();"),
        ["details_ui", "palette", "a"]
    );
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("details_ui", "timeline"),
        ("timeline", "details_ui"),
        // Found from the first module in name order, as the check walks them.
        ("app", "timeline"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), BTreeSet::from([b.to_owned()])))
    .collect();
    assert_eq!(
        find_cycle(&edges),
        Some(vec![
            "timeline".into(),
            "details_ui".into(),
            "timeline".into()
        ])
    );
}
