//! Reading tensor files for the `golden` command-line tool: `.npy`, `.npz`, `.safetensors` and
//! PyTorch's `.pt`/`.pth` (see `pickle.rs`: read without running pickled code). The format comes
//! from the file's first bytes, so a misnamed file still reads; the extension breaks ties.
//!
//! Every reader returns tensors by name in the file's order; a file holding one unnamed tensor
//! (`.npy`, `torch.save(tensor)`, a saved number) names it after the file's stem. No input makes a
//! reader panic or allocate far beyond the input's size (see `fuzz/`).

use crate::tensor::HostTensor;
use std::io::Read;
use std::path::Path;

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

/// What a file holds.
pub struct Contents {
    /// The tensors by name, in the file's order.
    pub tensors: Vec<(String, HostTensor)>,
    /// What was in the file but is not a tensor or a number (a `.pt` may hold anything).
    pub skipped: Vec<String>,
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

/// Read a tensor file.
pub fn read(path: &Path) -> Result<Contents, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    read_bytes(&bytes, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Read a tensor file's bytes; `path` gives the extension and the stem.
pub fn read_bytes(bytes: &[u8], path: &Path) -> Result<Contents, String> {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("tensor")
        .to_string();
    let one = |t| Contents {
        tensors: vec![(stem.clone(), t)],
        skipped: Vec::new(),
    };
    match sniff(bytes, path)? {
        Format::Npy => crate::npy::decode(bytes)
            .map(one)
            .map_err(|e| e.to_string()),
        Format::Npz => read_npz(bytes),
        Format::Safetensors => crate::safetensors::read(bytes).map(|tensors| Contents {
            tensors,
            skipped: Vec::new(),
        }),
        Format::Torch => crate::pickle::read(bytes, &stem).map(|c| Contents {
            tensors: c.tensors,
            skipped: c.skipped,
        }),
    }
}

fn read_npz(bytes: &[u8]) -> Result<Contents, String> {
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| format!("not a readable .npz (zip) archive: {e}"))?;
    let mut tensors = Vec::new();
    let mut skipped = Vec::new();
    for i in 0..zip.len() {
        let mut file = zip
            .by_index(i)
            .map_err(|e| format!("entry {i} of the archive: {e}"))?;
        let name = file
            .name()
            .map_err(|e| format!("entry {i} of the archive: {e}"))?
            .into_owned();
        let Some(stem) = name.strip_suffix(".npy") else {
            skipped.push(name);
            continue;
        };
        let mut data = Vec::new();
        // The declared size bounds what is read (a compressed entry cannot inflate past it).
        let limit = file
            .size()
            .min(crate::pickle::MAX_TENSOR_BYTES as u64 + 4096);
        (&mut file)
            .take(limit)
            .read_to_end(&mut data)
            .map_err(|e| format!("`{name}`: {e}"))?;
        let t = crate::npy::decode(&data).map_err(|e| format!("`{name}`: {e}"))?;
        tensors.push((stem.to_string(), t));
    }
    Ok(Contents { tensors, skipped })
}
