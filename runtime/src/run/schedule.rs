//! A schedule's case against its reference (`decode(...)`; the port is driven by `run/steps.rs`):
//! the reference's answer aligned with what the port's steps return (`align`: last positions
//! only, the one-shot forward beside the cached run), the checks that only a port driven through
//! time can fail (`leakage` of padding into valid outputs, `free_running` generation), and the
//! diagnosis of a failing case by mistakes in how a model is driven (`explain`).

use crate::describe::schedule::{step_of, Holds};
use crate::report::issues::ScheduleIssue;
use golden_files::HostTensor;
use std::sync::Arc;

/// The leaf of the reference's generated tokens.
pub(crate) const TOKENS: &str = "tokens";

/// The prefix of a sampled generation's leaves (`sample.<j>.logits`, `sample.<j>.probs`,
/// `sample.probe.…`).
pub(crate) const SAMPLE: &str = "sample.";

/// The port's side of a case's schedule: its plan and the reference's tokens to feed it.
pub(crate) fn port_schedule(
    layer: &crate::describe::layer::Layer,
    params: &crate::describe::inputs::CaseParams,
    reference: &crate::answers::live::ReferenceOutputs,
) -> Option<crate::describe::schedule::PortSchedule> {
    let plan = params.plan(layer)?;
    let forced = reference
        .expected
        .iter()
        .find(|(n, _)| n == TOKENS)
        .map(|(_, t)| t.clone());
    let shapes = reference
        .expected
        .iter()
        .filter(|(n, _)| n.starts_with("step."))
        .map(|(n, t)| (n.clone(), t.shape.clone()))
        .collect();
    Some(crate::describe::schedule::PortSchedule {
        plan,
        forced,
        at: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        reference_shapes: shapes,
        draws: None,
        beam: None,
    })
}

/// The reference's answer as the port's steps are compared with it, and what was adapted:
///
/// - the generated tokens are left to the free-running pass ([`free_running`]);
/// - a port that returns only each step's last position (candle-transformers' models return the
///   last position's logits) is compared there: the reference's step (and one-shot) leaves are
///   narrowed to their last position;
/// - each step of the port is also compared with the reference's one-shot forward at the same
///   positions (the port's leaf is copied as `oneshot.<k>.<rest>`), allowing the larger of the two
///   rounding estimates — unless the reference's own cached step is outside the tolerance of its
///   one-shot forward: then the one-shot run is not what the cached run computes, and the port is
///   held to the cached run only (said in a note);
/// - one-shot leaves for which the port returns no step are dropped (the step's leaf already
///   says it is missing).
pub(crate) fn align(
    reference: &crate::answers::live::ReferenceOutputs,
    port: &mut Vec<(String, HostTensor)>,
    plan: &crate::describe::schedule::Plan,
    tol: Option<crate::describe::layer::Tol>,
) -> (
    crate::answers::live::ReferenceOutputs,
    Vec<crate::report::passed::Note>,
) {
    use crate::judge::compare;
    let mut r = reference.clone();
    let mut notes = Vec::new();
    // The generated tokens and a sampled generation's leaves are judged by their own checks
    // (`free_running`, `run/sampling.rs`).
    retain_leaves(&mut r, |n| {
        n != TOKENS && !n.starts_with(SAMPLE) && !n.starts_with(crate::run::beams::BEAMS)
    });
    // A step loop's free-running steps are held to the reference's trajectory, whose rounding
    // estimate (nudged inputs and float64 along the whole loop) covers the drift rounding makes.
    if plan.looped.is_some() {
        let copies = |set: &[(String, HostTensor)]| -> Vec<(String, HostTensor)> {
            set.iter()
                .filter_map(|(n, t)| {
                    Some((format!("free.{}", n.strip_prefix("step.")?), t.clone()))
                })
                .collect()
        };
        let free = copies(&r.expected);
        r.expected.extend(free);
        if let Some(set) = r.rounding.as_mut() {
            let free = copies(set);
            set.extend(free);
        }
        if let Some(set) = r.precise.as_mut() {
            let free = copies(set);
            set.extend(free);
        }
        return (r, notes);
    }
    let mut last_only: Vec<String> = Vec::new();
    for (name, t) in port.iter() {
        let Some((k, rest)) = step_of(name) else {
            continue;
        };
        let Some(expected) = find(&r.expected, name) else {
            continue;
        };
        let axis = plan.axis;
        if expected.shape == t.shape
            || plan.holds(k, &expected.shape, &t.shape) != Some(Holds::Last)
        {
            continue;
        }
        let len = expected.shape[axis];
        let shape = t.shape.clone();
        for leaf in [name.clone(), format!("oneshot.{k}.{rest}")] {
            map_leaf(&mut r, &leaf, |h| {
                let mut last = h.narrow(axis, len - 1, 1)?;
                last.shape = shape.clone();
                Some(last)
            });
        }
        if !last_only.iter().any(|l| l == rest) {
            last_only.push(rest.to_string());
        }
    }
    if !last_only.is_empty() {
        let summary = format!(
            "the port returns only the last position of each step's {} (as candle-transformers' \
             models return the last position's logits): golden compares it with the reference's \
             last position of each step",
            last_only
                .iter()
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        notes.push(crate::report::passed::Note {
            detail: summary.clone(),
            summary,
        });
    }
    // The one-shot comparison.
    let mut differs: Vec<(usize, String, f64)> = Vec::new();
    let names: Vec<String> = r.expected.iter().map(|(n, _)| n.clone()).collect();
    for name in names.iter().filter(|n| n.starts_with("oneshot.")) {
        let (k, rest) = step_of(name).expect("a one-shot leaf");
        let step = format!("step.{k}.{rest}");
        let Some(port_leaf) = port
            .iter()
            .find(|(n, _)| *n == step)
            .map(|(_, t)| t.clone())
        else {
            retain_leaves(&mut r, |n| n != name);
            continue;
        };
        let (Some(cached), Some(oneshot)) = (find(&r.expected, &step), find(&r.expected, name))
        else {
            continue;
        };
        let own = compare::compare_leaf(
            name,
            cached,
            &compare::Expected {
                value: oneshot,
                rounding: r.rounding_of(name),
                precise: None,
            },
            tol,
            compare::ROUNDING_FACTOR,
        );
        if !own.passes() {
            let worst = match &own.verdict {
                compare::Verdict::Values(v) => v.worst_ratio,
                _ => f64::INFINITY,
            };
            differs.push((k, rest.to_string(), worst));
            retain_leaves(&mut r, |n| n != name);
            continue;
        }
        // The larger of the two rounding estimates.
        if let (Some(a), Some(b)) = (r.rounding_of(&step).cloned(), r.rounding_of(name).cloned()) {
            if a.shape == b.shape {
                let (a, b) = (a.to_f64(), b.to_f64());
                let max: Vec<f64> = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| {
                        if x.is_nan() || y.is_nan() {
                            f64::NAN
                        } else {
                            x.max(*y)
                        }
                    })
                    .collect();
                let merged = HostTensor::from_floats(
                    oneshot.shape.clone(),
                    &max,
                    golden_files::WireDType::F32,
                );
                if let Some(set) = r.rounding.as_mut() {
                    if let Some((_, t)) = set.iter_mut().find(|(n, _)| n == name) {
                        *t = merged;
                    }
                }
            }
        }
        port.push((name.clone(), port_leaf));
    }
    if let Some((k, rest, worst)) = differs.first() {
        let summary = format!(
            "the reference's own cached run differs from its one-shot forward beyond the tolerance \
             ({} step{}): golden holds the port to the cached run only there",
            differs.len(),
            if differs.len() == 1 { "" } else { "s" }
        );
        notes.push(crate::report::passed::Note {
            detail: format!(
                "{summary} (first at step {k}'s `{rest}`, {}× the allowed error): the reference \
                 keeps no state between calls that makes a chunked run equal a whole one (a cache \
                 it trims, a module without a cache), so its one-shot forward is no measure of its \
                 cached steps",
                crate::describe::numbers::num(*worst)
            ),
            summary,
        });
    }
    (r, notes)
}

fn find<'a>(set: &'a [(String, HostTensor)], name: &str) -> Option<&'a HostTensor> {
    set.iter().find(|(n, _)| n == name).map(|(_, t)| t)
}

/// Keep the leaves whose names pass `keep`, in every part of an answer.
fn retain_leaves(r: &mut crate::answers::live::ReferenceOutputs, keep: impl Fn(&str) -> bool) {
    r.expected.retain(|(n, _)| keep(n));
    if let Some(set) = r.rounding.as_mut() {
        set.retain(|(n, _)| keep(n));
    }
    if let Some(set) = r.precise.as_mut() {
        set.retain(|(n, _)| keep(n));
    }
}

/// Replace a leaf by `f` of it in every part of an answer (left as it is where `f` gives `None`).
fn map_leaf(
    r: &mut crate::answers::live::ReferenceOutputs,
    name: &str,
    f: impl Fn(&HostTensor) -> Option<HostTensor>,
) {
    let sets = [
        Some(&mut r.expected),
        r.rounding.as_mut(),
        r.precise.as_mut(),
    ];
    for set in sets.into_iter().flatten() {
        if let Some((_, t)) = set.iter_mut().find(|(n, _)| n == name) {
            if let Some(new) = f(t) {
                *t = new;
            }
        }
    }
}

/// `tensor` with the values of `other` at the padded positions of `mask` (`[batch, len]`, 0 for
/// padding) along `axis`: the leakage check's input.
pub(crate) fn with_padding_from(
    tensor: &HostTensor,
    other: &HostTensor,
    mask: &HostTensor,
    axis: usize,
) -> Option<HostTensor> {
    if tensor.shape != other.shape || tensor.dtype != other.dtype || axis != 1 {
        return None;
    }
    let (batch, len) = (*tensor.shape.first()?, *tensor.shape.get(1)?);
    let inner = tensor.shape[2..].iter().product::<usize>() * tensor.dtype.size();
    let mask = mask.to_i64();
    let mut data = tensor.data.to_vec();
    for b in 0..batch {
        for j in 0..len {
            if mask.get(b * len + j) == Some(&0) {
                let at = (b * len + j) * inner;
                data[at..at + inner].copy_from_slice(&other.data[at..at + inner]);
            }
        }
    }
    Some(HostTensor {
        data: data.into(),
        ..tensor.clone()
    })
}

/// The leakage check's verdict: every step's output must be the same values with other tokens at
/// the padded positions — exactly, but as numbers: −0 and +0 are one value (a padded key's weight
/// is exactly 0 in a right port as in transformers, and 0 times a padded value is −0 or +0 by that
/// value's sign), and NaN stays NaN.
pub(crate) fn leakage(
    first: &[(String, HostTensor)],
    second: &[(String, HostTensor)],
    plan: &crate::describe::schedule::Plan,
) -> Option<ScheduleIssue> {
    let same = |x: f64, y: f64| x == y || (x.is_nan() && y.is_nan());
    for (name, a) in first.iter().filter(|(n, _)| step_of(n).is_some()) {
        let Some(b) = find(second, name) else {
            continue;
        };
        if a.data == b.data && a.shape == b.shape {
            continue;
        }
        let (x, y) = (a.to_f64(), b.to_f64());
        let moved = (0..x.len().min(y.len())).find(|&i| !same(x[i], y[i]));
        let i = match moved {
            Some(i) => i,
            None if a.shape == b.shape => continue,
            None => 0,
        };
        let (k, _) = step_of(name).expect("a step's leaf");
        let (from, to) = crate::describe::numbers::num_pair(
            x.get(i).copied().unwrap_or(f64::NAN),
            y.get(i).copied().unwrap_or(f64::NAN),
        );
        return Some(ScheduleIssue::PaddingLeaks(format!(
            "padding leaks into valid outputs: with other tokens at the padded positions, \
             `{name}` ({}) moves at {:?} from {} to {} — only padding changed, so a valid output \
             must not move at all: padded keys not masked, position ids not derived from the \
             attention mask (`Step::positions`), or padding pooled with the tokens",
            plan.steps.describe(k),
            crate::judge::compare::unravel(i, &a.shape),
            from,
            to,
        )));
    }
    None
}

/// The free-running pass's verdict: the port's own greedy tokens against the reference's (a note
/// when they are the same). Where they first differ, the reference's logits there decide: when
/// its top two are closer than the tolerance allows for both (a tie within rounding), the flip is a
/// note; otherwise a failure (the teacher-forced steps matched, so the port's logits there depend
/// on more than its inputs).
pub(crate) fn free_running(
    port: &[(String, HostTensor)],
    forced: Option<&HostTensor>,
    reference: &crate::answers::live::ReferenceOutputs,
    plan: &crate::describe::schedule::Plan,
    tol: Option<crate::describe::layer::Tol>,
) -> Result<crate::report::passed::Note, ScheduleIssue> {
    use crate::describe::numbers::num;
    let (Some(ours), Some(theirs)) = (find(port, TOKENS), forced) else {
        return Err(ScheduleIssue::FreeRunning(
            "the free-running pass produced no tokens".into(),
        ));
    };
    let (ours, theirs) = (ours.to_i64(), theirs.to_i64());
    let generate = plan.steps.generate;
    let Some(at) = (0..ours.len().min(theirs.len())).find(|&i| ours[i] != theirs[i]) else {
        let summary = "free-running, the port generates the reference's greedy tokens".to_string();
        return Ok(crate::report::passed::Note {
            detail: format!("{summary} ({generate} per row)"),
            summary,
        });
    };
    let (row, j) = (at / generate, at % generate);
    // Token j is chosen by the step that ends just before the position it fills.
    let k = plan.steps.chunks.len() - 1 + j;
    let logits = reference.expected.iter().find(|(n, _)| {
        n.starts_with("step.")
            && step_of(n)
                .is_some_and(|(s, rest)| s == k && (rest.ends_with("logits") || rest == "out"))
    });
    let Some((leaf, logits)) = logits else {
        return Err(ScheduleIssue::FreeRunning(format!(
            "free-running, the port's token {j} of row {row} is {} where the reference's is {}",
            ours[at], theirs[at]
        )));
    };
    let vocab = (*logits.shape.last().unwrap_or(&1)).max(1);
    let batch = logits.shape.first().copied().unwrap_or(1).max(1);
    let values = logits.to_f64();
    // The row's last position: the last `vocab` values of its slice.
    let per_row = values.len() / batch;
    let start = row * per_row + per_row - vocab;
    let rounding = reference.rounding_of(leaf).map(HostTensor::to_f64);
    let rule = crate::judge::compare::Rule::for_leaf(
        logits.dtype,
        tol,
        crate::judge::compare::ROUNDING_FACTOR,
    );
    let at_token = |t: i64| {
        let i = start + usize::try_from(t).unwrap_or(0).min(vocab - 1);
        let r = rounding
            .as_ref()
            .and_then(|r| r.get(i).copied())
            .filter(|r| r.is_finite())
            .unwrap_or(0.0);
        (values[i], rule.allowed(values[i], r))
    };
    let (theirs_value, theirs_allowed) = at_token(theirs[at]);
    let (ours_value, ours_allowed) = at_token(ours[at]);
    let gap = theirs_value - ours_value;
    let bound = theirs_allowed + ours_allowed;
    let what = format!(
        "free-running, at {} the port picks token {} where the reference picks {} (row {row}); \
         the reference's logits for the two differ by {}",
        plan.steps.describe(k),
        ours[at],
        theirs[at],
        num(gap)
    );
    if gap <= bound {
        let summary = "free-running, the port's greedy tokens part from the reference's at a tie \
                       within rounding: a flip between near-tied logits, not a failure"
            .to_string();
        return Ok(crate::report::passed::Note {
            detail: format!(
                "{what}, within the {} the tolerance allows for both: a flip between near-tied \
                 logits, not a failure (the steps after it feed other tokens and are not compared)",
                num(bound)
            ),
            summary,
        });
    }
    Err(ScheduleIssue::FreeRunning(format!(
        "{what}, more than the {} the tolerance allows for both: the teacher-forced steps \
         matched, so on its own tokens the port computes other logits than on the same tokens \
         fed — state that depends on how a token arrived (a cache written twice, generated tokens \
         at the wrong position)",
        num(bound)
    )))
}

/// The diagnosis of a schedule's failing case: the reference driven with each porting mistake of
/// the driving that can show in the case ([`Mistake`]: positions not offset, no cache, padding in
/// the positions or not masked, a window one key off), and the mistakes under which the reference
/// becomes the port — on the smallest and the first failing case — as likely causes. Returns
/// whether one matched (the search of the reference's own calls is then not needed).
pub(crate) fn explain(
    layer: &crate::describe::layer::Layer,
    dtype: candle_core::DType,
    source: &crate::answers::source::Source,
    failure: &mut crate::report::failure::Failure,
    first: Option<&(
        crate::describe::inputs::CaseParams,
        Box<crate::report::failure::CaseFailure>,
    )>,
) -> bool {
    use crate::describe::schedule::Mistake;
    use crate::report::failure::FailureKind;
    let (FailureKind::Case(c), Some(case)) = (&mut failure.kind, &failure.case) else {
        return false;
    };
    let Some(steps) = &case.steps else {
        return false;
    };
    if c.reference.is_none() || c.port.is_some() {
        return false;
    }
    let window = layer.window();
    let tried: Vec<Mistake> = Mistake::ALL
        .into_iter()
        .filter(|m| m.applies(steps, window))
        .collect();
    let on = |params: &crate::describe::inputs::CaseParams,
              f: &crate::report::failure::CaseFailure,
              mistakes: &[Mistake]| {
        mistakes
            .iter()
            .filter_map(|&m| Some((m, mistake_fit(layer, dtype, source, params, f, m)?)))
            .collect::<Vec<_>>()
    };
    let smallest = on(case, c, &tried);
    let matched: Vec<Mistake> = smallest.iter().map(|(m, _)| *m).collect();
    let first =
        first.filter(|(params, f)| params != case && f.reference.is_some() && f.port.is_none());
    let on_first = first.map(|(params, f)| on(params, f, &matched));
    let as_match =
        |m: Mistake, fit: crate::judge::mutations::Fit| driving_match(m, steps.looped, window, fit);
    let smallest: Vec<_> = smallest.into_iter().map(|(m, f)| as_match(m, f)).collect();
    let on_first: Option<Vec<_>> =
        on_first.map(|found| found.into_iter().map(|(m, f)| as_match(m, f)).collect());
    let matches = crate::judge::mutations::both(smallest, on_first.as_deref(), 3);
    let confirmed = matches.iter().any(|m| m.both_cases);
    c.mutations = matches;
    confirmed
}

/// A mistake of driving as a match of the diagnosis: "the schedule driven with …" (a step loop's
/// "the loop run with …"), with its fix.
pub(crate) fn driving_match(
    m: crate::describe::schedule::Mistake,
    looped: bool,
    window: Option<usize>,
    fit: crate::judge::mutations::Fit,
) -> crate::judge::mutations::MutationMatch {
    let (what, instead, fix) = m.explain(window);
    crate::judge::mutations::MutationMatch {
        mutation: crate::judge::mutations::Mutation {
            key: format!("schedule {}", m.token()),
            what: if looped {
                format!("the loop run with {what}")
            } else {
                format!("the schedule driven with {what}")
            },
            instead,
            site: String::new(),
            fix,
            family: crate::judge::mutations::Family::Schedule,
            code: None,
        },
        fit,
        both_cases: false,
        second: None,
    }
}

/// Leaves as the comparison takes them.
fn view(
    set: &[(String, HostTensor, Option<HostTensor>)],
) -> Vec<(String, crate::judge::compare::Expected<'_>)> {
    set.iter()
        .map(|(n, t, r)| {
            (
                n.clone(),
                crate::judge::compare::Expected {
                    value: t,
                    rounding: r.as_ref(),
                    precise: None,
                },
            )
        })
        .collect()
}

/// How a port's steps fit the reference driven with `mistake` on one case, if they do (and the
/// mistake changes the reference there).
fn mistake_fit(
    layer: &crate::describe::layer::Layer,
    dtype: candle_core::DType,
    source: &crate::answers::source::Source,
    params: &crate::describe::inputs::CaseParams,
    c: &crate::report::failure::CaseFailure,
    mistake: crate::describe::schedule::Mistake,
) -> Option<crate::judge::mutations::Fit> {
    use crate::answers::source::Answer;
    let reference = c.reference.as_ref()?;
    let mut plan = params.plan(layer)?;
    plan.mistake = Some(mistake);
    let args: Vec<HostTensor> = c.inputs.iter().map(|(_, t)| t.clone()).collect();
    let request = crate::answers::live::Request::Forward {
        args: &args,
        trace: false,
        twice: false,
        precise: false,
        plan: Some(&plan),
        stage: None,
    };
    let Answer::Outputs(mutant) = source.request(layer, dtype, params, &request) else {
        return None;
    };
    // The port's steps, aligned with the mistaken answer as with the reference's. A step loop's
    // mistaken reference follows its own trajectory: the port's free-running steps are its match.
    let prefix = if plan.looped.is_some() {
        "free."
    } else {
        "step."
    };
    let mut port: Vec<(String, HostTensor)> = c
        .port_outputs
        .iter()
        .filter_map(|(n, t)| Some((format!("step.{}", n.strip_prefix(prefix)?), t.clone())))
        .collect();
    let (mutant, _) = align(&mutant, &mut port, &plan, layer.tol);
    port.retain(|(n, _)| n.starts_with("step."));
    let expected = |r: &crate::answers::live::ReferenceOutputs| -> Vec<(String, HostTensor, Option<HostTensor>)> {
        r.expected
            .iter()
            .filter(|(n, _)| n.starts_with("step."))
            .map(|(n, t)| (n.clone(), t.clone(), r.rounding_of(n).cloned()))
            .collect()
    };
    let (mutant, reference) = (expected(&mutant), expected(reference));
    crate::judge::mutations::fit(
        &port,
        &view(&mutant),
        &view(&reference),
        layer.tol,
        crate::judge::compare::ROUNDING_FACTOR,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::describe::schedule::{Padding, Plan, Steps};
    use golden_files::WireDType;

    fn plan() -> Plan {
        Plan {
            arg: 0,
            axis: 1,
            steps: Steps {
                chunks: vec![2],
                padding: Padding::Left,
                generate: 0,
                looped: false,
            },
            mask: None,
            mistake: None,
            looped: None,
            sample: None,
            beams: None,
        }
    }

    fn leaf(values: &[f64]) -> Vec<(String, HostTensor)> {
        let t = HostTensor::from_floats(vec![1, values.len()], values, WireDType::F32);
        vec![("step.0.out".to_string(), t)]
    }

    #[test]
    fn the_leakage_check_takes_the_sign_of_a_zero_for_no_move() {
        // 0 × a padded value: −0 or +0 by the value's sign, in a right port as in transformers.
        assert!(leakage(&leaf(&[0.0, 1.5]), &leaf(&[-0.0, 1.5]), &plan()).is_none());
        assert!(leakage(&leaf(&[f64::NAN, 1.5]), &leaf(&[f64::NAN, 1.5]), &plan()).is_none());
        // The smallest move of a value is one.
        let moved = 1.5f64 + f64::from(f32::EPSILON) * 2.0;
        let Some(ScheduleIssue::PaddingLeaks(msg)) =
            leakage(&leaf(&[0.0, 1.5]), &leaf(&[0.0, moved]), &plan())
        else {
            panic!("a moved value passed the leakage check");
        };
        assert!(
            msg.contains(
                "`step.0.out` (step 0, the prefill of 2 tokens) moves at [0, 1] from 1.5 to \
                 1.5000002"
            ),
            "{msg}"
        );
    }
}
