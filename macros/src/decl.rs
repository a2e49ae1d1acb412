//! The attribute as a plain description: what `parse.rs` reads from the tokens, with the span of
//! everything a mistake can be about, for `validate.rs` to judge and `render.rs` to emit.

use proc_macro2::{Span, TokenStream};
use syn::{Ident, LitStr};

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
    Range(i64, i64, Span),
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
#[derive(Default)]
pub struct OverfitDecl {
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
    /// `sample(temperature = .., top_k = .., top_p = .., min_p = .., repetition_penalty = ..)`:
    /// generate by sampling, each parameter optional.
    pub sample: Option<SampleDecl>,
    /// `beams = K`: generate by beam search with K beams.
    pub beams: Option<usize>,
    /// `length_penalty = L` (with `beams`).
    pub length_penalty: Option<f64>,
    /// `early_stopping` (with `beams`).
    pub early_stopping: bool,
}

/// `sample(...)` inside `decode(...)`: the sampling parameters of `generate(do_sample=True)`.
#[derive(Default)]
pub struct SampleDecl {
    pub temperature: Option<f64>,
    pub top_k: Option<usize>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
}

impl DecodeDecl {
    /// Bare `decode`: every option at its default.
    pub fn bare(key: Ident) -> Self {
        DecodeDecl {
            key,
            over: None,
            axis: None,
            padding: false,
            generate: None,
            window: None,
            sample: None,
            beams: None,
            length_penalty: None,
            early_stopping: false,
        }
    }
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

/// One invariant as written: `finite`, `sums_to_one(dim = -1)`, `range(-10.0, 10.0)`; checked
/// when rendered, so that every mistake is reported at once.
pub struct InvariantDecl {
    pub name: Ident,
    /// `None` without parentheses; else each argument: its keyword if any, its value, its span.
    pub args: Option<Vec<(Option<Ident>, f64, Span)>>,
}

/// `invariants(out = [finite, ...], "out.logits" = [...])`: the leaf's name, its span, its
/// invariants.
pub struct InvariantsDecl {
    pub key: Ident,
    pub leaves: Vec<(String, Span, Vec<InvariantDecl>)>,
}

/// The whole attribute.
#[derive(Default)]
pub struct Attr {
    /// The options given, by their keyword, in the order written (each once).
    pub given: Vec<Ident>,
    /// The options whose value did not parse: their errors are the parser's, and the rules that
    /// read them are skipped (what they would say would follow from that mistake, not add one).
    pub broken: Vec<String>,
    pub reference: Option<LitStr>,
    pub backend: Option<LitStr>,
    pub dims: Vec<DimDecl>,
    pub args: Vec<ArgDecl>,
    pub consts: Vec<KeyValue>,
    pub init: Vec<KeyValue>,
    /// `config = "pkg.ConfigClass"(key = value, ...)`, with the keyword.
    pub config: Option<ConfigDecl>,
    /// `dtype = f32`, with the keyword.
    pub dtype: Option<(Ident, Ident)>,
    /// `dtypes = [f32, bf16]`, with the keyword.
    pub dtypes: Option<(Ident, Vec<Ident>)>,
    pub tol: Option<(f64, f64)>,
    pub cases: Option<u32>,
    /// `budget = "60s"`, in seconds.
    pub budget: Option<f64>,
    pub grad: Option<GradDecl>,
    pub overfit: Option<OverfitDecl>,
    /// Seconds.
    pub timeout: Option<f64>,
    /// `speed(max = x)`: the most times the reference's time the port may take.
    pub speed: Option<f64>,
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

impl Attr {
    /// The keyword of option `name`, if given.
    pub fn key(&self, name: &str) -> Option<&Ident> {
        self.given.iter().find(|k| *k == name)
    }

    /// Whether option `name` was given and its value did not parse.
    pub fn is_broken(&self, name: &str) -> bool {
        self.broken.iter().any(|b| b == name)
    }

    /// The dtypes as written (`dtypes = [..]`, else `dtype = ..`); `None`: the default.
    pub fn dtype_list(&self) -> Option<&[Ident]> {
        match (&self.dtypes, &self.dtype) {
            (Some((_, list)), _) => Some(list),
            (None, Some((_, one))) => Some(std::slice::from_ref(one)),
            (None, None) => None,
        }
    }

    /// The named values: `consts(...)`, then `init(...)`, then `config`'s.
    pub fn values(&self) -> impl Iterator<Item = &KeyValue> {
        self.consts
            .iter()
            .chain(&self.init)
            .chain(self.config.iter().flat_map(|c| &c.values))
    }
}

/// `config = "pkg.ConfigClass"` or `config = "pkg.ConfigClass"(key = value, ...)`.
pub struct ConfigDecl {
    pub class: LitStr,
    pub values: Vec<KeyValue>,
}
