//! `golden report`: one static HTML page of the last test run, from the results the runtime writes
//! after every check (`target/golden/results/<crate>/<check>.json`) and the traces it leaves
//! (`target/golden/traces/…`, and `trace/` in a failure's artifacts).
//!
//! The page shows the last run's checks; results that other runs left in the folder (a check since
//! removed, one not run this time, an earlier mode) are listed apart as stale, with how much older
//! they are. A run is one `cargo test` or `cargo nextest run` (`GOLDEN_RUN` names one explicitly):
//! every results file says which wrote it (`golden::internal::report::results::run_id`), and the last run
//! is the one of the newest file.
//!
//! The page holds everything (its script, its style, the data as JSON, trace tensors as base64
//! float32): it opens from a file, offline. The script renders the table of checks, per check
//! the error histograms, the port's speed beside the reference (`run/speed.rs` in the runtime)
//! and, for traces, the drift against depth, a slice viewer of the two sides' tensors and where
//! the time goes, point by point. See `assets/report.js`.

use golden_files::npy;
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};

const STYLE: &str = include_str!("../assets/report.css");
const SCRIPT: &str = include_str!("../assets/report.js");

/// Elements of each trace tensor the page embeds (the viewer says when a tensor is cut).
pub const EMBEDDED_ELEMENTS: usize = 4096;

/// The workspace's target folder, seen from the current directory.
fn default_target() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let mut dir = std::env::current_dir().unwrap_or_default();
    loop {
        if dir.join("target").join("golden").is_dir() {
            return dir.join("target");
        }
        if !dir.pop() {
            return PathBuf::from("target");
        }
    }
}

fn base64(bytes: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(TABLE[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A tensor for the page: its shape and up to [`EMBEDDED_ELEMENTS`] values as float32.
fn embed(path: &Path) -> Json {
    match npy::read(path) {
        Ok(t) => {
            // Only the embedded elements are converted, however large the tensor.
            let mut values = vec![0.0; t.numel().min(EMBEDDED_ELEMENTS)];
            t.read_f64_into(0, &mut values);
            let bytes: Vec<u8> = values
                .iter()
                .flat_map(|v| (*v as f32).to_le_bytes())
                .collect();
            json!({
                "shape": t.shape,
                "dtype": t.dtype.name(),
                "numel": t.numel(),
                "data": base64(&bytes),
            })
        }
        Err(e) => json!({"error": e}),
    }
}

/// The trace points of a dump folder (`reference/NNN_<point>.npy`, `port/…`), in order, with the
/// check's figures for each.
fn trace_points(dir: &Path, leaves: &[Json]) -> Vec<Json> {
    let mut files: Vec<String> = std::fs::read_dir(dir.join("reference"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".npy"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|file| {
            let stem = file.trim_end_matches(".npy");
            let point = stem.split_once('_').map_or(stem, |(_, p)| p);
            let leaf = leaves
                .iter()
                .find(|l| l["leaf"].as_str() == Some(&format!("trace.{point}")));
            let port = dir.join("port").join(file);
            json!({
                "point": point,
                "reference": embed(&dir.join("reference").join(file)),
                "port": if port.exists() { embed(&port) } else { Json::Null },
                "worst_ratio": leaf.map(|l| l["worst_ratio"].clone()),
                "max_abs": leaf.map(|l| l["max_abs"].clone()),
            })
        })
        .collect()
}

/// Read every results file under `results` (one folder per crate; a symlink loop is not
/// followed).
fn load(results: &Path) -> Result<Vec<Json>, String> {
    let mut docs = Vec::new();
    let walk = crate::walk::files_under(results, |p| p.extension().is_some_and(|x| x == "json"))?;
    for path in walk.files {
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut doc: Json = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a results file: {e}", path.display()))?;
        let krate = path
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned());
        doc["crate"] = json!(krate);
        docs.push(doc);
    }
    docs.sort_by(|a, b| {
        let key = |d: &Json| {
            (
                d["crate"].as_str().unwrap_or_default().to_string(),
                d["check"].as_str().unwrap_or_default().to_string(),
            )
        };
        key(a).cmp(&key(b))
    });
    Ok(docs)
}

/// The last run: the run of the newest results file (its id and that file's time). Every check
/// of another run — or of none, written before golden recorded runs — is marked `stale`, with
/// `age_ms`, how much older it is than that newest file.
fn mark_stale(checks: &mut [Json]) -> Json {
    let newest = checks
        .iter()
        .filter(|c| c["run"].is_string())
        .max_by_key(|c| c["written_ms"].as_u64().unwrap_or(0));
    let (run, newest_ms) = match newest {
        Some(c) => (c["run"].clone(), c["written_ms"].as_u64().unwrap_or(0)),
        None => (Json::Null, 0),
    };
    for check in checks.iter_mut() {
        let stale = run.is_null() || check["run"] != run;
        check["stale"] = json!(stale);
        if stale {
            check["age_ms"] = match check["written_ms"].as_u64() {
                Some(ms) if !run.is_null() => json!(newest_ms.saturating_sub(ms)),
                _ => Json::Null,
            };
        }
    }
    if run.is_null() {
        // No file says its run (results of an older golden): none is stale against another.
        for check in checks.iter_mut() {
            check["stale"] = json!(false);
        }
    }
    json!({"id": run, "written_ms": newest_ms})
}

/// The error for a results folder with nothing in it.
pub fn no_results(results: &Path) -> String {
    format!(
        "no results in {}: run the tests first (`cargo test`), then `golden report`",
        results.display()
    )
}

/// The last run's results files of a results folder (each with its `crate`), and how many results
/// of other runs were left out (see [`build`]'s page: they are stale).
pub fn last_run(results: &Path) -> Result<(Vec<Json>, usize), String> {
    let mut checks = load(results)?;
    if checks.is_empty() {
        return Err(no_results(results));
    }
    mark_stale(&mut checks);
    let (current, stale): (Vec<Json>, Vec<Json>) =
        checks.into_iter().partition(|c| c["stale"] != true);
    Ok((current, stale.len()))
}

/// Build the page's data and HTML from a results folder.
pub fn build(results: &Path) -> Result<String, String> {
    let mut checks = load(results)?;
    if checks.is_empty() {
        return Err(no_results(results));
    }
    let last_run = mark_stale(&mut checks);
    for check in &mut checks {
        if let Some(dir) = check["trace_dump"].as_str().map(PathBuf::from) {
            let leaves = check["leaves"].as_array().cloned().unwrap_or_default();
            check["trace_points"] = Json::Array(trace_points(&dir, &leaves));
        }
    }
    let current = checks.iter().filter(|c| c["stale"] != true);
    let failing = current.clone().filter(|c| c["status"] != "pass").count();
    let shown = current.count();
    let data = json!({
        "results": results,
        "checks": checks,
        "last_run": last_run,
        "embedded_elements": EMBEDDED_ELEMENTS,
    });
    // `</` inside a script element would end it: JSON allows escaping the slash.
    let data = serde_json::to_string(&data)
        .expect("JSON")
        .replace("</", "<\\/");
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>golden report (rendering: {shown} checks, {failing} failing)</title>\n<style>\n{STYLE}</style>\n\
         </head>\n<body>\n<main id=\"report\"><p>Rendering the report needs JavaScript.</p></main>\n\
         <script id=\"golden-data\" type=\"application/json\">{data}</script>\n\
         <script>\n{SCRIPT}</script>\n</body>\n</html>\n"
    ))
}

/// The results folder `golden report` reads by default: `target/golden/results` of the current
/// workspace.
pub fn default_results() -> PathBuf {
    default_target().join("golden").join("results")
}

/// Run `golden report`: write the page, return its path.
pub fn run(results: Option<PathBuf>, out: Option<PathBuf>) -> Result<PathBuf, String> {
    let target = default_target();
    let results = results.unwrap_or_else(|| target.join("golden").join("results"));
    let out = out.unwrap_or_else(|| target.join("golden").join("report.html"));
    let html = build(&results)?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(&out, html).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
