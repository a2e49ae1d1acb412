//! The grammar of the options' values: tokens into the plain description of `decl.rs`, keeping
//! the spans errors point at. Which option reads which grammar is the table's (`options.rs`);
//! what the values mean together is judged by `validate.rs`.
//!
//! A list goes on after a malformed item (`list`), so that every malformed item of a list is
//! reported, not only the first.

use crate::decl::{
    ArgDecl, Axis, BoundDecl, ConfigDecl, DecodeDecl, DimDecl, DimValueDecl, DistDecl, GradDecl,
    InvariantDecl, InvariantsDecl, KeyValue, OverfitDecl, SampleDecl, StepsDecl, ValueDecl,
    WrtName,
};
use crate::errors::Errors;
use quote::quote;
use syn::parse::ParseStream;
use syn::{bracketed, parenthesized, Error, Ident, Lit, LitInt, LitStr, Result, Token};

/// Skip to the next `,` of this level (or its end): where parsing goes on after a mistake.
pub fn skip_to_comma(input: ParseStream) {
    while !input.is_empty() && !input.peek(Token![,]) {
        // A token tree: a group (`(...)`, `[...]`) is skipped whole, commas inside it too.
        if input.parse::<proc_macro2::TokenTree>().is_err() {
            break;
        }
    }
}

/// `item, item, ...` (a trailing comma allowed): every item's mistake reported, each item parsed
/// after the previous one's mistake from its next comma on.
pub fn list<T>(
    input: ParseStream,
    mut item: impl FnMut(ParseStream) -> Result<T>,
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    let mut errors = Errors::default();
    while !input.is_empty() {
        match item(input) {
            Ok(v) => out.push(v),
            Err(e) => {
                errors.push_error(e);
                skip_to_comma(input);
            }
        }
        if input.is_empty() {
            break;
        }
        if let Err(e) = input.parse::<Token![,]>() {
            errors.push_error(e);
            skip_to_comma(input);
            let _ = input.parse::<Option<Token![,]>>();
        }
    }
    errors.finish().map(|()| out)
}

/// `(item, item, ...)`.
pub fn parenthesized_list<T>(
    input: ParseStream,
    item: impl FnMut(ParseStream) -> Result<T>,
) -> Result<Vec<T>> {
    let content;
    parenthesized!(content in input);
    list(&content, item)
}

/// Whether a parenthesized group follows (`grad(...)` rather than bare `grad`).
pub fn has_parens(input: ParseStream) -> bool {
    input.peek(syn::token::Paren)
}

/// `= <what>`.
pub fn equals<T: syn::parse::Parse>(input: ParseStream) -> Result<T> {
    input.parse::<Token![=]>()?;
    input.parse()
}

fn parse_usize(lit: &LitInt) -> Result<usize> {
    lit.base10_parse()
}

/// A signed number: `1`, `-2.5`, `1e-5`.
pub fn number(input: ParseStream) -> Result<f64> {
    let negative = input.parse::<Option<Token![-]>>()?.is_some();
    let lit: Lit = input.parse()?;
    let value = match &lit {
        Lit::Int(i) => i.base10_parse::<f64>()?,
        Lit::Float(f) => f.base10_parse::<f64>()?,
        other => return Err(Error::new(other.span(), "expected a number")),
    };
    Ok(if negative { -value } else { value })
}

/// `= N`, N at least 1.
pub fn count(key: &Ident, input: ParseStream) -> Result<u32> {
    input.parse::<Token![=]>()?;
    let lit: LitInt = input.parse()?;
    let n: u32 = lit.base10_parse()?;
    if n == 0 {
        return Err(Error::new(
            lit.span(),
            format!("`{key}` must be at least 1"),
        ));
    }
    Ok(n)
}

/// `name = lo..=hi`, `name = lo..hi` or `name = n`.
pub fn dim(input: ParseStream) -> Result<DimDecl> {
    let name: Ident = input.parse()?;
    input.parse::<Token![=]>()?;
    let lo_lit: LitInt = input
        .parse()
        .map_err(|e| Error::new(e.span(), "expected a range of sizes, like `1..=16`"))?;
    let lo = parse_usize(&lo_lit)?;
    let hi = if input.peek(Token![..=]) {
        input.parse::<Token![..=]>()?;
        parse_usize(&input.parse()?)?
    } else if input.peek(Token![..]) {
        input.parse::<Token![..]>()?;
        let hi_lit: LitInt = input.parse()?;
        let hi = parse_usize(&hi_lit)?;
        if hi == 0 || hi - 1 < lo {
            return Err(Error::new(
                hi_lit.span(),
                format!("`{lo}..{hi}` is an empty range"),
            ));
        }
        hi - 1
    } else {
        lo
    };
    if hi < lo {
        return Err(Error::new(
            lo_lit.span(),
            format!("`{lo}..={hi}` is an empty range"),
        ));
    }
    Ok(DimDecl { name, lo, hi })
}

fn axis(input: ParseStream) -> Result<Axis> {
    if (input.peek(LitInt) || input.peek(Ident))
        && (input.peek2(Token![,]) || input.peek2(syn::parse::End))
    {
        if input.peek(LitInt) {
            return Ok(Axis::Lit(parse_usize(&input.parse()?)?));
        }
        return Ok(Axis::Sym(input.parse()?));
    }
    let expr: syn::Expr = input.parse().map_err(|e| {
        Error::new(
            e.span(),
            "expected a dim name, a size or an integer expression of dims (`heads * head_dim`)",
        )
    })?;
    Ok(Axis::Expr(dim_value(&expr)?))
}

fn bound(input: ParseStream) -> Result<BoundDecl> {
    if input.peek(Ident) {
        return Ok(BoundDecl::Dim(input.parse()?));
    }
    let negative = input.parse::<Option<Token![-]>>()?.is_some();
    let lit: LitInt = input.parse()?;
    let n: i64 = lit.base10_parse()?;
    Ok(BoundDecl::Lit(if negative { -n } else { n }))
}

const DIST_HELP: &str = "expected a distribution: `normal(mean, std)`, `uniform(lo, hi)`, \
     `int(lo..hi)`, `bool` or `positions` (`positions(max)`)";

fn dist(input: ParseStream) -> Result<DistDecl> {
    let name: Ident = input.parse().map_err(|e| Error::new(e.span(), DIST_HELP))?;
    let two_numbers = |input: ParseStream| -> Result<(f64, f64)> {
        let content;
        parenthesized!(content in input);
        let a = number(&content)?;
        content.parse::<Token![,]>()?;
        let b = number(&content)?;
        content.parse::<Option<Token![,]>>()?;
        if !content.is_empty() {
            return Err(content.error("expected two numbers"));
        }
        Ok((a, b))
    };
    match name.to_string().as_str() {
        "normal" => {
            let (mean, std) = two_numbers(input).map_err(|e| {
                Error::new(
                    e.span(),
                    "expected `normal(mean, std)`, e.g. `normal(0.0, 1.0)`",
                )
            })?;
            if std < 0.0 {
                return Err(Error::new(
                    name.span(),
                    "the standard deviation must not be negative",
                ));
            }
            Ok(DistDecl::Normal(mean, std))
        }
        "uniform" => {
            let (lo, hi) = two_numbers(input).map_err(|e| {
                Error::new(
                    e.span(),
                    "expected `uniform(lo, hi)`, e.g. `uniform(0.0, 1.0)`",
                )
            })?;
            if hi <= lo {
                return Err(Error::new(name.span(), "`uniform(lo, hi)` needs lo < hi"));
            }
            Ok(DistDecl::Uniform(lo, hi))
        }
        "int" => {
            let content;
            parenthesized!(content in input);
            let lo = bound(&content).map_err(|e| {
                Error::new(e.span(), "expected `int(lo..hi)`, e.g. `int(0..vocab)`")
            })?;
            if content.peek(Token![..=]) {
                return Err(content
                    .error("`int(...)` takes an exclusive range `lo..hi` (like Python's range)"));
            }
            content.parse::<Token![..]>().map_err(|e| {
                Error::new(e.span(), "expected `int(lo..hi)`, e.g. `int(0..vocab)`")
            })?;
            let hi = bound(&content)?;
            if !content.is_empty() {
                return Err(content.error("expected `)` after `int(lo..hi`"));
            }
            Ok(DistDecl::Int(lo, hi))
        }
        "bool" => Ok(DistDecl::Bool),
        "positions" => {
            if !input.peek(syn::token::Paren) {
                return Ok(DistDecl::Positions(None));
            }
            let content;
            parenthesized!(content in input);
            let max = bound(&content).map_err(|e| {
                Error::new(
                    e.span(),
                    "expected `positions` (up to the configuration's max_position_embeddings) or \
                     `positions(max)`, a number or a dim",
                )
            })?;
            if !content.is_empty() {
                return Err(content.error("expected `)` after `positions(max`"));
            }
            Ok(DistDecl::Positions(Some(max)))
        }
        _ => Err(Error::new(name.span(), DIST_HELP)),
    }
}

/// `name = [axes] ~ dist`.
pub fn arg(input: ParseStream) -> Result<ArgDecl> {
    let name: Ident = input.parse()?;
    input.parse::<Token![=]>()?;
    if !input.peek(syn::token::Bracket) {
        return Err(input.error("expected a shape in brackets, like `[b, t, 64]`"));
    }
    let content;
    bracketed!(content in input);
    let shape = list(&content, axis)?;
    let dist = if input.peek(Token![~]) {
        input.parse::<Token![~]>()?;
        Some(dist(input)?)
    } else {
        None
    };
    Ok(ArgDecl { name, shape, dist })
}

const VALUE_HELP: &str = "expected a value: a number, a bool, a string, None, a dim or an integer \
     expression of dims (`d`, `2 * d`), a list `[...]` or a dict `{\"key\": value}`";

/// A value of `consts`, `init` or `config`.
fn value(input: ParseStream) -> Result<ValueDecl> {
    if input.peek(Ident) && input.peek2(syn::token::Paren) {
        let fork = input.fork();
        let key: Ident = fork.parse()?;
        if key == "one_of" {
            input.parse::<Ident>()?;
            let items = parenthesized_list(input, value)?;
            return Ok(ValueDecl::OneOf(key, items));
        }
    }
    if input.peek(syn::token::Bracket) {
        let content;
        bracketed!(content in input);
        return Ok(ValueDecl::List(list(&content, value)?));
    }
    if input.peek(syn::token::Brace) {
        let content;
        syn::braced!(content in input);
        let items = list(&content, |input| {
            let key: LitStr = input.parse().map_err(|e| {
                Error::new(
                    e.span(),
                    "a dict's keys are strings: `{\"rope_type\": \"default\"}`",
                )
            })?;
            input.parse::<Token![:]>()?;
            Ok((key, value(input)?))
        })?;
        return Ok(ValueDecl::Dict(items));
    }
    let expr: syn::Expr = input
        .parse()
        .map_err(|e| Error::new(e.span(), VALUE_HELP))?;
    value_of_expr(&expr)
}

/// A value from the expression syn parsed: a literal, `None`, or an integer expression of dims.
fn value_of_expr(expr: &syn::Expr) -> Result<ValueDecl> {
    use syn::{Expr, UnOp};
    match expr {
        Expr::Lit(lit) => match &lit.lit {
            Lit::Int(_) => Ok(ValueDecl::Int(quote!(#lit))),
            Lit::Float(_) => Ok(ValueDecl::Float(quote!(#lit))),
            Lit::Bool(_) => Ok(ValueDecl::Bool(quote!(#lit))),
            Lit::Str(s) => Ok(ValueDecl::Str(s.clone())),
            other => Err(Error::new(other.span(), VALUE_HELP)),
        },
        Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => match &*u.expr {
            Expr::Lit(lit) if matches!(lit.lit, Lit::Int(_)) => Ok(ValueDecl::Int(quote!(#expr))),
            Expr::Lit(lit) if matches!(lit.lit, Lit::Float(_)) => {
                Ok(ValueDecl::Float(quote!(#expr)))
            }
            _ => Ok(ValueDecl::Dims(dim_value(expr)?)),
        },
        Expr::Path(p) if p.path.is_ident("None") => Ok(ValueDecl::None),
        Expr::Range(r) => range_value(r),
        Expr::Path(_) | Expr::Binary(_) | Expr::Paren(_) => Ok(ValueDecl::Dims(dim_value(expr)?)),
        other => Err(Error::new_spanned(other, VALUE_HELP)),
    }
}

const DIM_VALUE_HELP: &str = "an integer expression of dims has dims, whole numbers, `+`, `-`, \
     `*`, `/` and parentheses: `d`, `2 * d`, `(heads + 1) * head_dim`, `hidden / heads`";

/// `lo..=hi` or `lo..hi` of integer literals: a sweep over the integers.
fn range_value(r: &syn::ExprRange) -> Result<ValueDecl> {
    use syn::{Expr, RangeLimits, UnOp};
    const HELP: &str = "a range of values has whole numbers at both ends: `1..=4` (or `1..5`)";
    let bound = |e: &Option<Box<Expr>>| -> Result<i64> {
        let Some(e) = e else {
            return Err(Error::new_spanned(r, HELP));
        };
        match &**e {
            Expr::Lit(lit) => match &lit.lit {
                Lit::Int(i) => i.base10_parse(),
                _ => Err(Error::new_spanned(e, HELP)),
            },
            Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => match &*u.expr {
                Expr::Lit(lit) => match &lit.lit {
                    Lit::Int(i) => Ok(-i.base10_parse::<i64>()?),
                    _ => Err(Error::new_spanned(e, HELP)),
                },
                _ => Err(Error::new_spanned(e, HELP)),
            },
            _ => Err(Error::new_spanned(e, HELP)),
        }
    };
    let lo = bound(&r.start)?;
    let mut hi = bound(&r.end)?;
    if matches!(r.limits, RangeLimits::HalfOpen(_)) {
        hi -= 1;
    }
    Ok(ValueDecl::Range(lo, hi, syn::spanned::Spanned::span(r)))
}

fn dim_value(expr: &syn::Expr) -> Result<DimValueDecl> {
    use syn::{BinOp, Expr, UnOp};
    match expr {
        Expr::Path(p) => match p.path.get_ident() {
            Some(ident) if p.qself.is_none() => Ok(DimValueDecl::Dim(ident.clone())),
            _ => Err(Error::new_spanned(
                p,
                "expected a dim's name (a single identifier declared in `dims(...)`)",
            )),
        },
        Expr::Lit(lit) => match &lit.lit {
            Lit::Int(i) => Ok(DimValueDecl::Lit(i.base10_parse()?)),
            other => Err(Error::new(other.span(), DIM_VALUE_HELP)),
        },
        Expr::Paren(p) => dim_value(&p.expr),
        Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => Ok(DimValueDecl::Op(
            '-',
            Box::new(DimValueDecl::Lit(0)),
            Box::new(dim_value(&u.expr)?),
        )),
        Expr::Binary(b) => {
            let op = match b.op {
                BinOp::Add(_) => '+',
                BinOp::Sub(_) => '-',
                BinOp::Mul(_) => '*',
                BinOp::Div(_) => '/',
                _ => return Err(Error::new_spanned(b.op, DIM_VALUE_HELP)),
            };
            Ok(DimValueDecl::Op(
                op,
                Box::new(dim_value(&b.left)?),
                Box::new(dim_value(&b.right)?),
            ))
        }
        other => Err(Error::new_spanned(other, DIM_VALUE_HELP)),
    }
}

/// `name = value`.
pub fn key_value(input: ParseStream) -> Result<KeyValue> {
    let name: Ident = input.parse()?;
    input.parse::<Token![=]>()?;
    Ok(KeyValue {
        name,
        value: value(input)?,
    })
}

/// `= "package.ConfigClass"` or `= "package.ConfigClass"(key = value, ...)`.
pub fn config(input: ParseStream) -> Result<ConfigDecl> {
    let help = |e: Error| {
        Error::new(
            e.span(),
            "expected `config = \"package.ConfigClass\"(key = value, ...)`, e.g. \
             `config = \"transformers.LlamaConfig\"(hidden_size = d)`",
        )
    };
    input.parse::<Token![=]>().map_err(help)?;
    let class: LitStr = input.parse().map_err(help)?;
    let values = if has_parens(input) {
        parenthesized_list(input, key_value)?
    } else {
        Vec::new()
    };
    Ok(ConfigDecl { class, values })
}

/// `= [f32, bf16]`: at least one.
pub fn dtypes(key: &Ident, input: ParseStream) -> Result<Vec<Ident>> {
    input.parse::<Token![=]>()?;
    let content;
    bracketed!(content in input);
    let dtypes = list(&content, |i| i.parse::<Ident>())?;
    if dtypes.is_empty() {
        return Err(Error::new(key.span(), "`dtypes` needs at least one dtype"));
    }
    Ok(dtypes)
}

/// `(atol = .., rtol = ..)`: (atol, rtol), the one not given 0.
pub fn tol(input: ParseStream) -> Result<(f64, f64)> {
    let content;
    parenthesized!(content in input);
    let input = &content;
    let mut atol = None;
    let mut rtol = None;
    let pairs = list(input, |input| {
        let key: Ident = input.parse()?;
        input.parse::<Token![=]>()?;
        Ok((key, number(input)?))
    })?;
    for (key, value) in pairs {
        let slot = match key.to_string().as_str() {
            "atol" => &mut atol,
            "rtol" => &mut rtol,
            _ => {
                return Err(Error::new(
                    key.span(),
                    "expected `atol = ..` or `rtol = ..`",
                ))
            }
        };
        if value < 0.0 {
            return Err(Error::new(key.span(), "a tolerance must not be negative"));
        }
        *slot = Some(value);
    }
    if atol.is_none() && rtol.is_none() {
        return Err(input.error("expected `tol(atol = .., rtol = ..)`"));
    }
    Ok((atol.unwrap_or(0.0), rtol.unwrap_or(0.0)))
}

/// `= seconds`, positive.
pub fn timeout(key: &Ident, input: ParseStream) -> Result<f64> {
    input.parse::<Token![=]>()?;
    let seconds = number(input)?;
    if seconds <= 0.0 {
        return Err(Error::new(
            key.span(),
            "`timeout` must be positive (seconds)",
        ));
    }
    Ok(seconds)
}

/// `(max = x)`: the most times the reference's time the port may take, positive.
pub fn speed(key: &Ident, input: ParseStream) -> Result<f64> {
    let help = || {
        format!(
            "expected `{key}(max = x)`: the most times the reference's time the port may take \
             (e.g. `{key}(max = 3.0)`)"
        )
    };
    if !has_parens(input) {
        return Err(Error::new(key.span(), help()));
    }
    let content;
    parenthesized!(content in input);
    let name: Ident = content.parse().map_err(|e| Error::new(e.span(), help()))?;
    if name != "max" {
        return Err(Error::new(name.span(), help()));
    }
    content.parse::<Token![=]>()?;
    let max = number(&content)?;
    if !content.is_empty() {
        return Err(content.error(help()));
    }
    if !(max.is_finite() && max > 0.0) {
        return Err(Error::new(
            name.span(),
            format!("`{key}(max = ..)` must be a positive factor (the port's time over the reference's)"),
        ));
    }
    Ok(max)
}

/// `= "60s"` (seconds) or `= "2m"` (minutes), positive: a time budget, in seconds.
pub fn budget(key: &Ident, input: ParseStream) -> Result<f64> {
    input.parse::<Token![=]>()?;
    let lit: LitStr = input.parse()?;
    let text = lit.value();
    let bad = || {
        Error::new(
            lit.span(),
            format!(
                "`{key} = {text:?}` is not a time budget: write seconds or minutes, like \
                 `{key} = \"60s\"` or `{key} = \"2m\"`"
            ),
        )
    };
    let seconds = parse_duration(&text).ok_or_else(bad)?;
    Ok(seconds)
}

/// `60s`, `1.5m`, `2min` as seconds (positive and finite), or `None`.
pub fn parse_duration(text: &str) -> Option<f64> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("min") {
        (n, 60.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        return None;
    };
    let value: f64 = number.trim().parse().ok()?;
    let seconds = value * scale;
    (seconds.is_finite() && seconds > 0.0).then_some(seconds)
}

/// `= init`, `= drawn`, `= drawn_all` or `= init_scale`.
pub fn params(input: ParseStream) -> Result<Ident> {
    let how: Ident = equals(input)?;
    if !["init", "drawn", "drawn_all", "init_scale"]
        .iter()
        .any(|h| how == h)
    {
        return Err(Error::new(
            how.span(),
            "expected `params = init` (the module's own initialisation), `params = drawn` (the \
             default: drawn per case at unit gain, frozen parameters and buffers computed at init \
             kept), `params = drawn_all` (those drawn too) or `params = init_scale` (drawn at \
             each entry's own initial scale)",
        ));
    }
    Ok(how)
}

/// `"from" = "to"` in `rename(...)`.
pub fn rename_pair(input: ParseStream) -> Result<(LitStr, LitStr)> {
    let help = |e: Error| {
        Error::new(
            e.span(),
            "expected `\"reference prefix\" = \"port prefix\"`, e.g. \
             `rename(\"layers.\" = \"encoder.layer.\")`",
        )
    };
    let from: LitStr = input.parse().map_err(help)?;
    input.parse::<Token![=]>().map_err(help)?;
    let to: LitStr = input.parse().map_err(help)?;
    Ok((from, to))
}

/// `(wrt = [...], eps = .., atol = .., rtol = .., mode = fast|full, cases = N)`, each optional.
pub fn grad(input: ParseStream) -> Result<GradDecl> {
    let mut grad = GradDecl::default();
    parenthesized_list(input, |input| {
        let key: Ident = input.parse()?;
        input.parse::<Token![=]>()?;
        match key.to_string().as_str() {
            "wrt" => {
                let content;
                bracketed!(content in input);
                grad.wrt = Some(list(&content, |i| {
                    if i.peek(LitStr) {
                        Ok(WrtName::Param(i.parse()?))
                    } else {
                        Ok(WrtName::Arg(i.parse()?))
                    }
                })?);
            }
            "eps" => grad.eps = Some(number(input)?),
            "atol" => grad.atol = Some(number(input)?),
            "rtol" => grad.rtol = Some(number(input)?),
            "mode" => {
                let mode: Ident = input.parse()?;
                grad.full = Some(match mode.to_string().as_str() {
                    "fast" => false,
                    "full" => true,
                    _ => {
                        return Err(Error::new(
                            mode.span(),
                            "expected `mode = fast` or `mode = full`",
                        ))
                    }
                });
            }
            "cases" => {
                let lit: LitInt = input.parse()?;
                grad.cases = Some(lit.base10_parse()?);
            }
            _ => {
                return Err(Error::new(
                    key.span(),
                    "expected one of `wrt = [..]`, `eps`, `atol`, `rtol`, `mode = fast|full`, \
                     `cases`",
                ))
            }
        }
        Ok(())
    })?;
    Ok(grad)
}

/// `(steps = N, loss = mse|cross_entropy, optimizer = sgd|adamw, lr = .., ratio = ..,
/// threshold = ..)`, each optional.
pub fn overfit(input: ParseStream) -> Result<OverfitDecl> {
    let mut o = OverfitDecl::default();
    parenthesized_list(input, |input| {
        let key: Ident = input.parse()?;
        if key == "steps" {
            o.steps = Some(count(&key, input)?);
            return Ok(());
        }
        input.parse::<Token![=]>()?;
        let positive = |v: f64| {
            if v > 0.0 {
                Ok(v)
            } else {
                Err(Error::new(key.span(), format!("`{key}` must be positive")))
            }
        };
        match key.to_string().as_str() {
            "loss" => {
                let loss: Ident = input.parse()?;
                if loss != "mse" && loss != "cross_entropy" {
                    return Err(Error::new(
                        loss.span(),
                        "expected `loss = mse` or `loss = cross_entropy`",
                    ));
                }
                o.loss = Some(loss);
            }
            "optimizer" => {
                let opt: Ident = input.parse()?;
                if opt != "sgd" && opt != "adamw" {
                    return Err(Error::new(
                        opt.span(),
                        "expected `optimizer = sgd` or `optimizer = adamw`",
                    ));
                }
                o.optimizer = Some(opt);
            }
            "lr" => o.lr = Some(positive(number(input)?)?),
            "ratio" => o.ratio = Some(positive(number(input)?)?),
            "threshold" => o.threshold = Some(positive(number(input)?)?),
            _ => return Err(Error::new(
                key.span(),
                "expected one of `steps`, `loss = mse|cross_entropy`, `optimizer = sgd|adamw`, \
                     `lr`, `ratio`, `threshold`",
            )),
        }
        Ok(())
    })?;
    Ok(o)
}

/// `(over = input_ids, axis = 1, padding, generate = N, window = W, sample(..) | beams = K,
/// length_penalty = L, early_stopping)`, each optional.
pub fn decode(key: &Ident, input: ParseStream) -> Result<DecodeDecl> {
    const HELP: &str = "expected `over = <argument>`, `axis = N`, `padding`, `generate = N`, \
                        `window = N`, `sample(temperature = .., top_k = .., top_p = .., \
                        min_p = .., repetition_penalty = ..)`, `beams = K`, \
                        `length_penalty = <float>` or `early_stopping`";
    let mut d = DecodeDecl::bare(key.clone());
    parenthesized_list(input, |input| {
        let key: Ident = input.parse()?;
        let number = |input: ParseStream| -> Result<usize> {
            input.parse::<Token![=]>()?;
            let lit: LitInt = input.parse()?;
            lit.base10_parse()
        };
        let at_least_one = |n: usize| {
            if n == 0 {
                return Err(Error::new(
                    key.span(),
                    format!("`{key}` must be at least 1"),
                ));
            }
            Ok(n)
        };
        match key.to_string().as_str() {
            "over" => d.over = Some(equals(input)?),
            "axis" => d.axis = Some(number(input)?),
            "padding" => d.padding = true,
            "generate" => d.generate = Some(at_least_one(number(input)?)?),
            "window" => d.window = Some(at_least_one(number(input)?)?),
            "sample" => d.sample = Some(sample(input)?),
            "beams" => d.beams = Some(at_least_one(number(input)?)?),
            "length_penalty" => {
                input.parse::<Token![=]>()?;
                let negative = input.peek(Token![-]);
                if negative {
                    input.parse::<Token![-]>()?;
                }
                let v: f64 = if input.peek(LitInt) {
                    input.parse::<LitInt>()?.base10_parse()?
                } else {
                    input.parse::<syn::LitFloat>()?.base10_parse()?
                };
                d.length_penalty = Some(if negative { -v } else { v });
            }
            "early_stopping" => d.early_stopping = true,
            _ => return Err(Error::new(key.span(), HELP)),
        }
        Ok(())
    })?;
    Ok(d)
}

/// `(temperature = 0.7, top_k = 8, top_p = 0.9, min_p = 0.05, repetition_penalty = 1.3)`, each
/// optional: `sample` alone (or `sample()`) draws from the softmax of the logits.
fn sample(input: ParseStream) -> Result<SampleDecl> {
    const HELP: &str = "expected `temperature = <float>`, `top_k = <integer>`, `top_p = <float>`, \
                        `min_p = <float>` or `repetition_penalty = <float>`";
    let mut s = SampleDecl::default();
    if !has_parens(input) {
        return Ok(s);
    }
    parenthesized_list(input, |input| {
        let key: Ident = input.parse()?;
        let float = |input: ParseStream| -> Result<f64> {
            input.parse::<Token![=]>()?;
            if input.peek(LitInt) {
                return input.parse::<LitInt>()?.base10_parse();
            }
            input.parse::<syn::LitFloat>()?.base10_parse()
        };
        match key.to_string().as_str() {
            "temperature" => s.temperature = Some(float(input)?),
            "top_k" => {
                input.parse::<Token![=]>()?;
                s.top_k = Some(input.parse::<LitInt>()?.base10_parse()?);
            }
            "top_p" => s.top_p = Some(float(input)?),
            "min_p" => s.min_p = Some(float(input)?),
            "repetition_penalty" => s.repetition_penalty = Some(float(input)?),
            _ => return Err(Error::new(key.span(), HELP)),
        }
        Ok(())
    })?;
    Ok(s)
}

/// `(over = k, carry(x = out, h = "out.1"))`.
pub fn steps(key: &Ident, input: ParseStream) -> Result<StepsDecl> {
    const HELP: &str = "expected `steps(over = <dim>, carry(<argument> = <output>, ...))`, e.g. \
                        `steps(over = k, carry(x = out))`";
    let mut over = None;
    let mut carry = Vec::new();
    parenthesized_list(input, |input| {
        let name: Ident = input.parse().map_err(|e| Error::new(e.span(), HELP))?;
        match name.to_string().as_str() {
            "over" => over = Some(equals::<Ident>(input)?),
            "carry" => {
                carry = parenthesized_list(input, |i| {
                    let arg: Ident = i.parse()?;
                    i.parse::<Token![=]>()?;
                    let leaf = if i.peek(LitStr) {
                        i.parse::<LitStr>()?.value()
                    } else {
                        i.parse::<Ident>()?.to_string()
                    };
                    Ok((arg, leaf))
                })?;
            }
            _ => return Err(Error::new(name.span(), HELP)),
        }
        Ok(())
    })?;
    let over = over.ok_or_else(|| Error::new(key.span(), HELP))?;
    Ok(StepsDecl {
        key: key.clone(),
        over,
        carry,
    })
}

/// One invariant as written: `finite`, `sums_to_one(dim = -1)`, `range(-10.0, 10.0)`; whether it
/// is one golden knows, with the right arguments, is a rule's to say.
fn invariant(input: ParseStream) -> Result<InvariantDecl> {
    let name: Ident = input.parse().map_err(|e| {
        Error::new(
            e.span(),
            "expected an invariant: `finite`, `non_negative`, `sums_to_one(dim = -1)` or \
             `range(lo, hi)`",
        )
    })?;
    let args = if has_parens(input) {
        Some(parenthesized_list(input, |i| {
            let span = i.span();
            let key = if i.peek(Ident) && i.peek2(Token![=]) {
                let key: Ident = i.parse()?;
                i.parse::<Token![=]>()?;
                Some(key)
            } else {
                None
            };
            Ok((key, number(i)?, span))
        })?)
    } else {
        None
    };
    Ok(InvariantDecl { name, args })
}

/// `(out = [finite, ...], "out.logits" = [...])`.
pub fn invariants(key: &Ident, input: ParseStream) -> Result<InvariantsDecl> {
    let leaves = parenthesized_list(input, |i| {
        let (leaf, span) = if i.peek(LitStr) {
            let s: LitStr = i.parse()?;
            (s.value(), s.span())
        } else {
            let ident: Ident = i.parse().map_err(|e| {
                Error::new(
                    e.span(),
                    "expected an output leaf: `out`, or a string such as `\"out.logits\"`",
                )
            })?;
            (ident.to_string(), ident.span())
        };
        i.parse::<Token![=]>()?;
        let content;
        bracketed!(content in i);
        Ok((leaf, span, list(&content, invariant)?))
    })?;
    Ok(InvariantsDecl {
        key: key.clone(),
        leaves,
    })
}
