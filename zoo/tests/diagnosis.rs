//! Diagnosis: a failure names the likely bug when the numbers show it. Each hypothesis of
//! `runtime/src/judge/diagnose.rs` is demonstrated on a deliberately wrong port, with the message
//! asserted: a hypothesis that fits on two failing cases is a cause. Stores in `tests/golden/`, so
//! these hold in replay too. The mutation diagnosis is off here (`GOLDEN_MUTATIONS=off`, the same
//! in every test of this binary): a mutant that matches wins over the numbers' hypotheses
//! (`tests/mutations.rs` shows that), and these are about the hypotheses.

mod common;

use candle_core::{Module, Tensor, D};
use common::must_fail;
use golden::{DimExpr, Dist, Layer};

/// The numbers' hypotheses alone (see the module's documentation).
fn numbers_only() {
    std::env::set_var("GOLDEN_MUTATIONS", "off");
}

fn causes(failure: &golden::Failure) -> String {
    let msg = failure.to_string();
    let start = msg
        .find("likely causes:")
        .unwrap_or_else(|| panic!("no diagnosis in:\n{msg}"));
    msg[start..].to_string()
}

fn linear(name: &str) -> Layer {
    Layer::function(name, "zoo_ref.linear")
        .dim("b", 1, 4)
        .dim("t", 1, 8)
        .dim("d_out", 1, 16)
        .arg(
            "x",
            ["b".into(), "t".into(), DimExpr::Lit(64)],
            Dist::default(),
        )
        .arg(
            "weight",
            ["d_out".into(), DimExpr::Lit(64)],
            Dist::normal(0.0, 0.1),
        )
        .arg("bias", ["d_out"], Dist::default())
}

fn dense(i: &golden::PortInputs) -> candle_core::Result<Tensor> {
    candle_nn::Linear::new(i.tensor(1).clone(), Some(i.tensor(2).clone())).forward(i.tensor(0))
}

#[test]
fn a_transpose_among_equal_sizes_is_named() {
    numbers_only();
    // Square outputs: the shapes agree, the values are the reference transposed.
    let layer = Layer::function("softmax_transposed", "zoo_ref.softmax")
        .dim("n", 2, 8)
        .arg("x", ["n", "n"], Dist::default());
    let f = must_fail(&layer, |i| {
        candle_nn::ops::softmax(i.tensor(0), D::Minus1)?
            .t()?
            .contiguous()
    });
    let c = causes(&f);
    assert!(
        c.contains("port ≈ reference.transpose(0, 1) (max diff"),
        "{c}"
    );
    assert!(c.contains("a missing transpose"), "{c}");
}

#[test]
fn an_extra_one_over_sqrt_d_scale_is_named() {
    numbers_only();
    let f = must_fail(&linear("linear_scaled"), |i| dense(i)? / 8.0);
    let c = causes(&f);
    assert!(c.contains("port ≈ 0.125 × reference"), "{c}");
    assert!(
        c.contains("the factor is 1/√x.shape[2] (x.shape[2] = 64)"),
        "{c}"
    );
}

#[test]
fn a_factor_of_two_is_named() {
    numbers_only();
    let layer = Layer::function("gelu_doubled", "zoo_ref.gelu")
        .dim("n", 1, 64)
        .arg("x", ["n"], Dist::default());
    let f = must_fail(&layer, |i| i.tensor(0).gelu_erf()? * 2.0);
    let c = causes(&f);
    assert!(
        c.contains("port ≈ 2 × reference") && c.contains("a missing or extra 0.5 or 2"),
        "{c}"
    );
}

#[test]
fn a_bias_added_twice_is_named() {
    numbers_only();
    let f = must_fail(&linear("linear_bias_twice"), |i| {
        dense(i)?.broadcast_add(i.tensor(2))
    });
    let c = causes(&f);
    assert!(c.contains("a bias that is the same along axes"), "{c}");
    assert!(c.contains("a missing or extra bias"), "{c}");
}

#[test]
fn softmax_over_the_wrong_dim_is_named() {
    numbers_only();
    let layer = Layer::function("softmax_wrong_dim", "zoo_ref.softmax")
        .dim("b", 1, 4)
        .dim("t", 1, 16)
        .dim("n", 1, 32)
        .arg("x", ["b", "t", "n"], Dist::default());
    let f = must_fail(&layer, |i| candle_nn::ops::softmax(i.tensor(0), 1));
    let c = causes(&f);
    assert!(
        c.contains("the port's slices sum to 1 over dim 1, the reference's over dim 2"),
        "{c}"
    );
    assert!(c.contains("softmax over the wrong dim: use dim 2"), "{c}");
}

#[test]
fn an_output_never_written_is_all_zeros() {
    numbers_only();
    let layer = Layer::function("silu_zeros", "zoo_ref.silu")
        .dim("n", 1, 64)
        .arg("x", ["n"], Dist::default());
    let f = must_fail(&layer, |i| i.tensor(0).zeros_like());
    assert!(causes(&f).contains("the port is all zeros"), "{f}");
}

#[test]
fn exp_without_max_subtraction_overflows_to_nan() {
    numbers_only();
    let layer = Layer::function("softmax_naive", "zoo_ref.softmax")
        .dim("b", 1, 4)
        .dim("n", 1, 64)
        .arg("x", ["b", "n"], Dist::default());
    let f = must_fail(&layer, |i| {
        let e = i.tensor(0).exp()?;
        e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
    });
    let c = causes(&f);
    assert!(
        c.contains("NaN appears in the port at") && c.contains("where the reference is finite"),
        "{c}"
    );
    assert!(c.contains("exp without subtracting the max"), "{c}");
}
