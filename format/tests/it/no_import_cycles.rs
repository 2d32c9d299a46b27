//! No two modules of the pickle codec (`src/pickle/`) import each other, directly or through
//! others.
//!
//! Regression: the VM (`vm`) held the value arena, the memo, the input feeds and the opcode
//! table, and imported the converter (`convert`), which imported the arena from the VM; the
//! emitter, the writer, the opcode decoder (`ops`) and the segments scanner (`part`) took their
//! opcodes from the VM too. Now the opcode table (`opcodes`), the arena, the memo and the
//! feeds are modules of their own below the VM and the converter. A circle means neither side
//! can be understood, tested or moved alone. This reads the codec's sources and fails on any
//! circle among its modules (a folder module such as `vm/` is one: its files may use each
//! other through `super::`; `mod.rs`, which wires them together, and test modules are left
//! out).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each module of the codec, and the other modules its code names through `super::` (as
/// many as the file is deep) or `crate::pickle::`.
fn module_edges(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    collect_rs(dir, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(dir).expect("under the folder");
        let parts: Vec<&str> = relative
            .components()
            .map(|c| c.as_os_str().to_str().expect("utf-8 path"))
            .collect();
        let from = parts[0].strip_suffix(".rs").unwrap_or(parts[0]).to_owned();
        if from == "mod" {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("read source");
        // Test modules name their parent through `super::` from one level deeper.
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        let targets = edges.entry(from.clone()).or_default();
        for line in code.lines() {
            let line = line.split("//").next().unwrap_or("");
            for to in references(line, parts.len()) {
                if to != from {
                    targets.insert(to);
                }
            }
        }
    }
    edges
}

/// The codec modules `code` names, from a file `depth` folders below `src/pickle/` (1 for
/// `src/pickle/vm.rs`, 2 for `src/pickle/vm/fast_path.rs`): the first segment after exactly
/// `depth` `super::`s or after `crate::pickle::`, including each name in `{a, b::c}`.
fn references(code: &str, depth: usize) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    let mut names_after = |rest: &str| {
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            out.extend(group.split(',').map(|part| ident(part.trim())));
        } else {
            out.push(ident(rest));
        }
    };
    for (i, _) in code.match_indices("crate::pickle::") {
        names_after(&code[i + "crate::pickle::".len()..]);
    }
    let mut rest = code;
    while let Some(i) = rest.find("super::") {
        let mut after = &rest[i..];
        let mut supers = 0;
        while let Some(next) = after.strip_prefix("super::") {
            supers += 1;
            after = next;
        }
        if supers == depth {
            names_after(after);
        }
        rest = after;
    }
    out.retain(|name| !name.is_empty() && name != "self" && name != "super");
    out
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/pickle") {
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
fn no_two_pickle_modules_import_each_other() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/pickle");
    let edges = module_edges(&dir);
    // The check reads what it should: the VM's imports, including its folder's file.
    assert!(edges["vm"].contains("opcodes") && edges["vm"].contains("convert"));
    assert!(edges["vm"].contains("sym"), "vm/fast_path.rs counts as vm");
    if let Some(cycle) = find_cycle(&edges) {
        panic!("import circle: {}", cycle.join(" → "));
    }
    // The opcode table is the bottom: it names no other module of the codec.
    assert_eq!(edges["opcodes"], BTreeSet::new());
}

#[test]
fn the_check_reads_supers_by_depth_and_finds_a_circle() {
    assert_eq!(
        references(
            "use super::{arena::Val, memo}; super::super::x(); crate::pickle::ops::Op",
            1
        ),
        ["ops", "arena", "memo"]
    );
    assert_eq!(
        references(
            "use super::super::convert::Conv; use super::{short_long, Vm};",
            2
        ),
        ["convert"]
    );
    let edges: BTreeMap<String, BTreeSet<String>> = [("vm", "convert"), ("convert", "vm")]
        .into_iter()
        .map(|(a, b)| (a.to_owned(), BTreeSet::from([b.to_owned()])))
        .collect();
    assert_eq!(
        find_cycle(&edges),
        Some(vec!["convert".into(), "vm".into(), "convert".into()])
    );
}
