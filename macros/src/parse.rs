//! Parsing `#[golden_layer(...)]` into a plain description that keeps every span for errors.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{bracketed, parenthesized, Error, Ident, Lit, LitInt, LitStr, Result, Token};

/// The options in the order the grammar lists them; used in the unknown-option error.
pub const OPTIONS: &[&str] = &[
    "reference",
    "backend",
    "dims",
    "args",
    "consts",
    "init",
    "config",
    "dtype",
    "dtypes",
    "tol",
    "cases",
    "grad",
    "overfit",
    "timeout",
    "trace",
    "params",
    "weights",
    "rename",
    "decode",
    "steps",
    "invariants",
];

/// `name = lo..=hi` (or `lo..hi`, or a single size).
pub struct DimDecl {
    pub name: Ident,
    pub lo: usize,
    pub hi: usize,
}

/// One axis of a shape.
pub enum Axis {
    Sym(Ident),
    Lit(usize),
    /// An integer expression of dims: `heads * head_dim`.
    Expr(DimValueDecl),
}

/// A bound of `int(lo..hi)`.
pub enum BoundDecl {
    Lit(i64),
    Dim(Ident),
}

/// `~ DIST`.
pub enum DistDecl {
    Normal(f64, f64),
    Uniform(f64, f64),
    Int(BoundDecl, BoundDecl),
    Bool,
    /// `positions` or `positions(max)`: position ids up to the configuration's (or `max`).
    Positions(Option<BoundDecl>),
}

/// `name = [axes] ~ dist`.
pub struct ArgDecl {
    pub name: Ident,
    pub shape: Vec<Axis>,
    pub dist: Option<DistDecl>,
}

/// A value of `consts(...)` / `init(...)` / `config = "..."(...)`: kept as tokens for the Rust
/// call, and as a `golden::Value` expression for the reference.
pub enum ValueDecl {
    Int(TokenStream),
    Float(TokenStream),
    Bool(TokenStream),
    Str(LitStr),
    List(Vec<ValueDecl>),
    /// `{"key": value, ...}`: a Python dict.
    Dict(Vec<(LitStr, ValueDecl)>),
    /// `None`.
    None,
    /// An integer from the case's dims: `d`, `2 * d`, `(a + b) * 4`, `d / h`.
    Dims(DimValueDecl),
    /// `one_of(a, b, ...)`: a configuration sweep, one value drawn per case (the keyword for
    /// errors).
    OneOf(Ident, Vec<ValueDecl>),
    /// `lo..=hi` (or `lo..hi`): a sweep over the integers, drawn per case (its span for errors).
    Range(i64, i64, proc_macro2::Span),
}

/// An integer expression of dims, with the spans of its dims for errors.
pub enum DimValueDecl {
    Dim(Ident),
    Lit(i64),
    /// `+`, `-`, `*` or `/`.
    Op(char, Box<DimValueDecl>, Box<DimValueDecl>),
}

impl DimValueDecl {
    /// Whether it divides by the number 0 somewhere.
    pub fn divides_by_zero(&self) -> bool {
        match self {
            DimValueDecl::Op('/', _, b) if matches!(**b, DimValueDecl::Lit(0)) => true,
            DimValueDecl::Op(_, a, b) => a.divides_by_zero() || b.divides_by_zero(),
            _ => false,
        }
    }

    /// The dims it names.
    pub fn dims(&self) -> Vec<&Ident> {
        match self {
            DimValueDecl::Dim(d) => vec![d],
            DimValueDecl::Lit(_) => Vec::new(),
            DimValueDecl::Op(_, a, b) => {
                let mut out = a.dims();
                out.extend(b.dims());
                out
            }
        }
    }
}

impl ValueDecl {
    /// Whether an integer expression of dims in it divides by the number 0.
    pub fn divides_by_zero(&self) -> bool {
        match self {
            ValueDecl::Dims(e) => e.divides_by_zero(),
            ValueDecl::List(items) | ValueDecl::OneOf(_, items) => {
                items.iter().any(ValueDecl::divides_by_zero)
            }
            ValueDecl::Dict(items) => items.iter().any(|(_, v)| v.divides_by_zero()),
            _ => false,
        }
    }

    /// The dims it names, anywhere inside it.
    pub fn dims(&self) -> Vec<&Ident> {
        match self {
            ValueDecl::Dims(e) => e.dims(),
            ValueDecl::List(items) | ValueDecl::OneOf(_, items) => {
                items.iter().flat_map(ValueDecl::dims).collect()
            }
            ValueDecl::Dict(items) => items.iter().flat_map(|(_, v)| v.dims()).collect(),
            _ => Vec::new(),
        }
    }
}

pub struct KeyValue {
    pub name: Ident,
    pub value: ValueDecl,
}

/// One name in `grad(wrt = [...])`: an argument (an identifier) or a parameter (a string).
pub enum WrtName {
    Arg(Ident),
    Param(LitStr),
}

/// `grad` or `grad(wrt = [...], eps = .., atol = .., rtol = .., mode = fast|full, cases = N)`.
#[derive(Default)]
pub struct GradDecl {
    pub wrt: Option<Vec<WrtName>>,
    pub eps: Option<f64>,
    pub atol: Option<f64>,
    pub rtol: Option<f64>,
    pub full: Option<bool>,
    pub cases: Option<u32>,
}

/// `overfit` or `overfit(steps = N, loss = mse|cross_entropy, optimizer = sgd|adamw, lr = ..,
/// ratio = .., threshold = ..)`.
pub struct OverfitDecl {
    /// The `overfit` keyword (errors about the form point here).
    pub key: Ident,
    pub steps: Option<u32>,
    pub loss: Option<Ident>,
    pub optimizer: Option<Ident>,
    pub lr: Option<f64>,
    pub ratio: Option<f64>,
    pub threshold: Option<f64>,
}

/// `decode` or `decode(over = input_ids, axis = 1, padding, generate = N, window = W)`: drive the
/// module through a schedule of calls.
pub struct DecodeDecl {
    /// The `decode` keyword (errors about the form point here).
    pub key: Ident,
    /// The sequence argument (default: the first of `args`).
    pub over: Option<Ident>,
    pub axis: Option<usize>,
    pub padding: bool,
    pub generate: Option<usize>,
    pub window: Option<usize>,
}

impl DecodeDecl {
    /// Bare `decode`: every option at its default.
    fn bare(key: Ident) -> Self {
        DecodeDecl {
            key,
            over: None,
            axis: None,
            padding: false,
            generate: None,
            window: None,
        }
    }
}

fn parse_decode(key: Ident, input: ParseStream) -> Result<DecodeDecl> {
    let mut d = DecodeDecl::bare(key);
    const HELP: &str = "expected `over = <argument>`, `axis = N`, `padding`, `generate = N` or \
                        `window = N`";
    while !input.is_empty() {
        let key: Ident = input.parse()?;
        let number = |input: ParseStream| -> Result<usize> {
            input.parse::<Token![=]>()?;
            let lit: LitInt = input.parse()?;
            lit.base10_parse()
        };
        match key.to_string().as_str() {
            "over" => {
                input.parse::<Token![=]>()?;
                d.over = Some(input.parse()?);
            }
            "axis" => d.axis = Some(number(input)?),
            "padding" => d.padding = true,
            "generate" => {
                let n = number(input)?;
                if n == 0 {
                    return Err(Error::new(key.span(), "`generate` must be at least 1"));
                }
                d.generate = Some(n);
            }
            "window" => {
                let n = number(input)?;
                if n == 0 {
                    return Err(Error::new(key.span(), "`window` must be at least 1"));
                }
                d.window = Some(n);
            }
            _ => return Err(Error::new(key.span(), HELP)),
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(d)
}

/// `steps(over = k, carry(x = out, h = "out.1"))`: drive a step function through a loop.
pub struct StepsDecl {
    /// The `steps` keyword.
    pub key: Ident,
    /// The dim that counts the steps.
    pub over: Ident,
    /// `(argument, output leaf)`.
    pub carry: Vec<(Ident, String)>,
}

fn parse_steps(key: Ident, input: ParseStream) -> Result<StepsDecl> {
    const HELP: &str = "expected `steps(over = <dim>, carry(<argument> = <output>, ...))`, e.g. \
                        `steps(over = k, carry(x = out))`";
    let mut over = None;
    let mut carry = Vec::new();
    while !input.is_empty() {
        let name: Ident = input.parse().map_err(|e| Error::new(e.span(), HELP))?;
        match name.to_string().as_str() {
            "over" => {
                input.parse::<Token![=]>()?;
                over = Some(input.parse::<Ident>()?);
            }
            "carry" => {
                let content;
                parenthesized!(content in input);
                carry = comma_list(&content, |i| {
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
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    let over = over.ok_or_else(|| Error::new(key.span(), HELP))?;
    Ok(StepsDecl { key, over, carry })
}

/// One invariant as written: `finite`, `sums_to_one(dim = -1)`, `range(-10.0, 10.0)`; checked
/// when rendered, so that every mistake is reported at once.
pub struct InvariantDecl {
    pub name: Ident,
    /// `None` without parentheses; else each argument: its keyword if any, its value, its span.
    pub args: Option<Vec<(Option<Ident>, f64, proc_macro2::Span)>>,
}

/// `invariants(out = [finite, ...], "out.logits" = [...])`: the leaf's name, its span, its
/// invariants.
pub struct InvariantsDecl {
    pub key: Ident,
    pub leaves: Vec<(String, proc_macro2::Span, Vec<InvariantDecl>)>,
}

fn parse_invariant(input: ParseStream) -> Result<InvariantDecl> {
    let name: Ident = input.parse().map_err(|e| {
        Error::new(
            e.span(),
            "expected an invariant: `finite`, `non_negative`, `sums_to_one(dim = -1)` or \
             `range(lo, hi)`",
        )
    })?;
    let args = if input.peek(syn::token::Paren) {
        let content;
        parenthesized!(content in input);
        Some(comma_list(&content, |i| {
            let span = i.span();
            let key = if i.peek(Ident) && i.peek2(Token![=]) {
                let key: Ident = i.parse()?;
                i.parse::<Token![=]>()?;
                Some(key)
            } else {
                None
            };
            Ok((key, parse_number(i)?, span))
        })?)
    } else {
        None
    };
    Ok(InvariantDecl { name, args })
}

fn parse_invariants(key: Ident, input: ParseStream) -> Result<InvariantsDecl> {
    let leaves = comma_list(input, |i| {
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
        Ok((leaf, span, comma_list(&content, parse_invariant)?))
    })?;
    Ok(InvariantsDecl { key, leaves })
}

/// The whole attribute.
#[derive(Default)]
pub struct Attr {
    pub reference: Option<LitStr>,
    pub backend: Option<LitStr>,
    pub dims: Vec<DimDecl>,
    pub args: Vec<ArgDecl>,
    pub consts: Vec<KeyValue>,
    pub init: Vec<KeyValue>,
    /// `config = "pkg.ConfigClass"(key = value, ...)`, with the keyword.
    pub config: Option<ConfigDecl>,
    pub dtypes: Option<(Ident, Vec<Ident>)>,
    pub tol: Option<(f64, f64)>,
    pub cases: Option<u32>,
    pub grad: Option<GradDecl>,
    pub overfit: Option<OverfitDecl>,
    /// Seconds.
    pub timeout: Option<f64>,
    /// The `trace` keyword, if given.
    pub trace: Option<Ident>,
    /// `params = init` (keep the module's own init) or `params = drawn` (the default), with the
    /// option's keyword for errors.
    pub params: Option<(Ident, Ident)>,
    /// `weights = "path"`, with the keyword.
    pub weights: Option<(Ident, LitStr)>,
    /// `rename("from" = "to", ...)`, with the keyword.
    pub rename: Option<(Ident, Vec<(LitStr, LitStr)>)>,
    /// `decode(...)`.
    pub decode: Option<DecodeDecl>,
    /// `steps(...)`.
    pub steps: Option<StepsDecl>,
    /// `invariants(...)`.
    pub invariants: Option<InvariantsDecl>,
}

/// `config = "pkg.ConfigClass"` or `config = "pkg.ConfigClass"(key = value, ...)`.
pub struct ConfigDecl {
    pub key: Ident,
    pub class: LitStr,
    pub values: Vec<KeyValue>,
}

/// `"from" = "to"` in `rename(...)`.
fn parse_rename(input: ParseStream) -> Result<(LitStr, LitStr)> {
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

fn comma_list<T>(input: ParseStream, item: fn(ParseStream) -> Result<T>) -> Result<Vec<T>> {
    let list: Punctuated<T, Token![,]> = Punctuated::parse_terminated_with(input, item)?;
    Ok(list.into_iter().collect())
}

fn parse_usize(lit: &LitInt) -> Result<usize> {
    lit.base10_parse()
}

/// A signed number: `1`, `-2.5`, `1e-5`.
fn parse_number(input: ParseStream) -> Result<f64> {
    let negative = input.parse::<Option<Token![-]>>()?.is_some();
    let lit: Lit = input.parse()?;
    let value = match &lit {
        Lit::Int(i) => i.base10_parse::<f64>()?,
        Lit::Float(f) => f.base10_parse::<f64>()?,
        other => return Err(Error::new(other.span(), "expected a number")),
    };
    Ok(if negative { -value } else { value })
}

fn parse_dim(input: ParseStream) -> Result<DimDecl> {
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

fn parse_axis(input: ParseStream) -> Result<Axis> {
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

fn parse_bound(input: ParseStream) -> Result<BoundDecl> {
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

fn parse_dist(input: ParseStream) -> Result<DistDecl> {
    let name: Ident = input.parse().map_err(|e| Error::new(e.span(), DIST_HELP))?;
    let two_numbers = |input: ParseStream| -> Result<(f64, f64)> {
        let content;
        parenthesized!(content in input);
        let a = parse_number(&content)?;
        content.parse::<Token![,]>()?;
        let b = parse_number(&content)?;
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
            let lo = parse_bound(&content).map_err(|e| {
                Error::new(e.span(), "expected `int(lo..hi)`, e.g. `int(0..vocab)`")
            })?;
            if content.peek(Token![..=]) {
                return Err(content
                    .error("`int(...)` takes an exclusive range `lo..hi` (like Python's range)"));
            }
            content.parse::<Token![..]>().map_err(|e| {
                Error::new(e.span(), "expected `int(lo..hi)`, e.g. `int(0..vocab)`")
            })?;
            let hi = parse_bound(&content)?;
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
            let max = parse_bound(&content).map_err(|e| {
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

fn parse_arg(input: ParseStream) -> Result<ArgDecl> {
    let name: Ident = input.parse()?;
    input.parse::<Token![=]>()?;
    if !input.peek(syn::token::Bracket) {
        return Err(input.error("expected a shape in brackets, like `[b, t, 64]`"));
    }
    let content;
    bracketed!(content in input);
    let shape = comma_list(&content, parse_axis)?;
    let dist = if input.peek(Token![~]) {
        input.parse::<Token![~]>()?;
        Some(parse_dist(input)?)
    } else {
        None
    };
    Ok(ArgDecl { name, shape, dist })
}

const VALUE_HELP: &str = "expected a value: a number, a bool, a string, None, a dim or an integer \
     expression of dims (`d`, `2 * d`), a list `[...]` or a dict `{\"key\": value}`";

fn parse_value(input: ParseStream) -> Result<ValueDecl> {
    parse_plain_value(input)
}

fn parse_plain_value(input: ParseStream) -> Result<ValueDecl> {
    if input.peek(Ident) && input.peek2(syn::token::Paren) {
        let fork = input.fork();
        let key: Ident = fork.parse()?;
        if key == "one_of" {
            input.parse::<Ident>()?;
            let content;
            parenthesized!(content in input);
            let items = comma_list(&content, parse_value)?;
            return Ok(ValueDecl::OneOf(key, items));
        }
    }
    if input.peek(syn::token::Bracket) {
        let content;
        bracketed!(content in input);
        return Ok(ValueDecl::List(comma_list(&content, parse_value)?));
    }
    if input.peek(syn::token::Brace) {
        let content;
        syn::braced!(content in input);
        let items = comma_list(&content, |input| {
            let key: LitStr = input.parse().map_err(|e| {
                Error::new(
                    e.span(),
                    "a dict's keys are strings: `{\"rope_type\": \"default\"}`",
                )
            })?;
            input.parse::<Token![:]>()?;
            Ok((key, parse_value(input)?))
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

fn parse_key_value(input: ParseStream) -> Result<KeyValue> {
    let name: Ident = input.parse()?;
    input.parse::<Token![=]>()?;
    Ok(KeyValue {
        name,
        value: parse_value(input)?,
    })
}

fn parse_grad(input: ParseStream) -> Result<GradDecl> {
    let mut grad = GradDecl::default();
    while !input.is_empty() {
        let key: Ident = input.parse()?;
        input.parse::<Token![=]>()?;
        match key.to_string().as_str() {
            "wrt" => {
                let content;
                bracketed!(content in input);
                grad.wrt = Some(comma_list(&content, |i| {
                    if i.peek(LitStr) {
                        Ok(WrtName::Param(i.parse()?))
                    } else {
                        Ok(WrtName::Arg(i.parse()?))
                    }
                })?);
            }
            "eps" => grad.eps = Some(parse_number(input)?),
            "atol" => grad.atol = Some(parse_number(input)?),
            "rtol" => grad.rtol = Some(parse_number(input)?),
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
            _ => return Err(Error::new(
                key.span(),
                "expected one of `wrt = [..]`, `eps`, `atol`, `rtol`, `mode = fast|full`, `cases`",
            )),
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(grad)
}

impl OverfitDecl {
    /// Bare `overfit`: every option at its default.
    fn bare(key: Ident) -> Self {
        OverfitDecl {
            key,
            steps: None,
            loss: None,
            optimizer: None,
            lr: None,
            ratio: None,
            threshold: None,
        }
    }
}

fn parse_overfit(key: Ident, input: ParseStream) -> Result<OverfitDecl> {
    let mut o = OverfitDecl::bare(key);
    while !input.is_empty() {
        let key: Ident = input.parse()?;
        input.parse::<Token![=]>()?;
        let positive = |v: f64| {
            if v > 0.0 {
                Ok(v)
            } else {
                Err(Error::new(key.span(), format!("`{key}` must be positive")))
            }
        };
        match key.to_string().as_str() {
            "steps" => {
                let lit: LitInt = input.parse()?;
                let n: u32 = lit.base10_parse()?;
                if n == 0 {
                    return Err(Error::new(lit.span(), "`steps` must be at least 1"));
                }
                o.steps = Some(n);
            }
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
            "lr" => o.lr = Some(positive(parse_number(input)?)?),
            "ratio" => o.ratio = Some(positive(parse_number(input)?)?),
            "threshold" => o.threshold = Some(positive(parse_number(input)?)?),
            _ => return Err(Error::new(
                key.span(),
                "expected one of `steps`, `loss = mse|cross_entropy`, `optimizer = sgd|adamw`, \
                     `lr`, `ratio`, `threshold`",
            )),
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(o)
}

fn parse_tol(input: ParseStream) -> Result<(f64, f64)> {
    let mut atol = None;
    let mut rtol = None;
    let pairs = comma_list(input, |input| {
        let key: Ident = input.parse()?;
        input.parse::<Token![=]>()?;
        Ok((key, parse_number(input)?))
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

impl Parse for Attr {
    fn parse(input: ParseStream) -> Result<Self> {
        let mut attr = Attr::default();
        let mut errors: Option<Error> = None;
        let mut seen: Vec<String> = Vec::new();
        while !input.is_empty() {
            let key: Ident = input.parse()?;
            let name = key.to_string();
            if seen.contains(&name) {
                return Err(Error::new(key.span(), format!("`{name}` is given twice")));
            }
            seen.push(name.clone());
            let content;
            match name.as_str() {
                "reference" | "backend" => {
                    input.parse::<Token![=]>()?;
                    let value: LitStr = input.parse()?;
                    if name == "reference" {
                        attr.reference = Some(value);
                    } else {
                        attr.backend = Some(value);
                    }
                }
                "dims" => {
                    parenthesized!(content in input);
                    attr.dims = comma_list(&content, parse_dim)?;
                }
                "args" => {
                    parenthesized!(content in input);
                    attr.args = comma_list(&content, parse_arg)?;
                }
                "consts" => {
                    parenthesized!(content in input);
                    attr.consts = comma_list(&content, parse_key_value)?;
                }
                "init" => {
                    parenthesized!(content in input);
                    attr.init = comma_list(&content, parse_key_value)?;
                }
                "config" => {
                    let help = |e: Error| {
                        Error::new(
                            e.span(),
                            "expected `config = \"package.ConfigClass\"(key = value, ...)`, e.g. \
                             `config = \"transformers.LlamaConfig\"(hidden_size = d)`",
                        )
                    };
                    input.parse::<Token![=]>().map_err(help)?;
                    let class: LitStr = input.parse().map_err(help)?;
                    let values = if input.peek(syn::token::Paren) {
                        parenthesized!(content in input);
                        comma_list(&content, parse_key_value)?
                    } else {
                        Vec::new()
                    };
                    attr.config = Some(ConfigDecl {
                        key: key.clone(),
                        class,
                        values,
                    });
                }
                "dtype" => {
                    input.parse::<Token![=]>()?;
                    let dtype: Ident = input.parse()?;
                    attr.dtypes = Some((key.clone(), vec![dtype]));
                }
                "dtypes" => {
                    input.parse::<Token![=]>()?;
                    bracketed!(content in input);
                    let list = comma_list(&content, |i| i.parse::<Ident>())?;
                    if list.is_empty() {
                        return Err(Error::new(key.span(), "`dtypes` needs at least one dtype"));
                    }
                    attr.dtypes = Some((key.clone(), list));
                }
                "tol" => {
                    parenthesized!(content in input);
                    attr.tol = Some(parse_tol(&content)?);
                }
                "grad" => {
                    attr.grad = Some(if input.peek(syn::token::Paren) {
                        parenthesized!(content in input);
                        parse_grad(&content)?
                    } else {
                        GradDecl::default()
                    });
                }
                "overfit" => {
                    attr.overfit = Some(if input.peek(syn::token::Paren) {
                        parenthesized!(content in input);
                        parse_overfit(key.clone(), &content)?
                    } else {
                        OverfitDecl::bare(key.clone())
                    });
                }
                "trace" => attr.trace = Some(key.clone()),
                "steps" => {
                    parenthesized!(content in input);
                    attr.steps = Some(parse_steps(key.clone(), &content)?);
                }
                "invariants" => {
                    parenthesized!(content in input);
                    attr.invariants = Some(parse_invariants(key.clone(), &content)?);
                }
                "decode" => {
                    attr.decode = Some(if input.peek(syn::token::Paren) {
                        parenthesized!(content in input);
                        parse_decode(key.clone(), &content)?
                    } else {
                        DecodeDecl::bare(key.clone())
                    });
                }
                "params" => {
                    input.parse::<Token![=]>()?;
                    let how: Ident = input.parse()?;
                    if how != "init" && how != "drawn" && how != "drawn_all" {
                        return Err(Error::new(
                            how.span(),
                            "expected `params = init` (the module's own initialisation), \
                             `params = drawn` (the default: drawn per case, frozen parameters and \
                             buffers computed at init kept) or `params = drawn_all` (those drawn \
                             too)",
                        ));
                    }
                    attr.params = Some((key.clone(), how));
                }
                "weights" => {
                    input.parse::<Token![=]>()?;
                    attr.weights = Some((key.clone(), input.parse()?));
                }
                "rename" => {
                    parenthesized!(content in input);
                    attr.rename = Some((key.clone(), comma_list(&content, parse_rename)?));
                }
                "timeout" => {
                    input.parse::<Token![=]>()?;
                    let seconds = parse_number(input)?;
                    if seconds <= 0.0 {
                        return Err(Error::new(
                            key.span(),
                            "`timeout` must be positive (seconds)",
                        ));
                    }
                    attr.timeout = Some(seconds);
                }
                "cases" => {
                    input.parse::<Token![=]>()?;
                    let lit: LitInt = input.parse()?;
                    let n: u32 = lit.base10_parse()?;
                    if n == 0 {
                        return Err(Error::new(lit.span(), "`cases` must be at least 1"));
                    }
                    attr.cases = Some(n);
                }
                _ => {
                    let e = Error::new(
                        key.span(),
                        format!(
                            "unknown option `{name}`; expected one of: {}",
                            OPTIONS.join(", ")
                        ),
                    );
                    match &mut errors {
                        Some(all) => all.combine(e),
                        None => errors = Some(e),
                    }
                    // Skip the option's value so that later options are still checked.
                    while !input.is_empty() && !input.peek(Token![,]) {
                        input.parse::<proc_macro2::TokenTree>()?;
                    }
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        match errors {
            Some(e) => Err(e),
            None => Ok(attr),
        }
    }
}

impl ToTokens for Axis {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.extend(match self {
            Axis::Sym(s) => {
                let s = s.to_string();
                quote!(::golden::DimExpr::Sym(::std::string::String::from(#s)))
            }
            Axis::Lit(n) => quote!(::golden::DimExpr::Lit(#n)),
            Axis::Expr(e) => {
                let e = crate::render::dim_value_expr(e);
                quote!(::golden::DimExpr::Expr(#e))
            }
        })
    }
}
