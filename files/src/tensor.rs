//! The tensors golden carries: an element type ([`WireDType`]) and a host tensor ([`HostTensor`]):
//! dtype, shape and little-endian bytes. The same type travels to the Python worker, is kept in
//! golden stores and is read from and written to tensor files.

use bytes::Bytes;
use std::fmt;

/// Most axes a tensor may have (on the wire, in a store, in a file golden reads).
pub const MAX_NDIM: usize = 16;

/// Element types that travel on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireDType {
    /// float32
    F32,
    /// float64
    F64,
    /// float16
    F16,
    /// bfloat16 (its raw 16 bits)
    BF16,
    /// int64
    I64,
    /// uint32
    U32,
    /// uint8
    U8,
    /// bool, one byte per element (a u8 tensor in candle)
    Bool,
    /// int32
    I32,
    /// int16
    I16,
}

impl WireDType {
    const ALL: [WireDType; 10] = [
        WireDType::F32,
        WireDType::F64,
        WireDType::F16,
        WireDType::BF16,
        WireDType::I64,
        WireDType::U32,
        WireDType::U8,
        WireDType::Bool,
        WireDType::I32,
        WireDType::I16,
    ];

    /// The byte that identifies the dtype in a frame.
    pub fn code(self) -> u8 {
        Self::ALL.iter().position(|d| *d == self).unwrap() as u8 + 1
    }

    /// The dtype a code stands for.
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(usize::from(code).checked_sub(1)?).copied()
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            WireDType::F64 | WireDType::I64 => 8,
            WireDType::F32 | WireDType::U32 | WireDType::I32 => 4,
            WireDType::F16 | WireDType::BF16 | WireDType::I16 => 2,
            WireDType::U8 | WireDType::Bool => 1,
        }
    }

    /// The short name used in JSON headers and reports (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            WireDType::F32 => "f32",
            WireDType::F64 => "f64",
            WireDType::F16 => "f16",
            WireDType::BF16 => "bf16",
            WireDType::I64 => "i64",
            WireDType::U32 => "u32",
            WireDType::U8 => "u8",
            WireDType::Bool => "bool",
            WireDType::I32 => "i32",
            WireDType::I16 => "i16",
        }
    }

    /// Whether the values are floating point.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            WireDType::F32 | WireDType::F64 | WireDType::F16 | WireDType::BF16
        )
    }

    /// The candle dtype holding these values (bool becomes u8: candle has no bool).
    #[cfg(feature = "candle")]
    pub fn to_candle(self) -> candle_core::DType {
        match self {
            WireDType::F32 => candle_core::DType::F32,
            WireDType::F64 => candle_core::DType::F64,
            WireDType::F16 => candle_core::DType::F16,
            WireDType::BF16 => candle_core::DType::BF16,
            WireDType::I64 => candle_core::DType::I64,
            WireDType::U32 => candle_core::DType::U32,
            WireDType::U8 | WireDType::Bool => candle_core::DType::U8,
            WireDType::I32 => candle_core::DType::I32,
            WireDType::I16 => candle_core::DType::I16,
        }
    }

    /// The wire dtype of a candle dtype, if golden can carry it.
    #[cfg(feature = "candle")]
    pub fn from_candle(dtype: candle_core::DType) -> Option<Self> {
        Some(match dtype {
            candle_core::DType::F32 => WireDType::F32,
            candle_core::DType::F64 => WireDType::F64,
            candle_core::DType::F16 => WireDType::F16,
            candle_core::DType::BF16 => WireDType::BF16,
            candle_core::DType::I64 => WireDType::I64,
            candle_core::DType::U32 => WireDType::U32,
            candle_core::DType::U8 => WireDType::U8,
            candle_core::DType::I32 => WireDType::I32,
            candle_core::DType::I16 => WireDType::I16,
            _ => return None,
        })
    }
}

impl fmt::Display for WireDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A tensor in host memory, as it travels: dtype, shape and little-endian bytes.
#[derive(Clone, PartialEq)]
pub struct HostTensor {
    /// Element type.
    pub dtype: WireDType,
    /// Shape.
    pub shape: Vec<usize>,
    /// `numel × dtype.size()` little-endian bytes. Shared, so cloning a tensor (into a request, a
    /// store, an artifact) and decoding a frame copy no data.
    pub data: Bytes,
}

impl fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostTensor({}, {:?})", self.dtype, self.shape)
    }
}

impl HostTensor {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Copy a candle tensor (any device) to the host.
    #[cfg(feature = "candle")]
    pub fn from_candle(t: &candle_core::Tensor) -> candle_core::Result<Self> {
        let dtype = WireDType::from_candle(t.dtype()).ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "golden cannot carry tensors of dtype {:?}",
                t.dtype()
            ))
        })?;
        let flat = t.flatten_all()?.to_device(&candle_core::Device::Cpu)?;
        let data = match t.dtype() {
            candle_core::DType::F32 => bytes_of(&flat.to_vec1::<f32>()?),
            candle_core::DType::F64 => bytes_of(&flat.to_vec1::<f64>()?),
            candle_core::DType::F16 => bytes_of(&flat.to_vec1::<half::f16>()?),
            candle_core::DType::BF16 => bytes_of(&flat.to_vec1::<half::bf16>()?),
            candle_core::DType::I64 => bytes_of(&flat.to_vec1::<i64>()?),
            candle_core::DType::U32 => bytes_of(&flat.to_vec1::<u32>()?),
            candle_core::DType::U8 => flat.to_vec1::<u8>()?.into(),
            candle_core::DType::I32 => bytes_of(&flat.to_vec1::<i32>()?),
            candle_core::DType::I16 => bytes_of(&flat.to_vec1::<i16>()?),
            _ => unreachable!("checked by from_candle"),
        };
        Ok(HostTensor {
            dtype,
            shape: t.dims().to_vec(),
            data,
        })
    }

    /// Make a candle tensor on `device`.
    #[cfg(feature = "candle")]
    pub fn to_candle(
        &self,
        device: &candle_core::Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        candle_core::Tensor::from_raw_buffer(
            &self.data,
            self.dtype.to_candle(),
            &self.shape,
            device,
        )
    }

    /// The values as f64 (exact for every dtype but i64 beyond 2^53).
    pub fn to_f64(&self) -> Vec<f64> {
        let d = &self.data;
        match self.dtype {
            WireDType::F32 => chunks::<4>(d)
                .map(|b| f32::from_le_bytes(b) as f64)
                .collect(),
            WireDType::F64 => chunks::<8>(d).map(f64::from_le_bytes).collect(),
            WireDType::F16 => chunks::<2>(d)
                .map(|b| half::f16::from_le_bytes(b).to_f64())
                .collect(),
            WireDType::BF16 => chunks::<2>(d)
                .map(|b| half::bf16::from_le_bytes(b).to_f64())
                .collect(),
            WireDType::I64 => chunks::<8>(d)
                .map(|b| i64::from_le_bytes(b) as f64)
                .collect(),
            WireDType::U32 => chunks::<4>(d)
                .map(|b| u32::from_le_bytes(b) as f64)
                .collect(),
            WireDType::I32 => chunks::<4>(d)
                .map(|b| i32::from_le_bytes(b) as f64)
                .collect(),
            WireDType::I16 => chunks::<2>(d)
                .map(|b| i16::from_le_bytes(b) as f64)
                .collect(),
            WireDType::U8 | WireDType::Bool => d.iter().map(|&b| b as f64).collect(),
        }
    }

    /// Values `start..start + out.len()` as f64, into `out` (no allocation: for scans of large
    /// tensors in chunks).
    pub fn read_f64_into(&self, start: usize, out: &mut [f64]) {
        let size = self.dtype.size();
        let bytes = &self.data[start * size..(start + out.len()) * size];
        macro_rules! fill {
            ($n:literal, $conv:expr) => {
                for (o, b) in out.iter_mut().zip(chunks::<$n>(bytes)) {
                    *o = $conv(b);
                }
            };
        }
        match self.dtype {
            WireDType::F32 => fill!(4, |b| f32::from_le_bytes(b) as f64),
            WireDType::F64 => fill!(8, f64::from_le_bytes),
            WireDType::F16 => fill!(2, |b| half::f16::from_le_bytes(b).to_f64()),
            WireDType::BF16 => fill!(2, |b| half::bf16::from_le_bytes(b).to_f64()),
            WireDType::I64 => fill!(8, |b| i64::from_le_bytes(b) as f64),
            WireDType::U32 => fill!(4, |b| u32::from_le_bytes(b) as f64),
            WireDType::I32 => fill!(4, |b| i32::from_le_bytes(b) as f64),
            WireDType::I16 => fill!(2, |b| i16::from_le_bytes(b) as f64),
            WireDType::U8 | WireDType::Bool => fill!(1, |b: [u8; 1]| b[0] as f64),
        }
    }

    /// Element `i` (flat, C order) as f64.
    pub fn f64_at(&self, i: usize) -> f64 {
        let mut one = [0.0];
        self.read_f64_into(i, &mut one);
        one[0]
    }

    /// The values as i64 (integer and bool dtypes; floats are truncated).
    pub fn to_i64(&self) -> Vec<i64> {
        let d = &self.data;
        match self.dtype {
            WireDType::I64 => chunks::<8>(d).map(i64::from_le_bytes).collect(),
            WireDType::U32 => chunks::<4>(d)
                .map(|b| u32::from_le_bytes(b) as i64)
                .collect(),
            WireDType::I32 => chunks::<4>(d)
                .map(|b| i32::from_le_bytes(b) as i64)
                .collect(),
            WireDType::I16 => chunks::<2>(d)
                .map(|b| i16::from_le_bytes(b) as i64)
                .collect(),
            WireDType::U8 | WireDType::Bool => d.iter().map(|&b| b as i64).collect(),
            _ => self.to_f64().into_iter().map(|x| x as i64).collect(),
        }
    }

    /// A float tensor of `dtype` from values (rounded to nearest; panics on a non-float dtype).
    pub fn from_floats(shape: Vec<usize>, values: &[f64], dtype: WireDType) -> Self {
        let data: Vec<u8> = match dtype {
            WireDType::F64 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            WireDType::F32 => values
                .iter()
                .flat_map(|v| (*v as f32).to_le_bytes())
                .collect(),
            WireDType::F16 => values
                .iter()
                .flat_map(|v| half::f16::from_f64(*v).to_le_bytes())
                .collect(),
            WireDType::BF16 => values
                .iter()
                .flat_map(|v| half::bf16::from_f64(*v).to_le_bytes())
                .collect(),
            other => panic!("{other} is not a float dtype"),
        };
        HostTensor {
            dtype,
            shape,
            data: data.into(),
        }
    }

    /// A float64 tensor from values.
    pub fn from_f64(shape: Vec<usize>, values: &[f64]) -> Self {
        HostTensor {
            dtype: WireDType::F64,
            shape,
            data: bytes_of(values),
        }
    }

    /// The elements `start..start + len` along `axis` (same rank), or `None` when that range or
    /// axis is not in the tensor.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Option<HostTensor> {
        let size = *self.shape.get(axis)?;
        if start.checked_add(len)? > size {
            return None;
        }
        let elem = self.dtype.size();
        let inner: usize = self.shape[axis + 1..].iter().product::<usize>() * elem;
        let outer: usize = self.shape[..axis].iter().product();
        let mut data = Vec::with_capacity(outer * len * inner);
        for o in 0..outer {
            let base = (o * size + start) * inner;
            data.extend_from_slice(&self.data[base..base + len * inner]);
        }
        let mut shape = self.shape.clone();
        shape[axis] = len;
        Some(HostTensor {
            dtype: self.dtype,
            shape,
            data: data.into(),
        })
    }
}

/// A tensor of a file, before its data is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its name in the file.
    pub name: String,
    /// The dtype it reads as (narrow integers widened).
    pub dtype: WireDType,
    /// Its shape.
    pub shape: Vec<usize>,
}

impl Entry {
    /// Number of elements (saturating).
    pub fn numel(&self) -> usize {
        self.shape
            .iter()
            .try_fold(1usize, |n, d| n.checked_mul(*d))
            .unwrap_or(usize::MAX)
    }
}

/// Something a file holds that is not a tensor or a number, and is skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Its name in the file.
    pub name: String,
    /// What it is (`a string`, `a dict of 3 strings`, `not a .npy array`).
    pub what: String,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` ({})", self.name, self.what)
    }
}

/// A strided view of elements: where the first one is and how far each axis steps, in elements
/// (as a `.pt` tensor over its storage, or a Fortran-order `.npy` over its data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Strided<'a> {
    /// Element offset of index `[0, 0, ...]`.
    pub offset: usize,
    /// Sizes.
    pub shape: &'a [usize],
    /// Steps, one per axis.
    pub strides: &'a [usize],
}

// Views over storages are a `.pt` matter: without the `formats` feature only Fortran-order `.npy`
// files gather.
#[cfg_attr(not(feature = "formats"), allow(dead_code))]
impl Strided<'_> {
    /// Number of elements, unless it overflows.
    pub fn numel(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |n, d| n.checked_mul(*d))
    }

    /// One past the furthest element the view reaches (its offset for an empty view), unless that
    /// overflows.
    pub fn end(&self) -> Option<usize> {
        if self.shape.contains(&0) {
            return Some(self.offset);
        }
        self.shape
            .iter()
            .zip(self.strides)
            .try_fold(self.offset, |acc, (d, s)| {
                acc.checked_add((d - 1).checked_mul(*s)?)
            })?
            .checked_add(1)
    }

    /// Whether the view is the elements `offset..offset + numel` in C order (axes of size 1 may
    /// have any stride).
    pub fn is_c_contiguous(&self) -> bool {
        if self.shape.contains(&0) {
            return true;
        }
        let mut expected = 1usize;
        for (d, s) in self.shape.iter().zip(self.strides).rev() {
            if *d != 1 && *s != expected {
                return false;
            }
            expected = expected.saturating_mul(*d);
        }
        true
    }

    /// The view's elements in C order, copied out of `src` (elements of `elem` bytes). The caller
    /// has checked that [`Strided::end`] lies inside `src` and has budgeted the copy.
    pub fn gather(&self, src: &[u8], elem: usize) -> Vec<u8> {
        let numel = self.numel().unwrap_or(0);
        let mut out = Vec::with_capacity(numel * elem);
        if numel == 0 {
            return out;
        }
        let Some((&inner, outer)) = self.shape.split_last() else {
            // A 0-d view: one element.
            out.extend_from_slice(&src[self.offset * elem..(self.offset + 1) * elem]);
            return out;
        };
        let inner_stride = self.strides[outer.len()];
        let mut index = vec![0usize; outer.len()];
        loop {
            let start = self.offset
                + index
                    .iter()
                    .zip(self.strides)
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            if inner_stride == 1 {
                out.extend_from_slice(&src[start * elem..(start + inner) * elem]);
            } else {
                for k in 0..inner {
                    let at = start + k * inner_stride;
                    out.extend_from_slice(&src[at * elem..(at + 1) * elem]);
                }
            }
            // The next index of the outer axes, last axis fastest.
            let mut axis = outer.len();
            loop {
                if axis == 0 {
                    return out;
                }
                axis -= 1;
                index[axis] += 1;
                if index[axis] < outer[axis] {
                    break;
                }
                index[axis] = 0;
            }
        }
    }
}

/// Elements of `elem` bytes with their bytes reversed (big-endian data to the wire's order).
pub(crate) fn swap_bytes(data: &[u8], elem: usize) -> Vec<u8> {
    let mut out = data.to_vec();
    for chunk in out.chunks_exact_mut(elem) {
        chunk.reverse();
    }
    out
}

/// Integer and float widths the wire format lacks, and the wire dtype each is widened to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Narrow {
    /// int8, widened to int16 (exact).
    I8,
    /// uint16, widened to int32 (exact).
    U16,
    /// uint64, widened to float64 (exact up to 2^53).
    U64,
}

impl Narrow {
    /// The wire dtype the values are widened to.
    pub fn wide(self) -> WireDType {
        match self {
            Narrow::I8 => WireDType::I16,
            Narrow::U16 => WireDType::I32,
            Narrow::U64 => WireDType::F64,
        }
    }

    /// Bytes per element before widening.
    pub fn size(self) -> usize {
        match self {
            Narrow::I8 => 1,
            Narrow::U16 => 2,
            Narrow::U64 => 8,
        }
    }

    /// Little-endian values of this width, widened into the wire dtype's bytes.
    pub fn widen(self, data: &[u8]) -> Vec<u8> {
        match self {
            Narrow::I8 => data
                .iter()
                .flat_map(|b| (*b as i8 as i16).to_le_bytes())
                .collect(),
            Narrow::U16 => chunks::<2>(data)
                .flat_map(|b| (u16::from_le_bytes(b) as i32).to_le_bytes())
                .collect(),
            Narrow::U64 => chunks::<8>(data)
                .flat_map(|b| (u64::from_le_bytes(b) as f64).to_le_bytes())
                .collect(),
        }
    }
}

pub(crate) fn bytes_of<T: bytemuck::Pod>(values: &[T]) -> Bytes {
    // Every supported target of candle is little-endian, which is the wire's byte order.
    Bytes::copy_from_slice(bytemuck::cast_slice(values))
}

pub(crate) fn chunks<const N: usize>(data: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    data.chunks_exact(N).map(|c| c.try_into().unwrap())
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    #[test]
    fn a_strided_view_gathers_in_c_order() {
        // A 2×3 matrix stored in Fortran order: element [i, j] at i + 2j.
        let src: Vec<u8> = vec![0, 3, 1, 4, 2, 5];
        let fortran = Strided {
            offset: 0,
            shape: &[2, 3],
            strides: &[1, 2],
        };
        assert!(!fortran.is_c_contiguous());
        assert_eq!(fortran.end(), Some(6));
        assert_eq!(fortran.gather(&src, 1), [0, 1, 2, 3, 4, 5]);
        // Stride 0 repeats, an offset shifts, a 0-d view is one element.
        let repeat = Strided {
            offset: 1,
            shape: &[2, 2],
            strides: &[0, 1],
        };
        assert_eq!(repeat.gather(&src, 1), [3, 1, 3, 1]);
        let scalar = Strided {
            offset: 4,
            shape: &[],
            strides: &[],
        };
        assert!(scalar.is_c_contiguous());
        assert_eq!((scalar.end(), scalar.gather(&src, 1)), (Some(5), vec![2]));
        let empty = Strided {
            offset: 9,
            shape: &[3, 0],
            strides: &[7, 7],
        };
        assert_eq!((empty.end(), empty.gather(&src, 1)), (Some(9), vec![]));
        let contiguous = Strided {
            offset: 2,
            shape: &[1, 2, 2],
            strides: &[99, 2, 1],
        };
        assert!(contiguous.is_c_contiguous());
        let huge = Strided {
            offset: 0,
            shape: &[usize::MAX, 2],
            strides: &[usize::MAX, 1],
        };
        assert_eq!((huge.numel(), huge.end()), (None, None));
    }

    #[test]
    fn narrow_integers_widen_exactly() {
        assert_eq!(Narrow::I8.widen(&[0xff, 5]), [0xff, 0xff, 5, 0]);
        assert_eq!(
            Narrow::U16.widen(&0xfffeu16.to_le_bytes()),
            0xfffei32.to_le_bytes()
        );
        assert_eq!(
            Narrow::U64.widen(&(1u64 << 40).to_le_bytes()),
            ((1u64 << 40) as f64).to_le_bytes()
        );
        assert_eq!(swap_bytes(&[1, 2, 3, 4, 5, 6], 2), [2, 1, 4, 3, 6, 5]);
    }
}

#[cfg(all(test, feature = "candle"))]
mod tests {
    use super::*;

    #[test]
    fn candle_round_trip_keeps_dtype_and_values() {
        let t = candle_core::Tensor::new(&[[1.5f32, -2.0], [0.25, 8.0]], &candle_core::Device::Cpu)
            .unwrap()
            .to_dtype(candle_core::DType::BF16)
            .unwrap();
        let host = HostTensor::from_candle(&t).unwrap();
        assert_eq!(host.dtype, WireDType::BF16);
        assert_eq!(host.to_f64(), vec![1.5, -2.0, 0.25, 8.0]);
        let back = host.to_candle(&candle_core::Device::Cpu).unwrap();
        assert_eq!(back.dtype(), candle_core::DType::BF16);
        assert_eq!(back.dims(), &[2, 2]);
    }
}
