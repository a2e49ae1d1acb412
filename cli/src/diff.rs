//! `golden diff A B`: compare two tensor files, or two folders of them, tensor by tensor, and name
//! the first that differs. A is the reference, B the candidate.
//!
//! The order is the dumps' own where they carry one — a manifest beside them ([`MANIFEST`], which
//! golden writes beside its trace dumps), or names that each carry a number of their own
//! (`000_tok`, `001_…`) — else the natural order of the names (`natural.rs`), in which only layer
//! numbers are an order and stage names a guess. The first divergence is stated only when it is
//! known; otherwise the diff says that the order is a guess and lists the differing tensors any
//! of which may be first.
//!
//! Folders are paired file by file (same relative path, whatever the extension: `a/0_attn.npy`
//! with `b/0_attn.pth`), then tensors inside a pair of files by name (a file holding one tensor
//! pairs with the other side's one tensor). Pairs of files are read and compared on several
//! threads; each file is read once, and of it only one pair of tensors at a time, within the
//! file's read budget (`read.rs`). The comparison goes in chunks, so tensors of different dtypes
//! are never copied whole. What a file holds that is not a tensor is named, and so are the
//! symlinks to folders the walk does not follow (`walk.rs`).

use crate::read::ReadOptions;
use crate::shown::{self, shown};
use golden::describe::layer::Tol;
use golden::judge::compare::{self, Element, Expected, Rule, Verdict};
use golden_files::formats::{Skipped, TensorFile};
use golden_files::{HostTensor, ReadError, WireDType};
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

/// Something a file holds that is not a tensor, and was skipped.
#[derive(Clone, Debug)]
pub struct SkippedIn {
    /// Which side: `A` or `B`.
    pub side: &'static str,
    /// The file.
    pub file: PathBuf,
    /// What was skipped.
    pub skipped: Skipped,
}

/// The whole diff.
pub struct Diff {
    pub a: PathBuf,
    pub b: PathBuf,
    /// The rows, in the dumps' own order where they carry one, else in natural order.
    pub rows: Vec<Row>,
    pub tolerance: Tolerance,
    /// What the files hold that is not a tensor.
    pub skipped: Vec<SkippedIn>,
    /// Symlinked folders that were not followed, and why.
    pub notes: Vec<String>,
    /// Where the order of the rows comes from.
    pub order: Order,
    /// The rows (indices) that differ and that no other differing row is known to precede: the
    /// first divergence is one of them. One: it is known; more: the order between them is a guess.
    candidates: Vec<usize>,
}

/// The name of the manifest a dump folder may carry: the tensors' names (paths relative to the
/// folder, extensions optional), one a line, in the order they were computed. golden writes one
/// beside its trace dumps; a dumping script can write its own.
pub const MANIFEST: &str = "order.txt";

/// Where the order of a diff's rows comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Order {
    /// A manifest beside the dumps ([`MANIFEST`]).
    Manifest(PathBuf),
    /// The names' own numbers (`000_tok`, `001_blocks.0.ln1`, …: each a different number).
    Numbered,
    /// Natural order: layer numbers are an order, the stages within a layer a guess from usual
    /// names (`natural.rs`).
    Guessed,
}

impl Order {
    fn describe(&self) -> String {
        match self {
            Order::Manifest(path) => format!("in the order of {}", shown::path(path)),
            Order::Numbered => "in the order of their numbers".into(),
            Order::Guessed => {
                "in natural order (layer numbers, then stage names: a guess where the names carry \
                 no order)"
                    .into()
            }
        }
    }

    fn json(&self) -> Json {
        match self {
            Order::Manifest(path) => json!({"from": "manifest", "manifest": path}),
            Order::Numbered => json!({"from": "numbers"}),
            Order::Guessed => json!({"from": "names (guessed)"}),
        }
    }
}

/// The most a manifest may hold (it is a list of names).
const MANIFEST_LIMIT: u64 = 64 << 20;

/// The positions a manifest gives names: the first line naming one wins; a line may carry a
/// tensor file's extension.
fn read_manifest(path: &Path) -> Result<std::collections::HashMap<String, u128>, String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MANIFEST_LIMIT).read_to_string(&mut text))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut positions = std::collections::HashMap::new();
    for (i, line) in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .enumerate()
    {
        let name = match line.rsplit_once('.') {
            Some((stem, x)) if EXTENSIONS.contains(&x.to_ascii_lowercase().as_str()) => stem,
            _ => line,
        };
        positions.entry(name.to_string()).or_insert(i as u128);
    }
    Ok(positions)
}

/// Each row's position in the dumps' own order, and where that order comes from: A's manifest,
/// else B's, else the names' numbers when they number the rows (each a different number).
fn dump_order(
    a: &Path,
    b: &Path,
    rows: &[Row],
    notes: &mut Vec<String>,
) -> (Order, Vec<Option<u128>>) {
    for dir in [a, b] {
        let path = dir.join(MANIFEST);
        if !dir.is_dir() || !path.is_file() {
            continue;
        }
        match read_manifest(&path) {
            Ok(positions) => {
                let of: Vec<Option<u128>> = rows
                    .iter()
                    .map(|r| positions.get(&r.name).copied())
                    .collect();
                let missing = of.iter().filter(|p| p.is_none()).count();
                if missing > 0 {
                    notes.push(format!(
                        "{} does not name {missing} of the {} tensors: their order is a guess",
                        path.display(),
                        rows.len()
                    ));
                }
                return (Order::Manifest(path), of);
            }
            Err(e) => notes.push(format!("{e}: not read, the order is a guess")),
        }
    }
    let numbers: Vec<Option<u128>> = rows
        .iter()
        .map(|r| crate::natural::leading_number(r.name.rsplit('/').next().unwrap_or(&r.name)))
        .collect();
    let mut seen: Vec<u128> = numbers.iter().flatten().copied().collect();
    let numbered = seen.len();
    seen.sort_unstable();
    seen.dedup();
    if numbered >= 2 && seen.len() == numbered {
        (Order::Numbered, numbers)
    } else {
        (Order::Guessed, vec![None; rows.len()])
    }
}

/// Whether a row differs (in values or shape): a divergence.
fn diverges(r: &Row) -> bool {
    matches!(&r.outcome, Outcome::Compared(s) if s.mismatched > 0)
        || matches!(r.outcome, Outcome::Shape)
}

/// The differing rows that no other differing row is known to precede (by the dumps' positions,
/// or by layer numbers: `natural::certainly_before`). `rows` are sorted; a row is dropped only
/// when a candidate certainly precedes it, so the list may hold more than the true first, never
/// less.
fn candidates(rows: &[Row], positions: &[Option<u128>]) -> Vec<usize> {
    let before = |e: usize, d: usize| match (positions[e], positions[d]) {
        (Some(x), Some(y)) => x < y,
        _ => crate::natural::certainly_before(&rows[e].name, &rows[d].name),
    };
    let mut out: Vec<usize> = Vec::new();
    for d in (0..rows.len()).filter(|&i| diverges(&rows[i])) {
        if !out.iter().any(|&c| before(c, d)) {
            out.push(d);
        }
    }
    out
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

/// What comparing one pair of files found.
struct FileResult {
    rows: Vec<Row>,
    skipped: Vec<SkippedIn>,
}

fn error_row(name: String, e: String) -> Row {
    Row {
        name,
        a: None,
        b: None,
        outcome: Outcome::Error(e),
    }
}

/// A file that went over its read budget, and the pairs left uncompared.
struct Over {
    file: PathBuf,
    /// The tensor that went over.
    at: String,
    /// The first pair left: its row's name and sides.
    next: Option<(String, Side, Side)>,
    left: usize,
}

/// A side of a row: shape and dtype.
type Side = Option<(Vec<usize>, WireDType)>;

/// Compare one pair of files into rows, reading one pair of tensors at a time.
fn compare_files(
    key: &str,
    a: Option<&Path>,
    b: Option<&Path>,
    tol: Tolerance,
    read: &ReadOptions,
) -> FileResult {
    let open = |p: Option<&Path>| p.map(|p| read.open(p)).transpose();
    let (mut fa, mut fb) = match (open(a), open(b)) {
        (Ok(fa), Ok(fb)) => (fa, fb),
        (Err(e), _) | (_, Err(e)) => {
            let name = if key.is_empty() {
                "(files)".into()
            } else {
                key.into()
            };
            return FileResult {
                rows: vec![error_row(name, e)],
                skipped: Vec::new(),
            };
        }
    };
    let mut skipped = Vec::new();
    for (side, f) in [("A", &fa), ("B", &fb)] {
        if let Some(f) = f {
            skipped.extend(f.skipped().iter().map(|s| SkippedIn {
                side,
                file: f.path().to_path_buf(),
                skipped: s.clone(),
            }));
        }
    }
    let names = |f: &Option<TensorFile>| -> Vec<(String, Vec<usize>, WireDType)> {
        f.as_ref().map_or_else(Vec::new, |f| {
            f.entries()
                .iter()
                .map(|e| (e.name.clone(), e.shape.clone(), e.dtype))
                .collect()
        })
    };
    let (ea, eb) = (names(&fa), names(&fb));
    // Pairs of (row name, index in A, index in B).
    let mut pairs: Vec<(String, Option<usize>, Option<usize>)> = Vec::new();
    if ea.len() == 1 && eb.len() == 1 {
        // One tensor on each side: a pair, whatever their names (two .npy files of different
        // stems).
        let name = if key.is_empty() {
            if ea[0].0 == eb[0].0 {
                ea[0].0.clone()
            } else {
                format!("{} / {}", ea[0].0, eb[0].0)
            }
        } else {
            key.to_string()
        };
        pairs.push((name, Some(0), Some(0)));
    } else {
        let single_file_key = |name: &str, one: bool| {
            if one && !key.is_empty() {
                key.to_string()
            } else {
                join(key, name)
            }
        };
        for (i, (name, _, _)) in ea.iter().enumerate() {
            match eb.iter().position(|(n, _, _)| n == name) {
                Some(j) => pairs.push((join(key, name), Some(i), Some(j))),
                None => pairs.push((single_file_key(name, ea.len() == 1), Some(i), None)),
            }
        }
        for (j, (name, _, _)) in eb.iter().enumerate() {
            if !ea.iter().any(|(n, _, _)| n == name) {
                pairs.push((single_file_key(name, eb.len() == 1), None, Some(j)));
            }
        }
    }
    let mut rows = Vec::new();
    // A file over its budget is read no further: the pairs left are counted, under the name of
    // the first of them.
    let mut over: [Option<Over>; 2] = [None, None];
    for (name, ia, ib) in pairs {
        let describe = |e: &Vec<(String, Vec<usize>, WireDType)>, i: Option<usize>| {
            i.map(|i| (e[i].1.clone(), e[i].2))
        };
        let (da, db) = (describe(&ea, ia), describe(&eb, ib));
        let (Some(i), Some(j)) = (ia, ib) else {
            rows.push(Row {
                name,
                a: da,
                b: db,
                outcome: Outcome::Only(ia.is_some()),
            });
            continue;
        };
        if let Some(o) = over.iter_mut().flatten().next() {
            o.next
                .get_or_insert_with(|| (name.clone(), da.clone(), db.clone()));
            o.left += 1;
            continue;
        }
        let mut load = |f: &mut Option<TensorFile>, k: usize, side: usize| {
            let f = f.as_mut().expect("a file for each side of a pair");
            f.load(k).map_err(|e| {
                if matches!(e, ReadError::OverBudget(_)) {
                    over[side] = Some(Over {
                        file: f.path().to_path_buf(),
                        at: f.entries()[k].name.clone(),
                        next: None,
                        left: 0,
                    });
                }
                format!("{}: {e}", f.path().display())
            })
        };
        match load(&mut fa, i, 0).and_then(|ta| Ok((ta, load(&mut fb, j, 1)?))) {
            Ok((ta, tb)) => rows.push(compare_tensors(name, &ta, &tb, tol)),
            Err(e) => rows.push(Row {
                name,
                a: da,
                b: db,
                outcome: Outcome::Error(e),
            }),
        }
    }
    for o in over.into_iter().flatten() {
        if let Some((name, a, b)) = o.next {
            rows.push(Row {
                name,
                a,
                b,
                outcome: Outcome::Error(format!(
                    "{}: not compared{}: the file went over its read budget at `{}`",
                    o.file.display(),
                    match o.left - 1 {
                        0 => String::new(),
                        1 => ", nor the tensor after it".into(),
                        n => format!(", nor the {n} tensors after it"),
                    },
                    o.at
                )),
            });
        }
    }
    FileResult { rows, skipped }
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

/// Elements compared at a time: the chunks of mixed dtypes are the only copies.
const CHUNK: usize = 1 << 20;

/// Elements `start..start + len` of `t`, flat: a slice of its bytes, or an f64 copy.
fn chunk(t: &HostTensor, start: usize, len: usize, as_f64: bool) -> HostTensor {
    if as_f64 {
        let mut values = vec![0.0; len];
        t.read_f64_into(start, &mut values);
        return HostTensor::from_f64(vec![len], &values);
    }
    let size = t.dtype.size();
    HostTensor {
        dtype: t.dtype,
        shape: vec![len],
        data: t.data.slice(start * size..(start + len) * size),
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
    let mixed = a.dtype != b.dtype;
    let rule_dtype = if !mixed {
        a.dtype
    } else {
        match (a.dtype.is_float(), b.dtype.is_float()) {
            (true, true) => coarser(a.dtype, b.dtype),
            (true, false) => a.dtype,
            (false, true) => b.dtype,
            (false, false) => WireDType::I64,
        }
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
    let mut stats = moments(a, b);
    stats.rule = match rule {
        Rule::Exact => "exact".into(),
        Rule::Default { atol, rtol, .. } | Rule::Explicit(Tol { atol, rtol }) => format!(
            "atol {} + rtol {}·|A|",
            golden::describe::numbers::num(atol),
            golden::describe::numbers::num(rtol)
        ),
    };
    // Chunk by chunk; the figures that span chunks are merged, indices made whole again.
    let (n, mut start) = (a.numel(), 0);
    let (mut worst, mut worst_ratio, mut first_nonfinite): (Option<Element>, f64, Option<Element>) =
        (None, f64::NEG_INFINITY, None);
    while start < n {
        let len = CHUNK.min(n - start);
        let (ca, cb) = (chunk(a, start, len, mixed), chunk(b, start, len, mixed));
        let leaf = compare::compare_leaf(
            "",
            &cb,
            &Expected {
                value: &ca,
                rounding: None,
                precise: None,
            },
            if mixed { explicit } else { tol.explicit() },
            0.0,
        );
        if let Verdict::Values(v) = leaf.verdict {
            let whole = |mut e: Element| {
                e.index = compare::unravel(start + e.index.first().copied().unwrap_or(0), &a.shape);
                e
            };
            stats.nan = (stats.nan.0 + v.nan.0, stats.nan.1 + v.nan.1);
            stats.inf = (stats.inf.0 + v.inf.0, stats.inf.1 + v.inf.1);
            stats.mismatched += v.mismatched;
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
    stats.worst = first_nonfinite
        .or(worst)
        .filter(|_| stats.mismatched > 0)
        .map(|e| (e.index, e.reference, e.port));
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

/// Run the diff, each file within its read budget.
pub fn run(a: &Path, b: &Path, tolerance: Tolerance, read: &ReadOptions) -> Result<Diff, String> {
    // Neither a NaN nor a negative tolerance is one: either failed every element that was not
    // exactly equal.
    for (option, value) in [("--atol", tolerance.atol), ("--rtol", tolerance.rtol)] {
        if let Some(v) = value.filter(|v| !(v.is_finite() && *v >= 0.0)) {
            return Err(format!(
                "{option} {v}: a tolerance is a finite number, 0 or more"
            ));
        }
    }
    let mut notes = Vec::new();
    let pairs = pair_files(a, b, &mut notes)?;
    let total = pairs.len();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<(Vec<Row>, Vec<SkippedIn>)> = Mutex::new((Vec::new(), Vec::new()));
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
                let found = compare_files(key, fa.as_deref(), fb.as_deref(), tolerance, read);
                let mut results = results.lock().unwrap();
                results.0.extend(found.rows);
                results.1.extend(found.skipped);
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
    let (mut rows, mut skipped) = results.into_inner().unwrap();
    // The dumps' own order where they carry one (a manifest, numbered names), the rows it does not
    // place after them in natural order.
    rows.sort_by(|x, y| crate::natural::compare(&x.name, &y.name));
    let (order, positions) = dump_order(a, b, &rows, &mut notes);
    let mut placed: Vec<(Option<u128>, Row)> = positions.into_iter().zip(rows).collect();
    placed.sort_by(|(p, _), (q, _)| match (p, q) {
        (Some(p), Some(q)) => p.cmp(q),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    let (positions, rows): (Vec<Option<u128>>, Vec<Row>) = placed.into_iter().unzip();
    let candidates = candidates(&rows, &positions);
    skipped.sort_by(|x, y| (x.side, &x.file).cmp(&(y.side, &y.file)));
    Ok(Diff {
        a: a.to_path_buf(),
        b: b.to_path_buf(),
        rows,
        tolerance,
        skipped,
        notes,
        order,
        candidates,
    })
}

impl Diff {
    /// The first tensor both sides have and that differs, in values or shape — when it is known:
    /// the dumps carry their order, or no other differing tensor could have come before it. When
    /// the order between several is a guess, `None`: see [`Diff::divergence_candidates`].
    pub fn first_divergence(&self) -> Option<(usize, &Row)> {
        match self.candidates.as_slice() {
            [one] => Some((*one, &self.rows[*one])),
            _ => None,
        }
    }

    /// The differing tensors any of which may be the first divergence, in the order shown (one
    /// when it is known; none when nothing differs).
    pub fn divergence_candidates(&self) -> Vec<(usize, &Row)> {
        self.candidates
            .iter()
            .map(|&i| (i, &self.rows[i]))
            .collect()
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
            "golden diff: {} (A, reference) against {} (B); {} tensors {}; tolerance: {tol}",
            shown::path(&self.a),
            shown::path(&self.b),
            self.rows.len(),
            self.order.describe()
        );
        // Names as they are shown: control characters escaped (`shown.rs`).
        let names: Vec<String> = self
            .rows
            .iter()
            .map(|r| shown(&r.name).into_owned())
            .collect();
        let width = names
            .iter()
            .map(|n| n.chars().count())
            .max()
            .unwrap_or(4)
            .clamp(4, 60);
        let _ = writeln!(
            s,
            "{:>5}  {:<width$}  {:<16} {:<9} {:>9} {:>9} {:>9} {:>10} {:>7}  status",
            "#", "name", "shape", "dtype", "max|Δ|", "mean|Δ|", "max rel", "cosine", "NaN A/B"
        );
        let first = self.first_divergence().map(|(i, _)| i);
        let guessed = self.candidates.len() > 1;
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
            let name: String = if names[i].chars().count() > width {
                let tail: String = names[i].chars().rev().take(width - 1).collect();
                format!("…{}", tail.chars().rev().collect::<String>())
            } else {
                names[i].clone()
            };
            let status = match (&r.outcome, Some(i) == first) {
                (Outcome::Compared(st), _) if st.mismatched == 0 => "ok".to_string(),
                (Outcome::Compared(st), f) => format!(
                    "DIFFERS ({} of {}){}",
                    st.mismatched,
                    st.numel,
                    if f {
                        "  <- first divergence"
                    } else if guessed && self.candidates.contains(&i) {
                        "  <- first divergence?"
                    } else {
                        ""
                    }
                ),
                (Outcome::Shape, _) => format!("SHAPE {} vs {}", shape(&r.a), shape(&r.b)),
                (Outcome::Only(true), _) => "only in A".into(),
                (Outcome::Only(false), _) => "only in B".into(),
                (Outcome::Error(e), _) => format!("ERROR {}", shown(e)),
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
        // How a divergent row differs, after its name.
        let how = |r: &Row| -> String {
            match &r.outcome {
                Outcome::Compared(st) => {
                    let mut h = format!(
                        ": {} of {} elements differ, max |Δ| {}",
                        st.mismatched,
                        st.numel,
                        num(st.max_abs)
                    );
                    if let Some((index, x, y)) = &st.worst {
                        let _ = write!(
                            h,
                            "; furthest outside the tolerance at {index:?}: A {}, B {}",
                            num(*x),
                            num(*y)
                        );
                    }
                    let _ = write!(h, " (tolerance {})", st.rule);
                    h
                }
                Outcome::Shape => ": the shapes differ".into(),
                Outcome::Only(_) | Outcome::Error(_) => unreachable!("not a divergence"),
            }
        };
        match self.candidates.as_slice() {
            [] if self.all_match() => {
                let _ = writeln!(s, "all {} tensors match", self.rows.len());
            }
            [] => {
                let _ = writeln!(s, "no tensor both sides have differs");
            }
            [i] => {
                let r = &self.rows[*i];
                let _ = writeln!(
                    s,
                    "first divergence: `{}` (#{}){}",
                    names[*i],
                    i + 1,
                    how(r)
                );
            }
            several => {
                let _ = writeln!(
                    s,
                    "first divergence: not known. These names carry no order (no {MANIFEST} \
                     beside the dumps, no number of their own on each), and only layer numbers \
                     are taken as one: the first divergence is one of these {}, which golden \
                     cannot order:",
                    several.len()
                );
                for &i in several.iter().take(12) {
                    let r = &self.rows[i];
                    let _ = writeln!(s, "  `{}` (#{}){}", names[i], i + 1, how(r));
                }
                if several.len() > 12 {
                    let _ = writeln!(s, "  … and {} more", several.len() - 12);
                }
                let _ = writeln!(
                    s,
                    "  golden's guess from the usual stage names is `{}`; to know, dump with \
                     numbered names (`000_embed`, `001_…`) or write {MANIFEST} beside the dumps: \
                     their names, one a line, in the order they were computed",
                    names[several[0]]
                );
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
        // What the files hold that is not a tensor, file by file.
        let mut files: Vec<(&str, &Path)> = Vec::new();
        for k in &self.skipped {
            if !files.contains(&(k.side, k.file.as_path())) {
                files.push((k.side, &k.file));
            }
        }
        for (side, file) in files {
            let what: Vec<String> = self
                .skipped
                .iter()
                .filter(|k| k.side == side && k.file == file)
                .map(|k| shown(&k.skipped.to_string()).into_owned())
                .collect();
            let _ = writeln!(
                s,
                "skipped in {side} ({}), not tensors: {}",
                shown::path(file),
                what.join(", ")
            );
        }
        for note in &self.notes {
            let _ = writeln!(s, "note: {}", shown(note));
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
        let skipped: Vec<Json> = self
            .skipped
            .iter()
            .map(|k| {
                json!({"side": k.side, "file": k.file, "name": k.skipped.name, "what": k.skipped.what})
            })
            .collect();
        json!({
            "a": self.a,
            "b": self.b,
            "tensors": rows,
            "skipped": skipped,
            "notes": self.notes,
            // Null unless known; the candidates say among which it is when the order is a guess.
            "first_divergence": self.first_divergence().map(|(_, r)| r.name.clone()),
            "first_divergence_candidates": self
                .divergence_candidates()
                .iter()
                .map(|(_, r)| r.name.clone())
                .collect::<Vec<_>>(),
            "order": self.order.json(),
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
