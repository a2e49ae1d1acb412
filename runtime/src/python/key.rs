//! Which interpreter and import roots a Python worker runs with: workers (private or shared) are
//! reused only between checks with the same key.

use crate::describe::env::{self, Python};
use std::path::PathBuf;

/// Which interpreter and import roots a worker runs with; workers are shared only between checks
/// with the same key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkerKey {
    /// The interpreter.
    pub python: Python,
    /// `PYTHONPATH` entries, in order.
    pub roots: Vec<PathBuf>,
}

impl WorkerKey {
    /// The key for a check declared in the crate at `manifest_dir`, from the environment.
    pub fn from_env(manifest_dir: Option<&str>) -> Self {
        WorkerKey {
            python: env::python(),
            roots: env::import_roots(manifest_dir),
        }
    }
}

/// `PYTHONPATH` for a worker with this key. A root whose path holds the separator (`:`), which
/// PYTHONPATH cannot carry, is reached through a link of golden's own instead ([`linked_root`]).
pub(crate) fn pythonpath(key: &WorkerKey) -> Result<std::ffi::OsString, String> {
    let roots = key
        .roots
        .iter()
        .map(|r| linked_root(r))
        .collect::<Result<Vec<_>, _>>()?;
    std::env::join_paths(
        roots.into_iter().chain(
            std::env::var_os("PYTHONPATH")
                .iter()
                .flat_map(std::env::split_paths),
        ),
    )
    .map_err(|e| format!("an import root cannot be put in PYTHONPATH: {e}"))
}

/// The environment of a worker with this key: this process's, with `PYTHONPATH` for the key and
/// `GOLDEN_PARENT_PID` (the process whose end ends the worker). A private worker is started with
/// it, and a copy of the shared worker is given it in its `hello` (`shared.rs`), so that a
/// reference sees the same environment either way.
pub(crate) fn worker_environment(
    key: &WorkerKey,
) -> Result<Vec<(std::ffi::OsString, std::ffi::OsString)>, String> {
    let pythonpath = pythonpath(key)?;
    let mut vars: Vec<_> = std::env::vars_os()
        .filter(|(name, _)| name != "PYTHONPATH" && name != "GOLDEN_PARENT_PID")
        .collect();
    vars.push(("PYTHONPATH".into(), pythonpath));
    vars.push((
        "GOLDEN_PARENT_PID".into(),
        std::process::id().to_string().into(),
    ));
    Ok(vars)
}

/// `root` as PYTHONPATH can carry it: itself, or — when its path holds `:` (a crate in a folder
/// named `a:b`) — a symbolic link to it at `<target>/golden/roots/<hash of the path>`, made (or
/// made again) here. An error, with the fix, when there is no target folder to put the link in.
fn linked_root(root: &std::path::Path) -> Result<PathBuf, String> {
    if !root.as_os_str().as_encoded_bytes().contains(&b':') {
        return Ok(root.to_path_buf());
    }
    let cannot = |why: String| {
        format!(
            "the import root {} holds `:`, which separates PYTHONPATH's entries, and golden could \
             not link it from a path without one ({why}): move the crate (or golden's checkout) to \
             a folder whose path has no `:`",
            root.display()
        )
    };
    let dir = env::target_dir()
        .ok_or_else(|| cannot("no target folder".into()))?
        .join("golden")
        .join("roots");
    let link = dir.join(format!(
        "{:016x}",
        crate::describe::hash::fnv1a(root.as_os_str().as_encoded_bytes())
    ));
    if link.as_os_str().as_encoded_bytes().contains(&b':') {
        return Err(cannot(format!(
            "the target folder {} holds one too",
            dir.display()
        )));
    }
    if std::fs::read_link(&link).ok().as_deref() == Some(root) {
        return Ok(link);
    }
    std::fs::create_dir_all(&dir).map_err(|e| cannot(format!("{}: {e}", dir.display())))?;
    // Made beside and renamed over: another test process may be reading the link.
    let fresh = dir.join(format!(
        "{}.{}",
        link.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&fresh);
    std::os::unix::fs::symlink(root, &fresh)
        .and_then(|()| std::fs::rename(&fresh, &link))
        .map_err(|e| cannot(format!("{}: {e}", link.display())))?;
    Ok(link)
}

/// The site-packages folders an interpreter visibly has, without running it: a `bin/python` (a
/// venv's, or a system's) with `lib/python*/{site,dist}-packages` beside it.
pub fn site_packages(program: &std::path::Path) -> Vec<PathBuf> {
    let Some(root) = program.parent().and_then(std::path::Path::parent) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(root.join("lib")) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
        .flat_map(|e| ["site-packages", "dist-packages"].map(|p| e.path().join(p)))
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    out
}
