//! The results file of each check, `target/golden/results/<crate>/<check>.json`.
//!
//! Written after every check, passing or failing, so that tools outside the test process (the
//! quickstart's report, `cargo xtask zoo`) can show what the last run found. Best effort: a
//! read-only target directory never fails a check.

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

/// Write the results of one check.
pub fn record(layer: &Layer, kind: Kind, result: &Result<Report, Failure>, elapsed: Duration) {
    let Some(dir) = results_dir(layer) else {
        return;
    };
    let name = format!("{}{}", layer.check_name(), kind.suffix());
    let mut doc = json!({
        "layer": layer.name,
        "check": name,
        "reference": layer.reference,
        "dtypes": layer.dtypes.iter().map(|d| dtype_name(*d)).collect::<Vec<_>>(),
        "seconds": elapsed.as_secs_f64(),
        "kind": kind.name(),
        "trace": layer.trace && kind == Kind::Forward,
    });
    match result {
        Ok(report) => {
            doc["status"] = json!("pass");
            doc["cases"] = json!(report.cases);
            doc["source"] = json!(report.source);
            doc["leaves"] = Json::Array(leaves_json(report));
            doc["figures"] = figures_json(report);
            doc["health"] = json!(report.health);
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
            doc["failure"] = json!(failure.to_string());
            doc["dtype"] = json!(failure.dtype);
            doc["case"] = json!(failure.case.as_ref().map(|c| c.to_string()));
            doc["passed_before"] = json!(failure.passed_before);
            if let (Some(dir), true) = (
                crate::report::artifacts::folder(layer, kind),
                matches!(failure.kind, crate::report::failure::FailureKind::Case(_)),
            ) {
                if dir.exists() {
                    doc["artifacts"] = json!(dir);
                }
            }
            if let Some(c) = failure.case_failure() {
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
