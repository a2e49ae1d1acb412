//! The items beside the annotated function, read from its source file: golden puts a function's
//! tests in a module of the function's name, which must not clash with what is already there — a
//! module of that name, or paths that start with that name and mean a crate (`use
//! golden::golden_layer` beside `fn golden`).
//!
//! A proc macro sees only its item; the compiler's own errors (two modules of one name, E0428; a
//! crate's name that the tests' module makes ambiguous, E0659, under `cargo test` only) name
//! neither golden nor the fix. So the macro reads the function's source file (`Span::local_file`,
//! stable since Rust 1.88) and looks at the list of items the function is in. Where the file cannot
//! be read or parsed (a function made by another macro), nothing is said and the compiler's error
//! stands.

use proc_macro2::Ident;
use syn::visit::Visit;
use syn::{File, Item, UseTree};

/// What is already beside the annotated function that its tests' module would clash with.
#[derive(Debug, PartialEq)]
pub enum Clash {
    /// A module of the function's name.
    Module,
    /// A path that starts with the function's name (a crate's: `use golden::golden_layer`),
    /// which the tests' module would make mean the module.
    Path(String),
}

/// What, in the items of the function's module (in its source file), its tests' module would
/// clash with.
pub fn clash(function: &Ident) -> Option<Clash> {
    let path = proc_macro::Span::call_site().local_file()?;
    let text = std::fs::read_to_string(&path).ok()?;
    let file = syn::parse_file(&text).ok()?;
    clash_in(&file, &function.to_string())
}

/// What any list of items in `file` that holds an annotated `fn <name>` has that a `mod <name>`
/// beside it would clash with.
fn clash_in(file: &File, name: &str) -> Option<Clash> {
    fn walk(items: &[Item], name: &str) -> Option<Clash> {
        let annotated = items.iter().any(|item| match item {
            Item::Fn(f) => {
                f.sig.ident == name
                    && f.attrs.iter().any(|a| {
                        a.path()
                            .segments
                            .last()
                            .is_some_and(|s| s.ident == "golden_layer")
                    })
            }
            _ => false,
        });
        if annotated {
            // A module under a `cfg` may not exist when the tests do: the compiler judges those.
            let module = items.iter().any(|item| {
                matches!(item, Item::Mod(m) if m.ident == name
                    && !m.attrs.iter().any(|a| a.path().is_ident("cfg")))
            });
            if module {
                return Some(Clash::Module);
            }
            let mut paths = Paths { name, found: None };
            for item in items {
                // A module's own items have their own scope.
                if !matches!(item, Item::Mod(_)) {
                    paths.visit_item(item);
                }
            }
            if let Some(path) = paths.found {
                return Some(Clash::Path(path));
            }
        }
        items.iter().find_map(|item| match item {
            Item::Mod(m) => m.content.as_ref().and_then(|(_, inner)| walk(inner, name)),
            _ => None,
        })
    }
    walk(&file.items, name)
}

/// The first path in the items visited that starts with `name` and goes on (`name::...`), without
/// a leading `::` (which names a crate whatever is beside it): in a `use`, an attribute, a type or
/// an expression.
struct Paths<'a> {
    name: &'a str,
    found: Option<String>,
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if self.found.is_none() && item.leading_colon.is_none() {
            if let UseTree::Path(p) = &item.tree {
                if p.ident == self.name {
                    self.found = Some(format!("use {}", use_tree(&item.tree)));
                }
            }
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let starts = path.leading_colon.is_none()
            && path.segments.len() > 1
            && path.segments[0].ident == self.name;
        if self.found.is_none() && starts {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.found = Some(segments.join("::"));
        }
        syn::visit::visit_path(self, path);
    }
}

/// A `use` tree as written (`golden::golden_layer`, `golden::{check, Layer}`).
fn use_tree(tree: &UseTree) -> String {
    match tree {
        UseTree::Path(p) => format!("{}::{}", p.ident, use_tree(&p.tree)),
        UseTree::Name(n) => n.ident.to_string(),
        UseTree::Rename(r) => format!("{} as {}", r.ident, r.rename),
        UseTree::Glob(_) => "*".into(),
        UseTree::Group(g) => format!(
            "{{{}}}",
            g.items.iter().map(use_tree).collect::<Vec<_>>().join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_beside_the_annotated_function_clashes_one_elsewhere_does_not() {
        let file = |src: &str| syn::parse_file(src).unwrap();
        let clashes_in = |src: &str, name: &str| clash_in(&file(src), name) == Some(Clash::Module);
        let clash = "pub mod gelu {} #[golden_layer(reference = \"m.f\")] fn gelu() {}";
        assert!(clashes_in(clash, "gelu"));
        let nested =
            "mod ports { mod gelu {} #[golden::golden_layer(reference = \"m.f\")] fn gelu() {} }";
        assert!(clashes_in(nested, "gelu"));
        let elsewhere =
            "mod gelu {} mod ports { #[golden_layer(reference = \"m.f\")] fn gelu() {} }";
        assert_eq!(clash_in(&file(elsewhere), "gelu"), None);
        let plain = "mod gelu {} fn gelu() {}";
        assert_eq!(clash_in(&file(plain), "gelu"), None);
        let gated =
            "#[cfg(feature = \"x\")] mod gelu {} #[golden_layer(reference = \"m.f\")] fn gelu() {}";
        assert_eq!(clash_in(&file(gated), "gelu"), None);
    }

    #[test]
    fn a_path_beside_the_annotated_function_that_starts_with_its_name_clashes() {
        let file = |src: &str| syn::parse_file(src).unwrap();
        let found = |src: &str, name: &str| clash_in(&file(src), name);
        let used = "use golden::golden_layer; #[golden_layer(reference = \"m.f\")] fn golden() {}";
        assert_eq!(
            found(used, "golden"),
            Some(Clash::Path("use golden::golden_layer".into()))
        );
        let attribute = "#[golden::golden_layer(reference = \"m.f\")] fn golden() {}";
        assert_eq!(
            found(attribute, "golden"),
            Some(Clash::Path("golden::golden_layer".into()))
        );
        let typed = "use golden::golden_layer; \
                     #[golden_layer(reference = \"m.f\")] fn candle_core() -> candle_core::Result<()> {}";
        assert_eq!(
            found(typed, "candle_core"),
            Some(Clash::Path("candle_core::Result".into()))
        );
        // From the root, or in a module of its own, or without the attribute: nothing to say.
        let rooted =
            "use ::golden::golden_layer; #[golden_layer(reference = \"m.f\")] fn golden() {}";
        assert_eq!(found(rooted, "golden"), None);
        let inner =
            "mod other { use golden::x; } #[golden_layer(reference = \"m.f\")] fn golden() {}";
        assert_eq!(found(inner, "golden"), None);
        let plain = "use golden::x; fn golden() {}";
        assert_eq!(found(plain, "golden"), None);
    }
}
