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
use golden_files::tensor::MAX_NDIM;
use golden_files::{HostTensor, WireDType};
use serde_json::Value as Json;
use std::fmt;
use std::io::{self, Read, Write};

/// First bytes of every frame body.
pub const MAGIC: &[u8; 4] = b"GLD1";
/// Largest frame accepted (2 GiB): a corrupt length must not allocate without bound.
pub const MAX_FRAME: usize = 1 << 31;

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

/// A JSON list of strings (an absent one is empty).
pub fn strings(value: &Json) -> Vec<String> {
    value
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(Json::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
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
    /// The stream does not begin with a frame at all (no magic where it must be): these are its
    /// first bytes. Found before anything is allocated or waited for.
    NotAFrame(Vec<u8>),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Io(e) => write!(f, "pipe error: {e}"),
            WireError::Eof => f.write_str("the stream ended"),
            WireError::Malformed(m) => write!(f, "malformed frame: {m}"),
            WireError::NotAFrame(bytes) => write!(
                f,
                "not a golden frame: the bytes begin {:?}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(64)])
            ),
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

/// Fill `buf` from `reader`; how many bytes arrived (fewer only at EOF).
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> Result<usize, WireError> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(WireError::Io(e)),
        }
    }
    Ok(filled)
}

/// Read one frame. `Err(WireError::Eof)` when the stream ends before its first byte;
/// `Err(WireError::NotAFrame)` as soon as its length and magic are not a frame's (an interpreter's
/// banner), without waiting for the length it would claim.
pub fn read_frame(reader: &mut impl Read) -> Result<Frame, WireError> {
    let mut head = [0u8; 8];
    let got = read_full(reader, &mut head)?;
    if got == 0 {
        return Err(WireError::Eof);
    }
    if got > 4 && head[4..got] != MAGIC[..got - 4] {
        return Err(WireError::NotAFrame(head[..got].to_vec()));
    }
    if got < head.len() {
        return Err(malformed(format!(
            "stream ended inside a frame's length and magic ({got} of 8 bytes)"
        )));
    }
    let len = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
    if len > MAX_FRAME {
        return Err(malformed(format!(
            "frame of {len} bytes exceeds {MAX_FRAME}"
        )));
    }
    if len < MAGIC.len() {
        return Err(malformed(format!(
            "frame of {len} bytes is shorter than its magic"
        )));
    }
    // A lying length on a short stream fails at EOF having allocated at most 256 MiB up front;
    // honest frames up to that size arrive without a single reallocation.
    let mut body = Vec::with_capacity(len.min(256 << 20));
    body.extend_from_slice(MAGIC);
    let rest = len - MAGIC.len();
    let got = reader
        .take(rest as u64)
        .read_to_end(&mut body)
        .map_err(WireError::Io)?;
    if got != rest {
        return Err(malformed(format!(
            "stream ended inside a frame ({} of {len} bytes)",
            got + MAGIC.len()
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
    fn bytes_that_are_not_a_frame_are_refused_at_once_with_their_text() {
        // A banner whose first four bytes read as a length of ~1.8 GB: refused without waiting
        // for (or allocating) that much.
        let banner = b"Welcome to the lab's Python\n";
        match read_frame(&mut &banner[..]) {
            Err(WireError::NotAFrame(bytes)) => assert_eq!(bytes, &banner[..8]),
            other => panic!("{other:?}"),
        }
        // A short one, then a real frame: the magic is not where it must be.
        let mut bytes = b"hi\n".to_vec();
        bytes.extend(encode(&sample()));
        match read_frame(&mut &bytes[..]) {
            Err(WireError::NotAFrame(got)) => assert!(got.starts_with(b"hi\n"), "{got:?}"),
            other => panic!("{other:?}"),
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
}
