//! golden's public surface, pinned: what a user's crate can name at the root (the re-exports and
//! the modules not hidden from the docs). A change to it changes the snapshot, so that growth is
//! seen in review (`cargo insta review`). The layer modules are public for golden's own command
//! line and tests only, `#[doc(hidden)]`; the macro's support is `__private`.

use std::path::Path;

/// Every name `lib.rs` makes public at the root, with where it comes from, sorted.
fn public_items(lib: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut hidden = false;
    let mut statement = String::new();
    let mut depth = 0usize;
    for line in lib.lines() {
        let line = line.trim();
        if line.starts_with("//") || line.is_empty() {
            continue;
        }
        if depth > 0 {
            depth += line.matches('{').count();
            depth -= line.matches('}').count();
            continue;
        }
        if line == "#[doc(hidden)]" {
            hidden = true;
            continue;
        }
        if line.starts_with("#[") || line.starts_with("#![") {
            continue;
        }
        if statement.is_empty()
            && line.starts_with("pub ")
            && !line.starts_with("pub use ")
            && line.ends_with('{')
        {
            // An item with a body (an inline module, a function, a type): hidden (the macro's
            // support) or listed by its signature; its body skipped.
            if !hidden {
                let head = line.trim_end_matches('{').trim();
                items.push(match head.strip_prefix("pub mod ") {
                    Some(m) => format!("mod {m}"),
                    None => head.to_string(),
                });
            }
            depth = 1;
            hidden = false;
            continue;
        }
        statement.push_str(line);
        statement.push(' ');
        if !line.ends_with(';') {
            continue;
        }
        let s = std::mem::take(&mut statement);
        let s = s.trim().trim_end_matches(';');
        let was_hidden = std::mem::take(&mut hidden);
        if let Some(module) = s.strip_prefix("pub mod ") {
            if !was_hidden {
                items.push(format!("mod {module}"));
            }
        } else if let Some(path) = s.strip_prefix("pub use ") {
            if was_hidden {
                continue;
            }
            match path.split_once("::{") {
                Some((base, names)) => {
                    for name in names.trim_end_matches('}').split(',') {
                        let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
                        if !name.is_empty() {
                            items.push(exported(&format!("{base}::{name}")));
                        }
                    }
                }
                None => items.push(exported(path)),
            }
        } else if !was_hidden && s.starts_with("pub ") {
            items.push(s.to_string());
        }
    }
    items.sort_by_key(|item| item.to_lowercase());
    items
}

/// `a::b::C` as `C = a::b::C`, `a::f as g` as `g = a::f`: the name a user writes first.
fn exported(path: &str) -> String {
    match path.split_once(" as ") {
        Some((path, name)) => format!("{name} = {path}"),
        None => format!("{} = {path}", path.rsplit("::").next().unwrap_or(path)),
    }
}

#[test]
fn the_public_surface_is_what_a_user_writes() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let items = public_items(&lib);
    assert!(items.len() > 20, "lib.rs was not read: {items:?}");
    assert!(
        !items.iter().any(|i| i.starts_with("mod ")),
        "a module is public and not hidden from the docs: {items:?}"
    );
    insta::assert_snapshot!("public_surface", items.join("\n"));
}

#[test]
fn hidden_modules_and_their_bodies_are_not_listed() {
    let lib = "#[doc(hidden)]\npub mod run;\npub mod shown;\npub use a::{B, c as d};\n\
               #[doc(hidden)]\npub mod __private {\n    pub use x::Y;\n}\npub use e::F;\n";
    assert_eq!(
        public_items(lib),
        ["B = a::B", "d = a::c", "F = e::F", "mod shown"]
    );
}
