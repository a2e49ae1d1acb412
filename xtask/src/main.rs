//! The project's own tasks: `cargo xtask <task>`.
//!
//! * `setup` — `golden setup` for this workspace: create golden's Python venv outside the checkout
//!   (`GOLDEN_VENV`, default `~/.cache/golden/venv`) and install `reference_py` (editable) with
//!   numpy, torch and transformers into it; reused while its stamp matches (`golden-setup`).
//! * `zoo` — run the example zoo's parity checks and print their report. Without golden's venv they
//!   replay the committed golden stores (no Python packages needed); the report says how to go live.
//! * `test` — setup (and Debian's `chromium` for the HTML report's test, installed when run as
//!   root), run every test of the workspace and the Python side's unit tests.
//! * `bench-suite` — time the zoo under `cargo test` and `cargo nextest run`, live with private
//!   workers, live with the shared worker (cold and warm), and in replay; prints the figures.
//! * `bench-diff` — `golden diff` on two dump folders of 300 tensors (225 MiB each) against a
//!   NumPy script doing the same comparison, in one run; prints the figures.
//! * `bench-mutations` — the mutation diagnosis: what it names on every wrong port of the project
//!   (the hit rate), what it costs on a failure of a 2-layer transformer, and what it names on the
//!   held-out wrong ports of families no other test uses (`zoo/tests/held_out.rs`, then round
//!   two's `zoo/tests/held_out_2.rs`), per family; prints the figures.
//! * `bench-schedules` — what a check through time costs beside a single forward of the same
//!   model (`zoo/tests/schedules.rs`); prints the figures.
//! * `bench-sampling` — the sampler's distribution test: its false-alarm rate over 1,000 seeds of
//!   a right sampler beside the stated one, and its time (`zoo/tests/sampling.rs`).
//! * `bench-scale` — whole models on real-size checkpoints (SmolLM2-135M's and Qwen2.5-0.5B's
//!   shapes, made locally) against a hand-written dump-and-compare, in one run (`bench_scale.rs`).
//! * `workflow FILE JOB [--in DIR]` — run a GitHub Actions job's steps here, as the runner would
//!   (`workflow.rs`): golden's CI runs its users' recipe, `examples/port-llama/.github/workflows/
//!   golden.yml`, on the example crate this way.
//! * `book` — build the book (`docs/`, mdBook, installed once outside the checkout) into
//!   `target/book`, then check the links as `links` does (`book.rs`).
//! * `links` — check every relative link and anchor of README.md, ARCHITECTURE.md,
//!   benches/README.md and the book's chapters, and that SUMMARY.md lists every chapter.
//!
//! `test` builds the Rust side while pip installs the Python side: on a fresh machine the two take
//! about as long as each other.
//!
//! It does not depend on the `golden` crate, so that it starts before candle is compiled; the
//! set-up is the `golden-setup` crate's, which `golden setup` runs too.

use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

mod bench_scale;
mod book;
mod workflow;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("workspace root")
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("could not run {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({status})"))
    }
}

/// `golden setup` for golden's own workspace: the venv (`GOLDEN_VENV`, default
/// `~/.cache/golden/venv`) with golden's Python package (editable), numpy, torch and
/// transformers; nothing is installed while its stamp matches. Returns the venv's interpreter.
fn setup() -> Result<PathBuf, String> {
    let options = golden_setup::Options::for_golden(
        &root().join("reference_py"),
        golden_setup::default_venv()?,
    );
    let done = golden_setup::run(&options, &|line| eprintln!("golden: {line}"))?;
    if done.up_to_date {
        eprintln!("golden: Python side ready in {}", options.venv.display());
    } else {
        eprintln!("golden: Python side ready ({:.0} s)", done.seconds);
    }
    Ok(done.python)
}

/// Headless Chromium for the HTML report's test: found on the PATH, or installed from Debian's
/// `chromium` package when this runs as root with apt-get (about 30 s). Without root it says what
/// to install rather than failing half-way through the test run.
fn chromium_setup() -> Result<(), String> {
    let names = ["chromium", "chromium-browser", "google-chrome"];
    let found = || {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path).any(|dir| names.iter().any(|n| dir.join(n).is_file()))
    };
    if found() {
        return Ok(());
    }
    let root_user = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root_user || !Path::new("/usr/bin/apt-get").exists() {
        return Err(
            "the HTML report's test needs a headless Chromium and none is on the PATH: \
             install Debian's `chromium` package (sudo apt-get install chromium)"
                .into(),
        );
    }
    eprintln!("golden: installing Debian's chromium for the HTML report's test (~30 s) ...");
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args([
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "chromium",
        ])
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    if found() {
        Ok(())
    } else {
        Err("apt-get installed chromium but no chromium binary is on the PATH".into())
    }
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// Run the setup on a thread while cargo builds `build_args`.
fn setup_while_building(build_args: &[&str]) -> Result<PathBuf, String> {
    let setup = std::thread::spawn(setup);
    let browser = std::thread::spawn(chromium_setup);
    let built = run(cargo().args(build_args));
    browser
        .join()
        .map_err(|_| "the chromium setup thread panicked".to_string())??;
    let python = setup
        .join()
        .map_err(|_| "the setup thread panicked".to_string())??;
    built?;
    Ok(python)
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

fn fmt_num(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.1e}")
    }
}

/// Print the zoo's results, as written by the runtime under `target/golden/results/golden_zoo/`.
fn print_zoo_report() -> Result<(), String> {
    let dir = target_dir()
        .join("golden")
        .join("results")
        .join("golden_zoo");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("no results in {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let docs: Vec<Json> = files
        .iter()
        .filter_map(|p| serde_json::from_slice(&std::fs::read(p).ok()?).ok())
        .collect();
    let sources: Vec<&str> = docs.iter().filter_map(|d| d["source"].as_str()).collect();
    let live: Vec<&str> = sources
        .iter()
        .copied()
        .filter(|s| s.starts_with("live"))
        .collect();
    let replayed = sources.iter().filter(|s| s.starts_with("replay")).count();
    println!("\ngolden zoo: {} checks", docs.len());
    if let Some(how) = live.first() {
        println!("  {} against PyTorch, {how}", live.len());
    }
    if replayed > 0 {
        println!(
            "  {replayed} replayed from the committed golden stores (zoo/snapshots/*.golden): no Python needed.\n  \
             To run them against live PyTorch: `cargo xtask setup` once (~2 min, 5.4 GB), then \
             `cargo xtask zoo` again."
        );
    }
    println!();
    println!(
        "{:<52} {:<6} {:<6} {:>6} {:>15} {:>14}",
        "check", "dtype", "status", "cases", "max |port-ref|", "worst/allowed"
    );
    let mut failures = Vec::new();
    for doc in &docs {
        let check = doc["check"].as_str().unwrap_or("?");
        let status = doc["status"].as_str().unwrap_or("?");
        if status != "pass" {
            println!("{check:<52} {:<6} {status:<6}", "-");
            failures.push(doc);
            continue;
        }
        let figure = |name: &str| fmt_num(doc["figures"][name].as_f64().unwrap_or(f64::NAN));
        if doc["check"]
            .as_str()
            .is_some_and(|c| c.ends_with("__overfit"))
        {
            println!(
                "{check:<52} {:<6} {status:<6} {:>6}   loss {} -> {}; vs PyTorch: loss {}, updates {}{}",
                doc["dtypes"][0].as_str().unwrap_or("?"),
                1,
                figure("loss.initial"),
                figure("loss.final"),
                figure("parity.loss"),
                figure("parity.update"),
                match doc["health"].as_array().map_or(0, Vec::len) {
                    0 => String::new(),
                    n => format!(" ({n} gradient-health notes)"),
                }
            );
            continue;
        }
        let row = |what: String, dtype: &str, max_abs: f64, worst: f64| {
            println!(
                "{:<52} {dtype:<6} {status:<6} {:>6} {:>15} {:>14}",
                format!("{check} {what}"),
                doc["cases"].as_u64().unwrap_or(0),
                fmt_num(max_abs),
                format!("{worst:.3}"),
            );
        };
        // A traced check's points fold into one row per dtype: (dtype, points, max, worst).
        let mut traces: Vec<(&str, usize, f64, f64)> = Vec::new();
        for leaf in doc["leaves"].as_array().into_iter().flatten() {
            let name = leaf["leaf"].as_str().unwrap_or("");
            let dtype = leaf["dtype"].as_str().unwrap_or("?");
            let max_abs = leaf["max_abs"].as_f64().unwrap_or(f64::NAN);
            let worst = leaf["worst_ratio"].as_f64().unwrap_or(f64::NAN);
            if !name.starts_with("trace.") {
                row(name.to_string(), dtype, max_abs, worst);
            } else if let Some(t) = traces.iter_mut().find(|t| t.0 == dtype) {
                *t = (dtype, t.1 + 1, t.2.max(max_abs), t.3.max(worst));
            } else {
                traces.push((dtype, 1, max_abs, worst));
            }
        }
        for (dtype, points, max_abs, worst) in traces {
            row(format!("trace ({points} points)"), dtype, max_abs, worst);
        }
    }
    for doc in failures {
        println!("\n{}", doc["failure"].as_str().unwrap_or("(no message)"));
    }
    Ok(())
}

fn zoo() -> Result<(), String> {
    let results = target_dir()
        .join("golden")
        .join("results")
        .join("golden_zoo");
    let _ = std::fs::remove_dir_all(&results);
    // GOLDEN_MODE as the caller set it; by default auto: live where golden's venv (or
    // GOLDEN_PYTHON) has torch, else replay.
    let tests = run(cargo().args(["test", "--quiet", "-p", "golden-zoo", "--lib"]));
    print_zoo_report()?;
    tests
}

fn test() -> Result<(), String> {
    let python = setup_while_building(&["build", "--quiet", "--workspace", "--tests"])?;
    run(cargo()
        .args(["test", "--workspace"])
        .env("GOLDEN_PYTHON", &python))?;
    // No false alarms: the correct zoo ports pass on other seeds too (their snapshots describe
    // seed 0 and are not compared), so none of them ever gets a diagnosis.
    for seed in ["1", "2", "3"] {
        eprintln!("golden: the zoo on GOLDEN_SEED={seed}, live");
        run(cargo()
            .args(["test", "--quiet", "-p", "golden-zoo", "--lib"])
            .env("GOLDEN_PYTHON", &python)
            .env("GOLDEN_MODE", "live")
            .env("GOLDEN_SEED", seed))?;
    }
    eprintln!("golden: the Python side's unit tests");
    run(Command::new(&python)
        .args([
            "-B",
            "-m",
            "unittest",
            "discover",
            "--start-directory",
            "tests",
            "--top-level-directory",
            ".",
        ])
        .current_dir(root().join("reference_py")))
}

/// Stop the shared worker daemons of this checkout (a cold start for the next run).
fn stop_daemons() {
    let dir = target_dir().join("golden").join("workers");
    let _ = Command::new("pkill")
        .args([
            "-f",
            "--",
            &format!("golden_ref.daemon --socket {}", dir.display()),
        ])
        .status();
    std::thread::sleep(std::time::Duration::from_millis(500));
}

/// The zoo's wall time in seconds under `runner` with `env`.
fn time_zoo(runner: &str, env: &[(&str, &str)]) -> Result<f64, String> {
    let mut cmd = cargo();
    match runner {
        "test" => cmd.args(["test", "--quiet", "-p", "golden-zoo", "--lib"]),
        _ => cmd.args([
            "nextest",
            "run",
            "--no-fail-fast",
            "--status-level",
            "none",
            "--final-status-level",
            "none",
            "-p",
            "golden-zoo",
            "--lib",
        ]),
    };
    cmd.envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let started = Instant::now();
    run(&mut cmd)?;
    Ok(started.elapsed().as_secs_f64())
}

fn bench_suite() -> Result<(), String> {
    setup()?;
    run(cargo().args(["test", "--quiet", "--no-run", "-p", "golden-zoo", "--lib"]))?;
    run(cargo()
        .args(["nextest", "list", "-p", "golden-zoo", "--lib"])
        .stdout(std::process::Stdio::null()))?;
    let median = |runs: &mut Vec<f64>| {
        runs.sort_by(f64::total_cmp);
        runs[runs.len() / 2]
    };
    struct Config {
        runner: &'static str,
        what: &'static str,
        env: &'static [(&'static str, &'static str)],
        /// `Some(true)`: the daemon is stopped before each run; `Some(false)`: an untimed run
        /// before each timed one starts it; `None`: no daemon involved.
        cold: Option<bool>,
    }
    const LIVE_PRIVATE: &[(&str, &str)] =
        &[("GOLDEN_MODE", "live"), ("GOLDEN_SHARED_WORKER", "never")];
    const LIVE_SHARED: &[(&str, &str)] =
        &[("GOLDEN_MODE", "live"), ("GOLDEN_SHARED_WORKER", "always")];
    const REPLAY: &[(&str, &str)] = &[("GOLDEN_MODE", "replay")];
    let configs = [
        Config {
            runner: "test",
            what: "live, private workers",
            env: LIVE_PRIVATE,
            cold: None,
        },
        Config {
            runner: "test",
            what: "live, shared worker (warm)",
            env: LIVE_SHARED,
            cold: Some(false),
        },
        Config {
            runner: "test",
            what: "replay",
            env: REPLAY,
            cold: None,
        },
        Config {
            runner: "nextest",
            what: "live, private workers",
            env: LIVE_PRIVATE,
            cold: None,
        },
        Config {
            runner: "nextest",
            what: "live, shared worker (cold: the run starts it)",
            env: LIVE_SHARED,
            cold: Some(true),
        },
        Config {
            runner: "nextest",
            what: "live, shared worker (warm)",
            env: LIVE_SHARED,
            cold: Some(false),
        },
        Config {
            runner: "nextest",
            what: "replay",
            env: REPLAY,
            cold: None,
        },
    ];
    println!("the zoo (`cargo test -p golden-zoo --lib`), wall time, median of 3 runs:");
    for c in configs {
        let mut runs = Vec::new();
        for _ in 0..3 {
            match c.cold {
                Some(true) => stop_daemons(),
                Some(false) => {
                    time_zoo(c.runner, c.env)?;
                }
                None => {}
            }
            runs.push(time_zoo(c.runner, c.env)?);
        }
        let runner = if c.runner == "test" {
            "cargo test"
        } else {
            "cargo nextest run"
        };
        println!("  {runner:<18} {:<48} {:>6.1} s", c.what, median(&mut runs));
    }
    stop_daemons();
    Ok(())
}

/// Wall time of `cmd` in seconds; its exit status must be `expected` (the dumps differ: 1).
fn time_exit(cmd: &mut Command, expected: i32) -> Result<(f64, String), String> {
    let started = Instant::now();
    let out = cmd
        .output()
        .map_err(|e| format!("could not run {cmd:?}: {e}"))?;
    let seconds = started.elapsed().as_secs_f64();
    if out.status.code() != Some(expected) {
        return Err(format!(
            "{cmd:?} ended with {} (expected exit code {expected}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok((seconds, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// `golden diff` on two dump folders of 300 tensors (225 MiB each) against the NumPy script a
/// user would otherwise write (cli/benches/diff_numpy.py), alternating, in one run.
fn bench_diff() -> Result<(), String> {
    let python = setup()?;
    run(cargo().args(["build", "--quiet", "--release", "-p", "golden-cli"]))?;
    let golden = target_dir().join("release").join("golden");
    let script = root().join("cli").join("benches").join("diff_numpy.py");
    let data = target_dir().join("golden").join("bench-diff");
    let _ = std::fs::remove_dir_all(&data);
    eprintln!(
        "golden: writing two dump folders under {} ...",
        data.display()
    );
    run(Command::new(&python).arg(&script).arg("make").arg(&data))?;
    let (a, b) = (data.join("a"), data.join("b"));
    let bytes: u64 = std::fs::read_dir(&a)
        .map_err(|e| format!("{a:?}: {e}"))?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    // Both read from the page cache: one untimed run of each first.
    let golden_run = || {
        let mut cmd = Command::new(&golden);
        cmd.args(["diff", "--json"]).arg(&a).arg(&b);
        time_exit(&mut cmd, 1)
    };
    let numpy_run = || {
        let mut cmd = Command::new(&python);
        cmd.arg(&script).arg("compare").arg(&a).arg(&b);
        time_exit(&mut cmd, 1)
    };
    // Both must name the planted bug (diff_numpy.py: block 13's post_attn) as the first divergence.
    let found = serde_json::from_str::<Json>(&golden_run()?.1)
        .map_err(|e| format!("golden diff --json: {e}"))?["first_divergence"]
        .clone();
    let numpy_found = numpy_run()?.1;
    if found != "13_post_attn" || !numpy_found.contains("first divergent: 13_post_attn.npy") {
        return Err(format!(
            "the planted divergence was not found: golden diff {found}, NumPy: {numpy_found}"
        ));
    }
    let (mut g, mut n) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        g.push(golden_run()?.0);
        n.push(numpy_run()?.0);
    }
    g.sort_by(f64::total_cmp);
    n.sort_by(f64::total_cmp);
    let (g, n) = (g[2], n[2]);
    let mib = bytes as f64 / (1 << 20) as f64;
    println!(
        "two folders of 300 float32 .npy tensors, {mib:.0} MiB each; both name {found} first; \
         median of 5 runs:"
    );
    println!(
        "  golden diff --json   {:>7.2} s  ({:.2} GB/s read across both folders)",
        g,
        2.0 * bytes as f64 / g / 1e9
    );
    println!("  NumPy script         {n:>7.2} s");
    println!("  ratio                {:>7.1}x", n / g);
    let _ = std::fs::remove_dir_all(&data);
    Ok(())
}

/// The hit rate and the cost of the mutation diagnosis: `zoo/tests/mutations.rs`'s `hit_rate` and its
/// ignored `diagnosis_cost`, one at a time, live, their figures on stderr; then the held-out
/// measurements, `zoo/tests/held_out.rs`'s ignored `held_out_table` and `zoo/tests/held_out_2.rs`'s
/// `held_out_2_table` (two rounds of wrong ports of families no other test uses: what was named,
/// per family), their tables on stdout and golden's messages on stderr.
fn bench_mutations() -> Result<(), String> {
    setup()?;
    run(cargo()
        .env("GOLDEN_MODE", "live")
        .args(["test", "-p", "golden-zoo", "--test", "mutations", "--"])
        .args(["--include-ignored", "--nocapture", "--test-threads", "1"])
        .args(["--exact", "hit_rate", "diagnosis_cost"]))?;
    // A whole model and a decode schedule of a model golden's diagnosis was not written for.
    run(cargo()
        .env("GOLDEN_MODE", "live")
        .args(["test", "-p", "golden-zoo", "--test", "neox", "--"])
        .args(["--include-ignored", "--nocapture", "--test-threads", "1"])
        .args(["--exact", "diagnosis_cost"]))?;
    // Wrong ports of architectures no other test uses, written after the mechanisms: the first
    // round, then the second (other families, written later by another engineer).
    run(cargo()
        .env("GOLDEN_MODE", "live")
        .args(["test", "-p", "golden-zoo", "--test", "held_out", "--"])
        .args(["--include-ignored", "--nocapture", "--test-threads", "1"])
        .args(["--exact", "held_out_table"]))?;
    run(cargo()
        .env("GOLDEN_MODE", "live")
        .args(["test", "-p", "golden-zoo", "--test", "held_out_2", "--"])
        .args(["--include-ignored", "--nocapture", "--test-threads", "1"])
        .args(["--exact", "held_out_2_table"]))
}

fn bench_schedules() -> Result<(), String> {
    setup()?;
    run(cargo()
        .env("GOLDEN_MODE", "live")
        .args(["test", "-p", "golden-zoo", "--test", "schedules", "--"])
        .args(["--include-ignored", "--nocapture", "--test-threads", "1"])
        .args(["--exact", "schedule_cost"]))
}

/// The distribution test's false-alarm rate over 1,000 seeds of a right sampler, beside the stated
/// one, and its time: `zoo/tests/sampling.rs`'s ignored `false_alarm_rate` (a debug build, as the
/// tests run).
fn bench_sampling() -> Result<(), String> {
    setup()?;
    run(cargo()
        .args(["test", "-p", "golden-zoo", "--test", "sampling", "--"])
        .args(["--include-ignored", "--nocapture", "--test-threads", "1"])
        .args(["--exact", "false_alarm_rate"]))
}

fn main() -> ExitCode {
    let task = std::env::args().nth(1).unwrap_or_default();
    let result = match task.as_str() {
        "setup" => setup().map(|python| println!("{}", python.display())),
        "zoo" => zoo(),
        "test" => test(),
        "bench-suite" => bench_suite(),
        "bench-diff" => bench_diff(),
        "bench-mutations" => bench_mutations(),
        "bench-schedules" => bench_schedules(),
        "bench-sampling" => bench_sampling(),
        "bench-scale" => setup().and_then(|python| bench_scale::main(&python)),
        "book" => book::book(&root()),
        "links" => book::links(&root()),
        "workflow" => workflow::main(&std::env::args().skip(2).collect::<Vec<_>>()),
        _ => Err(
            "usage: cargo xtask setup | zoo | test | bench-suite | bench-diff | bench-mutations \
             | bench-schedules | bench-sampling | bench-scale | book | links | workflow <workflow.yml> <job> \
             [--in <dir>]"
                .into(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
