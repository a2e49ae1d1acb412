//! Emitting the test module of a valid attribute (`validate.rs` has judged it): a `golden::Layer`
//! built from the attribute, a closure calling the function, and the snapshot assertion (which must
//! be expanded here, in the user's crate, for insta to file it under the user's test). Nothing here
//! checks anything.

use crate::decl::{
    ArgDecl, Attr, Axis, BoundDecl, DimValueDecl, DistDecl, GradDecl, InvariantDecl, KeyValue,
    OverfitDecl, ValueDecl, WrtName,
};
use crate::signature::{Kind, Param};
use crate::validate::{is_case_number, value_for};
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::Ident;

fn dim_value_expr(e: &DimValueDecl) -> TokenStream {
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

/// One axis of a shape as a `golden::DimExpr`.
fn axis_expr(axis: &Axis) -> TokenStream {
    match axis {
        Axis::Sym(s) => {
            let s = s.to_string();
            quote!(::golden::DimExpr::Sym(::std::string::String::from(#s)))
        }
        Axis::Lit(n) => quote!(::golden::DimExpr::Lit(#n)),
        Axis::Expr(e) => {
            let e = dim_value_expr(e);
            quote!(::golden::DimExpr::Expr(#e))
        }
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
/// on, each alternative in `Some` when one of them is `None`). A dict, which no Rust parameter
/// takes, is a mistake of the attribute (`parameters_have_values`) that never reaches here.
fn value_tokens(name: &str, v: &ValueDecl) -> TokenStream {
    match v {
        ValueDecl::Int(t) | ValueDecl::Float(t) | ValueDecl::Bool(t) => t.clone(),
        ValueDecl::Str(s) => quote!(#s),
        ValueDecl::List(items) => {
            let items = items.iter().map(|v| value_tokens(name, v));
            quote!([#(#items),*])
        }
        ValueDecl::Dict(..) => quote!(::std::unreachable!()),
        ValueDecl::None => quote!(::std::option::Option::None),
        ValueDecl::Dims(e) => {
            let e = dim_value_tokens(e);
            quote!((#e as _))
        }
        ValueDecl::OneOf(_, items) => {
            let optional = items.iter().any(|v| matches!(v, ValueDecl::None));
            let arms: Vec<TokenStream> = items
                .iter()
                .map(|v| {
                    let t = value_tokens(name, v);
                    match v {
                        ValueDecl::None => t,
                        _ if optional => quote!(::std::option::Option::Some(#t)),
                        _ => t,
                    }
                })
                .collect();
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
    }
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

/// `invariants(...)`: the builder calls, one per invariant of each leaf.
fn invariant_calls(attr: &Attr) -> Vec<TokenStream> {
    let Some(decl) = &attr.invariants else {
        return Vec::new();
    };
    let mut calls = Vec::new();
    for (leaf, _, list) in &decl.leaves {
        for inv in list {
            let tokens = invariant_tokens(inv);
            calls.push(quote!(.invariant(#leaf, #tokens)));
        }
    }
    calls
}

/// One invariant as a `golden::Invariant` (`invariants_known` has checked its name and arguments).
fn invariant_tokens(inv: &InvariantDecl) -> TokenStream {
    let args = inv.args.as_deref().unwrap_or(&[]);
    match inv.name.to_string().as_str() {
        "finite" => quote!(::golden::Invariant::Finite),
        "non_negative" => quote!(::golden::Invariant::NonNegative),
        "sums_to_one" => {
            let (mut dim, mut tol) = (-1i64, None);
            for (key, value, _) in args {
                match key.as_ref().map(ToString::to_string).as_deref() {
                    Some("dim") => dim = *value as i64,
                    Some("tol") => tol = Some(*value),
                    _ => {}
                }
            }
            let tol = match tol {
                Some(t) => quote!(::std::option::Option::Some(#t)),
                None => quote!(::std::option::Option::None),
            };
            quote!(::golden::Invariant::SumsToOne { dim: #dim, tol: #tol })
        }
        _ => {
            let (lo, hi) = (args[0].1, args[1].1);
            quote!(::golden::Invariant::Range { lo: #lo, hi: #hi })
        }
    }
}

/// The arguments of the generated call, in signature order.
fn call_args(attr: &Attr, params: &[Param]) -> Vec<TokenStream> {
    let mut tensor_index = 0usize;
    params
        .iter()
        .map(|p| {
            let name = p.name.to_string();
            let span = p.ty.span();
            match p.kind {
                Kind::Tensor { by_ref } => {
                    // The tensors are passed in the order of `attr.args`, sorted to signature
                    // order in `render`.
                    let i = tensor_index;
                    tensor_index += 1;
                    if by_ref {
                        quote_spanned!(span=> __golden_inputs.tensor(#i))
                    } else {
                        quote_spanned!(span=> ::std::clone::Clone::clone(__golden_inputs.tensor(#i)))
                    }
                }
                Kind::VarBuilder { by_ref: true } => {
                    quote_spanned!(span=> &__golden_inputs.var_builder())
                }
                Kind::VarBuilder { by_ref: false } => {
                    quote_spanned!(span=> __golden_inputs.var_builder())
                }
                Kind::Value => match value_for(attr, &p.name) {
                    Some(kv) => value_tokens(&name, &kv.value),
                    // A parameter named as a dim gets the case's size of that dim; in a step loop,
                    // `step` gets the step's index.
                    None if is_case_number(attr, &p.name) => {
                        quote_spanned!(span=> (__golden_inputs.dim(#name) as _))
                    }
                    None => quote!(::std::unreachable!()),
                },
            }
        })
        .collect()
}

/// A dtype as candle's (`dtypes_known_and_given_once` has checked it is one).
fn dtype_tokens(ident: &Ident) -> TokenStream {
    let variant = match ident.to_string().as_str() {
        "f64" => quote!(F64),
        "f16" => quote!(F16),
        "bf16" => quote!(BF16),
        _ => quote!(F32),
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

/// The `#[cfg(test)]` module of a valid attribute on `fn fn_name(params)`.
pub fn render(attr: &Attr, fn_name: &Ident, params: &[Param]) -> TokenStream {
    let module_form = crate::signature::module_form(params);
    let call = call_args(attr, params);
    let invariants = invariant_calls(attr);
    let backend = match attr.backend.as_ref().map(|b| b.value()).as_deref() {
        Some("numpy") => quote!(::golden::Backend::Numpy),
        _ => quote!(::golden::Backend::Torch),
    };
    let dtypes: Vec<TokenStream> = match attr.dtype_list() {
        Some(list) => list.iter().map(dtype_tokens).collect(),
        None => vec![quote!(::golden::__private::candle_core::DType::F32)],
    };
    let reference = attr
        .reference
        .as_ref()
        .map(|r| r.value())
        .unwrap_or_default();

    // Tensors reach the reference in signature order: sort the declared shapes that way.
    let mut args: Vec<&ArgDecl> = attr.args.iter().collect();
    args.sort_by_key(|a| params.iter().position(|p| p.name == a.name));
    let arg_calls = args.iter().map(|a| {
        let name = a.name.to_string();
        let shape = a.shape.iter().map(axis_expr);
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
    let speed = attr.speed.map(|max| quote!(.speed_max(#max)));
    let budget = attr.budget.map(|s| quote!(.budget(#s)));
    let trace = attr.trace.as_ref().map(|_| quote!(.trace()));
    let params = attr
        .params
        .as_ref()
        .and_then(|(_, how)| match how.to_string().as_str() {
            "init" => Some(quote!(.params_init())),
            "drawn_all" => Some(quote!(.params_drawn_all())),
            "init_scale" => Some(quote!(.params_init_scale())),
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
        let some = |v: Option<proc_macro2::TokenStream>| match v {
            Some(v) => quote!(::std::option::Option::Some(#v)),
            None => quote!(::std::option::Option::None),
        };
        let sample = some(d.sample.as_ref().map(|s| {
            let float = |v: Option<f64>| some(v.map(|v| quote!(#v)));
            let (t, p, m, r) = (
                float(s.temperature),
                float(s.top_p),
                float(s.min_p),
                float(s.repetition_penalty),
            );
            let k = some(s.top_k.map(|k| quote!(#k)));
            quote!(::golden::Sampling {
                temperature: #t,
                top_k: #k,
                top_p: #p,
                min_p: #m,
                repetition_penalty: #r,
            })
        }));
        let beams = some(d.beams.map(|k| {
            let penalty = d.length_penalty.unwrap_or(1.0);
            let early = d.early_stopping;
            quote!(::golden::Beams {
                beams: #k,
                length_penalty: #penalty,
                early_stopping: #early,
            })
        }));
        quote!(.decode(::golden::Decode {
            over: ::std::string::String::from(#over),
            axis: #axis,
            padding: #padding,
            generate: #generate,
            window: #window,
            sample: #sample,
            beams: #beams,
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

    quote! {
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
                    #budget
                    #timeout
                    #speed
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
                        settings.set_snapshot_path(report.layer.declared().unwrap().snapshot_dir);
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
    }
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
