//! Checking declared invariants (`describe/invariants.rs`) on the port's outputs, every case, live
//! and in replay. A violation names the leaf, the invariant, the first element (or slice) that
//! breaks it with its value, how many break it, and whether the reference holds it there — a
//! failure of its own, whatever the comparison with the reference says.

use crate::describe::invariants::Invariant;
use crate::describe::numbers::num;
use golden_files::{HostTensor, WireDType};
use std::fmt;

/// One declared invariant the port breaks on a case.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    /// The leaf (`out`, `out.logits`, `step.2.out`).
    pub leaf: String,
    /// The invariant.
    pub invariant: Invariant,
    /// What breaks it first: `the slice [0, 2, :] sums to 0.7312 (allowed |sum − 1| ≤ 3.8e-6)`.
    pub first: String,
    /// How many elements (or slices) break it, and of how many.
    pub count: (usize, usize),
    /// What the reference's leaf of that name does: `None` when it has none (a replay of another
    /// leaf set, a leaf only the port returns).
    pub reference: Option<ReferenceSide>,
}

/// The reference on the same invariant.
#[derive(Clone, Debug, PartialEq)]
pub struct ReferenceSide {
    /// Whether the reference's leaf holds the invariant everywhere on this case.
    pub holds: bool,
    /// The reference's value where the port first breaks it (`sums to 1`, `is 0.25`).
    pub there: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` {}: {}", self.leaf, self.invariant, self.first)?;
        let (bad, all) = self.count;
        if all > 1 {
            let unit = match self.invariant {
                Invariant::SumsToOne { .. } => "slices",
                _ => "elements",
            };
            write!(f, "; {bad} of {all} {unit} break it")?;
        }
        match &self.reference {
            Some(r) if r.holds => write!(
                f,
                "; the reference holds it on this case (there it {}): the port computes something \
                 else",
                r.there
            ),
            Some(r) => write!(
                f,
                "; the reference breaks it too on this case (there it {}): the invariant may not \
                 hold for this reference, or the inputs leave its domain",
                r.there
            ),
            None => Ok(()),
        }
    }
}

/// Unit roundoff of a float dtype (0 for integers: their sums are exact).
fn unit_roundoff(dtype: WireDType) -> f64 {
    match dtype {
        WireDType::F64 => 2f64.powi(-53),
        WireDType::F32 => 2f64.powi(-24),
        WireDType::F16 => 2f64.powi(-11),
        WireDType::BF16 => 2f64.powi(-8),
        _ => 0.0,
    }
}

/// Whether `leaf` is the output `name`, or one step's of it in a schedule (`step.2.out`).
fn is_leaf(leaf: &str, name: &str) -> bool {
    leaf == name
        || crate::describe::schedule::step_of(leaf)
            .is_some_and(|(_, rest)| rest == name && !leaf.starts_with("oneshot."))
}

fn index_text(index: &[usize], slice_at: Option<usize>) -> String {
    let parts: Vec<String> = index
        .iter()
        .enumerate()
        .map(|(axis, i)| {
            if Some(axis) == slice_at {
                ":".to_string()
            } else {
                i.to_string()
            }
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

/// An invariant on a tensor, unit by unit (elements, or slices for `sums_to_one`): each unit's
/// description (`is NaN`, `sums to 0.7312`) and whether it holds. `Err` when it cannot apply.
fn units(t: &HostTensor, invariant: &Invariant) -> Result<Units, String> {
    let values = t.to_f64();
    let shape = &t.shape;
    let unravel = |i: usize| crate::judge::compare::unravel(i, shape);
    let each = |holds: &dyn Fn(f64) -> bool| {
        values
            .iter()
            .enumerate()
            .map(|(i, &v)| (unravel(i), format!("is {}", num(v)), holds(v)))
            .collect::<Vec<_>>()
    };
    match *invariant {
        Invariant::Finite => Ok((each(&|v: f64| v.is_finite()), None, String::new())),
        Invariant::NonNegative => Ok((each(&|v: f64| v >= 0.0), None, String::new())),
        Invariant::Range { lo, hi } => {
            Ok((each(&|v: f64| (lo..=hi).contains(&v)), None, String::new()))
        }
        Invariant::SumsToOne { dim, tol } => {
            let rank = shape.len() as i64;
            let axis = if dim < 0 { rank + dim } else { dim };
            if !(0..rank).contains(&axis) {
                return Err(format!(
                    "has {rank} ax{}, so no dim {dim} to sum over",
                    if rank == 1 { "is" } else { "es" }
                ));
            }
            let axis = axis as usize;
            let n = shape[axis];
            let inner: usize = shape[axis + 1..].iter().product();
            let outer: usize = shape[..axis].iter().product();
            let tol = tol.unwrap_or(n.max(1) as f64 * unit_roundoff(t.dtype));
            let mut out = Vec::with_capacity(outer * inner);
            for o in 0..outer {
                for i in 0..inner {
                    let sum: f64 = (0..n).map(|k| values[(o * n + k) * inner + i]).sum();
                    let start = unravel(o * n * inner + i);
                    out.push((
                        start,
                        format!("sums to {}", num(sum)),
                        sum.is_finite() && (sum - 1.0).abs() <= tol,
                    ));
                }
            }
            Ok((
                out,
                Some(axis),
                format!(" (allowed |sum − 1| ≤ {})", num(tol)),
            ))
        }
    }
}

/// One unit of an invariant: where it starts (a slice's index has its summed axis at 0), what it
/// is (`is NaN`, `sums to 0.7312`), and whether it holds.
type Unit = (Vec<usize>, String, bool);

/// The units of an invariant on a tensor (elements, or slices for `sums_to_one`), the summed axis
/// if any, and what is allowed (a sum's tolerance, as text).
type Units = (Vec<Unit>, Option<usize>, String);

/// The reference's units of the same invariant, when its leaf has the port's shape (else the
/// units would not line up).
fn units_of_reference(
    r: &HostTensor,
    port: &HostTensor,
    invariant: &Invariant,
) -> Option<Vec<Unit>> {
    if r.shape != port.shape {
        return None;
    }
    units(r, invariant).ok().map(|(u, _, _)| u)
}

/// Every declared invariant the port's outputs break on this case, with the reference's side.
/// A declared leaf the port does not return is a violation too (it names the leaves there are).
pub fn check(
    declared: &[(String, Vec<Invariant>)],
    port: &[(String, HostTensor)],
    reference: &[(String, HostTensor)],
) -> Vec<Violation> {
    let mut out = Vec::new();
    for (name, invariants) in declared {
        let leaves: Vec<&(String, HostTensor)> = port
            .iter()
            .filter(|(leaf, _)| is_leaf(leaf, name))
            .collect();
        if leaves.is_empty() {
            let names: Vec<&str> = port
                .iter()
                .map(|(n, _)| n.as_str())
                .filter(|n| !crate::judge::trace::is_trace(n))
                .collect();
            for invariant in invariants {
                out.push(Violation {
                    leaf: name.clone(),
                    invariant: invariant.clone(),
                    first: format!(
                        "the port returns no `{name}` (its outputs: {}), so the invariant \
                         checks nothing: name one of its outputs",
                        names.join(", ")
                    ),
                    count: (0, 0),
                    reference: None,
                });
            }
            continue;
        }
        for (leaf, t) in leaves {
            for invariant in invariants {
                let (units, slice_at, allowed) = match units(t, invariant) {
                    Ok(u) => u,
                    Err(why) => {
                        out.push(Violation {
                            leaf: leaf.clone(),
                            invariant: invariant.clone(),
                            first: format!("the port's `{leaf}` {:?} {why}", t.shape),
                            count: (0, 0),
                            reference: None,
                        });
                        continue;
                    }
                };
                let Some(at) = units.iter().position(|(_, _, ok)| !ok) else {
                    continue;
                };
                let bad = units.iter().filter(|(_, _, ok)| !ok).count();
                let reference_side = reference
                    .iter()
                    .find(|(n, _)| n == leaf)
                    .and_then(|(_, r)| units_of_reference(r, t, invariant))
                    .and_then(|theirs| {
                        Some(ReferenceSide {
                            holds: theirs.iter().all(|(_, _, ok)| *ok),
                            there: theirs.get(at)?.1.clone(),
                        })
                    });
                let (start, what, _) = &units[at];
                let unit = if slice_at.is_some() {
                    "the slice"
                } else {
                    "element"
                };
                out.push(Violation {
                    leaf: leaf.clone(),
                    invariant: invariant.clone(),
                    first: format!("{unit} {} {what}{allowed}", index_text(start, slice_at)),
                    count: (bad, units.len()),
                    reference: reference_side,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], v: &[f64]) -> HostTensor {
        HostTensor::from_floats(shape.to_vec(), v, WireDType::F32)
    }

    #[test]
    fn a_softmax_over_the_wrong_axis_breaks_sums_to_one() {
        // Rows of the reference sum to 1; the port normalised the columns.
        let reference = t(&[2, 2], &[0.25, 0.75, 0.5, 0.5]);
        let port = t(&[2, 2], &[1.0 / 3.0, 0.6, 2.0 / 3.0, 0.4]);
        let declared = vec![("out".to_string(), vec![Invariant::sums_to_one(-1)])];
        let v = check(
            &declared,
            &[("out".into(), port)],
            &[("out".into(), reference)],
        );
        assert_eq!(v.len(), 1);
        let text = v[0].to_string();
        assert!(
            text.starts_with("`out` sums_to_one(dim = -1): the slice [0, :] sums to 0.9333"),
            "{text}"
        );
        assert!(text.contains("2 of 2 slices break it"), "{text}");
        assert!(
            text.contains("the reference holds it on this case (there it sums to 1)"),
            "{text}"
        );
    }

    #[test]
    fn elements_out_of_range_are_named_with_their_value() {
        let port = t(&[3], &[0.5, f64::NAN, -2.0]);
        let declared = vec![(
            "out".to_string(),
            vec![
                Invariant::Finite,
                Invariant::NonNegative,
                Invariant::Range { lo: -1.0, hi: 1.0 },
            ],
        )];
        let v = check(&declared, &[("out".into(), port.clone())], &[]);
        let texts: Vec<String> = v.iter().map(ToString::to_string).collect();
        assert_eq!(texts.len(), 3, "{texts:?}");
        assert_eq!(
            texts[0],
            "`out` finite: element [1] is NaN; 1 of 3 elements break it"
        );
        assert!(
            texts[1].starts_with("`out` non_negative: element [1] is NaN; 2 of 3"),
            "{texts:?}"
        );
        assert!(
            texts[2].starts_with("`out` range(-1.0, 1.0): element [1] is NaN"),
            "{texts:?}"
        );
        // Declared for a leaf the port does not return: said, not silently passed.
        let v = check(
            &[("out.probs".to_string(), vec![Invariant::Finite])],
            &[("out".into(), port)],
            &[],
        );
        assert!(v[0]
            .to_string()
            .contains("the port returns no `out.probs` (its outputs: out)"));
    }
}
