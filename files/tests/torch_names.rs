//! The `.pt` reader against what `torch.save` writes for every name length a file may have.
//!
//! `torch.save` names the folder inside its zip after the file's stem, so the archive's layout
//! (the length of every record) changes with the name. Its zip ends with a zip64 end record and
//! locator (76 bytes) before the classic end record, which points at the central directory; a
//! reader that locates the central directory as "end record minus its declared size" lands 76
//! bytes in, and when the first central record (46 bytes + `<stem>/data.pkl`) is exactly 76 bytes
//! long — a 21-character stem — finds a record there, takes the archive as shifted by 76 bytes,
//! and fails ("Invalid Central Directory header"). `torch.load` and Python's `zipfile` read it.
//!
//! Real PyTorch writes the files (golden's venv, or `GOLDEN_PYTHON`): one tensor under every stem
//! length a file name may have (1 to 251 characters, with `.pth`), a dict of tensors and a number
//! under a few, and files in nested folders whose paths run to several hundred characters.

use golden_files::formats::TensorFile;
use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("GOLDEN_PYTHON") {
        return p.into();
    }
    let home = std::env::var_os("HOME").expect("HOME");
    let venv = Path::new(&home).join(".cache/golden/venv/bin/python");
    assert!(
        venv.exists(),
        "this test needs PyTorch: run `cargo xtask setup` (golden's venv) or set GOLDEN_PYTHON"
    );
    venv
}

const SCRIPT: &str = r#"
import os, sys, torch
root = sys.argv[1]
os.makedirs(os.path.join(root, "dicts"))
for n in range(1, 252):
    stem = ("t%d_" % n + "abcdefghij" * 30)[:n]
    torch.save(torch.arange(n, dtype=torch.float32) * 0.5, os.path.join(root, stem + ".pth"))
for n in (20, 21, 22, 64, 200):
    stem = ("d%d_" % n + "x" * 300)[:n]
    torch.save({"w": torch.ones(2, n), "b": torch.zeros(n), "k": n}, os.path.join(root, "dicts", stem + ".pt"))
deep = root
for i in range(12):
    deep = os.path.join(deep, "layer_%02d_" % i + "f" * 30)
os.makedirs(deep)
for n in (1, 21, 100, 200):
    stem = ("n%d_" % n + "q" * 300)[:n]
    torch.save(torch.full((3,), float(n)), os.path.join(deep, stem + ".pth"))
print(deep)
"#;

#[test]
fn every_stem_length_torch_save_writes_reads() {
    let root = std::env::temp_dir().join(format!("golden-torch-names-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let out = Command::new(python())
        .args(["-c", SCRIPT])
        .arg(&root)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deep = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let mut failed = Vec::new();
    for n in 1..=251usize {
        let stem: String = format!("t{n}_{}", "abcdefghij".repeat(30))
            .chars()
            .take(n)
            .collect();
        let path = root.join(format!("{stem}.pth"));
        let read = TensorFile::open(&path).and_then(|mut f| {
            let names: Vec<String> = f.entries().iter().map(|e| e.name.clone()).collect();
            let t = f.load(0).map_err(|e| e.to_string())?;
            Ok((names, t.shape.clone(), t.to_f64()))
        });
        let want: Vec<f64> = (0..n).map(|i| i as f64 * 0.5).collect();
        match read {
            Ok((names, shape, values))
                if names == [stem.clone()] && shape == [n] && values == want => {}
            other => failed.push(format!("stem of {n} characters: {other:?}")),
        }
    }
    for n in [20usize, 21, 22, 64, 200] {
        let stem: String = format!("d{n}_{}", "x".repeat(300))
            .chars()
            .take(n)
            .collect();
        let path = root.join("dicts").join(format!("{stem}.pt"));
        match TensorFile::open(&path).and_then(|f| f.load_all().map_err(|e| e.to_string())) {
            Ok(c) => {
                let got: Vec<(String, Vec<usize>, Vec<f64>)> = c
                    .tensors
                    .iter()
                    .map(|(name, t)| (name.clone(), t.shape.clone(), t.to_f64()))
                    .collect();
                let want = vec![
                    ("w".to_string(), vec![2, n], vec![1.0; 2 * n]),
                    ("b".to_string(), vec![n], vec![0.0; n]),
                    ("k".to_string(), vec![], vec![n as f64]),
                ];
                if got != want {
                    failed.push(format!("dict under a {n}-character stem: {got:?}"));
                }
            }
            Err(e) => failed.push(format!("dict under a {n}-character stem: {e}")),
        }
    }
    for n in [1usize, 21, 100, 200] {
        let stem: String = format!("n{n}_{}", "q".repeat(300))
            .chars()
            .take(n)
            .collect();
        let path = deep.join(format!("{stem}.pth"));
        assert!(path.as_os_str().len() > 400);
        match TensorFile::open(&path).and_then(|mut f| f.load(0).map_err(|e| e.to_string())) {
            Ok(t) if t.to_f64() == vec![n as f64; 3] => {}
            other => failed.push(format!("nested, stem of {n}: {other:?}")),
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    assert!(
        failed.is_empty(),
        "{} files torch.save wrote were not read:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
