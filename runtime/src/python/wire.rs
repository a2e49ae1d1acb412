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
//!
//! Between the runtime and its worker, a large tensor may live in shared memory instead
//! ([`crate::python::shm`]): its dtype code has the bit [`SHARED`] set, and the entry ends with a
//! u64 LE offset instead of the raw bytes, into the arena that the header's `"$shm"` object names
//! (`{"pid", "fd", "name", "size"}`). Decoding gives a [`RawFrame`] whose shared tensors are
//! checked against that `size` but not yet read; [`RawFrame::resolve`] reads them through the
//! caller, which checks them against the arena itself. [`read_frame`] and [`decode_body`] refuse
//! shared tensors: a golden store, whose frames they read, holds every tensor inline.

use bytes::Bytes;
use golden_files::tensor::MAX_NDIM;
use golden_files::{HostTensor, WireDType};
use serde_json::Value as Json;
use std::fmt;
use std::io::{self, Read, Write};

/// First bytes of every frame body.
pub const MAGIC: &[u8; 4] = b"GLD1";
/// Largest frame accepted (2 GiB): a corrupt length must not allocate without bound. Tensors in
/// shared memory count toward it: the limit is the message's, wherever its bytes travel. Declared
/// beside `GOLDEN_MAX_FRAME`, which lowers the worker's ([`crate::describe::env::FRAME_LIMIT`]).
pub const MAX_FRAME: usize = crate::describe::env::FRAME_LIMIT as usize;
/// The bit of a tensor entry's dtype code that says its bytes are in shared memory.
pub const SHARED: u8 = 0x80;
/// The header key that names a frame's shared memory.
pub const SHM_KEY: &str = "$shm";

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

/// A number of a worker's header: a JSON number, or the strings `NaN`, `Infinity` and `-Infinity`
/// the worker writes for what JSON cannot (`wire.py`'s `header_json`).
pub fn number(value: &Json) -> Option<f64> {
    match value {
        Json::String(s) if s == "NaN" => Some(f64::NAN),
        Json::String(s) if s == "Infinity" => Some(f64::INFINITY),
        Json::String(s) if s == "-Infinity" => Some(f64::NEG_INFINITY),
        other => other.as_f64(),
    }
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

/// Encode a frame, length prefix included, every tensor inline (as golden stores keep them).
pub fn encode(frame: &Frame) -> Vec<u8> {
    let parts = encode_parts(frame, &[]);
    let mut out = Vec::with_capacity(parts.iter().map(Bytes::len).sum());
    for part in &parts {
        out.extend_from_slice(part);
    }
    out
}

/// A frame as the buffers to write in order, length prefix first; tensor data are not copied.
/// `shared[i] = Some(offset)`: tensor `i` is in shared memory at that offset, which the header's
/// `"$shm"` object must name (the caller has put it there, and the bytes in place).
pub fn encode_parts(frame: &Frame, shared: &[Option<u64>]) -> Vec<Bytes> {
    let header = serde_json::to_vec(&frame.header).expect("a JSON value always serialises");
    let offset_of = |i: usize| shared.get(i).copied().flatten();
    let entries: usize = (frame.tensors.iter().enumerate())
        .map(|(i, t)| {
            let data = if offset_of(i).is_some() {
                8
            } else {
                t.data.len()
            };
            2 + 8 * t.shape.len() + 8 + data
        })
        .sum();
    let body_len = MAGIC.len() + 8 + 4 + header.len() + 4 + entries;
    let mut head = Vec::with_capacity(24 + header.len() + 64 * frame.tensors.len().min(64));
    head.extend_from_slice(&(body_len as u32).to_le_bytes());
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&frame.id.to_le_bytes());
    head.extend_from_slice(&(header.len() as u32).to_le_bytes());
    head.extend_from_slice(&header);
    head.extend_from_slice(&(frame.tensors.len() as u32).to_le_bytes());
    let mut parts = Vec::new();
    for (i, t) in frame.tensors.iter().enumerate() {
        let offset = offset_of(i);
        head.push(t.dtype.code() | if offset.is_some() { SHARED } else { 0 });
        head.push(t.shape.len() as u8);
        for &d in &t.shape {
            head.extend_from_slice(&(d as u64).to_le_bytes());
        }
        head.extend_from_slice(&(t.data.len() as u64).to_le_bytes());
        match offset {
            Some(offset) => head.extend_from_slice(&offset.to_le_bytes()),
            // Large tensors go as parts of their own, not copied; small ones join the head.
            None if t.data.len() >= 4096 => {
                parts.push(Bytes::from(std::mem::take(&mut head)));
                parts.push(t.data.clone());
            }
            None => head.extend_from_slice(&t.data),
        }
    }
    if !head.is_empty() {
        parts.push(Bytes::from(head));
    }
    parts
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

/// Where a decoded tensor's bytes are.
#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    /// In the frame: a slice of its body.
    Inline(Bytes),
    /// In the frame's shared memory, at this offset (its length is the tensor's byte count).
    Shared(u64),
}

/// A tensor as decoded, its bytes possibly still in shared memory.
#[derive(Clone, Debug, PartialEq)]
pub struct RawTensor {
    /// Element type.
    pub dtype: WireDType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Byte count (checked against the dtype and shape).
    pub nbytes: usize,
    /// Where the bytes are.
    pub payload: Payload,
}

/// A decoded frame whose shared tensors are not read yet.
#[derive(Clone, Debug, PartialEq)]
pub struct RawFrame {
    /// Request id.
    pub id: u64,
    /// The JSON header, without its `"$shm"` object.
    pub header: Json,
    /// The header's `"$shm"` object: the shared memory the frame's shared tensors are in.
    pub shared: Option<Json>,
    /// The tensors.
    pub tensors: Vec<RawTensor>,
}

impl RawFrame {
    /// Whether some tensor's bytes are in shared memory.
    pub fn has_shared(&self) -> bool {
        self.tensors
            .iter()
            .any(|t| matches!(t.payload, Payload::Shared(_)))
    }

    /// The frame with every tensor's bytes: `read(shm, offset, nbytes)` gives those of a shared
    /// tensor (`shm` is the header's `"$shm"` object, its offset and length already checked
    /// against the `size` it declares), or says why it cannot.
    pub fn resolve(
        self,
        mut read: impl FnMut(&Json, u64, usize) -> Result<Bytes, String>,
    ) -> Result<Frame, WireError> {
        let shared = self.shared.unwrap_or(Json::Null);
        let tensors = self
            .tensors
            .into_iter()
            .enumerate()
            .map(|(index, t)| {
                let data = match t.payload {
                    Payload::Inline(data) => data,
                    Payload::Shared(offset) => {
                        let data = read(&shared, offset, t.nbytes)
                            .map_err(|e| malformed(format!("tensor {index}: {e}")))?;
                        if data.len() != t.nbytes {
                            return Err(malformed(format!(
                                "tensor {index}: {} bytes read from shared memory, {} expected",
                                data.len(),
                                t.nbytes
                            )));
                        }
                        data
                    }
                };
                Ok(HostTensor {
                    dtype: t.dtype,
                    shape: t.shape,
                    data,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Frame {
            id: self.id,
            header: self.header,
            tensors,
        })
    }

    /// The frame, if every tensor is inline (a golden store's, a stream without shared memory).
    pub fn inline(self) -> Result<Frame, WireError> {
        self.resolve(|_, _, _| {
            Err("it lives in shared memory, which this stream does not carry".into())
        })
    }
}

/// Decode a frame body (the bytes after the length prefix), every tensor inline. Tensor data are
/// slices of `body`.
pub fn decode_body(body: Bytes) -> Result<Frame, WireError> {
    decode_raw_body(body)?.inline()
}

/// Decode a frame body whose tensors may be in shared memory: their offsets and lengths are
/// checked against the `size` the header's `"$shm"` declares, and the whole message (body and
/// shared bytes) against [`MAX_FRAME`]; nothing is read from shared memory.
pub fn decode_raw_body(body: Bytes) -> Result<RawFrame, WireError> {
    let mut c = Cursor {
        data: &body,
        pos: 0,
    };
    if c.take(4)? != MAGIC {
        return Err(malformed("bad magic: not a golden frame"));
    }
    let id = c.u64()?;
    let header_len = c.u32()? as usize;
    let mut header: Json = serde_json::from_slice(c.take(header_len)?)
        .map_err(|e| malformed(format!("header is not JSON: {e}")))?;
    let Some(object) = header.as_object_mut() else {
        return Err(malformed("header is not a JSON object"));
    };
    let shared = object.remove(SHM_KEY);
    // The size the shared memory declares: every shared tensor must lie within it.
    let shared_size = shared
        .as_ref()
        .and_then(|s| s.get("size"))
        .and_then(Json::as_u64);
    let mut shared_total: u64 = 0;
    let count = c.u32()? as usize;
    let mut tensors = Vec::new();
    for index in 0..count {
        let code = c.u8()?;
        let in_shared = code & SHARED != 0;
        let dtype = WireDType::from_code(code & !SHARED)
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
        let len = usize::try_from(nbytes).map_err(|_| malformed("tensor too large"))?;
        let payload = if in_shared {
            let offset = c.u64()?;
            let Some(size) = shared_size else {
                return Err(malformed(format!(
                    "tensor {index} lives in shared memory, but the header names none (or no size)"
                )));
            };
            if offset.checked_add(nbytes).is_none_or(|end| end > size) {
                return Err(malformed(format!(
                    "tensor {index}: bytes {offset}+{nbytes} lie outside the shared memory's {size}"
                )));
            }
            shared_total = shared_total.saturating_add(nbytes);
            if shared_total.saturating_add(body.len() as u64) > MAX_FRAME as u64 {
                return Err(malformed(format!(
                    "the frame's {} bytes and {shared_total} in shared memory exceed {MAX_FRAME}",
                    body.len()
                )));
            }
            Payload::Shared(offset)
        } else {
            let start = c.pos;
            c.take(len)?;
            Payload::Inline(body.slice(start..c.pos))
        };
        tensors.push(RawTensor {
            dtype,
            shape,
            nbytes: len,
            payload,
        });
    }
    if c.pos != body.len() {
        return Err(malformed(format!(
            "{} trailing bytes after the last tensor",
            body.len() - c.pos
        )));
    }
    Ok(RawFrame {
        id,
        header,
        shared,
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

/// Read one frame, every tensor inline. `Err(WireError::Eof)` when the stream ends before its
/// first byte; `Err(WireError::NotAFrame)` as soon as its length and magic are not a frame's (an
/// interpreter's banner), without waiting for the length it would claim.
pub fn read_frame(reader: &mut impl Read) -> Result<Frame, WireError> {
    read_raw_frame(reader)?.inline()
}

/// Read one frame whose tensors may be in shared memory (see [`decode_raw_body`]); errors as
/// [`read_frame`]'s.
pub fn read_raw_frame(reader: &mut impl Read) -> Result<RawFrame, WireError> {
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
    decode_raw_body(body.into())
}

/// Write one frame, every tensor inline, and flush. The tensors' bytes are written from where
/// they are, not gathered into one buffer first.
pub fn write_frame(writer: &mut impl Write, frame: &Frame) -> io::Result<()> {
    for part in encode_parts(frame, &[]) {
        writer.write_all(&part)?;
    }
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

    /// `sample()` with its f64 tensor in shared memory at `offset` of an arena of `size` bytes.
    fn shared_sample(offset: u64, size: u64) -> Vec<u8> {
        let mut frame = sample();
        frame.header[SHM_KEY] =
            serde_json::json!({"pid": 1, "fd": 3, "name": "golden-1-1", "size": size});
        let parts = encode_parts(&frame, &[Some(offset)]);
        parts.iter().flat_map(|p| p.iter().copied()).collect()
    }

    #[test]
    fn written_in_parts_a_frame_is_the_same_bytes() {
        let mut frame = sample();
        frame
            .tensors
            .push(HostTensor::from_f64(vec![1000], &[0.25; 1000]));
        let parts = encode_parts(&frame, &[]);
        assert!(parts.len() > 1, "the large tensor is a part of its own");
        let joined: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(joined, encode(&frame));
        let mut written = Vec::new();
        write_frame(&mut written, &frame).unwrap();
        assert_eq!(written, joined);
        assert_eq!(read_frame(&mut &joined[..]).unwrap(), frame);
    }

    #[test]
    fn a_shared_tensor_is_read_through_the_caller() {
        let bytes = shared_sample(64, 4096);
        let raw = read_raw_frame(&mut &bytes[..]).unwrap();
        assert!(raw.has_shared());
        assert_eq!(raw.shared.as_ref().unwrap()["name"], "golden-1-1");
        assert!(
            raw.header.get(SHM_KEY).is_none(),
            "the header is the application's"
        );
        let mut asked = Vec::new();
        let frame = raw
            .resolve(|shm, offset, len| {
                asked.push((shm["fd"].as_u64(), offset, len));
                Ok(sample().tensors[0].data.clone())
            })
            .unwrap();
        assert_eq!(asked, [(Some(3), 64, 48)]);
        assert_eq!(frame.tensors, sample().tensors);
        // A reader that cannot: its reason, with the tensor.
        let raw = read_raw_frame(&mut &bytes[..]).unwrap();
        let err = raw.resolve(|_, _, _| Err("gone".into())).unwrap_err();
        assert_eq!(err.to_string(), "malformed frame: tensor 0: gone");
        // Fewer bytes than the tensor has.
        let raw = read_raw_frame(&mut &bytes[..]).unwrap();
        let err = raw
            .resolve(|_, _, _| Ok(Bytes::from_static(b"ab")))
            .unwrap_err();
        assert!(err
            .to_string()
            .contains("2 bytes read from shared memory, 48 expected"));
    }

    #[test]
    fn a_store_s_reader_refuses_shared_tensors() {
        let bytes = shared_sample(0, 4096);
        let err = read_frame(&mut &bytes[..]).unwrap_err().to_string();
        assert!(
            err.contains("tensor 0: it lives in shared memory, which this stream does not carry"),
            "{err}"
        );
        let err = decode_body(Bytes::copy_from_slice(&bytes[4..])).unwrap_err();
        assert!(err.to_string().contains("shared memory"), "{err}");
    }

    #[test]
    fn a_shared_tensor_outside_its_arena_is_refused_before_anything_is_read() {
        for (offset, size) in [(4090, 4096), (u64::MAX - 8, 4096), (0, 47)] {
            let bytes = shared_sample(offset, size);
            let err = read_raw_frame(&mut &bytes[..]).unwrap_err().to_string();
            assert!(
                err.contains("lie outside the shared memory"),
                "{offset} {size}: {err}"
            );
        }
        // No arena, or one without a size.
        let mut frame = sample();
        let no_arena: Vec<u8> = (encode_parts(&frame, &[Some(0)]).iter())
            .flat_map(|p| p.iter().copied())
            .collect();
        let err = read_raw_frame(&mut &no_arena[..]).unwrap_err().to_string();
        assert!(err.contains("the header names none"), "{err}");
        frame.header[SHM_KEY] = serde_json::json!({"name": "golden-1-1"});
        let no_size: Vec<u8> = (encode_parts(&frame, &[Some(0)]).iter())
            .flat_map(|p| p.iter().copied())
            .collect();
        assert!(read_raw_frame(&mut &no_size[..]).is_err());
        // More in shared memory than a frame may carry.
        let mut frame = sample();
        frame.header[SHM_KEY] = serde_json::json!({"size": u64::MAX});
        frame.tensors[0] = HostTensor {
            dtype: WireDType::U8,
            shape: vec![MAX_FRAME],
            data: Bytes::new(),
        };
        let mut huge: Vec<u8> = Vec::new();
        for part in encode_parts(&frame, &[Some(0)]) {
            huge.extend_from_slice(&part);
        }
        // The encoder wrote the (empty) data's length: put the claimed one in its place, after
        // len(4) magic(4) id(8) hlen(4) header count(4) code(1) ndim(1) dims(8).
        let header_len = u32::from_le_bytes(huge[16..20].try_into().unwrap()) as usize;
        let at = 20 + header_len + 4 + 2 + 8;
        huge[at..at + 8].copy_from_slice(&(MAX_FRAME as u64).to_le_bytes());
        let err = read_raw_frame(&mut &huge[..]).unwrap_err().to_string();
        assert!(err.contains("in shared memory exceed"), "{err}");
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
