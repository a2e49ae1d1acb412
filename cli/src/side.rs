//! One side of a comparison: a tensor file, a folder of them, or an archive of them (`.zip`,
//! `.tar`, `.tar.gz`/`.tgz`, unpacked into a private folder: `unpack.rs`), and its tensor files
//! by key — the path relative to the folder without the extension, as folders are paired. An
//! archive whose files all lie in one folder (`model_a.zip` of `model_a/…`) is keyed inside it,
//! so that two archives of differently named folders pair.

use crate::read::ReadOptions;
use crate::scratch::Scratch;
use crate::unpack::{self, Kind};
use std::path::{Path, PathBuf};

/// What a side is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// One tensor file.
    File,
    /// A folder of tensor files.
    Folder,
    /// An archive of tensor files.
    Archive(Kind),
}

/// A side, opened: its tensor files by key.
#[derive(Debug)]
pub struct Side {
    /// What the user gave: a path, or an uploaded file's name.
    pub origin: PathBuf,
    /// A file, a folder or an archive.
    pub form: Form,
    /// The folder the keys are relative to (an archive's private copy), or the file.
    pub root: PathBuf,
    /// The tensor files: key and path (a single file's key is empty).
    pub files: Vec<(String, PathBuf)>,
    /// What was left out: archive entries that are not tensor files, links not followed.
    pub notes: Vec<String>,
    /// The archive's private copy, removed with the side.
    _scratch: Option<Scratch>,
}

impl Side {
    /// Open `path`: a folder is walked, an archive unpacked (within the read budget `read` gives
    /// the archive), anything else is one tensor file.
    pub fn open(path: &Path, read: &ReadOptions) -> Result<Side, String> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Side::open_as(path, &name, path, read)
    }

    /// Open `path` as a file named `name` says (an upload's name); `origin` is what messages show.
    pub fn open_as(
        path: &Path,
        name: &str,
        origin: &Path,
        read: &ReadOptions,
    ) -> Result<Side, String> {
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", origin.display()))?;
        if meta.is_dir() {
            let mut notes = Vec::new();
            let files = tensor_files(path, &mut notes)?;
            return Ok(Side {
                origin: origin.into(),
                form: Form::Folder,
                root: path.into(),
                files,
                notes,
                _scratch: None,
            });
        }
        if let Some(kind) = Kind::of_file(path, name) {
            let scratch = Scratch::new("unpacked")?;
            let unpacked = unpack::unpack(path, kind, scratch.path(), read.budget(meta.len()))
                .map_err(|e| {
                    e.replace(&path.display().to_string(), &origin.display().to_string())
                })?;
            let mut notes: Vec<String> = unpacked
                .skipped
                .iter()
                .map(|s| format!("in {}: left out {s}", origin.display()))
                .collect();
            let mut root = scratch.path().to_path_buf();
            let mut files = tensor_files(&root, &mut notes)?;
            // An archive of a folder (`model_a.zip` holding `model_a/…`): its files are keyed
            // inside that folder, as if the folder had been given.
            if let Some(top) = one_top_folder(&files) {
                root = root.join(&top);
                files = tensor_files(&root, &mut notes)?;
            }
            return Ok(Side {
                origin: origin.into(),
                form: Form::Archive(kind),
                root,
                files,
                notes,
                _scratch: Some(scratch),
            });
        }
        Ok(Side {
            origin: origin.into(),
            form: Form::File,
            root: path.into(),
            files: vec![(String::new(), path.into())],
            notes: Vec::new(),
            _scratch: None,
        })
    }

    /// Whether the side is a folder of files (a folder or an archive), not one file.
    pub fn is_folder(&self) -> bool {
        self.form != Form::File
    }

    /// The folder a dump's manifest (`order.txt`) may be in.
    pub fn manifest_dir(&self) -> Option<&Path> {
        self.is_folder().then_some(self.root.as_path())
    }

    /// What it is, in words (`a .tar.gz archive`, `a folder`, `a file`).
    pub fn describe(&self) -> &'static str {
        match self.form {
            Form::File => "a file",
            Form::Folder => "a folder",
            Form::Archive(Kind::Zip) => "a .zip archive",
            Form::Archive(Kind::Tar) => "a .tar archive",
            Form::Archive(Kind::TarGz) => "a .tar.gz archive",
        }
    }

    /// A path in messages: the file's path, or for an archive's copy, the archive and the entry.
    pub fn shown(&self, path: &Path) -> String {
        match self.form {
            Form::Archive(_) => match path.strip_prefix(&self.root) {
                Ok(rel) => format!("{}:{}", self.origin.display(), rel.display()),
                Err(_) => path.display().to_string(),
            },
            Form::Folder => path.display().to_string(),
            Form::File => self.origin.display().to_string(),
        }
    }
}

/// The folder every file lies in, if they all lie in one (and there are files).
fn one_top_folder(files: &[(String, PathBuf)]) -> Option<String> {
    let first = files.first()?.0.split_once('/')?.0;
    files
        .iter()
        .all(|(k, _)| k.split_once('/').is_some_and(|(top, _)| top == first))
        .then(|| first.to_string())
}

/// Tensor files under `dir`, by their path relative to it without the extension, and the
/// symlinks that were not followed (each real folder is visited once).
fn tensor_files(dir: &Path, notes: &mut Vec<String>) -> Result<Vec<(String, PathBuf)>, String> {
    let walk = crate::walk::files_under(dir, |path| {
        path.extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| unpack::TENSOR_EXTENSIONS.contains(&x.to_ascii_lowercase().as_str()))
    })?;
    notes.extend(
        walk.notes
            .into_iter()
            .map(|n| format!("in {}: {n}", dir.display())),
    );
    Ok(walk
        .files
        .into_iter()
        .map(|path| {
            let rel = path.strip_prefix(dir).unwrap_or(&path).with_extension("");
            (rel.to_string_lossy().replace('\\', "/"), path)
        })
        .collect())
}
