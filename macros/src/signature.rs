//! What each parameter of the annotated function is: a tensor, the module form's `VarBuilder`, or a
//! plain value that `consts(...)`/`init(...)` must supply.

use syn::spanned::Spanned;
use syn::{Error, FnArg, Ident, ItemFn, Pat, Result, Type};

/// How the generated code passes a parameter.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `&Tensor` (`by_ref`) or `Tensor`.
    Tensor { by_ref: bool },
    /// `VarBuilder` or `&VarBuilder`: module form.
    VarBuilder { by_ref: bool },
    /// Anything else: a const or init value.
    Value,
}

pub struct Param {
    pub name: Ident,
    pub kind: Kind,
    pub ty: Type,
}

/// `Some(by_ref)` if `ty` is `name`, `&name` or a path ending in `name` (`candle_core::Tensor`).
fn is_type(ty: &Type, name: &str) -> Option<bool> {
    match ty {
        Type::Reference(r) => is_type(&r.elem, name)
            .filter(|by_ref| !by_ref)
            .map(|_| true),
        Type::Path(p) if p.qself.is_none() => {
            let last = p.path.segments.last()?;
            (last.ident == name).then_some(false)
        }
        Type::Paren(p) => is_type(&p.elem, name),
        Type::Group(g) => is_type(&g.elem, name),
        _ => None,
    }
}

/// Classify the parameters; rejects methods, generics and patterns the generated call cannot name.
pub fn params(item: &ItemFn) -> Result<Vec<Param>> {
    let sig = &item.sig;
    if let Some(generic) = sig.generics.params.first() {
        return Err(Error::new(
            generic.span(),
            "#[golden_layer] needs a concrete function: it calls it with candle tensors, so it \
             cannot be generic",
        ));
    }
    if sig.asyncness.is_some() {
        return Err(Error::new(
            sig.fn_token.span(),
            "#[golden_layer] does not support async functions",
        ));
    }
    let mut out = Vec::new();
    for input in &sig.inputs {
        let typed =
            match input {
                FnArg::Receiver(r) => return Err(Error::new(
                    r.span(),
                    "#[golden_layer] goes on a free function, not a method: the test module it \
                     generates cannot live inside an impl block",
                )),
                FnArg::Typed(t) => t,
            };
        let name =
            match &*typed.pat {
                Pat::Ident(p) if p.subpat.is_none() => p.ident.clone(),
                other => return Err(Error::new(
                    other.span(),
                    "#[golden_layer] needs a plain parameter name here (it matches parameters to \
                     `args(...)` and `consts(...)` by name)",
                )),
            };
        let ty = (*typed.ty).clone();
        let kind = if let Some(by_ref) = is_type(&ty, "Tensor") {
            Kind::Tensor { by_ref }
        } else if let Some(by_ref) = is_type(&ty, "VarBuilder") {
            Kind::VarBuilder { by_ref }
        } else {
            Kind::Value
        };
        out.push(Param { name, kind, ty });
    }
    Ok(out)
}

/// Whether the function is in the module form: a parameter is a `VarBuilder` (the first one, as
/// a rule checks).
pub fn module_form(params: &[Param]) -> bool {
    params
        .iter()
        .any(|p| matches!(p.kind, Kind::VarBuilder { .. }))
}
