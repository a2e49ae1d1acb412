//! `golden setup`: create or update the Python environment a crate's checks run their references
//! in, and print its interpreter. The work is `golden-setup`'s (shared with `cargo xtask setup`);
//! this chooses the crate, the venv and golden's Python package, and says what it did.

use golden_setup::{Done, Options};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// `golden setup`'s options.
#[derive(Clone, Debug, Default)]
pub struct Args {
    /// The venv (default: `GOLDEN_VENV`, else `~/.cache/golden/venv`).
    pub venv: Option<PathBuf>,
    /// The crate (default: the nearest folder at or above the current one with a Cargo.toml).
    pub crate_dir: Option<PathBuf>,
    /// The interpreter that creates a missing venv (default `GOLDEN_BOOTSTRAP_PYTHON`, else
    /// `python3`).
    pub python: Option<OsString>,
    /// golden's Python package (default: from the golden the crate depends on, found with
    /// `cargo metadata`; else the checkout this binary was built from).
    pub golden: Option<PathBuf>,
}

/// golden's Python package in the checkout this binary was built from.
pub fn built_from() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("reference_py")
}

/// The options of a set-up for `args`, and notes for the user (how golden's package was found).
pub fn options(args: &Args) -> Result<(Options, Vec<String>), String> {
    let mut notes = Vec::new();
    let here = std::env::current_dir().map_err(|e| format!("the current folder: {e}"))?;
    let crate_dir = match &args.crate_dir {
        Some(d) => d.clone(),
        None => golden_setup::find_crate(&here).ok_or_else(|| {
            format!(
                "no Cargo.toml in {} or above it: run `golden setup` in your crate, or name it \
                 with --crate DIR",
                here.display()
            )
        })?,
    };
    let venv = match &args.venv {
        Some(v) => v.clone(),
        None => golden_setup::default_venv()?,
    };
    let golden = match &args.golden {
        Some(g) => g.clone(),
        None if golden_setup::is_golden_package(&crate_dir.join("reference_py")) => {
            crate_dir.join("reference_py")
        }
        None => match golden_setup::golden_package_of(&crate_dir) {
            Ok(p) => p,
            Err(why) => {
                let fallback = built_from();
                notes.push(format!(
                    "golden's Python package comes from the checkout this `golden` was built \
                     from ({}), because {why}",
                    fallback.display()
                ));
                fallback
            }
        },
    };
    let mut options = Options::for_crate(&crate_dir, venv, golden);
    if let Some(p) = &args.python {
        options.bootstrap = p.clone();
    }
    // The interpreter golden's checks pick before golden's venv (describe/env.rs): a set-up of
    // another venv would not be the one they run.
    let chosen = options.python();
    if let Some(p) = std::env::var_os("GOLDEN_PYTHON").filter(|p| !p.is_empty()) {
        if Path::new(&p) != chosen {
            notes.push(format!(
                "GOLDEN_PYTHON is set ({}): golden's checks run that interpreter, not this \
                 venv's; unset it, or set it to {}",
                Path::new(&p).display(),
                chosen.display()
            ));
        }
    } else if let Some(v) = std::env::var_os("VIRTUAL_ENV").filter(|v| !v.is_empty()) {
        if golden_setup::python_in(Path::new(&v)) != chosen
            && golden_setup::python_in(Path::new(&v)).exists()
        {
            notes.push(format!(
                "a venv is active (VIRTUAL_ENV={}): golden's checks run its interpreter, not this \
                 venv's; deactivate it, or set it up instead: golden setup --venv \"$VIRTUAL_ENV\"",
                Path::new(&v).display()
            ));
        }
    }
    Ok((options, notes))
}

/// What `golden setup` prints on stderr when it is done (stdout has the interpreter alone).
pub fn summary(options: &Options, done: &Done) -> String {
    let mut s = if done.up_to_date {
        format!(
            "golden setup: {} is up to date (checked in {:.2} s)",
            options.venv.display(),
            done.seconds
        )
    } else {
        let versions: Vec<String> = done
            .versions
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        format!(
            "golden setup: {} is ready ({:.0} s): {}",
            options.venv.display(),
            done.seconds,
            versions.join(", ")
        )
    };
    if let Some(r) = &options.requirements {
        s.push_str(&format!(
            "\n  with the crate's requirements from {}",
            r.file().display()
        ));
    }
    s
}

/// Run `golden setup`: the interpreter on success.
pub fn run(args: &Args) -> Result<PathBuf, String> {
    let (options, notes) = options(args)?;
    for note in &notes {
        eprintln!("golden setup: note: {note}");
    }
    let done = golden_setup::run(&options, &|line| eprintln!("golden setup: {line}"))?;
    eprintln!("{}", summary(&options, &done));
    Ok(done.python)
}
