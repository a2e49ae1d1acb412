//! Hugging Face `.safetensors` files: a JSON header of names, dtypes, shapes and offsets, then the
//! raw data. Read with the `safetensors` crate, which checks every offset against the file; each
//! tensor is a slice of the file's bytes (int8, uint16 and uint64, which the wire format lacks, are
//! widened to int16, int32 and float64).

use crate::budget::{Budget, ReadError};
use crate::tensor::{Entry, HostTensor, Narrow, WireDType};
use bytes::Bytes;
use std::ops::Range;

/// Where a tensor's data is in the file, and the width it is widened from (if it is).
pub(crate) type Span = (Range<usize>, Option<Narrow>);

/// The entries of a `.safetensors` file and where each one's data is (and whether it is widened),
/// in the file's order. The `safetensors` crate checks every offset against the file.
pub(crate) fn index(bytes: &Bytes) -> Result<(Vec<Entry>, Vec<Span>), ReadError> {
    use safetensors::Dtype;
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| ReadError::Unreadable(format!("not a readable .safetensors file: {e}")))?;
    let base = bytes.as_ptr() as usize;
    let mut views = st.tensors();
    // In the file's order (by data offset), not the header's map order.
    views.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
    let (mut entries, mut spans) = (Vec::new(), Vec::new());
    for (name, view) in views {
        let (dtype, narrow) = match view.dtype() {
            Dtype::F32 => (WireDType::F32, None),
            Dtype::F64 => (WireDType::F64, None),
            Dtype::F16 => (WireDType::F16, None),
            Dtype::BF16 => (WireDType::BF16, None),
            Dtype::I64 => (WireDType::I64, None),
            Dtype::I32 => (WireDType::I32, None),
            Dtype::I16 => (WireDType::I16, None),
            Dtype::U32 => (WireDType::U32, None),
            Dtype::U8 => (WireDType::U8, None),
            Dtype::BOOL => (WireDType::Bool, None),
            Dtype::I8 => (Narrow::I8.wide(), Some(Narrow::I8)),
            Dtype::U16 => (Narrow::U16.wide(), Some(Narrow::U16)),
            Dtype::U64 => (Narrow::U64.wide(), Some(Narrow::U64)),
            other => {
                return Err(ReadError::Unreadable(format!(
                    "`{name}`: dtype {other:?} is not one golden reads"
                )))
            }
        };
        let start = view.data().as_ptr() as usize - base;
        spans.push((start..start + view.data().len(), narrow));
        entries.push(Entry {
            name,
            dtype,
            shape: view.shape().to_vec(),
        });
    }
    Ok((entries, spans))
}

/// The tensor whose data is `range` of `bytes`, widened if it is `narrow` (charged to `budget`).
pub(crate) fn load(
    bytes: &Bytes,
    (range, narrow): &Span,
    dtype: WireDType,
    shape: &[usize],
    what: &str,
    budget: &mut Budget,
) -> Result<HostTensor, ReadError> {
    let data = bytes.slice(range.clone());
    let Some(narrow) = narrow else {
        return Ok(HostTensor {
            dtype,
            shape: shape.to_vec(),
            data,
        });
    };
    budget.charge_elements(
        &format!("{what} ({narrow:?} widened to {})", narrow.wide()),
        data.len() / narrow.size(),
        narrow.wide().size(),
    )?;
    Ok(HostTensor {
        dtype: narrow.wide(),
        shape: shape.to_vec(),
        data: narrow.widen(&data).into(),
    })
}

/// The tensors of a `.safetensors` file, in the file's order (with the file's default read
/// budget, which only widened integers use).
pub fn read(bytes: &[u8]) -> Result<Vec<(String, HostTensor)>, String> {
    read_shared(Bytes::copy_from_slice(bytes))
}

/// [`read`] over bytes already shared (a memory-mapped checkpoint): each tensor is a slice of
/// `bytes`, no data is copied (but integers the wire format lacks, widened).
pub fn read_shared(bytes: Bytes) -> Result<Vec<(String, HostTensor)>, String> {
    let mut budget = Budget::for_file(bytes.len() as u64);
    let (entries, spans) = index(&bytes).map_err(|e| e.to_string())?;
    entries
        .iter()
        .zip(&spans)
        .map(|(e, span)| {
            let what = format!("`{}`", e.name);
            load(&bytes, span, e.dtype, &e.shape, &what, &mut budget)
                .map(|t| (e.name.clone(), t))
                .map_err(|err| err.to_string())
        })
        .collect()
}
