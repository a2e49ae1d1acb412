//! What a check is about: the description of one layer and its reference.
//!
//! `#[golden_layer(...)]` parses its attribute into exactly this (see the macro's `render.rs`), and
//! tests that want to drive the runtime without the macro build the same thing by hand:
//!
//! ```no_run
//! use golden::{Dist, Layer};
//! let layer = Layer::function("gelu", "zoo_ref.gelu")
//!     .dim("n", 1, 64)
//!     .arg("x", ["n"], Dist::normal(0.0, 1.0));
//! ```

use candle_core::DType;
use std::fmt;

/// How the reference is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// A Python callable, called with the tensors positionally and the consts as keywords.
    Function,
    /// An `nn.Module` class, constructed with `init(...)` under the case seed; the Rust port takes a
    /// `VarBuilder` serving the module's `state_dict()`.
    Module,
}

impl Form {
    /// The name used on the wire and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Form::Function => "function",
            Form::Module => "module",
        }
    }
}

/// How tensors reach the reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// As `torch.Tensor` (the default).
    Torch,
    /// As `numpy.ndarray` (bf16 arrives as float32; float outputs are cast to the case dtype).
    Numpy,
}

impl Backend {
    /// The name used on the wire and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Torch => "torch",
            Backend::Numpy => "numpy",
        }
    }
}

/// One axis of an argument's shape: a symbolic dim, a fixed size, or an integer expression of dims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DimExpr {
    /// A dim declared in `dims(...)`, drawn per case.
    Sym(String),
    /// A fixed size.
    Lit(usize),
    /// A size computed from the case's dims (`heads * head_dim`); a negative value counts as 0.
    Expr(DimValue),
}

impl DimExpr {
    /// The dims this axis depends on.
    pub fn dims(&self) -> Vec<&str> {
        match self {
            DimExpr::Sym(s) => vec![s.as_str()],
            DimExpr::Lit(_) => Vec::new(),
            DimExpr::Expr(e) => e.dims(),
        }
    }
}

impl From<&str> for DimExpr {
    fn from(name: &str) -> Self {
        DimExpr::Sym(name.to_string())
    }
}

impl From<DimValue> for DimExpr {
    fn from(e: DimValue) -> Self {
        DimExpr::Expr(e)
    }
}

impl From<usize> for DimExpr {
    fn from(size: usize) -> Self {
        DimExpr::Lit(size)
    }
}

impl fmt::Display for DimExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DimExpr::Sym(s) => f.write_str(s),
            DimExpr::Lit(n) => write!(f, "{n}"),
            DimExpr::Expr(e) => write!(f, "{e}"),
        }
    }
}

/// A bound of an `int(lo..hi)` distribution: a number or a dim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bound {
    /// A fixed number.
    Lit(i64),
    /// The value a dim takes in the case.
    Dim(String),
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bound::Lit(n) => write!(f, "{n}"),
            Bound::Dim(d) => f.write_str(d),
        }
    }
}

/// How an argument's values are drawn.
#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    /// Gaussian floats. The only distribution the per-case value styles (zeros, tiny, large, round,
    /// special values) apply to: `normal` declares "any real number, typically this big".
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
    /// Uniform floats in `[lo, hi)`; a declared domain, so value styles leave it alone.
    Uniform {
        /// Lower bound (inclusive).
        lo: f64,
        /// Upper bound (exclusive).
        hi: f64,
    },
    /// Uniform integers in `[lo, hi)`, as an i64 tensor.
    Int {
        /// Lower bound (inclusive).
        lo: Bound,
        /// Upper bound (exclusive).
        hi: Bound,
    },
    /// Booleans (a u8 tensor of 0/1 in candle, `torch.bool` in the reference).
    Bool,
    /// Position ids (an i64 tensor, positions along the last axis): `0..t` for the simple value
    /// styles (zeros, round), and otherwise sparse and long — sorted, distinct, drawn
    /// log-uniformly below `max` with the last of each row in its top half — so that what only
    /// shows far into a sequence (a rotary table built in bf16, wrong past 256) shows without a
    /// long sequence. `max` is the module's `max_position_embeddings` (or `n_positions`) of
    /// `config`/`init` when not given.
    Positions {
        /// The number of positions; `None`: the configuration's.
        max: Option<Bound>,
    },
}

impl Dist {
    /// `normal(mean, std)`.
    pub fn normal(mean: f64, std: f64) -> Self {
        Dist::Normal { mean, std }
    }
    /// `uniform(lo, hi)`.
    pub fn uniform(lo: f64, hi: f64) -> Self {
        Dist::Uniform { lo, hi }
    }
    /// `int(lo..hi)` (hi exclusive).
    pub fn int(lo: impl Into<BoundArg>, hi: impl Into<BoundArg>) -> Self {
        Dist::Int {
            lo: lo.into().0,
            hi: hi.into().0,
        }
    }
    /// Whether values of this distribution are floats (and so take the case dtype).
    pub fn is_float(&self) -> bool {
        matches!(self, Dist::Normal { .. } | Dist::Uniform { .. })
    }
}

impl Default for Dist {
    fn default() -> Self {
        Dist::normal(0.0, 1.0)
    }
}

impl fmt::Display for Dist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dist::Normal { mean, std } => write!(f, "normal({mean:?}, {std:?})"),
            Dist::Uniform { lo, hi } => write!(f, "uniform({lo:?}, {hi:?})"),
            Dist::Int { lo, hi } => write!(f, "int({lo}..{hi})"),
            Dist::Bool => f.write_str("bool"),
            Dist::Positions { max: None } => f.write_str("positions"),
            Dist::Positions { max: Some(max) } => write!(f, "positions({max})"),
        }
    }
}

/// Helper so that `Dist::int(0, "vocab")` accepts numbers and dim names alike.
pub struct BoundArg(Bound);

impl From<i64> for BoundArg {
    fn from(n: i64) -> Self {
        BoundArg(Bound::Lit(n))
    }
}

impl From<&str> for BoundArg {
    fn from(d: &str) -> Self {
        BoundArg(Bound::Dim(d.to_string()))
    }
}

/// An integer computed from a case's dims: `d`, `2 * d`, `heads * head_dim`. Resolved per case
/// ([`DimValue::eval`]); descriptions and snapshots show it as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DimValue {
    /// The value a dim takes in the case.
    Dim(String),
    /// A fixed number.
    Lit(i64),
    /// A sum.
    Add(Box<DimValue>, Box<DimValue>),
    /// A difference.
    Sub(Box<DimValue>, Box<DimValue>),
    /// A product.
    Mul(Box<DimValue>, Box<DimValue>),
    /// A quotient, rounded toward zero as Rust's and Python's `//` on non-negative sizes
    /// (`hidden / heads`); a division by zero is 0 ([`Layer`]'s validation rejects a divisor that
    /// can be 0).
    Div(Box<DimValue>, Box<DimValue>),
}

impl DimValue {
    /// A dim's value.
    pub fn dim(name: &str) -> Self {
        DimValue::Dim(name.to_string())
    }

    /// Its value in a case with these dims (a dim the case lacks counts as 0: [`Layer`]'s
    /// validation rejects those before any case runs). Saturates instead of overflowing.
    pub fn eval(&self, dims: &[(String, usize)]) -> i64 {
        match self {
            DimValue::Dim(d) => dims
                .iter()
                .find(|(n, _)| n == d)
                .map_or(0, |&(_, v)| i64::try_from(v).unwrap_or(i64::MAX)),
            DimValue::Lit(n) => *n,
            DimValue::Add(a, b) => a.eval(dims).saturating_add(b.eval(dims)),
            DimValue::Sub(a, b) => a.eval(dims).saturating_sub(b.eval(dims)),
            DimValue::Mul(a, b) => a.eval(dims).saturating_mul(b.eval(dims)),
            DimValue::Div(a, b) => a.eval(dims).checked_div(b.eval(dims)).unwrap_or(0),
        }
    }

    /// The dims it names, in order of appearance.
    pub fn dims(&self) -> Vec<&str> {
        match self {
            DimValue::Dim(d) => vec![d.as_str()],
            DimValue::Lit(_) => Vec::new(),
            DimValue::Add(a, b)
            | DimValue::Sub(a, b)
            | DimValue::Mul(a, b)
            | DimValue::Div(a, b) => {
                let mut out = a.dims();
                out.extend(b.dims());
                out
            }
        }
    }

    /// 0 for a sum or difference, 1 for a product, 2 for an atom (parentheses by precedence).
    fn precedence(&self) -> u8 {
        match self {
            DimValue::Add(..) | DimValue::Sub(..) => 0,
            DimValue::Mul(..) | DimValue::Div(..) => 1,
            _ => 2,
        }
    }
}

impl fmt::Display for DimValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let operand = |f: &mut fmt::Formatter<'_>, v: &DimValue, min: u8| {
            if v.precedence() < min {
                write!(f, "({v})")
            } else {
                write!(f, "{v}")
            }
        };
        match self {
            DimValue::Dim(d) => f.write_str(d),
            DimValue::Lit(n) => write!(f, "{n}"),
            DimValue::Add(a, b) => {
                operand(f, a, 0)?;
                f.write_str(" + ")?;
                operand(f, b, 0)
            }
            DimValue::Sub(a, b) => {
                operand(f, a, 0)?;
                f.write_str(" - ")?;
                operand(f, b, 1)
            }
            DimValue::Mul(a, b) => {
                operand(f, a, 1)?;
                f.write_str(" * ")?;
                operand(f, b, 2)
            }
            DimValue::Div(a, b) => {
                operand(f, a, 1)?;
                f.write_str(" / ")?;
                operand(f, b, 2)
            }
        }
    }
}

/// A non-tensor value: a const (Rust argument and Python keyword), a module constructor keyword or
/// a keyword of its configuration class.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A bool.
    Bool(bool),
    /// A string.
    Str(String),
    /// A list (a Rust array literal; a Python list).
    List(Vec<Value>),
    /// A Python dict with string keys, in the declared order (`{"rope_type": "default"}`).
    Dict(Vec<(String, Value)>),
    /// Python's `None`.
    None,
    /// An integer computed from the case's dims (`hidden_size = d`), resolved per case
    /// ([`Value::resolve`]).
    Dims(DimValue),
    /// A configuration sweep: one of these values, drawn per case (`one_of(None, 30.0)`); the first
    /// is where shrinking goes. Only at the top of a value (not inside a list or a dict).
    OneOf(Vec<Value>),
    /// A configuration sweep over the integers `lo..=hi`, drawn per case; shrinking goes to `lo`.
    Range(i64, i64),
}

impl Value {
    /// A dim's value in each case: `Value::dim("d")`.
    pub fn dim(name: &str) -> Self {
        Value::Dims(DimValue::dim(name))
    }

    /// `one_of(...)` of these values (`Value::one_of([Value::None, 30.0.into()])`).
    pub fn one_of(values: impl IntoIterator<Item = Value>) -> Self {
        Value::OneOf(values.into_iter().collect())
    }

    /// The integer, if it is one (a port reading its case's values: `i.value("head_dim")`).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// The number, if it is one (an integer too).
    pub fn as_float(&self) -> Option<f64> {
        match self {
            Value::Float(x) => Some(*x),
            Value::Int(n) => Some(*n as f64),
            _ => None,
        }
    }

    /// The bool, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// Whether the value depends on the case's dims (anywhere inside it, a sweep's alternatives
    /// included).
    pub fn mentions_dims(&self) -> bool {
        match self {
            Value::Dims(_) => true,
            Value::List(items) | Value::OneOf(items) => items.iter().any(Value::mentions_dims),
            Value::Dict(items) => items.iter().any(|(_, v)| v.mentions_dims()),
            _ => false,
        }
    }

    /// Whether the value is drawn per case (`one_of(...)`, `lo..=hi`).
    pub fn is_swept(&self) -> bool {
        matches!(self, Value::OneOf(_) | Value::Range(..))
    }

    /// How many of its values a sweep's plan tries whatever else: every alternative of a
    /// `one_of`, the two bounds of a range (one when it holds a single value).
    pub fn values_to_try(&self) -> usize {
        match self {
            Value::Range(..) => self.alternatives().clamp(1, 2),
            other => other.alternatives().max(1),
        }
    }

    /// How many values a sweep draws from (1 for a value that is not swept).
    pub fn alternatives(&self) -> usize {
        match self {
            Value::OneOf(items) => items.len(),
            Value::Range(lo, hi) => {
                usize::try_from(hi.saturating_sub(*lo)).map_or(usize::MAX, |n| n.saturating_add(1))
            }
            _ => 1,
        }
    }

    /// A sweep's `index`-th value (as written: dims unresolved); the value itself when it is not
    /// swept.
    pub fn alternative(&self, index: usize) -> Value {
        match self {
            Value::OneOf(items) => items
                .get(index)
                .or(items.last())
                .cloned()
                .unwrap_or(Value::None),
            Value::Range(lo, hi) => Value::Int(
                lo.saturating_add(i64::try_from(index).unwrap_or(i64::MAX))
                    .min(*hi),
            ),
            other => other.clone(),
        }
    }

    /// The value of keyword `field` in a case with these dims and picks: a sweep's drawn
    /// alternative, and dims resolved.
    pub fn in_case(&self, field: &str, dims: &[(String, usize)], picks: &[Pick]) -> Value {
        let value = if self.is_swept() {
            let index = picks
                .iter()
                .find(|p| p.field == field)
                .map_or(0, |p| p.index);
            self.alternative(index)
        } else {
            self.clone()
        };
        value.resolve(dims)
    }

    /// The dims it names, in order of appearance.
    pub fn dims(&self) -> Vec<&str> {
        match self {
            Value::Dims(e) => e.dims(),
            Value::List(items) | Value::OneOf(items) => {
                items.iter().flat_map(Value::dims).collect()
            }
            Value::Dict(items) => items.iter().flat_map(|(_, v)| v.dims()).collect(),
            _ => Vec::new(),
        }
    }

    /// The value in a case with these dims: every [`Value::Dims`] becomes its integer (a sweep
    /// stays a sweep: [`Layer::for_case`] picks its alternative first).
    pub fn resolve(&self, dims: &[(String, usize)]) -> Value {
        match self {
            Value::Dims(e) => Value::Int(e.eval(dims)),
            Value::OneOf(items) => Value::OneOf(items.iter().map(|v| v.resolve(dims)).collect()),
            Value::List(items) => Value::List(items.iter().map(|v| v.resolve(dims)).collect()),
            Value::Dict(items) => Value::Dict(
                items
                    .iter()
                    .map(|(k, v)| (k.clone(), v.resolve(dims)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    /// As JSON for the worker (a dict's keys sorted). A value that still depends on dims (not
    /// [`resolve`](Value::resolve)d) is written as its expression, a string.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Int(n) => serde_json::Value::from(*n),
            Value::Float(x) => serde_json::Value::from(*x),
            Value::Bool(b) => serde_json::Value::from(*b),
            Value::Str(s) => serde_json::Value::from(s.as_str()),
            Value::List(items) => {
                serde_json::Value::Array(items.iter().map(Value::to_json).collect())
            }
            Value::Dict(items) => serde_json::Value::Object(
                items
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
            Value::None => serde_json::Value::Null,
            Value::Dims(e) => serde_json::Value::from(e.to_string()),
            Value::OneOf(_) | Value::Range(..) => serde_json::Value::from(self.to_string()),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(n) => write!(f, "{n}"),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::List(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Value::Dict(items) => {
                f.write_str("{")?;
                for (i, (k, v)) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k:?}: {v}")?;
                }
                f.write_str("}")
            }
            Value::None => f.write_str("None"),
            Value::Dims(e) => write!(f, "{e}"),
            Value::OneOf(items) => {
                f.write_str("one_of(")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str(")")
            }
            Value::Range(lo, hi) => write!(f, "{lo}..={hi}"),
        }
    }
}

/// What a case drew for one swept value (`consts`, `init` or `config` value written `one_of(...)`
/// or `lo..=hi`): the alternative's index, and the alternative as written, for people to read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pick {
    /// The keyword (`softcap`, `head_dim`).
    pub field: String,
    /// Which alternative (0 is the first, where shrinking goes); for `lo..=hi`, the value − lo.
    pub index: usize,
    /// The alternative as written (`30.0`, `2 * d / h`, `None`).
    pub shown: String,
}

impl Pick {
    /// The alternative as `GOLDEN_CASE` writes it: as written when that is a plain token (a
    /// number, a bool, `None`, a short string), else `#<index>`.
    pub fn token(&self) -> String {
        let plain = !self.shown.is_empty()
            && self
                .shown
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-+\"".contains(c));
        if plain {
            self.shown.clone()
        } else {
            format!("#{}", self.index)
        }
    }
}

impl fmt::Display for Pick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.field, self.shown)
    }
}

/// Keywords and their values, as the worker reads them (a JSON object).
pub(crate) fn values_json(values: &[(String, Value)]) -> serde_json::Value {
    serde_json::Value::Object(
        values
            .iter()
            .map(|(k, v)| (k.clone(), v.to_json()))
            .collect(),
    )
}

/// `name = value, ...` as a description shows keywords.
fn keywords(values: &[(String, Value)]) -> String {
    values
        .iter()
        .map(|(k, v)| format!("{k} = {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Module form: the reference is built from a configuration class (`config =
/// "transformers.LlamaConfig"(hidden_size = d, ...)`): golden constructs `class(**values)` and
/// passes it to the module's constructor as its `config` keyword (or, for a constructor without
/// one, its first argument), beside `init(...)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Dotted Python path of the configuration class.
    pub class: String,
    /// Its keywords.
    pub values: Vec<(String, Value)>,
}

impl Config {
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"class": self.class, "values": values_json(&self.values)})
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.class, keywords(&self.values))
    }
}

macro_rules! value_from {
    ($($t:ty => $variant:ident as $conv:ty),* $(,)?) => {
        $(impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::$variant(v as $conv)
            }
        })*
    };
}
value_from!(i32 => Int as i64, i64 => Int as i64, usize => Int as i64, f32 => Float as f64, f64 => Float as f64);

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_string())
    }
}

/// A symbolic dim and its inclusive range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimSpec {
    /// Its name, used in `args(...)` shapes.
    pub name: String,
    /// Smallest value (inclusive).
    pub lo: usize,
    /// Largest value (inclusive).
    pub hi: usize,
}

/// A tensor parameter: its name, shape and value distribution.
#[derive(Clone, Debug, PartialEq)]
pub struct ArgSpec {
    /// The Rust parameter's name.
    pub name: String,
    /// One entry per axis.
    pub shape: Vec<DimExpr>,
    /// How its values are drawn.
    pub dist: Dist,
}

/// An explicit tolerance: `|port − reference| ≤ atol + rtol·|reference|`, nothing else.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    /// Absolute part.
    pub atol: f64,
    /// Relative part.
    pub rtol: f64,
}

/// Everything a check needs to know about one layer and its reference.
#[derive(Clone, Debug)]
pub struct Layer {
    /// The Rust function's name (the check's name in reports).
    pub(crate) name: String,
    /// Dotted Python path of the reference.
    pub(crate) reference: String,
    /// Function or module form.
    pub(crate) form: Form,
    /// How tensors reach the reference.
    pub(crate) backend: Backend,
    /// Symbolic dims, drawn per case.
    pub(crate) dims: Vec<DimSpec>,
    /// Tensor parameters, in the Rust signature's order (the reference gets them in this order).
    pub(crate) args: Vec<ArgSpec>,
    /// Non-tensor values given to both sides (Python keywords).
    pub(crate) consts: Vec<(String, Value)>,
    /// Constructor keywords of the reference module (module form).
    pub(crate) init: Vec<(String, Value)>,
    /// Module form: the configuration object the module is built from (`config = "..."(...)`).
    pub(crate) config: Option<Config>,
    /// Float dtypes to check, each with the same cases.
    pub(crate) dtypes: Vec<DType>,
    /// An explicit tolerance; `None` means golden's default rule (see `compare.rs`).
    pub(crate) tol: Option<Tol>,
    /// Number of generated cases per dtype (`GOLDEN_CASES` overrides).
    pub(crate) cases: u32,
    /// A time budget for the whole check (`budget = "60s"`; `GOLDEN_BUDGET` overrides): as many of
    /// the `cases` run as fit in it, at least one.
    pub(crate) budget: Option<std::time::Duration>,
    /// Where the check is declared (set by the macro with [`declared!`](crate::declared)); without
    /// it there is no regression file, no snapshot path and no golden store.
    pub(crate) declared: Option<Declared>,
    /// A mode for this check alone, over `GOLDEN_MODE` (tests of golden itself use it: the
    /// environment is shared by every test thread).
    pub(crate) mode: Option<crate::describe::env::Mode>,
    /// The gradient check's options (`grad(...)`).
    pub(crate) grad: Option<crate::describe::checks::GradSpec>,
    /// The overfit check's options (`overfit(...)`); `None` runs it with the defaults.
    pub(crate) overfit: Option<crate::describe::checks::OverfitSpec>,
    /// How long the reference may take on one request, and the port on one call
    /// (`timeout = secs`); `None`: `GOLDEN_TIMEOUT`, default 60 s.
    pub(crate) timeout: Option<std::time::Duration>,
    /// Module form: compare the port's taps ([`crate::judge::trace::tap`]) with the reference's submodule outputs
    /// (`trace` on the attribute; see `trace.rs`).
    pub(crate) trace: bool,
    /// Module form: where the reference module's parameters come from (`params = init`,
    /// `weights = "..."`; drawn per case by default).
    pub(crate) params: Params,
    /// Module form, drawn parameters: at unit gain (the default) or at each entry's own initial
    /// scale (`params = init_scale`).
    pub(crate) param_scale: ParamScale,
    /// Module form: `rename(from = to, ...)`: the reference's state_dict names starting with
    /// `from` are served to the port starting with `to` instead (first match wins).
    pub(crate) rename: Vec<(String, String)>,
    /// Module form: drive the module through a schedule of calls (`decode(...)`; see
    /// `describe/schedule.rs`) instead of one forward.
    pub(crate) decode: Option<crate::describe::schedule::Decode>,
    /// Drive a step function through a loop of steps (`steps(...)`; see `describe/schedule.rs`).
    pub(crate) steps: Option<crate::describe::schedule::StepLoop>,
    /// Properties of the port's outputs checked on every case (`invariants(out = [finite, ...])`;
    /// see `describe/invariants.rs`), by leaf, in declaration order.
    pub(crate) invariants: Vec<(String, Vec<crate::describe::invariants::Invariant>)>,
    /// At most this many times the reference's time (`speed(max = N)`): the forward check fails
    /// with a speed failure when its timed runs agree the port is slower (`run/speed.rs`).
    pub(crate) speed_max: Option<f64>,
}

/// How drawn parameters are scaled (`params = init_scale`; `answers/params.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ParamScale {
    /// Every weight of two or more dimensions with a spread of at least `1/√fan_in` (an
    /// embedding's rows 1): each layer passes on what it reads at its size, so every weight and
    /// every configuration value shows in the outputs.
    #[default]
    UnitGain,
    /// Each entry with its own initial spread (Hugging Face's 0.02; `params = init_scale`).
    Init,
}

/// Where a module-form check's parameters come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Params {
    /// Every floating-point entry of the reference module's state_dict re-drawn per case, seeded
    /// like the inputs, keeping each tensor's scale and domain (`answers/params.rs`): constant
    /// inits (a norm's 1 and 0, zeroed biases, BatchNorm's running statistics) hide bugs. Frozen
    /// parameters and buffers the module computes at init from a formula keep their values: their
    /// value is their meaning (Whisper's sinusoidal positions).
    #[default]
    Drawn,
    /// Like `Drawn`, and frozen parameters and buffers the module computes at init are drawn
    /// too (`params = drawn_all`), where `Drawn` keeps their values.
    DrawnAll,
    /// The module's own initialisation under the case seed (`params = init`).
    Init,
    /// The tensors of a `.safetensors` checkpoint, the same on both sides (`weights = "path"`,
    /// relative to the crate), by the port's names or the reference's.
    Weights(String),
}

/// Where a check is declared: what `golden::declared!()` captures in the crate under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Declared {
    /// `file!()`: proptest keeps failing seeds beside it.
    pub source_file: &'static str,
    /// `module_path!()`: names the check's snapshot, store and results.
    pub module_path: &'static str,
    /// The crate's manifest dir: `<it>/reference_py` is an import root.
    pub manifest_dir: &'static str,
    /// The package name, for the commands golden prints (`cargo test -p <it>`).
    pub package: &'static str,
    /// Where the check's snapshot and golden store live (`<manifest dir>/snapshots`).
    pub snapshot_dir: &'static str,
}

/// Capture where a check is declared, in the crate that expands it.
#[macro_export]
macro_rules! declared {
    () => {
        $crate::Declared {
            source_file: ::std::file!(),
            module_path: ::std::module_path!(),
            manifest_dir: ::std::env!("CARGO_MANIFEST_DIR"),
            package: ::std::env!("CARGO_PKG_NAME"),
            snapshot_dir: ::std::concat!(::std::env!("CARGO_MANIFEST_DIR"), "/snapshots"),
        }
    };
}

/// Default number of generated cases.
pub const DEFAULT_CASES: u32 = 32;

impl Layer {
    fn new(name: &str, reference: &str, form: Form) -> Self {
        Layer {
            name: name.to_string(),
            reference: reference.to_string(),
            form,
            backend: Backend::Torch,
            dims: Vec::new(),
            args: Vec::new(),
            consts: Vec::new(),
            init: Vec::new(),
            config: None,
            dtypes: vec![DType::F32],
            tol: None,
            cases: DEFAULT_CASES,
            budget: None,
            declared: None,
            mode: None,
            grad: None,
            overfit: None,
            timeout: None,
            trace: false,
            params: Params::Drawn,
            param_scale: ParamScale::UnitGain,
            rename: Vec::new(),
            decode: None,
            steps: None,
            invariants: Vec::new(),
            speed_max: None,
        }
    }

    /// A layer whose reference is a Python callable.
    pub fn function(name: &str, reference: &str) -> Self {
        Self::new(name, reference, Form::Function)
    }

    /// A layer whose reference is an `nn.Module` class.
    pub fn module(name: &str, reference: &str) -> Self {
        Self::new(name, reference, Form::Module)
    }

    /// Use another backend.
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Declare a dim drawn from `lo..=hi` (a dim declared again keeps its place and takes the new
    /// range).
    pub fn dim(mut self, name: &str, lo: usize, hi: usize) -> Self {
        let spec = DimSpec {
            name: name.to_string(),
            lo,
            hi,
        };
        match self.dims.iter_mut().find(|d| d.name == name) {
            Some(d) => *d = spec,
            None => self.dims.push(spec),
        }
        self
    }

    /// Declare the next tensor parameter (a parameter declared again keeps its place and takes
    /// the new shape and distribution).
    pub fn arg<D: Into<DimExpr>>(
        mut self,
        name: &str,
        shape: impl IntoIterator<Item = D>,
        dist: Dist,
    ) -> Self {
        let spec = ArgSpec {
            name: name.to_string(),
            shape: shape.into_iter().map(Into::into).collect(),
            dist,
        };
        match self.args.iter_mut().find(|a| a.name == name) {
            Some(a) => *a = spec,
            None => self.args.push(spec),
        }
        self
    }

    /// The same check under another name (its snapshot, store and messages follow the name).
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// The same check against another reference (a dotted Python path).
    pub fn against(mut self, reference: &str) -> Self {
        self.reference = reference.to_string();
        self
    }

    /// The check's name (the function's name under the attribute).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The reference: a dotted Python path.
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// The declared dims, in declaration order.
    pub fn dims(&self) -> &[DimSpec] {
        &self.dims
    }

    /// The declared tensor parameters, in signature order.
    pub fn args(&self) -> &[ArgSpec] {
        &self.args
    }

    /// The configuration class and its keywords, when the reference is built from one.
    pub fn configuration(&self) -> Option<&Config> {
        self.config.as_ref()
    }

    /// The decode schedule, when the check follows the layer through one.
    pub fn decoding(&self) -> Option<&crate::describe::schedule::Decode> {
        self.decode.as_ref()
    }

    /// Where the check is declared (`None` for a layer built without the macro).
    pub fn declared(&self) -> Option<Declared> {
        self.declared
    }

    /// A const: a Python keyword (the Rust port gets it as a plain argument).
    pub fn konst(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.consts.push((name.to_string(), value.into()));
        self
    }

    /// A constructor keyword of the reference module.
    pub fn init(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.init.push((name.to_string(), value.into()));
        self
    }

    /// Module form: build the reference module from a configuration object, `class(**values)`
    /// (`config = "transformers.LlamaConfig"` in the attribute); add its keywords with
    /// [`Layer::config_value`].
    pub fn config(mut self, class: &str) -> Self {
        self.config = Some(Config {
            class: class.to_string(),
            values: Vec::new(),
        });
        self
    }

    /// A keyword of the configuration class (after [`Layer::config`]; a keyword given again keeps
    /// its place and takes the new value).
    pub fn config_value(mut self, name: &str, value: impl Into<Value>) -> Self {
        let values = &mut self
            .config
            .as_mut()
            .expect("Layer::config_value needs Layer::config first")
            .values;
        let value = value.into();
        match values.iter_mut().find(|(k, _)| k == name) {
            Some((_, v)) => *v = value,
            None => values.push((name.to_string(), value)),
        }
        self
    }

    /// Whether a const, an init or a config value depends on the case's dims.
    pub fn values_mention_dims(&self) -> bool {
        self.values().any(|(_, v)| v.mentions_dims())
    }

    /// Whether a const, an init or a config value changes from case to case: it depends on the
    /// dims or is swept (`one_of(...)`, `lo..=hi`).
    pub fn values_vary(&self) -> bool {
        self.values()
            .any(|(_, v)| v.mentions_dims() || v.is_swept())
    }

    /// Every const, init and config value, in that order (the order a Rust parameter of the same
    /// name looks for its value in).
    pub fn values(&self) -> impl Iterator<Item = (&String, &Value)> {
        self.consts
            .iter()
            .chain(&self.init)
            .chain(self.config.iter().flat_map(|c| &c.values))
            .map(|(k, v)| (k, v))
    }

    /// The swept values (`one_of(...)`, `lo..=hi`), by keyword, in the order of [`Layer::values`]:
    /// what each case draws a configuration of (see `describe/sweep.rs`).
    pub fn sweeps(&self) -> Vec<(&str, &Value)> {
        self.values()
            .filter(|(_, v)| v.is_swept())
            .map(|(k, v)| (k.as_str(), v))
            .collect()
    }

    /// The number of cases that try every value of every swept field: the most values one field
    /// has to try (a range tries its two bounds). 0 without sweeps.
    pub fn cases_for_each_value(&self) -> usize {
        self.sweeps()
            .iter()
            .map(|(_, v)| v.values_to_try())
            .max()
            .unwrap_or(0)
    }

    /// What a case drew for the swept value `field`: its `index`-th alternative.
    pub fn pick(&self, field: &str, index: usize) -> Pick {
        let shown = self
            .values()
            .find(|(k, v)| *k == field && v.is_swept())
            .map(|(_, v)| v.alternative(index).to_string())
            .unwrap_or_default();
        Pick {
            field: field.to_string(),
            index,
            shown,
        }
    }

    /// The layer as one case sees it: every swept value its drawn alternative (`picks`), then
    /// every value that depends on dims resolved ([`Value::resolve`]). Borrowed when no value
    /// varies. Requests, store keys (so a store keys its answers by configuration), the module's
    /// construction and failure artifacts use it; the description keeps the values as written.
    pub fn for_case(
        &self,
        dims: &[(String, usize)],
        picks: &[Pick],
    ) -> std::borrow::Cow<'_, Layer> {
        if !self.values_vary() {
            return std::borrow::Cow::Borrowed(self);
        }
        let resolve = |values: &[(String, Value)]| -> Vec<(String, Value)> {
            values
                .iter()
                .map(|(k, v)| (k.clone(), v.in_case(k, dims, picks)))
                .collect()
        };
        let mut layer = self.clone();
        layer.consts = resolve(&self.consts);
        layer.init = resolve(&self.init);
        if let Some(config) = &mut layer.config {
            config.values = resolve(&config.values);
        }
        std::borrow::Cow::Owned(layer)
    }

    /// What the module is constructed from, as one text (its `init` and config, as sent to the
    /// worker): the module's parameters are the same for the same text. Of a layer
    /// [`for_case`](Layer::for_case) when values depend on dims.
    pub fn construction_key(&self) -> String {
        let mut key = values_json(&self.init).to_string();
        if let Some(config) = &self.config {
            key.push(' ');
            key.push_str(&config.to_json().to_string());
        }
        key
    }

    /// Check in these float dtypes.
    pub fn dtypes(mut self, dtypes: &[DType]) -> Self {
        self.dtypes = dtypes.to_vec();
        self
    }

    /// Replace the default tolerance rule by `atol + rtol·|reference|`.
    pub fn tol(mut self, atol: f64, rtol: f64) -> Self {
        self.tol = Some(Tol { atol, rtol });
        self
    }

    /// Number of generated cases per dtype.
    pub fn cases(mut self, cases: u32) -> Self {
        self.cases = cases;
        self
    }

    /// A time budget for the whole check, in seconds (`budget = "60s"`): the check runs as many
    /// of its cases as fit, at least one; the golden store keeps the count (see the book's
    /// whole-models chapter). `GOLDEN_BUDGET` overrides it.
    pub fn budget(mut self, seconds: f64) -> Self {
        self.budget = Some(std::time::Duration::from_secs_f64(seconds));
        self
    }

    /// The gradient check's options (`grad(...)` in the attribute).
    pub fn grad(mut self, spec: crate::describe::checks::GradSpec) -> Self {
        self.grad = Some(spec);
        self
    }

    /// The overfit check's options (`overfit(...)` in the attribute).
    pub fn overfit(mut self, spec: crate::describe::checks::OverfitSpec) -> Self {
        self.overfit = Some(spec);
        self
    }

    /// How long the reference may take on one request, and the port on one call, in seconds
    /// (over `GOLDEN_TIMEOUT`).
    pub fn timeout(mut self, seconds: f64) -> Self {
        self.timeout = Some(std::time::Duration::from_secs_f64(seconds));
        self
    }

    /// Fail the forward check when the port takes more than `max` times the reference's time on
    /// the case it is timed on, its timed runs agreeing (`speed(max = N)`: the port's lower
    /// quartile over the reference's upper quartile is above `max`): a failure of its own
    /// kind ([`FailureKind::Speed`](crate::FailureKind::Speed)), after the numbers matched.
    pub fn speed_max(mut self, max: f64) -> Self {
        self.speed_max = Some(max);
        self
    }

    /// Trace the forward check: the port's taps against every submodule's output.
    pub fn trace(mut self) -> Self {
        self.trace = true;
        self
    }

    /// Module form: keep the reference module's own initialisation (`params = init`) instead of
    /// drawing its parameters per case.
    pub fn params_init(mut self) -> Self {
        self.params = Params::Init;
        self
    }

    /// Module form: draw frozen parameters and buffers the module computes at init too
    /// (`params = drawn_all`), which the default keeps as the module has them.
    pub fn params_drawn_all(mut self) -> Self {
        self.params = Params::DrawnAll;
        self
    }

    /// Module form: draw the parameters at each entry's own initial scale (`params =
    /// init_scale`) rather than at unit gain (the default: every weight with a spread of at least
    /// `1/√fan_in`, an embedding's rows 1).
    pub fn params_init_scale(mut self) -> Self {
        self.params = Params::Drawn;
        self.param_scale = ParamScale::Init;
        self
    }

    /// Module form, drawn parameters: how they are scaled.
    pub fn param_scale(&self) -> ParamScale {
        self.param_scale
    }

    /// Module form: serve the tensors of a `.safetensors` checkpoint to both sides (`weights =
    /// "path"`, relative to the crate's manifest dir unless absolute).
    pub fn weights(mut self, path: &str) -> Self {
        self.params = Params::Weights(path.to_string());
        self
    }

    /// Module form: serve the reference's names starting with `from` to the port as starting with
    /// `to` (`rename(from = to)`).
    pub fn rename(mut self, from: &str, to: &str) -> Self {
        self.rename.push((from.to_string(), to.to_string()));
        self
    }

    /// Module form: drive the module through a schedule of calls over a sequence input
    /// (`decode(...)` in the attribute; see `describe/schedule.rs`).
    pub fn decode(mut self, decode: crate::describe::schedule::Decode) -> Self {
        self.decode = Some(decode);
        self
    }

    /// Drive the layer, a step function, through a loop of steps (`steps(...)` in the attribute).
    pub fn steps(mut self, steps: crate::describe::schedule::StepLoop) -> Self {
        self.steps = Some(steps);
        self
    }

    /// Declare an invariant of the output leaf `leaf` (`out`, `out.0`, `out.logits`), checked on
    /// the port's outputs on every case (`invariants(...)` in the attribute).
    pub fn invariant(
        mut self,
        leaf: &str,
        invariant: crate::describe::invariants::Invariant,
    ) -> Self {
        match self.invariants.iter_mut().find(|(l, _)| l == leaf) {
            Some((_, list)) => list.push(invariant),
            None => self.invariants.push((leaf.to_string(), vec![invariant])),
        }
        self
    }

    /// A step loop's plan for the arguments: those whose first axis is the steps' dim are per
    /// step, and which are carried from which output.
    pub fn loop_plan(&self) -> Option<crate::describe::schedule::LoopPlan> {
        let l = self.steps.as_ref()?;
        let per_step = self
            .args
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a.shape.first(), Some(DimExpr::Sym(d)) if *d == l.over))
            .map(|(i, _)| i)
            .collect();
        let carry = l
            .carry
            .iter()
            .filter_map(|(arg, leaf)| {
                let i = self.args.iter().position(|a| &a.name == arg)?;
                Some((i, leaf.clone()))
            })
            .collect();
        Some(crate::describe::schedule::LoopPlan { per_step, carry })
    }

    /// The layer without `decode` or `steps`: what the gradient and training checks of a port
    /// that keeps state run (one forward of the whole input, the prefill).
    pub fn without_schedule(&self) -> std::borrow::Cow<'_, Layer> {
        if self.decode.is_none() && self.steps.is_none() {
            return std::borrow::Cow::Borrowed(self);
        }
        let mut layer = self.clone();
        layer.decode = None;
        layer.steps = None;
        std::borrow::Cow::Owned(layer)
    }

    /// The sliding window a schedule is drawn around: `decode(window = w)`, else the
    /// configuration's `sliding_window` when it is a number.
    pub fn window(&self) -> Option<usize> {
        let decode = self.decode.as_ref()?;
        decode.window.or_else(|| {
            let (_, value) = self
                .config
                .iter()
                .flat_map(|c| &c.values)
                .chain(&self.init)
                .find(|(k, _)| k == "sliding_window")?;
            match value {
                Value::Int(w) if *w > 0 => usize::try_from(*w).ok(),
                _ => None,
            }
        })
    }

    /// The module's number of positions as its configuration gives it (`max_position_embeddings`,
    /// or `n_positions`, in `config` or `init`), as written: a number, a dim or a sweep.
    pub fn max_positions(&self) -> Option<&Value> {
        self.config
            .iter()
            .flat_map(|c| &c.values)
            .chain(&self.init)
            .find(|(k, _)| k == "max_position_embeddings" || k == "n_positions")
            .map(|(_, v)| v)
    }

    /// The index of the argument a schedule splits, and its sequence axis.
    pub fn scheduled_arg(&self) -> Option<(usize, usize)> {
        let decode = self.decode.as_ref()?;
        let i = self.args.iter().position(|a| a.name == decode.over)?;
        Some((i, decode.axis))
    }

    /// The checkpoint of `weights = "..."`, resolved against the crate's manifest dir.
    pub fn weights_path(&self) -> Option<std::path::PathBuf> {
        let Params::Weights(path) = &self.params else {
            return None;
        };
        let path = std::path::Path::new(path);
        Some(match self.manifest_dir() {
            Some(dir) if path.is_relative() => std::path::Path::new(dir).join(path),
            _ => path.to_path_buf(),
        })
    }

    /// Run this check in `mode`, whatever `GOLDEN_MODE` says.
    pub fn mode(mut self, mode: crate::describe::env::Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Where the check is declared: `layer.declared_at(golden::declared!())`.
    pub fn declared_at(mut self, declared: Declared) -> Self {
        self.declared = Some(declared);
        self
    }

    /// The crate that declares the check (`unknown` for a layer built without the macro), which
    /// names its folder under `target/golden/<what>/`.
    pub fn crate_name(&self) -> &str {
        self.declared
            .and_then(|d| d.module_path.split("::").next())
            .unwrap_or("unknown")
    }

    /// The folder of this check's crate under `target/golden/<what>/` (results, failures,
    /// traces); `None` when the target directory is unknown.
    pub fn golden_folder(&self, what: &str) -> Option<std::path::PathBuf> {
        Some(
            crate::describe::env::target_dir()?
                .join("golden")
                .join(what)
                .join(crate::describe::file_names::file_name(self.crate_name())),
        )
    }

    /// The command that re-runs a check, with `env` before it (`GOLDEN_MODE=record`, ...). `test` is
    /// the test function the attribute generates for this kind of check (`matches_reference`).
    pub fn rerun_command(&self, test: &str, env: &str) -> String {
        let Some(d) = self.declared else {
            return format!("{env} cargo test");
        };
        let mut path: Vec<&str> = d.module_path.split("::").collect();
        let krate = path.remove(0);
        let target = if path.last() == Some(&self.name.as_str()) {
            // Generated by the attribute: `<module path>::<test>`.
            format!("{}::{test}", path.join("::"))
        } else if krate == d.package.replace('-', "_") {
            "--lib".to_string()
        } else {
            format!("--test {krate}")
        };
        format!("{env} cargo test -p {} {target}", d.package)
            .trim_start()
            .to_string()
    }

    /// The check's name for files: the module path without the crate, `::` as `__`, ending with
    /// the layer's name (`activations::gelu` → `activations__gelu`), as one file name
    /// ([`file_name`](crate::describe::file_names::file_name): a name with `/` or `..` names no
    /// path). The snapshot, the golden store, the results file and the artifacts all use it.
    pub fn check_name(&self) -> String {
        let Some(declared) = &self.declared else {
            return crate::describe::file_names::file_name(&self.name);
        };
        let mut parts: Vec<&str> = declared.module_path.split("::").skip(1).collect();
        if parts.last() != Some(&self.name.as_str()) {
            parts.push(&self.name);
        }
        crate::describe::file_names::file_name(&parts.join("__"))
    }

    /// The crate's manifest dir, if declared.
    pub fn manifest_dir(&self) -> Option<&'static str> {
        self.declared.map(|d| d.manifest_dir)
    }

    /// What the check is about, as the snapshot's header shows it and the golden store records it:
    /// reference, dims, arguments, consts, init, and the cases drawn.
    pub fn description(&self, cases: u32, seed: u64) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(s, "layer: {}", self.name);
        let _ = writeln!(
            s,
            "reference: {} ({} form, {} backend)",
            self.reference,
            self.form.as_str(),
            self.backend.as_str()
        );
        if !self.dims.is_empty() {
            let dims: Vec<String> = self
                .dims
                .iter()
                .map(|d| format!("{} in {}..={}", d.name, d.lo, d.hi))
                .collect();
            let _ = writeln!(s, "dims: {}", dims.join(", "));
        }
        let _ = writeln!(s, "args:");
        for arg in &self.args {
            let _ = writeln!(s, "  {}", Layer::describe_arg(arg));
        }
        for (title, values) in [("consts", &self.consts), ("init", &self.init)] {
            if !values.is_empty() {
                let _ = writeln!(s, "{title}: {}", keywords(values));
            }
        }
        if let Some(config) = &self.config {
            let _ = writeln!(s, "config: {config}");
        }
        if self.form == Form::Module {
            let _ = match &self.params {
                Params::Drawn | Params::DrawnAll => {
                    let which = if self.params == Params::DrawnAll {
                        "every float entry of the state_dict, frozen and computed ones too: \
                         params = drawn_all"
                    } else {
                        "every float entry of the state_dict"
                    };
                    let scale = match self.param_scale {
                        ParamScale::UnitGain => {
                            "at unit gain: every weight's spread at least 1/√fan_in, an \
                             embedding's rows 1"
                        }
                        ParamScale::Init => {
                            "at each entry's own initial scale (params = init_scale)"
                        }
                    };
                    writeln!(
                        s,
                        "params: drawn per case, seeded like the inputs ({which}), {scale}"
                    )
                }
                Params::Init => writeln!(s, "params: the module's own init (params = init)"),
                Params::Weights(path) => writeln!(
                    s,
                    "params: weights from {path} (a whole model: the reference evaluated in \
                     the case dtype, then in float64, then at nudged inputs, each stage only where \
                     the port's comparison needs it)"
                ),
            };
            if !self.rename.is_empty() {
                let r: Vec<String> = self
                    .rename
                    .iter()
                    .map(|(a, b)| format!("{a:?} = {b:?}"))
                    .collect();
                let _ = writeln!(s, "rename: {}", r.join(", "));
            }
        }
        if let Some(decode) = &self.decode {
            let mut d = decode.clone();
            d.window = self.window();
            let _ = writeln!(s, "decode: {d}");
        }
        if let Some(steps) = &self.steps {
            let _ = writeln!(s, "steps: {steps}");
        }

        match self.budget {
            Some(budget) => {
                let _ = writeln!(
                    s,
                    "cases: up to {cases} per dtype, as many as a {} budget holds, seed {seed}",
                    crate::describe::numbers::budget(budget)
                );
            }
            None => {
                let _ = writeln!(s, "cases: {cases} per dtype, seed {seed}");
            }
        }
        if self.trace {
            let _ = writeln!(s, "trace: the port's taps against every submodule's output");
        }
        s
    }

    /// The invariants' line of the forward check's description (`invariants: out = [finite]`);
    /// `None` without invariants (the gradient and training checks do not check them, so their
    /// descriptions do not name them).
    pub fn invariants_line(&self) -> Option<String> {
        if self.invariants.is_empty() {
            return None;
        }
        let list: Vec<String> = self
            .invariants
            .iter()
            .map(|(leaf, i)| crate::describe::invariants::describe(leaf, i))
            .collect();
        Some(format!("invariants: {}\n", list.join(", ")))
    }

    /// The symbolic description of an argument, e.g. `x [b, t, d] ~ normal(0.0, 1.0)`.
    pub(crate) fn describe_arg(arg: &ArgSpec) -> String {
        let shape: Vec<String> = arg.shape.iter().map(ToString::to_string).collect();
        format!("{} [{}] ~ {}", arg.name, shape.join(", "), arg.dist)
    }

    /// Refuse declarations under which no wrong port can fail: inputs that are NaN, constant or
    /// beyond a dtype's range, tolerances that are NaN, infinite or negative (and the same for the
    /// options of `grad(...)` and `overfit(...)`). Each error names the option.
    fn validate_degenerate(&self) -> Result<(), String> {
        let finite_nonnegative = |x: f64| x.is_finite() && x >= 0.0;
        for arg in &self.args {
            let what = format!("argument `{}` ~ {}", arg.name, arg.dist);
            match arg.dist {
                Dist::Normal { mean, std } => {
                    if !(mean.is_finite() && std.is_finite()) {
                        return Err(format!("{what}: its mean and spread must be finite"));
                    }
                    if std < 0.0 {
                        return Err(format!("{what}: a negative spread"));
                    }
                    for &dtype in &self.dtypes {
                        let (_, largest) = float_range(dtype);
                        if mean.abs() + std > largest {
                            return Err(format!(
                                "{what}: beyond {}'s finite range (its largest value is {}): \
                                 its values would be ±inf",
                                dtype_name(dtype),
                                crate::describe::numbers::num(largest)
                            ));
                        }
                    }
                }
                Dist::Uniform { lo, hi } => {
                    if !(lo.is_finite() && hi.is_finite()) {
                        return Err(format!(
                            "{what}: its bounds must be finite (infinite bounds make every value \
                             NaN or ±inf)"
                        ));
                    }
                    if lo >= hi {
                        return Err(format!(
                            "{what}: an empty range (lo must be below hi): every value would be {}",
                            crate::describe::numbers::num(lo)
                        ));
                    }
                    for &dtype in &self.dtypes {
                        let (round, largest) = float_range(dtype);
                        if lo.abs().max(hi.abs()) > largest {
                            return Err(format!(
                                "{what}: beyond {}'s finite range (its largest value is {})",
                                dtype_name(dtype),
                                crate::describe::numbers::num(largest)
                            ));
                        }
                        if round(lo) == round(hi) {
                            return Err(format!(
                                "{what}: every value rounds to one {} ({}): the input is a \
                                 constant; widen the range",
                                dtype_name(dtype),
                                crate::describe::numbers::num(round(lo))
                            ));
                        }
                    }
                }
                Dist::Int { .. } | Dist::Bool | Dist::Positions { .. } => {}
            }
        }
        if let Some(Tol { atol, rtol }) = self.tol {
            if !(finite_nonnegative(atol) && finite_nonnegative(rtol)) {
                return Err(format!(
                    "tol(atol = {}, rtol = {}): a tolerance must be finite and not negative",
                    crate::describe::numbers::num(atol),
                    crate::describe::numbers::num(rtol)
                ));
            }
        }
        if let Some(grad) = &self.grad {
            let ok = grad.eps.is_finite()
                && grad.eps > 0.0
                && finite_nonnegative(grad.atol)
                && finite_nonnegative(grad.rtol);
            if !ok {
                return Err(format!(
                    "grad(eps = {}, atol = {}, rtol = {}): eps must be finite and positive, atol \
                     and rtol finite and not negative",
                    crate::describe::numbers::num(grad.eps),
                    crate::describe::numbers::num(grad.atol),
                    crate::describe::numbers::num(grad.rtol)
                ));
            }
        }
        if let Some(o) = &self.overfit {
            let lr = o.optimizer.lr();
            let ok = lr.is_finite()
                && lr > 0.0
                && finite_nonnegative(o.ratio)
                && finite_nonnegative(o.threshold)
                && o.steps > 0;
            if !ok {
                return Err(format!(
                    "overfit(steps = {}, lr = {}, ratio = {}, threshold = {}): steps must be at \
                     least 1, lr finite and positive, ratio and threshold finite and not negative",
                    o.steps,
                    crate::describe::numbers::num(lr),
                    crate::describe::numbers::num(o.ratio),
                    crate::describe::numbers::num(o.threshold)
                ));
            }
        }
        Ok(())
    }

    /// Swept values: well formed, each keyword swept once and no dim's name, no division by a dim
    /// that can be 0, and enough cases to try every value.
    fn validate_sweeps(&self) -> Result<(), String> {
        fn zero_divisor<'a>(e: &'a DimValue, dims: &[DimSpec]) -> Option<&'a DimValue> {
            match e {
                DimValue::Div(a, b) => {
                    let zero = match &**b {
                        DimValue::Lit(0) => true,
                        DimValue::Dim(d) => dims.iter().any(|s| &s.name == d && s.lo == 0),
                        _ => false,
                    };
                    if zero {
                        Some(b)
                    } else {
                        zero_divisor(a, dims).or_else(|| zero_divisor(b, dims))
                    }
                }
                DimValue::Add(a, b) | DimValue::Sub(a, b) | DimValue::Mul(a, b) => {
                    zero_divisor(a, dims).or_else(|| zero_divisor(b, dims))
                }
                _ => None,
            }
        }
        fn exprs(v: &Value) -> Vec<&DimValue> {
            match v {
                Value::Dims(e) => vec![e],
                Value::List(items) | Value::OneOf(items) => items.iter().flat_map(exprs).collect(),
                Value::Dict(items) => items.iter().flat_map(|(_, v)| exprs(v)).collect(),
                _ => Vec::new(),
            }
        }
        fn nested(v: &Value) -> bool {
            match v {
                Value::OneOf(_) | Value::Range(..) => true,
                Value::List(items) => items.iter().any(nested),
                Value::Dict(items) => items.iter().any(|(_, v)| nested(v)),
                _ => false,
            }
        }
        for (name, value) in self.values() {
            for e in exprs(value) {
                if let Some(d) = zero_divisor(e, &self.dims) {
                    return Err(format!(
                        "`{name} = {value}` divides by `{d}`, which can be 0: start its range at 1"
                    ));
                }
            }
            let inner = match value {
                Value::OneOf(items) => items.iter().any(nested),
                other => nested(other) && !other.is_swept(),
            };
            if inner {
                return Err(format!(
                    "`{name} = {value}`: `one_of(...)` and ranges go at the top of a value, not \
                     inside a list, a dict or another `one_of`"
                ));
            }
            match value {
                Value::OneOf(items) if items.is_empty() => {
                    return Err(format!("`{name} = one_of()` has no values to draw from"))
                }
                Value::Range(lo, hi) if lo > hi => {
                    return Err(format!("`{name} = {lo}..={hi}` is an empty range"))
                }
                _ => {}
            }
        }
        let sweeps = self.sweeps();
        for (i, (name, _)) in sweeps.iter().enumerate() {
            if sweeps[..i].iter().any(|(n, _)| n == name) {
                return Err(format!(
                    "`{name}` is swept twice (in two of consts, init and config): sweep it once"
                ));
            }
            if self.dims.iter().any(|d| d.name == *name) {
                return Err(format!(
                    "`{name}` is both a dim and a swept value: rename one (a case names both)"
                ));
            }
        }
        let needed = self.cases_for_each_value();
        if (self.cases as usize) < needed {
            let (name, value) = sweeps
                .iter()
                .max_by_key(|(_, v)| v.values_to_try())
                .copied()
                .expect("a sweep needs cases");
            return Err(format!(
                "`cases = {}` cannot try each value of `{name} = {value}`: give `cases = {needed}` \
                 or more",
                self.cases
            ));
        }
        Ok(())
    }

    /// Whether an axis's length can be 0 (or less, which counts as 0) over the declared dims: how
    /// it can, for a message (`` `n` can be 0 (`n` is declared 0..=6) ``, `` `n - 2` can be 0 (at
    /// n=2) ``), or `None` when it is at least 1 in every case. An expression is evaluated at every
    /// combination of its dims' values when there are at most 4096, else bounded by interval
    /// arithmetic (which may refuse an expression that never reaches 0, never the reverse).
    fn can_be_empty(&self, axis: &DimExpr) -> Option<String> {
        let range = |d: &str| {
            self.dims
                .iter()
                .find(|s| s.name == d)
                .map_or((0, 0), |s| (s.lo, s.hi))
        };
        let e = match axis {
            DimExpr::Lit(0) => return Some("is 0".into()),
            DimExpr::Lit(_) => return None,
            DimExpr::Sym(d) => {
                let (lo, hi) = range(d);
                return (lo == 0).then(|| format!("`{d}` can be 0 (`{d}` is declared 0..={hi})"));
            }
            DimExpr::Expr(e) => e,
        };
        let mut names: Vec<&str> = e.dims();
        names.sort_unstable();
        names.dedup();
        let combinations = names.iter().try_fold(1usize, |n, d| {
            let (lo, hi) = range(d);
            n.checked_mul(hi - lo + 1).filter(|&n| n <= 4096)
        });
        let Some(combinations) = combinations else {
            let (least, _) = bounds(e, &|d| range(d));
            return (least <= 0).then(|| {
                format!(
                    "`{e}` may be 0 over the declared dims (too many combinations to try each: \
                     bounded below by {least})"
                )
            });
        };
        (0..combinations).find_map(|mut i| {
            let dims: Vec<(String, usize)> = names
                .iter()
                .map(|d| {
                    let (lo, hi) = range(d);
                    let n = hi - lo + 1;
                    let v = lo + i % n;
                    i /= n;
                    (d.to_string(), v)
                })
                .collect();
            (e.eval(&dims) <= 0).then(|| {
                let at: Vec<String> = dims.iter().map(|(d, v)| format!("{d}={v}")).collect();
                format!("`{e}` can be 0 (at {})", at.join(", "))
            })
        })
    }

    /// Check the description for mistakes the macro would have rejected at compile time.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if let Some(max) = self.speed_max {
            if !(max.is_finite() && max > 0.0) {
                return Err(format!(
                    "speed(max = {max}) is not a factor golden can hold the port to: give a \
                     positive number, the most times the reference's time the port may take"
                ));
            }
        }
        let known = |d: &str| self.dims.iter().any(|s| s.name == d);
        for dim in &self.dims {
            if dim.lo > dim.hi {
                return Err(format!(
                    "dim `{}` has an empty range {}..={}",
                    dim.name, dim.lo, dim.hi
                ));
            }
            if dim.hi == 0 {
                return Err(format!(
                    "dim `{}` = 0..=0 is always 0: every tensor with that axis is empty in every \
                     case, so nothing about it can fail; give it a range that reaches 1",
                    dim.name
                ));
            }
        }
        self.validate_degenerate()?;
        for arg in &self.args {
            for axis in &arg.shape {
                for d in axis.dims() {
                    if !known(d) {
                        return Err(format!(
                            "argument `{}` uses the unknown dim `{d}`",
                            arg.name
                        ));
                    }
                }
            }
            if let Dist::Positions { max } = &arg.dist {
                match max {
                    Some(Bound::Dim(d)) if !known(d) => {
                        return Err(format!(
                            "argument `{}` uses the unknown dim `{d}`",
                            arg.name
                        ))
                    }
                    None if self.max_positions().is_none() => {
                        return Err(format!(
                            "argument `{}` ~ positions draws up to the module's \
                             max_position_embeddings, and neither `config` nor `init` gives one: \
                             write `positions(N)`",
                            arg.name
                        ))
                    }
                    _ => {}
                }
            }
            if let Dist::Int { lo, hi } = &arg.dist {
                for bound in [lo, hi] {
                    if let Bound::Dim(d) = bound {
                        if !known(d) {
                            return Err(format!(
                                "argument `{}` uses the unknown dim `{d}`",
                                arg.name
                            ));
                        }
                    }
                }
            }
        }
        let valued = [("consts", &self.consts), ("init", &self.init)]
            .into_iter()
            .chain(self.config.iter().map(|c| ("config", &c.values)));
        for (title, values) in valued {
            for (name, value) in values {
                if let Some(d) = value.dims().into_iter().find(|d| !known(d)) {
                    return Err(format!(
                        "`{title}({name} = {value})` uses the unknown dim `{d}`"
                    ));
                }
            }
        }
        self.validate_sweeps()?;
        for (leaf, list) in &self.invariants {
            for invariant in list {
                use crate::describe::invariants::Invariant;
                match invariant {
                    Invariant::Range { lo, hi } if lo.partial_cmp(hi).is_none_or(|o| o.is_gt()) => {
                        return Err(format!(
                            "`invariants({leaf} = [{invariant}])`: the range is empty"
                        ))
                    }
                    Invariant::SumsToOne { tol: Some(t), .. } if t.is_nan() || *t < 0.0 => {
                        return Err(format!(
                            "`invariants({leaf} = [{invariant}])`: a tolerance must not be negative"
                        ))
                    }
                    _ => {}
                }
            }
        }
        if self.dtypes.is_empty() {
            return Err("no dtype to check".into());
        }
        for dtype in &self.dtypes {
            if !dtype.is_float() {
                return Err(format!("dtype {dtype:?} is not a float dtype"));
            }
        }
        if self.form == Form::Function && !self.init.is_empty() {
            return Err("`init(...)` is for the module form (a port taking a VarBuilder)".into());
        }
        if self.form == Form::Function && self.config.is_some() {
            return Err("`config` is for the module form (a port taking a VarBuilder)".into());
        }
        if let Some(l) = &self.steps {
            if self.decode.is_some() {
                return Err(
                    "`steps` and `decode` both drive the layer through time: give one".into(),
                );
            }
            if !known(&l.over) {
                return Err(format!(
                    "`steps(over = {})` names no dim: the loop has as many steps as a dim of \
                     `dims(...)`",
                    l.over
                ));
            }
            // A case of no steps would compare nothing: refused here, not on the seeds that draw it.
            if let Some(d) = self.dims.iter().find(|d| d.name == l.over && d.lo == 0) {
                return Err(format!(
                    "`steps(over = {o})`: the loop has as many steps as `{o}`, which can be 0 \
                     (`{o}` is declared 0..={hi}): a loop of no steps compares nothing; start `{o}` \
                     at 1",
                    o = d.name,
                    hi = d.hi
                ));
            }
            for (arg, _) in &l.carry {
                match self.args.iter().find(|a| &a.name == arg) {
                    None => {
                        return Err(format!(
                            "`steps(carry({arg} = ..))` names no argument of the check"
                        ))
                    }
                    Some(a) if matches!(a.shape.first(), Some(DimExpr::Sym(d)) if *d == l.over) => {
                        return Err(format!(
                            "`{arg}` is carried from step to step, so it has no axis of steps \
                             (`{}` first): give it the shape one step takes",
                            l.over
                        ))
                    }
                    Some(_) => {}
                }
            }
        }
        if let Some(decode) = &self.decode {
            if self.form == Form::Function {
                return Err(
                    "`decode` drives a module through time: it is for the module form (a port \
                     taking a VarBuilder)"
                        .into(),
                );
            }
            let Some(arg) = self.args.iter().find(|a| a.name == decode.over) else {
                let names: Vec<&str> = self.args.iter().map(|a| a.name.as_str()).collect();
                return Err(format!(
                    "`decode(over = {})` names no argument of the check (its arguments: {})",
                    decode.over,
                    names.join(", ")
                ));
            };
            if arg.shape.len() <= decode.axis {
                return Err(format!(
                    "`decode` splits `{}` along axis {}, and `{}` has only {} axes",
                    decode.over,
                    decode.axis,
                    decode.over,
                    arg.shape.len()
                ));
            }
            if decode.axis == 0 {
                return Err(
                    "`decode(axis = 0)`: axis 0 is the batch; the sequence is another axis".into(),
                );
            }
            // A sequence of no positions has no schedule: refused here, not on the seeds that
            // draw it.
            if let Some(at) = self.can_be_empty(&arg.shape[decode.axis]) {
                return Err(format!(
                    "`decode` splits `{}` along axis {}, whose length {at}: a schedule of no \
                     positions drives nothing; {}",
                    decode.over,
                    decode.axis,
                    match &arg.shape[decode.axis] {
                        DimExpr::Sym(d) => format!("start `{d}` at 1"),
                        DimExpr::Lit(_) => "give the axis a length of at least 1".to_string(),
                        DimExpr::Expr(_) => {
                            "declare the dims so that it is at least 1 in every case".to_string()
                        }
                    }
                ));
            }
            // The longest schedule must fit the module's positions: said before any case runs.
            let limit = self
                .config
                .iter()
                .flat_map(|c| &c.values)
                .chain(&self.init)
                .find(|(k, _)| k == "max_position_embeddings" || k == "n_positions");
            if let (Some((key, Value::Int(limit))), DimExpr::Sym(d)) =
                (limit, &arg.shape[decode.axis])
            {
                let longest = self.dims.iter().find(|s| &s.name == d).map(|s| s.hi);
                if let Some(longest) = longest {
                    let total = (longest + decode.generate) as i64;
                    if total > *limit {
                        return Err(format!(
                            "the longest schedule reaches {total} positions (`{d}` up to {longest}{}), \
                             beyond the module's {key} ({limit}): narrow `{d}` or raise {key}",
                            if decode.generate > 0 {
                                format!(", then {} generated", decode.generate)
                            } else {
                                String::new()
                            }
                        ));
                    }
                }
            }
            if decode.generate > 0 && !matches!(arg.dist, Dist::Int { .. }) {
                return Err(format!(
                    "`decode(generate = ..)` feeds the greedy token back as the next input, so \
                     `{}` must be token ids (`~ int(0..vocab)`)",
                    decode.over
                ));
            }
            if let Some(sampling) = &decode.sample {
                if decode.generate == 0 {
                    return Err("`decode(sample(...))` samples the generated tokens: give \
                                `generate = N` too"
                        .into());
                }
                sampling.validate()?;
            }
            if let Some(beams) = &decode.beams {
                if decode.generate == 0 {
                    return Err("`decode(beams = K)` searches the generated tokens: give \
                                `generate = N` too"
                        .into());
                }
                if decode.sample.is_some() {
                    return Err("`decode(beams = K)` is transformers' beam search without \
                                sampling (`do_sample=False`): give `sample(...)` or `beams`, \
                                not both"
                        .into());
                }
                if decode.padding {
                    return Err("`decode(beams = K)` is checked on unpadded batches: leave \
                                `padding` out"
                        .into());
                }
                beams.validate()?;
            }
        }
        if self.form == Form::Function
            && (self.params != Params::Drawn
                || self.param_scale != ParamScale::UnitGain
                || !self.rename.is_empty())
        {
            return Err(
                "`params`, `weights` and `rename` are for the module form (a port taking a VarBuilder)"
                    .into(),
            );
        }
        Ok(())
    }
}

/// The least and greatest values of `e` when each dim `d` ranges over `range(d)`, by interval
/// arithmetic: sound (the true values lie within), not tight where a dim appears twice.
fn bounds(e: &DimValue, range: &dyn Fn(&str) -> (usize, usize)) -> (i64, i64) {
    let corners = |v: [i64; 4]| {
        (
            v.into_iter().min().unwrap_or(0),
            v.into_iter().max().unwrap_or(0),
        )
    };
    match e {
        DimValue::Dim(d) => {
            let (lo, hi) = range(d);
            (
                i64::try_from(lo).unwrap_or(i64::MAX),
                i64::try_from(hi).unwrap_or(i64::MAX),
            )
        }
        DimValue::Lit(n) => (*n, *n),
        DimValue::Add(a, b) => {
            let ((a0, a1), (b0, b1)) = (bounds(a, range), bounds(b, range));
            (a0.saturating_add(b0), a1.saturating_add(b1))
        }
        DimValue::Sub(a, b) => {
            let ((a0, a1), (b0, b1)) = (bounds(a, range), bounds(b, range));
            (a0.saturating_sub(b1), a1.saturating_sub(b0))
        }
        DimValue::Mul(a, b) => {
            let ((a0, a1), (b0, b1)) = (bounds(a, range), bounds(b, range));
            corners([
                a0.saturating_mul(b0),
                a0.saturating_mul(b1),
                a1.saturating_mul(b0),
                a1.saturating_mul(b1),
            ])
        }
        DimValue::Div(a, b) => {
            let ((a0, a1), (b0, b1)) = (bounds(a, range), bounds(b, range));
            if b0 <= 0 && b1 >= 0 {
                // A divisor that can be 0 (the quotient is 0 there) or change sign: anything.
                return (i64::MIN, i64::MAX);
            }
            let q = |x: i64, y: i64| x.checked_div(y).unwrap_or(0);
            corners([q(a0, b0), q(a0, b1), q(a1, b0), q(a1, b1)])
        }
    }
}

/// The short name of a float dtype on the wire.
pub fn dtype_name(dtype: DType) -> &'static str {
    golden_files::WireDType::from_candle(dtype)
        .map(golden_files::WireDType::name)
        .unwrap_or("?")
}

/// How a value rounds to a float dtype (as f64 again), and the dtype's largest finite value.
fn float_range(dtype: DType) -> (fn(f64) -> f64, f64) {
    match dtype {
        DType::F16 => (|x| half::f16::from_f64(x).to_f64(), half::f16::MAX.to_f64()),
        DType::BF16 => (
            |x| half::bf16::from_f64(x).to_f64(),
            half::bf16::MAX.to_f64(),
        ),
        DType::F64 => (|x| x, f64::MAX),
        _ => (|x| x as f32 as f64, f32::MAX as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequence_axis_that_can_be_empty_is_found_exactly_or_by_its_bounds() {
        let sub = |a: DimValue, b: DimValue| DimExpr::Expr(DimValue::Sub(Box::new(a), Box::new(b)));
        let layer = Layer::module("l", "m.M")
            .dim("a", 1, 100)
            .dim("b", 1, 100)
            .dim("c", 1, 100);
        // Exactly, at every combination of a few dims: a − 1 reaches 0 at a = 1, a + 1 never does.
        let a = || DimValue::dim("a");
        assert_eq!(
            layer.can_be_empty(&sub(a(), DimValue::Lit(1))).as_deref(),
            Some("`a - 1` can be 0 (at a=1)")
        );
        let plus_one = DimExpr::Expr(DimValue::Add(Box::new(a()), Box::new(DimValue::Lit(1))));
        assert_eq!(layer.can_be_empty(&plus_one), None);
        assert_eq!(layer.can_be_empty(&DimExpr::from("a")), None);
        assert_eq!(
            layer.can_be_empty(&DimExpr::Lit(0)).as_deref(),
            Some("is 0")
        );
        // Too many combinations (10^6): bounded, soundly (a·b·c ≥ 1 always).
        let product = DimValue::Mul(
            Box::new(DimValue::Mul(Box::new(a()), Box::new(DimValue::dim("b")))),
            Box::new(DimValue::dim("c")),
        );
        assert_eq!(layer.can_be_empty(&DimExpr::Expr(product.clone())), None);
        let less = sub(product, DimValue::dim("a"));
        assert!(layer
            .can_be_empty(&less)
            .is_some_and(|m| m.contains("may be 0 over the declared dims")));
    }

    #[test]
    fn beam_search_needs_generated_tokens_two_beams_and_no_sampling_or_padding() {
        use crate::describe::beams::Beams;
        use crate::describe::schedule::Decode;
        let with = |decode: Decode| {
            Layer::module("l", "m.M")
                .dim("b", 1, 2)
                .dim("n", 2, 4)
                .arg(
                    "input_ids",
                    [DimExpr::from("b"), DimExpr::from("n")],
                    Dist::int(0, 32),
                )
                .decode(decode)
                .validate()
        };
        let beams = |k| Decode {
            generate: 3,
            beams: Some(Beams::new(k)),
            ..Decode::over("input_ids")
        };
        assert_eq!(with(beams(3)), Ok(()));
        let err = with(Decode {
            generate: 0,
            ..beams(3)
        })
        .unwrap_err();
        assert!(err.contains("give `generate = N` too"), "{err}");
        let err = with(Decode {
            sample: Some(crate::describe::sampling::Sampling::new()),
            ..beams(3)
        })
        .unwrap_err();
        assert!(
            err.contains("give `sample(...)` or `beams`, not both"),
            "{err}"
        );
        let err = with(Decode {
            padding: true,
            ..beams(3)
        })
        .unwrap_err();
        assert!(err.contains("leave `padding` out"), "{err}");
        let err = with(beams(1)).unwrap_err();
        assert!(err.contains("keeps at least 2 beams"), "{err}");
    }

    #[test]
    fn a_declaration_given_again_replaces_the_first_in_place() {
        let layer = Layer::module("l", "torch.nn.Linear")
            .config("transformers.LlamaConfig")
            .config_value("hidden_size", 16usize)
            .config_value("num_attention_heads", 4usize)
            .dim("b", 1, 3)
            .dim("n", 2, 10)
            .arg("x", ["b", "n"], Dist::default())
            .arg("mask", ["b", "n"], Dist::default())
            .dim("n", 8, 8)
            .arg("x", ["n"], Dist::int(0, "n"))
            .config_value("hidden_size", 32usize)
            .named("m")
            .against("torch.nn.Identity");
        assert_eq!(
            (layer.name(), layer.reference()),
            ("m", "torch.nn.Identity")
        );
        let dims: Vec<_> = layer
            .dims()
            .iter()
            .map(|d| (d.name.as_str(), d.lo, d.hi))
            .collect();
        assert_eq!(dims, [("b", 1, 3), ("n", 8, 8)]);
        let args: Vec<_> = layer.args().iter().map(|a| a.name.as_str()).collect();
        assert_eq!(args, ["x", "mask"]);
        assert_eq!(layer.args()[0].shape, [DimExpr::from("n")]);
        assert_eq!(layer.args()[0].dist, Dist::int(0, "n"));
        let values = &layer.configuration().unwrap().values;
        assert_eq!(values.len(), 2);
        assert_eq!(values[0], ("hidden_size".to_string(), Value::Int(32)));
    }
}
