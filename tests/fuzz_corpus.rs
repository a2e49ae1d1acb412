//! The fuzz corpus, replayed on stable in every test run: each input of `fuzz/corpus/<target>/` and
//! `fuzz/regressions/<target>/` goes through its decoder, which must return (a value or an error)
//! without panicking, and some of them (the seeds' descendants) must decode. Fuzzing itself needs nightly:
//! `cargo +nightly fuzz run <target>` in `fuzz/`.

use golden::answers::store::{seal, Store};
use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
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

#[test]
fn wire_frames() {
    let decoded = replay("wire_frame", |b| {
        golden::python::wire::read_frame(&mut &b[..]).is_ok()
    });
    assert!(decoded > 0, "no input of the corpus is a valid frame");
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

#[test]
fn tensor_files() {
    // The first byte picks the extension, as in fuzz/fuzz_targets/tensor_file.rs.
    let decoded = replay("tensor_file", |b| {
        let Some((&which, bytes)) = b.split_first() else {
            return false;
        };
        let name = ["x.pt", "x.npz", "x.safetensors", "x.bin"][which as usize % 4];
        golden_files::formats::read_bytes(bytes, Path::new(name)).is_ok()
    });
    assert!(decoded > 0, "no input of the corpus is a valid tensor file");
}

#[test]
fn npy_files() {
    let decoded = replay("npy", |b| golden_files::npy::decode(b).is_ok());
    assert!(decoded > 0, "no input of the corpus is a valid .npy file");
}
