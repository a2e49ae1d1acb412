//! The Python environment golden's checks run their references in: `golden setup` in a user's
//! crate, `cargo xtask setup` in golden's own workspace; both are this code.
//!
//! A set-up creates the venv if it is missing (`python3 -m venv`), then installs into it, in one pip
//! call so that pip resolves everything together:
//!
//! * golden's Python package (`golden_ref`: the worker, `golden_ref.variants`,
//!   `golden_ref.catalogue`, ...) from the golden the crate depends on, installed **as a version**
//!   (a copy, not an editable link to a checkout's folder): plain Python (`from golden_ref.variants
//!   import variant` in an IDE or a script) imports it. The checks themselves never use that copy:
//!   their worker imports golden's package from the golden they are built with (`PYTHONPATH`,
//!   before site-packages). A venv is often shared by several checkouts (`~/.cache/golden/venv`):
//!   an editable install would point it at the last checkout that ran a set-up, silently, for
//!   every other one; a copy is tied to the package's version and content, so checkouts of the
//!   same golden share it without reinstalling, and a set-up from another golden replaces the copy
//!   and says so;
//! * numpy and torch, pinned by golden's package (its `torch` extra: the committed snapshots and
//!   golden stores are reproduced exactly with them);
//! * the crate's own Python requirements: `<crate>/reference_py/requirements.txt` (`pip install
//!   -r`), or, when there is none, the project `<crate>/reference_py/pyproject.toml` describes
//!   (installed editable, with its dependencies).
//!
//! Then it writes a stamp into the venv that says exactly what was installed: golden's package by
//! version and a SHA-256 of its files (not by folder), the crate's requirement file by path and
//! SHA-256. When the stamp matches, a set-up only checks that the interpreter starts and still
//! finds the modules the checks import (located, not imported; a venv that lost one since is set
//! up again): an up-to-date venv is detected in a fraction of a second.
//!
//! It depends on neither golden's runtime nor candle, so that `cargo xtask setup` starts pip before
//! candle has compiled. One-shot commands run through [`duct`].

use serde_json::Value as Json;
use sha2::Digest as _;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The oldest Python golden's Python side runs on (its `pyproject.toml`'s `requires-python`).
pub const MIN_PYTHON: (u32, u32) = (3, 9);

/// The file in the venv that records what the last set-up installed.
pub const STAMP: &str = "golden-setup.stamp";

fn var(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

/// golden's venv: `GOLDEN_VENV`, else `$XDG_CACHE_HOME/golden/venv`, else `~/.cache/golden/venv`.
/// Outside any checkout, so that every clone and every crate reuses the 5 GB of torch. The
/// runtime's `describe::env::default_venv` looks in the same place (its tests check that the two
/// agree).
pub fn default_venv() -> Result<PathBuf, String> {
    if let Some(v) = var("GOLDEN_VENV") {
        return Ok(PathBuf::from(v));
    }
    let cache = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")))
        .ok_or("neither HOME nor XDG_CACHE_HOME is set: choose the venv with --venv DIR (or GOLDEN_VENV)")?;
    Ok(cache.join("golden").join("venv"))
}

/// The interpreter of a venv.
pub fn python_in(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

/// A crate's own Python requirements, beside its references in `<crate>/reference_py/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirements {
    /// `reference_py/requirements.txt`, installed with `pip install -r`.
    File(PathBuf),
    /// `reference_py/pyproject.toml`: the crate's references as a Python project, installed
    /// editable with its dependencies.
    Project(PathBuf),
}

impl Requirements {
    /// The file that lists them (its content goes into the stamp).
    pub fn file(&self) -> PathBuf {
        match self {
            Requirements::File(f) => f.clone(),
            Requirements::Project(dir) => dir.join("pyproject.toml"),
        }
    }
}

/// What `<crate>/reference_py/` asks for: its `requirements.txt`, else its `pyproject.toml`, else
/// nothing.
pub fn crate_requirements(crate_dir: &Path) -> Option<Requirements> {
    let dir = crate_dir.join("reference_py");
    let file = dir.join("requirements.txt");
    if file.is_file() {
        return Some(Requirements::File(file));
    }
    dir.join("pyproject.toml")
        .is_file()
        .then_some(Requirements::Project(dir))
}

/// The crate a command run in `start` is about: the nearest folder at or above it with a
/// `Cargo.toml`.
pub fn find_crate(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .find(|d| d.join("Cargo.toml").is_file())
        .map(Path::to_path_buf)
}

/// Whether `dir` is golden's own Python package (`reference_py/` of a golden checkout).
pub fn is_golden_package(dir: &Path) -> bool {
    dir.join("golden_ref").join("worker.py").is_file() && dir.join("pyproject.toml").is_file()
}

/// golden's Python package as the crate at `crate_dir` depends on it: `cargo metadata` finds the
/// `golden` package (a path or git dependency), whose checkout holds `reference_py/`.
pub fn golden_package_of(crate_dir: &Path) -> Result<PathBuf, String> {
    let cargo = var("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = crate_dir.join("Cargo.toml");
    let out = duct::cmd(
        cargo,
        [
            OsString::from("metadata"),
            "--format-version".into(),
            "1".into(),
            "--manifest-path".into(),
            manifest.clone().into(),
        ],
    )
    .stdout_capture()
    .stderr_capture()
    .unchecked()
    .run()
    .map_err(|e| format!("could not run `cargo metadata`: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`cargo metadata --manifest-path {}` failed: {}",
            manifest.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let meta: Json = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("`cargo metadata` printed no JSON: {e}"))?;
    let golden = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "golden")
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or_else(|| {
            format!(
                "the crate at {} does not depend on golden (no package `golden` in its \
                 dependency graph): add it to [dev-dependencies] first",
                crate_dir.display()
            )
        })?;
    // `<golden>/runtime/Cargo.toml` -> `<golden>/reference_py`
    let package = Path::new(golden)
        .parent()
        .and_then(Path::parent)
        .map(|root| root.join("reference_py"))
        .ok_or_else(|| format!("unexpected manifest path {golden}"))?;
    if !is_golden_package(&package) {
        return Err(format!(
            "the golden your crate depends on ({golden}) has no Python package at {}",
            package.display()
        ));
    }
    Ok(package)
}

/// What a set-up installs, and where.
#[derive(Clone, Debug)]
pub struct Options {
    /// The venv to create or update.
    pub venv: PathBuf,
    /// The interpreter that creates the venv when it does not exist (`python3`).
    pub bootstrap: OsString,
    /// golden's Python package: a `reference_py/` folder of a golden checkout.
    pub golden: PathBuf,
    /// Extras of golden's package to install: `torch` (numpy and torch, pinned); golden's own
    /// workspace adds `hf` (transformers, for its tests against Hugging Face modules).
    pub extras: Vec<String>,
    /// The crate's own requirements.
    pub requirements: Option<Requirements>,
}

impl Options {
    /// For the crate at `crate_dir`, whose golden has its Python package at `golden`: golden
    /// with numpy and torch, and the crate's requirements. In golden's own checkout (the crate's
    /// `reference_py` is golden's package) this is [`Options::for_golden`].
    pub fn for_crate(crate_dir: &Path, venv: PathBuf, golden: PathBuf) -> Options {
        let own = crate_dir.join("reference_py");
        if is_golden_package(&own) {
            return Options::for_golden(&own, venv);
        }
        Options {
            venv,
            bootstrap: var("GOLDEN_BOOTSTRAP_PYTHON").unwrap_or_else(|| "python3".into()),
            golden,
            extras: vec!["torch".into()],
            requirements: crate_requirements(crate_dir),
        }
    }

    /// For golden's own workspace (`cargo xtask setup`): its package with torch and transformers.
    pub fn for_golden(package: &Path, venv: PathBuf) -> Options {
        Options {
            venv,
            bootstrap: var("GOLDEN_BOOTSTRAP_PYTHON").unwrap_or_else(|| "python3".into()),
            golden: package.to_path_buf(),
            extras: vec!["torch".into(), "hf".into()],
            requirements: None,
        }
    }

    /// The venv's interpreter.
    pub fn python(&self) -> PathBuf {
        python_in(&self.venv)
    }

    /// golden's package as pip names it: `<dir>[torch,hf]`.
    fn golden_requirement(&self) -> OsString {
        let mut r = OsString::from(self.golden.as_os_str());
        if !self.extras.is_empty() {
            r.push(format!("[{}]", self.extras.join(",")));
        }
        r
    }

    /// The arguments of the one pip call (after `python -m pip`). golden's package is installed
    /// as a copy of its version (pip reinstalls a local folder even when the version is the same,
    /// so a changed package is installed again when the stamp says so).
    pub fn pip_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = ["install", "--disable-pip-version-check"]
            .map(OsString::from)
            .to_vec();
        args.push(self.golden_requirement());
        match &self.requirements {
            Some(Requirements::File(f)) => {
                args.push("-r".into());
                args.push(f.into());
            }
            Some(Requirements::Project(dir)) => {
                args.push("-e".into());
                args.push(dir.into());
            }
            None => {}
        }
        args
    }

    /// The command line a user would type for the install, for messages.
    pub fn pip_command(&self) -> String {
        std::iter::once(self.python().into_os_string())
            .chain(["-m".into(), "pip".into()])
            .chain(self.pip_args())
            .map(|a| shell_word(&a.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// What the stamp of a set-up with these options says: golden's package by version and the
    /// SHA-256 of its files (the same in every checkout of the same golden: no folder in it), and
    /// the crate's requirement file with its SHA-256.
    pub fn stamp(&self) -> Result<String, String> {
        let mut s = String::from("golden setup, stamp format 2\n");
        let (version, files) = golden_package_identity(&self.golden)?;
        s.push_str(&format!(
            "golden package: golden-ref {version} [{}]\n  files sha256 {files}\n",
            self.extras.join(","),
        ));
        match &self.requirements {
            None => s.push_str("crate requirements: none\n"),
            Some(r) => {
                let file = r.file();
                s.push_str(&format!(
                    "crate requirements: {}\n  sha256 {}\n",
                    file.display(),
                    sha256_file(&file)?
                ));
            }
        }
        Ok(s)
    }
}

/// golden's Python package as a version: its `pyproject.toml`'s version, and one SHA-256 over that
/// file and every file of the packages it installs (its `packages = [...]`; `__pycache__` left out),
/// by path relative to the package's folder, in sorted order.
pub fn golden_package_identity(package: &Path) -> Result<(String, String), String> {
    let project_file = package.join("pyproject.toml");
    let project = std::fs::read_to_string(&project_file)
        .map_err(|e| format!("{}: {e}", project_file.display()))?;
    let value = |key: &str| -> Option<String> {
        project.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let version = value("version")
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "(no version)".into());
    let packages: Vec<String> = value("packages")
        .map(|v| {
            v.trim_matches(|c| c == '[' || c == ']')
                .split(',')
                .map(|p| p.trim().trim_matches('"').trim_matches('\'').to_string())
                .filter(|p| !p.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let mut files: Vec<PathBuf> = vec![PathBuf::from("pyproject.toml")];
    let mut stack: Vec<PathBuf> = packages.iter().map(PathBuf::from).collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(package.join(&dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name == "__pycache__" {
                continue;
            }
            let rel = dir.join(&name);
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(rel),
                Ok(t) if t.is_file() => files.push(rel),
                _ => {}
            }
        }
    }
    files.sort();
    let mut hasher = sha2::Sha256::new();
    for rel in &files {
        let bytes = std::fs::read(package.join(rel))
            .map_err(|e| format!("{}: {e}", package.join(rel).display()))?;
        hasher.update(rel.to_string_lossy().as_bytes());
        hasher.update([0]);
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    let digest = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((version, digest))
}

/// The line a set-up logs when the venv's stamp names another golden package than the one it
/// installs; `None` when it is the same package.
fn replaced_package(old: &str, wanted: &str) -> Option<String> {
    let package = |stamp: &str| -> Option<String> {
        let mut lines = stamp
            .lines()
            .skip_while(|l| !l.starts_with("golden package"));
        Some(format!(
            "{}\n{}",
            lines.next()?,
            lines.next().unwrap_or_default()
        ))
    };
    let (before, now) = (package(old)?, package(wanted)?);
    if before == now {
        return None;
    }
    Some(match before.strip_prefix("golden package (editable): ") {
        Some(rest) => {
            format!(
            "the venv had golden's Python package editable from {} (another checkout's folder, \
             which it followed); it gets a copy of this golden's version instead, tied to no \
             checkout",
            rest.lines().next().unwrap_or_default().split(" [").next().unwrap_or_default()
        )
        }
        None => format!(
            "the venv had another golden-ref than this golden's ({}; now {}): replacing it. \
             Plain Python in this venv then imports this golden's package; the checks of every \
             checkout import their own golden's, whatever the venv holds",
            before
                .lines()
                .next()
                .unwrap_or_default()
                .trim_start_matches("golden package: "),
            now.lines()
                .next()
                .unwrap_or_default()
                .trim_start_matches("golden package: ")
        ),
    })
}

/// `word` quoted for a POSIX shell where it needs to be.
pub fn shell_word(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

fn sha256_file(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// What a set-up did.
#[derive(Clone, Debug)]
pub struct Done {
    /// The venv's interpreter: what golden's checks run (set GOLDEN_PYTHON to it, or let golden
    /// find golden's venv).
    pub python: PathBuf,
    /// The stamp matched: nothing was installed.
    pub up_to_date: bool,
    /// The versions of Python and of the packages that matter, as the interpreter reports them.
    pub versions: Vec<(String, String)>,
    /// Wall time, in seconds.
    pub seconds: f64,
}

/// Python and package versions as `python` reports them, without importing the packages
/// (`importlib.metadata`: a few tens of milliseconds, where `import torch` takes seconds).
pub fn probe(python: &Path) -> Result<Vec<(String, String)>, String> {
    const SCRIPT: &str = "import sys\n\
        try:\n    import importlib.metadata as m\n\
        except ImportError:\n    m = None\n\
        print('python', '%d.%d.%d' % sys.version_info[:3])\n\
        for name in ('numpy', 'torch', 'transformers', 'golden-ref'):\n\
        \x20   try:\n        print(name, m.version(name))\n\
        \x20   except Exception:\n        pass\n";
    let out = duct::cmd(python, ["-c", SCRIPT])
        .stdout_capture()
        .stderr_capture()
        .unchecked()
        .run()
        .map_err(|e| format!("could not run `{}`: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` does not run: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect())
}

/// The modules golden's checks import (numpy, golden's own package, torch and transformers when
/// the set-up installs them) that `python` cannot find — located, not imported (`find_spec`: a
/// few tens of milliseconds). An error when the interpreter does not start.
fn missing_modules(python: &Path, options: &Options) -> Result<Vec<String>, String> {
    let mut modules = vec!["numpy", "golden_ref"];
    if options.extras.iter().any(|e| e == "torch") {
        modules.push("torch");
    }
    if options.extras.iter().any(|e| e == "hf") {
        modules.push("transformers");
    }
    let script = format!(
        "import importlib.util as u\nfor m in {modules:?}:\n    if u.find_spec(m) is None:\n        print(m)\n"
    );
    let out = duct::cmd(python, ["-c", script.as_str()])
        .stdout_capture()
        .stderr_capture()
        .unchecked()
        .run()
        .map_err(|e| format!("could not run `{}`: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "the venv {} is broken: its interpreter does not start ({}); remove the folder and \
             run the set-up again",
            options.venv.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

/// `(major, minor)` of an interpreter, or why it cannot be used to create the venv.
fn python_version(python: &OsString) -> Result<(u32, u32), String> {
    let shown = python.to_string_lossy();
    let out = duct::cmd(
        python,
        ["-c", "import sys; print('%d %d' % sys.version_info[:2])"],
    )
    .stdout_capture()
    .stderr_capture()
    .unchecked()
    .run()
    .map_err(|e| {
        format!(
            "could not run `{shown}` to create the venv: {e}. golden needs Python {}.{} or newer \
             with its venv module: install it (Debian: apt-get install python3 python3-venv), or \
             name another interpreter with --python (or GOLDEN_BOOTSTRAP_PYTHON)",
            MIN_PYTHON.0, MIN_PYTHON.1
        )
    })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace().map(str::parse::<u32>);
    match (out.status.success(), parts.next(), parts.next()) {
        (true, Some(Ok(major)), Some(Ok(minor))) => Ok((major, minor)),
        _ => Err(format!(
            "`{shown}` did not say its version: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Create or update the venv as `options` say; `log` gets a line per step (for stderr). Returns
/// the interpreter: what golden's checks will run.
pub fn run(options: &Options, log: &dyn Fn(&str)) -> Result<Done, String> {
    let started = Instant::now();
    let python = options.python();
    let wanted = options.stamp()?;
    let stamp_path = options.venv.join(STAMP);
    if python.exists() && std::fs::read_to_string(&stamp_path).ok().as_deref() == Some(&*wanted) {
        // Up to date by its stamp: make sure the interpreter still starts (a venv whose base
        // Python was removed does not) and still finds what the checks import (a venv can lose
        // a package after its set-up: `pip uninstall torch`), without importing anything.
        match missing_modules(&python, options)? {
            missing if missing.is_empty() => {
                return Ok(Done {
                    python,
                    up_to_date: true,
                    versions: Vec::new(),
                    seconds: started.elapsed().as_secs_f64(),
                })
            }
            missing => log(&format!(
                "{} no longer has {} (its set-up installed {}): installing again",
                options.venv.display(),
                missing.join(", "),
                if missing.len() == 1 { "it" } else { "them" }
            )),
        }
    }
    if !is_golden_package(&options.golden) {
        return Err(format!(
            "golden's Python package is not at {}: the golden checkout it comes from is gone or \
             incomplete; name one with --golden <checkout>/reference_py",
            options.golden.display()
        ));
    }
    if !python.exists() {
        let (major, minor) = python_version(&options.bootstrap)?;
        if (major, minor) < MIN_PYTHON {
            return Err(format!(
                "`{}` is Python {major}.{minor}; golden needs {}.{} or newer: name another \
                 interpreter with --python (or GOLDEN_BOOTSTRAP_PYTHON)",
                options.bootstrap.to_string_lossy(),
                MIN_PYTHON.0,
                MIN_PYTHON.1
            ));
        }
        log(&format!(
            "creating a venv in {} with {} (Python {major}.{minor}) ...",
            options.venv.display(),
            options.bootstrap.to_string_lossy()
        ));
        let out = duct::cmd(
            &options.bootstrap,
            [
                OsString::from("-m"),
                "venv".into(),
                options.venv.clone().into(),
            ],
        )
        .stdout_to_stderr()
        .stderr_capture()
        .unchecked()
        .run()
        .map_err(|e| format!("could not run {}: {e}", options.bootstrap.to_string_lossy()))?;
        if !out.status.success() {
            return Err(format!(
                "`{} -m venv {}` failed: {}\n  golden needs Python's venv module with pip \
                 (Debian: apt-get install python3-venv)",
                options.bootstrap.to_string_lossy(),
                options.venv.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    // What another set-up left: say when golden's package in the venv is being replaced (another
    // checkout of golden, or this one's package changed), since plain Python in that venv then
    // imports this one (the checks never do: they import the golden they are built with).
    if let Ok(old) = std::fs::read_to_string(&stamp_path) {
        if let Some(line) = replaced_package(&old, &wanted) {
            log(&line);
        }
    }
    // A stamp that no longer matches is removed first: an interrupted install must not leave the
    // old one claiming the venv is up to date.
    let _ = std::fs::remove_file(&stamp_path);
    log(&format!(
        "installing golden's Python package with numpy and torch{} (the first time: ~2-3 min, \
         5.4 GB) ...\n  {}",
        match &options.requirements {
            Some(r) => format!(" and {}", r.file().display()),
            None => String::new(),
        },
        options.pip_command()
    ));
    let mut args: Vec<OsString> = vec!["-m".into(), "pip".into()];
    args.extend(options.pip_args());
    let status = duct::cmd(&python, args)
        // pip's progress goes to stderr: stdout is for the interpreter's path alone.
        .stdout_to_stderr()
        .unchecked()
        .run()
        .map_err(|e| format!("could not run pip: {e}"))?
        .status;
    if !status.success() {
        return Err(format!(
            "pip failed ({status}); the command was:\n  {}\nfix what pip says above (a \
             requirement that does not exist, a version conflict, no network) and run the set-up \
             again",
            options.pip_command()
        ));
    }
    std::fs::write(&stamp_path, &wanted).map_err(|e| format!("{}: {e}", stamp_path.display()))?;
    Ok(Done {
        versions: probe(&python)?,
        python,
        up_to_date: false,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("golden-setup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_crate_s_requirements_file_wins_over_its_pyproject() {
        let dir = temp("reqs");
        assert_eq!(crate_requirements(&dir), None);
        std::fs::create_dir_all(dir.join("reference_py")).unwrap();
        std::fs::write(dir.join("reference_py/pyproject.toml"), "[project]\n").unwrap();
        assert_eq!(
            crate_requirements(&dir),
            Some(Requirements::Project(dir.join("reference_py")))
        );
        std::fs::write(dir.join("reference_py/requirements.txt"), "transformers\n").unwrap();
        assert_eq!(
            crate_requirements(&dir),
            Some(Requirements::File(
                dir.join("reference_py/requirements.txt")
            ))
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_stamp_changes_with_the_requirements_and_nothing_else() {
        let dir = temp("stamp");
        let golden = dir.join("golden");
        std::fs::create_dir_all(&golden).unwrap();
        std::fs::write(
            golden.join("pyproject.toml"),
            "[project]\nname='golden-ref'\n",
        )
        .unwrap();
        let krate = dir.join("crate");
        std::fs::create_dir_all(krate.join("reference_py")).unwrap();
        std::fs::write(
            krate.join("reference_py/requirements.txt"),
            "transformers==5.23.0\n",
        )
        .unwrap();
        let options = Options::for_crate(&krate, dir.join("venv"), golden.clone());
        let first = options.stamp().unwrap();
        assert_eq!(first, options.stamp().unwrap());
        std::fs::write(
            krate.join("reference_py/requirements.txt"),
            "transformers==5.22.0\n",
        )
        .unwrap();
        let second = options.stamp().unwrap();
        assert_ne!(first, second, "a changed requirements file must reinstall");
        std::fs::write(
            golden.join("pyproject.toml"),
            "[project]\nname='golden-ref'\n# new\n",
        )
        .unwrap();
        assert_ne!(
            second,
            options.stamp().unwrap(),
            "a changed golden package too"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn one_pip_call_installs_golden_as_a_version_with_the_crate_s_requirements() {
        let options = Options {
            venv: "/v".into(),
            bootstrap: "python3".into(),
            golden: "/g/reference_py".into(),
            extras: vec!["torch".into()],
            requirements: Some(Requirements::File(
                "/c/reference_py/requirements.txt".into(),
            )),
        };
        assert_eq!(
            options.pip_command(),
            "/v/bin/python -m pip install --disable-pip-version-check \
             '/g/reference_py[torch]' -r /c/reference_py/requirements.txt"
        );
    }

    /// `golden setup` said "up to date" for a venv that had lost numpy and torch since its set-up,
    /// while every check said to run `golden setup` (#21 item 14): the stamp alone is not enough.
    #[cfg(unix)]
    #[test]
    fn a_stamped_venv_that_lost_its_packages_is_set_up_again() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp("lost");
        let golden = dir.join("golden");
        std::fs::create_dir_all(&golden).unwrap();
        std::fs::write(
            golden.join("pyproject.toml"),
            "[project]\nname='golden-ref'\n",
        )
        .unwrap();
        std::fs::create_dir_all(golden.join("golden_ref")).unwrap();
        std::fs::write(golden.join("golden_ref/worker.py"), "").unwrap();
        // A venv whose interpreter starts but finds none of the packages (no site-packages, so
        // no pip either: the reinstall fails at once, installing nothing anywhere).
        let venv = dir.join("venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        let python = venv.join("bin/python");
        std::fs::write(&python, "#!/bin/sh\nexec python3 -S \"$@\"\n").unwrap();
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
        let options = Options::for_golden(&golden, venv.clone());
        std::fs::write(venv.join(STAMP), options.stamp().unwrap()).unwrap();
        let said = std::cell::RefCell::new(Vec::new());
        let result = run(&options, &|line| said.borrow_mut().push(line.to_string()));
        let said = said.into_inner().join("\n");
        match result {
            Ok(done) => panic!("up to date: {}; said {said}", done.up_to_date),
            Err(e) => assert!(e.contains("pip failed"), "{e}"),
        }
        assert!(
            said.contains("no longer has numpy, golden_ref, torch, transformers"),
            "{said}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn two_checkouts_of_the_same_golden_share_a_venv_and_another_golden_replaces_it_saying_so() {
        let dir = temp("owners");
        let package = |name: &str, worker: &str| {
            let p = dir.join(name).join("reference_py");
            std::fs::create_dir_all(p.join("golden_ref/__pycache__")).unwrap();
            std::fs::write(
                p.join("pyproject.toml"),
                "[project]\nname = \"golden-ref\"\nversion = \"0.1.0\"\n\n\
                 [tool.setuptools]\npackages = [\"golden_ref\"]\n",
            )
            .unwrap();
            std::fs::write(p.join("golden_ref/worker.py"), worker).unwrap();
            // Bytecode differs from machine to machine: not part of the package's identity.
            std::fs::write(p.join("golden_ref/__pycache__/worker.pyc"), name).unwrap();
            p
        };
        let (a, b) = (package("a", "x = 1\n"), package("b", "x = 1\n"));
        let venv = dir.join("venv");
        let stamp_a = Options::for_golden(&a, venv.clone()).stamp().unwrap();
        let stamp_b = Options::for_golden(&b, venv.clone()).stamp().unwrap();
        assert_eq!(stamp_a, stamp_b, "the same golden in two checkouts");
        assert!(!stamp_a.contains(&*dir.to_string_lossy()), "{stamp_a}");
        assert!(stamp_a.contains("golden-ref 0.1.0"), "{stamp_a}");
        assert_eq!(replaced_package(&stamp_a, &stamp_b), None);
        let c = package("c", "x = 2\n");
        let stamp_c = Options::for_golden(&c, venv.clone()).stamp().unwrap();
        assert_ne!(stamp_a, stamp_c, "another golden's package");
        let line = replaced_package(&stamp_a, &stamp_c).unwrap();
        assert!(
            line.contains("another golden-ref than this golden's"),
            "{line}"
        );
        // A venv set up editable by an older golden names the folder it followed.
        let old =
            "golden setup, stamp format 1\ngolden package (editable): /work/main/reference_py \
                   [torch,hf]\n  pyproject.toml sha256 00\ncrate requirements: none\n";
        let line = replaced_package(old, &stamp_a).unwrap();
        assert!(
            line.contains("editable from /work/main/reference_py")
                && line.contains("tied to no checkout"),
            "{line}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn shell_words_are_quoted_where_a_shell_would_split_them() {
        assert_eq!(shell_word("/a/b"), "/a/b");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("x[torch]"), "'x[torch]'", "zsh would glob it");
    }
}
