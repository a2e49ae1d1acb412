//! The snapshot describes the declared cases: the same whatever proptest's regression file holds,
//! and the same from run to run.

use golden::{Dist, IntoOutputs, Layer, PortInputs};
mod common;

fn layer(scratch: &common::Scratch) -> Layer {
    Layer::function("gelu", "zoo_ref.gelu")
        .dim("n", 1, 64)
        .arg("x", ["n"], Dist::default())
        .declared_at(scratch.declared)
}

#[test]
fn replayed_regressions_must_pass_but_do_not_change_the_snapshot() {
    let scratch = common::Scratch::new("replay");
    let right = |i: &PortInputs| i.tensor(0).gelu_erf().into_outputs();
    let before = golden::check(&layer(&scratch), &right).unwrap_or_else(|f| panic!("{f}"));
    assert!(before.runs[0].replayed.is_empty());

    // A wrong port fails and proptest records the failing seed beside the "source".
    let wrong = |i: &PortInputs| i.tensor(0).gelu().into_outputs();
    assert!(golden::check(&layer(&scratch), &wrong).is_err());
    let regressions = scratch.dir.join("proptest-regressions/check.txt");
    let saved = std::fs::read_to_string(&regressions).expect("proptest wrote its regression file");
    assert!(saved.lines().any(|l| l.starts_with("cc ")), "{saved}");

    // The fixed port replays that case first, then the declared ones: same snapshot as before.
    let after = golden::check(&layer(&scratch), &right).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(after.runs[0].replayed.len(), 1);
    assert_eq!(after.runs[0].cases.len(), before.runs[0].cases.len());
    assert_eq!(after.snapshot(), before.snapshot());
}

#[test]
fn the_same_seed_gives_the_same_cases_and_snapshot() {
    let layer = Layer::function("silu", "zoo_ref.silu")
        .dim("b", 1, 4)
        .dim("n", 1, 64)
        .arg("x", ["b", "n"], Dist::default())
        .declared_at(golden::Declared {
            module_path: "scratch::silu",
            ..golden::declared!()
        })
        // Live whatever GOLDEN_MODE says: recording would write a store into the repository.
        .mode(golden::internal::describe::env::Mode::Live);
    let port = |i: &PortInputs| candle_nn::ops::silu(i.tensor(0)).into_outputs();
    let a = golden::check(&layer, &port).unwrap_or_else(|f| panic!("{f}"));
    let b = golden::check(&layer, &port).unwrap_or_else(|f| panic!("{f}"));
    let params = |r: &golden::Report| {
        r.runs[0]
            .cases
            .iter()
            .map(|c| c.params.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(params(&a), params(&b));
    assert_eq!(a.snapshot(), b.snapshot());
    // Cases vary: both bounds of a dim and several value styles come up in 32 cases.
    let ps = params(&a);
    assert!(ps.iter().any(|p| p.dims[0].1 == 1) && ps.iter().any(|p| p.dims[0].1 == 4));
    let styles: std::collections::HashSet<_> = ps.iter().map(|p| p.style).collect();
    assert!(styles.len() >= 4, "{styles:?}");
}
