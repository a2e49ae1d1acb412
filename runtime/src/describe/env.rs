//! Every environment variable golden reads, in one place.
//!
//! | variable | meaning |
//! |---|---|
//! | `GOLDEN_PYTHON` | the interpreter that runs references |
//! | `GOLDEN_REFERENCE_PATH` | extra import roots (`:`-separated) |
//! | `GOLDEN_MODE` | `auto` (default), `live`, `replay`, `record` |
//! | `GOLDEN_SEED` | seed of the generated cases (default 0) |
//! | `GOLDEN_CASES` | number of cases, overriding `cases = N` |
//! | `GOLDEN_CASE` | run exactly this one case (as a failure prints it) |
//! | `GOLDEN_TIMEOUT` | seconds a reference may take on one case (default 60) |
//! | `GOLDEN_WORKERS` | most Python workers per test process (default: cores, at most 4) |
//! | `GOLDEN_VENV` | the venv `cargo xtask setup` creates and golden looks for |
//! | `GOLDEN_MUTATIONS` | the mutation diagnosis of a failure: `auto` (default), `always`, `off` |
//! | `GOLDEN_VARIANTS` | `off` leaves the reference's declared `@variant`s unevaluated |

use std::path::{Path, PathBuf};
use std::time::Duration;

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
}

impl Mode {
    /// The mode's name as written in `GOLDEN_MODE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Live => "live",
            Mode::Replay => "replay",
            Mode::Record => "record",
        }
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `GOLDEN_MODE`, or an error naming the accepted values.
pub fn mode() -> Result<Mode, String> {
    match var("GOLDEN_MODE").as_deref().map(str::trim) {
        None | Some("auto") => Ok(Mode::Auto),
        Some("live") => Ok(Mode::Live),
        Some("replay") => Ok(Mode::Replay),
        Some("record") => Ok(Mode::Record),
        Some(other) => Err(format!(
            "GOLDEN_MODE={other:?} is not one of auto, live, replay, record"
        )),
    }
}

fn parse_var<T: std::str::FromStr>(name: &str) -> Result<Option<T>, String> {
    match var(name) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}={v:?} is not a valid number")),
    }
}

/// `GOLDEN_SEED`, when set.
pub fn seed() -> Result<Option<u64>, String> {
    parse_var("GOLDEN_SEED")
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
    match var("GOLDEN_MUTATIONS").as_deref().map(str::trim) {
        None | Some("auto") => Ok(Mutations::Auto),
        Some("always") => Ok(Mutations::Always),
        Some("off") => Ok(Mutations::Off),
        Some(other) => Err(format!(
            "GOLDEN_MUTATIONS={other:?} is not one of auto, always, off"
        )),
    }
}

/// Whether the reference's declared variants are evaluated on a failure (`GOLDEN_VARIANTS=off`
/// turns them off, e.g. to measure what the mutation diagnosis finds on its own).
pub fn variants() -> bool {
    !matches!(
        var("GOLDEN_VARIANTS").as_deref().map(str::trim),
        Some("off")
    )
}

/// `GOLDEN_CASES`, when set.
pub fn cases() -> Result<Option<u32>, String> {
    parse_var("GOLDEN_CASES")
}

/// Per-call timeout of the reference: `GOLDEN_TIMEOUT` seconds, default 60.
pub fn timeout() -> Result<Duration, String> {
    Ok(Duration::from_secs_f64(
        parse_var::<f64>("GOLDEN_TIMEOUT")?.unwrap_or(60.0),
    ))
}

/// Most concurrent workers in one test process.
pub fn max_workers() -> usize {
    parse_var::<usize>("GOLDEN_WORKERS")
        .ok()
        .flatten()
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(4)
        })
}

/// The venv golden's own set-up creates (`cargo xtask setup`): `GOLDEN_VENV`, else
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
