//! Hugging Face `.safetensors` files: a JSON header of names, dtypes, shapes and offsets, then the
//! raw data. Read with the `safetensors` crate, which checks every offset against the file.

use crate::tensor::{HostTensor, WireDType};

/// The tensors of a `.safetensors` file, in the file's order.
pub fn read(bytes: &[u8]) -> Result<Vec<(String, HostTensor)>, String> {
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
    Ok(tensors)
}
