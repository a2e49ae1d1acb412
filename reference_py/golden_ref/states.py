"""A checkpoint's state, loaded once per worker and kept by id (`weights = "..."`).

The runtime resolves a checkpoint against the reference module's state_dict (every entry's name in
the file, ties included) and sends the worker what it needs to load it itself, once: the file's
path, size, modification time, inode and content hash, and per state_dict entry the file's name for it
(entries the file does not hold, which the module keeps, travel as tensors). Requests then name
the state's id (`state_ref`); a worker that does not hold it answers `unknown_state`, and the
runtime sends it again. No request carries a checkpoint's tensors.

The file is mapped (copy-on-write: a reference that writes into a parameter in place writes into
this process's pages, never into the file), so its tensors are views of the mapping, not copies.
The module built from it is kept with the state (`modules`, one at a time), so that a whole model
is constructed and loaded once per worker, not once per request: see
:func:`golden_ref.evaluate.build_module`.
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
    """One resolved checkpoint: its entries as wire tensors viewing the mapped file, by the
    reference's names, and the module built from them (`modules`)."""

    def __init__(self, spec: dict, tensors: list):
        self.id = spec["id"]
        self.spec = spec
        # Entries the file does not hold (the module's own values). A frame's tensors may be views
        # of the runtime's shared memory: kept, so copied.
        self.values = {}
        for name, ref in spec["entries"]:
            if not isinstance(ref, str):
                t = resolve_refs(ref, tensors)
                self.values[name] = WireTensor(t.dtype, np.array(t.array, copy=True))
        self.modules = {}
        self.entries = self._map()

    def _map(self):
        spec = self.spec
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
            self._mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        mm = self._mapping
        n = int.from_bytes(mm[:8], "little")
        header = json.loads(bytes(mm[8:8 + n]))
        base = 8 + n
        files = {}
        for name in {ref for _, ref in spec["entries"] if isinstance(ref, str)}:
            info = header.get(name)
            if info is None:
                raise CheckpointError(f"weights = {path!r} has no `{name}` any more: run the check again")
            dtype = _DTYPES.get(info["dtype"])
            if dtype is None:
                raise CheckpointError(f"weights = {path!r}: `{name}` is {info['dtype']}, which golden does not read")
            start, end = info["data_offsets"]
            shape = tuple(int(d) for d in info["shape"])
            np_dtype = DTYPES[CODES[dtype]][1]
            count = (end - start) // np_dtype.itemsize
            array = np.frombuffer(mm, dtype=np_dtype, count=count, offset=base + start).reshape(shape)
            files[name] = WireTensor(dtype, array)
        return [(name, files[ref] if isinstance(ref, str) else self.values[name]) for name, ref in spec["entries"]]

    def reload(self):
        """Map the file again, and forget the module built from it: after a reference wrote into
        a parameter in place, the mapping's pages hold what it wrote."""
        self.modules.clear()
        self.entries = self._map()

    def release(self):
        """Give the mapped pages read so far back to the page cache (they are read again on use)."""
        try:
            self._mapping.madvise(mmap.MADV_DONTNEED)
        except (AttributeError, OSError, ValueError):
            pass


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
