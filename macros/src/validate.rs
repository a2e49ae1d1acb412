//! What the options mean together, and with the function's signature: named rules, each
//! returning its mistakes. All of them run, so that every mistake of an attribute is reported
//! at once; a rule that trusts an option to be complete (the dims, to call a dim unknown) is
//! skipped when that option did not parse, since what it would say follows from that mistake.

use crate::decl::{Attr, Axis, BoundDecl, DistDecl, InvariantDecl, KeyValue, ValueDecl, WrtName};
use crate::errors::Errors;
use crate::options::OPTIONS;
use crate::signature::{Kind, Param};
use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::Ident;

/// What the rules look at.
pub struct Context<'a> {
    pub attr: &'a Attr,
    pub fn_name: &'a Ident,
    /// The function's parameters (empty when its signature is one golden cannot call: then the
    /// rules about the signature do not run).
    pub params: &'a [Param],
    /// Whether a parameter is a `VarBuilder`.
    pub module_form: bool,
}

/// One rule.
pub struct Rule {
    /// What it says must hold (the tests run a rule by its name).
    #[cfg_attr(not(test), allow(dead_code))]
    pub name: &'static str,
    /// The options it trusts to be complete: it is skipped when one of them did not parse.
    pub needs: &'static [&'static str],
    /// Whether it reads the function's signature.
    pub signature: bool,
    pub check: fn(&Context) -> Errors,
}

/// Every rule, in the order their mistakes are reported.
pub const RULES: &[Rule] = &[
    Rule {
        name: "reference_is_a_dotted_path",
        needs: &["reference"],
        signature: false,
        check: reference_is_a_dotted_path,
    },
    Rule {
        name: "dims_declared_once",
        needs: &[],
        signature: false,
        check: dims_declared_once,
    },
    Rule {
        name: "dims_named_are_declared",
        needs: &["dims"],
        signature: false,
        check: dims_named_are_declared,
    },
    Rule {
        name: "args_shaped_once",
        needs: &[],
        signature: false,
        check: args_shaped_once,
    },
    Rule {
        name: "args_are_tensor_parameters",
        needs: &["decode"],
        signature: true,
        check: args_are_tensor_parameters,
    },
    Rule {
        name: "positions_have_a_max",
        needs: &["init", "config"],
        signature: false,
        check: positions_have_a_max,
    },
    Rule {
        name: "tensor_parameters_have_shapes",
        needs: &["args", "decode"],
        signature: true,
        check: tensor_parameters_have_shapes,
    },
    Rule {
        name: "var_builder_first",
        needs: &[],
        signature: true,
        check: var_builder_first,
    },
    Rule {
        name: "parameters_have_values",
        needs: &["consts", "init", "config", "dims", "steps"],
        signature: true,
        check: parameters_have_values,
    },
    Rule {
        name: "grad_wrt_names_inputs",
        needs: &[],
        signature: true,
        check: grad_wrt_names_inputs,
    },
    Rule {
        name: "sweeps_well_formed",
        needs: &[],
        signature: false,
        check: sweeps_well_formed,
    },
    Rule {
        name: "sweeps_named_once",
        needs: &[],
        signature: false,
        check: sweeps_named_once,
    },
    Rule {
        name: "cases_cover_sweeps",
        needs: &["cases"],
        signature: false,
        check: cases_cover_sweeps,
    },
    Rule {
        name: "invariants_known",
        needs: &[],
        signature: false,
        check: invariants_known,
    },
    Rule {
        name: "module_options_in_module_form",
        needs: &[],
        signature: true,
        check: module_options_in_module_form,
    },
    Rule {
        name: "weights_or_params",
        needs: &[],
        signature: false,
        check: weights_or_params,
    },
    Rule {
        name: "config_well_formed",
        needs: &[],
        signature: false,
        check: config_well_formed,
    },
    Rule {
        name: "decode_over_a_shaped_arg",
        needs: &["args"],
        signature: false,
        check: decode_over_a_shaped_arg,
    },
    Rule {
        name: "backend_known",
        needs: &[],
        signature: false,
        check: backend_known,
    },
    Rule {
        name: "module_form_on_torch",
        needs: &[],
        signature: true,
        check: module_form_on_torch,
    },
    Rule {
        name: "dtypes_known_and_given_once",
        needs: &[],
        signature: false,
        check: dtypes_known_and_given_once,
    },
    Rule {
        name: "steps_or_decode",
        needs: &[],
        signature: false,
        check: steps_or_decode,
    },
    Rule {
        name: "steps_over_a_dim",
        needs: &["dims"],
        signature: false,
        check: steps_over_a_dim,
    },
    Rule {
        name: "steps_carry_shaped_args",
        needs: &["args"],
        signature: false,
        check: steps_carry_shaped_args,
    },
];

/// Every rule that applies, their mistakes in order. `params` is `None` when the signature is
/// one golden cannot call (that error is the signature's).
pub fn validate(attr: &Attr, fn_name: &Ident, params: Option<&[Param]>) -> Errors {
    let cx = Context {
        attr,
        fn_name,
        params: params.unwrap_or(&[]),
        module_form: params.is_some_and(crate::signature::module_form),
    };
    let mut errors = Errors::default();
    for rule in RULES {
        if rule.needs.iter().any(|o| attr.is_broken(o)) || (rule.signature && params.is_none()) {
            continue;
        }
        errors.append((rule.check)(&cx));
    }
    errors
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

/// `reference` is given, a dotted Python path.
fn reference_is_a_dotted_path(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    let Some(reference) = &cx.attr.reference else {
        errors.push(
            Span::call_site(),
            "missing `reference = \"package.module.callable\"`: the Python function or nn.Module \
             class this layer ports",
        );
        return errors;
    };
    let path = reference.value();
    if !dotted_path(&path) {
        errors.push(
            reference.span(),
            format!("`{path}` is not a dotted Python path like `package.module.callable`"),
        );
    }
    errors
}

/// No dim declared twice.
fn dims_declared_once(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    let dims = &cx.attr.dims;
    for (i, d) in dims.iter().enumerate() {
        if dims[..i].iter().any(|o| o.name == d.name) {
            errors.push(d.name.span(), format!("dim `{}` is declared twice", d.name));
        }
    }
    errors
}

/// Every dim named (in values, shapes, `int(..)` bounds, `positions(max)`) is declared.
fn dims_named_are_declared(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    let attr = cx.attr;
    let dim_names: Vec<String> = attr.dims.iter().map(|d| d.name.to_string()).collect();
    let known = if dim_names.is_empty() {
        "no dims are declared: add `dims(name = lo..=hi, ...)`".to_string()
    } else {
        format!("declared dims: {}", dim_names.join(", "))
    };
    let mut check = |ident: &Ident| {
        if !dim_names.contains(&ident.to_string()) {
            errors.push(ident.span(), format!("unknown dim `{ident}` ({known})"));
        }
    };
    for kv in attr.values() {
        kv.value.dims().into_iter().for_each(&mut check);
    }
    for arg in &attr.args {
        for axis in &arg.shape {
            match axis {
                Axis::Sym(ident) => check(ident),
                Axis::Expr(e) => e.dims().into_iter().for_each(&mut check),
                Axis::Lit(_) => {}
            }
        }
        match &arg.dist {
            Some(DistDecl::Int(lo, hi)) => {
                for b in [lo, hi] {
                    if let BoundDecl::Dim(ident) = b {
                        check(ident);
                    }
                }
            }
            Some(DistDecl::Positions(Some(BoundDecl::Dim(ident)))) => check(ident),
            _ => {}
        }
    }
    errors
}

/// No argument shaped twice.
fn args_shaped_once(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    let args = &cx.attr.args;
    for (i, arg) in args.iter().enumerate() {
        if args[..i].iter().any(|a| a.name == arg.name) {
            errors.push(
                arg.name.span(),
                format!("`{}` has two shapes in `args(...)`", arg.name),
            );
        }
    }
    errors
}

/// Every shaped argument is a tensor parameter of the function; with `decode`, none is (the
/// steps get them).
fn args_are_tensor_parameters(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    let decode = cx.attr.decode.is_some();
    for arg in &cx.attr.args {
        let name = arg.name.to_string();
        match cx.params.iter().find(|p| p.name == arg.name) {
            None if decode => {}
            Some(_) if decode => errors.push(
                arg.name.span(),
                format!(
                    "with `decode`, the function builds the model and each step gets the tensors \
                     (`step.input(\"{name}\")`): drop the parameter `{name}`"
                ),
            ),
            None => errors.push(
                arg.name.span(),
                format!(
                    "`args` gives a shape for `{name}`, but `fn {}` has no parameter `{name}`",
                    cx.fn_name
                ),
            ),
            Some(p) if !matches!(p.kind, Kind::Tensor { .. }) => errors.push(
                arg.name.span(),
                format!(
                    "`{name}` is not a tensor parameter (`&Tensor`); give it a value in \
                     `consts(...)`"
                ),
            ),
            Some(_) => {}
        }
    }
    errors
}

/// `~ positions` without a max needs the module's `max_position_embeddings` (or `n_positions`).
fn positions_have_a_max(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    let attr = cx.attr;
    let has_max = attr
        .init
        .iter()
        .chain(attr.config.iter().flat_map(|c| &c.values))
        .any(|kv| kv.name == "max_position_embeddings" || kv.name == "n_positions");
    for arg in &attr.args {
        if matches!(arg.dist, Some(DistDecl::Positions(None))) && !has_max {
            errors.push(
                arg.name.span(),
                format!(
                    "`{} ~ positions` draws up to the module's max_position_embeddings, and \
                     neither `config` nor `init` gives one: write `positions(N)`",
                    arg.name
                ),
            );
        }
    }
    errors
}

/// Every tensor parameter has a shape in `args` (but with `decode`, whose steps get them).
fn tensor_parameters_have_shapes(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    if cx.attr.decode.is_some() {
        return errors;
    }
    for p in cx.params {
        if matches!(p.kind, Kind::Tensor { .. }) && !cx.attr.args.iter().any(|a| a.name == p.name) {
            errors.push(
                p.name.span(),
                format!(
                    "tensor parameter `{name}` needs a shape: add `{name} = [...]` to `args(...)`",
                    name = p.name
                ),
            );
        }
    }
    errors
}

/// A `VarBuilder` is the first parameter.
fn var_builder_first(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    for p in cx.params.iter().skip(1) {
        if matches!(p.kind, Kind::VarBuilder { .. }) {
            errors.push(
                p.ty.span(),
                "the VarBuilder must be the first parameter (module form)",
            );
        }
    }
    errors
}

/// The value given to a parameter of the function, by name: `consts`, `init`, then `config`.
pub fn value_for<'a>(attr: &'a Attr, name: &Ident) -> Option<&'a KeyValue> {
    attr.values().find(|kv| kv.name == *name)
}

/// Whether a parameter without a value gets a number of the case: a dim's size, or the step's
/// index (`step`) in a step loop.
pub fn is_case_number(attr: &Attr, name: &Ident) -> bool {
    attr.dims.iter().any(|d| d.name == *name) || (attr.steps.is_some() && name == "step")
}

/// Every other parameter gets a value: from `consts`, `init` or `config` (not a dict, which no
/// Rust type takes), or as a dim's size.
fn parameters_have_values(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    for p in cx.params.iter().filter(|p| p.kind == Kind::Value) {
        let name = &p.name;
        match value_for(cx.attr, name) {
            Some(kv) if contains_dict(&kv.value) => errors.push(
                name.span(),
                format!(
                    "`{name}` is a dict in the attribute, which no Rust parameter takes: give the \
                     port what it needs from it as separate parameters, or rename this one"
                ),
            ),
            Some(_) => {}
            None if is_case_number(cx.attr, name) => {}
            None => errors.push(
                name.span(),
                format!(
                    "parameter `{name}` needs a value: name it as a dim of `dims(...)`, add \
                     `{name} = ...` to `consts(...)`{}, or make it a tensor (`&Tensor`) with a \
                     shape in `args(...)`",
                    if cx.module_form {
                        ", `init(...)` or `config = \"...\"(...)`"
                    } else {
                        ""
                    }
                ),
            ),
        }
    }
    errors
}

/// Whether a dict is in the value (at its top, or in a list or a sweep).
fn contains_dict(v: &ValueDecl) -> bool {
    match v {
        ValueDecl::Dict(_) => true,
        ValueDecl::List(items) | ValueDecl::OneOf(_, items) => items.iter().any(contains_dict),
        _ => false,
    }
}

/// `grad(wrt = [...])` names tensor parameters, and module parameters (strings) in the module
/// form only.
fn grad_wrt_names_inputs(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    for name in cx.attr.grad.iter().flat_map(|g| g.wrt.iter().flatten()) {
        match name {
            WrtName::Arg(ident) => {
                let is_tensor = cx
                    .params
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
            WrtName::Param(lit) if !cx.module_form => errors.push(
                lit.span(),
                "parameters (strings in `wrt`) exist in the module form only",
            ),
            WrtName::Param(_) => {}
        }
    }
    errors
}

/// The swept values (`one_of(...)`, `lo..=hi`) of `consts`, `init` and `config`.
fn swept(attr: &Attr) -> impl Iterator<Item = &KeyValue> {
    attr.values()
        .filter(|kv| matches!(kv.value, ValueDecl::OneOf(..) | ValueDecl::Range(..)))
}

/// Sweeps at the top of a value, not empty; no division by 0.
fn sweeps_well_formed(cx: &Context) -> Errors {
    // A sweep inside a list, a dict or another one_of.
    fn nested(v: &ValueDecl, errors: &mut Errors) {
        let inner: Vec<&ValueDecl> = match v {
            ValueDecl::List(items) | ValueDecl::OneOf(_, items) => items.iter().collect(),
            ValueDecl::Dict(items) => items.iter().map(|(_, v)| v).collect(),
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
    let mut errors = Errors::default();
    for kv in cx.attr.values() {
        nested(&kv.value, &mut errors);
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
    errors
}

/// Each keyword swept in one place, and not named like a dim (a case names both).
fn sweeps_named_once(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    let swept: Vec<&KeyValue> = swept(cx.attr).collect();
    for (i, kv) in swept.iter().enumerate() {
        if swept[..i].iter().any(|o| o.name == kv.name) {
            errors.push(
                kv.name.span(),
                format!("`{}` is swept twice: sweep it in one place", kv.name),
            );
        }
        if cx.attr.dims.iter().any(|d| d.name == kv.name) {
            errors.push(
                kv.name.span(),
                format!(
                    "`{}` is both a dim and a swept value: rename one (a case names both)",
                    kv.name
                ),
            );
        }
    }
    errors
}

/// Enough cases to try each value of every sweep.
fn cases_cover_sweeps(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    let cases = cx.attr.cases.unwrap_or(32) as usize;
    for kv in swept(cx.attr) {
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
    errors
}

/// The invariants there are, for errors.
const KNOWN_INVARIANTS: &str =
    "expected `finite`, `non_negative`, `sums_to_one(dim = N)` or `range(lo, hi)`";

/// `invariants(...)`: each invariant known and well formed, each leaf once and given one.
fn invariants_known(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    let Some(decl) = &cx.attr.invariants else {
        return errors;
    };
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
            invariant_well_formed(inv, &mut errors);
        }
    }
    if decl.leaves.is_empty() {
        errors.push(
            decl.key.span(),
            "`invariants(...)` names no output: `invariants(out = [finite])`",
        );
    }
    errors
}

fn invariant_well_formed(inv: &InvariantDecl, errors: &mut Errors) {
    let name = inv.name.to_string();
    let args = inv.args.as_deref().unwrap_or(&[]);
    match name.as_str() {
        "finite" | "non_negative" => {
            if inv.args.is_some() {
                errors.push(inv.name.span(), format!("`{name}` takes no arguments"));
            }
        }
        "sums_to_one" => {
            for (key, value, span) in args {
                match key.as_ref().map(ToString::to_string).as_deref() {
                    Some("dim") if value.fract() == 0.0 => {}
                    Some("dim") => errors.push(*span, "`dim` is a whole number: `dim = -1`"),
                    Some("tol") if *value >= 0.0 => {}
                    Some("tol") => errors.push(*span, "`tol` must not be negative"),
                    _ => errors.push(
                        *span,
                        "`sums_to_one` takes `dim = N` (default -1) and `tol = x`: \
                         `sums_to_one(dim = -1)`",
                    ),
                }
            }
        }
        "range" => match args {
            [(None, lo, _), (None, hi, span)] => {
                if lo > hi {
                    errors.push(*span, format!("`range({lo:?}, {hi:?})` is empty"));
                }
            }
            _ => errors.push(
                inv.name.span(),
                "`range` takes two numbers, its lowest and highest values: `range(-10.0, 10.0)`",
            ),
        },
        _ => errors.push(
            inv.name.span(),
            format!("unknown invariant `{name}`; {KNOWN_INVARIANTS}"),
        ),
    }
}

/// The options of the module form (the table's `module_only`) are not given in the function
/// form.
fn module_options_in_module_form(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    if cx.module_form {
        return errors;
    }
    for opt in OPTIONS {
        let (Some(msg), Some(key)) = (opt.module_only, cx.attr.key(opt.name)) else {
            continue;
        };
        // `init(...)`'s error points at its first keyword (what would configure the module).
        let span = match cx.attr.init.first() {
            Some(kv) if opt.name == "init" => kv.name.span(),
            _ => key.span(),
        };
        errors.push(span, msg);
    }
    errors
}

/// `weights` and `params` both say where the parameters come from.
fn weights_or_params(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    if let (Some(key), Some(_)) = (cx.attr.key("weights"), cx.attr.key("params")) {
        errors.push(
            key.span(),
            "`weights` and `params` both say where the parameters come from: give one",
        );
    }
    errors
}

/// `config`'s class is a dotted path; each of its values given once.
fn config_well_formed(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    let Some(config) = &cx.attr.config else {
        return errors;
    };
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
    errors
}

/// The argument `decode` splits into steps (`over`, default the first of `args`) has a shape.
fn decode_over_a_shaped_arg(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    let attr = cx.attr;
    let Some(d) = &attr.decode else {
        return errors;
    };
    match d.over.as_ref().or(attr.args.first().map(|a| &a.name)) {
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
    errors
}

/// `backend` is `"torch"` or `"numpy"`.
fn backend_known(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    if let Some(b) = &cx.attr.backend {
        let name = b.value();
        if name != "torch" && name != "numpy" {
            errors.push(
                b.span(),
                format!("unknown backend `{name}`; expected \"torch\" or \"numpy\""),
            );
        }
    }
    errors
}

/// The module form's reference is an `nn.Module`: the torch backend.
fn module_form_on_torch(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    if let Some(b) = cx.attr.backend.as_ref().filter(|b| b.value() == "numpy") {
        if cx.module_form {
            errors.push(
                b.span(),
                "the module form needs the torch backend (its reference is an nn.Module)",
            );
        }
    }
    errors
}

/// The dtypes candle has, given by one of `dtype` and `dtypes`.
fn dtypes_known_and_given_once(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    for d in cx.attr.dtype_list().unwrap_or(&[]) {
        if !["f32", "f64", "f16", "bf16"].contains(&d.to_string().as_str()) {
            errors.push(
                d.span(),
                format!("unknown dtype `{d}`; expected f32, f64, f16 or bf16"),
            );
        }
    }
    if let (Some(_), Some(key)) = (cx.attr.key("dtype"), cx.attr.key("dtypes")) {
        errors.push(
            key.span(),
            "`dtype` and `dtypes` both say which dtypes to check: give one (`dtype = f32`, or \
             `dtypes = [f32, bf16]` for several)",
        );
    }
    errors
}

/// `steps` and `decode` both drive the layer through time.
fn steps_or_decode(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    if let (Some(s), Some(_)) = (&cx.attr.steps, &cx.attr.decode) {
        errors.push(
            s.key.span(),
            "`steps` and `decode` both drive the layer through time: give one",
        );
    }
    errors
}

/// `steps(over = k)` counts a dim.
fn steps_over_a_dim(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    if let Some(s) = &cx.attr.steps {
        if !cx.attr.dims.iter().any(|d| d.name == s.over) {
            errors.push(
                s.over.span(),
                format!(
                    "`steps(over = {})`: the loop has as many steps as a dim, and `{}` is not one \
                     of `dims(...)`",
                    s.over, s.over
                ),
            );
        }
    }
    errors
}

/// `carry(x = ..)` feeds back into an argument with a shape.
fn steps_carry_shaped_args(cx: &Context) -> Errors {
    let mut errors = Errors::default();
    for (arg, _) in cx.attr.steps.iter().flat_map(|s| &s.carry) {
        if !cx.attr.args.iter().any(|a| a.name == *arg) {
            errors.push(
                arg.span(),
                format!("`carry({arg} = ..)`: `{arg}` has no shape in `args(...)`"),
            );
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::TokenStream;
    use quote::quote;

    /// The mistakes every rule finds in `attr` on `function` (the attribute must parse).
    fn mistakes(attr: TokenStream, function: syn::ItemFn) -> Vec<String> {
        let (attr, errors) = crate::options::parse(attr);
        assert!(errors.messages().is_empty(), "{:?}", errors.messages());
        let params = crate::signature::params(&function).ok();
        validate(&attr, &function.sig.ident, params.as_deref()).messages()
    }

    /// The mistakes of rule `name` alone.
    fn rule(name: &str, attr: TokenStream, function: syn::ItemFn) -> Vec<String> {
        let (attr, _) = crate::options::parse(attr);
        let params = crate::signature::params(&function).unwrap();
        let rule = RULES
            .iter()
            .find(|r| r.name == name)
            .expect("a rule of that name");
        let cx = Context {
            attr: &attr,
            fn_name: &function.sig.ident,
            params: &params,
            module_form: crate::signature::module_form(&params),
        };
        (rule.check)(&cx).messages()
    }

    fn gelu() -> syn::ItemFn {
        syn::parse_quote!(
            fn gelu(x: &Tensor) -> Result<Tensor> {
                x.gelu_erf()
            }
        )
    }

    fn block() -> syn::ItemFn {
        syn::parse_quote!(
            fn block(vb: VarBuilder, x: &Tensor, hidden: usize) -> Result<Tensor> {
                todo!()
            }
        )
    }

    #[test]
    fn a_valid_attribute_has_no_mistakes() {
        let m = mistakes(
            quote!(
                reference = "m.f",
                dims(n = 1..=8),
                args(x = [n]),
                dtypes = [f32, bf16]
            ),
            gelu(),
        );
        assert!(m.is_empty(), "{m:?}");
    }

    #[test]
    fn dtype_with_dtypes_is_a_mistake() {
        let m = rule(
            "dtypes_known_and_given_once",
            quote!(reference = "m.f", dtype = f32, dtypes = [f64, bf16]),
            gelu(),
        );
        assert_eq!(
            m,
            [
                "`dtype` and `dtypes` both say which dtypes to check: give one (`dtype = f32`, or \
              `dtypes = [f32, bf16]` for several)"
            ]
        );
        let alone = |attr| rule("dtypes_known_and_given_once", attr, gelu());
        assert!(alone(quote!(dtype = f64)).is_empty());
        assert!(alone(quote!(dtypes = [f64, bf16])).is_empty());
        assert_eq!(
            alone(quote!(dtypes = [f32, f8])),
            ["unknown dtype `f8`; expected f32, f64, f16 or bf16"]
        );
    }

    #[test]
    fn every_rule_reports_its_mistakes_at_once() {
        let m = mistakes(
            quote!(
                reference = "gelu",
                backend = "jax",
                dims(n = 1..=8),
                args(x = [m]),
                dtype = f32,
                dtypes = [f64],
                trace,
            ),
            gelu(),
        );
        assert_eq!(
            m,
            [
                "`gelu` is not a dotted Python path like `package.module.callable`",
                "unknown dim `m` (declared dims: n)",
                "`trace` compares the port's taps with the reference module's submodules: it \
                 needs the module form, whose first parameter is a `VarBuilder`",
                "unknown backend `jax`; expected \"torch\" or \"numpy\"",
                "`dtype` and `dtypes` both say which dtypes to check: give one (`dtype = f32`, or \
                 `dtypes = [f32, bf16]` for several)",
            ]
        );
    }

    #[test]
    fn a_rule_that_trusts_a_broken_option_is_skipped() {
        // `dims` did not parse (its error is the parser's): `n` is not called unknown too.
        let (attr, errors) =
            crate::options::parse(quote!(reference = "m.f", dims(n = 1..=x), args(x = [n])));
        assert_eq!(errors.messages().len(), 1);
        let function = gelu();
        let params = crate::signature::params(&function).unwrap();
        assert!(validate(&attr, &function.sig.ident, Some(&params))
            .messages()
            .is_empty());
    }

    #[test]
    fn the_rules_about_the_signature_wait_for_one_golden_can_call() {
        let method: syn::ItemFn = syn::parse_quote!(
            fn f<T>(x: T) {}
        );
        assert!(crate::signature::params(&method).is_err());
        // Without parameters, `args(x = ..)` naming no parameter would be a mistake it is not.
        let (attr, _) = crate::options::parse(quote!(reference = "m.f", args(x = [2])));
        assert!(validate(&attr, &method.sig.ident, None)
            .messages()
            .is_empty());
    }

    #[test]
    fn missing_reference() {
        assert_eq!(
            rule("reference_is_a_dotted_path", quote!(cases = 2), gelu()),
            [
                "missing `reference = \"package.module.callable\"`: the Python function or \
              nn.Module class this layer ports"
            ]
        );
    }

    #[test]
    fn the_signature_and_the_shapes_agree() {
        let f: syn::ItemFn = syn::parse_quote!(
            fn f(x: &Tensor, y: Tensor, k: usize) -> Result<Tensor> {
                todo!()
            }
        );
        assert_eq!(
            rule(
                "args_are_tensor_parameters",
                quote!(args(x = [2], z = [3], k = [1])),
                f.clone()
            ),
            [
                "`args` gives a shape for `z`, but `fn f` has no parameter `z`",
                "`k` is not a tensor parameter (`&Tensor`); give it a value in `consts(...)`",
            ]
        );
        assert_eq!(
            rule(
                "tensor_parameters_have_shapes",
                quote!(args(x = [2])),
                f.clone()
            ),
            ["tensor parameter `y` needs a shape: add `y = [...]` to `args(...)`"]
        );
        assert_eq!(
            rule("parameters_have_values", quote!(), f.clone()),
            [
                "parameter `k` needs a value: name it as a dim of `dims(...)`, add `k = ...` to \
              `consts(...)`, or make it a tensor (`&Tensor`) with a shape in `args(...)`"
            ]
        );
        assert!(rule("parameters_have_values", quote!(dims(k = 1..=3)), f.clone()).is_empty());
        assert!(rule("parameters_have_values", quote!(consts(k = 3)), f).is_empty());
    }

    #[test]
    fn module_options_need_the_module_form() {
        let attr = quote!(init(hidden = 8), trace, params = init, decode);
        let errors = rule("module_options_in_module_form", attr.clone(), gelu());
        let named: Vec<&str> = errors
            .iter()
            .map(|m| m.split('`').nth(1).unwrap())
            .collect();
        assert_eq!(named, ["init(...)", "trace", "params", "decode"]);
        assert!(rule("module_options_in_module_form", attr, block()).is_empty());
    }

    #[test]
    fn the_module_form_is_torch_and_its_builder_first() {
        assert_eq!(
            rule("module_form_on_torch", quote!(backend = "numpy"), block()),
            ["the module form needs the torch backend (its reference is an nn.Module)"]
        );
        let late: syn::ItemFn = syn::parse_quote!(
            fn f(x: &Tensor, vb: VarBuilder) -> Result<Tensor> {
                todo!()
            }
        );
        assert_eq!(
            rule("var_builder_first", quote!(), late),
            ["the VarBuilder must be the first parameter (module form)"]
        );
    }

    #[test]
    fn sweeps() {
        let f = block;
        assert_eq!(
            rule(
                "sweeps_well_formed",
                quote!(init(h = [one_of(1, 2)], w = 3..=1)),
                f()
            ),
            [
                "`one_of(...)` goes at the top of a value (`key = one_of(a, b)`), not inside a \
                 list, a dict or another `one_of`",
                "`3..=1` is an empty range",
            ]
        );
        assert_eq!(
            rule(
                "sweeps_named_once",
                quote!(dims(h = 2), init(h = one_of(1, 2))),
                f()
            ),
            ["`h` is both a dim and a swept value: rename one (a case names both)"]
        );
        assert_eq!(
            rule(
                "cases_cover_sweeps",
                quote!(cases = 2, init(h = one_of(1, 2, 3))),
                f()
            ),
            ["`cases = 2` cannot try each of the 3 values of `h`: give `cases = 3` or more"]
        );
    }

    #[test]
    fn invariants() {
        assert_eq!(
            rule(
                "invariants_known",
                quote!(invariants(out = [finite(1), bounded, range(2.0, 1.0)], out = [])),
                gelu()
            ),
            [
                "`finite` takes no arguments",
                "unknown invariant `bounded`; expected `finite`, `non_negative`, \
                 `sums_to_one(dim = N)` or `range(lo, hi)`",
                "`range(2.0, 1.0)` is empty",
                "`out` is given twice in `invariants(...)`",
                "no invariant for `out`: expected `finite`, `non_negative`, `sums_to_one(dim = N)` \
                 or `range(lo, hi)`",
            ]
        );
    }

    #[test]
    fn time_is_driven_one_way() {
        assert_eq!(
            rule(
                "steps_or_decode",
                quote!(steps(over = k, carry(x = out)), decode),
                block()
            ),
            ["`steps` and `decode` both drive the layer through time: give one"]
        );
        assert_eq!(
            rule(
                "steps_over_a_dim",
                quote!(dims(n = 2), steps(over = k)),
                gelu()
            ),
            [
                "`steps(over = k)`: the loop has as many steps as a dim, and `k` is not one of \
              `dims(...)`"
            ]
        );
        assert_eq!(
            rule("decode_over_a_shaped_arg", quote!(decode), block()),
            ["`decode` splits a sequence argument into steps: declare it in `args(...)`"]
        );
    }

    #[test]
    fn each_rule_has_its_own_name() {
        for (i, r) in RULES.iter().enumerate() {
            assert!(
                RULES[..i].iter().all(|o| o.name != r.name),
                "`{}` twice",
                r.name
            );
            for o in r.needs {
                assert!(
                    crate::options::find(o).is_some(),
                    "rule `{}` needs `{o}`, which is no option",
                    r.name
                );
            }
        }
    }
}
