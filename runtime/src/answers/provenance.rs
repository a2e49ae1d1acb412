//! What a reference's answers were computed with: the versions of Python and of the packages it
//! runs on (numpy, torch, and the distribution its module comes from: transformers, say), and the
//! SHA-256 of its source files. A golden store records it; a replay (or a live run beside a store)
//! compares it with what this machine has, so that replaying answers of another transformers, or
//! of a reference edited since, says so.
//!
//! The worker reports it when it loads the reference (`golden_ref.references.provenance`): the
//! files are the one defining the reference, those defining its base classes in the same
//! top-level package, and the configuration class's (`config = "..."`), each named relative to
//! the import root it was found under (`transformers/models/llama/modeling_llama.py`,
//! `zoo_ref/blocks.py`). Without Python (a replay), golden finds the same files under its import
//! roots and the interpreter's site-packages, and the packages' versions in their `.dist-info`
//! folders; what it cannot see (no venv, a file it cannot find) is not compared.

use crate::python::key::site_packages;
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};

/// Versions and source hashes of a reference.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Provenance {
    /// Python's version (`3.11.7`).
    pub python: String,
    /// Distribution names and versions, sorted by name (`numpy 2.4.6`, `torch 2.15.0`).
    pub packages: Vec<(String, String)>,
    /// Source files (relative to their import root) and their SHA-256, sorted.
    pub sources: Vec<(String, String)>,
}

impl Provenance {
    /// From the worker's `load` answer (`provenance`), or from a store.
    pub fn from_json(v: &Json) -> Option<Provenance> {
        let pairs = |v: &Json| -> Vec<(String, String)> {
            let mut out: Vec<(String, String)> = v
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect();
            out.sort();
            out
        };
        let object = v.as_object()?;
        Some(Provenance {
            python: object.get("python")?.as_str()?.to_string(),
            packages: pairs(&v["packages"]),
            sources: pairs(&v["sources"]),
        })
    }

    /// As a store records it.
    pub fn to_json(&self) -> Json {
        let object = |pairs: &[(String, String)]| {
            Json::Object(
                pairs
                    .iter()
                    .map(|(k, v)| (k.clone(), Json::from(v.as_str())))
                    .collect(),
            )
        };
        json!({
            "python": self.python,
            "packages": object(&self.packages),
            "sources": object(&self.sources),
        })
    }

    /// What this machine has of what `self` records, without running Python: the versions of the
    /// same packages in `python`'s site-packages (`<name>-<version>.dist-info`) and the hashes of
    /// the same files under `roots` or site-packages. Python's own version is not seen, and what
    /// cannot be found is left out.
    pub fn observed(&self, python: &Path, roots: &[PathBuf]) -> Provenance {
        let packages_dirs = site_packages(python);
        let packages = self
            .packages
            .iter()
            .filter_map(|(name, _)| {
                let version = packages_dirs.iter().find_map(|d| dist_version(d, name))?;
                Some((name.clone(), version))
            })
            .collect();
        let sources = self
            .sources
            .iter()
            .filter_map(|(file, _)| {
                let found = roots
                    .iter()
                    .chain(&packages_dirs)
                    .map(|root| root.join(file))
                    .find(|p| p.is_file())?;
                Some((file.clone(), sha256(&std::fs::read(found).ok()?)))
            })
            .collect();
        Provenance {
            python: String::new(),
            packages,
            sources,
        }
    }

    /// How `now` differs from `self` (the recorded one), one phrase per difference; only what both
    /// know is compared.
    pub fn differences(&self, now: &Provenance) -> Vec<String> {
        let mut out = Vec::new();
        // Python's patch release does not change a reference's answers; its minor may.
        if !self.python.is_empty()
            && !now.python.is_empty()
            && minor(&self.python) != minor(&now.python)
        {
            out.push(format!(
                "Python {} (now {})",
                minor(&self.python),
                minor(&now.python)
            ));
        }
        for (name, then) in &self.packages {
            if let Some((_, v)) = now.packages.iter().find(|(n, _)| n == name) {
                if v != then {
                    out.push(format!("{name} {then} (now {v})"));
                }
            }
        }
        for (file, then) in &self.sources {
            if let Some((_, h)) = now.sources.iter().find(|(f, _)| f == file) {
                if h != then {
                    out.push(format!("another {file} (it changed since)"));
                }
            }
        }
        out
    }
}

fn minor(version: &str) -> &str {
    match version.match_indices('.').nth(1) {
        Some((i, _)) => &version[..i],
        None => version,
    }
}

/// The version of distribution `name` installed in `site_packages`, from its `.dist-info` folder's
/// name (`transformers-5.23.0.dist-info`); names compare as pip normalizes them.
fn dist_version(site_packages: &Path, name: &str) -> Option<String> {
    let normal = |s: &str| s.to_lowercase().replace(['-', '.'], "_");
    let wanted = normal(name);
    std::fs::read_dir(site_packages)
        .ok()?
        .flatten()
        .find_map(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            let stem = file.strip_suffix(".dist-info")?;
            let (dist, version) = stem.rsplit_once('-')?;
            (normal(dist) == wanted).then(|| version.to_string())
        })
}

/// SHA-256 in hex.
pub fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded() -> Provenance {
        Provenance {
            python: "3.11.7".into(),
            packages: vec![
                ("numpy".into(), "2.4.6".into()),
                ("transformers".into(), "5.22.0".into()),
            ],
            sources: vec![("pkg/ref.py".into(), sha256(b"def f(x): return x\n"))],
        }
    }

    #[test]
    fn round_trips_through_json() {
        let p = recorded();
        assert_eq!(Provenance::from_json(&p.to_json()), Some(p));
    }

    #[test]
    fn another_version_and_an_edited_source_are_named_what_is_unknown_is_not() {
        let dir = std::env::temp_dir().join(format!("golden-provenance-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let packages = dir.join("venv/lib/python3.11/site-packages");
        std::fs::create_dir_all(packages.join("transformers-5.23.0.dist-info")).unwrap();
        std::fs::create_dir_all(dir.join("venv/bin")).unwrap();
        let root = dir.join("reference_py");
        std::fs::create_dir_all(root.join("pkg")).unwrap();
        std::fs::write(root.join("pkg/ref.py"), "def f(x): return x + 1\n").unwrap();
        let now = recorded().observed(&dir.join("venv/bin/python"), std::slice::from_ref(&root));
        // numpy has no dist-info here: not compared.
        assert_eq!(now.packages, vec![("transformers".into(), "5.23.0".into())]);
        assert_eq!(
            recorded().differences(&now),
            vec![
                "transformers 5.22.0 (now 5.23.0)".to_string(),
                "another pkg/ref.py (it changed since)".to_string()
            ]
        );
        std::fs::write(root.join("pkg/ref.py"), "def f(x): return x\n").unwrap();
        std::fs::rename(
            packages.join("transformers-5.23.0.dist-info"),
            packages.join("transformers-5.22.0.dist-info"),
        )
        .unwrap();
        let same = recorded().observed(&dir.join("venv/bin/python"), &[root]);
        assert!(recorded().differences(&same).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_patch_release_of_python_is_no_difference() {
        let mut now = recorded();
        now.python = "3.11.9".into();
        assert!(recorded().differences(&now).is_empty());
        now.python = "3.12.1".into();
        assert_eq!(recorded().differences(&now), vec!["Python 3.11 (now 3.12)"]);
    }
}
