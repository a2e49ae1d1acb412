"""Shared memory for large tensors: the other half of the runtime's `shm.rs`.

A frame's small tensors travel inline, in the pipe. A tensor of at least `min` bytes (the runtime
says how many in each request) travels through an *arena*: a memfd that its writer alone creates,
grows and writes, and that the other process maps read-only. Each process writes its own arena —
the runtime its requests, the worker its answers — and reuses it from frame to frame: fresh
shared pages cost more than copying into pages already there (on a VM, ~4 µs a page), so a new
segment per frame would be no faster than the pipe.

* **Named by its writer, reached through /proc.** A frame carries its arena as
  `{"pid", "fd", "name", "size"}`; the reader opens `/proc/<pid>/fd/<fd>`, which the kernel allows
  only to the same user (the ptrace access check: the same rule as the shared worker's socket).
  It then checks, on the descriptor it opened, that the file is the memfd named `name`
  (`golden-<pid>-<n>`), that `pid` is its peer's, that it is sealed against shrinking (only a memfd
  can be sealed, and a sealed one can never be cut under a mapping: no SIGBUS), and that it is at
  least `size` bytes long. Every tensor's offset and length are checked against `size`.
* **Nothing to leak.** A memfd has no name in any folder: its memory is freed when the last
  descriptor and mapping of it are gone, however its processes end (a SIGKILL included). The
  memfds carry the creator's pid in their name, as `/proc/<pid>/maps` shows.
* **Bounded in time.** An arena larger than `KEEP` bytes is dropped by both sides after `IDLE`
  seconds without a request; the next large frame makes a new one.
* **Optional.** The runtime offers its arena in `hello`; the worker answers with its own, or why it
  cannot (no memfd_create, /proc closed to it). Either side then keeps to the pipe, and the runtime
  says so once.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import stat

import numpy as np

# An arena larger than this is released after IDLE seconds without a request.
KEEP = 16 << 20
IDLE = 1.0
# Offsets of tensors in an arena are multiples of this (a cache line; NumPy and torch like it).
ALIGN = 64
# Arenas grow in steps of at least this.
GRAIN = 1 << 20

_NAME = re.compile(r"golden-([0-9]{1,10})-([0-9]{1,20})")
_counter = 0


class Unavailable(Exception):
    """Shared memory cannot be used: the reason, for the runtime's message."""


class BadArena(Exception):
    """A frame names an arena that is not what it claims to be (a protocol error)."""


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class WriteArena:
    """This process's arena: a memfd sealed against shrinking, mapped read-write, grown on demand."""

    def __init__(self, size: int = 4096):
        global _counter
        if not hasattr(os, "memfd_create"):
            raise Unavailable("this Python has no os.memfd_create")
        _counter += 1
        self.name = f"golden-{os.getpid()}-{_counter}"
        try:
            self.fd = os.memfd_create(self.name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as e:
            raise Unavailable(f"memfd_create: {e.strerror}") from None
        self.size = 0
        self.map = None
        try:
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            self.reserve(size)
        except (OSError, Unavailable) as e:
            self.close()
            raise Unavailable(str(e)) from None

    def describe(self) -> dict:
        return {"pid": os.getpid(), "fd": self.fd, "name": self.name, "size": self.size}

    def reserve(self, size: int) -> None:
        """Make the arena at least `size` bytes (its pages allocated now: a full memory fails here,
        with an error, rather than as a SIGBUS when written)."""
        if size <= self.size:
            return
        new = (size + GRAIN - 1) // GRAIN * GRAIN if size > 4096 else 4096
        try:
            os.ftruncate(self.fd, new)
            os.posix_fallocate(self.fd, 0, new)
        except OSError as e:
            raise Unavailable(f"growing shared memory to {new} bytes: {e.strerror}") from None
        # The old map may still be exported (a view not yet collected): leave it to the collector.
        self.map = mmap.mmap(self.fd, new, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.size = new

    def write(self, offset: int, array: np.ndarray) -> None:
        """Copy `array` (any strides) to `offset`, C order."""
        view = np.frombuffer(self.map, dtype=array.dtype, count=array.size, offset=offset)
        np.copyto(view.reshape(array.shape), array, casting="no")

    def close(self) -> None:
        self.map = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class ReadArena:
    """The peer's arena, mapped read-only here."""

    def __init__(self, desc, peer: int | None):
        if not isinstance(desc, dict):
            raise BadArena(f"the shared memory is described by {desc!r}, not an object")
        pid, fd, name, size = (desc.get(k) for k in ("pid", "fd", "name", "size"))
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (pid, fd, size)):
            raise BadArena(f"the shared memory's pid, fd and size are not all whole numbers: {desc}")
        match = _NAME.fullmatch(name) if isinstance(name, str) else None
        if match is None or int(match.group(1)) != pid:
            raise BadArena(f"the shared memory's name {name!r} is not golden-{pid}-<n>")
        if peer is not None and pid != peer:
            raise BadArena(f"the shared memory belongs to process {pid}, not to this worker's peer {peer}")
        if not (0 <= fd < 1 << 31 and 0 <= size <= 1 << 40):
            raise BadArena(f"the shared memory's fd {fd} or size {size} is out of range")
        self.name = name
        self.key = (pid, fd, name)
        try:
            self.fd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise BadArena(f"cannot open the shared memory {name} (/proc/{pid}/fd/{fd}): {e.strerror}") from None
        try:
            self._check(name)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = 0
        self.map = None
        self.cover(size)

    def _check(self, name: str) -> None:
        link = os.readlink(f"/proc/self/fd/{self.fd}")
        if link not in (f"/memfd:{name} (deleted)", f"/memfd:{name}"):
            raise BadArena(f"/proc/.../fd of the shared memory {name} is {link!r}, not that memfd")
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            raise BadArena(f"the shared memory {name} is not a regular file")
        try:
            seals = fcntl.fcntl(self.fd, fcntl.F_GET_SEALS)
        except OSError:
            seals = 0
        if not seals & fcntl.F_SEAL_SHRINK:
            raise BadArena(f"the shared memory {name} is not sealed against shrinking")

    def cover(self, size: int) -> None:
        """Map at least `size` bytes (the writer grew the arena)."""
        if size <= self.size:
            return
        actual = os.fstat(self.fd).st_size
        if actual < size:
            raise BadArena(f"the shared memory {self.name} has {actual} bytes, not the {size} the frame says")
        self.map = mmap.mmap(self.fd, actual, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) if actual else None
        self.size = actual

    def array(self, offset: int, nbytes: int, dtype: np.dtype, shape) -> np.ndarray:
        """A read-only view of `nbytes` at `offset` (already checked against the frame's size)."""
        if offset < 0 or offset + nbytes > self.size:
            raise BadArena(f"bytes {offset}..{offset + nbytes} are outside the shared memory ({self.size} bytes)")
        if nbytes == 0:
            return np.zeros(shape, dtype=dtype)
        count = nbytes // dtype.itemsize
        return np.frombuffer(self.map, dtype=dtype, count=count, offset=offset).reshape(shape)

    def close(self) -> None:
        self.map = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Session:
    """One connection's shared memory, on the worker's side: the peer's arena as last attached,
    this worker's own arena, and what the current request allows."""

    def __init__(self, peer: int | None):
        self.peer = peer
        self.reader: ReadArena | None = None
        self.writer: WriteArena | None = None
        # From the current request's `$shm`: the smallest tensor to send through the arena (None:
        # the runtime does not take answers through shared memory).
        self.min: int | None = None
        self.offered = None
        # Why the worker's own arena could not be made or grown: told to the runtime once, with the
        # next answer (`$shm_fallback`), which says so.
        self.fallback: str | None = None
        self.fallback_said = False
        self.broken = False

    def request(self, desc) -> None:
        """A request arrived with `desc` (its `$shm` block, or None)."""
        self.offered = desc
        self.min = None
        if isinstance(desc, dict) and isinstance(desc.get("min"), int) and not self.broken:
            self.min = max(int(desc["min"]), 1)

    def attach(self, desc) -> ReadArena:
        """The peer's arena that `desc` names, attached (once per arena; re-mapped when it grew)."""
        if not isinstance(desc, dict):
            raise BadArena("a tensor lives in shared memory, but the frame names none")
        key = (desc.get("pid"), desc.get("fd"), desc.get("name"))
        if self.reader is None or self.reader.key != key:
            if self.reader is not None:
                self.reader.close()
                self.reader = None
            self.reader = ReadArena(desc, self.peer)
        size = desc.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= 1 << 40:
            raise BadArena(f"the shared memory's size {size!r} is not a byte count")
        self.reader.cover(size)
        return self.reader

    def hello(self) -> dict:
        """The answer to `hello`'s offer: this worker's arena, or why there is none."""
        if self.offered is None:
            return {}
        try:
            self.attach(self.offered)
            self.writer = WriteArena()
        except (BadArena, Unavailable, OSError) as e:
            self.broken = True
            self.min = None
            return {"shm_error": str(e)}
        return {"shm": self.writer.describe()}

    def arena_for(self, nbytes: int) -> WriteArena | None:
        """This worker's arena with room for `nbytes`, or None (and why, once) when it cannot have it."""
        try:
            if self.writer is None:
                self.writer = WriteArena(nbytes)
            self.writer.reserve(nbytes)
            return self.writer
        except Unavailable as e:
            if self.fallback is None:
                self.fallback = str(e)
            return None

    def large(self) -> bool:
        """Whether an arena worth releasing when idle is held."""
        return any(a is not None and a.size > KEEP for a in (self.reader, self.writer))

    def release(self) -> None:
        """Drop both arenas (idle): the next large frame makes or maps new ones."""
        for arena in (self.reader, self.writer):
            if arena is not None:
                arena.close()
        self.reader = self.writer = None

    def close(self) -> None:
        self.release()
