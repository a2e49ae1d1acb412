//! `golden diff A B`: compare two tensor files, or two folders of them, tensor by tensor in natural
//! order (`natural.rs`), and name the first that differs. A is the reference, B the candidate.
//!
//! Folders are paired file by file (same relative path, whatever the extension: `a/0_attn.npy`
//! with `b/0_attn.pth`), then tensors inside a pair of files by name (a file holding one tensor
//! pairs with the other side's one tensor). Pairs of files are read and compared on several
//! threads; each file is read once. Symlinks to folders are followed, each real folder visited
//! once; the links that were not followed are named (`walk.rs`).

use golden::describe::layer::Tol;
use golden::judge::compare::{self, Expected, Rule, Verdict};
use golden_files::formats;
use golden_files::{HostTensor, WireDType};
use serde_json::{json, Value as Json};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The tolerance: explicit, or assert_close's default for each tensor's dtype.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: Option<f64>,
    /// Relative part.
    pub rtol: Option<f64>,
}

impl Tolerance {
    fn explicit(&self) -> Option<Tol> {
        match (self.atol, self.rtol) {
            (None, None) => None,
            (a, r) => Some(Tol {
                atol: a.unwrap_or(0.0),
                rtol: r.unwrap_or(0.0),
            }),
        }
    }
}

/// The figures of one pair of tensors.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub numel: usize,
    pub max_abs: f64,
    pub mean_abs: f64,
    pub max_rel: f64,
    pub mean_rel: f64,
    /// Cosine similarity of the two as flat vectors (NaN when either is all zeros).
    pub cosine: f64,
    pub nan: (usize, usize),
    pub inf: (usize, usize),
    pub mismatched: usize,
    /// The rule applied.
    pub rule: String,
    /// The element furthest outside its tolerance: index, A, B.
    pub worst: Option<(Vec<usize>, f64, f64)>,
}

/// What comparing one name found.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Compared element by element.
    Compared(Stats),
    /// The shapes differ.
    Shape,
    /// Only one side has it (`true`: only A).
    Only(bool),
    /// A file could not be read.
    Error(String),
}

/// One row of the diff.
#[derive(Clone, Debug)]
pub struct Row {
    pub name: String,
    pub a: Option<(Vec<usize>, WireDType)>,
    pub b: Option<(Vec<usize>, WireDType)>,
    pub outcome: Outcome,
}

impl Row {
    /// Whether the two sides agree.
    pub fn matches(&self) -> bool {
        matches!(&self.outcome, Outcome::Compared(s) if s.mismatched == 0)
    }

    fn status(&self) -> &'static str {
        match &self.outcome {
            Outcome::Compared(s) if s.mismatched == 0 => "match",
            Outcome::Compared(_) => "differ",
            Outcome::Shape => "shape",
            Outcome::Only(true) => "only_in_a",
            Outcome::Only(false) => "only_in_b",
            Outcome::Error(_) => "error",
        }
    }
}

/// The whole diff.
pub struct Diff {
    pub a: PathBuf,
    pub b: PathBuf,
    pub rows: Vec<Row>,
    pub tolerance: Tolerance,
    /// Symlinked folders that were not followed, and why.
    pub notes: Vec<String>,
}

const EXTENSIONS: &[&str] = &["npy", "npz", "safetensors", "pt", "pth", "bin"];

/// Tensor files under `dir`, by their path relative to it without the extension, and the
/// symlinks that were not followed (each real folder is visited once).
fn files_under(dir: &Path, notes: &mut Vec<String>) -> Result<Vec<(String, PathBuf)>, String> {
    let walk = crate::walk::files_under(dir, |path| {
        path.extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| EXTENSIONS.contains(&x.to_ascii_lowercase().as_str()))
    })?;
    notes.extend(
        walk.notes
            .into_iter()
            .map(|n| format!("in {}: {n}", dir.display())),
    );
    Ok(walk
        .files
        .into_iter()
        .map(|path| {
            let rel = path.strip_prefix(dir).unwrap_or(&path).with_extension("");
            (rel.to_string_lossy().replace('\\', "/"), path)
        })
        .collect())
}

/// Pairs of files to compare: (key, A's file, B's file).
type FilePair = (String, Option<PathBuf>, Option<PathBuf>);

fn pair_files(a: &Path, b: &Path, notes: &mut Vec<String>) -> Result<Vec<FilePair>, String> {
    for path in [a, b] {
        if let Err(e) = std::fs::metadata(path) {
            return Err(format!("{}: {e}", path.display()));
        }
    }
    match (a.is_dir(), b.is_dir()) {
        (false, false) => Ok(vec![(String::new(), Some(a.into()), Some(b.into()))]),
        (true, true) => {
            let (fa, fb) = (files_under(a, notes)?, files_under(b, notes)?);
            if fa.is_empty() && fb.is_empty() {
                return Err(format!(
                    "neither {} nor {} holds tensor files ({})",
                    a.display(),
                    b.display(),
                    EXTENSIONS.join(", ")
                ));
            }
            let in_b: std::collections::HashMap<&String, &PathBuf> =
                fb.iter().map(|(k, p)| (k, p)).collect();
            let in_a: std::collections::HashSet<&String> = fa.iter().map(|(k, _)| k).collect();
            let mut pairs: Vec<FilePair> = fa
                .iter()
                .map(|(k, p)| {
                    (
                        k.clone(),
                        Some(p.clone()),
                        in_b.get(k).map(|p| (*p).clone()),
                    )
                })
                .collect();
            for (k, p) in &fb {
                if !in_a.contains(k) {
                    pairs.push((k.clone(), None, Some(p.clone())));
                }
            }
            Ok(pairs)
        }
        _ => Err(format!(
            "compare two files or two folders: {} is a {} and {} a {}",
            a.display(),
            if a.is_dir() { "folder" } else { "file" },
            b.display(),
            if b.is_dir() { "folder" } else { "file" }
        )),
    }
}

fn join(key: &str, name: &str) -> String {
    if key.is_empty() {
        name.to_string()
    } else {
        format!("{key}/{name}")
    }
}

/// Compare one pair of files into rows.
fn compare_files(key: &str, a: Option<&Path>, b: Option<&Path>, tol: Tolerance) -> Vec<Row> {
    let read = |p: Option<&Path>| p.map(formats::read).transpose();
    let (ta, tb) = match (read(a), read(b)) {
        (Ok(ta), Ok(tb)) => (ta, tb),
        (Err(e), _) | (_, Err(e)) => {
            return vec![Row {
                name: if key.is_empty() {
                    "(files)".into()
                } else {
                    key.into()
                },
                a: None,
                b: None,
                outcome: Outcome::Error(e),
            }]
        }
    };
    let ta = ta.map(|c| c.tensors).unwrap_or_default();
    let tb = tb.map(|c| c.tensors).unwrap_or_default();
    let mut rows = Vec::new();
    let describe = |t: &HostTensor| (t.shape.clone(), t.dtype);
    // One tensor on each side: a pair, whatever their names (two .npy files of different stems).
    if ta.len() == 1 && tb.len() == 1 {
        let name = if key.is_empty() {
            if ta[0].0 == tb[0].0 {
                ta[0].0.clone()
            } else {
                format!("{} / {}", ta[0].0, tb[0].0)
            }
        } else {
            key.to_string()
        };
        rows.push(compare_tensors(name, &ta[0].1, &tb[0].1, tol));
        return rows;
    }
    let single_file_key = |name: &str, one: bool| {
        if one && !key.is_empty() {
            key.to_string()
        } else {
            join(key, name)
        }
    };
    for (name, t) in &ta {
        match tb.iter().find(|(n, _)| n == name) {
            Some((_, u)) => rows.push(compare_tensors(join(key, name), t, u, tol)),
            None => rows.push(Row {
                name: single_file_key(name, ta.len() == 1),
                a: Some(describe(t)),
                b: None,
                outcome: Outcome::Only(true),
            }),
        }
    }
    for (name, u) in &tb {
        if !ta.iter().any(|(n, _)| n == name) {
            rows.push(Row {
                name: single_file_key(name, tb.len() == 1),
                a: None,
                b: Some(describe(u)),
                outcome: Outcome::Only(false),
            });
        }
    }
    rows
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

/// The less precise of two float dtypes (the tolerance is that dtype's, in either order).
fn coarser(a: WireDType, b: WireDType) -> WireDType {
    if precision(a) <= precision(b) {
        a
    } else {
        b
    }
}

fn compare_tensors(name: String, a: &HostTensor, b: &HostTensor, tol: Tolerance) -> Row {
    let mut row = Row {
        name,
        a: Some((a.shape.clone(), a.dtype)),
        b: Some((b.shape.clone(), b.dtype)),
        outcome: Outcome::Shape,
    };
    if a.shape != b.shape {
        return row;
    }
    // Different dtypes (f32 against f64, i64 against u8) are compared as f64 values, with the
    // coarser float dtype's tolerance.
    let (a64, b64);
    let (ra, rb, rule_dtype) = if a.dtype == b.dtype {
        (a, b, a.dtype)
    } else {
        a64 = HostTensor::from_f64(a.shape.clone(), &a.to_f64());
        b64 = HostTensor::from_f64(b.shape.clone(), &b.to_f64());
        let dtype = match (a.dtype.is_float(), b.dtype.is_float()) {
            (true, true) => coarser(a.dtype, b.dtype),
            (true, false) => a.dtype,
            (false, true) => b.dtype,
            (false, false) => WireDType::I64,
        };
        (&a64, &b64, dtype)
    };
    let rule = Rule::for_leaf(rule_dtype, tol.explicit(), 0.0);
    // The f64 copies of mixed dtypes get the coarser dtype's rule, spelled out.
    let explicit = match rule {
        Rule::Default { atol, rtol, .. } | Rule::Explicit(Tol { atol, rtol }) => {
            Some(Tol { atol, rtol })
        }
        Rule::Exact => Some(Tol {
            atol: 0.0,
            rtol: 0.0,
        }),
    };
    let leaf = compare::compare_leaf(
        "",
        rb,
        &Expected {
            value: ra,
            rounding: None,
            precise: None,
        },
        if a.dtype == b.dtype {
            tol.explicit()
        } else {
            explicit
        },
        0.0,
    );
    let mut stats = moments(ra, rb);
    stats.rule = match rule {
        Rule::Exact => "exact".into(),
        Rule::Default { atol, rtol, .. } | Rule::Explicit(Tol { atol, rtol }) => format!(
            "atol {} + rtol {}·|A|",
            golden::describe::numbers::num(atol),
            golden::describe::numbers::num(rtol)
        ),
    };
    if let Verdict::Values(v) = &leaf.verdict {
        stats.nan = v.nan;
        stats.inf = v.inf;
        stats.mismatched = v.mismatched;
        stats.worst = v
            .first_nonfinite_mismatch
            .as_ref()
            .or(v.worst.as_ref())
            .filter(|_| v.mismatched > 0)
            .map(|e| (e.index.clone(), e.reference, e.port));
    }
    row.outcome = Outcome::Compared(stats);
    row
}

/// max/mean absolute and relative difference and cosine similarity, over finite pairs.
fn moments(a: &HostTensor, b: &HostTensor) -> Stats {
    const CHUNK: usize = 4096;
    let n = a.numel();
    let (mut x, mut y) = (vec![0.0; CHUNK], vec![0.0; CHUNK]);
    let (mut sum_abs, mut sum_rel, mut max_abs, mut max_rel) = (0.0, 0.0, 0.0f64, 0.0f64);
    let (mut dot, mut nx, mut ny, mut finite, mut rel_count) = (0.0, 0.0, 0.0, 0usize, 0usize);
    let mut start = 0;
    while start < n {
        let len = CHUNK.min(n - start);
        a.read_f64_into(start, &mut x[..len]);
        b.read_f64_into(start, &mut y[..len]);
        for k in 0..len {
            let (p, q) = (x[k], y[k]);
            if !(p.is_finite() && q.is_finite()) {
                continue;
            }
            finite += 1;
            let d = (p - q).abs();
            sum_abs += d;
            max_abs = max_abs.max(d);
            if p != 0.0 {
                let r = d / p.abs();
                sum_rel += r;
                rel_count += 1;
                max_rel = max_rel.max(r);
            } else if d > 0.0 {
                max_rel = f64::INFINITY;
            }
            dot += p * q;
            nx += p * p;
            ny += q * q;
        }
        start += len;
    }
    Stats {
        numel: n,
        max_abs,
        mean_abs: if finite > 0 {
            sum_abs / finite as f64
        } else {
            0.0
        },
        max_rel,
        mean_rel: if rel_count > 0 {
            sum_rel / rel_count as f64
        } else {
            0.0
        },
        cosine: if nx > 0.0 && ny > 0.0 {
            dot / (nx.sqrt() * ny.sqrt())
        } else if nx == 0.0 && ny == 0.0 {
            1.0
        } else {
            f64::NAN
        },
        ..Stats::default()
    }
}

/// Run the diff.
pub fn run(a: &Path, b: &Path, tolerance: Tolerance) -> Result<Diff, String> {
    let mut notes = Vec::new();
    let pairs = pair_files(a, b, &mut notes)?;
    let total = pairs.len();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Row>> = Mutex::new(Vec::new());
    let progress = total > 8 && std::io::stderr().is_terminal();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(total.max(1));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some((key, fa, fb)) = pairs.get(i) else {
                    break;
                };
                let rows = compare_files(key, fa.as_deref(), fb.as_deref(), tolerance);
                results.lock().unwrap().extend(rows);
                let d = done.fetch_add(1, Ordering::SeqCst) + 1;
                if progress {
                    eprint!("\rgolden diff: {d}/{total} files compared");
                }
            });
        }
    });
    if progress {
        eprintln!();
    }
    let mut rows = results.into_inner().unwrap();
    rows.sort_by(|x, y| crate::natural::compare(&x.name, &y.name));
    Ok(Diff {
        a: a.to_path_buf(),
        b: b.to_path_buf(),
        rows,
        tolerance,
        notes,
    })
}

impl Diff {
    /// The first tensor (in natural order) both sides have and that differs, in values or shape.
    pub fn first_divergence(&self) -> Option<(usize, &Row)> {
        self.rows.iter().enumerate().find(|(_, r)| {
            matches!(&r.outcome, Outcome::Compared(s) if s.mismatched > 0)
                || matches!(r.outcome, Outcome::Shape)
        })
    }

    /// Whether every tensor is on both sides and matches.
    pub fn all_match(&self) -> bool {
        self.rows.iter().all(Row::matches)
    }

    /// Whether a file could not be read.
    pub fn has_errors(&self) -> bool {
        self.rows
            .iter()
            .any(|r| matches!(r.outcome, Outcome::Error(_)))
    }

    /// The table, the first divergence and the summary.
    pub fn text(&self) -> String {
        use std::fmt::Write as _;
        let num = |x: f64| golden::describe::numbers::num(x);
        let mut s = String::new();
        let tol = match self.tolerance.explicit() {
            Some(t) => format!("atol {} + rtol {}·|A|", num(t.atol), num(t.rtol)),
            None => "torch.testing.assert_close's default for each dtype".into(),
        };
        let _ = writeln!(
            s,
            "golden diff: {} (A, reference) against {} (B); {} tensors in natural order; \
             tolerance: {tol}",
            self.a.display(),
            self.b.display(),
            self.rows.len()
        );
        let width = self
            .rows
            .iter()
            .map(|r| r.name.chars().count())
            .max()
            .unwrap_or(4)
            .clamp(4, 60);
        let _ = writeln!(
            s,
            "{:>5}  {:<width$}  {:<16} {:<9} {:>9} {:>9} {:>9} {:>10} {:>7}  status",
            "#", "name", "shape", "dtype", "max|Δ|", "mean|Δ|", "max rel", "cosine", "NaN A/B"
        );
        let first = self.first_divergence().map(|(i, _)| i);
        for (i, r) in self.rows.iter().enumerate() {
            let shape = |x: &Option<(Vec<usize>, WireDType)>| {
                x.as_ref().map_or("-".into(), |(s, _)| format!("{s:?}"))
            };
            let dtype = match (&r.a, &r.b) {
                (Some((_, x)), Some((_, y))) if x == y => x.name().to_string(),
                (Some((_, x)), Some((_, y))) => format!("{}/{}", x.name(), y.name()),
                (Some((_, x)), None) | (None, Some((_, x))) => x.name().to_string(),
                _ => "-".into(),
            };
            let name: String = if r.name.chars().count() > width {
                let tail: String = r.name.chars().rev().take(width - 1).collect();
                format!("…{}", tail.chars().rev().collect::<String>())
            } else {
                r.name.clone()
            };
            let status = match (&r.outcome, Some(i) == first) {
                (Outcome::Compared(st), _) if st.mismatched == 0 => "ok".to_string(),
                (Outcome::Compared(st), f) => format!(
                    "DIFFERS ({} of {}){}",
                    st.mismatched,
                    st.numel,
                    if f { "  <- first divergence" } else { "" }
                ),
                (Outcome::Shape, _) => format!("SHAPE {} vs {}", shape(&r.a), shape(&r.b)),
                (Outcome::Only(true), _) => "only in A".into(),
                (Outcome::Only(false), _) => "only in B".into(),
                (Outcome::Error(e), _) => format!("ERROR {e}"),
            };
            let figures = match &r.outcome {
                Outcome::Compared(st) => format!(
                    "{:>9} {:>9} {:>9} {:>10} {:>7}",
                    short(st.max_abs),
                    short(st.mean_abs),
                    short(st.max_rel),
                    format!("{:.7}", st.cosine),
                    format!("{}/{}", st.nan.0, st.nan.1)
                ),
                _ => format!("{:>9} {:>9} {:>9} {:>10} {:>7}", "", "", "", "", ""),
            };
            let _ = writeln!(
                s,
                "{:>5}  {name:<width$}  {:<16} {dtype:<9} {figures}  {status}",
                i + 1,
                shape(r.a.as_ref().map_or(&r.b, |_| &r.a)),
            );
        }
        match self.first_divergence() {
            None if self.all_match() => {
                let _ = writeln!(s, "all {} tensors match", self.rows.len());
            }
            None => {
                let _ = writeln!(s, "no tensor both sides have differs");
            }
            Some((i, r)) => {
                let _ = write!(s, "first divergence: `{}` (#{})", r.name, i + 1);
                match &r.outcome {
                    Outcome::Compared(st) => {
                        let _ = write!(
                            s,
                            ": {} of {} elements differ, max |Δ| {}",
                            st.mismatched,
                            st.numel,
                            num(st.max_abs)
                        );
                        if let Some((index, x, y)) = &st.worst {
                            let _ = write!(
                                s,
                                "; furthest outside the tolerance at {index:?}: A {}, B {}",
                                num(*x),
                                num(*y)
                            );
                        }
                        let _ = writeln!(s, " (tolerance {})", st.rule);
                    }
                    Outcome::Shape => {
                        let _ = writeln!(s, ": the shapes differ");
                    }
                    Outcome::Only(_) | Outcome::Error(_) => unreachable!("not a divergence"),
                }
            }
        }
        if !self.all_match() {
            {
                let count = |f: fn(&Row) -> bool| self.rows.iter().filter(|r| f(r)).count();
                let _ = writeln!(
                    s,
                    "{} tensors: {} match, {} differ, {} differ in shape, {} only in A, {} only \
                     in B, {} unreadable",
                    self.rows.len(),
                    count(Row::matches),
                    count(|r| matches!(&r.outcome, Outcome::Compared(st) if st.mismatched > 0)),
                    count(|r| matches!(r.outcome, Outcome::Shape)),
                    count(|r| matches!(r.outcome, Outcome::Only(true))),
                    count(|r| matches!(r.outcome, Outcome::Only(false))),
                    count(|r| matches!(r.outcome, Outcome::Error(_))),
                );
            }
        }
        for note in &self.notes {
            let _ = writeln!(s, "note: {note}");
        }
        s
    }

    /// The diff as JSON (`--json`).
    pub fn json(&self) -> Json {
        let finite = |x: f64| {
            if x.is_finite() {
                json!(x)
            } else {
                json!(x.to_string())
            }
        };
        let rows: Vec<Json> = self
            .rows
            .iter()
            .map(|r| {
                let side = |x: &Option<(Vec<usize>, WireDType)>| {
                    x.as_ref()
                        .map(|(s, d)| json!({"shape": s, "dtype": d.name()}))
                };
                let mut row = json!({
                    "name": r.name,
                    "status": r.status(),
                    "a": side(&r.a),
                    "b": side(&r.b),
                });
                match &r.outcome {
                    Outcome::Compared(st) => {
                        row["numel"] = json!(st.numel);
                        row["mismatched"] = json!(st.mismatched);
                        row["max_abs"] = finite(st.max_abs);
                        row["mean_abs"] = finite(st.mean_abs);
                        row["max_rel"] = finite(st.max_rel);
                        row["mean_rel"] = finite(st.mean_rel);
                        row["cosine"] = finite(st.cosine);
                        row["nan"] = json!([st.nan.0, st.nan.1]);
                        row["inf"] = json!([st.inf.0, st.inf.1]);
                        row["rule"] = json!(st.rule);
                        if let Some((index, x, y)) = &st.worst {
                            row["worst"] =
                                json!({"index": index, "a": finite(*x), "b": finite(*y)});
                        }
                    }
                    Outcome::Error(e) => row["error"] = json!(e),
                    _ => {}
                }
                row
            })
            .collect();
        json!({
            "a": self.a,
            "b": self.b,
            "tensors": rows,
            "notes": self.notes,
            "first_divergence": self.first_divergence().map(|(_, r)| r.name.clone()),
            "match": self.all_match(),
        })
    }
}

/// A figure in 2 significant digits for the table.
fn short(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if !x.is_finite() {
        format!("{x}")
    } else {
        format!("{x:.1e}")
    }
}
