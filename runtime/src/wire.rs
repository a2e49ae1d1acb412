//! The framed binary protocol between the runtime and the Python worker.
//!
//! ```text
//! u32 LE   length of the rest of the frame
//! 4 bytes  magic "GLD1"
//! u64 LE   request id (a response carries its request's id)
//! u32 LE   JSON header length H, then H bytes of UTF-8 JSON
//! u32 LE   tensor count N, then N times:
//!            u8 dtype code, u8 ndim, ndim × u64 LE dims, u64 LE byte count, raw LE bytes
//! ```
//!
//! The header refers to the i-th tensor as `{"$t": i}`. `reference_py/golden_ref/wire.py` is the
//! other half of this file. Decoding never trusts a length: every count is checked against the
//! bytes actually present before anything is allocated.

use bytes::Bytes;
use candle_core::{DType, Device, Tensor};
use serde_json::Value as Json;
use std::fmt;
use std::io::{self, Read, Write};

/// First bytes of every frame body.
pub const MAGIC: &[u8; 4] = b"GLD1";
/// Largest frame accepted (2 GiB): a corrupt length must not allocate without bound.
pub const MAX_FRAME: usize = 1 << 31;
/// Most axes a tensor may have on the wire.
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
    pub fn to_candle(self) -> DType {
        match self {
            WireDType::F32 => DType::F32,
            WireDType::F64 => DType::F64,
            WireDType::F16 => DType::F16,
            WireDType::BF16 => DType::BF16,
            WireDType::I64 => DType::I64,
            WireDType::U32 => DType::U32,
            WireDType::U8 | WireDType::Bool => DType::U8,
            WireDType::I32 => DType::I32,
            WireDType::I16 => DType::I16,
        }
    }

    /// The wire dtype of a candle dtype, if golden can carry it.
    pub fn from_candle(dtype: DType) -> Option<Self> {
        Some(match dtype {
            DType::F32 => WireDType::F32,
            DType::F64 => WireDType::F64,
            DType::F16 => WireDType::F16,
            DType::BF16 => WireDType::BF16,
            DType::I64 => WireDType::I64,
            DType::U32 => WireDType::U32,
            DType::U8 => WireDType::U8,
            DType::I32 => WireDType::I32,
            DType::I16 => WireDType::I16,
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
    pub fn from_candle(t: &Tensor) -> candle_core::Result<Self> {
        let dtype = WireDType::from_candle(t.dtype()).ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "golden cannot carry tensors of dtype {:?}",
                t.dtype()
            ))
        })?;
        let flat = t.flatten_all()?.to_device(&Device::Cpu)?;
        let data = match t.dtype() {
            DType::F32 => bytes_of(&flat.to_vec1::<f32>()?),
            DType::F64 => bytes_of(&flat.to_vec1::<f64>()?),
            DType::F16 => bytes_of(&flat.to_vec1::<half::f16>()?),
            DType::BF16 => bytes_of(&flat.to_vec1::<half::bf16>()?),
            DType::I64 => bytes_of(&flat.to_vec1::<i64>()?),
            DType::U32 => bytes_of(&flat.to_vec1::<u32>()?),
            DType::U8 => flat.to_vec1::<u8>()?.into(),
            DType::I32 => bytes_of(&flat.to_vec1::<i32>()?),
            DType::I16 => bytes_of(&flat.to_vec1::<i16>()?),
            _ => unreachable!("checked by from_candle"),
        };
        Ok(HostTensor {
            dtype,
            shape: t.dims().to_vec(),
            data,
        })
    }

    /// Make a candle tensor on `device`.
    pub fn to_candle(&self, device: &Device) -> candle_core::Result<Tensor> {
        Tensor::from_raw_buffer(&self.data, self.dtype.to_candle(), &self.shape, device)
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

    /// A float64 tensor from values.
    pub fn from_f64(shape: Vec<usize>, values: &[f64]) -> Self {
        HostTensor {
            dtype: WireDType::F64,
            shape,
            data: bytes_of(values),
        }
    }
}

fn bytes_of<T: bytemuck::Pod>(values: &[T]) -> Bytes {
    // Every supported target of candle is little-endian, which is the wire's byte order.
    Bytes::copy_from_slice(bytemuck::cast_slice(values))
}

fn chunks<const N: usize>(data: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    data.chunks_exact(N).map(|c| c.try_into().unwrap())
}

/// One message: request id, JSON header, tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// Request id; a response carries the id of its request.
    pub id: u64,
    /// The JSON header; tensors appear in it as `{"$t": index}`.
    pub header: Json,
    /// The tensors the header refers to.
    pub tensors: Vec<HostTensor>,
}

/// Why bytes are not a valid frame.
#[derive(Debug)]
pub enum WireError {
    /// Reading or writing the pipe failed.
    Io(io::Error),
    /// The stream ended (cleanly, before a frame).
    Eof,
    /// The bytes are not a well-formed frame.
    Malformed(String),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Io(e) => write!(f, "pipe error: {e}"),
            WireError::Eof => f.write_str("the stream ended"),
            WireError::Malformed(m) => write!(f, "malformed frame: {m}"),
        }
    }
}

impl std::error::Error for WireError {}

fn malformed(msg: impl Into<String>) -> WireError {
    WireError::Malformed(msg.into())
}

/// Encode a frame, length prefix included.
pub fn encode(frame: &Frame) -> Vec<u8> {
    let header = serde_json::to_vec(&frame.header).expect("a JSON value always serialises");
    let tensor_bytes: usize = frame
        .tensors
        .iter()
        .map(|t| 2 + 8 * t.shape.len() + 8 + t.data.len())
        .sum();
    let body_len = 4 + 8 + 4 + header.len() + 4 + tensor_bytes;
    let mut out = Vec::with_capacity(4 + body_len);
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&frame.id.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&(frame.tensors.len() as u32).to_le_bytes());
    for t in &frame.tensors {
        out.push(t.dtype.code());
        out.push(t.shape.len() as u8);
        for &d in &t.shape {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        out.extend_from_slice(&(t.data.len() as u64).to_le_bytes());
        out.extend_from_slice(&t.data);
    }
    out
}

struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.data.len())
            .ok_or_else(|| {
                malformed(format!(
                    "truncated: {n} bytes needed at offset {} of {}",
                    self.pos,
                    self.data.len()
                ))
            })?;
        let out = &self.data[self.pos..end];
        self.pos = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
}

/// Decode a frame body (the bytes after the length prefix). Tensor data are slices of `body`.
pub fn decode_body(body: Bytes) -> Result<Frame, WireError> {
    let mut c = Cursor {
        data: &body,
        pos: 0,
    };
    if c.take(4)? != MAGIC {
        return Err(malformed("bad magic: not a golden frame"));
    }
    let id = c.u64()?;
    let header_len = c.u32()? as usize;
    let header: Json = serde_json::from_slice(c.take(header_len)?)
        .map_err(|e| malformed(format!("header is not JSON: {e}")))?;
    if !header.is_object() {
        return Err(malformed("header is not a JSON object"));
    }
    let count = c.u32()? as usize;
    let mut tensors = Vec::new();
    for index in 0..count {
        let code = c.u8()?;
        let dtype = WireDType::from_code(code)
            .ok_or_else(|| malformed(format!("tensor {index}: unknown dtype code {code}")))?;
        let ndim = c.u8()? as usize;
        if ndim > MAX_NDIM {
            return Err(malformed(format!(
                "tensor {index}: {ndim} axes (at most {MAX_NDIM})"
            )));
        }
        let mut shape = Vec::with_capacity(ndim);
        let mut numel: u64 = 1;
        for _ in 0..ndim {
            let d = c.u64()?;
            numel = numel
                .checked_mul(d)
                .ok_or_else(|| malformed(format!("tensor {index}: element count overflows")))?;
            shape.push(
                usize::try_from(d)
                    .map_err(|_| malformed(format!("tensor {index}: axis too large")))?,
            );
        }
        let nbytes = c.u64()?;
        let expected = numel.checked_mul(dtype.size() as u64);
        if expected != Some(nbytes) {
            return Err(malformed(format!(
                "tensor {index}: {nbytes} bytes for {dtype} {shape:?}"
            )));
        }
        let start = c.pos;
        c.take(usize::try_from(nbytes).map_err(|_| malformed("tensor too large"))?)?;
        tensors.push(HostTensor {
            dtype,
            shape,
            data: body.slice(start..c.pos),
        });
    }
    if c.pos != body.len() {
        return Err(malformed(format!(
            "{} trailing bytes after the last tensor",
            body.len() - c.pos
        )));
    }
    Ok(Frame {
        id,
        header,
        tensors,
    })
}

/// Read one frame. `Err(WireError::Eof)` when the stream ends before its first byte.
pub fn read_frame(reader: &mut impl Read) -> Result<Frame, WireError> {
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(WireError::Eof),
        Err(e) => return Err(WireError::Io(e)),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(malformed(format!(
            "frame of {len} bytes exceeds {MAX_FRAME}"
        )));
    }
    // A lying length on a short stream fails at EOF having allocated at most 256 MiB up front;
    // honest frames up to that size arrive without a single reallocation.
    let mut body = Vec::with_capacity(len.min(256 << 20));
    let got = reader
        .take(len as u64)
        .read_to_end(&mut body)
        .map_err(WireError::Io)?;
    if got != len {
        return Err(malformed(format!(
            "stream ended inside a frame ({got} of {len} bytes)"
        )));
    }
    decode_body(body.into())
}

/// Write one frame and flush.
pub fn write_frame(writer: &mut impl Write, frame: &Frame) -> io::Result<()> {
    writer.write_all(&encode(frame))?;
    writer.flush()
}

/// Replace tensors in a header by references: used to build requests.
#[derive(Default)]
pub struct TensorTable {
    /// Tensors collected so far, in reference order.
    pub tensors: Vec<HostTensor>,
}

impl TensorTable {
    /// Append a tensor; returns the `{"$t": i}` that stands for it in the header.
    pub fn add(&mut self, t: HostTensor) -> Json {
        self.tensors.push(t);
        serde_json::json!({ "$t": self.tensors.len() - 1 })
    }
}

/// Look up a `{"$t": i}` reference of a decoded header.
pub fn tensor_ref<'a>(
    value: &Json,
    tensors: &'a [HostTensor],
) -> Result<&'a HostTensor, WireError> {
    value
        .get("$t")
        .and_then(Json::as_u64)
        .and_then(|i| tensors.get(usize::try_from(i).ok()?))
        .ok_or_else(|| malformed(format!("expected a tensor reference, found {value}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Frame {
        Frame {
            id: 7,
            header: serde_json::json!({"op": "forward", "args": [{"$t": 0}]}),
            tensors: vec![
                HostTensor::from_f64(vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
                HostTensor {
                    dtype: WireDType::Bool,
                    shape: vec![],
                    data: Bytes::from_static(&[1]),
                },
            ],
        }
    }

    #[test]
    fn round_trips() {
        let frame = sample();
        let bytes = encode(&frame);
        let decoded = read_frame(&mut &bytes[..]).unwrap();
        assert_eq!(decoded, frame);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = encode(&sample());
        for cut in 0..bytes.len() {
            let result = read_frame(&mut &bytes[..cut]);
            assert!(result.is_err(), "a frame cut at {cut} bytes decoded");
        }
    }

    #[test]
    fn a_lying_byte_count_is_rejected() {
        let mut bytes = encode(&sample());
        // Byte count of the first tensor sits after: len(4) magic(4) id(8) hlen(4) header count(4)
        // code(1) ndim(1) dims(16).
        let header_len = u32::from_le_bytes(bytes[16..20].try_into().unwrap()) as usize;
        let at = 20 + header_len + 4 + 2 + 16;
        bytes[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let err = read_frame(&mut &bytes[..]).unwrap_err().to_string();
        assert!(err.contains("bytes for f64 [2, 3]"), "{err}");
    }

    #[test]
    fn candle_round_trip_keeps_dtype_and_values() {
        let t = Tensor::new(&[[1.5f32, -2.0], [0.25, 8.0]], &Device::Cpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let host = HostTensor::from_candle(&t).unwrap();
        assert_eq!(host.dtype, WireDType::BF16);
        assert_eq!(host.to_f64(), vec![1.5, -2.0, 0.25, 8.0]);
        let back = host.to_candle(&Device::Cpu).unwrap();
        assert_eq!(back.dtype(), DType::BF16);
        assert_eq!(back.dims(), &[2, 2]);
    }
}
