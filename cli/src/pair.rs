//! Comparing one pair of tensors — the engine `golden diff` and `golden view` share.
//!
//! Same shapes: element by element, in chunks (tensors of different dtypes are never copied
//! whole), under torch.testing.assert_close's tolerance for the coarser dtype or the one given.
//! Different shapes (or one side in tensor-parallel shards): the explanations of `layout.rs`,
//! each concatenation axis of the shards with each layout, in the order a porter would try them.
//! Each candidate is first judged on a sample of elements; the first that agrees within the
//! tolerance there is compared in full, and used and stated if it agrees on every element. When
//! none does, the closest is compared in full and shown with its numbers, said to be the closest.
//! `--strict-shapes` compares only equal shapes.

use crate::layout::{self, Layout};
use golden::internal::describe::layer::Tol;
use golden::internal::describe::numbers::num;
use golden::internal::judge::compare::{self, Element, Expected, Rule, Verdict};
use golden_files::{HostTensor, WireDType};

/// The tolerance: explicit, or assert_close's default for each tensor's dtype.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: Option<f64>,
    /// Relative part.
    pub rtol: Option<f64>,
}

impl Tolerance {
    /// The explicit tolerance, if either part was given.
    pub fn explicit(&self) -> Option<Tol> {
        match (self.atol, self.rtol) {
            (None, None) => None,
            (a, r) => Some(Tol {
                atol: a.unwrap_or(0.0),
                rtol: r.unwrap_or(0.0),
            }),
        }
    }
}

/// How a pair is compared.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// The tolerance.
    pub tolerance: Tolerance,
    /// Compare equal shapes only (no reshape, permutation or concatenation of shards).
    pub strict_shapes: bool,
}

/// The figures of one pair of tensors.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Elements compared.
    pub numel: usize,
    /// Greatest |A − B| over finite pairs.
    pub max_abs: f64,
    /// Mean |A − B| over finite pairs.
    pub mean_abs: f64,
    /// Greatest |A − B| / |A|.
    pub max_rel: f64,
    /// Mean |A − B| / |A| where A ≠ 0.
    pub mean_rel: f64,
    /// Cosine similarity of the two as flat vectors (NaN when either is all zeros).
    pub cosine: f64,
    /// NaN counts in A and B.
    pub nan: (usize, usize),
    /// Inf counts in A and B.
    pub inf: (usize, usize),
    /// Elements outside the tolerance.
    pub mismatched: usize,
    /// The rule applied.
    pub rule: String,
    /// The element furthest outside its tolerance: index (in A's shape), A, B.
    pub worst: Option<(Vec<usize>, f64, f64)>,
    /// How B was laid out as A when their shapes differ.
    pub explained: Option<Explained>,
}

/// How B's elements were matched with A's when the shapes differ.
#[derive(Clone, Debug, PartialEq)]
pub struct Explained {
    /// The expression that makes A's shape out of B (`B.permute(1, 0, 2).unsqueeze(0)`, or with
    /// shards `torch.cat([x.rank0, x.rank1], dim=1)…`).
    pub text: String,
    /// Whether the values agree under it; if not, it is the closest of those tried.
    pub agrees: bool,
    /// How many explanations were tried.
    pub tried: usize,
    /// How the shards were joined: the side (`A`/`B`) and axis, if a side came in shards.
    pub concat: Option<(char, usize)>,
    /// The layout of B's elements in A's order (none: the same order).
    pub layout: Option<Layout>,
}

impl Explained {
    /// The note on a row: `compared as …`, and when no explanation agrees, that this is the
    /// closest of those tried.
    pub fn note(&self) -> String {
        if self.agrees {
            format!("compared as {}", self.text)
        } else {
            format!(
                "compared as {}, the closest of the {} explanation{} tried (none agrees)",
                self.text,
                self.tried,
                if self.tried == 1 { "" } else { "s" }
            )
        }
    }
}

/// What comparing a pair found.
#[derive(Clone, Debug)]
pub enum Compared {
    /// Compared element by element (perhaps under an explanation).
    Values(Box<Stats>),
    /// Not compared: the shapes differ and nothing explains it, or `--strict-shapes`; why.
    Shape(String),
}

/// Significant bits of a float dtype (bf16 keeps 8, f16 11: bf16 is the less precise of the two
/// although both take 2 bytes).
fn precision(d: WireDType) -> u32 {
    match d {
        WireDType::F64 => 53,
        WireDType::F32 => 24,
        WireDType::F16 => 11,
        WireDType::BF16 => 8,
        _ => 64,
    }
}

/// The dtype whose tolerance a pair gets: the coarser float dtype (in either order), a float
/// against an integer the float's, two integers exact.
fn rule_dtype(a: WireDType, b: WireDType) -> WireDType {
    if a == b {
        return a;
    }
    match (a.is_float(), b.is_float()) {
        (true, true) if precision(a) <= precision(b) => a,
        (true, true) => b,
        (true, false) => a,
        (false, true) => b,
        (false, false) => WireDType::I64,
    }
}

/// The rule a pair of these dtypes is judged by.
pub fn rule(a: WireDType, b: WireDType, tol: Tolerance) -> Rule {
    Rule::for_leaf(rule_dtype(a, b), tol.explicit(), 0.0)
}

/// A rule as the rows state it (`atol 1e-5 + rtol 1.3e-6·|A|`, `exact`).
pub fn rule_text(rule: Rule) -> String {
    match rule {
        Rule::Exact => "exact".into(),
        Rule::Default { atol, rtol, .. } | Rule::Explicit(Tol { atol, rtol }) => {
            format!("atol {} + rtol {}·|A|", num(atol), num(rtol))
        }
    }
}

/// Elements compared at a time: the chunks of mixed dtypes and permuted layouts are the only
/// copies.
const CHUNK: usize = 1 << 20;

/// Elements judged to rank the candidate explanations.
const SAMPLE: usize = 4096;

/// B read in A's order: B itself, or through a layout.
struct InOrder<'a> {
    b: &'a HostTensor,
    layout: Option<&'a Layout>,
}

impl InOrder<'_> {
    fn chunk(&self, start: usize, len: usize) -> HostTensor {
        match self.layout {
            Some(l) => l.gather(self.b, start, len),
            None => slice(self.b, start, len),
        }
    }
    fn at(&self, i: usize) -> f64 {
        self.b.f64_at(self.layout.map_or(i, |l| l.offset(i)))
    }
}

/// Elements `start..start + len` of `t`, flat: a slice of its bytes.
fn slice(t: &HostTensor, start: usize, len: usize) -> HostTensor {
    let size = t.dtype.size();
    HostTensor {
        dtype: t.dtype,
        shape: vec![len],
        data: t.data.slice(start * size..(start + len) * size),
    }
}

fn as_f64(t: HostTensor) -> HostTensor {
    let values = t.to_f64();
    HostTensor::from_f64(t.shape, &values)
}

/// max/mean absolute and relative difference and cosine similarity, over finite pairs, chunk by
/// chunk.
#[derive(Default)]
struct Moments {
    sum_abs: f64,
    sum_rel: f64,
    max_abs: f64,
    max_rel: f64,
    dot: f64,
    nx: f64,
    ny: f64,
    finite: usize,
    rel_count: usize,
}

impl Moments {
    fn add(&mut self, a: &HostTensor, b: &HostTensor) {
        const STEP: usize = 4096;
        let n = a.numel();
        let (mut x, mut y) = (vec![0.0; STEP.min(n)], vec![0.0; STEP.min(n)]);
        let mut start = 0;
        while start < n {
            let len = STEP.min(n - start);
            a.read_f64_into(start, &mut x[..len]);
            b.read_f64_into(start, &mut y[..len]);
            for k in 0..len {
                let (p, q) = (x[k], y[k]);
                if !(p.is_finite() && q.is_finite()) {
                    continue;
                }
                self.finite += 1;
                let d = (p - q).abs();
                self.sum_abs += d;
                self.max_abs = self.max_abs.max(d);
                if p != 0.0 {
                    let r = d / p.abs();
                    self.sum_rel += r;
                    self.rel_count += 1;
                    self.max_rel = self.max_rel.max(r);
                } else if d > 0.0 {
                    self.max_rel = f64::INFINITY;
                }
                self.dot += p * q;
                self.nx += p * p;
                self.ny += q * q;
            }
            start += len;
        }
    }

    fn into_stats(self, numel: usize) -> Stats {
        Stats {
            numel,
            max_abs: self.max_abs,
            mean_abs: if self.finite > 0 {
                self.sum_abs / self.finite as f64
            } else {
                0.0
            },
            max_rel: self.max_rel,
            mean_rel: if self.rel_count > 0 {
                self.sum_rel / self.rel_count as f64
            } else {
                0.0
            },
            cosine: if self.nx > 0.0 && self.ny > 0.0 {
                self.dot / (self.nx.sqrt() * self.ny.sqrt())
            } else if self.nx == 0.0 && self.ny == 0.0 {
                1.0
            } else {
                f64::NAN
            },
            ..Stats::default()
        }
    }
}

/// Compare A with B read in A's order, chunk by chunk.
fn compare_values(a: &HostTensor, b: &InOrder<'_>, tol: Tolerance) -> Stats {
    let mixed = a.dtype != b.b.dtype;
    let rule = rule(a.dtype, b.b.dtype, tol);
    // The f64 copies of mixed dtypes get the coarser dtype's rule, spelled out.
    let spelled = match rule {
        Rule::Default { atol, rtol, .. } | Rule::Explicit(Tol { atol, rtol }) => {
            Some(Tol { atol, rtol })
        }
        Rule::Exact => Some(Tol {
            atol: 0.0,
            rtol: 0.0,
        }),
    };
    let n = a.numel();
    let mut moments = Moments::default();
    let (mut nan, mut inf, mut mismatched) = ((0, 0), (0, 0), 0);
    let (mut worst, mut worst_ratio, mut first_nonfinite): (Option<Element>, f64, Option<Element>) =
        (None, f64::NEG_INFINITY, None);
    let mut start = 0;
    while start < n {
        let len = CHUNK.min(n - start);
        let (mut ca, mut cb) = (slice(a, start, len), b.chunk(start, len));
        if mixed {
            (ca, cb) = (as_f64(ca), as_f64(cb));
        }
        moments.add(&ca, &cb);
        let leaf = compare::compare_leaf(
            "",
            &cb,
            &Expected {
                value: &ca,
                rounding: None,
                precise: None,
            },
            if mixed { spelled } else { tol.explicit() },
            0.0,
        );
        if let Verdict::Values(v) = leaf.verdict {
            let whole = |mut e: Element| {
                e.index = compare::unravel(start + e.index.first().copied().unwrap_or(0), &a.shape);
                e
            };
            nan = (nan.0 + v.nan.0, nan.1 + v.nan.1);
            inf = (inf.0 + v.inf.0, inf.1 + v.inf.1);
            mismatched += v.mismatched;
            if first_nonfinite.is_none() {
                first_nonfinite = v.first_nonfinite_mismatch.map(whole);
            }
            if v.worst.is_some() && v.worst_ratio > worst_ratio {
                worst_ratio = v.worst_ratio;
                worst = v.worst.map(whole);
            }
        }
        start += len;
    }
    let mut stats = moments.into_stats(n);
    stats.nan = nan;
    stats.inf = inf;
    stats.mismatched = mismatched;
    stats.rule = rule_text(rule);
    stats.worst = first_nonfinite
        .or(worst)
        .filter(|_| mismatched > 0)
        .map(|e| (e.index, e.reference, e.port));
    stats
}

/// How many of a sample of A's elements B (in A's order) gets wrong.
fn sample_misses(a: &HostTensor, b: &InOrder<'_>, rule: Rule) -> usize {
    let n = a.numel();
    let step = (n / SAMPLE).max(1);
    (0..n)
        .step_by(step)
        .take(SAMPLE)
        .filter(|&i| !rule.admits(a.f64_at(i), b.at(i)))
        .count()
}

/// One way to line the two sides up: which side's shards are joined along which axis, and B's
/// layout in A's order.
#[derive(Clone, Debug)]
struct Candidate {
    concat: Option<(char, usize)>,
    layout: Option<Layout>,
    text: String,
}

/// A side's shards, named, as one tensor along each axis they may be joined on.
fn joined(parts: &[HostTensor], names: &[String], axis: usize) -> (HostTensor, String) {
    let t = layout::concat(parts, axis);
    let text = format!("torch.cat([{}], dim={axis})", names.join(", "));
    (t, text)
}

/// Compare A (one tensor, or shards) with B (one tensor, or shards). `a_names`/`b_names` name
/// the shards in the statement.
pub fn compare(
    a_parts: &[HostTensor],
    a_names: &[String],
    b_parts: &[HostTensor],
    b_names: &[String],
    options: Options,
) -> Compared {
    let (a0, b0) = (&a_parts[0], &b_parts[0]);
    if a_parts.len() == 1 && b_parts.len() == 1 && a0.shape == b0.shape {
        return Compared::Values(Box::new(compare_values(
            a0,
            &InOrder {
                b: b0,
                layout: None,
            },
            options.tolerance,
        )));
    }
    if options.strict_shapes {
        return Compared::Shape(if b_parts.len() > 1 || a_parts.len() > 1 {
            "one side is in shards, not joined under --strict-shapes".into()
        } else {
            "--strict-shapes: not compared".into()
        });
    }
    let shapes = |parts: &[HostTensor]| parts.iter().map(|p| p.shape.clone()).collect::<Vec<_>>();
    let dtypes_agree = |parts: &[HostTensor]| parts.iter().all(|p| p.dtype == parts[0].dtype);
    if !dtypes_agree(a_parts) || !dtypes_agree(b_parts) {
        return Compared::Shape("the shards are of different dtypes".into());
    }
    // The ways each side may be one tensor: itself, or its shards joined along an axis.
    let ways = |parts: &[HostTensor], side: char| -> Vec<Option<(char, usize)>> {
        if parts.len() == 1 {
            vec![None]
        } else {
            layout::concat_axes(&shapes(parts))
                .into_iter()
                .map(|axis| Some((side, axis)))
                .collect()
        }
    };
    let (ways_a, ways_b) = (ways(a_parts, 'A'), ways(b_parts, 'B'));
    if ways_a.is_empty() || ways_b.is_empty() {
        let (side, parts) = if ways_a.is_empty() {
            ('A', a_parts)
        } else {
            ('B', b_parts)
        };
        return Compared::Shape(format!(
            "{side}'s {} shards ({}) cannot be joined: their shapes differ on more than one axis",
            parts.len(),
            shapes(parts)
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let one = |parts: &[HostTensor], names: &[String], way: Option<(char, usize)>| match way {
        None => (parts[0].clone(), String::from("B")),
        Some((_, axis)) => joined(parts, names, axis),
    };
    let rule = rule(a0.dtype, b0.dtype, options.tolerance);
    // Every candidate, ranked by its sample: (misses, order, candidate).
    let mut ranked: Vec<(usize, usize, Candidate)> = Vec::new();
    for wa in &ways_a {
        let (a, a_text) = one(a_parts, a_names, *wa);
        for wb in &ways_b {
            let (b, b_text) = one(b_parts, b_names, *wb);
            let layouts: Vec<Option<Layout>> = if a.shape == b.shape {
                vec![None]
            } else {
                layout::candidates(&a.shape, &b.shape)
                    .into_iter()
                    .map(Some)
                    .collect()
            };
            for l in layouts {
                let misses = sample_misses(
                    &a,
                    &InOrder {
                        b: &b,
                        layout: l.as_ref(),
                    },
                    rule,
                );
                let mut text = match &l {
                    Some(l) => l.text.replacen('B', &b_text, 1),
                    None => b_text.clone(),
                };
                if wa.is_some() {
                    text = format!("{text}, against A = {a_text}");
                }
                let concat = wa.or(*wb);
                let order = ranked.len();
                ranked.push((
                    misses,
                    order,
                    Candidate {
                        concat,
                        layout: l,
                        text,
                    },
                ));
                if ranked.len() >= layout::MAX_CANDIDATES {
                    break;
                }
            }
        }
    }
    if ranked.is_empty() {
        let total = |parts: &[HostTensor]| parts.iter().map(|p| p.numel()).sum::<usize>();
        let (na, nb) = (total(a_parts), total(b_parts));
        return Compared::Shape(if na != nb {
            format!(
                "A has {na} elements, B {nb}: not the same elements in another shape{}",
                if b_parts.len() > 1 || a_parts.len() > 1 {
                    ", joined shards included"
                } else {
                    ""
                }
            )
        } else {
            "no reshape, permutation or join of the shards makes one shape of the other".into()
        });
    }
    let tried = ranked.len();
    // Those that agree on the sample, in order, are compared in full until one agrees on all;
    // else the closest by the sample.
    let mut agreeing: Vec<&(usize, usize, Candidate)> =
        ranked.iter().filter(|(m, _, _)| *m == 0).collect();
    agreeing.sort_by_key(|(_, o, _)| *o);
    let mut best: Option<(Stats, Candidate)> = None;
    let full = |c: &Candidate| -> Stats {
        let wa = c.concat.filter(|(s, _)| *s == 'A');
        let wb = c.concat.filter(|(s, _)| *s == 'B');
        let (a, _) = one(a_parts, a_names, wa);
        let (b, _) = one(b_parts, b_names, wb);
        compare_values(
            &a,
            &InOrder {
                b: &b,
                layout: c.layout.as_ref(),
            },
            options.tolerance,
        )
    };
    for (_, _, c) in agreeing.iter().take(3) {
        let stats = full(c);
        let better = best
            .as_ref()
            .is_none_or(|(s, _)| stats.mismatched < s.mismatched);
        if stats.mismatched == 0 {
            best = Some((stats, c.clone()));
            break;
        }
        if better {
            best = Some((stats, c.clone()));
        }
    }
    if best.as_ref().is_none_or(|(s, _)| s.mismatched > 0) && agreeing.is_empty() {
        let closest = ranked
            .iter()
            .min_by_key(|(m, o, _)| (*m, *o))
            .map(|(_, _, c)| c.clone())
            .expect("candidates");
        best = Some((full(&closest), closest));
    }
    let (mut stats, c) = best.expect("a candidate was compared");
    stats.explained = Some(Explained {
        agrees: stats.mismatched == 0,
        text: c.text,
        tried,
        concat: c.concat,
        layout: c.layout,
    });
    Compared::Values(Box::new(stats))
}

/// A pair as the viewer reads it: A, and B in A's shape and order (its shards joined, its
/// layout applied), and the rule their elements are judged by.
pub struct Aligned {
    /// A (its shards joined, if it came in shards).
    pub a: HostTensor,
    /// B's elements in A's order, in A's shape.
    pub b: HostTensor,
    /// The rule each element is judged by.
    pub rule: Rule,
}

/// Line up a compared pair the way the comparison did (`explained`: how, if the shapes differ).
pub fn align(
    a_parts: &[HostTensor],
    b_parts: &[HostTensor],
    explained: Option<&Explained>,
    tol: Tolerance,
) -> Result<Aligned, String> {
    let join = |parts: &[HostTensor], side: char| -> HostTensor {
        match explained.and_then(|e| e.concat) {
            Some((s, axis)) if s == side && parts.len() > 1 => layout::concat(parts, axis),
            _ => parts[0].clone(),
        }
    };
    let (a, b) = (join(a_parts, 'A'), join(b_parts, 'B'));
    let b = match explained.and_then(|e| e.layout.as_ref()) {
        Some(l) => {
            let mut t = l.gather(&b, 0, a.numel());
            t.shape = a.shape.clone();
            t
        }
        None if b.numel() == a.numel() => HostTensor {
            shape: a.shape.clone(),
            ..b
        },
        None => {
            return Err(format!(
                "the shapes differ ({:?} against {:?}) and nothing lines them up",
                a.shape, b.shape
            ))
        }
    };
    let rule = rule(a.dtype, b.dtype, tol);
    Ok(Aligned { a, b, rule })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[usize], f: impl Fn(usize) -> f32) -> HostTensor {
        let n: usize = shape.iter().product();
        let data: Vec<u8> = (0..n).flat_map(|i| f(i).to_le_bytes()).collect();
        HostTensor {
            dtype: WireDType::F32,
            shape: shape.to_vec(),
            data: data.into(),
        }
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_transposed_pair_is_compared_as_its_transpose_and_a_planted_error_still_found() {
        // A [1, 8, 76, 64]; B [76, 8, 64] holds the same values: B[t, h, d] = A[0, h, t, d].
        let value = |h: usize, t: usize, d: usize| ((h * 31 + t * 7 + d) % 97) as f32 * 0.01;
        let a = f32s(&[1, 8, 76, 64], |i| {
            value(i / (76 * 64), (i / 64) % 76, i % 64)
        });
        let b = f32s(&[76, 8, 64], |i| value((i / 64) % 8, i / (8 * 64), i % 64));
        let Compared::Values(s) = compare(
            std::slice::from_ref(&a),
            &names(&["A"]),
            std::slice::from_ref(&b),
            &names(&["B"]),
            Options::default(),
        ) else {
            panic!("not compared")
        };
        assert_eq!(s.mismatched, 0);
        let e = s.explained.unwrap();
        assert!(e.agrees);
        assert_eq!(e.text, "B.permute(1, 0, 2).unsqueeze(0)");
        // One element of B off: found, at A's index.
        let mut data = b.data.to_vec();
        let at = (5 * 8 + 3) * 64 + 2; // B[5, 3, 2] = A[0, 3, 5, 2]
        data[at * 4..at * 4 + 4].copy_from_slice(&9.0f32.to_le_bytes());
        let bad = HostTensor {
            data: data.into(),
            ..b
        };
        let Compared::Values(s) = compare(
            &[a],
            &names(&["A"]),
            &[bad],
            &names(&["B"]),
            Options::default(),
        ) else {
            panic!("not compared")
        };
        assert_eq!(s.mismatched, 1);
        assert_eq!(s.worst.as_ref().unwrap().0, vec![0, 3, 5, 2]);
        assert_eq!(s.worst.as_ref().unwrap().2, 9.0);
        assert_eq!(s.explained.unwrap().text, "B.permute(1, 0, 2).unsqueeze(0)");
    }

    #[test]
    fn shards_join_along_the_axis_that_explains_them() {
        let a = f32s(&[4, 6], |i| i as f32);
        // Two column shards [4, 3].
        let s0 = f32s(&[4, 3], |i| ((i / 3) * 6 + i % 3) as f32);
        let s1 = f32s(&[4, 3], |i| ((i / 3) * 6 + 3 + i % 3) as f32);
        let Compared::Values(s) = compare(
            &[a],
            &names(&["A"]),
            &[s0, s1],
            &names(&["x.rank0", "x.rank1"]),
            Options::default(),
        ) else {
            panic!("not compared")
        };
        assert_eq!(s.mismatched, 0);
        assert_eq!(
            s.explained.unwrap().text,
            "torch.cat([x.rank0, x.rank1], dim=1)"
        );
    }

    #[test]
    fn no_explanation_that_agrees_shows_the_closest_and_strict_shapes_compares_none() {
        let a = f32s(&[4, 4], |i| i as f32);
        let b = f32s(&[16], |i| if i == 3 { 100.0 } else { i as f32 });
        let Compared::Values(s) = compare(
            std::slice::from_ref(&a),
            &names(&["A"]),
            std::slice::from_ref(&b),
            &names(&["B"]),
            Options::default(),
        ) else {
            panic!("not compared")
        };
        let e = s.explained.clone().unwrap();
        assert!(!e.agrees);
        assert_eq!(e.text, "B.reshape(4, 4)");
        assert_eq!(s.mismatched, 1);
        assert_eq!(
            e.note(),
            "compared as B.reshape(4, 4), the closest of the 2 explanations tried (none agrees)"
        );
        let strict = Options {
            strict_shapes: true,
            ..Options::default()
        };
        assert!(matches!(
            compare(
                std::slice::from_ref(&a),
                &names(&["A"]),
                &[b],
                &names(&["B"]),
                strict
            ),
            Compared::Shape(_)
        ));
        let c = f32s(&[15], |i| i as f32);
        let Compared::Shape(why) = compare(
            &[a],
            &names(&["A"]),
            &[c],
            &names(&["B"]),
            Options::default(),
        ) else {
            panic!("compared")
        };
        assert_eq!(
            why,
            "A has 16 elements, B 15: not the same elements in another shape"
        );
    }
}
