//! NumPy's `.npy` format, for the files a failing check leaves behind.
//!
//! Version 1.0: the magic `\x93NUMPY`, a header dict padded to a multiple of 64 bytes, then the raw
//! little-endian data in C order. NumPy has no bf16, so bf16 tensors are written as float32 copies
//! (exact: every bf16 is a float32).

use crate::wire::{HostTensor, WireDType};
use std::io::Write;
use std::path::Path;

fn descr(dtype: WireDType) -> &'static str {
    match dtype {
        WireDType::F32 | WireDType::BF16 => "<f4",
        WireDType::F64 => "<f8",
        WireDType::F16 => "<f2",
        WireDType::I64 => "<i8",
        WireDType::I32 => "<i4",
        WireDType::I16 => "<i2",
        WireDType::U32 => "<u4",
        WireDType::U8 => "|u1",
        WireDType::Bool => "|b1",
    }
}

/// The bytes of an `.npy` file holding `t`.
pub fn encode(t: &HostTensor) -> Vec<u8> {
    let shape = match t.shape.len() {
        0 => "()".to_string(),
        1 => format!("({},)", t.shape[0]),
        _ => format!(
            "({})",
            t.shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        descr(t.dtype)
    );
    // magic (6) + version (2) + header length (2) + header + '\n', a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + t.data.len() * 2);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    if t.dtype == WireDType::BF16 {
        for v in t.to_f64() {
            out.extend_from_slice(&(v as f32).to_le_bytes());
        }
    } else {
        out.extend_from_slice(&t.data);
    }
    out
}

/// Write `t` to `path` as `.npy`.
pub fn write(path: &Path, t: &HostTensor) -> std::io::Result<()> {
    std::fs::File::create(path)?.write_all(&encode(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::float_tensor;
    use candle_core::DType;

    #[test]
    fn headers_are_padded_to_64_bytes() {
        for shape in [vec![], vec![3], vec![2, 3, 4]] {
            let n: usize = shape.iter().product();
            let t = float_tensor(shape.clone(), &vec![1.5; n], DType::BF16);
            let bytes = encode(&t);
            let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
            assert_eq!((10 + header_len) % 64, 0);
            assert_eq!(bytes.len(), 10 + header_len + 4 * n, "bf16 written as f32");
            let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
            assert!(
                header.starts_with("{'descr': '<f4'") && header.ends_with('\n'),
                "{header}"
            );
        }
    }
}
