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

/// `PYTHONPATH` for a worker with this key.
pub(crate) fn pythonpath(key: &WorkerKey) -> Result<std::ffi::OsString, String> {
    std::env::join_paths(
        key.roots.iter().cloned().chain(
            std::env::var_os("PYTHONPATH")
                .iter()
                .flat_map(std::env::split_paths),
        ),
    )
    .map_err(|e| format!("an import root cannot be put in PYTHONPATH: {e}"))
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
