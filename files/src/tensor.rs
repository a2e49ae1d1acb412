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
}

pub(crate) fn bytes_of<T: bytemuck::Pod>(values: &[T]) -> Bytes {
    // Every supported target of candle is little-endian, which is the wire's byte order.
    Bytes::copy_from_slice(bytemuck::cast_slice(values))
}

pub(crate) fn chunks<const N: usize>(data: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    data.chunks_exact(N).map(|c| c.try_into().unwrap())
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
