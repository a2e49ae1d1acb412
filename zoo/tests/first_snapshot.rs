//! A check's first run outside CI writes its snapshot and passes, saying so; in CI, or when
//! INSTA_UPDATE says how insta should behave, insta asserts as usual (a missing snapshot fails).
//! One test in this binary: it sets environment variables.

mod common;

use common::Scratch;
use golden::{Dist, IntoOutputs, Layer, PortInputs};

#[test]
fn the_first_snapshot_is_written_outside_ci_only() {
    let scratch = Scratch::new("first_snapshot");
    let layer = Layer::function("gelu", "zoo_ref.gelu")
        .dim("n", 1, 8)
        .arg("x", ["n"], Dist::default())
        .cases(4)
        .declared_at(scratch.declared);
    let report = golden::check(&layer, &|i: &PortInputs| {
        i.tensor(0).gelu_erf().into_outputs()
    })
    .unwrap_or_else(|f| panic!("{f}"));
    let text = report.snapshot().unwrap();
    let path = scratch
        .dir
        .join("snapshots")
        .join("first_snapshot__gelu.snap");
    let saved = (std::env::var_os("CI"), std::env::var_os("INSTA_UPDATE"));
    std::env::remove_var("INSTA_UPDATE");

    std::env::set_var("CI", "true");
    assert_eq!(report.write_first_snapshot(&text), None);
    assert!(!path.exists(), "in CI insta decides (and fails)");

    std::env::set_var("INSTA_UPDATE", "no");
    std::env::set_var("CI", "false");
    assert_eq!(
        report.write_first_snapshot(&text),
        None,
        "INSTA_UPDATE is the user's word"
    );
    std::env::remove_var("INSTA_UPDATE");

    let line = report.write_first_snapshot(&text).expect("written");
    assert!(
        line.contains("`gelu` passed its first run")
            && line.contains(&path.display().to_string())
            && line.contains("commit it")
            && line.contains("cargo insta review"),
        "{line}"
    );
    let written = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        written,
        format!(
            "---\nsource: {}\n---\n{}\n",
            scratch.declared.source_file,
            text.trim_end()
        )
    );
    assert_eq!(
        report.write_first_snapshot(&text),
        None,
        "it exists now: insta compares"
    );

    match saved.0 {
        Some(v) => std::env::set_var("CI", v),
        None => std::env::remove_var("CI"),
    }
    if let Some(v) = saved.1 {
        std::env::set_var("INSTA_UPDATE", v);
    }
}
