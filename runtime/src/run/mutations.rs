//! The mutation diagnosis of a failed forward check: on the smallest and on the first failing case,
//! the worker re-runs the reference with one of its own torch calls mutated into a common porting
//! mistake (`answers::mutations`), and the mutants the port matches on both, under the check's own
//! tolerance (`judge::mutations`), are reported with where that call is and the fix. Runs only on a
//! failure, after shrinking.
//!
//! Also here: a failure that shows only on the `tiny` value style (the same case with declared
//! values passes) is named as eps-like.

use crate::answers::live::ReferenceOutputs;
use crate::answers::mutations::{self, Search};
use crate::answers::source::Source;
use crate::describe::inputs::{CaseParams, Style};
use crate::describe::layer::Layer;
use crate::judge::compare::{self, Expected, Leaf};
use crate::judge::diagnose::Diagnosis;
use crate::judge::mutations::{both, fit, MutationMatch};
use crate::judge::trace;
use crate::report::failure::{CaseFailure, Failure, FailureKind, LeafDiagnosis};
use candle_core::DType;

/// Matches shown at most.
const SHOWN: usize = 3;

/// Add the mutation diagnosis (and the tiny-values note) to a failed forward check. `passes` runs
/// the port on another case and says whether it passed.
pub(crate) fn explain(
    layer: &Layer,
    dtype: DType,
    source: &Source,
    passes: &dyn Fn(&CaseParams) -> bool,
    failure: &mut Failure,
    first: Option<&(CaseParams, Box<CaseFailure>)>,
) {
    let (FailureKind::Case(c), Some(case)) = (&mut failure.kind, &failure.case) else {
        return;
    };
    if !differs_in_values(c) {
        return;
    }
    if case.style == Style::Tiny {
        if let Some(d) = only_on_tiny_values(passes, case, c) {
            c.diagnoses.push(d);
        }
    }
    let on_smallest = match matches_on(layer, dtype, source, case, c, None) {
        Ok(found) => found,
        Err(why) => {
            failure
                .notes
                .push(format!("note: the mutation diagnosis was skipped: {why}"));
            return;
        }
    };
    let (mut matches, search) = on_smallest;
    let mut searched = vec![search];
    let first = first.filter(|(params, f)| params != case && differs_in_values(f));
    let on_first = match first {
        Some((params, f)) if !matches.is_empty() => {
            // Only the smallest case's matches can match on both: just those are evaluated.
            let keys: Vec<String> = matches.iter().map(|m| m.key.clone()).collect();
            match matches_on(layer, dtype, source, params, f, Some(&keys)) {
                Ok((found, search)) => {
                    searched.push(search);
                    Some(found)
                }
                // The smallest case's matches stand alone, and say so ("on the failing case").
                Err(_) => None,
            }
        }
        _ => None,
    };
    matches = both(matches, on_first.as_deref(), SHOWN);
    if matches.is_empty() {
        failure.notes.push(none_matched(&searched));
    } else if searched.iter().any(|s| s.truncated) {
        failure.notes.push(
            "note: the mutation search ran out of time before trying every mutation (a third of \
             the reference's timeout)"
                .into(),
        );
    }
    if let FailureKind::Case(c) = &mut failure.kind {
        c.mutations = matches;
    }
}

/// Whether the case failed on values (the port ran; a state_dict entry it never reads is named
/// on its own, and may be the whole story).
fn differs_in_values(c: &CaseFailure) -> bool {
    c.reference.is_some()
        && c.port_error.is_none()
        && c.leaves
            .iter()
            .any(|l| !l.passes() && !trace::is_trace(&l.name))
}

fn none_matched(searched: &[Search]) -> String {
    let s = &searched[0];
    let cases = if searched.len() > 1 {
        "on both failing cases"
    } else {
        "on the smallest failing case"
    };
    let mut note = format!(
        "note: no single mutation of the reference matches the port {cases} (golden tried {} \
         mutations of its {} torch calls at {} sites, golden_ref/catalogue.py)",
        s.tried, s.calls, s.sites
    );
    if searched.iter().any(|s| s.truncated) {
        note.push_str("; the search ran out of time before trying them all");
    }
    note
}

/// The mutants the port matches on one failing case, and what the search did.
fn matches_on(
    layer: &Layer,
    dtype: DType,
    source: &Source,
    params: &CaseParams,
    c: &CaseFailure,
    only: Option<&[String]>,
) -> Result<(Vec<MutationMatch>, Search), String> {
    let Some(reference) = &c.reference else {
        return Err("the reference has no outputs for this case".into());
    };
    let args: Vec<_> = c.inputs.iter().map(|(_, t)| t.clone()).collect();
    let port: Vec<_> = c
        .port_outputs
        .iter()
        .filter(|(n, _)| !trace::is_trace(n))
        .cloned()
        .collect();
    let search = mutations::search(source, layer, dtype, params, &args, &port, only)?;
    let reference = expected(reference);
    let found = search
        .mutants
        .iter()
        .filter_map(|m| {
            let mutant = expected(&m.outputs);
            let fit = fit(
                &port,
                &mutant,
                &reference,
                layer.tol,
                compare::ROUNDING_FACTOR,
            )?;
            Some(MutationMatch {
                key: m.key.clone(),
                what: m.what.clone(),
                instead: m.instead.clone(),
                site: m.site.clone(),
                fix: m.fix.clone(),
                fit,
                both_cases: false,
            })
        })
        .collect();
    Ok((found, search))
}

/// The non-trace leaves of a reference's (or mutant's) answer as the comparison takes them.
fn expected(outputs: &ReferenceOutputs) -> Vec<(String, Expected<'_>)> {
    outputs
        .expected
        .iter()
        .filter(|(n, _)| !trace::is_trace(n))
        .map(|(name, value)| {
            (
                name.clone(),
                Expected {
                    value,
                    rounding: outputs.rounding_of(name),
                    precise: None,
                },
            )
        })
        .collect()
}

/// A failure on the `tiny` style whose case passes with declared values: an eps-like constant.
fn only_on_tiny_values(
    passes: &dyn Fn(&CaseParams) -> bool,
    case: &CaseParams,
    c: &CaseFailure,
) -> Option<LeafDiagnosis> {
    let declared = CaseParams {
        style: Style::Declared,
        ..case.clone()
    };
    if !passes(&declared) {
        return None;
    }
    let leaf = c.leaves.iter().find(|l| !Leaf::passes(l))?;
    Some(LeafDiagnosis {
        leaf: leaf.name.clone(),
        diagnosis: Diagnosis {
            evidence: format!(
                "the port fails only on tiny inputs (×1e-3): the same case with declared values \
                 ({declared}) passes"
            ),
            cause:
                "an eps-like constant differs: a norm's eps of another size or added in another \
                    place (inside or outside the square root), a clamp's minimum, an epsilon in a \
                    division"
                    .into(),
        },
        on_first_case: None,
    })
}
