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
    /// What the case showed that does not fail the check.
    pub notes: Vec<Note>,
    /// A whole model's reference evaluated in stages (a checkpoint's case): the stage the case
    /// was judged at (`answers/live.rs`' `Stage`: the case dtype alone, with float64, nudged).
    pub evaluations: Option<crate::answers::live::Stage>,
}

/// Something a check noticed that does not fail it: the snapshot records its summary (stable from
/// run to run), messages and stderr its detail (with the case's numbers).
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    /// One stable line.
    pub summary: String,
    /// The same with the case's numbers.
    pub detail: String,
}

/// What a reference's answer says about the reference itself: inputs or parameters it modifies in
/// place, and elements where its float64 run is not the same computation. `inputs` names the
/// inputs by position.
pub fn reference_notes(
    reference: &crate::answers::live::ReferenceOutputs,
    inputs: &[String],
) -> Vec<Note> {
    let mut notes = Vec::new();
    for m in &reference.mutated {
        let what = match m.strip_prefix("input ") {
            Some(i) => match i.parse::<usize>().ok().and_then(|i| inputs.get(i)) {
                Some(name) => format!("its input `{name}`"),
                None => format!("its {m}"),
            },
            None => format!("its {m}"),
        };
        let summary = format!("the reference modifies {what} in place");
        notes.push(Note {
            detail: format!(
                "{summary}: golden gives every evaluation (case dtype, float64, nudged) its own \
                 copy, so the verdict is not affected; a port need not do the same"
            ),
            summary,
        });
    }
    use crate::answers::live::UnexplainedKind as Kind;
    for u in reference
        .unexplained
        .iter()
        .filter(|u| u.kind == Kind::Unreliable)
    {
        let summary = format!(
            "at some elements of `{}` the reference's own result is unreliable in the case dtype \
             (its error at inputs one ulp away is chaotic and thousands of times what the float64 \
             run explains): golden cannot judge the port there and leaves them out",
            u.leaf
        );
        notes.push(Note {
            detail: format!(
                "at {} element{} of `{}` the reference's own result is unreliable in the case \
                 dtype: at inputs one ulp away its error reaches {} (first at {:?}: {} in the \
                 case dtype, {} in float64), chaotic from nudge to nudge — a saturated softmax, \
                 ties that rounding decides. golden cannot judge the port there and leaves those \
                 elements out",
                u.count,
                if u.count == 1 { "" } else { "s" },
                u.leaf,
                crate::describe::numbers::num(u.error),
                u.index,
                crate::describe::numbers::num(u.case_value),
                crate::describe::numbers::num(u.float64_value)
            ),
            summary,
        });
    }
    for u in reference
        .unexplained
        .iter()
        .filter(|u| u.kind == Kind::NonFinite)
    {
        let summary = format!(
            "at some elements of `{}` the reference is NaN or ±Inf where its float64 run is not: \
             golden cannot judge the port there",
            u.leaf
        );
        notes.push(Note {
            detail: format!(
                "at {} element{} of `{}` the reference is NaN or ±Inf where its float64 run is not \
                 (first at {:?}: {} in the case dtype, {} in float64): an overflow or a division \
                 by zero in the case dtype's computation on these inputs. golden cannot judge the \
                 port there and counts those elements as differing; if the reference is right to \
                 give NaN there, draw inputs where it is not (narrow `args(...)`, e.g. `~ \
                 uniform(lo, hi)`)",
                u.count,
                if u.count == 1 { "" } else { "s" },
                u.leaf,
                u.index,
                crate::describe::numbers::num(u.case_value),
                crate::describe::numbers::num(u.float64_value)
            ),
            summary,
        });
    }
    for u in reference
        .unexplained
        .iter()
        .filter(|u| u.kind == Kind::NotSameComputation)
    {
        let summary = format!(
            "at some elements of `{}` the reference in float64 is not the same computation as in \
             the case dtype: there golden applies assert_close's bound without a rounding term",
            u.leaf
        );
        notes.push(Note {
            detail: format!(
                "at {} element{} of `{}` the reference in float64 is not the same computation (first \
                 at {:?}: {} in the case dtype, {} in float64 — a dtype-dependent constant such as \
                 torch.finfo(x.dtype).min?): there golden applies assert_close's bound without a \
                 rounding term",
                u.count,
                if u.count == 1 { "" } else { "s" },
                u.leaf,
                u.index,
                crate::describe::numbers::num(u.case_value),
                crate::describe::numbers::num(u.float64_value)
            ),
            summary,
        });
    }
    notes
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
    /// A budgeted check (`budget = "60s"`): how many cases its budget held, of at most how many,
    /// and the budget.
    pub budgeted: Option<(usize, u32, std::time::Duration)>,
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
    /// The check's golden store file, when there is one: the snapshot records its SHA-256 and what
    /// it was recorded with, so a store that changes without its snapshot shows in review and
    /// fails, and one re-recorded under other versions says so in the diff.
    pub store: Option<crate::answers::store::Stamp>,
    /// Whether this run recorded the store (`GOLDEN_MODE=record`): the snapshot's store lines are
    /// then brought up to date with it ([`Report::sync_recorded_snapshot`]).
    pub recorded: bool,
    /// Module form: what the snapshot says about parameters that are not drawn from their own
    /// statistics (kept as the module has them, drawn fresh because uninitialised).
    pub params: Vec<String>,
    /// The forward check: per dtype, how fast and how big the port is beside the reference on one
    /// of its cases (`run/speed.rs`). Not in the snapshot (timings vary from run to run): in the
    /// results file.
    pub speed: Vec<crate::judge::speed::Speed>,
}
