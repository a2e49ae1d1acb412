//! The runtime's structure stays readable from the bottom up: its folders are layers along the
//! data's path, and a file may only name files of its own layer or of layers below it; no files
//! import each other in a loop. Read from the source's `crate::` paths (imports and inline paths
//! alike), so the check needs nothing but the files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom first (the order of `lib.rs`'s module list).
const LAYERS: &[&str] = &["describe", "python", "judge", "answers", "report", "run"];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `describe/layer.rs` -> `describe::layer`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .filter(|c| c != "mod")
        .collect();
    parts.join("::")
}

/// Code without comments (`//`, doc comments included) and string literals, line by line.
fn code_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| {
            let mut out = String::new();
            let mut in_str = false;
            let mut chars = line.chars().peekable();
            while let Some(c) = chars.next() {
                if in_str {
                    if c == '\\' {
                        chars.next();
                    } else if c == '"' {
                        in_str = false;
                    }
                    continue;
                }
                if c == '"' {
                    in_str = true;
                    continue;
                }
                if c == '/' && chars.peek() == Some(&'/') {
                    break;
                }
                out.push(c);
            }
            out
        })
        .collect()
}

/// The modules (files) a file names through `crate::a::b` paths, `use crate::a::{b, c}` lists
/// included.
fn named_modules(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let code = code_lines(text).join("\n");
    let mut found = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        // The path after `crate::`, braces expanded one level: `a::{b, c::d}`.
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':' || c == '{'))
            .unwrap_or(rest.len());
        let head = &rest[..end];
        let mut paths = Vec::new();
        if let Some((prefix, _)) = head.split_once('{') {
            let close = rest.find('}').unwrap_or(rest.len());
            for item in rest[prefix.len() + 1..close].split(',') {
                paths.push(format!("{prefix}{}", item.trim()));
            }
        } else {
            paths.push(head.to_string());
        }
        for path in paths {
            let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
            // The longest prefix of the path that is a module file.
            for n in (1..=segments.len()).rev() {
                let candidate = segments[..n].join("::");
                if modules.contains(&candidate) {
                    found.insert(candidate);
                    break;
                }
            }
        }
    }
    found
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    files
        .iter()
        .map(|f| {
            let me = module_of(&src, f);
            let text = std::fs::read_to_string(f).unwrap();
            let mut named = named_modules(&text, &modules);
            named.remove(&me);
            // A folder's module list names its files: that is not an import.
            named.retain(|m| !m.starts_with(&format!("{me}::")));
            (me, named)
        })
        .collect()
}

fn layer_of(module: &str) -> Option<usize> {
    let top = module.split("::").next()?;
    LAYERS.iter().position(|l| *l == top)
}

#[test]
fn files_import_only_their_layer_and_the_layers_below() {
    let mut wrong = Vec::new();
    for (from, to) in graph() {
        let Some(level) = layer_of(&from) else {
            continue; // lib.rs: the crate's face, above every layer
        };
        for target in to {
            match layer_of(&target) {
                Some(l) if l <= level => {}
                _ => wrong.push(format!("{from} -> {target}")),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that run up the layers ({}):\n  {}",
        LAYERS.join(" < "),
        wrong.join("\n  ")
    );
}

/// Strongly connected components of more than one file (Tarjan).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn no_files_import_each_other_in_a_loop() {
    let g = graph();
    let loops = cycles(&g);
    assert!(
        loops.is_empty(),
        "files that import each other in a loop:\n  {}",
        loops
            .iter()
            .map(|c| c.join(", "))
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    // The longest chain of imports, for the record (`cargo test -p golden --test layers --
    // --nocapture` prints it).
    fn depth(
        g: &BTreeMap<String, BTreeSet<String>>,
        v: &str,
        memo: &mut BTreeMap<String, Vec<String>>,
    ) -> Vec<String> {
        if let Some(chain) = memo.get(v) {
            return chain.clone();
        }
        let mut best = Vec::new();
        for w in g.get(v).into_iter().flatten() {
            let chain = depth(g, w, memo);
            if chain.len() > best.len() {
                best = chain;
            }
        }
        best.insert(0, v.to_string());
        memo.insert(v.to_string(), best.clone());
        best
    }
    let mut memo = BTreeMap::new();
    let longest = g
        .keys()
        .map(|v| depth(&g, v, &mut memo))
        .max_by_key(|c| c.len())
        .unwrap_or_default();
    eprintln!(
        "{} files; longest chain of imports: {} files: {}",
        g.len(),
        longest.len(),
        longest.join(" -> ")
    );
}
