//! The text of a check's insta snapshot.
//!
//! It records what a reviewer needs to see change: the reference, the inputs, the parameters, the
//! tolerance, per leaf how far the port is from the reference over all cases, what the check
//! noticed without failing, and the SHA-256 of the golden store it was made with.
//!
//! Error figures are written with two significant digits and compared by [`SnapshotComparator`]:
//! two figures match when they are within a factor of [`FIGURE_FACTOR`], or when both are far
//! inside their tolerance (at most [`NOISE_RATIO`] of it). Everything else must be equal. The error
//! a correct port makes is rounding noise, and on another CPU (other kernels and cache sizes in the
//! matmul libraries of both sides) it moves by a small factor; a decade bucket moved across its
//! boundary on such a change. So a snapshot is the same on every machine, and a four-fold change in
//! error (or any change of tolerance, shapes, parameters, reference or store) shows as a diff in the
//! pull request.
//!
//! The assertion itself is expanded in the user's crate by the macro (insta attributes a snapshot to
//! the code that expands `assert_snapshot!`); this module only builds the text and the comparator.

use crate::describe::inputs::CaseParams;
use crate::describe::layer::dtype_name;
use crate::describe::layer::Layer;
use crate::describe::numbers::num;
use crate::judge::compare::{Leaf, Rule, Verdict};
use crate::report::passed::Report;
use std::fmt::Write as _;

/// Figures within this factor of each other match ([`SnapshotComparator`]).
pub const FIGURE_FACTOR: f64 = 4.0;

/// Figures whose error is at most this fraction of the allowed error match each other: far inside
/// the tolerance, the error is rounding noise whose size says nothing.
pub const NOISE_RATIO: f64 = 1.0 / 64.0;

/// The line of a snapshot that records its golden store's SHA-256.
pub const STORE_LINE: &str = "golden store: sha256 ";

/// The store digest recorded by the committed snapshot `name` of `layer` (see
/// [`Report::committed_store_digest`]).
pub fn committed_store_digest(
    layer: &Layer,
    name: &str,
) -> Result<Option<String>, std::path::PathBuf> {
    let dir = layer
        .declared
        .map(|d| std::path::PathBuf::from(d.snapshot_dir))
        .unwrap_or_default();
    let path = dir.join(format!("{name}.snap"));
    let text = std::fs::read_to_string(&path).map_err(|_| path.clone())?;
    Ok(text
        .lines()
        .find_map(|l| l.trim().strip_prefix(STORE_LINE))
        .map(|d| d.trim().to_string()))
}

/// A figure with two significant digits (`3.1e-3`, `0.19`, `0`).
pub fn figure(x: f64) -> String {
    crate::describe::numbers::num_sig(x, 2)
}

/// `value (R× allowed)`: an error and its ratio to the tolerance.
fn with_ratio(value: f64, ratio: f64) -> String {
    format!("{} ({}× allowed)", figure(value), figure(ratio))
}

/// Prefix of the snapshot's lines about the check's golden store.
pub const STORE_PREFIX: &str = "golden store: ";

/// The snapshot's lines about a golden store: what it was recorded with (Python and the packages'
/// versions, one line; each reference source file's SHA-256, shortened, one line each), whether
/// its size bound left cases out (a replay then checks the digest instead of the figures), and the
/// file's SHA-256. A re-recorded store changes these lines, so the pull request's diff says why
/// its bytes changed (`transformers 5.22.0` → `5.23.0`, `modeling_llama.py` edited).
pub fn store_lines(stamp: &crate::answers::store::Stamp) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(p) = &stamp.provenance {
        let mut with = vec![format!("Python {}", p.python)];
        with.extend(p.packages.iter().map(|(name, v)| format!("{name} {v}")));
        lines.push(format!("{STORE_PREFIX}recorded with {}", with.join(", ")));
        for (file, sha) in &p.sources {
            lines.push(format!(
                "{STORE_PREFIX}source {file} sha256 {}",
                &sha[..sha.len().min(SOURCE_HASH_DIGITS)]
            ));
        }
    }
    if let Some((kept, evaluated, bound)) = stamp.partial {
        lines.push(format!(
            "{STORE_PREFIX}partial: holds {kept} of the {evaluated} cases recording evaluated, the \
             others beyond its size bound ({}, GOLDEN_STORE_LIMIT): a replay runs those {kept} and \
             checks the SHA-256 below instead of the figures above",
            crate::describe::numbers::bytes(bound as u128)
        ));
    }
    lines.push(format!("{STORE_PREFIX}sha256 {}", stamp.sha256));
    lines
}

/// A snapshot file's contents (insta's header, then the snapshot) with its store lines replaced
/// by those of `text` (a snapshot's text); `None` when the file has no insta header.
fn with_store_lines(file: &str, text: &str) -> Option<String> {
    // insta's header: `---`, its fields, `---`; the snapshot follows.
    let rest = file.strip_prefix("---\n")?;
    let end = rest.find("\n---\n")? + "\n---\n".len();
    let (header, body) = rest.split_at(end);
    let mut lines: Vec<&str> = body
        .lines()
        .filter(|l| !l.starts_with(STORE_PREFIX))
        .collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines.extend(text.lines().filter(|l| l.starts_with(STORE_PREFIX)));
    Some(format!("---\n{header}{}\n", lines.join("\n")))
}

/// Hex digits of a reference source file's SHA-256 in the snapshot: enough to tell two versions
/// apart at a glance (the store's own SHA-256, in full, is what guards the bytes).
const SOURCE_HASH_DIGITS: usize = 12;

/// The symbolic shape of a leaf across cases: an axis is the dim it always equals, else its size if
/// constant, else `?`.
fn symbolic_shape(layer: &Layer, shapes: &[(Vec<usize>, &CaseParams)]) -> String {
    let Some((first, _)) = shapes.first() else {
        return "[]".into();
    };
    if shapes.iter().any(|(s, _)| s.len() != first.len()) {
        return "(rank varies)".into();
    }
    let axes: Vec<String> = (0..first.len())
        .map(|axis| {
            let sym = layer.dims.iter().find(|d| {
                shapes
                    .iter()
                    .all(|(s, case)| case.dim(&d.name) == Some(s[axis]))
            });
            match sym {
                Some(d) => d.name.clone(),
                None if shapes.iter().all(|(s, _)| s[axis] == first[axis]) => {
                    first[axis].to_string()
                }
                None => "?".into(),
            }
        })
        .collect();
    format!("[{}]", axes.join(", "))
}

fn describe_rule(rule: &Rule) -> String {
    match rule {
        Rule::Default { atol, rtol, factor } if *factor > 0.0 => format!(
            "golden default: atol {} + rtol {}·|ref| + {} × rounding estimate",
            num(*atol),
            num(*rtol),
            num(*factor)
        ),
        Rule::Default { atol, rtol, .. } => format!(
            "assert_close default: atol {} + rtol {}·|ref| (no float64 evaluation)",
            num(*atol),
            num(*rtol)
        ),
        other => other.to_string(),
    }
}

/// The schedules a check's cases covered, as one line: how many of each kind, their lengths, the
/// padding, the generated tokens, and how often the window was crossed in a prefill and in a
/// decode step.
fn write_schedules(
    s: &mut String,
    cases: &[crate::report::passed::CaseRecord],
    window: Option<usize>,
) {
    use crate::describe::schedule::Padding;
    let all: Vec<&crate::describe::schedule::Steps> = cases
        .iter()
        .filter_map(|c| c.params.steps.as_ref())
        .collect();
    if all.is_empty() {
        return;
    }
    if all[0].looped {
        let lengths: Vec<usize> = all.iter().map(|s| s.chunks.len()).collect();
        let (lo, hi) = (
            lengths.iter().min().copied().unwrap_or(0),
            lengths.iter().max().copied().unwrap_or(0),
        );
        let _ = writeln!(s, "  loops: {} cases of {lo} to {hi} steps", all.len());
        return;
    }
    let range = |values: Vec<usize>| -> String {
        let (lo, hi) = (
            values.iter().copied().min().unwrap_or(0),
            values.iter().copied().max().unwrap_or(0),
        );
        if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}–{hi}")
        }
    };
    let once = |s: &&&crate::describe::schedule::Steps| s.chunks.len() == 1;
    let decodes: Vec<&&crate::describe::schedule::Steps> = all
        .iter()
        .filter(|s| s.chunks.len() > 1 && s.chunks[1..].iter().all(|&c| c == 1))
        .collect();
    let chunked = all
        .iter()
        .filter(|s| s.chunks.len() > 1 && s.chunks[1..].iter().any(|&c| c > 1))
        .count();
    let mut parts = vec![format!(
        "{} case{}",
        all.len(),
        if all.len() == 1 { "" } else { "s" }
    )];
    if !decodes.is_empty() {
        parts.push(format!(
            "{} decoding after a prefill of {}",
            decodes.len(),
            range(decodes.iter().map(|s| s.chunks[0]).collect())
        ));
    }
    if chunked > 0 {
        parts.push(format!("{chunked} chunked prefills"));
    }
    let at_once = all.iter().filter(once).count();
    if at_once > 0 {
        parts.push(format!("{at_once} all at once"));
    }
    parts.push(format!(
        "up to {} steps",
        all.iter().map(|s| s.lengths().len()).max().unwrap_or(0)
    ));
    let paddings: Vec<String> = Padding::ALL
        .into_iter()
        .filter_map(|p| {
            let n = all.iter().filter(|s| s.padding == p).count();
            (n > 0).then(|| format!("{} {n}", p.token()))
        })
        .collect();
    if paddings.len() > 1 || all[0].padding != Padding::None {
        parts.push(format!("padding {}", paddings.join(", ")));
    }
    let generating: Vec<usize> = all.iter().map(|s| s.generate).filter(|&g| g > 0).collect();
    if !generating.is_empty() {
        parts.push(format!(
            "{} generating {} tokens",
            generating.len(),
            range(generating.clone())
        ));
    }
    if let Some(w) = window {
        let in_prefill = all.iter().filter(|s| s.chunks[0] > w).count();
        let in_decode = all
            .iter()
            .filter(|s| s.lengths().len() > 1 && s.prompt() + s.generate > w.max(s.chunks[0]))
            .count();
        parts.push(format!(
            "the window of {w} crossed in the prefill in {in_prefill}, after it in {in_decode}"
        ));
    }
    let _ = writeln!(s, "  schedules: {}", parts.join("; "));
}

/// A schedule's leaves, each over every step of every case: `step.<k>.<leaf>` against the
/// reference's cached run, `oneshot.<k>.<leaf>` against its one-shot forward, trace points
/// without their call count.
fn write_steps(s: &mut String, cases: &[crate::report::passed::CaseRecord]) {
    let looped = cases
        .iter()
        .any(|c| c.params.steps.as_ref().is_some_and(|s| s.looped));
    let mut groups: Vec<(String, Vec<&Leaf>)> = Vec::new();
    for leaf in cases.iter().flat_map(|c| &c.leaves) {
        let key = match crate::describe::schedule::step_of(&leaf.name) {
            Some((_, rest)) if leaf.name.starts_with("oneshot.") => {
                format!("every step's {rest}, against the one-shot forward")
            }
            Some((_, rest)) if leaf.name.starts_with("free.") => {
                format!("every step's {rest}, free-running")
            }
            Some((_, rest)) if looped => format!("every step's {rest}, teacher-forced"),
            Some((_, rest)) => format!("every step's {rest}, against the cached run"),
            None => match leaf.name.rsplit_once('#') {
                Some((point, n)) if n.chars().all(|c| c.is_ascii_digit()) => point.to_string(),
                _ => leaf.name.clone(),
            },
        };
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, all)) => all.push(leaf),
            None => groups.push((key, vec![leaf])),
        }
    }
    for (key, leaves) in groups {
        let values: Vec<&crate::judge::compare::Values> = leaves
            .iter()
            .filter_map(|l| match &l.verdict {
                Verdict::Values(v) => Some(&**v),
                _ => None,
            })
            .collect();
        let dtype = leaves[0]
            .reference
            .as_ref()
            .map(|r| r.1.name())
            .unwrap_or("?");
        let _ = writeln!(s, "  {key} ({dtype})");
        let Some(v0) = values.first() else { continue };
        let _ = writeln!(s, "    tolerance: {}", describe_rule(&v0.rule));
        if v0.rule == Rule::Exact {
            let _ = writeln!(s, "    equal in every case");
            continue;
        }
        let max_abs = values
            .iter()
            .filter_map(|v| v.greatest_abs.as_ref().map(|g| g.diff))
            .fold(0.0f64, f64::max);
        let worst = values.iter().map(|v| v.worst_ratio).fold(0.0f64, f64::max);
        let _ = writeln!(
            s,
            "    max |port - ref|: {}, worst element {}× allowed",
            figure(max_abs),
            figure(worst)
        );
    }
}

impl Report {
    /// The snapshot's name: [`Layer::check_name`], and for the other kinds of check their suffix
    /// (`norms__layer_norm__gradients`).
    pub fn snapshot_name(&self) -> String {
        format!("{}{}", self.layer.check_name(), self.kind.suffix())
    }

    /// The snapshot text; `None` when the declared cases did not all run (see
    /// [`Report::snapshot_skipped`]).
    pub fn snapshot(&self) -> Option<String> {
        if self.snapshot_skipped().is_some() {
            return None;
        }
        Some(self.snapshot_text())
    }

    /// A check's first run: when its snapshot file does not exist yet, outside CI and unless
    /// `INSTA_UPDATE` says how insta should behave, write it (as insta writes an accepted
    /// snapshot) and return a line for the user that names it. A snapshot test tool's first run
    /// records its baseline (Jest does too); a *changed* snapshot still fails and goes through
    /// `cargo insta review`, and in CI (`CI=true`) a missing snapshot still fails, insta writing
    /// nothing. `None`: insta asserts as usual.
    pub fn write_first_snapshot(&self, text: &str) -> Option<String> {
        let declared = self.layer.declared?;
        let path = self.snapshot_file()?;
        let update = std::env::var("INSTA_UPDATE").unwrap_or_default();
        if path.exists() || !update.is_empty() || ci() {
            return None;
        }
        let contents = format!(
            "---\nsource: {}\n---\n{}\n",
            declared.source_file,
            text.trim_end()
        );
        std::fs::create_dir_all(declared.snapshot_dir).ok()?;
        std::fs::write(&path, contents).ok()?;
        Some(format!(
            "golden: `{}` passed its first run: its snapshot did not exist, so golden wrote it: {}\n  \
             read it (what was checked, and how close the port is) and commit it with your code; \
             from now on a change to it fails until you accept it (cargo insta review), and in CI \
             (CI=true) a missing snapshot fails",
            self.layer.name,
            path.display()
        ))
    }

    /// Where this check's snapshot file is (`<snapshot dir>/<name>.snap`), when it was declared.
    pub fn snapshot_file(&self) -> Option<std::path::PathBuf> {
        let declared = self.layer.declared?;
        Some(
            std::path::Path::new(declared.snapshot_dir)
                .join(format!("{}.snap", self.snapshot_name())),
        )
    }

    /// After `GOLDEN_MODE=record` wrote the check's golden store: bring the committed snapshot's
    /// store lines ([`store_lines`]) up to date with the store just written, so that recording
    /// never fails on the lines recording itself changed, and the snapshot and its store are
    /// committed together. Everything else in the snapshot (the figures, the description) is still
    /// asserted by insta as usual: a change there is for review (`cargo insta review`). A
    /// `.snap.new` insta left before (made against the old store) is removed: it is stale.
    ///
    /// Returns a line for the user when the file changed; `None` when this run did not record, or
    /// there is no snapshot file yet (the first run writes it whole).
    pub fn sync_recorded_snapshot(&self, text: &str) -> Option<String> {
        if !self.recorded {
            return None;
        }
        let path = self.snapshot_file()?;
        let old = std::fs::read_to_string(&path).ok()?;
        let pending = path.with_extension("snap.new");
        let _ = std::fs::remove_file(&pending);
        let updated = with_store_lines(&old, text)?;
        if updated == old {
            return None;
        }
        std::fs::write(&path, &updated).ok()?;
        Some(format!(
            "golden: `{}`: its snapshot's store lines now name the golden store just recorded: \
             {}\n  commit the two together; the pull request's diff shows what the store was \
             recorded with",
            self.layer.name,
            path.display()
        ))
    }

    /// The SHA-256 of the golden store that the check's committed snapshot records: `Ok(None)`
    /// when the snapshot has no store line, `Err` with the snapshot's path when there is no
    /// snapshot file to read.
    pub fn committed_store_digest(&self) -> Result<Option<String>, std::path::PathBuf> {
        committed_store_digest(&self.layer, &self.snapshot_name())
    }

    /// Why the snapshot, which describes the declared cases, is not compared this time.
    pub fn snapshot_skipped(&self) -> Option<&'static str> {
        if self.overridden {
            Some("GOLDEN_SEED, GOLDEN_CASES or GOLDEN_CASE changed the cases")
        } else if self.runs.iter().any(|r| r.skipped > 0) {
            Some("the golden store it replayed holds only some of the cases (its size bound)")
        } else {
            None
        }
    }

    fn snapshot_text(&self) -> String {
        let mut s = self.description.clone();
        for note in &self.params {
            let _ = writeln!(s, "{note}");
        }
        for run in &self.runs {
            let _ = writeln!(s, "{}:", dtype_name(run.dtype));
            if let Some((held, of, budget)) = run.budgeted {
                let _ = writeln!(
                    s,
                    "  cases: {held} of at most {of}, as many as the {} budget held (the golden \
                     store keeps the count)",
                    crate::describe::numbers::budget(budget)
                );
            }
            let covered = crate::describe::sweep::covered(
                run.cases.iter().map(|c| c.params.config.as_slice()),
            );
            if !covered.is_empty() {
                let _ = writeln!(s, "  configurations covered (cases each):");
                for (configuration, n) in covered {
                    let _ = writeln!(s, "    {configuration}: {n}");
                }
            }
            if self.layer.decode.is_some() || self.layer.steps.is_some() {
                write_schedules(&mut s, &run.cases, self.layer.window());
                write_steps(&mut s, &run.cases);
            } else {
                self.write_leaves(&mut s, &run.cases);
            }
            Self::write_figures(&mut s, &run.cases);
            write_evaluations(&mut s, &run.cases);
            let mut notes: Vec<&str> = Vec::new();
            for note in run.cases.iter().flat_map(|c| &c.notes) {
                if !notes.contains(&note.summary.as_str()) {
                    notes.push(&note.summary);
                }
            }
            for note in notes {
                let _ = writeln!(s, "  note: {note}");
            }
        }
        if self.kind == crate::describe::checks::Kind::Overfit {
            if self.health.is_empty() {
                let _ = writeln!(s, "gradient health: ok");
            }
            for h in &self.health {
                let _ = writeln!(s, "gradient health: {h}");
            }
        }
        for line in self.store.iter().flat_map(store_lines) {
            let _ = writeln!(s, "{line}");
        }
        s
    }

    /// Figures of the kind of check (finite-difference errors), each the largest over the cases.
    fn write_figures(s: &mut String, cases: &[crate::report::passed::CaseRecord]) {
        let mut names: Vec<&str> = Vec::new();
        for (name, _) in cases.iter().flat_map(|c| &c.figures) {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
        let bound = cases
            .iter()
            .flat_map(|c| &c.figures)
            .find(|(n, _)| n == "loss.bound")
            .map(|(_, v)| *v);
        for name in names {
            let max = cases
                .iter()
                .flat_map(|c| &c.figures)
                .filter(|(n, _)| n == name)
                .map(|(_, v)| *v)
                .fold(0.0f64, f64::max);
            use crate::describe::checks::{PARITY_LOSS_RTOL, PARITY_UPDATE_RTOL};
            let line = if let Some(input) = name.strip_prefix("fd.") {
                format!(
                    "finite differences, {input}: |analytic - numeric| {}× allowed",
                    figure(max)
                )
            } else if name == "loss.bound" {
                // Shown as the final loss's factor.
                continue;
            } else if name == "loss.final" && bound.is_some() {
                let bound = bound.unwrap_or(f64::NAN);
                format!(
                    "port's loss, final: {}",
                    with_ratio(max, max / bound.max(f64::MIN_POSITIVE))
                )
            } else if let Some(step) = name.strip_prefix("loss.") {
                format!("port's loss, {step}: {}", figure(max))
            } else if name == "parity.loss" {
                format!(
                    "loss, |port - PyTorch| / |PyTorch|, worst step: {}",
                    with_ratio(max, max / PARITY_LOSS_RTOL)
                )
            } else if name == "parity.update" {
                format!(
                    "update (final - initial weights), |port - PyTorch| / |PyTorch|, worst parameter: {}",
                    with_ratio(max, max / PARITY_UPDATE_RTOL)
                )
            } else {
                format!("{name}: {}", figure(max))
            };
            let _ = writeln!(s, "  {line}");
        }
    }

    fn write_leaves(&self, s: &mut String, cases: &[crate::report::passed::CaseRecord]) {
        let Some(first) = cases.first() else {
            let _ = writeln!(s, "  (no cases)");
            return;
        };
        let mut trace_header = false;
        for (i, leaf) in first.leaves.iter().enumerate() {
            let all: Vec<&Leaf> = cases.iter().filter_map(|c| c.leaves.get(i)).collect();
            let shapes: Vec<(Vec<usize>, &CaseParams)> = cases
                .iter()
                .filter_map(|c| {
                    c.leaves
                        .get(i)
                        .and_then(|l| l.reference.as_ref().map(|r| (r.0.clone(), &c.params)))
                })
                .collect();
            let dtype = leaf.reference.as_ref().map(|r| r.1.name()).unwrap_or("?");
            let values: Vec<&crate::judge::compare::Values> = all
                .iter()
                .filter_map(|l| match &l.verdict {
                    Verdict::Values(v) => Some(&**v),
                    _ => None,
                })
                .collect();
            let figures = |values: &[&crate::judge::compare::Values]| {
                let max_abs = values
                    .iter()
                    .filter_map(|v| v.greatest_abs.as_ref().map(|g| g.diff))
                    .fold(0.0f64, f64::max);
                let worst = values.iter().map(|v| v.worst_ratio).fold(0.0f64, f64::max);
                format!(
                    "{}, worst element {}× allowed",
                    figure(max_abs),
                    figure(worst)
                )
            };
            // Trace points: one line each, the drift against depth read top to bottom.
            if let (Some(point), Some(v0)) = (
                leaf.name.strip_prefix(crate::judge::trace::PREFIX),
                values.first(),
            ) {
                if !trace_header {
                    trace_header = true;
                    let _ = writeln!(
                        s,
                        "  trace, in the reference's execution order (tolerance: {}):",
                        describe_rule(&v0.rule)
                    );
                }
                let _ = writeln!(
                    s,
                    "    {point} {dtype} {}: max |port - ref|: {}",
                    symbolic_shape(&self.layer, &shapes),
                    figures(&values)
                );
                continue;
            }
            let _ = writeln!(
                s,
                "  {} {dtype} {}",
                leaf.name,
                symbolic_shape(&self.layer, &shapes)
            );
            let Some(v0) = values.first() else { continue };
            let _ = writeln!(s, "    tolerance: {}", describe_rule(&v0.rule));
            if v0.rule == Rule::Exact {
                let _ = writeln!(s, "    equal in every case");
                continue;
            }
            let _ = writeln!(s, "    max |port - ref|: {}", figures(&values));
            // NaN against NaN agrees and compares nothing: how much of the leaf said nothing.
            let agreed: usize = values.iter().map(|v| v.nonfinite_agreed).sum();
            if agreed > 0 {
                let numel: usize = values.iter().map(|v| v.numel).sum();
                let _ = writeln!(
                    s,
                    "    not compared: NaN or ±Inf on both sides at {agreed} of {numel} elements \
                     (they agree, and would for a port off by any factor)"
                );
            }
            let accuracies: Vec<crate::judge::compare::Accuracy> =
                values.iter().filter_map(|v| v.accuracy).collect();
            if !accuracies.is_empty() {
                // Each the largest over the cases: which case has the largest ratio (correct
                // ports sit at 1 in every class) is noise a snapshot must not follow.
                let rms = accuracies.iter().map(|a| a.rms).fold(0.0f64, f64::max);
                let ratio = accuracies.iter().map(|a| a.ratio).fold(0.0f64, f64::max);
                let _ = writeln!(
                    s,
                    "    accuracy against float64: port's RMS error {}, {}× allowed (the reference's own times {})",
                    figure(rms),
                    figure(ratio / crate::judge::compare::ACCURACY_FACTOR),
                    figure(crate::judge::compare::ACCURACY_FACTOR)
                );
            }
        }
    }
}

/// A whole model's staged evaluations (a checkpoint's cases): how many cases were judged at each
/// stage of the reference's evaluation (`answers/live.rs`' `Stage`), the later ones only where the
/// comparison needed them.
fn write_evaluations(s: &mut String, cases: &[crate::report::passed::CaseRecord]) {
    use crate::answers::live::Stage;
    let counts: Vec<(Stage, usize)> = Stage::ALL
        .into_iter()
        .map(|stage| {
            let n = cases
                .iter()
                .filter(|c| c.evaluations == Some(stage))
                .count();
            (stage, n)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    if counts.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "  reference evaluations (a whole model's, each further stage only where the comparison \
         needed it):"
    );
    for (stage, n) in counts {
        let _ = writeln!(
            s,
            "    {n} case{} {}",
            if n == 1 { "" } else { "s" },
            stage.describe()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(body: &str) -> insta::internals::SnapshotContents {
        insta::internals::TextSnapshotContents::new(body.to_string(), insta::TextSnapshotKind::File)
            .into()
    }

    #[test]
    fn figures_match_within_a_factor_and_far_inside_the_tolerance() {
        let same = |a: &str, b: &str| figures_match(&text(a), &text(b));
        let line =
            |v: &str, r: &str| format!("    max |port - ref|: {v}, worst element {r}× allowed\n");
        // A small factor: another CPU.
        assert!(same(&line("3.1e-3", "0.19"), &line("5.5e-3", "0.31")));
        // Four-fold and more: a change to review.
        assert!(!same(&line("3.1e-3", "0.19"), &line("1.3e-2", "0.8")));
        // Both far inside the tolerance: noise, whatever its size (0 included).
        assert!(same(&line("0", "0"), &line("6e-8", "0.0061")));
        assert!(!same(&line("0", "0"), &line("6e-5", "0.061")));
        // Anything but figures must be equal.
        assert!(!same("layer: a\n", "layer: b\n"));
        assert!(!same(
            "cases: 32 per dtype, seed 0\n",
            "cases: 64 per dtype, seed 0\n"
        ));
        assert!(!same(
            &line("3e-3", "0.19"),
            &(line("3e-3", "0.19") + "note: x\n")
        ));
        assert!(same(
            "  port's loss, final: 1.3e-5\n",
            "  port's loss, final: 2.1e-5\n"
        ));
        assert!(!same(
            "  port's loss, final: 1.3e-5\n",
            "  port's loss, final: 1.3e-3\n"
        ));
    }

    #[test]
    fn names_drop_the_crate_and_end_with_the_layer() {
        let declared = |module_path| crate::describe::layer::Declared {
            module_path,
            ..crate::declared!()
        };
        let layer = |m| Layer::function("gelu", "m.f").declared_at(declared(m));
        assert_eq!(
            layer("golden_zoo::activations::gelu").check_name(),
            "activations__gelu"
        );
        assert_eq!(layer("wrong_ports").check_name(), "gelu");
        assert_eq!(Layer::function("gelu", "m.f").check_name(), "gelu");
    }
}

/// The snapshot comparison golden installs (through the macro): the texts must be equal line by
/// line, except that figures (numbers after a label's `: `) match within [`FIGURE_FACTOR`] of each
/// other, or when both lines' worst error is at most [`NOISE_RATIO`] of the allowed error.
#[derive(Clone, Copy, Debug, Default)]
pub struct SnapshotComparator;

impl insta::Comparator for SnapshotComparator {
    fn matches(&self, reference: &insta::Snapshot, test: &insta::Snapshot) -> bool {
        figures_match(reference.contents(), test.contents())
    }

    fn dyn_clone(&self) -> Box<dyn insta::Comparator> {
        Box::new(*self)
    }
}

fn figures_match(
    reference: &insta::internals::SnapshotContents,
    test: &insta::internals::SnapshotContents,
) -> bool {
    let (Some(a), Some(b)) = (reference.as_text(), test.as_text()) else {
        return reference == test;
    };
    let (a, b) = (a.to_string(), b.to_string());
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| line_matches(x, y))
}

/// A snapshot line's error figures, as [`SnapshotComparator`] reads them.
#[derive(Clone, Debug, PartialEq)]
pub struct Figures {
    /// The line with its numbers replaced by `#` (two lines compare figure by figure only when
    /// this is the same).
    pub shape: String,
    /// The numbers, in order (`max |port - ref|: 7.2e-7, worst element 0.034× allowed`: 7.2e-7,
    /// 0.034).
    pub numbers: Vec<f64>,
    /// The worst error relative to the allowed one, when the line has it (`0.034× allowed`).
    pub ratio: Option<f64>,
}

/// The figures of a line that carries error figures (`… R× allowed`, a training's losses); `None`
/// for every other line, which must be equal.
pub fn figures_of(line: &str) -> Option<Figures> {
    if !is_figure_line(line) {
        return None;
    }
    let (shape, numbers, ratio) = split_figures(line)?;
    Some(Figures {
        shape,
        numbers,
        ratio,
    })
}

/// Whether two snapshot lines match as [`SnapshotComparator`] compares them: equal, or figure lines
/// of the same shape whose figures are within [`FIGURE_FACTOR`] of each other, or both far inside
/// their tolerance (at most [`NOISE_RATIO`] of it).
pub fn lines_match(a: &str, b: &str) -> bool {
    line_matches(a, b)
}

/// A figure line split into its text (numbers replaced by `#`), its numbers, and its worst error
/// relative to the allowed one when it has it (`R× allowed`).
fn split_figures(line: &str) -> Option<(String, Vec<f64>, Option<f64>)> {
    let (label, rest) = line.split_once(": ")?;
    let mut shape = String::new();
    let mut numbers = Vec::new();
    for word in rest.split(' ') {
        let token = word
            .trim_start_matches('(')
            .trim_end_matches(')')
            .trim_end_matches(',')
            .trim_end_matches('×');
        match token.parse::<f64>() {
            Ok(x) if token.chars().any(|c| c.is_ascii_digit()) => {
                numbers.push(x);
                shape.push_str(&word.replacen(token, "#", 1));
            }
            _ => shape.push_str(word),
        }
        shape.push(' ');
    }
    let words: Vec<&str> = rest.split(' ').collect();
    let ratio = words
        .windows(2)
        .find(|w| w[1].starts_with("allowed") && w[0].ends_with('×'))
        .and_then(|w| {
            w[0].trim_start_matches('(')
                .trim_end_matches('×')
                .parse()
                .ok()
        });
    Some((format!("{label}: {shape}"), numbers, ratio))
}

/// Whether a line carries error figures (the only lines compared with a tolerance).
fn is_figure_line(line: &str) -> bool {
    line.contains("× allowed") || line.trim_start().starts_with("port's loss, ")
}

fn line_matches(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    if !is_figure_line(a) || !is_figure_line(b) {
        return false;
    }
    let (Some((sa, na, ra)), Some((sb, nb, rb))) = (split_figures(a), split_figures(b)) else {
        return false;
    };
    if sa != sb || na.len() != nb.len() || na.is_empty() {
        return false;
    }
    if let (Some(ra), Some(rb)) = (ra, rb) {
        if ra <= NOISE_RATIO && rb <= NOISE_RATIO {
            return true;
        }
    }
    na.iter().zip(&nb).all(|(x, y)| {
        let (lo, hi) = (x.abs().min(y.abs()), x.abs().max(y.abs()));
        x == y || (x.signum() == y.signum() && lo > 0.0 && hi <= FIGURE_FACTOR * lo)
    })
}

/// Whether this runs in CI, as insta decides it (`CI` set and not `false`/`0`, or `TF_BUILD`).
pub(crate) fn ci() -> bool {
    match std::env::var("CI").ok().as_deref() {
        Some("false") | Some("0") | Some("") => false,
        None => std::env::var("TF_BUILD").is_ok(),
        Some(_) => true,
    }
}
