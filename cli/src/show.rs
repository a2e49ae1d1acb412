//! `golden show FILE [NAME] [--slice 0,:,3:7]`: a tensor's statistics, a histogram in the
//! terminal, and raw values (the first ten, or a slice). A file of several tensors without a
//! NAME lists their names, dtypes and shapes, reading none of them.
//!
//! Only the tensor shown is read (within the file's read budget), and everything computed from it
//! is streamed: the statistics and the histogram in chunks, a slice element by element, so a
//! tensor of any size takes no memory beyond its own; `--bins` is bounded by [`MAX_BINS`].

use crate::read::ReadOptions;
use crate::shown::{shown, Lines};
use crate::side::Side;
use golden::internal::describe::numbers::num;
use golden_files::HostTensor;
use std::fmt::Write as _;
use std::path::Path;

/// Most bins a histogram may have: one line each in the terminal.
pub const MAX_BINS: usize = 1000;

/// Elements read at a time when scanning a tensor.
const CHUNK: usize = 1 << 16;

/// Run `f` on the tensor's values as f64, in chunks.
fn scan(t: &HostTensor, mut f: impl FnMut(&[f64])) {
    let n = t.numel();
    let mut buf = vec![0.0; CHUNK.min(n)];
    let mut start = 0;
    while start < n {
        let len = CHUNK.min(n - start);
        t.read_f64_into(start, &mut buf[..len]);
        f(&buf[..len]);
        start += len;
    }
}

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

/// The indices one axis keeps: `start, start + step, ...`, `count` of them (no list: an axis may
/// be billions long).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Picked {
    /// First index.
    pub start: usize,
    /// Step between indices.
    pub step: usize,
    /// How many.
    pub count: usize,
    /// Whether the axis stays in the result (a range) or is dropped (an index).
    pub kept: bool,
}

impl Picked {
    fn nth(&self, k: usize) -> usize {
        self.start + k * self.step
    }
}

/// The selected indices along each axis (an index axis keeps one and is dropped from the shape).
fn select(shape: &[usize], spec: &[Axis]) -> Result<Vec<Picked>, String> {
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
            let n_i = i64::try_from(n).unwrap_or(i64::MAX);
            let resolve = |i: i64| if i < 0 { i.saturating_add(n_i) } else { i };
            match spec.get(axis) {
                None => Ok(Picked {
                    start: 0,
                    step: 1,
                    count: n,
                    kept: true,
                }),
                Some(Axis::Index(i)) => {
                    let j = resolve(*i);
                    if !(0..n_i).contains(&j) {
                        return Err(format!(
                            "index {i} is out of range for axis {axis} of size {n}"
                        ));
                    }
                    Ok(Picked {
                        start: j as usize,
                        step: 1,
                        count: 1,
                        kept: false,
                    })
                }
                Some(Axis::Range(lo, hi, step)) => {
                    let lo = lo.map_or(0, resolve).clamp(0, n_i);
                    let hi = hi.map_or(n_i, resolve).clamp(0, n_i);
                    let step = usize::try_from(*step).unwrap_or(usize::MAX);
                    let span = usize::try_from(hi - lo).unwrap_or(0);
                    Ok(Picked {
                        start: lo as usize,
                        step,
                        count: span.div_ceil(step),
                        kept: true,
                    })
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

fn summarise(t: &HostTensor) -> Summary {
    let mut s = Summary {
        count: t.numel(),
        finite: 0,
        min: f64::INFINITY,
        max: f64::NEG_INFINITY,
        mean: 0.0,
        std: 0.0,
        nan: 0,
        pos_inf: 0,
        neg_inf: 0,
        zeros: 0,
    };
    // Welford's running mean and variance: one pass, no copy of the values.
    let mut m2 = 0.0;
    scan(t, |values| {
        for &v in values {
            if v.is_nan() {
                s.nan += 1;
            } else if v == f64::INFINITY {
                s.pos_inf += 1;
            } else if v == f64::NEG_INFINITY {
                s.neg_inf += 1;
            } else {
                s.finite += 1;
                s.min = s.min.min(v);
                s.max = s.max.max(v);
                let delta = v - s.mean;
                s.mean += delta / s.finite as f64;
                m2 += delta * (v - s.mean);
            }
            if v == 0.0 {
                s.zeros += 1;
            }
        }
    });
    if s.finite > 0 {
        s.std = (m2 / s.finite as f64).sqrt();
    }
    s
}

/// A histogram of the finite values in `bins` bins (at most [`MAX_BINS`]), as bars of block
/// characters.
pub fn histogram(t: &HostTensor, bins: usize) -> String {
    let s = summarise(t);
    let mut out = String::new();
    if s.finite == 0 {
        return "  (no finite values)\n".into();
    }
    let (lo, hi) = (s.min, s.max);
    let bins = if lo == hi { 1 } else { bins.clamp(1, MAX_BINS) };
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![0usize; bins];
    scan(t, |values| {
        for v in values.iter().filter(|v| v.is_finite()) {
            let i = if width > 0.0 {
                (((v - lo) / width) as usize).min(bins - 1)
            } else {
                0
            };
            counts[i] += 1;
        }
    });
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
    tensor: &'a HostTensor,
    selection: &'a [Picked],
    strides: Vec<usize>,
    out: String,
    printed: usize,
    limit: usize,
}

impl Render<'_> {
    fn walk(&mut self, axis: usize, offset: usize) {
        if axis == self.selection.len() {
            if self.printed < self.limit {
                self.out.push_str(&num(self.tensor.f64_at(offset)));
            } else if self.printed == self.limit {
                self.out.push('…');
            }
            self.printed += 1;
            return;
        }
        let picked = self.selection[axis];
        if !picked.kept {
            return self.walk(axis + 1, offset + picked.start * self.strides[axis]);
        }
        self.out.push('[');
        for k in 0..picked.count {
            if self.printed > self.limit {
                break;
            }
            if k > 0 {
                self.out.push_str(", ");
            }
            self.walk(axis + 1, offset + picked.nth(k) * self.strides[axis]);
        }
        self.out.push(']');
    }
}

/// The values at the selected indices, nested like the selection's shape (at most `limit`).
fn render(t: &HostTensor, selection: &[Picked], limit: usize) -> String {
    let mut r = Render {
        tensor: t,
        selection,
        strides: (0..t.shape.len())
            .map(|a| t.shape[a + 1..].iter().product())
            .collect(),
        out: String::new(),
        printed: 0,
        limit,
    };
    r.walk(0, 0);
    let selected = selection
        .iter()
        .map(|p| p.count)
        .try_fold(1usize, |n, c| n.checked_mul(c));
    if r.printed > limit {
        let total = selected.map_or("more".to_string(), |n| n.to_string());
        let _ = write!(r.out, "  ({total} values, {limit} shown)");
    }
    r.out
}

/// Run `golden show` on a tensor file, a folder or an archive of them (`.zip`, `.tar`,
/// `.tar.gz`): NAME is a file's key in a folder or archive (its path without the extension),
/// followed by `/tensor` for a file of several; without it, a folder or archive lists its
/// tensors.
pub fn run(
    path: &Path,
    name: Option<&str>,
    slice: Option<&str>,
    bins: usize,
    read: &ReadOptions,
) -> Result<String, String> {
    if bins == 0 || bins > MAX_BINS {
        return Err(format!(
            "--bins {bins}: a histogram has 1 to {MAX_BINS} bins (one line each)"
        ));
    }
    let side = Side::open(path, read)?;
    if !side.is_folder() {
        return show_file(path, &path.display().to_string(), name, slice, bins, read);
    }
    let Some(name) = name else {
        return list(&side, read);
    };
    // The file whose key is the name, or the longest key the name starts with, then `/tensor`.
    let exact = side.files.iter().find(|(k, _)| k == name);
    let within = side
        .files
        .iter()
        .filter(|(k, _)| name.starts_with(&format!("{k}/")))
        .max_by_key(|(k, _)| k.len());
    match (exact, within) {
        (Some((_, file)), _) => show_file(file, &side.shown(file), None, slice, bins, read),
        (None, Some((k, file))) => show_file(
            file,
            &side.shown(file),
            Some(&name[k.len() + 1..]),
            slice,
            bins,
            read,
        ),
        (None, None) => {
            let close: Vec<String> = side
                .files
                .iter()
                .map(|(k, _)| k)
                .filter(|k| k.contains(name) || name.contains(k.as_str()))
                .take(5)
                .map(|k| format!("`{k}`"))
                .collect();
            Err(format!(
                "{} ({}) has no tensor file `{name}`{}; it has {} tensor files: name one by its \
                 path without the extension (list them with `golden show {}`)",
                path.display(),
                side.describe(),
                if close.is_empty() {
                    String::new()
                } else {
                    format!(" (did you mean {}?)", close.join(", "))
                },
                side.files.len(),
                path.display()
            ))
        }
    }
}

/// The tensors of a folder or archive, file by file, reading none.
fn list(side: &Side, read: &ReadOptions) -> Result<String, String> {
    let mut out = Lines::default();
    let mut rows: Vec<(String, String, String, String)> = Vec::new();
    let mut skipped = Vec::new();
    for (key, file) in &side.files {
        match read.open(file) {
            Ok(f) => {
                let one = f.entries().len() == 1;
                for e in f.entries() {
                    let bytes = (e.numel() as u64).saturating_mul(e.dtype.size() as u64);
                    let name = if one {
                        key.clone()
                    } else {
                        format!("{key}/{}", e.name)
                    };
                    rows.push((
                        shown(&name).into_owned(),
                        e.dtype.name().to_string(),
                        format!("{:?}", e.shape),
                        golden_files::budget::size(bytes),
                    ));
                }
                skipped.extend(f.skipped().iter().map(|k| format!("{key}: {k}")));
            }
            Err(e) => rows.push((
                shown(key).into_owned(),
                "-".into(),
                format!("ERROR {e}"),
                String::new(),
            )),
        }
    }
    rows.sort_by(|x, y| crate::natural::compare(&x.0, &y.0));
    out.line(format_args!(
        "{} ({}): {} tensors in {} files (name one to see it)",
        side.origin.display(),
        side.describe(),
        rows.len(),
        side.files.len()
    ));
    let width = rows
        .iter()
        .map(|r| r.0.chars().count())
        .max()
        .unwrap_or(4)
        .min(60);
    for (name, dtype, shape, bytes) in rows {
        out.line(format_args!(
            "  {name:<width$}  {dtype:<5} {shape:<16} {bytes}"
        ));
    }
    if !skipped.is_empty() {
        out.line(format_args!(
            "  skipped, not tensors: {}",
            skipped.join(", ")
        ));
    }
    for note in &side.notes {
        out.line(format_args!("  note: {note}"));
    }
    Ok(out.into_string())
}

/// Show one file's tensor (or list the file's tensors); `label` names the file in messages.
fn show_file(
    path: &Path,
    label: &str,
    name: Option<&str>,
    slice: Option<&str>,
    bins: usize,
    read: &ReadOptions,
) -> Result<String, String> {
    let spec = slice.map(parse_slice).transpose()?;
    let mut file = read
        .open(path)
        .map_err(|e| e.replace(&path.display().to_string(), &shown(label)))?;
    let mut out = Lines::default();
    let skipped: Vec<String> = file
        .skipped()
        .iter()
        .map(|k| shown(&k.to_string()).into_owned())
        .collect();
    let entries = file.entries();
    if entries.is_empty() {
        return Err(format!(
            "{}: no tensors{}",
            shown(label),
            if skipped.is_empty() {
                String::new()
            } else {
                format!(" (it holds {})", skipped.join(", "))
            }
        ));
    }
    let chosen = match name {
        Some(n) => Some(file.find(n).ok_or_else(|| {
            let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
            let close: Vec<String> = names
                .iter()
                .copied()
                .filter(|t| t.contains(n) || n.contains(t))
                .take(5)
                .map(|t| shown(t).into_owned())
                .collect();
            let names: Vec<String> = names.iter().map(|t| shown(t).into_owned()).collect();
            format!(
                "{} has no tensor `{}`{}; it has {} tensors{}",
                shown(label),
                shown(n),
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
        })?),
        None if entries.len() == 1 => Some(0),
        None => None,
    };
    let Some(index) = chosen else {
        // Several tensors: list them, reading none.
        out.line(format_args!(
            "{}: {} tensors (name one to see it)",
            shown(label),
            entries.len()
        ));
        let names: Vec<String> = entries
            .iter()
            .map(|e| shown(&e.name).into_owned())
            .collect();
        let width = names
            .iter()
            .map(|n| n.chars().count())
            .max()
            .unwrap_or(4)
            .min(60);
        for (e, name) in entries.iter().zip(&names) {
            let bytes = (e.numel() as u64).saturating_mul(e.dtype.size() as u64);
            out.line(format_args!(
                "  {:<width$}  {:<5} {:<16} {}",
                name,
                e.dtype.name(),
                format!("{:?}", e.shape),
                golden_files::budget::size(bytes)
            ));
        }
        if !skipped.is_empty() {
            out.line(format_args!(
                "  skipped, not tensors: {}",
                skipped.join(", ")
            ));
        }
        return Ok(out.into_string());
    };
    let tname = shown(&entries[index].name).into_owned();
    let t = file
        .load(index)
        .map_err(|e| format!("{}: {e}", shown(label)))?;
    let s = summarise(&t);
    out.line(format_args!(
        "{tname}: {} {:?} ({} elements) from {}",
        t.dtype.name(),
        t.shape,
        s.count,
        shown(label)
    ));
    if s.finite > 0 {
        out.line(format_args!(
            "  min {}  max {}  mean {}  std {}",
            num(s.min),
            num(s.max),
            num(s.mean),
            num(s.std)
        ));
    }
    out.line(format_args!(
        "  NaN {}  +Inf {}  -Inf {}  zeros {}",
        s.nan, s.pos_inf, s.neg_inf, s.zeros
    ));
    out.line(format_args!("histogram of the finite values:"));
    out.lines(&histogram(&t, bins));
    match (slice, spec) {
        (Some(text), Some(spec)) => {
            let selection = select(&t.shape, &spec)?;
            out.line(format_args!("values [{text}]:"));
            out.line(format_args!("  {}", render(&t, &selection, 1000)));
        }
        _ => {
            let shown = t.numel().min(10);
            let first: Vec<String> = (0..shown).map(|i| num(t.f64_at(i))).collect();
            out.line(format_args!(
                "first {shown} values (flat; --slice picks others): {}",
                first.join(", ")
            ));
        }
    }
    if !skipped.is_empty() {
        out.line(format_args!(
            "the file also holds, not tensors: {}",
            skipped.join(", ")
        ));
    }
    Ok(out.into_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picked(start: usize, step: usize, count: usize, kept: bool) -> Picked {
        Picked {
            start,
            step,
            count,
            kept,
        }
    }

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
        assert_eq!(sel[0], picked(0, 1, 1, false));
        assert_eq!(sel[2], picked(1, 1, 2, true));
        assert_eq!(sel[3], picked(0, 2, 3, true));
        assert_eq!(
            select(&[4], &parse_slice("-1").unwrap()).unwrap()[0].start,
            3
        );
        assert!(select(&[4], &parse_slice("4").unwrap()).is_err());
        assert!(parse_slice("1:2:0").is_err());
        assert!(parse_slice("a").is_err());
        assert_eq!(
            select(&[10], &parse_slice("-3:100:2").unwrap()).unwrap()[0],
            picked(7, 2, 2, true)
        );
    }

    #[test]
    fn a_selection_of_a_huge_axis_takes_no_memory() {
        // A list of the indices of an axis of 2^40 would take 8 TiB.
        let sel = select(&[1 << 40, 3], &parse_slice(":, -1").unwrap()).unwrap();
        assert_eq!(sel, [picked(0, 1, 1 << 40, true), picked(2, 1, 1, false)]);
        let sel = select(&[1 << 40], &parse_slice("::1000000000000").unwrap()).unwrap();
        assert_eq!(sel[0].count, 2);
    }

    #[test]
    fn a_slice_renders_nested_values() {
        let t = HostTensor::from_f64(vec![2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let sel = select(&t.shape, &parse_slice(":, 1:").unwrap()).unwrap();
        assert_eq!(render(&t, &sel, 100), "[[1, 2], [4, 5]]");
        let sel = select(&t.shape, &parse_slice("1").unwrap()).unwrap();
        assert_eq!(render(&t, &sel, 100), "[3, 4, 5]");
        let sel = select(&t.shape, &[]).unwrap();
        assert_eq!(
            render(&t, &sel, 4),
            "[[0, 1, 2], [3, …]]  (6 values, 4 shown)"
        );
        let scalar = HostTensor::from_f64(vec![], &[7.5]);
        assert_eq!(render(&scalar, &select(&[], &[]).unwrap(), 100), "7.5");
    }

    #[test]
    fn statistics_and_the_histogram_count_every_value_in_chunks() {
        let mut values = vec![0.0, 0.1, 0.9, 1.0, f64::NAN, f64::INFINITY];
        // Over several chunks: the streamed figures are those of the whole.
        values.extend((0..3 * CHUNK).map(|i| (i % 4) as f64 * 0.25));
        let t = HostTensor::from_f64(vec![values.len()], &values);
        let s = summarise(&t);
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        let mean = finite.iter().sum::<f64>() / finite.len() as f64;
        let var = finite.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / finite.len() as f64;
        assert_eq!(
            (s.count, s.finite, s.nan, s.pos_inf),
            (values.len(), finite.len(), 1, 1)
        );
        assert!((s.mean - mean).abs() < 1e-12 && (s.std - var.sqrt()).abs() < 1e-12);
        assert_eq!((s.min, s.max), (0.0, 1.0));
        let h = histogram(&t, 2);
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
        assert_eq!(counts, [2 + 2 * 3 * CHUNK / 4, 2 + 2 * 3 * CHUNK / 4]);
    }
}
