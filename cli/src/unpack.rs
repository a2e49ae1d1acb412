//! Archives of dumps (`.zip`, `.tar`, `.tar.gz`/`.tgz`), unpacked into a private folder so that
//! they are paired and read exactly as folders are.
//!
//! An archive golden did not make may be hostile; unpacking keeps the limits that reading a file
//! keeps, and names what it leaves out:
//!
//! * **what it writes**: only tensor files (and a dump's `order.txt`), each at most what the
//!   archive's read budget still allows: all together no more than the budget of the archive
//!   (64 × its size, at least 256 MiB, at most 16 GiB, or `--read-budget`), however much the
//!   entries claim or a compressed stream expands to (a bomb is refused at the limit, not after);
//! * **where**: inside the folder, always — an absolute path or one with `..` is skipped, and so
//!   are symlinks, hard links and devices (nothing is created that points elsewhere); files are
//!   created new, never opened through something already there: of entries of one path, the
//!   first is kept and the others are named (zip and tar alike), and an entry that cannot be
//!   written (a file then a folder of the same name, a name too long) is named and left out;
//! * **how many**: at most [`MAX_ENTRIES`] entries and [`MAX_DEPTH`] folders deep.
//!
//! The zip, tar and gzip formats are read by the `zip`, `tar` and `flate2` crates.

use golden_files::budget::size;
use golden_files::Budget;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

/// Most entries an archive may have (folders included).
pub const MAX_ENTRIES: usize = 100_000;
/// Most folders deep an entry may lie.
pub const MAX_DEPTH: usize = 64;

/// The extensions of the tensor files golden reads.
pub const TENSOR_EXTENSIONS: &[&str] = &["npy", "npz", "safetensors", "pt", "pth", "bin", "ckpt"];

/// The archive formats of dumps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `.zip`.
    Zip,
    /// `.tar`.
    Tar,
    /// `.tar.gz` or `.tgz`.
    TarGz,
}

impl Kind {
    /// The archive format a file name says (`.zip`, `.tar`, `.tar.gz`, `.tgz`), if any.
    pub fn of_name(name: &str) -> Option<Kind> {
        let lower = name.to_ascii_lowercase();
        if lower.ends_with(".tar.gz") || lower.ends_with(".tgz") {
            Some(Kind::TarGz)
        } else if lower.ends_with(".tar") {
            Some(Kind::Tar)
        } else if lower.ends_with(".zip") {
            Some(Kind::Zip)
        } else {
            None
        }
    }

    /// The archive format of `path`: its name's, or else its first bytes' (gzip, a tar header):
    /// a `.zip` is only taken as one by its name, since `.npz` and `.pt` files are zips too.
    pub fn of_file(path: &Path, name: &str) -> Option<Kind> {
        if let Some(kind) = Kind::of_name(name) {
            return Some(kind);
        }
        let mut head = [0u8; 512];
        let n = std::fs::File::open(path)
            .and_then(|mut f| read_up_to(&mut f, &mut head))
            .unwrap_or(0);
        if n >= 2 && head[..2] == [0x1f, 0x8b] {
            Some(Kind::TarGz)
        } else if n >= 262 && &head[257..262] == b"ustar" {
            Some(Kind::Tar)
        } else {
            None
        }
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// What unpacking left out, and what it wrote.
#[derive(Debug, Default)]
pub struct Unpacked {
    /// Tensor files written.
    pub files: usize,
    /// Entries left out, each with why (`README.md: not a tensor file`).
    pub skipped: Vec<String>,
}

/// Whether a path names a tensor file golden reads (by its extension) or a dump's manifest.
pub fn wanted(path: &Path) -> bool {
    let ext = path
        .extension()
        .and_then(|x| x.to_str())
        .map(str::to_ascii_lowercase);
    ext.is_some_and(|x| TENSOR_EXTENSIONS.contains(&x.as_str()))
        || path
            .file_name()
            .is_some_and(|n| n == golden::internal::report::artifacts::ORDER_MANIFEST)
}

/// The path an entry may be written at inside the folder: relative, no `..`, not too deep.
fn safe_path(name: &Path) -> Result<PathBuf, &'static str> {
    let mut out = PathBuf::new();
    for c in name.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err("its path leaves the archive (`..`)"),
            Component::RootDir | Component::Prefix(_) => {
                return Err("an absolute path, outside the archive")
            }
        }
    }
    if out.as_os_str().is_empty() {
        return Err("an empty path");
    }
    if out.components().count() > MAX_DEPTH {
        return Err("more than 64 folders deep");
    }
    Ok(out)
}

/// Writes entries into the folder within the limits.
struct Writer<'a> {
    into: &'a Path,
    budget: Budget,
    entries: usize,
    out: Unpacked,
}

impl Writer<'_> {
    fn count_entry(&mut self) -> Result<(), String> {
        self.entries += 1;
        if self.entries > MAX_ENTRIES {
            return Err(format!(
                "the archive has more than {MAX_ENTRIES} entries: golden unpacks no more"
            ));
        }
        Ok(())
    }

    fn skip(&mut self, name: &str, why: &str) {
        // A hostile archive may hold millions of names: the first thousand are kept.
        if self.out.skipped.len() < 1000 {
            self.out.skipped.push(format!("`{name}`: {why}"));
        } else if self.out.skipped.len() == 1000 {
            self.out.skipped.push("… and more".into());
        }
    }

    /// Write one regular file's bytes, `declared` long as the archive says.
    fn file(&mut self, name: &str, declared: u64, data: &mut dyn Read) -> Result<(), String> {
        let rel = match safe_path(Path::new(name)) {
            Ok(rel) => rel,
            Err(why) => {
                self.skip(name, why);
                return Ok(());
            }
        };
        if !wanted(&rel) {
            let why = if Kind::of_name(name).is_some() {
                "an archive inside the archive (not unpacked)"
            } else {
                "not a tensor file"
            };
            self.skip(name, why);
            return Ok(());
        }
        let over = |b: &Budget, bytes: u64| {
            format!(
                "`{name}` would take the unpacked archive over its limit of {} ({}); if you \
                 trust it, raise the limit with --read-budget SIZE",
                size(b.limit()),
                size(bytes)
            )
        };
        if !self.budget.fits(declared) {
            return Err(over(
                &self.budget,
                self.budget.used().saturating_add(declared),
            ));
        }
        let path = self.into.join(&rel);
        // An entry that cannot be written here (a file then a folder of the same name, a name
        // longer than the file system allows) is left out, not the whole archive.
        if let Some(Err(e)) = path.parent().map(std::fs::create_dir_all) {
            self.skip(name, &format!("cannot be written here ({e})"));
            return Ok(());
        }
        let mut file = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => f,
            // One rule for every archive: the first entry of a path is kept.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && path.is_file() => {
                self.skip(name, "a second entry of the same path (the first is kept)");
                return Ok(());
            }
            Err(e) => {
                self.skip(name, &format!("cannot be written here ({e})"));
                return Ok(());
            }
        };
        // No more than the budget allows, whatever the entry declares.
        let room = self.budget.limit() - self.budget.used();
        let mut limited = data.take(room.saturating_add(1));
        let mut buf = vec![0u8; 1 << 16];
        let mut written = 0u64;
        loop {
            let n = limited
                .read(&mut buf)
                .map_err(|e| format!("unpacking `{name}`: {e}"))?;
            if n == 0 {
                break;
            }
            written += n as u64;
            if written > room {
                drop(file);
                let _ = std::fs::remove_file(&path);
                return Err(over(
                    &self.budget,
                    self.budget.used().saturating_add(written),
                ));
            }
            file.write_all(&buf[..n])
                .map_err(|e| format!("unpacking `{name}`: {e}"))?;
        }
        let used = self.budget.used();
        if self.budget.charge(name, written).is_err() {
            return Err(over(&self.budget, used.saturating_add(written)));
        }
        self.out.files += 1;
        Ok(())
    }
}

/// A reader that fails past `limit` bytes: a compressed stream may expand to anything.
struct Capped<R> {
    inner: R,
    left: u64,
    limit: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(std::io::Error::other(format!(
                "the compressed archive expands beyond {} (its limit, with room for the tar \
                 headers): a bomb, or raise the limit with --read-budget SIZE",
                size(self.limit)
            )));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Unpack `archive` into the folder `into` (which exists and is private), within `budget` (the
/// archive's read budget: the most all the files written may take).
pub fn unpack(archive: &Path, kind: Kind, into: &Path, budget: Budget) -> Result<Unpacked, String> {
    let shown = archive.display();
    let file = std::fs::File::open(archive).map_err(|e| format!("{shown}: {e}"))?;
    let mut w = Writer {
        into,
        budget,
        entries: 0,
        out: Unpacked::default(),
    };
    match kind {
        Kind::Zip => {
            // An archive that starts with a local header starts at byte 0: said so, the reader
            // does not guess where its central directory is (see golden_files' archive.rs).
            let mut head = [0u8; 4];
            let starts = std::fs::File::open(archive)
                .and_then(|mut f| read_up_to(&mut f, &mut head))
                .is_ok_and(|n| n == 4 && head == *b"PK\x03\x04");
            let config = zip::read::Config {
                archive_offset: if starts {
                    zip::read::ArchiveOffset::Known(0)
                } else {
                    zip::read::ArchiveOffset::Detect
                },
            };
            // Every entry of the central directory, in its order, those that repeat a name
            // included (`ZipArchive`'s index keeps one of them, silently): the first of a path is
            // kept and the others are named, as in a tar.
            let unreadable =
                |e: zip::result::ZipError| format!("{shown}: not a readable zip archive ({e})");
            let mut zip =
                zip::unstable::read::ZipIterable::try_new(std::io::BufReader::new(file), config)
                    .map_err(unreadable)?;
            if zip.len() > MAX_ENTRIES {
                return Err(format!(
                    "{shown}: the archive has {} entries, more than the {MAX_ENTRIES} golden \
                     unpacks",
                    zip.len()
                ));
            }
            let bodies = std::fs::File::open(archive).map_err(|e| format!("{shown}: {e}"))?;
            let mut entries = zip
                .files_with_reader(
                    std::io::BufReader::new(bodies),
                    zip::read::ZipReadOptions::new(),
                )
                .map_err(unreadable)?;
            let mut i = 0usize;
            while let Some(entry) = entries.next() {
                w.count_entry().map_err(|e| format!("{shown}: {e}"))?;
                let mut entry = entry.map_err(|e| format!("{shown}: entry {i}: {e}"))?;
                i += 1;
                let name = entry.name().map_or_else(
                    |_| format!("entry {i} (a name that is not text)"),
                    |n| n.to_string(),
                );
                if entry.is_dir() {
                    continue;
                }
                if entry.is_symlink() {
                    w.skip(&name, "a symlink (not followed)");
                    continue;
                }
                if !entry.is_file() {
                    w.skip(&name, "not a regular file");
                    continue;
                }
                let declared = entry.size();
                w.file(&name, declared, &mut entry)
                    .map_err(|e| format!("{shown}: {e}"))?;
            }
        }
        Kind::Tar | Kind::TarGz => {
            let reader: Box<dyn Read> = if kind == Kind::TarGz {
                // Headers and padding take room beyond the files' bytes: 1 KiB an entry at most.
                let limit = w.budget.limit().saturating_add((MAX_ENTRIES as u64) * 1024);
                Box::new(Capped {
                    inner: flate2::read::GzDecoder::new(std::io::BufReader::new(file)),
                    left: limit,
                    limit,
                })
            } else {
                Box::new(std::io::BufReader::new(file))
            };
            let mut tar = tar::Archive::new(reader);
            let entries = tar
                .entries()
                .map_err(|e| format!("{shown}: not a readable tar archive ({e})"))?;
            for entry in entries {
                let mut entry =
                    entry.map_err(|e| format!("{shown}: not a readable tar archive ({e})"))?;
                w.count_entry().map_err(|e| format!("{shown}: {e}"))?;
                let name = entry.path().map_or_else(
                    |_| "(a name that is not a path)".to_string(),
                    |p| p.to_string_lossy().into_owned(),
                );
                let kind = entry.header().entry_type();
                if kind.is_dir() {
                    continue;
                }
                if kind.is_symlink() {
                    w.skip(&name, "a symlink (not followed)");
                    continue;
                }
                if kind.is_hard_link() {
                    w.skip(&name, "a hard link (not followed)");
                    continue;
                }
                if !kind.is_file() {
                    w.skip(&name, "not a regular file");
                    continue;
                }
                let declared = entry.size();
                w.file(&name, declared, &mut entry)
                    .map_err(|e| format!("{shown}: {e}"))?;
            }
        }
    }
    Ok(w.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_and_names_say_the_format() {
        assert_eq!(
            safe_path(Path::new("./a/b.pth")).unwrap(),
            PathBuf::from("a/b.pth")
        );
        assert!(safe_path(Path::new("../x.pth")).is_err());
        assert!(safe_path(Path::new("a/../../x.pth")).is_err());
        assert!(safe_path(Path::new("/etc/x.pth")).is_err());
        assert!(safe_path(Path::new(&"d/".repeat(70))).is_err());
        assert_eq!(Kind::of_name("dumps.TAR.GZ"), Some(Kind::TarGz));
        assert_eq!(Kind::of_name("d.tgz"), Some(Kind::TarGz));
        assert_eq!(Kind::of_name("d.tar"), Some(Kind::Tar));
        assert_eq!(Kind::of_name("d.zip"), Some(Kind::Zip));
        assert_eq!(Kind::of_name("d.npz"), None);
        assert!(wanted(Path::new("x/0_post_mlp.pth")));
        assert!(wanted(Path::new("order.txt")));
        assert!(!wanted(Path::new("README.md")));
    }
}
