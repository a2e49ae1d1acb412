//! The `golden` tool's tensor-file readers (`.npz`, `.safetensors`, `.pt` with its restricted
//! unpickler): any bytes give tensors or an error, never a panic, a hang or an allocation beyond
//! the file's read budget. The first byte picks the extension the reader is told.
//!
//! The budget is 16 MiB (zoo/tests/fuzz_corpus.rs replays the corpus with the same one and counts
//! what it allocates): run with `-malloc_limit_mb=64` so that an allocation the budget missed is
//! a crash, e.g. `cargo +nightly fuzz run tensor_file -- -malloc_limit_mb=64 -rss_limit_mb=512`.
#![no_main]

use golden_files::formats::read_bytes_within;
use golden_files::Budget;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let name = ["x.pt", "x.npz", "x.safetensors", "x.bin"][which as usize % 4];
    let budget = Budget::fixed(16 << 20, "the fuzz target's");
    let _ = read_bytes_within(bytes, Path::new(name), budget);
});
