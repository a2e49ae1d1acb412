//! The tensor-file readers of the `golden` tool against files PyTorch and NumPy wrote
//! (`files/tests/fixtures/tensor_files/`, made by its `make.py`, whose `expected.json` says what PyTorch
//! sees in each): names in the file's order, dtypes, shapes and values. Scalars and 0-d tensors,
//! non-contiguous views, shared storages, int8 and bf16 included.

use golden_files::formats;
use serde_json::Value as Json;
use std::path::Path;

fn fixtures() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tensor_files"
    ))
}

#[test]
fn every_fixture_reads_as_pytorch_sees_it() {
    let expected: Json =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap())
            .unwrap();
    let files = expected.as_object().unwrap();
    assert_eq!(files.len(), 7);
    for (file, tensors) in files {
        let contents = formats::read(&fixtures().join(file)).unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = contents.tensors.iter().map(|(n, _)| n.as_str()).collect();
        let want: Vec<&str> = tensors
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        // safetensors keeps no order but its data's; the others keep the saved object's order.
        if file.ends_with(".safetensors") {
            let mut sorted = want.clone();
            sorted.sort();
            let mut got = names.clone();
            got.sort();
            assert_eq!(got, sorted, "{file}");
        } else {
            assert_eq!(names, want, "{file}");
        }
        for t in tensors.as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            let (_, got) = contents.tensors.iter().find(|(n, _)| n == name).unwrap();
            assert_eq!(
                got.dtype.name(),
                t["dtype"].as_str().unwrap(),
                "{file}: {name}"
            );
            let shape: Vec<usize> = serde_json::from_value(t["shape"].clone()).unwrap();
            assert_eq!(got.shape, shape, "{file}: {name}");
            let values: Vec<f64> = serde_json::from_value(t["values"].clone()).unwrap();
            assert_eq!(got.to_f64(), values, "{file}: {name}");
        }
    }
}

#[test]
fn what_is_not_a_tensor_is_named_and_skipped() {
    let c = formats::read(&fixtures().join("checkpoint.pt")).unwrap();
    assert_eq!(c.skipped, ["`tag` (Str(\"run-1\"))"]);
}

#[test]
fn unreadable_files_say_why() {
    let dir = std::env::temp_dir().join(format!("golden-tensor-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let cases = [
        (
            write("notes.txt", b"hello"),
            "unknown format: golden reads .npy, .npz, .safetensors",
        ),
        (
            write("legacy.pt", b"\x80\x02\x8a\x0al\xfc\x9cF\xf9"),
            "not a zip archive: golden reads torch.save's zip format",
        ),
        (
            write("empty.npz", b"PK\x05\x06"),
            "not a readable .npz (zip) archive",
        ),
    ];
    for (path, why) in cases {
        let e = formats::read(&path)
            .err()
            .unwrap_or_else(|| panic!("{path:?} read"));
        assert!(
            e.contains(why) && e.contains(&*path.to_string_lossy()),
            "{e}"
        );
    }
    let missing = formats::read(&dir.join("missing.npy")).err().unwrap();
    assert!(missing.contains("No such file"), "{missing}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_pickle_that_calls_os_system_is_read_not_run() {
    let marker = Path::new("/tmp/golden-was-pickled");
    let _ = std::fs::remove_file(marker);
    let c = formats::read(&fixtures().join("evil.pt")).unwrap();
    assert!(c.tensors.is_empty());
    assert_eq!(c.skipped, ["`` (os.system)"]);
    assert!(!marker.exists(), "reading the file ran its command");
}
