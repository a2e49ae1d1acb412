//! The mutation diagnosis of a failed forward check: on the smallest failing case and on another
//! one, the worker re-runs the reference with one of its own torch calls (or submodule calls)
//! mutated into a porting mistake (`answers::mutations`), and the mutants the port matches on
//! both, under the check's own tolerance (`judge::mutations`), are reported with where that call
//! is, its source line and the fix. A mutant matched on one failing case alone is evidence, said as
//! such; a mutant that matches on two wins over the numbers' hypotheses (`judge::diagnose`), which
//! are then not told. Runs only on a failure, after shrinking, within a budget of a third of the
//! reference's timeout for everything it does; when the budget runs out, or nothing matches, the
//! message says what was tried.
//!
//! Also here: a failure that shows only on the `tiny` value style (the same case with declared
//! values passes) is named as eps-like.

use crate::answers::live::ReferenceOutputs;
use crate::answers::mutations::{self, Ask, Search, Skipped};
use crate::answers::source::Source;
use crate::describe::inputs::{CaseParams, Style};
use crate::describe::layer::Layer;
use crate::describe::numbers::num;
use crate::describe::schedule;
use crate::judge::compare::{self, Expected, Leaf};
use crate::judge::diagnose::{Diagnosis, Kind};
use crate::judge::mutations::{both, fit, MutationMatch};
use crate::judge::trace;
use crate::report::failure::{CaseFailure, Failure, FailureKind, LeafDiagnosis};
use candle_core::DType;
use std::time::Instant;

/// Matches shown at most.
const SHOWN: usize = 3;

/// The seconds the diagnosis of a failure on a checkpoint (`weights = "..."`) may take at most.
const BUDGET_ON_A_CHECKPOINT: f64 = 15.0;

/// Add the mutation diagnosis (and the tiny-values note) to a failed forward check. `passes` runs
/// the port on another case and says whether it passed; `others` are other failing cases.
pub(crate) fn explain(
    layer: &Layer,
    dtype: DType,
    source: &Source,
    passes: &dyn Fn(&CaseParams) -> bool,
    failure: &mut Failure,
    others: &[(CaseParams, Box<CaseFailure>)],
) {
    let started = Instant::now();
    // On a checkpoint every mutant is a whole model's evaluation: the search gets a fixed share
    // (the trace, when there is one, already names where the port leaves the reference).
    let budget = match layer.weights_path() {
        Some(_) => mutations::budget(layer).min(BUDGET_ON_A_CHECKPOINT),
        None => mutations::budget(layer),
    };
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
    let focus = trace::first_divergence(&c.leaves)
        .map(|(_, l)| l.name.trim_start_matches(trace::PREFIX).to_string());
    let others: Vec<&(CaseParams, Box<CaseFailure>)> = others
        .iter()
        .filter(|(params, f)| params != case && differs_in_values(f))
        .collect();
    // The smallest case's search gets most of the budget; the other cases only evaluate the
    // smallest case's matches.
    let left = |share: f64| (budget * share - started.elapsed().as_secs_f64()).max(0.0);
    let ask = Ask {
        focus: focus.as_deref(),
        budget: left(if others.is_empty() { 1.0 } else { 0.75 }),
        only: None,
        base: None,
        mistake: None,
    };
    let (matches, search) = match matches_on(layer, dtype, source, case, c, ask) {
        Ok(found) => found,
        Err(Skipped::OutOfTime(_)) => {
            failure.notes.push(format!(
                "note: the mutation diagnosis ran out of its budget ({} s, a third of the \
                 reference's timeout, at most {} s on a checkpoint; the reference itself answered \
                 in time) before it could try a mutant: recording the reference's calls took \
                 longer than that; a longer `timeout = ` gives it more",
                num(budget),
                num(BUDGET_ON_A_CHECKPOINT)
            ));
            return;
        }
        Err(why) => {
            failure
                .notes
                .push(format!("note: the mutation diagnosis was skipped: {why}"));
            return;
        }
    };
    let mut searched = vec![search];
    // Only the smallest case's matches can be causes: just those are evaluated on the others, and
    // a cause must hold on every other case that was evaluated (a mistake that the smallest case
    // cannot tell from another — no mask and a diagonal one further, on two positions — is told
    // apart by a longer case).
    let keys: Vec<String> = matches.iter().map(|m| m.key.clone()).collect();
    let mut confirmed: Option<Vec<MutationMatch>> = None;
    let mut second_out_of_time = false;
    // The other case on which no match of the smallest case held any more: where a port with two
    // mistakes shows the second (a window on every layer that is not applied to the cache either
    // shows only the first on a prefill).
    let mut refuted = None;
    for other in others.iter().filter(|_| !matches.is_empty()) {
        let (params, f) = *other;
        let ask = Ask {
            focus: focus.as_deref(),
            budget: left(1.0),
            only: Some(&keys),
            base: None,
            mistake: None,
        };
        if ask.budget <= 0.0 {
            second_out_of_time = confirmed.is_none();
            break;
        }
        match matches_on(layer, dtype, source, params, f, ask) {
            Ok((found, search)) => {
                second_out_of_time |= search.truncated && confirmed.is_none();
                searched.push(search);
                let now = match confirmed {
                    None => found,
                    Some(before) => common(before, &found),
                };
                let none_left = now.is_empty();
                confirmed = Some(now);
                if none_left {
                    refuted = Some(*other);
                    break;
                }
            }
            Err(Skipped::OutOfTime(_)) => {
                second_out_of_time |= confirmed.is_none();
                break;
            }
            // The smallest case's matches stand alone, and say so ("on one failing case").
            Err(Skipped::Not(_)) => {}
        }
    }
    let other: Option<&(CaseParams, Box<CaseFailure>)> = refuted.or(others.first().copied());
    let unconfirmed = refuted.is_some();
    let mut matches = both(matches, confirmed.as_deref(), SHOWN);
    if let (true, Some((params, f))) = (unconfirmed, refuted) {
        let on = Refuted {
            layer,
            dtype,
            source,
            focus: focus.as_deref(),
            smallest: (case, &**c),
            refuting: (params, f),
        };
        if let Some(found) = on.explain(&matches, &left, &mut searched) {
            matches = found;
        }
    }
    let FailureKind::Case(c) = &mut failure.kind else {
        return;
    };
    if matches.iter().any(|m| m.both_cases) {
        // A mutant that holds on two cases says more than any transform of the numbers.
        c.diagnoses.retain(|d| !d.diagnosis.is_hypothesis());
    }
    if matches.is_empty() {
        failure.notes.push(none_matched(
            &searched,
            other.is_some(),
            layer.trace,
            focus.as_deref(),
        ));
    } else if !matches[0].both_cases {
        failure.notes.push(match other {
            None => "note: golden found no second failing case to try the mutation on, so it is \
                     evidence from one case, not a cause"
                .into(),
            Some(_) if second_out_of_time => format!(
                "note: the mutation diagnosis ran out of its budget ({} s, a third of the \
                 reference's timeout) before trying it on a second failing case, so it is evidence \
                 from one case, not a cause",
                num(budget)
            ),
            Some((params, _)) => format!(
                "note: the mutation does not hold on another failing case ({params}), so it is \
                 evidence from one case, not a cause"
            ),
        });
    }
    if let Some(s) = searched.iter().find(|s| s.truncated) {
        failure.notes.push(out_of_time(s, budget));
    }
    if let FailureKind::Case(c) = &mut failure.kind {
        c.mutations = matches;
    }
}

/// The smallest case's matches, refuted by another failing case: what that case says instead.
struct Refuted<'a> {
    layer: &'a Layer,
    dtype: DType,
    source: &'a Source,
    focus: Option<&'a str>,
    smallest: (&'a CaseParams, &'a CaseFailure),
    refuting: (&'a CaseParams, &'a CaseFailure),
}

impl Refuted<'_> {
    /// In order: the refuting case's own matches that hold on the smallest case too (the smallest
    /// case could not tell them from what it matched: a window one key wider and no window at
    /// all, on four positions); else the smallest case's first match together with a second
    /// mistake, of driving or of the reference's calls (a port with two mistakes shows both on a
    /// larger case). `None` when neither is found.
    fn explain(
        &self,
        matches: &[MutationMatch],
        left: &dyn Fn(f64) -> f64,
        searched: &mut Vec<Search>,
    ) -> Option<Vec<MutationMatch>> {
        let (params, f) = self.refuting;
        let (case, c) = self.smallest;
        fn ask<'a>(
            focus: Option<&'a str>,
            budget: f64,
            only: Option<&'a [String]>,
            base: Option<&'a str>,
        ) -> Ask<'a> {
            Ask {
                focus,
                budget,
                only,
                base,
                mistake: None,
            }
        }
        // Half of what is left for the refuting case's own search.
        if let Ok((found, search)) = matches_on(
            self.layer,
            self.dtype,
            self.source,
            params,
            f,
            ask(self.focus, left(1.0) / 2.0, None, None),
        ) {
            searched.push(search);
            let keys: Vec<String> = found.iter().map(|m| m.key.clone()).collect();
            if !keys.is_empty() && left(1.0) > 0.0 {
                if let Ok((back, _)) = matches_on(
                    self.layer,
                    self.dtype,
                    self.source,
                    case,
                    c,
                    ask(self.focus, left(1.0), Some(&keys), None),
                ) {
                    let held: Vec<MutationMatch> = common(found, &back)
                        .into_iter()
                        .map(|m| MutationMatch {
                            both_cases: true,
                            ..m
                        })
                        .collect();
                    if !held.is_empty() {
                        return Some(held);
                    }
                }
            }
        }
        let first = matches.first()?;
        let key = first.key.clone();
        let paired = |second: MutationMatch| {
            let mut first = first.clone();
            first.both_cases = true;
            first.fit.worst_ratio = first.fit.worst_ratio.max(second.fit.worst_ratio);
            first.fit.max_diff = first.fit.max_diff.max(second.fit.max_diff);
            let second = MutationMatch {
                second: Some(first.claim()),
                ..second
            };
            vec![first, second]
        };
        // A mistake of driving together with it first (a window on every layer, not applied to
        // the cache either: candle's Gemma 2), each as cheap as one evaluation; then a mistake of
        // the reference's own calls or configuration.
        if let Some(second) =
            driving_together(self.layer, self.dtype, self.source, params, f, &key, left)
        {
            return Some(paired(second));
        }
        let budget = left(1.0);
        if budget <= 0.0 {
            return None;
        }
        let (found, search) = matches_on(
            self.layer,
            self.dtype,
            self.source,
            params,
            f,
            ask(self.focus, budget, None, Some(&key)),
        )
        .ok()?;
        searched.push(search);
        found.into_iter().next().map(paired)
    }
}

/// A mistake of driving (`describe/schedule.rs`) that, made together with the mutation `key`,
/// makes the reference the port on this case, as a match: the first that does.
fn driving_together(
    layer: &Layer,
    dtype: DType,
    source: &Source,
    params: &CaseParams,
    c: &CaseFailure,
    key: &str,
    left: &dyn Fn(f64) -> f64,
) -> Option<MutationMatch> {
    let steps = params.steps.as_ref()?;
    let window = layer.window();
    let only = [key.to_string()];
    for mistake in crate::describe::schedule::Mistake::ALL
        .into_iter()
        .filter(|m| m.applies(steps, window))
    {
        let ask = Ask {
            focus: None,
            budget: left(1.0),
            only: Some(&only),
            base: None,
            mistake: Some(mistake),
        };
        if ask.budget <= 0.0 {
            return None;
        }
        if let Ok((found, _)) = matches_on(layer, dtype, source, params, c, ask) {
            if let Some(m) = found.first() {
                return Some(crate::run::schedule::driving_match(
                    mistake,
                    steps.looped,
                    window,
                    m.fit,
                ));
            }
        }
    }
    None
}

/// The matches of `before` that are also in `found` (by key), each with the worse of the two fits.
fn common(before: Vec<MutationMatch>, found: &[MutationMatch]) -> Vec<MutationMatch> {
    before
        .into_iter()
        .filter_map(|mut m| {
            let other = found.iter().find(|f| f.key == m.key)?;
            m.fit.worst_ratio = m.fit.worst_ratio.max(other.fit.worst_ratio);
            m.fit.max_diff = m.fit.max_diff.max(other.fit.max_diff);
            Some(m)
        })
        .collect()
}

/// Whether the case failed on values (the port ran; a state_dict entry it never reads is named
/// on its own, and may be the whole story).
fn differs_in_values(c: &CaseFailure) -> bool {
    c.reference.is_some()
        && c.port.is_none()
        && !c.outputs_differ_in_structure()
        && c.leaves
            .iter()
            .any(|l| !l.passes() && !trace::is_trace(&l.name))
}

/// `drop 36, constant 21, …`: how many candidates of each kind were tried.
fn tried_kinds(s: &Search) -> String {
    s.kinds
        .iter()
        .filter(|(_, _, tried)| *tried > 0)
        .map(|(kind, _, tried)| format!("{kind} {tried}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn out_of_time(s: &Search, budget: f64) -> String {
    let left: Vec<String> = s
        .kinds
        .iter()
        .filter(|(_, n, tried)| tried < n)
        .map(|(kind, n, tried)| format!("{kind} {}", n - tried))
        .collect();
    let tried = if s.tried == 0 {
        format!("it tried none of its {} mutants", s.candidates)
    } else {
        format!(
            "it tried {} of {} mutants ({})",
            s.tried,
            s.candidates,
            tried_kinds(s)
        )
    };
    format!(
        "note: the mutation diagnosis ran out of its budget ({} s, a third of the reference's \
         timeout; the reference itself answered in time) during its {}: {tried} of the \
         reference's {} torch calls at {} sites{}; a longer `timeout = ` gives it more",
        num(budget),
        s.stage.as_deref().unwrap_or("search"),
        s.calls,
        s.sites,
        if left.is_empty() {
            String::new()
        } else {
            format!(", leaving {} untried", left.join(", "))
        }
    )
}

fn none_matched(searched: &[Search], two: bool, traced: bool, focus: Option<&str>) -> String {
    let s = &searched[0];
    let cases = if two {
        "on the smallest failing case"
    } else {
        "on the failing case"
    };
    let mut note = if s.tried == 0 {
        format!(
            "note: no single mutation of the reference matches the port {cases}: none of golden's \
             mutations (golden_ref/families.py, catalogue.py, structure.py) applies to its {} \
             torch calls at {} sites",
            s.calls, s.sites
        )
    } else {
        format!(
            "note: no single mutation of the reference matches the port {cases}: golden tried {} \
             mutants of its {} torch calls at {} sites ({}: golden_ref/families.py, catalogue.py, \
             structure.py)",
            s.tried,
            s.calls,
            s.sites,
            tried_kinds(s)
        )
    };
    if s.truncated {
        note.push_str(" before its budget ran out");
    }
    note.push_str(match (traced, focus) {
        (true, Some(_)) => {
            "; the trace above shows where the port first leaves the reference: \
                            compare that point's code with the reference's"
        }
        (true, None) => "; the trace above shows how far the port follows the reference",
        (false, _) => {
            "; to see where the port first leaves the reference, check it with `trace` \
                       (golden_layer(..., trace), tapping the port's intermediate values with \
                       golden::tap): the failure then names the first submodule that differs"
        }
    });
    note
}

/// The mutants the port matches on one failing case, and what the search did.
fn matches_on(
    layer: &Layer,
    dtype: DType,
    source: &Source,
    params: &CaseParams,
    c: &CaseFailure,
    ask: Ask<'_>,
) -> Result<(Vec<MutationMatch>, Search), Skipped> {
    let Some(reference) = &c.reference else {
        return Err(Skipped::Not(
            "the reference has no outputs for this case".into(),
        ));
    };
    let args: Vec<_> = c.inputs.iter().map(|(_, t)| t.clone()).collect();
    // A mutant is the port when its cached run is the port's: the one-shot leaves compare the
    // port's steps with the reference's whole-sequence forward, which a mistake that depends on a
    // chunk's length changes otherwise than the steps (heads merged untransposed: a one-token step
    // is right, eight tokens at once are not).
    let port: Vec<_> = c
        .port_outputs
        .iter()
        .filter(|(n, _)| !trace::is_trace(n) && !schedule::is_oneshot(n))
        .cloned()
        .collect();
    let search = mutations::search(source, layer, dtype, params, &args, &port, ask)?;
    let reference = expected(reference);
    // A schedule's mutant is held to the port as the reference is: a port that returns only the
    // last position of a step (candle-transformers' causal LMs) against the mutant's last.
    let plan = params.plan(layer);
    let aligned: Vec<ReferenceOutputs> = search
        .mutants
        .iter()
        .map(|m| match &plan {
            Some(plan) => {
                crate::run::schedule::align(&m.outputs, &mut port.clone(), plan, layer.tol).0
            }
            None => m.outputs.clone(),
        })
        .collect();
    let found = search
        .mutants
        .iter()
        .zip(&aligned)
        .filter_map(|(m, outputs)| {
            let mutant = expected(outputs);
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
                kind: m.kind.clone(),
                code: m.code.clone(),
                fit,
                both_cases: false,
                second: None,
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
        .filter(|(n, _)| !trace::is_trace(n) && !schedule::is_oneshot(n))
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
            kind: Kind::Observation,
        },
        on_first_case: None,
        confirmed: true,
    })
}
