//! What the command line's tests share: real PyTorch dumps in seed 002's layout, archived.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A temporary folder, removed on drop.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("golden-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes two models' dumps with torch.save, as seed 002 describes them, and archives them.
///
/// Six layers, five stages each (`{layer}_post_ln_pre_attn.pth` … `{layer}_post_mlp.pth`), every
/// tensor of A shaped [1, 4, 12, 8] (batch, heads, tokens, head_dim); a scalar `0_sliding.pth`
/// (a Python int), `0_extras.pth` (a dict of two tensors and a list of one) and `meta.pth` (a dict
/// of strings: no tensor). B is the same model dumped by a tensor-parallel port: its attention
/// outputs are [12, 4, 8] (tokens, heads, head_dim: the batch squeezed, heads and tokens swapped),
/// its `post_mlp` in two shards along head_dim (`{layer}_post_mlp.rank0.pth`, `.rank1.pth`, each
/// [12, 4, 4]), the rest as A's; and one planted difference: layer 4's `post_mlp`, A's element
/// [0, 2, 5, 7], is 0.5 larger in B.
///
/// Returns (A's folder, B's folder). Archives are made next to them by `archive`.
pub const MAKE_DUMPS: &str = r#"
import os, sys, torch
root = sys.argv[1]
a, b = os.path.join(root, "a"), os.path.join(root, "b")
os.makedirs(a); os.makedirs(b)
stages = ["post_ln_pre_attn", "post_attn", "post_attn_pre_resid", "pre_mlp", "post_mlp"]
g = torch.Generator().manual_seed(0)
for layer in range(6):
    for stage in stages:
        t = torch.randn(1, 4, 12, 8, generator=g)
        torch.save(t, os.path.join(a, f"{layer}_{stage}.pth"))
        if stage == "post_mlp":
            u = t.clone()
            if layer == 4:
                u[0, 2, 5, 7] += 0.5
            u = u.squeeze(0).permute(1, 0, 2).contiguous()  # [12, 4, 8]
            torch.save(u[..., :4].clone(), os.path.join(b, f"{layer}_post_mlp.rank0.pth"))
            torch.save(u[..., 4:].clone(), os.path.join(b, f"{layer}_post_mlp.rank1.pth"))
        elif stage in ("post_attn", "post_attn_pre_resid"):
            torch.save(t.squeeze(0).permute(1, 0, 2).contiguous(), os.path.join(b, f"{layer}_{stage}.pth"))
        else:
            torch.save(t.clone(), os.path.join(b, f"{layer}_{stage}.pth"))
for d in (a, b):
    torch.save(1, os.path.join(d, "0_sliding.pth"))
    torch.save({"k": torch.arange(6.0).reshape(2, 3), "v": [torch.ones(2)]}, os.path.join(d, "0_extras.pth"))
    torch.save({"model": "tiny", "note": "no tensor here"}, os.path.join(d, "meta.pth"))
"#;

/// Python with torch (golden's venv, or GOLDEN_PYTHON): the tests need real PyTorch.
pub fn python() -> PathBuf {
    golden::describe::env::python().program
}

/// Run a Python script with arguments; panics with its stderr if it fails.
pub fn run_python(script: &str, args: &[&Path]) -> String {
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python runs (this test needs golden's venv with torch: cargo xtask setup)");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Make the dumps under `root` (see [`MAKE_DUMPS`]): returns A's and B's folders.
pub fn make_dumps(root: &Path) -> (PathBuf, PathBuf) {
    run_python(MAKE_DUMPS, &[root]);
    (root.join("a"), root.join("b"))
}

/// Archive a folder's files as `.zip`, `.tar` or `.tar.gz` (by the extension of `out`), with
/// Python's zipfile and tarfile, inside a top folder named after the archive (`model_a.zip`
/// holds `model_a/0_post_attn.pth`, …), as zipping a folder does.
pub fn archive(folder: &Path, out: &Path) {
    run_python(
        r#"
import os, sys, tarfile, zipfile
folder, out = sys.argv[1], sys.argv[2]
names = sorted(os.listdir(folder))
top = os.path.basename(out).split(".")[0] + "/"
if out.endswith(".zip"):
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for n in names:
            z.write(os.path.join(folder, n), top + n)
else:
    mode = "w:gz" if out.endswith((".gz", ".tgz")) else "w"
    with tarfile.open(out, mode) as t:
        for n in names:
            t.add(os.path.join(folder, n), top + n)
"#,
        &[folder, out],
    );
}
