//! Checking the attribute against the signature and emitting the test module: a `golden::Layer`
//! built from the attribute, a closure calling the function, and the snapshot assertion (which must
//! be expanded here, in the user's crate, for insta to file it under the user's test).

use crate::parse::{
    ArgDecl, Attr, Axis, BoundDecl, DimValueDecl, DistDecl, GradDecl, InvariantDecl, KeyValue,
    OverfitDecl, ValueDecl, WrtName,
};
use crate::signature::{self, Kind, Param};
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Error, Ident, ItemFn, Result};

/// Collects errors so that the user sees all of them at once.
#[derive(Default)]
struct Errors(Option<Error>);

impl Errors {
    fn push(&mut self, span: Span, msg: impl std::fmt::Display) {
        let e = Error::new(span, msg);
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }
    fn finish(self) -> Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

pub(crate) fn dim_value_expr(e: &DimValueDecl) -> TokenStream {
    match e {
        DimValueDecl::Dim(d) => {
            let d = d.to_string();
            quote!(::golden::DimValue::Dim(::std::string::String::from(#d)))
        }
        DimValueDecl::Lit(n) => quote!(::golden::DimValue::Lit(#n)),
        DimValueDecl::Op(op, a, b) => {
            let (a, b) = (dim_value_expr(a), dim_value_expr(b));
            let variant = match op {
                '+' => quote!(Add),
                '-' => quote!(Sub),
                '/' => quote!(Div),
                _ => quote!(Mul),
            };
            quote!(::golden::DimValue::#variant(::std::boxed::Box::new(#a), ::std::boxed::Box::new(#b)))
        }
    }
}

fn value_expr(v: &ValueDecl) -> TokenStream {
    match v {
        ValueDecl::Int(t) => quote!(::golden::Value::Int((#t) as i64)),
        ValueDecl::Float(t) => quote!(::golden::Value::Float((#t) as f64)),
        ValueDecl::Bool(t) => quote!(::golden::Value::Bool(#t)),
        ValueDecl::Str(s) => quote!(::golden::Value::Str(::std::string::String::from(#s))),
        ValueDecl::List(items) => {
            let items = items.iter().map(value_expr);
            quote!(::golden::Value::List(::std::vec![#(#items),*]))
        }
        ValueDecl::Dict(items) => {
            let items = items.iter().map(|(k, v)| {
                let v = value_expr(v);
                quote!((::std::string::String::from(#k), #v))
            });
            quote!(::golden::Value::Dict(::std::vec![#(#items),*]))
        }
        ValueDecl::None => quote!(::golden::Value::None),
        ValueDecl::Dims(e) => {
            let e = dim_value_expr(e);
            quote!(::golden::Value::Dims(#e))
        }
        ValueDecl::OneOf(_, items) => {
            let items = items.iter().map(value_expr);
            quote!(::golden::Value::OneOf(::std::vec![#(#items),*]))
        }
        ValueDecl::Range(lo, hi, _) => quote!(::golden::Value::Range(#lo, #hi)),
    }
}

/// An integer expression of dims as Rust, in i64, the case's dims read from the port's inputs.
fn dim_value_tokens(e: &DimValueDecl) -> TokenStream {
    match e {
        DimValueDecl::Dim(d) => {
            let name = d.to_string();
            quote_spanned!(d.span()=> (__golden_inputs.dim(#name) as i64))
        }
        DimValueDecl::Lit(n) => quote!((#n as i64)),
        DimValueDecl::Op(op, a, b) => {
            let (a, b) = (dim_value_tokens(a), dim_value_tokens(b));
            match op {
                '+' => quote!((#a + #b)),
                '-' => quote!((#a - #b)),
                '/' => quote!((#a).checked_div(#b).unwrap_or(0)),
                _ => quote!((#a * #b)),
            }
        }
    }
}

/// The value of keyword `name` as a Rust expression for the call (a list becomes an array literal,
/// a dim expression its value in the case, `None` `Option::None`; a sweep the case's pick, matched
/// on, each alternative in `Some` when one of them is `None`); `None` for a dict, which no Rust
/// parameter takes.
fn value_tokens(name: &str, v: &ValueDecl) -> Option<TokenStream> {
    Some(match v {
        ValueDecl::Int(t) | ValueDecl::Float(t) | ValueDecl::Bool(t) => t.clone(),
        ValueDecl::Str(s) => quote!(#s),
        ValueDecl::List(items) => {
            let items = items
                .iter()
                .map(|v| value_tokens(name, v))
                .collect::<Option<Vec<_>>>()?;
            quote!([#(#items),*])
        }
        ValueDecl::Dict(..) => return None,
        ValueDecl::None => quote!(::std::option::Option::None),
        ValueDecl::Dims(e) => {
            let e = dim_value_tokens(e);
            quote!((#e as _))
        }
        ValueDecl::OneOf(_, items) => {
            let optional = items.iter().any(|v| matches!(v, ValueDecl::None));
            let arms = items
                .iter()
                .map(|v| {
                    let t = value_tokens(name, v)?;
                    Some(match v {
                        ValueDecl::None => t,
                        _ if optional => quote!(::std::option::Option::Some(#t)),
                        _ => t,
                    })
                })
                .collect::<Option<Vec<_>>>()?;
            let (last, first) = arms.split_last().expect("one_of has a value");
            let indices = 0..first.len();
            quote!(match __golden_inputs.pick(#name) {
                #(#indices => #first,)*
                _ => #last,
            })
        }
        ValueDecl::Range(lo, _, _) => {
            quote!(((#lo + __golden_inputs.pick(#name) as i64) as _))
        }
    })
}

fn dist_expr(d: &Option<DistDecl>) -> TokenStream {
    let bound = |b: &BoundDecl| match b {
        BoundDecl::Lit(n) => quote!(::golden::Bound::Lit(#n)),
        BoundDecl::Dim(d) => {
            let d = d.to_string();
            quote!(::golden::Bound::Dim(::std::string::String::from(#d)))
        }
    };
    match d {
        None => quote!(::golden::Dist::Normal {
            mean: 0.0,
            std: 1.0
        }),
        Some(DistDecl::Normal(mean, std)) => {
            quote!(::golden::Dist::Normal { mean: #mean, std: #std })
        }
        Some(DistDecl::Uniform(lo, hi)) => quote!(::golden::Dist::Uniform { lo: #lo, hi: #hi }),
        Some(DistDecl::Int(lo, hi)) => {
            let (lo, hi) = (bound(lo), bound(hi));
            quote!(::golden::Dist::Int { lo: #lo, hi: #hi })
        }
        Some(DistDecl::Bool) => quote!(::golden::Dist::Bool),
        Some(DistDecl::Positions(None)) => {
            quote!(::golden::Dist::Positions {
                max: ::std::option::Option::None
            })
        }
        Some(DistDecl::Positions(Some(max))) => {
            let max = bound(max);
            quote!(::golden::Dist::Positions { max: ::std::option::Option::Some(#max) })
        }
    }
}

/// `package.module.name`: at least two identifiers joined by dots.
fn dotted_path(path: &str) -> bool {
    let parts: Vec<&str> = path.split('.').collect();
    parts.len() >= 2
        && parts.iter().all(|p| {
            let mut chars = p.chars();
            chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
                && chars.all(|c| c.is_alphanumeric() || c == '_')
        })
}

fn check_reference(attr: &Attr, errors: &mut Errors) -> Option<String> {
    let Some(reference) = &attr.reference else {
        errors.push(
            Span::call_site(),
            "missing `reference = \"package.module.callable\"`: the Python function or nn.Module \
             class this layer ports",
        );
        return None;
    };
    let path = reference.value();
    if !dotted_path(&path) {
        errors.push(
            reference.span(),
            format!("`{path}` is not a dotted Python path like `package.module.callable`"),
        );
    }
    Some(path)
}

fn check_dims_and_args(attr: &Attr, params: &[Param], fn_name: &Ident, errors: &mut Errors) {
    let dim_names: Vec<String> = attr.dims.iter().map(|d| d.name.to_string()).collect();
    for (i, d) in attr.dims.iter().enumerate() {
        if dim_names[..i].contains(&dim_names[i]) {
            errors.push(d.name.span(), format!("dim `{}` is declared twice", d.name));
        }
    }
    let known = if dim_names.is_empty() {
        "no dims are declared: add `dims(name = lo..=hi, ...)`".to_string()
    } else {
        format!("declared dims: {}", dim_names.join(", "))
    };
    let unknown_dim = |ident: &Ident, errors: &mut Errors| {
        if !dim_names.contains(&ident.to_string()) {
            errors.push(ident.span(), format!("unknown dim `{ident}` ({known})"));
        }
    };
    let valued = attr
        .consts
        .iter()
        .chain(&attr.init)
        .chain(attr.config.iter().flat_map(|c| &c.values));
    for kv in valued {
        for ident in kv.value.dims() {
            unknown_dim(ident, errors);
        }
    }
    for (i, arg) in attr.args.iter().enumerate() {
        let name = arg.name.to_string();
        if attr.args[..i].iter().any(|a| a.name == arg.name) {
            errors.push(
                arg.name.span(),
                format!("`{name}` has two shapes in `args(...)`"),
            );
        }
        match params.iter().find(|p| p.name == arg.name) {
            // With a schedule, the tensors are the steps' (`step.input("input_ids")`).
            None if attr.decode.is_some() => {}
            Some(_) if attr.decode.is_some() => errors.push(
                arg.name.span(),
                format!(
                    "with `decode`, the function builds the model and each step gets the tensors \
                     (`step.input(\"{name}\")`): drop the parameter `{name}`"
                ),
            ),
            None => errors.push(
                arg.name.span(),
                format!("`args` gives a shape for `{name}`, but `fn {fn_name}` has no parameter `{name}`"),
            ),
            Some(p) if !matches!(p.kind, Kind::Tensor { .. }) => errors.push(
                arg.name.span(),
                format!("`{name}` is not a tensor parameter (`&Tensor`); give it a value in `consts(...)`"),
            ),
            Some(_) => {}
        }
        for axis in &arg.shape {
            match axis {
                Axis::Sym(ident) => unknown_dim(ident, errors),
                Axis::Expr(e) => e.dims().into_iter().for_each(|i| unknown_dim(i, errors)),
                Axis::Lit(_) => {}
            }
        }
        if let Some(DistDecl::Int(lo, hi)) = &arg.dist {
            for b in [lo, hi] {
                if let BoundDecl::Dim(ident) = b {
                    unknown_dim(ident, errors);
                }
            }
        }
        if let Some(DistDecl::Positions(Some(BoundDecl::Dim(ident)))) = &arg.dist {
            unknown_dim(ident, errors);
        }
        let has_max = attr
            .init
            .iter()
            .chain(attr.config.iter().flat_map(|c| &c.values))
            .any(|kv| kv.name == "max_position_embeddings" || kv.name == "n_positions");
        if matches!(arg.dist, Some(DistDecl::Positions(None))) && !has_max {
            errors.push(
                arg.name.span(),
                format!(
                    "`{name} ~ positions` draws up to the module's max_position_embeddings, and \
                     neither `config` nor `init` gives one: write `positions(N)`"
                ),
            );
        }
    }
}

/// Swept values (`one_of(...)`, `lo..=hi`): well formed (at the top of a value, not empty), each
/// keyword swept once and not named like a dim, and enough cases to try each of their values.
fn check_sweeps(attr: &Attr, errors: &mut Errors) {
    let all: Vec<&KeyValue> = attr
        .consts
        .iter()
        .chain(&attr.init)
        .chain(attr.config.iter().flat_map(|c| &c.values))
        .collect();
    // A sweep inside a list, a dict or another one_of.
    fn nested(v: &ValueDecl, errors: &mut Errors) {
        let inner: &[ValueDecl] = match v {
            ValueDecl::List(items) | ValueDecl::OneOf(_, items) => items,
            ValueDecl::Dict(items) => {
                for (_, v) in items {
                    misplaced(v, errors);
                    nested(v, errors);
                }
                return;
            }
            _ => return,
        };
        for v in inner {
            misplaced(v, errors);
            nested(v, errors);
        }
    }
    fn misplaced(v: &ValueDecl, errors: &mut Errors) {
        match v {
            ValueDecl::OneOf(key, _) => errors.push(
                key.span(),
                "`one_of(...)` goes at the top of a value (`key = one_of(a, b)`), not inside a \
                 list, a dict or another `one_of`",
            ),
            ValueDecl::Range(_, _, span) => errors.push(
                *span,
                "a range of values (`lo..=hi`) goes at the top of a value, not inside a list, a \
                 dict or a `one_of`",
            ),
            _ => {}
        }
    }
    for kv in &all {
        nested(&kv.value, errors);
        if kv.value.divides_by_zero() {
            errors.push(
                kv.name.span(),
                format!("`{}` divides by 0 (`/ 0`)", kv.name),
            );
        }
        match &kv.value {
            ValueDecl::OneOf(key, items) if items.is_empty() => errors.push(
                key.span(),
                "`one_of()` needs at least one value: `one_of(None, 30.0)`",
            ),
            ValueDecl::Range(lo, hi, span) if hi < lo => {
                errors.push(*span, format!("`{lo}..={hi}` is an empty range"))
            }
            _ => {}
        }
    }
    let swept: Vec<&&KeyValue> = all
        .iter()
        .filter(|kv| matches!(kv.value, ValueDecl::OneOf(..) | ValueDecl::Range(..)))
        .collect();
    for (i, kv) in swept.iter().enumerate() {
        if swept[..i].iter().any(|o| o.name == kv.name) {
            errors.push(
                kv.name.span(),
                format!("`{}` is swept twice: sweep it in one place", kv.name),
            );
        }
        if attr.dims.iter().any(|d| d.name == kv.name) {
            errors.push(
                kv.name.span(),
                format!(
                    "`{}` is both a dim and a swept value: rename one (a case names both)",
                    kv.name
                ),
            );
        }
    }
    let cases = attr.cases.unwrap_or(32) as usize;
    for kv in &swept {
        let needed = match &kv.value {
            ValueDecl::OneOf(_, items) => items.len(),
            ValueDecl::Range(lo, hi, _) => 1 + usize::from(hi > lo),
            _ => 0,
        };
        if needed > cases {
            errors.push(
                kv.name.span(),
                format!(
                    "`cases = {cases}` cannot try each of the {needed} values of `{}`: give \
                     `cases = {needed}` or more",
                    kv.name
                ),
            );
        }
    }
}

/// The invariants there are, for errors.
const KNOWN_INVARIANTS: &str =
    "expected `finite`, `non_negative`, `sums_to_one(dim = N)` or `range(lo, hi)`";

/// `invariants(...)`: each invariant known and well formed, each leaf once; the builder calls.
fn invariant_calls(attr: &Attr, errors: &mut Errors) -> Vec<TokenStream> {
    let Some(decl) = &attr.invariants else {
        return Vec::new();
    };
    let mut calls = Vec::new();
    for (i, (leaf, span, list)) in decl.leaves.iter().enumerate() {
        if decl.leaves[..i].iter().any(|(l, _, _)| l == leaf) {
            errors.push(
                *span,
                format!("`{leaf}` is given twice in `invariants(...)`"),
            );
        }
        if list.is_empty() {
            errors.push(
                *span,
                format!("no invariant for `{leaf}`: {KNOWN_INVARIANTS}"),
            );
        }
        for inv in list {
            if let Some(tokens) = invariant_tokens(inv, errors) {
                calls.push(quote!(.invariant(#leaf, #tokens)));
            }
        }
    }
    if decl.leaves.is_empty() {
        errors.push(
            decl.key.span(),
            "`invariants(...)` names no output: `invariants(out = [finite])`",
        );
    }
    calls
}

/// One invariant as a `golden::Invariant`, or its errors.
fn invariant_tokens(inv: &InvariantDecl, errors: &mut Errors) -> Option<TokenStream> {
    let name = inv.name.to_string();
    let args = inv.args.as_deref().unwrap_or(&[]);
    let no_args = |errors: &mut Errors| {
        if inv.args.is_some() {
            errors.push(inv.name.span(), format!("`{name}` takes no arguments"));
        }
    };
    match name.as_str() {
        "finite" => {
            no_args(errors);
            Some(quote!(::golden::Invariant::Finite))
        }
        "non_negative" => {
            no_args(errors);
            Some(quote!(::golden::Invariant::NonNegative))
        }
        "sums_to_one" => {
            let (mut dim, mut tol) = (-1i64, None);
            for (key, value, span) in args {
                match key.as_ref().map(ToString::to_string).as_deref() {
                    Some("dim") if value.fract() == 0.0 => dim = *value as i64,
                    Some("dim") => errors.push(*span, "`dim` is a whole number: `dim = -1`"),
                    Some("tol") if *value >= 0.0 => tol = Some(*value),
                    Some("tol") => errors.push(*span, "`tol` must not be negative"),
                    _ => errors.push(
                        *span,
                        "`sums_to_one` takes `dim = N` (default -1) and `tol = x`: \
                         `sums_to_one(dim = -1)`",
                    ),
                }
            }
            let tol = match tol {
                Some(t) => quote!(::std::option::Option::Some(#t)),
                None => quote!(::std::option::Option::None),
            };
            Some(quote!(::golden::Invariant::SumsToOne { dim: #dim, tol: #tol }))
        }
        "range" => match args {
            [(None, lo, _), (None, hi, span)] => {
                if lo > hi {
                    errors.push(*span, format!("`range({lo:?}, {hi:?})` is empty"));
                }
                Some(quote!(::golden::Invariant::Range { lo: #lo, hi: #hi }))
            }
            _ => {
                errors.push(
                    inv.name.span(),
                    "`range` takes two numbers, its lowest and highest values: `range(-10.0, 10.0)`",
                );
                None
            }
        },
        _ => {
            errors.push(
                inv.name.span(),
                format!("unknown invariant `{name}`; {KNOWN_INVARIANTS}"),
            );
            None
        }
    }
}

/// The arguments of the generated call, in signature order; errors for parameters nothing feeds.
fn call_args(attr: &Attr, params: &[Param], errors: &mut Errors) -> (Vec<TokenStream>, bool) {
    let mut module_form = false;
    let mut tensor_index = 0usize;
    let mut out = Vec::new();
    for (position, p) in params.iter().enumerate() {
        let name = p.name.to_string();
        let span = p.ty.span();
        let tokens = match p.kind {
            Kind::Tensor { by_ref } => {
                if !attr.args.iter().any(|a| a.name == p.name) && attr.decode.is_none() {
                    errors.push(
                        p.name.span(),
                        format!(
                            "tensor parameter `{name}` needs a shape: add `{name} = [...]` to `args(...)`"
                        ),
                    );
                }
                // The tensors are passed in the order of `attr.args`, sorted to signature order below.
                let i = tensor_index;
                tensor_index += 1;
                if by_ref {
                    quote_spanned!(span=> __golden_inputs.tensor(#i))
                } else {
                    quote_spanned!(span=> ::std::clone::Clone::clone(__golden_inputs.tensor(#i)))
                }
            }
            Kind::VarBuilder { by_ref } => {
                if position != 0 {
                    errors.push(
                        span,
                        "the VarBuilder must be the first parameter (module form)",
                    );
                }
                module_form = true;
                if by_ref {
                    quote_spanned!(span=> &__golden_inputs.var_builder())
                } else {
                    quote_spanned!(span=> __golden_inputs.var_builder())
                }
            }
            Kind::Value => {
                let found = attr
                    .consts
                    .iter()
                    .chain(attr.init.iter())
                    .chain(attr.config.iter().flat_map(|c| &c.values))
                    .find(|kv| kv.name == p.name);
                match found {
                    Some(kv) => match value_tokens(&name, &kv.value) {
                        Some(tokens) => tokens,
                        None => {
                            errors.push(
                                p.name.span(),
                                format!(
                                    "`{name}` is a dict in the attribute, which no Rust parameter \
                                     takes: give the port what it needs from it as separate \
                                     parameters, or rename this one"
                                ),
                            );
                            quote!(::std::unreachable!())
                        }
                    },
                    // A parameter named as a dim gets the case's size of that dim; in a step loop,
                    // `step` gets the step's index.
                    None if attr.dims.iter().any(|d| d.name == p.name)
                        || (attr.steps.is_some() && name == "step") =>
                    {
                        quote_spanned!(span=> (__golden_inputs.dim(#name) as _))
                    }
                    None => {
                        errors.push(
                            p.name.span(),
                            format!(
                                "parameter `{name}` needs a value: name it as a dim of `dims(...)`, \
                                 add `{name} = ...` to `consts(...)`{}, \
                                 or make it a tensor (`&Tensor`) with a shape in `args(...)`",
                                if module_form { ", `init(...)` or `config = \"...\"(...)`" } else { "" }
                            ),
                        );
                        quote!(::std::unreachable!())
                    }
                }
            }
        };
        out.push(tokens);
    }
    (out, module_form)
}

fn dtype_tokens(ident: &Ident, errors: &mut Errors) -> TokenStream {
    let variant = match ident.to_string().as_str() {
        "f32" => quote!(F32),
        "f64" => quote!(F64),
        "f16" => quote!(F16),
        "bf16" => quote!(BF16),
        other => {
            errors.push(
                ident.span(),
                format!("unknown dtype `{other}`; expected f32, f64, f16 or bf16"),
            );
            quote!(F32)
        }
    };
    quote!(::golden::__private::candle_core::DType::#variant)
}

fn key_values(method: &str, kvs: &[KeyValue]) -> Vec<TokenStream> {
    let method = Ident::new(method, Span::call_site());
    kvs.iter()
        .map(|kv| {
            let name = kv.name.to_string();
            let value = value_expr(&kv.value);
            quote!(.#method(#name, #value))
        })
        .collect()
}

/// Check everything and emit the `#[cfg(test)]` module.
pub fn expand(attr: &Attr, item: &ItemFn) -> Result<TokenStream> {
    let params = signature::params(item)?;
    let fn_name = &item.sig.ident;
    let mut errors = Errors::default();
    let reference = check_reference(attr, &mut errors);
    check_dims_and_args(attr, &params, fn_name, &mut errors);
    let (call, module_form) = call_args(attr, &params, &mut errors);
    for name in attr.grad.iter().flat_map(|g| g.wrt.iter().flatten()) {
        match name {
            WrtName::Arg(ident) => {
                let is_tensor = params
                    .iter()
                    .any(|p| p.name == *ident && matches!(p.kind, Kind::Tensor { .. }));
                if !is_tensor {
                    errors.push(
                        ident.span(),
                        format!(
                            "`grad(wrt = [...])` names `{ident}`, which is not a tensor parameter; \
                             name module parameters as strings (\"fc1.weight\")"
                        ),
                    );
                }
            }
            WrtName::Param(lit) if !module_form => errors.push(
                lit.span(),
                "parameters (strings in `wrt`) exist in the module form only",
            ),
            WrtName::Param(_) => {}
        }
    }
    check_sweeps(attr, &mut errors);
    let invariants = invariant_calls(attr, &mut errors);
    if let Some(t) = attr.trace.as_ref().filter(|_| !module_form) {
        errors.push(
            t.span(),
            "`trace` compares the port's taps with the reference module's submodules: it needs the \
             module form, whose first parameter is a `VarBuilder`",
        );
    }
    for (key, what) in [
        (attr.params.as_ref().map(|p| &p.0), "`params`"),
        (attr.weights.as_ref().map(|w| &w.0), "`weights`"),
        (attr.rename.as_ref().map(|r| &r.0), "`rename`"),
    ] {
        if let Some(key) = key.filter(|_| !module_form) {
            errors.push(
                key.span(),
                format!(
                    "{what} is about the reference module's parameters: it needs the module form, \
                     whose first parameter is a `VarBuilder`"
                ),
            );
        }
    }
    if let (Some((key, _)), Some(_)) = (&attr.weights, &attr.params) {
        errors.push(
            key.span(),
            "`weights` and `params` both say where the parameters come from: give one",
        );
    }
    if let Some(o) = attr.overfit.as_ref().filter(|_| !module_form) {
        errors.push(
            o.key.span(),
            "`overfit` trains a module: it needs the module form, whose first parameter is a \
             `VarBuilder`",
        );
    }
    if let Some(config) = &attr.config {
        if !module_form {
            errors.push(
                config.key.span(),
                "`config` builds the reference nn.Module from a configuration class; it needs the \
                 module form, whose first parameter is a `VarBuilder`",
            );
        }
        let class = config.class.value();
        if !dotted_path(&class) {
            errors.push(
                config.class.span(),
                format!("`{class}` is not a dotted Python path like `transformers.LlamaConfig`"),
            );
        }
        for (i, kv) in config.values.iter().enumerate() {
            if config.values[..i].iter().any(|o| o.name == kv.name) {
                errors.push(kv.name.span(), format!("`{}` is given twice", kv.name));
            }
        }
    }
    if let Some(d) = attr.decode.as_ref().filter(|_| !module_form) {
        errors.push(
            d.key.span(),
            "`decode` drives a module through time: it needs the module form, whose first \
             parameter is a `VarBuilder` (the function builds the model and returns a stepper)",
        );
    }
    if let Some(d) = &attr.decode {
        let over = d.over.as_ref().or(attr.args.first().map(|a| &a.name));
        match over {
            None => errors.push(
                d.key.span(),
                "`decode` splits a sequence argument into steps: declare it in `args(...)`",
            ),
            Some(over) if !attr.args.iter().any(|a| a.name == *over) => errors.push(
                over.span(),
                format!("`decode(over = {over})`: `{over}` has no shape in `args(...)`"),
            ),
            Some(_) => {}
        }
    }
    if !module_form && !attr.init.is_empty() {
        errors.push(
            attr.init[0].name.span(),
            "`init(...)` configures the reference nn.Module; it needs the module form, whose first \
             parameter is a `VarBuilder`",
        );
    }
    let backend = match attr.backend.as_ref().map(|b| (b.value(), b.span())) {
        None => quote!(::golden::Backend::Torch),
        Some((b, _)) if b == "torch" => quote!(::golden::Backend::Torch),
        Some((b, _)) if b == "numpy" => quote!(::golden::Backend::Numpy),
        Some((b, span)) => {
            errors.push(
                span,
                format!("unknown backend `{b}`; expected \"torch\" or \"numpy\""),
            );
            quote!(::golden::Backend::Torch)
        }
    };
    if module_form && attr.backend.as_ref().is_some_and(|b| b.value() == "numpy") {
        errors.push(
            attr.backend.as_ref().unwrap().span(),
            "the module form needs the torch backend (its reference is an nn.Module)",
        );
    }
    let dtypes: Vec<TokenStream> = match &attr.dtypes {
        Some((_, list)) => list.iter().map(|d| dtype_tokens(d, &mut errors)).collect(),
        None => vec![quote!(::golden::__private::candle_core::DType::F32)],
    };
    if let (Some(s), Some(_)) = (&attr.steps, &attr.decode) {
        errors.push(
            s.key.span(),
            "`steps` and `decode` both drive the layer through time: give one",
        );
    }
    if let Some(s) = &attr.steps {
        if !attr.dims.iter().any(|d| d.name == s.over) {
            errors.push(
                s.over.span(),
                format!(
                    "`steps(over = {})`: the loop has as many steps as a dim, and `{}` is not one \
                     of `dims(...)`",
                    s.over, s.over
                ),
            );
        }
        for (arg, _) in &s.carry {
            if !attr.args.iter().any(|a| a.name == *arg) {
                errors.push(
                    arg.span(),
                    format!("`carry({arg} = ..)`: `{arg}` has no shape in `args(...)`"),
                );
            }
        }
    }
    errors.finish()?;

    // Tensors reach the reference in signature order: sort the declared shapes that way.
    let mut args: Vec<&ArgDecl> = attr.args.iter().collect();
    args.sort_by_key(|a| params.iter().position(|p| p.name == a.name));
    let arg_calls = args.iter().map(|a| {
        let name = a.name.to_string();
        let shape = &a.shape;
        let dist = dist_expr(&a.dist);
        quote!(.arg(#name, ::std::vec::Vec::<::golden::DimExpr>::from([#(#shape),*]), #dist))
    });
    let dim_calls = attr.dims.iter().map(|d| {
        let (name, lo, hi) = (d.name.to_string(), d.lo, d.hi);
        quote!(.dim(#name, #lo, #hi))
    });
    let consts = key_values("konst", &attr.consts);
    let init = key_values("init", &attr.init);
    let config = attr.config.as_ref().map(|c| {
        let class = c.class.value();
        let values = key_values("config_value", &c.values);
        quote!(.config(#class) #(#values)*)
    });
    let constructor = if module_form {
        quote!(module)
    } else {
        quote!(function)
    };
    let tol = attr.tol.map(|(atol, rtol)| quote!(.tol(#atol, #rtol)));
    let cases = attr.cases.map(|n| quote!(.cases(#n)));
    let timeout = attr.timeout.map(|s| quote!(.timeout(#s)));
    let trace = attr.trace.as_ref().map(|_| quote!(.trace()));
    let params = attr
        .params
        .as_ref()
        .and_then(|(_, how)| match how.to_string().as_str() {
            "init" => Some(quote!(.params_init())),
            "drawn_all" => Some(quote!(.params_drawn_all())),
            _ => None,
        });
    let weights = attr
        .weights
        .as_ref()
        .map(|(_, path)| quote!(.weights(#path)));
    let rename = attr
        .rename
        .iter()
        .flat_map(|(_, pairs)| pairs)
        .map(|(from, to)| quote!(.rename(#from, #to)));
    let name = fn_name.to_string();
    let reference = reference.unwrap_or_default();
    let decode = attr.decode.as_ref().map(|d| {
        let over = d
            .over
            .as_ref()
            .or(attr.args.first().map(|a| &a.name))
            .map(ToString::to_string)
            .unwrap_or_default();
        let axis = d.axis.unwrap_or(1);
        let padding = d.padding;
        let generate = d.generate.unwrap_or(0);
        let window = match d.window {
            Some(w) => quote!(::std::option::Option::Some(#w)),
            None => quote!(::std::option::Option::None),
        };
        quote!(.decode(::golden::Decode {
            over: ::std::string::String::from(#over),
            axis: #axis,
            padding: #padding,
            generate: #generate,
            window: #window,
        }))
    });
    let steps = attr.steps.as_ref().map(|s| {
        let over = s.over.to_string();
        let carry = s.carry.iter().map(|(arg, leaf)| {
            let arg = arg.to_string();
            quote!((::std::string::String::from(#arg), ::std::string::String::from(#leaf)))
        });
        quote!(.steps(::golden::StepLoop {
            over: ::std::string::String::from(#over),
            carry: ::std::vec![#(#carry),*],
        }))
    });
    let port_body = if attr.decode.is_some() {
        quote!(::golden::drive(__golden_inputs, |__golden_inputs| {
            ::golden::IntoStepper::into_stepper(super::#fn_name(#(#call),*))
        }))
    } else {
        quote!(::golden::IntoOutputs::into_outputs(super::#fn_name(#(#call),*)))
    };

    let grad_spec = attr.grad.as_ref().map(grad_spec);
    let grad_test = attr.grad.as_ref().map(|_| {
        quote! {
            #[test]
            fn gradients() {
                snapshot(&::golden::__private::passed(::golden::check_gradients(&layer(), &port)));
            }
        }
    });

    let overfit_spec = attr.overfit.as_ref().map(overfit_spec);
    let overfit_test = attr.overfit.as_ref().map(|_| {
        quote! {
            #[test]
            fn overfits_single_batch() {
                snapshot(&::golden::__private::passed(::golden::check_overfit(&layer(), &port)));
            }
        }
    });

    Ok(quote! {
        #[cfg(test)]
        mod #fn_name {
            fn layer() -> ::golden::Layer {
                ::golden::Layer::#constructor(#name, #reference)
                    .declared_at(::golden::declared!())
                    .backend(#backend)
                    #(#dim_calls)*
                    #(#arg_calls)*
                    #(#consts)*
                    #(#init)*
                    #config
                    .dtypes(&[#(#dtypes),*])
                    #tol
                    #cases
                    #timeout
                    #trace
                    #params
                    #weights
                    #(#rename)*
                    #decode
                    #steps
                    #(#invariants)*
                    #grad_spec
                    #overfit_spec
            }

            fn port(
                __golden_inputs: &::golden::PortInputs,
            ) -> ::std::result::Result<::golden::Outputs, ::std::string::String> {
                #port_body
            }

            /// The snapshot assertion must expand here, in the crate under test, for insta to file
            /// it under this crate.
            fn snapshot(report: &::golden::Report) {
                match report.snapshot() {
                    ::std::option::Option::Some(text)
                        if ::golden::__private::first_snapshot(report, &text) => {}
                    ::std::option::Option::Some(text) => {
                        let mut settings = ::golden::__private::insta::Settings::clone_current();
                        settings.set_snapshot_path(report.layer.declared.unwrap().snapshot_dir);
                        settings.set_prepend_module_to_snapshot(false);
                        settings.set_omit_expression(true);
                        settings.set_comparator(::std::boxed::Box::new(
                            ::golden::__private::SnapshotComparator,
                        ));
                        settings.bind(|| {
                            ::golden::__private::insta::assert_snapshot!(report.snapshot_name(), text);
                        });
                    }
                    ::std::option::Option::None => ::golden::__private::skipped_snapshot(report),
                }
            }

            #[test]
            fn matches_reference() {
                snapshot(&::golden::__private::passed(::golden::check(&layer(), &port)));
            }

            #grad_test
            #overfit_test
        }
    })
}

fn overfit_spec(o: &OverfitDecl) -> TokenStream {
    let lr = match o.lr {
        Some(lr) => quote!(::std::option::Option::Some(#lr)),
        None => quote!(::std::option::Option::None),
    };
    let optimizer = match o.optimizer.as_ref().map(Ident::to_string).as_deref() {
        Some("sgd") => quote!(optimizer: ::golden::Optimizer::sgd(#lr),),
        Some(_) => quote!(optimizer: ::golden::Optimizer::adamw(#lr),),
        None if o.lr.is_some() => quote!(optimizer: ::golden::Optimizer::adamw(#lr),),
        None => quote!(),
    };
    let loss = o.loss.as_ref().map(|l| {
        if l == "mse" {
            quote!(loss: ::golden::Loss::Mse,)
        } else {
            quote!(loss: ::golden::Loss::CrossEntropy,)
        }
    });
    let steps = o.steps.map(|n| quote!(steps: #n,));
    let ratio = o.ratio.map(|r| quote!(ratio: #r,));
    let threshold = o.threshold.map(|t| quote!(threshold: #t,));
    quote! {
        .overfit(::golden::OverfitSpec {
            #steps #loss #optimizer #ratio #threshold
            ..::std::default::Default::default()
        })
    }
}

fn grad_spec(g: &GradDecl) -> TokenStream {
    let wrt = match &g.wrt {
        None => quote!(::std::option::Option::None),
        Some(names) => {
            let names = names.iter().map(|n| match n {
                WrtName::Arg(i) => i.to_string(),
                WrtName::Param(s) => s.value(),
            });
            quote!(::std::option::Option::Some(
                ::std::vec![#(::std::string::String::from(#names)),*]
            ))
        }
    };
    let field = |name: &str, v: Option<TokenStream>| {
        let name = Ident::new(name, Span::call_site());
        v.map(|v| quote!(#name: #v,))
    };
    let eps = field("eps", g.eps.map(|v| quote!(#v)));
    let atol = field("atol", g.atol.map(|v| quote!(#v)));
    let rtol = field("rtol", g.rtol.map(|v| quote!(#v)));
    let cases = field("cases", g.cases.map(|v| quote!(#v)));
    let mode = field(
        "mode",
        g.full.map(|full| {
            if full {
                quote!(::golden::GradMode::Full)
            } else {
                quote!(::golden::GradMode::Fast)
            }
        }),
    );
    quote! {
        .grad(::golden::GradSpec {
            wrt: #wrt,
            #eps #atol #rtol #cases #mode
            ..::std::default::Default::default()
        })
    }
}
