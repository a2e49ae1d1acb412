//! `golden diff` and `golden show` over archives of dumps that real PyTorch wrote (seed 002's
//! layout: `{layer}_{stage}.pth`, a scalar, a dict, a pickle with no tensor), one side dumped by
//! a tensor-parallel port: reshaped and sharded tensors are compared under the explanation the
//! row states, the planted difference is still found, nothing compared is never a match, names
//! that differ pair through `--map`, and hostile archives are refused or left out by name.

mod common;

use common::{archive, make_dumps, run_python, Dir};
use serde_json::Value as Json;
use std::path::Path;
use std::process::{Command, Output};

/// Run golden with its temporary folder in `tmp` (to see that nothing is left there).
fn golden_in(tmp: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_golden"))
        .args(args)
        .env("TMPDIR", tmp)
        .output()
        .expect("golden runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_none()
}

#[test]
fn archives_of_torch_dumps_compare_with_reshapes_and_shards_explained() {
    let d = Dir::new("archives");
    let (a, b) = make_dumps(d.path());
    let tmp = d.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    for (ea, eb) in [("zip", "tar.gz"), ("tar", "zip"), ("tgz", "tar")] {
        let (za, zb) = (
            d.path().join(format!("model_a.{ea}")),
            d.path().join(format!("model_b.{eb}")),
        );
        archive(&a, &za);
        archive(&b, &zb);
        let out = golden_in(&tmp, &["diff", s(&za), s(&zb)]);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(1), "{ea} against {eb}: {t}");
        // The one planted difference is the first divergence: layer 4's post_mlp, at A's index,
        // under the join of B's shards and its reshape.
        assert!(
            t.contains(
                "first divergence: `4_post_mlp` (#28): 1 of 384 elements differ, max |Δ| 0.5; \
                 furthest outside the tolerance at [0, 2, 5, 7]"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "compared as torch.cat([4_post_mlp.rank0, 4_post_mlp.rank1], dim=2)\
                 .permute(1, 0, 2).unsqueeze(0), the closest of the 2 explanations tried (none \
                 agrees)"
            ),
            "{t}"
        );
        // Every other pair matches; the TP-reshaped attention outputs say how.
        let row = |name: &str| {
            t.lines()
                .find(|l| l.split_whitespace().nth(1) == Some(name))
                .unwrap_or_else(|| panic!("no row {name}: {t}"))
                .to_string()
        };
        let attn = row("3_post_attn");
        assert!(
            attn.contains("[1, 4, 12, 8] / [12, 4, 8]")
                && attn.ends_with("ok; compared as B.permute(1, 0, 2).unsqueeze(0)"),
            "{attn}"
        );
        assert!(
            row("3_post_mlp").ends_with(
                "ok; compared as torch.cat([3_post_mlp.rank0, 3_post_mlp.rank1], dim=2)\
                 .permute(1, 0, 2).unsqueeze(0)"
            ),
            "{t}"
        );
        assert!(row("0_sliding").ends_with("ok"), "{t}");
        assert!(row("0_extras/v.0").ends_with("ok"), "{t}");
        assert!(
            t.contains(
                "33 tensors: 32 match, 1 differ, 0 differ in shape, 0 only in A, 0 only in B, \
                 0 unreadable"
            ),
            "{t}"
        );
        // The pickle that holds no tensor is named, in the archive.
        assert!(
            t.contains(&format!(
                "skipped in B ({}:meta.pth), not tensors: `meta` (a dict of 2 strings)",
                zb.display()
            )),
            "{t}"
        );
        assert!(empty(&tmp), "a private folder was left behind");
    }
    let (za, zb) = (
        d.path().join("model_a.zip"),
        d.path().join("model_b.tar.gz"),
    );
    // JSON: the same rows, the explanation stated.
    let out = golden_in(&tmp, &["diff", s(&za), s(&zb), "--json"]);
    let doc: Json = serde_json::from_slice(&out.stdout).unwrap();
    let rows = doc["tensors"].as_array().unwrap();
    let mlp = rows.iter().find(|r| r["name"] == "4_post_mlp").unwrap();
    assert_eq!(mlp["status"], "differ");
    assert_eq!(mlp["worst"]["index"], serde_json::json!([0, 2, 5, 7]));
    assert_eq!(mlp["explained"]["agrees"], false);
    assert_eq!(
        mlp["b_names"],
        serde_json::json!(["4_post_mlp.rank0", "4_post_mlp.rank1"])
    );
    // --strict-shapes compares none of the reshaped or sharded pairs.
    let out = golden_in(&tmp, &["diff", s(&za), s(&zb), "--strict-shapes"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("SHAPE [1, 4, 12, 8] vs [12, 4, 8]: --strict-shapes: not compared"),
        "{t}"
    );
    assert!(t.contains("differ in shape"), "{t}");
    // show: an archive's tensors listed, one shown by its path, a scalar and a dict's tensor.
    let out = golden_in(&tmp, &["show", s(&zb)]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("(a .tar.gz archive): 39 tensors in 39 files") && t.contains("3_post_mlp.rank1"),
        "{t}"
    );
    let out = golden_in(&tmp, &["show", s(&zb), "0_sliding"]);
    assert!(
        text(&out).contains(&format!(
            "0_sliding: i64 [] (1 elements) from {}:0_sliding.pth",
            zb.display()
        )),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("first 1 values (flat; --slice picks others): 1"));
    let out = golden_in(&tmp, &["show", s(&za), "0_extras/k", "--slice", "1"]);
    assert!(
        text(&out).contains("values [1]:\n  [3, 4, 5]"),
        "{}",
        text(&out)
    );
    assert!(empty(&tmp));
}

#[test]
fn a_comparison_that_pairs_nothing_is_never_a_match_and_a_mapping_pairs_the_names() {
    let d = Dir::new("nothing");
    let (a, _) = make_dumps(d.path());
    // B: the same tensors under Hugging Face-like names.
    let hf = d.path().join("hf");
    run_python(
        r#"
import os, re, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
for n in os.listdir(src):
    m = re.match(r"(\d+)_(post_attn|post_mlp)\.pth$", n)
    if m:
        shutil.copy(os.path.join(src, n), os.path.join(dst, f"layers.{m[1]}.{ {'post_attn': 'self_attn', 'post_mlp': 'mlp'}[m[2]] }.pth"))
"#,
        &[&a, &hf],
    );
    let (za, zb) = (d.path().join("a.zip"), d.path().join("hf.zip"));
    archive(&a, &za);
    archive(&hf, &zb);
    let tmp = d.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out = golden_in(&tmp, &["diff", s(&za), s(&zb)]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(!t.contains("match\n") && !t.contains("all 0"), "{t}");
    assert!(
        t.contains(&format!(
            "nothing was compared: A ({}, a .zip archive) holds 33 tensors in 33 tensor files",
            za.display()
        )),
        "{t}"
    );
    assert!(
        t.contains("B (")
            && t.contains(
                "a .zip archive) holds 12 tensors in 12 tensor files (`layers.0.self_attn`"
            ),
        "{t}"
    );
    assert!(t.contains("Why: no name is on both sides"), "{t}");
    let doc: Json =
        serde_json::from_slice(&golden_in(&tmp, &["diff", s(&za), s(&zb), "--json"]).stdout)
            .unwrap();
    assert_eq!(doc["match"], false);
    assert!(doc["nothing_compared"]
        .as_str()
        .unwrap()
        .starts_with("nothing was compared"));
    // A side with no tensor file at all (a zip of a text file).
    let notes = d.path().join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    std::fs::write(notes.join("README.md"), "dumps to come").unwrap();
    let zn = d.path().join("notes.zip");
    archive(&notes, &zn);
    let out = golden_in(&tmp, &["diff", s(&za), s(&zn)]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("Why: B holds no tensor file golden reads (.npy, .npz, .safetensors, .pt, .pth, .bin, .ckpt): see what was left out below")
            && t.contains("left out `notes/README.md`: not a tensor file"),
        "{t}"
    );
    // The mapping pairs them; the natural order and the stage order stay A's.
    let map = d.path().join("names.map");
    std::fs::write(
        &map,
        "# A = B\n{layer}_post_attn = layers.{layer}.self_attn\n{layer}_post_mlp = layers.{layer}.mlp\n",
    )
    .unwrap();
    let out = golden_in(&tmp, &["diff", s(&za), s(&zb), "--map", s(&map)]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let ok: Vec<&str> = t
        .lines()
        .filter(|l| l.contains(" ok; B: layers."))
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert_eq!(ok.len(), 12, "{t}");
    assert_eq!(
        &ok[..3],
        ["0_post_attn", "0_post_mlp", "1_post_attn"],
        "{t}"
    );
    assert!(
        t.contains("12 match, 0 differ, 0 differ in shape, 21 only in A, 0 only in B"),
        "{t}"
    );
    let doc: Json = serde_json::from_slice(
        &golden_in(&tmp, &["diff", s(&za), s(&zb), "--map", s(&map), "--json"]).stdout,
    )
    .unwrap();
    let row = doc["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "2_post_mlp")
        .unwrap()
        .clone();
    assert_eq!(row["mapped_by"], "{layer}_post_mlp = layers.{layer}.mlp");
    assert_eq!(row["b_names"], serde_json::json!(["layers.2.mlp"]));
    assert!(empty(&tmp));
}

#[test]
fn hostile_archives_are_refused_or_left_out_by_name() {
    let d = Dir::new("hostile");
    let (a, _) = make_dumps(d.path());
    let evil = d.path().join("evil.tar");
    let bomb = d.path().join("bomb.tar.gz");
    let outside = d.path().join("outside.pth");
    run_python(
        r#"
import io, os, sys, tarfile
src, evil, bomb = sys.argv[1], sys.argv[2], sys.argv[3]
with tarfile.open(evil, "w") as t:
    t.add(os.path.join(src, "0_post_attn.pth"), "0_post_attn.pth")
    t.add(os.path.join(src, "0_post_mlp.pth"), "../outside.pth")
    data = open(os.path.join(src, "0_pre_mlp.pth"), "rb").read()
    absolute = tarfile.TarInfo("/tmp/absolute.pth"); absolute.size = len(data)
    t.addfile(absolute, io.BytesIO(data))
    link = tarfile.TarInfo("0_pre_mlp.pth"); link.type = tarfile.SYMTYPE; link.linkname = "/etc/passwd"
    t.addfile(link)
    hard = tarfile.TarInfo("0_post_ln_pre_attn.pth"); hard.type = tarfile.LNKTYPE; hard.linkname = "0_post_attn.pth"
    t.addfile(hard)
with tarfile.open(bomb, "w:gz") as t:
    data = bytes(64 << 20)
    info = tarfile.TarInfo("zeros.npy"); info.size = len(data)
    t.addfile(info, io.BytesIO(data))
"#,
        &[&a, &evil, &bomb],
    );
    let tmp = d.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let za = d.path().join("a.tar");
    archive(&a, &za);
    let out = golden_in(&tmp, &["diff", s(&za), s(&evil)]);
    let t = text(&out);
    for left in [
        "left out `../outside.pth`: its path leaves the archive (`..`)",
        "left out `/tmp/absolute.pth`: an absolute path, outside the archive",
        "left out `0_pre_mlp.pth`: a symlink (not followed)",
        "left out `0_post_ln_pre_attn.pth`: a hard link (not followed)",
    ] {
        assert!(t.contains(left), "{left}: {t}");
    }
    assert!(!outside.exists() && !Path::new("/tmp/absolute.pth").exists());
    assert!(
        t.lines()
            .any(|l| l.contains(" 0_post_attn ") && l.ends_with(" ok")),
        "{t}"
    );
    // A compressed stream that expands beyond the limit is refused at the limit.
    let out = golden_in(&tmp, &["diff", s(&za), s(&bomb), "--read-budget", "16MiB"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains("`zeros.npy` would take the unpacked archive over its limit of 16 MiB (64 MiB); if you trust it, raise the limit with --read-budget SIZE"),
        "{t}"
    );
    assert!(empty(&tmp), "a private folder was left behind");
}

/// Two entries of one path: a zip read the last silently, a tar kept the first with a note; now
/// both keep the first and name the others. An entry that cannot be written here (a file, then a
/// folder of the same name; a name longer than the file system allows) is left out by name, and
/// the rest of the archive is read (#31, minor items).
#[test]
fn repeated_and_unwritable_entries_are_left_out_by_name_and_the_rest_is_read() {
    let d = Dir::new("archives-repeated");
    let tmp = d.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let long = format!("d/{}.npy", "n".repeat(300));
    for kind in ["zip", "tar"] {
        let path = d.path().join(format!("dump.{kind}"));
        run_python(
            r#"
import io, sys, tarfile, warnings, zipfile
import numpy as np
out, kind, long = sys.argv[1], sys.argv[2], sys.argv[3]
def npy(v):
    b = io.BytesIO(); np.save(b, np.full(3, v, dtype=np.float32)); return b.getvalue()
entries = [("d/x.npy", npy(1.0)), ("d/x.npy", npy(2.0)), ("d/a.npy", npy(3.0)),
           ("d/a.npy/b.npy", npy(4.0)), (long, npy(5.0)), ("d/ok.npy", npy(6.0))]
warnings.simplefilter("ignore")
if kind == "zip":
    with zipfile.ZipFile(out, "w") as z:
        for n, b in entries:
            z.writestr(n, b)
else:
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as t:
        for n, b in entries:
            info = tarfile.TarInfo(n); info.size = len(b); t.addfile(info, io.BytesIO(b))
"#,
            &[&path, Path::new(kind), Path::new(&long)],
        );
        let out = golden_in(&tmp, &["show", s(&path)]);
        let listing = text(&out);
        assert!(out.status.success(), "{kind}: {listing}");
        for key in ["x", "a", "ok"] {
            assert!(
                listing.contains(&format!("\n  {key} ")),
                "{kind}: {key} in {listing}"
            );
        }
        assert!(
            listing.contains(
                "left out `d/x.npy`: a second entry of the same path (the first is kept)"
            ),
            "{kind}: {listing}"
        );
        assert!(
            listing.contains("left out `d/a.npy/b.npy`: cannot be written here"),
            "{kind}: {listing}"
        );
        assert!(
            listing.contains(&format!("left out `{long}`: cannot be written here")),
            "{kind}: {listing}"
        );
        // The first of the two `d/x.npy` is the one read.
        let out = golden_in(&tmp, &["show", s(&path), "x"]);
        let shown = text(&out);
        assert!(
            shown.contains("first 3 values (flat; --slice picks others): 1, 1, 1"),
            "{kind}: {shown}"
        );
        let out = golden_in(&tmp, &["show", s(&path), "ok"]);
        assert!(text(&out).contains(": 6, 6, 6"), "{kind}: {}", text(&out));
    }
    assert!(empty(&tmp));
}
