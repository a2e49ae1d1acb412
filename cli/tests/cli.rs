//! The `golden` binary as a user runs it: exit status, the table, the first divergence, `--json`,
//! `show` with a slice, and the messages for unreadable files and unknown names.

use golden_files::HostTensor;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn golden(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_golden"))
        .args(args)
        .output()
        .expect("golden runs")
}

fn fixture(name: &str) -> String {
    format!(
        "{}/../files/tests/fixtures/tensor_files/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("golden-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two dump folders in seed 002's layout (`{layer}_{stage}`), B with a change from layer 2 on.
fn dumps(name: &str) -> (Dir, Dir) {
    let (a, b) = (
        Dir::new(&format!("{name}-a")),
        Dir::new(&format!("{name}-b")),
    );
    let stages = [
        "post_ln_pre_attn",
        "post_attn",
        "post_attn_pre_resid",
        "pre_mlp",
        "post_mlp",
    ];
    for layer in 0..12 {
        for (s, stage) in stages.iter().enumerate() {
            let values: Vec<f64> = (0..64)
                .map(|i| ((layer * 7 + s * 3 + i) % 11) as f64 * 0.1)
                .collect();
            let mut changed = values.clone();
            if layer >= 2 && *stage != "post_ln_pre_attn" {
                changed[5] += 0.25;
            }
            let t = |v: &[f64]| {
                let f = HostTensor::from_f64(vec![4, 16], v);
                let f32s: Vec<u8> = f
                    .to_f64()
                    .iter()
                    .flat_map(|x| (*x as f32).to_le_bytes())
                    .collect();
                HostTensor {
                    dtype: golden_files::WireDType::F32,
                    shape: vec![4, 16],
                    data: f32s.into(),
                }
            };
            let file = format!("{layer}_{stage}.npy");
            golden_files::npy::write(&a.path().join(&file), &t(&values)).unwrap();
            golden_files::npy::write(&b.path().join(&file), &t(&changed)).unwrap();
        }
    }
    (a, b)
}

#[test]
fn diff_walks_layers_in_order_and_names_the_first_divergence() {
    let (a, b) = dumps("order");
    let out = golden(&[
        "diff",
        a.path().to_str().unwrap(),
        b.path().to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    // The names order the layers (layer 2 before layer 10) but not the stages within layer 2:
    // the four that differ there are candidates, none stated as the first.
    assert!(
        text.contains(
            "first divergence: not known. These names carry no order (no order.txt beside the \
             dumps, no number of their own on each), and only layer numbers are taken as one: the \
             first divergence is one of these 4, which golden cannot order:\n  `2_post_attn` \
             (#12): 1 of 64 elements differ, max |Δ| 0.25"
        ),
        "{text}"
    );
    for candidate in ["2_post_attn_pre_resid", "2_pre_mlp", "2_post_mlp"] {
        assert!(text.contains(&format!("\n  `{candidate}` (#")), "{text}");
    }
    assert!(
        text.contains("golden's guess from the usual stage names is `2_post_attn`"),
        "{text}"
    );
    assert!(!text.contains("  <- first divergence\n"), "{text}");
    assert_eq!(text.matches("<- first divergence?").count(), 4, "{text}");
    let order: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|n| n.starts_with("0_") || n.starts_with("10_"))
        .collect();
    assert_eq!(
        &order[..5],
        [
            "0_post_ln_pre_attn",
            "0_post_attn",
            "0_post_attn_pre_resid",
            "0_pre_mlp",
            "0_post_mlp"
        ]
    );
    // Layers 0 and 1 match, and every layer's first stage.
    assert!(text.contains("60 tensors: 20 match, 40 differ"), "{text}");
}

/// Write `order.txt` in `dir`: the names, one a line.
fn manifest(dir: &Path, names: &[String]) {
    std::fs::write(dir.join("order.txt"), names.join("\n") + "\n").unwrap();
}

#[test]
fn diff_takes_the_order_of_a_manifest_beside_the_dumps() {
    let (a, b) = dumps("manifest");
    let stages = [
        "post_ln_pre_attn",
        "post_attn",
        "post_attn_pre_resid",
        "pre_mlp",
        "post_mlp",
    ];
    let names: Vec<String> = (0..12)
        .flat_map(|layer| stages.iter().map(move |s| format!("{layer}_{s}.npy")))
        .collect();
    manifest(a.path(), &names);
    let out = golden(&[
        "diff",
        a.path().to_str().unwrap(),
        b.path().to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "60 tensors in the order of {}/order.txt;",
            a.path().display()
        )),
        "{text}"
    );
    assert!(
        text.contains(
            "first divergence: `2_post_attn` (#12): 1 of 64 elements differ, max |Δ| 0.25"
        ),
        "{text}"
    );
    assert!(!text.contains("not known"), "{text}");
}

/// Dumps named as Hugging Face's Llama modules are (`{layer}_{module}`), B with a bug in layer 0's
/// input_layernorm that every later module inherits.
fn hf_dumps(name: &str, numbered: bool) -> (Dir, Dir, Vec<String>) {
    let (a, b) = (
        Dir::new(&format!("{name}-a")),
        Dir::new(&format!("{name}-b")),
    );
    let modules = [
        "input_layernorm",
        "self_attn",
        "post_attention_layernorm",
        "mlp",
    ];
    let mut names = Vec::new();
    for layer in 0..2 {
        for (m, module) in modules.iter().enumerate() {
            let values: Vec<f64> = (0..16)
                .map(|i| (layer * 5 + m * 3 + i) as f64 * 0.1)
                .collect();
            let mut changed = values.clone();
            changed[3] += 0.5;
            let stem = if numbered {
                format!("{:03}_{layer}_{module}", names.len())
            } else {
                format!("{layer}_{module}")
            };
            let t = |v: &[f64]| HostTensor::from_f64(vec![16], v);
            golden_files::npy::write(&a.path().join(format!("{stem}.npy")), &t(&values)).unwrap();
            golden_files::npy::write(&b.path().join(format!("{stem}.npy")), &t(&changed)).unwrap();
            names.push(stem);
        }
    }
    (a, b, names)
}

#[test]
fn diff_of_hugging_face_names_never_states_a_guessed_first_divergence() {
    let (a, b, names) = hf_dumps("hf", false);
    let (pa, pb) = (a.path().to_str().unwrap(), b.path().to_str().unwrap());
    let out = golden(&["diff", pa, pb]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    // It used to put `0_self_attn` first and blame it; the bug is in `0_input_layernorm`, and the
    // names alone cannot tell which of layer 0's modules ran first.
    assert!(!text.contains("first divergence: `0_self_attn`"), "{text}");
    assert!(
        text.contains("in natural order (layer numbers, then stage names: a guess"),
        "{text}"
    );
    let listed: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("first divergence: not known."))
        .skip(1)
        .take_while(|l| l.starts_with("  `"))
        .map(|l| l.trim_start().split('`').nth(1).unwrap())
        .collect();
    assert_eq!(
        listed,
        [
            "0_input_layernorm",
            "0_self_attn",
            "0_post_attention_layernorm",
            "0_mlp"
        ],
        "{text}"
    );
    assert!(
        text.contains("golden's guess from the usual stage names is `0_input_layernorm`"),
        "{text}"
    );
    // Layer 1 follows layer 0 by its number: none of its modules is a candidate.
    assert!(!text.contains("  `1_"), "{text}");

    let out = golden(&["diff", pa, pb, "--json"]);
    let doc: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["first_divergence"], Json::Null);
    assert_eq!(
        doc["first_divergence_candidates"],
        serde_json::json!([
            "0_input_layernorm",
            "0_self_attn",
            "0_post_attention_layernorm",
            "0_mlp"
        ])
    );
    assert_eq!(doc["order"]["from"], "names (guessed)");

    // With the dump's order, in a manifest or in the names' own numbers, it is known.
    manifest(a.path(), &names);
    let out = golden(&["diff", pa, pb, "--json"]);
    let doc: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["first_divergence"], "0_input_layernorm");
    assert_eq!(doc["order"]["from"], "manifest");
    let (a, b, _) = hf_dumps("hf-numbered", true);
    let (pa, pb) = (a.path().to_str().unwrap(), b.path().to_str().unwrap());
    let out = golden(&["diff", pa, pb]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("8 tensors in the order of their numbers;"),
        "{text}"
    );
    assert!(
        text.contains("first divergence: `000_0_input_layernorm` (#1): 1 of 16 elements differ"),
        "{text}"
    );
    let doc: Json = serde_json::from_slice(&golden(&["diff", pa, pb, "--json"]).stdout).unwrap();
    assert_eq!(doc["first_divergence"], "000_0_input_layernorm");
    assert_eq!(doc["order"]["from"], "numbers");
}

#[test]
fn diff_json_and_tolerances() {
    let (a, b) = dumps("json");
    let (pa, pb) = (a.path().to_str().unwrap(), b.path().to_str().unwrap());
    let out = golden(&["diff", pa, pb, "--json"]);
    let doc: Json = serde_json::from_slice(&out.stdout).unwrap();
    // Layer 2's stages have no known order: no first divergence is claimed.
    assert_eq!(doc["first_divergence"], Json::Null);
    assert_eq!(doc["first_divergence_candidates"][0], "2_post_attn");
    assert_eq!(
        doc["first_divergence_candidates"].as_array().unwrap().len(),
        4
    );
    assert_eq!(doc["match"], false);
    let row = &doc["tensors"][11];
    assert_eq!(row["name"], "2_post_attn");
    assert_eq!(row["status"], "differ");
    assert_eq!(row["mismatched"], 1);
    assert_eq!(row["worst"]["index"], serde_json::json!([0, 5]));
    // A tolerance wide enough passes everything, with exit status 0.
    let out = golden(&["diff", pa, pb, "--atol", "0.3"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("all 60 tensors match"));
}

#[test]
fn diff_of_two_files_pairs_their_tensors_by_name() {
    let same = golden(&["diff", &fixture("state_dict.pt"), &fixture("state_dict.pt")]);
    let text = String::from_utf8_lossy(&same.stdout);
    assert_eq!(same.status.code(), Some(0), "{text}");
    assert!(text.contains("all 8 tensors match"), "{text}");
    // Different contents: only names both have are compared; the rest are listed.
    let out = golden(&["diff", &fixture("state_dict.pt"), &fixture("checkpoint.pt")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("only in A") && text.contains("only in B"),
        "{text}"
    );
    // npz plain against compressed: the same arrays.
    let out = golden(&[
        "diff",
        &fixture("arrays.npz"),
        &fixture("arrays_compressed.npz"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn diff_says_what_it_cannot_read() {
    let d = Dir::new("unreadable");
    let bad = d.path().join("x.npy");
    std::fs::write(&bad, b"not numpy").unwrap();
    let out = golden(&["diff", bad.to_str().unwrap(), &fixture("state_dict.pt")]);
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ERROR") && text.contains("x.npy: unknown format"),
        "{text}"
    );
    let out = golden(&[
        "diff",
        d.path().to_str().unwrap(),
        &fixture("state_dict.pt"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("compare two files, or two folders or archives"));
    let missing = d.path().join("missing");
    let out = golden(&["diff", missing.to_str().unwrap(), &fixture("state_dict.pt")]);
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("missing: No such file or directory"),
        "{text}"
    );
}

#[test]
fn show_prints_statistics_a_histogram_and_a_slice() {
    let out = golden(&[
        "show",
        &fixture("state_dict.pt"),
        "layers.0.weight",
        "--slice",
        "1,1:3",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Row 1, columns 1 and 2, as PyTorch saved them (files/tests/fixtures/tensor_files/expected.json).
    let expected: Json =
        serde_json::from_str(&std::fs::read_to_string(fixture("expected.json")).unwrap()).unwrap();
    let w = &expected["state_dict.pt"][0];
    assert_eq!(w["name"], "layers.0.weight");
    let v: Vec<f64> = serde_json::from_value(w["values"].clone()).unwrap();
    let num = |x: f64| golden::internal::describe::numbers::num(x);
    assert!(
        text.contains(&format!("[{}, {}]", num(v[5]), num(v[6]))),
        "{text}"
    );
    assert!(
        text.starts_with("layers.0.weight: f32 [3, 4] (12 elements)"),
        "{text}"
    );
    assert!(
        text.contains("histogram of the finite values:") && text.contains('█'),
        "{text}"
    );
    // A Python int saved with torch.save is a 0-d tensor.
    let out = golden(&["show", &fixture("0_sliding.pth")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("0_sliding: i64 [] (1 elements)") && text.contains("4096"),
        "{text}"
    );
    // Several tensors and no name: a list.
    let out = golden(&["show", &fixture("checkpoint.pt")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("6 tensors (name one to see it)") && text.contains("not tensors: `tag`"),
        "{text}"
    );
    // A name it lacks.
    let out = golden(&["show", &fixture("state_dict.pt"), "weight"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("has no tensor `weight` (did you mean layers.0.weight"),
        "{err}"
    );
}

/// Run golden, failing the test if it has not finished within `secs` seconds (it is killed then).
fn golden_within(args: &[&str], env: &[(&str, &str)], secs: u64) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_golden"))
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("golden runs");
    let pid = child.id();
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || send.send(child.wait_with_output()));
    match receive.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(out) => out.expect("golden's output"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("golden {args:?} did not finish within {secs} s");
        }
    }
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[cfg(unix)]
#[test]
fn diff_and_report_walk_each_real_folder_once_through_symlink_loops() {
    let (a, b) = (Dir::new("loop-a"), Dir::new("loop-b"));
    for d in [&a, &b] {
        std::fs::copy(fixture("0_post_attn.pth"), d.path().join("x.pth")).unwrap();
        // A link to its own folder, and two to the parent: followed, they would list `x` 41
        // times, and walk 2^40 paths.
        std::os::unix::fs::symlink(".", d.path().join("self")).unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("..", d.path().join("sub/up1")).unwrap();
        std::os::unix::fs::symlink("..", d.path().join("sub/up2")).unwrap();
    }
    let start = std::time::Instant::now();
    let out = golden_within(
        &[
            "diff",
            a.path().to_str().unwrap(),
            b.path().to_str().unwrap(),
        ],
        &[],
        60,
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("all 1 tensors match"), "{stdout}");
    for link in ["self", "sub/up1", "sub/up2"] {
        assert!(
            stdout.contains(&format!(
                "note: in {}: `{link}` was not followed: it leads back to `.`, which contains it \
                 (a loop)",
                a.path().display()
            )),
            "{stdout}"
        );
    }
    eprintln!("diff through symlink loops: {:?}", start.elapsed());
    // `golden report` walks its results folder the same way.
    let out = golden_within(
        &["report", "--results", a.path().to_str().unwrap()],
        &[],
        60,
    );
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("no results in"), "{stderr}");
}

#[test]
fn a_file_that_expands_past_its_read_budget_is_refused_with_how_to_raise_it() {
    // 100 expand views of one 4 KiB storage, 4 MiB each once copied: 400 MiB from 13 KiB (over
    // the default budget of 256 MiB: files/tests/tensor_files.rs). Compared a pair at a time
    // within 18 MiB, the first 4 fit.
    let bomb = fixture("bomb_views.pt");
    let out = golden_within(&["diff", &bomb, &bomb, "--read-budget", "18MiB"], &[], 60);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stdout.contains("6 tensors: 4 match"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "ERROR {bomb}: `v4` (a view that is not contiguous, copied) would expand the file to \
             20.2 MiB in memory, over its read budget of 18 MiB (set by --read-budget 18MiB); if \
             you trust the file, raise the budget with --read-budget SIZE (or \
             GOLDEN_READ_BUDGET=SIZE) (at least 21 MiB)"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "ERROR {bomb}: not compared, nor the 94 tensors after it: the file went over its read \
             budget at `v4`"
        )),
        "{stdout}"
    );
    // One view fits 5 MiB, not 4.
    let out = golden_within(&["show", &bomb, "v99", "--read-budget", "5MiB"], &[], 60);
    assert!(out.status.success(), "{:?}", text(&out));
    let out = golden_within(&["show", &bomb, "v99", "--read-budget", "4MiB"], &[], 60);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    // `show` without a name lists the views without reading them, even within 1 MiB.
    let out = golden_within(&["show", &bomb, "--read-budget", "1MiB"], &[], 60);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("100 tensors (name one to see it)")
            && stdout.contains("  v99  f32   [1024, 1024]     4 MiB"),
        "{stdout}"
    );
    // An .npz of deflated zeros: only the entry shown is inflated, and charged before.
    let npz = fixture("bomb_zeros.npz");
    let out = golden_within(&["show", &npz, "z1"], &[("GOLDEN_READ_BUDGET", "8MiB")], 60);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr.contains(&format!(
            "golden show: {npz}: `z1.npy` (inflated) would expand the file to 16 MiB in memory, \
             over its read budget of 8 MiB (set by GOLDEN_READ_BUDGET=8MiB); if you trust the \
             file, raise the budget with --read-budget SIZE (or GOLDEN_READ_BUDGET=SIZE) (at \
             least 17 MiB)"
        )),
        "{stderr}"
    );
    let out = golden_within(&["show", &npz, "z1", "--read-budget", "20MiB"], &[], 60);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.starts_with("z1: f32 [4194304] (4194304 elements)"),
        "{stdout}"
    );
    let out = golden(&["show", &npz, "--read-budget", "lots"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr.starts_with("golden: --read-budget lots: `lots` is not a size"),
        "{stderr}"
    );
}

#[test]
fn sizes_from_options_are_checked_before_anything_is_allocated() {
    let out = golden_within(
        &["show", &fixture("0_post_attn.pth"), "--bins", "4000000000"],
        &[],
        60,
    );
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr,
        "golden show: --bins 4000000000: a histogram has 1 to 1000 bins (one line each)\n"
    );
    let out = golden(&["show", &fixture("0_post_attn.pth"), "--bins", "0"]);
    assert_eq!(out.status.code(), Some(2));
    // NaN, infinite and negative tolerances are refused, naming the option.
    let (a, b) = (fixture("arrays.npz"), fixture("state_dict.pt"));
    for (option, value) in [("--atol", "nan"), ("--rtol", "-1"), ("--atol", "inf")] {
        let out = golden(&["diff", &a, &b, &format!("{option}={value}")]);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.starts_with(&format!("golden diff: {option} ")),
            "{stderr}"
        );
        assert!(
            stderr.contains("a tolerance is a finite number, 0 or more"),
            "{stderr}"
        );
    }
    // A slice of an axis of any length selects lazily.
    let out = golden(&[
        "show",
        &fixture("0_post_attn.pth"),
        "--slice=-9223372036854775808:9223372036854775807:9223372036854775807",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("values [-9223372036854775808:"), "{stdout}");
    assert!(stdout.contains("\n  [-1]\n"), "{stdout}");
}

/// A `.safetensors` file of one tensor `x` of `dtype` (`F16`, `BF16`) and little-endian `data`.
fn safetensors(path: &Path, dtype: &str, shape: &[usize], data: &[u8]) {
    let mut header = format!(
        "{{\"x\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[0,{}]}}}}",
        data.len()
    );
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn f16_against_bf16_takes_the_less_precise_tolerance_in_either_order() {
    let d = Dir::new("halves");
    // 1 and 1.0078125 (the next bf16 after 1): 0.8% apart, outside f16's rtol 1e-3, inside
    // bf16's 1.6e-2. Both are exact in both dtypes.
    let values = [1.0f32, -2.0, 1.0078125, 0.5];
    let other = [1.0078125f32, -2.0, 1.0, 0.5];
    let f16: Vec<u8> = values
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
        .collect();
    let bf16: Vec<u8> = other
        .iter()
        .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
        .collect();
    let (a, b) = (
        d.path().join("a.safetensors"),
        d.path().join("b.safetensors"),
    );
    safetensors(&a, "F16", &[4], &f16);
    safetensors(&b, "BF16", &[4], &bf16);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    for (x, y) in [(a, b), (b, a)] {
        let out = golden(&["diff", x, y, "--json"]);
        let doc: Json = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{x} against {y}: {doc}");
        assert_eq!(
            doc["tensors"][0]["rule"], "atol 1e-5 + rtol 0.016·|A|",
            "{doc}"
        );
        assert_eq!(doc["tensors"][0]["mismatched"], 0);
    }
}

#[test]
fn what_a_file_holds_that_is_not_a_tensor_is_named() {
    let ckpt = fixture("not_tensors.pt");
    let listed = "`config` (a dict of 3 strings), `scheduler` (None), `tags` (a list of 2 \
                  strings), `args` (a `argparse.Namespace` object, never built), `buffers` (an \
                  empty dict), `extra.why` (a string)";
    let out = golden(&["diff", &ckpt, &ckpt]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    for side in ["A", "B"] {
        assert!(
            stdout.contains(&format!(
                "skipped in {side} ({ckpt}), not tensors: {listed}\n"
            )),
            "{stdout}"
        );
    }
    let out = golden(&["diff", &ckpt, &ckpt, "--json"]);
    let doc: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        doc["skipped"][0],
        serde_json::json!({"side": "A", "file": ckpt, "name": "config", "what": "a dict of 3 strings"})
    );
    let out = golden(&["show", &ckpt]);
    let (stdout, _) = text(&out);
    assert!(
        stdout.contains(&format!("  skipped, not tensors: {listed}\n")),
        "{stdout}"
    );
    let out = golden(&["show", &ckpt, "model.w"]);
    let (stdout, _) = text(&out);
    assert!(
        stdout.ends_with(&format!("the file also holds, not tensors: {listed}\n")),
        "{stdout}"
    );
}

/// `golden setup` outside any crate says where to run it, and with an interpreter that does not
/// exist it names the interpreter and how to choose another, before installing anything.
#[test]
fn setup_says_what_is_missing() {
    let dir = Dir::new("setup");
    let out = Command::new(env!("CARGO_BIN_EXE_golden"))
        .arg("setup")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("no Cargo.toml in") && stderr.contains("--crate DIR"),
        "{stderr}"
    );

    // A crate that does not depend on golden (cargo metadata finds no `golden`): the set-up says
    // where golden's package comes from instead; a missing bootstrap interpreter is named.
    std::fs::write(
        dir.path().join("Cargo.toml"),
        "[package]\nname = \"lonely\"\nversion = \"0.1.0\"\nedition = \"2021\"\n[lib]\npath = \"lib.rs\"\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("lib.rs"), "").unwrap();
    let venv = dir.path().join("venv");
    let out = Command::new(env!("CARGO_BIN_EXE_golden"))
        .args(["setup", "--python", "/no/such/python3", "--venv"])
        .arg(&venv)
        .current_dir(dir.path())
        .env_remove("GOLDEN_PYTHON")
        .env_remove("VIRTUAL_ENV")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "no interpreter is printed on failure"
    );
    assert!(
        stderr.contains("does not depend on golden")
            && stderr.contains("comes from the checkout this `golden` was built from"),
        "{stderr}"
    );
    assert!(
        stderr.contains("could not run `/no/such/python3` to create the venv")
            && stderr.contains("--python"),
        "{stderr}"
    );
    assert!(!venv.exists(), "nothing was created");
}

#[test]
fn report_markdown_says_when_no_check_ran_and_base_needs_a_summary() {
    let dir = Dir::new("report-md");
    let results = dir.path().join("results");
    std::fs::create_dir_all(&results).unwrap();
    let results = results.to_str().unwrap();
    // A CI step that writes the summary after a failed build: a summary that says so, status 0.
    let out = golden(&["report", "--markdown", "--results", results]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("### ❌ golden: no results") && text.contains("see the job's log"),
        "{text}"
    );
    // JSON has nothing to say: an error.
    let out = golden(&["report", "--json", "--results", results]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // --base belongs to a summary.
    let out = golden(&["report", "--base", results]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("add --markdown or --json"),
        "{out:?}"
    );
    // A results file: the summary counts it, on stdout or in --out.
    let krate = Path::new(results).join("my_crate");
    std::fs::create_dir_all(&krate).unwrap();
    std::fs::write(
        krate.join("norms__gelu.json"),
        r#"{"run": "r", "written_ms": 1, "check": "norms__gelu", "layer": "gelu", "status": "pass",
            "snapshot": "layer: gelu\nf32:\n  out f32 [n]\n    max |port - ref|: 1e-7, worst element 0.01× allowed\n",
            "leaves": []}"#,
    )
    .unwrap();
    let summary = dir.path().join("summary.md");
    let out = golden(&[
        "report",
        "--markdown",
        "--results",
        results,
        "--out",
        summary.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&summary).unwrap();
    assert!(
        text.starts_with("### ✅ golden: 1 of 1 check passed")
            && text.contains("| `norms__gelu` | `gelu` | 0.01× |"),
        "{text}"
    );
    let out = golden(&["report", "--json", "--results", results]);
    let json: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["passed"], 1);
    assert_eq!(json["entries"][0]["worst_ratio"], 0.01);
}

/// Tensor and file names are the dumps', not golden's: an SGR 8 (conceal) escape in a name hid the
/// DIFFERS row and the summary on a terminal, and a newline in a name forged a line ("forged: all
/// tensors match") (#21 item 12). Control characters are escaped in all text output; `--json`
/// keeps the names as they are (JSON escapes them itself).
#[test]
fn control_characters_in_names_are_escaped_in_text_output() {
    let (a, b) = (Dir::new("ctl-a"), Dir::new("ctl-b"));
    let t = |v: f32| HostTensor {
        dtype: golden_files::WireDType::F32,
        shape: vec![2],
        data: [v, 1.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>()
            .into(),
    };
    let conceal = "0_x\u{1b}[8m";
    let forged = "1_y\nforged: all tensors match";
    for (name, differs) in [(conceal, true), (forged, false), ("2_z\r\u{7}", false)] {
        golden_files::npy::write(&a.path().join(format!("{name}.npy")), &t(0.0)).unwrap();
        let value = if differs { 5.0 } else { 0.0 };
        golden_files::npy::write(&b.path().join(format!("{name}.npy")), &t(value)).unwrap();
    }
    let out = golden(&[
        "diff",
        a.path().to_str().unwrap(),
        b.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let (stdout, stderr) = text(&out);
    for (stream, s) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(
            !s.chars().any(|c| c.is_control() && c != '\n'),
            "a raw control character on {stream}: {s:?}"
        );
        assert!(
            !s.lines().any(|l| l.starts_with("forged")),
            "a forged line on {stream}:\n{s}"
        );
    }
    assert!(stdout.contains("0_x\\u{1b}[8m"), "{stdout}");
    assert!(
        stdout.contains("1_y\\nforged: all tensors match"),
        "{stdout}"
    );
    assert!(stdout.contains("DIFFERS"), "{stdout}");
    // JSON keeps the real names.
    let json = golden(&[
        "diff",
        "--json",
        a.path().to_str().unwrap(),
        b.path().to_str().unwrap(),
    ]);
    let doc: Json = serde_json::from_slice(&json.stdout).unwrap();
    assert!(
        doc.to_string().contains("forged: all tensors match"),
        "{doc}"
    );
    // `show` of a file whose name carries them, and of an unknown tensor name.
    let file = a.path().join(format!("{forged}.npy"));
    let shown = golden(&["show", file.to_str().unwrap()]);
    let (stdout, stderr) = text(&shown);
    for s in [&stdout, &stderr] {
        assert!(!s.chars().any(|c| c.is_control() && c != '\n'), "{s:?}");
        assert!(!s.lines().any(|l| l.starts_with("forged")), "{s}");
    }
}

/// A safetensors file of two f32 tensors of two elements, named `names`.
fn safetensors_named(path: &Path, names: [&str; 2]) {
    let entries: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(k, n)| {
            format!(
                "{}:{{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[{},{}]}}",
                serde_json::to_string(n).unwrap(),
                8 * k,
                8 * k + 8
            )
        })
        .collect();
    let mut header = format!("{{{}}}", entries.join(","));
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend((0..4).flat_map(|i| (i as f32).to_le_bytes()));
    std::fs::write(path, bytes).unwrap();
}

/// A newline in a tensor's name, a file's or a folder's, or an archive entry's, forged a line in
/// `golden show`'s listing of a folder or archive and in `golden diff`'s "nothing was compared"
/// (#31 item 5): every name that reaches the terminal is escaped, wherever it is printed.
#[test]
fn newlines_in_names_never_reach_the_terminal_in_listings_and_notes() {
    let forged = "forged: all tensors match";
    let a = Dir::new(&format!("nl-a\n{forged}"));
    let b = Dir::new("nl-b");
    let t = HostTensor::from_f64(vec![2], &[0.0, 1.0]);
    golden_files::npy::write(&a.path().join(format!("0_y\n{forged}.npy")), &t).unwrap();
    safetensors_named(
        &a.path().join("1_z.safetensors"),
        [&format!("k\n{forged}"), "v\r\u{1b}[8m"],
    );
    golden_files::npy::write(&b.path().join("other.npy"), &t).unwrap();
    // An archive whose entries' names carry newlines: one a tensor file, one left out.
    let tarball = b.path().join("dump.tar");
    {
        let mut tar = tar::Builder::new(std::fs::File::create(&tarball).unwrap());
        let npy = std::fs::read(b.path().join("other.npy")).unwrap();
        for name in [
            format!("d/2_w\n{forged}.npy"),
            format!("d/notes\n{forged}.txt"),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_size(npy.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            tar.append_data(&mut h, name, &npy[..]).unwrap();
        }
        tar.finish().unwrap();
    }
    let clean = |what: &str, out: &Output| {
        let (stdout, stderr) = text(out);
        for (stream, s) in [("stdout", &stdout), ("stderr", &stderr)] {
            assert!(
                !s.chars().any(|c| c.is_control() && c != '\n'),
                "{what}: a raw control character on {stream}: {s:?}"
            );
            assert!(
                !s.lines().any(|l| l.starts_with(forged)),
                "{what}: a forged line on {stream}:\n{s}"
            );
        }
        stdout
    };
    let listing = clean(
        "show of a folder",
        &golden(&["show", a.path().to_str().unwrap()]),
    );
    assert!(listing.contains(&format!("0_y\\n{forged}")), "{listing}");
    assert!(listing.contains(&format!("1_z/k\\n{forged}")), "{listing}");
    assert!(listing.contains(&format!("nl-a\\n{forged}")), "{listing}");
    let listing = clean(
        "show of an archive",
        &golden(&["show", tarball.to_str().unwrap()]),
    );
    assert!(listing.contains(&format!("2_w\\n{forged}")), "{listing}");
    assert!(
        listing.contains(&format!("notes\\n{forged}.txt")),
        "{listing}"
    );
    let out = golden(&[
        "diff",
        a.path().to_str().unwrap(),
        b.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let note = clean("diff", &out);
    assert!(note.contains("nothing was compared"), "{note}");
    assert!(note.contains(&format!("0_y\\n{forged}")), "{note}");
    let out = golden(&[
        "diff",
        a.path().to_str().unwrap(),
        tarball.to_str().unwrap(),
    ]);
    let note = clean("diff against an archive", &out);
    assert!(note.contains(&format!("2_w\\n{forged}")), "{note}");
}

/// `golden --version` says the version of the golden it is and the folder it was built from: the
/// CI recipe installs golden's command line when the one it has cached is not the one its crate
/// depends on (an upgrade, another git revision), and only `golden --version` can tell (#31 item
/// 6). The command line's version is the runtime's.
#[test]
fn version_says_which_golden_and_where_it_was_built_from() {
    let out = golden(&["--version"]);
    assert!(out.status.success());
    let manifest = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../runtime/Cargo.toml"
    ))
    .unwrap();
    let runtime = manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .map(|v| v.trim_matches('"'))
        .unwrap();
    assert_eq!(
        runtime,
        env!("CARGO_PKG_VERSION"),
        "golden-cli's version is golden's"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        format!("golden {runtime} ({})", env!("CARGO_MANIFEST_DIR"))
    );
}
