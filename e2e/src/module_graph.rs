//! A test that keeps the module graphs of the workspace's crates acyclic.
//!
//! Every `crate::`, `super::` and `self::` path in a crate's non-test code is
//! an edge from the module it is written in to the deepest module it names
//! (`use super::ctx::{Ctx, meta_str}` in `handler/read.rs` is the edge
//! `handler::read -> handler::ctx`). A path into one's own ancestors
//! (`super::Writer` in a child module, `crate::Error`) is not an edge: a
//! child module is a part of its parent, sees its private items, and `impl`
//! blocks of one type split over child files are the usual Rust shape. What
//! must not happen is two modules that are not nested depending on each
//! other, directly or through others (kube-sim's `handler <-> server <->
//! watch` and the controller's `source -> writer -> drift -> source` were
//! such cycles).
//!
//! It is a plain text scan (comments, doc links and `#[cfg(test)]` modules
//! left out), so it lives here, in kube-sim's fast unit tests, and checks the
//! other crates of the workspace from their sources.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// The crates checked, as source directories relative to the workspace root.
const CRATES: &[&str] = &[
    "e2e/src",
    "e2e/apimachinery/src",
    "e2e/testenv/src",
    "controller/src",
    "controller/core/src",
    "controller/k8s-syntax/src",
    "client/src",
];

fn name(m: &[String]) -> String {
    if m.is_empty() {
        "crate".to_string()
    } else {
        m.join("::")
    }
}

/// Removes `//` comments (doc comments included) and string literals.
fn strip(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = '\0';
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if in_str {
                if c == '"' && prev != '\\' {
                    in_str = false;
                }
                prev = if prev == '\\' { '\0' } else { c };
                continue;
            }
            if c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '"' {
                in_str = true;
                prev = '\0';
                continue;
            }
            out.push(c);
        }
        out.push('\n');
    }
    out
}

/// The text without its `#[cfg(test)] mod name { .. }` blocks, and the names
/// of the `#[cfg(test)] mod name;` files it declares.
fn without_tests(text: &str) -> (String, BTreeSet<String>) {
    let mut out = String::new();
    let mut test_files = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let mut after = rest[at + "#[cfg(test)]".len()..].trim_start();
        while let Some(attr) = after.strip_prefix("#[") {
            after = attr.split_once(']').map_or("", |(_, r)| r).trim_start();
        }
        for vis in ["pub(crate) ", "pub(super) ", "pub "] {
            after = after.strip_prefix(vis).unwrap_or(after);
        }
        let Some(decl) = after.strip_prefix("mod ") else {
            rest = after;
            continue;
        };
        let ident: String = decl
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let decl = decl[ident.len()..].trim_start();
        if let Some(body) = decl.strip_prefix('{') {
            let mut depth = 1;
            let mut end = body.len();
            for (i, c) in body.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    end = i + 1;
                    break;
                }
            }
            rest = &body[end..];
        } else {
            test_files.insert(ident);
            rest = decl.strip_prefix(';').unwrap_or(decl);
        }
    }
    out.push_str(rest);
    (out, test_files)
}

/// The modules of the crate in `src`: module path -> stripped non-test text.
fn modules(src: &Path) -> BTreeMap<Module, String> {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("directory entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "bin") {
                    walk(&p, files);
                }
            } else if p.extension().is_some_and(|e| e == "rs") {
                files.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut mods = BTreeMap::new();
    let mut test_only = BTreeSet::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("under src").with_extension("");
        let mut m: Module = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
            m.pop();
        }
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let (text, tests) = without_tests(&strip(&text));
        for t in tests {
            let mut child = m.clone();
            child.push(t);
            test_only.insert(child);
        }
        mods.insert(m, text);
    }
    mods.retain(|m, _| !test_only.iter().any(|t| m.starts_with(t)));
    mods
}

/// The paths of a use tree starting right after `crate::` (or `super::`,
/// `self::`): `a::{b, c::d}` -> `[a, b]`, `[a, c, d]`.
fn use_paths(s: &str) -> Vec<Vec<String>> {
    fn tree(s: &[char], i: &mut usize, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        loop {
            while *i < s.len() && s[*i].is_whitespace() {
                *i += 1;
            }
            if *i < s.len() && s[*i] == '{' {
                *i += 1;
                loop {
                    let depth = prefix.len();
                    tree(s, i, prefix, out);
                    prefix.truncate(depth);
                    while *i < s.len() && s[*i].is_whitespace() {
                        *i += 1;
                    }
                    match s.get(*i) {
                        Some(',') => *i += 1,
                        Some('}') => {
                            *i += 1;
                            return;
                        }
                        _ => return,
                    }
                    while *i < s.len() && s[*i].is_whitespace() {
                        *i += 1;
                    }
                    if s.get(*i) == Some(&'}') {
                        *i += 1;
                        return;
                    }
                }
            }
            let start = *i;
            while *i < s.len() && (s[*i].is_alphanumeric() || s[*i] == '_') {
                *i += 1;
            }
            let ident: String = s[start..*i].iter().collect();
            if ident.is_empty() {
                out.push(prefix.clone());
                return;
            }
            if ident != "self" {
                prefix.push(ident);
            }
            if s.get(*i) == Some(&':') && s.get(*i + 1) == Some(&':') {
                *i += 2;
                continue;
            }
            out.push(prefix.clone());
            return;
        }
    }
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    tree(&chars, &mut 0, &mut Vec::new(), &mut out);
    out
}

/// Edges `from -> to` between modules of one crate (see the module docs).
fn edges(mods: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, text) in mods {
        let targets = graph.entry(m.clone()).or_default();
        let bytes = text.as_bytes();
        // `crate::`, `super::`, `self::`, and a path through a child module
        // (`read::get(..)` in the module that declares `mod read;`).
        let mut roots: Vec<(String, Module, Option<String>)> = vec![
            ("crate::".into(), Vec::new(), None),
            (
                "super::".into(),
                m[..m.len().saturating_sub(1)].to_vec(),
                None,
            ),
            ("self::".into(), m.clone(), None),
        ];
        for child in mods.keys() {
            if child.len() == m.len() + 1 && child.starts_with(m) {
                let c = child[m.len()].clone();
                roots.push((format!("{c}::"), m.clone(), Some(c)));
            }
        }
        for (root, start, first) in &roots {
            for (at, _) in text.match_indices(root.as_str()) {
                let before = at.checked_sub(1).map(|i| bytes[i]);
                if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':') {
                    continue;
                }
                for mut path in use_paths(&text[at + root.len()..]) {
                    if let Some(c) = first {
                        path.insert(0, c.clone());
                    }
                    let mut base = start.clone();
                    while path.first().is_some_and(|s| s == "super") {
                        path.remove(0);
                        base.pop();
                    }
                    let mut target = base.clone();
                    let mut best = None;
                    if mods.contains_key(&target) {
                        best = Some(target.clone());
                    }
                    for seg in path {
                        target.push(seg);
                        if mods.contains_key(&target) {
                            best = Some(target.clone());
                        } else {
                            break;
                        }
                    }
                    if let Some(t) = best
                        && !m.starts_with(&t)
                    {
                        targets.insert(t);
                    }
                }
            }
        }
    }
    graph
}

/// The strongly connected components with more than one module (Tarjan).
fn cycles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Tarjan<'a> {
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        out: Vec<Vec<Module>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    comp.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

#[test]
fn module_graphs_have_no_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for krate in CRATES {
        let mods = modules(&root.join(krate));
        let graph = edges(&mods);
        for comp in cycles(&graph) {
            let detail: Vec<String> = comp
                .iter()
                .map(|m| {
                    let to: Vec<String> = graph[m]
                        .iter()
                        .filter(|t| comp.contains(t))
                        .map(|t| name(t))
                        .collect();
                    format!("  {} -> {}", name(m), to.join(", "))
                })
                .collect();
            found.push(format!("{krate}:\n{}", detail.join("\n")));
        }
    }
    assert!(
        found.is_empty(),
        "module dependency cycles (move the shared item into a module both sides use):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_sees_edges_and_cycles() {
    let text = |s: &str| without_tests(&strip(s)).0;
    let mods: BTreeMap<Module, String> = [
        (vec![], text("mod a; mod b; mod c; pub use crate::a::A; fn f() { c::g() }")),
        (
            vec!["a".to_string()],
            text("use super::b::{self, B};\n// crate::c\n#[cfg(test)]\nmod tests { use crate::c::C; }"),
        ),
        (
            vec!["b".to_string()],
            text("pub(crate) fn f() { crate::a::g(); let _ = \"crate::c\"; }"),
        ),
        (vec!["c".to_string()], text("use crate::{Error, a::{self}};")),
    ]
    .into_iter()
    .collect();
    let graph = edges(&mods);
    let set = |v: &[&str]| -> BTreeSet<Module> { v.iter().map(|m| vec![m.to_string()]).collect() };
    assert_eq!(graph[&vec![]], set(&["a", "c"]));
    assert_eq!(graph[&vec!["a".to_string()]], set(&["b"]));
    assert_eq!(graph[&vec!["b".to_string()]], set(&["a"]));
    assert_eq!(graph[&vec!["c".to_string()]], set(&["a"]));
    assert_eq!(
        cycles(&graph),
        vec![vec![vec!["a".to_string()], vec!["b".to_string()]]]
    );
}
