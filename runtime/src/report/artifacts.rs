//! What a failing check leaves behind, for debugging outside the test:
//! `target/golden/failures/<crate>/<check>/`.
//!
//! ```text
//! case.json            the check, the case, the tolerance per leaf, import roots, the re-run command
//! inputs/<arg>.npy     the case's inputs (bf16 as float32 copies)
//! state_dict/<k>.npy   module form: the reference module's parameters (with `weights = "..."`,
//!                      only those the checkpoint does not hold: case.json's `checkpoint` names
//!                      the file, its hash and each entry's name in it, never a copy)
//! reference/<leaf>.npy what the reference returned
//! port/<leaf>.npy      what the port returned
//! rounding/<leaf>.npy  the per-element rounding estimate of the tolerance
//! repro.py             loads all that, runs the reference again, prints the same comparison
//! ```
//!
//! With `trace`, `reference/` and `port/` hold the trace points the port tapped too
//! (`trace.<point>.npy`), and `trace/reference/` (every point) and `trace/port/` hold them again as
//! `NNN_<point>.npy`, numbered in the
//! reference's execution order, with that order in `order.txt` too, for
//! `golden diff trace/reference trace/port`.
//!
//! For the gradient check, `reference/` and `port/` hold the gradients (`grad.<name>.npy`: PyTorch's
//! float64 gradient in the case dtype, which the port's was judged against, and the port's),
//! `rounding/` their rounding estimates, and `cotangents/<leaf>.npy` the cotangent of each output
//! leaf; repro.py then computes PyTorch's gradient of `Σ sum(out · cotangent)` again and prints the
//! same comparison. A training failure leaves no repro.py.
//!
//! Names come from outside golden's code — a reference's output keys and state_dict, a golden
//! store — so every one goes through [`file_name`] before it names a file: `/`, `\`, `%` and
//! control characters are percent-escaped (`out.a/b` → `out.a%2Fb.npy`), and no file lands outside
//! the folder, whatever the name. `case.json`'s `file_names` maps each name that changed to its
//! file's stem (repro.py reads it).

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
    // The check's name is already one file name (`Layer::check_name`).
    Some(
        layer
            .golden_folder("failures")?
            .join(format!("{}{}", layer.check_name(), kind.suffix())),
    )
}

pub use crate::describe::file_names::{file_name, MAX_STEM};

fn write_all(dir: &Path, kind: &str, tensors: &[(String, HostTensor)]) -> Result<(), String> {
    if tensors.is_empty() {
        return Ok(());
    }
    let sub = dir.join(kind);
    std::fs::create_dir_all(&sub).map_err(|e| format!("{}: {e}", sub.display()))?;
    for (name, t) in tensors {
        let path = sub.join(format!("{}.npy", file_name(name)));
        npy::write(&path, t).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// `case.json`'s map from each name whose file is named otherwise (see [`file_name`]) to its file
/// name's stem.
fn file_names<'a>(names: impl Iterator<Item = &'a String>) -> Json {
    Json::Object(
        names
            .filter_map(|n| {
                let file = file_name(n);
                (file != *n).then(|| (n.clone(), json!(file)))
            })
            .collect::<Map<_, _>>(),
    )
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
    // The order, also as a manifest (`golden diff` reads it; a renamed file keeps its place).
    let manifest = |kind: &str, names: &[(String, HostTensor)]| -> Result<(), String> {
        if names.is_empty() {
            return Ok(());
        }
        let text: String = names
            .iter()
            .map(|(n, _)| format!("{}\n", file_name(n)))
            .collect();
        let path = dir.join(kind).join(ORDER_MANIFEST);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    manifest("reference", &numbered)?;
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
    write_all(dir, "port", &tapped)?;
    let mut in_order = tapped;
    in_order.sort_by_key(|(n, _)| !n.starts_with(|c: char| c.is_ascii_digit()));
    manifest("port", &in_order)
}

/// The manifest beside a trace dump: its files' names (without `.npy`), one a line, in execution
/// order (`golden diff` takes its order from it).
pub const ORDER_MANIFEST: &str = "order.txt";

/// Whether a failure of this kind of check leaves a repro.py: the forward check (the reference's
/// outputs) and, with the torch backend, the gradient check (PyTorch's gradient of
/// `Σ sum(out · cotangent)`; the numpy backend has no autograd to run again); a training run is
/// not one case.
pub fn has_repro(layer: &Layer, kind: Kind) -> bool {
    match kind {
        Kind::Forward => true,
        Kind::Gradients => layer.backend == crate::describe::layer::Backend::Torch,
        Kind::Overfit => false,
    }
}

/// `case.json`'s `checkpoint`: the checkpoint (path, size, hash, the files hashed) and, per
/// state_dict entry it serves, its name in the checkpoint, its dtype and the file that holds it
/// (repro.py loads them from the files).
fn checkpoint_json(
    layer: &Layer,
    resolved: &crate::answers::checkpoint::Resolved,
    failure: &CaseFailure,
) -> Json {
    let c = &resolved.checkpoint;
    let dtype_of = |name: &str| {
        failure
            .reference
            .as_ref()
            .and_then(|r| r.state_dict.iter().find(|(n, _)| n == name))
            .map(|(_, t)| t.dtype.name())
    };
    let entries: Map<String, Json> = resolved
        .entries
        .iter()
        .filter_map(|(name, served)| match served {
            crate::answers::checkpoint::Served::File(f) => Some((
                name.clone(),
                json!([
                    f,
                    dtype_of(name),
                    c.file_holding(f).map(|p| p.display().to_string())
                ]),
            )),
            crate::answers::checkpoint::Served::Value(_) => None,
        })
        .collect();
    json!({
        // This check's file: another file of the same bytes resolves to the same id.
        "path": layer.weights_path().unwrap_or_else(|| c.path.clone()).display().to_string(),
        "size": c.size,
        "hash": c.hash_hex(),
        // What the hash is of, in order (a sharded checkpoint's index, then its shards).
        "files": c.files().iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "entries": entries,
    })
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
    write_all(&dir, "cotangents", &failure.cotangents)?;
    write_all(&dir, "port", &failure.port_outputs)?;
    let mut leaves = Map::new();
    // A checkpoint's state is referred to (path, hash, the file's name of each entry), not copied:
    // a whole model's is gigabytes. Entries the file does not hold are written as usual.
    let checkpoint = failure
        .reference
        .as_ref()
        .and_then(|r| crate::answers::checkpoint::resolved(r.state_id?));
    let state_dict: Vec<(String, HostTensor)> = match (&failure.reference, &checkpoint) {
        (Some(reference), Some(resolved)) => reference
            .state_dict
            .iter()
            .filter(|(n, _)| {
                !resolved.entries.iter().any(|(m, s)| {
                    m == n && matches!(s, crate::answers::checkpoint::Served::File(_))
                })
            })
            .cloned()
            .collect(),
        (Some(reference), None) => reference.state_dict.clone(),
        (None, _) => Vec::new(),
    };
    if let Some(reference) = &failure.reference {
        write_all(&dir, "state_dict", &state_dict)?;
        // A trace point the port did not tap was compared with nothing: its tensor is in
        // trace/reference/ alone (for `golden diff` and the report), not again here with its
        // rounding estimate; a whole model's trace is hundreds of points.
        let compared = |(n, _): &&(String, HostTensor)| {
            !crate::judge::trace::is_trace(n) || failure.port_outputs.iter().any(|(p, _)| p == n)
        };
        let kept = |tensors: &[(String, HostTensor)]| -> Vec<(String, HostTensor)> {
            tensors.iter().filter(compared).cloned().collect()
        };
        write_all(&dir, "reference", &kept(&reference.expected))?;
        if let Some(rounding) = &reference.rounding {
            write_all(&dir, "rounding", &kept(rounding))?;
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
    // Values that depend on dims, as this case has them.
    let resolved = case.layer(layer);
    let values = crate::describe::layer::values_json;
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
        "state_dict_dtypes": dtypes(&state_dict),
        "checkpoint": checkpoint.as_ref().map(|r| checkpoint_json(layer, r, failure)),
        "kwargs": values(&resolved.consts),
        "init": values(&resolved.init),
        "config": resolved.config.as_ref().map(crate::describe::layer::Config::to_json),
        "leaves": leaves,
        "import_roots": env::import_roots(layer.manifest_dir()),
        "python": env::python().program,
        "rerun": rerun_case_command(layer, kind.test(), dtype, case),
        "trace": layer.trace && kind == Kind::Forward,
        "check": kind.name(),
        // The gradient check: L = Σ sum(out · cotangent) over these output leaves, in this order.
        "cotangents": failure.cotangents.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        "cotangent_dtypes": dtypes(&failure.cotangents),
        "file_names": file_names(
            failure
                .inputs
                .iter()
                .chain(&failure.cotangents)
                .chain(&failure.port_outputs)
                .chain(&state_dict)
                .chain(failure.reference.iter().flat_map(|r| &r.expected))
                .map(|(n, _)| n)
        ),
    });
    if let (true, Some(reference)) = (layer.trace, &failure.reference) {
        write_trace(&dir.join("trace"), reference, &failure.port_outputs)?;
    }
    let text = serde_json::to_string_pretty(&case_json).expect("JSON");
    std::fs::write(dir.join("case.json"), text).map_err(|e| format!("case.json: {e}"))?;
    if has_repro(layer, kind) {
        std::fs::write(dir.join("repro.py"), REPRO).map_err(|e| format!("repro.py: {e}"))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_points_with_hostile_names_stay_in_their_folders() {
        let dir = std::env::temp_dir().join(format!("golden-trace-names-{}", std::process::id()));
        let t = HostTensor::from_f64(vec![1], &[1.0]);
        let reference = crate::answers::live::ReferenceOutputs {
            expected: vec![
                ("out".into(), t.clone()),
                ("trace./abs/x".into(), t.clone()),
                ("trace.../up".into(), t.clone()),
            ],
            ..Default::default()
        };
        let port = vec![("trace.../up".to_string(), t.clone())];
        write_trace(&dir, &reference, &port).unwrap();
        let mut files: Vec<String> = ["reference", "port"]
            .iter()
            .flat_map(|k| std::fs::read_dir(dir.join(k)).unwrap())
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        assert_eq!(
            files,
            [
                "000_%2Fabs%2Fx.npy",
                "001_..%2Fup.npy",
                "001_..%2Fup.npy",
                "order.txt",
                "order.txt"
            ]
        );
        // The manifests name the files (their stems), in execution order.
        let order = std::fs::read_to_string(dir.join("reference").join(ORDER_MANIFEST)).unwrap();
        assert_eq!(order, "000_%2Fabs%2Fx\n001_..%2Fup\n");
        let order = std::fs::read_to_string(dir.join("port").join(ORDER_MANIFEST)).unwrap();
        assert_eq!(order, "001_..%2Fup\n");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
