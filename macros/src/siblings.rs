//! The items beside the annotated function, read from its source file: golden puts a function's
//! tests in a module of the function's name, which must not clash with a module already there.
//!
//! A proc macro sees only its item; the compiler's own error for two modules of one name (E0428)
//! names neither golden nor the fix. So the macro reads the function's source file
//! (`Span::local_file`, stable since Rust 1.88) and looks for a `mod <name>` in the same list of
//! items as the function. Where the file cannot be read or parsed (a function made by another
//! macro), nothing is said and the compiler's error stands.

use proc_macro2::Ident;
use syn::{File, Item};

/// Whether the items of the function's module (in its source file) hold a module named like it.
pub fn module_clashes(function: &Ident) -> bool {
    let Some(path) = proc_macro::Span::call_site().local_file() else {
        return false;
    };
    let Ok(text) = std::fs::read_to_string(&path) else {
        return false;
    };
    let Ok(file) = syn::parse_file(&text) else {
        return false;
    };
    clashes_in(&file, &function.to_string())
}

/// Whether any list of items in `file` holds both an annotated `fn <name>` and a `mod <name>`.
fn clashes_in(file: &File, name: &str) -> bool {
    fn walk(items: &[Item], name: &str) -> bool {
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
        // A module under a `cfg` may not exist when the tests do: the compiler judges those.
        let module = items.iter().any(|item| {
            matches!(item, Item::Mod(m) if m.ident == name
                && !m.attrs.iter().any(|a| a.path().is_ident("cfg")))
        });
        if annotated && module {
            return true;
        }
        items.iter().any(|item| match item {
            Item::Mod(m) => m
                .content
                .as_ref()
                .is_some_and(|(_, inner)| walk(inner, name)),
            _ => false,
        })
    }
    walk(&file.items, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_beside_the_annotated_function_clashes_one_elsewhere_does_not() {
        let file = |src: &str| syn::parse_file(src).unwrap();
        let clash = "pub mod gelu {} #[golden_layer(reference = \"m.f\")] fn gelu() {}";
        assert!(clashes_in(&file(clash), "gelu"));
        let nested =
            "mod ports { mod gelu {} #[golden::golden_layer(reference = \"m.f\")] fn gelu() {} }";
        assert!(clashes_in(&file(nested), "gelu"));
        let elsewhere =
            "mod gelu {} mod ports { #[golden_layer(reference = \"m.f\")] fn gelu() {} }";
        assert!(!clashes_in(&file(elsewhere), "gelu"));
        let plain = "mod gelu {} fn gelu() {}";
        assert!(!clashes_in(&file(plain), "gelu"));
        let gated =
            "#[cfg(feature = \"x\")] mod gelu {} #[golden_layer(reference = \"m.f\")] fn gelu() {}";
        assert!(!clashes_in(&file(gated), "gelu"));
    }
}
