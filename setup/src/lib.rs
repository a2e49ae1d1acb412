//! The Python environment golden's checks run their references in: `golden setup` in a user's
//! crate, `cargo xtask setup` in golden's own workspace; both are this code.
//!
//! A set-up creates the venv if it is missing (`python3 -m venv`), then installs into it, in one pip
//! call so that pip resolves everything together:
//!
//! * golden's Python package (`golden_ref`: the worker, `golden_ref.variants`,
//!   `golden_ref.catalogue`, ...) from the golden the crate depends on, **editable**: plain Python
//!   (`from golden_ref.variants import variant` in an IDE or a script) then imports the same code
//!   the worker runs, and it never goes stale when golden changes;
//! * numpy and torch, pinned by golden's package (its `torch` extra: the committed snapshots and
//!   golden stores are reproduced exactly with them);
//! * the crate's own Python requirements: `<crate>/reference_py/requirements.txt` (`pip install
//!   -r`), or, when there is none, the project `<crate>/reference_py/pyproject.toml` describes
//!   (installed editable, with its dependencies).
//!
//! Then it writes a stamp into the venv that says exactly what was installed from where (paths and
//! SHA-256 of the files that list requirements). When the stamp matches, a set-up only checks that
//! the interpreter starts and still finds the modules the checks import (located, not imported;
//! a venv that lost one since is set up again): an up-to-date venv is detected in a fraction of a
//! second.
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

    /// The arguments of the one pip call (after `python -m pip`).
    pub fn pip_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = ["install", "--disable-pip-version-check", "-e"]
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

    /// What the stamp of a set-up with these options says: the install's sources and the
    /// SHA-256 of every file that lists requirements.
    pub fn stamp(&self) -> Result<String, String> {
        let mut s = String::from("golden setup, stamp format 1\n");
        let golden_project = self.golden.join("pyproject.toml");
        s.push_str(&format!(
            "golden package (editable): {} [{}]\n  pyproject.toml sha256 {}\n",
            self.golden.display(),
            self.extras.join(","),
            sha256_file(&golden_project)?
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
    fn one_pip_call_installs_golden_editable_with_the_crate_s_requirements() {
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
            "/v/bin/python -m pip install --disable-pip-version-check -e \
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
    fn shell_words_are_quoted_where_a_shell_would_split_them() {
        assert_eq!(shell_word("/a/b"), "/a/b");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("x[torch]"), "'x[torch]'", "zsh would glob it");
    }
}
