//! Shared memory for large tensors: the other half of `reference_py/golden_ref/shm.py`.
//!
//! A frame's small tensors travel inline, in the pipe (or the shared worker's socket). A tensor of
//! at least [`DEFAULT_MIN`] bytes travels through an *arena* instead: a memfd that one side alone
//! creates, grows and writes, and that the other maps read-only. Each side writes its own — the
//! runtime its requests ([`WriteArena`]), the worker its answers (read here as a [`ReadArena`]) —
//! and reuses it from one frame to the next: fresh shared pages cost more than copying into pages
//! that are already there (on this project's VMs ~4 µs a page, 16,384 pages for 64 MiB), so a new
//! segment per frame would be no faster than the pipe.
//!
//! * **Reached through `/proc`, by the same user only.** A frame names its arena as
//!   `{"pid", "fd", "name", "size"}`; the reader opens `/proc/<pid>/fd/<fd>`, which the kernel
//!   allows only to the same user (its ptrace access check: what the shared worker's socket asks
//!   too). On the descriptor it opened, the reader checks that the file is the memfd named `name`
//!   (`golden-<pid>-<n>`), that `pid` is the worker's, that the memfd is sealed against shrinking
//!   (only a memfd can carry seals, and a sealed one can never be cut under a mapping, so reading
//!   it cannot raise SIGBUS), and that it holds at least `size` bytes; every tensor's offset and
//!   length were checked against `size` when the frame was decoded. A frame cannot make the runtime
//!   open, map or read anything else.
//! * **Nothing to leak.** A memfd has no name in any folder (nothing in `/dev/shm`): its memory is
//!   freed once the last descriptor and mapping of it are gone, however its processes end, SIGKILL
//!   included. A live one carries its creator's pid in its name (`/proc/<pid>/maps` shows
//!   `/memfd:golden-<pid>-<n>`).
//! * **Copied out on arrival.** An answer's tensors are copied from the worker's arena into memory
//!   of the runtime's own before the next request is sent (so before the worker can write its
//!   arena again); requests are read by the worker as read-only views, which its backends copy
//!   before a reference sees them.
//! * **Released when idle.** An arena larger than [`KEEP`] is dropped by both sides after [`IDLE`]
//!   without a request; the next large frame makes a new one.
//! * **Optional.** The runtime offers its arena in `hello`; the worker answers with its own, or why
//!   it has none. When either side cannot (no memfd, `/proc` closed to it, memory that cannot be
//!   allocated) tensors travel inline, and the runtime says so once. `GOLDEN_SHM=off` turns it off.

use bytes::Bytes;
use golden_files::HostTensor;
use serde_json::{json, Value as Json};
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

/// Tensors of at least this many bytes travel through shared memory (below it, the pipe is as fast:
/// `cargo bench -p golden --bench worker` prints where the two cross).
pub const DEFAULT_MIN: usize = 256 << 10;
/// An arena larger than this is released after [`IDLE`] without a request.
pub const KEEP: usize = 16 << 20;
/// How long a large arena outlives its last request.
pub const IDLE: Duration = Duration::from_secs(1);
/// Tensors start at multiples of this in an arena (a cache line).
pub const ALIGN: usize = 64;
/// Arenas grow in steps of this.
const GRAIN: usize = 1 << 20;
/// Received tensors of at least this size are copied into memory advised for huge pages.
const HUGE: usize = 2 << 20;

/// Say once per process why large tensors travel through the pipe although shared memory is on.
pub fn note_unavailable(why: &str) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        eprintln!(
            "golden: shared memory is not available for tensors ({why}); large tensors travel \
             through the worker's pipe instead, which is slower (GOLDEN_SHM=off silences this)"
        );
    });
}

/// `n` rounded up to a multiple of [`ALIGN`].
pub fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// A memory mapping, unmapped when dropped.
struct Mapping {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is plain memory that this value owns; moving it to another thread moves the
// ownership, and it is only read through shared references.
unsafe impl Send for Mapping {}
// SAFETY: see above; writes go through `&mut WriteArena` only.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes of `fd` (shared), or anonymous memory when `fd` is `None`.
    fn new(fd: Option<&File>, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        let (flags, raw) = match fd {
            Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a fresh mapping chosen by the kernel (no address given); its result is checked.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, raw, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            std::ptr::NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the range is this mapping's, and nothing refers to it any more.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Anonymous memory holding a received tensor (the owner of its `Bytes`).
struct Owned(Mapping);

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes, written once before this value was made
        // and never again.
        unsafe { std::slice::from_raw_parts(self.0.ptr.as_ptr(), self.0.len) }
    }
}

/// A copy of `len` bytes at `src` (shared memory) in memory of this process's own.
///
/// # Safety
/// `src..src + len` must be mapped and readable.
unsafe fn copy_out(src: *const u8, len: usize) -> Bytes {
    if len >= HUGE {
        if let Ok(map) = Mapping::new(None, len, true) {
            // SAFETY: `map` is `len` fresh writable bytes; `src` is readable for `len` (the
            // caller's promise). Huge pages, where the system has them: faulting in 64 MiB a
            // 4 KiB page at a time costs more than copying it.
            unsafe {
                libc::madvise(map.ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE);
                std::ptr::copy_nonoverlapping(src, map.ptr.as_ptr(), len);
            }
            return Bytes::from_owner(Owned(map));
        }
    }
    let mut v = Vec::<u8>::with_capacity(len);
    // SAFETY: `v` has capacity `len`, all of which the copy initialises.
    unsafe {
        std::ptr::copy_nonoverlapping(src, v.as_mut_ptr(), len);
        v.set_len(len);
    }
    Bytes::from(v)
}

#[cfg(target_os = "linux")]
mod sys {
    use std::fs::File;
    use std::io;
    use std::os::unix::io::{AsRawFd, FromRawFd};

    fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    }

    /// A new memfd, sealed against shrinking.
    pub fn memfd(name: &str) -> io::Result<File> {
        let c = std::ffi::CString::new(name).map_err(io::Error::other)?;
        // SAFETY: `c` is a NUL-terminated name that outlives the call.
        let fd = check(unsafe {
            libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        })?;
        // SAFETY: `fd` was just created and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        // SAFETY: fcntl on a descriptor this function owns.
        check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) })?;
        Ok(file)
    }

    /// Grow `file` to `len` bytes, its pages allocated now (so that a full memory is an error
    /// here, not a SIGBUS when the mapping is written).
    pub fn grow(file: &File, len: usize) -> io::Result<()> {
        file.set_len(len as u64)?;
        let len = libc::off_t::try_from(len).map_err(io::Error::other)?;
        // SAFETY: fallocate on a descriptor the caller owns.
        check(unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) }).map(drop)
    }

    /// Whether `file` is sealed against shrinking.
    pub fn sealed(file: &File) -> bool {
        // SAFETY: fcntl on a descriptor the caller owns; an error (not a memfd) is 0 seals.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        seals > 0 && seals & libc::F_SEAL_SHRINK != 0
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::fs::File;
    use std::io;

    pub fn memfd(_name: &str) -> io::Result<File> {
        Err(io::Error::other("shared memory needs Linux's memfd"))
    }
    pub fn grow(_file: &File, _len: usize) -> io::Result<()> {
        Err(io::Error::other("shared memory needs Linux's memfd"))
    }
    pub fn sealed(_file: &File) -> bool {
        false
    }
}

/// This process's arena: a memfd sealed against shrinking, mapped read-write, grown on demand.
pub struct WriteArena {
    file: File,
    name: String,
    size: usize,
    map: Option<Mapping>,
}

impl WriteArena {
    /// A new arena of at least `size` bytes, named `golden-<pid>-<n>`.
    pub fn new(size: usize) -> io::Result<WriteArena> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed) + 1;
        let name = format!("golden-{}-{n}", std::process::id());
        let file = sys::memfd(&name)?;
        let mut arena = WriteArena {
            file,
            name,
            size: 0,
            map: None,
        };
        arena.reserve(size)?;
        Ok(arena)
    }

    /// Make the arena at least `size` bytes (pages allocated now).
    pub fn reserve(&mut self, size: usize) -> io::Result<()> {
        if size <= self.size {
            return Ok(());
        }
        let new = size.max(4096).div_ceil(GRAIN) * GRAIN;
        let new = if size <= 4096 { 4096 } else { new };
        sys::grow(&self.file, new)?;
        self.map = None;
        self.map = Some(Mapping::new(Some(&self.file), new, true)?);
        self.size = new;
        Ok(())
    }

    /// Copy `bytes` to `offset`.
    ///
    /// # Panics
    /// If they do not fit (the caller reserved the room).
    pub fn write(&mut self, offset: usize, bytes: &[u8]) {
        let map = self.map.as_ref().expect("a reserved arena is mapped");
        assert!(offset
            .checked_add(bytes.len())
            .is_some_and(|end| end <= map.len));
        // SAFETY: the range lies within the writable mapping (asserted); `bytes` is another
        // process's memory only if the caller passed such, which is fine for a copy.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                map.ptr.as_ptr().add(offset),
                bytes.len(),
            );
        }
    }

    /// How the frames name it: `{"pid", "fd", "name", "size"}`.
    pub fn describe(&self) -> Json {
        json!({
            "pid": std::process::id(),
            "fd": self.file.as_raw_fd(),
            "name": self.name,
            "size": self.size,
        })
    }

    /// Its size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }
}

/// The worker's arena, mapped read-only here.
pub struct ReadArena {
    file: File,
    /// pid, fd and name, as the frames name it.
    key: (u64, u64, String),
    size: usize,
    map: Option<Mapping>,
}

/// `(pid, fd, name)` of an arena's description.
fn key_of(desc: &Json) -> Option<(u64, u64, String)> {
    Some((
        desc.get("pid")?.as_u64()?,
        desc.get("fd")?.as_u64()?,
        desc.get("name")?.as_str()?.to_string(),
    ))
}

impl ReadArena {
    /// Open and check the arena `desc` names, which must be process `peer`'s.
    pub fn attach(desc: &Json, peer: u32) -> Result<ReadArena, String> {
        let (pid, fd, name) = key_of(desc).ok_or_else(|| {
            format!("the shared memory is described by {desc}, not by its pid, fd and name")
        })?;
        if pid != u64::from(peer) {
            return Err(format!(
                "the shared memory `{name}` belongs to process {pid}, not to the worker ({peer})"
            ));
        }
        let number = name
            .strip_prefix(&format!("golden-{pid}-"))
            .filter(|n| !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit()));
        if number.is_none() {
            return Err(format!(
                "the shared memory's name {name:?} is not golden-{pid}-<number>"
            ));
        }
        if fd > i32::MAX as u64 {
            return Err(format!("the shared memory's descriptor {fd} is not one"));
        }
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = File::open(&path)
            .map_err(|e| format!("cannot open the shared memory `{name}` ({path}): {e}"))?;
        let link = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .map_err(|e| format!("cannot tell what {path} is: {e}"))?;
        let memfd = format!("/memfd:{name}");
        let link = link.to_string_lossy();
        if link != memfd && link != format!("{memfd} (deleted)") {
            return Err(format!(
                "{path} is {link:?}, not the memfd `{name}` the frame names"
            ));
        }
        if !sys::sealed(&file) {
            return Err(format!(
                "the shared memory `{name}` is not sealed against shrinking"
            ));
        }
        Ok(ReadArena {
            file,
            key: (pid, fd, name),
            size: 0,
            map: None,
        })
    }

    /// Whether `desc` names this arena.
    pub fn is(&self, desc: &Json) -> bool {
        key_of(desc).as_ref() == Some(&self.key)
    }

    /// Map at least `size` bytes (the worker grew its arena).
    pub fn cover(&mut self, size: u64) -> Result<(), String> {
        if size <= self.size as u64 {
            return Ok(());
        }
        let actual = self.file.metadata().map_err(|e| e.to_string())?.len();
        if actual < size {
            return Err(format!(
                "the shared memory `{}` has {actual} bytes, not the {size} the frame says",
                self.key.2
            ));
        }
        let len = usize::try_from(actual).map_err(|e| e.to_string())?;
        self.map = None;
        self.map = Some(
            Mapping::new(Some(&self.file), len, false)
                .map_err(|e| format!("cannot map the shared memory `{}`: {e}", self.key.2))?,
        );
        self.size = len;
        Ok(())
    }

    /// A copy of `len` bytes at `offset`.
    pub fn read(&self, offset: u64, len: usize) -> Result<Bytes, String> {
        let end = offset.checked_add(len as u64);
        let Some(map) = self
            .map
            .as_ref()
            .filter(|_| end.is_some_and(|e| e <= self.size as u64))
        else {
            return Err(format!(
                "bytes {offset}+{len} lie outside the shared memory `{}` ({} bytes mapped)",
                self.key.2, self.size
            ));
        };
        // SAFETY: `offset..offset + len` lies within the mapping (checked above), which cannot
        // shrink under it (the memfd is sealed). The worker writes this memory only while it
        // answers a request, and none is pending while an answer is read.
        let copy = unsafe { copy_out(map.ptr.as_ptr().add(offset as usize), len) };
        // The pages just read leave this process's resident memory (the worker's memfd keeps
        // them; a later read faults them in again): otherwise a large answer counted twice here,
        // once mapped and once copied.
        let page = 4096usize;
        let first = (offset as usize).div_ceil(page) * page;
        let last = (offset as usize + len) / page * page;
        if last > first {
            // SAFETY: a range of whole pages inside this process's shared mapping of the memfd;
            // dropping them loses nothing (a shared file mapping reads them back from the file).
            unsafe {
                libc::madvise(
                    map.ptr.as_ptr().add(first).cast(),
                    last - first,
                    libc::MADV_DONTNEED,
                );
            }
        }
        Ok(copy)
    }

    /// Its mapped size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }
}

/// One worker's shared memory, on the runtime's side: this process's arena for the requests, the
/// worker's (once attached) for the answers.
pub struct Link {
    /// The worker's pid: its arena must be its own.
    peer: u32,
    /// Tensors of at least this many bytes go through the arenas; `None`: none do.
    min: Option<usize>,
    writer: Option<WriteArena>,
    reader: Option<ReadArena>,
    last_used: Instant,
}

impl Link {
    /// A link whose arena is offered to the worker in `hello` (its `$shm`, as [`Link::place`]
    /// writes it for every request).
    pub fn offer() -> io::Result<Link> {
        Ok(Link {
            peer: 0,
            min: Some(DEFAULT_MIN),
            writer: Some(WriteArena::new(4096)?),
            reader: None,
            last_used: Instant::now(),
        })
    }

    /// Attach the arena that the worker `peer` answered `hello` with (`info["shm"]`), or say why
    /// the link cannot be used.
    pub fn accept(&mut self, info: &Json, peer: u32) -> Result<(), String> {
        if let Some(why) = info.get("shm_error").and_then(Json::as_str) {
            return Err(format!("the worker cannot use it: {why}"));
        }
        let desc = info
            .get("shm")
            .ok_or("the worker did not answer the offer")?;
        self.peer = peer;
        let mut reader = ReadArena::attach(desc, peer)?;
        reader.cover(desc.get("size").and_then(Json::as_u64).unwrap_or(0))?;
        self.reader = Some(reader);
        Ok(())
    }

    /// Tensors of at least `min` bytes go through shared memory (`None`: none).
    pub fn set_min(&mut self, min: Option<usize>) {
        self.min = min;
    }

    /// The smallest tensor that goes through shared memory.
    pub fn min(&self) -> Option<usize> {
        self.min
    }

    /// Copy the request's large tensors into this process's arena: each tensor's offset (`None`:
    /// inline) and the `$shm` object for the header (`None`: no shared memory this time). When the
    /// arena cannot grow, everything travels inline and the reason is said once.
    pub fn place(&mut self, tensors: &[HostTensor]) -> (Vec<Option<u64>>, Option<Json>) {
        self.last_used = Instant::now();
        let Some(min) = self.min else {
            return (Vec::new(), None);
        };
        let mut offsets = vec![None; tensors.len()];
        let mut end = 0;
        for (i, t) in tensors.iter().enumerate() {
            if t.data.len() >= min {
                offsets[i] = Some(end as u64);
                end = align(end + t.data.len());
            }
        }
        // The arena's description, whenever there is one: `hello` offers it this way.
        let shm = |writer: Option<&WriteArena>| {
            let mut shm = writer.map_or_else(|| json!({}), WriteArena::describe);
            shm["min"] = json!(min);
            shm
        };
        if end == 0 {
            return (Vec::new(), Some(shm(self.writer.as_ref())));
        }
        let grown = match &mut self.writer {
            Some(w) => w.reserve(end),
            None => WriteArena::new(end).map(|w| self.writer = Some(w)),
        };
        if let Err(e) = grown {
            note_unavailable(&format!("growing shared memory to {end} bytes: {e}"));
            return (Vec::new(), Some(shm(self.writer.as_ref())));
        }
        let writer = self.writer.as_mut().expect("made or grown above");
        for (t, offset) in tensors.iter().zip(&offsets) {
            if let Some(offset) = offset {
                writer.write(*offset as usize, &t.data);
            }
        }
        (offsets, Some(shm(self.writer.as_ref())))
    }

    /// Bytes of an answer's tensor in the worker's arena (`desc`, its frame's `$shm`).
    pub fn read(&mut self, desc: &Json, offset: u64, len: usize) -> Result<Bytes, String> {
        self.last_used = Instant::now();
        if !self.reader.as_ref().is_some_and(|r| r.is(desc)) {
            self.reader = None;
            self.reader = Some(ReadArena::attach(desc, self.peer)?);
        }
        let reader = self.reader.as_mut().expect("attached");
        reader.cover(desc.get("size").and_then(Json::as_u64).unwrap_or(0))?;
        reader.read(offset, len)
    }

    /// Bytes of shared memory this link holds mapped.
    pub fn footprint(&self) -> usize {
        self.writer.as_ref().map_or(0, WriteArena::size)
            + self.reader.as_ref().map_or(0, ReadArena::size)
    }

    /// Drop arenas larger than [`KEEP`] when the link has been idle for [`IDLE`] (the worker does
    /// the same with its own); the next large frame makes or maps new ones.
    pub fn release_if_idle(&mut self) {
        if self.footprint() > KEEP && self.last_used.elapsed() >= IDLE {
            self.writer = None;
            self.reader = None;
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use golden_files::WireDType;

    fn tensor(bytes: usize) -> HostTensor {
        HostTensor {
            dtype: WireDType::U8,
            shape: vec![bytes],
            data: (0..bytes)
                .map(|i| (i % 251) as u8)
                .collect::<Vec<_>>()
                .into(),
        }
    }

    fn me() -> u32 {
        std::process::id()
    }

    #[test]
    fn what_one_side_writes_the_other_reads_back() {
        let mut link = Link::offer().unwrap();
        link.set_min(Some(1000));
        let tensors = [tensor(10), tensor(5000), tensor(3 << 20)];
        let (offsets, desc) = link.place(&tensors);
        let desc = desc.unwrap();
        assert_eq!(offsets[0], None, "a small tensor stays inline");
        assert_eq!(desc["min"], 1000);
        // This process plays the worker: its own arena is the one to read.
        link.peer = me();
        for (t, offset) in tensors.iter().zip(&offsets) {
            if let Some(offset) = offset {
                assert_eq!(offset % ALIGN as u64, 0);
                assert_eq!(link.read(&desc, *offset, t.data.len()).unwrap(), t.data);
            }
        }
        assert!(link.footprint() >= 2 * (3 << 20));
    }

    #[test]
    fn an_arena_that_grew_is_mapped_again() {
        let mut writer = WriteArena::new(4096).unwrap();
        let mut reader = ReadArena::attach(&writer.describe(), me()).unwrap();
        reader.cover(4096).unwrap();
        writer.reserve(5 << 20).unwrap();
        writer.write((5 << 20) - 3, b"end");
        let desc = writer.describe();
        assert!(reader.read((5 << 20) - 3, 3).is_err(), "not mapped yet");
        reader.cover(desc["size"].as_u64().unwrap()).unwrap();
        assert_eq!(&reader.read((5 << 20) - 3, 3).unwrap()[..], b"end");
        assert!(reader.read((5 << 20) - 2, 3).is_err(), "past the end");
        assert!(
            reader.read(u64::MAX, 2).is_err(),
            "an offset that overflows"
        );
    }

    fn refused(desc: Json, peer: u32) -> String {
        match ReadArena::attach(&desc, peer) {
            Ok(_) => panic!("{desc} was attached"),
            Err(e) => e,
        }
    }

    #[test]
    fn a_frame_cannot_name_anything_but_the_worker_s_sealed_memfd() {
        let writer = WriteArena::new(4096).unwrap();
        let good = writer.describe();
        // Another process's.
        let e = refused(good.clone(), me() + 1);
        assert!(e.contains("not to the worker"), "{e}");
        // A name that is not the memfd's.
        let mut wrong = good.clone();
        wrong["name"] = json!(format!("golden-{}-999999", me()));
        let e = refused(wrong, me());
        assert!(e.contains("not the memfd"), "{e}");
        let mut path = good.clone();
        path["name"] = json!("../../etc/passwd");
        assert!(refused(path, me()).contains("is not golden-"));
        // A regular file, opened under a golden name: not a memfd.
        let file = File::open("/proc/self/status").unwrap();
        let mut regular = good.clone();
        regular["fd"] = json!(file.as_raw_fd());
        let e = refused(regular, me());
        assert!(e.contains("not the memfd"), "{e}");
        // A memfd of golden's name that is not sealed: it could be cut under a mapping.
        let name = format!("golden-{}-424242", me());
        let c = std::ffi::CString::new(name.clone()).unwrap();
        // SAFETY: a NUL-terminated name; the descriptor is owned by `unsealed` below.
        let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` was just created and is owned by nobody else.
        let unsealed = unsafe { <File as std::os::unix::io::FromRawFd>::from_raw_fd(fd) };
        unsealed.set_len(4096).unwrap();
        let e = refused(
            json!({"pid": me(), "fd": fd, "name": name, "size": 4096}),
            me(),
        );
        assert!(e.contains("not sealed"), "{e}");
        // A descriptor that is not open, and fields that are not numbers.
        let mut closed = good.clone();
        closed["fd"] = json!(1_000_000);
        assert!(refused(closed, me()).contains("cannot open"));
        assert!(refused(json!({"pid": "x"}), me()).contains("not by its pid"));
        // The real one, but bigger than it is.
        let mut reader = ReadArena::attach(&good, me()).unwrap();
        let e = reader.cover(1 << 30).unwrap_err();
        assert!(e.contains("has 4096 bytes, not the 1073741824"), "{e}");
    }

    #[test]
    fn no_shared_memory_when_min_is_none() {
        let mut link = Link::offer().unwrap();
        link.set_min(None);
        let (offsets, desc) = link.place(&[tensor(1 << 20)]);
        assert!(offsets.is_empty() && desc.is_none());
    }

    #[test]
    fn an_idle_large_link_lets_go_of_its_arenas() {
        let mut link = Link::offer().unwrap();
        link.set_min(Some(1));
        link.place(&[tensor(KEEP + 1)]);
        link.release_if_idle();
        assert!(link.footprint() > KEEP, "released at once");
        link.last_used -= IDLE;
        link.release_if_idle();
        assert_eq!(link.footprint(), 0);
        // And makes a new one when needed.
        let (offsets, desc) = link.place(&[tensor(10)]);
        assert_eq!(offsets, [Some(0)]);
        assert!(desc.unwrap()["name"].is_string());
    }
}
