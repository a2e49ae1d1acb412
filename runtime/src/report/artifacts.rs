//! What a failing check leaves behind, for debugging outside the test:
//! `target/golden/failures/<crate>/<check>/`.
//!
//! ```text
//! case.json            the check, the case, the tolerance per leaf, import roots, the re-run command
//! inputs/<arg>.npy     the case's inputs (bf16 as float32 copies)
//! state_dict/<k>.npy   module form: the reference module's parameters
//! reference/<leaf>.npy what the reference returned
//! port/<leaf>.npy      what the port returned
//! rounding/<leaf>.npy  the per-element rounding estimate of the tolerance
//! repro.py             loads all that, runs the reference again, prints the same comparison
//! ```
//!
//! With `trace`, `reference/` and `port/` hold the trace points too (`trace.<point>.npy`), and
//! `trace/reference/` and `trace/port/` hold them again as `NNN_<point>.npy`, numbered in the
//! reference's execution order, for `golden diff trace/reference trace/port`.
//!
//! For the gradient check, `reference/` and `port/` hold the gradients (`grad.<name>.npy`), and
//! there is no repro.py (it reproduces forward comparisons).

use crate::describe::checks::Kind;
use crate::describe::env;
use crate::describe::inputs::CaseParams;
use crate::describe::layer::dtype_name;
use crate::describe::layer::Layer;
use crate::judge::compare::{Rule, Verdict};
use crate::report::failure::CaseFailure;
use candle_core::DType;
use golden_files::npy;
use golden_files::HostTensor;
use serde_json::{json, Map, Value as Json};
use std::path::{Path, PathBuf};

const REPRO: &str = include_str!("../../../reference_py/golden_ref/repro.py");

/// The one-line command that re-runs exactly this case of this check (`test` is the test function
/// the attribute generated for it).
pub fn rerun_case_command(layer: &Layer, test: &str, dtype: DType, case: &CaseParams) -> String {
    layer.rerun_command(
        test,
        &format!("GOLDEN_CASE='{}:{}'", case.token(), dtype_name(dtype)),
    )
}

/// The folder of a check's artifacts.
pub fn folder(layer: &Layer, kind: Kind) -> Option<PathBuf> {
    Some(
        layer
            .golden_folder("failures")?
            .join(format!("{}{}", layer.check_name(), kind.suffix())),
    )
}

fn write_all(dir: &Path, kind: &str, tensors: &[(String, HostTensor)]) -> Result<(), String> {
    if tensors.is_empty() {
        return Ok(());
    }
    let sub = dir.join(kind);
    std::fs::create_dir_all(&sub).map_err(|e| format!("{}: {e}", sub.display()))?;
    for (name, t) in tensors {
        let path = sub.join(format!("{name}.npy"));
        npy::write(&path, t).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

fn dtypes(tensors: &[(String, HostTensor)]) -> Json {
    Json::Object(
        tensors
            .iter()
            .map(|(n, t)| (n.clone(), json!(t.dtype.name())))
            .collect::<Map<_, _>>(),
    )
}

/// Where a traced check's passing run leaves one case's trace (for `golden report`):
/// `target/golden/traces/<crate>/<check>/`.
pub fn trace_folder(layer: &Layer) -> Option<PathBuf> {
    Some(layer.golden_folder("traces")?.join(layer.check_name()))
}

/// Both sides' trace points as `<dir>/reference/NNN_<point>.npy` and `<dir>/port/NNN_<point>.npy`,
/// numbered in the reference's execution order, so that a plain directory comparison
/// (`golden diff`) walks them in that order. Port taps the reference lacks are `port_only_<name>`.
pub fn write_trace(
    dir: &Path,
    reference: &crate::answers::live::ReferenceOutputs,
    port_outputs: &[(String, HostTensor)],
) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    let points: Vec<&(String, HostTensor)> = reference
        .expected
        .iter()
        .filter(|(n, _)| crate::judge::trace::is_trace(n))
        .collect();
    let width = points.len().to_string().len().max(3);
    let file = |i: usize, name: &str| {
        format!(
            "{i:0width$}_{}",
            name.trim_start_matches(crate::judge::trace::PREFIX)
        )
    };
    let numbered: Vec<(String, HostTensor)> = points
        .iter()
        .enumerate()
        .map(|(i, (n, t))| (file(i, n), t.clone()))
        .collect();
    write_all(dir, "reference", &numbered)?;
    let tapped: Vec<(String, HostTensor)> = port_outputs
        .iter()
        .filter(|(n, _)| crate::judge::trace::is_trace(n))
        .map(|(n, t)| {
            let name = match points.iter().position(|(p, _)| p == n) {
                Some(i) => file(i, n),
                None => format!(
                    "port_only_{}",
                    n.trim_start_matches(crate::judge::trace::PREFIX)
                ),
            };
            (name, t.clone())
        })
        .collect();
    write_all(dir, "port", &tapped)
}

/// Write a failing case's artifacts; returns the folder.
pub fn write(
    layer: &Layer,
    kind: Kind,
    dtype: DType,
    case: &CaseParams,
    failure: &CaseFailure,
) -> Result<PathBuf, String> {
    let dir = folder(layer, kind).ok_or("no target directory")?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    write_all(&dir, "inputs", &failure.inputs)?;
    write_all(&dir, "port", &failure.port_outputs)?;
    let mut leaves = Map::new();
    if let Some(reference) = &failure.reference {
        write_all(&dir, "state_dict", &reference.state_dict)?;
        write_all(&dir, "reference", &reference.expected)?;
        if let Some(rounding) = &reference.rounding {
            write_all(&dir, "rounding", rounding)?;
        }
        for (name, t) in &reference.expected {
            let has_rounding = reference
                .rounding
                .as_ref()
                .is_some_and(|r| r.iter().any(|(n, _)| n == name));
            // The rule the comparison applied, as the test reported it.
            let applied = failure
                .leaves
                .iter()
                .find(|l| &l.name == name)
                .and_then(|l| match &l.verdict {
                    Verdict::Values(v) => Some(v.rule),
                    _ => None,
                });
            let factor = match kind {
                Kind::Gradients => crate::judge::compare::GRADIENT_ROUNDING_FACTOR,
                _ => crate::judge::compare::ROUNDING_FACTOR,
            };
            let rule = match applied.unwrap_or_else(|| Rule::for_leaf(t.dtype, layer.tol, factor)) {
                Rule::Exact => json!("exact"),
                Rule::Default { atol, rtol, factor } => json!({
                    "atol": atol, "rtol": rtol, "factor": if has_rounding { factor } else { 0.0 },
                }),
                Rule::Explicit(tol) => json!({"atol": tol.atol, "rtol": tol.rtol, "factor": 0.0}),
            };
            leaves.insert(name.clone(), json!({"dtype": t.dtype.name(), "rule": rule}));
        }
    }
    let values = |v: &[(String, crate::describe::layer::Value)]| {
        Json::Object(v.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
    };
    let case_json = json!({
        "layer": layer.name,
        "reference": layer.reference,
        "form": layer.form.as_str(),
        "backend": layer.backend.as_str(),
        "dtype": dtype_name(dtype),
        "seed": case.seed,
        "case": case.to_string(),
        "args": layer.args.iter().map(|a| a.name.clone()).collect::<Vec<_>>(),
        "arg_dtypes": dtypes(&failure.inputs),
        "state_dict_dtypes": dtypes(failure.reference.as_ref().map_or(&[][..], |r| &r.state_dict)),
        "kwargs": values(&layer.consts),
        "init": values(&layer.init),
        "leaves": leaves,
        "import_roots": env::import_roots(layer.manifest_dir()),
        "python": env::python().program,
        "rerun": rerun_case_command(layer, kind.test(), dtype, case),
        "trace": layer.trace && kind == Kind::Forward,
    });
    if let (true, Some(reference)) = (layer.trace, &failure.reference) {
        write_trace(&dir.join("trace"), reference, &failure.port_outputs)?;
    }
    let text = serde_json::to_string_pretty(&case_json).expect("JSON");
    std::fs::write(dir.join("case.json"), text).map_err(|e| format!("case.json: {e}"))?;
    if kind == Kind::Forward {
        std::fs::write(dir.join("repro.py"), REPRO).map_err(|e| format!("repro.py: {e}"))?;
    }
    Ok(dir)
}
