//! Comparing the port's outputs with the reference's, leaf by leaf.
//!
//! Shapes and dtypes first (a shape that is a permutation of the reference's says which axes
//! moved), then values. An element passes when
//!
//! ```text
//! |port − ref| ≤ atol + rtol·|ref| + ROUNDING_FACTOR · rounding
//! ```
//!
//! where `ref` is the reference in the case dtype, `(rtol, atol)` is torch.testing.assert_close's
//! default for the dtype, and `rounding` is the error float arithmetic in this dtype is expected to
//! make *at this element of this computation* (`reference::rounding_estimate`). Well-conditioned elements keep
//! assert_close's tight bound; long reductions at large magnitude (conv, matmul on inputs of ~100)
//! get the slack that float32 really needs there, and nothing else does. This is OpInfo's "the
//! reference was less accurate" fallback made per element and always on. An explicit
//! `tol(atol, rtol)` replaces the whole rule by plain `atol + rtol·|ref|`.
//!
//! NaN matches NaN, ±Inf only the same Inf; integer and bool leaves must be equal. Such a match
//! agrees but compares nothing (a port off by any factor gives the same NaN): [`Values::compared`]
//! counts only the elements finite on both sides, and a leaf that compares none in any case of a
//! check fails it (`run/check.rs`), as a check whose leaves are all empty does.

use crate::describe::layer::Tol;
use crate::describe::numbers::{num, num_pair};
use golden_files::{HostTensor, WireDType};
use std::fmt;

/// How many times the estimated rounding error of an element the port may be off by.
///
/// Calibrated on the zoo with 400 cases per layer (the book's docs/src/tolerances.md, "How close is close enough"): a correct
/// port's error is a few times PyTorch's (candle's gemm rounds about twice as much as PyTorch's),
/// and the worst of 10^5–10^6 elements sits 4–5 standard deviations out; the correct ports needed
/// at most 7.5. The wrong ports of the test-suite need hundreds to millions.
pub const ROUNDING_FACTOR: f64 = 16.0;

/// The same for gradients (the gradient check against PyTorch's float64 autograd, with the
/// estimate of PyTorch's own float32 error). A gradient is a longer computation (forward and
/// backward), and candle's backward algorithms differ more from PyTorch's than its forward ones:
/// over 200 cases × 4 seeds per zoo layer the correct ports needed up to 28.5 (causal attention
/// with a head size of 1 on repeated values, where scores tie and the softmax's rounding decides),
/// most under 5; 64 leaves 2.2× headroom. The wrong gradients of `zoo/tests/gradients.rs` need
/// thousands.
pub const GRADIENT_ROUNDING_FACTOR: f64 = 64.0;

/// How many times the reference's own RMS error against the float64 result a port's may be in
/// f16/bf16 ([`Accuracy`]). The accuracy minifier allows 3 in low precision.
pub const ACCURACY_FACTOR: f64 = 3.0;

/// torch.testing.assert_close's default `(rtol, atol)` for a dtype; exact for integers and bools.
pub fn assert_close_defaults(dtype: WireDType) -> (f64, f64) {
    match dtype {
        WireDType::F16 => (1e-3, 1e-5),
        WireDType::BF16 => (1.6e-2, 1e-5),
        WireDType::F32 => (1.3e-6, 1e-5),
        WireDType::F64 => (1e-7, 1e-7),
        _ => (0.0, 0.0),
    }
}

/// The tolerance applied to one leaf.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// golden's default: assert_close's bound plus a multiple of the estimated rounding error.
    Default {
        /// Absolute part.
        atol: f64,
        /// Relative part.
        rtol: f64,
        /// Multiple of the rounding estimate (`ROUNDING_FACTOR`); 0 when no estimate exists.
        factor: f64,
    },
    /// An explicit `tol(atol, rtol)`.
    Explicit(Tol),
    /// Integers and bools: equal.
    Exact,
}

impl Rule {
    /// The rule for a leaf of this dtype, given the layer's explicit tolerance if any, and the
    /// multiple of the rounding estimate allowed ([`ROUNDING_FACTOR`], or
    /// [`GRADIENT_ROUNDING_FACTOR`] for gradients).
    pub fn for_leaf(dtype: WireDType, explicit: Option<Tol>, factor: f64) -> Rule {
        if !dtype.is_float() {
            return Rule::Exact;
        }
        if let Some(tol) = explicit {
            return Rule::Explicit(tol);
        }
        let (rtol, atol) = assert_close_defaults(dtype);
        Rule::Default { atol, rtol, factor }
    }

    /// Whether `value` is within the rule of `reference`, element by element as a comparison
    /// judges it without a rounding estimate: non-finite values only equal to the same (NaN to
    /// NaN), finite ones within `atol + rtol·|reference|` (exactly equal under [`Rule::Exact`]).
    pub fn admits(&self, reference: f64, value: f64) -> bool {
        if !(value.is_finite() && reference.is_finite()) {
            return (value.is_nan() && reference.is_nan()) || value == reference;
        }
        (value - reference).abs() <= self.allowed(reference, 0.0)
    }

    /// The error allowed at an element whose reference value is `reference` and whose rounding
    /// estimate is `rounding`.
    pub fn allowed(&self, reference: f64, rounding: f64) -> f64 {
        match *self {
            Rule::Default { atol, rtol, factor } => {
                atol + rtol * reference.abs() + factor * rounding
            }
            Rule::Explicit(Tol { atol, rtol }) => atol + rtol * reference.abs(),
            Rule::Exact => 0.0,
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Default { atol, rtol, factor } => write!(
                f,
                "atol {} + rtol {}·|ref| + {} × rounding estimate",
                num(*atol),
                num(*rtol),
                num(*factor)
            ),
            Rule::Explicit(Tol { atol, rtol }) => {
                write!(
                    f,
                    "explicit: atol {} + rtol {}·|ref|",
                    num(*atol),
                    num(*rtol)
                )
            }
            Rule::Exact => f.write_str("exact"),
        }
    }
}

/// One element singled out by a report.
#[derive(Clone, Debug, PartialEq)]
pub struct Element {
    /// Its multi-index.
    pub index: Vec<usize>,
    /// The port's value.
    pub port: f64,
    /// The reference's value.
    pub reference: f64,
    /// `|port − reference|`.
    pub diff: f64,
    /// What the rule allowed there.
    pub allowed: f64,
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (port, reference) = num_pair(self.port, self.reference);
        write!(
            f,
            "at {:?}: port {port}, reference {reference} (allowed {})",
            self.index,
            num(self.allowed)
        )
    }
}

/// Statistics of a value comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Values {
    /// The rule applied.
    pub rule: Rule,
    /// Elements in the leaf.
    pub numel: usize,
    /// Elements that said something about the port: finite on both sides and judged (every
    /// element of an integer leaf). NaN against NaN, the same ±Inf on both sides and the elements
    /// left out ([`Values::unreliable`]) compare nothing.
    pub compared: usize,
    /// Elements NaN on both sides, or the same ±Inf on both: they agree, and a port off by any
    /// factor there would agree as well.
    pub nonfinite_agreed: usize,
    /// Elements outside the tolerance.
    pub mismatched: usize,
    /// Greatest `|port − ref|` over finite pairs, with its element.
    pub greatest_abs: Option<Element>,
    /// Greatest `|port − ref| / |ref|`, with its element (infinite where ref is 0).
    pub greatest_rel: Option<(f64, Element)>,
    /// The element furthest outside (or closest to) its tolerance.
    pub worst: Option<Element>,
    /// Greatest `|port − ref| / allowed`: below 1 everywhere means the leaf passes.
    pub worst_ratio: f64,
    /// First element that is NaN or ±Inf on one side but not the same on the other.
    pub first_nonfinite_mismatch: Option<Element>,
    /// NaN count in the port / reference.
    pub nan: (usize, usize),
    /// ±Inf count in the port / reference.
    pub inf: (usize, usize),
    /// Largest rounding estimate in the leaf (None: no float64 evaluation was available).
    pub rounding_max: Option<f64>,
    /// The smallest rounding factor for which every finite element would pass (0 when assert_close's
    /// bound alone suffices): what calibrates [`ROUNDING_FACTOR`].
    pub factor_needed: f64,
    /// How the elements' `|port − ref| / allowed` spread: see [`ErrorHistogram`].
    pub histogram: ErrorHistogram,
    /// Elements without a rounding estimate because the reference in float64 is not the same
    /// computation there (`answers/live.rs`): the plain bound applied.
    pub unexplained: usize,
    /// Elements where the reference is NaN or ±Inf and its float64 run does not explain it (an
    /// overflow, a division by zero in the case dtype): the check cannot judge the port there,
    /// and counts them as mismatched whatever the port gives — a NaN is never agreement there.
    pub unjudged: usize,
    /// Elements left out: the reference's own result is unreliable there in the case dtype (its
    /// estimate is −inf, `answers/live.rs`); the port is not judged there (unless it gives NaN or
    /// ±Inf where the reference is finite).
    pub unreliable: usize,
    /// f16/bf16: the port's accuracy against the float64 result, next to the reference's own.
    pub accuracy: Option<Accuracy>,
}

/// How accurate the port is in a low-precision dtype, judged by what the reference achieves: the
/// RMS of `port − float64 result` against the RMS of `reference − float64 result` (PyTorch
/// OpInfo's and the accuracy minifier's rule). assert_close's bf16 rtol of 1.6e-2 hides a port
/// that computes a norm's variance in bf16 where the reference upcasts to float32; this does not.
///
/// Per class of error: the elements' own errors, and for each axis of four or more elements the
/// error its slices share — the part of `port − float64` that is a scale and an offset per slice
/// (a least-squares fit of `α·result + β` in each slice). A reference that computes in float32 and
/// rounds once has errors independent from element to element, of which such a fit keeps a
/// `√(2/n)` share; a reduction computed in low precision (a norm's variance, a softmax's sum, a
/// mean) errs by a factor common to its slice, all of which the fit keeps. So the class along the
/// reduced axis judges that mistake `√(n/2)` times more sharply than the elements' RMS, where it
/// sat at the rule's edge. Over few slices the fit's energy is a noisy sample, so that class's
/// allowance grows by what chance gives one time in a thousand (`chi_square_tail`): a port
/// merely as inaccurate as candle's bf16 `Linear` (two roundings where PyTorch has one) must not
/// alarm there. The worst class decides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Accuracy {
    /// The port's RMS error against the float64 result over the elements (whatever the class).
    pub rms: f64,
    /// The port's RMS error against the float64 result, in the worst class.
    pub port: f64,
    /// The reference's (in the case dtype) in that class, or what its rounding gives there if
    /// larger, times the slack a class of few slices gets (see [`Accuracy::ratio`]).
    pub reference: f64,
    /// `port / max(reference, half an ulp of the result's RMS)` in the worst class.
    pub ratio: f64,
    /// The worst class: `None` for the elements' own errors, `Some(axis)` for the error shared
    /// by the slices along that axis.
    pub axis: Option<usize>,
}

impl Accuracy {
    /// Whether the port is within [`ACCURACY_FACTOR`] of the reference's own accuracy.
    pub fn passes(&self) -> bool {
        self.ratio <= ACCURACY_FACTOR
    }
}

/// Counts of elements by `|port − ref| / allowed`, in powers of two: `exact` for 0, then bin `k`
/// for `[2^(LOWEST + k), 2^(LOWEST + k + 1))`, the first and last bins taking everything beyond.
/// Non-finite pairs are not counted (the NaN/Inf counts say what they are).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ErrorHistogram {
    /// Elements equal on both sides.
    pub exact: u64,
    /// Counts per power of two, from `2^LOWEST`.
    pub counts: Vec<u64>,
}

impl ErrorHistogram {
    /// The exponent of the first bin.
    pub const LOWEST: i32 = -32;
    /// Number of bins: up to `2^8` (256× outside the tolerance) and beyond.
    pub const BINS: usize = 41;

    fn add(&mut self, ratio: f64) {
        if ratio == 0.0 {
            self.exact += 1;
            return;
        }
        if self.counts.is_empty() {
            self.counts = vec![0; Self::BINS];
        }
        // floor(log2(ratio)) from the exponent bits (subnormals land in the first bin).
        let exponent = ((ratio.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let bin = (exponent - Self::LOWEST).clamp(0, Self::BINS as i32 - 1) as usize;
        self.counts[bin] += 1;
    }

    /// Add another histogram's counts.
    pub fn merge(&mut self, other: &ErrorHistogram) {
        self.exact += other.exact;
        if self.counts.is_empty() {
            self.counts = vec![0; Self::BINS];
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }
}

/// What comparing one leaf found.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Values were compared (`mismatched == 0` means the leaf passes).
    Values(Box<Values>),
    /// The shapes differ.
    Shape {
        /// What the shapes suggest.
        hint: String,
    },
    /// Float against integer, or two different float dtypes.
    DType,
    /// The reference has this leaf, the port does not.
    MissingInPort,
    /// The port has this leaf, the reference does not.
    MissingInReference,
}

/// One leaf's comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Leaf {
    /// `out`, `out.0`, `out.logits`, ...
    pub name: String,
    /// Port's shape and dtype (None when missing).
    pub port: Option<(Vec<usize>, WireDType)>,
    /// Reference's shape and dtype (None when missing).
    pub reference: Option<(Vec<usize>, WireDType)>,
    /// The finding.
    pub verdict: Verdict,
}

impl Leaf {
    /// Whether the leaf matches.
    pub fn passes(&self) -> bool {
        matches!(&self.verdict, Verdict::Values(v)
            if v.mismatched == 0 && v.accuracy.is_none_or(|a| a.passes()))
    }
}

/// The reference's side of one leaf: its output in the case dtype and, when the reference could run
/// in float64, the per-element rounding estimate (see `reference::rounding_estimate`).
pub struct Expected<'a> {
    /// Output in the case dtype.
    pub value: &'a HostTensor,
    /// The error float arithmetic in the case dtype is expected to make at each element (NaN:
    /// none there, the float64 run not being the same computation).
    pub rounding: Option<&'a HostTensor>,
    /// The float64 result, where kept: f16/bf16 leaves are also judged by [`Accuracy`].
    pub precise: Option<&'a HostTensor>,
}

/// Compare every leaf; leaves only one side has are reported as missing.
pub fn compare_all(
    port: &[(String, HostTensor)],
    reference: &[(String, Expected<'_>)],
    explicit: Option<Tol>,
    factor: f64,
) -> Vec<Leaf> {
    let mut out = Vec::new();
    for (name, expected) in reference {
        let leaf = match port.iter().find(|(n, _)| n == name) {
            Some((_, actual)) => compare_leaf(name, actual, expected, explicit, factor),
            None => Leaf {
                name: name.clone(),
                port: None,
                reference: Some((expected.value.shape.clone(), expected.value.dtype)),
                verdict: Verdict::MissingInPort,
            },
        };
        out.push(leaf);
    }
    for (name, actual) in port {
        if !reference.iter().any(|(n, _)| n == name) {
            out.push(Leaf {
                name: name.clone(),
                port: Some((actual.shape.clone(), actual.dtype)),
                reference: None,
                verdict: Verdict::MissingInReference,
            });
        }
    }
    out
}

/// Compare one leaf.
pub fn compare_leaf(
    name: &str,
    port: &HostTensor,
    expected: &Expected<'_>,
    explicit: Option<Tol>,
    factor: f64,
) -> Leaf {
    let reference = expected.value;
    let leaf = |verdict| Leaf {
        name: name.to_string(),
        port: Some((port.shape.clone(), port.dtype)),
        reference: Some((reference.shape.clone(), reference.dtype)),
        verdict,
    };
    if port.shape != reference.shape {
        return leaf(Verdict::Shape {
            hint: shape_hint(&port.shape, &reference.shape),
        });
    }
    let dtype_clash = port.dtype.is_float() != reference.dtype.is_float()
        || (port.dtype.is_float() && port.dtype != reference.dtype);
    if dtype_clash {
        return leaf(Verdict::DType);
    }
    let rule = Rule::for_leaf(reference.dtype, explicit, factor);
    leaf(Verdict::Values(Box::new(compare_values(
        port, expected, rule,
    ))))
}

/// The multi-index of flat (row-major) index `flat` in `shape`.
pub fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (axis, &size) in shape.iter().enumerate().rev() {
        if size > 0 {
            index[axis] = flat % size;
            flat /= size;
        }
    }
    index
}

fn compare_values(port: &HostTensor, expected: &Expected<'_>, rule: Rule) -> Values {
    let shape = &port.shape;
    if rule == Rule::Exact {
        // Compare integers as integers (i64 beyond 2^53 would lose digits as f64).
        let (a, e) = (port.to_i64(), expected.value.to_i64());
        let mismatch = a.iter().zip(&e).filter(|(x, y)| x != y).count();
        let first = a.iter().zip(&e).position(|(x, y)| x != y);
        let element = first.map(|i| Element {
            index: unravel(i, shape),
            port: a[i] as f64,
            reference: e[i] as f64,
            diff: (a[i] as f64 - e[i] as f64).abs(),
            allowed: 0.0,
        });
        return Values {
            rule,
            numel: a.len(),
            compared: a.len(),
            nonfinite_agreed: 0,
            mismatched: mismatch,
            greatest_abs: element.clone(),
            greatest_rel: None,
            worst: element,
            worst_ratio: if mismatch > 0 { f64::INFINITY } else { 0.0 },
            first_nonfinite_mismatch: None,
            nan: (0, 0),
            inf: (0, 0),
            rounding_max: None,
            factor_needed: 0.0,
            histogram: ErrorHistogram::default(),
            unexplained: 0,
            unjudged: 0,
            unreliable: 0,
            accuracy: None,
        };
    }
    let numel = port.numel();
    let noise = expected
        .rounding
        .filter(|r| r.numel() == numel && r.dtype.is_float());
    // Large leaves are scanned by several threads, each over a contiguous range, merged in order.
    let threads = if numel >= 1 << 18 {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
    } else {
        1
    };
    let per = numel.div_ceil(threads.max(1)).max(1);
    let scan = if threads > 1 {
        std::thread::scope(|s| {
            let parts: Vec<_> = (0..numel)
                .step_by(per)
                .map(|lo| {
                    let hi = (lo + per).min(numel);
                    s.spawn(move || Scan::range(port, expected.value, noise, rule, lo..hi))
                })
                .collect();
            parts
                .into_iter()
                .map(|p| p.join().expect("a comparison thread panicked"))
                .fold(Scan::default(), Scan::then)
        })
    } else {
        Scan::range(port, expected.value, noise, rule, 0..numel)
    };

    let element = |i: usize| {
        let (x, r) = (port.f64_at(i), expected.value.f64_at(i));
        // NaN: no estimate at this element (see `Scan::element`).
        let rounding = noise.map_or(0.0, |n| n.f64_at(i));
        // NaN (no estimate) and −inf (not judged) allow no rounding term.
        let rounding = if rounding.is_finite() { rounding } else { 0.0 };
        let finite = x.is_finite() && r.is_finite();
        Element {
            index: unravel(i, shape),
            port: x,
            reference: r,
            diff: if finite { (x - r).abs() } else { f64::INFINITY },
            allowed: if finite {
                rule.allowed(r, rounding)
            } else {
                0.0
            },
        }
    };
    let worst_ratio = match (scan.worst, scan.first_nonfinite) {
        (_, Some(_)) => f64::INFINITY,
        (Some((ratio, _)), None) => ratio,
        (None, None) => 0.0,
    };
    let rule = match rule {
        // Without a float64 evaluation the rule is assert_close's alone.
        Rule::Default { atol, rtol, .. } if noise.is_none() => Rule::Default {
            atol,
            rtol,
            factor: 0.0,
        },
        other => other,
    };
    let low_precision = matches!(expected.value.dtype, WireDType::F16 | WireDType::BF16);
    let accuracy = match (expected.precise, rule) {
        (Some(h), Rule::Default { .. }) if low_precision && h.numel() == numel => {
            accuracy(port, expected.value, h)
        }
        _ => None,
    };
    Values {
        rule,
        numel,
        compared: scan.compared,
        nonfinite_agreed: scan.nonfinite_agreed,
        mismatched: scan.mismatched,
        greatest_abs: scan.greatest_abs.map(|(_, i)| element(i)),
        greatest_rel: scan.greatest_rel.map(|(rel, i)| (rel, element(i))),
        worst: scan.worst.map(|(_, i)| element(i)),
        worst_ratio,
        first_nonfinite_mismatch: scan.first_nonfinite.map(element),
        nan: scan.nan,
        inf: scan.inf,
        rounding_max: noise.map(|_| scan.rounding_max),
        factor_needed: scan.factor_needed,
        histogram: scan.histogram,
        unexplained: scan.unexplained - scan.unjudged,
        unjudged: scan.unjudged,
        unreliable: scan.unreliable,
        accuracy,
    }
}

/// The port's accuracy against the float64 result next to the reference's, per class of error
/// ([`Accuracy`]), over the elements finite on every side; the worst class.
fn accuracy(port: &HostTensor, reference: &HostTensor, precise: &HostTensor) -> Option<Accuracy> {
    let (p, r, h) = (port.to_f64(), reference.to_f64(), precise.to_f64());
    let finite = |i: usize| p[i].is_finite() && r[i].is_finite() && h[i].is_finite();
    let (mut port_sq, mut ref_sq, mut h_sq, mut n) = (0.0, 0.0, 0.0, 0usize);
    for i in 0..h.len() {
        if finite(i) {
            port_sq += (p[i] - h[i]) * (p[i] - h[i]);
            ref_sq += (r[i] - h[i]) * (r[i] - h[i]);
            h_sq += h[i] * h[i];
            n += 1;
        }
    }
    if n == 0 {
        return None;
    }
    let rms = |sq: f64| (sq / n as f64).sqrt();
    let unit = match reference.dtype {
        WireDType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-8),
    };
    let floor = 0.5 * unit * rms(h_sq);
    let ratio = |port: f64, reference: f64| {
        if port == 0.0 {
            0.0
        } else {
            port / reference.max(f64::MIN_POSITIVE)
        }
    };
    let own = rms(ref_sq).max(floor);
    let mut worst = Accuracy {
        rms: rms(port_sq),
        port: rms(port_sq),
        reference: rms(ref_sq),
        ratio: ratio(rms(port_sq), own),
        axis: None,
    };
    let shape = &port.shape;
    for (axis, &len) in shape.iter().enumerate() {
        if len < 4 {
            continue;
        }
        let inner: usize = shape[axis + 1..].iter().product();
        let outer: usize = shape[..axis].iter().product();
        let (mut shared_port, mut shared_ref, mut count) = (0.0, 0.0, 0usize);
        for o in 0..outer {
            for i in 0..inner {
                let at = |k: usize| (o * len + k) * inner + i;
                if !(0..len).all(|k| finite(at(k))) {
                    continue;
                }
                shared_port += shared_energy(len, |k| (h[at(k)], p[at(k)] - h[at(k)]));
                shared_ref += shared_energy(len, |k| (h[at(k)], r[at(k)] - h[at(k)]));
                count += len;
            }
        }
        if count == 0 {
            continue;
        }
        let (shared_port, shared_ref) = (
            (shared_port / count as f64).sqrt(),
            (shared_ref / count as f64).sqrt(),
        );
        // What independent errors of the reference's size leave in a fit of two parameters.
        let independent = (2.0 / len as f64).sqrt() * own;
        // Two numbers fitted per slice: over few slices their energy is a noisy sample (a
        // chi-square of 2 per slice degrees of freedom), which by chance alone can reach a few
        // times its mean. The allowance grows by the ratio that sample reaches one time in a
        // thousand, so that the class alarms no more often than the elements' RMS does.
        let slack = chi_square_tail(2 * (count / len));
        let r = ratio(shared_port, shared_ref.max(independent) * slack);
        if r > worst.ratio {
            worst = Accuracy {
                rms: rms(port_sq),
                port: shared_port,
                reference: shared_ref.max(independent) * slack,
                ratio: r,
                axis: Some(axis),
            };
        }
    }
    Some(worst)
}

/// `√(χ²/k)` at the upper 0.1 % quantile of a chi-square of `k` degrees of freedom (Wilson and
/// Hilferty's approximation): how far the RMS of `k` independent normal samples gets above its
/// mean one time in a thousand — 2.7 for 2, 1.6 for 16, 1.3 for 64, towards 1.
fn chi_square_tail(k: usize) -> f64 {
    if k == 0 {
        return 1.0;
    }
    let k = k as f64;
    let z = 3.09;
    let c = 2.0 / (9.0 * k);
    let q = k * (1.0 - c + z * c.sqrt()).powi(3);
    (q / k).sqrt()
}

/// The energy (sum of squares) of the least-squares fit `α·result + β` to the errors of one slice
/// of `len` elements, `(result, error)` at each: the scale and the offset the slice's errors share.
fn shared_energy(len: usize, at: impl Fn(usize) -> (f64, f64)) -> f64 {
    let n = len as f64;
    let (mut h_sum, mut e_sum) = (0.0, 0.0);
    for k in 0..len {
        let (h, e) = at(k);
        h_sum += h;
        e_sum += e;
    }
    let (h_mean, e_mean) = (h_sum / n, e_sum / n);
    let (mut hh, mut he) = (0.0, 0.0);
    for k in 0..len {
        let (h, e) = at(k);
        hh += (h - h_mean) * (h - h_mean);
        he += (h - h_mean) * e;
    }
    // The fit is `e_mean + α·(h − h_mean)`: its energy n·e_mean² + α²·Σ(h − h_mean)².
    let scale = if hh > 0.0 { he * he / hh } else { 0.0 };
    n * e_mean * e_mean + scale
}

/// What a scan over a range of elements found. Ranges merge in order: on ties the earlier element
/// is kept, as a single scan would.
#[derive(Clone, Default)]
struct Scan {
    mismatched: usize,
    /// Finite pairs judged.
    compared: usize,
    /// NaN on both sides, or the same ±Inf.
    nonfinite_agreed: usize,
    nan: (usize, usize),
    inf: (usize, usize),
    first_nonfinite: Option<usize>,
    /// (|port − ref| / allowed, index) over finite pairs.
    worst: Option<(f64, usize)>,
    greatest_abs: Option<(f64, usize)>,
    greatest_rel: Option<(f64, usize)>,
    factor_needed: f64,
    rounding_max: f64,
    histogram: ErrorHistogram,
    unexplained: usize,
    unjudged: usize,
    unreliable: usize,
}

/// Keep `candidate` if it is strictly greater (the earlier element wins ties).
fn keep_greater(current: &mut Option<(f64, usize)>, candidate: Option<(f64, usize)>) {
    if let Some((value, _)) = candidate {
        if current.is_none_or(|(best, _)| value > best) {
            *current = candidate;
        }
    }
}

impl Scan {
    /// Scan `range`, decoding it chunk by chunk into buffers on the stack.
    fn range(
        port: &HostTensor,
        reference: &HostTensor,
        noise: Option<&HostTensor>,
        rule: Rule,
        range: std::ops::Range<usize>,
    ) -> Scan {
        const CHUNK: usize = 1024;
        let mut scan = Scan::default();
        let (mut a, mut e, mut n) = ([0.0; CHUNK], [0.0; CHUNK], [0.0; CHUNK]);
        let mut start = range.start;
        while start < range.end {
            let len = CHUNK.min(range.end - start);
            port.read_f64_into(start, &mut a[..len]);
            reference.read_f64_into(start, &mut e[..len]);
            if let Some(noise) = noise {
                noise.read_f64_into(start, &mut n[..len]);
            }
            for k in 0..len {
                scan.element(start + k, a[k], e[k], n[k], rule);
            }
            start += len;
        }
        scan
    }

    #[inline]
    fn element(&mut self, i: usize, x: f64, r: f64, rounding: f64, rule: Rule) {
        // NaN: no estimate here (not the same computation in float64); the plain bound applies.
        // At a non-finite reference value it says the float64 run does not explain it: the check
        // cannot judge the port there, and does not take a match for agreement.
        let unjudged = rounding.is_nan() && !r.is_finite();
        // −inf: the reference's own result is unreliable here; a finite port value is not judged.
        if rounding == f64::NEG_INFINITY {
            self.unreliable += 1;
            if x.is_finite() {
                return;
            }
        }
        let rounding = if rounding == f64::NEG_INFINITY {
            0.0
        } else {
            rounding
        };
        let rounding = if rounding.is_nan() {
            self.unexplained += 1;
            0.0
        } else {
            rounding
        };
        self.rounding_max = self.rounding_max.max(rounding);
        if !(x.is_finite() && r.is_finite()) {
            self.nan.0 += x.is_nan() as usize;
            self.nan.1 += r.is_nan() as usize;
            self.inf.0 += x.is_infinite() as usize;
            self.inf.1 += r.is_infinite() as usize;
            self.unjudged += unjudged as usize;
            let same = ((x.is_nan() && r.is_nan()) || x == r) && !unjudged;
            if same {
                self.nonfinite_agreed += 1;
            } else {
                self.mismatched += 1;
                self.first_nonfinite.get_or_insert(i);
            }
            return;
        }
        self.compared += 1;
        let diff = (x - r).abs();
        let plain = rule.allowed(r, 0.0);
        let allowed = rule.allowed(r, rounding);
        let excess = diff - plain;
        if excess > 0.0 {
            let needed = if rounding > 0.0 {
                excess / rounding
            } else {
                f64::INFINITY
            };
            self.factor_needed = self.factor_needed.max(needed);
        }
        let ratio = if allowed > 0.0 {
            diff / allowed
        } else if diff > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        self.mismatched += (ratio > 1.0) as usize;
        self.histogram.add(ratio);
        keep_greater(&mut self.worst, Some((ratio, i)));
        keep_greater(&mut self.greatest_abs, Some((diff, i)));
        let rel = if r != 0.0 {
            diff / r.abs()
        } else if diff > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        keep_greater(&mut self.greatest_rel, Some((rel, i)));
    }

    /// This range's findings followed by the next range's.
    fn then(mut self, next: Scan) -> Scan {
        self.mismatched += next.mismatched;
        self.compared += next.compared;
        self.nonfinite_agreed += next.nonfinite_agreed;
        self.nan = (self.nan.0 + next.nan.0, self.nan.1 + next.nan.1);
        self.inf = (self.inf.0 + next.inf.0, self.inf.1 + next.inf.1);
        self.first_nonfinite = self.first_nonfinite.or(next.first_nonfinite);
        keep_greater(&mut self.worst, next.worst);
        keep_greater(&mut self.greatest_abs, next.greatest_abs);
        keep_greater(&mut self.greatest_rel, next.greatest_rel);
        self.factor_needed = self.factor_needed.max(next.factor_needed);
        self.unexplained += next.unexplained;
        self.unjudged += next.unjudged;
        self.unreliable += next.unreliable;
        self.rounding_max = self.rounding_max.max(next.rounding_max);
        self.histogram.merge(&next.histogram);
        self
    }
}

/// What two different shapes suggest.
pub fn shape_hint(port: &[usize], reference: &[usize]) -> String {
    let numel = |s: &[usize]| s.iter().product::<usize>();
    let mut sp = port.to_vec();
    let mut sr = reference.to_vec();
    sp.sort_unstable();
    sr.sort_unstable();
    if port.len() == reference.len() && sp == sr {
        let moved: Vec<usize> = (0..port.len())
            .filter(|&i| port[i] != reference[i])
            .collect();
        if moved.len() == 2 {
            return format!(
                "the reference's shape with axes {} and {} swapped: a missing `.transpose({}, {})`?",
                moved[0], moved[1], moved[0], moved[1]
            );
        }
        // Which reference axis each port axis came from (first unused axis of that size).
        let mut used = vec![false; reference.len()];
        let order: Vec<usize> = port
            .iter()
            .map(|d| {
                let j = (0..reference.len())
                    .find(|&j| !used[j] && reference[j] == *d)
                    .expect("same multiset of sizes");
                used[j] = true;
                j
            })
            .collect();
        return format!("a permutation of the reference's axes: a missing `.permute({order:?})`?");
    }
    if numel(port) == numel(reference) {
        return format!(
            "same number of elements ({}) in another shape: a reshape/view in the wrong order, or a \
             missing squeeze/unsqueeze?",
            numel(port)
        );
    }
    format!(
        "different number of elements ({} in the port, {} in the reference)",
        numel(port),
        numel(reference)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_split_over_threads_finds_what_one_scan_finds() {
        // Large enough for several threads; the findings sit in different ranges, and two
        // elements tie for the greatest difference: the earlier one must be reported.
        let n = 600_000;
        let reference: Vec<f64> = (0..n).map(|i| (i % 7) as f64 - 3.0).collect();
        let mut port = reference.clone();
        port[5] += 1e-7; // within tolerance
        port[150_001] += 0.5;
        port[450_000] += 0.5;
        port[599_999] = f64::NAN;
        let (p, r) = (
            HostTensor::from_f64(vec![n], &port),
            HostTensor::from_f64(vec![n], &reference),
        );
        let expected = Expected {
            value: &r,
            rounding: None,
            precise: None,
        };
        let v = compare_values(&p, &expected, Rule::for_leaf(WireDType::F64, None, 16.0));
        assert_eq!(v.mismatched, 3);
        assert_eq!(v.nan, (1, 0));
        assert_eq!(v.greatest_abs.unwrap().index, vec![150_001]);
        assert_eq!(v.worst.unwrap().index, vec![150_001]);
        assert_eq!(v.first_nonfinite_mismatch.unwrap().index, vec![599_999]);
        assert_eq!(v.worst_ratio, f64::INFINITY);
        // Every finite pair is in the histogram: 3 beyond the tolerance, the rest exact or not.
        let h = &v.histogram;
        assert_eq!(h.exact + h.counts.iter().sum::<u64>(), n as u64 - 1);
        assert_eq!(h.exact, n as u64 - 4);
        let above: u64 = h.counts[(0 - ErrorHistogram::LOWEST) as usize..]
            .iter()
            .sum();
        assert_eq!(above, 2);
        // No float64 evaluation: the rule reported is assert_close's alone.
        assert!(matches!(v.rule, Rule::Default { factor, .. } if factor == 0.0));
    }

    fn t(shape: &[usize], v: &[f64], dtype: WireDType) -> HostTensor {
        let f = HostTensor::from_f64(shape.to_vec(), v);
        match dtype {
            WireDType::F64 => f,
            WireDType::F32 => HostTensor {
                dtype,
                shape: f.shape.clone(),
                data: v
                    .iter()
                    .flat_map(|x| (*x as f32).to_le_bytes())
                    .collect::<Vec<u8>>()
                    .into(),
            },
            WireDType::I64 => HostTensor {
                dtype,
                shape: f.shape.clone(),
                data: v
                    .iter()
                    .flat_map(|x| (*x as i64).to_le_bytes())
                    .collect::<Vec<u8>>()
                    .into(),
            },
            _ => unimplemented!(),
        }
    }

    fn expected(value: &HostTensor) -> Expected<'_> {
        Expected {
            value,
            rounding: None,
            precise: None,
        }
    }

    #[test]
    fn torch_example_message_numbers() {
        // assert_close's doc example: 2 of 3 elements differ, greatest abs diff 2.0 at (1,).
        let port = t(&[3], &[1.0, 4.0, 5.0], WireDType::F32);
        let reference = t(&[3], &[1.0, 2.0, 3.0], WireDType::F32);
        let leaf = compare_leaf("out", &port, &expected(&reference), None, ROUNDING_FACTOR);
        let Verdict::Values(v) = leaf.verdict else {
            panic!()
        };
        assert_eq!(v.mismatched, 2);
        let g = v.greatest_abs.unwrap();
        assert_eq!((g.index, g.diff), (vec![1], 2.0));
        assert_eq!(v.greatest_rel.unwrap().1.index, vec![1]);
        // No float64 evaluation: the rule is plain assert_close.
        assert_eq!(
            v.rule,
            Rule::Default {
                atol: 1e-5,
                rtol: 1.3e-6,
                factor: 0.0
            }
        );
    }

    #[test]
    fn rounding_estimate_widens_only_where_it_is_large() {
        let port = t(&[2], &[1000.001, 1.001], WireDType::F32);
        let reference = t(&[2], &[1000.0, 1.0], WireDType::F32);
        let rounding = HostTensor::from_f64(vec![2], &[2e-4, 1e-8]);
        let e = Expected {
            value: &reference,
            rounding: Some(&rounding),
            precise: None,
        };
        let Verdict::Values(v) = compare_leaf("out", &port, &e, None, ROUNDING_FACTOR).verdict
        else {
            panic!()
        };
        // Element 0 is 1e-3 off where rounding explains 2e-4: within 16 × that. Element 1 is 1e-3
        // off where rounding explains 1e-8: a real difference.
        assert_eq!(v.mismatched, 1);
        assert_eq!(v.worst.unwrap().index, vec![1]);
        assert!(v.factor_needed > 9e4, "{}", v.factor_needed);
    }

    #[test]
    fn nan_matches_nan_and_inf_only_itself() {
        let port = t(&[3], &[f64::NAN, f64::INFINITY, 1.0], WireDType::F64);
        let same = t(&[3], &[f64::NAN, f64::INFINITY, 1.0], WireDType::F64);
        let other = t(&[3], &[0.0, f64::NEG_INFINITY, 1.0], WireDType::F64);
        let pass = compare_leaf("out", &port, &expected(&same), None, ROUNDING_FACTOR);
        assert!(pass.passes());
        // The NaN and the Inf agree, and compare nothing: one element was compared.
        let Verdict::Values(v) = &pass.verdict else {
            panic!()
        };
        assert_eq!((v.compared, v.nonfinite_agreed), (1, 2));
        let Verdict::Values(v) =
            compare_leaf("out", &port, &expected(&other), None, ROUNDING_FACTOR).verdict
        else {
            panic!()
        };
        assert_eq!(v.mismatched, 2);
        assert_eq!(v.nan, (1, 0));
        assert_eq!(v.first_nonfinite_mismatch.unwrap().index, vec![0]);
    }

    #[test]
    fn one_element_is_admitted_as_a_scan_judges_it() {
        let values = [
            0.0,
            1.0,
            -2.5,
            1e-3,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        let nudges = [0.0, 5e-6, 2e-5, 1.0, f64::NAN, f64::INFINITY];
        for rule in [
            Rule::for_leaf(WireDType::F32, None, 0.0),
            Rule::Explicit(Tol {
                atol: 0.0,
                rtol: 1e-3,
            }),
        ] {
            for &r in &values {
                for &d in &nudges {
                    let x = r + d;
                    let mut scan = Scan::default();
                    scan.element(0, x, r, 0.0, rule);
                    assert_eq!(rule.admits(r, x), scan.mismatched == 0, "{rule} {r} {x}");
                }
            }
        }
    }

    #[test]
    fn an_error_shared_along_an_axis_is_judged_in_its_own_class() {
        // A [8, 16] bf16 leaf. The reference rounds the float64 result once; a port whose slices
        // along the last axis are off by a common factor of a few bf16 roundings (a variance in
        // bf16) is caught in that class, where the elements' RMS sees only ~2×; a port rounding
        // as often but independently is not.
        let mut rng = crate::describe::rng::Rng::new(7, "h");
        let h: Vec<f64> = rng.normals(128);
        let bf16 = |v: &[f64]| HostTensor::from_floats(vec![8, 16], v, WireDType::BF16);
        let reference = bf16(&h);
        let factors: Vec<f64> = rng.normals(8).iter().map(|z| 1.0 + 0.004 * z).collect();
        let shared: Vec<f64> = h
            .iter()
            .enumerate()
            .map(|(i, v)| v * factors[i / 16])
            .collect();
        let noise = rng.normals(128);
        let independent: Vec<f64> = h
            .iter()
            .zip(&noise)
            .map(|(v, z)| v * (1.0 + 0.002 * z))
            .collect();
        let precise = HostTensor::from_f64(vec![8, 16], &h);
        let a = accuracy(&bf16(&shared), &reference, &precise).unwrap();
        assert_eq!(a.axis, Some(1), "{a:?}");
        assert!(a.ratio > 3.0, "{a:?}");
        let b = accuracy(&bf16(&independent), &reference, &precise).unwrap();
        assert!(b.ratio < 3.0, "{b:?}");
    }

    #[test]
    fn integers_are_exact() {
        let port = t(&[2], &[3.0, 4.0], WireDType::I64);
        let reference = t(&[2], &[3.0, 5.0], WireDType::I64);
        let leaf = compare_leaf(
            "out",
            &port,
            &expected(&reference),
            Some(Tol {
                atol: 10.0,
                rtol: 1.0,
            }),
            ROUNDING_FACTOR,
        );
        assert!(!leaf.passes());
    }

    #[test]
    fn shape_hints_name_the_transpose() {
        assert!(shape_hint(&[2, 7, 5], &[2, 5, 7]).contains("`.transpose(1, 2)`"));
        assert!(shape_hint(&[7, 5, 2], &[2, 5, 7]).contains("transpose(0, 2)"));
        assert!(shape_hint(&[5, 7, 2], &[2, 5, 7]).contains("`.permute([1, 2, 0])`"));
        assert!(shape_hint(&[35, 2], &[2, 5, 7]).contains("reshape"));
        assert!(shape_hint(&[3], &[4]).contains("different number"));
    }

    #[test]
    fn float_against_int_is_a_dtype_problem() {
        let port = t(&[1], &[1.0], WireDType::F32);
        let reference = t(&[1], &[1.0], WireDType::I64);
        assert_eq!(
            compare_leaf("out", &port, &expected(&reference), None, ROUNDING_FACTOR).verdict,
            Verdict::DType
        );
    }

    #[test]
    fn numbers_print_short() {
        assert_eq!(num(0.841213), "0.8412");
        assert_eq!(num(1.3e-6), "1.3e-6");
        assert_eq!(num(1e-5), "1e-5");
        assert_eq!(num(-1.527e-4), "-1.527e-4");
        assert_eq!(num(123.0), "123");
        assert_eq!(num(0.0), "0");
        assert_eq!(num_pair(3.99994, 4.0), ("3.9999".into(), "4".into()));
        assert_eq!(
            num_pair(0.84121, 0.84134),
            ("0.8412".into(), "0.8413".into())
        );
    }
}
