//! golden's `.npy` reader against NumPy's on header variants: spacing, key order, trailing
//! commas, quotes, tuple forms, Python-literal quirks (comments, continuations, escapes, implicit
//! concatenation, hex and Python 2 integers), versions 1 to 3, every spelling of a dtype, byte
//! orders, Fortran order, and dtypes golden does not carry.
//!
//! `fixtures/npy_headers/verdicts.json` holds the variants and what the real NumPy made of each
//! (`numpy.lib.format.read_array(..., allow_pickle=False)`), written by `make.py` beside it. golden
//! must refuse every header NumPy refuses, and read every header NumPy reads to the same dtype,
//! shape and values, except those the generator marks `may_refuse` (a dtype golden does not
//! carry, more than 16 axes, a `\N{...}` escape), which it may refuse with a message that says
//! golden does not read them.

use golden_files::npy;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/npy_headers")
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// The file of a variant, as make.py wrote it to NumPy.
fn file_of(v: &Json) -> Vec<u8> {
    if let Some(file) = v["file"].as_str() {
        return hex(file);
    }
    let version: Vec<u8> = serde_json::from_value(v["version"].clone()).unwrap();
    let header = v["header"].as_str().unwrap();
    let raw: Vec<u8> = if version[0] < 3 {
        header
            .chars()
            .map(|c| u8::try_from(u32::from(c)).expect("a latin-1 header"))
            .collect()
    } else {
        header.as_bytes().to_vec()
    };
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&version);
    if version[0] == 1 {
        out.extend_from_slice(&(raw.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(&raw);
    out.extend_from_slice(&hex(v["data"].as_str().unwrap()));
    out
}

/// The dtype golden reads NumPy's dtype as (`dtype.str`), narrow integers widened.
fn golden_dtype(numpy: &str) -> &'static str {
    match numpy.trim_start_matches(['<', '>', '|', '=']) {
        "b1" => "bool",
        "f2" => "f16",
        "f4" => "f32",
        "f8" => "f64",
        "i1" | "i2" => "i16",
        "i4" | "u2" => "i32",
        "i8" => "i64",
        "u1" => "u8",
        "u4" => "u32",
        "u8" => "f64",
        _ => "a dtype golden does not carry",
    }
}

#[test]
fn golden_accepts_and_refuses_the_headers_numpy_does() {
    let doc: Json =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("verdicts.json")).unwrap())
            .unwrap();
    let variants = doc["variants"].as_array().unwrap();
    assert!(variants.len() > 800, "{} variants", variants.len());
    let (mut both_read, mut both_refuse, mut golden_refuses) = (0, 0, 0);
    let mut disagreements = Vec::new();
    for v in variants {
        let what = v.get("header").map_or_else(
            || format!("file {}", v["file"]),
            |h| format!("{h} {}", v["version"]),
        );
        let numpy = &v["numpy"];
        let golden = npy::decode(&file_of(v));
        match (numpy["ok"].as_bool().unwrap(), golden) {
            (false, Ok(t)) => disagreements.push(format!(
                "golden reads what NumPy refuses ({}): {what} -> {t:?}",
                numpy["error"]
            )),
            (false, Err(_)) => both_refuse += 1,
            (true, Ok(t)) => {
                let dtype = golden_dtype(numpy["dtype"].as_str().unwrap());
                let shape: Vec<usize> = serde_json::from_value(numpy["shape"].clone()).unwrap();
                let values: Vec<f64> = serde_json::from_value(numpy["values"].clone()).unwrap();
                if (t.dtype.name(), &t.shape, &t.to_f64()) != (dtype, &shape, &values) {
                    disagreements.push(format!(
                        "golden reads {what} as {t:?} {:?}, NumPy as {dtype} {shape:?} {values:?}",
                        t.to_f64()
                    ));
                } else {
                    both_read += 1;
                }
            }
            (true, Err(e)) => {
                let e = e.to_string();
                // A dtype golden does not carry is refused with a message that says so; the
                // other variants NumPy reads only by a quirk may be refused with any message.
                let why = v["may_refuse"].as_str();
                let says_why = e.contains("golden reads") || e.contains("golden does not read");
                if why.is_some_and(|w| !w.starts_with("a dtype") || says_why) {
                    golden_refuses += 1;
                } else {
                    disagreements.push(format!(
                        "golden refuses what NumPy reads ({} {:?}): {what}: {e}",
                        numpy["dtype"], numpy["shape"]
                    ));
                }
            }
        }
    }
    eprintln!(
        "{} variants: {both_read} read alike, {both_refuse} refused by both, {golden_refuses} \
         read by NumPy and refused by golden (marked as it may)",
        variants.len()
    );
    assert!(
        disagreements.is_empty(),
        "{} disagreements with NumPy {}:\n{}",
        disagreements.len(),
        doc["numpy"],
        disagreements[..].join("\n")
    );
    // The comparison has teeth: both sides read and refuse plenty.
    assert!(
        both_read > 400 && both_refuse > 150,
        "{both_read} {both_refuse}"
    );
}

/// The committed verdicts are what the NumPy of golden's venv says, when that venv is here.
#[test]
fn the_verdicts_are_numpys() {
    let venv = std::env::var_os("GOLDEN_VENV")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/golden/venv")));
    let Some(python) = venv.map(|v| v.join("bin/python")).filter(|p| p.exists()) else {
        eprintln!("no golden venv here: the committed verdicts are not re-checked against NumPy");
        return;
    };
    let out = std::process::Command::new(&python)
        .arg(fixtures().join("make.py"))
        .arg("--check")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
