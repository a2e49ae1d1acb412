//! `golden diff A B`: compare two tensor files, two folders or two archives of them (`.zip`,
//! `.tar`, `.tar.gz`), tensor by tensor, and name the first that differs. A is the reference, B
//! the candidate.
//!
//! The order is the dumps' own where they carry one — a manifest beside them ([`MANIFEST`], which
//! golden writes beside its trace dumps), or names that each carry a number of their own
//! (`000_tok`, `001_…`) — else the natural order of the names (`natural.rs`), in which only layer
//! numbers are an order and stage names a guess. The first divergence is stated only when it is
//! known; otherwise the diff says that the order is a guess and lists the differing tensors any
//! of which may be first.
//!
//! Folders and archives are paired file by file (`pairing.rs`: same relative path whatever the
//! extension, `a/0_attn.npy` with `b/0_attn.pth`; B's names mapped by `--map`; tensor-parallel
//! shards gathered), then tensors inside a pair of files by name (a file holding one tensor pairs
//! with the other side's one tensor). Pairs of files are read and compared on several threads;
//! each file is read once, and of it only one pair of tensors at a time, within the file's read
//! budget (`read.rs`). Each pair is compared by `pair.rs` — the engine the viewer shares — which
//! explains shapes that differ (reshaped, permuted, sharded) unless `--strict-shapes`. What a file
//! holds that is not a tensor is named, and so are the archive entries and the symlinks to
//! folders that are left out.
//!
//! A comparison that compared nothing is never a match: the diff says what each side holds and
//! why nothing paired ([`Diff::nothing_compared`]).

use crate::mapping::Mapping;
use crate::pair::Compared;
pub use crate::pair::{Explained, Options, Stats, Tolerance};
use crate::pairing::FilePair;
use crate::read::ReadOptions;
use crate::shown::{self, shown};
use crate::side::Side;
use golden_files::formats::{Skipped, TensorFile};
use golden_files::{HostTensor, ReadError, WireDType};
use serde_json::{json, Value as Json};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// What comparing one name found.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Compared element by element (under an explanation when the shapes differ).
    Compared(Box<Stats>),
    /// The shapes differ and nothing lines them up (or `--strict-shapes`): why.
    Shape(String),
    /// Only one side has it (`true`: only A).
    Only(bool),
    /// A file could not be read.
    Error(String),
}

/// Where a row's tensors are: each side's files (several: shards, in order) and the name of the
/// tensor in each. The viewer reads a pair's values again through it.
#[derive(Clone, Debug, Default)]
pub struct Source {
    /// A's files and tensor names.
    pub a: Vec<(PathBuf, String)>,
    /// B's files and tensor names.
    pub b: Vec<(PathBuf, String)>,
}

/// One row of the diff.
#[derive(Clone, Debug)]
pub struct Row {
    /// The name (A's, when a mapping renamed B's).
    pub name: String,
    /// A's shape and dtype (of its first shard, when it came in shards).
    pub a: Option<(Vec<usize>, WireDType)>,
    /// B's shape and dtype (of its first shard, when it came in shards).
    pub b: Option<(Vec<usize>, WireDType)>,
    /// What comparing found.
    pub outcome: Outcome,
    /// B's own name(s), when they differ from the row's (a mapping, shards).
    pub b_names: Vec<String>,
    /// The mapping rule that paired B's name with A's, if one did.
    pub rule: Option<String>,
    /// Where the tensors are.
    pub source: Source,
}

impl Row {
    /// Whether the two sides agree.
    pub fn matches(&self) -> bool {
        matches!(&self.outcome, Outcome::Compared(s) if s.mismatched == 0)
    }

    /// The row's status in the JSON and the page: `match`, `differ`, `shape`, `only_in_a`,
    /// `only_in_b` or `error`.
    pub fn status(&self) -> &'static str {
        match &self.outcome {
            Outcome::Compared(s) if s.mismatched == 0 => "match",
            Outcome::Compared(_) => "differ",
            Outcome::Shape(_) => "shape",
            Outcome::Only(true) => "only_in_a",
            Outcome::Only(false) => "only_in_b",
            Outcome::Error(_) => "error",
        }
    }

    /// How B was lined up with A, if the shapes differ.
    pub fn explained(&self) -> Option<&Explained> {
        match &self.outcome {
            Outcome::Compared(s) => s.explained.as_ref(),
            _ => None,
        }
    }
}

/// Something a file holds that is not a tensor, and was skipped.
#[derive(Clone, Debug)]
pub struct SkippedIn {
    /// Which side: `A` or `B`.
    pub side: &'static str,
    /// The file, as messages show it (an archive's entry as `archive.tar.gz:entry.pth`).
    pub file: PathBuf,
    /// What was skipped.
    pub skipped: Skipped,
}

/// What one side held, for the summary of a diff that compared nothing.
#[derive(Clone, Debug)]
pub struct Held {
    /// What the user gave.
    pub origin: PathBuf,
    /// `a folder`, `a .tar.gz archive`, `a file`.
    pub form: &'static str,
    /// Tensor files.
    pub files: usize,
    /// Tensors (and numbers) in them.
    pub tensors: usize,
    /// The first names of its rows.
    pub names: Vec<String>,
}

/// The whole diff.
pub struct Diff {
    /// A, as given.
    pub a: PathBuf,
    /// B, as given.
    pub b: PathBuf,
    /// The rows, in the dumps' own order where they carry one, else in natural order.
    pub rows: Vec<Row>,
    /// The tolerance.
    pub tolerance: Tolerance,
    /// What the files hold that is not a tensor.
    pub skipped: Vec<SkippedIn>,
    /// Archive entries left out and symlinked folders not followed, and why.
    pub notes: Vec<String>,
    /// Where the order of the rows comes from.
    pub order: Order,
    /// What each side held.
    pub held: [Held; 2],
    /// The rows (indices) that differ and that no other differing row is known to precede: the
    /// first divergence is one of them. One: it is known; more: the order between them is a guess.
    candidates: Vec<usize>,
}

/// The name of the manifest a dump folder may carry: the tensors' names (paths relative to the
/// folder, extensions optional), one a line, in the order they were computed. golden writes one
/// beside its trace dumps (the failure artifacts' own name for it); a dumping script can write
/// its own.
pub const MANIFEST: &str = golden::internal::report::artifacts::ORDER_MANIFEST;

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
            Some((stem, x))
                if crate::unpack::TENSOR_EXTENSIONS.contains(&x.to_ascii_lowercase().as_str()) =>
            {
                stem
            }
            _ => line,
        };
        positions.entry(name.to_string()).or_insert(i as u128);
    }
    Ok(positions)
}

/// Each row's position in the dumps' own order, and where that order comes from: A's manifest,
/// else B's, else the names' numbers when they number the rows (each a different number).
fn dump_order(
    sides: [&Side; 2],
    rows: &[Row],
    notes: &mut Vec<String>,
) -> (Order, Vec<Option<u128>>) {
    for side in sides {
        let Some(dir) = side.manifest_dir() else {
            continue;
        };
        let path = dir.join(MANIFEST);
        if !path.is_file() {
            continue;
        }
        let shown = match side.form {
            crate::side::Form::Archive(_) => PathBuf::from(side.shown(&path)),
            _ => path.clone(),
        };
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
                        shown.display(),
                        rows.len()
                    ));
                }
                return (Order::Manifest(shown), of);
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
        || matches!(r.outcome, Outcome::Shape(_))
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

/// The pairs of files of two sides: two single files pair whatever their names; two folders
/// (or archives) by key.
fn pair_files(a: &Side, b: &Side, mapping: &Mapping) -> Result<Vec<FilePair>, String> {
    match (a.is_folder(), b.is_folder()) {
        (false, false) => Ok(vec![FilePair {
            key: String::new(),
            a: a.files.clone(),
            b: b.files.clone(),
            rule: None,
        }]),
        (true, true) => Ok(crate::pairing::pair(a, b, mapping)),
        _ => Err(format!(
            "compare two files, or two folders or archives: {} is {} and {} {}",
            a.origin.display(),
            a.describe(),
            b.origin.display(),
            b.describe()
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
        b_names: Vec::new(),
        rule: None,
        source: Source::default(),
    }
}

/// A file that went over its read budget, and the pairs left uncompared.
struct Over {
    file: String,
    /// The tensor that went over.
    at: String,
    /// The first pair left: its row's name and sides.
    next: Option<(String, Shape, Shape)>,
    left: usize,
}

/// A side of a row: shape and dtype.
type Shape = Option<(Vec<usize>, WireDType)>;

/// A side's files of a pair, opened: several when it comes in shards.
struct Opened<'s> {
    side: &'s Side,
    files: Vec<TensorFile>,
    /// Each file's own key.
    keys: Vec<String>,
}

impl Opened<'_> {
    /// The tensors every file has: (name, shape, dtype) of the first file's.
    fn entries(&self) -> Vec<(String, Vec<usize>, WireDType)> {
        let Some(first) = self.files.first() else {
            return Vec::new();
        };
        first
            .entries()
            .iter()
            .map(|e| (e.name.clone(), e.shape.clone(), e.dtype))
            .collect()
    }

    /// Tensor `name` (entry `i` of the first file) from every file.
    fn load(&mut self, name: &str, i: usize) -> Result<Vec<HostTensor>, (Option<usize>, String)> {
        let single = self.files.len() == 1;
        let mut out = Vec::new();
        for (k, f) in self.files.iter_mut().enumerate() {
            // Shards that hold one tensor each name it after their own file: the one is it.
            let index = if single {
                Some(i)
            } else if f.entries().len() == 1 {
                Some(0)
            } else {
                f.find(name)
            };
            let shown = self.side.shown(f.path());
            let Some(index) = index else {
                return Err((None, format!("{shown}: this shard has no tensor `{name}`")));
            };
            match f.load(index) {
                Ok(t) => out.push(t),
                Err(e) => {
                    let over = matches!(e, ReadError::OverBudget(_)).then_some(k);
                    return Err((over, format!("{shown}: {e}")));
                }
            }
        }
        Ok(out)
    }

    /// The shards' names in the statement of a join: their own keys' last parts.
    fn shard_names(&self, name: &str, several: bool) -> Vec<String> {
        self.keys
            .iter()
            .map(|k| {
                let last = k.rsplit('/').next().unwrap_or(k);
                if several {
                    format!("{last}/{name}")
                } else {
                    last.to_string()
                }
            })
            .collect()
    }
}

/// Compare one pair of files into rows, reading one pair of tensors at a time.
fn compare_files(
    pair: &FilePair,
    sides: [&Side; 2],
    options: Options,
    mapping: &Mapping,
    read: &ReadOptions,
) -> FileResult {
    let key = pair.key.as_str();
    let open = |files: &[(String, PathBuf)], side: &Side| -> Result<Vec<TensorFile>, String> {
        files
            .iter()
            .map(|(_, p)| {
                read.open(p)
                    .map_err(|e| e.replace(&p.display().to_string(), &side.shown(p)))
            })
            .collect()
    };
    let (fa, fb) = match (open(&pair.a, sides[0]), open(&pair.b, sides[1])) {
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
    for (side, files, s) in [("A", &fa, sides[0]), ("B", &fb, sides[1])] {
        for f in files {
            skipped.extend(f.skipped().iter().map(|k| SkippedIn {
                side,
                file: PathBuf::from(s.shown(f.path())),
                skipped: k.clone(),
            }));
        }
    }
    let keys = |files: &[(String, PathBuf)]| files.iter().map(|(k, _)| k.clone()).collect();
    let mut oa = Opened {
        side: sides[0],
        files: fa,
        keys: keys(&pair.a),
    };
    let mut ob = Opened {
        side: sides[1],
        files: fb,
        keys: keys(&pair.b),
    };
    let (ea, eb) = (oa.entries(), ob.entries());
    // B's own key, when the pair's key is not it.
    let b_file_names: Vec<String> = pair
        .b
        .iter()
        .map(|(k, _)| k.clone())
        .filter(|k| k != key || pair.b.len() > 1)
        .collect();
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
        // B's tensor names as A's, through the mapping.
        let b_as_a: Vec<String> = eb
            .iter()
            .map(|(n, _, _)| mapping.to_a(n).unwrap_or_else(|| n.clone()))
            .collect();
        for (i, (name, _, _)) in ea.iter().enumerate() {
            match b_as_a.iter().position(|n| n == name) {
                Some(j) => pairs.push((join(key, name), Some(i), Some(j))),
                None => pairs.push((single_file_key(name, ea.len() == 1), Some(i), None)),
            }
        }
        for (j, name) in b_as_a.iter().enumerate() {
            if !ea.iter().any(|(n, _, _)| n == name) {
                pairs.push((single_file_key(name, eb.len() == 1), None, Some(j)));
            }
        }
    }
    let several = |o: &Opened| o.files.len() > 1 && o.entries().len() > 1;
    let (several_a, several_b) = (several(&oa), several(&ob));
    let mut rows = Vec::new();
    // A file over its budget is read no further: the pairs left are counted, under the name of
    // the first of them.
    let mut over: Option<Over> = None;
    for (name, ia, ib) in pairs {
        let describe = |e: &Vec<(String, Vec<usize>, WireDType)>, i: Option<usize>| {
            i.map(|i| (e[i].1.clone(), e[i].2))
        };
        let (da, db) = (describe(&ea, ia), describe(&eb, ib));
        // B's own names when a mapping or shards gave the row another.
        let b_names = match (ia, ib) {
            (Some(i), Some(j)) if eb.len() > 1 && eb[j].0 != ea[i].0 => vec![eb[j].0.clone()],
            (_, Some(_)) => b_file_names.clone(),
            _ => Vec::new(),
        };
        let source = |o: &Opened, e: &Vec<(String, Vec<usize>, WireDType)>, i: Option<usize>| {
            i.map_or_else(Vec::new, |i| {
                o.files
                    .iter()
                    .map(|f| (f.path().to_path_buf(), e[i].0.clone()))
                    .collect()
            })
        };
        let src = Source {
            a: source(&oa, &ea, ia),
            b: source(&ob, &eb, ib),
        };
        let (Some(i), Some(j)) = (ia, ib) else {
            rows.push(Row {
                name,
                a: da,
                b: db,
                outcome: Outcome::Only(ia.is_some()),
                b_names,
                rule: pair.rule.clone(),
                source: src,
            });
            continue;
        };
        if let Some(o) = over.as_mut() {
            o.next
                .get_or_insert_with(|| (name.clone(), da.clone(), db.clone()));
            o.left += 1;
            continue;
        }
        let loaded = oa
            .load(&ea[i].0, i)
            .map_err(|e| (e, &oa))
            .and_then(|ta| Ok((ta, ob.load(&eb[j].0, j).map_err(|e| (e, &ob))?)));
        let outcome = match loaded {
            Ok((ta, tb)) => {
                let compared = crate::pair::compare(
                    &ta,
                    &oa.shard_names(&ea[i].0, several_a),
                    &tb,
                    &ob.shard_names(&eb[j].0, several_b),
                    options,
                );
                match compared {
                    Compared::Values(stats) => Outcome::Compared(stats),
                    Compared::Shape(why) => Outcome::Shape(why),
                }
            }
            Err(((went_over, e), o)) => {
                if let Some(k) = went_over {
                    over = Some(Over {
                        file: o.side.shown(o.files[k].path()),
                        at: if std::ptr::eq(o.side, sides[0]) {
                            ea[i].0.clone()
                        } else {
                            eb[j].0.clone()
                        },
                        next: None,
                        left: 0,
                    });
                }
                Outcome::Error(e)
            }
        };
        rows.push(Row {
            name,
            a: da,
            b: db,
            outcome,
            b_names,
            rule: pair.rule.clone(),
            source: src,
        });
    }
    if let Some(o) = over {
        if let Some((name, a, b)) = o.next {
            let mut row = error_row(
                name,
                format!(
                    "{}: not compared{}: the file went over its read budget at `{}`",
                    o.file,
                    match o.left - 1 {
                        0 => String::new(),
                        1 => ", nor the tensor after it".into(),
                        n => format!(", nor the {n} tensors after it"),
                    },
                    o.at
                ),
            );
            row.a = a;
            row.b = b;
            rows.push(row);
        }
    }
    FileResult { rows, skipped }
}

/// Run the diff with the default options (assert_close's tolerance unless given, shapes
/// explained, no mapping), each file within its read budget.
pub fn run(a: &Path, b: &Path, tolerance: Tolerance, read: &ReadOptions) -> Result<Diff, String> {
    let options = Options {
        tolerance,
        ..Options::default()
    };
    let (a, b) = (Side::open(a, read)?, Side::open(b, read)?);
    run_sides([&a, &b], options, &Mapping::default(), read)
}

/// Run the diff of two opened sides.
pub fn run_sides(
    sides: [&Side; 2],
    options: Options,
    mapping: &Mapping,
    read: &ReadOptions,
) -> Result<Diff, String> {
    // On a terminal, long runs show their progress on stderr.
    let terminal = std::io::stderr().is_terminal();
    let shown = AtomicUsize::new(0);
    let result = run_with_progress(sides, options, mapping, read, &|done, total| {
        if terminal && total > 8 {
            shown.store(total, Ordering::SeqCst);
            eprint!("\rgolden diff: {done}/{total} files compared");
        }
    });
    if shown.load(Ordering::SeqCst) > 0 {
        eprintln!();
    }
    result
}

/// Run the diff of two opened sides; `progress(done, total)` is called as pairs of files are
/// compared.
pub fn run_with_progress(
    sides: [&Side; 2],
    options: Options,
    mapping: &Mapping,
    read: &ReadOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Diff, String> {
    let tolerance = options.tolerance;
    // Neither a NaN nor a negative tolerance is one: either failed every element that was not
    // exactly equal.
    for (option, value) in [("--atol", tolerance.atol), ("--rtol", tolerance.rtol)] {
        if let Some(v) = value.filter(|v| !(v.is_finite() && *v >= 0.0)) {
            return Err(format!(
                "{option} {v}: a tolerance is a finite number, 0 or more"
            ));
        }
    }
    let [sa, sb] = sides;
    let mut notes: Vec<String> = sa.notes.iter().chain(&sb.notes).cloned().collect();
    let pairs = pair_files(sa, sb, mapping)?;
    let total = pairs.len();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<(Vec<Row>, Vec<SkippedIn>)> = Mutex::new((Vec::new(), Vec::new()));
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(total.max(1));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(pair) = pairs.get(i) else {
                    break;
                };
                let found = compare_files(pair, [sa, sb], options, mapping, read);
                let mut results = results.lock().unwrap();
                results.0.extend(found.rows);
                results.1.extend(found.skipped);
                let d = done.fetch_add(1, Ordering::SeqCst) + 1;
                progress(d, total);
            });
        }
    });
    let (mut rows, mut skipped) = results.into_inner().unwrap();
    // The dumps' own order where they carry one (a manifest, numbered names), the rows it does not
    // place after them in natural order.
    rows.sort_by(|x, y| crate::natural::compare(&x.name, &y.name));
    let (order, positions) = dump_order([sa, sb], &rows, &mut notes);
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
    let held = |side: &Side, has: fn(&Row) -> bool| Held {
        origin: side.origin.clone(),
        form: side.describe(),
        files: side.files.len(),
        tensors: rows.iter().filter(|r| has(r)).count(),
        names: rows
            .iter()
            .filter(|r| has(r))
            .take(4)
            .map(|r| r.name.clone())
            .collect(),
    };
    let held = [held(sa, |r| r.a.is_some()), held(sb, |r| r.b.is_some())];
    Ok(Diff {
        a: sa.origin.clone(),
        b: sb.origin.clone(),
        rows,
        tolerance,
        skipped,
        notes,
        order,
        held,
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

    /// Whether every tensor is on both sides and matches — and at least one was compared: a
    /// comparison that compared nothing is never a match.
    pub fn all_match(&self) -> bool {
        self.nothing_compared().is_none() && self.rows.iter().all(Row::matches)
    }

    /// When no pair of tensors was compared: what each side holds and why nothing paired.
    pub fn nothing_compared(&self) -> Option<String> {
        let compared = self
            .rows
            .iter()
            .any(|r| matches!(r.outcome, Outcome::Compared(_) | Outcome::Shape(_)));
        if compared {
            return None;
        }
        let errors = self
            .rows
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Error(_)))
            .count();
        let holds = |side: &str, h: &Held| {
            let skipped: Vec<String> = self
                .skipped
                .iter()
                .filter(|k| k.side == side)
                .take(4)
                .map(|k| k.skipped.to_string())
                .collect();
            let mut s = format!(
                "{side} ({}, {}) holds {} tensor{} in {} tensor file{}",
                h.origin.display(),
                h.form,
                h.tensors,
                if h.tensors == 1 { "" } else { "s" },
                h.files,
                if h.files == 1 { "" } else { "s" },
            );
            if !h.names.is_empty() {
                let names: Vec<String> = h.names.iter().map(|n| format!("`{n}`")).collect();
                s.push_str(&format!(
                    " ({}{})",
                    names.join(", "),
                    if h.tensors > names.len() { ", …" } else { "" }
                ));
            }
            if !skipped.is_empty() {
                s.push_str(&format!("; skipped, not tensors: {}", skipped.join(", ")));
            }
            s
        };
        let [a, b] = &self.held;
        let why = if errors > 0 && errors == self.rows.len() {
            "every file that could pair failed to read (the errors are above)".to_string()
        } else if a.files == 0 || b.files == 0 {
            let side = if a.files == 0 { "A" } else { "B" };
            format!(
                "{side} holds no tensor file golden reads ({}){}",
                crate::unpack::TENSOR_EXTENSIONS
                    .iter()
                    .map(|x| format!(".{x}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                if self.notes.iter().any(|n| n.contains("left out")) {
                    ": see what was left out below"
                } else {
                    ""
                }
            )
        } else if a.tensors == 0 || b.tensors == 0 {
            let side = if a.tensors == 0 { "A" } else { "B" };
            format!("{side}'s files hold no tensor or number golden reads")
        } else {
            "no name is on both sides; if they are the same tensors under other names, pair them \
             with --map FILE (rules such as `{layer}_post_attn = layers.{layer}.self_attn`)"
                .to_string()
        };
        Some(format!(
            "nothing was compared: {}; {}. Why: {why}",
            holds("A", a),
            holds("B", b)
        ))
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
        let num = |x: f64| golden::internal::describe::numbers::num(x);
        // Line by line: no name can forge a line (`shown::Lines`).
        let mut s = shown::Lines::default();
        let tol = match self.tolerance.explicit() {
            Some(t) => format!("atol {} + rtol {}·|A|", num(t.atol), num(t.rtol)),
            None => "torch.testing.assert_close's default for each dtype".into(),
        };
        s.line(format_args!(
            "golden diff: {} (A, reference) against {} (B); {} tensors {}; tolerance: {tol}",
            shown::path(&self.a),
            shown::path(&self.b),
            self.rows.len(),
            self.order.describe()
        ));
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
        s.line(format_args!(
            "{:>5}  {:<width$}  {:<16} {:<9} {:>9} {:>9} {:>9} {:>10} {:>7}  status",
            "#", "name", "shape", "dtype", "max|Δ|", "mean|Δ|", "max rel", "cosine", "NaN A/B"
        ));
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
            // How B was lined up or named, when it differs from A.
            let mut how = Vec::new();
            if let Some(e) = r.explained() {
                how.push(e.note());
            }
            if !r.b_names.is_empty() && r.explained().is_none_or(|e| e.concat.is_none()) {
                how.push(format!("B: {}", r.b_names.join(", ")));
            }
            let how = if how.is_empty() {
                String::new()
            } else {
                format!("; {}", how.join("; "))
            };
            let status = match (&r.outcome, Some(i) == first) {
                (Outcome::Compared(st), _) if st.mismatched == 0 => format!("ok{how}"),
                (Outcome::Compared(st), f) => format!(
                    "DIFFERS ({} of {}){how}{}",
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
                (Outcome::Shape(why), _) => {
                    format!("SHAPE {} vs {}: {why}", shape(&r.a), shape(&r.b))
                }
                (Outcome::Only(true), _) => "only in A".into(),
                (Outcome::Only(false), _) => format!("only in B{how}"),
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
            s.line(format_args!(
                "{:>5}  {name:<width$}  {:<16} {dtype:<9} {figures}  {status}",
                i + 1,
                match (&r.a, &r.b) {
                    (Some((x, _)), Some((y, _))) if x != y => format!("{x:?} / {y:?}"),
                    _ => shape(r.a.as_ref().map_or(&r.b, |_| &r.a)),
                },
            ));
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
                    if let Some(e) = &st.explained {
                        let _ = write!(h, "; {}", e.note());
                    }
                    h
                }
                Outcome::Shape(why) => format!(": the shapes differ ({why})"),
                Outcome::Only(_) | Outcome::Error(_) => unreachable!("not a divergence"),
            }
        };
        match self.candidates.as_slice() {
            [] if self.nothing_compared().is_some() => {
                s.line(format_args!(
                    "{}",
                    self.nothing_compared().unwrap_or_default()
                ));
            }
            [] if self.all_match() => {
                s.line(format_args!("all {} tensors match", self.rows.len()));
            }
            [] => {
                s.line(format_args!("no tensor both sides have differs"));
            }
            [i] => {
                let r = &self.rows[*i];
                s.line(format_args!(
                    "first divergence: `{}` (#{}){}",
                    names[*i],
                    i + 1,
                    how(r)
                ));
            }
            several => {
                s.line(format_args!(
                    "first divergence: not known. These names carry no order (no {MANIFEST} \
                     beside the dumps, no number of their own on each), and only layer numbers \
                     are taken as one: the first divergence is one of these {}, which golden \
                     cannot order:",
                    several.len()
                ));
                for &i in several.iter().take(12) {
                    let r = &self.rows[i];
                    s.line(format_args!("  `{}` (#{}){}", names[i], i + 1, how(r)));
                }
                if several.len() > 12 {
                    s.line(format_args!("  … and {} more", several.len() - 12));
                }
                s.line(format_args!(
                    "  golden's guess from the usual stage names is `{}`; to know, dump with \
                     numbered names (`000_embed`, `001_…`) or write {MANIFEST} beside the dumps: \
                     their names, one a line, in the order they were computed",
                    names[several[0]]
                ));
            }
        }
        if !self.all_match() {
            {
                let count = |f: fn(&Row) -> bool| self.rows.iter().filter(|r| f(r)).count();
                s.line(format_args!(
                    "{} tensors: {} match, {} differ, {} differ in shape, {} only in A, {} only \
                     in B, {} unreadable",
                    self.rows.len(),
                    count(Row::matches),
                    count(|r| matches!(&r.outcome, Outcome::Compared(st) if st.mismatched > 0)),
                    count(|r| matches!(r.outcome, Outcome::Shape(_))),
                    count(|r| matches!(r.outcome, Outcome::Only(true))),
                    count(|r| matches!(r.outcome, Outcome::Only(false))),
                    count(|r| matches!(r.outcome, Outcome::Error(_))),
                ));
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
            s.line(format_args!(
                "skipped in {side} ({}), not tensors: {}",
                shown::path(file),
                what.join(", ")
            ));
        }
        for note in &self.notes {
            s.line(format_args!("note: {}", shown(note)));
        }
        s.into_string()
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
                        if let Some(e) = &st.explained {
                            row["explained"] = json!({
                                "as": e.text,
                                "agrees": e.agrees,
                                "tried": e.tried,
                                "note": e.note(),
                            });
                        }
                    }
                    Outcome::Error(e) => row["error"] = json!(e),
                    Outcome::Shape(why) => row["why"] = json!(why),
                    Outcome::Only(_) => {}
                }
                if !r.b_names.is_empty() {
                    row["b_names"] = json!(r.b_names);
                }
                if let Some(rule) = &r.rule {
                    row["mapped_by"] = json!(rule);
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
            "nothing_compared": self.nothing_compared(),
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
