//! `cargo xtask bench-scale`: whole models on real-size checkpoints, golden beside the hand-written
//! dump-and-compare a porter would otherwise write, in one run.
//!
//! For each shape (SmolLM2-135M's config, and Qwen2.5-0.5B's when the disk has room for its 2 GB
//! checkpoint) it makes a checkpoint with transformers' `save_pretrained` (random init, nothing
//! downloaded) under `target/golden/bench-scale/`, then times, each in a fresh process (release
//! build):
//!
//! * the hand script: `reference_py/scale_ref/hand_dump.py` (`from_pretrained`, the cases' logits
//!   to `.npy`) and the hand Rust program `zoo/examples/bench_scale/hand_compare.rs` (the
//!   checkpoint through `VarBuilder::from_mmaped_safetensors`, candle-transformers' model, max
//!   |Δ|);
//! * golden: `zoo/examples/bench_scale/golden_check.rs`, the same model checked live on the same
//!   number of cases of the same shape, then (135M) recorded and replayed with no Python, and a
//!   wrong port (the input ids shifted by one) checked with `trace`: how long a trace failure
//!   takes and how large its artifacts are.
//!
//! It prints wall times, each process's peak resident memory against the checkpoint's size, the
//! ratios the issue set (live ≤ 1.5× the hand script, replay ≤ 2× the hand Rust program, peaks
//! ≤ 2× the checkpoint) and a projection to a 7B model from the growth measured between the two
//! shapes; then deletes the checkpoints.

use crate::{cargo, root, run, target_dir};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const CASES: &str = "4";
const TOKENS: &str = "32";

/// Parameters of each shape (tied embeddings counted once).
fn parameters(shape: &str) -> f64 {
    match shape {
        "smollm2-135m" => 134.5e6,
        _ => 494.0e6,
    }
}

/// `key=value` fields of a program's last line.
fn fields(out: &str) -> Vec<(String, String)> {
    out.lines()
        .rev()
        .find(|l| l.contains("wall_s="))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn field(fields: &[(String, String)], key: &str) -> Option<f64> {
    fields.iter().find(|(k, _)| k == key)?.1.parse().ok()
}

/// One program run: its wall time (measured here, the process's whole life) and its fields.
struct Ran {
    wall: f64,
    fields: Vec<(String, String)>,
    stderr: String,
}

fn timed(cmd: &mut Command) -> Result<Ran, String> {
    let started = Instant::now();
    let out = cmd
        .output()
        .map_err(|e| format!("could not run {cmd:?}: {e}"))?;
    let wall = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} ended with {}:\n{stdout}{stderr}",
            out.status
        ));
    }
    Ok(Ran {
        wall,
        fields: fields(&stdout),
        stderr,
    })
}

/// Free bytes on the file system of `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    let out = Command::new("df").arg("-Pk").arg(dir).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let kb: u64 = text
        .lines()
        .nth(1)?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn gb(bytes: f64) -> String {
    format!("{:.2} GB", bytes / 1e9)
}

/// What one shape measured.
struct Measured {
    shape: &'static str,
    checkpoint: f64,
    hand_python: Ran,
    hand_rust: Ran,
    live: Ran,
    replay: Option<Ran>,
    /// A trace failure (a wrong port, traced), live.
    failure: Option<Ran>,
}

fn measure(
    python: &Path,
    shape: &'static str,
    dir: &Path,
    release: &Path,
) -> Result<Measured, String> {
    let model = dir.join(shape);
    let dumps = dir.join(format!("{shape}-dumps"));
    let store = dir.join(format!("{shape}-store"));
    for d in [&model, &dumps, &store] {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    eprintln!("bench-scale: {shape}: making the checkpoint (save_pretrained, random init) ...");
    run(Command::new(python)
        .current_dir(root().join("reference_py"))
        .args(["-m", "scale_ref.make_checkpoint", shape])
        .arg(&model))?;
    let checkpoint = model.join("model.safetensors");
    let size = std::fs::metadata(&checkpoint)
        .map_err(|e| format!("{}: {e}", checkpoint.display()))?
        .len() as f64;
    eprintln!("bench-scale: {shape}: the hand script (transformers -> .npy) ...");
    let hand_python = timed(
        Command::new(python)
            .current_dir(root().join("reference_py"))
            .args(["-m", "scale_ref.hand_dump", shape])
            .arg(&model)
            .arg(&dumps)
            .args([CASES, TOKENS]),
    )?;
    eprintln!("bench-scale: {shape}: the hand Rust program (candle, max |Δ|) ...");
    let hand_rust = timed(
        Command::new(release.join("examples").join("scale_hand_compare"))
            .arg(shape)
            .arg(&checkpoint)
            .arg(&dumps),
    )?;
    let golden = |mode: &str| -> Result<Ran, String> {
        eprintln!("bench-scale: {shape}: golden, {mode} ...");
        let ran = timed(
            Command::new(release.join("examples").join("scale_golden_check"))
                .current_dir(root())
                .env("GOLDEN_PYTHON", python)
                .env("GOLDEN_STORE_LIMIT", "64")
                .env_remove("GOLDEN_MODE")
                .arg(shape)
                .arg(&checkpoint)
                .arg(mode)
                .arg(&store)
                .args([CASES, TOKENS]),
        )?;
        let failed = ran
            .fields
            .iter()
            .any(|(k, v)| k == "verdict" && v == "fail");
        if failed != (mode == "fail") {
            return Err(format!(
                "golden's {mode} check of {shape} did not come out as it should (a right port \
                 passes, the wrong one fails):\n{}",
                ran.stderr
            ));
        }
        Ok(ran)
    };
    let live = golden("live")?;
    let (replay, failure) = if shape == "smollm2-135m" {
        golden("record")?;
        let replay = golden("replay")?;
        (Some(replay), Some(golden("fail")?))
    } else {
        (None, None)
    };
    let _ = std::fs::remove_dir_all(&model);
    let _ = std::fs::remove_dir_all(&dumps);
    Ok(Measured {
        shape,
        checkpoint: size,
        hand_python,
        hand_rust,
        live,
        replay,
        failure,
    })
}

fn report(m: &Measured) {
    let f = |r: &Ran, k: &str| field(&r.fields, k).unwrap_or(f64::NAN);
    let hand = m.hand_python.wall + m.hand_rust.wall;
    println!(
        "\n{} ({:.1} M parameters, checkpoint {}, {CASES} cases of [1, {TOKENS}] tokens):",
        m.shape,
        parameters(m.shape) / 1e6,
        gb(m.checkpoint)
    );
    println!(
        "  hand script: Python {:.1} s + Rust {:.1} s = {:.1} s; peaks {} (Python), {} (Rust); \
         max |Δ| {}",
        m.hand_python.wall,
        m.hand_rust.wall,
        hand,
        gb(f(&m.hand_python, "peak_self")),
        gb(f(&m.hand_rust, "peak_self")),
        m.hand_rust
            .fields
            .iter()
            .find(|(k, _)| k == "max_abs")
            .map_or("?", |(_, v)| v.as_str())
    );
    let live = &m.live;
    println!(
        "  golden live: {:.1} s = {:.2}x the hand script (goal <= 1.5x); verdict {}, worst/allowed \
         {:.3}",
        live.wall,
        live.wall / hand,
        live.fields
            .iter()
            .find(|(k, _)| k == "verdict")
            .map_or("?", |(_, v)| v.as_str()),
        f(live, "worst_ratio")
    );
    println!(
        "    peaks: test process {} ({:.2}x the checkpoint), worker {} ({:.2}x) (goal <= 2x)",
        gb(f(live, "peak_self")),
        f(live, "peak_self") / m.checkpoint,
        gb(f(live, "peak_worker")),
        f(live, "peak_worker") / m.checkpoint
    );
    if let Some(replay) = &m.replay {
        println!(
            "  golden replay: {:.1} s = {:.2}x the hand Rust program (goal <= 2x); peak {} \
             ({:.2}x the checkpoint)",
            replay.wall,
            replay.wall / m.hand_rust.wall,
            gb(f(replay, "peak_self")),
            f(replay, "peak_self") / m.checkpoint
        );
    }
    if let Some(failure) = &m.failure {
        println!(
            "  a trace failure (input ids shifted by one, traced), live: {:.1} s (goal <= 60 s); \
             artifacts {:.2} MB (goal < 50 MB)",
            failure.wall,
            f(failure, "artifacts_bytes") / 1e6
        );
    }
}

/// The 7B projection from two measured shapes: each figure fitted as `a + b·parameters`.
fn project(a: &Measured, b: &Measured) {
    let (pa, pb) = (parameters(a.shape), parameters(b.shape));
    let seven = 6.74e9;
    let line = |fa: f64, fb: f64| {
        let slope = (fb - fa) / (pb - pa);
        fa + slope * (seven - pa)
    };
    let f = |r: &Ran, k: &str| field(&r.fields, k).unwrap_or(f64::NAN);
    let cases: f64 = CASES.parse().unwrap();
    println!(
        "\n7B on paper (Llama-2-7B's 6.74 B parameters, 27 GB in f32), each figure fitted as a + b·parameters \
         through the two shapes:"
    );
    println!(
        "  golden live, {CASES} cases: {:.0} s ({:.0} s per case); hand script {:.0} s",
        line(a.live.wall, b.live.wall),
        line(a.live.wall, b.live.wall) / cases,
        line(
            a.hand_python.wall + a.hand_rust.wall,
            b.hand_python.wall + b.hand_rust.wall
        )
    );
    println!(
        "  peaks: test process {}, worker {} (a 7B checkpoint is 27 GB: more than this 24 GB \
         machine holds for either)",
        gb(line(f(&a.live, "peak_self"), f(&b.live, "peak_self"))),
        gb(line(f(&a.live, "peak_worker"), f(&b.live, "peak_worker")))
    );
}

/// The benchmark (see the module's documentation).
pub fn main(python: &Path) -> Result<(), String> {
    run(cargo().args([
        "build",
        "--quiet",
        "--release",
        "-p",
        "golden-zoo",
        "--example",
        "scale_golden_check",
        "--example",
        "scale_hand_compare",
    ]))?;
    let release: PathBuf = target_dir().join("release");
    let dir = target_dir().join("golden").join("bench-scale");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let free = free_bytes(&dir).unwrap_or(0);
    let mut shapes = vec!["smollm2-135m"];
    if free >= 6_000_000_000 {
        shapes.push("qwen2.5-0.5b");
    } else {
        println!(
            "bench-scale: only {} free on the disk (under 6 GB): the 0.5B part is not run",
            gb(free as f64)
        );
    }
    let mut measured = Vec::new();
    for shape in shapes {
        let m = measure(python, shape, &dir, &release)?;
        report(&m);
        measured.push(m);
    }
    if let [a, b] = &measured[..] {
        project(a, b);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
