//! The tensor-file readers of the `golden` tool against files PyTorch and NumPy wrote
//! (`files/tests/fixtures/tensor_files/`, made by its `make.py`, whose `expected.json` says what PyTorch
//! sees in each): names in the file's order, dtypes, shapes and values. Scalars and 0-d tensors,
//! non-contiguous views, shared storages, int8 and bf16 included.

use golden_files::formats::{self, Entry, TensorFile};
use golden_files::{Budget, ReadError, WireDType};
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
    assert_eq!(files.len(), 8);
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

fn skipped(file: &str) -> Vec<String> {
    let c = formats::read(&fixtures().join(file)).unwrap();
    c.skipped.iter().map(ToString::to_string).collect()
}

#[test]
fn what_is_not_a_tensor_is_named_and_skipped() {
    assert_eq!(skipped("checkpoint.pt"), ["`tag` (a string)"]);
    // A container of nothing but such values is one entry, saying what it holds.
    assert_eq!(
        skipped("not_tensors.pt"),
        [
            "`config` (a dict of 3 strings)",
            "`scheduler` (None)",
            "`tags` (a list of 2 strings)",
            "`args` (a `argparse.Namespace` object, never built)",
            "`buffers` (an empty dict)",
            "`extra.why` (a string)",
        ]
    );
    // An .npz entry that is not an array.
    let dir = std::env::temp_dir().join(format!("golden-skipped-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let npz = dir.join("notes.npz");
    let mut bytes = std::fs::read(fixtures().join("arrays.npz")).unwrap();
    // Rename `b.npy` to `b.txt` in both the local header and the central directory.
    for i in 0..bytes.len() - 5 {
        if &bytes[i..i + 5] == b"b.npy" {
            bytes[i + 2..i + 5].copy_from_slice(b"txt");
        }
    }
    std::fs::write(&npz, bytes).unwrap();
    let c = formats::read(&npz).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(c.tensors.len(), 1);
    assert_eq!(c.skipped[0].to_string(), "`b.txt` (not a .npy array)");
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
    assert_eq!(
        c.skipped[0].to_string(),
        "`evil` (what `os.system(...)` returns, never called)"
    );
    assert!(!marker.exists(), "reading the file ran its command");
}

fn within(file: &str, budget: u64) -> TensorFile {
    TensorFile::open_with(&fixtures().join(file), &|_| {
        Budget::fixed(budget, "set by the test")
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn opening_a_file_reads_names_and_shapes_but_no_tensor() {
    // 100 views of one 4 KiB storage, 4 MiB each once copied: listed within 1 MiB (the pickle's
    // objects and names).
    let f = within("bomb_views.pt", 1 << 20);
    assert_eq!(f.entries().len(), 100);
    assert_eq!(
        f.entries()[7],
        Entry {
            name: "v7".into(),
            dtype: WireDType::F32,
            shape: vec![1024, 1024]
        }
    );
    // Three deflated arrays of 16 MiB: their headers, within 64 KiB.
    let f = within("bomb_zeros.npz", 64 << 10);
    let names: Vec<&str> = f.entries().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["z0", "z1", "z2"]);
    assert_eq!(f.entries()[2].shape, [1 << 22]);
    assert!(f.budget().used() < 1024, "{}", f.budget().used());
}

#[test]
fn copies_and_inflated_entries_cost_budget_and_shared_storages_do_not() {
    let mut f = within("bomb_views.pt", 14 << 20);
    let opened = f.budget().used();
    for i in 0..3 {
        f.load(i).unwrap();
    }
    assert_eq!(f.budget().used() - opened, 12 << 20, "three 4 MiB copies");
    let ReadError::OverBudget(over) = f.load(3).unwrap_err() else {
        panic!("not refused for its size")
    };
    assert_eq!(over.entry, "`v3` (a view that is not contiguous, copied)");
    assert_eq!(
        (over.would_reach, over.limit),
        (opened + (16 << 20), 14 << 20)
    );
    // A contiguous view is a slice of its storage, which is a slice of the file; a transposed
    // one is a copy.
    let mut f = within("state_dict.pt", 1 << 20);
    let i = |name: &str| f.find(name).unwrap();
    let (w, wt, row) = (i("layers.0.weight"), i("layers.0.weight_t"), i("row"));
    let weight = f.load(w).unwrap();
    let row = f.load(row).unwrap();
    let before = f.budget().used();
    assert_eq!(
        row.data.as_ptr(),
        weight.data[16..].as_ptr(),
        "row 1 of a 3×4 storage"
    );
    f.load(wt).unwrap();
    assert_eq!(f.budget().used() - before, 48, "the transpose is copied");
    // A deflated entry costs what it inflates to, before it is inflated.
    let mut f = within("bomb_zeros.npz", 24 << 20);
    f.load(0).unwrap();
    let e = f.load(1).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "`z1.npy` (inflated) would expand the file to 32 MiB in memory, over its \
                       read budget of 24 MiB (set by the test); if you trust the file, raise the \
                       budget with a larger read budget (at least 33 MiB)"
        ),
        "{e}"
    );
}

#[test]
fn the_default_budget_refuses_a_small_file_that_expands_hugely() {
    // 400 MiB of copies from 13 KiB: the 64th 4 MiB view goes over 256 MiB.
    let mut f = TensorFile::open(&fixtures().join("bomb_views.pt")).unwrap();
    let refused = (0..f.entries().len())
        .find_map(|i| f.load(i).err())
        .unwrap();
    let ReadError::OverBudget(over) = &refused else {
        panic!("{refused}")
    };
    assert_eq!(over.entry, "`v63` (a view that is not contiguous, copied)");
    assert_eq!(over.limit, 256 << 20);
    assert_eq!(
        over.origin,
        "the default: 64 × the file's 12.7 KiB, at least 256 MiB and at most 16 GiB"
    );
}
