//! The `#[golden_layer(...)]` attribute of [golden](https://docs.rs/golden).
//!
//! It parses the attribute (`parse.rs`), reads the function's parameters (`signature.rs`) and emits a
//! `#[cfg(test)] mod <fn_name> { #[test] fn matches_reference() }` that builds a `golden::Layer` and
//! calls the runtime (`render.rs`). All logic that can live in a normal function lives in the
//! runtime. The annotated function is emitted unchanged, also when the attribute has errors, so
//! that the rest of the crate (and the IDE) keeps working.

use proc_macro::TokenStream;

mod parse;
mod render;
mod siblings;
mod signature;

/// Check a Rust port against its PyTorch reference. See the book's chapter on the attribute
/// (docs/src/attribute.md) for the options:
/// `reference`, `backend`, `dims`, `args`, `consts`, `init`, `dtype`/`dtypes`, `tol`, `cases`.
#[proc_macro_attribute]
pub fn golden_layer(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item2 = proc_macro2::TokenStream::from(item.clone());
    let function: syn::ItemFn = match syn::parse(item) {
        Ok(f) => f,
        Err(e) => {
            let mut out = e.to_compile_error();
            out.extend(item2);
            return out.into();
        }
    };
    // Its tests go in a module of its name: one already beside it is golden's error to name
    // (the compiler's own, E0428, says nothing of golden or the fix).
    let clash = siblings::module_clashes(&function.sig.ident).then(|| {
        let name = &function.sig.ident;
        syn::Error::new(
            name.span(),
            format!(
                "#[golden_layer] puts the tests of `fn {name}` in a module named `{name}` beside \
                 it (`{name}::matches_reference`), and this module already has a `mod {name}`: \
                 rename that module, or the function"
            ),
        )
    });
    let expanded = match clash {
        Some(e) => Err(e),
        None => syn::parse::<parse::Attr>(attr).and_then(|attr| render::expand(&attr, &function)),
    };
    let mut out = item2;
    match expanded {
        Ok(tests) => out.extend(tests),
        Err(e) => out.extend(e.to_compile_error()),
    }
    out.into()
}
