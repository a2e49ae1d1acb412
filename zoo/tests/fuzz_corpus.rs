//! The fuzz corpus, replayed on stable in every test run: each input of `fuzz/corpus/<target>/` and
//! `fuzz/regressions/<target>/` goes through its decoder, which must return (a value or an error)
//! without panicking, and some of them (the seeds' descendants) must decode. Fuzzing itself needs nightly:
//! `cargo +nightly fuzz run <target>` in `fuzz/`.
//!
//! Tensor files are read within the fuzz target's read budget, and a counting allocator checks
//! that no input makes a reader allocate beyond it: the bombs of `fuzz/regressions/tensor_file/`
//! (`fuzz/make_bombs.py`: small files that would expand to gigabytes, or walk 2^64 paths) must be
//! refused, quickly.

use golden::internal::answers::store::{seal, Store};
use golden_files::formats::{read_bytes_within, Contents};
use golden_files::Budget;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Counts the bytes each thread has allocated and not freed, and their peak.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    let _ = LIVE.try_with(|live| {
        live.set(live.get() + delta);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
    });
}

// SAFETY: every call is passed on to the system allocator unchanged; the counters are plain
// thread-local cells that never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        note(-(layout.size() as isize));
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// `f`'s result, the most it allocated at once on this thread beyond what was allocated before,
/// and what it left allocated (what it returns is dropped: a leak).
fn peak_of<T: Copy>(f: impl FnOnce() -> T) -> (T, usize, isize) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let out = f();
    let left = LIVE.with(Cell::get) - start;
    (out, (PEAK.with(Cell::get) - start).max(0) as usize, left)
}

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut files: Vec<PathBuf> = ["corpus", "regressions"]
        .iter()
        .filter_map(|dir| std::fs::read_dir(root.join(dir).join(target)).ok())
        .flatten()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Run `decode` on every input of `target`; a panic fails with the input's path. Returns how many
/// inputs decoded.
fn replay(target: &str, decode: impl Fn(&[u8]) -> bool + std::panic::RefUnwindSafe) -> usize {
    let files = inputs(target);
    assert!(
        files.len() >= 2,
        "fuzz/corpus/{target} is missing: the corpus is committed"
    );
    let mut decoded = 0;
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        match std::panic::catch_unwind(|| decode(&bytes)) {
            Ok(true) => decoded += 1,
            Ok(false) => {}
            Err(_) => panic!("{} makes the {target} decoder panic", file.display()),
        }
    }
    eprintln!("{target}: {} inputs, {decoded} decoded", files.len());
    decoded
}

/// The wire_frame target's stand-in for shared memory: an arena of 4 KiB named `golden-1-1`.
fn stand_in_arena<B: From<Vec<u8>>>(
    shm: &serde_json::Value,
    offset: u64,
    len: usize,
) -> Result<B, String> {
    const ARENA: [u8; 4096] = [7; 4096];
    let size = shm["size"].as_u64().expect("checked by the decoder");
    let end = offset
        .checked_add(len as u64)
        .expect("checked by the decoder");
    assert!(
        end <= size,
        "asked for {offset}+{len} of an arena of {size}"
    );
    if shm["name"] != "golden-1-1" || end > ARENA.len() as u64 {
        return Err("not the stand-in arena".into());
    }
    Ok(ARENA[offset as usize..end as usize].to_vec().into())
}

#[test]
fn wire_frames() {
    let decoded = replay("wire_frame", |b| {
        golden::internal::python::wire::read_frame(&mut &b[..]).is_ok()
    });
    assert!(decoded > 0, "no input of the corpus is a valid frame");
    // Frames with tensors in shared memory, as the worker's streams carry them.
    let shared = replay("wire_frame", |b| {
        golden::internal::python::wire::read_raw_frame(&mut &b[..])
            .is_ok_and(|raw| raw.has_shared() && raw.resolve(stand_in_arena).is_ok())
    });
    assert!(
        shared > 0,
        "no input of the corpus has a tensor in shared memory"
    );
}

#[test]
fn golden_stores() {
    let path = Path::new("corpus.golden");
    let decoded = replay("golden_store", |b| {
        let plain = Store::decode(path, b.to_vec()).is_ok();
        Store::decode(path, seal(b)).is_ok() || plain
    });
    assert!(decoded > 0, "no input of the corpus is a valid store");
}

/// The read budget of fuzz/fuzz_targets/tensor_file.rs.
const FUZZ_BUDGET: u64 = 16 << 20;

/// A tensor-file input read as fuzz/fuzz_targets/tensor_file.rs reads it: the first byte picks
/// the extension.
fn tensor_file(b: &[u8]) -> Option<Result<Contents, String>> {
    let (&which, bytes) = b.split_first()?;
    let name = ["x.pt", "x.npz", "x.safetensors", "x.bin"][which as usize % 4];
    let budget = Budget::fixed(FUZZ_BUDGET, "the fuzz target's");
    Some(read_bytes_within(bytes, Path::new(name), budget))
}

#[test]
fn tensor_files() {
    let decoded = replay("tensor_file", |b| tensor_file(b).is_some_and(|r| r.is_ok()));
    assert!(decoded > 0, "no input of the corpus is a valid tensor file");
}

#[test]
fn no_tensor_file_allocates_beyond_its_budget_and_bombs_are_refused_quickly() {
    let bombs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/tensor_file");
    let mut refused = 0;
    for file in inputs("tensor_file") {
        let bytes = std::fs::read(&file).unwrap();
        let start = Instant::now();
        let (outcome, peak, left) = peak_of(|| {
            tensor_file(&bytes).map(|r| r.as_ref().map(|c| c.tensors.len()).map_err(|_| ()))
        });
        assert_eq!(
            left,
            0,
            "{}: reading it leaked {left} bytes",
            file.display()
        );
        let took = start.elapsed();
        // The budget, the input (read into memory, and the zip's index of it), and the
        // reader's own small change.
        let bound = FUZZ_BUDGET as usize + 4 * bytes.len() + (1 << 20);
        assert!(
            peak <= bound,
            "{}: reading it allocated {peak} bytes at once, beyond {bound}",
            file.display()
        );
        if file.starts_with(&bombs) {
            // Refused, or (a bomb for a printer, not a reader) read as holding no tensor.
            let e = match outcome {
                Some(Err(())) => tensor_file(&bytes).unwrap().err().unwrap_or_default(),
                Some(Ok(0)) => "read as holding no tensor".into(),
                _ => panic!("{}: the bomb was read: {outcome:?}", file.display()),
            };
            assert!(
                took < Duration::from_secs(10),
                "{}: refused in {took:?}",
                file.display()
            );
            eprintln!(
                "{}: {took:?}, {} KiB at most: {e}",
                file.file_name().unwrap().to_string_lossy(),
                peak >> 10
            );
            refused += 1;
        }
    }
    assert!(
        refused >= 9,
        "fuzz/regressions/tensor_file holds the bombs of make_bombs.py"
    );
}

#[test]
fn npy_files() {
    let decoded = replay("npy", |b| golden_files::npy::decode(b).is_ok());
    assert!(decoded > 0, "no input of the corpus is a valid .npy file");
}
