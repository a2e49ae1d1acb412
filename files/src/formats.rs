//! Reading tensor files for the `golden` command-line tool: `.npy`, `.npz`, `.safetensors` and
//! PyTorch's `.pt`/`.pth` (see `pickle.rs`: read without running pickled code). The format comes
//! from the file's first bytes, so a misnamed file still reads; the extension breaks ties.
//!
//! [`TensorFile::open`] reads a file's bytes and its index — every tensor's name, dtype and shape,
//! in the file's order — without reading any tensor's data; [`TensorFile::load`] reads one. A
//! file holding one unnamed tensor (`.npy`, `torch.save(tensor)`, a saved number) names it after
//! the file's stem. What reading costs beyond the file's own bytes (inflated zip entries, copied
//! views, byte swaps) is charged to the file's [`Budget`], so no input makes a reader panic, hang
//! or allocate beyond it (see `fuzz/`).

use crate::archive::Archive;
use crate::budget::{Budget, ReadError};
use crate::npy;
use crate::pickle::Pickled;
use crate::tensor::HostTensor;
use bytes::Bytes;
use std::path::{Path, PathBuf};

/// The formats golden reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// NumPy `.npy`.
    Npy,
    /// NumPy `.npz` (a zip of `.npy`, compressed or not).
    Npz,
    /// Hugging Face safetensors.
    Safetensors,
    /// `torch.save` (zip format).
    Torch,
}

pub use crate::tensor::{Entry, Skipped};

/// What a file holds, read whole.
pub struct Contents {
    /// The tensors by name, in the file's order.
    pub tensors: Vec<(String, HostTensor)>,
    /// What was in the file but is not a tensor or a number (a `.pt` may hold anything).
    pub skipped: Vec<Skipped>,
}

/// Which format `bytes` are in.
pub fn sniff(bytes: &[u8], path: &Path) -> Result<Format, String> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if bytes.starts_with(b"\x93NUMPY") {
        return Ok(Format::Npy);
    }
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
        return Ok(match ext.as_str() {
            "npz" => Format::Npz,
            "pt" | "pth" | "bin" | "ckpt" => Format::Torch,
            // A zip either way: torch.save's archives have a data.pkl.
            _ if contains(bytes, b"data.pkl") => Format::Torch,
            _ => Format::Npz,
        });
    }
    // safetensors: an 8-byte little-endian header length, then a JSON object.
    if bytes.len() >= 9 && bytes[8] == b'{' {
        return Ok(Format::Safetensors);
    }
    Err(match ext.as_str() {
        "pt" | "pth" | "bin" | "ckpt" => "not a zip archive: golden reads torch.save's zip format \
                                          (the default since PyTorch 1.6), not the legacy one"
            .to_string(),
        _ => "unknown format: golden reads .npy, .npz, .safetensors and torch.save's .pt/.pth"
            .to_string(),
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

enum Source {
    Npy(npy::Header),
    Npz {
        archive: Archive,
        /// Per entry: its index in the archive and its header.
        items: Vec<(usize, npy::Header)>,
    },
    Safetensors(Vec<crate::safetensors::Span>),
    Torch {
        archive: Archive,
        pickled: Box<Pickled>,
    },
}

/// An opened tensor file: its tensors' names, dtypes and shapes, each tensor's data read on
/// [`TensorFile::load`], against the file's read budget.
pub struct TensorFile {
    path: PathBuf,
    format: Format,
    bytes: Bytes,
    entries: Vec<Entry>,
    skipped: Vec<Skipped>,
    budget: Budget,
    source: Source,
}

impl TensorFile {
    /// Open `path` with its default read budget ([`Budget::for_file`]). Errors name the file.
    pub fn open(path: &Path) -> Result<TensorFile, String> {
        Self::open_with(path, &Budget::for_file)
    }

    /// Open `path` with the budget `budget` makes from the file's size. Errors name the file.
    pub fn open_with(path: &Path, budget: &dyn Fn(u64) -> Budget) -> Result<TensorFile, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let budget = budget(bytes.len() as u64);
        Self::from_bytes(bytes.into(), path, budget).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Open a file's bytes; `path` gives the extension and the stem.
    pub fn from_bytes(bytes: Bytes, path: &Path, mut budget: Budget) -> Result<Self, ReadError> {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("tensor")
            .to_string();
        let format = sniff(&bytes, path)?;
        let mut skipped = Vec::new();
        let (entries, source) = match format {
            Format::Npy => {
                let header =
                    npy::parse_header(&bytes).map_err(|e| ReadError::Unreadable(e.to_string()))?;
                let entry = Entry {
                    name: stem,
                    dtype: header.dtype,
                    shape: header.shape.clone(),
                };
                (vec![entry], Source::Npy(header))
            }
            Format::Npz => {
                let mut archive = Archive::new(bytes.clone()).map_err(|e| {
                    ReadError::Unreadable(format!("not a readable .npz (zip) archive: {e}"))
                })?;
                let (mut entries, mut items) = (Vec::new(), Vec::new());
                for i in 0..archive.zip.len() {
                    let name = archive
                        .zip
                        .name_for_index(i)
                        .and_then(|n| n.ok())
                        .map(|n| n.into_owned())
                        .unwrap_or_else(|| format!("entry {i}"));
                    let Some(stem) = name.strip_suffix(".npy").map(str::to_string) else {
                        let what = if name.ends_with('/') {
                            "a folder"
                        } else {
                            "not a .npy array"
                        };
                        skipped.push(Skipped {
                            name,
                            what: what.into(),
                        });
                        continue;
                    };
                    let what = format!("`{name}`");
                    let npy_error =
                        |e: npy::NpyError| ReadError::Unreadable(format!("{what}: {e}"));
                    // Only the header: at most 12 bytes, then exactly as many as it says.
                    let start = archive.entry(i, &what, &mut budget, Some(12))?;
                    let end = npy::header_end(&start).map_err(npy_error)?;
                    let header = archive.entry(i, &what, &mut budget, Some(end))?;
                    let header = npy::parse_header(&header).map_err(npy_error)?;
                    entries.push(Entry {
                        name: stem,
                        dtype: header.dtype,
                        shape: header.shape.clone(),
                    });
                    items.push((i, header));
                }
                (entries, Source::Npz { archive, items })
            }
            Format::Safetensors => {
                let (entries, spans) = crate::safetensors::index(&bytes)?;
                (entries, Source::Safetensors(spans))
            }
            Format::Torch => {
                let mut archive = Archive::new(bytes.clone()).map_err(|e| {
                    ReadError::Unreadable(format!(
                        "not a zip archive ({e}); golden reads torch.save's zip format (the \
                         default since PyTorch 1.6), not the legacy one"
                    ))
                })?;
                let pickled = crate::pickle::open(&mut archive, &mut budget, &stem)?;
                skipped = pickled.skipped.clone();
                (
                    pickled.entries.clone(),
                    Source::Torch {
                        archive,
                        pickled: Box::new(pickled),
                    },
                )
            }
        };
        Ok(TensorFile {
            path: path.to_path_buf(),
            format,
            bytes,
            entries,
            skipped,
            budget,
            source,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The tensors (and numbers, as 0-d tensors), in the file's order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// What the file holds that is neither, by name.
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }

    /// The file's read budget and what it has used.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The index of the tensor called `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.name == name)
    }

    /// Read tensor `i` of [`TensorFile::entries`]. Its data is a slice of the file where it can
    /// be; a copy or an inflated entry is charged to the file's budget first.
    pub fn load(&mut self, i: usize) -> Result<HostTensor, ReadError> {
        let name = &self.entries[i].name;
        let what = format!("`{name}`");
        let named = |e: ReadError| match e {
            ReadError::Unreadable(why) if !why.starts_with(&what) => {
                ReadError::Unreadable(format!("{what}: {why}"))
            }
            other => other,
        };
        match &mut self.source {
            Source::Npy(header) => {
                npy::from_header(header, self.bytes.clone(), &mut self.budget, "the data")
            }
            Source::Npz { archive, items } => {
                let (index, header) = &items[i];
                let entry = format!("`{name}.npy`");
                let bytes = archive.entry(*index, &entry, &mut self.budget, None)?;
                npy::from_header(header, bytes, &mut self.budget, &entry).map_err(named)
            }
            Source::Safetensors(spans) => crate::safetensors::load(
                &self.bytes,
                &spans[i],
                self.entries[i].dtype,
                &self.entries[i].shape,
                &what,
                &mut self.budget,
            ),
            Source::Torch { archive, pickled } => {
                pickled.load(i, archive, &mut self.budget).map_err(named)
            }
        }
    }

    /// Read every tensor.
    pub fn load_all(mut self) -> Result<Contents, ReadError> {
        let tensors = (0..self.entries.len())
            .map(|i| Ok((self.entries[i].name.clone(), self.load(i)?)))
            .collect::<Result<_, ReadError>>()?;
        Ok(Contents {
            tensors,
            skipped: self.skipped,
        })
    }
}

/// Read a tensor file whole, with its default read budget.
pub fn read(path: &Path) -> Result<Contents, String> {
    let file = TensorFile::open(path)?;
    file.load_all()
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Read a tensor file's bytes whole, with their default read budget; `path` gives the extension
/// and the stem.
pub fn read_bytes(bytes: &[u8], path: &Path) -> Result<Contents, String> {
    read_bytes_within(bytes, path, Budget::for_file(bytes.len() as u64))
}

/// Read a tensor file's bytes whole within `budget`.
pub fn read_bytes_within(bytes: &[u8], path: &Path, budget: Budget) -> Result<Contents, String> {
    TensorFile::from_bytes(Bytes::copy_from_slice(bytes), path, budget)
        .and_then(TensorFile::load_all)
        .map_err(|e| e.to_string())
}
