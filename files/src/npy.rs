//! NumPy's `.npy` format, for the files a failing check leaves behind and the tools that read them.
//!
//! Version 1.0: the magic `\x93NUMPY`, a header dict padded to a multiple of 64 bytes, then the raw
//! little-endian data in C order. NumPy has no bf16, so bf16 tensors are written as float32 copies
//! (exact: every bf16 is a float32). The reader takes versions 1 to 3 of the plain dtypes golden
//! writes, in C order and little-endian; anything else (object arrays above all: reading them
//! means unpickling) is an error, and no input makes it panic or allocate beyond the input's size.

use crate::tensor::{HostTensor, WireDType};
use std::fmt;
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

/// Why bytes are not an `.npy` file golden can read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyError(pub String);

impl fmt::Display for NpyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a readable .npy file: {}", self.0)
    }
}

impl std::error::Error for NpyError {}

fn npy_err<T>(msg: impl Into<String>) -> Result<T, NpyError> {
    Err(NpyError(msg.into()))
}

fn dtype_of(descr: &str) -> Result<WireDType, NpyError> {
    Ok(match descr {
        "<f4" => WireDType::F32,
        "<f8" => WireDType::F64,
        "<f2" => WireDType::F16,
        "<i8" => WireDType::I64,
        "<i4" => WireDType::I32,
        "<i2" => WireDType::I16,
        "<u4" => WireDType::U32,
        "|u1" | "<u1" => WireDType::U8,
        "|b1" => WireDType::Bool,
        d if d.contains('O') => {
            return npy_err("an object array (reading it would mean unpickling)")
        }
        d if d.starts_with('>') => return npy_err(format!("big-endian dtype `{d}`")),
        d => return npy_err(format!("dtype `{d}` is not one golden reads")),
    })
}

/// The value of `'key': ...` in a header dict, up to the next top-level comma or brace.
fn header_value<'a>(header: &'a str, key: &str) -> Result<&'a str, NpyError> {
    let pattern = format!("'{key}':");
    let start = header
        .find(&pattern)
        .ok_or_else(|| NpyError(format!("the header has no `{key}`")))?
        + pattern.len();
    let rest = header[start..].trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')').map(|i| i + 1)
    } else {
        rest.find([',', '}'])
    }
    .ok_or_else(|| NpyError(format!("the header's `{key}` is not closed")))?;
    Ok(rest[..end].trim())
}

/// Read the bytes of an `.npy` file.
pub fn decode(bytes: &[u8]) -> Result<HostTensor, NpyError> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return npy_err("no \\x93NUMPY magic");
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return npy_err(format!("format version {v}")),
    };
    let header = bytes
        .get(start..start.saturating_add(header_len))
        .ok_or_else(|| NpyError("the header runs past the end of the file".into()))?;
    let header =
        std::str::from_utf8(header).map_err(|_| NpyError("the header is not text".into()))?;
    let descr = header_value(header, "descr")?.trim_matches(|c| c == '\'' || c == '"');
    let dtype = dtype_of(descr)?;
    match header_value(header, "fortran_order")? {
        "False" => {}
        "True" => return npy_err("Fortran order (golden writes and reads C order)"),
        other => return npy_err(format!("fortran_order is `{other}`")),
    }
    let shape_text = header_value(header, "shape")?;
    let inner = shape_text
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| NpyError(format!("shape `{shape_text}` is not a tuple")))?;
    let shape: Vec<usize> = inner
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            d.parse::<usize>()
                .map_err(|_| NpyError(format!("shape `{shape_text}`: `{d}` is not a size")))
        })
        .collect::<Result<_, _>>()?;
    if shape.len() > crate::tensor::MAX_NDIM {
        return npy_err(format!("{} axes", shape.len()));
    }
    let data = &bytes[start + header_len..];
    // Checked: a header may claim any shape, but the data must be exactly that long.
    let nbytes = shape
        .iter()
        .try_fold(dtype.size(), |n, d| n.checked_mul(*d))
        .ok_or_else(|| NpyError(format!("shape `{shape_text}` overflows")))?;
    if nbytes != data.len() {
        return npy_err(format!(
            "shape `{shape_text}` of {descr} needs {nbytes} bytes of data, the file has {}",
            data.len()
        ));
    }
    Ok(HostTensor {
        dtype,
        shape,
        data: bytes::Bytes::copy_from_slice(data),
    })
}

/// Read an `.npy` file.
pub fn read(path: &Path) -> Result<HostTensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Write `t` to `path` as `.npy`.
pub fn write(path: &Path, t: &HostTensor) -> std::io::Result<()> {
    std::fs::File::create(path)?.write_all(&encode(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float_tensor(shape: Vec<usize>, values: &[f64], dtype: WireDType) -> HostTensor {
        HostTensor::from_floats(shape, values, dtype)
    }

    #[test]
    fn round_trips_every_dtype_and_rank() {
        for dtype in [
            WireDType::F32,
            WireDType::F64,
            WireDType::F16,
            WireDType::U8,
            WireDType::U32,
            WireDType::I64,
            WireDType::I32,
            WireDType::I16,
            WireDType::Bool,
        ] {
            for shape in [vec![], vec![0], vec![5], vec![2, 3, 4]] {
                let n: usize = shape.iter().product();
                let data: Vec<u8> = (0..n * dtype.size()).map(|i| (i % 2) as u8).collect();
                let t = HostTensor {
                    dtype,
                    shape: shape.clone(),
                    data: data.into(),
                };
                let back = decode(&encode(&t)).unwrap();
                assert_eq!(
                    (back.dtype, &back.shape, &back.data),
                    (t.dtype, &t.shape, &t.data)
                );
            }
        }
    }

    #[test]
    fn refuses_what_it_cannot_read_without_panicking() {
        let good = encode(&float_tensor(vec![2, 2], &[1.0; 4], WireDType::F32));
        let header_len = u16::from_le_bytes([good[8], good[9]]) as usize;
        let with_header = |h: &str| {
            let mut b = good[..10].to_vec();
            b.extend_from_slice(h.as_bytes());
            b.extend_from_slice(&good[10 + header_len..]);
            b[8..10].copy_from_slice(&(h.len() as u16).to_le_bytes());
            b
        };
        let cases = [
            ("{'descr': '|O', 'fortran_order': False, 'shape': (2, 2), }", "unpickling"),
            ("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }", "big-endian"),
            ("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", "Fortran"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", "needs 24 bytes"),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 9999999999), }",
                "overflows",
            ),
            ("{'descr': '<f4', 'fortran_order': False}", "no `shape`"),
        ];
        for (header, why) in cases {
            let e = decode(&with_header(header)).unwrap_err().to_string();
            assert!(e.contains(why), "{header}: {e}");
        }
        for end in 0..good.len() {
            assert!(decode(&good[..end]).is_err(), "truncated at {end}");
        }
    }

    #[test]
    fn headers_are_padded_to_64_bytes() {
        for shape in [vec![], vec![3], vec![2, 3, 4]] {
            let n: usize = shape.iter().product();
            let t = float_tensor(shape.clone(), &vec![1.5; n], WireDType::BF16);
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
