//! `golden show FILE [NAME] [--slice 0,:,3:7]`: a tensor's statistics, a histogram in the
//! terminal, and raw values (the first ten, or a slice). A file of several tensors without a
//! NAME lists them.

use golden::describe::numbers::num;
use golden_files::formats;
use golden_files::HostTensor;
use std::fmt::Write as _;
use std::path::Path;

/// One axis of a slice: an index, or a range with a step.
#[derive(Clone, Debug, PartialEq)]
pub enum Axis {
    Index(i64),
    Range(Option<i64>, Option<i64>, i64),
}

/// Parse `0,:,3:7`, `-1`, `::2`, `1:`.
pub fn parse_slice(spec: &str) -> Result<Vec<Axis>, String> {
    spec.split(',')
        .map(|part| {
            let part = part.trim();
            let bad = || {
                format!("`{part}` in --slice is not an index or a range (`3`, `:`, `2:5`, `::2`)")
            };
            let int = |s: &str| -> Result<Option<i64>, String> {
                if s.trim().is_empty() {
                    Ok(None)
                } else {
                    s.trim().parse().map(Some).map_err(|_| bad())
                }
            };
            if !part.contains(':') {
                return int(part)?.map(Axis::Index).ok_or_else(bad);
            }
            let fields: Vec<&str> = part.split(':').collect();
            if fields.len() > 3 {
                return Err(bad());
            }
            let step = match fields.get(2) {
                Some(s) => int(s)?.unwrap_or(1),
                None => 1,
            };
            if step <= 0 {
                return Err(format!("`{part}`: the step must be positive"));
            }
            Ok(Axis::Range(int(fields[0])?, int(fields[1])?, step))
        })
        .collect()
}

/// The selected indices along each axis (an index axis keeps one and is dropped from the shape).
fn select(shape: &[usize], spec: &[Axis]) -> Result<Vec<(Vec<usize>, bool)>, String> {
    if spec.len() > shape.len() {
        return Err(format!(
            "--slice has {} axes, the tensor {} ({shape:?})",
            spec.len(),
            shape.len()
        ));
    }
    shape
        .iter()
        .enumerate()
        .map(|(axis, &n)| {
            let n_i = n as i64;
            let resolve = |i: i64| if i < 0 { i + n_i } else { i };
            match spec.get(axis) {
                None => Ok(((0..n).collect(), true)),
                Some(Axis::Index(i)) => {
                    let j = resolve(*i);
                    if !(0..n_i).contains(&j) {
                        return Err(format!(
                            "index {i} is out of range for axis {axis} of size {n}"
                        ));
                    }
                    Ok((vec![j as usize], false))
                }
                Some(Axis::Range(lo, hi, step)) => {
                    let lo = lo.map_or(0, resolve).clamp(0, n_i);
                    let hi = hi.map_or(n_i, resolve).clamp(0, n_i);
                    Ok((
                        (lo..hi)
                            .step_by(*step as usize)
                            .map(|i| i as usize)
                            .collect(),
                        true,
                    ))
                }
            }
        })
        .collect()
}

/// Statistics of the finite values, and counts of the rest.
struct Summary {
    count: usize,
    finite: usize,
    min: f64,
    max: f64,
    mean: f64,
    std: f64,
    nan: usize,
    pos_inf: usize,
    neg_inf: usize,
    zeros: usize,
}

fn summarise(values: &[f64]) -> Summary {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let n = finite.len().max(1) as f64;
    let mean = finite.iter().sum::<f64>() / n;
    let var = finite.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    Summary {
        count: values.len(),
        finite: finite.len(),
        min: finite.iter().copied().fold(f64::INFINITY, f64::min),
        max: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        mean,
        std: var.sqrt(),
        nan: values.iter().filter(|v| v.is_nan()).count(),
        pos_inf: values.iter().filter(|v| **v == f64::INFINITY).count(),
        neg_inf: values.iter().filter(|v| **v == f64::NEG_INFINITY).count(),
        zeros: values.iter().filter(|v| **v == 0.0).count(),
    }
}

/// A histogram of the finite values in `bins` bins, as bars of block characters.
pub fn histogram(values: &[f64], bins: usize) -> String {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let mut out = String::new();
    if finite.is_empty() {
        return "  (no finite values)\n".into();
    }
    let (lo, hi) = finite
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(*v), b.max(*v))
        });
    let bins = if lo == hi { 1 } else { bins.max(1) };
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![0usize; bins];
    for v in &finite {
        let i = if width > 0.0 {
            (((v - lo) / width) as usize).min(bins - 1)
        } else {
            0
        };
        counts[i] += 1;
    }
    let most = *counts.iter().max().unwrap_or(&1);
    const BAR: usize = 40;
    const EIGHTHS: [&str; 8] = ["", "▏", "▎", "▍", "▌", "▋", "▊", "▉"];
    for (i, c) in counts.iter().enumerate() {
        let from = lo + width * i as f64;
        let to = if i + 1 == bins {
            hi
        } else {
            lo + width * (i + 1) as f64
        };
        let eighths = (c * BAR * 8).div_ceil(most.max(1));
        let bar = format!("{}{}", "█".repeat(eighths / 8), EIGHTHS[eighths % 8]);
        let _ = writeln!(
            out,
            "  [{:>10}, {:>10}] {:>9}  {bar}",
            num(from),
            num(to),
            c
        );
    }
    out
}

/// Writes the values at the selected indices, nested like the selection's shape.
struct Render<'a> {
    selection: &'a [(Vec<usize>, bool)],
    strides: Vec<usize>,
    values: Vec<f64>,
    out: String,
    printed: usize,
    limit: usize,
}

impl Render<'_> {
    fn walk(&mut self, axis: usize, offset: usize) {
        if axis == self.selection.len() {
            if self.printed < self.limit {
                self.out.push_str(&num(self.values[offset]));
            } else if self.printed == self.limit {
                self.out.push('…');
            }
            self.printed += 1;
            return;
        }
        let (indices, kept) = &self.selection[axis];
        if !kept {
            return self.walk(axis + 1, offset + indices[0] * self.strides[axis]);
        }
        self.out.push('[');
        for (k, i) in indices.iter().enumerate() {
            if k > 0 {
                self.out.push_str(", ");
            }
            if self.printed > self.limit {
                break;
            }
            self.walk(axis + 1, offset + i * self.strides[axis]);
        }
        self.out.push(']');
    }
}

/// The values at the selected indices, nested like the selection's shape (at most `limit`).
fn render(t: &HostTensor, selection: &[(Vec<usize>, bool)], limit: usize) -> String {
    let mut r = Render {
        selection,
        strides: (0..t.shape.len())
            .map(|a| t.shape[a + 1..].iter().product())
            .collect(),
        values: t.to_f64(),
        out: String::new(),
        printed: 0,
        limit,
    };
    r.walk(0, 0);
    if r.printed > limit {
        let _ = write!(r.out, "  ({} values, {limit} shown)", r.printed);
    }
    r.out
}

/// Run `golden show`.
pub fn run(
    path: &Path,
    name: Option<&str>,
    slice: Option<&str>,
    bins: usize,
) -> Result<String, String> {
    let contents = formats::read(path)?;
    let mut out = String::new();
    if contents.tensors.is_empty() {
        return Err(format!(
            "{}: no tensors{}",
            path.display(),
            if contents.skipped.is_empty() {
                String::new()
            } else {
                format!(" (it holds {})", contents.skipped.join(", "))
            }
        ));
    }
    let chosen = match name {
        Some(n) => Some(
            contents
                .tensors
                .iter()
                .find(|(t, _)| t == n)
                .ok_or_else(|| {
                    let names: Vec<&str> =
                        contents.tensors.iter().map(|(t, _)| t.as_str()).collect();
                    let close: Vec<&str> = names
                        .iter()
                        .copied()
                        .filter(|t| t.contains(n) || n.contains(t))
                        .take(5)
                        .collect();
                    format!(
                        "{} has no tensor `{n}`{}; it has {} tensors{}",
                        path.display(),
                        if close.is_empty() {
                            String::new()
                        } else {
                            format!(" (did you mean {}?)", close.join(", "))
                        },
                        names.len(),
                        if names.len() <= 12 {
                            format!(": {}", names.join(", "))
                        } else {
                            String::new()
                        }
                    )
                })?,
        ),
        None if contents.tensors.len() == 1 => contents.tensors.first(),
        None => None,
    };
    let Some((tname, t)) = chosen else {
        // Several tensors: list them.
        let _ = writeln!(
            out,
            "{}: {} tensors (name one to see it)",
            path.display(),
            contents.tensors.len()
        );
        let width = contents
            .tensors
            .iter()
            .map(|(n, _)| n.len())
            .max()
            .unwrap_or(4)
            .min(60);
        for (n, t) in &contents.tensors {
            let s = summarise(&t.to_f64());
            let _ = writeln!(
                out,
                "  {n:<width$}  {:<5} {:<16} min {:>10}  max {:>10}  mean {:>10}",
                t.dtype.name(),
                format!("{:?}", t.shape),
                num(s.min),
                num(s.max),
                num(s.mean)
            );
        }
        if !contents.skipped.is_empty() {
            let _ = writeln!(out, "  not tensors: {}", contents.skipped.join(", "));
        }
        return Ok(out);
    };
    let values = t.to_f64();
    let s = summarise(&values);
    let _ = writeln!(
        out,
        "{tname}: {} {:?} ({} elements) from {}",
        t.dtype.name(),
        t.shape,
        s.count,
        path.display()
    );
    if s.finite > 0 {
        let _ = writeln!(
            out,
            "  min {}  max {}  mean {}  std {}",
            num(s.min),
            num(s.max),
            num(s.mean),
            num(s.std)
        );
    }
    let _ = writeln!(
        out,
        "  NaN {}  +Inf {}  -Inf {}  zeros {}",
        s.nan, s.pos_inf, s.neg_inf, s.zeros
    );
    let _ = writeln!(out, "histogram of the finite values:");
    out.push_str(&histogram(&values, bins));
    match slice {
        Some(spec) => {
            let selection = select(&t.shape, &parse_slice(spec)?)?;
            let _ = writeln!(out, "values [{spec}]:");
            let _ = writeln!(out, "  {}", render(t, &selection, 1000));
        }
        None => {
            let shown = values.len().min(10);
            let first: Vec<String> = values[..shown].iter().map(|v| num(*v)).collect();
            let _ = writeln!(
                out,
                "first {shown} values (flat; --slice picks others): {}",
                first.join(", ")
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_parse_and_select_like_numpy() {
        let spec = parse_slice("0, :, 1:3, ::2").unwrap();
        assert_eq!(
            spec,
            [
                Axis::Index(0),
                Axis::Range(None, None, 1),
                Axis::Range(Some(1), Some(3), 1),
                Axis::Range(None, None, 2)
            ]
        );
        let sel = select(&[2, 3, 4, 5], &spec).unwrap();
        assert_eq!(sel[0], (vec![0], false));
        assert_eq!(sel[2], (vec![1, 2], true));
        assert_eq!(sel[3], (vec![0, 2, 4], true));
        assert_eq!(select(&[4], &parse_slice("-1").unwrap()).unwrap()[0].0, [3]);
        assert!(select(&[4], &parse_slice("4").unwrap()).is_err());
        assert!(parse_slice("1:2:0").is_err());
        assert!(parse_slice("a").is_err());
    }

    #[test]
    fn a_slice_renders_nested_values() {
        let t = HostTensor::from_f64(vec![2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let sel = select(&t.shape, &parse_slice(":, 1:").unwrap()).unwrap();
        assert_eq!(render(&t, &sel, 100), "[[1, 2], [4, 5]]");
        let sel = select(&t.shape, &parse_slice("1").unwrap()).unwrap();
        assert_eq!(render(&t, &sel, 100), "[3, 4, 5]");
        let scalar = HostTensor::from_f64(vec![], &[7.5]);
        assert_eq!(render(&scalar, &select(&[], &[]).unwrap(), 100), "7.5");
    }

    #[test]
    fn the_histogram_counts_every_finite_value() {
        let values = [0.0, 0.1, 0.9, 1.0, f64::NAN, f64::INFINITY];
        let h = histogram(&values, 2);
        let counts: Vec<usize> = h
            .lines()
            .map(|l| {
                l.split(']')
                    .nth(1)
                    .unwrap()
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        assert_eq!(counts, [2, 2]);
    }
}
