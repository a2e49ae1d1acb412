//! Declared invariants of a port's outputs: properties the port must have on every case whatever
//! the reference says (`invariants(out = [finite, sums_to_one(dim = -1), non_negative,
//! range(-10.0, 10.0)])`). A reference shows what the right numbers are; it does not say that
//! probabilities are positive and sum to one, that logits are finite or stay in range: a porter
//! knows, and declares it. `judge/invariants.rs` checks them.

use std::fmt;

/// One property of an output leaf.
#[derive(Clone, Debug, PartialEq)]
pub enum Invariant {
    /// No NaN, no ±Inf.
    Finite,
    /// Every element `≥ 0` (NaN breaks it).
    NonNegative,
    /// Every slice along `dim` sums to 1, within `tol` (default: the slice's length times the
    /// unit roundoff of the leaf's dtype, what rounding a sum of that many positive terms can
    /// make).
    SumsToOne {
        /// The axis (negative from the end, as in PyTorch).
        dim: i64,
        /// The allowed `|sum − 1|`; `None`: the default.
        tol: Option<f64>,
    },
    /// Every element in `[lo, hi]` (NaN breaks it).
    Range {
        /// Lowest allowed value.
        lo: f64,
        /// Highest allowed value.
        hi: f64,
    },
}

impl Invariant {
    /// `sums_to_one(dim = dim)` with its default tolerance.
    pub fn sums_to_one(dim: i64) -> Self {
        Invariant::SumsToOne { dim, tol: None }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invariant::Finite => f.write_str("finite"),
            Invariant::NonNegative => f.write_str("non_negative"),
            Invariant::SumsToOne { dim, tol: None } => write!(f, "sums_to_one(dim = {dim})"),
            Invariant::SumsToOne {
                dim,
                tol: Some(tol),
            } => write!(f, "sums_to_one(dim = {dim}, tol = {tol:?})"),
            Invariant::Range { lo, hi } => write!(f, "range({lo:?}, {hi:?})"),
        }
    }
}

/// The invariants of one leaf (`out`, `out.0`, `out.logits`), as the description shows them:
/// `out = [finite, sums_to_one(dim = -1)]`.
pub fn describe(leaf: &str, invariants: &[Invariant]) -> String {
    let list: Vec<String> = invariants.iter().map(ToString::to_string).collect();
    format!("{leaf} = [{}]", list.join(", "))
}
