//! Reading tensor files for the `golden` command-line tool: `.npy`, `.npz`, `.safetensors` and
//! PyTorch's `.pt`/`.pth` (see `pickle.rs`: read without running pickled code). The format comes
//! from the file's first bytes, so a misnamed file still reads; the extension breaks ties.
//!
//! Every reader returns tensors by name in the file's order; a file holding one unnamed tensor
//! (`.npy`, `torch.save(tensor)`, a saved number) names it after the file's stem. No input makes a
//! reader panic or allocate far beyond the input's size (see `fuzz/`).

use crate::wire::{HostTensor, WireDType};
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
        Format::Safetensors => read_safetensors(bytes),
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

fn read_safetensors(bytes: &[u8]) -> Result<Contents, String> {
    use safetensors::Dtype;
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| format!("not a readable .safetensors file: {e}"))?;
    // In the file's order (by data offset), not the header's map order.
    let mut views = st.tensors();
    views.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
    let mut tensors = Vec::new();
    for (name, view) in views {
        let shape = view.shape().to_vec();
        let data = view.data();
        let wire = |dtype| HostTensor {
            dtype,
            shape: shape.clone(),
            data: bytes::Bytes::copy_from_slice(data),
        };
        // Integer widths the wire format lacks are widened to f64 (exact but for u64 > 2^53).
        let widened = |values: Vec<f64>| HostTensor::from_f64(shape.clone(), &values);
        let t = match view.dtype() {
            Dtype::F32 => wire(WireDType::F32),
            Dtype::F64 => wire(WireDType::F64),
            Dtype::F16 => wire(WireDType::F16),
            Dtype::BF16 => wire(WireDType::BF16),
            Dtype::I64 => wire(WireDType::I64),
            Dtype::I32 => wire(WireDType::I32),
            Dtype::I16 => wire(WireDType::I16),
            Dtype::U32 => wire(WireDType::U32),
            Dtype::U8 => wire(WireDType::U8),
            Dtype::BOOL => wire(WireDType::Bool),
            Dtype::I8 => widened(data.iter().map(|b| *b as i8 as f64).collect()),
            Dtype::U16 => widened(
                data.chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]) as f64)
                    .collect(),
            ),
            Dtype::U64 => widened(
                data.chunks_exact(8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap()) as f64)
                    .collect(),
            ),
            other => return Err(format!("`{name}`: dtype {other:?} is not one golden reads")),
        };
        tensors.push((name, t));
    }
    Ok(Contents {
        tensors,
        skipped: Vec::new(),
    })
}
