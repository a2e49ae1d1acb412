//! A passing check: every case it ran, per dtype, as the snapshot and the results file see them.

use crate::describe::checks::Kind;
use crate::describe::inputs::CaseParams;
use crate::describe::layer::Layer;
use crate::judge::compare::Leaf;
use candle_core::DType;

/// One passing case, as the snapshot and the results file see it.
#[derive(Clone, Debug)]
pub struct CaseRecord {
    /// The case.
    pub params: CaseParams,
    /// Every leaf's comparison.
    pub leaves: Vec<Leaf>,
    /// Further figures of this kind of check, by name (the gradient check's finite-difference
    /// errors relative to their tolerance).
    pub figures: Vec<(String, f64)>,
}

/// All cases of one dtype.
#[derive(Clone, Debug)]
pub struct DTypeRun {
    /// The dtype.
    pub dtype: DType,
    /// The generated cases, in the order they ran.
    pub cases: Vec<CaseRecord>,
    /// Cases replayed first from proptest's regression file (they passed too). Kept apart so that
    /// the snapshot describes the declared cases whatever the regression file holds.
    pub replayed: Vec<CaseRecord>,
    /// Replay of a partial store: generated cases it has no outputs for (not run).
    pub skipped: usize,
}

/// A passing check.
#[derive(Clone, Debug)]
pub struct Report {
    /// The layer that was checked.
    pub layer: Layer,
    /// What was checked.
    pub kind: Kind,
    /// What the check is about ([`Layer::description`] and what the kind adds).
    pub description: String,
    /// Seed the cases were generated from.
    pub seed: u64,
    /// Cases per dtype.
    pub cases: u32,
    /// Whether `GOLDEN_SEED`/`GOLDEN_CASES` changed the declared cases (the snapshot, which describes
    /// the declared ones, is then not asserted).
    pub overridden: bool,
    /// How the reference was reached (`live (python 3.11.7, ...)`, `replay (<store>)`).
    pub source: String,
    /// Per dtype, every case.
    pub runs: Vec<DTypeRun>,
    /// The overfit check's gradient-health flags (vanishing, exploding, dead units): reported and
    /// snapshotted, not failing on their own.
    pub health: Vec<String>,
}
