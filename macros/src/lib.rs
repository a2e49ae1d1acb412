//! The `#[golden_layer(...)]` attribute of golden (the `golden` crate re-exports it: users write
//! `golden::golden_layer`).
//!
//! Three steps, each in its file, importing only the ones before it:
//!
//! 1. **parse** — the options' table (`options.rs`) dispatches each option to its grammar
//!    (`parse.rs`), which reads it into a plain description (`decl.rs`); the function's parameters
//!    are read by `signature.rs`;
//! 2. **validate** — named rules (`validate.rs`) judge the options together and against the
//!    signature, each returning its mistakes;
//! 3. **render** — `render.rs` emits the `#[cfg(test)] mod <fn_name> { #[test] fn
//!    matches_reference() }` that builds a `golden::Layer` and calls the runtime; it checks nothing.
//!
//! Every mistake of an attribute is reported at once, each at its span: a malformed option does
//! not stop the others from being read, and every rule runs. All logic that can live in a normal
//! function lives in the runtime. The annotated function is emitted unchanged, also when the
//! attribute has errors, so that the rest of the crate (and the IDE) keeps working.
//!
//! The attribute's manual is `golden_layer.md`, the rustdoc of [`golden_layer`] (shown on
//! `golden::golden_layer` too): its examples are doctested against the runtime, and its table of
//! options is the table of `options.rs` (a test keeps the two the same).

use proc_macro::TokenStream;

mod decl;
mod errors;
mod options;
mod parse;
mod render;
mod siblings;
mod signature;
mod validate;

#[doc = include_str!("../golden_layer.md")]
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
    // Its tests go in a module of its name: one already beside it, or paths beside it that start
    // with that name and mean a crate, are golden's error to name (the compiler's own, E0428 and
    // E0659, say nothing of golden or the fix).
    let name = &function.sig.ident;
    let clash = siblings::clash(name).map(|clash| {
        let what = match clash {
            siblings::Clash::Module => format!(
                "and this module already has a `mod {name}`: rename that module, or the function"
            ),
            siblings::Clash::Path(path) => format!(
                "and `{path}` in this module starts with that name: beside a module `{name}` it \
                 would mean that module, not the crate (under `cargo test`, rustc: \"`{name}` is \
                 ambiguous\"). Rename the function, or write such paths from the root \
                 (`::{name}::...`)"
            ),
        };
        syn::Error::new(
            name.span(),
            format!(
                "#[golden_layer] puts the tests of `fn {name}` in a module named `{name}` beside \
                 it (`{name}::matches_reference`), {what}"
            ),
        )
    });
    let mut out = item2;
    match expand(attr.into(), &function, clash) {
        Ok(tests) => out.extend(tests),
        Err(e) => out.extend(e.to_compile_error()),
    }
    out.into()
}

/// Parse, validate, render: the test module, or every mistake found.
fn expand(
    attr: proc_macro2::TokenStream,
    function: &syn::ItemFn,
    clash: Option<syn::Error>,
) -> syn::Result<proc_macro2::TokenStream> {
    let mut errors = errors::Errors::default();
    if let Some(e) = clash {
        errors.push_error(e);
    }
    let (attr, parse_errors) = options::parse(attr);
    errors.append(parse_errors);
    let params = signature::params(function)
        .map_err(|e| errors.push_error(e))
        .ok();
    let name = &function.sig.ident;
    errors.append(validate::validate(&attr, name, params.as_deref()));
    errors.finish()?;
    Ok(render::render(
        &attr,
        name,
        params.as_deref().unwrap_or(&[]),
    ))
}

#[cfg(test)]
mod tests {
    use quote::quote;

    #[test]
    fn the_parsers_and_the_rules_mistakes_come_out_together() {
        let function: syn::ItemFn = syn::parse_quote!(
            fn gelu(x: &Tensor) -> Result<Tensor> {
                x.gelu_erf()
            }
        );
        let attr = quote!(
            reference = "zoo_ref.gelu",
            tolerance = 1e-3,
            dims(n = 1..=8),
            args(x = [n]),
            dtype = f32,
            dtypes = [f64],
        );
        let error = super::expand(attr, &function, None).unwrap_err();
        let messages: Vec<String> = error.into_iter().map(|e| e.to_string()).collect();
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages[0].starts_with("unknown option `tolerance`"));
        assert!(messages[1].starts_with("`dtype` and `dtypes` both say"));
    }

    #[test]
    fn a_valid_attribute_renders_its_test_module() {
        let function: syn::ItemFn = syn::parse_quote!(
            fn gelu(x: &Tensor) -> Result<Tensor> {
                x.gelu_erf()
            }
        );
        let attr = quote!(reference = "zoo_ref.gelu", dims(n = 1..=8), args(x = [n]));
        let tokens = super::expand(attr, &function, None).unwrap().to_string();
        assert!(tokens.starts_with("# [cfg (test)] mod gelu"), "{tokens}");
        assert!(tokens.contains("fn matches_reference"));
        assert!(
            !tokens.contains("fn gradients"),
            "no `grad`, no gradient test"
        );
    }
}
