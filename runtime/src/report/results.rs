//! The results file of each check, `target/golden/results/<crate>/<check>.json`.
//!
//! Written after every check, passing or failing, so that tools outside the test process (the
//! quickstart's report, `cargo xtask zoo`) can show what the last run found. Best effort: a
//! read-only target directory never fails a check.
//!
//! Each file says which **run** wrote it and when, so that `golden report` can tell the last run's
//! results from older ones (a check since removed, an earlier mode). A run is one `cargo test` or
//! `cargo nextest run`: every test process it starts. Its id is, in this order, `GOLDEN_RUN` (a
//! script that runs several cargo commands names them one run), nextest's `NEXTEST_RUN_ID`, the
//! cargo process that started this test process (its pid and start time, from `/proc` — cargo
//! runs each test binary as its child), else this process alone.

use crate::describe::checks::Kind;
use crate::describe::layer::dtype_name;
use crate::describe::layer::Layer;
use crate::judge::compare::{ErrorHistogram, Verdict};
use crate::report::failure::Failure;
use crate::report::passed::Report;
use serde_json::{json, Value as Json};
use std::path::PathBuf;
use std::time::Duration;

/// The folder results are written to for a check's crate.
pub fn results_dir(layer: &Layer) -> Option<PathBuf> {
    layer.golden_folder("results")
}

/// JSON has no infinities: those become strings.
fn finite(x: f64) -> Json {
    if x.is_finite() {
        json!(x)
    } else {
        json!(x.to_string())
    }
}

fn leaves_json(report: &Report) -> Vec<Json> {
    let mut out = Vec::new();
    for run in &report.runs {
        let Some(first) = run.cases.first() else {
            continue;
        };
        for (i, leaf) in first.leaves.iter().enumerate() {
            let mut max_abs = 0.0f64;
            let mut worst = 0.0f64;
            let mut needed = 0.0f64;
            let mut accuracy: Option<f64> = None;
            let mut histogram = ErrorHistogram::default();
            for case in &run.cases {
                if let Some(Verdict::Values(v)) = case.leaves.get(i).map(|l| &l.verdict) {
                    if let Some(g) = &v.greatest_abs {
                        max_abs = max_abs.max(g.diff);
                    }
                    worst = worst.max(v.worst_ratio);
                    needed = needed.max(v.factor_needed);
                    if let Some(a) = v.accuracy {
                        accuracy = Some(accuracy.unwrap_or(0.0).max(a.ratio));
                    }
                    histogram.merge(&v.histogram);
                }
            }
            out.push(json!({
                "dtype": dtype_name(run.dtype),
                "leaf": leaf.name,
                "shape": leaf.reference.as_ref().map(|r| r.0.clone()),
                "max_abs": finite(max_abs),
                "worst_ratio": finite(worst),
                "factor_needed": finite(needed),
                "accuracy_ratio": accuracy.map(finite),
                "histogram": {
                    "exact": histogram.exact,
                    "lowest_log2": ErrorHistogram::LOWEST,
                    "counts": histogram.counts,
                },
            }));
        }
    }
    out
}

/// The figures of the kind of check (finite-difference errors, losses), each the largest over
/// the cases.
fn figures_json(report: &Report) -> Json {
    let mut out = serde_json::Map::new();
    for (name, value) in report
        .runs
        .iter()
        .flat_map(|r| &r.cases)
        .flat_map(|c| &c.figures)
    {
        let slot = out.entry(name.clone()).or_insert(json!(*value));
        if slot.as_f64().is_some_and(|v| v < *value) {
            *slot = json!(*value);
        }
    }
    Json::Object(out)
}

/// The id of the run this test process belongs to (see the module's documentation).
pub fn run_id() -> String {
    if let Some(name) = crate::describe::env::run_name() {
        return name;
    }
    if let Ok(id) = std::env::var("NEXTEST_RUN_ID") {
        return format!("nextest-{id}");
    }
    static PROCESS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PROCESS
        .get_or_init(|| {
            let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|b| b.trim().to_string())
                .unwrap_or_default();
            let parent = std::os::unix::process::parent_id();
            let comm = std::fs::read_to_string(format!("/proc/{parent}/comm")).unwrap_or_default();
            match started_ticks(parent) {
                Some(ticks) if comm.trim() == "cargo" => format!("cargo-{boot}-{parent}-{ticks}"),
                _ => format!(
                    "process-{boot}-{}-{}",
                    std::process::id(),
                    started_ticks(std::process::id()).unwrap_or(0)
                ),
            }
        })
        .clone()
}

/// When a process started, in clock ticks since boot (`/proc/<pid>/stat`, field 22): with the pid
/// and the boot, it names the process even after its pid is reused.
fn started_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after its end.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A training's figures as the report shows them: the losses, and the parity with PyTorch against
/// what it allows (`worst_ratio` above 1 fails, like a leaf's).
fn training_json(figures: &[(String, f64)]) -> Option<Json> {
    use crate::describe::checks::{PARITY_LOSS_RTOL, PARITY_UPDATE_RTOL};
    let get = |name: &str| figures.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let (initial, last) = (get("loss.initial")?, get("loss.final")?);
    let (loss, update) = (get("parity.loss"), get("parity.update"));
    let worst = [
        loss.map(|l| l / PARITY_LOSS_RTOL),
        update.map(|u| u / PARITY_UPDATE_RTOL),
    ]
    .into_iter()
    .flatten()
    .fold(0.0f64, f64::max);
    Some(json!({
        "loss_initial": finite(initial),
        "loss_final": finite(last),
        "loss_allowed": get("loss.bound").map(finite),
        "parity_loss": loss.map(finite),
        "parity_loss_allowed": PARITY_LOSS_RTOL,
        "parity_update": update.map(finite),
        "parity_update_allowed": PARITY_UPDATE_RTOL,
        "worst_ratio": finite(worst),
    }))
}

/// What a results file says of the check's golden store: its SHA-256 and what it was recorded with.
fn store_json(layer: &Layer, kind: Kind) -> Json {
    let Some(stamp) = crate::answers::store::path(layer, kind.suffix())
        .and_then(|p| crate::answers::store::stamp(&p))
    else {
        return Json::Null;
    };
    json!({
        "sha256": stamp.sha256,
        "provenance": stamp.provenance.map(|p| p.to_json()),
    })
}

/// Write the results of one check. `description` is what the check is about (its snapshot's
/// first lines; empty when the check failed before it was known).
pub fn record(
    layer: &Layer,
    kind: Kind,
    description: &str,
    result: &Result<Report, Failure>,
    elapsed: Duration,
) {
    let Some(dir) = results_dir(layer) else {
        return;
    };
    let name = format!("{}{}", layer.check_name(), kind.suffix());
    let snapshot_file = layer
        .declared
        .map(|d| std::path::Path::new(d.snapshot_dir).join(format!("{name}.snap")));
    let mut doc = json!({
        "run": run_id(),
        "written_ms": now_ms(),
        "layer": layer.name,
        "check": name,
        "reference": layer.reference,
        "dtypes": layer.dtypes.iter().map(|d| dtype_name(*d)).collect::<Vec<_>>(),
        "seconds": elapsed.as_secs_f64(),
        "kind": kind.name(),
        "trace": layer.trace && kind == Kind::Forward,
        "description": (!description.is_empty()).then_some(description),
        "snapshot_file": snapshot_file,
        "store": store_json(layer, kind),
    });
    match result {
        Ok(report) => {
            doc["status"] = json!("pass");
            // The snapshot's text as this run made it (`None` when the cases were not the
            // declared ones): `golden report --markdown` compares it with the base's.
            doc["snapshot"] = json!(report.snapshot());
            doc["cases"] = json!(report.cases);
            doc["source"] = json!(report.source);
            doc["leaves"] = Json::Array(leaves_json(report));
            doc["figures"] = figures_json(report);
            if kind == Kind::Overfit {
                let figures: Vec<(String, f64)> = report
                    .runs
                    .iter()
                    .flat_map(|r| &r.cases)
                    .flat_map(|c| c.figures.iter().cloned())
                    .collect();
                doc["training"] = json!(training_json(&figures));
            }
            doc["health"] = json!(report.health);
            doc["speed"] = Json::Array(report.speed.iter().map(|s| s.to_json()).collect());
            if let Some(max) = layer.speed_max {
                doc["speed_limit"] = json!({"max": max, "exceeded": false});
            }
            let mut notes: Vec<&str> = Vec::new();
            for n in report
                .runs
                .iter()
                .flat_map(|r| &r.cases)
                .flat_map(|c| &c.notes)
            {
                if !notes.contains(&n.summary.as_str()) {
                    notes.push(&n.summary);
                }
            }
            doc["notes"] = json!(notes);
        }
        Err(failure) => {
            doc["status"] = json!("fail");
            let message = failure.to_string();
            doc["headline"] = json!(message.lines().next().unwrap_or_default());
            doc["likely_cause"] = json!(failure.likely_cause());
            doc["failure"] = json!(message);
            doc["dtype"] = json!(failure.dtype);
            doc["case"] = json!(failure.case.as_ref().map(|c| c.to_string()));
            doc["passed_before"] = json!(failure.passed_before);
            if let crate::report::failure::FailureKind::Speed(slow) = &failure.kind {
                // The numbers matched: the check's cases all passed, its speed did not.
                doc["speed"] = json!([slow.speed.to_json()]);
                doc["speed_limit"] = json!({"max": slow.max, "exceeded": true});
                doc["passed_before"] = json!(slow.cases);
            }
            if let (Some(dir), true) = (
                crate::report::artifacts::folder(layer, kind),
                matches!(failure.kind, crate::report::failure::FailureKind::Case(_)),
            ) {
                if dir.exists() {
                    doc["artifacts"] = json!(dir);
                }
            }
            if let Some(c) = failure.case_failure() {
                if let Some(training) = training_json(&c.figures) {
                    doc["training"] = training;
                }
                doc["leaves"] = Json::Array(
                    c.leaves
                        .iter()
                        .map(|l| {
                            let (max_abs, worst, histogram) = match &l.verdict {
                                Verdict::Values(v) => (
                                    v.greatest_abs.as_ref().map_or(0.0, |g| g.diff),
                                    v.worst_ratio,
                                    v.histogram.clone(),
                                ),
                                _ => (f64::NAN, f64::INFINITY, ErrorHistogram::default()),
                            };
                            json!({
                                "dtype": failure.dtype,
                                "leaf": l.name,
                                "shape": l.reference.as_ref().map(|r| r.0.clone()),
                                "passes": l.passes(),
                                "max_abs": finite(max_abs),
                                "worst_ratio": finite(worst),
                                "histogram": {
                                    "exact": histogram.exact,
                                    "lowest_log2": ErrorHistogram::LOWEST,
                                    "counts": histogram.counts,
                                },
                            })
                        })
                        .collect(),
                );
            }
        }
    }
    let trace_dir = match (&doc["artifacts"], result) {
        (Json::String(dir), _) => Some(PathBuf::from(dir).join("trace")),
        (_, Ok(_)) => crate::report::artifacts::trace_folder(layer),
        _ => None,
    };
    if let Some(dir) = trace_dir.filter(|d| layer.trace && kind == Kind::Forward && d.exists()) {
        doc["trace_dump"] = json!(dir);
    }
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(
            dir.join(format!("{name}.json")),
            serde_json::to_vec_pretty(&doc).unwrap_or_default(),
        );
    }
}
