//! Walking a folder for files, following symlinks but visiting each real folder once.
//!
//! A dump folder may hold symlinks to folders (`latest -> run_42`), which are followed, and
//! symlinks that lead back to a folder above them (`a/up -> ..`), which would make a walk list
//! the same files again and again (forty times over before the system refuses the path, or
//! exponentially many with two such links). A folder is known by its device and inode (its
//! canonical path off Unix): one already visited is not entered again, and the walk says which
//! link it left, and why. Real folders are walked before symlinked ones and entries in name
//! order, so a folder reached both ways is listed under its real path, the same on every run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What a walk found.
#[derive(Debug, Default)]
pub struct Walk {
    /// The files, in walking order.
    pub files: Vec<PathBuf>,
    /// The links that were not followed, and why.
    pub notes: Vec<String>,
}

/// How a folder is told from another whatever the path that leads to it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Identity {
    #[cfg(unix)]
    Inode(u64, u64),
    #[cfg_attr(unix, allow(dead_code))]
    Path(PathBuf),
}

fn identity(path: &Path) -> std::io::Result<Identity> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        Ok(Identity::Inode(m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        Ok(Identity::Path(std::fs::canonicalize(path)?))
    }
}

/// A folder to walk: its path and the identities of the folders that lead to it (itself last).
struct Pending {
    dir: PathBuf,
    chain: Vec<Identity>,
}

/// `path` relative to `root`, as the notes show it (`.` for the root itself).
fn shown(root: &Path, path: &Path) -> String {
    match path.strip_prefix(root) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".into(),
        Ok(rel) => rel.to_string_lossy().replace('\\', "/"),
        Err(_) => path.display().to_string(),
    }
}

/// The files under `root` for which `keep` holds, each real folder visited once.
pub fn files_under(root: &Path, keep: impl Fn(&Path) -> bool) -> Result<Walk, String> {
    let root_id = identity(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let mut walk = Walk::default();
    // Where each folder was first seen, for the notes.
    let mut seen: HashMap<Identity, PathBuf> = HashMap::from([(root_id.clone(), root.into())]);
    let mut stack = vec![Pending {
        dir: root.to_path_buf(),
        chain: vec![root_id],
    }];
    // Symlinked folders wait until every real folder is walked.
    let mut linked: Vec<Pending> = Vec::new();
    loop {
        let next = match stack.pop() {
            Some(p) => Some(p),
            None => loop {
                if linked.is_empty() {
                    break None;
                }
                let p = linked.remove(0);
                if let Some(p) = enter(root, p, &mut seen, &mut walk.notes) {
                    break Some(p);
                }
            },
        };
        let Some(Pending { dir, chain }) = next else {
            break;
        };
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut paths: Vec<(PathBuf, bool)> = entries
            .map(|e| {
                let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
                let is_link = e.file_type().map(|t| t.is_symlink()).unwrap_or(false);
                Ok((e.path(), is_link))
            })
            .collect::<Result<_, String>>()?;
        paths.sort();
        let mut subdirs = Vec::new();
        for (path, is_link) in paths {
            if !path.is_dir() {
                if keep(&path) {
                    walk.files.push(path);
                }
                continue;
            }
            let pending = Pending {
                dir: path.clone(),
                chain: chain.clone(),
            };
            if is_link {
                linked.push(pending);
                continue;
            }
            if let Some(p) = enter(root, pending, &mut seen, &mut walk.notes) {
                subdirs.push(p);
            }
        }
        // In name order: the stack pops the last first.
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(walk)
}

/// The folder `p` leads to, unless it was visited already (noted, with why).
fn enter(
    root: &Path,
    mut p: Pending,
    seen: &mut HashMap<Identity, PathBuf>,
    notes: &mut Vec<String>,
) -> Option<Pending> {
    let id = match identity(&p.dir) {
        Ok(id) => id,
        Err(e) => {
            notes.push(format!("`{}` was not followed: {e}", shown(root, &p.dir)));
            return None;
        }
    };
    if let Some(first) = seen.get(&id) {
        let why = if p.chain.contains(&id) {
            format!(
                "it leads back to `{}`, which contains it (a loop)",
                shown(root, first)
            )
        } else {
            format!(
                "it leads to `{}`, which is listed already",
                shown(root, first)
            )
        };
        notes.push(format!("`{}` was not followed: {why}", shown(root, &p.dir)));
        return None;
    }
    seen.insert(id.clone(), p.dir.clone());
    p.chain.push(id);
    Some(p)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn loops_and_second_paths_are_walked_once_and_named() {
        let root = std::env::temp_dir().join(format!("golden-walk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["a/b", "real"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in ["a/b/x.npy", "real/y.npy", "top.npy"] {
            std::fs::write(root.join(f), b"").unwrap();
        }
        std::os::unix::fs::symlink("..", root.join("a/b/up")).unwrap();
        std::os::unix::fs::symlink(".", root.join("a/self")).unwrap();
        // Sorted before `real`: still listed as `real/y.npy`, the link noted.
        std::os::unix::fs::symlink("real", root.join("latest")).unwrap();
        std::os::unix::fs::symlink("missing", root.join("broken")).unwrap();
        let walk = files_under(&root, |_| true).unwrap();
        let files: Vec<String> = walk.files.iter().map(|f| shown(&root, f)).collect();
        assert_eq!(files, ["broken", "top.npy", "a/b/x.npy", "real/y.npy"]);
        assert_eq!(
            walk.notes,
            [
                "`latest` was not followed: it leads to `real`, which is listed already",
                "`a/self` was not followed: it leads back to `a`, which contains it (a loop)",
                "`a/b/up` was not followed: it leads back to `a`, which contains it (a loop)",
            ]
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
