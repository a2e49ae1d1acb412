"""A checkpoint's state, loaded once per worker and kept by id (`weights = "..."`).

The runtime resolves a checkpoint against the reference module's state_dict (every entry's name in
the checkpoint, ties included) and sends the worker what it needs to load it itself, once: the
checkpoint's files (one `.safetensors` file, or the shards an index names), each with its size,
modification time and inode, and per state_dict entry which file holds it under which name (entries
the checkpoint does not hold, which the module keeps, travel as tensors). Requests then name the
state's id (`state_ref`); a worker that does not hold it answers `unknown_state`, and the runtime
sends it again. No request carries a checkpoint's tensors.

Each file is mapped (copy-on-write: a reference that writes into a parameter in place writes into
this process's pages, never into the file), so its tensors are views of the mapping, in the file's
own dtype, not copies. The module built from them is kept with the state (`modules`, one at a
time), so that a whole model is constructed and loaded once per worker, not once per request: see
:func:`golden_ref.evaluate.build_module` and :mod:`golden_ref.checkpointed`, which evaluates it in
any dtype without a copy of it and gives each module's mapped pages back after its forward
(:meth:`State.release`).
"""

from __future__ import annotations

import json
import mmap
import os

import numpy as np

from .wire import DTYPES, CODES, WireTensor, resolve_refs

# safetensors' dtype names -> wire dtypes.
_DTYPES = {
    "F32": "f32",
    "F64": "f64",
    "F16": "f16",
    "BF16": "bf16",
    "I64": "i64",
    "I32": "i32",
    "I16": "i16",
    "U8": "u8",
    "U32": "u32",
    "BOOL": "bool",
}


class CheckpointError(Exception):
    """The checkpoint cannot be loaded as the runtime described it (changed on disk, unreadable)."""


class State:
    """One resolved checkpoint: its entries as wire tensors viewing the mapped files, by the
    reference's names, and the module built from them (`modules`)."""

    def __init__(self, spec: dict, tensors: list):
        self.id = spec["id"]
        self.spec = spec
        # Entries the checkpoint does not hold (the module's own values). A frame's tensors may be
        # views of the runtime's shared memory: kept, so copied.
        self.values = {}
        for name, ref in spec["entries"]:
            if not _in_file(ref):
                t = resolve_refs(ref, tensors)
                self.values[name] = WireTensor(t.dtype, np.array(t.array, copy=True))
        self.modules = {}
        # The last case's evaluations, for the stages of a whole model's evaluation that follow
        # (`golden_ref.evaluate.forward`'s `upto`): (key, {part: value}).
        self.last = None
        self._mappings = []
        self.entries = self._map()

    def _map(self):
        files = self.spec["files"]
        self._mappings = [_mapped(f) for f in files]
        found = {}
        for i, name in {tuple(ref) for _, ref in self.spec["entries"] if _in_file(ref)}:
            found[(i, name)] = _tensor(self._mappings[i], files[i]["path"], name)
        return [(name, found[tuple(ref)] if _in_file(ref) else self.values[name])
                for name, ref in self.spec["entries"]]

    def recall(self, key: str) -> dict:
        """What the stages of a whole model's evaluation kept for the case `key` (nothing when the
        last case kept was another)."""
        if self.last is not None and self.last[0] == key:
            return dict(self.last[1])
        return {}

    def keep(self, key: str, parts: dict) -> None:
        """Keep the evaluations made for the case `key` (only the last case's are kept)."""
        self.last = (key, parts)

    def reload(self):
        """Map the files again, and forget the module built from them: after a reference wrote
        into a parameter in place, the mapping's pages hold what it wrote."""
        self.modules.clear()
        self.last = None
        self.entries = self._map()

    def release(self, address: int, nbytes: int) -> None:
        """Give back to the page cache the mapped pages that lie wholly inside the `nbytes` bytes
        at `address` (a tensor viewing one of the mappings; nothing for any other memory): they
        are read again from the page cache when used again. What the worker keeps resident is
        what it is computing with, not the checkpoint."""
        for mapping in self._mappings:
            mapping.release(address, nbytes)


def _in_file(ref) -> bool:
    """Whether a state entry's reference names a tensor of a file (`[file index, name]`), rather
    than one of the request's tensors."""
    return isinstance(ref, list) and len(ref) == 2 and isinstance(ref[0], int) and isinstance(ref[1], str)


class _Mapping:
    """One `.safetensors` file, mapped copy-on-write, and its header."""

    def __init__(self, path: str, mm, header: dict, base: int):
        self.path = path
        self.mm = mm
        self.header = header
        self.base = base
        self.address = np.frombuffer(mm, dtype=np.uint8).ctypes.data if len(mm) else 0
        self.size = len(mm)

    def release(self, address: int, nbytes: int) -> None:
        start = address - self.address
        end = start + nbytes
        if start < 0 or end > self.size or nbytes <= 0:
            return
        page = mmap.PAGESIZE
        first = -(-start // page) * page
        last = end // page * page
        if last > first:
            try:
                self.mm.madvise(mmap.MADV_DONTNEED, first, last - first)
            except (AttributeError, OSError, ValueError):
                pass


def _mapped(spec: dict) -> _Mapping:
    """Map one file of the checkpoint after checking it is still the file the runtime hashed."""
    path = spec["path"]
    try:
        st = os.stat(path)
    except OSError as e:
        raise CheckpointError(f"weights = {path!r}: {e}") from None
    inode = spec.get("inode")
    replaced = inode is not None and (st.st_dev, st.st_ino) != (int(inode[0]), int(inode[1]))
    if replaced or st.st_size != int(spec["size"]) or st.st_mtime_ns != int(spec["mtime_ns"]):
        raise CheckpointError(
            f"weights = {path!r} changed since golden hashed it (size {spec['size']} -> "
            f"{st.st_size}, or its modification time, or another file took its place): run the "
            "check again"
        )
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    n = int.from_bytes(mm[:8], "little")
    header = json.loads(bytes(mm[8:8 + n]))
    return _Mapping(path, mm, header, 8 + n)


def _tensor(mapping: _Mapping, path: str, name: str) -> WireTensor:
    """The tensor `name` of a mapped file, as a view of the mapping, in the file's dtype."""
    info = mapping.header.get(name)
    if info is None:
        raise CheckpointError(f"weights = {path!r} has no `{name}` any more: run the check again")
    dtype = _DTYPES.get(info["dtype"])
    if dtype is None:
        raise CheckpointError(f"weights = {path!r}: `{name}` is {info['dtype']}, which golden does not read")
    start, end = info["data_offsets"]
    shape = tuple(int(d) for d in info["shape"])
    np_dtype = DTYPES[CODES[dtype]][1]
    count = (end - start) // np_dtype.itemsize
    array = np.frombuffer(mapping.mm, dtype=np_dtype, count=count, offset=mapping.base + start).reshape(shape)
    return WireTensor(dtype, array)


class States:
    """The states a worker holds, by id; the oldest goes when a third arrives (each is a whole
    model's parameters at worst)."""

    KEEP = 2

    def __init__(self):
        self.by_id = {}

    def load(self, spec: dict, tensors: list) -> State:
        if spec["id"] in self.by_id:
            return self.by_id[spec["id"]]
        while len(self.by_id) >= self.KEEP:
            self.by_id.pop(next(iter(self.by_id)))
        state = State(spec, tensors)
        self.by_id[state.id] = state
        return state

    def get(self, state_id: str):
        return self.by_id.get(state_id)
