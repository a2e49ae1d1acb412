//! Every environment variable golden reads, in one place: [`VARIABLES`] declares each one (its
//! group, what it does, and how its value is read), and the functions below parse those the
//! runtime reads. The command line (`golden setup`, `golden diff`) and the Python worker read a few
//! of their own; a test (`runtime/tests/environment.rs`) finds every `GOLDEN_*` name in the sources
//! of golden's crates and of the worker, and checks that each is declared here and documented in
//! the book's configuration table, and that the runtime reads none outside this file.
//!
//! **Every value is read before any case.** A check starts with [`check_all`], which reads every
//! declared variable that is set with its own reader ([`Variable::check`]): a value golden cannot
//! read (`GOLDEN_WORKERS=0`, `GOLDEN_MAX_FRAME=-1`, a value that is not UTF-8) fails the check with
//! the variable's name and the accepted form, whether or not this check would have come to read
//! it — never a default taken in silence where the variable is read later (the worker pool, the
//! Python side).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Who a variable is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// What a user sets day to day: the interpreter, the mode, the seed, the cases.
    Everyday,
    /// Limits and switches a user rarely needs: timeouts, memory, workers, shared memory.
    Tuning,
    /// Set by golden for its own processes, or by its own tests: not for users.
    Internal,
}

/// An environment variable golden reads.
#[derive(Clone, Copy, Debug)]
pub struct Variable {
    /// Its name (`GOLDEN_MODE`).
    pub name: &'static str,
    /// Who it is for.
    pub group: Group,
    /// What it does, in one line (the book's configuration table says more).
    pub doc: &'static str,
    /// Reads a value it is set to (not empty): `Err` names the variable and the accepted form.
    pub check: fn(&str) -> Result<(), String>,
}

const fn variable(
    name: &'static str,
    group: Group,
    doc: &'static str,
    check: fn(&str) -> Result<(), String>,
) -> Variable {
    Variable {
        name,
        group,
        doc,
        check,
    }
}

/// The reader of a variable whose every value is one golden can use (a path, a name, a command),
/// or that is read where it is used with what it is used for (`GOLDEN_CASE`, against the check's
/// dims; the command line's own variables, by the command line).
fn any_text(_: &str) -> Result<(), String> {
    Ok(())
}

/// Every environment variable golden reads, grouped.
pub const VARIABLES: &[Variable] = &[
    variable("GOLDEN_PYTHON", Group::Everyday, "the interpreter that runs references", any_text),
    variable("GOLDEN_VENV", Group::Everyday, "the venv `golden setup` creates and golden looks for", any_text),
    variable("GOLDEN_MODE", Group::Everyday, "`auto` (default), `live`, `replay`, `record`, `verify`", |v| parse_mode(v).map(drop)),
    variable("GOLDEN_SEED", Group::Everyday, "seed of the generated cases (default 0), decimal or `0x` hexadecimal", |v| parse_seed(v).map(drop)),
    variable("GOLDEN_CASES", Group::Everyday, "number of cases (at least 1), overriding `cases = N`", |v| parse_cases(v).map(drop)),
    variable("GOLDEN_CASE", Group::Everyday, "run exactly this one case (as a failure prints it)", any_text),
    variable("GOLDEN_BUDGET", Group::Everyday, "a time budget for each check (`60s`, `2m`): as many of its cases as fit, overriding `budget = ...`; `off`: every declared case", |v| parse_budget(v).map(drop)),
    variable("GOLDEN_REFERENCE_PATH", Group::Everyday, "extra import roots (`:`-separated)", any_text),
    variable("GOLDEN_RUN", Group::Everyday, "the run a test process's results belong to (default: its `cargo test` or nextest run)", any_text),
    variable("GOLDEN_BOOTSTRAP_PYTHON", Group::Tuning, "the Python `golden setup` creates a missing venv with (default `python3`)", any_text),
    variable("GOLDEN_TIMEOUT", Group::Tuning, "seconds a reference may take on one case, and the port on one call (default 60; `0` or `inf`: no limit)", |v| parse_seconds("GOLDEN_TIMEOUT", v).map(drop)),
    variable("GOLDEN_START_TIMEOUT", Group::Tuning, "seconds a worker may take to start or import a reference (default 180)", |v| parse_seconds("GOLDEN_START_TIMEOUT", v).map(drop)),
    variable("GOLDEN_MEMORY_LIMIT", Group::Tuning, "MiB golden may generate for one case's tensors (default 1024)", |v| parse_memory_limit(v).map(drop)),
    variable("GOLDEN_STORE_LIMIT", Group::Tuning, "size bound of one golden store, in MiB (default 4)", |v| parse_store_limit(v).map(drop)),
    variable("GOLDEN_FAILURE_BUDGET", Group::Tuning, "millions of output elements golden may evaluate after a check's first failure: shrinking, other failing cases, diagnoses (default 32)", |v| failure_budget_of(v).map(drop)),
    variable("GOLDEN_READ_BUDGET", Group::Tuning, "how much `golden diff`, `show` and `view` may expand one file to (`512MiB`, `4GiB`)", any_text),
    variable("GOLDEN_WORKERS", Group::Tuning, "most Python workers per test process (default: cores, at most 4)", |v| parse_workers(v).map(drop)),
    variable("GOLDEN_SHARED_WORKER", Group::Tuning, "`auto` (default: on under nextest), `always`, `never`", |v| parse_shared_worker(v).map(drop)),
    variable("GOLDEN_SHARED_IDLE", Group::Tuning, "seconds the shared worker daemon stays without connections (default 60)", |v| parse_shared_idle(v).map(drop)),
    variable("GOLDEN_SHARED_DIR", Group::Tuning, "where the shared worker's sockets live (default `target/golden/workers`)", any_text),
    variable("GOLDEN_SHM", Group::Tuning, "`auto` (default) or `off`: whether large tensors travel through shared memory", |v| parse_shared_memory(v).map(drop)),
    variable("GOLDEN_MUTATIONS", Group::Tuning, "the mutation diagnosis of a failure: `auto` (default), `always`, `off`", |v| parse_mutations(v).map(drop)),
    variable("GOLDEN_SPEED", Group::Tuning, "timed runs of the port and the reference per forward check (default 5; `off`: not timed)", |v| parse_speed(v).map(drop)),
    variable("GOLDEN_VARIANTS", Group::Tuning, "`off` leaves the reference's declared `@variant`s unevaluated (`on`: the default)", |v| parse_variants(v).map(drop)),
    variable("GOLDEN_PARENT_PID", Group::Internal, "set by golden on its workers: the test process whose end ends them", parse_parent_pid),
    variable("GOLDEN_MAX_FRAME", Group::Internal, "lowers the worker's frame limit (bytes), for golden's own tests", parse_max_frame),
];

/// Read every declared variable that is set (not empty) with its reader, before any case runs:
/// the first value golden cannot read is the error, naming the variable and the accepted form. A
/// value that is not UTF-8 is one golden cannot read.
pub fn check_all() -> Result<(), String> {
    for v in VARIABLES {
        match std::env::var(v.name) {
            Ok(value) if value.trim().is_empty() => {}
            Ok(value) => (v.check)(&value)?,
            Err(std::env::VarError::NotPresent) => {}
            Err(std::env::VarError::NotUnicode(value)) => {
                return Err(format!(
                    "{}={value:?} is not UTF-8 text, which golden cannot read: {}",
                    v.name, v.doc
                ))
            }
        }
    }
    Ok(())
}

/// `GOLDEN_PARENT_PID`: a process id (golden sets it on the workers it starts).
fn parse_parent_pid(v: &str) -> Result<(), String> {
    v.trim()
        .parse::<u32>()
        .ok()
        .filter(|pid| (1..=i32::MAX as u32).contains(pid))
        .map(drop)
        .ok_or_else(|| {
            format!(
                "GOLDEN_PARENT_PID={v:?} is not a process id: golden sets it on the Python workers \
                 it starts (the test process whose end ends them); unset it"
            )
        })
}

/// The largest frame of golden's protocol, either way: 2 GiB (`python::wire::MAX_FRAME`).
pub const FRAME_LIMIT: u64 = 1 << 31;

/// `GOLDEN_MAX_FRAME`: bytes, from 1 to the frame limit (2 GiB), which it can only lower. The worker
/// reads it (`golden_ref/wire.py`, with the same rule).
fn parse_max_frame(v: &str) -> Result<(), String> {
    let limit = FRAME_LIMIT;
    v.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (1..=limit).contains(n))
        .map(drop)
        .ok_or_else(|| {
            format!(
                "GOLDEN_MAX_FRAME={v:?} is not a frame limit: give a whole number of bytes from 1 \
                 to {limit} (it can only lower the worker's limit of 2 GiB; golden's own tests \
                 set it)"
            )
        })
}

/// Where reference outputs come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Live where the interpreter and the reference import, else replay; says which it used.
    Auto,
    /// Always run the reference; fail if it cannot run.
    Live,
    /// Never start Python: compare against the recorded outputs.
    Replay,
    /// Run the reference and (re)write the recorded outputs.
    Record,
    /// Run the reference and compare its answers with the recorded ones: any difference beyond
    /// the comparison's tolerance fails (a periodic CI job that keeps the stores honest).
    Verify,
}

impl Mode {
    /// The mode's name as written in `GOLDEN_MODE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Live => "live",
            Mode::Replay => "replay",
            Mode::Record => "record",
            Mode::Verify => "verify",
        }
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `GOLDEN_MODE`, or an error naming the accepted values.
pub fn mode() -> Result<Mode, String> {
    var("GOLDEN_MODE").map_or(Ok(Mode::Auto), |v| parse_mode(&v))
}

fn parse_mode(v: &str) -> Result<Mode, String> {
    match v.trim() {
        "auto" => Ok(Mode::Auto),
        "live" => Ok(Mode::Live),
        "replay" => Ok(Mode::Replay),
        "record" => Ok(Mode::Record),
        "verify" => Ok(Mode::Verify),
        other => Err(format!(
            "GOLDEN_MODE={other:?} is not one of auto, live, replay, record, verify"
        )),
    }
}

/// `GOLDEN_RUN`: the name of the run this process's results belong to, when set (a script or a CI
/// job that runs several cargo commands as one run). Read at every results file, not once.
pub fn run_name() -> Option<String> {
    var("GOLDEN_RUN").filter(|v| !v.trim().is_empty())
}

/// `GOLDEN_SEED`, when set: decimal (`42`) or hexadecimal (`0x2a`, the form failures print seeds
/// in).
pub fn seed() -> Result<Option<u64>, String> {
    var("GOLDEN_SEED").map(|v| parse_seed(&v)).transpose()
}

fn parse_seed(v: &str) -> Result<u64, String> {
    let t = v.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| {
        format!(
            "GOLDEN_SEED={v:?} is not a seed: use a whole number from 0 to 2^64 − 1, decimal (42) \
             or hexadecimal (0x2a)"
        )
    })
}

/// `GOLDEN_CASE`: one case to run instead of generating (`dims:style:seed[:dtype]`, as failures
/// print it).
pub fn case() -> Option<String> {
    var("GOLDEN_CASE")
}

/// When a failure's mutation diagnosis runs (`GOLDEN_MUTATIONS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutations {
    /// Where the reference runs live; in a replay only when golden's venv (or the chosen
    /// interpreter's) visibly has torch, so that a replay on a machine without it starts nothing.
    Auto,
    /// Also in a replay, whatever the interpreter: it is started for the diagnosis.
    Always,
    /// Never.
    Off,
}

/// `GOLDEN_MUTATIONS`, or an error naming the accepted values.
pub fn mutations() -> Result<Mutations, String> {
    var("GOLDEN_MUTATIONS").map_or(Ok(Mutations::Auto), |v| parse_mutations(&v))
}

fn parse_mutations(v: &str) -> Result<Mutations, String> {
    match v.trim() {
        "auto" => Ok(Mutations::Auto),
        "always" => Ok(Mutations::Always),
        "off" => Ok(Mutations::Off),
        other => Err(format!(
            "GOLDEN_MUTATIONS={other:?} is not one of auto, always, off"
        )),
    }
}

/// Whether the reference's declared variants are evaluated on a failure (`GOLDEN_VARIANTS=off`
/// turns them off, e.g. to measure what the mutation diagnosis finds on its own; `on`, the
/// default, leaves them on). A value it cannot read counts as on here: [`variants_setting`]
/// reports it before any case runs.
pub fn variants() -> bool {
    variants_setting().unwrap_or(true)
}

/// `GOLDEN_VARIANTS`: on (the default) or off, or an error naming the accepted values.
pub fn variants_setting() -> Result<bool, String> {
    var("GOLDEN_VARIANTS").map_or(Ok(true), |v| parse_variants(&v))
}

fn parse_variants(v: &str) -> Result<bool, String> {
    match v.trim() {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("GOLDEN_VARIANTS={other:?} is not one of on, off")),
    }
}

/// Whether checks use the shared worker (`GOLDEN_SHARED_WORKER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedWorker {
    /// On under nextest (which sets `NEXTEST`), else off.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// `GOLDEN_SHARED_WORKER` (`auto`, the default; `always` or its older spellings `1`/`on`; `never`,
/// `0`/`off`), or an error naming the accepted values.
pub fn shared_worker() -> Result<SharedWorker, String> {
    var("GOLDEN_SHARED_WORKER").map_or(Ok(SharedWorker::Auto), |v| parse_shared_worker(&v))
}

fn parse_shared_worker(v: &str) -> Result<SharedWorker, String> {
    match v.trim() {
        "auto" => Ok(SharedWorker::Auto),
        "always" | "1" | "on" => Ok(SharedWorker::Always),
        "never" | "0" | "off" => Ok(SharedWorker::Never),
        other => Err(format!(
            "GOLDEN_SHARED_WORKER={other:?} is not one of auto, always, never"
        )),
    }
}

/// `GOLDEN_SHARED_IDLE`: seconds the shared worker daemon stays without connections (default 60),
/// a positive number; or an error naming the accepted form.
pub fn shared_idle() -> Result<f64, String> {
    var("GOLDEN_SHARED_IDLE").map_or(Ok(60.0), |v| parse_shared_idle(&v))
}

fn parse_shared_idle(v: &str) -> Result<f64, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0)
        .ok_or_else(|| {
            format!(
                "GOLDEN_SHARED_IDLE={v:?} is not a number of seconds: give a positive number \
                 (default 60)"
            )
        })
}

/// `GOLDEN_CASES`, when set: at least 1 (a check of zero cases would pass without checking).
pub fn cases() -> Result<Option<u32>, String> {
    var("GOLDEN_CASES").map(|v| parse_cases(&v)).transpose()
}

fn parse_cases(v: &str) -> Result<u32, String> {
    match v.trim().parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "GOLDEN_CASES={v:?} is not a number of cases: use a whole number of at least 1 (up to \
             {}), or unset it for the check's own `cases = N`",
            u32::MAX
        )),
    }
}

/// `GOLDEN_SPEED`: how many timed runs each side of a forward check gets once its cases pass
/// (`run/speed.rs`), `default` when unset; 0 (`off`) times nothing.
pub fn speed_runs(default: usize) -> Result<usize, String> {
    Ok(var("GOLDEN_SPEED")
        .map(|v| parse_speed(&v))
        .transpose()?
        .unwrap_or(default))
}

fn parse_speed(v: &str) -> Result<usize, String> {
    match v.trim() {
        "off" | "0" => Ok(0),
        t => match t.parse::<usize>() {
            Ok(n) if (1..=1000).contains(&n) => Ok(n),
            _ => Err(format!(
                "GOLDEN_SPEED={v:?} is neither `off` nor a number of timed runs: use `off` (the \
                 forward checks time nothing), or a whole number from 1 to 1000 (each side's timed \
                 runs; the default is 5)"
            )),
        },
    }
}

/// `GOLDEN_BUDGET`, when set: `Some(None)` for `off` (every declared case), else the budget.
pub fn budget() -> Result<Option<Option<Duration>>, String> {
    var("GOLDEN_BUDGET").map(|v| parse_budget(&v)).transpose()
}

/// A time budget: seconds (`60s`) or minutes (`2m`, `1.5min`), positive; `off` or `none` for none.
pub fn parse_budget(v: &str) -> Result<Option<Duration>, String> {
    let text = v.trim();
    if text.eq_ignore_ascii_case("off") || text.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let (number, scale) = if let Some(n) = text.strip_suffix("min") {
        (n, 60.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        ("", 0.0)
    };
    match number.trim().parse::<f64>() {
        Ok(x) if (x * scale).is_finite() && x * scale > 0.0 => {
            Ok(Some(Duration::from_secs_f64(x * scale)))
        }
        _ => Err(format!(
            "GOLDEN_BUDGET={v:?} is not a time budget: write seconds or minutes (`60s`, `2m`), or \
             `off` for every declared case"
        )),
    }
}

/// Default of `GOLDEN_MEMORY_LIMIT`, in MiB.
pub const DEFAULT_MEMORY_LIMIT_MIB: u64 = 1024;

/// The memory budget for one case's tensors that golden generates (inputs, cotangents, the
/// Jacobians of `grad(mode = full)`), in bytes: `GOLDEN_MEMORY_LIMIT` MiB, default 1024. Sizes
/// beyond it are an error that says which argument or dim is too large, rather than an allocation
/// that aborts the test binary.
pub fn memory_limit() -> Result<u64, String> {
    var("GOLDEN_MEMORY_LIMIT").map_or(Ok(DEFAULT_MEMORY_LIMIT_MIB << 20), |v| {
        parse_memory_limit(&v)
    })
}

fn parse_memory_limit(v: &str) -> Result<u64, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|mib| *mib > 0.0 && mib.is_finite())
        .map(|mib| (mib * (1u64 << 20) as f64).min(u64::MAX as f64) as u64)
        .ok_or_else(|| {
            format!("GOLDEN_MEMORY_LIMIT={v:?} is not a positive number of MiB (default {DEFAULT_MEMORY_LIMIT_MIB})")
        })
}

/// A limit in seconds as `name` gives it: a positive number (`60`, `2.5`); `0` or `inf` for no limit
/// ([`Duration::MAX`]). Anything else (negative, NaN, not a number) is an error naming the variable
/// and the accepted form.
pub fn parse_seconds(name: &str, value: &str) -> Result<Duration, String> {
    let invalid = || {
        format!(
            "{name}={value:?} is not a time limit: give seconds as a positive number (like 60 or \
             2.5), or 0 or inf for no limit"
        )
    };
    let seconds: f64 = value.trim().parse().map_err(|_| invalid())?;
    if seconds == 0.0 || seconds == f64::INFINITY {
        return Ok(Duration::MAX);
    }
    if seconds.is_nan() || seconds < 0.0 {
        return Err(invalid());
    }
    // Beyond what a Duration holds (~584 billion years) is no limit too.
    Ok(Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
}

fn seconds_var(name: &str, default: f64) -> Result<Duration, String> {
    match var(name) {
        None => Ok(Duration::from_secs_f64(default)),
        Some(v) => parse_seconds(name, &v),
    }
}

/// Per-call timeout of the reference: `GOLDEN_TIMEOUT` seconds, default 60; `0` or `inf`: none.
pub fn timeout() -> Result<Duration, String> {
    seconds_var("GOLDEN_TIMEOUT", 60.0)
}

/// How long a worker may take to start, and to import a reference: `GOLDEN_START_TIMEOUT` seconds,
/// default 180 (a cold first `import torch` can take many seconds); `0` or `inf`: none.
pub fn start_timeout() -> Result<Duration, String> {
    seconds_var("GOLDEN_START_TIMEOUT", 180.0)
}

/// [`start_timeout`] where no error can be reported (the worker pool): an invalid value counts as
/// the default there, and is reported when a check opens its reference.
pub fn start_limit() -> Duration {
    start_timeout().unwrap_or(Duration::from_secs(180))
}

/// Most concurrent workers in one test process: `GOLDEN_WORKERS`, a positive whole number; by
/// default the number of cores, at most 4.
pub fn max_workers() -> Result<usize, String> {
    match var("GOLDEN_WORKERS") {
        None => Ok(std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(4)),
        Some(v) => parse_workers(&v),
    }
}

fn parse_workers(v: &str) -> Result<usize, String> {
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            format!("GOLDEN_WORKERS={v:?} is not a number of workers: give a positive whole number")
        })
}

/// The venv `golden setup` (and `cargo xtask setup`) creates: `GOLDEN_VENV`, else
/// `$XDG_CACHE_HOME/golden/venv`, else `~/.cache/golden/venv`. Outside any checkout, so that every
/// clone reuses the 5 GB of torch.
pub fn default_venv() -> Option<PathBuf> {
    if let Some(v) = var("GOLDEN_VENV") {
        return Some(PathBuf::from(v));
    }
    let cache = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")))?;
    Some(cache.join("golden").join("venv"))
}

/// The interpreter golden runs, and where that choice came from (for error messages).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Python {
    /// Program to run.
    pub program: PathBuf,
    /// Why this one: "GOLDEN_PYTHON", "VIRTUAL_ENV", "golden's venv", or "PATH".
    pub source: &'static str,
}

fn venv_python(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

/// Pick the interpreter: `GOLDEN_PYTHON`, else an activated venv (`VIRTUAL_ENV`), else golden's
/// own venv if it exists, else `python3` on the PATH.
pub fn python() -> Python {
    if let Some(p) = var("GOLDEN_PYTHON") {
        return Python {
            program: PathBuf::from(p),
            source: "GOLDEN_PYTHON",
        };
    }
    if let Some(venv) = var("VIRTUAL_ENV") {
        let program = venv_python(Path::new(&venv));
        if program.exists() {
            return Python {
                program,
                source: "VIRTUAL_ENV",
            };
        }
    }
    if let Some(program) = default_venv()
        .map(|v| venv_python(&v))
        .filter(|p| p.exists())
    {
        return Python {
            program,
            source: "golden's venv",
        };
    }
    Python {
        program: PathBuf::from("python3"),
        source: "PATH",
    }
}

/// golden's own Python package (`golden_ref`, the worker) and the zoo's references.
pub fn bundled_reference_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("reference_py")
}

/// Import roots for the worker: `GOLDEN_REFERENCE_PATH`, then `<crate>/reference_py` of the crate
/// under test, then golden's own `reference_py` (the worker itself lives there).
pub fn import_roots(manifest_dir: Option<&str>) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = var("GOLDEN_REFERENCE_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    if let Some(dir) = manifest_dir {
        let candidate = Path::new(dir).join("reference_py");
        if candidate.is_dir() {
            roots.push(candidate);
        }
    }
    roots.push(bundled_reference_root());
    let mut seen = Vec::new();
    roots.retain(|r| {
        let key = r.canonicalize().unwrap_or_else(|_| r.clone());
        let new = !seen.contains(&key);
        seen.push(key);
        new
    });
    roots
}

/// `GOLDEN_STORE_LIMIT`: the size bound of one golden store in MiB (default `default_mib`), a
/// positive number; or an error naming the accepted form.
pub fn store_limit_mib(default_mib: f64) -> Result<f64, String> {
    var("GOLDEN_STORE_LIMIT").map_or(Ok(default_mib), |v| parse_store_limit(&v))
}

fn parse_store_limit(v: &str) -> Result<f64, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|m| *m > 0.0)
        .ok_or_else(|| format!("GOLDEN_STORE_LIMIT={v:?} is not a positive number of MiB"))
}

/// `GOLDEN_FAILURE_BUDGET`: how many elements golden may evaluate after a check's first failure, in
/// millions (default `default_millions`), a positive number: the elements, and the value as set
/// (`None` for the default); or an error naming the accepted form.
pub fn failure_budget(default_millions: f64) -> Result<(u128, Option<String>), String> {
    let Some(v) = var("GOLDEN_FAILURE_BUDGET") else {
        return Ok(((default_millions * 1e6) as u128, None));
    };
    let millions = failure_budget_of(&v)?;
    Ok(((millions * 1e6) as u128, Some(v.trim().to_string())))
}

/// The millions of elements `GOLDEN_FAILURE_BUDGET`'s value says, or an error naming the form.
fn failure_budget_of(v: &str) -> Result<f64, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|m| m.is_finite() && *m > 0.0)
        .ok_or_else(|| {
            format!(
                "GOLDEN_FAILURE_BUDGET={v:?} is not a positive number of millions of elements \
                 (e.g. 32)"
            )
        })
}

/// `GOLDEN_SHARED_DIR`: where the shared worker's sockets live, when set.
pub fn shared_dir() -> Option<PathBuf> {
    var("GOLDEN_SHARED_DIR").map(PathBuf::from)
}

/// Whether large tensors may travel through shared memory (`GOLDEN_SHM`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedMemory {
    /// Where both sides can map it (the default).
    Auto,
    /// Never: every tensor travels inline.
    Off,
}

/// `GOLDEN_SHM`: `auto` (default) or `off`; anything else is an error naming the accepted values.
pub fn shared_memory() -> Result<SharedMemory, String> {
    var("GOLDEN_SHM").map_or(Ok(SharedMemory::Auto), |v| parse_shared_memory(&v))
}

fn parse_shared_memory(v: &str) -> Result<SharedMemory, String> {
    match v.trim() {
        "auto" => Ok(SharedMemory::Auto),
        "off" => Ok(SharedMemory::Off),
        other => Err(format!(
            "GOLDEN_SHM={other:?} is not one of auto, off (whether large tensors travel to and \
             from the Python worker through shared memory)"
        )),
    }
}

/// The cargo target directory of the running test binary (`CARGO_TARGET_DIR`, else found from the
/// executable's path `<target>/<profile>/deps/<test>`).
pub fn target_dir() -> Option<PathBuf> {
    if let Some(dir) = var("CARGO_TARGET_DIR") {
        return Some(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent()?;
    if dir.file_name()? == "deps" {
        dir = dir.parent()?;
    }
    // `<target>/<profile>` or `<target>/<triple>/<profile>`
    let profile_parent = dir.parent()?;
    if profile_parent.join("CACHEDIR.TAG").exists() || profile_parent.file_name()? == "target" {
        return Some(profile_parent.to_path_buf());
    }
    let triple_parent = profile_parent.parent()?;
    Some(triple_parent.to_path_buf())
}

#[cfg(test)]
mod tests {
    #[test]
    fn golden_looks_for_the_venv_golden_setup_creates() {
        assert_eq!(super::default_venv(), golden_setup::default_venv().ok());
    }

    #[test]
    fn a_budget_is_seconds_or_minutes_or_off() {
        use std::time::Duration;
        let read = super::parse_budget;
        assert_eq!(read("60s"), Ok(Some(Duration::from_secs(60))));
        assert_eq!(read(" 2m "), Ok(Some(Duration::from_secs(120))));
        assert_eq!(read("1.5min"), Ok(Some(Duration::from_secs(90))));
        assert_eq!(read("off"), Ok(None));
        assert_eq!(read("None"), Ok(None));
        for bad in ["60", "0s", "-5s", "inf s", "soon", "60 seconds"] {
            let e = read(bad).unwrap_err();
            assert!(
                e.starts_with(&format!("GOLDEN_BUDGET={bad:?} is not a time budget")),
                "{e}"
            );
        }
    }
}
