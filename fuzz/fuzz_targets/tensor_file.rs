//! The `golden` tool's tensor-file readers (`.npz`, `.safetensors`, `.pt` with its restricted
//! unpickler): any bytes give tensors or an error, never a panic, a hang or an unbounded
//! allocation. The first byte picks the extension the reader is told.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let name = ["x.pt", "x.npz", "x.safetensors", "x.bin"][which as usize % 4];
    let _ = golden_files::formats::read_bytes(bytes, Path::new(name));
});
