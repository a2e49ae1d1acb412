"""The framed binary protocol between the Rust runtime and the worker.

One frame::

    u32 LE   length of the rest of the frame
    4 bytes  magic b"GLD1"
    u64 LE   request id (a response carries the id of its request)
    u32 LE   length H of the JSON header, then H bytes of UTF-8 JSON
    u32 LE   number N of tensors, then N times:
               u8 dtype code, u8 ndim, ndim x u64 LE dims, u64 LE byte count, raw LE bytes

The JSON header refers to the i-th tensor as ``{"$t": i}``. bf16 travels as its raw 16-bit pattern
(NumPy has no bf16); bool as one byte per element. The runtime's `wire.rs` is the other half of this
file: keep the two in step.

A tensor whose dtype code has the bit 0x80 set lives in shared memory (:mod:`golden_ref.shm`):
instead of its raw bytes, the entry ends with a u64 LE offset into the arena that the header's
``"$shm"`` object names. Only the worker's own streams carry such tensors (a golden store never).
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np

from . import shm, variables

MAGIC = b"GLD1"
# A tensor entry's dtype code with this bit: its bytes are in the frame's shared memory.
SHARED = 0x80
# A frame larger than this is refused rather than allocated: a corrupt length must not exhaust memory.
# The runtime's limit is the same 2 GiB. GOLDEN_MAX_FRAME (bytes) can only lower it: golden's own
# tests reach the limit with small tensors that way. A value it cannot read is an error, as in the
# runtime (which reads it first, before any worker starts).
LIMIT = 1 << 31


def _max_frame() -> int:
    return variables.whole_number(
        "GOLDEN_MAX_FRAME", LIMIT, 1, LIMIT,
        f"a frame limit: give a whole number of bytes from 1 to {LIMIT} (it can only lower the "
        "worker's limit of 2 GiB; golden's own tests set it)",
    )


MAX_FRAME = _max_frame()
MAX_NDIM = 16


class ProtocolError(Exception):
    """The bytes on the pipe are not a well-formed frame."""


class FrameTooLarge(ProtocolError):
    """A frame to write would exceed MAX_FRAME (found before anything is written or copied)."""


# code -> (name, numpy dtype used to hold the raw bytes)
DTYPES = {
    1: ("f32", np.dtype("<f4")),
    2: ("f64", np.dtype("<f8")),
    3: ("f16", np.dtype("<f2")),
    4: ("bf16", np.dtype("<u2")),
    5: ("i64", np.dtype("<i8")),
    6: ("u32", np.dtype("<u4")),
    7: ("u8", np.dtype("u1")),
    8: ("bool", np.dtype("?")),
    9: ("i32", np.dtype("<i4")),
    10: ("i16", np.dtype("<i2")),
}
CODES = {name: code for code, (name, _) in DTYPES.items()}
FLOAT_DTYPES = ("f32", "f64", "f16", "bf16")


class WireTensor:
    """A tensor as it travels: a dtype name, and a NumPy array holding its values (bf16 as uint16 bits)."""

    __slots__ = ("dtype", "array")

    def __init__(self, dtype: str, array: np.ndarray):
        if dtype not in CODES:
            raise ValueError(f"unknown wire dtype {dtype!r}")
        self.dtype = dtype
        self.array = array

    @property
    def shape(self):
        return tuple(self.array.shape)

    def __repr__(self):
        return f"WireTensor({self.dtype}, {list(self.shape)})"


def _read_into(stream, buffer: memoryview) -> int:
    """Fill `buffer` from the stream; returns how many bytes arrived (fewer only at EOF)."""
    filled = 0
    while filled < len(buffer):
        n = stream.readinto(buffer[filled:])
        if not n:
            break
        filled += n
    return filled


def read_frame(stream, session=None):
    """Read one frame: returns (request id, header dict, list of WireTensor), or None at EOF.

    The body is read into one writable buffer that the frame's arrays then share: no copies.
    Tensors in shared memory are read-only views of the peer's arena, which `session` (a
    :class:`golden_ref.shm.Session`) attaches; without a session they are a protocol error.
    """
    head = bytearray(4)
    got = _read_into(stream, memoryview(head))
    if got == 0:
        return None
    if got < 4:
        raise ProtocolError(f"stream ended inside a frame length ({got} of 4 bytes)")
    (length,) = struct.unpack("<I", head)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes is larger than the limit of {MAX_FRAME}")
    body = bytearray(length)
    got = _read_into(stream, memoryview(body))
    if got < length:
        raise ProtocolError(f"stream ended inside a frame ({got} of {length} bytes)")
    return decode_body(body, session)


def decode_body(body, session=None):
    """Decode the part of a frame after its length prefix (arrays are views into `body`, or into
    the peer's arena for tensors in shared memory)."""
    view = memoryview(body)
    pos = 0

    def take(n: int) -> memoryview:
        nonlocal pos
        if n < 0 or pos + n > len(view):
            raise ProtocolError(f"frame truncated: needed {n} bytes at offset {pos} of {len(view)}")
        out = view[pos : pos + n]
        pos += n
        return out

    if bytes(take(4)) != MAGIC:
        raise ProtocolError("bad magic: this is not a golden frame")
    (request_id,) = struct.unpack("<Q", take(8))
    (header_len,) = struct.unpack("<I", take(4))
    try:
        header = json.loads(bytes(take(header_len)).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"header is not UTF-8 JSON: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    (count,) = struct.unpack("<I", take(4))
    tensors = []
    for index in range(count):
        code, ndim = struct.unpack("<BB", take(2))
        shared = bool(code & SHARED)
        code &= ~SHARED
        if code not in DTYPES:
            raise ProtocolError(f"tensor {index}: unknown dtype code {code}")
        if ndim > MAX_NDIM:
            raise ProtocolError(f"tensor {index}: {ndim} dimensions (at most {MAX_NDIM})")
        dims = struct.unpack(f"<{ndim}Q", take(8 * ndim)) if ndim else ()
        (nbytes,) = struct.unpack("<Q", take(8))
        name, np_dtype = DTYPES[code]
        numel = 1
        for d in dims:
            numel *= d
        if numel * np_dtype.itemsize != nbytes:
            raise ProtocolError(
                f"tensor {index}: {nbytes} bytes for shape {list(dims)} of {name} "
                f"(expected {numel * np_dtype.itemsize})"
            )
        if shared:
            (offset,) = struct.unpack("<Q", take(8))
            array = _shared_array(header.get("$shm"), session, index, offset, nbytes, np_dtype, dims)
        else:
            raw = take(nbytes)
            array = np.frombuffer(raw, dtype=np_dtype).reshape(dims)
        tensors.append(WireTensor(name, array))
    if pos != len(view):
        raise ProtocolError(f"{len(view) - pos} trailing bytes after the last tensor")
    return request_id, header, tensors


def _shared_array(desc, session, index, offset, nbytes, np_dtype, dims):
    """Tensor `index` of a frame: `nbytes` at `offset` of the arena `desc` names."""
    if session is None:
        raise ProtocolError(f"tensor {index} lives in shared memory, which this stream does not carry")
    size = desc.get("size") if isinstance(desc, dict) else None
    if not isinstance(size, int) or offset + nbytes > size:
        raise ProtocolError(
            f"tensor {index}: bytes {offset}..{offset + nbytes} are outside the shared memory the "
            f"frame names ({size!r} bytes)"
        )
    try:
        return session.attach(desc).array(offset, nbytes, np_dtype, dims)
    except shm.BadArena as e:
        raise ProtocolError(f"tensor {index}: {e}") from None


def _size(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


def _json_safe(value):
    """`value` with every float that JSON cannot write (NaN, ±inf) as the string NaN, Infinity or
    -Infinity, which the runtime reads back as numbers (`wire::number`)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def header_json(header: dict) -> bytes:
    """A frame's header as JSON the runtime can read: Python's own `NaN` and `Infinity` tokens are
    not JSON (a training whose loss became NaN broke the protocol: "header is not JSON")."""
    try:
        text = json.dumps(header, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_json_safe(header), separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8")


def frame_parts(request_id: int, header: dict, tensors: list[WireTensor], session=None,
                release: bool = False) -> list:
    """The frame as a list of buffers, length prefix first; tensor data is not copied (but for
    tensors of at least `session.min` bytes, copied once into this worker's arena when the request
    allows it).

    Raises FrameTooLarge, from the tensors' shapes alone, for a frame over MAX_FRAME (counting the
    tensors in shared memory too: the limit is the answer's, wherever its bytes travel)."""
    sizes = [t.array.size * DTYPES[CODES[t.dtype]][1].itemsize for t in tensors]
    entries = sum(10 + 8 * t.array.ndim + n for t, n in zip(tensors, sizes))
    header_bytes = header_json(header)
    length = 4 + 12 + len(header_bytes) + 4 + entries
    if length > MAX_FRAME:
        big = max(range(len(tensors)), key=sizes.__getitem__, default=None)
        largest = "" if big is None else (
            f"; its largest tensor is {tensors[big].dtype} {list(tensors[big].shape)} ({_size(sizes[big])})"
        )
        raise FrameTooLarge(
            f"a frame of {_size(length)} exceeds the frame limit of {_size(MAX_FRAME)}{largest}"
        )
    offsets = _place(header, tensors, sizes, session, release)
    if offsets:
        header = {**header, "$shm": session.writer.describe()}
    if session is not None and session.fallback and not session.fallback_said:
        session.fallback_said = True
        header = {**header, "$shm_fallback": session.fallback}
    if offsets or "$shm_fallback" in header:
        header_bytes = header_json(header)
    parts = [MAGIC, struct.pack("<QI", request_id, len(header_bytes)), header_bytes]
    parts.append(struct.pack("<I", len(tensors)))
    for i, t in enumerate(tensors):
        code = CODES[t.dtype]
        if i in offsets:
            parts.append(struct.pack("<BB", code | SHARED, t.array.ndim))
            if t.array.ndim:
                parts.append(struct.pack(f"<{t.array.ndim}Q", *t.array.shape))
            parts.append(struct.pack("<QQ", sizes[i], offsets[i]))
            continue
        array = np.asarray(t.array, dtype=DTYPES[code][1], order="C")
        parts.append(struct.pack("<BB", code, array.ndim))
        if array.ndim:
            parts.append(struct.pack(f"<{array.ndim}Q", *array.shape))
        parts.append(struct.pack("<Q", array.nbytes))
        if array.nbytes:
            parts.append(memoryview(array.reshape(-1)).cast("B"))
    body = sum(memoryview(p).nbytes for p in parts)
    return [struct.pack("<I", body)] + parts


def _place(header, tensors, sizes, session, release: bool = False) -> dict:
    """Copy the tensors of at least `session.min` bytes into the worker's arena: {index: offset}.
    Empty when the request does not take shared memory or the arena cannot grow (then everything
    travels inline, and the session says why once). With `release`, each tensor copied is replaced
    in `tensors` by a stand-in of its dtype and shape that holds no memory: the caller gives its
    answer up, which then is not held twice (in its arrays and in the arena) while it is sent."""
    if session is None or session.min is None:
        return {}
    chosen = [i for i, n in enumerate(sizes) if n >= session.min]
    if not chosen:
        return {}
    offsets, end = {}, 0
    for i in chosen:
        offsets[i] = end
        end = shm.align(end + sizes[i])
    arena = session.arena_for(end)
    if arena is None:
        return {}
    for i in chosen:
        arena.write(offsets[i], np.asarray(tensors[i].array, dtype=DTYPES[CODES[tensors[i].dtype]][1]))
        if release:
            t = tensors[i]
            tensors[i] = WireTensor(t.dtype, np.broadcast_to(np.zeros((), t.array.dtype), t.array.shape))
            del t
    return offsets


def encode_frame(request_id: int, header: dict, tensors: list[WireTensor]) -> bytes:
    """Encode one frame, length prefix included."""
    return b"".join(frame_parts(request_id, header, tensors))


def write_frame(stream, request_id: int, header: dict, tensors: list[WireTensor], session=None,
                release: bool = False) -> None:
    """Write one frame (see `frame_parts`; `release`: the tensors are given up as they are placed
    in shared memory)."""
    for part in frame_parts(request_id, header, tensors, session, release):
        stream.write(part)
    stream.flush()


class TensorTable:
    """Collects tensors while a response header is built; `ref` returns the header's {"$t": i}."""

    def __init__(self):
        self.tensors: list[WireTensor] = []

    def ref(self, tensor: WireTensor) -> dict:
        self.tensors.append(tensor)
        return {"$t": len(self.tensors) - 1}


def resolve_refs(value, tensors: list[WireTensor]):
    """Replace every {"$t": i} in a decoded header by the i-th tensor."""
    if isinstance(value, dict):
        if set(value) == {"$t"}:
            index = value["$t"]
            if not isinstance(index, int) or not 0 <= index < len(tensors):
                raise ProtocolError(f"header refers to tensor {index!r}, frame has {len(tensors)}")
            return tensors[index]
        return {k: resolve_refs(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_refs(v, tensors) for v in value]
    return value
