//! `golden report --markdown` and `--json`: what a reviewer of a pull request needs from a test run,
//! in one glance — how many checks passed and failed, the checks that failed (headline, layer,
//! case, likely cause), and the checks that changed against a base: a snapshot folder of the base
//! branch (its committed `.snap` files) or a results folder of a run of it.
//!
//! A change is what the check's snapshot says differently, read as [`golden::internal::report::snapshot`]
//! writes it: an error figure that moved (before → after and the factor, judged as the snapshot
//! comparator judges it: a move within its factor, or far inside the tolerance on both sides, is
//! noise and not listed), a tolerance, the cases, dims, dtypes, reference or inputs, the versions
//! and sources its golden store was recorded with (`transformers 5.22.0 → 5.23.0`), a store
//! re-recorded; and, in the run itself, a snapshot that differs from the one committed (insta
//! fails the test on it until it is accepted). Failures first, new ones before old ones, each
//! tagged with what the base says of it and counted as a change unless it failed there too with
//! the same figures; then the changes worst first; the unchanged checks in a collapsed table.
//! Every piece of data is written inert (`markdown.rs`): no link, image, HTML or emphasis comes
//! from a name, a message or the base's snapshot text.
//!
//! The markdown stays under GitHub's limit for a comment (65,536 characters): rows that do not
//! fit are left out and counted, and a table is never cut. `--json` holds everything, untruncated.

use crate::markdown::{self, Place};
use golden::internal::report::snapshot::{figures_of, lines_match, FIGURE_FACTOR, STORE_PREFIX};
use serde_json::{json, Value as Json};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// GitHub's limit on a comment's body (and what it shows of a job summary at once), in characters.
pub const GITHUB_LIMIT: usize = 65_536;

/// What a table cell keeps of a long text (a failure's headline, a likely cause), in characters.
const CELL_CHARS: usize = 400;

/// A check's status in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// It passed (its snapshot may still differ from the committed one: see [`Check::unaccepted`]).
    Pass,
    /// It failed.
    Fail,
    /// Only its snapshot is known (a base given as a snapshot folder): it passed when it was
    /// accepted.
    Snapshot,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Snapshot => "snapshot",
        }
    }
}

/// What a check's golden store was recorded with, as its snapshot (or results file) says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreInfo {
    /// SHA-256 of the store file.
    pub sha256: Option<String>,
    /// Python and package versions (`("Python", "3.11.7")`, `("transformers", "5.23.0")`).
    pub versions: Vec<(String, String)>,
    /// Reference source files and their (shortened) SHA-256.
    pub sources: Vec<(String, String)>,
}

/// A failure, as the results file says it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FailureInfo {
    /// The failure message's first line.
    pub headline: String,
    /// The failing case (`b=1,t=2:zeros:0x…`), when a case failed.
    pub case: Option<String>,
    /// Its dtype.
    pub dtype: Option<String>,
    /// The likely cause, when the failure names one.
    pub likely_cause: Option<String>,
    /// The failing case's worst error relative to the allowed one.
    pub worst_ratio: Option<f64>,
    /// Where its artifacts are.
    pub artifacts: Option<String>,
}

/// One check of a run, or of a base.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Check {
    /// Its crate, when known (a results folder says it).
    pub krate: Option<String>,
    /// Its name: its snapshot's (`norm__rms_norm__gradients`).
    pub name: String,
    /// The Rust function.
    pub layer: Option<String>,
    /// pass, fail, or only a snapshot.
    pub status: Option<Status>,
    /// Its snapshot's text, when known.
    pub snapshot: Option<String>,
    /// What it is about (the snapshot's first lines), when only that is known (a failure).
    pub description: Option<String>,
    /// Its golden store.
    pub store: Option<StoreInfo>,
    /// Its failure.
    pub failure: Option<FailureInfo>,
    /// A passing check whose snapshot differs from the committed one: the committed file (insta
    /// fails the test on it until it is accepted).
    pub unaccepted: Option<PathBuf>,
    /// Its greatest error relative to the allowed one, over every leaf.
    pub worst_ratio: Option<f64>,
    /// How fast the port was beside the reference, per dtype timed (a results file says it; a
    /// snapshot holds no timings).
    pub speed: Vec<golden::internal::judge::speed::Speed>,
    /// Where its snapshot is committed in the checkout that ran it (a results file says it).
    pub snapshot_file: Option<PathBuf>,
}

// ---------------------------------------------------------------------------------------------
// Reading snapshots

/// A snapshot's text, read line by line: its description (`key: value`, with indented lines
/// belonging to the key above), the dtypes it has sections for, and every other line under a key
/// that stays the same when only the figures move.
#[derive(Clone, Debug, Default, PartialEq)]
struct Parsed {
    fields: Vec<(String, String)>,
    dtypes: Vec<String>,
    lines: Vec<(String, String)>,
    store: Vec<String>,
}

fn is_dtype_line(line: &str) -> bool {
    matches!(line, "f32:" | "f64:" | "f16:" | "bf16:")
}

/// A group's or a point's name without its symbolic shape or its parenthesised remark:
/// `out f32 [b, t, d]` → `out f32`; `trace, in the reference's execution order (tolerance: …):` →
/// `trace, in the reference's execution order`.
fn stem(text: &str) -> &str {
    let text = text.trim_end_matches(':');
    let text = match text.find(" (") {
        Some(i) => &text[..i],
        None => text,
    };
    match text.rfind(" [") {
        Some(i) if text.ends_with(']') => &text[..i],
        _ => text,
    }
}

fn parse(text: &str) -> Parsed {
    let mut parsed = Parsed::default();
    let mut section: Option<String> = None;
    let mut group = String::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if line.starts_with(STORE_PREFIX) {
            parsed.store.push(line.to_string());
            continue;
        }
        if is_dtype_line(line) {
            let dtype = line.trim_end_matches(':').to_string();
            parsed.dtypes.push(dtype.clone());
            section = Some(dtype);
            group.clear();
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let body = line.trim_start();
        match (&section, indent) {
            (None, 0) => {
                let (key, value) = body.split_once(':').unwrap_or((body, ""));
                parsed
                    .fields
                    .push((key.to_string(), value.trim().to_string()));
            }
            (None, _) => {
                // A line belonging to the field above (`args:` and its arguments).
                if let Some((_, value)) = parsed.fields.last_mut() {
                    if !value.is_empty() {
                        value.push('\n');
                    }
                    value.push_str(body);
                }
            }
            (Some(_), 0) => {
                // After the dtypes' sections: the gradient health lines, each its own key.
                parsed.lines.push((body.to_string(), body.to_string()));
            }
            (Some(dtype), 2) => {
                let key = match body.split_once(": ") {
                    // A figure line of its own (`finite differences, x: …`) or a note.
                    Some((label, _)) if !body.ends_with(':') && !label.starts_with("note") => {
                        group.clear();
                        format!("{dtype} / {}", stem(label))
                    }
                    _ if body.starts_with("note: ") => {
                        group.clear();
                        format!("{dtype} / {body}")
                    }
                    // A group: a leaf (`out f32 [b, t, d]`), a trace, a schedule's leaf.
                    _ => {
                        group = stem(body).to_string();
                        format!("{dtype} / {group}")
                    }
                };
                parsed.lines.push((key, line.to_string()));
            }
            (Some(dtype), _) => {
                let label = body.split_once(": ").map_or(body, |(l, _)| l);
                let key = format!("{dtype} / {group} / {}", stem(label));
                parsed.lines.push((key, line.to_string()));
            }
        }
    }
    parsed
}

impl Parsed {
    fn field(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// A store's lines (`golden store: recorded with …`, `… source F sha256 H`, `… sha256 H`).
fn store_info(lines: &[String]) -> Option<StoreInfo> {
    if lines.is_empty() {
        return None;
    }
    let mut info = StoreInfo::default();
    for line in lines {
        let rest = line.trim_start_matches(STORE_PREFIX);
        if let Some(with) = rest.strip_prefix("recorded with ") {
            info.versions = with
                .split(", ")
                .filter_map(|p| p.rsplit_once(' '))
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect();
        } else if let Some(source) = rest.strip_prefix("source ") {
            if let Some((file, sha)) = source.rsplit_once(" sha256 ") {
                info.sources.push((file.to_string(), sha.to_string()));
            }
        } else if let Some(sha) = rest.strip_prefix("sha256 ") {
            info.sha256 = Some(sha.to_string());
        }
    }
    Some(info)
}

/// A store as a results file records it (`{"sha256", "provenance": {python, packages, sources}}`),
/// shown as the snapshot shows it.
fn store_from_json(v: &Json) -> Option<StoreInfo> {
    let sha256 = v["sha256"].as_str()?.to_string();
    let p = &v["provenance"];
    let mut info = StoreInfo {
        sha256: Some(sha256),
        ..StoreInfo::default()
    };
    if let Some(python) = p["python"].as_str() {
        info.versions.push(("Python".into(), python.into()));
    }
    let pairs = |v: &Json| -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = v
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        out.sort();
        out
    };
    info.versions.extend(pairs(&p["packages"]));
    info.sources = pairs(&p["sources"])
        .into_iter()
        .map(|(f, h)| (f, h.chars().take(12).collect()))
        .collect();
    Some(info)
}

/// The greatest `R× allowed` of the lines that decide a check (every figure line but the finite
/// differences' own, which may disagree with both sides).
fn worst_of(text: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("finite differences"))
        .filter_map(|l| figures_of(l)?.ratio)
        .fold(None, |acc: Option<f64>, r| {
            Some(acc.map_or(r, |a| a.max(r)))
        })
}

/// A snapshot file's text without insta's header.
fn snapshot_body(file: &str) -> &str {
    let Some(rest) = file.strip_prefix("---\n") else {
        return file;
    };
    match rest.find("\n---\n") {
        Some(i) => &rest[i + "\n---\n".len()..],
        None => file,
    }
}

// ---------------------------------------------------------------------------------------------
// Loading runs and bases

fn finite(v: &Json) -> Option<f64> {
    v.as_f64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// A check from its results file.
fn from_results(doc: &Json) -> Check {
    let status = match doc["status"].as_str() {
        Some("pass") => Status::Pass,
        _ => Status::Fail,
    };
    let snapshot = doc["snapshot"].as_str().map(str::to_string);
    let leaves_worst = doc["leaves"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| finite(&l["worst_ratio"]))
        .fold(None, |acc: Option<f64>, r| {
            Some(acc.map_or(r, |a| a.max(r)))
        });
    let training_worst = finite(&doc["training"]["worst_ratio"]);
    let worst = match (status, &snapshot) {
        (Status::Pass, Some(text)) => worst_of(text),
        _ => [leaves_worst, training_worst]
            .into_iter()
            .flatten()
            .fold(None, |acc: Option<f64>, r| {
                Some(acc.map_or(r, |a| a.max(r)))
            }),
    };
    let failure = (status == Status::Fail).then(|| FailureInfo {
        headline: doc["headline"]
            .as_str()
            .or_else(|| doc["failure"].as_str().and_then(|f| f.lines().next()))
            .unwrap_or("failed")
            .to_string(),
        case: doc["case"].as_str().map(str::to_string),
        dtype: doc["dtype"].as_str().map(str::to_string),
        likely_cause: doc["likely_cause"].as_str().map(str::to_string),
        worst_ratio: worst,
        artifacts: doc["artifacts"].as_str().map(str::to_string),
    });
    let unaccepted = match (&snapshot, doc["snapshot_file"].as_str()) {
        (Some(text), Some(file)) if status == Status::Pass => {
            let committed = std::fs::read_to_string(file).ok();
            let agrees = committed.as_deref().is_some_and(|c| {
                let (a, b) = (snapshot_body(c).trim_end(), text.trim_end());
                a.lines().count() == b.lines().count()
                    && a.lines().zip(b.lines()).all(|(x, y)| lines_match(x, y))
            });
            (!agrees).then(|| PathBuf::from(file))
        }
        _ => None,
    };
    Check {
        krate: doc["crate"].as_str().map(str::to_string),
        name: doc["check"].as_str().unwrap_or_default().to_string(),
        layer: doc["layer"].as_str().map(str::to_string),
        status: Some(status),
        description: doc["description"].as_str().map(str::to_string),
        store: store_from_json(&doc["store"]),
        snapshot,
        failure,
        unaccepted,
        worst_ratio: worst,
        speed: crate::speed::read(doc),
        snapshot_file: doc["snapshot_file"].as_str().map(PathBuf::from),
    }
}

/// The last run's checks of a results folder (`target/golden/results`), and how many older
/// results were left out.
pub fn load_results(dir: &Path) -> Result<(Vec<Check>, usize), String> {
    let (docs, stale) = crate::report::last_run(dir)?;
    Ok((docs.iter().map(from_results).collect(), stale))
}

/// The checks of a snapshot folder (`snapshots/` of the base branch): every `.snap` file.
pub fn load_snapshots(dir: &Path) -> Result<Vec<Check>, String> {
    let walk = crate::walk::files_under(dir, |p| p.extension().is_some_and(|x| x == "snap"))?;
    let mut checks = Vec::new();
    for path in walk.files {
        let file =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let text = snapshot_body(&file).to_string();
        let parsed = parse(&text);
        checks.push(Check {
            krate: None,
            name: path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            layer: parsed.field("layer").map(str::to_string),
            status: Some(Status::Snapshot),
            store: store_info(&parsed.store),
            worst_ratio: worst_of(&text),
            snapshot: Some(text),
            ..Check::default()
        });
    }
    checks.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(checks)
}

/// A base: a snapshot folder when it holds snapshots (`*.snap`), else a results folder.
pub fn load_base(dir: &Path) -> Result<Vec<Check>, String> {
    if !dir.is_dir() {
        return Err(format!(
            "--base {}: not a folder (give the base branch's snapshot folder, or the results \
             folder of a run of it)",
            dir.display()
        ));
    }
    // A snapshot folder may hold other files, JSON among them; a results folder holds no
    // snapshot.
    let checks = load_snapshots(dir)?;
    if !checks.is_empty() {
        return Ok(checks);
    }
    let results = crate::walk::files_under(dir, |p| p.extension().is_some_and(|x| x == "json"))?;
    if results.files.is_empty() {
        return Err(format!(
            "--base {}: no snapshots (*.snap) and no results files (*.json) in it",
            dir.display()
        ));
    }
    load_results(dir).map(|(checks, _)| checks)
}

// ---------------------------------------------------------------------------------------------
// Comparing with the base

/// One thing that changed in a check against the base.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// What changed: `figure`, `tolerance`, `field`, `dtypes`, `versions`, `source`, `store`,
    /// `line`, `new check`, `removed check`.
    pub kind: &'static str,
    /// Which figure, field or file (`f32 / out / max |port - ref|`, `cases`, `transformers`).
    pub what: String,
    /// Before (the base), when there was something.
    pub before: Option<String>,
    /// After (this run), when there is something.
    pub after: Option<String>,
    /// For a figure: after / before of its worst error relative to the allowed one (or of its
    /// first number when it has none); above 1 is worse.
    pub factor: Option<f64>,
}

impl Change {
    fn new(kind: &'static str, what: impl Into<String>) -> Change {
        Change {
            kind,
            what: what.into(),
            before: None,
            after: None,
            factor: None,
        }
    }

    fn between(mut self, before: Option<String>, after: Option<String>) -> Change {
        self.before = before;
        self.after = after;
        self
    }
}

/// The figure text of a line: what follows its label (`7.2e-7, worst element 0.034× allowed`).
fn figure_text(line: &str) -> String {
    let body = line.trim_start();
    // Trace points carry their name, then the label: keep what follows the last label.
    match body.rfind("max |port - ref|: ") {
        Some(i) => body[i + "max |port - ref|: ".len()..].to_string(),
        None => body
            .split_once(": ")
            .map_or(body, |(_, rest)| rest)
            .to_string(),
    }
}

/// The factor between two figure lines: of their `R× allowed` when both have it, else of their
/// first numbers.
fn factor(before: &str, after: &str) -> Option<f64> {
    let (b, a) = (figures_of(before)?, figures_of(after)?);
    let (x, y) = match (b.ratio, a.ratio) {
        (Some(x), Some(y)) => (x, y),
        _ => (*b.numbers.first()?, *a.numbers.first()?),
    };
    Some(if x == y {
        1.0
    } else if x == 0.0 {
        f64::INFINITY
    } else {
        y / x
    })
}

fn field_change(field: &str, before: Option<&str>, after: Option<&str>) -> Option<Change> {
    if before == after {
        return None;
    }
    let kind = match field {
        "reference" => "reference",
        _ => "field",
    };
    Some(Change::new(kind, field).between(before.map(str::to_string), after.map(str::to_string)))
}

/// What changed in a store: its versions, its sources, its bytes.
fn store_changes(before: Option<&StoreInfo>, after: Option<&StoreInfo>) -> Vec<Change> {
    let mut out = Vec::new();
    let empty = StoreInfo::default();
    let (b, a) = (before.unwrap_or(&empty), after.unwrap_or(&empty));
    if b.sha256 == a.sha256 {
        return out;
    }
    // Versions: only what both record is compared (an older snapshot records none).
    if !b.versions.is_empty() && !a.versions.is_empty() {
        for (name, then) in &b.versions {
            match a.versions.iter().find(|(n, _)| n == name) {
                Some((_, now)) if now != then => out.push(
                    Change::new("versions", name.clone())
                        .between(Some(then.clone()), Some(now.clone())),
                ),
                None => out
                    .push(Change::new("versions", name.clone()).between(Some(then.clone()), None)),
                _ => {}
            }
        }
        for (name, now) in &a.versions {
            if !b.versions.iter().any(|(n, _)| n == name) {
                out.push(Change::new("versions", name.clone()).between(None, Some(now.clone())));
            }
        }
    }
    if !b.versions.is_empty() || !b.sources.is_empty() {
        for (file, then) in &b.sources {
            match a.sources.iter().find(|(f, _)| f == file) {
                Some((_, now)) if now != then => out.push(
                    Change::new("source", file.clone())
                        .between(Some(then.clone()), Some(now.clone())),
                ),
                None if !a.versions.is_empty() => {
                    out.push(Change::new("source", file.clone()).between(Some(then.clone()), None))
                }
                _ => {}
            }
        }
        for (file, now) in &a.sources {
            if !b.sources.iter().any(|(f, _)| f == file) {
                out.push(Change::new("source", file.clone()).between(None, Some(now.clone())));
            }
        }
    }
    let short = |s: &Option<String>| s.as_ref().map(|s| s.chars().take(12).collect::<String>());
    let what = match (&b.sha256, &a.sha256) {
        (None, Some(_)) => "golden store recorded",
        (Some(_), None) => "golden store removed",
        _ => "golden store re-recorded",
    };
    out.push(Change::new("store", what).between(short(&b.sha256), short(&a.sha256)));
    out
}

/// What changed from `base` to `head` in one check.
pub fn changes(base: &Check, head: &Check) -> Vec<Change> {
    let mut out = Vec::new();
    let text = |c: &Check| c.snapshot.clone().or_else(|| c.description.clone());
    let (Some(bt), Some(ht)) = (text(base), text(head)) else {
        out.extend(store_changes(base.store.as_ref(), head.store.as_ref()));
        return out;
    };
    let (b, h) = (parse(&bt), parse(&ht));
    // The description's fields, in the head's order, then those only the base has.
    let mut fields: Vec<&str> = h.fields.iter().map(|(k, _)| k.as_str()).collect();
    for (k, _) in &b.fields {
        if !fields.contains(&k.as_str()) {
            fields.push(k);
        }
    }
    for field in fields {
        out.extend(field_change(field, b.field(field), h.field(field)));
    }
    // Only when both sides have their figures (a failure has only its description).
    if base.snapshot.is_some() && head.snapshot.is_some() {
        if b.dtypes != h.dtypes {
            out.push(
                Change::new("dtypes", "dtypes")
                    .between(Some(b.dtypes.join(", ")), Some(h.dtypes.join(", "))),
            );
        }
        for (key, after) in &h.lines {
            match b.lines.iter().find(|(k, _)| k == key) {
                Some((_, before)) if before == after => {}
                Some((_, before))
                    if figures_of(before).is_some() && figures_of(after).is_some() =>
                {
                    if lines_match(before, after) {
                        // Within the comparator's noise: not a change.
                        continue;
                    }
                    let mut c = Change::new("figure", key.clone())
                        .between(Some(figure_text(before)), Some(figure_text(after)));
                    c.factor = factor(before, after);
                    out.push(c);
                }
                Some((_, before)) => {
                    let kind = if key.ends_with("/ tolerance") || before.contains("(tolerance: ") {
                        "tolerance"
                    } else {
                        "line"
                    };
                    out.push(Change::new(kind, key.clone()).between(
                        Some(before.trim().to_string()),
                        Some(after.trim().to_string()),
                    ));
                }
                None => out.push(
                    Change::new("line", key.clone()).between(None, Some(after.trim().to_string())),
                ),
            }
        }
        for (key, before) in &b.lines {
            if !h.lines.iter().any(|(k, _)| k == key) {
                out.push(
                    Change::new("line", key.clone()).between(Some(before.trim().to_string()), None),
                );
            }
        }
    }
    out.extend(store_changes(base.store.as_ref(), head.store.as_ref()));
    out
}

/// A check of the run, with what changed in it against the base.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The check in this run (`None`: only the base has it).
    pub check: Check,
    /// Its base (`None`: new, or no base given).
    pub base: Option<Check>,
    /// What changed against the base.
    pub changes: Vec<Change>,
    /// Speed figures both runs timed, and those that moved beyond both runs' noise
    /// (`speed.rs`): listed apart, never a change that fails or a failure.
    pub speed: (usize, Vec<crate::speed::SpeedMove>),
}

impl Entry {
    fn failed(&self) -> bool {
        self.check.status == Some(Status::Fail) && self.check.failure.is_some()
    }

    /// Failing here where the base passed (or had no such check).
    fn newly_failed(&self) -> bool {
        self.failed()
            && self
                .base
                .as_ref()
                .is_none_or(|b| b.status != Some(Status::Fail))
    }

    /// How much worse its worst figure got (1 when none moved).
    fn worst_factor(&self) -> f64 {
        self.changes
            .iter()
            .filter(|c| c.kind == "figure")
            .filter_map(|c| c.factor)
            .fold(1.0f64, |a, f| if f.is_nan() { a } else { a.max(f) })
    }

    /// Sorting: failures (new ones first, worst first), snapshots not accepted, then changes worst
    /// first, new checks, improvements, removed checks; the unchanged last.
    fn rank(&self) -> (u8, f64) {
        let worst = |r: Option<f64>| -r.unwrap_or(0.0);
        if self.failed() {
            return (
                if self.newly_failed() { 0 } else { 1 },
                worst(self.check.worst_ratio),
            );
        }
        if self.check.unaccepted.is_some() {
            return (2, -self.worst_factor());
        }
        if self.check.status.is_none() {
            return (7, 0.0);
        }
        if self.changes.iter().any(|c| c.kind == "new check") {
            return (5, 0.0);
        }
        let factor = self.worst_factor();
        if factor > 1.0 {
            return (3, -factor);
        }
        if self.changes.iter().any(|c| c.kind != "figure") {
            return (4, 0.0);
        }
        if !self.changes.is_empty() {
            return (6, factor);
        }
        (8, worst(self.check.worst_ratio))
    }

    /// What the base says of a failing check: it passed there (its results say so, or its
    /// snapshot is committed there, which it was when it passed), it failed there too, or it was
    /// not there (a base of results). `None`: no base, or a base of snapshots without it (a
    /// failing check writes no snapshot, so its absence there says nothing).
    fn in_base(&self) -> Option<&'static str> {
        match &self.base {
            Some(b) if b.status == Some(Status::Fail) => Some("failed in the base too"),
            Some(_) => Some("passed in the base"),
            None if self.changes.iter().any(|c| c.kind == "new check") => Some("not in the base"),
            None => None,
        }
    }

    /// A failure that is a change against the base: the base passed it or did not have it (a
    /// base of results), or it failed there too but what it is about changed or its worst error
    /// moved beyond the snapshot comparator's factor.
    fn failure_changed(&self) -> bool {
        if !self.failed() {
            return false;
        }
        match &self.base {
            None => self.changes.iter().any(|c| c.kind == "new check"),
            Some(b) if b.status != Some(Status::Fail) => true,
            Some(b) => !self.changes.is_empty() || moved(b.worst_ratio, self.check.worst_ratio),
        }
    }

    fn listed(&self) -> bool {
        self.rank().0 < 8
    }
}

/// Whether a worst error moved beyond the snapshot comparator's factor (or appeared, or went).
fn moved(before: Option<f64>, after: Option<f64>) -> bool {
    match (before, after) {
        (Some(b), Some(a)) => b.max(a) > b.min(a) * FIGURE_FACTOR,
        (None, None) => false,
        _ => true,
    }
}

/// Whether a base check this run did not run still has its snapshot in the checkout: in a folder
/// where the run's own checks keep theirs. Such a check was left to another job (nextest's
/// `--partition`) or filtered out, not removed.
fn still_committed(b: &Check, head: &[Check]) -> bool {
    let ran = head.iter().any(|c| {
        c.name == b.name && (b.krate.is_none() || c.krate.is_none() || b.krate == c.krate)
    });
    !ran && head
        .iter()
        .filter_map(|c| c.snapshot_file.as_deref()?.parent())
        .any(|dir| dir.join(format!("{}.snap", b.name)).is_file())
}

/// The run's checks against the base's (by crate and name when both say their crate, else by
/// name), sorted for a reviewer.
pub fn compare(head: &[Check], base: Option<&[Check]>) -> Vec<Entry> {
    let find = |c: &Check, among: &[Check]| -> Option<Check> {
        among
            .iter()
            .find(|b| {
                b.name == c.name && (b.krate.is_none() || c.krate.is_none() || b.krate == c.krate)
            })
            .cloned()
    };
    // A base of snapshots only knows the checks that passed when their snapshot was accepted.
    let snapshots = base.is_some_and(|b| b.iter().all(|c| c.status == Some(Status::Snapshot)));
    let mut entries: Vec<Entry> = head
        .iter()
        .map(|c| {
            let b = base.and_then(|base| find(c, base));
            let changes = match (&b, base) {
                (Some(b), _) => changes(b, c),
                // A failing check has no snapshot, so a base of snapshots never has one: its
                // absence there says nothing; the failure itself is listed.
                (None, Some(_)) if c.status == Some(Status::Fail) && snapshots => Vec::new(),
                (None, Some(_)) => vec![Change::new("new check", c.name.clone())],
                (None, None) => Vec::new(),
            };
            let speed = b
                .as_ref()
                .map_or((0, Vec::new()), |b| crate::speed::moves(&b.speed, &c.speed));
            Entry {
                check: c.clone(),
                base: b,
                changes,
                speed,
            }
        })
        .collect();
    for b in base.into_iter().flatten() {
        if find(b, head).is_none() {
            entries.push(Entry {
                check: Check {
                    name: b.name.clone(),
                    krate: b.krate.clone(),
                    layer: b.layer.clone(),
                    ..Check::default()
                },
                base: Some(b.clone()),
                changes: vec![Change::new("removed check", b.name.clone())],
                speed: (0, Vec::new()),
            });
        }
    }
    entries.sort_by(|a, b| {
        let (ra, rb) = (a.rank(), b.rank());
        ra.0.cmp(&rb.0)
            .then(ra.1.total_cmp(&rb.1))
            .then(a.check.name.cmp(&b.check.name))
    });
    entries
}

// ---------------------------------------------------------------------------------------------
// Writing

/// A figure's ratio as the snapshot writes it (`0.034×`).
fn ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r.is_finite() => format!("{}×", golden::internal::report::snapshot::figure(r)),
        Some(_) => "∞".into(),
        None => "—".into(),
    }
}

/// `29× worse`, `5.1× better`, `from 0`.
fn factor_words(f: f64) -> String {
    if f.is_infinite() {
        "from 0".into()
    } else if f == 1.0 {
        "unchanged".into()
    } else if f >= 1.0 {
        format!("{}× worse", golden::internal::report::snapshot::figure(f))
    } else if f > 0.0 {
        format!(
            "{}× better",
            golden::internal::report::snapshot::figure(1.0 / f)
        )
    } else {
        "to 0".into()
    }
}

/// A piece of data in a table cell, as code (a name, a path, a case).
fn code(text: &str) -> String {
    markdown::code(text, Place::Cell)
}

/// A piece of data in a table cell, as text (a figure, a snapshot's line).
fn cell(text: &str) -> String {
    markdown::text(text, Place::Cell)
}

/// A message in a table cell (a headline, a likely cause): its code spans kept, at most
/// [`CELL_CHARS`] characters.
fn message(text: &str) -> String {
    markdown::prose(text, Place::Cell, CELL_CHARS)
}

/// A markdown table that takes rows while they fit `budget` characters; rows left out are counted
/// in a line after it, never cut.
struct Table {
    head: String,
    rows: Vec<String>,
}

impl Table {
    fn new(columns: &[&str]) -> Table {
        Table {
            head: format!(
                "| {} |\n|{}\n",
                columns.join(" | "),
                "---|".repeat(columns.len())
            ),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: &[String]) {
        self.rows.push(format!("| {} |\n", cells.join(" | ")));
    }

    /// The table with as many rows as fit in `budget` characters (with the line that counts the
    /// others), and how many were left out.
    fn render(&self, budget: usize, what: &str) -> (String, usize) {
        let note = |left: usize| {
            format!(
                "\n*… and {left} more {what}, left out to keep this summary under GitHub's \
                 {GITHUB_LIMIT}-character limit: `golden report --json` lists them all.*\n"
            )
        };
        let mut out = self.head.clone();
        let reserve = note(self.rows.len()).chars().count();
        let mut used = out.chars().count() + reserve;
        if used > budget {
            return (String::new(), self.rows.len());
        }
        let mut shown = 0;
        for row in &self.rows {
            let n = row.chars().count();
            if used + n > budget {
                break;
            }
            used += n;
            out.push_str(row);
            shown += 1;
        }
        let left = self.rows.len() - shown;
        if left > 0 {
            out.push_str(&note(left));
        }
        (out, left)
    }
}

fn change_row(name: &str, c: &Change) -> Vec<String> {
    let (what, before, after, factor) = match c.kind {
        "figure" => (
            c.what.clone(),
            c.before.clone().unwrap_or_default(),
            c.after.clone().unwrap_or_default(),
            c.factor.map(factor_words).unwrap_or_default(),
        ),
        "versions" => (
            format!("recorded with {}", c.what),
            c.before.clone().unwrap_or("—".into()),
            c.after.clone().unwrap_or("—".into()),
            String::new(),
        ),
        "source" => (
            format!("reference source {} (sha256)", c.what),
            c.before.clone().unwrap_or("—".into()),
            c.after.clone().unwrap_or("—".into()),
            String::new(),
        ),
        "store" => (
            format!("{} (sha256)", c.what),
            c.before.clone().unwrap_or("—".into()),
            c.after.clone().unwrap_or("—".into()),
            String::new(),
        ),
        "new check" => (
            "new check".into(),
            "—".into(),
            "added".into(),
            String::new(),
        ),
        "removed check" => (
            "check removed".into(),
            "present".into(),
            "—".into(),
            String::new(),
        ),
        _ => (
            c.what.clone(),
            c.before.clone().unwrap_or("—".into()),
            c.after.clone().unwrap_or("—".into()),
            String::new(),
        ),
    };
    let factor = if factor.ends_with("worse") {
        format!("**{factor}**")
    } else {
        factor
    };
    vec![code(name), cell(&what), cell(&before), cell(&after), factor]
}

/// Everything the summary says, before it is written as markdown or JSON.
pub struct Summary {
    /// The checks, sorted.
    pub entries: Vec<Entry>,
    /// Where the run's results came from.
    pub results: PathBuf,
    /// The base, when given.
    pub base: Option<PathBuf>,
    /// Results of older runs left out.
    pub stale: usize,
    /// Checks of the base this run did not run whose snapshots are still in the checkout (a job
    /// that runs a share of the checks: nextest's `--partition`, a filter): not removed.
    pub not_run: usize,
}

impl Summary {
    /// Read the run's results (the last run's) and the base.
    pub fn build(results: &Path, base: Option<&Path>) -> Result<Summary, String> {
        let (head, stale) = load_results(results)?;
        let mut base_checks = base.map(load_base).transpose()?;
        let mut not_run = 0;
        if let Some(base_checks) = &mut base_checks {
            let before = base_checks.len();
            base_checks.retain(|b| !still_committed(b, &head));
            not_run = before - base_checks.len();
        }
        Ok(Summary {
            entries: compare(&head, base_checks.as_deref()),
            results: results.to_path_buf(),
            base: base.map(Path::to_path_buf),
            stale,
            not_run,
        })
    }

    fn counts(&self) -> (usize, usize, usize) {
        let run: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.check.status.is_some())
            .collect();
        let failed = run.iter().filter(|e| e.failed()).count();
        let unaccepted = run
            .iter()
            .filter(|e| !e.failed() && e.check.unaccepted.is_some())
            .count();
        (run.len(), failed, unaccepted)
    }

    /// GitHub-flavoured markdown, at most `limit` characters (at most [`GITHUB_LIMIT`]).
    pub fn markdown(&self, limit: usize) -> String {
        let limit = limit.min(GITHUB_LIMIT - 1);
        let (total, failed, unaccepted) = self.counts();
        let passed = total - failed;
        let mut out = String::new();
        let mark = if failed + unaccepted > 0 {
            "❌"
        } else {
            "✅"
        };
        let _ = writeln!(
            out,
            "### {mark} golden: {passed} of {total} check{} passed{}\n",
            if total == 1 { "" } else { "s" },
            if failed > 0 {
                format!(", {failed} failed")
            } else {
                String::new()
            }
        );
        let failures_changed = self.entries.iter().filter(|e| e.failure_changed()).count();
        let changed = failures_changed
            + self
                .entries
                .iter()
                .filter(|e| !e.failed() && e.listed() && !e.changes.is_empty())
                .count();
        let mut facts = vec![format!("**{passed} passed · {failed} failed**")];
        if unaccepted > 0 {
            facts.push(format!(
                "{unaccepted} snapshot{} not accepted",
                if unaccepted == 1 { "" } else { "s" }
            ));
        }
        match &self.base {
            Some(base) => facts.push(format!(
                "against the base {}: {changed} check{} changed{}",
                markdown::code(&base.display().to_string(), Place::Line),
                if changed == 1 { "" } else { "s" },
                match failures_changed {
                    0 => String::new(),
                    n if n == changed => " (failing now)".into(),
                    n => format!(" ({n} of them failing now)"),
                }
            )),
            None => facts.push("no base given (`--base`): nothing compared".into()),
        }
        if self.not_run > 0 {
            facts.push(format!(
                "{} check{} of the base not run here (their snapshots are in the checkout: \
                 another job's share, or filtered out)",
                self.not_run,
                if self.not_run == 1 { "" } else { "s" }
            ));
        }
        if self.stale > 0 {
            facts.push(format!(
                "{} result{} of earlier runs left out",
                self.stale,
                if self.stale == 1 { "" } else { "s" }
            ));
        }
        let _ = writeln!(out, "{}\n", facts.join(" · "));

        // Each part gets what is left; the collapsed table of the rest comes last.
        let closing = "\n</details>\n";
        let room = |out: &String| limit.saturating_sub(out.chars().count() + closing.len() + 200);

        let failures: Vec<&Entry> = self.entries.iter().filter(|e| e.failed()).collect();
        if !failures.is_empty() {
            let _ = writeln!(out, "#### Failed\n");
            let mut table = Table::new(&[
                "check",
                "layer",
                "case",
                "what failed",
                "likely cause",
                "worst / allowed",
            ]);
            for e in &failures {
                let f = e.check.failure.clone().unwrap_or_default();
                let case = match (&f.case, &f.dtype) {
                    (Some(c), Some(d)) if !c.ends_with(d.as_str()) => format!("{c} ({d})"),
                    (Some(c), _) => c.clone(),
                    (None, Some(d)) => d.clone(),
                    (None, None) => "—".into(),
                };
                let before = e.base.as_ref().and_then(|b| b.worst_ratio);
                let worst = match (before, f.worst_ratio) {
                    (Some(b), Some(after)) => format!(
                        "{} → {} ({})",
                        ratio(Some(b)),
                        ratio(Some(after)),
                        factor_words(if b == 0.0 { f64::INFINITY } else { after / b })
                    ),
                    (_, after) => ratio(after),
                };
                let tag = e.in_base().map(|t| format!(" ({t})")).unwrap_or_default();
                table.row(&[
                    format!("{}{tag}", code(&e.check.name)),
                    e.check.layer.as_deref().map(code).unwrap_or_default(),
                    if case == "—" { case } else { code(&case) },
                    message(&f.headline),
                    f.likely_cause.as_deref().map_or("—".into(), message),
                    worst,
                ]);
            }
            let (text, _) = table.render(room(&out), "failed checks");
            out.push_str(&text);
            out.push('\n');
        }

        let unaccepted: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| !e.failed() && e.check.unaccepted.is_some())
            .collect();
        if !unaccepted.is_empty() {
            let _ = writeln!(
                out,
                "#### Snapshots not accepted\n\nThese checks pass, but their snapshot differs from \
                 the committed one, so their tests fail until it is accepted: run `cargo insta \
                 review` (or `cargo insta accept`) where the tests ran, and commit the `.snap` \
                 files.\n"
            );
            let mut table = Table::new(&["check", "committed snapshot"]);
            for e in &unaccepted {
                let file = e.check.unaccepted.as_ref().expect("filtered");
                table.row(&[code(&e.check.name), code(&file.display().to_string())]);
            }
            let (text, _) = table.render(room(&out), "snapshots");
            out.push_str(&text);
            out.push('\n');
        }

        if self.base.is_some() {
            let changed: Vec<&Entry> = self
                .entries
                .iter()
                .filter(|e| e.listed() && !e.changes.is_empty())
                .collect();
            if changed.is_empty() && failures_changed > 0 {
                let _ = writeln!(
                    out,
                    "Nothing else changed against the base: the failures above are what changed.\n"
                );
            } else if changed.is_empty() {
                let _ = writeln!(out, "Nothing changed against the base.\n");
            } else {
                let _ = writeln!(out, "#### Changed against the base, worst first\n");
                let mut table = Table::new(&["check", "what changed", "before", "after", "factor"]);
                for e in &changed {
                    for c in &e.changes {
                        table.row(&change_row(&e.check.name, c));
                    }
                }
                let (text, _) = table.render(room(&out), "changes");
                out.push_str(&text);
                out.push('\n');
            }
        }

        if self.base.is_some() {
            out.push_str(&self.speed_markdown(room(&out)));
        }

        let rest: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| !e.listed() && e.check.status.is_some())
            .collect();
        if !rest.is_empty() {
            let what = if self.base.is_some() {
                "unchanged"
            } else {
                "passing"
            };
            let _ = write!(
                out,
                "<details><summary>{} {what} check{}</summary>\n\n",
                rest.len(),
                if rest.len() == 1 { "" } else { "s" }
            );
            let mut table = Table::new(&["check", "layer", "worst / allowed"]);
            for e in &rest {
                table.row(&[
                    code(&e.check.name),
                    e.check.layer.as_deref().map(code).unwrap_or_default(),
                    ratio(e.check.worst_ratio),
                ]);
            }
            let budget = limit.saturating_sub(out.chars().count() + closing.len());
            let (text, _) = table.render(budget, "checks");
            out.push_str(&text);
            out.push_str(closing);
        }
        out
    }

    /// The speed against the base: the figures that moved beyond both runs' noise, the most
    /// moved first, in at most `budget` characters; a line when none did, or when there was
    /// nothing to compare.
    fn speed_markdown(&self, budget: usize) -> String {
        let compared: usize = self.entries.iter().map(|e| e.speed.0).sum();
        let moved: Vec<(&Entry, &crate::speed::SpeedMove)> = self
            .entries
            .iter()
            .flat_map(|e| e.speed.1.iter().map(move |m| (e, m)))
            .collect();
        let timed = self.entries.iter().any(|e| !e.check.speed.is_empty());
        if compared == 0 {
            return if timed {
                "Speed is compared with a base of results (the results folder of a run of the \
                 base): its snapshots hold no timings, so none was compared.\n\n"
                    .to_string()
            } else {
                String::new()
            };
        }
        if moved.is_empty() {
            return format!(
                "Speed: none of the {compared} figure{} timed in both runs (the port's time over \
                 the reference's) moved beyond the noise of their runs.\n\n",
                if compared == 1 { "" } else { "s" }
            );
        }
        let mut out = format!(
            "#### Speed against the base\n\nThe port's time over the reference's, each the median \
             of warm runs on both sides, in brackets the range the runs agree on (the port's lower \
             quartile over the reference's upper one, to its upper quartile over their lower one). \
             Listed only where this run's range and the base's do not overlap ({} of {compared} \
             figures); never a failure: timings on shared machines are noisy.\n\n",
            moved.len()
        );
        let mut table = Table::new(&["check", "dtype", "where", "before", "after", "moved"]);
        let ratio = |r: &golden::internal::judge::speed::Ratio| {
            use golden::internal::judge::speed::times;
            format!("{}× ({}–{}×)", times(r.median), times(r.lo), times(r.hi))
        };
        for (e, m) in &moved {
            let words = if m.factor >= 1.0 {
                format!(
                    "**{}× slower**",
                    golden::internal::judge::speed::times(m.factor)
                )
            } else {
                format!(
                    "{}× faster",
                    golden::internal::judge::speed::times(1.0 / m.factor)
                )
            };
            table.row(&[
                code(&e.check.name),
                cell(&m.dtype),
                if m.point {
                    code(&m.what)
                } else {
                    cell(&m.what)
                },
                format!("{} over {} runs", cell(&ratio(&m.before)), m.runs.0),
                format!("{} over {} runs", cell(&ratio(&m.after)), m.runs.1),
                words,
            ]);
        }
        let (text, _) = table.render(budget.saturating_sub(out.chars().count()), "speed figures");
        out.push_str(&text);
        out.push('\n');
        out
    }

    /// Everything, as JSON (untruncated).
    pub fn json(&self) -> Json {
        let (total, failed, unaccepted) = self.counts();
        let check = |e: &Entry| {
            let c = &e.check;
            json!({
                "check": c.name,
                "crate": c.krate,
                "layer": c.layer,
                "status": c.status.map(Status::name),
                "worst_ratio": c.worst_ratio,
                "base_worst_ratio": e.base.as_ref().and_then(|b| b.worst_ratio),
                "failure": c.failure.as_ref().map(|f| json!({
                    "headline": f.headline,
                    "case": f.case,
                    "dtype": f.dtype,
                    "likely_cause": f.likely_cause,
                    "worst_ratio": f.worst_ratio,
                    "artifacts": f.artifacts,
                    "new": e.newly_failed(),
                    "in_base": e.in_base(),
                    "changed": e.failure_changed(),
                })),
                "snapshot_not_accepted": c.unaccepted,
                "speed_compared": e.speed.0,
                "speed_moves": e.speed.1.iter().map(|m| json!({
                    "dtype": m.dtype,
                    "what": m.what,
                    "point": m.point,
                    "before": m.before.to_json(),
                    "after": m.after.to_json(),
                    "factor": m.factor,
                    "runs": [m.runs.0, m.runs.1],
                })).collect::<Vec<_>>(),
                "changes": e.changes.iter().map(|c| json!({
                    "kind": c.kind,
                    "what": c.what,
                    "before": c.before,
                    "after": c.after,
                    "factor": c.factor.map(|f| if f.is_finite() { json!(f) } else { json!("inf") }),
                })).collect::<Vec<_>>(),
            })
        };
        json!({
            "results": self.results,
            "base": self.base,
            "checks": total,
            "passed": total - failed,
            "failed": failed,
            "snapshots_not_accepted": unaccepted,
            "older_results_left_out": self.stale,
            "base_checks_not_run_here": self.not_run,
            "entries": self.entries.iter().map(check).collect::<Vec<_>>(),
        })
    }
}

/// The markdown for a results folder with no results: what to look at instead.
pub fn no_results(results: &Path) -> String {
    format!(
        "### ❌ golden: no results\n\nNo check wrote results in {}: the build or the test run \
         stopped before any check ran (see the job's log).\n",
        markdown::code(&results.display().to_string(), Place::Line)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "layer: rms_norm
reference: transformers.models.llama.modeling_llama.LlamaRMSNorm (module form, torch backend)
dims: b in 1..=2, t in 1..=8, d in 1..=64
args:
  x [b, t, d] ~ normal(0.0, 1.0)
cases: 32 per dtype, seed 0
f32:
  out f32 [b, t, d]
    tolerance: golden default: atol 1e-5 + rtol 1.3e-6·|ref| + 16 × rounding estimate
    max |port - ref|: 7.2e-7, worst element 0.034× allowed
golden store: recorded with Python 3.11.7, numpy 2.4.6, torch 2.15.0, transformers 5.22.0
golden store: source transformers/models/llama/modeling_llama.py sha256 97296b66ed59
golden store: sha256 aaaa
";

    fn snapshot(text: &str) -> Check {
        let parsed = parse(text);
        Check {
            name: "norm__rms_norm".into(),
            status: Some(Status::Snapshot),
            store: store_info(&parsed.store),
            worst_ratio: worst_of(text),
            snapshot: Some(text.into()),
            ..Check::default()
        }
    }

    #[test]
    fn a_figure_that_moved_is_named_with_its_factor_noise_is_not() {
        let head = BASE.replace(
            "max |port - ref|: 7.2e-7, worst element 0.034× allowed",
            "max |port - ref|: 2.1e-5, worst element 0.98× allowed",
        );
        let found = changes(&snapshot(BASE), &snapshot(&head));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].kind, "figure");
        assert_eq!(found[0].what, "f32 / out f32 / max |port - ref|");
        assert_eq!(
            found[0].before.as_deref(),
            Some("7.2e-7, worst element 0.034× allowed")
        );
        let f = found[0].factor.unwrap();
        assert!((f - 0.98 / 0.034).abs() < 1e-9, "{f}");
        // Twice the error: what another CPU does; the comparator matches it, so does this.
        let noise = BASE.replace(
            "7.2e-7, worst element 0.034×",
            "1.4e-6, worst element 0.068×",
        );
        assert!(changes(&snapshot(BASE), &snapshot(&noise)).is_empty());
    }

    #[test]
    fn a_re_recorded_store_names_its_versions_and_sources() {
        let head = BASE
            .replace("transformers 5.22.0", "transformers 5.23.0")
            .replace("97296b66ed59", "0123456789ab")
            .replace("sha256 aaaa", "sha256 bbbb");
        let found = changes(&snapshot(BASE), &snapshot(&head));
        let kinds: Vec<(&str, &str, Option<&str>, Option<&str>)> = found
            .iter()
            .map(|c| {
                (
                    c.kind,
                    c.what.as_str(),
                    c.before.as_deref(),
                    c.after.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("versions", "transformers", Some("5.22.0"), Some("5.23.0")),
                (
                    "source",
                    "transformers/models/llama/modeling_llama.py",
                    Some("97296b66ed59"),
                    Some("0123456789ab")
                ),
                (
                    "store",
                    "golden store re-recorded",
                    Some("aaaa"),
                    Some("bbbb")
                ),
            ]
        );
    }

    #[test]
    fn fields_tolerances_and_dtypes_are_told_apart() {
        let head = BASE
            .replace("cases: 32 per dtype", "cases: 64 per dtype")
            .replace("d in 1..=64", "d in 1..=128")
            .replace("16 × rounding estimate", "64 × rounding estimate");
        let found = changes(&snapshot(BASE), &snapshot(&head));
        let kinds: Vec<(&str, &str)> = found.iter().map(|c| (c.kind, c.what.as_str())).collect();
        assert_eq!(
            kinds,
            vec![
                ("field", "dims"),
                ("field", "cases"),
                ("tolerance", "f32 / out f32 / tolerance"),
            ]
        );
        let bf16 = BASE.replace("golden store: recorded", "bf16:\n  out bf16 [b, t, d]\n    tolerance: x\n    max |port - ref|: 1e-3, worst element 0.1× allowed\ngolden store: recorded");
        let found = changes(&snapshot(BASE), &snapshot(&bf16));
        assert!(found.iter().any(|c| c.kind == "dtypes"
            && c.before.as_deref() == Some("f32")
            && c.after.as_deref() == Some("f32, bf16")));
    }

    #[test]
    fn a_table_is_never_cut_and_counts_what_it_left_out() {
        let mut table = Table::new(&["a", "b"]);
        for i in 0..1000 {
            table.row(&[format!("row {i}"), "x".repeat(50)]);
        }
        let (text, left) = table.render(5000, "rows");
        assert!(text.chars().count() <= 5000);
        assert!(left > 0 && left < 1000);
        assert!(text.contains(&format!("and {left} more rows")), "{text}");
        let rows = text.lines().filter(|l| l.starts_with("| row ")).count();
        assert_eq!(rows + left, 1000);
    }

    #[test]
    fn cells_escape_pipes_and_markup_and_stay_on_one_line() {
        assert_eq!(cell("max |port - ref|"), "max \\|port \\- ref\\|");
        assert_eq!(cell("a <- b\nc"), "a \\<\\- b c");
        assert_eq!(message("`x<y`"), "`x<y`");
        let long = message(&format!("`{}`", "y".repeat(1000)));
        assert!(long.ends_with("`…"), "{long}");
    }
}
