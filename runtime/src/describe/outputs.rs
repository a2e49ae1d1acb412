//! The port's side of a case: the inputs it gets and its outputs, named leaf by leaf.
//!
//! Leaves are named like the reference's: a single tensor is `out`, a tuple or `Vec` gives `out.0`,
//! `out.1`, …, a map gives `out.<key>`.

use candle_core::Tensor;
use candle_nn::VarBuilder;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Display;

/// What the port gets in one case.
pub struct PortInputs {
    pub(crate) tensors: Vec<Tensor>,
    pub(crate) var_builder: Option<VarBuilder<'static>>,
    /// The case's dims and configuration, for parameters whose values depend on them.
    pub(crate) case: CaseValues,
    /// The tensor arguments' names, in order.
    pub(crate) names: Vec<String>,
    /// A check with `decode(...)`: the schedule the port is driven through (`run/steps.rs`);
    /// `None` runs one step over the whole input.
    pub(crate) schedule: Option<crate::describe::schedule::PortSchedule>,
}

impl PortInputs {
    /// The i-th tensor parameter (in the Rust signature's order).
    pub fn tensor(&self, i: usize) -> &Tensor {
        &self.tensors[i]
    }

    /// The value of a dim in this case (0 for a dim the check does not declare: the attribute
    /// rejects those at compile time).
    pub fn dim(&self, name: &str) -> usize {
        self.case.dim(name)
    }

    /// The value of a const, init or config keyword in this case: a swept value's drawn
    /// alternative, dims resolved (`i.value("softcap")` is `Value::None` or `Value::Float(30.0)`
    /// for `consts(softcap = one_of(None, 30.0))`). `None` for a keyword the check does not give.
    pub fn value(&self, name: &str) -> Option<&crate::describe::layer::Value> {
        self.case
            .values
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    /// Which alternative of the swept value `name` this case drew (0 for the first, and for a
    /// keyword that is not swept): what the attribute's generated call matches on.
    #[doc(hidden)]
    pub fn pick(&self, name: &str) -> usize {
        self.case
            .picks
            .iter()
            .find(|p| p.field == name)
            .map_or(0, |p| p.index)
    }

    /// The `VarBuilder` serving the reference module's `state_dict()` (module form).
    pub fn var_builder(&self) -> VarBuilder<'static> {
        self.var_builder
            .clone()
            .expect("var_builder() is only available in module form")
    }
}

/// What a port's parameters see of a case besides its tensors: its dims, and the configuration it
/// drew with every const, init and config value resolved.
#[derive(Clone, Debug, Default)]
pub(crate) struct CaseValues {
    /// The case's dims (a step loop adds `step`).
    pub(crate) dims: Vec<(String, usize)>,
    /// The swept values' picks.
    pub(crate) picks: Vec<crate::describe::layer::Pick>,
    /// Every const, init and config value, resolved for the case.
    pub(crate) values: Vec<(String, crate::describe::layer::Value)>,
}

impl CaseValues {
    /// A dim's value (0 when the case has no such dim).
    pub(crate) fn dim(&self, name: &str) -> usize {
        self.dims
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |&(_, v)| v)
    }
}

/// The port's outputs, named leaf by leaf.
#[derive(Clone, Debug)]
pub struct Outputs(pub Vec<(String, Tensor)>);

impl Outputs {
    /// The leaf named `name`.
    pub(crate) fn leaf(&self, name: &str) -> Result<&Tensor, String> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| format!("the port returns no `{name}`"))
    }
}

/// Anything a port may return: a tensor, a tuple of tensors, a `Vec` of tensors, a map from names to
/// tensors, or a `Result` of one of those.
pub trait IntoOutputs {
    /// Name the leaves; `Err` carries the port's own error message.
    fn into_outputs(self) -> Result<Outputs, String>;
}

impl IntoOutputs for Tensor {
    fn into_outputs(self) -> Result<Outputs, String> {
        Ok(Outputs(vec![("out".into(), self)]))
    }
}

impl IntoOutputs for Vec<Tensor> {
    fn into_outputs(self) -> Result<Outputs, String> {
        Ok(Outputs(
            self.into_iter()
                .enumerate()
                .map(|(i, t)| (format!("out.{i}"), t))
                .collect(),
        ))
    }
}

impl<K: Display + Ord> IntoOutputs for BTreeMap<K, Tensor> {
    fn into_outputs(self) -> Result<Outputs, String> {
        Ok(Outputs(
            self.into_iter()
                .map(|(k, t)| (format!("out.{k}"), t))
                .collect(),
        ))
    }
}

impl<K: Display + Ord> IntoOutputs for HashMap<K, Tensor> {
    fn into_outputs(self) -> Result<Outputs, String> {
        // Sorted, so the order (and hence every report) does not depend on hashing.
        self.into_iter()
            .collect::<BTreeMap<K, Tensor>>()
            .into_outputs()
    }
}

impl<T: IntoOutputs, E: Display> IntoOutputs for Result<T, E> {
    fn into_outputs(self) -> Result<Outputs, String> {
        match self {
            Ok(v) => v.into_outputs(),
            Err(e) => Err(without_backtrace(&e.to_string())),
        }
    }
}

/// An error's message without the backtrace candle appends when `RUST_BACKTRACE` is set.
pub(crate) fn without_backtrace(message: &str) -> String {
    let frame = |l: &str| {
        let l = l.trim_start();
        let digits = l.chars().take_while(char::is_ascii_digit).count();
        digits > 0 && l[digits..].starts_with(": ")
    };
    let lines: Vec<&str> = message.lines().take_while(|l| !frame(l)).collect();
    lines.join("\n").trim_end().to_string()
}

macro_rules! tuple_outputs {
    ($($t:ident $i:tt),+) => {
        impl IntoOutputs for ($($t,)+) {
            fn into_outputs(self) -> Result<Outputs, String> {
                Ok(Outputs(vec![$((format!("out.{}", $i), self.$i)),+]))
            }
        }
    };
}

// A tuple's elements are all tensors: `(Tensor, Tensor)` and so on.
type T = Tensor;
tuple_outputs!(T 0);
tuple_outputs!(T 0, T 1);
tuple_outputs!(T 0, T 1, T 2);
tuple_outputs!(T 0, T 1, T 2, T 3);
tuple_outputs!(T 0, T 1, T 2, T 3, T 4);
tuple_outputs!(T 0, T 1, T 2, T 3, T 4, T 5);
