//! Declared invariants of the port's outputs (`invariants(out = [finite, sums_to_one(dim = -1),
//! non_negative, range(lo, hi)])`): checked on every case, live and from the store; a port that
//! breaks one fails with the leaf, the element or slice and its value, and whether the reference
//! holds it. Runs live and from the stores in `tests/golden/`.

mod common;

use common::{must_fail, must_pass};
use golden::{Dist, Invariant, Layer};

fn probabilities(name: &str) -> Layer {
    Layer::function(name, "zoo_ref.softmax")
        .dim("b", 1, 3)
        .dim("t", 2, 6)
        .dim("n", 2, 9)
        .arg("x", ["b", "t", "n"], Dist::default())
        .invariant("out", Invariant::Finite)
        .invariant("out", Invariant::NonNegative)
        .invariant("out", Invariant::sums_to_one(-1))
        .cases(16)
}

#[test]
fn a_softmax_over_the_wrong_axis_breaks_sums_to_one() {
    let failure = must_fail(&probabilities("i_softmax_wrong_axis"), |i| {
        candle_nn::ops::softmax(i.tensor(0), 1)
    });
    let msg = failure.to_string();
    println!("{msg}");
    assert!(
        msg.starts_with(
            "golden: `i_softmax_wrong_axis` breaks the invariant `sums_to_one(dim = -1)` declared \
             for its output `out` (reference `zoo_ref.softmax`) in f32"
        ),
        "{msg}"
    );
    assert!(
        msg.contains("  declared invariants of the outputs, broken:\n    - `out` sums_to_one(dim = -1): the slice [0, 0, :] sums to "),
        "{msg}"
    );
    assert!(
        msg.contains("the reference holds it on this case (there it sums to 1)"),
        "{msg}"
    );
    // Finite and non-negative it is: only the broken one is listed.
    assert!(
        !msg.contains("`out` finite") && !msg.contains("`out` non_negative"),
        "{msg}"
    );
    let report = must_pass(&probabilities("i_softmax_right"), |i| {
        candle_nn::ops::softmax(i.tensor(0), 2)
    });
    // The snapshot's description lists them.
    assert!(
        report
            .description
            .contains("invariants: out = [finite, non_negative, sums_to_one(dim = -1)]\n"),
        "{}",
        report.description
    );
}

#[test]
fn an_invariant_the_reference_breaks_too_is_said_so() {
    // GELU is not bounded: at large inputs the port and the reference leave [-1, 1] alike.
    let layer = Layer::function("i_gelu_range", "zoo_ref.gelu")
        .dim("n", 1, 16)
        .arg("x", ["n"], Dist::default())
        .invariant("out", Invariant::Range { lo: -1.0, hi: 1.0 })
        .cases(16);
    let msg = must_fail(&layer, |i| i.tensor(0).gelu_erf()).to_string();
    println!("{msg}");
    assert!(msg.contains("`out` range(-1.0, 1.0): element ["), "{msg}");
    assert!(
        msg.contains("the reference breaks it too on this case (there it is "),
        "{msg}"
    );
    // The values match: the comparison has nothing to say, the invariant fails the check.
    assert!(!msg.contains("output leaves differ"), "{msg}");
}

#[test]
fn a_nan_is_named_by_its_element() {
    // An exp without the max subtracted overflows at large inputs: NaN where the reference is
    // finite, named by the invariant with its element.
    let msg = must_fail(&probabilities("i_softmax_unsafe"), |i| {
        let e = i.tensor(0).exp()?;
        e.broadcast_div(&e.sum_keepdim(2)?)
    })
    .to_string();
    println!("{msg}");
    assert!(msg.contains("`out` finite: element ["), "{msg}");
    assert!(msg.contains("] is NaN"), "{msg}");
    assert!(msg.contains("the reference holds it on this case"), "{msg}");
}

#[test]
fn an_invariant_of_a_leaf_the_port_does_not_return_is_a_failure() {
    let layer = Layer::function("i_no_such_leaf", "zoo_ref.gelu")
        .dim("n", 1, 4)
        .arg("x", ["n"], Dist::default())
        .invariant("out.probs", Invariant::Finite)
        .cases(4);
    let msg = must_fail(&layer, |i| i.tensor(0).gelu_erf()).to_string();
    assert!(
        msg.contains("the port returns no `out.probs` (its outputs: out)"),
        "{msg}"
    );
}
