//! A set-up from scratch, as `golden setup` runs it, into a temporary venv: created with
//! `python3 -m venv`, golden's Python package installed as a version with a crate's requirements,
//! the stamp, reuse detected without installing, plain Python importing `golden_ref.variants` with
//! no PYTHONPATH, another checkout of the same golden sharing the venv without installing, one of
//! another golden replacing the copy and saying so, and a changed requirements file installing
//! again. Without torch (its extra is left
//! out: 5.4 GB), so that it takes a minute, not three; needs PyPI or pip's cache.

use golden_setup::{Options, Requirements};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn golden_package() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("reference_py")
        .canonicalize()
        .unwrap()
}

/// golden's Python package as another checkout would hold it: pyproject.toml and its packages.
fn copy_package(from: &Path, to: &Path) {
    for package in ["golden_ref", "zoo_ref"] {
        std::fs::create_dir_all(to.join(package)).unwrap();
        for e in std::fs::read_dir(from.join(package)).unwrap().flatten() {
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), to.join(package).join(e.file_name())).unwrap();
            }
        }
    }
    std::fs::copy(from.join("pyproject.toml"), to.join("pyproject.toml")).unwrap();
}

#[test]
fn a_venv_is_created_reused_and_updated() {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no python3 on the PATH");
        return;
    }
    // pip's progress would fill the test's output (errors are still printed).
    std::env::set_var("PIP_QUIET", "1");
    let dir = std::env::temp_dir().join(format!("golden-setup-venv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let krate = dir.join("crate");
    std::fs::create_dir_all(krate.join("reference_py")).unwrap();
    let requirements = krate.join("reference_py/requirements.txt");
    // Already a dependency of golden's package: nothing more to download.
    std::fs::write(&requirements, "numpy\n").unwrap();
    let mut options = Options::for_crate(&krate, dir.join("venv"), golden_package());
    options.extras.clear();
    assert_eq!(
        options.requirements,
        Some(Requirements::File(requirements.clone()))
    );
    let lines = std::sync::Mutex::new(Vec::new());
    let log = |l: &str| lines.lock().unwrap().push(l.to_string());

    let first = golden_setup::run(&options, &log).expect("the set-up from scratch");
    assert!(!first.up_to_date);
    assert_eq!(first.python, dir.join("venv/bin/python"));
    assert!(first.python.exists());
    let logged = lines.lock().unwrap().join("\n");
    assert!(logged.contains("creating a venv in"), "{logged}");
    assert!(logged.contains(&options.pip_command()), "{logged}");
    let names: Vec<&str> = first.versions.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        names.contains(&"python") && names.contains(&"numpy") && names.contains(&"golden-ref"),
        "{:?}",
        first.versions
    );

    // Plain Python, outside any checkout and without PYTHONPATH, imports golden's decorators: from
    // the venv's own copy, tied to no checkout's folder.
    let out = std::process::Command::new(&first.python)
        .args(["-c", "import golden_ref.variants as v; print(v.__file__)"])
        .current_dir(&dir)
        .env_remove("PYTHONPATH")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = String::from_utf8_lossy(&out.stdout);
    assert!(
        Path::new(file.trim()).starts_with(dir.join("venv")),
        "a copy in the venv, not a link to the checkout: {file}"
    );

    // Another checkout of the same golden sharing the venv: nothing to install, nothing taken
    // over.
    let other = dir.join("other-checkout/reference_py");
    copy_package(&golden_package(), &other);
    let mut from_other = Options::for_crate(&krate, dir.join("venv"), other.clone());
    from_other.extras.clear();
    lines.lock().unwrap().clear();
    assert!(golden_setup::run(&from_other, &log).unwrap().up_to_date);
    // A checkout whose Python package differs replaces the copy, and says so.
    std::fs::write(other.join("golden_ref/__init__.py"), "# changed\n").unwrap();
    let replaced = golden_setup::run(&from_other, &log).unwrap();
    assert!(!replaced.up_to_date);
    let logged = lines.lock().unwrap().join("\n");
    assert!(
        logged.contains("another golden-ref than this golden's"),
        "{logged}"
    );
    lines.lock().unwrap().clear();
    // Back to the first checkout: its own package again.
    assert!(!golden_setup::run(&options, &log).unwrap().up_to_date);

    // Reuse: the stamp matches, nothing is installed, and it is quick.
    lines.lock().unwrap().clear();
    let started = Instant::now();
    let again = golden_setup::run(&options, &log).unwrap();
    assert!(again.up_to_date);
    assert!(lines.lock().unwrap().is_empty(), "{:?}", lines.lock());
    assert!(
        started.elapsed().as_secs_f64() < 5.0,
        "{:?}",
        started.elapsed()
    );

    // A changed requirements file installs again.
    std::fs::write(&requirements, "numpy\n# changed\n").unwrap();
    let updated = golden_setup::run(&options, &log).unwrap();
    assert!(!updated.up_to_date);
    let logged = lines.lock().unwrap().join("\n");
    assert!(!logged.contains("creating a venv"), "{logged}");
    assert!(
        logged.contains("installing golden's Python package"),
        "{logged}"
    );

    // A requirement that does not exist: pip's failure with the command, and no stamp claiming
    // the venv is up to date.
    std::fs::write(&requirements, "golden-no-such-package-for-sure==0.0.1\n").unwrap();
    let err = golden_setup::run(&options, &log).unwrap_err();
    assert!(err.contains("pip failed") && err.contains("-r "), "{err}");
    assert!(!dir.join("venv").join(golden_setup::STAMP).exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
