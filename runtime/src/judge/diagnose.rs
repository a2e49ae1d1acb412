//! Naming the likely bug: after a mismatch, test the usual porting mistakes against the numbers.
//!
//! Each hypothesis H transforms the reference (transpose it, scale it, add a bias, ...) and fits
//! when the port matches H(reference) within the comparison's own tolerance, at every element —
//! as well as a mutant of the reference would. It only counts when H(reference) is itself *not*
//! within tolerance of the reference: otherwise this case cannot tell H from no bug at all (a
//! "transpose" of an output that is the same along both axes). Hypotheses that do not fit are not
//! reported; one that fits is a cause only when it fits on two failing cases and no mutant of the
//! reference matches (`run/forward.rs`, `run/mutations.rs`). An output of zeros or a constant is
//! held to the same two cases (one element of a shrunk case is zero by chance); NaN where the
//! reference is finite is a fact, said as it is.

use crate::describe::numbers::num;
use crate::judge::compare::Rule;
use golden_files::HostTensor;
use std::fmt;

/// A likely cause, with the evidence for it and the usual fix.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnosis {
    /// What the numbers show, e.g. "port ≈ reference.transpose(1, 2) (max diff 3e-8)".
    pub evidence: String,
    /// What usually causes it and how to fix it.
    pub cause: String,
    /// Which hypothesis it is, or an observation.
    pub kind: Kind,
}

/// What a diagnosis rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A fact about the port's numbers (NaN where the reference is finite, all zeros, a failure
    /// on tiny values only): said as it is.
    Observation,
    /// port ≈ reference with its axes permuted.
    Transpose,
    /// port ≈ c × reference.
    Scale,
    /// port ≈ reference + a bias along some axes.
    Offset,
    /// The port's slices sum to 1 over another dim.
    SoftmaxDim,
    /// The port is all zeros, or constant: on a small case (one element, one row) that is often
    /// chance, so it needs two failing cases like a hypothesis.
    Degenerate,
}

impl Diagnosis {
    /// Whether it models the port as a transform of the reference (a cause only when it holds on
    /// two failing cases and no mutant of the reference matches).
    pub fn is_hypothesis(&self) -> bool {
        self.kind != Kind::Observation
    }
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.evidence, self.cause)
    }
}

/// A leaf as the hypotheses see it.
struct Leaf<'a> {
    port: Vec<f64>,
    port_shape: &'a [usize],
    reference: Vec<f64>,
    shape: &'a [usize],
    rounding: Vec<f64>,
    rule: Rule,
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// `values` of `shape` with its axes reordered: axis k of the result is axis `perm[k]` of the input.
fn permute(values: &[f64], shape: &[usize], perm: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let new_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let old = strides(shape);
    let mut out = Vec::with_capacity(values.len());
    let mut index = vec![0usize; shape.len()];
    for _ in 0..values.len() {
        let flat: usize = (0..perm.len()).map(|k| index[k] * old[perm[k]]).sum();
        out.push(values[flat]);
        for k in (0..index.len()).rev() {
            index[k] += 1;
            if index[k] < new_shape[k] {
                break;
            }
            index[k] = 0;
        }
    }
    (out, new_shape)
}

/// Whether `a` is within tolerance of `b` (b as the reference), and the largest finite difference.
fn within(a: &[f64], b: &[f64], rounding: &[f64], rule: Rule) -> (bool, f64) {
    let mut ok = a.len() == b.len();
    let mut max = 0.0f64;
    for i in 0..a.len().min(b.len()) {
        let (x, r) = (a[i], b[i]);
        if !x.is_finite() || !r.is_finite() {
            ok &= (x.is_nan() && r.is_nan()) || x == r;
            continue;
        }
        let d = (x - r).abs();
        max = max.max(d);
        ok &= d <= rule_allowed(rule, r, rounding.get(i).copied().unwrap_or(0.0));
    }
    (ok, max)
}

fn rule_allowed(rule: Rule, r: f64, rounding: f64) -> f64 {
    match rule {
        Rule::Default { atol, rtol, factor } => atol + rtol * r.abs() + factor * rounding,
        Rule::Explicit(t) => t.atol + t.rtol * r.abs(),
        Rule::Exact => 0.0,
    }
}

impl Leaf<'_> {
    /// Whether a hypothesis with a free parameter (a scale, an offset) could be told apart from
    /// chance here: a parameter fitted to one or two values explains them whatever they are.
    fn enough_evidence(&self) -> bool {
        let mut distinct: Vec<f64> = self
            .reference
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .collect();
        distinct.sort_by(f64::total_cmp);
        distinct.dedup();
        distinct.len() >= 3
    }

    /// H(reference), in the reference's own tolerance: does the port match it, and does it differ
    /// from the reference? Returns the port's max difference to it when both hold.
    fn explains(&self, candidate: &[f64], candidate_rounding: &[f64]) -> Option<f64> {
        let (port_fits, max) = within(&self.port, candidate, candidate_rounding, self.rule);
        if !port_fits {
            return None;
        }
        let (indistinct, _) = within(candidate, &self.reference, &self.rounding, self.rule);
        (!indistinct).then_some(max)
    }
}

/// All permutations of `0..n` that turn `from` into `to` (sizes must match), identity excluded.
fn permutations(from: &[usize], to: &[usize]) -> Vec<Vec<usize>> {
    fn extend(
        k: usize,
        from: &[usize],
        to: &[usize],
        used: &mut Vec<bool>,
        cur: &mut Vec<usize>,
        out: &mut Vec<Vec<usize>>,
    ) {
        if k == to.len() {
            if cur.iter().enumerate().any(|(i, &p)| i != p) {
                out.push(cur.clone());
            }
            return;
        }
        for j in 0..from.len() {
            if !used[j] && from[j] == to[k] {
                used[j] = true;
                cur.push(j);
                extend(k + 1, from, to, used, cur, out);
                cur.pop();
                used[j] = false;
            }
        }
    }
    let mut out = Vec::new();
    if from.len() == to.len() && from.len() <= 6 {
        extend(
            0,
            from,
            to,
            &mut vec![false; from.len()],
            &mut Vec::new(),
            &mut out,
        );
    }
    out
}

fn describe_permutation(perm: &[usize]) -> String {
    let moved: Vec<usize> = (0..perm.len()).filter(|&i| perm[i] != i).collect();
    if moved.len() == 2 {
        format!("reference.transpose({}, {})", moved[0], moved[1])
    } else {
        format!("reference.permute({perm:?})")
    }
}

fn transposes(leaf: &Leaf<'_>, out: &mut Vec<Diagnosis>) {
    for perm in permutations(leaf.shape, leaf.port_shape) {
        let (candidate, _) = permute(&leaf.reference, leaf.shape, &perm);
        let (rounding, _) = permute(&leaf.rounding, leaf.shape, &perm);
        if let Some(max) = leaf.explains(&candidate, &rounding) {
            out.push(Diagnosis {
                evidence: format!(
                    "port ≈ {} (max diff {})",
                    describe_permutation(&perm),
                    num(max)
                ),
                cause: "a missing transpose (or permute) in the port".into(),
                kind: Kind::Transpose,
            });
            return;
        }
    }
}

fn scale(leaf: &Leaf<'_>, sizes: &[(String, usize)], out: &mut Vec<Diagnosis>) {
    if !leaf.enough_evidence() {
        return;
    }
    let (mut pr, mut rr) = (0.0, 0.0);
    for (p, r) in leaf.port.iter().zip(&leaf.reference) {
        if p.is_finite() && r.is_finite() {
            pr += p * r;
            rr += r * r;
        }
    }
    if rr == 0.0 {
        return;
    }
    let c = pr / rr;
    if !c.is_finite() || c == 0.0 {
        return;
    }
    // Snap to a round value when that fits as well: 0.125 reads better than 0.12500003.
    let snapped = [1.0, 2.0, 4.0, 8.0, 16.0, 3.0, 10.0]
        .iter()
        .flat_map(|&v| [v, 1.0 / v, -v, -1.0 / v])
        .find(|v| ((c - v) / v).abs() < 1e-3)
        .unwrap_or(c);
    let candidate: Vec<f64> = leaf.reference.iter().map(|r| snapped * r).collect();
    let rounding: Vec<f64> = leaf.rounding.iter().map(|r| snapped.abs() * r).collect();
    let Some(max) = leaf.explains(&candidate, &rounding) else {
        return;
    };
    let mut hints = Vec::new();
    if (snapped + 1.0).abs() < 1e-9 {
        hints.push("the sign is flipped".to_string());
    }
    // Sizes of this case (dims and fixed axes). Small ones coincide with round factors (√4 = 2)
    // far too often to mean anything; square roots (what attention scales are) are tried first.
    let sizes: Vec<(String, f64)> = sizes
        .iter()
        .filter(|(_, v)| *v >= 8)
        .map(|(n, v)| (n.clone(), *v as f64))
        .collect();
    let close = |value: f64| ((c - value) / value).abs() < 1e-3;
    for (name, d) in &sizes {
        if close(1.0 / d.sqrt()) || close(d.sqrt()) {
            let what = if close(d.sqrt()) { "√" } else { "1/√" };
            hints.push(format!(
                "the factor is {what}{name} ({name} = {d}): an attention scale applied twice or not at all?"
            ));
        }
    }
    if hints.is_empty() {
        for (name, d) in &sizes {
            if close(1.0 / d) || close(*d) {
                let what = if close(*d) { "" } else { "1/" };
                hints.push(format!(
                    "the factor is {what}{name} ({name} = {d}): a scale of 1/{name} where 1/√{name} was meant, or a mean where a sum was meant?"
                ));
            }
        }
    }
    if hints.is_empty() {
        hints.push("a scale factor (a missing or extra 0.5 or 2, an attention scale 1/√d?)".into());
    }
    out.push(Diagnosis {
        evidence: format!(
            "port ≈ {} × reference (max diff {} after scaling)",
            num(snapped),
            num(max)
        ),
        cause: hints.join("; "),
        kind: Kind::Scale,
    });
}

/// Axes along which `d` (of `shape`) is constant within `tol`.
fn constant_axes(d: &[f64], shape: &[usize], tol: &[f64]) -> Vec<usize> {
    let st = strides(shape);
    (0..shape.len())
        .filter(|&axis| shape[axis] > 1)
        .filter(|&axis| {
            (0..d.len()).all(|i| {
                let first = i - ((i / st[axis]) % shape[axis]) * st[axis];
                (d[i] - d[first]).abs() <= tol[i] + tol[first]
            })
        })
        .collect()
}

fn offset(leaf: &Leaf<'_>, out: &mut Vec<Diagnosis>) {
    if !leaf.enough_evidence()
        || leaf.port_shape != leaf.shape
        || leaf
            .port
            .iter()
            .chain(&leaf.reference)
            .any(|v| !v.is_finite())
    {
        return;
    }
    let d: Vec<f64> = leaf
        .port
        .iter()
        .zip(&leaf.reference)
        .map(|(p, r)| p - r)
        .collect();
    let tol: Vec<f64> = (0..d.len())
        .map(|i| {
            rule_allowed(
                leaf.rule,
                leaf.reference[i],
                leaf.rounding.get(i).copied().unwrap_or(0.0),
            )
        })
        .collect();
    let axes = constant_axes(&d, leaf.shape, &tol);
    let varying: Vec<usize> = (0..leaf.shape.len())
        .filter(|a| !axes.contains(a) && leaf.shape[*a] > 1)
        .collect();
    if axes.is_empty() {
        return;
    }
    // The bias: the mean difference over the constant axes, one value per position of the
    // varying ones. It must explain the port everywhere, within the tolerance.
    let st = strides(leaf.shape);
    let position = |i: usize| -> usize {
        varying.iter().fold(0, |acc, &a| {
            acc * leaf.shape[a] + (i / st[a]) % leaf.shape[a]
        })
    };
    let slots: usize = varying.iter().map(|&a| leaf.shape[a]).product();
    let (mut sum, mut count) = (vec![0.0; slots], vec![0usize; slots]);
    for (i, v) in d.iter().enumerate() {
        sum[position(i)] += v;
        count[position(i)] += 1;
    }
    let candidate: Vec<f64> = (0..d.len())
        .map(|i| leaf.reference[i] + sum[position(i)] / count[position(i)] as f64)
        .collect();
    let Some(max) = leaf.explains(&candidate, &leaf.rounding) else {
        return;
    };
    if varying.is_empty() {
        out.push(Diagnosis {
            evidence: format!(
                "port ≈ reference + {} everywhere (max diff {} after adding it)",
                num(sum[0] / count[0] as f64),
                num(max)
            ),
            cause: "a missing or extra constant term (a bias of a single value?)".into(),
            kind: Kind::Offset,
        });
    } else {
        out.push(Diagnosis {
            evidence: format!(
                "port ≈ reference + a bias that is the same along axes {axes:?} and varies only \
                 along axes {varying:?} (sizes {:?}; max diff {} after adding it)",
                varying.iter().map(|&a| leaf.shape[a]).collect::<Vec<_>>(),
                num(max)
            ),
            cause: "a missing or extra bias added along those axes".into(),
            kind: Kind::Offset,
        });
    }
}

/// Axes along which every slice is a distribution: non-negative and summing to 1.
fn distribution_axes(v: &[f64], shape: &[usize]) -> Vec<usize> {
    if v.iter().any(|x| !x.is_finite() || *x < -1e-6) {
        return Vec::new();
    }
    let st = strides(shape);
    (0..shape.len())
        .filter(|&axis| shape[axis] > 1)
        .filter(|&axis| {
            (0..v.len())
                .filter(|i| (i / st[axis]).is_multiple_of(shape[axis]))
                .all(|start| {
                    let sum: f64 = (0..shape[axis]).map(|k| v[start + k * st[axis]]).sum();
                    (sum - 1.0).abs() < 1e-2
                })
        })
        .collect()
}

fn softmax_dim(leaf: &Leaf<'_>, out: &mut Vec<Diagnosis>) {
    if leaf.port_shape != leaf.shape {
        return;
    }
    let port = distribution_axes(&leaf.port, leaf.shape);
    let reference = distribution_axes(&leaf.reference, leaf.shape);
    let port_only: Vec<usize> = port
        .iter()
        .copied()
        .filter(|a| !reference.contains(a))
        .collect();
    let ref_only: Vec<usize> = reference
        .iter()
        .copied()
        .filter(|a| !port.contains(a))
        .collect();
    if let (Some(p), Some(r)) = (port_only.first(), ref_only.first()) {
        out.push(Diagnosis {
            evidence: format!(
                "the port's slices sum to 1 over dim {p}, the reference's over dim {r}"
            ),
            cause: format!("softmax over the wrong dim: use dim {r}"),
            kind: Kind::SoftmaxDim,
        });
    }
}

fn degenerate(leaf: &Leaf<'_>, out: &mut Vec<Diagnosis>) {
    let finite = leaf.port.iter().all(|v| v.is_finite());
    let ref_constant = leaf.reference.windows(2).all(|w| w[0] == w[1]);
    if finite && leaf.port.iter().all(|v| *v == 0.0) && leaf.reference.iter().any(|v| *v != 0.0) {
        out.push(Diagnosis {
            evidence: "the port is all zeros".into(),
            cause: "an activation or mask that zeroes everything, or an output never written"
                .into(),
            kind: Kind::Degenerate,
        });
    } else if finite
        && leaf.port.len() > 1
        && leaf.port.windows(2).all(|w| w[0] == w[1])
        && !ref_constant
    {
        out.push(Diagnosis {
            evidence: format!("the port is constant ({})", num(leaf.port[0])),
            cause: "the input does not reach the output (a broadcast, a mask or a reduction over the wrong axis?)".into(),
            kind: Kind::Degenerate,
        });
    }
}

fn non_finite(leaf: &Leaf<'_>, out: &mut Vec<Diagnosis>) {
    for (what, test) in [
        ("NaN", f64::is_nan as fn(f64) -> bool),
        ("±Inf", f64::is_infinite),
    ] {
        let at: Vec<usize> = (0..leaf.port.len().min(leaf.reference.len()))
            .filter(|&i| test(leaf.port[i]) && leaf.reference[i].is_finite())
            .collect();
        if let Some(&first) = at.first() {
            let st = strides(leaf.port_shape);
            let index: Vec<usize> = (0..st.len())
                .map(|k| (first / st[k]) % leaf.port_shape[k])
                .collect();
            out.push(Diagnosis {
                evidence: format!(
                    "{what} appears in the port at {} elements where the reference is finite (first at {index:?})",
                    at.len()
                ),
                cause: "an overflow (compute in f32 where the reference does?), exp without subtracting \
                        the max, a division by zero or the sqrt/log of a negative"
                    .into(),
                kind: Kind::Observation,
            });
        }
    }
}

/// The diagnoses that fit one leaf. `sizes` are the case's named sizes (its dims and fixed axes),
/// which name the factor of a scale.
pub fn leaf(
    port: &HostTensor,
    reference: &HostTensor,
    rounding: Option<&HostTensor>,
    rule: Rule,
    sizes: &[(String, usize)],
) -> Vec<Diagnosis> {
    let n = reference.numel();
    if port.numel() != n || n == 0 {
        return Vec::new();
    }
    let leaf = Leaf {
        port: port.to_f64(),
        port_shape: &port.shape,
        reference: reference.to_f64(),
        shape: &reference.shape,
        // NaN (no estimate) and −inf (not judged) allow no rounding term here.
        rounding: rounding
            .map(HostTensor::to_f64)
            .filter(|r| r.len() == n)
            .map(|r| {
                r.into_iter()
                    .map(|x| if x.is_finite() { x } else { 0.0 })
                    .collect()
            })
            .unwrap_or_else(|| vec![0.0; n]),
        rule,
    };
    if leaf.port_shape == leaf.shape && within(&leaf.port, &leaf.reference, &leaf.rounding, rule).0
    {
        return Vec::new();
    }
    let mut out = Vec::new();
    non_finite(&leaf, &mut out);
    degenerate(&leaf, &mut out);
    transposes(&leaf, &mut out);
    if leaf.port_shape == leaf.shape {
        scale(&leaf, sizes, &mut out);
        offset(&leaf, &mut out);
        softmax_dim(&leaf, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], v: &[f64]) -> HostTensor {
        HostTensor::from_f64(shape.to_vec(), v)
    }

    fn sizes() -> Vec<(String, usize)> {
        vec![("d".into(), 64), ("t".into(), 8)]
    }

    const RULE: Rule = Rule::Default {
        atol: 1e-5,
        rtol: 1.3e-6,
        factor: 16.0,
    };

    fn diagnose(port: &HostTensor, reference: &HostTensor) -> Vec<String> {
        leaf(port, reference, None, RULE, &sizes())
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn values(n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 37 % 11) as f64 - 5.0) * 0.31 + 0.01 * i as f64)
            .collect()
    }

    #[test]
    fn a_permuted_output_names_the_transpose() {
        let v = values(24);
        let reference = t(&[2, 3, 4], &v);
        let (p, shape) = permute(&v, &[2, 3, 4], &[0, 2, 1]);
        let d = diagnose(&t(&shape, &p), &reference);
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(
            d[0].starts_with("port ≈ reference.transpose(1, 2) (max diff 0)"),
            "{d:?}"
        );
    }

    #[test]
    fn a_square_transpose_is_found_with_equal_shapes() {
        let v = values(16);
        let (p, _) = permute(&v, &[4, 4], &[1, 0]);
        let d = diagnose(&t(&[4, 4], &p), &t(&[4, 4], &v));
        assert!(d.iter().any(|d| d.contains("transpose(0, 1)")), "{d:?}");
    }

    #[test]
    fn a_scale_names_one_over_sqrt_d() {
        let v = values(12);
        let p: Vec<f64> = v.iter().map(|x| x * 0.125).collect();
        let d = diagnose(&t(&[12], &p), &t(&[12], &v));
        assert!(
            d.iter().any(|d| d.contains("port ≈ 0.125 × reference")),
            "{d:?}"
        );
        assert!(
            d.iter().any(|d| d.contains("the factor is 1/√d (d = 64)")),
            "{d:?}"
        );
        // 0.125 is also 1/t with t = 8; the square root is the likelier story and the only one told.
        assert!(!d.iter().any(|d| d.contains("1/t")), "{d:?}");
    }

    #[test]
    fn a_bias_along_the_last_axis_is_named() {
        let v = values(12);
        let bias = [0.5, -0.25, 1.0];
        let p: Vec<f64> = v.iter().enumerate().map(|(i, x)| x + bias[i % 3]).collect();
        let d = diagnose(&t(&[4, 3], &p), &t(&[4, 3], &v));
        assert!(
            d.iter().any(|d| d
                .contains("the same along axes [0] and varies only along axes [1] (sizes [3]")
                && d.contains("bias")),
            "{d:?}"
        );
    }

    #[test]
    fn softmax_over_the_wrong_dim() {
        // 2 x 3: the reference normalises rows (dim 1), the port columns (dim 0).
        let logits = values(6);
        let e: Vec<f64> = logits.iter().map(|x| x.exp()).collect();
        let rows: Vec<f64> = (0..6)
            .map(|i| e[i] / (e[i / 3 * 3] + e[i / 3 * 3 + 1] + e[i / 3 * 3 + 2]))
            .collect();
        let cols: Vec<f64> = (0..6).map(|i| e[i] / (e[i % 3] + e[i % 3 + 3])).collect();
        let d = diagnose(&t(&[2, 3], &cols), &t(&[2, 3], &rows));
        assert!(
            d.iter().any(
                |d| d.contains("sum to 1 over dim 0, the reference's over dim 1")
                    && d.contains("use dim 1")
            ),
            "{d:?}"
        );
    }

    #[test]
    fn zeros_and_nan_are_named() {
        let v = values(6);
        let d = diagnose(&t(&[6], &[0.0; 6]), &t(&[6], &v));
        assert!(
            d.iter().any(|d| d.starts_with("the port is all zeros")),
            "{d:?}"
        );
        let mut nan = v.clone();
        nan[2] = f64::NAN;
        let d = diagnose(&t(&[6], &nan), &t(&[6], &v));
        assert!(d.iter().any(|d| d.contains("NaN appears in the port at 1 elements where the reference is finite (first at [2])")), "{d:?}");
    }

    #[test]
    fn a_match_is_not_diagnosed_and_indistinct_hypotheses_are_not_either() {
        let v = values(24);
        assert!(diagnose(&t(&[2, 3, 4], &v), &t(&[2, 3, 4], &v)).is_empty());
        // Constant along both axes: a transpose cannot be told from no bug; the offset can.
        let flat = vec![1.0; 9];
        let plus: Vec<f64> = flat.iter().map(|x| x + 0.5).collect();
        let d = diagnose(&t(&[3, 3], &plus), &t(&[3, 3], &flat));
        assert!(!d.iter().any(|d| d.contains("transpose")), "{d:?}");
    }
}
