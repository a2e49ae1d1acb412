//! Names golden did not choose — a golden store's leaf and state_dict names, a reference's output
//! keys and parameter names — never lead a file outside the failure's artifacts folder: a store
//! that holds such a name is refused as hostile, and a live answer's names are escaped where they
//! become file names.

mod common;

use common::Scratch;
use golden::internal::answers::store;
use golden::internal::describe::env::Mode;
use golden::internal::python::wire;
use golden::{Dist, IntoOutputs, Layer, PortInputs};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn gelu(scratch: &Scratch) -> Layer {
    Layer::function("gelu", "zoo_ref.gelu")
        .dim("n", 1, 8)
        .arg("x", ["n"], Dist::default())
        .cases(4)
        .declared_at(scratch.declared)
}

fn right(i: &PortInputs) -> Result<golden::Outputs, String> {
    i.tensor(0).gelu_erf().into_outputs()
}

fn wrong(i: &PortInputs) -> Result<golden::Outputs, String> {
    i.tensor(0).gelu().into_outputs()
}

/// Rewrite a store's bytes with `rename` applied to every leaf name of every entry (outputs and
/// their rounding estimates), sealed with a valid checksum: what a hostile contributor could commit.
fn rename_leaves(path: &Path, rename: impl Fn(&str) -> String) {
    let bytes = std::fs::read(path).unwrap();
    let mut body = &bytes[20..];
    let mut frame = wire::read_frame(&mut body).unwrap();
    for entry in frame.header["entries"].as_array_mut().unwrap() {
        for list in ["expected", "rounding"] {
            for item in entry[list].as_array_mut().into_iter().flatten() {
                let name = rename(item[0].as_str().unwrap());
                item[0] = name.into();
            }
        }
    }
    std::fs::write(path, store::seal(&wire::encode(&frame))).unwrap();
}

/// Every file under `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_store_whose_names_are_paths_is_refused_and_writes_nothing() {
    let outside = std::env::temp_dir().join(format!("golden-outside-{}", std::process::id()));
    std::fs::create_dir_all(&outside).unwrap();
    // Where `../../../climbed` leads from a failure's `reference/` folder.
    let climbed = golden::internal::describe::env::target_dir()
        .unwrap()
        .join("golden/failures/climbed.npy");
    let _ = std::fs::remove_file(&climbed);
    let absolute = outside.join("absolute").display().to_string();
    let hostile = [
        "../../../climbed".to_string(),
        absolute.clone(),
        "out\\..\\..\\back".to_string(),
        "out\0nul".to_string(),
    ];
    for name in hostile {
        let scratch = Scratch::new("hostile_store");
        let layer = gelu(&scratch);
        golden::check(&layer.clone().mode(Mode::Record), &right).unwrap_or_else(|f| panic!("{f}"));
        rename_leaves(&scratch.store(&layer), |_| name.clone());
        let f = golden::check(&layer.clone().mode(Mode::Replay), &wrong)
            .expect_err("a hostile store is never a pass");
        let msg = f.to_string();
        assert!(msg.contains("is corrupt"), "{name:?}: {msg}");
        assert!(
            msg.contains(&format!("{name:?}")) && msg.contains("entry 1 of 4"),
            "the message names the entry and the name, {name:?}: {msg}"
        );
        assert!(golden::Failure::case_failure(&f).is_none(), "{msg}");
    }
    assert_eq!(files(&outside), Vec::<PathBuf>::new(), "written outside");
    assert!(!climbed.exists(), "{}", climbed.display());
    std::fs::remove_dir_all(outside).unwrap();
}

#[test]
fn a_live_answer_s_names_are_escaped_inside_the_artifacts_folder() {
    let outside = std::env::temp_dir().join(format!("golden-outside-live-{}", std::process::id()));
    std::fs::create_dir_all(&outside).unwrap();
    // PyTorch refuses only dots in a parameter name: an absolute path is a valid one.
    let target = outside.join("state").display().to_string();
    assert!(!target.contains('.'), "{target}");
    let scratch = Scratch::new("hostile_live");
    let layer = Layer::module("hostile", "fault_ref.HostileNames")
        .init("target", target.as_str())
        .dim("n", 1, 4)
        .arg("x", ["n"], Dist::default())
        .cases(2)
        .declared_at(scratch.declared)
        .mode(Mode::Live);
    // Outputs under the reference's keys; the parameter is never read: a failing case.
    let port = |i: &PortInputs| {
        let x = i.tensor(0);
        (x * 2.0)
            .map(|double| BTreeMap::from([("../escaped", double), ("ok", x.clone())]))
            .into_outputs()
    };
    let f = golden::check(&layer, &port).expect_err("an unread parameter fails");
    let msg = f.to_string();
    let dir = PathBuf::from(msg.lines().last().unwrap().trim());
    assert!(dir.join("case.json").is_file(), "{msg}");
    let escaped = target.replace('/', "%2F");
    for file in [
        format!("state_dict/{escaped}.npy"),
        "reference/out...%2Fescaped.npy".into(),
        "port/out...%2Fescaped.npy".into(),
        "reference/out.ok.npy".into(),
    ] {
        assert!(dir.join(&file).is_file(), "{file} in {:?}", files(&dir));
    }
    assert_eq!(files(&outside), Vec::<PathBuf>::new(), "written outside");
    // case.json maps each name to its file, for repro.py and other readers.
    let case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    assert_eq!(
        case["file_names"]["out.../escaped"], "out...%2Fescaped",
        "{case}"
    );
    std::fs::remove_dir_all(outside).unwrap();
}

/// A check's own name becomes file names too — its results file, its golden store, its snapshot,
/// its artifacts — and a name with `..` wrote the results JSON (and the store) outside golden's
/// folders (#21 item 13). Names become file names one way, everywhere.
#[test]
fn a_check_named_with_dots_and_slashes_writes_only_inside_its_folders() {
    let scratch = Scratch::new("hostile_check");
    let target = golden::internal::describe::env::target_dir().unwrap();
    // Where `../../escaped_check` leads from `target/golden/results/<crate>/` and from the
    // snapshots folder.
    let escaped_results = target.join("golden/escaped_check.json");
    let escaped_store = scratch.dir.join("../escaped_check.golden");
    let _ = std::fs::remove_file(&escaped_results);
    let _ = std::fs::remove_file(&escaped_store);
    let declared = golden::Declared {
        module_path: "hostile_check",
        ..scratch.declared
    };
    let layer = Layer::function("../../escaped_check", "zoo_ref.gelu")
        .dim("n", 1, 8)
        .arg("x", ["n"], Dist::default())
        .cases(2)
        .declared_at(declared);
    golden::check(&layer.clone().mode(Mode::Record), &right).unwrap_or_else(|f| panic!("{f}"));
    let failed = golden::check(&layer.clone().mode(Mode::Replay), &wrong).expect_err("wrong");
    let leaked: Vec<&Path> = [escaped_results.as_path(), escaped_store.as_path()]
        .into_iter()
        .filter(|p| p.exists())
        .collect();
    for p in &leaked {
        let _ = std::fs::remove_file(p);
    }
    assert!(
        leaked.is_empty(),
        "written outside golden's folders: {leaked:?}"
    );
    let name = "..%2F..%2Fescaped_check";
    assert!(
        target
            .join(format!("golden/results/hostile_check/{name}.json"))
            .is_file(),
        "the results file is named by the escaped check name"
    );
    assert!(
        scratch
            .dir
            .join(format!("snapshots/{name}.golden"))
            .is_file(),
        "{:?}",
        files(&scratch.dir)
    );
    let msg = failed.to_string();
    assert!(
        msg.lines()
            .last()
            .unwrap()
            .trim()
            .ends_with(&format!("failures/hostile_check/{name}")),
        "{msg}"
    );
}
